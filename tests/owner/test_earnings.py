"""An owner's earnings: a statement is verified, checked against the owner's own ledger and
recorded once; a tampered or inconsistent one is refused and not recorded (issue 29)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    SessionRecord,
    SettlementTerms,
    Statement,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import MarketTerms, session_quote
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy

PRICES = OwnerPrices(per_point_read=10_000, per_point_delivered=50_000, per_epsilon=2_000_000)
OWNER, CURATOR, CONSUMER, SID = "owner-a", "curator:curator", "consumer:alice", "s" * 32
EPSILON = 0.5


@pytest.fixture
def book(tmp_path: Path) -> OwnerLedger:
    ledger = OwnerLedger.create(tmp_path, OwnerPolicy(prices=PRICES))
    # The session as the owner's ledger recorded it: the terms, then 3 raw points.
    ledger.charge(session=SID, consumer=CONSUMER, curator=CURATOR, mechanism="candidates-counts",
                  epsilon=EPSILON, delta=0.0, points=0)  # fmt: skip
    ledger.charge(session=SID, consumer=CONSUMER, curator=CURATOR, mechanism="raw points",
                  epsilon=0.0, delta=0.0, points=3)  # fmt: skip
    return ledger


def _settled(points: int = 3, delivered: int = 2) -> tuple[Statement, MarketTerms]:
    settlement = SettlementTerms(summary_size=10, validation_size=40)
    quoted = session_quote({OWNER: PRICES}, {OWNER: 20}, EPSILON, settlement)
    record = SessionRecord(points, delivered, EPSILON)
    statement = settle(SID, CONSUMER, quoted, {OWNER: PRICES}, {OWNER: record})
    return statement, MarketTerms.of(quoted, OWNER, settlement)


def test_a_statement_is_recorded_once_and_refused_when_tampered_or_inconsistent(
    book: OwnerLedger,
) -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    earnings = Earnings(book, OWNER)
    statement, market = _settled()
    part = statement.for_owner(OWNER)
    data, signature = part.encode(), sign_statement(part, key)
    with pytest.raises(NotFoundError):  # no terms accepted for the session yet
        earnings.record(data, signature, curator=CURATOR, curator_key=key.public_key())
    earnings.accept(curator=CURATOR, session=SID, consumer=CONSUMER, market=market, prices=PRICES)

    # Tampered: one point fewer paid as delivered, the signature of the original kept.
    line = dataclasses.replace(part.line, points_delivered=2, delivered_charge=100_000)
    forged = dataclasses.replace(part, line=line).encode()
    with pytest.raises(InvalidArgumentError, match="valid signature"):
        earnings.record(forged, signature, curator=CURATOR, curator_key=key.public_key())
    # Signed by another key: refused the same way.
    with pytest.raises(InvalidArgumentError, match="valid signature"):
        earnings.record(
            data, sign_statement(part, other), curator=CURATOR, curator_key=key.public_key()
        )
    # Signed by the curator but inconsistent with the owner's ledger: 4 points read, not 3.
    lying, _ = _settled(points=4)
    lie = lying.for_owner(OWNER)
    with pytest.raises(FailedPreconditionError, match="points_read: the statement says 4"):
        earnings.record(
            lie.encode(), sign_statement(lie, key), curator=CURATOR, curator_key=key.public_key()
        )
    assert earnings.all() == []  # nothing refused was recorded

    # Control: the genuine statement is recorded, once.
    earning, added = earnings.record(data, signature, curator=CURATOR, curator_key=key.public_key())
    # Without a reward every point read is paid as delivered (up to p): the line says nothing
    # of the summary's composition.
    assert added and earning.total == part.line.total == 3 * 10_000 + 3 * 50_000 + 1_000_000
    again, added_again = earnings.record(
        data, signature, curator=CURATOR, curator_key=key.public_key()
    )
    assert not added_again and again.id == earning.id
    assert [e.id for e in earnings.all()] == [earning.id] and earnings.total == earning.total
    # Another (genuine-looking) statement for a settled session is refused.
    other_statement, _ = _settled(points=4)
    second = other_statement.for_owner(OWNER)
    with pytest.raises(FailedPreconditionError, match="settled already"):
        earnings.record(
            second.encode(),
            sign_statement(second, key),
            curator=CURATOR,
            curator_key=key.public_key(),
        )
    assert earnings.total == earning.total
    with pytest.raises(FailedPreconditionError, match="certificate key"):
        earnings.record(data, signature, curator=CURATOR, curator_key=None)
