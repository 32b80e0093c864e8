"""Connecting fails fast and says why, in one line.

A newcomer's typo in ``--curator`` used to wait 61 s for ``Deadline Exceeded`` under eight lines of
gRPC handshake logs, and a certificate of another CA looked the same. Each case below meets a real
socket or a real mTLS gRPC server on loopback: the channel's connect check
(:func:`dpmarket.runtime.transport.check_connected`, deadline :data:`CONNECT_TIMEOUT_SECONDS`) must
end with the cause. The only timing asserted is a generous wall-clock bound (20 s) against a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2_grpc

from dpmarket.consumer.client import CuratorClient
from dpmarket.curator.owners import GrpcOwnerEndpoint
from dpmarket.deploy.cli import main
from dpmarket.deploy.pki import init_ca, issue, issue_all
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import SERVER_OPTIONS
from dpmarket.runtime.transport import (
    CONNECT_TIMEOUT_SECONDS,
    ConnectError,
    TransportSecurity,
    add_port,
    check_connected,
    sync_channel,
)

pytestmark = pytest.mark.integration

CURATOR = Identity("curator", "curator")
OWNER_0 = Identity("owner", "owner-0")
ALICE = Identity("consumer", "alice")
#: A sanity bound against a hang, far above the 5 s connect deadline; not a timing assertion.
HANG_SECONDS = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This deployment's CA in ``ca/`` (curator, owner-0, alice); another CA in ``other/`` with
    its own curator and alice."""
    root = tmp_path_factory.mktemp("pki")
    init_ca(root / "ca")
    issue_all(root / "ca", [CURATOR, OWNER_0, ALICE])
    init_ca(root / "other")
    issue_all(root / "other", [CURATOR, ALICE])
    return root


def _security(directory: Path, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(directory, identity))


