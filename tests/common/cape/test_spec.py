"""CAPE jobs' public specs: records clamped to the public bounds (counted for the owner's log),
labels refused without naming a row or a value, malformed specs refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec, clamp_to_bounds

FEATURES = (("bmi", 10.0, 60.0), ("age", 0.0, 100.0))


def _spec(task: str = "linear") -> CapeJobSpec:
    return CapeJobSpec(task, FEATURES, ("y", 0.0, 1.0), epsilon=1.0, delta=1e-6)  # type: ignore[arg-type]


def test_records_within_bounds_are_scaled_into_the_unit_ball() -> None:
    x, y = _spec().scaled([[10.0, 100.0], [60.0, 0.0]], [0.0, 1.0])
    assert x.shape == (2, 3)
    assert np.all(np.linalg.norm(x, axis=1) <= 1.0 + 1e-12)
    np.testing.assert_allclose(y, [-1.0, 1.0])


def test_values_outside_their_bounds_are_clamped_to_them_and_counted() -> None:
    """As OpenDP's clamp: the spec's column 1 (``age``) holds two values above 100 and the
    linear target one below 0; they become the bounds, and the counts name the columns."""
    records = [[20.0, 50.0], [30.0, 50.0], [30.0, 120.0], [70.0, 130.0]]
    x, y, moved = _spec().clamped(records, [0.5, -0.5, 0.5, 0.5])
    np.testing.assert_array_equal(x, [[20.0, 50.0], [30.0, 50.0], [30.0, 100.0], [60.0, 100.0]])
    np.testing.assert_array_equal(y, [0.5, 0.0, 0.5, 0.5])
    assert moved == {"bmi": 1, "age": 2, "y": 1}
    assert y is not None
    clamped_x, clamped_y = _spec().scaled(x, y)
    again_x, again_y = _spec().scaled(records, [0.5, -0.5, 0.5, 0.5])
    np.testing.assert_array_equal(again_x, clamped_x)
    np.testing.assert_array_equal(again_y, clamped_y)
    assert np.all(np.linalg.norm(again_x, axis=1) <= 1.0 + 1e-12)


def test_clamp_to_bounds_moves_only_values_outside_and_refuses_nan_without_naming_it() -> None:
    clamped, moved = clamp_to_bounds([[1.0, 5.0], [-3.0, 2.0]], [0.0, 0.0], [2.0, 4.0])
    np.testing.assert_array_equal(clamped, [[1.0, 4.0], [0.0, 2.0]])
    np.testing.assert_array_equal(moved, [1, 1])
    with pytest.raises(ValueError, match=r"^values must be finite to be clamped$"):
        clamp_to_bounds([[1.0, np.nan]], [0.0, 0.0], [2.0, 4.0])


def test_a_label_that_is_not_0_1_is_refused_naming_the_column_only() -> None:
    """The message does not depend on the data: neither the row nor the value is named."""
    for labels in ([1.0, 0.5], [2.0, 0.0], [1.0, -7.0]):
        with pytest.raises(ValueError) as info:
            _spec("logistic").scaled([[20.0, 50.0]] * 2, labels)
        assert str(info.value) == "target column 'y' must hold only 0 and 1"


def test_a_mean_clamps_its_columns() -> None:
    spec = CapeMeanSpec(FEATURES, 1.0, 1e-6)
    values, target, moved = spec.clamped([[20.0, 50.0], [60.0, 0.0]])
    np.testing.assert_array_equal(values, [[20.0, 50.0], [60.0, 0.0]])
    assert target is None and moved == {}
    values, _, moved = spec.clamped([[20.0, 50.0], [61.0, -1.0], [1000.0, 0.0]])
    np.testing.assert_array_equal(values, [[20.0, 50.0], [60.0, 0.0], [60.0, 0.0]])
    assert moved == {"bmi": 2, "age": 1}
    assert spec.cost == (1.0, 1e-6) and "mean" in spec.mechanism


def test_a_training_maps_clamped_features_to_the_unit_cube_and_needs_labels() -> None:
    spec = CapeTrainingSpec(FEATURES, "spam", 1.0, 1e-5, 10, 0.5, 4, 1.0)
    x, y = spec.scaled([[10.0, 100.0], [35.0, 25.0]], [1.0, 0.0])
    np.testing.assert_allclose(x, [[-1.0, 1.0], [0.0, -0.5]])
    np.testing.assert_array_equal(y, [1.0, 0.0])
    assert spec.n_params == 4 * (2 + 2) + 1
    with pytest.raises(ValueError, match=r"^target column 'spam' must hold only 0 and 1$"):
        spec.scaled([[10.0, 100.0], [35.0, 25.0]], [1.0, 2.0])
    np.testing.assert_allclose(
        spec.scale([[10.0, 101.0], [-5.0, 50.0]]), [[-1.0, 1.0], [-1.0, 0.0]]
    )
    assert spec.clamped([[10.0, 101.0]], [1.0]).moved == {"age": 1}
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
