"""An owner's CAPE peers are its roster: the names and public-key pins its policy lists.

The deployment CA vouches for names, and whoever holds its key can mint an owner certificate
under any name. So an owner accepts a site of a CAPE job, or of one of its secure-aggregation
rounds, only if the site is on its roster (``[peers]``), and a site's certificate only if its key
has the pinned fingerprint. Each test runs a real :class:`dpmarket.owner.cape.CapeSite` with its
durable ledger and real certificates of one CA (:mod:`dpmarket.deploy.pki`); "forged" certificates
are issued by that same CA under a genuine owner's name for another key, as a party holding the
CA's key would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cryptography import x509

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.errors import AbortedError, FailedPreconditionError
from dpmarket.common.secagg.crypto import SecAggError
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.deploy.pki import init_ca, issue, issue_all, owner_pins
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.identity import Identity, identity_files, key_fingerprint
from dpmarket.runtime.tables import Table

CURATOR = "curator:curator"
OWNER = "owner-a"
PEERS = ("owner-b", "owner-c")
STRANGER = "owner-d"
SITES = (OWNER, *PEERS)
ROWS = 40
SPEC = CapeMeanSpec((("x", 0.0, 1.0), ("y", 0.0, 1.0)), 0.5, 1e-7)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One CA; genuine certificates of owner-a..d in ``pki``; in ``pki/forged``, a certificate
    the CA issued under owner-b's name for another key."""
    directory = tmp_path_factory.mktemp("pki")
    init_ca(directory)
    issue_all(directory, [Identity("owner", s) for s in (*SITES, STRANGER)])
    issue(directory, "owner", "owner-b", out_dir=directory / "forged")
    return directory


def _credentials(directory: Path, name: str) -> tuple[bytes, bytes, bytes]:
    ca, cert, key = identity_files(directory, Identity("owner", name))
    return key.read_bytes(), cert.read_bytes(), ca.read_bytes()


def _identity(
    pki: Path, name: str, peers: dict[str, str], directory: Path | None = None
) -> SiteIdentity:
    key, cert, ca = _credentials(directory or pki, name)
    return SiteIdentity.from_pem(name, key, cert, ca, peers=peers)


def _site(tmp_path: Path, identity: SiteIdentity) -> CapeSite:
    table = Table(("x", "y"), np.random.default_rng(0).uniform(0, 1, (ROWS, 2)), OWNER)
    ledger = OwnerLedger.create(tmp_path / OWNER, OwnerPolicy())
    return CapeSite(OWNER, table, ledger=ledger, identity=identity, clock=lambda: 0.0)


def _attestation(
    signer: SiteIdentity, name: str, sites: tuple[str, ...], colluders: int = 1
) -> SizeAttestation:
    message = plan_statement("job", SPEC, sites, colluders, 0, name, ROWS)
    return SizeAttestation(name, ROWS, signer.signer.sign(message))


def _params(sites: tuple[str, ...]) -> RoundParams:
    fixed_point = FixedPoint(1.0, 16, len(sites))
    return RoundParams.create(sites, min_threshold(len(sites), 1), 2, fixed_point, colluders=1)


def test_the_pin_is_the_keys_and_a_certificate_minted_for_the_same_name_has_another(
    pki: Path,
) -> None:
    genuine = x509.load_pem_x509_certificate(_credentials(pki, "owner-b")[1])
    forged = x509.load_pem_x509_certificate(_credentials(pki / "forged", "owner-b")[1])
    assert genuine.subject == forged.subject and genuine.issuer == forged.issuer
    assert key_fingerprint(genuine) != key_fingerprint(forged)
    assert owner_pins(pki, ["owner-b"]) == {"owner-b": key_fingerprint(genuine)}
    # An owner's own name pinned to another key is a broken roster: refused at start-up.
    with pytest.raises(ValueError, match="whose own key is"):
        _identity(pki, OWNER, {OWNER: key_fingerprint(genuine)})


def test_a_site_off_the_roster_is_refused_before_anything_is_signed_or_sent(
    tmp_path: Path, pki: Path
) -> None:
    """The stranger holds a genuine certificate of the CA; it is simply not on the roster."""
    identity = _identity(pki, OWNER, owner_pins(pki, PEERS))
    site = _site(tmp_path, identity)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    sites = tuple(sorted((*SITES, STRANGER)))
    with pytest.raises(FailedPreconditionError, match=r"does not accept \['owner-d'\] as peers"):
        site.attest("job", sites, 1, curator=CURATOR)
    with pytest.raises(FailedPreconditionError, match=r"does not accept \['owner-d'\]"):
        site.plan("job", sites, 1, {}, {}, curator=CURATOR)
    rounds = SiteRounds(identity, site.noise_input, site.rng_for, admit=site.check_round)
    with pytest.raises(FailedPreconditionError, match=r"does not accept \['owner-d'\]"):
        rounds.advertise("job", _params(sites))
    # Its certificate, offered in a round, is refused too (the check every signature goes by).
    stranger = _credentials(pki, STRANGER)[1]
    with pytest.raises(SecAggError, match="not on this owner's roster"):
        identity.check_certificate(STRANGER, stranger)
    assert list(site.ledger.entries()) == []  # type: ignore[union-attr]
    # Control: the rostered sites plan.
    site.attest("job", SITES, 1, curator=CURATOR)


