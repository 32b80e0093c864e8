"""Input validation shared by every boundary that accepts arrays, privacy parameters or
declarations parsed from configuration files (TOML tables)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import InvalidArgumentError


def check_matrix(
    x: ArrayLike,
    name: str,
    *,
    n_features: int | None = None,
    allow_empty: bool = False,
    dtype: type = np.float64,
) -> NDArray[np.floating]:
    """Return ``x`` as a finite 2-D array, or raise a ``ValueError`` that names the problem.

    Parameters
    ----------
    x : array-like of shape (n_points, n_features)
    name : str
        Name used in error messages, e.g. ``"validation set"``.
    n_features : int, optional
        Required number of columns.
    allow_empty : bool
        Whether zero rows are accepted.
    dtype : numpy dtype
        Output dtype.

    Returns
    -------
    ndarray of shape (n_points, n_features) and dtype ``dtype``, C-contiguous.

    Raises
    ------
    ValueError
        If ``x`` is not 2-D, has the wrong number of columns, is empty (unless allowed) or holds
        NaN or inf.
    """
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (n_points, n_features), got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} features per point, got {arr.shape[1]}")
    if arr.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty: it must hold at least one point")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} must have at least one feature, got shape {arr.shape}")
    out: NDArray[np.floating] = np.ascontiguousarray(arr, dtype=dtype)
    bad = ~np.isfinite(out)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"{name} holds {int(bad.sum())} NaN or inf value(s), first at row {row}, column {col}"
        )
    return out


def check_vector(
    v: ArrayLike, name: str, *, size: int | None = None, dtype: type = np.float64
) -> NDArray[np.floating]:
    """Return ``v`` as a finite 1-D array, or raise ``ValueError``.

    Parameters
    ----------
    v : array-like of shape (size,)
    name : str
        Name used in error messages.
    size : int, optional
        Required length.

    Raises
    ------
    ValueError
        If ``v`` is not 1-D, has the wrong length or holds NaN or inf.
    """
    arr = np.asarray(v)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if size is not None and arr.shape[0] != size:
        raise ValueError(f"{name} must have length {size}, got {arr.shape[0]}")
    out: NDArray[np.floating] = np.ascontiguousarray(arr, dtype=dtype)
    if not np.isfinite(out).all():
        raise ValueError(f"{name} holds NaN or inf values")
    return out


#: The smallest non-zero magnitude an owner takes in a number a curator chooses for a computation
#: on its rows (h1 frequencies and phases, embeddings and the shrinkage amount, an RFF sketch's
#: frequencies, CAPE parameters and noise totals): ``1e-20``. Below it a product with a row's
#: value can be subnormal (float64 below ``2.2e-308``; float32, in which scores and features are
#: kept, below ``1.2e-38``), and a CPU takes many times longer for each subnormal operand or
#: result, so the time of a step would follow how many rows hold non-zero values.
#: :func:`check_not_tiny` refuses such numbers (rather than zeroing them: an honest draw never
#: lands there, and the curator's recomputation must see the same numbers as the owner).
#:
#: Derivation: a product of a parameter ``|p| >= 1e-20`` with a float32 feature or score factor
#: (``|h| >= 1e-9``: the smallest non-zero ``|cos|`` of a float32 angle, ``4.4e-8``, times
#: ``sqrt(2 / d) >= 0.02``) is at least ``1e-29``, and differences of such float32 values are
#: multiples of their unit in the last place (``>= 1e-29 * 2**-23 = 1.2e-36``): both normal.
#: In float64 a product with a row's value ``x`` is at least ``1e-20 |x|``, normal for every
#: ``|x| >= 1e-288`` (the owner's own values, never the curator's choice). Angles are flushed to
#: 0 below ``2**-100`` before their float32 cast (:func:`dpmarket.common.fourier.reduced_angles`),
#: which covers the cancellations of a sum. Honest numbers are far from it: a Gaussian
#: frequency of standard deviation ``>= 1e-3`` lies within ``1e-20`` of 0 with probability
#: below ``1e-17``.
PARAMETER_FLOOR = 1e-20


def check_not_tiny(values: ArrayLike, name: str, *, floor: float = PARAMETER_FLOOR) -> None:
    """Refuse numbers whose magnitude is non-zero but below ``floor`` (public inputs only).

    Parameters
    ----------
    values : array-like of float, any shape
        Numbers a curator chose; 0, NaN and inf pass (other checks refuse the latter two).
    name : str
        Names the numbers in the message.
    floor : float, default :data:`PARAMETER_FLOOR`
        The smallest non-zero magnitude taken.

    Raises
    ------
    ValueError
        If some value is non-zero with magnitude below ``floor`` (the message says how many,
        the smallest, and what to do).
    """
    size = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    tiny = (size > 0) & (size < floor)
    if tiny.any():
        raise ValueError(
            f"{name} holds {int(tiny.sum())} non-zero value(s) below {floor:g} in magnitude "
            f"(the smallest {float(size[tiny].min()):.3g}): products with such numbers can be "
            "subnormal, which makes a step's time follow the data; send 0 or a value of at "
            f"least {floor:g}"
        )


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """Return ``epsilon`` as float if it is finite and > 0; raise ``ValueError`` otherwise."""
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {epsilon}")
    return eps


def check_delta(delta: float, name: str = "delta", *, upper: float = 1.0) -> float:
    """Return ``delta`` as float if ``0 < delta < upper``; raise ``ValueError`` otherwise."""
    d = float(delta)
    if not (math.isfinite(d) and 0.0 < d < upper):
        raise ValueError(f"{name} must lie in (0, {upper}), got {delta}")
    return d


def check_positive_int(value: int, name: str) -> int:
    """Return ``value`` as int if it is an integer >= 1; raise ``ValueError`` otherwise."""
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return int(value)


def config_number(value: Any, where: str) -> float:
    """A declaration's finite number (TOML integer or float; not a boolean).

    Raises
    ------
    InvalidArgumentError
        Naming ``where`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{where} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InvalidArgumentError(f"{where} must be finite, got {value!r}")
    return out


def config_table(value: Any, where: str) -> Mapping[str, Any]:
    """A declaration's table (a TOML table).

    Raises
    ------
    InvalidArgumentError
        If ``value`` is not a mapping, naming ``where``.
    """
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{where} must be a table, got {value!r}")
    return value


def check_config_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    """Refuse a key of a declaration's table that is not ``allowed``.

    Raises
    ------
    InvalidArgumentError
        Naming ``where``, the unknown keys and the allowed ones.
    """
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}"
        )
