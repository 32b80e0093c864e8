"""Smoke test of the owner-scale benchmark: a tiny run on a real two-worker Dask cluster merges
its section into an existing report, with every computation and the in-memory comparison.

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape, that the data is generated once and reused, and that a size the disk cannot
hold is skipped, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import owner_scale

pytestmark = pytest.mark.slow

STEPS = {
    "validate",
    "h1_embedding",
    "relevance_count",
    "candidates",
    "sketch_rff",
    "cape_mean",
    "cape_fm",
}


def test_a_tiny_run_merges_the_owner_scale_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"benchmark": "bench.rounds"}), encoding="utf-8")
    data = tmp_path / "data"
    owner_scale.main(["--rows", "3000", "--data", str(data), "--into", str(out), "--workers", "2"])
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["benchmark"] == "bench.rounds"
    section = report["owner_scale"]
    assert section["machine"]["dask_workers"] == 2
    entry = section["sizes"]["3000"]
    assert set(entry["dask"]) == STEPS
    for step in entry["dask"].values():
        assert step["seconds"] > 0 and step["rows_per_second_per_core"] > 0
        assert step["peak_rss_mib"] > 0
    assert set(entry["in_memory"]) == STEPS - {"validate", "h1_embedding"} | {"h1_features"}
    assert set(entry["dask_over_in_memory_per_core"]) == STEPS - {"validate"}
    marker = data / "rows-3000" / "_COMPLETE"
    assert json.loads(marker.read_text(encoding="utf-8"))["rows"] == 3000
    assert owner_scale.generate(data, 3000) == marker.parent  # reused, not rewritten


def test_a_size_the_disk_cannot_hold_is_skipped(tmp_path: Path) -> None:
    ok, why = owner_scale._disk_room(tmp_path, 10**15)
    assert not ok and "GiB of disk" in why
