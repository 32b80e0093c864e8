"""A capeFM job's public spec: what an owner's refusal of its records says."""

from __future__ import annotations

import numpy as np
import pytest

from common.cape.spec import CapeJobSpec

FEATURES = (("bmi", 10.0, 60.0), ("age", 0.0, 100.0))


def _spec(task: str = "linear") -> CapeJobSpec:
    return CapeJobSpec(task, FEATURES, ("y", 0.0, 1.0), epsilon=1.0, delta=1e-6)  # type: ignore[arg-type]


def test_records_within_bounds_are_scaled_into_the_unit_ball() -> None:
    x, y = _spec().scaled([[10.0, 100.0], [60.0, 0.0]], [0.0, 1.0])
    assert x.shape == (2, 3)
    assert np.all(np.linalg.norm(x, axis=1) <= 1.0 + 1e-12)
    np.testing.assert_allclose(y, [-1.0, 1.0])


def test_a_feature_outside_its_bounds_is_named_by_row_and_column_name() -> None:
    """The spec's column 1 is ``age``: the message names it, not its index."""
    records = [[20.0, 50.0], [30.0, 50.0], [30.0, 120.0], [70.0, 130.0]]
    with pytest.raises(
        ValueError, match=r"row 2, column 'age': 120\.0 not in \[0\.0, 100\.0\] \(3 value"
    ):
        _spec().scaled(records, [0.5] * 4)


def test_a_target_outside_its_bounds_or_not_a_label_is_named() -> None:
    with pytest.raises(ValueError, match=r"row 1, column 'y': -0\.5 not in \[0\.0, 1\.0\]"):
        _spec().scaled([[20.0, 50.0]] * 2, [0.5, -0.5])
    with pytest.raises(ValueError, match=r"target column 'y' at row 1 must be 0 or 1"):
        _spec("logistic").scaled([[20.0, 50.0]] * 2, [1.0, 0.5])
