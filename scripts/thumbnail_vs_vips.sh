#!/usr/bin/env bash
# The thumbnail's differential test against libvips on all of its cases
# (tests/thumbnail_vips.rs: 15 sizes, 20 flavours, widths 1 to 1280), in a
# release build, printing the tables: flavour × width, the lowest channel
# SSIM against vipsthumbnail and against vipsthumbnail on a lossless full
# decode, and for outputs under 4 px the largest mean level difference.
# `make test` runs a small set of the same cases.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/reference_tools.sh
MEDIAONCE_VIPS_CASES=all cargo test --release --test thumbnail_vips -- --nocapture \
  jpegs_of_every_flavour_and_size_thumbnail_like_vips
