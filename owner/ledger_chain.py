"""What makes an owner's ledger tamper-evident and its own: the hash chain and the identity.

Hash chain
----------
Every charge has a row in ``charge_chain`` holding ``hash_i = SHA-256(CHARGE_TAG || hash_{i-1}
|| encoding of charge i)``, computed in the transaction of the charge (:func:`charge_hash`).
``hash_0`` is :func:`genesis`, a hash of the ledger's own id, so two ledgers never share a chain.
The chain's head ``(i, hash_i)`` at the last charge commits to every charge before it: a charge
changed, removed or inserted anywhere but at the end changes every later hash
(:func:`verify_ledger` recomputes them), and the charges removed *from the end* are what the
receipts the owner signs catch (:mod:`dpmarket.owner.receipts`). Appending costs one indexed read
of the previous hash and one SHA-256 of a few hundred bytes: O(1) in the ledger's history.

Identity
--------
``ledger_identity`` holds the ledger's random id (128 bits), the owner it belongs to (its
certificate's name) and the fingerprint of the deployment CA that issued that certificate, and
the ledger's sealing key (receipts' totals, :func:`dpmarket.owner.receipts.seal_totals`).
``ledger_keys`` lists every certificate key the owner has served with (a renewed certificate adds
its key), the keys a receipt must be signed with. A ledger of another owner or of another
deployment is *foreign* and refused (:meth:`LedgerOwner.check`).

Migration
---------
:func:`add_chain` is the owner database's migration 3 -> 4: it creates these tables, draws the
ledger's id and sealing key, and chains the charges already recorded, in order. Those rows are
chained as they were found at the upgrade: the chain shows they have not changed since, not that
they had not changed before. A ledger from an earlier release has no owner yet: the first owner
that serves it binds it (and says so in its log).
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from dpmarket.owner.receipts import Signer, public_key_der, public_key_fingerprint
from dpmarket.runtime.database import execute_script
from dpmarket.runtime.transport import TransportSecurity

__all__ = [
    "CHARGE_TAG",
    "HASH_BYTES",
    "ChainProblem",
    "ForeignLedgerError",
    "LedgerIdentity",
    "LedgerOwner",
    "Verification",
    "add_chain",
    "append_chain",
    "charge_hash",
    "genesis",
    "read_identity",
    "recomputed_totals",
    "verify_ledger",
]

#: A running-totals row's key, ``(day, epsilon, delta, non_private)``, and its value,
#: ``(charges, points)`` (table ``charge_totals``).
TotalsKey = tuple[int, float, float, int]
TotalsValue = tuple[int, int]

#: Domain separation of a charge's hash and of the genesis hash.
CHARGE_TAG = b"dpmarket ledger charge v1\x00"
GENESIS_TAG = b"dpmarket ledger genesis v1\x00"
#: Bytes of a chain hash (SHA-256).
HASH_BYTES = 32
#: Bytes of the ledger's sealing key (AES-256).
SEAL_KEY_BYTES = 32

#: The ``charges`` columns a charge's hash covers, in order.
CHAINED_COLUMNS = (
    "id, at, session, consumer, curator, mechanism, epsilon, delta, points, non_private"
)

_CHAIN_SCHEMA = """
CREATE TABLE ledger_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    ledger_id TEXT NOT NULL,
    owner TEXT,
    ca TEXT,
    created_at REAL NOT NULL,
    seal_key BLOB NOT NULL CHECK (length(seal_key) = 32),
    charges_at_creation INTEGER NOT NULL
);
CREATE TRIGGER ledger_identity_fixed BEFORE UPDATE OF ledger_id, seal_key, created_at
ON ledger_identity BEGIN
    SELECT RAISE(ABORT, 'a ledger keeps its id and sealing key');
END;
CREATE TRIGGER ledger_identity_bound_once BEFORE UPDATE OF owner ON ledger_identity
WHEN OLD.owner IS NOT NULL AND NEW.owner IS NOT OLD.owner BEGIN
    SELECT RAISE(ABORT, 'a ledger is bound to its owner once');
END;
CREATE TRIGGER ledger_identity_no_delete BEFORE DELETE ON ledger_identity BEGIN
    SELECT RAISE(ABORT, 'a ledger keeps its identity');
