#!/usr/bin/env bash
# hls-package on a long 1080p clip (the default ladder: 1080, 720 and 360
# lines, veryfast, two threads): (a) as one ffmpeg run over the whole
# input, the baseline, and (b) split into the recipe's chunks (60 s by
# default), each its own ffmpeg run as a chunk job runs it, with 1 and 2
# local workers: mediaonce's encode (examples/hls_package.rs, release
# build), the pinned ffmpeg, the same clip in the same run.
#
# Prints wall and CPU seconds (user + system, ffmpeg's included), the
# split's CPU as a ratio of the whole run's (target <= 1.10), the
# real-time factor of one invocation (input seconds per second at the
# template's job function's default 1024 MiB, whose CPU share is
# 1024/1769 of a vCPU), and a projection for a 60-minute 1080p video split
# across 60 concurrent invocations of that size and of the template's
# chunk function (3538 MiB, where chunks run), from the measured CPU per
# chunk.
#
#   bench/hls_long.sh                 SECONDS=180 CONTENT=clean
#   CONTENT=noisy bench/hls_long.sh   camera-like grain: x264's worst case
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_OF_VIDEO:-180}
content=${CONTENT:-clean}
memory=${MEMORY_MIB:-1024}
work=${BENCH_DIR:-target/bench-hls}
mkdir -p "$work"
[ -x /usr/bin/time ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
ffmpeg=$(scripts/emulators.sh ffmpeg 2>/dev/null | tail -1)
export MEDIAONCE_FFMPEG=$ffmpeg

cargo build --release --example hls_package >&2
ours=target/release/examples/hls_package

# The clip (bench/clip.sh): testsrc2 at 1080p30 with a tone.
. bench/clip.sh
clip=$(bench_clip "$work" "$seconds" "$content")
params='{"ladder":[1080,720,360]}'
echo "$content 1080p30 clip of ${seconds} s ($(stat -c %s "$clip") bytes); $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# measure NAME ARGS...: runs the encode; sets NAME_wall, NAME_cpu, NAME_out.
measure() {
  local name=$1
  shift
  local out
  out=$(/usr/bin/time -f '%e %U %S' -o "$work/time.txt" "$ours" "$clip" "$work/$name" "$params" "$@")
  read -r wall user sys < "$work/time.txt"
  printf -v "${name}_wall" '%s' "$wall"
  printf -v "${name}_cpu" '%s' "$user+$sys"
  printf -v "${name}_out" '%s' "$out"
}
measure whole whole
measure split1 split 1
measure split2 split 2
reads=$("$ours" "$clip" "$work/reads" "$params" reads)

python3 - "$seconds" "$memory" "$whole_wall" "$whole_cpu" "$split1_wall" "$split1_cpu" \
  "$split2_wall" "$split2_cpu" "$split1_out" "$reads" <<'PY'
import json, sys
seconds, memory = float(sys.argv[1]), float(sys.argv[2])
def number(text):  # "user+sys" for CPU
    return sum(float(part) for part in text.split("+"))
whole_wall, whole_cpu, s1_wall, s1_cpu, s2_wall, s2_cpu = map(number, sys.argv[3:9])
split = json.loads(sys.argv[9])
chunks, chunk_walls = split["chunks"], split["chunk_seconds"]
print(f"{'run':<22}{'wall s':>9}{'CPU s':>9}{'CPU-s per s':>13}{'x real time':>13}")
for name, wall, cpu in [("whole (one run)", whole_wall, whole_cpu),
                        (f"split, 1 worker", s1_wall, s1_cpu),
                        (f"split, 2 workers", s2_wall, s2_cpu)]:
    print(f"{name:<22}{wall:>9.1f}{cpu:>9.1f}{cpu / seconds:>13.2f}{seconds / wall:>13.2f}")
print(f"split CPU / whole CPU: {s1_cpu / whole_cpu:.3f} (1 worker), {s2_cpu / whole_cpu:.3f} (2 workers); target <= 1.10")
print(f"{chunks} chunks; each run's wall s: {', '.join(f'{w:.1f}' for w in chunk_walls)}")
reads = json.loads(sys.argv[10])
size = reads["input_bytes"]
print("bytes a chunk's partial copy holds (moov, its samples, a GOP and 1 s either side): "
      + ", ".join(f"{b / 1e6:.0f} MB ({b / size:.0%})" for b in reads["chunk_bytes"])
      + f" of {size / 1e6:.0f} MB; the spooled whole today")
vcpu = min(memory / 1769.0, 2.0)  # Lambda's share, and the encoder's two threads
cpu_per_s = s1_cpu / seconds
rtf = vcpu / cpu_per_s
print(f"one invocation at {memory:.0f} MiB ({vcpu:.2f} vCPU): {rtf:.2f}x real time; "
      f"in 900 s less the 70 s it keeps: {830 * rtf / 60:.1f} min of video unsplit")
# 60 minutes in 60 s chunks on 60 invocations: one wave; each chunk's
# encode at the measured CPU per second of video, on the invocation's
# share, plus the chunk's seek (its run's start) and the hops.
hops = 2 * 1.0 + 1.0  # chunk message, the join's copies, the hand-on: assumed, not measured here
for mib in (memory, 3538.0):
    share = min(mib / 1769.0, 2.0)
    chunk_wall = 60 * cpu_per_s / share
    print(f"60 min of 1080p on 60 invocations of {mib:.0f} MiB: ~{(chunk_wall + hops) / 60:.1f} min "
          f"(a 60 s chunk encodes in {chunk_wall:.0f} s; {hops:.0f} s assumed for queue hops and the join)")
PY
