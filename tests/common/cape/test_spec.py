"""CAPE jobs' public specs: what an owner's refusal of its records says, and what is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec

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


def test_a_mean_checks_its_columns_and_never_clips() -> None:
    spec = CapeMeanSpec(FEATURES, 1.0, 1e-6)
    values = spec.checked([[20.0, 50.0], [60.0, 0.0]])
    np.testing.assert_array_equal(values, [[20.0, 50.0], [60.0, 0.0]])
    with pytest.raises(ValueError, match=r"row 1, column 'bmi': 61\.0 not in \[10\.0, 60\.0\]"):
        spec.checked([[20.0, 50.0], [61.0, 0.0]])
    with pytest.raises(ValueError, match=r"row 0, column 'age': nan not in"):
        spec.checked([[20.0, np.nan]])
    assert spec.cost == (1.0, 1e-6) and "mean" in spec.mechanism


def test_a_training_maps_features_to_the_unit_cube_and_needs_labels() -> None:
    spec = CapeTrainingSpec(FEATURES, "spam", 1.0, 1e-5, 10, 0.5, 4, 1.0)
    x, y = spec.scaled([[10.0, 100.0], [35.0, 25.0]], [1.0, 0.0])
    np.testing.assert_allclose(x, [[-1.0, 1.0], [0.0, -0.5]])
    np.testing.assert_array_equal(y, [1.0, 0.0])
    assert spec.n_params == 4 * (2 + 2) + 1
    with pytest.raises(ValueError, match=r"target column 'spam' at row 1 must be 0 or 1"):
        spec.scaled([[10.0, 100.0], [35.0, 25.0]], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"row 0, column 'age': 101\.0"):
        spec.scale([[10.0, 101.0]])
    epsilon, delta = spec.cost  # the PLD accountant's total of the whole training
    assert 1.0 - 1e-4 <= epsilon <= 1.0 and delta == 1e-5
    assert "10 iterations" in spec.mechanism


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"iterations": 0}, "iterations"),
        ({"hidden": 2.5}, "hidden"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"clip": -1.0}, "clip"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"target": "age"}, "distinct"),
        ({"features": (("bmi", 1.0, float("nan")),)}, "bounds of 'bmi'"),
    ],
)
def test_a_malformed_training_spec_is_refused(changes: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "features": FEATURES,
        "target": "spam",
        "epsilon": 1.0,
        "delta": 1e-5,
        "iterations": 10,
        "learning_rate": 0.5,
        "hidden": 4,
        "clip": 1.0,
    }
    with pytest.raises(ValueError, match=message):
        CapeTrainingSpec(**{**args, **changes})
