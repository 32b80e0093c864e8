"""Tests for dpmarket.common.privacy.ledger: per-party charges, budgets, reports."""

from __future__ import annotations

import json
import math

import pytest

from dpmarket.common.privacy.accounting import (
    PrivacyEvent,
    advanced_composition_epsilon,
    analytic_gaussian_sigma,
    kairouz_epsilon,
    kairouz_epsilon_delta,
    kairouz_epsilon_homogeneous,
    pld_epsilon,
)
from dpmarket.common.privacy.ledger import BudgetExceededError, Charge, PrivacyLedger

DT = 0.01


def _h2_charges(party: str, eps: float, iterations: int, label: str = "h2") -> list[Charge]:
    """What one calibrated MWEM call costs: T selections and T Laplace measurements."""
    return [
        Charge(party, f"{label} selections", PrivacyEvent("exponential", eps, count=iterations)),  # type: ignore[arg-type]
        Charge(
            party,  # type: ignore[arg-type]
            f"{label} measurements",
            PrivacyEvent("laplace", eps, count=iterations, sensitivity=2.0),
        ),
    ]


def test_charges_accumulate_per_party() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    ledger.charge(_h2_charges("validation", 0.01, 100, "h2(D_v)"))
    ledger.charge(_h2_charges("owners", 0.002, 5, "h2(D_s) epoch 1"))
    ledger.charge(_h2_charges("owners", 0.002, 5, "h2(D_s) epoch 2"))
    assert len(ledger.entries) == 6
    assert ledger.epsilon("validation", method="basic") == pytest.approx(200 * 0.01)
    assert ledger.epsilon("owners", method="basic") == pytest.approx(20 * 0.002)
    assert ledger.epsilon("validation") == pytest.approx(
        kairouz_epsilon_homogeneous(0.01, 200, DT), rel=1e-12
    )
    assert ledger.epsilon("owners") == pytest.approx(kairouz_epsilon([0.002] * 20, DT), rel=1e-12)
    assert ledger.epsilon("validation", method="advanced") == pytest.approx(
        advanced_composition_epsilon(0.01, 200, DT)
    )
    assert ledger.epsilon("owners", method="pld") == pytest.approx(
        pld_epsilon([c.event for c in ledger.entries if c.party == "owners"], DT)
    )


def test_methods_are_ordered_pld_theorem7_basic() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    ledger.charge(_h2_charges("validation", 0.01, 1656))
    pld = ledger.epsilon("validation", method="pld")
    t7 = ledger.epsilon("validation", method="theorem7")
    basic = ledger.epsilon("validation", method="basic")
    assert 0 < pld < t7 < basic


def test_empty_party_is_zero() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    for method in ("theorem7", "advanced", "pld", "basic"):
        assert ledger.epsilon("owners", method=method) == 0.0  # type: ignore[arg-type]


def test_public_events_are_listed_but_not_counted() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"owners": 0.1})
    public = Charge("public", "h2(seed set)", PrivacyEvent("pure", 100.0, count=1000))
    ledger.charge([public])
    assert ledger.entries == (public,)
    assert ledger.epsilon("public") == 0.0
    assert ledger.epsilon("owners") == 0.0
    report = ledger.report()
    assert report.parties["public"].theorem7 == 0.0
    assert report.entries[0].party == "public"


def test_check_raises_and_records_nothing() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"validation": 1.0})
    ledger.charge(_h2_charges("validation", 0.01, 100))
    spent = ledger.epsilon("validation")
    before = ledger.entries
    too_much = _h2_charges("validation", 0.01, 1656)
    with pytest.raises(BudgetExceededError) as info:
        ledger.check(too_much)
    message = str(info.value)
    would_be = kairouz_epsilon_homogeneous(0.01, 200 + 2 * 1656, DT)
    assert "'validation'" in message
    assert f"{spent:.6g}" in message
    assert f"{would_be:.6g}" in message
    assert "budget 1" in message
    assert ledger.entries == before
    assert ledger.epsilon("validation") == spent
    # check() on an affordable charge records nothing either.
    ledger.check(_h2_charges("validation", 0.01, 10))
    assert ledger.entries == before


