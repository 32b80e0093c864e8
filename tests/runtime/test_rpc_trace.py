"""The opt-in call record: what it writes for real calls on loopback, how it counts waves, and that
nothing is installed when it is off."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpmarket.runtime import rpc_trace
from dpmarket.runtime.rpc_trace import CallRecord
from dpmarket.runtime.transport import TransportSecurity, aio_channel, sync_channel
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

CHECK = "/grpc.health.v1.Health/Check"


def _record(
    start: float, end: float, caller: str = "curator:c", peer: str = "owner:o"
) -> CallRecord:
    return CallRecord(caller, peer, "/x/Y", start, end, 1, 2, 1, "OK")


def test_waves_merge_overlapping_calls_and_count_sequential_stages() -> None:
    stage_1 = [_record(0.0, 1.0), _record(0.1, 1.2), _record(0.2, 0.5)]
    stage_2 = [_record(1.3, 2.0), _record(1.4, 1.9)]
    stage_3 = [_record(2.5, 2.6)]
    assert rpc_trace.waves([]) == 0
    assert rpc_trace.waves(stage_1) == 1
    assert rpc_trace.waves([*stage_3, *stage_1, *stage_2]) == 3
    # A call that starts inside a wave and ends after it still belongs to it.
    assert rpc_trace.waves([_record(0.0, 1.0), _record(0.9, 3.0), _record(2.0, 2.5)]) == 1


def test_select_filters_by_roles_and_window() -> None:
    records = [
        _record(0.0, 1.0),
        _record(0.5, 1.5, caller="consumer:x", peer="curator:c"),
        _record(5.0, 6.0),
    ]
    assert rpc_trace.select(records, caller_role="curator", peer_role="owner") == [
        records[0],
        records[2],
    ]
    assert rpc_trace.select(records, caller_role="curator", peer_role="owner", end=2.0) == [
        records[0]
    ]
    assert rpc_trace.totals(records[:1]) == {
        "calls": 1,
        "waves": 1,
        "request_bytes": 1,
        "response_bytes": 2,
    }


def _serving(server: grpc.Server) -> Iterator[str]:
    """Serve on a free loopback port; yield ``host:port``; stop."""
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def health_server() -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("svc", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    yield from _serving(server)


def test_off_by_default_installs_nothing(
    health_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(rpc_trace.TRACE_ENV, raising=False)
    assert rpc_trace.aio_interceptors("a", "b") == []
    assert rpc_trace.sync_interceptor("a", "b") is None
    with sync_channel(health_server, TransportSecurity.plaintext(), None) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(service="svc")).status == 1
    assert not any(tmp_path.iterdir())


def test_records_sizes_names_and_times_of_real_calls(
    health_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "calls.jsonl"
    monkeypatch.setenv(rpc_trace.TRACE_ENV, str(trace))
    request = health_pb2.HealthCheckRequest(service="svc")
    serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    with sync_channel(health_server, TransportSecurity.plaintext(), None) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(request) == serving
        with pytest.raises(grpc.RpcError) as failed:
            stub.Check(health_pb2.HealthCheckRequest(service="unknown"))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        stream = stub.Watch(request)
        assert next(stream) == serving
        stream.cancel()

    async def aio_calls() -> None:
        async with aio_channel(health_server, TransportSecurity.plaintext(), None) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answers = await asyncio.gather(stub.Check(request), stub.Check(request))
            assert answers == [serving, serving]

    asyncio.run(aio_calls())

    records = rpc_trace.read_records(trace)
    assert [(r.method, r.code) for r in records] == [
        (CHECK, "OK"),
        (CHECK, "NOT_FOUND"),
        ("/grpc.health.v1.Health/Watch", "CANCELLED"),
        (CHECK, "OK"),
        (CHECK, "OK"),
    ]
    first = records[0]
    assert (first.caller, first.peer) == ("?", health_server)
    assert first.request_bytes == request.ByteSize()
    assert first.response_bytes == serving.ByteSize()
    assert first.start <= first.end
    watch = records[2]
    assert (watch.responses, watch.response_bytes) == (1, serving.ByteSize())
    # The two concurrent aio calls make one wave; with the sync calls before them, four.
    assert rpc_trace.waves(records[3:]) == 1
    assert rpc_trace.waves(records) == 4


def _rounds_handler(requests: Iterator[owner_pb2.RunRoundsRequest], context: Any) -> Any:
    """A RunRounds stream that bids for every bid step and refuses every release."""
    for request in requests:
        if request.WhichOneof("step") != "bid":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no point")
        yield owner_pb2.RunRoundsResponse(bid=owner_pb2.BidResponse(has_bid=True, bid=0.5))


@pytest.fixture
def rounds_server() -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(2))
    handler = grpc.stream_stream_rpc_method_handler(
        _rounds_handler,
        request_deserializer=owner_pb2.RunRoundsRequest.FromString,
        response_serializer=owner_pb2.RunRoundsResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("dpmarket.v1.OwnerService", {"RunRounds": handler}),)
    )
    yield from _serving(server)


def test_records_each_exchange_of_a_stream_as_a_call(
    rounds_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "calls.jsonl"
    monkeypatch.setenv(rpc_trace.TRACE_ENV, str(trace))
    bid = owner_pb2.RunRoundsRequest(bid=owner_pb2.BidRequest(session_id="s", round=1))
    release = owner_pb2.RunRoundsRequest(
        release_point=owner_pb2.ReleasePointRequest(session_id="s", round=1)
    )

    async def exchanges() -> None:
        async with aio_channel(rounds_server, TransportSecurity.plaintext(), None) as channel:
            call = owner_pb2_grpc.OwnerServiceStub(channel).RunRounds(None)
            for _ in range(2):
                await call.write(bid)
                answer = await call.read()
                assert isinstance(answer, owner_pb2.RunRoundsResponse) and answer.bid.has_bid
            await call.write(release)
            with pytest.raises(grpc.RpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    asyncio.run(exchanges())

    records = rpc_trace.read_records(trace)
    assert [(r.name, r.code, r.responses) for r in records] == [
        ("RunRounds.bid", "OK", 1),
        ("RunRounds.bid", "OK", 1),
        ("RunRounds.release_point", "FAILED_PRECONDITION", 0),
    ]
    assert {r.method for r in records} == {"/dpmarket.v1.OwnerService/RunRounds"}
    assert records[0].request_bytes == bid.ByteSize()
    assert records[2].request_bytes == release.ByteSize()
    # One after another: each exchange is its own wave, as a unary call would be.
    assert rpc_trace.waves(records) == 3
    assert dict(rpc_trace.iter_methods(records)) == {
        "RunRounds.bid": 2,
        "RunRounds.release_point": 1,
    }
