"""CAPE jobs priced, over real processes (issue 29): quoted before any owner opens them, capped by
the consumer, checked by each owner against its own prices, settled with a signed statement.

Two owner processes hold the diabetes tables of :mod:`tests.integration.test_cape` under a policy
that sets prices (per unit of epsilon, and a minimum above what the job's epsilon comes to, so
that both components count), and a curator process, over mTLS. A job over its ``--max-cost``
is refused before anything is opened, released or charged anywhere (the owners' ledgers, the
curator's store); the same job with the cap at its quote (the control) runs, is settled from
the owners' ledgers, and every owner records its line once.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from dpmarket.client import Consumer
from dpmarket.common.errors import DPMarketError, FailedPreconditionError
from dpmarket.common.market.money import epsilon_units, format_credits
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import NO_SUMMARY
from dpmarket.common.market.terms import MarketTerms, cape_quote
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.market import SettledStatement
from dpmarket.curator.store import DATABASE_FILE
from dpmarket.deploy.cli import main
from dpmarket.deploy.launcher import LocalCluster
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.runtime import cape_messages
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.market import market_terms_to_proto
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import cape_pb2, cape_pb2_grpc
from tests.integration.test_cape import (  # noqa: F401 (tables: a fixture)
    CALL_TIMEOUT,
    CURATOR,
    OWNER_POLICY,
    OWNERS,
    _mean,
    _start,
    _training,
    tables,
)

pytestmark = pytest.mark.integration

#: Per unit of epsilon 2 credits, at least 3 a job: a job at epsilon 1 costs 2 + a top-up of 1.
PRICES = OwnerPrices(per_epsilon=2_000_000, minimum=3_000_000)
PRICED_POLICY = OWNER_POLICY + '\n[prices]\nper_epsilon = "2"\nminimum = "3"\n'


@pytest.fixture(scope="module")
def priced(tables: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # noqa: F811
    directory = tmp_path_factory.mktemp("cape-priced")
    with _start(directory, OWNERS[:2], tables, PRICED_POLICY) as running:
        yield running


def _ledger_sizes(cluster: LocalCluster) -> dict[str, int]:
    out = {}
    for owner in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(owner), None) as ledger:
            out[owner] = len(ledger.entries())
    return out


def _curator_rows(cluster: LocalCluster) -> tuple[int, int, int]:
    """Jobs, charges and statements in the curator's durable store."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("sessions", "charges", "statements")
        )
    finally:
        conn.close()


def _mean_cli(cluster: LocalCluster, out: Path, *args: str) -> Any:
    return CliRunner().invoke(
        main,
        ["consumer", "cape", "mean", "--curator", cluster.curator_target,
         "--pki-dir", str(cluster.pki_dir), "--name", "consumer",
         "--feature", "c0=-0.2:0.2", "--epsilon", "1", "--out", str(out), *args],
        terminal_width=200,
    )  # fmt: skip


def _recorded_everywhere(cluster: LocalCluster, job: str) -> SettledStatement:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
            found = [s for s in client.statements() if s.statement.header.session_id == job]
        if found and found[0].owners_recorded == len(found[0].statement.lines):
            return found[0]
        time.sleep(0.2)
    pytest.fail(f"the statement of CAPE job {job[:8]} was not recorded by every owner in 60 s")


def test_a_cape_job_over_its_cap_charges_nothing_and_one_at_its_cap_is_settled(
    priced: LocalCluster, tmp_path: Path
) -> None:
    spec = _mean()
    quoted = cape_quote(dict.fromkeys(priced.owner_ids, PRICES), spec.cost[0])
    total = quoted.total
    assert total == 2 * 3_000_000  # each owner: 2 credits for epsilon 1, topped up to 3
    before, stored = _ledger_sizes(priced), _curator_rows(priced)

    refused = _mean_cli(priced, tmp_path / "refused.json", "--max-cost", format_credits(total - 1))
    assert refused.exit_code == 1, refused.output
    text = " ".join(refused.output.split())
    assert f"may cost up to {format_credits(total)} credits" in text
    assert "nothing was charged" in text
    assert _ledger_sizes(priced) == before, "an owner's ledger changed"
    assert _curator_rows(priced) == stored, "the curator stored a job, a charge or a statement"

    # Control: the same job with the cap at its quote runs, and is settled.
    ran = _mean_cli(priced, tmp_path / "ran.json", "--max-cost", format_credits(total), "--json")
    assert ran.exit_code == 0, ran.output
    report = json.loads((tmp_path / "ran.json").read_text(encoding="utf-8"))["report"]
    assert report["quote"]["total"] == total and 0 < report["cost"] <= total
    assert f"(quoted at most {format_credits(total)[:4]}" in " ".join(ran.output.split())
    (job,) = {e.session for o in priced.owner_ids for e in _new_entries(priced, before)[o]}
    settled = _recorded_everywhere(priced, job)
    statement = settled.statement
    assert statement.total == report["cost"] and statement.header.summary_size == 0
    for line in statement.lines:
        with OwnerLedger(priced.owner_state(line.owner), None) as ledger:
            epsilon = ledger.session_totals(job).epsilon
            earnings = [e for e in Earnings(ledger, line.owner).all() if e.session == job]
        assert line.points_read == 0 and line.epsilon_session == epsilon_units(epsilon)
        assert line.epsilon_charge == 2_000_000 and line.minimum_topup == 1_000_000
        assert len(earnings) == 1 and earnings[0].total == line.total == line.quoted


