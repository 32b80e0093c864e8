"""Real gRPC over mutual TLS: only CA-issued parties get through, and each side knows the other.

A grpc.aio health server on loopback records the identity it sees for every call that reaches its
handler; clients with the right, missing or foreign key material call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpmarket.common.errors import UnavailableError
from dpmarket.curator.owners import GrpcOwnerEndpoint
from dpmarket.deploy.pki import init_ca, issue, issue_all
from dpmarket.runtime.identity import Identity, identity_files, peer_identity
from dpmarket.runtime.serving import GRPC_OPTIONS, SERVER_OPTIONS
from dpmarket.runtime.transport import (
    TARGET_NAME_OVERRIDE,
    TransportSecurity,
    add_port,
    aio_channel,
    sync_channel,
)

pytestmark = pytest.mark.integration

OWNER_0 = Identity("owner", "owner-0")
OWNER_1 = Identity("owner", "owner-1")
CURATOR_OWNER_0 = Identity("curator", "owner-0")  # the name of an owner, the role of a curator
CURATOR = Identity("curator", "curator")
ALICE = Identity("consumer", "alice")

#: Deadline of every call: a safety net against a hang, not a timing assertion.
DEADLINE_SECONDS = 30.0

Connect = Callable[[str], grpc.aio.Channel]


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    """Five parties of one CA in ``ca/``; another CA and its own consumer alice in ``other/``."""
    init_ca(tmp_path / "ca")
    issue_all(tmp_path / "ca", [OWNER_0, OWNER_1, CURATOR_OWNER_0, CURATOR, ALICE])
    init_ca(tmp_path / "other")
    issue(tmp_path / "other", ALICE.role, ALICE.name)
    return tmp_path


def _security(pki_dir: Path, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki_dir / "ca", identity))


class RecordingHealth(health.aio.HealthServicer):  # type: ignore[name-defined]
    """The standard health servicer, recording the caller's identity on every Check."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[Identity | None] = []

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        self.peers.append(peer_identity(context))
        return await super().Check(request, context)


@contextlib.asynccontextmanager
async def _serving(security: TransportSecurity) -> AsyncIterator[tuple[str, RecordingHealth]]:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    servicer = RecordingHealth()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = add_port(server, "127.0.0.1:0", security)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


async def _check(channel: grpc.aio.Channel) -> grpc.StatusCode:
    try:
        await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=DEADLINE_SECONDS
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _call(
    server: TransportSecurity, connect: Connect
) -> tuple[grpc.StatusCode, list[Identity | None]]:
    """Serve with ``server``, make one Check through ``connect``; return its code and the peers."""

    async def run() -> tuple[grpc.StatusCode, list[Identity | None]]:
        async with _serving(server) as (target, servicer):
            async with connect(target) as channel:
                code = await _check(channel)
            return code, servicer.peers

    return asyncio.run(run())


# -------------------------------------------------------------------------- who gets in
@pytest.mark.parametrize("client", [ALICE, CURATOR], ids=str)
def test_server_sees_the_identity_of_a_ca_issued_client(pki_dir: Path, client: Identity) -> None:
    security = _security(pki_dir, client)
    code, peers = _call(
        _security(pki_dir, OWNER_0),
        lambda target: aio_channel(target, security, OWNER_0, GRPC_OPTIONS),
    )
    assert code == grpc.StatusCode.OK
    assert peers == [client]


def test_blocking_channel_is_mutual_tls_too(pki_dir: Path) -> None:
    security = _security(pki_dir, ALICE)

    def blocking_check(target: str) -> None:
        with sync_channel(target, security, OWNER_0, GRPC_OPTIONS) as channel:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=DEADLINE_SECONDS
            )

    async def run() -> list[Identity | None]:
        async with _serving(_security(pki_dir, OWNER_0)) as (target, servicer):
            await asyncio.to_thread(blocking_check, target)
            return servicer.peers

    assert asyncio.run(run()) == [ALICE]


def _without_certificate(pki_dir: Path) -> Connect:
    ca = (pki_dir / "ca" / "ca.crt").read_bytes()
    credentials = grpc.ssl_channel_credentials(ca)
    options = [(TARGET_NAME_OVERRIDE, OWNER_0.dns_name)]
    return lambda target: grpc.aio.secure_channel(target, credentials, options=options)


