"""An actively lying curator, with a colluding owner, against real owner processes.

Four honest owners run as ``dpmarket serve-owner`` processes over mTLS (started by
:class:`dpmarket.deploy.launcher.LocalCluster`, as the README starts them, each with its table,
policy and durable SQLite ledger). The attacker is its own gRPC client holding the deployment's
curator certificate, so every owner serves it; it also holds a fifth owner's certificate and key
(``owner-4``, issued by the same CA) and plays that owner in-process: it signs whatever the attacker
wants and hands over every share it receives. The attacks:

* inconsistent survivor lists (the reference attack, at n = 5 sites, S_C = 1): some owners are
  told the victim survived, others that it dropped;
* both shares of one peer asked of the same owner, in one request or in two;
* lying row counts relayed to the owners when they plan;
* S_C (and so the threshold) below the owners' policy floor;
* key advertisements replayed from another round, or substituted (signed by the colluder, or
  with another party's certificate);
* Sybil sites: the attacker also holds the CA's key, mints owner certificates (under new names,
  and under the genuine owners' names for its own keys) and runs a job with the victim and sites
  it plays, which would hand it the victim's noise share (the control, from the kernels, shows
  the promised epsilon of 1 becoming 2.08); every owner accepts only the peers its policy pins.

Each must be refused with nothing released — the test asserts what the attacker received: no
share of the victim beyond the colluder's own where it would matter, no ciphertext, no release —
and no owner's ledger (read from its SQLite file) gains a charge. The same attack at n = 20,
S_C = 5, and a positive control showing that the attack code recovers a victim's input when the
threshold ignores the colluders, run on the state objects (``tests/common/secagg``). A consumer's
request below an owner's floor goes through the real curator to a second cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from scipy.optimize import brentq
from sklearn.datasets import load_diabetes

from dpmarket.common.cape.agreement import SizeAttestation, plan_for, plan_statement
from dpmarket.common.cape.capefm import secure_aggregation_input, site_noise_share, site_release
from dpmarket.common.cape.mean import CapeMeanPlan, mean_sensitivity, site_mean
from dpmarket.common.cape.privacy import exact_delta
from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.secagg import run_in_process, shamir
from dpmarket.common.secagg.crypto import (
    EcdsaSigner,
    EcdsaVerifier,
    generate_private_key,
    public_key_bytes,
)
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import (
    KeyAdvertisement,
    RoundParams,
    SecAggSite,
    advertisement_message,
    consistency_message,
    min_threshold,
)
from dpmarket.consumer.client import CuratorClient
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster, owner_ledger_entries
from dpmarket.deploy.pki import issue, owner_pins
from dpmarket.experiments.cape_experiments import DIABETES_BOUNDS
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import cape_pb2, cape_pb2_grpc, secure_aggregation_pb2, secure_aggregation_pb2_grpc
from tests.common.secagg.attack import distinct, recover_input

pytestmark = pytest.mark.integration

HONEST = ("owner-0", "owner-1", "owner-2", "owner-3")
COLLUDER = "owner-4"
SITES = (*HONEST, COLLUDER)
VICTIM = "owner-1"
ROWS = 88
COLUMNS = ("c0", "c2", "c3")
SPEC = CapeMeanSpec(
    tuple((c, *DIABETES_BOUNDS[int(c[1:])]) for c in COLUMNS), epsilon=1.0, delta=1e-6
)
#: Deadline of every call: a safety net against a hang, not a timing assertion.
TIMEOUT = 60.0
OWNER_POLICY = """
[budget]
epsilon = 100.0
delta = 1e-3
[session]
epsilon = 2.0
delta = 1e-6
[cape]
min_colluders = 1
"""


# ---------------------------------------------------------------------------------- fixtures
def _tables(directory: Path, owners: Sequence[str]) -> list[Path]:
    x = np.asarray(load_diabetes(return_X_y=True, scaled=False)[0])
    out = []
    for i, owner in enumerate(owners):
        frame = pd.DataFrame(x[i * ROWS : (i + 1) * ROWS], columns=[f"c{j}" for j in range(10)])
        out.append(directory / f"{owner}.parquet")
        frame.to_parquet(out[-1])
    return out


def _cluster(
    directory: Path, owners: Sequence[str], policy: str, peer_owners: Sequence[str] = ()
) -> LocalCluster:
    (directory / "owner.toml").write_text(policy, encoding="utf-8")
    return LocalCluster(
        [],
        owners,
        directory / "logs",
        owner_tables=_tables(directory, owners),
        owner_policy=directory / "owner.toml",
        peer_owners=peer_owners,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # The colluding owner is a genuine owner the others agreed on (its key is on every honest
    # owner's roster); the attacker holds its certificate and key, and the CA's key.
    directory = tmp_path_factory.mktemp("active-curator")
    with _cluster(directory, HONEST, OWNER_POLICY, peer_owners=(COLLUDER,)) as running:
        yield running


#: Every charge in every honest owner's own SQLite ledger.
_ledgers = owner_ledger_entries


# ---------------------------------------------------------------------------------- attacker
class Refused(Exception):
    """An RPC the attacker made was refused: its status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


