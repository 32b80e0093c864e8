"""The owner's side of the summarization protocol, as plain state objects on numpy arrays.

One :class:`Owner` holds a private dataset and any number of sessions; each protocol stage is a
method that takes and returns arrays, so it runs in-process (tests, ``dpmarket simulate``) and
behind the gRPC servicer (:mod:`owner.service`) with identical results.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from common.summarization.kernels import bid_direction, bid_scores, embedding_greedy
from common.summarization.rff import RFFParams, random_fourier_features
from common.validation import check_positive_int, check_vector
from owner.data import PointSet


class OwnerSession:
    """One summarization session at one owner.

    Parameters
    ----------
    features : ndarray of shape (n_points, d), float32
        h1 features of every owned point, computed once (DESIGN: performance principles).
    rng : numpy.random.Generator
        Randomness of :meth:`sample_uniform` only.
    """

    def __init__(self, features: NDArray[np.float32], rng: np.random.Generator) -> None:
        self.features = features
        self.rng = rng
        self.sent = np.zeros(features.shape[0], dtype=bool)
        self.validation_embedding: NDArray[np.floating] | None = None
        self.round = 0
        self._offered: int | None = None
        self._offered_bid = 0.0
        self._last_best: int | None = None
        self._times_best = 0

    @property
    def d(self) -> int:
        """Dimension of h1."""
        return int(self.features.shape[1])

    def set_validation_embedding(self, embedding: NDArray[np.float64]) -> None:
        """Store the private validation embedding gtilde (Algorithm 3, step 3).

        Raises
        ------
        InvalidArgumentError
            If ``embedding`` is not of shape (d,) or is not finite.
        FailedPreconditionError
            If a round has been bid already.
        """
        if self.round > 0:
            raise FailedPreconditionError(
                f"the validation embedding must be set before round 1; round {self.round} is done"
            )
        try:
            self.validation_embedding = check_vector(embedding, "validation_embedding", size=self.d)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc

    def bid(
        self, round_: int, summary_embedding: NDArray[np.float64], summary_size: int
    ) -> OwnerBid | None:
        """Bid the best unsent point of round ``round_`` (Algorithm 3, step 6, corrected sign).

        The score of a point x is ``gtilde . h1(x) - q/(q+1) * g . h1(x)``: one float32
        matrix-vector product over the precomputed features, then an argmax over unsent points.

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
        OwnerBid, or None when every point has been sent.

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset or ``round_`` is not the next round.
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
        self.round = round_
        self._offered = None
        if self.sent.all():
            return None
        scores = bid_scores(
            self.features, bid_direction(self.validation_embedding, g, summary_size)
        )
        scores[self.sent] = -np.inf
        best = int(np.argmax(scores))
        self._times_best = self._times_best + 1 if best == self._last_best else 1
        self._last_best = best
        self._offered = best
        self._offered_bid = float(scores[best])
        return OwnerBid(bid=self._offered_bid, times_best=self._times_best)

    def release(self, round_: int) -> int:
        """Mark the point bid in ``round_`` as sent and return its index.

        Raises
        ------
        FailedPreconditionError
            If ``round_`` is not the last round bid, or that round's point was already released.
        """
        if round_ != self.round or self.round == 0:
            raise FailedPreconditionError(
                f"round {round_} is not the last round bid (last bid: round {self.round})"
            )
        if self._offered is None:
            raise FailedPreconditionError(f"no unsent point was bid in round {round_}")
        index = self._offered
        self.sent[index] = True
        self._offered = None
        self._last_best = None
        self._times_best = 0
        return index

    @property
    def offered_bid(self) -> float:
        """The bid of the point offered in the last round."""
        return self._offered_bid

    def _require_validation(self) -> NDArray[np.floating]:
        if self.validation_embedding is None:
            raise FailedPreconditionError("the validation embedding has not been set")
        return self.validation_embedding

    def count_relevant(self, threshold: float) -> int:
        """Count unsent points x with ``gtilde . h1(x) >= threshold`` (candidates method).

        One float32 matrix-vector product. The count goes to the trusted curator, which adds
        Laplace noise before any use (:mod:`common.summarization.candidates`).

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
        scores = bid_scores(self.features, g.astype(np.float32))
        return int(np.count_nonzero((scores >= threshold) & ~self.sent))

    def propose_candidates(self, count: int) -> NDArray[np.int64]:
        """Choose ``count`` unsent points by a local greedy against ``gtilde``; mark them sent.

        The greedy matches the validation embedding with this owner's points alone
        (:func:`common.summarization.kernels.embedding_greedy`), so the proposal depends on nothing
        but this
        owner's data and the private embedding.

        Raises
        ------
        FailedPreconditionError
            If the validation embedding is unset.
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points.
        """
        g = self._require_validation()
        try:
            count = check_positive_int(count, "count")
            chosen = embedding_greedy(
                self.features, g, np.zeros((0, self.d)), count, exclude=self.sent
            )
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        self.sent[chosen] = True
        return chosen

    def sample_uniform(self, count: int) -> NDArray[np.int64]:
        """Mark ``count`` unsent points drawn uniformly without replacement as sent; return them.

        Raises
        ------
        InvalidArgumentError
            If ``count < 1`` or exceeds the unsent points.
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
        chosen = self.rng.choice(unsent, size=count, replace=False).astype(np.int64)
        self.sent[chosen] = True
        return chosen


