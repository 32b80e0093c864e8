"""Fixed-point encoding: unbiased rounding, sums that never wrap, errors instead of clipping."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.secagg.fixedpoint import FixedPoint, dequantize_sum, quantize


def test_parameters_by_hand() -> None:
    fp = FixedPoint(clip=1.0, resolution_bits=8, sites=3)
    assert fp.levels == 255
    assert fp.scale == 127.5
    # 3 * 2^8 = 768 <= 2^10: k = 10.
    assert (fp.modulus_bits, fp.modulus) == (10, 1024)
    assert FixedPoint(1.0, 8, 1).modulus_bits == 8
    assert FixedPoint(1.0, 8, 4).modulus_bits == 10
    assert FixedPoint(1.0, 8, 5).modulus_bits == 11
    assert FixedPoint(1.0, 52, 2**11).modulus_bits == 63


@pytest.mark.parametrize(
    ("clip", "bits", "sites", "message"),
    [
        (0.0, 8, 3, "clip must be finite and > 0"),
        (float("inf"), 8, 3, "clip must be finite and > 0"),
        (1.0, 0, 3, r"resolution_bits must lie in \[1, 52\]"),
        (1.0, 53, 3, r"resolution_bits must lie in \[1, 52\]"),
        (1.0, 8, 0, "sites must be an int >= 1"),
        (1.0, 52, 2**11 + 1, "2\\^64, above 2\\^63"),
    ],
)
def test_bad_parameters_are_refused(clip: float, bits: int, sites: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FixedPoint(clip, bits, sites)


def test_out_of_range_is_an_error_naming_the_first_bad_entry() -> None:
    fp = FixedPoint(clip=2.0, resolution_bits=10, sites=3)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"entry 2 is 2\.5, outside \[-2\.0, 2\.0\]"):
        quantize(np.array([0.0, -2.0, 2.5, -3.0]), fp, rng)
    with pytest.raises(ValueError, match="entry 1 is nan"):
        quantize(np.array([0.0, np.nan]), fp, rng)
    with pytest.raises(ValueError, match="entry 0 is -inf"):
        quantize(np.array([-np.inf]), fp, rng)
    with pytest.raises(ValueError, match="1-D"):
        quantize(np.zeros((2, 2)), fp, rng)


def test_ends_of_the_range_map_to_the_ends_of_the_grid() -> None:
    fp = FixedPoint(clip=0.3, resolution_bits=12, sites=2)
    q = quantize(np.array([-0.3, 0.3]), fp, np.random.default_rng(0))
    assert q.dtype == np.uint64
    assert q.tolist() == [0, fp.levels]


def test_rounding_is_unbiased() -> None:
    """Mean of m dequantized draws is within a CLT bound of the input.

    One draw is ``x`` plus a rounding error of mean 0 (if unbiased) and standard deviation at most
    ``1 / (2 scale)`` (a Bernoulli step of one grid unit). With ``m`` draws the mean error has
    standard deviation at most ``1 / (2 scale sqrt(m))``; 5 of those bound it except with
    probability 5.7e-7 per value (normal tail), 2.9e-5 over the 50 values (union bound).
    A coarse grid (3 bits) makes any bias large relative to the bound.
    """
    fp = FixedPoint(clip=1.0, resolution_bits=3, sites=1)
    values = np.linspace(-0.99, 0.97, 50)
    m = 4000
    draws = quantize(np.tile(values, m), fp, np.random.default_rng(20261124))
    decoded = dequantize_sum(draws, fp, 1).reshape(m, values.size)
    bound = 5.0 / (2.0 * fp.scale * np.sqrt(m))
    np.testing.assert_array_less(np.abs(decoded.mean(axis=0) - values), bound)
    # Each draw is one of the two grid points around its value.
    assert np.all(np.abs(decoded - values) < 1.0 / fp.scale)


@pytest.mark.parametrize("sites", [3, 5, 20])
def test_sum_of_quantized_vectors_is_exact_and_never_wraps(sites: int) -> None:
    fp = FixedPoint(clip=4.0, resolution_bits=16, sites=sites)
    rng = np.random.default_rng(sites)
    xs = rng.uniform(-4.0, 4.0, size=(sites, 1000))
    xs[:, :10] = 4.0  # the largest possible sum: sites * (2^b - 1) must stay below q
    xs[:, 10:20] = -4.0
    quantized = np.stack([quantize(x, fp, rng) for x in xs])
    exact = quantized.sum(axis=0)  # no reduction: the integer sum
    modular = exact & np.uint64(fp.modulus - 1)
    np.testing.assert_array_equal(modular, exact)
    assert int(exact.max()) == sites * fp.levels < fp.modulus
    decoded = dequantize_sum(modular, fp, sites)
    # Each summand is off by less than one grid step: |error| < sites / scale, deterministically.
    assert np.max(np.abs(decoded - xs.sum(axis=0))) < sites / fp.scale
    np.testing.assert_allclose(decoded[:10], 4.0 * sites, rtol=0, atol=1e-12)
    np.testing.assert_allclose(decoded[10:20], -4.0 * sites, rtol=0, atol=1e-12)


def test_dequantize_refuses_what_cannot_be_a_sum() -> None:
    fp = FixedPoint(clip=1.0, resolution_bits=8, sites=3)
    with pytest.raises(ValueError, match=r"n_summed must lie in \[1, 3\]"):
        dequantize_sum(np.zeros(2, dtype=np.uint64), fp, 4)
    with pytest.raises(ValueError, match="1-D uint64"):
        dequantize_sum(np.zeros(2, dtype=np.int64), fp, 1)
    with pytest.raises(ValueError, match="entry 1 is 511, above 2 \\* 255"):
        dequantize_sum(np.array([3, 511], dtype=np.uint64), fp, 2)
