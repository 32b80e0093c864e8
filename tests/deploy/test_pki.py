"""The deployment CA issues certificates that carry exactly one verifiable identity."""

from __future__ import annotations

import re
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpmarket.deploy.pki import init_ca, issue, issue_all, owner_pins, pki
from dpmarket.owner.policy import load_owner_policy
from dpmarket.runtime.identity import (
    NAME_PATTERN,
    ROLES,
    Identity,
    identity_files,
    identity_from_certificate,
    identity_from_pem,
    key_fingerprint,
)


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca")
    return tmp_path / "ca"


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------------------ identities
@pytest.mark.parametrize("name", ["owner-UA", "owner-0-1", "curator", "alice", "a", "9" * 63])
def test_dns_labels_are_names(name: str) -> None:
    identity = Identity("owner", name)
    assert NAME_PATTERN.fullmatch(name)
    assert Identity.parse(str(identity)) == identity
    assert identity.uri == f"spiffe://dpmarket/owner/{name}"
    assert identity.dns_name == f"{name.lower()}.owner.dpmarket"


def test_identity_text_forms() -> None:
    identity = Identity.parse("owner:owner-0")
    assert identity == Identity("owner", "owner-0")
    assert str(identity) == "owner:owner-0"


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("owner", "'owner'"),
        ("admin:x", "'admin'"),
        ("owner:bad_name", "'bad_name'"),
        ("owner:-x", "'-x'"),
        ("owner:x-", "'x-'"),
        ("owner:", "''"),
        ("owner:a.b", "'a.b'"),
        ("owner:owner:0", "'owner:0'"),
        ("owner:alice\n", "'alice\\n'"),
        (f"owner:{'a' * 64}", "a" * 64),
    ],
)
def test_bad_identity_text_names_the_bad_value(text: str, bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(bad)):
        Identity.parse(text)


# ---------------------------------------------------------------------------- certificates
def test_ca_may_sign_only_end_entities(ca_dir: Path) -> None:
    ca = _cert(ca_dir / "ca.crt")
    ca.verify_directly_issued_by(ca)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert not usage.value.digital_signature
    ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name == "secp256r1"


@pytest.mark.parametrize("role", ROLES)
def test_issued_certificate_chains_to_ca_and_names_role_and_name(ca_dir: Path, role: str) -> None:
    cert_path, key_path = issue(ca_dir, role, "Party-7")
    identity = Identity(role, "Party-7")  # type: ignore[arg-type]
    assert (cert_path, key_path) == identity_files(ca_dir, identity)[1:]
    ca, cert = _cert(ca_dir / "ca.crt"), _cert(cert_path)

    cert.verify_directly_issued_by(ca)  # raises InvalidSignature on a bad signature
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == role
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "Party-7"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://dpmarket/{role}/Party-7"
    ]
    assert san.get_values_for_type(x509.DNSName) == [f"party-7.{role}.dpmarket"]
    assert identity_from_certificate(cert) == identity
    assert identity_from_pem(cert_path.read_bytes()) == identity

    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert not constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.digital_signature
    assert not usage.value.key_cert_sign
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert cert.not_valid_before_utc < datetime.now(UTC)

    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert key.public_key().public_numbers() == public_key.public_numbers()


def test_serials_differ(ca_dir: Path) -> None:
    a, _ = issue(ca_dir, "owner", "owner-0")
    b, _ = issue(ca_dir, "owner", "owner-1")
    assert _cert(a).serial_number != _cert(b).serial_number


def test_key_files_are_private(ca_dir: Path, tmp_path: Path) -> None:
    _, key_path = issue(ca_dir, "owner", "owner-0", out_dir=tmp_path / "svc")
    assert _mode(ca_dir / "ca.key") == 0o600
    assert _mode(key_path) == 0o600
    assert not list(ca_dir.glob(".*.tmp"))
    assert not list((tmp_path / "svc").glob(".*.tmp"))


