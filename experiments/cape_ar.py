"""The Anderson-Rubin (Fieller) confidence set of a capeFM fit, inverted per coefficient: a
candidate interval for undetermined fits, measured and not adopted (docs/results.md, "CAPE
intervals on undetermined fits: an exact test inverted").

The release is ``Lambda_hat_1 = Lambda_1 + n_1``, ``Lambda_hat_2 = Lambda_2 + N`` with Gaussian
noise of a known law, and the pooled non-private fit ``w*`` solves ``2 sym(Lambda_2) w* +
Lambda_1 = 0``. At ``w*`` the released objective's gradient ``g(w*) = (N + N^T) w* + n_1`` is
exactly Gaussian with a covariance that depends on ``w*`` alone, so ``Q(w*) ~ chi2_D`` exactly
(:func:`ar_statistic`) and ``{w : Q(w) <= chi2_D(level)}`` is an exact joint confidence set, the
Anderson-Rubin construction of weak-instrument econometrics (Fieller's for a ratio). Per
coefficient, :func:`ar_intervals` projects a level set of ``Q``:

====================  ==============================================================================
``ar_joint``          the level set at ``chi2_D(0.95)``: exact jointly, conservative per coefficient
``ar_profile``        at ``chi2_1(0.95)``: the profile (subvector) set, nominal to first order where
                      the fit is resolved, no guarantee where it is not
``ar_undetermined``   ``ar_profile`` where the fit is ``undetermined`` (an eigenvalue of the
                      released Gram matrix below one noise std), the floored bootstrap elsewhere
====================  ==============================================================================

Why they over-cover where a fit is undetermined. Far from the origin ``Q`` tends to
``lambda^2 / s2^2`` along the eigenvector of the released Gram matrix's eigenvalue ``lambda``
smallest in magnitude, so a level set at ``kappa`` is unbounded, and every coefficient's
projection is the whole line, whenever ``|lambda| < sqrt(kappa) s2``: 1.96 noise std at
``chi2_1(0.95)``, which holds for every undetermined fit (``lambda < 1`` noise std; a noisy
eigenvalue below ``-1.96`` std is rare). This is not a weakness of the construction: where the
model admits unidentified parameters (a Gram matrix may be singular), a confidence set that holds
its level at every parameter must be unbounded with positive probability (Dufour 1997), so an
exact set covers an undetermined fit's coefficients with probability near 1.

References
----------
T. W. Anderson and H. Rubin, Ann. Math. Statist. 20 (1949) 46-63; E. C. Fieller, J. R. Stat. Soc.
B 16 (1954) 175-185; J.-M. Dufour, Econometrica 65 (1997) 1365-1387; P. Guggenberger, F.
Kleibergen, S. Mavroeidis and L. Chen, Econometrica 80 (2012) 2649-2666 (subset AR tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape import uncertainty as unc
from dpmarket.common.cape.capefm import CapeFMPlan
from dpmarket.common.cape.functional_mechanism import FMRelease

__all__ = ["ar_estimates", "ar_intervals", "ar_statistic"]

Array = NDArray[np.float64]


def ar_statistic(w: Array, lam1: Array, sym2: Array, s1: float, s2: float) -> tuple[float, Array]:
    """The Anderson-Rubin statistic of a capeFM release at scaled weights ``w`` and its gradient.

    Parameters
    ----------
    w : ndarray of shape (D,)
        Scaled-domain weights.
    lam1 : ndarray of shape (D,)
        The released ``Lambda_hat_1``.
    sym2 : ndarray of shape (D, D)
        The symmetric part of the released ``Lambda_hat_2``.
    s1, s2 : float
        The aggregator's noise std per entry of ``Lambda_1`` and of the unsymmetrized
        ``Lambda_2`` (:meth:`~dpmarket.common.cape.capefm.CapeFMPlan.aggregator_scales`).

    Returns
    -------
    q : float
        ``Q(w) = g^T Sigma(w)^-1 g`` with ``g = 2 sym2 w + lam1`` (the gradient of the released
        objective) and ``Sigma(w) = (s1^2 + 2 s2^2 |w|^2) I + 2 s2^2 w w^T``.
    grad : ndarray of shape (D,)
        ``dQ/dw = 4 sym2 h - 2 c |h|^2 w - 2 c (h^T w) h`` with ``h = Sigma^-1 g``, ``c = 2 s2^2``.

    Notes
    -----
    What is exact. The release is ``Lambda_hat_1 = Lambda_1 + n_1`` and ``Lambda_hat_2 =
    Lambda_2 + N`` with ``n_1 ~ N(0, s1^2 I_D)`` and the ``D^2`` entries of ``N`` i.i.d. ``N(0,
    s2^2)`` (Lemma 1: the zero-sum shares cancel, the ``g_s`` remain). The pooled non-private
    fit ``w*`` solves ``2 sym(Lambda_2) w* + Lambda_1 = 0`` (least squares, or the Taylor-form
    logistic fit; no regularization: the noise-free ``Lambda_2`` of every harness case is
    positive definite). So ``g(w*) = (N + N^T) w* + n_1``, linear in the noise, is exactly
    Gaussian with mean 0 and, since ``E[(N + N^T)_ij (N + N^T)_kl] = 2 s2^2 (d_ik d_jl + d_il
    d_jk)``, covariance ``Sigma(w*)`` above, which depends on ``w*`` alone. Hence ``Q(w*) ~
    chi2_D`` exactly, whatever ``Lambda_2`` is, and ``{w : Q(w) <= chi2_D(level)}`` is an exact
    joint confidence set (Anderson and Rubin 1949; Fieller 1954 for ``D = 1``).

    When the set is unbounded. Along ``w = t u`` (``|u| = 1``), ``Q(t u) -> Q_inf(u) = (2
    |S u|^2 - (u^T S u)^2) / s2^2`` (``S = sym2``) as ``t -> +-inf``, whose minimum over ``u`` is
    ``lambda^2 / s2^2`` at the eigenvector of the eigenvalue ``lambda`` of ``S`` smallest in
    magnitude (``2 E[l^2] - E[l]^2 >= E[l^2]`` under any weights on the eigenvalues). So the set at
    ``kappa`` is unbounded when ``|lambda| < sqrt(kappa) s2`` (1.96 ``s2`` at ``chi2_1(0.95)``,
    3.33 at ``chi2_5(0.95)``), and then it holds a cone around that eigenvector, whose
    projection on every coefficient not orthogonal to the whole cone is the real line.
    """
    c = 2.0 * s2 * s2
    g = 2.0 * sym2 @ w + lam1
    a = s1 * s1 + c * float(w @ w)
    wg = float(w @ g)
    denom = a + c * float(w @ w)
    q = (float(g @ g) - c * wg * wg / denom) / a
    h = (g - c * w * wg / denom) / a
    hw = float(h @ w)
    grad = 4.0 * sym2 @ h - 2.0 * c * float(h @ h) * w - 2.0 * c * hw * h
    return q, grad


def ar_intervals(
    fit: FMRelease, s1: float, s2: float, raw_map: tuple[Array, Array], kappa: float
) -> tuple[Array, Array, bool]:
    """Per raw coefficient, the projection of ``{w : Q(w) <= kappa}`` (:func:`ar_statistic`).

    Parameters
    ----------
    fit : FMRelease
        The released fit (its noisy coefficients are read, not its floored solve).
    s1, s2 : float
        The aggregator's per-entry noise std of orders 1 and 2.
    raw_map : (M, c)
        ``M`` of shape (K, D) and ``c`` of shape (K,).
    kappa : float
        The level set: ``chi2_D(level)`` for the joint set (candidate a), ``chi2_1(level)`` for
        the profile set (candidate b: ``{t : min_{m w = t} Q(w) <= kappa}`` is the projection of
        the level set).

    Returns
    -------
    low, high : ndarray of shape (K,)
        ``-inf`` and ``inf`` where the set is unbounded.
    bounded : bool

    Notes
    -----
    At ``chi2_D`` the projection covers every coefficient with probability at least ``level``
    (exact jointly, conservative per coefficient). At ``chi2_1`` it is the profile
    (subvector) Anderson-Rubin interval: nominal to first order where the fit is resolved (``Q``
    is then nearly quadratic near ``w*``, and its minimum over ``D - 1`` directions is ``chi2_1``);
    where it is not, no exactness is claimed (the subset-AR results of Guggenberger et al. 2012
    need the Kronecker covariance of linear IV, which the symmetric noise ``N + N^T`` breaks).
    How the ends are found. With ``c = 2 s2^2`` and ``a = s1^2 + c |w|^2``, ``Q' = |g|^2 / a``
    (the covariance without its rank-one term) bounds ``Q`` on both sides, ``Q' / 2 <= Q <= Q'``
    (the term removes at most ``c |w|^2 / (s1^2 + 2 c |w|^2) <= 1/2`` of ``|g|^2``), and
    ``{Q' <= k}`` is an ellipsoid (a quadric in ``w``), bounded for ``k = 2 kappa`` exactly when
    ``{Q <= kappa}`` is.
    Each end starts at the end of the inner ellipsoid ``{Q' <= kappa}`` (inside the set) and is
    pushed outwards by SLSQP within the outer one ``{Q' <= 2 kappa}``; an end the solver leaves
    infeasible is not taken. The set need not be convex, so an end is the farthest point the
    solver reaches (inside the set: the interval may be short of the projection, never longer).
    """
    from scipy.optimize import minimize

    m, c = raw_map
    lam1 = np.asarray(fit.coefficients.lam1, dtype=np.float64)
    lam2 = np.asarray(fit.coefficients.lam2, dtype=np.float64)
    sym2 = 0.5 * (lam2 + lam2.T)
    k = m.shape[0]
    if np.min(np.abs(np.linalg.eigvalsh(sym2))) ** 2 <= kappa * s2 * s2:
        return np.full(k, -np.inf), np.full(k, np.inf), False
    c2 = 2.0 * s2 * s2
    a2 = 4.0 * sym2 @ sym2  # A^T A with A = 2 sym2

    def q(w: Array) -> float:
        return ar_statistic(w, lam1, sym2, s1, s2)[0]

    def ellipsoid(level: float) -> tuple[Array, Array, float]:
        """``{w : |g|^2 <= level (s1^2 + c2 |w|^2)}`` as ``(w - w0)^T P (w - w0) <= r2``."""
        p: Array = a2 - level * c2 * np.eye(len(lam1))
        w0 = -np.asarray(np.linalg.solve(p, 2.0 * sym2 @ lam1), dtype=np.float64)
        return w0, p, float(w0 @ p @ w0 - lam1 @ lam1 + level * s1 * s1)

    inner, outer = ellipsoid(kappa), ellipsoid(2.0 * kappa)
    cons = [
        {"type": "ineq", "fun": lambda w: kappa - q(w), "jac": lambda w: -ar_statistic(
            w, lam1, sym2, s1, s2
        )[1]},
        {"type": "ineq", "fun": lambda w: outer[2] - (w - outer[0]) @ outer[1] @ (w - outer[0]),
         "jac": lambda w: -2.0 * outer[1] @ (w - outer[0])},
    ]  # fmt: skip
    low, high = np.empty(k), np.empty(k)
    for j in range(k):
        for sign, out in ((1.0, low), (-1.0, high)):
            row = sign * m[j] / np.linalg.norm(m[j])
            w0, p, r2 = inner
            step = np.linalg.solve(p, row)
            start = w0 - np.sqrt(r2 / float(row @ step)) * step  # the inner ellipsoid's end
            best = float(row @ start)
            res = minimize(
                lambda w, r=row: float(r @ w), start, jac=lambda w, r=row: r,
                method="SLSQP", constraints=cons, options={"maxiter": 300, "ftol": 1e-12},
            )  # fmt: skip
            if q(res.x) <= kappa * (1.0 + 1e-6):
                best = min(best, float(row @ res.x))
            out[j] = sign * best * float(np.linalg.norm(m[j])) + c[j]
    return low, high, True


def ar_estimates(
    plan: CapeFMPlan,
    fit: FMRelease,
    labels: Sequence[str],
    raw_map: tuple[Array, Array],
    rng: np.random.Generator,
    *,
    task_covers: str,
    released: Sequence[int] | None = None,
    level: float = unc.DEFAULT_LEVEL,
) -> tuple[unc.Estimate, ...]:
    """The rule ``ar_undetermined`` as :class:`~dpmarket.common.cape.uncertainty.Estimate` rows
    (the harness's control): :func:`ar_intervals` at ``chi2_1(level)`` where the fit is
    undetermined, the floored bootstrap (``capefm_estimates(..., hull=False)``) elsewhere.

    Parameters and Returns as :func:`dpmarket.common.cape.uncertainty.capefm_estimates`; an
    unbounded end is ``-inf`` or ``inf``, the standard error that of the bootstrap.
    """
    from scipy.stats import chi2

    boot = unc.capefm_estimates(
        plan, fit, labels, raw_map, rng, task_covers=task_covers, released=released, hull=False
    )
    scales = plan.aggregator_scales(released)
    sym = 0.5 * (fit.coefficients.lam2 + fit.coefficients.lam2.T)
    if not np.any(np.linalg.eigvalsh(sym) < unc.UNRESOLVED_SIGMAS * scales[2]):
        return boot
    m = np.asarray(raw_map[0], dtype=np.float64)
    c = np.asarray(raw_map[1], dtype=np.float64)
    kappa = float(chi2.ppf(level, 1))
    low, high, _ = ar_intervals(fit, scales[1], scales[2], (m, c), kappa)
    return tuple(
        unc.Estimate(
            label=e.label,
            value=e.value,
            standard_error=e.standard_error,
            low=float(low[j]),
            high=float(high[j]),
            level=level,
            method="profile Anderson-Rubin set",
            covers=e.covers,
            flags=e.flags,
        )
        for j, e in enumerate(boot)
    )
