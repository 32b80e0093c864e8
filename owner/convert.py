"""Proto <-> numpy conversion for the owner service (the only place the owner touches messages)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from dpmarket.common.summarization.rff import FeatureScaling, RFFParams
from dpmarket.runtime.arrays import array_from_proto, array_to_proto
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.market import prices_to_proto
from dpmarket.runtime.schemas import schema_to_proto
from dpmarket.v1 import array_pb2, cape_pb2, owner_pb2, privacy_pb2

PointsResponse = TypeVar(
    "PointsResponse", owner_pb2.SampleUniformResponse, owner_pb2.ProposeCandidatesResponse
)


def rff_from_proto(
    omega: array_pb2.Array,
    phase: array_pb2.Array,
    gamma: float,
    scaling: owner_pb2.FeatureScaling | None = None,
) -> RFFParams:
    """Build h1 parameters from the wire (``scaling`` None or unset: no feature scaling).

    Raises
    ------
    InvalidArgumentError
        If the arrays are malformed, inconsistent or not finite, or the scaling's bounds are
        not finite with ``low < high`` for every feature of ``omega``.
    """
    try:
        feature_scaling = None
        if scaling is not None:
            feature_scaling = FeatureScaling(
                low=array_from_proto(scaling.low, "scaling low", ndim=1, dtype=np.float64),
                high=array_from_proto(scaling.high, "scaling high", ndim=1, dtype=np.float64),
            )
        return RFFParams(
            omega=array_from_proto(omega, "omega", ndim=2, dtype=np.float64),
            phase=array_from_proto(phase, "phase", ndim=1, dtype=np.float64),
            gamma=gamma,
            scaling=feature_scaling,
        )
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


def vector_from_proto(message: array_pb2.Array, name: str) -> NDArray[np.float64]:
    """Unpack a 1-D float vector; raise InvalidArgumentError when malformed."""
    try:
        return array_from_proto(message, name, ndim=1, dtype=np.float64)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


def info_to_proto(info: OwnerInfo) -> owner_pb2.GetOwnerInfoResponse:
    """OwnerInfo -> GetOwnerInfoResponse."""
    return owner_pb2.GetOwnerInfoResponse(
        owner_id=info.owner_id,
        num_points=info.num_points,
        num_features=info.num_features,
        has_labels=info.has_labels,
        schema=None if info.schema is None else schema_to_proto(info.schema),
        prices=prices_to_proto(info.prices),
        access=None
        if info.access is None
        else owner_pb2.OwnerAccess(
            allow_exact_bids=info.access.allow_exact_bids,
            allow_steered_selection=info.access.allow_steered_selection,
            allow_non_private=info.access.allow_non_private,
            allow_reward_disclosure=info.access.allow_reward_disclosure,
        ),
    )


def bid_to_proto(bid: OwnerBid | None) -> owner_pb2.BidResponse:
    """OwnerBid (or None: no unsent point) -> BidResponse."""
    if bid is None:
        return owner_pb2.BidResponse(has_bid=False)
    return owner_pb2.BidResponse(has_bid=True, bid=bid.bid, times_best=bid.times_best)


def released_to_proto(released: ReleasedPoint) -> owner_pb2.ReleasePointResponse:
    """ReleasedPoint -> ReleasePointResponse (point as a (1, n) float64 array)."""
    response = owner_pb2.ReleasePointResponse(
        point=array_to_proto(released.point.reshape(1, -1)), bid=released.bid
    )
    if released.label is not None:
        response.label = released.label
    return response


def points_to_proto(
    points: NDArray[np.float64],
    labels: NDArray[np.int64] | None,
    response_type: type[PointsResponse],
) -> PointsResponse:
    """Points (n, n_features) and labels (n,) -> a SampleUniform or ProposeCandidates response."""
    response = response_type(points=array_to_proto(points))
    if labels is not None:
        response.labels.CopyFrom(array_to_proto(labels.astype(np.int64)))
    return response


def consumer_from_proto(text: str) -> str:
    """The consumer identity of OpenSession, checked to be ``"consumer:NAME"``.

    Raises
    ------
    InvalidArgumentError
        If it is not a consumer identity.
    """
    try:
        identity = Identity.parse(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"consumer: {exc}") from exc
    if identity.role != "consumer":
        raise InvalidArgumentError(f"consumer must be a consumer identity, got {text!r}")
    return str(identity)


def spend_to_proto(spend: SessionSpend) -> privacy_pb2.SessionSpend:
    """SessionSpend -> SessionSpend message."""
    return privacy_pb2.SessionSpend(
        epsilon=spend.epsilon,
        delta=spend.delta,
        points=spend.points,
        non_private=spend.non_private,
    )


def presented_receipt(
    request: owner_pb2.OpenSessionRequest | cape_pb2.OpenCapeJobRequest,
) -> privacy_pb2.LedgerReceipt | None:
    """The ledger receipt an OpenSession or OpenCapeJob request presents, or None."""
    return request.ledger_receipt if request.HasField("ledger_receipt") else None
