"""An owner serves a consumer's reward only if its policy consents to what the reward's
statement discloses (``access.allow_reward_disclosure``).

With a reward, each owner's statement states exactly how many of its points the summary holds:
a function of the consumer's validation set and of the other owners' points, not a DP release.
Every test runs an :class:`~dpmarket.owner.protocol.Owner` with its real durable ledger, called
as a curator would call it (over gRPC: ``tests/integration/test_trust.py`` and
``tests/integration/test_market.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import BudgetRefusedError, FailedPreconditionError, NotFoundError
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import MarketTerms, RewardOffer
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner
from dpmarket.runtime.tables import PointSet

N_POINTS = 40
P, M = 4, 10
RFF = draw_rff_params(3, 8, 0.5, np.random.default_rng(0))
REWARD = RewardOffer("value", 1_000_000, 1.0)
#: A free owner's line: up to 4 points read, at no charge.
WITHOUT = MarketTerms(4, 0, 0, SettlementTerms(P, M))
WITH = dataclasses.replace(WITHOUT, settlement=REWARD.settlement(P, M))
PROPORTIONAL = dataclasses.replace(
    WITHOUT, settlement=RewardOffer("proportional", 1_000_000, 1.0).settlement(P, M)
)


def _terms(market: MarketTerms | None) -> OwnerTerms:
    return OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0, market=market)


@pytest.fixture
def data() -> PointSet:
    rng = np.random.default_rng(3)
    return PointSet(rng.uniform(0.0, 1.0, size=(N_POINTS, 3)), np.arange(N_POINTS) % 2, "o")


def _owner(data: PointSet, tmp_path: Path, **policy: object) -> tuple[Owner, OwnerLedger]:
    ledger = OwnerLedger.create(tmp_path / "owner", OwnerPolicy(**policy))  # type: ignore[arg-type]
    return Owner("o", data, ledger=ledger), ledger


@pytest.mark.parametrize("market", [WITH, PROPORTIONAL], ids=["value", "proportional"])
def test_terms_with_a_reward_are_refused_by_default_before_anything_is_read_or_charged(
    data: PointSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, market: MarketTerms
) -> None:
    """A default policy refuses terms that carry a reward (either rule) when the session opens:
    before any work on the rows, naming the key, charging and recording nothing (no accepted
    terms either). Control: the same terms without the reward open and run."""
    owner, ledger = _owner(data, tmp_path)

    def features(*args: object) -> None:
        raise AssertionError("the refusal must come before any work on the rows")

    monkeypatch.setattr(Owner, "_features", staticmethod(features))
    with pytest.raises(FailedPreconditionError, match=r"access\.allow_reward_disclosure = false"):
        owner.open_session("s", RFF, 0, terms=_terms(market))
    with pytest.raises(NotFoundError):
        owner.sample_uniform("s", 1)
    assert ledger.entries() == [] and owner.sessions == {}
    assert Earnings(ledger, "o").accepted_line(LOCAL_CURATOR, "s") is None
    monkeypatch.undo()
    owner.open_session("u", RFF, 0, terms=_terms(WITHOUT))
    owner.sample_uniform("u", 2)
    assert [(e.epsilon, e.points) for e in ledger.entries()] == [(0.0, 2)]


def test_the_refusal_names_the_key_and_the_way_out_and_depends_on_the_policy_only(
    data: PointSet, tmp_path: Path
) -> None:
    """A refusal of the policy (not of the budget: its text may reach a consumer), the same
    whatever the owner's budget, naming the rule, the key and what to do."""
    texts = set()
    for k, policy in enumerate(({}, {"epsilon_total": 0.001, "epsilon_per_session": 0.001})):
        owner, _ = _owner(data, tmp_path / str(k), **policy)
        with pytest.raises(FailedPreconditionError) as info:
            owner.open_session("s", RFF, 0, terms=_terms(WITH))
        assert not isinstance(info.value, BudgetRefusedError)
        texts.add(str(info.value))
    (text,) = texts
    assert "rule value" in text and "how many of its points the summary holds" in text
    assert "Request without --reward" in text
    assert "set access.allow_reward_disclosure = true" in text


def test_an_owner_that_consents_serves_the_reward_and_records_the_terms_it_consented_to(
    data: PointSet, tmp_path: Path
) -> None:
    """With ``access.allow_reward_disclosure = true`` the same terms open; the owner records
    the settlement it accepted, reward rule and amount included (what its statement is checked
    against), and charges the payout release with its first point."""
    owner, ledger = _owner(data, tmp_path, allow_reward_disclosure=True)
    owner.open_session("s", RFF, 0, terms=_terms(WITH))
    owner.sample_uniform("s", 2)
    accepted = Earnings(ledger, "o").accepted_line(LOCAL_CURATOR, "s")
    assert accepted is not None and accepted.settlement == WITH.settlement
    assert (accepted.settlement.reward_rule, accepted.settlement.reward) == ("value", 1_000_000)
    assert sum(e.points for e in ledger.entries()) == 2
    assert any(e.epsilon > 0 for e in ledger.entries()), "the payout release is charged"


@pytest.mark.parametrize(
    ("first", "again"),
    [(WITHOUT, WITH), (WITH, PROPORTIONAL), (WITH, WITHOUT)],
    ids=["reward-added", "rule-changed", "reward-dropped"],
)
def test_a_session_id_keeps_the_settlement_it_first_opened_with(
    data: PointSet, tmp_path: Path, first: MarketTerms, again: MarketTerms
) -> None:
    """A curator cannot add (or change) a reward after a session opened: reopened under its
    id with other settlement terms, even at an owner that consents to rewards, the session is
    refused, charging nothing; the terms recorded stay those it first opened with. Control: a
    reopen under the same terms opens."""
    owner, ledger = _owner(data, tmp_path, allow_reward_disclosure=True)
    owner.open_session("s", RFF, 0, terms=_terms(first))
    owner.close_session("s")
    before = ledger.entries()
    with pytest.raises(FailedPreconditionError, match="under the terms it first opened with"):
        owner.open_session("s", RFF, 0, terms=_terms(again))
    assert ledger.entries() == before and owner.sessions == {}
    accepted = Earnings(ledger, "o").accepted_line(LOCAL_CURATOR, "s")
    assert accepted is not None and accepted.settlement == first.settlement
    owner.open_session("s", RFF, 0, terms=_terms(first))
    assert set(owner.sessions) == {"s"}
