"""The owner's side of the summarization protocol, as plain state objects on numpy arrays.

One :class:`Owner` holds a private dataset and any number of sessions; each protocol stage is a
method that takes and returns arrays, so it runs in-process (tests, ``dpmarket lab simulate``) and
behind the gRPC servicer (:mod:`dpmarket.owner.service`) with identical results.

The owner enforces its own policy whatever the curator asks. A session opens with
:class:`~dpmarket.common.summarization.terms.OwnerTerms`, the method it runs and what the whole
session spends of this owner's privacy; the owner checks them against its ledger when the session
opens and charges them before its first release (a relevance count, a bid or a point), then charges
every raw point before it leaves ("charge, then release": a crash between the two wastes budget
but never releases anything uncharged). A refused charge raises ``FailedPreconditionError`` and
changes nothing. Its policy also decides what the terms' method may ask that no charge covers
(:mod:`dpmarket.owner.terms`): the per-round methods, whose bids answer the curator exactly, only
with ``access.allow_exact_bids``; the candidates methods, whose rows are picked along the
curator's embedding, only with ``access.allow_steered_selection``; and no more Bid rounds than
``session.rounds_per_point`` per raw point the session may receive. An owner built without a
ledger (in-process research runs: ``dpmarket lab simulate``, the evaluation harness, benchmarks)
records, charges and enforces none of this; the owner service always has one.

Every session is a state machine the owner enforces, ledger or not (:mod:`dpmarket.owner.steps`): it
answers only the steps of the terms' method, in their order, each once (the rounds once per
round, up to the terms' ``max_rounds``). A repeated noisy release returns the release already
made (CountRelevant at the same threshold), never fresh noise; an identical
SetValidationEmbedding is a no-op; every other repeat, a step out of order and a step of another
method are refused with ``FailedPreconditionError`` before anything runs or is charged.

Every refusal depends only on public inputs: the request, the owner's declared size and feature
count (``GetOwnerInfo``), the session's terms, the steps it has taken and how many points it has
received, and the owner's policy and budget. The computations on the points (features, bids,
counts, the local greedy) run under :func:`dpmarket.common.errors.on_private_data`, so whatever
they might raise never reaches the curator as text (it answers INTERNAL with a fixed message; the
owner's log says why). They are also total on every input the owner accepts: h1's features are
finite whatever the curator's parameters (:mod:`dpmarket.common.fourier`), parameters whose angles
could leave float64's accuracy on the schema's bounds are refused at the open, and embeddings are
bounded (:data:`EMBEDDING_LIMIT`), so whether a step fails never depends on the rows. The steps
that release about the rows (the count, the proposal, the first bid) charge before they read
them, so a failure there (a bug) costs what the release would have cost.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import (
    AlreadyExistsError,
    BudgetRefusedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PrivateDataError,
    ResourceExhaustedError,
    on_private_data,
)
from dpmarket.common.fourier import check_angle_bound
from dpmarket.common.ids import short_id
from dpmarket.common.market.terms import FREE, check_quote, owner_payout_epsilon
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.common.privacy.rng import production_rng
from dpmarket.common.schema import Schema
from dpmarket.common.summarization.candidates import shrink_towards_moments, shrink_towards_points
from dpmarket.common.summarization.endpoints import (
    OwnerBid,
    OwnerInfo,
    ReleasedPoint,
)
from dpmarket.common.summarization.hashes import HashAdvert, hash_points
from dpmarket.common.summarization.kernels import (
    bid_direction,
    bid_scores,
    embedding_greedy,
    feature_scaling,
)
from dpmarket.common.summarization.rff import FeatureScaling, RFFParams, random_fourier_features
from dpmarket.common.summarization.terms import OwnerAccess, OwnerTerms, Step
from dpmarket.common.validation import (
    check_matrix,
    check_not_tiny,
    check_positive_int,
    check_vector,
)
from dpmarket.owner.earnings import PAYOUT_MECHANISM, payout_charged, payout_session
from dpmarket.owner.engine import WorkCancelled
from dpmarket.owner.hash_keys import HashKeyParty
from dpmarket.owner.ids import IdState, SessionOpen, check_curator_id
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.limits import QUICK_STEP_BYTES, WorkLimits
from dpmarket.owner.partitioned import PartitionedData
from dpmarket.owner.steps import SessionSteps
from dpmarket.owner.terms import (
    check_exact_bids,
    check_reward_disclosure,
    check_rounds,
    check_steered_selection,
    opened_terms,
)
from dpmarket.runtime.tables import PointSet

logger = logging.getLogger(__name__)

#: Rows whose h1 features the in-memory path computes between two progress reports.
_FEATURE_CHUNK = 1 << 16

#: Largest magnitude an owner takes in an embedding's entries (the validation, prior and summary
#: embeddings) and in ``shrinkage_sigma``. An honest embedding is a mean of h1 features (entries
#: within ``sqrt(2 / d) <= 0.5``) plus, for the validation embedding, Gaussian noise of standard
#: deviation ``Delta sqrt(2 ln(1.25 / delta)) / epsilon`` with ``Delta <= 2 sqrt(2)`` (one
#: validation point), ``epsilon >= 1e-4`` and ``delta >= 1e-12`` (the curator's ranges): at most
#: 2.1e5, so 1e9 is more than 4,000 standard deviations away. Within it a float32 score
#: ``h1(x) . w`` is at most ``sqrt(2 d) 1e9 < 1e11``, far from float32's overflow, so no entry an
#: owner accepts makes a score infinite for some rows and finite for others.
EMBEDDING_LIMIT = 1e9


def _embedding(x: NDArray[np.float64], name: str, d: int) -> NDArray[np.floating]:
    """``x`` as a finite vector of length ``d`` whose entries lie within
    :data:`EMBEDDING_LIMIT` and none non-zero below
    :data:`~dpmarket.common.validation.PARAMETER_FLOOR`, or InvalidArgumentError naming the
    problem (public inputs only)."""
    try:
        v = check_vector(x, name, size=d)
        check_not_tiny(v, name)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    largest = float(np.abs(v).max()) if v.size else 0.0
    if largest > EMBEDDING_LIMIT:
        raise InvalidArgumentError(
            f"{name} holds an entry of magnitude {largest:.3g}, beyond the {EMBEDDING_LIMIT:g} an "
            "owner takes: an embedding is a mean of h1 features (entries within sqrt(2 / d)) "
            "plus its release's noise"
        )
    return v


@dataclass
class Progress:
    """How far an owner's current step has gone: what a slow owner reports to keep its caller
    waiting (``GetProgress``). Public: counts of partitions or chunks, never values.

    Attributes
    ----------
    stage : str
        The step running (``"features"``, ``"bid"``, ``"count"``, ``"candidates"``, ...), or
        ``""`` when none runs.
    done, total : int
        Units (partitions or chunks) done of the step's total.
    ticks : int
        Grows by one with every unit done in any step of the session: a caller that sees it grow
        knows the owner is working.
    """

    stage: str = ""
    done: int = 0
    total: int = 0
    ticks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def start(self, stage: str, total: int) -> None:
        """A step begins."""
        with self.lock:
            self.stage, self.done, self.total = stage, 0, total

    def update(self, done: int, total: int) -> None:
        """``done`` units of ``total`` are done."""
        with self.lock:
            self.done, self.total = done, total
            self.ticks += 1

    def finish(self) -> None:
        """The step ended."""
        with self.lock:
            self.stage, self.done, self.total = "", 0, 0
            self.ticks += 1

    def snapshot(self) -> tuple[str, int, int, int]:
        """``(stage, done, total, ticks)``."""
        with self.lock:
            return self.stage, self.done, self.total, self.ticks


class _MemoryWork:
    """A session's computations on a point set held in memory (small tables): the h1 features
    of every point computed once when the session opens (a small table: see
    :mod:`dpmarket.owner.limits`)."""

    def __init__(self, data: PointSet | None, features: NDArray[np.float32]) -> None:
        self.data = data
        self.features = features

    @property
    def n_points(self) -> int:
        return int(self.features.shape[0])

    def mask(self, sent: NDArray[np.int64]) -> NDArray[np.bool_]:
        out = np.zeros(self.n_points, dtype=bool)
        out[sent] = True
        return out

    def best(
        self,
        direction: NDArray[np.float32],
        sent: NDArray[np.int64],
        _progress: Progress,
        _cancel: threading.Event,
    ) -> tuple[int, float] | None:
        scores = bid_scores(self.features, direction)
        scores[sent] = -np.inf
        best = int(np.argmax(scores))
        if np.isneginf(scores[best]):
            return None
        return best, float(scores[best])

    def count(
        self,
        direction: NDArray[np.float32],
        threshold: float,
        sent: NDArray[np.int64],
        _progress: Progress,
        _cancel: threading.Event,
    ) -> int:
        scores = bid_scores(self.features, direction)
        return int(np.count_nonzero((scores >= threshold) & ~self.mask(sent)))

    def candidates(
        self,
        target: NDArray[np.floating],
        count: int,
        sent: NDArray[np.int64],
        start: NDArray[np.int64],
        _rng: np.random.Generator,
        _progress: Progress,
        _cancel: threading.Event,
    ) -> NDArray[np.int64]:
        return embedding_greedy(
            self.features, target, self.features[start], count, exclude=self.mask(sent)
        )

    def shrink(
        self,
        target: NDArray[np.floating],
        sigma: float,
        prior: NDArray[np.floating] | None,
        score_metric: bool,
        _progress: Progress,
        _cancel: threading.Event,
    ) -> NDArray[np.float64]:
        return shrink_towards_points(
            target, self.features, sigma, prior=prior, score_metric=score_metric
        )[0]

    def sample(
        self,
        count: int,
        sent: NDArray[np.int64],
        rng: np.random.Generator,
        _progress: Progress,
        _cancel: threading.Event,
    ) -> NDArray[np.int64]:
        unsent = np.flatnonzero(~self.mask(sent))
        return rng.choice(unsent, size=count, replace=False).astype(np.int64)

    def points(
        self, index: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        data = self.data
        assert data is not None  # sessions exist only over a point set (open_session)
        labels = None if data.labels is None else data.labels[index].copy()
        return data.features[index].copy(), labels


class _PartitionedWork:
    """A session's computations on a partitioned table (:class:`dpmarket.owner.partitioned.
    PartitionedData`): every step a pass over the partitions, nothing of size n held. The rows
    the session may release (bid winners, candidates, samples) are kept until released."""

    def __init__(self, data: PartitionedData, rff: RFFParams) -> None:
        self.data = data
        self.rff = rff
        self.rows: dict[int, tuple[NDArray[np.float64], int | None]] = {}

    @property
    def n_points(self) -> int:
        return self.data.n_points

    def _keep(self, index: NDArray[np.int64], rows: NDArray[np.float64], labels: Any) -> None:
        for j, i in enumerate(index.tolist()):
            self.rows[int(i)] = (rows[j], None if labels is None else int(labels[j]))

    def best(
        self,
        direction: NDArray[np.float32],
        sent: NDArray[np.int64],
        progress: Progress,
        cancel: threading.Event,
    ) -> tuple[int, float] | None:
        progress.start("bid", len(self.data.partitions))
        found = self.data.best(self.rff, direction, sent, progress=progress.update, cancel=cancel)
        if found is None:
            return None
        best, row, label = found
        self._keep(np.array([best.index]), row[None, :], None if label is None else [label])
        return best.index, best.score

    def count(
        self,
        direction: NDArray[np.float32],
        threshold: float,
        sent: NDArray[np.int64],
        progress: Progress,
        cancel: threading.Event,
    ) -> int:
        progress.start("count", len(self.data.partitions))
        return self.data.count_at_least(
            self.rff, direction, threshold, sent, progress=progress.update, cancel=cancel
        )

    def candidates(
        self,
        target: NDArray[np.floating],
        count: int,
        sent: NDArray[np.int64],
        start: NDArray[np.int64],
        rng: np.random.Generator,
        progress: Progress,
        cancel: threading.Event,
    ) -> NDArray[np.int64]:
        progress.start("candidates", len(self.data.partitions))
        seed = int(rng.integers(0, 2**63 - 1))
        kept = [self.rows[int(i)][0] for i in start]
        start_rows = np.stack(kept) if kept else np.zeros((0, self.data.n_features))
        index, rows, labels, stochastic = self.data.candidates(
            self.rff,
            np.asarray(target, dtype=np.float64),
            count,
            sent,
            seed,
            start=random_fourier_features(start_rows, self.rff),
            progress=progress.update,
            cancel=cancel,
        )
        if stochastic:
            logger.info(
                "candidates: %d of %d partitions ran stochastic greedy",
                stochastic,
                len(self.data.partitions),
            )
        self._keep(index, rows, labels)
        return index

    def shrink(
        self,
        target: NDArray[np.floating],
        sigma: float,
        prior: NDArray[np.floating] | None,
        score_metric: bool,
        progress: Progress,
        cancel: threading.Event,
    ) -> NDArray[np.float64]:
        progress.start("shrink", len(self.data.partitions))
        mean, second = self.data.h1_moments(self.rff, progress=progress.update, cancel=cancel)
        return shrink_towards_moments(
            target, mean, second, sigma, prior=prior, score_metric=score_metric
        )[0]

    def sample(
        self,
        count: int,
        sent: NDArray[np.int64],
        rng: np.random.Generator,
        progress: Progress,
        cancel: threading.Event,
    ) -> NDArray[np.int64]:
        progress.start("sample", len(self.data.partitions))
        index, rows, labels = self.data.sample(
            count, sent, rng, progress=progress.update, cancel=cancel
        )
        self._keep(index, rows, labels)
        return index

    def points(
        self, index: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        found = [self.rows.pop(int(i)) for i in index]
        rows = np.stack([r for r, _ in found])
        labels = [lab for _, lab in found]
        if any(lab is None for lab in labels):
            return rows, None
        return rows, np.asarray(labels, dtype=np.int64)


class OwnerSession:
    """One summarization session at one owner.

    Parameters
    ----------
    features : ndarray of shape (n_points, d), float32, or a session work object
        h1 features of every owned point, computed once (a table held in memory), or the
        session's computations on a partitioned table (:class:`_PartitionedWork`: every step a
        pass over the partitions, nothing of size ``n_points`` held).
    rng : numpy.random.Generator
        Randomness of :meth:`sample_uniform` (and of stochastic greedy on a partitioned table).
    terms : OwnerTerms
        The method the session runs, which decides the steps it answers
        (:mod:`dpmarket.owner.steps`), and what it spends of this owner's privacy.
    noise : NoiseSource, optional
        Noise of :meth:`noisy_relevant_count` (default: seeded from ``rng``).
    allowance : int, optional
        The most raw points this session may receive (default: all).
    charge : callable ``(points, what) -> None``, optional
        Charges the owner's ledger; the first call also charges ``terms``. Raises
        ``FailedPreconditionError`` to refuse. Default: charge nothing.
    d : int, optional
        Dimension of h1 (default: the features' width).

    Notes
    -----
    What the session remembers is sparse: the indices of the points sent (at most the
    allowance), the rounds in which each bid winner was this owner's best, its step in the
    terms' method and its one noisy release, so a session costs the same memory whatever the
    table's size. Its :attr:`cancel` event stops a running step (the session was closed, or its
    caller gave up): no further partition is computed.
    """

    def __init__(
        self,
        features: NDArray[np.float32] | Any,
        rng: np.random.Generator,
        *,
        terms: OwnerTerms,
        noise: NoiseSource | None = None,
        allowance: int | None = None,
        charge: Callable[[int, str], None] | None = None,
        d: int | None = None,
    ) -> None:
        if isinstance(features, np.ndarray):
            self.work: _MemoryWork | _PartitionedWork = _MemoryWork(None, features)
            self._d = int(features.shape[1])
        else:
            self.work = features
            assert d is not None, "a partitioned session needs d"
            self._d = int(d)
        n = self.work.n_points
        self.rng = rng
        #: Uniform samples draw from their own stream, spawned from ``rng`` before any draw, so
        #: that a session's first uniform sample is the same whatever else it drew first (the
        #: candidates method's hedge is then the uniform method's sample for the same seed).
        self.sample_rng = rng.spawn(1)[0]
        self.noise = noise if noise is not None else SeededNoise(rng)
        self.terms = terms
        #: Where the session stands among the steps its terms allow.
        self.steps = SessionSteps(terms)
        #: The noisy relevance count released, and the threshold it was counted at.
        self._count: tuple[float, float] | None = None
        self.allowance = n if allowance is None else int(allowance)
        self._charge = charge
        self._sent: list[int] = []
        self.released = 0
        self.validation_embedding: NDArray[np.floating] | None = None
        #: The validation embedding's noise per coordinate (0: use the embedding as given).
        self.shrinkage_sigma = 0.0
        #: Whether the shrinkage reads its amount in the metric of this owner's scores.
        self.score_metric = False
        self.prior_embedding: NDArray[np.floating] | None = None
        self.round = 0
        self._offered: int | None = None
        self._offered_bid = 0.0
        # Rounds in which each point has been this owner's best (Algorithm 3, step 14).
        self._best_counts: dict[int, int] = {}
        self.cancel = threading.Event()
        self.progress = Progress()

    @property
    def features(self) -> NDArray[np.float32]:
        """h1 features of every point (a table held in memory only)."""
        if not isinstance(self.work, _MemoryWork):
            raise AttributeError("a partitioned session holds no features")
        return self.work.features

    @property
    def n_points(self) -> int:
        """Points of the owner's table."""
        return self.work.n_points

    @property
    def sent_indices(self) -> NDArray[np.int64]:
        """The points sent so far, sorted."""
        return np.array(sorted(self._sent), dtype=np.int64)

    @property
    def sent(self) -> NDArray[np.bool_]:
        """Which points have been sent, as a mask of shape (n_points,) (for small tables)."""
        mask = np.zeros(self.n_points, dtype=bool)
        mask[self.sent_indices] = True
        return mask

    @property
    def d(self) -> int:
        """Dimension of h1."""
        return self._d

    def _mark_sent(self, index: NDArray[np.int64]) -> None:
        self._sent.extend(int(i) for i in index)

    def _pay(self, points: int, what: str) -> None:
        """Charge before a release; refuse beyond the session's point allowance."""
        if self.released + points > self.allowance:
            raise BudgetRefusedError(
                f"this session may receive {self.allowance} raw points from this owner; "
                f"{self.released} released, {points} more asked"
            )
        if self.cancel.is_set():  # closed or its caller gone: nothing is charged
            raise WorkCancelled("the session was closed")
        if self._charge is not None:
            self._charge(points, what)
        self.released += points

    @contextmanager
    def _computing(self, what: str) -> Iterator[None]:
        """Run a computation on the points: private errors stay here, a cancel stops it."""
        if self.cancel.is_set():
            raise WorkCancelled("the session was closed")
        try:
            with on_private_data(what):
                yield
        except PrivateDataError as exc:
            if isinstance(exc.__cause__, WorkCancelled):
                raise exc.__cause__ from None
            raise
        finally:
            self.progress.finish()

    def set_validation_embedding(
        self,
        embedding: NDArray[np.float64],
        *,
        shrinkage_sigma: float = 0.0,
        prior_embedding: NDArray[np.float64] | None = None,
        score_metric: bool = False,
    ) -> None:
        """Store the private validation embedding gtilde (Algorithm 3, step 3).

        Parameters
        ----------
        embedding : ndarray of shape (d,)
            gtilde, a Gaussian (or MWEM) release about the validation set.
        shrinkage_sigma : float
            How much noise :meth:`propose_candidates` assumes per coordinate of ``embedding``
            (public: the release's noise standard deviation, a function of its epsilon, delta and m,
            times the square root of the session's shrinkage strength), or 0. When > 0, the proposal
            matches the embedding shrunk towards this owner's own mean h1, or towards
            ``prior_embedding`` when it lies nearer to that in the metric of this owner's scores, by
            as much as that noise hides the difference
            (:func:`dpmarket.common.summarization.candidates.shrink_towards_points`); bids always
            use ``embedding`` as given (the curator verifies them against it).
        prior_embedding : ndarray of shape (d,), optional
            A public embedding (the request's seed set's mean h1).
        score_metric : bool
            Read the shrinkage's amount in the metric of this owner's scores
            (:func:`dpmarket.common.summarization.candidates.shrink_in_score_metric`) instead of
            in all d coordinates of the embedding.

        Raises
        ------
        InvalidArgumentError
            If ``embedding`` or ``prior_embedding`` is not of shape (d,), is not finite or holds
            an entry beyond :data:`EMBEDDING_LIMIT`, or ``shrinkage_sigma`` is negative, not
            finite or beyond that limit.
        FailedPreconditionError
            If the terms' method takes no validation embedding (uniform), or the embedding was
            set already and this one differs (the same embedding again changes nothing).

        Notes
        -----
        Set once: every later step (the count, the proposal, the bids) reads this embedding, so
        a curator that could change it between steps would get answers about one owner's data
        the terms never described (two counts against two embeddings for the price of one).
        """
        repeat = self.steps.taken(Step.VALIDATION_EMBEDDING)
        if not repeat:
            self.steps.check(Step.VALIDATION_EMBEDDING)
        if not (math.isfinite(shrinkage_sigma) and 0 <= shrinkage_sigma <= EMBEDDING_LIMIT):
            raise InvalidArgumentError(
                f"shrinkage_sigma must be finite and within [0, {EMBEDDING_LIMIT:g}], got "
                f"{shrinkage_sigma}"
            )
        try:
            check_not_tiny(shrinkage_sigma, "shrinkage_sigma")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        validation = _embedding(embedding, "validation_embedding", self.d)
        prior = (
            None
            if prior_embedding is None
            else _embedding(prior_embedding, "prior_embedding", self.d)
        )
        if repeat:
            if not self._same_embedding(
                validation, float(shrinkage_sigma), prior, bool(score_metric)
            ):
                raise FailedPreconditionError(
                    "the validation embedding is set once per session and this one differs "
                    "from it; open a new session for another embedding"
                )
            return
        self.validation_embedding = validation
        self.prior_embedding = prior
        self.shrinkage_sigma = float(shrinkage_sigma)
        self.score_metric = bool(score_metric)
        self.steps.done(Step.VALIDATION_EMBEDDING)

    def _same_embedding(
        self,
        embedding: NDArray[np.floating],
        shrinkage_sigma: float,
        prior: NDArray[np.floating] | None,
        score_metric: bool,
    ) -> bool:
        """Whether a repeated SetValidationEmbedding holds exactly what was set."""
        assert self.validation_embedding is not None
        same_prior = (prior is None and self.prior_embedding is None) or (
            prior is not None
            and self.prior_embedding is not None
            and np.array_equal(prior, self.prior_embedding)
        )
        return (
            same_prior
            and shrinkage_sigma == self.shrinkage_sigma
            and score_metric == self.score_metric
            and np.array_equal(embedding, self.validation_embedding)
        )

    def bid(
        self, round_: int, summary_embedding: NDArray[np.float64], summary_size: int
    ) -> OwnerBid | None:
        """Bid the best unsent point of round ``round_`` (Algorithm 3, step 6, corrected sign).

        The score of a point x is ``gtilde . h1(x) - q/(q+1) * g . h1(x)``: one float32
        matrix-vector product over the features, then an argmax over unsent points (on a
        partitioned table, the best of each partition's best: the same point). The first bid
        charges the session's terms.

        Parameters
        ----------
        round_ : int
            Must be the previous round + 1, and at most the terms' ``max_rounds``.
        summary_embedding : ndarray of shape (d,)
            g, the (private) mean h1 embedding of the current summary.
        summary_size : int
            q >= 0, the current summary size, seed set included.

        Returns
        -------
        OwnerBid, or None when every point has been sent or the session's point allowance is
        used up. ``times_best`` counts the rounds in which the point has been this owner's best,
        not necessarily consecutive (step 14: "chosen tau times").

        Raises
        ------
        FailedPreconditionError
            If the terms' method has no rounds, the validation embedding is unset, ``round_`` is
            not the next round or is beyond the terms' ``max_rounds``, or the owner's policy
            refuses the session's terms.
        InvalidArgumentError
            If the embedding has the wrong length, NaN/inf or an entry beyond
            :data:`EMBEDDING_LIMIT`, or ``summary_size < 0``.
        WorkCancelled
            If the session was closed while the bid was computed.
        """
        self.steps.check(Step.ROUNDS)
        if round_ != self.round + 1:
            raise FailedPreconditionError(f"expected round {self.round + 1}, got round {round_}")
        if round_ > self.terms.max_rounds:
            raise FailedPreconditionError(
                f"the session's terms cover {self.terms.max_rounds} Bid rounds; round {round_} "
                "is beyond them"
            )
        if summary_size < 0:
            raise InvalidArgumentError(f"summary_size must be >= 0, got {summary_size}")
        g = _embedding(summary_embedding, "summary_embedding", self.d)
        if self.round == 0:
            self._pay(0, "bids")
        self.round = round_
        self._offered = None
        if len(self._sent) >= self.n_points or self.released >= self.allowance:
            return None
        assert self.validation_embedding is not None  # the step before the rounds
        direction = bid_direction(self.validation_embedding, g, summary_size)
        with self._computing("bid"):
            found = self.work.best(direction, self.sent_indices, self.progress, self.cancel)
        if found is None:
            return None
        best, score = found
        self._best_counts[best] = self._best_counts.get(best, 0) + 1
        self._offered = best
        self._offered_bid = score
        return OwnerBid(bid=self._offered_bid, times_best=self._best_counts[best])

    def release(self, round_: int) -> int:
        """Charge, then mark the point bid in ``round_`` as sent and return its index.

        Raises
        ------
        FailedPreconditionError
            If the terms' method has no rounds, ``round_`` is not the last round bid, that
            round's point was already released, or the owner's point limits refuse it.
        """
        self.steps.check(Step.ROUNDS)
        if round_ != self.round or self.round == 0:
            raise FailedPreconditionError(
                f"round {round_} is not the last round bid (last bid: round {self.round})"
            )
        if self._offered is None:
            raise FailedPreconditionError(f"no unsent point was bid in round {round_}")
        index = self._offered
        self._pay(1, "raw point (auction)")
        self._mark_sent(np.array([index]))
        self._offered = None
        return index

    @property
    def offered_bid(self) -> float:
        """The bid of the point offered in the last round."""
        return self._offered_bid

    def _require_validation(self) -> NDArray[np.floating]:
        if self.validation_embedding is None:
            raise FailedPreconditionError("the validation embedding has not been set")
        return self.validation_embedding

    def relevant_count(self, threshold: float) -> int:
        """Count unsent points x with ``gtilde . h1(x) >= threshold`` (exact; never released).

        One float32 matrix-vector product (on a partitioned table, a count per partition,
        summed: the same count).

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset.
        InvalidArgumentError
            If ``threshold`` is NaN or infinite, or non-zero below
            :data:`~dpmarket.common.validation.PARAMETER_FLOOR` in magnitude.
        """
        g = self._require_validation()
        if not np.isfinite(threshold):
            raise InvalidArgumentError(f"threshold must be finite, got {threshold}")
        try:
            check_not_tiny(threshold, "threshold")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        with self._computing("relevance count"):
            return self.work.count(
                g.astype(np.float32), threshold, self.sent_indices, self.progress, self.cancel
            )

    def noisy_relevant_count(self, threshold: float) -> float:
        """The relevance count plus Laplace(1 / epsilon) noise, epsilon from the session's terms,
        released once per session.

        Charges the terms first. Sensitivity: adding, removing or replacing one of this owner's
        points changes the count by at most 1 (L1 sensitivity 1), so the release is
        epsilon-DP with respect to this owner's data (Laplace mechanism); everything the
        candidates method does with it is post-processing. On a partitioned table each row is
        counted in its one partition, so the count and its sensitivity are the same, and the
        noise is drawn once, here, after the partitions' counts are summed.

        Raises
        ------
        FailedPreconditionError
            If the terms' method has no count (only the count allocation's has), the
            validation embedding is unset, the count was released at another threshold, or the
            owner's policy refuses the terms.
        InvalidArgumentError
            If ``threshold`` is NaN or infinite, or non-zero below
            :data:`~dpmarket.common.validation.PARAMETER_FLOOR` in magnitude.

        Notes
        -----
        The terms charge one release. A repeat at the same threshold returns the value already
        released (post-processing: nothing new, nothing charged); a repeat at another threshold
        is refused. Fresh noise for every call would let a curator average the noise away
        (``n`` calls leave a Laplace error of standard deviation ``sqrt(2 / n) / epsilon``) while
        the session is charged once.
        """
        if not np.isfinite(threshold):
            raise InvalidArgumentError(f"threshold must be finite, got {threshold}")
        if self._count is not None:
            counted_at, released = self._count
            if float(threshold) == counted_at:
                return released
            raise FailedPreconditionError(
                f"CountRelevant was answered in this session at threshold {counted_at!r}; a "
                f"session releases one count, so threshold {float(threshold)!r} is refused"
            )
        self.steps.check(Step.COUNT)
        epsilon = self.terms.epsilon
        assert math.isfinite(epsilon) and epsilon > 0  # OwnerTerms: a method with a count
        self._pay(0, "relevance count")  # before the rows are read (as the proposal's charge)
        count = self.relevant_count(threshold)
        released = float(count + self.noise.laplace(1.0 / epsilon, 1)[0])
        self._count = (float(threshold), released)
        self.steps.done(Step.COUNT)
        return released

    def propose_candidates(
        self,
        count: int,
        *,
        uniform_count: int = 0,
        what: str = "raw points (candidates)",
        step: Step = Step.CANDIDATES,
    ) -> NDArray[np.int64]:
        """Choose ``count`` unsent points; charge; mark sent. Once per session: the step
        ``step`` of the terms' method (``CANDIDATES``, or ``HASHES`` for the hashes mode's
        proposal).

        The first ``uniform_count`` are a uniform sample drawn exactly as :meth:`sample_uniform`
        draws it (the candidates method's hedge: the same session seed gives the uniform method's
        sample). The others come from a local greedy that matches the validation embedding with this
        owner's points alone, continuing from the uniform ones
        (:func:`dpmarket.common.summarization.kernels.embedding_greedy` with them as its start), so
        the proposal depends on nothing but this owner's data and the private embedding. On a
        partitioned table the greedy is GreeDi (:mod:`dpmarket.common.summarization.partitioned`,
        the merge continuing from the uniform points): still a selection of this owner's rows, each
        of which may be chosen once, so the privacy analysis is unchanged.

        When the curator stated the embedding's noise (``shrinkage_sigma`` > 0), the target is first
        shrunk (James-Stein) towards this owner's own mean h1, or towards the public prior embedding
        when it lies nearer to that in the metric of the owner's own scores
        (:func:`dpmarket.common.summarization.candidates.shrink_towards_points`; on a partitioned
        table from its h1 moments, one more pass, :func:`~dpmarket.common.summarization.candidates.
        shrink_towards_moments`): with a small validation set the owner then proposes a
        representative sample (kernel herding), which the curator's exact re-ranking sorts, instead
        of the points that match the noise's direction; with a large one it follows gtilde.

        Notes
        -----
        The shrinkage uses this owner's data, the release and the public ``shrinkage_sigma`` only,
        and its result never leaves the owner: what leaves are the proposed points, charged as
        every raw point. It is post-processing of the release for the validation set's privacy.

        Returns
        -------
        ndarray of shape (count,), int64
            The uniform sample's indices first, then the greedy's in the order it chose them.

        Raises
        ------
        FailedPreconditionError
            If the terms' method has no such step, a step before it (the validation embedding,
            the count allocation's count) is not done, the proposal was made already, or the
            owner's point limits refuse.
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points, or ``uniform_count`` is not in
            ``[0, count]``.
        """
        self.steps.check(step)
        g = self._require_validation()
        try:
            count = check_positive_int(count, "count")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        if not 0 <= uniform_count <= count:
            raise InvalidArgumentError(
                f"uniform_count must lie in [0, count = {count}], got {uniform_count}"
            )
        unsent = self.n_points - len(self._sent)
        if count > unsent:
            raise InvalidArgumentError(f"count {count} exceeds the {unsent} points not yet sent")
        # Charge first: the greedy reads the rows, so a failure in it (none is known: h1 is
        # finite by construction) must not answer for free; it is charged as the release
        # would have been and answers one fixed INTERNAL status (a repeat is charged again).
        self._pay(count, what)
        with self._computing("local greedy"):
            uniform = np.zeros(0, dtype=np.int64)
            if uniform_count > 0:
                uniform = self.work.sample(
                    uniform_count, self.sent_indices, self.sample_rng, self.progress, self.cancel
                )
            chosen = uniform
            if count > uniform_count:
                if self.shrinkage_sigma > 0:
                    g = self.work.shrink(
                        g,
                        self.shrinkage_sigma,
                        self.prior_embedding,
                        self.score_metric,
                        self.progress,
                        self.cancel,
                    )
                sent = np.union1d(self.sent_indices, uniform)
                greedy = self.work.candidates(
                    g, count - uniform_count, sent, uniform, self.rng, self.progress, self.cancel
                )
                chosen = np.concatenate([uniform, greedy])
        self._mark_sent(chosen)
        self.steps.done(step)
        return chosen

    def sample_uniform(self, count: int) -> NDArray[np.int64]:
        """Charge, then mark ``count`` unsent points drawn uniformly without replacement as sent.
        Once per session, under the uniform method's terms.

        Raises
        ------
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points.
        FailedPreconditionError
            If the terms' method is not uniform, the sample was drawn already, or the owner's
            point limits refuse.
        """
        self.steps.check(Step.SAMPLE)
        try:
            count = check_positive_int(count, "count")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        unsent = self.n_points - len(self._sent)
        if count > unsent:
            raise InvalidArgumentError(f"count {count} exceeds the {unsent} points not yet sent")
        self._pay(count, "raw points (uniform sample)")
        with self._computing("uniform sample"):
            chosen = self.work.sample(
                count, self.sent_indices, self.sample_rng, self.progress, self.cancel
            )
        self._mark_sent(chosen)
        self.steps.done(Step.SAMPLE)
        return chosen


class _Slot:
    """A session, who opened it, when it was last used, and the lock its steps run under."""

    def __init__(self, session: OwnerSession, curator: str, consumer: str, now: float) -> None:
        self.session = session
        self.curator = curator
        self.consumer = consumer
        self.touched = now
        self.lock = threading.Lock()


#: The curator identity in-process runs use.
LOCAL_CURATOR = "curator:local"


class Owner:
    """A data owner: its dataset, its sessions, and (in a service) its policy and ledger.

    Parameters
    ----------
    owner_id : str
        Name used in reports.
    data : PointSet, PartitionedData or None
        The private dataset, validated (finite, 2-D, non-empty): in memory (a small table), or
        partitioned on an engine (:class:`dpmarket.owner.partitioned.PartitionedData`: every step a
        pass over the partitions, on Dask); ``None`` for an owner that only takes part in joint
        statistics over a table (every session is then refused).
    ledger : OwnerLedger, optional
        The owner's durable ledger and policy; ``None`` for
        in-process research runs, which then charge and enforce nothing.
    max_sessions : int, optional
        Most sessions open at once (RESOURCE_EXHAUSTED beyond); default unlimited.
    idle_timeout : float, optional
        Seconds after which :meth:`expire_idle` closes a session nobody touched; default never.
    max_rff_dimension : int, optional
        Largest h1 dimension d a session may ask for; default unlimited.
    allow_seeded_sessions : bool
        Whether a session's ``sampling_seed`` seeds this owner's randomness (reproducible runs).
        Otherwise sampling uses a CSPRNG-seeded generator and noise OpenDP's samplers, whatever
        seed the curator sends.
    clock : callable, optional
        Seconds (monotonic); injected by tests.
    schema : Schema, optional
        The public schema ``data`` was checked against (its features are the schema's columns
        but the label); advertised by :meth:`info`.
    limits : WorkLimits, optional
        The owner's memory and time budgets: a session whose estimated work exceeds them is
        refused when it opens (:mod:`dpmarket.owner.limits`); default: none.
    hash_party : HashKeyParty, optional
        This owner's side of the hashes mode's key agreement (:mod:`dpmarket.owner.hash_keys`);
        without it the owner takes no part in hashes sessions.

    Notes
    -----
    The service runs steps in worker threads: the session table is guarded by one lock and
    each session's steps by its own, so two calls for the same session (a retried or
    misbehaving curator) cannot release one point twice.
    """

    def __init__(
        self,
        owner_id: str,
        data: PointSet | PartitionedData | None,
        *,
        ledger: OwnerLedger | None = None,
        max_sessions: int | None = None,
        idle_timeout: float | None = None,
        max_rff_dimension: int | None = None,
        allow_seeded_sessions: bool = True,
        clock: Callable[[], float] = time.monotonic,
        schema: Schema | None = None,
        limits: WorkLimits | None = None,
        hash_party: HashKeyParty | None = None,
    ) -> None:
        if not owner_id:
            raise ValueError("owner_id must be a non-empty string")
        if schema is not None and data is not None and data.n_features != len(schema.feature_names):
            raise ValueError(
                f"the schema declares {len(schema.feature_names)} features, the data has "
                f"{data.n_features}"
            )
        self.schema = schema
        self.owner_id = owner_id
        self.data = data
        self.ledger = ledger
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_rff_dimension = max_rff_dimension
        self.allow_seeded_sessions = allow_seeded_sessions
        self.clock = clock
        self.limits = limits
        self.hash_party = hash_party
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        # Sessions whose opening was cancelled while it ran (its caller gone): not registered.
        self._cancelled: dict[str, float] = {}
        #: Opens under way: the progress, cancel event and curator of each.
        self._opening: dict[str, tuple[Progress, threading.Event, str]] = {}

    def info(self) -> OwnerInfo:
        """Describe the dataset (size, feature count, labels, public schema), the owner's
        prices (its policy's; free without a ledger) and its access flags (its policy's; None
        without a ledger)."""
        prices = FREE if self.ledger is None else self.ledger.policy.prices
        access = None
        if self.ledger is not None:  # the flags its terms are checked against (owner.terms)
            policy = self.ledger.policy
            access = OwnerAccess(
                allow_exact_bids=policy.allow_exact_bids,
                allow_steered_selection=policy.allow_steered_selection,
                allow_non_private=policy.allow_non_private,
                allow_reward_disclosure=policy.allow_reward_disclosure,
            )
        if self.data is None:
            return OwnerInfo(
                self.owner_id,
                num_points=0,
                num_features=0,
                has_labels=False,
                schema=self.schema,
                prices=prices,
                access=access,
            )
        if isinstance(self.data, PartitionedData):
            return OwnerInfo(
                owner_id=self.owner_id,
                num_points=self.data.n_points,
                num_features=self.data.n_features,
                has_labels=self.data.has_labels,
                schema=self.schema,
                prices=prices,
                access=access,
            )
        return OwnerInfo(
            owner_id=self.owner_id,
            num_points=int(self.data.features.shape[0]),
            num_features=int(self.data.features.shape[1]),
            has_labels=self.data.labels is not None,
            schema=self.schema,
            prices=prices,
            access=access,
        )

    @property
    def sessions(self) -> dict[str, OwnerSession]:
        """Open sessions by id (a copy)."""
        with self._lock:
            return {sid: slot.session for sid, slot in self._slots.items()}

    def _magnitudes(self, rff: RFFParams) -> NDArray[np.float64] | None:
        """The largest ``|z_j|`` of each feature as h1 reads it, by the public schema: 1 under
        a feature scaling (the table was checked within its bounds, which the scaling maps
        into [0, 1]), ``max(|low|, |high|)`` without one; None without a schema."""
        if self.schema is None:
            return None
        if rff.scaling is not None:
            return np.ones(rff.scaling.n_features)
        return np.array([max(abs(lo), abs(hi)) for _, lo, hi in self.schema.bounds()])

    def _own_scaling(self) -> FeatureScaling | None:
        """The feature scaling of this owner's declaration (its schema's public bounds), or
        None without a schema: what every session's h1 must carry (:meth:`_check_scaling`)."""
        return feature_scaling(self.schema)

    def _check_scaling(self, rff: RFFParams) -> None:
        """Refuse h1 parameters whose feature scaling is not this owner's declaration
        (:meth:`open_session`'s InvalidArgumentError, before anything is computed or charged).

        With a schema, the session's kernel reads every feature scaled to [0, 1] by the
        schema's public bounds (:class:`~dpmarket.common.summarization.rff.FeatureScaling`):
        the parameters must carry exactly those bounds; without one, no scaling. The curator
        may lie; the owner trusts its own declaration. The message depends only on public
        inputs (the declaration and the request).
        """
        if self.schema is None:
            if rff.scaling is not None:
                raise InvalidArgumentError(
                    f"owner {self.owner_id} declares no schema, but h1's parameters carry a "
                    "feature scaling: a session without a schema reads the features in their "
                    "own units"
                )
            return
        mine = self._own_scaling()
        assert mine is not None
        if rff.scaling is None:
            raise InvalidArgumentError(
                f"h1's parameters carry no feature scaling, but owner {self.owner_id} declares "
                "a schema: the session's kernel reads every feature scaled to [0, 1] by the "
                "schema's public bounds"
            )
        if rff.scaling != mine:  # same length: _check_shape checked the feature count
            j = int(np.argmax((rff.scaling.low != mine.low) | (rff.scaling.high != mine.high)))
            name = self.schema.feature_names[j]
            raise InvalidArgumentError(
                f"h1's feature scaling disagrees with owner {self.owner_id}'s declared bounds "
                f"at column {name!r}: [{rff.scaling.low[j]!r}, {rff.scaling.high[j]!r}] asked, "
                f"[{mine.low[j]!r}, {mine.high[j]!r}] declared; the session's kernel reads every "
                "feature scaled by the schema's public bounds"
            )

    def _check_shape(self, info: OwnerInfo, rff: RFFParams, data: Any) -> None:
        """Refuse h1 parameters that do not fit this owner's points or its limits (before
        anything is computed; :meth:`open_session`'s InvalidArgumentError).

        Besides the shape, h1's angles ``omega_i . x + phase_i`` must stay within
        :data:`dpmarket.common.fourier.ANGLE_LIMIT` for every ``x`` within the schema's public
        bounds (``|omega_i|_1 max|x| + |phase_i|``, :func:`~dpmarket.common.fourier.
        check_angle_bound`; without a schema, at magnitude 1): decided on the request and the
        public schema alone. Honest parameters (``N(0, 2 gamma)`` frequencies, phases in
        ``[0, 2 pi)``) pass at any ``gamma`` a consumer may ask for data of any sensible scale;
        crafted ones that would drive the float32 cosine to NaN on some values and not others
        (a membership oracle through the step's status) are refused here, and the features are
        total anyway (an angle beyond the limit is taken as 0). So are frequencies and phases
        whose magnitude is non-zero but below
        :data:`~dpmarket.common.validation.PARAMETER_FLOOR` (products with the rows' values
        could be subnormal, and the open's time would follow how many values are non-zero).
        """
        if rff.n_features != info.num_features:
            raise InvalidArgumentError(
                f"h1 frequencies have {rff.n_features} columns but this owner's points have "
                f"{info.num_features} features"
            )
        if self.max_rff_dimension is not None and rff.d > self.max_rff_dimension:
            raise InvalidArgumentError(
                f"h1 dimension d={rff.d} exceeds this owner's limit of {self.max_rff_dimension}"
            )
        self._check_scaling(rff)
        try:
            check_angle_bound(rff.omega, rff.phase, self._magnitudes(rff), "h1")
            check_not_tiny(rff.omega, "h1 frequencies")
            check_not_tiny(rff.phase, "h1 phases")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        if self.limits is not None:
            self.limits.check_session(
                n_rows=info.num_points,
                n_features=info.num_features,
                d=rff.d,
                partitioned=isinstance(data, PartitionedData),
                open_sessions=len(self._slots),
            )

    def _allowance(
        self, session_id: str, n: int, terms: OwnerTerms, consumer: str, curator: str
    ) -> int:
        """The most raw points a new session may receive, after the policy and the ledger
        accept its terms (:meth:`open_session`'s FailedPreconditionError when they do not):
        ``n`` without a ledger. Charges nothing."""
        allowance = n
        if self.ledger is not None:
            # What a reopen has left of its line (its terms are its first open's:
            # IdState.opened), then what the method asks that no charge covers (exact bids to
            # the curator, rows picked along the curator's direction, a reward's count of the
            # summary's points), then what it charges, then how many rounds: each refusal
            # before anything is computed.
            line = self._line_left(session_id, terms)
            check_exact_bids(self.ledger.policy, terms)
            check_steered_selection(self.ledger.policy, terms)
            check_reward_disclosure(self.ledger.policy, terms)
            payout = 0.0
            if terms.market is not None:
                payout = owner_payout_epsilon(terms.market.settlement)
            self.ledger.check(
                session=session_id,
                consumer=consumer,
                curator=curator,
                mechanism=terms.mechanism,
                epsilon=terms.epsilon + payout,
                delta=terms.delta,
                points=0,
            )
            # The policy's share of this table for one session (its points and its fraction
            # of the rows), less what this session id was charged already (a session reopened
            # under its id gets no fresh share), within what is left of the window's budget.
            policy = self.ledger.policy
            already = self.ledger.session_totals(session_id).points
            allowance = max(
                0,
                min(n, policy.session_points(n) - already, self.ledger.remaining().points),
            )
            check_rounds(policy, terms, allowance)
            # The quote's line for this owner: at least its own prices at the line's limits,
            # and no more raw points than the line states (so the statement stays within it).
            check_quote(policy.prices, terms.market, terms.epsilon, owner=self.owner_id)
            if line is not None:
                allowance = min(allowance, line)
        return allowance

    def _line_left(self, session_id: str, terms: OwnerTerms) -> int | None:
        """The raw points a session id may still read under its quote line (None: it has none).

        One session id is one session across its opens, under the terms of its first open
        (checked and recorded by :meth:`~dpmarket.owner.ids.IdState.opened`, so its line is the
        one it first accepted). Under its line a reopen may read that line's points less every
        point charged under the id and charges no epsilon beyond the terms' once (its
        statement could not pay it): refused with FailedPreconditionError, before anything is
        read; nothing is charged.
        """
        assert self.ledger is not None
        if terms.market is None:
            return None
        spent = self.ledger.session_totals(session_id)
        if spent.epsilon > 0 and terms.epsilon > 0:
            raise FailedPreconditionError(
                f"session {short_id(session_id)} charged its terms' epsilon already: reopened, "
                f"it would charge epsilon {terms.epsilon:g} again, beyond what its quote line "
                "pays; open a new session under a new id"
            )
        return max(0, terms.market.max_points_read - int(spent.points))

    def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        terms: OwnerTerms,
        curator: str = LOCAL_CURATOR,
        consumer: str = "consumer:local",
    ) -> tuple[int, int]:
        """Check a new session's terms, compute h1 features of every point; charges nothing.

        Parameters
        ----------
        session_id : str
            The curator's id of the session.
        rff : RFFParams
            h1's parameters, drawn by the curator.
        sampling_seed : int
            Seeds this session's randomness when seeded sessions are allowed.
        terms : OwnerTerms
            The method the session runs (which decides the steps it may ask,
            :mod:`dpmarket.owner.steps`) and what it spends of this owner's privacy.
        curator, consumer : str
            Identities (``"role:name"``) of the curator that opens the session (only it may use
            the session) and of the consumer it serves (recorded in the ledger).

        Returns
        -------
        tuple of int
            ``(num_points, max_points)``: this owner's size and the most raw points the session
            may receive under its policy: ``policy.session_points(num_points)`` (the session's
            points and its fraction of the table) less what the session id was charged
            already, within what is left of the window's points budget and within the
            ``max_points_read`` of its quote (``terms.market``, and of the line the session id
            first opened with) less every point charged under the id: a session id is one
            session across its opens, read against one quote line.

        Raises
        ------
        InvalidArgumentError
            If the session id is not one a curator may choose
            (:func:`~dpmarket.owner.ids.check_curator_id`: empty, too long, holding the
            separator of the owner's derived ids or an operator's prefix), the h1 parameters
            do not fit the data, their feature scaling is not this owner's declaration (the
            schema's public bounds; none without a schema), or d exceeds the policy's limit.
        FailedPreconditionError
            If the ledger refuses the terms (over the per-session or remaining budget, or
            non-private terms the policy does not allow), or the policy refuses what the terms'
            method asks (:mod:`dpmarket.owner.terms`: a per-round method without
            ``access.allow_exact_bids``; a candidates method or its hashes mode without
            ``access.allow_steered_selection``; terms with a consumer's reward without
            ``access.allow_reward_disclosure``; more Bid rounds than
            ``session.rounds_per_point`` times the point allowance), or the owner's prices
            refuse the quote (:func:`~dpmarket.common.market.terms.check_quote`: a quoted
            charge below them, or no quote for an owner that is not free), or the session id's
            statement is recorded already (a settled session never reopens, whatever its
            terms), or the session id opened before under other terms (another quote line, or
            a line where it had none, or none where it had one: an id's terms are fixed at its
            first open), or the session id was first opened as a CAPE job
            (:mod:`dpmarket.owner.ids`). Nothing is read or charged.
        ResourceExhaustedError
            If ``max_sessions`` sessions are open (after closing idle ones).
        AlreadyExistsError
            If ``session_id`` is open already, or another open of it is running (one open of an
            id at a time: what the id has left is read after every earlier open of it ended).

        Notes
        -----
        The id's terms are checked and recorded with its kind in one write transaction
        (:meth:`~dpmarket.owner.ids.IdState.opened`) after every check and before the h1
        features are computed: of two opens of the id racing under different terms, the one
        that records second is refused (FailedPreconditionError), and the terms recorded are
        those of the slot that lives.
        """
        check_curator_id(session_id)
        data = self.data
        if data is None:
            raise FailedPreconditionError(f"owner {self.owner_id} holds no point set to summarize")
        info = self.info()
        # Idle sessions go first, so that they do not hold the slots a new session needs.
        self.expire_idle()
        self._check_new(session_id)
        ids, first = self._ids(), self._session_open(terms, consumer)
        if ids is not None:  # settled, first opened as a CAPE job or under other terms: refused
            ids.check_open(curator, session_id, "session", session=first)
        self._check_shape(info, rff, data)
        self._allowance(session_id, info.num_points, terms, consumer, curator)  # every check
        if ids is not None:  # checked again and recorded at once, before anything is computed:
            ids.opened(curator, session_id, "session", session=first)  # a racing open under
        progress, cancel = self._reserve(session_id, curator)  # other terms is refused, or this one
        try:
            # Again, now that no other open of the id runs: what the id has left is read after
            # any earlier open of it closed, never before its points were charged.
            allowance = self._allowance(session_id, info.num_points, terms, consumer, curator)
            session = self._new_session(
                session_id,
                data,
                rff,
                sampling_seed,
                allowance,
                terms,
                curator,
                consumer,
                progress,
                cancel,
            )
            with self._lock:
                if cancel.is_set() or self._cancelled.pop(session_id, None) is not None:
                    raise WorkCancelled("the session's opening was cancelled")
                self._check_new(session_id, locked=True)
                self._slots[session_id] = _Slot(session, curator, consumer, self.clock())
        finally:
            with self._lock:
                self._opening.pop(session_id, None)
        return info.num_points, allowance

    def _session_open(self, terms: OwnerTerms, consumer: str) -> SessionOpen | None:
        """What a session's open fixes for its id (None without a ledger)."""
        if self.ledger is None:
            return None
        prices = self.ledger.policy.prices
        return SessionOpen(terms.market, prices, consumer, opened_terms(terms, consumer))

    def _reserve(self, session_id: str, curator: str) -> tuple[Progress, threading.Event]:
        """Mark ``session_id`` as opening (its progress and cancel event) until its open ends:
        one open of an id runs at a time, so none computes what the id has left while another
        reads under it. AlreadyExistsError if it is open or opening; ResourceExhaustedError
        if ``max_sessions`` sessions are open."""
        progress, cancel = Progress(), threading.Event()
        with self._lock:
            self._check_new(session_id, locked=True)
            if session_id in self._opening:
                raise AlreadyExistsError(f"session {short_id(session_id)} is being opened")
            self._cancelled.pop(session_id, None)
            self._opening[session_id] = (progress, cancel, curator)
        return progress, cancel

    def _new_session(
        self,
        session_id: str,
        data: PointSet | PartitionedData,
        rff: RFFParams,
        sampling_seed: int,
        allowance: int,
        terms: OwnerTerms,
        curator: str,
        consumer: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> OwnerSession:
        """The session an open installs: its h1 features (the slow part), noise and charger."""
        if self.allow_seeded_sessions:
            rng = np.random.default_rng(sampling_seed)
            noise: NoiseSource = SeededNoise(rng)
        else:
            rng, noise = production_rng(), OpenDPNoise()
        work: _MemoryWork | _PartitionedWork
        if isinstance(data, PartitionedData):
            work = _PartitionedWork(data, rff)
        else:
            work = _MemoryWork(data, self._features(data, rff, progress, cancel))
        session = OwnerSession(
            work,
            rng,
            terms=terms,
            noise=noise,
            allowance=allowance,
            charge=self._charger(session_id, curator, consumer, terms),
            d=rff.d,
        )
        session.progress, session.cancel = progress, cancel
        return session

    @staticmethod
    def _features(
        data: PointSet, rff: RFFParams, progress: Progress, cancel: threading.Event
    ) -> NDArray[np.float32]:
        """h1 features of every point of a table held in memory, chunk by chunk (row-exact:
        the same as one call), reporting progress and stopping when cancelled."""
        n = data.n_points
        chunks = max(1, math.ceil(n / _FEATURE_CHUNK))
        out = np.empty((n, rff.d), dtype=np.float32)
        progress.start("features", chunks)
        try:
            with on_private_data("h1 features"):
                for c in range(chunks):
                    if cancel.is_set():
                        raise WorkCancelled("the session's opening was cancelled")
                    rows = slice(c * _FEATURE_CHUNK, (c + 1) * _FEATURE_CHUNK)
                    out[rows] = random_fourier_features(data.features[rows], rff)
                    progress.update(c + 1, chunks)
        except PrivateDataError as exc:
            if isinstance(exc.__cause__, WorkCancelled):
                raise exc.__cause__ from None
            raise
        finally:
            progress.finish()
        return out

    def cancel(self, session_id: str, curator: str = LOCAL_CURATOR) -> None:
        """Stop ``curator``'s session's running step at once (its caller is gone), or its
        opening: a session whose opening is cancelled is not registered. Nothing is released.
        A session or an opening of another curator's is left alone: knowing an id is never
        enough to stop it."""
        with self._lock:
            slot = self._slots.get(session_id)
            opening = self._opening.get(session_id)
            if slot is not None and slot.curator != curator:
                slot = None
            if opening is not None and opening[2] != curator:
                return
            if slot is None and session_id not in self._slots:
                self._cancelled[session_id] = self.clock()
                if len(self._cancelled) > 1024:
                    self._cancelled.pop(next(iter(self._cancelled)))
        if slot is not None:
            slot.session.cancel.set()
        if opening is not None:
            opening[1].set()

    def progress(self, session_id: str, curator: str = LOCAL_CURATOR) -> tuple[str, int, int, int]:
        """``(stage, done, total, ticks)`` of the session's running step (or of its opening).

        Raises
        ------
        NotFoundError
            If no session of ``curator`` has that id, open or opening.
        """
        with self._lock:
            slot = self._slots.get(session_id)
            opening = self._opening.get(session_id)
        if slot is not None and slot.curator == curator:
            return slot.session.progress.snapshot()
        if opening is not None and opening[2] == curator:
            return opening[0].snapshot()
        raise NotFoundError(f"unknown session {short_id(session_id)}")

    def _check_new(self, session_id: str, *, locked: bool = False) -> None:
        if not locked:
            with self._lock:
                self._check_new(session_id, locked=True)
            return
        if session_id in self._slots:
            raise AlreadyExistsError(f"session {short_id(session_id)} is already open")
        if self.max_sessions is not None and len(self._slots) >= self.max_sessions:
            raise ResourceExhaustedError(
                f"this owner serves at most {self.max_sessions} sessions at once; retry later"
            )

    def _charger(
        self, session_id: str, curator: str, consumer: str, terms: OwnerTerms
    ) -> Callable[[int, str], None] | None:
        """The session's charge function: the first charge carries the terms; before the first
        raw point leaves, the payout release the market terms fix is charged too (apart, under
        :func:`~dpmarket.owner.earnings.payout_session`), so that every owner whose points a
        payout release is about has paid for it before any release."""
        ledger = self.ledger
        if ledger is None:
            return None
        charged = False
        payout = 0.0 if terms.market is None else owner_payout_epsilon(terms.market.settlement)
        # No charge lands under the id once its statement is recorded (rolled back).
        unsettled = IdState(ledger, self.owner_id).charge_guard(curator, session_id)
        # The payout release is charged once per session id (a reopened session's payout is
        # the same release, stated once in its statement): read from the owner's own charges
        # of that release (a curator's id never takes the payout's derived form).
        paid = payout == 0.0 or payout_charged(ledger, session_id) > 0

        def charge(points: int, what: str) -> None:
            nonlocal charged, paid
            if charged and points == 0:
                return
            eps, dlt, mechanism = 0.0, 0.0, what
            if not charged:
                eps, dlt, mechanism = terms.epsilon, terms.delta, f"{terms.mechanism}; {what}"
            if points > 0 and not paid:
                # Both refused or both charged: check the release, then charge the payout first.
                ledger.check(
                    session=session_id,
                    consumer=consumer,
                    curator=curator,
                    mechanism=mechanism,
                    epsilon=eps + payout,
                    delta=dlt,
                    points=points,
                )
                ledger.charge(
                    session=payout_session(session_id),
                    consumer=consumer,
                    curator=curator,
                    mechanism=PAYOUT_MECHANISM,
                    epsilon=payout,
                    delta=0.0,
                    points=0,
                    record=unsettled,
                )
                paid = True
            ledger.charge(
                session=session_id,
                consumer=consumer,
                curator=curator,
                mechanism=mechanism,
                epsilon=eps,
                delta=dlt,
                points=points,
                record=unsettled,
            )
            charged = True

        return charge

    def _slot(self, session_id: str, curator: str) -> _Slot:
        check_curator_id(session_id)
        with self._lock:
            slot = self._slots.get(session_id)
        if slot is None or slot.curator != curator:
            raise NotFoundError(f"unknown session {short_id(session_id)}")
        slot.touched = self.clock()
        return slot

    def session(self, session_id: str, curator: str = LOCAL_CURATOR) -> OwnerSession:
        """Return an open session of ``curator`` and mark it used now.

        Raises
        ------
        NotFoundError
            If no session has that id, or another curator opened it.
        """
        return self._slot(session_id, curator).session

    def _ids(self) -> IdState | None:
        """The state of this owner's ids (:mod:`dpmarket.owner.ids`); None without a ledger."""
        return None if self.ledger is None else IdState(self.ledger, self.owner_id)

    @contextmanager
    def _step(self, session_id: str, curator: str) -> Iterator[OwnerSession]:
        """Run one protocol step of a session under its lock; refused (FailedPreconditionError,
        before it reads or charges anything) once the session's statement is recorded."""
        slot = self._slot(session_id, curator)
        with slot.lock:
            ids = self._ids()
            if ids is not None:
                ids.check_unsettled(curator, session_id)
            yield slot.session

    def set_validation_embedding(
        self,
        session_id: str,
        embedding: NDArray[np.float64],
        curator: str = LOCAL_CURATOR,
        *,
        shrinkage_sigma: float = 0.0,
        prior_embedding: NDArray[np.float64] | None = None,
        score_metric: bool = False,
    ) -> None:
        """See :meth:`OwnerSession.set_validation_embedding`."""
        with self._step(session_id, curator) as session:
            session.set_validation_embedding(
                embedding,
                shrinkage_sigma=shrinkage_sigma,
                prior_embedding=prior_embedding,
                score_metric=score_metric,
            )

    def bid(
        self,
        session_id: str,
        round_: int,
        summary_embedding: NDArray[np.float64],
        summary_size: int,
        curator: str = LOCAL_CURATOR,
    ) -> OwnerBid | None:
        """See :meth:`OwnerSession.bid`."""
        with self._step(session_id, curator) as session:
            return session.bid(round_, summary_embedding, summary_size)

    def quick_bid(self, session_id: str, curator: str = LOCAL_CURATOR) -> bool:
        """Whether the session's next bid is short enough to run on the caller's thread (the
        service's event loop) rather than in a worker thread: its features are held in memory (at
        most :data:`~dpmarket.owner.limits.QUICK_STEP_BYTES`), its terms are already charged (the
        bid writes no ledger) and no other step of the session runs.

        Raises
        ------
        NotFoundError
            If no session has that id, or another curator opened it.
        """
        slot = self._slot(session_id, curator)
        session = slot.session
        work = session.work
        return (
            isinstance(work, _MemoryWork)
            and work.features.nbytes <= QUICK_STEP_BYTES
            and session.round > 0
            and not slot.lock.locked()
        )

    def noisy_relevant_count(
        self, session_id: str, threshold: float, curator: str = LOCAL_CURATOR
    ) -> float:
        """See :meth:`OwnerSession.noisy_relevant_count`."""
        with self._step(session_id, curator) as session:
            return session.noisy_relevant_count(threshold)

    def release_point(
        self, session_id: str, round_: int, curator: str = LOCAL_CURATOR
    ) -> ReleasedPoint:
        """Release the point bid in ``round_`` because the auction asked for it (steps 12-14)."""
        with self._step(session_id, curator) as session:
            index = session.release(round_)
            bid = session.offered_bid
            points, labels = self._points(session, np.array([index], dtype=np.int64))
        return ReleasedPoint(
            point=points[0], label=None if labels is None else int(labels[0]), bid=bid
        )

    def sample_uniform(
        self, session_id: str, count: int, curator: str = LOCAL_CURATOR
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` uniformly drawn unsent points and their labels (uniform baseline)."""
        with self._step(session_id, curator) as session:
            return self._points(session, session.sample_uniform(count))

    def propose_candidates(
        self,
        session_id: str,
        count: int,
        curator: str = LOCAL_CURATOR,
        *,
        uniform_count: int = 0,
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` candidates, the first ``uniform_count`` a uniform sample, the rest
        chosen by the local greedy (candidates method; :meth:`OwnerSession.propose_candidates`)."""
        with self._step(session_id, curator) as session:
            return self._points(
                session, session.propose_candidates(count, uniform_count=uniform_count)
            )

    # ---------------------------------------------------------------- the hashes mode
    def _party(self) -> HashKeyParty:
        if self.hash_party is None:
            raise FailedPreconditionError(
                f"owner {self.owner_id} takes no part in hashes sessions (no hash-key identity)"
            )
        return self.hash_party

    def hash_advertise(self, session_id: str, curator: str = LOCAL_CURATOR) -> HashAdvert:
        """The hashes mode, step 1: this owner's signed key for the session's agreement
        (:meth:`dpmarket.owner.hash_keys.HashKeyParty.advertise`), once per session.

        Raises
        ------
        FailedPreconditionError
            If the terms' method is not a hashes method, a step before it is not done, the key
            was advertised already, or this owner takes no part in hashes sessions.
        """
        with self._step(session_id, curator) as session:
            session.steps.check(Step.HASH_ADVERT)
            advert = self._party().advertise(session_id)
            session.steps.done(Step.HASH_ADVERT)
            return advert

    def hash_distribute(
        self,
        session_id: str,
        adverts: Mapping[str, HashAdvert],
        curator: str = LOCAL_CURATOR,
    ) -> dict[str, tuple[bytes, bytes]]:
        """Step 2, at the leader: draw the secret and encrypt it to every other owner. Once per
        session, instead of :meth:`hash_receive` (FailedPreconditionError as
        :meth:`hash_advertise`)."""
        with self._step(session_id, curator) as session:
            session.steps.check(Step.HASH_SECRET)
            envelopes = self._party().distribute(session_id, adverts)
            session.steps.done(Step.HASH_SECRET)
            return envelopes

    def hash_receive(
        self,
        session_id: str,
        adverts: Mapping[str, HashAdvert],
        envelope: tuple[bytes, bytes],
        curator: str = LOCAL_CURATOR,
    ) -> str:
        """Step 3: decrypt the leader's envelope; return the secret's public id. Once per
        session, instead of :meth:`hash_distribute` (FailedPreconditionError as
        :meth:`hash_advertise`)."""
        with self._step(session_id, curator) as session:
            session.steps.check(Step.HASH_SECRET)
            key_id = self._party().receive(session_id, adverts, envelope)
            session.steps.done(Step.HASH_SECRET)
            return key_id

    def hash_key_id(self, session_id: str, curator: str = LOCAL_CURATOR) -> str:
        """The public id of the session's agreed secret."""
        with self._step(session_id, curator):
            return self._party().key_id(session_id)

    def propose_hashes(
        self, session_id: str, count: int, gamma: float, curator: str = LOCAL_CURATOR
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """The hashes mode's proposal: ``count`` points chosen by the local greedy (as
        :meth:`propose_candidates`), released as their h1 hashes under the owners' secret map
        (:func:`dpmarket.common.summarization.hashes.hash_parameters`, dimension d of the session's
        h1, kernel ``gamma``, the feature scaling of this owner's declaration, which the session
        checked), with their labels. Each hash is charged as the raw point it
        describes: Theorem 9 protects the point only from receivers without the map.

        Every public input (the step, the agreed secret, ``gamma``, then ``count``) is checked
        before anything is charged or a point marked sent: a refusal charges nothing.

        Raises
        ------
        InvalidArgumentError
            If ``gamma`` is not a finite number > 0, or as
            :meth:`OwnerSession.propose_candidates` (``count``).
        FailedPreconditionError
            If the terms' method is not a hashes method, this owner takes no part in hashes
            sessions, the secret is not agreed, or as :meth:`OwnerSession.propose_candidates`.
        """
        with self._step(session_id, curator) as session:
            session.steps.check(Step.HASHES)
            party = self._party()
            key_id = party.key_id(session_id)
            try:  # the map first: a bad gamma is refused before anything is charged
                params = party.params(key_id, self.info().num_features, session.d, gamma)
                params = dataclasses.replace(params, scaling=self._own_scaling())
            except ValueError as exc:
                raise InvalidArgumentError(
                    f"{exc}: the hashes' kernel parameter is the session's gamma"
                ) from exc
            chosen = session.propose_candidates(
                count, what="raw points as h1 hashes", step=Step.HASHES
            )
            points, labels = self._points(session, chosen)
        return hash_points(points, params), labels

    def hash_points(
        self, key_id: str, points: NDArray[np.float64], d: int, gamma: float
    ) -> NDArray[np.float64]:
        """h1 of a consumer's new points under the map of the secret ``key_id``, so that a
        model trained on a hashes summary can be applied to them (only an owner can: module
        :mod:`dpmarket.common.summarization.hashes`). Nothing of this owner's data is used.

        Raises
        ------
        FailedPreconditionError
            If this owner holds no secret with that id.
        """
        try:
            x = check_matrix(points, "points")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        params = self._party().params(key_id, x.shape[1], d, gamma)
        try:
            params = dataclasses.replace(params, scaling=self._own_scaling())
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        return hash_points(x, params)

    def _points(
        self, session: OwnerSession, index: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        return session.work.points(np.asarray(index, dtype=np.int64))

    def close_session(self, session_id: str, curator: str = LOCAL_CURATOR) -> SessionSpend:
        """Forget a session; return what it spent of this owner's budget.

        A session this owner no longer holds (idle, closed before, or opened before the owner
        restarted) is answered from the durable ledger alone when the ledger knows the id for
        ``curator`` (:meth:`~dpmarket.owner.ids.IdState.known`: its open recorded, or a charge
        of ``curator``'s under it or its payout release), zero when nothing was charged: so a
        curator that restarted, or an owner that restarted mid-session, still settles it
        (``CuratorStore.recover``, the curator's settlement retries).

        Raises
        ------
        InvalidArgumentError
            If ``session_id`` is not an id a curator may choose (:func:`check_curator_id`).
        NotFoundError
            If no session has that id, or another curator opened it (and, for one the owner
            no longer holds, the ledger never knew the id for ``curator``).
        """
        try:
            slot = self._slot(session_id, curator)
        except NotFoundError:
            ids = self._ids()
            if ids is None or not ids.known(curator, session_id):
                raise
            return self._spent(session_id)
        slot.session.cancel.set()  # a running step stops; its lock is then free
        with slot.lock, self._lock:
            self._slots.pop(session_id, None)
        session = slot.session
        if self.ledger is not None:
            return self._spent(session_id)
        return SessionSpend(0.0, 0.0, session.released, False)

    def _spent(self, session_id: str) -> SessionSpend:
        """What the ledger recorded for a session."""
        assert self.ledger is not None
        totals = self.ledger.session_totals(session_id)
        return SessionSpend(
            math.inf if totals.non_private else totals.epsilon,
            totals.delta,
            totals.points,
            totals.non_private,
        )

    def expire_idle(self) -> list[str]:
        """Close the sessions nobody touched for ``idle_timeout`` seconds; return their ids.

        Their features and state are freed; what they spent stays in the ledger.
        """
        if self.idle_timeout is None:
            return []
        cutoff = self.clock() - self.idle_timeout
        with self._lock:
            idle = [
                sid
                for sid, slot in self._slots.items()
                if slot.touched < cutoff and not slot.lock.locked()
            ]
            for sid in idle:
                self._slots.pop(sid).session.cancel.set()
        return idle
