"""An owner's side of CAPE as plain state objects: capeFM (Algorithm 4 of the CAPE paper), the
CAPE mean (Algorithm 2) and CAPE gradient descent (Section 5.1, one release per iteration).

A job goes through: open (the spec is checked against the owner's table and the terms against its
policy), attest and plan (the sites, ``S_C`` and their row counts are fixed: every site signs its
own count for the plan, and each checks every other's signature, so the curator cannot relay
different counts to different sites; ``S_C`` is at least the owner's policy floor; the owner
computes the plan — noise scales, weights and guarantee — itself from these public values,
:mod:`dpmarket.common.cape.agreement`), one or more secure-aggregation noise rounds (the owner's
input is a fresh zero-sum noise draw, Algorithm 1), then its releases, the first of which is charged
to the owner's ledger before it leaves:

* capeFM and the mean: one release, ``f(x_s) + e_s + g_s`` (the functional mechanism's
  coefficients or the site's mean vector);
* gradient descent: one release per iteration, the clipped-gradient average at the parameters
  the curator broadcasts plus that iteration's ``e_s,t + g_s,t``. One noise round draws the noise
  of every remaining iteration at once; a re-plan (after a site is lost) covers only iterations
  after the last one released, with fresh noise, and keeps ``S_C``. Each iteration is released
  at most once, in increasing order, so the training never releases more than the ``T``
  iterations its charge pays for.

The noise scale depends on the owner's own row count and on public parameters only, so a curator
cannot make an owner add less noise than its terms say. A signed count that does not verify
aborts the job at this owner: it then releases nothing for it, and nothing was charged.

Nothing an owner answers depends on its values except the charged releases. Its records are clamped
to the request's public bounds (:mod:`dpmarket.common.cape.spec`; how many were clamped goes to this
owner's log only); a logistic regression or a training takes only a target the owner declared 0/1
when it started (:attr:`dpmarket.runtime.tables.Table.binary`, checked then, on its own console).
Every refusal is then decided on public inputs alone — the request, the owner's columns, row count
and declared 0/1 columns, its policy and budget — and the computations on the rows run under
:func:`dpmarket.common.errors.on_private_data`, so that a failure there (a bug) reaches the curator
as a fixed INTERNAL status, never as text.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import (
    SizeAttestation,
    check_attestations,
    check_colluders,
    plan_for,
    plan_statement,
)
from dpmarket.common.cape.capefm import (
    CapeFMPlan,
    secure_aggregation_input,
    site_coefficients,
    site_release,
)
from dpmarket.common.cape.dpgd import (
    NOISE_TAIL,
    CapeTrainingPlan,
    parameter_bound,
    site_gradient,
)
from dpmarket.common.cape.mean import CapeMeanPlan, site_mean
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.cape.zero_sum import zero_sum_correction
from dpmarket.common.errors import (
    AbortedError,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    on_private_data,
)
from dpmarket.common.ids import short_id
from dpmarket.common.market.terms import MarketTerms, check_quote
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.common.privacy.rng import production_rng
from dpmarket.common.secagg.protocol import RoundParams
from dpmarket.common.validation import check_not_tiny
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ids import IdState, check_curator_id
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.partitioned import PartitionedTable, mean_statistic
from dpmarket.owner.policy import DEFAULT_MIN_COLLUDERS
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.runtime.tables import Table

logger = logging.getLogger(__name__)

#: The plan of any CAPE job.
AnyCapePlan = CapeFMPlan | CapeMeanPlan | CapeTrainingPlan


@dataclass
class _Job:
    spec: AnyCapeSpec
    curator: str
    consumer: str
    x: NDArray[np.float64] | None
    y: NDArray[np.float64] | None
    rng: np.random.Generator
    noise: NoiseSource
    touched: float
    plan: AnyCapePlan | None = None
    index: int = -1
    sites: tuple[str, ...] = ()
    draws: dict[bytes, NDArray[np.float64]] = field(default_factory=dict)
    survivors: dict[bytes, tuple[str, ...]] = field(default_factory=dict)
    released: bool = False
    charged: bool = False
    aborted: str | None = None
    last_iteration: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Rows of the job's records (``x`` is None on a partitioned table: computed per release).
    rows: int = 0
    #: A training's largest site noise scale of any of its plans (:func:`_checked_parameters`).
    noise_scale: float = 0.0

    @property
    def training(self) -> bool:
        return isinstance(self.spec, CapeTrainingSpec)


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
    identity : SiteIdentity, optional
        Signs this owner's row count for a plan and checks the other sites' (their certificates
        against the deployment CA); ``None`` refuses to plan (an ``--insecure`` owner).
    min_colluders : int, optional
        The policy's floor on ``S_C`` (``cape.min_colluders``; default
        :data:`dpmarket.owner.policy.DEFAULT_MIN_COLLUDERS`): a job whose ``S_C`` is below it is
        refused.
    """

    def __init__(
        self,
        name: str,
        table: Table | PartitionedTable | None,
        *,
        ledger: OwnerLedger | None = None,
        max_jobs: int | None = None,
        idle_timeout: float | None = None,
        allow_seeded_sessions: bool = True,
        clock: Callable[[], float] = time.monotonic,
        identity: SiteIdentity | None = None,
        min_colluders: int = DEFAULT_MIN_COLLUDERS,
    ) -> None:
        if isinstance(min_colluders, bool) or not isinstance(min_colluders, int):
            raise ValueError(f"min_colluders must be an int, got {min_colluders!r}")
        if min_colluders < 0:
            raise ValueError(f"min_colluders must be >= 0, got {min_colluders}")
        self.name = name
        self.identity = identity
        self.min_colluders = min_colluders
        self.table = table
        self.ledger = ledger
        self.max_jobs = max_jobs
        self.idle_timeout = idle_timeout
        self.allow_seeded_sessions = allow_seeded_sessions
        self.clock = clock
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def _ids(self) -> IdState | None:
        """The state of this owner's ids (:mod:`dpmarket.owner.ids`); None without a ledger."""
        return None if self.ledger is None else IdState(self.ledger, self.name)

    def _job(self, job_id: str, curator: str, *, closing: bool = False) -> _Job:
        """An open job of ``curator``'s, for a step (refused once its statement is recorded,
        before the step reads or charges anything) or, ``closing``, to close it."""
        check_curator_id(job_id, "job_id")
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or job.curator != curator:
            raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
        ids = self._ids()
        if ids is not None and not closing:
            ids.check_unsettled(curator, job_id)
        job.touched = self.clock()
        return job

    def check_curator(self, job_id: str, curator: str) -> None:
        """Raise :class:`NotFoundError` unless ``curator`` opened the job (its secure-aggregation
        rounds are its own)."""
        self._job(job_id, curator)

    def _target(self, spec: AnyCapeSpec) -> str | None:
        """The job's target column, checked against the table's columns and, for a 0/1 target,
        against the owner's declared 0/1 columns: public inputs only, never the values."""
        assert self.table is not None
        table = self.table
        if isinstance(spec, CapeMeanSpec):
            target = None
        else:
            target = spec.target if isinstance(spec, CapeTrainingSpec) else spec.target[0]
        names = [*spec.columns, *([] if target is None else [target])]
        if isinstance(table, PartitionedTable):
            table.check_columns(names)
        else:
            table.select(names)  # names only
        if target is not None and spec.task != "linear" and target not in table.binary:
            raise InvalidArgumentError(
                f"column {target!r} is not a 0/1 column of owner {self.name}: a "
                f"{'training' if spec.task == 'train' else 'logistic regression'} needs a target "
                f"its owners declare 0/1 when they start (owner serve --binary-column); this "
                f"owner declares {list(table.binary)}"
            )
        return target

    def _data(
        self, job_id: str, spec: AnyCapeSpec
    ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
        """The job's records from this owner's table, clamped to the spec's public bounds (how
        many were clamped goes to this owner's log only) and, for a model, scaled."""
        assert isinstance(self.table, Table)
        table = self.table
        target = self._target(spec)
        with on_private_data(f"CAPE job {short_id(job_id)}: reading the records"):
            raw_x = table.select(spec.columns)
            if target is None:
                assert isinstance(spec, CapeMeanSpec)
                x, y, moved = spec.clamped(raw_x)
            else:
                assert not isinstance(spec, CapeMeanSpec)
                x, y, moved = spec.clamped(raw_x, table.select([target])[:, 0])
            _log_clamped(job_id, moved, table.n_rows)
            if isinstance(spec, CapeMeanSpec):
                return x, None
            assert y is not None
            return spec.scaled(x, y)

    def open(
        self,
        job_id: str,
        spec: AnyCapeSpec,
        seed: int,
        *,
        curator: str,
        consumer: str,
        market: MarketTerms | None = None,
    ) -> int:
        """Check a new job against the table and the policy; return this owner's row count.

        With a ledger, the job's quote is checked too: ``market`` (this owner's line) must pay
        at least the owner's own prices at the job's epsilon (``spec.cost``) and its minimum
        (:func:`~dpmarket.common.market.terms.check_quote`); once the job is open, the terms are
        recorded durably for its statement (:meth:`dpmarket.owner.earnings.Earnings.accept`).

        Raises
        ------
        FailedPreconditionError
            If this owner holds no table, the spec's ``S_C`` (when the consumer set it) is below
            this owner's floor (the message names the floor), or its ledger refuses the terms
            (for gradient descent, the whole training's total); or (``QuoteRefusedError``) the
            owner has prices and ``market`` is None or quotes less than they give. With a
            ledger, also before anything is read (:mod:`dpmarket.owner.ids`): if the job id is
            settled (its statement is recorded: whatever the terms), was first opened as a
            session, or first opened under other terms (spec, consumer or quote line), or was
            charged already and ``market`` is a quote line (a rerun would charge its epsilon
            again, beyond what the line pays).
        InvalidArgumentError
            If the job id is not one a curator may choose
            (:func:`~dpmarket.owner.ids.check_curator_id`), a column is missing, or a logistic
            regression's or a training's target is not a column this owner declared 0/1
            (values outside the bounds are clamped, never refused: the answer does not depend
            on them); or ``market`` carries a reward (a job delivers no points to split one
            by).
        ResourceExhaustedError, AlreadyExistsError
            Beyond ``max_jobs`` open jobs; a job id in use.
        """
        if self.table is None:
            raise FailedPreconditionError("this owner holds no table for CAPE jobs")
        check_curator_id(job_id, "job_id")
        if market is not None and market.settlement.reward_rule != "none":
            # A reward is split by the points a summary holds (and its statement discloses their
            # count, which an owner consents to for sessions only); a job delivers no points.
            raise InvalidArgumentError(
                f"a CAPE job delivers no points, so its terms carry no reward (reward rule "
                f"{market.settlement.reward_rule!r}); send the job's terms without one"
            )
        ids = self._ids()
        terms = _job_terms(spec, consumer, market)
        if ids is not None:  # the id's own rules first: nothing is read for a refused id
            ids.check_open(curator, job_id, "cape", terms)
            self._check_charged_line(job_id, market)
        if spec.colluders is not None and spec.colluders < self.min_colluders:
            raise FailedPreconditionError(
                f"the job defends against S_C={spec.colluders} colluders, below this owner's "
                f"floor of {self.min_colluders} (its policy's cape.min_colluders)"
            )
        x: NDArray[np.float64] | None = None
        y: NDArray[np.float64] | None = None
        try:
            if isinstance(self.table, PartitionedTable):
                self._target(spec)
                rows = self.table.n_rows
            else:
                x, y = self._data(job_id, spec)
                rows = int(x.shape[0])
        except ValueError as exc:  # a missing column: names only
            raise InvalidArgumentError(str(exc)) from exc
        if self.ledger is not None:
            epsilon, delta = spec.cost
            self.ledger.check(
                session=job_id,
                consumer=consumer,
                curator=curator,
                mechanism=spec.mechanism,
                epsilon=epsilon,
                delta=delta,
                points=0,
            )
            check_quote(self.ledger.policy.prices, market, epsilon, owner=self.name)
        self.expire_idle()
        if self.allow_seeded_sessions:
            rng = np.random.default_rng(seed)
            noise: NoiseSource = SeededNoise(rng)
        else:
            rng, noise = production_rng(), OpenDPNoise()
        job = _Job(spec, curator, consumer, x, y, rng, noise, self.clock(), rows=rows)
        if ids is not None:  # checked again and recorded at once: a racing open of a session
            ids.opened(curator, job_id, "cape", terms)  # under the id is refused, or this one
        with self._lock:
            if job_id in self._jobs:
                raise AlreadyExistsError(f"CAPE job {short_id(job_id)} is already open")
            if self.max_jobs is not None and len(self._jobs) >= self.max_jobs:
                raise ResourceExhaustedError(
                    f"this owner runs at most {self.max_jobs} jobs at once; retry later"
                )
            self._jobs[job_id] = job
        if self.ledger is not None and market is not None:  # what its statement is checked against
            prices = self.ledger.policy.prices
            Earnings(self.ledger, self.name).accept(
                curator=curator, session=job_id, consumer=consumer, market=market, prices=prices
            )
        return rows

    def _check_charged_line(self, job_id: str, market: MarketTerms | None) -> None:
        """Refuse to reopen, under a quote line, a job id its terms were charged under already:
        a run charges its terms' epsilon again, beyond what the line (and so the id's one
        statement) pays. Without a line there is no statement, and a rerun is charged again."""
        assert self.ledger is not None
        if market is not None and self.ledger.session_totals(job_id).epsilon > 0:
            raise FailedPreconditionError(
                f"CAPE job {short_id(job_id)} charged its terms' epsilon already: run again, "
                "it would charge it again, beyond what its quote line pays; run it under a new id"
            )

    def _check_plan_inputs(
        self, job: _Job, sites: Sequence[str], colluders: int, first_iteration: int
    ) -> tuple[str, ...]:
        """The sites as a tuple, once the plan's public inputs are ones this owner accepts."""
        if job.aborted is not None:
            raise AbortedError(f"the job was aborted at this owner: {job.aborted}")
        if job.released and not job.training:
            raise FailedPreconditionError("the job has released already")
        names = tuple(sites)
        if list(names) != sorted(set(names)):
            raise InvalidArgumentError(f"sites must be sorted and distinct, got {list(names)}")
        if self.name not in names:
            raise InvalidArgumentError(f"owner {self.name} is not among the sites {names}")
        self._require_identity().check_roster(names)
        if job.training:
            if first_iteration <= job.last_iteration:
                raise FailedPreconditionError(
                    f"iteration {job.last_iteration} is released already: a new plan must start "
                    f"after it, not at {first_iteration}"
                )
        elif first_iteration != 0:
            raise InvalidArgumentError(
                f"first_iteration is for gradient descent only, got {first_iteration}"
            )
        # S_C is fixed once a release was made with it: every iteration keeps the same
        # guarantee against the same number of colluders.
        fixed = job.plan.colluders if job.released and job.plan is not None else None
        check_colluders(job.spec, len(names), colluders, self.min_colluders, fixed=fixed)
        return names

    def _require_identity(self) -> SiteIdentity:
        if self.identity is None:
            raise FailedPreconditionError(
                "a CAPE plan needs this owner's certificate to sign its row count; it runs "
                "without one (--insecure)"
            )
        return self.identity

    def attest(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        *,
        curator: str,
        first_iteration: int = 0,
    ) -> tuple[SizeAttestation, bytes]:
        """Sign this owner's row count for a plan; return it with this owner's certificate.

        The signature covers :func:`dpmarket.common.cape.agreement.plan_statement`: the job, its
        spec, the sites, ``S_C``, the first iteration, this owner and its count. Nothing is signed
        for a plan this owner would refuse.

        Raises
        ------
        InvalidArgumentError
            If the sites are not sorted and distinct or do not hold this owner, or
            ``first_iteration`` is out of range.
        FailedPreconditionError
            If ``S_C`` is not one this owner may plan with (its floor, the spec's or the default,
            the training's; :func:`dpmarket.common.cape.agreement.check_colluders`), a statistic job
            has released, a training would re-plan an iteration released already, this owner has
            no identity, or a site is not on this owner's roster (its policy's ``[peers]``: the
            curator cannot add a site, :meth:`dpmarket.owner.secagg.SiteIdentity.check_roster`).
        AbortedError
            If the job was aborted at this owner.
        """
        identity = self._require_identity()
        job = self._job(job_id, curator)
        with job.lock:
            names = self._check_plan_inputs(job, sites, colluders, first_iteration)
            rows = job.rows
            message = plan_statement(
                job_id, job.spec, names, colluders, first_iteration, self.name, rows
            )
            signature = identity.signer.sign(message)
        return SizeAttestation(self.name, rows, signature), identity.certificate_pem

    def plan(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        attestations: Mapping[str, SizeAttestation],
        certificates: Mapping[str, bytes],
        *,
        curator: str,
        first_iteration: int = 0,
    ) -> AnyCapePlan:
        """Fix the sites, ``S_C`` and the row counts of the next noise round, and compute the
        plan, once every site's signed count is checked.

        Parameters
        ----------
        job_id : str
        sites : sequence of str
            The plan's sites, sorted.
        colluders : int
            The plan's ``S_C``.
        attestations : mapping of str to SizeAttestation
            Every site's signed row count (:meth:`attest`), as the curator relays them.
        certificates : mapping of str to bytes
            Every site's certificate (PEM; empty in-process, where the identity trusts the keys).
        first_iteration : int, default 0
            Gradient descent only: the first iteration the round covers; after releases it must
            follow the last iteration released (a statistic job must pass 0).

        Raises
        ------
        InvalidArgumentError
            As :meth:`attest`, or if the plan cannot be made.
        FailedPreconditionError
            As :meth:`attest`.
        AbortedError
            If a site's signed count is missing, filed under another site, or does not verify
            against its certificate (deployment CA, name = site, the key this owner pins for
            the site) for exactly this plan (every site signs the same sorted sites, so a
            roster the curator changed between sites fails here), or this
            owner's own count is not its own: the job is aborted at this owner (every later call
            of it fails; it has released nothing and charged nothing). Also if it was aborted
            before.
        """
        identity = self._require_identity()
        job = self._job(job_id, curator)
        with job.lock:
            names = self._check_plan_inputs(job, sites, colluders, first_iteration)
            try:
                own = attestations.get(self.name)
                if own is None or own.rows != job.rows:
                    raise AbortedError(
                        f"the row count relayed for this owner ({self.name}) is not the one it "
                        "signed"
                    )
                verifier = identity.verifier()
                try:
                    verifier.admit({s: certificates.get(s, b"") for s in names})
                except ValueError as exc:
                    raise AbortedError(
                        f"a signed row count comes with a bad certificate: {exc}"
                    ) from None
                counts = check_attestations(
                    job_id, job.spec, names, colluders, first_iteration, attestations, verifier
                )
            except AbortedError as exc:
                job.aborted = str(exc)
                raise
            try:
                plan = plan_for(job.spec, counts, colluders, first_iteration)
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from exc
            job.plan, job.index, job.sites = plan, names.index(self.name), names
            if isinstance(plan, CapeTrainingPlan):
                job.noise_scale = max(job.noise_scale, *plan.site_scales)
            job.draws.clear()
            job.survivors.clear()
            return plan

    def check_round(self, job_id: str, params: RoundParams) -> None:
        """Admit a secure-aggregation round of a job before this site sends anything in it
        (:class:`dpmarket.owner.secagg.SiteRounds`' ``admit``).

        Raises
        ------
        NotFoundError
            For an unknown job (the curator was checked by the secure-aggregation service).
        FailedPreconditionError
            If the job is not planned (or released already, for a statistic), or the round's
            sites, vector length or ``S_C`` are not the plan's (``S_C`` below the plan's would
            let fewer colluders than the plan assumes learn this site's noise draw).
        AbortedError
            If the job was aborted at this owner.
        """
        job = self._any_curators_job(job_id)
        with job.lock:
            self._round_plan(job, params)

    def _any_curators_job(self, job_id: str) -> _Job:
        """A job by id, whichever curator opened it (secure aggregation checked the curator)."""
        check_curator_id(job_id, "job_id")
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
        ids = self._ids()
        if ids is not None:  # a settled job's rounds are refused too
            ids.check_unsettled(job.curator, job_id)
        return job

    @staticmethod
    def _round_plan(job: _Job, params: RoundParams) -> AnyCapePlan:
        """The plan a round of ``job`` must follow (``job.lock`` held): the job is not aborted,
        is planned (and, for a statistic, has not released), the round's sites and length are
        the plan's, and it defends against at least the plan's ``S_C`` (a lower threshold would
        let fewer colluders than the plan assumes learn this site's draw)."""
        if job.aborted is not None:
            raise AbortedError(f"the job was aborted at this owner: {job.aborted}")
        plan = job.plan
        if plan is None or (job.released and not job.training):
            raise FailedPreconditionError("the job is not planned, or released already")
        if tuple(params.sites) != job.sites or params.vector_length != plan.round_length:
            raise FailedPreconditionError(
                "the round's sites or vector length differ from the job's plan"
            )
        if params.colluders < plan.colluders:
            raise FailedPreconditionError(
                f"the round defends against S_C={params.colluders} colluders, the job's "
                f"plan against {plan.colluders}"
            )
        return plan

    def noise_input(self, job_id: str, params: RoundParams) -> NDArray[np.float64]:
        """Secure aggregation's input source: a fresh zero-sum noise draw for this round
        (Algorithm 1, step 2; for gradient descent, every iteration the plan covers), kept for
        the releases; the round must follow the job's current plan, and draws once.

        Raises
        ------
        NotFoundError
            For an unknown job (no curator check here: the round was authorized by the
            secure-aggregation service for the same curator).
        FailedPreconditionError
            If the job is not planned, the round's sites or length are not the plan's, it
            defends against fewer colluders than the plan (checked again here, not only when
            the round was admitted: a round admitted under an earlier plan with a lower ``S_C``
            must not carry a draw calibrated for more colluders), or this site drew for the
            round already (a repeated masked input would otherwise keep a draw other than the
            one summed: the zero-sum property would break in silence).
        AbortedError
            If the job was aborted at this owner.
        """
        job = self._any_curators_job(job_id)
        with job.lock:
            plan = self._round_plan(job, params)
            if params.round_id in job.draws:
                raise FailedPreconditionError(
                    f"this site drew its noise for round {params.round_id.hex()[:8]}… already: a "
                    "round takes one draw"
                )
            e_hat = plan.noise_share(job.index, job.noise)
            job.draws[params.round_id] = e_hat
            return secure_aggregation_input(plan, job.index, e_hat.ravel())

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

    def _round_draws(self, job: _Job, round_id: bytes) -> NDArray[np.float64]:
        """This site's draws of a finished round over exactly the planned sites."""
        if job.aborted is not None:
            raise AbortedError(f"the job was aborted at this owner: {job.aborted}")
        e_hat = job.draws.get(round_id)
        if e_hat is None:
            raise NotFoundError(f"this site drew no noise in round {round_id.hex()[:8]}…")
        if job.survivors.get(round_id) != job.sites:
            raise FailedPreconditionError(
                "the noise round's survivors are not the planned sites: re-plan and rerun it"
            )
        return e_hat

    def _charge(self, job: _Job, job_id: str) -> None:
        """Charge the job's terms once, before its first release (charge, then release)."""
        if self.ledger is not None and not job.charged:
            epsilon, delta = job.spec.cost
            self.ledger.charge(
                session=job_id,
                consumer=job.consumer,
                curator=job.curator,
                mechanism=job.spec.mechanism,
                epsilon=epsilon,
                delta=delta,
                points=0,
                record=IdState(self.ledger, self.name).charge_guard(job.curator, job_id),
            )
        job.charged = True

    def _partitioned_statistic(
        self,
        job_id: str,
        job: _Job,
        plan: AnyCapePlan,
        theta: NDArray[np.float64] | None = None,
    ) -> NDArray[np.float64]:
        """The job's statistic on a partitioned table: the same mean over rows as the in-memory
        one (the CAPE mean, capeFM's packed coefficients, the clipped-gradient average), merged
        from each partition's mean weighted by its rows (:func:`dpmarket.owner.partitioned.
        mean_statistic`). Each row still contributes once, so the sensitivity the plan's noise is
        calibrated to is unchanged; the noise is added once, by the caller, after the merge."""
        table = self.table
        assert isinstance(table, PartitionedTable)
        spec = job.spec
        target = self._target(spec)
        columns = (*spec.columns, *([] if target is None else [target]))
        if isinstance(plan, CapeMeanPlan):
            assert isinstance(spec, CapeMeanSpec)
            fn = functools.partial(_mean_part, spec)
        elif isinstance(plan, CapeFMPlan):
            fn = functools.partial(_fm_part, spec, plan.task, plan.orders)
        else:
            assert isinstance(spec, CapeTrainingSpec) and theta is not None
            fn = functools.partial(_gradient_part, spec, theta)
        found = table.data.statistic(columns, fn)
        moved: dict[str, int] = {}
        for _, _, m in found:
            for column, count in m.items():
                moved[column] = moved.get(column, 0) + count
        _log_clamped(job_id, moved, table.n_rows)
        rows, value = mean_statistic([(n, v) for n, v, _ in found])
        if rows != job.rows:
            raise ValueError(f"the table holds {rows} rows, {job.rows} planned")
        return value

    def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64], *, curator: str
    ) -> NDArray[np.float64]:
        """Charge, then release ``f(x_s) + e_s + g_s`` (Algorithm 2; Algorithm 4, steps 5-8):
        capeFM's coefficients or the site's mean.

        Raises
        ------
        NotFoundError
            For an unknown job or a round this site did not draw noise for.
        FailedPreconditionError
            If the job is a training (it releases gradients), the round's survivors are not the
            planned sites (the zero-sum property would not hold over the averaged sites), the
            job released already, or the ledger refuses.
        InvalidArgumentError
            If ``total`` has the wrong shape, is not finite or would bring the release near
            overflow (:func:`_check_headroom`): decided before any record is read.

        Notes
        -----
        After the records are read nothing raises on their account: the statistic is finite and
        bounded by the spec's public bounds whatever the records (clamped into the box, a width
        and values within :data:`dpmarket.common.cape.spec.MAX_MAGNITUDE`), so the release is
        finite and the answer (release or status) is the same on any records.
        """
        job = self._job(job_id, curator)
        with job.lock:
            plan = job.plan
            if job.training:
                raise FailedPreconditionError(
                    "a training job releases gradients, one per iteration"
                )
            if plan is None or job.released:
                raise FailedPreconditionError("the job is not planned, or released already")
            e_hat = self._round_draws(job, round_id)
            total = _checked_vector(total, plan.size, "noise_total")
            _check_floor(total, "noise_total")
            _check_headroom(plan, job.index, e_hat, total)
            with on_private_data(f"CAPE job {short_id(job_id)}: the statistic"):
                if job.x is None:
                    statistic = self._partitioned_statistic(job_id, job, plan)
                elif isinstance(plan, CapeMeanPlan):
                    statistic = site_mean(plan, job.index, job.x)
                else:
                    assert isinstance(plan, CapeFMPlan) and job.y is not None
                    statistic = site_coefficients(plan, job.index, job.x, job.y)
            self._charge(job, job_id)
            job.released = True
            return site_release(plan, job.index, statistic, e_hat, total, job.noise)

    def release_gradient(
        self,
        job_id: str,
        round_id: bytes,
        iteration: int,
        parameters: NDArray[np.float64],
        total: NDArray[np.float64],
        *,
        curator: str,
    ) -> NDArray[np.float64]:
        """Charge the whole training (first release only), then release one iteration: the
        clipped-gradient average at ``parameters`` plus ``e_s,t + g_s,t``.

        Parameters
        ----------
        job_id : str
        round_id : bytes
            The noise round of the current plan.
        iteration : int
            ``t``: after the last iteration released and within the plan's iterations.
        parameters : ndarray of shape (P,)
            The network's parameters broadcast by the curator (public).
        total : ndarray of shape (P,)
            The round's sum for iteration ``t``.

        Returns
        -------
        ndarray of shape (P,), float64

        Raises
        ------
        NotFoundError
            For an unknown job or a round this site did not draw noise for.
        FailedPreconditionError
            If the job is not a planned training, the round's survivors are not the planned
            sites, the iteration was released already (or precedes one that was), or the ledger
            refuses.
        InvalidArgumentError
            If the iteration is outside the plan, ``parameters`` or ``total`` have the wrong
            shape or are not finite, a parameter exceeds what an honest training reaches by this
            iteration (:func:`_checked_parameters`), or the total would bring the release near
            overflow (:func:`_check_headroom`): all decided before any record is read or
            anything charged.

        Notes
        -----
        The parameters are the curator's choice, and a curator may lie: crafted ones (near the
        largest float) would overflow the gradient of exactly the records beyond a threshold
        they encode. They are bounded first, and the gradient is total whatever they are
        (:func:`dpmarket.common.cape.dpgd.site_gradient`: an example whose gradient is not
        finite counts as 0, sensitivity still ``2 C / N_s``), so the answer (release or
        status) never tells whether a record overflowed.
        """
        job = self._job(job_id, curator)
        with job.lock:
            plan = job.plan
            if not isinstance(plan, CapeTrainingPlan):
                raise FailedPreconditionError("the job is not a planned training")
            assert isinstance(job.spec, CapeTrainingSpec)
            e_hat = self._round_draws(job, round_id)
            if iteration <= job.last_iteration:
                raise FailedPreconditionError(
                    f"iteration {iteration} is not after the last one released "
                    f"({job.last_iteration}): an iteration is released at most once"
                )
            if not plan.first_iteration <= iteration < plan.iterations:
                raise InvalidArgumentError(
                    f"iteration must lie in [{plan.first_iteration}, {plan.iterations}), got "
                    f"{iteration}"
                )
            theta = _checked_parameters(job.spec, parameters, iteration, job.noise_scale)
            total = _checked_vector(total, plan.size, "noise_total")
            _check_floor(total, "noise_total")
            row = e_hat[iteration - plan.first_iteration]
            _check_headroom(plan, job.index, row, total)
            with on_private_data(f"CAPE job {short_id(job_id)}: the gradient"):
                if job.x is None:
                    gradient = self._partitioned_statistic(job_id, job, plan, theta)
                else:
                    assert job.y is not None
                    gradient = site_gradient(
                        theta, job.x, job.y, clip=job.spec.clip, hidden=job.spec.hidden
                    )
            self._charge(job, job_id)
            job.released = True
            job.last_iteration = int(iteration)
            return site_release(plan, job.index, gradient, row, total, job.noise)

    def close(self, job_id: str, *, curator: str) -> SessionSpend:
        """Forget a job; return what it spent of this owner's budget.

        A job this owner no longer holds (closed before, closed for being idle, or opened before
        the owner restarted) is answered from the ledger alone: what ``curator``'s charges under
        that id total, zero when it charged none. So the curator that opened it learns its
        record whenever it asks (its settlement waits for it), and the answer is the ledger's,
        whatever the curator claims.

        Raises
        ------
        NotFoundError
            If another curator holds the job, or charged under its id, or (without a ledger) no
            job has that id.
        """
        check_curator_id(job_id, "job_id")
        with self._lock:
            held = self._jobs.get(job_id)
        if held is None and self.ledger is not None:
            if any(e.curator != curator for e in self.ledger.entries(session=job_id)):
                raise NotFoundError(f"unknown CAPE job {short_id(job_id)}")
            return self._spent(job_id)
        job = self._job(job_id, curator, closing=True)
        with self._lock:
            self._jobs.pop(job_id, None)
        if self.ledger is not None:
            return self._spent(job_id)
        epsilon, delta = job.spec.cost if job.charged else (0.0, 0.0)
        return SessionSpend(epsilon, delta, 0)

    def _spent(self, job_id: str) -> SessionSpend:
        """What the ledger recorded for a job (zero for an id it holds no charge under)."""
        assert self.ledger is not None
        totals = self.ledger.session_totals(job_id)
        return SessionSpend(totals.epsilon, totals.delta, totals.points, totals.non_private)

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


