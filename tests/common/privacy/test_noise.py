"""Tests for dpmarket.common.privacy.noise: OpenDP and seeded numpy noise sources.

Distribution tests are Kolmogorov-Smirnov tests at threshold ``p > 1e-4``. Under the null
hypothesis the p-value of a continuous distribution is uniform, so each such test fails
falsely with probability 1e-4 (OpenDP's draws lie on a ``2**-1074`` grid, continuous for this
purpose). OpenDP cannot be seeded, so its tests are random: the four acceptance tests below
fail falsely with probability at most 4e-4 per run. The seeded tests are deterministic.
"""

from __future__ import annotations

import functools
import math
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise, noise_source

KS_THRESHOLD = 1e-4
# Enough OpenDP draws for the KS test to reject a 2x wrong scale: the largest CDF gap between
# Laplace(0, b) and Laplace(0, 2b) is 1/8 (between N(0, s^2) and N(0, 4 s^2) about 0.17), far
# above the critical KS distance sqrt(ln(2 / 1e-4) / (2 n)) = 0.016 at n = 20,000.
N_OPENDP = 20_000
N_SEEDED = 50_000
LAPLACE_SCALES = (1.0, 3.7)
GAUSSIAN_SIGMAS = (1.0, 25.0)


@functools.cache
def _opendp_draws(kind: str, scale: float) -> NDArray[np.float64]:
    """One sample of N_OPENDP OpenDP draws per (kind, scale), shared by the tests that use it."""
    source = OpenDPNoise()
    return (
        source.laplace(scale, N_OPENDP) if kind == "laplace" else source.gaussian(scale, N_OPENDP)
    )


def _ks_pvalue(x: NDArray[np.float64], kind: str, scale: float) -> float:
    dist = "laplace" if kind == "laplace" else "norm"
    return float(stats.kstest(x, dist, args=(0.0, scale)).pvalue)


# ------------------------------------------------------------------------------ OpenDP: KS
@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_opendp_laplace_matches_laplace_distribution(scale: float) -> None:
    x = _opendp_draws("laplace", scale)
    assert x.shape == (N_OPENDP,)
    assert x.dtype == np.float64
    # False failure probability 1e-4 (unseeded: OpenDP draws from the OS's entropy).
    assert _ks_pvalue(x, "laplace", scale) > KS_THRESHOLD


@pytest.mark.parametrize("sigma", GAUSSIAN_SIGMAS)
def test_opendp_gaussian_matches_normal_distribution(sigma: float) -> None:
    x = _opendp_draws("gaussian", sigma)
    assert x.shape == (N_OPENDP,)
    assert x.dtype == np.float64
    # False failure probability 1e-4 (unseeded: OpenDP draws from the OS's entropy).
    assert _ks_pvalue(x, "gaussian", sigma) > KS_THRESHOLD


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_ks_rejects_a_twice_too_large_scale(kind: str) -> None:
    """The KS tests above can fail: the same draws are rejected against a 2x wrong scale."""
    scale = LAPLACE_SCALES[0] if kind == "laplace" else GAUSSIAN_SIGMAS[0]
    x = _opendp_draws(kind, scale)
    # The expected KS distance is ~0.12-0.17 against a critical 0.016: p is below 1e-100, and
    # the chance of p >= 1e-4 is negligible.
    assert _ks_pvalue(x, kind, 2.0 * scale) < KS_THRESHOLD
    assert _ks_pvalue(x, kind, 0.5 * scale) < KS_THRESHOLD


# --------------------------------------------------------------------------- OpenDP: other
def test_opendp_noise_is_fresh_and_shaped() -> None:
    source = OpenDPNoise()
    a = source.laplace(2.0, 140)
    b = source.laplace(2.0, 140)
    assert a.shape == b.shape == (140,)
    assert np.isfinite(a).all()
    assert not np.array_equal(a, b)
    scalar = source.gaussian(0.5, 1)
    assert scalar.shape == (1,)
    assert math.isfinite(float(scalar[0]))


def test_opendp_measurement_is_cached_per_kind_scale_and_size() -> None:
    from dpmarket.common.privacy.noise import _opendp_measurement

    source = OpenDPNoise()
    source.laplace(0.123, 7)
    before = _opendp_measurement.cache_info()
    source.laplace(0.123, 7)
    after = _opendp_measurement.cache_info()
    assert after.hits == before.hits + 1
    assert after.misses == before.misses
    source.gaussian(0.123, 7)  # another kind: another measurement
    assert _opendp_measurement.cache_info().misses == after.misses + 1


def test_opendp_noise_from_several_threads() -> None:
    source = OpenDPNoise()
    with ThreadPoolExecutor(max_workers=4) as pool:
        draws = list(pool.map(lambda _: source.laplace(1.0, 200), range(8)))
    stacked = np.concatenate(draws)
    assert stacked.shape == (1600,)
    assert np.isfinite(stacked).all()
    # Continuous draws from independent calls do not repeat.
    assert np.unique(stacked).size == stacked.size


