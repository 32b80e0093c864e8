"""An owner's data as a dataset: partitions from the metadata, the start-up checks naming the file
and the column, and the in-memory path kept for small tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpmarket.common.schema import Column, Schema
from dpmarket.owner.data import load_owner_data
from dpmarket.owner.dataset import DatasetError, open_dataset, read_partition
from dpmarket.owner.engine import SerialEngine
from dpmarket.owner.partitioned import PartitionedData, PartitionedTable
from dpmarket.owner.validation import read_all, validate_dataset
from dpmarket.runtime.tables import PointSet, Table
from dpmarket.runtime.tables import load_points_and_table as load_file

COLUMNS = ("a", "b", "c", "label")
SCHEMA = Schema(
    (
        Column("a", "continuous", -10.0, 10.0),
        Column("b", "continuous", -10.0, 10.0),
        Column("c", "continuous", -10.0, 10.0),
        Column("label", "binary", 0.0, 1.0),
    ),
    "label",
)


def _frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    x = rng.normal(size=(n, 3))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": rng.integers(0, 2, n)})


def _write_dataset(root: Path, frames: list[pd.DataFrame], *, summary: bool = False) -> None:
    root.mkdir(parents=True, exist_ok=True)
    collector: list[pq.FileMetaData] = []
    for i, frame in enumerate(frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(
            table, root / f"part-{i}.parquet", row_group_size=1000, metadata_collector=collector
        )
        collector[-1].set_file_path(f"part-{i}.parquet")
    if summary:
        pq.write_metadata(
            pa.Table.from_pandas(frames[0], preserve_index=False).schema,
            root / "_metadata",
            metadata_collector=collector,
        )


@pytest.fixture
def frames() -> list[pd.DataFrame]:
    rng = np.random.default_rng(0)
    return [_frame(rng, 2500) for _ in range(4)]


def test_partitions_come_from_the_metadata_and_read_back_the_rows(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    _write_dataset(tmp_path / "t", frames)
    dataset = open_dataset(str(tmp_path / "t"), partition_rows=2000)
    # 4 files x 3 row groups (1000, 1000, 500): groups of at most 2000 rows -> 2 per file.
    assert dataset.columns == COLUMNS
    assert [p.rows for p in dataset.partitions] == [2000, 500] * 4
    assert dataset.n_rows == 10_000 and dataset.counted
    whole = pd.concat(frames).to_numpy(dtype=np.float64)
    assert np.array_equal(read_all(dataset, SerialEngine()), whole)
    part = dataset.partitions[3]
    assert np.array_equal(
        read_partition(part, ("c", "a"), COLUMNS), whole[part.offset : part.offset + 500][:, [2, 0]]
    )


def test_a_partition_read_once_is_served_from_the_cache_as_a_copy(
    tmp_path: Path, frames: list[pd.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dpmarket.owner.dataset as dataset_module

    _write_dataset(tmp_path / "t", frames)
    dataset = open_dataset(str(tmp_path / "t"), partition_rows=2000)
    part = dataset.partitions[0]
    monkeypatch.setattr(dataset_module, "_CACHE", None)
    monkeypatch.setenv(dataset_module.PARTITION_CACHE_ENV, str(1 << 20))
    first = read_partition(part, COLUMNS, COLUMNS)
    first[:] = np.nan  # the caller's copy: the cache keeps the file's values
    for path in (tmp_path / "t").iterdir():
        path.unlink()
    again = read_partition(part, COLUMNS, COLUMNS)
    assert np.array_equal(again, pd.concat(frames).to_numpy(dtype=np.float64)[:2000])
    # Without the cache the files are read again, and they are gone.
    monkeypatch.setattr(dataset_module, "_CACHE", None)
    monkeypatch.setenv(dataset_module.PARTITION_CACHE_ENV, "0")
    with pytest.raises(OSError):
        read_partition(part, COLUMNS, COLUMNS)


def test_a_glob_and_a_file_url_name_the_same_dataset(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    _write_dataset(tmp_path / "t", frames)
    by_dir = open_dataset(str(tmp_path / "t"))
    by_glob = open_dataset(str(tmp_path / "t" / "part-*.parquet"))
    by_url = open_dataset(f"file://{tmp_path / 't'}")
    assert by_dir.n_rows == by_glob.n_rows == by_url.n_rows == 10_000
    assert np.array_equal(read_all(by_url, SerialEngine()), read_all(by_dir, SerialEngine()))


def test_a_missing_partition_is_refused_naming_the_file(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    _write_dataset(tmp_path / "t", frames, summary=True)
    assert open_dataset(str(tmp_path / "t")).n_rows == 10_000
    (tmp_path / "t" / "part-2.parquet").unlink()
    with pytest.raises(DatasetError, match=r"a partition is missing: .*part-2\.parquet"):
        open_dataset(str(tmp_path / "t"))


def test_a_truncated_file_is_refused_naming_it(tmp_path: Path, frames: list[pd.DataFrame]) -> None:
    _write_dataset(tmp_path / "t", frames)
    path = tmp_path / "t" / "part-1.parquet"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"part-1\.parquet: cannot read it as Parquet"):
        open_dataset(str(tmp_path / "t"))


def test_schema_drift_between_files_is_refused_naming_the_file_and_the_column(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    frames[2] = frames[2].rename(columns={"b": "bb"})
    _write_dataset(tmp_path / "t", frames)
    with pytest.raises(DatasetError, match=r"schema drift: .*part-2\.parquet lacks column 'b'"):
        open_dataset(str(tmp_path / "t"))


def test_a_type_drift_is_refused_naming_the_file_and_the_column(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    frames[1] = frames[1].astype({"label": np.float64})
    _write_dataset(tmp_path / "t", frames)
    with pytest.raises(
        DatasetError, match=r"schema drift: column 'label' is double in .*part-1\.parquet"
    ):
        open_dataset(str(tmp_path / "t"))


def test_a_text_column_is_refused_naming_the_file_and_the_column(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    for frame in frames:
        frame["c"] = frame["c"].astype(str)
    _write_dataset(tmp_path / "t", frames)
    with pytest.raises(DatasetError, match=r"column 'c' of .*part-0\.parquet is not numeric"):
        open_dataset(str(tmp_path / "t"))


def test_columns_other_than_the_schemas_are_refused_naming_the_column(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    _write_dataset(tmp_path / "t", [f[["b", "a", "c", "label"]] for f in frames])
    with pytest.raises(DatasetError, match=r"column 1 is 'b' .* but 'a' in the schema"):
        open_dataset(str(tmp_path / "t"), schema=SCHEMA)


def test_the_value_pass_names_the_file_the_column_and_the_row(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    frames[3].loc[1700, "b"] = 99.0  # outside the public bounds [-10, 10]
    frames[1].loc[10, "a"] = np.nan
    _write_dataset(tmp_path / "t", frames)
    dataset = open_dataset(str(tmp_path / "t"), schema=SCHEMA, partition_rows=2000)
    with pytest.raises(DatasetError) as info:
        validate_dataset(dataset, SerialEngine(), schema=SCHEMA)
    text = str(info.value)
    assert "part-1.parquet, rows from 0: 1 NaN, empty or inf value(s), first at row 10" in text
    assert "column 'a'" in text
    assert "part-3.parquet, rows from 0: column 'b' holds 1 value(s) outside" in text
    assert "first 99 at row 1700" in text


def test_csv_blocks_are_cut_at_line_ends_and_counted(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    path = tmp_path / "t.csv"
    whole = pd.concat(frames)
    whole.to_csv(path, index=False)
    dataset = open_dataset(str(path), blocksize=20_000)
    assert len(dataset.partitions) > 10 and not dataset.counted
    counted = validate_dataset(dataset, SerialEngine(), schema=SCHEMA)
    assert counted.n_rows == len(whole)
    assert np.allclose(read_all(counted, SerialEngine()), whole.to_numpy(dtype=np.float64))


def test_a_narrow_table_of_many_rows_is_partitioned(tmp_path: Path) -> None:
    # 2 columns x (MAX_IN_MEMORY_ROWS + 1) rows: far below the in-memory values, but a session
    # would hold n x 140 float32 features (above 100 MiB), so the table is partitioned.
    from dpmarket.owner.limits import DEFAULT_IN_MEMORY_VALUES, MAX_IN_MEMORY_ROWS

    n = MAX_IN_MEMORY_ROWS + 1
    assert 2 * n < DEFAULT_IN_MEMORY_VALUES
    x = np.random.default_rng(3).normal(size=(n, 2))
    (tmp_path / "t").mkdir()
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1]}).to_parquet(tmp_path / "t" / "p.parquet")
    narrow = load_owner_data(str(tmp_path / "t"), label_column=None)
    assert narrow.partitioned
    assert narrow.points.n_points == n  # type: ignore[union-attr]
    pd.DataFrame({"a": x[:-1, 0], "b": x[:-1, 1]}).to_parquet(tmp_path / "t" / "p.parquet")
    assert not load_owner_data(str(tmp_path / "t"), label_column=None).partitioned


def test_a_small_dataset_keeps_the_in_memory_path_with_equal_data(
    tmp_path: Path, frames: list[pd.DataFrame]
) -> None:
    _write_dataset(tmp_path / "t", frames)
    path = tmp_path / "one.parquet"
    pd.concat(frames).to_parquet(path, index=False)
    file_points, file_table = load_file(path, SCHEMA)
    small = load_owner_data(str(tmp_path / "t"), schema=SCHEMA)
    assert not small.partitioned
    assert isinstance(small.points, PointSet) and isinstance(small.table, Table)
    assert np.array_equal(small.points.features, file_points.features)
    assert small.points.labels is not None and file_points.labels is not None
    assert np.array_equal(small.points.labels, file_points.labels)
    assert np.array_equal(small.table.values, file_table.values)
    large = load_owner_data(str(tmp_path / "t"), schema=SCHEMA, in_memory_values=1000)
    assert large.partitioned
    assert isinstance(large.points, PartitionedData)
    assert isinstance(large.table, PartitionedTable)
    assert large.points.n_points == 10_000 and large.points.n_features == 3
    assert large.table.binary == ("label",)
    assert large.engine is not None
    large.engine.close()
