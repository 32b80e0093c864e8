"""The market over real processes: prices, quotes and the consumer's cap (issue 29).

Three owner processes whose policies set prices, and a curator process, over mTLS. A consumer
asks for a quote without running anything; a request over its ``--max-cost`` is refused before
anything is released or charged anywhere (the owners' ledgers and the curator's store are
unchanged), and the same request under a cap that covers its quote runs (the control: the cap
alone stopped it). A curator that quotes an owner below its prices is refused by the owner, and
an owner releases no more raw points than its line of the quote.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.common.market.money import format_credits
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import MarketTerms, check_quote
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.consumer.market import credits
from dpmarket.curator.store import DATABASE_FILE
from dpmarket.deploy.cli import main
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.experiments.scenarios import Scenario, write_scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.market import market_terms_to_proto
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

pytestmark = pytest.mark.integration

K = 3
P = 12
PRICES = """
[prices]
per_point_read = "0.01"
per_point_delivered = "0.05"
per_epsilon = "2"
minimum = "1"
"""
OWNER_PRICES = OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)
CURATOR = Identity("curator", CURATOR_NAME)
CALL_TIMEOUT = 60.0


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
    stub: Any, sid: str, digits: Scenario, market: MarketTerms | None, epsilon: float = 0.5
) -> Any:
    rff = draw_rff_params(digits.n_features, 16, 0.5, np.random.default_rng(1))
    terms = owner_pb2.SessionTerms(
        method=owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS,
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
    a priced owner too. Control: the honest quote opens, and the owner's allowance is the line's
    ``max_points_read``."""
    owner = market.owner_ids[0]
    settlement = SettlementTerms(summary_size=P, validation_size=len(digits.validation))
    own = check_quote(OWNER_PRICES, MarketTerms(4, 10**12, 0, settlement), 0.5, owner=owner)
    honest = MarketTerms(4, own, own, settlement)
    low = MarketTerms(4, own - 1, own - 1, settlement)
    before = _ledger_sizes(market)
    security = TransportSecurity.from_files(*identity_files(market.pki_dir, CURATOR))
    with sync_channel(market.owner_targets[0], security, Identity("owner", owner)) as channel:
        stub = owner_pb2_grpc.OwnerServiceStub(channel)
        for sid, terms in (("lowball", low), ("no-quote", None)):
            with pytest.raises(grpc.RpcError) as info:
                _open(stub, sid, digits, terms)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = info.value.details() or ""
            assert "prices" in details and "Traceback" not in details
        opened = _open(stub, "honest", digits, honest)
        assert opened.max_points == 4  # no more than the line's max_points_read
        stub.CloseSession(owner_pb2.CloseSessionRequest(session_id="honest"), timeout=CALL_TIMEOUT)
    assert _ledger_sizes(market) == before  # opening charges nothing; refusals neither
