"""Signed receipts of an owner's ledger: what lets a ledger restored from an older copy be found.

An owner signs, with its own certificate key, the state of its ledger when a session or job
closes (a ``LedgerState`` message: the ledger's id, the sequence number of its last charge and
the hash chain's head there, :mod:`dpmarket.owner.ledger_chain`) and returns it to the curator,
which keeps the last receipt per owner and presents it when it next opens a session or job with
that owner (:mod:`dpmarket.curator.store`). The owner checks a presented receipt against its own
ledger (:meth:`dpmarket.owner.ledger.OwnerLedger.check_receipt`): a ledger that holds fewer
charges than a receipt it signed, or other charges up to it, has lost charges, and the owner
refuses to serve.

Only the owner reads a receipt. The ledger's running totals travel in it encrypted under a key
only the ledger holds (AES-256-GCM, authenticating the ledger id, the charge, the chain head and
the signing time), so that its operator can charge back exactly what a rollback lost
(:meth:`dpmarket.owner.ledger.OwnerLedger.resolve_rollbacks`) without telling any curator how
much of the owner's budget is spent. That seal, not the signature, is what makes a receipt the
owner's (:func:`dpmarket.owner.ledger_resolutions.receipt_genuine`): a curator holding the CA's
key can have a certificate named like the owner and sign anything with it, but cannot seal. A
receipt whose seal does not open is recorded and refused until the operator resolves it: a
curator presenting forged ones can make an owner wait for its operator, who may then dismiss
them on record; a curator can withhold its receipt (see docs/howto-ledger.md for what that
leaves). The signature (the owner's certificate key) still decides for a receipt of another
ledger of the owner whose sealing key this ledger does not hold.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from fractions import Fraction

from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError

from dpmarket.runtime.identity import check_issued_by, identity_from_certificate
from dpmarket.v1 import privacy_pb2

__all__ = [
    "RECEIPT_CONTEXT",
    "ReceiptError",
    "SealedTotals",
    "Signer",
    "open_receipt",
    "public_key_der",
    "public_key_fingerprint",
    "receipt_certificate_key",
    "seal_totals",
    "sign_receipt",
    "unseal_state",
    "unseal_totals",
]

#: Prefix of every signed receipt: the owner's key also signs TLS handshakes and secure
#: aggregation messages, and none of those can be taken for a receipt.
RECEIPT_CONTEXT = b"dpmarket ledger receipt v1\x00"
_NONCE_BYTES = 12


class ReceiptError(ValueError):
    """A presented receipt is not one this ledger can use: malformed, not signed by any of the
    ledger's keys, or of another ledger. The message is for the owner's own console."""


@dataclass(frozen=True)
class SealedTotals:
    """A ledger's running totals at a sequence number, as sealed in a receipt.

    Attributes
    ----------
    epsilon, delta : Fraction
        Exact sums over the private charges up to the sequence number (basic composition).
    points : int
        Raw points released, non-private releases included.
    """

    epsilon: Fraction
    delta: Fraction
    points: int
    #: Whether the seal authenticates the receipt's ``signed_at`` too (sealed by this release:
    #: v2); False for a seal of an earlier release (v1), whose time only the signature covers.
    dated: bool = False


class Signer:
    """The owner's receipt-signing key: the private key of its certificate.

    Parameters
    ----------
    private_key : EllipticCurvePrivateKey
        The key of the owner's mTLS certificate (ECDSA; the deployment issues P-256 keys).

    Raises
    ------
    ValueError
        If the key is not an elliptic-curve key.
    """

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private_key, ec.EllipticCurvePrivateKey):
            raise ValueError(
                f"receipts are signed with an elliptic-curve key, got {type(private_key).__name__}"
            )
        self._key = private_key

    @classmethod
    def from_pem(cls, key_pem: bytes) -> Signer:
        """From an unencrypted PEM private key (the owner's ``owner-NAME.key``)."""
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(
                f"receipts are signed with an elliptic-curve key, got {type(key).__name__}"
            )
        return cls(key)

    @property
    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key.public_key()

    def sign(self, state: bytes) -> bytes:
        """ECDSA/SHA-256 signature (DER) of :data:`RECEIPT_CONTEXT` + ``state``."""
        return self._key.sign(RECEIPT_CONTEXT + state, ec.ECDSA(hashes.SHA256()))


def public_key_der(key: ec.EllipticCurvePublicKey) -> bytes:
    """A public key as DER SubjectPublicKeyInfo (how the ledger records its keys)."""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_key_fingerprint(der: bytes) -> str:
    """SHA-256 of a DER SubjectPublicKeyInfo, hex: a key's name in the ledger and in messages."""
    return hashlib.sha256(der).hexdigest()


def _aad(ledger_id: str, sequence: int, head: bytes, signed_at: float | None) -> bytes:
    """What the seal authenticates: v1 (earlier releases) the ledger id, charge and head; v2
    the receipt's signing time too (IEEE double, little-endian)."""
    if signed_at is None:
        return f"dpmarket ledger totals v1\x00{ledger_id}\x00{sequence}\x00".encode() + head
    prefix = f"dpmarket ledger totals v2\x00{ledger_id}\x00{sequence}\x00".encode()
    return prefix + struct.pack("<d", float(signed_at)) + head


def seal_totals(
    key: bytes,
    totals: SealedTotals,
    *,
    ledger_id: str,
    sequence: int,
    head: bytes,
    signed_at: float | None = None,
) -> bytes:
    """Encrypt ``totals`` with AES-256-GCM under the ledger's own key, bound to the state.

    Returns nonce (12 random bytes) + ciphertext + tag. The exact sums are kept as fractions
    (numerator/denominator strings), so the charge-back on a rollback adds no rounding. The
    authenticated data is the ledger id, the charge and the chain head, and ``signed_at`` (Unix
    seconds) when given (v2, what :meth:`~dpmarket.owner.ledger.OwnerLedger.receipt` seals): a
    receipt's seal then authenticates every field a charge-back reads, whoever signed it.
    """
    plain = json.dumps(
        {
            "epsilon": [str(totals.epsilon.numerator), str(totals.epsilon.denominator)],
            "delta": [str(totals.delta.numerator), str(totals.delta.denominator)],
            "points": totals.points,
        },
        sort_keys=True,
    ).encode()
    nonce = os.urandom(_NONCE_BYTES)
    aad = _aad(ledger_id, sequence, head, signed_at)
    return nonce + AESGCM(key).encrypt(nonce, plain, aad)


def unseal_totals(
    key: bytes,
    sealed: bytes,
    *,
    ledger_id: str,
    sequence: int,
    head: bytes,
    signed_at: float | None = None,
) -> SealedTotals:
    """Decrypt what :func:`seal_totals` sealed: as sealed with ``signed_at`` (v2: ``dated``),
    else as sealed without it (v1, an earlier release's receipt).

    Raises
    ------
    ReceiptError
        If ``sealed`` was not sealed under ``key`` for this state, or is malformed.
    """
    nonce, body = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
    times = (signed_at, None) if signed_at is not None else (None,)
    for when in times:
        try:
            plain = AESGCM(key).decrypt(nonce, body, _aad(ledger_id, sequence, head, when))
        except InvalidTag:
            continue
        except ValueError as exc:
            raise ReceiptError(f"the receipt's sealed totals do not open: {exc!r}") from None
        try:
            data = json.loads(plain)
            return SealedTotals(
                epsilon=Fraction(int(data["epsilon"][0]), int(data["epsilon"][1])),
                delta=Fraction(int(data["delta"][0]), int(data["delta"][1])),
                points=int(data["points"]),
                dated=when is not None,
            )
        except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError) as exc:
            raise ReceiptError(f"the receipt's sealed totals do not open: {exc!r}") from None
    raise ReceiptError("the receipt's sealed totals do not open: InvalidTag()")


