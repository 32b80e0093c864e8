"""Which summarization methods a deployment serves, before anything is asked (ListMethods).

Three in-process owners with real ledgers: two under the tutorial's policy (steered selection
allowed, exact bids off), one that also allows exact bids. The curator's answer, from the access
flags each owner publishes in its description, says which methods a session with every owner
would run and who refuses the others; the control is each owner's own check at OpenSession
(dpmarket.owner.terms), which refuses exactly the methods the answer says it refuses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.summarization.terms import SERVED_AS, OwnerTerms
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.terms import check_exact_bids, check_steered_selection

TUTORIAL = OwnerPolicy(allow_steered_selection=True)
TRUSTING = OwnerPolicy(allow_steered_selection=True, allow_exact_bids=True)


def _owners(tmp_path: Path, digits: Scenario) -> list[Owner]:
    policies = (TUTORIAL, TUTORIAL, TRUSTING)
    return [
        Owner(data.name, data, ledger=OwnerLedger.create(tmp_path / data.name, policy))
        for data, policy in zip(digits.owners[:3], policies, strict=True)
    ]


def test_the_curator_says_which_methods_every_owner_serves_and_who_refuses(
    tmp_path: Path, digits: Scenario
) -> None:
    owners = _owners(tmp_path, digits)
    manager = SessionManager([LocalOwnerEndpoint(o) for o in owners], policy=CuratorPolicy())
    offers = {o.method: o for o in asyncio.run(manager.methods())}
    names = [o.owner_id for o in owners]
    assert offers["candidates"].served and offers["uniform"].served
    assert offers["candidates"].reason == "" and offers["candidates"].serving == tuple(
        sorted(names)
    )
    for method in ("private", "rounds"):
        offer = offers[method]
        assert not offer.served
        assert offer.refusing == tuple(sorted(names[:2])) and offer.serving == (names[2],)
        refused_by = ", ".join(sorted(names[:2]))
        expected = f"refused by {refused_by}: access.allow_exact_bids off in their policies"
        assert expected in offer.reason
        assert "--min-owners 1 or fewer" in offer.reason  # the one owner that serves it
    greedy = offers["greedy"]  # the curator's default policy leaves it out (non-private)
    assert not greedy.served and "this curator's policy does not serve it" in greedy.reason
    # The control: each owner's own check when a session opens refuses exactly what the
    # curator said it refuses (nothing is charged by either).
    terms = {
        "candidates": OwnerTerms(SERVED_AS["candidates"], 0.0, 0.0),
        "uniform": OwnerTerms(SERVED_AS["uniform"], 0.0, 0.0),
        "private": OwnerTerms(SERVED_AS["private"], 0.5, 1e-7, 2),
        "rounds": OwnerTerms(SERVED_AS["rounds"], 0.5, 1e-7, 2),
    }
    for method, t in terms.items():
        for owner in owners:
            assert owner.ledger is not None
            refused = False
            try:
                check_exact_bids(owner.ledger.policy, t)
                check_steered_selection(owner.ledger.policy, t)
            except FailedPreconditionError:
                refused = True
            assert refused == (owner.owner_id in offers[method].refusing), (method, owner)


def test_an_owner_that_publishes_no_access_is_not_counted_as_refusing(
    tmp_path: Path, digits: Scenario
) -> None:
    """An owner without a ledger (or of an older version) says nothing of its access: no
    method is predicted refused on its account (it refuses at OpenSession if it does)."""
    data = digits.owners[0]
    manager = SessionManager([LocalOwnerEndpoint(Owner(data.name, data))], policy=CuratorPolicy())
    offers = {o.method: o for o in asyncio.run(manager.methods())}
    assert all(offers[m].served for m in ("candidates", "private", "rounds", "uniform"))
    # The control: the same owner with the tutorial's policy publishes it, and private is out.
    owner = Owner(data.name, data, ledger=OwnerLedger.create(tmp_path / "o", TUTORIAL))
    manager = SessionManager([LocalOwnerEndpoint(owner)], policy=CuratorPolicy())
    assert not {o.method: o for o in asyncio.run(manager.methods())}["private"].served