END;
CREATE TABLE ledger_keys (
    fingerprint TEXT PRIMARY KEY,
    public_key BLOB NOT NULL,
    added_at REAL NOT NULL
);
CREATE TABLE charge_chain (
    charge INTEGER PRIMARY KEY REFERENCES charges (id),
    hash BLOB NOT NULL CHECK (length(hash) = 32)
);
CREATE TRIGGER charge_chain_no_update BEFORE UPDATE ON charge_chain BEGIN
    SELECT RAISE(ABORT, 'the charge chain is append-only');
END;
CREATE TRIGGER charge_chain_no_delete BEFORE DELETE ON charge_chain BEGIN
    SELECT RAISE(ABORT, 'the charge chain is append-only');
END;
CREATE TABLE ledger_rollbacks (
    id INTEGER PRIMARY KEY,
    detected_at REAL NOT NULL,
    curator TEXT NOT NULL,
    receipt BLOB NOT NULL,
    sequence INTEGER NOT NULL,
    head BLOB NOT NULL,
    ledger_sequence INTEGER NOT NULL,
    resolved_at REAL,
    charge INTEGER REFERENCES charges (id)
);
CREATE INDEX ledger_rollbacks_open ON ledger_rollbacks (resolved_at);
"""


class ForeignLedgerError(ValueError):
    """The ledger belongs to another owner or another deployment: refused, nothing written."""


def genesis(ledger_id: str) -> bytes:
    """``hash_0`` of the ledger ``ledger_id``: SHA-256 of :data:`GENESIS_TAG` and its id."""
    return hashlib.sha256(GENESIS_TAG + ledger_id.encode()).digest()


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack("<I", len(data)) + data


def charge_hash(previous: bytes, row: tuple[Any, ...]) -> bytes:
    """The chain hash of one charge.

    Parameters
    ----------
    previous : bytes
        The previous charge's hash (:func:`genesis` for the first), 32 bytes.
    row : tuple
        The charge's :data:`CHAINED_COLUMNS`: ``(id, at, session, consumer, curator,
        mechanism, epsilon, delta, points, non_private)``.

    Returns
    -------
    bytes
        ``SHA-256(CHARGE_TAG || previous || id, at, epsilon, delta, points, non_private as
        little-endian int64/float64 || each text as uint32 length + UTF-8)``, 32 bytes. Floats
        are hashed as the stored doubles, exactly (infinity included).
    """
    charge_id, at, session, consumer, curator, mechanism, epsilon, delta, points, non_private = row
    h = hashlib.sha256(CHARGE_TAG)
    h.update(previous)
    h.update(
        struct.pack(
            "<qdddqq",
            int(charge_id),
            float(at),
            float(epsilon),
            float(delta),
            int(points),
            int(non_private),
        )
    )
    for text in (session, consumer, curator, mechanism):
        h.update(_text(str(text)))
    return h.digest()


def head(conn: sqlite3.Connection) -> tuple[int, bytes]:
    """``(sequence, hash)`` of the chain's last charge; ``(0, genesis)`` with no charge."""
    row = conn.execute(
        "SELECT charge, hash FROM charge_chain ORDER BY charge DESC LIMIT 1"
    ).fetchone()
    if row is not None:
        return int(row[0]), bytes(row[1])
    (ledger_id,) = conn.execute("SELECT ledger_id FROM ledger_identity").fetchone()
    return 0, genesis(str(ledger_id))


def hash_at(conn: sqlite3.Connection, sequence: int) -> bytes | None:
    """The chain hash after charge ``sequence`` (the genesis hash for 0), or None if the ledger
    holds no such charge."""
    if sequence == 0:
        (ledger_id,) = conn.execute("SELECT ledger_id FROM ledger_identity").fetchone()
        return genesis(str(ledger_id))
    row = conn.execute("SELECT hash FROM charge_chain WHERE charge = ?", (sequence,)).fetchone()
    return None if row is None else bytes(row[0])


