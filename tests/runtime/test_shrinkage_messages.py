"""The owner's shrinkage metric on the wire (SetValidationEmbeddingRequest.shrinkage_metric)."""

from __future__ import annotations

import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.summarization.candidates import SHRINKAGE_METRICS
from dpmarket.runtime.shrinkage import shrinkage_metric_from_proto, shrinkage_metric_to_proto
from dpmarket.v1 import owner_pb2


@pytest.mark.parametrize("metric", SHRINKAGE_METRICS)
def test_every_metric_crosses_the_wire_unchanged(metric) -> None:
    request = owner_pb2.SetValidationEmbeddingRequest(
        shrinkage_metric=shrinkage_metric_to_proto(metric)
    )
    decoded = owner_pb2.SetValidationEmbeddingRequest.FromString(request.SerializeToString())
    assert shrinkage_metric_from_proto(decoded.shrinkage_metric) == metric


def test_the_default_is_the_embedding_and_an_unknown_value_is_refused() -> None:
    """An unset field (and the earlier bool's false) reads "embedding", its true (1) "scores";
    a value this owner does not know is INVALID_ARGUMENT, naming it, not a silent default."""
    assert shrinkage_metric_from_proto(
        owner_pb2.SetValidationEmbeddingRequest().shrinkage_metric
    ) == ("embedding")
    assert shrinkage_metric_from_proto(1) == "scores"
    with pytest.raises(InvalidArgumentError, match="shrinkage_metric 7"):
        shrinkage_metric_from_proto(7)
    with pytest.raises(ValueError, match="one of"):
        shrinkage_metric_to_proto("both")  # type: ignore[arg-type]
