"""Proto <-> numpy conversion for the curator: its own API and the owner client's responses."""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import duration_pb2, timestamp_pb2
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from dpmarket.common.summarization.methods import (
    PARAMETER_NAMES,
    SummarizationConfig,
    check_field,
    config_from_fields,
)
from dpmarket.common.summarization.summary import (
    OwnerSelection,
    ProgressEvent,
    SessionReport,
    SessionRequest,
    SummaryResult,
)
from dpmarket.common.summarization.terms import OwnerAccess
from dpmarket.common.texts import peer_text
from dpmarket.runtime.arrays import array_from_proto, array_to_proto, labeled_points_from_proto
from dpmarket.runtime.identity import NAME_PATTERN, Identity
from dpmarket.runtime.market import prices_from_proto, quote_to_proto, reward_from_proto
from dpmarket.runtime.schemas import schema_from_proto

if TYPE_CHECKING:
    from dpmarket.common.summarization.terms import MethodOffer
    from dpmarket.curator.store import StoredStatement
from dpmarket.v1 import curator_pb2, market_pb2, owner_pb2, privacy_pb2

logger = logging.getLogger(__name__)


def spend_from_proto(message: privacy_pb2.SessionSpend) -> SessionSpend:
    """SessionSpend message -> SessionSpend."""
    return SessionSpend(
        epsilon=float(message.epsilon),
        delta=float(message.delta),
        points=int(message.points),
        non_private=bool(message.non_private),
    )


def info_from_proto(
    message: owner_pb2.GetOwnerInfoResponse, owner: str, expected: Identity | None = None
) -> OwnerInfo:
    """GetOwnerInfoResponse -> OwnerInfo.

    Parameters
    ----------
    message : GetOwnerInfoResponse
        The owner's answer.
    owner : str
        The name the curator knows the owner by (its configured name): every error names it,
        and no error carries a text of the answer.
    expected : Identity, optional
        The owner's certificate identity (mTLS): the answer's ``owner_id`` must be its name.

    Raises
    ------
    FailedPreconditionError
        If the answer's ``owner_id`` is not a name (:data:`~dpmarket.runtime.identity.NAME_PATTERN`,
        a DNS label of at most 63 characters), or not ``expected``'s name: the owner is
        misconfigured, or lies.
    InvalidArgumentError
        If the owner's schema is malformed or its fingerprint is not its columns' (the message
        says which owner; the curator's log says what, as one line of at most
        :data:`~dpmarket.common.texts.PEER_TEXT_CHARS` characters).
        A negative price.
    """
    who = f"owner {owner}"
    owner_id = message.owner_id
    if NAME_PATTERN.fullmatch(owner_id) is None:
        raise FailedPreconditionError(
            f"{who} answered GetOwnerInfo with an owner id that is not a name (a DNS label: at "
            "most 63 letters, digits and hyphens); its operator must fix its --owner-id"
        )
    if expected is not None and owner_id != expected.name:
        raise FailedPreconditionError(
            f"{who} answered GetOwnerInfo with an owner id other than its certificate's name "
            f"({expected.name}); its operator must serve it under that name"
        )
    return OwnerInfo(
        owner_id=owner_id,
        num_points=int(message.num_points),
        num_features=int(message.num_features),
        has_labels=bool(message.has_labels),
        schema=_owner_schema(message, who),
        prices=prices_from_proto(message.prices, owner),
        access=OwnerAccess(
            allow_exact_bids=message.access.allow_exact_bids,
            allow_steered_selection=message.access.allow_steered_selection,
            allow_non_private=message.access.allow_non_private,
            allow_reward_disclosure=message.access.allow_reward_disclosure,
        )
        if message.HasField("access")
        else None,
    )


def _owner_schema(message: owner_pb2.GetOwnerInfoResponse, who: str) -> Schema | None:
    """The owner's schema, or InvalidArgumentError naming ``who`` alone: what is malformed (a
    column name, a label, strings the owner chose) goes to the curator's log, not to the
    consumer the error may reach."""
    try:
        return schema_from_proto(message.schema, who)
    except InvalidArgumentError as exc:
        logger.warning("%s: %s", who, peer_text(str(exc)))  # the owner's strings: one line
        raise InvalidArgumentError(
            f"the schema {who} published (GetOwnerInfo) is malformed; the curator's log says "
            "how, and its operator must fix it"
        ) from None


def bid_from_proto(message: owner_pb2.BidResponse) -> OwnerBid | None:
    """BidResponse -> OwnerBid or None."""
    if not message.has_bid:
        return None
    return OwnerBid(bid=float(message.bid), times_best=int(message.times_best))


def released_from_proto(message: owner_pb2.ReleasePointResponse) -> ReleasedPoint:
    """ReleasePointResponse -> ReleasedPoint; raise InvalidArgumentError when malformed."""
    try:
        point = array_from_proto(message.point, "point", ndim=2, dtype=np.float64)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    if point.shape[0] != 1:
        raise InvalidArgumentError(f"a released point must have shape (1, n), got {point.shape}")
    label = int(message.label) if message.HasField("label") else None
    return ReleasedPoint(point=point[0], label=label, bid=float(message.bid))


