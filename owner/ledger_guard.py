"""What an owner holds in memory so that editing its ledger's tables cannot lower its budget.

The owner decides a budget from the running totals of its ledger (table ``charge_totals``, one
row per UTC day and ``(epsilon, delta, non_private)``: :mod:`dpmarket.owner.ledger`), a cache
derived from the charges that no hash binds. Deleting or lowering its rows (one SQL statement,
with the owner running) would give the budget back. :class:`ChainGuard` keeps what those rows
must hold, and the chain's head, in the owner's memory:

* When the ledger is opened, it checks the whole ledger once (:func:`load`): the hash chain of
  every charge (:func:`~dpmarket.owner.ledger_chain.verify_ledger`, without SQLite's page-level
  check) and the running totals against the sums of the charges. A ledger that fails is refused:
  the owner does not start. Cost: one pass over every charge (a SHA-256 each) and one grouped
  scan, O(history), once per start (``bench/ledger.py`` measures it).
* At every charge and every budget read (:meth:`ChainGuard.sync`, :meth:`ChainGuard.window`), it
  checks that the chain's head is the one the owner last wrote or read, catches up with charges
  another process appended (each checked against its chain hash, then added), and compares what
  the decision reads, the running totals of the window's days summed per ``(epsilon, delta,
  non_private)`` and the charges of the window's first, partial day, with its own sums, which it
  decides from. Cost: one indexed read of the head, the grouped sum SQLite computed before, the
  owner's sum over the window's days (kept for a lifetime) and one day of charges: independent
  of the history (``bench.ledger``: a check after 100,000 charges as fast as one after a few).
* Any difference is final for this process: the ledger was changed outside the owner, which
  then refuses every charge (:class:`LedgerTamperedError`, ``FAILED_PRECONDITION``, a fixed
  message) and logs what it found and what its operator does: stop it, run ``dpmarket owner
  ledger verify`` and restore the latest backup that verifies.

What it does not see: charges removed from the end of the ledger *with* their chain rows and the
totals adjusted while the owner is stopped (the chain stays whole); the receipts the owner signs
for its curators catch that (:mod:`dpmarket.owner.receipts`). A session's own limits are read from
the session's charges, which the database refuses to change and the start check covers.
"""

from __future__ import annotations

import bisect
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.owner.ledger_chain import (
    CHAINED_COLUMNS,
    TotalsKey,
    TotalsValue,
    charge_hash,
    charge_value_problem,
    hash_at,
    head,
    recomputed_totals,
    verify_ledger,
)

__all__ = ["TAMPERED_MESSAGE", "ChainGuard", "LedgerCheckError", "LedgerTamperedError"]

logger = logging.getLogger(__name__)

#: Seconds in a UTC day (the running totals' unit of time).
_DAY = 86_400.0

#: What the owner answers, and every charge raises, once its ledger was found changed outside
#: it: fixed, with no budget figure.
TAMPERED_MESSAGE = (
    "this owner's ledger was changed outside the owner (its running totals or charges no longer "
    "match what the owner wrote): the owner serves nothing until its operator checks it with "
    "dpmarket owner ledger verify and restores it from a backup"
)


class LedgerTamperedError(FailedPreconditionError):
    """The ledger's tables no longer match what the serving owner wrote and read (running totals
    lowered or deleted, charges removed or rewritten, the chain's head moved back). Every charge
    is refused from then on in this process; the message is :data:`TAMPERED_MESSAGE`."""


class LedgerCheckError(ValueError):
    """The ledger fails the owner's check when it is opened (its hash chain or its running
    totals do not match its charges): the owner does not start on it. The message lists what
    was found and says what to do."""


# Groups of one day: (epsilon, delta, non_private) -> (charges, points).
_Groups = dict[tuple[float, float, int], TotalsValue]


