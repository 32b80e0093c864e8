"""A session id's terms are fixed at its first open, also when two opens of it race.

A stranger's curator (issue 25, ninth pass, t1/t1b) sent OpenSession(X, terms B) and, while B
computed its features, OpenSession(X, terms A), closing X until A returned: the reopen check read
the terms a first open records only after it installed its slot, so both opens answered OK, the
live slot ran under B's quote line while the owner recorded A's (a line of 2 points read 7, or
a reward session's payout release never charged). The owner now checks and records a session's
terms in the transaction that records its kind, before it computes anything, and an id being
opened is reserved until its open ends. Each test forces the interleaving with a hook where the
outer open computes its features (a real :class:`~dpmarket.owner.protocol.Owner` on a real
ledger); each fails on main.
"""

from __future__ import annotations

from typing import Any

import pytest

from dpmarket.common.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.engine import WorkCancelled
from dpmarket.owner.protocol import Owner
from tests.owner.test_settled_ids import (
    CURATOR,
    UNIFORM,
    Parties,
    _open_session,
    _quoted,
    _session_line,
)
from tests.owner.test_settled_ids import parties as parties  # the fixtures
from tests.owner.test_settled_ids import rff as rff


def _inside_features(monkeypatch: pytest.MonkeyPatch, inner: Any) -> list[object]:
    """Run ``inner()`` once, inside the next open's feature computation; what it raised (or
    "opened") is appended to the returned list."""
    real = Owner._features
    seen: list[object] = []
    started: list[bool] = []

    def racing(*args: Any) -> Any:
        if not started:
            started.append(True)
            try:
                inner()
                seen.append("opened")
            except Exception as exc:  # what the inner open raised is the result
                seen.append(exc)
        return real(*args)

    monkeypatch.setattr(Owner, "_features", staticmethod(racing))
    return seen


def test_an_open_under_other_terms_inside_the_first_open_is_refused(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X opens under a line of 7 points; while it computes its features, X is opened (and
    closed) under a line of 2: that open is refused FAILED_PRECONDITION, and the terms recorded
    for X are those of the slot that lives (the line of 7).
    Control: with no first open in the way, the line of 2 opens another id."""
    p = parties
    big = _quoted(UNIFORM, _session_line(7, 0.0)[1])
    small = _quoted(UNIFORM, _session_line(2, 0.0)[1])

    def inner() -> None:
        _open_session(p, "X", rff, small)
        p.owner.close_session("X", CURATOR)

    seen = _inside_features(monkeypatch, inner)
    _open_session(p, "X", rff, big)
    assert len(seen) == 1 and isinstance(seen[0], FailedPreconditionError), seen
    assert "another quote line" in str(seen[0])
    assert "X" in p.owner.sessions
    assert Earnings(p.ledger, "owner").accepted_line(CURATOR, "X") == big.market
    _, idx = p.owner.sample_uniform("X", 7, CURATOR)
    assert idx is not None and len(idx) == 7  # the live slot's line is the recorded one
    _open_session(p, "Y", rff, small)
    assert Earnings(p.ledger, "owner").accepted_line(CURATOR, "Y") == small.market


def test_an_identical_open_inside_the_first_open_is_refused_and_the_line_holds(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X opens under a line of 2 points; inside its features X is opened under the same terms,
    reads its 2 points and closes. That open is refused (the id is being opened: ALREADY_EXISTS),
    so no second slot computes its allowance before the first reads: X reads no more than its
    line's 2 points in all. Control: opened after the first closes, X reads nothing more."""
    p = parties
    line = _quoted(UNIFORM, _session_line(2, 0.0)[1])

    def inner() -> None:
        _open_session(p, "X", rff, line)
        p.owner.sample_uniform("X", 2, CURATOR)
        p.owner.close_session("X", CURATOR)

    seen = _inside_features(monkeypatch, inner)
    _open_session(p, "X", rff, line)
    assert len(seen) == 1 and isinstance(seen[0], AlreadyExistsError), seen
    p.owner.sample_uniform("X", 2, CURATOR)  # its line's points, read once
    p.owner.close_session("X", CURATOR)
    assert p.ledger.session_totals("X").points == 2
    _open_session(p, "X", rff, line)  # a sequential reopen under its terms: its line is spent
    with pytest.raises(FailedPreconditionError):
        p.owner.sample_uniform("X", 1, CURATOR)
    assert p.ledger.session_totals("X").points == 2


def test_another_curators_cancel_leaves_a_session_and_its_opening_alone(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger's second curator (issue 25, tenth pass) dropped a call under the first
    curator's session id: the service cancelled that id's session whoever called, so the first
    curator's open failed, or its live session refused every step after charging it. A cancel
    now stops only the caller's own session or opening; another curator's progress query of
    an opening is NOT_FOUND. Control: the owning curator's cancel does stop its session, and
    the step it stops charges nothing (main charged 2 points, then refused)."""
    p = parties
    other = "curator:other"
    seen: list[object] = []

    def inner() -> None:  # inside X's open: another curator cancels X and asks its progress
        p.owner.cancel("X", other)
        try:
            p.owner.progress("X", other)
        except NotFoundError as exc:
            seen.append(exc)
        seen.append(p.owner.progress("X", CURATOR)[0])

    inside = _inside_features(monkeypatch, inner)
    _open_session(p, "X", rff, _quoted(UNIFORM, _session_line(4, 0.0)[1]))
    assert inside == ["opened"] and isinstance(seen[0], NotFoundError), (inside, seen)
    p.owner.cancel("X", other)  # the live session
    _, idx = p.owner.sample_uniform("X", 2, CURATOR)
    assert idx is not None and len(idx) == 2
    assert p.ledger.session_totals("X").points == 2
    _open_session(p, "Y", rff, _quoted(UNIFORM, _session_line(4, 0.0)[1]))
    p.owner.cancel("Y", CURATOR)  # the control: its own curator's cancel stops it
    with pytest.raises(WorkCancelled):
        p.owner.sample_uniform("Y", 2, CURATOR)
    assert p.ledger.session_totals("Y").points == 0