def points_from_proto(
    message: owner_pb2.SampleUniformResponse | owner_pb2.ProposeCandidatesResponse,
) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """SampleUniform or ProposeCandidates response -> (points, labels or None)."""
    try:
        return labeled_points_from_proto(
            message.points, message.labels if message.HasField("labels") else None, "points"
        )
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


# ----------------------------------------------------------------- the curator's own API
_METHODS = {
    curator_pb2.METHOD_PRIVATE: "private",
    curator_pb2.METHOD_GREEDY: "greedy",
    curator_pb2.METHOD_UNIFORM: "uniform",
    curator_pb2.METHOD_CANDIDATES: "candidates",
    curator_pb2.METHOD_ROUNDS: "rounds",
}
_METHOD_TO_PROTO = {v: k for k, v in _METHODS.items()}
#: The rounds method's proto enums and their string options (UNSPECIFIED = the default).
_ENUM_PARAMS: dict[str, dict[int, str]] = {
    "validation_release": {
        curator_pb2.VALIDATION_RELEASE_MWEM: "mwem",
        curator_pb2.VALIDATION_RELEASE_GAUSSIAN: "gaussian",
    },
    "summary_release": {
        curator_pb2.SUMMARY_RELEASE_MWEM: "mwem",
        curator_pb2.SUMMARY_RELEASE_TREE: "tree",
        curator_pb2.SUMMARY_RELEASE_NONE: "none",
    },
    "pool_scoring": {
        curator_pb2.POOL_SCORING_EMBEDDING: "embedding",
        curator_pb2.POOL_SCORING_EXACT: "exact",
    },
    "auction": {
        curator_pb2.AUCTION_PURE: "pure",
        curator_pb2.AUCTION_PAPER: "paper",
    },
    "allocation": {
        curator_pb2.ALLOCATION_SKETCH: "sketch",
        curator_pb2.ALLOCATION_COUNTS: "counts",
    },
    "relevance_score": {
        curator_pb2.RELEVANCE_SCORE_DENSITY: "density",
        curator_pb2.RELEVANCE_SCORE_MASS: "mass",
        curator_pb2.RELEVANCE_SCORE_M2M: "m2m",
        curator_pb2.RELEVANCE_SCORE_MMD: "mmd",
        curator_pb2.RELEVANCE_SCORE_SHARE: "share",
    },
    "embedding_prior": {
        curator_pb2.EMBEDDING_PRIOR_OWNER: "owner",
        curator_pb2.EMBEDDING_PRIOR_SEED: "seed",
        curator_pb2.EMBEDDING_PRIOR_NONE: "none",
    },
    "shrinkage_metric": {
        curator_pb2.SHRINKAGE_METRIC_EMBEDDING: "embedding",
        curator_pb2.SHRINKAGE_METRIC_SCORES: "scores",
    },
    "shrinkage_strength": {
        curator_pb2.SHRINKAGE_STRENGTH_FIXED: "fixed",
        curator_pb2.SHRINKAGE_STRENGTH_SNR: "snr",
        curator_pb2.SHRINKAGE_STRENGTH_SHARE: "share",
    },
}
_STAGES = {
    "setup": curator_pb2.STAGE_SETUP,
    "rounds": curator_pb2.STAGE_ROUNDS,
    "done": curator_pb2.STAGE_DONE,
    "failed": curator_pb2.STAGE_FAILED,
}


def create_request_from_proto(request: curator_pb2.CreateSessionRequest) -> SessionRequest:
    """CreateSessionRequest -> SessionRequest.

    The method's configuration (:mod:`dpmarket.common.summarization.methods`) takes the fields
    the method reads; zero-valued ones take their documented defaults. Every other parameter
    the request sets (the wire carries every method's) is checked as its own method checks it
    and kept in ``unread``, for the curator's policy to bound; the session ignores it.

    Raises
    ------
    InvalidArgumentError
        For an unknown method, malformed arrays, out-of-range parameters, a negative
        ``min_owners``, a repeated or empty excluded name, a malformed schema, a negative
        ``max_cost`` or a malformed reward.
    """
    method = _METHODS.get(request.method)
    if method is None:
        raise InvalidArgumentError(
            f"method must be PRIVATE, GREEDY, UNIFORM, CANDIDATES or ROUNDS, got {request.method}"
        )
    try:
        validation = array_from_proto(request.validation, "validation", ndim=2, dtype=np.float64)
        seed_set = None
        if request.HasField("seed_set"):
            seed_set = array_from_proto(request.seed_set, "seed_set", ndim=2, dtype=np.float64)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    config, unread = _config_from_proto(method, request.summary_size, request.params)
    try:
        selection = OwnerSelection(int(request.min_owners), tuple(request.exclude_owners))
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    max_cost = int(request.max_cost) if request.HasField("max_cost") else None
    if max_cost is not None and max_cost < 0:
        raise InvalidArgumentError(f"max_cost must be >= 0 micro-credits, got {max_cost}")
    return SessionRequest(
        config=config,
        validation=validation,
        seed_set=seed_set,
        seed=int(request.seed) if request.HasField("seed") else None,
        selection=selection,
        schema=schema_from_proto(request.schema, "the consumer"),
        feature_names=tuple(request.feature_names),
        unread=unread,
        max_cost=max_cost,
        reward=reward_from_proto(request.reward),
    )