@dataclass
class Round:
    """A round the attacker drove up to the masked inputs."""

    params: RoundParams
    ads: dict[str, KeyAdvertisement]
    certificates: dict[str, bytes]
    masked: dict[str, np.ndarray]
    colluder: SecAggSite


class Attacker:
    """A curator of its own: the deployment's curator certificate, raw gRPC stubs to every
    honest owner, and the colluding owner's certificate and key, played in-process."""

    def __init__(self, cluster: LocalCluster) -> None:
        curator = Identity("curator", CURATOR_NAME)
        security = TransportSecurity.from_files(*identity_files(cluster.pki_dir, curator))
        self.channels = {
            o: sync_channel(t, security, Identity("owner", o))
            for o, t in zip(cluster.owner_ids, cluster.owner_targets, strict=True)
        }
        self.cape = {o: cape_pb2_grpc.CapeSiteServiceStub(c) for o, c in self.channels.items()}
        self.secagg = {
            o: secure_aggregation_pb2_grpc.SecureAggregationServiceStub(c)
            for o, c in self.channels.items()
        }
        ca, cert, key = identity_files(cluster.pki_dir, Identity("owner", COLLUDER))
        self.colluder = SiteIdentity.from_pem(
            COLLUDER,
            key.read_bytes(),
            cert.read_bytes(),
            ca.read_bytes(),
            peers=owner_pins(cluster.pki_dir, SITES),
        )
        self.pki_dir = cluster.pki_dir

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    @staticmethod
    def call(method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=TIMEOUT)
        except grpc.RpcError as exc:
            details = exc.details() or ""
            assert "Traceback" not in details
            raise Refused(exc.code(), details) from None

    def refused(self, method: Callable[..., Any], request: Any) -> Refused:
        """Call ``method``, which must refuse; return the refusal."""
        with pytest.raises(Refused) as info:
            self.call(method, request)
        return info.value

    # --------------------------------------------------------------------------- CAPE job
    def open(self, job_id: str, spec: CapeMeanSpec = SPEC) -> None:
        for owner in HONEST:
            request = cape_pb2.OpenCapeJobRequest(
                job_id=job_id, consumer="consumer:mallory", seed=7
            )
            msg.job_to_proto(request, spec)
            assert self.call(self.cape[owner].OpenCapeJob, request).num_rows == ROWS

    def attest(
        self, job_id: str, owner: str, sites: Sequence[str], colluders: int
    ) -> tuple[SizeAttestation, bytes]:
        request = cape_pb2.AttestCapePlanRequest(
            job_id=job_id, sites=list(sites), colluders=colluders
        )
        response = self.call(self.cape[owner].AttestCapePlan, request)
        return msg.attestation_from_proto(response.attestation)

    def colluder_attestation(
        self, job_id: str, sites: Sequence[str], colluders: int, rows: int = ROWS
    ) -> tuple[SizeAttestation, bytes]:
        """The colluder signs whatever count the attacker likes for itself."""
        statement = plan_statement(job_id, SPEC, sites, colluders, 0, COLLUDER, rows)
        signature = self.colluder.signer.sign(statement)
        return SizeAttestation(COLLUDER, rows, signature), self.colluder.certificate_pem

    def plan_request(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        attestations: Mapping[str, tuple[SizeAttestation, bytes]],
    ) -> cape_pb2.PlanCapeJobRequest:
        return cape_pb2.PlanCapeJobRequest(
            job_id=job_id,
            sites=list(sites),
            colluders=colluders,
            attestations=[msg.attestation_to_proto(a, c) for a, c in attestations.values()],
        )

    def open_and_plan(self, job_id: str, colluders: int = 1) -> tuple[int, float]:
        """An honest open and plan over the five sites; the statistic length and noise scale."""
        self.open(job_id)
        attested = {o: self.attest(job_id, o, SITES, colluders) for o in HONEST}
        attested[COLLUDER] = self.colluder_attestation(job_id, SITES, colluders)
        request = self.plan_request(job_id, SITES, colluders, attested)
        answers = [self.call(self.cape[o].PlanCapeJob, request) for o in HONEST]
        return int(answers[0].statistic_length), max(a.max_noise_scale for a in answers)

    def close_job(self, job_id: str) -> None:
        for owner in HONEST:
            self.call(self.cape[owner].CloseCapeJob, cape_pb2.CloseCapeJobRequest(job_id=job_id))

    # ------------------------------------------------------------------------ secure aggregation
    def params(self, length: int, scale: float, threshold: int = 4, colluders: int = 1) -> Any:
        fixed_point = FixedPoint(12.0 * scale, 30, len(SITES))
        return RoundParams.create(SITES, threshold, length, fixed_point, colluders=colluders)

    def advertise(self, job_id: str, params: RoundParams) -> tuple[dict, dict, SecAggSite]:
        round_ = msg.round_to_proto(job_id, params)
        ads, certificates = {}, {}
        for owner in HONEST:
            request = secure_aggregation_pb2.AdvertiseKeysRequest(round=round_)
            response = self.call(self.secagg[owner].AdvertiseKeys, request)
            ads[owner], certificates[owner] = msg.advertisement_from_proto(response.advertisement)
        verifier = self.colluder.verifier()
        colluder = SecAggSite(
            COLLUDER,
            params,
            signer=self.colluder.signer,
            verifier=verifier,
            keyring=self.colluder.keyring,
        )
        ads[COLLUDER] = colluder.advertise_keys()
        certificates[COLLUDER] = self.colluder.certificate_pem
        verifier.admit({o: certificates[o] for o in HONEST})
        return ads, certificates, colluder

    def share_request(
        self, job_id: str, params: RoundParams, ads: Mapping[str, KeyAdvertisement], certs: Any
    ) -> secure_aggregation_pb2.ShareKeysRequest:
        return secure_aggregation_pb2.ShareKeysRequest(
            round=msg.round_to_proto(job_id, params),
            advertisements=[msg.advertisement_to_proto(ads[s], certs[s]) for s in sorted(ads)],
        )

    def to_masked(self, job_id: str, params: RoundParams) -> Round:
        """Drive a round honestly up to every site's masked input."""
        ads, certificates, colluder = self.advertise(job_id, params)
        request = self.share_request(job_id, params, ads, certificates)
        shared = {}
        for owner in HONEST:
            response = self.call(self.secagg[owner].ShareKeys, request)
            shared[owner] = {c.recipient: bytes(c.ciphertext) for c in response.ciphertexts}
        shared[COLLUDER] = colluder.share_keys(ads)
        masked = {}
        for owner in HONEST:
            masked_request = secure_aggregation_pb2.MaskedInputRequest(
                round=msg.round_to_proto(job_id, params),
                ciphertexts=msg.ciphertexts_to_proto(
                    (s, owner, shared[s][owner]) for s in SITES if s != owner
                ),
            )
            response = self.call(self.secagg[owner].MaskedInput, masked_request)
            masked[owner] = msg.masked_from_proto(response.masked, params.vector_length)
        ciphertexts = {s: shared[s][COLLUDER] for s in HONEST}
        zeros = np.zeros(params.vector_length)
        masked[COLLUDER] = colluder.masked_input(ciphertexts, zeros, np.random.default_rng(0))
        return Round(params, ads, certificates, masked, colluder)

    def sign(self, job_id: str, r: Round, owner: str, survivors: Sequence[str]) -> bytes:
        if owner == COLLUDER:  # signs any list
            return self.colluder.signer.sign(consistency_message(r.params, survivors))
        request = secure_aggregation_pb2.ConsistencyCheckRequest(
            round=msg.round_to_proto(job_id, r.params), survivors=list(survivors)
        )
        return bytes(self.call(self.secagg[owner].ConsistencyCheck, request).signature)

    def unmask_request(
        self,
        job_id: str,
        r: Round,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
    ) -> secure_aggregation_pb2.UnmaskRequest:
        return secure_aggregation_pb2.UnmaskRequest(
            round=msg.round_to_proto(job_id, r.params),
            survivors=list(survivors),
            dropped=list(dropped),
            signatures=msg.signatures_to_proto(signatures),
        )

    def colluders_shares(self, r: Round) -> tuple[shamir.Share, shamir.Share]:
        """The colluder hands over both of its shares of the victim's secrets."""
        return r.colluder._held[VICTIM]


