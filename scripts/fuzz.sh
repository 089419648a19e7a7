#!/usr/bin/env bash
# Fuzzes a parser with cargo fuzz (libFuzzer). Not part of CI.
#
#   scripts/fuzz.sh [SECONDS] [TARGET]     default 60 s, parse_body
#
# parse_body: the SQS body parser, seeded with the sample events and
# tests/corpus/bodies.json. parse_movie: the MP4/MOV reader, seeded with
# small clips made by ffmpeg (MP4 moov first and last, MOV, M4A, fragmented).
# decode_image: the thumbnail step's decoding (a JPEG at reduced scale
# through mediaonce_jpeg::scaled, else jpeg-decoder; PNG and the rest through
# `image`), seeded with small images ffmpeg writes (baseline JPEGs 4:2:0,
# 4:2:2, 4:4:4 and grey, a PNG).
# Prints libFuzzer's summary (executions run, crashes). cargo fuzz wants a
# nightly compiler; RUSTC_BOOTSTRAP=1 lets the stable one take its flags.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
target=${2:-parse_body}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# The seeds are made by the pinned ffmpeg (as make test's clips), unless
# MEDIAONCE_FFMPEG names another.
ffmpeg() { "${MEDIAONCE_FFMPEG:-$(scripts/emulators.sh ffmpeg 2>/dev/null | tail -n 1)}" "$@"; }
corpus=fuzz/corpus/$target
mkdir -p "$corpus"
if [ "$target" = parse_movie ]; then
  src=(-f lavfi -i testsrc=size=64x48:rate=10:duration=1 -f lavfi -i sine=duration=1
       -c:v libx264 -preset ultrafast -pix_fmt yuv420p -c:a aac)
  ffmpeg -loglevel error -y "${src[@]}" -movflags +faststart "$corpus/first.mp4"
  ffmpeg -loglevel error -y "${src[@]}" "$corpus/last.mp4"
  ffmpeg -loglevel error -y "${src[@]}" -f mov "$corpus/clip.mov"
  ffmpeg -loglevel error -y "${src[@]}" -movflags +frag_keyframe+empty_moov "$corpus/frag.mp4"
  ffmpeg -loglevel error -y -f lavfi -i sine=duration=1 -c:a aac -f ipod "$corpus/tone.m4a"
elif [ "$target" = decode_image ]; then
  for fmt in yuvj420p yuvj422p yuvj444p gray; do
    ffmpeg -loglevel error -y -f lavfi -i testsrc=size=200x136 -frames:v 1 -pix_fmt "$fmt" \
      "$corpus/$fmt.jpg"
  done
  ffmpeg -loglevel error -y -f lavfi -i testsrc=size=64x48 -frames:v 1 "$corpus/small.png"
else
python3 - "$corpus" <<'PY'
import glob, hashlib, json, os, sys
out = sys.argv[1]
bodies = [c["body"] for c in json.load(open("tests/corpus/bodies.json"))]
for path in glob.glob("events/*.json"):
    bodies += [r["body"] for r in json.load(open(path))["Records"]]
for body in bodies:
    name = hashlib.sha1(body.encode()).hexdigest()
    with open(os.path.join(out, name), "w") as f:
        f.write(body)
PY
fi
RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "$corpus" -- -max_total_time="$seconds" -print_final_stats=1 2>&1 \
  | tee fuzz/last-run.log | grep -E "^(stat::|Done|#[0-9]+.*(DONE|pulse))|SUMMARY|panicked|crash" || true
grep -q "SUMMARY\|panicked" fuzz/last-run.log && { echo "fuzz: a crash, see fuzz/artifacts/"; exit 1; }
echo "fuzz: $(grep -oE 'stat::number_of_executed_units: [0-9]+' fuzz/last-run.log | grep -oE '[0-9]+$') executions in ${seconds} s, no crash"
