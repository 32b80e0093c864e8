"""Proto <-> numpy conversion for the consumer's side of the curator API."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.terms import NO_REWARD, RewardOffer
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.methods import SummarizationConfig
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import (
    OwnerSelection,
    ProgressEvent,
    SessionReport,
    SessionStage,
    SummaryResult,
)
from dpmarket.common.summarization.terms import MethodOffer
from dpmarket.common.texts import peer_text
from dpmarket.runtime.arrays import array_to_proto, labeled_points_from_proto
from dpmarket.runtime.market import quote_from_proto, reward_to_proto
from dpmarket.v1 import curator_pb2

#: Characters of the curator's text (an error's details, a progress message) the consumer keeps,
#: control characters escaped (:func:`dpmarket.common.texts.peer_text`): more than an owner's
#: 500, since one of the curator's messages may quote several owners' refusals.
CURATOR_TEXT_CHARS = 2000

_METHODS = {
    "private": curator_pb2.METHOD_PRIVATE,
    "greedy": curator_pb2.METHOD_GREEDY,
    "uniform": curator_pb2.METHOD_UNIFORM,
    "candidates": curator_pb2.METHOD_CANDIDATES,
    "rounds": curator_pb2.METHOD_ROUNDS,
}
_METHOD_NAMES = {v: k for k, v in _METHODS.items()}
#: The rounds method's string options and their proto enums.
_ENUM_PARAMS: dict[str, dict[str, int]] = {
    "validation_release": {
        "mwem": curator_pb2.VALIDATION_RELEASE_MWEM,
        "gaussian": curator_pb2.VALIDATION_RELEASE_GAUSSIAN,
    },
    "summary_release": {
        "mwem": curator_pb2.SUMMARY_RELEASE_MWEM,
        "tree": curator_pb2.SUMMARY_RELEASE_TREE,
        "none": curator_pb2.SUMMARY_RELEASE_NONE,
    },
    "pool_scoring": {
        "embedding": curator_pb2.POOL_SCORING_EMBEDDING,
        "exact": curator_pb2.POOL_SCORING_EXACT,
    },
    "auction": {
        "pure": curator_pb2.AUCTION_PURE,
        "paper": curator_pb2.AUCTION_PAPER,
    },
    "allocation": {
        "sketch": curator_pb2.ALLOCATION_SKETCH,
        "counts": curator_pb2.ALLOCATION_COUNTS,
    },
    "relevance_score": {
        "density": curator_pb2.RELEVANCE_SCORE_DENSITY,
        "mass": curator_pb2.RELEVANCE_SCORE_MASS,
        "m2m": curator_pb2.RELEVANCE_SCORE_M2M,
        "mmd": curator_pb2.RELEVANCE_SCORE_MMD,
        "share": curator_pb2.RELEVANCE_SCORE_SHARE,
    },
    "embedding_prior": {
        "owner": curator_pb2.EMBEDDING_PRIOR_OWNER,
        "seed": curator_pb2.EMBEDDING_PRIOR_SEED,
        "none": curator_pb2.EMBEDDING_PRIOR_NONE,
    },
    "shrinkage_metric": {
        "embedding": curator_pb2.SHRINKAGE_METRIC_EMBEDDING,
        "scores": curator_pb2.SHRINKAGE_METRIC_SCORES,
    },
    "shrinkage_strength": {
        "fixed": curator_pb2.SHRINKAGE_STRENGTH_FIXED,
        "snr": curator_pb2.SHRINKAGE_STRENGTH_SNR,
        "share": curator_pb2.SHRINKAGE_STRENGTH_SHARE,
    },
}
_STAGES: dict[int, SessionStage] = {
    curator_pb2.STAGE_SETUP: "setup",
    curator_pb2.STAGE_ROUNDS: "rounds",
    curator_pb2.STAGE_DONE: "done",
    curator_pb2.STAGE_FAILED: "failed",
}


def create_request_to_proto(
    config: SummarizationConfig,
    validation: NDArray[np.float64],
    seed_set: NDArray[np.float64],
    seed: int | None,
    request_id: str = "",
    selection: OwnerSelection | None = None,
    *,
    max_cost: int | None = None,
    reward: RewardOffer = NO_REWARD,
) -> curator_pb2.CreateSessionRequest:
    """Build a CreateSessionRequest; every parameter the method reads is sent explicitly (the
    others are left unset). ``max_cost`` (micro-credits; None: no cap) and ``reward`` are the
    request's market terms.

    Raises
    ------
    ValueError
        If ``config`` is the hashes mode, which no RPC carries in this release.
    """
    if config.name not in _METHODS:
        raise ValueError(f"the {config.name} mode runs in process only: no RPC carries it")
    selection = selection if selection is not None else OwnerSelection()
    values = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "summary_size"}
    for name, table in _ENUM_PARAMS.items():
        if name in values:
            values[name] = table[values[name]]
    params = curator_pb2.SummarizationParams(**values)
    request = curator_pb2.CreateSessionRequest(
        validation=array_to_proto(np.asarray(validation, dtype=np.float64)),
        seed_set=array_to_proto(np.asarray(seed_set, dtype=np.float64)),
        summary_size=config.summary_size,
        method=_METHODS[config.name],
        params=params,
        request_id=request_id,
        min_owners=selection.min_owners,
        exclude_owners=list(selection.exclude),
    )
    if seed is not None:
        request.seed = seed
    if max_cost is not None:
        request.max_cost = max_cost
    if reward != NO_REWARD:
        request.reward.CopyFrom(reward_to_proto(reward))
    return request


def event_from_proto(message: curator_pb2.WatchSessionResponse) -> ProgressEvent:
    """WatchSessionResponse -> ProgressEvent; its message is the curator's text, kept as one
    line of at most 2,000 characters (:data:`CURATOR_TEXT_CHARS`)."""
    return ProgressEvent(
        stage=_STAGES.get(message.stage, "rounds"),
        round=int(message.round),
        total_rounds=int(message.total_rounds),
        points_accessed=int(message.points_accessed),
        message=peer_text(message.message, CURATOR_TEXT_CHARS),
    )


def report_from_proto(r: curator_pb2.SessionReport) -> SessionReport:
    """SessionReport message -> SessionReport."""
    return SessionReport(
        method=_METHOD_NAMES.get(r.method, "candidates"),  # type: ignore[arg-type]
        summary_size=int(r.summary_size),
        rounds=int(r.rounds),
        owner_points_accessed=int(r.owner_points_accessed),
        validation_points_accessed=int(r.validation_points_accessed),
        all_owners_bound=int(r.all_owners_bound),
        paper_bound=float(r.paper_bound),
        dropped_owners=tuple(r.dropped_owners),
        ledger=SessionLedger.from_json(json.loads(r.ledger_json) if r.ledger_json else {}),
        wall_time_seconds=r.wall_time.ToTimedelta().total_seconds(),
        rejected_points=int(r.rejected_points),
        round_seconds=tuple(r.round_seconds),
        error=r.error,
        owner_spend={
            o.owner_id: SessionSpend(
                epsilon=float(o.epsilon),
                delta=float(o.delta),
                points=int(o.points),
                non_private=bool(o.non_private),
                unknown=o.unknown,
            )
            for o in r.owner_spend
        },
        left_out={o.owner_id: o.reason for o in r.left_out},
        quote=quote_from_proto(r.quote) if r.HasField("quote") else None,
        cost=int(r.cost) if r.HasField("cost") else None,
    )


def result_from_proto(message: curator_pb2.GetSummaryResponse) -> SummaryResult:
    """GetSummaryResponse -> SummaryResult.

    Raises
    ------
    InvalidArgumentError
        If the arrays are malformed.
    """
    try:
        points, labels = labeled_points_from_proto(
            message.summary, message.labels if message.HasField("labels") else None, "summary"
        )
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    return SummaryResult(
        points=points,
        labels=labels,
        owner_ids=tuple(message.owner_ids),
        report=report_from_proto(message.report),
    )


def method_offer_from_proto(message: curator_pb2.MethodOffer) -> MethodOffer:
    """MethodOffer message -> MethodOffer (an unknown method enum: ``"unknown"``)."""
    return MethodOffer(
        method=_METHOD_NAMES.get(message.method, "unknown"),
        served=bool(message.served),
        reason=message.reason,
        serving=tuple(message.serving_owners),
        refusing=tuple(message.refusing_owners),
    )