def append_chain(conn: sqlite3.Connection, charge_id: int) -> bytes:
    """Chain the charge ``charge_id`` just inserted (inside its transaction); return its hash.

    Raises
    ------
    RuntimeError
        If ``charge_id`` is not the charge after the chain's head (a charge inserted without
        its chain row, or out of order).
    """
    sequence, previous = head(conn)
    row = conn.execute(
        f"SELECT {CHAINED_COLUMNS} FROM charges WHERE id = ?", (charge_id,)
    ).fetchone()
    if row is None or charge_id <= sequence:
        raise RuntimeError(
            f"charge {charge_id} cannot follow the chain's head at charge {sequence}"
        )
    digest = charge_hash(previous, row)
    conn.execute("INSERT INTO charge_chain (charge, hash) VALUES (?, ?)", (charge_id, digest))
    return digest


def add_chain(conn: sqlite3.Connection) -> None:
    """Migration 3 -> 4 of the owner's database: identity, keys, chain, rollbacks.

    Draws the ledger's id and sealing key (:func:`os.urandom`) and chains every charge already
    recorded, in id order. Runs inside the migration's transaction.
    """
    execute_script(conn, _CHAIN_SCHEMA)
    existing = int(conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])
    ledger_id = secrets.token_hex(16)
    conn.execute(
        "INSERT INTO ledger_identity (id, ledger_id, owner, ca, created_at, seal_key, "
        "charges_at_creation) VALUES (1, ?, NULL, NULL, ?, ?, ?)",
        (ledger_id, time.time(), os.urandom(SEAL_KEY_BYTES), existing),
    )
    previous = genesis(ledger_id)
    for row in conn.execute(f"SELECT {CHAINED_COLUMNS} FROM charges ORDER BY id").fetchall():
        previous = charge_hash(previous, row)
        conn.execute("INSERT INTO charge_chain (charge, hash) VALUES (?, ?)", (row[0], previous))


# --------------------------------------------------------------------------- identity
@dataclass(frozen=True)
class LedgerIdentity:
    """Who a ledger belongs to, as it records it.

    Attributes
    ----------
    ledger_id : str
        Random, 32 hex digits, drawn when the ledger was created (or upgraded to a chain).
    owner : str or None
        The owner's certificate name; None for a ledger not bound yet (created in process
        without an identity, or from an earlier release).
    ca : str or None
        SHA-256 fingerprint (hex) of the public key of the CA that issued the owner's
        certificate; None for an owner without certificates (plaintext) or not bound yet.
    created_at : float
        Unix time of the creation (or of the upgrade), seconds.
    charges_at_creation : int
        Charges the ledger held when its chain began (non-zero only for an upgraded ledger).
    keys : tuple of str
        Fingerprints of the certificate keys the owner served with (receipts' signers).
    """

    ledger_id: str
    owner: str | None
    ca: str | None
    created_at: float
    charges_at_creation: int
    keys: tuple[str, ...]


def read_identity(conn: sqlite3.Connection) -> LedgerIdentity:
    """The ledger's identity row and keys.

    Raises
    ------
    ValueError
        If the ledger has no identity row (a damaged file).
    """
    row = conn.execute(
        "SELECT ledger_id, owner, ca, created_at, charges_at_creation FROM ledger_identity"
    ).fetchone()
    if row is None:
        raise ValueError("the ledger has no identity record (ledger_identity is empty)")
    keys = tuple(r[0] for r in conn.execute("SELECT fingerprint FROM ledger_keys ORDER BY rowid"))
    return LedgerIdentity(
        ledger_id=str(row[0]),
        owner=None if row[1] is None else str(row[1]),
        ca=None if row[2] is None else str(row[2]),
        created_at=float(row[3]),
        charges_at_creation=int(row[4]),
        keys=keys,
    )


