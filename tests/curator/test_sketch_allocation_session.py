"""The candidates method's sketch allocation on the real session path (in-process owners)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpmarket.common.sketches import Domain, SketchMechanism, draw_rff
from dpmarket.common.summarization.candidates import shrinkage_strength, validation_embedding
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.rff import random_fourier_features
from dpmarket.common.summarization.sketch_allocation import (
    relevance_matrix,
    relevance_sensitivity,
    responsibilities,
)
from dpmarket.experiments.runner import publish_sketches, run_session, simulate
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet

D = 3
DOMAIN = Domain(np.full(D, -4.0), np.full(D, 4.0))
EPS, DELTA = 0.8, 1e-6


def _world(
    k: int,
    seed: int = 0,
    n: int = 120,
    *,
    spacing: float | None = None,
    spread: float = 0.4,
    m: int = 30,
) -> tuple[list[PointSet], np.ndarray, np.ndarray]:
    """k owners, each a blob around its own centre on a line; the consumer looks like owner 1."""
    rng = np.random.default_rng(seed)
    step = 6.0 / max(k - 1, 1) if spacing is None else spacing
    centres = (np.arange(k) - (k - 1) / 2) * step
    owners = [
        PointSet(np.clip(rng.normal(c, spread, size=(n, D)), -4, 4), None, f"owner-{i}")
        for i, c in enumerate(centres)
    ]
    validation = np.clip(rng.normal(centres[1], spread, size=(m, D)), -4, 4)
    seed_set = rng.uniform(-4, 4, size=(5, D))
    return owners, validation, seed_set


def _mechanism() -> SketchMechanism:
    fmap = draw_rff(D, 100, 0.8, np.random.default_rng(11))
    return SketchMechanism(fmap, DOMAIN, 1.0, "gaussian", DELTA)


def _config(p: int = 10, **kw: object) -> CandidatesConfig:
    return CandidatesConfig(
        summary_size=p,
        rff_dimension=32,
        gamma=0.5,
        epsilon_validation_total=EPS,
        epsilon_owners_total=EPS,
        delta=DELTA,
        **kw,  # type: ignore[arg-type]
    )


def _gaussian_delta(eps: float, mu: float) -> float:
    return float(
        stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


def test_the_decision_noise_has_its_stated_scale_and_the_ledger_its_stated_epsilon() -> None:
    owners, validation, seed_set = _world(6)
    m = validation.shape[0]
    standardized = []
    for seed in range(30):
        sketches = publish_sketches(owners, _mechanism(), seed=100 + seed)
        result = simulate(
            owners, validation, seed_set, _config(), seed=seed, owner_sketches=sketches
        )
        ledger = result.report.ledger.to_json()
        info = ledger["candidates"]
        assert info["allocation"] == "sketch"
        entries = ledger["validation"]["entries"]
        alloc = entries[1]["event"]
        assert alloc["sensitivity"] == pytest.approx(relevance_sensitivity(m))
        sigma = alloc["scale"]
        assert sigma == info["allocation_sigma"]
        # The exact decision, recomputed independently from the same public sketches.
        u = relevance_matrix(
            list(sketches.values()),
            validation,
            score="mmd",
            norm_weight=CandidatesConfig(summary_size=1).relevance_norm_weight,
        )
        exact = responsibilities(u).mean(axis=0)
        noisy = np.array([info["noisy_relevance"][o.name] for o in owners])
        standardized.append((noisy - exact) / sigma)
        if seed == 0:
            # Independent: both Gaussian releases about D_v compose to mu^2 = sum (D_i/s_i)^2,
            # whose exact epsilon at delta must be the target; the ledger's PLD agrees.
            mu = math.hypot(*(e["event"]["sensitivity"] / e["event"]["scale"] for e in entries))
            eps = optimize.brentq(lambda e, mu=mu: _gaussian_delta(e, mu) - DELTA, 1e-3, 10)
            assert eps == pytest.approx(EPS, rel=1e-3)
            pld = ledger["validation"]["parties"]["validation"]["pld"]
            assert pld == pytest.approx(EPS, rel=5e-3)
            # The owners pay nothing in the session: no owners' charge, terms (0, 0); the
            # sketches' own epsilon is reported beside.
            assert not ledger["owners"]["entries"]
            assert ledger["owner_terms"]["epsilon"] == 0.0
            assert ledger["owner_sketches"]["owner-1"]["epsilon"] == 1.0
    z = np.concatenate(standardized)
    # 180 draws; fails with probability 1e-4 when the noise is N(0, sigma^2).
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert stats.kstest(z, "norm", args=(0, 2.0)).pvalue < 1e-4  # and it can tell 2x apart


def test_the_budget_does_not_grow_with_the_number_of_owners() -> None:
    p = 8
    for k in (3, 6, 12):
        owners, validation, seed_set = _world(k, n=60)
        sketches = publish_sketches(owners, _mechanism(), seed=1)
        for allocation in ("sketch", "counts"):
            result = simulate(
                owners,
                validation,
                seed_set,
                _config(p, allocation=allocation),
                seed=0,
                owner_sketches=sketches,
            )
            assert result.report.ledger.to_json()["candidates"]["budget"] == 3 * p
            assert result.report.owner_points_accessed <= 3 * p


def test_the_owner_holding_the_consumers_data_gets_most_of_the_budget() -> None:
    """Owner 1 holds the consumer's kind of data (blobs 1.6 apart, spread 0.25; m = 100): its
    exact mean responsibility is ~1 and every other owner's ~0. The release's noise is
    sigma = sqrt(2)/100 * 5.20 / sqrt(0.8) = 0.082 at epsilon 0.8, so another owner's share
    can exceed owner 1's only if the difference of two draws (std 0.12) exceeds ~1, an
    8-sigma event: probability < 1e-14 per seed and owner (the sketches' noise on a density,
    5.20 / 120 = 0.043 of a kernel value ~0.6, moves few votes). 10 seeds; owner 1 also gets
    at least half of the budget beyond the uniform sample of p points it starts with."""
    owners, validation, seed_set = _world(5, spacing=1.6, spread=0.25, m=100)
    for seed in range(10):
        sketches = publish_sketches(owners, _mechanism(), seed=seed)
        result = simulate(
            owners, validation, seed_set, _config(), seed=seed, owner_sketches=sketches
        )
        info = result.report.ledger.to_json()["candidates"]
        shares, uniform = info["shares"], info["uniform_shares"]
        assert sum(uniform.values()) == 10 and max(uniform.values()) == 2
        assert max(shares, key=shares.get) == "owner-1", shares
        assert shares["owner-1"] - uniform["owner-1"] >= 0.5 * (30 - 10), shares


def test_without_sketches_the_counts_allocation_runs_unchanged(digits: Scenario) -> None:
    # Sketches requested but absent: the counts allocation, bit for bit.
    config = CandidatesConfig(summary_size=10, rff_dimension=64)
    counts = CandidatesConfig(summary_size=10, rff_dimension=64, allocation="counts")
    a = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=3)
    b = simulate(digits.owners, digits.validation, digits.seed_set, counts, seed=3)
    assert np.array_equal(a.points, b.points)
    assert a.report.ledger.to_json()["candidates"]["allocation"] == "counts"
    # The report says why, and what it cost the owners (not silently).
    assert a.report.ledger.to_json()["candidates"]["allocation_note"] == (
        "no published sketch to read (the curator names no allocation spec: curator serve "
        "--allocation-sketch-spec NAME): every owner is charged epsilon 1 for its noisy "
        "relevance count instead"
    )
    assert a.report.ledger.to_json()["owner_terms"]["epsilon"] == 1.0
    # A budget by fraction of K p (candidate_fraction 0.5) reads 0.5 K p points.
    old = CandidatesConfig(summary_size=10, rff_dimension=64, candidate_fraction=0.5)
    c = simulate(digits.owners, digits.validation, digits.seed_set, old, seed=3)
    assert c.report.owner_points_accessed == 25


def test_a_sketch_over_other_attributes_is_refused() -> None:
    owners, validation, seed_set = _world(3)
    fmap = draw_rff(D + 1, 10, 1.0, np.random.default_rng(0))
    mech = SketchMechanism(fmap, Domain(np.full(D + 1, -4.0), np.full(D + 1, 4.0)), 1.0)
    wide = [
        PointSet(np.hstack([o.features, np.zeros((o.n_points, 1))]), None, o.name) for o in owners
    ]
    sketches = publish_sketches(wide, mech, seed=0)
    from dpmarket.common.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="attributes"):
        simulate(owners, validation, seed_set, _config(), seed=0, owner_sketches=sketches)


class _Recording(LocalOwnerEndpoint):
    """An in-process owner that records the h1 parameters and the embedding it receives."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.rff = None
        self.embedding: np.ndarray | None = None

    async def open_session(self, session_id, rff, sampling_seed, *, consumer, terms):
        self.rff = rff
        return await super().open_session(
            session_id, rff, sampling_seed, consumer=consumer, terms=terms
        )

    async def set_validation_embedding(
        self, session_id, embedding, *, shrinkage_sigma=0.0, prior_embedding=None, **kw
    ):
        self.embedding = np.array(embedding, copy=True)
        self.shrinkage_sigma, self.prior = shrinkage_sigma, prior_embedding
        self.score_metric = kw.get("score_metric", False)
        await super().set_validation_embedding(
            session_id,
            embedding,
            shrinkage_sigma=shrinkage_sigma,
            prior_embedding=prior_embedding,
            **kw,
        )