@pytest.fixture(scope="module")
def attacker(cluster: LocalCluster) -> Iterator[Attacker]:
    attacker = Attacker(cluster)
    yield attacker
    attacker.close()


def _job(name: str) -> str:
    return f"attack-{name}-{np.random.default_rng().integers(1 << 62):x}"


# -------------------------------------------------------------------------------- the attacks
EVERYONE = list(SITES)
WITHOUT_VICTIM = [s for s in SITES if s != VICTIM]


def _unmask_view(
    attacker: Attacker, job: str, r: Round, owners: Sequence[str], signatures: dict[str, bytes]
) -> tuple[list[shamir.Share], list[str]]:
    """Ask ``owners`` to unmask the view ``signatures`` signed (the victim alive if the
    victim's signature is among them, dropped otherwise); return the shares of the victim's
    secret they gave (its self-mask seed, or its key) and the owners that refused."""
    alive = VICTIM in signatures
    survivors, dropped = (EVERYONE, []) if alive else (WITHOUT_VICTIM, [VICTIM])
    shares, refused = [], []
    for owner in owners:
        request = attacker.unmask_request(job, r, survivors, dropped, signatures)
        try:
            response = attacker.call(attacker.secagg[owner].Unmask, request)
        except Refused as refusal:
            assert refusal.code == grpc.StatusCode.ABORTED, refusal
            assert "below the threshold t=4" in refusal.details
            refused.append(owner)
            continue
        if alive:
            assert not response.key_shares  # told nobody dropped
            shares.append(msg.shares_from_proto(response.self_mask_shares)[VICTIM])
        else:
            assert VICTIM not in msg.shares_from_proto(response.self_mask_shares)
            shares.append(msg.shares_from_proto(response.key_shares)[VICTIM])
    return shares, refused


