"""The public specifications of CAPE jobs: what is computed, on which columns with which public
bounds, at which guarantee.

* :class:`CapeJobSpec`: a capeFM model (linear or logistic regression, Algorithm 4);
* :class:`CapeMeanSpec`: the mean vector of some columns (Algorithm 2);
* :class:`CapeTrainingSpec`: the paper's 2-layer network trained by distributed DP gradient
  descent (Section 5.1), one CAPE release per iteration.

Every party computes the same plan from a spec and the sites' row counts, so an owner derives its
own noise scale and guarantee instead of trusting the curator's numbers. Bounds are parameters of
the request, never statistics of the private data; a value outside them is an error naming its
row and column, never clipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from common.cape.capefm import CapeFMPlan, plan_capefm
from common.cape.dpgd import CapeTrainingPlan, n_params, plan_training, training_loss_sigma
from common.cape.functional_mechanism import Task, scale_to_bounds
from common.cape.mean import CapeMeanPlan, plan_mean

#: Name of the constant feature added for an intercept.
INTERCEPT = "(intercept)"


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
        For a malformed spec (no features, repeated columns, ``low >= high``, non-finite or
        out-of-range epsilon/delta).
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
        if len(set(names)) != len(names) or INTERCEPT in names:
            raise ValueError(f"feature and target columns must be distinct, got {names}")
        for column, low, high in (*self.features, self.target):
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"bounds of {column!r} must be finite with low < high")
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

    def scaled(
        self, features: ArrayLike, target: ArrayLike
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Raw records in the functional mechanism's domain (``||x|| <= 1``).

        Parameters
        ----------
        features : array-like of shape (n, len(features))
            The feature columns, in the spec's order.
        target : array-like of shape (n,)

        Raises
        ------
        ValueError
            If a value lies outside its public bounds or a logistic target is not 0/1, naming
            the row and the column (by its name: the spec's order need not be the table's).
        """
        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(target, dtype=np.float64)
        if x.ndim == 2 and x.shape[1] == len(self.features):
            low, high = np.asarray([f[1:] for f in self.features], dtype=np.float64).T
            _check_bounds(x, low, high, [f[0] for f in self.features])
        if y.ndim == 1:
            name = [self.target[0]]
            if self.task == "linear":
                _check_bounds(y, self.target[1], self.target[2], name)
            else:
                bad = (y != 0.0) & (y != 1.0)
                if bad.any():
                    row = int(np.argmax(bad))
                    raise ValueError(
                        f"target column {name[0]!r} at row {row} must be 0 or 1 for logistic "
                        f"regression, got {y[row]}"
                    )
        if self.fit_intercept:
            x = np.hstack([x, np.ones((x.shape[0], 1))])
        return scale_to_bounds(x, target, self.feature_bounds, self.target_bounds, task=self.task)


def _check_bounds(
    values: NDArray[np.float64], low: ArrayLike, high: ArrayLike, names: list[str]
) -> None:
    """Raise ``ValueError`` naming the first value (row-major) outside its column's bounds.

    ``values`` has shape (n, len(names)) or (n,) (one column); ``low`` and ``high`` broadcast
    against it.
    """
    lo = np.broadcast_to(np.asarray(low, dtype=np.float64), values.shape)
    hi = np.broadcast_to(np.asarray(high, dtype=np.float64), values.shape)
    outside = ~((values >= lo) & (values <= hi))  # NaN is outside every bound
    if outside.any():
        first = tuple(np.argwhere(outside)[0])
        row, col = int(first[0]), int(first[1]) if len(first) > 1 else 0
        raise ValueError(
            f"value out of bounds at row {row}, column {names[col]!r}: {values[first]} not in "
            f"[{lo[first]}, {hi[first]}] ({int(outside.sum())} value(s) outside); values are "
            "never clipped"
        )


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
        For a malformed spec (no column, repeated columns, ``low >= high``, non-finite or
        out-of-range epsilon/delta).

    Notes
    -----
    Sensitivity: :func:`common.cape.mean.mean_sensitivity`, ``||high - low||_2 / N_s`` under the
    replacement of one record of one site.
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

    def checked(self, values: ArrayLike) -> NDArray[np.float64]:
        """The columns' values (shape (n, D), in the spec's order), checked against the bounds.

        Raises
        ------
        ValueError
            Naming the row and the column of the first value outside its bounds (or NaN).
        """
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"values must have shape (n, {len(self.features)}), got {x.shape}")
        _check_bounds(x, self.bounds[:, 0], self.bounds[:, 1], list(self.columns))
        return x

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
        For a malformed spec (columns, bounds, non-positive or non-finite hyper-parameters,
        epsilon, delta).

    Notes
    -----
    Sensitivity: each per-example gradient is clipped to norm ``C`` whatever the data, so the
    site's average moves by at most ``2 C / N_s`` when one record is replaced
    (:func:`common.cape.dpgd.site_gradient`). The bounds serve the scaling only: they are not
    needed for privacy, but a value outside them is still refused (never clipped).
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
    def bounds(self) -> NDArray[np.float64]:
        """Shape (D, 2): the public bounds."""
        return np.asarray([f[1:] for f in self.features], dtype=np.float64)

    @property
    def cost(self) -> tuple[float, float]:
        """``(epsilon, delta)`` of the whole training charged to every owner: the PLD
        accountant's total at ``delta`` (:func:`common.cape.dpgd.training_loss_sigma`), never
        above the request."""
        return training_loss_sigma(self.epsilon, self.delta, self.iterations)[1], self.delta

    @property
    def mechanism(self) -> str:
        """How the owner's ledger names the releases."""
        return f"CAPE gradient descent, {self.iterations} iterations (zero-sum Gaussian noise)"

    def scale(self, features: ArrayLike) -> NDArray[np.float64]:
        """Raw features -> the network's inputs ``2 (x - low) / (high - low) - 1`` in [-1, 1].

        Raises
        ------
        ValueError
            If a value lies outside its bounds (naming row and column).
        """
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"features must have shape (n, {self.dim}), got {x.shape}")
        b = self.bounds
        _check_bounds(x, b[:, 0], b[:, 1], list(self.columns))
        out: NDArray[np.float64] = 2.0 * (x - b[:, 0]) / (b[:, 1] - b[:, 0]) - 1.0
        return out

    def scaled(
        self, features: ArrayLike, target: ArrayLike
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Raw records -> (inputs in [-1, 1], labels in {0, 1}).

        Raises
        ------
        ValueError
            If a feature lies outside its bounds or a label is not 0 or 1, naming row and
            column.
        """
        x = self.scale(features)
        y = np.asarray(target, dtype=np.float64)
        if y.shape != (x.shape[0],):
            raise ValueError(f"target must have shape ({x.shape[0]},), got {y.shape}")
        bad = (y != 0.0) & (y != 1.0)
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"target column {self.target!r} at row {row} must be 0 or 1, got {y[row]}"
            )
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
