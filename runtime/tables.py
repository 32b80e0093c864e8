"""Point sets and tables in memory, and their on-disk formats: the one table I/O every party uses.

A :class:`PointSet` is what a data owner holds (features, optional integer labels, a name), and
what a consumer hands over as its validation set or gets back as a summary; a :class:`Table` is a
numeric table with named columns (an owner's joint statistics, a consumer's held-out data). The
owner service loads its own once from a file given on its command line
(:func:`dpmarket.owner.data.load_owner_data`, which reads large tables partition by partition
instead); the consumer reads and writes point files here in the format the owners load them in;
scenario tooling writes them. Supported formats (chosen by the file suffix):

``.npy``
    2-D float array of features. Labels, if any, live in the sibling file ``<stem>.labels.npy``
    (1-D integer array).
``.npz``
    Keys ``features`` (2-D) and optionally ``labels`` (1-D).
``.csv`` / ``.parquet``
    A header line naming the columns, then one numeric column per feature; the label column
    (``"label"`` by default), if present, holds the labels. Read by pandas (pyarrow for Parquet)
    with the pitfalls of hand-made and pandas-default files refused, naming the file and the column:
    a column without a name (the row index ``DataFrame.to_csv`` writes unless ``index=False``), a
    header that reads as numbers (no header line: its first row would be lost), repeated names,
    non-numeric values. With a public schema (:mod:`dpmarket.common.schema`) the table is checked
    against it: names and order, types, bounds and levels; a consumer's table may have its columns
    in another order (selected by name). Written with the point set's column names, ``f0 ..
    f{n_features-1}`` when it has none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.schema import Schema, SchemaMismatchError
from dpmarket.common.validation import check_matrix
from dpmarket.runtime.files import atomic_write

if TYPE_CHECKING:  # pandas (about half a second) is imported by the functions that read and write
    import pandas as pd

__all__ = [
    "SUPPORTED_SUFFIXES",
    "PointSet",
    "Table",
    "load_point_set",
    "load_points_and_table",
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
    columns : tuple of str
        The features' names, when read from a table (its header, or the schema's features);
        empty when unknown (``.npy``/``.npz`` files).

    Attributes
    ----------
    features : ndarray of shape (n_points, n_features), float64
    labels : ndarray of shape (n_points,), int64, or None
    name : str
    columns : tuple of str

    Raises
    ------
    ValueError
        If ``features`` is not 2-D, is empty, has no columns or holds NaN or inf; if ``labels``
        is not 1-D, has a length other than ``n_points`` or holds non-integer values; if
        ``columns`` is neither empty nor one name per feature.
    """

    features: NDArray[np.float64]
    labels: NDArray[np.int64] | None
    name: str
    columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        features = check_matrix(self.features, f"features of {self.name}", allow_empty=False)
        object.__setattr__(self, "features", features)
        columns = tuple(str(c) for c in self.columns)
        if columns and len(columns) != features.shape[1]:
            raise ValueError(
                f"columns of {self.name} must name each of its {features.shape[1]} features, got "
                f"{len(columns)}"
            )
        object.__setattr__(self, "columns", columns)
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


