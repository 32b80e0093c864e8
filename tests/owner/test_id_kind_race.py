"""One id opens as one kind, also when a session's and a CAPE job's opens of it race.

A stranger's curator (issue 25, eighth pass, K1/K2) sent OpenSession(X) and OpenCapeJob(X)
together: both passed the id's check before either recorded its kind, and both opened; a CAPE
charge and a session's charges then landed under one id that no statement could pay. The owner
now checks and records the kind in one transaction before it installs anything. Each test runs
a real :class:`~dpmarket.owner.protocol.Owner` and :class:`~dpmarket.owner.cape.CapeSite` on one
ledger; the forced interleavings fail on main.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from dpmarket.common.errors import FailedPreconditionError, NotFoundError
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.ledger import LEDGER_FILE, OwnerLedger
from dpmarket.owner.protocol import Owner
from tests.owner.test_settled_ids import (
    CONSUMER,
    COUNTS,
    CURATOR,
    SPEC,
    Parties,
    _cape_line,
    _open_job,
    _open_session,
    _quoted,
    _session_line,
)
from tests.owner.test_settled_ids import parties as parties  # the fixtures
from tests.owner.test_settled_ids import rff as rff


def _kinds(p: Parties, id_: str) -> list[str]:
    return [
        str(r[0])
        for r in p.ledger.read(
            lambda c: c.execute("SELECT kind FROM opened_ids WHERE id = ?", (id_,)).fetchall()
        )
    ]


def _session_terms() -> OwnerTerms:
    return _quoted(COUNTS, _session_line(2, COUNTS.epsilon)[1])


def _job(p: Parties, id_: str) -> None:
    _open_job(p, id_, market=_cape_line()[1])


def _race(p: Parties, rff: RFFParams, id_: str) -> dict[str, bool]:
    """Open ``id_`` as a session and as a CAPE job from two threads released together: which
    opened."""
    start = threading.Barrier(2)
    won: dict[str, bool] = {}

    def run(kind: str, open_: Callable[[], object]) -> None:
        start.wait()
        try:
            open_()
            won[kind] = True
        except FailedPreconditionError:
            won[kind] = False

    threads = [
        threading.Thread(
            target=run, args=("session", lambda: _open_session(p, id_, rff, _session_terms()))
        ),
        threading.Thread(target=run, args=("cape", lambda: _job(p, id_))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_a_cape_open_inside_a_session_open_refuses_the_session(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CAPE job X opens entirely between the session X's early check (its id's, its
    terms') and its record (a hook where the session's open checks its h1 parameters): the
    session is refused, nothing installed; the id stays a CAPE job.
    Control: the same session under another id opens."""
    p = parties
    real = Owner._check_shape
    inner: list[str] = []

    def racing(self: Owner, *args: Any) -> Any:
        if not inner:
            inner.append("cape")
            _job(p, "X")
        return real(self, *args)

    monkeypatch.setattr(Owner, "_check_shape", racing)
    with pytest.raises(FailedPreconditionError, match="first opened as a CAPE job"):
        _open_session(p, "X", rff, _session_terms())
    assert "X" not in p.owner.sessions
    assert _kinds(p, "X") == ["cape"]
    _open_session(p, "Y", rff, _session_terms())
    assert _kinds(p, "Y") == ["session"]


