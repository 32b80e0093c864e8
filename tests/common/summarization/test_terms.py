"""Known answers for the terms a session offers each owner (dpmarket.common.summarization.terms)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.summarization.auction import auction_parameters
from dpmarket.common.summarization.calibration import paper_mode_events, rounds_auction
from dpmarket.common.summarization.methods import (
    GaussianFields,
    PrivateConfig,
    RoundsConfig,
    UniformConfig,
    method_config,
)
from dpmarket.common.summarization.terms import (
    METHOD_STEPS,
    MIN_NOISE_EPSILON,
    OwnerTerms,
    SessionMethod,
    Step,
    approximate_delta,
    owner_terms,
)

K, M, N_SEED = 5, 40, 10


def _terms(**config: object) -> OwnerTerms:
    values = {"summary_size": 20, **config}
    cfg = method_config(str(values.pop("method", "candidates")), **values)
    return owner_terms(cfg, K, validation_size=M, seed_set_size=N_SEED)


def test_uniform_releases_only_raw_points() -> None:
    terms = _terms(method="uniform")
    assert (terms.epsilon, terms.delta, terms.non_private) == (0.0, 0.0, False)
    assert (terms.method, terms.max_rounds, terms.steps) == (
        SessionMethod.UNIFORM,
        0,
        (Step.SAMPLE,),
    )


def test_greedy_is_non_private() -> None:
    terms = _terms(method="greedy")
    assert terms.non_private and terms.epsilon == math.inf and terms.delta == 0.0
    # One Bid round per point, and one more whenever a released point fails verification.
    assert (terms.method, terms.max_rounds) == (SessionMethod.GREEDY, 2 * 20)


@pytest.mark.parametrize("eps_o", [0.1, 1.0, 2.5])
def test_candidates_spend_the_laplace_count_alone(eps_o: float) -> None:
    terms = _terms(method="candidates", epsilon_owners_total=eps_o)
    assert (terms.epsilon, terms.delta, terms.non_private) == (eps_o, 0.0, False)
    assert terms.method is SessionMethod.CANDIDATES_COUNTS and terms.max_rounds == 0
    # The count is the one release the epsilon pays for; the proposal is raw points.
    assert terms.steps == (Step.VALIDATION_EMBEDDING, Step.COUNT, Step.CANDIDATES)


@pytest.mark.parametrize(
    ("form", "sketch", "method"),
    [
        ("points", True, SessionMethod.CANDIDATES_SKETCH),
        ("hashes", False, SessionMethod.HASHES_COUNTS),
        ("hashes", True, SessionMethod.HASHES_SKETCH),
    ],
)
def test_the_candidates_terms_name_their_allocation_and_form(
    form: str, sketch: bool, method: SessionMethod
) -> None:
    cfg = method_config("candidates", summary_size=20, summary_form=form)
    assert isinstance(cfg, GaussianFields)
    terms = owner_terms(cfg, K, validation_size=M, seed_set_size=N_SEED, sketch_allocation=sketch)
    assert terms.method is method
    assert (terms.epsilon, terms.delta) == (
        (0.0, 0.0) if sketch else (cfg.epsilon_owners_total, 0.0)
    )
    assert (Step.COUNT in terms.steps) is not sketch
    assert (Step.HASHES in terms.steps) is (form == "hashes")
    assert Step.CANDIDATES not in terms.steps or form == "points"


@pytest.mark.parametrize("method", ["private", "rounds"])
def test_the_per_round_terms_bound_the_bid_rounds_by_the_auction(method: str) -> None:
    """At most tau + 2 auction iterations per summary point: the curator's loop bids again
    after up to tau + 1 iterations in a row that acquire nothing, and aborts at the next one
    (curator.summarization.selection)."""
    terms = _terms(method=method)
    tau = auction_parameters(1.0, 1e-6, K).tau  # ceil(K^(2/3)): K alone sets it
    assert terms.max_rounds == 20 * (tau + 2)
    assert terms.steps == (Step.VALIDATION_EMBEDDING, Step.ROUNDS)


@pytest.mark.parametrize("summary_release", ["tree", "none"])
@pytest.mark.parametrize("target", [0.5, 1.0])
def test_rounds_pure_terms_are_the_calibrated_target_at_delta(
    summary_release: str, target: float
) -> None:
    """The rounds method calibrates its owner-side releases to a PLD epsilon in
    [(1 - 1e-3) target, target] at ``delta``; the pure auction adds no delta."""
    terms = _terms(
        method="rounds",
        summary_release=summary_release,
        epsilon_owners_total=target,
        delta=1e-6,
        auction="pure",
    )
    assert terms.delta == 1e-6
    assert target - 1e-3 * target <= terms.epsilon <= target * (1 + 1e-9)
    assert abs(terms.epsilon - target) <= 1e-3


def test_rounds_paper_auction_adds_the_infinite_loss_mass_to_delta() -> None:
    """Each of the printed auction's tau bad iterations is (eps_auc, 1 - e^-eps_auc)-DP, so the
    session's delta is delta + 1 - (1 - (1 - e^-eps_auc))^tau."""
    delta = 1e-6
    cfg = RoundsConfig(summary_size=20, delta=delta, auction="paper", epsilon_owners_total=1.0)
    auction = rounds_auction(cfg, K)
    assert auction.variant == "paper"
    per_iteration = 1.0 - math.exp(-auction.eps_auc)
    expected = delta + 1.0 - (1.0 - per_iteration) ** auction.tau
    terms = owner_terms(cfg, K, validation_size=M, seed_set_size=N_SEED)
    assert terms.delta == pytest.approx(expected, rel=1e-12)
    assert terms.delta > 100 * delta, "the printed auction's delta dwarfs the requested one"
    pure = owner_terms(
        dataclasses.replace(cfg, auction="pure"), K, validation_size=M, seed_set_size=N_SEED
    )
    # At its larger delta the printed variant's epsilon is no larger than the pure one's.
    assert math.isfinite(terms.epsilon) and terms.epsilon <= pure.epsilon + 1e-9


