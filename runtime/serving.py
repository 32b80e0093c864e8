"""Server plumbing shared by the curator and owner services.

Every service registers ``grpc.health.v1`` and reflection, sets explicit message size limits for
array payloads and stops gracefully on SIGTERM (CONVENTIONS.md, tooling).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from runtime.transport import BindError, TransportSecurity, add_port

logger = logging.getLogger(__name__)

#: Largest message accepted or sent, in bytes (array payloads).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
#: Options of every server the project starts (:func:`start_server`): :data:`GRPC_OPTIONS` and an
#: exclusive port. gRPC sets ``SO_REUSEPORT`` by default, so a second process (a duplicate
#: ``serve-owner``, or anything local) could bind a port already served and receive a share of
#: its connections; with it off, a second server on a bound port fails to start.
SERVER_OPTIONS = [*GRPC_OPTIONS, ("grpc.so_reuseport", 0)]


def check_address_free(address: str) -> None:
    """Raise :class:`~runtime.transport.BindError` if another socket listens on ``address``.

    A plain socket (``SO_REUSEADDR`` on, as gRPC sets it, so a port in ``TIME_WAIT`` after a
    restart is free; ``SO_REUSEPORT`` off) tries the address first, so that a port in use is
    refused with one clear line naming it, before gRPC logs its own. Port 0, a name that does not
    resolve or any other bind error is left to gRPC, whose bind decides either way.

    Parameters
    ----------
    address : str
        ``host:port``, ``[v6]:port`` or ``:port``.
    """
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise BindError(
                        f"cannot serve on {address}: the address is in use (is another server "
                        f"running on port {port}?)"
                    ) from None


class HealthStatus(Protocol):
    """The part of grpc's asyncio health servicer (``grpc_health.v1.health.aio.HealthServicer``)
    the services use: setting a service's serving status. grpc-stubs describes only the
    synchronous servicer."""

    async def set(
        self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType
    ) -> None:
        """Report ``service`` (``""``: the whole server) as ``status``."""


async def start_server(
    servicer_adder: Callable[[grpc.aio.Server], None],
    service_names: str | Sequence[str],
    address: str,
    security: TransportSecurity,
) -> tuple[grpc.aio.Server, int, HealthStatus]:
    """Start a grpc.aio server with health checking and reflection; return it and its port.

    ``servicer_adder`` registers the servicers of ``service_names`` (full names, e.g.
    ``dpmarket.v1.OwnerService``); each is reported SERVING by the health service.

    ``address`` may end in ``:0`` to let the OS choose a free port (tests). The port is mTLS
    (client certificates required) unless ``security`` is plaintext (``--insecure``, logged as
    a warning by :func:`runtime.transport.add_port`). Health and reflection share the port, so
    only holders of a certificate of the deployment's CA reach them; reflection describes the
    API, which every caller's authorization already constrains per RPC.

    The port is exclusive (:data:`SERVER_OPTIONS`): a second server on a bound port fails here.

    Raises
    ------
    BindError
        If the address cannot be bound, e.g. another server holds the port (the message names
        the address).
    """
    names = (service_names,) if isinstance(service_names, str) else tuple(service_names)
    check_address_free(address)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    servicer_adder(server)
    # health.aio exists at run time; grpc-stubs' health module lacks it (an untyped value here).
    health_servicer: HealthStatus = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = add_port(server, address, security)
    await server.start()
    for name in names:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


async def serve_until_signalled(server: grpc.aio.Server, grace_seconds: float = 5.0) -> None:
    """Wait for the server to end; on SIGTERM or SIGINT stop it gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        logger.info("signal received: stopping within %.0f s", grace_seconds)
        await server.stop(grace_seconds)
    waiter.cancel()
    stopper.cancel()


def write_port(path: str, port: int) -> None:
    """Write the port atomically so a launcher never reads a partial file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{port}\n")
    os.replace(tmp, path)
