"""Tests of dpmarket.experiments.evaluate: the quick evaluation grid end to end, in process."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dpmarket.experiments.evaluate import (
    EPSILON_FREE_METHODS,
    EVAL_METHODS,
    PRIVATE_METHODS,
    QUICK,
    run_evaluation,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """``dpmarket evaluate --quick``: digits, p = 20, epsilon 1, one seed, every method."""
    out = tmp_path_factory.mktemp("evaluate")
    buffer = io.StringIO()
    document = run_evaluation(
        QUICK["scenarios"],
        QUICK["sizes"],
        QUICK["epsilons"],
        QUICK["seeds"],
        EVAL_METHODS,
        out,
        delta=1e-6,
        console=Console(file=buffer, width=200),
    )
    return document, out, buffer.getvalue()


def test_json_structure(quick: tuple[dict[str, Any], Path, str]) -> None:
    document, out, _ = quick
    on_disk = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    assert set(on_disk) == {"config", "runs", "aggregates", "goals", "skipped", "timing"}
    assert on_disk["config"]["scenarios"] == ["digits"]
    assert on_disk["config"]["sizes"] == [20]
    assert on_disk["config"]["epsilons"] == [1.0]
    assert on_disk["config"]["seeds"] == [0]
    assert on_disk["config"]["delta"] == 1e-6
    assert on_disk["skipped"] == []
    # 3 epsilon-free methods + 12 private methods x 1 epsilon, one seed.
    assert len(on_disk["runs"]) == len(EVAL_METHODS) == 15
    for run in on_disk["runs"]:
        assert run["status"] == "ok", run.get("error")
        assert "wall_time_seconds" not in run  # machine-dependent figures live under "timing"
        for key in ("mmd2_validation", "mmd2_test", "accuracy", "accessed_fraction"):
            assert isinstance(run[key], float), key
        assert run["mmd2_validation"] >= 0
        assert 0.0 <= run["accuracy"] <= 1.0
        assert run["accessed_fraction"] == run["owner_points_accessed"] / (5 * 20)
        assert run["mmd2_over_uniform"] is not None
        assert run["mmd2_over_exact_greedy"] is not None
    by_method = {r["method"]: r for r in on_disk["runs"]}
    assert by_method["uniform"]["mmd2_over_uniform"] == pytest.approx(1.0)
    assert by_method["exact-greedy"]["mmd2_over_exact_greedy"] == pytest.approx(1.0)
    assert len(on_disk["aggregates"]) == 15
    for agg in on_disk["aggregates"]:
        assert agg["n_seeds"] == 1 and agg["n_failed"] == 0
        assert set(agg["mmd2_validation"]) == {"mean", "std"}
        assert agg["mmd2_validation"]["std"] is None  # one seed: no spread
    assert {g["method"] for g in on_disk["goals"]} == set(PRIVATE_METHODS)
    for goal in on_disk["goals"]:
        main = goal["eps_1"]
        assert set(main) == {
            "mmd2_vs_uniform",
            "accuracy_vs_exact_greedy",
            "accessed_fraction",
            "owners_delta",
            "accuracy_within_3_points",
            "mmd2_vs_half_uniform",
            "mmd2_vs_exact_greedy",
            "points_read_over_p",
            "owners_epsilon_with_sketch",
        }
        for check in main.values():
            assert isinstance(check["met"], bool)
            assert check["value"] is not None and check["bound"] is not None
        # Only the printed PrivAuction spends more delta than the evaluation's.
        assert main["owners_delta"]["met"] is not goal["method"].endswith("-auction-printed")
        # epsilon 3 is not in the quick grid: recorded as not evaluated.
        assert goal["eps_3"]["mmd2_vs_exact_greedy"]["met"] is None
        assert goal["all_met"] is None
    assert len(on_disk["timing"]["runs"]) == 15
    assert document["runs"] == on_disk["runs"]


def test_private_epsilons_honour_the_target(quick: tuple[dict[str, Any], Path, str]) -> None:
    document, _, _ = quick
    target = 1.0
    private = [r for r in document["runs"] if r["method"] in PRIVATE_METHODS]
    assert {r["method"] for r in private} == set(PRIVATE_METHODS)
    for run in private:
        assert run["epsilon"] == target
        assert run["owners_non_private"] is False
        sketched = run.get("allocation") == "sketch"
        if sketched:
            # The session charges the owners nothing; their sketch's epsilon is the target.
            assert run["owners_epsilon_spent"] == 0.0
            assert run["sketch_epsilon"] == target
            assert run["owners_epsilon_with_sketch"] == target
        else:
            # What each owner is charged: the target epsilon, at a delta of its own.
            assert 0 < run["owners_epsilon_spent"] <= target * 1.001, run["method"]
        for party in ("validation", "owners"):
            if sketched and party == "owners":
                continue
            assert run[f"delta_{party}"] == 1e-6
            if party == "owners" and run["method"].endswith("-auction-printed"):
                # (eps_auc, 1 - e^-eps_auc) bad iterations: no epsilon holds at delta = 1e-6.
                assert run["epsilon_owners_pld"] is None
                continue
            for accountant in ("pld", "theorem7"):
                value = run[f"epsilon_{party}_{accountant}"]
                assert value is not None and value > 0
            # Calibration (paper, rounds) and the configured totals (candidates) are PLD targets.
            assert run[f"epsilon_{party}_pld"] <= target * 1.001, (run["method"], party)
            if run["method"].startswith("rounds") and party == "owners":
                # Tree (or auction) noise is calibrated to spend the owners' whole budget.
                assert run[f"epsilon_{party}_pld"] >= target * 0.999
            if run["method"].startswith("candidates") and not sketched:
                # One release per party (Gaussian, Laplace): Theorem 7 reports it as configured.
                assert run[f"epsilon_{party}_theorem7"] <= target * 1.001


def test_printed_auction_spends_more_owner_delta(
    quick: tuple[dict[str, Any], Path, str],
) -> None:
    """The printed PrivAuction's tau bad iterations are (eps_auc, 1 - e^-eps_auc)-DP: the owners'
    delta grows by 1 - e^(-tau eps_auc) > 0 over the pure variant's, calibrated alike."""
    document, _, _ = quick
    by_method = {r["method"]: r for r in document["runs"]}
    for pure, printed in (("paper", "paper-auction-printed"), ("rounds", "rounds-auction-printed")):
        a, b = by_method[pure], by_method[printed]
        assert a["auction"]["variant"] == "pure" and b["auction"]["variant"] == "paper"
        # Calibrated as the pure auction: the same eps_auc and tau.
        assert b["auction"]["eps_auc"] == pytest.approx(a["auction"]["eps_auc"])
        assert b["auction"]["tau"] == a["auction"]["tau"]
        assert a["auction"]["delta_per_bad_iteration"] == 0.0
        eps_auc, tau = b["auction"]["eps_auc"], b["auction"]["tau"]
        assert b["auction"]["delta_per_bad_iteration"] == pytest.approx(-math.expm1(-eps_auc))
        assert a["owners_delta_spent"] == pytest.approx(1e-6)
        extra = -math.expm1(-tau * eps_auc)  # 1 - (1 - (1 - e^-eps_auc))^tau
        assert b["owners_delta_spent"] == pytest.approx(1e-6 + extra, rel=1e-6)
        assert b["owners_delta_spent"] > a["owners_delta_spent"]
        # The ledger's Theorem 7 delta counts the same bad iterations.
        assert b["delta_owners_theorem7"] > a["delta_owners_theorem7"]
    aggregates = {a["method"]: a for a in document["aggregates"]}
    assert aggregates["paper-auction-printed"]["owners_delta_spent"]["max"] > 1e-6


