"""The curator's durable state: sessions, their results and every privacy charge (SQLite).

One database per curator (``curator.sqlite3`` in its data directory,
:mod:`dpmarket.runtime.database`: WAL, ``synchronous=FULL``, versioned schema). What it keeps and
why:

* ``sessions``: who created each session (the consumer identity: only it may see the session),
  its idempotency key and request digest, its configuration, status (``running``, ``done``,
  ``failed``), error, final report (ledger included) and, until it expires, the summary itself.
* ``charges``: every charge of every session's ledger, written *before* the release it pays for,
  so a curator that crashes mid-session still knows what was spent. Charges are never deleted.
* ``owner_spend``: at which owners each session was opened (and under which owner-side id),
  and what each owner's ledger recorded for it, written as soon as the curator knows it (when
  it closes the session there), or why it does not.
* ``sketch_declarations``, ``sketch_specs``, ``sketches``: the sketch catalogue, kept by
  :class:`dpmarket.curator.sketches.SketchCatalog` on its own connection to the same file.
* ``owner_receipts``: the last ledger receipt each owner returned (at the close of a session or
  job), kept durably and presented when the next session or job with that owner opens, so that
  an owner whose ledger was restored from an older copy finds out (:mod:`dpmarket.owner.receipts`);
  with it the owner's certificate whose key signed it, presented with it.

Each table has its repository (:class:`SessionRecords`, :class:`ChargeRecords`,
:class:`OwnerSpendRecords`, :class:`SettlementRecords`, :class:`OwnerReceipts`) on one
:class:`StoreConnection`; :class:`CuratorStore` joins them with what spans several tables.

On start, :meth:`CuratorStore.recover` marks every session still ``running`` as failed ("the
curator restarted") and rebuilds its report from its charges and its owners' records (those not
yet known marked so; the restarted curator then asks the owners,
:meth:`CuratorStore.unrecorded_owner_sessions`); finished sessions' results survive until they
expire (:meth:`CuratorStore.expire` drops the summary, keeps the row and the charges).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.privacy.ledger import UNKNOWN_RESTARTED, Charge, SessionSpend
from dpmarket.common.summarization.methods import config_from_json
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import SessionReport, SummaryResult
from dpmarket.curator.settlement import SessionMarket, SignedSettlement
from dpmarket.runtime.database import open_database, open_read_only, snapshot, transaction
from dpmarket.v1 import privacy_pb2

APPLICATION = "dpmarket-curator"
DATABASE_FILE = "curator.sqlite3"
#: How the ``method`` of a CAPE job's row starts (``cape-mean``, ``cape-linear``...): a job that
#: keeps its result as a JSON document, delivers no summary point, and is closed at its owners
#: with CloseCapeJob.
CAPE_METHOD_PREFIX = "cape-"

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        consumer TEXT NOT NULL,
        request_id TEXT,
        request_digest TEXT NOT NULL,
        method TEXT NOT NULL,
        config_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
        error TEXT,
        created_at REAL NOT NULL,
        finished_at REAL,
        fetched_at REAL,
        expires_at REAL,
        report_json TEXT,
        result BLOB,
        UNIQUE (consumer, request_id)
    );
    CREATE INDEX sessions_by_consumer ON sessions (consumer, created_at);
    CREATE INDEX sessions_by_status ON sessions (status);
    CREATE TABLE charges (
        id INTEGER PRIMARY KEY,
        session TEXT NOT NULL REFERENCES sessions (id),
        at REAL NOT NULL,
        party TEXT NOT NULL,
        label TEXT NOT NULL,
        event_json TEXT NOT NULL
    );
    CREATE INDEX charges_by_session ON charges (session);
    """,
    # 1 -> 2: jobs of other protocols (CAPE) keep their result as a JSON document.
    """
    ALTER TABLE sessions ADD COLUMN document TEXT;
    """,
    # 2 -> 3: the sketch catalogue (dpmarket.curator.sketches): each declaration as first loaded,
    # the specs drawn from it (their parameters, drawn once, as SketchSpec messages) and the
    # sketches owners published under them (PrivateSketch messages), one per owner and spec.
    """
    CREATE TABLE sketch_declarations (
        name TEXT PRIMARY KEY,
        declaration_json TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE sketch_specs (
        name TEXT PRIMARY KEY,
        declaration TEXT NOT NULL REFERENCES sketch_declarations (name),
        position INTEGER NOT NULL,
        spec BLOB NOT NULL
    );
    CREATE TABLE sketches (
        id INTEGER PRIMARY KEY,
        spec TEXT NOT NULL REFERENCES sketch_specs (name),
        owner TEXT NOT NULL,
        published_at REAL NOT NULL,
        sketch BLOB NOT NULL,
        UNIQUE (spec, owner)
    );
    CREATE INDEX sketches_by_owner ON sketches (owner);
    """,
    # 3 -> 4: the last ledger receipt each owner signed for this curator (LedgerReceipt
    # messages, opaque here), presented when the next session or job with that owner opens.
    """
    CREATE TABLE owner_receipts (
        owner TEXT PRIMARY KEY,
        receipt BLOB NOT NULL,
        received_at REAL NOT NULL
    );
    """,
    # 4 -> 5: what each owner charged a session, as the owner's ledger recorded it (returned
    # when the curator closes the session there), written as soon as the curator knows it; a
    # row is made when the session opens (figures and reason NULL: not known yet), so that a
    # restarted curator knows at which owners, under which owner-side id, to ask for it.
    """
    CREATE TABLE owner_spend (
        session TEXT NOT NULL REFERENCES sessions (id),
        owner TEXT NOT NULL,
        owner_session TEXT NOT NULL,
        epsilon REAL,
        delta REAL,
        points INTEGER,
        non_private INTEGER,
        unknown TEXT,
        at REAL NOT NULL,
        PRIMARY KEY (session, owner)
    );
    """,
    # 5 -> 6: the market (dpmarket.curator.settlement). What a session's settlement depends on,
    # kept with the session when it opens; each settled session's signed statement (kept when
    # its result expires: a record of what is owed), and each owner's signed part with when the
    # owner recorded it (NULL: not yet delivered).
    """
    ALTER TABLE sessions ADD COLUMN market_json TEXT;
    ALTER TABLE sessions ADD COLUMN payout_json TEXT;
    CREATE TABLE statements (
        session TEXT PRIMARY KEY REFERENCES sessions (id),
        consumer TEXT NOT NULL,
        statement BLOB NOT NULL,
        signature BLOB NOT NULL,
        total INTEGER NOT NULL,
        settled_at REAL NOT NULL
    );
    CREATE INDEX statements_by_consumer ON statements (consumer, settled_at);
    CREATE TABLE statement_deliveries (
        session TEXT NOT NULL REFERENCES statements (session),
        owner TEXT NOT NULL,
        statement BLOB NOT NULL,
        signature BLOB NOT NULL,
        delivered_at REAL,
        PRIMARY KEY (session, owner)
    );
    """,
    # 6 -> 7: the owner certificate (PEM) kept with each owner's last receipt, presented with
    # it: the owner accepts a receipt its CA-issued certificate's key verifies as genuine even
    # when its ledger no longer lists that key (NULL: none kept, a receipt of an older curator).
    """
    ALTER TABLE owner_receipts ADD COLUMN certificate BLOB;
    """,
)