def _job_terms(spec: AnyCapeSpec, consumer: str, market: MarketTerms | None) -> dict[str, object]:
    """The terms a job id is fixed to at its first open (:mod:`dpmarket.owner.ids`): its spec
    (kind and every field), its consumer and its quote line."""
    return {
        "spec": {"kind": type(spec).__name__, **dataclasses.asdict(spec)},
        "consumer": consumer,
        "market": None if market is None else dataclasses.asdict(market),
    }


def _log_clamped(job_id: str, moved: Mapping[str, int], rows: int) -> None:
    """Log how many values the request's bounds clamped (this owner's log only), whether or not
    any were: a step that logged only when some were, before its charge, would take longer for
    some tables, which a curator could time."""
    logger.info(
        "CAPE job %s: values clamped to the request's public bounds (this log only): %s of %d rows",
        short_id(job_id),
        ", ".join(f"{c!r} {n}" for c, n in moved.items()) or "none",
        rows,
    )


def _checked_vector(values: NDArray[np.float64], length: int, name: str) -> NDArray[np.float64]:
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (length,) or not np.isfinite(out).all():
        raise InvalidArgumentError(
            f"{name} must be {length} finite values, got shape {out.shape}"
            + ("" if out.shape != (length,) else " with NaN or inf")
        )
    return out


