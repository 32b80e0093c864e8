"""The deployment CA: create it, issue every party its certificate, inspect certificates, pin
owners' keys in a policy.

``dpmarket pki init`` creates the CA (``ca.crt``, ``ca.key``); ``dpmarket pki issue`` gives a
curator, owner or consumer a certificate and key that state its role and name in the form
:mod:`dpmarket.runtime.identity` reads and :mod:`dpmarket.runtime.transport` checks at every
handshake; ``dpmarket pki show`` prints what a certificate says (its public-key pin included);
``dpmarket pki peers`` writes owners' pins into an owner policy's ``[peers]``. Keys are ECDSA
P-256, written with mode 0600.

A party's directory holds ``ca.crt``, ``<role>-<name>.crt`` and ``<role>-<name>.key``
(:func:`dpmarket.runtime.identity.identity_files`): everything
:meth:`dpmarket.runtime.transport.TransportSecurity.from_files` needs, and nothing of the CA's key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import click
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpmarket.runtime.identity import (
    CA_CERT,
    ROLES,
    Identity,
    Role,
    identity_files,
    identity_from_certificate,
    key_fingerprint,
)

#: File name of the CA key in a CA directory (beside :data:`dpmarket.runtime.identity.CA_CERT`).
CA_KEY = "ca.key"
#: Organization in the subject of the CA and of every certificate it issues.
ORGANIZATION = "dpmarket"
#: Backdating of ``notBefore``, in seconds, so that a peer whose clock is slightly behind accepts
#: a certificate issued a moment ago.
BACKDATE_SECONDS = 60

_KEY_MODE = 0o600
_CERT_MODE = 0o644


def init_ca(out_dir: Path, *, days: int = 3650, force: bool = False) -> tuple[Path, Path]:
    """Create a deployment CA: a self-signed ECDSA P-256 certificate and its key.

    Parameters
    ----------
    out_dir : Path
        Directory for ``ca.crt`` and ``ca.key`` (created if missing).
    days : int, default 3650
        Validity of the CA certificate, in days (>= 1).
    force : bool, default False
        Overwrite an existing CA. Every certificate it issued then stops being trusted.

    Returns
    -------
    (Path, Path)
        The certificate and key files; the key has mode 0600.

    Raises
    ------
    ValueError
        If ``days < 1``.
    FileExistsError
        If ``ca.crt`` or ``ca.key`` exists and ``force`` is not set.

    Notes
    -----
    The CA may sign only end-entity certificates: ``BasicConstraints(ca=True, path_length=0)``
    and ``KeyUsage(keyCertSign, cRLSign)``, both critical (RFC 5280, Sections 4.2.1.3, 4.2.1.9).
    """
    _check_days(days)
    out_dir = Path(out_dir)
    cert_path, key_path = out_dir / CA_CERT, out_dir / CA_KEY
    _refuse_existing([cert_path, key_path], force)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{ORGANIZATION} CA"),
        ]
    )
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(seconds=BACKDATE_SECONDS))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(key_path, _key_pem(key), _KEY_MODE)
    _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE)
    return cert_path, key_path


def issue(
    ca_dir: Path,
    role: str,
    name: str,
    *,
    out_dir: Path | None = None,
    days: int = 365,
    force: bool = False,
    keep_key: bool = False,
) -> tuple[Path, Path]:
    """Issue a party its certificate and key, signed by the CA in ``ca_dir``.

    Parameters
    ----------
    ca_dir : Path
        Directory holding ``ca.crt`` and ``ca.key`` (:func:`init_ca`).
    role : {"curator", "owner", "consumer"}
    name : str
        A DNS label (:data:`dpmarket.runtime.identity.NAME_PATTERN`), e.g. ``"owner-0"``.
    out_dir : Path, optional
        Where to write ``<role>-<name>.crt`` and ``<role>-<name>.key`` (default ``ca_dir``;
        created if missing). When it is another directory, ``ca.crt`` is copied there too, so
        that it holds all a service needs and not the CA key.
    days : int, default 365
        Validity in days (>= 1); cut to the CA's own end of validity.
    force : bool, default False
        Overwrite existing files.
    keep_key : bool, default False
        Renew: certify the key already in ``<role>-<name>.key`` instead of a fresh one (its
        certificate is replaced without ``force``), so that the public-key pin other owners
        hold for it (:func:`dpmarket.runtime.identity.key_fingerprint`) stays valid.

    Returns
    -------
    (Path, Path)
        The certificate and key files; the key has mode 0600.

    Raises
    ------
    ValueError
        If ``role`` or ``name`` is invalid, ``days < 1`` or the CA files are not a CA's
        certificate and matching ECDSA key.
    FileNotFoundError
        If ``ca_dir`` holds no ``ca.crt`` or ``ca.key``.
    FileExistsError
        If the certificate or key exists, or ``out_dir`` has a different ``ca.crt``, and
        ``force`` is not set (with ``keep_key``: only a different ``ca.crt``).
    FileNotFoundError
        With ``keep_key``, if there is no key to keep.

    Notes
    -----
    The subject is ``O=dpmarket, OU=<role>, CN=<name>``; the SANs are the URI
    ``spiffe://dpmarket/<role>/<name>`` (the identity services read) and the DNS name
    ``<name>.<role>.dpmarket`` (what a client checks a server against). ``ExtendedKeyUsage`` has
    both serverAuth and clientAuth: the curator serves consumers and calls owners with one
    certificate. ``BasicConstraints(ca=False)`` and ``KeyUsage(digitalSignature)`` are critical.
    """
    identity = Identity(cast(Role, role), name)  # validates both
    _check_days(days)
    ca_dir = Path(ca_dir)
    ca_cert, ca_key = _load_ca(ca_dir)
    out_dir = ca_dir if out_dir is None else Path(out_dir)
    ca_copy, cert_path, key_path = identity_files(out_dir, identity)
    copy_ca = not _same_dir(out_dir, ca_dir)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _refuse_existing([] if keep_key else [cert_path, key_path], force)
    if copy_ca and not force and ca_copy.exists() and ca_copy.read_bytes() != ca_pem:
        raise FileExistsError(
            f"{ca_copy} exists and is not the certificate of the CA in {ca_dir}; "
            "use --force to replace it"
        )

    key = _kept_key(key_path) if keep_key else ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(_subject(identity))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(seconds=BACKDATE_SECONDS))
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(identity.uri), x509.DNSName(identity.dns_name)]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    if not keep_key:
        _write_atomic(key_path, _key_pem(key), _KEY_MODE)
    _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE)
    if copy_ca:
        _write_atomic(ca_copy, ca_pem, _CERT_MODE)
    return cert_path, key_path


def issue_all(
    ca_dir: Path,
    identities: Iterable[Identity],
    *,
    out_dir: Path | None = None,
    days: int = 365,
    force: bool = False,
) -> dict[Identity, tuple[Path, Path, Path]]:
    """Issue a certificate to each identity (:func:`issue`) into one directory.

    Returns
    -------
    dict
        For each identity, its ``(ca.crt, certificate, key)`` paths (:func:`identity_files`),
        ready for :meth:`dpmarket.runtime.transport.TransportSecurity.from_files`.

    Raises
    ------
    As :func:`issue`.
    """
    target = Path(ca_dir) if out_dir is None else Path(out_dir)
    files: dict[Identity, tuple[Path, Path, Path]] = {}
    for identity in identities:
        issue(ca_dir, identity.role, identity.name, out_dir=out_dir, days=days, force=force)
        files[identity] = identity_files(target, identity)
    return files


def describe(cert: x509.Certificate) -> list[tuple[str, str]]:
    """Describe a certificate as ``(field, value)`` lines: identity, issuer, validity, SANs.

    Never raises on a certificate without a dpmarket identity: the identity line then says why.
    """
    try:
        identity = str(identity_from_certificate(cert))
    except ValueError as exc:
        identity = f"none ({exc})"
    now = datetime.now(UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    state = "valid" if start <= now <= end else "EXPIRED" if now > end else "NOT YET VALID"
    lines = [
        ("identity", identity),
        ("subject", cert.subject.rfc4514_string()),
        ("issuer", cert.issuer.rfc4514_string()),
        ("serial", f"{cert.serial_number:x}"),
        ("not before", start.isoformat()),
        ("not after", end.isoformat()),
        ("status", state),
    ]
    with contextlib.suppress(x509.ExtensionNotFound):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        lines.append(("SANs", ", ".join(_general_name(g) for g in san)))
    with contextlib.suppress(x509.ExtensionNotFound):
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        lines.append(
            ("CA", f"yes (path length {constraints.path_length})" if constraints.ca else "no")
        )
    with contextlib.suppress(x509.ExtensionNotFound):
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        lines.append(
            ("extended key usage", ", ".join(_EKU_NAMES.get(o, o.dotted_string) for o in eku))
        )
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    lines.append(("SHA-256 fingerprint", digest))
    lines.append(("public-key pin", key_fingerprint(cert)))
    return lines


def owner_pins(directory: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """The public-key pins of the owner certificates in a directory: what an owner policy's
    ``[peers]`` lists (:func:`dpmarket.runtime.identity.key_fingerprint`).

    Parameters
    ----------
    directory : Path
        Holds ``owner-<name>.crt`` files (a CA directory after :func:`issue_all`, or a folder of
        the certificates the owners exchanged).
    names : iterable of str, optional
        The owners to pin; default every ``owner-*.crt`` in ``directory``.

    Returns
    -------
    dict of str to str
        Owner name -> pin, for the certificates whose identity is ``owner:<name>``.

    Raises
    ------
    FileNotFoundError
        If a named owner has no certificate there.
    ValueError
        If a certificate is not PEM or does not name the owner its file is named after.
    """
    directory = Path(directory)
    if names is None:
        paths = {p.stem.removeprefix("owner-"): p for p in sorted(directory.glob("owner-*.crt"))}
    else:
        paths = {n: identity_files(directory, Identity("owner", n))[1] for n in names}
    pins: dict[str, str] = {}
    for name, path in paths.items():
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(f"no certificate of owner {name!r}: {path} not found") from None
        except ValueError as exc:
            raise ValueError(f"{path}: no PEM certificate ({exc})") from None
        if identity_from_certificate(cert) != Identity("owner", name):
            raise ValueError(f"{path} is not the certificate of owner:{name}")
        pins[name] = key_fingerprint(cert)
    return pins


# -------------------------------------------------------------------------------- the CLI
def _name_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        Identity("owner", value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@click.group("pki", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def pki() -> None:
    """The deployment CA: create it, issue party certificates, show a certificate."""


@pki.command("init")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for ca.crt and ca.key (the key stays here; keep it secret).",
)
@click.option("--days", default=3650, type=click.IntRange(min=1), help="Validity in days.")
@click.option("--force", is_flag=True, help="Replace an existing CA (its certificates die).")
def init_command(out_dir: Path, days: int, force: bool) -> None:
    """Create the deployment CA (self-signed ECDSA P-256)."""
    try:
        cert_path, key_path = init_ca(out_dir, days=days, force=force)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"CA certificate: {cert_path}")
    click.echo(f"CA key:         {key_path} (mode 0600; only 'pki issue' needs it)")


@pki.command("issue")
@click.option(
    "--ca-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the CA (ca.crt, ca.key).",
)
@click.option("--role", required=True, type=click.Choice(ROLES), help="The party's role.")
@click.option(
    "--name",
    required=True,
    callback=_name_option,
    help="The party's name, a DNS label (letters, digits, inner hyphens; at most 63).",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the certificate, key and a copy of ca.crt (default: the CA directory).",
)
@click.option("--days", default=365, type=click.IntRange(min=1), help="Validity in days.")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.option(
    "--keep-key",
    is_flag=True,
    help="Renew: certify the party's existing key (in --out) instead of a new one, so the "
    "public-key pin other owners hold for it stays valid.",
)
def issue_command(
    ca_dir: Path,
    role: Role,
    name: str,
    out_dir: Path | None,
    days: int,
    force: bool,
    keep_key: bool,
) -> None:
    """Issue a curator, owner or consumer its certificate and key."""
    try:
        cert_path, key_path = issue(
            ca_dir, role, name, out_dir=out_dir, days=days, force=force, keep_key=keep_key
        )
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    click.echo(f"{Identity(role, name)}: certificate {cert_path}")
    click.echo(f"{Identity(role, name)}: key         {key_path} (mode 0600)")
    click.echo(f"{Identity(role, name)}: public-key pin {key_fingerprint(cert)}")


@pki.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def show_command(file: Path) -> None:
    """Print the identity, issuer, validity and SANs of the certificates in FILE (PEM)."""
    try:
        certs = x509.load_pem_x509_certificates(file.read_bytes())
    except ValueError as exc:
        raise click.ClickException(f"{file}: no PEM certificate ({exc})") from None
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    for index, cert in enumerate(certs):
        if index:
            click.echo()
        lines = describe(cert)
        width = max(len(key) for key, _ in lines)
        for key, value in lines:
            click.echo(f"{key + ':':<{width + 1}} {value}")


@pki.command("peers")
@click.argument(
    "certificates",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option(
    "--policy",
    "base",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The owner policy to add the pins to (default: the built-in defaults).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the policy (it may be --policy itself).",
)
def peers_command(certificates: tuple[Path, ...], base: Path | None, out: Path) -> None:
    """Pin the owners of CERTIFICATES as CAPE peers in an owner policy ([peers]).

    Each certificate must be an owner's; its public-key pin is added under the owner's name.
    A name the policy already pins to another key is refused: edit the file to change a pin.
    Take the certificates from the peers' operators, never from the curator.
    """
    from dpmarket.owner.policy import OwnerPolicy, load_owner_policy

    try:
        policy = OwnerPolicy() if base is None else load_owner_policy(base)
        pins = policy.peer_pins
        for path in certificates:
            try:
                cert = x509.load_pem_x509_certificate(path.read_bytes())
                identity = identity_from_certificate(cert)
            except ValueError as exc:
                raise ValueError(f"{path}: not an owner certificate ({exc})") from None
            if identity.role != "owner":
                raise ValueError(f"{path} is the certificate of {identity}, not of an owner")
            pin = key_fingerprint(cert)
            if pins.get(identity.name, pin) != pin:
                raise ValueError(
                    f"{identity.name} is pinned to {pins[identity.name]} already and {path} has "
                    f"the key {pin}: edit [peers] to change a pin"
                )
            pins[identity.name] = pin
        text = dataclasses.replace(policy, peers=tuple(pins.items())).to_toml()
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(out, text.encode("utf-8"), _CERT_MODE)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{out}: [peers] pins {', '.join(sorted(pins))}")


# ---------------------------------------------------------------------------------- helpers
_EKU_NAMES = {
    ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
    ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
}
_SAN_TYPES: dict[type[x509.GeneralName], str] = {
    x509.UniformResourceIdentifier: "URI",
    x509.DNSName: "DNS",
    x509.IPAddress: "IP",
    x509.RFC822Name: "email",
}


def _general_name(name: x509.GeneralName) -> str:
    return f"{_SAN_TYPES.get(type(name), type(name).__name__)}:{name.value}"


def _subject(identity: Identity) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, identity.role),
            x509.NameAttribute(NameOID.COMMON_NAME, identity.name),
        ]
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _check_days(days: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be an integer >= 1, got {days!r}")


def _refuse_existing(paths: Iterable[Path], force: bool) -> None:
    if force:
        return
    existing = [str(path) for path in paths if path.exists()]
    if existing:
        raise FileExistsError(
            f"refusing to overwrite {', '.join(existing)}; use --force (force=True) to replace"
        )


def _same_dir(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _kept_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The party's existing P-256 key (``issue(keep_key=True)``)."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no key to keep: {path} not found (issue without --keep-key for a new key)"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: no unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"{path}: not a P-256 key")
    return key


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise FileNotFoundError(
                f"no CA in {ca_dir}: {path} not found (create one with: dpmarket pki init "
                f"--out {ca_dir})"
            )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{cert_path}: no PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{key_path}: no unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: expected an ECDSA key, got {type(key).__name__}")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise ValueError(f"{key_path} is not the private key of {cert_path}")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound as exc:
        raise ValueError(f"{cert_path} is not a dpmarket CA certificate ({exc})") from None
    if not constraints.ca:
        raise ValueError(f"{cert_path} is not a CA certificate (BasicConstraints ca=False)")
    return cert, key


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory.

    The temporary file is created with ``mode`` before any byte is written (a key is never
    readable by others, even for a moment), synced, then renamed over ``path``.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode == _KEY_MODE:
                os.fchmod(fh.fileno(), mode)  # exactly 0600 whatever the umask
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
