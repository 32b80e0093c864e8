#!/usr/bin/env bash
# `make compose-test`: the compose stack end to end on a real Docker engine.
#   1. an engine (deploy/docker-engine.sh: installed and started when none runs, as root);
#   2. the image (deploy/build-image.sh, as `make image`);
#   3. tests/deploy/test_compose_stack.py (marker compose), which brings the stack up, drives it
#      and takes it down with its volumes; `down -v` again here on any exit, so that a killed run
#      leaves nothing behind.
# PYTHON: the interpreter with dpmarket's test dependencies (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-dpmarket-compose-test}

deploy/docker-engine.sh
deploy/build-image.sh

compose=(docker-compose)
command -v docker-compose >/dev/null 2>&1 || compose=(docker compose)
trap '"${compose[@]}" -f deploy/docker-compose.yml down -v --remove-orphans >/dev/null 2>&1 || true' EXIT
"$PYTHON" -m pytest -q -m compose tests/deploy/test_compose_stack.py "$@"