def _issuer_fingerprint(ca_pem: bytes, cert_pem: bytes) -> str:
    """Fingerprint of the public key of the CA (among ``ca_pem``) that issued ``cert_pem``."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in x509.load_pem_x509_certificates(ca_pem):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return public_key_fingerprint(public_key_der(ca.public_key()))  # type: ignore[arg-type]
    raise ValueError("the certificate is not issued by a CA of ca_pem")


@dataclass(frozen=True)
class LedgerOwner:
    """The owner that opens a ledger: the name, deployment and key the ledger is bound to.

    Attributes
    ----------
    name : str
        The owner's name (its certificate's).
    ca : str or None
        Fingerprint of the public key of the CA that issued its certificate; None without
        certificates (plaintext transport).
    signer : Signer or None
        Its certificate key, which signs receipts; None without certificates.
    certificate : bytes or None
        Its certificate, PEM: handed to the curator with each receipt it signs.
    ca_pem : bytes or None
        Its CA certificate(s), PEM: what a certificate presented with a receipt is checked
        against (:func:`dpmarket.owner.receipts.receipt_certificate_key`).
    """

    name: str
    ca: str | None = None
    signer: Signer | None = field(default=None, repr=False, compare=False)
    certificate: bytes | None = field(default=None, repr=False, compare=False)
    ca_pem: bytes | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_security(cls, name: str, security: TransportSecurity) -> LedgerOwner:
        """The owner whose mTLS credentials are ``security`` (its name, CA and key); only its
        name with plaintext transport.

        Raises
        ------
        ValueError
            If the certificate key is not an elliptic-curve key.
        """
        if security.insecure or security.key_pem is None or security.cert_pem is None:
            return cls(name)
        assert security.ca_pem is not None
        ca = _issuer_fingerprint(security.ca_pem, security.cert_pem)
        return cls(name, ca, Signer.from_pem(security.key_pem), security.cert_pem, security.ca_pem)

    @property
    def key(self) -> tuple[str, bytes] | None:
        """``(fingerprint, DER)`` of the certificate's public key, or None."""
        if self.signer is None:
            return None
        der = public_key_der(self.signer.public_key)
        return public_key_fingerprint(der), der

    def check(self, identity: LedgerIdentity, where: str) -> None:
        """Refuse a ledger bound to another owner or deployment.

        Raises
        ------
        ForeignLedgerError
            If ``identity`` names another owner, or another CA (or one CA where this owner has
            none, or the reverse); the message names both and what to do.
        """
        if identity.owner is None:
            return
        if identity.owner != self.name:
            raise ForeignLedgerError(
                f"{where} is the ledger of owner {identity.owner!r}, not of {self.name!r}: "
                f"point --data-dir at {self.name}'s own data directory (if {self.name} has none "
                "yet, create its ledger there with dpmarket owner ledger init)"
            )
        if identity.ca != self.ca:
            theirs = "no CA (plaintext)" if identity.ca is None else f"CA {identity.ca[:16]}"
            mine = "no CA (plaintext)" if self.ca is None else f"CA {self.ca[:16]}"
            raise ForeignLedgerError(
                f"{where} is the ledger of owner {self.name!r} of another deployment (its "
                f"certificate was issued by {theirs}, this owner's by {mine}): use the ledger "
                "of this deployment's owner, or restore this owner's own ledger from its backup "
                "(docs/howto-ledger.md). If this deployment's CA was replaced, bind the ledger to "
                "the new one: dpmarket owner ledger rebind (docs/howto-certificates.md)"
            )


