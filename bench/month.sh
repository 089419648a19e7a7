#!/usr/bin/env bash
# The reference design's month (mediaonce simulate: 100,000 uploads through
# the real handler on in-memory clients, virtual clock), release build.
# Prints the month's table (last run), then the median wall time and the
# peak RSS over RUNS runs, and the wall time as a ratio of the 30 s target
# (< 1.0 is within it).
#
#   bench/month.sh                 RUNS=3, the default mix
#   bench/month.sh --uploads 10000 extra flags go to mediaonce simulate
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
work=${BENCH_DIR:-target/bench-month}
mkdir -p "$work"
[ -x /usr/bin/time ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }

cargo build --release --bin mediaonce >&2
times=() peak=0
for _ in $(seq "$runs"); do
  /usr/bin/time -f '%e %M' -o "$work/time.txt" target/release/mediaonce simulate --json "$@" >"$work/month.txt"
  read -r t m <"$work/time.txt"
  times+=("$t")
  [ "$m" -gt "$peak" ] && peak=$m
done
median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
head -n -1 "$work/month.txt"
tail -n 1 "$work/month.txt" | python3 -c '
import json, sys
r = json.load(sys.stdin)
holds = r["runs_by_content"] == r["unique_jobs"] + r["runs_cut_short_by_crashes"]
print(f"invariant runs_by_content == unique_jobs + runs_cut_short_by_crashes: {holds}")
'
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)"
echo "wall time (median of $runs): ${median} s; peak RSS: ${peak} KiB"
awk -v t="$median" 'BEGIN {printf "wall time / 30 s target: %.2f\n", t / 30}'
