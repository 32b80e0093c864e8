"""A ledger cannot be reset, swapped, rewritten, rolled back or lost in silence.

Each defence with its control, the attack's effect when the defence is off: a missing, empty or
foreign ledger file is refused (without the refusal, SQLite opens it as a fresh ledger with the
whole budget, or another owner's ledger is charged); a charge rewritten in the file is found by
``verify`` (without the chain, SQLite's own check and the running totals see nothing); a ledger
behind a receipt its owner signed refuses to charge (without the receipt it charges on); a
backup taken with ``dpmarket owner ledger backup`` holds every charge; no file beside the ledger
holds a charge its loss would undo (with a write-ahead log, deleting the ``-wal`` after a SIGKILL
gives the budget back).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.deploy.pki import init_ca, issue, issue_all
from dpmarket.owner import ledger as ledger_module
from dpmarket.owner.cli import ledger as ledger_cli
from dpmarket.owner.cli import serve_owner
from dpmarket.owner.ledger import (
    APPLICATION,
    MIGRATIONS,
    ROLLBACK_MESSAGE,
    TAMPERED_MESSAGE,
    LedgerCheckError,
    LedgerMissingError,
    LedgerRollbackError,
    LedgerTamperedError,
    LedgerUpgradeRequiredError,
    OwnerBudgetError,
    OwnerLedger,
    ledger_path,
)
from dpmarket.owner.ledger_admin import backup_ledger, init_ledger, restore_ledger, verify_file
from dpmarket.owner.ledger_chain import ForeignLedgerError, LedgerOwner, _check_totals
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.database import open_database
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity
from tests.owner.ledger_attacks import (
    NoGuard,
    append_negative_charge,
    delete_totals,
    downgrade,
    drop_last_charge,
    lower_totals,
    raw_charges,
    without_triggers,
)

ALICE, BOB = Identity("owner", "alice"), Identity("owner", "bob")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two deployments (two CAs), each with owners alice and bob."""
    out = {}
    for name in ("here", "elsewhere"):
        root = tmp_path_factory.mktemp(name)
        init_ca(root)
        issue_all(root, [ALICE, BOB])
        out[name] = root
    return out


def security(pki: dict[str, Path], identity: Identity, where: str = "here") -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki[where], identity))


def charge(ledger: OwnerLedger, session: str = "s", epsilon: float = 0.5, points: int = 1) -> None:
    ledger.charge(
        session=session,
        consumer="consumer:c",
        curator="curator:curator",
        mechanism="Laplace relevance count",
        epsilon=epsilon,
        delta=0.0,
        points=points,
    )


# ------------------------------------------------------------------ missing, empty, foreign
def _serve(data_dir: Path, table: Path) -> tuple[int, str]:
    """``dpmarket serve-owner`` as its operator starts it (plaintext, owner o): its exit code
    and output; it reaches serving only with a ledger it may use."""
    result = CliRunner().invoke(
        serve_owner,
        ["--insecure", "--owner-id", "o", "--data", str(table), "--data-dir", str(data_dir)],
    )
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "o.npy"
    np.save(path, np.random.default_rng(0).random((10, 3)))
    return path


def test_a_missing_ledger_is_refused_saying_what_to_do(tmp_path: Path, table: Path) -> None:
    data_dir = tmp_path / "owner"
    code, output = _serve(data_dir, table)
    assert code == 1
    assert "no owner ledger at" in output
    assert f"dpmarket owner ledger init --data-dir {data_dir}" in output
    assert "dpmarket owner ledger restore" in output
    assert not ledger_path(data_dir).exists()  # nothing created
    # Control: the service database's old behaviour (create when missing) starts a fresh ledger.
    open_database(ledger_path(data_dir), MIGRATIONS, application=APPLICATION).close()
    with OwnerLedger(data_dir, OwnerPolicy()) as fresh:
        assert fresh.entries() == [] and fresh.remaining().epsilon == OwnerPolicy().epsilon_total


