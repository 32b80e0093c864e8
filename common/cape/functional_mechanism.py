"""The improved functional mechanism (Algorithm 3) for linear and logistic regression, and the
baselines it is compared with: dp-fm (Zhang et al. 2012) and objective perturbation (Chaudhuri,
Monteleoni & Sarwate 2011).

A cost ``f_D(w) = sum_j <Lambda_j, phi_j(w)>`` is a polynomial in ``w`` whose coefficients are
averages over the records: ``Lambda_0`` (scalar), ``Lambda_1`` (shape ``(D,)``) and ``Lambda_2``
(shape ``(D, D)``). Algorithm 3 releases ``Lambda_hat_j = Lambda_j + N(0, tau_j^2)`` entrywise and
minimizes ``f_hat(w) = Lambda_hat_0 + Lambda_hat_1^T w + w^T Lambda_hat_2 w``.

Data domain (Section 4.3, Appendix H): every record has ``||x||_2 <= 1``; for linear regression ``y
in [-1, 1]``, for logistic regression ``y in {0, 1}``. The bounds that map raw data into this domain
are public parameters of a request (:func:`scale_to_bounds`), never statistics of the private data.
A data owner clamps its records to them first (:mod:`dpmarket.common.cape.spec`, as OpenDP clamps),
so every record it feeds here lies in the domain and the sensitivities below hold for its raw data
(clamping maps a record to a record, so neighbours stay neighbours); the checks here then never fail
on an owner's data, and an owner runs them under :func:`dpmarket.common.errors.on_private_data` so
that their messages, which name rows and values, stay in its log.

Neighbouring data sets differ in one record (replace-one), as in the paper.

References
----------
CAPE paper, Section 4.1-4.3 (Algorithm 3, equations (7)-(11), linear-regression sensitivities),
Appendix H (logistic regression by a second-order Taylor expansion), Appendix G (Theorem 2).
J. Zhang, Z. Zhang, X. Xiao, Y. Yang, M. Winslett, "Functional mechanism: regression analysis
under differential privacy", PVLDB 5(11), 2012. K. Chaudhuri, C. Monteleoni, A. D. Sarwate,
"Differentially private empirical risk minimization", JMLR 12, 2011, Algorithm 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.privacy import gaussian_sigma
from dpmarket.common.cape.zero_sum import draw_gaussian
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_delta, check_epsilon, check_matrix, check_positive_int

__all__ = [
    "DOMAIN_TOLERANCE",
    "TASKS",
    "FMCoefficients",
    "FMRelease",
    "Task",
    "check_domain",
    "default_floor",
    "dpfm",
    "dpfm_sensitivity",
    "empirical_loss",
    "entry_scales",
    "fit_coefficients",
    "fm_coefficients",
    "fm_objective",
    "fm_sensitivities",
    "functional_mechanism",
    "minimize_fm",
    "objective_perturbation_logistic",
    "order_scales",
    "pack_coefficients",
    "packed_size",
    "project_psd",
    "released_orders",
    "scale_to_bounds",
    "stacked_sensitivity",
    "to_raw_coefficients",
    "unpack_coefficients",
]

Task = Literal["linear", "logistic"]
TASKS: tuple[Task, ...] = ("linear", "logistic")

#: Rounding slack of the domain check: ``||x||_2 <= 1 + DOMAIN_TOLERANCE`` and ``|y| <= 1 +
#: DOMAIN_TOLERANCE`` (scale_to_bounds maps a value on a bound to the domain's edge, up to one
#: float rounding; the sensitivities hold up to this relative slack).
DOMAIN_TOLERANCE = 1e-9

#: Floor relative to the noise's spectral scale used by :func:`default_floor` (measured on the
#: synthetic regression of the experiments: 2 was as good as or better than 0.5, 1 and 4 at
#: every (D, N, epsilon) tried; 1 let noise-dominated directions blow the error up at small
#: epsilon, 4 over-shrank at moderate epsilon).
_NOISE_FLOOR_FACTOR = 2.0
#: Floor without noise (non-private fits): relative to ``trace(Lambda_2) / D``.
_EXACT_FLOOR_REL = 1e-10


def _check_task(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


# --------------------------------------------------------------------------- domain and bounds
def scale_to_bounds(
    X: ArrayLike,
    y: ArrayLike,
    feature_bounds: ArrayLike,
    target_bounds: ArrayLike | None,
    *,
    task: Task = "linear",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Map raw records into the functional mechanism's domain using public bounds.

    Each feature ``x_d`` in ``[lo_d, hi_d]`` becomes ``(2 (x_d - lo_d) / (hi_d - lo_d) - 1) /
    sqrt(D)`` in ``[-1/sqrt(D), 1/sqrt(D)]``, so ``||x||_2 <= 1``; for linear regression the target
    in ``[a, b]`` becomes ``2 (y - a) / (b - a) - 1`` in ``[-1, 1]``; for logistic regression the
    labels must already be 0 or 1.

    Parameters
    ----------
    X : array-like of shape (n, D)
        Raw features, finite.
    y : array-like of shape (n,)
        Raw targets (linear) or labels in {0, 1} (logistic).
    feature_bounds : array-like of shape (D, 2)
        Public ``[lo_d, hi_d]`` per feature, ``lo_d < hi_d``: parameters of the request, never
        computed from the private data.
    target_bounds : array-like of shape (2,) or None
        Public ``[a, b]``, ``a < b``, for linear regression; ``None`` for logistic regression.
    task : {"linear", "logistic"}

    Returns
    -------
    X_scaled : ndarray of shape (n, D), float64
        Rows of L2 norm ``<= 1``.
    y_scaled : ndarray of shape (n,), float64
        In ``[-1, 1]`` (linear) or ``{0, 1}`` (logistic).

    Raises
    ------
    ValueError
        If a feature value lies outside its bounds ("feature value out of bounds at row r, column
        c"), a target outside ``target_bounds`` (naming the row), a label is not 0 or 1, NaN/inf
        anywhere, or the bounds are malformed (shape, ``lo >= hi``, non-finite). Nothing is clipped
        here (a record outside the public bounds would void the sensitivity): an owner clamps its
        records to the bounds before (:meth:`dpmarket.common.cape.spec.CapeJobSpec.scaled`), so
        these checks never fire on its data.
    """
    t = _check_task(task)
    x = check_matrix(X, "X")
    n, d = x.shape
    yy = np.asarray(y, dtype=np.float64)
    if yy.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {yy.shape}")
    if not np.isfinite(yy).all():
        row = int(np.argmax(~np.isfinite(yy)))
        raise ValueError(f"y holds NaN or inf, first at row {row}")
    fb = np.asarray(feature_bounds, dtype=np.float64)
    if fb.shape != (d, 2):
        raise ValueError(f"feature_bounds must have shape ({d}, 2), got {fb.shape}")
    lo, hi = fb[:, 0], fb[:, 1]
    if not (np.isfinite(fb).all() and (lo < hi).all()):
        col = int(np.argmax(~(np.isfinite(lo) & np.isfinite(hi) & (lo < hi))))
        raise ValueError(
            f"feature_bounds must be finite with lo < hi, got column {col}: "
            f"[{fb[col, 0]}, {fb[col, 1]}]"
        )
    outside = (x < lo) | (x > hi)
    if outside.any():
        row, col = (int(v) for v in np.argwhere(outside)[0])
        raise ValueError(
            f"feature value out of bounds at row {row}, column {col}: {x[row, col]} not in "
            f"[{lo[col]}, {hi[col]}] ({int(outside.sum())} value(s) outside); values are never "
            "clipped"
        )
    xs = (2.0 * (x - lo) / (hi - lo) - 1.0) / math.sqrt(d)
    if t == "linear":
        if target_bounds is None:
            raise ValueError("linear regression needs target_bounds [a, b]")
        tb = np.asarray(target_bounds, dtype=np.float64)
        if tb.shape != (2,) or not np.isfinite(tb).all() or not tb[0] < tb[1]:
            raise ValueError(f"target_bounds must be [a, b] with a < b, got {tb.tolist()}")
        bad = (yy < tb[0]) | (yy > tb[1])
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"target value out of bounds at row {row}: {yy[row]} not in [{tb[0]}, {tb[1]}] "
                f"({int(bad.sum())} value(s) outside); values are never clipped"
            )
        ys = 2.0 * (yy - tb[0]) / (tb[1] - tb[0]) - 1.0
    else:
        if target_bounds is not None:
            raise ValueError(
                "logistic regression takes labels in {0, 1}: target_bounds must be None"
            )
        bad = (yy != 0.0) & (yy != 1.0)
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f"label at row {row} must be 0 or 1, got {yy[row]}")
        ys = yy.copy()
    return np.ascontiguousarray(xs), ys


