"""An owner's point set and its on-disk formats.

A :class:`PointSet` is what a data owner holds (features, optional integer labels, a name). The
owner service loads it once from a file given on its command line; scenario tooling writes it.
Supported formats (chosen by the file suffix):

``.npy``
    2-D float array of features. Labels, if any, live in the sibling file ``<stem>.labels.npy``
    (1-D integer array).
``.npz``
    Keys ``features`` (2-D) and optionally ``labels`` (1-D).
``.csv`` / ``.parquet``
    One numeric column per feature; the label column (``"label"`` by default), if present, holds
    the labels. Written with feature columns ``f0 .. f{n_features-1}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from common.validation import check_matrix
from runtime.files import atomic_write

__all__ = [
    "SUPPORTED_SUFFIXES",
    "PointSet",
    "Table",
    "load_point_set",
    "load_table",
    "save_point_set",
]

#: File suffixes understood by :func:`load_point_set` and :func:`save_point_set`.
SUPPORTED_SUFFIXES: tuple[str, ...] = (".npy", ".npz", ".csv", ".parquet")

_LABELS_SUFFIX = ".labels.npy"


def _check_labels(labels: ArrayLike, n_points: int, name: str) -> NDArray[np.int64]:
    """Return ``labels`` as a 1-D int64 array of length ``n_points`` or raise ``ValueError``."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels of {name} must be a 1-D array, got shape {arr.shape}")
    if arr.shape[0] != n_points:
        raise ValueError(
            f"labels of {name} must have one entry per point ({n_points}), got {arr.shape[0]}"
        )
    if arr.dtype == np.bool_:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"labels of {name} must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.integer):
        return np.ascontiguousarray(arr, dtype=np.int64)
    finite = np.isfinite(arr)
    integral = finite & (arr == np.round(np.where(finite, arr, 0.0)))
    if not integral.all():
        row = int(np.argmin(integral))
        raise ValueError(f"labels of {name} must be integers, got {arr[row].item()!r} at row {row}")
    return np.ascontiguousarray(arr, dtype=np.int64)


@dataclass(frozen=True)
class PointSet:
    """A finite set of points with optional integer class labels.

    Parameters
    ----------
    features : array-like of shape (n_points, n_features)
        Converted to a C-contiguous float64 array; must be finite and hold at least one point.
    labels : array-like of shape (n_points,) or None
        Integer class labels, converted to int64; ``None`` when the points are unlabeled.
        Float labels are accepted when they hold whole numbers (e.g. ``1.0``).
    name : str
        Human-readable identifier (an owner name, a file stem), used in messages and logs.

    Attributes
    ----------
    features : ndarray of shape (n_points, n_features), float64
    labels : ndarray of shape (n_points,), int64, or None
    name : str

    Raises
    ------
    ValueError
        If ``features`` is not 2-D, is empty, has no columns or holds NaN or inf; if ``labels``
        is not 1-D, has a length other than ``n_points`` or holds non-integer values.
    """

    features: NDArray[np.float64]
    labels: NDArray[np.int64] | None
    name: str

    def __post_init__(self) -> None:
        features = check_matrix(self.features, f"features of {self.name}", allow_empty=False)
        object.__setattr__(self, "features", features)
        if self.labels is not None:
            labels = _check_labels(self.labels, features.shape[0], self.name)
            object.__setattr__(self, "labels", labels)

    @property
    def n_points(self) -> int:
        """Number of points (rows of ``features``)."""
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        """Number of features (columns of ``features``)."""
        return int(self.features.shape[1])

    def __len__(self) -> int:
        return self.n_points


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(
            f"unsupported point-set file {str(path)!r}: suffix {path.suffix!r} is not one of "
            f"{', '.join(SUPPORTED_SUFFIXES)}"
        )
    return suffix


def _labels_path(path: Path) -> Path:
    """Sibling file holding the labels of a ``.npy`` feature file: ``<stem>.labels.npy``."""
    return path.with_name(path.stem + _LABELS_SUFFIX)


def _load_npy(path: Path, name: str) -> PointSet:
    try:
        features = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as a .npy array: {exc}") from exc
    labels = None
    labels_path = _labels_path(path)
    if labels_path.exists():
        try:
            labels = np.load(labels_path, allow_pickle=False)
        except (ValueError, EOFError) as exc:
            raise ValueError(f"cannot read labels file {str(labels_path)!r}: {exc}") from exc
    return PointSet(features=features, labels=labels, name=name)


def _load_npz(path: Path, name: str) -> PointSet:
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as a .npz archive: {exc}") from exc
    with archive:
        keys = sorted(archive.files)
        if "features" not in keys:
            raise ValueError(
                f"{str(path)!r} must hold an array named 'features' (and optionally 'labels'), "
                f"found keys {keys}"
            )
        features = archive["features"]
        labels = archive["labels"] if "labels" in keys else None
    return PointSet(features=features, labels=labels, name=name)


