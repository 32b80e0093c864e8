"""The market over real processes: prices, quotes and the consumer's cap (issue 29).

Three owner processes whose policies set prices, and a curator process, over mTLS. A consumer
asks for a quote without running anything; a request over its ``--max-cost`` is refused before
anything is released or charged anywhere (the owners' ledgers and the curator's store are
unchanged), and the same request under a cap that covers its quote runs (the control: the cap
alone stopped it). A curator that quotes an owner below its prices is refused by the owner, and
an owner releases no more raw points than its line of the quote.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.market.money import epsilon_units, format_credits
from dpmarket.common.market.payouts import PAYOUT_CHARGE_LABEL
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    SessionRecord,
    SettlementTerms,
    StatementError,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import (
    MarketTerms,
    RewardOffer,
    check_quote,
    owner_payout_epsilon,
    session_quote,
)
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.consumer.cli import charge_lines
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.market import SettledStatement, credits
from dpmarket.consumer.report import epsilon_summary
from dpmarket.curator.store import DATABASE_FILE
from dpmarket.deploy.cli import main
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.experiments.scenarios import Scenario, write_scenario
from dpmarket.owner.earnings import Earning, Earnings, payout_session
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.market import market_terms_to_proto
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import market_pb2, owner_pb2, owner_pb2_grpc

pytestmark = pytest.mark.integration

K = 3
P = 12
PRICES = """
[budget]   # the module's three dozen sessions on one cluster: room for all (the default 10
epsilon = 100.0   # was nearly spent by the last, so one more session elsewhere refused it)
delta = 1e-3

[access]
allow_steered_selection = true   # the candidates method, the consumer's default
allow_reward_disclosure = true   # the reward sessions: each owner consents to its count

[prices]
per_point_read = "0.01"
per_point_delivered = "0.05"
per_epsilon = "2"
minimum = "1"
"""
OWNER_PRICES = OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)
CURATOR = Identity("curator", CURATOR_NAME)
CALL_TIMEOUT = 60.0
FAILED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(scope="module")
def market(digits: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    files = write_scenario(digits, tmp_path_factory.mktemp("digits"))
    directory = tmp_path_factory.mktemp("market")
    (directory / "owner.toml").write_text(PRICES, encoding="utf-8")
    with LocalCluster(
        [files[f"owner-{i}"] for i in range(K)],
        [o.name for o in digits.owners[:K]],
        directory / "logs",
        state_dir=directory / "state",
        owner_policy=directory / "owner.toml",
        allow_seeded_sessions=True,
    ) as cluster:
        yield cluster


def _ledger_sizes(cluster: LocalCluster) -> dict[str, int]:
    out = {}
    for name in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(name), None) as ledger:
            out[name] = len(ledger.entries())
    return out


def _curator_rows(cluster: LocalCluster) -> tuple[int, int]:
    """Sessions and charges in the curator's durable store."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        sessions = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        charges = conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
    finally:
        conn.close()
    return int(sessions), int(charges)


def _request(cluster: LocalCluster, directory: Path, digits: Scenario, *args: str) -> Any:
    directory.mkdir(parents=True, exist_ok=True)
    validation = directory / "validation.npy"
    np.save(validation, digits.validation)
    return CliRunner().invoke(
        main,
        ["consumer", "request", "--curator", cluster.curator_target,
         "--pki-dir", str(cluster.pki_dir), "--name", "consumer",
         "--validation", str(validation), "-p", str(P),
         "--method", "candidates", "--seed", "3", "--out", str(directory / "summary.npy"),
         "--report", str(directory / "report.json"), *args],
        terminal_width=200,
    )  # fmt: skip


