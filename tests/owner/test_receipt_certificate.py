"""The certificate a curator presents with a receipt makes it genuine only when the owner's CA
issued it to this owner (:func:`dpmarket.owner.receipts.receipt_certificate_key`): an expired
certificate still counts (the receipt was signed in the past), another party's, another
owner's or another CA's does not."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.receipts import ReceiptError, receipt_certificate_key
from dpmarket.runtime.identity import Identity, check_issued_by

OWNER = Identity("owner", "owner-0")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [OWNER, Identity("owner", "owner-1"), Identity("curator", "curator")])
    return root


def _expired(pki: Path) -> bytes:
    """The owner's certificate re-issued by the same CA with a validity period long past."""
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((pki / "owner-owner-0.crt").read_bytes())
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(ca.subject)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=1))
    )
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_an_expired_certificate_of_this_owner_still_names_its_key(pki: Path) -> None:
    ca_pem = (pki / "ca.crt").read_bytes()
    expired = _expired(pki)
    cert = x509.load_pem_x509_certificate(expired)
    with pytest.raises(ValueError, match="not now"):  # control: not valid for a connection
        check_issued_by(cert, [x509.load_pem_x509_certificate(ca_pem)])
    current = receipt_certificate_key((pki / "owner-owner-0.crt").read_bytes(), ca_pem, "owner-0")
    assert receipt_certificate_key(expired, ca_pem, "owner-0") == current


def test_a_certificate_of_another_party_or_ca_is_refused(pki: Path, tmp_path: Path) -> None:
    ca_pem = (pki / "ca.crt").read_bytes()
    owner_pem = (pki / "owner-owner-0.crt").read_bytes()
    with pytest.raises(ReceiptError, match="owner:owner-1, not owner:owner-0"):
        receipt_certificate_key((pki / "owner-owner-1.crt").read_bytes(), ca_pem, "owner-0")
    with pytest.raises(ReceiptError, match="curator:curator, not owner:owner-0"):
        receipt_certificate_key((pki / "curator-curator.crt").read_bytes(), ca_pem, "owner-0")
    other = tmp_path / "other-ca"
    init_ca(other)
    issue_all(other, [OWNER])  # the same name from a CA this owner does not trust
    with pytest.raises(ReceiptError, match="not issued by this deployment's CA"):
        receipt_certificate_key((other / "owner-owner-0.crt").read_bytes(), ca_pem, "owner-0")
    with pytest.raises(ReceiptError, match="not this owner's"):
        receipt_certificate_key(b"not a certificate", ca_pem, "owner-0")
    assert receipt_certificate_key(owner_pem, ca_pem, "owner-0")[0]
