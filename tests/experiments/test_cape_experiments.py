"""Smoke test of dpmarket.experiments.cape_experiments: the quick grid writes every figure as PNG +
JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpmarket.experiments.cape_experiments import FIGURES, LINREG_METHODS, cape_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cape")
    result = CliRunner().invoke(cape_figures, ["--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_every_figure_is_written(quick_out: Path) -> None:
    summary = json.loads((quick_out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["files"]) == set(FIGURES)
    for files in summary["files"].values():
        png, js = sorted(files, key=lambda f: f.endswith(".json"))
        assert (quick_out / png).read_bytes()[:8] == PNG_MAGIC
        doc = json.loads((quick_out / js).read_text(encoding="utf-8"))
        assert doc["paper"]["trends"]
        assert doc["panels"]
    ratio = summary["privacy"]["theorem1_vs_exact_at_S5_eps1"]["ratio"]
    assert 40 < ratio < 55


def test_regression_panels_hold_every_method(quick_out: Path) -> None:
    doc = json.loads((quick_out / "fig3_linreg_loss_synthetic.json").read_text(encoding="utf-8"))
    assert {p["dataset"] for p in doc["panels"]} == {"synthetic D=20", "synthetic D=50"}
    assert {p["x"] for p in doc["panels"]} == {"epsilon", "N", "delta"}
    for panel in doc["panels"]:
        series = panel["series"]["loss"]
        assert set(series) == set(LINREG_METHODS)
        for points in series.values():
            assert len(points) == len(panel["x_values"])
            assert all(p["mean"] > 0 for p in points)
        assert "capeFM_below_conv" in panel["checks"]
    real = json.loads((quick_out / "fig4_linreg_loss_real.json").read_text(encoding="utf-8"))
    assert {p["dataset"] for p in real["panels"]} == {"diabetes", "diamonds"}
    errw = json.loads((quick_out / "fig7_linreg_errw_synthetic.json").read_text(encoding="utf-8"))
    assert all("err_w" in p["series"] for p in errw["panels"])


def test_dpgd_panels(quick_out: Path) -> None:
    doc = json.loads((quick_out / "fig2_dpgd.json").read_text(encoding="utf-8"))
    assert {p["dataset"] for p in doc["panels"]} == {"synthetic D=50", "breast cancer"}
    for panel in doc["panels"]:
        for part in ("train", "test"):
            assert set(panel["series"][part]) == {"nonprivate", "conv", "cape"}
            for points in panel["series"][part].values():
                assert all(0 <= p["mean"] <= 100 for p in points)
