"""The public schema: parsing, the fingerprint, the owner's table check, the comparison between
parties, drafts."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.schema import Column, Schema, SchemaMismatchError, disagreement, draft_schema

SCHEMA = """
name = "clinic"
label = "high"

[[columns]]
name = "age"
type = "integer"
low = 0
high = 120

[[columns]]
name = "sex"
type = "categorical"
levels = [1, 2]

[[columns]]
name = "bmi"
low = 10
high = 60
description = "kg/m2"

[[columns]]
name = "high"
type = "binary"
"""


def _schema(text: str = SCHEMA) -> Schema:
    return Schema.from_mapping(tomllib.loads(text), source="schema.toml")


def test_a_schema_reads_every_type_with_its_defaults() -> None:
    schema = _schema()
    assert schema.names == ("age", "sex", "bmi", "high")
    assert schema.feature_names == ("age", "sex", "bmi")
    assert schema.label == "high"
    assert schema.binary_columns == ("high",)
    assert schema.column("sex") == Column("sex", "categorical", 1.0, 2.0, (1.0, 2.0))
    assert schema.column("bmi").type == "continuous"
    assert schema.column("high").levels == (0.0, 1.0)
    assert schema.bounds() == [("age", 0.0, 120.0), ("sex", 1.0, 2.0), ("bmi", 10.0, 60.0)]


def test_the_toml_it_writes_reads_back_to_the_same_fingerprint() -> None:
    schema = _schema()
    again = Schema.from_mapping(tomllib.loads(schema.as_toml()))
    assert again == schema and again.fingerprint == schema.fingerprint


def test_the_fingerprint_covers_the_declaration_and_nothing_else() -> None:
    base = _schema().fingerprint
    assert _schema(SCHEMA.replace('name = "clinic"', 'name = "other"')).fingerprint == base
    assert _schema(SCHEMA.replace('"kg/m2"', '"units"')).fingerprint == base
    for change in (
        ("high = 60", "high = 61"),  # a bound
        ("levels = [1, 2]", "levels = [1, 2, 3]"),  # a level
        ('name = "bmi"', 'name = "BMI"'),  # a name
        ('type = "integer"', 'type = "continuous"'),  # a type
        ('label = "high"\n', ""),  # the label
    ):
        assert _schema(SCHEMA.replace(*change)).fingerprint != base, change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('type = "integer"', 'type = "date"'), "type must be one of"),
        (("low = 0\n", ""), "'age' needs low"),
        (("high = 60", "high = 5"), "low < high"),
        (("levels = [1, 2]", "levels = [2, 1]"), "strictly increasing"),
        (('type = "categorical"\nlevels = [1, 2]', 'type = "categorical"'), "needs levels"),
        (("high = 120", "high = 120.5"), "whole numbers"),
        (('label = "high"', 'label = "bmi"'), "'bmi' is continuous"),
        (('label = "high"', 'label = "weight"'), "'weight' is not a column"),
        (('name = "sex"', 'name = "age"'), "repeat"),
        (('description = "kg/m2"', 'unit = "kg/m2"'), "unknown key(s) ['unit']"),
    ],
)
def test_a_bad_schema_is_refused_naming_the_column(change: tuple[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"schema\.toml") as info:
        _schema(SCHEMA.replace(*change))
    assert message in str(info.value)


def test_a_binary_column_declares_nothing_but_0_and_1() -> None:
    with pytest.raises(InvalidArgumentError, match="binary column holds 0 and 1"):
        Column("y", "binary", 0.0, 2.0)


def _rows() -> np.ndarray:
    return np.array([[30, 1, 22.5, 0], [61, 2, 31.0, 1], [45, 2, 27.1, 1]], dtype=float)


def test_a_table_that_fits_the_schema_passes() -> None:
    _schema().check_table(["age", "sex", "bmi", "high"], _rows(), source="clinic.csv")


def test_the_table_check_names_a_missing_an_extra_and_a_moved_column() -> None:
    schema = _schema()
    with pytest.raises(SchemaMismatchError, match=r"clinic.csv lacks column\(s\) 'bmi'"):
        schema.check_table(["age", "sex", "high"], _rows()[:, [0, 1, 3]], source="clinic.csv")
    with pytest.raises(SchemaMismatchError, match=r"has column.*'Unnamed: 0'"):
        schema.check_table(
            ["Unnamed: 0", "age", "sex", "bmi", "high"],
            np.c_[np.arange(3), _rows()],
            source="clinic.csv",
        )
    with pytest.raises(SchemaMismatchError, match=r"column 2 is 'bmi' in clinic\.csv but 'sex'"):
        schema.check_table(["age", "bmi", "sex", "high"], _rows()[:, [0, 2, 1, 3]], "clinic.csv")


def test_the_table_check_lists_every_value_that_breaks_a_type_or_a_bound() -> None:
    rows = _rows()
    rows[1, 0] = 61.5  # a fraction in an integer column
    rows[2, 1] = 3  # not a level
    rows[0, 2] = 75  # above the bound
    rows[2, 3] = 2  # not 0/1
    with pytest.raises(SchemaMismatchError) as info:
        _schema().check_table(["age", "sex", "bmi", "high"], rows, source="clinic.csv")
    text = str(info.value)
    assert "'age' is integer but holds 1 fractional value(s), first 61.5 at row 1" in text
    assert "'sex' is categorical (1, 2) but holds 1 other value(s), first 3 at row 2" in text
    assert "'bmi' holds 1 value(s) outside its public bounds [10, 60], first 75 at row 0" in text
    assert "'high' is binary (0, 1) but holds 1 other value(s), first 2 at row 2" in text


def test_two_schemas_differ_by_the_first_column_named() -> None:
    mine = _schema()
    assert mine.difference(_schema(), mine="the consumer", theirs="owner a") is None
    wider = _schema(SCHEMA.replace("high = 60", "high = 70"))
    assert mine.difference(wider, mine="the consumer", theirs="owner a") == (
        "column 'bmi': the consumer declares bmi (continuous in [10, 60]), owner a bmi "
        "(continuous in [10, 70])"
    )
    text = mine.difference(None, mine="the consumer", theirs="owner a")
    assert text is not None and "owner a declares no schema" in text
    unlabeled = _schema(SCHEMA.replace('label = "high"\n', ""))
    text = mine.difference(unlabeled, mine="the consumer", theirs="owner a")
    assert text == "the label column: the consumer declares 'high', owner a None"


def test_the_parties_disagree_when_any_owner_differs_or_the_validation_columns_do() -> None:
    schema, other = _schema(), _schema(SCHEMA.replace("high = 120", "high = 110"))
    assert disagreement(schema, {"a": schema, "b": schema}) is None
    text = disagreement(schema, {"a": schema, "b": other})
    assert text is not None and "owner b" in text and "'age'" in text
    assert disagreement(None, {"a": None, "b": None}, feature_names=("x", "y")) is None
    names = schema.feature_names
    assert disagreement(None, {"a": schema, "b": schema}, feature_names=names) is None
    text = disagreement(None, {"a": schema, "b": schema}, feature_names=("age", "bmi", "sex"))
    assert text is not None and "column 2 is 'bmi' in the validation set but 'sex'" in text
    text = disagreement(None, {"a": schema, "b": None})
    assert text is not None and "owner b declares no schema" in text


def test_a_draft_guesses_types_and_reads_bounds_from_the_data_then_refuses_to_serve() -> None:
    rows = _rows()
    draft = draft_schema(["age", "sex", "bmi", "high"], rows, label="high", name="clinic")
    # age's three values skip the ages between them: integer, not levels; sex's 1, 2: codes.
    assert [c.type for c in draft.columns] == ["integer", "categorical", "continuous", "binary"]
    counts = np.c_[[0, 1, 2, 4, 7, 0], [3, 1, 2, 3, 1, 2]]
    drafted = draft_schema(["visits", "grade"], counts, label="visits")
    assert drafted.column("visits").type == "categorical"  # a label: its classes, as seen
    assert drafted.column("grade").levels == (1.0, 2.0, 3.0)
    assert draft_schema(["visits"], counts[:, :1]).column("visits").type == "integer"
    assert draft.column("bmi").low == 22.5 and draft.column("bmi").high == 31.0
    assert draft.draft
    again = Schema.from_mapping(tomllib.loads(draft.as_toml()))
    assert again.draft and again == draft
    with pytest.raises(InvalidArgumentError, match="is a draft"):
        again.check_confirmed("schema.toml")
    ages = np.c_[np.arange(20, 40), np.zeros(20)]
    ages[0, 1] = 0.5
    wide = draft_schema(["age", "x"], ages)
    assert wide.column("age").type == "integer" and wide.column("x").type == "continuous"
    with pytest.raises(InvalidArgumentError, match=r"'c' is constant.*declare its public bounds"):
        draft_schema(["c"], np.ones((3, 1)))