def test_an_empty_ledger_file_is_refused_and_left_as_found(tmp_path: Path, table: Path) -> None:
    data_dir = tmp_path / "owner"
    with OwnerLedger.create(data_dir, OwnerPolicy()) as ledger:
        for k in range(4):
            charge(ledger, session=f"s{k}", epsilon=2.0)
    ledger_path(data_dir).write_bytes(b"")  # `: > owner.sqlite3`, a failed copy, a full disk
    code, output = _serve(data_dir, table)
    assert code == 1
    assert "is empty (0 bytes)" in output and "dpmarket owner ledger restore" in output
    assert ledger_path(data_dir).stat().st_size == 0  # nothing written to it
    with pytest.raises(LedgerMissingError) as info:
        OwnerLedger(data_dir, None)
    assert info.value.reason == "empty"
    # Control: opened as any service database is, the 0-byte file is a new ledger with the
    # whole budget back (what this release's owners did, with one INFO line).
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ledger_path(data_dir), ledger_path(copy))
    open_database(ledger_path(copy), MIGRATIONS, application=APPLICATION).close()
    with OwnerLedger(copy, OwnerPolicy()) as reset:
        assert reset.remaining().epsilon == OwnerPolicy().epsilon_total  # 8 forgotten


def test_a_sqlite_file_that_is_no_ledger_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "owner"
    data_dir.mkdir()
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        conn.execute("PRAGMA journal_mode = WAL")  # a valid, empty SQLite file: no ledger
    size = ledger_path(data_dir).stat().st_size
    with pytest.raises(LedgerMissingError, match="is not an owner ledger") as info:
        OwnerLedger(data_dir, OwnerPolicy())
    assert info.value.reason == "foreign"
    assert ledger_path(data_dir).stat().st_size == size


def test_init_never_replaces_a_ledger(tmp_path: Path) -> None:
    data_dir = tmp_path / "owner"
    init_ledger(data_dir, "o", TransportSecurity.plaintext())
    with pytest.raises(FileExistsError, match="holds a ledger already"):
        init_ledger(data_dir, "o", TransportSecurity.plaintext())
    ledger_path(data_dir).write_bytes(b"")
    with pytest.raises(FileExistsError, match="holds a ledger already"):
        init_ledger(data_dir, "o", TransportSecurity.plaintext())


