"""The curator as CAPE aggregator: capeFM models (Algorithm 4), means (Algorithm 2) and gradient
descent (Section 5.1) across the owners.

Every job opens at every owner, is planned over the owners that opened it (one that refuses — its
budget, its policy, a column it lacks — or does not answer is left out where ``min_sites`` allows,
charged nothing, and the job fails naming it where not), runs its zero-sum noise
round through secure aggregation (:mod:`dpmarket.curator.secagg`), then collects the sites' releases
and averages them. The zero-sum property must hold over exactly the sites whose releases are
averaged, and the stated noise must be the estimate's:

* a site lost in a noise round (at any stage) makes the curator re-plan without it and rerun the
  round before anyone releases (the earlier draws were never released);
* a site lost at its release, when the others have released and charged already, is not rerun:
  the curator averages the releases it received and states their larger noise (the lost sites'
  zero-sum corrections remain; :func:`dpmarket.common.cape.zero_sum.partial_average_variance`).

:class:`CapeJob` (capeFM) and :class:`CapeMeanJob` release once per site. :class:`CapeTrainingJob`
releases once per site and iteration: one noise round draws the zero-sum noise of every remaining
iteration at once (a vector of ``(T - t) P`` values); each iteration the curator broadcasts the
parameters, averages the releases and steps. A site lost at iteration ``t``'s release leaves that
iteration's average with its larger noise stated; the curator then re-plans iterations ``t + 1 ..
T - 1`` without it, with ``S_C`` kept and fresh noise from a new round, so that every later
iteration is zero-sum over exactly its sites again.

The curator learns the releases and the noise rounds' sums. The paper's model has it honest but
curious; here nothing an owner's guarantee depends on rests on its word: each owner derives its
noise from the public plan itself, checks every other site's signed row count before it plans
(:mod:`dpmarket.common.cape.agreement`), refuses an ``S_C`` below its policy's floor, and secure
aggregation withstands a curator that lies about the survivors
(:mod:`dpmarket.common.secagg.protocol`). The job's ``S_C`` is the consumer's when it chose one
(every owner refuses it at open if it is below the owner's floor), else the paper's default ``ceil(S
/ 3) - 1`` raised to the highest floor of the sites; the noise rounds' threshold is the least ``t``
with ``2 t > S + S_C``. From :data:`dpmarket.common.secagg.graph.SPARSE_MIN_SITES` sites the noise
rounds run SecAgg+ instead (:func:`noise_round_params`): a sparse graph meeting the same ``2^-40``
target against the same ``S_C``, tolerating :func:`secagg_allowance` lost sites per neighbourhood.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import SizeAttestation, plan_for
from dpmarket.common.cape.capefm import CapeFMPlan, aggregate_releases, fit_released
from dpmarket.common.cape.dpgd import CapeTrainingPlan, init_params
from dpmarket.common.cape.endpoints import CapeSiteEndpoint, OpenedJob
from dpmarket.common.cape.mean import CapeMeanPlan
from dpmarket.common.cape.privacy import default_colluders
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.cape.uncertainty import Estimate, capefm_estimates, mean_estimates
from dpmarket.common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from dpmarket.common.ids import short_id
from dpmarket.common.market.terms import MarketTerms
from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.privacy.ledger import (
    UNKNOWN_NOT_RETURNED,
    UNKNOWN_UNREACHABLE,
    Charge,
    SessionSpend,
)
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.graph import failure_bound as graph_failure_bound
from dpmarket.common.secagg.graph import plan_graph
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.curator.disclosure import (
    NoAnswerError,
    owner_failed,
    public_error,
    public_text,
    refusal_text,
)
from dpmarket.curator.secagg import AggregationOutcome, SitesLostError, aggregate
from dpmarket.curator.summarization.state import stage_deadline

logger = logging.getLogger(__name__)

T = TypeVar("T")
SpecT = TypeVar("SpecT", bound=AnyCapeSpec)
PlanT = TypeVar("PlanT", bound=CapeFMPlan | CapeMeanPlan | CapeTrainingPlan)
OnePlanT = TypeVar("OnePlanT", bound=CapeFMPlan | CapeMeanPlan)
ResultT = TypeVar("ResultT")

#: The noise draws are summed in fixed point over [-CLIP_SIGMAS * sigma, CLIP_SIGMAS * sigma];
#: a Gaussian draw beyond 12 standard deviations has probability below 4e-33 per coordinate.
CLIP_SIGMAS = 12.0
#: Fixed-point resolution of each site's noise draw, in bits.
RESOLUTION_BITS = 30
#: The most noise rounds a one-release job runs before giving up (each rerun drops a site).
MAX_ROUNDS = 4


#: Lost sites a sparse noise round tolerates in every neighbourhood, as a fraction of the sites
#: (at least 2): a round that loses more may abort the job, where one that loses fewer re-plans.
SECAGG_ALLOWANCE_FRACTION = 0.02


def secagg_allowance(sites: int) -> int:
    """The dropout allowance of a sparse noise round of ``sites`` sites:
    ``max(2, ceil(0.02 S))`` (2 at ``S = 100``, 20 at ``S = 1,000``)."""
    return max(2, math.ceil(SECAGG_ALLOWANCE_FRACTION * sites))


def noise_round_params(
    sites: Sequence[str], colluders: int, length: int, fixed_point: FixedPoint
) -> RoundParams:
    """The parameters of a noise round over ``sites`` against ``colluders`` colluders.

    SecAgg+'s sparse graph when :func:`dpmarket.common.secagg.graph.plan_graph` gives one (from
    :data:`~dpmarket.common.secagg.graph.SPARSE_MIN_SITES` sites, with :func:`secagg_allowance`),
    else the complete graph with the least threshold ``t`` with ``2 t > S + S_C``. Both defend
    against ``S_C`` colluders and a lying curator; the sparse one except with probability ``2^-40``
    over its graph (:mod:`dpmarket.common.secagg.graph`).

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    graph = plan_graph(len(sites), colluders, secagg_allowance(len(sites)))
    if graph is None:
        return RoundParams.create(
            sites, min_threshold(len(sites), colluders), length, fixed_point, colluders=colluders
        )
    return RoundParams.create(
        sites,
        0,
        length,
        fixed_point,
        colluders=colluders,
        neighbours=graph.neighbours,
        allowance=graph.allowance,
        ring=graph.ring,
    )


