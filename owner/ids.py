"""The state of an id at an owner: what it was first opened as, under which terms, and whether
its statement is recorded (settled).

A curator names each session and each CAPE job by an id; at an owner the ids of both kinds are
one namespace, the one its ledger charges under (``charges.session``) and its earnings settle by
(:mod:`dpmarket.owner.earnings`). The rule both kinds follow, decided here and nowhere else:

* an id is one curator's, as its charges are one owner's: once a curator opened, charged or
  settled it, an open by any other curator is refused (its kind, terms and statement are
  recorded for the first curator; another's could not settle what the id charges);
* an id is of the kind it was first opened as (``"session"`` or ``"cape"``), recorded durably at
  that open (table ``opened_ids``) with the terms its kind fixes (a CAPE job's: its spec, its
  consumer, its quote line; a session's: its quote line or none, its method, epsilon, delta,
  rounds and consumer, in ``session_market``, :class:`SessionOpen`); an open as the other kind
  is refused, and so is a reopen under other terms than its first open's, checked and recorded
  in the one write transaction that records the kind (:meth:`IdState.opened`), before the open
  computes or installs anything, so that of two opens racing under different terms one is
  refused;
* once its statement is recorded the id is settled for good: an open is refused whatever its
  terms, every later step under it is refused before it reads or charges anything
  (:meth:`IdState.check_unsettled`), and a charge that would land after the statement is
  rolled back in its own transaction (:meth:`IdState.charge_guard`), so that every charge the
  ledger holds under the id is one its recorded statement was checked against
  (:meth:`~dpmarket.owner.earnings.Earnings.record` checks and records in one transaction).

An id opened before this record existed (a ledger of schema 8) has the row the migration to
schema 9 filled from the terms its open recorded (``session_market``), if any; without a row its
kind is that of the charges under it (a CAPE job's mechanism names CAPE), unknown without any.
Every refusal is :class:`~dpmarket.common.errors.FailedPreconditionError`, decided on the
request and the owner's own records only (never its data); nothing is read or charged.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.ids import short_id
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.terms import MarketTerms
from dpmarket.owner.earnings import DERIVED_SEPARATOR, Earnings, payout_session
from dpmarket.owner.ledger import MAX_NAME_LENGTH, OwnerLedger
from dpmarket.owner.ledger_resolutions import DISMISSED_PREFIX, ROLLBACK_PREFIX, SUPERSEDED_PREFIX
from dpmarket.owner.sketches import SKETCH_SESSION_PREFIX
from dpmarket.owner.terms import check_reopen

__all__ = ["MAX_CURATOR_ID_LENGTH", "IdKind", "IdState", "SessionOpen", "check_curator_id"]

#: What an id was first opened as.
IdKind = Literal["session", "cape"]

_NAMES: dict[str, str] = {"session": "a session", "cape": "a CAPE job"}
#: How the ledger's mechanism of a CAPE job's charge starts (dpmarket.common.cape.spec).
_CAPE_MECHANISMS = ("CAPE ", "capeFM ")


#: Longest id a curator may choose: the longest whose derived ids (its payout release's,
#: :func:`~dpmarket.owner.earnings.payout_session`) are still ledger names
#: (:data:`~dpmarket.owner.ledger.MAX_NAME_LENGTH`), so every step an open accepts can charge.
MAX_CURATOR_ID_LENGTH = MAX_NAME_LENGTH - len(payout_session(""))
#: How the owner's own ledger ids start: its operator's records
#: (:mod:`dpmarket.owner.ledger_resolutions`) and its sketch publications
#: (:func:`dpmarket.owner.sketches.ledger_session`).
_OWNER_PREFIXES = (ROLLBACK_PREFIX, SUPERSEDED_PREFIX, DISMISSED_PREFIX, SKETCH_SESSION_PREFIX)


def check_curator_id(id_: object, what: str = "session_id") -> str:
    """Check an id a curator chose (a session's or a CAPE job's), for its open and every step.

    An owner derives ids of its own from a curator's (a session's payout release charge is
    under ``ID/payout``, :func:`~dpmarket.owner.earnings.payout_session`), and it charges under
    ids of its own: its operator's records (``ledger-rollback-...``, ``ledger-superseded-...``,
    ``ledger-dismissed-...``) and its sketch publications (``sketch:...``). A curator id takes
    none of these forms, so what the owner reads under its own ids is only ever what the owner
    itself charged there. Nor does it hold a character that is not printable, so that every
    table of the ledger shows a curator id on one line, as it is.

    Returns
    -------
    str
        ``id_``.

    Raises
    ------
    InvalidArgumentError
        If ``id_`` is not a string of 1 to :data:`MAX_CURATOR_ID_LENGTH` characters, holds a
        character that is not printable (:meth:`str.isprintable`: a control character, a line
        or paragraph separator, a format character), holds
        :data:`~dpmarket.owner.earnings.DERIVED_SEPARATOR` or starts with an owner's prefix;
        the message names the id (its first 40 characters) and what to send. Nothing is read
        or charged.
    """
    if not isinstance(id_, str) or not 1 <= len(id_) <= MAX_CURATOR_ID_LENGTH:
        shown = id_[:40] if isinstance(id_, str) else id_
        raise InvalidArgumentError(
            f"{what} {shown!r} must be a string of 1 to {MAX_CURATOR_ID_LENGTH} characters "
            "(the owner derives longer ids from it); send a shorter id"
        )
    if not id_.isprintable():
        raise InvalidArgumentError(
            f"{what} {id_[:40]!r} holds a control or other non-printable character (a ledger "
            "table would print it across lines, or hide it): send an id of printable characters"
        )
    if DERIVED_SEPARATOR in id_:
        raise InvalidArgumentError(
            f"{what} {id_[:40]!r} holds {DERIVED_SEPARATOR!r}, the separator of the ids an owner "
            "derives from a curator's (a payout release's): send an id without it"
        )
    if id_.startswith(_OWNER_PREFIXES):
        raise InvalidArgumentError(
            f"{what} {id_[:40]!r}: ids starting with {', '.join(_OWNER_PREFIXES)} are the "
            "owner's own records (its operator's, its sketch publications); send another id"
        )
    return id_


@dataclass(frozen=True)
class SessionOpen:
    """What a session's open fixes for its id, recorded at its first open (``session_market``,
    :meth:`~dpmarket.owner.earnings.Earnings.accept_in`) and checked at every later one.

    Attributes
    ----------
    market : MarketTerms or None
        Its quote line for this owner (None: it opens without one).
    prices : OwnerPrices
        The owner's prices, recorded with the line (its statement is checked against them).
    consumer : str
        The consumer it serves.
    opened : mapping
        Every other field of its terms (:func:`~dpmarket.owner.terms.opened_terms`).
    """

    market: MarketTerms | None
    prices: OwnerPrices
    consumer: str
    opened: Mapping[str, object]


def _check_session_terms(
    conn: sqlite3.Connection, curator: str, id_: str, now: SessionOpen
) -> None:
    """Refuse a session id opened under terms other than its first open's, inside a transaction
    of the owner's database (``conn``): another quote line, a line where it had none (it
    recorded none, or was charged without one), none where it had one, or another field
    (:func:`~dpmarket.owner.terms.check_reopen`). FailedPreconditionError; nothing recorded."""
    first = Earnings.first_open_in(conn, curator, id_)
    line, opened = (None, None) if first is None else first
    charged = conn.execute("SELECT 1 FROM charges WHERE session = ? LIMIT 1", (id_,)).fetchone()
    lineless = first is not None or charged is not None  # known to have opened without a line
    if (line is None and lineless and now.market is not None) or (
        line is not None and now.market != line
    ):
        had = "no quote line" if line is None else "another quote line"
        new = "none" if now.market is None else "a different one"
        raise FailedPreconditionError(
            f"session {short_id(id_)} first opened under {had}; reopened under "
            f"{new}, its statement could not settle what each read: reopen it under the "
            "terms it first opened with, or open a new session under a new id"
        )
    if opened is not None:  # every other field of the terms, as first opened
        check_reopen(short_id(id_), opened, now.opened)


def _canonical(terms: Mapping[str, object]) -> str:
    return json.dumps(terms, sort_keys=True, separators=(",", ":"))


class IdState:
    """The owner's record of its ids (:mod:`dpmarket.owner.ids`), in its ledger's database.

    Parameters
    ----------
    ledger : OwnerLedger
        The owner's open ledger (its database holds ``opened_ids`` and ``earnings``).
    owner : str
        The owner's name.
    """

    def __init__(self, ledger: OwnerLedger, owner: str) -> None:
        self.ledger = ledger
        self.earnings = Earnings(ledger, owner)

    @staticmethod
    def _first(
        conn: sqlite3.Connection, curator: str, id_: str
    ) -> tuple[str, Mapping[str, object] | None] | None:
        row = conn.execute(
            "SELECT kind, terms_json FROM opened_ids WHERE curator = ? AND id = ?",
            (curator, id_),
        ).fetchone()
        if row is not None:
            return str(row[0]), None if row[1] is None else json.loads(row[1])
        charged = conn.execute(
            "SELECT mechanism FROM charges WHERE session = ? ORDER BY id DESC LIMIT 1", (id_,)
        ).fetchone()
        if charged is None:
            return None
        cape = str(charged[0]).startswith(_CAPE_MECHANISMS)
        return ("cape" if cape else "session"), None

    def known(self, curator: str, id_: str) -> bool:
        """Whether the ledger knows ``id_`` for ``curator``: its open recorded (``opened_ids``,
        or its terms in ``session_market``), or a charge of ``curator``'s under it or under its
        payout release (:func:`~dpmarket.owner.earnings.payout_session`). What a close of an id
        the owner no longer holds (it restarted, or closed it idle) answers from."""

        derived = payout_session(id_)
        lookups = (
            ("opened_ids WHERE curator = ? AND id = ?", (curator, id_)),
            ("session_market WHERE curator = ? AND session = ?", (curator, id_)),
            ("charges WHERE curator = ? AND session IN (?, ?)", (curator, id_, derived)),
        )

        def read(conn: sqlite3.Connection) -> bool:
            return any(
                conn.execute(f"SELECT 1 FROM {where} LIMIT 1", params).fetchone() is not None
                for where, params in lookups
            )

        return self.ledger.read(read)

    def check_open(
        self,
        curator: str,
        id_: str,
        kind: IdKind,
        terms: Mapping[str, object] | None = None,
        *,
        session: SessionOpen | None = None,
    ) -> None:
        """Refuse to open ``id_`` as ``kind`` if it is settled, was first opened as the other
        kind, or under other terms than its first open's (``terms``: a CAPE job's, recorded
        with its kind; ``session``: a session's, recorded in ``session_market``): the early
        check, before an open computes anything (:meth:`opened` checks again as it records).

        Raises
        ------
        FailedPreconditionError
            Naming the id and what to do (a new id); nothing is read or charged.
        """
        self.ledger.read(lambda conn: self._check_in(conn, curator, id_, kind, terms, session))

    def _check_in(
        self,
        conn: sqlite3.Connection,
        curator: str,
        id_: str,
        kind: IdKind,
        terms: Mapping[str, object] | None,
        session: SessionOpen | None = None,
    ) -> None:
        """:meth:`check_open` inside a transaction of the owner's database (``conn``)."""
        name = _NAMES[kind]
        other = conn.execute(
            "SELECT curator FROM opened_ids WHERE id = ?1 AND curator != ?2 "
            "UNION ALL SELECT curator FROM session_market WHERE session = ?1 AND curator != ?2 "
            "UNION ALL SELECT curator FROM earnings WHERE session = ?1 AND curator != ?2 "
            "UNION ALL SELECT curator FROM charges WHERE session = ?1 AND curator != ?2 LIMIT 1",
            (id_, curator),
        ).fetchone()
        if other is not None:
            raise FailedPreconditionError(
                f"id {short_id(id_)} is another curator's at this owner (its charges, kind, terms "
                "and statement are recorded for the curator that first opened it): it cannot be "
                f"opened as {name} by {curator}; open it under a new id"
            )
        if Earnings.settled_in(conn, curator, id_):
            raise FailedPreconditionError(
                f"{name} id {short_id(id_)} is settled (its statement is recorded): it cannot "
                "be opened again, whatever its terms; open it under a new id"
            )
        first = self._first(conn, curator, id_)
        if session is not None and (first is None or first[0] == kind):
            _check_session_terms(conn, curator, id_, session)
        if first is None:
            return
        first_kind, first_terms = first
        if first_kind != kind:
            raise FailedPreconditionError(
                f"id {short_id(id_)} was first opened as {_NAMES[first_kind]}: it cannot be "
                f"opened as {name} (an owner's sessions and CAPE jobs share one namespace of "
                "ids); open it under a new id"
            )
        if terms is not None and first_terms is not None:
            now = json.loads(_canonical(terms))  # as recorded: tuples as lists
            changed = sorted(k for k in {*now, *first_terms} if now.get(k) != first_terms.get(k))
            if changed:
                raise FailedPreconditionError(
                    f"{name} id {short_id(id_)} first opened under other terms "
                    f"({', '.join(changed)} differ): a reopen must carry the terms of its first "
                    "open, its statement is checked against one; open it under a new id"
                )

    def opened(
        self,
        curator: str,
        id_: str,
        kind: IdKind,
        terms: Mapping[str, object] | None = None,
        *,
        session: SessionOpen | None = None,
    ) -> None:
        """Check ``id_`` may open as ``kind`` under ``terms`` (or a session's ``session``) and
        record that it did (once: its first open's kind and terms; a session's terms in
        ``session_market``), in one write transaction, before the open computes or installs
        anything: of two opens of one id as different kinds racing, or under different terms,
        the one that records second is refused here, whatever the order of their early
        :meth:`check_open`.

        Raises
        ------
        FailedPreconditionError
            As :meth:`check_open`; nothing is recorded.
        """
        text = None if terms is None else _canonical(terms)
        now = time.time()

        def claim(conn: sqlite3.Connection) -> None:
            self._check_in(conn, curator, id_, kind, terms, session)
            conn.execute(
                "INSERT OR IGNORE INTO opened_ids (curator, id, kind, terms_json, opened_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (curator, id_, kind, text, now),
            )
            if session is not None:
                Earnings.accept_in(
                    conn,
                    curator=curator,
                    session=id_,
                    consumer=session.consumer,
                    market=session.market,
                    prices=session.prices,
                    opened=session.opened,
                    now=now,
                )

        self.ledger.write(claim)

    def check_unsettled(self, curator: str, id_: str) -> None:
        """Refuse a step under a settled id (before the step reads or charges anything).

        Raises
        ------
        FailedPreconditionError
            If the id's statement is recorded.
        """
        if self.earnings.settled(curator, id_):
            raise _settled(id_)

    def charge_guard(self, curator: str, id_: str) -> Callable[[sqlite3.Connection, int], None]:
        """A ``record`` callback for :meth:`~dpmarket.owner.ledger.OwnerLedger.charge`: inside the
        charge's transaction, it rolls the charge back (FailedPreconditionError) if the id's
        statement is recorded, so that no charge lands under an id after its statement."""

        def guard(conn: sqlite3.Connection, charge_id: int) -> None:
            del charge_id
            if Earnings.settled_in(conn, curator, id_):
                raise _settled(id_)

        return guard


def _settled(id_: str) -> FailedPreconditionError:
    return FailedPreconditionError(
        f"id {short_id(id_)} is settled (its statement is recorded): it serves no more steps, "
        "whatever they ask; open a new session or job under a new id"
    )
