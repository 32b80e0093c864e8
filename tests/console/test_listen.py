"""``dpmarket console --listen``: the address a console prints is one a browser can open."""

from __future__ import annotations

import socket
import urllib.parse

import click
import pytest

from dpmarket.console import cli
from dpmarket.console.cli import WILDCARDS, shown_host


def test_a_wildcard_listen_prints_a_host_others_can_connect_to() -> None:
    """Serving on every interface (``0.0.0.0``), the console prints this machine's name or
    routed address, not the wildcard: a socket bound there accepts a connection made to the
    printed host and the bound port (the control: the wildcard is what was printed before, and
    no other machine can open it). A host given is printed as given."""
    host = shown_host("0.0.0.0")
    assert host not in WILDCARDS and host != "127.0.0.1"
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen(1)
        port = server.getsockname()[1]
        url = urllib.parse.urlsplit(f"http://{host}:{port}/prefix/")
        with socket.create_connection((url.hostname, url.port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()
    assert shown_host("127.0.0.1") == "127.0.0.1"
    assert shown_host("192.0.2.7") == "192.0.2.7"


def test_a_wildcard_on_a_machine_nobody_can_reach_is_refused_saying_what_to_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine whose name resolves to the loopback only and which has no route: refused
    before anything starts, the error naming the option and what to give."""
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    monkeypatch.setattr(cli, "_route_address", lambda family: None)
    with pytest.raises(click.UsageError, match=r"--listen 0\.0\.0\.0: .*give --listen"):
        shown_host("0.0.0.0")
