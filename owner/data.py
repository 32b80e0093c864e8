"""Open an owner's data as the owner commands take it: in memory when small, partitioned when not.

:func:`load_owner_data` decides, from the data's public metadata only (row and column counts, or
bytes for a CSV), whether the table is small enough to keep in memory
(:data:`dpmarket.owner.limits.DEFAULT_IN_MEMORY_VALUES`): then it returns an in-memory
:class:`~dpmarket.runtime.tables.PointSet` and :class:`~dpmarket.runtime.tables.Table` (a single
file through :mod:`dpmarket.runtime.tables`, a directory or URL read whole and checked alike);
otherwise it starts the owner's engine (:func:`dpmarket.owner.engine.start_engine`), checks every
value by one pass over the partitions (:func:`dpmarket.owner.validation.validate_dataset`) and
returns a :class:`~dpmarket.owner.partitioned.PartitionedData` and a
:class:`~dpmarket.owner.partitioned.PartitionedTable` over it. Either way a problem refuses the
start on the owner's own console, naming the file and the column.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.common.schema import Schema
from dpmarket.owner.dataset import (
    Dataset,
    DatasetError,
    estimate_bytes,
    is_dataset_location,
    open_dataset,
)
from dpmarket.owner.engine import Engine, SerialEngine
from dpmarket.owner.limits import DEFAULT_IN_MEMORY_VALUES, MAX_IN_MEMORY_ROWS
from dpmarket.owner.partitioned import PartitionedData, PartitionedTable
from dpmarket.owner.validation import read_all, validate_dataset

# PointSet's home is dpmarket.runtime.tables; dpmarket.owner.protocol still imports it from here.
from dpmarket.runtime.tables import (
    PointSet,
    Table,
    load_point_set,
    load_points_and_table,
    load_table,
)

__all__ = ["OwnerData", "is_small", "load_owner_data"]

logger = logging.getLogger(__name__)


@dataclass
class OwnerData:
    """What an owner serves.

    Attributes
    ----------
    points : PointSet, PartitionedData or None
        The points it summarizes.
    table : Table, PartitionedTable or None
        The table of its joint statistics and sketches.
    engine : Engine or None
        The engine of a partitioned table (to close with the owner).
    """

    points: PointSet | PartitionedData | None
    table: Table | PartitionedTable | None
    engine: Engine | None = None

    @property
    def partitioned(self) -> bool:
        """Whether the data is served partition by partition."""
        return self.engine is not None


def is_small(dataset: Dataset, in_memory_values: int) -> bool:
    """Whether a dataset's table fits the in-memory thresholds (from its metadata only): at most
    ``in_memory_values`` values and :data:`dpmarket.owner.limits.MAX_IN_MEMORY_ROWS` rows (estimated
    from
    the bytes for a CSV not yet counted)."""
    values = estimate_bytes(dataset) // 8
    rows = values // max(len(dataset.columns), 1)
    return values <= in_memory_values and rows <= MAX_IN_MEMORY_ROWS


def _progress(what: str) -> Callable[[int, int], None]:
    start = time.monotonic()
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 5.0:
            last[0] = now
            logger.info("%s: %d of %d partitions (%.0f s)", what, done, total, now - start)

    return report


def load_owner_data(
    location: str,
    *,
    schema: Schema | None = None,
    label_column: str | None = "label",
    binary: Sequence[str] = (),
    points: bool = True,
    table: bool = True,
    in_memory_values: int = DEFAULT_IN_MEMORY_VALUES,
    engine: Callable[[], Engine] | None = None,
    name: str | None = None,
) -> OwnerData:
    """Open an owner's data (module docstring).

    Parameters
    ----------
    location : str
        A file, directory, glob or fsspec URL (:func:`dpmarket.owner.dataset.open_dataset`).
    schema : Schema, optional
        The table's public schema: with it, the points are its features (labels from its label
        column) and the table every column (its binary columns declared 0/1).
    label_column : str or None
        Without a schema: the points' label column, when present.
    binary : sequence of str
        Without a schema: columns declared 0/1 (checked now).
    points, table : bool
        Which of the two to return (without a schema an owner may serve one file as points and
        another as its table).
    in_memory_values : int
        The in-memory threshold, in values (rows x columns).
    engine : callable, optional
        Starts the engine of a partitioned table (default: a serial engine in this process).
    name : str, optional
        The table's name (default: the file stem or directory name).

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`dpmarket.runtime.tables.load_table` for a small file;
        :class:`dpmarket.owner.dataset.DatasetError` (a ``ValueError``) naming the file and the
        column for a dataset that cannot be read (a missing partition, schema drift between files,
        values that break the checks).
    """
    single = not is_dataset_location(location)
    if single and not Path(location).exists():
        raise FileNotFoundError(f"data file {location!r} does not exist")
    suffix = Path(location).suffix.lower()
    if single and suffix == ".npz":
        return _from_file(location, schema, label_column, binary, points, table, name)
    dataset = open_dataset(location, schema=schema, name=name)
    if single and is_small(dataset, in_memory_values) and suffix in (".csv", ".parquet"):
        return _from_file(location, schema, label_column, binary, points, table, name)
    if single and suffix == ".npy" and is_small(dataset, in_memory_values):
        return _from_file(location, schema, label_column, binary, points, table, name)
    features, label = _roles(dataset, schema, label_column)
    binary_columns = tuple(schema.binary_columns if schema is not None else binary)
    if schema is not None:
        _check_binary(schema, binary)
    labels = () if schema is not None or label is None else (label,)
    if is_small(dataset, in_memory_values):
        serial = SerialEngine()
        dataset = validate_dataset(
            dataset, serial, schema=schema, binary=binary_columns, labels=labels
        )
        values = read_all(dataset, serial)
        whole = Table(dataset.columns, values, dataset.name, binary_columns, schema)
        point_set = None
        if points:
            labels_values: Any = whole.select([label])[:, 0] if label is not None else None
            point_set = PointSet(
                whole.select(features), labels_values, dataset.name, columns=tuple(features)
            )
        return OwnerData(point_set, whole if table else None)
    started = time.monotonic()
    runner = engine() if engine is not None else SerialEngine()
    logger.info(
        "%s: %d partition(s) in %d file(s), %s rows; checking every value on %d worker(s)",
        location,
        len(dataset.partitions),
        len(dataset.files),
        dataset.n_rows if dataset.counted else "uncounted",
        runner.workers,
    )
    try:
        dataset = validate_dataset(
            dataset,
            runner,
            schema=schema,
            binary=binary_columns,
            labels=labels,
            progress=_progress(f"checking {location}"),
        )
    except BaseException:
        runner.close()
        raise
    logger.info(
        "%s: %d rows checked in %.1f s; served partition by partition",
        location,
        dataset.n_rows,
        time.monotonic() - started,
    )
    data = PartitionedData(dataset, runner, features=features, label=label)
    return OwnerData(
        data if points else None,
        PartitionedTable(data, dataset.name, binary_columns, schema) if table else None,
        runner,
    )


def _roles(
    dataset: Dataset, schema: Schema | None, label_column: str | None
) -> tuple[list[str], str | None]:
    """The feature columns and the label column."""
    if schema is not None:
        return list(schema.feature_names), schema.label
    label = label_column if label_column in dataset.columns else None
    features = [c for c in dataset.columns if c != label]
    if not features:
        raise DatasetError(f"{dataset.location} holds no feature columns (only {label!r})")
    return features, label


def _check_binary(schema: Schema, binary: Sequence[str]) -> None:
    not_binary = [c for c in binary if c not in schema.binary_columns]
    if not_binary:
        raise ValueError(
            f"--binary-column {', '.join(not_binary)}: the schema does not declare "
            f"{'it' if len(not_binary) == 1 else 'them'} binary (its binary columns: "
            f'{", ".join(schema.binary_columns) or "none"}); declare type = "binary" there'
        )


def _from_file(
    location: str,
    schema: Schema | None,
    label_column: str | None,
    binary: Sequence[str],
    points: bool,
    table: bool,
    name: str | None,
) -> OwnerData:
    """Today's in-memory path for one small file."""
    if schema is not None:
        point_set, whole = load_points_and_table(location, schema, name=name, binary=binary)
        return OwnerData(point_set if points else None, whole if table else None)
    only = load_point_set(location, label_column=label_column, name=name) if points else None
    rows = load_table(location, binary=binary, name=name) if table else None
    return OwnerData(only, rows)