def _load_table(path: Path, suffix: str, label_column: str | None, name: str) -> PointSet:
    _, values, labels = _read_table(path, suffix, label_column)
    return PointSet(features=values, labels=labels, name=name)


def _read_table(
    path: Path, suffix: str, label_column: str | None
) -> tuple[list[str], NDArray[np.float64], Any]:
    """Column names, values (n_rows, n_columns) and labels of a checked .csv/.parquet table."""
    try:
        frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    except pd.errors.EmptyDataError as exc:
        raise ValueError(f"{str(path)!r} is empty: it holds no header and no points") from exc
    except (ValueError, OSError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as {suffix}: {exc}") from exc

    if len(frame) == 0:
        raise ValueError(f"{str(path)!r} is empty: it must hold at least one point")
    labels = None
    if label_column is not None and label_column in frame.columns:
        label_values = frame[label_column]
        if not pd.api.types.is_numeric_dtype(label_values.dtype):
            raise ValueError(
                f"label column {label_column!r} of {str(path)!r} must be numeric, "
                f"got dtype {label_values.dtype}"
            )
        labels = label_values.to_numpy()
        frame = frame.drop(columns=[label_column])
    columns = [str(c) for c in frame.columns]
    if not columns:
        raise ValueError(f"{str(path)!r} holds no feature columns (columns: {columns})")
    for column in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[column].dtype):
            raise ValueError(
                f"column {str(column)!r} of {str(path)!r} is not numeric "
                f"(dtype {frame[column].dtype}); every column except the label column "
                f"{label_column!r} must hold numbers"
            )
    values = frame.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{str(path)!r} holds {int(bad.sum())} NaN or inf value(s), first at row {row}, "
            f"column {col} ({columns[col]!r})"
        )
    if labels is not None:
        finite = np.isfinite(labels.astype(np.float64))
        if not finite.all():
            row = int(np.argmin(finite))
            raise ValueError(
                f"label column {label_column!r} of {str(path)!r} holds NaN or inf at row {row}"
            )
    return columns, values, labels


@dataclass(frozen=True)
class Table:
    """A numeric table with named columns: what an owner holds for joint statistics (CAPE).

    Its column names, its row count and its declared 0/1 columns are the owner's public
    declarations: an owner's answers may depend on them, never on its values.

    Attributes
    ----------
    columns : tuple of str
        Column names, in file order; unique.
    values : ndarray of shape (n_rows, n_columns), float64
        Finite values.
    name : str
    binary : tuple of str
        Columns the owner declares to hold only 0 and 1 (``serve-owner --binary-column``): the
        only columns a logistic regression or a training may take as its target at this owner.

    Raises
    ------
    ValueError
        If ``values`` is not 2-D with one column per name or holds NaN or inf, or a declared 0/1
        column is missing or holds another value (naming the row and the value: this is the
        owner's own check when it starts, on its own console).
    """

    columns: tuple[str, ...]
    values: NDArray[np.float64]
    name: str
    binary: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        values = np.asarray(self.values)
        if values.ndim != 2 or values.shape[1] != len(self.columns):
            raise ValueError(
                f"table {self.name!r} must have one column per name ({len(self.columns)}), got "
                f"values of shape {values.shape}"
            )
        bad = ~np.isfinite(values)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"table {self.name!r} holds {int(bad.sum())} NaN or inf value(s), first at row "
                f"{row}, column {self.columns[col]!r}"
            )
        binary = tuple(self.binary)
        missing = [c for c in binary if c not in self.columns]
        if missing:
            raise ValueError(
                f"table {self.name!r} has no column(s) {missing} to declare 0/1; its columns are "
                f"{list(self.columns)}"
            )
        for column in binary:
            labels = values[:, self.columns.index(column)]
            other = (labels != 0.0) & (labels != 1.0)
            if other.any():
                first = int(np.argmax(other))
                raise ValueError(
                    f"column {column!r} of table {self.name!r} is declared 0/1 but holds "
                    f"{labels[first]} at row {first} ({int(other.sum())} value(s) other than 0 "
                    "and 1)"
                )
        object.__setattr__(self, "binary", binary)

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return int(self.values.shape[0])

    def select(self, columns: Sequence[str]) -> NDArray[np.float64]:
        """The named columns, in the order given: shape (n_rows, len(columns)).

        Raises
        ------
        ValueError
            If a column is missing (the message lists the table's columns).
        """
        index = {c: i for i, c in enumerate(self.columns)}
        missing = [c for c in columns if c not in index]
        if missing:
            raise ValueError(
                f"table {self.name!r} has no column(s) {missing}; its columns are "
                f"{list(self.columns)}"
            )
        return self.values[:, [index[c] for c in columns]]


