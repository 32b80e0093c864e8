"""Smoke test of dpmarket.experiments.cape_coverage (``dpmarket cape coverage``): a few
repetitions of the small cases through the curator's job, with their controls."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dpmarket.deploy.cli import main


def test_coverage_runs_the_curators_jobs_and_tallies_every_answer(tmp_path: Path) -> None:
    out = tmp_path / "coverage.json"
    result = CliRunner().invoke(
        main,
        ["cape", "coverage", "--reps", "2", "--case", "diabetes-mean", "--case",
         "diabetes-linreg", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text(encoding="utf-8"))
    mean, linreg = document["cases"]
    assert mean["case"] == "diabetes-mean" and linreg["case"] == "diabetes-linreg"
    assert mean["reported"]["answers"] == 2 * 11 and set(mean["controls"]) == {"without F"}
    assert set(linreg["controls"]) == {
        "without F",
        "basic interval",
        "released floor",
        "one-sigma floor",
        "floored draws",
    }
    # 442 rows at epsilon 1: the regression is noise-dominated, and every answer says so (on
    # the value: its interval is wide along what the data do not determine, and still covers).
    assert linreg["reported"]["flag_fractions"]["undetermined"] == 1.0
    assert linreg["reported"]["unreliable_fraction"] == 0.0
    assert 0.0 <= mean["reported"]["coverage"] <= 1.0
    assert "coverage of 95 % intervals" in result.output