@pytest.mark.parametrize(
    ("told_survived", "told_dropped"),
    [
        (("owner-0",), ("owner-2", "owner-3")),  # the split that works when t = 3
        (("owner-0", "owner-2"), ("owner-3",)),
    ],
    ids=["1-2", "2-1"],
)
def test_inconsistent_survivor_lists_give_no_secret_of_the_victim(
    cluster: LocalCluster,
    attacker: Attacker,
    told_survived: tuple[str, ...],
    told_dropped: tuple[str, ...],
) -> None:
    """n = 5, S_C = 1, so t = 4. The victim and ``told_survived`` are told U3 = all five; the
    others that the victim dropped; the colluder signs both lists. The view with fewer than t
    signers is refused (ABORTED, nothing revealed); at most one view gathers t signatures, so
    the attacker never holds t shares of both the victim's self-mask seed and its mask key, and
    the victim's noise draw stays masked. No owner releases or charges anything."""
    before = _ledgers(cluster)
    job = _job("survivors")
    length, scale = attacker.open_and_plan(job)
    r = attacker.to_masked(job, attacker.params(length, scale))
    assert r.params.threshold == 4 == min_threshold(5, 1)
    view_all = {o: attacker.sign(job, r, o, EVERYONE) for o in (VICTIM, *told_survived, COLLUDER)}
    view_without = {o: attacker.sign(job, r, o, WITHOUT_VICTIM) for o in (*told_dropped, COLLUDER)}

    seed_share, key_share = attacker.colluders_shares(r)
    got_seeds, refused_all = _unmask_view(attacker, job, r, (VICTIM, *told_survived), view_all)
    got_keys, refused_without = _unmask_view(attacker, job, r, told_dropped, view_without)
    seed_shares, key_shares = [seed_share, *got_seeds], [key_share, *got_keys]
    refused = refused_all + refused_without
    assert refused, "at least one view must be refused"
    t = r.params.threshold
    assert len(distinct(seed_shares)) < t or len(distinct(key_shares)) < t
    s_publics = {s: ad.s_public for s, ad in r.ads.items()}
    recovered = recover_input(
        r.params, VICTIM, SITES, s_publics, r.masked[VICTIM], seed_shares, key_shares
    )
    assert recovered is None
    # An owner that refused is over for the round: the other view's request gets nothing either.
    for owner in refused:
        again = attacker.unmask_request(job, r, WITHOUT_VICTIM, [VICTIM], view_without)
        refusal = attacker.refused(attacker.secagg[owner].Unmask, again)
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    # An owner that refused never saw the round end: it releases nothing for it.
    for owner in refused:
        release = cape_pb2.ReleaseCapeRequest(
            job_id=job,
            round_id=r.params.round_id,
            noise_total=msg.vector_to_proto(np.zeros(length)),
        )
        refusal = attacker.refused(attacker.cape[owner].ReleaseCape, release)
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    attacker.close_job(job)
    assert _ledgers(cluster) == before


def test_an_owner_never_gives_both_shares_of_one_peer(
    cluster: LocalCluster, attacker: Attacker
) -> None:
    """Every survivor signs the true U3 (all five). Asking owner-0 for the victim's key share
    beside its seed share in one request, owner-2 for the key share in a second request after
    it answered, or owner-3 for a second signature, or restarting the round: each refused, and
    the attacker holds the seed shares of an honest round only."""
    before = _ledgers(cluster)
    job = _job("both-shares")
    length, scale = attacker.open_and_plan(job)
    r = attacker.to_masked(job, attacker.params(length, scale))
    signed = {o: attacker.sign(job, r, o, EVERYONE) for o in SITES}

    both = attacker.unmask_request(job, r, EVERYONE, [VICTIM], signed)
    refusal = attacker.refused(attacker.secagg["owner-0"].Unmask, both)
    assert refusal.code == grpc.StatusCode.ABORTED and "U2 \\ U3" in refusal.details
    honest = attacker.unmask_request(job, r, EVERYONE, [], signed)
    refusal = attacker.refused(attacker.secagg["owner-0"].Unmask, honest)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION  # aborted: nothing, ever

    answer = attacker.call(attacker.secagg["owner-2"].Unmask, honest)
    assert set(msg.shares_from_proto(answer.self_mask_shares)) == set(SITES)
    assert not answer.key_shares
    second = attacker.unmask_request(job, r, WITHOUT_VICTIM, [VICTIM], signed)
    refusal = attacker.refused(attacker.secagg["owner-2"].Unmask, second)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION

    resign = secure_aggregation_pb2.ConsistencyCheckRequest(
        round=msg.round_to_proto(job, r.params), survivors=WITHOUT_VICTIM
    )
    refusal = attacker.refused(attacker.secagg["owner-3"].ConsistencyCheck, resign)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    restart = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, r.params))
    refusal = attacker.refused(attacker.secagg["owner-3"].AdvertiseKeys, restart)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "already started" in refusal.details
    attacker.close_job(job)
    assert _ledgers(cluster) == before


