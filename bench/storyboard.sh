#!/usr/bin/env bash
# A storyboard's cost against the encode it follows, on one 1080p clip in
# one run: (a) hls-package's encode of the default ladder (1080, 720 and
# 360 lines, 6 s segments, veryfast; examples/hls_package.rs, release),
# the baseline; (b) the storyboard step chained to that package
# (examples/storyboard.rs: the real step, its segments read from an
# in-memory store), with its default interval and with one on the
# segments' starts (6 s: I-frame ranges alone); and (c) what a storyboard
# chained to the upload would cost, the same cues cut from the 1080p
# source by ffmpeg: one accurate seek per cue (a decode from the keyframe
# before it), and one pass decoding every frame.
#
# Prints CPU seconds (user + system, ffmpeg's included) and each as a
# share of the encode's (target for the storyboard <= 5 %), and the
# storyboard's bytes per minute of video.
#
#   bench/storyboard.sh            SECONDS_OF_VIDEO=120 CONTENT=clean
#   CONTENT=noisy bench/storyboard.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_OF_VIDEO:-120}
content=${CONTENT:-clean}
work=${BENCH_DIR:-target/bench-storyboard}
mkdir -p "$work"
[ -x /usr/bin/time ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
ffmpeg=$(scripts/emulators.sh ffmpeg 2>/dev/null | tail -1)
export MEDIAONCE_FFMPEG=$ffmpeg

cargo build --release --example hls_package --example storyboard >&2

# The clip (bench/clip.sh): testsrc2 at 1080p30 with a tone.
. bench/clip.sh
clip=$(bench_clip "$work" "$seconds" "$content")
echo "$content 1080p30 clip of ${seconds} s; $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# cpu NAME COMMAND...: runs it; sets NAME (CPU seconds, children included).
cpu() {
  local name=$1
  shift
  /usr/bin/time -f '%U %S' -o "$work/time.txt" "$@" > "$work/$name.out"
  read -r user sys < "$work/time.txt"
  printf -v "$name" '%s' "$(python3 -c "print($user + $sys)")"
}

cpu encode target/release/examples/hls_package "$clip" "$work/encode" '{"ladder":[1080,720,360]}' whole
package=$work/encode/package
cpu board target/release/examples/storyboard "$package" "$work/board" '{}'
board_out=$(cat "$work/board.out")
cpu aligned target/release/examples/storyboard "$package" "$work/board-6s" '{"interval":6}'
aligned_out=$(cat "$work/aligned.out")

# The upload-chained alternative, at the default board's cues.
cues=$(python3 -c "import json; print(json.loads('''$board_out''')['cues'])")
interval=$(python3 -c "import json; print(int(json.loads('''$board_out''')['interval']))")
cat > "$work/seeks.sh" <<SH
for ((i = 0; i < $cues; i++)); do
  "$ffmpeg" -hide_banner -loglevel error -nostdin -ss \$((i * $interval)) -i "$clip" \
    -frames:v 1 -vf scale=256:-2:flags=lanczos -f rawvideo -pix_fmt rgb24 - > /dev/null
done
SH
cpu seeks bash "$work/seeks.sh"
cpu pass "$ffmpeg" -hide_banner -loglevel error -nostdin -threads 1 -i "$clip" -map 0:v:0 \
  -vf "select='not(mod(n\,$((interval * 30))))',scale=256:-2:flags=lanczos" -fps_mode passthrough \
  -f rawvideo -pix_fmt rgb24 -

python3 - "$seconds" "$encode" "$board" "$aligned" "$seeks" "$pass" "$board_out" "$aligned_out" "$interval" <<'PY'
import json, sys
seconds = float(sys.argv[1])
encode, board, aligned, seeks, single = map(float, sys.argv[2:7])
board_out, aligned_out = json.loads(sys.argv[7]), json.loads(sys.argv[8])
interval = sys.argv[9]
print(f"{'run':<70}{'CPU s':>8}{'/ encode':>10}")
rows = [
    ("hls-package encode, ladder 1080/720/360 (baseline)", encode),
    (f"storyboard on the package, every {interval} s ({board_out['cues']} cues)", board),
    (f"storyboard on the package, every 6 s (I-frame ranges, {aligned_out['cues']} cues)", aligned),
    (f"on the upload: one 1080p seek per cue ({board_out['cues']})", seeks),
    ("on the upload: one pass decoding all 1080p frames", single),
]
for name, cpu in rows:
    print(f"{name:<70}{cpu:>8.2f}{cpu / encode:>10.1%}")
for name, out in [(f"every {interval} s", board_out), ("every 6 s", aligned_out)]:
    print(f"storyboard {name}: {out['sheets']} sheet(s), {out['bytes']} bytes, "
          f"{out['bytes'] / (seconds / 60) / 1000:.1f} kB per minute of video")
PY
