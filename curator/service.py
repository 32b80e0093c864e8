"""gRPC servicer of the curator: authorizes consumers, converts messages, calls a SessionManager.

Every RPC is open to the ``consumer`` role only (the names the policy lists, or any consumer the
CA certified); the caller's identity, never a message field, decides whose sessions it sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from grpc_health.v1 import health_pb2

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.statement import PrivateKey
from dpmarket.curator import convert
from dpmarket.curator.cape_service import CapeJobs, CapeServicer
from dpmarket.curator.metrics import CuratorCollector
from dpmarket.curator.owners import OWNER_HEALTH_PREFIX, GrpcOwnerEndpoint
from dpmarket.curator.policy import DEFAULT_RANGES, CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.sketch_service import SketchCatalogServicer, catalog_authorizer
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.curator.store import CuratorStore
from dpmarket.runtime.admission import VALUE_BYTES, ServiceLimits
from dpmarket.runtime.authz import Authorizer, rpc, rpc_stream
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.market import quote_to_proto
from dpmarket.runtime.metrics import register_all
from dpmarket.runtime.serving import HealthStatus, serve_until_signalled, start_server, write_port
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    curator_pb2,
    curator_pb2_grpc,
    sketch_pb2,
    sketch_pb2_grpc,
)

logger = logging.getLogger(__name__)

#: The identity every caller of a plaintext (``--insecure``) curator is taken to have.
INSECURE_CONSUMER = Identity("consumer", "insecure")
#: Bytes of a CreateSession request beside its two arrays: the parameters, the schema and the
#: feature names (about 2,000 columns' worth).
CREATE_SESSION_OVERHEAD_BYTES = 1 << 20


def curator_limits(policy: CuratorPolicy) -> ServiceLimits:
    """CuratorService's receive limits, from the curator's policy.

    ``CreateSession`` carries the validation and seed sets, ``(m + n0) x n`` float64 values of
    which the policy admits at most its ``validation_values`` bound, and
    :data:`CREATE_SESSION_OVERHEAD_BYTES` more; ``WatchSession`` and ``GetSummary`` carry a
    session id (:data:`~dpmarket.runtime.admission.SMALL_REQUEST_BYTES`).
    """
    values = int(policy.ranges.get("validation_values", DEFAULT_RANGES["validation_values"])[1])
    largest = CREATE_SESSION_OVERHEAD_BYTES + VALUE_BYTES * values
    return ServiceLimits({"CreateSession": largest, "QuoteSession": largest})


def request_digest(request: curator_pb2.CreateSessionRequest) -> str:
    """SHA-256 of a CreateSessionRequest without its idempotency key (deterministic bytes)."""
    copy = curator_pb2.CreateSessionRequest()
    copy.CopyFrom(request)
    copy.request_id = ""
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()


class CuratorServicer(curator_pb2_grpc.CuratorServiceServicer):
    """Thin adapter over a :class:`SessionManager`; ``certificate`` is the curator's own (PEM,
    whose key signs its statements: ListStatements hands it to the consumer; empty with
    plaintext transport, where nothing is settled)."""

    def __init__(
        self, manager: SessionManager, authorizer: Authorizer, certificate: bytes = b""
    ) -> None:
        self.manager = manager
        self.authorizer = authorizer
        self.certificate = certificate

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once (:func:`curator_limits`), read by
        :class:`dpmarket.runtime.admission.Admission` when the service is first called."""
        return curator_limits(self.manager.policy)

    @rpc("consumer")
    async def CreateSession(self, request, context, caller):
        session_id = await self.manager.create(
            convert.create_request_from_proto(request),
            consumer=str(caller),
            request_id=request.request_id,
            request_digest=request_digest(request),
        )
        quoted = self.manager.quote_of(session_id, str(caller))
        return curator_pb2.CreateSessionResponse(
            session_id=session_id, quote=None if quoted is None else quote_to_proto(quoted)
        )

    @rpc("consumer")
    async def QuoteSession(self, request, context, caller):
        quoted = await self.manager.quote(
            convert.create_request_from_proto(request.request), consumer=str(caller)
        )
        return curator_pb2.QuoteSessionResponse(quote=quote_to_proto(quoted))

    @rpc_stream("consumer")
    async def WatchSession(self, request, context, caller):
        async for event, report in self.manager.watch(request.session_id, str(caller)):
            yield convert.event_to_proto(event, report)

    @rpc("consumer")
    async def ListStatements(self, request, context, caller):
        if request.limit < 0:
            raise InvalidArgumentError(f"limit must be >= 0 (0: every one), got {request.limit}")
        stored = await asyncio.to_thread(
            self.manager.statements,
            str(caller),
            session_id=request.session_id or None,
            limit=int(request.limit) or None,
        )
        return curator_pb2.ListStatementsResponse(
            statements=[convert.statement_to_proto(s) for s in stored],
            curator_certificate=self.certificate,
        )

    @rpc("consumer")
    async def ListMethods(self, request, context, caller):
        offers = await self.manager.methods()
        return curator_pb2.ListMethodsResponse(
            methods=[convert.method_offer_to_proto(o) for o in offers]
        )

    @rpc("consumer")
    async def GetSummary(self, request, context, caller):
        result = self.manager.result(request.session_id, str(caller))
        return convert.result_to_proto(result)