Status = Literal["running", "done", "failed"]


@dataclass(frozen=True)
class StoredStatement:
    """A settled session's statement as stored.

    Attributes
    ----------
    session : str
        The consumer's session id.
    settled_at : float
        Unix time, seconds.
    data, signature : bytes
        The statement's canonical bytes and the curator's signature.
    total : int
        What the consumer owes, micro-credits.
    owners_recorded : int
        How many owners have recorded their part.
    """

    session: str
    settled_at: float
    data: bytes
    signature: bytes
    total: int
    owners_recorded: int


class UnrecordedOwner(NamedTuple):
    """An owner whose record of a finished session or CAPE job the curator does not have.

    Attributes
    ----------
    session : str
        The consumer's session (or job) id.
    owner : str
    owner_session : str
        The id the owner knows it by.
    cape : bool
        Whether it is a CAPE job (closed with CloseCapeJob, else CloseSession).
    """

    session: str
    owner: str
    owner_session: str
    cape: bool


#: What a restarted curator writes into the sessions it found running.
RESTART_ERROR = "the curator restarted while the session was running"


@dataclass(frozen=True)
class StoredSession:
    """A session row.

    Attributes
    ----------
    id, consumer : str
        Session id and the identity (``"consumer:NAME"``) of the consumer that created it.
    request_id : str or None
        Its idempotency key.
    request_digest : str
        Digest of the request (a retry must match it).
    status : {"running", "done", "failed"}
    error : str or None
    created_at, finished_at, fetched_at, expires_at : float or None
        Unix times, seconds.
    report : SessionReport or None
        The final report (done or failed).
    has_result : bool
        Whether the summary is still stored (not expired).
    """

    id: str
    consumer: str
    request_id: str | None
    request_digest: str
    status: Status
    error: str | None
    created_at: float
    finished_at: float | None
    fetched_at: float | None
    expires_at: float | None
    report: SessionReport | None
    has_result: bool


def report_to_json(report: SessionReport) -> str:
    """A SessionReport as JSON (:meth:`SessionReport.to_json`; infinities as JSON
    ``Infinity``)."""
    return json.dumps(report.to_json(), sort_keys=True)


def report_from_json(text: str) -> SessionReport:
    """The inverse of :func:`report_to_json`."""
    return SessionReport.from_json(json.loads(text))


def _result_to_blob(result: SummaryResult) -> bytes:
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {
        "points": result.points,
        "owner_ids": np.asarray(result.owner_ids, dtype=np.str_),
    }
    if result.labels is not None:
        arrays["labels"] = result.labels
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _result_from_blob(blob: bytes, report: SessionReport) -> SummaryResult:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        labels = data["labels"] if "labels" in data.files else None
        return SummaryResult(
            points=np.asarray(data["points"], dtype=np.float64),
            labels=None if labels is None else np.asarray(labels, dtype=np.int64),
            owner_ids=tuple(str(o) for o in data["owner_ids"]),
            report=report,
        )