def round_graph_report(params: RoundParams) -> dict[str, Any]:
    """What a report states of a noise round's secure aggregation: its graph and thresholds."""
    if params.sparse:
        return {
            "graph": "sparse",
            "neighbours": params.neighbours,
            "ring": params.ring,
            "allowance": params.allowance,
            "failure_bound": graph_failure_bound(
                len(params.sites),
                params.colluders,
                params.neighbours,
                params.allowance,
                params.ring,
            ),
        }
    return {"graph": "complete", "threshold": params.threshold}


@dataclass(frozen=True)
class CapeResult:
    """A fitted capeFM model and what it cost.

    Attributes
    ----------
    weights : ndarray of shape (D,), float64
        Coefficients on the raw feature columns (the intercept excluded).
    intercept : float
        Prediction (or logit) = ``intercept + x @ weights``.
    report : dict
        Sites, dropped sites, the plan (noise, guarantee by the exact profile and by Theorem 1),
        owners' spend, rounds, timings; ``estimates``: :attr:`estimates` as JSON.
    estimates : tuple of Estimate
        Every raw coefficient (``spec.coefficient_labels``: the columns, then the intercept) with
        its bootstrap standard error, 95 % interval and flags
        (:func:`dpmarket.common.cape.uncertainty.capefm_estimates`).
    """

    weights: NDArray[np.float64]
    intercept: float
    report: dict[str, Any]
    estimates: tuple[Estimate, ...] = ()


@dataclass(frozen=True)
class CapeMeanEstimate:
    """A CAPE mean and what it cost.

    Attributes
    ----------
    mean : ndarray of shape (D,), float64
        The mean of each column, in the spec's order and the columns' units: each estimate's
        value, cut to the column's bounds (the raw aggregate outside them is in the
        ``outside_bounds`` flag's reason).
    report : dict
        As :attr:`CapeResult.report`, with the noise std of the baselines.
    estimates : tuple of Estimate
        Every column's mean with its exact standard error, 95 % interval and flags
        (:func:`dpmarket.common.cape.uncertainty.mean_estimates`).
    """

    mean: NDArray[np.float64]
    report: dict[str, Any]
    estimates: tuple[Estimate, ...] = ()


@dataclass(frozen=True)
class CapeTrainingResult:
    """A network trained by CAPE gradient descent and what it cost.

    Attributes
    ----------
    parameters : ndarray of shape (P,), float64
        ``W1`` (row-major), ``b1``, ``w2``, ``b2`` (:mod:`dpmarket.common.cape.dpgd`), on the
        features mapped to [-1, 1] by their public bounds.
    report : dict
        Sites and their iterations, noise per iteration, the total guarantee, timings. No
        ``estimates``: a network has no interval, and the consumer flags every parameter itself
        from the parameters and the last iteration's noise
        (:func:`dpmarket.common.cape.uncertainty.training_estimates`), which keeps the reply
        the size of the parameters.
    """

    parameters: NDArray[np.float64]
    report: dict[str, Any]


