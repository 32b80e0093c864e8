"""The curator's catalogue drives the candidates method's allocation, over real processes.

Owners publish their private RFF sketches of the summarization features to the curator's
catalogue (``dpmarket sketch publish``, one OS process each, over mTLS); the curator, started with
``--allocation-sketch-spec``, splits the candidate budget by them. The networked session equals
the in-process session given the same sketches, bit for bit; before the sketches exist the same
curator falls back to the owners' noisy counts and says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.sketches.sketch import PrivateSketch
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.consumer.client import CuratorClient
from dpmarket.deploy.launcher import LocalCluster, sketch_declaration_toml
from dpmarket.experiments.runner import simulate
from dpmarket.experiments.scenarios import Scenario, write_scenario
from dpmarket.owner.ledger import OwnerLedger

pytestmark = pytest.mark.integration

K = 3
P = 12
SEED = 5
#: Fewer frequencies than the scenario's 2000: the test is about the wiring, not the quality.
FREQUENCIES = 64
SPEC = "digits/rff"
OWNER_POLICY = """
[budget]
epsilon = 10.0
delta = 1e-4
[session]
epsilon = 1.0
delta = 1e-6
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


@pytest.fixture(scope="module")
def deployment(
    digits: Scenario, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCluster, dict[str, Path]]]:
    directory = tmp_path_factory.mktemp("sketch-allocation")
    files = write_scenario(digits, directory / "data")
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    assert digits.domain_low is not None and digits.domain_high is not None
    spec_file = directory / "digits.toml"
    spec_file.write_text(
        sketch_declaration_toml(
            "digits",
            digits.domain_low,
            digits.domain_high,
            frequencies=FREQUENCIES,
            sigma=digits.sketch_sigma,
            delta=1e-6,
        ),
        encoding="utf-8",
    )
    names = [o.name for o in digits.owners[:K]]
    tables = {name: files[f"owner-{i}"] for i, name in enumerate(names)}
    with LocalCluster(
        list(tables.values()),
        names,
        directory / "logs",
        owner_policy=directory / "owner.toml",
        curator_policy=directory / "curator.toml",
        sketch_specs=[spec_file],
        sketch_seed=SEED,
        allocation_sketch_spec=SPEC,
    ) as cluster:
        yield cluster, tables


def _ledger(cluster: LocalCluster, owner: str) -> list[tuple[str, float, float, int]]:
    with OwnerLedger(cluster.owner_state(owner), None) as ledger:
        return [(e.mechanism, e.epsilon, e.delta, e.points) for e in ledger.entries()]


def test_the_catalogues_sketches_split_the_budget_as_the_same_sketches_do_in_process(
    deployment: tuple[LocalCluster, dict[str, Path]], digits: Scenario
) -> None:
    cluster, tables = deployment
    owners = digits.owners[:K]
    config = CandidatesConfig(summary_size=P)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        # No sketch published yet: the owners' noisy counts split the budget, and the report
        # says which owners lack a sketch.
        before = client.summarize(config, digits.validation, digits.seed_set, seed=SEED)
        counts = before.report.ledger.to_json()["candidates"]
        assert counts["allocation"] == "counts"
        assert counts["allocation_note"].startswith(
            f"no sketch published under {SPEC} by "
            + ", ".join(o.name for o in owners)
            + f" (dpmarket owner publish --spec {SPEC}): every owner is charged epsilon 1"
        ), counts

        cluster.publish_sketches(tables, cluster.log_dir / "publications", seed=SEED)
        # RFF sketches: every owner's is private (checked by the owner count below)
        published = {
            e.owner: e.sketch for e in client.sketches(SPEC) if isinstance(e.sketch, PrivateSketch)
        }
        assert sorted(published) == sorted(tables)
        networked = client.summarize(config, digits.validation, digits.seed_set, seed=SEED)

    allocation = networked.report.ledger.to_json()["candidates"]
    assert allocation["allocation"] == "sketch", allocation
    assert sum(allocation["shares"].values()) == allocation["budget"] == 3 * P
    local = simulate(
        owners, digits.validation, digits.seed_set, config, seed=SEED, owner_sketches=published
    )
    np.testing.assert_array_equal(networked.points, local.points)
    assert networked.owner_ids == local.owner_ids
    assert networked.report.ledger == local.report.ledger

    # Each owner's ledger: its one sketch (epsilon 1 at delta 1e-6, no raw point), the counts
    # session's terms, then raw points only: the sketch session spent no epsilon of any owner.
    released = 0
    for owner in tables:
        entries = _ledger(cluster, owner)
        sketches = [e for e in entries if e[0].startswith("private sketch")]
        assert sketches == [("private sketch (RFF, Gaussian)", 1.0, 1e-6, 0)]
        private = [e for e in entries if e[1] > 0 and not e[0].startswith("private sketch")]
        assert len(private) == 1, entries  # the counts session's terms, charged once
        released += sum(e[3] for e in entries)
    # Every raw point the curator received in the two sessions was charged once, by its owner.
    reports = (before.report, networked.report)
    assert released == sum(r.owner_points_accessed for r in reports)
