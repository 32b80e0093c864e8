"""The curator's secure-aggregation driver against in-process sites with real certificates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import (
    AbortedError,
    FailedPreconditionError,
    NotFoundError,
    UnavailableError,
)
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, min_threshold
from dpmarket.curator.secagg import aggregate
from dpmarket.deploy.pki import init_ca, issue_all, owner_pins
from dpmarket.owner.local import LocalSecureAggregationEndpoint
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.identity import Identity, identity_files

SITES = ("site-a", "site-b", "site-c", "site-d", "site-e")
D = 40


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    init_ca(directory)
    issue_all(directory, [Identity("owner", s) for s in SITES])
    return directory


def _identity(pki: Path, site: str) -> SiteIdentity:
    ca, cert, key = identity_files(pki, Identity("owner", site))
    return SiteIdentity.from_pem(
        site, key.read_bytes(), cert.read_bytes(), ca.read_bytes(), peers=owner_pins(pki)
    )


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s: rng.uniform(-1, 1, size=D) for s in SITES}


def _endpoints(
    pki: Path, inputs: dict[str, np.ndarray]
) -> dict[str, LocalSecureAggregationEndpoint]:
    out = {}
    for i, site in enumerate(SITES):
        rounds = SiteRounds(
            _identity(pki, site),
            lambda job, params, s=site: inputs[s],  # type: ignore[misc]
            lambda job, i=i: np.random.default_rng(100 + i),  # type: ignore[misc]
        )
        out[site] = LocalSecureAggregationEndpoint(site, rounds)
    return out


def _params(colluders: int = 0) -> RoundParams:
    return RoundParams.create(
        SITES,
        min_threshold(len(SITES), colluders),
        D,
        FixedPoint(clip=1.0, resolution_bits=20, sites=5),
        colluders=colluders,
    )


def test_the_curator_learns_the_sum_of_the_sites_inputs(pki: Path) -> None:
    inputs = _inputs()
    params = _params()
    outcome = asyncio.run(aggregate(_endpoints(pki, inputs), "job-1", params))
    expected = np.sum([inputs[s] for s in SITES], axis=0)
    scale = params.fixed_point.scale
    # Stochastic rounding moves each value by less than one step: at most 5 steps in the sum.
    assert np.max(np.abs(outcome.total - expected)) <= 5 / scale
    assert outcome.survivors == SITES and outcome.dropped == {}


def test_the_round_reports_its_phases(pki: Path) -> None:
    phases: dict[str, float] = {}
    asyncio.run(aggregate(_endpoints(pki, _inputs()), "job-1", _params(), phase_seconds=phases))
    assert list(phases) == [
        "advertise_keys",
        "share_keys",
        "masked_input",
        "consistency_check",
        "unmask",
        "finish",
    ]
    assert all(seconds >= 0 for seconds in phases.values())


def test_an_aborted_round_reports_no_phases(pki: Path) -> None:
    endpoints = _endpoints(pki, _inputs())
    for site in ("site-a", "site-b", "site-c"):
        endpoints[site] = Dies(endpoints[site], "mask")
    phases: dict[str, float] = {}
    with pytest.raises(AbortedError):
        asyncio.run(aggregate(endpoints, "job-3", _params(), phase_seconds=phases))
    assert phases == {}


class Dies(LocalSecureAggregationEndpoint):
    """A site that vanishes at one stage."""

    def __init__(self, inner: LocalSecureAggregationEndpoint, stage: str) -> None:
        super().__init__(inner.name, inner.rounds)
        self.stage = stage

    async def share_keys(self, *args, **kwargs):
        if self.stage == "share":
            raise UnavailableError("connection reset")
        return await super().share_keys(*args, **kwargs)

    async def masked_input(self, *args, **kwargs):
        if self.stage == "mask":
            raise UnavailableError("connection reset")
        return await super().masked_input(*args, **kwargs)

    async def consistency_check(self, *args, **kwargs):
        if self.stage == "check":
            raise UnavailableError("connection reset")
        return await super().consistency_check(*args, **kwargs)

    async def unmask(self, *args, **kwargs):
        if self.stage == "unmask":
            raise UnavailableError("connection reset")
        return await super().unmask(*args, **kwargs)


@pytest.mark.parametrize("stage", ["share", "mask"])
def test_a_site_lost_mid_round_is_left_out_of_the_sum(pki: Path, stage: str) -> None:
    inputs = _inputs()
    endpoints = _endpoints(pki, inputs)
    endpoints["site-c"] = Dies(endpoints["site-c"], stage)
    params = _params()
    outcome = asyncio.run(aggregate(endpoints, "job-2", params))
    alive = [s for s in SITES if s != "site-c"]
    expected = np.sum([inputs[s] for s in alive], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= 4 / params.fixed_point.scale
    assert outcome.survivors == tuple(alive)
    assert set(outcome.dropped) == {"site-c"}


@pytest.mark.parametrize("stage", ["check", "unmask"])
def test_a_survivor_lost_after_masking_still_counts_in_the_sum(pki: Path, stage: str) -> None:
    """A site that sent its masked input but then neither signs the survivor list (or signs and
    never unmasks) is a survivor: its input is in the sum, its self mask rebuilt from shares."""
    inputs = _inputs()
    endpoints = _endpoints(pki, inputs)
    endpoints["site-c"] = Dies(endpoints["site-c"], stage)
    params = _params()
    outcome = asyncio.run(aggregate(endpoints, "job-5", params))
    expected = np.sum([inputs[s] for s in SITES], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= 5 / params.fixed_point.scale
    assert outcome.survivors == SITES
    assert set(outcome.dropped) == {"site-c"}


def test_too_many_dropouts_abort_and_release_nothing(pki: Path) -> None:
    endpoints = _endpoints(pki, _inputs())
    for site in ("site-a", "site-b", "site-c"):
        endpoints[site] = Dies(endpoints[site], "mask")
    with pytest.raises(AbortedError, match="aborted"):
        asyncio.run(aggregate(endpoints, "job-3", _params()))


class Substitutes(LocalSecureAggregationEndpoint):
    """A curator that swaps site-b's advertised keys for its own before forwarding them."""

    async def share_keys(self, job_id, params, advertisements, certificates, nonces=None):
        forged = dict(advertisements)
        real = forged["site-b"]
        fake = KeyAdvertisement("site-b", real.s_public, real.c_public, real.signature)
        forged["site-b"] = fake
        return await super().share_keys(job_id, params, forged, certificates, nonces)


