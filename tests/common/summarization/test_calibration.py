"""Tests for dpmarket.common.summarization.calibration: the private method's events and their
calibration to
a target."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from dpmarket.common.privacy.accounting import PrivacyEvent, kairouz_epsilon, pld_epsilon
from dpmarket.common.summarization.auction import auction_parameters
from dpmarket.common.summarization.calibration import (
    CALIBRATION_RTOL,
    MWEM_SENSITIVITY,
    Party,
    calibrate_paper_mode,
    paper_mode_events,
)
from dpmarket.common.summarization.methods import PrivateConfig

DELTA = 1e-6
CALIBRATED_FIELDS = {
    "epsilon_validation",
    "epsilon_summary",
    "epsilon_auction",
    "delta_owners",
    "delta_validation",
}


def _counts(events: list[PrivacyEvent]) -> Counter[tuple[str, float]]:
    """Total runs per (mechanism, epsilon): what every accountant of the ledger depends on."""
    out: Counter[tuple[str, float]] = Counter()
    for e in events:
        out[(e.mechanism, e.epsilon)] += e.count
    return out


# --- paper_mode_events --------------------------------------------------------------------------


@pytest.mark.parametrize("seed_set_size", [0, 30])
def test_paper_mode_events_counts(seed_set_size: int) -> None:
    cfg = PrivateConfig(summary_size=200, rff_dimension=140, delta_owners=1e-5)
    events = paper_mode_events(cfg, 8, seed_set_size=seed_set_size)
    auction = auction_parameters(cfg.epsilon_auction, 1e-5, 8)
    eps_l = 0.01 / math.sqrt(200 * 5)
    assert _counts(events["validation"]) == {("exponential", 0.01): 1656, ("laplace", 0.01): 1656}
    assert _counts(events["owners"]) == {
        ("pure", auction.eps_auc): auction.tau,
        ("exponential", eps_l): 199 * 5,
        ("laplace", eps_l): 199 * 5,
    }
    for party in ("validation", "owners"):
        for e in events[party]:
            assert e.delta == 0.0
            if e.mechanism == "laplace":
                assert e.sensitivity == MWEM_SENSITIVITY
                assert e.scale == pytest.approx(MWEM_SENSITIVITY / e.epsilon)
    if seed_set_size == 0:
        assert events["public"] == []
    else:
        assert _counts(events["public"]) == {
            ("exponential", 0.05): 1656,
            ("laplace", 0.05): 1656,
        }


def test_paper_mode_events_single_round_charges_only_the_auction() -> None:
    cfg = PrivateConfig(summary_size=1, rff_dimension=16)
    events = paper_mode_events(cfg, 3, seed_set_size=5)
    assert [e.mechanism for e in events["owners"]] == ["pure"]


@pytest.mark.parametrize(
    ("n_owners", "seed_set_size", "match"),
    [(0, 0, "n_owners"), (2.5, 0, "n_owners"), (3, -1, "seed_set_size"), (3, 1.5, "seed_set")],
)
def test_paper_mode_events_rejects_bad_input(n_owners: int, seed_set_size: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        paper_mode_events(PrivateConfig(summary_size=5), n_owners, seed_set_size=seed_set_size)


@pytest.mark.parametrize(
    "seed_set_size",
    [
        0,
        10,
    ],
)
def test_paper_mode_events_match_a_real_session(seed_set_size: int) -> None:
    from dpmarket.experiments.runner import simulate
    from dpmarket.runtime.tables import PointSet

    rng = np.random.default_rng(7)
    owners = [
        PointSet(rng.normal(loc=i, size=(200, 4)), rng.integers(0, 2, size=200), f"owner-{i}")
        for i in range(3)
    ]
    validation = rng.normal(loc=1.0, size=(50, 4))
    seed_set = rng.normal(size=(seed_set_size, 4))
    cfg = PrivateConfig(
        summary_size=5,
        rff_dimension=16,
        iterations_initial=50,
        epsilon_validation=0.05,
        epsilon_summary=0.2,
        epsilon_auction=2.0,
        delta_owners=1e-5,
        delta_validation=1e-3,
    )
    result = simulate(owners, validation, seed_set, cfg, seed=3)
    ledger = result.report.ledger.to_json()
    events = paper_mode_events(cfg, len(owners), seed_set_size=seed_set_size)
    parties: tuple[tuple[Party, float], ...] = (("validation", 1e-3), ("owners", 1e-5))
    for party, delta_tilde in parties:
        report = ledger[party]
        charged = [
            PrivacyEvent(**entry["event"]) for entry in report["entries"] if entry["party"] == party
        ]
        assert _counts(charged) == _counts(events[party])
        row = report["parties"][party]
        assert row["mechanisms"] == sum(e.count for e in events[party])
        assert row["pld"] == pytest.approx(
            pld_epsilon(events[party], delta_tilde),
            rel=1e-9,
        )
    public = [
        PrivacyEvent(**entry["event"])
        for entry in ledger["owners"]["entries"]
        if entry["party"] == "public"
    ]
    assert _counts(public) == _counts(events["public"])


# --- calibrate_paper_mode -----------------------------------------------------------------------


def _party_epsilons(cfg: PrivateConfig, n_owners: int, seed: int) -> tuple[float, float]:
    events = paper_mode_events(cfg, n_owners, seed_set_size=seed)
    return (pld_epsilon(events["validation"], DELTA), pld_epsilon(events["owners"], DELTA))


@pytest.mark.parametrize(
    ("p", "k", "target"),
    [(200, 8, 0.3), (200, 8, 1.0), (200, 8, 3.0), (50, 4, 1.0), (500, 27, 0.3), (2, 1, 3.0)],
)
def test_calibration_hits_the_target_for_both_parties(p: int, k: int, target: float) -> None:
    cfg = PrivateConfig(summary_size=p)
    out = calibrate_paper_mode(cfg, k, epsilon_target=target, delta=DELTA, seed_set_size=30)
    for eps in _party_epsilons(out, k, 30):
        assert (1 - CALIBRATION_RTOL) * target <= eps <= target


def test_calibration_with_theorem7() -> None:
    cfg = PrivateConfig(summary_size=100, rff_dimension=40)
    out = calibrate_paper_mode(
        cfg, 5, epsilon_target=1.0, delta=DELTA, seed_set_size=0, method="theorem7"
    )
    events = paper_mode_events(out, 5, seed_set_size=0)
    for party in ("validation", "owners"):
        flat = [e.epsilon for e in events[party] for _ in range(e.count)]
        assert 1 - CALIBRATION_RTOL <= kairouz_epsilon(flat, DELTA) <= 1.0
    # The PLD accountant is tighter, so it affords larger per-iteration epsilons.
    tighter = calibrate_paper_mode(cfg, 5, epsilon_target=1.0, delta=DELTA, seed_set_size=0)
    assert tighter.epsilon_validation > out.epsilon_validation
    assert tighter.epsilon_summary > out.epsilon_summary


def test_calibration_changes_only_the_documented_fields() -> None:
    cfg = PrivateConfig(
        summary_size=60,
        rff_dimension=32,
        iterations_initial=100,
        iterations_subsequent=3,
        epsilon_first_epoch=0.2,
        epsilon_summary=0.05,
        epsilon_auction=0.5,
        gamma=0.3,
    )
    out = calibrate_paper_mode(cfg, 6, epsilon_target=1.0, delta=DELTA, seed_set_size=10)
    changed = {
        f.name
        for f in dataclasses.fields(PrivateConfig)
        if getattr(out, f.name) != getattr(cfg, f.name)
    }
    assert changed <= CALIBRATED_FIELDS
    assert out.delta_owners == DELTA and out.delta_validation == DELTA
    # The split of the owners' budget between summaries and auction is kept.
    assert out.epsilon_summary / out.epsilon_auction == pytest.approx(0.05 / 0.5, rel=1e-12)
    assert cfg.epsilon_validation == 0.01  # the input is not modified


def test_calibration_is_monotone_in_the_target() -> None:
    cfg = PrivateConfig(summary_size=100)
    outs = [
        calibrate_paper_mode(cfg, 8, epsilon_target=t, delta=DELTA, seed_set_size=30)
        for t in (0.3, 1.0, 3.0)
    ]
    for small, large in itertools.pairwise(outs):
        assert small.epsilon_validation < large.epsilon_validation
        assert small.epsilon_per_later_iteration < large.epsilon_per_later_iteration
        assert small.epsilon_auction < large.epsilon_auction


def test_calibration_smaller_delta_needs_smaller_epsilons() -> None:
    cfg = PrivateConfig(summary_size=100, rff_dimension=40)
    loose = calibrate_paper_mode(cfg, 8, epsilon_target=1.0, delta=1e-3, seed_set_size=0)
    strict = calibrate_paper_mode(cfg, 8, epsilon_target=1.0, delta=1e-9, seed_set_size=0)
    assert strict.epsilon_validation < loose.epsilon_validation

    # eps_auc = epsilon_auction / (3 sqrt(2 ln(1/delta))) K^(-1/3) shrinks with delta by itself, so
    # epsilon_summary and epsilon_auction may grow; the auction's per-run epsilon does not.
    def eps_auc(cfg: PrivateConfig) -> float:
        return auction_parameters(cfg.epsilon_auction, cfg.delta_owners, 8).eps_auc

    assert eps_auc(strict) < eps_auc(loose)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon_target": 0.0}, "epsilon_target"),
        ({"epsilon_target": math.nan}, "epsilon_target"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 0.5}, "delta"),
        ({"seed_set_size": -3}, "seed_set_size"),
        ({"method": "rdp"}, "method"),
        ({"epsilon_target": 1e5}, "cannot reach epsilon target 100000"),
    ],
)
def test_calibration_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "epsilon_target": 1.0,
        "delta": DELTA,
        "seed_set_size": 0,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        calibrate_paper_mode(PrivateConfig(summary_size=10, rff_dimension=16), 4, **args)  # type: ignore[arg-type]
