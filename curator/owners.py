"""gRPC client of an owner, seen by the curator as a
:class:`dpmarket.common.summarization.endpoints.OwnerEndpoint` and, on the same channel, a
:class:`dpmarket.common.cape.endpoints.CapeSiteEndpoint` (CAPE and secure aggregation): one
client per owner service (:class:`OwnerServiceClient`, :class:`SecureAggregationClient`,
:class:`CapeSiteClient`) on one :class:`OwnerChannel`, joined in :class:`GrpcOwnerEndpoint`.

The channel is mTLS with the owner's identity checked at the handshake: the curator talks only to
the owner names it was configured with, whatever answers at an address. Every reply is held to
its own limit before it is read (:mod:`dpmarket.runtime.replies`; :class:`OwnerChannel`'s
Notes): a hostile owner can make the curator hold at most what its calls legitimately need.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import SizeAttestation
from dpmarket.common.cape.endpoints import OpenedJob
from dpmarket.common.cape.spec import AnyCapeSpec
from dpmarket.common.errors import (
    DPMarketError,
    FailedPreconditionError,
    UnavailableError,
)
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.terms import MarketTerms
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.secagg.endpoints import MaskedInput, SurvivorAttestation
from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse
from dpmarket.common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from dpmarket.common.summarization.hashes import HashAdvert
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.common.texts import peer_text
from dpmarket.curator import convert
from dpmarket.curator.summarization.state import PROGRESS_GRACE, stage_deadline
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.market import market_terms_to_proto
from dpmarket.runtime.replies import (
    REPLY_SLACK_BYTES,
    SMALLEST_BUCKET_BYTES,
    bucket,
    limit_options,
    over_limit,
    reply_refused,
)
from dpmarket.runtime.serving import CHANNEL_OPTIONS
from dpmarket.runtime.status import error_from_rpc
from dpmarket.runtime.terms import terms_to_proto
from dpmarket.runtime.transport import (
    CONNECT_TIMEOUT_SECONDS,
    ConnectError,
    TransportSecurity,
    aio_channel,
    check_connected_aio,
)
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    market_pb2,
    owner_pb2,
    owner_pb2_grpc,
    privacy_pb2,
    secure_aggregation_pb2,
    secure_aggregation_pb2_grpc,
)

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Deadline of a round-trip call (bids, releases), seconds.
CALL_DEADLINE_SECONDS = 30.0
#: The longest the curator's channel to an owner waits between two attempts to reconnect,
#: milliseconds (gRPC's default grows to 120 s): an owner restarted after a failed call is
#: reconnected within this, not minutes later (its channel fails calls fast while it waits).
MAX_RECONNECT_BACKOFF_MS = 1000
#: Largest response the curator receives from an owner, bytes (64 MiB; every client channel
#: otherwise accepts ``MAX_MESSAGE_BYTES``, 256 MiB): the ceiling of every reply's own limit
#: (:data:`OWNER_REPLY_LIMITS`, :func:`points_reply_bytes`). The owners' largest legitimate
#: responses are ``ProposeCandidates`` and ``SampleUniform``: at most ``candidate_multiple`` x
#: ``summary_size`` points (10 x 5,000 = 50,000 at the curator's default ranges) of n float64
#: features and an int64 label each, 50,000 x 8 (n + 1) bytes, which fits for n up to 166.
OWNER_RESPONSE_BYTES = 64 << 20
#: Columns of the largest schema an owner's ``GetOwnerInfo`` may publish, unless the curator's
#: policy allows more (its ``cape_columns`` high end: no job can use more columns).
SCHEMA_COLUMNS = 1000
#: Bytes one schema column takes at most in a ``GetOwnerInfo`` reply: a name of up to 256
#: bytes, its type and bounds (20 bytes), up to 64 categorical levels (8 bytes each) and the
#: field tags, rounded up to 1 KiB.
SCHEMA_COLUMN_BYTES = 1 << 10
#: Replies the curator receives at once from one owner with a limit above
#: :data:`~dpmarket.runtime.replies.SMALLEST_BUCKET_BYTES` (points, masked inputs, CAPE
#: releases); a further call waits for one to end. With the ceiling
#: :data:`OWNER_RESPONSE_BYTES`, what one owner can make the curator hold in such replies is at
#: most 4 x 64 MiB (the default ``max_running``: four sessions' steps go on at once).
LARGE_REPLIES_AT_ONCE = 4
#: Per-entry bytes of a reply that lists one entry per site of a secure-aggregation round
#: (an encrypted share, a Shamir share, a tag), as the owner's own receive limit of the
#: requests that carry the sites (docs/reference.md, "Message limits").
SITE_REPLY_BYTES = 4 << 10
#: gRPC names of the owner services' methods, ``package.Service/Method``.
_OWNER = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name
_SECAGG = secure_aggregation_pb2.DESCRIPTOR.services_by_name["SecureAggregationService"].full_name
_CAPE = cape_pb2.DESCRIPTOR.services_by_name["CapeSiteService"].full_name
#: The limit of every reply that carries ids, counts, scalars, a ledger receipt and a
#: certificate or signature only: :data:`~dpmarket.runtime.replies.REPLY_SLACK_BYTES` (64 KiB).
SMALL_REPLY_METHODS = (
    f"{_OWNER}/OpenSession",
    f"{_OWNER}/SetValidationEmbedding",
    f"{_OWNER}/CountRelevant",
    f"{_OWNER}/CloseSession",
    f"{_OWNER}/RecordStatement",
    f"{_OWNER}/GetProgress",
    f"{_OWNER}/Bid",
    f"{_OWNER}/ReleasePoint",
    f"{_SECAGG}/AdvertiseKeys",
    f"{_SECAGG}/RevealNonce",
    f"{_CAPE}/OpenCapeJob",
    f"{_CAPE}/AttestCapePlan",
    f"{_CAPE}/PlanCapeJob",
    f"{_CAPE}/CloseCapeJob",
)


def owner_reply_limits(schema_columns: int = SCHEMA_COLUMNS) -> dict[str, int]:
    """The reply limit of every owner method whose largest legitimate reply does not depend on
    its request (``package.Service/Method`` -> bytes): :data:`SMALL_REPLY_METHODS` 64 KiB, and
    ``GetOwnerInfo`` a schema of ``schema_columns`` columns of :data:`SCHEMA_COLUMN_BYTES` each
    plus 64 KiB (1.04 MiB at 1,000 columns). The others' limits derive from their requests
    (:func:`points_reply_bytes`, :func:`values_reply_bytes`, :func:`sites_reply_bytes`)."""
    limits = dict.fromkeys(SMALL_REPLY_METHODS, REPLY_SLACK_BYTES)
    limits[f"{_OWNER}/GetOwnerInfo"] = REPLY_SLACK_BYTES + schema_columns * SCHEMA_COLUMN_BYTES
    return limits


#: :func:`owner_reply_limits` at :data:`SCHEMA_COLUMNS`.
OWNER_REPLY_LIMITS = owner_reply_limits()


def points_reply_bytes(count: int, features: int) -> int:
    """The largest legitimate reply carrying ``count`` points of ``features`` float64 values
    and an int64 label each (``SampleUniform``, ``ProposeCandidates``; one point: a
    ``RunRounds`` release), bytes: ``8 count (features + 1)`` plus 64 KiB."""
    return REPLY_SLACK_BYTES + 8 * max(count, 0) * (max(features, 0) + 1)


def values_reply_bytes(values: int, sites: int = 0) -> int:
    """The largest legitimate reply carrying ``values`` 8-byte values (a masked input, a CAPE
    release) and one tag per site of ``sites``, bytes: ``8 values + 4 KiB sites`` plus 64 KiB."""
    return REPLY_SLACK_BYTES + 8 * max(values, 0) + SITE_REPLY_BYTES * max(sites, 0)


def sites_reply_bytes(sites: int) -> int:
    """The largest legitimate reply carrying an entry (or two: ``Unmask``'s self-mask and key
    shares) per site of a round of ``sites`` sites, bytes: ``2 x 4 KiB sites`` plus 64 KiB."""
    return REPLY_SLACK_BYTES + 2 * SITE_REPLY_BYTES * max(sites, 0)


#: Channel arguments of the curator's channels to its owners: :data:`CHANNEL_OPTIONS` with the
#: receive limit :data:`OWNER_RESPONSE_BYTES`, each method's own (:data:`OWNER_REPLY_LIMITS`),
#: and the short reconnect backoff.
OWNER_CHANNEL_OPTIONS = [
    *limit_options(CHANNEL_OPTIONS, OWNER_REPLY_LIMITS, OWNER_RESPONSE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
]
#: Seconds a session or job waits, when it starts, for its owners' channels to connect (an
#: owner restarted a moment ago, or whose last connection failed): past it, an owner that is
#: still not connected is unreachable for that request.
READY_TIMEOUT_SECONDS = CONNECT_TIMEOUT_SECONDS
#: The curator's health service reports each owner's connection under this prefix and the
#: owner's name (``owner:NAME``): SERVING while the curator's channel to it is connected.
OWNER_HEALTH_PREFIX = "owner:"
#: Least deadline of a call that may pass over the owner's table (OpenSession, bids, counts,
#: candidates, samples; CAPE's open), seconds: it grows with the owner's declared rows
#: (:meth:`GrpcOwnerEndpoint.pass_deadline`).
OPEN_DEADLINE_SECONDS = 300.0


#: Why a networked session refuses the hashes mode.
_HASHES_IN_PROCESS = (
    "the hashes summary (the less-trusted curator) runs in process only in this release: no "
    "RPC carries the owners' key agreement or their hashes"
)


class RoundsStream:
    """One session's ``RunRounds`` stream to one owner: its steps (Bid, ReleasePoint) one at a
    time, each answered in order on the same stream.

    The rounds of a session send the owner one step after another (a bid, then perhaps a
    release, then the next round's bid), so one stream carries them all and each step costs a
    message each way instead of a call.

    Parameters
    ----------
    stub : OwnerServiceStub
    peer : str
        Names the owner in error messages (``"owner NAME"``: its name, never its address,
        which the curator's errors must not carry to a consumer).
    limit : int
        The receive limit of the stream's channel, bytes: an answer above it fails its step
        (``ResourceExhaustedError`` naming the owner and the limit).

    Notes
    -----
    A step that fails, times out or is cancelled ends the stream (cancelling it at the owner,
    which stops the step's work); :attr:`broken` then says so and its endpoint opens another
    stream for a later step. No step is ever sent twice.
    """

    def __init__(self, stub: owner_pb2_grpc.OwnerServiceAsyncStub, peer: str, limit: int) -> None:
        self._call = stub.RunRounds(None)  # read and write: no request iterator
        self._peer = peer
        self._limit = limit
        self._lock = asyncio.Lock()
        self.broken = False

    async def step(self, request: owner_pb2.RunRoundsRequest, timeout: float) -> Any:
        """Send one step and return its answer (the ``RunRoundsResponse``'s step message).

        Parameters
        ----------
        request : RunRoundsRequest
        timeout : float
            Seconds to wait for the answer.

        Raises
        ------
        dpmarket.common.errors.DPMarketError
            The owner's status for the step, mapped as for a unary call
            (:func:`dpmarket.runtime.status.error_from_rpc`); ``UnavailableError`` when no answer
            came within ``timeout`` or the owner ended the stream.
        """
        async with self._lock:
            try:
                async with asyncio.timeout(timeout):
                    with contextlib.suppress(asyncio.InvalidStateError):
                        await self._call.write(request)  # if the stream has ended, read says how
                    response = await self._call.read()
            except grpc.RpcError as exc:
                self._fail()
                if over_limit(exc):
                    raise reply_refused(self._peer, "RunRounds", self._limit) from None
                raise error_from_rpc(exc, self._peer) from None
            except TimeoutError:
                self._fail()
                raise UnavailableError(
                    f"{self._peer}: no answer within {timeout:.0f} s (DEADLINE_EXCEEDED)"
                ) from None
            except BaseException:
                self._fail()
                raise
            if not isinstance(response, owner_pb2.RunRoundsResponse):  # EOF
                self._fail()
                raise UnavailableError(f"{self._peer}: the owner ended the session's rounds")
            step = request.WhichOneof("step")
            if step is None or response.WhichOneof("step") != step:
                self._fail()
                raise UnavailableError(f"{self._peer}: answered a {step} step with another")
            return getattr(response, step)

    def _fail(self) -> None:
        self.broken = True
        self._call.cancel()

    async def close(self) -> None:
        """Close the curator's side; the owner then ends the stream."""
        if not self.broken:
            with contextlib.suppress(asyncio.InvalidStateError, grpc.RpcError):
                await self._call.done_writing()


class ReceiptBook(Protocol):
    """Durable keeping of each owner's last ledger receipt
    (:class:`dpmarket.curator.store.CuratorStore`). Receipts are opaque here: only the owner that
    signed one reads it."""

    def owner_receipt(self, owner: str) -> bytes | None:
        """The last receipt ``owner`` returned, serialized, or None."""

    def record_owner_receipt(
        self,
        owner: str,
        receipt: bytes,
        *,
        only_later: bool = False,
        certificate: bytes | None = None,
    ) -> None:
        """Keep ``receipt`` as ``owner``'s last, durably (with ``only_later``, only over one
        of the same ledger at an earlier charge), with ``certificate`` (the owner's, PEM)."""

    def owner_receipt_and_certificate(self, owner: str) -> tuple[bytes, bytes | None] | None:
        """``owner``'s last receipt and the certificate kept with it, read together, or None."""


def held_receipt(
    receipts: ReceiptBook | None, owner: str
) -> tuple[privacy_pb2.LedgerReceipt, bytes] | None:
    """``owner``'s last ledger receipt ``receipts`` keeps and the owner certificate (PEM; empty:
    none) kept with it, read together, to present to that owner before it charges (a session's
    or job's open, a publication's spec): None if none is kept, or if the one kept does not
    parse (logged; not one the owner returned)."""
    held = None if receipts is None else receipts.owner_receipt_and_certificate(owner)
    if held is None:
        return None
    receipt, certificate = held
    try:
        return privacy_pb2.LedgerReceipt.FromString(receipt), certificate or b""
    except DecodeError:
        logger.warning("the stored ledger receipt of owner %s does not parse", owner)
        return None


class OwnerChannel:
    """The curator's ``grpc.aio`` channel to one owner, which its service clients share: the
    owner's identity checked at the handshake, a deadline on every call, its ledger receipts.

    Parameters
    ----------
    target : str
        ``host:port`` of the owner service.
    security : TransportSecurity
        The curator's mTLS credentials (or plaintext, ``--insecure`` only).
    expected : Identity, optional
        The owner identity the server must prove (its certificate's role and name); required
        with mTLS.
    deadline : float
        Deadline of round-trip calls, seconds.
    receipts : ReceiptBook, optional
        Where the owner's ledger receipts are kept (the curator's store): the last one is
        presented when a session or job opens, the one a close returns replaces it. None: no
        receipt is kept or presented.
    response_bytes : int
        The largest response received from the owner, bytes (:data:`OWNER_RESPONSE_BYTES`): the
        ceiling of every reply's own limit.
    schema_columns : int
        Columns of the largest schema the owner may publish (:func:`owner_reply_limits`).
    large_replies_at_once : int
        Calls whose reply may exceed 1 MiB in flight at once to the owner
        (:data:`LARGE_REPLIES_AT_ONCE`).

    Notes
    -----
    Every reply has its own limit, refused before it is buffered
    (:mod:`dpmarket.runtime.replies`): a method whose largest reply is fixed has it in the
    channel's service config (:func:`owner_reply_limits`); a method whose largest reply
    depends on the request (points, values, sites) is called on a channel of this owner whose
    limit is the least power of two at least that need (at most ``response_bytes``), and above
    1 MiB holds one of the owner's ``large_replies_at_once`` turns while it runs. A reply
    above its limit fails its call with ``ResourceExhaustedError`` naming the owner, the method
    and the limit (never the reply's size or content): the owner failed that step.
    """

    def __init__(
        self,
        target: str,
        security: TransportSecurity,
        expected: Identity | None,
        *,
        deadline: float = CALL_DEADLINE_SECONDS,
        receipts: ReceiptBook | None = None,
        response_bytes: int = OWNER_RESPONSE_BYTES,
        schema_columns: int = SCHEMA_COLUMNS,
        large_replies_at_once: int = LARGE_REPLIES_AT_ONCE,
    ) -> None:
        self.target = target
        self.expected = expected
        self.deadline = deadline
        self.receipts = receipts
        self._security = security
        #: The owner's declared rows (from GetOwnerInfo), which scale its long calls' deadlines.
        self.rows = 0
        #: The owner's declared features (from GetOwnerInfo), which size its points' replies.
        self.features = 0
        self._ceiling = response_bytes
        self._limits = owner_reply_limits(schema_columns)
        self._by_method = {full.rpartition("/")[2]: n for full, n in self._limits.items()}
        options = limit_options(OWNER_CHANNEL_OPTIONS, self._limits, response_bytes)
        self._channel = aio_channel(target, security, expected, options=options)
        #: This owner's channels for replies sized by their requests, by their limit.
        self._sized: dict[int, grpc.aio.Channel] = {}
        self._large_turns = asyncio.Semaphore(large_replies_at_once)

    @property
    def name(self) -> str:
        """The owner's name (its certificate's; the address with plaintext transport), which
        is also its site id in secure aggregation."""
        if self.expected is None:
            return self.target
        return self.expected.name

    async def _call(
        self, method: str, make: Callable[[], Awaitable[T]], limit: int | None = None
    ) -> T:
        """Await ``make()``, a call of ``method`` (its reply limited to ``limit`` bytes; None:
        its limit in the channel's service config), its failure as a ``DPMarketError``."""
        try:
            return await make()
        except grpc.RpcError as exc:
            if over_limit(exc):
                known = limit or min(self._by_method.get(method, self._ceiling), self._ceiling)
                raise reply_refused(f"owner {self.name}", method, known) from None
            raise error_from_rpc(exc, f"owner {self.name}") from None

    def _sized_channel(self, need: int) -> tuple[grpc.aio.Channel, int]:
        """This owner's channel for a reply of at most ``need`` bytes, and its limit."""
        limit = bucket(need, self._ceiling)
        channel = self._sized.get(limit)
        if channel is None:
            options = limit_options(OWNER_CHANNEL_OPTIONS, self._limits, limit)
            channel = aio_channel(self.target, self._security, self.expected, options=options)
            self._sized[limit] = channel
        return channel, limit

    async def _sized_call(
        self, method: str, need: int, make: Callable[[grpc.aio.Channel], Awaitable[T]]
    ) -> T:
        """Await ``make(channel)``, a call of ``method`` whose largest legitimate reply is
        ``need`` bytes, on the channel for it (class Notes); above 1 MiB within one of the
        owner's :data:`LARGE_REPLIES_AT_ONCE` turns."""
        channel, limit = self._sized_channel(need)
        if limit <= SMALLEST_BUCKET_BYTES:
            return await self._call(method, lambda: make(channel), limit)
        async with self._large_turns:
            return await self._call(method, lambda: make(channel), limit)

    def _held_receipt(self) -> dict[str, Any]:
        """The owner's last receipt this curator keeps and its certificate, as the fields of a
        session's or job's open request that present them (none: no field)."""
        held = held_receipt(self.receipts, self.name)
        if held is None:
            return {}
        return {"ledger_receipt": held[0], "receipt_certificate": held[1]}

    def _keep_receipt(
        self, response: owner_pb2.CloseSessionResponse | cape_pb2.CloseCapeJobResponse
    ) -> None:
        """Keep the receipt a close returned (it replaces the one held), with the certificate
        the owner returned with it (the owner checks it when it is presented: a curator cannot
        make a receipt genuine with a certificate of its choosing)."""
        if self.receipts is not None and response.HasField("receipt"):
            self.receipts.record_owner_receipt(
                self.name,
                response.receipt.SerializeToString(),
                certificate=response.receipt_certificate or None,
            )

    def pass_deadline(self) -> float:
        """The gRPC deadline of a call that may pass over the owner's table: at least
        :data:`OPEN_DEADLINE_SECONDS`, and
        :data:`~dpmarket.curator.summarization.state.PROGRESS_GRACE` times the session's deadline
        for the owner's declared rows (the session's supervision,
        which asks :meth:`progress`, decides earlier whether the owner is still working)."""
        scaled = PROGRESS_GRACE * stage_deadline(self.deadline, self.rows, "open") + self.deadline
        return max(OPEN_DEADLINE_SECONDS, scaled)

    async def close(self) -> None:
        """Close the channel (and those for replies sized by their requests)."""
        sized, self._sized = list(self._sized.values()), {}
        for channel in sized:
            await channel.close(None)
        await self._channel.close(None)

    async def connect(self, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
        """Connect now (TCP and the mTLS handshake, the owner's identity checked) rather than
        at the first call, within a connect deadline of ``timeout`` seconds.

        Raises
        ------
        dpmarket.runtime.transport.ConnectError
            (an ``UnavailableError``) If the channel is not connected in time; the message says
            why (:func:`dpmarket.runtime.transport.check_connected_aio`): nothing listening, a
            certificate of another CA, a server that proves another identity.
        """
        await check_connected_aio(
            self._channel,
            self.target,
            self._security,
            self.expected,
            timeout=timeout,
            peer=f"owner {self.name}",
        )

    async def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
        """Ask the channel to connect and wait up to ``timeout`` seconds until it is; return
        whether it is connected (never raises: an owner that is not is unreachable for the
        call that follows, which fails at once).

        Notes
        -----
        A channel whose last connection failed fails calls at once until its next attempt
        (:data:`MAX_RECONNECT_BACKOFF_MS` at most): without this wait, the first request after
        an owner restarts could find it unreachable although it serves.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        state = self._channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._channel.wait_for_state_change(state), left)
            except TimeoutError:
                return False
            state = self._channel.get_state(try_to_connect=True)
        return True

    async def keep_connected(self, report: Callable[[bool], Awaitable[None]]) -> None:
        """Keep the channel connected while the curator serves, reporting every change.

        Asks the channel to connect whenever it is idle or its connection failed, so that an
        owner that (re)starts is connected within :data:`MAX_RECONNECT_BACKOFF_MS` whether or
        not a session asks for it; calls ``report(True)`` when it connects and
        ``report(False)`` when it is not connected (first call: the state now). Runs until
        cancelled, or the endpoint is closed.
        """
        known: bool | None = None
        while True:
            state = self._channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.SHUTDOWN:  # the endpoint was closed
                await report(False)
                return
            ready = state == grpc.ChannelConnectivity.READY
            if ready != known:
                await report(ready)
                known = ready
            await self._channel.wait_for_state_change(state)


class OwnerServiceClient(OwnerChannel):
    """The owner's ``OwnerService`` on an :class:`OwnerChannel`: its information and the
    summarization session's steps (a :class:`dpmarket.common.summarization.endpoints.
    OwnerEndpoint`), and the delivery of settled statements."""

    @functools.cached_property
    def _stub(self) -> owner_pb2_grpc.OwnerServiceAsyncStub:
        return owner_pb2_grpc.OwnerServiceStub(self._channel)

    @functools.cached_property
    def _rounds(self) -> dict[str, RoundsStream]:
        """Each open session's RunRounds stream, by session id (opened at its first step)."""
        return {}

    @functools.cached_property
    def _session_features(self) -> dict[str, int]:
        """Each open session's features n, by session id (its h1's frequencies are d x n)."""
        return {}

    def _points_need(self, session_id: str, count: int) -> int:
        """The largest legitimate reply of ``count`` points of the session (its n features;
        the owner's declared ones for a session not opened here; none known: the ceiling)."""
        features = self._session_features.get(session_id, self.features)
        return points_reply_bytes(count, features) if features else self._ceiling

    async def info(self) -> OwnerInfo:
        """GetOwnerInfo."""
        response = await self._call(
            "GetOwnerInfo",
            lambda: self._stub.GetOwnerInfo(owner_pb2.GetOwnerInfoRequest(), timeout=self.deadline),
        )
        info = convert.info_from_proto(response, self.name, self.expected)
        self.rows = info.num_points
        self.features = info.num_features
        return info

    async def progress(self, session_id: str) -> tuple[str, int, int, int]:
        """GetProgress: ``(stage, done, total, ticks)`` of the session's running step (the
        stage is the owner's text: kept as one line of at most 500 characters, ``peer_text``)."""
        request = owner_pb2.GetProgressRequest(session_id=session_id)
        response = await self._call(
            "GetProgress", lambda: self._stub.GetProgress(request, timeout=self.deadline)
        )
        stage = peer_text(response.stage)
        return stage, int(response.done), int(response.total), int(response.ticks)

    async def schema(self) -> Schema | None:
        """The owner's public schema (GetOwnerInfo's)."""
        return (await self.info()).schema

    async def prices(self) -> OwnerPrices:
        """The owner's published prices (GetOwnerInfo's): what a CAPE job is quoted from."""
        return (await self.info()).prices

    async def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        consumer: str,
        terms: OwnerTerms,
    ) -> tuple[int, int]:
        """OpenSession: offer the terms, send h1's frequencies, phases and feature scaling
        as data."""
        scaling = None
        if rff.scaling is not None:
            scaling = owner_pb2.FeatureScaling(
                low=array_to_proto(rff.scaling.low), high=array_to_proto(rff.scaling.high)
            )
        request = owner_pb2.OpenSessionRequest(
            session_id=session_id,
            omega=array_to_proto(rff.omega),
            phase=array_to_proto(rff.phase),
            sampling_seed=sampling_seed,
            gamma=rff.gamma,
            consumer=consumer,
            terms=terms_to_proto(terms),
            scaling=scaling,
            **self._held_receipt(),
        )
        response = await self._call(
            "OpenSession", lambda: self._stub.OpenSession(request, timeout=self.pass_deadline())
        )
        self._session_features[session_id] = int(rff.omega.shape[1])
        return int(response.num_points), int(response.max_points)

    async def set_validation_embedding(
        self,
        session_id: str,
        embedding: NDArray[np.float64],
        *,
        shrinkage_sigma: float = 0.0,
        prior_embedding: NDArray[np.float64] | None = None,
        score_metric: bool = False,
    ) -> None:
        """SetValidationEmbedding."""
        request = owner_pb2.SetValidationEmbeddingRequest(
            session_id=session_id,
            validation_embedding=array_to_proto(embedding),
            shrinkage_sigma=shrinkage_sigma,
            score_metric=score_metric,
        )
        if prior_embedding is not None:
            request.prior_embedding.CopyFrom(array_to_proto(prior_embedding))
        await self._call(
            "SetValidationEmbedding",
            lambda: self._stub.SetValidationEmbedding(request, timeout=self.deadline),
        )

    async def bid(
        self, session_id: str, round_: int, summary_embedding: NDArray[np.float64], q: int
    ) -> OwnerBid | None:
        """Bid, a step of the session's RunRounds stream."""
        request = owner_pb2.RunRoundsRequest(
            bid=owner_pb2.BidRequest(
                session_id=session_id,
                round=round_,
                summary_embedding=array_to_proto(summary_embedding),
                summary_size=q,
            )
        )
        response = await self._rounds_stream(session_id).step(request, self.pass_deadline())
        return convert.bid_from_proto(response)

    async def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """ReleasePoint, a step of the session's RunRounds stream."""
        request = owner_pb2.RunRoundsRequest(
            release_point=owner_pb2.ReleasePointRequest(session_id=session_id, round=round_)
        )
        response = await self._rounds_stream(session_id).step(request, self.deadline)
        return convert.released_from_proto(response)

    def _rounds_stream(self, session_id: str) -> RoundsStream:
        """The session's RunRounds stream: the open one, or a new one."""
        stream = self._rounds.get(session_id)
        if stream is None or stream.broken:
            channel, limit = self._sized_channel(self._points_need(session_id, 1))
            stub = owner_pb2_grpc.OwnerServiceStub(channel)
            stream = RoundsStream(stub, f"owner {self.name}", limit)
            self._rounds[session_id] = stream
        return stream

    async def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """SampleUniform."""
        request = owner_pb2.SampleUniformRequest(session_id=session_id, count=count)
        response = await self._sized_call(
            "SampleUniform",
            self._points_need(session_id, count),
            lambda channel: owner_pb2_grpc.OwnerServiceStub(channel).SampleUniform(
                request, timeout=self.pass_deadline()
            ),
        )
        return convert.points_from_proto(response)

    async def count_relevant(self, session_id: str, threshold: float) -> float:
        """CountRelevant: the owner's noisy relevance count."""
        request = owner_pb2.CountRelevantRequest(session_id=session_id, threshold=threshold)
        response = await self._call(
            "CountRelevant", lambda: self._stub.CountRelevant(request, timeout=self.pass_deadline())
        )
        return float(response.noisy_count)

    async def propose_candidates(
        self, session_id: str, count: int, *, uniform_count: int = 0
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """ProposeCandidates (the owner runs a local greedy: a deadline for a pass over its
        table)."""
        request = owner_pb2.ProposeCandidatesRequest(
            session_id=session_id, count=count, uniform_count=uniform_count
        )
        response = await self._sized_call(
            "ProposeCandidates",
            self._points_need(session_id, count),
            lambda channel: owner_pb2_grpc.OwnerServiceStub(channel).ProposeCandidates(
                request, timeout=self.pass_deadline()
            ),
        )
        return convert.points_from_proto(response)

    async def close_session(self, session_id: str) -> SessionSpend:
        """CloseSession: what the owner's ledger recorded for the session."""
        self._session_features.pop(session_id, None)
        stream = self._rounds.pop(session_id, None)
        if stream is not None:
            await stream.close()
        request = owner_pb2.CloseSessionRequest(session_id=session_id)
        response = await self._call(
            "CloseSession", lambda: self._stub.CloseSession(request, timeout=self.deadline)
        )
        self._keep_receipt(response)
        return convert.spend_from_proto(response.spent)

    async def record_statement(self, data: bytes, signature: bytes) -> tuple[str, bool]:
        """RecordStatement: deliver the owner's signed part of a statement; return the
        statement's id and whether the owner recorded it now (False: recorded before)."""
        request = owner_pb2.RecordStatementRequest(
            statement=market_pb2.SignedStatement(statement=data, signature=signature)
        )
        response = await self._call(
            "RecordStatement", lambda: self._stub.RecordStatement(request, timeout=self.deadline)
        )
        return str(response.statement_id), bool(response.recorded_now)

    async def hash_advertise(self, session_id: str) -> HashAdvert:
        """The hashes mode runs in process only in this release (no RPC carries it)."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def hash_distribute(
        self, session_id: str, adverts: Mapping[str, HashAdvert]
    ) -> dict[str, tuple[bytes, bytes]]:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def hash_receive(
        self, session_id: str, adverts: Mapping[str, HashAdvert], envelope: tuple[bytes, bytes]
    ) -> str:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def propose_hashes(
        self, session_id: str, count: int, gamma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def close(self) -> None:
        """Close the channel (and every session's RunRounds stream on it)."""
        self._rounds.clear()
        await super().close()


class SecureAggregationClient(OwnerChannel):
    """The owner's ``SecureAggregationService`` on an :class:`OwnerChannel`: the owner as a
    site of a secure-aggregation round (a :class:`dpmarket.common.secagg.endpoints.
    SecureAggregationEndpoint`)."""

    @functools.cached_property
    def _secagg(self) -> secure_aggregation_pb2_grpc.SecureAggregationServiceAsyncStub:
        return secure_aggregation_pb2_grpc.SecureAggregationServiceStub(self._channel)

    async def advertise_keys(
        self, job_id: str, params: RoundParams
    ) -> tuple[KeyAdvertisement, bytes]:
        """AdvertiseKeys."""
        request = secure_aggregation_pb2.AdvertiseKeysRequest(
            round=msg.round_to_proto(job_id, params)
        )
        response = await self._call(
            "AdvertiseKeys", lambda: self._secagg.AdvertiseKeys(request, timeout=self.deadline)
        )
        return msg.advertisement_from_proto(response.advertisement)

    async def reveal_nonce(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> bytes:
        """RevealNonce (sparse rounds)."""
        request = secure_aggregation_pb2.RevealNonceRequest(
            round=msg.round_to_proto(job_id, params),
            advertisements=[
                msg.advertisement_to_proto(ad, certificates.get(site, b""))
                for site, ad in sorted(advertisements.items())
            ],
        )
        response = await self._call(
            "RevealNonce", lambda: self._secagg.RevealNonce(request, timeout=self.deadline)
        )
        return bytes(response.nonce)

    async def share_keys(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
        nonces: Mapping[str, bytes] | None = None,
    ) -> dict[str, bytes]:
        """ShareKeys."""
        request = secure_aggregation_pb2.ShareKeysRequest(
            round=msg.round_to_proto(job_id, params),
            advertisements=[
                msg.advertisement_to_proto(ad, certificates.get(site, b""))
                for site, ad in sorted(advertisements.items())
            ],
            nonces=msg.nonces_to_proto(nonces or {}),
        )
        response = await self._sized_call(
            "ShareKeys",
            sites_reply_bytes(len(advertisements)),
            lambda channel: secure_aggregation_pb2_grpc.SecureAggregationServiceStub(
                channel
            ).ShareKeys(request, timeout=self.deadline),
        )
        return {c.recipient: bytes(c.ciphertext) for c in response.ciphertexts}

    def _me(self) -> str:
        return self.expected.name if self.expected is not None else ""

    async def masked_input(
        self, job_id: str, params: RoundParams, ciphertexts: Mapping[str, bytes]
    ) -> MaskedInput:
        """MaskedInput."""
        me = self._me()
        request = secure_aggregation_pb2.MaskedInputRequest(
            round=msg.round_to_proto(job_id, params),
            ciphertexts=msg.ciphertexts_to_proto(
                (sender, me, ct) for sender, ct in sorted(ciphertexts.items())
            ),
        )
        response = await self._sized_call(
            "MaskedInput",
            values_reply_bytes(params.vector_length, len(ciphertexts) + 1),
            lambda channel: secure_aggregation_pb2_grpc.SecureAggregationServiceStub(
                channel
            ).MaskedInput(request, timeout=self.deadline),
        )
        return MaskedInput(
            msg.masked_from_proto(response.masked, params.vector_length),
            msg.tags_from_proto(response.acknowledgements, sender=me) if params.sparse else {},
        )

    async def consistency_check(
        self, job_id: str, params: RoundParams, survivors: Sequence[str]
    ) -> SurvivorAttestation:
        """ConsistencyCheck."""
        request = secure_aggregation_pb2.ConsistencyCheckRequest(
            round=msg.round_to_proto(job_id, params), survivors=list(survivors)
        )
        response = await self._sized_call(
            "ConsistencyCheck",
            sites_reply_bytes(len(survivors)),
            lambda channel: secure_aggregation_pb2_grpc.SecureAggregationServiceStub(
                channel
            ).ConsistencyCheck(request, timeout=self.deadline),
        )
        if params.sparse:
            return SurvivorAttestation(
                tags=msg.tags_from_proto(response.attestations, sender=self._me())
            )
        return SurvivorAttestation(signature=bytes(response.signature))

    async def unmask(
        self,
        job_id: str,
        params: RoundParams,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
        acknowledgements: Mapping[str, bytes] | None = None,
    ) -> UnmaskResponse:
        """Unmask."""
        request = secure_aggregation_pb2.UnmaskRequest(
            round=msg.round_to_proto(job_id, params),
            survivors=list(survivors),
            dropped=list(dropped),
        )
        if params.sparse:
            me = self._me()
            request.attestations.extend(
                msg.tags_to_proto((s, me, t) for s, t in sorted(signatures.items()))
            )
            request.acknowledgements.extend(
                msg.tags_to_proto((s, me, t) for s, t in sorted((acknowledgements or {}).items()))
            )
        else:
            request.signatures.extend(msg.signatures_to_proto(signatures))
        response = await self._sized_call(
            "Unmask",
            sites_reply_bytes(len(survivors) + len(dropped)),
            lambda channel: secure_aggregation_pb2_grpc.SecureAggregationServiceStub(
                channel
            ).Unmask(request, timeout=self.deadline),
        )
        return msg.unmask_from_proto(response)


class CapeSiteClient(SecureAggregationClient):
    """The owner's ``CapeSiteService`` on an :class:`OwnerChannel`: the owner as a CAPE site,
    whose zero-sum noise rounds run through its :class:`SecureAggregationClient` side."""

    @functools.cached_property
    def _cape(self) -> cape_pb2_grpc.CapeSiteServiceAsyncStub:
        return cape_pb2_grpc.CapeSiteServiceStub(self._channel)

    async def open_job(
        self,
        job_id: str,
        spec: AnyCapeSpec,
        seed: int,
        consumer: str,
        market: MarketTerms | None = None,
    ) -> OpenedJob:
        """OpenCapeJob (the owner scans its table: allow the open-session deadline)."""
        request = cape_pb2.OpenCapeJobRequest(
            job_id=job_id,
            consumer=consumer,
            seed=seed,
            **self._held_receipt(),
            market=None if market is None else market_terms_to_proto(market),
        )
        msg.job_to_proto(request, spec)
        response = await self._call(
            "OpenCapeJob", lambda: self._cape.OpenCapeJob(request, timeout=self.pass_deadline())
        )
        self.rows = max(self.rows, int(response.num_rows))
        return OpenedJob(int(response.num_rows), int(response.min_colluders))

    async def attest_plan(
        self, job_id: str, sites: Sequence[str], colluders: int, first_iteration: int = 0
    ) -> tuple[SizeAttestation, bytes]:
        """AttestCapePlan."""
        request = cape_pb2.AttestCapePlanRequest(
            job_id=job_id, sites=list(sites), colluders=colluders, first_iteration=first_iteration
        )
        response = await self._call(
            "AttestCapePlan", lambda: self._cape.AttestCapePlan(request, timeout=self.deadline)
        )
        return msg.attestation_from_proto(response.attestation)

    async def plan_job(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        attestations: Mapping[str, tuple[SizeAttestation, bytes]],
        first_iteration: int = 0,
    ) -> tuple[int, float]:
        """PlanCapeJob."""
        request = cape_pb2.PlanCapeJobRequest(
            job_id=job_id,
            sites=list(sites),
            colluders=colluders,
            first_iteration=first_iteration,
            attestations=[
                msg.attestation_to_proto(attestation, certificate)
                for _, (attestation, certificate) in sorted(attestations.items())
            ],
        )
        response = await self._call(
            "PlanCapeJob", lambda: self._cape.PlanCapeJob(request, timeout=self.deadline)
        )
        return int(response.statistic_length), float(response.max_noise_scale)

    async def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """ReleaseCape."""
        request = cape_pb2.ReleaseCapeRequest(
            job_id=job_id, round_id=round_id, noise_total=msg.vector_to_proto(total)
        )
        response = await self._sized_call(
            "ReleaseCape",
            values_reply_bytes(total.shape[0]),
            lambda channel: cape_pb2_grpc.CapeSiteServiceStub(channel).ReleaseCape(
                request, timeout=self.pass_deadline()
            ),
        )
        return msg.vector_from_proto(response.release, "release", total.shape[0])

    async def release_gradient(
        self,
        job_id: str,
        round_id: bytes,
        iteration: int,
        parameters: NDArray[np.float64],
        total: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """ReleaseCapeGradient."""
        request = cape_pb2.ReleaseCapeGradientRequest(
            job_id=job_id,
            round_id=round_id,
            iteration=iteration,
            parameters=msg.vector_to_proto(parameters),
            noise_total=msg.vector_to_proto(total),
        )
        response = await self._sized_call(
            "ReleaseCapeGradient",
            values_reply_bytes(parameters.shape[0]),
            lambda channel: cape_pb2_grpc.CapeSiteServiceStub(channel).ReleaseCapeGradient(
                request, timeout=self.pass_deadline()
            ),
        )
        return msg.vector_from_proto(response.release, "release", parameters.shape[0])

    async def close_job(self, job_id: str) -> SessionSpend:
        """CloseCapeJob."""
        request = cape_pb2.CloseCapeJobRequest(job_id=job_id)
        response = await self._call(
            "CloseCapeJob", lambda: self._cape.CloseCapeJob(request, timeout=self.deadline)
        )
        self._keep_receipt(response)
        return convert.spend_from_proto(response.spent)


class GrpcOwnerEndpoint(OwnerServiceClient, CapeSiteClient):
    """Talks to one owner over one ``grpc.aio`` channel (:class:`OwnerChannel`, whose
    parameters it takes), with a deadline on every call: the owner's three services, one client
    each — :class:`OwnerServiceClient` (an ``OwnerEndpoint``), :class:`SecureAggregationClient`
    and :class:`CapeSiteClient` (a ``CapeSiteEndpoint``, whose ``schema`` is the owner
    service's)."""


@dataclass(frozen=True)
class OwnerCheck:
    """What the curator found when it checked one configured owner at start-up.

    Attributes
    ----------
    owner : str
        The owner's configured name (its address with plaintext transport).
    target : str
        ``host:port``.
    error : str
        A misconfiguration that every session would meet: a server that proves another
        identity or whose certificate another CA signed, or an allocation spec whose columns do
        not match the owner's features. Empty when none.
    warning : str
        A condition that may pass: the owner does not answer now. Empty when none.
    """

    owner: str
    target: str
    error: str = ""
    warning: str = ""


async def check_owner(
    endpoint: GrpcOwnerEndpoint,
    *,
    allocation_columns: Sequence[str] | None = None,
    allocation_spec: str = "",
    timeout: float = CONNECT_TIMEOUT_SECONDS,
) -> OwnerCheck:
    """Check one configured owner: its address, identity and, when the curator's allocation
    reads a sketch spec, that the spec's columns are as many as the owner's features.

    Parameters
    ----------
    endpoint : GrpcOwnerEndpoint
    allocation_columns : sequence of str, optional
        The columns of the allocation's sketch spec, in order.
    allocation_spec : str
        Its name, for the message.
    timeout : float
        The connect deadline, seconds.

    Returns
    -------
    OwnerCheck
        Unreachable (nothing listening, nothing answering): a warning, since an owner may start
        later. Another identity or another CA at the address, or a column count unlike the
        owner's feature count: an error.

    Notes
    -----
    Only the owner's public description (its name and feature count, ``GetOwnerInfo``) is
    read; nothing is released or charged.
    """
    name = endpoint.name
    where = f"owner {name} at {endpoint.target}"
    try:
        await endpoint.connect(timeout)
    except ConnectError as exc:
        reason = str(exc).removeprefix(f"cannot reach owner {name}: ")
        if exc.failure in ("identity", "ca", "tls"):
            hint = " (check --owner NAME@HOST:PORT and the certificates)"
            return OwnerCheck(name, endpoint.target, error=f"{where}: {reason}{hint}")
        return OwnerCheck(
            name,
            endpoint.target,
            warning=f"{where}: {reason}; sessions leave it out until it answers",
        )
    if allocation_columns is None:
        return OwnerCheck(name, endpoint.target)
    try:
        info = await endpoint.info()
    except DPMarketError as exc:
        return OwnerCheck(name, endpoint.target, warning=f"{where}: no description ({exc})")
    if info.num_points == 0:  # holds a table only (CAPE): summarization does not use it
        return OwnerCheck(name, endpoint.target)
    if info.num_features != len(allocation_columns):
        return OwnerCheck(
            name,
            endpoint.target,
            error=(
                f"--allocation-sketch-spec {allocation_spec} has {len(allocation_columns)} "
                f"column(s) ({', '.join(allocation_columns)}) but {where} holds points of "
                f"{info.num_features} features: the spec must declare the owners' "
                "summarization features, in order"
            ),
        )
    return OwnerCheck(name, endpoint.target)


async def wait_for_owners(
    endpoints: Sequence[object], timeout: float = READY_TIMEOUT_SECONDS
) -> None:
    """Wait, up to ``timeout`` seconds in all, until every owner's channel is connected (the
    endpoints that have a channel: :meth:`GrpcOwnerEndpoint.wait_ready`; in-process owners
    are ready). Never raises: a session or job that follows finds an owner still not
    connected unreachable, and says so."""
    waits = [e.wait_ready(timeout) for e in endpoints if isinstance(e, GrpcOwnerEndpoint)]
    if waits:
        await asyncio.gather(*waits)


async def check_owners(
    endpoints: Sequence[GrpcOwnerEndpoint],
    *,
    allocation_columns: Sequence[str] | None = None,
    allocation_spec: str = "",
    timeout: float = CONNECT_TIMEOUT_SECONDS,
) -> list[OwnerCheck]:
    """Check every configured owner at once (:func:`check_owner`); log each warning.

    Raises
    ------
    dpmarket.common.errors.FailedPreconditionError
        If any owner's check found an error; the message lists them, one per owner.
    """
    checks = await asyncio.gather(
        *(
            check_owner(
                e,
                allocation_columns=allocation_columns,
                allocation_spec=allocation_spec,
                timeout=timeout,
            )
            for e in endpoints
        )
    )
    for check in checks:
        if check.warning:
            logger.warning("%s", check.warning)
    errors = [c.error for c in checks if c.error]
    if errors:
        raise FailedPreconditionError("; ".join(errors))
    return list(checks)
