"""Unbiased stochastic quantization of h1 features onto the grid S of h2 (Appendix B).

The grid is ``S = {-1, -1 + eta, ..., 1 - eta, 1}``. A value ``x`` in ``[-1, 1]`` is rounded to one
of the two grid points around it, up with probability equal to its relative distance from the lower
point, so that ``E[Q(x)] = x`` and ``|Q(x) - x| < eta``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.validation import check_matrix

__all__ = ["quantization_grid", "quantize_features", "stochastic_quantize"]

_GRID_TOLERANCE = 1e-9
_RANGE_TOLERANCE = 1e-12


def _grid_intervals(eta: float) -> int:
    """Return ``2 / eta`` as an int, or raise ``ValueError`` naming the bad ``eta``."""
    try:
        eta_f = float(eta)
    except (TypeError, ValueError):
        raise ValueError(f"eta must be a number in (0, 1], got {eta!r}") from None
    if not math.isfinite(eta_f) or not 0.0 < eta_f <= 1.0:
        raise ValueError(f"eta must lie in (0, 1], got {eta}")
    ratio = 2.0 / eta_f
    n_intervals = round(ratio)
    if abs(ratio - n_intervals) > _GRID_TOLERANCE:
        raise ValueError(f"2 / eta must be an integer, got eta={eta} (2 / eta = {ratio})")
    return int(n_intervals)


def quantization_grid(eta: float) -> NDArray[np.float64]:
    """Return the quantization grid ``S = {-1, -1 + eta, ..., 1}`` of h2.

    Parameters
    ----------
    eta : float
        Grid spacing, ``0 < eta <= 1`` with ``2 / eta`` an integer (within 1e-9).

    Returns
    -------
    ndarray of shape (2 / eta + 1,), float64
        Increasing grid points; the first is exactly -1, the last exactly 1, and (``2 / eta`` being
        an integer) the grid is symmetric about 0.

    Raises
    ------
    ValueError
        If ``eta`` is not in ``(0, 1]`` or ``2 / eta`` is not an integer.

    References
    ----------
    Summarization paper, Appendix B (definition of ``S``) and Algorithm 2, step 3.
    """
    n_intervals = _grid_intervals(eta)
    return np.linspace(-1.0, 1.0, n_intervals + 1, dtype=np.float64)


def _quantize_checked(
    x: NDArray[np.float64], n_intervals: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Quantize finite values already clipped to ``[-1, 1]``; returns points of the grid."""
    grid = np.linspace(-1.0, 1.0, n_intervals + 1, dtype=np.float64)
    eta = 2.0 / n_intervals
    # Index k of the grid point just below x (Appendix B: k = floor((x + 1) / eta)); x = 1 uses the
    # last interval so that k + 1 is still a grid index.
    k = np.clip(np.floor((x + 1.0) / eta).astype(np.int64), 0, n_intervals - 1)
    p_up = np.clip((x - grid[k]) / eta, 0.0, 1.0)
    up = rng.random(size=x.shape) < p_up
    return grid[k + up.astype(np.int64)]


