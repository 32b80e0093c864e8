"""The scenario suite: built offline and deterministically, spanning K, m, d and seed sets, with a
cached exact-greedy reference; the leave-one-scenario-out selection on known scores."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.common.summarization.kernels import exact_kernel_greedy
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.experiments.suite import (
    FIRST_SUITE,
    SKETCH_SCALE,
    SUITE,
    SUITE_NAMES,
    build_suite,
    exact_greedy_reference,
    scenario_digest,
    suite_scenario,
)
from dpmarket.experiments.suite_eval import (
    SuiteSetting,
    _config_key,
    leave_one_scenario_out,
    session_code_version,
    source_digest,
    uniform_reads,
)
from dpmarket.experiments.suite_split import load_split
from dpmarket.experiments.suite_tables import FAMILIES

#: Scenarios whose table holds many distinct records with equal values: Portal's traps catch
#: several pocket mice of the same weight and hindfoot length on one night, one per plot.
_REPEATED_RECORDS = {"surveys-24": 0.5, "surveys-12": 0.25}


@pytest.fixture(scope="module")
def suite() -> list[Any]:
    return build_suite()


def test_the_suite_spans_the_issues_ranges(suite: list[Any]) -> None:
    assert len(suite) >= 30
    ks = [len(s.owners) for s in suite]
    ms = [s.validation.shape[0] for s in suite]
    ds = [s.n_features for s in suite]
    assert min(ks) == 3 and max(ks) == 50
    assert min(ms) == 20 and max(ms) == 2000
    assert min(ds) == 2 and max(ds) == 64
    with_seed = [s.name for s in suite if s.seed_set.shape[0] > 0]
    assert 0 < len(with_seed) < len(suite)
    # None of the scenarios the defaults were first tuned on.
    assert not {"digits", "flights", "flights50"} & set(SUITE_NAMES)


def test_every_family_has_the_pattern_issue_27_names(suite: list[Any]) -> None:
    by_name = {s.name: s for s in suite}
    families: dict[str, list[Any]] = {}
    for entry in SUITE:
        families.setdefault(entry.family, []).append(by_name[entry.name])
    assert set(families) == set(FAMILIES)
    assert [e.name for e in SUITE[:11]] == [e.name for e in FIRST_SUITE]
    assert all(e.family == "first" for e in FIRST_SUITE)
    for family, members in families.items():
        assert len(members) >= 4, family
        ks = [len(s.owners) for s in members]
        ms = [s.validation.shape[0] for s in members]
        if family == "rare-category":
            assert max(ks) <= 6
        elif family == "spread-thin":
            assert min(ks) >= 8 and max(ks) <= 50
        elif family == "small-m":
            assert min(ks) >= 8 and min(ms) >= 20 and max(ms) <= 100
        elif family == "one-owner":
            assert set(ks) == {3}


def test_every_scenario_builds_deterministically(suite: list[Any]) -> None:
    again = build_suite()
    for a, b in zip(suite, again, strict=True):
        assert scenario_digest(a, a.default_p) == scenario_digest(b, b.default_p)
        np.testing.assert_array_equal(a.test.features, b.test.features)
        np.testing.assert_array_equal(a.test.labels, b.test.labels)
        assert [o.name for o in a.owners] == [o.name for o in b.owners]


def test_every_scenario_is_a_covariate_shift_with_labels_and_a_public_domain(
    suite: list[Any],
) -> None:
    for s in suite:
        pool = np.concatenate([o.features for o in s.owners])
        # Every set lies in the declared sketch domain, and the consumer's sets are held out.
        for x in (pool, s.validation, s.test.features):
            assert (x >= s.domain_low - 1e-12).all() and (x <= s.domain_high + 1e-12).all()
        # (Tables of counts hold distinct records with equal values, so a few rows may repeat.)
        rows = {r.tobytes() for r in pool}
        shared = np.mean([v.tobytes() in rows for v in s.validation])
        assert shared < _REPEATED_RECORDS.get(s.name, 0.2), (s.name, shared)
        assert s.test.labels is not None and all(o.labels is not None for o in s.owners)
        assert np.unique(s.test.labels).size >= 2, s.name
        assert s.sketch_sigma == pytest.approx(SKETCH_SCALE / math.sqrt(2 * s.gamma))
        # gamma puts typical kernel values in the informative range (median about e^-1).
        assert 1e-3 < s.gamma < 10


def test_the_patterns_the_issue_names_are_present() -> None:
    weather = suite_scenario("weather-8")
    ewr, lga = weather.owners[0], weather.owners[1]  # EWR and LGA in winter
    assert ewr.name.startswith("owner-EWR") and lga.name.startswith("owner-LGA")
    # Near-identical owners: two airports' weather in the same season are closer to each other
    # in mean than to any other season's.
    means = np.stack([o.features.mean(axis=0) for o in weather.owners])
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1)
    assert gaps[0, 1] < np.sort(gaps[0])[2]
    spam = suite_scenario("spam-3")
    assert [o.n_points for o in spam.owners] == [210, 1500, 1500]


@pytest.mark.slow
def test_every_scenario_has_its_exact_greedy_reference_cached(
    suite: list[Any], tmp_path: Path
) -> None:
    for s in suite:
        first = exact_greedy_reference(s, s.default_p, tmp_path)
        assert first.shape == (s.default_p,) and np.unique(first).size == s.default_p
        cached = tmp_path / f"exact-{scenario_digest(s, s.default_p)}.npy"
        assert cached.exists()
        np.testing.assert_array_equal(np.load(cached), first)


def test_the_reference_is_exact_greedy_and_reread_from_its_cache(tmp_path: Path) -> None:
    s = suite_scenario("cancer-4")
    pool = np.concatenate([o.features for o in s.owners])
    chosen = exact_greedy_reference(s, 10, tmp_path)
    # The summary's own MMD² is the objective: the public seed set is not counted.
    assert s.seed_set.shape[0] > 0
    expected = exact_kernel_greedy(pool, s.validation, s.seed_set[:0], 10, s.gamma)
    np.testing.assert_array_equal(chosen, expected)
    seeded = exact_kernel_greedy(pool, s.validation, s.seed_set, 10, s.gamma)
    assert not np.array_equal(chosen, seeded)
    # A planted cache entry is what the next call returns: the cache is keyed by the inputs.
    path = tmp_path / f"exact-{scenario_digest(s, 10)}.npy"
    np.save(path, expected[::-1])
    np.testing.assert_array_equal(exact_greedy_reference(s, 10, tmp_path), expected[::-1])
    assert scenario_digest(s, 10) != scenario_digest(s, 11)


def test_uniform_reads_take_an_even_share_of_every_owner() -> None:
    s = suite_scenario("quakes-5")
    reads = uniform_reads(s, 60, seed=3)
    assert reads.size == 60 and np.unique(reads).size == 60
    offsets = np.cumsum([0] + [o.n_points for o in s.owners])
    per_owner = np.histogram(reads, bins=offsets)[0]
    assert (per_owner == 12).all()
    np.testing.assert_array_equal(reads, uniform_reads(s, 60, seed=3))


def test_leave_one_scenario_out_holds_each_scenario_out_and_minimises_the_worst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dpmarket.experiments.suite_eval as se

    a, b, c = (SuiteSetting({"candidate_even_share": e}) for e in (0.1, 0.2, 0.3))
    ratios = {
        a.label: {"s1": 1.0, "s2": 1.0, "s3": 9.0},  # best on average, fails s3
        b.label: {"s1": 2.0, "s2": 2.0, "s3": 2.0},  # holds everywhere
        c.label: {"s1": 1.0, "s2": 8.0, "s3": 1.0},
    }

    def summary(runner: Any, setting: SuiteSetting, name: str, seeds: Any) -> dict[str, Any]:
        return {"scenario": name, "over_exact": ratios[setting.label][name], "seeds": seeds}

    monkeypatch.setattr(se, "scenario_summary", summary)
    # Constants are chosen on the design half of the split only.
    s1, s2, s3 = load_split().design[:3]
    ratios = {k: dict(zip((s1, s2, s3), r.values(), strict=True)) for k, r in ratios.items()}
    out = leave_one_scenario_out(None, [a, b, c], [s1, s2, s3], [0])  # type: ignore[arg-type]
    assert out["chosen_on_all"] == b.label
    held = {r["scenario"]: (r["setting"], r["over_exact"]) for r in out["held_out"]}
    # Each held-out scenario gets the setting whose worst ratio on the other two is smallest.
    assert held == {s1: (b.label, 2.0), s2: (c.label, 8.0), s3: (a.label, 9.0)}


def test_every_suite_entry_names_its_pattern() -> None:
    assert [e.name for e in SUITE] == list(SUITE_NAMES)
    assert all(e.pattern for e in SUITE)
    with pytest.raises(ValueError, match="unknown suite scenario"):
        suite_scenario("digits")


def test_a_cached_session_is_keyed_by_the_methods_code(tmp_path: Path) -> None:
    """A change to the method's source (a module constant included, which no configuration
    field carries) changes the cached run's key, so a logic change never reads a stale run."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "m.py").write_text("TEMPERATURE = 0.02\n", encoding="utf-8")
    before = source_digest(tmp_path, ["a"])
    assert source_digest(tmp_path, ["a"]) == before
    (tmp_path / "a" / "b" / "m.py").write_text("TEMPERATURE = 0.03\n", encoding="utf-8")
    assert source_digest(tmp_path, ["a"]) != before
    assert f"code={session_code_version()}" in _config_key(CandidatesConfig(summary_size=5))