def test_refuses_to_overwrite(ca_dir: Path) -> None:
    first = (ca_dir / "ca.crt").read_bytes()
    with pytest.raises(FileExistsError, match=r"ca\.crt"):
        init_ca(ca_dir)
    assert (ca_dir / "ca.crt").read_bytes() == first

    cert_path, _ = issue(ca_dir, "owner", "owner-0")
    issued = cert_path.read_bytes()
    with pytest.raises(FileExistsError, match=r"owner-owner-0\.crt"):
        issue(ca_dir, "owner", "owner-0")
    assert cert_path.read_bytes() == issued
    issue(ca_dir, "owner", "owner-0", force=True)
    assert cert_path.read_bytes() != issued

    init_ca(ca_dir, force=True)
    assert (ca_dir / "ca.crt").read_bytes() != first


def test_issue_elsewhere_makes_a_self_contained_directory(ca_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "owner-0"
    identity = Identity("owner", "owner-0")
    cert_path, key_path = issue(ca_dir, "owner", "owner-0", out_dir=out)
    ca_copy, *_ = identity_files(out, identity)
    assert (ca_copy, cert_path, key_path) == identity_files(out, identity)
    assert ca_copy.read_bytes() == (ca_dir / "ca.crt").read_bytes()
    assert not (out / "ca.key").exists()
    # A second party in the same directory: same CA, nothing to refuse.
    issue(ca_dir, "consumer", "alice", out_dir=out)

    init_ca(tmp_path / "other")
    with pytest.raises(FileExistsError, match=r"ca\.crt"):
        issue(tmp_path / "other", "consumer", "bob", out_dir=out)


def test_issue_all(ca_dir: Path) -> None:
    identities = [Identity("curator", "curator"), Identity("owner", "owner-0")]
    files = issue_all(ca_dir, identities)
    assert list(files) == identities
    for identity, (ca, cert, key) in files.items():
        assert ca == ca_dir / "ca.crt"
        assert identity_from_pem(cert.read_bytes()) == identity
        assert key.is_file()


def test_validity_ends_with_the_ca(tmp_path: Path) -> None:
    init_ca(tmp_path, days=10)
    cert_path, _ = issue(tmp_path, "owner", "owner-0", days=365)
    assert _cert(cert_path).not_valid_after_utc <= _cert(tmp_path / "ca.crt").not_valid_after_utc


@pytest.mark.parametrize(
    ("role", "name", "bad"),
    [("admin", "x", "'admin'"), ("owner", "bad_name", "'bad_name'"), ("owner", "", "''")],
)
def test_bad_role_or_name_names_the_value(ca_dir: Path, role: str, name: str, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        issue(ca_dir, role, name)


@pytest.mark.parametrize("days", [0, -1])
def test_bad_days_names_the_value(tmp_path: Path, days: int) -> None:
    with pytest.raises(ValueError, match=f"got {days}"):
        init_ca(tmp_path, days=days)


def test_missing_ca(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ca\.crt"):
        issue(tmp_path, "owner", "owner-0")


# ------------------------------------------------------------ certificates without identity
def _signed_by_ca(
    ca_dir: Path, subject: list[tuple[x509.ObjectIdentifier, str]], san: list[x509.GeneralName]
) -> x509.Certificate:
    ca = _cert(ca_dir / "ca.crt")
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in subject]))
        .issuer_name(ca.subject)
        .public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


_OWNER_0 = [(NameOID.ORGANIZATIONAL_UNIT_NAME, "owner"), (NameOID.COMMON_NAME, "owner-0")]
_URI = x509.UniformResourceIdentifier


