"""The opt-in call record: what it writes for real calls on loopback, how it counts waves, and that
nothing is installed when it is off."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from runtime import rpc_trace
from runtime.rpc_trace import CallRecord
from runtime.transport import TransportSecurity, aio_channel, sync_channel

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


@pytest.fixture
def health_server() -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("svc", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


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