@dataclass
class _Site:
    endpoint: CapeSiteEndpoint
    size: int = 0
    min_colluders: int = 0
    opened: bool = False
    spent: SessionSpend | None = None


@dataclass
class _Timings:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, start: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class _Round(Generic[PlanT]):
    """A finished noise round over exactly the planned sites."""

    plan: PlanT
    params: RoundParams
    total: NDArray[np.float64]


class _CapeRun(Generic[SpecT, PlanT]):
    """What every CAPE job does: open, plan and run noise rounds, charge, close.

    Parameters
    ----------
    job_id : str
        Random id (128 bits), sent to every owner.
    spec : CapeJobSpec, CapeMeanSpec or CapeTrainingSpec
    endpoints : sequence of CapeSiteEndpoint
        The owners.
    rng : numpy.random.Generator
        The owners' noise seeds are drawn from it (used only by owners allowing seeded runs),
        then, for a training, the initial parameters.
    consumer : str
        Identity of the consumer served (owners record it).
    call_timeout : float, optional
        Seconds after which a site that has not answered is dropped.
    on_charge : callable, optional
        Receives the job's charge before the releases it pays for (the curator's store).
    on_progress : callable, optional
        ``on_progress(done, total)`` after every iteration of a training (public: the count of
        iterations, no value computed from the data).
    min_sites : int, optional
        Sites that must open the job, or it fails before anything is drawn or charged (the
        curator's service: every owner unless the consumer's ``min_owners`` says otherwise);
        None: any 2. A site that refuses or does not answer at the opening is left out when as
        many open it without it; else a refusal fails the job with that refusal, naming the
        owner, and no refusal ``FAILED_PRECONDITION``. Sites lost or refusing after the opening
        (planning, noise rounds, releases) are left out as the protocol tolerates.
    market : mapping of str to MarketTerms, optional
        Each site's line of the job's quote, sent when it opens (a site without one: unquoted).
    """

    def __init__(
        self,
        job_id: str,
        spec: SpecT,
        endpoints: Sequence[CapeSiteEndpoint],
        rng: np.random.Generator,
        *,
        consumer: str = "consumer:local",
        call_timeout: float | None = None,
        on_charge: Callable[[Sequence[Charge]], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        min_sites: int | None = None,
        market: Mapping[str, MarketTerms] | None = None,
    ) -> None:
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"site names repeat: {names}")
        self.job_id = job_id
        self.spec = spec
        self.sites = {e.name: _Site(e) for e in endpoints}
        self.rng = rng
        self.consumer = consumer
        self.call_timeout = call_timeout
        self.on_charge = on_charge
        self.on_progress = on_progress
        self.min_sites = min_sites
        self.market = dict(market or {})
        self.dropped: dict[str, str] = {}
        #: The sites that refused the job when it opened, with their refusal.
        self.refused: dict[str, DPMarketError] = {}
        self.timings = _Timings()
        self._charged = False

    async def _each(
        self,
        names: Sequence[str],
        call: Callable[[_Site], Awaitable[T]],
        stage: str,
        *,
        refusals: bool = False,
        aborts: bool = False,
    ) -> dict[str, T]:
        """Call sites concurrently; drop the unavailable and the refusing; with ``aborts``, a
        site that aborts the job (a signed count that does not verify) fails it. With
        ``refusals`` (the opening), each refusal is also kept in :attr:`refused`: the caller
        fails the job with it when too few sites remain."""

        # A release computes the site's statistic: a pass over its table, whose deadline grows
        # with the rows it declared when the job opened (an opening scans nothing but names).
        passes = stage.startswith("release")

        async def one(site: _Site) -> T:
            coro = call(site)
            if self.call_timeout is None:
                return await coro
            limit = stage_deadline(self.call_timeout, site.size, "open" if passes else "call")
            try:
                return await asyncio.wait_for(coro, limit)
            except TimeoutError as exc:
                raise NoAnswerError(f"no answer within {limit:.0f} s") from exc

        answers = await asyncio.gather(*(one(self.sites[n]) for n in names), return_exceptions=True)
        out: dict[str, T] = {}
        for name, answer in zip(names, answers, strict=True):
            # One rule (dpmarket.curator.disclosure.owner_failed): a site whose call failed in
            # any way, or refused, is dropped (the job goes on where min_sites allows: the
            # opening's caller checks); a site's own ABORTED (it found the job tampered with)
            # with ``aborts`` fails the job.
            failed = isinstance(answer, BaseException) and owner_failed(answer)
            fatal = aborts and _aborted(answer)
            # The report and the errors a consumer reads state an owner's failure publicly
            # (no address, no budget figure, an owner's own words quoted as its own); the
            # curator's log has the answer, as one line.
            if isinstance(answer, DPMarketError) and not fatal:
                said = public_text(answer) if failed else refusal_text(answer)
                self.dropped[name] = f"{stage}: {said}"
                if refusals and not failed:
                    self.refused[name] = answer
                logger.warning(
                    "job %s: site %s dropped at %s: %s", short_id(self.job_id), name, stage, answer
                )
            elif isinstance(answer, DPMarketError):
                where = f"job {short_id(self.job_id)}, {stage}"
                raise public_error(name, answer, where=where) from answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[name] = answer
        return out

    async def _open(self) -> list[str]:
        """Open the job at every owner; return the sites that opened it, sorted.

        A site that refuses (its budget, its policy, a column it lacks) is dropped like one
        that does not answer, when ``min_sites`` sites (any 2 without it) open the job without
        it: the report's ``dropped`` names it and its public reason, and the plan — sizes,
        weights, zero-sum shares, ``S_C`` — is built over the sites that opened alone. It
        charged nothing (a refusal charges nothing); its own ledger says so when the job closes.

        Raises
        ------
        DPMarketError
            When too few sites opened and one refused: that refusal (the first owner by name),
            of its class, naming the owner (with ``min_sites`` below every site, followed by
            how many could take part); nothing is drawn or charged.
        FailedPreconditionError
            If fewer than ``min_sites`` sites opened it, none refusing.
        """
        seeds = owner_seeds(self.rng, list(self.sites))
        t0 = time.perf_counter()

        async def open_one(site: _Site) -> OpenedJob:
            site.opened = True
            name = site.endpoint.name
            return await site.endpoint.open_job(
                self.job_id, self.spec, seeds[name], self.consumer, market=self.market.get(name)
            )

        opened = await self._each(sorted(self.sites), open_one, "open", refusals=True)
        need = 2 if self.min_sites is None else self.min_sites
        if len(opened) < need:
            needs = f"all {len(self.sites)}" if need >= len(self.sites) else f"at least {need}"
            said = (
                f"{len(opened)} of {len(self.sites)} owners can take part; the job needs {needs} "
                "(--min-owners N lets it run with N); nothing was charged"
            )
            if self.refused:
                # The refusal as the consumer would read it had it asked that owner alone; with
                # every owner needed (the default), nothing else: the others' answers add
                # nothing the consumer can act on.
                name = min(self.refused)
                where = f"job {short_id(self.job_id)}, open"
                refusal = public_error(name, self.refused[name], where=where)
                if need >= len(self.sites):
                    raise refusal from self.refused[name]
                raise type(refusal)(f"{refusal}; {said}") from self.refused[name]
            if self.min_sites is not None:
                raise FailedPreconditionError(f"{said} (dropped: {self.dropped})")
        for name, answer in opened.items():
            self.sites[name].size = int(answer.rows)
            self.sites[name].min_colluders = int(answer.min_colluders)
        self.timings.add("open", t0)
        return sorted(opened)

    def _colluders(self, alive: list[str], fixed: int | None) -> int:
        """``S_C`` of a plan over ``alive``: ``fixed`` (a training that released), the spec's,
        or the default ``ceil(S / 3) - 1`` raised to the highest floor of the sites.

        Raises
        ------
        FailedPreconditionError
            If the sites' floors require more colluders than ``S - 1``.
        """
        if fixed is not None:
            return fixed
        if self.spec.colluders is not None:
            return self.spec.colluders
        floor = max(self.sites[n].min_colluders for n in alive)
        colluders = max(default_colluders(len(alive)), floor)
        if colluders > len(alive) - 1:
            raise FailedPreconditionError(
                f"an owner's policy requires defending against {floor} colluders, which needs "
                f"at least {floor + 1} sites; {len(alive)} remain (dropped: {self.dropped})"
            )
        return colluders

    def _plan(self, sizes: list[int], first_iteration: int, colluders: int) -> PlanT:
        plan = plan_for(self.spec, sizes, colluders, first_iteration)
        return plan  # type: ignore[return-value]

    async def _noise_round(
        self, alive: list[str], first_iteration: int = 0, colluders: int | None = None
    ) -> _Round[PlanT] | list[str]:
        """Have every site sign its row count for a plan over ``alive``, relay the signed counts
        to all of them to plan, and run the plan's noise round; or return the sites still alive
        when one was lost (the caller re-plans without it).

        Raises
        ------
        AbortedError
            If a site aborts the job at planning (a signed count did not verify), or the round
            aborts.
        FailedPreconditionError
            As :meth:`_colluders`.
        """
        t0 = time.perf_counter()
        sc = self._colluders(alive, colluders)
        attested = await self._each(
            alive,
            lambda s: s.endpoint.attest_plan(self.job_id, alive, sc, first_iteration),
            "attest",
        )
        if sorted(attested) != alive:
            self.timings.add("plan", t0)
            return sorted(attested)
        planned = await self._each(
            alive,
            lambda s: s.endpoint.plan_job(self.job_id, alive, sc, attested, first_iteration),
            "plan",
            aborts=True,
        )
        self.timings.add("plan", t0)
        if sorted(planned) != alive:
            return sorted(planned)
        sizes = [_attested_rows(attested[n], n) for n in alive]
        for name, size in zip(alive, sizes, strict=True):
            self.sites[name].size = size
        plan = self._plan(sizes, first_iteration, sc)
        scale = max(sigma for _, sigma in planned.values())
        params = noise_round_params(
            alive,
            sc,
            plan.round_length,
            FixedPoint(CLIP_SIGMAS * scale, RESOLUTION_BITS, len(alive)),
        )
        t0 = time.perf_counter()
        try:
            outcome: AggregationOutcome = await aggregate(
                {n: self.sites[n].endpoint for n in alive},
                self.job_id,
                params,
                timeout=self.call_timeout,
            )
        except SitesLostError as exc:  # a sparse round lost sites before its graph was fixed
            self.timings.add("secure_aggregation", t0)
            self.dropped.update(exc.dropped)
            return [n for n in alive if n not in exc.lost]
        self.timings.add("secure_aggregation", t0)
        self.dropped.update(outcome.dropped)
        # A site lost at unmasking is still a survivor (its draw is in the sum) but never
        # recorded the round's end, so it cannot release for it: re-plan without it now, before
        # any site releases, as for a site lost earlier in the round.
        finished = [s for s in outcome.survivors if s not in outcome.dropped]
        if finished != alive:
            return finished
        return _Round(plan, params, outcome.total)

    def _charge(self, label: str, epsilon: float, loss_sigma: float, delta_exact: float) -> None:
        """Charge the owners' party before any release: every site is ``(epsilon, delta)``-DP
        against the aggregator and the colluders, a Gaussian privacy loss of standard deviation
        ``loss_sigma`` (for a training, the whole training's)."""
        if self._charged:
            return
        if self.on_charge is not None:
            event = PrivacyEvent(
                "gaussian", epsilon, 1, loss_sigma, scale=1.0, delta=max(delta_exact, 1e-300)
            )
            self.on_charge([Charge("owners", label, event)])
        self._charged = True

    async def _close(self) -> None:
        async def close(site: _Site) -> None:
            site.opened = False
            try:
                coro = site.endpoint.close_job(self.job_id)
                site.spent = (
                    await asyncio.wait_for(coro, self.call_timeout)
                    if self.call_timeout is not None
                    else await coro
                )
            except (DPMarketError, TimeoutError) as exc:
                logger.info("closing job at %s failed: %s", site.endpoint.name, exc)
                # Not missing from the report: the site may have charged the job.
                unreachable = isinstance(exc, UnavailableError | TimeoutError)
                site.spent = SessionSpend.unknown_because(
                    UNKNOWN_UNREACHABLE if unreachable else UNKNOWN_NOT_RETURNED
                )

        await asyncio.gather(*(close(s) for s in self.sites.values() if s.opened))

    @property
    def owner_spend(self) -> dict[str, SessionSpend]:
        """What each owner's ledger recorded for the job (after :meth:`run`), for every owner
        the job was opened at (one whose record could not be got marked ``unknown``)."""
        return {n: s.spent for n, s in self.sites.items() if s.spent is not None}

    def _need_two(self, alive: list[str], what: str) -> None:
        if len(alive) < 2:
            raise FailedPreconditionError(
                f"{what} needs at least 2 sites; {len(alive)} remain (dropped: {self.dropped})"
            )

    def _guarantee_report(self, plan: CapeFMPlan | CapeMeanPlan) -> dict[str, Any]:
        return {
            "epsilon": plan.epsilon,
            "delta_target": plan.delta,
            "colluders": plan.colluders,
            "default_colluders": default_colluders(plan.sites),
            "calibration": plan.calibration,
            "delta_exact": plan.delta_exact,
            "delta_theorem1": plan.delta_theorem1,
            "kappa": plan.kappa,
            "sigma_z": plan.sigma_z,
        }


