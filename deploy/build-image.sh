#!/usr/bin/env bash
# Build the dpmarket image (deploy/Dockerfile) where only package registries are reachable:
# `make image` runs this from the repository root.
#
# Environment (all optional):
#   IMAGE              tag of the image built (default dpmarket:local)
#   BASE_IMAGE         the base (any image with python3 >= 3.11 and venv). Default: python:3.11-slim
#                      if it is present or can be pulled, else a Debian bookworm base made here
#                      with debootstrap (python3, python3-venv) and loaded with `docker import`.
#   EXTRA_CA           a CA bundle pip must trust in the build stage, on top of certifi's (a
#                      TLS-inspecting proxy's CA). Default: the host's bundle,
#                      /etc/ssl/certs/ca-certificates.crt, when it exists; EXTRA_CA= for none.
#                      It is handed to the build stage only, never to the final image.
#   DPMARKET_CACHE_DIR where the debootstrap base is kept as a tarball, keyed by its inputs
#                      (default ${XDG_CACHE_HOME:-$HOME/.cache}/dpmarket); delete it to rebuild.
#   DEBIAN_MIRROR      debootstrap's mirror (default http://deb.debian.org/debian)
#   HTTP_PROXY, HTTPS_PROXY, NO_PROXY (and lower-case): passed to the build when set (Docker's
#                      predefined proxy arguments: they stay out of the image's history).
#   MONITORING         1: also build dpmarket-prometheus:local (deploy/monitoring/Dockerfile:
#                      Debian's prometheus package) on the same base, for the compose stack's
#                      monitoring profile.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-dpmarket:local}
DEFAULT_BASE=python:3.11-slim
EXTRA_CA=${EXTRA_CA-/etc/ssl/certs/ca-certificates.crt}
CACHE_DIR=${DPMARKET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpmarket}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=python3,python3-venv
# Bump when the recipe below changes: it is part of the base's cache key.
RECIPE=1

log() { echo "build-image: $*" >&2; }

# Paths removed on exit, whatever happens (a half-made base, the CA bundle's copy).
cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# A Docker engine first: without one, every step below fails, the base image's pull (or a
# debootstrap base, minutes) first, with an error that blames the registry.
if ! command -v docker >/dev/null 2>&1; then
  log "no docker command: install Docker (deploy/docker-engine.sh does, as root), then make image"
  exit 1
fi
if ! engine_error=$(docker info 2>&1 >/dev/null); then
  log "no Docker engine answers ($(printf '%s' "$engine_error" | grep -m1 . || true)): start one" \
    "(deploy/docker-engine.sh, as root), then make image"
  exit 1
fi

# The debootstrap base, tagged by a hash of its inputs; made once, then kept as a tarball.
debootstrap_base() {
  local key tag tarball rootfs
  key=$(printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$PACKAGES" "$(uname -m)" | sha256sum | cut -c1-12)
  tag="dpmarket-base:$SUITE-$key"
  tarball="$CACHE_DIR/base-$SUITE-$key.tar"
  if image_exists "$tag"; then
    log "base $tag is loaded"
  else
    if [ ! -s "$tarball" ]; then
      if ! command -v debootstrap >/dev/null 2>&1; then
        if [ "$(id -u)" != 0 ]; then
          log "debootstrap is missing (apt-get install debootstrap, as root)"
          exit 1
        fi
        log "installing debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
      fi
      log "making a $SUITE base with debootstrap ($PACKAGES) into $tarball"
      mkdir -p "$CACHE_DIR"
      rootfs=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
      cleanup+=("$rootfs" "$tarball.tmp")
      debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
        >"$CACHE_DIR/debootstrap.log" 2>&1 || {
        tail -20 "$CACHE_DIR/debootstrap.log" >&2
        exit 1
      }
      # What a container never needs: package downloads and lists, documentation.
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
      tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
      mv -f "$tarball.tmp" "$tarball"
      rm -rf "$rootfs"
    else
      log "base tarball $tarball is cached"
    fi
    docker import --change 'CMD ["python3"]' "$tarball" "$tag" >/dev/null
    log "imported $tag"
  fi
  BASE_IMAGE=$tag
}

if [ -z "${BASE_IMAGE:-}" ]; then
  if image_exists "$DEFAULT_BASE" || timeout 120 docker pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
    BASE_IMAGE=$DEFAULT_BASE
  else
    log "$DEFAULT_BASE cannot be pulled; using a debootstrap base"
    debootstrap_base
  fi
fi

args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
for var in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  if [ -n "${!var:-}" ]; then
    args+=(--build-arg "$var")
  fi
done

# The CA bundle goes to build/image/extra-ca.pem (the one path of build/ the build context
# holds, see .dockerignore) for the build stage, and is removed afterwards.
ca_copy=build/image/extra-ca.pem
rm -f "$ca_copy"
if [ -n "$EXTRA_CA" ]; then
  if [ ! -s "$EXTRA_CA" ]; then
    log "EXTRA_CA=$EXTRA_CA is not a readable non-empty file"
    exit 1
  fi
  mkdir -p build/image
  cleanup+=("$ca_copy")
  cp "$EXTRA_CA" "$ca_copy"
fi

log "building $IMAGE on $BASE_IMAGE${EXTRA_CA:+ (build stage trusts $EXTRA_CA)}"
docker build -f deploy/Dockerfile "${args[@]}" -t "$IMAGE" .
# The image this build replaced, now untagged: each holds its own copy of the virtual
# environment (about 1 GB), so repeated builds would fill the disk. The build stage's layers,
# the cache of the next build, are kept.
docker image prune -f --filter dangling=true --filter label=org.dpmarket.image=dpmarket >/dev/null

if [ "${MONITORING:-0}" = 1 ]; then
  log "building dpmarket-prometheus:local on $BASE_IMAGE"
  docker build -f deploy/monitoring/Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -t dpmarket-prometheus:local .
  docker image prune -f --filter dangling=true \
    --filter label=org.dpmarket.image=dpmarket-prometheus >/dev/null
fi