def _plaintext(pki_dir: Path) -> Connect:
    return lambda target: aio_channel(target, TransportSecurity.plaintext(), OWNER_0)


def _certificate_of_another_ca(pki_dir: Path) -> Connect:
    # The client trusts the right CA, so only the server's check of the client can refuse it.
    ca = (pki_dir / "ca" / "ca.crt").read_bytes()
    _, cert, key = identity_files(pki_dir / "other", ALICE)
    credentials = grpc.ssl_channel_credentials(ca, key.read_bytes(), cert.read_bytes())
    options = [(TARGET_NAME_OVERRIDE, OWNER_0.dns_name)]
    return lambda target: grpc.aio.secure_channel(target, credentials, options=options)


@pytest.mark.parametrize(
    "client",
    [_without_certificate, _plaintext, _certificate_of_another_ca],
    ids=lambda f: f.__name__,
)
def test_handshake_refuses_a_client_without_a_ca_issued_certificate(
    pki_dir: Path, client: Callable[[Path], Connect]
) -> None:
    code, peers = _call(_security(pki_dir, OWNER_0), client(pki_dir))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert peers == []  # the handler never ran


def test_other_ca_material_is_refused_before_any_connection(pki_dir: Path) -> None:
    ca, _, _ = identity_files(pki_dir / "ca", ALICE)
    _, cert, key = identity_files(pki_dir / "other", ALICE)
    with pytest.raises(ValueError, match="not issued by this deployment.s CA"):
        TransportSecurity.from_files(ca, cert, key)


# --------------------------------------------------------------- whom the client reaches
def test_client_refuses_a_server_with_another_name(pki_dir: Path) -> None:
    security = _security(pki_dir, ALICE)
    code, peers = _call(
        _security(pki_dir, OWNER_0), lambda target: aio_channel(target, security, OWNER_1)
    )
    assert code == grpc.StatusCode.UNAVAILABLE
    assert peers == []


def test_role_is_part_of_the_server_identity(pki_dir: Path) -> None:
    security = _security(pki_dir, ALICE)
    impostor = _security(pki_dir, CURATOR_OWNER_0)
    code, peers = _call(impostor, lambda target: aio_channel(target, security, OWNER_0))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert peers == []
    # The same server passes as what it is.
    code, peers = _call(impostor, lambda target: aio_channel(target, security, CURATOR_OWNER_0))
    assert code == grpc.StatusCode.OK
    assert peers == [ALICE]


def test_the_curator_connects_ahead_only_to_the_owner_it_expects(pki_dir: Path) -> None:
    """``GrpcOwnerEndpoint.connect`` completes the handshake with the right owner, and gives up
    with UNAVAILABLE on a server that proves another name, naming both (no call is ever made
    to it)."""
    curator = _security(pki_dir, CURATOR)

    async def run() -> list[Identity | None]:
        async with _serving(_security(pki_dir, OWNER_0)) as (target, servicer):
            right = GrpcOwnerEndpoint(target, curator, OWNER_0)
            await right.connect(timeout=DEADLINE_SECONDS)
            await right.close()
            wrong = GrpcOwnerEndpoint(target, curator, OWNER_1)
            with pytest.raises(UnavailableError, match="is owner:owner-0, not owner:owner-1"):
                await wrong.connect(timeout=0.5)
            await wrong.close()
            return servicer.peers

    assert asyncio.run(run()) == []


def test_without_an_expected_identity_the_target_host_is_checked(pki_dir: Path) -> None:
    # gRPC then checks the server certificate against "127.0.0.1", which no dpmarket
    # certificate names: callers must say whom they expect.
    security = _security(pki_dir, ALICE)
    code, peers = _call(
        _security(pki_dir, OWNER_0), lambda target: aio_channel(target, security, None)
    )
    assert code == grpc.StatusCode.UNAVAILABLE
    assert peers == []


# -------------------------------------------------------------------------------- plaintext
def test_plaintext_has_no_identities(caplog: pytest.LogCaptureFixture) -> None:
    plaintext = TransportSecurity.plaintext()
    with caplog.at_level(logging.WARNING, logger="dpmarket.runtime.transport"):
        code, peers = _call(plaintext, lambda target: aio_channel(target, plaintext, None))
    assert code == grpc.StatusCode.OK
    assert peers == [None]
    assert any("serving plaintext" in record.getMessage() for record in caplog.records)
