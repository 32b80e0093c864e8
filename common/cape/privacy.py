"""Privacy of CAPE (Algorithm 2): Theorem 1's delta, the exact delta, calibration, Remark 3.

What a site releases in CAPE is ``a_hat_s = f(x_s) + e_s + g_s`` with ``e_s`` the zero-sum share
of Algorithm 1 (``e_s = e_hat_s - (1/S) sum_r e_hat_r``, ``e_hat_s ~ N(0, tau^2 I)``) and ``g_s ~
N(0, tau^2 / S I)``. An adversary made of the aggregator and ``S_C`` colluding sites sees every
release, the broadcast sum ``sum_r e_hat_r`` and everything the colluders hold. Its privacy loss
against an honest site is Gaussian, ``Z ~ N(mu_z, sigma_z^2)`` with ``mu_z = sigma_z^2 / 2``, so
the guarantee is that of a Gaussian mechanism whose sensitivity-to-noise ratio is ``sigma_z``.

This module computes ``sigma_z`` (rederived, see :func:`privacy_loss_sigma`, and as printed in the
paper), Theorem 1's delta (a tail bound on ``Z``), the exact delta of the same loss (the Gaussian
privacy profile), the smallest ``tau`` meeting a target ``(epsilon, delta)`` and the weights of
Remark 3 for unequal sample sizes.

References
----------
H. Imtiaz, J. Mohammadi, A. D. Sarwate, "Distributed differentially private computation of
functions with correlated noise" (the CAPE paper): Algorithms 1-2, Theorem 1 and its proof,
Lemma 1, Remark 3, Proposition 2. Balle & Wang (ICML 2018), Theorem 8 (the exact Gaussian profile).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import log_ndtr

from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

__all__ = [
    "Calibration",
    "SiteGuarantee",
    "Theorem1Variant",
    "calibrate_tau",
    "cape_exact_delta",
    "cape_guarantee",
    "collusion_factor",
    "default_colluders",
    "exact_delta",
    "gaussian_sigma",
    "printed_collusion_factor",
    "privacy_loss_mu_sigma",
    "privacy_loss_sigma",
    "remark3_site_taus",
    "remark3_weights",
    "theorem1_delta",
    "theorem1_delta_from_loss",
    "unweighted_variance_ratio",
]

#: ``"rederived"``: the adversary's full view (sound, the default); ``"printed"``: equations (4)
#: and (5) as printed in the paper (kept to compare; see :func:`printed_collusion_factor`).
Theorem1Variant = Literal["rederived", "printed"]

#: How a CAPE release is calibrated: ``"exact"``, the tight Gaussian profile of the privacy loss
#: against the aggregator and ``S_C`` colluders; ``"theorem1"``, Theorem 1's bound on it;
#: ``"paper"``, Section 5.2's ``kappa = sqrt(2 log(1.25 / delta)) / epsilon``, which ignores the
#: collusion (its real delta is what :func:`cape_guarantee` reports).
Calibration = Literal["exact", "theorem1", "paper"]

_LOG_2 = math.log(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def default_colluders(sites: int) -> int:
    """The paper's collusion bound ``S_C = ceil(S / 3) - 1``.

    Parameters
    ----------
    sites : int
        Number of sites ``S >= 1``.

    Returns
    -------
    int
        ``ceil(S / 3) - 1``: 0 for ``S <= 3``, 1 for ``S`` in 4..6, 6 for ``S = 20``.

    Raises
    ------
    ValueError
        If ``sites`` is not an integer ``>= 1``.

    References
    ----------
    CAPE paper, Section 3.2 ("Trust/Collusion Model") and Theorem 1.
    """
    s = check_positive_int(sites, "sites")
    return -(-s // 3) - 1


def _check_sites_colluders(sites: int, colluders: int | None) -> tuple[int, int]:
    s = check_positive_int(sites, "sites")
    if s < 2:
        raise ValueError(f"CAPE needs at least 2 sites, got sites={sites}")
    c = default_colluders(s) if colluders is None else colluders
    if isinstance(c, bool) or int(c) != c or not 0 <= int(c) <= s - 1:
        raise ValueError(
            f"colluders must be an integer in [0, sites - 1] = [0, {s - 1}] (at least one honest "
            f"site), got {colluders}"
        )
    return s, int(c)


def collusion_factor(sites: int, colluders: int | None = None) -> float:
    """``sigma_z^2 / (Delta / tau)^2`` for the adversary's full view (rederived Theorem 1).

    Parameters
    ----------
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C`` in ``[0, S - 1]``; default :func:`default_colluders` ``(S)``.

    Returns
    -------
    float
        ``F = S (S + S_H) / (S_H (S + 1))`` with ``S_H = S - S_C``. ``F = 2 S / (S + 1)`` without
        colluders, ``F = S`` when only one site is honest (then only ``g_s`` protects it).

    Raises
    ------
    ValueError
        If ``sites < 2`` or ``colluders`` is outside ``[0, S - 1]``.

    Notes
    -----
    Derivation (per coordinate; coordinates are independent and identically treated, so for a
    vector statistic the loss adds up over coordinates and ``||v||_2 <= Delta`` enters squared).
    The adversary knows ``T = sum_r e_hat_r`` (broadcast) and the colluders' ``e_hat_r``,
    ``g_r`` and data. For an honest site ``s`` it can therefore form ``u_s = a_hat_s + T / S =
    f_s + e_hat_s + g_s`` and ``t_H = T - sum_{r in C} e_hat_r = sum_{r in H} e_hat_r``; the
    colluders' releases are functions of what it already knows. ``(u_H, t_H)`` is Gaussian with
    mean ``(f_H, 0)`` and covariance ``Var u_s = tau^2 (1 + 1/S)``, ``Cov(u_s, u_r) = 0``,
    ``Cov(u_s, t_H) = tau^2``, ``Var t_H = S_H tau^2``. A neighbouring data set moves ``f_1`` by
    ``v``; the log-likelihood ratio is ``Z = y^T Sigma^-1 v~ + v~^T Sigma^-1 v~ / 2``, Gaussian
    with ``sigma_z^2 = v~^T Sigma^-1 v~ = ||v||^2 / Var(u_1 | u_2.., t_H)`` and ``mu_z =
    sigma_z^2 / 2``. Given ``u_r`` (``r != 1``), ``e_hat_r`` has posterior variance ``tau^2 /
    (S + 1)``, so ``t_H`` tells ``e_hat_1`` up to noise of variance ``(S_H - 1) tau^2 / (S + 1)``
    and ``Var(u_1 | ...) = tau^2 / S + tau^2 (S_H - 1) / (S + S_H)``, whence
    ``sigma_z^2 = (Delta / tau)^2 S (S + S_H) / (S_H (S + 1))``.

    The paper's proof models the view as ``[a_hat_H, sum_H e_hat]`` with the colluders'
    ``e_hat_r`` left random inside ``a_hat_s``, although the colluders share them; that model
    understates ``sigma_z^2`` (by a factor 1.42 at ``S = 5, S_C = 1``).

    References
    ----------
    CAPE paper, proof of Theorem 1 (the covariance ``Sigma`` and ``z``), rederived as above.
    """
    s, c = _check_sites_colluders(sites, colluders)
    h = s - c
    return s * (s + h) / (h * (s + 1.0))


def printed_collusion_factor(sites: int, colluders: int | None = None) -> float:
    """``sigma_z^2 / (Delta / tau)^2`` as printed in Theorem 1, equation (5).

    ``F_printed = S / (1 + S) * ((S - S_C + 2) / (S - S_C) + 9 S_C^2 / ((S - S_C) (S (1 + S) -
    3 S_C^2)))``; with ``Delta = 1 / N_s = S / N`` this is (5)'s ``S^3 / (tau^2 N^2 (1 + S))``
    times the bracket.

    Parameters
    ----------
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C``; default :func:`default_colluders` ``(S)``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``S (1 + S) - 3 S_C^2 <= 0`` (the printed formula's denominator; e.g. ``S = 5,
        S_C = 4``), ``sites < 2`` or ``colluders`` outside ``[0, S - 1]``.

    Notes
    -----
    Kept to compare with the paper, not to calibrate: the proof's ``Sigma_a^-1 = S / ((1 + S)
    tau^2) (I + (2 / S_H) 1 1^T)`` is the inverse of ``Sigma_a = (1 + 1/S) tau^2 I - tau^2 / S
    1 1^T`` only when ``S_H = 2 (S_C + 1)`` (the inverse is ``S / ((1 + S) tau^2) (I + 1 1^T /
    (S_C + 1))``), so (4)-(5) equal the proof's own ``v~^T Sigma^-1 v~`` only for ``S = 3 S_C +
    2`` (``S = 5, S_C = 1``; ``S = 20, S_C = 6``); and the proof's view leaves out what the
    colluders know (:func:`collusion_factor`). At ``S = 5, S_C = 1`` the printed factor is
    1.319, the rederived one 1.875.
    """
    s, c = _check_sites_colluders(sites, colluders)
    denominator = s * (1 + s) - 3 * c * c
    if denominator <= 0:
        raise ValueError(
            f"Theorem 1 as printed needs S(1+S) - 3 S_C^2 > 0, got S={s}, S_C={c}: "
            f"{s}*{1 + s} - 3*{c}^2 = {denominator}"
        )
    h = s - c
    bracket = (h + 2.0) / h + (9.0 / h) * c * c / denominator
    return s / (1.0 + s) * bracket


def privacy_loss_sigma(
    *,
    sites: int,
    colluders: int | None = None,
    tau: float,
    sensitivity: float,
    variant: Theorem1Variant = "rederived",
) -> float:
    """Standard deviation ``sigma_z`` of CAPE's privacy loss against one honest site.

    Parameters
    ----------
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C``; default :func:`default_colluders` ``(S)``.
    tau : float
        Site noise standard deviation ``tau_s = tau`` (``e_hat_s ~ N(0, tau^2)``), ``> 0``, in the
        units of the statistic.
    sensitivity : float
        L2 sensitivity ``Delta`` of one site's statistic ``f(x_s)`` (``1 / N_s`` for the mean of
        values in ``[0, 1]``), ``> 0``, same units.
    variant : {"rederived", "printed"}
        :func:`collusion_factor` or :func:`printed_collusion_factor`.

    Returns
    -------
    float
        ``sigma_z = (Delta / tau) sqrt(F)``; ``mu_z = sigma_z^2 / 2``.

    Raises
    ------
    ValueError
        As the collusion factors, or if ``tau`` or ``sensitivity`` is not finite and ``> 0``.

    Notes
    -----
    Assumes the symmetric setting of Theorem 1 (``N_s = N / S``, ``tau_s = tau`` for every site);
    Remark 3's weighting reduces the unequal case to it (:func:`remark3_weights`).
    """
    t = check_epsilon(tau, "tau")
    d = check_epsilon(sensitivity, "sensitivity")
    if variant == "rederived":
        factor = collusion_factor(sites, colluders)
    elif variant == "printed":
        factor = printed_collusion_factor(sites, colluders)
    else:
        raise ValueError(f"variant must be 'rederived' or 'printed', got {variant!r}")
    return d / t * math.sqrt(factor)


def privacy_loss_mu_sigma(
    *,
    sites: int,
    colluders: int | None = None,
    tau: float,
    sensitivity: float,
    variant: Theorem1Variant = "rederived",
) -> tuple[float, float]:
    """``(mu_z, sigma_z)`` of Theorem 1: ``sigma_z`` from :func:`privacy_loss_sigma`,
    ``mu_z = sigma_z^2 / 2`` (equations (4)-(5) keep this relation too).

    Parameters and errors as :func:`privacy_loss_sigma`.
    """
    sigma = privacy_loss_sigma(
        sites=sites, colluders=colluders, tau=tau, sensitivity=sensitivity, variant=variant
    )
    return 0.5 * sigma * sigma, sigma


def _log_theorem1_delta(epsilon: float, mu: float, sigma: float) -> float:
    x = (epsilon - mu) / sigma
    return _LOG_2 + math.log(sigma) - math.log(epsilon - mu) - _LOG_SQRT_2PI - 0.5 * x * x


def theorem1_delta_from_loss(epsilon: float, mu: float, sigma: float) -> float:
    """Theorem 1's bound ``delta = 2 sigma / (epsilon - mu) phi((epsilon - mu) / sigma)``.

    Parameters
    ----------
    epsilon : float
        ``> mu``.
    mu, sigma : float
        Mean and standard deviation of the Gaussian privacy loss, ``sigma > 0``.

    Returns
    -------
    float
        May exceed 1 (the bound is then vacuous).

    Raises
    ------
    ValueError
        If ``epsilon <= mu`` (the bound needs ``epsilon > mu_z``) or ``sigma`` is not ``> 0``.

    Notes
    -----
    ``P[|Z| > epsilon] <= 2 Q((epsilon - mu) / sigma) < 2 phi(x) / x``: the first step because
    ``P[Z < -epsilon] = Q((epsilon + mu) / sigma) <= Q((epsilon - mu) / sigma)`` (the proof's
    equality ``P[|z| <= epsilon] = 1 - 2 P[z > epsilon]`` is this inequality), the second the
    Mills-ratio bound ``Q(x) < phi(x) / x`` for ``x > 0``. A loss bounded by ``epsilon`` except
    with probability ``delta`` gives ``(epsilon, delta)``-DP.
    """
    eps = check_epsilon(epsilon)
    s = check_epsilon(sigma, "sigma")
    m = float(mu)
    if not eps > m:
        raise ValueError(
            f"Theorem 1 needs epsilon > mu_z, got epsilon={eps} <= mu_z={m:.6g}: "
            "increase tau (more noise) or epsilon"
        )
    return math.exp(_log_theorem1_delta(eps, m, s))


def theorem1_delta(
    epsilon: float,
    *,
    sites: int,
    colluders: int | None = None,
    tau: float,
    sensitivity: float,
    variant: Theorem1Variant = "rederived",
) -> float:
    """Theorem 1's delta of CAPE at ``epsilon`` for each site.

    ``delta = 2 sigma_z / (epsilon - mu_z) phi((epsilon - mu_z) / sigma_z)`` with ``phi`` the
    standard normal density, ``sigma_z = (Delta / tau) sqrt(F)``, ``mu_z = sigma_z^2 / 2`` and
    ``F`` the collusion factor (:func:`collusion_factor` for ``variant="rederived"``,
    :func:`printed_collusion_factor` for the paper's equations (4)-(5)).

    Parameters
    ----------
    epsilon : float
        ``> 0``.
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C``; default ``ceil(S / 3) - 1``.
    tau : float
        Site noise standard deviation (``e_hat_s ~ N(0, tau^2)``, ``g_s ~ N(0, tau^2 / S)``).
    sensitivity : float
        L2 sensitivity of one site's statistic (``1 / N_s`` in the paper's mean example).
    variant : {"rederived", "printed"}

    Returns
    -------
    float
        delta (may exceed 1: vacuous).

    Raises
    ------
    ValueError
        If ``epsilon <= mu_z`` ("Theorem 1 needs epsilon > mu_z"), if ``variant="printed"`` and
        ``S (1 + S) - 3 S_C^2 <= 0``, or on invalid ``sites``, ``colluders``, ``tau``,
        ``sensitivity``.

    Notes
    -----
    Assumptions (Theorem 1): ``N_s = N / S`` and ``tau_s = tau`` for all sites, at most ``S_C``
    sites collude with the aggregator, all parties follow the protocol, the sum ``sum_s e_hat_s``
    is learnt exactly (secure aggregation). With the paper's ``Delta = 1 / N_s = S / N``,
    ``variant="printed"`` gives exactly (4)-(5): ``sigma_z^2 = S^3 / (tau^2 N^2 (1 + S)) *
    (...)``. The rederived variant holds for every ``0 <= S_C <= S - 1``.
    """
    mu, sigma = privacy_loss_mu_sigma(
        sites=sites, colluders=colluders, tau=tau, sensitivity=sensitivity, variant=variant
    )
    return theorem1_delta_from_loss(epsilon, mu, sigma)


def _log_exact_delta(epsilon: float, mu: float, sigma: float) -> float:
    log_upper = float(log_ndtr((mu - epsilon) / sigma))
    log_lower = epsilon + float(log_ndtr((-mu - epsilon) / sigma))
    if log_lower >= log_upper:  # only by rounding: the difference is >= 0 mathematically
        return -math.inf
    return log_upper + math.log(-math.expm1(log_lower - log_upper))


def exact_delta(epsilon: float, mu: float, sigma: float) -> float:
    """Exact delta at ``epsilon`` of a Gaussian privacy loss ``Z ~ N(mu, sigma^2)``.

    ``delta(epsilon) = P[Z > epsilon] - e^epsilon P[Z' < -epsilon] = Phi((mu - epsilon) / sigma)
    - e^epsilon Phi((-mu - epsilon) / sigma)``, evaluated in log space.

    Parameters
    ----------
    epsilon : float
        ``>= 0``.
    mu, sigma : float
        The loss's mean and standard deviation, ``sigma > 0`` and ``sigma^2 = 2 mu`` (relative
        tolerance 1e-9), the only Gaussian losses a pair of distributions can have.

    Returns
    -------
    float
        In ``[0, 1]``; the smallest delta for which the mechanism is ``(epsilon, delta)``-DP.

    Raises
    ------
    ValueError
        If ``sigma <= 0``, ``epsilon < 0`` or ``sigma^2 != 2 mu``.

    Notes
    -----
    For a pair ``P, Q`` with loss ``L = log dP/dQ``, the tight delta is the hockey-stick
    divergence ``E_P[(1 - e^(epsilon - L))_+] = P[L > epsilon] - e^epsilon Q[L > epsilon]``.
    A Gaussian loss ``N(mu, sigma^2)`` under ``P`` with ``E_P[e^-L] = 1`` forces ``sigma^2 = 2
    mu``; it is the loss of ``N(0, 1)`` against ``N(sigma, 1)`` (a Gaussian mechanism with
    sensitivity-to-noise ratio ``sigma``), whose loss under ``Q`` is ``-N(mu, sigma^2)``, so
    ``Q[L > epsilon] = Phi((-mu - epsilon) / sigma)``. This is Balle & Wang's analytic Gaussian
    profile ``Phi(r/2 - epsilon/r) - e^epsilon Phi(-r/2 - epsilon/r)`` with ``r = sigma``; it is
    symmetric in ``P, Q``. Theorem 1 bounds ``P[|Z| > epsilon]`` instead, which is never smaller.

    References
    ----------
    Balle & Wang, ICML 2018, Theorem 8; CAPE paper, proof of Theorem 1 (the loss ``z``).
    """
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    s = check_epsilon(sigma, "sigma")
    m = float(mu)
    if not math.isclose(s * s, 2.0 * m, rel_tol=1e-9):
        raise ValueError(
            f"a Gaussian privacy loss has sigma^2 = 2 mu, got mu={m}, sigma={s} (sigma^2 = {s * s})"
        )
    return max(0.0, min(1.0, math.exp(_log_exact_delta(eps, m, s))))


def cape_exact_delta(
    epsilon: float,
    *,
    sites: int,
    colluders: int | None = None,
    tau: float,
    sensitivity: float,
    variant: Theorem1Variant = "rederived",
) -> float:
    """:func:`exact_delta` of CAPE's privacy loss (``mu_z, sigma_z`` as :func:`theorem1_delta`).

    Parameters, errors and assumptions as :func:`theorem1_delta`, except that any ``epsilon >= 0``
    is valid. Never larger than :func:`theorem1_delta` at the same arguments.
    """
    mu, sigma = privacy_loss_mu_sigma(
        sites=sites, colluders=colluders, tau=tau, sensitivity=sensitivity, variant=variant
    )
    return exact_delta(epsilon, mu, sigma)


def calibrate_tau(
    epsilon: float,
    delta: float,
    *,
    sites: int,
    colluders: int | None = None,
    sensitivity: float,
    method: Literal["exact", "theorem1"] = "exact",
    variant: Theorem1Variant = "rederived",
) -> float:
    """The smallest site noise ``tau`` for which CAPE is ``(epsilon, delta)``-DP for each site.

    Both deltas decrease as ``tau`` grows (``sigma_z = Delta sqrt(F) / tau`` shrinks), so the
    cheapest ``tau`` in accuracy that meets the target is where delta equals it. The root is
    found in ``sigma_z`` by bisection (``scipy.optimize.brentq`` on ``log delta - log target``)
    and ``tau = Delta sqrt(F) / sigma_z``.

    Parameters
    ----------
    epsilon : float
        Target epsilon, ``> 0``.
    delta : float
        Target delta, in ``(0, 1)``.
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C``; default ``ceil(S / 3) - 1``.
    sensitivity : float
        L2 sensitivity of one site's statistic, ``> 0``.
    method : {"exact", "theorem1"}
        ``"exact"``: :func:`cape_exact_delta` (tight; the default); ``"theorem1"``:
        :func:`theorem1_delta` (the paper's bound; needs more noise).
    variant : {"rederived", "printed"}
        Which ``sigma_z`` (see :func:`theorem1_delta`).

    Returns
    -------
    float
        ``tau`` in the statistic's units. The delta at ``tau`` is ``<= delta`` and at
        ``tau * (1 - 1e-6)`` it is larger (the search's relative tolerance).

    Raises
    ------
    ValueError
        On invalid arguments, as :func:`theorem1_delta`.

    Notes
    -----
    With ``method="exact"`` the result equals ``analytic_gaussian_sigma(epsilon, delta,
    Delta sqrt(F))`` (Balle & Wang's calibration of a Gaussian mechanism with sensitivity
    ``Delta sqrt(F)``): CAPE's site is as private as a Gaussian mechanism whose sensitivity is
    inflated by ``sqrt(F)``.
    """
    eps = check_epsilon(epsilon)
    target = check_delta(delta)
    d = check_epsilon(sensitivity, "sensitivity")
    if method not in ("exact", "theorem1"):
        raise ValueError(f"method must be 'exact' or 'theorem1', got {method!r}")
    if variant == "rederived":
        factor = collusion_factor(sites, colluders)
    elif variant == "printed":
        factor = printed_collusion_factor(sites, colluders)
    else:
        raise ValueError(f"variant must be 'rederived' or 'printed', got {variant!r}")
    return d * math.sqrt(factor) / _max_loss_sigma(eps, target, method)


@functools.lru_cache(maxsize=4096)
def _max_loss_sigma(eps: float, target: float, method: str) -> float:
    """Largest ``sigma_z`` whose delta at ``eps`` is ``<= target`` (bisection, cached)."""
    from scipy.optimize import brentq  # on first use: importing the module stays light

    log_target = math.log(target)

    if method == "exact":

        def log_delta(sig: float) -> float:
            return _log_exact_delta(eps, 0.5 * sig * sig, sig)

        hi = 1.0
        while log_delta(hi) < log_target:
            hi *= 2.0
    else:
        sigma_max = math.sqrt(2.0 * eps)  # mu_z = epsilon there

        def log_delta(sig: float) -> float:
            return _log_theorem1_delta(eps, 0.5 * sig * sig, sig)

        hi = sigma_max * (1.0 - 1e-12)
    lo = min(1e-3, hi / 2.0)
    while log_delta(lo) > log_target:
        lo /= 2.0
    sigma_root = float(
        brentq(lambda sig: log_delta(sig) - log_target, lo, hi, xtol=1e-14, rtol=1e-10)
    )
    sigma_ok = sigma_root * (1.0 - 1e-9)
    while log_delta(sigma_ok) > log_target:  # guard the root's rounding
        sigma_ok *= 1.0 - 1e-9
    return sigma_ok


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise of the (analytic) Gaussian mechanism that is ``(epsilon, delta)``-DP.

    The root of ``Phi(r/2 - epsilon/r) - e^epsilon Phi(-r/2 - epsilon/r) = delta`` in ``r =
    sensitivity / sigma``, by the same bisection as :func:`calibrate_tau` (cached): the same
    value as :func:`dpmarket.common.privacy.accounting.analytic_gaussian_sigma` (``dp_accounting``'s
    search, about 0.2 s a call) in about 50 microseconds, which experiments with thousands of
    calibrations need.

    Parameters
    ----------
    epsilon : float
        ``> 0``.
    delta : float
        In ``(0, 1)``.
    sensitivity : float, default 1.0
        L2 sensitivity, ``> 0``.

    Returns
    -------
    float
        ``sigma``; the mechanism is ``(epsilon, delta)``-DP at it, and not at ``sigma (1 -
        1e-6)``.

    Raises
    ------
    ValueError
        If a parameter is out of range.

    References
    ----------
    Balle & Wang, ICML 2018, Theorem 8 and Algorithm 1.
    """
    eps = check_epsilon(epsilon)
    target = check_delta(delta)
    d = check_epsilon(sensitivity, "sensitivity")
    return d / _max_loss_sigma(eps, target, "exact")


def _check_sizes(sizes: Sequence[int] | ArrayLike) -> NDArray[np.float64]:
    n = np.asarray(sizes)
    if n.ndim != 1 or n.shape[0] < 1:
        raise ValueError(f"sizes must be a non-empty 1-D sequence, got shape {n.shape}")
    values = n.astype(np.float64)
    bad = ~(np.isfinite(values) & (values >= 1) & (values == np.round(values)))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"every site size must be an integer >= 1, got sizes[{j}] = {n[j]}")
    return values


def remark3_weights(sizes: Sequence[int] | ArrayLike) -> NDArray[np.float64]:
    """Remark 3's aggregation weights ``w_s = N_s / N`` for unequal sample sizes.

    Parameters
    ----------
    sizes : sequence of int, shape (S,)
        ``N_s >= 1`` per site.

    Returns
    -------
    ndarray of shape (S,), float64
        ``w_s = N_s / N``; sums to 1; ``1 / S`` each when the sizes are equal.

    Raises
    ------
    ValueError
        If ``sizes`` is empty, not 1-D or holds a value that is not an integer ``>= 1``.

    Notes
    -----
    Remark 3 asks for ``a_cape = sum_s w_s a_hat_s`` with ``sum_s w_s e_s = 0`` and ``Var(sum_s w_s
    g_s) = tau_pool^2`` and defers the scheme to the authors' earlier paper. The scheme here: for a
    statistic whose site sensitivity is ``Delta_s = c / N_s`` (a mean over the site's records; the
    pooled one has ``c / N``), take ``w_s = N_s / N`` (so ``sum_s w_s f(x_s)`` is the pooled
    statistic), ``tau_s = kappa Delta_s`` (:func:`remark3_site_taus`), ``e_hat_s ~ N(0, tau_s^2)``,
    secure aggregation of ``w_s e_hat_s`` and ``e_s = e_hat_s - (sum_r w_r e_hat_r) / (S w_s)``
    (:func:`dpmarket.common.cape.zero_sum.zero_sum_correction` with ``weight``), ``g_s ~ N(0,
    tau_s^2 / S)``. Then ``sum_s w_s e_s = 0``; ``Var e_s = (1 - 1/S) tau_s^2`` (because ``w_s tau_s
    = kappa c / N`` is the same for every site); ``Var(sum_s w_s g_s) = sum_s (kappa c / N)^2 / S =
    (kappa c / N)^2 = tau_pool^2``. Privacy: ``w_s a_hat_s`` is an invertible rescaling of
    ``a_hat_s``, and the rescaled releases are exactly the symmetric setting with noise ``kappa c /
    N`` and sensitivity ``c / N`` for every site, so Theorem 1 holds with the ratio ``Delta_s /
    tau_s = 1 / kappa``.
    """
    n = _check_sizes(sizes)
    out: NDArray[np.float64] = n / n.sum()
    return out


def remark3_site_taus(tau_pool: float, sizes: Sequence[int] | ArrayLike) -> NDArray[np.float64]:
    """Per-site noise ``tau_s = tau_pool N / N_s`` of Remark 3's weighted scheme.

    Parameters
    ----------
    tau_pool : float
        Noise standard deviation of the pooled-data mechanism (``kappa c / N``), ``> 0``.
    sizes : sequence of int, shape (S,)
        ``N_s`` per site.

    Returns
    -------
    ndarray of shape (S,), float64
        ``tau_s``; ``S tau_pool`` each when the sizes are equal (Lemma 1: ``tau_pool = tau / S``).

    Raises
    ------
    ValueError
        If ``tau_pool`` is not finite and ``> 0`` or ``sizes`` is invalid.

    Notes
    -----
    See :func:`remark3_weights`. ``tau_s / Delta_s`` is the same for every site, so each site's
    release alone is as private as the pooled release, and the weighted CAPE estimate has
    exactly ``tau_pool^2`` noise variance. With CAPE's ``kappa`` (calibrated on ``sigma_z``, which
    carries :func:`collusion_factor`'s ``F``), that is ``F`` times the variance of the pooled-data
    mechanism at the same ``(epsilon, delta)``.
    """
    t = check_epsilon(tau_pool, "tau_pool")
    n = _check_sizes(sizes)
    out: NDArray[np.float64] = t * n.sum() / n
    return out


def unweighted_variance_ratio(sizes: Sequence[int] | ArrayLike) -> float:
    """``H(n) = tau_cape^2 / tau_pool^2 = N^2 / S^3 sum_s 1 / N_s^2`` of plain ``1/S`` averaging.

    Parameters
    ----------
    sizes : sequence of int, shape (S,)

    Returns
    -------
    float
        ``>= 1``, equal to 1 exactly when the sizes are equal (Remark 3; Schur-convexity).

    Raises
    ------
    ValueError
        If ``sizes`` is invalid.

    References
    ----------
    CAPE paper, Remark 3 and Proposition 2 (with ``Delta(N_s) = c / N_s``).
    """
    n = _check_sizes(sizes)
    s = n.shape[0]
    return float(n.sum() ** 2 / s**3 * np.sum(1.0 / n**2))


@dataclass(frozen=True)
class SiteGuarantee:
    """What one CAPE release guarantees each site, from public values only.

    Attributes
    ----------
    colluders : int
        ``S_C``.
    kappa : float
        Noise multiplier: a site whose statistic has L2 sensitivity ``Delta_s`` draws
        ``e_hat_s ~ N(0, (kappa Delta_s)^2)`` per entry (``Delta_s`` of the statistic divided by
        ``unit``, see :func:`cape_guarantee`).
    sigma_z : float
        Standard deviation of one site's privacy loss against the aggregator and ``S_C``
        colluders: ``unit sqrt(F) / kappa`` (:func:`collusion_factor`).
    delta_exact : float
        Exact delta at ``epsilon`` of that Gaussian loss (:func:`exact_delta`).
    delta_theorem1 : float or None
        Theorem 1's delta at ``epsilon`` of the same loss; ``None`` when ``epsilon <= mu_z``
        (the bound does not apply).
    """

    colluders: int
    kappa: float
    sigma_z: float
    delta_exact: float
    delta_theorem1: float | None


def cape_guarantee(
    epsilon: float,
    delta: float,
    *,
    sites: int,
    colluders: int | None = None,
    unit: float = 1.0,
    calibration: Calibration = "exact",
) -> SiteGuarantee:
    """Calibrate one CAPE release of ``S`` sites and state what it guarantees each of them.

    Parameters
    ----------
    epsilon : float
        ``> 0``.
    delta : float
        In ``(0, 1)``.
    sites : int
        ``S >= 2``.
    colluders : int, optional
        ``S_C``; default :func:`default_colluders` ``(S)``.
    unit : float, default 1.0
        L2 sensitivity of the released vector once each block is divided by its own
        sensitivity (``sqrt(k)`` for ``k`` stacked functional-mechanism orders, 1 for a single
        statistic such as a mean or a gradient).
    calibration : {"exact", "theorem1", "paper"}
        ``"exact"``: ``kappa = calibrate_tau(epsilon, delta, sites=S, colluders=S_C,
        sensitivity=unit)``, so every site is ``(epsilon, delta)``-DP against the aggregator and
        ``S_C`` colluders (tight); ``"theorem1"``: the same with Theorem 1's bound (more noise);
        ``"paper"``: ``kappa = sqrt(2 log(1.25 / delta)) / epsilon`` (Section 5.2).

    Returns
    -------
    SiteGuarantee

    Raises
    ------
    ValueError
        On invalid parameters, or if ``calibration="theorem1"`` cannot meet the target.
    """
    eps = check_epsilon(epsilon)
    dl = check_delta(delta)
    s = check_positive_int(sites, "sites")
    c = default_colluders(s) if colluders is None else colluders
    factor = collusion_factor(s, c)  # validates sites and colluders
    u = check_epsilon(unit, "unit")
    if calibration in ("exact", "theorem1"):
        method: Literal["exact", "theorem1"] = "exact" if calibration == "exact" else "theorem1"
        kappa = calibrate_tau(eps, dl, sites=s, colluders=c, sensitivity=u, method=method)
    elif calibration == "paper":
        kappa = math.sqrt(2.0 * math.log(1.25 / dl)) / eps
    else:
        raise ValueError(f"calibration must be 'exact', 'theorem1' or 'paper', got {calibration!r}")
    sigma_z = u / kappa * math.sqrt(factor)
    mu_z = 0.5 * sigma_z * sigma_z
    return SiteGuarantee(
        colluders=int(c),
        kappa=kappa,
        sigma_z=sigma_z,
        delta_exact=exact_delta(eps, mu_z, sigma_z),
        delta_theorem1=theorem1_delta_from_loss(eps, mu_z, sigma_z) if eps > mu_z else None,
    )
