#!/usr/bin/env bash
# `make compose-monitoring-test`: the compose stack's monitoring profile on a real Docker engine.
#   1. an engine (deploy/docker-engine.sh: installed and started when none runs, as root);
#   2. the images: dpmarket:local and dpmarket-prometheus:local (MONITORING=1
#      deploy/build-image.sh: Prometheus from Debian's package on the same base);
#   3. tests/deploy/test_compose_monitoring.py (marker compose) alone: the stack of
#      tests/deploy/conftest.py comes up (the owners, the curator and Prometheus), Prometheus
#      scrapes every service, and every query of the Grafana dashboard
#      (deploy/monitoring/dashboard.json) runs in it; `down -v` again here on any exit.
# `make compose-test` runs this module too, on the stack it brings up for its own (what CI runs).
# PYTHON: the interpreter with dpmarket's test dependencies (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-dpmarket-monitoring-test}

deploy/docker-engine.sh
MONITORING=1 deploy/build-image.sh

compose=(docker-compose)
command -v docker-compose >/dev/null 2>&1 || compose=(docker compose)
trap '"${compose[@]}" -f deploy/docker-compose.yml --profile monitoring down -v --remove-orphans >/dev/null 2>&1 || true' EXIT
"$PYTHON" -m pytest -q -m compose tests/deploy/test_compose_monitoring.py "$@"
