"""A session's payout charges: stated whether or not it ends, and a refused one settles.

The owners' payout charge is in the session's ledger and report whether or not it ends.

Every owner that releases a raw point charges its own ledger for the session's payout release
before the point leaves (``owner/protocol.Owner._charger``). Main recorded that charge in the
session's ledger only once the payout release was made, after a successful run: a session with
a reward that failed after an owner released its points (here the other owner drops out of the
uniform sample) stated no payout charge in its ledger, its report or the curator's store, while
the owner's ledger held it. And when the payout release's charge on the consumer's validation
set is refused at settlement, the session is settled without the release, saying so; main's
``settle`` raised (the terms' silent release disagreed with the delivered counts), the session
stayed unsettled and every retry raised again. In-process owners with real durable ledgers, a
real curator store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.common.market.payouts import PAYOUT_CHARGE_LABEL
from dpmarket.common.market.statement import decode_statement
from dpmarket.common.market.terms import RewardOffer, owner_payout_epsilon
from dpmarket.common.privacy.ledger import Charge
from dpmarket.common.summarization.methods import UniformConfig
from dpmarket.common.summarization.summary import SessionReport, SessionRequest
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.store import CuratorStore
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.earnings import Earnings, payout_session
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner

CONSUMER = "consumer:alice"
CONFIG = UniformConfig(summary_size=6, rff_dimension=16)
REWARD = RewardOffer("value", 1_000_000, 1.0)


class _DownAtSample(LocalOwnerEndpoint):
    """An owner that opens the session, then is unreachable when asked for its sample."""

    async def sample_uniform(self, session_id: str, count: int) -> tuple[Any, Any]:
        raise UnavailableError("owner unreachable")


def _consenting_owners(digits: Scenario, tmp_path: Path) -> tuple[list[Owner], list[OwnerLedger]]:
    """The scenario's first two owners, each over a new ledger whose policy consents to rewards."""
    owners, ledgers = [], []
    for data in digits.owners[:2]:
        ledger = OwnerLedger.create(tmp_path / data.name, OwnerPolicy(allow_reward_disclosure=True))
        owners.append(Owner(data.name, data, ledger=ledger))
        ledgers.append(ledger)
    return owners, ledgers


def _payout_charges(report: SessionReport | None) -> list[float]:
    assert report is not None
    book = report.ledger.party("owners")
    return [] if book is None else [c.event.epsilon for c in book.entries
                                    if c.label == PAYOUT_CHARGE_LABEL]  # fmt: skip


def test_a_failed_reward_session_states_the_payout_its_owners_charged(
    tmp_path: Path, digits: Scenario
) -> None:
    """The first owner samples (charging the payout before its points leave), the second is
    down: the session fails. Its report, its durable charges and the report a restarted
    curator reads state the owners' payout charge, once, at the epsilon the first owner's
    ledger holds. The control (the success path) is
    tests/integration/test_market.py::test_a_reward_is_split_by_the_private_payouts_charged_to_their_subjects."""
    owners, ledgers = _consenting_owners(digits, tmp_path)
    store = CuratorStore(tmp_path / "curator")
    endpoints = [LocalOwnerEndpoint(owners[0]), _DownAtSample(owners[1])]
    curator = CuratorPolicy(allow_seeded_sessions=True)
    key = ec.generate_private_key(ec.SECP256R1())

    async def run() -> tuple[str, SessionReport | None, SessionReport | None]:
        manager = SessionManager(endpoints, policy=curator, store=store, signing_key=key)
        request = SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=3, reward=REWARD)
        try:
            sid = await manager.create(request, consumer=CONSUMER)
            seen = [item async for item in manager.watch(sid, CONSUMER)]
            event, report = seen[-1]
            assert event.stage == "failed"
        finally:
            await manager.close()
        restarted = SessionManager(endpoints, policy=curator, store=store, signing_key=key)
        try:
            _, again = [item async for item in restarted.watch(sid, CONSUMER)][-1]
        finally:
            await restarted.close()
        return sid, report, again

    sid, report, again = asyncio.run(run())
    payout = owner_payout_epsilon(REWARD.settlement(CONFIG.summary_size, len(digits.validation)))
    assert payout > 0
    owner_session = store.market(sid).owner_session  # type: ignore[union-attr]
    charged = ledgers[0].session_totals(payout_session(owner_session)).epsilon
    assert charged == pytest.approx(payout)  # the first owner paid it
    assert ledgers[1].session_totals(payout_session(owner_session)).epsilon == 0.0
    assert _payout_charges(report) == [pytest.approx(payout)]
    assert _payout_charges(again) == [pytest.approx(payout)]
    # Its owner_spend names the owner that released (the one the payout charge is about).
    for stated in (report, again):
        assert stated is not None and stated.owner_spend[owners[0].owner_id].points > 0
    durable = [c for c in store.charges(sid) if c.label == PAYOUT_CHARGE_LABEL]
    assert [(c.party, c.event.epsilon) for c in durable] == [("owners", pytest.approx(payout))]
    for ledger in ledgers:
        ledger.close()