class _OneReleaseJob(_CapeRun[SpecT, OnePlanT], Generic[SpecT, OnePlanT, ResultT]):
    """A job where every site releases once (capeFM, the mean)."""

    async def run(self) -> ResultT:
        """Open, plan, aggregate the noise, collect the releases and estimate.

        Raises
        ------
        InvalidArgumentError, FailedPreconditionError
            If fewer than ``min_sites`` sites open the job (the refusal of one that refused: a
            missing column, a value out of bounds, its policy or budget), or fewer than 2 sites
            remain.
        AbortedError
            If no noise round completes over the sites that can release.
        """
        start = time.perf_counter()
        try:
            alive = await self._open()
            rounds = 0
            while True:
                self._need_two(alive, f"a CAPE {self.spec.task} job")
                rounds += 1
                if rounds > MAX_ROUNDS:
                    raise AbortedError(f"no noise round completed in {MAX_ROUNDS} attempts")
                attempt = await self._noise_round(alive)
                if isinstance(attempt, list):  # sites were lost: re-plan without them
                    alive = attempt
                    continue
                break
            plan = attempt.plan
            cost = self.spec.cost
            self._charge(self._label, cost[0], plan.sigma_z, plan.delta_exact)
            t0 = time.perf_counter()
            releases = await self._each(
                alive,
                lambda s: s.endpoint.release(self.job_id, attempt.params.round_id, attempt.total),
                "release",
            )
            self.timings.add("release", t0)
            if not releases:
                raise AbortedError(f"no site released (dropped: {self.dropped})")
            # A site lost at its release is not re-planned: the others have released (and
            # charged) already. Their average keeps the lost sites' zero-sum noise, and the
            # report states that larger noise.
            released = [j for j, n in enumerate(alive) if n in releases]
            partial = released if len(released) < len(alive) else None
            report = {
                "task": self.spec.task,
                "sites": [alive[j] for j in released],
                "sizes": {n: self.sites[n].size for n in alive},
                "noise_round_sites": alive,
                "lost_at_release": sorted(set(alive) - set(releases)),
                "dropped": dict(self.dropped),
                "noise_rounds": rounds,
                "secure_aggregation": round_graph_report(attempt.params),
                **self._guarantee_report(plan),
            }
            t0 = time.perf_counter()
            result = await asyncio.to_thread(
                self._finish, plan, [releases[alive[j]] for j in released], partial, report
            )
            self.timings.add(self._finish_phase, t0)
            report["seconds"] = {**self.timings.seconds, "total": time.perf_counter() - start}
            return result
        finally:
            t0 = time.perf_counter()
            await self._close()
            self.timings.add("close", t0)

    #: The ledger's label of the release, and the name of the aggregator's last phase.
    _label = ""
    _finish_phase = ""

    def _finish(
        self,
        plan: OnePlanT,
        releases: list[NDArray[np.float64]],
        partial: list[int] | None,
        report: dict[str, Any],
    ) -> ResultT:
        raise NotImplementedError


