#!/usr/bin/env bash
# Installs, starts and stops the AWS emulators the integration tests run against.
#
#   scripts/emulators.sh install        create the virtualenv with LocalStack and moto
#   scripts/emulators.sh start [MODE]   start them (MODE: native | docker | auto)
#   scripts/emulators.sh stop           stop whatever start started
#   scripts/emulators.sh env            print the AWS_* exports that point the SDK at them
#   scripts/emulators.sh status         exit 0 when they answer
#   scripts/emulators.sh python | bin   the virtualenv's python, its bin folder
#                                       (it also holds cfn-lint and cargo-lambda)
#   scripts/emulators.sh ffmpeg         the path of the pinned ffmpeg (imageio-ffmpeg's
#                                       static build) that make test runs
#
# native: LocalStack from PyPI (no Docker) for S3, SQS, EventBridge and Step Functions (with
#         STS, which its service needs beside it) on :4566, and moto's
#         server for DynamoDB on :4567 (LocalStack's DynamoDB needs a Java jar).
# docker: the LocalStack container for all three services on :4566.
# auto:   docker when a Docker engine answers, native otherwise (the default).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${MEDIAONCE_EMULATOR_HOME:-$HOME/.cache/mediaonce/emulators}
venv=$home/venv
state=$home/state
logs=$home/logs
ls_port=${LOCALSTACK_PORT:-4566}
moto_port=${MOTO_PORT:-4567}
localstack_image=${LOCALSTACK_IMAGE:-localstack/localstack:2026.3.0}
mkdir -p "$home" "$state" "$logs"

find_python() {
  local candidate
  for candidate in python3.13 python3.14 "$HOME"/.pyenv/versions/3.1[3-9]*/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 13) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  echo "emulators: LocalStack 2026.3 needs Python >= 3.13 (it imports warnings.deprecated) and none was found" >&2
  return 1
}

install() {
  local want have=""
  want=$(cat "$here/requirements-emulators.txt" "$here/../layers/ffmpeg/requirements.txt" | sha256sum | cut -c1-64)
  [ -f "$venv/.requirements" ] && have=$(cat "$venv/.requirements")
  if [ "$want" = "$have" ] && [ -x "$venv/bin/python" ]; then
    echo "emulators: virtualenv up to date ($venv)"
    mend_localstack
    return 0
  fi
  rm -rf "$venv"
  "$(find_python)" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -r "$here/requirements-emulators.txt"
  echo "$want" > "$venv/.requirements"
  echo "emulators: installed into $venv"
  mend_localstack
}

# LocalStack's Step Functions loses a task's answer (or heartbeat) that
# comes before the task arms its heartbeat wait: see patch_localstack.py.
mend_localstack() {
  "$venv/bin/python" "$here/patch_localstack.py" \
    "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
}

# Polls a URL until it answers; a bounded wait for a process we just started.
wait_for() {
  local url=$1 name=$2 pid=${3:-} tries=0
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    tries=$((tries + 1))
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "emulators: $name exited; its log:" >&2
      tail -n 40 "$logs/$name.log" >&2 || true
      return 1
    fi
    if [ "$tries" -ge 600 ]; then
      echo "emulators: $name did not answer at $url within 60 s" >&2
      return 1
    fi
    sleep 0.1
  done
}

docker_available() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

start_native() {
  install
  if ! curl -fsS -o /dev/null "http://127.0.0.1:$ls_port/_localstack/health" 2>/dev/null; then
    (
      cd "$home"
      GATEWAY_LISTEN=127.0.0.1:$ls_port GATEWAY_SERVER=hypercorn LOCALSTACK_HOST=127.0.0.1:$ls_port \
        SERVICES=s3,sqs,events,stepfunctions,sts EAGER_SERVICE_LOADING=1 SQS_ENDPOINT_STRATEGY=path DNS_ADDRESS=0 \
        DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 PERSISTENCE=0 \
        exec setsid "$venv/bin/python" -m localstack.runtime.main >"$logs/localstack.log" 2>&1
    ) &
    echo $! > "$state/localstack.pid"
  fi
  if ! curl -fsS -o /dev/null "http://127.0.0.1:$moto_port/moto-api/" 2>/dev/null; then
    setsid "$venv/bin/python" "$here/moto_dynamodb.py" 127.0.0.1 "$moto_port" >"$logs/moto.log" 2>&1 &
    echo $! > "$state/moto.pid"
  fi
  wait_for "http://127.0.0.1:$ls_port/_localstack/health" localstack "$(cat "$state/localstack.pid" 2>/dev/null || true)"
  wait_for "http://127.0.0.1:$moto_port/moto-api/" moto "$(cat "$state/moto.pid" 2>/dev/null || true)"
  echo native > "$state/mode"
}

