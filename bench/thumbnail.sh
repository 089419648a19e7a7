#!/usr/bin/env bash
# Thumbnails of 12-megapixel JPEGs (a grainy "photo" and a "smooth" one,
# each with its chroma subsampled 4:2:0, as cameras and phones write them,
# the photo also upright, 3000 px wide, and each at full resolution, 4:4:4,
# as ImageMagick writes quality 90 and up)
# to 320 px and 1280 px wide: mediaonce's thumbnail code
# (examples/thumbnail.rs, release build) against libvips' vipsthumbnail
# and ImageMagick's convert -thumbnail, on the same file in the same run,
# as JPEG and as WebP at quality 82, the tools taking turns run by run,
# and progressive JPEG against vips' interlaced (bytes and SSIM only).
# Wall time is the median of RUNS runs; peak memory is the largest maximum
# resident set size seen; bytes and SSIM (against a lossless Lanczos
# reference) say what the output costs to serve and how close it is.
# Ratios are mediaonce / other: below 1 is mediaonce faster or smaller.
#
#   bench/thumbnail.sh            RUNS=9 by default
#   BENCH_INPUTS="photo420" bench/thumbnail.sh   one input only
#
# Installs libvips-tools, imagemagick and GNU time from Debian when missing
# (ImageMagick is run as /usr/bin/convert: some machines put another convert
# earlier on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-9}
work=${BENCH_DIR:-target/bench-thumbnail}
mkdir -p "$work"

need=()
command -v vipsthumbnail >/dev/null || need+=(libvips-tools)
[ -x /usr/bin/convert ] || need+=(imagemagick)
[ -x /usr/bin/time ] || need+=(time)
command -v cjpeg >/dev/null || need+=(libjpeg-turbo-progs)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --example thumbnail >&2
ours=target/release/examples/thumbnail

# Two 12-megapixel JPEGs, the same every run: "photo", with grain and
# detail like a camera's (~10 MB), and "smooth", the same scene without the
# grain (~2.3 MB).
smooth=$work/input-12mp.jpg
photo=$work/photo-12mp.jpg
if [ ! -f "$smooth" ]; then
  /usr/bin/convert -size 4000x3000 -seed 42 plasma:fractal -blur 0x1 -quality 90 "$smooth"
fi
if [ ! -f "$photo" ]; then
  /usr/bin/convert -size 4000x3000 -seed 42 plasma:fractal -blur 0x1 \
    -seed 7 -attenuate 0.7 +noise Gaussian -quality 92 "$photo"
fi
# The same pixels as cameras write them: chroma 4:2:0 (cjpeg -sample 2x2),
# the common case, reported first.
photo420=$work/photo-12mp-420.jpg
smooth420=$work/input-12mp-420.jpg
[ -f "$photo420" ] || /usr/bin/convert "$photo" ppm:- | cjpeg -quality 92 -sample 2x2 > "$photo420"
[ -f "$smooth420" ] || /usr/bin/convert "$smooth" ppm:- | cjpeg -quality 90 -sample 2x2 > "$smooth420"
# And the photo as a phone holds it upright: 3000×4000, 4:2:0.
portrait420=$work/photo-12mp-portrait-420.jpg
[ -f "$portrait420" ] || /usr/bin/convert "$photo" -rotate 90 ppm:- | cjpeg -quality 92 -sample 2x2 > "$portrait420"
echo "$runs runs each; $(nproc) cores, $(uname -m)"

# once FILE COMMAND...: runs the command once and appends "seconds kib"
# to FILE. The tools take turns, run by run, so that a slow minute on a
# shared machine slows each of them alike instead of one. Wall time is
# bash's microsecond clock around the run (GNU time prints it to 10 ms,
# a tenth of a 1280 px thumbnail), GNU time's start-up included for every
# tool alike; peak memory is GNU time's.
once() {
  local file=$1 start end
  shift
  start=$EPOCHREALTIME
  /usr/bin/time -f '%M' -o "$work/time.txt" "$@" >/dev/null 2>&1
  end=$EPOCHREALTIME
  printf '%.4f %s\n' "$(echo "$end - $start" | bc -l)" "$(cat "$work/time.txt")" >> "$file"
}
# summary FILE: prints "median_seconds peak_kib" of the runs in FILE.
summary() {
  printf '%s %s\n' "$(cut -d' ' -f1 "$1" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")" \
    "$(cut -d' ' -f2 "$1" | sort -n | tail -1)"
}