def test_a_request_over_its_cap_is_refused_before_anything_is_released_or_charged(
    market: LocalCluster, digits: Scenario, tmp_path: Path
) -> None:
    before, stored = _ledger_sizes(market), _curator_rows(market)
    quoted = _request(market, tmp_path / "quote", digits, "--quote-only", "--json")
    assert quoted.exit_code == 0, quoted.output
    quote = json.loads(quoted.stdout)
    total = quote["total"]
    assert sorted(line["owner"] for line in quote["lines"]) == sorted(market.owner_ids)
    # Every owner's line is at least its own prices at the line's limits.
    for line in quote["lines"]:
        read, delivered = line["limits"]["max_points_read"], line["charge"]["points_delivered"]
        assert line["charge"]["read"] == read * OWNER_PRICES.per_point_read
        assert line["charge"]["delivered"] == delivered * OWNER_PRICES.per_point_delivered
    assert not (tmp_path / "quote" / "summary.npy").exists()  # --quote-only writes nothing
    table = _request(market, tmp_path / "quote-table", digits, "--quote-only")
    assert table.exit_code == 0 and f"at most {credits(total)} credits" in table.output
    assert _ledger_sizes(market) == before and _curator_rows(market) == stored

    cap = format_credits(total - 1)  # one micro-credit short
    refused = _request(market, tmp_path / "refused", digits, "--max-cost", cap)
    assert refused.exit_code == 1
    text = " ".join(refused.output.split())
    assert f"more than its cap of {cap}:" in text and "nothing was charged" in text
    assert _ledger_sizes(market) == before, "an owner's ledger changed"
    assert _curator_rows(market) == stored, "the curator stored a session or a charge"

    # Control: the same request under a cap that covers the quote runs, and charges.
    ran = _request(market, tmp_path / "ran", digits, "--max-cost", format_credits(total))
    assert ran.exit_code == 0, ran.output
    assert f"quote: at most {credits(total)} credits" in " ".join(ran.output.split())
    after = _ledger_sizes(market)
    assert any(after[o] > before[o] for o in market.owner_ids)
    assert _curator_rows(market)[0] == stored[0] + 1


def _open(
    stub: Any,
    sid: str,
    digits: Scenario,
    market: MarketTerms | None,
    epsilon: float = 0.5,
    method: owner_pb2.SessionMethod.ValueType = owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS,
) -> Any:
    rff = draw_rff_params(digits.n_features, 16, 0.5, np.random.default_rng(1))
    terms = owner_pb2.SessionTerms(
        method=method,
        epsilon=epsilon,
        market=None if market is None else market_terms_to_proto(market),
    )
    return stub.OpenSession(
        owner_pb2.OpenSessionRequest(
            session_id=sid,
            omega=array_to_proto(rff.omega),
            phase=array_to_proto(rff.phase),
            sampling_seed=1,
            gamma=rff.gamma,
            consumer="consumer:consumer",
            terms=terms,
        ),
        timeout=CALL_TIMEOUT,
    )


def test_an_owner_refuses_a_quote_below_its_prices_and_releases_no_more_than_its_line(
    market: LocalCluster, digits: Scenario
) -> None:
    """A curator (the deployment's own certificate) lowballs an owner by one micro-credit:
    FAILED_PRECONDITION naming the prices, nothing charged; terms without a quote are refused by
    a priced owner too, and so are terms whose line is above the consumer's cap they carry.
    Control: the honest quote, at the cap, opens, and the owner's allowance is the line's
    ``max_points_read``."""
    owner = market.owner_ids[0]
    settlement = SettlementTerms(summary_size=P, validation_size=len(digits.validation))
    own = check_quote(OWNER_PRICES, MarketTerms(4, 10**12, 10**12, settlement), 0.5, owner=owner)
    honest = MarketTerms(4, own, own, settlement)  # at the consumer's cap: opens
    low = MarketTerms(4, own - 1, own - 1, settlement)
    over_cap = MarketTerms(4, own, own - 1, settlement)  # the line above the terms' max_cost
    before = _ledger_sizes(market)
    security = TransportSecurity.from_files(*identity_files(market.pki_dir, CURATOR))
    with sync_channel(market.owner_targets[0], security, Identity("owner", owner)) as channel:
        stub = owner_pb2_grpc.OwnerServiceStub(channel)
        for sid, terms, says in (
            ("lowball", low, "prices"),
            ("no-quote", None, "prices"),
            ("over-cap", over_cap, "max_cost"),  # issue 25, B3
        ):
            with pytest.raises(grpc.RpcError) as info:
                _open(stub, sid, digits, terms)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = info.value.details() or ""
            assert says in details and "Traceback" not in details
        opened = _open(stub, "honest", digits, honest)
        assert opened.max_points == 4  # no more than the line's max_points_read
        stub.CloseSession(owner_pb2.CloseSessionRequest(session_id="honest"), timeout=CALL_TIMEOUT)
    assert _ledger_sizes(market) == before  # opening charges nothing; refusals neither


