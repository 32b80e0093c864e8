"""The owner's own durable privacy ledger: charge, then release.

An owner trusts neither the curator nor the consumer (docs/how-it-works.md), so it keeps its
own record of what its data has lost and enforces its own
:class:`~dpmarket.owner.policy.OwnerPolicy` whatever it is asked. Every release goes through
:meth:`OwnerLedger.charge` first: the charge is committed to ``DATA_DIR/owner.sqlite3`` before
``charge`` returns, and the caller releases only after that. A crash between the two wastes budget
but never releases anything uncharged; a step the policy refuses raises :class:`OwnerBudgetError`
(``FAILED_PRECONDITION``) and writes nothing.

Composition
-----------
Charges compose by *basic* composition: the epsilons of a session (or of the window) add up, and so
do the deltas. Basic composition holds for any mechanisms whatsoever, chosen adaptively, in any
interleaving; the owner sees only its own side of each session and cannot assume anything about the
mechanisms, the other sessions or how the curator and consumers combine what they receive, so it
uses the bound that needs no assumption. (Tighter accountants, such as the curator's Theorem-7
ledger in :mod:`dpmarket.common.privacy.ledger`, rely on knowing every mechanism.) Sums do not
accumulate rounding: a total is the correctly rounded value of the exact sum of the stored doubles
(what :func:`math.fsum` of the listed entries gives), however many charges there are. Decimal values
still round once: the doubles nearest 0.1, 0.1 and 0.1 sum exactly to one unit in the last place
above the double nearest 0.3. So that three steps of 0.1 fit a budget of 0.3, an epsilon or delta
limit is compared with a relative slack of :data:`RELATIVE_SLACK` (1e-12), many orders of magnitude
below the error of any floating-point noise sampler; point counts are compared exactly.

A budget is decided from running totals (table ``charge_totals``, one row per UTC day and
``(epsilon, delta, non_private)``) that a trigger updates in each charge's transaction: the
window's whole days from their totals, the part of a day at its start from its charges (by their
time index), so a decision reads a few rows per day of the window however long the history. A
session's limits read the session's own charges. The database refuses to update or delete a
charge.

A ledger is never created in silence
-------------------------------------
Opening a ledger requires the file to exist and be an owner ledger: a missing file, an empty one
(a failed copy, a full disk, ``: > owner.sqlite3``) or another SQLite file is refused
(:class:`LedgerMissingError`), since starting again from nothing would give the owner its whole
budget back. A ledger is created only on request (:meth:`OwnerLedger.create`: ``dpmarket owner
ledger init`` or ``dpmarket init``) and is bound to its owner
(:mod:`dpmarket.owner.ledger_chain`): a ledger of another owner or deployment is refused
(:class:`~dpmarket.owner.ledger_chain.ForeignLedgerError`). Charges form a hash chain
(:mod:`dpmarket.owner.ledger_chain`), and the owner signs receipts of its ledger's state for the
curator (:meth:`OwnerLedger.receipt`); a ledger found behind a receipt it
signed (:meth:`OwnerLedger.check_receipt`) refuses every charge until its operator resolves it
(:meth:`OwnerLedger.resolve_rollbacks`, ``dpmarket owner ledger resolve``), with an entry of the
chain that the owner checks (:mod:`dpmarket.owner.ledger_resolutions`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from numbers import Integral, Real
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from google.protobuf.message import DecodeError

from dpmarket.common.errors import (
    BudgetRefusedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from dpmarket.owner.ledger_chain import (
    LedgerIdentity,
    LedgerOwner,
    add_chain,
    append_chain,
    head,
    read_identity,
)
from dpmarket.owner.ledger_guard import (
    TAMPERED_MESSAGE,
    ChainGuard,
    LedgerCheckError,
    LedgerTamperedError,
)
from dpmarket.owner.ledger_resolutions import (
    DISMISSED_PREFIX,
    ROLLBACK_PREFIX,
    SUPERSEDED_PREFIX,
    beyond_replaced,
    dismissal_session,
    listed_signature,
    open_rollbacks,
    owed,
    parse_state,
    receipt_genuine,
    receipt_resolved,
    rollback_session,
    supersession_session,
    supersession_through_session,
)
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.receipts import (
    ReceiptError,
    SealedTotals,
    seal_totals,
    sign_receipt,
)
from dpmarket.runtime.database import (
    DatabaseMissingError,
    Migration,
    SchemaUpgradeRequiredError,
    open_database,
    snapshot,
    transaction,
)
from dpmarket.v1 import privacy_pb2

__all__ = [
    "APPLICATION",
    "CHAIN_SCHEMA",
    "DAY",
    "GUARD_TRIGGERS",
    "LEDGER_FILE",
    "MAX_NAME_LENGTH",
    "MIGRATIONS",
    "RELATIVE_SLACK",
    "ROLLBACK_MESSAGE",
    "TAMPERED_MESSAGE",
    "LedgerCheckError",
    "LedgerEntry",
    "LedgerMissingError",
    "LedgerRollbackError",
    "LedgerTamperedError",
    "LedgerUpgradeRequiredError",
    "OwnerBudgetError",
    "OwnerLedger",
    "Remaining",
    "Resolution",
    "Totals",
    "Upgrade",
    "ledger_path",
    "record_superseded",
    "upgrade_message",
]

logger = logging.getLogger(__name__)

#: The ``meta.application`` of an owner's database.
APPLICATION = "dpmarket-owner"
#: File name of the ledger inside the owner's data directory.
LEDGER_FILE = "owner.sqlite3"
#: Schema migrations of the owner's database (append only; see :mod:`dpmarket.runtime.database`).
MIGRATIONS: tuple[Migration, ...] = (
    """
    CREATE TABLE policies (
        applied_at REAL NOT NULL,
        toml TEXT NOT NULL
    );
    CREATE TABLE charges (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        session TEXT NOT NULL,
        consumer TEXT NOT NULL,
        curator TEXT NOT NULL,
        mechanism TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon >= 0),
        delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
        points INTEGER NOT NULL CHECK (points >= 0),
        non_private INTEGER NOT NULL CHECK (non_private IN (0, 1))
    );
    CREATE INDEX charges_by_session ON charges (session);
    CREATE INDEX charges_by_at ON charges (at);
    """,
    # 1 -> 2: the private sketches this owner released (dpmarket.owner.sketches). A sketch is
    # written in the transaction of its charge, so it is stored exactly when it is charged; a
    # release is identified by its spec's key (map, domain, noise) and made at most once. Deliveries
    # record which curator's catalogue accepted it, under which spec name.
    """
    CREATE TABLE sketches (
        id INTEGER PRIMARY KEY,
        charge INTEGER NOT NULL UNIQUE REFERENCES charges (id),
        key TEXT NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        data_digest TEXT NOT NULL,
        sketch BLOB NOT NULL
    );
    CREATE TABLE sketch_deliveries (
        sketch INTEGER NOT NULL REFERENCES sketches (id),
        curator TEXT NOT NULL,
        spec TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (sketch, curator, spec)
    );
    """,
    # 2 -> 3: running totals of the charges per UTC day and (epsilon, delta, non_private), kept
    # by a trigger in the transaction of each insert, so that a budget is decided from a few
    # rows per day rather than a scan of every charge ever made. Charges are append-only: the
    # database refuses to change or delete one, so the totals cannot drift from them.
    """
    CREATE TABLE charge_totals (
        day INTEGER NOT NULL,
        epsilon REAL NOT NULL,
        delta REAL NOT NULL,
        non_private INTEGER NOT NULL,
        charges INTEGER NOT NULL,
        points INTEGER NOT NULL,
        PRIMARY KEY (day, epsilon, delta, non_private)
    );
    INSERT INTO charge_totals (day, epsilon, delta, non_private, charges, points)
        SELECT CAST(at / 86400 AS INTEGER), epsilon, delta, non_private, COUNT(*), SUM(points)
        FROM charges GROUP BY CAST(at / 86400 AS INTEGER), epsilon, delta, non_private;
    CREATE TRIGGER charges_add_to_totals AFTER INSERT ON charges BEGIN
        INSERT INTO charge_totals (day, epsilon, delta, non_private, charges, points)
            VALUES (CAST(NEW.at / 86400 AS INTEGER), NEW.epsilon, NEW.delta, NEW.non_private, 1,
                    NEW.points)
            ON CONFLICT (day, epsilon, delta, non_private) DO UPDATE
            SET charges = charges + 1, points = points + excluded.points;
    END;
    CREATE TRIGGER charges_no_update BEFORE UPDATE ON charges BEGIN
        SELECT RAISE(ABORT, 'charges are append-only');
    END;
    CREATE TRIGGER charges_no_delete BEFORE DELETE ON charges BEGIN
        SELECT RAISE(ABORT, 'charges are append-only');
    END;
    """,
    # 3 -> 4: the ledger's identity (id, owner, deployment CA, sealing key) and keys, the hash
    # chain of the charges (existing charges chained in order), and the receipts the ledger was
    # found behind (owner.ledger_chain.add_chain).
    add_chain,
    # 4 -> 5: the market (dpmarket.owner.earnings): the market terms this owner accepted when a
    # session opened (its line of the quote, its prices then, the settlement the terms fixed),
    # and its earnings, one signed statement per (curator, session), recorded once it matched
    # the ledger's own record of the session.
    """
    CREATE TABLE session_market (
        curator TEXT NOT NULL,
        session TEXT NOT NULL,
        consumer TEXT NOT NULL,
        terms_json TEXT NOT NULL,
        accepted_at REAL NOT NULL,
        PRIMARY KEY (curator, session)
    );
    CREATE TABLE earnings (
        id TEXT PRIMARY KEY,
        curator TEXT NOT NULL,
        session TEXT NOT NULL,
        consumer TEXT NOT NULL,
        recorded_at REAL NOT NULL,
        charge INTEGER NOT NULL CHECK (charge >= 0),
        reward INTEGER NOT NULL CHECK (reward >= 0),
        total INTEGER NOT NULL CHECK (total >= 0),
        statement BLOB NOT NULL,
        signature BLOB NOT NULL,
        UNIQUE (curator, session)
    );
    CREATE TRIGGER earnings_no_update BEFORE UPDATE ON earnings BEGIN
        SELECT RAISE(ABORT, 'earnings are append-only');
    END;
    CREATE TRIGGER earnings_no_delete BEFORE DELETE ON earnings BEGIN
        SELECT RAISE(ABORT, 'earnings are append-only');
    END;
    """,
    # 5 -> 6: the keys a receipt is checked with are append-only like the charges (deleting
    # them hid a rollback behind a rotated key), and a receipt that names this
    # owner but verifies under none of them is recorded as unverified (ledger_rollbacks.verified
    # = 0) rather than ignored. Every trigger of GUARD_TRIGGERS must be present (verify).
    """
    CREATE TRIGGER ledger_keys_no_update BEFORE UPDATE ON ledger_keys BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps every key it served with');
    END;
    CREATE TRIGGER ledger_keys_no_delete BEFORE DELETE ON ledger_keys BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps every key it served with');
    END;
    ALTER TABLE ledger_rollbacks ADD COLUMN verified INTEGER NOT NULL DEFAULT 1;
    """,
    # 6 -> 7: a rollback's resolution is a chained entry of the ledger (a charge-back, a
    # supersession, a dismissal: dpmarket.owner.ledger_resolutions), decided from the chain;
    # ledger_rollbacks.resolved_at and meta's "superseded ledger" rows no longer resolve
    # anything (an edit of them gave a rolled-back ledger its budget back). A detection is
    # kept as found: the database refuses to delete it or change its receipt.
    """
    CREATE TRIGGER ledger_rollbacks_no_delete BEFORE DELETE ON ledger_rollbacks BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps every rollback it found');
    END;
    CREATE TRIGGER ledger_rollbacks_fixed BEFORE UPDATE OF detected_at, curator, receipt,
    sequence, head, ledger_sequence, verified ON ledger_rollbacks BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps every rollback it found');
    END;
    """,
    # 7 -> 8: the sealing key of each ledger this one replaced (restore --replace-other-ledger
    # copies it from the file it replaces): a receipt of a later charge of that ledger (the
    # replaced file was an older copy) then opens here, and resolve --accept-replaced-ledger
    # charges what it shows beyond what the supersession entries counted
    # (dpmarket.owner.ledger_resolutions.beyond_replaced). Append-only.
    """
    CREATE TABLE replaced_ledgers (
        ledger_id TEXT PRIMARY KEY,
        seal_key BLOB NOT NULL CHECK (length(seal_key) = 32),
        recorded_at REAL NOT NULL
    );
    CREATE TRIGGER replaced_ledgers_no_update BEFORE UPDATE ON replaced_ledgers BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps the keys of the ledgers it replaced');
    END;
    CREATE TRIGGER replaced_ledgers_no_delete BEFORE DELETE ON replaced_ledgers BEGIN
        SELECT RAISE(ABORT, 'a ledger keeps the keys of the ledgers it replaced');
    END;
    """,
    # 8 -> 9: what each id (a session's or a CAPE job's: one namespace) was first opened as, and
    # the terms its kind fixes at its first open (dpmarket.owner.ids): an id opens as one kind
    # only, and a reopen carries its first open's terms. The ids opened before keep their kind
    # where their open recorded terms (session_market: a session's carry its "opened" terms or a
    # line with a summary; a CAPE job's, a line of no summary), charged or not; the job's own
    # terms were not recorded then (NULL: not compared at a reopen).
    """
    CREATE TABLE opened_ids (
        curator TEXT NOT NULL,
        id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('session', 'cape')),
        terms_json TEXT,
        opened_at REAL NOT NULL,
        PRIMARY KEY (curator, id)
    );
    INSERT OR IGNORE INTO opened_ids (curator, id, kind, terms_json, opened_at)
    SELECT curator, session,
        CASE WHEN json_extract(terms_json, '$.opened') IS NOT NULL
                  OR json_extract(terms_json, '$.settlement.summary_size') > 0
             THEN 'session' ELSE 'cape' END,
        NULL, accepted_at
    FROM session_market
    WHERE json_extract(terms_json, '$.opened') IS NOT NULL
       OR json_extract(terms_json, '$.settlement') IS NOT NULL;
    """,
)

#: The triggers that keep the ledger's records append-only: a ledger without one of them was
#: edited outside the owner (dropping a trigger is the first step of deleting what it guards),
#: and fails ``verify`` and the owner's check at start.
GUARD_TRIGGERS = (
    "charges_add_to_totals",
    "charges_no_update",
    "charges_no_delete",
    "ledger_identity_fixed",
    "ledger_identity_bound_once",
    "ledger_identity_no_delete",
    "charge_chain_no_update",
    "charge_chain_no_delete",
    "ledger_keys_no_update",
    "ledger_keys_no_delete",
    "earnings_no_update",
    "earnings_no_delete",
    "ledger_rollbacks_no_delete",
    "ledger_rollbacks_fixed",
    "replaced_ledgers_no_update",
    "replaced_ledgers_no_delete",
)

#: The first schema with the ledger's identity and hash chain (migration 3 -> 4). A ledger
#: below it is migrated only by an explicit upgrade (:meth:`OwnerLedger.upgrade`), never on
#: open: a file taken back below it would otherwise come back with a new id and its budget
#: reset. Later migrations (which keep the identity and chain) run when the owner opens it.
CHAIN_SCHEMA = 4
#: Relative slack of the epsilon and delta comparisons (absorbs the rounding of decimal values).
RELATIVE_SLACK = 1e-12
#: Seconds in a day: the running totals' unit of time (UTC days since the epoch).
DAY = 86_400.0
#: Seconds the clock may run ahead of the monotonic clock, within one process, before the
#: owner takes it for a jump ahead (:meth:`OwnerLedger._window_end`): above an NTP slew's.
CLOCK_JUMP_SLACK = 60.0
#: Longest session, consumer, curator or mechanism name accepted, in characters.
MAX_NAME_LENGTH = 256

T = TypeVar("T")

#: Session prefixes of the operator's chained records (:mod:`dpmarket.owner.ledger_resolutions`):
#: never a session a curator may charge.
_OPERATOR_SESSIONS = (ROLLBACK_PREFIX, SUPERSEDED_PREFIX, DISMISSED_PREFIX)

_COLUMNS = "id, at, session, consumer, curator, mechanism, epsilon, delta, points, non_private"


#: What the owner answers, and every charge raises, while its ledger is behind a receipt it
#: signed: fixed, with no budget figure.
ROLLBACK_MESSAGE = (
    "this owner's ledger is behind a receipt it signed (it was restored from an older copy or "
    "lost charges): the owner serves nothing until its operator resolves it"
)
#: The ledger's tables at the current schema (what ``verify`` expects).
TABLES = (
    "meta",
    "policies",
    "charges",
    "sketches",
    "sketch_deliveries",
    "charge_totals",
    "ledger_identity",
    "ledger_keys",
    "charge_chain",
    "ledger_rollbacks",
    "session_market",
    "earnings",
    "replaced_ledgers",
    "opened_ids",
)


def ledger_path(data_dir: str | os.PathLike[str]) -> Path:
    """The ledger file of the owner whose data directory is ``data_dir``."""
    return Path(data_dir) / LEDGER_FILE


def _side_files(path: Path) -> list[Path]:
    """SQLite's files beside a database: its write-ahead log, shared memory, rollback journal."""
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