def test_a_cape_job_is_quoted_alone_and_nothing_is_opened_or_charged(
    priced: LocalCluster, tmp_path: Path
) -> None:
    """``cape mean --quote-only`` prints the job's quote (every owner's price at the job's
    epsilon, topped up to its minimum), as JSON and as a table, and stops: no owner's ledger
    changes, the curator stores no job, charge or statement, no file is written. A training is
    quoted the same way through the client API, at its whole epsilon; a quote above the cap is
    refused (FAILED_PRECONDITION) as the job itself would be."""
    spec = _mean()
    total = cape_quote(dict.fromkeys(priced.owner_ids, PRICES), spec.cost[0]).total
    before, stored = _ledger_sizes(priced), _curator_rows(priced)
    out = tmp_path / "mean.json"
    quoted = _mean_cli(priced, out, "--quote-only", "--json")
    assert quoted.exit_code == 0, quoted.output
    quote = json.loads(quoted.stdout)
    assert quote["total"] == total
    assert sorted(line["owner"] for line in quote["lines"]) == sorted(priced.owner_ids)
    table = _mean_cli(priced, out, "--quote-only")
    assert table.exit_code == 0, table.output
    assert f"quote for a CAPE mean: at most {format_credits(total)[:4]}" in table.output
    training = _training(epsilon=0.5)
    with CuratorClient(priced.curator_target, priced.consumer_security()) as client:
        trained = client.quote_cape(training)
        assert trained == cape_quote(dict.fromkeys(priced.owner_ids, PRICES), training.cost[0])
        with pytest.raises(FailedPreconditionError, match="more than its cap"):
            client.quote_cape(spec, max_cost=total - 1)
    with Consumer(priced.curator_target, priced.consumer_security()) as consumer:
        assert consumer.cape_quote(spec, max_cost=format_credits(total)).total == total
    assert not out.exists()
    assert _ledger_sizes(priced) == before, "an owner's ledger changed"
    assert _curator_rows(priced) == stored, "the curator stored a job, a charge or a statement"


def _new_entries(cluster: LocalCluster, before: dict[str, int]) -> dict[str, list[Any]]:
    out = {}
    for owner in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(owner), None) as ledger:
            out[owner] = ledger.entries()[before[owner] :]
    return out


def test_an_owner_refuses_a_cape_job_quoted_below_its_prices(priced: LocalCluster) -> None:
    """The deployment's curator certificate opens a job at one owner quoting one micro-credit
    below its prices, without a quote, and with its line above the terms' max_cost:
    FAILED_PRECONDITION, nothing charged; the honest quote, at the cap, opens (the control)."""
    spec = _mean()
    owner = priced.owner_ids[0]
    honest = cape_quote({owner: PRICES}, spec.cost[0]).line(owner).charge.total
    before = _ledger_sizes(priced)
    security = TransportSecurity.from_files(*identity_files(priced.pki_dir, CURATOR))
    target = priced.owner_targets[0]
    with sync_channel(target, security, Identity("owner", owner)) as channel:
        stub = cape_pb2_grpc.CapeSiteServiceStub(channel)

        def open_job(job: str, charge: int | None, cap: int | None = None) -> Any:
            market = None
            if charge is not None:
                cap = charge if cap is None else cap
                market = market_terms_to_proto(MarketTerms(0, charge, cap, NO_SUMMARY))
            request = cape_pb2.OpenCapeJobRequest(
                job_id=job, consumer="consumer:consumer", market=market
            )
            cape_messages.job_to_proto(request, spec)
            return stub.OpenCapeJob(request, timeout=CALL_TIMEOUT)

        for job, charge in (("low-" + "0" * 28, honest - 1), ("none-" + "0" * 27, None)):
            with pytest.raises(grpc.RpcError) as info:
                open_job(job, charge)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "prices" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as info:  # issue 25, B3: the line above the cap
            open_job("over-cap-" + "0" * 23, honest, cap=honest - 1)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "max_cost" in (info.value.details() or "")
        assert open_job("honest-" + "0" * 25, honest).num_rows > 0  # at the cap: opens
        stub.CloseCapeJob(cape_pb2.CloseCapeJobRequest(job_id="honest-" + "0" * 25))
    assert _ledger_sizes(priced) == before  # opening charges nothing; refusals neither


