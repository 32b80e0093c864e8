"""Smoke test of the memory benchmark: one case end to end on a real owner and curator.

The bound itself is asserted by ``tests/integration/test_trust.py`` (its guard cluster); this
checks that the benchmark measures what it says and merges its section into a report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import memory

pytestmark = pytest.mark.slow


def test_a_tiny_run_refuses_every_call_and_reads_the_services_rss(tmp_path: Path) -> None:
    into = tmp_path / "bench.json"
    into.write_text(json.dumps({"other": 1}), encoding="utf-8")
    memory.main(["--case", "owner-refused", "--calls", "2", "--size-mb", "5", "--into", str(into)])

    report = json.loads(into.read_text(encoding="utf-8"))
    assert report["other"] == 1
    (result,) = report["memory"]["results"]
    assert result["case"] == "owner-refused" and result["calls"] == 2
    assert result["statuses"] == ["PERMISSION_DENIED"] * 2
    assert result["before_mib"] > 0
    assert result["peak_growth_mib"] >= result["after_growth_mib"] - 1e-9