# --------------------------------------------------------------------------- verification
@dataclass(frozen=True)
class ChainProblem:
    """One thing :func:`verify_ledger` found wrong, with the charge it concerns (0: none)."""

    charge: int
    what: str


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_ledger` checked and found.

    Attributes
    ----------
    identity : LedgerIdentity or None
        None if the identity record is missing.
    charges : int
        Charges recorded.
    sequence : int
        The chain's last charge (0: none).
    head : bytes
        The chain hash there.
    totals : tuple of (Fraction, Fraction, int)
        Lifetime epsilon, delta (private charges, exact) and points, recomputed from the
        charges.
    open_rollbacks : int
        Receipts the ledger was found behind that its chain does not resolve (no entry of its
        operator's resolves them: :mod:`dpmarket.owner.ledger_resolutions`).
    problems : tuple of ChainProblem
        Empty when the ledger is whole.
    """

    identity: LedgerIdentity | None
    charges: int
    sequence: int
    head: bytes
    totals: tuple[Fraction, Fraction, int]
    open_rollbacks: int
    problems: tuple[ChainProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems and self.open_rollbacks == 0


def charge_value_problem(row: Sequence[Any]) -> str | None:
    """What is wrong with the values of a charge's :data:`CHAINED_COLUMNS` row, or None.

    The table's CHECK constraints say the same, but SQLite does not enforce them on a connection
    that sets ``PRAGMA ignore_check_constraints = ON``, and ``PRAGMA integrity_check`` on a
    read-only connection does not report a row that breaks them: a charge of negative epsilon
    appended so, with a valid chain hash, gave budget back. So the chain walk and the owner's
    guard check every row's values themselves: epsilon >= 0 (infinite only for a non-private
    release), delta in [0, 1), points an integer >= 0, non_private 0 or 1.
    """
    charge_id, epsilon, delta, points, non_private = row[0], row[6], row[7], row[8], row[9]
    try:
        bad = not (
            isinstance(epsilon, int | float)
            and epsilon >= 0  # NaN fails
            and (math.isfinite(epsilon) or non_private == 1)
            and isinstance(delta, int | float)
            and 0 <= delta < 1
            and isinstance(points, int)
            and points >= 0
            and non_private in (0, 1)
        )
    except TypeError:
        bad = True
    if not bad:
        return None
    return (
        f"charge {charge_id} has values no charge can have (epsilon {epsilon!r}, delta "
        f"{delta!r}, points {points!r}, non_private {non_private!r}): it was written outside "
        "the owner"
    )


def _walk_chain(
    conn: sqlite3.Connection, identity: LedgerIdentity | None
) -> tuple[int, int, bytes, list[ChainProblem]]:
    """Walk the charges in id order against their chain hashes (:func:`verify_ledger`).

    Returns ``(charges, sequence, head, problems)``: how many charges there are, the last one
    whose hash matched and that hash (the genesis of ``identity``'s ledger, or ``b""`` without
    an identity, when none did), and the first mismatch or missing hash (every later charge is
    then unverifiable, so not checked).
    """
    problems: list[ChainProblem] = []
    previous = genesis(identity.ledger_id) if identity is not None else b""
    sequence, broken, charges = 0, False, 0
    rows = conn.execute(
        f"SELECT {', '.join('c.' + c.strip() for c in CHAINED_COLUMNS.split(','))}, k.hash "
        "FROM charges c LEFT JOIN charge_chain k ON k.charge = c.id ORDER BY c.id"
    )
    for *row, stored in rows:
        charges += 1
        charge_id = int(row[0])
        if identity is None or broken:
            continue
        if stored is None:
            problems.append(ChainProblem(charge_id, f"charge {charge_id} has no chain hash"))
            broken = True
            continue
        value_problem = charge_value_problem(row)
        if value_problem is not None:
            problems.append(ChainProblem(charge_id, value_problem))
            broken = True
            continue
        expected = charge_hash(previous, tuple(row))
        if expected != bytes(stored):
            problems.append(
                ChainProblem(
                    charge_id,
                    f"charge {charge_id} does not match its chain hash: the charge, or one "
                    "before it, was changed, removed or inserted after it was charged",
                )
            )
            broken = True
            continue
        previous, sequence = expected, charge_id
    return charges, sequence, previous, problems


def verify_ledger(
    conn: sqlite3.Connection,
    *,
    expected_tables: Iterable[str],
    expected_triggers: Iterable[str] = (),
    sqlite_check: bool = True,
    rollbacks: Callable[[sqlite3.Connection], int] | None = None,
) -> Verification:
    """Check a ledger whole: SQLite's integrity, its tables, identity, chain and running totals.

    Parameters
    ----------
    conn : sqlite3.Connection
        The owner's database, opened at the current schema (read-only is enough).
    expected_tables : iterable of str
        Tables the current schema has.
    expected_triggers : iterable of str, default ()
        Triggers that keep its records append-only: one missing was dropped outside the owner
        (to delete or rewrite what it guards, e.g. the keys receipts are checked with).
    sqlite_check : bool, default True
        Whether to run ``PRAGMA integrity_check`` (every page of the file) too; the owner's
        check at start leaves it out (it reads every row it needs anyway).
    rollbacks : callable, optional
        Counts the rollbacks found that the ledger's chain does not resolve
        (:func:`dpmarket.owner.ledger_resolutions.open_rollbacks`); none are counted without it.

    Returns
    -------
    Verification
        ``problems`` lists each failure: a damaged file (``PRAGMA integrity_check``), a missing
        table, no identity, a charge whose chain hash does not match its row and the hash
        before it (the first such charge, and every later one is then unverifiable), a charge
        without a chain row or a chain row without a charge, and running totals
        (``charge_totals``) that differ from the sums of the charges.

    Notes
    -----
    Time and memory are linear in the charges (one pass in id order).
    """
    problems: list[ChainProblem] = []
    integrity = (
        [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if sqlite_check
        else ["ok"]
    )
    if integrity != ["ok"]:
        problems += [ChainProblem(0, f"SQLite integrity check: {m}") for m in integrity[:10]]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = sorted(set(expected_tables) - tables)
    if missing:
        problems.append(ChainProblem(0, f"tables missing: {', '.join(missing)}"))
        return Verification(None, 0, 0, b"", (Fraction(0), Fraction(0), 0), 0, tuple(problems))
    triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    dropped = [t for t in expected_triggers if t not in triggers]
    if dropped:
        problems.append(
            ChainProblem(
                0,
                f"triggers missing: {', '.join(dropped)} (dropped outside the owner, to delete or "
                "change the records they keep append-only)",
            )
        )
    try:
        identity: LedgerIdentity | None = read_identity(conn)
    except ValueError as exc:
        identity = None
        problems.append(ChainProblem(0, str(exc)))
    charges, sequence, previous, chain_problems = _walk_chain(conn, identity)
    problems += chain_problems
    epsilon, delta, points = Fraction(0), Fraction(0), 0
    orphans = conn.execute(
        "SELECT charge FROM charge_chain WHERE charge NOT IN (SELECT id FROM charges) "
        "ORDER BY charge LIMIT 10"
    ).fetchall()
    problems += [ChainProblem(int(r[0]), f"chain hash of a missing charge {r[0]}") for r in orphans]
    # Exact sums (each distinct double times its count), grouped by SQLite: a Fraction per
    # distinct value, not per charge.
    for eps, dlt, non_private, count, total in conn.execute(
        "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
        "GROUP BY epsilon, delta, non_private"
    ):
        if not non_private:
            epsilon += Fraction(float(eps)) * int(count)
            delta += Fraction(float(dlt)) * int(count)
        points += int(total)
    problems += _check_totals(conn)
    open_rollbacks = 0 if rollbacks is None or identity is None else rollbacks(conn)
    return Verification(
        identity=identity,
        charges=charges,
        sequence=sequence,
        head=previous,
        totals=(epsilon, delta, points),
        open_rollbacks=int(open_rollbacks),
        problems=tuple(problems),
    )


def recomputed_totals(conn: sqlite3.Connection) -> dict[TotalsKey, TotalsValue]:
    """What every ``charge_totals`` row must hold, recomputed from ``charges`` (one grouped
    scan of every charge: O(history))."""
    return {
        (int(r[0]), float(r[1]), float(r[2]), int(r[3])): (int(r[4]), int(r[5]))
        for r in conn.execute(
            "SELECT CAST(at / 86400 AS INTEGER), epsilon, delta, non_private, COUNT(*), "
            "SUM(points) FROM charges GROUP BY CAST(at / 86400 AS INTEGER), epsilon, delta, "
            "non_private"
        )
    }


def _check_totals(conn: sqlite3.Connection) -> list[ChainProblem]:
    """Differences between ``charge_totals`` and the same sums recomputed from ``charges``."""
    recomputed = recomputed_totals(conn)
    stored = {
        (int(r[0]), float(r[1]), float(r[2]), int(r[3])): (int(r[4]), int(r[5]))
        for r in conn.execute(
            "SELECT day, epsilon, delta, non_private, charges, points FROM charge_totals"
        )
    }
    problems = []
    for key in sorted(set(recomputed) | set(stored), key=lambda k: (k[0], k[1], k[2], k[3])):
        if recomputed.get(key) != stored.get(key):
            day, eps, dlt, non_private = key
            eps_text = "inf" if math.isinf(eps) else f"{eps:g}"
            problems.append(
                ChainProblem(
                    0,
                    f"running totals of day {day} (epsilon {eps_text}, delta {dlt:g}"
                    f"{', non-private' if non_private else ''}) hold (charges, points) "
                    f"{stored.get(key, (0, 0))}, the charges sum to {recomputed.get(key, (0, 0))}",
                )
            )
    return problems