def test_owners_receive_the_release_the_noise_and_the_public_seed_prior() -> None:
    """Every owner receives gtilde as released, the noise its proposal should assume (sigma
    times the square root of the shrinkage strength) and, with the seed prior, the public seed
    set's mean h1; the owner shrinks at home. Nothing of it is charged beyond the two releases."""
    owners, validation, seed_set = _world(4, m=100)
    sketches = publish_sketches(owners, _mechanism(), seed=0)
    for prior_kind in ("seed", "owner", "none"):
        endpoints = [_Recording(Owner(o.name, o, allow_seeded_sessions=True)) for o in owners]
        config = _config(embedding_prior=prior_kind, shrinkage=2.0)
        result = run_session(
            endpoints, validation, seed_set, config, seed=0, owner_sketches=sketches
        )
        sigma = result.report.ledger.to_json()["candidates"]["gaussian_sigma"]
        first = endpoints[0]
        assert first.embedding is not None and first.rff is not None
        for other in endpoints[1:]:
            np.testing.assert_array_equal(other.embedding, first.embedding)
            assert other.shrinkage_sigma == first.shrinkage_sigma
        exact = validation_embedding(
            random_fourier_features(validation, first.rff, dtype=np.float64)
        )
        # The release itself: its noise is of the stated sigma (140 coordinates; the bound
        # fails with probability < 1e-6 for a chi-square with 140 degrees of freedom).
        assert float(np.sum((first.embedding - exact) ** 2)) < 230 * sigma**2
        expected = {"none": 0.0}.get(prior_kind, sigma * math.sqrt(2.0))
        assert first.shrinkage_sigma == pytest.approx(expected)
        if prior_kind == "seed":
            seed_mean = random_fourier_features(seed_set, first.rff, dtype=np.float64).mean(0)
            np.testing.assert_array_equal(first.prior, seed_mean)
        else:
            assert first.prior is None
        assert len(result.report.ledger.to_json()["validation"]["entries"]) == 2


