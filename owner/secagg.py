"""An owner's side of secure aggregation: its rounds, and its identity as a signing site.

A round of :mod:`dpmarket.common.secagg` needs every site's key advertisement to be bound to its
identity, and every site to check every other site's advertisement, so that the curator, which
routes every message, cannot substitute a key (Bonawitz et al. 2017, the active-adversary variant).
Each owner holds a static X25519 key for the life of its process (its
:class:`~dpmarket.common.secagg.pairkeys.PairKeyring`, drawn in memory at start-up, never on disk: a
restart rotates it), signed once with its certificate key; a peer checks that binding the first time
it sees it and derives their pair key once, and every round's advertisement is then authenticated
pair by pair with a key derived from it and the round id (:mod:`dpmarket.common.secagg.pairkeys`).
Owners already hold an identity key: their mTLS certificate's ECDSA P-256 key, issued by the
deployment CA with the owner's name in it. :class:`SiteIdentity` signs with it and checks other
sites' certificates against the CA, their names and the owner's roster: the peers its policy lists
with the pins of their public keys (``[peers]``). The CA alone would not do: whoever holds its key
can mint a certificate under any name, and a curator that could would add sites it plays itself to a
victim's job; no one can mint a certificate for a pinned key. The mTLS channel authenticates an
owner and the curator to each other, not owners to owners, which is why the signatures are needed.

What an owner sums in a round is decided by the job the round belongs to, through an *input source*
(a CAPE job's noise draw), never by the curator's messages; :class:`RoundJobs` is what the
secure-aggregation service asks of the owner's jobs before it runs a round of one. Before it sends
anything in a round, the owner checks that the round defends against at least as many colluders as
its policy's floor (and its job's plan) require, which fixes how high the threshold must be
(:class:`dpmarket.common.secagg.protocol.RoundParams`); the survivors' signatures of the consistency
check are verified with the same certificates as the key advertisements. A sparse round (SecAgg+,
:mod:`dpmarket.common.secagg.sparse`) adds a stage, :meth:`SiteRounds.reveal` (the site's graph
nonce), and checks the certificates of its neighbours only, as their advertisements' signatures are
checked.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from dpmarket.common.ids import short_id
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier, SecAggError, Signer
from dpmarket.common.secagg.endpoints import MaskedInput, SurvivorAttestation
from dpmarket.common.secagg.pairkeys import PairKeyring
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggSite,
    UnmaskResponse,
)
from dpmarket.common.secagg.sparse import SparseSecAggSite, make_site
from dpmarket.runtime.identity import (
    Identity,
    check_issued_by,
    identity_from_certificate,
    key_fingerprint,
    normalize_fingerprint,
    public_key_fingerprint,
)

logger = logging.getLogger(__name__)

#: Provides a site's input of a round: ``(job_id, params) -> vector of shape (vector_length,)``.
InputSource = Callable[[str, RoundParams], NDArray[np.float64]]
#: Admits a round of a job before this site sends anything in it: ``(job_id, params) -> None``,
#: raising a :class:`~dpmarket.common.errors.DPMarketError` for a round the job does not allow.
RoundCheck = Callable[[str, RoundParams], None]


class RoundJobs(Protocol):
    """The jobs whose secure-aggregation rounds an owner takes part in.

    :class:`dpmarket.owner.cape.CapeSite` (CAPE jobs) in production. The secure-aggregation service
    runs a round only for a job that :meth:`check_curator` accepts for the calling curator; what the
    owner sums in it comes from the job's :data:`InputSource`.
    """

    @property
    def name(self) -> str:
        """The owner's name: its site id in every round."""
        ...

    def check_curator(self, job_id: str, curator: str) -> None:
        """Return if ``curator`` (``role:name``) opened ``job_id``; raise
        :class:`~dpmarket.common.errors.NotFoundError` otherwise (an unknown job, or another
        curator's)."""
        ...


