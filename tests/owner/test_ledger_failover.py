"""The ledger's resolutions and restores hold against a failover, a stale ledger, a forged
receipt, a clock set back and another owner's ledger (a stranger's red team).

Each test reproduces one attack on the owner's ledger API as the operator's commands run it,
with its control: what the attack did when the defence was off (the rule it replaced, or the
same steps on a ledger the defence does not concern).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
from contextlib import closing
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.deploy.pki import init_ca, issue, issue_all
from dpmarket.owner.cli import ledger as ledger_cli
from dpmarket.owner.ledger import (
    MIGRATIONS,
    LedgerRollbackError,
    LedgerUpgradeRequiredError,
    OwnerBudgetError,
    OwnerLedger,
    ledger_path,
)
from dpmarket.owner.ledger_admin import backup_ledger, init_ledger, restore_ledger, verify_file
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.owner.ledger_resolutions import listed_signature
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.receipts import (
    SealedTotals,
    Signer,
    public_key_der,
    public_key_fingerprint,
    seal_totals,
    sign_receipt,
)
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import privacy_pb2
from tests.owner.ledger_attacks import append_entry, before_schema_8, downgrade

ALICE, BOB = Identity("owner", "alice"), Identity("owner", "bob")
CURATOR = "curator:curator"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [ALICE, BOB])
    return root


def security(pki: Path, identity: Identity = ALICE) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki, identity))


def owner(pki: Path, identity: Identity = ALICE) -> LedgerOwner:
    return LedgerOwner.from_security(identity.name, security(pki, identity))


def charge(ledger: OwnerLedger, session: str, epsilon: float = 1.0) -> None:
    ledger.charge(
        session=session,
        consumer="consumer:c",
        curator=CURATOR,
        mechanism="Laplace relevance count",
        epsilon=epsilon,
        delta=0.0,
        points=1,
    )


def sequence(receipt: privacy_pb2.LedgerReceipt | None) -> int:
    """The charge a receipt seals its ledger at."""
    assert receipt is not None
    return int(privacy_pb2.LedgerState.FromString(receipt.state).sequence)


def accept(ledger: OwnerLedger, receipt: privacy_pb2.LedgerReceipt | None) -> None:
    """Present ``receipt`` (refused: a receipt of the other ledger), accept that ledger as
    replaced, and present it again (accepted)."""
    with pytest.raises(LedgerRollbackError):
        ledger.check_receipt(receipt, curator=CURATOR)
    (resolution,) = ledger.resolve_rollbacks(accept_replaced_ledger=True)
    assert resolution.replaced_ledger is not None
    ledger.check_receipt(receipt, curator=CURATOR)


# ------------------------------------------------------------------ 1. failover flip-flop
def test_an_acceptance_of_a_replaced_ledger_covers_its_receipts_up_to_that_one_only(
    pki: Path, tmp_path: Path
) -> None:
    """Two ledgers X and Y of one owner alternated (a failover between two disks), each
    accepting the other once: a receipt of a charge X made after Y accepted it is a new
    rollback in Y, not covered by the acceptance. Control: the receipt Y accepted still
    passes; and the unbounded acceptance entry of the earlier release (``ledger-superseded-<X>``)
    covers only the receipts of X found when it was written."""
    x_dir, y_dir = tmp_path / "x", tmp_path / "y"
    init_ledger(x_dir, "alice", security(pki))
    init_ledger(y_dir, "alice", security(pki))
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x:
        charge(x, "x1")
        x_first = x.receipt()
        x_id = x.identity.ledger_id
    with OwnerLedger(y_dir, None, owner=owner(pki)) as y:  # failover to disk Y
        accept(y, x_first)
        charge(y, "y1")
        y_first = y.receipt()
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x:  # back to disk X
        accept(x, y_first)
        charge(x, "x2")
        x_later = x.receipt()
    with OwnerLedger(y_dir, None, owner=owner(pki)) as y:  # Y again: X's later charge is lost
        y.check_receipt(x_first, curator=CURATOR)  # control
        with pytest.raises(LedgerRollbackError):
            y.check_receipt(x_later, curator=CURATOR)
        with pytest.raises(LedgerRollbackError):
            charge(y, "y2")
        (again,) = y.resolve_rollbacks(accept_replaced_ledger=True)
        entry = y.entry(again.charge or 0)
        through = sequence(x_later)
        assert entry.session == f"ledger-superseded-{x_id}-through-{through}"
        assert f"up to charge {through}" in entry.mechanism
        y.check_receipt(x_later, curator=CURATOR)
    # The earlier release's unbounded entry: bounded by the receipts found before it.
    legacy_dir = tmp_path / "legacy"
    init_ledger(legacy_dir, "alice", security(pki))
    with (
        OwnerLedger(legacy_dir, None, owner=owner(pki)) as legacy,
        pytest.raises(LedgerRollbackError),
    ):
        legacy.check_receipt(x_first, curator=CURATOR)
    append_entry(legacy_dir, f"ledger-superseded-{x_id}", points=0)
    with OwnerLedger(legacy_dir, None, owner=owner(pki)) as legacy:
        legacy.check_receipt(x_first, curator=CURATOR)
        with pytest.raises(LedgerRollbackError):
            legacy.check_receipt(x_later, curator=CURATOR)


# ------------------------------------------------------------------ 2. replacing a stale ledger
def _stale(pki: Path, tmp_path: Path) -> tuple[Path, privacy_pb2.LedgerReceipt | None, str]:
    """Alice's ledger X charged 1 epsilon, backed up, charged 2 more (a receipt of that signed),
    then the backup put back: X is stale, its receipt not presented yet. Returns X's directory,
    the receipt and X's id."""
    x_dir = tmp_path / "x"
    init_ledger(x_dir, "alice", security(pki))
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x:
        charge(x, "x1")
        backup_ledger(x_dir, tmp_path / "x-old.sqlite3")
        charge(x, "x2")
        charge(x, "x3")
        late = x.receipt()
        x_id = x.identity.ledger_id
    restore_ledger(x_dir, tmp_path / "x-old.sqlite3")
    return x_dir, late, x_id


