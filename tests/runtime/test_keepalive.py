"""Keepalive between services: a client channel PINGs its server also while idle, and the
project's servers admit those PINGs, so an idle connection stays up (a NAT between hosts keeps
its mapping) rather than being closed by the server as abusive.

Both sides run at a 1-second PING interval here (the production interval is 30 s, the same
functions build both): over 5 idle seconds the client sends about five PINGs."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpmarket.runtime.serving import (
    CHANNEL_OPTIONS,
    GRPC_OPTIONS,
    KEEPALIVE_SECONDS,
    SERVER_OPTIONS,
    keepalive_client_options,
    keepalive_server_options,
)

IDLE_SECONDS = 5.0


def _idle_states(server_options: list[tuple[str, int]]) -> list[grpc.ChannelConnectivity]:
    """Connect, call once, stay idle for IDLE_SECONDS, call again; the channel's states."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2), options=server_options)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    states: list[grpc.ChannelConnectivity] = []
    lock = threading.Lock()

    def record(state: grpc.ChannelConnectivity) -> None:
        with lock:
            states.append(state)

    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[*GRPC_OPTIONS, *keepalive_client_options(1.0)]
    )
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        channel.subscribe(record)
        time.sleep(IDLE_SECONDS)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        channel.unsubscribe(record)
    finally:
        channel.close()
        server.stop(None)
    with lock:
        return list(states)


def test_an_idle_channel_stays_connected_to_a_server_admitting_its_pings() -> None:
    states = _idle_states([*GRPC_OPTIONS, *keepalive_server_options(1.0)])
    assert states and set(states) == {grpc.ChannelConnectivity.READY}, states


def test_a_server_not_admitting_the_pings_closes_the_idle_connection() -> None:
    """The control: with gRPC's default (PINGs without calls at most every 5 minutes) the
    server answers the client's PINGs with GOAWAY and the channel leaves READY."""
    states = _idle_states(GRPC_OPTIONS)
    assert any(s != grpc.ChannelConnectivity.READY for s in states), states


@pytest.mark.parametrize("options", [CHANNEL_OPTIONS, SERVER_OPTIONS])
def test_the_services_options_carry_the_keepalive(options: list[tuple[str, int]]) -> None:
    keys = dict(options)
    assert keys["grpc.keepalive_permit_without_calls"] == 1
    if "grpc.keepalive_time_ms" in keys:  # a client: PINGs every KEEPALIVE_SECONDS
        assert keys["grpc.keepalive_time_ms"] == KEEPALIVE_SECONDS * 1000
    else:  # a server: admits them
        assert keys["grpc.http2.min_ping_interval_without_data_ms"] < KEEPALIVE_SECONDS * 1000
