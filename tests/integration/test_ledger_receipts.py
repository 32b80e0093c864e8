"""A ledger restored from an older copy is found by the receipts its owner signed.

A real owner service (its servicer on a grpc.aio server over mTLS, in this process, with the
deployment's certificates) and the curator's real owner client and store: the owner signs a
receipt of its ledger at every CloseSession, the curator keeps the last one durably and presents
it at the next OpenSession. The owner's ledger is then restored from a backup taken before the
last session (``dpmarket owner ledger backup`` / ``restore``): without a receipt the owner serves
on with the lost charges forgotten (the control); with the curator's receipt it refuses, with a
fixed message, until its operator resolves it, which charges exactly what was lost. A forged
receipt, one of another ledger, or bytes that are no receipt change nothing the owner does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.curator.owners import GrpcOwnerEndpoint
from dpmarket.curator.store import CuratorStore
from dpmarket.deploy.pki import init_ca, issue, issue_all
from dpmarket.owner import ledger as ledger_module
from dpmarket.owner.cli import ledger as ledger_cli
from dpmarket.owner.ledger import (
    MIGRATIONS,
    ROLLBACK_MESSAGE,
    TAMPERED_MESSAGE,
    LedgerCheckError,
    LedgerUpgradeRequiredError,
    OwnerLedger,
    ledger_path,
)
from dpmarket.owner.ledger_admin import backup_ledger, init_ledger, restore_ledger, verify_file
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.receipts import Signer, sign_receipt
from dpmarket.owner.service import OwnerServicer, owner_authorizer
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import owner_pb2, owner_pb2_grpc, privacy_pb2
from tests.owner.ledger_attacks import (
    NoGuard,
    append_entry,
    before_schema_8,
    delete_totals,
    downgrade,
    mark_rollbacks_resolved,
    old_rule_open,
    old_rule_resolved,
    raw_charges,
    without_triggers,
    write_superseded_row,
)

pytestmark = pytest.mark.integration

CURATOR = Identity("curator", "curator")
OWNER = Identity("owner", "owner-0")
N_FEATURES = 4


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [CURATOR, OWNER])
    return root


def _security(pki: Path, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki, identity))


class Deployment:
    """One owner (its data directory and ledger, bound to its certificate) and the curator's
    store, with a clock that only moves forward (shared by every ledger opened)."""

    def __init__(self, pki: Path, root: Path) -> None:
        self.pki = pki
        self.data_dir = root / "owner-0"
        self.store = CuratorStore(root / "curator")
        self.security = _security(pki, OWNER)
        ticks = itertools.count(1)
        self.clock: Callable[[], float] = lambda: 1.9e9 + next(ticks)
        init_ledger(self.data_dir, OWNER.name, self.security)
        self.points = PointSet(np.random.default_rng(0).random((30, N_FEATURES)), None, "o")

    def ledger(self) -> OwnerLedger:
        owner = LedgerOwner.from_security(OWNER.name, self.security)
        return OwnerLedger(self.data_dir, None, owner=owner, clock=self.clock)

    def run(
        self,
        script: Callable[[GrpcOwnerEndpoint, GrpcOwnerEndpoint], Awaitable[Any]],
    ) -> Any:
        """Serve the owner (its ledger opened now) and run ``script(with_receipts,
        without_receipts)``: two curator clients, one keeping and presenting receipts through
        the store, one that presents none (the defence off)."""

        async def main() -> Any:
            ledger = self.ledger()
            owner = Owner(OWNER.name, self.points, ledger=ledger)
            authorizer = owner_authorizer((CURATOR.name,), self.security)

            def register(server: Any) -> None:
                owner_pb2_grpc.add_OwnerServiceServicer_to_server(
                    OwnerServicer(owner, authorizer), server
                )

            service = owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].full_name
            server, port, _ = await start_server(register, service, "127.0.0.1:0", self.security)
            curator = _security(self.pki, CURATOR)
            target = f"127.0.0.1:{port}"
            keeping = GrpcOwnerEndpoint(target, curator, OWNER, deadline=20, receipts=self.store)
            plain = GrpcOwnerEndpoint(target, curator, OWNER, deadline=20)
            try:
                return await script(keeping, plain)
            finally:
                await keeping.close()
                await plain.close()
                await server.stop(None)
                ledger.close()

        return asyncio.run(main())


@pytest.fixture
def deployment(pki: Path, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(pki, tmp_path)
    yield d
    d.store.close()


_session_ids = (f"session-{k:04d}-{os.urandom(8).hex()}" for k in itertools.count())


async def session(endpoint: GrpcOwnerEndpoint, points: int = 2) -> str:
    """A uniform-sampling session: open, draw ``points`` points (charged), close."""
    sid = next(_session_ids)
    rff = draw_rff_params(N_FEATURES, 8, 0.5, np.random.default_rng(1))
    await endpoint.open_session(
        sid, rff, 0, consumer="consumer:c", terms=OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
    )
    await endpoint.sample_uniform(sid, points)
    await endpoint.close_session(sid)
    return sid


def charges(d: Deployment) -> list[tuple[str, int]]:
    with OwnerLedger(d.data_dir, None) as ledger:
        return [(e.session, e.points) for e in ledger.entries()]


@pytest.mark.parametrize("guarded", [True, False])
def test_a_close_before_any_open_returns_no_receipt_that_would_hide_a_rollback(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """The owner restarted on an older copy of its ledger, and the curator closes a session the
    owner answers from its ledger (as its settlement retry does) before it opens any: the close
    returns no receipt, so the curator keeps the one that shows the rollback, and the next open
    is refused. Control (a close signs a receipt whatever was checked, as before): that receipt
    replaces the curator's, and the rolled-back ledger is served from then on (a stranger's
    silent budget reset: a chain rewritten while the owner was stopped)."""
    d = deployment
    backup = tmp_path / "backup.sqlite3"
    if not guarded:
        monkeypatch.setattr(OwnerLedger, "close_receipt", OwnerLedger.receipt)

    async def two(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> str:
        first = await session(keeping)
        await asyncio.to_thread(backup_ledger, d.data_dir, backup)
        await session(keeping)
        return first

    first = d.run(two)
    restore_ledger(d.data_dir, backup)  # the second session's charge lost
    d.run(lambda keeping, _: keeping.close_session(first))
    if guarded:
        with pytest.raises(FailedPreconditionError, match=ROLLBACK_MESSAGE.split("(")[0][:40]):
            d.run(lambda keeping, _: session(keeping))
    else:
        d.run(lambda keeping, _: session(keeping))  # served on the rolled-back ledger


def test_a_ledger_restored_from_an_older_copy_is_refused_until_resolved(
    deployment: Deployment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = deployment
    backup = tmp_path / "backups" / "owner-0.sqlite3"

    async def two_sessions_and_a_backup_between(
        keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint
    ) -> tuple[str, str]:
        first = await session(keeping)
        await asyncio.to_thread(backup_ledger, d.data_dir, backup)  # while the owner serves
        return first, await session(keeping)

    first, second = d.run(two_sessions_and_a_backup_between)
    held = d.store.owner_receipt(OWNER.name)
    assert held is not None  # the curator keeps the owner's last receipt, durably
    state = privacy_pb2.LedgerState.FromString(privacy_pb2.LedgerReceipt.FromString(held).state)
    assert state.sequence == 2
    assert charges(d) == [(first, 2), (second, 2)]
    restore_ledger(d.data_dir, backup)  # the older copy: the second session's charge is gone
    assert charges(d) == [(first, 2)]

    # Control (the defence off): a curator that presents no receipt is served by the restored
    # ledger, which has forgotten the second session's charge.
    forgotten = d.run(lambda _, plain: session(plain))
    assert charges(d) == [(first, 2), (forgotten, 2)]

    # The curator's receipt (up to the second session's charge) shows the rollback: refused,
    # with a fixed message, nothing charged; the owner's console says what to do.
    caplog.set_level(logging.ERROR, logger="owner.ledger")

    async def refused(keeping: GrpcOwnerEndpoint, plain: GrpcOwnerEndpoint) -> list[str]:
        messages = []
        for endpoint in (keeping, plain):  # once found, refused to every curator
            with pytest.raises(FailedPreconditionError) as info:
                await session(endpoint)
            messages.append(str(info.value))
        return messages

    for message in d.run(refused):
        assert ROLLBACK_MESSAGE in message
        assert "epsilon" not in message and "points" not in message  # no budget figure
    assert charges(d) == [(first, 2), (forgotten, 2)]
    assert "dpmarket owner ledger resolve --data-dir" in caplog.text

    # The operator resolves it: what the receipt shows was lost (the second session's two
    # points) is charged again, and the owner serves the curator's receipt from then on.
    with OwnerLedger(d.data_dir, None, clock=d.clock) as ledger:
        (resolution,) = ledger.resolve_rollbacks()
    assert (resolution.points, resolution.epsilon, resolution.receipt_sequence) == (2, 0.0, 2)
    after = d.run(lambda keeping, _: session(keeping))
    lost = f"ledger-rollback-{state.sequence}-{state.head.hex()}"  # names the receipt
    assert charges(d) == [(first, 2), (forgotten, 2), (lost, 2), (after, 2)]


# ------------------------------------------------------------------------ forged receipts
def _state(d: Deployment, sequence: int, ledger_id: str | None = None) -> privacy_pb2.LedgerState:
    with OwnerLedger(d.data_dir, None) as ledger:
        identity = ledger.identity
    return privacy_pb2.LedgerState(
        ledger_id=ledger_id or identity.ledger_id,
        owner=OWNER.name,
        sequence=sequence,
        head=os.urandom(32),
        signed_at=2e9,
    )


def _present(receipt: privacy_pb2.LedgerReceipt) -> Callable[..., Awaitable[Any]]:
    """A script whose curator presents ``receipt`` at the next OpenSession (as a curator that
    lies would: it controls what it stores), then runs one session."""

    async def script(keeping: GrpcOwnerEndpoint, plain: GrpcOwnerEndpoint) -> str:
        assert keeping.receipts is not None
        keeping.receipts.record_owner_receipt(OWNER.name, receipt.SerializeToString())
        return await session(keeping)

    return script


def test_a_forged_receipt_only_makes_the_owner_wait_for_its_operator(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """A receipt that no key of the ledger verifies changes nothing when it names another owner
    or is no receipt. One that names this owner is refused until the operator resolves it
    (issue 25, B1: ignoring it hid a rollback behind a rotated key): a lying curator can make
    the owner wait (as it can by not calling it), never charge it or hide a rollback."""
    d = deployment
    d.run(lambda keeping, _: session(keeping))
    curator_key = Signer.from_pem(_security(d.pki, CURATOR).key_pem or b"")
    owner_key = Signer.from_pem(d.security.key_pem or b"")
    caplog.set_level(logging.WARNING, logger="owner.ledger")
    other_owner = _state(d, 99)
    other_owner.owner = "owner-9"
    ignored = [
        sign_receipt(curator_key, other_owner),
        privacy_pb2.LedgerReceipt(state=b"\x01\x02 not a state", signature=b"not a signature"),
    ]
    for receipt in ignored:
        d.run(_present(receipt))
    assert len(charges(d)) == 1 + len(ignored)
    assert "did not sign" in caplog.text
    with OwnerLedger(d.data_dir, None) as ledger:
        assert ledger.rollbacks() == []
    # Signed by the curator's key, naming this owner 'far ahead': refused, nothing charged.
    forged = sign_receipt(curator_key, _state(d, 99))
    with pytest.raises(FailedPreconditionError, match="behind a receipt it signed"):
        d.run(_present(forged))
    assert len(charges(d)) == 1 + len(ignored)
    assert "--dismiss-unverified-receipts" in caplog.text
    resolve = ["resolve", "--data-dir", str(d.data_dir)]
    refused = CliRunner().invoke(ledger_cli, resolve)  # its totals do not open: not charged
    assert refused.exit_code == 1 and "--dismiss-unverified-receipts" in refused.output
    dismissed = CliRunner().invoke(ledger_cli, [*resolve, "--dismiss-unverified-receipts"])
    assert dismissed.exit_code == 0, dismissed.output
    assert "dismissed on record: nothing charged" in " ".join(dismissed.output.split())
    d.run(_present(forged))  # dismissed on record (a chained entry of 0): served
    assert [p for _, p in charges(d)] == [2] * (1 + len(ignored)) + [0, 2]

    # Control: the same state signed with the owner's own key is a receipt it signed, and the
    # ledger is behind it: refused, nothing charged.
    with pytest.raises(FailedPreconditionError, match="behind a receipt it signed"):
        d.run(_present(sign_receipt(owner_key, _state(d, 99))))
    assert len(charges(d)) == 3 + len(ignored)


# ------------------------------------------------------------------ round 3: running totals, schema
#: Two sessions of two points fit, a third does not.
TWO_SESSIONS = OwnerPolicy(points_total=4, points_per_session=2)


def _refused(endpoint_of: str) -> Callable[..., Awaitable[str]]:
    async def script(keeping: GrpcOwnerEndpoint, plain: GrpcOwnerEndpoint) -> str:
        with pytest.raises(FailedPreconditionError) as info:
            await session(keeping if endpoint_of == "keeping" else plain)
        return str(info.value)

    return script


def test_running_totals_deleted_while_the_owner_serves_refuse_its_next_session(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's repro_totals.sh: the owner serving, ``DELETE FROM charge_totals``. The
    next session is refused with a fixed message and nothing is charged; restarted, the owner
    does not open its ledger. Control: with the owner's guard off, the deletion gives the
    budget back and the session is served."""
    d = deployment
    OwnerLedger(d.data_dir, TWO_SESSIONS).close()  # recorded: the policy in force

    async def spend_then_delete(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> str:
        await session(keeping)
        await session(keeping)
        with pytest.raises(FailedPreconditionError, match="0 raw points"):  # spent
            await session(keeping)
        await asyncio.to_thread(delete_totals, d.data_dir)
        with pytest.raises(FailedPreconditionError) as info:
            await session(keeping)
        return str(info.value)

    message = d.run(spend_then_delete)
    assert TAMPERED_MESSAGE in message
    assert "points" not in message.replace(TAMPERED_MESSAGE, "")  # no budget figure
    assert len(raw_charges(d.data_dir)) == 2
    assert "owner ledger verify" in caplog.text
    with pytest.raises(LedgerCheckError, match="running totals"):  # a restart
        d.run(lambda keeping, _: session(keeping))


def test_running_totals_deleted_are_a_reset_budget_without_the_guard(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control of the test above: the owner as it was (totals read as found)."""
    d = deployment
    OwnerLedger(d.data_dir, TWO_SESSIONS).close()
    monkeypatch.setattr(ledger_module, "ChainGuard", NoGuard)

    async def spend_then_delete(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> None:
        await session(keeping)
        await session(keeping)
        await asyncio.to_thread(delete_totals, d.data_dir)
        await session(keeping)  # served: four points over a budget of four
        await session(keeping)

    d.run(spend_then_delete)
    assert sum(p for *_, p in raw_charges(d.data_dir)) == 8


def test_a_ledger_taken_back_to_the_previous_schema_is_refused_by_the_curators_receipt(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's repro_downgrade.sh: identity, chain and every charge but the first
    dropped, schema 3. The owner does not start on it; once its operator upgrades it (a new
    ledger id), the curator's receipt of the real ledger is refused, not ignored, until the
    operator accepts the loss on record. Control: a curator presenting no receipt is served by
    the reset ledger."""
    d = deployment
    d.run(lambda keeping, _: session(keeping))
    d.run(lambda keeping, _: session(keeping))
    with OwnerLedger(d.data_dir, None) as ledger:
        real = ledger.identity.ledger_id
    downgrade(d.data_dir, keep=1)
    with pytest.raises(LedgerUpgradeRequiredError, match="dpmarket owner ledger upgrade"):
        d.run(lambda keeping, _: session(keeping))
    upgraded = OwnerLedger.upgrade(d.data_dir)  # the operator, told to
    assert upgraded.ledger_id != real and upgraded.charges == 1
    d.run(lambda _, plain: session(plain))  # control: no receipt, served
    caplog.set_level(logging.ERROR)
    message = d.run(_refused("keeping"))
    assert ROLLBACK_MESSAGE in message
    assert f"ledger {real}" in caplog.text and "--accept-replaced-ledger" in caplog.text
    assert d.run(_refused("plain")) == message  # refused to every curator until resolved
    with OwnerLedger(d.data_dir, None) as ledger:
        with pytest.raises(ValueError, match="accept-replaced-ledger"):
            ledger.resolve_rollbacks()
        (resolved,) = ledger.resolve_rollbacks(accept_replaced_ledger=True)
    assert resolved.replaced_ledger == real
    d.run(lambda keeping, _: session(keeping))
    assert [p for _, _, p in raw_charges(d.data_dir)] == [2, 2, 0, 2]  # the acceptance: 0


# ------------------------------------------------------------------ round 4: the ledger's keys
def test_a_rollback_behind_a_rotated_key_and_deleted_keys_is_refused_until_resolved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The red team's repro_b1_receipt_keys.sh: the ledger restored from a backup, the owner
    given a new key (``pki issue --force``) and ``DELETE FROM ledger_keys``, so that the
    curator's receipt verifies under no key the ledger lists. The keys cannot be deleted (a
    trigger), dropping the trigger keeps the owner from starting, and a receipt naming this
    owner that no key verifies is refused until the operator resolves it, which charges back
    what it shows lost (its totals open under the ledger's own key). Control: ignoring such a
    receipt (as before) serves the rolled-back ledger."""
    root = tmp_path / "pki"
    init_ca(root)
    issue_all(root, [CURATOR, OWNER])
    d = Deployment(root, tmp_path)
    backup = tmp_path / "backup.sqlite3"

    async def two_sessions(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> None:
        await session(keeping)
        await asyncio.to_thread(backup_ledger, d.data_dir, backup)
        await session(keeping, points=3)

    d.run(two_sessions)
    held = d.store.owner_receipt(OWNER.name)
    assert held is not None
    issue(root, "owner", OWNER.name, force=True)  # a new certificate key for the owner
    d.security = _security(root, OWNER)

    def roll_back(*, thorough: bool) -> None:
        restore_ledger(d.data_dir, backup)
        d.store.record_owner_receipt(OWNER.name, held)  # the curator's receipt, as it holds it
        with closing(sqlite3.connect(ledger_path(d.data_dir))) as conn, conn:
            with pytest.raises(sqlite3.IntegrityError, match="keeps every key"):
                conn.execute("DELETE FROM ledger_keys")
            if thorough:  # the triggers dropped and created again: verify sees nothing
                with without_triggers(conn, "ledger_keys_no_delete"):
                    conn.execute("DELETE FROM ledger_keys")
            else:
                conn.execute("DROP TRIGGER ledger_keys_no_delete")
                conn.execute("DELETE FROM ledger_keys")

    roll_back(thorough=False)
    with pytest.raises(LedgerCheckError, match="triggers missing: ledger_keys_no_delete"):
        d.run(lambda keeping, _: session(keeping))
    assert not verify_file(ledger_path(d.data_dir)).ok

    # Control (the defence off: a receipt no key verifies is ignored, as before): served, the
    # second session's three points forgotten.
    roll_back(thorough=True)
    with monkeypatch.context() as patch:
        patch.setattr(ledger_module, "_unverified_state", lambda receipt: None)
        d.run(lambda keeping, _: session(keeping))
    assert [p for _, p in charges(d)] == [2, 2]

    roll_back(thorough=True)
    caplog.set_level(logging.ERROR)
    message = d.run(_refused("keeping"))
    assert ROLLBACK_MESSAGE in message
    # Genuine by its seal (the ledger's own), whatever keys the ledger lists: a rollback.
    assert "behind a receipt this owner signed" in caplog.text
    assert "owner ledger resolve" in caplog.text
    assert d.run(_refused("plain")) == message  # every curator, until resolved
    assert [p for _, p in charges(d)] == [2]
    assert verify_file(ledger_path(d.data_dir)).open_rollbacks == 1
    with OwnerLedger(d.data_dir, None, clock=d.clock) as ledger:
        (resolution,) = ledger.resolve_rollbacks()  # its totals open: charged back
    assert (resolution.points, resolution.receipt_sequence) == (3, 2)
    d.run(lambda keeping, _: session(keeping))
    assert [p for _, p in charges(d)] == [2, 3, 2]
    assert verify_file(ledger_path(d.data_dir)).ok
    d.store.close()


def test_a_receipt_sealed_under_a_key_the_ledger_never_held_is_dismissable_whatever_signed_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's a3_sealkey_swap.sh and a3_forged_genuine.sh look alike to the owner: a
    receipt of this ledger signed by a certificate its CA issued to this owner, that no key the
    ledger lists verifies, and whose totals do not open under the ledger's sealing key. The
    owner knows its own sealing key (the database refuses to change it): a receipt it did not
    seal is not its own, whatever certificate signed it (whoever holds the CA's key issues
    one named like the owner), so the certificate's key is never listed and the receipt is
    unverified, which its operator may dismiss on record. The price, in the how-to: a sealing
    key replaced by someone who drops and re-creates the ledger's triggers (here, with its keys
    deleted) is not told from a forgery, like a chain rewritten whole. Control: a genuine
    receipt, sealed by this ledger, is charged back whoever signed it, never dismissed
    (tests/owner/test_ledger_failover.py)."""
    root = tmp_path / "pki"
    init_ca(root)
    issue_all(root, [CURATOR, OWNER])
    d = Deployment(root, tmp_path)
    backup = tmp_path / "backup.sqlite3"

    async def two_sessions(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> None:
        await session(keeping)
        await asyncio.to_thread(backup_ledger, d.data_dir, backup)
        await session(keeping, points=3)

    d.run(two_sessions)
    pair = d.store.owner_receipt_and_certificate(OWNER.name)
    assert pair is not None
    held, certificate = pair
    assert certificate == d.security.cert_pem  # kept with the receipt
    issue(root, "owner", OWNER.name, force=True)  # a new certificate key for the owner
    d.security = _security(root, OWNER)
    resolve = ["resolve", "--data-dir", str(d.data_dir), "--dismiss-unverified-receipts"]

    def swap_seal_key(presented: bytes | None) -> None:
        restore_ledger(d.data_dir, backup)
        d.store.record_owner_receipt(OWNER.name, held, certificate=presented)
        with (
            closing(sqlite3.connect(ledger_path(d.data_dir))) as conn,
            conn,
            without_triggers(conn, "ledger_identity_fixed", "ledger_keys_no_delete"),
        ):
            conn.execute("UPDATE ledger_identity SET seal_key = randomblob(32)")
            conn.execute("DELETE FROM ledger_keys")

    # Control (the certificate withheld): unverified, totals sealed under another key: the
    # receipt is dismissed as forged, nothing charged, the three lost points forgotten.
    swap_seal_key(None)
    assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))
    dismissed = CliRunner().invoke(ledger_cli, resolve)
    assert dismissed.exit_code == 0, dismissed.output
    assert "dismissed on record: nothing charged" in " ".join(dismissed.output.split())
    d.run(lambda keeping, _: session(keeping))
    assert [p for _, p in charges(d)] == [2, 0, 2]

    # The curator presents the owner's (since replaced) certificate with it: its totals open
    # under no key this ledger holds, so the key is not listed and the receipt is unverified.
    swap_seal_key(certificate)
    caplog.set_level(logging.WARNING)
    assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))
    assert "did not seal it, whatever certificate signed it" in caplog.text
    assert "the receipt is genuine" not in caplog.text
    with closing(sqlite3.connect(ledger_path(d.data_dir))) as conn:
        # only the key the owner serves with now: the certificate's was not listed
        assert conn.execute("SELECT COUNT(*) FROM ledger_keys").fetchone()[0] == 1
    assert verify_file(ledger_path(d.data_dir)).open_rollbacks == 1
    dismissed = CliRunner().invoke(ledger_cli, resolve)
    assert dismissed.exit_code == 0, dismissed.output
    assert "dismissed on record" in " ".join(dismissed.output.split())

    # A receipt no key of this owner signed stays a forgery, with the owner's certificate or
    # with another party's: dismissable.
    restore_ledger(d.data_dir, backup)
    curator = _security(root, CURATOR)
    for presented in (certificate, curator.cert_pem):
        forged = sign_receipt(Signer.from_pem(curator.key_pem or b""), _state(d, 99))
        d.store.record_owner_receipt(OWNER.name, forged.SerializeToString(), certificate=presented)
        assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))
        dismissed = CliRunner().invoke(ledger_cli, resolve)
        assert dismissed.exit_code == 0, dismissed.output
        assert "dismissed on record" in " ".join(dismissed.output.split())
    d.store.close()


