#!/usr/bin/env bash
# A video pipeline on the emulators (probe, hls-package, poster, and the
# poster's thumbnails chained to it; tests/completion.rs's end-to-end test):
# per upload, the handler's DynamoDB calls and S3 requests, and the time
# from the PUT to the application's completion event (S3's notification,
# the job queue, the handler, EventBridge, a rule's queue) as a ratio of the
# steps' own time in the same run. Medians over RUNS runs.
#
#   bench/pipeline.sh            RUNS=3; starts the emulators if needed
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
scripts/emulators.sh start >&2
eval "$(scripts/emulators.sh env)"
export MEDIAONCE_FFMPEG
MEDIAONCE_FFMPEG=$(scripts/emulators.sh ffmpeg)
out=$(mktemp)
for _ in $(seq "$runs"); do
  cargo test -q --features testing --test completion a_video_pipeline_from_upload_to_event_to_deletion \
    -- --nocapture 2>/dev/null | grep '^pipeline-figures:' >>"$out"
done
python3 - "$out" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"pipeline-figures: (.*): DynamoDB calls (\d+), S3 requests (\d+), "
                 r"upload to event (\d+) ms, steps (\d+) ms", line)
    if m:
        rows.setdefault(m[1], []).append(tuple(int(x) for x in m.groups()[1:]))
print(f"{'upload':<28} {'DynamoDB calls':>15} {'S3 requests':>12} {'to event ms':>12} {'steps ms':>9} {'ratio':>6}")
for what, runs in rows.items():
    med = [statistics.median(col) for col in zip(*runs)]
    ratio = f"{med[2] / med[3]:.2f}" if med[3] else "-"
    print(f"{what:<28} {med[0]:>15.0f} {med[1]:>12.0f} {med[2]:>12.0f} {med[3]:>9.0f} {ratio:>6}")
PY
rm -f "$out"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m); runs: $runs"
