#!/usr/bin/env bash
# The handler's own cost, on in-memory clients with injected latencies
# (examples/handler_bench.rs) and a cold start against a local stub of the
# Runtime API (bench/runtime_stub.py). Prints figures, not pass/fail:
#
# (a) a batch of 10 distinct messages against the same 10 one by one, with
#     DynamoDB DYNAMODB_MS (5), HEAD HEAD_MS (15), GET GET_MS (30) per call:
#     each wall time and their ratio (median of RUNS);
# (b) the duplicate path, no latency, one thread: messages per CPU second;
# (c) a cold start: exec of the release bootstrap to its first Runtime API
#     poll (median of RUNS, beside exec of /bin/true in the same run), and
#     the arm64 bootstrap's size (target/lambda/bootstrap/bootstrap, from
#     `make lambda`; built first when LAMBDA=1).
#
#   bench/handler.sh          RUNS=5
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
work=${BENCH_DIR:-target/bench-handler}
mkdir -p "$work"

cargo build --release --example handler_bench --bin bootstrap >&2
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

: >"$work/runs.txt"
for _ in $(seq "$runs"); do
  target/release/examples/handler_bench "${DYNAMODB_MS:-5}" "${HEAD_MS:-15}" "${GET_MS:-30}" 2000 \
    2>/dev/null >>"$work/runs.txt"
done
python3 bench/runtime_stub.py target/release/bootstrap "$runs" >>"$work/runs.txt"

figure() { awk -v n="$1" '$1 == n {print $2}' "$work/runs.txt" | median; }
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m); medians of $runs runs"
echo "(a) latencies: DynamoDB ${DYNAMODB_MS:-5} ms, HEAD ${HEAD_MS:-15} ms, GET ${GET_MS:-30} ms"
echo "    batch of 10 distinct messages:  $(figure batch_of_10_ms) ms"
echo "    the same 10 one by one:         $(figure one_by_one_ms) ms"
echo "    batch / one by one:             $(figure batch_over_one_by_one)   (target <= 0.3)"
echo "(b) duplicate path, no latency:     $(figure duplicate_messages_per_cpu_second) messages per CPU second   (target >= 20000)"
echo "(c) exec to first Runtime API poll: $(figure cold_start_ms) ms   (target < 25; exec of /bin/true: $(figure exec_true_ms) ms)"
if [ "${LAMBDA:-0}" = 1 ]; then make lambda >&2; fi
if [ -f target/lambda/bootstrap/bootstrap ]; then
  size=$(stat -c %s target/lambda/bootstrap/bootstrap)
  awk -v s="$size" 'BEGIN {printf "    arm64 bootstrap: %d bytes (%.2f MB; target < 8 MB)\n", s, s / 1e6}'
else
  echo "    arm64 bootstrap: not built (LAMBDA=1, or make lambda)"
fi