@pytest.mark.parametrize(
    "lie",
    ["another owner's count", "the owner's own count", "signed by the colluder", "other sites"],
)
def test_lying_row_counts_abort_the_job_with_nothing_released(
    cluster: LocalCluster, attacker: Attacker, lie: str
) -> None:
    """The attacker relays to owner-0 a plan whose counts are not what the sites signed for it:
    owner-0 aborts the job (ABORTED) before it draws any noise, and then refuses every later
    call of the job (a new plan, a round, a release); nothing is charged."""
    before = _ledgers(cluster)
    job = _job("sizes")
    attacker.open(job)
    attested = {o: attacker.attest(job, o, SITES, 1) for o in HONEST}
    attested[COLLUDER] = attacker.colluder_attestation(job, SITES, 1)
    two, cert2 = attested["owner-2"]
    if lie == "another owner's count":  # owner-2 said 88, owner-0 is told 880
        attested["owner-2"] = (dataclasses.replace(two, rows=10 * ROWS), cert2)
    elif lie == "the owner's own count":
        zero, cert0 = attested["owner-0"]
        attested["owner-0"] = (dataclasses.replace(zero, rows=ROWS // 2), cert0)
    elif lie == "signed by the colluder":
        statement = plan_statement(job, SPEC, SITES, 1, 0, "owner-2", 10 * ROWS)
        forged = SizeAttestation("owner-2", 10 * ROWS, attacker.colluder.signer.sign(statement))
        attested["owner-2"] = (forged, cert2)
    else:  # owner-2's genuine signature, made for a plan over three sites only
        attested["owner-2"] = attacker.attest(job, "owner-2", ["owner-0", "owner-2", COLLUDER], 1)
    request = attacker.plan_request(job, SITES, 1, attested)
    refusal = attacker.refused(attacker.cape["owner-0"].PlanCapeJob, request)
    assert refusal.code == grpc.StatusCode.ABORTED, refusal
    assert "row count" in refusal.details

    again = cape_pb2.AttestCapePlanRequest(job_id=job, sites=list(SITES), colluders=1)
    refusal = attacker.refused(attacker.cape["owner-0"].AttestCapePlan, again)
    assert refusal.code == grpc.StatusCode.ABORTED and "aborted at this owner" in refusal.details
    params = attacker.params(len(COLUMNS), 1.0)
    advertise = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, params))
    refusal = attacker.refused(attacker.secagg["owner-0"].AdvertiseKeys, advertise)
    assert refusal.code == grpc.StatusCode.ABORTED
    release = cape_pb2.ReleaseCapeRequest(
        job_id=job, round_id=params.round_id, noise_total=msg.vector_to_proto(np.zeros(3))
    )
    refusal = attacker.refused(attacker.cape["owner-0"].ReleaseCape, release)
    assert refusal.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION)
    attacker.close_job(job)
    assert _ledgers(cluster) == before


def test_s_c_below_the_owners_floor_is_refused_before_anything_is_signed_or_sent(
    cluster: LocalCluster, attacker: Attacker
) -> None:
    """The owners' policy floor is S_C = 1. A plan with S_C = 0 is neither signed nor made; a
    round declaring S_C = 0 (threshold 3 of 5, the attack's) gets no key advertisement; a round
    with t = 3 that claims S_C = 1 is malformed. Nothing is charged."""
    before = _ledgers(cluster)
    job = _job("floor")
    attacker.open(job)
    for owner in HONEST:
        request = cape_pb2.AttestCapePlanRequest(job_id=job, sites=list(SITES), colluders=0)
        refusal = attacker.refused(attacker.cape[owner].AttestCapePlan, request)
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "below the 1 this owner requires (its floor is 1" in refusal.details
    attested = {o: attacker.attest(job, o, SITES, 1) for o in HONEST}
    attested[COLLUDER] = attacker.colluder_attestation(job, SITES, 1)
    low = attacker.plan_request(job, SITES, 0, attested)
    refusal = attacker.refused(attacker.cape["owner-1"].PlanCapeJob, low)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    plan = attacker.plan_request(job, SITES, 1, attested)
    answer = attacker.call(attacker.cape["owner-1"].PlanCapeJob, plan)

    weak = attacker.params(int(answer.statistic_length), answer.max_noise_scale, 3, colluders=0)
    advertise = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, weak))
    refusal = attacker.refused(attacker.secagg["owner-1"].AdvertiseKeys, advertise)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "S_C=0 colluders (threshold t=3 of 5 sites), below this owner's floor" in (
        refusal.details
    )
    malformed = msg.round_to_proto(job, weak)
    malformed.colluders = 1
    advertise = secure_aggregation_pb2.AdvertiseKeysRequest(round=malformed)
    refusal = attacker.refused(attacker.secagg["owner-1"].AdvertiseKeys, advertise)
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "t > (n + S_C) / 2" in refusal.details
    attacker.close_job(job)
    assert _ledgers(cluster) == before


