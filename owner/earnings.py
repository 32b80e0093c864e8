"""An owner's earnings: the market terms it accepted, and the statements it checked and recorded.

Kept in the owner's own durable database, beside its privacy ledger
(:class:`~dpmarket.owner.ledger.OwnerLedger`, tables ``session_market`` and ``earnings``):

* when a session id first opens, the owner records its terms durably (:meth:`Earnings.accept`:
  its line of the quote if any, its prices then, the settlement the terms fixed, and the
  method, epsilon, delta, rounds and consumer, :func:`~dpmarket.owner.terms.opened_terms`), so
  that it can check the session's statement after a restart of either party, and refuse a
  reopen under other terms;
* when the curator delivers the session's statement (:meth:`Earnings.record`), the owner
  verifies the curator's signature with the key of the curator's verified certificate, checks
  the statement against its *own* ledger's record of the session (points released, epsilon
  charged) and the terms and prices it accepted
  (:func:`~dpmarket.common.market.statement.check_statement`), and only then records it. A
  tampered statement is refused (``INVALID_ARGUMENT``), an inconsistent one too
  (``FAILED_PRECONDITION``), neither is recorded; the same statement delivered again is recorded
  once (its id is the SHA-256 of its canonical bytes; a *different* statement for a session
  already settled is refused).

What an owner's statement shows it: its own line and the header (its noisy value when the
consumer asked for a reward: a charged DP release, :mod:`dpmarket.common.market.payouts`, and the
count of its points the summary holds, which the reward pays on), never another owner's line.
Without a reward the line states no delivery: its points read up to p
(:func:`~dpmarket.common.market.statement.paid_delivered`).
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from dpmarket.common.errors import FailedPreconditionError, NotFoundError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    OwnerRecord,
    OwnerStatement,
    SettlementTerms,
    check_statement,
    decode_owner_statement,
    verify_statement,
)
from dpmarket.common.market.terms import MarketTerms
from dpmarket.owner.ledger import OwnerLedger

__all__ = [
    "DERIVED_SEPARATOR",
    "PAYOUT_MECHANISM",
    "Earning",
    "Earnings",
    "payout_charged",
    "payout_session",
    "statement_id",
]


def statement_id(data: bytes) -> str:
    """A statement's id: the SHA-256 of its canonical bytes, hex."""
    return hashlib.sha256(bytes(data)).hexdigest()


@dataclass(frozen=True)
class Earning:
    """One recorded statement: what a session earned this owner.

    Attributes
    ----------
    id : str
        :func:`statement_id` of the owner's statement.
    curator, session, consumer : str
    recorded_at : float
        Unix time, seconds.
    charge, reward, total : int
        Micro-credits: its prices' charge, its reward, their sum.
    statement : OwnerStatement
    """

    id: str
    curator: str
    session: str
    consumer: str
    recorded_at: float
    charge: int
    reward: int
    total: int
    statement: OwnerStatement

    def to_json(self) -> dict[str, Any]:
        """``{"id", "curator", "session", "consumer", "recorded_at", "charge", "reward",
        "total", "line": {...}, "header": {...}}`` (amounts in micro-credits)."""
        return {
            "id": self.id,
            "curator": self.curator,
            "session": self.session,
            "consumer": self.consumer,
            "recorded_at": self.recorded_at,
            "charge": self.charge,
            "reward": self.reward,
            "total": self.total,
            "header": asdict(self.statement.header),
            "line": asdict(self.statement.line),
        }


def _terms_json(
    market: MarketTerms | None, prices: OwnerPrices, opened: Mapping[str, object] | None
) -> str:
    data: dict[str, object] = {} if opened is None else {"opened": dict(opened)}
    if market is not None:
        data.update(
            max_points_read=market.max_points_read,
            quoted_charge=market.quoted_charge,
            max_cost=market.max_cost,
            settlement=asdict(market.settlement),
            prices=asdict(prices),
        )
    return json.dumps(data, sort_keys=True)


def _priced(epsilon: float) -> float:
    """The epsilon a statement states: the ledger's, 0 for a non-private session."""
    return 0.0 if math.isinf(epsilon) else float(epsilon)


