"""The start-up pass over an owner's dataset: every value checked, every partition counted.

:func:`validate_dataset` reads every partition once (on the owner's engine, so on Dask for a large
table) and checks its values as :meth:`dpmarket.common.schema.Schema.check_table` checks an
in-memory table — finite, and with a schema the declared types, bounds and levels — and counts its
rows (a CSV's row counts are known only then). A problem refuses the owner's start, on its own
console only, naming the file, the column and where in the file; nothing is served or charged.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.schema import Schema
from dpmarket.owner.dataset import Dataset, DatasetError, Partition, read_partition
from dpmarket.owner.engine import Engine, Progress

__all__ = ["read_all", "validate_dataset"]

logger = logging.getLogger(__name__)

_MAX_PROBLEMS = 20


def _where(partition: Partition) -> str:
    if partition.kind == "csv":
        return f"{partition.display}, the block at byte {partition.start}"
    return f"{partition.display}, rows from {partition.file_row}"


def _check_task(
    partition: Partition,
    columns: tuple[str, ...],
    schema: Schema | None,
    binary: tuple[str, ...],
    integral: tuple[str, ...],
) -> tuple[int, list[str]]:
    """Rows of the partition, and what in its values breaks the checks (for the owner only)."""
    values = read_partition(partition, columns, columns)
    problems = []
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        problems.append(
            f"{_where(partition)}: {int(bad.sum())} NaN, empty or inf value(s), first at row "
            f"{row} of the partition, column {columns[col]!r}"
        )
        return int(values.shape[0]), problems
    if schema is not None:
        for j, column in enumerate(schema.columns):
            problems += [f"{_where(partition)}: {p}" for p in column.problems(values[:, j])]
    for name in binary:
        v = values[:, columns.index(name)]
        other = (v != 0.0) & (v != 1.0)
        if other.any():
            row = int(np.argmax(other))
            problems.append(
                f"{_where(partition)}: column {name!r} is declared 0/1 but holds {v[row]:g} at "
                f"row {row} of the partition ({int(other.sum())} other value(s))"
            )
    for name in integral:
        v = values[:, columns.index(name)]
        other = v != np.round(v)
        if other.any():
            row = int(np.argmax(other))
            problems.append(
                f"{_where(partition)}: the label column {name!r} must hold integers, got "
                f"{v[row]:g} at row {row} of the partition"
            )
    return int(values.shape[0]), problems


def validate_dataset(
    dataset: Dataset,
    engine: Engine,
    *,
    schema: Schema | None = None,
    binary: tuple[str, ...] = (),
    labels: tuple[str, ...] = (),
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Dataset:
    """Check every value of the dataset and count its rows.

    Parameters
    ----------
    dataset : Dataset
        As :func:`dpmarket.owner.dataset.open_dataset` returns it (its columns the schema's, if
        any).
    engine : Engine
    schema : Schema, optional
        The public schema every column's values are checked against (rows in partition order:
        the rows of a partition are named relative to it).
    binary : tuple of str
        Columns declared to hold only 0 and 1.
    labels : tuple of str
        Columns that must hold whole numbers (a label column read without a schema).
    progress : callable, optional
        ``(partitions done, total)``.

    Returns
    -------
    Dataset
        With every partition's row count and offset.

    Raises
    ------
    DatasetError
        Listing the problems (file, column, first row and value of each): for the owner's own
        console only — they depend on the data.
    """
    dataset.column_indices([*binary, *labels])
    found = engine.map(
        _check_task,
        dataset.partitions,
        dataset.columns,
        schema,
        tuple(binary),
        tuple(labels),
        progress=progress,
        cancel=cancel,
    )
    problems = [p for _, ps in found for p in ps]
    if problems:
        shown = problems[:_MAX_PROBLEMS]
        more = len(problems) - len(shown)
        raise DatasetError(
            f"{dataset.location} does not pass its checks:\n  "
            + "\n  ".join(shown)
            + (f"\n  ... and {more} more" if more else "")
        )
    counted = dataset.with_counts([rows for rows, _ in found])
    if counted.n_rows == 0:
        raise DatasetError(f"{dataset.location} holds no rows")
    return counted


def read_all(dataset: Dataset, engine: Engine) -> NDArray[np.float64]:
    """Every column of every partition, concatenated: shape (n_rows, n_columns), float64 (for
    a dataset small enough to hold in memory)."""
    parts = engine.map(read_partition, dataset.partitions, dataset.columns, dataset.columns)
    return np.concatenate(parts) if parts else np.zeros((0, len(dataset.columns)))