def _forged_advertisement(
    params: RoundParams, site: str, signer: EcdsaSigner | Any
) -> KeyAdvertisement:
    c_public = public_key_bytes(generate_private_key())
    s_public = public_key_bytes(generate_private_key())
    signature = signer.sign(advertisement_message(params.round_id, site, c_public, s_public))
    return KeyAdvertisement(site, c_public, s_public, signature)


def test_replayed_and_substituted_key_advertisements_get_no_share(
    cluster: LocalCluster, attacker: Attacker
) -> None:
    """Round 2 presents keys of the attacker's signed by the colluder's key under owner-2's
    certificate, under the colluder's certificate, or under the curator's certificate
    (substitution): every owner given them refuses (ABORTED) and sends no ciphertext. Round 3
    presents owner-0 owner-2's genuine advertisement of round 1 (replay): its static key and
    binding are owner-2's, so owner-0 shares, to the genuine owners under pair keys the curator
    cannot compute, and refuses at its masked input (ABORTED), before anything depends on its
    draw: owner-2's tag of round 3 does not cover the old mask key. Round 1 cannot be
    restarted either."""
    before = _ledgers(cluster)
    job = _job("advertisements")
    length, scale = attacker.open_and_plan(job)
    first = attacker.params(length, scale)
    old_ads, _, _ = attacker.advertise(job, first)
    second = attacker.params(length, scale)
    ads, certificates, _ = attacker.advertise(job, second)
    curator_cert = identity_files(attacker.pki_dir, Identity("curator", CURATOR_NAME))[1]
    colluder_signer = attacker.colluder.signer
    cases = {
        "owner-1": (
            {"owner-2": _forged_advertisement(second, "owner-2", colluder_signer)},
            {},
            "'owner-2' is not signed by",
        ),
        "owner-3": (
            {"owner-2": _forged_advertisement(second, "owner-2", colluder_signer)},
            {"owner-2": attacker.colluder.certificate_pem},
            "a certificate of owner:owner-4 was presented for site 'owner-2'",
        ),
        "owner-2": (
            {"owner-0": _forged_advertisement(second, "owner-0", colluder_signer)},
            {"owner-0": curator_cert.read_bytes()},
            "a certificate of curator:curator was presented for site 'owner-0'",
        ),
    }
    for owner, (swapped_ads, swapped_certs, reason) in cases.items():
        request = attacker.share_request(
            job, second, {**ads, **swapped_ads}, {**certificates, **swapped_certs}
        )
        refusal = attacker.refused(attacker.secagg[owner].ShareKeys, request)
        assert refusal.code == grpc.StatusCode.ABORTED, (owner, refusal)
        assert reason in refusal.details, (owner, refusal.details)
        # The round is over at that owner: the genuine advertisements get nothing now.
        honest = attacker.share_request(job, second, ads, certificates)
        refusal = attacker.refused(attacker.secagg[owner].ShareKeys, honest)
        assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    third = attacker.params(length, scale)
    ads, certificates, colluder = attacker.advertise(job, third)
    shared = {COLLUDER: colluder.share_keys(ads)}
    for owner in HONEST:
        shown = {**ads, "owner-2": old_ads["owner-2"]} if owner == "owner-0" else ads
        request = attacker.share_request(job, third, shown, certificates)
        response = attacker.call(attacker.secagg[owner].ShareKeys, request)
        shared[owner] = {c.recipient: bytes(c.ciphertext) for c in response.ciphertexts}
    masked_request = secure_aggregation_pb2.MaskedInputRequest(
        round=msg.round_to_proto(job, third),
        ciphertexts=msg.ciphertexts_to_proto(
            (s, "owner-0", shared[s]["owner-0"]) for s in SITES if s != "owner-0"
        ),
    )
    refusal = attacker.refused(attacker.secagg["owner-0"].MaskedInput, masked_request)
    assert refusal.code == grpc.StatusCode.ABORTED, refusal
    assert "'owner-2' this site was shown is not the one 'owner-2' made" in refusal.details
    restart = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, first))
    refusal = attacker.refused(attacker.secagg["owner-0"].AdvertiseKeys, restart)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    attacker.close_job(job)
    assert _ledgers(cluster) == before


# ------------------------------------------------------------------ a consumer below the floor
FLOOR_TWO_POLICY = OWNER_POLICY.replace("min_colluders = 1", "min_colluders = 2")


