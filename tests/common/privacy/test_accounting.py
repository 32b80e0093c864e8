"""Tests for dpmarket.common.privacy.accounting: Theorem 7, advanced composition and PLD
composition."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from dpmarket.common.privacy.accounting import (
    PrivacyEvent,
    advanced_composition_epsilon,
    analytic_gaussian_sigma,
    exponential_zcdp_rho,
    gaussian_zcdp_rho,
    kairouz_epsilon,
    kairouz_epsilon_delta,
    kairouz_epsilon_homogeneous,
    pld_epsilon,
    zcdp_delta,
    zcdp_epsilon,
    zcdp_rho,
)

T_INIT, EPS_V, DELTA_V = 1656, 0.01, 0.01  # summarization paper, Section 4 (validation set)
T_SUBS, DELTA_S = 5, 1e-4  # Section 4 (summary), epsilon 0.01 / sqrt(p T_subs)


def _theorem7_reference(epsilons: list[float], delta_tilde: float) -> float:
    """Theorem 7 as printed in the appendix, written independently with plain loops."""
    basic = sum(epsilons)
    drift = sum((math.exp(e) - 1) * e / (math.exp(e) + 1) for e in epsilons)
    sq2 = sum(2 * e * e for e in epsilons)
    second = drift + math.sqrt(sq2 * math.log(1 / delta_tilde))
    third = drift + math.sqrt(sq2 * math.log(math.e + math.sqrt(sq2) / delta_tilde))
    return min(basic, second, third)


def _exact_pure_delta(eps: float, k: int, eps_total: float) -> float:
    """Hockey-stick delta of k-fold composition of eps-DP randomized response (the worst case).

    The privacy loss is eps (k - 2 L) with L ~ Binomial(k, 1 / (1 + e^eps)) under P, and
    delta(eps_total) = E_P[(1 - exp(eps_total - loss))_+] (Kairouz et al. 2017, Theorem 3.3).
    """
    n_neg = np.arange(k + 1)
    loss = eps * (k - 2 * n_neg)
    pmf = stats.binom.pmf(n_neg, k, 1 / (1 + math.exp(eps)))
    with np.errstate(over="ignore"):  # exp overflows to inf where the hinge is 0 anyway
        return float(np.sum(pmf * np.maximum(0.0, -np.expm1(eps_total - loss))))


def _exact_pure_epsilon(eps: float, k: int, delta: float) -> float:
    """Smallest eps_total with delta(eps_total) <= delta: the optimal composition of k eps-DP."""
    if _exact_pure_delta(eps, k, 0.0) <= delta:
        return 0.0
    return float(
        optimize.brentq(lambda e: _exact_pure_delta(eps, k, e) - delta, 0.0, k * eps, xtol=1e-12)
    )


# --- advanced composition: the paper's Section 4 numbers -------------------------------------


def test_advanced_composition_reproduces_paper_validation_number() -> None:
    assert advanced_composition_epsilon(EPS_V, T_INIT, DELTA_V) == pytest.approx(1.40, abs=0.005)


@pytest.mark.parametrize("p", [10, 50, 100, 200, 1000])
def test_advanced_composition_reproduces_paper_summary_number(p: int) -> None:
    k = p * T_SUBS
    eps = 0.01 / math.sqrt(k)
    assert advanced_composition_epsilon(eps, k, DELTA_S) == pytest.approx(0.043, abs=0.0005)


def test_advanced_composition_formula() -> None:
    eps, k, dt = 0.3, 17, 1e-5
    expected = eps * math.sqrt(2 * k * math.log(1 / dt)) + k * eps * (math.exp(eps) - 1)
    assert advanced_composition_epsilon(eps, k, dt) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("eps", "k", "dt", "match"),
    [(0.0, 3, 0.1, "epsilon"), (0.1, 0, 0.1, "k"), (0.1, 3, 0.0, "delta"), (0.1, 3, 1.0, "delta")],
)
def test_advanced_composition_rejects_bad_input(eps: float, k: int, dt: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        advanced_composition_epsilon(eps, k, dt)


# --- Theorem 7 --------------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [1, 2])
def test_theorem7_paper_validation_setting(factor: int) -> None:
    k = factor * T_INIT
    expected = _theorem7_reference([EPS_V] * k, DELTA_V)
    assert kairouz_epsilon([EPS_V] * k, DELTA_V) == pytest.approx(expected, rel=1e-9)
    assert kairouz_epsilon_homogeneous(EPS_V, k, DELTA_V) == pytest.approx(expected, rel=1e-9)
    # Theorem 7 is tighter than the advanced composition the paper's 1.4 comes from.
    assert expected < advanced_composition_epsilon(EPS_V, k, DELTA_V)


def test_theorem7_paper_validation_known_values() -> None:
    # Computed by hand from the printed formula: drift = k eps tanh(eps / 2), and the third
    # expression (log(e + sqrt(2 k eps^2) / delta)) is the minimum.
    assert kairouz_epsilon_homogeneous(EPS_V, T_INIT, DELTA_V) == pytest.approx(1.2479, abs=1e-3)
    assert kairouz_epsilon_homogeneous(EPS_V, 2 * T_INIT, DELTA_V) == pytest.approx(
        1.8790, abs=1e-3
    )


@pytest.mark.parametrize("p", [50, 100, 200])
@pytest.mark.parametrize("factor", [1, 2])
def test_theorem7_paper_summary_setting(p: int, factor: int) -> None:
    k = factor * p * T_SUBS
    eps = 0.01 / math.sqrt(p * T_SUBS)
    expected = _theorem7_reference([eps] * k, DELTA_S)
    assert kairouz_epsilon_homogeneous(eps, k, DELTA_S) == pytest.approx(expected, rel=1e-9)
    assert kairouz_epsilon([eps] * k, DELTA_S) == pytest.approx(expected, rel=1e-9)


def test_theorem7_heterogeneous_matches_reference() -> None:
    eps = [0.5, 0.01, 0.01, 0.2, 1.3, 0.01, 0.07] * 30
    assert kairouz_epsilon(eps, 1e-3) == pytest.approx(_theorem7_reference(eps, 1e-3), rel=1e-12)
    assert kairouz_epsilon(np.array(eps), 1e-3) == pytest.approx(kairouz_epsilon(eps, 1e-3))


def test_theorem7_each_branch_can_be_the_minimum() -> None:
    # One large epsilon: the basic sum wins.
    assert kairouz_epsilon([3.0], 0.1) == pytest.approx(3.0)
    # log(1/delta) < log(e + sqrt(2 sum eps^2) / delta) whenever sqrt(2 sum eps^2) > 1 - e delta,
    # so the second branch wins for large sums of squares.
    eps = [0.1] * 1000
    sq2 = 2 * 1000 * 0.01
    drift = 1000 * 0.1 * math.tanh(0.05)
    assert kairouz_epsilon(eps, 1e-6) == pytest.approx(
        drift + math.sqrt(sq2 * math.log(1e6)), rel=1e-12
    )


def test_theorem7_upper_bounds_exact_optimal_composition() -> None:
    for eps, k, dt in [(0.01, T_INIT, DELTA_V), (0.1, 50, 1e-3), (0.5, 20, 0.05)]:
        assert _exact_pure_epsilon(eps, k, dt) <= kairouz_epsilon_homogeneous(eps, k, dt)


def test_theorem7_empty_is_zero() -> None:
    assert kairouz_epsilon([], 0.1) == 0.0


@pytest.mark.parametrize(
    ("eps", "dt", "match"),
    [
        ([0.1, 0.0], 0.1, r"epsilons\[1\] = 0.0"),
        ([0.1, math.nan], 0.1, "finite"),
        ([0.1, -1.0], 0.1, "-1.0"),
        ([[0.1]], 0.1, "1-D"),
        ([0.1], 0.0, "delta_tilde"),
        ([0.1], 0.5, "delta_tilde"),  # above 1/e
    ],
)
def test_theorem7_rejects_bad_input(eps: list[float], dt: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kairouz_epsilon(eps, dt)


def test_theorem7_accepts_delta_tilde_one_over_e() -> None:
    assert kairouz_epsilon([0.1, 0.2], 1 / math.e) > 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=1e-6, max_value=5.0), min_size=1, max_size=60),
    st.floats(min_value=1e-12, max_value=1 / math.e),
)
def test_theorem7_never_exceeds_basic_sum(epsilons: list[float], delta_tilde: float) -> None:
    assert kairouz_epsilon(epsilons, delta_tilde) <= math.fsum(epsilons) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=1e-3, max_value=2.0),
    st.integers(min_value=1, max_value=200),
    st.floats(min_value=1e-9, max_value=0.3),
)
def test_theorem7_is_sound_against_exact_composition(eps: float, k: int, dt: float) -> None:
    assert _exact_pure_epsilon(eps, k, dt) <= kairouz_epsilon_homogeneous(eps, k, dt) + 1e-9


# --- PrivacyEvent -----------------------------------------------------------------------------


def test_laplace_event_fills_and_checks_calibration() -> None:
    ev = PrivacyEvent("laplace", 0.5, count=3, sensitivity=2.0)
    assert ev.scale == pytest.approx(4.0)
    ev = PrivacyEvent("laplace", 0.5, scale=4.0)
    assert ev.sensitivity == pytest.approx(2.0)
    ev = PrivacyEvent("laplace", 0.5)
    assert ev.sensitivity == 1.0 and ev.scale == pytest.approx(2.0)
    with pytest.raises(ValueError, match="sensitivity / scale"):
        PrivacyEvent("laplace", 0.5, sensitivity=2.0, scale=1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mechanism": "gaussian", "epsilon": 1.0}, "gaussian"),
        ({"mechanism": "pure", "epsilon": 0.0}, "epsilon"),
        ({"mechanism": "pure", "epsilon": 1.0, "count": 0}, "count"),
        ({"mechanism": "pure", "epsilon": 1.0, "count": 1.5}, "count"),
        ({"mechanism": "exponential", "epsilon": 1.0, "scale": 2.0}, "scale"),
        ({"mechanism": "laplace", "epsilon": 1.0, "sensitivity": -2.0}, "sensitivity"),
    ],
)
def test_event_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivacyEvent(**kwargs)  # type: ignore[arg-type]


# --- PLD --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("eps0", "delta"), [(1.0, 0.1), (0.5, 1e-3), (0.01, 1e-3)])
def test_pld_single_laplace_matches_closed_form(eps0: float, delta: float) -> None:
    # Laplace with sensitivity/scale = eps0: delta(eps) = 1 - exp((eps - eps0) / 2) on
    # [0, eps0], so eps(delta) = eps0 + 2 ln(1 - delta). The PLD is pessimistic by at most about
    # one discretization interval (eps0 / 100).
    exact = eps0 + 2 * math.log1p(-delta)
    got = pld_epsilon([PrivacyEvent("laplace", eps0, sensitivity=2.0, scale=2.0 / eps0)], delta)
    assert exact - 1e-9 <= got <= exact + 0.02 * eps0


@pytest.mark.parametrize(
    ("eps", "k", "delta"), [(0.01, T_INIT, DELTA_V), (0.01, 2 * T_INIT, DELTA_V), (0.2, 40, 1e-5)]
)
@pytest.mark.parametrize("mechanism", ["pure", "exponential"])
def test_pld_pure_self_composition_matches_exact_optimal_composition(
    eps: float, k: int, delta: float, mechanism: str
) -> None:
    # Pessimistic by at most a couple of discretization intervals (eps / 100 each).
    exact = _exact_pure_epsilon(eps, k, delta)
    got = pld_epsilon([PrivacyEvent(mechanism, eps, count=k)], delta)  # type: ignore[arg-type]
    assert exact - 1e-9 <= got <= exact + 2 * eps / 100


def test_pld_counts_repeats() -> None:
    # DESIGN.md pitfall: k repeats must not count as one.
    once = pld_epsilon([PrivacyEvent("pure", 0.1)], 1e-5)
    many = pld_epsilon([PrivacyEvent("pure", 0.1, count=100)], 1e-5)
    listed = pld_epsilon([PrivacyEvent("pure", 0.1)] * 100, 1e-5)
    assert once == pytest.approx(_exact_pure_epsilon(0.1, 1, 1e-5), abs=1e-6)
    assert many == pytest.approx(listed, rel=1e-9)
    assert many == pytest.approx(_exact_pure_epsilon(0.1, 100, 1e-5), rel=0.01)


def test_pld_laplace_is_tighter_than_generic_pure() -> None:
    lap = pld_epsilon([PrivacyEvent("laplace", 0.05, count=200, sensitivity=2.0)], 1e-4)
    pure = pld_epsilon([PrivacyEvent("pure", 0.05, count=200)], 1e-4)
    assert lap < pure


def test_pld_paper_calibration_below_theorem7_below_basic() -> None:
    # Our calibrated h2 on D_v: T_init selections + T_init Laplace measurements at eps_v.
    events = [
        PrivacyEvent("exponential", EPS_V, count=T_INIT, sensitivity=2.0),
        PrivacyEvent("laplace", EPS_V, count=T_INIT, sensitivity=2.0),
    ]
    pld = pld_epsilon(events, DELTA_V)
    t7 = kairouz_epsilon_homogeneous(EPS_V, 2 * T_INIT, DELTA_V)
    basic = 2 * T_INIT * EPS_V
    assert 0 < pld < t7 < basic
    # The exact composition of 2 T_init generic eps-DP mechanisms bounds ours from above.
    assert pld <= _exact_pure_epsilon(EPS_V, 2 * T_INIT, DELTA_V) * 1.01


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["laplace", "exponential", "pure"]),
            st.sampled_from([0.02, 0.05, 0.1, 0.3]),
            st.integers(min_value=1, max_value=30),
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([1e-2, 1e-4, 1e-6]),
)
def test_pld_never_exceeds_theorem7_or_basic(
    spec: list[tuple[str, float, int]], delta: float
) -> None:
    events = [PrivacyEvent(m, e, count=c) for m, e, c in spec]  # type: ignore[arg-type]
    flat = [e for _, e, c in spec for _ in range(c)]
    pld = pld_epsilon(events, delta)
    # PLD is the tighter accountant; 1% slack covers its pessimistic discretization.
    assert pld <= kairouz_epsilon(flat, delta) * 1.01 + 1e-9
    assert pld <= math.fsum(flat) * 1.01 + 1e-9


def test_pld_many_small_events_is_fast_enough_to_run() -> None:
    # 3312 events at eps = 0.01 (the validation set's 2 T_init mechanisms), listed one by one.
    events = [PrivacyEvent("exponential", EPS_V)] * T_INIT + [
        PrivacyEvent("laplace", EPS_V, sensitivity=2.0)
    ] * T_INIT
    got = pld_epsilon(events, DELTA_V)
    assert got == pytest.approx(
        pld_epsilon(
            [
                PrivacyEvent("exponential", EPS_V, count=T_INIT),
                PrivacyEvent("laplace", EPS_V, count=T_INIT, sensitivity=2.0),
            ],
            DELTA_V,
        ),
        rel=1e-12,
    )


def test_pld_explicit_interval_and_empty() -> None:
    assert pld_epsilon([], 1e-3) == 0.0
    coarse = pld_epsilon(
        [PrivacyEvent("pure", 0.1, count=10)], 1e-3, value_discretization_interval=0.03
    )
    fine = pld_epsilon([PrivacyEvent("pure", 0.1, count=10)], 1e-3)
    assert coarse >= fine  # a coarse interval rounds 0.1 up to 0.12


@pytest.mark.parametrize(
    ("events", "delta", "kwargs", "match"),
    [
        ([PrivacyEvent("pure", 0.1)], 0.0, {}, "delta"),
        ([PrivacyEvent("pure", 0.1)], 1.0, {}, "delta"),
        (["pure"], 0.1, {}, "PrivacyEvent"),
        ([PrivacyEvent("pure", 0.1)], 0.1, {"value_discretization_interval": 0.0}, "interval"),
    ],
)
def test_pld_rejects_bad_input(
    events: list[object], delta: float, kwargs: dict[str, float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        pld_epsilon(events, delta, **kwargs)  # type: ignore[arg-type]


# --- Gaussian mechanism -----------------------------------------------------------------------


def _gaussian_delta(eps: float, sigma: float, sensitivity: float) -> float:
    """Balle & Wang (2018), Theorem 8: the exact delta(eps) of N(0, sigma^2) noise.

    ``Phi(D / (2 s) - eps s / D) - e^eps Phi(-D / (2 s) - eps s / D)``, the second term in log
    space so that large eps does not overflow.
    """
    a = sensitivity / (2 * sigma)
    b = eps * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(eps + stats.norm.logcdf(-a - b)))


def _gaussian_exact_sigma(eps: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma with delta(eps) <= delta, by root finding on the closed form."""
    return float(
        optimize.brentq(
            lambda s: _gaussian_delta(eps, s, sensitivity) - delta,
            1e-3 * sensitivity,
            1e4 * sensitivity,
            xtol=1e-14 * sensitivity,
            rtol=1e-14,
        )
    )


