#!/usr/bin/env bash
# `make compose-test`: the compose stack end to end on a real Docker engine.
#   1. an engine (deploy/docker-engine.sh: installed and started when none runs, as root);
#   2. the images: dpmarket:local and dpmarket-prometheus:local (MONITORING=1
#      deploy/build-image.sh, as `MONITORING=1 make image`);
#   3. tests/deploy/test_compose_stack.py then tests/deploy/test_compose_monitoring.py (marker
#      compose) on one stack (tests/deploy/conftest.py): brought up once with its monitoring
#      profile, driven, scraped, and taken down with its volumes; `down -v` again here on any
#      exit, so that a killed run leaves nothing behind.
# PYTHON: the interpreter with dpmarket's test dependencies (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-dpmarket-compose-test}

deploy/docker-engine.sh
MONITORING=1 deploy/build-image.sh

compose=(docker-compose)
command -v docker-compose >/dev/null 2>&1 || compose=(docker compose)
trap '"${compose[@]}" -f deploy/docker-compose.yml --profile monitoring down -v --remove-orphans >/dev/null 2>&1 || true' EXIT
"$PYTHON" -m pytest -q -m compose tests/deploy/test_compose_stack.py \
  tests/deploy/test_compose_monitoring.py "$@"