def test_charge_is_all_or_nothing() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"owners": 0.5})
    ok = Charge("owners", "auction", PrivacyEvent("pure", 0.01, count=3))
    # The first charge alone fits, the second pushes the owners over: nothing is recorded.
    with pytest.raises(BudgetExceededError, match="owners"):
        ledger.charge([ok, Charge("owners", "big", PrivacyEvent("pure", 0.6))])
    assert ledger.entries == ()
    # A charge that fails validation midway records nothing either.
    with pytest.raises(ValueError, match=r"charges\[1\]"):
        ledger.charge([ok, "not a charge"])  # type: ignore[list-item]
    assert ledger.entries == ()
    ledger.charge([ok])
    assert ledger.entries == (ok,)


def test_budget_of_one_party_does_not_limit_another() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"validation": 0.05})
    ledger.charge([Charge("owners", "x", PrivacyEvent("pure", 10.0))])
    with pytest.raises(BudgetExceededError, match="validation"):
        ledger.charge([Charge("validation", "y", PrivacyEvent("pure", 0.06))])
    assert ledger.epsilon("owners", method="basic") == 10.0


def test_budget_boundary_uses_theorem7_not_basic() -> None:
    # 400 mechanisms at 0.01: basic sum 4.0, Theorem 7 about 1.0; a budget of 1.5 admits them.
    t7 = kairouz_epsilon_homogeneous(0.01, 400, DT)
    assert t7 < 1.5 < 4.0
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"validation": 1.5})
    ledger.charge(_h2_charges("validation", 0.01, 200))
    assert ledger.epsilon("validation") == pytest.approx(t7)


def test_advanced_requires_one_epsilon() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    ledger.charge([Charge("owners", "a", PrivacyEvent("pure", 0.01))])
    ledger.charge([Charge("owners", "b", PrivacyEvent("pure", 0.02))])
    with pytest.raises(ValueError, match="distinct"):
        ledger.epsilon("owners", method="advanced")
    assert ledger.report().parties["owners"].advanced is None


