"""Durable state of every service: one SQLite file per service, with versioned schemas.

:func:`open_database` opens (or creates) a service's database with settings chosen for
durability rather than speed, checks that it belongs to that service and brings its schema up to
date; :func:`transaction` runs a block as one write transaction that no other writer, in this
process or another, can interleave with.

Migrations
----------
A service describes its schema as a list of migrations: ``migrations[i]`` takes the schema from
version ``i`` to version ``i + 1`` (``migrations[0]`` creates it from nothing). A migration is an
SQL script or, when a step needs what SQL cannot compute (a hash over existing rows), a function
``migration(connection)`` that runs its statements on the connection it is given. The version a
file is at is SQLite's ``PRAGMA user_version``, 0 in a new file. Opening runs the pending
migrations in order, each in its own transaction that also bumps ``user_version``, so a crash
leaves the file at a whole version and the next open resumes from there.

- To change a schema, *append* a migration; never edit or remove one that has been released,
  since databases in the field are already past it and would never run the edited version.
- Versions are sequential; there are no branches and no down-migrations.
- A file at a version newer than the scripts this build knows was written by a newer dpmarket:
  it is refused (``RuntimeError``) rather than read with a schema that may have changed meaning.

Each database also holds a ``meta(key, value)`` table, created before any migration, whose
``application`` entry names the service that owns the file (e.g. ``"dpmarket-owner"``), so that
pointing one service at another's data directory fails loudly instead of silently adding tables.

A service whose state must never start again from nothing in silence (an owner's ledger) opens
with ``create=False``: a missing file, an empty one, or an SQLite file without its application
record is then refused (:class:`DatabaseMissingError`) rather than created; the service creates
its file only on an explicit request. :func:`backup_database` copies a database consistently while
its service runs (SQLite's online backup API: the pages committed to the ``-wal`` file included).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Literal

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DatabaseMissingError",
    "Migration",
    "SchemaUpgradeRequiredError",
    "backup_database",
    "execute_script",
    "open_database",
    "open_read_only",
    "snapshot",
    "transaction",
]

#: One schema step: an SQL script, or a function that runs its statements on the connection.
Migration = str | Callable[[sqlite3.Connection], None]


class DatabaseMissingError(FileNotFoundError):
    """A database opened with ``create=False`` is missing, empty (0 bytes) or holds no record of
    its application: nothing was created or written. ``reason`` is ``"missing"``, ``"empty"``
    or ``"foreign"``."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SchemaUpgradeRequiredError(RuntimeError):
    """A database is at an older schema than the oldest its caller migrates on open
    (``auto_upgrade_from``): nothing was migrated or written. ``version`` is the file's,
    ``known`` this build's."""

    def __init__(self, message: str, *, version: int, known: int) -> None:
        super().__init__(message)
        self.version = version
        self.known = known


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


def execute_script(conn: sqlite3.Connection, script: str) -> None:
    """Run an SQL script statement by statement on ``conn``, inside the caller's transaction
    (``sqlite3.Connection.executescript`` would commit it first): what a migration that is a
    function runs its DDL with."""
    for statement in _statements(script):
        conn.execute(statement)


