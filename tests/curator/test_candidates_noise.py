"""The candidates method's noise, measured on the real session path (seeded draws)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.summarization.candidates import validation_embedding
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.experiments.runner import run_session
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner

EPS = 0.7
DELTA = 1e-6


class Tap(LocalOwnerEndpoint):
    """Records the embedding an owner receives and its exact relevance count."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.embedding: np.ndarray | None = None
        self.count = -1

    async def set_validation_embedding(
        self, session_id, embedding, *, shrinkage_sigma=0.0, prior_embedding=None, **kw
    ):
        self.embedding = np.array(embedding)
        await super().set_validation_embedding(
            session_id,
            embedding,
            shrinkage_sigma=shrinkage_sigma,
            prior_embedding=prior_embedding,
            **kw,
        )

    async def count_relevant(self, session_id, threshold):
        # The exact count, which never leaves the owner; the owner adds the noise itself.
        self.count = self.owner.session(session_id).relevant_count(threshold)
        return await super().count_relevant(session_id, threshold)


def _session(digits: Scenario, seed: int):
    taps = [Tap(Owner(o.name, o)) for o in digits.owners]
    config = CandidatesConfig(
        summary_size=10,
        epsilon_validation_total=EPS,
        epsilon_owners_total=EPS,
        delta=DELTA,
        rff_dimension=64,
    )

    return config, taps, run_session(taps, digits.validation, digits.seed_set, config, seed=seed)


def _gaussian_delta(eps: float, sigma: float, sens: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    a, b = sens / (2 * sigma), eps * sigma / sens
    return float(stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b))


def test_gaussian_noise_matches_its_stated_sensitivity_and_budget(digits: Scenario) -> None:
    standardized = []
    for seed in range(12):
        config, taps, result = _session(digits, seed)
        event = result.report.ledger.to_json()["validation"]["entries"][0]["event"]
        m = digits.validation.shape[0]
        assert event["sensitivity"] == 2 / m
        sigma = event["scale"]
        # Independent check of the calibration: exact delta at eps is the target, within 1%.
        achieved = _gaussian_delta(EPS, sigma, event["sensitivity"])
        assert 0.99 * DELTA <= achieved <= DELTA * (1 + 1e-6)
        rff = draw_rff_params(
            digits.n_features, config.rff_dimension, config.gamma, np.random.default_rng(seed)
        )
        exact = validation_embedding(
            random_fourier_features(digits.validation, rff, dtype=np.float64)
        )
        assert taps[0].embedding is not None
        standardized.append((taps[0].embedding - exact) / sigma)
    z = np.concatenate(standardized)
    # 768 draws; the test fails with probability 1e-4 when the noise is N(0, sigma^2).
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert stats.kstest(z, "norm", args=(0, 1.3)).pvalue < 1e-4  # and it can tell 30% apart


def test_laplace_count_noise_matches_its_budget(digits: Scenario) -> None:
    noise = []
    for seed in range(60):
        _, taps, result = _session(digits, seed)
        noisy = result.report.ledger.to_json()["candidates"]["noisy_counts"]
        noise += [noisy[t.owner.owner_id] - t.count for t in taps]
    # 300 draws of Laplace(1/eps): KS fails with probability 1e-4 when calibrated.
    assert stats.kstest(noise, "laplace", args=(0, 1 / EPS)).pvalue > 1e-4
    assert stats.kstest(noise, "laplace", args=(0, 2 / EPS)).pvalue < 1e-4


def test_reported_epsilons_match_an_independent_computation(digits: Scenario) -> None:
    _, _, result = _session(digits, 0)
    ledger = result.report.ledger.to_json()
    validation = ledger["validation"]["parties"]["validation"]
    owners = ledger["owners"]["parties"]["owners"]
    # One Gaussian release calibrated to (EPS, DELTA): its PLD epsilon at DELTA is EPS.
    assert math.isclose(validation["pld"], EPS, rel_tol=1e-3)
    # One Laplace(1/EPS) release of a sensitivity-1 vector: pure EPS-DP; at DELTA the tight
    # epsilon is the exact Laplace privacy curve's, computed here from its PLD independently.
    single = pld_epsilon([PrivacyEvent("laplace", EPS, 1, 1.0, scale=1 / EPS)], DELTA)
    assert math.isclose(owners["pld"], single, rel_tol=1e-9)
    assert owners["pld"] <= EPS
    assert owners["theorem7"] == EPS
