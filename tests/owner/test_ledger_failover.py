"""The ledger's resolutions and restores hold against a failover, a stale ledger, a forged
receipt, a clock set back and another owner's ledger (a stranger's red team).

Each test reproduces one attack on the owner's ledger API as the operator's commands run it,
with its control: what the attack did when the defence was off (the rule it replaced, or the
same steps on a ledger the defence does not concern).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.ledger import LedgerRollbackError, OwnerLedger
from dpmarket.owner.ledger_admin import init_ledger
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import privacy_pb2
from tests.owner.ledger_attacks import append_entry

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


def sequence(receipt: object) -> int:
    """The charge a receipt seals its ledger at."""
    return int(privacy_pb2.LedgerState.FromString(receipt.state).sequence)  # type: ignore[attr-defined]


def accept(ledger: OwnerLedger, receipt: object) -> None:
    """Present ``receipt`` (refused: a receipt of the other ledger), accept that ledger as
    replaced, and present it again (accepted)."""
    with pytest.raises(LedgerRollbackError):
        ledger.check_receipt(receipt, curator=CURATOR)  # type: ignore[arg-type]
    (resolution,) = ledger.resolve_rollbacks(accept_replaced_ledger=True)
    assert resolution.replaced_ledger is not None
    ledger.check_receipt(receipt, curator=CURATOR)  # type: ignore[arg-type]


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
        y.check_receipt(x_first, curator=CURATOR)  # type: ignore[arg-type]  # control
        with pytest.raises(LedgerRollbackError):
            y.check_receipt(x_later, curator=CURATOR)  # type: ignore[arg-type]
        with pytest.raises(LedgerRollbackError):
            charge(y, "y2")
        (again,) = y.resolve_rollbacks(accept_replaced_ledger=True)
        entry = y.entry(again.charge or 0)
        through = sequence(x_later)
        assert entry.session == f"ledger-superseded-{x_id}-through-{through}"
        assert f"up to charge {through}" in entry.mechanism
        y.check_receipt(x_later, curator=CURATOR)  # type: ignore[arg-type]
    # The earlier release's unbounded entry: bounded by the receipts found before it.
    legacy_dir = tmp_path / "legacy"
    init_ledger(legacy_dir, "alice", security(pki))
    with (
        OwnerLedger(legacy_dir, None, owner=owner(pki)) as legacy,
        pytest.raises(LedgerRollbackError),
    ):
        legacy.check_receipt(x_first, curator=CURATOR)  # type: ignore[arg-type]
    append_entry(legacy_dir, f"ledger-superseded-{x_id}", points=0)
    with OwnerLedger(legacy_dir, None, owner=owner(pki)) as legacy:
        legacy.check_receipt(x_first, curator=CURATOR)  # type: ignore[arg-type]
        with pytest.raises(LedgerRollbackError):
            legacy.check_receipt(x_later, curator=CURATOR)  # type: ignore[arg-type]
