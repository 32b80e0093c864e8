"""An owner's CAPE site decides the public inputs of its plan itself: a floor on ``S_C`` from its
policy, and every other site's row count checked against that site's signature for exactly this
plan. A refusal releases and charges nothing; a lie about a count aborts the job at the owner.

Each test runs a real :class:`dpmarket.owner.cape.CapeSite` with its durable ledger
(:class:`dpmarket.owner.ledger.OwnerLedger` in a temporary directory) and real ECDSA identities; the
other sites of the plan are played by signing keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.errors import AbortedError, FailedPreconditionError, NotFoundError
from dpmarket.common.secagg.crypto import EcdsaSigner
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.cape_service import CapeSiteServicer
from dpmarket.owner.ledger import LedgerEntry, OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.authz import Authorizer
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.tables import Table
from dpmarket.v1 import cape_pb2

CURATOR = "curator:curator"
SITES = ("other-1", "other-2", "owner", "other-3")
PLAN_SITES = tuple(sorted(SITES))
ROWS = {"other-1": 30, "other-2": 50, "other-3": 70, "owner": 40}
SPEC = CapeMeanSpec((("x", 0.0, 1.0), ("y", 0.0, 1.0)), 0.5, 1e-7)


@pytest.fixture
def keys() -> dict[str, ec.EllipticCurvePrivateKey]:
    return {s: ec.generate_private_key(ec.SECP256R1()) for s in SITES}


def _site(tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey], floor: int) -> CapeSite:
    rng = np.random.default_rng(0)
    table = Table(("x", "y"), rng.uniform(0, 1, size=(ROWS["owner"], 2)), "owner")
    ledger = OwnerLedger.create(tmp_path / "owner", OwnerPolicy(cape_min_colluders=floor))
    trusted = {s: k.public_key() for s, k in keys.items()}
    identity = SiteIdentity("owner", keys["owner"], b"", None).trusting(trusted)
    return CapeSite(
        "owner", table, ledger=ledger, identity=identity, min_colluders=floor, clock=lambda: 0.0
    )


def _attestations(
    site: CapeSite,
    keys: dict[str, ec.EllipticCurvePrivateKey],
    colluders: int,
    spec: CapeMeanSpec = SPEC,
) -> dict[str, SizeAttestation]:
    out = {}
    for name in PLAN_SITES:
        if name == "owner":
            out[name], _ = site.attest("job", PLAN_SITES, colluders, curator=CURATOR)
            continue
        message = plan_statement("job", spec, PLAN_SITES, colluders, 0, name, ROWS[name])
        out[name] = SizeAttestation(name, ROWS[name], EcdsaSigner(keys[name]).sign(message))
    return out


def _entries(site: CapeSite) -> list[LedgerEntry]:
    assert site.ledger is not None
    return list(site.ledger.entries())


def test_a_job_asking_for_fewer_colluders_than_the_floor_is_refused_when_it_opens(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    site = _site(tmp_path, keys, floor=2)
    with pytest.raises(FailedPreconditionError, match=r"S_C=1 colluders, below .* floor of 2"):
        site.open("job", dataclasses.replace(SPEC, colluders=1), 1, curator=CURATOR, consumer="c")
    with pytest.raises(NotFoundError):
        site.attest("job", PLAN_SITES, 2, curator=CURATOR)
    assert _entries(site) == []
    # At the floor it opens; a plan may not go below it, and nothing is signed for one.
    site.open("job", dataclasses.replace(SPEC, colluders=2), 1, curator=CURATOR, consumer="c")


class _Context:
    """What the owner's servicer needs of a gRPC context here: an abort that raises."""

    async def abort(self, code: grpc.StatusCode, details: str, **_: Any) -> None:
        raise _Aborted(code, details)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


