"""A session whose owner restarted after its open settles for every owner once it is back.

A stranger (issue 25, eighth pass, W1) stopped an owner right after a session opened there (nothing
charged), the session failed, and the owner restarted: its CloseSession answered NOT_FOUND, so the
curator's record of it stayed unknown and the session was settled for no owner, also the ones
that released points. Here the first owner releases its points (and its payout charge), the
second is down from its sample on (its close too), and is then restarted: a new
:class:`~dpmarket.owner.protocol.Owner` over the same ledger file. The curator's reconciliation
gets its record from its ledger and settles the session; each owner records its part of the
statement (the owner's record, the payout of the one that released points included, matches).
In-process owners with real durable ledgers, a real curator store; fails on main.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import UnavailableError
from dpmarket.common.market.terms import RewardOffer
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.methods import UniformConfig
from dpmarket.common.summarization.summary import SessionRequest
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.store import CuratorStore
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner

CONSUMER = "consumer:alice"
CONFIG = UniformConfig(summary_size=6, rff_dimension=16)
REWARD = RewardOffer("value", 1_000_000, 1.0)


class _DownFromSample(LocalOwnerEndpoint):
    """An owner that opens the session, then is unreachable: its sample and its close."""

    async def sample_uniform(self, session_id: str, count: int) -> tuple[Any, Any]:
        raise UnavailableError("owner unreachable")

    async def close_session(self, session_id: str) -> SessionSpend:
        raise UnavailableError("owner unreachable")


def test_an_owner_restarted_after_the_open_gives_its_record_and_the_session_settles(
    tmp_path: Path, digits: Scenario
) -> None:
    policy = OwnerPolicy(allow_reward_disclosure=True)
    owners = []
    for data in digits.owners[:2]:
        ledger = OwnerLedger.create(tmp_path / data.name, policy)
        owners.append(Owner(data.name, data, ledger=ledger))
    store = CuratorStore(tmp_path / "curator")
    curator = CuratorPolicy(allow_seeded_sessions=True)
    key = ec.generate_private_key(ec.SECP256R1())

    async def run() -> str:
        endpoints = [LocalOwnerEndpoint(owners[0]), _DownFromSample(owners[1])]
        manager = SessionManager(endpoints, policy=curator, store=store, signing_key=key)
        request = SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=3, reward=REWARD)
        try:
            sid = await manager.create(request, consumer=CONSUMER)
            seen = [item async for item in manager.watch(sid, CONSUMER)]
            assert seen[-1][0].stage == "failed"
        finally:
            await manager.close()
        assert store.statements(CONSUMER, session_id=sid) == []  # a record is unknown
        # The second owner restarts: a new Owner over its ledger file (its session is gone).
        data = digits.owners[1]
        assert owners[1].ledger is not None
        owners[1].ledger.close()
        ledger = OwnerLedger(tmp_path / data.name, policy)
        owners[1] = Owner(data.name, data, ledger=ledger)
        endpoints = [LocalOwnerEndpoint(owners[0]), LocalOwnerEndpoint(owners[1])]
        restarted = SessionManager(endpoints, policy=curator, store=store, signing_key=key)
        try:
            await restarted.reconcile()
        finally:
            await restarted.close()
        return sid

    sid = asyncio.run(run())
    assert len(store.statements(CONSUMER, session_id=sid)) == 1
    owner_session = store.market(sid).owner_session  # type: ignore[union-attr]
    # Each owner's part, delivered as RecordStatement does (an in-process owner has no RPC).
    by_name = {o.owner_id: o for o in owners}
    parts = store.undelivered()
    assert sorted(row[1] for row in parts) == sorted(by_name)
    for _, name, part, signature in parts:
        book = by_name[name].ledger
        assert book is not None
        _, added = Earnings(book, name).record(
            part, signature, curator=LOCAL_CURATOR, curator_key=key.public_key()
        )
        assert added, name
        assert [e.session for e in Earnings(book, name).all()] == [owner_session]
    assert owners[0].ledger is not None and owners[1].ledger is not None
    assert owners[0].ledger.session_totals(owner_session).points > 0  # it released (control)
    assert owners[1].ledger.session_totals(owner_session).points == 0
