"""An owner enforces its own policy whatever the curator asks, and a refusal changes nothing.

Every test runs an :class:`dpmarket.owner.protocol.Owner` with its real durable ledger
(:class:`dpmarket.owner.ledger.OwnerLedger` in a temporary directory) and injected clocks: the
owner's monotonic clock (idle sessions) and the ledger's Unix clock (rolling budget windows).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from dpmarket.common.market.statement import SettlementTerms
from dpmarket.common.market.terms import MarketTerms
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner, OwnerSession
from dpmarket.runtime.tables import PointSet

D = 16
N_POINTS = 30
TERMS = OwnerTerms(SessionMethod.PRIVATE, 0.4, 1e-7, max_rounds=100)
UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def data() -> PointSet:
    rng = np.random.default_rng(0)
    return PointSet(rng.normal(size=(N_POINTS, 3)), np.arange(N_POINTS) % 3, "o")


@pytest.fixture
def rff() -> RFFParams:
    return draw_rff_params(3, D, 0.5, np.random.default_rng(1))


def _owner(
    data: PointSet, tmp_path: Path, ledger_clock: Clock | None = None, **policy: object
) -> tuple[Owner, OwnerLedger]:
    # The tests' terms bid in rounds (TERMS): this owner opts in to trusting its curator with
    # exact bids, for up to 100 rounds a point (tests/owner/test_exact_bids.py: the default).
    policy = {"allow_exact_bids": True, "rounds_per_point": 100, **policy}
    p = OwnerPolicy(**policy)  # type: ignore[arg-type]
    ledger = OwnerLedger.create(tmp_path / "owner", p, clock=ledger_clock or Clock())
    owner = Owner(
        "o",
        data,
        ledger=ledger,
        max_sessions=p.max_sessions,
        max_rff_dimension=p.max_rff_dimension,
    )
    return owner, ledger


def _open(owner: Owner, rff: RFFParams, sid: str, terms: OwnerTerms = TERMS) -> OwnerSession:
    owner.open_session(sid, rff, 0, terms=terms)
    owner.set_validation_embedding(sid, np.full(D, 0.05))
    return owner.session(sid)


def _snapshot(session: OwnerSession) -> tuple[int, int, bytes, int]:
    return (
        session.round,
        session.released,
        session.sent.tobytes(),
        sum(session._best_counts.values()),
    )


# -------------------------------------------------------------------------- opening
def test_terms_beyond_the_session_limit_are_refused_at_open_and_nothing_opens(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    owner, ledger = _owner(data, tmp_path, epsilon_per_session=0.3, delta_per_session=1e-6)
    with pytest.raises(FailedPreconditionError, match=r"epsilon in session 's': spent 0 of 0\.3"):
        owner.open_session("s", rff, 0, terms=TERMS)
    assert owner.sessions == {} and ledger.entries() == []
    with pytest.raises(FailedPreconditionError, match="delta in session"):
        owner.open_session("s", rff, 0, terms=OwnerTerms(SessionMethod.PRIVATE, 0.1, 1e-5, 9))
    assert owner.sessions == {} and ledger.entries() == []


def test_non_private_terms_are_refused_unless_the_policy_allows_them(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    exact = OwnerTerms(SessionMethod.GREEDY, math.inf, 0.0, max_rounds=10)
    owner, ledger = _owner(data, tmp_path)
    with pytest.raises(FailedPreconditionError, match="allow_non_private = false"):
        owner.open_session("s", rff, 0, terms=exact)
    assert owner.sessions == {} and ledger.entries() == []


def test_service_limits_refuse_before_anything_is_computed(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    owner, ledger = _owner(data, tmp_path, max_sessions=1, max_rff_dimension=D - 1)
    with pytest.raises(InvalidArgumentError, match=f"d={D} exceeds this owner's limit of {D - 1}"):
        owner.open_session("s", rff, 0, terms=TERMS)
    owner.max_rff_dimension = D
    owner.open_session("s", rff, 0, terms=TERMS)
    with pytest.raises(ResourceExhaustedError, match="at most 1 sessions"):
        owner.open_session("t", rff, 0, terms=TERMS)
    assert list(owner.sessions) == ["s"] and ledger.entries() == []


def test_a_session_belongs_to_the_curator_that_opened_it(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    owner, ledger = _owner(data, tmp_path, curators=["curator", "other"])
    owner.open_session("s", rff, 0, curator="curator:curator", terms=TERMS)
    for call in (
        lambda: owner.set_validation_embedding("s", np.zeros(D), "curator:other"),
        lambda: owner.bid("s", 1, np.zeros(D), 0, "curator:other"),
        lambda: owner.release_point("s", 1, "curator:other"),
        lambda: owner.release_point("s", 2, "curator:other"),
        lambda: owner.close_session("s", "curator:other"),
    ):
        with pytest.raises(NotFoundError, match="unknown session"):
            call()
    assert ledger.entries() == []
    assert owner.session("s", "curator:curator").released == 0


# --------------------------------------------------------------------------- charging
def test_terms_are_charged_once_before_the_first_release_then_every_point(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    owner, ledger = _owner(data, tmp_path)
    session = _open(owner, rff, "s")
    assert ledger.entries() == [], "opening and the validation embedding charge nothing"
    owner.bid("s", 1, np.zeros(D), 0)
    (terms_entry,) = ledger.entries()
    assert (terms_entry.epsilon, terms_entry.delta, terms_entry.points) == (0.4, 1e-7, 0)
    owner.release_point("s", 1)
    owner.bid("s", 2, np.zeros(D), 1)
    owner.release_point("s", 2)
    entries = ledger.entries(session="s")
    assert [(e.epsilon, e.delta, e.points) for e in entries] == [
        (0.4, 1e-7, 0),
        (0.0, 0.0, 1),
        (0.0, 0.0, 1),
    ]
    assert session.released == 2 == ledger.session_totals("s").points
    spent = owner.close_session("s")
    assert (spent.epsilon, spent.delta, spent.points) == (0.4, 1e-7, 2)


def test_a_refused_bid_does_not_advance_the_session(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    # Both sessions fit the budget when they open; only the first can pay its terms.
    owner, ledger = _owner(data, tmp_path, epsilon_total=0.6, epsilon_per_session=0.5)
    _open(owner, rff, "a")
    b = _open(owner, rff, "b")
    owner.bid("a", 1, np.zeros(D), 0)
    before = _snapshot(b)
    with pytest.raises(FailedPreconditionError, match=r"epsilon over the lifetime: spent 0\.4 of"):
        owner.bid("b", 1, np.zeros(D), 0)
    assert _snapshot(b) == before
    assert [e.session for e in ledger.entries()] == ["a"]


def test_the_point_allowance_is_enforced_and_a_refusal_changes_nothing(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    owner, ledger = _owner(data, tmp_path, points_per_session=3)
    num_points, max_points = owner.open_session("s", rff, 0, terms=TERMS)
    assert (num_points, max_points) == (N_POINTS, 3)
    owner.set_validation_embedding("s", np.full(D, 0.05))
    session = owner.session("s")
    for round_ in (1, 2, 3):
        assert owner.bid("s", round_, np.zeros(D), round_ - 1) is not None
        owner.release_point("s", round_)
    # The allowance is used up: no more bids.
    assert owner.bid("s", 4, np.zeros(D), 3) is None
    before = _snapshot(session)
    with pytest.raises(FailedPreconditionError, match="no unsent point was bid in round 4"):
        owner.release_point("s", 4)
    assert _snapshot(session) == before
    assert ledger.session_totals("s").points == 3 == int(session.sent.sum())
    # A uniform sample beyond the allowance is refused before anything is drawn or charged.
    owner.open_session("u", rff, 0, terms=UNIFORM)
    with pytest.raises(FailedPreconditionError, match="may receive 3 raw points"):
        owner.sample_uniform("u", 4)
    assert ledger.session_totals("u").points == 0 and not owner.session("u").sent.any()
    assert owner.sample_uniform("u", 3)[0].shape == (3, 3)


def test_a_refused_release_does_not_mark_the_point_sent_and_a_later_allowed_one_works(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    """A rolling one-day window of 4 points: session a uses them up, session b's release is
    refused, and the same release succeeds once a's charges have left the window."""
    clock = Clock()
    owner, ledger = _owner(
        data, tmp_path, clock, window_days=1, points_total=4, points_per_session=4
    )
    _open(owner, rff, "a")
    b = _open(owner, rff, "b")
    for round_ in (1, 2, 3, 4):
        owner.bid("a", round_, np.zeros(D), round_ - 1)
        owner.release_point("a", round_)
    bid = owner.bid("b", 1, np.zeros(D), 0)
    assert bid is not None
    offered = b._offered
    charges = len(ledger.entries())
    before = _snapshot(b)
    with pytest.raises(FailedPreconditionError, match="points over the last 1 day: spent 4 of 4"):
        owner.release_point("b", 1)
    assert _snapshot(b) == before and not b.sent.any()
    assert len(ledger.entries()) == charges
    clock.now += 86_400.0 + 1.0
    released = owner.release_point("b", 1)
    assert offered is not None
    np.testing.assert_array_equal(released.point, data.features[offered])
    assert released.bid == bid.bid
    assert b.sent.sum() == 1 and b.sent[offered]
    assert ledger.session_totals("b").points == 1