def _application_of(conn: sqlite3.Connection) -> str | None:
    """The ``meta.application`` record of a database, or None (no ``meta`` table or record)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'application'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if row is None else str(row[0])


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


def _migrate(
    conn: sqlite3.Connection,
    path: Path,
    migrations: Sequence[Migration],
    *,
    auto_upgrade_from: int = 0,
) -> None:
    """Run the pending migrations, one transaction each; refuse a newer schema, and an
    existing file below ``auto_upgrade_from``."""
    known = len(migrations)
    first: int | None = None  # the version found: 0 for a new file, created in full
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
            first = version if first is None else first
            if 0 < first < auto_upgrade_from:
                raise SchemaUpgradeRequiredError(
                    f"{path} is at schema {version}, this build uses {known}: a file below "
                    f"schema {auto_upgrade_from} is not upgraded on open",
                    version=version,
                    known=known,
                )
            migration = migrations[version]
            if callable(migration):
                migration(conn)
            else:
                execute_script(conn, migration)
            conn.execute(f"PRAGMA user_version = {version + 1}")


def _refuse_missing(path: Path, application: str) -> None:
    """Refuse (:class:`DatabaseMissingError`) a missing or empty file (``create=False``)."""
    if not path.exists():
        raise DatabaseMissingError(f"{path} does not exist", reason="missing")
    if path.is_file() and path.stat().st_size == 0:
        raise DatabaseMissingError(
            f"{path} is empty (0 bytes): not a database of {application!r}", reason="empty"
        )


def open_database(
    path: str | os.PathLike[str],
    migrations: Sequence[Migration],
    *,
    application: str,
    create: bool = True,
    journal: Literal["wal", "rollback"] = "wal",
    auto_upgrade_from: int = 0,
) -> sqlite3.Connection:
    """Open or create a service's SQLite database and bring its schema up to date.

    Creates the parent directory (unless ``create`` is false); connects with
    ``isolation_level=None`` (every transaction is explicit: use :func:`transaction`) and
    ``check_same_thread=False``; sets ``journal_mode=WAL`` (readers never block the writer),
    ``foreign_keys=ON`` and ``busy_timeout`` = :data:`BUSY_TIMEOUT_MS`; checks the
    ``application`` record; runs the pending ``migrations`` (see the module docstring), both
    at ``synchronous=NORMAL`` (a power loss may undo the last of them, which the next open
    runs again); then sets ``synchronous=FULL``: every transaction of the caller survives a
    power loss once it has committed (and makes the migrations before it durable too).

    Parameters
    ----------
    path : str or path-like
        The database file, e.g. ``data_dir / "owner.sqlite3"``. SQLite keeps ``-wal`` and
        ``-shm`` files beside it.
    migrations : sequence of str or callable
        ``migrations[i]`` takes the schema from version ``i`` to ``i + 1``: an SQL script, or a
        function called with the connection. Neither may ``BEGIN``/``COMMIT``: each runs inside
        its own transaction.
    application : str
        Name of the owning service, e.g. ``"dpmarket-owner"``; stored in ``meta`` by the first
        open and compared on every later one.
    create : bool, default True
        Whether a missing or new file may be created (and claimed for ``application``). False:
        only a database that already records ``application`` is opened; nothing is created or
        written otherwise.
    journal : {"wal", "rollback"}, default "wal"
        ``"wal"``: ``journal_mode=WAL``; committed transactions may live in the ``-wal`` file
        until SQLite checkpoints them, so losing or truncating that file undoes them without a
        trace in the main file. ``"rollback"``: ``journal_mode=DELETE``; every transaction is in
        the main file when it commits (the journal only holds what an unfinished one would undo),
        so no file beside it can take a committed transaction back; readers briefly block the
        writer. For records whose loss must never pass unnoticed (an owner's privacy ledger).
    auto_upgrade_from : int, default 0
        The oldest schema of an existing file that is migrated on open (0: any). A file below
        it is refused (:class:`SchemaUpgradeRequiredError`) and left as found, so that a service
        whose file must not come back through an older format behind its operator's back (an
        owner's ledger: taken back to the schema before its identity and chain, it would be
        migrated with a new id and its budget reset) migrates it only on an explicit request
        (open it then with 0). A new file (schema 0) is always created in full.

    Returns
    -------
    sqlite3.Connection
        Open, at schema version ``len(migrations)``. The caller closes it.

    Raises
    ------
    DatabaseMissingError
        With ``create=False``: if the file does not exist, is empty (0 bytes), or is an SQLite
        database with no application record (nothing is written to it).
    SchemaUpgradeRequiredError
        (a ``RuntimeError``) If the file is at a schema between 1 and ``auto_upgrade_from - 1``;
        nothing was migrated.
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
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    else:
        _refuse_missing(path, application)
        # mode=rw never creates the file (sqlite3.connect would).
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=rw",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
    try:
        # The busy timeout first: switching to WAL and the checks below wait for other writers.
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not create and _application_of(conn) is None:
            # Read before anything is written: the file is left exactly as it was found.
            raise DatabaseMissingError(
                f"{path} holds no database of {application!r} (no application record)",
                reason="foreign",
            )
        # Switching to WAL and the claim and migrations below commit without waiting for the
        # disk (a power loss may undo the last of them, never corrupt the file: the next open
        # runs them again), so that creating a database costs one sync, not one per migration;
        # every transaction after them is durable when it commits.
        conn.execute("PRAGMA synchronous = NORMAL")
        wanted = {"wal": "wal", "rollback": "delete"}[journal]
        mode = conn.execute(f"PRAGMA journal_mode = {wanted}").fetchone()[0]
        if str(mode).lower() != wanted:
            raise RuntimeError(
                f"{path}: the file system refused journal_mode={wanted.upper()} (got {mode!r}); "
                "put the data directory on a local file system"
            )
        conn.execute("PRAGMA foreign_keys = ON")
        _check_application(conn, path, application)
        _migrate(conn, path, migrations, auto_upgrade_from=auto_upgrade_from)
        conn.execute("PRAGMA synchronous = FULL")
    except BaseException:
        conn.close()
        raise
    return conn


