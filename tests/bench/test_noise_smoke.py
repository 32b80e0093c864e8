"""Smoke test of the noise benchmark: a tiny run end to end.

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape: every protocol case is timed for both sources and the session estimates add up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import noise


def test_quick_run_writes_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench-noise.json"
    noise.main(["--quick", "--large-size", "2000", "--out", str(out)])

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["benchmark"] == "bench.noise"
    assert {"machine", "parameters", "units", "opendp", "cases", "scale_check", "sessions"} <= (
        report.keys()
    )
    assert report["parameters"]["large_size"] == 2000
    names = [c["name"] for c in report["cases"]]
    assert names == [c.name for c in noise.cases(2000)]
    for case in report["cases"]:
        for source in ("numpy", "opendp"):
            assert case[source]["per_call_us"] > 0
            assert case[source]["repeat"] >= 1
        assert case["ratio_opendp_over_numpy"] == pytest.approx(
            case["opendp"]["per_call_us"] / case["numpy"]["per_call_us"]
        )
    assert len(report["scale_check"]) == 2 * len(noise.SCALE_CHECK)

    by_name = {c["name"]: c for c in report["cases"]}
    mwem = report["sessions"]["mwem"]
    assert mwem["opendp_seconds"] == pytest.approx(
        noise.MWEM_DRAWS * by_name["laplace_scalar"]["opendp"]["per_call_us"] / 1e6
    )
    for k in noise.CANDIDATE_K:
        est = report["sessions"][f"candidates_k{k}"]
        expected = (
            by_name["gaussian_d140"]["opendp"]["per_call_us"]
            + by_name[f"laplace_k{k}"]["opendp"]["per_call_us"]
        ) / 1e6
        assert est["opendp_seconds"] == pytest.approx(expected)
        assert est["added_seconds"] == pytest.approx(est["opendp_seconds"] - est["numpy_seconds"])
    assert "session mwem" in capsys.readouterr().out