def test_report_is_json_serialisable_and_complete() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"validation": 2.0})
    ledger.charge(_h2_charges("validation", 0.01, 50))
    ledger.charge([Charge("owners", "auction", PrivacyEvent("pure", 0.003, count=7))])
    report = json.loads(json.dumps(ledger.report().to_json()))
    assert report["delta_tilde"] == DT
    assert set(report["parties"]) == {"validation", "owners", "public"}
    val = report["parties"]["validation"]
    for method in ("theorem7", "advanced", "pld", "basic"):
        assert val[method] == pytest.approx(ledger.epsilon("validation", method=method))  # type: ignore[arg-type]
    assert val["budget"] == 2.0
    assert val["mechanisms"] == 100
    assert val["delta_total"] == DT  # all events pure: Theorem 7 holds at delta_tilde
    assert report["parties"]["public"]["delta_total"] == DT
    assert report["entries"][0]["event"]["delta"] == 0.0
    assert report["parties"]["owners"]["budget"] is None
    assert len(report["entries"]) == 3
    assert report["entries"][1]["event"]["scale"] == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"delta_tilde": 0.0}, "delta_tilde"),
        ({"delta_tilde": 0.5}, "delta_tilde"),
        ({"delta_tilde": DT, "budgets": {"public": 1.0}}, "public"),
        ({"delta_tilde": DT, "budgets": {"consumer": 1.0}}, "consumer"),
        ({"delta_tilde": DT, "budgets": {"owners": 0.0}}, "owners"),
        ({"delta_tilde": DT, "budgets": {"owners": math.inf}}, "inf"),
    ],
)
def test_ledger_rejects_bad_configuration(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PrivacyLedger(**kwargs)  # type: ignore[arg-type]


def test_bad_queries_and_charges_are_rejected() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    with pytest.raises(ValueError, match="party"):
        ledger.epsilon("consumer")
    with pytest.raises(ValueError, match="method"):
        ledger.epsilon("owners", method="rdp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="party"):
        Charge("everyone", "x", PrivacyEvent("pure", 1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="PrivacyEvent"):
        Charge("owners", "x", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single Charge"):
        ledger.charge(Charge("owners", "x", PrivacyEvent("pure", 1.0)))  # type: ignore[arg-type]


# --- Gaussian events ----------------------------------------------------------------------------


def _gaussian(eps: float, delta: float, count: int, sensitivity: float = 1.0) -> PrivacyEvent:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity)
    return PrivacyEvent("gaussian", eps, count, sensitivity, scale=sigma, delta=delta)


def test_gaussian_charges_report_theorem7_at_total_delta() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    gauss = _gaussian(0.5, 1e-6, count=3, sensitivity=2.0)
    ledger.charge([Charge("validation", "gtilde", gauss)])
    ledger.charge(_h2_charges("validation", 0.01, 100))
    events = [c.event for c in ledger.entries]
    t7, total = kairouz_epsilon_delta(
        [e.epsilon for e in events],
        [e.delta for e in events],
        DT,
        counts=[e.count for e in events],
    )
    assert ledger.epsilon("validation") == pytest.approx(t7, rel=1e-12)
    assert ledger.delta_total("validation") == pytest.approx(total, rel=1e-12)
    assert total == pytest.approx(1 - (1 - DT) * (1 - 1e-6) ** 3, rel=1e-9)
    assert ledger.epsilon("validation", method="basic") == pytest.approx(3 * 0.5 + 200 * 0.01)
    # The PLD composes the Gaussian noise exactly and stays at delta_tilde.
    assert ledger.epsilon("validation", method="pld") == pytest.approx(
        pld_epsilon(events, DT), rel=1e-12
    )
    with pytest.raises(ValueError, match="gaussian"):
        ledger.epsilon("validation", method="advanced")
    report = json.loads(json.dumps(ledger.report().to_json()))
    row = report["parties"]["validation"]
    assert row["delta_total"] == pytest.approx(total, rel=1e-12)
    assert row["theorem7"] == pytest.approx(t7, rel=1e-12)
    assert row["advanced"] is None
    assert row["mechanisms"] == 203
    assert report["entries"][0]["event"]["delta"] == 1e-6
    assert report["entries"][0]["event"]["mechanism"] == "gaussian"
    # Other parties are untouched.
    assert report["parties"]["owners"]["delta_total"] == DT
    assert ledger.delta_total("owners") == DT


def test_gaussian_charges_count_against_budgets() -> None:
    ledger = PrivacyLedger(delta_tilde=DT, budgets={"owners": 1.0})
    ledger.charge([Charge("owners", "a", _gaussian(0.6, 1e-6, count=1))])
    with pytest.raises(BudgetExceededError, match="owners"):
        ledger.charge([Charge("owners", "b", _gaussian(0.6, 1e-6, count=1))])
    assert ledger.delta_total("owners") == pytest.approx(1 - (1 - DT) * (1 - 1e-6), rel=1e-12)


def test_pure_only_ledger_is_unchanged_by_gaussian_support() -> None:
    ledger = PrivacyLedger(delta_tilde=DT)
    ledger.charge(_h2_charges("owners", 0.002, 500))
    ledger.charge([Charge("owners", "auction", PrivacyEvent("pure", 0.03, count=4))])
    flat = [0.002] * 1000 + [0.03] * 4
    assert ledger.epsilon("owners") == pytest.approx(kairouz_epsilon(flat, DT), rel=1e-12)
    assert ledger.delta_total("owners") == DT


def test_delta_total_rejects_unknown_party() -> None:
    with pytest.raises(ValueError, match="consumer"):
        PrivacyLedger(delta_tilde=DT).delta_total("consumer")