def stochastic_quantize(
    values: ArrayLike, eta: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Round each value in ``[-1, 1]`` to one of its two neighbouring grid points, unbiasedly.

    With ``k = floor((x + 1) / eta)``, ``Q(x) = -1 + k eta`` with probability
    ``((k + 1) eta - 1 - x) / eta`` and ``-1 + (k + 1) eta`` with probability
    ``(x + 1 - k eta) / eta``, so ``E[Q(x)] = x``. Draws are independent across entries.

    Parameters
    ----------
    values : array-like of any shape
        Values in ``[-1, 1]``; an excess of at most 1e-12 (floating-point rounding) is clipped.
    eta : float
        Grid spacing, ``0 < eta <= 1`` with ``2 / eta`` an integer.
    rng : numpy.random.Generator
        Source of the rounding coins (one uniform draw per entry).

    Returns
    -------
    ndarray of the shape of ``values``, float64
        Every entry is an element of :func:`quantization_grid` ``(eta)`` and lies strictly within
        ``eta`` of its input (or equals it when the input is a grid point).

    Raises
    ------
    ValueError
        If ``eta`` is invalid, or ``values`` holds NaN, inf, non-real numbers, or a value outside
        ``[-1 - 1e-12, 1 + 1e-12]``.

    References
    ----------
    Summarization paper, Appendix B, Eq. (5) (which writes ``k epsilon`` where ``k eta`` is meant).
    """
    n_intervals = _grid_intervals(eta)
    arr = np.asarray(values)
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"values must hold real numbers, got dtype {arr.dtype}")
    x = np.array(arr, dtype=np.float64)
    finite = np.isfinite(x)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"values hold {int((~finite).sum())} NaN or inf value(s), first {x[idx]} at index {idx}"
        )
    outside = np.abs(x) > 1.0 + _RANGE_TOLERANCE
    if outside.any():
        idx = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"values must lie in [-1, 1], got {int(outside.sum())} outside, first {x[idx]!r} "
            f"at index {idx}"
        )
    np.clip(x, -1.0, 1.0, out=x)
    return _quantize_checked(x, n_intervals, rng)


def quantize_features(
    features: ArrayLike, eta: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Quantize h1 features: ``stochastic_quantize(sqrt(d / 2) * features, eta, rng)``.

    h1 features lie in ``[-sqrt(2/d), sqrt(2/d)]``; scaling by ``sqrt(d/2)`` maps them to
    ``[-1, 1]`` before rounding to the grid, giving the data set ``D_Q`` of Algorithm 2.

    Parameters
    ----------
    features : array-like of shape (n_points, d)
        h1 features (float32 or float64), entries in ``[-sqrt(2/d), sqrt(2/d)]``.
    eta : float
        Grid spacing, ``0 < eta <= 1`` with ``2 / eta`` an integer.
    rng : numpy.random.Generator
        Source of the rounding coins.

    Returns
    -------
    ndarray of shape (n_points, d), float64
        Entries in :func:`quantization_grid` ``(eta)``.

    Raises
    ------
    ValueError
        If ``features`` is not a non-empty 2-D finite array, if a scaled entry lies outside
        ``[-1, 1]`` by more than the rounding tolerance, or if ``eta`` is invalid.

    Notes
    -----
    The tolerance on the scaled range is ``max(1e-12, 8 * finfo(dtype).eps)`` of the input dtype
    (about 1e-6 for float32) and the excess is clipped: float32 features computed as
    ``sqrt(2/d) * cos(.)`` can exceed ``sqrt(2/d)`` by a rounding error, which is not a caller bug.
    Quantization acts on each point separately, so replacing one point of the input changes one
    row of the output only (the basis of the sensitivity argument in
    :mod:`dpmarket.common.summarization.mwem`).

    References
    ----------
    Summarization paper, Appendix B (``D_Q = {Q(sqrt(d/2) v_i)}``) and Algorithm 2, step 3.
    """
    n_intervals = _grid_intervals(eta)
    raw = np.asarray(features)
    x = check_matrix(raw, "features")
    in_dtype = raw.dtype if np.issubdtype(raw.dtype, np.floating) else np.dtype(np.float64)
    tol = max(_RANGE_TOLERANCE, 8.0 * float(np.finfo(in_dtype).eps))
    d = x.shape[1]
    scaled = np.multiply(math.sqrt(d / 2.0), x, dtype=np.float64)
    outside = np.abs(scaled) > 1.0 + tol
    if outside.any():
        row, col = (int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"features must lie in [-sqrt(2/d), sqrt(2/d)] = [-{math.sqrt(2.0 / d)}, "
            f"{math.sqrt(2.0 / d)}] for d={d}, got {x[row, col]!r} at row {row}, column {col}"
        )
    np.clip(scaled, -1.0, 1.0, out=scaled)
    return _quantize_checked(scaled, n_intervals, rng)
