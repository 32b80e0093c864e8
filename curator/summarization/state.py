"""The state of one summarization session, which its method's stages read and update.

:class:`SessionState` holds what a session knows (its request, its owners, its randomness and
ledgers) and what it has done so far (points accessed, rounds, the terms offered); the method's
strategy (:mod:`~dpmarket.curator.summarization.strategy`) and the offer to the owners
(:mod:`~dpmarket.curator.summarization.terms`) act on it, and
:class:`~dpmarket.curator.summarization.session.SummarizationSession` runs them in order. The state
also calls the owners: concurrently, with a deadline, dropping those that fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import (
    AbortedError,
    BudgetRefusedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from dpmarket.common.ids import short_id
from dpmarket.common.market.payouts import PAYOUT_CHARGE_LABEL
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import owner_payout_event
from dpmarket.common.privacy.ledger import (
    UNKNOWN_NOT_RETURNED,
    UNKNOWN_UNREACHABLE,
    Charge,
    PrivacyLedger,
    SessionSpend,
)
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.common.privacy.rng import make_rng
from dpmarket.common.sketches import PrivateSketch, RFFMap
from dpmarket.common.summarization.endpoints import OwnerEndpoint, OwnerInfo
from dpmarket.common.summarization.rff import FeatureScaling, RFFParams, kernel_points
from dpmarket.common.summarization.summary import ProgressEvent, SessionRequest
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.common.validation import check_matrix
from dpmarket.curator.disclosure import (
    NoAnswerError,
    owner_failed,
    public_error,
    public_reason,
    public_text,
)

__all__ = [
    "OwnerSlot",
    "Party",
    "ProgressCallback",
    "SessionContext",
    "SessionState",
    "SummaryState",
    "rows_received",
]

logger = logging.getLogger("dpmarket.curator.summarization.session")

Party = Literal["validation", "owners", "public"]

T = TypeVar("T")
#: What an owner's call raises when it refuses a step (``owner_failed`` is False).
_REFUSALS = (FailedPreconditionError, InvalidArgumentError)


ProgressCallback = Callable[[ProgressEvent], None]

#: A step whose work is a pass over the owner's table (its deadline scales with the table).
OwnerStep = Literal["call", "open", "bid", "count", "candidates", "sample"]
#: Seconds per declared row a pass over an owner's table is allowed, on top of the call timeout:
#: 50 us, 20,000 rows/s, several times below the h1 throughput ``make bench`` measures on one
#: loaded core (bench/owner_scale.py), so that a slow owner is not dropped for its size.
SECONDS_PER_ROW = 50e-6
#: How many times its deadline an owner that keeps reporting progress may take.
PROGRESS_GRACE = 10.0


def stage_deadline(call_timeout: float, rows: int, stage: OwnerStep) -> float:
    """Seconds an owner has to answer a call of ``stage`` before its progress is asked for:
    the call timeout, plus :data:`SECONDS_PER_ROW` per declared row for a pass over its table.

    Parameters
    ----------
    call_timeout : float
        Seconds, > 0 (``curator serve --owner-timeout``).
    rows : int
        The owner's declared row count (``GetOwnerInfo``: public).
    stage : str
        ``"call"`` for a round trip; any other stage is a pass over the table.
    """
    if stage == "call":
        return call_timeout
    return call_timeout + SECONDS_PER_ROW * max(int(rows), 0)


def rows_received(replies: Mapping[int, tuple[NDArray[np.float64], object]]) -> int:
    """The rows (raw points or hashes) of the owners' ``(rows, labels)`` replies, whatever
    their shape (a reply that is not a matrix counts its first axis, or 0)."""
    return sum(int(np.shape(rows)[0]) if np.ndim(rows) else 0 for rows, _ in replies.values())


@dataclass
class OwnerSlot:
    """One owner as the session sees it: its endpoint, description and standing."""

    endpoint: OwnerEndpoint
    info: OwnerInfo | None = None
    active: bool = True
    note: str = ""
    #: Whether the owner holds an open session of ours (to close at the end).
    opened: bool = False
    #: The most raw points this session may receive from the owner (its policy).
    max_points: int = 0
    #: What the owner's own ledger recorded for this session, from CloseSession.
    spent: SessionSpend | None = None
    #: Why the session runs without the owner, in public words (``LEFT_OUT_REASONS``).
    left_out: str = ""
    #: A refusal of the session's terms by the owner's policy (not its budget), in the owner's
    #: own text, which depends on the terms and the policy only (it names the policy key).
    refusal: str = ""


@dataclass
class SummaryState:
    """The summary points collected so far, with their labels and owners (slot indices)."""

    points: list[NDArray[np.float64]] = field(default_factory=list)
    labels: list[int | None] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    #: The hashes mode: h1 hashes of the summary points under the owners' secret map.
    hashes: list[NDArray[np.float64]] = field(default_factory=list)


@dataclass(frozen=True)
class SessionContext:
    """Where a session runs: what the curator adds to the consumer's request.

    Attributes
    ----------
    session_id : str
        Unique id (the consumer's handle).
    owner_session_id : str or None
        The id the owners know the session by (default ``session_id``); the curator service
        gives owners an id unrelated to the consumer's.
    consumer : str
        Identity (``"consumer:NAME"``) of the consumer the session serves; owners record it.
    call_timeout : float or None
        Seconds after which an owner that has not answered a call is dropped (None: never).
    owner_sketches : mapping of str to PrivateSketch
        The owners' published RFF sketches by owner id (the curator service passes its
        catalogue's; in-process runs pass sketches released directly, which charge no owner's
        ledger). The candidates method splits its budget by them (``allocation="sketch"``) when
        every owner that opens the session has one; otherwise, and when empty, by the owners'
        noisy relevance counts. Their publication was charged to their owners' ledgers; the
        session only post-processes them.
    allocation_spec : str or None
        The catalogue spec ``owner_sketches`` were published under (the curator service's
        ``--allocation-sketch-spec``), named in the report when an owner has none.
    on_progress : callable or None
        Called with a :class:`ProgressEvent` after setup and after every round.
    on_charge : callable or None
        Receives every charge to the session's ledgers before the release it pays for (the
        curator service writes them to its durable store).
    on_owner_spend : callable or None
        ``on_owner_spend(owner, spend)`` as soon as the session is closed at an owner: what its
        ledger recorded, or why that is unknown (the curator service stores it durably).
    """

    session_id: str = "session"
    owner_session_id: str | None = None
    consumer: str = "consumer:local"
    call_timeout: float | None = None
    owner_sketches: Mapping[str, PrivateSketch] = field(default_factory=dict)
    allocation_spec: str | None = None
    on_progress: ProgressCallback | None = None
    on_charge: Callable[[Sequence[Charge]], None] | None = None
    on_owner_spend: Callable[[str, SessionSpend], None] | None = None


class SessionState:
    """What one session knows and has done: the request, the owners, randomness and ledgers.

    Parameters
    ----------
    request : SessionRequest
        The consumer's request. Its seed seeds every random draw (h1's parameters,
        quantization, MWEM, auction coins, the owners' sampling seeds) and every noise draw
        (``SeededNoise``); without one, a CSPRNG-seeded generator and OpenDP's samplers.
    owners : sequence of OwnerEndpoint
    context : SessionContext

    Attributes
    ----------
    config : SummarizationConfig
        The request's configuration.
    validation, seed_set : ndarray
        The checked validation set (m, n) and seed set (n0, n).
    slots : list of OwnerSlot
        The owners, in the order given; stages refer to an owner by its index here.
    ledgers : dict of str to PrivacyLedger
        ``"validation"`` and ``"owners"`` (their slack the method's
        :meth:`~dpmarket.common.summarization.methods.SummarizationConfig.ledger_deltas`): every
        release is charged here before it is sent.
    terms : OwnerTerms or None
        What the session offered the owners (set while preparing).
    rff : RFFParams or None
        h1's parameters (drawn when the session opens at the owners).
    total_rounds : int
        Rounds the method runs (1, or p for the per-round methods), for progress events.
    rounds_done, summary_size, points_accessed, rejected_points : int
        Progress: rounds completed, summary points collected, raw owner points received,
        released points rejected by verification.
    round_seconds : list of float
        Wall time of each round.

    Raises
    ------
    InvalidArgumentError
        If the validation or seed set is malformed (shape, NaN/inf, feature counts differ), a
        sketch is not an RFF sketch over the validation set's attributes, there is no owner, or
        ``min_owners`` exceeds the owners given.
    """

    def __init__(
        self,
        request: SessionRequest,
        owners: Sequence[OwnerEndpoint],
        context: SessionContext | None = None,
    ) -> None:
        context = context if context is not None else SessionContext()
        try:
            self.validation = check_matrix(request.validation, "validation set")
            seed_set = (
                request.seed_set
                if request.seed_set is not None
                else np.zeros((0, self.validation.shape[1]))
            )
            self.seed_set = check_matrix(
                seed_set, "seed set", n_features=self.validation.shape[1], allow_empty=True
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        self.owner_sketches = dict(context.owner_sketches)
        #: The catalogue spec the sketches were published under (for the report), or None.
        self.allocation_spec = context.allocation_spec
        self._check_sketches()
        if not owners:
            raise InvalidArgumentError("at least one owner is required")
        min_owners = request.selection.min_owners
        if min_owners > len(owners):
            raise InvalidArgumentError(
                f"min_owners={min_owners} exceeds the {len(owners)} owner(s) this session can ask"
            )
        #: The session fails unless this many owners take part when it opens (0: every owner
        #: it asks, :attr:`required_owners`).
        self.min_owners = int(min_owners)
        #: Owners the consumer left out by name (never asked anything).
        self.excluded = tuple(request.selection.exclude)
        self.request = request
        self.config = request.config
        self.session_id = context.session_id
        self.owner_session_id = context.owner_session_id or context.session_id
        self.rng = make_rng(request.seed)
        self.noise: NoiseSource = (
            SeededNoise(self.rng) if request.seed is not None else OpenDPNoise()
        )
        self.consumer = context.consumer
        #: Receives each owner's record of the session (or why there is none) when it closes.
        self.on_owner_spend = context.on_owner_spend
        self.slots = [OwnerSlot(endpoint=o) for o in owners]
        self.on_progress = context.on_progress
        self.call_timeout = context.call_timeout
        delta_validation, delta_owners = self.config.ledger_deltas()
        self.ledgers = {
            "validation": PrivacyLedger(delta_tilde=delta_validation, on_charge=context.on_charge),
            "owners": PrivacyLedger(delta_tilde=delta_owners, on_charge=context.on_charge),
        }
        self.terms: OwnerTerms | None = None
        #: The session's quote and settlement terms (:mod:`dpmarket.common.market.terms`), set
        #: when it is prepared, before any owner is opened.
        self.quote: Quote | None = None
        self.settlement: SettlementTerms | None = None
        #: Whether the owners' payout charge is recorded (:meth:`points_arrived`).
        self.payout_recorded = False
        self.rff: RFFParams | None = None
        #: How the session's kernel reads every point (the schema's public bounds, set when the
        #: session is prepared; None: the features' own units, a session without a schema).
        self.scaling: FeatureScaling | None = None
        self.start = time.perf_counter()
        self.total_rounds = 1
        self.summary_size = 0
        self.points_accessed = 0
        self.rejected_points = 0
        self.rounds_done = 0
        self.round_seconds: list[float] = []
        self.prepared = False

    def kernel_points(self, x: NDArray[np.floating]) -> NDArray[np.floating]:
        """Points of shape (n, n_features) as the session's exact kernel reads them: scaled
        by :attr:`scaling` (:func:`~dpmarket.common.summarization.rff.kernel_points`), the
        same map h1 applies at every owner."""
        return kernel_points(x, self.scaling)

    @property
    def kernel_validation(self) -> NDArray[np.floating]:
        """D_v as the session's exact kernel reads it (:meth:`kernel_points`), shape (m, n)."""
        return self.kernel_points(self.validation)

    def _check_sketches(self) -> None:
        """Every sketch an RFF sketch over the validation set's attributes."""
        for owner, sketch in self.owner_sketches.items():
            if not isinstance(sketch, PrivateSketch) or not isinstance(sketch.feature_map, RFFMap):
                raise InvalidArgumentError(f"the sketch of owner {owner} is not an RFF sketch")
            if sketch.feature_map.n_attributes != self.validation.shape[1]:
                raise InvalidArgumentError(
                    f"the sketch of owner {owner} describes {sketch.feature_map.n_attributes} "
                    f"attributes but the validation set has {self.validation.shape[1]}"
                )

    def finish_round(self, round_: int, started: float) -> None:
        """Record that round ``round_`` (1-based) is done, begun at ``started``
        (``time.perf_counter()``)."""
        self.rounds_done = round_
        self.round_seconds.append(time.perf_counter() - started)

    def points_arrived(self, count: int) -> None:
        """Record, when the session's first raw points (or hashes) arrive from an owner, the
        payout release's charge every owner that released a point made to its own ledger
        before that point left (:func:`~dpmarket.common.market.terms.owner_payout_event`, on
        the ``"owners"`` ledger, labelled :data:`PAYOUT_CHARGE_LABEL`, once per session).
        Recorded here rather than when the release is made, so that a session that fails after
        its owners charged it, or a curator killed then (the charge is durable through the
        ledger's ``on_charge``), still states it in its ledger and report."""
        if count <= 0 or self.payout_recorded or self.settlement is None:
            return
        event = owner_payout_event(self.settlement)
        if event is not None:
            self.ledgers["owners"].charge([Charge("owners", PAYOUT_CHARGE_LABEL, event)])
        self.payout_recorded = True

    def check_points(self, points: NDArray[np.float64], index: int) -> None:
        """Abort when owner ``index`` sent points that are not rows of the validation width.

        Raises
        ------
        AbortedError
            If ``points`` is not of shape ``(k, n)``.
        """
        if points.ndim != 2 or points.shape[1] != self.validation.shape[1]:
            raise AbortedError(
                f"owner {self.owner_name(index)} sent points of shape {points.shape}"
            )

    async def gather(
        self,
        indices: Sequence[int] | range,
        call: Callable[[int], Awaitable[T]],
        *,
        refusals: Literal["drop", "raise", "leave_out"] = "drop",
        stage: OwnerStep = "call",
    ) -> dict[int, T]:
        """Call owners concurrently; leave out those that fail or refuse; return the answers by
        index.

        An owner whose call fails in any way but a refusal
        (:func:`dpmarket.curator.disclosure.owner_failed`: unreachable, a deadline, a reset
        stream, a limit of gRPC's own such as status details above 16 KiB, an internal error) is
        dropped as "unreachable" (a reply refused for its size: as "reply over 1.04 MiB to
        GetOwnerInfo", its method and the curator's limit): no answer of one owner fails the
        request by itself. An owner
        that refuses a step (``FailedPreconditionError``, its budget among them, or
        ``InvalidArgumentError``) is dropped too (``refusals="drop"``, during a session), or
        its refusal fails the request with the same error naming the owner (``"raise"``), or
        it is left out as "budget refused" or "refused the session" (``"leave_out"``, while the
        session opens). The session then requires :attr:`required_owners`. Every reason and
        message names the owner and states its failure publicly
        (:func:`dpmarket.curator.disclosure.public_text`: no address, no budget figure, no text
        of a failure); the curator's log has the owner's answer as one line of at most 500
        characters (:func:`dpmarket.common.texts.peer_text`).

        A round trip (``stage="call"``) has the call timeout. A pass over an owner's table
        (any other ``stage``) has a deadline that scales with the owner's declared rows
        (:func:`stage_deadline`); past it, an owner whose endpoint reports progress
        (``progress(session_id)``, the owner's ``GetProgress``) is kept while its progress grows
        between two checks a call timeout apart, up to :data:`PROGRESS_GRACE` times its deadline;
        one that reports none, or cannot be asked, is dropped and its call cancelled (which
        stops its work).
        """

        async def one(index: int) -> T:
            coro = call(index)
            if self.call_timeout is None:
                return await coro
            info = self.slots[index].info
            rows = info.num_points if info is not None else 0
            limit = stage_deadline(self.call_timeout, rows, stage)
            probe = getattr(self.endpoint(index), "progress", None) if stage != "call" else None
            return await self._supervised(coro, limit, probe, rows)

        answers = await asyncio.gather(*(one(i) for i in indices), return_exceptions=True)
        out: dict[int, T] = {}
        for index, answer in zip(indices, answers, strict=True):
            if not isinstance(answer, BaseException):
                out[index] = answer
                continue
            if not isinstance(answer, DPMarketError):
                raise answer
            # What reaches the consumer (errors, progress messages, the report) is the
            # owner's name and a public text; the whole answer goes to the curator's log.
            name = self.owner_name(index)
            where = f"session {short_id(self.session_id)}, {stage}"
            public = public_error(name, answer, where=where)
            text = public_text(answer)
            if owner_failed(answer):  # the owner failed the step, as one that does not answer
                # "unreachable", or the method and limit of a reply refused for its size.
                self.drop(index, text, public_reason(answer))
            elif not isinstance(answer, _REFUSALS):  # no other failure under that rule
                raise AbortedError(str(public)) from answer
            elif refusals == "drop":
                self.drop(index, f"refused: {text}", "refused a step")
            elif refusals == "leave_out":
                budget = isinstance(answer, BudgetRefusedError)
                reason = "budget refused" if budget else "refused the session"
                self.drop(index, f"refused the session's terms: {text}", reason)
                if not budget:
                    self.slots[index].refusal = text
            else:
                raise public from answer
        return out

    async def _supervised(
        self,
        coro: Awaitable[T],
        limit: float,
        probe: Callable[[str], Awaitable[tuple[str, int, int, int]]] | None,
        rows: int,
    ) -> T:
        """Await ``coro`` for ``limit`` seconds, then as long as ``probe`` shows progress."""
        assert self.call_timeout is not None
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(coro)
        start = loop.time()
        ticks: int | None = None
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
            if done:
                return task.result()
            if probe is None:
                raise NoAnswerError(
                    f"no answer within {limit:.0f} s"
                    + (
                        f" (a deadline scaled to its {rows} rows)"
                        if limit > self.call_timeout
                        else ""
                    )
                )
            while loop.time() - start < PROGRESS_GRACE * limit:
                try:
                    stage, done_units, total, now_ticks = await asyncio.wait_for(
                        probe(self.owner_session_id), self.call_timeout
                    )
                except (DPMarketError, TimeoutError) as exc:
                    raise NoAnswerError(
                        f"no answer within {limit:.0f} s, and no progress report: {exc}"
                    ) from None
                if ticks is not None and now_ticks == ticks:
                    raise NoAnswerError(
                        f"no answer within {loop.time() - start:.0f} s and no progress in the "
                        f"last {self.call_timeout:g} s"
                    )
                ticks = now_ticks
                logger.info(
                    "waiting for a slow owner: %s %d/%d after %.0f s",
                    stage or "step",
                    done_units,
                    total,
                    loop.time() - start,
                )
                done, _ = await asyncio.wait({task}, timeout=self.call_timeout)
                if done:
                    return task.result()
            raise NoAnswerError(
                f"no answer within {PROGRESS_GRACE:g} times its deadline of {limit:.0f} s"
            )
        finally:
            if not task.done():
                task.cancel()

    def drop(self, index: int, reason: str, public: str = "broke the protocol") -> None:
        """Leave owner ``index`` out of the rest of the session, for ``reason`` (logged and
        in error messages) and ``public`` (one of ``LEFT_OUT_REASONS``, in the report)."""
        slot = self.slots[index]
        if slot.active:
            slot.active = False
            slot.note = reason
            slot.left_out = public
            logger.warning("owner %s dropped: %s", self.owner_name(index), reason)
            self.emit("rounds", f"owner {self.owner_name(index)} dropped: {reason}")

    def require_owners(self) -> None:
        """Raise ``UnavailableError`` (with every owner's reason) when every owner dropped out."""
        if not self.active():
            raise UnavailableError("every owner dropped out: " + self.drop_notes())

    @property
    def required_owners(self) -> int:
        """The fewest owners the session may open with: :attr:`min_owners`, or every owner it
        asks (those the consumer did not exclude) when that is 0."""
        return self.min_owners or len(self.slots)

    def require_min_owners(self) -> None:
        """Raise when fewer owners than :attr:`required_owners` remain, saying how many of the
        owners asked were reachable and naming who was left out and why (public reasons).

        Raises
        ------
        UnavailableError
            If an owner that was left out could not be reached (a retry may find it).
        FailedPreconditionError
            If the owners left out refused the session (their budget or policy). A refusal by
            an owner's policy is quoted once per distinct text, after the owners that gave it:
            it names the policy key and what to do (e.g. ``access.allow_steered_selection``),
            and depends on the terms and the policy only (never a budget figure, nor an
            address).
        """
        active = len(self.active())
        required = self.required_owners
        if active >= max(required, 1):
            return
        asked = len(self.slots)
        reachable = sum(1 for s in self.slots if s.left_out != "unreachable")
        left = ", ".join(
            f"{o} ({why})"
            for o, why in self.left_out().items()
            if why != "excluded by the consumer"
        )
        needs = f"all {asked}" if self.min_owners == 0 else f"at least {required}"
        cls = UnavailableError if reachable < asked else FailedPreconditionError
        said: dict[str, list[str]] = {}
        for i, slot in enumerate(self.slots):
            if not slot.active and slot.refusal:
                said.setdefault(slot.refusal, []).append(self.owner_name(i))
        refusals = "".join(f". {', '.join(who)}: {text}" for text, who in said.items())
        raise cls(
            f"{reachable} of the {asked} owner(s) this request asks were reachable and {active} "
            f"can take part; the request needs {needs} (--min-owners N lets it run with N); "
            f"left out: {left}{refusals}"
        )

    def left_out(self) -> dict[str, str]:
        """Every owner the session runs without, with its public reason: those the consumer
        excluded, then those dropped, in the owners' order."""
        out = dict.fromkeys(self.excluded, "excluded by the consumer")
        for i, slot in enumerate(self.slots):
            if not slot.active:
                out[self.owner_name(i)] = slot.left_out or "broke the protocol"
        return out

    def endpoint(self, index: int) -> OwnerEndpoint:
        """Owner ``index``'s endpoint."""
        return self.slots[index].endpoint

    def active(self) -> list[int]:
        """Indices of the owners still in the session."""
        return [i for i, s in enumerate(self.slots) if s.active]

    def capacity(self, index: int) -> int:
        """The most raw points this session may take from owner ``index``: its size, capped by
        its policy's allowance for the session."""
        return min(self.info(index).num_points, self.slots[index].max_points)

    def info(self, index: int) -> OwnerInfo:
        """Owner ``index``'s dataset description (known once the session is being prepared)."""
        info = self.slots[index].info
        assert info is not None
        return info

    def owner_name(self, index: int) -> str:
        """Owner ``index``'s id, or its endpoint's name before it described itself."""
        info = self.slots[index].info
        return info.owner_id if info is not None else self.slots[index].endpoint.name

    def dropped(self) -> tuple[str, ...]:
        """Names of the owners that dropped out."""
        return tuple(self.owner_name(i) for i, s in enumerate(self.slots) if not s.active)

    def drop_notes(self) -> str:
        """``"name: reason; ..."`` for every owner that dropped out."""
        return "; ".join(
            f"{self.owner_name(i)}: {s.note}" for i, s in enumerate(self.slots) if not s.active
        )

    def drop_suffix(self) -> str:
        """``"; dropped owners: ..."`` for an error message, or ``""``."""
        dropped = self.dropped()
        return f"; dropped owners: {', '.join(dropped)}" if dropped else ""

    async def close_owner_sessions(self) -> None:
        """Close the session at every owner that opened it; record what its ledger recorded.

        An owner that cannot be reached (or answers without its record) keeps a place in the
        report, its spend marked unknown with the reason (``SessionSpend.unknown``): a dropped
        owner may have charged the session. Each record, or its absence, goes to
        ``on_owner_spend`` as soon as it is known.
        """

        async def close(index: int, slot: OwnerSlot) -> None:
            slot.opened = False
            try:
                coro = slot.endpoint.close_session(self.owner_session_id)
                if self.call_timeout is not None:
                    slot.spent = await asyncio.wait_for(coro, self.call_timeout)
                else:
                    slot.spent = await coro
            except (DPMarketError, TimeoutError) as exc:
                logger.info("closing the session at %s failed: %s", slot.endpoint.name, exc)
                unreachable = isinstance(exc, UnavailableError | TimeoutError)
                slot.spent = SessionSpend.unknown_because(
                    UNKNOWN_UNREACHABLE if unreachable else UNKNOWN_NOT_RETURNED
                )
            if self.on_owner_spend is not None:
                try:
                    self.on_owner_spend(self.owner_name(index), slot.spent)
                except Exception:  # the report still carries it
                    logger.exception("recording what owner %s charged", self.owner_name(index))

        await asyncio.gather(*(close(i, slot) for i, slot in enumerate(self.slots) if slot.opened))

    def opened_owners(self) -> list[str]:
        """The owners that hold an open session of ours, by name."""
        return [self.owner_name(i) for i, slot in enumerate(self.slots) if slot.opened]

    def emit(self, stage: Literal["setup", "rounds", "done", "failed"], message: str) -> None:
        """Report progress to ``on_progress``, if given."""
        if self.on_progress is not None:
            self.on_progress(
                ProgressEvent(
                    stage, self.rounds_done, self.total_rounds, self.points_accessed, message
                )
            )
