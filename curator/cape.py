"""The curator as CAPE aggregator: one capeFM job across the owners (Algorithm 4).

The curator opens the job at every owner, plans it over the owners that answered, runs the
zero-sum noise round through secure aggregation (:mod:`curator.secagg`), then collects every
site's release, averages them and fits the model. The zero-sum property must hold over exactly
the sites whose releases are averaged: a site lost in the noise round makes the curator re-plan
without it and rerun the round (the earlier draws were never released). A site lost at its
release, when the others have released and charged already, is not rerun: the curator averages the
releases it received and states their larger noise (the lost sites' zero-sum corrections remain;
:func:`common.cape.zero_sum.partial_average_variance`). Either way the stated noise is the noise
of the estimate. The curator learns the releases and the
noise round's sum; it is honest but curious (the paper's model), and each owner derives its noise
from the public plan itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from common.cape.capefm import CapeFMPlan, aggregate_releases, fit_released
from common.cape.endpoints import CapeSiteEndpoint
from common.cape.functional_mechanism import to_raw_coefficients
from common.cape.privacy import default_colluders
from common.cape.spec import CapeJobSpec
from common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from common.ids import short_id
from common.privacy.accounting import PrivacyEvent
from common.privacy.ledger import Charge
from common.secagg.fixedpoint import FixedPoint
from common.secagg.protocol import RoundParams
from common.summarization.endpoints import SessionSpend
from curator.secagg import aggregate

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The noise draws are summed in fixed point over [-CLIP_SIGMAS * sigma, CLIP_SIGMAS * sigma];
#: a Gaussian draw beyond 12 standard deviations has probability below 4e-33 per coordinate.
CLIP_SIGMAS = 12.0
#: Fixed-point resolution of each site's noise draw, in bits.
RESOLUTION_BITS = 30
#: The most noise rounds a job runs before giving up (each rerun drops at least one site).
MAX_ROUNDS = 4


@dataclass(frozen=True)
class CapeResult:
    """A fitted model and what it cost.

    Attributes
    ----------
    weights : ndarray of shape (D,), float64
        Coefficients on the raw feature columns (the intercept excluded).
    intercept : float
        Prediction (or logit) = ``intercept + x @ weights``.
    report : dict
        Sites, dropped sites, the plan (noise, guarantee by the exact profile and by Theorem 1),
        owners' spend, rounds, timings.
    """

    weights: NDArray[np.float64]
    intercept: float
    report: dict[str, Any]


@dataclass
class _Site:
    endpoint: CapeSiteEndpoint
    size: int = 0
    opened: bool = False
    spent: SessionSpend | None = None


@dataclass
class _Timings:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, start: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


class CapeJob:
    """One capeFM fit across owners.

    Parameters
    ----------
    job_id : str
        Random id (128 bits), sent to every owner.
    spec : CapeJobSpec
    endpoints : sequence of CapeSiteEndpoint
        The owners.
    rng : numpy.random.Generator
        The owners' noise seeds are drawn from it (used only by owners allowing seeded runs).
    consumer : str
        Identity of the consumer served (owners record it).
    call_timeout : float, optional
        Seconds after which a site that has not answered is dropped.
    on_charge : callable, optional
        Receives the job's charge before the releases it pays for (the curator's store).
    """

    def __init__(
        self,
        job_id: str,
        spec: CapeJobSpec,
        endpoints: Sequence[CapeSiteEndpoint],
        rng: np.random.Generator,
        *,
        consumer: str = "consumer:local",
        call_timeout: float | None = None,
        on_charge: Callable[[Sequence[Charge]], None] | None = None,
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
        self.dropped: dict[str, str] = {}
        self.timings = _Timings()
        self._charged = False

    async def _each(
        self,
        names: Sequence[str],
        call: Callable[[_Site], Awaitable[T]],
        stage: str,
        *,
        refusals: bool = False,
    ) -> dict[str, T]:
        """Call sites concurrently; drop the unavailable (and, during the job, the refusing)."""

        async def one(site: _Site) -> T:
            coro = call(site)
            if self.call_timeout is None:
                return await coro
            try:
                return await asyncio.wait_for(coro, self.call_timeout)
            except TimeoutError as exc:
                raise UnavailableError(f"no answer within {self.call_timeout} s") from exc

        answers = await asyncio.gather(*(one(self.sites[n]) for n in names), return_exceptions=True)
        out: dict[str, T] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, UnavailableError) or (
                isinstance(answer, DPMarketError) and not refusals
            ):
                self.dropped[name] = f"{stage}: {answer}"
                logger.warning(
                    "job %s: site %s dropped at %s: %s", short_id(self.job_id), name, stage, answer
                )
            elif isinstance(answer, DPMarketError):
                raise type(answer)(f"owner {name}: {answer}") from answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[name] = answer
        return out

    async def run(self) -> CapeResult:
        """Open, plan, aggregate the noise, collect the releases and fit.

        Raises
        ------
        InvalidArgumentError, FailedPreconditionError
            If an owner refuses the job when it opens (missing column, value out of bounds, its
            policy), or fewer than 2 sites remain.
        AbortedError
            If no noise round completes over the sites that can release.
        """
        start = time.perf_counter()
        try:
            return await self._run(start)
        finally:
            t0 = time.perf_counter()
            await self._close()
            self.timings.add("close", t0)

    async def _run(self, start: float) -> CapeResult:
        spec = self.spec
        draws = self.rng.integers(0, 2**63 - 1, size=len(self.sites))
        seeds = {n: int(v) for n, v in zip(sorted(self.sites), draws, strict=True)}
        t0 = time.perf_counter()

        async def open_one(site: _Site) -> int:
            site.opened = True
            return await site.endpoint.open_job(
                self.job_id, spec, seeds[site.endpoint.name], self.consumer
            )

        sizes = await self._each(sorted(self.sites), open_one, "open", refusals=True)
        for name, size in sizes.items():
            self.sites[name].size = int(size)
        self.timings.add("open", t0)
        alive = sorted(sizes)
        rounds = 0
        while True:
            if len(alive) < 2:
                raise FailedPreconditionError(
                    f"capeFM needs at least 2 sites; {len(alive)} remain (dropped: {self.dropped})"
                )
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise AbortedError(f"no noise round completed in {MAX_ROUNDS} attempts")
            attempt = await self._attempt(alive)
            if isinstance(attempt, list):  # sites were lost: re-plan without them
                alive = attempt
                continue
            plan, releases = attempt
            break
        t0 = time.perf_counter()
        released = [j for j, n in enumerate(alive) if n in releases]
        partial = released if len(released) < len(alive) else None
        averaged = aggregate_releases(plan, [releases[alive[j]] for j in released], partial)
        fit = fit_released(plan, averaged, released=partial)
        weights, intercept = to_raw_coefficients(fit.w, spec.feature_bounds, spec.target_bounds)
        if spec.fit_intercept:
            intercept += float(weights[-1])
            weights = weights[:-1]
        self.timings.add("fit", t0)
        report = {
            "task": spec.task,
            "sites": [alive[j] for j in released],
            "sizes": {n: self.sites[n].size for n in alive},
            "noise_round_sites": alive,
            "lost_at_release": sorted(set(alive) - set(releases)),
            "dropped": dict(self.dropped),
            "noise_rounds": rounds,
            "epsilon": spec.epsilon,
            "delta_target": spec.delta,
            "colluders": plan.colluders,
            "default_colluders": default_colluders(plan.sites),
            "calibration": plan.calibration,
            "delta_exact": plan.delta_exact,
            "delta_theorem1": plan.delta_theorem1,
            "kappa": plan.kappa,
            "sigma_z": plan.sigma_z,
            "aggregator_noise_std": plan.aggregator_scales(partial),
            "site_noise_std": [dict(sc) for sc in plan.site_scales],
            "eigenvalues_clipped": fit.clipped,
            "eigenvalue_floor": fit.floor,
            "seconds": {**self.timings.seconds, "total": time.perf_counter() - start},
        }
        return CapeResult(weights=weights, intercept=float(intercept), report=report)

    async def _attempt(
        self, alive: list[str]
    ) -> tuple[CapeFMPlan, dict[str, NDArray[np.float64]]] | list[str]:
        """Plan over ``alive``, run the noise round, collect the releases; or return the sites
        still alive when one was lost (the caller re-plans without it)."""
        t0 = time.perf_counter()
        sizes = [self.sites[n].size for n in alive]
        planned = await self._each(
            alive, lambda s: s.endpoint.plan_job(self.job_id, alive, sizes), "plan"
        )
        self.timings.add("plan", t0)
        if sorted(planned) != alive:
            return sorted(planned)
        plan = self.spec.plan(sizes)
        scale = max(sigma for _, sigma in planned.values())
        params = RoundParams.create(
            alive,
            max(2, len(alive) // 2 + 1),
            plan.size,
            FixedPoint(CLIP_SIGMAS * scale, RESOLUTION_BITS, len(alive)),
        )
        t0 = time.perf_counter()
        outcome = await aggregate(
            {n: self.sites[n].endpoint for n in alive},
            self.job_id,
            params,
            timeout=self.call_timeout,
        )
        self.timings.add("secure_aggregation", t0)
        self.dropped.update(outcome.dropped)
        # A site lost at unmasking is still a survivor (its draw is in the sum) but never
        # recorded the round's end, so it cannot release for it: re-plan without it now, before
        # any site releases, as for a site lost earlier in the round.
        finished = [s for s in outcome.survivors if s not in outcome.dropped]
        if finished != alive:
            return finished
        if not self._charged:
            self._charge(plan)
        t0 = time.perf_counter()
        releases = await self._each(
            alive,
            lambda s: s.endpoint.release(self.job_id, params.round_id, outcome.total),
            "release",
        )
        self.timings.add("release", t0)
        if not releases:
            raise AbortedError(f"no site released (dropped: {self.dropped})")
        # A site lost at its release is not re-planned: the others have released (and charged)
        # already. Their average keeps the lost sites' zero-sum noise, and the report states
        # that larger noise (plan.aggregator_scales of the sites that released).
        return plan, releases

    def _charge(self, plan: CapeFMPlan) -> None:
        """Charge the owners' party before any release: every site is (epsilon, delta)-DP
        against the aggregator and the colluders, a Gaussian privacy loss of standard deviation
        ``sigma_z`` (one release per site)."""
        if self.on_charge is not None:
            event = PrivacyEvent(
                "gaussian",
                self.spec.epsilon,
                1,
                plan.sigma_z,
                scale=1.0,
                delta=max(plan.delta_exact, 1e-300),
            )
            self.on_charge([Charge("owners", "capeFM release per site (zero-sum Gaussian)", event)])
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

        await asyncio.gather(*(close(s) for s in self.sites.values() if s.opened))

    @property
    def owner_spend(self) -> dict[str, SessionSpend]:
        """What each owner's ledger recorded for the job (after :meth:`run`)."""
        return {n: s.spent for n, s in self.sites.items() if s.spent is not None}
