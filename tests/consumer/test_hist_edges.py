"""A histogram's answers at a column's declared bounds (issue 28, a stranger's D1 and D4).

Deterministic given the seeds: one release of a small table, answered in process.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.spec import SketchDeclaration
from dpmarket.consumer.explore import Explorer, Query, exact_answer
from tests.conftest import sketch_mechanism

#: ``a`` in [0, 10] in five bins of width 2 (edges 0, 2, 4, 6, 8, 10).
FIVE_BINS = SketchDeclaration.from_mapping(
    {
        "name": "five",
        "mechanism": {"epsilon": 1.0, "epsilon_range": [1.0, 100.0]},
        "columns": [{"name": "a", "low": 0, "high": 10}, {"name": "b", "low": 0, "high": 10}],
        "maps": {"hist": {"bins": 5}},
    }
)


def _answers(*queries: Query) -> list[tuple[list[dict[str, Any]], list[float]]]:
    """Each query's answer rows and exact values over 300 records, 30 % of them at ``a = 0``
    (the column's declared lower bound), the rest uniform on [0, 10]."""
    spec = next(iter(FIVE_BINS.draw(np.random.default_rng(0))))
    rng = np.random.default_rng(1)
    a = np.where(rng.uniform(size=300) < 0.3, 0.0, rng.uniform(0.0, 10.0, 300))
    records = np.column_stack([a, rng.uniform(0.0, 10.0, 300)])
    sketch = sketch_mechanism(spec, 1.0).release(records, SeededNoise(np.random.default_rng(0)))
    explorer = Explorer(spec, n_synthetic=200, seed=0)
    return [
        (
            explorer.answer(q, sketch, replicates=200).rows(),
            exact_answer(q, records, spec.domain).values.tolist(),
        )
        for q in queries
    ]


def test_a_threshold_at_a_bins_lower_edge_is_a_flagged_guess_inside_the_bin() -> None:
    """D1: ``P[a <= 0]`` with 30 % of the records at ``a = 0`` (the lowest bin [0, 2) holds
    them; read as spread evenly inside it, they count for nothing) is a guess inside a bin:
    basis ``bounds``, ``model-guess`` on the value, no standard error, and an interval that
    still holds the truth; so is the same predicate as a count, and ``P[a <= 2]`` (the lower
    edge of [2, 4)). A threshold inside a bin (``a <= 3``) keeps ``noise+bias``. Control: the
    code before answered ``P[a <= 0]`` value 0, standard error 0, basis ``noise+bias``, no
    flag (the stranger's "count ≈ 0.0 ± 0.0" for 499 records at 0)."""
    (cdf, truth), (count, count_truth) = _answers(
        Query("cdf", columns=("a",), points=(0.0, 2.0, 3.0)),
        Query("count", where=(("a", -math.inf, 0.0),)),
    )
    assert truth[0] > 0.25 and count_truth[0] == truth[0], (truth, count_truth)
    for row, true in [(cdf[0], truth[0]), (cdf[1], truth[1]), (count[0], count_truth[0])]:
        assert row["basis"] == "bounds", row
        assert [f["code"] for f in row["flags"]] == ["model-guess"], row
        assert row["standard_error"] is None, row
        low, high = row["interval"]
        assert low <= true <= high, (row, true)
    assert cdf[2]["basis"] == "noise+bias" and cdf[2]["flags"] == [], cdf[2]


def test_a_cdf_the_declared_bounds_settle_is_public() -> None:
    """D4: ``P[a <= 10]`` at the declared upper bound 10 holds every record whatever the data,
    as ``P[a <= 11]`` above it and ``P[a <= -1]`` (none) below the lower bound: basis
    ``public``, standard error 0, interval ``[v, v]`` with the exact value, no flag (as the
    marginals kind answers them). Control: the code before gave ``noise+bias`` for all three
    (value and interval already exact)."""
    ((rows, truth),) = _answers(Query("cdf", columns=("a",), points=(10.0, 11.0, -1.0)))
    assert truth == [1.0, 1.0, 0.0]
    for row, true in zip(rows, truth, strict=True):
        assert row["basis"] == "public", row
        assert row["value"] == true and row["interval"] == [true, true], row
        assert row["standard_error"] == 0.0 and row["flags"] == [], row
