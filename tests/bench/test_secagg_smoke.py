"""Smoke test of the secure-aggregation benchmark: a tiny run end to end.

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape: one record per (sites, length, dropouts) with the keys ``make bench`` collects.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import secagg


def test_quick_run_writes_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench-secagg.json"
    secagg.main(["--quick", "--sites", "3", "--lengths", "50", "--out", str(out)])

    records = json.loads(out.read_text(encoding="utf-8"))
    assert [(r["sites"], r["vector_length"], r["dropouts"]) for r in records] == [
        (3, 50, 0),
        (3, 50, 1),
    ]
    for record in records:
        assert record["transport"] == "in-process"
        assert record["median_seconds"] > 0
        assert set(record["phases"]) == set(secagg.PHASES)
        assert len(record["runs_seconds"]) == record["repeat"] == 2
        assert record["max_abs_error"] < record["error_bound"]
    assert records[1]["dropped_after"] == "share_keys"
    assert "wrote" in capsys.readouterr().out
