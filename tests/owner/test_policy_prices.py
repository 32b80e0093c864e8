"""The owner's ``[prices]``: read from the policy file, validated at load, written back, shown."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.owner.policy import OwnerPolicy, load_owner_policy

PRICED = """
[prices]
per_point_read = "0.01"
per_point_delivered = "0.05"
per_epsilon = "2"
minimum = 1
"""


def test_prices_default_to_free_and_are_read(tmp_path: Path) -> None:
    assert OwnerPolicy().prices == OwnerPrices()
    path = tmp_path / "policy.toml"
    path.write_text(PRICED)
    policy = load_owner_policy(path)
    assert policy.prices == OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)
    assert policy.as_dict()["prices"] == {
        "per_point_read": "0.010000",
        "per_point_delivered": "0.050000",
        "per_epsilon": "2.000000",
        "minimum": "1.000000",
    }


def test_prices_round_trip_through_toml_and_free_policy_text_is_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(PRICED)
    policy = load_owner_policy(path)
    again = OwnerPolicy.from_mapping(tomllib.loads(policy.to_toml()))
    assert again == policy
    # A free policy writes no [prices]: a ledger that recorded it before prices existed
    # records no change of policy.
    assert "[prices]" not in OwnerPolicy().to_toml()
    assert "[prices]" in policy.to_toml()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[prices]\nper_point_read = 0.01\n", r"prices\]\.per_point_read.*decimal string"),
        ("[prices]\nper_point_read = '-1'\n", r"prices\]\.per_point_read.*>= 0"),
        ("[prices]\nper_point = '1'\n", r"unknown price.*per_point"),
        ("[prices]\nminimum = '0.0000001'\n", r"prices\]\.minimum.*six decimals"),
        ("prices = 3\n", r"\[prices\] must be a table"),
    ],
)
def test_bad_prices_are_refused_at_load_naming_the_key(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_owner_policy(path)
    assert str(path) in str(info.value)


def test_the_console_shows_the_prices() -> None:
    from dpmarket.console.owner import _policy_rows

    policy = OwnerPolicy(prices={"per_point_read": "0.5"})  # type: ignore[arg-type]
    rows = dict(_policy_rows(policy.as_dict()))
    assert rows["prices"] == (
        "per_point_read 0.500000, per_point_delivered 0.000000, per_epsilon 0.000000, "
        "minimum 0.000000 credits"
    )