class Earnings:
    """The owner's earnings, in its ledger's database.

    Parameters
    ----------
    ledger : OwnerLedger
        The owner's open ledger (its database holds the tables).
    owner : str
        The owner's name (its certificate's): a statement must be for it.
    """

    def __init__(self, ledger: OwnerLedger, owner: str) -> None:
        self.ledger = ledger
        self.owner = owner

    def accept(
        self,
        *,
        curator: str,
        session: str,
        consumer: str,
        market: MarketTerms | None,
        prices: OwnerPrices,
        opened: Mapping[str, object] | None = None,
    ) -> None:
        """Record the terms a session opened with (once: a session reopened under its id keeps
        the terms it first opened with): its market terms (None: it opened without a quote
        line) and what else its first open fixed
        (:func:`~dpmarket.owner.terms.opened_terms`, when given)."""
        now = time.time()
        self.ledger.write(
            lambda conn: self.accept_in(
                conn,
                curator=curator,
                session=session,
                consumer=consumer,
                market=market,
                prices=prices,
                opened=opened,
                now=now,
            )
        )

    @staticmethod
    def accept_in(
        conn: sqlite3.Connection,
        *,
        curator: str,
        session: str,
        consumer: str,
        market: MarketTerms | None,
        prices: OwnerPrices,
        opened: Mapping[str, object] | None,
        now: float,
    ) -> None:
        """:meth:`accept` inside a write transaction of the owner's database (``conn``): what
        :meth:`~dpmarket.owner.ids.IdState.opened` records with a session's kind."""
        conn.execute(
            "INSERT OR IGNORE INTO session_market (curator, session, consumer, terms_json, "
            "accepted_at) VALUES (?, ?, ?, ?, ?)",
            (curator, session, consumer, _terms_json(market, prices, opened), now),
        )

    @staticmethod
    def first_open_in(
        conn: sqlite3.Connection, curator: str, session: str
    ) -> tuple[MarketTerms | None, dict[str, object] | None] | None:
        """What a session's first open recorded, inside a transaction of the owner's database
        (``conn``): ``(line, opened)``, its quote line (None: it opened without one) and
        :func:`~dpmarket.owner.terms.opened_terms` (None: recorded before the owner recorded
        them); None if no open of it is recorded."""
        row = Earnings._row_in(conn, curator, session)
        if row is None:
            return None
        accepted = Earnings._parse(row)
        opened = json.loads(row[1]).get("opened")
        return (
            None if accepted is None else accepted[1],
            None if opened is None else dict(opened),
        )

    def accepted_line(self, curator: str, session: str) -> MarketTerms | None:
        """The market terms the session first opened with (None: it never opened with any)."""
        accepted = self._accepted(curator, session)
        return None if accepted is None else accepted[1]

    def opened_terms(self, curator: str, session: str) -> dict[str, object] | None:
        """What the session's first open fixed besides its quote line
        (:func:`~dpmarket.owner.terms.opened_terms`), or None: it never opened, or opened
        before the owner recorded it (then only its quote line, if any, is known)."""
        row = self._row(curator, session)
        if row is None:
            return None
        opened = json.loads(row[1]).get("opened")
        return None if opened is None else dict(opened)

    def settled(self, curator: str, session: str) -> bool:
        """Whether a statement of the session is recorded (the session is paid for good)."""
        return self.ledger.read(lambda conn: self.settled_in(conn, curator, session))

    @staticmethod
    def settled_in(conn: sqlite3.Connection, curator: str, session: str) -> bool:
        """:meth:`settled` inside a transaction of the owner's database (``conn``)."""
        return (
            conn.execute(
                "SELECT 1 FROM earnings WHERE curator = ? AND session = ?", (curator, session)
            ).fetchone()
            is not None
        )

    @staticmethod
    def _row_in(conn: sqlite3.Connection, curator: str, session: str) -> tuple[str, str] | None:
        row = conn.execute(
            "SELECT consumer, terms_json FROM session_market WHERE curator = ? AND session = ?",
            (curator, session),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def _row(self, curator: str, session: str) -> tuple[str, str] | None:
        return self.ledger.read(lambda conn: self._row_in(conn, curator, session))

    def _accepted(self, curator: str, session: str) -> tuple[str, MarketTerms, OwnerPrices] | None:
        row = self._row(curator, session)
        return None if row is None else self._parse(row)

    @staticmethod
    def _parse(row: tuple[str, str]) -> tuple[str, MarketTerms, OwnerPrices] | None:
        data = json.loads(row[1])
        if "max_points_read" not in data:  # opened without a quote line
            return None
        market = MarketTerms(
            data["max_points_read"],
            data["quoted_charge"],
            data["max_cost"],
            SettlementTerms(**data["settlement"]),
        )
        return str(row[0]), market, OwnerPrices(**data["prices"])

    def record(
        self, data: bytes, signature: bytes, *, curator: str, curator_key: object | None
    ) -> tuple[Earning, bool]:
        """Check a delivered statement and record it.

        Parameters
        ----------
        data : bytes
            The owner statement's canonical bytes.
        signature : bytes
            The curator's signature over them.
        curator : str
            The caller's verified identity (``"curator:NAME"``).
        curator_key : EC or Ed25519 public key, or None
            The public key of the caller's verified certificate; None (plaintext transport) or
            another kind: refused, a statement cannot be checked without it.

        Returns
        -------
        (Earning, bool)
            The recorded earning, and whether it was recorded now (False: the same statement
            was recorded before; nothing changed).

        Raises
        ------
        InvalidArgumentError
            The bytes are not a canonical statement, or the signature does not verify with the
            curator's certificate key (:class:`~dpmarket.common.market.statement.StatementError`).
        NotFoundError
            If this owner accepted no market terms for that session of this curator.
        FailedPreconditionError
            If the curator has no certificate key, the statement disagrees with the owner's
            ledger, terms or prices
            (:class:`~dpmarket.common.market.statement.StatementMismatchError`, listing every
            field), or another statement was recorded for the session already, or a charge
            under the session landed while the statement was checked. Nothing is recorded.
        """
        if not isinstance(curator_key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
            raise FailedPreconditionError(
                "a statement can only be checked against the curator's certificate key (EC or "
                "Ed25519): this owner serves without certificates, or the curator's has "
                "another kind of key"
            )
        document = decode_owner_statement(data)
        verify_statement(document, signature, curator_key)
        session = document.header.session_id
        accepted = self._accepted(curator, session)
        if accepted is None:
            raise NotFoundError(
                f"this owner accepted no market terms from {curator} for session "
                f"{session[:12]}: no statement to record"
            )
        consumer, market, prices = accepted
        key = statement_id(data)
        existing = self._by_session(curator, session)
        if existing is not None:
            if existing.id == key:
                return existing, False
            raise FailedPreconditionError(
                f"session {session[:12]} of {curator} is settled already by statement "
                f"{existing.id[:12]}; refused another ({key[:12]})"
            )
        charges = self.ledger.read(lambda conn: _charges_under(conn, session))
        self._check_against_ledger(document, consumer, market, prices)
        line = document.line
        earning = Earning(
            key,
            curator,
            session,
            consumer,
            time.time(),
            line.charge,
            line.reward,
            line.total,
            document,
        )

        def write(conn: sqlite3.Connection) -> bool:
            # Checked and recorded as one: a charge under the session that landed after the
            # check (a step still running) refuses the statement, and none lands after it
            # (dpmarket.owner.ids.IdState.charge_guard).
            if _charges_under(conn, session) != charges:
                raise FailedPreconditionError(
                    f"session {session[:12]} of {curator} was charged while its statement was "
                    "checked: the statement may not state it; close the session, then settle it"
                )
            cursor = conn.execute(
                "INSERT OR IGNORE INTO earnings (id, curator, session, consumer, recorded_at, "
                "charge, reward, total, statement, signature) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    curator,
                    session,
                    consumer,
                    earning.recorded_at,
                    earning.charge,
                    earning.reward,
                    earning.total,
                    bytes(data),
                    bytes(signature),
                ),
            )
            return cursor.rowcount == 1

        try:
            added = self.ledger.write(write)
        except sqlite3.IntegrityError:  # another statement of the session won a race
            raise FailedPreconditionError(
                f"session {session[:12]} of {curator} is settled already; refused another"
            ) from None
        return earning, added

    def _check_against_ledger(
        self,
        document: OwnerStatement,
        consumer: str,
        market: MarketTerms,
        prices: OwnerPrices,
    ) -> None:
        """Check ``document`` against what this owner's ledger recorded for its session (points
        released, ε charged for it and for its payout) and against the terms it accepted, for
        :meth:`record`.

        Raises
        ------
        FailedPreconditionError
            :class:`~dpmarket.common.market.statement.StatementMismatchError`, listing every
            field that disagrees.
        """
        session = document.header.session_id
        totals = self.ledger.session_totals(session)
        # The payout release is about delivered points: an owner whose points never left pays
        # no part of it, and its statement states none (the curator states ε_O exactly when the
        # record holds points). A payout charge with no point after it (a crash between the two
        # charges of the first point) is that crash's waste, as any charge whose release never
        # left; the statement then settles without it.
        payout = payout_charged(self.ledger, session) if totals.points > 0 else 0.0
        record = OwnerRecord(
            session_id=session,
            consumer=consumer,
            points_released=int(totals.points),
            epsilon_session=_priced(totals.epsilon),
            epsilon_payout=float(payout),
        )
        check_statement(
            document,
            record,
            prices,
            market.settlement,
            owner=self.owner,
            quoted_charge=market.quoted_charge,
            max_cost=market.max_cost,
        )

    def _by_session(self, curator: str, session: str) -> Earning | None:
        rows = self._rows("WHERE curator = ? AND session = ?", (curator, session))
        return rows[0] if rows else None

    def _rows(self, where: str, params: tuple[Any, ...]) -> list[Earning]:
        rows = self.ledger.read(
            lambda conn: conn.execute(
                "SELECT id, curator, session, consumer, recorded_at, charge, reward, total, "
                f"statement FROM earnings {where} ORDER BY recorded_at, id",
                params,
            ).fetchall()
        )
        return [
            Earning(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                str(r[3]),
                float(r[4]),
                int(r[5]),
                int(r[6]),
                int(r[7]),
                decode_owner_statement(bytes(r[8])),
            )
            for r in rows
        ]

    def all(self) -> list[Earning]:
        """Every recorded earning, oldest first."""
        return self._rows("", ())

    @property
    def total(self) -> int:
        """Everything earned, micro-credits."""
        return sum(e.total for e in self.all())


def _charges_under(conn: sqlite3.Connection, session: str) -> int:
    """How many charges the ledger holds under a session and its payout release."""
    row = conn.execute(
        "SELECT COUNT(*) FROM charges WHERE session IN (?, ?)", (session, payout_session(session))
    ).fetchone()
    return int(row[0])


#: How an owner's ledger names the payout release's charge.
PAYOUT_MECHANISM = "payout release (Laplace)"


#: What separates a curator's id from the suffix of an id the owner derives from it (the payout
#: release's, :func:`payout_session`): never in an id a curator chooses
#: (:func:`dpmarket.owner.ids.check_curator_id`), so no curator id is a derived one.
DERIVED_SEPARATOR = "/"


def payout_session(session: str) -> str:
    """The ledger's session id of a session's payout release charge: apart from the session's
    own charges, so that the session's record (what the curator settles from) is the terms and
    the points alone, and the payout is read on its own. The owner derives it; no curator id
    takes its form (:data:`DERIVED_SEPARATOR`)."""
    return f"{session}{DERIVED_SEPARATOR}payout"


def payout_charged(ledger: OwnerLedger, session: str) -> float:
    """Epsilon of the payout release charged for ``session``: the charges the owner made as that
    release (mechanism :data:`PAYOUT_MECHANISM`, under :func:`payout_session`), whatever else a
    ledger of an earlier release holds under that id (a curator could once open a session
    under it: its charges are not the payout's). 0.0 while the payout is not charged."""
    return math.fsum(
        e.epsilon
        for e in ledger.entries(session=payout_session(session))
        if e.mechanism == PAYOUT_MECHANISM
    )
