"""Whether a rollback an owner found is resolved, decided from its ledger's hash chain.

A ledger found behind a receipt its owner signed (:meth:`dpmarket.owner.ledger.OwnerLedger.
check_receipt`) refuses every charge until its operator resolves it. What resolves it must not be
a row that an edit of the file can add or change: ``ledger_rollbacks`` (the detections) and
``meta`` are not chained, and a ``resolved_at`` set by ``sqlite3``, or a ``superseded ledger``
row written before the owner first saw the receipt, gave a rolled-back ledger its budget back.
So every resolution is a *chained entry* of the ledger (a row of ``charges`` with its chain
hash: an edit or a deletion breaks ``verify`` and the owner's check at start), written by the
operator's command, and the owner re-derives, from the receipt and those entries alone, whether
the receipt is resolved (:func:`receipt_resolved`):

* a receipt of **this ledger** is resolved when the ledger holds its state (the chain's hash at
  the receipt's charge is the receipt's head: a newer backup restored), or when a charge-back
  entry naming it (session :func:`rollback_session`) charges at least what the receipt's sealed
  lifetime totals hold beyond the charges the ledger shared with it when the entry was written
  (:func:`owed`, recomputed: an entry appended with less does not count);
* a receipt of **another ledger** of this owner is resolved by a supersession entry naming that
  ledger and a charge of it at or beyond the receipt's (:func:`supersession_through_session`):
  ``resolve --accept-replaced-ledger`` writes one bounded at the receipt's charge (nothing
  charged: that ledger's totals are sealed under its own key), which the ledger's record then
  shows as the operator's acceptance of the loss; ``restore --replace-other-ledger`` writes one
  that charges the replaced ledger's lifetime totals as found (it must verify, with no rollback
  open) and names its last charge, and keeps that ledger's sealing key. Either resolves that
  ledger's receipts up to that charge only, and, with the key, a receipt whose totals the
  supersession entries of that ledger charged already (:func:`beyond_replaced`: the replaced
  ledger had resolved a rollback of its own, so its charges are numbered otherwise than the
  receipt's chain). A receipt of a later charge (that ledger served again: two disks swapped
  back and forth, or the replaced file was older than, or emptied behind, a receipt) is a new
  rollback, which an acceptance charges with the key (:func:`beyond_replaced`). An
  unbounded entry of an earlier release (:func:`supersession_session`) covers the receipts of
  that ledger found when it was written;
* a receipt that is **not genuine** (:func:`receipt_genuine`) is resolved by a dismissal entry
  naming its bytes (:func:`dismissal_session`, ``resolve --dismiss-unverified-receipts``). A
  receipt is genuine when its totals open under a sealing key this ledger holds (its own, or a
  replaced ledger's it kept), whoever signed it: the seal is the owner's AES-256-GCM over the
  ledger id, charge, chain head and (receipts of this release) signing time, under a key no
  curator has. Such a receipt is resolved only by a charge-back, never by a dismissal. A
  receipt whose totals do not open is not the owner's even if a key the ledger lists signed it
  (a release before this one listed the key of a CA-issued certificate named like the owner
  from a receipt a curator presented; whoever holds the CA's key issues one): it is dismissable.
  Only a receipt of another ledger whose sealing key this ledger does not hold is judged by its
  signature (a key ``ledger_keys`` lists). No key is listed from a receipt, and the
  certificate a curator presents with one is evidence of nothing.

``ledger_rollbacks.resolved_at`` is kept as a note for the operator; no decision reads it.
Deleting a detection row only lets the owner serve until a curator presents the receipt again,
when it is found again; it gives no budget back.

What an in-file record cannot do: the chain is a plain SHA-256 chain, so someone who runs code
against the file can append an entry with a valid hash (what ``resolve`` itself does). A
charge-back appended so must charge what the receipt shows lost; a supersession or dismissal
appended so is on the ledger's record (``dpmarket owner ledger`` lists it) like the operator's
own.
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from fractions import Fraction

from google.protobuf.message import DecodeError

from dpmarket.owner.ledger_chain import hash_at
from dpmarket.owner.receipts import ReceiptError, SealedTotals, open_receipt, unseal_state
from dpmarket.v1 import privacy_pb2

__all__ = [
    "DISMISSED_PREFIX",
    "ROLLBACK_PREFIX",
    "SUPERSEDED_PREFIX",
    "Owed",
    "beyond_replaced",
    "dismissal_session",
    "listed_signature",
    "open_rollbacks",
    "owed",
    "parse_state",
    "receipt_genuine",
    "receipt_resolved",
    "rollback_session",
    "sealing_key",
    "superseded_ledgers",
    "superseded_through",
    "supersession_session",
    "supersession_through_session",
]

#: Session prefixes of the chained entries that resolve a rollback, written only by the
#: operator's ``dpmarket owner ledger resolve`` / ``restore``: the ledger refuses to charge a
#: session whose id starts with one (a curator cannot make its session's charges pass for one).
ROLLBACK_PREFIX = "ledger-rollback-"
SUPERSEDED_PREFIX = "ledger-superseded-"
DISMISSED_PREFIX = "ledger-dismissed-"


def supersession_through_session(ledger_id: str, sequence: int) -> str:
    """The session of a supersession entry written by ``restore --replace-other-ledger``: the
    replaced ledger ``ledger_id`` as it was found, verified, up to its charge ``sequence`` (what
    the entry charged). It resolves that ledger's receipts up to that charge only: a receipt of a
    later charge shows the replaced file was behind it (an older copy, or emptied), so what it
    lost was not counted."""
    return f"{SUPERSEDED_PREFIX}{ledger_id}-through-{int(sequence)}"


def superseded_through(conn: sqlite3.Connection, ledger_id: str) -> int:
    """The furthest charge of ledger ``ledger_id`` a chained supersession entry covers (-1:
    none): the charge its session names (``restore --replace-other-ledger``, ``resolve
    --accept-replaced-ledger``), or, for an entry without one (``ledger-superseded-<id>``,
    written by ``resolve --accept-replaced-ledger`` of an earlier release, which covered every
    later receipt of that ledger), the furthest charge of a receipt of that ledger the ledger
    had found when the entry was written (:func:`_legacy_bound`)."""
    prefix = f"{SUPERSEDED_PREFIX}{ledger_id}"
    found = -1
    for session, at in conn.execute(
        "SELECT c.session, c.at FROM charges c JOIN charge_chain k ON k.charge = c.id "
        "WHERE substr(c.session, 1, ?) = ?",
        (len(prefix), prefix),
    ):
        tail = str(session)[len(prefix) :]
        if tail.startswith("-through-") and tail[len("-through-") :].isdigit():
            found = max(found, int(tail[len("-through-") :]))
        elif not tail:
            found = max(found, _legacy_bound(conn, ledger_id, float(at)))
    return found


def superseded_ledgers(
    conn: sqlite3.Connection,
) -> dict[str, tuple[tuple[Fraction, Fraction, int], int]]:
    """Every ledger this one records replacing (its chained supersession entries), with what
    those entries charged of it (exact epsilon and delta, points) and the furthest charge of it
    they cover (:func:`superseded_through`): what a restore that replaces this ledger carries
    over into the restored one, so that the whole chain of replaced ledgers stays counted."""
    sums: dict[str, tuple[Fraction, Fraction, int]] = {}
    for session, eps, dlt, points in conn.execute(
        "SELECT c.session, c.epsilon, c.delta, c.points FROM charges c JOIN charge_chain k "
        "ON k.charge = c.id WHERE substr(c.session, 1, ?) = ?",
        (len(SUPERSEDED_PREFIX), SUPERSEDED_PREFIX),
    ):
        ledger_id = str(session)[len(SUPERSEDED_PREFIX) :].split("-through-")[0]
        e, d, n = sums.get(ledger_id, (Fraction(0), Fraction(0), 0))
        sums[ledger_id] = (e + Fraction(float(eps)), d + Fraction(float(dlt)), n + int(points))
    return {lid: (spent, superseded_through(conn, lid)) for lid, spent in sums.items()}


def _legacy_bound(conn: sqlite3.Connection, ledger_id: str, at: float) -> int:
    """The furthest charge of the receipts of ledger ``ledger_id`` found (``ledger_rollbacks``,
    whose rows cannot be deleted or their receipts changed) at or before Unix time ``at``: what
    an unbounded acceptance written then was about (-1: none)."""
    found = -1
    for (blob,) in conn.execute(
        "SELECT receipt FROM ledger_rollbacks WHERE detected_at <= ?", (at,)
    ):
        try:
            state = parse_state(bytes(blob))
        except DecodeError:
            continue
        if state.ledger_id == ledger_id:
            found = max(found, int(state.sequence))
    return found


def rollback_session(state: privacy_pb2.LedgerState) -> str:
    """The session of the charge-back entry of the receipt ``state``: its charge and head."""
    return f"{ROLLBACK_PREFIX}{int(state.sequence)}-{bytes(state.head).hex()}"


def supersession_session(ledger_id: str) -> str:
    """The session of the entry recording that this ledger replaced ledger ``ledger_id``."""
    return f"{SUPERSEDED_PREFIX}{ledger_id}"


def dismissal_session(receipt: bytes) -> str:
    """The session of the entry dismissing the unverified receipt ``receipt`` (its bytes'
    SHA-256)."""
    return f"{DISMISSED_PREFIX}{hashlib.sha256(receipt).hexdigest()}"


def parse_state(receipt: bytes) -> privacy_pb2.LedgerState:
    """The state a serialized receipt claims, its signature unchecked.

    Raises
    ------
    google.protobuf.message.DecodeError
        If the bytes are not a receipt.
    """
    return privacy_pb2.LedgerState.FromString(privacy_pb2.LedgerReceipt.FromString(receipt).state)


@dataclass(frozen=True)
class Owed:
    """What a receipt's sealed totals hold beyond the charges a ledger shares with it.

    Attributes
    ----------
    epsilon, delta : float
        Rounded up to the next double (delta kept below 1, as a charge's must be); 0 when
        nothing is missing.
    points : int
    """

    epsilon: float
    delta: float
    points: int

    def covered_by(self, epsilon: float, delta: float, points: int) -> bool:
        """Whether a charge of ``(epsilon, delta, points)`` is at least this, in each."""
        return epsilon >= self.epsilon and delta >= self.delta and points >= self.points


def _beyond(lost: SealedTotals, epsilon: Fraction, delta: Fraction, points: int) -> Owed:
    """What ``lost`` (a receipt's sealed totals) shows beyond ``epsilon``, ``delta`` and
    ``points`` already counted: never negative, epsilon and delta rounded up, delta below 1."""
    return Owed(
        epsilon=_round_up(max(lost.epsilon - epsilon, Fraction(0))),
        delta=min(_round_up(max(lost.delta - delta, Fraction(0))), math.nextafter(1.0, 0)),
        points=max(lost.points - points, 0),
    )


def _round_up(value: Fraction) -> float:
    x = float(value)
    return math.nextafter(x, math.inf) if Fraction(x) < value else x


def owed(
    conn: sqlite3.Connection,
    key: bytes,
    state: privacy_pb2.LedgerState,
    *,
    before: int,
    signed: bool = True,
) -> Owed:
    """What the receipt ``state`` shows lost: its sealed lifetime totals minus those of the
    ledger's charges numbered below ``before``, at or below the receipt's charge and made no
    later than the receipt was signed (the charges the ledger shares with it).

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger, inside a transaction or snapshot.
    key : bytes
        The ledger's sealing key (32 bytes).
    state : LedgerState
        The receipt's state.
    before : int
        The first charge not counted as shared: the charge-back entry's own number (what the
        ledger held when it was written), or the next charge's for a new one.
    signed : bool, default True
        Whether a key the ledger lists signed the receipt. The receipt's ``signed_at`` is read
        only when its seal authenticates it (a receipt of this release) or such a key signed
        it; otherwise no charge is counted as shared (the whole sealed totals are owed).

    Returns
    -------
    Owed

    Raises
    ------
    ReceiptError
        If the receipt's totals do not open under ``key`` (not this ledger's receipt).

    Notes
    -----
    Deterministic in the receipt and the chained charges: the owner recomputes it for an entry
    written earlier and finds what ``resolve`` charged then (basic composition, exact sums).
    """
    lost = unseal_state(key, state)
    # The receipt's time, when the seal or an owner's signature authenticates it: otherwise
    # (an earlier release's seal, signed by no key the ledger lists) no charge counts as shared
    # (a time moved later would count the charges made since the restore as shared).
    signed_at = float(state.signed_at) if lost.dated or signed else -math.inf
    epsilon, delta, points = Fraction(0), Fraction(0), 0
    for eps, dlt, non_private, count, total in conn.execute(
        "SELECT epsilon, delta, non_private, COUNT(*), SUM(points) FROM charges "
        "WHERE id < ? AND id <= ? AND at <= ? GROUP BY epsilon, delta, non_private",
        (before, int(state.sequence), signed_at),
    ):
        if not non_private:
            epsilon += Fraction(float(eps)) * int(count)
            delta += Fraction(float(dlt)) * int(count)
        points += int(total)
    return _beyond(lost, epsilon, delta, points)


def beyond_replaced(conn: sqlite3.Connection, state: privacy_pb2.LedgerState) -> Owed | None:
    """What the receipt ``state`` of a ledger this one replaced shows spent beyond the chained
    supersession entries of that ledger here (what ``restore --replace-other-ledger`` and earlier
    acceptances charged of it), when this ledger keeps that ledger's sealing key
    (``replaced_ledgers``, written by the restore).

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger, inside a transaction or snapshot.
    state : LedgerState
        The receipt's state (a ledger id other than this ledger's).

    Returns
    -------
    Owed or None
        None when this ledger does not keep that ledger's key (an acceptance alone: what it
        spent cannot be known here), or the receipt's totals do not open under it.

    Notes
    -----
    The replaced ledger's totals at the receipt's charge minus the sum of the entries, exactly
    (basic composition), rounded up as :func:`owed`: a receipt of the replaced ledger's later
    charges (the file replaced was an older copy of it) is charged what those charges spent.
    """
    row = conn.execute(
        "SELECT seal_key FROM replaced_ledgers WHERE ledger_id = ?", (str(state.ledger_id),)
    ).fetchone()
    if row is None:
        return None
    try:
        lost = unseal_state(bytes(row[0]), state)
    except ReceiptError:
        return None
    prefix = f"{SUPERSEDED_PREFIX}{state.ledger_id}"
    epsilon, delta, points = Fraction(0), Fraction(0), 0
    for eps, dlt, count, total in conn.execute(
        "SELECT c.epsilon, c.delta, COUNT(*), SUM(c.points) FROM charges c JOIN charge_chain k "
        "ON k.charge = c.id WHERE substr(c.session, 1, ?) = ? GROUP BY c.epsilon, c.delta",
        (len(prefix), prefix),
    ):
        epsilon += Fraction(float(eps)) * int(count)
        delta += Fraction(float(dlt)) * int(count)
        points += int(total)
    return _beyond(lost, epsilon, delta, points)


def sealing_key(
    conn: sqlite3.Connection, state: privacy_pb2.LedgerState, *, ledger_id: str, key: bytes
) -> bytes | None:
    """The sealing key this ledger holds for the receipt ``state``: its own (``key``) for a
    receipt of this ledger ``ledger_id``, the kept key of a ledger it replaced by restore
    (``replaced_ledgers``), else None."""
    if state.ledger_id == ledger_id:
        return key
    row = conn.execute(
        "SELECT seal_key FROM replaced_ledgers WHERE ledger_id = ?", (str(state.ledger_id),)
    ).fetchone()
    return None if row is None else bytes(row[0])


def listed_signature(receipt: bytes, keys: dict[str, bytes]) -> bool:
    """Whether a key of ``keys`` (the ledger's ``ledger_keys``) signed the serialized receipt."""
    try:
        open_receipt(privacy_pb2.LedgerReceipt.FromString(receipt), keys)
    except (ReceiptError, DecodeError):
        return False
    return True


def receipt_genuine(
    conn: sqlite3.Connection,
    receipt: bytes,
    *,
    ledger_id: str,
    key: bytes,
    keys: dict[str, bytes],
) -> bool:
    """Whether the serialized receipt is its owner's (*verified*), decided from its seal.

    A receipt this ledger holds a sealing key for (its own, or a replaced ledger's kept by
    restore: :func:`sealing_key`) is genuine exactly when its totals open under that key: the
    seal is AES-256-GCM under a key only the owner's ledger holds, authenticating the receipt's
    ledger id, charge, chain head and (since v2) signing time, so whoever signed it the owner
    sealed it, and a receipt it does not open was not sealed by the owner even if a key the
    ledger lists signed it (a release before this one listed the key of a CA-issued certificate
    named like the owner from a receipt a curator presented). Only for a receipt of another
    ledger whose sealing key this ledger does not hold is the signature the evidence: a key the
    ledger lists must verify it. No key is ever listed from a receipt.
    """
    try:
        state = parse_state(receipt)
    except DecodeError:
        return False
    seal = sealing_key(conn, state, ledger_id=ledger_id, key=key)
    if seal is None:
        return listed_signature(receipt, keys)
    try:
        unseal_state(seal, state)
    except ReceiptError:
        return False
    return True


def _entries(conn: sqlite3.Connection, sessions: list[str]) -> list[tuple[int, float, float, int]]:
    """``(id, epsilon, delta, points)`` of the chained charges of ``sessions``."""
    marks = ", ".join("?" * len(sessions))
    return [
        (int(r[0]), float(r[1]), float(r[2]), int(r[3]))
        for r in conn.execute(
            "SELECT c.id, c.epsilon, c.delta, c.points FROM charges c JOIN charge_chain k "
            f"ON k.charge = c.id WHERE c.session IN ({marks}) ORDER BY c.id",
            sessions,
        )
    ]


def _legacy_sessions(conn: sqlite3.Connection, state: privacy_pb2.LedgerState) -> list[str]:
    """Charge-back sessions of the release before schema 7 (``ledger-rollback-<row>``) for the
    detections of this receipt: they count only if they charge what it owes (:func:`owed`)."""
    rows = conn.execute(
        "SELECT id FROM ledger_rollbacks WHERE sequence = ? AND head = ?",
        (int(state.sequence), bytes(state.head)),
    )
    return [f"{ROLLBACK_PREFIX}{int(r[0])}" for r in rows]


def receipt_resolved(
    conn: sqlite3.Connection,
    receipt: bytes,
    *,
    ledger_id: str,
    key: bytes,
    keys: dict[str, bytes],
    verified: bool | None = None,
) -> bool:
    """Whether the ledger's chain holds this receipt's state or an entry that resolves it.

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger, inside a transaction or snapshot.
    receipt : bytes
        A serialized ``LedgerReceipt`` naming this ledger's owner.
    ledger_id : str
        This ledger's id.
    key : bytes
        Its sealing key.
    keys : dict of str to bytes
        Its certificate keys (``ledger_keys``): fingerprint -> DER public key.
    verified : bool, optional
        Whether the receipt is genuine (:func:`receipt_genuine`), when the caller decided it
        already.

    Returns
    -------
    bool
        See the module's docstring for the rules. False for bytes that are no receipt.
    """
    try:
        state = parse_state(receipt)
    except DecodeError:  # any bytes may be stored: unreadable is unresolved
        return False
    mine = state.ledger_id == ledger_id
    if mine and hash_at(conn, int(state.sequence)) == bytes(state.head):
        return True
    if verified is None:
        verified = receipt_genuine(conn, receipt, ledger_id=ledger_id, key=key, keys=keys)
    dismissed = not verified and bool(_entries(conn, [dismissal_session(receipt)]))
    if not mine:
        if dismissed or superseded_through(conn, state.ledger_id) >= int(state.sequence):
            return True
        beyond = beyond_replaced(conn, state)  # its totals counted here already
        return beyond is not None and beyond.covered_by(0.0, 0.0, 0)
    try:
        unseal_state(key, state)
    except ReceiptError:
        return dismissed  # not this ledger's receipt: only a dismissal resolves it
    sessions = [rollback_session(state), *_legacy_sessions(conn, state)]
    signed = listed_signature(receipt, keys)
    return any(
        owed(conn, key, state, before=number, signed=signed).covered_by(epsilon, delta, points)
        for number, epsilon, delta, points in _entries(conn, sessions)
    )


def open_rollbacks(conn: sqlite3.Connection, *, skip: Collection[int] = ()) -> list[int]:
    """The numbers of the rollbacks found (``ledger_rollbacks``) whose receipts the chain does
    not resolve (:func:`receipt_resolved`), oldest first; ``resolved_at`` is not read.

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger, inside a transaction or snapshot.
    skip : collection of int
        Rollbacks known to be resolved (not decided again: a resolution stays one while the
        chain only grows, which the owner's guard checks).

    Notes
    -----
    For each rollback decided: a signature check, an unseal and one grouped scan of the charges
    up to its receipt per charge-back entry naming it.
    """
    (ledger_id, key) = conn.execute("SELECT ledger_id, seal_key FROM ledger_identity").fetchone()
    keys = {
        str(f): bytes(k) for f, k in conn.execute("SELECT fingerprint, public_key FROM ledger_keys")
    }
    return [
        int(number)
        for number, blob in conn.execute("SELECT id, receipt FROM ledger_rollbacks ORDER BY id")
        if int(number) not in skip
        and not receipt_resolved(
            conn, bytes(blob), ledger_id=str(ledger_id), key=bytes(key), keys=keys
        )
    ]
