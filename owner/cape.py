"""An owner's side of CAPE (capeFM, Algorithm 4 of the CAPE paper) as plain state objects.

A job goes through: open (the spec is checked against the owner's table and the terms against its
policy), plan (the sites and their row counts are fixed; the owner computes the plan — noise
scales, weights and guarantee — itself with :func:`common.cape.capefm.plan_capefm`), one or more
secure-aggregation noise rounds (the owner's input is a fresh zero-sum noise draw, Algorithm 1),
then one release: its coefficients plus the zero-sum-corrected noise plus fresh local noise,
charged to the owner's ledger first. The noise scale depends on the owner's own row count and on
public parameters only, so a curator cannot make an owner add less noise than its terms say.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from common.cape.capefm import (
    CapeFMPlan,
    secure_aggregation_input,
    site_coefficients,
    site_noise_share,
    site_release,
)
from common.cape.spec import CapeJobSpec
from common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from common.ids import short_id
from common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from common.privacy.rng import production_rng
from common.secagg.protocol import RoundParams
from common.summarization.endpoints import SessionSpend
from owner.data import Table
from owner.ledger import OwnerLedger


@dataclass
class _Job:
    spec: CapeJobSpec
    curator: str
    consumer: str
    x: NDArray[np.float64]
    y: NDArray[np.float64]
    rng: np.random.Generator
    noise: NoiseSource
    touched: float
    plan: CapeFMPlan | None = None
    index: int = -1
    sites: tuple[str, ...] = ()
    draws: dict[bytes, NDArray[np.float64]] = field(default_factory=dict)
    survivors: dict[bytes, tuple[str, ...]] = field(default_factory=dict)
    released: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class CapeSite:
    """An owner's CAPE jobs over its table.

    Parameters
    ----------
    name : str
        The owner's name (its site id in secure aggregation).
    table : Table or None
        The owner's numeric table; ``None`` refuses every job.
    ledger : OwnerLedger, optional
        Charged before every release; ``None`` in in-process research runs.
    max_jobs : int, optional
        Most jobs open at once.
    idle_timeout : float, optional
        Seconds after which :meth:`expire_idle` closes an untouched job.
    allow_seeded_sessions : bool
        Whether a job's seed drives this owner's noise (reproducible runs); otherwise noise
        comes from OpenDP and the rounding coins from a CSPRNG-seeded generator.
    clock : callable
        Monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        name: str,
        table: Table | None,
        *,
        ledger: OwnerLedger | None = None,
        max_jobs: int | None = None,
        idle_timeout: float | None = None,
        allow_seeded_sessions: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.table = table
        self.ledger = ledger
        self.max_jobs = max_jobs
        self.idle_timeout = idle_timeout
        self.allow_seeded_sessions = allow_seeded_sessions
        self.clock = clock
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def _job(self, job_id: str, curator: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or job.curator != curator:
            raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
        job.touched = self.clock()
        return job

    def check_curator(self, job_id: str, curator: str) -> None:
        """Raise :class:`NotFoundError` unless ``curator`` opened the job (its secure-aggregation
        rounds are its own)."""
        self._job(job_id, curator)

    def open(
        self, job_id: str, spec: CapeJobSpec, seed: int, *, curator: str, consumer: str
    ) -> int:
        """Check a new job against the table and the policy; return this owner's row count.

        Raises
        ------
        FailedPreconditionError
            If this owner holds no table, or its ledger refuses the terms.
        InvalidArgumentError
            If a column is missing or a value lies outside its public bounds.
        ResourceExhaustedError, AlreadyExistsError
            Beyond ``max_jobs`` open jobs; a job id in use.
        """
        if self.table is None:
            raise FailedPreconditionError(f"owner {self.name} holds no table for CAPE jobs")
        if not job_id:
            raise InvalidArgumentError("job_id must be a non-empty string")
        try:
            x, y = spec.scaled(
                self.table.select(spec.columns), self.table.select([spec.target[0]])[:, 0]
            )
        except ValueError as exc:
            raise InvalidArgumentError(f"owner {self.name}: {exc}") from exc
        if self.ledger is not None:
            self.ledger.check(
                session=job_id,
                consumer=consumer,
                curator=curator,
                mechanism=_mechanism(spec),
                epsilon=spec.epsilon,
                delta=spec.delta,
                points=0,
            )
        self.expire_idle()
        if self.allow_seeded_sessions:
            rng = np.random.default_rng(seed)
            noise: NoiseSource = SeededNoise(rng)
        else:
            rng, noise = production_rng(), OpenDPNoise()
        job = _Job(spec, curator, consumer, x, y, rng, noise, self.clock())
        with self._lock:
            if job_id in self._jobs:
                raise AlreadyExistsError(f"CAPE job {short_id(job_id)} is already open")
            if self.max_jobs is not None and len(self._jobs) >= self.max_jobs:
                raise ResourceExhaustedError(
                    f"this owner runs at most {self.max_jobs} jobs at once; retry later"
                )
            self._jobs[job_id] = job
        return int(x.shape[0])

    def plan(
        self, job_id: str, sites: Sequence[str], sizes: Sequence[int], *, curator: str
    ) -> CapeFMPlan:
        """Fix the sites of the next noise round and compute the plan.

        Raises
        ------
        InvalidArgumentError
            If this owner is not among the sites, its row count differs from its own, the
            sites are not sorted and distinct, or the plan cannot be made.
        FailedPreconditionError
            If the job has released already.
        """
        job = self._job(job_id, curator)
        with job.lock:
            if job.released:
                raise FailedPreconditionError("the job has released already")
            names = tuple(sites)
            if list(names) != sorted(set(names)) or len(names) != len(sizes):
                raise InvalidArgumentError("sites must be sorted and distinct, one size each")
            if self.name not in names:
                raise InvalidArgumentError(f"owner {self.name} is not among the sites {names}")
            index = names.index(self.name)
            if int(sizes[index]) != job.x.shape[0]:
                raise InvalidArgumentError(
                    f"owner {self.name} holds {job.x.shape[0]} rows, not {sizes[index]}"
                )
            try:
                plan = job.spec.plan([int(n) for n in sizes])
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from exc
            job.plan, job.index, job.sites = plan, index, names
            job.draws.clear()
            job.survivors.clear()
            return plan

    def noise_input(self, job_id: str, params: RoundParams) -> NDArray[np.float64]:
        """Secure aggregation's input source: a fresh zero-sum noise draw for this round
        (Algorithm 1, step 2), kept for the release; the round must be over the planned sites.

        Raises
        ------
        NotFoundError
            For an unknown job (no curator check here: the round was authorized by the
            secure-aggregation service for the same curator).
        FailedPreconditionError
            If the job is not planned, or the round's sites are not the planned sites.
        """
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
        with job.lock:
            if job.plan is None or job.released:
                raise FailedPreconditionError("the job is not planned, or released already")
            if tuple(params.sites) != job.sites or params.vector_length != job.plan.size:
                raise FailedPreconditionError(
                    "the round's sites or vector length differ from the job's plan"
                )
            e_hat = site_noise_share(job.plan, job.index, job.noise)
            job.draws[params.round_id] = e_hat
            return secure_aggregation_input(job.plan, job.index, e_hat)

    def round_finished(self, job_id: str, round_id: bytes, survivors: Sequence[str]) -> None:
        """Record the survivors of a job's noise round (secure aggregation's round 3)."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None:
            with job.lock:
                job.survivors[round_id] = tuple(survivors)

    def rng_for(self, job_id: str) -> np.random.Generator:
        """The generator of a job's stochastic rounding in secure aggregation."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
        return job.rng

    def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64], *, curator: str
    ) -> NDArray[np.float64]:
        """Charge, then release ``Lambda_s + e_s + g_s`` (Algorithm 4, steps 5-8).

        Raises
        ------
        NotFoundError
            For an unknown job or a round this site did not draw noise for.
        FailedPreconditionError
            If the round's survivors are not the planned sites (the zero-sum property would not
            hold over the averaged sites), the job released already, or the ledger refuses.
        InvalidArgumentError
            If ``total`` has the wrong shape or is not finite.
        """
        job = self._job(job_id, curator)
        with job.lock:
            if job.plan is None or job.released:
                raise FailedPreconditionError("the job is not planned, or released already")
            e_hat = job.draws.get(round_id)
            if e_hat is None:
                raise NotFoundError(f"this site drew no noise in round {round_id.hex()[:8]}…")
            if job.survivors.get(round_id) != job.sites:
                raise FailedPreconditionError(
                    "the noise round's survivors are not the planned sites: re-plan and rerun it"
                )
            total = np.asarray(total, dtype=np.float64)
            if total.shape != (job.plan.size,) or not np.isfinite(total).all():
                raise InvalidArgumentError(
                    f"noise_total must be {job.plan.size} finite values, got shape {total.shape}"
                )
            coefficients = site_coefficients(job.plan, job.index, job.x, job.y)
            if self.ledger is not None:
                self.ledger.charge(
                    session=job_id,
                    consumer=job.consumer,
                    curator=job.curator,
                    mechanism=_mechanism(job.spec),
                    epsilon=job.spec.epsilon,
                    delta=job.spec.delta,
                    points=0,
                )
            job.released = True
            return site_release(job.plan, job.index, coefficients, e_hat, total, job.noise)

    def close(self, job_id: str, *, curator: str) -> SessionSpend:
        """Forget a job; return what it spent of this owner's budget."""
        job = self._job(job_id, curator)
        with self._lock:
            self._jobs.pop(job_id, None)
        if self.ledger is not None:
            totals = self.ledger.session_totals(job_id)
            return SessionSpend(totals.epsilon, totals.delta, totals.points, totals.non_private)
        spent = job.spec.epsilon if job.released else 0.0
        return SessionSpend(spent, job.spec.delta if job.released else 0.0, 0)

    def expire_idle(self) -> list[str]:
        """Close jobs untouched for ``idle_timeout`` seconds; return their ids."""
        if self.idle_timeout is None:
            return []
        cutoff = self.clock() - self.idle_timeout
        with self._lock:
            idle = [j for j, job in self._jobs.items() if job.touched < cutoff]
            for j in idle:
                del self._jobs[j]
        return idle


def _mechanism(spec: CapeJobSpec) -> str:
    return f"capeFM {spec.task} regression (zero-sum Gaussian noise, {spec.calibration})"


def sorted_sites(names: Sequence[str]) -> tuple[str, ...]:
    """Site ids in the order every party uses (Python ``str`` order)."""
    return tuple(sorted(names))
