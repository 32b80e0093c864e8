"""TransportSecurity refuses key material that could not make a working mutual-TLS party."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.runtime.identity import Identity, certified_public_key, identity_files
from dpmarket.runtime.transport import (
    TARGET_NAME_OVERRIDE,
    TransportSecurity,
    aio_channel,
    sync_channel,
)

OWNER_0 = Identity("owner", "owner-0")
ALICE = Identity("consumer", "alice")


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca")
    issue_all(tmp_path / "ca", [OWNER_0, ALICE])
    return tmp_path / "ca"


def test_from_files_reads_the_own_identity(ca_dir: Path) -> None:
    security = TransportSecurity.from_files(*identity_files(ca_dir, OWNER_0))
    assert security.identity == OWNER_0
    assert not security.insecure
    assert isinstance(security.server_credentials(), grpc.ServerCredentials)
    assert repr(security) == "TransportSecurity(identity=owner:owner-0)"
    assert "PRIVATE" not in repr(security)


def test_plaintext_has_no_identity_and_no_credentials() -> None:
    plaintext = TransportSecurity.plaintext()
    assert plaintext.insecure
    assert plaintext.identity is None
    with pytest.raises(ValueError, match="plaintext"):
        plaintext.server_credentials()
    with pytest.raises(ValueError, match="key_pem"):
        TransportSecurity(None, None, b"key", insecure=True)


def test_missing_file_is_named(ca_dir: Path) -> None:
    ca, cert, _ = identity_files(ca_dir, OWNER_0)
    with pytest.raises(FileNotFoundError, match=r"private key file not found: .*nope\.key"):
        TransportSecurity.from_files(ca, cert, ca_dir / "nope.key")


def test_missing_material_is_named(ca_dir: Path) -> None:
    ca, cert, _ = identity_files(ca_dir, OWNER_0)
    with pytest.raises(ValueError, match="key_pem is required"):
        TransportSecurity(ca.read_bytes(), cert.read_bytes(), None)


def test_key_of_another_party_is_refused(ca_dir: Path) -> None:
    ca, cert, _ = identity_files(ca_dir, OWNER_0)
    _, _, alice_key = identity_files(ca_dir, ALICE)
    with pytest.raises(ValueError, match=r"consumer-alice\.key is not the private key"):
        TransportSecurity.from_files(ca, cert, alice_key)


def test_certificate_of_another_ca_is_refused(ca_dir: Path, tmp_path: Path) -> None:
    init_ca(tmp_path / "other")
    _, cert, key = identity_files(ca_dir, OWNER_0)
    with pytest.raises(
        ValueError, match=r"owner-owner-0\.crt.*not issued by this deployment.s CA.*other"
    ):
        TransportSecurity.from_files(tmp_path / "other" / "ca.crt", cert, key)


def test_file_without_pem_is_named(ca_dir: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.crt"
    junk.write_text("junk")
    _, cert, key = identity_files(ca_dir, OWNER_0)
    with pytest.raises(ValueError, match=r"junk\.crt: no PEM certificate"):
        TransportSecurity.from_files(junk, cert, key)


def test_expired_certificate_is_refused(ca_dir: Path, tmp_path: Path) -> None:
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    past = datetime.now(UTC) - timedelta(days=10)
    leaf = x509.load_pem_x509_certificate(identity_files(ca_dir, OWNER_0)[1].read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    expired = (
        x509.CertificateBuilder()
        .subject_name(leaf.subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(past)
        .not_valid_after(past + timedelta(days=1))
        .add_extension(san, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "expired.crt", tmp_path / "expired.key"
    cert_path.write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(ValueError, match=r"expired\.crt: .* is valid from .* not now"):
        TransportSecurity.from_files(ca_dir / "ca.crt", cert_path, key_path)


def test_target_name_override_belongs_to_the_expected_identity(ca_dir: Path) -> None:
    security = TransportSecurity.from_files(*identity_files(ca_dir, ALICE))
    options = [(TARGET_NAME_OVERRIDE, "owner-1.owner.dpmarket")]
    with pytest.raises(ValueError, match=TARGET_NAME_OVERRIDE):
        aio_channel("127.0.0.1:1", security, OWNER_0, options)
    with pytest.raises(ValueError, match=TARGET_NAME_OVERRIDE):
        sync_channel("127.0.0.1:1", security, OWNER_0, options)


def test_a_signers_certificate_is_checked_against_the_ca_and_the_expected_identity(
    ca_dir: Path, tmp_path: Path
) -> None:
    """certified_public_key: the key of a certificate this CA issued to the expected identity
    (the control), refused for another identity, another CA, or bytes that are no certificate."""
    ca_pem = (ca_dir / "ca.crt").read_bytes()
    cert_pem = identity_files(ca_dir, OWNER_0)[1].read_bytes()
    key = certified_public_key(cert_pem, ca_pem, OWNER_0)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    with pytest.raises(ValueError, match=r"a certificate of owner:owner-0 was presented for"):
        certified_public_key(cert_pem, ca_pem, Identity("curator", "curator"))
    init_ca(tmp_path / "other")
    other = (tmp_path / "other" / "ca.crt").read_bytes()
    with pytest.raises(ValueError, match=r"not issued by this deployment's CA"):
        certified_public_key(cert_pem, other, OWNER_0)
    with pytest.raises(ValueError, match=r"not a PEM certificate"):
        certified_public_key(b"junk", ca_pem, OWNER_0)


def test_an_end_entity_certificate_cannot_stand_in_for_the_ca(ca_dir: Path, tmp_path: Path) -> None:
    """A consumer's name on a certificate signed with an owner's key, with that owner's
    certificate as its "CA", is refused for a signed document and for a service's own
    credentials alike (BasicConstraints ca=False); the control: the deployment's CA issued it."""
    _, owner_cert_path, owner_key_path = identity_files(ca_dir, OWNER_0)
    owner_cert = x509.load_pem_x509_certificate(owner_cert_path.read_bytes())
    owner_key = serialization.load_pem_private_key(owner_key_path.read_bytes(), password=None)
    assert isinstance(owner_key, ec.EllipticCurvePrivateKey)
    _, alice_cert_path, _ = identity_files(ca_dir, ALICE)
    genuine = x509.load_pem_x509_certificate(alice_cert_path.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    forged = (
        x509.CertificateBuilder()
        .subject_name(genuine.subject)
        .issuer_name(owner_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            genuine.extensions.get_extension_for_class(x509.SubjectAlternativeName).value,
            critical=False,
        )
        .sign(owner_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    with pytest.raises(ValueError, match=r"is not a CA certificate"):
        certified_public_key(forged.public_bytes(pem), owner_cert.public_bytes(pem), ALICE)
    cert_path, key_path = tmp_path / "forged.crt", tmp_path / "forged.key"
    cert_path.write_bytes(forged.public_bytes(pem))
    key_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(ValueError, match=r"forged\.crt: .* is not a CA certificate"):
        TransportSecurity.from_files(owner_cert_path, cert_path, key_path)
    ca_pem = (ca_dir / "ca.crt").read_bytes()
    control = certified_public_key(alice_cert_path.read_bytes(), ca_pem, ALICE)
    assert isinstance(control, ec.EllipticCurvePublicKey)