def _new_ledger(pki: Path, tmp_path: Path) -> Path:
    """A new ledger Y of alice, as a file to restore from."""
    y_dir = tmp_path / "y"
    init_ledger(y_dir, "alice", security(pki))
    return ledger_path(y_dir)


def test_a_ledger_with_a_rollback_open_is_not_replaced_until_it_is_resolved(
    pki: Path, tmp_path: Path
) -> None:
    """The stale ledger X, found behind the curator's receipt (a rollback open), is not replaced
    by ``restore --replace-other-ledger``: its totals as found would not count the 2 epsilon it
    lost. Control: once resolved (the loss charged back into X), the restore proceeds and its
    entry charges X's whole spending, 3 epsilon."""
    x_dir, late, x_id = _stale(pki, tmp_path)
    y_file = _new_ledger(pki, tmp_path)
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x, pytest.raises(LedgerRollbackError):
        x.check_receipt(late, curator=CURATOR)
    assert verify_file(ledger_path(x_dir)).open_rollbacks == 1
    with pytest.raises(ValueError, match=r"rollback.s. open.*dpmarket owner ledger resolve"):
        restore_ledger(x_dir, y_file, replace_other=True)
    assert verify_file(ledger_path(x_dir)).identity.ledger_id == x_id  # type: ignore[union-attr]
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x:
        x.resolve_rollbacks()
    restore_ledger(x_dir, y_file, replace_other=True)
    with OwnerLedger(x_dir, None, owner=owner(pki)) as y:
        assert y.identity.ledger_id != x_id
        assert y.window_totals().epsilon == pytest.approx(3.0)
        y.check_receipt(late, curator=CURATOR)


