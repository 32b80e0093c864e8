"""Smoke test of the round-latency benchmark: a tiny run end to end (real processes, real gRPC).

No timing asserts (CONVENTIONS: speed is measured by ``make bench``); what is checked is the
report's shape and a real property: the in-process run and the networked runs over mTLS and over
plaintext gRPC, with the same seed, return the same summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import rounds

pytestmark = pytest.mark.integration


def test_quick_run_writes_report_with_identical_summaries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    rounds.main(["--quick", "--out", str(out), "--floor-repeat", "2"])

    report = json.loads(out.read_text(encoding="utf-8"))
    assert {
        "benchmark",
        "machine",
        "data",
        "parameters",
        "floor",
        "workloads",
        "targets",
        "mtls_cost",
        "total_runtime_seconds",
    } <= report.keys()
    assert report["data"]["synthetic"] is True
    assert {"nproc", "platform", "numpy", "blas"} <= report["machine"].keys()
    assert report["parameters"]["quick"] is True
    for key in ("k_owners_sequential_ms", "k_owners_read_ms"):
        assert set(report["floor"][key]) == {str(k) for k in rounds.QUICK_K}, key
    assert set(report["targets"]) == {"networked_vs_in_process", "round_latency_k16_n50k"}

    assert [w["k"] for w in report["workloads"]] == list(rounds.QUICK_K)
    for workload in report["workloads"]:
        assert workload["n_points"] == rounds.QUICK_N
        assert set(workload["methods"]) == {"private", "greedy"}
        for method, result in workload["methods"].items():
            assert result["summaries_identical"] is True, method
            assert result["points_identical"] is True, method
            assert result["plaintext_summary_identical"] is True, method
            assert result["ledgers_summary_identical"] is True, method
            assert sorted(result["networked_order"]) == ["mtls", "plaintext"]
            assert result["networked"]["transport"] == "grpc-loopback-mtls"
            assert result["networked_plaintext"]["transport"] == "grpc-loopback-plaintext"
            for transport in (
                "in_process",
                "in_process_ledgers",
                "networked",
                "networked_plaintext",
            ):
                run = result[transport]
                assert run["round_latency"]["rounds"] == rounds.QUICK_ROUNDS
                assert {"median_ms", "p90_ms", "max_ms", "mean_ms"} <= run["round_latency"].keys()
                assert {
                    "session_wall_seconds",
                    "end_to_end_seconds",
                    "bid_throughput_points_per_second",
                } <= run.keys()
                assert run["dropped_owners"] == []
            for ratios in (
                "networked_over_in_process",
                "networked_over_in_process_ledgers",
                "mtls_over_plaintext",
            ):
                assert {"median_round", "p90_round", "end_to_end"} <= result[ratios].keys()
            tls = result["networked"]["round_latency"]["median_ms"]
            plain = result["networked_plaintext"]["round_latency"]["median_ms"]
            assert result["mtls_over_plaintext"]["median_round"] == pytest.approx(tls / plain)
    # The two methods run the networked transports in opposite orders.
    orders = [m["networked_order"] for w in report["workloads"] for m in w["methods"].values()]
    assert orders[0] != orders[1]
    cost = report["mtls_cost"]
    assert [(c["k"], c["method"]) for c in cost] == [
        (k, m) for k in rounds.QUICK_K for m in ("private", "greedy")
    ]
    for c in cost:
        assert c["summaries_identical"] is True
        assert c["median_ratio"] == pytest.approx(c["mtls_median_ms"] / c["plaintext_median_ms"])

    table = capsys.readouterr().out
    assert "in-process" in table and "grpc-loopback-mtls" in table
    assert "grpc-loopback-plaintext" in table and "mTLS cost" in table