@pytest.mark.parametrize("metric", ["embedding", "scores"])
def test_owners_are_told_where_to_read_the_shrinkage(metric: str) -> None:
    """shrinkage_metric reaches every owner with the release; the noise it assumes is the same
    either way (the rule changes where the amount is read, not what is released or charged)."""
    owners, validation, seed_set = _world(3, m=100)
    sketches = publish_sketches(owners, _mechanism(), seed=0)
    endpoints = [_Recording(Owner(o.name, o, allow_seeded_sessions=True)) for o in owners]
    result = run_session(
        endpoints,
        validation,
        seed_set,
        _config(shrinkage_metric=metric),
        seed=0,
        owner_sketches=sketches,
    )
    sigma = result.report.ledger.to_json()["candidates"]["gaussian_sigma"]
    for endpoint in endpoints:
        assert endpoint.score_metric is (metric == "scores")
        assert endpoint.shrinkage_sigma == pytest.approx(sigma)
    assert len(result.report.ledger.to_json()["validation"]["entries"]) == 2
    # The session report's allocation section says where the owners read it.
    assert result.report.ledger.to_json()["candidates"]["shrinkage_metric"] == metric


@pytest.mark.parametrize("allocation", ["sketch", "counts"])
def test_the_shrinkage_strength_is_computed_from_the_release_and_its_public_noise(
    allocation: str,
) -> None:
    """With ``shrinkage_strength="snr"`` every owner is told the noise ``sigma * sqrt(c)``, c
    recomputed here from what an owner sees only (the release it received, d) and the public
    sigma of the report; with ``"fixed"`` (the old default, reproducible by the option) it is
    ``sigma`` itself. m = 12 at epsilon 0.8: the release is mostly noise, so c < 1 and the two
    differ. (Old code: no such option; every owner was told ``sigma``.)"""
    owners, validation, seed_set = _world(3, m=12)
    sketches = publish_sketches(owners, _mechanism(), seed=0) if allocation == "sketch" else None
    told = {}
    for rule in ("fixed", "snr"):
        endpoints = [_Recording(Owner(o.name, o, allow_seeded_sessions=True)) for o in owners]
        result = run_session(
            endpoints,
            validation,
            seed_set,
            _config(shrinkage_strength=rule, allocation=allocation),
            seed=0,
            owner_sketches=sketches,
        )
        ledger = result.report.ledger.to_json()["candidates"]
        assert ledger["allocation"] == allocation
        sigma = ledger["gaussian_sigma"]
        release = endpoints[0].embedding
        assert release is not None
        c = shrinkage_strength(release, sigma, rule)
        for endpoint in endpoints:
            np.testing.assert_array_equal(endpoint.embedding, release)
            assert endpoint.shrinkage_sigma == pytest.approx(sigma * math.sqrt(c))
        told[rule] = (endpoints[0].shrinkage_sigma, sigma, c)
    assert told["fixed"][0] == pytest.approx(told["fixed"][1])
    assert told["snr"][2] < 1.0


