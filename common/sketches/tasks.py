"""Data-analysis tasks on top of M2M (M2M paper, Sections 3.4-3.5).

Each statistical task is the average of some target function over the data; its M2M estimate is
:meth:`~dpmarket.common.sketches.m2m.M2MEstimator.estimate` of that function. The target functions
are public here (``moment_function``, ``cdf_function``, ``centered_product_function``,
``range_function``), so the exact value on a data set ``x`` is ``f(x).mean(axis=0)``: the
experiments and tests compute truth and estimate with the same code.

* :func:`moments`: ``(1/n) sum_i x_ij^k`` per attribute (Section 3.4, 1).
* :func:`cdf`: ``(1/n) sum_i 1{x_ij <= s}`` at chosen thresholds per attribute (Section 4.1).
* :func:`covariance`: ``(1/n) sum_l (x_li - mu_i)(x_lj - mu_j)`` with ``mu`` estimated by M2M
  first (Section 3.4, 3).
* :func:`counting_queries`: the fraction of records in a conjunction of range predicates
  (Section 3.4, 2; Section 4.2), times ``n_hat`` for a count.
* :func:`implicit_logistic_regression`: implicit M2M (Section 3.5) — weights on the synthetic
  points, then a weighted logistic regression (scikit-learn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.sketches.m2m import M2MEstimator
from dpmarket.common.validation import check_positive_int

if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression

__all__ = [
    "ImplicitLogisticRegression",
    "cdf",
    "cdf_function",
    "centered_product_function",
    "counting_queries",
    "covariance",
    "implicit_logistic_regression",
    "moment_function",
    "moments",
    "range_function",
]

Target = Callable[[NDArray[np.float64]], NDArray[np.float64]]
#: Attribute indices (``None``: every attribute).
Attributes = Sequence[int] | NDArray[np.int64] | None


def _attributes(attributes: Attributes, d: int) -> NDArray[np.int64]:
    if attributes is None:
        return np.arange(d, dtype=np.int64)
    idx = np.asarray(attributes, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise ValueError("attributes must name at least one attribute")
    bad = (idx < 0) | (idx >= d)
    if bad.any():
        raise ValueError(f"attribute {int(idx[bad][0])} does not exist: the data have {d}")
    return idx


def _columns(x: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"records must be a 2-D array (n, d), got shape {arr.shape}")
    return arr


def moment_function(order: int, attributes: Attributes = None) -> Target:
    """``f(x) = (x_j^k)_j``: the k-th raw moment of the chosen attributes.

    Parameters
    ----------
    order : int
        ``k >= 1``.
    attributes : sequence of int, optional
        Attribute indices (default all).

    Returns
    -------
    callable
        ``f(x)`` of shape (n, len(attributes)) for records ``x`` of shape (n, d).

    Raises
    ------
    ValueError
        If ``order < 1`` (at construction) or an attribute index is out of range (when called).
    """
    k = check_positive_int(order, "order")

    def f(x: NDArray[np.float64]) -> NDArray[np.float64]:
        arr = _columns(x)
        return arr[:, _attributes(attributes, arr.shape[1])] ** k

    return f


def _thresholds(thresholds: ArrayLike, n_attrs: int) -> NDArray[np.float64]:
    t = np.asarray(thresholds, dtype=np.float64)
    if t.ndim == 1:
        t = np.broadcast_to(t, (n_attrs, t.shape[0]))
    if t.ndim != 2 or t.shape[0] != n_attrs or t.shape[1] == 0:
        raise ValueError(
            f"thresholds must have shape (q,) or ({n_attrs}, q) with q >= 1, got "
            f"{np.shape(thresholds)}"
        )
    if np.isnan(t).any():
        raise ValueError("thresholds hold NaN")
    return t


def cdf_function(thresholds: ArrayLike, attributes: Attributes = None) -> Target:
    """``f(x) = (1{x_j <= s_jt})_{j,t}``: CDF indicators, attribute-major.

    Parameters
    ----------
    thresholds : array-like of shape (q,) or (len(attributes), q)
        Points at which each attribute's CDF is wanted (the same for all, or one row each).
    attributes : sequence of int, optional

    Returns
    -------
    callable
        ``f(x)`` of shape (n, len(attributes) * q); column ``j * q + t`` is attribute
        ``attributes[j]`` at its threshold ``t``.
    """

    def f(x: NDArray[np.float64]) -> NDArray[np.float64]:
        arr = _columns(x)
        idx = _attributes(attributes, arr.shape[1])
        t = _thresholds(thresholds, idx.size)
        ind = arr[:, idx, None] <= t[None, :, :]
        return ind.reshape(arr.shape[0], -1).astype(np.float64)

    return f


def centered_product_function(means: ArrayLike) -> Target:
    """``f(x) = ((x_i - mu_i)(x_j - mu_j))_{i <= j}``: covariance targets, upper triangle.

    Parameters
    ----------
    means : array-like of shape (d,)
        ``mu`` (the paper estimates it by M2M first).

    Returns
    -------
    callable
        ``f(x)`` of shape (n, d (d + 1) / 2), pairs in ``numpy.triu_indices(d)`` order.
    """
    mu = np.asarray(means, dtype=np.float64)
    if mu.ndim != 1 or not np.isfinite(mu).all():
        raise ValueError(f"means must be a finite 1-D array, got shape {mu.shape}")
    rows, cols = np.triu_indices(mu.shape[0])

    def f(x: NDArray[np.float64]) -> NDArray[np.float64]:
        arr = _columns(x)
        if arr.shape[1] != mu.shape[0]:
            raise ValueError(f"records have {arr.shape[1]} attributes, means {mu.shape[0]}")
        c = arr - mu
        return c[:, rows] * c[:, cols]

    return f


def _range_bounds(
    lower: ArrayLike, upper: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    lo = np.atleast_2d(np.asarray(lower, dtype=np.float64))
    hi = np.atleast_2d(np.asarray(upper, dtype=np.float64))
    if lo.shape != hi.shape or lo.ndim != 2:
        raise ValueError(
            f"lower and upper must both have shape (q, d), got {np.shape(lower)} and "
            f"{np.shape(upper)}"
        )
    if np.isnan(lo).any() or np.isnan(hi).any():
        raise ValueError("range bounds hold NaN (use -inf / inf for an open side)")
    return lo, hi


def range_function(lower: ArrayLike, upper: ArrayLike) -> Target:
    """``f(x) = (1{lower_q <= x <= upper_q})_q``: conjunctions of range predicates.

    Parameters
    ----------
    lower, upper : array-like of shape (q, d)
        Query ``q`` selects the records with ``lower[q, j] <= x_j <= upper[q, j]`` for every
        ``j``; ``-inf`` / ``inf`` leave a side open (an attribute the query does not constrain
        has ``(-inf, inf)``). The paper's queries constrain three attributes, each by
        ``X_i <= u`` or ``X_i >= l``.

    Returns
    -------
    callable
        ``f(x)`` of shape (n, q), float64 (0 or 1).
    """
    lo, hi = _range_bounds(lower, upper)

    def f(x: NDArray[np.float64]) -> NDArray[np.float64]:
        arr = _columns(x)
        if arr.shape[1] != lo.shape[1]:
            raise ValueError(f"records have {arr.shape[1]} attributes, queries {lo.shape[1]}")
        out = np.empty((arr.shape[0], lo.shape[0]), dtype=np.float64)
        for q in range(lo.shape[0]):
            out[:, q] = np.all((arr >= lo[q]) & (arr <= hi[q]), axis=1)
        return out

    return f


def _as_array(value: float | NDArray[np.float64]) -> NDArray[np.float64]:
    return np.atleast_1d(np.asarray(value, dtype=np.float64))


def moments(
    estimator: M2MEstimator,
    order: int = 1,
    attributes: Attributes = None,
) -> NDArray[np.float64]:
    """M2M estimate of the k-th raw moment of each attribute.

    Returns
    -------
    ndarray of shape (len(attributes),): ``m_j^(k) ~ (1/n) sum_i x_ij^k``.
    """
    return _as_array(estimator.estimate(moment_function(order, attributes)))


def cdf(
    estimator: M2MEstimator,
    thresholds: ArrayLike,
    attributes: Attributes = None,
) -> NDArray[np.float64]:
    """M2M estimate of each attribute's CDF at its thresholds.

    Returns
    -------
    ndarray of shape (len(attributes), q): entry ``(j, t)`` estimates the fraction of records
    with ``x_j <= s_jt``. Not forced to be monotone or within [0, 1] (M2M is linear).
    """
    idx = _attributes(attributes, estimator.domain.n_attributes)
    t = _thresholds(thresholds, idx.size)
    out = _as_array(estimator.estimate(cdf_function(t, idx)))
    return out.reshape(idx.size, t.shape[1])


def covariance(estimator: M2MEstimator, means: ArrayLike | None = None) -> NDArray[np.float64]:
    """M2M estimate of the covariance matrix (population form, ``1/n``).

    Parameters
    ----------
    estimator : M2MEstimator
    means : array-like of shape (d,), optional
        ``mu``; default the M2M estimate of the first moments (the paper's procedure).

    Returns
    -------
    ndarray of shape (d, d), symmetric.
    """
    d = estimator.domain.n_attributes
    mu = moments(estimator, 1) if means is None else np.asarray(means, dtype=np.float64)
    upper = _as_array(estimator.estimate(centered_product_function(mu)))
    out = np.zeros((d, d))
    rows, cols = np.triu_indices(d)
    out[rows, cols] = upper
    out[cols, rows] = upper
    return out


def counting_queries(
    estimator: M2MEstimator, lower: ArrayLike, upper: ArrayLike
) -> NDArray[np.float64]:
    """M2M estimate of the fraction of records answering each range query.

    Parameters
    ----------
    estimator : M2MEstimator
    lower, upper : array-like of shape (q, d)
        See :func:`range_function`.

    Returns
    -------
    ndarray of shape (q,): fractions; multiply by ``estimator.n_hat`` for
    counts (``COUNT(D, S) = n * fraction``).
    """
    return _as_array(estimator.estimate(range_function(lower, upper)))


@dataclass(frozen=True, eq=False)
class ImplicitLogisticRegression:
    """A logistic regression fitted by implicit M2M, with the columns it reads.

    Attributes
    ----------
    model : sklearn.linear_model.LogisticRegression
        Fitted on the synthetic points' feature attributes.
    feature_attributes : tuple of int
        The record columns the model takes, in order (every attribute but the label).
    label_attribute : int
    sample_weight : ndarray of shape (n_s,)
        The weights the fit used.
    """

    model: LogisticRegression
    feature_attributes: tuple[int, ...]
    label_attribute: int
    sample_weight: NDArray[np.float64]

    def _features(self, x: ArrayLike) -> NDArray[np.float64]:
        arr = _columns(x)
        return arr[:, list(self.feature_attributes)]

    def decision_function(self, x: ArrayLike) -> NDArray[np.float64]:
        """Scores of records ``x`` of shape (n, d) (the label column is ignored), shape (n,)."""
        return np.asarray(self.model.decision_function(self._features(x)), dtype=np.float64)

    def predict_proba(self, x: ArrayLike) -> NDArray[np.float64]:
        """Probability of the larger label level for records ``x``, shape (n,)."""
        return np.asarray(self.model.predict_proba(self._features(x))[:, 1], dtype=np.float64)


def implicit_logistic_regression(
    estimator: M2MEstimator,
    label_attribute: int,
    *,
    feature_attributes: Sequence[int] | None = None,
    C: float = 1.0,
    negative_weights: Literal["clip", "keep"] = "clip",
    max_iter: int = 1000,
) -> ImplicitLogisticRegression:
    """Fit a logistic regression from a sketch by implicit M2M (Section 3.5).

    The logistic loss ``L_theta(x) = l(F_theta(x_bar), y)`` averaged over the data is a
    generalized moment, so its M2M estimate is ``sum_i w_i L_theta(x~_i)`` with the implicit
    weights ``w_i`` of the synthetic points, whatever ``theta`` (:meth:`M2MEstimator.weights`);
    minimizing that weighted loss is a weighted logistic regression on the synthetic points.

    Parameters
    ----------
    estimator : M2MEstimator
        Its domain must declare the label attribute as discrete with exactly two levels (the
        paper's ``[0, 1]^5 x {0, 1}``), so that the synthetic points carry labels.
    label_attribute : int
        Column of the binary label.
    feature_attributes : sequence of int, optional
        The columns the model takes, in order (default: every attribute but the label). The
        weighted loss then depends on the synthetic points through these columns and the label
        only, so the fit marginalizes the others out.
    C : float
        scikit-learn's inverse L2 regularization strength. The weights are scaled to add up to
        ``n_hat`` (the estimator's record count, :attr:`M2MEstimator.n_hat`), so ``C`` means
        what it means for a fit on ``n_hat`` real records.
    negative_weights : {"clip", "keep"}
        M2M weights can be negative, which makes the weighted loss non-convex and possibly
        unbounded below. ``"clip"`` (default) sets them to 0 before scaling (the loss is then
        convex, minimized by Newton's method, scikit-learn's ``newton-cholesky``); ``"keep"``
        passes them to scikit-learn as they are (the paper's formulation; L-BFGS).
    max_iter : int
        Passed to scikit-learn.

    Returns
    -------
    ImplicitLogisticRegression

    Raises
    ------
    ValueError
        If the label attribute is not discrete with two levels, the weights are not positive
        in total, one class gets no positive weight, or an argument is out of range.

    References
    ----------
    M2M paper, Section 3.5 (implicit M2M) and Section 4.3 (logistic regression on occupancy).
    """
    from sklearn.linear_model import LogisticRegression

    d = estimator.domain.n_attributes
    label = int(_attributes([label_attribute], d)[0])
    levels = estimator.domain.level_values(label)
    if levels is None or levels.shape[0] != 2:
        raise ValueError(
            f"the label attribute {estimator.domain.attribute_name(label)} must be declared "
            "discrete with exactly two levels in the domain (e.g. levels [0, 1])"
        )
    if negative_weights not in ("clip", "keep"):
        raise ValueError(f"negative_weights must be 'clip' or 'keep', got {negative_weights!r}")
    if not (np.isfinite(C) and C > 0):
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    w = estimator.weights()
    if negative_weights == "clip":
        w = np.maximum(w, 0.0)
    total = float(w.sum())
    if not total > 0.0:
        raise ValueError(f"the implicit M2M weights add up to {total:g}: nothing to fit")
    w = w * (estimator.n_hat / total)
    points = estimator.points
    y = points[:, label]
    for level in levels:
        if not (w[y == level] > 0).any():
            raise ValueError(
                f"no synthetic point with label {level:g} has a positive weight: the sketch "
                "gives no evidence for that class"
            )
    if feature_attributes is None:
        features = tuple(j for j in range(d) if j != label)
    else:
        features = tuple(int(j) for j in _attributes(feature_attributes, d))
        if label in features:
            raise ValueError("the label attribute cannot also be a feature")
    # With clipped weights the loss is convex and has few parameters (one per feature, and the
    # intercept), so Newton's method with a Cholesky solve reaches the optimum L-BFGS would (to
    # its tolerance) in a few steps, each one pass over the n_s points; kept negative weights
    # may make the Hessian indefinite, and L-BFGS needs none.
    solver = "newton-cholesky" if negative_weights == "clip" else "lbfgs"
    model = LogisticRegression(
        C=C, solver=solver, max_iter=check_positive_int(max_iter, "max_iter")
    )
    model.fit(points[:, list(features)], y, sample_weight=w)
    return ImplicitLogisticRegression(model, features, label, w)