@pytest.mark.parametrize(
    ("subject", "san", "message"),
    [
        (_OWNER_0, [], "no subjectAltName"),
        (_OWNER_0, [x509.DNSName("owner-0.owner.dpmarket")], r"exactly one.*found URIs \[\]"),
        (
            _OWNER_0,
            [_URI("spiffe://dpmarket/owner/owner-0"), _URI("spiffe://dpmarket/owner/owner-1")],
            "exactly one.*owner/owner-0.*owner/owner-1",
        ),
        (_OWNER_0, [_URI("spiffe://elsewhere/owner/owner-0")], "spiffe://elsewhere/owner/owner-0"),
        (_OWNER_0, [_URI("spiffe://dpmarket/owner/owner-0/x")], "owner-0/x"),
        (_OWNER_0, [_URI("spiffe://dpmarket/admin/owner-0")], "'admin'"),
        (
            [(NameOID.ORGANIZATIONAL_UNIT_NAME, "owner"), (NameOID.COMMON_NAME, "owner-1")],
            [_URI("spiffe://dpmarket/owner/owner-0")],
            r"subject CN is \['owner-1'\]",
        ),
        (
            [(NameOID.ORGANIZATIONAL_UNIT_NAME, "curator"), (NameOID.COMMON_NAME, "owner-0")],
            [_URI("spiffe://dpmarket/owner/owner-0")],
            r"subject OU is \['curator'\]",
        ),
        (
            _OWNER_0,
            [_URI("spiffe://dpmarket/owner/owner-0"), x509.DNSName("*.owner.dpmarket")],
            r"\*\.owner\.dpmarket",
        ),
    ],
    ids=[
        "no-san",
        "no-uri",
        "two-uris",
        "other-domain",
        "long-path",
        "bad-role",
        "cn",
        "ou",
        "dns",
    ],
)
def test_certificate_without_a_consistent_identity_is_refused(
    ca_dir: Path,
    subject: list[tuple[x509.ObjectIdentifier, str]],
    san: list[x509.GeneralName],
    message: str,
) -> None:
    cert = _signed_by_ca(ca_dir, subject, san)
    with pytest.raises(ValueError, match=message):
        identity_from_certificate(cert)


def test_pem_without_certificate_is_refused() -> None:
    with pytest.raises(ValueError, match="not a PEM certificate"):
        identity_from_pem(b"hello")