def _gaussian_exact_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
    """The smallest eps with delta(eps) <= delta for N(0, sigma^2) noise."""
    if _gaussian_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    return float(
        optimize.brentq(
            lambda e: _gaussian_delta(e, sigma, sensitivity) - delta, 0.0, 100.0, xtol=1e-12
        )
    )


@pytest.mark.parametrize(
    ("eps", "delta", "sensitivity"),
    [
        (1.0, 1e-5, 1.0),
        (0.1, 1e-6, 2.0),
        (0.5, 1e-3, 1e-3),
        (3.0, 1e-6, 2 * math.sqrt(2) / 50),
        (8.0, 1e-9, 100.0),
    ],
)
def test_analytic_gaussian_sigma_matches_closed_form(
    eps: float, delta: float, sensitivity: float
) -> None:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity)
    achieved = _gaussian_delta(eps, sigma, sensitivity)
    # Sound (at or below the target) and tight (within 1% of it).
    assert 0.99 * delta <= achieved <= delta
    assert sigma == pytest.approx(_gaussian_exact_sigma(eps, delta, sensitivity), rel=1e-5)


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-5), (0.5, 1e-6), (0.99, 1e-3)])
def test_analytic_gaussian_sigma_beats_classical_calibration(eps: float, delta: float) -> None:
    # Dwork & Roth (2014), Theorem A.1: sqrt(2 ln(1.25 / delta)) D / eps suffices for eps < 1.
    classical = math.sqrt(2 * math.log(1.25 / delta)) * 2.0 / eps
    assert analytic_gaussian_sigma(eps, delta, 2.0) < classical


