"""The public data domain of a sketch: a box, with optional discrete attributes.

Every record a sketch summarizes lies in the declared domain. An owner projects its records onto
it before sketching (:meth:`Domain.clamp`, OpenDP's clamp: a continuous value to the nearest
bound, a discrete one to the nearest level) and counts what moved in its own log only: whether an
owner's rows fit a domain the catalogue chose must not decide what the owner answers, or a chosen
domain would read records. :meth:`Domain.check` refuses records outside, naming row and column,
for data whose holder wants to know (a consumer's own validation set, synthetic points). The
domain is also the support of the M2M prior: the estimator draws its synthetic points uniformly
from it (the paper's maximum entropy choice, Section 3.2).

Projecting maps each record to one record of the domain, so two data sets that differ in one
record still differ in at most one record after it: every sensitivity computed over the domain
holds for the raw data.

References
----------
M2M paper, Section 3.1 ("an analyst chooses a priori a bounded domain D_M2M such that all possible
records lie inside") and Section 4.3 (the domain ``[0, 1]^5 x {0, 1}`` with a binary attribute).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.validation import check_positive_int

__all__ = ["Domain"]


def _bound_vector(values: ArrayLike, name: str) -> NDArray[np.float64]:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"domain {name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"domain {name} must hold real numbers, got dtype {arr.dtype}")
    out = np.array(arr, dtype=np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(f"domain {name}[{j}] must be finite, got {out[j]}")
    return out


@dataclass(frozen=True, eq=False)
class Domain:
    """A box ``[low_j, high_j]`` per attribute, some attributes restricted to listed values.

    Attributes
    ----------
    low, high : ndarray of shape (d,), float64
        Public bounds of every attribute, in the data's own units, ``low[j] < high[j]``. They
        must come from public knowledge (physical ranges, documented ranges of a data set), never
        from statistics of the private data.
    names : tuple of str
        Attribute names used in error messages; empty (the default) means ``"column j"``.
    levels : tuple of (ndarray or None)
        Empty (the default: every attribute continuous), or one entry per attribute: ``None`` for
        a continuous attribute, or the sorted distinct values a discrete attribute may take (e.g.
        ``[0.0, 1.0]`` for a binary label), each within ``[low[j], high[j]]``.
    integers : tuple of bool
        Empty (the default: no attribute known to be integer), or one entry per attribute:
        ``True`` for an attribute whose records hold whole numbers only (a schema's ``integer``
        column). Nothing is sketched differently; a histogram's bins are then known to hold only
        the whole numbers within them, which decides on which side of a CDF threshold on a bin
        edge that bin's records lie (:func:`dpmarket.common.sketches.intervals.bin_ranges`).

    Raises
    ------
    ValueError
        If ``low`` / ``high`` are not finite 1-D arrays of the same length, some
        ``low[j] >= high[j]``, ``names`` has the wrong length, or a level set is empty, not
        strictly increasing, not finite or outside its attribute's bounds, or ``integers`` has
        the wrong length.

    Notes
    -----
    Arrays are stored as read-only float64 copies. Equality compares everything exactly;
    instances are unhashable.
    """

    low: NDArray[np.float64]
    high: NDArray[np.float64]
    names: tuple[str, ...] = ()
    levels: tuple[NDArray[np.float64] | None, ...] = field(default=())
    integers: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        low = _bound_vector(self.low, "low")
        high = _bound_vector(self.high, "high")
        if low.shape != high.shape:
            raise ValueError(
                f"domain low and high must have the same length, got {low.shape[0]} and "
                f"{high.shape[0]}"
            )
        for j in range(low.shape[0]):
            if not low[j] < high[j]:
                raise ValueError(
                    f"domain bounds of attribute {j} must satisfy low < high, got "
                    f"[{low[j]}, {high[j]}]"
                )
        d = low.shape[0]
        names = tuple(str(n) for n in self.names)
        if names and len(names) != d:
            raise ValueError(f"domain names must be empty or have {d} entries, got {len(names)}")
        levels: list[NDArray[np.float64] | None] = []
        if self.levels:
            if len(self.levels) != d:
                raise ValueError(
                    f"domain levels must be empty or have {d} entries, got {len(self.levels)}"
                )
            for j, lv in enumerate(self.levels):
                if lv is None:
                    levels.append(None)
                    continue
                values = np.array(lv, dtype=np.float64).reshape(-1)
                if values.size == 0:
                    raise ValueError(f"domain levels of attribute {j} must not be empty")
                if not np.isfinite(values).all():
                    raise ValueError(f"domain levels of attribute {j} must be finite")
                if values.size > 1 and not (np.diff(values) > 0).all():
                    raise ValueError(
                        f"domain levels of attribute {j} must be strictly increasing, got "
                        f"{values.tolist()}"
                    )
                if values[0] < low[j] or values[-1] > high[j]:
                    raise ValueError(
                        f"domain levels of attribute {j} must lie in [{low[j]}, {high[j]}], got "
                        f"{values.tolist()}"
                    )
                values.setflags(write=False)
                levels.append(values)
        integers = tuple(bool(v) for v in self.integers)
        if integers and len(integers) != d:
            raise ValueError(
                f"domain integers must be empty or have {d} entries, got {len(integers)}"
            )
        low.setflags(write=False)
        high.setflags(write=False)
        object.__setattr__(self, "integers", integers if any(integers) else ())
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "levels", tuple(levels))

    @classmethod
    def unit(cls, n_attributes: int) -> Domain:
        """The unit cube ``[0, 1]^d`` (the paper's normalized domain), every attribute continuous.

        Raises
        ------
        ValueError
            If ``n_attributes`` is not an integer >= 1.
        """
        d = check_positive_int(n_attributes, "n_attributes")
        return cls(np.zeros(d), np.ones(d))

    @property
    def n_attributes(self) -> int:
        """``d``, the number of attributes of a record."""
        return int(self.low.shape[0])

    def level_values(self, attribute: int) -> NDArray[np.float64] | None:
        """The values a discrete attribute may take, or ``None`` for a continuous one."""
        if not self.levels:
            return None
        return self.levels[attribute]

    def is_integer(self, attribute: int) -> bool:
        """Whether a continuous attribute holds whole numbers only (:attr:`integers`)."""
        return bool(self.integers) and self.integers[attribute]

    def attribute_name(self, attribute: int) -> str:
        """The attribute's name, or ``"column j"`` when the domain names none."""
        return self.names[attribute] if self.names else f"column {attribute}"

    def __eq__(self, other: object) -> bool:
        """Exact equality of bounds, names and level sets. :attr:`integers` is not compared: it
        changes nothing a sketch holds (a sketch published before the domain carried it is the
        same release), only how a consumer reads a histogram's bins."""
        if not isinstance(other, Domain):
            return NotImplemented
        if self.names != other.names or len(self.levels) != len(other.levels):
            return False
        if not (np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high)):
            return False
        for a, b in zip(self.levels, other.levels, strict=True):
            if a is None or b is None:
                if a is not b:
                    return False
            elif not np.array_equal(a, b):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def _records(self, x: ArrayLike, name: str) -> NDArray[np.float64]:
        """``x`` as a C-contiguous float64 array of shape (n >= 1, d); shape and type checked."""
        arr = np.asarray(x)
        d = self.n_attributes
        if arr.ndim != 2 or arr.shape[1] != d:
            raise InvalidArgumentError(
                f"{name} must be a 2-D array with {d} columns (one per domain attribute), got "
                f"shape {arr.shape}"
            )
        if arr.shape[0] == 0:
            raise InvalidArgumentError(f"{name} is empty: it must hold at least one record")
        if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
            raise InvalidArgumentError(f"{name} must hold real numbers, got dtype {arr.dtype}")
        return np.ascontiguousarray(arr, dtype=np.float64)

    def check(self, x: ArrayLike, name: str = "data") -> NDArray[np.float64]:
        """Return ``x`` as a float64 array if every record lies in the domain; raise otherwise.

        Parameters
        ----------
        x : array-like of shape (n, d)
            Records, one per row, in the domain's units; ``n >= 1``.
        name : str
            What ``x`` is, for error messages.

        Returns
        -------
        ndarray of shape (n, d), float64, C-contiguous (a copy when ``x`` is not already so).

        Raises
        ------
        InvalidArgumentError
            (a ``ValueError``) if ``x`` is not 2-D with ``d`` columns, is empty, holds a
            non-number, NaN or inf, a value outside ``[low_j, high_j]``, or a value of a discrete
            attribute that is not one of its levels. The message names the first bad row and
            column (attribute name when the domain has names), the value and the bounds.
        """
        out = self._records(x, name)
        finite = np.isfinite(out)
        if not finite.all():
            row, col = (int(v) for v in np.argwhere(~finite)[0])
            where = f"{name} row {row}, {self.attribute_name(col)}"
            raise InvalidArgumentError(
                f"{where}: value {float(out[row, col])} is not a finite number"
            )
        outside = (out < self.low) | (out > self.high)
        if outside.any():
            row, col = (int(v) for v in np.argwhere(outside)[0])
            where = f"{name} row {row}, {self.attribute_name(col)}"
            raise InvalidArgumentError(
                f"{where}: value {float(out[row, col])!r} lies "
                f"outside the domain [{float(self.low[col])!r}, {float(self.high[col])!r}] "
                f"({int(outside.sum())} value(s) outside in all); records are never clipped"
            )
        for col, lv in enumerate(self.levels):
            if lv is None:
                continue
            bad = ~np.isin(out[:, col], lv)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                where = f"{name} row {row}, {self.attribute_name(col)}"
                raise InvalidArgumentError(
                    f"{where}: value {float(out[row, col])!r} is "
                    f"not one of the attribute's levels {lv.tolist()}"
                )
        return out

    def clamp(
        self, x: ArrayLike, name: str = "data"
    ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
        """Project every record onto the domain; return the records and how many values moved.

        A continuous attribute is clamped to ``[low_j, high_j]`` (OpenDP's ``make_clamp``); a
        discrete one is moved to its nearest level (ties to the lower level).

        Parameters
        ----------
        x : array-like of shape (n, d)
            Records, one per row, in the domain's units; ``n >= 1``, finite.
        name : str
            What ``x`` is, for error messages.

        Returns
        -------
        records : ndarray of shape (n, d), float64, C-contiguous
            Every row passes :meth:`check`.
        moved : ndarray of shape (d,), int64
            How many values of each attribute were moved. A statistic of the data: for its
            holder's own log only.

        Raises
        ------
        InvalidArgumentError
            (a ``ValueError``) if ``x`` is not 2-D with ``d`` columns, is empty, holds a
            non-number, NaN or inf. The messages name no row and no value.
        """
        raw = self._records(x, name)
        if not np.isfinite(raw).all():
            raise InvalidArgumentError(f"{name} holds NaN or inf: only finite values are clamped")
        out = np.ascontiguousarray(np.minimum(np.maximum(raw, self.low), self.high))
        for col, lv in enumerate(self.levels):
            if lv is None:
                continue
            upper = np.clip(np.searchsorted(lv, out[:, col]), 1, max(lv.shape[0] - 1, 1))
            below = lv[upper - 1]
            above = lv[np.minimum(upper, lv.shape[0] - 1)]
            out[:, col] = np.where(out[:, col] - below <= above - out[:, col], below, above)
        moved = (out != raw).sum(axis=0).astype(np.int64)
        return out, moved

    def sample_uniform(self, n: int, rng: np.random.Generator) -> NDArray[np.float64]:
        """Draw ``n`` points from the uniform distribution on the domain (the default M2M prior).

        Continuous attributes are uniform on ``[low_j, high_j)``; discrete attributes uniform on
        their levels; attributes are independent.

        Parameters
        ----------
        n : int
            Number of points, >= 1.
        rng : numpy.random.Generator
            Source of randomness. Draws the whole continuous block first
            (``rng.uniform(low, high, (n, d))``), then each discrete column in order.

        Returns
        -------
        ndarray of shape (n, d), float64; every row passes :meth:`check`.

        Raises
        ------
        ValueError
            If ``n`` is not an integer >= 1.

        References
        ----------
        M2M paper, Section 3.2: "psi = Unif(D_M2M), following the principle of maximum entropy".
        """
        count = check_positive_int(n, "n")
        out = rng.uniform(self.low, self.high, size=(count, self.n_attributes))
        for col, lv in enumerate(self.levels):
            if lv is not None:
                out[:, col] = lv[rng.integers(0, lv.shape[0], size=count)]
        return out

    def width(self) -> NDArray[np.float64]:
        """``high - low`` per attribute, shape (d,)."""
        return self.high - self.low

    def describe(self) -> list[dict[str, object]]:
        """One plain dict per attribute (name, low, high, levels): for reports and messages."""
        out: list[dict[str, object]] = []
        for j in range(self.n_attributes):
            lv = self.level_values(j)
            out.append(
                {
                    "name": self.attribute_name(j),
                    "low": float(self.low[j]),
                    "high": float(self.high[j]),
                    "levels": None if lv is None else lv.tolist(),
                }
            )
        return out
