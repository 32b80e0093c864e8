"""Every round-trip formula the docs state is the one the network benchmark uses, and matches the
round trips it measures on real processes over mTLS (a small cluster: K = 3 owners, p in {2, 3},
three secure-aggregation sites)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import network

pytestmark = pytest.mark.integration

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_docs_state_the_benchmarks_formulas() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert network.docs_table() in text, (
        "docs/reference.md's round-trip table differs from bench.network.docs_table()"
    )


def test_sparse_threshold_of_the_formula_is_the_graphs() -> None:
    network.check_sparse_threshold()


def test_every_measured_round_trip_count_matches_its_formula(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"other": 1}), encoding="utf-8")
    network.main(
        ["--k", "3", "-p", "2", "3", "--sites", "3", "--n", "60", "--into", str(out),
         "--work-dir", str(tmp_path / "work")]
    )  # fmt: skip
    merged = json.loads(out.read_text(encoding="utf-8"))
    assert merged["other"] == 1
    report = merged["network"]
    measured = {r["protocol"] for r in report["runs"]}
    assert measured == set(network.ROUND_TRIPS)
    for run in report["runs"]:
        waves = run["curator_to_owners"]["waves"]
        assert waves == run["predicted_waves"], run
        assert run["consumer_to_curator"]["waves"] == run["predicted_consumer_waves"], run
        assert run["matches"], run
        assert run["curator_to_owners"]["calls"] >= waves > 0
        assert run["curator_to_owners"]["request_bytes"] > 0
        assert run["curator_to_owners"]["response_bytes"] > 0
    assert report["all_match"] is True
    # The default method takes a fixed number of round trips.
    candidates = [r for r in report["runs"] if r["protocol"] == "summarization/candidates"]
    assert {r["curator_to_owners"]["waves"] for r in candidates} == {6}
