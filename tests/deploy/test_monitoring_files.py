"""deploy/monitoring without an engine: the Grafana dashboard's queries name only metrics the
services export, and Prometheus's scrape configuration lists every service of the compose stack
at the port its command line serves metrics on (the stack itself: test_compose_monitoring.py).

The exported names are read from a real scrape: a server's call counted, an owner's collector
over a real ledger, a curator's collector over a real session manager.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client import generate_latest

from dpmarket.curator.metrics import CuratorCollector
from dpmarket.curator.sessions import SessionManager
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.metrics import OwnerCollector
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.metrics import ServiceMetrics

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
METRICS_PORT = "9464"
#: Series names Prometheus itself adds to every scrape target.
PROMETHEUS_OWN = {"up"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series name a scrape of an owner and a curator holds (with ``_bucket``, ``_sum``,
    ``_count`` and ``_total`` forms)."""
    metrics = ServiceMetrics()
    metrics.observe("owner:o", "/dpmarket.v1.OwnerService/Bid", grpc.StatusCode.OK, 0.01)
    metrics.observe("owner:o", "/dpmarket.v1.OwnerService/Bid", grpc.StatusCode.NOT_FOUND, 0.01)
    metrics.in_progress.labels("owner:o", "dpmarket.v1.OwnerService").set(0)
    with OwnerLedger.create(tmp_path_factory.mktemp("owner"), OwnerPolicy()) as ledger:
        metrics.register(OwnerCollector(Owner("o", None, ledger=ledger)))
        metrics.register(CuratorCollector(SessionManager([]), "curator:c"))
        text = generate_latest(metrics.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    return exprs


def test_every_dashboard_query_names_an_exported_metric(exported: set[str]) -> None:
    for expr in _dashboard_exprs():
        names = set(re.findall(r"\b(dpmarket_[a-z0-9_]+|up)\b", expr))
        assert names, expr
        unknown = names - exported - PROMETHEUS_OWN
        assert not unknown, f"{expr}: {unknown} is not exported (exported: {sorted(exported)})"


def test_the_dashboard_covers_what_operators_asked_for(exported: set[str]) -> None:
    text = " ".join(_dashboard_exprs())
    for name in (
        "dpmarket_rpc_requests_total",  # calls by method and status
        "dpmarket_rpc_latency_seconds_bucket",  # latencies
        "dpmarket_sessions",  # sessions by stage
        "dpmarket_owner_budget_spent",  # ε charged per owner and window
        "dpmarket_refusals_total",  # refusals by reason
    ):
        assert name in text and name in exported, name


def test_prometheus_scrapes_every_service_of_the_stack_where_it_serves_metrics() -> None:
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        t for job in scrape["scrape_configs"] for group in job["static_configs"]
        for t in group["targets"]
    }  # fmt: skip
    services = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]
    serving = set()
    for name, service in services.items():
        argv = service.get("command") or []
        if argv[:2] in (["owner", "serve"], ["curator", "serve"]):
            assert argv[argv.index("--metrics-port") + 1] == METRICS_PORT, name
            assert argv[argv.index("--metrics-host") + 1] == "0.0.0.0", name
            serving.add(f"{name}:{METRICS_PORT}")
    assert targets == serving
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    # Only its own API, and only on the host's loopback.
    assert all(str(p).startswith("127.0.0.1:") for p in prometheus["ports"])
