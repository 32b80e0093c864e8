"""Mutual TLS for every dpmarket channel: server ports, client channels, the key material.

Trust model. One deployment CA (``dpmarket pki``, :mod:`dpmarket.deploy.pki`) issues every party a
certificate that names its role and name (:mod:`dpmarket.runtime.identity`); the role and name of a
peer come from that verified certificate and never from a message. Both ends present a certificate
and check the other's against the CA: a server built with :func:`add_port` requires a client
certificate at the handshake, so a client without one, a plaintext client or a client whose
certificate another CA issued fails with ``UNAVAILABLE`` before any handler runs, and handlers read
the caller with :func:`dpmarket.runtime.identity.peer_identity`. A client also checks *which* server
it reached: gRPC's only check of a server's certificate beyond the CA signature is the host name, so
a channel built with an ``expected`` identity sets ``grpc.ssl_target_name_override`` to the DNS name
``<name>.<role>.dpmarket`` that the CA writes only into that party's certificate. The handshake then
fails unless the server is exactly that role and name: a curator certificate named ``owner-0``
cannot stand in for owner ``owner-0``, nor one owner for another.
:meth:`TransportSecurity.plaintext` turns all of this off (tests and local demos only): no TLS, no
identities.

Measurement. When the environment variable ``DPMARKET_RPC_TRACE`` names a file, every channel opened
here records each call's method, peers, times and message sizes in it
(:mod:`dpmarket.runtime.rpc_trace`, gRPC client interceptors); unset, the default, nothing is
installed.

Connecting fails fast and says why. A client checks a new channel with
:func:`check_connected` (or :func:`check_connected_aio`) under a short connect deadline,
:data:`CONNECT_TIMEOUT_SECONDS`, separate from its calls' deadlines; when the channel does not
become ready, :func:`explain_connection` probes the address with a plain socket and a TLS
handshake of Python's :mod:`ssl` and names the cause in one line: nothing listening, a server
certificate not signed by this deployment's CA, a server of another identity, or a server that
refuses this party's certificate.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from dpmarket.common.errors import UnavailableError
from dpmarket.runtime import rpc_trace
from dpmarket.runtime.framing import PiecesAioChannel, PiecesChannel
from dpmarket.runtime.identity import Identity, check_issued_by, identity_from_certificate

logger = logging.getLogger(__name__)


class BindError(RuntimeError):
    """A server cannot bind its address: another process holds the port, or the address is not
    available here. The message names the address."""


#: Seconds a client waits for a new channel to connect (TCP and the mTLS handshake) before it
#: gives up and says why: a connect deadline, separate from the deadlines of its calls.
CONNECT_TIMEOUT_SECONDS = 5.0

#: Why a channel did not connect (:class:`ConnectError`).
ConnectFailure = Literal["refused", "timeout", "resolve", "unreachable", "ca", "identity", "tls"]


class ConnectError(UnavailableError):
    """A channel that did not connect within its connect deadline; the message says why.

    Attributes
    ----------
    target : str
        ``host:port`` the channel was opened to.
    failure : {"refused", "timeout", "resolve", "unreachable", "ca", "identity", "tls"}
        Nothing listening, nothing answering in time, a host name that does not resolve,
        another network error, a peer certificate not signed by this deployment's CA (either
        way), a server proving another identity than the expected one, or another TLS failure.
    """

    def __init__(self, message: str, target: str, failure: ConnectFailure) -> None:
        super().__init__(message)
        self.target = target
        self.failure = failure


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
        (:func:`dpmarket.runtime.identity.identity_from_certificate`).
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
            ``<role>-<name>.key`` (:func:`dpmarket.runtime.identity.identity_files`).

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
        :data:`dpmarket.runtime.serving.SERVER_OPTIONS`, a port another server holds cannot).
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
) -> PiecesAioChannel:
    """Open a grpc.aio channel to ``target`` that presents this party's certificate.

    A unary request above :data:`~dpmarket.runtime.framing.FRAME_BYTES` goes in pieces
    (:class:`~dpmarket.runtime.framing.PiecesAioChannel`), as every server receives them.

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
        Channel arguments, e.g. :data:`dpmarket.runtime.serving.CHANNEL_OPTIONS`; must not set
        ``grpc.ssl_target_name_override`` when ``expected`` is given.

    Returns
    -------
    PiecesAioChannel
        A ``grpc.aio.Channel``.

    Raises
    ------
    ValueError
        If ``options`` sets ``grpc.ssl_target_name_override`` and ``expected`` is given.
    """
    merged = _channel_options(target, security, expected, options)
    interceptors = rpc_trace.aio_interceptors(*_parties(target, security, expected))
    if security.insecure:
        channel = grpc.aio.insecure_channel(target, options=merged, interceptors=interceptors)
    else:
        channel = grpc.aio.secure_channel(
            target, security.channel_credentials(), options=merged, interceptors=interceptors
        )
    return PiecesAioChannel(channel)


def sync_channel(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    options: ChannelOptions = (),
) -> PiecesChannel:
    """Open a blocking grpc channel to ``target``; as :func:`aio_channel` otherwise (large
    requests in pieces: :class:`~dpmarket.runtime.framing.PiecesChannel`)."""
    merged = _channel_options(target, security, expected, options)
    if security.insecure:
        channel = grpc.insecure_channel(target, options=merged)
    else:
        channel = grpc.secure_channel(target, security.channel_credentials(), options=merged)
    interceptor = rpc_trace.sync_interceptor(*_parties(target, security, expected))
    if interceptor is not None:
        channel = grpc.intercept_channel(channel, interceptor)
    return PiecesChannel(channel)


# ------------------------------------------------------------------------- fail fast, say why
def _split_target(target: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> (host, port); None for other gRPC target syntaxes."""
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _ssl_context(security: TransportSecurity) -> ssl.SSLContext:
    """A TLS client context that trusts the deployment CA and checks no host name (the
    identity is compared by the caller), offering HTTP/2 as gRPC does."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    assert security.ca_pem is not None
    context.load_verify_locations(cadata=security.ca_pem.decode("ascii"))
    context.set_alpn_protocols(["h2"])
    return context


def explain_connection(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    *,
    timeout: float = CONNECT_TIMEOUT_SECONDS,
) -> ConnectError | None:
    """Probe ``target`` as a channel of ``security`` would reach it and say what stops it.

    A TCP connection first (refused: nothing listens), then, unless plaintext, a TLS handshake
    that trusts this deployment's CA: a server certificate that does not verify is another CA's;
    one that verifies but names another identity than ``expected`` is the wrong server. The
    probe presents no client certificate (:mod:`ssl` reads keys from files only), so when the
    server passes both checks and the channel still failed, the server refused this party's
    certificate.

    Parameters
    ----------
    target : str
        ``host:port`` (or ``[v6]:port``).
    security : TransportSecurity
        This party's key material (its CA certificate is what the server must chain to).
    expected : Identity or None
        The identity the server must prove; None: not compared.
    timeout : float
        Seconds for the TCP connection and for the handshake, each.

    Returns
    -------
    ConnectError or None
        The cause, as an error to raise; None when the probe finds nothing wrong (or
        ``target`` is not ``host:port``).

    Notes
    -----
    Only public facts are named: the address, and the subject, issuer and identity that the
    server's certificate shows to anyone who connects.
    """
    address = _split_target(target)
    if address is None:
        return None
    host, port = address
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return ConnectError(f"nothing listening at {target}", target, "refused")
    except TimeoutError:
        return ConnectError(f"nothing answered at {target} within {timeout:g} s", target, "timeout")
    except socket.gaierror as exc:
        return ConnectError(f"cannot resolve {host!r} ({exc.strerror})", target, "resolve")
    except OSError as exc:
        return ConnectError(f"cannot reach {target}: {exc.strerror or exc}", target, "unreachable")
    with raw:
        if security.insecure:
            return None
        raw.settimeout(timeout)
        try:
            with _ssl_context(security).wrap_socket(raw, server_hostname=host) as tls:
                der = tls.getpeercert(binary_form=True)
        except ssl.SSLCertVerificationError as exc:
            return ConnectError(
                f"the server at {target} presents a certificate not signed by this "
                f"deployment's CA ({exc.verify_message})",
                target,
                "ca",
            )
        except (ssl.SSLError, OSError) as exc:
            text = str(getattr(exc, "reason", None) or exc)
            if "WRONG_VERSION_NUMBER" in text.upper() or "record layer" in text.lower():
                text = "it does not speak TLS (a server started with --insecure?)"
            return ConnectError(f"no TLS session with {target}: {text}", target, "tls")
    if der is None:  # pragma: no cover - CERT_REQUIRED always yields the certificate
        return None
    cert = x509.load_der_x509_certificate(der)
    try:
        actual = identity_from_certificate(cert)
    except ValueError as exc:
        return ConnectError(
            f"the server at {target} carries no dpmarket identity ({exc})", target, "identity"
        )
    if expected is not None and actual != expected:
        return ConnectError(
            f"the server at {target} is {actual}, not {expected}", target, "identity"
        )
    return ConnectError(
        f"{target} ({actual}) refused this party's certificate: not signed by the CA it "
        "trusts (a certificate of another deployment?)",
        target,
        "ca",
    )


def _not_connected(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    timeout: float,
    failed: bool,
    peer: str,
) -> ConnectError:
    """The error of a channel that is not ready at its connect deadline."""
    reason = None
    if failed:
        reason = explain_connection(target, security, expected, timeout=min(timeout, 2.0))
    if reason is None:
        reason = ConnectError(
            f"nothing answered at {target} within {timeout:g} s", target, "timeout"
        )
    if not peer:
        return reason
    return ConnectError(f"cannot reach {peer}: {reason}", target, reason.failure)


def check_connected(
    channel: grpc.Channel,
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    *,
    timeout: float = CONNECT_TIMEOUT_SECONDS,
    peer: str = "",
) -> None:
    """Connect a blocking channel now, within ``timeout`` seconds, or raise saying why.

    Waits until the channel is ready or its first connection attempt fails, then asks
    :func:`explain_connection` for the cause.

    Parameters
    ----------
    channel : grpc.Channel
        From :func:`sync_channel` with the same ``target``, ``security`` and ``expected``.
    target, security, expected
        As :func:`sync_channel`.
    timeout : float
        The connect deadline, seconds (default :data:`CONNECT_TIMEOUT_SECONDS`).
    peer : str
        Who the channel reaches, for the message (``"the curator"`` gives ``"cannot reach the
        curator: nothing listening at HOST:PORT"``); empty: the cause alone.

    Raises
    ------
    ConnectError
        (an :class:`~dpmarket.common.errors.UnavailableError`) If the channel is not ready: nothing
        listening, nothing answering within ``timeout``, a certificate of another CA on either
        side, a server of another identity.
    """
    changed = threading.Event()
    states: list[grpc.ChannelConnectivity] = []

    def on_change(state: grpc.ChannelConnectivity) -> None:
        states.append(state)
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            changed.set()

    channel.subscribe(on_change, try_to_connect=True)
    try:
        changed.wait(timeout)
    finally:
        channel.unsubscribe(on_change)
    if grpc.ChannelConnectivity.READY in states:
        return
    failed = grpc.ChannelConnectivity.TRANSIENT_FAILURE in states
    raise _not_connected(target, security, expected, timeout, failed, peer)


def connected_channel(
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    options: ChannelOptions = (),
    *,
    connect_timeout: float | None = CONNECT_TIMEOUT_SECONDS,
    peer: str = "",
) -> PiecesChannel:
    """A blocking channel (:func:`sync_channel`), connected within ``connect_timeout`` seconds
    (:func:`check_connected`; None: not checked, calls wait for the server as gRPC does).

    Raises
    ------
    ConnectError
        As :func:`check_connected`; the channel is closed then.
    """
    channel = sync_channel(target, security, expected, options)
    if connect_timeout is None:
        return channel
    try:
        check_connected(channel, target, security, expected, timeout=connect_timeout, peer=peer)
    except BaseException:
        channel.close()
        raise
    return channel


async def check_connected_aio(
    channel: grpc.aio.Channel,
    target: str,
    security: TransportSecurity,
    expected: Identity | None,
    *,
    timeout: float = CONNECT_TIMEOUT_SECONDS,
    peer: str = "",
) -> None:
    """Connect a grpc.aio channel now, within ``timeout`` seconds, or raise saying why; as
    :func:`check_connected` (the probe runs in a worker thread).

    Raises
    ------
    ConnectError
        As :func:`check_connected`.
    """
    deadline = time.monotonic() + timeout
    state = channel.get_state(try_to_connect=True)
    failed = False
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failed = True
            break
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), left)
        except TimeoutError:
            break
        state = channel.get_state(try_to_connect=True)
    else:
        return
    raise await asyncio.to_thread(_not_connected, target, security, expected, timeout, failed, peer)


# ---------------------------------------------------------------------------------- helpers
def _parties(
    target: str, security: TransportSecurity, expected: Identity | None
) -> tuple[str, str]:
    """``(caller, peer)`` as :mod:`dpmarket.runtime.rpc_trace` records them: ``role:name`` of this
    party
    and of the server (``"?"`` and the address with plaintext)."""
    me = security.identity
    caller = "?" if me is None else f"{me.role}:{me.name}"
    peer = target if expected is None else f"{expected.role}:{expected.name}"
    return caller, peer


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

    try:
        check_issued_by(cert, cas)
    except ValueError as exc:
        raise ValueError(f"{cert_src}: {exc} (CA file {ca_src})") from None
    try:
        return identity_from_certificate(cert)
    except ValueError as exc:
        raise ValueError(f"{cert_src}: {exc}") from None
