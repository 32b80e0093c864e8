"""An actively lying curator's crafted network parameters learn nothing from an owner's answer.

The attack (a stranger's, against CAPE gradient descent): the curator broadcasts ``theta = [W1 =
MAX, b1 = MAX (1 - c), w2 = 1e-310, b2 = 0]`` (one feature, one hidden unit, ``MAX`` the largest
double). ``W1 x + b1`` overflows exactly for the records whose mapped feature exceeds ``c``, so the
owner's gradient was non-finite exactly then, and its release failed with INVALID_ARGUMENT ("f_s
holds NaN or inf values") after charging, and succeeded otherwise: one exact bit per iteration,
the training charged once.

Here two owners hold tables that differ only in whether one record exceeds ``c``; each runs a
real :class:`dpmarket.owner.cape.CapeSite` with its durable ledger behind the real
``ReleaseCapeGradient`` handler (:class:`dpmarket.owner.cape_service.CapeSiteServicer`: the same
status mapping as over the wire), the other sites of the plan played by signing keys. Both answer
the crafted parameters the same way, refused before anything is charged; with the bound on the
parameters switched off, both release (the gradient is total), and each release is finite.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.spec import CapeTrainingSpec
from dpmarket.common.secagg.crypto import EcdsaSigner
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.owner import cape as owner_cape
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.cape_service import CapeSiteServicer
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.runtime import cape_messages as msg
from dpmarket.runtime.authz import Authorizer
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.tables import Table
from dpmarket.v1 import cape_pb2

CURATOR = "curator:curator"
SITES = ("other-1", "other-2", "owner")
ROWS = {"other-1": 30, "other-2": 50, "owner": 8}
#: Income in [0, 100] maps to [-1, 1]; the threshold c = 0.5 is income 75.
SPEC = CapeTrainingSpec((("income", 0.0, 100.0),), "y", 0.5, 1e-7, 12, 0.5, 1, 1.0)
C = 0.5
MAX = float(np.finfo(np.float64).max)
CRAFTED = np.array([MAX, MAX * (1.0 - C), 1e-310, 0.0])
INCOMES = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 74.0])


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str, **_: Any) -> None:
        raise _Aborted(code, details)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


def _site(directory: Path, incomes: np.ndarray, keys: dict[str, Any]) -> CapeSite:
    labels = np.arange(incomes.shape[0]) % 2
    table = Table(("income", "y"), np.column_stack([incomes, labels]), "owner", binary=("y",))
    ledger = OwnerLedger.create(directory, OwnerPolicy())
    trusted = {s: k.public_key() for s, k in keys.items()}
    identity = SiteIdentity("owner", keys["owner"], b"", None).trusting(trusted)
    return CapeSite("owner", table, ledger=ledger, identity=identity, clock=lambda: 0.0)


def _planned(site: CapeSite, keys: dict[str, Any]) -> tuple[Any, RoundParams]:
    """Open, plan (every site's count signed) and run the noise round of iterations 0..T-1."""
    site.open("job", SPEC, 1, curator=CURATOR, consumer="consumer:c")
    attestations = {}
    for name in SITES:
        if name == "owner":
            attestations[name], _ = site.attest("job", SITES, 1, curator=CURATOR)
            continue
        message = plan_statement("job", SPEC, SITES, 1, 0, name, ROWS[name])
        signature = EcdsaSigner(keys[name]).sign(message)
        attestations[name] = SizeAttestation(name, ROWS[name], signature)
    plan = site.plan("job", SITES, 1, attestations, {}, curator=CURATOR)
    fixed_point = FixedPoint(1.0, 16, len(SITES))
    params = RoundParams.create(
        SITES, min_threshold(len(SITES), 1), plan.round_length, fixed_point, colluders=1
    )
    site.noise_input("job", params)
    site.round_finished("job", params.round_id, SITES)
    return plan, params


def _answer(
    site: CapeSite,
    params: RoundParams,
    theta: np.ndarray,
    iteration: int = 0,
    total: np.ndarray | None = None,
) -> str:
    """What the curator reads of the owner's ReleaseCapeGradient: its status and text, or that
    it released (a finite vector of P values)."""
    servicer = CapeSiteServicer(
        site,
        None,  # type: ignore[arg-type]  # no secure-aggregation round runs here
        Authorizer({"curator": None}, insecure_peer=Identity.parse(CURATOR)),
    )
    request = cape_pb2.ReleaseCapeGradientRequest(
        job_id="job",
        round_id=params.round_id,
        iteration=iteration,
        parameters=msg.vector_to_proto(theta),
        noise_total=msg.vector_to_proto(np.zeros(SPEC.n_params) if total is None else total),
    )
    try:
        response: cape_pb2.ReleaseCapeGradientResponse = asyncio.run(
            servicer.ReleaseCapeGradient(request, _Context())  # type: ignore[arg-type]
        )
    except _Aborted as refused:
        return f"{refused.code.name}: {refused.details}"
    release = msg.vector_from_proto(response.release, "release")
    assert release.shape == (SPEC.n_params,) and np.isfinite(release).all()
    return "released"


@pytest.fixture
def owners(tmp_path: Path) -> dict[str, tuple[CapeSite, RoundParams]]:
    """Two owners whose tables differ only in their last income: 74 (mapped 0.48 <= c) or 90
    (mapped 0.8 > c)."""
    keys = {s: ec.generate_private_key(ec.SECP256R1()) for s in SITES}
    out = {}
    for name, last in (("below", 74.0), ("above", 90.0)):
        site = _site(tmp_path / name, np.append(INCOMES[:-1], last), keys)
        _, params = _planned(site, keys)
        out[name] = (site, params)
    return out


def test_the_crafted_parameters_are_refused_the_same_way_whatever_the_records_nothing_charged(
    owners: dict[str, tuple[CapeSite, RoundParams]],
) -> None:
    """Refused on public grounds (the bound an honest training's parameters stay within), with
    the same status and text at both owners, before anything is read or charged; the training's
    own parameters are then released at both, charged once."""
    answers = {name: _answer(site, params, CRAFTED) for name, (site, params) in owners.items()}
    assert answers["below"] == answers["above"]
    assert answers["below"].startswith("INVALID_ARGUMENT: parameters of iteration 0 reach")
    for site, _ in owners.values():
        assert site.ledger is not None and list(site.ledger.entries()) == []
    honest = np.array([0.5, 0.0, -0.3, 0.0])
    for site, params in owners.values():
        assert _answer(site, params, honest) == "released"
        assert site.ledger is not None and len(list(site.ledger.entries())) == 1


def test_with_the_bound_off_both_owners_release_a_finite_gradient_the_overflow_counted_as_zero(
    owners: dict[str, tuple[CapeSite, RoundParams]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound switched off (as if a curator found parameters within it that overflow): the
    gradient is total, so both owners release; without it (the control, main before this fix)
    the owner holding the record above c answered INVALID_ARGUMENT 'f_s holds NaN or inf values'
    after charging, the other released."""
    monkeypatch.setattr(owner_cape, "parameter_bound", lambda **_: float("inf"), raising=False)
    monkeypatch.setattr(owner_cape, "check_not_tiny", lambda *a, **k: None)  # CRAFTED's w2
    answers = {name: _answer(site, params, CRAFTED) for name, (site, params) in owners.items()}
    assert answers == {"below": "released", "above": "released"}


def test_a_noise_total_near_overflow_is_refused_before_anything_is_charged(
    owners: dict[str, tuple[CapeSite, RoundParams]],
) -> None:
    """A total that would push ``e_s`` near the largest double (where adding the gradient
    overflows on some records and not on others) is refused on its own values, charging
    nothing."""
    site, params = owners["above"]
    servicer = CapeSiteServicer(
        site,
        None,  # type: ignore[arg-type]
        Authorizer({"curator": None}, insecure_peer=Identity.parse(CURATOR)),
    )
    request = cape_pb2.ReleaseCapeGradientRequest(
        job_id="job",
        round_id=params.round_id,
        iteration=0,
        parameters=msg.vector_to_proto(np.array([0.5, 0.0, -0.3, 0.0])),
        noise_total=msg.vector_to_proto(np.full(SPEC.n_params, -MAX / 2)),
    )
    with pytest.raises(_Aborted) as refused:
        asyncio.run(servicer.ReleaseCapeGradient(request, _Context()))  # type: ignore[arg-type]
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "within reach of overflow" in refused.value.details
    assert site.ledger is not None and list(site.ledger.entries()) == []


def test_after_the_records_are_read_nothing_fails_whatever_the_parameters_and_total(
    owners: dict[str, tuple[CapeSite, RoundParams]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every check that may fail runs before the records are read: with the parameter bound off,
    parameters drawn from the extremes a curator may send (finite: non-finite ones are refused
    on their own values) and totals up to the headroom's edge, every iteration is released by
    both owners, each release finite (``_answer`` asserts it)."""
    monkeypatch.setattr(owner_cape, "parameter_bound", lambda **_: float("inf"), raising=False)
    monkeypatch.setattr(owner_cape, "check_not_tiny", lambda *a, **k: None)  # +-1e-310 too
    rng = np.random.default_rng(7)
    extremes = np.array([MAX, -MAX, 1e300, -1e300, 1e154, 1e-310, -1e-310, 0.0, 3.0])
    for iteration in range(SPEC.iterations):
        theta = rng.choice(extremes, size=SPEC.n_params)
        total = np.where(rng.random(SPEC.n_params) < 0.5, -1e299, 1e299) * (iteration % 2)
        for site, params in owners.values():
            assert _answer(site, params, theta, iteration, total) == "released", (iteration, theta)


#: The stranger's gradient timing (within the bound): W1 = 1, b1 = -c, w2 = 1e-310, b2 = 0. The
#: products with w2 are subnormal exactly for the records above c, so each iteration's time
#: counted them.
SUBNORMAL = np.array([1.0, -C, 1e-310, 0.0])


def test_subnormal_parameters_are_refused_the_same_way_whatever_the_records_nothing_charged(
    owners: dict[str, tuple[CapeSite, RoundParams]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused at both owners with the same text (``PARAMETER_FLOOR``), before any record is
    read or anything charged; a subnormal noise total alike. The control: with the floor off,
    the owners read their records and release (charged), as on main."""
    answers = {name: _answer(site, params, SUBNORMAL) for name, (site, params) in owners.items()}
    assert answers["below"] == answers["above"]
    assert answers["below"].startswith("INVALID_ARGUMENT: parameters holds 1 non-zero value")
    site, params = owners["below"]
    tiny_total = np.full(SPEC.n_params, 1e-310)
    assert _answer(site, params, np.array([0.5, 0.0, -0.3, 0.0]), total=tiny_total).startswith(
        "INVALID_ARGUMENT: noise_total holds 4 non-zero value"
    )
    for site, _ in owners.values():
        assert site.ledger is not None and list(site.ledger.entries()) == []
    monkeypatch.setattr(owner_cape, "check_not_tiny", lambda *a, **k: None)
    answers = {name: _answer(site, params, SUBNORMAL) for name, (site, params) in owners.items()}
    assert answers == {"below": "released", "above": "released"}


def test_the_clamp_is_logged_alike_whether_or_not_a_value_was_clamped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The open's clamp writes its log line for a table within the bounds as for one beyond
    them (a step that logged only when some value was clamped, before any charge, took longer
    for those tables)."""
    keys = {s: ec.generate_private_key(ec.SECP256R1()) for s in SITES}
    for name, last in (("within", 74.0), ("beyond", 150.0)):
        site = _site(tmp_path / name, np.append(INCOMES[:-1], last), keys)
        caplog.clear()
        with caplog.at_level("INFO", logger="dpmarket.owner.cape"):
            site.open("job", SPEC, 1, curator=CURATOR, consumer="consumer:c")
        assert "values clamped to the request's public bounds" in caplog.text, name
