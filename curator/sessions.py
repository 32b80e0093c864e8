"""Session registry of the curator service: who may create, see and fetch which session.

Plain asyncio, no gRPC: the servicer (:mod:`dpmarket.curator.service`) only authorizes and converts.
The manager enforces the curator's policy (:mod:`dpmarket.curator.policy`) before anything is
released: parameter ranges, the session's total spend of the owners' privacy, seeded sessions, the
number of sessions running at once and each consumer's request rate. A session belongs to the
consumer identity that created it; any other consumer gets ``NOT_FOUND``. Sessions, results and
every charge are written to the durable store (:mod:`dpmarket.curator.store`) when one is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpmarket.common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
)
from dpmarket.common.ids import new_session_id, short_id
from dpmarket.common.market.payouts import PayoutRelease
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.statement import PrivateKey
from dpmarket.common.market.terms import release_from_json, release_to_json
from dpmarket.common.sketches import PrivateSketch
from dpmarket.common.summarization.endpoints import OwnerEndpoint
from dpmarket.common.summarization.methods import METHODS, AllocationFields, SummarizationConfig
from dpmarket.common.summarization.summary import (
    OwnerSelection,
    ProgressEvent,
    SessionReport,
    SessionRequest,
    SessionStage,
    SummaryResult,
)
from dpmarket.common.summarization.terms import MethodOffer, access_refusal
from dpmarket.curator.owners import wait_for_owners
from dpmarket.curator.policy import CuratorPolicy, RequestRate
from dpmarket.curator.settlement import (
    RetrySchedule,
    SessionMarket,
    SignedSettlement,
    payout_release,
    settle_session,
)
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.curator.store import CuratorStore, StoredSession, StoredStatement, UnrecordedOwner
from dpmarket.curator.summarization.session import SessionContext, SummarizationSession

logger = logging.getLogger(__name__)

#: Longest accepted idempotency key.
MAX_REQUEST_ID_LENGTH = 128


@dataclass
class _Managed:
    session_id: str
    consumer: str
    session: SummarizationSession | None
    events: list[ProgressEvent] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    result: SummaryResult | None = None
    report: SessionReport | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = None
    request_id: str | None = None
    request_digest: str = ""
    expires_at: float = math.inf
    #: The session's own last event (done or failed), published once the report is set.
    final: ProgressEvent | None = None
    #: The quote the session was accepted under.
    quote: Quote | None = None

    @property
    def finished(self) -> bool:
        return self.report is not None


class SessionManager:
    """Creates, runs and remembers summarization sessions against a fixed set of owners.

    Parameters
    ----------
    owners : sequence of OwnerEndpoint
    policy : CuratorPolicy, optional
        Limits on requests, work and retention (default: :class:`CuratorPolicy` defaults).
    store : CuratorStore, optional
        Durable sessions and charges; ``None`` keeps everything in memory (in-process runs).
    call_timeout : float, optional
        Seconds after which an owner that has not answered a call is dropped.
    sketches : SketchCatalog, optional
        The curator's sketch catalogue; ``None`` when the curator keeps none.
    allocation_spec : str, optional
        The catalogue's RFF spec whose sketches the candidates method's allocation reads
        (``SketchCatalog.published(owner_names, spec=allocation_spec)``, once per session): its
        columns must be the owners' summarization features, in order. Without it (or without a
        catalogue, or when some owner has published no sketch under it) a candidates session
        uses the counts allocation, and its report says why.
    clock : callable
        Unix time, seconds (injected by tests).
    signing_key : EC or Ed25519 private key, optional
        The curator's certificate key: with it and a store, every quoted session is settled
        (:mod:`dpmarket.curator.settlement`): its statement signed, stored and delivered to its
        owners. Without it (plaintext transport, in-process runs) nothing is settled.

    Raises
    ------
    InvalidArgumentError
        If ``allocation_spec`` is given without a catalogue, or names no RFF spec of it.
    """

    def __init__(
        self,
        owners: Sequence[OwnerEndpoint],
        *,
        policy: CuratorPolicy | None = None,
        store: CuratorStore | None = None,
        call_timeout: float | None = None,
        sketches: SketchCatalog | None = None,
        allocation_spec: str | None = None,
        clock: Callable[[], float] = time.time,
        signing_key: PrivateKey | None = None,
    ) -> None:
        if allocation_spec is not None:
            if sketches is None:
                raise InvalidArgumentError("an allocation sketch spec needs a sketch catalogue")
            if sketches.spec(allocation_spec).kind != "rff":
                raise InvalidArgumentError(
                    f"the allocation reads RFF sketches; {allocation_spec!r} is a "
                    f"{sketches.spec(allocation_spec).kind} spec"
                )
        self.owners = list(owners)
        self.allocation_spec = allocation_spec
        self.policy = policy if policy is not None else CuratorPolicy()
        self.store = store
        self.sketches = sketches
        self.call_timeout = call_timeout
        self.clock = clock
        self.signing_key = signing_key
        self._sessions: dict[str, _Managed] = {}
        self._starting = 0
        self.rate = RequestRate(self.policy.per_consumer_per_minute, clock=clock)
        self._request_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._deliveries: set[asyncio.Task[int]] = set()
        if store is not None:
            for session_id in store.recover(ttl=self.policy.result_ttl_seconds):
                logger.warning(
                    "session %s was running when the curator stopped: marked failed, its "
                    "charges kept",
                    short_id(session_id),
                )

    @property
    def running(self) -> int:
        """Sessions running now (created and not finished)."""
        return sum(1 for m in self._sessions.values() if not m.finished)

    def stages(self) -> dict[SessionStage, int]:
        """How many of the sessions this manager holds (running, or finished and not yet
        expired) are at each stage (``setup`` before the first progress event)."""
        counts: dict[SessionStage, int] = {}
        for managed in list(self._sessions.values()):
            last = managed.final or (managed.events[-1] if managed.events else None)
            stage: SessionStage = "setup" if last is None else last.stage
            counts[stage] = counts.get(stage, 0) + 1
        return counts

    # ------------------------------------------------------------------------------- create
    async def create(
        self,
        request: SessionRequest,
        *,
        consumer: str = "consumer:local",
        request_id: str = "",
        request_digest: str = "",
    ) -> str:
        """Check a request against the policy and the owners, then start it in the background.

        Parameters
        ----------
        request : SessionRequest
            The consumer's request: the method's configuration, D_v of shape (m, n), the seed
            set (n0, n), the seed, the owners it leaves out and the fewest it may open with (by
            default every owner it asks), its schema and the parameters of other methods it
            carried (which the policy bounds too).
        consumer : str
            The caller's verified identity, ``"consumer:NAME"``.
        request_id : str
            Idempotency key (empty: none). A retry with the same key and digest returns the same
            session and charges nothing new.
        request_digest : str
            Digest of the request without its key.

        Returns
        -------
        str
            The session id (128 random bits, hex).

        Raises
        ------
        PermissionDeniedError
            If the request is seeded and seeded sessions are not allowed.
        InvalidArgumentError
            For a parameter outside the policy, a malformed key, a key reused with another
            request, an owner selection naming an unknown owner, excluding every owner or
            asking for more owners than remain, or what :meth:`SummarizationSession.prepare`
            refuses.
        ResourceExhaustedError
            If the policy's sessions are running, or the consumer exceeds its request rate.
        FailedPreconditionError, UnavailableError
            From :meth:`SummarizationSession.prepare` (an owner refuses the terms; no owner
            answers). Nothing is released or charged when this raises.
        """
        if request_id:
            if len(request_id) > MAX_REQUEST_ID_LENGTH or not (
                request_id.isascii() and request_id.isprintable()
            ):
                raise InvalidArgumentError(
                    f"request_id must be 1 to {MAX_REQUEST_ID_LENGTH} printable ASCII characters"
                )
            key = (consumer, request_id)
            lock = self._request_locks.setdefault(key, asyncio.Lock())
            async with lock:
                existing = self._find_request(consumer, request_id)
                if existing is not None:
                    found_id, digest = existing
                    if digest != request_digest:
                        raise InvalidArgumentError(
                            f"request_id {request_id!r} was already used for another request"
                        )
                    logger.info("session %s: retried request, nothing new", short_id(found_id))
                    return found_id
                return await self._create(request, consumer, request_id, request_digest)
        return await self._create(request, consumer, None, request_digest)

    async def quote(self, request: SessionRequest, *, consumer: str = "consumer:local") -> Quote:
        """Quote a request without running it: its checks and quote as :meth:`create` computes
        them before it opens the session (:meth:`SummarizationSession.prepare` with
        ``quote_only``). Asks the owners for their descriptions only; nothing is released,
        charged or stored, and no session is created.

        Raises
        ------
        PermissionDeniedError, InvalidArgumentError, ResourceExhaustedError
            As :meth:`create` (the consumer's request rate counts quotes too).
        FailedPreconditionError, UnavailableError
            As :meth:`create` before it opens the session: the schemas differ, the quote
            exceeds ``request.max_cost``
            (:class:`~dpmarket.common.market.pricing.CostCapExceededError`), no owner answers.
        """
        managed = _Managed(session_id=new_session_id(), consumer=consumer, session=None)
        session = self._checked_session(request, managed)
        await wait_for_owners([slot.endpoint for slot in session.state.slots])
        await session.prepare(check_terms=self.policy.check_terms, quote_only=True)
        assert session.quote is not None
        return session.quote

    async def methods(self) -> list[MethodOffer]:
        """Which summarization methods the deployment serves, before anything is asked: the
        curator's policy's methods, and for each the owners whose published access
        (:class:`~dpmarket.common.summarization.endpoints.OwnerAccess`, GetOwnerInfo) refuses
        it (:func:`~dpmarket.common.summarization.terms.access_refusal`, the checks an owner
        makes at OpenSession). Asks the owners for their descriptions only.

        Raises
        ------
        UnavailableError
            If no owner answers.
        """
        await wait_for_owners(self.owners)
        infos = await asyncio.gather(*(o.info() for o in self.owners), return_exceptions=True)
        answered = {o.name: i for o, i in zip(self.owners, infos, strict=True)
                    if not isinstance(i, BaseException)}  # fmt: skip
        if not answered:
            raise UnavailableError("no owner answered (GetOwnerInfo): the methods are not known")
        silent = [o.name for o in self.owners if o.name not in answered]
        offers = []
        for method in METHODS:
            if method not in self.policy.methods:
                served = ", ".join(self.policy.methods)
                reason = f"this curator's policy does not serve it (it serves {served})"
                offers.append(MethodOffer(method, False, reason))
                continue
            why: dict[str, list[str]] = {}
            for name, info in answered.items():
                refused = None if info.access is None else access_refusal(method, info.access)
                if refused is not None:
                    why.setdefault(refused, []).append(name)
            refusing = tuple(sorted(n for names in why.values() for n in names))
            serving = tuple(sorted(n for n in answered if n not in refusing))
            reasons = [
                f"refused by {', '.join(names)}: {text} in "
                + ("its policy" if len(names) == 1 else "their policies")
                for text, names in why.items()
            ]
            if refusing and serving:
                reasons.append(
                    f"a session can run with {', '.join(serving)} alone (--min-owners "
                    f"{len(serving)} or fewer)"
                )
            if silent:
                reasons.append(f"{', '.join(silent)} did not answer")
            offers.append(MethodOffer(method, not refusing, "; ".join(reasons), serving, refusing))
        return offers

    def quote_of(self, session_id: str, consumer: str) -> Quote | None:
        """The quote a session this manager holds was accepted under (None if unknown here).

        Raises
        ------
        NotFoundError
            If the session is another consumer's.
        """
        managed = self._get(session_id, consumer)
        return None if managed is None else managed.quote

    def _checked_session(self, request: SessionRequest, managed: _Managed) -> SummarizationSession:
        """The session of ``request`` (its arrays checked), once the curator's policy accepts
        the request (seeds, ranges, the consumer's rate); calls no owner.

        Raises
        ------
        PermissionDeniedError, InvalidArgumentError, ResourceExhaustedError
            As :meth:`create`.
        """
        owners = self._select(request.selection)
        if request.seed is not None and not self.policy.allow_seeded_sessions:
            raise PermissionDeniedError(
                "this curator does not accept seeded sessions (start it with "
                "--allow-seeded-sessions for reproducible runs)"
            )
        session = self._session(request, owners, managed)
        # The session's constructor has checked the arrays (shape, NaN/inf); now the policy.
        m, n = session.validation.shape
        values = (m + session.state.seed_set.shape[0]) * n
        self.policy.check_request(request.config, m, values, unread=request.unread)
        self.rate.check(managed.consumer)
        return session

    def _select(self, selection: OwnerSelection) -> list[OwnerEndpoint]:
        """The owners a session asks: the configured ones but those the consumer excludes.

        Raises
        ------
        InvalidArgumentError
            If an excluded name is not an owner of this curator, or no owner is left.
        """
        names = [o.name for o in self.owners]
        unknown = [n for n in selection.exclude if n not in names]
        if unknown:
            raise InvalidArgumentError(
                f"exclude_owners names {', '.join(unknown)}, not owner(s) of this curator "
                f"({', '.join(names)})"
            )
        owners = [o for o in self.owners if o.name not in selection.exclude]
        if not owners:
            raise InvalidArgumentError("exclude_owners leaves no owner to ask")
        return owners

    def _allocation_sketches(
        self, config: SummarizationConfig, owners: Sequence[OwnerEndpoint]
    ) -> dict[str, PrivateSketch]:
        """The owners' sketches a candidates session's allocation reads (empty: counts)."""
        if (
            not isinstance(config, AllocationFields)
            or self.sketches is None
            or self.allocation_spec is None
        ):
            return {}
        return self.sketches.published([o.name for o in owners], spec=self.allocation_spec)

    def _find_request(self, consumer: str, request_id: str) -> tuple[str, str] | None:
        for managed in self._sessions.values():
            if managed.consumer == consumer and managed.request_id == request_id:
                return managed.session_id, managed.request_digest
        if self.store is not None:
            stored = self.store.find_request(consumer, request_id)
            if stored is not None:
                return stored.id, stored.request_digest
        return None

    async def _create(
        self,
        request: SessionRequest,
        consumer: str,
        request_id: str | None,
        request_digest: str,
    ) -> str:
        config = request.config
        store = self.store
        session_id = new_session_id()
        managed = _Managed(
            session_id=session_id,
            consumer=consumer,
            session=None,
            request_id=request_id,
            request_digest=request_digest,
        )
        session = self._checked_session(request, managed)
        owners = [slot.endpoint for slot in session.state.slots]
        if self.running + self._starting >= self.policy.max_running:
            raise ResourceExhaustedError(
                f"this curator runs at most {self.policy.max_running} sessions at once; retry later"
            )
        self._starting += 1
        try:
            # An owner restarted a moment ago (or whose last connection failed) is connected
            # before the session asks it anything, within a bounded wait.
            await wait_for_owners(owners)
            await session.prepare(check_terms=self.policy.check_terms)
            if store is not None:
                try:
                    store.create(
                        session_id,
                        consumer=consumer,
                        request_id=request_id,
                        request_digest=request_digest,
                        method=config.method,
                        config=config.to_json(),
                        market=self._market(session, consumer),
                    )
                    # Where the session is open: a restarted curator asks these owners what
                    # they charged it.
                    store.owners_opened(
                        session_id, session.state.owner_session_id, session.opened_owners()
                    )
                except BaseException:
                    await session.abandon()
                    raise
        finally:
            self._starting -= 1
        managed.session = session
        managed.quote = session.quote
        self._sessions[session_id] = managed
        managed.task = asyncio.create_task(self._run(managed))
        logger.info(
            "session %s for %s: %s summary of %d points for %d validation points",
            short_id(session_id),
            consumer,
            config.method,
            config.summary_size,
            session.validation.shape[0],
        )
        return session_id

    @staticmethod
    def _market(session: SummarizationSession, consumer: str) -> SessionMarket | None:
        """What the session's settlement depends on (None: not quoted)."""
        state = session.state
        if state.quote is None or state.settlement is None:
            return None
        quoted = {line.owner for line in state.quote.lines}
        prices = {
            state.owner_name(i): state.info(i).prices
            for i, slot in enumerate(state.slots)
            if slot.info is not None and state.owner_name(i) in quoted
        }
        return SessionMarket(
            owner_session=state.owner_session_id,
            consumer=consumer,
            quote=state.quote,
            prices=prices,
            settlement=state.settlement,
        )

    def _session(
        self, request: SessionRequest, owners: list[OwnerEndpoint], managed: _Managed
    ) -> SummarizationSession:
        """The session of ``request`` against ``owners``, recording its progress in
        ``managed`` and its charges in the store (checks the arrays, calls no owner)."""
        session_id = managed.session_id

        def record(event: ProgressEvent) -> None:
            if event.finished:  # published by _run once the report is set
                managed.final = event
                return
            managed.events.append(event)
            asyncio.get_running_loop().create_task(_notify(managed.changed))

        store = self.store
        return SummarizationSession(
            request,
            owners,
            SessionContext(
                session_id=session_id,
                owner_session_id=new_session_id(),
                consumer=managed.consumer,
                call_timeout=self.call_timeout,
                owner_sketches=self._allocation_sketches(request.config, owners),
                allocation_spec=self.allocation_spec,
                on_progress=record,
                on_charge=None if store is None else lambda c: store.record_charges(session_id, c),
                on_owner_spend=(
                    None
                    if store is None
                    else lambda owner, spend: store.record_owner_spend(session_id, owner, spend)
                ),
            ),
        )

    async def _run(self, managed: _Managed) -> None:
        session = managed.session
        assert session is not None
        ttl = self.policy.result_ttl_seconds
        try:
            result = await session.run()
            if self.store is not None:
                release, withheld = self._payouts(managed.session_id, session, result)
                settlement = self._settle(managed.session_id, _delivered(result), release, withheld)
                cost = None if settlement is None else settlement.statement.total
                report = dataclasses.replace(
                    result.report, cost=cost, ledger=session.ledger_report()
                )
                result = dataclasses.replace(result, report=report)
                # The statement is stored in the transaction that completes the session.
                self.store.finish(
                    managed.session_id,
                    result,
                    ttl=ttl,
                    settlement=settlement,
                    payout=_payout_json(release, withheld),
                )
        except DPMarketError as exc:
            self._failed(managed, session, str(exc))
            logger.warning("session %s failed: %s", short_id(managed.session_id), exc)
        except Exception:
            logger.exception("session %s crashed", short_id(managed.session_id))
            self._failed(managed, session, "internal error; see the curator log")
        else:
            managed.result = result
            managed.report = result.report
            logger.info(
                "session %s done: %d points accessed",
                short_id(managed.session_id),
                result.report.owner_points_accessed,
            )
        managed.expires_at = self.clock() + ttl
        if self.store is not None:
            if managed.error is not None:  # a failed session settles what it released
                self._settle_failed(managed.session_id)
            # Each owner's part is delivered off the consumer's path (a restart delivers again
            # what was not recorded: the statement is durable already).
            task = asyncio.create_task(self.deliver_statements(managed.session_id))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)
        final = managed.final
        if final is None:  # pragma: no cover - the session always emits its last event
            stage: SessionStage = "failed" if managed.error is not None else "done"
            final = ProgressEvent(stage, session.rounds_done, 1, session.points_accessed, "")
        managed.events.append(final)
        managed.session = None  # free the validation set, features and owner handles
        await _notify(managed.changed)

    def _failed(self, managed: _Managed, session: SummarizationSession, error: str) -> None:
        report = session.failure_report(error)
        managed.error = error
        managed.report = report
        if self.store is not None:
            try:
                self.store.fail(
                    managed.session_id, error, report, ttl=self.policy.result_ttl_seconds
                )
            except Exception:  # the charges are stored; a restart marks the session failed
                logger.exception("session %s: recording the failure", short_id(managed.session_id))
        session.fail(error)

    # -------------------------------------------------------------------------- settlement
    def _payouts(
        self, session_id: str, session: SummarizationSession, result: SummaryResult
    ) -> tuple[PayoutRelease | None, str]:
        """The payout release the session's terms fix, its validation charge recorded first
        (:func:`~dpmarket.curator.settlement.payout_release`), and why it was withheld ("" when
        it was not): None without one, without a key (nothing is settled), or when the
        validation set's ledger refuses its charge (logged; the statement is then written
        without it and says so, ``StatementHeader.payout_withheld``, nothing raised)."""
        if self.store is None or self.signing_key is None:
            return None, ""
        market = self.store.market(session_id)
        if market is None:
            return None, ""
        state = session.state
        made = payout_release(
            market,
            state.kernel_points(result.points),
            result.owner_ids,
            state.kernel_validation,
            state.config.gamma,
            state.noise,
        )
        if made is None:
            return None, ""
        release, charges = made
        on = {party: [c for c in charges if c.party == party] for party in ("validation", "owners")}
        # What every owner that released a point charged its own ledger for the release before
        # that point left (whether or not the release then happens): the session's ledger
        # recorded it when the first point arrived (SessionState.points_arrived), so that a
        # session that fails states it too; recorded here only if it was not.
        if not state.payout_recorded:
            state.ledgers["owners"].charge(on["owners"])
            state.payout_recorded = True
        try:
            state.ledgers["validation"].charge(on["validation"])  # durable before values leave
        except DPMarketError as exc:
            logger.warning("session %s: no payout release: %s", short_id(session_id), exc)
            return None, (
                "the payout release's charge on the consumer's validation set was refused at "
                "settlement; no value and no reward were released"
            )
        return release, ""

    def _settle(
        self,
        session_id: str,
        delivered: dict[str, int],
        release: PayoutRelease | None = None,
        withheld: str = "",
    ) -> SignedSettlement | None:
        """The session's signed statement from its stored market and its owners' stored
        records, or None (not quoted, no key, or an owner's record not known yet: settled
        later, by :meth:`settle_pending`). Never raises: a settlement that fails is logged and
        the session stays unsettled."""
        if self.store is None or self.signing_key is None:
            return None
        try:
            market = self.store.market(session_id)
            if market is None:
                return None
            spends = self.store.owner_spend(session_id)
            return settle_session(
                market, spends, delivered, self.signing_key, release, withheld=withheld
            )
        except Exception:
            logger.exception("session %s: settling it failed", short_id(session_id))
            return None

    def _settle_failed(self, session_id: str) -> None:
        settlement = self._settle(session_id, {})
        if settlement is not None and self.store is not None:
            self.store.record_settlement(session_id, settlement)

    def settle_pending(self) -> int:
        """Settle every finished session, and every CAPE job that charged, that has no
        statement yet and whose owners' records are all known (after a restart: those it
        interrupted, once their owners answered; any finished one without a statement is
        settled here, once); return how many were settled."""
        if self.store is None or self.signing_key is None:
            return 0
        settled = 0
        for session_id in self.store.unsettled():
            delivered = self.store.delivered_points(session_id)
            if delivered is None:
                logger.warning(
                    "session %s: its summary expired before it was settled", short_id(session_id)
                )
                continue
            release, withheld = None, ""
            payout = self.store.payout(session_id)
            market = self.store.market(session_id)
            if payout is not None and "withheld" in payout:
                withheld = str(payout["withheld"])
            elif payout is not None and market is not None:
                release = release_from_json(payout, market.settlement)
            settlement = self._settle(session_id, delivered, release, withheld)
            if settlement is not None and self.store.record_settlement(session_id, settlement):
                self.store.refresh_owner_spend(session_id)
                settled += 1
        return settled

    async def deliver_statements(self, session_id: str | None = None) -> int:
        """Deliver every owner's part of a settled statement it has not recorded yet (only
        ``session_id``'s, if given); return how many were recorded. An owner that refuses
        (its records differ) or cannot be reached keeps its part pending (the background
        retry, :meth:`retry_settlement`, delivers it again); a part recorded before is recorded
        once (the owner says so)."""
        if self.store is None:
            return 0
        pending = [
            row for row in self.store.undelivered() if session_id is None or row[0] == session_id
        ]
        return sum(await self._deliver(pending))

    async def _deliver(self, rows: Sequence[tuple[str, str, bytes, bytes]]) -> list[bool]:
        """Deliver each ``(session, owner, part, signature)``; whether each owner recorded it
        (marked delivered in the store)."""
        by_name = {o.name: o for o in self.owners}

        async def deliver(session: str, owner: str, data: bytes, signature: bytes) -> bool:
            endpoint = by_name.get(owner)
            record = getattr(endpoint, "record_statement", None)
            if record is None:
                return False
            try:
                coro = record(data, signature)
                timeout = self.call_timeout
                await (coro if timeout is None else asyncio.wait_for(coro, timeout))
            except (DPMarketError, TimeoutError) as exc:
                logger.warning(
                    "session %s: owner %s did not record its statement: %s",
                    short_id(session),
                    owner,
                    exc,
                )
                return False
            assert self.store is not None
            self.store.mark_delivered(session, owner)
            return True

        return list(await asyncio.gather(*(deliver(*row) for row in rows)))

    async def retry_settlement(self, schedule: RetrySchedule, now: float | None = None) -> int:
        """One pass of the background settlement: what a session's end left undone, retried
        while the curator runs, each piece on its own exponential backoff (``schedule``).

        Asks every owner whose record of a finished session or CAPE job is unknown (it could
        not be reached when it closed, or a restart interrupted it) for its ledger's record
        (``CloseSession``, or ``CloseCapeJob`` for a job, which a restarted owner answers from
        its ledger), settles the sessions and jobs whose records are then all known
        (:meth:`settle_pending`), and delivers every owner's part not recorded yet. Each step
        is idempotent (a record is an update, a session has one statement, an owner records a
        part once), and everything it needs is in the store, so a curator killed during a pass
        loses nothing and pays nothing twice; the next pass, or the restart's
        :meth:`reconcile`, takes up what is left.

        Parameters
        ----------
        schedule : RetrySchedule
            When each piece is due again (kept across passes; forgotten at a restart).
        now : float, optional
            ``time.monotonic()`` by default.

        Returns
        -------
        int
            Records got and parts recorded in this pass.
        """
        if self.store is None:
            return 0
        now = time.monotonic() if now is None else now
        unrecorded = self.store.unrecorded_owner_sessions()
        asked = [r for r in unrecorded if schedule.due(("record", r[0], r[1]), now)]
        got = await self._ask_records(asked)
        for (sid, owner, _, _), ok in zip(asked, got, strict=True):
            schedule.outcome(("record", sid, owner), ok, now)
        if any(got):
            self.settle_pending()
        undelivered = self.store.undelivered()
        due = [r for r in undelivered if schedule.due(("deliver", r[0], r[1]), now)]
        done = await self._deliver(due)
        for (sid, owner, _, _), ok in zip(due, done, strict=True):
            schedule.outcome(("deliver", sid, owner), ok, now)
        schedule.keep(
            {("record", r[0], r[1]) for r in unrecorded}
            | {("deliver", r[0], r[1]) for r in undelivered}
        )
        return sum(got) + sum(done)

    async def settle_forever(self, schedule: RetrySchedule | None = None) -> None:
        """Run :meth:`retry_settlement` every ``schedule.base`` seconds until cancelled (a pass
        that fails is logged; the next one runs)."""
        schedule = RetrySchedule() if schedule is None else schedule
        while True:
            await asyncio.sleep(schedule.base)
            try:
                await self.retry_settlement(schedule)
            except Exception:
                logger.exception("retrying the settlement of finished sessions")

    def statements(
        self, consumer: str, *, session_id: str | None = None, limit: int | None = None
    ) -> list[StoredStatement]:
        """The consumer's settlement statements, newest first (:meth:`CuratorStore.statements`);
        empty without a store."""
        if self.store is None:
            return []
        return self.store.statements(consumer, session_id=session_id, limit=limit)

    # ----------------------------------------------------------------------------- lookups
    def _get(self, session_id: str, consumer: str) -> _Managed | None:
        managed = self._sessions.get(session_id)
        if managed is not None and managed.consumer != consumer:
            raise NotFoundError(f"unknown session {short_id(session_id)}")
        return managed

    def _stored(self, session_id: str, consumer: str) -> StoredSession:
        stored = None if self.store is None else self.store.get(session_id)
        if stored is None or stored.consumer != consumer:
            raise NotFoundError(f"unknown session {short_id(session_id)}")
        return stored

    async def watch(
        self, session_id: str, consumer: str = "consumer:local"
    ) -> AsyncIterator[tuple[ProgressEvent, SessionReport | None]]:
        """Yield every progress event of a session, past and future, until it ends.

        The last event comes with the session's report (ledger included), whether it succeeded
        or failed.

        Raises
        ------
        NotFoundError
            If the session is unknown, expired, or another consumer's.
        """
        managed = self._get(session_id, consumer)
        if managed is None:
            stored = self._stored(session_id, consumer)
            if stored.report is None:
                raise NotFoundError(f"session {short_id(session_id)} has expired")
            stage: SessionStage = "done" if stored.status == "done" else "failed"
            size = stored.report.summary_size
            event = ProgressEvent(
                stage,
                stored.report.rounds,
                max(stored.report.rounds, 1),
                stored.report.owner_points_accessed,
                stored.error or f"summary of {size} points",
            )
            yield event, stored.report
            return
        sent = 0
        while True:
            async with managed.changed:
                await managed.changed.wait_for(lambda: len(managed.events) > sent)  # noqa: B023
            while sent < len(managed.events):
                event = managed.events[sent]
                sent += 1
                if event.finished:
                    yield event, managed.report
                    return
                yield event, None

    def result(self, session_id: str, consumer: str = "consumer:local") -> SummaryResult:
        """Return a finished session's summary; it then expires after the fetched-result TTL.

        Raises
        ------
        NotFoundError
            If the session is unknown, expired, or another consumer's.
        FailedPreconditionError
            If it is still running.
        AbortedError
            If it failed; the message says why.
        """
        managed = self._get(session_id, consumer)
        fetched_ttl = self.policy.fetched_result_ttl_seconds
        if managed is not None:
            if managed.error is not None:
                raise AbortedError(f"session {short_id(session_id)} failed: {managed.error}")
            if managed.result is None:
                done = managed.session.rounds_done if managed.session is not None else 0
                raise FailedPreconditionError(
                    f"session {short_id(session_id)} is still running (round {done})"
                )
            managed.expires_at = min(managed.expires_at, self.clock() + fetched_ttl)
            if self.store is not None:
                self.store.mark_fetched(session_id, ttl=fetched_ttl)
            return managed.result
        stored = self._stored(session_id, consumer)
        if stored.status == "failed":
            raise AbortedError(f"session {short_id(session_id)} failed: {stored.error}")
        assert self.store is not None
        result = self.store.result(session_id)
        if result is None:
            raise NotFoundError(f"session {short_id(session_id)} has expired")
        self.store.mark_fetched(session_id, ttl=fetched_ttl)
        return result

    # ------------------------------------------------------------------------------ expiry
    def expire(self) -> int:
        """Forget finished sessions past their expiry (memory and store); return how many."""
        now = self.clock()
        gone = [sid for sid, m in self._sessions.items() if m.finished and m.expires_at <= now]
        for sid in gone:
            managed = self._sessions.pop(sid)
            if managed.request_id is not None:
                self._request_locks.pop((managed.consumer, managed.request_id), None)
        stored = self.store.expire() if self.store is not None else 0
        for sid in gone:
            logger.info("session %s expired", short_id(sid))
        return max(len(gone), stored)

    async def reconcile(self) -> int:
        """Ask the owners what they recorded for the sessions a restart interrupted (and the
        finished sessions whose owner could not be reached when they closed), and record it
        (the stored reports then carry it); return how many records were got.

        A restarted curator calls this once it serves: each owner at which such a session was open
        closes it (freeing it at once) and answers with its ledger's record, also for a session it
        already closed for being idle. An owner that cannot be reached keeps its mark (e.g.
        :data:`~dpmarket.common.privacy.ledger.UNKNOWN_RESTARTED`; the session's report says so)
        and is asked again by the background retry (:meth:`retry_settlement`).
        """
        if self.store is None:
            return 0
        pending = self.store.unrecorded_owner_sessions()
        by_name = {o.name: o for o in self.owners}
        wanted = [by_name[o] for o in dict.fromkeys(r.owner for r in pending) if o in by_name]
        await wait_for_owners(wanted)
        got = await self._ask_records(pending)
        # Sessions the restart interrupted are settled from the owners' records, and every
        # statement not yet recorded by its owners is delivered again.
        self.settle_pending()
        await self.deliver_statements()
        if pending:
            logger.info(
                "owners' records of %d interrupted session(s): %d of %d got",
                len({r.session for r in pending}),
                sum(got),
                len(pending),
            )
        return sum(got)

    async def _ask_records(self, rows: Sequence[UnrecordedOwner]) -> list[bool]:
        """Ask the owner of each row for its ledger's record of the session or CAPE job
        (``CloseSession`` or ``CloseCapeJob``, which also frees it there, and which an owner
        answers from its ledger when it no longer holds it) and store it; whether each was got.
        The reports of the sessions and jobs concerned are refreshed."""
        assert self.store is not None
        store = self.store
        by_name = {o.name: o for o in self.owners}
        timeout = self.call_timeout

        async def ask(session_id: str, owner: str, owner_session: str, cape: bool) -> bool:
            endpoint = by_name.get(owner)
            close = getattr(endpoint, "close_job" if cape else "close_session", None)
            if close is None:
                return False
            try:
                coro = close(owner_session)
                spend = await (coro if timeout is None else asyncio.wait_for(coro, timeout))
            except (DPMarketError, TimeoutError) as exc:
                logger.warning(
                    "session %s: owner %s's record stays unknown: %s",
                    short_id(session_id),
                    owner,
                    exc,
                )
                return False
            store.record_owner_spend(session_id, owner, spend)
            return True

        got = list(await asyncio.gather(*(ask(*row) for row in rows)))
        for session_id in dict.fromkeys(r[0] for r, ok in zip(rows, got, strict=True) if ok):
            store.refresh_owner_spend(session_id)
        return got

    async def expire_forever(self, period: float) -> None:
        """Run :meth:`expire` every ``period`` seconds until cancelled."""
        while True:
            await asyncio.sleep(period)
            self.expire()

    async def close(self) -> None:
        """Cancel running sessions (their owners' sessions are closed) and wait for them."""
        tasks: list[asyncio.Task[Any]] = [
            m.task for m in self._sessions.values() if m.task is not None and not m.task.done()
        ]
        tasks += [task for task in self._deliveries if not task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _payout_json(release: PayoutRelease | None, withheld: str) -> dict[str, Any] | None:
    """What the store keeps of the session's payout: the release, or why it was withheld (so
    that a settlement after a restart states the same), or None."""
    if release is not None:
        return release_to_json(release)
    return {"withheld": withheld} if withheld else None


def _delivered(result: SummaryResult) -> dict[str, int]:
    """Points of each owner in a summary."""
    counts: dict[str, int] = {}
    for owner in result.owner_ids:
        counts[owner] = counts.get(owner, 0) + 1
    return counts


async def _notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()