#: The name pandas gives a column whose header cell is empty (``DataFrame.to_csv`` writes the
#: row index under an empty name unless ``index=False``).
_UNNAMED = re.compile(r"^Unnamed: \d+$")
#: A header cell that reads as a number: a first data row taken for the header.
_NUMERIC = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def _read_frame(path: Path, suffix: str) -> pd.DataFrame:
    """Read a .csv/.parquet table with pandas and refuse the pitfalls of tables written by hand
    or by pandas' defaults, naming the file and the column:

    * a column without a name (pandas' ``Unnamed: 0``: the row index ``to_csv`` writes unless
      ``index=False``), which would load as one more feature;
    * a header line that reads as numbers (a file without a header, whose first row would be
      lost to it);
    * a repeated column name (pandas would rename the second ``x.1``);
    * a column that is not numeric (naming its first non-numeric value and row);
    * no row.
    """
    import pandas as pd

    try:
        if suffix == ".csv":
            header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
            frame = pd.read_csv(path)
        else:
            frame = pd.read_parquet(path)
            header = pd.DataFrame([[str(c) for c in frame.columns]])
    except pd.errors.EmptyDataError as exc:
        raise ValueError(f"{str(path)!r} is empty: it holds no header and no points") from exc
    except (ValueError, OSError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as {suffix}: {exc}") from exc
    cells = [str(c) for c in header.iloc[0].tolist()] if len(header) else []
    if suffix == ".csv" and cells and all(_NUMERIC.fullmatch(c) for c in cells):
        shown = ", ".join(cells[:5]) + (", ..." if len(cells) > 5 else "")
        raise ValueError(
            f"{str(path)!r} has no header line: its first line ({shown}) reads as numbers, so it "
            "would be taken for the column names and its row lost. Add a first line naming the "
            "columns (e.g. age,bmi,bp)"
        )
    for j, column in enumerate(frame.columns):
        cell = cells[j] if j < len(cells) else str(column)
        if cell.strip() == "" or _UNNAMED.fullmatch(str(column)):
            values = frame.iloc[:, j]
            index_like = pd.api.types.is_integer_dtype(values.dtype) and bool(
                (values.to_numpy() == np.arange(len(values))).all()
            )
            raise ValueError(
                f"column {j + 1} of {str(path)!r} has no name"
                + (
                    " and holds 0, 1, 2, ...: the row index pandas writes by default. Write the "
                    "file with DataFrame.to_csv(..., index=False), or delete that column"
                    if index_like
                    else ": name it in the header line"
                )
            )
    repeated = sorted({c for c in cells if cells.count(c) > 1})
    if repeated:
        raise ValueError(f"{str(path)!r} repeats column name(s) {repeated}: {cells}")
    if len(frame) == 0:
        raise ValueError(f"{str(path)!r} is empty: it must hold at least one point")
    for column in frame.columns:
        values = frame[column]
        if not pd.api.types.is_numeric_dtype(values.dtype):
            numbers = pd.to_numeric(values, errors="coerce")
            bad = numbers.isna() & values.notna()
            row = int(np.argmax(bad.to_numpy())) if bad.any() else 0
            raise ValueError(
                f"column {str(column)!r} of {str(path)!r} is not numeric: it holds "
                f"{values.iloc[row]!r} at row {row}. dpmarket reads numbers only: encode the "
                "column as numbers (a category as level codes, declared categorical in the "
                "schema), or drop it"
            )
    return frame


def _finite_values(frame: pd.DataFrame, path: Path) -> NDArray[np.float64]:
    """The frame's values as float64; refuse NaN or inf, naming row and column."""
    values = frame.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{str(path)!r} holds {int(bad.sum())} NaN, empty or inf value(s), first at row "
            f"{row}, column {str(frame.columns[col])!r}"
        )
    return values


def _read_table(
    path: Path, suffix: str, label_column: str | None
) -> tuple[list[str], NDArray[np.float64], Any]:
    """Column names, values (n_rows, n_columns) and labels of a checked .csv/.parquet table."""
    frame = _read_frame(path, suffix)
    labels = None
    if label_column is not None and label_column in frame.columns:
        labels = _finite_values(frame[[label_column]], path)[:, 0]
        frame = frame.drop(columns=[label_column])
    columns = [str(c) for c in frame.columns]
    if not columns:
        raise ValueError(f"{str(path)!r} holds no feature columns (only {label_column!r})")
    return columns, _finite_values(frame, path), labels