class SiteIdentity:
    """A site's signing key and certificate, the CA its peers' certificates must chain to, and
    the peers it accepts with the pins of their keys.

    Parameters
    ----------
    name : str
        The site's name (its owner name).
    private_key : EllipticCurvePrivateKey
        P-256 key of the site's certificate.
    certificate_pem : bytes
        The site's certificate, sent with every advertisement.
    ca_pem : bytes or None
        The deployment CA's certificate; ``None`` accepts the keys given to
        :meth:`trusting` only (in-process runs, tests).
    peers : mapping of str to str, optional
        The owner's roster (its policy's ``[peers]``): the names of the sites it accepts as
        peers, each with the pin of its public key
        (:func:`dpmarket.runtime.identity.key_fingerprint`).
        A certificate is accepted only for a listed name and only with the pinned key; this
        site's own name is always on the roster, with its own key. Empty (the default) accepts
        no certificate of another site.

    Attributes
    ----------
    keyring : PairKeyring
        The site's long-lived pair keys: a static X25519 key drawn now (in memory only), bound
        with the certificate key, for the deployment named by the SHA-256 of the CA certificate
        (``b"in-process"`` without a CA). Shared by every round of every job of this process;
        :meth:`PairKeyring.rotate` replaces the static key between rounds.

    Raises
    ------
    ValueError
        If a pin is not 64 hexadecimal digits, or this site's own pin (if listed) is not its
        own key's.

    Notes
    -----
    Why pins, beside the CA: the CA vouches for names, and whoever holds its key (the operator
    who ran ``dpmarket init``, possibly the curator's) can mint an owner certificate under any
    name. A curator that could do so and were taken at the CA's word could run a CAPE job with
    one honest owner and sites it plays itself: the round's sum minus its own draws is the
    victim's noise share, and the victim's release then carries only its small local noise
    (``tests/integration/test_active_curator.py``, the Sybil attack). A pin is the owner's own
    record of each peer's key, exchanged out of band when the deployment was set up; the CA's
    key cannot produce a certificate with a pinned key it does not hold.
    """

    def __init__(
        self,
        name: str,
        private_key: ec.EllipticCurvePrivateKey,
        certificate_pem: bytes,
        ca_pem: bytes | None,
        *,
        peers: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.signer: Signer = EcdsaSigner(private_key)
        self.certificate_pem = certificate_pem
        self._ca = None if ca_pem is None else x509.load_pem_x509_certificate(ca_pem)
        deployment = b"in-process" if self._ca is None else self._ca.fingerprint(hashes.SHA256())
        self.keyring = PairKeyring(name, self.signer, deployment=deployment)
        own = public_key_fingerprint(private_key.public_key())
        pins = {site: normalize_fingerprint(pin) for site, pin in (peers or {}).items()}
        if pins.get(name, own) != own:
            raise ValueError(
                f"the roster pins {pins[name]} for this site ({name!r}), whose own key is {own}"
            )
        pins[name] = own
        self._pins = pins
        self._trusted: dict[str, ec.EllipticCurvePublicKey] = {}
        # (site, PEM) -> (not valid before, not valid after, key) of certificates that passed.
        self._checked: dict[
            tuple[str, bytes],
            tuple[datetime.datetime, datetime.datetime, ec.EllipticCurvePublicKey],
        ] = {}
        self._checked_lock = threading.Lock()

    @classmethod
    def from_pem(
        cls,
        name: str,
        key_pem: bytes,
        certificate_pem: bytes,
        ca_pem: bytes,
        *,
        peers: Mapping[str, str] | None = None,
    ) -> SiteIdentity:
        """From the PEM files of the site's mTLS credentials and its roster (``peers``, as the
        constructor's).

        Raises
        ------
        ValueError
            If the key is not a P-256 private key, or as the constructor.
        """
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the certificate key is not an elliptic-curve key")
        return cls(name, key, certificate_pem, ca_pem, peers=peers)

    def trusting(self, keys: Mapping[str, ec.EllipticCurvePublicKey]) -> SiteIdentity:
        """This identity, also accepting the given sites' keys without certificates (in-process
        runs, where no CA exists): each is put on the roster with its key."""
        self._trusted.update(keys)
        for site, key in keys.items():
            self._pins[site] = public_key_fingerprint(key)
        return self

    @property
    def roster(self) -> frozenset[str]:
        """The sites this identity accepts as peers: its pinned names and itself."""
        return frozenset(self._pins)

    def check_roster(self, sites: Sequence[str]) -> None:
        """Raise unless every site of a job or round is on this owner's roster.

        Raises
        ------
        FailedPreconditionError
            Naming the sites that are not (the names are the curator's request, the roster this
            owner's policy: public inputs only), and what the operator can do.
        """
        strangers = sorted(set(sites) - set(self._pins))
        if strangers:
            raise FailedPreconditionError(
                f"owner {self.name} does not accept {strangers} as peers: its roster (the "
                f"[peers] of its policy) lists {sorted(set(self._pins) - {self.name})}. A peer "
                "is added by its operator with its name and public-key pin (dpmarket pki show "
                "CERT), never by the curator"
            )

    def verifier(self) -> CertificateVerifier:
        """A fresh verifier for one round; it admits sites as their certificates arrive."""
        return CertificateVerifier(self)

    def check_certificate(self, site: str, pem: bytes) -> ec.EllipticCurvePublicKey:
        """The P-256 public key of ``site``'s certificate, once the certificate is checked.

        The certificate must chain to the deployment CA, be valid now, name ``owner:<site>``
        and carry the key this owner pins for ``site`` (its roster). A certificate that passed
        once is remembered with its key (the PEM bytes and the site name are the cache key);
        later calls re-check only its validity period, so a round with ``S`` sites does not
        re-parse and re-verify ``S - 1`` certificates each time.

        Raises
        ------
        SecAggError
            If there is no CA, or the certificate fails a check (``site`` not on the roster, or
            its key not the pinned one, included).
        """
        if self._ca is None:
            raise SecAggError(f"no CA to check the certificate of site {site!r}")
        now = datetime.datetime.now(datetime.UTC)
        with self._checked_lock:
            known = self._checked.get((site, pem))
        if known is not None:
            not_before, not_after, key = known
            if not not_before <= now <= not_after:
                raise SecAggError(
                    f"the certificate of site {site!r} is not acceptable: it is not valid now"
                )
            return key
        try:
            cert = x509.load_pem_x509_certificate(pem)
            check_issued_by(cert, [self._ca])
            identity = identity_from_certificate(cert)
        except (ValueError, TypeError) as exc:
            raise SecAggError(f"the certificate of site {site!r} is not acceptable: {exc}") from exc
        if identity != Identity("owner", site):
            raise SecAggError(f"a certificate of {identity} was presented for site {site!r}")
        public = cert.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise SecAggError(f"the certificate of site {site!r} has no elliptic-curve key")
        pin = self._pins.get(site)
        if pin is None:
            raise SecAggError(
                f"site {site!r} is not on this owner's roster (the [peers] of its policy)"
            )
        found = key_fingerprint(cert)
        if found != pin:
            raise SecAggError(
                f"the certificate presented for site {site!r} has the key {found[:16]}…, not the "
                f"key {pin[:16]}… this owner pins for it: a certificate the CA issued under "
                f"{site!r} for another key"
            )
        key = public
        with self._checked_lock:
            self._checked[site, pem] = (cert.not_valid_before_utc, cert.not_valid_after_utc, key)
        return key


class CertificateVerifier:
    """:class:`~dpmarket.common.secagg.crypto.Verifier` of one round: admits each site's key from a
    certificate that chains to the CA, is valid now and names ``owner:<site>``; then checks
    signatures with the admitted keys (and the identity's trusted keys).

    Certificates are admitted all at once (:meth:`admit`, complete-graph rounds, where every
    advertisement is checked) or offered and admitted at the first signature of their site
    (:meth:`offer`, sparse rounds, where only the neighbours' are checked)."""

    def __init__(self, identity: SiteIdentity) -> None:
        self._identity = identity
        self._keys: dict[str, ec.EllipticCurvePublicKey] = {}
        self._offered: dict[str, bytes] = {}
        self._verifier = EcdsaVerifier({})

    def offer(self, certificates: Mapping[str, bytes]) -> None:
        """Keep the given sites' certificates, to be checked and admitted when a signature of
        their site is first verified (a refused certificate then fails that verification)."""
        self._offered.update(certificates)

    def admit(self, certificates: Mapping[str, bytes]) -> None:
        """Check and admit the given sites' certificates (a site with an empty certificate is
        admitted only if the identity trusts its key).

        Raises
        ------
        SecAggError
            If a certificate fails a check.
        """
        for site, pem in certificates.items():
            trusted = self._identity._trusted.get(site)
            if trusted is not None and not pem:
                self._keys[site] = trusted
            else:
                self._keys[site] = self._identity.check_certificate(site, pem)
        self._verifier = EcdsaVerifier(self._keys)

    def verify(self, site: str, message: bytes, signature: bytes) -> None:
        """Raise :class:`SecAggError` unless ``signature`` is the admitted key's of ``site``
        (admitting its offered certificate first, if any)."""
        if site not in self._keys and site in self._offered:
            self.admit({site: self._offered.pop(site)})
        self._verifier.verify(site, message, signature)


@dataclass
class _Round:
    site: SecAggSite | SparseSecAggSite
    verifier: CertificateVerifier
    lock: threading.Lock


class SiteRounds:
    """The secure-aggregation rounds an owner takes part in, keyed by job and round id.

    Parameters
    ----------
    identity : SiteIdentity or None
        The owner's signing identity; ``None`` refuses every round (plaintext, ``--insecure``
        owners have no certificate to sign with).
    inputs : InputSource
        What this site sums in a round of a given job.
    rng : callable
        Returns the generator of the stochastic rounding of a job's round (seeded per job in
        tests, CSPRNG-seeded in production).
    on_finished : callable, optional
        Told ``(job_id, round_id, survivors)`` when this site answers a round's unmasking: the
        sites whose inputs are in the round's sum.
    min_colluders : int, default 0
        The owner's floor on ``S_C`` (its policy's ``cape.min_colluders``): a round that defends
        against fewer colluders is refused before this site sends anything.
    admit : callable, optional
        Checks a round against its job before this site sends anything (for CAPE: the planned
        sites, the vector length, at least the plan's ``S_C``).

    Notes
    -----
    A round is remembered until its job is forgotten (:meth:`forget`, when the job closes): a
    finished or aborted round cannot be started again under the same id, and every later call
    of it finds the round over, so no sequence of requests gets a site to answer a round twice.
    """

    def __init__(
        self,
        identity: SiteIdentity | None,
        inputs: InputSource,
        rng: Callable[[str], np.random.Generator],
        on_finished: Callable[[str, bytes, tuple[str, ...]], None] | None = None,
        *,
        min_colluders: int = 0,
        admit: RoundCheck | None = None,
    ) -> None:
        if isinstance(min_colluders, bool) or not isinstance(min_colluders, int):
            raise ValueError(f"min_colluders must be an int, got {min_colluders!r}")
        if min_colluders < 0:
            raise ValueError(f"min_colluders must be >= 0, got {min_colluders}")
        self.identity = identity
        self.inputs = inputs
        self.rng = rng
        self.on_finished = on_finished
        self.min_colluders = min_colluders
        self.admit = admit
        self._rounds: dict[tuple[str, bytes], _Round] = {}
        self._lock = threading.Lock()

    def _require_identity(self) -> SiteIdentity:
        if self.identity is None:
            raise FailedPreconditionError(
                "secure aggregation needs this owner's certificate to sign its keys; it runs "
                "without one (--insecure)"
            )
        return self.identity

    def _round(self, job_id: str, round_id: bytes) -> _Round:
        with self._lock:
            found = self._rounds.get((job_id, round_id))
        if found is None:
            raise NotFoundError(
                f"no secure-aggregation round {round_id.hex()[:8]}… of job {short_id(job_id)}"
            )
        return found

    def advertise(self, job_id: str, params: RoundParams) -> tuple[KeyAdvertisement, bytes]:
        """Round 0: start this site's part of a round; return its advertisement and certificate.

        Raises
        ------
        FailedPreconditionError
            If this owner has no identity to sign with, the round defends against fewer
            colluders than this owner's floor (the message names the floor, a public value of
            its policy), a site of the round is not on this owner's roster
            (:meth:`SiteIdentity.check_roster`), the job does not admit the round, or the round
            exists already (it may be over: a round id is used once).
        ValueError
            If this site is not one of the round's sites.
        """
        identity = self._require_identity()
        if params.colluders < self.min_colluders:
            raise FailedPreconditionError(
                f"the round defends against S_C={params.colluders} colluders (threshold "
                f"t={params.threshold} of {len(params.sites)} sites), below this owner's floor "
                f"of {self.min_colluders} colluders (its policy's cape.min_colluders)"
            )
        identity.check_roster(params.sites)
        if self.admit is not None:
            self.admit(job_id, params)
        key = (job_id, params.round_id)
        verifier = identity.verifier()
        site = make_site(
            identity.name,
            params,
            signer=identity.signer,
            verifier=verifier,
            keyring=identity.keyring,
        )
        entry = _Round(site, verifier, threading.Lock())
        with self._lock:
            if key in self._rounds:
                raise FailedPreconditionError(f"round {params.round_id.hex()[:8]}… already started")
            try:  # in any job, over: its pair keys would let its messages verify again
                identity.keyring.claim_round(params.round_id)
            except SecAggError as exc:
                raise FailedPreconditionError(str(exc)) from None
            self._rounds[key] = entry
        with entry.lock:
            return site.advertise_keys(), identity.certificate_pem

    def reveal(
        self,
        job_id: str,
        round_id: bytes,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> bytes:
        """Sparse rounds, between rounds 0 and 1: record every advertisement (its certificate is
        checked when the site turns out to be a neighbour) and reveal this site's graph nonce.

        Raises
        ------
        FailedPreconditionError
            For a complete-graph round, or out of order.
        SecAggError, NotFoundError
            As :meth:`dpmarket.common.secagg.sparse.SparseSecAggSite.reveal_nonce`.
        """
        identity = self._require_identity()
        entry = self._round(job_id, round_id)
        with entry.lock:
            site = entry.site
            if not isinstance(site, SparseSecAggSite):
                raise FailedPreconditionError("a complete-graph round has no nonce to reveal")
            entry.verifier.offer(
                {s: certificates.get(s, b"") for s in advertisements if s != identity.name}
            )
            return site.reveal_nonce(advertisements)

    def share(
        self,
        job_id: str,
        round_id: bytes,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
        nonces: Mapping[str, bytes] | None = None,
    ) -> dict[str, bytes]:
        """Round 1: check every advertisement's certificate and its static key's binding (a
        binding once per peer and key: the identity's keyring remembers it); share this site's
        secrets. A certificate or binding that fails aborts the round at this site. Sparse
        rounds take the nonces instead (the advertisements came with :meth:`reveal`) and check
        the neighbours' only. The round's keys of each advertisement are checked at
        :meth:`masked`, against the tag that leads the sender's shares."""
        identity = self._require_identity()
        entry = self._round(job_id, round_id)
        with entry.lock:
            site = entry.site
            if isinstance(site, SparseSecAggSite):
                if nonces is None:
                    raise FailedPreconditionError("a sparse round's key sharing needs the nonces")
                return site.share_keys(nonces)
            try:
                entry.verifier.admit(
                    {s: certificates.get(s, b"") for s in advertisements if s != identity.name}
                )
            except SecAggError as exc:
                # A refused certificate ends the round here, as a refused signature does.
                raise site.abort(str(exc)) from None
            return site.share_keys(advertisements)

    def masked(self, job_id: str, round_id: bytes, ciphertexts: Mapping[str, bytes]) -> MaskedInput:
        """Round 2: this site's masked input (its job's input for this round), with its
        acknowledgements in sparse rounds.

        Raises
        ------
        InvalidArgumentError
            If the input does not fit the round's fixed-point range (the curator's parameter).
            The message names the range only: the input is a secret noise draw, and the
            quantizer's own message (which names the offending value) goes to this owner's log.
            The draw is discarded with the round (no release uses a round this site did not
            finish; the input source may refuse a second draw for the same round, as a CAPE
            job does, so the curator runs a new round), and whether a fresh draw fits depends
            on public parameters only.
        SecAggError, FailedPreconditionError, NotFoundError
            As :meth:`dpmarket.common.secagg.protocol.SecAggSite.masked_input`; their messages
            concern the protocol's messages, not the input.
        """
        entry = self._round(job_id, round_id)
        with entry.lock:
            vector = self.inputs(job_id, entry.site.params)
            try:
                masked = entry.site.masked_input(ciphertexts, vector, self.rng(job_id))
                acks = (
                    entry.site.acknowledgements if isinstance(entry.site, SparseSecAggSite) else {}
                )
                return MaskedInput(masked, acks)
            except SecAggError:
                raise
            except ValueError as exc:
                logger.warning(
                    "round %s… of job %s: input refused (this log only): %s",
                    round_id.hex()[:8],
                    short_id(job_id),
                    exc,
                )
                clip = entry.site.params.fixed_point.clip
                raise InvalidArgumentError(
                    f"this site's input does not fit the round's fixed-point range [-{clip:g}, "
                    f"{clip:g}]"
                ) from None

    def check(self, job_id: str, round_id: bytes, survivors: Sequence[str]) -> SurvivorAttestation:
        """Round 3: this site's signature of the survivor list (sparse rounds: its tags of it
        for its surviving neighbours), once per round."""
        entry = self._round(job_id, round_id)
        with entry.lock:
            site = entry.site
            if isinstance(site, SparseSecAggSite):
                return SurvivorAttestation(tags=site.attest(survivors))
            return SurvivorAttestation(signature=site.check_consistency(survivors))

    def unmask(
        self,
        job_id: str,
        round_id: bytes,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
        acknowledgements: Mapping[str, bytes] | None = None,
    ) -> UnmaskResponse:
        """Round 4: the shares the aggregator needs, after ``t`` survivors' signatures of the
        list this site signed are verified (sparse rounds: ``t_v - 1`` neighbours' tags, and the
        acknowledgements of the survivors whose shares it reveals); the round is then over at
        this site."""
        entry = self._round(job_id, round_id)
        with entry.lock:
            site = entry.site
            if isinstance(site, SparseSecAggSite):
                response = site.unmask(survivors, dropped, signatures, acknowledgements or {})
            else:
                response = site.unmask(survivors, dropped, signatures)
        if self.on_finished is not None:
            self.on_finished(job_id, round_id, tuple(sorted(survivors)))
        return response

    def forget(self, job_id: str, round_id: bytes | None = None) -> None:
        """Drop a round (or every round of a job) and its secrets."""
        with self._lock:
            for key in [k for k in self._rounds if k[0] == job_id and round_id in (None, k[1])]:
                del self._rounds[key]