def test_a_session_id_reads_one_quote_line_across_its_opens_and_never_reopens_once_settled(
    market: LocalCluster, digits: Scenario
) -> None:
    """A curator (the deployment's own certificate) reopens one session id under a quote line
    of 4 points read: the reopen may read only what the line has left (0 after 4 points read;
    the control, on main: 4 more), so the owner's record stays one its line can pay; once the
    statement of those 4 points is recorded, the id is refused at reopen (FAILED_PRECONDITION),
    nothing charged, and the ledger still holds the 4 points the earnings state."""
    owner = market.owner_ids[1]
    settlement = SettlementTerms(summary_size=P, validation_size=len(digits.validation))
    quoted = session_quote({owner: OWNER_PRICES}, {owner: 4}, 0.0, settlement)
    line = MarketTerms.of(quoted, owner, settlement)
    uniform = owner_pb2.SESSION_METHOD_UNIFORM
    sid = "reopen-" + uuid.uuid4().hex
    security = TransportSecurity.from_files(*identity_files(market.pki_dir, CURATOR))
    with sync_channel(market.owner_targets[1], security, Identity("owner", owner)) as channel:
        stub = owner_pb2_grpc.OwnerServiceStub(channel)

        def sample(count: int) -> Any:
            request = owner_pb2.SampleUniformRequest(session_id=sid, count=count)
            return stub.SampleUniform(request, timeout=CALL_TIMEOUT)

        def close() -> Any:
            request = owner_pb2.CloseSessionRequest(session_id=sid)
            return stub.CloseSession(request, timeout=CALL_TIMEOUT)

        assert _open(stub, sid, digits, line, 0.0, uniform).max_points == 4
        assert sample(4).points.shape == [4, digits.n_features]
        close()
        # Another line (9 points, epsilon 0.5 for candidates-counts): the id's terms are those
        # of its first open; refused before anything is read (main: opened, 5 more points).
        other = MarketTerms.of(
            session_quote({owner: OWNER_PRICES}, {owner: 9}, 0.5, settlement), owner, settlement
        )
        before = _ledger_sizes(market)
        with pytest.raises(grpc.RpcError) as info:
            _open(stub, sid, digits, other, 0.5)
        assert info.value.code() == FAILED and "another quote line" in (info.value.details() or "")
        assert _ledger_sizes(market) == before
        assert _open(stub, sid, digits, line, 0.0, uniform).max_points == 0  # main: 4
        with pytest.raises(grpc.RpcError) as info:
            sample(4)
        assert info.value.code() == FAILED
        spent = close().spent
        assert spent.points == 4 and _ledger_points(market, owner, sid)[0] == 4
        record = SessionRecord(points_read=4, points_delivered=0, epsilon_session=0.0)
        statement = settle(sid, "consumer:consumer", quoted, {owner: OWNER_PRICES}, {owner: record})
        part = statement.for_owner(owner)
        request = owner_pb2.RecordStatementRequest(
            statement=market_pb2.SignedStatement(
                statement=part.encode(), signature=sign_statement(part, _curator_key(market))
            )
        )
        assert stub.RecordStatement(request, timeout=CALL_TIMEOUT).recorded_now
        before = _ledger_sizes(market)
        with pytest.raises(grpc.RpcError) as info:
            _open(stub, sid, digits, line, 0.0, uniform)  # main: opens, 4 more points
        assert info.value.code() == FAILED and "settled" in (info.value.details() or "")
    assert _ledger_sizes(market) == before
    (earned,) = [e for e in _earnings(market)[owner] if e.session == sid]
    assert earned.statement.line.points_read == _ledger_points(market, owner, sid)[0] == 4


# ------------------------------------------------------------------------------ settlement
def _earnings(cluster: LocalCluster) -> dict[str, list[Earning]]:
    out = {}
    for name in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(name), None) as ledger:
            out[name] = Earnings(ledger, name).all()
    return out


def _ledger_points(cluster: LocalCluster, owner: str, session: str) -> tuple[int, float]:
    with OwnerLedger(cluster.owner_state(owner), None) as ledger:
        totals = ledger.session_totals(session)
    return int(totals.points), float(totals.epsilon)


def _check_settled(cluster: LocalCluster, settled: SettledStatement) -> None:
    """Every owner of the statement recorded exactly its line, which is its own ledger's
    record of the session; the owners' totals add up to the statement's."""
    statement = settled.statement
    earnings = _earnings(cluster)
    assert settled.owners_recorded == len(statement.lines)
    for line in statement.lines:
        mine = [e for e in earnings[line.owner] if e.session == statement.header.session_id]
        assert len(mine) == 1, f"{line.owner} recorded the session {len(mine)} times"
        assert mine[0].statement.line == line and mine[0].total == line.total
        points, epsilon = _ledger_points(cluster, line.owner, statement.header.session_id)
        assert line.points_read == points
        assert line.epsilon_session == epsilon_units(epsilon)
    assert statement.total == sum(line.total for line in statement.lines)


