"""The curator's side of the summarization protocol (Algorithm 3): one session, run by stage.

A :class:`SummarizationSession` drives any sequence of
:class:`dpmarket.common.summarization.endpoints.OwnerEndpoint`
objects: in-process owners (``dpmarket simulate``, tests, benchmarks) or gRPC clients (the
curator service). Given the same seed and owners it makes the same random draws in the same order,
so both runs return the same summary bit for bit.

The session keeps its state in a :class:`~dpmarket.curator.summarization.state.SessionState` and
runs the stages on it: the terms offered to the owners
(:mod:`~dpmarket.curator.summarization.terms`), the candidates method's allocation
(:mod:`~dpmarket.curator.summarization.allocation`), the selection of the summary's points
(:mod:`~dpmarket.curator.summarization.selection`) and the releases about the validation set and the
summary (:mod:`~dpmarket.curator.summarization.release`); then it reports what it accessed and
spent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.common.privacy.ledger import Charge, PrivacyLedger
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.schema import Schema, disagreement
from dpmarket.common.sketches import PrivateSketch
from dpmarket.common.summarization.auction import parsimony_bound
from dpmarket.common.summarization.endpoints import OwnerEndpoint
from dpmarket.common.summarization.kernels import check_kernel_width
from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.summary import SessionReport, SummaryResult
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.curator.summarization.allocation import Allocator
from dpmarket.curator.summarization.release import Releases
from dpmarket.curator.summarization.selection import Selection
from dpmarket.curator.summarization.state import ProgressCallback, SessionState, SummaryState
from dpmarket.curator.summarization.terms import Offer

__all__ = ["SummarizationSession"]


class SummarizationSession:
    """One consumer request: validation set, summary size, method, against a set of owners.

    Parameters
    ----------
    session_id : str
        Unique id, sent to every owner.
    config : SummarizationConfig
    validation : ndarray of shape (m, n)
        The consumer's validation set D_v (the trusted curator holds it and counts it as
        accessed).
    seed_set : ndarray of shape (n0, n)
        The public seed set D_init; may have zero rows.
    owners : sequence of OwnerEndpoint
    rng : numpy.random.Generator
        Every random draw of the session (h1 parameters, quantization, MWEM, auction coins, the
        owners' sampling seeds) comes from it, in a fixed order.
    on_progress : callable, optional
        Called with a :class:`ProgressEvent` after setup and after every round.
    call_timeout : float, optional
        Seconds after which an owner that has not answered a call is dropped.
    noise : NoiseSource, optional
        Source of every noise draw (Gaussian embedding, tree nodes, MWEM measurements); default
        ``SeededNoise(rng)``, the same stream as ``rng`` (tests, seeded sessions). Production
        sessions pass :class:`~dpmarket.common.privacy.noise.OpenDPNoise`.
    consumer : str
        Identity (``"consumer:NAME"``) of the consumer the session serves; owners record it.
    owner_session_id : str, optional
        The id the owners know the session by (default ``session_id``); the curator service
        gives owners an id unrelated to the consumer's.
    on_charge : callable, optional
        Receives every charge to the session's ledgers before the release it pays for (the
        curator service writes them to its durable store).
    owner_sketches : mapping of str to PrivateSketch, optional
        The owners' published RFF sketches by owner id (the curator service passes its
        catalogue's; in-process runs pass sketches released directly, which charge no owner's
        ledger). The candidates method splits its budget by them
        (``allocation="sketch"``) when every owner that opens the session has one; otherwise,
        and when empty, by the owners' noisy relevance counts. Their publication was charged to
        their owners' ledgers; the session only post-processes them.
    allocation_spec : str, optional
        The catalogue spec ``owner_sketches`` were published under (the curator service's
        ``--allocation-sketch-spec``), named in the report when an owner has none.
    min_owners : int
        :attr:`dpmarket.common.summarization.summary.OwnerSelection.min_owners`: 0 keeps the rules
        before it (a refusal of the terms fails the request); N >= 1 leaves out owners that
        refuse their terms or cannot be reached when the session opens, and fails unless N
        remain.
    excluded : sequence of str
        Owners the consumer left out by name (not in ``owners``), for the report.

    Raises
    ------
    InvalidArgumentError
        If the validation or seed set is malformed (shape, NaN/inf, feature counts differ), or
        a sketch is not an RFF sketch over the validation set's attributes.
    """

    def __init__(
        self,
        session_id: str,
        config: SummarizationConfig,
        validation: NDArray[np.float64],
        seed_set: NDArray[np.float64],
        owners: Sequence[OwnerEndpoint],
        rng: np.random.Generator,
        *,
        on_progress: ProgressCallback | None = None,
        call_timeout: float | None = None,
        noise: NoiseSource | None = None,
        consumer: str = "consumer:local",
        owner_session_id: str | None = None,
        on_charge: Callable[[Sequence[Charge]], None] | None = None,
        owner_sketches: Mapping[str, PrivateSketch] | None = None,
        allocation_spec: str | None = None,
        min_owners: int = 0,
        excluded: Sequence[str] = (),
        schema: Schema | None = None,
        feature_names: Sequence[str] = (),
    ) -> None:
        self.schema = schema
        self.feature_names = tuple(feature_names)
        self.state = SessionState(
            session_id,
            config,
            validation,
            seed_set,
            owners,
            rng,
            on_progress=on_progress,
            call_timeout=call_timeout,
            noise=noise,
            consumer=consumer,
            owner_session_id=owner_session_id,
            on_charge=on_charge,
            owner_sketches=owner_sketches,
            allocation_spec=allocation_spec,
            min_owners=min_owners,
            excluded=excluded,
        )
        self._offer = Offer(self.state)
        self._releases = Releases(self.state)
        self._allocator = Allocator(self.state, self._releases)
        self._selection = Selection(self.state, self._allocator, self._releases)

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
        """The candidates method's allocation in effect (decided in :meth:`prepare`)."""
        return self.state.allocation

    @property
    def rounds_done(self) -> int:
        """Rounds completed (one for the one-round methods)."""
        return self.state.rounds_done

    @property
    def points_accessed(self) -> int:
        """Raw owner points the curator has received."""
        return self.state.points_accessed

    # ----------------------------------------------------------------------------------- setup
    async def prepare(self, *, check_terms: Callable[[OwnerTerms], None] | None = None) -> None:
        """Check the request against the owners and open the session at every owner.

        Asks every owner for its dataset description; checks that the owners and the consumer
        declare one schema (or, without schemas, the feature counts), the summary size and the
        kernel width; derives the session's terms (what it spends of each owner's privacy,
        :func:`~dpmarket.common.summarization.terms.owner_terms`) and lets ``check_terms`` (the
        curator's policy) refuse them; draws h1's parameters and opens the session at every owner
        with the terms, which each owner checks against its own policy. Nothing is released or
        charged: h1's parameters are public randomness. Owners that do not answer are dropped (and
        named in the report). On failure, sessions already opened are closed.

        Raises
        ------
        UnavailableError
            If no owner answers.
        InvalidArgumentError
            If an owner's feature count differs from the validation set's, the owners hold fewer
            points than the summary size, ``gamma`` makes every kernel value 0 or 1 on the
            validation set, or ``check_terms`` refuses the terms.
        FailedPreconditionError
            If the schemas of the consumer and the owners differ (naming the first column that
            differs), an owner's policy refuses the terms, or the owners' policies allow fewer
            raw points than the summary size.
        """
        try:
            await self._prepare(check_terms)
        except BaseException:
            await self.state.close_owner_sessions()
            raise

    async def _prepare(self, check_terms: Callable[[OwnerTerms], None] | None) -> None:
        state = self.state
        infos = await state.gather(range(len(state.slots)), lambda i: state.endpoint(i).info())
        for index, info in infos.items():
            state.slots[index].info = info
        active = state.active()
        if not active:
            raise UnavailableError("no owner answered: " + state.drop_notes())
        schemas = {state.info(i).owner_id: state.info(i).schema for i in active}
        found = disagreement(self.schema, schemas, feature_names=self.feature_names)
        if found is not None:
            raise FailedPreconditionError(f"the schemas differ: {found}")
        state.require_min_owners()
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
        try:
            check_kernel_width(state.validation, state.config.gamma)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        state.allocation, state.allocation_note = self._allocator.choose()
        terms = await self._offer.terms()
        state.terms = terms
        if check_terms is not None:
            check_terms(terms)
        await self._offer.open(terms)
        state.emit("setup", f"h1 shared with {len(state.active())} owner(s)")
        state.prepared = True

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
        cfg = state.config
        rff = state.rff
        summary = SummaryState()
        try:
            if cfg.method == "uniform":
                await self._selection.uniform(summary)
            elif cfg.method == "candidates":
                await self._selection.candidates(summary, rff)
            elif cfg.method == "rounds":
                await self._selection.rounds(summary, rff, mode="rounds")
            else:
                await self._selection.rounds(
                    summary, rff, mode="private" if cfg.method == "private" else "greedy"
                )
        finally:
            await state.close_owner_sessions()
        elapsed = time.perf_counter() - start
        result = self._result(summary, elapsed)
        size = len(summary.points) + len(summary.hashes)
        state.emit("done", f"summary of {size} points in {elapsed:.2f} s")
        return result

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
        ledger: dict[str, Any] = {}
        paper_bound = 0.0
        if any(led.entries for led in state.ledgers.values()):
            ledger = {party: led.report() for party, led in state.ledgers.items()}
        if state.candidates_info:
            ledger["candidates"] = state.candidates_info
        if state.allocation == "sketch":
            # What the sketches cost their owners: charged once, at publication, to each owner's
            # own ledger (in-process runs release them without a ledger); not this session.
            ledger["owner_sketches"] = {
                owner: {
                    "epsilon": sketch.mechanism.epsilon,
                    "delta": sketch.mechanism.delta,
                    "mechanism": sketch.mechanism.mechanism,
                    "frequencies": sketch.feature_map.dimension // 2,
                    "sigma": getattr(sketch.feature_map, "sigma", None),
                }
                for owner, sketch in sorted(state.owner_sketches.items())
                if owner in {state.owner_name(i) for i in range(len(state.slots))}
            }
        if state.auction is not None:
            eps_auc, tau = state.auction.eps_auc, state.auction.tau
            pure = state.auction.variant == "pure"
            ledger["auction"] = {
                "variant": state.auction.variant,
                "eps_auc": eps_auc,
                "tau": tau,
                # The printed auction: "not asked" at rank 1 (probability 0) versus rank 2
                # (1 - e^-eps_auc) has no bounded ratio, so a bad iteration is
                # (eps_auc, 1 - e^-eps_auc)-DP; charged so in the owners' ledger.
                "delta_per_bad_iteration": 0.0 if pure else -math.expm1(-eps_auc),
                "iterations": state.iterations,
            }
            paper_bound = parsimony_bound(
                cfg.summary_size, k, state.auction, state.validation.shape[0]
            )
        if state.terms is not None:
            ledger["owner_terms"] = {
                "method": state.terms.method.value,
                "mechanism": state.terms.description,
                "epsilon": state.terms.epsilon,
                "delta": state.terms.delta,
                "max_rounds": state.terms.max_rounds,
                "non_private": state.terms.non_private,
            }
        return SessionReport(
            method=cfg.method,
            summary_size=summary_size,
            rounds=state.rounds_done,
            owner_points_accessed=state.points_accessed,
            validation_points_accessed=int(state.validation.shape[0]),
            all_owners_bound=k * cfg.summary_size,
            paper_bound=float(paper_bound),
            dropped_owners=state.dropped(),
            ledger=ledger,
            wall_time_seconds=elapsed,
            rejected_points=state.rejected_points,
            round_seconds=tuple(state.round_seconds),
            error=error,
            owner_spend={
                state.owner_name(i): slot.spent for i, slot in enumerate(state.slots) if slot.spent
            },
            left_out=state.left_out(),
        )

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
