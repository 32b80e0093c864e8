"""An owner's data as a dataset: files read lazily, partition by partition.

An owner's table may be larger than memory: a Parquet dataset (a file, a directory of files, a
glob, or any fsspec URL such as ``s3://bucket/table/``), a CSV file or a ``.npy`` array. This
module reads its **metadata** (file list, column names and types, row counts, row groups) without
reading its values, cuts it into :class:`Partition` objects — public descriptions of where rows
live, small enough to send to a Dask worker — and reads one partition's columns at a time
(:func:`read_partition`, run on whichever process computes on it).

Partitions, by format:

``.parquet`` (files, directories, globs, URLs)
    One partition per group of consecutive row groups of one file, holding at most
    ``partition_rows`` rows (a row group larger than that is a partition of its own). Opened with
    pyarrow, through fsspec for remote URLs; a directory's ``_metadata`` summary, when present,
    names the files the dataset must hold.
``.csv``
    Byte ranges of about ``blocksize`` bytes, cut at line ends (:func:`fsspec.utils.read_block`, the
    cutting dask's ``read_csv`` uses): the row counts are known only once every block has been read
    (:func:`dpmarket.owner.validation.validate_dataset` counts them). Numeric CSV only: a quoted
    field holding a line break would be cut.
``.npy``
    Row ranges of a memory-mapped array (columns ``f0 .. f{n-1}``).

What is checked here, at start-up, on the metadata only: that every file exists and can be opened,
that every file holds the same columns in the same order (a **schema drift** between files is
refused naming the file and the column), that the columns are numeric, and, with a public schema,
that the names and order are the schema's. The values are checked by a pass over every partition
(:mod:`dpmarket.owner.validation`), also at start-up. Every message here names files and columns,
never values: it is for the owner's console, and the service does not start.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zict
from fsspec.utils import read_block
from numpy.typing import NDArray

from dpmarket.common.schema import Schema, SchemaMismatchError

__all__ = [
    "DEFAULT_BLOCKSIZE",
    "DEFAULT_PARTITION_ROWS",
    "Dataset",
    "DatasetError",
    "Partition",
    "is_dataset_location",
    "open_dataset",
    "read_partition",
]

#: Most rows of one Parquet or ``.npy`` partition (row groups are never split): 2^19 rows of 10
#: float64 columns are 40 MiB; a task computes their features a block at a time. Small enough
#: that a table of a million rows keeps two workers busy.
DEFAULT_PARTITION_ROWS = 1 << 19
#: Bytes of one CSV partition (about 0.9 million rows of 10 numbers written by pandas).
DEFAULT_BLOCKSIZE = 64 << 20
#: Bytes of partition values each process (every Dask worker, or the owner) keeps after reading
#: them (:func:`read_partition`): two 2^19-row partitions of 10 columns fit, so a table of a
#: million rows is read from its files once; a larger one is read per computation, as it must
#: be. Two workers' caches add at most 192 MiB to an owner of any size.
DEFAULT_PARTITION_CACHE_BYTES = 96 << 20
#: Environment variable that sets the cache's bytes per process (0: no cache).
PARTITION_CACHE_ENV = "DPMARKET_PARTITION_CACHE_BYTES"
_CACHE: zict.LRU[tuple[Any, ...], NDArray[np.float64]] | None = None

Kind = Literal["parquet", "csv", "npy"]
_SUFFIXES: dict[str, Kind] = {".parquet": "parquet", ".parq": "parquet", ".pq": "parquet"}
_SUFFIXES.update({".csv": "csv", ".npy": "npy"})


class DatasetError(ValueError):
    """An owner's dataset cannot be served: a file missing or unreadable, columns that differ
    between files or from the schema, a column that is not numeric. The message names the file
    and the column (never a value)."""


@dataclass(frozen=True)
class Partition:
    """Where one partition's rows live: public metadata, small enough to send to a worker.

    Attributes
    ----------
    index : int
        Position in the dataset (partitions are in file order, then row order).
    url : str
        The file, as fsspec opens it (``file:///...`` for local files).
    display : str
        The file as the owner named it, for messages.
    kind : {"parquet", "csv", "npy"}
    start, stop : int
        Parquet: the row groups ``[start, stop)``; CSV: the bytes ``[start, stop)`` (cut at line
        ends when read); npy: the rows ``[start, stop)``.
    offset : int
        The dataset-wide index of the partition's first row (``-1`` until known: a CSV block's
        rows are counted by the validation pass).
    rows : int
        Its row count (``-1`` until known).
    file_row : int
        The index of its first row within its file, for messages (``-1`` until known).
    """

    index: int
    url: str
    display: str
    kind: Kind
    start: int
    stop: int
    offset: int
    rows: int
    file_row: int


@dataclass(frozen=True)
class Dataset:
    """An owner's table as files and partitions, with its column names (no values).

    Attributes
    ----------
    name : str
        A name for messages and reports (the file stem or directory name).
    location : str
        What the owner gave (``--data``).
    columns : tuple of str
        Every column, in file order (the schema's order when there is one).
    partitions : tuple of Partition
    nbytes : int
        Bytes on disk of every file (the CSV or Parquet size; what decides whether the table is
        small enough to keep in memory for a format whose row count is unknown).
    """

    name: str
    location: str
    columns: tuple[str, ...]
    partitions: tuple[Partition, ...]
    nbytes: int

    @property
    def counted(self) -> bool:
        """Whether every partition's row count and offset are known."""
        return all(p.rows >= 0 and p.offset >= 0 for p in self.partitions)

    @property
    def n_rows(self) -> int:
        """Rows in all (a public declaration of the owner, as an in-memory table's row count is).

        Raises
        ------
        DatasetError
            If the rows have not been counted yet (a CSV before its validation pass).
        """
        if not self.counted:
            raise DatasetError(f"{self.location}: rows not counted yet (validate the dataset)")
        return sum(p.rows for p in self.partitions)

    @property
    def files(self) -> tuple[str, ...]:
        """The files, in order."""
        return tuple(dict.fromkeys(p.display for p in self.partitions))

    def with_counts(self, rows: Sequence[int]) -> Dataset:
        """The same dataset with every partition's row count (in order) and offsets set."""
        if len(rows) != len(self.partitions):
            raise ValueError(f"need {len(self.partitions)} row counts, got {len(rows)}")
        parts, offset, file_row, last_file = [], 0, 0, None
        for part, count in zip(self.partitions, rows, strict=True):
            if part.url != last_file:
                file_row, last_file = 0, part.url
            parts.append(replace(part, rows=int(count), offset=offset, file_row=file_row))
            offset += int(count)
            file_row += int(count)
        return replace(self, partitions=tuple(parts))

    def column_indices(self, names: Sequence[str]) -> list[int]:
        """Positions of ``names`` among :attr:`columns`.

        Raises
        ------
        DatasetError
            For a name the dataset lacks (listing its columns).
        """
        index = {c: j for j, c in enumerate(self.columns)}
        missing = [n for n in names if n not in index]
        if missing:
            raise DatasetError(
                f"{self.location} has no column(s) {missing}; its columns are {list(self.columns)}"
            )
        return [index[n] for n in names]


def is_dataset_location(location: str) -> bool:
    """Whether ``location`` names more than one local file, or a remote one: a directory, a glob
    or a URL (these are always read through :func:`open_dataset`)."""
    if "://" in location or any(ch in location for ch in "*?["):
        return True
    fs, path = fsspec.core.url_to_fs(location)
    return bool(fs.isdir(path))


def _kind(path: str) -> Kind | None:
    return _SUFFIXES.get(posixpath.splitext(path)[1].lower())


def _files(location: str) -> tuple[Any, list[str]]:
    """The filesystem and the data files a location names, in sorted order.

    A directory's files are found recursively (Hive-style ``key=value`` subdirectories too);
    names starting with ``_`` or ``.`` (``_metadata``, ``_SUCCESS``, ``.crc``) are not data.
    """
    fs, path = fsspec.core.url_to_fs(location)
    if any(ch in path for ch in "*?["):
        found = sorted(fs.glob(path))
        if not found:
            raise DatasetError(f"{location}: no file matches")
    elif fs.isdir(path):
        found = sorted(
            f
            for f in fs.find(path)
            if _kind(f) is not None
            and not any(
                part.startswith(("_", ".")) for part in posixpath.relpath(f, path).split("/")
            )
        )
        if not found:
            raise DatasetError(
                f"{location}: the directory holds no data file (.parquet, .csv or .npy)"
            )
        _check_summary(fs, path, found, location)
    elif fs.exists(path):
        found = [path]
    else:
        raise DatasetError(f"{location} does not exist")
    kinds = {_kind(f) for f in found}
    if None in kinds:
        bad = next(f for f in found if _kind(f) is None)
        raise DatasetError(f"{bad}: not a .parquet, .csv or .npy file")
    if len(kinds) > 1:
        raise DatasetError(f"{location} mixes file formats ({sorted(map(str, kinds))})")
    return fs, found


def _check_summary(fs: Any, root: str, found: list[str], location: str) -> None:
    """Refuse a directory whose ``_metadata`` summary names a file that is not there (a missing
    partition) — the summary is the dataset's own list of its files."""
    summary = posixpath.join(root, "_metadata")
    if not fs.exists(summary):
        return
    try:
        with fs.open(summary, "rb") as fh:
            meta = pq.read_metadata(fh)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{summary}: not a Parquet summary file: {exc}") from None
    listed = {
        meta.row_group(i).column(0).file_path
        for i in range(meta.num_row_groups)
        if meta.row_group(i).num_columns
    }
    have = {posixpath.relpath(f, root) for f in found}
    missing = sorted(p for p in listed if p and p not in have)
    if missing:
        raise DatasetError(
            f"{location}: a partition is missing: {posixpath.join(root, missing[0])} is listed "
            f"in {summary} but does not exist ({len(missing)} missing in all); restore it, or "
            "rewrite the summary"
        )


def _display(fs: Any, path: str, location: str) -> str:
    if "://" in location:
        return str(fs.unstrip_protocol(path))
    return path


def _numeric(arrow_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


def _check_columns(
    names: list[str], where: str, reference: tuple[str, ...] | None, first: str | None
) -> None:
    """Refuse unnamed or repeated columns, and columns other than the first file's."""
    for j, name in enumerate(names):
        if not name.strip() or name.startswith("Unnamed: ") or name == "__index_level_0__":
            raise DatasetError(
                f"{where}: column {j + 1} ({name!r}) has no name: the row index pandas writes "
                "by default? Write files with index=False, or drop that column"
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DatasetError(f"{where} repeats column name(s) {repeated}")
    if reference is None or tuple(names) == reference:
        return
    missing = [n for n in reference if n not in names]
    extra = [n for n in names if n not in reference]
    if missing:
        column = missing[0]
        raise DatasetError(
            f"schema drift: {where} lacks column {column!r}, which {first} has "
            f"({first}: {', '.join(reference)})"
        )
    if extra:
        raise DatasetError(
            f"schema drift: {where} has column {extra[0]!r}, which {first} lacks "
            f"({first}: {', '.join(reference)})"
        )
    j = next(j for j, (a, b) in enumerate(zip(names, reference, strict=True)) if a != b)
    raise DatasetError(
        f"schema drift: column {j + 1} of {where} is {names[j]!r} but {reference[j]!r} in "
        f"{first}: the same columns in another order"
    )


def _parquet_partitions(
    fs: Any, files: list[str], location: str, partition_rows: int
) -> tuple[tuple[str, ...], list[Partition], int]:
    columns: tuple[str, ...] | None = None
    types: dict[str, pa.DataType] = {}
    first: str | None = None
    parts: list[Partition] = []
    offset, nbytes = 0, 0
    for path in files:
        where = _display(fs, path, location)
        try:
            with fs.open(path, "rb") as fh:
                meta = pq.ParquetFile(fh).metadata
                schema = meta.schema.to_arrow_schema()
        except FileNotFoundError:
            raise DatasetError(f"a partition is missing: {where} does not exist") from None
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{where}: cannot read it as Parquet: {exc}") from None
        nbytes += int(fs.size(path))
        names = [str(n) for n in schema.names]
        _check_columns(names, where, columns, first)
        for name in names:
            arrow_type = schema.field(name).type
            if not _numeric(arrow_type):
                raise DatasetError(
                    f"column {name!r} of {where} is not numeric (Parquet type {arrow_type}): "
                    "dpmarket reads numbers only; encode it as numbers or drop it"
                )
            if name in types and types[name] != arrow_type:
                raise DatasetError(
                    f"schema drift: column {name!r} is {arrow_type} in {where} but "
                    f"{types[name]} in {first}"
                )
            types.setdefault(name, arrow_type)
        if columns is None:
            columns, first = tuple(names), where
        url = str(fs.unstrip_protocol(path))
        group, rows_in_group, file_row = 0, 0, 0
        start = 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if g > start and rows_in_group + rows > partition_rows:
                parts.append(
                    Partition(
                        len(parts), url, where, "parquet", start, g, offset, rows_in_group, file_row
                    )
                )
                offset += rows_in_group
                file_row += rows_in_group
                start, rows_in_group = g, 0
            rows_in_group += rows
            group = g + 1
        if group > start and rows_in_group > 0:
            parts.append(
                Partition(
                    len(parts), url, where, "parquet", start, group, offset, rows_in_group, file_row
                )
            )
            offset += rows_in_group
    assert columns is not None
    return columns, parts, nbytes


def _csv_header(fs: Any, path: str, where: str) -> list[str]:
    import pandas as pd  # on first use: a program importing the client does not pay for it

    with fs.open(path, "rb") as fh:
        line = fh.readline()
    if not line.strip():
        raise DatasetError(f"{where} is empty: it holds no header and no points")
    header = pd.read_csv(io.BytesIO(line), header=None, dtype=str, keep_default_na=False)
    cells = [str(c) for c in header.iloc[0].tolist()]
    if all(_is_number(c) for c in cells):
        raise DatasetError(
            f"{where} has no header line: its first line reads as numbers, so it would be taken "
            "for the column names and its row lost. Add a first line naming the columns"
        )
    return cells


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_partitions(
    fs: Any, files: list[str], location: str, blocksize: int
) -> tuple[tuple[str, ...], list[Partition], int]:
    columns: tuple[str, ...] | None = None
    first: str | None = None
    parts: list[Partition] = []
    nbytes = 0
    for path in files:
        where = _display(fs, path, location)
        names = _csv_header(fs, path, where)
        _check_columns(names, where, columns, first)
        if columns is None:
            columns, first = tuple(names), where
        size = int(fs.size(path))
        nbytes += size
        url = str(fs.unstrip_protocol(path))
        for start in range(0, size, blocksize):
            stop = min(start + blocksize, size)
            parts.append(Partition(len(parts), url, where, "csv", start, stop, -1, -1, -1))
    assert columns is not None
    return columns, parts, nbytes


def _npy_partitions(
    fs: Any, files: list[str], location: str, partition_rows: int
) -> tuple[tuple[str, ...], list[Partition], int]:
    if len(files) != 1 or "://" in location:
        raise DatasetError(f"{location}: a .npy array is read from one local file")
    path = files[0]
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DatasetError(f"{path}: cannot read it as a .npy array: {exc}") from None
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
        raise DatasetError(
            f"{path}: a .npy table is a 2-D numeric array, got {arr.shape} {arr.dtype}"
        )
    n = int(arr.shape[0])
    url = str(fs.unstrip_protocol(path))
    parts = [
        Partition(
            i,
            url,
            path,
            "npy",
            start,
            min(start + partition_rows, n),
            start,
            min(partition_rows, n - start),
            start,
        )
        for i, start in enumerate(range(0, n, partition_rows))
    ]
    return tuple(f"f{j}" for j in range(arr.shape[1])), parts, int(fs.size(path))


def open_dataset(
    location: str,
    *,
    schema: Schema | None = None,
    name: str | None = None,
    partition_rows: int = DEFAULT_PARTITION_ROWS,
    blocksize: int = DEFAULT_BLOCKSIZE,
) -> Dataset:
    """Read a dataset's metadata and cut it into partitions; read no value.

    Parameters
    ----------
    location : str
        A file, a directory, a glob (``data/part-*.parquet``) or an fsspec URL.
    schema : Schema, optional
        The table's public schema: the files' columns must be its columns, in its order.
    name : str, optional
        Default: the file stem or the directory's name.
    partition_rows : int
        Most rows of a Parquet or ``.npy`` partition.
    blocksize : int
        Bytes of a CSV partition.

    Returns
    -------
    Dataset
        Parquet and ``.npy`` datasets with their row counts; CSV ones without (counted by the
        validation pass).

    Raises
    ------
    DatasetError
        If the location names nothing; a file is missing (a directory's ``_metadata`` lists a
        file that is not there), unreadable, or of another format; the files' columns differ
        (naming the file and the column); a column is unnamed, repeated or not numeric; or the
        columns are not the schema's (naming the column).
    """
    if partition_rows < 1 or blocksize < 1:
        raise ValueError(
            f"partition_rows and blocksize must be >= 1, got {partition_rows}, {blocksize}"
        )
    fs, files = _files(location)
    kind = _kind(files[0])
    if kind == "parquet":
        columns, parts, nbytes = _parquet_partitions(fs, files, location, partition_rows)
    elif kind == "csv":
        columns, parts, nbytes = _csv_partitions(fs, files, location, blocksize)
    else:
        columns, parts, nbytes = _npy_partitions(fs, files, location, partition_rows)
    if schema is not None and columns != schema.names:
        where = files[0] if len(files) == 1 else location
        try:
            schema.check_table(list(columns), np.zeros((0, len(columns))), source=where)
        except SchemaMismatchError as exc:
            raise DatasetError(str(exc)) from None
    stem = posixpath.basename(location.rstrip("/").split("://")[-1])
    default_name = posixpath.splitext(stem)[0] if kind and not fs.isdir(files[0]) else stem
    if not parts:
        raise DatasetError(f"{location} holds no rows")
    return Dataset(name or default_name or "data", location, columns, tuple(parts), nbytes)


def _partition_cache() -> zict.LRU[tuple[Any, ...], NDArray[np.float64]] | None:
    """This process's cache of partition values (None when turned off)."""
    global _CACHE
    if _CACHE is None:
        budget = int(os.environ.get(PARTITION_CACHE_ENV, DEFAULT_PARTITION_CACHE_BYTES))
        if budget <= 0:
            return None
        _CACHE = zict.LRU(budget, {}, weight=lambda _key, value: int(value.nbytes))
    return _CACHE


def read_partition(
    partition: Partition, columns: Sequence[str], all_columns: Sequence[str]
) -> NDArray[np.float64]:
    """The values of ``columns`` in one partition, float64, shape ``(rows, len(columns))``.

    Runs wherever the partition is computed on (a Dask worker, or the owner's process). Values
    are not checked here (the validation pass did it at start-up). The process keeps the values
    it read, least recently used first out, up to :data:`DEFAULT_PARTITION_CACHE_BYTES` (the
    ``DPMARKET_PARTITION_CACHE_BYTES`` environment variable; 0 turns it off): a dataset that
    fits is read from its files once, by the validation pass, not once per computation. The
    caller gets its own copy.

    Parameters
    ----------
    partition : Partition
    columns : sequence of str
        The columns wanted, in that order.
    all_columns : sequence of str
        Every column of the dataset, in file order (names a CSV block's fields).

    Raises
    ------
    OSError, ValueError
        If the file cannot be read any more (moved, truncated since start-up).
    """
    key = (partition.url, partition.kind, partition.start, partition.stop, tuple(columns))
    cache = _partition_cache()
    if cache is not None:
        with contextlib.suppress(KeyError):
            return cache[key].copy()
    values = _read_partition_files(partition, columns, all_columns)
    if cache is not None and values.nbytes <= cache.n:
        cache[key] = values.copy()
    return values


def _read_partition_files(
    partition: Partition, columns: Sequence[str], all_columns: Sequence[str]
) -> NDArray[np.float64]:
    """:func:`read_partition` from the files."""
    import pandas as pd  # on first use: a program importing the client does not pay for it

    wanted = list(columns)
    if partition.kind == "parquet":
        fs, path = fsspec.core.url_to_fs(partition.url)
        with fs.open(path, "rb") as fh:
            table = pq.ParquetFile(fh).read_row_groups(
                list(range(partition.start, partition.stop)), columns=wanted, use_threads=False
            )
        out = np.empty((table.num_rows, len(wanted)), dtype=np.float64)
        for j, name in enumerate(wanted):
            out[:, j] = table.column(name).to_numpy(zero_copy_only=False)
        del table
        pa.default_memory_pool().release_unused()
        return out
    if partition.kind == "csv":
        fs, path = fsspec.core.url_to_fs(partition.url)
        with fs.open(path, "rb") as fh:
            block = read_block(fh, partition.start, partition.stop - partition.start, b"\n")
        frame = pd.read_csv(
            io.BytesIO(block),
            header=None,
            names=list(all_columns),
            skiprows=1 if partition.start == 0 else 0,
            usecols=wanted,
            dtype=np.float64,
            engine="c",
        )
        return np.ascontiguousarray(frame[wanted].to_numpy(dtype=np.float64))
    fs, path = fsspec.core.url_to_fs(partition.url)
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    index = [list(all_columns).index(c) for c in wanted]
    return np.array(arr[partition.start : partition.stop][:, index], dtype=np.float64)


def estimate_bytes(dataset: Dataset) -> int:
    """Bytes of the whole table in float64 (rows x columns x 8), or the files' size when the
    rows are not counted yet (a CSV's text is about as large as its float64 values)."""
    if dataset.counted:
        return dataset.n_rows * len(dataset.columns) * 8
    return dataset.nbytes


def largest_partition(dataset: Dataset) -> int:
    """Rows of the largest partition (its bytes over 8 per value for an uncounted CSV)."""
    if dataset.counted:
        return max(p.rows for p in dataset.partitions)
    return max(
        math.ceil((p.stop - p.start) / (8 * len(dataset.columns))) for p in dataset.partitions
    )
