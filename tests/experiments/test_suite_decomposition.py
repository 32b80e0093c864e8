"""The decomposition's oracles: each replaces the release it names (the default, run beside it,
as control), charges what the method charges, and is gone once its block ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pytest

import dpmarket.curator.summarization.candidates as candidates_strategy
from dpmarket.common.summarization.candidates import validation_embedding
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.experiments.runner import publish_sketches, run_session
from dpmarket.experiments.suite import suite_scenario
from dpmarket.experiments.suite_decomposition import Oracle, installed, run_decomposition
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner

SEED = 3


class _Records(LocalOwnerEndpoint):
    """An in-process owner that keeps the validation embedding it is sent."""

    sent: ClassVar[list[tuple[np.ndarray, float]]] = []

    async def set_validation_embedding(self, session_id: str, embedding: Any, **kw: Any) -> None:
        _Records.sent.append((np.array(embedding), float(kw.get("shrinkage_sigma", 0.0))))
        await super().set_validation_embedding(session_id, embedding, **kw)


def _session(
    allocation: Literal["counts", "sketch"], oracle: Oracle | None, weights: dict[str, float]
) -> Any:
    scenario = suite_scenario("penguins-3")
    _Records.sent.clear()
    endpoints = [_Records(Owner(o.name, o)) for o in scenario.owners]
    config = CandidatesConfig(
        summary_size=scenario.default_p, gamma=scenario.gamma, allocation=allocation
    )
    sketches = None
    if allocation == "sketch":
        sketches = publish_sketches(
            scenario.owners, scenario.sketch_mechanism(1.0, delta=1e-6), seed=SEED
        )

    def run() -> Any:
        return run_session(
            endpoints,
            scenario.validation,
            scenario.seed_set,
            config,
            seed=SEED,
            owner_sketches=sketches,
        )

    if oracle is None:
        return scenario, run()
    with installed(oracle, weights):
        return scenario, run()


def _exact_g(scenario: Any) -> np.ndarray:
    params = draw_rff_params(scenario.n_features, 140, scenario.gamma, np.random.default_rng(SEED))
    return validation_embedding(random_fourier_features(scenario.validation, params))


@pytest.mark.parametrize("allocation", ["counts", "sketch"])
def test_the_exact_embedding_oracle_sends_mean_h1_and_charges_as_the_method(
    allocation: Literal["counts", "sketch"],
) -> None:
    original = candidates_strategy.Allocator
    scenario, default = _session(allocation, None, {})
    noisy = [e for e, _ in _Records.sent]
    assert all(s > 0 for _, s in _Records.sent)  # the default: noisy, shrunk at the owner
    _, oracle = _session(allocation, Oracle("x", exact_embedding=True), {})
    exact = _exact_g(scenario)
    assert all(np.allclose(e, exact, atol=1e-6) for e, _ in _Records.sent)
    assert all(s == 0.0 for _, s in _Records.sent)
    assert all(np.linalg.norm(e - exact) > 1.0 for e in noisy)  # control: m = 30, ε = 1
    # The replaced release is drawn and charged as the method draws and charges it.
    assert oracle.report.ledger.validation == default.report.ledger.validation
    assert candidates_strategy.Allocator is original


def test_the_oracle_allocation_splits_the_targeted_reads_by_the_weights() -> None:
    scenario = suite_scenario("penguins-3")
    first = scenario.owners[0].name
    weights = {o.name: float(o.name == first) for o in scenario.owners}
    _, default = _session("counts", None, {})
    _, oracle = _session("counts", Oracle("x", oracle_allocation=True), weights)
    p = scenario.default_p
    hedge = oracle.report.ledger.candidates.uniform_shares
    shares = oracle.report.ledger.candidates.shares
    # All 2p targeted reads go to the first owner; the others keep their uniform share only.
    assert shares[first] - hedge[first] == 2 * p
    assert all(shares[n] == hedge[n] for n in shares if n != first)
    control = default.report.ledger.candidates.shares
    assert any(control[n] > hedge[n] for n in control if n != first)


def test_the_decomposition_refuses_a_held_out_scenario(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="held-out"):
        run_decomposition(tmp_path, seeds=1, names=["nass-6"])
    assert not (tmp_path / "decomposition.json").exists()
