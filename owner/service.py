"""gRPC servicer of a data owner: authorizes, converts, calls
:class:`dpmarket.owner.protocol.Owner`.

Every RPC is open to the ``curator`` role only, and only to the curator names the owner's policy
lists (:class:`dpmarket.runtime.authz.Authorizer`); a session belongs to the curator identity that
opened it. Steps that compute or charge (features, bids, counts, releases) run in worker threads so
the event loop keeps answering health checks and other sessions; only a bid that reads no more than
a few milliseconds' worth of features held in memory and writes nothing runs on the loop
(:meth:`dpmarket.owner.protocol.Owner.quick_bid`), sparing every round two thread switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.ids import short_id
from dpmarket.common.privacy.accounting import load_pld_library
from dpmarket.common.summarization.terms import Step
from dpmarket.owner import convert
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.cape_service import CapeSiteServicer, SecureAggregationServicer
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.metrics import OwnerCollector
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.admission import (
    DEFAULT_CONCURRENT_CALLS,
    SMALL_REQUEST_BYTES,
    VALUE_BYTES,
    ServiceLimits,
)
from dpmarket.runtime.allocator import release_free_memory
from dpmarket.runtime.authz import Authorizer, rpc, rpc_stream
from dpmarket.runtime.identity import Identity, peer_public_key
from dpmarket.runtime.metrics import register_all
from dpmarket.runtime.serving import serve_until_signalled, start_server, write_port
from dpmarket.runtime.terms import terms_from_proto
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    owner_pb2,
    owner_pb2_grpc,
    secure_aggregation_pb2,
    secure_aggregation_pb2_grpc,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


def owner_limits(owner: Owner) -> ServiceLimits:
    """OwnerService's receive limits and calls at once, from the owner's public sizes and policy.

    With ``d`` the largest h1 dimension the owner serves (its policy's
    ``limits.max_rff_dimension``) and ``n`` its features per point, in float64 values, each
    beside :data:`~dpmarket.runtime.admission.SMALL_REQUEST_BYTES` for the ids, terms and scalars:

    * ``OpenSession``: h1's ``omega`` (``d x n``), ``phase`` (``d``) and feature scaling
      (``2 n``);
    * ``SetValidationEmbedding``: the validation and prior embeddings (``d`` each);
    * ``Bid`` and each ``RunRounds`` message: the summary's embedding (``d``);
    * every other RPC: ids and scalars only.

    Calls at once, per caller: four per session the owner keeps open (a step, its
    ``RunRounds`` stream, a progress poll, a close), at least
    :data:`~dpmarket.runtime.admission.DEFAULT_CONCURRENT_CALLS`; in all, twice that. The
    service's only callers are the curators the policy names, and one curator runs, against one
    owner, four calls per session it runs (at most its ``max_running`` and the owner's
    ``max_sessions``) beside the owner descriptions (``GetOwnerInfo``) its consumers' requests
    ask for, one per request in progress: a curator keeps every call it could make before
    callers had a share of their own (64 at the defaults), and one curator alone still never
    fills the service.

    Parameters
    ----------
    owner : Owner
        Its ``max_rff_dimension`` (None: the policy's default) and ``max_sessions``.

    Returns
    -------
    ServiceLimits
    """
    d = owner.max_rff_dimension or OwnerPolicy.max_rff_dimension
    n = owner.info().num_features
    embedding = SMALL_REQUEST_BYTES + VALUE_BYTES * d
    calls = DEFAULT_CONCURRENT_CALLS
    if owner.max_sessions is not None:
        calls = max(calls, 4 * owner.max_sessions)
    return ServiceLimits(
        {
            "OpenSession": SMALL_REQUEST_BYTES + VALUE_BYTES * (d * (n + 1) + 2 * n),
            "SetValidationEmbedding": SMALL_REQUEST_BYTES + 2 * VALUE_BYTES * d,
            "Bid": embedding,
            "RunRounds": embedding,
        },
        concurrent_calls=2 * calls,
        calls_per_caller=calls,
    )


class OwnerServicer(owner_pb2_grpc.OwnerServiceServicer):
    """Thin adapter: every method authorizes, converts, calls the owner, converts back.

    A step that computes runs in a worker thread; when its caller goes away (it cancelled the
    call, or its deadline passed), the session's work is cancelled at once
    (:meth:`dpmarket.owner.protocol.Owner.cancel`), so nothing is left computing for nobody.
    """

    def __init__(self, owner: Owner, authorizer: Authorizer) -> None:
        self.owner = owner
        self.authorizer = authorizer

    @functools.cached_property
    def limits(self) -> ServiceLimits:
        """This service's receive limits and calls at once (:func:`owner_limits`), read by
        :class:`dpmarket.runtime.admission.Admission` when the service is first called."""
        return owner_limits(self.owner)

    async def _run(
        self, session_id: str, caller: Identity, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """Run ``fn`` in a worker thread; if the caller goes away, cancel ``caller``'s session
        ``session_id`` (only its own: another curator's session of that id runs on)."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except asyncio.CancelledError:
            self.owner.cancel(session_id, str(caller))
            logger.info("session %s: its caller left; its work is cancelled", short_id(session_id))
            raise

    @rpc("curator")
    async def GetOwnerInfo(self, request, context, caller):
        return convert.info_to_proto(self.owner.info())

    @rpc("curator")
    async def OpenSession(self, request, context, caller):
        rff = convert.rff_from_proto(
            request.omega,
            request.phase,
            request.gamma,
            request.scaling if request.HasField("scaling") else None,
        )
        terms = terms_from_proto(request.terms)
        if Step.HASHES in terms.steps:
            raise FailedPreconditionError(
                f"method {terms.method.value} runs in process only: no RPC of this service "
                "carries the hashes mode's key agreement"
            )
        consumer = convert.consumer_from_proto(request.consumer)
        ledger = self.owner.ledger
        if ledger is not None:  # a ledger behind a receipt its owner signed refuses the open
            presented = convert.presented_receipt(request)
            await asyncio.to_thread(
                ledger.check_receipt,
                presented,
                curator=str(caller),
                certificate=request.receipt_certificate or None,
            )
        num_points, max_points = await self._run(
            request.session_id,
            caller,
            self.owner.open_session,
            request.session_id,
            rff,
            int(request.sampling_seed),
            terms=terms,
            curator=str(caller),
            consumer=consumer,
        )
        logger.info(
            "session %s opened by %s for %s: d=%d, method %s (epsilon=%g, delta=%g, "
            "at most %d rounds), at most %d points",
            short_id(request.session_id),
            caller,
            consumer,
            rff.d,
            terms.method.value,
            terms.epsilon,
            terms.delta,
            terms.max_rounds,
            max_points,
        )
        return owner_pb2.OpenSessionResponse(num_points=num_points, max_points=max_points)

    @rpc("curator")
    async def SetValidationEmbedding(self, request, context, caller):
        embedding = convert.vector_from_proto(request.validation_embedding, "validation_embedding")
        prior = (
            convert.vector_from_proto(request.prior_embedding, "prior_embedding")
            if request.HasField("prior_embedding")
            else None
        )
        self.owner.set_validation_embedding(
            request.session_id,
            embedding,
            str(caller),
            shrinkage_sigma=request.shrinkage_sigma,
            prior_embedding=prior,
            score_metric=request.score_metric,
        )
        return owner_pb2.SetValidationEmbeddingResponse()

    @rpc("curator")
    async def Bid(self, request, context, caller):
        return await self._bid(request, caller)

    @rpc("curator")
    async def ReleasePoint(self, request, context, caller):
        return await self._release_point(request, caller)

    @rpc_stream("curator")
    async def RunRounds(self, request_iterator, context, caller):
        async for request in request_iterator:
            step = request.WhichOneof("step")
            if step == "bid":
                yield owner_pb2.RunRoundsResponse(bid=await self._bid(request.bid, caller))
            elif step == "release_point":
                released = await self._release_point(request.release_point, caller)
                yield owner_pb2.RunRoundsResponse(release_point=released)
            else:
                raise InvalidArgumentError("a RunRoundsRequest must hold a bid or a release_point")

    async def _bid(self, request: owner_pb2.BidRequest, caller: Identity) -> owner_pb2.BidResponse:
        """One Bid step (the unary RPC's and RunRounds'): on the event loop when the owner says
        it is quick (:meth:`dpmarket.owner.protocol.Owner.quick_bid`: a millisecond product over
        features in memory), in a worker thread otherwise."""
        embedding = convert.vector_from_proto(request.summary_embedding, "summary_embedding")
        args = (
            request.session_id,
            int(request.round),
            embedding,
            int(request.summary_size),
            str(caller),
        )
        if self.owner.quick_bid(request.session_id, str(caller)):
            bid = self.owner.bid(*args)
        else:
            bid = await self._run(request.session_id, caller, self.owner.bid, *args)
        return convert.bid_to_proto(bid)

    async def _release_point(
        self, request: owner_pb2.ReleasePointRequest, caller: Identity
    ) -> owner_pb2.ReleasePointResponse:
        """One ReleasePoint step (the unary RPC's and RunRounds')."""
        released = await asyncio.to_thread(
            self.owner.release_point, request.session_id, int(request.round), str(caller)
        )
        logger.debug(
            "session %s round %d: point released", short_id(request.session_id), request.round
        )
        return convert.released_to_proto(released)

    @rpc("curator")
    async def SampleUniform(self, request, context, caller):
        points, labels = await self._run(
            request.session_id,
            caller,
            self.owner.sample_uniform,
            request.session_id,
            int(request.count),
            str(caller),
        )
        logger.info(
            "session %s: %d uniform points released", short_id(request.session_id), len(points)
        )
        return convert.points_to_proto(points, labels, owner_pb2.SampleUniformResponse)

    @rpc("curator")
    async def CountRelevant(self, request, context, caller):
        noisy = await self._run(
            request.session_id,
            caller,
            self.owner.noisy_relevant_count,
            request.session_id,
            float(request.threshold),
            str(caller),
        )
        return owner_pb2.CountRelevantResponse(noisy_count=noisy)

    @rpc("curator")
    async def ProposeCandidates(self, request, context, caller):
        points, labels = await self._run(
            request.session_id,
            caller,
            self.owner.propose_candidates,
            request.session_id,
            int(request.count),
            str(caller),
            uniform_count=int(request.uniform_count),
        )
        logger.info("session %s: %d candidates released", short_id(request.session_id), len(points))
        return convert.points_to_proto(points, labels, owner_pb2.ProposeCandidatesResponse)

    @rpc("curator")
    async def CloseSession(self, request, context, caller):
        spent = await asyncio.to_thread(self.owner.close_session, request.session_id, str(caller))
        # A session's arrays (its points' features: n x D floats) were allocated in its steps'
        # threads; glibc keeps what they free in those threads' arenas (eight closed sessions
        # of D = 4,096 over 354 points left an owner 48 MiB up, 7 MiB with this).
        await asyncio.to_thread(release_free_memory)
        ledger = self.owner.ledger
        receipt = None if ledger is None else await asyncio.to_thread(ledger.close_receipt)
        logger.info(
            "session %s closed: spent epsilon=%g, delta=%g, %d points",
            short_id(request.session_id),
            spent.epsilon,
            spent.delta,
            spent.points,
        )
        return owner_pb2.CloseSessionResponse(
            spent=convert.spend_to_proto(spent),
            receipt=receipt,
            receipt_certificate=(ledger.certificate if ledger and receipt else None) or b"",
        )

    @rpc("curator")
    async def RecordStatement(self, request, context, caller):
        ledger = self.owner.ledger
        if ledger is None:
            raise FailedPreconditionError("this owner keeps no ledger: it records no earnings")
        earnings = Earnings(ledger, self.owner.owner_id)
        earning, added = await asyncio.to_thread(
            earnings.record,
            bytes(request.statement.statement),
            bytes(request.statement.signature),
            curator=str(caller),
            curator_key=peer_public_key(context),
        )
        logger.info(
            "session %s: statement %s from %s %s: %d micro-credits",
            short_id(earning.session),
            earning.id[:12],
            caller,
            "recorded" if added else "already recorded",
            earning.total,
        )
        return owner_pb2.RecordStatementResponse(
            statement_id=earning.id, recorded_now=added, total=earning.total
        )

    @rpc("curator")
    async def GetProgress(self, request, context, caller):
        stage, done, total, ticks = self.owner.progress(request.session_id, str(caller))
        return owner_pb2.GetProgressResponse(stage=stage, done=done, total=total, ticks=ticks)


def site_rounds(cape: CapeSite) -> SiteRounds:
    """The secure-aggregation rounds of an owner's CAPE jobs: signed with the CAPE site's
    identity, its noise draws as inputs, each round admitted by its job's plan and held to the
    owner's floor on colluders."""
    return SiteRounds(
        cape.identity,
        cape.noise_input,
        cape.rng_for,
        cape.round_finished,
        min_colluders=cape.min_colluders,
        admit=cape.check_round,
    )


def site_identity(
    name: str, security: TransportSecurity, peers: Mapping[str, str]
) -> SiteIdentity | None:
    """The owner's signing identity for secure aggregation: its mTLS key and certificate, the
    CA, and its roster (``peers``: its policy's ``[peers]``, name -> public-key pin); ``None``
    with plaintext transport (no certificate to sign with).

    Raises
    ------
    ValueError
        If the roster pins another key for this owner's own name than its certificate's.
    """
    if security.insecure or security.key_pem is None or security.cert_pem is None:
        return None
    assert security.ca_pem is not None
    return SiteIdentity.from_pem(
        name, security.key_pem, security.cert_pem, security.ca_pem, peers=peers
    )


async def _expire_idle_sessions(owner: Owner, period: float, cape: CapeSite | None) -> None:
    """Close sessions and jobs the curator has not touched for the idle timeout, forever."""
    while True:
        await asyncio.sleep(period)
        for job_id in cape.expire_idle() if cape is not None else []:
            logger.info("CAPE job %s expired", short_id(job_id))
        expired = owner.expire_idle()
        for session_id in expired:
            logger.info(
                "session %s expired: idle for %g s", short_id(session_id), owner.idle_timeout
            )
        if expired:
            await asyncio.to_thread(release_free_memory)  # as CloseSession does


def owner_authorizer(curators: tuple[str, ...], security: TransportSecurity) -> Authorizer:
    """The owner's authorization: only the named curators; with plaintext transport, every
    caller is taken to be the first of them (``--insecure`` only)."""
    insecure_peer = Identity("curator", curators[0]) if security.insecure else None
    return Authorizer({"curator": curators}, insecure_peer=insecure_peer)


@dataclass
class RunningOwner:
    """An owner's started gRPC server (:func:`start_owner`) and its idle-session reaper.

    Attributes
    ----------
    server : grpc.aio.Server
    port : int
        The bound port.
    reaper : asyncio.Task or None
        Expires idle sessions and jobs (``None`` without an idle timeout).
    """

    server: grpc.aio.Server
    port: int
    reaper: asyncio.Task[None] | None

    async def close(self) -> None:
        """Stop the reaper (the server is stopped by whoever serves it)."""
        if self.reaper is not None:
            self.reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reaper


async def start_owner(
    owner: Owner,
    address: str,
    security: TransportSecurity,
    *,
    curators: tuple[str, ...],
    cape: CapeSite | None = None,
    port_file: str | None = None,
) -> RunningOwner:
    """Start serving ``owner`` on ``address`` and return at once (:func:`serve_owner` also waits
    for a signal). Parameters as :func:`serve_owner`.

    Raises
    ------
    dpmarket.runtime.serving.BindError
        If the address cannot be bound.
    """
    authorizer = owner_authorizer(curators, security)
    names = [owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name]
    rounds: SiteRounds | None = None
    if cape is not None:
        rounds = site_rounds(cape)
        names += [
            cape_pb2.DESCRIPTOR.services_by_name["CapeSiteService"].full_name,
            secure_aggregation_pb2.DESCRIPTOR.services_by_name[
                "SecureAggregationService"
            ].full_name,
        ]

    servicer = OwnerServicer(owner, authorizer)
    site = None if cape is None or rounds is None else CapeSiteServicer(cape, rounds, authorizer)
    aggregation = (
        None
        if cape is None or rounds is None
        else SecureAggregationServicer(rounds, cape, authorizer)
    )

    def register(server: grpc.aio.Server) -> None:
        owner_pb2_grpc.add_OwnerServiceServicer_to_server(servicer, server)
        if site is not None and aggregation is not None:
            cape_pb2_grpc.add_CapeSiteServiceServicer_to_server(site, server)
            secure_aggregation_pb2_grpc.add_SecureAggregationServiceServicer_to_server(
                aggregation, server
            )

    server, port, _ = await start_server(register, names, address, security, served=[authorizer])
    logger.info(
        "owner %s serving on port %d for curator(s) %s", owner.owner_id, port, ", ".join(curators)
    )
    if port_file:
        write_port(port_file, port)
    if cape is not None:  # a CAPE open computes its cost by PLD under the curator's deadline
        threading.Thread(target=load_pld_library, name="pld-import", daemon=True).start()
    reaper = None
    if owner.idle_timeout is not None:
        period = max(0.05, min(owner.idle_timeout / 4, 30.0))
        reaper = asyncio.create_task(_expire_idle_sessions(owner, period, cape))
    return RunningOwner(server, port, reaper)


async def serve_owner(
    owner: Owner,
    address: str,
    security: TransportSecurity,
    *,
    curators: tuple[str, ...],
    cape: CapeSite | None = None,
    port_file: str | None = None,
) -> None:
    """Serve ``owner`` on ``address`` until SIGTERM/SIGINT; write the bound port to a file.

    Serves the summarization protocol (``OwnerService``) and, with ``cape``, CAPE jobs
    (``CapeSiteService``) and their secure aggregation (``SecureAggregationService``).

    Parameters
    ----------
    owner : Owner
        With its ledger, limits and idle timeout set.
    cape : CapeSite, optional
        The owner's CAPE jobs over its table (same ledger), with its signing identity
        (:func:`site_identity`) and its policy's floor on colluders.
    address : str
        ``host:port``; port 0 picks a free port.
    security : TransportSecurity
        mTLS credentials, or plaintext (``--insecure``).
    curators : tuple of str
        Names of the curator certificates this owner serves (its policy's ``curators``).
    port_file : str, optional
        Where to write the bound port.
    """
    running = await start_owner(
        owner, address, security, curators=curators, cape=cape, port_file=port_file
    )
    register_all([OwnerCollector(owner)])
    try:
        await serve_until_signalled(running.server)
    finally:
        await running.close()