def test_accepting_a_receipt_beyond_a_replaced_stale_ledger_charges_what_it_shows(
    pki: Path, tmp_path: Path
) -> None:
    """The stale ledger X (1 of its 3 epsilon), not yet found behind the receipt, replaced by a
    new ledger Y: the receipt of X's third charge stops Y, and ``resolve
    --accept-replaced-ledger`` charges the 2 epsilon it shows beyond what the restore counted
    (Y keeps X's sealing key). Control: an acceptance in a ledger that does not hold X's key (a
    new ledger, no restore) charges nothing, as before."""
    x_dir, late, _ = _stale(pki, tmp_path)
    control = tmp_path / "control"
    shutil.copytree(x_dir, control)
    restore_ledger(x_dir, _new_ledger(pki, tmp_path), replace_other=True)
    with OwnerLedger(x_dir, None, owner=owner(pki)) as y:
        assert y.window_totals().epsilon == pytest.approx(1.0)  # X as found
        with pytest.raises(LedgerRollbackError):
            y.check_receipt(late, curator=CURATOR)
        (resolution,) = y.resolve_rollbacks(accept_replaced_ledger=True)
        assert resolution.counted_replaced
        assert (resolution.epsilon, resolution.points) == (pytest.approx(2.0), 2)
        assert y.window_totals().epsilon == pytest.approx(3.0)  # all X spent stays spent
        y.check_receipt(late, curator=CURATOR)
    bare = tmp_path / "bare"
    init_ledger(bare, "alice", security(pki))
    with OwnerLedger(bare, None, owner=owner(pki)) as z:
        with pytest.raises(LedgerRollbackError):
            z.check_receipt(late, curator=CURATOR)
        (resolution,) = z.resolve_rollbacks(accept_replaced_ledger=True)
        assert not resolution.counted_replaced and resolution.epsilon == 0


@pytest.mark.parametrize("replacements", [1, 2], ids=["control-two-ledgers", "three-ledgers"])
def test_a_chain_of_restores_keeps_every_replaced_ledgers_key_and_count(
    pki: Path, tmp_path: Path, replacements: int
) -> None:
    """The stale ledger X (1 of its 3 epsilon) replaced by a new ledger Y, and Y by Z (each
    ``restore --replace-other-ledger``): the receipt of X's third charge, accepted in Z,
    charges the 2 epsilon it shows beyond what was counted (Z keeps X's key, carried over from
    Y with what Y counted of X), never the 1 counted twice. Control: one replacement (Y only),
    as it was. Before the carry-over, Z kept only Y's key and the acceptance charged nothing."""
    x_dir, late, x_id = _stale(pki, tmp_path)
    for name in ("y", "z")[:replacements]:
        new = tmp_path / name
        init_ledger(new, "alice", security(pki))
        restore_ledger(x_dir, ledger_path(new), replace_other=True)
    with OwnerLedger(x_dir, None, owner=owner(pki)) as last:
        assert last.window_totals().epsilon == pytest.approx(1.0)  # X as found
        superseded = [e.session for e in last.entries() if e.session.startswith("ledger-sup")]
        assert f"ledger-superseded-{x_id}-through-1" in superseded
        with pytest.raises(LedgerRollbackError):
            last.check_receipt(late, curator=CURATOR)
        (resolution,) = last.resolve_rollbacks(accept_replaced_ledger=True)
        assert resolution.counted_replaced and resolution.replaced_ledger == x_id
        assert resolution.epsilon == pytest.approx(2.0)
        assert last.window_totals().epsilon == pytest.approx(3.0)  # all X spent, once
        last.check_receipt(late, curator=CURATOR)
    assert verify_file(ledger_path(x_dir)).ok


def test_a_ledger_of_the_previous_schema_opens_and_keeps_its_supersessions(
    pki: Path, tmp_path: Path
) -> None:
    """A ledger of schema 7 (no ``replaced_ledgers``) that replaced a stale X by restore: the
    owner migrates it on open (to this build's schema), it verifies, its restore entry still
    resolves X's receipts up to X's charge found, and accepting a later one charges nothing
    (X's key was not kept then): the loss on record, as that release did."""
    x_dir, late, x_id = _stale(pki, tmp_path)
    with OwnerLedger(x_dir, None, owner=owner(pki)) as x:
        within = x.receipt()
    restore_ledger(x_dir, _new_ledger(pki, tmp_path), replace_other=True)
    with closing(sqlite3.connect(ledger_path(x_dir))) as conn, conn:
        before_schema_8(conn)
        conn.execute("PRAGMA user_version = 7")
    with OwnerLedger(x_dir, None, owner=owner(pki)) as y:
        y.check_receipt(within, curator=CURATOR)
        with pytest.raises(LedgerRollbackError):
            y.check_receipt(late, curator=CURATOR)
        (resolution,) = y.resolve_rollbacks(accept_replaced_ledger=True)
        assert resolution.replaced_ledger == x_id and resolution.epsilon == 0
    with closing(sqlite3.connect(ledger_path(x_dir))) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    found = verify_file(ledger_path(x_dir))
    assert not found.problems and found.open_rollbacks == 0


