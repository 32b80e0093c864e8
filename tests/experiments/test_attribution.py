"""``dpmarket lab evaluate --attribution`` (experiments/attribution.py) on one small scenario."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from scipy.stats import spearmanr

from dpmarket.experiments.attribution import _tied, run_attribution, spearman


def test_spearman_ranks_ties_by_their_mean_and_a_constant_vector_as_zero() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=9), rng.normal(size=9)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y)[0])
    tied = np.array([0.0, 0.0, 0.0, 1.0, 2.0])
    assert spearman(tied, np.array([0.0, 0.0, 0.0, 3.0, 4.0])) == pytest.approx(1.0)
    assert spearman(np.zeros(5), tied) == 0.0


def test_tied_counts_every_owner_that_shares_its_value() -> None:
    assert _tied(np.array([0.1, 0.2, 0.3])) == 0
    assert _tied(np.array([-0.1, 0.0, 0.0, 0.0, 0.4, 0.4])) == 5
    assert _tied(np.array([0.5])) == 0


def test_the_experiment_measures_a_scenario_and_writes_its_record(tmp_path: Path) -> None:
    out = io.StringIO()
    report = run_attribution(
        tmp_path,
        seeds=1,
        epsilons=(1.0, 10.0),
        names=["wine-3"],
        cost=False,
        prior=False,
        draws=5,
        console=Console(file=out, width=80),
    )
    written = json.loads((tmp_path / "attribution.json").read_text())
    assert written == json.loads(json.dumps(report))
    (scenario,) = written["scenarios"]
    assert scenario["name"] == "wine-3" and scenario["owners"] == 3
    assert scenario["half"] == "held-out"
    for rule in ("value", "proportional"):
        for key in ("payouts_j", "payouts_e", "payouts_j5"):
            assert set(scenario[key][rule]) == {"1", "10"}
            assert all(-1.0 <= v <= 1.0 for v in scenario[key][rule]["1"])
    assert set(scenario["unshrunk_e"]) == {"1", "10"}
    for key in ("paper_rule", "leave_one_out", "embedding", "counts_j", "counts_e"):
        assert len(scenario[key]) == 1 and -1 <= scenario[key][0] <= 1
    (value,) = scenario["grand"]
    (spread,) = scenario["signal_noise"]
    assert -1.0 <= value <= 1.0 and spread >= 0.0
    # The diagnosis of the reference values: every owner delivers points or is a null owner.
    assert scenario["null_owners"][0] == 3 - scenario["delivering"][0]
    assert 0 <= scenario["tied_owners"][0] <= scenario["delivering"][0]
    assert scenario["spread_j"][0] >= 0.0 and 0.0 <= scenario["close_pairs"][0] <= 1.0
    assert len(scenario["limit_j"]) == 1 and -1.0 <= scenario["limit_j"][0] <= 1.0
    assert len(scenario["own_exact"]) == 1
    for key in ("own_j", "own_paid_j"):
        assert set(scenario[key]) == {"1", "10"}
        assert all(-1.0 <= v <= 1.0 for v in scenario[key]["1"])
    assert len(scenario["own_limit_j"]) == 1 and -1.0 <= scenario["own_limit_j"][0] <= 1.0
    (limits,) = scenario["limits"]
    assert limits["sensitivity"] >= 1.0  # J(S_C)'s values move more than the embedding game's
    assert limits["owner_sensitivity"] > 0.0 and 0.0 <= limits["close"] <= 1.0
    assert len(limits["flip"]) == 2 and all(-1.0 <= r <= 1.0 for r in limits["flip"])
    for key in ("bound", "oracle", "oracle_owners"):
        assert set(limits[key]) == {"1", "1000"}
        assert all(-1.0 <= v <= 1.0 for v in limits[key].values())
    assert written["prior_fit"] == {}
    printed = out.getvalue()
    assert "wine-3" in printed and "embedding game" in printed and "is lost" in printed
    assert "own-data release" in printed and "What any release reaches" in printed
    # Both tables fit 80 columns whole: nothing cut short.
    assert "…" not in printed and max(len(line) for line in printed.splitlines()) <= 80


def test_a_scenario_with_too_many_owners_for_exact_shapley_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="more than 16"):
        run_attribution(
            tmp_path,
            names=["diamonds-50"],
            cost=False,
            prior=False,
            console=Console(file=io.StringIO()),
        )


def test_the_command_runs_the_experiment_on_its_own_and_names_a_refused_scenario(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from dpmarket.deploy.cli import main

    runner = CliRunner()
    mixed = runner.invoke(main, ["lab", "evaluate", "--attribution", "--suite"])
    assert mixed.exit_code == 2 and "--attribution runs on its own" in mixed.output
    args = ["lab", "evaluate", "--attribution", "--suite-scenario", "diamonds-50"]
    refused = runner.invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert refused.exit_code == 1 and "diamonds-50 has 50 owners" in refused.output
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written