@pytest.mark.parametrize("allocation", ["sketch", "counts"])
def test_the_size_cap_bounds_each_owners_targeted_reads_and_keeps_the_budget(
    allocation: str,
) -> None:
    """``read_cap`` c = 24 with 120 points per owner: each owner's targeted reads (beyond its
    uniform share) are at most ceil(120 / 24) = 5, and the budget 3p = 30 is still read in full.
    Control (``read_cap`` 0, the old behaviour): on the sketch path owner 1, which holds the
    consumer's data, takes at least half of the 20 targeted reads (the bound of the test above,
    same world and seed), i.e. more than the cap."""
    owners, validation, seed_set = _world(5, spacing=1.6, spread=0.25, m=100)
    sketches = publish_sketches(owners, _mechanism(), seed=0)
    targeted = {}
    for cap in (0.0, 24.0):
        result = simulate(
            owners,
            validation,
            seed_set,
            _config(allocation=allocation, read_cap=cap),
            seed=0,
            owner_sketches=sketches,
        )
        info = result.report.ledger.to_json()["candidates"]
        shares, uniform = info["shares"], info["uniform_shares"]
        assert sum(shares.values()) == 30
        targeted[cap] = {k: v - uniform.get(k, 0) for k, v in shares.items()}
    assert max(targeted[24.0].values()) <= 5, targeted
    if allocation == "sketch":
        assert targeted[0.0]["owner-1"] >= 10, targeted


