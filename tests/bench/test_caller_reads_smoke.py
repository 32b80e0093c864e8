"""Smoke test of the callers' read-share benchmark: a tiny run end to end.

No timing asserts (speed is measured by ``python -m bench.caller_reads``); what is checked is
that every share ran its case through the relay and that the module's share is restored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench import caller_reads
from dpmarket.runtime import admission


def test_quick_run_measures_each_share_and_restores_the_default(tmp_path: Path) -> None:
    into = tmp_path / "bench.json"
    into.write_text(json.dumps({"other": 1}), encoding="utf-8")
    before = admission.READS_PER_CALLER
    caller_reads.main(["--quick", "--rtt-ms", "10", "--into", str(into)])

    report = json.loads(into.read_text(encoding="utf-8"))
    assert report["other"] == 1
    cases = report["caller_reads"]["cases"]
    assert [(c["reads_per_caller"], c["uploads"], c["bytes"]) for c in cases] == [
        (share, *case) for case in caller_reads.QUICK_CASES for share in caller_reads.SHARES
    ]
    for case in cases:
        assert 0 < case["uploads_seconds"] < math.inf
        assert 0 < case["small_call_seconds"] < math.inf
    assert before == admission.READS_PER_CALLER