def test_an_explicit_zero_colluders_over_the_wire_is_refused_by_an_owner_whose_floor_is_above(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """A consumer's ``--colluders 0`` (S_C = 0) crosses the wire as 0, not as "the default": the
    owner's real OpenCapeJob handler, decoding the request's bytes, refuses it below its policy's
    floor of 1, charges nothing and keeps no job. The control: the same request with S_C unset
    (the default, which the floor raises) opens. Plaintext peer: mTLS is test_authz's."""
    site = _site(tmp_path, keys, floor=1)
    servicer = CapeSiteServicer(
        site,
        None,  # type: ignore[arg-type]  # OpenCapeJob runs no secure-aggregation round
        Authorizer({"curator": None}, insecure_peer=Identity.parse(CURATOR)),
    )

    def request(spec: CapeMeanSpec) -> cape_pb2.OpenCapeJobRequest:
        sent = cape_pb2.OpenCapeJobRequest(job_id="job", seed=1, consumer="consumer:c")
        msg.job_to_proto(sent, spec)
        return cape_pb2.OpenCapeJobRequest.FromString(sent.SerializeToString())

    zero = request(dataclasses.replace(SPEC, colluders=0))
    with pytest.raises(_Aborted) as refused:
        asyncio.run(servicer.OpenCapeJob(zero, _Context()))  # type: ignore[arg-type]
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert re.search(r"S_C=0 colluders, below .* floor of 1", refused.value.details)
    assert _entries(site) == []
    with pytest.raises(NotFoundError):
        site.attest("job", PLAN_SITES, 1, curator=CURATOR)

    default = request(dataclasses.replace(SPEC, colluders=None))
    opened: cape_pb2.OpenCapeJobResponse = asyncio.run(
        servicer.OpenCapeJob(default, _Context())  # type: ignore[arg-type]
    )
    assert (opened.num_rows, opened.min_colluders) == (ROWS["owner"], 1)


@pytest.mark.parametrize(("floor", "colluders"), [(1, 0), (2, 1)])
def test_nothing_is_signed_for_a_plan_below_the_floor_or_the_default(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey], floor: int, colluders: int
) -> None:
    """Default S_C of 4 sites is 1; the floor raises it. A plan below is refused unsigned."""
    site = _site(tmp_path, keys, floor=floor)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    with pytest.raises(FailedPreconditionError, match=f"below the {max(floor, 1)} this owner"):
        site.attest("job", PLAN_SITES, colluders, curator=CURATOR)
    with pytest.raises(FailedPreconditionError, match=f"below the {max(floor, 1)} this owner"):
        site.plan("job", PLAN_SITES, colluders, {}, {}, curator=CURATOR)
    attestation, _ = site.attest("job", PLAN_SITES, max(floor, 1), curator=CURATOR)
    assert attestation.rows == ROWS["owner"]


@pytest.mark.parametrize("lie", ["another site's count", "this owner's count", "a forged count"])
def test_a_lie_about_a_count_aborts_the_job_with_nothing_released_or_charged(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey], lie: str
) -> None:
    site = _site(tmp_path, keys, floor=1)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    attestations = _attestations(site, keys, 1)
    if lie == "another site's count":  # other-1 is told to be 10 times larger
        attestations["other-1"] = dataclasses.replace(attestations["other-1"], rows=300)
    elif lie == "this owner's count":
        attestations["owner"] = dataclasses.replace(attestations["owner"], rows=400)
    else:  # the curator signs other-2's count with a colluding site's key
        message = plan_statement("job", SPEC, PLAN_SITES, 1, 0, "other-2", 5)
        attestations["other-2"] = SizeAttestation(
            "other-2", 5, EcdsaSigner(keys["other-3"]).sign(message)
        )
    with pytest.raises(AbortedError):
        site.plan("job", PLAN_SITES, 1, attestations, {}, curator=CURATOR)
    # The job is over at this owner: a new attestation, a round or a noise draw is refused.
    with pytest.raises(AbortedError, match="aborted at this owner"):
        site.attest("job", PLAN_SITES, 1, curator=CURATOR)
    params = RoundParams.create(
        PLAN_SITES, min_threshold(4, 1), 2, FixedPoint(1.0, 16, 4), colluders=1
    )
    with pytest.raises(AbortedError, match="aborted at this owner"):
        site.check_round("job", params)
    with pytest.raises(AbortedError, match="aborted at this owner"):
        site.noise_input("job", params)
    assert _entries(site) == []


