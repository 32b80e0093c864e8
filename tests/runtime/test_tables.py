"""Tests of dpmarket.runtime.tables: PointSet validation and the file formats."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpmarket.common.schema import Schema
from dpmarket.runtime.schemas import load_schema
from dpmarket.runtime.tables import (
    SUPPORTED_SUFFIXES,
    PointSet,
    Table,
    load_point_set,
    load_points_and_table,
    load_table,
    save_point_set,
)


@pytest.fixture
def labeled() -> PointSet:
    rng = np.random.default_rng(0)
    return PointSet(features=rng.normal(size=(7, 3)) * 1e3, labels=rng.integers(0, 4, 7), name="x")


@pytest.fixture
def unlabeled() -> PointSet:
    rng = np.random.default_rng(1)
    return PointSet(features=rng.random((5, 2)), labels=None, name="y")


# ---- PointSet ------------------------------------------------------------------------------


def test_point_set_converts_dtypes() -> None:
    ps = PointSet(features=[[1, 2], [3, 4]], labels=[0.0, 1.0], name="p")  # type: ignore[arg-type]
    assert ps.features.dtype == np.float64
    assert ps.labels is not None and ps.labels.dtype == np.int64
    assert ps.n_points == 2 and ps.n_features == 2 and len(ps) == 2


@pytest.mark.parametrize(
    ("features", "labels", "match"),
    [
        (np.zeros((0, 3)), None, "empty"),
        (np.zeros(3), None, "2-D"),
        (np.array([[1.0, np.nan]]), None, "row 0, column 1"),
        (np.array([[1.0, np.inf]]), None, "NaN or inf"),
        (np.zeros((3, 2)), np.zeros(2, dtype=int), "one entry per point"),
        (np.zeros((2, 2)), np.zeros((2, 1), dtype=int), "1-D"),
        (np.zeros((2, 2)), np.array([0.5, 1.0]), "must be integers, got 0.5"),
        (np.zeros((2, 2)), np.array(["a", "b"]), "must be integers"),
    ],
)
def test_point_set_rejects_bad_input(
    features: np.ndarray, labels: np.ndarray | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        PointSet(features=features, labels=labels, name="bad")


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", SUPPORTED_SUFFIXES)
def test_round_trip_labeled(tmp_path: Path, labeled: PointSet, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    save_point_set(labeled, path)
    loaded = load_point_set(path)
    np.testing.assert_array_equal(loaded.features, labeled.features)
    assert loaded.labels is not None and labeled.labels is not None
    np.testing.assert_array_equal(loaded.labels, labeled.labels)
    assert loaded.labels.dtype == np.int64
    assert loaded.name == "data"


@pytest.mark.parametrize("suffix", SUPPORTED_SUFFIXES)
def test_round_trip_unlabeled(tmp_path: Path, unlabeled: PointSet, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    save_point_set(unlabeled, path)
    loaded = load_point_set(path, name="custom")
    np.testing.assert_array_equal(loaded.features, unlabeled.features)
    assert loaded.labels is None
    assert loaded.name == "custom"


def test_table_columns(tmp_path: Path, labeled: PointSet) -> None:
    save_point_set(labeled, tmp_path / "a.parquet")
    frame = pd.read_parquet(tmp_path / "a.parquet")
    assert list(frame.columns) == ["f0", "f1", "f2", "label"]


def test_npy_labels_sibling(tmp_path: Path, labeled: PointSet, unlabeled: PointSet) -> None:
    path = tmp_path / "d.npy"
    save_point_set(labeled, path)
    assert (tmp_path / "d.labels.npy").exists()
    # Saving an unlabeled set to the same path removes the stale labels file.
    save_point_set(unlabeled, path)
    assert not (tmp_path / "d.labels.npy").exists()
    assert load_point_set(path).labels is None


def test_npy_without_sibling_is_unlabeled(tmp_path: Path) -> None:
    np.save(tmp_path / "raw.npy", np.ones((3, 2)))
    assert load_point_set(tmp_path / "raw.npy").labels is None


def test_custom_label_column_and_none(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": [1.0, 2.0], "b": [3, 4], "y": [1, 0]}).to_csv(path, index=False)
    ps = load_point_set(path, label_column="y")
    np.testing.assert_array_equal(ps.features, [[1.0, 3.0], [2.0, 4.0]])
    assert ps.labels is not None
    np.testing.assert_array_equal(ps.labels, [1, 0])
    # Default label column "label" is absent: every column is a feature.
    assert load_point_set(path).features.shape == (2, 3)
    assert load_point_set(path).labels is None
    # label_column=None: a column named "label" stays a feature.
    path2 = tmp_path / "u.csv"
    pd.DataFrame({"a": [1.0], "label": [1]}).to_csv(path2, index=False)
    assert load_point_set(path2, label_column=None).features.shape == (1, 2)


def test_uppercase_suffix(tmp_path: Path, labeled: PointSet) -> None:
    path = tmp_path / "D.NPZ"
    save_point_set(labeled, path)
    np.testing.assert_array_equal(load_point_set(path).features, labeled.features)


# ---- errors --------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        load_point_set(path)


def test_bad_suffix(tmp_path: Path, labeled: PointSet) -> None:
    path = tmp_path / "data.txt"
    path.write_text("1,2\n")
    with pytest.raises(ValueError, match=r"\.npy, \.npz, \.csv, \.parquet"):
        load_point_set(path)
    with pytest.raises(ValueError, match=r"'\.txt'"):
        save_point_set(labeled, path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_non_numeric_column(tmp_path: Path, suffix: str) -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0], "city": ["x", "y"], "label": [0, 1]})
    path = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    with pytest.raises(ValueError, match="column 'city'"):
        load_point_set(path)


def test_non_numeric_label_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": [1.0, 2.0], "label": ["cat", "dog"]}).to_csv(path, index=False)
    with pytest.raises(
        ValueError, match=r"column 'label' of .* is not numeric: it holds 'cat' at row 0"
    ):
        load_point_set(path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_nan_in_table(tmp_path: Path, suffix: str) -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, np.nan]})
    path = tmp_path / f"t{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    with pytest.raises(ValueError, match=r"row 2, column 'b'"):
        load_point_set(path)


def test_nan_in_label_column(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "label": [1.0, np.nan]}).to_parquet(path)
    with pytest.raises(ValueError, match="row 1"):
        load_point_set(path)


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_nan_in_arrays(tmp_path: Path, suffix: str) -> None:
    features = np.ones((3, 2))
    features[1, 0] = np.inf
    path = tmp_path / f"t{suffix}"
    if suffix == ".npy":
        np.save(path, features)
    else:
        np.savez(path, features=features)
    with pytest.raises(ValueError, match="row 1, column 0"):
        load_point_set(path)


@pytest.mark.parametrize("suffix", SUPPORTED_SUFFIXES)
def test_zero_byte_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_point_set(path)


def test_header_only_csv(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("f0,f1,label\n")
    with pytest.raises(ValueError, match="empty"):
        load_point_set(path)


def test_empty_npy_array(tmp_path: Path) -> None:
    path = tmp_path / "e.npy"
    np.save(path, np.zeros((0, 4)))
    with pytest.raises(ValueError, match="empty"):
        load_point_set(path)


def test_one_dimensional_npy(tmp_path: Path) -> None:
    path = tmp_path / "v.npy"
    np.save(path, np.arange(5.0))
    with pytest.raises(ValueError, match=r"2-D.*\(5,\)"):
        load_point_set(path)


def test_npz_without_features(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    np.savez(path, x=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"'features'.*\['x'\]"):
        load_point_set(path)


def test_npy_labels_length_mismatch(tmp_path: Path) -> None:
    np.save(tmp_path / "m.npy", np.ones((3, 2)))
    np.save(tmp_path / "m.labels.npy", np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="one entry per point"):
        load_point_set(tmp_path / "m.npy")


def test_corrupt_npy(tmp_path: Path) -> None:
    path = tmp_path / "c.npy"
    path.write_bytes(b"not a numpy file at all")
    with pytest.raises(ValueError, match=r"c\.npy"):
        load_point_set(path)


def test_declared_0_1_columns_are_checked_when_the_table_is_loaded(tmp_path: Path) -> None:
    """The owner's start-up check, on its own console: it names the row and the value."""
    path = tmp_path / "owner.parquet"
    pd.DataFrame(
        {"x": [1.5, 2.5, 3.5], "spam": [0.0, 1.0, 1.0], "sex": [1.0, 2.0, 1.0]}
    ).to_parquet(path)
    table = load_table(path, binary=["spam"])
    assert table.binary == ("spam",)
    with pytest.raises(ValueError, match=r"column 'sex' .* declared 0/1 but holds 2\.0 at row 1"):
        load_table(path, binary=["spam", "sex"])
    with pytest.raises(ValueError, match=r"no column\(s\) \['label'\] to declare 0/1"):
        load_table(path, binary=["label"])
    with pytest.raises(ValueError, match=r"NaN or inf value\(s\), first at row 1, column 'x'"):
        Table(("x",), np.array([[1.0], [np.nan]]), "t")


