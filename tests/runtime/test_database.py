"""Service databases: durable settings, sequential migrations, one owner per file."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dpmarket.runtime.database import open_database, snapshot, transaction

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
