"""The request form's methods follow the fewest owners the consumer chooses.

Three in-process owners with real ledgers: two under the tutorial's policy (exact bids off), one
that allows exact bids. The curator's ListMethods answer (:meth:`SessionManager.methods`) says
the private method is refused by two of them; with every owner (``min_owners`` 0) a private
request is refused, but with ``min_owners`` 1 it runs with the one owner that serves it. The
form (:func:`~dpmarket.console.consumer.method_form`) must say so for each value of its “Fewest
owners”: the method enabled with a note naming how many owners take part where a request would
run, disabled with the reason where it would be refused. The control is the session itself,
asked of the same curator with each ``min_owners``: it runs exactly where the form says it
would (with the owners it named, the others charged nothing), and is refused elsewhere.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.summarization.methods import PrivateConfig
from dpmarket.common.summarization.summary import OwnerSelection, SessionRequest, SummaryResult
from dpmarket.common.summarization.terms import MethodOffer
from dpmarket.console.consumer import method_form
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner

TUTORIAL = OwnerPolicy(allow_steered_selection=True)
TRUSTING = OwnerPolicy(allow_steered_selection=True, allow_exact_bids=True)
PRIVATE = PrivateConfig(summary_size=4, rff_dimension=32)


def _manager(tmp_path: Path, digits: Scenario) -> tuple[SessionManager, list[OwnerLedger]]:
    ledgers, endpoints = [], []
    for data, policy in zip(digits.owners[:3], (TUTORIAL, TUTORIAL, TRUSTING), strict=True):
        ledger = OwnerLedger.create(tmp_path / data.name, policy)
        ledgers.append(ledger)
        endpoints.append(LocalOwnerEndpoint(Owner(data.name, data, ledger=ledger)))
    return SessionManager(endpoints, policy=CuratorPolicy(allow_seeded_sessions=True)), ledgers


def _private_session(
    manager: SessionManager, digits: Scenario, min_owners: int
) -> SummaryResult | FailedPreconditionError:
    async def run() -> SummaryResult:
        request = SessionRequest(
            PRIVATE,
            digits.validation,
            digits.seed_set,
            seed=3,
            selection=OwnerSelection(min_owners=min_owners),
        )
        sid = await manager.create(request)
        async for _ in manager.watch(sid):
            pass
        return manager.result(sid)

    try:
        return asyncio.run(run())
    except FailedPreconditionError as exc:
        return exc


def test_the_form_says_what_a_request_with_the_chosen_fewest_owners_would_do(
    tmp_path: Path, digits: Scenario
) -> None:
    manager, ledgers = _manager(tmp_path, digits)
    offers = asyncio.run(manager.methods())
    names = [o.name for o in digits.owners[:3]]
    refusing, serving = ", ".join(sorted(names[:2])), names[2]
    form = method_form(offers)
    assert form["owners"] == 3 and form["levels"] == [0, 1, 2, 3, 4]  # 4: more than there are
    states = {m["method"]: m["states"] for m in form["methods"]}
    private = states["private"]
    # Every owner asked (0): refused, saying by whom and what the form's field would change.
    assert not private[0]["runs"] and private[0]["label"] == "private (not with every owner)"
    assert f"refused by {refusing}: access.allow_exact_bids off" in private[0]["note"]
    assert "the form's “Fewest owners (min_owners)” 1 or fewer" in private[0]["note"]
    # One owner enough: it runs, with the one owner that serves it, named.
    assert private[1] == {
        "runs": True,
        "label": "private (1 of 3 owners)",
        "note": f"would run with 1 of 3 owners ({serving}); {refusing} refuse it and would be "
        "left out, charged nothing",
    }
    for level in (2, 3, 4):  # more than serve it: refused, saying how many do
        assert not private[level]["runs"]
        assert private[level]["label"] == "private (only 1 owner serves it)"
        assert private[level]["note"].startswith(
            f"only 1 of 3 owners serve it ({serving}; {refusing} refuse it): a request needing "
            f"{level} would be refused, nothing charged"
        )
    # Served by every owner: runs with up to 3, not with more than there are.
    assert [s["runs"] for s in states["candidates"]] == [True, True, True, True, False]
    assert states["candidates"][0]["note"] == f"would run with 3 of 3 owners ({', '.join(names)})"
    # Not in the curator's policy: never, whatever the owners.
    assert not any(s["runs"] for s in states["greedy"])
    assert "this curator's policy does not serve it" in states["greedy"][1]["note"]
    # The control: the same curator and owners, a private session with each min_owners.
    for level in range(4):
        outcome = _private_session(manager, digits, level)
        assert isinstance(outcome, SummaryResult) == private[level]["runs"], (level, outcome)
        if isinstance(outcome, SummaryResult):
            assert sorted(outcome.report.left_out) == sorted(names[:2])
            assert sorted(outcome.report.owner_spend) == [serving]
    # The refusing owners were charged nothing by any of them; the serving one by the one run.
    assert [len(ledger.entries()) for ledger in ledgers[:2]] == [0, 0]
    assert len({e.session for e in ledgers[2].entries()}) == 1
    for ledger in ledgers:
        ledger.close()
    asyncio.run(manager.close())


def test_a_negative_fewest_owners_is_refused() -> None:
    offer = MethodOffer("private", False, "", ("c",), ("a", "b"))
    with pytest.raises(ValueError, match="min_owners must be >= 0, got -1"):
        offer.runs_with(-1)
    assert offer.runs_with(1) and not offer.runs_with(0)  # the control
