"""Service databases: durable settings, sequential migrations, one owner per file."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpmarket.runtime.database import (
    DatabaseMissingError,
    SchemaUpgradeRequiredError,
    backup_database,
    open_database,
    snapshot,
    transaction,
)

V1 = "CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT NOT NULL);"
# A semicolon inside a string literal and a trigger body must not split the script.
V2 = """
-- version 2; adds a note column and a trigger
ALTER TABLE things ADD COLUMN note TEXT DEFAULT 'a;b';
CREATE TABLE log (thing INTEGER REFERENCES things (id));
CREATE TRIGGER things_log AFTER INSERT ON things BEGIN
    INSERT INTO log (thing) VALUES (new.id);
END;
"""
V1_TO_V3 = "CREATE TABLE extra (id INTEGER PRIMARY KEY);"


def test_settings_and_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "svc.sqlite3"
    with closing(open_database(path, [V1], application="svc")) as conn:
        assert conn.isolation_level is None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("SELECT value FROM meta WHERE key = 'application'").fetchone() == (
            "svc",
        )


def test_pending_migrations_run_in_order(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    with closing(open_database(path, [V1], application="svc")) as conn, transaction(conn):
        conn.execute("INSERT INTO things (name) VALUES ('old')")
    with closing(open_database(path, [V1, V2], application="svc")) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        with transaction(conn):
            conn.execute("INSERT INTO things (name) VALUES ('new')")
        assert conn.execute("SELECT name, note FROM things ORDER BY id").fetchall() == [
            ("old", "a;b"),
            ("new", "a;b"),
        ]
        assert conn.execute("SELECT thing FROM log").fetchall() == [(2,)]
    # Reopening at the current version runs nothing.
    with closing(open_database(path, [V1, V2], application="svc")) as conn:
        assert conn.execute("SELECT COUNT(*) FROM things").fetchone()[0] == 2


def test_a_failing_migration_leaves_the_last_whole_version(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    broken = "CREATE TABLE extra (x);\nINSERT INTO nowhere VALUES (1);"
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        open_database(path, [V1, broken], application="svc")
    with closing(open_database(path, [V1], application="svc")) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "extra" not in tables


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    open_database(path, [V1, V2], application="svc").close()
    with pytest.raises(RuntimeError, match="newer dpmarket: schema 2, this build knows 1"):
        open_database(path, [V1], application="svc")


def test_another_application_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    open_database(path, [V1], application="dpmarket-owner").close()
    with pytest.raises(ValueError, match="'dpmarket-owner', not 'dpmarket-curator'"):
        open_database(path, [V1], application="dpmarket-curator")


def test_a_foreign_sqlite_file_is_not_adopted(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE unrelated (x)")
        conn.commit()
    with pytest.raises(ValueError, match="without an application record"):
        open_database(path, [V1], application="svc")


def test_transaction_rolls_back_on_error(tmp_path: Path) -> None:
    with closing(open_database(tmp_path / "svc.sqlite3", [V1], application="svc")) as conn:
        with pytest.raises(KeyError), transaction(conn):
            conn.execute("INSERT INTO things (name) VALUES ('lost')")
            raise KeyError("boom")
        assert not conn.in_transaction
        with snapshot(conn):
            assert conn.execute("SELECT COUNT(*) FROM things").fetchone()[0] == 0
        assert not conn.in_transaction


def test_transaction_excludes_other_writers(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    with (
        closing(open_database(path, [V1], application="svc")) as a,
        closing(open_database(path, [V1], application="svc")) as b,
    ):
        b.execute("PRAGMA busy_timeout = 0")
        with transaction(a):
            with pytest.raises(sqlite3.OperationalError, match="locked"), transaction(b):
                pass
            # A reader is not blocked by the writer (WAL).
            with snapshot(b):
                assert b.execute("SELECT COUNT(*) FROM things").fetchone()[0] == 0


@pytest.mark.parametrize("state", ["missing", "empty", "foreign"])
def test_create_false_refuses_a_file_it_would_have_started_afresh_and_writes_nothing(
    tmp_path: Path, state: str
) -> None:
    path = tmp_path / "svc.sqlite3"
    if state == "empty":
        path.write_bytes(b"")
    elif state == "foreign":
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 0")  # a valid SQLite file with nothing in it
    before = path.read_bytes() if path.exists() else None
    with pytest.raises(DatabaseMissingError) as info:
        open_database(path, [V1], application="svc", create=False)
    assert info.value.reason == state
    assert (path.read_bytes() if path.exists() else None) == before
    assert not path.with_name(path.name + "-wal").exists()
    # Control: opened with create (the default), the same file becomes a new, empty database.
    with closing(open_database(path, [V1], application="svc")) as conn:
        assert conn.execute("SELECT COUNT(*) FROM things").fetchone()[0] == 0
    open_database(path, [V1], application="svc", create=False).close()  # now it is svc's


def test_a_migration_may_be_a_function_run_in_its_transaction(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"

    def upper_names(conn: sqlite3.Connection) -> None:
        assert conn.in_transaction
        for thing_id, name in conn.execute("SELECT id, name FROM things").fetchall():
            conn.execute("UPDATE things SET name = ? WHERE id = ?", (name.upper(), thing_id))

    with closing(open_database(path, [V1], application="svc")) as conn, transaction(conn):
        conn.execute("INSERT INTO things (name) VALUES ('old')")
    with closing(open_database(path, [V1, upper_names], application="svc")) as conn:
        assert conn.execute("SELECT name FROM things").fetchall() == [("OLD",)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_backup_holds_what_only_the_wal_holds(tmp_path: Path) -> None:
    path = tmp_path / "svc.sqlite3"
    open_database(path, [V1], application="svc").close()  # the schema checkpointed to the file
    with closing(open_database(path, [V1], application="svc")) as writer:
        with transaction(writer):
            writer.execute("INSERT INTO things (name) VALUES ('in the wal')")
        assert path.with_name(path.name + "-wal").stat().st_size > 0  # not checkpointed yet
        # Control: the main file alone does not hold the row yet.
        alone = tmp_path / "alone.sqlite3"
        alone.write_bytes(path.read_bytes())
        with closing(sqlite3.connect(alone)) as conn:
            assert conn.execute("SELECT COUNT(*) FROM things").fetchone()[0] == 0
        out = backup_database(path, tmp_path / "copy" / "svc.sqlite3", application="svc")
    assert not out.with_name(out.name + "-wal").exists()
    with closing(sqlite3.connect(out)) as conn:
        assert conn.execute("SELECT name FROM things").fetchall() == [("in the wal",)]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    with pytest.raises(FileExistsError):
        backup_database(path, out, application="svc")
    with pytest.raises(ValueError, match="not 'other'"):
        backup_database(path, tmp_path / "x.sqlite3", application="other")


def test_a_file_below_auto_upgrade_from_is_refused_and_left_as_found(tmp_path: Path) -> None:
    """A service that migrates an existing file on open only from some schema on (an owner's
    ledger: not below its chain) refuses an older one, untouched; a new file is created in
    full, and a file at that schema or later is migrated. Control: with the default (0), the
    older file is migrated on open."""
    old, path = tmp_path / "old.sqlite3", tmp_path / "db.sqlite3"
    open_database(old, [V1], application="svc").close()
    with pytest.raises(SchemaUpgradeRequiredError, match="below schema 2") as info:
        open_database(old, [V1, V2, V1_TO_V3], application="svc", auto_upgrade_from=2)
    assert (info.value.version, info.value.known) == (1, 3)
    with closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    open_database(path, [V1, V2, V1_TO_V3], application="svc", auto_upgrade_from=2).close()
    open_database(old, [V1, V2], application="svc").close()  # control: migrated on open
    with closing(open_database(old, [V1, V2, V1_TO_V3], application="svc", auto_upgrade_from=2)):
        pass
    for p in (old, path):
        with closing(sqlite3.connect(p)) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
