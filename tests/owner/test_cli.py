"""``dpmarket owner ledger`` shows the charges and what is left, from the ledger alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpmarket.deploy.cli import command_at
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An owner data directory with three charges, one of them non-private."""
    now = [T0]
    policy = OwnerPolicy(epsilon_total=4.0, allow_non_private=True, points_total=5000)
    charges = [
        ("sess-a", "alice", "validation embedding", 1.5, 1e-7, 0),
        ("sess-a", "alice", "raw points", 0.25, 0.0, 40),
        ("sess-b", "bob", "exact embedding", math.inf, 0.0, 7),
    ]
    with OwnerLedger.create(tmp_path / "owner", policy, clock=lambda: now[0]) as ledger:
        for session, consumer, mechanism, epsilon, delta, points in charges:
            ledger.charge(
                session=session,
                consumer=consumer,
                curator="curator",
                mechanism=mechanism,
                epsilon=epsilon,
                delta=delta,
                points=points,
            )
            now[0] += 60
    return tmp_path / "owner"


def invoke(*args: str) -> str:
    owner = command_at("owner")
    result = CliRunner().invoke(owner, list(args), env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_table_lists_the_charges_and_what_is_left(data_dir: Path) -> None:
    out = invoke("ledger", "--data-dir", str(data_dir), "--wide")
    for text in (
        "2024-05-01T12:00:00Z",
        "2024-05-01T12:02:00Z",
        "sess-a",
        "sess-b",
        "alice",
        "bob",
        "validation embedding",
        "raw points",
        "a non-private release",
        "1e-07",
    ):
        assert text in out, text
    # Budget over the lifetime: epsilon 1.75 of 4 (the non-private charge is not summed),
    # points 47 of 5000.
    assert "over the lifetime" in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()]
    assert ["over the lifetime", "epsilon", "1.75", "4", "2.25"] in rows
    assert ["over the lifetime", "points", "47", "5000", "4953"] in rows
    assert ["2024-05-01T12:02:00Z", "sess-b", "bob", "curator", "exact embedding", "inf", "0",
            "7"] in rows  # fmt: skip
    assert "non-private releases" in out


def test_the_default_table_is_compact(data_dir: Path) -> None:
    out = invoke("ledger", "--data-dir", str(data_dir))
    for text in ("05-01 12:00", "05-01 12:02", "sess-a", "sess-b", "alice", "bob", "points"):
        assert text in out, text
    assert "2024-05-01T12:00:00Z" not in out and "--wide" in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines()]
    assert ["over the lifetime", "epsilon", "1.75", "4", "2.25"] in rows


def test_json_has_the_same_content(data_dir: Path) -> None:
    report = json.loads(invoke("ledger", "--data-dir", str(data_dir), "--json"))
    assert [e["mechanism"] for e in report["entries"]] == [
        "validation embedding",
        "raw points",
        "exact embedding",
    ]
    first, _, exact = report["entries"]
    assert first["time"] == "2024-05-01T12:00:00Z" and first["at"] == T0
    assert (first["epsilon"], first["delta"], first["points"]) == (1.5, 1e-7, 0)
    assert exact["non_private"] is True and exact["epsilon"] is None
    assert report["window"] == "the lifetime"
    assert report["policy"]["epsilon_total"] == 4.0
    assert report["budget"]["epsilon"] == {"spent": 1.75, "limit": 4.0, "left": 2.25}
    assert report["budget"]["points"] == {"spent": 47, "limit": 5000, "left": 4953}
    assert report["budget"]["non_private"] is True
    assert report["session"] is None


def test_session_and_limit(data_dir: Path) -> None:
    report = json.loads(
        invoke("ledger", "--data-dir", str(data_dir), "--json", "--session", "sess-a")
    )
    assert [e["session"] for e in report["entries"]] == ["sess-a", "sess-a"]
    assert report["session"]["id"] == "sess-a"
    assert report["session"]["epsilon"] == {"spent": 1.75, "limit": 2.0, "left": 0.25}
    assert report["session"]["points"] == {"spent": 40, "limit": 1000, "left": 960}

    report = json.loads(invoke("ledger", "--data-dir", str(data_dir), "--json", "--limit", "1"))
    assert [e["mechanism"] for e in report["entries"]] == ["exact embedding"]
    assert report["budget"]["points"]["spent"] == 47  # totals cover every charge

    out = invoke("ledger", "--data-dir", str(data_dir), "--session", "sess-a")
    assert "session sess-a" in out and "bob" not in out


def test_no_ledger_is_a_clear_error(tmp_path: Path) -> None:
    owner = command_at("owner")
    result = CliRunner().invoke(owner, ["ledger", "--data-dir", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "holds no owner ledger" in result.output
    assert not (tmp_path / "nothing").exists()