class CapeJob(_OneReleaseJob[CapeJobSpec, CapeFMPlan, CapeResult]):
    """One capeFM fit across owners (Algorithm 4); :meth:`run` returns a :class:`CapeResult`.

    Parameters as :class:`_CapeRun`.
    """

    _label = "capeFM release per site (zero-sum Gaussian)"
    _finish_phase = "fit"

    def _finish(
        self,
        plan: CapeFMPlan,
        releases: list[NDArray[np.float64]],
        partial: list[int] | None,
        report: dict[str, Any],
    ) -> CapeResult:
        spec = self.spec
        averaged = aggregate_releases(plan, releases, partial)
        fit = fit_released(plan, averaged, released=partial)
        weights, intercept = spec.raw_coefficients(fit.w)
        # The bootstrap's draws come after every draw the job made before (the owners' seeds):
        # post-processing of the release, reproducible with the job's seed.
        estimates = capefm_estimates(
            plan,
            fit,
            spec.coefficient_labels,
            spec.raw_map(),
            np.random.default_rng(self.rng.integers(0, 2**63 - 1)),
            task_covers=spec.covers,
            released=partial,
            values=np.append(weights, intercept),
        )
        report["aggregator_noise_std"] = plan.aggregator_scales(partial)
        report["site_noise_std"] = [dict(sc) for sc in plan.site_scales]
        report["baseline_noise_std"] = plan.baseline_scales()
        report["eigenvalues_clipped"] = fit.clipped
        report["eigenvalue_floor"] = fit.floor
        report["estimates"] = [e.to_json() for e in estimates]
        return CapeResult(weights=weights, intercept=intercept, report=report, estimates=estimates)


