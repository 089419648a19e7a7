#!/usr/bin/env bash
# SHA-256 of a 1 GiB file through mediaonce's hashing path
# (examples/sha256.rs: fingerprint::ContentHasher in 1 MiB chunks, release
# profile) against `openssl dgst -sha256`, in the same run on the same file
# (read from the page cache after a first warm-up pass). Prints each
# median throughput, the ratio mediaonce / openssl (1.0 = as fast; the
# target is >= 0.9) and each peak RSS, which must not grow with the file.
#
#   bench/sha256.sh          RUNS=5 and SIZE_MIB=1024 by default
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
size_mib=${SIZE_MIB:-1024}
work=${BENCH_DIR:-target/bench-sha256}
mkdir -p "$work"
[ -x /usr/bin/time ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
command -v openssl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }

cargo build --release --example sha256 >&2
ours=target/release/examples/sha256

input=$work/input-${size_mib}mib.bin
if [ ! -f "$input" ]; then
  # Deterministic, incompressible bytes: zeros through AES-CTR (as long
  # as its input).
  head -c $((size_mib * 1024 * 1024)) /dev/zero \
    | openssl enc -aes-128-ctr -pass pass:mediaonce -nosalt -pbkdf2 >"$input.partial"
  mv "$input.partial" "$input"
fi
bytes=$(stat -c %s "$input")
cat "$input" >/dev/null # into the page cache

# measure COMMAND...: prints "median_seconds peak_kib hash".
measure() {
  local times=() peak=0 hash="" t m
  for _ in $(seq "$runs"); do
    hash=$(/usr/bin/time -f '%e %M' -o "$work/time.txt" "$@" 2>/dev/null | cut -d' ' -f1)
    read -r t m <"$work/time.txt"
    times+=("$t")
    [ "$m" -gt "$peak" ] && peak=$m
  done
  printf '%s %s %s\n' "$(printf '%s\n' "${times[@]}" | sort -g | sed -n "$(( (runs + 1) / 2 ))p")" "$peak" "$hash"
}

read -r ours_s ours_kib ours_hash < <(measure "$ours" "$input")
read -r ossl_s ossl_kib ossl_hash < <(measure openssl dgst -sha256 -r "$input")
[ "$ours_hash" = "$ossl_hash" ] || { echo "sha256: the hashes differ: $ours_hash vs $ossl_hash" >&2; exit 1; }

mib=$((bytes / 1024 / 1024))
awk -v mib="$mib" -v a="$ours_s" -v b="$ossl_s" -v ak="$ours_kib" -v bk="$ossl_kib" -v runs="$runs" -v cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" 'BEGIN {
  printf "sha256 of %d MiB, median of %d runs, on %s\n", mib, runs, cpu
  printf "%-10s %8.2f s %9.0f MiB/s  peak RSS %6d KiB\n", "mediaonce", a, mib / a, ak
  printf "%-10s %8.2f s %9.0f MiB/s  peak RSS %6d KiB\n", "openssl", b, mib / b, bk
  printf "throughput ratio mediaonce / openssl: %.2f (target >= 0.90)\n", (mib / a) / (mib / b)
}'