# ------------------------------------------------------------------ 5. another owner's ledger
def test_a_ledger_of_another_owner_is_never_restored_over_this_owners(
    pki: Path, tmp_path: Path
) -> None:
    """``restore --replace-other-ledger --from`` Bob's ledger into Alice's directory is refused,
    nothing changed: restoring Alice's own back would otherwise charge Bob's lifetime spending
    into her ledger. Control: a ledger of Alice's own is restored over it."""
    a_dir, b_dir = tmp_path / "alice", tmp_path / "bob"
    init_ledger(a_dir, "alice", security(pki))
    init_ledger(b_dir, "bob", security(pki, BOB))
    with OwnerLedger(b_dir, None, owner=owner(pki, BOB)) as bob:
        charge(bob, "b1", epsilon=1.5)
    before = verify_file(ledger_path(a_dir))
    with pytest.raises(ValueError, match=r"ledger of owner bob.*never restored over another"):
        restore_ledger(a_dir, ledger_path(b_dir), replace_other=True)
    after = verify_file(ledger_path(a_dir))
    assert after.identity == before.identity and after.totals == before.totals
    assert sorted(p.name for p in a_dir.iterdir() if "replaced" in p.name) == []
    restore_ledger(a_dir, _new_ledger(pki, tmp_path), replace_other=True)  # control


# ------------------------------------------------------------------ 4. a forged "genuine" receipt
def _listed_signature_rule(
    conn: sqlite3.Connection,
    receipt: bytes,
    *,
    ledger_id: str,
    key: bytes,
    keys: dict[str, bytes],
) -> bool:
    """The rule this one replaced: a receipt is genuine when a key the ledger lists signed it."""
    return listed_signature(receipt, keys)


def _list_key(data_dir: Path, cert_pem: bytes) -> None:
    """List a certificate's key in the ledger, as a release before this one did for the
    certificate a curator presented with a receipt whose totals opened."""
    der = public_key_der(x509.load_pem_x509_certificate(cert_pem).public_key())  # type: ignore[arg-type]
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        conn.execute(
            "INSERT INTO ledger_keys (fingerprint, public_key, added_at) VALUES (?, ?, 2e9)",
            (public_key_fingerprint(der), der),
        )