class CapeMeanJob(_OneReleaseJob[CapeMeanSpec, CapeMeanPlan, CapeMeanEstimate]):
    """One CAPE mean across owners (Algorithm 2); :meth:`run` returns a
    :class:`CapeMeanEstimate`.

    Parameters as :class:`_CapeRun`.
    """

    _label = "CAPE mean release per site (zero-sum Gaussian)"
    _finish_phase = "average"

    def _finish(
        self,
        plan: CapeMeanPlan,
        releases: list[NDArray[np.float64]],
        partial: list[int] | None,
        report: dict[str, Any],
    ) -> CapeMeanEstimate:
        mean = aggregate_releases(plan, releases, partial)
        estimates = mean_estimates(plan, mean, self.spec.columns, released=partial)
        report["columns"] = list(self.spec.columns)
        report["aggregator_noise_std"] = plan.aggregator_std(partial)
        report["site_noise_std"] = list(plan.site_scales)
        report["baseline_noise_std"] = plan.baseline_stds()
        report["estimates"] = [e.to_json() for e in estimates]
        # One value per column: the estimate's, cut to the column's bounds (mean_estimates).
        values = np.array([e.value for e in estimates], dtype=np.float64)
        return CapeMeanEstimate(values, report, estimates)


class CapeTrainingJob(_CapeRun[CapeTrainingSpec, CapeTrainingPlan]):
    """CAPE gradient descent of the 2-layer network across owners (Section 5.1).

    Parameters as :class:`_CapeRun`. The initial parameters are drawn from ``rng`` after the
    owners' seeds (:func:`dpmarket.common.cape.dpgd.init_params`); they are public.
    """

    async def run(self) -> CapeTrainingResult:
        """Open, then for every iteration broadcast the parameters, average the releases and
        step, with noise rounds as needed.

        Raises
        ------
        InvalidArgumentError, FailedPreconditionError
            If fewer than ``min_sites`` sites open the job (the refusal of one that refused: a
            missing column, a value out of bounds, a label not 0/1, its budget), or fewer than 2
            sites remain (also mid-training).
        AbortedError
            If a noise round aborts, or no site releases an iteration.
        """
        start = time.perf_counter()
        try:
            return await self._run(start)
        finally:
            t0 = time.perf_counter()
            await self._close()
            self.timings.add("close", t0)

    async def _run(self, start: float) -> CapeTrainingResult:
        spec = self.spec
        alive = await self._open()
        theta = init_params(spec.dim, spec.hidden, self.rng)
        stds: list[float] = []
        segments: list[dict[str, Any]] = []
        lost_at: dict[str, int] = {}
        colluders: int | None = None  # fixed by the first plan that released
        first_plan: CapeTrainingPlan | None = None
        rounds = 0
        t = 0
        while t < spec.iterations:
            self._need_two(alive, f"CAPE training (stopped before iteration {t})")
            rounds += 1
            attempt = await self._noise_round(alive, t, colluders)
            if isinstance(attempt, list):  # lost before any release of the round: re-plan
                alive = attempt
                continue
            plan = attempt.plan
            first_plan = first_plan or plan
            self._charge(
                f"CAPE gradient descent, {spec.iterations} iterations (zero-sum Gaussian)",
                plan.epsilon,
                plan.sigma_z,
                plan.delta_exact,
            )
            totals = attempt.total.reshape(plan.round_iterations, plan.size)
            segment: dict[str, Any] = {
                "first_iteration": t,
                "sites": list(alive),
                "secure_aggregation": round_graph_report(attempt.params),
                "site_noise_std": list(plan.site_scales),
                "noise_std": plan.aggregator_std(),
            }
            segments.append(segment)
            while t < spec.iterations:
                t0 = time.perf_counter()
                row = totals[t - plan.first_iteration]
                releases = await self._each(
                    alive,
                    _gradient_call(self.job_id, attempt.params.round_id, t, theta, row),
                    f"release of iteration {t}",
                )
                self.timings.add("release", t0)
                if not releases:
                    raise AbortedError(f"no site released iteration {t} (dropped: {self.dropped})")
                colluders = plan.colluders
                released = [j for j, n in enumerate(alive) if n in releases]
                partial = released if len(released) < len(alive) else None
                t0 = time.perf_counter()
                theta = await asyncio.to_thread(
                    _step, plan, theta, [releases[alive[j]] for j in released], partial, spec
                )
                self.timings.add("step", t0)
                stds.append(plan.aggregator_std(partial))
                segment["last_iteration"] = t
                t += 1
                if self.on_progress is not None:
                    self.on_progress(t, spec.iterations)
                if partial is not None:
                    # Iteration t - 1 keeps the lost sites' zero-sum noise (its larger std is
                    # stated); the next iterations need a noise round over the others.
                    for n in alive:
                        if n not in releases:
                            lost_at[n] = t - 1
                    alive = [alive[j] for j in released]
                    break
        assert first_plan is not None
        report = self._report(first_plan, segments, lost_at, rounds, stds, start)
        return CapeTrainingResult(theta, report)

    def _report(
        self,
        plan: CapeTrainingPlan,
        segments: list[dict[str, Any]],
        lost_at: dict[str, int],
        rounds: int,
        stds: list[float],
        start: float,
    ) -> dict[str, Any]:
        """The training's report: its privacy figures from its first ``plan`` (every later plan
        keeps its colluders and per-iteration budget), one segment per noise round that released,
        the iteration at which each lost site stopped, the std of each iteration's noise and the
        timings since ``start`` (``time.perf_counter()``)."""
        spec = self.spec
        return {
            "task": "train",
            "sites": segments[0]["sites"],
            "sizes": {n: s.size for n, s in self.sites.items() if s.size},
            "segments": segments,
            "lost_at_release": lost_at,
            "dropped": dict(self.dropped),
            "noise_rounds": rounds,
            "iterations": spec.iterations,
            "dim": spec.dim,
            "hidden_units": spec.hidden,
            "parameters": spec.n_params,
            "epsilon": plan.epsilon,
            "epsilon_requested": spec.epsilon,
            "delta_target": spec.delta,
            "delta_exact": plan.delta_exact,
            "delta_theorem1": plan.delta_theorem1,
            "colluders": plan.colluders,
            "default_colluders": default_colluders(plan.sites),
            "loss_sigma_per_iteration": plan.loss_sigma,
            "sigma_z": plan.sigma_z,
            "noise_std_per_iteration": stds,
            "baseline_noise_std": plan.baseline_stds(),
            "seconds": {**self.timings.seconds, "total": time.perf_counter() - start},
        }


