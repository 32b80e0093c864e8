"""The public specifications of CAPE jobs: what is computed, on which columns with which public
bounds, at which guarantee.

* :class:`CapeJobSpec`: a capeFM model (linear or logistic regression, Algorithm 4);
* :class:`CapeMeanSpec`: the mean vector of some columns (Algorithm 2);
* :class:`CapeTrainingSpec`: the paper's 2-layer network trained by distributed DP gradient
  descent (Section 5.1), one CAPE release per iteration.

Every party computes the same plan from a spec and the sites' row counts, so an owner derives its
own noise scale and guarantee instead of trusting the curator's numbers. Bounds are parameters of
the request, never statistics of the private data. A value outside them is clamped to them, as
OpenDP's ``make_clamp`` does (:func:`clamp_to_bounds`): what an owner answers must not depend on
whether its rows fit the bounds a requester chose (an error naming the row, the value or how many
lie outside would turn the bounds into a record reader and a range-count oracle). How many values
were clamped is returned for the owner's own log only. A 0/1 target cannot be clamped into
meaning: the owner accepts only a target column it declared 0/1 when it started (checked then, on
its own console), and refuses any other with a message that names only public inputs.

Notes
-----
Clamping keeps every sensitivity stated here and in :mod:`dpmarket.common.cape.mean`,
:mod:`dpmarket.common.cape.functional_mechanism` and :mod:`dpmarket.common.cape.dpgd`: it maps each
record to a record inside the box, one record at a time, so two data sets that differ in one record
are still two data sets inside the box that differ in (at most) one record, and the mechanism's
guarantee for data in the box holds for the raw data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.capefm import CapeFMPlan, plan_capefm
from dpmarket.common.cape.dpgd import CapeTrainingPlan, n_params, plan_training, training_loss_sigma
from dpmarket.common.cape.functional_mechanism import Task, scale_to_bounds, to_raw_coefficients
from dpmarket.common.cape.mean import CapeMeanPlan, plan_mean
from dpmarket.common.validation import check_not_tiny

#: Name of the constant feature added for an intercept.
INTERCEPT = "(intercept)"

#: The largest magnitude of a spec's bounds, clipping norm and learning rate. Every statistic an
#: owner computes on records inside such bounds stays finite (a mean, a sum of up to ``1e200``
#: such values, a width ``high - low``), and with its release's noise far below the largest
#: float: an owner's computation on these public numbers cannot overflow on some records and not
#: on others (:func:`dpmarket.owner.cape._check_headroom`).
MAX_MAGNITUDE = 1e100


def _check_magnitude(name: str, *values: float) -> None:
    """Raise ``ValueError`` unless every value is finite with ``|value| <= MAX_MAGNITUDE``, and
    0 or at least :data:`~dpmarket.common.validation.PARAMETER_FLOOR` in magnitude (a smaller
    one makes products with records' values subnormal: an owner's time would follow them)."""
    if not all(math.isfinite(v) and abs(v) <= MAX_MAGNITUDE for v in values):
        raise ValueError(
            f"{name} must be finite and within +-{MAX_MAGNITUDE:g}, got {list(values)}"
        )
    check_not_tiny(np.asarray(values, dtype=np.float64), name)


def clamp_to_bounds(
    values: ArrayLike, low: ArrayLike, high: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Clamp every value to its column's public bounds, as OpenDP's ``make_clamp``.

    Parameters
    ----------
    values : array-like of shape (n, D) or (n,)
        Finite values (an owner's table is checked finite when it is loaded).
    low, high : array-like of shape (D,) or scalars
        The public bounds, ``low <= high``; they broadcast against a row.

    Returns
    -------
    clamped : ndarray of the shape of ``values``, float64
        ``min(max(value, low), high)``.
    moved : ndarray of shape (D,) (``(1,)`` for a vector), int64
        How many values of each column were moved. A statistic of the data: for the owner's own
        log, never for another party.

    Raises
    ------
    ValueError
        If a value is NaN or infinite (a fixed message, naming no row or value).
    """
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("values must be finite to be clamped")
    lo = np.asarray(low, dtype=np.float64)
    hi = np.asarray(high, dtype=np.float64)
    clamped = np.minimum(np.maximum(x, lo), hi)
    moved = np.atleast_1d((clamped != x).sum(axis=0)).astype(np.int64)
    return clamped, moved


