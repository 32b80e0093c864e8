"""Server plumbing shared by the curator and owner services.

Every service registers ``grpc.health.v1`` and reflection, sets explicit message size limits for
array payloads (each RPC its own receive limit, checked with the caller's role before a request is
read: :mod:`dpmarket.runtime.admission`) and stops gracefully on SIGTERM (CONVENTIONS.md, tooling).
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

from dpmarket.runtime import framing
from dpmarket.runtime.admission import Admission
from dpmarket.runtime.authz import Authorizer
from dpmarket.runtime.metrics import ServiceMetrics, installed_metrics
from dpmarket.runtime.transport import BindError, TransportSecurity, add_port

logger = logging.getLogger(__name__)

#: Largest message a client channel accepts, and a client or a server sends, in bytes (array
#: payloads). A server receives messages of at most
#: :data:`~dpmarket.runtime.framing.FRAME_BYTES`, a larger request in pieces, each RPC held to
#: its own limit (:func:`start_server`).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
#: Seconds between a client channel's keepalive PINGs, also while no call is in flight.
#: Channels live as long as their service (the curator's to its owners, across sessions), and
#: a NAT or firewall between hosts drops a connection it sees idle for longer than its timeout
#: (60 s and more, commonly minutes) without telling either end; a PING every 30 s keeps the
#: mapping alive, and one unanswered for :data:`KEEPALIVE_TIMEOUT_SECONDS` closes the
#: connection at once, so the next call reconnects instead of waiting for its deadline.
KEEPALIVE_SECONDS = 30.0
KEEPALIVE_TIMEOUT_SECONDS = 10.0


def keepalive_client_options(seconds: float = KEEPALIVE_SECONDS) -> list[tuple[str, int]]:
    """gRPC channel arguments for a PING every ``seconds`` (also without calls), each answered
    within :data:`KEEPALIVE_TIMEOUT_SECONDS` (or ``seconds``, if smaller)."""
    return [
        ("grpc.keepalive_time_ms", round(seconds * 1000)),
        ("grpc.keepalive_timeout_ms", round(min(KEEPALIVE_TIMEOUT_SECONDS, seconds) * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def keepalive_server_options(seconds: float = KEEPALIVE_SECONDS) -> list[tuple[str, int]]:
    """gRPC server arguments that accept a client's PING every ``seconds`` without calls.

    A gRPC server otherwise takes PINGs more often than every 5 minutes on an idle connection as
    abuse and closes it (GOAWAY "too_many_pings"); this admits them down to two thirds of
    ``seconds``."""
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", round(seconds * 1000 * 2 / 3)),
    ]


#: Options of every client channel to another service: :data:`GRPC_OPTIONS` and the keepalive.
CHANNEL_OPTIONS = [*GRPC_OPTIONS, *keepalive_client_options()]
#: HTTP/2 window, bytes, a server grants each stream (and, about, each connection) before its
#: request is read: what a call refused before its request is read (the admission:
#: :mod:`dpmarket.runtime.admission`) can make the server buffer of it. gRPC's bandwidth-delay
#: probing, on by default, grows the window to several MiB on a fast link, so that a refused
#: stream's window, not its request, made a service hold hundreds of MiB: 1,000 refused 4 MB
#: calls over 100 connections raised an owner by 0.45-1.3 GiB with it; with the probing off
#: and this window, by 17-28 MiB. A request the server reads grows its own stream's window to
#: its length as it is read (a 20 MB request over a 50 ms round trip then takes about 1.7 s
#: instead of 0.3 s; ``bench/README.md``).
STREAM_WINDOW_BYTES = 64 << 10
#: Connections a server accepts at once; the next is closed before its TLS handshake (the
#: client sees ``UNAVAILABLE``). Each held about 90 KiB under a flood of refused calls, so the
#: connections of parties refused everything cost at most about ``MAX_CONNECTIONS`` x 128 KiB
#: (docs/reference.md, "Message limits"). An owner's callers are its curator(s) and its CAPE
#: peers; the curator's, its owners' publications and the consumers.
MAX_CONNECTIONS = 256
#: Calls a server has in progress at once, all services and callers together, refused ones
#: included until their status is sent; gRPC answers the next ``RESOURCE_EXHAUSTED`` before
#: any handler or interceptor runs (``maximum_concurrent_rpcs``). Each call in progress holds
#: its state (gRPC's, the admission's task) whatever its request: 5,000 refused 1 MB calls at
#: once over 50 connections raised an owner by 36-78 MiB without it. Above what the services
#: admit at once (64 per service, 4 for health and reflection), so it binds only a flood.
MAX_CALLS_IN_PROGRESS = 1024
#: What bounds the transport's memory whoever calls: no bandwidth-delay probing, a fixed window
#: per stream, connections (the constants above). Streams per connection are left unbounded:
#: a connection's refused streams share its window (one connection with 500 refused 4 MB calls
#: at once: measured below), and a bound would queue an honest client's calls behind its
#: long-lived streams.
TRANSPORT_BOUND_OPTIONS = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
    ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
]
#: Options of every server the project starts (:func:`start_server`, which lowers the receive
#: limit to :data:`~dpmarket.runtime.framing.FRAME_BYTES`): :data:`GRPC_OPTIONS`, the transport's
#: bounds
#: (:data:`TRANSPORT_BOUND_OPTIONS`) and an exclusive port. gRPC sets ``SO_REUSEPORT`` by
#: default, so a second process (a duplicate ``owner serve``, or anything local) could bind a
#: port already served and receive a share of its connections; with it off, a second server on
#: a bound port fails to start. Clients' keepalive PINGs are admitted
#: (:func:`keepalive_server_options`).
SERVER_OPTIONS = [
    *GRPC_OPTIONS,
    *TRANSPORT_BOUND_OPTIONS,
    ("grpc.so_reuseport", 0),
    *keepalive_server_options(),
]


def check_address_free(address: str) -> None:
    """Raise :class:`~dpmarket.runtime.transport.BindError` if another socket listens on
    ``address``.

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
    *,
    metrics: ServiceMetrics | None = None,
    served: Sequence[Authorizer] | None = None,
) -> tuple[grpc.aio.Server, int, HealthStatus]:
    """Start a grpc.aio server with health checking and reflection; return it and its port.

    ``servicer_adder`` registers the servicers of ``service_names`` (full names, e.g.
    ``dpmarket.v1.OwnerService``); each is reported SERVING by the health service.

    Every call is admitted before its request is read
    (:class:`dpmarket.runtime.admission.Admission`): the caller's role, its service's calls at once,
    its RPC's receive limit. The server receives no message above
    :data:`~dpmarket.runtime.framing.FRAME_BYTES` (gRPC refuses a larger one from its declared
    length, before buffering it); a larger unary request comes in pieces, their total held to its
    RPC's own limit as they are read (:mod:`dpmarket.runtime.framing`).

    ``address`` may end in ``:0`` to let the OS choose a free port (tests). The port is mTLS (client
    certificates required) unless ``security`` is plaintext (``--insecure``, logged as a warning by
    :func:`dpmarket.runtime.transport.add_port`). Health and reflection share the port, so only
    holders of a certificate of the deployment's CA reach them; reflection describes the API, which
    every caller's authorization already constrains per RPC.

    The port is exclusive (:data:`SERVER_OPTIONS`): a second server on a bound port fails here.
    Every call is counted, by its status and time, into ``metrics`` (default: the process's, when
    it serves them: :func:`dpmarket.runtime.metrics.enable_metrics`; none otherwise).
    ``served``, the authorizers of the servicers ``servicer_adder`` registers, gives each role
    they serve its own health and reflection calls at once, and every other identity its own
    (:meth:`~dpmarket.runtime.admission.Admission.open_class`), so that no class of callers'
    probes fills another's; without it each role has its own.

    Raises
    ------
    BindError
        If the address cannot be bound, e.g. another server holds the port (the message names
        the address).
    """
    names = (service_names,) if isinstance(service_names, str) else tuple(service_names)
    check_address_free(address)
    frame = framing.FRAME_BYTES
    options = [
        *((k, v) for k, v in SERVER_OPTIONS if k != "grpc.max_receive_message_length"),
        ("grpc.max_receive_message_length", frame),
    ]
    admission = Admission(frame, insecure=security.insecure, served=served, own=security.identity)
    interceptors: list[grpc.aio.ServerInterceptor] = [admission]
    metrics = metrics if metrics is not None else installed_metrics()
    if metrics is not None:  # counted first, so that admission's refusals are counted too
        interceptors.insert(0, metrics.interceptor(str(security.identity or "insecure")))
    server = grpc.aio.server(
        options=options,
        interceptors=interceptors,
        maximum_concurrent_rpcs=MAX_CALLS_IN_PROGRESS,
    )
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
    await serve_all_until_signalled([server], grace_seconds)


async def serve_all_until_signalled(
    servers: Sequence[grpc.aio.Server], grace_seconds: float = 5.0
) -> None:
    """Wait until every server has ended; on SIGTERM or SIGINT stop them all gracefully.

    Several servers of one process (each its own port and identity: a launcher's group of
    owners) share the process's signal handlers, which this installs once.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(_all_terminated(servers))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        logger.info("signal received: stopping within %.0f s", grace_seconds)
        await asyncio.gather(*(server.stop(grace_seconds) for server in servers))
    waiter.cancel()
    stopper.cancel()


async def _all_terminated(servers: Sequence[grpc.aio.Server]) -> None:
    await asyncio.gather(*(server.wait_for_termination() for server in servers))


def write_port(path: str, port: int) -> None:
    """Write the port atomically so a launcher never reads a partial file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{port}\n")
    os.replace(tmp, path)
