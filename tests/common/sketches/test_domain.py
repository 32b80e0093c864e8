"""Tests for dpmarket.common.sketches.domain: the public box, discrete attributes, the uniform
prior."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.sketches import Domain


def _mixed() -> Domain:
    return Domain(
        low=np.array([0.0, -5.0, 0.0]),
        high=np.array([1.0, 5.0, 1.0]),
        names=("a", "b", "label"),
        levels=(None, None, np.array([0.0, 1.0])),
    )


def test_check_accepts_records_on_the_boundary() -> None:
    dom = _mixed()
    x = np.array([[0.0, -5.0, 0.0], [1.0, 5.0, 1.0], [0.5, 0.0, 1.0]])
    out = dom.check(x)
    np.testing.assert_array_equal(out, x)
    assert out.dtype == np.float64


@pytest.mark.parametrize(
    ("row", "col", "value", "pattern"),
    [
        (2, 1, 5.000001, r"row 2, b: value 5\.000001 lies outside the domain \[-5\.0, 5\.0\]"),
        (0, 0, -0.1, r"row 0, a: value -0\.1 lies outside"),
        (
            1,
            2,
            0.5,
            r"row 1, label: value 0\.5 is not one of the attribute's levels \[0\.0, 1\.0\]",
        ),
        (3, 0, math.nan, r"row 3, a: value nan is not a finite number"),
        (1, 1, math.inf, r"row 1, b: value inf is not a finite number"),
    ],
)
def test_check_names_the_row_and_column_of_a_bad_record(
    row: int, col: int, value: float, pattern: str
) -> None:
    x = np.tile([0.5, 0.0, 1.0], (4, 1))
    x[row, col] = value
    with pytest.raises(InvalidArgumentError, match=pattern):
        _mixed().check(x, "data")


def test_clamp_projects_every_record_onto_the_domain_and_counts_what_moved() -> None:
    """Continuous values to the nearest bound, discrete ones to the nearest level (ties to the
    lower one), as OpenDP clamps; records inside do not move; every result passes check."""
    dom = Domain(
        low=np.array([0.0, -5.0, 0.0]),
        high=np.array([1.0, 5.0, 4.0]),
        names=("a", "b", "grade"),
        levels=(None, None, np.array([0.0, 1.0, 3.0])),
    )
    x = np.array(
        [
            [0.5, 0.0, 1.0],
            [-0.1, 7.0, 2.0],  # a, b clamped; 2 is as near 1 as 3: the lower level
            [1.5, -5.0, 2.6],  # a clamped; 2.6 -> 3
            [0.0, 5.0, 9.0],  # 9 -> 4 (the bound) -> 3
            [0.2, 1.0, -1.0],  # -1 -> 0
        ]
    )
    out, moved = dom.clamp(x)
    np.testing.assert_array_equal(
        out,
        [[0.5, 0.0, 1.0], [0.0, 5.0, 1.0], [1.0, -5.0, 3.0], [0.0, 5.0, 3.0], [0.2, 1.0, 0.0]],
    )
    np.testing.assert_array_equal(moved, [2, 1, 4])
    np.testing.assert_array_equal(dom.check(out), out)
    inside, none = dom.clamp(out)
    np.testing.assert_array_equal(inside, out)
    assert not none.any()


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_clamp_refuses_what_is_not_finite_naming_no_row_or_value(value: float) -> None:
    x = np.tile([0.5, 0.0, 1.0], (4, 1))
    x[2, 1] = value
    with pytest.raises(InvalidArgumentError) as info:
        _mixed().clamp(x, "data")
    assert str(info.value) == "data holds NaN or inf: only finite values are clamped"


def test_check_without_names_says_column() -> None:
    x = np.zeros((3, 2))
    x[1, 1] = 2.0
    with pytest.raises(ValueError, match=r"row 1, column 1: value 2\.0 lies outside"):
        Domain.unit(2).check(x)


@pytest.mark.parametrize(
    "x",
    [np.zeros((0, 3)), np.zeros(3), np.zeros((2, 4)), np.array([["a", "b", "c"]])],
)
def test_check_refuses_bad_shapes_and_types(x: np.ndarray) -> None:
    with pytest.raises(InvalidArgumentError):
        _mixed().check(x)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"low": [0.0, 1.0], "high": [1.0, 1.0]}, "attribute 1 must satisfy low < high"),
        ({"low": [0.0], "high": [1.0, 2.0]}, "same length"),
        ({"low": [math.nan], "high": [1.0]}, r"low\[0\] must be finite"),
        ({"low": [], "high": []}, "non-empty"),
        ({"low": [0.0], "high": [1.0], "names": ("a", "b")}, "names must be empty or have 1"),
        ({"low": [0.0], "high": [1.0], "levels": ([0.0, 2.0],)}, r"must lie in \[0\.0, 1\.0\]"),
        ({"low": [0.0], "high": [1.0], "levels": ([1.0, 0.0],)}, "strictly increasing"),
        ({"low": [0.0], "high": [1.0], "levels": ([],)}, "must not be empty"),
        ({"low": [0.0, 0.0], "high": [1.0, 1.0], "levels": (None,)}, "levels must be empty"),
    ],
)
def test_bad_domains_are_refused(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        Domain(**kwargs)  # type: ignore[arg-type]


def test_domain_is_immutable_and_compared_exactly() -> None:
    dom = _mixed()
    with pytest.raises(ValueError, match="read-only"):
        dom.low[0] = 3.0
    assert dom == _mixed()
    assert dom != Domain(
        np.array([0.0, -5.0, 0.0]), np.array([1.0, 5.0, 1.0]), names=("a", "b", "label")
    )
    assert Domain.unit(2) != Domain(np.array([0.0, 0.0]), np.array([1.0, 1.0 + 1e-12]))
    assert dom.describe()[2] == {"name": "label", "low": 0.0, "high": 1.0, "levels": [0.0, 1.0]}


def test_uniform_prior_covers_the_domain_and_the_levels() -> None:
    dom = _mixed()
    x = dom.sample_uniform(20_000, np.random.default_rng(1))
    dom.check(x)  # every point inside, labels on their levels
    # Uniform marginals: mean of U[low, high] within 5 standard errors (failure prob. < 1e-6).
    se = (dom.high - dom.low) / math.sqrt(12 * x.shape[0])
    np.testing.assert_array_less(np.abs(x[:, :2].mean(0) - [0.5, 0.0]), 5 * se[:2])
    assert abs(x[:, 2].mean() - 0.5) < 5 * 0.5 / math.sqrt(x.shape[0])
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        dom.sample_uniform(0, np.random.default_rng(1))


def test_integer_attributes_are_one_flag_each_and_not_compared() -> None:
    """``integers`` has one entry per attribute (or none); all False reads as none; it is not
    part of equality (it changes nothing a sketch holds)."""
    low, high = np.zeros(2), np.ones(2)
    with pytest.raises(ValueError, match="integers must be empty or have 2 entries"):
        Domain(low, high, integers=(True,))
    assert Domain(low, high, integers=(False, False)).integers == ()
    marked = Domain(low, high, integers=(False, True))
    assert marked.is_integer(1) and not marked.is_integer(0)
    assert not Domain(low, high).is_integer(1) and marked == Domain(low, high)
