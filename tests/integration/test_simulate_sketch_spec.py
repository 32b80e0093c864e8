"""``dpmarket simulate --sketch-spec`` equals the networked session for a user-declared spec.

A user's own data (the suite's wine table, three owners) and its own catalogue declaration (an
RFF map over the columns ``f0 .. f12`` with a kernel scale of its choosing): the curator serves
the declaration (``serve-curator --sketch-spec``, its parameters drawn from ``--sketch-seed``),
each owner publishes its sketch from its own OS process (``dpmarket sketch publish --seed``),
and a consumer's session splits its budget by them. ``dpmarket simulate`` in another process,
given the same declaration file, the same seeds and the owners' files, releases the sketches in
process and returns the same summary, bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.consumer.client import CuratorClient
from dpmarket.deploy.launcher import LocalCluster
from dpmarket.experiments.scenarios import write_scenario
from dpmarket.experiments.suite import suite_scenario

pytestmark = pytest.mark.integration

P = 8
SEED = 11
OWNER_POLICY = """
[budget]
epsilon = 10.0
delta = 1e-4
[session]
epsilon = 1.0
delta = 1e-6
points_fraction = 1.0  # as simulate's owners, which run without a policy: the same allowance
[sketches]
publish = true
epsilon = 1.0
[access]
allow_steered_selection = true   # the candidates method's rows
"""
CURATOR_POLICY = """
[sessions]
per_consumer_per_minute = 1000
"""


def _declaration(low: np.ndarray, high: np.ndarray) -> str:
    """A user's declaration: its own name, 48 frequencies, sigma 1.7 in the columns' units."""
    columns = ",\n".join(
        f'  {{ name = "f{j}", low = {lo!r}, high = {hi!r} }}'
        for j, (lo, hi) in enumerate(zip(low.tolist(), high.tolist(), strict=True))
    )
    return (
        'name = "mywine"\n'
        f"columns = [\n{columns},\n]\n\n"
        '[mechanism]\nnoise = "gaussian"\nepsilon = 1.0\nepsilon_range = [1.0, 1.0]\n'
        "delta = 1e-6\n\n"
        '[maps.rff]\nfrequencies = 48\nsigma = 1.7\nscale = "absolute"\n'
    )


def test_simulate_with_a_declared_spec_gives_the_networked_summary(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    scenario = suite_scenario("wine-3")
    directory = tmp_path_factory.mktemp("simulate-spec")
    files = write_scenario(scenario, directory / "data")
    assert scenario.domain_low is not None and scenario.domain_high is not None
    spec_file = directory / "mywine.toml"
    spec_file.write_text(_declaration(scenario.domain_low, scenario.domain_high), encoding="utf-8")
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    names = [f"owner-{i}" for i in range(len(scenario.owners))]  # the files' stems
    tables = {name: files[name] for name in names}
    config = CandidatesConfig(summary_size=P, gamma=scenario.gamma)
    with LocalCluster(
        list(tables.values()),
        names,
        directory / "logs",
        owner_policy=directory / "owner.toml",
        curator_policy=directory / "curator.toml",
        sketch_specs=[spec_file],
        sketch_seed=SEED,
        allocation_sketch_spec="mywine/rff",
    ) as cluster:
        cluster.publish_sketches(tables, directory / "publications", seed=SEED)
        with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
            networked = client.summarize(config, scenario.validation, scenario.seed_set, seed=SEED)
    assert networked.report.ledger.to_json()["candidates"]["allocation"] == "sketch"

    out, report = directory / "summary.npy", directory / "report.json"
    command = [
        sys.executable, "-m", "dpmarket.deploy.cli", "simulate",
        *(arg for name in names for arg in ("--owner-data", str(tables[name]))),
        "--validation", str(files["validation"]), "-p", str(P),
        "--gamma", repr(scenario.gamma), "--test", str(files["test"]),
        "--sketch-spec", str(spec_file), "--sketch-seed", str(SEED), "--seed", str(SEED),
        "--out", str(out), "--report", str(report),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    np.testing.assert_array_equal(np.load(out), networked.points)
    ledger = json.loads(report.read_text(encoding="utf-8"))["result"]["ledger"]
    assert (
        ledger["candidates"]["shares"] == networked.report.ledger.to_json()["candidates"]["shares"]
    )
    assert ledger["candidates"]["noisy_relevance"] == pytest.approx(
        networked.report.ledger.to_json()["candidates"]["noisy_relevance"], rel=0, abs=0
    )
