"""``dpmarket owner earnings`` and ``dpmarket consumer statements``: tables at 80 columns,
``--wide`` keeps every column, ``--json`` and ``--csv`` hold the statement's integers."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric import ec
from rich.console import Console

from dpmarket.common.market.pricing import OwnerPrices, Quote
from dpmarket.common.market.statement import (
    SessionRecord,
    SettlementTerms,
    Statement,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import MarketTerms, session_quote
from dpmarket.consumer.market import SettledStatement, statements_table
from dpmarket.deploy.cli import main
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy

PRICES = OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)
OWNERS = ("young", "middle-aged-clinic-of-the-north", "senior")
CURATOR, CONSUMER = "curator:curator", "consumer:consumer"
SID = "9663fef5ac6196908c073ec1c659183d"


def _statement() -> tuple[Statement, Quote, SettlementTerms]:
    settlement = SettlementTerms(summary_size=20, validation_size=40)
    quoted = session_quote(
        dict.fromkeys(OWNERS, PRICES), dict.fromkeys(OWNERS, 60), 1.0, settlement
    )
    records = {o: SessionRecord(18 + i, 6 + i, 1.0) for i, o in enumerate(OWNERS)}
    statement = settle(SID, CONSUMER, quoted, dict.fromkeys(OWNERS, PRICES), records)
    return statement, quoted, settlement


def _render(table: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    return out.getvalue()


def test_owner_earnings_fits_80_columns_and_prints_json(tmp_path: Path) -> None:
    statement, quoted, settlement = _statement()
    key = ec.generate_private_key(ec.SECP256R1())
    owner = OWNERS[0]
    with OwnerLedger.create(tmp_path, OwnerPolicy(prices=PRICES)) as ledger:
        ledger.charge(session=SID, consumer=CONSUMER, curator=CURATOR, mechanism="candidates",
                      epsilon=1.0, delta=0.0, points=18)  # fmt: skip
        earnings = Earnings(ledger, owner)
        earnings.accept(
            curator=CURATOR,
            session=SID,
            consumer=CONSUMER,
            market=MarketTerms.of(quoted, owner, settlement),
            prices=PRICES,
        )
        part = statement.for_owner(owner)
        earnings.record(
            part.encode(), sign_statement(part, key), curator=CURATOR, curator_key=key.public_key()
        )
    runner = CliRunner()
    shown = runner.invoke(
        main, ["owner", "earnings", "--data-dir", str(tmp_path)], env={"COLUMNS": "80"}
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, shown.output
    # 18 points read at 0.01, paid as delivered (all 18, p = 20: no reward, so the line states
    # no delivery) at 0.05, epsilon 1 at 2: 3.08 credits.
    assert SID[:8] in shown.output and "3.08" in shown.output
    document = json.loads(
        runner.invoke(main, ["owner", "earnings", "--data-dir", str(tmp_path), "--json"]).output
    )
    assert document["total"] == part.line.total
    assert document["earnings"][0]["line"]["points_read"] == 18


def test_consumer_statements_table_fits_80_columns_and_wide_keeps_every_column() -> None:
    statement, _, _ = _statement()
    settled = SettledStatement(SID, 1_714_564_800.0, statement, b"sig", len(OWNERS))
    narrow = _render(statements_table([settled]), 80)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80, narrow
    wide = _render(statements_table([settled], wide=True), 200)
    assert SID in wide and OWNERS[1] in wide and "quoted" in wide


def test_the_consumers_statement_names_the_id_the_owners_ledger_lists_the_session_by(
    tmp_path: Path,
) -> None:
    """The curator opens a session at its owners under an id of its own (the statement's,
    signed), not the consumer's session id. The owner's ledger lists the session by that id
    only (the control: the consumer's id appears nowhere in it); the consumer's statements —
    the table, ``--json``, ``--csv`` and the console's statements page — show it beside the
    consumer's own, so the two parties can match the row."""
    from dpmarket.console.consumer import statement_view
    from dpmarket.consumer.cli import _write_statements_csv
    from dpmarket.consumer.market import statement_json

    statement, _, _ = _statement()  # settled under SID, the owners' id
    mine = "c0ffee0000000000000000000000beef"  # the consumer's session id
    with OwnerLedger.create(tmp_path, OwnerPolicy(prices=PRICES)) as ledger:
        ledger.charge(session=SID, consumer=CONSUMER, curator=CURATOR, mechanism="candidates",
                      epsilon=1.0, delta=0.0, points=18)  # fmt: skip
    shown = CliRunner().invoke(
        main, ["owner", "ledger", "--data-dir", str(tmp_path)], env={"COLUMNS": "80"}
    )
    assert shown.exit_code == 0, shown.output
    assert SID[:8] in shown.output and mine[:8] not in shown.output
    settled = SettledStatement(mine, 1_714_564_800.0, statement, b"sig", len(OWNERS))
    narrow = _render(statements_table([settled]), 80)
    assert max(len(line.rstrip()) for line in narrow.splitlines()) <= 80, narrow
    assert "at owners" in narrow and mine[:8] in narrow and SID[:8] in narrow
    assert SID in _render(statements_table([settled], wide=True), 300)
    assert statement_json(settled)["owner_session_id"] == SID
    assert statement_json(settled)["session_id"] == mine
    _write_statements_csv([settled], str(tmp_path / "s.csv"))
    header, first = (tmp_path / "s.csv").read_text().splitlines()[:2]
    assert header.startswith("session_id,owner_session_id,") and first.startswith(f"{mine},{SID},")
    view = statement_view(settled)
    assert (view["short"], view["owner_short"]) == (mine[:8], SID[:8])