def test_a_cape_open_while_a_session_computes_its_features_is_refused(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session records its id's kind and terms before it computes its features: the CAPE
    job X opened while the session X computes them is refused, and the session opens."""
    p = parties
    real = Owner._features
    inner: list[object] = []

    def racing(*args: Any) -> Any:
        if not inner:
            with pytest.raises(FailedPreconditionError, match="first opened as a session"):
                _job(p, "X")
            inner.append("refused")
        return real(*args)

    monkeypatch.setattr(Owner, "_features", staticmethod(racing))
    _open_session(p, "X", rff, _session_terms())
    assert inner == ["refused"]
    assert "X" in p.owner.sessions
    assert _kinds(p, "X") == ["session"]


def test_a_session_open_inside_a_cape_open_refuses_the_job(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reverse: the session X opens between the CAPE job X's check and its record."""
    p = parties
    real = p.cape._data
    inner: list[str] = []

    def racing(*args: Any) -> Any:
        if not inner:
            inner.append("session")
            _open_session(p, "X", rff, _session_terms())
        return real(*args)

    monkeypatch.setattr(p.cape, "_data", racing)
    with pytest.raises(FailedPreconditionError, match="first opened as a session"):
        _job(p, "X")
    assert _kinds(p, "X") == ["session"]
    with pytest.raises(NotFoundError):  # no job X was installed
        p.cape.check_curator("X", CURATOR)


def test_racing_opens_of_both_kinds_never_both_open(parties: Parties, rff: RFFParams) -> None:
    """OpenSession(id) and OpenCapeJob(id) from two threads, released together, 24 ids: for
    each, exactly one opens and the id's recorded kind is the winner's."""
    p = parties
    for i in range(24):
        id_ = f"race-{i}"
        won = _race(p, rff, id_)
        winners = [k for k, ok in won.items() if ok]
        assert len(winners) == 1, (id_, won)
        assert _kinds(p, id_) == winners


def test_an_id_of_one_curator_is_refused_to_another_whatever_its_kind(
    parties: Parties, rff: RFFParams
) -> None:
    """curator:one opens session X and closes it, nothing charged; curator:two's OpenCapeJob(X)
    and OpenSession(X) are refused, nothing recorded for it. The id's owner reopens it
    (control), and curator:two opens a fresh id."""
    p = parties
    one, two = "curator:one", "curator:two"
    terms = _session_terms()
    p.owner.open_session("X", rff, 0, terms=terms, curator=one, consumer=CONSUMER)
    p.owner.close_session("X", one)
    with pytest.raises(FailedPreconditionError, match="another curator's"):
        p.cape.open("X", SPEC, 1, curator=two, consumer=CONSUMER, market=_cape_line()[1])
    with pytest.raises(FailedPreconditionError, match="another curator's"):
        p.owner.open_session("X", rff, 0, terms=terms, curator=two, consumer=CONSUMER)
    assert p.ledger.entries() == []
    assert _kinds(p, "X") == ["session"]
    p.owner.open_session("X", rff, 0, terms=terms, curator=one, consumer=CONSUMER)
    p.cape.open("Y", SPEC, 1, curator=two, consumer=CONSUMER, market=_cape_line()[1])


def test_ids_opened_at_schema_8_keep_their_kind_after_the_migration(
    parties: Parties, rff: RFFParams, tmp_path: Path
) -> None:
    """Session X and CAPE job J opened (nothing charged) on a ledger then taken back to schema 8
    as an earlier dpmarket wrote it (no opened_ids; session_market keeps their terms): after the
    migration to 9, X is refused as a CAPE job and J as a session. Control: a fresh id opens as
    either kind."""
    p = parties
    terms = _session_terms()
    _open_session(p, "X", rff, terms)
    p.owner.close_session("X", CURATOR)
    _job(p, "J")
    p.cape.close("J", curator=CURATOR)
    p.ledger.close()
    with closing(sqlite3.connect(tmp_path / LEDGER_FILE)) as conn:
        conn.execute("DROP TABLE opened_ids")
        conn.execute("PRAGMA user_version = 8")
        conn.commit()
    ledger = OwnerLedger(tmp_path, p.ledger.policy)
    again = Parties(
        Owner("owner", p.owner.data, ledger=ledger),
        CapeSite("owner", p.cape.table, ledger=ledger, min_colluders=0),
        ledger,
        p.curator_key,
        p.other_key,
    )
    assert _kinds(again, "X") == ["session"] and _kinds(again, "J") == ["cape"]
    with pytest.raises(FailedPreconditionError, match="first opened as a session"):
        _job(again, "X")
    with pytest.raises(FailedPreconditionError, match="first opened as a CAPE job"):
        _open_session(again, "J", rff, terms)
    _job(again, "fresh-job")
    _open_session(again, "fresh-session", rff, terms)
