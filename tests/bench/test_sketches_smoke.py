"""Smoke test of the sketch benchmark: a tiny run merges its section into an existing report.

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape and that the other benchmarks' keys survive the merge.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sketches


def test_quick_run_merges_the_sketches_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"benchmark": "bench.rounds", "workloads": []}), encoding="utf-8")
    sketches.main(["--quick", "--out", str(out)])

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["benchmark"] == "bench.rounds" and report["workloads"] == []
    section = report["sketches"]
    assert {"machine", "parameters", "units", "maps", "total_runtime_seconds"} <= section.keys()
    assert set(section["maps"]) == {"rff", "race", "hist"}
    for rec in section["maps"].values():
        t, m = rec["throughput"], rec["m2m"]
        assert t["records"] == sketches.QUICK_RECORDS
        assert t["records_per_second"] > 0 and t["release_seconds"] > 0
        assert m["n_synthetic"] == sketches.QUICK_SYNTHETIC
        for key in ("design_seconds", "cholesky_seconds", "estimate_10_means_seconds"):
            assert m[key] > 0
    assert section["maps"]["rff"]["m2m"]["dimension"] == 200
    marginals = section["marginals"]
    assert marginals["rows"] == 3000 and marginals["columns"] == 10
    assert marginals["publish_seconds"] > 0 and marginals["answer_seconds"] > 0
    assert marginals["answers_with_intervals"] == marginals["queries"] == 150
    assert "records/s" in capsys.readouterr().out


def test_a_missing_report_is_created(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "bench.json"
    sketches.main(["--quick", "--skip-marginals", "--out", str(out)])
    assert set(json.loads(out.read_text(encoding="utf-8"))) == {"sketches"}