def test_times_best_is_cumulative_over_rounds_not_consecutive() -> None:
    """Algorithm 3, step 14 counts the rounds a point has been its owner's best ("chosen tau
    times"): best in rounds 1 and 3 but not 2 makes 2 in round 3."""
    features = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)  # points A and B
    session = OwnerSession(features, np.random.default_rng(0), terms=TERMS)
    session.set_validation_embedding(np.array([1.0, 0.0]))
    first = session.bid(1, np.zeros(2), 0)  # direction (1, 0): A scores 1, B 0
    assert first is not None and session._offered == 0 and first.times_best == 1
    # q = 1 and g = (4, 0): direction (1, 0) - 1/2 (4, 0) = (-1, 0): B scores 0 > A's -1.
    second = session.bid(2, np.array([4.0, 0.0]), 1)
    assert second is not None and session._offered == 1 and second.times_best == 1
    third = session.bid(3, np.zeros(2), 0)
    assert third is not None and session._offered == 0 and third.times_best == 2


# ------------------------------------------------------------------------------ idle
def test_expire_idle_closes_only_sessions_untouched_for_the_timeout(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    monotonic = Clock(100.0)
    bidding = OwnerPolicy(allow_exact_bids=True, rounds_per_point=100)
    ledger = OwnerLedger.create(tmp_path / "owner", bidding, clock=Clock())
    owner = Owner("o", data, ledger=ledger, idle_timeout=10.0, clock=monotonic)
    assert Owner("o", data).expire_idle() == [], "no timeout: nothing ever expires"
    _open(owner, rff, "a")
    _open(owner, rff, "b")
    owner.bid("a", 1, np.zeros(D), 0)
    owner.release_point("a", 1)
    monotonic.now = 106.0
    owner.bid("b", 1, np.zeros(D), 0)  # touches b
    monotonic.now = 110.0
    assert owner.expire_idle() == [], "a was touched 10 s ago: not idle *for more than* 10 s"
    monotonic.now = 110.5
    assert owner.expire_idle() == ["a"]
    with pytest.raises(NotFoundError):
        owner.bid("a", 2, np.zeros(D), 1)
    assert owner.bid("b", 2, np.zeros(D), 1) is not None  # b is alive, and touched again
    # What the expired session spent stays in the ledger.
    assert ledger.session_totals("a").points == 1 and ledger.session_totals("a").epsilon == 0.4
    monotonic.now = 130.0
    assert owner.expire_idle() == ["b"] and owner.sessions == {}
    # Closing an expired session (a curator that restarted, asking what it cost) is answered
    # from the ledger, to the curator that was charged under it only.
    spent = owner.close_session("a")
    assert (spent.epsilon, spent.delta, spent.points) == (0.4, 1e-7, 1)
    with pytest.raises(NotFoundError):
        owner.close_session("a", "curator:other")
    with pytest.raises(NotFoundError):
        owner.close_session("never-opened")


def test_a_session_receives_at_most_its_share_of_the_table_even_reopened(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    """The default policy gives one session a quarter of the table (7 of 30 rows), not the
    1,000 points ``session.points`` allows; a session reopened under its id gets no fresh
    share. The control: with ``points_fraction = 1`` the whole table is allowed."""
    owner, ledger = _owner(data, tmp_path)
    assert owner.open_session("s", rff, 0, terms=UNIFORM) == (N_POINTS, 7)
    owner.sample_uniform("s", 5)
    owner.close_session("s")
    assert owner.open_session("s", rff, 0, terms=UNIFORM) == (N_POINTS, 2)
    with pytest.raises(FailedPreconditionError, match="may receive 2 raw points"):
        owner.sample_uniform("s", 3)
    assert ledger.session_totals("s").points == 5
    whole, _ = _owner(data, tmp_path / "whole", points_fraction_per_session=1.0)
    assert whole.open_session("t", rff, 0, terms=TERMS) == (N_POINTS, N_POINTS)


def test_opening_a_session_first_expires_idle_ones_to_free_a_slot(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    monotonic = Clock(0.0)
    owner = Owner("o", data, max_sessions=1, idle_timeout=5.0, clock=monotonic)
    owner.open_session("a", rff, 0, curator=LOCAL_CURATOR, terms=UNIFORM)
    with pytest.raises(ResourceExhaustedError):
        owner.open_session("b", rff, 0, terms=UNIFORM)
    monotonic.now = 6.0
    owner.open_session("b", rff, 0, terms=UNIFORM)
    assert list(owner.sessions) == ["b"]


def test_a_quoted_session_id_charges_its_epsilon_once_across_its_opens(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    """A quoted session id is one session across its opens: reopened after its terms' epsilon
    was charged, it would charge it again, beyond what its quote line pays (the curator's
    settlement refuses such a record, so the owner would release unpaid): refused, nothing
    charged. The control: the same reopen without a quote (no statement to pay it) opens."""
    settlement = SettlementTerms(summary_size=4, validation_size=10)
    quoted = dataclasses.replace(TERMS, market=MarketTerms(4, 0, 0, settlement))
    for sid, terms in (("quoted", quoted), ("free", TERMS)):
        owner, ledger = _owner(data, tmp_path / sid)
        owner.open_session(sid, rff, 0, terms=terms)
        owner.close_session(sid)
        # What the first open's first step charged (its terms' epsilon).
        ledger.charge(session=sid, consumer="consumer:local", curator=LOCAL_CURATOR,
                      mechanism="bid", epsilon=0.4, delta=0.0, points=0)  # fmt: skip
        before = ledger.entries()
        if terms.market is None:
            owner.open_session(sid, rff, 0, terms=terms)
            continue
        with pytest.raises(FailedPreconditionError, match=r"epsilon 0\.4 again"):
            owner.open_session(sid, rff, 0, terms=terms)
        assert ledger.entries() == before and owner.sessions == {}
