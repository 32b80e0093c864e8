"""Tests for the rounds method's calibration: events, the tree's sigma, the auction's budget."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from dpmarket.common.privacy.accounting import PrivacyEvent, analytic_gaussian_sigma, pld_epsilon
from dpmarket.common.summarization.auction import auction_parameters
from dpmarket.common.summarization.calibration import (
    CALIBRATION_RTOL,
    TREE_INCREMENT_SENSITIVITY,
    calibrate_rounds_mode,
    gaussian_epsilon,
    rounds_auction,
    rounds_mode_events,
    rounds_tree_sigma,
)
from dpmarket.common.summarization.candidates import validation_embedding_sensitivity
from dpmarket.common.summarization.continual import tree_levels
from dpmarket.common.summarization.methods import RoundsConfig

DELTA = 1e-6
OPTIONS = [
    (v, s) for v in ("gaussian", "mwem") for s in ("tree", "mwem", "none")
]  # (validation_release, summary_release)


def _config(p: int, validation: str, summary: str, **kw) -> RoundsConfig:
    return RoundsConfig(
        summary_size=p,
        validation_release=validation,  # type: ignore[arg-type]
        summary_release=summary,  # type: ignore[arg-type]
        **kw,
    )


def _counts(events: list[PrivacyEvent]) -> Counter[tuple[str, float, float | None]]:
    out: Counter[tuple[str, float, float | None]] = Counter()
    for e in events:
        out[(e.mechanism, round(e.epsilon, 12), e.scale)] += e.count
    return out


def test_gaussian_epsilon_inverts_the_analytic_sigma() -> None:
    sigma = analytic_gaussian_sigma(0.7, DELTA, 2.0)
    assert gaussian_epsilon(sigma, DELTA, 2.0) == pytest.approx(0.7, rel=1e-6)
    # The event it describes passes PrivacyEvent's consistency check.
    PrivacyEvent("gaussian", gaussian_epsilon(3.0, DELTA, 2.0), 1, 2.0, scale=3.0, delta=DELTA)


@pytest.mark.parametrize(("validation", "summary"), OPTIONS)
@pytest.mark.parametrize(("p", "k", "target"), [(200, 8, 0.3), (200, 8, 3.0), (50, 5, 1.0)])
def test_calibration_hits_the_target_for_both_parties(
    validation: str, summary: str, p: int, k: int, target: float
) -> None:
    cfg = calibrate_rounds_mode(
        _config(p, validation, summary), k, epsilon_target=target, delta=DELTA
    )
    events = rounds_mode_events(cfg, k, validation_size=100, seed_set_size=0)
    owners = pld_epsilon(events["owners"], DELTA)
    assert (1 - CALIBRATION_RTOL) * target <= owners <= target
    if validation == "mwem":
        assert (1 - CALIBRATION_RTOL) * target <= pld_epsilon(events["validation"], DELTA) <= target
    else:
        # One Gaussian release at exactly (target, delta) by the analytic calibration; the PLD
        # accountant's discretization adds a little on top of that.
        (event,) = events["validation"]
        assert event.epsilon == target and event.delta == DELTA
        assert event.scale == analytic_gaussian_sigma(target, DELTA, event.sensitivity or 0.0)
        assert target <= pld_epsilon(events["validation"], DELTA) <= target * (1 + 1e-4)


def test_calibration_changes_only_the_documented_fields() -> None:
    base = _config(
        100,
        "mwem",
        "mwem",
        auction_share=0.3,
        epsilon_validation_total=0.5,
        epsilon_owners_total=0.5,
        delta=1e-5,
    )
    out = calibrate_rounds_mode(base, 6, epsilon_target=1.0, delta=DELTA)
    changed = {
        f.name for f in dataclasses.fields(base) if getattr(base, f.name) != getattr(out, f.name)
    }
    assert changed == {
        "epsilon_validation",
        "epsilon_summary",
        "epsilon_validation_total",
        "epsilon_owners_total",
        "delta",
    }
    tree = calibrate_rounds_mode(
        dataclasses.replace(base, validation_release="gaussian", summary_release="tree"),
        6,
        epsilon_target=1.0,
        delta=DELTA,
    )
    assert tree.epsilon_validation == base.epsilon_validation
    assert tree.epsilon_summary == base.epsilon_summary
    assert tree.auction_share == 0.3


def test_auction_gets_its_share_or_everything_without_a_summary_release() -> None:
    cfg = _config(200, "gaussian", "tree", epsilon_owners_total=2.0, delta=DELTA)
    assert rounds_auction(cfg, 8) == auction_parameters(1.0, DELTA, 8, variant="pure")
    paper = dataclasses.replace(cfg, auction="paper")
    assert rounds_auction(paper, 8) == auction_parameters(1.0, DELTA, 8, variant="paper")
    none = dataclasses.replace(cfg, summary_release="none")
    auction = rounds_auction(none, 8)
    assert auction.tau == auction_parameters(1.0, DELTA, 8).tau
    eps = pld_epsilon([PrivacyEvent("pure", auction.eps_auc, auction.tau)], DELTA)
    assert (1 - CALIBRATION_RTOL) * 2.0 <= eps <= 2.0


def test_tree_sigma_shrinks_as_the_budget_grows_and_the_levels_match() -> None:
    sigmas = [
        rounds_tree_sigma(_config(200, "gaussian", "tree", epsilon_owners_total=e), 8)
        for e in (0.3, 1.0, 3.0)
    ]
    assert sigmas[0] > sigmas[1] > sigmas[2] > 0
    events = rounds_mode_events(
        _config(200, "gaussian", "tree"), 8, validation_size=50, seed_set_size=0
    )
    (tree,) = [e for e in events["owners"] if e.mechanism == "gaussian"]
    assert tree.count == tree_levels(199) == 8
    assert (
        tree.sensitivity
        == pytest.approx(TREE_INCREMENT_SENSITIVITY)
        == pytest.approx(2 * np.sqrt(2))
    )


@pytest.mark.parametrize(("validation", "summary"), OPTIONS)
@pytest.mark.parametrize("seed_set_size", [0, 10])
def test_rounds_mode_events_match_a_real_session(
    validation: str, summary: str, seed_set_size: int
) -> None:
    from dpmarket.experiments.runner import simulate
    from dpmarket.runtime.tables import PointSet

    rng = np.random.default_rng(7)
    owners = [
        PointSet(rng.normal(loc=i, size=(200, 4)), rng.integers(0, 2, size=200), f"owner-{i}")
        for i in range(3)
    ]
    validation_set = rng.normal(loc=1.0, size=(50, 4))
    seed_set = rng.normal(size=(seed_set_size, 4))
    cfg = calibrate_rounds_mode(
        _config(9, validation, summary, rff_dimension=16, iterations_initial=50),
        len(owners),
        epsilon_target=1.0,
        delta=DELTA,
    )
    result = simulate(owners, validation_set, seed_set, cfg, seed=3)
    ledger = result.report.ledger.to_json()
    events = rounds_mode_events(cfg, len(owners), validation_size=50, seed_set_size=seed_set_size)
    for party in ("validation", "owners"):
        report = ledger[party]
        assert report["delta_tilde"] == DELTA
        charged = [
            PrivacyEvent(**entry["event"]) for entry in report["entries"] if entry["party"] == party
        ]
        assert _counts(charged) == _counts(events[party])
        assert report["parties"][party]["pld"] == pytest.approx(
            pld_epsilon(events[party], DELTA),
            rel=1e-9,
        )
    public = [
        PrivacyEvent(**entry["event"])
        for entry in ledger["owners"]["entries"]
        if entry["party"] == "public"
    ]
    assert _counts(public) == _counts(events["public"])
    if validation == "gaussian":
        (event,) = events["validation"]
        assert event.sensitivity == pytest.approx(validation_embedding_sensitivity(50))


def test_calibration_rejects_bad_input() -> None:
    cfg = _config(10, "gaussian", "tree")
    with pytest.raises(ValueError, match="epsilon_target"):
        calibrate_rounds_mode(cfg, 3, epsilon_target=0.0, delta=DELTA)
    with pytest.raises(ValueError, match="delta"):
        calibrate_rounds_mode(cfg, 3, epsilon_target=1.0, delta=0.5)
    with pytest.raises(ValueError, match="n_owners"):
        calibrate_rounds_mode(cfg, 0, epsilon_target=1.0, delta=DELTA)