@pytest.mark.parametrize("auction", ["pure", "paper"])
def test_private_terms_compose_the_paper_mode_owner_events(auction: str) -> None:
    cfg = PrivateConfig(summary_size=20, auction=auction)  # type: ignore[arg-type]
    terms = owner_terms(cfg, K, validation_size=M, seed_set_size=N_SEED)
    params = auction_parameters(cfg.epsilon_auction, cfg.delta_owners, K, variant=auction)  # type: ignore[arg-type]
    extra = 0.0 if auction == "pure" else 1.0 - math.exp(-params.eps_auc * params.tau)
    assert terms.delta == pytest.approx(cfg.delta_owners + extra, rel=1e-12)
    events = paper_mode_events(cfg, K, seed_set_size=N_SEED)["owners"]
    assert terms.epsilon == pld_epsilon(events, terms.delta)


def test_approximate_delta_counts_only_approximate_events() -> None:
    events = [
        PrivacyEvent("approximate", 0.1, 3, delta=0.01),
        PrivacyEvent("approximate", 0.2, 2, delta=0.02),
        PrivacyEvent("pure", 0.5, 10),
        PrivacyEvent("gaussian", 1.0, 1, 1.0, scale=5.0, delta=1e-5),
    ]
    assert approximate_delta(events) == pytest.approx(1 - 0.99**3 * 0.98**2, rel=1e-12)
    assert approximate_delta(events[2:]) == 0.0


U, C, S, P, G = (
    SessionMethod.UNIFORM,
    SessionMethod.CANDIDATES_COUNTS,
    SessionMethod.CANDIDATES_SKETCH,
    SessionMethod.PRIVATE,
    SessionMethod.GREEDY,
)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("uniform", 0.0, 0.0), "method must be one of"),
        ((C, -0.1, 0.0), "epsilon must be >= 0"),
        ((C, math.nan, 0.0), "epsilon must be >= 0"),
        ((C, 1.0, 1.0), r"delta must lie in \[0, 1\)"),
        ((C, 1.0, -1e-9), r"delta must lie in \[0, 1\)"),
        # The epsilon must be what the method's steps release.
        ((U, 0.5, 0.0), "releases only raw points: its epsilon and delta must be 0"),
        ((S, 0.0, 1e-6), "releases only raw points"),
        ((C, 0.0, 0.0), "needs a finite epsilon > 0"),
        ((C, math.inf, 0.0), "needs a finite epsilon > 0"),
        ((C, 5e-324, 0.0), "must be at least 1e-06"),  # issue 25, B5: scale 1/eps = inf
        ((C, 1e-300, 0.0), "must be at least 1e-06"),
        ((SessionMethod.HASHES_COUNTS, 1e-7, 0.0), "must be at least 1e-06"),
        ((P, 0.0, 1e-6, 10), "needs a finite epsilon > 0"),
        ((G, 5.0, 0.0, 10), "non-private: its epsilon must be inf"),
        # Rounds for the per-round methods only.
        ((P, 1.0, 1e-6), "max_rounds must be >= 1"),
        ((G, math.inf, 0.0, 0), "max_rounds must be >= 1"),
        ((C, 1.0, 0.0, 3), "has no rounds: max_rounds must be 0"),
        ((P, 1.0, 1e-6, 2.5), "max_rounds must be an integer"),
    ],
)
def test_owner_terms_refuse_malformed_values(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OwnerTerms(*args)  # type: ignore[arg-type]


def test_every_method_has_its_steps_and_the_rounds_come_last() -> None:
    assert set(METHOD_STEPS) == set(SessionMethod)
    for method, steps in METHOD_STEPS.items():
        assert len(set(steps)) == len(steps), method
        assert Step.ROUNDS not in steps[:-1], method


def test_owner_terms_refuse_bad_counts() -> None:
    cfg = UniformConfig(summary_size=5)
    with pytest.raises(ValueError, match="n_owners"):
        owner_terms(cfg, 0, validation_size=M, seed_set_size=0)
    with pytest.raises(ValueError, match="validation_size"):
        owner_terms(cfg, K, validation_size=0, seed_set_size=0)


def test_the_owners_count_epsilon_has_a_minimum_so_its_noise_scale_is_finite() -> None:
    """Issue 25, B5: terms of epsilon 5e-324 were charged, then the count's Laplace scale 1/eps
    was inf and nothing was released. Control: at the minimum the scale is finite and the
    terms are taken; below it (the attack's epsilon) the scale the owner would draw at is
    inf."""
    at_min = OwnerTerms(C, MIN_NOISE_EPSILON, 0.0)
    assert math.isfinite(1.0 / at_min.epsilon)
    assert OwnerTerms(SessionMethod.HASHES_COUNTS, MIN_NOISE_EPSILON, 0.0).epsilon > 0
    assert math.isinf(1.0 / 5e-324)
    with pytest.raises(ValueError, match="at least"):
        OwnerTerms(C, math.nextafter(MIN_NOISE_EPSILON, 0.0), 0.0)
