"""Unbiased stochastic rounding of real vectors to the integers modulo ``q = 2^k``.

Secure aggregation adds vectors in ``Z_q``; CAPE needs the sum of real noise vectors (CAPE paper,
Section 3.2: "each site can employ a mapping ``map: R -> Z_lambda`` that performs a stochastic
quantization"). A value ``x`` in ``[-clip, clip]`` is shifted and scaled onto the grid
``{0, 1, ..., 2^b - 1}`` (``b`` resolution bits) and rounded to one of its two neighbouring grid
points, up with probability equal to its fractional part, so the rounding is unbiased. The modulus
leaves room for the sum of ``sites`` such values, so the sum never wraps and is recovered exactly
(DESIGN, "Finite fields"). Values outside the range are an error, never clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["MAX_MODULUS_BITS", "MAX_RESOLUTION_BITS", "FixedPoint", "dequantize_sum", "quantize"]

#: Largest modulus exponent: sums live in uint64 arrays and are read as int64 when decoded.
MAX_MODULUS_BITS = 63
#: Finest grid: float64 has a 53-bit significand, so a grid of more than 2^52 steps over the range
#: cannot be addressed exactly and its rounding would no longer be unbiased.
MAX_RESOLUTION_BITS = 52


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point encoding of ``[-clip, clip]`` with headroom for a sum over ``sites`` vectors.

    Parameters
    ----------
    clip : float
        Half-width of the accepted range, in the values' own units; finite and > 0.
    resolution_bits : int
        ``b``: the range is cut into ``2^b - 1`` steps, ``1 <= b <= 52``.
    sites : int
        Largest number of vectors that will be summed, ``>= 1``.

    Attributes
    ----------
    scale : float
        Grid points per unit, ``(2^b - 1) / (2 clip)``; one grid step is ``1 / scale``.
    levels : int
        Largest quantized value of one vector entry, ``2^b - 1``.
    modulus_bits : int
        ``k``, the smallest integer with ``2^k >= sites * 2^b``.
    modulus : int
        ``q = 2^k``.

    Raises
    ------
    ValueError
        If a parameter is out of range, or ``k > 63``.

    Notes
    -----
    A quantized entry is at most ``2^b - 1``, so a sum of ``sites`` of them is at most
    ``sites (2^b - 1) < q``: reduced modulo ``q`` it is still the integer sum.
    """

    clip: float
    resolution_bits: int
    sites: int

    def __post_init__(self) -> None:
        if isinstance(self.clip, bool) or not isinstance(self.clip, int | float):
            raise ValueError(f"clip must be a number, got {self.clip!r}")
        if not math.isfinite(self.clip) or self.clip <= 0:
            raise ValueError(f"clip must be finite and > 0, got {self.clip}")
        if isinstance(self.resolution_bits, bool) or not isinstance(self.resolution_bits, int):
            raise ValueError(f"resolution_bits must be an int, got {self.resolution_bits!r}")
        if not 1 <= self.resolution_bits <= MAX_RESOLUTION_BITS:
            raise ValueError(
                f"resolution_bits must lie in [1, {MAX_RESOLUTION_BITS}], "
                f"got {self.resolution_bits}"
            )
        if isinstance(self.sites, bool) or not isinstance(self.sites, int) or self.sites < 1:
            raise ValueError(f"sites must be an int >= 1, got {self.sites!r}")
        if self.modulus_bits > MAX_MODULUS_BITS:
            raise ValueError(
                f"sites={self.sites} with resolution_bits={self.resolution_bits} needs a "
                f"modulus of 2^{self.modulus_bits}, above 2^{MAX_MODULUS_BITS}: "
                "lower resolution_bits"
            )

    @property
    def levels(self) -> int:
        return (1 << self.resolution_bits) - 1

    @property
    def scale(self) -> float:
        return self.levels / (2.0 * float(self.clip))

    @property
    def modulus_bits(self) -> int:
        # sites * 2^b rounded up to a power of two: 2^(b + ceil(log2(sites))).
        return self.resolution_bits + (self.sites - 1).bit_length()

    @property
    def modulus(self) -> int:
        return 1 << self.modulus_bits


def _first_bad(values: NDArray[np.float64], bad: NDArray[np.bool_]) -> tuple[int, float]:
    index = int(np.flatnonzero(bad)[0])
    return index, float(values[index])