def _open_quoted(stub: Any, owner: str, job_id: str, epsilon: float) -> Any:
    """OpenCapeJob of :func:`_mean` at ``epsilon`` at one owner, under its honest line."""
    spec = _mean(epsilon=epsilon)
    line = cape_quote({owner: PRICES}, spec.cost[0]).line(owner).charge.total
    request = cape_pb2.OpenCapeJobRequest(
        job_id=job_id,
        consumer="consumer:consumer",
        market=market_terms_to_proto(MarketTerms(0, line, line, NO_SUMMARY)),
    )
    cape_messages.job_to_proto(request, spec)
    return stub.OpenCapeJob(request, timeout=CALL_TIMEOUT)


def test_a_settled_cape_job_id_is_refused_at_every_owner_whatever_its_terms(
    priced: LocalCluster, tmp_path: Path
) -> None:
    """A lying curator (the deployment's curator certificate) opens a CAPE job again under the
    id of one it ran and settled: every owner refuses it, FAILED_PRECONDITION "is settled",
    under a line at the job's epsilon and at another, before anything is read or charged (it
    opened, charged and released again, a charge no statement can pay). Control: a new id opens
    at every owner under the same line."""
    before = _ledger_sizes(priced)
    ran = _mean_cli(priced, tmp_path / "ran.json")
    assert ran.exit_code == 0, ran.output
    (job,) = {e.session for o in priced.owner_ids for e in _new_entries(priced, before)[o]}
    _recorded_everywhere(priced, job)
    settled = _ledger_sizes(priced)
    security = TransportSecurity.from_files(*identity_files(priced.pki_dir, CURATOR))
    for owner, target in zip(priced.owner_ids, priced.owner_targets, strict=True):
        with sync_channel(target, security, Identity("owner", owner)) as channel:
            stub = cape_pb2_grpc.CapeSiteServiceStub(channel)
            for epsilon in (1.0, 0.25):
                with pytest.raises(grpc.RpcError) as info:
                    _open_quoted(stub, owner, job, epsilon)
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "is settled" in (info.value.details() or "")
            fresh = "fresh-" + job[6:]
            assert _open_quoted(stub, owner, fresh, 1.0).num_rows > 0  # control: a new id
            stub.CloseCapeJob(cape_pb2.CloseCapeJobRequest(job_id=fresh))
    assert _ledger_sizes(priced) == settled, "an owner charged under a settled id"


def test_a_cape_cap_in_the_client_api_is_refused_before_anything_runs(
    priced: LocalCluster,
) -> None:
    """The client API's ``max_cost``: FailedPreconditionError, nothing stored."""
    spec = _mean(epsilon=0.5)
    stored = _curator_rows(priced)
    with (
        CuratorClient(priced.curator_target, priced.consumer_security()) as client,
        pytest.raises(FailedPreconditionError, match="more than its cap of 0"),
    ):
        client.estimate_cape_mean(spec, max_cost=0, timeout=CALL_TIMEOUT)
    assert _curator_rows(priced) == stored
    # dpmarket.client takes credits, as summarize does: the quote (3 credits, every owner's
    # minimum) is above a cap of "2.5" credits, refused the same way.
    with (
        Consumer(priced.curator_target, priced.consumer_security()) as consumer,
        pytest.raises(FailedPreconditionError, match=r"more than its cap of 2\.500000"),
    ):
        consumer.cape_mean(spec, max_cost="2.5", timeout=CALL_TIMEOUT)
    assert _curator_rows(priced) == stored


