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
        "Anderson-Rubin where undetermined",
    }
    # Every diabetes fit is undetermined and its profile set unbounded: the control covers all.
    assert linreg["controls"]["Anderson-Rubin where undetermined"]["coverage"] == 1.0
    # 442 rows at epsilon 1: the regression is noise-dominated, and every answer says so, on
    # the interval: nothing guarantees its coverage where the data do not determine the fit, so
    # none is reliable (before 2026-11-29's change the flag sat on the value: 0.0 unreliable).
    assert linreg["reported"]["flag_fractions"]["undetermined"] == 1.0
    assert linreg["reported"]["unreliable_fraction"] == 1.0
    assert linreg["reported"]["coverage_reliable"] is None
    assert 0.0 <= mean["reported"]["coverage"] <= 1.0
    assert "coverage of 95 % intervals" in result.output
    # The split by flag: every diabetes fit is undetermined, no mean is.
    by_flag = linreg["reported"]["by_flag"]
    assert by_flag["undetermined"]["count"] == [2] * 11
    assert by_flag["unflagged"]["count"] == [0] * 11
    assert mean["reported"]["by_flag"]["unflagged"]["count"] == [2] * 11
    assert "conditional on the flag" in result.output


def test_the_undetermined_linear_cases_split_their_owners_and_state_the_pooled_fit() -> None:
    """The two cases where undetermined fits over-covered (docs/results.md, "CAPE intervals on
    undetermined fits"): Computers' owners by ``trend``, NMES1988's by ``region``, each truth the
    least-squares fit of the pooled, clamped records in raw units. Control: before, neither case
    existed (``KeyError``)."""
    import numpy as np

    from dpmarket.experiments.cape_coverage import CASES

    for name, sizes in (("computers-linreg", [2322, 2534, 1403]),
                        ("nmes-linreg", [1614, 1157, 837, 798])):  # fmt: skip
        case = CASES[name]()
        assert [t.values.shape[0] for t in case.tables] == sizes
        values = np.concatenate([t.values for t in case.tables])
        spec = case.spec
        clamped = spec.clamped(values[:, :-1], values[:, -1])
        assert clamped.target is not None
        design = np.column_stack([clamped.features, np.ones(len(values))])
        ols = np.linalg.lstsq(design, clamped.target, rcond=None)[0]
        np.testing.assert_allclose(case.truth, ols, rtol=1e-6, atol=1e-9)
