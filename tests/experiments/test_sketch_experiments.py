"""Smoke test of dpmarket.experiments.sketch_experiments: the quick settings write every experiment
as PNG +
JSON with the documented keys, through ``dpmarket sketch-experiments``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import Domain, M2MEstimator, SketchMechanism, draw_rff, tasks
from dpmarket.deploy.cli import main
from dpmarket.experiments.sketch_experiments import CDF_POINTS, EXPERIMENTS, MAPS, TASKS, Battery

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sketches")
    result = CliRunner().invoke(main, ["sketch-experiments", "all", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Table 1" in result.output and "paper" in result.output
    return out


def _doc(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text(encoding="utf-8"))


def test_every_experiment_is_written(quick_out: Path) -> None:
    summary = _doc(quick_out, "summary")
    assert set(summary["files"]) == set(EXPERIMENTS)
    for name in EXPERIMENTS:
        assert (quick_out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert _doc(quick_out, name)["seconds"] >= 0


def test_table1_puts_the_paper_beside_ours(quick_out: Path) -> None:
    doc = _doc(quick_out, "table1")
    assert doc["paper"]["numbers"]["rff"]["1"] == 9.55e-3
    for kind in ("rff", "hist"):
        for key in ("inf", "1"):
            cell = doc["results"][kind][key]
            assert set(cell) >= {"paper", "mre", "rmse", "floor", "at_or_below_paper"}
            assert cell["mre"] > 0 and cell["rmse"] > 0
    # The count-noise floor at epsilon = 1: 1 / (0.02 n), n = 2000 in the quick settings; the
    # estimator's own noise floor includes it (and the sum's noise).
    hist = doc["results"]["hist"]["1"]
    assert hist["count_floor"] == pytest.approx(1 / (0.02 * 2000))
    assert hist["floor"] > hist["count_floor"]


def test_lambda_and_figures_hold_every_cell(quick_out: Path) -> None:
    lam = _doc(quick_out, "lambda")
    assert lam["best_variant"] in lam["geometric_mean_mre"]
    assert set(lam["results"]) == {"Random10", "diamonds"}
    fig3 = _doc(quick_out, "figure3")
    for by_kind in fig3["results"].values():
        assert set(by_kind) == set(MAPS)
        for by_eps in by_kind.values():
            assert set(by_eps) == {"1", "100", "inf"}
            for errs in by_eps.values():
                assert set(errs) == set(TASKS)
    assert "hist_best_single_column_random10_eps_ge_1" in fig3["checks"]
    fig4 = _doc(quick_out, "figure4")
    assert set(fig4["results"]) == {"non-private", "DP-ERM", *MAPS}
    assert 0.5 < fig4["results"]["non-private"]["inf"]["mean"] <= 1.0


def test_bad_arguments_are_refused() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["sketch-experiments", "table2"])
    assert result.exit_code == 2 and "table2" in result.output
    result = runner.invoke(main, ["sketch-experiments", "table1", "--trials", "0"])
    assert result.exit_code == 2 and "--trials" in result.output


def test_figure3_covariance_by_linearity_is_the_papers_two_stage_estimate() -> None:
    """The battery assembles the covariance from E[x_i x_j], E[x_i] and E[1]; M2M is linear in
    its target, so this equals :func:`dpmarket.common.sketches.tasks.covariance` (means first)."""
    rng = np.random.default_rng(0)
    dom = Domain.unit(3)
    x = rng.beta(2, 5, size=(500, 3))
    sketch = SketchMechanism(draw_rff(3, 20, 1.0, rng), dom, 1.0).release(x, SeededNoise(rng))
    est = M2MEstimator(sketch, rng=rng, n_synthetic=3000)
    battery = Battery.draw(3, 5, rng)
    estimate = np.asarray(est.estimate_values(battery.values(est.points)))
    truth = battery.values(x).mean(0)
    cov_truth = np.cov(x.T, bias=True)
    errors = battery.errors(estimate, truth, cov_truth)
    expected = float(np.linalg.norm(tasks.covariance(est) - cov_truth))
    assert errors["covariance"] == pytest.approx(expected, rel=1e-9)
    assert errors["mean"] == pytest.approx(
        float(np.mean(np.abs(tasks.moments(est) - x.mean(0)) / x.mean(0))), rel=1e-9
    )
    gap = np.abs(
        tasks.cdf(est, CDF_POINTS) - tasks.cdf_function(CDF_POINTS)(x).mean(0).reshape(3, -1)
    )
    assert errors["cdf"] == pytest.approx(float(np.mean(gap.sum(1) * 0.1)), rel=1e-9)
    assert not math.isnan(errors["queries"])
