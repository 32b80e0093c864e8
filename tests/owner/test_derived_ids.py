"""No curator id takes the form of an id the owner derives, and a payout is read from its charge.

A stranger's curator (issue 25, eighth pass, P1) opened a session under ``X/payout`` (the ledger id
of session X's payout release charge, :func:`dpmarket.owner.earnings.payout_session`), let it
charge 0.5 there, then opened X with a reward and read its points: the owner took "anything
charged under X/payout" for "X's payout is paid" and never charged the payout release its terms
fix. Each test runs a real :class:`~dpmarket.owner.protocol.Owner` and
:class:`~dpmarket.owner.cape.CapeSite` on a real ledger file; each fails on main.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import MarketTerms, owner_payout_epsilon, session_quote
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.earnings import PAYOUT_MECHANISM, payout_charged, payout_session
from dpmarket.owner.ids import MAX_CURATOR_ID_LENGTH
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet, Table
from tests.owner.test_settled_ids import CONSUMER, CURATOR, PRICES, SPEC, UNIFORM

N = 40
#: A reward session's settlement: value rule, payout epsilon 1.
REWARD = SettlementTerms(4, 10, payout_epsilon=1.0, reward_rule="value", reward=5_000_000)
POLICY = OwnerPolicy(
    prices=PRICES,
    allow_steered_selection=True,
    allow_reward_disclosure=True,
    points_fraction_per_session=1.0,
    cape_min_colluders=0,
)
QUOTED = session_quote({"owner": PRICES}, {"owner": 2}, 0.0, REWARD)
#: A uniform session of 2 points with a reward (its owner charges the payout release).
REWARDED = dataclasses.replace(UNIFORM, market=MarketTerms.of(QUOTED, "owner", REWARD))


def reward_owner(path: Path, *, create: bool = False) -> Owner:
    """An owner whose policy accepts :data:`REWARDED`, on the ledger at ``path`` (``create``:
    a new one; else the one there, as a restarted owner opens it)."""
    if create:
        OwnerLedger.create(path, POLICY).close()
    rng = np.random.default_rng(0)
    data = PointSet(rng.normal(size=(N, 3)), np.arange(N) % 2, "o")
    return Owner("owner", data, ledger=OwnerLedger(path, POLICY))


@pytest.fixture
def rff() -> RFFParams:
    return draw_rff_params(3, 8, 0.5, np.random.default_rng(1))


def _open(owner: Owner, sid: str, rff: RFFParams, terms: OwnerTerms = REWARDED) -> None:
    owner.open_session(sid, rff, 0, terms=terms, curator=CURATOR, consumer=CONSUMER)


@pytest.mark.parametrize(
    "bad",
    [
        "X/payout",
        "X/",
        "/X",
        "ledger-rollback-1",
        "ledger-dismissed-x",
        "sketch:h:0123",
        "a" * 250,
        "x\nd: session 0000 settled FORGED",
        "x\rd",
        "x\td",
        "x\x1b[2Jd",
        "x\u2028d",
        "x\u200bd",
    ],
)
def test_a_curator_id_of_a_derived_form_is_refused_at_every_open_and_step(
    tmp_path: Path, rff: RFFParams, bad: str
) -> None:
    """OpenSession, OpenCapeJob, a step and a close under an id holding the separator, starting
    with an operator's prefix, too long for its payout id, or holding a control or other
    non-printable character (a ledger table would print it across lines): INVALID_ARGUMENT
    naming it, nothing recorded or charged. Control: the id without its derived form opens."""
    owner = reward_owner(tmp_path, create=True)
    assert owner.ledger is not None
    table = Table(("x", "y"), np.random.default_rng(2).uniform(0, 1, size=(N, 2)), "owner")
    site = CapeSite("owner", table, ledger=owner.ledger, min_colluders=0)
    with pytest.raises(InvalidArgumentError, match="session_id"):
        _open(owner, bad, rff)
    with pytest.raises(InvalidArgumentError, match="job_id"):
        site.open(bad, SPEC, 1, curator=CURATOR, consumer=CONSUMER)
    with pytest.raises(InvalidArgumentError):
        owner.sample_uniform(bad, 2, CURATOR)
    with pytest.raises(InvalidArgumentError):
        owner.close_session(bad, CURATOR)
    with pytest.raises(InvalidArgumentError):
        site.close(bad, curator=CURATOR)
    assert owner.ledger.entries() == []
    assert (
        owner.ledger.read(lambda c: c.execute("SELECT COUNT(*) FROM opened_ids").fetchone())[0] == 0
    )
    # Control: a plain id of the longest length opens (its payout id is a ledger name).
    _open(owner, "a" * MAX_CURATOR_ID_LENGTH, rff)
    assert len(payout_session("a" * MAX_CURATOR_ID_LENGTH)) == 256


def test_the_payout_is_charged_whatever_else_its_derived_id_holds(
    tmp_path: Path, rff: RFFParams
) -> None:
    """A ledger holding a curator's charge under ``X/payout`` (an open of the earlier release,
    which took such ids): the reward session X still charges its payout release, before its
    points, and the payout read for X is that charge alone. Control: the same session under a
    fresh id charges the same payout."""
    owner = reward_owner(tmp_path, create=True)
    ledger = owner.ledger
    assert ledger is not None
    payout = owner_payout_epsilon(REWARD)
    assert payout > 0
    ledger.charge(  # what the curator's session "X/payout" charged (a count)
        session=payout_session("X"),
        consumer=CONSUMER,
        curator=CURATOR,
        mechanism="candidates counts; relevant count",
        epsilon=0.5,
        delta=0.0,
        points=0,
    )
    for sid in ("X", "Y"):  # Y: the control
        _open(owner, sid, rff)
        owner.sample_uniform(sid, 2, CURATOR)
        owner.close_session(sid, CURATOR)
        releases = [e for e in ledger.entries() if e.mechanism == PAYOUT_MECHANISM]
        assert [e.session for e in releases][-1] == payout_session(sid)
        assert payout_charged(ledger, sid) == pytest.approx(payout)
        # charged before the points
        order = [e.session for e in ledger.entries() if e.session in (sid, payout_session(sid))]
        assert order[-2:] == [payout_session(sid), sid]
