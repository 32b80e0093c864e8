"""Durable state of every service: one SQLite file per service, with versioned schemas.

:func:`open_database` opens (or creates) a service's database with settings chosen for
durability rather than speed, checks that it belongs to that service and brings its schema up to
date; :func:`transaction` runs a block as one write transaction that no other writer, in this
process or another, can interleave with.

Migrations
----------
A service describes its schema as a list of SQL scripts: ``migrations[i]`` takes the schema from
version ``i`` to version ``i + 1`` (``migrations[0]`` creates it from nothing). The version a file
is at is SQLite's ``PRAGMA user_version``, 0 in a new file. Opening runs the pending scripts in
order, each in its own transaction that also bumps ``user_version``, so a crash leaves the file at
a whole version and the next open resumes from there.

- To change a schema, *append* a script; never edit or remove one that has been released, since
  databases in the field are already past it and would never run the edited text.
- Versions are sequential; there are no branches and no down-migrations.
- A file at a version newer than the scripts this build knows was written by a newer dpmarket:
  it is refused (``RuntimeError``) rather than read with a schema that may have changed meaning.

Each database also holds a ``meta(key, value)`` table, created before any migration, whose
``application`` entry names the service that owns the file (e.g. ``"dpmarket-owner"``), so that
pointing one service at another's data directory fails loudly instead of silently adding tables.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["BUSY_TIMEOUT_MS", "open_database", "snapshot", "transaction"]

#: How long a statement waits for another writer's lock before failing, in milliseconds.
BUSY_TIMEOUT_MS = 5000


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block as one write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT``.

    ``BEGIN IMMEDIATE`` takes SQLite's write lock at once, so a read-check-then-insert inside
    the block cannot race with another writer, whether it uses another connection of this
    process or another process on the same file. The lock waits up to :data:`BUSY_TIMEOUT_MS`
    for other writers. On any exception the transaction is rolled back and the exception
    propagates; when the block ends normally, it is committed before the ``with`` statement
    returns.

    Parameters
    ----------
    conn : sqlite3.Connection
        A connection from :func:`open_database` (``isolation_level=None``: no implicit
        transactions), not already in a transaction.

    Yields
    ------
    sqlite3.Connection
        ``conn`` itself.

    Raises
    ------
    sqlite3.OperationalError
        If the write lock is not obtained within the busy timeout (``database is locked``), or
        the commit fails (nothing is committed then).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block's reads against one consistent snapshot: ``BEGIN`` ... ``COMMIT``.

    A deferred (read) transaction: it never waits for the write lock, and in WAL mode a writer
    committing meanwhile does not change what the block sees, so totals read in two queries
    agree with each other. Write with :func:`transaction` instead.

    Parameters
    ----------
    conn : sqlite3.Connection
        A connection from :func:`open_database`, not already in a transaction.

    Yields
    ------
    sqlite3.Connection
        ``conn`` itself.
    """
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _statements(script: str) -> Iterator[str]:
    """Split an SQL script into whole statements (semicolons in strings and triggers kept)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                yield pending
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise ValueError(f"migration script ends with an incomplete statement: {pending[:80]!r}")


def _check_application(conn: sqlite3.Connection, path: Path, application: str) -> None:
    """Create ``meta``, claim a new file for ``application``, refuse another application's."""
    with transaction(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        row = conn.execute("SELECT value FROM meta WHERE key = 'application'").fetchone()
        if row is not None:
            if row[0] != application:
                raise ValueError(
                    f"{path} belongs to application {row[0]!r}, not {application!r}: "
                    "point this service at its own data directory"
                )
            return
        others = conn.execute(
            "SELECT name FROM sqlite_master WHERE name != 'meta' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if others or version != 0:
            raise ValueError(
                f"{path} is an SQLite database without an application record (tables "
                f"{sorted(r[0] for r in others)}, schema {version}): not a database of "
                f"{application!r}; refusing to adopt it"
            )
        conn.execute("INSERT INTO meta (key, value) VALUES ('application', ?)", (application,))


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[str]) -> None:
    """Run the pending migrations, one transaction each; refuse a newer schema."""
    known = len(migrations)
    while True:
        # The version is read inside the write transaction, so two processes opening the same
        # new file cannot both run a migration: the second sees the version the first wrote.
        with transaction(conn):
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > known:
                raise RuntimeError(
                    f"{path} was written by a newer dpmarket: schema {version}, this build "
                    f"knows {known}; upgrade dpmarket (downgrades are not supported)"
                )
            if version == known:
                return
            for statement in _statements(migrations[version]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")


def open_database(
    path: str | os.PathLike[str], migrations: Sequence[str], *, application: str
) -> sqlite3.Connection:
    """Open or create a service's SQLite database and bring its schema up to date.

    Creates the parent directory; connects with ``isolation_level=None`` (every transaction is
    explicit: use :func:`transaction`) and ``check_same_thread=False``; sets
    ``journal_mode=WAL`` (readers never block the writer), ``synchronous=FULL`` (a committed
    transaction survives power loss, not only a process crash), ``foreign_keys=ON`` and
    ``busy_timeout`` = :data:`BUSY_TIMEOUT_MS`; checks the ``application`` record; runs the
    pending ``migrations`` (see the module docstring).

    Parameters
    ----------
    path : str or path-like
        The database file, e.g. ``data_dir / "owner.sqlite3"``. SQLite keeps ``-wal`` and
        ``-shm`` files beside it.
    migrations : sequence of str
        ``migrations[i]`` is the SQL script from schema version ``i`` to ``i + 1``. A script
        must not contain ``BEGIN``/``COMMIT``: each runs inside its own transaction.
    application : str
        Name of the owning service, e.g. ``"dpmarket-owner"``; stored in ``meta`` by the first
        open and compared on every later one.

    Returns
    -------
    sqlite3.Connection
        Open, at schema version ``len(migrations)``. The caller closes it.

    Raises
    ------
    ValueError
        If ``application`` is empty, the file belongs to another application (the message
        names both), or it is an SQLite file with tables but no application record.
    RuntimeError
        If the file's schema version is newer than ``len(migrations)`` ("written by a newer
        dpmarket"), or the file system does not support WAL.
    sqlite3.DatabaseError
        If the file is not an SQLite database, or a migration fails (the file then stays at the
        last version that completed).

    Notes
    -----
    The connection may be used from any thread, but not from two at once: SQLite serialises
    single calls, not transactions, so a second thread's ``BEGIN`` inside the first one's
    transaction fails. Callers serialise access, e.g. one connection per service guarded by a
    ``threading.Lock`` (asyncio services call it through ``asyncio.to_thread``). Separate
    connections (other threads with their own, other processes) are serialised by SQLite's
    file locks: :func:`transaction` takes the write lock up front.
    """
    if not application:
        raise ValueError("application must be a non-empty name, got ''")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # The busy timeout first: switching to WAL and the checks below wait for other writers.
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(
                f"{path}: the file system refused journal_mode=WAL (got {mode!r}); put the data "
                "directory on a local file system"
            )
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        _check_application(conn, path, application)
        _migrate(conn, path, migrations)
    except BaseException:
        conn.close()
        raise
    return conn
