"""The suite's split: recorded once, every scenario in exactly one half, each half holding every
family; whatever chooses a constant refuses a held-out scenario (and runs nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import dpmarket.experiments.suite_eval as se
from dpmarket.experiments.suite import SUITE, SUITE_NAMES
from dpmarket.experiments.suite_eval import SuiteSetting, leave_one_scenario_out, run_suite
from dpmarket.experiments.suite_paths import half_names, run_half
from dpmarket.experiments.suite_split import (
    SPLIT_FILE,
    HeldOutScenarioError,
    SuiteSplit,
    draw_split,
    load_split,
    require_design,
    write_split,
)
from dpmarket.experiments.suite_tables import FAMILIES


def test_every_scenario_is_in_exactly_one_recorded_half() -> None:
    split = load_split()
    assert SPLIT_FILE.name == "suite_split.toml" and SPLIT_FILE.exists()
    assert not set(split.design) & set(split.held_out)
    assert sorted(split.design + split.held_out) == sorted(SUITE_NAMES)
    assert abs(len(split.design) - len(split.held_out)) <= 1
    family = {e.name: e.family for e in SUITE}
    for half in (split.design, split.held_out):
        assert {family[n] for n in half} == set(FAMILIES)


def test_the_recorded_split_is_the_draw_of_its_recorded_seed() -> None:
    """Drawn once at random and recorded: the file is what its seed draws (a later scenario would
    be added by hand, never by redrawing)."""
    split = load_split()
    assert draw_split(SUITE, split.seed) == split
    assert draw_split(SUITE, split.seed + 1) != split  # the seed decides it


def test_the_split_file_round_trips_and_refuses_a_scenario_in_both_halves(
    tmp_path: Path,
) -> None:
    path = tmp_path / "split.toml"
    split = SuiteSplit(7, ("a", "b"), ("c",))
    write_split(split, path)
    assert load_split(path) == split
    write_split(SuiteSplit(7, ("a", "b"), ("b",)), path)
    with pytest.raises(ValueError, match=r"\['b'\] are in both halves"):
        load_split(path)


def test_choosing_constants_refuses_a_held_out_scenario() -> None:
    split = load_split()
    require_design(split.design, "a test")  # the design half is accepted
    with pytest.raises(HeldOutScenarioError, match=split.held_out[0]):
        require_design([split.design[0], split.held_out[0]], "a test")
    with pytest.raises(HeldOutScenarioError, match="not-a-scenario"):
        require_design(["not-a-scenario"], "a test")


def test_leave_one_scenario_out_runs_nothing_with_a_held_out_scenario(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    split = load_split()
    calls: list[str] = []

    def summary(runner: Any, setting: SuiteSetting, name: str, seeds: Any) -> dict[str, Any]:
        calls.append(name)
        return {"scenario": name, "over_exact": 1.0, "seeds": seeds}

    monkeypatch.setattr(se, "scenario_summary", summary)
    grid = [SuiteSetting()]
    with pytest.raises(HeldOutScenarioError):
        leave_one_scenario_out(None, grid, [*split.design[:2], split.held_out[0]], [0])  # type: ignore[arg-type]
    assert calls == []
    # Control: on the design half it runs.
    out = leave_one_scenario_out(None, grid, list(split.design[:2]), [0])  # type: ignore[arg-type]
    assert calls and out["chosen_on_all"] == grid[0].label
    # The whole suite (held-out half included) is refused too.
    with pytest.raises(HeldOutScenarioError):
        run_suite(Path("unused"), seeds=1, loso=True, hashes=False, names=None)


def test_the_tuning_command_refuses_the_held_out_half(tmp_path: Path) -> None:
    from dpmarket.deploy.cli import main

    args = ["evaluate", "--suite", "--loso", "--half", "held-out", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "design half only" in result.output
    with pytest.raises(HeldOutScenarioError):
        run_half(tmp_path, half="held-out", seeds=1, loso=True)
    assert not any(tmp_path.iterdir())  # nothing ran, nothing was written


def test_a_report_of_one_half_never_shows_the_other() -> None:
    split = load_split()
    assert half_names("design") == [n for n in SUITE_NAMES if n in split.design]
    assert half_names("held-out", [split.held_out[0]]) == [split.held_out[0]]
    with pytest.raises(ValueError, match="not in the design half"):
        half_names("design", [split.held_out[0]])
