"""Algorithms 1 and 2 of CAPE as site-side and aggregator-side steps on arrays.

One CAPE round, for sites ``s = 1..S`` holding a statistic ``f_s`` (an array of ``m`` values):

1. site: ``e_hat_s = draw_noise_share(tau_s, m, noise)`` (Algorithm 1, step 2);
2. aggregator: ``total = sum_s e_hat_s`` (:func:`sum_noise_shares`; in production the sum goes
   through secure aggregation, ``dpmarket.common.secagg``, so the aggregator learns only the sum);
3. site: ``e_s = zero_sum_correction(e_hat_s, total, S)`` (Algorithm 1, step 5);
4. site: ``a_hat_s = cape_release(f_s, e_s, tau_g, noise)`` with ``tau_g^2 = tau_s^2 / S``
   (Algorithm 2, steps 4-5); only ``a_hat_s`` leaves the site;
5. aggregator: ``a_cape = cape_average(releases)`` (Algorithm 2, step 7).

Dropouts. The zero-sum property must hold over exactly the sites whose releases are averaged:
``sum_s e_s = 0`` only over the sites that contributed to ``total``. If a site is lost after the
noise round (steps 1-3) and before its release (step 4), the caller must rerun steps 1-3 without
it (fresh ``e_hat_s`` for the remaining sites; the old shares are discarded, never reused), or
report the larger variance: averaging the survivors of an old round leaves ``-e_lost / S`` in the
estimate, noise that ``tau_pool`` does not include and :func:`partial_average_variance` does.
:func:`check_zero_sum` verifies the property for a set of shares (for tests and the
in-process drivers; the aggregator never sees ``e_s``).

Remark 3 (unequal sizes): pass ``weight = w_s = N_s / N`` (:func:`dpmarket.common.cape.privacy.
remark3_weights`) to :func:`secure_aggregation_input` and :func:`zero_sum_correction` and the same
weights to :func:`cape_average`; then ``sum_s w_s e_s = 0``.

References
----------
CAPE paper, Algorithm 1 (zero-sum noise), Algorithm 2 (CAPE), equations (2)-(3), Lemma 1,
Proposition 1, Remark 3.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_epsilon, check_positive_int

__all__ = [
    "CapePlan",
    "UniformNoisePlan",
    "cape_average",
    "cape_release",
    "check_zero_sum",
    "conv_release",
    "draw_gaussian",
    "draw_noise_share",
    "partial_average_variance",
    "secure_aggregation_input",
    "sum_noise_shares",
    "variances",
    "zero_sum_correction",
]

#: Relative tolerance of :func:`check_zero_sum`: ``|sum_s w_s e_s| <= ZERO_SUM_RTOL * S *
#: max_s |w_s e_hat_s|`` entrywise (float64 rounding of a sum of ``S`` terms and a division).
ZERO_SUM_RTOL = 1e-12


@dataclass(frozen=True)
class CapePlan(ABC):
    """The public plan of one CAPE noise round: the shape every CAPE job's plan shares.

    Every party computes a job's plan from public values (the spec, the sites' signed row
    counts, ``S_C``: :func:`dpmarket.common.cape.agreement.plan_for`), so what a site signs and
    checks before planning (:func:`dpmarket.common.cape.agreement.plan_statement`) is the same
    for every job: its spec's digest, the sites, ``S_C`` and the counts. The jobs' plans add
    their own calibration: :class:`dpmarket.common.cape.capefm.CapeFMPlan`,
    :class:`dpmarket.common.cape.mean.CapeMeanPlan` (both one release) and
    :class:`dpmarket.common.cape.dpgd.CapeTrainingPlan` (one release per iteration, the noise
    of every iteration the plan covers drawn in one round).

    Attributes
    ----------
    sizes : tuple of int
        ``N_s`` per site, in site order (the sites sorted by name).
    weights : ndarray of shape (S,)
        Remark 3's ``w_s = N_s / N``.
    weighted : bool
        Whether the sizes differ (then the noise round sums ``w_s e_hat_s``).
    colluders : int
        ``S_C``.
    epsilon, delta : float
        Each site's guarantee against the aggregator and ``S_C`` colluders (a training's: over
        all its iterations).
    delta_exact : float
        Exact delta at ``epsilon``.
    delta_theorem1 : float or None
        Theorem 1's delta at ``epsilon`` (``None`` where it does not apply).
    """

    sizes: tuple[int, ...]
    weights: NDArray[np.float64]
    weighted: bool
    colluders: int
    epsilon: float
    delta: float
    delta_exact: float
    delta_theorem1: float | None

    @property
    def sites(self) -> int:
        """``S``: the sites of the noise round, whose releases are averaged."""
        return len(self.sizes)

    @property
    @abstractmethod
    def size(self) -> int:
        """Length ``m`` of one released vector."""

    @property
    def round_length(self) -> int:
        """Length of the noise round's vector: one release's, ``m`` (a training's covers
        several iterations)."""
        return self.size

    @abstractmethod
    def entry_scales(self, site: int) -> NDArray[np.float64]:
        """Shape (m,): ``tau_s`` per entry of ``site``'s release."""

    def site_weight(self, site: int) -> float | None:
        """``w_s`` of ``site`` when the sizes differ, else ``None`` (the unweighted round)."""
        return float(self.weights[site]) if self.weighted else None

    def noise_share(self, site: int, noise: NoiseSource) -> NDArray[np.float64]:
        """Site side, Algorithm 1 step 2 for the plan's noise round: ``e_hat_s ~ N(0,
        tau_s^2)`` per entry (:func:`draw_noise_share`), kept at the site.

        Returns
        -------
        ndarray of shape (m,), float64
            Its (weighted) flattening is the site's input of the round.
        """
        return draw_noise_share(self.entry_scales(site), self.size, noise)