def open_read_only(
    path: str | os.PathLike[str], *, application: str, schema_version: int
) -> sqlite3.Connection:
    """Open a service's existing database for reading only (``mode=ro``): nothing is created,
    migrated or written, so it can be inspected while the service runs or after it stopped.

    Parameters
    ----------
    path : str or path-like
        The database file.
    application : str
        The service that must own it (its ``meta`` record).
    schema_version : int
        The schema version this build reads (``len(migrations)``).

    Returns
    -------
    sqlite3.Connection
        Read-only; the caller closes it.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file belongs to another application or is not a service database.
    RuntimeError
        If its schema is not ``schema_version``: written by a newer dpmarket, or by an older one
        whose service has not run (and migrated it) since.
    sqlite3.DatabaseError
        If the file is not an SQLite database.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        found = _application_of(conn)
        if found != application:
            owner = "no application" if found is None else f"application {found!r}"
            raise ValueError(f"{path} belongs to {owner}, not {application!r}")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version != schema_version:
            newer = version > schema_version
            raise RuntimeError(
                f"{path} is at schema {version}, this build reads {schema_version}: "
                + (
                    "written by a newer dpmarket; upgrade dpmarket"
                    if newer
                    else "start the service once with this dpmarket to migrate it"
                )
            )
    except BaseException:
        conn.close()
        raise
    return conn


def backup_database(
    source: str | os.PathLike[str], out: str | os.PathLike[str], *, application: str
) -> Path:
    """Copy a service's database consistently, while its service may be writing to it.

    Uses SQLite's online backup API (:meth:`sqlite3.Connection.backup`): the copy is one
    consistent snapshot of every committed transaction, those still only in the ``-wal`` file
    included (a copy of the main file alone misses them). The copy is written beside ``out``
    under a temporary name, switched to ``journal_mode=DELETE`` (one self-contained file, no
    ``-wal`` beside it), synced, then renamed to ``out``: a crash leaves no half-written
    ``out``.

    Parameters
    ----------
    source : path
        The database, e.g. ``data_dir / "owner.sqlite3"``; only read (``mode=ro``).
    out : path
        The copy; must not exist. Its directory is created.
    application : str
        The service that must own ``source`` (its ``meta`` record).

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    FileNotFoundError
        If ``source`` does not exist.
    FileExistsError
        If ``out`` exists.
    ValueError
        If ``source`` belongs to another application or to none.
    sqlite3.DatabaseError
        If ``source`` is not an SQLite database, or the copy fails (``out`` is then not
        written).
    """
    source, out = Path(source), Path(out)
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    if out.exists():
        raise FileExistsError(f"{out} exists: choose a new file for the backup")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    try:
        src.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        found = _application_of(src)
        if found != application:
            owner = "no application" if found is None else f"application {found!r}"
            raise ValueError(f"{source} belongs to {owner}, not {application!r}")
        with closing(sqlite3.connect(partial, isolation_level=None)) as dst:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE")
        with open(partial, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(partial, out)
        directory = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    return out