def test_an_honest_plan_is_the_signed_counts_plan_and_rounds_must_match_it(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    site = _site(tmp_path, keys, floor=1)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    plan = site.plan("job", PLAN_SITES, 1, _attestations(site, keys, 1), {}, curator=CURATOR)
    expected = dataclasses.replace(SPEC, colluders=1).plan([ROWS[s] for s in PLAN_SITES])
    assert plan.sizes == expected.sizes == tuple(ROWS[s] for s in PLAN_SITES)
    assert plan.colluders == 1 and plan.sigma_z == expected.sigma_z
    np.testing.assert_array_equal(plan.weights, expected.weights)
    fp = FixedPoint(1.0, 16, 4)
    good = RoundParams.create(PLAN_SITES, min_threshold(4, 1), plan.size, fp, colluders=1)
    site.check_round("job", good)
    below = RoundParams.create(PLAN_SITES, min_threshold(4, 0), plan.size, fp, colluders=0)
    with pytest.raises(FailedPreconditionError, match="S_C=0 colluders, the job's plan against 1"):
        site.check_round("job", below)
    fewer = RoundParams.create(PLAN_SITES[:3], 3, plan.size, FixedPoint(1.0, 16, 3), colluders=1)
    with pytest.raises(FailedPreconditionError, match="sites or vector length"):
        site.check_round("job", fewer)


# ------------------------------------------------------- the job's steps: once, and in order
def _planned(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey], colluders: int = 1
) -> tuple[CapeSite, Any]:
    site = _site(tmp_path, keys, floor=1)
    site.open("job", SPEC, 1, curator=CURATOR, consumer="c")
    attestations = _attestations(site, keys, colluders)
    return site, site.plan("job", PLAN_SITES, colluders, attestations, {}, curator=CURATOR)


def _round(plan: Any, colluders: int = 1) -> RoundParams:
    threshold = min_threshold(len(PLAN_SITES), colluders)
    fixed_point = FixedPoint(1.0, 16, len(PLAN_SITES))
    return RoundParams.create(PLAN_SITES, threshold, plan.size, fixed_point, colluders=colluders)


