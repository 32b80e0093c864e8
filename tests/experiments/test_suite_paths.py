"""Both allocation paths at epsilon 1 and 1,000: each path runs the allocation it names, the RFF
greedy reference uses the session's own h1, and the seed spread is the worst seed over the
median one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.experiments.runner import run_session
from dpmarket.experiments.suite import suite_scenario
from dpmarket.experiments.suite_eval import SuiteRunner
from dpmarket.experiments.suite_paths import (
    PathSetting,
    PathsRunner,
    aggregate_paths,
    path_summary,
    rff_greedy_reference,
)
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner


class _SeesH1(LocalOwnerEndpoint):
    """An in-process owner that keeps the h1 parameters the session opens it with."""

    seen: ClassVar[list[Any]] = []

    async def open_session(self, session_id: str, rff: Any, *args: Any, **kw: Any) -> Any:
        _SeesH1.seen.append(rff)
        return await super().open_session(session_id, rff, *args, **kw)


def test_the_rff_greedy_reference_uses_the_sessions_h1() -> None:
    scenario = suite_scenario("penguins-3")
    _SeesH1.seen.clear()
    endpoints = [_SeesH1(Owner(o.name, o)) for o in scenario.owners]
    config = CandidatesConfig(summary_size=scenario.default_p, gamma=scenario.gamma)
    run_session(endpoints, scenario.validation, scenario.seed_set, config, seed=5)
    from dpmarket.common.summarization.rff import draw_rff_params

    ours = draw_rff_params(scenario.n_features, 140, scenario.gamma, np.random.default_rng(5))
    for seen in _SeesH1.seen:
        np.testing.assert_array_equal(seen.omega, ours.omega)
        np.testing.assert_array_equal(seen.phase, ours.phase)
    chosen = rff_greedy_reference(scenario, 5, 140)
    assert chosen.shape == (scenario.default_p,) and np.unique(chosen).size == chosen.size
    assert not np.array_equal(chosen, rff_greedy_reference(scenario, 6, 140))


def test_each_path_runs_the_allocation_it_names(tmp_path: Path) -> None:
    paths = PathsRunner(SuiteRunner(tmp_path))
    p = paths.runner.scenario("penguins-3").default_p
    counts = paths.run(PathSetting("counts", 1.0), "penguins-3", 0)
    sketch = paths.run(PathSetting("sketch", 1000.0), "penguins-3", 0)
    assert counts["allocation"] == "counts" and sketch["allocation"] == "sketch"
    assert counts["points_read"] == sketch["points_read"] == 3 * p
    # Cached on disk: a second runner reads the same record back.
    again = PathsRunner(SuiteRunner(tmp_path)).run(PathSetting("counts", 1.0), "penguins-3", 0)
    assert again == counts


class _Fake:
    """Runs and references with known MMD² values."""

    def __init__(self, mmd: list[float]) -> None:
        self.mmd = mmd
        self.runner = self

    def run(self, ps: Any, name: str, seed: int) -> dict[str, Any]:
        kept = "uniform sample" if seed == 0 else "selection"
        return {"mmd2": self.mmd[seed], "hedge_kept": kept, "points_read": 30}

    def baselines(self, name: str, seed: int) -> dict[str, Any]:
        return {"exact": {"mmd2": 0.5}, "uniform": {"mmd2": 10.0}}

    def rff_greedy(self, name: str, seed: int) -> dict[str, Any]:
        return {"mmd2": 1.0}

    def scenario(self, name: str) -> Any:
        return type("S", (), {"default_p": 10})()


def test_the_summary_separates_the_references_and_measures_the_seed_spread() -> None:
    fake = _Fake([1.0, 2.0, 4.0, 16.0])
    row = path_summary(fake, PathSetting("counts", 1.0), "x", [0, 1, 2, 3])  # type: ignore[arg-type]
    assert row["over_exact"] == pytest.approx(2 * (1 * 2 * 4 * 16) ** 0.25)
    assert row["over_rff"] == pytest.approx((1 * 2 * 4 * 16) ** 0.25)
    # Per seed over exact greedy: 2, 4, 8, 32; the median seed is 6.
    assert row["worst_over_median_seed"] == pytest.approx(32 / 6)
    assert row["above_uniform"] == 1 and row["hedge_kept"] == 1
    agg = aggregate_paths([row, {**row, "scenario": "y", "over_exact": 1.0}])
    assert agg["worst_scenario"] == "x" and agg["spread_above_3x"] == 2
