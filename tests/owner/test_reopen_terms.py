"""A session id's terms are fixed at its first open: a reopen under other terms is refused.

A stranger opened an id under a quote line of epsilon 0 (uniform), read 2 points, and reopened it
under a line quoting epsilon 1 (candidates-counts): the owner charged epsilon 1 and released,
and no statement could settle the id (each line refuses what the other read). An id quoted at
4 points reopened without a quote read 53 more, also after its statement was recorded. Each test
runs a real :class:`dpmarket.owner.protocol.Owner` with its durable ledger and earnings, and
fails on main (its control: the same reopen under the first terms opens).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import SessionRecord, SettlementTerms, settle, sign_statement
from dpmarket.common.market.terms import MarketTerms, RewardOffer, session_quote
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner
from dpmarket.runtime.tables import PointSet

N = 40
CONSUMER = "consumer:local"
SETTLEMENT = SettlementTerms(summary_size=4, validation_size=10)
UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
COUNTS = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 1.0, 0.0)


def _line(prices: OwnerPrices, points: int, epsilon: float) -> MarketTerms:
    quoted = session_quote({"o": prices}, {"o": points}, epsilon, SETTLEMENT)
    return MarketTerms.of(quoted, "o", SETTLEMENT)


def _quoted(terms: OwnerTerms, line: MarketTerms | None) -> OwnerTerms:
    return dataclasses.replace(terms, market=line)


def _owner(tmp_path: Path, prices: OwnerPrices) -> tuple[Owner, OwnerLedger]:
    policy = OwnerPolicy(
        prices=prices,
        allow_steered_selection=True,
        allow_exact_bids=True,
        allow_reward_disclosure=True,
        points_fraction_per_session=1.0,
    )
    ledger = OwnerLedger.create(tmp_path, policy)
    rng = np.random.default_rng(0)
    owner = Owner("o", PointSet(rng.normal(size=(N, 3)), np.arange(N) % 2, "o"), ledger=ledger)
    return owner, ledger


@pytest.fixture
def rff() -> RFFParams:
    return draw_rff_params(3, 8, 0.5, np.random.default_rng(1))


PRICED = OwnerPrices(per_point_read=10_000, per_point_delivered=50_000, per_epsilon=2_000_000)
FREE = OwnerPrices()
#: Prices per point only: its line quotes the same charge whatever the terms' epsilon.
PER_POINT = OwnerPrices(per_point_read=10_000, per_point_delivered=50_000)


def test_a_reopen_under_another_quote_line_is_refused_nothing_charged(
    rff: RFFParams, tmp_path: Path
) -> None:
    """E13: line of epsilon 0 (uniform), 2 points read, reopened under a line quoting
    epsilon 1 (candidates-counts): refused before anything is read or charged. The control:
    the same id reopened under its first line opens, with the line's 2 points left."""
    owner, ledger = _owner(tmp_path, PRICED)
    first = _line(PRICED, 4, 0.0)
    owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, first))
    owner.sample_uniform("s", 2)
    owner.close_session("s")
    before = ledger.entries()
    other = _line(PRICED, 4, 1.0)
    with pytest.raises(FailedPreconditionError, match="first opened under another quote line"):
        owner.open_session("s", rff, 0, terms=_quoted(COUNTS, other))
    assert ledger.entries() == before and owner.sessions == {}
    assert owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, first)) == (N, 2)


def test_a_quoted_id_reopened_without_a_quote_is_refused_and_a_settled_one_whatever_its_terms(
    rff: RFFParams, tmp_path: Path
) -> None:
    """E11/E12 on a free owner: an id quoted at 4 points, its 4 read, reopened without a quote,
    is refused (main: 36 more); once its statement is recorded it is refused under any terms
    ("settled"), nothing charged."""
    owner, ledger = _owner(tmp_path, FREE)
    line = _line(FREE, 4, 0.0)
    owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, line))
    owner.sample_uniform("s", 4)
    owner.close_session("s")
    before = ledger.entries()
    with pytest.raises(FailedPreconditionError, match="reopened under none"):
        owner.open_session("s", rff, 0, terms=UNIFORM)
    assert ledger.entries() == before and owner.sessions == {}
    # Settle the id: the curator's signed statement of its 4 points, recorded by the owner.
    key = ec.generate_private_key(ec.SECP256R1())
    quoted = session_quote({"o": FREE}, {"o": 4}, 0.0, SETTLEMENT)
    statement = settle("s", CONSUMER, quoted, {"o": FREE}, {"o": SessionRecord(4, 0, 0.0)})
    part = statement.for_owner("o")
    Earnings(ledger, "o").record(
        part.encode(),
        sign_statement(part, key),
        curator=LOCAL_CURATOR,
        curator_key=key.public_key(),
    )
    for terms in (UNIFORM, _quoted(UNIFORM, line), _quoted(UNIFORM, _line(FREE, 9, 0.0))):
        with pytest.raises(FailedPreconditionError, match="is settled"):
            owner.open_session("s", rff, 0, terms=terms)
    assert ledger.entries() == before and owner.sessions == {}