class StoreConnection:
    """The curator's SQLite database (``curator.sqlite3``), on which its tables' repositories
    share one connection.

    Parameters
    ----------
    data_dir : path
        Directory of ``curator.sqlite3`` (created if needed).
    clock : callable
        Unix time in seconds (injected by tests).

    Raises
    ------
    ValueError
        If the directory holds another service's database.
    RuntimeError
        If the database was written by a newer dpmarket.

    Notes
    -----
    One connection, guarded by a lock: the session manager calls the store from the event
    loop and from worker threads (charges made while a CPU-heavy step runs off the loop).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, clock: Callable[[], float] = time.time):
        self.path = Path(data_dir) / DATABASE_FILE
        self._conn = open_database(self.path, MIGRATIONS, application=APPLICATION)
        self._lock = threading.Lock()
        self._clock = clock

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class SessionRecords(StoreConnection):
    """The ``sessions`` table: who created each session or job, under which idempotency key,
    its status, its report and its result (a summary, or a JSON document for another
    protocol's job) until it expires."""

    def create(
        self,
        session_id: str,
        *,
        consumer: str,
        request_id: str | None,
        request_digest: str,
        method: str,
        config: dict[str, Any],
        market: SessionMarket | None = None,
    ) -> None:
        """Record a new running session (with what its settlement depends on, if quoted).

        Raises
        ------
        sqlite3.IntegrityError
            If the id, or the consumer's request id, is taken.
        """
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "INSERT INTO sessions (id, consumer, request_id, request_digest, method, "
                "config_json, status, created_at, market_json) "
                "VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    session_id,
                    consumer,
                    request_id,
                    request_digest,
                    method,
                    json.dumps(config, sort_keys=True),
                    self._clock(),
                    None if market is None else json.dumps(market.to_json(), sort_keys=True),
                ),
            )

    def fail(self, session_id: str, error: str, report: SessionReport, *, ttl: float) -> None:
        """Mark a session failed, with why and what it spent; the row expires like a result."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "UPDATE sessions SET status = 'failed', error = ?, finished_at = ?, "
                "expires_at = ?, report_json = ? WHERE id = ?",
                (error, now, now + ttl, report_to_json(report), session_id),
            )

    def finish_document(
        self,
        session_id: str,
        document: dict[str, Any],
        *,
        ttl: float,
        settlement: SignedSettlement | None = None,
    ) -> None:
        """Mark a job of another protocol done, with its result as a JSON document (kept until
        ``ttl`` seconds from now, like a summary), and store its settlement in the same
        transaction (none stored when the job has one already)."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            if settlement is not None:
                _settle_once(conn, session_id, settlement, now)
            conn.execute(
                "UPDATE sessions SET status = 'done', finished_at = ?, expires_at = ?, "
                "document = ? WHERE id = ?",
                (now, now + ttl, json.dumps(document, sort_keys=True), session_id),
            )

    def fail_document(
        self,
        session_id: str,
        error: str,
        document: dict[str, Any],
        *,
        ttl: float,
        settlement: SignedSettlement | None = None,
    ) -> None:
        """Mark a job of another protocol failed, with why and what it spent (a JSON document),
        and store its settlement in the same transaction (as :meth:`finish_document`)."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            if settlement is not None:
                _settle_once(conn, session_id, settlement, now)
            conn.execute(
                "UPDATE sessions SET status = 'failed', error = ?, finished_at = ?, "
                "expires_at = ?, document = ? WHERE id = ?",
                (error, now, now + ttl, json.dumps(document, sort_keys=True), session_id),
            )

    def forget_request(self, session_id: str) -> None:
        """Free a session's idempotency key (the row, its status and charges stay): a request
        refused before any release leaves no answer under its key, so a retry runs afresh."""
        with self._lock, transaction(self._conn) as conn:
            conn.execute("UPDATE sessions SET request_id = NULL WHERE id = ?", (session_id,))

    def failure(self, session_id: str) -> tuple[str, dict[str, Any] | None] | None:
        """A failed job's error and JSON document (None once expired), or None if the row is
        not failed."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT error, document FROM sessions WHERE id = ? AND status = 'failed'",
                (session_id,),
            ).fetchone()
        if row is None:
            return None
        return str(row[0] or ""), None if row[1] is None else json.loads(row[1])

    def document(self, session_id: str) -> dict[str, Any] | None:
        """A done job's JSON document, or None (not done, expired, or a summary session)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT document FROM sessions WHERE id = ? AND status = 'done'", (session_id,)
            ).fetchone()
        if row is None or row[0] is None:
            return None
        document: dict[str, Any] = json.loads(row[0])
        return document

    def mark_fetched(self, session_id: str, *, ttl: float) -> None:
        """Record that the consumer fetched the result; it now expires within ``ttl`` seconds."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "UPDATE sessions SET fetched_at = COALESCE(fetched_at, ?), "
                "expires_at = MIN(COALESCE(expires_at, ?), ?) WHERE id = ?",
                (now, now + ttl, now + ttl, session_id),
            )

    def expire(self) -> int:
        """Drop the summaries (and reports) of sessions past their expiry; keep rows and charges.

        Returns
        -------
        int
            How many sessions expired now.
        """
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            cursor = conn.execute(
                "UPDATE sessions SET result = NULL, report_json = NULL, document = NULL "
                "WHERE expires_at IS NOT NULL AND expires_at <= ? "
                "AND (result IS NOT NULL OR report_json IS NOT NULL OR document IS NOT NULL)",
                (now,),
            )
            return int(cursor.rowcount)

    def get(self, session_id: str) -> StoredSession | None:
        """A session row, or None."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT id, consumer, request_id, request_digest, status, error, created_at, "
                "finished_at, fetched_at, expires_at, report_json, result IS NOT NULL "
                "FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
        return None if row is None else self._row(row)

    def find_request(self, consumer: str, request_id: str) -> StoredSession | None:
        """The session a consumer created with an idempotency key, or None."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT id FROM sessions WHERE consumer = ? AND request_id = ?",
                (consumer, request_id),
            ).fetchone()
        return None if row is None else self.get(row[0])

    def result(self, session_id: str) -> SummaryResult | None:
        """A finished session's summary, or None (not done, or expired)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT result, report_json FROM sessions WHERE id = ? AND status = 'done'",
                (session_id,),
            ).fetchone()
        if row is None or row[0] is None or row[1] is None:
            return None
        return _result_from_blob(row[0], report_from_json(row[1]))

    def _method(self, session_id: str) -> str:
        """A session's method (a CAPE job's starts with :data:`CAPE_METHOD_PREFIX`); "" if
        unknown."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute("SELECT method FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return "" if row is None else str(row[0])

    def created_since(self, consumer: str, since: float) -> int:
        """How many sessions ``consumer`` created at or after ``since`` (Unix seconds)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM sessions WHERE consumer = ? AND created_at >= ?",
                (consumer, since),
            ).fetchone()
        return int(row[0])

    @staticmethod
    def _row(row: tuple[Any, ...]) -> StoredSession:
        return StoredSession(
            id=row[0],
            consumer=row[1],
            request_id=row[2],
            request_digest=row[3],
            status=row[4],
            error=row[5],
            created_at=row[6],
            finished_at=row[7],
            fetched_at=row[8],
            expires_at=row[9],
            report=None if row[10] is None else report_from_json(row[10]),
            has_result=bool(row[11]),
        )


class ChargeRecords(StoreConnection):
    """The ``charges`` table: every charge of every session's ledger, written before the
    release it pays for; never deleted."""

    def record_charges(
        self, session_id: str, charges: Sequence[Charge], *, market: SessionMarket | None = None
    ) -> None:
        """Write charges durably (committed before this returns: charge, then release).

        With ``market``, what the session's settlement depends on is kept with them, in the same
        transaction, when it has none yet: a CAPE job is settled once it charged (and only
        then), whenever the curator stops.
        """
        now = self._clock()
        rows = [
            (session_id, now, c.party, c.label, json.dumps(dataclasses.asdict(c.event)))
            for c in charges
        ]
        with self._lock, transaction(self._conn) as conn:
            conn.executemany(
                "INSERT INTO charges (session, at, party, label, event_json) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            if market is not None:
                conn.execute(
                    "UPDATE sessions SET market_json = COALESCE(market_json, ?) WHERE id = ?",
                    (json.dumps(market.to_json(), sort_keys=True), session_id),
                )

    def charges(self, session_id: str) -> list[Charge]:
        """Every charge of a session, in the order written."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT party, label, event_json FROM charges WHERE session = ? ORDER BY id",
                (session_id,),
            ).fetchall()
        return [
            Charge(party, label, PrivacyEvent(**json.loads(event))) for party, label, event in rows
        ]


