"""Who a party is: its role and name, read only from a certificate the deployment CA issued.

A dpmarket identity is a pair ``(role, name)``: the role is one of ``curator``, ``owner``,
``consumer`` and the name is a DNS label. A certificate carries it three times, and all three must
agree: the URI SAN ``spiffe://dpmarket/<role>/<name>`` (the authoritative copy), the subject
(``OU=<role>``, ``CN=<name>``) and the DNS SAN ``<name>.<role>.dpmarket`` that clients check the
server against at the TLS handshake (:mod:`dpmarket.runtime.transport`). Services never take a role
or a name from a message body (docs/how-it-works.md, Trust model); they call :func:`peer_identity`.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

Role = Literal["curator", "owner", "consumer"]
#: Every role, in the order the protocol meets them.
ROLES: tuple[Role, ...] = cast(tuple[Role, ...], get_args(Role))

#: A name is a DNS label (RFC 1123): 1 to 63 letters, digits and inner hyphens; case is kept.
#: Match it with ``fullmatch``.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")

#: SPIFFE trust domain of every dpmarket identity, and the DNS suffix of the server names.
TRUST_DOMAIN = "dpmarket"
_SPIFFE_PREFIX = f"spiffe://{TRUST_DOMAIN}/"

#: Key of the peer's PEM certificate in a gRPC auth context (set by the TLS handshake).
_AUTH_PEM_KEY = "x509_pem_cert"

#: File name of the deployment CA's certificate, in the CA's directory and in every party's.
CA_CERT = "ca.crt"


@dataclass(frozen=True)
class Identity:
    """The role and name of a party, as its certificate states them.

    Parameters
    ----------
    role : {"curator", "owner", "consumer"}
    name : str
        A DNS label (:data:`NAME_PATTERN`), e.g. ``"owner-0"``; case is kept in the identity.

    Raises
    ------
    ValueError
        If ``role`` is not in :data:`ROLES` or ``name`` is not a DNS label.

    Notes
    -----
    :attr:`dns_name` lowercases the name because TLS host name checks ignore case, so two names
    that differ only in case (``owner-UA``, ``owner-ua``) cannot be told apart at the handshake of
    a client with the server. A deployment must not issue both.
    """

    role: Role
    name: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not isinstance(self.name, str) or NAME_PATTERN.fullmatch(self.name) is None:
            raise ValueError(
                "name must be a DNS label (1-63 letters, digits or inner hyphens), "
                f"got {self.name!r}"
            )

    def __str__(self) -> str:
        return f"{self.role}:{self.name}"

    @property
    def uri(self) -> str:
        """The URI SAN that carries this identity: ``spiffe://dpmarket/<role>/<name>``."""
        return f"{_SPIFFE_PREFIX}{self.role}/{self.name}"

    @property
    def dns_name(self) -> str:
        """The DNS SAN a client checks the server against: ``<name lowercased>.<role>.dpmarket``."""
        return f"{self.name.lower()}.{self.role}.{TRUST_DOMAIN}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """Parse ``"role:name"`` (the form :meth:`__str__` writes), e.g. ``"owner:owner-0"``.

        Raises
        ------
        ValueError
            If ``text`` has no ``:`` or the role or name is invalid.
        """
        role, sep, name = text.partition(":")
        if not sep:
            raise ValueError(f"identity must be written role:name, got {text!r}")
        return cls(cast(Role, role), name)


#: A public-key pin: the SHA-256 of a key's SubjectPublicKeyInfo, 64 hexadecimal digits.
FINGERPRINT_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def key_fingerprint(cert: x509.Certificate) -> str:
    """The pin of a certificate's public key: SHA-256 of its SubjectPublicKeyInfo (DER), as 64
    lowercase hexadecimal digits (the form of an owner policy's ``[peers]`` entries and of
    ``dpmarket pki show``'s "public-key pin" line).

    The pin names the key, not the certificate: a certificate re-issued for the same key keeps
    it, and a certificate the CA mints for the same name with another key has another one. That
    is what makes it worth pinning: whoever holds the CA's key can issue a certificate under any
    name, but not one for a key it does not hold.
    """
    return public_key_fingerprint(cert.public_key())


def public_key_fingerprint(key: CertificatePublicKeyTypes) -> str:
    """:func:`key_fingerprint` of a bare public key (SHA-256 of its SubjectPublicKeyInfo)."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def normalize_fingerprint(text: str) -> str:
    """A pin as written by a person: 64 hexadecimal digits, case ignored, optionally prefixed
    ``sha256:`` and grouped by ``:`` (as ``openssl`` prints them); return the canonical form.

    Raises
    ------
    ValueError
        If ``text`` is not a string of 64 hexadecimal digits in that form; the message says how
        to get one (``dpmarket pki show CERT``).
    """
    if not isinstance(text, str):
        raise ValueError(f"a public-key pin must be a string, got {text!r}")
    body = text.strip().lower().removeprefix("sha256:").replace(":", "")
    if FINGERPRINT_PATTERN.fullmatch(body) is None:
        raise ValueError(
            f"a public-key pin is the SHA-256 of the key, 64 hexadecimal digits, got {text!r} "
            "(dpmarket pki show CERT prints it as 'public-key pin')"
        )
    return body


def identity_files(directory: Path, identity: Identity) -> tuple[Path, Path, Path]:
    """Return the paths ``(ca.crt, <role>-<name>.crt, <role>-<name>.key)`` in ``directory``.

    The order is the one :meth:`dpmarket.runtime.transport.TransportSecurity.from_files` takes.
    """
    stem = f"{identity.role}-{identity.name}"
    directory = Path(directory)
    return directory / CA_CERT, directory / f"{stem}.crt", directory / f"{stem}.key"


def identity_from_certificate(cert: x509.Certificate) -> Identity:
    """Read the dpmarket identity of a certificate.

    The identity is the one URI SAN ``spiffe://dpmarket/<role>/<name>``; the subject must repeat
    it (``OU=<role>``, ``CN=<name>``) and every DNS SAN under ``.dpmarket`` must be
    ``<name lowercased>.<role>.dpmarket``. This function does not verify the signature: call it on
    a certificate that was verified against the CA (the TLS handshake, or
    :meth:`dpmarket.runtime.transport.TransportSecurity.from_files`).

    Parameters
    ----------
    cert : cryptography.x509.Certificate

    Returns
    -------
    Identity

    Raises
    ------
    ValueError
        If the certificate has no SPIFFE URI SAN, more than one, one outside the ``dpmarket``
        trust domain or not of the form ``/<role>/<name>``, or if its subject or DNS SANs disagree
        with that URI. The message names what was found.
    """
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise ValueError(
            f"certificate {cert.subject.rfc4514_string()!r} has no subjectAltName, "
            f"so no {_SPIFFE_PREFIX}<role>/<name> URI"
        ) from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    spiffe = [uri for uri in uris if uri.lower().startswith("spiffe://")]
    if len(spiffe) != 1:
        raise ValueError(
            f"certificate {cert.subject.rfc4514_string()!r} must carry exactly one "
            f"{_SPIFFE_PREFIX}<role>/<name> URI SAN, found URIs {uris}"
        )
    uri = spiffe[0]
    parts = uri[len(_SPIFFE_PREFIX) :].split("/") if uri.startswith(_SPIFFE_PREFIX) else []
    if len(parts) != 2:
        raise ValueError(f"URI SAN {uri!r} is not of the form {_SPIFFE_PREFIX}<role>/<name>")
    try:
        identity = Identity(cast(Role, parts[0]), parts[1])
    except ValueError as exc:
        raise ValueError(f"URI SAN {uri!r}: {exc}") from None

    units = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if units != [identity.role]:
        raise ValueError(f"URI SAN {uri!r} names role {identity.role!r} but subject OU is {units}")
    if names != [identity.name]:
        raise ValueError(f"URI SAN {uri!r} names {identity.name!r} but subject CN is {names}")
    suffix = f".{TRUST_DOMAIN}"
    for dns in san.get_values_for_type(x509.DNSName):
        host = dns.lower().rstrip(".")
        if host.endswith(suffix) and host != identity.dns_name:
            raise ValueError(
                f"URI SAN {uri!r} requires DNS SAN {identity.dns_name!r}, found DNS SAN {dns!r}"
            )
    return identity


def identity_from_pem(pem: bytes) -> Identity:
    """Read the dpmarket identity of a PEM certificate (the first one in ``pem``).

    Raises
    ------
    ValueError
        If ``pem`` holds no PEM certificate, or as :func:`identity_from_certificate`.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate: {exc}") from None
    return identity_from_certificate(cert)


def peer_identity(context: grpc.ServicerContext | grpc.aio.ServicerContext) -> Identity | None:
    """Return the verified identity of the peer of an RPC, or None if it has none.

    Parameters
    ----------
    context : grpc.ServicerContext or grpc.aio.ServicerContext
        The context of the call being served.

    Returns
    -------
    Identity or None
        None when the peer presented no certificate: a plaintext server
        (:meth:`dpmarket.runtime.transport.TransportSecurity.plaintext`), where nobody has an
        identity.

    Raises
    ------
    ValueError
        If the peer's certificate carries no valid dpmarket identity.

    Notes
    -----
    gRPC puts ``x509_pem_cert`` in the auth context only after the TLS handshake verified the peer's
    certificate against the server's root certificates; a server built with
    :func:`dpmarket.runtime.transport.add_port` requires that certificate, so on such a server every
    call that reaches a handler has a verified identity and None never occurs.

    A service's callers are few and call often (a curator: K owners' bids every round), so each
    distinct certificate is parsed once (:data:`PEER_CACHE_SIZE` kept, least recently used
    dropped): parsing took about 30 us a call. A certificate that carries no identity is not
    remembered; it fails again on every call.
    """
    values = context.auth_context().get(_AUTH_PEM_KEY)
    if not values:
        return None
    # The auth context maps each key to a list of values; gRPC's stubs disagree on that.
    pem = values if isinstance(values, bytes) else next(iter(values))
    return _peer_identity_of(pem)


#: Distinct peer certificates whose identity :func:`peer_identity` keeps.
PEER_CACHE_SIZE = 1024

#: :func:`identity_from_pem` of a verified peer certificate, parsed once per certificate (an
#: :class:`Identity` is immutable; exceptions are not cached).
_peer_identity_of = functools.lru_cache(maxsize=PEER_CACHE_SIZE)(identity_from_pem)


def peer_certificate_pem(context: grpc.ServicerContext | grpc.aio.ServicerContext) -> bytes | None:
    """The caller's certificate (PEM) as verified in the call's mTLS handshake, or None without
    one (plaintext transport)."""
    values = context.auth_context().get(_AUTH_PEM_KEY)
    if not values:
        return None
    return bytes(values if isinstance(values, bytes) else next(iter(values)))


def peer_public_key(
    context: grpc.ServicerContext | grpc.aio.ServicerContext,
) -> CertificatePublicKeyTypes | None:
    """The public key of the caller's verified certificate (what it signs documents with), or
    None without one (plaintext transport).

    Raises
    ------
    ValueError
        If the certificate in the auth context cannot be parsed.
    """
    pem = peer_certificate_pem(context)
    if pem is None:
        return None
    return x509.load_pem_x509_certificates(pem)[0].public_key()


def check_issued_by(
    cert: x509.Certificate, cas: list[x509.Certificate], *, valid_now: bool = True
) -> x509.Certificate:
    """The CA of ``cas`` that issued ``cert``, once the pair is checked as a TLS handshake would:
    ``cert`` is signed directly by it, the issuer is a CA certificate (``BasicConstraints``
    ``ca=True``, so an end-entity certificate of the deployment cannot stand in for the CA), and
    both are valid now (unless ``valid_now`` is false).

    The one check behind a service's own credentials
    (:func:`dpmarket.runtime.transport.load_credentials`) and a certificate handed over with a
    signed document (:func:`certified_public_key`).

    Parameters
    ----------
    cert : cryptography.x509.Certificate
        The certificate to check.
    cas : list of cryptography.x509.Certificate
        The deployment's CA certificate(s).
    valid_now : bool, default True
        Check both validity periods against the clock. False only to attribute a document
        signed *in the past* with a certificate key (an owner's ledger receipt,
        :func:`dpmarket.owner.receipts.receipt_certificate_key`): a certificate that expired or
        was replaced since still says which key the CA issued to whom; it authenticates no
        connection then.

    Returns
    -------
    cryptography.x509.Certificate
        The issuing CA.

    Raises
    ------
    ValueError
        If no certificate of ``cas`` signed ``cert``, the signer is not a CA certificate, or
        either is not valid now (with ``valid_now``); the message names the certificate (by
        subject) and the reason.
    """
    subject = cert.subject.rfc4514_string()
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        break
    else:
        raise ValueError(
            f"certificate {subject!r} (issuer {cert.issuer.rfc4514_string()!r}) is not issued "
            f"by this deployment's CA ({[ca.subject.rfc4514_string() for ca in cas]})"
        )
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise ValueError(f"{ca.subject.rfc4514_string()!r} is not a CA certificate")
    if not valid_now:
        return ca
    now = datetime.datetime.now(datetime.UTC)
    for checked in (ca, cert):
        start, end = checked.not_valid_before_utc, checked.not_valid_after_utc
        if not start <= now <= end:
            raise ValueError(
                f"certificate {checked.subject.rfc4514_string()!r} is valid from "
                f"{start.isoformat()} to {end.isoformat()}, not now ({now.isoformat()})"
            )
    return ca


def certified_public_key(
    cert_pem: bytes, ca_pem: bytes, expected: Identity
) -> CertificatePublicKeyTypes:
    """The public key of ``cert_pem`` once the certificate is checked as a TLS handshake would:
    issued directly by a CA of ``ca_pem``, valid now, and carrying the identity ``expected``.

    What a party uses to check a document another party signed with its certificate key and
    handed over with the certificate (a consumer checks the curator's settlement statements
    this way: :meth:`dpmarket.consumer.client.CuratorClient.statements`).

    Parameters
    ----------
    cert_pem : bytes
        The signer's certificate, PEM (the first certificate is the one checked).
    ca_pem : bytes
        The deployment CA certificate(s), PEM.
    expected : Identity
        Who must have signed.

    Returns
    -------
    EC, Ed25519, RSA... public key

    Raises
    ------
    ValueError
        If ``cert_pem`` holds no certificate, no CA of ``ca_pem`` issued it, it is not valid now,
        or it names another identity (or none); the message says which.
    """
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise ValueError(f"the certificate of {expected} is not a PEM certificate: {exc}") from None
    try:
        check_issued_by(cert, cas)
    except ValueError as exc:
        raise ValueError(f"the certificate presented for {expected}: {exc}") from None
    found = identity_from_certificate(cert)
    if found != expected:
        raise ValueError(f"a certificate of {found} was presented for {expected}")
    return cert.public_key()