def test_analytic_gaussian_sigma_is_linear_in_sensitivity() -> None:
    unit = analytic_gaussian_sigma(0.7, 1e-6, 1.0)
    for sens in (1e-6, 0.3, 1e3):
        assert analytic_gaussian_sigma(0.7, 1e-6, sens) == pytest.approx(sens * unit, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=1e-10, max_value=0.1),
    st.floats(min_value=1e-4, max_value=1e3),
)
def test_analytic_gaussian_sigma_never_exceeds_target_delta(
    eps: float, delta: float, sensitivity: float
) -> None:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity)
    assert _gaussian_delta(eps, sigma, sensitivity) <= delta * (1 + 1e-9)
    # And the event built from it passes its own consistency check.
    PrivacyEvent("gaussian", eps, sensitivity=sensitivity, scale=sigma, delta=delta)


@pytest.mark.parametrize(
    ("eps", "delta", "sens", "match"),
    [
        (0.0, 1e-5, 1.0, "epsilon"),
        (math.inf, 1e-5, 1.0, "epsilon"),
        (1.0, 0.0, 1.0, "delta"),
        (1.0, 1.0, 1.0, "delta"),
        (1.0, 1e-5, -1.0, "sensitivity"),
    ],
)
def test_analytic_gaussian_sigma_rejects_bad_input(
    eps: float, delta: float, sens: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        analytic_gaussian_sigma(eps, delta, sens)


def test_gaussian_event_accepts_calibrated_and_larger_sigma() -> None:
    exact = _gaussian_exact_sigma(1.0, 1e-5, 2.0)
    # The exact minimum (from the closed form, not dp_accounting) passes the 1e-6 slack.
    ev = PrivacyEvent("gaussian", 1.0, count=3, sensitivity=2.0, scale=exact, delta=1e-5)
    assert (ev.epsilon, ev.delta, ev.count, ev.sensitivity, ev.scale) == (1.0, 1e-5, 3, 2.0, exact)
    PrivacyEvent("gaussian", 1.0, sensitivity=2.0, scale=exact * (1 - 5e-7), delta=1e-5)
    PrivacyEvent("gaussian", 1.0, sensitivity=2.0, scale=10 * exact, delta=1e-5)


def test_gaussian_event_rejects_too_little_noise() -> None:
    exact = _gaussian_exact_sigma(1.0, 1e-5, 2.0)
    with pytest.raises(ValueError, match=r"sigma >= 7\.46"):
        PrivacyEvent("gaussian", 1.0, sensitivity=2.0, scale=exact * 0.999, delta=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mechanism": "gaussian", "epsilon": 1.0, "scale": 10.0, "delta": 1e-5}, "sensitivity"),
        ({"mechanism": "gaussian", "epsilon": 1.0, "sensitivity": 1.0, "delta": 1e-5}, "scale"),
        (
            {"mechanism": "gaussian", "epsilon": 1.0, "sensitivity": 1.0, "scale": 10.0},
            r"delta must lie in \(0, 1\), got 0.0",
        ),
        (
            {
                "mechanism": "gaussian",
                "epsilon": 1.0,
                "sensitivity": 1.0,
                "scale": 10.0,
                "delta": 1.0,
            },
            "got 1.0",
        ),
        ({"mechanism": "pure", "epsilon": 1.0, "delta": 1e-5}, "delta=1e-05"),
        ({"mechanism": "laplace", "epsilon": 1.0, "delta": 1e-5}, "pure"),
    ],
)
def test_gaussian_and_delta_fields_are_validated(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivacyEvent(**kwargs)  # type: ignore[arg-type]


def test_pure_events_keep_delta_zero() -> None:
    assert PrivacyEvent("pure", 0.1).delta == 0.0
    assert PrivacyEvent("laplace", 0.1, 2, 2.0).delta == 0.0


@pytest.mark.parametrize(
    ("sigma", "sens", "k", "delta"),
    [(5.0, 1.0, 1, 1e-5), (7.0, 2.0, 50, 1e-6), (0.02, 2 * math.sqrt(2) / 50, 3, 1e-3)],
)
def test_pld_gaussian_matches_closed_form(sigma: float, sens: float, k: int, delta: float) -> None:
    # k-fold composition of N(0, sigma^2) noise on sensitivity D is one Gaussian mechanism with
    # sensitivity sqrt(k) D. The PLD is pessimistic, by about one interval ((D / sigma) / 100).
    # The event states an (epsilon, delta) this noise achieves; the PLD uses sigma itself.
    eps_stated = max(1.0, 1.001 * _gaussian_exact_epsilon(sigma, sens, 0.5 * delta))
    event = PrivacyEvent(
        "gaussian", eps_stated, count=k, sensitivity=sens, scale=sigma, delta=0.5 * delta
    )
    exact = _gaussian_exact_epsilon(sigma, math.sqrt(k) * sens, delta)
    got = pld_epsilon([event], delta)
    assert exact - 1e-9 <= got <= exact + 3 * (sens / sigma) / 100


def test_pld_gaussian_at_its_calibration_point_gives_its_epsilon() -> None:
    sigma = analytic_gaussian_sigma(0.8, 1e-6, 2.0)
    event = PrivacyEvent("gaussian", 0.8, sensitivity=2.0, scale=sigma, delta=1e-6)
    assert pld_epsilon([event], 1e-6) == pytest.approx(0.8, abs=0.02 * 2.0 / sigma)


def test_pld_gaussian_composes_with_pure_events() -> None:
    sigma = analytic_gaussian_sigma(0.5, 1e-6, 1.0)
    gauss = PrivacyEvent("gaussian", 0.5, count=4, sensitivity=1.0, scale=sigma, delta=1e-6)
    lap = PrivacyEvent("laplace", 0.05, count=100, sensitivity=2.0)
    both = pld_epsilon([gauss, lap], 1e-5)
    # Composition costs more than either part, and no more than their sum at half the delta.
    assert max(pld_epsilon([gauss], 1e-5), pld_epsilon([lap], 1e-5)) < both
    assert both <= pld_epsilon([gauss], 0.5e-5) + pld_epsilon([lap], 0.5e-5)
    # Listing runs one by one is the same as counting them.
    assert pld_epsilon([dataclasses.replace(gauss, count=1)] * 4 + [lap], 1e-5) == pytest.approx(
        both, rel=1e-9
    )


def test_pld_pure_only_default_interval_unchanged() -> None:
    # The default discretization of pure-only compositions is eps_min / 100 (1 + 1e-9), as before
    # Gaussian events were supported.
    events = [PrivacyEvent("exponential", 0.01, 300), PrivacyEvent("laplace", 0.03, 100, 2.0)]
    assert pld_epsilon(events, 1e-4) == pytest.approx(
        pld_epsilon(events, 1e-4, value_discretization_interval=0.01 / 100 * (1 + 1e-9)),
        rel=1e-12,
    )


# --- Theorem 7 with (epsilon_l, delta_l) --------------------------------------------------------


def test_kairouz_epsilon_delta_pure_is_kairouz_epsilon() -> None:
    eps = [0.5, 0.01, 0.01, 0.2, 1.3, 0.01, 0.07] * 30
    got, total = kairouz_epsilon_delta(eps, [0.0] * len(eps), 1e-3)
    assert got == pytest.approx(kairouz_epsilon(eps, 1e-3), rel=1e-12)
    assert total == 1e-3


def test_kairouz_epsilon_delta_total_delta_formula() -> None:
    eps = [0.3, 0.1, 0.1]
    deltas = [1e-6, 0.0, 1e-3]
    got, total = kairouz_epsilon_delta(eps, deltas, 1e-4)
    assert got == pytest.approx(_theorem7_reference(eps, 1e-4), rel=1e-12)
    expected = 1 - (1 - 1e-4) * (1 - 1e-6) * (1 - 1e-3)
    assert total == pytest.approx(expected, rel=1e-12)


def test_kairouz_epsilon_delta_counts_equal_flattened_lists() -> None:
    grouped = kairouz_epsilon_delta([0.2, 0.01], [1e-7, 0.0], 1e-5, counts=[30, 500])
    flat = kairouz_epsilon_delta([0.2] * 30 + [0.01] * 500, [1e-7] * 30 + [0.0] * 500, 1e-5)
    assert grouped == pytest.approx(flat, rel=1e-12)
    # The total delta is 1 - (1 - dt) (1 - d)^n, accurate for tiny deltas (log space).
    assert grouped[1] == pytest.approx(1e-5 + 30 * 1e-7, rel=1e-4)


def test_kairouz_epsilon_delta_empty() -> None:
    assert kairouz_epsilon_delta([], [], 1e-3) == (0.0, 1e-3)


@pytest.mark.parametrize(
    ("eps", "deltas", "kwargs", "match"),
    [
        ([0.1, 0.2], [0.0], {}, "shape"),
        ([0.1], [1.0], {}, r"deltas\[0\] = 1.0"),
        ([0.1], [-1e-9], {}, "deltas"),
        ([0.0], [0.0], {}, "epsilons"),
        ([[0.1]], [[0.0]], {}, "1-D"),
        ([0.1], [0.0], {"counts": [0]}, r"counts\[0\] = 0"),
        ([0.1], [0.0], {"counts": [1.5]}, "counts"),
        ([0.1], [0.0], {"counts": [1, 2]}, "counts must have"),
    ],
)
def test_kairouz_epsilon_delta_rejects_bad_input(
    eps: list[float], deltas: list[float], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        kairouz_epsilon_delta(eps, deltas, 1e-3, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta_tilde"):
        kairouz_epsilon_delta([0.1], [0.0], 0.5)


def test_vacuous_epsilons_report_infinity_instead_of_overflowing() -> None:
    huge = PrivacyEvent("laplace", 1e5, 3, 2.0, scale=2e-5)
    assert pld_epsilon([huge], 1e-6) == math.inf
    assert advanced_composition_epsilon(1e5, 3, 1e-6) == math.inf
    assert pld_epsilon([PrivacyEvent("pure", 1000.0, 2)], 1e-6) == math.inf


# --- approximate (epsilon, delta) events -------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "delta", "k"), [(0.05, 0.01, 4), (0.3, 1e-3, 9), (0.01, 0.0095, 16), (1.0, 1e-6, 2)]
)
@pytest.mark.parametrize("d0", [1e-6, 1e-4, 1e-2])
def test_pld_approximate_events_cost_at_most_pure_plus_their_infinite_mass(
    eps: float, delta: float, k: int, d0: float
) -> None:
    """k runs of an (eps, delta)-DP mechanism are dominated by randomized response that fails
    outright with probability delta each: infinite loss with mass m = 1 - (1 - delta)^k, the
    pure k-fold law elsewhere (scaled by (1 - delta)^k). Hence at total delta d0 + m the epsilon
    is at most the pure k-fold epsilon at d0, and no finite epsilon holds below m."""
    approximate = [PrivacyEvent("approximate", eps, k, delta=delta)]
    mass = 1.0 - (1.0 - delta) ** k
    pure_at_d0 = pld_epsilon([PrivacyEvent("pure", eps, k)], d0)
    got = pld_epsilon(approximate, d0 + mass)
    assert got <= pure_at_d0
    assert got <= _exact_pure_epsilon(eps, k, d0) + 2 * eps / 100  # one rounding bucket or two
    assert pld_epsilon(approximate, mass * (1 - 1e-6)) == math.inf
    assert pld_epsilon(approximate, mass / 2) == math.inf
    # Listing the runs one by one or as a count is the same event.
    listed = [PrivacyEvent("approximate", eps, 1, delta=delta)] * k
    assert pld_epsilon(listed, d0 + mass) == pytest.approx(got, rel=1e-9)


# ------------------------------------------------------------------------------------ zCDP
# The reference value: Steinke's cdp2adp.cdp_rho(1, 1e-6), which AIM and MST call.
ZCDP_RHO_1_1E6 = 0.024355970359538


def test_zcdp_rho_known_answer() -> None:
    assert zcdp_rho(1.0, 1e-6) == pytest.approx(ZCDP_RHO_1_1E6, rel=1e-10)
    # The bisection keeps the lower side: converting back never exceeds the target.
    assert zcdp_delta(zcdp_rho(1.0, 1e-6), 1.0) <= 1e-6


@pytest.mark.parametrize("rho", [1e-4, 0.0243, 0.5, 3.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_zcdp_epsilon_within_classical_bound_and_round_trips(rho: float, delta: float) -> None:
    eps = zcdp_epsilon(rho, delta)
    classical = rho + 2 * math.sqrt(rho * math.log(1 / delta))  # Bun & Steinke, Prop. 1.3
    assert 0 < eps <= classical
    assert zcdp_delta(rho, eps) <= delta * (1 + 1e-9)
    assert zcdp_rho(eps, delta) == pytest.approx(rho, rel=1e-6)


@pytest.mark.parametrize("rho", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_zcdp_delta_below_closed_forms(rho: float, eps: float) -> None:
    """The minimised delta is below its formula at any fixed alpha and below the standard
    bound exp(-(eps - rho)^2 / (4 rho)) (eps >= rho)."""
    got = zcdp_delta(rho, eps)
    for alpha in (1.5, 2.0, 5.0, 20.0):
        at_alpha = math.exp((alpha - 1) * (alpha * rho - eps)) / (alpha - 1)
        at_alpha *= (1 - 1 / alpha) ** alpha
        assert got <= min(1.0, at_alpha) * (1 + 1e-9)
    if eps >= rho:
        assert got <= math.exp(-((eps - rho) ** 2) / (4 * rho)) * (1 + 1e-9)


@pytest.mark.parametrize("sigma", [0.5, 2.0, 25.0])
def test_gaussian_zcdp_is_sound_against_the_exact_gaussian(sigma: float) -> None:
    rho = gaussian_zcdp_rho(sigma)
    assert rho == pytest.approx(1 / (2 * sigma**2), rel=1e-15)
    assert gaussian_zcdp_rho(3 * sigma, 3.0) == pytest.approx(rho, rel=1e-12)
    # The zCDP conversion is an upper bound on the Gaussian's exact epsilon: the analytic
    # calibration at that (epsilon, delta) needs no more noise than sigma.
    eps = zcdp_epsilon(rho, 1e-6)
    assert analytic_gaussian_sigma(eps, 1e-6) <= sigma * (1 + 1e-6)


def test_exponential_zcdp_rho_closed_form() -> None:
    assert exponential_zcdp_rho(0.2) == pytest.approx(0.2**2 / 8, rel=1e-15)


def test_zcdp_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="-1"):
        zcdp_delta(-1.0, 1.0)
    with pytest.raises(ValueError, match="delta"):
        zcdp_epsilon(0.1, 1.5)
    with pytest.raises(ValueError, match="0"):
        zcdp_rho(0.0, 1e-6)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_zcdp_rho(0.0)
    assert zcdp_delta(0.0, 1.0) == 0.0 and zcdp_epsilon(0.0, 1e-6) == 0.0


def test_loading_the_pld_library_leaves_nothing_for_a_cape_cost_to_import() -> None:
    """An owner imports ``dp_accounting`` at start (:func:`load_pld_library`) so that its first
    CAPE open, which computes the job's cost by PLD under the curator's deadline, imports
    nothing: in a fresh interpreter, the cost of a training adds no ``dp_accounting`` module
    (the control: without the load, it adds some)."""
    script = """
import sys
from dpmarket.common.cape.spec import CapeTrainingSpec
from dpmarket.common.privacy.accounting import load_pld_library
if sys.argv[1] == "load":
    load_pld_library()
before = {m for m in sys.modules if m.startswith("dp_accounting")}
CapeTrainingSpec((("x", 0.0, 1.0),), "y", 1.0, 1e-6, 20, 0.5, 2, 1.0).cost
print(len({m for m in sys.modules if m.startswith("dp_accounting")} - before))
"""
    added = {
        mode: int(
            subprocess.run(
                [sys.executable, "-c", script, mode], check=True, capture_output=True, text=True
            ).stdout
        )
        for mode in ("load", "control")
    }
    assert added == {"load": 0, "control": added["control"]} and added["control"] > 0


def test_the_start_up_import_and_a_first_request_importing_at_once_both_succeed() -> None:
    """An owner starts :func:`load_pld_library` in a thread and may serve a CAPE open at once,
    whose cost imports ``dp_accounting`` too. ``dp_accounting.pld``'s modules import one
    another, so two threads importing two of them at once could each hold one module's import
    lock and need the other's: Python then handed one of them a partially initialized module.
    A CI run lost a CAPE open to it (``AttributeError: partially initialized module
    'dp_accounting.pld.privacy_loss_mechanism'``, then ``KeyError: 'dp_accounting.pld'``).

    A fresh interpreter whose ``dp_accounting`` imports are slowed (0.2 s per module, in the
    start-up thread only) makes the interleaving certain: the start-up thread is mid-import
    when the request computes a Gaussian calibration. Neither may raise. (Control, before the
    import lock: the start-up thread raised ``_DeadlockError`` on 5 of 5 runs.)"""
    script = """
import importlib.abc, importlib.machinery, sys, threading, time
slow = threading.local()
failures = []

class SlowLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner
    def create_module(self, spec):
        return self.inner.create_module(spec)
    def exec_module(self, module):
        if getattr(slow, "on", False):
            time.sleep(0.2)
        self.inner.exec_module(module)

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.startswith("dp_accounting"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = SlowLoader(spec.loader)
        return spec

sys.meta_path.insert(0, Finder())
threading.excepthook = lambda args: failures.append(repr(args.exc_value))
from dpmarket.common.privacy.accounting import PrivacyEvent, load_pld_library

def start_up():
    slow.on = True
    load_pld_library()

thread = threading.Thread(target=start_up)
thread.start()
time.sleep(0.3)
try:
    PrivacyEvent("gaussian", 1.0, delta=1e-6, sensitivity=1.0, scale=5.0)
except Exception as exc:
    failures.append(repr(exc))
thread.join()
print(failures)
"""
    run = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
