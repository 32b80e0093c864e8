"""The public specification of a capeFM job: task, columns and bounds, and guarantee.

Every party computes the same plan (:func:`common.cape.capefm.plan_capefm`) from a spec and the
sites' row counts, so an owner derives its own noise scale and guarantee instead of trusting the
curator's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from common.cape.capefm import CapeFMPlan, plan_capefm
from common.cape.functional_mechanism import Task, scale_to_bounds

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
    outside = (values < lo) | (values > hi)
    if outside.any():
        first = tuple(np.argwhere(outside)[0])
        row, col = int(first[0]), int(first[1]) if len(first) > 1 else 0
        raise ValueError(
            f"value out of bounds at row {row}, column {names[col]!r}: {values[first]} not in "
            f"[{lo[first]}, {hi[first]}] ({int(outside.sum())} value(s) outside); values are "
            "never clipped"
        )
