"""The owner's own durable privacy ledger: charge, then release.

An owner trusts neither the curator nor the consumer (DESIGN.md, parties and trust), so it keeps its
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
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral, Real
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.database import open_database, snapshot, transaction

__all__ = [
    "APPLICATION",
    "DAY",
    "LEDGER_FILE",
    "MAX_NAME_LENGTH",
    "MIGRATIONS",
    "RELATIVE_SLACK",
    "LedgerEntry",
    "OwnerBudgetError",
    "OwnerLedger",
    "Remaining",
    "Totals",
    "ledger_path",
]

#: The ``meta.application`` of an owner's database.
APPLICATION = "dpmarket-owner"
#: File name of the ledger inside the owner's data directory.
LEDGER_FILE = "owner.sqlite3"
#: Schema migrations of the owner's database (append only; see :mod:`dpmarket.runtime.database`).
MIGRATIONS: tuple[str, ...] = (
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
)

#: Relative slack of the epsilon and delta comparisons (absorbs the rounding of decimal values).
RELATIVE_SLACK = 1e-12
#: Seconds in a day: the running totals' unit of time (UTC days since the epoch).
DAY = 86_400.0
#: Longest session, consumer, curator or mechanism name accepted, in characters.
MAX_NAME_LENGTH = 256

T = TypeVar("T")

_COLUMNS = "id, at, session, consumer, curator, mechanism, epsilon, delta, points, non_private"


def ledger_path(data_dir: str | os.PathLike[str]) -> Path:
    """The ledger file of the owner whose data directory is ``data_dir``."""
    return Path(data_dir) / LEDGER_FILE


class OwnerBudgetError(FailedPreconditionError):
    """A step the owner's policy refuses: it would exceed a budget or a session limit.

    A :class:`~dpmarket.common.errors.FailedPreconditionError`, so the service answers
    ``FAILED_PRECONDITION``; the message names each limit the step would exceed, what is spent,
    what the step asks and what is left. Nothing was charged.
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


class OwnerLedger:
    """One owner's durable ledger, enforcing its :class:`~dpmarket.owner.policy.OwnerPolicy`.

    Parameters
    ----------
    data_dir : str or path-like
        The owner's data directory; the ledger is ``data_dir / "owner.sqlite3"`` (created, with
        the directory, if absent).
    policy : OwnerPolicy or None
        The policy in force. It is recorded in the ledger (a new ``policies`` row when its
        text differs from the last one recorded), so the ledger can be read later without the
        policy file. ``None``: use the last recorded policy and record nothing (inspection).
    clock : callable returning float
        Unix time in seconds; the time of each charge and the end of the rolling window.

    Raises
    ------
    FileNotFoundError
        If ``policy`` is ``None`` and ``data_dir`` holds no ledger (nothing is created then).
    ValueError
        If the file belongs to another application, or ``policy`` is ``None`` and the ledger
        records no policy.
    RuntimeError
        If the file was written by a newer dpmarket (see
        :func:`dpmarket.runtime.database.open_database`).

    Notes
    -----
    Every method may be called from any thread: one lock serialises this object's use of its
    connection. Several ``OwnerLedger`` objects, in this process or others, may open the same
    data directory: each check-and-insert runs in one ``BEGIN IMMEDIATE`` transaction, so SQLite
    serialises them and the budgets hold across all of them.

    The budgets of the window count every charge made less than ``policy.window_days`` before
    now (all charges for a lifetime budget); the session limits count every charge of the
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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = ledger_path(data_dir)
        if policy is None and not self._path.exists():
            raise FileNotFoundError(f"no owner ledger at {self._path}")
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = open_database(self._path, MIGRATIONS, application=APPLICATION)
        try:
            self._policy = self._record_policy(policy)
        except BaseException:
            self._conn.close()
            raise

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

    # ------------------------------------------------------------------ properties
    @property
    def policy(self) -> OwnerPolicy:
        """The policy in force (given, or the last recorded)."""
        return self._policy

    @property
    def path(self) -> Path:
        """The ledger's database file."""
        return self._path

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
        """Totals of the charges made after ``now - window`` (all of them for a lifetime): the
        running totals of every UTC day wholly inside the window, and the charges of the part
        of a day at its start, found by their time index."""
        seconds = self._policy.window_seconds
        first_day = 1 if math.isinf(seconds) else max(1, math.floor((now - seconds) / DAY) + 1)
        whole_days = self._conn.execute(
            "SELECT epsilon, delta, non_private, SUM(charges), SUM(points) FROM charge_totals "
            "WHERE day >= ? GROUP BY epsilon, delta, non_private",
            (first_day,),
        ).fetchall()
        # Days >= 1 hold exactly the charges made at or after first_day * DAY (CAST truncates,
        # and those times are positive); the rest of the window is scanned.
        start = -math.inf if math.isinf(seconds) else now - seconds
        part = self._conn.execute(
            "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
            "WHERE at > ? AND at < ? GROUP BY epsilon, delta, non_private",
            (start, first_day * DAY),
        ).fetchall()
        return _from_groups(whole_days + part)

    def _session_spent(self, session: str) -> _Spent:
        return self._spent("session = ?", (session,))

    # ------------------------------------------------------------------ decision
    def _refusals(self, request: _Request, now: float) -> list[str]:
        """Every limit ``request`` would exceed, as phrases; empty when it is allowed."""
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

    def _refuse(self, request: _Request, now: float) -> None:
        refusals = self._refusals(request, now)
        if refusals:
            raise OwnerBudgetError("owner budget exceeded: " + "; ".join(refusals))

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
            self._refuse(request, float(self._clock()))

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
        step does not ask for (0) is never the reason for a refusal.
        """
        request = self._request(session, consumer, curator, mechanism, epsilon, delta, points)
        with self._lock, _unavailable_when_busy(self._path), transaction(self._conn):
            now = float(self._clock())
            self._refuse(request, now)
            cursor = self._conn.execute(
                "INSERT INTO charges (at, session, consumer, curator, mechanism, epsilon, delta, "
                "points, non_private) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    request.session,
                    request.consumer,
                    request.curator,
                    request.mechanism,
                    request.epsilon,
                    request.delta,
                    request.points,
                    int(request.non_private),
                ),
            )
            row_id = cursor.lastrowid
            assert row_id is not None
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
            return self._window_spent(float(self._clock())).totals()

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
