"""Tests of dpmarket.common.summarization.kernels.mmd2_to_population: the interval of a summary's
MMD² to the distribution a test set was drawn from covers it at its nominal rate.

The distribution is Gaussian, so the truth is exact: for ``y, y' ~ N(mu, s^2 I_d)`` and ``k =
exp(-||.||^2 / (2 sigma^2))``, ``E k(y, y') = (sigma^2 / (sigma^2 + 2 s^2))^(d/2)`` and ``E k(x, y)
= (sigma^2 / (sigma^2 + s^2))^(d/2) exp(-||x - mu||^2 / (2 (sigma^2 + s^2)))``. Each repetition
draws a fresh test set; the count of covering intervals is ``Binomial(R, p)`` and the test accepts
the central range leaving ``FAILURE / 2`` out on each side at ``p`` in ``[0.92, 0.98]`` (a normal,
first-order interval): if the true coverage lies there, it fails with probability at most
``FAILURE``. The control centres the same interval on the V-statistic the report printed before
(:func:`~dpmarket.common.summarization.kernels.mmd2`), biased by ``(1 - E k) / n``: where the
summary resembles the test distribution that bias is several standard errors, and it fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.summarization.kernels import mmd2, mmd2_to_population, rbf_kernel

FAILURE = 1e-4
D, S, SIGMA = 3, 1.0, 1.0
GAMMA = 1.0 / (2.0 * SIGMA**2)


def _truth(x: np.ndarray) -> float:
    a = float(rbf_kernel(x, x, GAMMA).mean())
    c = SIGMA**2 + S**2
    ef = float(((SIGMA**2 / c) ** (D / 2) * np.exp(-(x**2).sum(axis=1) / (2 * c))).mean())
    return a - 2.0 * ef + (SIGMA**2 / (SIGMA**2 + 2 * S**2)) ** (D / 2)


@pytest.mark.parametrize(("shift", "size"), [(1.0, 50), (0.0, 200)], ids=["apart", "alike"])
def test_the_interval_covers_the_population_mmd(shift: float, size: int) -> None:
    reps, n = 250, 100
    x = np.random.default_rng(0).normal(shift, S, (size, D))
    truth = _truth(x)
    covered = control = 0
    for r in range(reps):
        y = np.random.default_rng([r, 1]).normal(0.0, S, (n, D))
        e = mmd2_to_population(x, y, GAMMA)
        covered += e.low <= truth <= e.high
        v = mmd2(x, y, GAMMA)
        assert e.v_statistic == pytest.approx(v, rel=1e-9, abs=1e-15)
        control += abs(v - truth) <= 1.959963984540054 * e.standard_error
    low = stats.binom.ppf(FAILURE / 2, reps, 0.92)
    high = stats.binom.isf(FAILURE / 2, reps, 0.98)
    assert low <= covered <= high, (covered, low, high)
    if shift == 0.0:
        assert control < low, (control, low)


def test_bad_input_is_refused() -> None:
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="at least 3 rows"):
        mmd2_to_population(x, np.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError, match="level"):
        mmd2_to_population(x, np.zeros((5, 2)), 1.0, level=1.0)