def _check_floor(values: NDArray[np.float64], name: str) -> None:
    """Refuse a curator's parameters or noise total holding a value non-zero below
    :data:`~dpmarket.common.validation.PARAMETER_FLOOR` in magnitude (InvalidArgumentError;
    public inputs only, before any record is read): products with such numbers can be
    subnormal, and a gradient's time would follow how many records pass a threshold."""
    try:
        check_not_tiny(values, name)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


def _checked_parameters(
    spec: CapeTrainingSpec, parameters: NDArray[np.float64], iteration: int, noise_scale: float
) -> NDArray[np.float64]:
    """The parameters a curator sent for ``iteration``, refused unless an honest training can
    reach them (:func:`dpmarket.common.cape.dpgd.parameter_bound`: the spec's clip and learning
    rate, the iteration and ``noise_scale``, the largest site noise scale of the training's
    plans): public grounds only, before any record is read or anything charged.

    Raises
    ------
    InvalidArgumentError
        If ``parameters`` are not ``P`` finite values, one exceeds the bound (naming the
        largest and the bound) or one is non-zero below
        :data:`~dpmarket.common.validation.PARAMETER_FLOOR` (:func:`_check_floor`).
    """
    theta = _checked_vector(parameters, spec.n_params, "parameters")
    bound = parameter_bound(
        clip=spec.clip,
        learning_rate=spec.learning_rate,
        iteration=iteration,
        noise_scale=noise_scale,
    )
    largest = float(np.max(np.abs(theta)))
    if not largest <= bound:
        raise InvalidArgumentError(
            f"parameters of iteration {iteration} reach |theta| = {largest:.6g}, beyond "
            f"{bound:.6g}, the most a training with this learning rate, clip and noise reaches "
            "by then: send the training's own parameters"
        )
    _check_floor(theta, "parameters")
    return theta


