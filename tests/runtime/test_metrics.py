"""Every service's Prometheus metrics, scraped over HTTP as Prometheus scrapes them.

A real grpc.aio server (:func:`dpmarket.runtime.serving.start_server`, mTLS with a test CA) serves
probe servicers; the curator's calls are answered, a consumer's are refused at admission; then
``/metrics`` is fetched from the metrics endpoint and parsed with prometheus_client's own parser.
An owner's budget comes from its own ledger. Controls: a server started without metrics counts
nothing, and no request content (session ids sent in requests) ever appears in a scrape.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.metrics import OwnerCollector
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.metrics import ServiceMetrics
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.transport import aio_channel
from dpmarket.v1 import curator_pb2_grpc, owner_pb2, owner_pb2_grpc
from tests.runtime.test_admission import (
    ALICE,
    BOB,
    CURATOR,
    OWNER,
    SEND,
    ProbeCurator,
    ProbeOwner,
    _security,
)

DEADLINE = 30.0
#: A session id sent in requests: it must never reach a metric.
SECRET = "session-id-that-must-not-leak"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [CURATOR, OWNER, ALICE, BOB])
    return root


def scrape(metrics: ServiceMetrics) -> str:
    """GET /metrics from the endpoint, as Prometheus does."""
    assert metrics.address is not None
    host, port = metrics.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=DEADLINE) as response:
        assert response.status == 200
        return response.read().decode("utf-8")


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return float(found.get((name, frozenset(labels.items())), 0.0))


def _serve_and_call(pki: Path, metrics: ServiceMetrics | None) -> None:
    """Serve the probes as owner-0; the curator calls GetProgress twice and one RunRounds
    stream; consumer alice calls GetProgress once (refused at admission)."""

    async def main() -> None:
        # The generated servicer stubs declare every RPC abstract; grpc's servicer answers
        # UNIMPLEMENTED for those a probe does not define.
        owner, curator = ProbeOwner(), ProbeCurator()  # type: ignore[abstract]

        def register(server: grpc.aio.Server) -> None:
            owner_pb2_grpc.add_OwnerServiceServicer_to_server(owner, server)
            curator_pb2_grpc.add_CuratorServiceServicer_to_server(curator, server)

        server, port, _ = await start_server(
            register,
            ["dpmarket.v1.OwnerService", "dpmarket.v1.CuratorService"],
            "127.0.0.1:0",
            _security(pki, OWNER),
            metrics=metrics,
        )
        target = f"127.0.0.1:{port}"
        try:
            async with aio_channel(target, _security(pki, CURATOR), OWNER, SEND) as channel:
                stub = owner_pb2_grpc.OwnerServiceStub(channel)
                request = owner_pb2.GetProgressRequest(session_id=SECRET)
                for _ in range(2):
                    await stub.GetProgress(request, timeout=DEADLINE)
                # grpc.aio takes no request iterator (then write()); grpc-stubs requires one
                stream = stub.RunRounds(timeout=DEADLINE)  # type: ignore[call-arg]
                await stream.write(
                    owner_pb2.RunRoundsRequest(bid=owner_pb2.BidRequest(session_id=SECRET))
                )
                await stream.read()
                await stream.done_writing()
                assert await stream.code() == grpc.StatusCode.OK
            async with aio_channel(target, _security(pki, ALICE), OWNER, SEND) as channel:
                stub = owner_pb2_grpc.OwnerServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetProgress(request, timeout=DEADLINE)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_calls_refusals_and_latencies_are_scraped_by_method_and_status(pki: Path) -> None:
    metrics = ServiceMetrics()
    metrics.serve("127.0.0.1", 0)
    try:
        _serve_and_call(pki, metrics)
        text = scrape(metrics)
    finally:
        metrics.close()
    found = samples(text)
    party, service = "owner:owner-0", "dpmarket.v1.OwnerService"
    ok = {"party": party, "service": service, "method": "GetProgress"}
    assert value(found, "dpmarket_rpc_requests_total", **ok, code="OK") == 2
    assert value(found, "dpmarket_rpc_requests_total", **ok, code="PERMISSION_DENIED") == 1
    assert value(found, "dpmarket_refusals_total", **ok, reason="permission_denied") == 1
    assert value(found, "dpmarket_rpc_latency_seconds_count", **ok) == 3
    assert value(found, "dpmarket_rpc_latency_seconds_sum", **ok) > 0
    rounds = {"party": party, "service": service, "method": "RunRounds"}
    assert value(found, "dpmarket_rpc_requests_total", **rounds, code="OK") == 1
    assert value(found, "dpmarket_rpc_in_progress", party=party, service=service) == 0
    # Nothing a request carried is a label or a value.
    assert SECRET not in text
    assert "alice" not in text


def test_a_server_without_metrics_counts_nothing(pki: Path) -> None:
    metrics = ServiceMetrics()
    metrics.serve("127.0.0.1", 0)
    try:
        _serve_and_call(pki, None)  # the control: the same calls, metrics not given
        text = scrape(metrics)
    finally:
        metrics.close()
    assert "dpmarket_rpc_requests_total{" not in text


def test_an_owner_exports_its_budget_from_its_own_ledger(tmp_path: Path) -> None:
    policy = OwnerPolicy(epsilon_total=10.0, points_total=500, points_per_session=100)
    with OwnerLedger.create(tmp_path, policy) as ledger:
        for k, (eps, points) in enumerate([(1.0, 0), (0.5, 7), (0.25, 3)]):
            ledger.charge(
                session=f"s{k}",
                consumer="consumer:alice",
                curator="curator:curator",
                mechanism="relevance count",
                epsilon=eps,
                delta=0.0,
                points=points,
            )
        owner = Owner("clinic", None, ledger=ledger)
        metrics = ServiceMetrics()
        metrics.register(OwnerCollector(owner))
        metrics.serve("127.0.0.1", 0)
        try:
            found = samples(scrape(metrics))
        finally:
            metrics.close()
    labels = {"owner": "clinic", "window": "lifetime"}
    assert value(found, "dpmarket_owner_budget_spent", **labels, quantity="epsilon") == 1.75
    assert value(found, "dpmarket_owner_budget_limit", **labels, quantity="epsilon") == 10.0
    assert value(found, "dpmarket_owner_budget_spent", **labels, quantity="points") == 10
    assert value(found, "dpmarket_owner_budget_limit", **labels, quantity="points") == 500
    assert value(found, "dpmarket_owner_charges_total", owner="clinic") == 3
