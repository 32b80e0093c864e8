"""Result tables that fit a terminal, and the consumer's plot.

A newcomer's 80-column terminal showed ``can… │ 0.0… │ 0.6…`` and the demo's table needed 170
columns. Tables are rendered here by rich at width 80 exactly as a terminal would show them: no
cell may be cut to an ellipsis and no line may be wider than the terminal.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from dpmarket.common.summarization.methods import CandidatesConfig, method_config
from dpmarket.consumer.report import (
    comparison_table,
    evaluate_summary,
    mmd_curve,
    plot_request,
)
from dpmarket.experiments.runner import simulate
from dpmarket.experiments.scenarios import Scenario


def _render(renderable: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _fits(text: str, width: int = 80) -> None:
    assert "…" not in text, text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width, text


def _eps(v: float, p: float, o: float, q: float) -> dict[str, Any]:
    return {"validation": {"theorem7": v, "pld": p}, "owners": {"theorem7": o, "pld": q}}


#: The demo's six rows at their widest: every method's label, flights-sized counts.
DEMO_ROWS: list[dict[str, Any]] = [
    {"method": "candidates", "label": "private (candidates, default)",
     "epsilon": _eps(1.31, 1, 0, 0), "mmd2_validation": 0.0038,
     "mmd2_over_reference_percent": -3.2, "accuracy": 0.852,
     "owner_points_accessed": 600, "validation_points_accessed": 2456},
    {"method": "private", "label": "private (Algorithm 3)",
     "epsilon": _eps(1.88, 1.11, 0.299, 0.168), "mmd2_validation": 0.298,
     "mmd2_over_reference_percent": 7532.0, "accuracy": 0.822,
     "owner_points_accessed": 1403, "validation_points_accessed": 2456},
    {"method": "rounds", "label": "private (rounds: Gaussian, tree, exact)",
     "epsilon": _eps(1.0, 1.0, 2.66, 0.999), "mmd2_validation": 0.000123456,
     "mmd2_over_reference_percent": 1499.0, "accuracy": 0.851,
     "owner_points_accessed": 1517, "validation_points_accessed": 2456},
    {"method": "greedy", "label": "greedy, RFF embeddings (in-process)", "epsilon": None,
     "mmd2_validation": 0.0044, "mmd2_over_reference_percent": 13.0, "accuracy": 0.861,
     "owner_points_accessed": 200, "validation_points_accessed": 2456},
    {"method": "uniform", "label": "uniform sampling", "epsilon": None,
     "mmd2_validation": 0.155, "mmd2_over_reference_percent": 3872.0, "accuracy": 0.86,
     "owner_points_accessed": 200, "validation_points_accessed": 2456},
    {"method": "exact-greedy", "label": "greedy, exact kernel (pooled)", "epsilon": None,
     "mmd2_validation": 0.0039, "mmd2_over_reference_percent": 0.0, "accuracy": 0.855,
     "owner_points_accessed": None, "validation_points_accessed": 2456},
]  # fmt: skip


def test_the_demo_table_fits_80_columns_without_cutting_a_value() -> None:
    text = _render(comparison_table(DEMO_ROWS, title="flights, p = 200, seed = 0"))
    _fits(text)
    for value in ("0.298", "+7532%", "0.000123", "1517+2456", "1.9/1.1", "0.3/0.17", "2.7/1"):
        assert value in text, value


def test_the_wide_table_keeps_every_column() -> None:
    text = _render(comparison_table(DEMO_ROWS, title="t", wide=True), width=250)
    for header in ("MMD² to test", "K·p", "paper bound", "ε owners (Thm 7 / PLD)", "time (s)"):
        assert header in text
    assert "0.299 / 0.168" in text


@pytest.mark.parametrize("method", ["candidates", "uniform"])
def test_a_requests_own_table_fits_80_columns(digits: Scenario, method: str) -> None:
    """The row ``dpmarket request`` prints, from a real summary and its evaluation."""
    config = method_config(method, summary_size=20, rff_dimension=32)
    result = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=0)
    row = evaluate_summary(result, digits.validation, config.gamma, test=digits.test, seed=0)
    row = dataclasses.replace(row, label=method)
    text = _render(comparison_table([row], title=f"{method} summary of 20 points"))
    _fits(text)
    assert f"{row.mmd2_validation:.3g}" in text and f"{row.accuracy:.3f}" in text
    # Every number says what it is: the test set's estimates carry their interval.
    stated = row.to_json()["uncertainty"]
    assert stated["mmd2_validation"]["kind"] == "exact" and stated["epsilon"]["kind"] == "bound"
    low, high = stated["accuracy"]["interval"]
    assert row.accuracy is not None and row.mmd2_test is not None
    assert low < row.accuracy < high and stated["accuracy"]["covers"]
    # the interval itself (Wilson: asymmetric), not a "±" half-width (issue 28's control: the
    # table read "0.680±0.090" for [0.583, 0.763])
    assert f"{row.accuracy:.3f} [{low:.3f},{high:.3f}]" in text and "±" not in text
    low, high = stated["mmd2_test"]["interval"]
    assert low < stated["mmd2_test"]["value"] < high <= row.mmd2_test + 5 * (high - low)
    wide = _render(comparison_table([row], title="t", wide=True), width=250)
    assert f"[{low:.3g}, {high:.3g}]" in wide


def test_the_plot_draws_the_mmd_curve_and_each_owners_share(
    digits: Scenario, tmp_path: Any
) -> None:
    config = CandidatesConfig(summary_size=20, rff_dimension=32)
    result = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=0)
    report = dataclasses.replace(result.report, left_out={"owner-x": "budget refused"})
    result = dataclasses.replace(result, report=report)
    path = tmp_path / "plot.png"
    drawn = plot_request(result, digits.validation, config.gamma, path, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn.sizes[-1] == 20
    np.testing.assert_allclose(
        drawn.mmd2, mmd_curve(result.points, digits.validation, config.gamma, drawn.sizes)
    )
    counts = {o: result.owner_ids.count(o) for o in set(result.owner_ids)}
    assert drawn.shares == {**dict(sorted(counts.items())), "owner-x": 0}


def test_a_wide_table_through_a_pipe_is_printed_at_its_own_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--wide`` through a pipe (or an 80-column terminal): the table keeps every digit.

    Control: printed by a plain ``Console()`` (what ``request --wide`` did), stdout not being a
    terminal gives rich 80 columns, and every value was cut (``0.0…``) — an outside analyst's
    report, `request --wide ... | cat`."""
    from dpmarket.runtime.cli import print_table

    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(comparison_table(DEMO_ROWS, title="t", wide=True), wide=True)
    text = capsys.readouterr().out
    assert "…" not in text, text
    for value in ("0.298", "+7532", "0.000123", "1517 + 2456"):
        assert value in text, value
    # The compact table is unchanged: printed at the terminal's width, and it fits 80.
    print_table(comparison_table(DEMO_ROWS, title="t"))
    _fits(capsys.readouterr().out)
