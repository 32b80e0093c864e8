"""The curator's policy: file parsing names the bad key, and requests outside a range are refused
with the range in the message."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import RewardOffer, owner_payout_epsilon
from dpmarket.common.summarization.methods import CandidatesConfig, PrivateConfig, method_config
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.curator.policy import (
    DEFAULT_RANGES,
    CuratorPolicy,
    load_curator_policy,
    policy_from_mapping,
)


# ------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"request": {}}, ["unknown section", "request"]),
        ({"requests": {"epsilon": [0.1, 1.0]}}, ["requests.epsilon"]),
        ({"requests": {"delta": 1e-6}}, ["requests.delta", "[low, high]"]),
        ({"requests": {"delta": [1e-6]}}, ["requests.delta"]),
        ({"requests": {"delta": ["a", "b"]}}, ["requests.delta"]),
        ({"requests": {"delta": [True, 1.0]}}, ["requests.delta"]),
        ({"requests": {"summary_size": [10, 1]}}, ["summary_size", "[10.0, 1.0]"]),
        ({"requests": {"methods": "private"}}, ["requests.methods"]),
        ({"requests": {"methods": ["private", "magic"]}}, ["unknown method", "magic"]),
        ({"sessions": {"max_runing": 3}}, ["sessions.max_runing"]),
        ({"sessions": {"max_running": 0}}, ["max_running", "0"]),
        ({"sessions": {"per_consumer_per_minute": 1.5}}, ["per_consumer_per_minute", "1.5"]),
        ({"sessions": {"result_ttl_seconds": -1}}, ["result_ttl_seconds", "-1"]),
        ({"sessions": {"fetched_result_ttl_seconds": "60"}}, ["fetched_result_ttl_seconds"]),
        ({"access": {"consumers": "alice"}}, ["access.consumers"]),
        ({"access": {"allow_seeded_sessions": "yes"}}, ["access.allow_seeded_sessions"]),
        ({"access": {"admins": []}}, ["access.admins"]),
        ({"sketches": {"per_ownr": 3}}, ["sketches.per_ownr"]),
        ({"sketches": {"per_owner": 0}}, ["sketches_per_owner", "0"]),
        ({"requests": {"sketch_hist_bins": [1]}}, ["requests.sketch_hist_bins"]),
    ],
)
def test_policy_errors_name_the_source_and_the_key(data: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        policy_from_mapping(data, source="curator.toml")
    message = str(info.value)
    assert message.startswith("curator.toml: "), message
    for name in names:
        assert name in message, (name, message)


def test_policy_file_is_read_and_its_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "curator.toml"
    path.write_text(
        """
        [requests]
        rff_dimension = [8, 512]
        iterations_initial = [0, 5000]
        methods = ["uniform", "private"]
        [sessions]
        max_running = 2
        per_consumer_per_minute = 3
        fetched_result_ttl_seconds = 2.5
        [access]
        consumers = ["alice"]
        allow_seeded_sessions = true
        """,
        encoding="utf-8",
    )
    policy = load_curator_policy(path)
    assert policy.ranges["rff_dimension"] == (8.0, 512.0)
    assert policy.ranges["delta"] == DEFAULT_RANGES["delta"], "unset ranges keep their default"
    assert policy.methods == ("uniform", "private")
    assert (policy.max_running, policy.per_consumer_per_minute) == (2, 3)
    assert policy.fetched_result_ttl_seconds == 2.5
    assert policy.consumers == ("alice",) and policy.allow_seeded_sessions
    path.write_text("[requests]\nrff_dimension = [8, \n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}: not valid TOML")):
        load_curator_policy(path)
    path.write_text("[sessions]\nmax_running = -2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*max_running"):
        load_curator_policy(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.toml does not exist"):
        load_curator_policy(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ranges": {"epsilon": (0.0, 1.0)}}, "unknown request parameter 'epsilon'"),
        ({"ranges": {"delta": (1.0, 0.0)}}, r"range of delta must be \[low, high\]"),
        ({"ranges": {"delta": (0.0, math.inf)}}, "range of delta"),
        ({"methods": ("everything",)}, "unknown method"),
        ({"max_running": True}, "max_running must be an integer >= 1"),
        ({"fetched_result_ttl_seconds": math.nan}, "fetched_result_ttl_seconds"),
    ],
)
def test_policy_constructor_refuses_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CuratorPolicy(**kwargs)


# ----------------------------------------------------------------------------- checking
POLICY = CuratorPolicy().with_overrides(
    ranges={
        "summary_size": (1, 100),
        "epsilon_owners_total": (0.01, 2.0),
        "delta": (1e-12, 1e-6),
        "candidate_fraction": (0.05, 0.5),
        "rff_dimension": (8, 512),
        "iterations_initial": (0, 5000),
        "owners_epsilon": (0.0, 3.0),
        "owners_delta": (0.0, 1e-5),
    }
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"summary_size": 101},
            "summary_size = 101 is outside this curator's allowed range [1, 100]",
        ),
        ({"epsilon_owners_total": 2.5}, "epsilon_owners_total = 2.5 is outside [0.01, 2]"),
        ({"delta": 1e-5}, "delta = 1e-05 is outside [1e-12, 1e-06]"),
        ({"candidate_fraction": 0.8}, "candidate_fraction = 0.8 is outside [0.05, 0.5]"),
        ({"rff_dimension": 1024}, "rff_dimension = 1024 is outside [8, 512]"),
        ({"method": "greedy"}, "method 'greedy' is not served by this curator"),
        (
            {"method": "private", "rff_dimension": 512, "iterations_initial": 0},
            "MWEM iterations T_init = 11585 is outside [0, 5000]",
        ),
    ],
)
def test_out_of_range_requests_are_refused_naming_the_allowed_range(
    changes: dict[str, Any], message: str
) -> None:
    values = {"summary_size": 10, "method": "candidates", **changes}
    config = method_config(values.pop("method"), **values)
    with pytest.raises(InvalidArgumentError) as info:
        POLICY.check_request(config, validation_points=40)
    got = str(info.value).replace("is outside this curator's allowed range", "is outside")
    assert message.replace("is outside this curator's allowed range", "is outside") in got


def test_requests_at_the_edges_of_every_range_are_accepted() -> None:
    private = PrivateConfig(summary_size=100, rff_dimension=512, iterations_initial=5000)
    candidates = CandidatesConfig(
        summary_size=100,
        rff_dimension=512,
        epsilon_owners_total=2.0,
        delta=1e-6,
        candidate_fraction=0.5,
    )
    for config in (private, candidates):
        POLICY.check_request(config, validation_points=40)
        with pytest.raises(InvalidArgumentError, match="validation set size m = 0"):
            POLICY.check_request(config, validation_points=0)


def test_the_values_of_a_request_are_bounded_as_its_receive_limit_assumes() -> None:
    """(m + n0) x n: what CreateSession's receive limit is derived from
    (dpmarket.curator.service)."""
    config = CandidatesConfig(summary_size=10)
    high = int(DEFAULT_RANGES["validation_values"][1])
    CuratorPolicy().check_request(config, 40, high)
    with pytest.raises(InvalidArgumentError) as info:
        CuratorPolicy().check_request(config, 40, high + 1)
    assert f"(m + n0) x n = {high + 1}" in str(info.value)
    assert f"[1, {high}]" in str(info.value)


def test_session_terms_are_bounded_too() -> None:
    POLICY.check_terms(OwnerTerms(SessionMethod.PRIVATE, 3.0, 1e-5, 10))
    with pytest.raises(InvalidArgumentError, match=r"epsilon on owners' data = 3\.5 .*\[0, 3\]"):
        POLICY.check_terms(OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 3.5, 0.0))
    with pytest.raises(InvalidArgumentError, match=r"delta on owners' data = 0\.1 "):
        POLICY.check_terms(OwnerTerms(SessionMethod.PRIVATE, 1.0, 0.1, 10))
    # Non-private terms are the method check's to refuse (greedy must be served).
    POLICY.check_terms(OwnerTerms(SessionMethod.GREEDY, math.inf, 0.0, 10))


def test_a_rewards_payout_release_counts_in_the_session_terms() -> None:
    """The payout release's epsilon is a requester parameter with its range, and what it
    charges each owner counts in the owners' epsilon (main checked the terms' epsilon alone:
    terms of 2.5 with a payout charging owners 1 passed a bound of 3)."""
    terms = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 2.5, 0.0)
    reward = RewardOffer("value", 1_000_000, 1.0).settlement(10, 40)
    payout = owner_payout_epsilon(reward)
    assert 0.5 < payout <= 1.0
    POLICY.check_terms(terms)  # the control: the terms alone are within the bound
    POLICY.check_terms(terms, SettlementTerms(10, 40))  # no reward: nothing added
    with pytest.raises(InvalidArgumentError, match=r"its payout release's .*\[0, 3\]"):
        POLICY.check_terms(terms, reward)
    with pytest.raises(InvalidArgumentError, match=r"payout epsilon = 5 .*\[0\.01, 4\]"):
        POLICY.check_terms(
            OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0),
            RewardOffer("value", 1_000_000, 5.0).settlement(10, 40),
        )