def _config_from_proto(
    method: str, summary_size: int, params: curator_pb2.SummarizationParams
) -> tuple[SummarizationConfig, dict[str, Any]]:
    """A method, p and the SummarizationParams message -> (the method's configuration, the
    parameters of other methods the message carried).

    Raises
    ------
    InvalidArgumentError
        For an out-of-range parameter (of any method).
    """
    values = {name: getattr(params, name) for name in PARAMETER_NAMES if getattr(params, name) != 0}
    try:
        for name, table in _ENUM_PARAMS.items():
            if name in values:
                if values[name] not in table:
                    raise ValueError(f"{name} must be one of {sorted(table)}, got {values[name]}")
                values[name] = table[values[name]]
        for name, value in values.items():
            check_field(name, value)
        config = config_from_fields(method, {"summary_size": int(summary_size), **values})
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    read = {f.name for f in fields(config)}
    return config, {k: v for k, v in values.items() if k not in read}


def event_to_proto(
    event: ProgressEvent, report: SessionReport | None = None
) -> curator_pb2.WatchSessionResponse:
    """ProgressEvent (and, on the last message, the session's report) -> WatchSessionResponse."""
    message = curator_pb2.WatchSessionResponse(
        stage=_STAGES[event.stage],
        round=event.round,
        total_rounds=event.total_rounds,
        points_accessed=event.points_accessed,
        message=event.message,
        finished=event.finished,
    )
    if report is not None:
        message.report.CopyFrom(report_to_proto(report))
    return message


def report_to_proto(r: SessionReport) -> curator_pb2.SessionReport:
    """SessionReport -> SessionReport message (the ledger as JSON)."""
    wall_time = duration_pb2.Duration()
    wall_time.FromTimedelta(datetime.timedelta(seconds=r.wall_time_seconds))
    return curator_pb2.SessionReport(
        method=_METHOD_TO_PROTO[r.method],
        summary_size=r.summary_size,
        rounds=r.rounds,
        owner_points_accessed=r.owner_points_accessed,
        validation_points_accessed=r.validation_points_accessed,
        all_owners_bound=r.all_owners_bound,
        paper_bound=r.paper_bound,
        dropped_owners=list(r.dropped_owners),
        ledger_json=json.dumps(r.ledger.to_json(), sort_keys=True),
        wall_time=wall_time,
        rejected_points=r.rejected_points,
        round_seconds=list(r.round_seconds),
        error=r.error,
        owner_spend=[
            curator_pb2.OwnerSpend(
                owner_id=owner,
                epsilon=spend.epsilon,
                delta=spend.delta,
                points=spend.points,
                non_private=spend.non_private,
                unknown=spend.unknown,
            )
            for owner, spend in sorted(r.owner_spend.items())
        ],
        left_out=[
            curator_pb2.LeftOutOwner(owner_id=owner, reason=reason)
            for owner, reason in r.left_out.items()
        ],
        quote=None if r.quote is None else quote_to_proto(r.quote),
        cost=r.cost,
    )


def result_to_proto(result: SummaryResult) -> curator_pb2.GetSummaryResponse:
    """SummaryResult -> GetSummaryResponse."""
    response = curator_pb2.GetSummaryResponse(
        summary=array_to_proto(result.points),
        owner_ids=list(result.owner_ids),
        report=report_to_proto(result.report),
    )
    if result.labels is not None:
        response.labels.CopyFrom(array_to_proto(result.labels))
    return response


def statement_to_proto(stored: StoredStatement) -> curator_pb2.ConsumerStatement:
    """A stored statement -> ConsumerStatement."""
    settled = timestamp_pb2.Timestamp()
    settled.FromNanoseconds(int(stored.settled_at * 1e9))
    return curator_pb2.ConsumerStatement(
        session_id=stored.session,
        settled_at=settled,
        statement=market_pb2.SignedStatement(statement=stored.data, signature=stored.signature),
        owners_recorded=stored.owners_recorded,
    )


def method_offer_to_proto(offer: MethodOffer) -> curator_pb2.MethodOffer:
    """MethodOffer -> MethodOffer message."""
    return curator_pb2.MethodOffer(
        method=_METHOD_TO_PROTO[offer.method],
        served=offer.served,
        reason=offer.reason,
        serving_owners=list(offer.serving),
        refusing_owners=list(offer.refusing),
    )