def test_a_ledger_of_the_previous_schema_gets_its_keys_protected_on_upgrade(
    deployment: Deployment,
) -> None:
    """Schema 5 -> 6 (``dpmarket owner ledger upgrade``, or on open): the triggers that keep
    the keys, and the column that marks unverified receipts, are added; charges unchanged."""
    d = deployment
    d.run(lambda keeping, _: session(keeping))
    with closing(sqlite3.connect(ledger_path(d.data_dir))) as conn, conn:
        conn.execute("DROP TRIGGER ledger_keys_no_update")
        conn.execute("DROP TRIGGER ledger_keys_no_delete")
        conn.execute("ALTER TABLE ledger_rollbacks DROP COLUMN verified")
        conn.execute("DROP TRIGGER ledger_rollbacks_no_delete")
        conn.execute("DROP TRIGGER ledger_rollbacks_fixed")
        before_schema_8(conn)
        conn.execute("PRAGMA user_version = 5")
    upgraded = OwnerLedger.upgrade(d.data_dir)
    assert (upgraded.before, upgraded.after, upgraded.charges) == (5, len(MIGRATIONS), 1)
    assert verify_file(ledger_path(d.data_dir)).ok
    with (
        closing(sqlite3.connect(ledger_path(d.data_dir))) as conn,
        pytest.raises(sqlite3.IntegrityError, match="keeps every key"),
    ):
        conn.execute("DELETE FROM ledger_keys")