#: The largest ``|e_s| + z tau_g`` (:func:`_check_headroom`) an owner releases over: ``2^1000``.
HEADROOM = 2.0**1000


def _check_headroom(
    plan: AnyCapePlan, index: int, e_hat: NDArray[np.float64], total: NDArray[np.float64]
) -> None:
    """Refuse a noise total that would bring the release near the largest float, before any
    record is read or anything charged: the release ``f + e_s + g_s`` must be finite whatever
    the data, and ``|f| <= 1e100`` by the specs' public limits
    (:data:`dpmarket.common.cape.spec.MAX_MAGNITUDE`), so ``|e_s| + z tau_g <= 2^1000`` (``z =``
    :data:`dpmarket.common.cape.dpgd.NOISE_TAIL`) leaves it far from overflow. An honest total
    (a sum of Gaussian draws) is many orders of magnitude below.

    Raises
    ------
    InvalidArgumentError
        If the total, or the plan's noise scale, leaves less headroom.
    """
    scale = float(np.max(plan.entry_scales(index))) / math.sqrt(plan.sites)
    with np.errstate(over="ignore", invalid="ignore"):
        e_s = zero_sum_correction(e_hat, total, plan.sites, weight=plan.site_weight(index))
        reach = float(np.max(np.abs(e_s))) + NOISE_TAIL * scale
    if not reach <= HEADROOM:
        raise InvalidArgumentError(
            f"noise_total (max |value| {float(np.max(np.abs(total))):.6g}) with this plan's "
            f"noise scale {scale:.6g} would bring the release within reach of overflow "
            f"(|e_s| + {NOISE_TAIL:g} tau_g = {reach:.6g} > 2^1000): send the round's sum"
        )