def signing_key(security: TransportSecurity) -> PrivateKey | None:
    """The curator's certificate key, which signs its settlement statements (None with
    plaintext transport: nothing is settled).

    Raises
    ------
    TypeError
        If the key is neither EC nor Ed25519.
    """
    if security.insecure or security.key_pem is None:
        return None
    key = serialization.load_pem_private_key(security.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise TypeError(f"statements are signed with an EC or Ed25519 key, got {type(key)}")
    return key


def curator_authorizer(policy: CuratorPolicy, security: TransportSecurity) -> Authorizer:
    """Consumers only: the policy's names, or any the CA certified; with plaintext transport,
    every caller is :data:`INSECURE_CONSUMER` (``--insecure`` only)."""
    names = policy.consumers or None
    if security.insecure:
        return Authorizer({"consumer": None}, insecure_peer=INSECURE_CONSUMER)
    return Authorizer({"consumer": names})


async def serve_curator(
    owners: Sequence[GrpcOwnerEndpoint],
    address: str,
    security: TransportSecurity,
    *,
    policy: CuratorPolicy,
    store: CuratorStore | None,
    sketches: SketchCatalog | None = None,
    allocation_spec: str | None = None,
    call_timeout: float | None = None,
    port_file: str | None = None,
) -> None:
    """Serve a curator for ``owners`` on ``address`` until SIGTERM/SIGINT.

    Serves consumers the summarization sessions (``CuratorService``) and CAPE jobs
    (``CapeService``) and, with ``sketches``, the sketch catalogue (``SketchCatalogService``) to
    consumers and to the configured owners.

    Parameters
    ----------
    owners : sequence of GrpcOwnerEndpoint
        The configured owners (gRPC clients that check each owner's certificate identity); each
        serves summarization sessions and CAPE jobs.
    address : str
        ``host:port``; port 0 picks a free port.
    security : TransportSecurity
        mTLS credentials, or plaintext (``--insecure``).
    policy : CuratorPolicy
    store : CuratorStore or None
        Durable sessions and charges (``None``: memory only).
    sketches : SketchCatalog, optional
        The sketch catalogue (same data directory as ``store``); also given to the session
        manager (``manager.sketches``), whose allocation may read the published sketches.
    allocation_spec : str, optional
        The catalogue's RFF spec the candidates method's allocation reads
        (:class:`~dpmarket.curator.sessions.SessionManager`).
    call_timeout : float, optional
        Seconds after which an owner that has not answered a call is dropped.
    port_file : str, optional
        Where to write the bound port.
    """
    manager = SessionManager(
        owners,
        policy=policy,
        store=store,
        call_timeout=call_timeout,
        sketches=sketches,
        allocation_spec=allocation_spec,
        signing_key=signing_key(security),
    )
    authorizer = curator_authorizer(policy, security)
    cape = _cape_jobs(owners, manager, call_timeout)

    sessions = CuratorServicer(manager, authorizer, security.cert_pem or b"")
    jobs = CapeServicer(cape, authorizer)
    catalog = None
    if sketches is not None:
        owner_names = [o.expected.name for o in owners if o.expected is not None]
        catalog = SketchCatalogServicer(
            sketches,
            catalog_authorizer(policy, owner_names, security, INSECURE_CONSUMER),
            allocation_spec,
            receipts=store,
        )

    def register(server: grpc.aio.Server) -> None:
        curator_pb2_grpc.add_CuratorServiceServicer_to_server(sessions, server)
        cape_pb2_grpc.add_CapeServiceServicer_to_server(jobs, server)
        if catalog is not None:
            sketch_pb2_grpc.add_SketchCatalogServiceServicer_to_server(catalog, server)

    names = [
        curator_pb2.DESCRIPTOR.services_by_name["CuratorService"].full_name,
        cape_pb2.DESCRIPTOR.services_by_name["CapeService"].full_name,
    ]
    if sketches is not None:
        names.append(sketch_pb2.DESCRIPTOR.services_by_name["SketchCatalogService"].full_name)
    served = [authorizer] if catalog is None else [authorizer, catalog.authorizer]
    server, port, health_status = await start_server(
        register, names, address, security, served=served
    )
    register_all([CuratorCollector(manager, str(security.identity or "insecure"))])
    # Each owner's channel is kept connected, and its state reported by the health service
    # under OWNER_HEALTH_PREFIX + name (SERVING: connected): `dpmarket up` waits for it.
    monitors = [
        asyncio.create_task(owner.keep_connected(_owner_health(health_status, owner.name)))
        for owner in owners
    ]
    logger.info("curator serving on port %d for %d owner(s)", port, len(owners))
    if port_file:
        write_port(port_file, port)
    period = max(0.05, min(policy.fetched_result_ttl_seconds / 2, 30.0))
    reaper = asyncio.create_task(manager.expire_forever(period))
    # Ask for what a restart interrupted, then retry unfinished settlement (:func:`_settlement`).
    reconcile = asyncio.create_task(_settlement(manager))
    try:
        await serve_until_signalled(server)
    finally:
        for task in (reaper, reconcile, *monitors):
            task.cancel()
        for task in (reaper, reconcile, *monitors):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await manager.close()


def _cape_jobs(
    owners: Sequence[GrpcOwnerEndpoint], manager: SessionManager, call_timeout: float | None
) -> CapeJobs:
    """The CAPE jobs, under the sessions' policy, store, request rate and signing key; their
    statements are delivered (and retried) as the sessions' are."""
    return CapeJobs(
        owners,
        policy=manager.policy,
        store=manager.store,
        rate=manager.rate,
        call_timeout=call_timeout,
        signing_key=manager.signing_key,
        deliver=manager.deliver_statements,
    )


async def _settlement(manager: SessionManager) -> None:
    """Reconcile what a restart interrupted, then retry unfinished settlement until cancelled."""
    await _logged(manager.reconcile(), "asking owners for records")
    await manager.settle_forever()


async def _logged(work: Awaitable[object], what: str) -> None:
    """Run background ``work``; log (never raise) what it fails with."""
    try:
        await work
    except Exception:
        logger.exception("%s failed", what)


def _owner_health(health_status: HealthStatus, owner: str) -> Callable[[bool], Awaitable[None]]:
    """What reports one owner's connection in the curator's health service."""
    service = OWNER_HEALTH_PREFIX + owner

    async def report(connected: bool) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        status = serving if connected else health_pb2.HealthCheckResponse.NOT_SERVING
        await health_status.set(service, status)
        logger.info("owner %s: %s", owner, "connected" if connected else "not connected")

    return report
