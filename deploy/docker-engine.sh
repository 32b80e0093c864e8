#!/usr/bin/env bash
# A Docker engine and its clients for `make compose-test` and .ci/run. Nothing happens when an
# engine answers and docker-compose (or the compose plugin) and debootstrap are there. Otherwise,
# as root: Debian's packages docker.io, docker-compose and debootstrap are installed if missing
# (apt-get), and dockerd is started in the background when no engine answers, logging to
# $DOCKERD_LOG (default /var/log/dpmarket-dockerd.log). Not root and no engine: an error.
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/dpmarket-dockerd.log}
say() { echo "docker-engine: $*" >&2; }

missing=()
command -v dockerd >/dev/null 2>&1 || command -v docker >/dev/null 2>&1 || missing+=(docker.io)
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    say "missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]}) or run as root"
    exit 1
  fi
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "no Docker engine answers, and only root can start one here"
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  say "installing docker.io (a docker client is here, but no engine)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
say "starting dockerd (log: $log)"
mkdir -p "$(dirname "$log")"
nohup dockerd >>"$log" 2>&1 </dev/null &
for _ in $(seq 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
say "dockerd did not answer within 60 s; the end of its log:"
tail -20 "$log" >&2
exit 1
