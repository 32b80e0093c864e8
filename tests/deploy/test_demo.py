"""The demo runs every method end to end and reports each of them."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from dpmarket.common.summarization.methods import METHODS
from dpmarket.deploy.launcher import run_demo


def test_demo_in_process_reports_every_method(tmp_path: Path) -> None:
    report = run_demo(
        "digits", tmp_path, summary_size=8, seed=0, in_process=True, console=Console(quiet=True)
    )
    methods = [row["method"] for row in report["methods"]]
    assert sorted(methods) == sorted([*METHODS, "exact-greedy"])
    saved = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert [row["method"] for row in saved["methods"]] == methods
    assert (tmp_path / "mmd.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in report["methods"]:
        assert row["summary_size"] == 8
