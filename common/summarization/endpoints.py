"""What the curator needs from an owner, independent of transport.

The curator's protocol logic talks to :class:`OwnerEndpoint` objects: an in-process adapter around
an ``dpmarket.owner.protocol.Owner`` (``dpmarket.owner.local``) or a gRPC client
(``dpmarket.curator.owners``). Both raise the errors of :mod:`dpmarket.common.errors`; a transport
failure is :class:`dpmarket.common.errors.UnavailableError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.terms import FREE
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.summarization.hashes import HashAdvert
from dpmarket.common.summarization.rff import RFFParams

if TYPE_CHECKING:
    from dpmarket.common.summarization.terms import OwnerAccess, OwnerTerms


@dataclass(frozen=True)
class OwnerInfo:
    """Public description of an owner's dataset.

    Attributes
    ----------
    owner_id : str
    num_points, num_features : int
    has_labels : bool
    schema : Schema or None
        The public schema the owner checked its table against when it started (its features
        are the schema's columns but the label); ``None`` when it declared none.
    prices : OwnerPrices
        The owner's published prices (its policy's ``[prices]``); default free.
    access : OwnerAccess or None
        What the owner's policy lets a session's method ask of it (the flags of its
        ``[access]`` the owner checks at OpenSession, :mod:`dpmarket.owner.terms`); None when
        the owner does not say (an owner without a ledger, or of an older version).
    """

    owner_id: str
    num_points: int
    num_features: int
    has_labels: bool
    schema: Schema | None = None
    prices: OwnerPrices = FREE
    access: OwnerAccess | None = None


@dataclass(frozen=True)
class OwnerBid:
    """An owner's bid in one round (Algorithm 3, step 6).

    Attributes
    ----------
    bid : float
        Score of the owner's best unsent point.
    times_best : int
        Consecutive rounds this point has been the owner's best, this round included; PrivAuction
        asks for it once this reaches tau (step 14).
    """

    bid: float
    times_best: int


@dataclass(frozen=True)
class ReleasedPoint:
    """A raw point released to the curator.

    Attributes
    ----------
    point : ndarray of shape (n_features,), float64
    label : int or None
    bid : float
        The bid the owner reported for this point.
    """

    point: NDArray[np.float64]
    label: int | None
    bid: float


class OwnerEndpoint(Protocol):
    """Asynchronous view of one owner, as the curator uses it (see
    ``dpmarket.owner.protocol.Owner``)."""

    @property
    def name(self) -> str:
        """Address or name used in logs before the owner id is known."""
        ...

    async def info(self) -> OwnerInfo:
        """Describe the owner's dataset."""
        ...

    async def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        consumer: str,
        terms: OwnerTerms,
    ) -> tuple[int, int]:
        """Offer the session's terms and send the h1 parameters; return the owner's number of
        points and the most raw points the session may receive from it."""
        ...

    async def set_validation_embedding(
        self,
        session_id: str,
        embedding: NDArray[np.float64],
        *,
        shrinkage_sigma: float = 0.0,
        prior_embedding: NDArray[np.float64] | None = None,
        score_metric: bool = False,
    ) -> None:
        """Broadcast the validation embedding gtilde, with its noise per coordinate when the
        owner's candidate proposal should shrink it towards the owner's own mean h1 or the
        public ``prior_embedding``, whichever it lies nearer to (0: no shrinkage); with
        ``score_metric``, by the amount read in the metric of the owner's own scores."""
        ...

    async def bid(
        self, session_id: str, round_: int, summary_embedding: NDArray[np.float64], q: int
    ) -> OwnerBid | None:
        """Collect the owner's bid for a round, or None when it has no unsent point."""
        ...

    async def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """Ask for the point bid in ``round_``."""
        ...

    async def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Ask for ``count`` uniformly drawn unsent points."""
        ...

    async def count_relevant(self, session_id: str, threshold: float) -> float:
        """The owner's count of unsent points scoring at least ``threshold`` against gtilde, plus
        the Laplace noise the owner adds itself."""
        ...

    async def propose_candidates(
        self, session_id: str, count: int, *, uniform_count: int = 0
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """Ask for ``count`` candidates: the first ``uniform_count`` a uniform sample, the rest
        chosen by the owner's local greedy continuing from them."""
        ...

    async def close_session(self, session_id: str) -> SessionSpend:
        """Let the owner forget the session; return what its ledger recorded for it."""
        ...

    async def hash_advertise(self, session_id: str) -> HashAdvert:
        """The hashes mode: the owner's signed key for the session's secret
        (:mod:`dpmarket.common.summarization.hashes`)."""
        ...

    async def hash_distribute(
        self, session_id: str, adverts: Mapping[str, HashAdvert]
    ) -> dict[str, tuple[bytes, bytes]]:
        """The hashes mode, at the leader: the secret encrypted to every other owner."""
        ...

    async def hash_receive(
        self, session_id: str, adverts: Mapping[str, HashAdvert], envelope: tuple[bytes, bytes]
    ) -> str:
        """The hashes mode: the owner decrypts the leader's envelope; the secret's public id."""
        ...

    async def propose_hashes(
        self, session_id: str, count: int, gamma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """The hashes mode: ``count`` proposals as h1 hashes under the owners' secret map."""
        ...