def test_an_id_charged_without_a_quote_is_not_reopened_under_one(
    rff: RFFParams, tmp_path: Path
) -> None:
    """An id first opened (and charged) without a quote line, reopened under one: refused (its
    statement would be checked against a line that never bounded the first open). The
    control: reopened without a quote, as first, it opens."""
    owner, ledger = _owner(tmp_path, FREE)
    owner.open_session("s", rff, 0, terms=UNIFORM)
    owner.sample_uniform("s", 3)
    owner.close_session("s")
    before = ledger.entries()
    with pytest.raises(FailedPreconditionError, match="first opened under no quote line"):
        owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, _line(FREE, 4, 0.0)))
    assert ledger.entries() == before and owner.sessions == {}
    assert owner.open_session("s", rff, 0, terms=UNIFORM)[0] == N


@pytest.mark.parametrize(
    ("prices", "quoted"),
    [(FREE, True), (PER_POINT, True), (FREE, False)],
    ids=["free-line", "priced-per-point-line", "free-no-line"],
)
def test_a_reopen_under_the_same_line_with_another_epsilon_is_refused_nothing_charged(
    rff: RFFParams, tmp_path: Path, prices: OwnerPrices, quoted: bool
) -> None:
    """A stranger's reopen: an id opened under uniform terms (epsilon 0) reads 2 points, then
    is reopened under the same quote line (a free owner's, or one priced per point only: the
    line reads the same at any epsilon), or under none as first, with candidates-counts terms
    at epsilon 1. Main served it (a count at epsilon 1 the id's first open never accepted);
    refused now before anything is read or charged. The control: the identical reopen opens,
    with the line's 2 points left."""
    owner, ledger = _owner(tmp_path, prices)
    line = _line(prices, 4, 0.0) if quoted else None
    owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, line))
    owner.sample_uniform("s", 2)
    owner.close_session("s")
    before = ledger.entries()
    with pytest.raises(FailedPreconditionError, match="first opened under other terms"):
        owner.open_session("s", rff, 0, terms=_quoted(COUNTS, line))
    assert ledger.entries() == before and owner.sessions == {}
    left = 2 if quoted else N - 2
    assert owner.open_session("s", rff, 0, terms=_quoted(UNIFORM, line)) == (N, left)
    assert owner.sample_uniform("s", 2)[0].shape[0] == 2
    assert ledger.entries()[: len(before)] == before


PRIVATE = OwnerTerms(SessionMethod.PRIVATE, 1.0, 1e-6, max_rounds=8)
REWARD = RewardOffer("value", 5_000_000, 1.0).settlement(4, 10)


@pytest.mark.parametrize(
    ("field", "terms", "consumer"),
    [
        ("epsilon", OwnerTerms(SessionMethod.PRIVATE, 2.0, 1e-6, max_rounds=8), CONSUMER),
        ("delta", OwnerTerms(SessionMethod.PRIVATE, 1.0, 1e-5, max_rounds=8), CONSUMER),
        ("max_rounds", OwnerTerms(SessionMethod.PRIVATE, 1.0, 1e-6, max_rounds=9), CONSUMER),
        ("method", OwnerTerms(SessionMethod.ROUNDS, 1.0, 1e-6, max_rounds=8), CONSUMER),
        ("consumer", PRIVATE, "consumer:other"),
        ("line", None, CONSUMER),
    ],
)
def test_every_field_of_the_terms_is_fixed_at_the_first_open(
    rff: RFFParams, tmp_path: Path, field: str, terms: OwnerTerms | None, consumer: str
) -> None:
    """Each field of the terms changed alone on a reopen (the line's points, its settlement
    with a reward, its charge: each a different line): refused, nothing charged; main served
    every one but the line's. The control: the identical reopen opens."""
    owner, ledger = _owner(tmp_path, FREE)
    line = _line(FREE, 4, 1.0)
    owner.open_session("s", rff, 0, terms=_quoted(PRIVATE, line), consumer=CONSUMER)
    owner.close_session("s")
    before = ledger.entries()
    if terms is not None:
        reopens = [(_quoted(terms, line), field)]
    else:
        other_points = _line(FREE, 5, 1.0)
        with_reward = MarketTerms(line.max_points_read, line.quoted_charge, line.max_cost, REWARD)
        reopens = [(_quoted(PRIVATE, m), "quote line") for m in (other_points, with_reward, None)]
    for reopen, named in reopens:
        with pytest.raises(FailedPreconditionError, match="first opened under") as refused:
            owner.open_session("s", rff, 0, terms=reopen, consumer=consumer)
        assert named in str(refused.value) or named == "quote line"
        assert ledger.entries() == before and owner.sessions == {}
    terms_first = _quoted(PRIVATE, line)
    assert owner.open_session("s", rff, 0, terms=terms_first, consumer=CONSUMER) == (N, 4)
