"""Mutual TLS for every dpmarket channel: server ports, client channels, the key material.

Trust model. One deployment CA (``dpmarket pki``, :mod:`deploy.pki`) issues every party a
certificate that names its role and name (:mod:`runtime.identity`); the role and name of a peer
come from that verified certificate and never from a message. Both ends present a certificate and
check the other's against the CA: a server built with :func:`add_port` requires a client
certificate at the handshake, so a client without one, a plaintext client or a client whose
certificate another CA issued fails with ``UNAVAILABLE`` before any handler runs, and handlers read
the caller with :func:`runtime.identity.peer_identity`. A client also checks *which* server it
reached: gRPC's only check of a server's certificate beyond the CA signature is the host name,
so a channel built with an ``expected`` identity sets ``grpc.ssl_target_name_override`` to the
DNS name ``<name>.<role>.dpmarket`` that the CA writes only into that party's certificate. The
handshake then fails unless the server is exactly that role and name: a curator certificate
named ``owner-0`` cannot stand in for owner ``owner-0``, nor one owner for another.
:meth:`TransportSecurity.plaintext` turns all of this off (tests and local demos only): no TLS,
no identities.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from runtime.identity import Identity, identity_from_certificate

logger = logging.getLogger(__name__)


class BindError(RuntimeError):
    """A server cannot bind its address: another process holds the port, or the address is not
    available here. The message names the address."""


#: The channel argument that makes gRPC check the server certificate against a given DNS name.
TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"

ChannelOptions = Sequence[tuple[str, Any]]


@dataclass(frozen=True, repr=False)
class TransportSecurity:
    """The key material of one party: CA certificate, own certificate and private key (PEM).

    Build it with :meth:`from_files` or :meth:`plaintext`; direct construction checks the same
    things as :meth:`from_files`.

    Parameters
    ----------
    ca_pem : bytes or None
        The deployment CA certificate(s), PEM; the roots that peers' certificates must chain to.
    cert_pem : bytes or None
        This party's certificate, PEM, issued by a CA in ``ca_pem``.
    key_pem : bytes or None
        The unencrypted private key of ``cert_pem``, PEM. Never shown by ``repr``.
    insecure : bool, default False
        Plaintext: no TLS and no identities; the three PEM fields must then be None.

    Raises
    ------
    ValueError
        If ``insecure`` is set together with key material, or (when not insecure) a PEM field is
        missing or unreadable, the key does not match the certificate, the certificate is not
        issued by a CA in ``ca_pem``, a certificate is outside its validity period, or the
        certificate carries no dpmarket identity
        (:func:`runtime.identity.identity_from_certificate`).
    """

    ca_pem: bytes | None
    cert_pem: bytes | None
    key_pem: bytes | None
    insecure: bool = False
    _identity: Identity | None = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        if self.insecure:
            given = [
                name
                for name, value in (
                    ("ca_pem", self.ca_pem),
                    ("cert_pem", self.cert_pem),
                    ("key_pem", self.key_pem),
                )
                if value is not None
            ]
            if given:
                raise ValueError(f"a plaintext transport takes no key material, got {given}")
            return
        identity = _check_material(
            self.ca_pem, self.cert_pem, self.key_pem, sources=("ca_pem", "cert_pem", "key_pem")
        )
        object.__setattr__(self, "_identity", identity)

    def __repr__(self) -> str:
        if self.insecure:
            return "TransportSecurity(insecure=True)"
        return f"TransportSecurity(identity={self._identity})"

    @classmethod
    def from_files(
        cls,
        ca: str | os.PathLike[str],
        cert: str | os.PathLike[str],
        key: str | os.PathLike[str],
    ) -> TransportSecurity:
        """Read the CA certificate, own certificate and private key from PEM files and check them.

        Parameters
        ----------
        ca, cert, key : path-like
            Files as ``dpmarket pki issue`` writes them: ``ca.crt``, ``<role>-<name>.crt`` and
            ``<role>-<name>.key`` (:func:`runtime.identity.identity_files`).

        Raises
        ------
        FileNotFoundError
            If a file does not exist; the message names it.
        OSError
            If a file cannot be read; the message names it.
        ValueError
            If a file holds no PEM certificate (or key), the key does not match the certificate,
            the certificate is not issued by the CA, a certificate is expired or not yet valid,
            or the certificate carries no dpmarket identity; the message names the file.
        """
        ca_pem = _read(ca, "CA certificate")
        cert_pem = _read(cert, "certificate")
        key_pem = _read(key, "private key")
        # Checked here to name the files in errors; the constructor checks again.
        _check_material(ca_pem, cert_pem, key_pem, sources=(str(ca), str(cert), str(key)))
        return cls(ca_pem, cert_pem, key_pem)

    @classmethod
    def plaintext(cls) -> TransportSecurity:
        """No TLS: plaintext channels and ports, no identities (tests and local demos only)."""
        return cls(None, None, None, insecure=True)

    @property
    def identity(self) -> Identity | None:
        """This party's own identity, from its certificate; None when insecure."""
        return self._identity

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS server credentials that require and verify a client certificate.

        Raises
        ------
        ValueError
            If the transport is plaintext.
        """
        if self.insecure or self.key_pem is None or self.cert_pem is None:
            raise ValueError("a plaintext transport has no server credentials")
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS channel credentials: trust the CA, present this party's certificate.

        Raises
        ------
        ValueError
            If the transport is plaintext.
        """
        if self.insecure:
            raise ValueError("a plaintext transport has no channel credentials")
        return grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)