@pytest.mark.parametrize("defence", [True, False], ids=["seal-decides", "control-listed-key"])
def test_a_ca_key_holder_neither_gets_its_key_listed_nor_locks_the_owner_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defence: bool
) -> None:
    """The stranger's two steps, by a curator holding the CA's key. (1) After a real rollback
    (a backup restored, 2 epsilon lost), it re-signs its genuine receipt's state (totals sealed
    by the owner) with a fresh CA-issued certificate named ``alice``: the receipt is genuine by
    its seal, charged back (2 epsilon), and the forger's key is not listed. (2) It signs a
    receipt of its own (charge 999, random head and totals) with that key, listed in the ledger
    as a release before this one listed it: the seal does not open, so the receipt is
    unverified and dismissed on record, nothing charged. Control (the rule this one replaced: a
    listed key's signature makes a receipt genuine): ``resolve`` refuses it with every option,
    and the owner serves nothing."""
    if not defence:
        monkeypatch.setattr("dpmarket.owner.ledger.receipt_genuine", _listed_signature_rule)
        monkeypatch.setattr(
            "dpmarket.owner.ledger_resolutions.receipt_genuine", _listed_signature_rule
        )
    root = tmp_path / "pki"
    init_ca(root)
    issue_all(root, [ALICE])
    alice = owner(root)
    data_dir, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    init_ledger(data_dir, "alice", security(root))
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        charge(ledger, "a1")
        backup_ledger(data_dir, backup)
        keys_before = set(ledger.identity.keys)
        charge(ledger, "a2")
        charge(ledger, "a3")
        genuine = ledger.receipt()
        assert genuine is not None
    restore_ledger(data_dir, backup)  # the real rollback: 2 epsilon lost
    issue(root, "owner", "alice", force=True)  # the forger's CA-issued "alice"
    forger = security(root)
    sign = Signer.from_pem(forger.key_pem or b"")
    replayed = privacy_pb2.LedgerReceipt(state=genuine.state, signature=sign.sign(genuine.state))
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(replayed, curator=CURATOR, certificate=forger.cert_pem)
        assert set(ledger.identity.keys) == keys_before  # (1) never listed from a receipt
        if defence:
            (charged,) = ledger.resolve_rollbacks()
            assert not charged.dismissed and charged.epsilon == pytest.approx(2.0)
            assert ledger.window_totals().epsilon == pytest.approx(3.0)
            ledger.check_receipt(replayed, curator=CURATOR)
    if not defence:
        _list_key(data_dir, forger.cert_pem or b"")  # what the earlier rule did at step (1)
        with OwnerLedger(data_dir, None, owner=alice) as ledger:
            ledger.resolve_rollbacks()
            ledger.check_receipt(replayed, curator=CURATOR)
    else:
        _list_key(data_dir, forger.cert_pem or b"")  # listed by an earlier release
    state = privacy_pb2.LedgerState.FromString(genuine.state)
    state.sequence, state.head, state.sealed_totals = 999, os.urandom(32), os.urandom(60)
    forged = sign_receipt(sign, state)
    with OwnerLedger(data_dir, None, owner=alice) as ledger:
        with pytest.raises(LedgerRollbackError):
            ledger.check_receipt(forged, curator=CURATOR, certificate=forger.cert_pem)
        if not defence:  # locked out: no option resolves it
            for options in ({}, {"dismiss_unverified": True}, {"accept_replaced_ledger": True}):
                with pytest.raises(ValueError, match="rollback"):
                    ledger.resolve_rollbacks(**options)
            with pytest.raises(LedgerRollbackError):
                charge(ledger, "a4")
            return
        with pytest.raises(ValueError, match="--dismiss-unverified-receipts"):
            ledger.resolve_rollbacks()
        (dismissal,) = ledger.resolve_rollbacks(dismiss_unverified=True)
        assert dismissal.dismissed and dismissal.epsilon == 0
        ledger.check_receipt(forged, curator=CURATOR)
        charge(ledger, "a4")
        assert ledger.window_totals().epsilon == pytest.approx(4.0)


def test_a_receipt_of_an_earlier_release_re_signed_by_another_key_owes_its_whole_totals(
    pki: Path, tmp_path: Path
) -> None:
    """A receipt sealed by an earlier release (the seal does not cover its signing time),
    re-signed by a key the ledger does not list with its time moved later: the time is not
    read, and the charge-back owes its whole sealed totals (never less than lost). Control: the
    same receipt signed by the owner's listed key owes only what the restore lost."""
    data_dir, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    init_ledger(data_dir, "alice", security(pki))
    with OwnerLedger(data_dir, None, owner=owner(pki)) as ledger:
        charge(ledger, "a1")
        backup_ledger(data_dir, backup)
        charge(ledger, "a2")
        state = privacy_pb2.LedgerState.FromString(ledger.receipt().state)  # type: ignore[union-attr]
        key = bytes(
            ledger.read(lambda c: c.execute("SELECT seal_key FROM ledger_identity").fetchone()[0])
        )
    state.sealed_totals = seal_totals(  # v1: the time not sealed
        key,
        SealedTotals(Fraction(2), Fraction(0), 2),
        ledger_id=state.ledger_id,
        sequence=state.sequence,
        head=bytes(state.head),
    )
    state.signed_at += 10 * 86_400  # a time moved later would count later charges as shared
    stranger = Signer(ec.generate_private_key(ec.SECP256R1()))
    for signer, owes in ((stranger, 2.0), (Signer.from_pem(security(pki).key_pem or b""), 1.0)):
        shutil.rmtree(data_dir)
        restore_ledger(data_dir, backup)
        with OwnerLedger(data_dir, None, owner=owner(pki)) as ledger:
            with pytest.raises(LedgerRollbackError):
                ledger.check_receipt(sign_receipt(signer, state), curator=CURATOR)
            (charged,) = ledger.resolve_rollbacks()
            assert charged.epsilon == pytest.approx(owes)


