"""Smoke tests of the secure-aggregation benchmark: tiny runs end to end, in-process and over
gRPC between owner processes.

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape (one record per (transport, sites, length, dropouts) with the keys ``make bench``
collects), that a networked sum is the plain sum of the survivors' inputs, and that a wrong sum
stops the benchmark instead of being recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from bench import secagg

# The grid alone: SecAgg+ at scale has its own test below, and Flower's anchor (a virtual
# environment of its own, installed from PyPI on first use) runs in `make bench` only.
QUICK = ["--quick", "--sites", "3", "--lengths", "50", "--no-scale", "--no-flower"]
DOCUMENTED_KEYS = {"sites", "vector_length", "dropouts", "transport", "median_seconds", "phases"}


def test_quick_run_writes_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench-secagg.json"
    secagg.main([*QUICK, "--transports", "in-process", "--out", str(out)])

    records = json.loads(out.read_text(encoding="utf-8"))
    assert [(r["sites"], r["vector_length"], r["dropouts"]) for r in records] == [
        (3, 50, 0),
        (3, 50, 1),
    ]
    for record in records:
        assert record.keys() >= DOCUMENTED_KEYS
        assert record["transport"] == "in-process"
        assert record["median_seconds"] > 0
        assert set(record["phases"]) == set(secagg.PHASES)
        assert len(record["runs_seconds"]) == record["repeat"] == 2
        assert record["max_abs_error"] < record["error_bound"]
    assert records[1]["dropped_after"] == "share_keys"
    assert "wrote" in capsys.readouterr().out


def test_quick_scale_cases_run_the_complete_graph_and_secaggplus(tmp_path: Path) -> None:
    out = tmp_path / "bench-secagg.json"
    args = ["--quick", "--sites", "3", "--lengths", "50", "--no-flower"]
    secagg.main([*args, "--transports", "in-process", "--out", str(out)])

    records = json.loads(out.read_text(encoding="utf-8"))
    scale = [r for r in records if r["sites"] == 40]
    assert [r["graph"] for r in scale] == ["complete", "sparse"]
    _, sparse = scale
    assert sparse["neighbours"] < 39 and sparse["allowance"] == 2
    assert sparse["mean_degree"] < 39  # every site talks to a fraction of the others
    for record in scale:
        assert record["vector_length"] == 1_000
        assert record["max_abs_error"] < record["error_bound"]


@pytest.mark.integration
@pytest.mark.slow
def test_grpc_run_sums_across_owner_processes_into_the_bench_json(tmp_path: Path) -> None:
    into = tmp_path / "bench.json"
    into.write_text(json.dumps({"workloads": ["kept"]}), encoding="utf-8")
    secagg.main([*QUICK, "--transports", "grpc", "--into", str(into)])

    report = json.loads(into.read_text(encoding="utf-8"))
    assert report["workloads"] == ["kept"]  # merged into the JSON, not over it
    records = report["secure_aggregation"]
    assert [(r["transport"], r["sites"], r["dropouts"]) for r in records] == [
        ("grpc", 3, 0),
        ("grpc", 3, 1),
    ]
    for record in records:
        assert record.keys() >= DOCUMENTED_KEYS
        assert record["vector_length"] == 50
        assert set(record["phases"]) == set(secagg.PHASES)
        assert len(record["runs_seconds"]) == record["repeat"] == 2
        assert record["site_processes"] == 3
        # Stochastic rounding moves each survivor's value by less than one step.
        assert record["max_abs_error"] < record["error_bound"]
        scale = secagg.FixedPoint(secagg.CLIP, secagg.RESOLUTION_BITS, 3).scale
        assert record["error_bound"] == pytest.approx((3 - record["dropouts"]) / scale)
    assert records[0]["dropped_reason"] is None
    # The killed process is gone: the curator's MaskedInput call finds nobody there (the
    # reason is the public text a consumer reads, dpmarket.curator.disclosure).
    assert records[1]["dropped_reason"].startswith("masked input:")
    assert "unreachable" in records[1]["dropped_reason"]


@pytest.mark.integration
def test_a_networked_sum_that_differs_from_the_inputs_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's own check is live: if the sites summed other vectors than the ones it
    expects (here it expects owner-02's to be shifted by 1e-3), it stops."""
    real = secagg.synthetic_input

    def shifted(site: str, length: int, seed: int, clip: float) -> NDArray[np.float64]:
        values = real(site, length, seed, clip)
        return values + 1e-3 if site == "owner-02" else values

    monkeypatch.setattr(secagg, "synthetic_input", shifted)
    out = tmp_path / "never.json"
    with pytest.raises(AssertionError, match="above the quantization bound"):
        secagg.main([*QUICK, "--transports", "grpc", "--out", str(out)])
    assert not out.exists()


@pytest.mark.slow
def test_a_baseline_tree_runs_each_in_process_case_beside_this_one() -> None:
    """``--baseline TREE``: a case with the other tree's code, then this tree's, each in a
    process of its own (here the same tree stands in for another revision), each sum checked;
    the ratios are recorded and printed."""
    case = {"sites": 3, "length": 50, "dropouts": 0, "repeat": 1}
    records = secagg.measure_against(secagg.ROOT, [case])
    assert [r["transport"] for r in records] == ["in-process", "in-process baseline"]
    ours, base = records
    ratios = ours["compared_with_baseline"]
    assert ratios["baseline"] == str(secagg.ROOT) == base["source"]
    assert ratios["cpu_ratio"] == ours["median_cpu_seconds"] / base["median_cpu_seconds"]
    for record in records:
        assert (record["sites"], record["vector_length"]) == (3, 50)
        assert record["max_abs_error"] < record["error_bound"]
    assert "this tree / baseline at S=3, D=50" in secagg.format_table(records)