def sorted_sites(names: Sequence[str]) -> tuple[str, ...]:
    """Site ids in the order every party uses (Python ``str`` order)."""
    return tuple(sorted(names))


def _split(spec: AnyCapeSpec, values: NDArray[np.float64]) -> tuple[Any, Any, dict[str, int]]:
    """A partition's records clamped to the spec's bounds (target last when the spec has one)."""
    n_features = len(spec.columns)
    if isinstance(spec, CapeMeanSpec):
        x, _, moved = spec.clamped(values[:, :n_features])
        return x, None, dict(moved)
    x, y, moved = spec.clamped(values[:, :n_features], values[:, n_features])
    return x, y, dict(moved)


def _mean_part(
    spec: CapeMeanSpec, values: NDArray[np.float64]
) -> tuple[int, NDArray[np.float64], dict[str, int]]:
    """One partition's CAPE mean: ``(rows, mean of the clamped records, clamped per column)``."""
    x, _, moved = _split(spec, values)
    if x.shape[0] == 0:
        return 0, np.zeros(x.shape[1]), moved
    return int(x.shape[0]), x.mean(axis=0), moved


def _fm_part(
    spec: AnyCapeSpec, task: str, orders: Any, values: NDArray[np.float64]
) -> tuple[int, NDArray[np.float64], dict[str, int]]:
    """One partition's packed functional-mechanism coefficients (means over its rows)."""
    from dpmarket.common.cape.functional_mechanism import fm_coefficients, pack_coefficients

    assert isinstance(spec, CapeJobSpec)
    clamped_x, clamped_y, moved = _split(spec, values)
    x, y = spec.scale_clamped(clamped_x, clamped_y)
    if x.shape[0] == 0:
        return 0, np.zeros(0), moved
    return int(x.shape[0]), pack_coefficients(fm_coefficients(x, y, task), orders), moved  # type: ignore[arg-type]


def _gradient_part(
    spec: CapeTrainingSpec, theta: NDArray[np.float64], values: NDArray[np.float64]
) -> tuple[int, NDArray[np.float64], dict[str, int]]:
    """One partition's clipped-gradient average at ``theta``."""
    _, _, moved = _split(spec, values)
    n_features = len(spec.columns)
    x, y = spec.scaled(values[:, :n_features], values[:, n_features])
    if x.shape[0] == 0:
        return 0, np.zeros(theta.shape[0]), moved
    return (
        int(x.shape[0]),
        site_gradient(theta, x, y, clip=spec.clip, hidden=spec.hidden),
        moved,
    )
