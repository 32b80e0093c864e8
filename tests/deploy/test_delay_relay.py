"""The WAN harness's delaying relay (deploy/wan.py) on loopback: bytes intact and in order,
each chunk held for the one-way delay, counted per route."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from dpmarket.deploy.wan import PROFILES, DelayRelay


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A TCP server that sends back everything it reads, one connection at a time."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with conn:
                try:
                    while data := conn.recv(65536):
                        conn.sendall(data)
                except ConnectionError:
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    thread.join(timeout=10)
    server.close()


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)
        received = b""
        while data := client.recv(65536):
            received += data
    return received


def test_the_relay_delivers_every_byte_in_order_after_its_one_way_delay(
    echo: tuple[str, int],
) -> None:
    relay = DelayRelay(PROFILES["rtt20"].one_way_seconds)
    try:
        port = relay.add("client->echo", ("127.0.0.1", 0), echo)
        payload = bytes(range(256)) * 4096  # 1 MiB, many chunks
        assert _exchange(port, payload) == payload
        stats = relay.stats["client->echo"]
        assert stats.connections == 1
        assert stats.bytes_forward == stats.bytes_back == len(payload)
        assert stats.min_hold_seconds >= 0.010
        relay.one_way_seconds = 0.0  # the LAN profile, for later bytes
        assert _exchange(port, b"x") == b"x"
        assert relay.stats["client->echo"].connections == 2
    finally:
        relay.close()


def test_profiles_and_a_negative_delay() -> None:
    assert {p.name: (p.rtt_ms, p.rate_mbit) for p in PROFILES.values()} == {
        "lan": (0.0, 100.0),
        "rtt20": (20.0, 100.0),
        "rtt100": (100.0, 100.0),
    }
    assert PROFILES["rtt100"].one_way_seconds == 0.05
    with pytest.raises(ValueError, match="-1"):
        DelayRelay(-1)
