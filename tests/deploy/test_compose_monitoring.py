"""The compose stack's monitoring profile on a real Docker engine (``make compose-test``, or
``make compose-monitoring-test`` alone).

The stack of tests/deploy/conftest.py, which ``make compose-test`` brings up once for this module
and tests/deploy/test_compose_stack.py, runs the monitoring profile: Prometheus (Debian's package,
deploy/monitoring/Dockerfile) beside what it scrapes (the pki and data jobs, five owners, the
curator, each serving its metrics on port 9464 of the stack's internal networks). The test reads
Prometheus's own HTTP API on the host's loopback: every service is a target that is up, the
owners' budgets from their ledgers and the calls of the services' health checks are in it, and
every query of the Grafana dashboard (deploy/monitoring/dashboard.json) runs without error and,
but for the refusals and the charges (which depend on what ran before), finds data. Run after the
stack's other tests (.ci/run's order), it also sees the services that were killed and restarted
scraped again.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_compose_stack import OWNERS, Stack

pytestmark = [pytest.mark.integration, pytest.mark.compose]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "monitoring" / "dashboard.json"
PORT = int(os.environ.get("DPMARKET_PROMETHEUS_PORT", "9090"))
#: Safety nets against a hang (never timing assertions).
UP_TIMEOUT = 300
#: Dashboard panels whose queries may find nothing (no call refused, no charge made yet).
MAY_BE_EMPTY = {"Refusals per second, by reason", "Charges recorded per hour"}


def _query(expr: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as response:
        return dict(json.loads(response.read()))


def _targets() -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/v1/targets", timeout=30) as r:
        return list(json.loads(r.read())["data"]["activeTargets"])


def _wait_for_scrapes() -> None:
    """Until Prometheus scrapes all six services, holds a sample of each owner's budget and two
    scrapes of the calls (what a rate needs)."""
    deadline = time.monotonic() + UP_TIMEOUT
    last: Any = None
    while time.monotonic() < deadline:
        try:
            targets = _targets()
            budgets = _query('dpmarket_owner_budget_limit{quantity="epsilon"}')["data"]["result"]
        except OSError as exc:  # Prometheus is starting
            last = exc
        else:
            last = [(t["labels"]["instance"], t["health"], t.get("lastError")) for t in targets]
            if (
                len(targets) == 6
                and all(t["health"] == "up" for t in targets)
                and len(budgets) == 5
            ):
                return
        time.sleep(2)
    raise AssertionError(f"Prometheus did not scrape every service: {last}")


def test_prometheus_scrapes_every_service_and_runs_the_dashboards_queries(
    stack: Stack,
) -> None:
    _wait_for_scrapes()
    instances = {t["labels"]["instance"]: t["labels"]["role"] for t in _targets()}
    assert instances == {"curator:9464": "curator", **{f"{o}:9464": "owner" for o in OWNERS}}
    # Each owner's budget, from its own ledger: the production policy's lifetime ε of 10.
    budgets = _query('dpmarket_owner_budget_limit{quantity="epsilon"}')["data"]["result"]
    assert {r["metric"]["owner"]: float(r["value"][1]) for r in budgets} == dict.fromkeys(
        OWNERS, 10.0
    )
    assert {r["metric"]["window"] for r in budgets} == {"lifetime"}
    # The compose health checks are calls every service counted.
    checks = _query('dpmarket_rpc_requests_total{method="Check",code="OK"}')["data"]["result"]
    assert {r["metric"]["party"] for r in checks} == {
        "curator:curator",
        *(f"owner:{o}" for o in OWNERS),
    }
    stages = _query('dpmarket_sessions{party="curator:curator"}')["data"]["result"]
    assert {r["metric"]["stage"] for r in stages} == {"setup", "rounds", "done", "failed"}
    # Every query of the Grafana dashboard runs in Prometheus (a rate finds data once two
    # scrapes of its series are in).
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            deadline = time.monotonic() + UP_TIMEOUT
            while True:
                answer = _query(target["expr"])
                assert answer["status"] == "success", (panel["title"], answer)
                if panel["title"] in MAY_BE_EMPTY or answer["data"]["result"]:
                    break
                assert time.monotonic() < deadline, (panel["title"], target["expr"])
                time.sleep(2)
