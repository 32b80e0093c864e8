"""Where an owner reads its shrinkage's amount, on the wire: ``OwnerShrinkageMetric`` <->
:data:`~dpmarket.common.summarization.candidates.ShrinkageMetric`.

The curator sends it with the validation embedding (:func:`shrinkage_metric_to_proto`), each
owner reads it (:func:`shrinkage_metric_from_proto`); one mapping serves both.
"""

from __future__ import annotations

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.summarization.candidates import SHRINKAGE_METRICS, ShrinkageMetric
from dpmarket.v1 import owner_pb2

__all__ = ["shrinkage_metric_from_proto", "shrinkage_metric_to_proto"]

_TO_PROTO: dict[ShrinkageMetric, owner_pb2.OwnerShrinkageMetric.ValueType] = {
    "embedding": owner_pb2.OWNER_SHRINKAGE_METRIC_UNSPECIFIED,
    "scores": owner_pb2.OWNER_SHRINKAGE_METRIC_SCORES,
    "auto": owner_pb2.OWNER_SHRINKAGE_METRIC_AUTO,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}
assert set(_TO_PROTO) == set(SHRINKAGE_METRICS)


def shrinkage_metric_to_proto(metric: ShrinkageMetric) -> owner_pb2.OwnerShrinkageMetric.ValueType:
    """``"embedding"``, ``"scores"`` or ``"auto"`` -> its ``OwnerShrinkageMetric`` value.

    Raises
    ------
    ValueError
        If ``metric`` is not one of the three.
    """
    if metric not in _TO_PROTO:
        raise ValueError(f"shrinkage metric must be one of {SHRINKAGE_METRICS}, got {metric!r}")
    return _TO_PROTO[metric]


def shrinkage_metric_from_proto(value: int) -> ShrinkageMetric:
    """An ``OwnerShrinkageMetric`` value -> ``"embedding"``, ``"scores"`` or ``"auto"``.

    Raises
    ------
    InvalidArgumentError
        If ``value`` is not a known ``OwnerShrinkageMetric`` (a newer curator's value).
    """
    try:
        return _FROM_PROTO[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgumentError(
            f"shrinkage_metric {value} is not a known OwnerShrinkageMetric "
            f"(known: {sorted(_FROM_PROTO)}); send one of them"
        ) from None
