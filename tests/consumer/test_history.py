"""The consumer's record of its sessions: written atomically, readable by its user only, read back
as written, newest first; never the validation set."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dpmarket.consumer.history import SessionHistory


def test_records_read_back_newest_first_and_private(tmp_path: Path) -> None:
    history = SessionHistory(tmp_path)
    first = history.record(
        status="done",
        source="request",
        method="candidates",
        summary_size=20,
        result={"points_per_owner": {"young": 2, "senior": 18}, "mmd2_validation": 0.004,
                "left_out": {}, "epsilon": None, "owner_spend": {}},
        summary_path="/tmp/summary.csv",
        now=1_000_000.0,
    )  # fmt: skip
    second = history.record(
        status="failed",
        source="console",
        method="rounds",
        summary_size=5,
        session_id="2db8d0d2d08168c3bffac8daefcd8fed",
        error="an owner refused",
        left_out={"middle": "budget refused"},
        now=1_000_100.0,
    )
    assert [e.key for e in history.entries()] == [second.key, first.key]
    assert history.get(first.key) == first
    assert history.get(second.key).left_out == {"middle": "budget refused"}  # type: ignore[union-attr]
    assert second.short_id == "2db8d0d2"
    assert stat.S_IMODE(os.stat(history.folder).st_mode) == 0o700
    for path in history.folder.iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert history.get("../../etc/passwd") is None


def test_a_bad_status_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="status"):
        SessionHistory(tmp_path).record(status="lost", source="request", method="x", summary_size=1)


def test_a_running_record_is_replaced_when_the_session_ends_keeping_its_quote(
    tmp_path: Path,
) -> None:
    """A session recorded when it is created (running: its id, request key, quote, owners) and
    replaced, under the same key, when it ends; what the end does not repeat is kept."""
    history = SessionHistory(tmp_path)
    running = history.record(
        status="running",
        source="request",
        method="candidates",
        summary_size=20,
        session_id="2db8d0d2d08168c3bffac8daefcd8fed",
        request_id="key-1",
        quote={"total": 12_500_000, "total_credits": "12.50"},
        owners=["senior", "young"],
        now=1_000_000.0,
    )
    assert running.unfinished and [e.key for e in history.entries()] == [running.key]
    ended = history.record(
        status="failed",
        source="request",
        method="candidates",
        summary_size=20,
        session_id=running.session_id,
        error="session failed: the curator restarted",
        key=running.key,
        now=1_000_050.0,
    )
    assert [e.key for e in history.entries()] == [running.key] and not ended.unfinished
    assert (ended.request_id, ended.owners, ended.quote) == (
        "key-1",
        ["senior", "young"],
        running.quote,
    )
