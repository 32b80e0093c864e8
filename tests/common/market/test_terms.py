"""A session's market terms: the quote from published prices, and the owner's check of its line."""

from __future__ import annotations

import math

import pytest

from dpmarket.common.market.pricing import CostCapExceededError, OwnerPrices, check_cap
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import (
    FREE,
    MarketTerms,
    QuoteRefusedError,
    RewardOffer,
    check_quote,
    quote_from_json,
    quote_to_json,
    session_quote,
)

PRICES = OwnerPrices(per_point_read=10, per_point_delivered=100, per_epsilon=1000, minimum=5000)
TERMS = SettlementTerms(summary_size=10, validation_size=50)


def test_the_quote_charges_each_owner_at_its_limits_and_the_owner_agrees() -> None:
    quoted = session_quote({"a": PRICES, "b": FREE}, {"a": 30, "b": 4}, 0.5, TERMS)
    a = quoted.line("a").charge
    # 30 read, min(30, p = 10) delivered, 0.5 epsilon = 500000 micro-epsilon.
    assert (a.read, a.delivered, a.epsilon) == (300, 1000, 500)
    assert a.minimum_topup == 5000 - 1800 and a.total == 5000
    assert quoted.line("b").charge.total == 0
    assert quoted.total == 5000
    market = MarketTerms.of(quoted, "a", TERMS)
    assert check_quote(PRICES, market, 0.5, owner="a") == 5000
    assert quote_from_json(quote_to_json(quoted)) == quoted


def test_an_owner_refuses_a_quote_below_its_prices_or_none_at_all() -> None:
    low = MarketTerms(30, 4999, 4999, TERMS)
    with pytest.raises(QuoteRefusedError, match=r"below its prices' 0\.005000"):
        check_quote(PRICES, low, 0.5, owner="a")
    with pytest.raises(QuoteRefusedError, match="carry no quote"):
        check_quote(PRICES, None, 0.5, owner="a")
    assert check_quote(FREE, None, 0.5, owner="a") == 0  # a free owner takes any curator
    # Control: the same line at the owner's price passes.
    assert check_quote(PRICES, MarketTerms(30, 5000, 5000, TERMS), 0.5, owner="a") == 5000


def test_a_non_private_session_is_priced_only_by_owners_that_do_not_price_epsilon() -> None:
    assert session_quote({"a": FREE}, {"a": 3}, math.inf, TERMS).total == 0
    with pytest.raises(QuoteRefusedError, match="non-private"):
        session_quote({"a": PRICES}, {"a": 3}, math.inf, TERMS)


def test_the_cap_refuses_one_micro_credit_over_the_quote() -> None:
    quoted = session_quote({"a": PRICES}, {"a": 30}, 0.5, TERMS)
    check_cap(quoted, quoted.total)
    with pytest.raises(CostCapExceededError, match="nothing was charged"):
        check_cap(quoted, quoted.total - 1)


def test_a_reward_adds_its_most_to_the_quote() -> None:
    reward = RewardOffer("proportional", 7_000_000, 1.0)
    quoted = session_quote({"a": FREE}, {"a": 3}, 0.5, reward.settlement(10, 50))
    assert quoted.reward == 7_000_000 and quoted.total == 7_000_000
    # The payout epsilon is charged to the owner's ledger too: it enters the owner's limits.
    priced = session_quote({"a": PRICES}, {"a": 30}, 0.5, reward.settlement(10, 50))
    assert priced.line("a").charge.epsilon_units == 1_500_000


@pytest.mark.parametrize(
    ("rule", "amount", "epsilon", "match"),
    [
        ("value", 0, 1.0, "amount > 0"),
        ("value", 5, 0.0, "finite and > 0"),
        ("value", 5, math.inf, "finite and > 0"),
        ("none", 5, 0.0, "needs a reward rule"),
        ("shares", 5, 1.0, "must be one of"),
    ],
)
def test_a_malformed_reward_is_refused(rule: str, amount: int, epsilon: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RewardOffer(rule, amount, epsilon)
