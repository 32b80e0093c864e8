"""Sessions continue without an exhausted, unreachable or excluded owner when the consumer allows
it.

In-process owners keep real durable ledgers under the default owner policy; one of them has
spent its lifetime budget already. By default (``min_owners`` 0) a request needs every owner it
asks: the refusal, or an owner that cannot be reached, fails it, nothing spent, saying how many
owners were reachable and naming who was left out with a public reason (never a budget figure);
``min_owners`` N leaves the exhausted owner out when N others remain, names it in the report
with a public reason, and charges it nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.summary import (
    LEFT_OUT_REASONS,
    OwnerSelection,
    SessionRequest,
    SummaryResult,
)
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from tests.conftest import exhaust

#: The owners' policy: the defaults, and the candidates methods served (their rows are picked
#: along the curator's embedding: tests/owner/test_exact_bids.py, the default refuses them).
SERVING = OwnerPolicy(allow_steered_selection=True)

CONFIG = CandidatesConfig(summary_size=10, rff_dimension=32)
K = 5
EXHAUSTED = 4  # index of the owner whose lifetime budget is spent


class Gone(LocalOwnerEndpoint):
    """An owner whose machine is down: every call fails as a lost connection does."""

    async def info(self) -> Any:
        raise UnavailableError(f"cannot reach owner {self.name}: nothing listening at 10.0.0.9:1")


def _owners(tmp_path: Path, digits: Scenario) -> tuple[list[Owner], list[OwnerLedger]]:
    owners, ledgers = [], []
    for i, data in enumerate(digits.owners[:K]):
        ledger = OwnerLedger.create(tmp_path / data.name, SERVING)
        if i == EXHAUSTED:
            exhaust(ledger)
        owners.append(Owner(data.name, data, ledger=ledger))
        ledgers.append(ledger)
    return owners, ledgers


def _summarize(
    tmp_path: Path,
    digits: Scenario,
    selection: OwnerSelection | None,
    *,
    gone: int | None = None,
) -> tuple[SummaryResult | BaseException, list[list[Any]]]:
    """One session through the curator's SessionManager; the result (or the error) and every
    owner's ledger entries afterwards."""
    owners, ledgers = _owners(tmp_path, digits)
    endpoints = [(Gone if i == gone else LocalOwnerEndpoint)(o) for i, o in enumerate(owners)]
    manager = SessionManager(endpoints, policy=CuratorPolicy(allow_seeded_sessions=True))

    async def run() -> SummaryResult:
        try:
            request = SessionRequest(
                CONFIG,
                digits.validation,
                digits.seed_set,
                seed=3,
                selection=selection or OwnerSelection(),
            )
            sid = await manager.create(request)
            async for _ in manager.watch(sid):
                pass
            return manager.result(sid)
        finally:
            await manager.close()

    try:
        outcome: SummaryResult | BaseException = asyncio.run(run())
    except (FailedPreconditionError, InvalidArgumentError, UnavailableError) as exc:
        outcome = exc
    entries = [ledger.entries() for ledger in ledgers]
    for ledger in ledgers:
        ledger.close()
    return outcome, entries


def test_by_default_an_exhausted_owner_fails_the_request_and_nothing_is_spent(
    tmp_path: Path, digits: Scenario
) -> None:
    outcome, entries = _summarize(tmp_path, digits, None)
    assert isinstance(outcome, FailedPreconditionError)
    assert str(outcome) == (
        "5 of the 5 owner(s) this request asks were reachable and 4 can take part; the request "
        "needs all 5 (--min-owners N lets it run with N); left out: "
        f"{digits.owners[EXHAUSTED].name} (budget refused)"
    )
    assert [len(e) for e in entries] == [0, 0, 0, 0, 5]


def test_by_default_an_unreachable_owner_fails_the_request_saying_how_many_answered(
    tmp_path: Path, digits: Scenario
) -> None:
    """The control of the rule: with ``min_owners`` 4 the same owners run the session without
    the unreachable one (the test below); by default it fails, nothing charged anywhere, with
    UNAVAILABLE (a retry may find the owner) naming how many were reachable, no address."""
    outcome, entries = _summarize(
        tmp_path, digits, OwnerSelection(exclude=(digits.owners[EXHAUSTED].name,)), gone=0
    )
    assert isinstance(outcome, UnavailableError)
    assert str(outcome) == (
        "3 of the 4 owner(s) this request asks were reachable and 3 can take part; the request "
        f"needs all 4 (--min-owners N lets it run with N); left out: {digits.owners[0].name} "
        "(unreachable)"
    )
    assert "10.0.0.9" not in str(outcome)
    assert [len(e) for e in entries] == [0, 0, 0, 0, 5]


