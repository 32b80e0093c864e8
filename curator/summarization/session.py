"""The curator's side of the summarization protocol (Algorithm 3): one session, run by stage.

A :class:`SummarizationSession` drives any sequence of
:class:`dpmarket.common.summarization.endpoints.OwnerEndpoint`
objects: in-process owners (``dpmarket lab simulate``, tests, benchmarks) or gRPC clients (the
curator service). Given the same seed and owners it makes the same random draws in the same order,
so both runs return the same summary bit for bit.

The session keeps its state in a :class:`~dpmarket.curator.summarization.state.SessionState`,
prepares and opens the session at the owners the same way for every method (the terms offered:
:mod:`~dpmarket.curator.summarization.terms`), runs the method's own strategy
(:data:`~dpmarket.curator.summarization.strategies.STRATEGIES`: uniform, greedy, private, rounds,
candidates and its hashes mode), then reports what it accessed and spent.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.common.market.pricing import Quote, check_cap
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import session_quote
from dpmarket.common.privacy.ledger import PrivacyLedger
from dpmarket.common.schema import disagreement
from dpmarket.common.summarization.endpoints import OwnerEndpoint
from dpmarket.common.summarization.kernels import (
    check_validation_set,
    feature_bounds,
    feature_scaling,
)
from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.session_ledger import SessionLedger, TermsReport
from dpmarket.common.summarization.summary import SessionReport, SessionRequest, SummaryResult
from dpmarket.common.summarization.terms import OwnerTerms, reward_refusal
from dpmarket.curator.summarization.state import (
    ProgressCallback,
    SessionContext,
    SessionState,
    SummaryState,
)
from dpmarket.curator.summarization.strategies import strategy_for
from dpmarket.curator.summarization.strategy import Strategy
from dpmarket.curator.summarization.terms import Offer

__all__ = ["ProgressCallback", "SessionContext", "SummarizationSession"]


class SummarizationSession:
    """One consumer request (validation set, method and its configuration) against a set of
    owners.

    Parameters
    ----------
    request : SessionRequest
        The consumer's request: the method's configuration, D_v (the trusted curator holds it
        and counts it as accessed), the public seed set, the seed of every random draw (h1
        parameters, quantization, MWEM, auction coins, the owners' sampling seeds, noise; in a
        fixed order), the owners it leaves out and its schema.
    owners : sequence of OwnerEndpoint
        The owners the session asks (those the consumer excluded already left out). Owners
        that refuse their terms or cannot be reached when the session opens are left out, and
        the session fails unless ``request.selection.min_owners`` remain (0: every owner in
        ``owners``).
    context : SessionContext, optional
        The curator's side: ids, the consumer's identity, deadlines, the owners' published
        sketches, observers of progress, charges and the owners' records.

    Raises
    ------
    InvalidArgumentError
        If the validation or seed set is malformed (shape, NaN/inf, feature counts differ), a
        sketch is not an RFF sketch over the validation set's attributes, there is no owner or
        ``min_owners`` exceeds them.
    """

    def __init__(
        self,
        request: SessionRequest,
        owners: Sequence[OwnerEndpoint],
        context: SessionContext | None = None,
    ) -> None:
        self.request = request
        self.state = SessionState(request, owners, context)
        self.strategy: Strategy[Any] = strategy_for(self.state)
        self.state.total_rounds = 1 if self.strategy.one_round else request.config.summary_size
        self._offer = Offer(self.state)

    # -------------------------------------------------------------------- the state's view
    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.state.session_id

    @property
    def config(self) -> SummarizationConfig:
        """The request's configuration."""
        return self.state.config

    @property
    def validation(self) -> NDArray[np.floating]:
        """The consumer's validation set D_v, as checked."""
        return self.state.validation

    @property
    def ledgers(self) -> dict[str, PrivacyLedger]:
        """The session's ledgers, ``"validation"`` and ``"owners"``."""
        return self.state.ledgers

    @property
    def terms(self) -> OwnerTerms | None:
        """The terms offered to the owners (None before :meth:`prepare`)."""
        return self.state.terms

    @property
    def allocation(self) -> Literal["sketch", "counts"]:
        """The candidates method's allocation in effect (decided in :meth:`prepare`;
        ``"counts"`` for the other methods)."""
        return self.strategy.allocation

    @property
    def rounds_done(self) -> int:
        """Rounds completed (one for the one-round methods)."""
        return self.state.rounds_done

    @property
    def points_accessed(self) -> int:
        """Raw owner points the curator has received."""
        return self.state.points_accessed

    # ----------------------------------------------------------------------------------- setup
    async def prepare(
        self,
        *,
        check_terms: Callable[[OwnerTerms, SettlementTerms | None], None] | None = None,
        quote_only: bool = False,
    ) -> None:
        """Check the request against the owners and open the session at every owner.

        Asks every owner for its dataset description; checks that the owners and the consumer
        declare one schema (or, without schemas, the feature counts), the summary size and the
        kernel width (with a schema, in units of each feature scaled to [0, 1] by its public
        bounds: the session's feature scaling, which h1's parameters carry to the owners and
        the curator's exact kernel applies too); derives the session's terms (what it spends
        of each owner's privacy, :func:`~dpmarket.common.summarization.terms.owner_terms`);
        quotes the session's maximum cost from every owner's published prices (:meth:`quote`),
        lets ``check_terms`` (the curator's policy) refuse the terms and the payout release
        their settlement fixes (called with both), and refuses a quote above the consumer's cap
        (``request.max_cost``); draws h1's parameters and opens the session at every owner
        with the terms and its line of the quote, which each owner checks against its own
        policy and prices. Nothing is released or charged: h1's parameters are public
        randomness. With ``quote_only``, stops once the quote is known (no owner is opened).
        Owners that do not answer or refuse the terms are left out (and named in the report),
        and the session opens only if as many owners remain as it requires (every owner it
        asks, unless ``min_owners`` says otherwise). On failure, sessions already opened are
        closed.

        Raises
        ------
        UnavailableError
            If no owner answers, or fewer owners answer than the session requires.
        InvalidArgumentError
            If an owner's feature count differs from the validation set's, the owners hold fewer
            points than the summary size, ``gamma`` makes every kernel value 0 or 1 on the
            validation set, or ``check_terms`` refuses the terms.
        FailedPreconditionError
            If the schemas of the consumer and the owners differ (naming the first column that
            differs), owners' policies refuse the terms (a consumer's reward among them: the
            owners whose published access does not consent to it are left out before anything
            is quoted or opened) and fewer owners remain than the
            session requires, or the owners' policies allow fewer raw points than the summary
            size.
        CostCapExceededError
            (``FAILED_PRECONDITION``) If the quote exceeds ``request.max_cost``: no owner has
            been opened, nothing is released or charged.
        QuoteRefusedError
            (``FAILED_PRECONDITION``) If the method is non-private and an owner prices epsilon.
        """
        try:
            await self._prepare(check_terms, quote_only)
        except BaseException:
            await self.state.close_owner_sessions()
            raise

    async def _prepare(
        self,
        check_terms: Callable[[OwnerTerms, SettlementTerms | None], None] | None,
        quote_only: bool,
    ) -> None:
        state = self.state
        infos = await state.gather(range(len(state.slots)), lambda i: state.endpoint(i).info())
        for index, info in infos.items():
            state.slots[index].info = info
        active = state.active()
        if not active:
            raise UnavailableError("no owner answered: " + state.drop_notes())
        self._leave_out_reward_refusals()
        state.require_min_owners()
        schemas = {state.info(i).owner_id: state.info(i).schema for i in active}
        request = self.request
        found = disagreement(request.schema, schemas, feature_names=request.feature_names)
        if found is not None:
            raise FailedPreconditionError(f"the schemas differ: {found}")
        n = state.validation.shape[1]
        for index in active:
            owner = state.info(index)
            if owner.num_features != n:
                raise InvalidArgumentError(
                    f"owner {owner.owner_id} has {owner.num_features} features per point but the "
                    f"validation set has {n}"
                )
        total = sum(state.info(i).num_points for i in active)
        if state.config.summary_size > total:
            raise InvalidArgumentError(
                f"summary size p={state.config.summary_size} exceeds the {total} points the "
                f"{len(active)} owner(s) hold"
            )
        # The session's schema: the consumer's, or (without one) the one its owners agree on.
        # Its public bounds scale every feature to [0, 1] before the kernel, on every side.
        schema = request.schema
        if schema is None:
            schema = next((s for s in schemas.values() if s is not None), None)
        try:
            state.scaling = feature_scaling(schema)
            if state.scaling is not None and state.scaling.n_features != n:
                raise ValueError(
                    f"the schema declares {state.scaling.n_features} features but the "
                    f"validation set has {n}"
                )
            check_validation_set(
                state.validation, state.config.gamma, bounds=feature_bounds(schema)
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        self.strategy.choose()
        terms = await self._offer.terms(sketch_allocation=self.strategy.sketch_allocation)
        state.terms = terms
        state.quote = self._quote(terms)
        if check_terms is not None:  # the terms and the payout release they fix, quoted
            check_terms(terms, state.settlement)
        # The consumer's cap, before any owner is opened: a request above it releases and
        # charges nothing anywhere.
        check_cap(state.quote, self.request.max_cost)
        if quote_only:
            return
        await self._offer.open(terms)
        state.emit("setup", f"h1 shared with {len(state.active())} owner(s)")
        state.prepared = True

    def _leave_out_reward_refusals(self) -> None:
        """With a consumer's reward, leave out every answering owner whose published access
        does not consent to it (:func:`~dpmarket.common.summarization.terms.reward_refusal`:
        the check it would make at OpenSession, :func:`dpmarket.owner.terms.
        check_reward_disclosure`), before anything is quoted or opened: the session then runs
        with the others if ``min_owners`` allows, and otherwise fails naming them
        (``FAILED_PRECONDITION``, :meth:`~dpmarket.curator.summarization.state.SessionState.
        require_min_owners`). An owner that
        publishes no access is asked, and refuses at OpenSession if its policy does."""
        state = self.state
        if self.request.reward.rule == "none":
            return
        for index in state.active():
            access = state.info(index).access
            refused = None if access is None else reward_refusal(access)
            if refused is None:
                continue
            text = (
                f"refused (its published policy: {refused}): a reward's statement tells each "
                "owner exactly how many of its points the summary holds, and its policy does "
                "not consent to that disclosure. Request without --reward, or ask its operator "
                "to set access.allow_reward_disclosure = true"
            )
            state.drop(index, f"refused the session's terms: {text}", "refused the session")
            state.slots[index].refusal = text

    def _quote(self, terms: OwnerTerms) -> Quote:
        """The session's maximum cost from every answering owner's published prices: each
        owner charged at ``min(its size, the method's bound)`` raw points read
        (:meth:`Strategy.points_bound`), the terms' epsilon and the payout's, plus the most the
        consumer's reward pays (:func:`~dpmarket.common.market.terms.session_quote`)."""
        state = self.state
        active = state.active()
        bound = self.strategy.points_bound(terms)
        state.settlement = self.request.reward.settlement(
            state.config.summary_size, int(state.validation.shape[0])
        )
        return session_quote(
            {state.owner_name(i): state.info(i).prices for i in active},
            {state.owner_name(i): min(state.info(i).num_points, bound) for i in active},
            terms.epsilon,
            state.settlement,
        )

    @property
    def quote(self) -> Quote | None:
        """The session's quote (None before :meth:`prepare` computed it)."""
        return self.state.quote

    # -------------------------------------------------------------------------------- running
    async def run(self) -> SummaryResult:
        """Run the configured method to the end and return the summary.

        Raises
        ------
        FailedPreconditionError
            If :meth:`prepare` has not succeeded.
        UnavailableError
            If every owner dropped out.
        AbortedError
            If the owners ran out of points, or an owner broke the protocol.
        """
        state = self.state
        if not state.prepared or state.rff is None:
            raise FailedPreconditionError("prepare() must succeed before run()")
        start = time.perf_counter()
        summary = SummaryState()
        try:
            await self.strategy.run(summary, state.rff)
        finally:
            await state.close_owner_sessions()
        elapsed = time.perf_counter() - start
        result = self._result(summary, elapsed)
        size = len(summary.points) + len(summary.hashes)
        state.emit("done", f"summary of {size} points in {elapsed:.2f} s")
        return result

    def opened_owners(self) -> list[str]:
        """The owners that hold an open session of ours (after :meth:`prepare`), by name."""
        return self.state.opened_owners()

    async def abandon(self) -> None:
        """Close the session at every owner that opened it (a prepared session not run)."""
        await self.state.close_owner_sessions()

    def fail(self, message: str) -> None:
        """Emit the final failure event (the service calls this when :meth:`run` raises)."""
        self.state.emit("failed", message)

    def failure_report(self, error: str) -> SessionReport:
        """The report of a session that failed: what it accessed and spent until it failed."""
        state = self.state
        return self._report(state.summary_size, time.perf_counter() - state.start, error)

    def _report(self, summary_size: int, elapsed: float, error: str = "") -> SessionReport:
        state = self.state
        cfg = state.config
        k = len(state.slots)
        return SessionReport(
            method=cfg.method,
            summary_size=summary_size,
            rounds=state.rounds_done,
            owner_points_accessed=state.points_accessed,
            validation_points_accessed=int(state.validation.shape[0]),
            all_owners_bound=k * cfg.summary_size,
            paper_bound=self.strategy.paper_bound(),
            dropped_owners=state.dropped(),
            ledger=self.ledger_report(),
            wall_time_seconds=elapsed,
            rejected_points=state.rejected_points,
            round_seconds=tuple(state.round_seconds),
            error=error,
            owner_spend={
                state.owner_name(i): slot.spent for i, slot in enumerate(state.slots) if slot.spent
            },
            left_out=state.left_out(),
            quote=state.quote,
        )

    def ledger_report(self) -> SessionLedger:
        """The session's privacy ledger as its report states it: every charge so far (a payout
        release charged after the run included) and the method's parts."""
        state = self.state
        ledger = SessionLedger()
        if any(led.entries for led in state.ledgers.values()):
            ledger = SessionLedger(
                validation=state.ledgers["validation"].report(),
                owners=state.ledgers["owners"].report(),
            )
        ledger = self.strategy.ledger(ledger)
        if state.terms is not None:
            ledger = dataclasses.replace(ledger, owner_terms=TermsReport.from_terms(state.terms))
        return ledger

    def _result(self, summary: SummaryState, elapsed: float) -> SummaryResult:
        state = self.state
        labels: NDArray[np.int64] | None = None
        if summary.labels and all(label is not None for label in summary.labels):
            labels = np.asarray(summary.labels, dtype=np.int64)
        report = self._report(len(summary.points) + len(summary.hashes), elapsed)
        n = state.validation.shape[1]
        points = np.stack(summary.points) if summary.points else np.zeros((0, n))
        return SummaryResult(
            points=points,
            labels=labels,
            owner_ids=tuple(state.owner_name(i) for i in summary.owners),
            report=report,
            hashes=np.stack(summary.hashes) if summary.hashes else None,
        )
