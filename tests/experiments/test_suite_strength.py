"""The shrinkage-strength comparison (experiments/suite_strength.py) designs on the design half
only."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.experiments.suite_eval import SuiteRunner
from dpmarket.experiments.suite_paths import PathsRunner
from dpmarket.experiments.suite_split import HeldOutScenarioError, load_split
from dpmarket.experiments.suite_strength import strength_rows, summarize


def test_a_held_out_scenario_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A held-out scenario among the names raises before a session runs (the cache stays
    empty)."""
    held_out = load_split().names("held-out")[0]
    paths = PathsRunner(SuiteRunner(tmp_path / "cache"))
    with pytest.raises(HeldOutScenarioError):
        strength_rows(paths, [held_out], [0], epsilon=1.0)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))


def test_the_summary_scores_each_path_and_rule_by_median_and_worst() -> None:
    """score = sqrt(median * worst) over the scenarios, the worst named, families' medians."""
    rows = [
        {
            "path": "counts",
            "rule": "share",
            "epsilon": 1.0,
            "scenario": n,
            "family": f,
            "over_exact": x,
            "seed_spread": s,
        }
        for n, f, x, s in (
            ("a", "first", 1.0, 1.1),
            ("b", "first", 4.0, 2.0),
            ("c", "small-m", 16.0, 1.5),
        )
    ]
    (out,) = summarize(rows)
    assert out["median"] == 4.0 and out["worst"] == 16.0 and out["worst_scenario"] == "c"
    assert out["score"] == pytest.approx(8.0)
    assert out["families"] == {"first": 2.5, "small-m": 16.0}
    assert out["seed_spread"] == 2.0
