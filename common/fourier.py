"""Cosines and sines of random Fourier projections, evaluated in float32.

Random Fourier features (the summarization's h1, :mod:`dpmarket.common.summarization.rff`; the M2M
RFF sketch, :class:`dpmarket.common.sketches.feature_maps.RFFMap`) spend almost all their time in
``cos`` and ``sin``: measured here, 17-18 ns per float64 value against 1.0-1.3 ns per float32 value
(numpy's SIMD kernels). The projections ``omega . x`` stay in float64, are reduced to ``[-pi, pi]``
in float64 and rounded to float32 (error at most ``pi * 2**-24 ~ 1.9e-7``). The reduction runs on
every block, whatever its angles: a path chosen from the angles (say, rounding them directly when
all are small) would make the time of a step on an owner's rows depend on their values, which a
curator can read for free (an open that charges nothing). The cosine and sine are then off by
that plus numpy's float32 error (a few units in the last place): at most about 4e-6 in absolute
terms, far below the Monte Carlo error of any feature map (``1/sqrt(d)``) and, summed over rows,
below any release's noise. Angles below :data:`TINY_ANGLE` are taken as 0, so that no float32
value here is subnormal (a CPU takes many times longer on such values; owners also refuse
curator numbers below :data:`dpmarket.common.validation.PARAMETER_FLOOR`).

Every function here is total: an angle that is NaN, infinite or beyond :data:`ANGLE_LIMIT` in
magnitude is taken as 0 (cosine 1, sine 0) by a select that costs the same for every value, so no
input makes a feature NaN or raises. Beyond the limit float64 no longer holds an angle to the
accuracy above, and without the rule a huge finite angle reduced in float64 is still too large for
float32 (an infinite float32 angle, a NaN cosine): a feature that is NaN for some rows and finite
for others would make a computation on an owner's rows fail or succeed with the rows. Owners refuse
parameters that can reach the limit on their public bounds (:func:`check_angle_bound`); the rule
covers whatever is left (a table without public bounds, any map built elsewhere).

Nothing here bounds a sensitivity by itself: callers that release sums of these values enforce
their declared norms on the float32 values (h1 clips every value to ``[-1, 1]``; the RFF sketch
scales each row into its L1 and L2 bounds, computed in float64).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

TWO_PI = 2.0 * math.pi

#: Smallest non-zero angle magnitude (rad) evaluated: ``2**-100`` (7.9e-31); a smaller one is
#: taken as 0 (its cosine is 1 and its sine within 7.9e-31 of 0 in float32 anyway). Its float32
#: cast would be subnormal (below ``1.2e-38``) or underflow, slow paths taken only for some rows.
TINY_ANGLE = 2.0**-100

#: Largest angle magnitude (rad) evaluated; a larger, NaN or infinite angle is taken as 0. ``2**40``
#: (1.1e12): a float64 angle ``t`` computed as ``omega . x + phase`` over ``n`` terms is off by at
#: most ``(n + 1) 2**-53`` times ``sum_j |omega_j x_j| + |phase|`` (each product and sum rounds
#: once), and its float64 reduction (``t - 2 pi round(t / 2 pi)``, with ``2 pi`` itself rounded) by
#: about ``2**-52 |t|`` more: at most ``(n + 3) 2**-13 = (n + 3) 1.2e-4`` rad at the limit, below
#: the Monte Carlo error ``1 / sqrt(2048) = 0.022`` of the largest random feature map a curator
#: allows for up to 175 features, and reduced angles of at most ``pi + 2**-12`` whose float32 cast
#: is always finite (the cast fails from about ``1e54`` on). Honest parameters stay far inside it:
#: h1's frequencies are ``N(0, 2 gamma)`` and its phases lie in ``[0, 2 pi)``, so at the largest
#: ``gamma`` a consumer may ask (1e6) a row's ``sum_j |omega_j| b_j`` is at most about
#: ``5 sqrt(2 gamma) sum_j b_j = 7,100 sum_j b_j`` over 2,048 rows: beyond the limit only when the
#: public bounds ``b_j`` sum to 1.5e8 or more, and the curator's kernel-width check refuses that
#: ``gamma`` unless the validation points' median distance is below 4e-3 (a median kernel value
#: of at least 1e-6), so only for data packed at a scale 1e10 times smaller than its bounds.
ANGLE_LIMIT = 2.0**40


def angle_bound(
    omega: NDArray[np.float64], phase: NDArray[np.float64] | None, magnitudes: NDArray[np.float64]
) -> NDArray[np.float64]:
    """The largest ``|omega_i . x + phase_i|`` over every ``x`` with ``|x_j| <= magnitudes_j``.

    Parameters
    ----------
    omega : ndarray of shape (d, n), float64
        Frequencies, one row per feature.
    phase : ndarray of shape (d,), float64, or None
        Phases (None: 0).
    magnitudes : ndarray of shape (n,), float64
        The largest ``|x_j|`` each input column may take, >= 0 (an owner's public bounds:
        ``max(|low_j|, |high_j|)``).

    Returns
    -------
    ndarray of shape (d,), float64
        ``sum_j |omega_ij| magnitudes_j + |phase_i|`` (the triangle inequality; attained at a
        corner of the box when the bounds are symmetric). ``inf`` where it overflows.
    """
    with np.errstate(over="ignore"):
        bound = np.abs(omega) @ magnitudes
        if phase is not None:
            bound = bound + np.abs(phase)
    return np.where(np.isnan(bound), np.inf, bound)


def check_angle_bound(
    omega: NDArray[np.float64],
    phase: NDArray[np.float64] | None,
    magnitudes: NDArray[np.float64] | None,
    what: str,
) -> None:
    """Refuse a feature map whose angles can exceed :data:`ANGLE_LIMIT` on inputs within
    ``magnitudes``, on these public inputs alone (no data is read).

    Parameters
    ----------
    omega, phase
        As :func:`angle_bound`.
    magnitudes : ndarray of shape (n,), float64, or None
        The inputs' public magnitudes; None when there are none: the bound is then taken at
        magnitude 1 per column (``sum_j |omega_ij| + |phase_i|``), which refuses frequencies and
        phases too large for data of any scale; angles that larger data still takes beyond the
        limit are taken as 0 (:func:`reduced_angles`).
    what : str
        Names the map in the message (e.g. ``"h1"``).

    Raises
    ------
    ValueError
        If some row's bound exceeds :data:`ANGLE_LIMIT` (the message names the row and its
        bound, and what to do).
    """
    n = omega.shape[1]
    scale = np.ones(n) if magnitudes is None else np.asarray(magnitudes, dtype=np.float64)
    bound = angle_bound(omega, phase, scale)
    if bound.size == 0 or float(bound.max()) <= ANGLE_LIMIT:
        return
    row = int(np.argmax(bound))
    over = "the inputs' public bounds" if magnitudes is not None else "inputs of magnitude 1"
    raise ValueError(
        f"{what} row {row} reaches an angle of {float(bound[row]):.3g} rad on {over}, beyond "
        f"the limit of {ANGLE_LIMIT:.3g} rad (|omega|_1 * max|x| + |phase|): such angles carry "
        "no accuracy in float64; draw frequencies for the data's scale (a smaller gamma) and "
        "phases in [0, 2 pi)"
    )


def reduced_angles(t: NDArray[np.float64]) -> NDArray[np.float32]:
    """The angles ``t`` reduced to ``[-pi, pi]`` in float64 (``t - 2 pi round(t / 2 pi)``) and
    cast to float32, with 0 where ``t`` is NaN, infinite, beyond :data:`ANGLE_LIMIT` or below
    :data:`TINY_ANGLE` in magnitude.

    Every value takes the same operations whatever the others hold: no branch reads the
    angles (they come from an owner's rows, and a step that took a faster path for some
    tables would tell a curator about them by its time), and no angle is left subnormal for
    the float32 cast and kernels (module docstring).

    Parameters
    ----------
    t : ndarray of float64, any shape
        Angles in radians. May be overwritten (used as scratch).

    Returns
    -------
    ndarray of float32, the shape of ``t``
        Finite angles in ``[-pi - 2**-12, pi + 2**-12]`` with the cosine and sine of ``t`` to
        within 3.8e-6 (module docstring) where ``|t| <= ANGLE_LIMIT``.
    """
    if t.size == 0:
        return t.astype(np.float32)
    size = np.abs(t)
    # NaN, inf, beyond the limit or tiny: the angle 0 (a select, the same work for every value).
    keep = (size <= ANGLE_LIMIT) & (size >= TINY_ANGLE)
    np.copyto(t, np.where(keep, t, 0.0))
    turns = np.rint(t * (1.0 / TWO_PI))
    turns *= TWO_PI
    t -= turns
    return t.astype(np.float32)


def cos32(t: NDArray[np.float64]) -> NDArray[np.float32]:
    """``cos(t)`` in float32, clipped to ``[-1, 1]``; ``t`` (float64) is overwritten.

    Returns
    -------
    ndarray of float32, the shape of ``t``
        Every value in ``[-1, 1]`` exactly (the clip makes the bound hold whatever the float32
        kernel's rounding), within 4e-6 of the exact cosine (module docstring).
    """
    angles = reduced_angles(t)
    np.cos(angles, out=angles)
    return np.clip(angles, -1.0, 1.0, out=angles)


def cos_sin32(t: NDArray[np.float64]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """``cos(t)`` and ``sin(t)`` in float32; ``t`` (float64) is overwritten.

    Returns
    -------
    (cos, sin) : two ndarrays of float32, the shape of ``t``
        Each within 4e-6 of the exact value (module docstring); not clipped.
    """
    angles = reduced_angles(t)
    return np.cos(angles), np.sin(angles, out=angles)