def test_an_owner_pinning_no_peer_runs_no_cape_job(tmp_path: Path, pki: Path) -> None:
    """The default policy lists no peer: a missing pin refuses, whatever the CA certified."""
    identity = _identity(pki, OWNER, OwnerPolicy().peer_pins)
    site = _site(tmp_path, identity)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    with pytest.raises(FailedPreconditionError, match=r"its roster .* lists \[\]"):
        site.attest("job", SITES, 1, curator=CURATOR)
    with pytest.raises(SecAggError, match="not on this owner's roster"):
        identity.check_certificate("owner-b", _credentials(pki, "owner-b")[1])


def test_a_certificate_for_a_pinned_name_with_another_key_aborts_the_plan(
    tmp_path: Path, pki: Path
) -> None:
    """The CA holder mints owner-b's name for its own key and signs owner-b's count with it."""
    identity = _identity(pki, OWNER, owner_pins(pki, PEERS))
    site = _site(tmp_path, identity)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    signers = {p: _identity(pki, p, {}) for p in PEERS}
    forged = _identity(pki, "owner-b", {}, directory=pki / "forged")
    own, own_cert = site.attest("job", SITES, 1, curator=CURATOR)
    attestations = {OWNER: own, **{p: _attestation(signers[p], p, SITES) for p in PEERS}}
    certificates = {OWNER: own_cert, **{p: signers[p].certificate_pem for p in PEERS}}
    attestations["owner-b"] = _attestation(forged, "owner-b", SITES)
    certificates["owner-b"] = forged.certificate_pem
    with pytest.raises(AbortedError, match=r"not the key .* this owner pins for it"):
        site.plan("job", SITES, 1, attestations, certificates, curator=CURATOR)
    # The job is over at this owner: no round, no noise draw, nothing charged.
    with pytest.raises(AbortedError, match="aborted at this owner"):
        site.check_round("job", _params(SITES))
    with pytest.raises(AbortedError, match="aborted at this owner"):
        site.noise_input("job", _params(SITES))
    assert list(site.ledger.entries()) == []  # type: ignore[union-attr]
    # Control: the same plan with owner-b's genuine certificate and signature is planned.
    site.open("job-2", SPEC, 1, curator=CURATOR, consumer="c")
    own, own_cert = site.attest("job-2", SITES, 1, curator=CURATOR)
    genuine = {
        p: SizeAttestation(
            p,
            ROWS,
            signers[p].signer.sign(plan_statement("job-2", SPEC, SITES, 1, 0, p, ROWS)),
        )
        for p in PEERS
    }
    certificates = {OWNER: own_cert, **{p: signers[p].certificate_pem for p in PEERS}}
    plan = site.plan("job-2", SITES, 1, {OWNER: own, **genuine}, certificates, curator=CURATOR)
    assert plan.sites == len(SITES)


def test_a_roster_the_curator_changed_between_sites_aborts_the_plan(
    tmp_path: Path, pki: Path
) -> None:
    """Every site signs the sorted sites of the plan. The curator asks owner-b to attest a plan
    over four sites (the stranger included, whom owner-b's operator might accept) and shows
    owner-a a plan over three with that signature: owner-a's check fails, as it would for any
    roster that differs from the one it was shown."""
    identity = _identity(pki, OWNER, owner_pins(pki, PEERS))
    site = _site(tmp_path, identity)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    signers = {p: _identity(pki, p, {}) for p in PEERS}
    own, own_cert = site.attest("job", SITES, 1, curator=CURATOR)
    wider = tuple(sorted((*SITES, STRANGER)))
    attestations = {
        OWNER: own,
        "owner-b": _attestation(signers["owner-b"], "owner-b", wider),
        "owner-c": _attestation(signers["owner-c"], "owner-c", SITES),
    }
    certificates = {OWNER: own_cert, **{p: signers[p].certificate_pem for p in PEERS}}
    with pytest.raises(AbortedError, match="not signed by 'owner-b' for this plan"):
        site.plan("job", SITES, 1, attestations, certificates, curator=CURATOR)
    assert list(site.ledger.entries()) == []  # type: ignore[union-attr]
