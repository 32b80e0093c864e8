"""The curator checks its configured owners at start-up.

A real owner service (its servicer on a grpc.aio server over mTLS, in this process) answers the
curator's :func:`dpmarket.curator.owners.check_owners`: a name that its certificate does not carry,
and an allocation sketch spec of 7 columns for points of 10 features, are start-up errors naming the
owner (and the columns); an owner that does not answer is a warning.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from dpmarket.common.errors import (
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from dpmarket.curator.disclosure import public_error
from dpmarket.curator.owners import OWNER_RESPONSE_BYTES, GrpcOwnerEndpoint, check_owners
from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.protocol import Owner
from dpmarket.owner.service import OwnerServicer, owner_authorizer
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.replies import ReplyTooLargeError
from dpmarket.runtime.serving import MAX_MESSAGE_BYTES, start_server
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import owner_pb2, owner_pb2_grpc, schema_pb2

pytestmark = pytest.mark.integration

CURATOR = Identity("curator", "curator")
OWNERS = [Identity("owner", "owner-0"), Identity("owner", "owner-1"), Identity("owner", "owner-9")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [CURATOR, *OWNERS])
    return root


def _security(pki: Path, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki, identity))


async def _owner_server(pki: Path, name: str, n_features: int):
    """Serve an owner of 20 points of ``n_features`` features; return (server, address)."""
    identity = Identity("owner", name)
    owner = Owner(name, PointSet(np.random.default_rng(0).random((20, n_features)), None, name))
    security = _security(pki, identity)
    authorizer = owner_authorizer(("curator",), security)

    servicer = OwnerServicer(owner, authorizer)

    def register(server):
        owner_pb2_grpc.add_OwnerServiceServicer_to_server(servicer, server)

    service = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name
    server, port, _ = await start_server(register, service, "127.0.0.1:0", security)
    return server, f"127.0.0.1:{port}"


def _run(pki: Path, configured: list[tuple[str, str | None]], **kwargs):
    """Start owner-0 (10 features) and owner-1 (10 features); check ``configured`` owners,
    each (name, address or None for owner-<name>'s own)."""

    async def run():
        servers = {n: await _owner_server(pki, n, 10) for n in ("owner-0", "owner-1")}
        curator = _security(pki, CURATOR)
        endpoints = [
            GrpcOwnerEndpoint(
                address or servers[name][1], curator, Identity("owner", name), deadline=10.0
            )
            for name, address in configured
        ]
        try:
            return await check_owners(endpoints, **kwargs)
        finally:
            for endpoint in endpoints:
                await endpoint.close()
            for server, _ in servers.values():
                await server.stop(None)

    return asyncio.run(run())


def test_owners_as_configured_pass(pki: Path) -> None:
    checks = _run(
        pki,
        [("owner-0", None), ("owner-1", None)],
        allocation_columns=[f"f{j}" for j in range(10)],
        allocation_spec="digits/rff",
    )
    assert [(c.owner, c.error, c.warning) for c in checks] == [
        ("owner-0", "", ""),
        ("owner-1", "", ""),
    ]


def test_an_allocation_spec_of_7_columns_for_owners_of_10_is_a_start_up_error(pki: Path) -> None:
    with pytest.raises(FailedPreconditionError) as info:
        _run(
            pki,
            [("owner-0", None), ("owner-1", None)],
            allocation_columns=[f"c{j}" for j in range(7)],
            allocation_spec="clinic/rff",
        )
    message = str(info.value)
    for owner in ("owner-0", "owner-1"):
        assert (
            f"--allocation-sketch-spec clinic/rff has 7 column(s) (c0, c1, c2, c3, c4, c5, c6) "
            f"but owner {owner} at 127.0.0.1:"
        ) in message
    assert "holds points of 10 features" in message


def test_an_owner_name_its_certificate_does_not_carry_is_a_start_up_error(pki: Path) -> None:
    # owner-9 is configured at owner-1's address: the server proves owner-1.
    async def run():
        server, address = await _owner_server(pki, "owner-1", 10)
        endpoint = GrpcOwnerEndpoint(address, _security(pki, CURATOR), OWNERS[2])
        try:
            with pytest.raises(FailedPreconditionError) as info:
                await check_owners([endpoint])
        finally:
            await endpoint.close()
            await server.stop(None)
        return address, str(info.value)

    address, message = asyncio.run(run())
    assert message.startswith(
        f"owner owner-9 at {address}: the server at {address} is owner:owner-1, not owner:owner-9"
    )


def test_an_owner_that_does_not_answer_is_a_warning(
    pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{sock.getsockname()[1]}"
        with caplog.at_level(logging.WARNING, logger="dpmarket.curator.owners"):
            checks = _run(pki, [("owner-0", None), ("owner-9", down)])
    assert checks[0].warning == "" and checks[0].error == ""
    assert checks[1].error == ""
    assert checks[1].warning == (
        f"owner owner-9 at {down}: nothing listening at {down}; sessions leave it out until it "
        "answers"
    )
    assert checks[1].warning in caplog.text


def test_the_curator_warns_when_its_allocation_would_read_no_sketch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Publishing sketches did not make the curator use them, and sessions then
    charged every owner through the counts allocation without a word."""
    from dpmarket.curator.cli import _warn_about_allocation
    from dpmarket.curator.sketches import SketchCatalog

    spec = Path(__file__).resolve().parents[2] / "deploy" / "sketches" / "flights.toml"
    catalog = SketchCatalog.from_files(tmp_path, [spec], owners=["owner-0"], seed=0)
    try:
        with caplog.at_level(logging.WARNING, logger="dpmarket"):
            _warn_about_allocation(catalog, None, ["owner-0"])
            _warn_about_allocation(catalog, "flights/rff", ["owner-0"])
    finally:
        catalog.close()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith(
        "the catalogue holds RFF spec(s) flights/rff but no --allocation-sketch-spec names one"
    )
    assert messages[1].startswith(
        "no sketch under flights/rff yet from owner-0: until every owner publishes one "
        "(dpmarket owner publish --spec flights/rff;"
    )


# ----------------------------------------------- what an owner answers the curator is bounded

#: A GetOwnerInfo answer's owner id that no curator error may carry (the reply's own text).
_REPLY_MARK = "zq"


async def _fake_owner(pki: Path, answer: owner_pb2.GetOwnerInfoResponse):
    """An owner's server that is not the owner service: it proves owner-1 (its real test
    certificate) and answers every GetOwnerInfo with ``answer``; return (server, address)."""
    raw = answer.SerializeToString()

    async def info(request: bytes, context: object) -> bytes:
        return raw

    server = grpc.aio.server(options=[("grpc.max_send_message_length", 512 << 20)])
    service = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name
    handler = grpc.method_handlers_generic_handler(
        service,
        {"GetOwnerInfo": grpc.unary_unary_rpc_method_handler(info, bytes, bytes)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", _security(pki, OWNERS[1]).server_credentials())
    await server.start()
    return server, f"127.0.0.1:{port}"


def _ask_info(pki: Path, answer: owner_pb2.GetOwnerInfoResponse, **kwargs) -> BaseException:
    """The curator's GetOwnerInfo to the fake owner-1: what it raised."""

    async def run() -> BaseException:
        server, address = await _fake_owner(pki, answer)
        endpoint = GrpcOwnerEndpoint(
            address, _security(pki, CURATOR), OWNERS[1], deadline=10.0, **kwargs
        )
        try:
            with pytest.raises(DPMarketError) as info:
                await endpoint.info()
            return info.value
        finally:
            await endpoint.close()
            await server.stop(None)

    return asyncio.run(run())


def _consumer_text(error: BaseException) -> str:
    """What a consumer reads of the failure (a session's relayed error)."""
    assert isinstance(error, DPMarketError)
    return str(public_error("owner-1", error))


def test_an_oversized_owner_answer_is_refused_and_not_relayed(pki: Path) -> None:
    """An owner answering GetOwnerInfo with a 2 MiB owner id, above the method's limit (a
    schema of 1,000 columns: 1.04 MiB): refused unread at the curator, naming the owner by its
    configured name; nothing of the reply reaches the consumer. Control: with GetOwnerInfo's
    limit raised to the channel's (a schema of 2^16 columns) and the former limit of every
    client channel (256 MiB) the curator receives it whole, and only the id's check (a name)
    refuses it, again without its text."""
    answer = owner_pb2.GetOwnerInfoResponse(owner_id=_REPLY_MARK * (1 << 20), num_points=5)
    refused = _ask_info(pki, answer)
    assert isinstance(refused, ReplyTooLargeError)
    assert str(refused).startswith("owner owner-1: ")
    assert _REPLY_MARK * 4 not in str(refused) + _consumer_text(refused)

    accepted = _ask_info(pki, answer, response_bytes=MAX_MESSAGE_BYTES, schema_columns=1 << 16)
    assert isinstance(accepted, FailedPreconditionError)  # received whole, refused by its id
    assert "owner owner-1 answered GetOwnerInfo with an owner id that is not a name" in str(
        accepted
    )
    assert "2097152" not in str(accepted)  # nor its length, which the owner chose
    assert _REPLY_MARK * 4 not in str(accepted) + _consumer_text(accepted)
    assert OWNER_RESPONSE_BYTES < MAX_MESSAGE_BYTES


def test_an_owner_id_other_than_its_certificate_s_or_a_bad_schema_is_refused(pki: Path) -> None:
    """The id an owner answers is the name the curator knows it by (its certificate's); a
    schema it publishes malformed is refused naming the owner, without the owner's strings."""
    other = _ask_info(pki, owner_pb2.GetOwnerInfoResponse(owner_id="owner-0", num_points=5))
    assert isinstance(other, FailedPreconditionError)
    assert "owner owner-1 answered GetOwnerInfo with an owner id other than" in str(other)
    assert "owner-0" not in str(other)

    column = schema_pb2.SchemaColumn(name=_REPLY_MARK * 1000)  # no type: malformed
    bad = owner_pb2.GetOwnerInfoResponse(
        owner_id="owner-1", num_points=5, schema=schema_pb2.DatasetSchema(columns=[column])
    )
    malformed = _ask_info(pki, bad)
    assert isinstance(malformed, InvalidArgumentError)
    assert "the schema owner owner-1 published (GetOwnerInfo) is malformed" in str(malformed)
    assert _REPLY_MARK * 4 not in str(malformed) + _consumer_text(malformed)