def _attested_rows(answer: tuple[SizeAttestation, bytes], name: str) -> int:
    """The row count a site signed (the attestation must be its own)."""
    attestation, _ = answer
    if attestation.site != name:
        raise AbortedError(f"owner {name} answered with the row count of {attestation.site!r}")
    return int(attestation.rows)


def owner_seeds(rng: np.random.Generator, names: Sequence[str]) -> dict[str, int]:
    """The seed each owner's noise is drawn from (honoured only by owners allowing seeded runs):
    the job's first draws from ``rng``, one per owner in sorted order. A training's initial
    parameters are the next draws (:func:`dpmarket.common.cape.dpgd.init_params`), so a caller that
    replays these draws from the same seed gets the same starting point."""
    draws = rng.integers(0, 2**63 - 1, size=len(names))
    return {n: int(v) for n, v in zip(sorted(names), draws, strict=True)}


def _gradient_call(
    job_id: str,
    round_id: bytes,
    iteration: int,
    theta: NDArray[np.float64],
    total: NDArray[np.float64],
) -> Callable[[_Site], Awaitable[NDArray[np.float64]]]:
    """A site's ReleaseCapeGradient call for one iteration (bound now, not at call time)."""

    def call(site: _Site) -> Awaitable[NDArray[np.float64]]:
        return site.endpoint.release_gradient(job_id, round_id, iteration, theta, total)

    return call