class _RacedStore(CuratorStore):
    """A store whose validation set's charge of the payout release is refused, as a budget
    another session spent first would (no budget of the curator refuses it today: the session's
    validation ledger has none; this is the refusal the settlement must survive)."""

    def record_charges(self, session_id: str, charges: Sequence[Charge], **kw: Any) -> None:
        if any(c.party == "validation" and c.label == PAYOUT_CHARGE_LABEL for c in charges):
            raise FailedPreconditionError("the validation set's budget is spent")
        super().record_charges(session_id, charges, **kw)


def test_a_payout_refused_at_settlement_is_settled_without_it_saying_so(
    tmp_path: Path, digits: Scenario
) -> None:
    """Both owners sample; the payout release's validation charge is refused when the session
    settles. The session is done (its summary delivered), its statement is stored, states the
    terms' settlement and why the payout was withheld, pays no value and no reward, and each
    owner's part passes the owner's own check (recorded in its earnings). Main: no statement
    (``settle`` raised; the session stayed unsettled)."""
    owners, ledgers = _consenting_owners(digits, tmp_path)
    store = _RacedStore(tmp_path / "curator")
    key = ec.generate_private_key(ec.SECP256R1())
    curator_policy = CuratorPolicy(allow_seeded_sessions=True)

    async def run() -> str:
        endpoints = [LocalOwnerEndpoint(o) for o in owners]
        manager = SessionManager(endpoints, policy=curator_policy, store=store, signing_key=key)
        request = SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=3, reward=REWARD)
        try:
            sid = await manager.create(request, consumer=CONSUMER)
            event, _ = [item async for item in manager.watch(sid, CONSUMER)][-1]
            assert event.stage == "done"
            assert manager.result(sid, CONSUMER).points.shape[0] == CONFIG.summary_size
        finally:
            await manager.close()
        return sid

    sid = asyncio.run(run())
    (stored,) = store.statements(CONSUMER, session_id=sid)
    statement = decode_statement(stored.data)
    header = statement.header
    assert "refused" in header.payout_withheld
    assert header.reward_rule == REWARD.rule and header.reward == REWARD.amount
    assert all(line.value == 0 and line.reward == 0 for line in statement.lines)
    assert all(line.points_delivered == min(line.points_read, CONFIG.summary_size)
               for line in statement.lines)  # fmt: skip
    assert not [c for c in store.charges(sid) if c.party == "validation"]
    parts = [row for row in store.undelivered() if row[0] == sid]
    assert len(parts) == len(owners)
    for (_, name, part, signature), owner, ledger in zip(parts, owners, ledgers, strict=True):
        assert name == owner.owner_id
        earning, recorded = Earnings(ledger, name).record(
            part, signature, curator=LOCAL_CURATOR, curator_key=key.public_key()
        )
        assert recorded and earning.reward == 0
    for ledger in ledgers:
        ledger.close()


def test_a_payout_the_policy_cannot_afford_is_refused_before_any_owner_opens(
    tmp_path: Path, digits: Scenario
) -> None:
    """The curator's bound on the owners' epsilon (here 0.5) counts the payout release's charge
    (1 for this reward): the request is refused when it is quoted, before any owner is opened,
    and nothing is charged anywhere (main opened both owners and ran). The control: the same
    request without the reward runs."""
    owners, ledgers = _consenting_owners(digits, tmp_path)
    store = CuratorStore(tmp_path / "curator")
    policy = CuratorPolicy(allow_seeded_sessions=True).with_overrides(
        ranges={"owners_epsilon": (0.0, 0.5)}
    )
    key = ec.generate_private_key(ec.SECP256R1())

    async def run(reward: RewardOffer) -> str:
        endpoints = [LocalOwnerEndpoint(o) for o in owners]
        manager = SessionManager(endpoints, policy=policy, store=store, signing_key=key)
        request = SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=3, reward=reward)
        try:
            sid = await manager.create(request, consumer=CONSUMER)
            event, _ = [item async for item in manager.watch(sid, CONSUMER)][-1]
            return event.stage
        finally:
            await manager.close()

    with pytest.raises(
        InvalidArgumentError, match=r"owners' data \(its terms' 0 and its payout release's 1\)"
    ):
        asyncio.run(run(REWARD))
    assert all(ledger.entries() == [] for ledger in ledgers)
    assert all(owner.sessions == {} for owner in owners)
    assert asyncio.run(run(RewardOffer())) == "done"  # the control
    assert all(ledger.entries() for ledger in ledgers)
    for ledger in ledgers:
        ledger.close()