def test_a_consumer_asking_below_the_owners_floor_is_refused_and_the_default_is_raised(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Three owners whose policy requires S_C >= 2, through the real curator: a mean at
    S_C = 1 is refused when the job opens (FAILED_PRECONDITION naming the public floor), before
    anything is released or charged; the same mean at the default S_C (ceil(3/3) - 1 = 0) runs
    with S_C = 2, and each owner charges it once."""
    owners = ("owner-a", "owner-b", "owner-c")
    directory = tmp_path_factory.mktemp("floor-two")
    with _cluster(directory, owners, FLOOR_TWO_POLICY) as floor_two:
        before = _ledgers(floor_two)
        low = dataclasses.replace(SPEC, colluders=1)
        with CuratorClient(floor_two.curator_target, floor_two.consumer_security()) as client:
            with pytest.raises(Exception, match="floor of 2") as info:
                client.estimate_cape_mean(low, seed=5, timeout=TIMEOUT)
            assert "FAILED_PRECONDITION" in str(info.value)
            assert _ledgers(floor_two) == before
            answer = client.estimate_cape_mean(SPEC, seed=5, timeout=TIMEOUT)
        assert answer.report.colluders == 2 and answer.report.default_colluders == 0
        after = _ledgers(floor_two)
        for owner in owners:
            new = [e for e in after[owner] if e not in before[owner]]
            assert [(e.epsilon, e.delta) for e in new] == [(SPEC.epsilon, SPEC.delta)]


# ---------------------------------------------------- Sybil sites minted with the CA's key
#: The Sybil attack of issue 25 at 8 sites: the victim and seven sites the attacker plays.
SYBILS = tuple(f"sybil-{i}" for i in range(7))
#: The default S_C of 8 sites, ceil(8 / 3) - 1, above the owners' floor of 1.
SYBIL_COLLUDERS = 2


def _mint(cluster: LocalCluster, name: str, out_dir: Path) -> SiteIdentity:
    """What a party holding the deployment CA's key can do: issue an owner certificate under
    any name, for a key of its own (into its own folder: the genuine owner's files stay)."""
    issue(cluster.pki_dir, "owner", name, out_dir=out_dir)
    ca, cert, key = identity_files(out_dir, Identity("owner", name))
    return SiteIdentity.from_pem(name, key.read_bytes(), cert.read_bytes(), ca.read_bytes())


def _minted_attestation(
    identity: SiteIdentity, job_id: str, sites: Sequence[str], colluders: int
) -> tuple[SizeAttestation, bytes]:
    statement = plan_statement(job_id, SPEC, sites, colluders, 0, identity.name, ROWS)
    attestation = SizeAttestation(identity.name, ROWS, identity.signer.sign(statement))
    return attestation, identity.certificate_pem


def test_sybil_sites_minted_with_the_ca_key_are_refused_before_the_victim_releases_anything(
    cluster: LocalCluster, attacker: Attacker, tmp_path: Path
) -> None:
    """The attacker holds the curator's certificate and the CA's key. (1) It mints seven owner
    certificates under new names and asks the victim to plan a job with them: the victim refuses
    before it signs anything (FAILED_PRECONDITION naming the sites off its roster). (2) It mints
    certificates under the genuine owners' names, for its own keys, and relays counts signed
    with them: the victim aborts the job (ABORTED: not the pinned keys). Either way no noise
    round starts, nothing is released and no ledger is charged. The control, with the roster
    bypassed in the kernels, is the test after this one."""
    before = _ledgers(cluster)
    # (1) New names.
    job = _job("sybil-names")
    attacker.open(job)
    sites = tuple(sorted((VICTIM, *SYBILS)))
    minted = {name: _mint(cluster, name, tmp_path / name) for name in SYBILS}
    request = cape_pb2.AttestCapePlanRequest(
        job_id=job, sites=list(sites), colluders=SYBIL_COLLUDERS
    )
    refusal = attacker.refused(attacker.cape[VICTIM].AttestCapePlan, request)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal
    assert f"does not accept {list(SYBILS)} as peers" in refusal.details
    attested = {s: _minted_attestation(minted[s], job, sites, SYBIL_COLLUDERS) for s in SYBILS}
    attested[VICTIM] = attacker.attest(job, VICTIM, SITES, 1)  # its own, for another plan
    plan = attacker.plan_request(job, sites, SYBIL_COLLUDERS, attested)
    refusal = attacker.refused(attacker.cape[VICTIM].PlanCapeJob, plan)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal
    assert "does not accept" in refusal.details
    params = RoundParams.create(
        sites, min_threshold(len(sites), SYBIL_COLLUDERS), 3, FixedPoint(1.0, 30, len(sites)),
        colluders=SYBIL_COLLUDERS,
    )  # fmt: skip
    advertise = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, params))
    refusal = attacker.refused(attacker.secagg[VICTIM].AdvertiseKeys, advertise)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION, refusal
    attacker.close_job(job)

    # (2) The genuine owners' names, the attacker's keys.
    job = _job("sybil-keys")
    attacker.open(job)
    others = [s for s in SITES if s != VICTIM]
    forged = {name: _mint(cluster, name, tmp_path / f"forged-{name}") for name in others}
    attested = {s: _minted_attestation(forged[s], job, SITES, 1) for s in others}
    attested[VICTIM] = attacker.attest(job, VICTIM, SITES, 1)
    refusal = attacker.refused(
        attacker.cape[VICTIM].PlanCapeJob, attacker.plan_request(job, SITES, 1, attested)
    )
    assert refusal.code == grpc.StatusCode.ABORTED, refusal
    assert "this owner pins for it" in refusal.details
    params = attacker.params(3, 1.0)
    advertise = secure_aggregation_pb2.AdvertiseKeysRequest(round=msg.round_to_proto(job, params))
    refusal = attacker.refused(attacker.secagg[VICTIM].AdvertiseKeys, advertise)
    assert refusal.code == grpc.StatusCode.ABORTED and "aborted at this owner" in refusal.details
    release = cape_pb2.ReleaseCapeRequest(job_id=job, round_id=params.round_id)
    release.noise_total.CopyFrom(msg.vector_to_proto(np.zeros(3)))
    refusal = attacker.refused(attacker.cape[VICTIM].ReleaseCape, release)
    assert refusal.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED)
    attacker.close_job(job)
    assert _ledgers(cluster) == before