# ------------------------------------------------------------------ 3. a clock set back
def test_a_clock_set_back_does_not_move_a_charge_out_of_a_rolling_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Window of one day, 4 epsilon; 3 spent, then the owner's clock set two days back: the
    charge of the last 1 epsilon is stamped at the latest charge's time (not two days
    earlier), with a warning that the clock is behind; once the clock is fixed the window
    still counts it and refuses 1 more. Control: stamped with the clock as it was (the red
    team's run), the charge falls out of the window once the clock is fixed, and 1 more
    passes: 5 epsilon within one real day against 4."""
    now = [1.8e9]
    policy = OwnerPolicy(epsilon_total=4.0, epsilon_per_session=4.0, window_days=1)

    def run(data_dir: Path, *, monotone: bool) -> tuple[float, float]:
        """The second charge's stamp, and the epsilon charged within one real day."""
        now[0] = 1.8e9
        init_ledger(data_dir, "o", TransportSecurity.plaintext())
        with OwnerLedger(data_dir, policy, clock=lambda: now[0]) as ledger:
            if not monotone:  # the defence off: the clock as it is
                ledger._now = lambda: float(now[0])  # type: ignore[method-assign]
            charge(ledger, "s1", epsilon=3.0)
            now[0] -= 2 * 86_400  # the clock set back two days
            charge(ledger, "s2", epsilon=1.0)
            now[0] += 2 * 86_400 + 60  # the clock fixed, a minute later
            with contextlib.suppress(OwnerBudgetError):
                charge(ledger, "s3", epsilon=1.0)
            entries = ledger.entries()
        return entries[1].at, sum(e.epsilon for e in entries)

    caplog.set_level(logging.WARNING)
    assert run(tmp_path / "o", monotone=True) == (1.8e9, 4.0)  # the third refused
    assert "behind the ledger's latest charge" in caplog.text
    assert run(tmp_path / "c", monotone=False) == (1.8e9 - 2 * 86_400, 5.0)  # control


# ------------------------------------------------------------------ a clock set ahead
@pytest.mark.parametrize("defence", [True, False], ids=["window-from-clock", "control-stamp"])
def test_a_clock_set_ahead_then_fixed_counts_every_charge_in_the_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, defence: bool
) -> None:
    """Window of one day, 23 epsilon; 19 spent in the last hour. Within one process, the clock
    set 1.1 days ahead is found against the monotonic clock: the window still counts the 19, and
    5 more are refused (a warning says the clock jumped). Across a restart the jump is not known:
    5 are charged (stamped in the future); once the clock is fixed the window counts the 19 and
    the 5 (24 of 23), and 3 more are refused. Control (the window summed at the latest charge's
    stamp, the rule this one replaced): 3 more charged once the clock is fixed, the window
    showing 8 of 23: 27 epsilon within one real hour."""
    now, tick = [1.8e9], [0.0]
    policy = OwnerPolicy(epsilon_total=23.0, epsilon_per_session=23.0, window_days=1)
    init_ledger(tmp_path, "o", TransportSecurity.plaintext())

    def opened(*, monotonic: bool) -> OwnerLedger:
        ledger = OwnerLedger(
            tmp_path,
            policy,
            clock=lambda: now[0],
            monotonic=(lambda: tick[0]) if monotonic else None,
        )
        if not defence:
            ledger._window_end = ledger._now  # type: ignore[method-assign]
        return ledger

    caplog.set_level(logging.WARNING)
    with opened(monotonic=True) as ledger:
        charge(ledger, "s1", epsilon=19.0)
        now[0] += 1.1 * 86_400  # the clock set ahead; a second passes
        tick[0] += 1.0
        if defence:
            with pytest.raises(OwnerBudgetError):
                charge(ledger, "s2", epsilon=5.0)
            assert "jumped" in caplog.text
    with opened(monotonic=False) as ledger:  # restarted: the jump is not known
        charge(ledger, "s2", epsilon=5.0)
        now[0] -= 1.1 * 86_400 - 60  # the clock fixed, a minute after the first charge
        if defence:
            with pytest.raises(OwnerBudgetError):
                charge(ledger, "s3", epsilon=3.0)
            assert ledger.window_totals().epsilon == pytest.approx(24.0)
        else:
            charge(ledger, "s3", epsilon=3.0)
            assert ledger.window_totals().epsilon == pytest.approx(8.0)
        assert sum(e.epsilon for e in ledger.entries()) == pytest.approx(24.0 if defence else 27.0)