class LedgerMissingError(NotFoundError, FileNotFoundError):
    """The data directory holds no ledger the owner may use: the file is missing, empty or not
    an owner ledger. The message says what happened and what to do; nothing was written. Both a
    :class:`~dpmarket.common.errors.NotFoundError` (what :mod:`dpmarket.client` raises) and a
    ``FileNotFoundError``.

    Attributes
    ----------
    reason : {"missing", "empty", "foreign"}
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _missing_message(path: Path, reason: str) -> str:
    data_dir = path.parent
    restore = (
        f"restore it from its latest backup: dpmarket owner ledger restore --data-dir "
        f"{data_dir} --from BACKUP (docs/howto-ledger.md)"
    )
    if reason == "missing":
        return (
            f"no owner ledger at {path}: an owner never starts without its ledger (a new one "
            f"would give back its whole budget). If this owner has served before, {restore}. "
            f"If it never has, create its ledger: dpmarket owner ledger init --data-dir {data_dir}"
        )
    what = (
        "is empty (0 bytes): truncated by a failed copy, a full disk or `: > file`, its charges "
        "are gone from this file"
        if reason == "empty"
        else "is not an owner ledger (an SQLite file with no dpmarket-owner record)"
    )
    return (
        f"{path} {what}; the owner does not start on it. To recover, {restore}. Only if this "
        f"owner has never served: move the file away and run dpmarket owner ledger init "
        f"--data-dir {data_dir}"
    )


class LedgerRollbackError(FailedPreconditionError):
    """The ledger is behind a receipt its owner signed (restored from an older copy, or charges
    lost): every charge is refused until the operator resolves it. The message is
    :data:`ROLLBACK_MESSAGE` (fixed, no budget figure)."""


class LedgerUpgradeRequiredError(RuntimeError):
    """The ledger is at an earlier release's schema: the owner does not migrate it on its own
    (a file taken back to an earlier format would be bound again with a new id and a budget
    reset). Nothing was written; the message says what to do."""


def upgrade_message(path: Path, version: int, known: int) -> str:
    """What to do about the ledger ``path`` at an earlier schema ``version`` (``known``: this
    build's): upgrade it explicitly if it never ran this release, restore it otherwise."""
    data_dir = path.parent
    return (
        f"{path} is an owner ledger of an earlier release (schema {version}; this build uses "
        f"{known}): the owner does not upgrade it on its own. If this owner ran that earlier "
        f"release until now, upgrade it once, explicitly: dpmarket owner ledger upgrade "
        f"--data-dir {data_dir}. If it already ran this release, the file was taken back to an "
        f"older format and may have lost charges: do not upgrade it, restore its latest backup: "
        f"dpmarket owner ledger restore --data-dir {data_dir} --from BACKUP (docs/howto-ledger.md)"
    )


@dataclass(frozen=True)
class Upgrade:
    """What :meth:`OwnerLedger.upgrade` did.

    Attributes
    ----------
    before, after : int
        The schema versions (equal: nothing to do).
    ledger_id : str
        The ledger's id after the upgrade (drawn by it when the chain was added).
    charges : int
        Charges the ledger holds.
    new_identity : bool
        Whether the upgrade gave the ledger its identity (and chain): from schema 3 or earlier.
    """

    before: int
    after: int
    ledger_id: str
    charges: int
    new_identity: bool


#: ``meta`` key prefix of an explicit upgrade's record (``dpmarket owner ledger upgrade``).
UPGRADE_KEY = "upgrade "


def record_superseded(
    conn: sqlite3.Connection,
    ledger_id: str,
    how: str,
    at: float,
    spent: tuple[Fraction, Fraction, int] = (Fraction(0), Fraction(0), 0),
    *,
    through: int | None = None,
    seal_key: bytes | None = None,
) -> int:
    """Record, as a chained entry of the ledger (inside the caller's transaction), that it
    replaced ledger ``ledger_id`` on its operator's request ``how`` at Unix time ``at``,
    charging ``spent`` (that ledger's lifetime epsilon, delta and points when they are known:
    ``restore --replace-other-ledger``; nothing for ``resolve --accept-replaced-ledger``). The
    receipts of that ledger are accepted from then on
    (:func:`~dpmarket.owner.ledger_resolutions.receipt_resolved`); with ``through``, the replaced
    ledger's last charge counted in ``spent``, only its receipts up to that charge
    (:func:`~dpmarket.owner.ledger_resolutions.supersession_through_session`). With
    ``seal_key``, that ledger's sealing key is kept (``replaced_ledgers``): a receipt of a later
    charge of it is then charged what it shows beyond the entry
    (:func:`~dpmarket.owner.ledger_resolutions.beyond_replaced`). Returns the entry's number.

    Notes
    -----
    The policy's limits do not apply: the entry records privacy already spent. Epsilon and
    delta are rounded up (delta kept below 1, as a charge's must be).
    """
    epsilon, delta, points = spent
    request = _Request(
        session=(
            supersession_session(ledger_id)
            if through is None
            else supersession_through_session(ledger_id, through)
        ),
        consumer="operator",
        curator="operator",
        mechanism=f"ledger {ledger_id} replaced by this one ({how})",
        epsilon=_round_up(epsilon),
        delta=min(_round_up(delta), math.nextafter(1.0, 0)),
        points=int(points),
    )
    if seal_key is not None:
        conn.execute(
            "INSERT OR IGNORE INTO replaced_ledgers (ledger_id, seal_key, recorded_at) "
            "VALUES (?, ?, ?)",
            (ledger_id, seal_key, at),
        )
    return _append_entry(conn, request, at)[0]


@dataclass(frozen=True)
class Resolution:
    """What :meth:`OwnerLedger.resolve_rollbacks` charged for one receipt the ledger was behind.

    Attributes
    ----------
    rollback : int
        The rollback's number in the ledger.
    curator : str
        Who presented the receipt.
    receipt_sequence, ledger_sequence : int
        The receipt's last charge, and the ledger's when the rollback was found.
    epsilon, delta : float
        Charged now: what the receipt's totals hold beyond the charges this ledger shares with
        it (rounded up).
    points : int
        Likewise, raw points.
    charge : int or None
        The chained entry that resolves it (a charge-back, of zero when nothing was missing; an
        acceptance or a dismissal, of zero).
    replaced_ledger : str or None
        For a receipt of another ledger of this owner: that ledger's id, now recorded as
        replaced by this one up to the receipt's charge.
    counted_replaced : bool
        For such a receipt: whether this ledger holds that ledger's sealing key (it replaced it
        by ``restore --replace-other-ledger``), so that what the receipt shows beyond the
        charges of it counted here was charged; otherwise nothing is charged (its totals are
        sealed under its own key) and the loss is accepted.
    dismissed : bool
        An unverified receipt (no key of the ledger signed it, its totals do not open)
        dismissed on the operator's request: nothing is charged.
    """

    rollback: int
    curator: str
    receipt_sequence: int
    ledger_sequence: int
    epsilon: float
    delta: float
    points: int
    charge: int | None
    replaced_ledger: str | None = None
    counted_replaced: bool = False
    dismissed: bool = False


class OwnerBudgetError(BudgetRefusedError):
    """A step the owner's policy refuses: it would exceed a budget or a session limit.

    A :class:`~dpmarket.common.errors.BudgetRefusedError` (``FAILED_PRECONDITION``, marked as a
    budget refusal on the wire); the message names each limit the step would exceed, what is spent,
    what the step asks and what is left: for the curator, which relays it to a consumer only as a
    fixed text. Nothing was charged.
    """


@dataclass(frozen=True)
class LedgerEntry:
    """One charge, as stored.

    Attributes
    ----------
    id : int
        Increasing with the order of the charges.
    at : float
        When it was charged, Unix time in seconds (the ledger's clock).
    session, consumer, curator, mechanism : str
        What the release was for and which mechanism produced it.
    epsilon : float
        Epsilon of the release; ``math.inf`` for a non-private release.
    delta : float
        Delta of the release, in [0, 1).
    points : int
        Raw points released, >= 0.
    non_private : bool
        Whether the release was exact (epsilon = inf); such charges are not in the epsilon and
        delta sums, but their points are.
    """

    id: int
    at: float
    session: str
    consumer: str
    curator: str
    mechanism: str
    epsilon: float
    delta: float
    points: int
    non_private: bool

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> LedgerEntry:
        """An entry from a ``charges`` row selected in the column order of the table."""
        return cls(
            id=int(row[0]),
            at=float(row[1]),
            session=row[2],
            consumer=row[3],
            curator=row[4],
            mechanism=row[5],
            epsilon=float(row[6]),
            delta=float(row[7]),
            points=int(row[8]),
            non_private=bool(row[9]),
        )


@dataclass(frozen=True)
class Totals:
    """What a session, or the window, has spent (basic composition).

    Attributes
    ----------
    epsilon, delta : float
        Sums over the private charges (non-private ones excluded).
    points : int
        Raw points released, non-private releases included.
    non_private : bool
        Whether any non-private release was charged.
    """

    epsilon: float
    delta: float
    points: int
    non_private: bool


@dataclass(frozen=True)
class Remaining:
    """What is left of the owner's budgets over the window (never negative).

    Attributes
    ----------
    epsilon, delta : float
        ``budget - spent``, clipped at 0.
    points : int
        Raw points that may still be released.
    window : str
        ``"the lifetime"`` or ``"the last N days"``.
    """

    epsilon: float
    delta: float
    points: int
    window: str


def _exact_sum(groups: Iterable[tuple[float, int]]) -> Fraction:
    """The exact ``sum(value * count)`` of doubles; ``float()`` of it is what math.fsum gives."""
    return sum((Fraction(value) * count for value, count in groups), Fraction(0))


@dataclass(frozen=True)
class _Spent:
    """Totals kept exact, so that a decision adds the new charge before any rounding."""

    epsilon: Fraction
    delta: Fraction
    points: int
    non_private: bool

    def totals(self) -> Totals:
        return Totals(float(self.epsilon), float(self.delta), self.points, self.non_private)


def _from_groups(groups: Iterable[tuple[float, float, int, int, int]]) -> _Spent:
    """Totals from ``(epsilon, delta, non_private, charges, points)`` groups (a group may repeat):
    a non-private group's epsilon and delta are not composed; its points count."""
    rows = list(groups)
    private = [(e, d, n) for e, d, non_private, n, _ in rows if not non_private]
    return _Spent(
        epsilon=_exact_sum((e, n) for e, _, n in private),
        delta=_exact_sum((d, n) for _, d, n in private),
        points=sum(int(points) for *_, points in rows),
        non_private=any(bool(row[2]) for row in rows),
    )


def _unverified_state(receipt: privacy_pb2.LedgerReceipt) -> privacy_pb2.LedgerState | None:
    """A receipt's state read without checking its signature (None if it does not parse or
    names no ledger): what it claims, to decide whether it concerns this owner."""
    try:
        state = privacy_pb2.LedgerState.FromString(receipt.state)
    except DecodeError:
        return None
    return state if state.ledger_id and state.owner else None


def _round_up(value: Fraction) -> float:
    """The least double >= ``value``."""
    x = float(value)
    return math.nextafter(x, math.inf) if Fraction(x) < value else x


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        shown = value if not isinstance(value, str) else value[:40]
        raise InvalidArgumentError(
            f"{what} must be a string of 1 to {MAX_NAME_LENGTH} characters, got {shown!r}"
        )
    return value


def _fmt(x: float) -> str:
    return f"{x:.12g}"


@contextmanager
def _unavailable_when_busy(path: Path) -> Iterator[None]:
    """Turn SQLite's "database is locked" into :class:`UnavailableError` (retryable)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise UnavailableError(
                f"owner ledger {path} is held by another writer: {exc}; retry"
            ) from exc
        raise


@dataclass(frozen=True)
class _Request:
    session: str
    consumer: str
    curator: str
    mechanism: str
    epsilon: float
    delta: float
    points: int

    @property
    def non_private(self) -> bool:
        return math.isinf(self.epsilon)


def _append_entry(
    conn: sqlite3.Connection, request: _Request, now: float
) -> tuple[int, tuple[Any, ...], bytes]:
    """Insert and chain one charge (inside the caller's write transaction): its id, its row
    values after the id, its chain hash."""
    values = (
        now,
        request.session,
        request.consumer,
        request.curator,
        request.mechanism,
        request.epsilon,
        request.delta,
        request.points,
        int(request.non_private),
    )
    cursor = conn.execute(
        "INSERT INTO charges (at, session, consumer, curator, mechanism, epsilon, delta, "
        "points, non_private) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        values,
    )
    row_id = cursor.lastrowid
    assert row_id is not None
    return row_id, values, append_chain(conn, row_id)


class OwnerLedger:
    """One owner's durable ledger, enforcing its :class:`~dpmarket.owner.policy.OwnerPolicy`.

    Parameters
    ----------
    data_dir : str or path-like
        The owner's data directory; the ledger is ``data_dir / "owner.sqlite3"``, which must
        exist (create it with :meth:`create`).
    policy : OwnerPolicy or None
        The policy in force. It is recorded in the ledger (a new ``policies`` row when its
        text differs from the last one recorded), so the ledger can be read later without the
        policy file. ``None``: use the last recorded policy and record nothing (inspection).
    owner : LedgerOwner, optional
        The owner that serves with this ledger: its name, deployment CA and certificate key
        (:meth:`~dpmarket.owner.ledger_chain.LedgerOwner.from_security`). The ledger must be its own
        (an unbound ledger is bound to it, a renewed certificate's key is added), and its key
        signs :meth:`receipt`. ``None``: no identity check and no receipts (inspection,
        in-process runs).
    clock : callable returning float
        Unix time in seconds; the time of each charge and the end of the rolling window.
    monotonic : callable returning float, optional
        Seconds of a clock that never jumps: what detects the clock jumping ahead within this
        process (:meth:`_window_end`). Default: ``time.monotonic`` with the default ``clock``;
        none (no detection) with another ``clock``.

    Raises
    ------
    LedgerMissingError
        (a ``FileNotFoundError``) If the ledger file is missing, empty (0 bytes) or not an
        owner ledger; the message says what to do. Nothing is created or written.
    ForeignLedgerError
        (a ``ValueError``) If the ledger belongs to another owner, or to an owner of the same
        name in another deployment (another CA).
    LedgerCheckError
        (a ``ValueError``) If the ledger does not match what its owner wrote: a charge that
        does not match its chain hash, or running totals that differ from the sums of the
        charges (checked once, at open: O(history), :mod:`dpmarket.owner.ledger_guard`).
    LedgerUpgradeRequiredError
        (a ``RuntimeError``) If the file is at a schema below :data:`CHAIN_SCHEMA` (before the
        ledger's identity and chain): it is migrated only by :meth:`upgrade` (``dpmarket owner
        ledger upgrade``), never on open. Later schemas are migrated on open.
    ValueError
        If the file belongs to another application, or ``policy`` is ``None`` and the ledger
        records no policy.
    RuntimeError
        If the file was written by a newer dpmarket (see
        :func:`dpmarket.runtime.database.open_database`).
    sqlite3.DatabaseError
        If the file is not an SQLite database (a damaged header, a half-truncated file).

    Notes
    -----
    Every method may be called from any thread: one lock serialises this object's use of its
    connection. Several ``OwnerLedger`` objects, in this process or others, may open the same
    data directory: each check-and-insert runs in one ``BEGIN IMMEDIATE`` transaction, so SQLite
    serialises them and the budgets hold across all of them.

    The budgets of the window count every charge stamped at or after ``policy.window_days``
    before now, later stamps included (all charges for a lifetime budget; the clock's jumps:
    :meth:`_now`, :meth:`_window_end`); the session limits count every charge of the
    session. A policy change applies to everything already charged: tightening it below what is
    spent refuses every further step that asks for more.

    References
    ----------
    Dwork & Roth (2014), *The Algorithmic Foundations of Differential Privacy*, Theorem 3.16
    (basic composition) and Section 3.5 (adaptive composition).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        policy: OwnerPolicy | None,
        *,
        owner: LedgerOwner | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._open(data_dir, policy, owner, clock, create=False, monotonic=monotonic)

    def _open(
        self,
        data_dir: str | os.PathLike[str],
        policy: OwnerPolicy | None,
        owner: LedgerOwner | None,
        clock: Callable[[], float],
        *,
        create: bool,
        upgrade: bool = False,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._path = ledger_path(data_dir)
        self._clock = clock
        # An injected clock without a monotonic one is the time itself (tests, simulations).
        self._monotonic = monotonic or (time.monotonic if clock is time.time else None)
        self._reference: tuple[float, float] | None = None
        self._clock_behind = False
        self._clock_ahead = False
        self._lock = threading.Lock()
        self._pending: list[tuple[tuple[Any, ...], bytes]] = []
        self._rollback_cache: tuple[tuple[int, int, Any], list[int]] | None = None
        self._resolved_rollbacks: set[int] = set()  # decided once: the chain only grows
        #: Whether a curator's held receipt passed :meth:`check_receipt` since the ledger was
        #: opened (:meth:`close_receipt` signs none before).
        self._receipt_checked = False
        try:
            # A rollback journal, not WAL: a committed charge is in owner.sqlite3 itself, so a
            # lost or truncated file beside it cannot take a charge back in silence. A file
            # below the chain's schema is migrated only on request (upgrade): see
            # LedgerUpgradeRequiredError; later migrations run on open.
            self._conn = open_database(
                self._path,
                MIGRATIONS,
                application=APPLICATION,
                create=create,
                journal="rollback",
                auto_upgrade_from=0 if upgrade else CHAIN_SCHEMA,
            )
        except DatabaseMissingError as exc:
            raise LedgerMissingError(
                _missing_message(self._path, exc.reason), reason=exc.reason
            ) from None
        except SchemaUpgradeRequiredError as exc:
            raise LedgerUpgradeRequiredError(
                upgrade_message(self._path, exc.version, exc.known)
            ) from None
        self._signer = owner.signer if owner is not None else None
        self._certificate = owner.certificate if owner is not None else None
        self._ca_pem = owner.ca_pem if owner is not None else None
        try:
            self._identity = self._bind(owner)
            self._policy = self._record_policy(policy)
            with snapshot(self._conn):
                self._guard = ChainGuard.load(
                    self._conn, self._path, expected_tables=TABLES, expected_triggers=GUARD_TRIGGERS
                )
            self._warn_marked_resolved()
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def create(
        cls,
        data_dir: str | os.PathLike[str],
        policy: OwnerPolicy,
        *,
        owner: LedgerOwner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> OwnerLedger:
        """Create a new, empty ledger in ``data_dir`` (and the directory) and open it.

        What ``dpmarket owner ledger init`` and ``dpmarket init`` run; nothing else creates a
        ledger. The ledger draws its id and is bound to ``owner``; without ``owner`` it stays
        unbound until the first owner that serves it (in-process runs and tests).

        Parameters
        ----------
        data_dir, policy, owner, clock
            As for :class:`OwnerLedger`; ``policy`` is recorded as the ledger's first.

        Returns
        -------
        OwnerLedger
            Open; the caller closes it.

        Raises
        ------
        FileExistsError
            If ``data_dir`` holds a ledger file already (even an empty one) or SQLite's files
            beside one: a ledger is never replaced by a new one (restore it, or move it away
            first).
        """
        path = ledger_path(data_dir)
        found = [p.name for p in (path, *_side_files(path)) if p.exists()]
        if found:
            raise FileExistsError(
                f"{Path(data_dir)} holds a ledger already ({', '.join(found)}): a new ledger "
                "would give this owner its whole budget back. Restore a damaged ledger from a "
                "backup (dpmarket owner ledger restore); only if this owner has never served, "
                "move those files away and create it again"
            )
        ledger = cls.__new__(cls)
        ledger._open(data_dir, policy, owner, clock, create=True)
        logger.info(
            "new ledger %s in %s for owner %s",
            ledger.identity.ledger_id,
            path,
            ledger.identity.owner or "(unbound)",
        )
        return ledger

    @classmethod
    def upgrade(
        cls, data_dir: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> Upgrade:
        """Migrate a ledger of an earlier release to this build's schema, and record it.

        What ``dpmarket owner ledger upgrade`` runs; the owner never migrates its ledger on its
        own (:class:`LedgerUpgradeRequiredError`). From schema 3 or earlier, the migration gives
        the ledger its identity (a new id, unbound: the first owner that serves it binds it)
        and chains its charges as found (:func:`~dpmarket.owner.ledger_chain.add_chain`). The
        upgrade is recorded in the ledger (``meta``: from, to, when, the ledger id, charges).

        Returns
        -------
        Upgrade
            ``before == after`` when the ledger was at this build's schema already (nothing
            recorded).

        Raises
        ------
        LedgerMissingError
            If there is no ledger file to upgrade (missing, empty, not an owner ledger).
        RuntimeError
            If the file was written by a newer dpmarket.
        LedgerCheckError
            If the upgraded ledger does not match its charges (running totals edited).
        """
        path = ledger_path(data_dir)
        before = 0
        if path.is_file() and path.stat().st_size > 0:
            with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as c:
                before = int(c.execute("PRAGMA user_version").fetchone()[0])
        ledger = cls.__new__(cls)
        ledger._open(data_dir, None, None, clock, create=False, upgrade=True)
        try:
            after = len(MIGRATIONS)
            with ledger._lock, transaction(ledger._conn):
                charges = int(ledger._conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])
                if before != after:
                    now = float(clock())
                    ledger._conn.execute(
                        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                        (
                            f"{UPGRADE_KEY}{before}->{after} at {now!r}",
                            json.dumps(
                                {
                                    "from": before,
                                    "to": after,
                                    "at": now,
                                    "ledger_id": ledger.identity.ledger_id,
                                    "charges": charges,
                                }
                            ),
                        ),
                    )
        finally:
            ledger.close()
        if before != after:
            logger.warning(
                "ledger %s upgraded from schema %d to %d: ledger %s, %d charges",
                path,
                before,
                after,
                ledger.identity.ledger_id,
                charges,
            )
        return Upgrade(
            before=before,
            after=after,
            ledger_id=ledger.identity.ledger_id,
            charges=charges,
            new_identity=before < 4 <= after,
        )

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction that may insert charges (:meth:`_insert`): the owner's guard
        takes them in once it has committed, never before."""
        self._pending = []
        try:
            with transaction(self._conn) as conn:
                yield conn
        except BaseException:
            self._pending = []
            raise
        for row, digest in self._pending:
            self._guard.advance(row, digest)
        self._pending = []

    def _bind(self, owner: LedgerOwner | None) -> LedgerIdentity:
        """Check that the ledger is ``owner``'s (bind an unbound one, add a renewed key)."""
        if owner is None:
            with snapshot(self._conn):
                return read_identity(self._conn)
        with transaction(self._conn):
            identity = read_identity(self._conn)
            owner.check(identity, str(self._path))
            now = float(self._clock())
            if identity.owner is None:
                self._conn.execute(
                    "UPDATE ledger_identity SET owner = ?, ca = ?", (owner.name, owner.ca)
                )
                if head(self._conn)[0] > 0:  # an upgraded ledger, or one used in process
                    logger.warning(
                        "ledger %s (%s) holds charges but had no owner: it is bound to owner "
                        "%s from now on",
                        identity.ledger_id,
                        self._path,
                        owner.name,
                    )
            key = owner.key
            if key is not None and key[0] not in identity.keys:
                self._conn.execute(
                    "INSERT INTO ledger_keys (fingerprint, public_key, added_at) VALUES (?, ?, ?)",
                    (key[0], key[1], now),
                )
                if identity.keys:
                    logger.info(
                        "ledger %s: certificate key %s of owner %s added (a renewed certificate)",
                        identity.ledger_id,
                        key[0][:16],
                        owner.name,
                    )
            return read_identity(self._conn)

    def _record_policy(self, policy: OwnerPolicy | None) -> OwnerPolicy:
        if policy is None:
            with snapshot(self._conn):
                row = self._conn.execute(
                    "SELECT toml, applied_at FROM policies ORDER BY rowid DESC LIMIT 1"
                ).fetchone()
            if row is None:
                raise ValueError(f"{self._path} records no policy: open it with a policy first")
            source = f"policy recorded in {self._path} at {row[1]!r}"
            return OwnerPolicy.from_mapping(tomllib.loads(row[0]), source=source)
        text = policy.to_toml()
        with transaction(self._conn):
            row = self._conn.execute(
                "SELECT toml FROM policies ORDER BY rowid DESC LIMIT 1"
            ).fetchone()
            if row is None or row[0] != text:
                self._conn.execute(
                    "INSERT INTO policies (applied_at, toml) VALUES (?, ?)",
                    (float(self._clock()), text),
                )
        return policy

    def rebind(self, owner: LedgerOwner) -> tuple[str | None, str | None]:
        """Bind the ledger to ``owner``'s certificate of a new CA (the deployment's CA was
        replaced: docs/howto-certificates.md); its key is added. The owner's name must be the
        ledger's.

        Returns
        -------
        (str or None, str or None)
            The CA fingerprints before and after.

        Raises
        ------
        ForeignLedgerError
            If the ledger belongs to another owner name.
        """
        with self._lock, _unavailable_when_busy(self._path), transaction(self._conn):
            identity = read_identity(self._conn)
            if identity.owner not in (None, owner.name):
                LedgerOwner(owner.name, identity.ca).check(identity, str(self._path))
            self._conn.execute(
                "UPDATE ledger_identity SET owner = ?, ca = ?", (owner.name, owner.ca)
            )
        self._identity = self._bind(owner)
        logger.warning(
            "ledger %s of owner %s bound to CA %s (was %s)",
            identity.ledger_id,
            owner.name,
            owner.ca,
            identity.ca,
        )
        return identity.ca, owner.ca

    # ------------------------------------------------------------------ properties
    @property
    def policy(self) -> OwnerPolicy:
        """The policy in force (given, or the last recorded)."""
        return self._policy

    @property
    def path(self) -> Path:
        """The ledger's database file."""
        return self._path

    @property
    def identity(self) -> LedgerIdentity:
        """Whose ledger this is (as found when it was opened)."""
        return self._identity

    def head(self) -> tuple[int, bytes]:
        """``(sequence, hash)`` of the chain's last charge (``(0, genesis)`` with none)."""
        with self._lock, snapshot(self._conn):
            return head(self._conn)

    # ------------------------------------------------------------------ validation
    @staticmethod
    def _request(
        session: Any,
        consumer: Any,
        curator: Any,
        mechanism: Any,
        epsilon: Any,
        delta: Any,
        points: Any,
    ) -> _Request:
        if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
            raise InvalidArgumentError(f"epsilon must be a number, got {epsilon!r}")
        eps = float(epsilon)
        if not (eps >= 0 and (math.isfinite(eps) or eps == math.inf)):
            raise InvalidArgumentError(
                f"epsilon must be finite and >= 0 (or inf for a non-private release), got {eps}"
            )
        if isinstance(delta, bool) or not isinstance(delta, Real):
            raise InvalidArgumentError(f"delta must be a number, got {delta!r}")
        dlt = float(delta)
        if not 0.0 <= dlt < 1.0:
            raise InvalidArgumentError(f"delta must be in [0, 1), got {dlt}")
        if isinstance(points, bool) or not isinstance(points, Integral):
            raise InvalidArgumentError(f"points must be an integer >= 0, got {points!r}")
        if points < 0:
            raise InvalidArgumentError(f"points must be an integer >= 0, got {points}")
        if isinstance(session, str) and session.startswith(_OPERATOR_SESSIONS):
            raise InvalidArgumentError(
                f"session {session[:40]!r}: session ids starting with "
                f"{', '.join(_OPERATOR_SESSIONS)} are the ledger operator's records; use another id"
            )
        return _Request(
            session=_name(session, "session"),
            consumer=_name(consumer, "consumer"),
            curator=_name(curator, "curator"),
            mechanism=_name(mechanism, "mechanism"),
            epsilon=eps,
            delta=dlt,
            points=int(points),
        )

    # ------------------------------------------------------------------ sums
    def _spent(self, where: str, params: tuple[Any, ...]) -> _Spent:
        """Totals of the charges matching ``where`` (an SQL condition on ``charges``)."""
        return _from_groups(
            self._conn.execute(
                "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
                f"WHERE {where} GROUP BY epsilon, delta, non_private",
                params,
            ).fetchall()
        )

    def _window_spent(self, now: float) -> _Spent:
        """Totals of the charges stamped at or after ``now - window`` (all of them for a
        lifetime), charges stamped later than ``now`` (while the clock was ahead) included: the
        running totals of every UTC day from the window's first on, and the charges of the part
        of a day at its start, found by their time index."""
        seconds = self._policy.window_seconds
        first_day = 1 if math.isinf(seconds) else max(1, math.floor((now - seconds) / DAY) + 1)
        # The whole days' totals as the owner wrote them, once the table is found to hold
        # exactly them (ledger_guard); the partial first day's charges likewise.
        self._guard.sync(self._conn)
        whole_days = self._guard.window(self._conn, first_day)
        if not math.isinf(seconds):
            self._guard.check_day(self._conn, first_day - 1)
        # Days >= 1 hold exactly the charges made at or after first_day * DAY (CAST truncates,
        # and those times are positive); the rest of the window is scanned.
        start = -math.inf if math.isinf(seconds) else now - seconds
        part = self._conn.execute(
            "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
            "WHERE at >= ? AND at < ? GROUP BY epsilon, delta, non_private",
            (start, first_day * DAY),
        ).fetchall()
        return _from_groups(whole_days + part)

    def _session_spent(self, session: str) -> _Spent:
        return self._spent("session = ?", (session,))

    # ------------------------------------------------------------------ decision
    def _refusals(self, request: _Request, now: float) -> list[str]:
        """Every limit ``request`` would exceed, as phrases, with the window ending at ``now``
        (:meth:`_window_end`); empty when it is allowed."""
        policy = self._policy
        if request.non_private and not policy.allow_non_private:
            return [
                f"non-private release ({request.mechanism}, epsilon = inf) for session "
                f"{request.session!r}: this owner's policy does not allow non-private sessions "
                "(access.allow_non_private = false)"
            ]
        out: list[str] = []
        scopes = (
            (
                f"in session {request.session!r}",
                self._session_spent(request.session),
                (policy.epsilon_per_session, policy.delta_per_session, policy.points_per_session),
            ),
            (
                f"over {policy.window_description}",
                self._window_spent(now),
                (policy.epsilon_total, policy.delta_total, policy.points_total),
            ),
        )
        for scope, spent, (epsilon_limit, delta_limit, points_limit) in scopes:
            # (quantity, spent exactly, this step, limit, whether the slack applies); a
            # non-private step's epsilon and delta are not composed (the policy allows it).
            quantities: list[tuple[str, Fraction, float, float, bool]] = [
                ("points", Fraction(spent.points), request.points, points_limit, False)
            ]
            if not request.non_private:
                quantities[:0] = [
                    ("epsilon", spent.epsilon, request.epsilon, epsilon_limit, True),
                    ("delta", spent.delta, request.delta, delta_limit, True),
                ]
            for quantity, used, asks, limit, slack in quantities:
                allowed = limit * (1.0 + RELATIVE_SLACK) if slack else limit
                if asks > 0 and float(used + Fraction(asks)) > allowed:
                    out.append(
                        f"{quantity} {scope}: spent {_fmt(float(used))} of {_fmt(limit)}, "
                        f"this step asks {_fmt(asks)}, {_fmt(max(limit - float(used), 0))} left"
                    )
        return out

    def _refuse(self, request: _Request) -> None:
        self._refuse_if_rolled_back()
        self._guard.sync(self._conn)
        refusals = self._refusals(request, self._window_end())
        if refusals:
            raise OwnerBudgetError("owner budget exceeded: " + "; ".join(refusals))

    def _refuse_if_rolled_back(self) -> None:
        """Raise :class:`LedgerRollbackError` while a rollback found is not resolved."""
        if self._open_rollbacks():
            raise LedgerRollbackError(ROLLBACK_MESSAGE)

    def _open_rollbacks(self) -> list[int]:
        """The rollbacks found whose receipts the chain does not resolve
        (:func:`~dpmarket.owner.ledger_resolutions.open_rollbacks`), decided again only when
        the chain's head or the number of detections changed (inside a transaction or
        snapshot)."""
        sequence, _ = head(self._conn)
        count, last = self._conn.execute(
            "SELECT COUNT(*), MAX(id) FROM ledger_rollbacks"
        ).fetchone()
        key = (sequence, int(count), last)
        if self._rollback_cache is None or self._rollback_cache[0] != key:
            found = open_rollbacks(self._conn, skip=self._resolved_rollbacks)
            numbers = {int(r[0]) for r in self._conn.execute("SELECT id FROM ledger_rollbacks")}
            self._resolved_rollbacks |= numbers - set(found)
            self._rollback_cache = (key, found)
        return self._rollback_cache[1]

    def _warn_marked_resolved(self) -> None:
        """Log the rollbacks ``ledger_rollbacks`` marks resolved that the chain does not
        resolve (an edit of the file, or a resolution by a release before schema 7), with what
        the operator does: the owner refuses every charge until then."""
        with snapshot(self._conn):
            found = self._open_rollbacks()
            marked = [
                int(r[0])
                for r in self._conn.execute(
                    "SELECT id FROM ledger_rollbacks WHERE resolved_at IS NOT NULL ORDER BY id"
                )
                if int(r[0]) in found
            ]
        if marked:
            logger.error(
                "ledger %s: rollback(s) %s are marked resolved, but the ledger's chain holds no "
                "entry that resolves them (the mark was edited into the file, or written by a "
                "release before schema 7, which kept it outside the chain). The owner refuses "
                "every session and job until its operator runs dpmarket owner ledger resolve "
                "--data-dir %s (with --accept-replaced-ledger or --dismiss-unverified-receipts "
                "if it asks) or restores a newer backup (docs/howto-ledger.md)",
                self._path,
                ", ".join(map(str, marked)),
                self._path.parent,
            )

    def _now(self) -> float:
        """The time a charge, a resolution, a window or a receipt is stamped with (inside a
        transaction or snapshot): the clock, but never earlier than the ledger's latest charge.

        A clock set back (by hand, or a host restored with a stale clock) would date a charge
        before those already made, so that, once the clock is right again, a rolling window no
        longer counts it: with a one-day window, a clock two days behind admitted a charge the
        window had no room for, and after the clock was fixed it had fallen out. Stamped no
        earlier than the latest charge, the charge counts in every window that the latest one
        does, and the window is summed at that time (what it holds then is at least what it
        holds at the real time). The owner does not refuse to serve on a clock behind (an NTP
        step back of a second would stop it); it logs a warning, once while the clock is
        behind, saying by how much and to fix it.
        """
        clock = float(self._clock())
        (latest,) = self._conn.execute("SELECT MAX(at) FROM charges").fetchone()
        if latest is None or clock >= float(latest):
            self._clock_behind = False
            return clock
        if not self._clock_behind:
            logger.warning(
                "ledger %s: the clock (%s) is %.0f s behind the ledger's latest charge (%s): "
                "charges are stamped at that charge's time, so that a rolling window still "
                "counts them, until the clock passes it. Fix this host's clock (NTP)",
                self._path,
                datetime.fromtimestamp(clock, UTC).isoformat(timespec="seconds"),
                float(latest) - clock,
                datetime.fromtimestamp(float(latest), UTC).isoformat(timespec="seconds"),
            )
            self._clock_behind = True
        return float(latest)

    def _window_end(self) -> float:
        """The time the rolling window ends at: the clock, but never later than the time the
        monotonic clock says has passed since this ledger last saw its clock consistent.

        The window counts every charge stamped at or after ``end - window``, later ones
        included (:meth:`_window_spent`): charges stamped while the clock was ahead count once
        it is fixed, and so do those made before it jumped. Within this process a jump ahead is
        detected (the clock advanced more than :data:`CLOCK_JUMP_SLACK` seconds beyond
        ``time.monotonic`` since the reference): the window then ends at the monotonic-consistent
        time, and a warning says so once. The reference is the first reading (at the ledger's
        first use in this process), moved with the clock while it does not run ahead of it and
        back with it when it is set back. Across a restart nothing is known of a jump: a clock
        set ahead before the owner starts is taken as it is (its charges count after it is fixed).
        A host suspended keeps its monotonic clock still: after it resumes the window starts
        earlier (counts more), never later.
        """
        clock = float(self._clock())
        if self._monotonic is None:
            return clock
        tick = float(self._monotonic())
        if self._reference is None:
            self._reference = (clock, tick)
            return clock
        wall, then = self._reference
        expected = wall + (tick - then)
        self._reference = (min(clock, expected), tick)
        if clock <= expected + CLOCK_JUMP_SLACK:
            self._clock_ahead = False
            return min(clock, expected)
        if not self._clock_ahead:
            logger.warning(
                "ledger %s: the clock (%s) jumped %.0f s ahead of the time this process has "
                "measured since (%s): the rolling window is counted from the measured time, so "
                "that the charges before the jump still count. Fix this host's clock (NTP); "
                "after a restart the jump is no longer known",
                self._path,
                datetime.fromtimestamp(clock, UTC).isoformat(timespec="seconds"),
                clock - expected,
                datetime.fromtimestamp(expected, UTC).isoformat(timespec="seconds"),
            )
            self._clock_ahead = True
        return expected

    def _insert(self, request: _Request, now: float) -> int:
        """Insert and chain one charge (inside the caller's write transaction); its id."""
        row_id, values, digest = _append_entry(self._conn, request, now)
        self._pending.append(((row_id, *values), digest))
        return row_id

    # ------------------------------------------------------------------ public API
    def check(
        self,
        *,
        session: str,
        consumer: str,
        curator: str,
        mechanism: str,
        epsilon: float,
        delta: float,
        points: int,
    ) -> None:
        """Decide as :meth:`charge` would, and write nothing (e.g. before a session starts).

        Parameters and raised errors are those of :meth:`charge`. A later :meth:`charge` may
        still be refused: other sessions may spend in between.
        """
        request = self._request(session, consumer, curator, mechanism, epsilon, delta, points)
        with self._lock, _unavailable_when_busy(self._path), snapshot(self._conn):
            self._now()  # warns while the clock is behind
            self._refuse(request)

    def charge(
        self,
        *,
        session: str,
        consumer: str,
        curator: str,
        mechanism: str,
        epsilon: float,
        delta: float,
        points: int,
        record: Callable[[sqlite3.Connection, int], None] | None = None,
    ) -> LedgerEntry:
        """Charge one release to the ledger, durably, or refuse it; release only after this.

        Parameters
        ----------
        session : str
            Session id (1 to :data:`MAX_NAME_LENGTH` characters), the unit of the per-session
            limits.
        consumer, curator : str
            Who the release is for and who asked (certificate names), for the record.
        mechanism : str
            What is released, e.g. ``"h1 embedding (Laplace)"`` or ``"raw points"``.
        epsilon : float
            Epsilon of the release, finite and >= 0; ``math.inf`` for a non-private release
            (refused unless ``policy.allow_non_private``).
        delta : float
            Delta of the release, in [0, 1).
        points : int
            Raw points the release contains, >= 0.
        record : callable, optional
            ``record(connection, charge_id)``, run inside the charge's transaction after its
            insert: writes what must become durable exactly when the charge does (a published
            sketch, :mod:`dpmarket.owner.sketches`). An exception from it rolls the charge back.

        Returns
        -------
        LedgerEntry
            The stored charge. It is committed (``synchronous=FULL``: on disk) when this
            returns.

        Raises
        ------
        LedgerRollbackError
            If the ledger was found behind a receipt its owner signed and its operator has not
            resolved it (:meth:`check_receipt`); the message is :data:`ROLLBACK_MESSAGE`.
            Nothing is written.
        OwnerBudgetError
            If the release is non-private and the policy does not allow it, or it would make
            the session's epsilon, delta or points exceed the per-session limits, or the
            window's exceed the budgets. The message names each such limit with what is
            spent, what this step asks and what is left, e.g. ``"owner budget exceeded:
            epsilon over the lifetime: spent 9.5 of 10, this step asks 1, 0.5 left"``.
            Nothing is written.
        InvalidArgumentError
            (a ``ValueError``) If an argument is out of range or of the wrong type. Nothing is
            written.
        UnavailableError
            If another writer holds the ledger for longer than the busy timeout. Nothing is
            written.

        Notes
        -----
        The sums, the decision and the insert run in one ``BEGIN IMMEDIATE`` transaction, so
        concurrent charges (threads, processes) cannot together exceed a limit. A quantity a
        step does not ask for (0) is never the reason for a refusal. The charge is chained
        (:func:`dpmarket.owner.ledger_chain.append_chain`) in the same transaction: one indexed read
        and one SHA-256, whatever the ledger's length.
        """
        request = self._request(session, consumer, curator, mechanism, epsilon, delta, points)
        with self._lock, _unavailable_when_busy(self._path), self._writing():
            now = self._now()
            self._refuse(request)
            row_id = self._insert(request, now)
            if record is not None:
                record(self._conn, row_id)
        return LedgerEntry(
            id=row_id,
            at=now,
            session=request.session,
            consumer=request.consumer,
            curator=request.curator,
            mechanism=request.mechanism,
            epsilon=request.epsilon,
            delta=request.delta,
            points=request.points,
            non_private=request.non_private,
        )

    # ------------------------------------------------------------------ receipts
    def _lifetime_spent(self) -> _Spent:
        """Every charge's totals, as the owner wrote them (the table checked against them)."""
        self._guard.sync(self._conn)
        return _from_groups(self._guard.lifetime(self._conn))

    def _seal_key(self) -> bytes:
        return bytes(self._conn.execute("SELECT seal_key FROM ledger_identity").fetchone()[0])

    def receipt(self) -> privacy_pb2.LedgerReceipt | None:
        """A receipt of the ledger's state now, signed with the owner's certificate key.

        Returns
        -------
        LedgerReceipt or None
            The ledger's id, owner, last charge and chain head, the time, and its lifetime
            totals sealed under the ledger's own key (:func:`dpmarket.owner.receipts.seal_totals`);
            None when the ledger was opened without a signing key (plaintext owner,
            inspection). Cost: an indexed read, a sum over the running totals, one AES-GCM
            and one ECDSA signature.
        """
        if self._signer is None or self._identity.owner is None:
            return None
        with self._lock, snapshot(self._conn):
            sequence, digest = head(self._conn)
            spent = self._lifetime_spent()
            key = self._seal_key()
            signed_at = self._now()  # never before a charge it covers
        state = privacy_pb2.LedgerState(
            ledger_id=self._identity.ledger_id,
            owner=self._identity.owner,
            sequence=sequence,
            head=digest,
            signed_at=signed_at,
        )
        state.sealed_totals = seal_totals(
            key,
            SealedTotals(spent.epsilon, spent.delta, spent.points),
            ledger_id=state.ledger_id,
            sequence=sequence,
            head=digest,
            signed_at=state.signed_at,
        )
        return sign_receipt(self._signer, state)

    @property
    def certificate(self) -> bytes | None:
        """The owner's certificate (PEM) whose key signs :meth:`receipt`: the curator keeps it
        with the receipt and presents both (:meth:`check_receipt`). None without one."""
        return self._certificate if self._signer is not None else None

    def check_receipt(
        self,
        receipt: privacy_pb2.LedgerReceipt | None,
        *,
        curator: str,
        certificate: bytes | None = None,
    ) -> None:
        """Check a receipt a curator presents against this ledger, before a session or job opens
        (:meth:`_check_receipt`); once one passed, :meth:`close_receipt` signs receipts."""
        self._check_receipt(receipt, curator=curator, certificate=certificate)
        self._receipt_checked = True

    def close_receipt(self) -> privacy_pb2.LedgerReceipt | None:
        """The receipt a close (or a publication) returns to its curator: :meth:`receipt`, but
        None until a curator's held receipt passed :meth:`check_receipt` since this ledger was
        opened, and None while a rollback found is not resolved.

        A receipt a curator keeps replaces the one it held, which is the evidence of what this
        ledger had charged. Signed for a ledger whose chain was rewritten while the owner was
        stopped (every hash recomputed), and returned by a close that needs no open (a job
        refused at its open, a close of a job the owner no longer holds), it would replace the
        receipt that shows the rewrite, and the rewrite would pass from then on. After a passed
        check the chain extends what the curator's receipt covered.
        """
        if not self._receipt_checked:
            return None
        with self._lock, snapshot(self._conn):
            if self._open_rollbacks():
                return None
        return self.receipt()

    def _check_receipt(
        self,
        receipt: privacy_pb2.LedgerReceipt | None,
        *,
        curator: str,
        certificate: bytes | None = None,
    ) -> None:
        """Check a receipt a curator presents against this ledger, before a session or job opens.

        Parameters
        ----------
        receipt : LedgerReceipt or None
            The last receipt the curator holds from this owner (None or empty: it holds none).
        curator : str
            Its identity, for the owner's log and the rollback's record.
        certificate : bytes, optional
            The owner certificate (PEM) the curator keeps with the receipt (:attr:`certificate`
            when the owner returned it). Not evidence of anything: whoever holds the CA's key
            issues a certificate named like this owner. A receipt is *genuine* when its totals
            open under a sealing key this ledger holds (its own, or a replaced ledger's kept by
            restore), whoever signed it, and only a receipt of a ledger whose sealing key is not
            held here is judged by its signature (a key ``ledger_keys`` lists):
            :func:`~dpmarket.owner.ledger_resolutions.receipt_genuine`. No key is ever listed
            from a receipt.

        Raises
        ------
        LedgerRollbackError
            If a rollback found earlier is not resolved, or the receipt shows one now: it is
            signed by one of this ledger's keys and either names this ledger, which holds
            fewer charges than it covers or other charges up to it (its chain hash there
            differs), or names *another* ledger of this owner that this one was not recorded
            as replacing (the ledger was replaced by a new one, a downgraded copy, or one
            created anew: what that ledger charged is not counted here). It is recorded (every
            later charge is refused too) and logged on the owner's console with what its
            operator can do; the message is :data:`ROLLBACK_MESSAGE`.

        Notes
        -----
        A receipt naming another owner (or unreadable) is ignored (logged). One naming this
        owner that is not genuine (above) is recorded as *unverified* and refused like a
        rollback, until its operator dismisses it on record: a curator presenting forged
        receipts makes the owner wait for its operator, a denial of service a curator has
        anyway by not calling the owner; it cannot hide a rollback with one (a genuine receipt
        opens under the ledger's own key, which no edit of the keys' list changes).
        A receipt the ledger's chain resolves is accepted: one whose charge-back entry
        (:meth:`resolve_rollbacks`) charges what it shows lost, one of a ledger this one
        records replacing in an entry (``restore --replace-other-ledger``, ``resolve
        --accept-replaced-ledger``), or an unverified one a dismissal entry names
        (:func:`~dpmarket.owner.ledger_resolutions.receipt_resolved`). Nothing outside the
        chain (``ledger_rollbacks.resolved_at``, ``meta``) resolves a receipt.
        """
        if receipt is None or not (receipt.state or receipt.signature):
            with self._lock, _unavailable_when_busy(self._path), snapshot(self._conn):
                self._refuse_if_rolled_back()
            return
        found = None
        with self._lock, _unavailable_when_busy(self._path), transaction(self._conn):
            self._refuse_if_rolled_back()
            keys = self._keys()
            state = _unverified_state(receipt)
            if state is None or state.owner != self._identity.owner:
                logger.warning(
                    "%s presented a ledger receipt naming no ledger of this owner (%s): this "
                    "owner did not sign it for a ledger of its own; ignored",
                    curator,
                    "unreadable" if state is None else f"owner {state.owner!r}",
                )
                return
            blob = receipt.SerializeToString()
            # Genuine by its seal (or, for a ledger whose sealing key is not held here, by a
            # listed key's signature); a presented certificate is never trusted for it.
            verified = receipt_genuine(
                self._conn,
                blob,
                ledger_id=self._identity.ledger_id,
                key=self._seal_key(),
                keys=keys,
            )
            other = state.ledger_id != self._identity.ledger_id
            if receipt_resolved(
                self._conn,
                blob,
                ledger_id=self._identity.ledger_id,
                key=self._seal_key(),
                keys=keys,
                verified=verified,
            ):
                if other:
                    logger.info(
                        "%s presented a receipt of ledger %s, which this ledger replaced on its "
                        "operator's request: accepted",
                        curator,
                        state.ledger_id,
                    )
                return
            sequence, _ = head(self._conn)
            self._conn.execute(
                "INSERT INTO ledger_rollbacks (detected_at, curator, receipt, sequence, head, "
                "ledger_sequence, verified) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    float(self._clock()),
                    curator,
                    blob,
                    state.sequence,
                    bytes(state.head),
                    sequence,
                    int(verified),
                ),
            )
            found = (state.sequence, sequence)
        self._raise_rollback(curator, state, found, verified=verified, other=other)

    def _raise_rollback(
        self,
        curator: str,
        state: privacy_pb2.LedgerState,
        found: tuple[int, int],
        *,
        verified: bool,
        other: bool,
    ) -> NoReturn:
        """Log the rollback :meth:`check_receipt` just recorded, with what its operator can do,
        and refuse: ``found`` is ``(receipt's sequence, ledger's sequence)``, ``verified``
        whether a key of this ledger signed the receipt, ``other`` whether it names another
        ledger of this owner.

        Raises
        ------
        LedgerRollbackError
            Always, with :data:`ROLLBACK_MESSAGE`.
        """
        if not verified:
            logger.error(
                "%s presented a receipt naming this owner (ledger %s, up to charge %d) whose "
                "totals open under no sealing key ledger %s (%s) holds, and that no key it "
                "lists signed for a ledger whose key it does not hold; the ledger %s. This "
                "owner did not seal it, whatever certificate signed it: the curator presents a "
                "forged receipt, or this file is not the ledger that sealed it. The owner "
                "refuses every session and job until its operator restores the latest backup "
                "that verifies, or, if the receipt is forged, dismisses it on record: dpmarket "
                "owner ledger resolve --dismiss-unverified-receipts --data-dir %s "
                "(docs/howto-ledger.md)",
                curator,
                state.ledger_id,
                state.sequence,
                self._identity.ledger_id,
                self._path,
                f"holds {found[1]} charges",
                self._path.parent,
            )
            raise LedgerRollbackError(ROLLBACK_MESSAGE)
        if other:
            logger.error(
                "ledger %s (ledger %s) is not the ledger this owner signed a receipt of, "
                "presented by %s: ledger %s, up to charge %d. This ledger replaced it (created "
                "anew, or taken back to an earlier format and upgraded), and what that ledger "
                "charged is not counted here. The owner refuses every session and job until "
                "its operator restores that ledger's latest backup (dpmarket owner ledger "
                "restore --replace-other-ledger) or accepts the loss on record: dpmarket owner "
                "ledger resolve --accept-replaced-ledger --data-dir %s (docs/howto-ledger.md)",
                self._path,
                self._identity.ledger_id,
                curator,
                state.ledger_id,
                state.sequence,
                self._path.parent,
            )
            raise LedgerRollbackError(ROLLBACK_MESSAGE)
        logger.error(
            "ledger %s is behind a receipt this owner signed, presented by %s: the receipt "
            "covers %d charges, the ledger %s. It was restored from an older copy or lost "
            "charges; the owner refuses every session and job until its operator restores a "
            "newer copy or runs: dpmarket owner ledger resolve --data-dir %s "
            "(docs/howto-ledger.md)",
            self._path,
            curator,
            found[0],
            f"holds {found[1]}" if found[1] < found[0] else "holds other charges up to there",
            self._path.parent,
        )
        raise LedgerRollbackError(ROLLBACK_MESSAGE)

    def _keys(self) -> dict[str, bytes]:
        """The ledger's certificate keys: fingerprint -> DER public key."""
        return {
            str(f): bytes(k)
            for f, k in self._conn.execute("SELECT fingerprint, public_key FROM ledger_keys")
        }

    def rollbacks(self) -> list[tuple[int, float, str, int, int, float | None]]:
        """Every rollback found: ``(number, detected_at, curator, receipt's last charge,
        ledger's last charge then, resolved)``, oldest first. ``resolved`` is None while the
        chain does not resolve it (:mod:`dpmarket.owner.ledger_resolutions`), else when its
        operator resolved it (the detection's time when the ledger holds the receipt's state:
        a newer copy restored)."""
        with self._lock, snapshot(self._conn):
            found = set(self._open_rollbacks())
            rows = self._conn.execute(
                "SELECT id, detected_at, curator, sequence, ledger_sequence, resolved_at "
                "FROM ledger_rollbacks ORDER BY id"
            ).fetchall()
        return [
            (
                int(r[0]),
                float(r[1]),
                str(r[2]),
                int(r[3]),
                int(r[4]),
                None if int(r[0]) in found else float(r[1] if r[5] is None else r[5]),
            )
            for r in rows
        ]

    def resolve_rollbacks(
        self, *, accept_replaced_ledger: bool = False, dismiss_unverified: bool = False
    ) -> list[Resolution]:
        """Resolve every rollback found: charge what each receipt shows was lost, then serve.

        Every resolution is a chained entry of the ledger (a row of its charges, in its hash
        chain), and the owner decides from the chain alone whether a receipt is resolved
        (:func:`~dpmarket.owner.ledger_resolutions.receipt_resolved`): an edit of the file's
        unchained tables resolves nothing, and an edit or deletion of an entry breaks
        ``verify``.

        For each receipt the ledger was found behind, the charges it covers that this ledger
        does not hold are charged again as one entry (session ``ledger-rollback-<receipt's
        charge>-<its chain head>``), now: the receipt's sealed lifetime totals minus the totals
        of this ledger's charges up to the receipt's last charge that were made before the
        receipt was signed (:func:`~dpmarket.owner.ledger_resolutions.owed`, rounded up; an
        entry of zero when nothing is missing). The policy's limits do not apply: the charge
        records privacy already spent. The receipt is then accepted when presented again, and
        the ledger serves.

        A receipt of *another* ledger of this owner (this ledger replaced it) cannot be charged
        back: its totals are sealed under that ledger's key. It is resolved only with
        ``accept_replaced_ledger``, which records that ledger as replaced by this one (an entry
        charging nothing, :func:`record_superseded`): its receipts are accepted from then on,
        and what it charged is lost to the budget, on the operator's record.

        A receipt's genuineness is decided from its seal
        (:func:`~dpmarket.owner.ledger_resolutions.receipt_genuine`): one whose totals open
        under this ledger's own sealing key, which only this ledger and its copies hold
        (AES-GCM authenticates them, bound to the receipt's ledger, charge, chain head and
        signing time), is this ledger's own receipt and charged back as above, whoever signed
        it. One that is not genuine (*unverified*: forged, even if signed by a key the ledger
        lists) is resolved only with ``dismiss_unverified``, which records an entry dismissing
        it and charges nothing.

        Parameters
        ----------
        accept_replaced_ledger : bool, default False
            Resolve the receipts of other ledgers of this owner as above.
        dismiss_unverified : bool, default False
            Resolve unverified receipts whose totals do not open under this ledger's key
            (forged, or of another ledger), charging nothing, on the operator's record.

        Returns
        -------
        list of Resolution
            One per rollback resolved (empty when none was open).

        Raises
        ------
        ValueError
            If a receipt this ledger's key verifies has totals that cannot be read (not sealed
            by this ledger): restore a newer copy of the ledger instead; or a receipt is of
            another ledger of this owner and ``accept_replaced_ledger`` is false; or an
            unverified one's totals do not open and ``dismiss_unverified`` is false. Nothing is
            written then.

        Notes
        -----
        The charges common to the receipt and the ledger were all made before the receipt was
        signed, and those charged after a restore were made after it, so the difference is
        exactly what the lost charges spent when the ledger was restored from an older copy of
        itself (it is more, never less, if the ledger's clock went back or several receipts
        show the same loss). Charging it now, rather than at the lost charges' times, keeps it
        in a rolling window at least as long as they would have stayed.
        """
        out: list[Resolution] = []
        with self._lock, _unavailable_when_busy(self._path), self._writing():
            self._guard.sync(self._conn)
            now = self._now()
            key, keys = self._seal_key(), self._keys()
            found = set(open_rollbacks(self._conn))
            rows = self._conn.execute(
                "SELECT id, curator, receipt, ledger_sequence FROM ledger_rollbacks ORDER BY id"
            ).fetchall()
            for number, curator, blob, ledger_sequence in rows:
                blob = bytes(blob)
                if int(number) not in found or receipt_resolved(
                    self._conn, blob, ledger_id=self._identity.ledger_id, key=key, keys=keys
                ):
                    continue  # resolved already, or by an entry written for an earlier one
                state = parse_state(blob)
                verified = receipt_genuine(
                    self._conn, blob, ledger_id=self._identity.ledger_id, key=key, keys=keys
                )
                detection = (int(number), str(curator), state, int(ledger_sequence), now)
                if not verified:
                    out.append(
                        self._resolve_unverified(
                            *detection, key=key, receipt=blob, dismiss=dismiss_unverified
                        )
                    )
                elif state.ledger_id != self._identity.ledger_id:
                    out.append(self._resolve_replaced(*detection, accept=accept_replaced_ledger))
                else:
                    signed = listed_signature(blob, keys)
                    out.append(self._resolve_lost(*detection, key=key, signed=signed))
        self._rollback_cache = None
        return out

    def _resolve_replaced(
        self,
        number: int,
        curator: str,
        state: privacy_pb2.LedgerState,
        ledger_sequence: int,
        now: float,
        *,
        accept: bool,
    ) -> Resolution:
        """Resolve rollback ``number``, a receipt of another ledger of this owner, for
        :meth:`resolve_rollbacks` (inside its transaction): record that ledger as replaced, or
        raise ``ValueError`` unless ``accept``."""
        if not accept:
            raise ValueError(
                f"rollback {number}: {curator} presented a receipt of ledger "
                f"{state.ledger_id} of this owner (up to charge {state.sequence}), "
                f"not of this ledger {self._identity.ledger_id}: this ledger "
                "replaced it, and what it charged cannot be charged back here (its "
                "totals are sealed under its own key). If it is this owner's real "
                "ledger, restore its latest backup (dpmarket owner ledger restore "
                "--replace-other-ledger); if you replaced it knowingly, accept the "
                "loss on record: dpmarket owner ledger resolve "
                "--accept-replaced-ledger"
            )
        # Bounded at the receipt's charge, as restore's entry is: a receipt of a later charge
        # of that ledger (it served again, e.g. two disks swapped back and forth) is a new
        # rollback, not covered by this acceptance. When restore kept that ledger's sealing key,
        # what the receipt shows beyond the charges of it counted here is charged.
        due = beyond_replaced(self._conn, state)
        request = _Request(
            session=supersession_through_session(state.ledger_id, int(state.sequence)),
            consumer="operator",
            curator=curator,
            mechanism=(
                f"ledger {state.ledger_id} up to charge {state.sequence} replaced by this one "
                "(resolve --accept-replaced-ledger): "
                + (
                    "what it charged up to there is not counted"
                    if due is None
                    else "what its receipt shows beyond the charges of it counted here"
                )
            ),
            epsilon=0.0 if due is None else due.epsilon,
            delta=0.0 if due is None else due.delta,
            points=0 if due is None else due.points,
        )
        entry = self._insert(request, now)
        self._conn.execute(
            "UPDATE ledger_rollbacks SET resolved_at = ?, charge = ? WHERE id = ?",
            (now, entry, number),
        )
        return Resolution(
            rollback=int(number),
            curator=curator,
            receipt_sequence=int(state.sequence),
            ledger_sequence=int(ledger_sequence),
            epsilon=request.epsilon,
            delta=request.delta,
            points=request.points,
            charge=entry,
            replaced_ledger=state.ledger_id,
            counted_replaced=due is not None,
        )

    def _resolved_uncharged(
        self,
        number: int,
        state: privacy_pb2.LedgerState,
        ledger_sequence: int,
        now: float,
        entry: int,
        *,
        replaced_ledger: str | None = None,
        dismissed: bool = False,
    ) -> Resolution:
        """Note rollback ``number`` resolved at ``now`` by the chained entry ``entry``, which
        charges nothing (an operator's decision on record: a replaced ledger accepted, or an
        unverified receipt dismissed)."""
        row = self._conn.execute(
            "SELECT curator FROM ledger_rollbacks WHERE id = ?", (number,)
        ).fetchone()
        self._conn.execute(
            "UPDATE ledger_rollbacks SET resolved_at = ?, charge = ? WHERE id = ?",
            (now, entry, number),
        )
        return Resolution(
            rollback=int(number),
            curator=str(row[0]),
            receipt_sequence=int(state.sequence),
            ledger_sequence=int(ledger_sequence),
            epsilon=0.0,
            delta=0.0,
            points=0,
            charge=entry,
            replaced_ledger=replaced_ledger,
            dismissed=dismissed,
        )

    def _resolve_unverified(
        self,
        number: int,
        curator: str,
        state: privacy_pb2.LedgerState,
        ledger_sequence: int,
        now: float,
        *,
        key: bytes,
        receipt: bytes,
        dismiss: bool,
    ) -> Resolution:
        """Resolve rollback ``number``, a receipt that is not genuine (its totals open under
        no sealing key this ledger holds): dismiss it (``dismiss``) or raise ``ValueError``
        saying what to do."""
        if not dismiss:
            raise ValueError(
                f"rollback {number}: {curator} presented a receipt naming this owner (ledger "
                f"{state.ledger_id}, up to charge {state.sequence}) whose totals do not open "
                "under any sealing key this ledger holds (its own, or a replaced ledger's): this "
                "owner did not seal it, whatever certificate signed it; it was forged, or this "
                "ledger is not the one that sealed it. Restore this owner's latest "
                "backup that verifies (dpmarket owner ledger restore); if you are sure the "
                "receipt is forged, dismiss it on record: dpmarket owner ledger resolve "
                "--dismiss-unverified-receipts"
            )
        logger.warning(
            "rollback %d: unverified receipt from %s (ledger %s, charge %d) dismissed by the "
            "operator: nothing charged",
            number,
            curator,
            state.ledger_id,
            state.sequence,
        )
        request = _Request(
            session=dismissal_session(receipt),
            consumer="operator",
            curator=curator,
            mechanism=(
                f"unverified receipt (ledger {state.ledger_id}, up to charge {state.sequence}) "
                "dismissed (resolve --dismiss-unverified-receipts)"
            ),
            epsilon=0.0,
            delta=0.0,
            points=0,
        )
        entry = self._insert(request, now)
        return self._resolved_uncharged(number, state, ledger_sequence, now, entry, dismissed=True)

    def _resolve_lost(
        self,
        number: int,
        curator: str,
        state: privacy_pb2.LedgerState,
        ledger_sequence: int,
        now: float,
        *,
        key: bytes,
        signed: bool,
    ) -> Resolution:
        """Resolve rollback ``number``, a receipt of this ledger, for :meth:`resolve_rollbacks`
        (inside its transaction): charge again what it shows was lost, as the chained entry
        that resolves it (:func:`~dpmarket.owner.ledger_resolutions.rollback_session`; zero
        when nothing is missing)."""
        try:
            due = owed(self._conn, key, state, before=head(self._conn)[0] + 1, signed=signed)
        except ReceiptError as exc:  # genuine means its totals open: a ledger edited meanwhile
            raise ValueError(
                f"rollback {number}: the receipt {curator} presented for this ledger "
                f"{state.ledger_id}, up to charge {state.sequence}: {exc}. Nothing was written; "
                "run dpmarket owner ledger verify and restore the latest backup that verifies "
                "(dpmarket owner ledger restore)"
            ) from None
        charge_id = self._insert(
            _Request(
                session=rollback_session(state),
                consumer="operator",
                curator=str(curator),
                mechanism=(
                    f"charges lost in a rollback (receipt up to charge "
                    f"{state.sequence}, ledger at charge {ledger_sequence})"
                ),
                epsilon=due.epsilon,
                delta=due.delta,
                points=due.points,
            ),
            now,
        )
        self._conn.execute(
            "UPDATE ledger_rollbacks SET resolved_at = ?, charge = ? WHERE id = ?",
            (now, charge_id, number),
        )
        return Resolution(
            rollback=int(number),
            curator=str(curator),
            receipt_sequence=int(state.sequence),
            ledger_sequence=int(ledger_sequence),
            epsilon=due.epsilon,
            delta=due.delta,
            points=due.points,
            charge=charge_id,
        )

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query(connection)`` on one consistent snapshot of the owner's database (reads
        only: the tables other owner modules keep next to the charges, e.g. published sketches)."""
        with self._lock, _unavailable_when_busy(self._path), snapshot(self._conn):
            return query(self._conn)

    def write(self, statements: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``statements(connection)`` as one write transaction (``BEGIN IMMEDIATE``) on the
        owner's database; never on ``charges`` (only :meth:`charge` writes those)."""
        with self._lock, _unavailable_when_busy(self._path), transaction(self._conn):
            return statements(self._conn)

    def remaining(self) -> Remaining:
        """What is left of the window's budgets now.

        Returns
        -------
        Remaining
            ``epsilon_total - spent``, ``delta_total - spent``, ``points_total - spent``
            (clipped at 0) over the window, and the window's description. Per-session limits
            are not included: see :meth:`session_totals`.
        """
        spent = self.window_totals()
        p = self._policy
        return Remaining(
            epsilon=max(p.epsilon_total - spent.epsilon, 0.0),
            delta=max(p.delta_total - spent.delta, 0.0),
            points=max(p.points_total - spent.points, 0),
            window=p.window_description,
        )

    def window_totals(self) -> Totals:
        """What the charges of the current window have spent (every charge for a lifetime)."""
        with self._lock, snapshot(self._conn):
            return self._window_spent(self._window_end()).totals()

    def session_totals(self, session: str) -> Totals:
        """What ``session`` has spent over its whole life (zero for an unknown session)."""
        with self._lock, snapshot(self._conn):
            return self._session_spent(session).totals()

    def entries(self, *, session: str | None = None, limit: int | None = None) -> list[LedgerEntry]:
        """The recorded charges, oldest first.

        Parameters
        ----------
        session : str, optional
            Only this session's charges.
        limit : int, optional
            Only the last ``limit`` (>= 1) charges.

        Returns
        -------
        list of LedgerEntry

        Raises
        ------
        ValueError
            If ``limit`` is not an integer >= 1.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit}")
        where, params = ("session = ?", (session,)) if session is not None else ("1", ())
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM charges WHERE {where} ORDER BY id DESC LIMIT ?",
                (*params, -1 if limit is None else limit),
            ).fetchall()
        return [LedgerEntry.from_row(r) for r in reversed(rows)]

    def entry(self, charge_id: int) -> LedgerEntry:
        """The charge with this id.

        Raises
        ------
        KeyError
            If there is none.
        """
        with self._lock:
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM charges WHERE id = ?", (charge_id,)
            ).fetchone()
        if row is None:
            raise KeyError(f"no charge {charge_id} in {self._path}")
        return LedgerEntry.from_row(row)

    def close(self) -> None:
        """Close the database (idempotent). Every charge made is already on disk."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> OwnerLedger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