# ------------------------------------------------------------------------------------ seeded
@pytest.mark.parametrize("seed", [0, 7, 20240501])
@pytest.mark.parametrize("size", [1, 8, 140])
def test_seeded_laplace_reproduces_numpy_exactly(seed: int, size: int) -> None:
    expected = np.random.default_rng(seed).laplace(0, 2.5, size)
    got = SeededNoise(np.random.default_rng(seed)).laplace(2.5, size)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("seed", [0, 7])
def test_seeded_gaussian_reproduces_numpy_exactly(seed: int) -> None:
    expected = np.random.default_rng(seed).normal(0.0, 0.3, size=140)
    got = SeededNoise(np.random.default_rng(seed)).gaussian(0.3, 140)
    np.testing.assert_array_equal(got, expected)


def test_seeded_scalar_draw_matches_the_scalar_numpy_call() -> None:
    """MWEM draws ``rng.laplace(0.0, b)`` one at a time; size=1 keeps those draws and the state."""
    direct = np.random.default_rng(11)
    source = SeededNoise(np.random.default_rng(11))
    for _ in range(5):
        assert source.laplace(0.8, 1)[0] == direct.laplace(0.0, 0.8)
        assert source.gaussian(1.3, 1)[0] == direct.normal(0.0, 1.3)
    assert source.rng.random() == direct.random()


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_seeded_laplace_matches_laplace_distribution(scale: float) -> None:
    x = SeededNoise(np.random.default_rng(3)).laplace(scale, N_SEEDED)
    assert _ks_pvalue(x, "laplace", scale) > KS_THRESHOLD  # seeded: deterministic


@pytest.mark.parametrize("sigma", GAUSSIAN_SIGMAS)
def test_seeded_gaussian_matches_normal_distribution(sigma: float) -> None:
    x = SeededNoise(np.random.default_rng(4)).gaussian(sigma, N_SEEDED)
    assert _ks_pvalue(x, "gaussian", sigma) > KS_THRESHOLD  # seeded: deterministic


def test_seeded_noise_rejects_a_non_generator() -> None:
    with pytest.raises(TypeError, match="RandomState"):
        SeededNoise(np.random.RandomState(0))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ noise_source
def test_noise_source_picks_seeded_numpy_for_a_seed() -> None:
    source = noise_source(5)
    assert isinstance(source, SeededNoise)
    assert isinstance(source, NoiseSource)
    assert source.seeded
    np.testing.assert_array_equal(
        source.laplace(1.0, 8), np.random.default_rng(5).laplace(0.0, 1.0, size=8)
    )
    np.testing.assert_array_equal(
        noise_source(0).gaussian(1.0, 3), noise_source(0).gaussian(1.0, 3)
    )


def test_noise_source_picks_opendp_without_a_seed() -> None:
    source = noise_source(None)
    assert isinstance(source, OpenDPNoise)
    assert isinstance(source, NoiseSource)
    assert not source.seeded


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_noise_source_rejects_bad_seeds(seed: object) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(seed))):
        noise_source(seed)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- errors
SOURCES = [
    pytest.param(lambda: SeededNoise(np.random.default_rng(0)), id="seeded"),
    pytest.param(OpenDPNoise, id="opendp"),
]
BAD_SCALES = [0.0, -1.0, math.nan, math.inf, -math.inf, "x", None]
BAD_SIZES = [0, -3, 2.5, True, "3", None]


@pytest.mark.parametrize("make", SOURCES)
@pytest.mark.parametrize("method", ["laplace", "gaussian"])
@pytest.mark.parametrize("bad", BAD_SCALES)
def test_bad_scale_raises_value_error_naming_it(make, method: str, bad: object) -> None:
    name = "scale" if method == "laplace" else "sigma"
    with pytest.raises(ValueError, match=rf"{name} must be .*got {re.escape(repr(bad))}$"):
        getattr(make(), method)(bad, 4)


@pytest.mark.parametrize("make", SOURCES)
@pytest.mark.parametrize("method", ["laplace", "gaussian"])
@pytest.mark.parametrize("bad", BAD_SIZES)
def test_bad_size_raises_value_error_naming_it(make, method: str, bad: object) -> None:
    with pytest.raises(ValueError, match=rf"size must be .*got {re.escape(repr(bad))}$"):
        getattr(make(), method)(1.0, bad)


@pytest.mark.parametrize("make", SOURCES)
def test_numpy_integer_sizes_and_scales_are_accepted(make) -> None:
    source: NoiseSource = make()
    # numpy scalars on purpose: the signature says float/int, the sources take numpy's too
    assert source.laplace(np.float32(2.0), np.int64(3)).shape == (3,)  # type: ignore[arg-type]
    assert source.gaussian(np.float64(2.0), np.int32(2)).shape == (2,)  # type: ignore[arg-type]