def _step(
    plan: CapeTrainingPlan,
    theta: NDArray[np.float64],
    releases: list[NDArray[np.float64]],
    partial: list[int] | None,
    spec: CapeTrainingSpec,
) -> NDArray[np.float64]:
    """One gradient step on the weighted average of the releases (Remark 3's weights)."""
    gradient = aggregate_releases(plan, releases, partial)
    out: NDArray[np.float64] = theta - spec.learning_rate * gradient
    if not np.isfinite(out).all():
        raise AbortedError("the parameters diverged (not finite): lower the learning rate")
    return out


def job_for(
    job_id: str,
    spec: AnyCapeSpec,
    endpoints: Sequence[CapeSiteEndpoint],
    rng: np.random.Generator,
    **options: Any,
) -> CapeJob | CapeMeanJob | CapeTrainingJob:
    """The job class that runs ``spec``, constructed with ``options`` (see :class:`_CapeRun`)."""
    if isinstance(spec, CapeTrainingSpec):
        return CapeTrainingJob(job_id, spec, endpoints, rng, **options)
    if isinstance(spec, CapeMeanSpec):
        return CapeMeanJob(job_id, spec, endpoints, rng, **options)
    return CapeJob(job_id, spec, endpoints, rng, **options)


__all__ = [
    "CLIP_SIGMAS",
    "MAX_ROUNDS",
    "RESOLUTION_BITS",
    "CapeJob",
    "CapeMeanEstimate",
    "CapeMeanJob",
    "CapeResult",
    "CapeTrainingJob",
    "CapeTrainingResult",
    "job_for",
    "owner_seeds",
]


def _aborted(answer: object) -> bool:
    """Whether a site's answer is its own ABORTED (raised in process, or the status it sent),
    not another failure gRPC reports as ``AbortedError`` (INTERNAL, UNKNOWN)."""
    if not isinstance(answer, AbortedError):
        return False
    return answer.remote is None or answer.remote.code == "ABORTED"