class Clamped(NamedTuple):
    """A job's records clamped to its public bounds (raw units).

    Attributes
    ----------
    features : ndarray of shape (n, D), float64
    target : ndarray of shape (n,), float64, or None
        The target column (clamped for linear regression only; a 0/1 target is left as it is).
    moved : dict of str to int
        Values moved per column, for columns where some were. For the owner's own log only.
    """

    features: NDArray[np.float64]
    target: NDArray[np.float64] | None
    moved: dict[str, int]


def _clamp_features(
    features: ArrayLike, columns: Sequence[tuple[str, float, float]]
) -> tuple[NDArray[np.float64], dict[str, int]]:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(columns):
        raise ValueError(f"features must have shape (n, {len(columns)}), got {x.shape}")
    low, high = np.asarray([c[1:] for c in columns], dtype=np.float64).reshape(-1, 2).T
    clamped, moved = clamp_to_bounds(x, low, high)
    return clamped, {c[0]: int(m) for c, m in zip(columns, moved, strict=True) if m}


def _clamp_records(
    features: ArrayLike,
    columns: Sequence[tuple[str, float, float]],
    target: ArrayLike,
    target_bounds: tuple[str, float, float] | None,
) -> Clamped:
    """Features clamped to their bounds and the target to ``target_bounds`` (``None``: a 0/1
    target, left as it is but required finite)."""
    x, moved = _clamp_features(features, columns)
    y = np.asarray(target, dtype=np.float64)
    if y.shape != (x.shape[0],):
        raise ValueError(f"target must have shape ({x.shape[0]},), got {y.shape}")
    if target_bounds is None:
        if not np.isfinite(y).all():
            raise ValueError("values must be finite to be clamped")
        return Clamped(x, y, moved)
    y, moved_y = clamp_to_bounds(y, target_bounds[1], target_bounds[2])
    if moved_y[0]:
        moved[target_bounds[0]] = int(moved_y[0])
    return Clamped(x, y, moved)


def _check_labels(y: NDArray[np.float64], column: str) -> None:
    """Raise ``ValueError`` unless ``y`` holds only 0 and 1; the message names the column only.

    An owner never gets here with another column: it accepts only a target it declared 0/1 and
    checked when it started (:class:`dpmarket.runtime.tables.Table`).
    """
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"target column {column!r} must hold only 0 and 1")


