"""Attacks on an owner's ledger file by someone with disk access, and the defence switched off.

The attacks are the red team's of issue 25 (round three), as SQL on the file: delete or lower the
running totals, remove the last charges with their chain rows, take the file back to the
previous release's schema. :class:`NoGuard` is the owner's in-memory guard
(:class:`dpmarket.owner.ledger_guard.ChainGuard`) switched off: it reads the running totals as
the owner did before it, checking nothing; monkeypatch it in for a control.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from dpmarket.owner.ledger import ledger_path
from dpmarket.owner.ledger_chain import CHAINED_COLUMNS, charge_hash, head
from dpmarket.owner.ledger_guard import ChainGuard

REBUILD_TOTALS = (
    "INSERT INTO charge_totals SELECT CAST(at / 86400 AS INTEGER), epsilon, delta, non_private, "
    "COUNT(*), SUM(points) FROM charges GROUP BY 1, 2, 3, 4"
)


def delete_totals(data_dir: Path) -> None:
    """``DELETE FROM charge_totals``: the red team's one statement (repro_totals.sh)."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        conn.execute("DELETE FROM charge_totals")


def lower_totals(data_dir: Path) -> None:
    """Every running-totals row set to hold nothing."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        conn.execute("UPDATE charge_totals SET charges = 0, points = 0")


@contextmanager
def without_triggers(conn: sqlite3.Connection, *names: str) -> Iterator[None]:
    """Drop the triggers ``names`` for the edits of the ``with`` block, then create them again
    as they were: the thorough attacker, who leaves no trigger missing for ``verify`` to see."""
    saved = [
        conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (n,)
        ).fetchone()[0]
        for n in names
    ]
    for name in names:
        conn.execute(f"DROP TRIGGER {name}")
    yield
    for sql in saved:
        conn.execute(sql)


def drop_last_charge(data_dir: Path) -> None:
    """Remove the last charge with its chain row (and its stored sketch, when it was a
    publication's) and rebuild the totals: the chain stays whole, as in an older copy."""
    with (
        closing(sqlite3.connect(ledger_path(data_dir))) as conn,
        conn,
        without_triggers(conn, "charges_no_delete", "charge_chain_no_delete"),
    ):
        (last,) = conn.execute("SELECT MAX(id) FROM charges").fetchone()
        conn.execute(
            "DELETE FROM sketch_deliveries WHERE sketch IN "
            "(SELECT id FROM sketches WHERE charge = ?)",
            (last,),
        )
        conn.execute("DELETE FROM sketches WHERE charge = ?", (last,))
        conn.execute("DELETE FROM charge_chain WHERE charge = ?", (last,))
        conn.execute("DELETE FROM charges WHERE id = ?", (last,))
        conn.execute("DELETE FROM charge_totals")
        conn.execute(REBUILD_TOTALS)


def append_negative_charge(data_dir: Path, epsilon: float = -5.0, points: int = -9) -> None:
    """Append a charge of negative epsilon and points with a valid chain hash, the table's CHECK
    constraints switched off for the connection (``PRAGMA ignore_check_constraints``): the
    stranger's a4_negative_charge.py."""
    with closing(sqlite3.connect(ledger_path(data_dir), isolation_level=None)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("BEGIN IMMEDIATE")
        sequence, previous = head(conn)
        conn.execute(
            f"INSERT INTO charges ({CHAINED_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, 0)",
            (sequence + 1, 1.0, "maintenance-1", "operator", "operator", "ledger maintenance",
             epsilon, points),
        )  # fmt: skip
        row = conn.execute(
            f"SELECT {CHAINED_COLUMNS} FROM charges WHERE id = ?", (sequence + 1,)
        ).fetchone()
        conn.execute(
            "INSERT INTO charge_chain (charge, hash) VALUES (?, ?)",
            (sequence + 1, charge_hash(previous, row)),
        )
        conn.execute("COMMIT")


def downgrade(data_dir: Path, keep: int = 1) -> None:
    """A schema-3 ledger (before the chain): identity, chain, keys, rollbacks and the later
    market tables dropped with their triggers, every charge after ``keep`` deleted, totals
    rebuilt (the red team's t12_downgrade.py)."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as c:
        for trigger in (
            "charges_no_update",
            "charges_no_delete",
            "charge_chain_no_update",
            "charge_chain_no_delete",
            "ledger_identity_fixed",
            "ledger_identity_bound_once",
            "ledger_identity_no_delete",
            "earnings_no_update",
            "earnings_no_delete",
        ):
            c.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for table in (
            "charge_chain",
            "ledger_rollbacks",
            "ledger_keys",
            "ledger_identity",
            "session_market",
            "earnings",
            "replaced_ledgers",
            "opened_ids",
        ):
            c.execute(f"DROP TABLE IF EXISTS {table}")
        c.execute(
            "DELETE FROM sketch_deliveries WHERE sketch IN (SELECT id FROM sketches "
            "WHERE charge > ?)",
            (keep,),
        )
        c.execute("DELETE FROM sketches WHERE charge > ?", (keep,))
        c.execute("DELETE FROM charges WHERE id > ?", (keep,))
        c.execute("DELETE FROM charge_totals")
        c.execute(REBUILD_TOTALS)
        c.execute(
            "CREATE TRIGGER charges_no_update BEFORE UPDATE ON charges BEGIN "
            "SELECT RAISE(ABORT, 'charges are append-only'); END"
        )
        c.execute(
            "CREATE TRIGGER charges_no_delete BEFORE DELETE ON charges BEGIN "
            "SELECT RAISE(ABORT, 'charges are append-only'); END"
        )
        c.execute("PRAGMA user_version = 3")
        c.commit()


def raw_charges(data_dir: Path) -> list[tuple[str, float, int]]:
    """``(session, epsilon, points)`` of every charge, read without opening the ledger (which
    refuses a tampered file)."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        rows = conn.execute("SELECT session, epsilon, points FROM charges ORDER BY id")
        return [(str(s), float(e), int(p)) for s, e, p in rows]


class NoGuard(ChainGuard):
    """The defence off: the running totals are read as found, nothing is compared."""

    @classmethod
    def load(cls, conn: sqlite3.Connection, path: Path, **_: object) -> NoGuard:
        sequence, digest = head(conn)
        return cls(path, sequence, digest, {})

    def sync(self, conn: sqlite3.Connection) -> None:
        return None

    def window(
        self, conn: sqlite3.Connection, first_day: int
    ) -> list[tuple[float, float, int, int, int]]:
        return [
            (float(e), float(d), int(n), int(c), int(p))
            for e, d, n, c, p in conn.execute(
                "SELECT epsilon, delta, non_private, charges, points FROM charge_totals "
                "WHERE day >= ?",
                (first_day,),
            )
        ]

    def check_day(self, conn: sqlite3.Connection, day: int) -> None:
        return None


def mark_rollbacks_resolved(data_dir: Path, at: float = 2e9) -> int:
    """``UPDATE ledger_rollbacks SET resolved_at = ...``: the red team's l2_mark_resolved.sh (the
    owner stopped). Returns the rows marked."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        return conn.execute("UPDATE ledger_rollbacks SET resolved_at = ?", (at,)).rowcount


def write_superseded_row(data_dir: Path, ledger_id: str) -> None:
    """One ``meta`` row ``superseded ledger <id>``, as the release before schema 7 recorded an
    accepted replacement: the red team's l4_meta_superseded.sh."""
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            (f"superseded ledger {ledger_id}", '{"how": "restore --replace-other-ledger"}'),
        )


def append_entry(data_dir: Path, session: str, points: int, at: float = 2e9) -> None:
    """Append a charge with its chain hash (the chain is keyless: anyone with the file and the
    code can), e.g. a charge-back of less than a receipt shows lost."""
    from dpmarket.owner.ledger_chain import append_chain

    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        cursor = conn.execute(
            "INSERT INTO charges (at, session, consumer, curator, mechanism, epsilon, delta, "
            "points, non_private) VALUES (?, ?, 'operator', 'operator', 'edit', 0, 0, ?, 0)",
            (at, session, points),
        )
        assert cursor.lastrowid is not None
        append_chain(conn, cursor.lastrowid)


def old_rule_resolved(
    conn: sqlite3.Connection,
    receipt: bytes,
    *,
    ledger_id: str,
    key: bytes,
    keys: object,
    verified: object = None,
) -> bool:
    """The rule before schema 7, the defence off: a receipt is resolved when the ledger holds
    its state, a detection of it is *marked* resolved (``ledger_rollbacks.resolved_at``) or a
    ``meta`` row says its ledger was superseded."""
    from dpmarket.owner.ledger_chain import hash_at
    from dpmarket.owner.ledger_resolutions import parse_state

    state = parse_state(receipt)
    if state.ledger_id != ledger_id:
        found = conn.execute(
            "SELECT 1 FROM meta WHERE key = ?", (f"superseded ledger {state.ledger_id}",)
        ).fetchone()
        return found is not None
    if hash_at(conn, int(state.sequence)) == bytes(state.head):
        return True
    marked = conn.execute(
        "SELECT 1 FROM ledger_rollbacks WHERE sequence = ? AND head = ? "
        "AND resolved_at IS NOT NULL",
        (int(state.sequence), bytes(state.head)),
    ).fetchone()
    return marked is not None


def old_rule_open(conn: sqlite3.Connection, *, skip: object = ()) -> list[int]:
    """The rollbacks open before schema 7: those not *marked* resolved."""
    rows = conn.execute("SELECT id FROM ledger_rollbacks WHERE resolved_at IS NULL ORDER BY id")
    return [int(r[0]) for r in rows]


def before_schema_8(conn: sqlite3.Connection) -> None:
    """Take a ledger's schema-8 additions (``replaced_ledgers`` and its triggers) and later ones
    (schema 9's ``opened_ids``) back out, as a ledger of schema 7 or earlier has them: its
    migrations add them again."""
    conn.execute("DROP TABLE opened_ids")
    conn.execute("DROP TRIGGER replaced_ledgers_no_update")
    conn.execute("DROP TRIGGER replaced_ledgers_no_delete")
    conn.execute("DROP TABLE replaced_ledgers")