def to_raw_coefficients(
    w: ArrayLike, feature_bounds: ArrayLike, target_bounds: ArrayLike | None
) -> tuple[NDArray[np.float64], float]:
    """Express a model fitted on :func:`scale_to_bounds` data in the raw units.

    Parameters
    ----------
    w : array-like of shape (D,)
        Weights on the scaled features.
    feature_bounds : array-like of shape (D, 2)
    target_bounds : array-like of shape (2,) or None
        ``None`` for logistic regression (the result is then the raw logit's coefficients).

    Returns
    -------
    coef : ndarray of shape (D,), float64
    intercept : float
        ``prediction_raw = X_raw @ coef + intercept`` equals the scaled model's prediction mapped
        back to the target's units (or the logit, for logistic regression).

    Raises
    ------
    ValueError
        If shapes do not match or bounds are malformed.
    """
    ww = np.asarray(w, dtype=np.float64)
    fb = np.asarray(feature_bounds, dtype=np.float64)
    d = ww.shape[0]
    if ww.ndim != 1 or fb.shape != (d, 2) or not (fb[:, 0] < fb[:, 1]).all():
        raise ValueError(f"w must be (D,) and feature_bounds (D, 2) with lo < hi, got {fb.shape}")
    lo, hi = fb[:, 0], fb[:, 1]
    # x_s = (2 (x - lo) / (hi - lo) - 1) / sqrt(D) = a * x + c
    a = 2.0 / ((hi - lo) * math.sqrt(d))
    c = (-2.0 * lo / (hi - lo) - 1.0) / math.sqrt(d)
    coef = a * ww
    intercept = float(c @ ww)
    if target_bounds is None:
        return coef, intercept
    tb = np.asarray(target_bounds, dtype=np.float64)
    half = (tb[1] - tb[0]) / 2.0
    # y = a_t + (b_t - a_t) (y_s + 1) / 2
    return half * coef, float(tb[0] + half * (intercept + 1.0))