def _curator_key(cluster: LocalCluster) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(
        identity_files(cluster.pki_dir, CURATOR)[2].read_bytes(), password=None
    )
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def test_a_session_is_settled_from_the_owners_records_and_each_owner_checks_its_line(
    market: LocalCluster, digits: Scenario
) -> None:
    """The curator settles a finished session from each owner's own record, signs it, stores it
    and delivers each owner its line; every owner's earnings equal the statement. A tampered
    line (the signature kept) is refused with INVALID_ARGUMENT, a line the curator signs but
    that claims more points than the owner's ledger released with FAILED_PRECONDITION, and a
    second delivery of the genuine line is recorded once."""
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    with CuratorClient(market.curator_target, market.consumer_security()) as client:
        result = client.summarize(config, digits.validation, seeds, seed=11)
        (newest,) = client.statements(limit=1)
    settled = _settled_everywhere(market, newest.session_id)  # delivered off the consumer's path
    statement = settled.statement
    assert result.report.cost == statement.total > 0
    assert result.report.quote is not None and statement.total <= result.report.quote.total
    # Issue 25, F5: no line tells its owner how many of its points the summary holds (a function
    # of D_v and of the other owners' points): without a reward each owner is paid as delivered
    # its points read up to p. The control: the summary's counts differ from them (main's lines
    # stated those counts).
    delivered = {o: result.owner_ids.count(o) for o in set(result.owner_ids)}
    stated = {line.owner: line.points_delivered for line in statement.lines}
    assert stated == {line.owner: min(line.points_read, P) for line in statement.lines}
    assert any(stated[o] != delivered.get(o, 0) for o in stated)
    for line in statement.lines:
        assert line.delivered_charge == stated[line.owner] * OWNER_PRICES.per_point_delivered
    _check_settled(market, settled)

    owner = statement.lines[0].owner
    part = statement.for_owner(owner)
    genuine = part.encode()
    signature = sign_statement(part, _curator_key(market))
    forged = dataclasses.replace(
        part, line=dataclasses.replace(part.line, reward=part.line.reward + 1)
    ).encode()
    lying = dataclasses.replace(
        part,
        line=dataclasses.replace(
            part.line,
            points_read=part.line.points_read + 1,
            read_charge=part.line.read_charge + OWNER_PRICES.per_point_read,
        ),
    )
    before = _earnings(market)
    security = TransportSecurity.from_files(*identity_files(market.pki_dir, CURATOR))
    target = market.owner_targets[market.owner_ids.index(owner)]
    with sync_channel(target, security, Identity("owner", owner)) as channel:
        stub = owner_pb2_grpc.OwnerServiceStub(channel)

        def deliver(data: bytes, sig: bytes) -> Any:
            request = owner_pb2.RecordStatementRequest(
                statement=market_pb2.SignedStatement(statement=data, signature=sig)
            )
            return stub.RecordStatement(request, timeout=CALL_TIMEOUT)

        # Issue 25, B3: the line above the consumer's cap its header states.
        over_cap = dataclasses.replace(
            part, header=dataclasses.replace(part.header, max_cost=part.line.total - 1)
        )
        # A reward added after the session opened without one (the curator signs it): the
        # owner checks the header against the settlement it accepted, so the reward it never
        # consented to for this session is refused, and the count its line states with it.
        offered = RewardOffer("value", 5_000_000, 1.0).settlement(P, len(digits.validation))
        fields = offered.header_fields()
        header = dataclasses.replace(
            part.header,
            reward_rule="value",
            reward=5_000_000,
            payout_epsilon=int(fields["payout_epsilon"]),
            noise_scale=int(fields["noise_scale"]),
            point_mean=int(fields["point_mean"]),
            point_spread=int(fields["point_spread"]),
        )
        rewarded = dataclasses.replace(
            part, header=header, line=dataclasses.replace(part.line, reward=1)
        )
        for data, sig, code in (
            (forged, signature, grpc.StatusCode.INVALID_ARGUMENT),
            (lying.encode(), sign_statement(lying, _curator_key(market)), FAILED),
            (over_cap.encode(), sign_statement(over_cap, _curator_key(market)), FAILED),
            (rewarded.encode(), sign_statement(rewarded, _curator_key(market)), FAILED),
        ):
            with pytest.raises(grpc.RpcError) as info:
                deliver(data, sig)
            assert info.value.code() == code, info.value.details()
        again = deliver(genuine, signature)  # the genuine line, delivered a second time
    assert not again.recorded_now and again.total == part.line.total
    assert _earnings(market) == before  # nothing recorded twice, nothing refused recorded


