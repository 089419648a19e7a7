# Sourced by the video benches: bench_clip WORK SECONDS CONTENT prints the
# path of a testsrc2 clip at 1080p30 with a tone, as a camera writes it
# (x264, a keyframe every 2 s, AAC), made once under WORK with "$ffmpeg";
# CONTENT=noisy adds temporal grain, x264's worst case.
bench_clip() {
  local work=$1 seconds=$2 content=$3 filter=null
  [ "$content" = noisy ] && filter="noise=alls=12:allf=t+u"
  local clip=$work/clip-$content-${seconds}s.mp4
  if [ ! -f "$clip" ]; then
    "$ffmpeg" -hide_banner -loglevel error -y \
      -f lavfi -i "testsrc2=size=1920x1080:rate=30:duration=$seconds" \
      -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$seconds" \
      -vf "$filter" -c:v libx264 -preset ultrafast -crf 18 -g 60 -pix_fmt yuv420p \
      -c:a aac -b:a 128k -ac 2 "$clip.partial.mp4"
    mv "$clip.partial.mp4" "$clip"
  fi
  echo "$clip"
}