# Quality: each output is compared with a reference downscale of the same
# source (ImageMagick's Lanczos filter, kept lossless as PNG) by SSIM on
# luma (examples/ssim.rs), after decoding it with libvips (libjpeg-turbo and
# libwebp: what a browser would show).
cargo build --release --example ssim >&2
ssim() { # REFERENCE OUTPUT
  vips copy "$2" "$2.png" && target/release/examples/ssim "$1" "$2.png"
}

for name in ${BENCH_INPUTS:-photo420 smooth420 portrait420 photo smooth}; do
  in=${!name}
  echo
  echo "input $name: $in ($(/usr/bin/identify -format '%wx%h' "$in"), $(stat -c %s "$in") bytes)"
  printf '\n%-6s %-5s %-14s %10s %12s %9s %8s\n' width fmt tool "median s" "peak MiB" bytes SSIM
  for width in 320 1280; do
    reference=$work/reference-$name-$width.png
    /usr/bin/convert "$in" -filter Lanczos -resize "${width}x" "$reference"
    for fmt in jpeg webp; do
      ext=${fmt/jpeg/jpg}
      rm -f "$work"/runs-*.txt
      for _ in $(seq "$runs"); do
        once "$work/runs-ours.txt" "$ours" "$in" "$width" "$work/ours-$name-$width.$ext" "$fmt" 82
        once "$work/runs-vips.txt" vipsthumbnail "$in" -s "${width}x" -o "$PWD/$work/vips-$name-$width.$ext[Q=82,strip]"
        once "$work/runs-im.txt" /usr/bin/convert "$in" -thumbnail "${width}x" -quality 82 "$work/im-$name-$width.$ext"
      done
      read -r t_ours m_ours < <(summary "$work/runs-ours.txt")
      read -r t_vips m_vips < <(summary "$work/runs-vips.txt")
      read -r t_im m_im < <(summary "$work/runs-im.txt")
      for row in "mediaonce ours $t_ours $m_ours" "vipsthumbnail vips $t_vips $m_vips" "imagemagick im $t_im $m_im"; do
        set -- $row
        out=$work/$2-$name-$width.$ext
        printf '%-6s %-5s %-14s %10s %12.1f %9d %8s\n' "$width" "$fmt" "$1" "$3" "$(echo "$4 / 1024" | bc -l)" \
          "$(stat -c %s "$out")" "$(ssim "$reference" "$out")"
      done
      b_ours=$(stat -c %s "$work/ours-$name-$width.$ext"); b_vips=$(stat -c %s "$work/vips-$name-$width.$ext")
      printf '%-6s %-5s time  mediaonce/vips %.2f  mediaonce/imagemagick %.2f\n' "$width" "$fmt" \
        "$(echo "$t_ours / $t_vips" | bc -l)" "$(echo "$t_ours / $t_im" | bc -l)"
      printf '%-6s %-5s peak  mediaonce/vips %.2f  mediaonce/imagemagick %.2f\n' "$width" "$fmt" \
        "$(echo "$m_ours / $m_vips" | bc -l)" "$(echo "$m_ours / $m_im" | bc -l)"
      printf '%-6s %-5s bytes mediaonce/vips %.2f\n' "$width" "$fmt" "$(echo "$b_ours / $b_vips" | bc -l)"
      if [ "$fmt" = jpeg ]; then
        # Progressive JPEG (`progressive: true`; vips' interlace): bytes and
        # SSIM from one run each, the pixels being the baseline files'.
        "$ours" "$in" "$width" "$work/ours-$name-$width-p.jpg" jpeg 82 progressive
        vipsthumbnail "$in" -s "${width}x" -o "$PWD/$work/vips-$name-$width-p.jpg[Q=82,strip,interlace]"
        for row in "mediaonce ours" "vipsthumbnail vips"; do
          set -- $row
          out=$work/$2-$name-$width-p.jpg
          printf '%-6s %-5s %-14s %10s %12s %9d %8s\n' "$width" jpeg-p "$1" - - \
            "$(stat -c %s "$out")" "$(ssim "$reference" "$out")"
        done
        b_prog=$(stat -c %s "$work/ours-$name-$width-p.jpg")
        printf '%-6s %-5s bytes mediaonce/vips %.2f (both progressive)  mediaonce progressive/vips baseline %.2f\n' \
          "$width" jpeg-p "$(echo "$b_prog / $(stat -c %s "$work/vips-$name-$width-p.jpg")" | bc -l)" \
          "$(echo "$b_prog / $b_vips" | bc -l)"
      fi
    done
  done
done