start_docker() {
  docker rm -f mediaonce-localstack >/dev/null 2>&1 || true
  docker run -d --name mediaonce-localstack -p "127.0.0.1:$ls_port:4566" \
    -e SERVICES=s3,sqs,events,dynamodb,stepfunctions,sts -e EAGER_SERVICE_LOADING=1 -e SQS_ENDPOINT_STRATEGY=path \
    "$localstack_image" >/dev/null
  wait_for "http://127.0.0.1:$ls_port/_localstack/health" localstack
  echo docker > "$state/mode"
}

stop_pid() {
  local file=$1 pid i
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

stop() {
  case "$(cat "$state/mode" 2>/dev/null || echo native)" in
    docker) docker rm -f mediaonce-localstack >/dev/null 2>&1 || true ;;
    *) stop_pid "$state/localstack.pid"; stop_pid "$state/moto.pid" ;;
  esac
  rm -f "$state/mode"
}

print_env() {
  echo "export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=${AWS_REGION:-us-east-1} AWS_DEFAULT_REGION=${AWS_REGION:-us-east-1}"
  echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$ls_port"
  if [ "$(cat "$state/mode" 2>/dev/null || echo native)" = native ]; then
    echo "export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$moto_port"
  else
    echo "unset AWS_ENDPOINT_URL_DYNAMODB"
  fi
}

# The static ffmpeg that imageio-ffmpeg ships, by its path in the package
# (not imageio_ffmpeg.get_ffmpeg_exe(), which would fall back to a system
# ffmpeg and hide a missing binary).
ffmpeg_path() {
  local exe
  exe=$("$venv/bin/python" -c '
import pathlib, imageio_ffmpeg
found = sorted((pathlib.Path(imageio_ffmpeg.__file__).parent / "binaries").glob("ffmpeg-linux-*"))
print(found[0] if found else "")')
  if [ -z "$exe" ]; then
    echo "emulators: imageio-ffmpeg has no ffmpeg for $(uname -m) Linux" >&2
    return 1
  fi
  [ -x "$exe" ] || chmod +x "$exe"
  echo "$exe"
}

status() {
  curl -fsS -o /dev/null "http://127.0.0.1:$ls_port/_localstack/health" 2>/dev/null || return 1
  if [ "$(cat "$state/mode" 2>/dev/null || echo none)" = native ]; then
    curl -fsS -o /dev/null "http://127.0.0.1:$moto_port/moto-api/" 2>/dev/null || return 1
  fi
  [ -f "$state/mode" ]
}

case "${1:-}" in
  install) install ;;
  start)
    mode=${2:-${MEDIAONCE_EMULATORS:-auto}}
    if [ "$mode" = auto ]; then
      if docker_available; then mode=docker; else mode=native; fi
    fi
    case "$mode" in
      native) start_native ;;
      docker) start_docker ;;
      *) echo "emulators: unknown mode '$mode' (native | docker | auto)" >&2; exit 2 ;;
    esac
    echo "emulators: $mode, S3/SQS on :$ls_port$([ "$mode" = native ] && echo ", DynamoDB on :$moto_port")"
    ;;
  stop) stop ;;
  env) print_env ;;
  status) status ;;
  python) install >&2; echo "$venv/bin/python" ;;
  bin) install >&2; echo "$venv/bin" ;;
  ffmpeg) install >&2; ffmpeg_path ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