def load_table(path: str | Path, *, name: str | None = None, binary: Sequence[str] = ()) -> Table:
    """Read a numeric table with named columns from a ``.csv`` or ``.parquet`` file.

    Parameters
    ----------
    path : str or Path
    name : str, optional
        Default: the file stem.
    binary : sequence of str
        Columns declared to hold only 0 and 1 (:attr:`Table.binary`), checked now.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the suffix is not ``.csv``/``.parquet``, the file is empty or unreadable, a column is
        not numeric, a value is NaN or inf (naming row and column), column names repeat, or a
        declared 0/1 column is missing or holds another value (naming row and value).
    """
    path = Path(path)
    suffix = _suffix(path)
    if suffix not in (".csv", ".parquet"):
        raise ValueError(f"a table must be .csv or .parquet, got {str(path)!r}")
    if not path.exists():
        raise FileNotFoundError(f"table file {str(path)!r} does not exist")
    columns, values, _ = _read_table(path, suffix, None)
    if len(set(columns)) != len(columns):
        raise ValueError(f"{str(path)!r} repeats column names: {columns}")
    return Table(tuple(columns), values, name if name is not None else path.stem, tuple(binary))


def load_point_set(
    path: str | Path, *, label_column: str | None = "label", name: str | None = None
) -> PointSet:
    """Read a point set from a ``.npy``, ``.npz``, ``.csv`` or ``.parquet`` file.

    Parameters
    ----------
    path : str or Path
        File to read; the suffix selects the format (see the module docstring).
    label_column : str or None, default "label"
        For ``.csv`` and ``.parquet``: name of the column holding integer labels. If the column
        is absent the point set is unlabeled; ``None`` treats every column as a feature.
        Ignored for ``.npy`` (labels come from ``<stem>.labels.npy`` when that file exists) and
        ``.npz`` (labels come from the ``labels`` key when present).
    name : str, optional
        Name of the returned point set; defaults to the file stem.

    Returns
    -------
    PointSet
        ``features`` of shape (n_points, n_features), float64; ``labels`` of shape (n_points,),
        int64, or None.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the suffix is not supported (the message lists the supported ones); if the file is
        empty or unreadable; if a ``.npz`` lacks ``features``; if a table column other than the
        label column is not numeric (the message names the column); if features are not 2-D or
        hold NaN or inf (the message names the first bad row and column); if labels are not
        integers or do not match the number of points.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.exists():
        raise FileNotFoundError(f"point-set file {str(path)!r} does not exist")
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"point-set file {str(path)!r} is empty (0 bytes)")
    point_set_name = name if name is not None else path.stem
    if suffix == ".npy":
        return _load_npy(path, point_set_name)
    if suffix == ".npz":
        return _load_npz(path, point_set_name)
    return _load_table(path, suffix, label_column, point_set_name)


def feature_columns(n_features: int) -> list[str]:
    """The column names :func:`save_point_set` gives a point set's features in a table:
    ``["f0", "f1", ...]`` (a catalogue's sketch spec names the same columns)."""
    return [f"f{j}" for j in range(n_features)]


def save_point_set(point_set: PointSet, path: str | Path) -> None:
    """Write a point set in the format given by the suffix of ``path``.

    ``.csv`` and ``.parquet`` get feature columns ``f0 .. f{n_features-1}`` (float64) and, when
    the set is labeled, a ``label`` column (int64). ``.npy`` gets the features and, when labeled,
    ``<stem>.labels.npy`` beside it (a stale labels file is removed when the set is unlabeled, so
    that :func:`load_point_set` does not pick it up). ``.npz`` gets ``features`` and ``labels``.
    Every format round-trips float64 values exactly through :func:`load_point_set`.

    Parameters
    ----------
    point_set : PointSet
    path : str or Path
        Destination; its parent directory must exist. An existing file is overwritten.

    Raises
    ------
    ValueError
        If the suffix is not one of ``.npy``, ``.npz``, ``.csv``, ``.parquet``.
    OSError
        If the file cannot be written (e.g. the parent directory does not exist).
    """
    path = Path(path)
    suffix = _suffix(path)
    features = point_set.features
    labels = point_set.labels
    # numpy appends ".npy" / ".npz" to a *name* that lacks it (case-sensitively, so "X.NPY"
    # would become "X.NPY.npy"); writing through an open file keeps the path exactly as given.
    if suffix == ".npy":
        with atomic_write(path) as fh:
            np.save(fh, features, allow_pickle=False)
        labels_path = _labels_path(path)
        if labels is not None:
            with atomic_write(labels_path) as fh:
                np.save(fh, labels, allow_pickle=False)
        elif labels_path.exists():
            labels_path.unlink()
        return
    if suffix == ".npz":
        arrays = (
            {"features": features} if labels is None else {"features": features, "labels": labels}
        )
        with atomic_write(path) as fh:
            np.savez(fh, **arrays)
        return
    frame = pd.DataFrame(features, columns=feature_columns(features.shape[1]))
    if labels is not None:
        frame["label"] = labels
    with atomic_write(path) as fh:
        if suffix == ".csv":
            frame.to_csv(fh, index=False)
        else:
            frame.to_parquet(fh, index=False)