# ------------------------------------------------------------------ round 5: unchained rows
def _rolled_back(d: Deployment, tmp_path: Path) -> privacy_pb2.LedgerState:
    """Two sessions with a backup between, the backup restored (the owner stopped), and the
    curator's receipt presented: refused, the rollback recorded. The receipt's state."""
    backup = tmp_path / "backup.sqlite3"

    async def two_sessions(keeping: GrpcOwnerEndpoint, _: GrpcOwnerEndpoint) -> None:
        await session(keeping)
        await asyncio.to_thread(backup_ledger, d.data_dir, backup)
        await session(keeping, points=3)

    d.run(two_sessions)
    held = d.store.owner_receipt(OWNER.name)
    assert held is not None
    restore_ledger(d.data_dir, backup)
    assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))
    return privacy_pb2.LedgerState.FromString(privacy_pb2.LedgerReceipt.FromString(held).state)


def _old_rule(patch: pytest.MonkeyPatch) -> None:
    """The defence off: rollbacks resolved by ``ledger_rollbacks.resolved_at`` and ``meta``
    rows, as before schema 7 (owner and verify alike)."""
    from dpmarket.owner import ledger_admin

    patch.setattr(ledger_module, "receipt_resolved", old_rule_resolved)
    patch.setattr(ledger_module, "open_rollbacks", old_rule_open)
    patch.setattr(ledger_admin, "open_rollbacks", old_rule_open)


