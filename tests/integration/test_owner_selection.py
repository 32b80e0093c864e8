"""An exhausted owner no longer blocks every summarization, with real processes.

Five owner processes and a curator process over mTLS, under the shipped default policies; one
owner's durable ledger has spent its lifetime budget before it starts. A consumer runs
``dpmarket request`` as a newcomer would: without ``--min-owners`` the request fails and nothing
is spent anywhere; with ``--min-owners 4`` the session runs without the exhausted owner, the
report names it and why, and its ledger is unchanged; ``--exclude-owner`` leaves an owner out by
name; a killed owner is "unreachable".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.deploy.cli import main
from dpmarket.deploy.launcher import LocalCluster
from dpmarket.experiments.scenarios import Scenario, write_scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from tests.conftest import exhaust

pytestmark = pytest.mark.integration

K = 5
P = 15


@pytest.fixture(scope="module")
def cluster(digits: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    files = write_scenario(digits, tmp_path_factory.mktemp("digits"))
    state = tmp_path_factory.mktemp("state")
    names = [o.name for o in digits.owners[:K]]
    exhausted = names[-1]
    with OwnerLedger.create(state / f"owner-{exhausted}", OwnerPolicy()) as ledger:
        exhaust(ledger)  # the default lifetime budget, epsilon 10, spent before
    with LocalCluster(
        [files[f"owner-{i}"] for i in range(K)],
        names,
        tmp_path_factory.mktemp("logs"),
        state_dir=state,
    ) as c:
        yield c


def _entries(cluster: LocalCluster) -> dict[str, int]:
    out = {}
    for name in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(name), None) as ledger:
            out[name] = len(ledger.entries())
    return out


def _request(cluster: LocalCluster, tmp_path: Path, digits: Scenario, *args: str) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    validation = tmp_path / "validation.npy"
    np.save(validation, digits.validation)
    return CliRunner().invoke(
        main,
        ["request", "--curator", cluster.curator_target, "--pki-dir", str(cluster.pki_dir),
         "--name", "consumer", "--validation", str(validation), "-p", str(P),
         "--method", "candidates", "--out", str(tmp_path / "summary.npy"),
         "--report", str(tmp_path / "report.json"), *args],
        terminal_width=200,
    )  # fmt: skip


def test_an_exhausted_owner_is_left_out_only_when_the_consumer_allows_it(
    cluster: LocalCluster, digits: Scenario, tmp_path: Path
) -> None:
    exhausted = cluster.owner_ids[-1]
    before = _entries(cluster)
    assert before[exhausted] == 5

    refused = _request(cluster, tmp_path / "default", digits)
    assert refused.exit_code == 1
    text = " ".join(refused.output.split())
    assert f"left out: {exhausted} (budget refused)" in text and "needs all 5" in text
    assert "spent" not in text  # the owner's figures are for the curator only
    assert _entries(cluster) == before  # nothing charged anywhere

    plot = tmp_path / "min4" / "plot.png"
    ran = _request(cluster, tmp_path / "min4", digits, "--min-owners", "4", "--plot", str(plot))
    assert ran.exit_code == 0, ran.output
    # The session's id comes first, as soon as it is created (a curator lost afterwards leaves
    # the consumer knowing which session to ask about).
    created = re.search(r"session (\S+) created", ran.output)
    assert created is not None and ran.output.index(created[0]) < ran.output.index("left out")
    assert f"left out: {exhausted} (budget refused)" in ran.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "min4" / "report.json").read_text(encoding="utf-8"))
    result = report["result"]
    assert result["left_out"] == {exhausted: "budget refused"}
    assert exhausted not in result["points_per_owner"]
    assert sorted(result["owner_spend"]) == sorted(cluster.owner_ids[:-1])
    assert all(s["epsilon"] == pytest.approx(1.0) for s in result["owner_spend"].values())
    after = _entries(cluster)
    assert after[exhausted] == before[exhausted]  # the exhausted owner was charged nothing
    assert all(after[o] > before[o] for o in cluster.owner_ids[:-1])  # the others paid


def test_excluded_and_unreachable_owners_are_named_in_the_report(
    cluster: LocalCluster, digits: Scenario, tmp_path: Path
) -> None:
    excluded, killed, exhausted = cluster.owner_ids[0], cluster.owner_ids[1], cluster.owner_ids[-1]
    before = _entries(cluster)
    cluster.kill_owner(1)
    ran = _request(
        cluster, tmp_path, digits, "--min-owners", "2", "--exclude-owner", excluded, "--json"
    )
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.stdout)["result"]  # --json: the report on stdout, no table
    assert report == json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["result"]
    assert report["left_out"] == {
        excluded: "excluded by the consumer",
        killed: "unreachable",
        exhausted: "budget refused",
    }
    after = _entries(cluster)
    assert after[excluded] == before[excluded] and after[exhausted] == before[exhausted]
    assert sorted(report["points_per_owner"]) <= sorted(cluster.owner_ids[2:4])
