"""An owner operator's care of its ledger: create it, back it up, restore it, verify it.

``dpmarket owner ledger init | backup | restore | verify`` (:mod:`dpmarket.owner.cli`) run these;
the how-to is docs/howto-ledger.md.

* :func:`init_ledger` creates an owner's ledger, bound to its certificate: what ``dpmarket owner
  ledger init``, ``dpmarket init`` and the launchers run for a new owner, and the only way a
  ledger comes to exist.
* :func:`backup_ledger` copies the ledger with SQLite's online backup API while the owner serves:
  one consistent snapshot of every committed charge (a ``cp`` of the file while a charge is
  written would be torn); the copy is one self-contained file, verified after it is written.
* :func:`restore_ledger` puts a backup in place of the ledger (the owner stopped): it checks the
  backup first (an owner ledger, its chain whole, the same ledger as the one it replaces),
  moves the current files aside (never deletes them; a stale journal left beside a restored
  file would be played onto it) and copies the backup in. Restoring over *another* ledger of
  the owner (``--replace-other-ledger``) records the ledger it replaces in the restored one, as
  a chained entry charging what that ledger spent, so that the receipts of that ledger are
  recognised as replaced rather than refused and its spending is not lost, and keeps its
  sealing key (a receipt of a later charge of it is then charged, not only accepted). It
  refuses to replace a ledger that does not verify or has a rollback open (its totals as found
  would not count what it lost), and never restores a ledger of another owner or deployment.
* :func:`upgrade_ledger` migrates a ledger of an earlier release to this build's schema, on its
  operator's explicit request (the owner never migrates its ledger on its own: a file taken back
  to an earlier format would otherwise be bound again with a new id and its budget reset), and
  records the upgrade in the ledger.
* :func:`verify_file` checks a ledger or a backup whole: SQLite's integrity, the schema, the
  identity (and, given the owner's certificate, that it is this owner's), the hash chain and the
  running totals (:func:`dpmarket.owner.ledger_chain.verify_ledger`).

A backup holds the state of the ledger when it was taken: restoring it loses the charges made
since. The receipts the owner signed for its curators catch that
(:mod:`dpmarket.owner.receipts`); the owner then refuses to serve until its operator restores a
newer backup or resolves the rollback (:meth:`dpmarket.owner.ledger.OwnerLedger.resolve_rollbacks`).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

from google.protobuf.message import DecodeError

from dpmarket.owner.ledger import (
    APPLICATION,
    CHAIN_SCHEMA,
    GUARD_TRIGGERS,
    LEDGER_FILE,
    MIGRATIONS,
    TABLES,
    LedgerUpgradeRequiredError,
    OwnerLedger,
    Upgrade,
    ledger_path,
    record_superseded,
)
from dpmarket.owner.ledger_chain import (
    ChainProblem,
    ForeignLedgerError,
    LedgerIdentity,
    LedgerOwner,
    Verification,
    verify_ledger,
)
from dpmarket.owner.ledger_resolutions import open_rollbacks, parse_state, superseded_ledgers
from dpmarket.owner.policy import data_dir_policy
from dpmarket.runtime.database import (
    backup_database,
    open_database,
    open_read_only,
    transaction,
)
from dpmarket.runtime.transport import TransportSecurity

__all__ = [
    "backup_ledger",
    "current_schema",
    "init_ledger",
    "replaced_ledger",
    "restore_ledger",
    "upgrade_ledger",
    "verify_file",
]


def init_ledger(
    data_dir: str | os.PathLike[str],
    name: str,
    security: TransportSecurity,
    *,
    policy: str | os.PathLike[str] | None = None,
) -> LedgerIdentity:
    """Create the ledger of owner ``name`` in ``data_dir``, bound to its certificate.

    Parameters
    ----------
    data_dir : path
        The owner's data directory (created if needed).
    name : str
        The owner's name (its certificate's).
    security : TransportSecurity
        Its mTLS credentials (the ledger records the CA that issued its certificate and the
        certificate's key), or plaintext (the name only).
    policy : path, optional
        A policy file to install as ``data_dir/policy.toml`` (as ``owner serve --policy``
        does); the policy in force is recorded as the ledger's first.

    Returns
    -------
    LedgerIdentity
        The new ledger's.

    Raises
    ------
    FileExistsError
        If ``data_dir`` holds a ledger (or SQLite's files of one) already.
    ValueError
        If the policy file is malformed or differs from the one installed, or the certificate
        key is not an elliptic-curve key.
    """
    found, _ = data_dir_policy(data_dir, policy)
    owner = LedgerOwner.from_security(name, security)
    with OwnerLedger.create(data_dir, found, owner=owner) as ledger:
        return ledger.identity


def upgrade_ledger(data_dir: str | os.PathLike[str]) -> Upgrade:
    """Migrate the ledger in ``data_dir`` to this build's schema and record it (the owner
    stopped): :meth:`dpmarket.owner.ledger.OwnerLedger.upgrade`, what ``dpmarket owner ledger
    upgrade`` runs."""
    return OwnerLedger.upgrade(data_dir)


def replaced_ledger(data_dir: str | os.PathLike[str]) -> Verification | None:
    """The verification of the ledger in ``data_dir`` that a restore or an init would replace,
    or None if there is none that reads (missing, empty, damaged, another schema)."""
    target = ledger_path(data_dir)
    if not target.is_file() or target.stat().st_size == 0:
        return None
    try:
        return verify_file(target)
    except (ValueError, RuntimeError, sqlite3.DatabaseError):
        return None


def _schema_of(path: Path) -> int:
    """The ``user_version`` of the SQLite file ``path`` (read-only; 0 for a missing file)."""
    if not path.is_file():
        return 0
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


@contextmanager
def current_schema(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path`` itself, or, for a ledger at an earlier schema the owner migrates on start
    (:data:`~dpmarket.owner.ledger.CHAIN_SCHEMA` or later), a temporary copy of it migrated to
    this build's schema, removed on exit. The file at ``path`` is never written.

    Raises
    ------
    LedgerUpgradeRequiredError
        If the file is below :data:`~dpmarket.owner.ledger.CHAIN_SCHEMA` (no identity or chain
        yet): only an explicit ``dpmarket owner ledger upgrade`` of a data directory gives it
        one.
    """
    path = Path(path)
    version = _schema_of(path)
    if not 0 < version < len(MIGRATIONS):
        yield path
        return
    if version < CHAIN_SCHEMA:
        raise LedgerUpgradeRequiredError(
            f"{path} is an owner ledger of schema {version}, before the ledger's identity and "
            f"chain (schema {CHAIN_SCHEMA}; this build uses {len(MIGRATIONS)}): it is not "
            "migrated on a copy. If it is the ledger this owner ran until now, put it in a data "
            "directory of its own and run dpmarket owner ledger upgrade --data-dir DIR there, "
            "then verify or restore that directory's owner.sqlite3 (docs/howto-ledger.md)"
        )
    with tempfile.TemporaryDirectory(prefix="dpmarket-ledger-") as scratch:
        copy = backup_database(path, Path(scratch) / LEDGER_FILE, application=APPLICATION)
        conn = open_database(
            copy,
            MIGRATIONS,
            application=APPLICATION,
            create=False,
            journal="rollback",
            auto_upgrade_from=CHAIN_SCHEMA,
        )
        conn.close()
        yield copy


def verify_file(path: str | os.PathLike[str], *, owner: LedgerOwner | None = None) -> Verification:
    """Verify an owner ledger file (a data directory's, or a backup), read-only.

    Parameters
    ----------
    path : path
        The file.
    owner : LedgerOwner, optional
        The owner it must belong to: a ledger bound to another owner or deployment is a
        problem.

    Returns
    -------
    Verification
        With ``problems`` empty when the ledger is whole.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not an owner ledger.
    RuntimeError
        If it was written by a newer dpmarket, or is at a schema before the ledger's identity
        and chain (:class:`LedgerUpgradeRequiredError`, saying what to do). A file at a later
        earlier schema (one the owner migrates on start) is verified as a migrated temporary
        copy (:func:`current_schema`); the file itself is not written.
    sqlite3.DatabaseError
        If it is not an SQLite database.
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes): not an owner ledger")
    with current_schema(path) as current:  # an earlier schema: a migrated copy is verified
        conn = open_read_only(current, application=APPLICATION, schema_version=len(MIGRATIONS))
        try:
            found = verify_ledger(
                conn,
                expected_tables=TABLES,
                expected_triggers=GUARD_TRIGGERS,
                rollbacks=lambda c: len(open_rollbacks(c)),
            )
        finally:
            conn.close()
    if owner is not None and found.identity is not None:
        try:
            owner.check(found.identity, str(path))
        except ForeignLedgerError as exc:
            found = Verification(
                found.identity,
                found.charges,
                found.sequence,
                found.head,
                found.totals,
                found.open_rollbacks,
                (*found.problems, ChainProblem(0, str(exc))),
            )
    return found


def backup_ledger(data_dir: str | os.PathLike[str], out: str | os.PathLike[str]) -> Verification:
    """Copy an owner's ledger to ``out``, consistently, while the owner may be serving.

    Parameters
    ----------
    data_dir : path
        The owner's data directory.
    out : path
        The backup file; must not exist.

    Returns
    -------
    Verification
        Of the copy.

    Raises
    ------
    FileNotFoundError
        If ``data_dir`` holds no ledger.
    FileExistsError
        If ``out`` exists.
    ValueError
        If the ledger is not an owner ledger, or the copy does not verify (it is then removed).
    """
    source = ledger_path(data_dir)
    if source.is_file() and source.stat().st_size == 0:
        raise ValueError(f"{source} is empty (0 bytes): there is no ledger to back up")
    copy = backup_database(source, out, application=APPLICATION)
    try:
        found = verify_file(copy)
    except (ValueError, RuntimeError, sqlite3.DatabaseError):
        copy.unlink(missing_ok=True)
        raise
    if found.problems:
        copy.unlink(missing_ok=True)
        raise ValueError(
            f"the copy of {source} does not verify, so no backup was kept: "
            + "; ".join(p.what for p in found.problems)
            + " (dpmarket owner ledger verify shows the ledger's own state)"
        )
    return found


def _refuse_another_owner(
    target: Path, current: Verification | None, backup: str | os.PathLike[str], found: Verification
) -> None:
    """Raise ``ValueError`` if ``backup`` (verified: ``found``) is a ledger of another owner, or
    of another deployment, than the ledger ``current`` in place at ``target``: nothing makes an
    owner's ledger hold another owner's charges (even ``--replace-other-ledger``, which would
    record that owner's spending in it when its own is restored back)."""
    if current is None or current.identity is None or found.identity is None:
        return
    mine, theirs = current.identity, found.identity
    if mine.owner is None or theirs.owner is None:
        return
    if mine.owner != theirs.owner or (mine.ca is not None and theirs.ca != mine.ca):
        raise ValueError(
            f"{backup} is a ledger of owner {theirs.owner} (CA {str(theirs.ca)[:16]}), but "
            f"{target} is a ledger of owner {mine.owner} (CA {str(mine.ca)[:16]}): a ledger is "
            "never restored over another owner's (even with --replace-other-ledger), nothing was "
            "changed. Restore this owner's own backup (dpmarket owner ledger verify --file "
            "BACKUP names its owner)"
        )


def _aside_identity(target: Path) -> LedgerIdentity | None:
    """The identity of the newest ledger a restore moved aside beside ``target``
    (``owner.sqlite3.replaced-<UTC time>``), or None if there is none that reads."""
    for aside in sorted(target.parent.glob(f"{target.name}.replaced-*"), reverse=True):
        if aside.name.endswith(("-journal", "-wal", "-shm")):
            continue
        try:
            return verify_file(aside).identity
        except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError):
            continue
    return None


def _refuse_unknown_owner(
    target: Path,
    current: Verification | None,
    backup: str | os.PathLike[str],
    found: Verification,
    owner: LedgerOwner | None,
) -> None:
    """Raise ``ValueError`` if ``backup`` (verified: ``found``) is a ledger of another owner or
    deployment than ``owner`` (the operator's ``--config``), or, without ``owner`` and with no
    ledger in place at ``target``, than the newest ledger moved aside there: an empty data
    directory is no reason to take another owner's ledger."""
    if found.identity is None:
        return
    if owner is not None:
        try:
            owner.check(found.identity, str(backup))
        except ForeignLedgerError as exc:
            raise ValueError(
                f"{exc}. Nothing was restored into {target.parent}: restore a backup of "
                f"{owner.name}'s own ledger (dpmarket owner ledger verify --file BACKUP names "
                "its owner)"
            ) from None
        return
    if current is not None and current.identity is not None:
        return  # _refuse_another_owner decided
    before = _aside_identity(target)
    if before is None or before.owner is None or found.identity.owner is None:
        return
    if before.owner != found.identity.owner or (
        before.ca is not None and found.identity.ca != before.ca
    ):
        raise ValueError(
            f"{backup} is a ledger of owner {found.identity.owner} (CA "
            f"{str(found.identity.ca)[:16]}), but the ledger last in {target.parent} (moved aside "
            f"by a restore) was of owner {before.owner} (CA {str(before.ca)[:16]}): nothing was "
            "restored. Restore that owner's own backup, or name the owner with --config (its "
            "certificate decides)"
        )


def _refuse_uncounted(target: Path, current: Verification, restored_id: str) -> None:
    """Raise ``ValueError`` if the ledger ``current`` in place at ``target``, which a restore
    of ledger ``restored_id`` would replace, does not verify, or has a rollback open whose
    receipt is not of ``restored_id``: what it spent is then more than it holds (a curator's
    receipt shows charges it lost), and recording its totals as found would lose the rest."""
    if current.problems:
        raise ValueError(
            f"{target} does not verify ("
            + "; ".join(p.what for p in current.problems[:3])
            + "), so what it spent cannot be counted and it was not replaced. Restore a backup of "
            "it that verifies first, or move it aside and accept on record what it spent as lost "
            "(dpmarket owner ledger resolve --accept-replaced-ledger, after the restore)"
        )
    conn = open_read_only(target, application=APPLICATION, schema_version=len(MIGRATIONS))
    try:
        still = set(open_rollbacks(conn))
        blocking = [
            number
            for number, blob in conn.execute("SELECT id, receipt FROM ledger_rollbacks")
            if int(number) in still and _receipt_ledger(bytes(blob)) != restored_id
        ]
    finally:
        conn.close()
    if blocking:
        raise ValueError(
            f"{target} (ledger {current.identity.ledger_id if current.identity else '?'}) has "
            f"{len(blocking)} rollback(s) open: a curator's receipt shows it spent more than it "
            "holds, so its totals as found would not count all it spent, and it was not "
            f"replaced. Resolve them first: dpmarket owner ledger resolve --data-dir "
            f"{target.parent} (it charges the loss back into that ledger; with "
            "--accept-replaced-ledger or --dismiss-unverified-receipts if it asks), then "
            "restore again"
        )


#: One ledger a restore records as replaced: its id, its sealing key (None: not kept), what
#: the restored ledger charges of it (exact epsilon, delta, points) and its last charge counted.
Replaced = tuple[str, bytes | None, tuple[Fraction, Fraction, int], int]


def _replaced_chain(path: Path, current: Verification, restored_id: str) -> list[Replaced]:
    """What a restore of ledger ``restored_id`` over the ledger ``current`` at ``path`` records
    in the restored ledger: ``current`` itself (its sealing key, its lifetime totals less what
    it counted of the ledgers it replaced, its last charge), then every ledger ``current``
    replaced (its kept key, what its supersession entries charged of it, the charge they
    cover), so that a receipt of any ledger of the chain is charged what it shows beyond what
    was counted, wherever the chain ends. A ledger of the chain that is ``restored_id`` itself
    stays counted inside ``current``'s entry (more, never less)."""
    assert current.identity is not None
    conn = open_read_only(path, application=APPLICATION, schema_version=len(MIGRATIONS))
    try:
        own = bytes(conn.execute("SELECT seal_key FROM ledger_identity").fetchone()[0])
        keys = {
            str(i): bytes(k)
            for i, k in conn.execute("SELECT ledger_id, seal_key FROM replaced_ledgers")
        }
        superseded = superseded_ledgers(conn)
    finally:
        conn.close()
    epsilon, delta, points = current.totals
    chain: list[Replaced] = []
    for ledger_id in sorted(set(keys) | set(superseded)):
        if ledger_id in (restored_id, current.identity.ledger_id):
            continue
        spent, through = superseded.get(ledger_id, ((Fraction(0), Fraction(0), 0), -1))
        epsilon, delta, points = epsilon - spent[0], delta - spent[1], points - spent[2]
        chain.append((ledger_id, keys.get(ledger_id), spent, through))
    mine = (max(epsilon, Fraction(0)), max(delta, Fraction(0)), max(points, 0))
    return [(current.identity.ledger_id, own, mine, current.sequence), *chain]


def _receipt_ledger(receipt: bytes) -> str | None:
    """The ledger id a stored receipt names (None: unreadable)."""
    try:
        return str(parse_state(receipt).ledger_id)
    except DecodeError:
        return None


def restore_ledger(
    data_dir: str | os.PathLike[str],
    backup: str | os.PathLike[str],
    *,
    replace_other: bool = False,
    owner: LedgerOwner | None = None,
) -> tuple[Verification, list[Path]]:
    """Put ``backup`` in place of the owner's ledger; run it with the owner stopped.

    Parameters
    ----------
    data_dir : path
        The owner's data directory.
    backup : path
        A backup (:func:`backup_ledger`), or any copy of an owner ledger. One of an earlier
        schema that the owner migrates on start is restored as a migrated copy
        (:func:`current_schema`); the backup file itself is never written.
    owner : LedgerOwner, optional
        The owner whose data directory this is (``--config`` or ``--pki-dir``/``--name``): a
        backup of another owner or deployment is refused, even into an empty directory.
        Without it, the owner is the one of the ledger in place or, when there is none, of the
        newest ledger a restore moved aside in the directory (``owner.sqlite3.replaced-*``).
    replace_other : bool
        Allow replacing a readable ledger with a backup of *another* ledger (another ledger id).
        The replaced ledger is then recorded in the restored one as a chained entry that
        charges its lifetime epsilon, delta and points (``record_superseded`` of
        :mod:`dpmarket.owner.ledger`): its receipts up to its last charge are recognised as
        replaced, not refused, what it spent stays spent, and its sealing key is kept
        (``replaced_ledgers``). So is every ledger the replaced one had replaced (the whole
        chain: an entry per ledger, charging what the replaced ledger had counted of it, with
        its kept key), the replaced ledger's own entry charging the rest of its totals.

    Returns
    -------
    (Verification, list of Path)
        The restored ledger's verification, and where the files it replaced were moved
        (``owner.sqlite3.replaced-<UTC time>`` and its ``-journal``/``-wal``/``-shm``), if any.

    Raises
    ------
    ValueError
        If the backup does not verify; or it is a ledger of another owner or deployment than
        the one in ``data_dir``; or of another ledger of this owner (unless ``replace_other``);
        or, with ``replace_other``, the ledger in place does not verify or has a rollback open
        whose receipt is not of the backup's ledger (resolve it first). Nothing is changed.
    FileNotFoundError
        If ``backup`` does not exist.
    """
    with current_schema(backup) as source:  # an earlier schema: a migrated copy is restored
        return _restore(data_dir, source, backup, replace_other=replace_other, owner=owner)


def _restore(
    data_dir: str | os.PathLike[str],
    source: Path,
    backup: str | os.PathLike[str],
    *,
    replace_other: bool,
    owner: LedgerOwner | None,
) -> tuple[Verification, list[Path]]:
    """:func:`restore_ledger` of the file ``source`` (``backup`` at this build's schema)."""
    target = ledger_path(data_dir)
    found = verify_file(source)
    if found.problems:
        raise ValueError(
            f"{backup} does not verify, so it was not restored: "
            + "; ".join(p.what for p in found.problems)
        )
    current = replaced_ledger(data_dir)  # None: damaged or unreadable, the backup replaces it
    _refuse_another_owner(target, current, backup, found)
    _refuse_unknown_owner(target, current, backup, found, owner)
    other = (
        current is not None
        and current.identity is not None
        and found.identity is not None
        and current.identity.ledger_id != found.identity.ledger_id
    )
    if other and replace_other and current is not None and found.identity is not None:
        _refuse_uncounted(target, current, found.identity.ledger_id)
    if other and not replace_other:
        assert current is not None and current.identity is not None
        assert found.identity is not None
        raise ValueError(
            f"{backup} is a backup of ledger {found.identity.ledger_id} (owner "
            f"{found.identity.owner}), but {target} is ledger {current.identity.ledger_id} "
            f"(owner {current.identity.owner}, {current.charges} charges): check that it is "
            "this owner's backup, or pass --replace-other-ledger (what that ledger charged is "
            "then not counted in the restored one)"
        )
    chain = (
        _replaced_chain(target, current, found.identity.ledger_id)
        if other and current is not None and found.identity is not None
        else []
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    moved: list[Path] = []
    for path in (
        target,
        *(target.with_name(target.name + s) for s in ("-journal", "-wal", "-shm")),
    ):
        if path.exists():
            aside = path.with_name(f"{target.name}.replaced-{stamp}{path.name[len(target.name) :]}")
            os.replace(path, aside)
            moved.append(aside)
    target.parent.mkdir(parents=True, exist_ok=True)
    backup_database(source, target, application=APPLICATION)
    if other:
        # The operator's explicit act, on the restored ledger's record (a chained entry that
        # charges what the replaced ledger spent): the receipts of the ledger it replaced are
        # recognised (not refused) from now on.
        assert current is not None and current.identity is not None
        with (
            closing(sqlite3.connect(target, isolation_level=None)) as conn,
            transaction(conn),
        ):
            for ledger_id, seal_key, spent, through in chain:
                record_superseded(
                    conn,
                    ledger_id,
                    "restore --replace-other-ledger"
                    if ledger_id == current.identity.ledger_id
                    else f"restore --replace-other-ledger, as ledger {current.identity.ledger_id} "
                    "had replaced it",
                    datetime.now(UTC).timestamp(),
                    spent,
                    through=max(through, 0),
                    seal_key=seal_key,
                )
    return verify_file(target), moved