@dataclass(frozen=True)
class UniformNoisePlan(CapePlan):
    """A plan whose site adds noise of one standard deviation to every entry of its release
    (the CAPE mean; gradient descent, per parameter and iteration).

    Attributes
    ----------
    site_scales : tuple of float
        ``tau_s`` per site.
    """

    site_scales: tuple[float, ...]

    def entry_scales(self, site: int) -> NDArray[np.float64]:
        """Shape (m,): ``tau_s`` of ``site`` on every entry."""
        return np.full(self.size, self.site_scales[site])

    def aggregator_std(self, released: Sequence[int] | None = None) -> float:
        """Noise standard deviation of every entry of the averaged release.

        With every site released, Lemma 1's ``sqrt(sum_s w_s^2 tau_s^2 / S)``; with only the
        sites ``released`` (indices) averaged, the larger value of
        :func:`partial_average_variance` (the lost sites' ``e_s`` remain).
        """
        kept = range(self.sites) if released is None else released
        return math.sqrt(float(partial_average_variance(self.weights, self.site_scales, kept)))


def variances(tau: float, sites: int) -> tuple[float, float]:
    """Variances of the two CAPE noise terms for site noise ``tau``.

    Parameters
    ----------
    tau : float
        Site noise standard deviation (``e_hat_s ~ N(0, tau^2)``), ``> 0``.
    sites : int
        ``S >= 2``.

    Returns
    -------
    tau_e2 : float
        ``Var e_s = (1 - 1/S) tau^2`` (equation (2)).
    tau_g2 : float
        ``Var g_s = tau^2 / S`` (equation (3)).

    Raises
    ------
    ValueError
        If ``tau`` is not finite and ``> 0`` or ``sites < 2``.

    Notes
    -----
    ``e_s = e_hat_s - (1/S) sum_r e_hat_r`` has variance ``tau^2 - 2 tau^2 / S + S tau^2 / S^2 =
    (1 - 1/S) tau^2``. Each release has variance ``tau_e2 + tau_g2 = tau^2``, the local
    mechanism's; the average of ``S`` releases keeps only ``(1/S) sum_s g_s``, of variance
    ``tau^2 / S^2 = tau_pool^2`` (Lemma 1), while averaging ``S`` independent local releases
    ("conv") has ``tau^2 / S``: ``S`` times more (Proposition 1).
    """
    t = check_epsilon(tau, "tau")
    s = check_positive_int(sites, "sites")
    if s < 2:
        raise ValueError(f"CAPE needs at least 2 sites, got sites={sites}")
    return (1.0 - 1.0 / s) * t * t, t * t / s