def _read_schema_table(
    path: Path, suffix: str, schema: Schema, *, by_name: bool
) -> tuple[list[str], NDArray[np.float64]]:
    """A table checked against ``schema``: every column in the schema's order (``by_name``:
    the features selected by name, in the schema's order, with the label if present)."""
    frame = _read_frame(path, suffix)
    names = [str(c) for c in frame.columns]
    source = repr(str(path))
    if by_name:
        wanted = [*schema.feature_names, *([schema.label] if schema.label in names else [])]
        extra = [n for n in names if n not in schema.names]
        missing = [n for n in schema.feature_names if n not in names]
        if missing or extra:
            problems = []
            if missing:
                problems.append(f"lacks the schema's column(s) {missing}")
            if extra:
                problems.append(f"has column(s) {extra} the schema does not declare")
            raise SchemaMismatchError(
                f"{source} {' and '.join(problems)} (the schema's columns: "
                f"{', '.join(schema.names)})"
            )
        frame = frame[wanted]
        names = wanted
        schema = Schema(tuple(schema.column(n) for n in wanted), None)
    values = _finite_values(frame, path)
    schema.check_table(names, values, source=source)
    return names, values


def _load_table(path: Path, suffix: str, label_column: str | None, name: str) -> PointSet:
    columns, values, labels = _read_table(path, suffix, label_column)
    return PointSet(features=values, labels=labels, name=name, columns=tuple(columns))


def _load_schema_point_set(
    path: Path, suffix: str, schema: Schema, name: str, by_name: bool
) -> PointSet:
    names, values = _read_schema_table(path, suffix, schema, by_name=by_name)
    features = [names.index(n) for n in schema.feature_names]
    labels: Any = None
    if schema.label is not None and schema.label in names:
        labels = values[:, names.index(schema.label)]
    return PointSet(values[:, features], labels, name, columns=schema.feature_names)


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
        Columns the owner declares to hold only 0 and 1 (the schema's binary columns, or
        ``owner serve --binary-column``): the only columns a logistic regression or a training
        may take as its target at this owner.
    schema : Schema or None
        The public schema the table was checked against (:func:`load_table`), if any.

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
    schema: Schema | None = field(default=None, compare=False)

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


def _table_path(path: str | Path) -> tuple[Path, str]:
    path = Path(path)
    suffix = _suffix(path)
    if suffix not in (".csv", ".parquet"):
        raise ValueError(f"a table must be .csv or .parquet, got {str(path)!r}")
    if not path.exists():
        raise FileNotFoundError(f"table file {str(path)!r} does not exist")
    return path, suffix


def load_table(
    path: str | Path,
    *,
    name: str | None = None,
    binary: Sequence[str] = (),
    schema: Schema | None = None,
) -> Table:
    """Read a numeric table with named columns from a ``.csv`` or ``.parquet`` file.

    Parameters
    ----------
    path : str or Path
    name : str, optional
        Default: the file stem.
    binary : sequence of str
        Columns declared to hold only 0 and 1 (:attr:`Table.binary`), checked now. With a
        schema, each must be one of its binary columns (which are declared 0/1 anyway).
    schema : Schema, optional
        The table's public schema: its columns, in order, with their types, bounds and levels,
        checked now (:meth:`dpmarket.common.schema.Schema.check_table`); its binary columns are
        declared 0/1.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the suffix is not ``.csv``/``.parquet``, the file is empty or unreadable, a column
        has no name (an index column written by pandas), the header reads as numbers (no
        header), a column is not numeric, a value is NaN or inf (naming row and column), column
        names repeat, a declared 0/1 column is missing or holds another value (naming row and
        value), or the table does not match ``schema`` (naming the column).
    """
    path, suffix = _table_path(path)
    table_name = name if name is not None else path.stem
    if schema is None:
        columns, values, _ = _read_table(path, suffix, None)
        return Table(tuple(columns), values, table_name, tuple(binary))
    not_binary = [c for c in binary if c not in schema.binary_columns]
    if not_binary:
        raise ValueError(
            f"--binary-column {', '.join(not_binary)}: the schema does not declare "
            f"{'it' if len(not_binary) == 1 else 'them'} binary (its binary columns: "
            f'{", ".join(schema.binary_columns) or "none"}); declare type = "binary" there'
        )
    names, values = _read_schema_table(path, suffix, schema, by_name=False)
    return Table(tuple(names), values, table_name, schema.binary_columns, schema)


