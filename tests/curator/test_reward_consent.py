"""A consumer's reward runs only among owners that consent to what its statement discloses.

In-process owners with real durable ledgers; two consent to rewards
(``access.allow_reward_disclosure = true``), the third keeps the default. The curator reads
their published access (GetOwnerInfo) and leaves out the owner that does not consent before
anything is quoted or opened: by default (``min_owners`` 0) the request is refused, naming it
and the key, nothing charged anywhere; with ``min_owners`` 2 the session runs with the two that
consent, and the third is charged nothing. The network path: tests/integration/test_trust.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.terms import NO_REWARD, RewardOffer
from dpmarket.common.summarization.methods import UniformConfig
from dpmarket.common.summarization.summary import OwnerSelection, SessionRequest, SummaryResult
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner

CONFIG = UniformConfig(summary_size=6, rff_dimension=16)
K = 3
REFUSING = 2  # the owner that keeps the default policy
REWARD = RewardOffer("value", 1_000_000, 1.0)


def _summarize(
    tmp_path: Path, digits: Scenario, reward: RewardOffer, min_owners: int
) -> tuple[SummaryResult | FailedPreconditionError, list[list[Any]]]:
    """One session through the curator's SessionManager: the result (or the refusal) and every
    owner's ledger entries afterwards."""
    owners, ledgers = [], []
    for i, data in enumerate(digits.owners[:K]):
        policy = OwnerPolicy(allow_reward_disclosure=i != REFUSING)
        ledger = OwnerLedger.create(tmp_path / data.name, policy)
        owners.append(Owner(data.name, data, ledger=ledger))
        ledgers.append(ledger)
    manager = SessionManager(
        [LocalOwnerEndpoint(o) for o in owners],
        policy=CuratorPolicy(allow_seeded_sessions=True),
    )

    async def run() -> SummaryResult:
        try:
            request = SessionRequest(
                CONFIG,
                digits.validation,
                digits.seed_set,
                seed=3,
                selection=OwnerSelection(min_owners=min_owners),
                reward=reward,
            )
            sid = await manager.create(request)
            async for _ in manager.watch(sid):
                pass
            return manager.result(sid)
        finally:
            await manager.close()

    try:
        outcome: SummaryResult | FailedPreconditionError = asyncio.run(run())
    except FailedPreconditionError as exc:
        outcome = exc
    entries = [ledger.entries() for ledger in ledgers]
    for ledger in ledgers:
        ledger.close()
    return outcome, entries


def test_a_reward_is_refused_naming_the_owners_that_do_not_consent(
    tmp_path: Path, digits: Scenario
) -> None:
    """By default every owner asked must take part: the owner that does not consent fails the
    request before any owner is opened, and nothing is charged anywhere. Control: the same
    request without the reward runs with every owner."""
    outcome, entries = _summarize(tmp_path / "reward", digits, REWARD, 0)
    assert isinstance(outcome, FailedPreconditionError)
    text = str(outcome)
    name = digits.owners[REFUSING].name
    assert f"left out: {name} (refused the session)" in text, text
    assert "access.allow_reward_disclosure off" in text and "without --reward" in text
    assert entries == [[], [], []]
    control, entries = _summarize(tmp_path / "none", digits, NO_REWARD, 0)
    assert isinstance(control, SummaryResult), control
    assert all(entries), "every owner took part"


def test_with_min_owners_a_reward_runs_among_the_owners_that_consent(
    tmp_path: Path, digits: Scenario
) -> None:
    """``min_owners`` 2 lets the session run with the two owners that consent; the third is
    left out with a public reason, and charged nothing."""
    outcome, entries = _summarize(tmp_path, digits, REWARD, 2)
    assert isinstance(outcome, SummaryResult), outcome
    name = digits.owners[REFUSING].name
    assert outcome.report.left_out == {name: "refused the session"}
    assert name not in outcome.owner_ids
    assert entries[REFUSING] == [] and entries[0] and entries[1]
