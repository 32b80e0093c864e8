"""The owner's side of the summarization protocol, as plain state objects on numpy arrays.

One :class:`Owner` holds a private dataset and any number of sessions; each protocol stage is a
method that takes and returns arrays, so it runs in-process (tests, ``dpmarket simulate``) and
behind the gRPC servicer (:mod:`owner.service`) with identical results.

The owner enforces its own policy whatever the curator asks. A session opens with
:class:`~common.summarization.terms.OwnerTerms`, what the whole session spends of this owner's
privacy; the owner checks them against its ledger when the session opens and charges them
before its first release (a relevance count, a bid or a point), then charges every raw point
before it leaves ("charge, then release": a crash between the two wastes budget but never
releases anything uncharged). A refused charge raises ``FailedPreconditionError`` and changes
nothing. An owner built without a ledger (in-process research runs: ``dpmarket simulate``, the
evaluation harness, benchmarks) records and enforces nothing; the owner service always has one.

Every refusal depends only on public inputs: the request, the owner's declared size and feature
count (``GetOwnerInfo``), how many points the session has received, and the owner's policy and
budget. The computations on the points (features, bids, counts, the local greedy) run under
:func:`common.errors.on_private_data`, so whatever they might raise never reaches the curator as
text (it answers INTERNAL with a fixed message; the owner's log says why).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
from numpy.typing import NDArray

from common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    on_private_data,
)
from common.ids import short_id
from common.privacy.ledger import SessionSpend
from common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from common.privacy.rng import production_rng
from common.summarization.candidates import shrink_towards_points
from common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from common.summarization.hashes import HashAdvert, hash_points
from common.summarization.kernels import bid_direction, bid_scores, embedding_greedy
from common.summarization.rff import RFFParams, random_fourier_features
from common.summarization.terms import OwnerTerms
from common.validation import check_matrix, check_positive_int, check_vector
from owner.data import PointSet
from owner.hash_keys import HashKeyParty
from owner.ledger import OwnerLedger


class OwnerSession:
    """One summarization session at one owner.

    Parameters
    ----------
    features : ndarray of shape (n_points, d), float32
        h1 features of every owned point, computed once (DESIGN: performance principles).
    rng : numpy.random.Generator
        Randomness of :meth:`sample_uniform`.
    noise : NoiseSource, optional
        Noise of :meth:`noisy_relevant_count` (default: seeded from ``rng``).
    terms : OwnerTerms, optional
        What the session spends of this owner's privacy (default: nothing, which makes
        :meth:`noisy_relevant_count` unavailable).
    allowance : int, optional
        The most raw points this session may receive (default: all).
    charge : callable ``(points, what) -> None``, optional
        Charges the owner's ledger; the first call also charges ``terms``. Raises
        ``FailedPreconditionError`` to refuse. Default: charge nothing.
    """

    def __init__(
        self,
        features: NDArray[np.float32],
        rng: np.random.Generator,
        *,
        noise: NoiseSource | None = None,
        terms: OwnerTerms | None = None,
        allowance: int | None = None,
        charge: Callable[[int, str], None] | None = None,
    ) -> None:
        self.features = features
        self.rng = rng
        self.noise = noise if noise is not None else SeededNoise(rng)
        self.terms = terms if terms is not None else OwnerTerms("none", 0.0, 0.0)
        self.allowance = features.shape[0] if allowance is None else int(allowance)
        self._charge = charge
        self.sent = np.zeros(features.shape[0], dtype=bool)
        self.released = 0
        self.validation_embedding: NDArray[np.floating] | None = None
        #: The validation embedding's noise per coordinate (0: use the embedding as given).
        self.shrinkage_sigma = 0.0
        self.round = 0
        self._offered: int | None = None
        self._offered_bid = 0.0
        # Rounds in which each point has been this owner's best (Algorithm 3, step 14).
        self._best_counts = np.zeros(features.shape[0], dtype=np.int64)

    @property
    def d(self) -> int:
        """Dimension of h1."""
        return int(self.features.shape[1])

    def _pay(self, points: int, what: str) -> None:
        """Charge before a release; refuse beyond the session's point allowance."""
        if self.released + points > self.allowance:
            raise FailedPreconditionError(
                f"this session may receive {self.allowance} raw points from this owner; "
                f"{self.released} released, {points} more asked"
            )
        if self._charge is not None:
            self._charge(points, what)
        self.released += points

    def set_validation_embedding(
        self, embedding: NDArray[np.float64], *, shrinkage_sigma: float = 0.0
    ) -> None:
        """Store the private validation embedding gtilde (Algorithm 3, step 3).

        Parameters
        ----------
        embedding : ndarray of shape (d,)
            gtilde, a Gaussian (or MWEM) release about the validation set.
        shrinkage_sigma : float
            How much noise :meth:`propose_candidates` assumes per coordinate of ``embedding``
            (public: the release's noise standard deviation, a function of its epsilon, delta
            and m, times the square root of the session's shrinkage strength), or 0. When > 0,
            the proposal matches the embedding shrunk towards this owner's own mean h1 by as
            much as that noise hides the difference
            (:func:`common.summarization.candidates.shrink_towards_points`); bids always use
            ``embedding`` as given (the curator verifies them against it).

        Raises
        ------
        InvalidArgumentError
            If ``embedding`` is not of shape (d,) or is not finite, or ``shrinkage_sigma`` is
            negative or not finite.
        FailedPreconditionError
            If a round has been bid already.
        """
        if self.round > 0:
            raise FailedPreconditionError(
                f"the validation embedding must be set before round 1; round {self.round} is done"
            )
        if not (math.isfinite(shrinkage_sigma) and shrinkage_sigma >= 0):
            raise InvalidArgumentError(
                f"shrinkage_sigma must be finite and >= 0, got {shrinkage_sigma}"
            )
        try:
            self.validation_embedding = check_vector(embedding, "validation_embedding", size=self.d)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        self.shrinkage_sigma = float(shrinkage_sigma)

    def bid(
        self, round_: int, summary_embedding: NDArray[np.float64], summary_size: int
    ) -> OwnerBid | None:
        """Bid the best unsent point of round ``round_`` (Algorithm 3, step 6, corrected sign).

        The score of a point x is ``gtilde . h1(x) - q/(q+1) * g . h1(x)``: one float32
        matrix-vector product over the precomputed features, then an argmax over unsent points.
        The first bid charges the session's terms.

        Parameters
        ----------
        round_ : int
            Must be the previous round + 1.
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
            If the validation embedding is unset, ``round_`` is not the next round, or the
            owner's policy refuses the session's terms.
        InvalidArgumentError
            If the embedding has the wrong length or NaN/inf, or ``summary_size < 0``.
        """
        if self.validation_embedding is None:
            raise FailedPreconditionError("bid before the validation embedding was set")
        if round_ != self.round + 1:
            raise FailedPreconditionError(f"expected round {self.round + 1}, got round {round_}")
        if summary_size < 0:
            raise InvalidArgumentError(f"summary_size must be >= 0, got {summary_size}")
        try:
            g = check_vector(summary_embedding, "summary_embedding", size=self.d)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        if self.round == 0:
            self._pay(0, "bids")
        self.round = round_
        self._offered = None
        if self.sent.all() or self.released >= self.allowance:
            return None
        with on_private_data("bid"):
            scores = bid_scores(
                self.features, bid_direction(self.validation_embedding, g, summary_size)
            )
            scores[self.sent] = -np.inf
            best = int(np.argmax(scores))
        self._best_counts[best] += 1
        self._offered = best
        self._offered_bid = float(scores[best])
        return OwnerBid(bid=self._offered_bid, times_best=int(self._best_counts[best]))

    def release(self, round_: int) -> int:
        """Charge, then mark the point bid in ``round_`` as sent and return its index.

        Raises
        ------
        FailedPreconditionError
            If ``round_`` is not the last round bid, that round's point was already released, or
            the owner's point limits refuse it.
        """
        if round_ != self.round or self.round == 0:
            raise FailedPreconditionError(
                f"round {round_} is not the last round bid (last bid: round {self.round})"
            )
        if self._offered is None:
            raise FailedPreconditionError(f"no unsent point was bid in round {round_}")
        index = self._offered
        self._pay(1, "raw point (auction)")
        self.sent[index] = True
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

        One float32 matrix-vector product.

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset.
        InvalidArgumentError
            If ``threshold`` is NaN or infinite.
        """
        g = self._require_validation()
        if not np.isfinite(threshold):
            raise InvalidArgumentError(f"threshold must be finite, got {threshold}")
        with on_private_data("relevance count"):
            scores = bid_scores(self.features, g.astype(np.float32))
            return int(np.count_nonzero((scores >= threshold) & ~self.sent))

    def noisy_relevant_count(self, threshold: float) -> float:
        """The relevance count plus Laplace(1 / epsilon) noise, epsilon from the session's terms.

        Charges the terms first. Sensitivity: adding, removing or replacing one of this owner's
        points changes the count by at most 1 (L1 sensitivity 1), so the release is
        epsilon-DP with respect to this owner's data (Laplace mechanism); everything the
        candidates method does with it is post-processing.

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset, the terms carry no epsilon, or the owner's
            policy refuses them.
        InvalidArgumentError
            If ``threshold`` is NaN or infinite.
        """
        count = self.relevant_count(threshold)
        epsilon = self.terms.epsilon
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise FailedPreconditionError(
                f"a noisy count needs session terms with a finite epsilon > 0, got {epsilon}"
            )
        self._pay(0, "relevance count")
        return float(count + self.noise.laplace(1.0 / epsilon, 1)[0])

    def propose_candidates(
        self, count: int, *, what: str = "raw points (candidates)"
    ) -> NDArray[np.int64]:
        """Choose ``count`` unsent points by a local greedy against ``gtilde``; charge; mark sent.

        The greedy matches the validation embedding with this owner's points alone
        (:func:`common.summarization.kernels.embedding_greedy`), so the proposal depends on
        nothing but this owner's data and the private embedding. When the curator stated the
        embedding's noise (``shrinkage_sigma`` > 0), the target is first shrunk towards this
        owner's own mean h1 by as much as the noise hides the difference in the owner's own
        scores (:func:`common.summarization.candidates.shrink_towards_points`): with a small
        validation set the owner then proposes a representative sample of its own data (kernel
        herding), which the curator's exact re-ranking sorts, instead of the points that match
        the noise's direction; with a large one it follows gtilde.

        Notes
        -----
        The shrinkage uses this owner's data, the release and the public ``shrinkage_sigma`` only,
        and its result never leaves the owner: what leaves are the proposed points, charged as
        every raw point. It is post-processing of the release for the validation set's privacy.

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset or the owner's point limits refuse.
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points.
        """
        g = self._require_validation()
        try:
            count = check_positive_int(count, "count")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        unsent = int(np.count_nonzero(~self.sent))
        if count > unsent:
            raise InvalidArgumentError(f"count {count} exceeds the {unsent} points not yet sent")
        with on_private_data("local greedy"):
            if self.shrinkage_sigma > 0:
                g, _ = shrink_towards_points(g, self.features, self.shrinkage_sigma)
            chosen = embedding_greedy(
                self.features, g, np.zeros((0, self.d)), count, exclude=self.sent
            )
        self._pay(count, what)
        self.sent[chosen] = True
        return chosen

    def sample_uniform(self, count: int) -> NDArray[np.int64]:
        """Charge, then mark ``count`` unsent points drawn uniformly without replacement as sent.

        Raises
        ------
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points.
        FailedPreconditionError
            If the owner's point limits refuse.
        """
        try:
            count = check_positive_int(count, "count")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        unsent = np.flatnonzero(~self.sent)
        if count > unsent.size:
            raise InvalidArgumentError(
                f"count {count} exceeds the {unsent.size} points not yet sent"
            )
        self._pay(count, "raw points (uniform sample)")
        chosen = self.rng.choice(unsent, size=count, replace=False).astype(np.int64)
        self.sent[chosen] = True
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
    data : PointSet or None
        The private dataset, validated (finite, 2-D, non-empty); ``None`` for an owner that
        only takes part in joint statistics over a table (every session is then refused).
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
    hash_party : HashKeyParty, optional
        This owner's side of the hashes mode's key agreement (:mod:`owner.hash_keys`); without
        it the owner takes no part in hashes sessions.

    Notes
    -----
    The service runs steps in worker threads: the session table is guarded by one lock and
    each session's steps by its own, so two calls for the same session (a retried or
    misbehaving curator) cannot release one point twice.
    """

    def __init__(
        self,
        owner_id: str,
        data: PointSet | None,
        *,
        ledger: OwnerLedger | None = None,
        max_sessions: int | None = None,
        idle_timeout: float | None = None,
        max_rff_dimension: int | None = None,
        allow_seeded_sessions: bool = True,
        clock: Callable[[], float] = time.monotonic,
        hash_party: HashKeyParty | None = None,
    ) -> None:
        if not owner_id:
            raise ValueError("owner_id must be a non-empty string")
        self.owner_id = owner_id
        self.data = data
        self.ledger = ledger
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_rff_dimension = max_rff_dimension
        self.allow_seeded_sessions = allow_seeded_sessions
        self.clock = clock
        self.hash_party = hash_party
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    def info(self) -> OwnerInfo:
        """Describe the dataset (size, feature count, labels)."""
        if self.data is None:
            return OwnerInfo(self.owner_id, num_points=0, num_features=0, has_labels=False)
        return OwnerInfo(
            owner_id=self.owner_id,
            num_points=int(self.data.features.shape[0]),
            num_features=int(self.data.features.shape[1]),
            has_labels=self.data.labels is not None,
        )

    @property
    def sessions(self) -> dict[str, OwnerSession]:
        """Open sessions by id (a copy)."""
        with self._lock:
            return {sid: slot.session for sid, slot in self._slots.items()}

    def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        curator: str = LOCAL_CURATOR,
        consumer: str = "consumer:local",
        terms: OwnerTerms | None = None,
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
        curator, consumer : str
            Identities (``"role:name"``) of the curator that opens the session (only it may use
            the session) and of the consumer it serves (recorded in the ledger).
        terms : OwnerTerms, optional
            What the session spends of this owner's privacy; default nothing (uniform-style).

        Returns
        -------
        tuple of int
            ``(num_points, max_points)``: this owner's size and the most raw points the session
            may receive under its policy.

        Raises
        ------
        InvalidArgumentError
            If the session id is empty, the h1 parameters do not fit the data, or d exceeds
            the policy's limit.
        FailedPreconditionError
            If the ledger refuses the terms (over the per-session or remaining budget, or
            non-private terms the policy does not allow).
        ResourceExhaustedError
            If ``max_sessions`` sessions are open (after closing idle ones).
        AlreadyExistsError
            If ``session_id`` is open already.
        """
        if not session_id:
            raise InvalidArgumentError("session_id must be a non-empty string")
        if self.data is None:
            raise FailedPreconditionError(f"owner {self.owner_id} holds no point set to summarize")
        # Idle sessions go first, so that they do not hold the slots a new session needs.
        self.expire_idle()
        self._check_new(session_id)
        if rff.n_features != self.data.features.shape[1]:
            raise InvalidArgumentError(
                f"h1 frequencies have {rff.n_features} columns but this owner's points have "
                f"{self.data.features.shape[1]} features"
            )
        if self.max_rff_dimension is not None and rff.d > self.max_rff_dimension:
            raise InvalidArgumentError(
                f"h1 dimension d={rff.d} exceeds this owner's limit of {self.max_rff_dimension}"
            )
        terms = terms if terms is not None else OwnerTerms("none", 0.0, 0.0)
        n = int(self.data.features.shape[0])
        allowance = n
        if self.ledger is not None:
            self.ledger.check(
                session=session_id,
                consumer=consumer,
                curator=curator,
                mechanism=terms.mechanism,
                epsilon=terms.epsilon,
                delta=terms.delta,
                points=0,
            )
            allowance = min(
                n, self.ledger.policy.points_per_session, self.ledger.remaining().points
            )
        self._check_new(session_id)
        with on_private_data("h1 features"):
            features = random_fourier_features(self.data.features, rff)
        if self.allow_seeded_sessions:
            rng = np.random.default_rng(sampling_seed)
            noise: NoiseSource = SeededNoise(rng)
        else:
            rng, noise = production_rng(), OpenDPNoise()
        session = OwnerSession(
            features,
            rng,
            noise=noise,
            terms=terms,
            allowance=allowance,
            charge=self._charger(session_id, curator, consumer, terms),
        )
        with self._lock:
            self._check_new(session_id, locked=True)
            self._slots[session_id] = _Slot(session, curator, consumer, self.clock())
        return n, allowance

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
        """The session's charge function: the first charge carries the terms."""
        ledger = self.ledger
        if ledger is None:
            return None
        charged = False

        def charge(points: int, what: str) -> None:
            nonlocal charged
            if charged and points == 0:
                return
            eps, dlt, mechanism = 0.0, 0.0, what
            if not charged:
                eps, dlt, mechanism = terms.epsilon, terms.delta, f"{terms.mechanism}; {what}"
            ledger.charge(
                session=session_id,
                consumer=consumer,
                curator=curator,
                mechanism=mechanism,
                epsilon=eps,
                delta=dlt,
                points=points,
            )
            charged = True

        return charge

    def _slot(self, session_id: str, curator: str) -> _Slot:
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

    @contextmanager
    def _step(self, session_id: str, curator: str) -> Iterator[OwnerSession]:
        """Run one protocol step of a session under its lock."""
        slot = self._slot(session_id, curator)
        with slot.lock:
            yield slot.session

    def set_validation_embedding(
        self,
        session_id: str,
        embedding: NDArray[np.float64],
        curator: str = LOCAL_CURATOR,
        *,
        shrinkage_sigma: float = 0.0,
    ) -> None:
        """See :meth:`OwnerSession.set_validation_embedding`."""
        with self._step(session_id, curator) as session:
            session.set_validation_embedding(embedding, shrinkage_sigma=shrinkage_sigma)

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
        points, labels = self._points(np.array([index], dtype=np.int64))
        return ReleasedPoint(
            point=points[0], label=None if labels is None else int(labels[0]), bid=bid
        )

    def sample_uniform(
        self, session_id: str, count: int, curator: str = LOCAL_CURATOR
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` uniformly drawn unsent points and their labels (uniform baseline)."""
        with self._step(session_id, curator) as session:
            return self._points(session.sample_uniform(count))

    def propose_candidates(
        self, session_id: str, count: int, curator: str = LOCAL_CURATOR
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` candidates chosen by the local greedy (candidates method)."""
        with self._step(session_id, curator) as session:
            return self._points(session.propose_candidates(count))

    # ---------------------------------------------------------------- the hashes mode
    def _party(self) -> HashKeyParty:
        if self.hash_party is None:
            raise FailedPreconditionError(
                f"owner {self.owner_id} takes no part in hashes sessions (no hash-key identity)"
            )
        return self.hash_party

    def hash_advertise(self, session_id: str, curator: str = LOCAL_CURATOR) -> HashAdvert:
        """The hashes mode, step 1: this owner's signed key for the session's agreement
        (:meth:`owner.hash_keys.HashKeyParty.advertise`)."""
        with self._step(session_id, curator):
            return self._party().advertise(session_id)

    def hash_distribute(
        self,
        session_id: str,
        adverts: Mapping[str, HashAdvert],
        curator: str = LOCAL_CURATOR,
    ) -> dict[str, tuple[bytes, bytes]]:
        """Step 2, at the leader: draw the secret and encrypt it to every other owner."""
        with self._step(session_id, curator):
            return self._party().distribute(session_id, adverts)

    def hash_receive(
        self,
        session_id: str,
        adverts: Mapping[str, HashAdvert],
        envelope: tuple[bytes, bytes],
        curator: str = LOCAL_CURATOR,
    ) -> str:
        """Step 3: decrypt the leader's envelope; return the secret's public id."""
        with self._step(session_id, curator):
            return self._party().receive(session_id, adverts, envelope)

    def hash_key_id(self, session_id: str, curator: str = LOCAL_CURATOR) -> str:
        """The public id of the session's agreed secret."""
        with self._step(session_id, curator):
            return self._party().key_id(session_id)

    def propose_hashes(
        self, session_id: str, count: int, gamma: float, curator: str = LOCAL_CURATOR
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """The hashes mode's proposal: ``count`` points chosen by the local greedy (as
        :meth:`propose_candidates`), released as their h1 hashes under the owners' secret map
        (:func:`common.summarization.hashes.hash_parameters`, dimension d of the session's h1,
        kernel ``gamma``), with their labels. Each hash is charged as the raw point it
        describes: Theorem 9 protects the point only from receivers without the map.

        Raises
        ------
        FailedPreconditionError
            If this owner takes no part in hashes sessions, the secret is not agreed, or as
            :meth:`OwnerSession.propose_candidates`.
        """
        with self._step(session_id, curator) as session:
            party = self._party()
            key_id = party.key_id(session_id)
            chosen = session.propose_candidates(count, what="raw points as h1 hashes")
            d = session.d
        points, labels = self._points(chosen)
        params = party.params(key_id, points.shape[1], d, gamma)
        return hash_points(points, params), labels

    def hash_points(
        self, key_id: str, points: NDArray[np.float64], d: int, gamma: float
    ) -> NDArray[np.float64]:
        """h1 of a consumer's new points under the map of the secret ``key_id``, so that a
        model trained on a hashes summary can be applied to them (only an owner can: module
        :mod:`common.summarization.hashes`). Nothing of this owner's data is used.

        Raises
        ------
        FailedPreconditionError
            If this owner holds no secret with that id.
        """
        try:
            x = check_matrix(points, "points")
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        return hash_points(x, self._party().params(key_id, x.shape[1], d, gamma))

    def _points(
        self, index: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        data = self.data
        assert data is not None  # sessions exist only over a point set (open_session)
        labels = None if data.labels is None else data.labels[index].copy()
        return data.features[index].copy(), labels

    def close_session(self, session_id: str, curator: str = LOCAL_CURATOR) -> SessionSpend:
        """Forget a session; return what it spent of this owner's budget.

        Raises
        ------
        NotFoundError
            If no session has that id, or another curator opened it.
        """
        with self._step(session_id, curator) as session, self._lock:
            self._slots.pop(session_id, None)
        if self.ledger is not None:
            totals = self.ledger.session_totals(session_id)
            return SessionSpend(
                math.inf if totals.non_private else totals.epsilon,
                totals.delta,
                totals.points,
                totals.non_private,
            )
        return SessionSpend(0.0, 0.0, session.released, False)

    def expire_idle(self) -> list[str]:
        """Close the sessions nobody touched for ``idle_timeout`` seconds; return their ids.

        Their features and state are freed; what they spent stays in the ledger.
        """
        if self.idle_timeout is None:
            return []
        cutoff = self.clock() - self.idle_timeout
        with self._lock:
            idle = [sid for sid, slot in self._slots.items() if slot.touched < cutoff]
            for sid in idle:
                del self._slots[sid]
        return idle
