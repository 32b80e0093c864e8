"""``dpmarket curator sessions|charges``: what the curator's store holds, read without writing.

A real session manager with in-process owners fills a real curator store (a finished session, a
refused one that stays out of the store, a failed job row written as the CAPE service writes
it); the commands read it while the store is still open, as while the curator serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.summary import OwnerSelection, SessionRequest
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.store import DATABASE_FILE, CuratorRecords, CuratorStore, _recorded_spend
from dpmarket.deploy.cli import main
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner

#: The owners' policy: the defaults, and the candidates methods served (their rows are picked
#: along the curator's embedding: tests/owner/test_exact_bids.py, the default refuses them).
SERVING = OwnerPolicy(allow_steered_selection=True)

CONFIG = CandidatesConfig(summary_size=8, rff_dimension=32)


@pytest.fixture
def state(tmp_path: Path, digits: Scenario) -> tuple[Path, str, CuratorStore]:
    """A curator data directory with one finished candidates session and one failed CAPE job;
    the store is left open (the curator still serving)."""
    store = CuratorStore(tmp_path / "curator")
    owners = [
        Owner(o.name, o, ledger=OwnerLedger.create(tmp_path / o.name, SERVING))
        for o in digits.owners[:3]
    ]
    manager = SessionManager([LocalOwnerEndpoint(o) for o in owners], store=store)

    async def run() -> str:
        request = SessionRequest(
            CONFIG,
            digits.validation,
            digits.seed_set,
            selection=OwnerSelection(min_owners=2, exclude=(digits.owners[2].name,)),
        )
        sid = await manager.create(request, consumer="consumer:alice")
        async for _ in manager.watch(sid, "consumer:alice"):
            pass
        await manager.close()
        return sid

    sid = asyncio.run(run())
    store.create(
        "f" * 32,
        consumer="consumer:bob",
        request_id="k",
        request_digest="d",
        method="cape-mean",
        config={"epsilon": 1.0},
    )
    store.fail_document("f" * 32, "fewer than 2 sites remain", {"owner_spend": {}}, ttl=60)
    for owner in owners:
        assert owner.ledger is not None
        owner.ledger.close()
    return tmp_path / "curator", sid, store


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["curator", *args])


def test_sessions_lists_every_session_and_job_with_what_it_charged(
    state: tuple[Path, str, CuratorStore],
) -> None:
    data_dir, sid, store = state
    before = _digest(data_dir / DATABASE_FILE)
    printed = _invoke("sessions", "--data-dir", str(data_dir), "--json")
    assert printed.exit_code == 0, printed.output
    rows = json.loads(printed.stdout)["sessions"]
    assert [(r["id"], r["kind"], r["method"], r["status"]) for r in rows] == [
        (sid, "summarization", "candidates", "done"),
        ("f" * 32, "cape", "cape-mean", "failed"),
    ]
    session = rows[0]
    assert session["consumer"] == "consumer:alice"
    # The charges the store holds: epsilon 1 on the owners (counts allocation), epsilon 1 on D_v.
    assert session["charges"] == len(store.charges(sid)) > 0
    assert session["epsilon"]["owners"] == pytest.approx(1.0)
    assert session["epsilon"]["validation"] == pytest.approx(1.0)
    assert session["owner_points_accessed"] > 0
    assert list(session["left_out"].values()) == ["excluded by the consumer"]
    assert rows[1]["error"] == "fewer than 2 sites remain" and rows[1]["charges"] == 0

    table = _invoke("sessions", "--data-dir", str(data_dir))
    assert table.exit_code == 0, table.output
    assert sid[:8] in table.output and "candidates" in table.output
    assert "failed: fewer than 2 sites remain" in table.output
    assert "…" not in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80
    assert _digest(data_dir / DATABASE_FILE) == before  # read, never written


def test_charges_of_one_session_by_its_short_id(state: tuple[Path, str, CuratorStore]) -> None:
    data_dir, sid, store = state
    printed = _invoke("charges", "--data-dir", str(data_dir), "--session", sid[:8], "--json")
    assert printed.exit_code == 0, printed.output
    rows = json.loads(printed.stdout)["charges"]
    stored = store.charges(sid)
    assert [(r["party"], r["label"], r["epsilon"], r["count"]) for r in rows] == [
        (c.party, c.label, c.event.epsilon, c.event.count) for c in stored
    ]
    assert {r["session"] for r in rows} == {sid}
    table = _invoke("charges", "--data-dir", str(data_dir), "--session", sid[:8])
    assert table.exit_code == 0 and "relevance counts" in table.output
    assert "…" not in table.output
    none = _invoke("charges", "--data-dir", str(data_dir), "--session", "f%")
    assert none.exit_code == 0 and "no charge of session 'f%'" in none.output


def test_the_commands_refuse_a_directory_without_a_curator_store(
    state: tuple[Path, str, CuratorStore], tmp_path: Path, digits: Scenario
) -> None:
    missing = _invoke("sessions", "--data-dir", str(tmp_path / "nowhere"))
    assert missing.exit_code == 1 and "holds no curator database" in missing.output
    owner_dir = tmp_path / digits.owners[0].name  # an owner's data directory
    (owner_dir / DATABASE_FILE).write_bytes((owner_dir / "owner.sqlite3").read_bytes())
    other = _invoke("charges", "--data-dir", str(owner_dir))
    assert other.exit_code == 1 and "belongs to application 'dpmarket-owner'" in other.output


def test_records_read_while_the_store_writes(state: tuple[Path, str, CuratorStore]) -> None:
    data_dir, _, store = state
    store.create(
        "a" * 32,
        consumer="consumer:carol",
        request_id=None,
        request_digest="d",
        method="uniform",
        config={},
    )
    with CuratorRecords(data_dir) as records:
        assert records.sessions(limit=1)[0]["status"] == "running"


def test_points_read_stay_listed_once_the_report_expired(
    state: tuple[Path, str, CuratorStore],
) -> None:
    """The curator read the owners' points: its table says how many after the session's report
    (where they were counted) expired, from the owners' ledger records it keeps, and its 80
    columns hold the tutorial's consumer name on one line."""
    data_dir, sid, store = state
    listed = json.loads(_invoke("sessions", "--data-dir", str(data_dir), "--json").stdout)
    points = listed["sessions"][0]["owner_points_accessed"]
    recorded = store.owner_spend(sid)
    released = sum(s.points for s in recorded.values() if s is not None)
    assert points == released > 0
    store.mark_fetched(sid, ttl=0.0)
    assert store.expire() == 1
    # Control: the report the listing read its points from is gone.
    with CuratorRecords(data_dir) as records:
        assert records._conn.execute(
            "SELECT report_json FROM sessions WHERE id = ?", (sid,)
        ).fetchone() == (None,)
        row = records.sessions()[0]
    assert row["owner_points_accessed"] == points
    assert row["epsilon"]["owners"] == pytest.approx(1.0)

    printed = CliRunner().invoke(
        main, ["curator", "sessions", "--data-dir", str(data_dir)], env={"COLUMNS": "80"}
    )
    assert printed.exit_code == 0, printed.output
    line = next(x for x in printed.output.splitlines() if x.startswith(sid[:8]))
    assert "alice" in line and line.split()[-1] == str(points), printed.output
    assert max(len(x) for x in printed.output.splitlines()) <= 80


def test_a_session_whose_owner_record_is_missing_lists_no_points(
    state: tuple[Path, str, CuratorStore],
) -> None:
    """``-`` only where the curator does not know: its report expired and an owner's record is
    missing."""
    data_dir, sid, store = state
    owner = next(iter(store.owner_spend(sid)))
    store.record_owner_spend(sid, owner, SessionSpend.unknown_because("owner unreachable"))
    store.mark_fetched(sid, ttl=0.0)
    store.expire()
    with CuratorRecords(data_dir) as records:
        assert records.sessions()[0]["owner_points_accessed"] is None


def test_owners_that_charged_nothing_read_0_not_unknown() -> None:
    """A session whose owners' ledgers all recorded ε 0 (raw points only, e.g. uniform) lists
    ε owners 0 and its points; one with a record pending or missing, nothing."""
    rows = [
        ("s1", 0.0, 12, ""),
        ("s1", 0.0, 16, ""),
        ("s2", 1.0, 5, ""),
        ("s2", None, None, None),  # pending
        ("s3", 1.0, 5, ""),
        ("s3", None, None, "owner unreachable"),  # missing
    ]
    assert _recorded_spend(rows) == {"s1": (0.0, 28)}