def _wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen within {seconds:.0f} s")


def _statement_of(cluster: LocalCluster, sid: str) -> SettledStatement | None:
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        found = client.statements(sid)
    return found[0] if found else None


def _last_event(cluster: LocalCluster, sid: str) -> Any:
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        last = None
        for event, _ in client.watch(sid):
            last = event
    return last


def _statements_count(cluster: LocalCluster) -> int:
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM statements").fetchone()[0])
    finally:
        conn.close()


def _settled_everywhere(cluster: LocalCluster, sid: str) -> SettledStatement:
    _wait_for(
        lambda: (
            (s := _statement_of(cluster, sid)) is not None
            and s.owners_recorded == len(s.statement.lines)
        ),
        90.0,
        f"the settlement of session {sid[:8]} at every owner",
    )
    settled = _statement_of(cluster, sid)
    assert settled is not None
    return settled


@pytest.mark.slow
def test_a_curator_killed_mid_session_settles_it_from_the_owners_records_after_restart(
    market: LocalCluster, digits: Scenario
) -> None:
    """kill -9 of the curator as soon as the session opened at its owners: after the restart
    the curator asks the owners for their records and settles the session from them (no point
    delivered: the session failed); every owner's earnings equal the statement, once."""
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    statements = _statements_count(market)
    with CuratorClient(market.curator_target, market.consumer_security()) as client:
        sid = client.create_session(config, digits.validation, seeds, seed=12)
        for _event in client.watch(sid):
            market.kill_curator()  # at the first event: the owners hold the session
            break
    market.start_curator()
    settled = _settled_everywhere(market, sid)
    last = _last_event(market, sid)
    if last.stage == "failed":  # killed before it finished (else a finished session's case)
        assert all(line.points_delivered == 0 for line in settled.statement.lines)
    _check_settled(market, settled)
    assert _statements_count(market) == statements + 1


def test_a_curator_killed_before_delivering_a_statement_delivers_it_after_restart_once(
    market: LocalCluster, digits: Scenario
) -> None:
    """kill -9 of the curator after a session was settled, its owners' deliveries not marked
    (the state of a curator killed between the transaction that completes the session with its
    statement and the deliveries): after the restart every part is delivered again, recorded
    once; no session has two statements; every owner's earnings equal the statement."""
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    with CuratorClient(market.curator_target, market.consumer_security()) as client:
        done = client.create_session(config, digits.validation, seeds, seed=13)
        for _ in client.watch(done):
            pass
    _settled_everywhere(market, done)
    market.kill_curator()
    before, statements = _earnings(market), _statements_count(market)
    conn = sqlite3.connect(market.curator_state / DATABASE_FILE)
    try:
        with conn:
            conn.execute(
                "UPDATE statement_deliveries SET delivered_at = NULL WHERE session = ?", (done,)
            )
    finally:
        conn.close()
    assert (pending := _statement_count_pending(market, done)) == len(market.owner_ids), pending
    market.start_curator()
    settled = _settled_everywhere(market, done)
    _check_settled(market, settled)
    assert _earnings(market) == before  # delivered again, recorded once
    assert _statements_count(market) == statements