@dataclass(frozen=True)
class CapeJobSpec:
    """What a job fits, with its public parameters.

    Attributes
    ----------
    task : {"linear", "logistic"}
    features : tuple of (str, float, float)
        Feature columns with their public bounds ``(column, low, high)``.
    target : (str, float, float)
        Target column and its public bounds (used for linear regression).
    epsilon, delta : float
        Each site's guarantee against the aggregator and ``colluders`` other sites.
    colluders : int or None
        ``S_C`` (``None``: ``ceil(S / 3) - 1``).
    calibration : {"exact", "theorem1"}
    fit_intercept : bool
        Add a constant feature with bounds [0, 1].

    Raises
    ------
    ValueError
        For a malformed spec (no features, unnamed or repeated columns, ``low >= high``, a
        bound beyond :data:`MAX_MAGNITUDE`, non-finite or out-of-range epsilon/delta).
    """

    task: Task
    features: tuple[tuple[str, float, float], ...]
    target: tuple[str, float, float]
    epsilon: float
    delta: float
    colluders: int | None = None
    calibration: str = "exact"
    fit_intercept: bool = True

    def __post_init__(self) -> None:
        if self.task not in ("linear", "logistic"):
            raise ValueError(f"task must be 'linear' or 'logistic', got {self.task!r}")
        if not self.features:
            raise ValueError("a job needs at least one feature column")
        names = [f[0] for f in self.features] + [self.target[0]]
        if len(set(names)) != len(names) or INTERCEPT in names or not all(names):
            raise ValueError(f"feature and target columns must be named and distinct, got {names}")
        for column, low, high in (*self.features, self.target):
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"bounds of {column!r} must be finite with low < high")
            _check_magnitude(f"bounds of {column!r}", low, high)
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.calibration not in ("exact", "theorem1"):
            raise ValueError(f"calibration must be 'exact' or 'theorem1', got {self.calibration!r}")

    @property
    def cost(self) -> tuple[float, float]:
        """``(epsilon, delta)`` charged to every owner for the job (one release)."""
        return self.epsilon, self.delta

    @property
    def mechanism(self) -> str:
        """How the owner's ledger names the release."""
        return f"capeFM {self.task} regression (zero-sum Gaussian noise, {self.calibration})"

    @property
    def dim(self) -> int:
        """``D``: the features, plus one for the intercept."""
        return len(self.features) + int(self.fit_intercept)

    @property
    def feature_bounds(self) -> NDArray[np.float64]:
        """Shape (D, 2): the public bounds, the intercept's [0, 1] last."""
        rows = [(low, high) for _, low, high in self.features]
        if self.fit_intercept:
            rows.append((0.0, 1.0))
        return np.asarray(rows, dtype=np.float64)

    @property
    def target_bounds(self) -> NDArray[np.float64] | None:
        """Shape (2,) for linear regression; ``None`` for logistic regression."""
        if self.task == "logistic":
            return None
        return np.asarray(self.target[1:], dtype=np.float64)

    def plan(self, sizes: Sequence[int]) -> CapeFMPlan:
        """The public plan for sites of these row counts (the same at every party)."""
        return plan_capefm(
            self.task,
            self.dim,
            sizes,
            self.epsilon,
            self.delta,
            colluders=self.colluders,
            calibration=self.calibration,  # type: ignore[arg-type]
        )

    @property
    def columns(self) -> tuple[str, ...]:
        """The feature columns, in order (the intercept excluded)."""
        return tuple(f[0] for f in self.features)

    @property
    def coefficient_labels(self) -> tuple[str, ...]:
        """What :meth:`raw_coefficients` returns, in order: the columns, then :data:`INTERCEPT`
        (a model in raw units has one even without ``fit_intercept``: the scaling shifts)."""
        return (*self.columns, INTERCEPT)

    def raw_coefficients(self, w: ArrayLike) -> tuple[NDArray[np.float64], float]:
        """A fit on :meth:`scaled` records in the columns' raw units.

        Parameters
        ----------
        w : array-like of shape (dim,)
            Weights on the scaled features (the constant feature last, with an intercept).

        Returns
        -------
        weights : ndarray of shape (len(features),), float64
        intercept : float
            Prediction (or logit) ``= intercept + x @ weights`` on raw, clamped records.
        """
        weights, intercept = to_raw_coefficients(w, self.feature_bounds, self.target_bounds)
        if self.fit_intercept:
            intercept += float(weights[-1])
            weights = weights[:-1]
        return weights, float(intercept)

    def raw_map(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(M, c)``, shapes ``(K, dim)`` and ``(K,)``: the raw coefficients
        (:attr:`coefficient_labels`, ``K`` of them) are ``M @ w + c``.

        :meth:`raw_coefficients` is affine in ``w`` (``to_raw_coefficients`` scales and shifts),
        so its values at ``0`` and at the unit vectors give ``M`` and ``c`` exactly.
        """

        def stacked(w: NDArray[np.float64]) -> NDArray[np.float64]:
            weights, intercept = self.raw_coefficients(w)
            return np.append(weights, intercept)

        c = stacked(np.zeros(self.dim))
        m = np.column_stack([stacked(e) - c for e in np.eye(self.dim)])
        return m, c

    @property
    def covers(self) -> str:
        """What a fit's interval covers (:mod:`dpmarket.common.cape.uncertainty`)."""
        model = (
            "ordinary least squares"
            if self.task == "linear"
            else "the minimizer of the logistic loss's second-order Taylor approximation (the "
            "functional mechanism's cost; not the maximum-likelihood fit)"
        )
        return (
            f"the non-private fit on the pooled records clamped into the public bounds: {model} "
            "(noise only: no sampling error of the data)"
        )

    def clamped(self, features: ArrayLike, target: ArrayLike) -> Clamped:
        """Raw records clamped to the public bounds (the linear target too; a logistic target
        is left as it is).

        Parameters
        ----------
        features : array-like of shape (n, len(features))
            The feature columns, in the spec's order.
        target : array-like of shape (n,)

        Raises
        ------
        ValueError
            On shapes, or a NaN or infinite value (fixed messages, naming no row or value).
        """
        return _clamp_records(
            features, self.features, target, self.target if self.task == "linear" else None
        )

    def scaled(
        self, features: ArrayLike, target: ArrayLike
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Raw records, clamped to the public bounds (:meth:`clamped`, same parameters), in the
        functional mechanism's domain (``||x|| <= 1``, a linear target in ``[-1, 1]``).

        Raises
        ------
        ValueError
            On shapes or NaN/inf, or a logistic target that is not 0/1 (naming the column only).
        """
        x, y, _ = self.clamped(features, target)
        assert y is not None
        return self.scale_clamped(x, y)

    def scale_clamped(
        self, x: NDArray[np.float64], y: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Records already clamped by :meth:`clamped` (shapes (n, len(features)) and (n,)), in
        the functional mechanism's domain, as :meth:`scaled` returns them.

        Raises
        ------
        ValueError
            If the target is logistic and not 0/1 (naming the column only).
        """
        if self.task == "logistic":
            _check_labels(y, self.target[0])
        if self.fit_intercept:
            x = np.hstack([x, np.ones((x.shape[0], 1))])
        return scale_to_bounds(x, y, self.feature_bounds, self.target_bounds, task=self.task)


def _check_columns(
    features: tuple[tuple[str, float, float], ...], others: tuple[str, ...] = ()
) -> None:
    """Raise ``ValueError`` unless there is a column, names are distinct and bounds finite."""
    if not features:
        raise ValueError("a job needs at least one column")
    names = [f[0] for f in features] + list(others)
    if len(set(names)) != len(names) or INTERCEPT in names or not all(names):
        raise ValueError(f"columns must be named and distinct, got {names}")
    for column, low, high in features:
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"bounds of {column!r} must be finite with low < high")
        _check_magnitude(f"bounds of {column!r}", low, high)


def _check_guarantee(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


@dataclass(frozen=True)
class CapeMeanSpec:
    """The mean vector of some columns across the owners, each within public bounds.

    Attributes
    ----------
    features : tuple of (str, float, float)
        The columns ``(column, low, high)``, in the order of the estimate.
    epsilon, delta : float
        Each site's guarantee against the aggregator and ``colluders`` other sites.
    colluders : int or None
        ``S_C`` (``None``: ``ceil(S / 3) - 1``).
    calibration : {"exact", "theorem1"}

    Raises
    ------
    ValueError
        For a malformed spec (no column, repeated columns, ``low >= high``, a bound beyond
        :data:`MAX_MAGNITUDE`, non-finite or out-of-range epsilon/delta).

    Notes
    -----
    Sensitivity: :func:`dpmarket.common.cape.mean.mean_sensitivity`, ``||high - low||_2 / N_s``
    under the replacement of one record of one site; it holds for the raw data because the owner
    clamps every record into the box first (:meth:`clamped`, module Notes).
    """

    features: tuple[tuple[str, float, float], ...]
    epsilon: float
    delta: float
    colluders: int | None = None
    calibration: str = "exact"

    task = "mean"

    def __post_init__(self) -> None:
        _check_columns(self.features)
        _check_guarantee(self.epsilon, self.delta)
        if self.calibration not in ("exact", "theorem1"):
            raise ValueError(f"calibration must be 'exact' or 'theorem1', got {self.calibration!r}")

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns, in order."""
        return tuple(f[0] for f in self.features)

    @property
    def bounds(self) -> NDArray[np.float64]:
        """Shape (D, 2): the public bounds."""
        return np.asarray([f[1:] for f in self.features], dtype=np.float64)

    @property
    def cost(self) -> tuple[float, float]:
        """``(epsilon, delta)`` charged to every owner for the job."""
        return self.epsilon, self.delta

    @property
    def mechanism(self) -> str:
        """How the owner's ledger names the release."""
        return f"CAPE mean (zero-sum Gaussian noise, {self.calibration})"

    def clamped(self, values: ArrayLike, target: ArrayLike | None = None) -> Clamped:
        """The columns' values (shape (n, D), in the spec's order) clamped to the bounds.

        Parameters
        ----------
        values : array-like of shape (n, D)
        target : None
            A mean has no target (the argument keeps the specs' calls alike).

        Raises
        ------
        ValueError
            On shapes, or a NaN or infinite value (fixed messages, naming no row or value).
        """
        x, moved = _clamp_features(values, self.features)
        return Clamped(x, None, moved)

    def plan(self, sizes: Sequence[int]) -> CapeMeanPlan:
        """The public plan for sites of these row counts."""
        return plan_mean(
            self.bounds,
            sizes,
            self.epsilon,
            self.delta,
            colluders=self.colluders,
            calibration=self.calibration,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class CapeTrainingSpec:
    """The paper's 2-layer network (Section 5.1) trained by CAPE gradient descent, and its
    public hyper-parameters.

    Attributes
    ----------
    features : tuple of (str, float, float)
        Feature columns with their public bounds; each is mapped to ``[-1, 1]`` by them
        (:meth:`scaled`) before it enters the network.
    target : str
        A 0/1 label column.
    epsilon, delta : float
        Each site's budget over the *whole* training (all iterations), against the aggregator
        and ``colluders`` other sites.
    iterations : int
        ``T``: full-batch gradient steps.
    learning_rate : float
        Step size ``> 0``.
    hidden : int
        ``H``: hidden ReLU units.
    clip : float
        Per-example gradient clipping norm ``C > 0``.
    colluders : int or None
        ``S_C`` (``None``: ``ceil(S / 3) - 1`` of the first plan, then fixed).

    Raises
    ------
    ValueError
        For a malformed spec (columns, bounds, non-positive or non-finite hyper-parameters, a
        bound, clip or learning rate beyond :data:`MAX_MAGNITUDE`, epsilon, delta).

    Notes
    -----
    Sensitivity: each per-example gradient is clipped to norm ``C`` whatever the data, so the site's
    average moves by at most ``2 C / N_s`` when one record is replaced
    (:func:`dpmarket.common.cape.dpgd.site_gradient`). The bounds serve the scaling only: they are
    not needed for privacy; a value outside them is clamped to them like any other job's.
    """

    features: tuple[tuple[str, float, float], ...]
    target: str
    epsilon: float
    delta: float
    iterations: int
    learning_rate: float
    hidden: int
    clip: float
    colluders: int | None = None

    task = "train"

    def __post_init__(self) -> None:
        _check_columns(self.features, (self.target,))
        _check_guarantee(self.epsilon, self.delta)
        for name in ("iterations", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value}")
        for name in ("learning_rate", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
            _check_magnitude(name, value)

    @property
    def columns(self) -> tuple[str, ...]:
        """The feature columns, in order."""
        return tuple(f[0] for f in self.features)

    @property
    def dim(self) -> int:
        """``D``."""
        return len(self.features)

    @property
    def n_params(self) -> int:
        """``P = H (D + 2) + 1``."""
        return n_params(self.dim, self.hidden)

    @property
    def parameter_labels(self) -> tuple[str, ...]:
        """A name per parameter, in the flat vector's order: ``W1[h,column]`` (row-major),
        ``b1[h]``, ``w2[h]``, ``b2``."""
        hidden = range(self.hidden)
        return (
            *(f"W1[{h},{c}]" for h in hidden for c in self.columns),
            *(f"b1[{h}]" for h in hidden),
            *(f"w2[{h}]" for h in hidden),
            "b2",
        )

    @property
    def bounds(self) -> NDArray[np.float64]:
        """Shape (D, 2): the public bounds."""
        return np.asarray([f[1:] for f in self.features], dtype=np.float64)

    @property
    def cost(self) -> tuple[float, float]:
        """``(epsilon, delta)`` of the whole training charged to every owner: the PLD
        accountant's total at ``delta`` (:func:`dpmarket.common.cape.dpgd.training_loss_sigma`),
        never
        above the request."""
        return training_loss_sigma(self.epsilon, self.delta, self.iterations)[1], self.delta

    @property
    def mechanism(self) -> str:
        """How the owner's ledger names the releases."""
        return f"CAPE gradient descent, {self.iterations} iterations (zero-sum Gaussian noise)"

    def clamped(self, features: ArrayLike, target: ArrayLike) -> Clamped:
        """Raw records with the features clamped to their bounds (the 0/1 target as it is).

        Raises
        ------
        ValueError
            On shapes, or a NaN or infinite value (fixed messages, naming no row or value).
        """
        return _clamp_records(features, self.features, target, None)

    def scale(self, features: ArrayLike) -> NDArray[np.float64]:
        """Raw features, clamped to their bounds, -> the network's inputs
        ``2 (x - low) / (high - low) - 1`` in [-1, 1] (a consumer's own features are mapped the
        same way before prediction).

        Raises
        ------
        ValueError
            On shapes, or a NaN or infinite value.
        """
        x, _ = _clamp_features(features, self.features)
        b = self.bounds
        out: NDArray[np.float64] = 2.0 * (x - b[:, 0]) / (b[:, 1] - b[:, 0]) - 1.0
        return out

    def scaled(
        self, features: ArrayLike, target: ArrayLike
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Raw records -> (inputs in [-1, 1], labels in {0, 1}).

        Raises
        ------
        ValueError
            On shapes or NaN/inf, or a label that is not 0 or 1 (naming the column only).
        """
        x = self.scale(features)
        y = np.asarray(target, dtype=np.float64)
        if y.shape != (x.shape[0],):
            raise ValueError(f"target must have shape ({x.shape[0]},), got {y.shape}")
        _check_labels(y, self.target)
        return x, y

    def plan(
        self, sizes: Sequence[int], *, first_iteration: int = 0, colluders: int | None = None
    ) -> CapeTrainingPlan:
        """The public plan for sites of these row counts from ``first_iteration`` on
        (``colluders`` overrides the spec's, to keep the first plan's ``S_C``)."""
        return plan_training(
            dim=self.dim,
            hidden=self.hidden,
            clip=self.clip,
            iterations=self.iterations,
            sizes=sizes,
            epsilon=self.epsilon,
            delta=self.delta,
            colluders=self.colluders if colluders is None else colluders,
            first_iteration=first_iteration,
        )


#: Any CAPE job's specification.
AnyCapeSpec = CapeJobSpec | CapeMeanSpec | CapeTrainingSpec
