"""Money is exact integers; charges follow the owner's prices; a quote bounds every settlement
within the terms; a request over its cap is refused."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.money import (
    epsilon_charge,
    epsilon_units,
    format_credits,
    parse_credits,
    value_units,
)
from dpmarket.common.market.payouts import ProportionalSplit, ValueReward
from dpmarket.common.market.pricing import (
    CostCapExceededError,
    OwnerLimits,
    OwnerPrices,
    check_cap,
    owner_charge,
    quote,
)


def test_credits_parse_and_format_exactly() -> None:
    assert parse_credits("12.5") == 12_500_000
    assert parse_credits("0.000001") == 1
    assert parse_credits(3) == 3_000_000
    assert parse_credits(Decimal("0.1")) * 3 == parse_credits("0.3")  # floats would miss
    assert format_credits(12_500_000) == "12.500000"
    assert format_credits(-1) == "-0.000001"
    for text in ("0.1", "1234567.654321", "0"):
        assert Decimal(format_credits(parse_credits(text))) == Decimal(text)


@pytest.mark.parametrize("bad", [0.1, True, "-1", "0.0000001", "nan", "inf", "one"])
def test_credits_refuse_floats_and_inexact_amounts(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_credits(bad)  # type: ignore[arg-type]


def test_epsilon_units_round_up_and_are_deterministic() -> None:
    assert epsilon_units(1.0) == 1_000_000
    assert epsilon_units(0.1) == 100_001  # the float 0.1 is slightly above 1/10
    assert epsilon_units(0.5) == 500_000
    assert epsilon_units(1e-9) == 1
    assert epsilon_units(0.0) == 0
    with pytest.raises(ValueError, match="non-private"):
        epsilon_units(float("inf"))
    assert value_units(0.25) == 250_000_000 and value_units(-1e-9) == -1


@settings(max_examples=300, deadline=None)
@given(units=st.integers(0, 10**12), price=st.integers(0, 10**12))
def test_the_epsilon_charge_is_the_exact_ceiling(units: int, price: int) -> None:
    charge = epsilon_charge(units, price)
    exact = Fraction(units * price, 10**6)
    assert charge >= exact > charge - 1 or (charge == 0 and exact == 0)


PRICES = OwnerPrices.from_table(
    {"per_point_read": "0.01", "per_point_delivered": "0.5", "per_epsilon": "2", "minimum": "1"}
)


def test_prices_come_from_a_policy_table_of_credits() -> None:
    assert OwnerPrices(10_000, 500_000, 2_000_000, 1_000_000) == PRICES
    assert OwnerPrices.from_table(PRICES.as_table()) == PRICES
    with pytest.raises(ValueError, match=r"prices.per_point_read: .*string"):
        OwnerPrices.from_table({"per_point_read": 0.01})
    with pytest.raises(ValueError, match="unknown price"):
        OwnerPrices.from_table({"per_row": "1"})


def test_a_charge_is_its_components_or_the_minimum() -> None:
    charge = owner_charge(PRICES, 100, 20, 1_500_000)
    assert (charge.read, charge.delivered, charge.epsilon) == (1_000_000, 10_000_000, 3_000_000)
    assert charge.minimum_topup == 0 and charge.total == 14_000_000
    small = owner_charge(PRICES, 10, 0, 0)
    assert small.read == 100_000 and small.minimum_topup == 900_000 and small.total == 1_000_000
    with pytest.raises(ValueError, match="delivered but only"):
        owner_charge(PRICES, 3, 4, 0)


@settings(max_examples=200, deadline=None)
@given(
    max_read=st.integers(0, 500),
    p=st.integers(1, 300),
    eps=st.floats(0, 5),
    payout_eps=st.floats(0, 2),
    data=st.data(),
)
def test_a_quote_bounds_every_settlement_within_the_terms(
    max_read: int, p: int, eps: float, payout_eps: float, data: st.DataObject
) -> None:
    limits = {"o": OwnerLimits(max_read, eps, payout_eps)}
    q = quote({"o": PRICES}, limits, p, ValueReward(7_000_000))
    read = data.draw(st.integers(0, max_read))
    delivered = data.draw(st.integers(0, min(read, p)))
    spent = data.draw(st.floats(0, eps)), data.draw(st.floats(0, payout_eps))
    actual = owner_charge(
        PRICES, read, delivered, epsilon_units(spent[0]) + epsilon_units(spent[1])
    )
    assert actual.total <= q.line("o").charge.total
    assert q.total == q.line("o").charge.total + 7_000_000


def test_the_quote_sums_every_owner_and_the_reward() -> None:
    limits = {"b": OwnerLimits(90, 1.0, 0.5), "a": OwnerLimits(30, 1.0, 0.5)}
    prices = {"a": PRICES, "b": OwnerPrices(per_point_read=1)}
    q = quote(prices, limits, 50, ProportionalSplit(2_000_000))
    assert [line.owner for line in q.lines] == ["a", "b"]
    a = owner_charge(PRICES, 30, 30, 1_500_000).total
    assert q.line("b").charge.total == 90
    assert q.total == a + 90 + 2_000_000
    with pytest.raises(ValueError, match="no prices"):
        quote({"a": PRICES}, limits, 50)


def test_a_request_over_its_cap_is_refused_before_anything() -> None:
    q = quote({"a": PRICES}, {"a": OwnerLimits(30, 1.0)}, 10)
    check_cap(q, q.total)
    check_cap(q, None)
    with pytest.raises(CostCapExceededError, match="raise --max-cost") as info:
        check_cap(q, q.total - 1)
    assert isinstance(info.value, FailedPreconditionError)
    assert format_credits(q.total) in str(info.value)