def quantize(x: ArrayLike, fp: FixedPoint, rng: np.random.Generator) -> NDArray[np.uint64]:
    """Round a real vector onto the grid of ``fp``, unbiasedly, as integers in ``[0, 2^b - 1]``.

    Computes ``u = x * scale + (2^b - 1) / 2`` (the value shifted by ``clip`` and scaled) and
    returns ``floor(u + r)`` with ``r`` uniform on ``[0, 1)``: ``floor(u)`` rounded up with
    probability ``u - floor(u)``, so that ``E[result] = u`` and ``|result - u| < 1``.

    Parameters
    ----------
    x : array-like of shape (n,), float
        Values in ``[-fp.clip, fp.clip]``.
    fp : FixedPoint
    rng : numpy.random.Generator
        Source of the rounding coins (``n`` uniform draws on ``[0, 1)``). Production passes a
        CSPRNG-seeded generator (:func:`dpmarket.common.privacy.rng.production_rng`); tests pass
        seeded ones.

    Returns
    -------
    ndarray of shape (n,), uint64
        Entries in ``[0, 2^b - 1]``; :func:`dequantize_sum` maps sums of them back.

    Raises
    ------
    ValueError
        If ``x`` is not 1-D, holds NaN or inf, or an entry lies outside ``[-clip, clip]`` (the
        message names the first offending index and value; nothing is clipped).

    Notes
    -----
    Unbiased up to the float64 rounding of ``u + r``, at most ``2^(b - 53)`` grid steps. The
    stochastic quantization is the CAPE paper's ``map`` (Section 3.2, reference [47]).
    """
    values = np.asarray(x, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {values.shape}")
    # Two reductions for the common case; a NaN makes min/max NaN and fails the test too.
    if values.size and not (values.min() >= -fp.clip and values.max() <= fp.clip):
        not_finite = ~np.isfinite(values)
        if not_finite.any():
            index, value = _first_bad(values, not_finite)
            raise ValueError(f"entry {index} is {value}; values must be finite")
        index, value = _first_bad(values, np.abs(values) > fp.clip)
        raise ValueError(
            f"entry {index} is {value!r}, outside [-{fp.clip}, {fp.clip}]; values are never clipped"
        )
    levels = float(fp.levels)
    # floor(u + r) with r ~ U[0, 1) is floor(u) + 1 exactly when r >= 1 - frac(u): rounded up
    # with probability frac(u).
    lower = values * fp.scale
    lower += levels / 2.0
    lower += rng.random(values.shape[0])
    # u can leave the range by a float rounding error at x = +-clip; keep the grid's ends. Once
    # in [0, levels], the conversion to an unsigned integer truncates, which is floor().
    np.clip(lower, 0.0, levels, out=lower)
    return lower.astype(np.uint64)


def dequantize_sum(total: ArrayLike, fp: FixedPoint, n_summed: int) -> NDArray[np.float64]:
    """Map the sum of ``n_summed`` quantized vectors (mod ``q``) back to the sum of the reals.

    Each quantized entry estimates ``x * scale + (2^b - 1) / 2``, so the sum of ``n`` of them
    estimates ``scale * sum(x) + n (2^b - 1) / 2``; this returns
    ``(total - n 2^(b-1) + n / 2) / scale``, the offset removed in exact integer arithmetic first.

    Parameters
    ----------
    total : array-like of shape (n,), uint64
        Entrywise sum of ``n_summed`` outputs of :func:`quantize`, reduced modulo ``fp.modulus``.
    fp : FixedPoint
    n_summed : int
        Number of vectors summed, ``1 <= n_summed <= fp.sites``.

    Returns
    -------
    ndarray of shape (n,), float64
        The sum of the real vectors, up to the rounding: each summand contributes an error below
        one grid step, so ``|result - sum(x)| < n_summed / fp.scale`` entrywise, and the error has
        mean 0.

    Raises
    ------
    ValueError
        If ``total`` is not a 1-D uint64 array, ``n_summed`` is out of range, or an entry is above
        ``n_summed * (2^b - 1)`` and so cannot be such a sum (e.g. a mask was not removed).
    """
    if isinstance(n_summed, bool) or not isinstance(n_summed, int):
        raise ValueError(f"n_summed must be an int, got {n_summed!r}")
    if not 1 <= n_summed <= fp.sites:
        raise ValueError(f"n_summed must lie in [1, {fp.sites}], got {n_summed}")
    totals = np.asarray(total)
    if totals.dtype != np.uint64 or totals.ndim != 1:
        raise ValueError(
            f"total must be a 1-D uint64 array, got dtype {totals.dtype} and shape {totals.shape}"
        )
    too_large = totals > np.uint64(n_summed * fp.levels)
    if too_large.any():
        index = int(np.flatnonzero(too_large)[0])
        raise ValueError(
            f"entry {index} is {int(totals[index])}, above {n_summed} * {fp.levels}: "
            f"not a sum of {n_summed} quantized vectors"
        )
    # total < q <= 2^63 fits int64, and so does total - n 2^(b-1) (|.| < 2^63).
    centred = totals.astype(np.int64)
    centred -= np.int64(n_summed << (fp.resolution_bits - 1))
    result = centred.astype(np.float64)
    result += 0.5 * n_summed
    result /= fp.scale
    return result
