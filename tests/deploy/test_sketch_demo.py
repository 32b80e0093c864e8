"""``make demo-sketch`` in-process and small: every query under every spec, for one owner and the
union, the ranking, the plot, and the owners' ledgers (one charge per sketch, republication
free)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from dpmarket.deploy.sketch_demo import OWNER_CARRIERS, QUERIES, run_sketch_demo


def test_sketch_demo_in_process_reports_every_query(tmp_path: Path) -> None:
    report = run_sketch_demo(
        tmp_path,
        seed=0,
        in_process=True,
        max_rows=1500,
        n_synthetic=1000,
        console=Console(quiet=True),
    )
    rows = report["exploration"]["rows"]
    specs = [s["name"] for s in report["specs"]]
    assert specs == ["flights/rff", "flights/race", "flights/hist"]
    assert len(rows) == len(specs) * 2 * len(QUERIES)
    for row in rows:
        assert len(row["estimate"]) == len(row["truth"]) == len(row["labels"]) > 0
    owners = [f"owner-{c}" for c in OWNER_CARRIERS]
    assert sorted(r["owner"] for r in report["ranking"]["private"]) == sorted(owners)
    assert report["publications"]["republication"]["charged_now"] == [False] * 3
    for owner in owners:
        budget = report["owner_budgets"][owner]
        assert budget["sessions"] == 3 and budget["epsilon_spent"] == 3.0
    saved = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert saved["ranking"] == report["ranking"]
    assert (tmp_path / "estimates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