# ------------------------------------------------------------------ a backup of schema 7
def test_a_backup_of_an_earlier_schema_verifies_and_restores_through_a_migrated_copy(
    pki: Path, tmp_path: Path
) -> None:
    """A backup taken at schema 7 (what the owner migrates on start): ``verify --file`` and
    ``restore --from`` migrate a temporary copy (the backup file itself is never written), and
    the restored ledger is at this build's schema with the backup's charges. (They refused it
    before, saying to upgrade or restore it.) Control: a file from before the chain (schema 3)
    is still refused, with what to do."""
    source, backup = tmp_path / "alice", tmp_path / "backup.sqlite3"
    init_ledger(source, "alice", security(pki))
    with OwnerLedger(source, None, owner=owner(pki)) as ledger:
        charge(ledger, "a1", epsilon=1.5)
        x_id = ledger.identity.ledger_id
    backup_ledger(source, backup)
    with closing(sqlite3.connect(backup)) as conn, conn:
        before_schema_8(conn)
        conn.execute("PRAGMA user_version = 7")
    kept = backup.read_bytes()
    found = verify_file(backup)
    assert found.ok and found.charges == 1 and found.identity.ledger_id == x_id  # type: ignore[union-attr]
    data_dir = tmp_path / "restored"
    restored, _ = restore_ledger(data_dir, backup)
    assert restored.ok and restored.totals[0] == pytest.approx(1.5)
    assert backup.read_bytes() == kept  # the backup untouched
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    with OwnerLedger(data_dir, None, owner=owner(pki)) as ledger:
        assert ledger.window_totals().epsilon == pytest.approx(1.5)
    downgrade(source)  # control: schema 3, before the identity and chain
    with pytest.raises(LedgerUpgradeRequiredError, match="owner ledger upgrade --data-dir"):
        verify_file(ledger_path(source))


# ------------------------------------------------------------------ a foreign ledger, empty dir
def test_another_owners_ledger_is_not_restored_into_an_empty_data_directory(
    pki: Path, tmp_path: Path
) -> None:
    """Bob's backup restored into an empty data directory of Alice's: refused when the owner is
    known, by her certificate (``--pki-dir``/``--name``, as ``--config`` gives them) or by the
    ledger a restore moved aside there; nothing written. Control: the same restore with her own
    backup proceeds, and without a known owner Bob's is taken (nothing tells whose directory
    it is)."""
    a_dir, b_dir = tmp_path / "alice", tmp_path / "bob"
    init_ledger(a_dir, "alice", security(pki))
    init_ledger(b_dir, "bob", security(pki, BOB))
    a_backup, b_backup = tmp_path / "a.sqlite3", tmp_path / "b.sqlite3"
    backup_ledger(a_dir, a_backup)
    backup_ledger(b_dir, b_backup)
    empty = tmp_path / "empty"
    as_alice = ["--pki-dir", str(pki), "--name", "alice"]
    refused = CliRunner().invoke(
        ledger_cli, ["restore", "--data-dir", str(empty), "--from", str(b_backup), *as_alice]
    )
    assert refused.exit_code != 0 and "ledger of owner 'bob'" in refused.output
    assert not ledger_path(empty).exists()
    restored = CliRunner().invoke(  # control: her own
        ledger_cli, ["restore", "--data-dir", str(empty), "--from", str(a_backup), *as_alice]
    )
    assert restored.exit_code == 0, restored.output
    # Known from the directory: Alice's ledger moved aside by a restore, none in place.
    restore_ledger(empty, a_backup)
    ledger_path(empty).unlink()
    with pytest.raises(ValueError, match=r"was of owner alice.*nothing was restored"):
        restore_ledger(empty, b_backup)
    assert not ledger_path(empty).exists()
    unknown = tmp_path / "unknown"  # control: no owner known, Bob's is taken
    restore_ledger(unknown, b_backup)
    assert verify_file(ledger_path(unknown)).identity.owner == "bob"  # type: ignore[union-attr]
