"""Owners for the curator's tests of what a hostile owner can do: real owner services and a
hostile server proving a real owner certificate, over real gRPC with mTLS in this process.

Shared by tests/curator/test_reply_limits.py and tests/curator/test_owner_errors.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.protocol import Owner
from dpmarket.owner.service import OwnerServicer, owner_authorizer
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

CURATOR = Identity("curator", "curator")
OWNERS = [Identity("owner", f"owner-{i}") for i in range(3)]
#: The owner whose certificate the hostile server proves.
HOSTILE = OWNERS[2]
SERVICE = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name

#: How a hostile server answers one method: raw request bytes and the call's context in, raw
#: reply bytes out (or the call aborted).
Handler = Callable[[bytes, Any], Awaitable[bytes]]


def make_pki(root: Path) -> Path:
    """A CA under ``root`` with certificates for :data:`CURATOR` and :data:`OWNERS`."""
    init_ca(root)
    issue_all(root, [CURATOR, *OWNERS])
    return root


def security(pki: Path, identity: Identity) -> TransportSecurity:
    """``identity``'s mTLS credentials from ``pki``."""
    return TransportSecurity.from_files(*identity_files(pki, identity))


async def real_owner(
    pki: Path, identity: Identity, points: int, features: int
) -> tuple[grpc.aio.Server, str]:
    """A real owner service of ``points`` uniform points of ``features`` features; returns the
    started server and its address."""
    data = PointSet(np.random.default_rng(0).random((points, features)), None, identity.name)
    credentials = security(pki, identity)
    servicer = OwnerServicer(
        Owner(identity.name, data), owner_authorizer(("curator",), credentials)
    )

    def register(server: grpc.aio.Server) -> None:
        owner_pb2_grpc.add_OwnerServiceServicer_to_server(servicer, server)

    server, port, _ = await start_server(register, SERVICE, "127.0.0.1:0", credentials)
    return server, f"127.0.0.1:{port}"


async def hostile_owner(
    pki: Path, handlers: dict[str, Handler], *, max_send_bytes: int | None = None
) -> tuple[grpc.aio.Server, str]:
    """A generic server proving :data:`HOSTILE`'s certificate that answers each method of
    ``handlers`` (method name -> :data:`Handler`) as it says; ``max_send_bytes`` raises gRPC's
    send limit for replies larger than its default."""
    options = [] if max_send_bytes is None else [("grpc.max_send_message_length", max_send_bytes)]
    server = grpc.aio.server(options=options)
    generic = grpc.method_handlers_generic_handler(
        SERVICE,
        {m: grpc.unary_unary_rpc_method_handler(h, bytes, bytes) for m, h in handlers.items()},
    )
    server.add_generic_rpc_handlers((generic,))
    port = server.add_secure_port("127.0.0.1:0", security(pki, HOSTILE).server_credentials())
    await server.start()
    return server, f"127.0.0.1:{port}"
