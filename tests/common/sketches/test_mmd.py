"""Tests of dpmarket.common.sketches.mmd: the MMD interval of an RFF sketch covers the exact
kernel's MMD at its nominal rate, its control without the RFF approximation term does not, and
two owners' order is resolved only when the data separate them.

Coverage. Each repetition draws the spec's frequencies afresh (the interval covers over the draw
of the map and of the noise) and releases the owner's sketch with fresh Laplace noise; the truth
is the V-statistic of the exact Gaussian kernel between the owner's records and the validation
points. The count of covering intervals is ``Binomial(R, p)``; the test accepts the central range
leaving ``FAILURE / 2`` out on each side at ``p`` in ``[0.93, 0.97]`` (a central-limit interval
over ``m' = 100`` frequencies): if the true coverage lies there, it fails with probability at
most ``FAILURE``. The control's standard error is the noise's alone (it leaves out the RFF
approximation, which dominates for 2,000 records at epsilon 10) and fails the lower bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import draw_rff
from dpmarket.common.sketches.mmd import mmd2_difference, sketch_mmd2_estimate
from dpmarket.common.sketches.sketch import SketchMechanism, sketch_mmd2

FAILURE = 1e-4
DOMAIN = Domain(np.array([0.0, 0.0]), np.array([1.0, 1.0]))
SIGMA = 0.3


def _points(n: int, shift: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.4 + shift, 0.15, (n, 2)), 0.0, 1.0)


def _exact_mmd2(x: np.ndarray, v: np.ndarray) -> float:
    """The V-statistic of ``exp(-||x - y||^2 / (2 SIGMA^2))`` (means over all pairs)."""

    def mean_k(a: np.ndarray, b: np.ndarray) -> float:
        sq = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
        return float(np.exp(-sq / (2 * SIGMA**2)).mean())

    return mean_k(x, x) - 2 * mean_k(x, v) + mean_k(v, v)


@pytest.mark.parametrize(
    ("epsilon", "shift"),
    [(10.0, 0.1), (1.0, 0.0)],
    ids=["approximation-dominated", "noise-dominated-near-0"],
)
def test_the_mmd_interval_covers_the_exact_kernels_mmd(epsilon: float, shift: float) -> None:
    """300 sketches of 2,000 records, each with its own frequencies and noise: the interval
    covers the exact kernel's MMD at 0.93-0.97, whether the RFF approximation dominates (epsilon
    10, MMD^2 = 0.11) or the noise does (epsilon 1, the same distribution: MMD^2 = 0.0015). With
    the noise's standard error alone, the first covers about 15 % of the time."""
    reps, m = 300, 100
    owner = _points(2000, shift, seed=1)
    validation = _points(300, 0.0, seed=2)
    truth = _exact_mmd2(owner, validation)
    covered = control = 0
    for r in range(reps):
        rng = np.random.default_rng([r, 0])
        mechanism = SketchMechanism(draw_rff(2, m, SIGMA, rng), DOMAIN, epsilon, "laplace")
        sketch = mechanism.release(owner, SeededNoise(np.random.default_rng([r, 1])))
        e = sketch_mmd2_estimate(sketch, validation)
        assert math.isclose(e.value, sketch_mmd2(sketch, validation), rel_tol=1e-9, abs_tol=1e-12)
        covered += e.low <= truth <= e.high
        # The noise alone: Var(2 xi . u / n + |xi|^2 / n^2) / m^2, Laplace fourth moment 6 s2^2.
        n, s2 = sketch.count_estimate, sketch.sum_noise_variance
        u2 = float(np.sum(e.terms)) + 2 * m * s2 / n**2
        noise_se = math.sqrt(4 * s2 * u2 / n**2 + 2 * m * 5 * s2**2 / n**4) / m
        control += abs(e.value - truth) <= 1.959963984540054 * noise_se
    low = stats.binom.ppf(FAILURE / 2, reps, 0.93)
    high = stats.binom.isf(FAILURE / 2, reps, 0.97)
    assert low <= covered <= high, (covered, low, high)
    if epsilon > 1:
        assert control < low, (control, low)


def test_two_owners_order_is_resolved_when_the_data_separate_them_not_otherwise() -> None:
    rng = np.random.default_rng(3)
    mechanism = SketchMechanism(draw_rff(2, 200, SIGMA, rng), DOMAIN, 1.0, "laplace")
    validation = _points(300, 0.0, seed=4)
    release = {
        name: mechanism.release(
            _points(5000, shift, seed), SeededNoise(np.random.default_rng(seed))
        )
        for name, shift, seed in (("near", 0.0, 5), ("twin", 0.0, 6), ("far", 0.3, 7))
    }
    est = {name: sketch_mmd2_estimate(s, validation) for name, s in release.items()}
    diff, se, resolved = mmd2_difference(est["near"], est["far"])
    assert resolved and diff < 0 and se > 0
    _, _, resolved = mmd2_difference(est["near"], est["twin"])
    assert not resolved  # the same distribution: only noise and sampling tell them apart
