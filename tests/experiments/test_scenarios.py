"""Tests of dpmarket.experiments.scenarios: the digits and flights splits and their files."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dpmarket.experiments.scenarios import (
    DIGITS_OWNER_GROUPS,
    FLIGHTS_CONSUMER_CARRIER,
    FLIGHTS_FEATURE_NAMES,
    FLIGHTS_SEED_CARRIER,
    SCENARIO_NAMES,
    SCENARIOS,
    Scenario,
    digits_scenario,
    flights50_scenario,
    flights_scenario,
    write_scenario,
)
from dpmarket.runtime.tables import PointSet, load_point_set, load_table

REPO = Path(__file__).resolve().parents[2]


def _rows(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in np.ascontiguousarray(x, dtype=np.float64)}


def _kernel_quantiles(x: np.ndarray, gamma: float, rng: np.random.Generator) -> np.ndarray:
    i = rng.integers(0, len(x), 5000)
    j = rng.integers(0, len(x), 5000)
    keep = i != j
    k = np.exp(-gamma * ((x[i[keep]] - x[j[keep]]) ** 2).sum(axis=1))
    return np.quantile(k, [0.05, 0.5, 0.95])


# ---- digits --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> Scenario:
    return digits_scenario(seed=0)


@pytest.fixture(scope="module")
def digit_label_of_row() -> dict[bytes, int]:
    pixels, target = load_digits(return_X_y=True)
    return {row.tobytes(): int(t) for row, t in zip(pixels / 16.0, target, strict=True)}


def test_digits_owners_hold_label_groups(digits: Scenario) -> None:
    assert len(digits.owners) == 5
    assert [o.name for o in digits.owners] == [
        "owner-0-1",
        "owner-3-4",
        "owner-5-6",
        "owner-7-8",
        "owner-9-2",
    ]
    for owner, group in zip(digits.owners, DIGITS_OWNER_GROUPS, strict=True):
        assert owner.labels is not None
        assert set(np.unique(owner.labels)) == set(group)
        assert owner.n_features == 64
        assert owner.features.min() >= 0.0 and owner.features.max() <= 1.0


def test_digits_consumer_pool_is_threes_and_fours(
    digits: Scenario, digit_label_of_row: dict[bytes, int]
) -> None:
    assert digits.test.labels is not None
    val_labels = np.array([digit_label_of_row[r.tobytes()] for r in digits.validation])
    pool_labels = np.concatenate([val_labels, digits.test.labels])
    assert set(np.unique(pool_labels)) == {3, 4}
    for labels in (pool_labels, val_labels, digits.test.labels):
        assert abs(np.mean(labels == 3) - 0.7) <= 0.05
    pool_size = len(pool_labels)
    assert abs(len(digits.validation) / pool_size - 0.25) <= 0.01
    # The pool takes about 70% of the threes; the [3, 4] owner keeps the other threes and fours.
    owner_34 = digits.owners[1]
    assert owner_34.labels is not None
    n3_total = np.sum(pool_labels == 3) + np.sum(owner_34.labels == 3)
    assert abs(np.sum(pool_labels == 3) / n3_total - 0.7) <= 0.02
    assert np.sum(owner_34.labels == 4) > 0


def test_digits_no_leak_between_owners_and_consumer(
    digits: Scenario, digit_label_of_row: dict[bytes, int]
) -> None:
    owner_rows = set().union(*(_rows(o.features) for o in digits.owners))
    val, test, seed = _rows(digits.validation), _rows(digits.test.features), _rows(digits.seed_set)
    assert not owner_rows & val
    assert not owner_rows & test
    assert not owner_rows & seed
    assert not val & test and not seed & val and not seed & test
    # Everything together is exactly the digits dataset (no point lost or duplicated).
    total = sum(o.n_points for o in digits.owners) + len(val) + len(test) + len(seed)
    assert total == len(digit_label_of_row) == len(owner_rows | val | test | seed)


def test_digits_seed_set_spans_labels(
    digits: Scenario, digit_label_of_row: dict[bytes, int]
) -> None:
    assert digits.seed_set.shape == (30, 64)
    seed_labels = {digit_label_of_row[r.tobytes()] for r in digits.seed_set}
    assert len(seed_labels) >= 5


def test_digits_settings_and_kernel(digits: Scenario) -> None:
    assert digits.gamma == 0.1
    assert digits.default_p == 50
    allx = np.vstack([o.features for o in digits.owners])
    q05, median, q95 = _kernel_quantiles(allx, digits.gamma, np.random.default_rng(0))
    assert 0.05 <= median <= 0.5
    assert q05 > 0.01 and q95 < 0.95


def test_digits_deterministic_by_seed(digits: Scenario) -> None:
    again = digits_scenario(seed=0)
    np.testing.assert_array_equal(again.validation, digits.validation)
    np.testing.assert_array_equal(again.seed_set, digits.seed_set)
    np.testing.assert_array_equal(again.test.features, digits.test.features)
    for a, b in zip(again.owners, digits.owners, strict=True):
        np.testing.assert_array_equal(a.features, b.features)
    other = digits_scenario(seed=1)
    assert _rows(other.validation) != _rows(digits.validation)


# ---- flights -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flights() -> Scenario:
    return flights_scenario(seed=0)


def test_flights_owners_are_distinct_carriers(flights: Scenario) -> None:
    names = [o.name for o in flights.owners]
    assert len(flights.owners) == 8
    assert len(set(names)) == 8
    carriers = {n.removeprefix("owner-") for n in names}
    assert FLIGHTS_CONSUMER_CARRIER not in carriers
    assert FLIGHTS_SEED_CARRIER not in carriers
    sizes = [o.n_points for o in flights.owners]
    assert sizes == sorted(sizes, reverse=True)


def test_flights_consumer_sets(flights: Scenario) -> None:
    m = flights.validation.shape[0]
    assert m >= 2000
    assert flights.validation.shape[1] == len(FLIGHTS_FEATURE_NAMES) == flights.n_features
    assert abs(m / (m + flights.test.n_points) - 0.25) <= 0.01
    assert flights.test.labels is not None
    assert set(np.unique(flights.test.labels)) == {0, 1}
    # Covariate shift: all consumer flights leave JFK in December-February.
    jfk = FLIGHTS_FEATURE_NAMES.index("origin_JFK")
    month_cos = FLIGHTS_FEATURE_NAMES.index("month_cos")
    for x in (flights.validation, flights.test.features):
        assert np.all(x[:, jfk] == 1.0)
        assert np.all(x[:, month_cos] > 0.8)
    assert flights.seed_set.shape == (30, flights.n_features)


def test_flights_features_bounded(flights: Scenario) -> None:
    allx = np.vstack([o.features for o in flights.owners] + [flights.validation])
    assert np.isfinite(allx).all()
    assert np.abs(allx).max() <= 5.0
    assert np.mean(np.abs(allx) <= 1.0) > 0.95
    for owner in flights.owners:
        assert owner.labels is not None
        assert set(np.unique(owner.labels)) == {0, 1}


def test_flights_kernel_informative(flights: Scenario) -> None:
    assert flights.gamma == 0.1 and flights.default_p == 200
    allx = np.vstack([o.features for o in flights.owners])
    q05, median, q95 = _kernel_quantiles(allx, flights.gamma, np.random.default_rng(0))
    assert 0.05 <= median <= 0.5
    assert q05 > 0.01 and q95 < 0.95


def test_flights_options_and_determinism(flights: Scenario) -> None:
    small = flights_scenario(seed=0, n_owners=3, max_points_per_owner=500)
    assert [o.name for o in small.owners] == [o.name for o in flights.owners[:3]]
    assert all(o.n_points == 500 for o in small.owners)
    np.testing.assert_array_equal(small.validation, flights.validation)
    big_rows = _rows(flights.owners[0].features)
    assert _rows(small.owners[0].features) <= big_rows


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_owners": 0}, "n_owners"),
        ({"n_owners": 15}, "at most 14"),
        ({"max_points_per_owner": 0}, "max_points_per_owner"),
    ],
)
def test_flights_bad_arguments(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        flights_scenario(**kwargs)


# ---- Scenario validation, registry and files ----------------------------------------------


def test_scenario_rejects_bad_fields(digits: Scenario) -> None:
    base = {
        "name": "x",
        "description": "",
        "owners": digits.owners,
        "validation": digits.validation,
        "test": digits.test,
        "seed_set": digits.seed_set,
        "gamma": 0.1,
        "default_p": 5,
    }
    with pytest.raises(ValueError, match="gamma must be a finite number > 0, got -1"):
        Scenario(**{**base, "gamma": -1.0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="default_p"):
        Scenario(**{**base, "default_p": 0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one owner"):
        Scenario(**{**base, "owners": ()})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="validation must have 64 features"):
        Scenario(**{**base, "validation": np.ones((2, 3))})  # type: ignore[arg-type]
    unlabeled = PointSet(digits.test.features, None, "test")
    with pytest.raises(ValueError, match="must be labeled"):
        Scenario(**{**base, "test": unlabeled})  # type: ignore[arg-type]


def test_registry() -> None:
    assert set(SCENARIOS) == {"digits", "flights", "flights50"} == set(SCENARIO_NAMES)
    assert SCENARIOS["digits"] is digits_scenario
    assert SCENARIOS["flights"] is flights_scenario
    assert SCENARIOS["flights50"] is flights50_scenario


def test_flights50_has_fifty_airline_month_owners_inside_the_public_domain() -> None:
    small = flights50_scenario(seed=0, max_points_per_owner=50)
    assert len(small.owners) == 50
    assert len({o.name for o in small.owners}) == 50
    assert all(o.name.startswith("owner-") and o.n_points == 50 for o in small.owners)
    # Same consumer and seed set as the one-owner-per-airline split.
    flights = flights_scenario(seed=0, n_owners=1, max_points_per_owner=50)
    assert np.array_equal(small.validation, flights.validation)
    for owner in small.owners:
        small.domain.check(owner.features, owner.name)  # public box: nothing outside
    with pytest.raises(ValueError, match="n_owners"):
        flights50_scenario(n_owners=1000)


def _check_written(scenario: Scenario, directory: Path) -> None:
    paths = write_scenario(scenario, directory)
    k = len(scenario.owners)
    tables = {f"owner-{i}-table" for i in range(k)} if scenario.owner_tables else set()
    assert set(paths) == {f"owner-{i}" for i in range(k)} | tables | {
        "validation",
        "seed_set",
        "test",
        "scenario",
    }
    for i, owner in enumerate(scenario.owners):
        assert paths[f"owner-{i}"].name == f"owner-{i}.parquet"
        loaded = load_point_set(paths[f"owner-{i}"])
        np.testing.assert_array_equal(loaded.features, owner.features)
        assert loaded.labels is not None and owner.labels is not None
        np.testing.assert_array_equal(loaded.labels, owner.labels)
    validation = load_point_set(paths["validation"])
    np.testing.assert_array_equal(validation.features, scenario.validation)
    assert validation.labels is None
    np.testing.assert_array_equal(load_point_set(paths["seed_set"]).features, scenario.seed_set)
    test = load_point_set(paths["test"])
    np.testing.assert_array_equal(test.features, scenario.test.features)
    assert test.labels is not None and scenario.test.labels is not None
    np.testing.assert_array_equal(test.labels, scenario.test.labels)
    meta = json.loads(paths["scenario"].read_text())
    assert meta["name"] == scenario.name
    assert meta["gamma"] == scenario.gamma
    assert meta["default_p"] == scenario.default_p
    assert meta["n_features"] == scenario.n_features
    assert [o["name"] for o in meta["owners"]] == [o.name for o in scenario.owners]
    assert [o["n_points"] for o in meta["owners"]] == [o.n_points for o in scenario.owners]
    for i, table in enumerate(scenario.owner_tables):
        path = paths[f"owner-{i}-table"]
        assert path.name == f"owner-{i}-table.parquet" == meta["owners"][i]["table"]
        loaded_table = load_table(path)
        assert loaded_table.columns == tuple(table.columns)
        np.testing.assert_array_equal(loaded_table.values, table.to_numpy(np.float64))
    assert meta["validation"] == {"file": "validation.npy", "n_points": len(scenario.validation)}
    assert meta["test"]["n_points"] == scenario.test.n_points
    assert meta["seed_set"]["file"] == "seed_set.npy"


def test_write_scenario_digits_round_trip(digits: Scenario, tmp_path: Path) -> None:
    _check_written(digits, tmp_path / "nested" / "digits")


def test_write_scenario_flights_round_trip(tmp_path: Path) -> None:
    small = flights_scenario(seed=3, n_owners=4, max_points_per_owner=300)
    _check_written(small, tmp_path / "flights")


def test_flights_owner_tables_hold_the_owners_flights_in_the_sketch_specs_columns() -> None:
    """Row for row the owner's points: the same month (on the unit circle) and distance (in
    thousands of miles); the columns and bounds of deploy/sketches/flights.toml."""
    small = flights_scenario(seed=1, n_owners=3, max_points_per_owner=400)
    spec = tomllib.loads((REPO / "deploy" / "sketches" / "flights.toml").read_text())
    bounds = {c["name"]: (c["low"], c["high"]) for c in spec["columns"]}
    assert len(small.owner_tables) == 3
    month_cos = FLIGHTS_FEATURE_NAMES.index("month_cos")
    distance = FLIGHTS_FEATURE_NAMES.index("distance_kmiles")
    for owner, table in zip(small.owners, small.owner_tables, strict=True):
        assert list(table.columns) == list(bounds)
        for column, (low, high) in bounds.items():
            assert table[column].between(low, high).all(), column
        np.testing.assert_allclose(
            owner.features[:, month_cos], np.cos(2 * np.pi * (table["month"] - 1) / 12)
        )
        np.testing.assert_allclose(owner.features[:, distance] * 1000, table["distance"])
        assert owner.labels is not None
        np.testing.assert_array_equal(owner.labels, table["delayed"].to_numpy())
    assert digits_scenario(0).owner_tables == ()
    with pytest.raises(ValueError, match="rows"):
        replace(small, owner_tables=(small.owner_tables[0].iloc[:10], *small.owner_tables[1:]))