def test_a_key_substituted_by_the_curator_is_detected(pki: Path) -> None:
    endpoints = _endpoints(pki, _inputs())
    for site in ("site-a", "site-c", "site-d"):
        endpoints[site] = Substitutes(site, endpoints[site].rounds)
    with pytest.raises(AbortedError):
        asyncio.run(aggregate(endpoints, "job-4", _params()))


def test_a_certificate_of_another_site_does_not_pass(pki: Path) -> None:
    """site-e presents site-d's certificate: every other site rejects site-e's keys."""
    identity = _identity(pki, "site-e")
    other = _identity(pki, "site-d")
    verifier = identity.verifier()
    with pytest.raises(ValueError, match="owner:site-d"):
        verifier.admit({"site-e": other.certificate_pem})


def test_a_site_refuses_a_round_below_its_floor_of_colluders_before_sending_anything(
    pki: Path,
) -> None:
    """An owner whose policy requires S_C >= 1 refuses a round that declares none (t = 3 of 5,
    the threshold an aggregator with one colluder can split) before it advertises a key, and
    takes part in one that declares S_C = 1 (t = 4)."""
    inputs = _inputs()
    rounds = SiteRounds(
        _identity(pki, "site-a"),
        lambda job, params: inputs["site-a"],
        lambda job: np.random.default_rng(1),
        min_colluders=1,
    )
    with pytest.raises(FailedPreconditionError, match=r"S_C=0 colluders .* floor of 1"):
        rounds.advertise("job-6", _params(colluders=0))
    with pytest.raises(NotFoundError):  # nothing was started
        rounds.masked("job-6", _params(colluders=0).round_id, {})
    ad, certificate = rounds.advertise("job-6", _params(colluders=1))
    assert ad.site == "site-a" and certificate


def test_a_finished_round_is_remembered_and_cannot_be_replayed(pki: Path) -> None:
    """After a round, the same round id cannot be started again at a site (a curator replaying
    the round would otherwise get fresh answers for it), nor unmasked a second time."""
    endpoints = _endpoints(pki, _inputs())
    params = _params()
    outcome = asyncio.run(aggregate(endpoints, "job-7", params))
    assert outcome.survivors == SITES
    rounds = endpoints["site-a"].rounds
    with pytest.raises(FailedPreconditionError, match="already started"):
        rounds.advertise("job-7", params)
    with pytest.raises(FailedPreconditionError, match="needs stage 'checked'"):
        rounds.unmask("job-7", params.round_id, list(SITES), [], {})


def test_a_round_id_is_used_once_per_static_key_whatever_the_job(pki: Path) -> None:
    """A round's pair keys depend on the pair key and the round id alone, so a round id the
    curator reuses -- under another job, or after the first round was forgotten -- would let
    the earlier round's advertisements, tags and share ciphertexts verify again. The site
    refuses the id before it advertises anything; a fresh id is served (control), and after a
    rotation (new static key, new pair keys) the old id is served again."""
    endpoints = _endpoints(pki, _inputs())
    params = _params()
    asyncio.run(aggregate(endpoints, "job-8", params))
    rounds = endpoints["site-a"].rounds
    rounds.forget("job-8")
    for job in ("job-8", "job-9"):
        with pytest.raises(FailedPreconditionError, match="used once"):
            rounds.advertise(job, params)
    fresh = _params()  # a new random round id
    ad, _ = rounds.advertise("job-9", fresh)  # control: a new id
    assert ad.site == "site-a"
    assert rounds.identity is not None
    rounds.identity.keyring.rotate()
    ad, _ = rounds.advertise("job-10", params)
    assert ad.site == "site-a"


def test_checked_certificates_are_remembered_and_still_bound_to_their_site(pki: Path) -> None:
    """A certificate that passed is not parsed again in the next round (the same key object
    comes back), and the cache never lets it pass for another site."""
    identity = _identity(pki, "site-a")
    pem = _identity(pki, "site-b").certificate_pem
    first = identity.check_certificate("site-b", pem)
    assert identity.check_certificate("site-b", pem) is first
    with pytest.raises(ValueError, match="owner:site-b"):
        identity.check_certificate("site-c", pem)