# ---- what a newcomer's own files get wrong ---------------------------------------------------


def _clinic() -> pd.DataFrame:
    return pd.DataFrame({"age": [30, 61, 45], "bmi": [22.5, 31.0, 27.1], "high": [0, 1, 1]})


SCHEMA_TOML = """
label = "high"

[[columns]]
name = "age"
type = "integer"
low = 0
high = 120

[[columns]]
name = "bmi"
low = 10
high = 60

[[columns]]
name = "high"
type = "binary"
"""


@pytest.fixture
def schema(tmp_path: Path) -> Schema:
    path = tmp_path / "schema.toml"
    path.write_text(SCHEMA_TOML, encoding="utf-8")
    return load_schema(path)


def test_a_csv_written_with_pandas_defaults_is_refused_naming_its_index_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "clinic.csv"
    _clinic().to_csv(path)  # index=True: the row index becomes an unnamed first column
    for load in (load_point_set, load_table):
        with pytest.raises(
            ValueError, match=r"column 1 of .*clinic\.csv' has no name and holds 0, 1"
        ):
            load(path)
    assert "index=False" in _error(lambda: load_table(path))


def test_an_unnamed_column_that_is_no_index_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,,c\n1,5,2\n3,7,4\n", encoding="utf-8")
    assert "column 2 of" in _error(lambda: load_table(path))
    assert "name it in the header line" in _error(lambda: load_table(path))