class Owner:
    """A data owner: its dataset and its sessions (the papers' source / site).

    Parameters
    ----------
    owner_id : str
        Name used in reports.
    data : PointSet
        The private dataset, validated (finite, 2-D, non-empty).
    """

    def __init__(self, owner_id: str, data: PointSet) -> None:
        if not owner_id:
            raise ValueError("owner_id must be a non-empty string")
        self.owner_id = owner_id
        self.data = data
        self.sessions: dict[str, OwnerSession] = {}

    def info(self) -> OwnerInfo:
        """Describe the dataset (size, feature count, labels)."""
        return OwnerInfo(
            owner_id=self.owner_id,
            num_points=int(self.data.features.shape[0]),
            num_features=int(self.data.features.shape[1]),
            has_labels=self.data.labels is not None,
        )

    def open_session(self, session_id: str, rff: RFFParams, sampling_seed: int) -> int:
        """Compute h1 features of every point for a new session; return the number of points.

        Raises
        ------
        InvalidArgumentError
            If the session id is empty or the h1 parameters do not fit the data.
        AlreadyExistsError
            If ``session_id`` is open already.
        """
        if not session_id:
            raise InvalidArgumentError("session_id must be a non-empty string")
        if session_id in self.sessions:
            raise AlreadyExistsError(f"session {session_id!r} is already open")
        if rff.n_features != self.data.features.shape[1]:
            raise InvalidArgumentError(
                f"h1 frequencies have {rff.n_features} columns but this owner's points have "
                f"{self.data.features.shape[1]} features"
            )
        features = random_fourier_features(self.data.features, rff)
        self.sessions[session_id] = OwnerSession(features, np.random.default_rng(sampling_seed))
        return int(features.shape[0])

    def session(self, session_id: str) -> OwnerSession:
        """Return an open session.

        Raises
        ------
        NotFoundError
            If no session has that id.
        """
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFoundError(f"unknown session {session_id!r}") from None

    def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """Release the point bid in ``round_`` because the auction asked for it (steps 12-14)."""
        session = self.session(session_id)
        index = session.release(round_)
        return ReleasedPoint(
            point=self.data.features[index].copy(),
            label=None if self.data.labels is None else int(self.data.labels[index]),
            bid=session.offered_bid,
        )

    def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` uniformly drawn unsent points and their labels (uniform baseline)."""
        return self._points(self.session(session_id).sample_uniform(count))

    def propose_candidates(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Release ``count`` candidates chosen by the local greedy (candidates method)."""
        return self._points(self.session(session_id).propose_candidates(count))

    def _points(
        self, index: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        labels = None if self.data.labels is None else self.data.labels[index].copy()
        return self.data.features[index].copy(), labels

    def close_session(self, session_id: str) -> None:
        """Forget a session.

        Raises
        ------
        NotFoundError
            If no session has that id.
        """
        self.session(session_id)
        del self.sessions[session_id]