def check_domain(
    X: ArrayLike, y: ArrayLike, task: Task
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate that records lie in the mechanism's domain (the owner's check before a release).

    Parameters
    ----------
    X : array-like of shape (n, D)
    y : array-like of shape (n,)
    task : {"linear", "logistic"}

    Returns
    -------
    (X, y) as float64 arrays.

    Raises
    ------
    ValueError
        If a row has ``||x||_2 > 1`` ("row r has ||x||_2 = ... > 1"), a target is outside
        ``[-1, 1]`` (linear) or not in {0, 1} (logistic), shapes disagree or values are not
        finite. The tolerance is :data:`DOMAIN_TOLERANCE`.
    """
    t = _check_task(task)
    x = check_matrix(X, "X")
    yy = np.asarray(y, dtype=np.float64)
    if yy.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {yy.shape}")
    if not np.isfinite(yy).all():
        raise ValueError(f"y holds NaN or inf, first at row {int(np.argmax(~np.isfinite(yy)))}")
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    bad = norms > 1.0 + DOMAIN_TOLERANCE
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"row {row} has ||x||_2 = {norms[row]:.6g} > 1: scale the data with public bounds "
            "(scale_to_bounds)"
        )
    if t == "linear":
        bad_y = np.abs(yy) > 1.0 + DOMAIN_TOLERANCE
        if bad_y.any():
            row = int(np.argmax(bad_y))
            raise ValueError(f"target at row {row} is {yy[row]}, outside [-1, 1]")
    else:
        bad_y = (yy != 0.0) & (yy != 1.0)
        if bad_y.any():
            row = int(np.argmax(bad_y))
            raise ValueError(f"label at row {row} must be 0 or 1, got {yy[row]}")
    return np.asarray(x, dtype=np.float64), yy


# --------------------------------------------------------------------------- coefficients
@dataclass(frozen=True)
class FMCoefficients:
    """The polynomial coefficients of a cost: ``f(w) = lam0 + lam1 @ w + w @ lam2 @ w``.

    Attributes
    ----------
    lam0 : float
        ``Lambda_0``.
    lam1 : ndarray of shape (D,), float64
        ``Lambda_1``.
    lam2 : ndarray of shape (D, D), float64
        ``Lambda_2`` (symmetric when exact; a noisy one need not be).
    """

    lam0: float
    lam1: NDArray[np.float64]
    lam2: NDArray[np.float64]

    @property
    def dim(self) -> int:
        """``D``."""
        return int(self.lam1.shape[0])


def fm_coefficients(X: ArrayLike, y: ArrayLike, task: Task) -> FMCoefficients:
    """Exact coefficients ``Lambda_0, Lambda_1, Lambda_2`` of the (approximated) average cost.

    Linear regression (Section 4.3): ``f_D(w) = (1/N) ||y - X w||^2`` gives ``Lambda_0 = (1/N)
    ||y||^2``, ``Lambda_1 = -(2/N) X^T y``, ``Lambda_2 = X^T X / N``.

    Logistic regression (Appendix H): the second-order Taylor expansion of ``log(1 + e^z)`` at
    ``z = 0``, ``log 2 + z / 2 + z^2 / 8``, gives ``f~_D(w) = log 2 + (1/N) sum_n (1/2 - y_n)
    x_n^T w + w^T (X^T X / (8N)) w``: ``Lambda_0 = log 2``, ``Lambda_1 = X^T (1/2 - y) / N``,
    ``Lambda_2 = X^T X / (8N)``.

    Parameters
    ----------
    X : array-like of shape (N, D)
        Records in the domain (``||x||_2 <= 1``).
    y : array-like of shape (N,)
        ``[-1, 1]`` (linear) or ``{0, 1}`` (logistic).
    task : {"linear", "logistic"}

    Returns
    -------
    FMCoefficients

    Raises
    ------
    ValueError
        If the records are outside the domain (:func:`check_domain`).
    """
    t = _check_task(task)
    x, yy = check_domain(X, y, t)
    n = x.shape[0]
    gram = x.T @ x / n
    if t == "linear":
        return FMCoefficients(float(yy @ yy / n), -2.0 * (x.T @ yy) / n, gram)
    return FMCoefficients(math.log(2.0), x.T @ (0.5 - yy) / n, gram / 8.0)


def fm_sensitivities(task: Task, n: int) -> tuple[float, float, float]:
    """Per-order L2 (Frobenius) sensitivities ``(Delta_0, Delta_1, Delta_2)`` for ``n`` records.

    Parameters
    ----------
    task : {"linear", "logistic"}
    n : int
        Number of records the coefficients average over (``N`` pooled, ``N_s`` at a site).

    Returns
    -------
    tuple of float
        Linear: ``(1/n, 4/n, sqrt(2)/n)``. Logistic: ``(0, 1/n, sqrt(2)/(8n))``.

    Raises
    ------
    ValueError
        If ``n`` is not an integer ``>= 1``.

    Notes
    -----
    Replace record ``(x, y)`` by ``(x', y')``, both in the domain.

    Linear. ``|Delta Lambda_0| = |y^2 - y'^2| / n <= 1/n`` (``y^2 in [0, 1]``; attained by
    ``y = 1, y' = 0``). ``||Delta Lambda_1||_2 = (2/n) ||y x - y' x'||_2 <= (2/n)(1 + 1) = 4/n``
    (attained by ``y x = e_1, y' x' = -e_1``). ``||Delta Lambda_2||_F = ||x x^T - x' x'^T||_F / n``
    and ``||x x^T - x' x'^T||_F^2 = ||x||^4 + ||x'||^4 - 2 (x^T x')^2 <= 2``, so ``Delta_2 =
    sqrt(2)/n`` (attained by orthogonal unit vectors). The paper's argument ``||U Sigma U^T||_F <=
    ||U||_F^2 ||Sigma||_F = ||Sigma||_F`` slips (``||U||_F^2 = 2`` for two orthonormal columns);
    the correct step is ``||U Sigma U^T||_F = ||Sigma||_F`` with both eigenvalues in
    ``[-1, 1]``; the value ``sqrt(2)/n`` stands.

    Logistic. ``Lambda_0 = log 2`` does not depend on the data: ``Delta_0 = 0``.
    ``||Delta Lambda_1||_2 = ||(1/2 - y) x - (1/2 - y') x'||_2 / n <= (1/2 + 1/2) / n = 1/n``
    (``|1/2 - y| = 1/2``; attained by ``y = 0, y' = 1, x = x' = e_1``). ``Delta_2 = sqrt(2) /
    (8n)`` as above.

    The stacked release of several orders is calibrated jointly (:func:`order_scales`).

    References
    ----------
    CAPE paper, Section 4.3 and Appendix H.
    """
    t = _check_task(task)
    m = float(check_positive_int(n, "n"))
    if t == "linear":
        return 1.0 / m, 4.0 / m, math.sqrt(2.0) / m
    return 0.0, 1.0 / m, math.sqrt(2.0) / (8.0 * m)


def released_orders(task: Task, *, include_constant: bool = False) -> tuple[int, ...]:
    """The orders a release contains: ``(1, 2)``, or ``(0, 1, 2)`` for linear regression with
    ``include_constant``.

    ``Lambda_0`` does not change the minimizer, so releasing it only costs privacy (with the joint
    calibration of :func:`order_scales`, three orders need ``sqrt(3/2)`` times the noise of two).
    Algorithm 3 as printed perturbs every order; ``include_constant=True`` does that. For
    logistic regression ``Lambda_0 = log 2`` is public and never released.

    Raises
    ------
    ValueError
        On an unknown task.
    """
    t = _check_task(task)
    if include_constant and t == "linear":
        return (0, 1, 2)
    return (1, 2)


def packed_size(dim: int, orders: Sequence[int]) -> int:
    """Length of :func:`pack_coefficients`' vector: 1, ``D`` and ``D^2`` per order 0, 1, 2."""
    d = check_positive_int(dim, "dim")
    sizes = {0: 1, 1: d, 2: d * d}
    return sum(sizes[j] for j in orders)


def pack_coefficients(coeffs: FMCoefficients, orders: Sequence[int]) -> NDArray[np.float64]:
    """Flatten the released orders into one vector (order 0, then 1, then ``vec(Lambda_2)``).

    Parameters
    ----------
    coeffs : FMCoefficients
    orders : sequence of int
        Increasing subset of ``(0, 1, 2)``.

    Returns
    -------
    ndarray of shape (packed_size(D, orders),), float64
        ``Lambda_2`` is flattened in C order (row-major, all ``D^2`` entries).

    Raises
    ------
    ValueError
        If ``orders`` is not an increasing subset of ``(0, 1, 2)``.
    """
    _check_orders(orders)
    parts: list[NDArray[np.float64]] = []
    for j in orders:
        if j == 0:
            parts.append(np.array([coeffs.lam0], dtype=np.float64))
        elif j == 1:
            parts.append(np.asarray(coeffs.lam1, dtype=np.float64))
        else:
            parts.append(np.asarray(coeffs.lam2, dtype=np.float64).ravel())
    return np.concatenate(parts)


def unpack_coefficients(
    packed: ArrayLike, dim: int, orders: Sequence[int], *, lam0: float = 0.0
) -> FMCoefficients:
    """Inverse of :func:`pack_coefficients`; orders not in ``orders`` are zero (``lam0`` for 0).

    Parameters
    ----------
    packed : array-like of shape (packed_size(dim, orders),)
    dim : int
    orders : sequence of int
    lam0 : float, default 0.0
        ``Lambda_0`` when order 0 is not packed (``log 2`` for logistic regression).

    Returns
    -------
    FMCoefficients

    Raises
    ------
    ValueError
        If the length does not match.
    """
    _check_orders(orders)
    d = check_positive_int(dim, "dim")
    v = np.asarray(packed, dtype=np.float64)
    if v.shape != (packed_size(d, orders),):
        raise ValueError(f"packed must have shape ({packed_size(d, orders)},), got {v.shape}")
    out0, out1, out2 = float(lam0), np.zeros(d), np.zeros((d, d))
    pos = 0
    for j in orders:
        if j == 0:
            out0 = float(v[pos])
            pos += 1
        elif j == 1:
            out1 = v[pos : pos + d].copy()
            pos += d
        else:
            out2 = v[pos : pos + d * d].reshape(d, d).copy()
            pos += d * d
    return FMCoefficients(out0, out1, out2)


def _check_orders(orders: Sequence[int]) -> None:
    o = tuple(orders)
    if not o or any(j not in (0, 1, 2) for j in o) or list(o) != sorted(set(o)):
        raise ValueError(f"orders must be an increasing subset of (0, 1, 2), got {o}")


def stacked_sensitivity(task: Task, orders: Sequence[int]) -> float:
    """L2 sensitivity of the stacked release after dividing each order by its ``Delta_j``.

    Returns ``sqrt(k)``, ``k`` the number of released orders with ``Delta_j > 0``: each block
    ``Delta Lambda_j / Delta_j`` has norm ``<= 1``, so the stack has norm ``<= sqrt(k)``.

    Raises
    ------
    ValueError
        On an unknown task or invalid orders.
    """
    _check_orders(orders)
    deltas = fm_sensitivities(task, 1)
    return math.sqrt(sum(1 for j in orders if deltas[j] > 0.0))


def order_scales(kappa: float, task: Task, n: int, orders: Sequence[int]) -> dict[int, float]:
    """Per-order noise ``tau_j = kappa Delta_j(n)`` for the released orders.

    Parameters
    ----------
    kappa : float
        Noise multiplier of the stacked, per-order-normalized release: a Gaussian mechanism of
        sensitivity :func:`stacked_sensitivity` and noise ``kappa`` (e.g. ``kappa =
        gaussian_sigma(epsilon, delta, sqrt(k))`` for a central release, or
        ``dpmarket.common.cape.privacy.calibrate_tau(..., sensitivity=sqrt(k))`` for a CAPE site).
    task : {"linear", "logistic"}
    n : int
        Records averaged (``N`` or ``N_s``).
    orders : sequence of int

    Returns
    -------
    dict
        ``{j: tau_j}`` for each released order with ``Delta_j > 0``.

    Raises
    ------
    ValueError
        If ``kappa`` is not ``> 0`` or an order with ``Delta_j = 0`` is requested.

    Notes
    -----
    How ``(epsilon, delta)`` is shared across orders. Algorithm 3 as printed calibrates each
    order separately to ``(epsilon, delta)`` (``tau_j = Delta_j / epsilon sqrt(2 log(1.25 /
    delta))``) and claims ``(epsilon, delta)`` for the whole release; by composition that is
    only ``(k epsilon, k delta)`` (the Gaussian mechanism's ``tau >= Delta / epsilon sqrt(2
    log(1.25/delta))`` also needs ``epsilon < 1``). Here the orders are one Gaussian mechanism:
    dividing order ``j`` by ``Delta_j`` makes every block's change at most 1 in L2, the stack's at
    most ``sqrt(k)``, and i.i.d. noise ``kappa`` on the scaled stack is noise ``kappa Delta_j`` on
    order ``j``. This keeps the paper's shape ``tau_j proportional to Delta_j`` and is exactly
    ``(epsilon, delta)`` when ``kappa`` is calibrated for sensitivity ``sqrt(k)``.
    """
    kap = check_epsilon(kappa, "kappa")
    deltas = fm_sensitivities(task, n)
    _check_orders(orders)
    out: dict[int, float] = {}
    for j in orders:
        if deltas[j] <= 0.0:
            raise ValueError(f"order {j} of {task} regression does not depend on the data")
        out[j] = kap * deltas[j]
    return out


def entry_scales(scales: dict[int, float], dim: int, orders: Sequence[int]) -> NDArray[np.float64]:
    """Per-entry noise of the packed vector: ``tau_j`` repeated over order ``j``'s entries."""
    d = check_positive_int(dim, "dim")
    sizes = {0: 1, 1: d, 2: d * d}
    return np.concatenate([np.full(sizes[j], scales[j]) for j in orders])


# --------------------------------------------------------------------------- minimization
def project_psd(matrix: ArrayLike, floor: float = 0.0) -> NDArray[np.float64]:
    """Symmetrize a matrix and clip its eigenvalues at ``floor`` (projection onto ``{M >= floor
    I}`` in Frobenius norm).

    Parameters
    ----------
    matrix : array-like of shape (D, D)
    floor : float, default 0.0
        ``>= 0``. With 0 this is the Frobenius projection onto the PSD cone, the identity on a
        symmetric PSD input (up to the eigendecomposition's rounding).

    Returns
    -------
    ndarray of shape (D, D), float64, symmetric, eigenvalues ``>= floor``.

    Raises
    ------
    ValueError
        If the matrix is not square, holds NaN/inf, or ``floor`` is negative or not finite.

    Notes
    -----
    A noisy ``Lambda_hat_2`` may be indefinite, and then ``f_hat(w)`` has no minimizer (it goes to
    ``-inf`` along a negative eigenvector). Only the symmetric part of ``Lambda_hat_2`` enters
    ``w^T Lambda_hat_2 w``; clipping its eigenvalues at a positive floor gives the nearest (in
    Frobenius norm) matrix with a finite, unique minimizer. This is post-processing of the
    release: it costs no privacy.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"matrix must be square, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("matrix holds NaN or inf values")
    f = float(floor)
    if not (math.isfinite(f) and f >= 0.0):
        raise ValueError(f"floor must be finite and >= 0, got {floor}")
    sym = 0.5 * (m + m.T)
    vals, vecs = np.linalg.eigh(sym)
    if vals[0] >= f:
        return sym
    clipped = np.maximum(vals, f)
    out: NDArray[np.float64] = (vecs * clipped) @ vecs.T
    return 0.5 * (out + out.T)


def default_floor(dim: int, noise_std: float = 0.0, *, trace: float = 0.0) -> float:
    """Eigenvalue floor for minimizing a (noisy) quadratic: twice the noise's spectral scale.

    Parameters
    ----------
    dim : int
        ``D``.
    noise_std : float, default 0.0
        Standard deviation of the noise on each entry of the (unsymmetrized) ``Lambda_hat_2`` as
        the minimizer sees it (at the aggregator): a public function of the calibration.
    trace : float, default 0.0
        ``trace(Lambda_2)``, used only when ``noise_std == 0`` (exact, non-private fits).

    Returns
    -------
    float
        ``2 noise_std sqrt(2 D)`` if ``noise_std > 0``: the spectral norm of the symmetrized
        noise ``(E + E^T) / 2`` (off-diagonal variance ``noise_std^2 / 2``) is about
        ``2 sqrt(D noise_std^2 / 2) = noise_std sqrt(2 D)``; eigenvalues below it are
        indistinguishable from noise, and directions with eigenvalues near it amplify the noise
        of ``Lambda_hat_1``, hence the factor 2 (chosen by measurement, see
        ``_NOISE_FLOOR_FACTOR``). Post-processing of public values: no privacy cost.
        Without noise, ``1e-10 trace / D`` (a numerical ridge for singular Gram matrices), at
        least ``1e-300``.

    Raises
    ------
    ValueError
        If ``dim < 1`` or ``noise_std`` is negative.
    """
    d = check_positive_int(dim, "dim")
    s = float(noise_std)
    if not (math.isfinite(s) and s >= 0.0):
        raise ValueError(f"noise_std must be finite and >= 0, got {noise_std}")
    if s > 0.0:
        return _NOISE_FLOOR_FACTOR * s * math.sqrt(2.0 * d)
    return max(_EXACT_FLOOR_REL * float(trace) / d, 1e-300)


def minimize_fm(coeffs: FMCoefficients, *, floor: float) -> NDArray[np.float64]:
    """Minimizer of ``f_hat(w) = lam0 + lam1 @ w + w @ lam2 @ w`` after :func:`project_psd`.

    ``grad f_hat = lam1 + 2 sym(lam2) w = 0`` gives ``w = -(1/2) P^-1 lam1`` with ``P =
    project_psd(lam2, floor)``, solved by ``np.linalg.solve``.

    Parameters
    ----------
    coeffs : FMCoefficients
    floor : float
        ``> 0``: the eigenvalue floor (:func:`default_floor`), so that the solve is finite.

    Returns
    -------
    ndarray of shape (D,), float64
        Finite.

    Raises
    ------
    ValueError
        If ``floor`` is not ``> 0`` or the coefficients are not finite.
    """
    f = check_epsilon(floor, "floor")
    lam1 = np.asarray(coeffs.lam1, dtype=np.float64)
    if not np.isfinite(lam1).all():
        raise ValueError("lam1 holds NaN or inf values")
    p = project_psd(coeffs.lam2, f)
    out = np.asarray(-0.5 * np.linalg.solve(p, lam1), dtype=np.float64)
    return out


def fm_objective(w: ArrayLike, coeffs: FMCoefficients) -> float:
    """``f_hat(w) = lam0 + lam1 @ w + w @ lam2 @ w`` (equation (10)).

    Parameters
    ----------
    w : array-like of shape (D,)
    coeffs : FMCoefficients

    Returns
    -------
    float
    """
    ww = np.asarray(w, dtype=np.float64)
    return float(coeffs.lam0 + coeffs.lam1 @ ww + ww @ coeffs.lam2 @ ww)


def empirical_loss(w: ArrayLike, X: ArrayLike, y: ArrayLike, task: Task) -> float:
    """The true average cost ``f_D(w)``: ``(1/N) ||y - X w||^2`` (equation (14)) or the average
    logistic loss ``(1/N) sum log(1 + e^(x^T w)) - y x^T w`` (equation (16)).

    Parameters
    ----------
    w : array-like of shape (D,)
    X : array-like of shape (N, D)
    y : array-like of shape (N,)
    task : {"linear", "logistic"}

    Returns
    -------
    float
    """
    t = _check_task(task)
    x = np.asarray(X, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64)
    z = x @ np.asarray(w, dtype=np.float64)
    if t == "linear":
        r = yy - z
        return float(r @ r / x.shape[0])
    return float(np.mean(np.logaddexp(0.0, z) - yy * z))


# --------------------------------------------------------------------------- Algorithm 3
@dataclass(frozen=True)
class FMRelease:
    """Result of a functional-mechanism fit.

    Attributes
    ----------
    w : ndarray of shape (D,), float64
        The minimizer of the noisy objective (after PSD projection).
    coefficients : FMCoefficients
        The noisy coefficients the minimizer used (before symmetrization and projection).
    scales : dict
        ``{j: tau_j}``: noise standard deviation on each entry of order ``j`` as the minimizer
        sees it (empty for a non-private fit).
    floor : float
        The eigenvalue floor used.
    clipped : int
        Number of eigenvalues of ``sym(Lambda_hat_2)`` below the floor (raised to it).
    """

    w: NDArray[np.float64]
    coefficients: FMCoefficients
    scales: dict[int, float]
    floor: float
    clipped: int


def fit_coefficients(
    coeffs: FMCoefficients, *, noise_std2: float, floor: float | None, scales: dict[int, float]
) -> FMRelease:
    """Minimize ``coeffs`` with the floor given or :func:`default_floor` of ``noise_std2``."""
    d = coeffs.dim
    fl = (
        default_floor(d, noise_std2, trace=float(np.trace(coeffs.lam2)))
        if floor is None
        else check_epsilon(floor, "floor")
    )
    sym = 0.5 * (coeffs.lam2 + coeffs.lam2.T)
    clipped = int(np.sum(np.linalg.eigvalsh(sym) < fl))
    return FMRelease(minimize_fm(coeffs, floor=fl), coeffs, scales, fl, clipped)


def functional_mechanism(
    X: ArrayLike,
    y: ArrayLike,
    task: Task,
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    *,
    include_constant: bool = False,
    calibration: Literal["analytic", "paper"] = "analytic",
    floor: float | None = None,
) -> FMRelease:
    """Algorithm 3 on one data set (the pooled-DP baseline, or one site alone: "local").

    Parameters
    ----------
    X : array-like of shape (N, D)
        Records in the domain (:func:`scale_to_bounds`).
    y : array-like of shape (N,)
    task : {"linear", "logistic"}
    epsilon : float
        ``> 0``.
    delta : float
        In ``(0, 1)``.
    noise : NoiseSource
        Draws, in this order: order 0 (if released), order 1 (``D`` values), order 2 (``D^2``
        values, row-major), one ``noise.gaussian`` call each.
    include_constant : bool, default False
        Release ``Lambda_0`` too (:func:`released_orders`).
    calibration : {"analytic", "paper"}
        ``"analytic"``: ``kappa = gaussian_sigma(epsilon, delta, sqrt(k))`` and ``tau_j =
        kappa Delta_j`` (the release is ``(epsilon, delta)``-DP, :func:`order_scales`);
        ``"paper"``: ``tau_j = Delta_j / epsilon sqrt(2 log(1.25 / delta))`` per order, as
        Section 5.2 (each order ``(epsilon, delta)``-DP for ``epsilon < 1``; the whole release
        only ``(k epsilon, k delta)``).
    floor : float, optional
        Eigenvalue floor; default :func:`default_floor` of ``tau_2``.

    Returns
    -------
    FMRelease

    Raises
    ------
    ValueError
        If the records are outside the domain or a parameter is invalid.

    References
    ----------
    CAPE paper, Algorithm 3 and Theorem 2; Balle & Wang 2018 (analytic calibration).
    """
    t = _check_task(task)
    coeffs = fm_coefficients(X, y, t)
    eps = check_epsilon(epsilon)
    dl = check_delta(delta)
    n = int(np.asarray(X).shape[0])
    orders = released_orders(t, include_constant=include_constant)
    if calibration == "analytic":
        kappa = gaussian_sigma(eps, dl, stacked_sensitivity(t, orders))
    elif calibration == "paper":
        kappa = math.sqrt(2.0 * math.log(1.25 / dl)) / eps
    else:
        raise ValueError(f"calibration must be 'analytic' or 'paper', got {calibration!r}")
    scales = order_scales(kappa, t, n, orders)
    d = coeffs.dim
    packed = pack_coefficients(coeffs, orders)
    noisy = packed + draw_gaussian(entry_scales(scales, d, orders), packed.shape[0], noise)
    lam0 = coeffs.lam0 if t == "logistic" else 0.0
    noisy_coeffs = unpack_coefficients(noisy, d, orders, lam0=lam0)
    return fit_coefficients(noisy_coeffs, noise_std2=scales[2], floor=floor, scales=scales)


# --------------------------------------------------------------------------- dp-fm (Zhang)
def dpfm_sensitivity(task: Task, dim: int, n: int) -> float:
    """Zhang et al.'s L1 sensitivity of all monomial coefficients, as the CAPE paper quotes it.

    Linear regression ``2 (D + 1)^2 / N`` (Section 4.3); logistic regression ``(D^2/4 + 3D) / N``
    (Appendix H).

    Parameters
    ----------
    task : {"linear", "logistic"}
    dim : int
        ``D``.
    n : int
        ``N``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        On an unknown task or non-positive ``dim`` or ``n``.

    Notes
    -----
    Sound for the domain ``||x||_2 <= 1``: the coefficients of one record's monomials (``y^2``,
    ``-2 y x_d``, ``x_i^2`` and ``2 x_i x_j`` for ``i < j``) have L1 norm ``<= 1 + 2 ||x||_1 +
    ||x||_1^2 <= (1 + sqrt(D))^2 <= (D + 1)^2``, and replacing a record changes the sum by at most
    twice that. For logistic regression the record's coefficients (``(1/2 - y) x_d``, ``x_i x_j /
    8`` and ``x_i x_j / 4``) have L1 norm ``<= sqrt(D) / 2 + D / 8``, twice of which is ``<= D^2/4
    + 3D``. Both are the conservative bounds the paper compares with.
    """
    t = _check_task(task)
    d = check_positive_int(dim, "dim")
    m = check_positive_int(n, "n")
    if t == "linear":
        return 2.0 * (d + 1.0) ** 2 / m
    return (d * d / 4.0 + 3.0 * d) / m


def dpfm(
    X: ArrayLike,
    y: ArrayLike,
    task: Task,
    epsilon: float,
    noise: NoiseSource,
    *,
    floor: float | None = None,
) -> FMRelease:
    """The original functional mechanism (dp-fm): Laplace noise on every monomial coefficient.

    Adds ``Laplace(Delta_dpfm / epsilon)`` (:func:`dpfm_sensitivity`) to the constant (linear
    regression only), to the ``D`` linear coefficients and to the ``D (D + 1) / 2`` quadratic
    monomial coefficients ``c_ii = Lambda_2[i, i]``, ``c_ij = 2 Lambda_2[i, j]`` (``i < j``), then
    minimizes as Algorithm 3 (PSD projection, floor default :func:`default_floor` of the
    Laplace standard deviation ``sqrt(2) b`` on the unsymmetrized entries).

    Parameters
    ----------
    X, y, task
        As :func:`functional_mechanism`.
    epsilon : float
        ``epsilon``-DP (pure).
    noise : NoiseSource
        Draws: constant (linear only, 1 value), linear (``D``), quadratic upper triangle
        row-major (``D (D + 1) / 2``), one ``noise.laplace`` call each.
    floor : float, optional

    Returns
    -------
    FMRelease

    References
    ----------
    Zhang et al., PVLDB 2012, Algorithm 1; CAPE paper, Section 4.1.
    """
    t = _check_task(task)
    coeffs = fm_coefficients(X, y, t)
    eps = check_epsilon(epsilon)
    d = coeffs.dim
    n = int(np.asarray(X).shape[0])
    b = dpfm_sensitivity(t, d, n) / eps
    lam0 = coeffs.lam0
    if t == "linear":
        lam0 = lam0 + float(noise.laplace(b, 1)[0])
    lam1 = coeffs.lam1 + noise.laplace(b, d)
    iu = np.triu_indices(d)
    mono = np.where(iu[0] == iu[1], 1.0, 2.0) * coeffs.lam2[iu]
    mono = mono + noise.laplace(b, mono.shape[0])
    lam2 = np.zeros((d, d))
    lam2[iu] = np.where(iu[0] == iu[1], mono, mono / 2.0)
    lam2 = np.triu(lam2) + np.triu(lam2, 1).T
    noisy = FMCoefficients(lam0, lam1, lam2)
    # the symmetric matrix has Laplace std sqrt(2) b on the diagonal, sqrt(2) b / 2 off it: the
    # same spectral scale as i.i.d. std sqrt(2) b symmetrized.
    return fit_coefficients(noisy, noise_std2=math.sqrt(2.0) * b, floor=floor, scales={})


# --------------------------------------------------------------------------- objPert
def objective_perturbation_logistic(
    X: ArrayLike,
    y: ArrayLike,
    epsilon: float,
    *,
    reg: float,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """Objective perturbation for regularized logistic regression (Chaudhuri et al. 2011, Alg. 2).

    Minimizes ``(1/n) sum_i log(1 + exp(-z_i w^T x_i)) + (reg / 2) ||w||^2 + b^T w / n + (Delta /
    2) ||w||^2`` with ``z_i = 2 y_i - 1`` in ``{-1, +1}``, ``c = 1/4`` (the bound on the logistic
    loss's second derivative), ``epsilon' = epsilon - log(1 + 2c / (n reg) + c^2 / (n reg)^2)``;
    if ``epsilon' > 0`` then ``Delta = 0``, else ``Delta = c / (n (e^(epsilon / 4) - 1)) - reg``
    and ``epsilon' = epsilon / 2``; ``b`` has density proportional to ``exp(-epsilon' ||b|| /
    2)``: ``||b|| ~ Gamma(D, 2 / epsilon')`` in a uniform direction.

    Parameters
    ----------
    X : array-like of shape (n, D)
        ``||x||_2 <= 1``.
    y : array-like of shape (n,)
        Labels in {0, 1}.
    epsilon : float
        ``epsilon``-DP (pure).
    reg : float
        Regularization ``Lambda > 0`` (a public parameter).
    rng : numpy.random.Generator
        Draws, in order: the direction (``D`` standard normals, normalized), then the norm (one
        Gamma). numpy's samplers, not floating-point safe: a baseline for experiments.

    Returns
    -------
    ndarray of shape (D,), float64

    Raises
    ------
    ValueError
        If the records are outside the domain, ``epsilon`` or ``reg`` is not ``> 0``.

    Notes
    -----
    Linear regression has no objective-perturbation baseline here: Chaudhuri et al.'s Theorem 9
    needs a loss of the margin ``y w^T x`` with ``|l'| <= 1`` everywhere; the square loss
    ``(y - w^T x)^2`` has a gradient that grows without bound in ``w``, so no noise scale gives a
    guarantee on an unconstrained domain (constrained variants, e.g. Kifer, Smith & Thakurta 2012,
    are different algorithms).
    """
    x, yy = check_domain(X, y, "logistic")
    eps = check_epsilon(epsilon)
    lam = check_epsilon(reg, "reg")
    n, d = x.shape
    c = 0.25
    eps_p = eps - math.log(1.0 + 2.0 * c / (n * lam) + (c / (n * lam)) ** 2)
    extra = 0.0
    if eps_p <= 0.0:
        extra = c / (n * math.expm1(eps / 4.0)) - lam
        eps_p = eps / 2.0
    direction = rng.standard_normal(d)
    direction = direction / float(np.linalg.norm(direction))
    b = direction * float(rng.gamma(shape=d, scale=2.0 / eps_p))
    z = 2.0 * yy - 1.0
    total_reg = lam + extra

    def objective(w: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        m = z * (x @ w)
        value = (
            float(np.mean(np.logaddexp(0.0, -m)))
            + 0.5 * total_reg * float(w @ w)
            + float(b @ w) / n
        )
        sig = np.exp(-np.logaddexp(0.0, m))  # 1 / (1 + e^m)
        grad = -(x.T @ (z * sig)) / n + total_reg * w + b / n
        return value, grad

    from scipy.optimize import minimize  # on first use: a client reading a spec needs no scipy

    res = minimize(objective, np.zeros(d), jac=True, method="L-BFGS-B")
    out: NDArray[np.float64] = np.asarray(res.x, dtype=np.float64)
    return out
