"""The curator's driver on SecAgg+ rounds against 40 in-process sites with real certificates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import AbortedError, FailedPreconditionError, UnavailableError
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.graph import min_neighbours
from dpmarket.common.secagg.protocol import RoundParams, RoundStage
from dpmarket.curator.cape import noise_round_params
from dpmarket.curator.secagg import SitesLostError, aggregate
from dpmarket.deploy.pki import init_ca, issue_all, owner_pins
from dpmarket.owner.local import LocalSecureAggregationEndpoint
from dpmarket.owner.secagg import SiteIdentity, SiteRounds
from dpmarket.runtime.cape_messages import round_from_proto, round_to_proto
from dpmarket.runtime.identity import Identity, identity_files

SITES = tuple(f"site-{i:02d}" for i in range(40))
COLLUDERS, ALLOWANCE = 2, 2
D = 24


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
    pki: Path, inputs: dict[str, np.ndarray], *, min_colluders: int = 0
) -> dict[str, LocalSecureAggregationEndpoint]:
    out = {}
    for i, site in enumerate(SITES):
        rounds = SiteRounds(
            _identity(pki, site),
            lambda job, params, s=site: inputs[s],  # type: ignore[misc]
            lambda job, i=i: np.random.default_rng(100 + i),  # type: ignore[misc]
            min_colluders=min_colluders,
        )
        out[site] = LocalSecureAggregationEndpoint(site, rounds)
    return out


def _params(colluders: int = COLLUDERS) -> RoundParams:
    k = min_neighbours(len(SITES), colluders, ALLOWANCE)
    assert k is not None
    return RoundParams.create(
        SITES,
        0,
        D,
        FixedPoint(clip=1.0, resolution_bits=20, sites=len(SITES)),
        colluders=colluders,
        neighbours=k,
        allowance=ALLOWANCE,
    )


class Dies(LocalSecureAggregationEndpoint):
    """A site that vanishes at one stage."""

    def __init__(self, inner: LocalSecureAggregationEndpoint, stage: str) -> None:
        super().__init__(inner.name, inner.rounds)
        self.stage = stage

    def _maybe(self, stage: str) -> None:
        if self.stage == stage:
            raise UnavailableError("connection reset")

    async def reveal_nonce(self, *args, **kwargs):
        self._maybe("reveal")
        return await super().reveal_nonce(*args, **kwargs)

    async def masked_input(self, *args, **kwargs):
        self._maybe("mask")
        return await super().masked_input(*args, **kwargs)

    async def unmask(self, *args, **kwargs):
        self._maybe("unmask")
        return await super().unmask(*args, **kwargs)


def test_a_sparse_round_sums_and_each_site_checks_only_its_neighbours(pki: Path) -> None:
    inputs = _inputs()
    endpoints = _endpoints(pki, inputs)
    params = _params()
    phases: dict[str, float] = {}
    outcome = asyncio.run(aggregate(endpoints, "job-1", params, phase_seconds=phases))
    expected = np.sum([inputs[s] for s in SITES], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= len(SITES) / params.fixed_point.scale
    assert outcome.survivors == SITES and outcome.dropped == {}
    assert list(phases)[:3] == ["advertise_keys", "reveal_nonces", "share_keys"]
    # Every site admitted the certificates of its neighbours, and of nobody else.
    degrees = []
    for site, endpoint in endpoints.items():
        entry = endpoint.rounds._round("job-1", params.round_id)
        graph = entry.site.graph  # type: ignore[union-attr]
        assert graph is not None
        assert set(entry.verifier._keys) == graph.neighbours(site)
        degrees.append(len(graph.neighbours(site)))
    assert max(degrees) < len(SITES) - 1  # sparse indeed


def test_a_cape_noise_round_of_40_runs_on_its_ring_carried_in_the_round_message(
    pki: Path,
) -> None:
    """CAPE's own plan for 40 owners against its default S_C = 13: a sparse graph with a ring
    (k = 9, ring 16), which the round's protobuf message carries to every owner intact; every
    owner builds the same graph from it, its ring neighbours included, and the sum comes out."""
    params = noise_round_params(
        SITES, 13, D, FixedPoint(clip=1.0, resolution_bits=20, sites=len(SITES))
    )
    assert params.sparse and (params.neighbours, params.ring) == (9, 16)
    job, decoded = round_from_proto(round_to_proto("job-ring", params))
    assert job == "job-ring" and decoded == params and decoded.digest == params.digest
    inputs = _inputs()
    endpoints = _endpoints(pki, inputs)
    outcome = asyncio.run(aggregate(endpoints, "job-ring", params))
    expected = np.sum([inputs[s] for s in SITES], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= len(SITES) / params.fixed_point.scale
    for site, endpoint in endpoints.items():
        graph = endpoint.rounds._round("job-ring", params.round_id).site.graph  # type: ignore[union-attr]
        assert graph is not None and len(graph.neighbours(site)) >= 16


def test_sites_lost_within_the_allowance_leave_or_stay_in_the_sum(pki: Path) -> None:
    """One site lost before its masked input (left out), one lost at unmasking (in the sum)."""
    inputs = _inputs()
    endpoints = _endpoints(pki, inputs)
    endpoints["site-03"] = Dies(endpoints["site-03"], "mask")
    endpoints["site-11"] = Dies(endpoints["site-11"], "unmask")
    params = _params()
    outcome = asyncio.run(aggregate(endpoints, "job-2", params))
    included = [s for s in SITES if s != "site-03"]
    expected = np.sum([inputs[s] for s in included], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= len(SITES) / params.fixed_point.scale
    assert set(outcome.dropped) == {"site-03", "site-11"}
    assert "site-11" in outcome.survivors and "site-03" not in outcome.survivors


def test_a_site_lost_before_revealing_its_nonce_is_named_and_nothing_is_released(
    pki: Path,
) -> None:
    endpoints = _endpoints(pki, _inputs())
    endpoints["site-07"] = Dies(endpoints["site-07"], "reveal")
    with pytest.raises(
        SitesLostError, match=r"before revealing their graph nonce: \['site-07'\]"
    ) as info:
        asyncio.run(aggregate(endpoints, "job-3", _params()))
    assert info.value.lost == ("site-07",)
    assert isinstance(info.value, AbortedError)
    # No site shared anything: every other site's round stopped after revealing.
    for site, endpoint in endpoints.items():
        if site != "site-07":
            (entry,) = [e for k, e in endpoint.rounds._rounds.items() if k[0] == "job-3"]
            assert entry.site.stage is RoundStage.REVEALED


def test_a_sparse_round_below_an_owners_floor_is_refused_before_anything_is_sent(
    pki: Path,
) -> None:
    endpoints = _endpoints(pki, _inputs(), min_colluders=COLLUDERS + 1)
    with pytest.raises(AbortedError):
        asyncio.run(aggregate(endpoints, "job-4", _params()))
    with pytest.raises(FailedPreconditionError, match="below this owner's floor of 3 colluders"):
        endpoints["site-00"].rounds.advertise("job-5", _params())