# ------------------------------------------------------------------------------------ CLI
def test_cli_init_issue_show(tmp_path: Path) -> None:
    runner = CliRunner()
    ca = tmp_path / "ca"
    result = runner.invoke(pki, ["init", "--out", str(ca), "--days", "30"])
    assert result.exit_code == 0, result.output
    assert "ca.crt" in result.output

    out = tmp_path / "owner-0"
    result = runner.invoke(
        pki,
        ["issue", "--ca-dir", str(ca), "--role", "owner", "--name", "owner-0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "owner:owner-0" in result.output
    assert _mode(out / "owner-owner-0.key") == 0o600

    result = runner.invoke(pki, ["show", str(out / "owner-owner-0.crt")])
    assert result.exit_code == 0, result.output
    assert "owner:owner-0" in result.output
    assert "CN=dpmarket CA,O=dpmarket" in result.output  # the issuer
    assert "URI:spiffe://dpmarket/owner/owner-0" in result.output
    assert "DNS:owner-0.owner.dpmarket" in result.output
    assert "serverAuth, clientAuth" in result.output
    assert "not after" in result.output

    result = runner.invoke(pki, ["show", str(ca / "ca.crt")])
    assert result.exit_code == 0, result.output
    assert "identity" in result.output
    assert "none" in result.output
    assert "yes (path length 0)" in result.output


def test_the_public_key_pin_is_shown_and_survives_a_renewal_with_the_same_key(
    tmp_path: Path,
) -> None:
    """``pki show`` and ``pki issue`` print the pin owners list in ``[peers]``; ``--keep-key``
    renews a certificate for the same key (the pin holds), a plain ``--force`` re-issue makes a
    new key (every peer must update its pin: how a leaked key is retired)."""
    runner = CliRunner()
    ca, out = tmp_path / "ca", tmp_path / "owner-0"
    assert runner.invoke(pki, ["init", "--out", str(ca)]).exit_code == 0
    argv = ["issue", "--ca-dir", str(ca), "--role", "owner", "--name", "owner-0", "--out", str(out)]
    first = runner.invoke(pki, argv)
    assert first.exit_code == 0, first.output
    cert = out / "owner-owner-0.crt"
    pin = key_fingerprint(x509.load_pem_x509_certificate(cert.read_bytes()))
    assert f"public-key pin {pin}" in first.output
    shown = runner.invoke(pki, ["show", str(cert)])
    assert re.search(rf"public-key pin:\s+{pin}", shown.output), shown.output
    serial = x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
    renewed = runner.invoke(pki, [*argv, "--keep-key", "--days", "30"])
    assert renewed.exit_code == 0, renewed.output
    again = x509.load_pem_x509_certificate(cert.read_bytes())
    assert again.serial_number != serial and key_fingerprint(again) == pin
    assert runner.invoke(pki, [*argv, "--force"]).exit_code == 0
    assert key_fingerprint(x509.load_pem_x509_certificate(cert.read_bytes())) != pin
    missing = runner.invoke(pki, [*argv[:-1], str(tmp_path / "nobody"), "--keep-key"])
    assert missing.exit_code != 0 and "no key to keep" in missing.output


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    runner = CliRunner()
    ca = str(tmp_path / "ca")
    assert runner.invoke(pki, ["init", "--out", ca]).exit_code == 0

    result = runner.invoke(pki, ["init", "--out", ca])
    assert result.exit_code == 1
    assert "refusing to overwrite" in result.output

    result = runner.invoke(pki, ["issue", "--ca-dir", ca, "--role", "admin", "--name", "x"])
    assert result.exit_code == 2
    assert "'admin'" in result.output

    result = runner.invoke(pki, ["issue", "--ca-dir", ca, "--role", "owner", "--name", "no_way"])
    assert result.exit_code == 2
    assert "'no_way'" in result.output

    missing = str(tmp_path / "nothing")
    result = runner.invoke(pki, ["issue", "--ca-dir", missing, "--role", "owner", "--name", "o"])
    assert result.exit_code == 1
    assert "no CA in" in result.output

    args = ["issue", "--ca-dir", ca, "--role", "owner", "--name", "o"]
    assert runner.invoke(pki, args).exit_code == 0
    result = runner.invoke(pki, args)
    assert result.exit_code == 1
    assert "refusing to overwrite" in result.output

    (tmp_path / "junk.pem").write_text("junk")
    result = runner.invoke(pki, ["show", str(tmp_path / "junk.pem")])
    assert result.exit_code == 1
    assert "no PEM certificate" in result.output


def test_pki_peers_pins_owner_certificates_in_a_policy_and_refuses_a_changed_pin(
    tmp_path: Path,
) -> None:
    """``pki peers`` adds each owner certificate's pin to ``[peers]`` (the rest of the policy
    kept); a certificate of another role, or one whose key differs from a pin already there,
    is refused and the file left as it was."""
    runner = CliRunner()
    ca = tmp_path / "ca"
    init_ca(ca)
    issue_all(ca, [Identity("owner", "owner-1"), Identity("owner", "owner-2")])
    issue_all(ca, [Identity("consumer", "alice")])
    base = tmp_path / "policy.toml"
    base.write_text("[budget]\nepsilon = 3.0\n", encoding="utf-8")
    certs = [str(ca / f"owner-owner-{i}.crt") for i in (1, 2)]
    result = runner.invoke(pki, ["peers", "--policy", str(base), "--out", str(base), *certs])
    assert result.exit_code == 0, result.output
    policy = load_owner_policy(base)
    assert policy.epsilon_total == 3.0
    assert policy.peer_pins == owner_pins(ca, ["owner-1", "owner-2"])
    before = base.read_bytes()
    consumer = str(ca / "consumer-alice.crt")
    result = runner.invoke(pki, ["peers", "--policy", str(base), "--out", str(base), consumer])
    assert result.exit_code != 0 and "not of an owner" in result.output
    other = tmp_path / "other"
    issue(ca, "owner", "owner-1", out_dir=other)  # the same name, another key
    result = runner.invoke(
        pki, ["peers", "--policy", str(base), "--out", str(base), str(other / "owner-owner-1.crt")]
    )
    assert result.exit_code != 0 and "pinned to" in result.output
    assert base.read_bytes() == before