def test_the_mass_cap_moves_reads_from_a_dense_small_owner_to_the_one_holding_the_mass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tv16-40's pattern in small: owner 1 holds 20 points packed at the consumer's centre,
    owner 2 holds 400 spread around it, owner 0 is elsewhere; the density vote goes to owner 1.
    Control (``mass_cap`` 0, the old behaviour): owner 1 is asked for 15 of the 20 targeted reads
    (its whole capacity beyond its uniform share). With ``mass_cap`` 2 its mass share (from the
    sketches and D_v's mean features released in their map) caps it below that and owner 2
    takes the rest; the budget 3p = 30 is read in full either way, never more. The mass
    release is charged to D_v's ledger once, before the masses are computed from it (so before
    any request derived from them leaves the curator), and nothing more to the owners; the
    validation party's total stays the same (the three releases split the budget of two)."""
    from dpmarket.curator.summarization.allocation import Allocator

    original = Allocator.masses
    seen: list[list[str]] = []

    async def spy(self: Allocator, sketches: object, release: object) -> object:
        seen.append([c.label for c in self.state.ledgers["validation"].entries])
        return await original(self, sketches, release)  # type: ignore[arg-type]

    monkeypatch.setattr(Allocator, "masses", spy)
    rng = np.random.default_rng(0)
    owners = [
        PointSet(np.clip(rng.normal(-2.5, 0.4, size=(200, D)), -4, 4), None, "owner-0"),
        PointSet(np.clip(rng.normal(0.5, 0.15, size=(20, D)), -4, 4), None, "owner-1"),
        PointSet(np.clip(rng.normal(0.5, 1.0, size=(400, D)), -4, 4), None, "owner-2"),
    ]
    validation = np.clip(rng.normal(0.5, 0.3, size=(100, D)), -4, 4)
    sketches = publish_sketches(owners, _mechanism(), seed=0)
    targeted, ledgers = {}, {}
    for cap in (0.0, 2.0):
        seen.clear()
        result = simulate(
            owners,
            validation,
            np.zeros((0, D)),
            _config(mass_cap=cap, relevance_score="density"),
            seed=0,
            owner_sketches=sketches,
        )
        ledgers[cap] = result.report.ledger.to_json()
        mass_charges = [label for label in seen[0] if label.startswith("mass cap")]
        assert len(mass_charges) == (1 if cap > 0 else 0), seen
        info = ledgers[cap]["candidates"]
        shares, uniform = info["shares"], info["uniform_shares"]
        assert sum(shares.values()) == 30
        assert result.report.owner_points_accessed <= 30
        targeted[cap] = {k: v - uniform.get(k, 0) for k, v in shares.items()}
    assert targeted[0.0]["owner-1"] == 15, targeted
    assert targeted[2.0]["owner-1"] <= 10, targeted
    assert targeted[2.0]["owner-2"] > targeted[0.0]["owner-2"], targeted
    assert ledgers[2.0]["owners"] == ledgers[0.0]["owners"]
    labels = {cap: [e["label"] for e in ledgers[cap]["validation"]["entries"]] for cap in ledgers}
    assert [x for x in labels[2.0] if not x.startswith("mass cap")] == labels[0.0], labels
    assert sum(x.startswith("mass cap") for x in labels[2.0]) == 1, labels
    pld = {cap: ledgers[cap]["validation"]["parties"]["validation"]["pld"] for cap in ledgers}
    assert pld[2.0] == pytest.approx(pld[0.0], rel=0.02), pld
