"""The curator's side of the summarization protocol (Algorithm 3) as a plain async state object.

A :class:`SummarizationSession` drives any sequence of
:class:`common.summarization.endpoints.OwnerEndpoint`
objects: in-process owners (``dpmarket simulate``, tests, benchmarks) or gRPC clients (the
curator service). Given the same seed and owners it makes the same random draws in the same order,
so both runs return the same summary bit for bit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from common.errors import (
    AbortedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from common.privacy.accounting import PrivacyEvent, analytic_gaussian_sigma
from common.privacy.ledger import Charge, PrivacyLedger, SessionSpend
from common.privacy.noise import NoiseSource, SeededNoise
from common.sketches import PrivateSketch, RFFMap
from common.summarization.auction import (
    AuctionParams,
    auction_events,
    auction_parameters,
    choose_owners_to_ask,
    parsimony_bound,
    rank_owners,
)
from common.summarization.calibration import (
    TREE_INCREMENT_SENSITIVITY,
    gaussian_epsilon,
    rounds_auction,
    rounds_tree_sigma,
)
from common.summarization.candidates import (
    allocate_candidates,
    relevance_threshold,
    shrink_embedding,
    validation_embedding_sensitivity,
)
from common.summarization.continual import TreePrefixSum
from common.summarization.endpoints import OwnerBid, OwnerEndpoint, OwnerInfo, ReleasedPoint
from common.summarization.kernels import (
    bid_direction,
    bid_scores,
    check_kernel_width,
    embedding_greedy,
    exact_kernel_greedy,
    marginal_gain_score,
)
from common.summarization.mwem import MWEMRelease, MWEMState
from common.summarization.quantization import quantize_features
from common.summarization.rff import RFFParams, draw_rff_params, random_fourier_features
from common.summarization.sketch_allocation import (
    noisy_relevance,
    relevance_matrix,
    relevance_sensitivity,
    responsibilities,
    split_gaussian_sigmas,
)
from common.summarization.summary import (
    ProgressEvent,
    SessionReport,
    SummarizationConfig,
    SummaryResult,
)
from common.summarization.terms import OwnerTerms, owner_terms
from common.validation import check_matrix

logger = logging.getLogger(__name__)

Party = Literal["validation", "owners", "public"]
#: The per-round loop's modes: non-private greedy, the paper's Algorithm 3, the rounds method.
RoundsMode = Literal["greedy", "private", "rounds"]

#: Relative and absolute tolerance when checking a reported bid against the released point
#: (owner and curator compute the same float32 products; only summation order may differ).
BID_RTOL = 1e-4
BID_ATOL = 1e-5

T = TypeVar("T")


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class _PoolEntry:
    point: NDArray[np.float64]
    features: NDArray[np.float32]
    label: int | None
    owner: int


@dataclass
class _OwnerSlot:
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


@dataclass
class _SummaryState:
    points: list[NDArray[np.float64]] = field(default_factory=list)
    labels: list[int | None] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)


class _SummaryRelease:
    """How the running summary embedding g_l reaches the owners each round (Algorithm 3, step 5).

    :meth:`release` returns ``(g, q)`` to broadcast in ``round_`` (charging what it releases);
    :meth:`add` takes the h1 features of the point added at the end of ``round_``.
    """

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        raise NotImplementedError

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        raise NotImplementedError


class _ExactSummary(_SummaryRelease):
    """Non-private greedy: the exact mean h1 embedding of the summary."""

    def __init__(self, seed_features: NDArray[np.floating]) -> None:
        self.q = seed_features.shape[0]
        self.total = seed_features.sum(axis=0)

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        return (np.zeros_like(self.total) if self.q == 0 else self.total / self.q), self.q

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        self.total = self.total + features
        self.q += 1


class _MWEMSummary(_SummaryRelease):
    """The paper's h2 release of the quantized summary, MWEM warm-started across rounds; round 1
    releases the public seed set only (charged as ``"public"``)."""

    def __init__(self, session: SummarizationSession, seed_features: NDArray[np.floating]) -> None:
        cfg = session.config
        self.session = session
        self.q = seed_features.shape[0]
        self.eta = cfg.eta
        self.quantized_sum = (
            quantize_features(seed_features, self.eta, session.rng).sum(axis=0)
            if self.q > 0
            else np.zeros(cfg.rff_dimension)
        )
        self.mwem = MWEMState(cfg.rff_dimension, self.eta)

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        cfg = self.session.config
        if self.q == 0:
            return np.zeros(cfg.rff_dimension), 0
        public = round_ == 1
        release = self.mwem.release(
            self.quantized_sum,
            self.q,
            cfg.t_init if public else cfg.iterations_subsequent,
            cfg.epsilon_first_epoch if public else cfg.epsilon_per_later_iteration,
            self.session.rng,
            self.session.noise,
        )
        self.session._charge_mwem(
            "public" if public else "owners",
            f"h2(h1(D_s)) round {round_}" + (" (seed set only)" if public else ""),
            release,
        )
        return release.embedding, self.q

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        self.quantized_sum = (
            self.quantized_sum + quantize_features(features[None, :], self.eta, self.session.rng)[0]
        )
        self.q += 1


class _TreeSummary(_SummaryRelease):
    """Rounds method: ``g_l = (sum h1(D_init) + noisy prefix sum of h1 of acquired points) / q``,
    the prefix sum released by the binary tree
    (:class:`common.summarization.continual.TreePrefixSum`)."""

    def __init__(
        self, session: SummarizationSession, seed_features: NDArray[np.floating], sigma: float
    ) -> None:
        cfg = session.config
        self.session = session
        self.n_seed = seed_features.shape[0]
        self.seed_sum = seed_features.sum(axis=0)
        self.p = cfg.summary_size
        # Rounds 2..p release the prefix sums of acquired points 1..p-1; the p-th is never used.
        self.tree = TreePrefixSum(
            max(self.p - 1, 1), cfg.rff_dimension, sigma, session.rng, session.noise
        )
        self.charged = False

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        q = self.n_seed + self.tree.count
        if q == 0:
            return np.zeros_like(self.seed_sum), 0
        if self.tree.count > 0 and not self.charged:
            self._charge()
        return (self.seed_sum + self.tree.prefix_sum()) / q, q

    def _charge(self) -> None:
        """Charge the whole tree once, at its first release: every acquired point enters at most
        ``levels`` released nodes, each a Gaussian mechanism of L2 sensitivity 2 sqrt(2)."""
        cfg = self.session.config
        sigma, levels, sens = self.tree.sigma, self.tree.levels, TREE_INCREMENT_SENSITIVITY
        self.session.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    f"summary embedding: binary-tree prefix sums, {levels} nodes per point",
                    PrivacyEvent(
                        "gaussian",
                        gaussian_epsilon(sigma, cfg.delta, sens),
                        levels,
                        sens,
                        scale=sigma,
                        delta=cfg.delta,
                    ),
                )
            ]
        )
        self.charged = True

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        if round_ < self.p:  # the last point is never released
            self.tree.add(features)


class _NoSummary(_SummaryRelease):
    """Rounds method without a summary broadcast: a zero embedding and q = 0 every round, so the
    owners bid ``gtilde . h1(x)``."""

    def __init__(self, d: int) -> None:
        self.d = d

    def release(self, round_: int) -> tuple[NDArray[np.float64], int]:
        return np.zeros(self.d), 0

    def add(self, features: NDArray[np.float64], round_: int) -> None:
        return None


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
        sessions pass :class:`~common.privacy.noise.OpenDPNoise`.
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
    ) -> None:
        try:
            self.validation = check_matrix(validation, "validation set")
            self.seed_set = check_matrix(
                seed_set, "seed set", n_features=self.validation.shape[1], allow_empty=True
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        self.owner_sketches = dict(owner_sketches or {})
        for owner, sketch in self.owner_sketches.items():
            if not isinstance(sketch, PrivateSketch) or not isinstance(sketch.feature_map, RFFMap):
                raise InvalidArgumentError(f"the sketch of owner {owner} is not an RFF sketch")
            if sketch.feature_map.n_attributes != self.validation.shape[1]:
                raise InvalidArgumentError(
                    f"the sketch of owner {owner} describes {sketch.feature_map.n_attributes} "
                    f"attributes but the validation set has {self.validation.shape[1]}"
                )
        #: The candidates method's allocation in effect (decided in prepare()).
        self.allocation: Literal["sketch", "counts"] = "counts"
        self.allocation_note = ""
        if not owners:
            raise InvalidArgumentError("at least one owner is required")
        self.session_id = session_id
        self.owner_session_id = owner_session_id or session_id
        self.config = config
        self.rng = rng
        self.noise: NoiseSource = noise if noise is not None else SeededNoise(rng)
        self.consumer = consumer
        self.slots = [_OwnerSlot(endpoint=o) for o in owners]
        self.on_progress = on_progress
        self.call_timeout = call_timeout
        one_delta = config.method in ("candidates", "rounds")
        self.ledgers = {
            "validation": PrivacyLedger(
                delta_tilde=config.delta if one_delta else config.delta_validation,
                on_charge=on_charge,
            ),
            "owners": PrivacyLedger(
                delta_tilde=config.delta if one_delta else config.delta_owners,
                on_charge=on_charge,
            ),
        }
        self.terms: OwnerTerms | None = None
        self._rff: RFFParams | None = None
        self._start = time.perf_counter()
        self._candidates_info: dict[str, Any] = {}
        self._summary_size = 0
        self.iterations = 0
        self.points_accessed = 0
        self.rejected_points = 0
        self.rounds_done = 0
        self.round_seconds: list[float] = []
        self._prepared = False
        self._auction: AuctionParams | None = None

    # ----------------------------------------------------------------------------------- setup
    async def prepare(self, *, check_terms: Callable[[OwnerTerms], None] | None = None) -> None:
        """Check the request against the owners and open the session at every owner.

        Asks every owner for its dataset description; checks feature counts, the summary size
        and the kernel width; derives the session's terms (what it spends of each owner's
        privacy, :func:`~common.summarization.terms.owner_terms`) and lets ``check_terms`` (the
        curator's policy) refuse them; draws h1's parameters and opens the session at every
        owner with the terms, which each owner checks against its own policy. Nothing is
        released or charged: h1's parameters are public randomness. Owners that do not answer
        are dropped (and named in the report). On failure, sessions already opened are closed.

        Raises
        ------
        UnavailableError
            If no owner answers.
        InvalidArgumentError
            If an owner's feature count differs from the validation set's, the owners hold fewer
            points than the summary size, ``gamma`` makes every kernel value 0 or 1 on the
            validation set, or ``check_terms`` refuses the terms.
        FailedPreconditionError
            If an owner's policy refuses the terms, or the owners' policies allow fewer raw
            points than the summary size.
        """
        try:
            await self._prepare(check_terms)
        except BaseException:
            await self._close_owner_sessions()
            raise

    async def _prepare(self, check_terms: Callable[[OwnerTerms], None] | None) -> None:
        infos = await self._gather(range(len(self.slots)), lambda i: self._endpoint(i).info())
        for index, info in infos.items():
            self.slots[index].info = info
        active = self._active()
        if not active:
            raise UnavailableError("no owner answered: " + self._drop_notes())
        n = self.validation.shape[1]
        for index in active:
            owner = self._info(index)
            if owner.num_features != n:
                raise InvalidArgumentError(
                    f"owner {owner.owner_id} has {owner.num_features} features per point but the "
                    f"validation set has {n}"
                )
        total = sum(self._info(i).num_points for i in active)
        if self.config.summary_size > total:
            raise InvalidArgumentError(
                f"summary size p={self.config.summary_size} exceeds the {total} points the "
                f"{len(active)} owner(s) hold"
            )
        try:
            check_kernel_width(self.validation, self.config.gamma)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        cfg = self.config
        self.allocation, self.allocation_note = self._choose_allocation()
        self.terms = await asyncio.to_thread(
            owner_terms,
            cfg,
            len(self.slots),
            validation_size=int(self.validation.shape[0]),
            seed_set_size=int(self.seed_set.shape[0]),
            sketch_allocation=self.allocation == "sketch",
        )
        if check_terms is not None:
            check_terms(self.terms)
        self._rff = draw_rff_params(
            self.validation.shape[1], cfg.rff_dimension, cfg.gamma, self.rng
        )
        seeds = self.rng.integers(0, 2**63 - 1, size=len(self.slots))
        terms, rff = self.terms, self._rff

        async def open_one(i: int) -> tuple[int, int]:
            self.slots[i].opened = True
            return await self._endpoint(i).open_session(
                self.owner_session_id, rff, int(seeds[i]), consumer=self.consumer, terms=terms
            )

        opened = await self._gather(self._active(), open_one, refusals="raise")
        for index, (_, max_points) in opened.items():
            self.slots[index].max_points = int(max_points)
        self._require_owners()
        allowed = sum(self.slots[i].max_points for i in self._active())
        if cfg.summary_size > allowed:
            raise FailedPreconditionError(
                f"the owners' policies allow this session at most {allowed} raw points in all, "
                f"fewer than p = {cfg.summary_size}"
            )
        self._emit("setup", f"h1 shared with {len(self._active())} owner(s)")
        self._prepared = True

    def _choose_allocation(self) -> tuple[Literal["sketch", "counts"], str]:
        """The candidates method's allocation: by sketches when asked for and every owner that
        answered has one, else by noisy counts; with the reason."""
        cfg = self.config
        if cfg.method != "candidates" or cfg.allocation == "counts":
            return "counts", "" if cfg.method != "candidates" else "requested"
        missing = [
            self._name(i) for i in self._active() if self._name(i) not in self.owner_sketches
        ]
        if missing:
            return "counts", "no published sketch for " + ", ".join(missing)
        return "sketch", ""

    def _candidate_budget(self) -> int:
        """The most owner points the candidates method reads: ``max(p, floor(c * p))`` with
        ``c = candidate_multiple``, whatever K; or, with ``candidate_fraction`` > 0, the previous
        rule ``max(p, floor(candidate_fraction * K * p))``. At least p, so a single owner can
        serve a whole summary."""
        cfg = self.config
        p = cfg.summary_size
        if cfg.candidate_fraction > 0:
            return max(p, math.floor(cfg.candidate_fraction * len(self.slots) * p + 1e-9))
        return max(p, math.floor(cfg.candidate_multiple * p + 1e-9))

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
        if not self._prepared or self._rff is None:
            raise FailedPreconditionError("prepare() must succeed before run()")
        start = time.perf_counter()
        cfg = self.config
        rff = self._rff
        summary = _SummaryState()
        try:
            if cfg.method == "uniform":
                await self._run_uniform(summary)
            elif cfg.method == "candidates":
                await self._run_candidates(summary, rff)
            elif cfg.method == "rounds":
                await self._run_greedy(summary, rff, mode="rounds")
            else:
                await self._run_greedy(
                    summary, rff, mode="private" if cfg.method == "private" else "greedy"
                )
        finally:
            await self._close_owner_sessions()
        elapsed = time.perf_counter() - start
        result = self._result(summary, elapsed)
        self._emit("done", f"summary of {len(summary.points)} points in {elapsed:.2f} s")
        return result

    async def _run_uniform(self, summary: _SummaryState) -> None:
        """Draw p/K points uniformly from every owner (the paper's uniform sampling baseline)."""
        round_start = time.perf_counter()
        active = self._active()
        shares = _split_evenly(self.config.summary_size, [self._capacity(i) for i in active])
        requests = {i: s for i, s in zip(active, shares, strict=True) if s > 0}
        results = await self._gather(
            list(requests),
            lambda i: self._endpoint(i).sample_uniform(self.owner_session_id, requests[i]),
        )
        if len(results) != len(requests):
            raise UnavailableError(
                "uniform sampling lost owners mid-session: " + self._drop_notes()
            )
        for index in sorted(results):
            points, labels = results[index]
            self._check_points(points, index)
            self.points_accessed += points.shape[0]
            for row in range(points.shape[0]):
                summary.points.append(points[row])
                summary.labels.append(None if labels is None else int(labels[row]))
                summary.owners.append(index)
        self.rounds_done = 1
        self.round_seconds.append(time.perf_counter() - round_start)
        self._emit("rounds", "uniform sample received")

    async def _run_candidates(self, summary: _SummaryState, rff: RFFParams) -> None:
        """The candidates method (:mod:`common.summarization.candidates`): one private embedding,
        a private allocation of the candidate budget (by the owners' sketches or by their noisy
        relevance counts), local greedy proposals, exact re-ranking by the trusted curator."""
        cfg = self.config
        round_start = time.perf_counter()
        p = cfg.summary_size
        val_features = random_fourier_features(self.validation, rff, dtype=np.float64)
        if self.allocation == "sketch":
            requests, g_val = await self._sketch_allocation(val_features)
        else:
            requests, g_val = await self._counts_allocation(val_features)
        self._emit("rounds", f"candidate shares: {sorted(requests.values(), reverse=True)}")
        proposals = await self._gather(
            list(requests),
            lambda i: self._endpoint(i).propose_candidates(self.owner_session_id, requests[i]),
        )
        points: list[NDArray[np.float64]] = []
        labels: list[int | None] = []
        owner_of: list[int] = []
        for index in sorted(proposals):
            pts, lbl = proposals[index]
            self._check_points(pts, index)
            self.points_accessed += pts.shape[0]
            points.append(pts)
            labels.extend([None] * pts.shape[0] if lbl is None else [int(v) for v in lbl])
            owner_of.extend([index] * pts.shape[0])
        pool = np.concatenate(points) if points else np.zeros((0, self.validation.shape[1]))
        if pool.shape[0] < p:
            raise AbortedError(
                f"owners proposed {pool.shape[0]} candidates, fewer than p = {p}"
                + self._drop_suffix()
            )
        # Re-ranking, after the last message to any owner: exact marginal gains (the curator
        # holds D_v), or the private embedding alone.
        if cfg.embedding_rerank:
            seed_features = random_fourier_features(self.seed_set, rff, dtype=np.float64)
            order = await asyncio.to_thread(
                embedding_greedy, random_fourier_features(pool, rff), g_val, seed_features, p
            )
        else:
            order = await asyncio.to_thread(
                exact_kernel_greedy, pool, self.validation, self.seed_set, p, cfg.gamma
            )
        for j in order:
            summary.points.append(pool[j])
            summary.labels.append(labels[j])
            summary.owners.append(owner_of[j])
        self.rounds_done = 1
        self.round_seconds.append(time.perf_counter() - round_start)
        self._emit("rounds", f"{p} of {pool.shape[0]} candidates chosen")

    async def _counts_allocation(
        self, val_features: NDArray[np.floating]
    ) -> tuple[dict[int, int], NDArray[np.float64]]:
        """The counts allocation: gtilde at the whole validation budget, the owners' noisy
        relevance counts, shares in proportion to them (each owner at most p)."""
        cfg = self.config
        p = cfg.summary_size
        g_val, sigma = self._gaussian_validation_embedding(val_features)
        await self._gather(
            self._active(),
            lambda i: self._endpoint(i).set_validation_embedding(self.owner_session_id, g_val),
        )
        # Relevance counts, each a function of one owner's data: sensitivity 1 under replacing or
        # adding one point, so the Laplace(1 / eps_o) noise each owner adds to its own count (the
        # session's terms) makes the vector eps_o-DP. Charged here too: the session's ledger.
        threshold = relevance_threshold(g_val, cfg.relevance_threshold, noise_sigma=sigma)
        eps_o = cfg.epsilon_owners_total
        self.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    "relevance counts + Laplace noise (drawn by each owner)",
                    PrivacyEvent("laplace", eps_o, 1, 1.0, scale=1.0 / eps_o),
                )
            ]
        )
        counts = await self._gather(
            self._active(),
            lambda i: self._endpoint(i).count_relevant(self.owner_session_id, threshold),
        )
        self._require_owners()
        owners = sorted(counts)
        noisy = np.array([counts[i] for i in owners], dtype=np.float64)
        shares = allocate_candidates(
            self._candidate_budget(),
            np.maximum(noisy, 0.0),
            [min(self._capacity(i), p) for i in owners],
            even_share=cfg.candidate_even_share,
        )
        requests = {i: int(s) for i, s in zip(owners, shares, strict=True) if s > 0}
        self._candidates_info = {
            "allocation": "counts",
            "allocation_note": self.allocation_note,
            "budget": self._candidate_budget(),
            "gaussian_sigma": sigma,
            "relevance_threshold": threshold,
            # Post-processing of the Laplace release, so safe to report; the exact counts are not.
            "noisy_counts": {self._name(i): float(v) for i, v in zip(owners, noisy, strict=True)},
            "shares": {self._name(i): s for i, s in requests.items()},
        }
        return requests, g_val

    async def _sketch_allocation(
        self, val_features: NDArray[np.floating]
    ) -> tuple[dict[int, int], NDArray[np.float64]]:
        """The sketch allocation (:mod:`common.summarization.sketch_allocation`): gtilde and the
        noisy mean responsibilities, two Gaussian releases about D_v whose composition is
        ``(epsilon_validation_total, delta)``; shares from the second. Owners receive gtilde
        shrunk towards the public seed set's mean h1 by as much as its noise hides it
        (:func:`common.summarization.candidates.shrink_embedding`, post-processing). Owners
        release nothing before their candidates."""
        cfg = self.config
        m = int(self.validation.shape[0])
        owners = self._active()
        sens_g = validation_embedding_sensitivity(m)
        sens_a = relevance_sensitivity(m)
        eps_v = cfg.epsilon_validation_total
        sigma_g, sigma_a = split_gaussian_sigmas(
            eps_v, cfg.delta, [sens_g, sens_a], [1.0 - cfg.allocation_share, cfg.allocation_share]
        )
        sketches = [self.owner_sketches[self._name(i)] for i in owners]
        relevance = await asyncio.to_thread(
            relevance_matrix, sketches, self.validation, score=cfg.relevance_score, rng=self.rng
        )
        pi = responsibilities(relevance)
        # Charge both releases about D_v before the first leaves the curator.
        self.ledgers["validation"].charge(
            [
                Charge(
                    "validation",
                    "gtilde = mean h1(D_v) + Gaussian noise",
                    PrivacyEvent(
                        "gaussian",
                        gaussian_epsilon(sigma_g, cfg.delta, sens_g),
                        1,
                        sens_g,
                        scale=sigma_g,
                        delta=cfg.delta,
                    ),
                ),
                Charge(
                    "validation",
                    f"sketch allocation: mean {cfg.relevance_score} responsibilities + "
                    "Gaussian noise",
                    PrivacyEvent(
                        "gaussian",
                        gaussian_epsilon(sigma_a, cfg.delta, sens_a),
                        1,
                        sens_a,
                        scale=sigma_a,
                        delta=cfg.delta,
                    ),
                ),
            ]
        )
        g_val = val_features.mean(axis=0) + self.noise.gaussian(sigma_g, cfg.rff_dimension)
        _, noisy = noisy_relevance(pi, sigma_a, self.noise)
        # Post-processing of the release: the public seed set's mean h1 is the prior.
        assert self._rff is not None
        prior = (
            random_fourier_features(self.seed_set, self._rff, dtype=np.float64).mean(axis=0)
            if self.seed_set.shape[0] > 0
            else np.zeros(cfg.rff_dimension)
        )
        g_val, alpha = shrink_embedding(g_val, prior, sigma_g)
        await self._gather(
            owners,
            lambda i: self._endpoint(i).set_validation_embedding(self.owner_session_id, g_val),
        )
        self._require_owners()
        budget = self._candidate_budget()
        shares = allocate_candidates(
            budget,
            np.maximum(noisy, 0.0),
            [min(self._capacity(i), budget) for i in owners],
            even_share=cfg.candidate_even_share,
        )
        requests = {
            i: int(s) for i, s in zip(owners, shares, strict=True) if s > 0 and self.slots[i].active
        }
        self._candidates_info = {
            "allocation": "sketch",
            "budget": budget,
            "gaussian_sigma": sigma_g,
            "embedding_shrinkage": alpha,
            "relevance_score": cfg.relevance_score,
            "allocation_sigma": sigma_a,
            # The release itself (post-processing of it is what the owners see).
            "noisy_relevance": {
                self._name(i): float(v) for i, v in zip(owners, noisy, strict=True)
            },
            "shares": {self._name(i): s for i, s in requests.items()},
        }
        return requests, g_val

    async def _run_greedy(
        self, summary: _SummaryState, rff: RFFParams, *, mode: RoundsMode
    ) -> None:
        """The per-round loop: Algorithm 3 (``"private"``), non-private greedy on exact mean h1
        embeddings (``"greedy"``), or the rounds method (``"rounds"``: its validation release,
        summary release and pool scoring are the configuration's options)."""
        cfg = self.config
        p = cfg.summary_size
        val_features = random_fourier_features(self.validation, rff, dtype=np.float64)
        seed_features = random_fourier_features(self.seed_set, rff, dtype=np.float64)
        # Step 3: the validation embedding gtilde.
        g_val = await asyncio.to_thread(self._validation_embedding, val_features, mode)
        if mode != "greedy":
            self._auction = (
                auction_parameters(
                    cfg.epsilon_auction, cfg.delta_owners, len(self.slots), variant=cfg.auction
                )
                if mode == "private"
                else rounds_auction(cfg, len(self.slots))
            )
        await self._gather(
            self._active(),
            lambda i: self._endpoint(i).set_validation_embedding(self.owner_session_id, g_val),
        )
        self._require_owners()
        # Running state of the summary S = D_init + acquired points, and its release.
        tracker = self._summary_release(mode, seed_features)
        pool: list[_PoolEntry] = []
        # Auction iterations: one per summary point, plus a repeat whenever the pure auction
        # asked nobody and the pool is empty (the tau rule ends a run of repeats within tau).
        iteration = 0
        released_for = 0
        g_sum, q_sent = np.zeros(cfg.rff_dimension), 0
        max_repeats = (self._auction.tau if self._auction is not None else 0) + 1
        repeats = 0
        while len(summary.points) < p:
            iteration += 1
            self.iterations = iteration
            round_ = len(summary.points) + 1
            round_start = time.perf_counter()
            # Step 5: the summary embedding g_l (and the summary size the owners are told),
            # released once per summary size: a repeated iteration reuses it.
            if released_for != round_:
                g_sum, q_sent = await asyncio.to_thread(tracker.release, round_)
                released_for = round_
            direction = bid_direction(g_val, g_sum, q_sent)
            # Step 6: concurrent bids.
            active = self._active()
            bids_by_owner = await self._gather(
                active,
                self._bid_call(iteration, g_sum, q_sent),
            )
            self._require_owners()
            bids = np.full(len(self.slots), np.nan)
            times_best = np.zeros(len(self.slots), dtype=np.int64)
            for index, bid in bids_by_owner.items():
                if bid is not None:
                    bids[index] = bid.bid
                    times_best[index] = bid.times_best
            # Step 7: PrivAuction (steps 11-16), or the top bidder alone without privacy.
            if np.isnan(bids).all():
                asked = np.zeros(len(self.slots), dtype=bool)
            elif self._auction is not None:
                if iteration == 1:
                    self._charge_auction(self._auction)
                asked = choose_owners_to_ask(bids, times_best, self._auction, self.rng)
            else:
                asked = np.zeros(len(self.slots), dtype=bool)
                asked[int(np.nanargmax(bids))] = True
            rejected_before = self.rejected_points
            released = await self._gather(
                [int(i) for i in np.flatnonzero(asked)],
                self._release_call(iteration),
            )
            self._pool_released(released, bids_by_owner, rff, direction, pool)
            # A point that failed verification drops its owner; if nothing valid came in, ask
            # the remaining bidders in rank order (only ever after an owner broke the protocol).
            rejected = self.rejected_points > rejected_before
            for index in rank_owners(bids) if rejected else []:
                if pool:
                    break
                if asked[index] or not self.slots[index].active:
                    continue
                asked[index] = True
                extra = await self._gather(
                    [int(index)],
                    self._release_call(iteration),
                )
                self._pool_released(extra, bids_by_owner, rff, direction, pool)
            if not pool:
                if np.isnan(bids).all():
                    raise AbortedError(
                        f"round {round_}: no owner has a point left to offer "
                        f"({len(summary.points)} of {p} points collected)" + self._drop_suffix()
                    )
                repeats += 1
                if repeats > max_repeats:
                    raise AbortedError(
                        f"round {round_}: the auction acquired no point in {repeats} iterations"
                        + self._drop_suffix()
                    )
                # The pure auction asked nobody: bid again (the tau rule bounds the repeats).
                self._emit("rounds", f"round {round_}: nobody asked, bidding again")
                continue
            repeats = 0
            # Step 15: add the best pool point. Every message of this round has been sent.
            best = pool.pop(
                await asyncio.to_thread(self._choose_from_pool, pool, direction, summary)
            )
            summary.points.append(best.point)
            summary.labels.append(best.label)
            summary.owners.append(best.owner)
            self._summary_size = len(summary.points)
            new_features = random_fourier_features(best.point[None, :], rff, dtype=np.float64)
            tracker.add(new_features[0], round_)
            self.rounds_done = round_
            self.round_seconds.append(time.perf_counter() - round_start)
            self._emit("rounds", f"round {round_}: {int(asked.sum())} owner(s) asked")

    def _bid_call(
        self, iteration: int, g_sum: NDArray[np.float64], q: int
    ) -> Callable[[int], Awaitable[OwnerBid | None]]:
        """The Bid call of one auction iteration, for :meth:`_gather`."""

        def call(index: int) -> Awaitable[OwnerBid | None]:
            return self._endpoint(index).bid(self.owner_session_id, iteration, g_sum, q)

        return call

    def _release_call(self, iteration: int) -> Callable[[int], Awaitable[ReleasedPoint]]:
        """The ReleasePoint call of one auction iteration, for :meth:`_gather`."""

        def call(index: int) -> Awaitable[ReleasedPoint]:
            return self._endpoint(index).release_point(self.owner_session_id, iteration)

        return call

    def _validation_embedding(
        self, val_features: NDArray[np.floating], mode: RoundsMode
    ) -> NDArray[np.float64]:
        """gtilde: h2 (paper; rounds with ``validation_release="mwem"``), the Gaussian mechanism
        (rounds, ``"gaussian"``) or the exact mean (greedy); charged to the validation ledger."""
        cfg = self.config
        if mode == "greedy":
            return val_features.mean(axis=0)
        if mode == "rounds" and cfg.validation_release == "gaussian":
            return self._gaussian_validation_embedding(val_features)[0]
        val_sums = quantize_features(val_features, cfg.eta, self.rng).sum(axis=0)
        release = MWEMState(cfg.rff_dimension, cfg.eta).release(
            val_sums,
            val_features.shape[0],
            cfg.t_init,
            cfg.epsilon_validation,
            self.rng,
            self.noise,
        )
        self._charge_mwem("validation", "h2(h1(D_v)): validation embedding", release)
        return release.embedding

    def _gaussian_validation_embedding(
        self, val_features: NDArray[np.floating]
    ) -> tuple[NDArray[np.float64], float]:
        """gtilde = mean h1(D_v) + N(0, sigma^2 I) at (epsilon_validation_total, delta); charged.

        L2 sensitivity 2 sqrt(2) / m under replacing one validation point (m public)."""
        cfg = self.config
        sensitivity = validation_embedding_sensitivity(val_features.shape[0])
        eps_v = cfg.epsilon_validation_total
        sigma = analytic_gaussian_sigma(eps_v, cfg.delta, sensitivity)
        g_val = val_features.mean(axis=0) + self.noise.gaussian(sigma, cfg.rff_dimension)
        self.ledgers["validation"].charge(
            [
                Charge(
                    "validation",
                    "gtilde = mean h1(D_v) + Gaussian noise",
                    PrivacyEvent("gaussian", eps_v, 1, sensitivity, scale=sigma, delta=cfg.delta),
                )
            ]
        )
        return g_val, sigma

    def _summary_release(
        self, mode: RoundsMode, seed_features: NDArray[np.floating]
    ) -> _SummaryRelease:
        cfg = self.config
        if mode == "greedy":
            return _ExactSummary(seed_features)
        if mode == "private" or cfg.summary_release == "mwem":
            return _MWEMSummary(self, seed_features)
        if cfg.summary_release == "tree":
            return _TreeSummary(self, seed_features, rounds_tree_sigma(cfg, len(self.slots)))
        return _NoSummary(cfg.rff_dimension)

    def _choose_from_pool(
        self, pool: list[_PoolEntry], direction: NDArray[np.float32], summary: _SummaryState
    ) -> int:
        """Index of the pool point to add: the largest recomputed bid (step 15), or in the rounds
        method with ``pool_scoring="exact"`` the largest exact marginal gain on D_v and the current
        summary (seed set included), which the trusted curator holds."""
        cfg = self.config
        if cfg.method == "rounds" and cfg.pool_scoring == "exact":
            current = np.concatenate(
                [self.seed_set, np.reshape(summary.points, (-1, self.seed_set.shape[1]))]
            )
            exact = marginal_gain_score(
                np.stack([e.point for e in pool]), self.validation, current, cfg.gamma
            )
            return int(np.argmax(exact))
        return int(np.argmax(bid_scores(np.stack([e.features for e in pool]), direction)))

    # ------------------------------------------------------------------------------- helpers
    def _pool_released(
        self,
        released: dict[int, ReleasedPoint],
        bids: dict[int, OwnerBid | None],
        rff: RFFParams,
        direction: NDArray[np.float32],
        pool: list[_PoolEntry],
    ) -> None:
        for index in sorted(released):
            entry = self._verify(released[index], index, bids[index], rff, direction)
            if entry is None:
                self._drop(index, "released a point that does not match its bid")
            else:
                pool.append(entry)

    def _verify(
        self,
        released: ReleasedPoint,
        index: int,
        bid: OwnerBid | None,
        rff: RFFParams,
        direction: NDArray[np.float32],
    ) -> _PoolEntry | None:
        """Step 8: check a released point against its bid; a mismatch is counted and rejected."""
        self.points_accessed += 1
        point = released.point
        if point.shape != (self.validation.shape[1],) or not np.isfinite(point).all():
            self.rejected_points += 1
            logger.warning("owner %s released a malformed point", self._name(index))
            return None
        features = random_fourier_features(point[None, :], rff)[0]
        recomputed = float(bid_scores(features[None, :], direction)[0])
        reported = bid.bid if bid is not None else math.nan
        if not math.isclose(recomputed, reported, rel_tol=BID_RTOL, abs_tol=BID_ATOL):
            self.rejected_points += 1
            logger.warning(
                "owner %s: point rejected, bid %.6g does not match its point (%.6g)",
                self._name(index),
                reported,
                recomputed,
            )
            return None
        return _PoolEntry(point=point, features=features, label=released.label, owner=index)

    def _check_points(self, points: NDArray[np.float64], index: int) -> None:
        if points.ndim != 2 or points.shape[1] != self.validation.shape[1]:
            raise AbortedError(f"owner {self._name(index)} sent points of shape {points.shape}")

    def _charge_mwem(self, party: Party, label: str, release: MWEMRelease) -> None:
        """Charge one h2 release: T exponential-mechanism selections and T Laplace measurements."""
        ledger = self.ledgers["validation" if party == "validation" else "owners"]
        eps, count, sens = release.epsilon, release.iterations, release.sensitivity
        ledger.charge(
            [
                Charge(
                    party, f"{label}: selections", PrivacyEvent("exponential", eps, count, sens)
                ),
                Charge(
                    party,
                    f"{label}: measurements",
                    PrivacyEvent("laplace", eps, count, sens, scale=sens / eps),
                ),
            ]
        )

    def _charge_auction(self, params: AuctionParams) -> None:
        """Charge PrivAuction once: at most tau bad iterations (Theorem 6), each pure eps_auc-DP
        (pure variant) or (eps_auc, 1 - exp(-eps_auc))-DP (the printed variant)."""
        self.ledgers["owners"].charge(
            [
                Charge(
                    "owners",
                    f"PrivAuction ({params.variant}) winner notification: tau bad iterations",
                    event,
                )
                for event in auction_events(params)
            ]
        )

    async def _gather(
        self,
        indices: Sequence[int] | range,
        call: Callable[[int], Awaitable[T]],
        *,
        refusals: Literal["drop", "raise"] = "drop",
    ) -> dict[int, T]:
        """Call owners concurrently; drop those that are unavailable; return the answers by index.

        An owner that refuses a step under its own policy (``FailedPreconditionError``) is
        dropped too (``refusals="drop"``, during a session), or its refusal fails the request
        with the same error naming the owner (``"raise"``, while the session opens, so nothing
        is released). Other protocol errors abort the session naming the owner (while opening:
        the same error class, e.g. INVALID_ARGUMENT for a d above an owner's limit).
        """

        async def one(index: int) -> T:
            coro = call(index)
            if self.call_timeout is None:
                return await coro
            try:
                return await asyncio.wait_for(coro, self.call_timeout)
            except TimeoutError as exc:
                raise UnavailableError(f"no answer within {self.call_timeout} s") from exc

        answers = await asyncio.gather(*(one(i) for i in indices), return_exceptions=True)
        out: dict[int, T] = {}
        for index, answer in zip(indices, answers, strict=True):
            if isinstance(answer, UnavailableError):
                self._drop(index, str(answer))
            elif isinstance(answer, FailedPreconditionError) and refusals == "drop":
                self._drop(index, f"refused: {answer}")
            elif isinstance(answer, DPMarketError) and refusals == "raise":
                raise type(answer)(f"owner {self._name(index)}: {answer}") from answer
            elif isinstance(answer, DPMarketError):
                raise AbortedError(f"owner {self._name(index)}: {answer}") from answer
            elif isinstance(answer, BaseException):
                raise answer
            else:
                out[index] = answer
        return out

    def _drop(self, index: int, reason: str) -> None:
        slot = self.slots[index]
        if slot.active:
            slot.active = False
            slot.note = reason
            logger.warning("owner %s dropped: %s", self._name(index), reason)
            self._emit("rounds", f"owner {self._name(index)} dropped: {reason}")

    def _require_owners(self) -> None:
        if not self._active():
            raise UnavailableError("every owner dropped out: " + self._drop_notes())

    def _endpoint(self, index: int) -> OwnerEndpoint:
        return self.slots[index].endpoint

    def _active(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.active]

    def _capacity(self, index: int) -> int:
        """The most raw points this session may take from owner ``index``: its size, capped by
        its policy's allowance for the session."""
        return min(self._info(index).num_points, self.slots[index].max_points)

    def _info(self, index: int) -> OwnerInfo:
        info = self.slots[index].info
        assert info is not None
        return info

    def _name(self, index: int) -> str:
        info = self.slots[index].info
        return info.owner_id if info is not None else self.slots[index].endpoint.name

    def _dropped(self) -> tuple[str, ...]:
        return tuple(self._name(i) for i, s in enumerate(self.slots) if not s.active)

    def _drop_notes(self) -> str:
        return "; ".join(
            f"{self._name(i)}: {s.note}" for i, s in enumerate(self.slots) if not s.active
        )

    def _drop_suffix(self) -> str:
        dropped = self._dropped()
        return f"; dropped owners: {', '.join(dropped)}" if dropped else ""

    async def _close_owner_sessions(self) -> None:
        """Close the session at every owner that opened it; record what its ledger recorded."""

        async def close(slot: _OwnerSlot) -> None:
            slot.opened = False
            try:
                coro = slot.endpoint.close_session(self.owner_session_id)
                if self.call_timeout is not None:
                    slot.spent = await asyncio.wait_for(coro, self.call_timeout)
                else:
                    slot.spent = await coro
            except (DPMarketError, TimeoutError) as exc:
                logger.info("closing the session at %s failed: %s", slot.endpoint.name, exc)

        await asyncio.gather(*(close(slot) for slot in self.slots if slot.opened))

    def _emit(self, stage: Literal["setup", "rounds", "done", "failed"], message: str) -> None:
        if self.on_progress is not None:
            one_round = self.config.method in ("uniform", "candidates")
            total = 1 if one_round else self.config.summary_size
            self.on_progress(
                ProgressEvent(stage, self.rounds_done, total, self.points_accessed, message)
            )

    async def abandon(self) -> None:
        """Close the session at every owner that opened it (a prepared session not run)."""
        await self._close_owner_sessions()

    def fail(self, message: str) -> None:
        """Emit the final failure event (the service calls this when :meth:`run` raises)."""
        self._emit("failed", message)

    def failure_report(self, error: str) -> SessionReport:
        """The report of a session that failed: what it accessed and spent until it failed."""
        return self._report(self._summary_size, time.perf_counter() - self._start, error)

    def _report(self, summary_size: int, elapsed: float, error: str = "") -> SessionReport:
        cfg = self.config
        k = len(self.slots)
        ledger: dict[str, Any] = {}
        paper_bound = 0.0
        if any(led.entries for led in self.ledgers.values()):
            ledger = {party: led.report() for party, led in self.ledgers.items()}
        if self._candidates_info:
            ledger["candidates"] = self._candidates_info
        if self.allocation == "sketch":
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
                for owner, sketch in sorted(self.owner_sketches.items())
                if owner in {self._name(i) for i in range(len(self.slots))}
            }
        if self._auction is not None:
            eps_auc, tau = self._auction.eps_auc, self._auction.tau
            pure = self._auction.variant == "pure"
            ledger["auction"] = {
                "variant": self._auction.variant,
                "eps_auc": eps_auc,
                "tau": tau,
                # The printed auction: "not asked" at rank 1 (probability 0) versus rank 2
                # (1 - e^-eps_auc) has no bounded ratio, so a bad iteration is
                # (eps_auc, 1 - e^-eps_auc)-DP; charged so in the owners' ledger.
                "delta_per_bad_iteration": 0.0 if pure else -math.expm1(-eps_auc),
                "iterations": self.iterations,
            }
            paper_bound = parsimony_bound(
                cfg.summary_size, k, self._auction, self.validation.shape[0]
            )
        if self.terms is not None:
            ledger["owner_terms"] = {
                "mechanism": self.terms.mechanism,
                "epsilon": self.terms.epsilon,
                "delta": self.terms.delta,
                "non_private": self.terms.non_private,
            }
        return SessionReport(
            method=cfg.method,
            summary_size=summary_size,
            rounds=self.rounds_done,
            owner_points_accessed=self.points_accessed,
            validation_points_accessed=int(self.validation.shape[0]),
            all_owners_bound=k * cfg.summary_size,
            paper_bound=float(paper_bound),
            dropped_owners=self._dropped(),
            ledger=ledger,
            wall_time_seconds=elapsed,
            rejected_points=self.rejected_points,
            round_seconds=tuple(self.round_seconds),
            error=error,
            owner_spend={
                self._name(i): slot.spent for i, slot in enumerate(self.slots) if slot.spent
            },
        )

    def _result(self, summary: _SummaryState, elapsed: float) -> SummaryResult:
        labels: NDArray[np.int64] | None = None
        if summary.labels and all(label is not None for label in summary.labels):
            labels = np.asarray(summary.labels, dtype=np.int64)
        report = self._report(len(summary.points), elapsed)
        n = self.validation.shape[1]
        points = np.stack(summary.points) if summary.points else np.zeros((0, n))
        return SummaryResult(
            points=points,
            labels=labels,
            owner_ids=tuple(self._name(i) for i in summary.owners),
            report=report,
        )


def _split_evenly(total: int, capacities: Sequence[int]) -> list[int]:
    """Split ``total`` into near-equal shares (p/K each) that respect each owner's capacity.

    Raises
    ------
    InvalidArgumentError
        If the capacities sum to less than ``total``.
    """
    if sum(capacities) < total:
        raise InvalidArgumentError(f"owners hold {sum(capacities)} points, fewer than {total}")
    shares = [0] * len(capacities)
    remaining = total
    open_ = [i for i, c in enumerate(capacities) if c > 0]
    while remaining > 0:
        each, extra = divmod(remaining, len(open_))
        for rank, i in enumerate(list(open_)):
            want = each + (1 if rank < extra else 0)
            give = min(want, capacities[i] - shares[i])
            shares[i] += give
            remaining -= give
        open_ = [i for i in open_ if shares[i] < capacities[i]]
    return shares