def add_port(
    server: grpc.Server | grpc.aio.Server, address: str, security: TransportSecurity
) -> int:
    """Bind ``address`` on ``server`` with mutual TLS (or plaintext if ``security.insecure``).

    Parameters
    ----------
    server : grpc.Server or grpc.aio.Server
        Not started yet.
    address : str
        ``host:port``; port 0 lets the OS choose (tests).
    security : TransportSecurity

    Returns
    -------
    int
        The bound port.

    Raises
    ------
    BindError
        If the address cannot be bound (with the server options of
        :data:`runtime.serving.SERVER_OPTIONS`, a port another server holds cannot).
    """
    if security.insecure:
        logger.warning(
            "%s: serving plaintext: no TLS, no peer identities, any caller is accepted", address
        )
    try:
        if security.insecure:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, security.server_credentials())
    except RuntimeError as exc:  # grpcio raises "Failed to bind to address ..."
        raise BindError(f"cannot serve on {address}: gRPC could not bind it") from exc
    if port == 0:
        raise BindError(f"cannot serve on {address}: gRPC could not bind it")
    return port


def aio_channel(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    options: ChannelOptions = (),
) -> grpc.aio.Channel:
    """Open a grpc.aio channel to ``target`` that presents this party's certificate.

    Parameters
    ----------
    target : str
        ``host:port`` of the server.
    security : TransportSecurity
        This party's key material, or plaintext.
    expected : Identity or None
        The server's identity: the handshake fails (``UNAVAILABLE``, "Hostname Verification Check
        failed") unless the server's certificate is exactly this role and name. With None gRPC
        checks the certificate against the host of ``target`` instead, which a dpmarket
        certificate passes only when that host is ``<name>.<role>.dpmarket``: pass the identity.
    options : sequence of (str, value)
        Channel arguments, e.g. :data:`runtime.serving.GRPC_OPTIONS`; must not set
        ``grpc.ssl_target_name_override`` when ``expected`` is given.

    Returns
    -------
    grpc.aio.Channel

    Raises
    ------
    ValueError
        If ``options`` sets ``grpc.ssl_target_name_override`` and ``expected`` is given.
    """
    merged = _channel_options(target, security, expected, options)
    if security.insecure:
        return grpc.aio.insecure_channel(target, options=merged)
    return grpc.aio.secure_channel(target, security.channel_credentials(), options=merged)


def sync_channel(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    options: ChannelOptions = (),
) -> grpc.Channel:
    """Open a blocking grpc channel to ``target``; as :func:`aio_channel` otherwise."""
    merged = _channel_options(target, security, expected, options)
    if security.insecure:
        return grpc.insecure_channel(target, options=merged)
    return grpc.secure_channel(target, security.channel_credentials(), options=merged)


# ---------------------------------------------------------------------------------- helpers
def _channel_options(
    target: str, security: TransportSecurity, expected: Identity | None, options: ChannelOptions
) -> list[tuple[str, Any]]:
    merged = list(options)
    if security.insecure:
        logger.warning(
            "%s: plaintext channel: no TLS, the server's identity%s is not checked",
            target,
            "" if expected is None else f" ({expected})",
        )
        return merged
    if expected is not None:
        if any(key == TARGET_NAME_OVERRIDE for key, _ in merged):
            raise ValueError(
                f"options must not set {TARGET_NAME_OVERRIDE} when the server identity is given "
                f"({expected}): it is what checks that identity"
            )
        merged.append((TARGET_NAME_OVERRIDE, expected.dns_name))
    return merged


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file not found: {os.fspath(path)}") from None
    except OSError as exc:
        raise OSError(f"cannot read {what} file {os.fspath(path)}: {exc.strerror or exc}") from exc


def _check_valid_now(cert: x509.Certificate, source: str) -> None:
    now = datetime.now(UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if not start <= now <= end:
        raise ValueError(
            f"{source}: certificate {cert.subject.rfc4514_string()!r} is valid from "
            f"{start.isoformat()} to {end.isoformat()}, not now ({now.isoformat()})"
        )


def _check_material(
    ca_pem: bytes | None,
    cert_pem: bytes | None,
    key_pem: bytes | None,
    *,
    sources: tuple[str, str, str],
) -> Identity:
    """Check that the key matches the certificate and the certificate chains to a CA in ca_pem."""
    ca_src, cert_src, key_src = sources
    for value, source in ((ca_pem, ca_src), (cert_pem, cert_src), (key_pem, key_src)):
        if not value:
            raise ValueError(
                f"{source} is required for TLS (TransportSecurity.plaintext() for none), "
                f"got {value!r}"
            )
    assert ca_pem is not None and cert_pem is not None and key_pem is not None
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise ValueError(f"{ca_src}: no PEM certificate ({exc})") from None
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as exc:
        raise ValueError(f"{cert_src}: no PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise ValueError(f"{key_src}: the private key is encrypted; give it unencrypted") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"{key_src}: no PEM private key ({exc})") from None

    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise ValueError(f"{key_src} is not the private key of the certificate in {cert_src}")

    issuer = None
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        issuer = ca
        break
    if issuer is None:
        raise ValueError(
            f"{cert_src}: certificate {cert.subject.rfc4514_string()!r} (issuer "
            f"{cert.issuer.rfc4514_string()!r}) is not issued by the CA in {ca_src} "
            f"({[ca.subject.rfc4514_string() for ca in cas]})"
        )
    try:
        constraints = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise ValueError(f"{ca_src}: {issuer.subject.rfc4514_string()!r} is not a CA certificate")
    _check_valid_now(issuer, ca_src)
    _check_valid_now(cert, cert_src)
    try:
        return identity_from_certificate(cert)
    except ValueError as exc:
        raise ValueError(f"{cert_src}: {exc}") from None
