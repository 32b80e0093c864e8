"""Tests of dpmarket.common.summarization.kernels.mmd2_to_population: the interval of a summary's
MMD² to the distribution a test set was drawn from covers it at its nominal rate.

Two populations with an exact truth. A Gaussian: for ``y, y' ~ N(mu, s^2 I_d)`` and ``k =
exp(-||.||^2 / (2 sigma^2))``, ``E k(y, y') = (sigma^2 / (sigma^2 + 2 s^2))^(d/2)`` and ``E k(x, y)
= (sigma^2 / (sigma^2 + s^2))^(d/2) exp(-||x - mu||^2 / (2 (sigma^2 + s^2)))``. A log-normal pool
of 400 points, the test set drawn from it with replacement, so the truth is the V-statistic
against the pool (as in issue 28's SaratogaHouses run). Each of 1,000 repetitions draws a fresh
seeded test set of 30 or 100 points; the count of covering intervals is ``Binomial(R, p)`` and the
test accepts the central range leaving ``FAILURE / 2`` out on each side at ``p`` in ``[0.92,
0.98]`` (the target 95 ± 3 %): if the true coverage lies there, each case fails with probability
at most ``FAILURE``.

Controls. The interval before issue 28 (``value -+ z sd(2 (g - f)) / sqrt(n)``, the first-order
term alone, not raised to 0) covered, with these seeds, 0.903 (log-normal, n = 30; its low end
below 0 in 727 draws) and 0.942 (n = 100), below the new interval's 0.958 and 0.953 (asserted);
on the Gaussian cases 0.935-0.946 against the new 0.942-0.974. The V-statistic the report
printed before that, with the same standard error, fails where the summary resembles the test
distribution (bias ``(1 - E k) / n``; asserted in the "alike" case at n = 100). The "alike"
case (``X`` a 200-point sample of ``Q``, MMD² near 0) is checked for ``p >= 0.92`` only: the
second-order term makes the interval conservative there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.summarization.kernels import mmd2, mmd2_to_population, rbf_kernel

FAILURE = 1e-4
REPS = 1000
Z = 1.959963984540054
D, S, SIGMA = 3, 1.0, 1.0
GAMMA = 1.0 / (2.0 * SIGMA**2)


def _gaussian_truth(x: np.ndarray) -> float:
    a = float(rbf_kernel(x, x, GAMMA).mean())
    c = SIGMA**2 + S**2
    ef = float(((SIGMA**2 / c) ** (D / 2) * np.exp(-(x**2).sum(axis=1) / (2 * c))).mean())
    return a - 2.0 * ef + (SIGMA**2 / (SIGMA**2 + 2 * S**2)) ** (D / 2)


def _old_interval(x: np.ndarray, y: np.ndarray, gamma: float) -> tuple[float, float]:
    """The interval before issue 28: unbiased value -+ z first-order standard error."""
    n = y.shape[0]
    f = rbf_kernel(y, x, gamma).mean(axis=1)
    rows = rbf_kernel(y, y, gamma).sum(axis=1) - 1.0
    value = (
        float(rbf_kernel(x, x, gamma).mean()) - 2.0 * float(f.mean()) + rows.sum() / (n * (n - 1))
    )
    se = math.sqrt(float(np.var(2.0 * (rows / (n - 1) - f), ddof=1)) / n)
    return value - Z * se, value + Z * se


def _accepted(covered: int, *, conservative: bool = False) -> None:
    low = stats.binom.ppf(FAILURE / 2, REPS, 0.92)
    high = REPS if conservative else stats.binom.isf(FAILURE / 2, REPS, 0.98)
    assert low <= covered <= high, (covered, low, high)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shift", "size", "n"),
    [(1.0, 50, 30), (0.0, 200, 100), (0.0, 30, 30)],
    ids=["apart", "alike", "summary"],
)
def test_the_interval_covers_a_gaussian_population_mmd(shift: float, size: int, n: int) -> None:
    """Three populations, one test-set size each (n = 100 where the first-order control must
    fail; the other five pairings measured 0.942-0.974 when this was written)."""
    x = np.random.default_rng(0).normal(shift, S, (size, D))
    truth = _gaussian_truth(x)
    covered = control = 0
    for r in range(REPS):
        y = np.random.default_rng([r, n]).normal(0.0, S, (n, D))
        e = mmd2_to_population(x, y, GAMMA)
        assert 0.0 <= e.low <= e.high
        covered += e.low <= truth <= e.high
        v = mmd2(x, y, GAMMA)
        assert e.v_statistic == pytest.approx(v, rel=1e-9, abs=1e-15)
        control += abs(v - truth) <= Z * e.standard_error
    # X a 200-point sample of Q (MMD² near 0, the degenerate case): the second-order term
    # makes the interval conservative there (measured 0.998 / 0.999 at n = 30 / 100)
    _accepted(covered, conservative=size == 200)
    if (shift, size, n) == (0.0, 200, 100):
        assert control < stats.binom.ppf(FAILURE / 2, REPS, 0.92), control


@pytest.mark.slow
@pytest.mark.parametrize("n", [30])
def test_the_interval_covers_a_skewed_pool(n: int) -> None:
    """Heavy right tails, a summary of 30 pool points: the old interval's misses lay below
    (old 0.903 at n = 30). At n = 100 the new interval covers less well on such tails (see
    :func:`mmd2_to_population`'s Notes), so only n = 30 is asserted."""
    rng = np.random.default_rng(5)
    pool = np.exp(rng.normal(0.0, 1.0, (400, 4)))
    x = pool[rng.choice(400, 30, replace=False)] * 1.1
    gamma = 0.1
    truth = mmd2(x, pool, gamma)
    covered = old = 0
    for r in range(REPS):
        y = pool[np.random.default_rng([r, n, 7]).integers(0, 400, n)]
        e = mmd2_to_population(x, y, gamma)
        assert e.low >= 0.0
        covered += e.low <= truth <= e.high
        lo, hi = _old_interval(x, y, gamma)
        old += lo <= truth <= hi
    _accepted(covered)
    assert old < covered, (old, covered)


def test_bad_input_is_refused() -> None:
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="at least 3 rows"):
        mmd2_to_population(x, np.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError, match="level"):
        mmd2_to_population(x, np.zeros((5, 2)), 1.0, level=1.0)