def test_a_csv_without_a_header_is_refused_rather_than_losing_its_first_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "clinic.csv"
    _clinic().to_csv(path, index=False, header=False)
    for load in (load_point_set, load_table):
        with pytest.raises(ValueError, match=r"has no header line: its first line \(30, 22.5, 0\)"):
            load(path)


def test_a_text_column_is_refused_naming_its_first_text_value(tmp_path: Path) -> None:
    path = tmp_path / "clinic.csv"
    frame = _clinic()
    frame["sex"] = ["1", "F", "2"]
    frame.to_csv(path, index=False)
    message = _error(lambda: load_table(path))
    assert "column 'sex'" in message and "'F' at row 1" in message


def test_a_repeated_column_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,a\n1,2,3\n", encoding="utf-8")
    assert "repeats column name(s) ['a']" in _error(lambda: load_table(path))


def _error(call: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


def test_an_owner_table_is_read_through_its_schema(tmp_path: Path, schema: Schema) -> None:
    path = tmp_path / "clinic.parquet"
    _clinic().to_parquet(path, index=False)
    points, table = load_points_and_table(path, schema)
    assert points.columns == ("age", "bmi") and points.features.shape == (3, 2)
    assert points.labels is not None and points.labels.tolist() == [0, 1, 1]
    assert table.columns == ("age", "bmi", "high") and table.binary == ("high",)
    assert table.schema is schema


def test_an_owner_table_in_another_order_or_outside_its_bounds_is_refused(
    tmp_path: Path, schema: Schema
) -> None:
    path = tmp_path / "clinic.csv"
    _clinic()[["bmi", "age", "high"]].to_csv(path, index=False)
    assert "column 1 is 'bmi'" in _error(lambda: load_point_set(path, schema=schema))
    frame = _clinic()
    frame.loc[2, "age"] = 130
    frame.to_csv(path, index=False)
    message = _error(lambda: load_table(path, schema=schema))
    assert (
        "'age' holds 1 value(s) outside its public bounds [0, 120], first 130 at row 2" in message
    )


def test_a_consumer_table_in_another_order_is_reordered_by_name(
    tmp_path: Path, schema: Schema
) -> None:
    path = tmp_path / "validation.csv"
    _clinic()[["bmi", "age"]].to_csv(path, index=False)  # no label, columns swapped
    points = load_point_set(path, schema=schema, by_name=True)
    assert points.columns == ("age", "bmi")
    np.testing.assert_array_equal(points.features, _clinic()[["age", "bmi"]].to_numpy(float))
    assert points.labels is None
    frame = _clinic()
    frame["weight"] = 70.0
    frame.to_csv(path, index=False)
    message = _error(lambda: load_point_set(path, schema=schema, by_name=True))
    assert "has column(s) ['weight'] the schema does not declare" in message
    _clinic()[["age"]].to_csv(path, index=False)
    assert "lacks the schema's column(s) ['bmi']" in _error(
        lambda: load_point_set(path, schema=schema, by_name=True)
    )


def test_a_binary_column_flag_must_agree_with_the_schema(tmp_path: Path, schema: Schema) -> None:
    path = tmp_path / "clinic.csv"
    _clinic().to_csv(path, index=False)
    assert "does not declare it binary" in _error(
        lambda: load_table(path, schema=schema, binary=("age",))
    )
    assert load_table(path, schema=schema, binary=("high",)).binary == ("high",)


def test_a_summary_table_names_its_columns_and_each_point_owner(tmp_path: Path) -> None:
    summary = PointSet(
        np.array([[30.0, 22.5], [61.0, 31.0]]), np.array([0, 1]), "s", columns=("age", "bmi")
    )
    path = tmp_path / "summary.csv"
    save_point_set(summary, path, owners=["clinic-a", "clinic-b"], label_column="high")
    frame = pd.read_csv(path)
    assert list(frame.columns) == ["age", "bmi", "high", "owner"]
    assert frame["owner"].tolist() == ["clinic-a", "clinic-b"]
    with pytest.raises(ValueError, match="must name each of the 2 points"):
        save_point_set(summary, path, owners=["clinic-a"])


def test_a_table_written_with_its_schema_keeps_schema_order_and_whole_numbers(
    tmp_path: Path,
) -> None:
    """The summary a consumer downloads reads like the owners' tables: the label where the
    schema puts it (not moved to the end), integer and binary columns without ``.0``; a
    continuous column stays float. Control: without the schema, the label goes last, as floats."""
    from dpmarket.common.schema import Column

    schema = Schema(
        (
            Column("age", "integer", 0, 120),
            Column("smoker", "binary", 0, 1),
            Column("bmi", "continuous", 10, 60),
            Column("visits", "integer", 0, 50),
        ),
        label="smoker",
    )
    features = np.array([[41.0, 22.5, 3.0], [7.0, 31.25, 0.0]])
    points = PointSet(features, np.array([1, 0]), "s", columns=("age", "bmi", "visits"))
    path = tmp_path / "summary.csv"
    save_point_set(points, path, owners=["a", "b"], label_column="smoker", schema=schema)
    assert path.read_text().splitlines() == [
        "age,smoker,bmi,visits,owner",
        "41,1,22.5,3,a",
        "7,0,31.25,0,b",
    ]
    save_point_set(points, path, owners=["a", "b"], label_column="smoker")
    assert path.read_text().splitlines()[:2] == ["age,bmi,visits,smoker,owner", "41.0,22.5,3.0,1,a"]
