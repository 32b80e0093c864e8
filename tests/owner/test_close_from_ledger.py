"""A restarted owner closes every id its ledger knows, from the ledger, and the id then settles.

A stranger (issue 25, eighth pass: W1, K3) stopped an owner right after a session opened (nothing
charged) and restarted it: its CloseSession answered NOT_FOUND forever, so the curator never had
the record and the session settled for no owner. A kill -9 between a reward session's two
charges of its first point (the payout release's, then the point's) left the same stuck state,
and a record of zero would not have settled either (the owner's record held the payout). Each
test restarts a real owner in process: a new :class:`~dpmarket.owner.protocol.Owner` over the
same ledger file; each fails on main.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import NotFoundError
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.curator.settlement import SessionMarket, settle_session
from dpmarket.owner.earnings import Earnings, payout_charged
from dpmarket.owner.protocol import Owner
from tests.owner.test_derived_ids import QUOTED, REWARD, REWARDED, reward_owner
from tests.owner.test_derived_ids import rff as rff  # the fixture
from tests.owner.test_settled_ids import CONSUMER, CURATOR, PRICES


class _Killed(BaseException):
    """A kill -9 of the owner inside a charge (nothing after it runs)."""


def _open(owner: Owner, sid: str, rff: RFFParams) -> None:
    owner.open_session(sid, rff, 0, terms=REWARDED, curator=CURATOR, consumer=CONSUMER)


def _restart(owner: Owner, path: Path) -> Owner:
    assert owner.ledger is not None
    owner.ledger.close()
    return reward_owner(path)


def _settle(owner: Owner, sid: str, spend: SessionSpend) -> bool:
    """The honest curator's statement from ``spend``, delivered to the owner: recorded?"""
    key = ec.generate_private_key(ec.SECP256R1())
    market = SessionMarket(sid, CONSUMER, QUOTED, {"owner": PRICES}, REWARD)
    signed = settle_session(market, {"owner": spend}, {}, key)
    assert signed is not None
    data, signature = signed.owners["owner"]
    assert owner.ledger is not None
    _, added = Earnings(owner.ledger, "owner").record(
        data, signature, curator=CURATOR, curator_key=key.public_key()
    )
    return added


def test_an_id_opened_before_a_restart_closes_from_the_ledger_and_settles(
    tmp_path: Path, rff: RFFParams
) -> None:
    """Opened, nothing charged, the owner restarted: CloseSession answers zero from the ledger
    and the honest statement of zero is recorded. Controls: an id the ledger never saw, and
    the id asked by another curator, are NOT_FOUND."""
    owner = reward_owner(tmp_path, create=True)
    _open(owner, "W", rff)
    owner = _restart(owner, tmp_path)
    with pytest.raises(NotFoundError):
        owner.close_session("never-opened", CURATOR)
    with pytest.raises(NotFoundError):
        owner.close_session("W", "curator:other")
    spend = owner.close_session("W", CURATOR)
    assert (spend.epsilon, spend.delta, spend.points) == (0.0, 0.0, 0)
    assert _settle(owner, "W", spend)
    assert owner.ledger is not None
    assert Earnings(owner.ledger, "owner").settled(CURATOR, "W")


def test_a_crash_between_the_payout_and_the_first_point_closes_and_settles(
    tmp_path: Path, rff: RFFParams
) -> None:
    """A kill -9 after the payout release's charge and before the point's: the restarted owner
    closes the id from its ledger (no point, the payout charged) and the honest statement (no
    point, so no payout stated) is recorded: the payout charge whose points never left is that
    crash's waste. Control: without the crash the payout is charged and stated with the
    points."""
    owner = reward_owner(tmp_path, create=True)
    ledger = owner.ledger
    assert ledger is not None
    real = ledger.charge

    def dying(**kw: object) -> object:
        if kw["session"] == "K":
            raise _Killed
        return real(**kw)  # type: ignore[arg-type]

    _open(owner, "K", rff)
    ledger.charge = dying  # type: ignore[method-assign,assignment]
    with pytest.raises(_Killed):
        owner.sample_uniform("K", 2, CURATOR)
    assert payout_charged(ledger, "K") > 0  # the payout's charge is committed
    assert ledger.session_totals("K").points == 0
    owner = _restart(owner, tmp_path)
    spend = owner.close_session("K", CURATOR)
    assert spend.points == 0
    assert _settle(owner, "K", spend)
    # Control: the same session, no crash: payout and points charged, stated, recorded.
    _open(owner, "C", rff)
    owner.sample_uniform("C", 2, CURATOR)
    spend = owner.close_session("C", CURATOR)
    assert spend.points == 2
    assert owner.ledger is not None and payout_charged(owner.ledger, "C") > 0
    assert _settle(owner, "C", spend)