# ------------------------------------------------------------------- settlement whatever stops
#: 20 iterations (the curator policy's most) of 49 parameters: a training long enough that a
#: process killed at its first iteration's progress message stops it mid-way.
LONG_TRAINING = _training(iterations=20)


def _train_until_killed(cluster: LocalCluster, kill: Any) -> str:
    """Run :data:`LONG_TRAINING`, call ``kill()`` at its first progress message (its first
    iteration released: every owner charged its ledger), and return the job's id (from the
    owners' ledgers); the training fails."""
    before = _ledger_sizes(cluster)
    killed: list[bool] = []

    def on_progress(done: int, total: int) -> None:
        if done >= 1 and not killed:
            killed.append(True)
            kill()

    with (
        CuratorClient(cluster.curator_target, cluster.consumer_security()) as client,
        pytest.raises(DPMarketError) as failed,
    ):
        client.train_cape(LONG_TRAINING, timeout=CALL_TIMEOUT, on_progress=on_progress)
    assert killed, f"the training ended before its first progress message: {failed.value!r}"
    jobs = {e.session for entries in _new_entries(cluster, before).values() for e in entries}
    assert len(jobs) == 1, jobs
    return jobs.pop()


def _job_statements(cluster: LocalCluster, job: str) -> int:
    """Statements of ``job`` in the curator's store."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        query = "SELECT COUNT(*) FROM statements WHERE session = ?"
        return int(conn.execute(query, (job,)).fetchone()[0])
    finally:
        conn.close()


def _unrecorded(cluster: LocalCluster, job: str) -> list[str]:
    """The owners whose record of ``job`` the curator does not have."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        query = "SELECT owner FROM owner_spend WHERE session = ? AND unknown != '' ORDER BY owner"
        return [str(r[0]) for r in conn.execute(query, (job,)).fetchall()]
    finally:
        conn.close()


def _check_job_settled(cluster: LocalCluster, job: str) -> None:
    """One statement of ``job``, every owner's line its own ledger's record of it (the epsilon
    it charged), recorded by that owner exactly once, its earning equal to its line."""
    settled = _recorded_everywhere(cluster, job)
    assert _job_statements(cluster, job) == 1
    statement = settled.statement
    assert sorted(line.owner for line in statement.lines) == sorted(cluster.owner_ids)
    for line in statement.lines:
        with OwnerLedger(cluster.owner_state(line.owner), None) as ledger:
            epsilon = ledger.session_totals(job).epsilon
            earnings = [e for e in Earnings(ledger, line.owner).all() if e.session == job]
        assert epsilon > 0 and line.epsilon_session == epsilon_units(epsilon)
        assert len(earnings) == 1, f"{line.owner} recorded job {job[:8]} {len(earnings)} times"
        assert earnings[0].statement.line == line and earnings[0].total == line.total
    assert statement.total == sum(line.total for line in statement.lines)


def test_a_cape_job_whose_owner_is_down_at_close_is_settled_once_it_is_back(
    priced: LocalCluster,
) -> None:
    """An owner killed (-9) during a training, after it charged its ledger, is down when the job
    closes: the curator has no record of it and settles nothing. Brought back on the same
    address, it answers the curator's background retry (CloseCapeJob, from its ledger: it no
    longer holds the job) — no curator restart — then the job is settled and every owner records
    its line exactly once. (Control: while the owner is down, nothing is settled.)"""
    curator = priced.curator_process
    down = priced.owner_ids[0]
    job = _train_until_killed(priced, lambda: priced.kill_owner(0))
    try:
        assert _unrecorded(priced, job) == [down]
        time.sleep(2.0)  # the background retry asks the dead owner
        assert _job_statements(priced, job) == 0 and _unrecorded(priced, job) == [down]
    finally:
        priced.restart_owner(0)
    _check_job_settled(priced, job)
    assert priced.curator_process is curator and curator is not None and curator.poll() is None
    assert _unrecorded(priced, job) == []


@pytest.mark.slow
def test_a_curator_killed_mid_cape_job_settles_it_from_the_owners_records_after_restart(
    priced: LocalCluster,
) -> None:
    """kill -9 of the curator during a training, after every owner charged its ledger: the
    restarted curator asks the owners for their records (CloseCapeJob) and settles the job from
    them; one statement, every owner's earnings equal to it, recorded once."""
    job = _train_until_killed(priced, priced.kill_curator)
    assert _job_statements(priced, job) == 0
    priced.start_curator()
    _check_job_settled(priced, job)