def unseal_state(key: bytes, state: privacy_pb2.LedgerState) -> SealedTotals:
    """:func:`unseal_totals` of a receipt's ``state``: its sealed totals under ``key``, bound to
    its ledger id, charge, head and signing time.

    Raises
    ------
    ReceiptError
        If the totals were not sealed under ``key`` for this state, or are malformed.
    """
    return unseal_totals(
        key,
        state.sealed_totals,
        ledger_id=state.ledger_id,
        sequence=state.sequence,
        head=bytes(state.head),
        signed_at=state.signed_at,
    )


def sign_receipt(signer: Signer, state: privacy_pb2.LedgerState) -> privacy_pb2.LedgerReceipt:
    """Serialize and sign a ledger state."""
    data = state.SerializeToString()
    return privacy_pb2.LedgerReceipt(state=data, signature=signer.sign(data))


def open_receipt(
    receipt: privacy_pb2.LedgerReceipt, keys: dict[str, bytes]
) -> tuple[privacy_pb2.LedgerState, str]:
    """Check a receipt's signature against the ledger's own keys and read its state.

    Parameters
    ----------
    receipt : LedgerReceipt
    keys : dict of str to bytes
        The ledger's public keys: fingerprint -> DER SubjectPublicKeyInfo.

    Returns
    -------
    (LedgerState, str)
        The signed state and the fingerprint of the key that signed it.

    Raises
    ------
    ReceiptError
        If the receipt is empty or malformed, or no key of ``keys`` signed it.
    """
    if not receipt.state or not receipt.signature:
        raise ReceiptError("the receipt is empty")
    signed = RECEIPT_CONTEXT + receipt.state
    for fingerprint, der in keys.items():
        key = serialization.load_der_public_key(der)
        if not isinstance(key, ec.EllipticCurvePublicKey):
            continue
        try:
            key.verify(receipt.signature, signed, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        try:
            state = privacy_pb2.LedgerState.FromString(receipt.state)
        except DecodeError as exc:
            raise ReceiptError(f"the signed state does not parse: {exc}") from None
        return state, fingerprint
    raise ReceiptError("no key of this ledger signed the receipt")


def receipt_certificate_key(cert_pem: bytes, ca_pem: bytes, owner: str) -> tuple[str, bytes]:
    """The key of the certificate a curator presents with a receipt, once the certificate is
    checked to be one the deployment's CA issued to this owner.

    The curator keeps, with each receipt, the certificate of the owner that returned it. That
    certificate is not what makes a receipt genuine (whoever holds the CA's key issues one named
    like the owner): the receipt's seal is (:func:`dpmarket.owner.ledger_resolutions.
    receipt_genuine`), and the ledger never lists a key from a receipt.

    Parameters
    ----------
    cert_pem : bytes
        The certificate, PEM (the first one is checked).
    ca_pem : bytes
        The owner's CA certificate(s), PEM.
    owner : str
        The owner's name: the certificate must carry ``owner:<owner>``.

    Returns
    -------
    (str, bytes)
        The key's fingerprint and DER SubjectPublicKeyInfo, as ``ledger_keys`` records keys.

    Raises
    ------
    ReceiptError
        If the bytes hold no certificate, no CA of ``ca_pem`` issued it (directly, as a CA
        certificate), or it names another identity (or none).

    Notes
    -----
    The validity period is not checked (``check_issued_by(..., valid_now=False)``): the receipt
    was signed in the past, by a certificate that may have expired or been replaced since (a
    renewed or leaked key); the CA's signature still binds that key to this owner. A stolen
    old key could sign a receipt too, but such a receipt only makes the owner refuse until its
    operator acts, which a curator can cause anyway; it never gives budget back.
    """
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        check_issued_by(cert, x509.load_pem_x509_certificates(ca_pem), valid_now=False)
        found = identity_from_certificate(cert)
    except (ValueError, IndexError) as exc:
        raise ReceiptError(f"the receipt's certificate is not this owner's: {exc}") from None
    if (found.role, found.name) != ("owner", owner):
        raise ReceiptError(f"the receipt's certificate is of {found}, not owner:{owner}")
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ReceiptError("the receipt's certificate key is not an elliptic-curve key")
    der = public_key_der(key)
    return public_key_fingerprint(der), der