def test_cli_offers_every_method() -> None:
    from dpmarket.deploy.cli import command_at

    command = command_at("lab", "evaluate")
    (option,) = [p for p in command.params if p.name == "methods"]
    assert tuple(option.type.choices) == EVAL_METHODS  # type: ignore[attr-defined]


def test_epsilon_free_methods_run_once_per_seed(
    quick: tuple[dict[str, Any], Path, str],
) -> None:
    document, _, _ = quick
    for method in EPSILON_FREE_METHODS:
        runs = [r for r in document["runs"] if r["method"] == method]
        assert len(runs) == 1
        assert runs[0]["epsilon"] is None
        assert runs[0]["epsilon_validation_pld"] is None


def test_candidates_read_at_most_3p(quick: tuple[dict[str, Any], Path, str]) -> None:
    document, _, _ = quick
    runs = [r for r in document["runs"] if r["method"].startswith("candidates")]
    assert len(runs) == 6
    for run in runs:
        assert run["owner_points_accessed"] <= 3 * run["p"]
        assert run["points_read_over_p"] <= 3.0
    allocations = {r["method"]: r["allocation"] for r in runs}
    assert allocations["candidates"] == "sketch"
    assert allocations["candidates-counts"] == "counts"


def test_plot_and_table(quick: tuple[dict[str, Any], Path, str]) -> None:
    _, out, printed = quick
    png = out / "quality_vs_epsilon.png"
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert "summary quality vs privacy" in printed
    assert "candidates" in printed
    assert "printed auction" in printed and "owners ε / δ spent" in printed


def test_rejects_unknown_method(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown methods"):
        run_evaluation(["digits"], [20], [1.0], 1, ["nope"], tmp_path)


def test_skips_p_above_owner_points(tmp_path: Path) -> None:
    document = run_evaluation(
        ["digits"], [10**6], [1.0], 1, ["uniform"], tmp_path, console=Console(file=io.StringIO())
    )
    assert document["runs"] == []
    assert document["skipped"][0]["p"] == 10**6