def _scales(tau: float | ArrayLike, size: int) -> NDArray[np.float64]:
    n = check_positive_int(size, "size")
    arr = np.asarray(tau, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    elif arr.shape != (n,):
        raise ValueError(f"tau must be a scalar or have shape ({n},), got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"every noise scale must be finite and > 0, got tau[{j}] = {arr[j]}")
    return arr


def draw_gaussian(tau: float | ArrayLike, size: int, noise: NoiseSource) -> NDArray[np.float64]:
    """Independent ``N(0, tau_i^2)`` draws, one ``noise.gaussian`` call per run of equal scales.

    Parameters
    ----------
    tau : float or array-like of shape (size,)
        Standard deviation of every entry, or per entry (e.g. one value per functional-mechanism
        order, repeated over that order's entries). Each ``> 0``.
    size : int
        Number of entries, ``>= 1``.
    noise : NoiseSource
        Where the draws come from (:class:`~dpmarket.common.privacy.noise.OpenDPNoise` in
        production).

    Returns
    -------
    ndarray of shape (size,), float64

    Raises
    ------
    ValueError
        If a scale is not finite and ``> 0`` or ``tau`` has the wrong shape.

    Notes
    -----
    Order of draws: the entries are split into maximal runs of consecutive equal scales and each
    run is one ``noise.gaussian(scale, run_length)`` call, first run first. A run of equal
    scales is drawn at its exact scale (no rescaling of unit draws), so OpenDP's exact rounding
    applies to every value.
    """
    scales = _scales(tau, size)
    out = np.empty(scales.shape[0], dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, scales[1:] != scales[:-1]])
    ends = np.r_[starts[1:], scales.shape[0]]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        out[a:b] = noise.gaussian(float(scales[a]), b - a)
    return out


def draw_noise_share(
    tau_s: float | ArrayLike, size: int, noise: NoiseSource
) -> NDArray[np.float64]:
    """Site side, Algorithm 1 step 2: ``e_hat_s ~ N(0, tau_s^2 I)``.

    Parameters
    ----------
    tau_s : float or array-like of shape (size,)
        The site's noise standard deviation (per entry if an array), ``> 0``, in the statistic's
        units (:func:`dpmarket.common.cape.privacy.calibrate_tau`).
    size : int
        Length of the (flattened) statistic.
    noise : NoiseSource

    Returns
    -------
    ndarray of shape (size,), float64
        ``e_hat_s``. It stays at the site; only its (weighted) sum leaves, through secure
        aggregation.

    Raises
    ------
    ValueError
        As :func:`draw_gaussian`.
    """
    return draw_gaussian(tau_s, size, noise)


def secure_aggregation_input(
    e_hat_s: ArrayLike, weight: float | None = None
) -> NDArray[np.float64]:
    """Site side: what the site feeds into secure aggregation, ``e_hat_s`` or ``w_s e_hat_s``.

    Parameters
    ----------
    e_hat_s : array-like of shape (m,)
    weight : float, optional
        Remark 3's ``w_s = N_s / N``; ``None`` for the symmetric setting.

    Returns
    -------
    ndarray of shape (m,), float64

    Raises
    ------
    ValueError
        If ``e_hat_s`` is not a finite 1-D array or ``weight`` is not finite and ``> 0``.
    """
    e = _check_vector(e_hat_s, "e_hat_s")
    if weight is None:
        return e
    return check_epsilon(weight, "weight") * e


def sum_noise_shares(shares: Sequence[ArrayLike]) -> NDArray[np.float64]:
    """Aggregator side, Algorithm 1 step 3 (in process): ``sum_s`` of the sites' inputs.

    In production this sum is computed by secure aggregation (``dpmarket.common.secagg``) so that
    the aggregator learns nothing else; this function is its in-process stand-in.

    Parameters
    ----------
    shares : sequence of array-like, each of shape (m,)
        :func:`secure_aggregation_input` of every participating site.

    Returns
    -------
    ndarray of shape (m,), float64
        The sum, accumulated in the order given (site order).

    Raises
    ------
    ValueError
        If ``shares`` is empty or the shapes differ.
    """
    arrays = [_check_vector(x, f"shares[{j}]") for j, x in enumerate(shares)]
    if not arrays:
        raise ValueError("shares is empty: at least one site must contribute")
    m = arrays[0].shape[0]
    total = np.zeros(m, dtype=np.float64)
    for j, a in enumerate(arrays):
        if a.shape != (m,):
            raise ValueError(f"shares[{j}] must have shape ({m},), got {a.shape}")
        total += a
    return total


def zero_sum_correction(
    e_hat_s: ArrayLike, total: ArrayLike, sites: int, *, weight: float | None = None
) -> NDArray[np.float64]:
    """Site side, Algorithm 1 step 5: ``e_s = e_hat_s - total / S``.

    Parameters
    ----------
    e_hat_s : array-like of shape (m,)
        This site's share from :func:`draw_noise_share`.
    total : array-like of shape (m,)
        The broadcast sum of the inputs of *the same* ``sites`` sites (``sum_r e_hat_r``, or
        ``sum_r w_r e_hat_r`` with weights).
    sites : int
        Number of sites ``S >= 2`` that contributed to ``total``; every one of them must release.
    weight : float, optional
        Remark 3's ``w_s``: then ``e_s = e_hat_s - total / (S w_s)``, so ``sum_s w_s e_s = 0``.

    Returns
    -------
    ndarray of shape (m,), float64
        ``e_s``, with ``sum_s e_s = 0`` (``sum_s w_s e_s = 0``) over the contributing sites.

    Raises
    ------
    ValueError
        If the shapes differ, a value is not finite, ``sites < 2`` or ``weight`` is not ``> 0``.
    """
    e = _check_vector(e_hat_s, "e_hat_s")
    t = _check_vector(total, "total")
    if t.shape != e.shape:
        raise ValueError(f"total must have the shape of e_hat_s {e.shape}, got {t.shape}")
    s = check_positive_int(sites, "sites")
    if s < 2:
        raise ValueError(f"CAPE needs at least 2 sites, got sites={sites}")
    divisor = float(s) if weight is None else s * check_epsilon(weight, "weight")
    out: NDArray[np.float64] = e - t / divisor
    return out


def cape_release(
    f_s: ArrayLike, e_s: ArrayLike, tau_g: float | ArrayLike, noise: NoiseSource
) -> NDArray[np.float64]:
    """Site side, Algorithm 2 steps 4-5: ``a_hat_s = f(x_s) + e_s + g_s``, ``g_s ~ N(0, tau_g^2)``.

    Parameters
    ----------
    f_s : array-like of shape (m,)
        The site's statistic (e.g. packed functional-mechanism coefficients), float.
    e_s : array-like of shape (m,)
        From :func:`zero_sum_correction`.
    tau_g : float or array-like of shape (m,)
        ``tau_s / sqrt(S)`` (equation (3)), per entry if an array.
    noise : NoiseSource
        ``g_s`` is drawn by :func:`draw_gaussian` (one call per run of equal scales).

    Returns
    -------
    ndarray of shape (m,), float64
        ``a_hat_s``: the only value that leaves the site.

    Raises
    ------
    ValueError
        If the shapes differ or a value is not finite.

    Notes
    -----
    Privacy (Theorem 1, :func:`dpmarket.common.cape.privacy.theorem1_delta`): with ``f_s`` of L2
    sensitivity ``Delta`` and ``tau_g = tau / sqrt(S)``, the release is as private as a Gaussian
    mechanism with ratio ``sigma_z = (Delta / tau) sqrt(F)`` against an adversary of the
    aggregator and ``S_C`` sites.
    """
    f = _check_vector(f_s, "f_s")
    e = _check_vector(e_s, "e_s")
    if e.shape != f.shape:
        raise ValueError(f"e_s must have the shape of f_s {f.shape}, got {e.shape}")
    g = draw_gaussian(tau_g, f.shape[0], noise)
    out: NDArray[np.float64] = f + e + g
    return out


def conv_release(
    f_s: ArrayLike, tau_s: float | ArrayLike, noise: NoiseSource
) -> NDArray[np.float64]:
    """Site side of the conventional scheme ("conv"): ``f(x_s) + N(0, tau_s^2)``.

    Parameters
    ----------
    f_s : array-like of shape (m,)
    tau_s : float or array-like of shape (m,)
        The local Gaussian mechanism's noise (each site alone ``(epsilon, delta)``-DP).
    noise : NoiseSource

    Returns
    -------
    ndarray of shape (m,), float64

    Raises
    ------
    ValueError
        If a value is not finite or a scale is not ``> 0``.

    References
    ----------
    CAPE paper, Section 3.1 and Section 4.4 ("Conventional Approach").
    """
    f = _check_vector(f_s, "f_s")
    out: NDArray[np.float64] = f + draw_gaussian(tau_s, f.shape[0], noise)
    return out


def cape_average(
    releases: Sequence[ArrayLike], weights: Sequence[float] | ArrayLike | None = None
) -> NDArray[np.float64]:
    """Aggregator side, Algorithm 2 step 7: ``a_cape = (1/S) sum_s a_hat_s`` (or ``sum_s w_s
    a_hat_s``).

    Parameters
    ----------
    releases : sequence of array-like, each of shape (m,)
        The ``a_hat_s`` of exactly the sites whose shares formed the noise round's total.
    weights : array-like of shape (S,), optional
        Remark 3's ``w_s`` (summing to 1); default ``1/S`` each.

    Returns
    -------
    ndarray of shape (m,), float64
        Accumulated in site order.

    Raises
    ------
    ValueError
        If ``releases`` is empty, shapes differ, a value is not finite, or ``weights`` has the
        wrong length, a weight is not ``> 0``, or they do not sum to 1 (relative 1e-9).
    """
    arrays = [_check_vector(x, f"releases[{j}]") for j, x in enumerate(releases)]
    if not arrays:
        raise ValueError("releases is empty: at least one site must release")
    s = len(arrays)
    m = arrays[0].shape[0]
    if weights is None:
        w = np.full(s, 1.0 / s)
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (s,):
            raise ValueError(f"weights must have shape ({s},), got {w.shape}")
        if not (np.isfinite(w).all() and (w > 0).all()):
            raise ValueError(f"every weight must be finite and > 0, got {w.tolist()}")
        if not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
            raise ValueError(f"weights must sum to 1, got sum {float(w.sum())}")
    out = np.zeros(m, dtype=np.float64)
    for j, (a, wj) in enumerate(zip(arrays, w.tolist(), strict=True)):
        if a.shape != (m,):
            raise ValueError(f"releases[{j}] must have shape ({m},), got {a.shape}")
        out += wj * a
    return out


def partial_average_variance(
    weights: ArrayLike, taus: ArrayLike, released: Sequence[int]
) -> NDArray[np.float64]:
    """Per-entry noise variance of the average of only some releases of one noise round.

    The noise round ran over ``S`` sites with weights ``w`` (``1/S`` each when the sizes are
    equal), but only the sites ``R`` released (the others ``L`` were lost between the noise round
    and their release); the aggregator averages ``sum_{s in R} v_s a_hat_s`` with ``v_s = w_s /
    W_R``, ``W_R = sum_{s in R} w_s``.

    Derivation. ``w_s e_s = w_s e_hat_s - (1/S) sum_k w_k e_hat_k`` (:func:`zero_sum_correction`),
    so ``sum_{s in R} w_s e_s = -sum_{l in L} w_l e_l = -sum_k c_k w_k e_hat_k`` with ``c_k =
    [k in L] - |L| / S``. The ``e_hat_k`` (variance ``tau_k^2``) and the ``g_s`` (variance
    ``tau_s^2 / S``) are independent, hence

        Var = (sum_k c_k^2 w_k^2 tau_k^2 + sum_{s in R} w_s^2 tau_s^2 / S) / W_R^2.

    With every site released (``L`` empty) this is Lemma 1's ``sum_s w_s^2 tau_s^2 / S``.

    Parameters
    ----------
    weights : array-like of shape (S,)
        The round's weights (summing to 1).
    taus : array-like of shape (S,) or (S, m)
        ``tau_s`` of each site, per entry if 2-D.
    released : sequence of int
        Indices of the sites that released (distinct, at least one).

    Returns
    -------
    ndarray of shape () or (m,), float64
        The variance of each entry of the average.

    Raises
    ------
    ValueError
        For mismatched shapes, weights not positive, or ``released`` empty, repeated or out of
        range.
    """
    w = np.asarray(weights, dtype=np.float64)
    t = np.asarray(taus, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] < 2 or t.shape[:1] != w.shape or t.ndim > 2:
        raise ValueError(
            f"weights (S,) and taus (S,) or (S, m) must match, got {w.shape} and {t.shape}"
        )
    if not (np.isfinite(w).all() and (w > 0).all() and np.isfinite(t).all() and (t >= 0).all()):
        raise ValueError("weights must be finite and > 0 and taus finite and >= 0")
    s = w.shape[0]
    kept = sorted(set(int(r) for r in released))
    if not kept or len(kept) != len(released) or kept[0] < 0 or kept[-1] >= s:
        raise ValueError(f"released must hold distinct site indices in [0, {s}), got {released}")
    inside = np.zeros(s, dtype=bool)
    inside[kept] = True
    lost = s - len(kept)
    c = (~inside).astype(np.float64) - lost / s
    wt2 = (w.reshape((s,) + (1,) * (t.ndim - 1)) * t) ** 2
    cc = c.reshape(wt2.shape[:1] + (1,) * (t.ndim - 1))
    variance = (cc**2 * wt2).sum(axis=0) + wt2[inside].sum(axis=0) / s
    out: NDArray[np.float64] = variance / float(w[inside].sum()) ** 2
    return out


def check_zero_sum(
    e_shares: Sequence[ArrayLike],
    e_hat_shares: Sequence[ArrayLike],
    weights: Sequence[float] | ArrayLike | None = None,
) -> float:
    """Verify ``sum_s w_s e_s = 0`` over a set of sites (to float precision).

    Parameters
    ----------
    e_shares : sequence of array-like, each of shape (m,)
        ``e_s`` of the sites to be averaged.
    e_hat_shares : sequence of array-like, each of shape (m,)
        Their ``e_hat_s`` (to scale the tolerance).
    weights : array-like of shape (S,), optional
        Remark 3's weights; default 1 each (``sum_s e_s``).

    Returns
    -------
    float
        ``max |sum_s w_s e_s|`` over the entries.

    Raises
    ------
    ValueError
        If the lists differ in length or are empty, or if ``max |sum_s w_s e_s|`` exceeds
        :data:`ZERO_SUM_RTOL` ``* S * max |w_s e_hat_s|``: the shares do not come from one noise
        round over exactly these sites (e.g. a site dropped after the round); rerun the round.
    """
    if len(e_shares) != len(e_hat_shares) or not e_shares:
        raise ValueError(
            f"need one e_hat per e and at least one site, got {len(e_shares)} e and "
            f"{len(e_hat_shares)} e_hat"
        )
    s = len(e_shares)
    w = np.ones(s) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (s,):
        raise ValueError(f"weights must have shape ({s},), got {w.shape}")
    es = np.stack([_check_vector(x, f"e_shares[{j}]") for j, x in enumerate(e_shares)])
    ehs = np.stack([_check_vector(x, f"e_hat_shares[{j}]") for j, x in enumerate(e_hat_shares)])
    residual = float(np.max(np.abs(w @ es)))
    scale = float(np.max(np.abs(w[:, None] * ehs)))
    if residual > ZERO_SUM_RTOL * s * max(scale, np.finfo(np.float64).tiny):
        raise ValueError(
            f"the noise shares of these {s} sites do not sum to zero (max |sum w_s e_s| = "
            f"{residual:.3g}, scale {scale:.3g}): they are not the shares of one noise round over "
            "exactly these sites; rerun the noise round without the dropped sites"
        )
    return residual


def _check_vector(x: ArrayLike, name: str) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds NaN or inf values")
    return arr
