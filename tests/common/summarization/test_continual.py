"""The binary-tree continual release: noise law of every prefix sum, nodes per increment."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.summarization.continual import TreePrefixSum, tree_levels


@pytest.mark.parametrize(
    ("horizon", "levels"), [(1, 1), (2, 2), (3, 2), (4, 3), (199, 8), (200, 8), (256, 9)]
)
def test_tree_levels_counts_the_levels_whose_nodes_can_complete(horizon: int, levels: int) -> None:
    assert tree_levels(horizon) == levels
    # Equal to ceil(log2 T) + 1 for a power of two, one less otherwise.
    assert levels <= int(np.ceil(np.log2(horizon))) + 1


@pytest.mark.parametrize("horizon", [16, 13])
def test_every_increment_enters_at_most_levels_released_nodes(horizon: int) -> None:
    tree = TreePrefixSum(horizon, 3, 1.0, np.random.default_rng(0))
    for _ in range(horizon):
        tree.add(np.ones(3))
    assert max(tree.nodes_per_increment) <= tree.levels
    if horizon & (horizon - 1) == 0:  # a full tree: exactly one node per level
        assert tree.nodes_per_increment == [tree.levels] * horizon
    # Leaves always, and the root of a full tree covers everything.
    assert min(tree.nodes_per_increment) >= 1


def test_prefix_sums_are_exact_plus_gaussian_noise_of_the_stated_variance() -> None:
    """KS test: (released - true) / sqrt(popcount(t)) sigma is N(0, 1) for every prefix t, over
    seeded independent trees (failure probability per test < 1e-4 by the threshold)."""
    horizon, d, sigma = 13, 4, 2.5
    rng = np.random.default_rng(11)
    values = rng.normal(size=(horizon, d))
    truth = np.cumsum(values, axis=0)
    standardized: dict[int, list[float]] = {t: [] for t in range(1, horizon + 1)}
    for _ in range(400):
        tree = TreePrefixSum(horizon, d, sigma, rng)
        for t in range(1, horizon + 1):
            tree.add(values[t - 1])
            err = tree.prefix_sum() - truth[t - 1]
            standardized[t].extend(err / np.sqrt(tree.prefix_variance(t)))
    for t, errs in standardized.items():
        assert stats.kstest(errs, "norm").pvalue > 1e-4, t
    # Earlier prefixes are still available and unchanged.
    np.testing.assert_allclose(
        tree.prefix_sum(0), np.zeros(d)
    )  # nothing released for the empty prefix


def test_prefix_variance_is_popcount_times_sigma_squared() -> None:
    tree = TreePrefixSum(8, 1, 3.0, np.random.default_rng(0))
    assert [tree.prefix_variance(t) for t in (1, 2, 3, 7, 8)] == [9.0, 9.0, 18.0, 27.0, 9.0]


def test_same_seed_same_release() -> None:
    a = TreePrefixSum(5, 2, 1.0, np.random.default_rng(3))
    b = TreePrefixSum(5, 2, 1.0, np.random.default_rng(3))
    for t in range(5):
        a.add([t, 1.0])
        b.add([t, 1.0])
        np.testing.assert_array_equal(a.prefix_sum(), b.prefix_sum())


def test_increment_sensitivity_of_h1() -> None:
    assert TreePrefixSum.increment_sensitivity(np.sqrt(2)) == pytest.approx(2 * np.sqrt(2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"horizon": 0}, "horizon"),
        ({"dimension": 0}, "dimension"),
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": float("nan")}, "sigma"),
    ],
)
def test_bad_parameters_are_rejected(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"horizon": 4, "dimension": 2, "sigma": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        TreePrefixSum(rng=np.random.default_rng(0), **args)  # type: ignore[arg-type]


def test_overflow_and_bad_values_are_rejected() -> None:
    tree = TreePrefixSum(1, 2, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="value"):
        tree.add([1.0, np.inf])
    tree.add([1.0, 2.0])
    with pytest.raises(ValueError, match="at most horizon"):
        tree.add([1.0, 2.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tree.prefix_sum(2)
