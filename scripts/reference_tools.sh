#!/usr/bin/env bash
# Installs the reference tools the tests hold outputs to, when they are
# missing: from Debian, libvips' vipsthumbnail (libvips-tools), ImageMagick
# 6 (/usr/bin/convert) and libjpeg-turbo's cjpeg (libjpeg-turbo-progs) for
# the thumbnail's differential test, Node.js with npm, and Chromium; from
# the npm registry, tests/js's locked packages (video.js' m3u8-parser,
# which tests/hls_iframes.rs parses the playlists with; hls.js and
# playwright-core, with which tests/player.rs plays a package in that
# Chromium). `make test` runs it first.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v vipsthumbnail >/dev/null || need+=(libvips-tools)
[ -x /usr/bin/convert ] || need+=(imagemagick)
command -v cjpeg >/dev/null || need+=(libjpeg-turbo-progs)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -x /usr/bin/chromium ] || need+=(chromium)
npm_packages() {
  # Again only when the lock is newer than the last install.
  if [ ! tests/js/node_modules/.package-lock.json -nt tests/js/package-lock.json ]; then
    echo "reference tools: npm ci in tests/js"
    npm ci --prefix tests/js --no-audit --no-fund --loglevel=error >/dev/null
  fi
}
if [ ${#need[@]} -eq 0 ]; then
  npm_packages
  exit 0
fi
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
npm_packages
