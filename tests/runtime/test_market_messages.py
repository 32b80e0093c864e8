"""The market's messages on the wire: a quote, prices, a reward and market terms round-trip, and
malformed ones are INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.terms import MarketTerms, RewardOffer, session_quote
from dpmarket.runtime.market import (
    market_terms_from_proto,
    market_terms_to_proto,
    prices_from_proto,
    prices_to_proto,
    quote_from_proto,
    quote_to_proto,
    reward_from_proto,
    reward_to_proto,
)
from dpmarket.v1 import market_pb2

PRICES = OwnerPrices(10, 20, 30, 40)


def test_every_message_round_trips() -> None:
    reward = RewardOffer("proportional", 7, 0.5)
    settlement = reward.settlement(12, 30)
    quoted = session_quote({"a": PRICES, "b": OwnerPrices()}, {"a": 5, "b": 2}, 0.25, settlement)
    assert quote_from_proto(quote_to_proto(quoted)) == quoted
    assert prices_from_proto(prices_to_proto(PRICES), "a") == PRICES
    assert reward_from_proto(reward_to_proto(reward)) == reward
    market = MarketTerms.of(quoted, "a", settlement)
    assert market_terms_from_proto(market_terms_to_proto(market)) == market


def test_malformed_messages_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="owner x's prices"):
        prices_from_proto(market_pb2.Prices(minimum=-1), "x")
    with pytest.raises(InvalidArgumentError, match="amount > 0"):
        reward_from_proto(market_pb2.Reward(rule=market_pb2.REWARD_RULE_VALUE, epsilon=1.0))
    # p = 0 is a CAPE job's (no summary): it takes no reward, which needs a summary to split by.
    value = market_pb2.Reward(rule=market_pb2.REWARD_RULE_VALUE, amount=5, epsilon=1.0)
    with pytest.raises(InvalidArgumentError, match=r"terms\.market: a reward .* p and m >= 1"):
        market_terms_from_proto(
            market_pb2.MarketTerms(summary_size=0, validation_size=3, reward=value)
        )
    assert market_terms_from_proto(market_pb2.MarketTerms()).settlement.summary_size == 0
    quoted = quote_to_proto(
        session_quote({"a": PRICES}, {"a": 5}, 0.25, RewardOffer().settlement(5, 3))
    )
    quoted.lines[0].charge += 1  # a total that is not the sum of its parts
    with pytest.raises(InvalidArgumentError, match="not the sum of its parts"):
        quote_from_proto(quoted)
