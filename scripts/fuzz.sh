#!/usr/bin/env bash
# Fuzzes the SQS body parser with cargo fuzz (libFuzzer). Not part of CI.
#
#   scripts/fuzz.sh [SECONDS]      default 60
#
# Seeds the corpus with the sample events and tests/corpus/bodies.json, then
# prints libFuzzer's summary (executions run, crashes). cargo fuzz wants a
# nightly compiler; RUSTC_BOOTSTRAP=1 lets the stable one take its flags.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
corpus=fuzz/corpus/parse_body
mkdir -p "$corpus"
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
RUSTC_BOOTSTRAP=1 cargo fuzz run parse_body "$corpus" -- -max_total_time="$seconds" -print_final_stats=1 2>&1 \
  | tee fuzz/last-run.log | grep -E "^(stat::|Done|#[0-9]+.*(DONE|pulse))|SUMMARY|panicked|crash" || true
grep -q "SUMMARY\|panicked" fuzz/last-run.log && { echo "fuzz: a crash, see fuzz/artifacts/"; exit 1; }
echo "fuzz: $(grep -oE 'stat::number_of_executed_units: [0-9]+' fuzz/last-run.log | grep -oE '[0-9]+$') executions in ${seconds} s, no crash"
