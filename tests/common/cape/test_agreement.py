"""The public inputs of a CAPE plan are agreed among the sites: what a site signs binds every input
of the plan, a relayed count is accepted only with its site's signature for exactly this plan,
and ``S_C`` is never below what the site requires."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.cape.agreement import (
    SizeAttestation,
    check_attestations,
    check_colluders,
    plan_for,
    plan_statement,
    required_colluders,
    spec_digest,
)
from dpmarket.common.cape.dpgd import CapeTrainingPlan
from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import AbortedError, FailedPreconditionError
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier

SITES = ("a", "b", "c", "d", "e")
SIZES = {"a": 100, "b": 40, "c": 60, "d": 80, "e": 20}
MEAN = CapeMeanSpec((("x", 0.0, 1.0), ("y", -1.0, 1.0)), 1.0, 1e-6)


@pytest.fixture(scope="module")
def keys() -> dict[str, ec.EllipticCurvePrivateKey]:
    return {s: ec.generate_private_key(ec.SECP256R1()) for s in SITES}


def _verifier(keys: dict[str, ec.EllipticCurvePrivateKey]) -> EcdsaVerifier:
    return EcdsaVerifier({s: k.public_key() for s, k in keys.items()})


def _attest(
    keys: dict[str, ec.EllipticCurvePrivateKey],
    *,
    job: str = "job",
    spec: CapeMeanSpec = MEAN,
    sites: tuple[str, ...] = SITES,
    colluders: int = 1,
    first_iteration: int = 0,
) -> dict[str, SizeAttestation]:
    out = {}
    for site in sites:
        message = plan_statement(job, spec, sites, colluders, first_iteration, site, SIZES[site])
        out[site] = SizeAttestation(site, SIZES[site], EcdsaSigner(keys[site]).sign(message))
    return out


def test_honest_attestations_give_every_sites_count(keys) -> None:
    sizes = check_attestations("job", MEAN, SITES, 1, 0, _attest(keys), _verifier(keys))
    assert sizes == [SIZES[s] for s in SITES]


def test_the_statement_binds_every_input_of_the_plan() -> None:
    base = ("job", MEAN, SITES, 1, 0, "a", 100)
    variants = [
        ("job2", MEAN, SITES, 1, 0, "a", 100),
        ("job", dataclasses.replace(MEAN, epsilon=2.0), SITES, 1, 0, "a", 100),
        ("job", dataclasses.replace(MEAN, features=(("x", 0.0, 2.0),)), SITES, 1, 0, "a", 100),
        ("job", MEAN, SITES[:4], 1, 0, "a", 100),
        ("job", MEAN, SITES, 2, 0, "a", 100),
        ("job", MEAN, SITES, 1, 1, "a", 100),
        ("job", MEAN, SITES, 1, 0, "b", 100),
        ("job", MEAN, SITES, 1, 0, "a", 101),
    ]
    statements = {plan_statement(*base), *(plan_statement(*v) for v in variants)}
    assert len(statements) == 1 + len(variants)
    assert spec_digest(MEAN) == spec_digest(CapeMeanSpec(MEAN.features, 1.0, 1e-6))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("lie about a count", r"row count of 'c' \(600\) is not signed by 'c'"),
        ("another job", r"row count of 'c' \(60\) is not signed by 'c' for this plan"),
        ("other sites", r"row count of 'c' \(60\) is not signed by 'c' for this plan"),
        ("other colluders", r"row count of 'c' \(60\) is not signed by 'c' for this plan"),
        ("signed by a colluder", r"row count of 'c' \(60\) is not signed by 'c'"),
        ("missing", r"missing \['c'\]"),
        ("a stranger", r"not in the plan \['z'\]"),
        ("filed under another site", "filed under 'c' is signed as 'd'"),
        ("not positive", "not a positive integer"),
    ],
)
def test_a_relayed_count_without_its_sites_signature_for_this_plan_aborts(
    keys,
    tamper: str,
    message: str,
) -> None:
    attestations = _attest(keys)
    c = attestations["c"]
    if tamper == "lie about a count":
        attestations["c"] = dataclasses.replace(c, rows=600)
    elif tamper == "another job":
        attestations["c"] = _attest(keys, job="other")["c"]
    elif tamper == "other sites":
        attestations["c"] = _attest(keys, sites=("a", "b", "c"))["c"]
    elif tamper == "other colluders":
        attestations["c"] = _attest(keys, colluders=0)["c"]
    elif tamper == "signed by a colluder":
        statement = plan_statement("job", MEAN, SITES, 1, 0, "c", 60)
        attestations["c"] = SizeAttestation("c", 60, EcdsaSigner(keys["e"]).sign(statement))
    elif tamper == "missing":
        del attestations["c"]
    elif tamper == "a stranger":
        attestations["z"] = c
    elif tamper == "filed under another site":
        attestations["c"] = attestations["d"]
    elif tamper == "not positive":
        attestations["c"] = dataclasses.replace(c, rows=0)
    with pytest.raises(AbortedError, match=message):
        check_attestations("job", MEAN, SITES, 1, 0, attestations, _verifier(keys))


def test_required_colluders_is_the_floor_or_the_spec_or_the_default() -> None:
    assert required_colluders(MEAN, 5, floor=0) == 1  # ceil(5 / 3) - 1
    assert required_colluders(MEAN, 5, floor=2) == 2
    assert required_colluders(MEAN, 20, floor=1) == 6
    chosen = dataclasses.replace(MEAN, colluders=3)
    assert required_colluders(chosen, 5, floor=1) == 3
    assert required_colluders(chosen, 5, floor=4) == 4


@pytest.mark.parametrize(
    ("spec_colluders", "colluders", "floor", "fixed", "message"),
    [
        (None, 0, 1, None, "S_C=0 colluders of 5 sites, below the 1 this owner requires"),
        (None, 1, 2, None, r"below the 2 this owner requires \(its floor is 2"),
        (None, 5, 0, None, "need at least 6 sites, the plan has 5"),
        (2, 3, 0, None, "the job asks for S_C=2 colluders, the plan has S_C=3"),
        (None, 2, 0, 1, "the training released with S_C=1 colluders"),
    ],
)
def test_a_plan_below_what_the_site_requires_is_refused(
    spec_colluders: int | None, colluders: int, floor: int, fixed: int | None, message: str
) -> None:
    spec = dataclasses.replace(MEAN, colluders=spec_colluders)
    with pytest.raises(FailedPreconditionError, match=message):
        check_colluders(spec, 5, colluders, floor, fixed=fixed)


def test_an_acceptable_plan_passes_and_plan_for_uses_its_colluders() -> None:
    check_colluders(MEAN, 5, 2, 1)  # the default (1) raised to another site's floor (2)
    plan = plan_for(MEAN, [SIZES[s] for s in SITES], 2)
    assert plan.colluders == 2
    assert plan_for(MEAN, [SIZES[s] for s in SITES], 1).sigma_z != plan.sigma_z
    job = CapeJobSpec("linear", (("x", 0.0, 1.0),), ("y", -1.0, 1.0), 1.0, 1e-6)
    assert plan_for(job, [50, 50, 50], 2).colluders == 2
    training = CapeTrainingSpec((("x", 0.0, 1.0),), "y", 1.0, 1e-6, 4, 0.5, 2, 1.0)
    later = plan_for(training, [50, 50, 50], 1, first_iteration=2)
    assert isinstance(later, CapeTrainingPlan)
    assert later.colluders == 1 and later.first_iteration == 2
    with pytest.raises(ValueError, match="first_iteration is for gradient descent only"):
        plan_for(MEAN, [50, 50], 1, first_iteration=1)