@contextlib.contextmanager
def _server(security: TransportSecurity) -> Iterator[str]:
    """A real mTLS gRPC server (health service only) on a free loopback port."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2), options=SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = add_port(server, "127.0.0.1:0", security)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _connect_error(target: str, security: TransportSecurity, expected: Identity) -> ConnectError:
    start = time.monotonic()
    with pytest.raises(ConnectError) as info:
        CuratorClient(target, security, curator=expected)
    assert time.monotonic() - start < HANG_SECONDS
    assert "\n" not in str(info.value)
    return info.value


def test_the_connect_deadline_is_at_most_5_s_and_apart_from_call_deadlines() -> None:
    assert 0 < CONNECT_TIMEOUT_SECONDS <= 5.0
    import inspect

    signature = inspect.signature(CuratorClient)
    assert signature.parameters["connect_timeout"].default == CONNECT_TIMEOUT_SECONDS
    assert signature.parameters["timeout"].default > CONNECT_TIMEOUT_SECONDS


def test_nothing_listening_is_named_with_the_address(pki: Path, closed_port: int) -> None:
    target = f"127.0.0.1:{closed_port}"
    error = _connect_error(target, _security(pki / "ca", ALICE), CURATOR)
    assert str(error) == f"cannot reach the curator: nothing listening at {target}"
    assert error.failure == "refused" and error.target == target


def test_a_server_of_another_ca_is_named_so(pki: Path) -> None:
    with _server(_security(pki / "other", CURATOR)) as target:
        error = _connect_error(target, _security(pki / "ca", ALICE), CURATOR)
    assert error.failure == "ca"
    assert f"the server at {target} presents a certificate not signed by this deployment's CA" in (
        str(error)
    )


def test_a_server_that_refuses_this_partys_certificate_is_named_so(pki: Path) -> None:
    # The client trusts both CAs, so the server's certificate passes; its own is the other
    # CA's, which the server does not trust: the handshake fails on the server's side.
    ca_pem = (pki / "ca" / "ca.crt").read_bytes() + (pki / "other" / "ca.crt").read_bytes()
    _, cert, key = identity_files(pki / "other", ALICE)
    client = TransportSecurity(ca_pem, cert.read_bytes(), key.read_bytes())
    with _server(_security(pki / "ca", CURATOR)) as target:
        error = _connect_error(target, client, CURATOR)
    assert error.failure == "ca"
    assert f"{target} (curator:curator) refused this party's certificate" in str(error)


def test_a_server_of_another_identity_is_named_with_both(pki: Path) -> None:
    with _server(_security(pki / "ca", OWNER_0)) as target:
        error = _connect_error(target, _security(pki / "ca", ALICE), CURATOR)
    assert error.failure == "identity"
    assert f"the server at {target} is owner:owner-0, not curator:curator" in str(error)


def test_a_right_server_connects_and_a_channel_is_left_usable(pki: Path) -> None:
    security = _security(pki / "ca", ALICE)
    with (
        _server(_security(pki / "ca", CURATOR)) as target,
        sync_channel(target, security, CURATOR) as channel,
    ):
        check_connected(channel, target, security, CURATOR)


def test_the_curator_endpoint_names_the_owner_it_did_not_reach(pki: Path) -> None:
    curator = _security(pki / "ca", CURATOR)

    async def run(target: str) -> None:
        wrong = GrpcOwnerEndpoint(target, curator, Identity("owner", "owner-9"))
        try:
            with pytest.raises(ConnectError, match="is owner:owner-0, not owner:owner-9"):
                await wrong.connect()
        finally:
            await wrong.close()

    with _server(_security(pki / "ca", OWNER_0)) as target:
        asyncio.run(run(target))


# --------------------------------------------------------------------- the newcomer's console
def _dpmarket(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``dpmarket ARGS`` as a user runs it: a fresh process, GRPC_VERBOSITY not set."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    return subprocess.run(
        [sys.executable, "-m", "dpmarket.deploy.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_request_to_a_curator_of_another_ca_fails_in_one_line(pki: Path, tmp_path: Path) -> None:
    """The whole console of ``dpmarket consumer request`` is one error line: no gRPC C-core
    log."""
    np.save(tmp_path / "v.npy", np.random.default_rng(0).random((10, 4)))
    with _server(_security(pki / "other", CURATOR)) as target:
        done = _dpmarket(
            "consumer", "request", "--curator", target, "--pki-dir", str(pki / "ca"),
            "--name", "alice", "--validation", "v.npy", "-p", "5", cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: cannot reach the curator: the server at")
    assert "not signed by this deployment's CA" in lines[0]


def test_request_to_nothing_fails_fast_naming_the_address(
    pki: Path, tmp_path: Path, closed_port: int
) -> None:
    np.save(tmp_path / "v.npy", np.random.default_rng(0).random((10, 4)))
    target = f"127.0.0.1:{closed_port}"
    result = CliRunner().invoke(
        main,
        ["request", "--curator", target, "--pki-dir", str(pki / "ca"), "--name", "alice",
         "--validation", str(tmp_path / "v.npy"), "-p", "5",
         "--out", str(tmp_path / "s.npy"), "--report", str(tmp_path / "r.json")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert f"Error: cannot reach the curator: nothing listening at {target}" in result.output
    assert not (tmp_path / "r.json").exists()


def test_health_with_any_partys_certificate_and_a_reason_when_down(
    pki: Path, closed_port: int
) -> None:
    """The README's ``dpmarket health --expect owner:owner-0 --pki-dir pki-alice/ --name alice``:
    a consumer's certificate probes an owner (the role is read from the directory)."""
    args = ["health", "--expect", "owner:owner-0", "--pki-dir", str(pki / "ca"), "--name", "alice"]
    with _server(_security(pki / "ca", OWNER_0)) as target:
        result = CliRunner().invoke(main, [*args, "--target", target])
    assert result.exit_code == 0, result.output
    assert f"{target}: SERVING" in result.output
    down = f"127.0.0.1:{closed_port}"
    result = CliRunner().invoke(main, [*args, "--target", down])
    assert result.exit_code == 1
    assert f"Error: nothing listening at {down}" in result.output


def test_health_names_the_missing_certificate(pki: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["health", "--target", "127.0.0.1:1", "--expect", "owner:owner-0",
         "--pki-dir", str(pki / "ca"), "--name", "bob"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "holds no certificate named 'bob'" in result.output


def test_curator_refuses_to_start_for_an_owner_of_another_name(pki: Path, tmp_path: Path) -> None:
    """``serve-curator --owner owner-9@ADDRESS`` where owner-0 serves ADDRESS: a start-up error
    naming both, not a consumer-facing failure later."""
    issue(pki / "ca", "owner", "owner-9")
    with _server(_security(pki / "ca", OWNER_0)) as target:
        result = CliRunner().invoke(
            main,
            ["serve-curator", "--owner", f"owner-9@{target}", "--pki-dir", str(pki / "ca"),
             "--name", "curator", "--data-dir", str(tmp_path / "state")],
        )  # fmt: skip
    assert result.exit_code == 1
    assert f"owner owner-9 at {target}: the server at {target} is owner:owner-0" in result.output