def _effective_epsilon(noise_std: float, sensitivity: float, delta: float) -> float:
    """The least epsilon at which a Gaussian mechanism with this noise and L2 sensitivity is
    (epsilon, delta)-DP (its exact profile, :func:`dpmarket.common.cape.privacy.exact_delta`)."""
    ratio = sensitivity / noise_std
    return float(brentq(lambda e: exact_delta(e, ratio * ratio / 2, ratio) - delta, 0.0, 1000.0))


def test_control_with_the_roster_bypassed_the_sybils_remove_the_victims_noise_share() -> None:
    """The control of the test above, from the kernels (no owner accepts an unpinned site, so
    there is no switch to turn off): a victim plans the 8-site job with seven sites the attacker
    plays, as an owner taking any certified site would. The round is real secure aggregation
    (:func:`dpmarket.common.secagg.run_in_process`); the Sybils' inputs are zeros. The round's sum
    is then the victim's own draw, so the attacker removes the victim's zero-sum correction and its
    draw from the release, and only the small local noise g_s remains: the promised (1, 1e-6)
    becomes (2.08, 1e-6), as the issue measured."""
    sites = tuple(sorted((VICTIM, *SYBILS)))
    victim = sites.index(VICTIM)
    plan = plan_for(SPEC, [ROWS] * len(sites), SYBIL_COLLUDERS)
    assert isinstance(plan, CapeMeanPlan)
    assert (plan.epsilon, plan.delta) == (SPEC.epsilon, SPEC.delta)
    rng = np.random.default_rng(25)
    noise = SeededNoise(rng)
    x = SPEC.clamped(rng.uniform(0.0, 200.0, (ROWS, len(COLUMNS))))[0]
    e_hat = site_noise_share(plan, victim, noise)
    inputs = {s: np.zeros(plan.size) for s in sites}
    inputs[VICTIM] = secure_aggregation_input(plan, victim, e_hat)
    keys = {s: ec.generate_private_key(ec.SECP256R1()) for s in sites}
    clip = 12.0 * float(plan.entry_scales(victim).max())
    params = RoundParams.create(
        sites, min_threshold(len(sites), SYBIL_COLLUDERS), plan.size,
        FixedPoint(clip, 40, len(sites)), colluders=SYBIL_COLLUDERS,
    )  # fmt: skip
    total = run_in_process(
        params,
        inputs,
        signers={s: EcdsaSigner(k) for s, k in keys.items()},
        verifier=EcdsaVerifier({s: k.public_key() for s, k in keys.items()}),
        rng=rng,
    )
    # The victim's noise share, recovered from the sum (to the quantization step).
    recovered = total - sum(inputs[s] for s in SYBILS)
    np.testing.assert_allclose(recovered, e_hat, atol=len(sites) * 2 * clip / 2**40)
    truth = site_mean(plan, victim, x)
    release = site_release(plan, victim, truth, e_hat, total, noise)
    # e_s = e_hat - total / S: the attacker adds the correction back and removes the draw.
    estimate = release + total / len(sites) - recovered
    sensitivity = mean_sensitivity(plan.bounds, ROWS)
    local_std = float(plan.entry_scales(victim).max()) / np.sqrt(len(sites))
    assert np.max(np.abs(estimate - truth)) < 6 * local_std  # only g_s is left
    effective = _effective_epsilon(local_std, sensitivity, SPEC.delta)
    assert effective == pytest.approx(2.08, abs=0.01)
    assert effective > 2 * SPEC.epsilon