class OwnerSpendRecords(StoreConnection):
    """The ``owner_spend`` table: at which owners each session was opened (under which
    owner-side id) and what each owner's ledger recorded for it, or why it is not known."""

    def owners_opened(self, session_id: str, owner_session: str, owners: Sequence[str]) -> None:
        """Record that the session is open at ``owners`` under ``owner_session`` (what they
        will charge it is not known yet)."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO owner_spend (session, owner, owner_session, at) "
                "VALUES (?, ?, ?, ?)",
                [(session_id, owner, owner_session, now) for owner in owners],
            )

    def record_owner_spend(self, session_id: str, owner: str, spend: SessionSpend) -> None:
        """Write what ``owner``'s ledger recorded for the session (or why it is unknown),
        durably, as soon as the curator knows it; a row the session did not open first is
        ignored (nothing to record it against)."""
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "UPDATE owner_spend SET epsilon = ?, delta = ?, points = ?, non_private = ?, "
                "unknown = ?, at = ? WHERE session = ? AND owner = ?",
                (
                    spend.epsilon,
                    spend.delta,
                    spend.points,
                    int(spend.non_private),
                    spend.unknown,
                    self._clock(),
                    session_id,
                    owner,
                ),
            )

    def owner_spend(self, session_id: str) -> dict[str, SessionSpend | None]:
        """What each owner the session was opened at recorded for it, by owner: its spend
        (``unknown`` set when the curator has no record), or None while not known yet."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT owner, epsilon, delta, points, non_private, unknown FROM owner_spend "
                "WHERE session = ? ORDER BY owner",
                (session_id,),
            ).fetchall()
        out: dict[str, SessionSpend | None] = {}
        for owner, epsilon, delta, points, non_private, unknown in rows:
            if unknown is None:
                out[owner] = None
            elif unknown:
                out[owner] = SessionSpend.unknown_because(unknown)
            else:
                out[owner] = SessionSpend(epsilon, delta, int(points), bool(non_private))
        return out

    def unrecorded_owner_sessions(self) -> list[UnrecordedOwner]:
        """Every owner whose record of a finished session or CAPE job is unknown (a restart
        interrupted it, :meth:`recover`, or the owner could not be reached when it closed): what
        the curator asks the owners for, at a restart and in the background, until it has every
        record its settlement needs."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT o.session, o.owner, o.owner_session, s.method FROM owner_spend o "
                "JOIN sessions s ON s.id = o.session "
                "WHERE o.unknown IS NOT NULL AND o.unknown != '' AND s.status != 'running' "
                "ORDER BY o.session, o.owner"
            ).fetchall()
        return [
            UnrecordedOwner(str(a), str(b), str(c), str(m).startswith(CAPE_METHOD_PREFIX))
            for a, b, c, m in rows
        ]


class SettlementRecords(StoreConnection):
    """The ``statements`` and ``statement_deliveries`` tables (each session's signed statement,
    and each owner's part until its owner recorded it), with what a settlement reads of the
    ``sessions`` table: its market terms and its payout release."""

    @staticmethod
    def _insert_settlement(
        conn: sqlite3.Connection, session_id: str, settlement: SignedSettlement, now: float
    ) -> None:
        statement = settlement.statement
        conn.execute(
            "INSERT INTO statements (session, consumer, statement, signature, total, settled_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                session_id,
                statement.header.consumer,
                settlement.data,
                settlement.signature,
                statement.total,
                now,
            ),
        )
        conn.executemany(
            "INSERT INTO statement_deliveries (session, owner, statement, signature) "
            "VALUES (?, ?, ?, ?)",
            [(session_id, o, data, sig) for o, (data, sig) in sorted(settlement.owners.items())],
        )

    def record_settlement(self, session_id: str, settlement: SignedSettlement) -> bool:
        """Store a session's settlement (one per session, durably).

        Returns
        -------
        bool
            False if the session was settled already (nothing changed).
        """
        with self._lock, transaction(self._conn) as conn:
            return _settle_once(conn, session_id, settlement, self._clock())

    def market(self, session_id: str) -> SessionMarket | None:
        """What the session's settlement depends on (None: it was not quoted)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT market_json FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        if row is None or row[0] is None:
            return None
        return SessionMarket.from_json(json.loads(row[0]))

    def payout(self, session_id: str) -> dict[str, Any] | None:
        """A done session's stored payout release (None: none)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT payout_json FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        if row is None or row[0] is None:
            return None
        payout: dict[str, Any] = json.loads(row[0])
        return payout

    def unsettled(self) -> list[str]:
        """Finished (done or failed) quoted sessions, and CAPE jobs that charged, without a
        statement, oldest first."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT id FROM sessions WHERE market_json IS NOT NULL AND status != 'running' "
                "AND id NOT IN (SELECT session FROM statements) ORDER BY created_at"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def undelivered(self) -> list[tuple[str, str, bytes, bytes]]:
        """``(session, owner, statement, signature)`` of every owner's part not yet recorded by
        its owner, oldest statement first."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT d.session, d.owner, d.statement, d.signature FROM statement_deliveries d "
                "JOIN statements s ON s.session = d.session WHERE d.delivered_at IS NULL "
                "ORDER BY s.settled_at, d.owner"
            ).fetchall()
        return [(str(a), str(b), bytes(c), bytes(d)) for a, b, c, d in rows]

    def mark_delivered(self, session_id: str, owner: str) -> None:
        """Record that ``owner`` recorded its part of the session's statement."""
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "UPDATE statement_deliveries SET delivered_at = COALESCE(delivered_at, ?) "
                "WHERE session = ? AND owner = ?",
                (self._clock(), session_id, owner),
            )

    def statements(
        self, consumer: str, *, session_id: str | None = None, limit: int | None = None
    ) -> list[StoredStatement]:
        """The consumer's statements, newest first (only ``session_id``'s, if given)."""
        where, params = "WHERE s.consumer = ?", [consumer]
        if session_id is not None:
            where += " AND s.session = ?"
            params.append(session_id)
        sql = (
            "SELECT s.session, s.settled_at, s.statement, s.signature, s.total, "
            "(SELECT COUNT(*) FROM statement_deliveries d WHERE d.session = s.session "
            "AND d.delivered_at IS NOT NULL) FROM statements s "
            f"{where} ORDER BY s.settled_at DESC, s.session"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(sql, params).fetchall()
        return [
            StoredStatement(str(a), float(b), bytes(c), bytes(d), int(e), int(f))
            for a, b, c, d, e, f in rows
        ]

    def statement_total(self, session_id: str) -> int | None:
        """The settled cost of a session, micro-credits (None: not settled)."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT total FROM statements WHERE session = ?", (session_id,)
            ).fetchone()
        return None if row is None else int(row[0])


def _settle_once(
    conn: sqlite3.Connection, session_id: str, settlement: SignedSettlement, now: float
) -> bool:
    """Insert a session's settlement within the caller's transaction unless it has one; whether
    it was inserted."""
    row = conn.execute("SELECT 1 FROM statements WHERE session = ?", (session_id,)).fetchone()
    if row is not None:
        return False
    SettlementRecords._insert_settlement(conn, session_id, settlement, now)
    return True


class OwnerReceipts(StoreConnection):
    """The ``owner_receipts`` table: the last ledger receipt each owner returned (a
    :class:`dpmarket.curator.owners.ReceiptBook`)."""

    def record_owner_receipt(
        self,
        owner: str,
        receipt: bytes,
        *,
        only_later: bool = False,
        certificate: bytes | None = None,
    ) -> None:
        """Keep ``receipt`` (a serialized LedgerReceipt) as the last one ``owner`` returned,
        durably (committed before this returns), replacing the one held before, with
        ``certificate`` (PEM, the owner's certificate that signed it; None: none).

        With ``only_later`` (a receipt the owner sent unasked, with a publication, before it
        was shown the one held here), it replaces the held receipt only when that one names the
        same ledger at an earlier charge: a ledger restored from an older copy could otherwise
        overwrite the receipt that reveals the rollback with one of its own. A receipt of
        another ledger is kept only from a session's open or close, which the owner answers
        after checking the held receipt.
        """
        with self._lock, transaction(self._conn) as conn:
            if only_later:
                row = conn.execute(
                    "SELECT receipt FROM owner_receipts WHERE owner = ?", (owner,)
                ).fetchone()
                if row is not None and not _later_receipt(bytes(row[0]), receipt):
                    return
            conn.execute(
                "INSERT INTO owner_receipts (owner, receipt, received_at, certificate) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET receipt = "
                "excluded.receipt, received_at = excluded.received_at, "
                "certificate = excluded.certificate",
                (owner, receipt, self._clock(), certificate or None),
            )

    def owner_receipt(self, owner: str) -> bytes | None:
        """The last ledger receipt ``owner`` returned (serialized LedgerReceipt), or None."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT receipt FROM owner_receipts WHERE owner = ?", (owner,)
            ).fetchone()
        return None if row is None else bytes(row[0])

    def owner_receipt_and_certificate(self, owner: str) -> tuple[bytes, bytes | None] | None:
        """``owner``'s last receipt and the certificate (PEM) kept with it (None: none), read
        together, or None."""
        with self._lock, snapshot(self._conn) as conn:
            row = conn.execute(
                "SELECT receipt, certificate FROM owner_receipts WHERE owner = ?", (owner,)
            ).fetchone()
        if row is None:
            return None
        return bytes(row[0]), None if row[1] is None else bytes(row[1])


def _later_receipt(held: bytes, new: bytes) -> bool:
    """Whether serialized receipt ``new`` names the ledger ``held`` names at a later charge
    (both read without their signatures, which only the owner can check: a false claim can
    only keep this curator's receipt newer, which the owner then refuses as a rollback)."""
    state = privacy_pb2.LedgerState
    try:
        before = state.FromString(privacy_pb2.LedgerReceipt.FromString(held).state)
        after = state.FromString(privacy_pb2.LedgerReceipt.FromString(new).state)
    except DecodeError:
        return False
    return bool(before.ledger_id) and (
        after.ledger_id == before.ledger_id and after.sequence > before.sequence
    )


class CuratorStore(
    SessionRecords, ChargeRecords, OwnerSpendRecords, SettlementRecords, OwnerReceipts
):
    """The curator's durable state: its tables' repositories on one connection
    (:class:`StoreConnection`, whose parameters it takes), and what spans several tables —
    a session's finish with its settlement in one transaction, a restart's recovery, a
    report refreshed from the owners' records, the points a settlement pays for."""

    def refresh_owner_spend(self, session_id: str) -> None:
        """Rewrite a finished session's stored report with the owners' records as they stand
        (after a restarted curator got them) and its settled cost; an expired report stays
        expired."""
        stored = self.get(session_id)
        if stored is None:
            return
        spend = {o: s for o, s in self.owner_spend(session_id).items() if s is not None}
        cost = self.statement_total(session_id)
        if stored.report is None:
            self._refresh_document(session_id, spend, cost)
            return
        report = dataclasses.replace(
            stored.report,
            owner_spend=spend,
            owner_points_accessed=max(stored.report.owner_points_accessed, _points_released(spend)),
            cost=cost,
        )
        with self._lock, transaction(self._conn) as conn:
            conn.execute(
                "UPDATE sessions SET report_json = ? WHERE id = ? AND report_json IS NOT NULL",
                (report_to_json(report), session_id),
            )

    def _refresh_document(
        self, session_id: str, spend: dict[str, SessionSpend], cost: int | None
    ) -> None:
        """As :meth:`refresh_owner_spend`, for a CAPE job's document (its report's
        ``owner_spend`` and ``cost``)."""
        with self._lock, transaction(self._conn) as conn:
            row = conn.execute(
                "SELECT document FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None or row[0] is None:
                return
            document = json.loads(row[0])
            # A done job's document has a report (with its quote); a failed job's, its spend.
            report = document.get("report", document)
            report["owner_spend"] = {o: dataclasses.asdict(s) for o, s in sorted(spend.items())}
            if "quote" in report:
                report["cost"] = cost
            conn.execute(
                "UPDATE sessions SET document = ? WHERE id = ?",
                (json.dumps(document, sort_keys=True), session_id),
            )

    def finish(
        self,
        session_id: str,
        result: SummaryResult,
        *,
        ttl: float,
        settlement: SignedSettlement | None = None,
        payout: dict[str, Any] | None = None,
    ) -> None:
        """Mark a session done and store its summary until ``ttl`` seconds from now, and its
        settlement (statement and owners' parts) and payout release (what a later settlement
        needs of it: :func:`~dpmarket.common.market.terms.release_to_json`) in the same
        transaction."""
        now = self._clock()
        with self._lock, transaction(self._conn) as conn:
            if settlement is not None:
                self._insert_settlement(conn, session_id, settlement, now)
            if payout is not None:
                conn.execute(
                    "UPDATE sessions SET payout_json = ? WHERE id = ?",
                    (json.dumps(payout, sort_keys=True), session_id),
                )
            conn.execute(
                "UPDATE sessions SET status = 'done', finished_at = ?, expires_at = ?, "
                "report_json = ?, result = ? WHERE id = ?",
                (
                    now,
                    now + ttl,
                    report_to_json(result.report),
                    _result_to_blob(result),
                    session_id,
                ),
            )

    def delivered_points(self, session_id: str) -> dict[str, int] | None:
        """Points of each owner in a done session's summary (from its stored result or
        report); {} for a failed session or a CAPE job (which delivers no point); None when no
        longer known (expired)."""
        stored = self.get(session_id)
        if stored is None:
            return None
        if stored.status == "failed" or self._method(session_id).startswith(CAPE_METHOD_PREFIX):
            return {}
        result = self.result(session_id)
        if result is None:
            return None
        counts: dict[str, int] = {}
        for owner in result.owner_ids:
            counts[owner] = counts.get(owner, 0) + 1
        return counts

    def recover(self, *, ttl: float) -> list[str]:
        """Mark every running session failed (the curator restarted); keep its charges.

        Its report (rebuilt from its charges and its owners' records: those not known yet are marked
        :data:`~dpmarket.common.privacy.ledger.UNKNOWN_RESTARTED`, which the restarted curator asks
        the owners for) expires ``ttl`` seconds from now, like any finished session's; the charges
        stay.

        Returns
        -------
        list of str
            The ids of the sessions marked failed.
        """
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, method FROM sessions WHERE status = 'running'"
            ).fetchall()
        recovered = []
        for session_id, method in rows:
            # Owners whose record the session had not got yet: marked, to ask them for it.
            with self._lock, transaction(self._conn) as conn:
                conn.execute(
                    "UPDATE owner_spend SET unknown = ? WHERE session = ? AND unknown IS NULL",
                    (UNKNOWN_RESTARTED, session_id),
                )
            report = self._report_from_charges(session_id, method, RESTART_ERROR)
            self.fail(session_id, RESTART_ERROR, report, ttl=ttl)
            recovered.append(session_id)
        return recovered

    def _report_from_charges(self, session_id: str, method: str, error: str) -> SessionReport:
        from dpmarket.common.privacy.ledger import PrivacyLedger

        charges = self.charges(session_id)
        with self._lock, snapshot(self._conn) as conn:
            (config_json,) = conn.execute(
                "SELECT config_json FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        config = json.loads(config_json)
        if method.startswith(CAPE_METHOD_PREFIX):
            deltas = {"validation": config["delta"], "owners": config["delta"]}
        else:
            validation, owners = config_from_json(config).ledger_deltas()
            deltas = {"validation": validation, "owners": owners}
        reports = {}
        if charges:
            # As the session kept them: D_v's charges in one ledger, the rest in the owners'.
            for party, delta in deltas.items():
                book = PrivacyLedger(delta_tilde=delta)
                book.charge(
                    [c for c in charges if (c.party == "validation") == (party == "validation")]
                )
                reports[party] = book.report()
        ledger = SessionLedger(reports.get("validation"), reports.get("owners"))
        spend = {o: s for o, s in self.owner_spend(session_id).items() if s is not None}
        return SessionReport(
            method=method,  # type: ignore[arg-type]
            summary_size=0,
            rounds=0,
            owner_points_accessed=_points_released(spend),
            validation_points_accessed=0,
            all_owners_bound=0,
            paper_bound=0.0,
            dropped_owners=(),
            ledger=ledger,
            wall_time_seconds=0.0,
            error=error,
            owner_spend=spend,
        )


def _iso(at: float | None) -> str | None:
    """Unix time as ISO 8601 in UTC, to the second (None stays None)."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class CuratorRecords:
    """The curator's sessions, CAPE jobs and charges, read from its database without writing
    (``dpmarket curator sessions|charges``): usable while the curator runs or after it stopped.

    Parameters
    ----------
    data_dir : path
        The curator's data directory (``curator.sqlite3``).

    Raises
    ------
    FileNotFoundError
        If the directory holds no curator database.
    ValueError, RuntimeError, sqlite3.DatabaseError
        As :func:`dpmarket.runtime.database.open_read_only` (another service's file, another
        schema).
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / DATABASE_FILE
        if not self.path.is_file():
            raise FileNotFoundError(
                f"{data_dir} holds no curator database ({DATABASE_FILE} not found): is it the "
                "--data-dir of a curator that has served?"
            )
        self._conn = open_read_only(
            self.path, application=APPLICATION, schema_version=len(MIGRATIONS)
        )

    def close(self) -> None:
        """Close the database."""
        self._conn.close()

    def __enter__(self) -> CuratorRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _charges(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        rows = self._conn.execute(
            "SELECT id, session, at, party, label, event_json FROM charges "
            f"WHERE {where} ORDER BY id",
            params,
        ).fetchall()
        out = []
        for charge_id, session, at, party, label, event_json in rows:
            event = json.loads(event_json)
            out.append(
                {
                    "id": charge_id,
                    "session": session,
                    "at": at,
                    "time": _iso(at),
                    "party": party,
                    "label": label,
                    "mechanism": event["mechanism"],
                    "epsilon": event["epsilon"],
                    "delta": event.get("delta", 0.0),
                    "count": event["count"],
                    "epsilon_basic": event["epsilon"] * event["count"],
                    "delta_basic": event.get("delta", 0.0) * event["count"],
                }
            )
        return out

    def sessions(self, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Every session and CAPE job, oldest first (the last ``limit`` when given).

        Returns
        -------
        list of dict
            ``{"id", "kind" ("summarization" or "cape"), "consumer", "method", "status",
            "created", "finished" (ISO 8601 UTC or None), "error", "charges" (how many),
            "epsilon", "delta" (by party, basic composition of the charges: what the session
            stated it spent; with no owner charge of its own, "owners" is the most any owner's
            ledger recorded for it, 0 included, once every owner's record is known),
            "owner_points_accessed" (the points the owners released to it: from its report,
            or, once that expired, the sum of what the owners' ledgers recorded; None while an
            owner's record is not known, or for a session older than those records),
            "left_out" (owner -> reason), "result_kept" (bool)}``.
        """
        with snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT id, consumer, method, status, error, created_at, finished_at, "
                "report_json, result IS NOT NULL OR document IS NOT NULL FROM sessions "
                "ORDER BY created_at, id"
            ).fetchall()
            charges = self._charges("1", ())
            owner_rows = conn.execute(
                "SELECT session, epsilon, points, unknown FROM owner_spend"
            ).fetchall()
        recorded = _recorded_spend(owner_rows)
        if limit is not None:
            rows = rows[-limit:]
        spent: dict[str, dict[str, dict[str, float]]] = {}
        counts: dict[str, int] = {}
        for c in charges:
            party = "validation" if c["party"] == "validation" else "owners"
            book = spent.setdefault(c["session"], {"epsilon": {}, "delta": {}})
            book["epsilon"][party] = book["epsilon"].get(party, 0.0) + c["epsilon_basic"]
            book["delta"][party] = book["delta"].get(party, 0.0) + c["delta_basic"]
            counts[c["session"]] = counts.get(c["session"], 0) + 1
        out = []
        for sid, consumer, method, status, error, created, finished, report, kept in rows:
            data = json.loads(report) if report else {}
            book = spent.get(sid, {"epsilon": {}, "delta": {}})
            points = data.get("owner_points_accessed")
            if sid in recorded:  # every owner's ledger record is known
                most_epsilon, released = recorded[sid]
                points = released if points is None else points
                book["epsilon"].setdefault("owners", most_epsilon)
            out.append(
                {
                    "id": sid,
                    "kind": "cape" if method.startswith("cape") else "summarization",
                    "consumer": consumer,
                    "method": method,
                    "status": status,
                    "created": _iso(created),
                    "finished": _iso(finished),
                    "error": error or "",
                    "charges": counts.get(sid, 0),
                    "epsilon": book["epsilon"],
                    "delta": book["delta"],
                    "owner_points_accessed": points,
                    "left_out": data.get("left_out", {}),
                    "result_kept": bool(kept),
                }
            )
        return out

    def charges(self, *, session: str | None = None) -> list[dict[str, Any]]:
        """Every charge, oldest first; with ``session``, those of the sessions whose id starts
        with it (a short id as tables show it will do).

        Returns
        -------
        list of dict
            ``{"id", "session", "at" (Unix seconds), "time" (ISO 8601 UTC), "party", "label",
            "mechanism", "epsilon", "delta" (of one run), "count", "epsilon_basic",
            "delta_basic" (times count)}``.
        """
        with snapshot(self._conn):
            if session is None:
                return self._charges("1", ())
            return self._charges("session LIKE ? || '%' ESCAPE '\\'", (_like(session),))


def _like(prefix: str) -> str:
    """``prefix`` with LIKE's wildcards escaped."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _recorded_spend(rows: Sequence[tuple[Any, ...]]) -> dict[str, tuple[float, int]]:
    """By session whose every owner record is known (rows ``(session, epsilon, points,
    unknown)`` of ``owner_spend``): the most ε any owner's ledger recorded and the points all
    of them released. A session with a record still pending (``unknown`` NULL) or missing
    (``unknown`` set) is left out: what it read is not known."""
    known: dict[str, tuple[float, int]] = {}
    pending: set[str] = set()
    for session, epsilon, points, unknown in rows:
        if unknown is None or unknown:
            pending.add(session)
            continue
        most, total = known.get(session, (0.0, 0))
        known[session] = (max(most, float(epsilon or 0.0)), total + int(points or 0))
    return {s: v for s, v in known.items() if s not in pending}


def _points_released(spend: dict[str, SessionSpend]) -> int:
    """Raw points the owners' records say they released to a session (a record the curator does
    not have counts 0): a report rebuilt after a restart counts the points from these, as the
    session itself counted them while it ran."""
    return sum(s.points for s in spend.values() if not s.unknown)