def test_a_ledger_of_another_owner_or_deployment_is_refused(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    alice_dir = tmp_path / "alice"
    init_ledger(alice_dir, "alice", security(pki, ALICE))
    with OwnerLedger(alice_dir, OwnerPolicy()) as ledger:
        for k in range(4):
            charge(ledger, session=f"s{k}", epsilon=2.0)
    alice = LedgerOwner.from_security("alice", security(pki, ALICE))
    with OwnerLedger(alice_dir, None, owner=alice) as ledger:
        assert ledger.identity.owner == "alice" and ledger.receipt() is not None
    # bob pointed at alice's data directory; alice of another deployment (another CA) given
    # this deployment's alice's ledger.
    bob = LedgerOwner.from_security("bob", security(pki, BOB))
    with pytest.raises(ForeignLedgerError, match="the ledger of owner 'alice', not of 'bob'"):
        OwnerLedger(alice_dir, OwnerPolicy(), owner=bob)
    other = LedgerOwner.from_security("alice", security(pki, ALICE, "elsewhere"))
    with pytest.raises(ForeignLedgerError, match="of another deployment") as info:
        OwnerLedger(alice_dir, OwnerPolicy(), owner=other)
    assert "restore this owner's own ledger from its backup" in str(info.value)
    # Control: without the binding, bob serves on alice's ledger (her budget, his data).
    with OwnerLedger(alice_dir, OwnerPolicy()) as unchecked:
        assert unchecked.remaining().epsilon == pytest.approx(2.0)


def test_a_renewed_certificate_of_the_same_owner_and_ca_is_its_own(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    data_dir = tmp_path / "alice"
    init_ledger(data_dir, "alice", security(pki, ALICE))
    renewed = tmp_path / "renewed"
    shutil.copytree(pki["here"], renewed)
    issue(renewed, "owner", "alice", out_dir=renewed / "alice", force=True)
    fresh = TransportSecurity.from_files(*identity_files(renewed / "alice", ALICE))
    assert fresh.key_pem != security(pki, ALICE).key_pem
    with OwnerLedger(data_dir, None, owner=LedgerOwner.from_security("alice", fresh)) as ledger:
        assert len(ledger.identity.keys) == 2  # the new key signs receipts from now on


def test_after_a_new_ca_the_ledger_is_rebound_explicitly(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """The deployment's CA replaced (docs/howto-certificates.md): the owner's ledger is refused
    until its operator binds it to the new CA; another owner's name is never taken."""
    data_dir = tmp_path / "alice"
    init_ledger(data_dir, "alice", security(pki, ALICE))
    new_ca = LedgerOwner.from_security("alice", security(pki, ALICE, "elsewhere"))
    with pytest.raises(ForeignLedgerError, match="dpmarket owner ledger rebind"):
        OwnerLedger(data_dir, None, owner=new_ca)
    bob_new_ca = LedgerOwner.from_security("bob", security(pki, BOB, "elsewhere"))
    with OwnerLedger(data_dir, None) as ledger, pytest.raises(ForeignLedgerError):
        ledger.rebind(bob_new_ca)
    result = CliRunner().invoke(
        ledger_cli,
        ["rebind", "--data-dir", str(data_dir),
         "--pki-dir", str(pki["elsewhere"]), "--name", "alice"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    with OwnerLedger(data_dir, None, owner=new_ca) as ledger:
        assert ledger.identity.ca == new_ca.ca and len(ledger.identity.keys) == 2


# ------------------------------------------------------------------ the chain and verify
def _ledger_with_charges(data_dir: Path, n: int = 5) -> None:
    with OwnerLedger.create(data_dir, OwnerPolicy()) as ledger:
        for k in range(n):
            charge(ledger, session=f"s{k}", epsilon=0.5, points=k)


def test_verify_finds_a_charge_rewritten_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "owner"
    _ledger_with_charges(data_dir)
    assert verify_file(ledger_path(data_dir)).ok
    # Someone with the file lowers charge 3's epsilon and adjusts the running totals to match.
    with (
        closing(sqlite3.connect(ledger_path(data_dir))) as conn,
        conn,
        without_triggers(conn, "charges_no_update"),
    ):
        conn.execute("UPDATE charges SET epsilon = 0.01 WHERE id = 3")
        conn.execute("DELETE FROM charge_totals")
        conn.execute(
            "INSERT INTO charge_totals SELECT CAST(at / 86400 AS INTEGER), epsilon, delta, "
            "non_private, COUNT(*), SUM(points) FROM charges GROUP BY 1, 2, 3, 4"
        )
    found = verify_file(ledger_path(data_dir))
    assert not found.ok
    assert [p.charge for p in found.problems] == [3]
    assert "does not match its chain hash" in found.problems[0].what
    result = CliRunner().invoke(ledger_cli, ["verify", "--data-dir", str(data_dir)])
    assert result.exit_code == 1 and "charge 3 does not match" in result.output
    # Control: without the chain, nothing else sees it: SQLite's check passes, the totals
    # agree with the charges, and the ledger serves with the lowered spend.
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        assert _check_totals(conn) == []
    # The owner checks the chain when it opens its ledger, and does not start on this one.
    with pytest.raises(LedgerCheckError, match="charge 3 does not match its chain hash"):
        OwnerLedger(data_dir, None)
    monkeypatch.setattr(ledger_module, "ChainGuard", NoGuard)  # that check off
    with OwnerLedger(data_dir, None) as ledger:
        assert ledger.window_totals().epsilon == pytest.approx(4 * 0.5 + 0.01)


def test_verify_finds_a_charge_removed_from_the_middle(tmp_path: Path) -> None:
    data_dir = tmp_path / "owner"
    _ledger_with_charges(data_dir)
    with (
        closing(sqlite3.connect(ledger_path(data_dir))) as conn,
        conn,
        without_triggers(conn, "charges_no_delete", "charge_chain_no_delete"),
    ):
        conn.execute("DELETE FROM charge_chain WHERE charge = 2")
        conn.execute("DELETE FROM charges WHERE id = 2")
    found = verify_file(ledger_path(data_dir))
    assert [p.charge for p in found.problems if p.charge] == [3]


def test_a_ledger_of_the_current_release_migrates_and_gets_a_chain(tmp_path: Path) -> None:
    """A ledger at schema 3 (this release before the chain) with charges: the owner does not
    open it until its operator upgrades it explicitly; the upgrade chains them in order, and
    the first owner that serves it binds it."""
    data_dir = tmp_path / "owner"
    with closing(
        open_database(ledger_path(data_dir), MIGRATIONS[:3], application=APPLICATION)
    ) as c:
        c.execute(
            "INSERT INTO policies (applied_at, toml) VALUES (0, ?)", (OwnerPolicy().to_toml(),)
        )
        for k in range(4):
            c.execute(
                "INSERT INTO charges (at, session, consumer, curator, mechanism, epsilon, delta, "
                "points, non_private) VALUES (?, ?, 'c', 'k', 'm', 0.25, 0, 1, 0)",
                (1.9e9 + k, f"s{k}"),
            )
    with pytest.raises(LedgerUpgradeRequiredError, match="dpmarket owner ledger upgrade"):
        OwnerLedger(data_dir, OwnerPolicy(), owner=LedgerOwner("o"))
    upgraded = OwnerLedger.upgrade(data_dir)
    assert (upgraded.before, upgraded.after, upgraded.charges) == (3, len(MIGRATIONS), 4)
    with OwnerLedger(data_dir, None) as ledger:
        assert ledger.identity.owner is None and ledger.identity.charges_at_creation == 4
        assert ledger.head()[0] == 4
    found = verify_file(ledger_path(data_dir))
    assert found.ok and found.charges == 4 and found.totals[0] == 1
    with OwnerLedger(data_dir, OwnerPolicy(), owner=LedgerOwner("o")) as ledger:
        charge(ledger)
        assert ledger.identity.owner == "o"
    assert verify_file(ledger_path(data_dir)).ok


# ------------------------------------------------------------------ receipts (in process)
def test_a_ledger_behind_a_receipt_it_signed_refuses_to_charge(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    data_dir = tmp_path / "alice"
    init_ledger(data_dir, "alice", security(pki, ALICE))
    alice = LedgerOwner.from_security("alice", security(pki, ALICE))
    backup = tmp_path / "backup.sqlite3"
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, session="first", epsilon=1.0, points=3)
        backup_ledger(data_dir, backup)
        charge(ledger, session="second", epsilon=2.0, points=5)
        receipt = ledger.receipt()
        ledger.check_receipt(receipt, curator="curator:curator")  # its own state: fine
    restore_ledger(data_dir, backup)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        # Control: presented nothing, the restored ledger charges on, the 2.0 forgotten.
        assert ledger.window_totals().epsilon == 1.0
        ledger.check_receipt(None, curator="curator:curator")
        with pytest.raises(LedgerRollbackError, match=ROLLBACK_MESSAGE.split("(")[0]):
            ledger.check_receipt(receipt, curator="curator:curator")
        with pytest.raises(LedgerRollbackError):  # every later charge, whoever asks
            charge(ledger, session="third", epsilon=0.1)
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(None, curator="curator:other")
        (resolved,) = ledger.resolve_rollbacks()
        assert (resolved.epsilon, resolved.points) == (2.0, 5)  # exactly what was lost
        assert ledger.window_totals().epsilon == 3.0
        ledger.check_receipt(receipt, curator="curator:curator")  # resolved: accepted
        charge(ledger, session="third", epsilon=0.1)
    assert verify_file(ledger_path(data_dir)).ok


# ------------------------------------------------------------------ backup and restore
_CHARGER = textwrap.dedent(
    """
    import sys, time
    import dpmarket.owner.ledger as module
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.policy import OwnerPolicy
    if sys.argv[3] == "wal":  # the control: the ledger as it was, charges in a -wal file
        opener = module.open_database
        module.open_database = lambda *a, **k: opener(*a, **{**k, "journal": "wal"})
    ledger = OwnerLedger(sys.argv[1], OwnerPolicy())
    for k in range(int(sys.argv[2])):
        ledger.charge(session="live", consumer="consumer:c", curator="curator:curator",
                      mechanism="raw points", epsilon=0.125, delta=1e-7, points=k)
        print(k, flush=True)
    print("charged", flush=True)
    time.sleep(600)  # mid-session: killed here
    """
)


def _charge_then_sigkill(data_dir: Path, n: int, journal: str) -> None:
    """``n`` charges in another process, killed with SIGKILL once they are committed."""
    process = subprocess.Popen(
        [sys.executable, "-c", _CHARGER, str(data_dir), str(n), journal],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline().strip() for _ in range(n + 1)]
        assert lines[-1] == "charged", lines
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize("journal", ["rollback", "wal"])
def test_no_file_beside_the_ledger_holds_a_charge_that_its_loss_would_undo(
    tmp_path: Path, journal: str
) -> None:
    """Every committed charge is in ``owner.sqlite3`` itself, even after a SIGKILL: losing or
    truncating a file beside it (a ``-wal``) cannot give a budget back in silence. Control: with
    a write-ahead log, the charges live in the ``-wal`` until a checkpoint, and the main file
    alone (the ``-wal`` deleted or truncated) holds none of them."""
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, OwnerPolicy()).close()
    _charge_then_sigkill(data_dir, 5, journal)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ledger_path(data_dir), ledger_path(alone))
    with OwnerLedger(alone, None) as copied:
        assert len(copied.entries()) == (5 if journal == "rollback" else 0)
    wal = data_dir / "owner.sqlite3-wal"
    assert wal.exists() == (journal == "wal")


def test_a_backup_round_trips_every_charge_after_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, OwnerPolicy()).close()
    n = 7
    _charge_then_sigkill(data_dir, n, "rollback")

    out = tmp_path / "backups" / "owner.sqlite3"
    result = CliRunner().invoke(
        ledger_cli, ["backup", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"{n} charges up to charge {n}" in " ".join(result.output.split())
    assert not out.with_name(out.name + "-wal").exists()  # one self-contained file
    restored = tmp_path / "restored"
    result = CliRunner().invoke(
        ledger_cli, ["restore", "--data-dir", str(restored), "--from", str(out)]
    )
    assert result.exit_code == 0, result.output
    with OwnerLedger(data_dir, None) as original, OwnerLedger(restored, None) as copy:
        assert len(original.entries()) == n
        assert copy.entries() == original.entries()
        assert copy.identity == original.identity and copy.head() == original.head()


def test_restore_moves_the_replaced_files_aside_and_refuses_another_ledger(
    tmp_path: Path,
) -> None:
    data_dir, other = tmp_path / "owner", tmp_path / "other"
    _ledger_with_charges(data_dir, 2)
    _ledger_with_charges(other, 3)
    backup = tmp_path / "other.sqlite3"
    backup_ledger(other, backup)
    with pytest.raises(ValueError, match="is a backup of ledger"):
        restore_ledger(data_dir, backup)
    with OwnerLedger(data_dir, None) as ledger:
        assert len(ledger.entries()) == 2
    ledger_path(data_dir).write_bytes(b"")  # lost: the backup of this owner's own ledger
    mine = tmp_path / "mine.sqlite3"
    _ledger_with_charges(tmp_path / "source", 4)
    backup_ledger(tmp_path / "source", mine)
    found, moved = restore_ledger(data_dir, mine)
    assert found.charges == 4 and [p.name.split(".replaced-")[0] for p in moved] == [
        "owner.sqlite3"
    ]
    assert moved[0].stat().st_size == 0  # kept, not deleted


# ------------------------------------------------------------------ running totals (round 3)
#: Two charges of epsilon 1 leave 0.5: a third is refused.
TIGHT = OwnerPolicy(epsilon_total=2.5, epsilon_per_session=2.0)
#: Edits of the file the red team made, the owner running (repro_totals.sh and variants).
LIVE_ATTACKS = {
    "append a negative charge": append_negative_charge,
    "delete totals": delete_totals,
    "lower totals": lower_totals,
    "drop last charge": drop_last_charge,
}


def _spend_two(ledger: OwnerLedger) -> None:
    charge(ledger, session="a", epsilon=1.0)
    charge(ledger, session="b", epsilon=1.0)
    with pytest.raises(OwnerBudgetError, match="epsilon over the lifetime"):
        charge(ledger, session="c", epsilon=1.0)


@pytest.mark.parametrize("attack", sorted(LIVE_ATTACKS))
def test_a_ledger_edited_while_the_owner_serves_refuses_the_next_charge(
    tmp_path: Path, attack: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The running totals deleted or lowered, or the last charge removed with its chain row,
    while the owner runs: the next charge is refused with a fixed message (no figure), nothing
    is charged, and so is every later one; the owner's log says what to do. Control: with the
    guard off, the same charge is served on the budget given back."""
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, TIGHT).close()
    with OwnerLedger(data_dir, TIGHT) as ledger:
        _spend_two(ledger)
        LIVE_ATTACKS[attack](data_dir)
        left = raw_charges(data_dir)
        with pytest.raises(LedgerTamperedError) as info:
            charge(ledger, session="c", epsilon=1.0)
        assert str(info.value) == TAMPERED_MESSAGE
        with pytest.raises(LedgerTamperedError):  # from now on, whatever is asked
            charge(ledger, session="d", epsilon=0.01)
        with pytest.raises(LedgerTamperedError):
            ledger.remaining()
    assert raw_charges(data_dir) == left
    assert "changed outside the owner" in caplog.text and "owner ledger verify" in caplog.text

    control = tmp_path / "control"
    monkeypatch.setattr(ledger_module, "ChainGuard", NoGuard)
    OwnerLedger.create(control, TIGHT).close()
    with OwnerLedger(control, TIGHT) as ledger:
        _spend_two(ledger)
        LIVE_ATTACKS[attack](control)
        charge(ledger, session="c", epsilon=1.0)  # served: the budget was given back
    assert len(raw_charges(control)) == len(left) + 1


def test_a_chained_charge_of_negative_epsilon_keeps_the_owner_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A charge of epsilon -5 appended by hand with a valid chain hash (CHECK constraints off
    for the connection; SQLite's read-only integrity check does not report it): verify and the
    owner's start refuse it. Control: without the owner's check the ledger opens with budget
    beyond its policy's total."""
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, TIGHT).close()
    with OwnerLedger(data_dir, TIGHT) as ledger:
        _spend_two(ledger)
    append_negative_charge(data_dir)
    found = verify_file(ledger_path(data_dir))
    assert [p.charge for p in found.problems] == [3], found.problems
    assert "values no charge can have (epsilon -5.0" in found.problems[0].what
    with pytest.raises(LedgerCheckError, match="charge 3 has values no charge can have"):
        OwnerLedger(data_dir, TIGHT)
    monkeypatch.setattr(ledger_module, "ChainGuard", NoGuard)
    with OwnerLedger(data_dir, TIGHT) as ledger:
        assert ledger.window_totals().epsilon == pytest.approx(2.0 - 5.0)


@pytest.mark.parametrize("attack", ["delete totals", "lower totals"])
def test_running_totals_edited_while_the_owner_is_stopped_keep_it_from_starting(
    tmp_path: Path, table: Path, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start the owner checks its totals against its charges (and the chain): the edited
    ledger is refused, saying to verify and restore. Control: without that check, the owner
    opens it with its whole budget back."""
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, TIGHT).close()
    with OwnerLedger(data_dir, TIGHT) as ledger:
        _spend_two(ledger)
    LIVE_ATTACKS[attack](data_dir)
    with pytest.raises(LedgerCheckError, match="running totals of day"):
        OwnerLedger(data_dir, TIGHT)
    code, output = _serve(data_dir, table)
    assert code == 1
    assert "does not start on it" in output and "dpmarket owner ledger verify" in output
    result = CliRunner().invoke(ledger_cli, ["--data-dir", str(data_dir)])  # owner ledger
    assert result.exit_code == 1 and "running totals of day" in result.output
    monkeypatch.setattr(ledger_module, "ChainGuard", NoGuard)
    with OwnerLedger(data_dir, TIGHT) as ledger:
        assert ledger.remaining().epsilon == 2.5


def test_charges_another_process_appends_are_taken_in_and_count(tmp_path: Path) -> None:
    """Two ledgers open on one file (two processes): each takes in the other's charges,
    checked against the chain, and the budget holds across both."""
    data_dir = tmp_path / "owner"
    OwnerLedger.create(data_dir, TIGHT).close()
    with OwnerLedger(data_dir, TIGHT) as one, OwnerLedger(data_dir, TIGHT) as two:
        charge(one, session="a", epsilon=1.0)
        charge(two, session="b", epsilon=1.0)
        charge(one, session="c", epsilon=0.5)
        for ledger in (one, two):
            with pytest.raises(OwnerBudgetError):
                charge(ledger, session="d", epsilon=0.01)
            assert ledger.window_totals().epsilon == 2.5
        assert one.receipt() is None  # (no signing key) but no refusal either


# ------------------------------------------------------------------ earlier formats (round 3)
def test_a_ledger_taken_back_to_the_previous_schema_is_upgraded_only_on_request(
    tmp_path: Path, table: Path
) -> None:
    """The red team's downgrade: identity, chain and charges dropped, schema 3. The owner
    refuses to start on it, saying to upgrade explicitly or restore; ``owner ledger upgrade``
    migrates it (a new ledger id) and records it. Control: opened as before (migrations on
    open), the file is taken in silently."""
    data_dir = tmp_path / "owner"
    _ledger_with_charges(data_dir, 3)
    downgrade(data_dir, keep=1)
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ledger_path(data_dir), ledger_path(copy))
    code, output = _serve(data_dir, table)
    assert code == 1
    assert "earlier release (schema 3" in output and "dpmarket owner ledger upgrade" in output
    assert "restore its latest backup" in output
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3  # left as found
    result = CliRunner().invoke(ledger_cli, ["upgrade", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"upgraded from schema 3 to {len(MIGRATIONS)}" in text and "a new ledger id" in text
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        (record,) = conn.execute(
            "SELECT value FROM meta WHERE key LIKE ?", (f"upgrade 3->{len(MIGRATIONS)}%",)
        )
    assert '"charges": 1' in record[0]
    with OwnerLedger(data_dir, OwnerPolicy(), owner=LedgerOwner("o")) as ledger:
        assert len(ledger.entries()) == 1  # the owner opens it now (and binds it)
    # Control: the previous behaviour, migrating on open, takes the downgraded copy in.
    open_database(ledger_path(copy), MIGRATIONS, application=APPLICATION, create=False).close()
    with OwnerLedger(copy, None) as ledger:
        assert len(ledger.entries()) == 1 and ledger.identity.charges_at_creation == 1


def _receipt_then_lose(
    pki: dict[str, Path], data_dir: Path, backup: Path
) -> tuple[LedgerOwner, object, str]:
    """Alice's ledger charged once, backed up, a receipt signed; then the file is removed and
    a new ledger created (the red team's ``rm`` + ``owner ledger init``)."""
    init_ledger(data_dir, "alice", security(pki, ALICE))
    alice = LedgerOwner.from_security("alice", security(pki, ALICE))
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, session="first", epsilon=1.0, points=3)
        backup_ledger(data_dir, backup)
        charge(ledger, session="second", epsilon=1.0, points=3)
        receipt = ledger.receipt()
        old = ledger.identity.ledger_id
    ledger_path(data_dir).unlink()
    result = CliRunner().invoke(
        ledger_cli,
        ["init", "--data-dir", str(data_dir), *identity_args(pki, ALICE)],
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "whole budget" in text and "resets what its earlier ledger charged" in text
    assert "restore that ledger's latest backup" in text
    return alice, receipt, old


def identity_args(pki: dict[str, Path], identity: Identity) -> list[str]:
    ca, cert, key = identity_files(pki["here"], identity)
    return ["--cert", str(cert), "--key", str(key), "--ca", str(ca)]


def test_a_receipt_of_the_ledger_this_one_replaced_refuses_until_the_operator_accepts_it(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    data_dir = tmp_path / "alice"
    alice, receipt, old = _receipt_then_lose(pki, data_dir, tmp_path / "backup.sqlite3")
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        assert ledger.identity.ledger_id != old
        # Control: presented nothing, the new ledger serves with the whole budget back.
        assert ledger.window_totals().epsilon == 0
        ledger.check_receipt(None, curator="curator:curator")
        with pytest.raises(LedgerRollbackError, match=ROLLBACK_MESSAGE.split("(")[0]):
            ledger.check_receipt(receipt, curator="curator:curator")  # type: ignore[arg-type]
        with pytest.raises(LedgerRollbackError):
            charge(ledger, session="third", epsilon=0.1)
        with pytest.raises(ValueError, match="--accept-replaced-ledger"):
            ledger.resolve_rollbacks()
        (resolved,) = ledger.resolve_rollbacks(accept_replaced_ledger=True)
        assert resolved.replaced_ledger == old and resolved.points == 0
        # The acceptance is a chained entry of the ledger, charging nothing.
        entry = ledger.entry(resolved.charge or 0)
        assert entry.session == f"ledger-superseded-{old}-through-{entry_sequence(receipt)}"
        assert entry.epsilon == 0
        ledger.check_receipt(receipt, curator="curator:curator")  # type: ignore[arg-type]
        charge(ledger, session="third", epsilon=0.1)


def test_restoring_over_another_ledger_records_the_ledger_it_replaces(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """Switching back to the older ledger's backup over the new one: refused unless
    --replace-other-ledger, which records the new ledger as replaced (its receipts are then
    recognised) as a chained entry charging what the new ledger spent."""
    data_dir, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    alice, _, old = _receipt_then_lose(pki, data_dir, backup)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, session="interim", epsilon=0.5)
        interim = ledger.receipt()
        new = ledger.identity.ledger_id
    with pytest.raises(ValueError, match="is a backup of ledger"):
        restore_ledger(data_dir, backup)
    result = CliRunner().invoke(
        ledger_cli,
        ["restore", "--data-dir", str(data_dir), "--from", str(backup), "--replace-other-ledger"],
    )
    assert result.exit_code == 0, result.output
    assert f"replaced ledger {new} (1 charges" in " ".join(result.output.split())
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        assert ledger.identity.ledger_id == old
        ledger.check_receipt(interim, curator="curator:curator")  # recognised: no refusal
        assert ledger.rollbacks() == []
        (entry,) = [
            e for e in ledger.entries() if e.session.startswith(f"ledger-superseded-{new}-")
        ]
    assert entry.session == f"ledger-superseded-{new}-through-{entry_sequence(interim)}"
    assert "restore --replace-other-ledger" in entry.mechanism
    assert (entry.epsilon, entry.points) == (0.5, 1)  # what the replaced ledger spent


def entry_sequence(receipt: object) -> int:
    """The charge a receipt seals the ledger at."""
    from dpmarket.v1 import privacy_pb2

    return int(privacy_pb2.LedgerState.FromString(receipt.state).sequence)  # type: ignore[attr-defined]


def test_replacing_a_ledger_behind_its_receipt_resolves_nothing(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """``restore --replace-other-ledger`` over an older copy of the ledger in place counts what
    that copy holds and resolves that ledger's receipts up to its last charge only: the
    curator's receipt of a later charge is still refused (the stranger's stale-copy reset).
    Over a copy that does not verify (emptied, its triggers dropped) it is refused and nothing
    is replaced. Control: a receipt within the copy is recognised."""
    from tests.owner.ledger_attacks import without_triggers

    data_dir, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    stale = tmp_path / "stale.sqlite3"
    alice, _, _ = _receipt_then_lose(pki, data_dir, backup)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, session="interim", epsilon=0.5)
        within = ledger.receipt()
        backup_ledger(data_dir, stale)
        charge(ledger, session="later", epsilon=0.5, points=2)
        later = ledger.receipt()
    emptied = tmp_path / "emptied"
    shutil.copytree(data_dir, emptied)
    restore_ledger(data_dir, stale)  # the older copy of the same ledger put back
    restore_ledger(data_dir, backup, replace_other=True)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        ledger.check_receipt(within, curator="curator:curator")
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(later, curator="curator:curator")
    with (
        closing(sqlite3.connect(ledger_path(emptied))) as conn,
        conn,
        without_triggers(conn, "charges_no_delete", "charge_chain_no_delete"),
    ):
        conn.execute("DELETE FROM charge_chain")
        conn.execute("DELETE FROM charges")
    for trigger in ("charges_no_delete", "charge_chain_no_delete"):
        with closing(sqlite3.connect(ledger_path(emptied))) as conn, conn:
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    with pytest.raises(ValueError, match="does not verify"):
        restore_ledger(emptied, backup, replace_other=True)


def test_a_dismissal_never_resolves_a_receipt_whose_totals_are_this_ledgers_own(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """A receipt of this ledger re-signed with a key the ledger does not list (unverified) but
    whose sealed totals open under the ledger's own key: a dismissal entry naming it, chained,
    does not resolve it, and ``resolve --dismiss-unverified-receipts`` charges back what it shows
    lost instead of dismissing it. Control: the same dismissal entry resolves a receipt whose
    totals do not open (forged)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from dpmarket.owner.ledger_resolutions import dismissal_session
    from dpmarket.owner.receipts import Signer, sign_receipt
    from dpmarket.v1 import privacy_pb2
    from tests.owner.ledger_attacks import append_entry

    data_dir, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    init_ledger(data_dir, "alice", security(pki, ALICE))
    alice = LedgerOwner.from_security("alice", security(pki, ALICE))
    stranger = Signer.from_pem(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, session="first", epsilon=1.0, points=3)
        backup_ledger(data_dir, backup)
        charge(ledger, session="second", epsilon=1.0, points=3)
        real = ledger.receipt()
    assert real is not None
    state = privacy_pb2.LedgerState.FromString(real.state)
    own = sign_receipt(stranger, state)  # unverified, its totals this ledger's
    forged_state = privacy_pb2.LedgerState()
    forged_state.CopyFrom(state)
    forged_state.sealed_totals = os.urandom(64)
    forged = sign_receipt(stranger, forged_state)  # unverified, its totals do not open
    restore_ledger(data_dir, backup)
    for receipt in (own, forged):
        append_entry(data_dir, dismissal_session(receipt.SerializeToString()), points=0)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        ledger.check_receipt(forged, curator="curator:curator")  # control: dismissed
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(own, curator="curator:curator")
        (resolution,) = ledger.resolve_rollbacks(dismiss_unverified=True)
        assert not resolution.dismissed and (resolution.epsilon, resolution.points) == (1.0, 3)
        ledger.check_receipt(own, curator="curator:curator")