def test_with_min_owners_the_session_runs_without_the_exhausted_owner(
    tmp_path: Path, digits: Scenario
) -> None:
    outcome, entries = _summarize(tmp_path, digits, OwnerSelection(min_owners=4))
    assert isinstance(outcome, SummaryResult), outcome
    exhausted = digits.owners[EXHAUSTED].name
    report = outcome.report
    assert report.left_out == {exhausted: "budget refused"}
    assert report.dropped_owners == (exhausted,)
    # Charged nothing, released nothing: its ledger holds only the earlier sessions, no summary
    # point is its, and its spend is not in the report; the four others paid the terms.
    assert len(entries[EXHAUSTED]) == 5
    assert exhausted not in outcome.owner_ids and exhausted not in report.owner_spend
    assert sorted(report.owner_spend) == sorted(o.name for o in digits.owners[:4])
    assert all(s.epsilon == pytest.approx(1.0) for s in report.owner_spend.values())
    assert len(outcome.points) == CONFIG.summary_size


def test_too_few_owners_left_fails_naming_who_and_why(tmp_path: Path, digits: Scenario) -> None:
    outcome, entries = _summarize(tmp_path, digits, OwnerSelection(min_owners=5))
    assert isinstance(outcome, FailedPreconditionError)
    assert str(outcome) == (
        "5 of the 5 owner(s) this request asks were reachable and 4 can take part; the request "
        "needs at least 5 (--min-owners N lets it run with N); left out: "
        f"{digits.owners[EXHAUSTED].name} (budget refused)"
    )
    assert [len(e) for e in entries] == [0, 0, 0, 0, 5]  # nothing released, nothing charged


def test_an_unreachable_owner_is_left_out_with_its_reason(tmp_path: Path, digits: Scenario) -> None:
    outcome, _ = _summarize(tmp_path, digits, OwnerSelection(min_owners=3), gone=0)
    assert isinstance(outcome, SummaryResult), outcome
    assert outcome.report.left_out == {
        digits.owners[0].name: "unreachable",
        digits.owners[EXHAUSTED].name: "budget refused",
    }
    assert set(outcome.report.left_out.values()) <= set(LEFT_OUT_REASONS)


def test_excluded_owners_are_never_asked(tmp_path: Path, digits: Scenario) -> None:
    excluded = digits.owners[1].name
    outcome, entries = _summarize(
        tmp_path, digits, OwnerSelection(min_owners=1, exclude=(excluded, digits.owners[4].name))
    )
    assert isinstance(outcome, SummaryResult), outcome
    assert outcome.report.left_out == {
        excluded: "excluded by the consumer",
        digits.owners[4].name: "excluded by the consumer",
    }
    assert outcome.report.dropped_owners == ()
    assert len(entries[1]) == 0 and excluded not in outcome.owner_ids
    assert outcome.report.all_owners_bound == 3 * CONFIG.summary_size  # K = 3 owners asked


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (OwnerSelection(exclude=("owner-nobody",)), "exclude_owners names owner-nobody, not"),
        (OwnerSelection(min_owners=6), "min_owners=6 exceeds the 5 owner(s)"),
    ],
)
def test_a_selection_that_cannot_be_met_is_refused_up_front(
    tmp_path: Path, digits: Scenario, selection: OwnerSelection, message: str
) -> None:
    outcome, entries = _summarize(tmp_path, digits, selection)
    assert isinstance(outcome, InvalidArgumentError)
    assert message in str(outcome)
    assert [len(e) for e in entries] == [0, 0, 0, 0, 5]


def test_excluding_every_owner_is_refused(tmp_path: Path, digits: Scenario) -> None:
    names = tuple(o.name for o in digits.owners[:K])
    outcome, _ = _summarize(tmp_path, digits, OwnerSelection(exclude=names))
    assert isinstance(outcome, InvalidArgumentError)
    assert "leaves no owner" in str(outcome)


@pytest.mark.parametrize("bad", [{"min_owners": -1}, {"exclude": ("a", "a")}, {"exclude": ("",)}])
def test_owner_selection_checks_its_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"min_owners|exclude"):
        OwnerSelection(**bad)