def _stored_statement(
    cluster: LocalCluster, sid: str, row: tuple[bytes, bytes] | None = None
) -> Any:
    """The stored ``(statement, signature)`` of a session; with ``row``, overwrite them first
    (the store of a curator that lies: what it then serves)."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        if row is not None:
            with conn:
                conn.execute(
                    "UPDATE statements SET statement = ?, signature = ? WHERE session = ?",
                    (*row, sid),
                )
        data, signature = conn.execute(
            "SELECT statement, signature FROM statements WHERE session = ?", (sid,)
        ).fetchone()
    finally:
        conn.close()
    return bytes(data), bytes(signature)


def _statements_cli(cluster: LocalCluster, sid: str) -> Any:
    return CliRunner().invoke(
        main,
        ["consumer", "statements", "--curator", cluster.curator_target,
         "--pki-dir", str(cluster.pki_dir), "--name", "consumer", "--session", sid, "--json"],
        terminal_width=200,
    )  # fmt: skip


def test_the_consumer_refuses_a_statement_its_curator_did_not_sign(
    market: LocalCluster, digits: Scenario
) -> None:
    """The consumer checks every statement's signature with the key of the curator's
    certificate (deployment CA, identity curator:<name>) before it shows it. A statement the
    curator's store then serves tampered (one owner's reward raised, the signature kept), or
    unsigned, is refused by the client API and by ``consumer statements`` with an error naming
    the session; the genuine statement (the control, before and after) is shown."""
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    with CuratorClient(market.curator_target, market.consumer_security()) as client:
        sid = client.create_session(config, digits.validation, seeds, seed=14)
        for _ in client.watch(sid):
            pass
        (genuine,) = client.statements(sid)  # the control: it verifies
    ran = _statements_cli(market, sid)
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["statements"][0]["total"] == genuine.statement.total
    data, signature = _stored_statement(market, sid)
    statement = genuine.statement
    line = statement.lines[0]
    raised = dataclasses.replace(line, reward=line.reward + 1)
    tampered = dataclasses.replace(statement, lines=(raised, *statement.lines[1:])).encode()
    try:
        for row in ((tampered, signature), (data, b"")):
            _stored_statement(market, sid, row)
            with (
                CuratorClient(market.curator_target, market.consumer_security()) as client,
                pytest.raises(StatementError, match="does not carry a valid signature"),
            ):
                client.statements(sid)
            refused = _statements_cli(market, sid)
            assert refused.exit_code == 1
            text = " ".join(refused.output.split())
            assert f"the statement of session '{statement.header.session_id}'" in text
            assert "refuse it" in text and "Traceback" not in text
    finally:
        _stored_statement(market, sid, (data, signature))
    restored = _statement_of(market, sid)  # the control again, once restored
    assert restored is not None and restored.statement == genuine.statement


def _session_with_an_owner_down(cluster: LocalCluster, digits: Scenario, seed: int) -> str:
    """A session whose first owner is killed (-9) once it charged its ledger (the candidate
    shares are allocated from the owners' noisy counts) and before the session closes: the
    curator cannot get its record, so it cannot settle yet. Returns the consumer's session id."""
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        sid = client.create_session(config, digits.validation, seeds, seed=seed)
        for event, _ in client.watch(sid):
            if event.message.startswith("candidate shares"):
                cluster.kill_owner(0)
    assert _statement_of(cluster, sid) is None, "settled before the owner was down"
    return sid


def _pending_records(cluster: LocalCluster, sid: str) -> list[str]:
    """The owners whose record of the session the curator does not have."""
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        rows = conn.execute(
            "SELECT owner FROM owner_spend WHERE session = ? AND unknown != ''", (sid,)
        ).fetchall()
    finally:
        conn.close()
    return [str(r[0]) for r in rows]


def test_an_owner_down_at_settlement_gets_its_statement_once_the_curator_still_running(
    market: LocalCluster, digits: Scenario
) -> None:
    """An owner killed during a session (after it charged its ledger) is down when the
    session closes: the curator has no record of it and settles nothing. Brought back on the
    same address, it is asked for its record by the curator's background retry — no curator
    restart — then the session is settled and every owner, this one included, records its
    part exactly once; the earnings equal the statement. (Control: while the owner is down,
    the retry does not settle or deliver anything.)"""
    curator = market.curator_process
    assert curator is not None
    sid = _session_with_an_owner_down(market, digits, seed=15)
    down = market.owner_ids[0]
    assert _pending_records(market, sid) == [down]
    time.sleep(2.0)  # retries against the dead owner
    assert _statement_of(market, sid) is None and _pending_records(market, sid) == [down]
    market.restart_owner(0)
    settled = _settled_everywhere(market, sid)
    assert curator.poll() is None and market.curator_process is curator  # never restarted
    assert down in {line.owner for line in settled.statement.lines}
    _check_settled(market, settled)
    assert _pending_records(market, sid) == []


@pytest.mark.slow
def test_a_curator_killed_while_it_retries_a_settlement_loses_nothing_and_pays_once(
    market: LocalCluster, digits: Scenario
) -> None:
    """As above, with the curator killed (-9) while it retries against the dead owner and
    restarted before the owner is back: the restarted curator asks again, settles the session
    once the owner answers, and every owner records its part exactly once; one statement."""
    statements = _statements_count(market)
    sid = _session_with_an_owner_down(market, digits, seed=16)
    time.sleep(1.5)  # retries against the dead owner
    market.kill_curator()
    market.start_curator()
    assert _statement_of(market, sid) is None
    market.restart_owner(0)
    settled = _settled_everywhere(market, sid)
    _check_settled(market, settled)
    assert _statements_count(market) == statements + 1


def _statement_count_pending(cluster: LocalCluster, sid: str) -> int:
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM statement_deliveries WHERE session = ? "
                "AND delivered_at IS NULL",
                (sid,),
            ).fetchone()[0]
        )
    finally:
        conn.close()