def test_a_repeated_release_is_refused_and_charged_once(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """The release is made once per job: a repeat (the curator asking again, for fresh noise on
    the same statistic) gets FAILED_PRECONDITION and the ledger keeps its one charge."""
    site, plan = _planned(tmp_path, keys)
    params = _round(plan)
    site.check_round("job", params)
    site.noise_input("job", params)
    site.round_finished("job", params.round_id, PLAN_SITES)
    total = np.zeros(plan.size)
    site.release("job", params.round_id, total, curator=CURATOR)
    assert [(e.epsilon, e.delta) for e in _entries(site)] == [(SPEC.epsilon, SPEC.delta)]
    with pytest.raises(FailedPreconditionError, match="released already"):
        site.release("job", params.round_id, total, curator=CURATOR)
    # Nor a new round, nor a new plan: the statistic is out.
    with pytest.raises(FailedPreconditionError, match="released already"):
        site.noise_input("job", _round(plan))
    with pytest.raises(FailedPreconditionError, match="released already"):
        site.attest("job", PLAN_SITES, 1, curator=CURATOR)
    assert len(_entries(site)) == 1


def test_a_release_over_a_round_whose_survivors_are_not_the_planned_sites_is_refused(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """The round summed three of the four planned sites' draws: its sum is not zero-sum over the
    sites released over, so the release is refused with nothing charged; the full round works."""
    site, plan = _planned(tmp_path, keys)
    params = _round(plan)
    site.noise_input("job", params)
    site.round_finished("job", params.round_id, PLAN_SITES[1:])
    total = np.zeros(plan.size)
    with pytest.raises(FailedPreconditionError, match="survivors are not the planned sites"):
        site.release("job", params.round_id, total, curator=CURATOR)
    assert _entries(site) == []
    full = _round(plan)
    site.noise_input("job", full)
    site.round_finished("job", full.round_id, PLAN_SITES)
    site.release("job", full.round_id, total, curator=CURATOR)
    assert len(_entries(site)) == 1


def test_a_round_draws_once_and_only_under_the_plan_it_defends(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """(1) A second masked input of one round would draw fresh noise and keep it in place of the
    draw that was summed: refused, the first draw kept. (2) A round admitted under a plan at
    S_C = 1, whose masked input the curator asks for after re-planning at S_C = 2: its threshold
    protects against one colluder, the draw would be calibrated for two, so the draw is refused
    (before this fix only the admission checked S_C)."""
    site, plan = _planned(tmp_path, keys)
    params = _round(plan)
    site.noise_input("job", params)
    kept = site._jobs["job"].draws[params.round_id].copy()
    with pytest.raises(FailedPreconditionError, match=r"drew its noise for round .* already"):
        site.noise_input("job", params)
    np.testing.assert_array_equal(site._jobs["job"].draws[params.round_id], kept)

    weak = _round(plan, colluders=1)
    site.check_round("job", weak)  # admitted under the plan at S_C = 1
    attestations = _attestations(site, keys, 2)
    stronger = site.plan("job", PLAN_SITES, 2, attestations, {}, curator=CURATOR)
    assert stronger.colluders == 2
    with pytest.raises(FailedPreconditionError, match="S_C=1 colluders, the job's plan against 2"):
        site.noise_input("job", weak)
    site.noise_input("job", _round(stronger, colluders=2))  # control
    assert _entries(site) == []


def test_a_job_no_longer_held_is_answered_from_the_ledger_to_its_own_curator_only(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """CloseCapeJob of a job the owner no longer holds (closed before, idle, or opened before
    the owner restarted) answers what the ledger recorded for it — the figures the curator's
    settlement waits for, the same at every ask — to the curator that charged it; another
    curator gets NOT_FOUND, and an id nothing was charged under is answered zero."""
    site, plan = _planned(tmp_path, keys)
    params = _round(plan)
    site.check_round("job", params)
    site.noise_input("job", params)
    site.round_finished("job", params.round_id, PLAN_SITES)
    site.release("job", params.round_id, np.zeros(plan.size), curator=CURATOR)
    closed = site.close("job", curator=CURATOR)
    assert (closed.epsilon, closed.delta) == (SPEC.epsilon, SPEC.delta)
    assert site.close("job", curator=CURATOR) == closed  # asked again: the ledger's record
    with pytest.raises(NotFoundError, match="unknown CAPE job"):
        site.close("job", curator="curator:other")
    never = site.close("never-charged", curator=CURATOR)
    assert (never.epsilon, never.delta, never.points) == (0.0, 0.0, 0)
    assert len(_entries(site)) == 1  # answering charges nothing


def test_a_job_whose_terms_carry_a_reward_is_refused_before_anything_is_read(
    tmp_path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]
) -> None:
    """A reward is split by the points a summary holds, which a job has none of, and only a
    session's owner consents to what its statement discloses: a stranger's curator had an owner
    that does not consent accept CAPE terms with a reward, recorded for the job's statement.
    Refused (INVALID_ARGUMENT), nothing charged or opened; the control: the same terms without
    the reward open the job."""
    from dpmarket.common.errors import InvalidArgumentError
    from dpmarket.common.market.statement import SettlementTerms
    from dpmarket.common.market.terms import MarketTerms

    site = _site(tmp_path, keys, 0)
    rewarded = SettlementTerms(10, 10, payout_epsilon=1.0, reward_rule="value", reward=100)
    plain = SettlementTerms(10, 10)
    with pytest.raises(InvalidArgumentError, match="carry no reward"):
        site.open("job", SPEC, 0, curator=CURATOR, consumer="consumer:alice",
                  market=MarketTerms(0, 0, 0, rewarded))  # fmt: skip
    assert _entries(site) == [] and not site._jobs
    rows = site.open("job", SPEC, 0, curator=CURATOR, consumer="consumer:alice",
                     market=MarketTerms(0, 0, 0, plain))  # fmt: skip
    assert rows == ROWS["owner"]
