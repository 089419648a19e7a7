#!/usr/bin/env bash
# Installs the reference tools the thumbnail's differential test runs
# against, from Debian, when they are missing: libvips' vipsthumbnail
# (libvips-tools), ImageMagick 6 (/usr/bin/convert) and libjpeg-turbo's
# cjpeg (libjpeg-turbo-progs). `make test` runs it first.
set -euo pipefail
need=()
command -v vipsthumbnail >/dev/null || need+=(libvips-tools)
[ -x /usr/bin/convert ] || need+=(imagemagick)
command -v cjpeg >/dev/null || need+=(libjpeg-turbo-progs)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "reference tools: missing ${need[*]}; install them with apt-get as root" >&2
    exit 1
  fi
fi
echo "reference tools: installing ${need[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