class ChainGuard:
    """The chain's head and the running totals, as the owner wrote and read them.

    Create it with :meth:`load`. Methods are called with the ledger's connection inside one of
    its transactions (the owner's lock held); none of them writes.

    Attributes
    ----------
    sequence : int
        The chain's last charge the owner knows (0: none).
    head : bytes
        The chain hash there, 32 bytes.
    """

    def __init__(
        self, path: Path, sequence: int, head: bytes, totals: dict[TotalsKey, TotalsValue]
    ) -> None:
        self._path = path
        self.sequence = sequence
        self.head = head
        self._days: dict[int, _Groups] = {}
        self._all: _Groups = {}  # every day's groups summed (a lifetime window)
        for (day, epsilon, delta, non_private), value in totals.items():
            key = (epsilon, delta, non_private)
            self._days.setdefault(day, {})[key] = value
            charges, points = self._all.get(key, (0, 0))
            self._all[key] = (charges + value[0], points + value[1])
        self._order = sorted(self._days)
        self._broken: str | None = None

    @classmethod
    def load(
        cls,
        conn: sqlite3.Connection,
        path: Path,
        *,
        expected_tables: Iterable[str],
        expected_triggers: Iterable[str] = (),
    ) -> ChainGuard:
        """Check the whole ledger and keep its head and totals (call inside a snapshot).

        Raises
        ------
        LedgerCheckError
            If a charge does not match its chain hash, a charge has no chain row (or the
            reverse), a trigger of ``expected_triggers`` was dropped, the identity is missing,
            or a running-totals row differs from the sums of the charges; the message names the
            first problems and what to do.

        Notes
        -----
        O(history): one SHA-256 per charge and one grouped scan of the charges.
        """
        found = verify_ledger(
            conn,
            expected_tables=expected_tables,
            expected_triggers=expected_triggers,
            sqlite_check=False,
        )
        if found.problems:
            shown = "; ".join(p.what for p in found.problems[:3])
            more = len(found.problems) - 3
            raise LedgerCheckError(
                f"{path} does not match what its owner wrote: {shown}"
                + (f" (and {more} more)" if more > 0 else "")
                + ". It was changed outside the owner, which does not start on it. Run dpmarket "
                f"owner ledger verify --data-dir {path.parent} and restore the latest backup that "
                f"verifies: dpmarket owner ledger restore --data-dir {path.parent} --from BACKUP "
                "(docs/howto-ledger.md)"
            )
        return cls(path, found.sequence, found.head, recomputed_totals(conn))

    # ------------------------------------------------------------------ failure
    def _fail(self, detail: str) -> NoReturn:
        if self._broken is None:
            self._broken = detail
            logger.error(
                "ledger %s was changed outside the owner: %s. The owner refuses every charge "
                "from now on. Stop it, run dpmarket owner ledger verify --data-dir %s and restore "
                "the latest backup that verifies (docs/howto-ledger.md)",
                self._path,
                detail,
                self._path.parent,
            )
        raise LedgerTamperedError(TAMPERED_MESSAGE)

    # ------------------------------------------------------------------ updates
    def _add(self, at: float, epsilon: float, delta: float, points: int, non_private: int) -> None:
        day = int(float(at) / _DAY)  # SQLite's CAST(at / 86400 AS INTEGER): toward zero
        groups = self._days.get(day)
        if groups is None:
            groups = self._days[day] = {}
            bisect.insort(self._order, day)
        key = (float(epsilon), float(delta), int(non_private))
        for table in (groups, self._all):
            charges, total = table.get(key, (0, 0))
            table[key] = (charges + 1, total + int(points))

    def advance(self, row: tuple[Any, ...], digest: bytes) -> None:
        """Take in a charge this owner committed: its :data:`CHAINED_COLUMNS` row and hash."""
        self._add(row[1], row[6], row[7], row[8], row[9])
        self.sequence, self.head = int(row[0]), digest

    def sync(self, conn: sqlite3.Connection) -> None:
        """Check the chain's head; take in charges other processes appended since.

        Raises
        ------
        LedgerTamperedError
            If a change was found now or before: the head is behind the one the owner knows,
            or its hash there differs, or an appended charge does not match its chain hash.
        """
        if self._broken is not None:
            raise LedgerTamperedError(TAMPERED_MESSAGE)
        sequence, digest = head(conn)
        if sequence == self.sequence and digest == self.head:
            return
        if sequence < self.sequence or hash_at(conn, self.sequence) != self.head:
            self._fail(
                f"its chain's head is at charge {sequence}, but the owner last wrote or read "
                f"charge {self.sequence} with another hash: charges were removed or rewritten"
            )
        columns = ", ".join("c." + c.strip() for c in CHAINED_COLUMNS.split(","))
        previous, last = self.head, self.sequence
        rows = conn.execute(
            f"SELECT {columns}, k.hash FROM charges c LEFT JOIN charge_chain k "
            "ON k.charge = c.id WHERE c.id > ? ORDER BY c.id",
            (self.sequence,),
        ).fetchall()
        for *row, stored in rows:
            if stored is None or charge_hash(previous, tuple(row)) != bytes(stored):
                self._fail(f"charge {row[0]}, appended since, does not match its chain hash")
            value_problem = charge_value_problem(row)
            if value_problem is not None:
                self._fail(f"{value_problem} (appended since)")
            previous, last = bytes(stored), int(row[0])
            self._add(row[1], row[6], row[7], row[8], row[9])
        if last != sequence:
            self._fail(f"the chain's head is at charge {sequence}, its charges end at {last}")
        self.sequence, self.head = last, previous

    # ------------------------------------------------------------------ reads
    def window(
        self, conn: sqlite3.Connection, first_day: int
    ) -> list[tuple[float, float, int, int, int]]:
        """The sums, per ``(epsilon, delta, non_private)``, of the days from ``first_day`` on,
        once ``charge_totals`` is found to hold the same sums: ``(epsilon, delta, non_private,
        charges, points)`` each, what the budget decision reads.

        Raises
        ------
        LedgerTamperedError
            If the running-totals rows of those days sum to anything else (rows deleted,
            lowered, added or moved out of the window).

        Notes
        -----
        SQLite sums the rows of the window's days; the owner sums its own over the same days
        (over none for a lifetime: it keeps that sum). Rows edited so that these sums stay the
        same change no decision (the start check and ``verify`` still find them).
        """
        stored = {
            (float(r[0]), float(r[1]), int(r[2])): (int(r[3]), int(r[4]))
            for r in conn.execute(
                "SELECT epsilon, delta, non_private, SUM(charges), SUM(points) FROM charge_totals "
                "WHERE day >= ? GROUP BY epsilon, delta, non_private",
                (first_day,),
            )
        }
        if not self._order or first_day <= self._order[0]:
            expected = self._all
        else:
            expected = {}
            for day in self._order[bisect.bisect_left(self._order, first_day) :]:
                for key, (charges, points) in self._days[day].items():
                    c, p = expected.get(key, (0, 0))
                    expected[key] = (c + charges, p + points)
        expected = {k: v for k, v in expected.items() if v[0]}
        if stored != expected:
            wrong = sorted(set(stored.items()) ^ set(expected.items()))[0][0]
            self._fail(
                f"its running totals from day {first_day} on (epsilon {wrong[0]:g}, delta "
                f"{wrong[1]:g}) sum to (charges, points) {stored.get(wrong, (0, 0))}, the owner "
                f"wrote {expected.get(wrong, (0, 0))}"
            )
        return [(e, d, n, c, p) for (e, d, n), (c, p) in expected.items()]

    def lifetime(self, conn: sqlite3.Connection) -> list[tuple[float, float, int, int, int]]:
        """:meth:`window` over every day (what a receipt seals)."""
        return self.window(conn, -(2**62))

    def check_day(self, conn: sqlite3.Connection, day: int) -> None:
        """Check the charges of UTC day ``day`` (>= 1) against the owner's sums (the part of a
        window's first day is read from them).

        Raises
        ------
        LedgerTamperedError
            If a charge of that day was removed, added or changed.
        """
        if day < 1:
            return
        found = {
            (float(r[0]), float(r[1]), int(r[2])): (int(r[3]), int(r[4]))
            for r in conn.execute(
                "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
                "WHERE at >= ? AND at < ? AND CAST(at / 86400 AS INTEGER) = ? "
                "GROUP BY epsilon, delta, non_private",
                (day * _DAY, (day + 1) * _DAY, day),
            )
        }
        if found != self._days.get(day, {}):
            self._fail(f"the charges of day {day} are not those the owner wrote and read")
