"""Smoke test of the owner-ledger benchmark: a tiny run end to end.

No timing asserts (speed is measured by ``make bench``); what is checked is that each case ran
on the history it claims: the window's totals after the timed steps count the injected charges
that fall in the window and every timed step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import ledger


def test_quick_run_times_each_history_and_policy(tmp_path: Path) -> None:
    into = tmp_path / "bench.json"
    into.write_text(json.dumps({"other": 1}), encoding="utf-8")
    ledger.main(["--quick", "--into", str(into)])

    report = json.loads(into.read_text(encoding="utf-8"))
    assert report["other"] == 1
    section = report["owner_ledger"]
    cases = section["cases"]
    assert [(c["history"], c["policy"]) for c in cases] == [
        (h, p) for h in ledger.QUICK_HISTORIES for p in ledger.POLICIES
    ]
    for case in cases:
        assert case["charge_ms"] > 0 and case["check_ms"] > 0
        # The history is spread evenly over 365 days: a 30-day window holds 30/365 of it.
        earlier = case["history"] if case["policy"] == "lifetime" else case["history"] * 30 // 365
        assert case["window_points"] == pytest.approx(earlier + case["steps"], abs=1)
        assert case["window_epsilon"] == pytest.approx(
            ledger.EPSILON * case["window_points"], rel=1e-9
        )