def test_a_rollback_marked_resolved_by_editing_the_file_is_still_refused(
    deployment: Deployment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's l2_mark_resolved.sh: a rollback found, the owner stopped, ``UPDATE
    ledger_rollbacks SET resolved_at = ...``, the owner started again and the curator presenting
    its receipt. The owner still refuses (its log says the mark resolves nothing and what to do)
    and verify fails; so does a charge-back entry appended with less than the receipt shows
    lost. Control: under the old rule (the mark read), the owner serves with the three points
    of the lost session forgotten and verify passes."""
    d = deployment
    state = _rolled_back(d, tmp_path)
    assert mark_rollbacks_resolved(d.data_dir) == 1
    caplog.set_level(logging.ERROR)
    assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))  # a restart, the receipt presented
    assert "marked resolved, but the ledger's chain holds no entry" in caplog.text
    assert "dpmarket owner ledger resolve --data-dir" in caplog.text
    found = verify_file(ledger_path(d.data_dir))
    assert found.open_rollbacks == 1 and not found.ok
    assert [p for _, p in charges(d)] == [2]
    with (
        closing(sqlite3.connect(ledger_path(d.data_dir))) as conn,
        conn,
        pytest.raises(sqlite3.IntegrityError, match="every rollback it found"),
    ):
        conn.execute("DELETE FROM ledger_rollbacks")

    # A charge-back of less than the receipt shows lost (2 of 3 points), chained: no use.
    lost = f"ledger-rollback-{state.sequence}-{state.head.hex()}"
    append_entry(d.data_dir, lost, points=2)
    assert ROLLBACK_MESSAGE in d.run(_refused("plain"))
    assert verify_file(ledger_path(d.data_dir)).open_rollbacks == 1

    # Control: the old rule reads the mark: served, the lost session's 3 points forgotten.
    with pytest.MonkeyPatch.context() as patch:
        _old_rule(patch)
        d.run(lambda keeping, _: session(keeping))
        assert verify_file(ledger_path(d.data_dir)).ok
    assert [p for _, p in charges(d)] == [2, 2, 2]

    # The operator's resolve charges what is still owed; the owner serves the receipt again.
    with OwnerLedger(d.data_dir, None, clock=d.clock) as ledger:
        (resolution,) = ledger.resolve_rollbacks()
    assert resolution.points == 3  # the appended entry was not counted as the charge-back
    d.run(lambda keeping, _: session(keeping))
    assert verify_file(ledger_path(d.data_dir)).ok


def test_a_meta_row_superseding_the_replaced_ledger_erases_nothing(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's l4_meta_superseded.sh: the ledger moved away, a new one created with
    ``owner ledger init``, and one ``meta`` row ``superseded ledger <old id>`` written before
    the owner first sees the curator's receipt of the old ledger. The owner refuses when the
    curator presents it, as without the row, until its operator resolves it (on the chain's
    record). Control: under the old rule the row is read, the owner serves with the old
    ledger's spending erased (run first: the old rule refuses once it has recorded a
    rollback)."""
    d = deployment
    d.run(lambda keeping, _: session(keeping))
    d.run(lambda keeping, _: session(keeping))
    with OwnerLedger(d.data_dir, None) as ledger:
        old = ledger.identity.ledger_id
    held = d.store.owner_receipt(OWNER.name)
    assert held is not None
    ledger_path(d.data_dir).rename(d.data_dir / "old.sqlite3")
    init_ledger(d.data_dir, OWNER.name, d.security)
    write_superseded_row(d.data_dir, old)
    assert verify_file(ledger_path(d.data_dir)).ok  # nothing to see before the receipt

    # Control: the old rule reads the row: served, the old ledger's 4 points erased.
    with pytest.MonkeyPatch.context() as patch:
        _old_rule(patch)
        d.run(lambda keeping, _: session(keeping))
        assert verify_file(ledger_path(d.data_dir)).ok
    assert [p for *_, p in raw_charges(d.data_dir)] == [2]
    d.store.record_owner_receipt(OWNER.name, held)  # what the curator holds without the control

    caplog.set_level(logging.ERROR)
    assert ROLLBACK_MESSAGE in d.run(_refused("keeping"))
    assert f"ledger {old}" in caplog.text and "--accept-replaced-ledger" in caplog.text
    assert ROLLBACK_MESSAGE in d.run(_refused("plain"))
    assert [p for *_, p in raw_charges(d.data_dir)] == [2]  # nothing charged
    assert verify_file(ledger_path(d.data_dir)).open_rollbacks == 1

    # The operator's acceptance is a chained entry: the owner serves, verify passes.
    with OwnerLedger(d.data_dir, None, clock=d.clock) as ledger:
        (resolution,) = ledger.resolve_rollbacks(accept_replaced_ledger=True)
    assert resolution.replaced_ledger == old
    d.run(lambda keeping, _: session(keeping))
    assert verify_file(ledger_path(d.data_dir)).ok
    assert [s.split("-")[1] for s, *_ in raw_charges(d.data_dir)][1] == "superseded"


def test_a_schema_6_charge_back_still_resolves_its_rollback_after_the_upgrade(
    deployment: Deployment, tmp_path: Path
) -> None:
    """A ledger of schema 6 whose rollback its operator resolved then (the charge-back named
    ``ledger-rollback-<detection>``, the detection marked resolved): opened by this release
    (migrated on open to 7), the charge-back is recognised when it charges what the receipt
    shows lost, and the owner serves; a mark without it is not."""
    d = deployment
    _rolled_back(d, tmp_path)
    append_entry(d.data_dir, "ledger-rollback-1", points=3)  # what schema 6's resolve wrote
    mark_rollbacks_resolved(d.data_dir)
    with closing(sqlite3.connect(ledger_path(d.data_dir))) as conn, conn:
        conn.execute("DROP TRIGGER ledger_rollbacks_no_delete")
        conn.execute("DROP TRIGGER ledger_rollbacks_fixed")
        before_schema_8(conn)
        conn.execute("PRAGMA user_version = 6")
    d.run(lambda keeping, _: session(keeping))  # migrated on open; the receipt accepted
    assert verify_file(ledger_path(d.data_dir)).ok
    with (
        OwnerLedger(d.data_dir, None) as ledger,
        pytest.raises(InvalidArgumentError, match="operator's records"),
    ):
        ledger.charge(
            session="ledger-rollback-9-00",
            consumer="consumer:c",
            curator="curator:curator",
            mechanism="m",
            epsilon=0.1,
            delta=0.0,
            points=1,
        )  # a curator's session cannot pass for an operator's record