def load_points_and_table(
    path: str | Path, schema: Schema, *, name: str | None = None, binary: Sequence[str] = ()
) -> tuple[PointSet, Table]:
    """Read an owner's one table through its schema, for every capability: the point set it
    summarizes (the schema's features, labels from its label column) and the table of its
    joint statistics (every column; the schema's binary columns declared 0/1).

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`load_table` with ``schema``.
    """
    table = load_table(path, name=name, binary=binary, schema=schema)
    features = table.select(schema.feature_names)
    labels: Any = table.select([schema.label])[:, 0] if schema.label is not None else None
    return PointSet(features, labels, table.name, columns=schema.feature_names), table


def load_point_set(
    path: str | Path,
    *,
    label_column: str | None = "label",
    name: str | None = None,
    schema: Schema | None = None,
    by_name: bool = False,
) -> PointSet:
    """Read a point set from a ``.npy``, ``.npz``, ``.csv`` or ``.parquet`` file.

    Parameters
    ----------
    path : str or Path
        File to read; the suffix selects the format (see the module docstring).
    label_column : str or None, default "label"
        For ``.csv`` and ``.parquet`` without a schema: name of the column holding integer
        labels. If the column is absent the point set is unlabeled; ``None`` treats every column
        as a feature. Ignored for ``.npy`` (labels come from ``<stem>.labels.npy`` when that
        file exists) and ``.npz`` (labels come from the ``labels`` key when present).
    name : str, optional
        Name of the returned point set; defaults to the file stem.
    schema : Schema, optional
        A ``.csv``/``.parquet`` table's public schema: the features are its columns but the
        label, the labels its label column. Checked: names, order, types, bounds and levels.
    by_name : bool
        With a schema: select the schema's features by name, in the schema's order, whatever
        the file's order, the label column being optional (a consumer's validation or test
        set); a column the schema lacks, or a feature the file lacks, is refused. Default: the
        file must hold exactly the schema's columns in its order (an owner's table).

    Returns
    -------
    PointSet
        ``features`` of shape (n_points, n_features), float64; ``labels`` of shape (n_points,),
        int64, or None; ``columns`` the features' names for a table.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the suffix is not supported (the message lists the supported ones), or a schema is
        given for a ``.npy``/``.npz`` file; if the file is empty or unreadable; if a ``.npz``
        lacks ``features``; if a table's column has no name (pandas' index column), its header
        reads as numbers (no header line), a column other than the label column is not numeric
        (the message names the column and its first non-numeric value); if features are not 2-D
        or hold NaN or inf (the message names the first bad row and column); if labels are not
        integers or do not match the number of points; if the table does not match ``schema``
        (naming the column).
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.exists():
        raise FileNotFoundError(f"point-set file {str(path)!r} does not exist")
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"point-set file {str(path)!r} is empty (0 bytes)")
    point_set_name = name if name is not None else path.stem
    if schema is not None:
        if suffix not in (".csv", ".parquet"):
            raise ValueError(
                f"{str(path)!r}: a schema names columns, so the data must be a .csv or .parquet "
                "table with a header"
            )
        return _load_schema_point_set(path, suffix, schema, point_set_name, by_name)
    if suffix == ".npy":
        return _load_npy(path, point_set_name)
    if suffix == ".npz":
        return _load_npz(path, point_set_name)
    return _load_table(path, suffix, label_column, point_set_name)


def feature_columns(n_features: int) -> list[str]:
    """The column names :func:`save_point_set` gives a point set's features in a table:
    ``["f0", "f1", ...]`` (a catalogue's sketch spec names the same columns)."""
    return [f"f{j}" for j in range(n_features)]


def _in_schema_order(frame: pd.DataFrame, schema: Schema) -> pd.DataFrame:
    """``frame`` with the schema's columns first, in its order, and its whole-valued columns
    (integer, binary, categorical with whole levels) as int64."""
    order = [n for n in schema.names if n in frame.columns]
    frame = frame[order + [c for c in frame.columns if c not in order]].copy()
    for name in order:
        column = schema.column(name)
        whole_levels = column.type != "categorical" or all(
            float(v).is_integer() for v in column.levels
        )
        values = frame[name].to_numpy()
        if (
            column.type in ("integer", "binary", "categorical")
            and whole_levels
            and np.issubdtype(values.dtype, np.number)
            and np.all(np.isfinite(values))
            and np.all(values == np.round(values))
        ):
            frame[name] = values.astype(np.int64)
    return frame


def save_point_set(
    point_set: PointSet,
    path: str | Path,
    *,
    owners: Sequence[str] | None = None,
    label_column: str = "label",
    schema: Schema | None = None,
) -> None:
    """Write a point set in the format given by the suffix of ``path``.

    ``.csv`` and ``.parquet`` get one column per feature, named as the point set's
    :attr:`~PointSet.columns` (``f0 .. f{n_features-1}`` when it has none), float64; when the
    set is labeled, a ``label_column`` (int64); with ``owners``, an ``owner`` column naming each
    point's owner. ``.npy`` gets the features and, when labeled, ``<stem>.labels.npy`` beside it
    (a stale labels file is removed when the set is unlabeled, so that :func:`load_point_set`
    does not pick it up). ``.npz`` gets ``features`` and ``labels`` (and ``owners``, as strings).
    Every format round-trips float64 values exactly through :func:`load_point_set`.

    Parameters
    ----------
    point_set : PointSet
    path : str or Path
        Destination; its parent directory must exist. An existing file is overwritten.
    owners : sequence of str, optional
        One owner name per point (a summary's :attr:`~dpmarket.common.summarization.summary.
        SummaryResult.owner_ids`).
    label_column : str
        The labels' column in a table.
    schema : Schema, optional
        The table's public schema: a ``.csv`` or ``.parquet`` table then keeps its columns in
        the schema's order (the label where the schema declares it, ``owner`` last) and writes
        its integer, binary and whole-levelled categorical columns as int64 when every value is
        whole (as the owners' tables, checked against the schema, hold them).

    Raises
    ------
    ValueError
        If the suffix is not one of ``.npy``, ``.npz``, ``.csv``, ``.parquet``; if ``owners``
        does not have one entry per point; if the ``owner`` or label column's name is a
        feature's.
    OSError
        If the file cannot be written (e.g. the parent directory does not exist).
    """
    if owners is not None and len(owners) != point_set.n_points:
        raise ValueError(
            f"owners must name each of the {point_set.n_points} points, got {len(owners)}"
        )
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
        arrays: dict[str, NDArray[Any]] = {"features": features}
        if labels is not None:
            arrays["labels"] = labels
        if owners is not None:
            arrays["owners"] = np.asarray(owners, dtype=str)
        with atomic_write(path) as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        return
    names = list(point_set.columns) or feature_columns(features.shape[1])
    extra = ([label_column] if labels is not None else []) + (["owner"] if owners else [])
    clash = sorted(set(extra) & set(names))
    if clash:
        raise ValueError(f"the column name(s) {clash} are features' names: choose another")
    import pandas as pd

    frame = pd.DataFrame(features, columns=names)
    if labels is not None:
        frame[label_column] = labels
    if schema is not None:
        frame = _in_schema_order(frame, schema)
    if owners is not None:
        frame["owner"] = list(owners)
    with atomic_write(path) as fh:
        if suffix == ".csv":
            frame.to_csv(fh, index=False)
        else:
            frame.to_parquet(fh, index=False)
