"""The market's messages on the wire (``market.proto``) <-> :mod:`dpmarket.common.market` types.

One home for every conversion the curator, the owner and the consumer share: prices, a
consumer's reward, one owner's market terms and a quote. Every ``*_from_proto`` validates and
raises :class:`~dpmarket.common.errors.InvalidArgumentError` naming the field.
"""

from __future__ import annotations

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.payouts import POINT_VALUE_MEAN, POINT_VALUE_SPREAD
from dpmarket.common.market.pricing import Charge, OwnerLimits, OwnerPrices, Quote, QuoteLine
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import MarketTerms, RewardOffer
from dpmarket.v1 import market_pb2

__all__ = [
    "market_terms_from_proto",
    "market_terms_to_proto",
    "prices_from_proto",
    "prices_to_proto",
    "quote_from_proto",
    "quote_to_proto",
    "reward_from_proto",
    "reward_to_proto",
]

_RULE_TO_PROTO = {
    "none": market_pb2.REWARD_RULE_UNSPECIFIED,
    "value": market_pb2.REWARD_RULE_VALUE,
    "proportional": market_pb2.REWARD_RULE_PROPORTIONAL,
}
_RULE_FROM_PROTO = {v: k for k, v in _RULE_TO_PROTO.items()}


def prices_to_proto(prices: OwnerPrices) -> market_pb2.Prices:
    """OwnerPrices -> Prices (micro-credits)."""
    return market_pb2.Prices(
        per_point_read=prices.per_point_read,
        per_point_delivered=prices.per_point_delivered,
        per_epsilon=prices.per_epsilon,
        minimum=prices.minimum,
    )


def prices_from_proto(message: market_pb2.Prices, owner: str) -> OwnerPrices:
    """Prices -> OwnerPrices (an unset message: free).

    Raises
    ------
    InvalidArgumentError
        If a price is negative (naming the owner).
    """
    try:
        return OwnerPrices(
            int(message.per_point_read),
            int(message.per_point_delivered),
            int(message.per_epsilon),
            int(message.minimum),
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"owner {owner}'s prices: {exc}") from None


def reward_from_proto(message: market_pb2.Reward) -> RewardOffer:
    """Reward -> RewardOffer (unset: none).

    Raises
    ------
    InvalidArgumentError
        If the rule is unknown or the fields disagree (:class:`RewardOffer`).
    """
    rule = _RULE_FROM_PROTO.get(message.rule)
    if rule is None:
        raise InvalidArgumentError(f"reward.rule {message.rule} is not a known reward rule")
    try:
        return RewardOffer(rule, int(message.amount), float(message.epsilon))
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def reward_to_proto(reward: RewardOffer) -> market_pb2.Reward:
    """RewardOffer -> Reward."""
    return market_pb2.Reward(
        rule=_RULE_TO_PROTO[reward.rule], amount=reward.amount, epsilon=reward.epsilon
    )


def market_terms_to_proto(market: MarketTerms) -> market_pb2.MarketTerms:
    """MarketTerms -> MarketTerms message."""
    s = market.settlement
    value = s.reward_rule == "value"
    return market_pb2.MarketTerms(
        max_points_read=market.max_points_read,
        quoted_charge=market.quoted_charge,
        max_cost=market.max_cost,
        summary_size=s.summary_size,
        validation_size=s.validation_size,
        reward=market_pb2.Reward(
            rule=_RULE_TO_PROTO[s.reward_rule], amount=s.reward, epsilon=s.payout_epsilon
        ),
        point_mean=s.point_mean if value else 0,
        point_spread=s.point_spread if value else 0,
    )


def market_terms_from_proto(message: market_pb2.MarketTerms) -> MarketTerms:
    """MarketTerms message -> MarketTerms.

    Raises
    ------
    InvalidArgumentError
        If a count or amount is negative, p or m < 1, or the reward's fields disagree.
    """
    reward = reward_from_proto(message.reward)
    value = reward.rule == "value"
    try:
        settlement = SettlementTerms(
            summary_size=int(message.summary_size),
            validation_size=int(message.validation_size),
            payout_epsilon=reward.epsilon,
            reward_rule=reward.rule,
            reward=reward.amount,
            point_mean=int(message.point_mean) if value else POINT_VALUE_MEAN,
            point_spread=int(message.point_spread) if value else POINT_VALUE_SPREAD,
        )
        return MarketTerms(
            int(message.max_points_read),
            int(message.quoted_charge),
            int(message.max_cost),
            settlement,
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"terms.market: {exc}") from None


def quote_to_proto(quoted: Quote) -> market_pb2.Quote:
    """Quote -> Quote message."""
    return market_pb2.Quote(
        summary_size=quoted.summary_size,
        lines=[
            market_pb2.QuoteLine(
                owner_id=line.owner,
                max_points_read=line.charge.points_read,
                max_points_delivered=line.charge.points_delivered,
                epsilon=line.limits.epsilon,
                payout_epsilon=line.limits.payout_epsilon,
                max_epsilon=line.charge.epsilon_units,
                read_charge=line.charge.read,
                delivered_charge=line.charge.delivered,
                epsilon_charge=line.charge.epsilon,
                minimum_topup=line.charge.minimum_topup,
                charge=line.charge.total,
            )
            for line in quoted.lines
        ],
        reward=quoted.reward,
        total=quoted.total,
    )


def quote_from_proto(message: market_pb2.Quote) -> Quote:
    """Quote message -> Quote.

    Raises
    ------
    InvalidArgumentError
        If a value is out of range, or a line's or the quote's total is not the sum of its parts.
    """
    try:
        lines = []
        for m in message.lines:
            charge = Charge(
                int(m.max_points_read),
                int(m.max_points_delivered),
                int(m.max_epsilon),
                int(m.read_charge),
                int(m.delivered_charge),
                int(m.epsilon_charge),
                int(m.minimum_topup),
            )
            if charge.total != m.charge:
                raise ValueError(f"owner {m.owner_id}'s charge is not the sum of its parts")
            limits = OwnerLimits(int(m.max_points_read), m.epsilon, m.payout_epsilon)
            lines.append(QuoteLine(m.owner_id, limits, charge))
        quoted = Quote(int(message.summary_size), tuple(lines), int(message.reward))
    except ValueError as exc:
        raise InvalidArgumentError(f"quote: {exc}") from None
    if quoted.total != message.total:
        raise InvalidArgumentError(
            f"quote: its total {message.total} is not its lines' and reward's {quoted.total}"
        )
    return quoted