def test_a_reward_is_split_by_the_private_payouts_charged_to_their_subjects(
    market: LocalCluster, digits: Scenario
) -> None:
    """With a value reward, the curator releases every owner's noisy Shapley value, charging
    the validation set at the curator and, before its first point left, each owner that
    released a point (its ledger's payout entry, epsilon_owner <= the payout epsilon); the
    statement's header states the rule, the noise scale the owners recompute, and each owner's
    reward, which every owner recomputes from its own line before recording it."""
    reward = RewardOffer("value", 5_000_000, 1.0)
    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    with CuratorClient(market.curator_target, market.consumer_security()) as client:
        quoted = client.quote_session(config, digits.validation, seeds, reward=reward)
        result = client.summarize(config, digits.validation, seeds, seed=21, reward=reward)
        (newest,) = client.statements(limit=1)
    settled = _settled_everywhere(market, newest.session_id)
    assert quoted.reward == 5_000_000 and result.report.cost == settled.statement.total
    header = settled.statement.header
    settlement = reward.settlement(P, len(digits.validation))
    assert header.reward_rule == "value" and header.reward == 5_000_000
    assert header.noise_scale == settlement.header_fields()["noise_scale"]
    _check_settled(market, settled)
    # Every owner of the session accepted the same settlement, reward rule and amount included
    # (each consented to the reward by its policy: access.allow_reward_disclosure), and checks
    # its statement against it.
    for name in market.owner_ids:
        with OwnerLedger(market.owner_state(name), None) as ledger:
            accepted = Earnings(ledger, name).accepted_line(str(CURATOR), header.session_id)
        assert accepted is not None and accepted.settlement == settlement, name
    payout = owner_payout_epsilon(settlement)
    assert 0 < payout <= 1.0
    delivered = [line for line in settled.statement.lines if line.points_delivered > 0]
    assert delivered and sum(line.reward for line in settled.statement.lines) <= 5_000_000
    for line in settled.statement.lines:
        assert line.epsilon_payout == (epsilon_units(payout) if line.points_read else 0)
        if line.points_delivered == 0:
            assert line.value == 0 and line.reward == 0
        with OwnerLedger(market.owner_state(line.owner), None) as ledger:
            charged = ledger.session_totals(payout_session(header.session_id)).epsilon
        assert charged == (payout if line.points_read else 0.0)
    validation = [
        json.loads(event)
        for party, label, event in _curator_charges(market)
        if party == "validation" and label.startswith("payout release")
    ]
    assert len(validation) >= 1 and validation[-1]["epsilon"] <= 1.0 + 1e-12
    # The consumer's report holds the owners' payout charge too (issue 25, F4; main: its owners'
    # ledger held no payout entry, its PLD figure left it out and the CLI line printed the
    # session's epsilon alone).
    book = result.report.ledger.party("owners")
    assert book is not None
    paid = [c.event.epsilon for c in book.entries if c.label == PAYOUT_CHARGE_LABEL]
    assert paid == [pytest.approx(payout)]
    summary = epsilon_summary(result.report.ledger)
    assert summary is not None and summary["owners"]["pld"] >= payout - 1e-9
    (line_printed,) = [t for t in charge_lines(result.report) if t.startswith("charged: ")]
    for line in settled.statement.lines:
        spend = result.report.owner_spend[line.owner]
        released = f" + payout release {payout:g}" if spend.points else ""
        assert f"{line.owner} epsilon {spend.epsilon:g}{released} (" in line_printed


def _curator_charges(cluster: LocalCluster) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(cluster.curator_state / DATABASE_FILE)
    try:
        rows = conn.execute("SELECT party, label, event_json FROM charges ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


@pytest.mark.slow
def test_a_consumer_keeps_a_record_of_a_session_whose_curator_was_killed(
    market: LocalCluster, digits: Scenario, tmp_path: Path
) -> None:
    """A real consumer process (``dpmarket consumer request --data-dir``) whose curator is
    killed -9 as soon as the session is created: the consumer's data directory records it at
    once (running, with its id, request key, quote and owners), ``consumer sessions`` lists it
    unfinished after the crash, and ``--check`` asks the restarted curator how it ended and
    records that."""
    import subprocess
    import sys

    data_dir = tmp_path / "consumer"
    validation = tmp_path / "validation.npy"
    np.save(validation, digits.validation)
    args = [
        sys.executable, "-m", "dpmarket.deploy.cli", "consumer", "request",
        "--curator", market.curator_target, "--pki-dir", str(market.pki_dir),
        "--name", "consumer", "--validation", str(validation), "-p", str(P),
        "--method", "candidates", "--seed", "4", "--out", str(tmp_path / "summary.npy"),
        "--report", str(tmp_path / "report.json"), "--data-dir", str(data_dir),
    ]  # fmt: skip
    consumer = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    folder = data_dir / "sessions"
    deadline = time.monotonic() + CALL_TIMEOUT
    while not any(folder.glob("*.json")) and consumer.poll() is None:
        assert time.monotonic() < deadline, "no record written"
        time.sleep(0.01)
    market.kill_curator()  # kill -9, mid-session
    output = consumer.communicate(timeout=CALL_TIMEOUT)[0].decode()
    assert consumer.returncode != 0, output  # the consumer lost its curator
    assert "recorded as unfinished" in output

    listed = CliRunner().invoke(
        main, ["consumer", "sessions", "--data-dir", str(data_dir), "--json"]
    )
    assert listed.exit_code == 0, listed.output
    (record,) = json.loads(listed.stdout)["sessions"]
    assert record["unfinished"] and record["status"] == "running"
    assert record["session_id"] and record["session_id"] in output and record["request_id"]
    assert sorted(record["owners"]) == sorted(market.owner_ids)
    assert record["quote"]["total"] > 0 and "lost before the session ended" in record["error"]

    market.start_curator()
    checked = CliRunner().invoke(
        main,
        ["consumer", "sessions", "--data-dir", str(data_dir), "--check", "--json",
         "--curator", market.curator_target, "--pki-dir", str(market.pki_dir),
         "--name", "consumer"],
    )  # fmt: skip
    assert checked.exit_code == 0, checked.output
    (after,) = json.loads(checked.stdout)["sessions"]
    assert not after["unfinished"] and after["status"] in ("failed", "done")
    assert after["session_id"] == record["session_id"] and after["owners"] == record["owners"]


@pytest.mark.slow
def test_a_rollback_marked_resolved_in_the_owners_file_is_refused_after_a_restart(
    market: LocalCluster, digits: Scenario, tmp_path: Path
) -> None:
    """The red team's l2 over real processes: owner-0's ledger restored from a backup older than
    the curator's receipt (refused), then, the owner killed, ``UPDATE ledger_rollbacks SET
    resolved_at`` and the owner restarted: the curator's held receipt is still refused and
    nothing is charged. Only the operator's resolve (a chained charge-back) lets it serve. (The
    control, the old rule serving, is in tests/integration/test_ledger_receipts.py.)"""
    from dpmarket.common.errors import DPMarketError
    from dpmarket.owner.ledger_admin import backup_ledger, restore_ledger, verify_file
    from tests.owner.ledger_attacks import mark_rollbacks_resolved

    config = CandidatesConfig(summary_size=P)
    seeds = np.zeros((0, digits.n_features))
    owner = market.owner_ids[0]
    state, backup = market.owner_state(owner), tmp_path / "owner-0.sqlite3"
    backup_ledger(state, backup)  # while it serves

    def summarize(seed: int) -> str:
        with CuratorClient(market.curator_target, market.consumer_security()) as client:
            client.summarize(config, digits.validation, seeds, seed=seed)
            return client.statements(limit=1)[0].session_id

    _settled_everywhere(market, summarize(31))  # charged after the backup, receipt held
    market.kill_owner(0)
    restore_ledger(state, backup)
    market.restart_owner(0)
    with pytest.raises(DPMarketError, match="behind a receipt it signed"):
        summarize(32)
    market.kill_owner(0)
    assert mark_rollbacks_resolved(state) == 1
    before = _ledger_sizes(market)[owner]
    market.restart_owner(0)
    with pytest.raises(DPMarketError, match="behind a receipt it signed"):
        summarize(33)
    assert _ledger_sizes(market)[owner] == before  # nothing charged
    assert verify_file(state / "owner.sqlite3").open_rollbacks == 1

    market.kill_owner(0)
    with OwnerLedger(state, None) as ledger:
        (resolution,) = ledger.resolve_rollbacks()  # the operator: charged back, chained
    assert resolution.epsilon > 0
    market.restart_owner(0)
    summarize(34)  # served: the curator's receipt is resolved by the chain
