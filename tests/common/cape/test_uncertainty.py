"""Tests of dpmarket.common.cape.uncertainty: CAPE's intervals cover what they state at their
nominal rate, their controls do not, and the flags say when an answer needs care.

Coverage tests. Each repetition draws the whole job's noise afresh (the kernels' in-process
drivers, the curator's aggregation and fit) on the same data; its truth is the non-private
answer on the pooled data. Repetitions are independent, so the number of intervals of one
coefficient that cover is binomial. A test accepts a count in the central range of
``Binomial(R, p)`` that leaves out at most ``FAILURE / 2`` on each side, at ``p = 0.95`` for the
exact mean and, for a bootstrap, at the ends of ``[0.93, 0.97]`` (its coverage is nominal up to
the bootstrap's Monte Carlo error and the fit's curvature): if the true coverage lies there, each
assertion fails with probability at most ``FAILURE`` (at 300 repetitions the upper end only
refuses an interval that always covers; docs/results.md measures over-coverage on real data).
The controls leave out the collusion factor ``F`` (the interval of a pooled mechanism at the same
guarantee): their coverage is about 0.80 at ``F = 2.4`` and they fail the same bounds; on a weak
direction, the bootstrap of the released fit (the release's eigenvalue floor) fails them too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TypeVar

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.capefm import CapeFMPlan, run_baseline, run_capefm
from dpmarket.common.cape.functional_mechanism import (
    FMCoefficients,
    default_floor,
    fit_coefficients,
)
from dpmarket.common.cape.mean import CapeMeanPlan, run_cape_mean
from dpmarket.common.cape.privacy import collusion_factor
from dpmarket.common.cape.spec import INTERCEPT, CapeJobSpec
from dpmarket.common.cape.uncertainty import (
    Estimate,
    Flag,
    bootstrap_replicates,
    capefm_estimates,
    mean_estimates,
    noise_flags,
    training_estimates,
)
from dpmarket.common.privacy.noise import SeededNoise

FAILURE = 1e-4
#: Four sites, two of them colluders: F = 4 (4 + 2) / (2 (4 + 1)) = 2.4.
SITES, COLLUDERS = 4, 2
BOUNDS = np.array([[0.0, 10.0], [-1.0, 1.0]])


def _bounds(reps: int, low: float, high: float) -> tuple[int, int]:
    """Counts accepted out of ``reps``: above the ``FAILURE / 2`` lower quantile of
    ``Binomial(reps, low)`` and below the upper one of ``Binomial(reps, high)``."""
    return (
        int(stats.binom.ppf(FAILURE / 2, reps, low)),
        int(stats.binom.isf(FAILURE / 2, reps, high)),
    )


PlanT = TypeVar("PlanT", CapeMeanPlan, CapeFMPlan)


def _without_f(plan: PlanT) -> PlanT:
    """The plan with every site's noise divided by ``sqrt(F)``: what a pooled Gaussian mechanism
    at the same guarantee would add (the control's assumed noise)."""
    root = math.sqrt(collusion_factor(plan.sites, plan.colluders))
    if isinstance(plan, CapeMeanPlan):
        return dataclasses.replace(plan, site_scales=tuple(s / root for s in plan.site_scales))
    scaled = tuple({j: v / root for j, v in sc.items()} for sc in plan.site_scales)
    return dataclasses.replace(plan, site_scales=scaled)


# ------------------------------------------------------------------------------------ the mean
def test_mean_intervals_cover_the_pooled_mean_at_their_rate_and_without_f_they_do_not() -> None:
    """600 CAPE means of two columns over four sites (two colluders): each column's interval
    covers the pooled mean of the clamped records 95 % of the time; the same interval without the
    collusion factor covers about 80 % and fails the bound."""
    reps = 600
    rng = np.random.default_rng(0)
    sites = [rng.uniform(BOUNDS[:, 0], BOUNDS[:, 1], (n, 2)) for n in (30, 50, 40, 60)]
    truth = np.vstack(sites).mean(axis=0)
    covered = np.zeros(2, dtype=int)
    control = np.zeros(2, dtype=int)
    for r in range(reps):
        result = run_cape_mean(
            sites, BOUNDS, 1.0, 1e-6, SeededNoise(np.random.default_rng([r])), colluders=COLLUDERS
        )
        plan = result.plan
        assert collusion_factor(plan.sites, plan.colluders) == pytest.approx(2.4)
        for d, e in enumerate(mean_estimates(plan, result.estimate, ["a", "b"])):
            covered[d] += e.contains(truth[d])
        naive = mean_estimates(_without_f(plan), result.estimate, ["a", "b"])
        for d, e in enumerate(naive):
            control[d] += e.contains(truth[d])
    low, high = _bounds(reps, 0.95, 0.95)
    assert all(low <= c <= high for c in covered), (covered, low, high)
    assert all(c < low for c in control), (control, low)


def test_a_mean_states_its_construction_and_flags_a_value_outside_the_bounds() -> None:
    plan_bounds = np.array([[0.0, 1.0], [0.0, 1000.0]])
    sites = [np.full((3, 2), [0.0, 500.0])] * 2
    result = run_cape_mean(sites, plan_bounds, 1.0, 1e-6, SeededNoise(np.random.default_rng(1)))
    low_col, mid_col = mean_estimates(result.plan, [-0.5, 500.0], ["low", "mid"])
    sigma = result.plan.aggregator_std()
    assert low_col.standard_error == mid_col.standard_error == pytest.approx(sigma)
    # 500 -+ 1.96 sigma, cut to the column's bounds [0, 1000] (test below)
    assert mid_col.low == pytest.approx(max(0.0, 500.0 - 1.959963984540054 * sigma))
    assert mid_col.high == pytest.approx(min(1000.0, 500.0 + 1.959963984540054 * sigma))
    assert "clamped" in low_col.covers and low_col.method.startswith("analytic")
    assert {f.code for f in low_col.flags} >= {"outside_bounds", "sign_not_resolved"}
    assert low_col.reliable  # warnings only: the interval still means what it says
    with pytest.raises(ValueError, match="length 2"):
        mean_estimates(result.plan, [1.0], ["a"])


def test_a_mean_is_cut_to_its_columns_bounds_keeping_the_noise_and_flagged_uninformative() -> None:
    """Issue 28 (D5): a binary column beside a price column shares the price's noise std, so
    its raw estimate can land thousands outside [0, 1]. Control: the old code answered the raw
    estimate, -4862 in [-4862 -+ 1.96 sigma] (the reporter's [-11584, 1860]), outside [0, 1]
    and without ``uninformative``; now value and interval are cut to [0, 1] by explore's rule
    (:func:`dpmarket.common.uncertainty.cut_keeping_noise`) and flagged. No randomness in the
    assertions: the estimates are given."""
    plan_bounds = np.array([[0.0, 1.0], [0.0, 200000.0]])
    sites = [np.full((50, 2), [0.5, 60000.0])] * 2
    result = run_cape_mean(sites, plan_bounds, 1.0, 1e-6, SeededNoise(np.random.default_rng(1)))
    sigma = result.plan.aggregator_std()
    z = 1.959963984540054
    assert 1.0 < z * sigma < 50000.0  # the binary column's noise spans its bounds; price's not
    airco, price = mean_estimates(result.plan, [-4862.0, 60000.0], ["airco", "price"])
    assert 0.0 <= airco.value <= 1.0
    assert (airco.low, airco.high) == (0.0, 1.0)  # the noise's width, capped at the bounds'
    assert {f.code for f in airco.flags} >= {"outside_bounds", "uninformative"}
    assert "-4862" in next(f.reason for f in airco.flags if f.code == "outside_bounds")
    assert airco.reliable  # flags on the value: the interval still covers
    assert price.value == 60000.0
    assert (price.low, price.high) == pytest.approx((60000.0 - z * sigma, 60000.0 + z * sigma))
    assert "uninformative" not in {f.code for f in price.flags}
    # The cut never removes what the raw interval held inside the bounds, and keeps the noise's
    # 95 % half-width where the bounds allow it (a price estimate just inside its upper bound).
    rng = np.random.default_rng(28)
    for raw in rng.normal([0.5, 199000.0], 2 * sigma, size=(200, 2)):
        for d, e in enumerate(mean_estimates(result.plan, raw, ["airco", "price"])):
            lo_b, hi_b = plan_bounds[d]
            assert e.low is not None and e.high is not None
            assert lo_b <= e.low <= e.value <= e.high <= hi_b
            cut_low, cut_high = np.clip([raw[d] - z * sigma, raw[d] + z * sigma], lo_b, hi_b)
            assert e.low <= cut_low and e.high >= cut_high
            assert e.high - e.low >= min(z * sigma, hi_b - lo_b) * (1 - 1e-12)


# --------------------------------------------------------------------------------------- capeFM
def _synthetic(task: str, seed: int) -> tuple[CapeJobSpec, list[tuple[np.ndarray, np.ndarray]]]:
    """Three features in [-1, 1] over four sites of 1,500 rows: a well-determined fit."""
    rng = np.random.default_rng(seed)
    n, w = 6000, np.array([0.6, -0.4, 0.2])
    x = rng.uniform(-1.0, 1.0, (n, 3))
    if task == "linear":
        y = np.clip(x @ w + 0.3 * rng.standard_normal(n), -3.0, 3.0)
    else:
        y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-3.0 * (x @ w)))).astype(np.float64)
    spec = CapeJobSpec(
        task,  # type: ignore[arg-type]
        tuple((f"x{i}", -1.0, 1.0) for i in range(3)),
        ("y", -3.0, 3.0),
        1.0,
        1e-6,
        colluders=COLLUDERS,
    )
    xs, ys = spec.scaled(x, y)
    parts = np.array_split(np.arange(n), SITES)
    return spec, [(xs[p], ys[p]) for p in parts]


def _truth(spec: CapeJobSpec, sites: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    pooled = (np.vstack([x for x, _ in sites]), np.concatenate([y for _, y in sites]))
    noise = SeededNoise(np.random.default_rng(0))  # the non-private fit draws none
    fit = run_baseline(
        "nonprivate", [pooled], spec.task, 1.0, 1e-6, rng=np.random.default_rng(0), noise=noise
    )
    weights, intercept = spec.raw_coefficients(fit.w)
    return np.append(weights, intercept)


@pytest.mark.parametrize("task", ["linear", "logistic"])
def test_capefm_intervals_cover_the_pooled_fit_at_their_rate_and_without_f_they_do_not(
    task: str,
) -> None:
    """300 capeFM fits over four sites (two colluders): each raw coefficient's bootstrap interval
    (200 draws) covers the non-private fit on the pooled records at 0.93-0.97; the bootstrap of a
    plan without the collusion factor covers about 0.80 and fails the bound."""
    reps = 300
    spec, sites = _synthetic(task, 1)
    truth = _truth(spec, sites)
    raw_map = spec.raw_map()
    labels = spec.coefficient_labels
    covered = np.zeros(len(labels), dtype=int)
    control = np.zeros(len(labels), dtype=int)
    for r in range(reps):
        result = run_capefm(
            sites,
            spec.task,
            1.0,
            1e-6,
            np.random.default_rng(r),
            SeededNoise(np.random.default_rng([r, 1])),
            colluders=COLLUDERS,
        )
        assert result.fit.clipped == 0  # well determined: no flag voids the interval
        rng = np.random.default_rng([r, 2])
        estimates = capefm_estimates(
            result.plan, result.fit, labels, raw_map, rng, task_covers=spec.covers, replicates=200
        )
        assert all(e.reliable for e in estimates)
        covered += [e.contains(t) for e, t in zip(estimates, truth, strict=True)]
        naive = capefm_estimates(
            _without_f(result.plan),
            result.fit,
            labels,
            raw_map,
            rng,
            task_covers=spec.covers,
            replicates=200,
        )
        control += [e.contains(t) for e, t in zip(naive, truth, strict=True)]
    low, high = _bounds(reps, 0.93, 0.97)
    assert all(low <= c <= high for c in covered), (covered, low, high)
    assert all(c < low for c in control), (control, low)


def test_a_weak_direction_is_covered_and_the_bootstrap_of_the_released_fit_is_not() -> None:
    """A feature concentrated in a tenth of its bounds (sd 0.15 of [-1, 1]) gives the Gram matrix
    a weak direction that the release's floor (``2 sigma_2 sqrt(2 D)``) shrinks in every
    re-solve alike: 200 fits' intervals, built on the solve with a floor of one noise std, still
    cover at 0.93-0.97, while the bootstrap of the released fit covers that feature's coefficient
    about 18 % of the time (the control; docs/results.md measures the same on diamonds)."""
    reps = 200
    rng = np.random.default_rng(1)
    n = 6000
    x = np.column_stack(
        [
            rng.uniform(-1.0, 1.0, n),
            np.clip(rng.normal(0.3, 0.15, n), -1.0, 1.0),
            rng.uniform(-1.0, 1.0, n),
        ]
    )
    y = np.clip(x @ np.array([0.6, -2.0, 0.2]) + 0.3 * rng.standard_normal(n), -3.0, 3.0)
    spec = CapeJobSpec(
        "linear",
        tuple((f"x{i}", -1.0, 1.0) for i in range(3)),
        ("y", -3.0, 3.0),
        1.0,
        1e-6,
        colluders=COLLUDERS,
    )
    xs, ys = spec.scaled(x, y)
    sites = [(xs[p], ys[p]) for p in np.array_split(np.arange(n), SITES)]
    truth = _truth(spec, sites)
    labels, raw_map = spec.coefficient_labels, spec.raw_map()
    covered = np.zeros(len(labels), dtype=int)
    control = np.zeros(len(labels), dtype=int)
    for r in range(reps):
        result = run_capefm(
            sites,
            "linear",
            1.0,
            1e-6,
            np.random.default_rng(r),
            SeededNoise(np.random.default_rng([r, 1])),
            colluders=COLLUDERS,
        )
        assert result.fit.clipped  # the released value is shrunk
        rng_r = np.random.default_rng([r, 2])
        estimates = capefm_estimates(
            result.plan, result.fit, labels, raw_map, rng_r, task_covers=spec.covers, replicates=200
        )
        assert all(any(f.code == "shrunk" for f in e.flags) for e in estimates)
        covered += [e.contains(t) for e, t in zip(estimates, truth, strict=True)]
        released = capefm_estimates(
            result.plan,
            result.fit,
            labels,
            raw_map,
            rng_r,
            task_covers=spec.covers,
            replicates=200,
            interval_floor=result.fit.floor,
        )
        control += [e.contains(t) for e, t in zip(released, truth, strict=True)]
    low, high = _bounds(reps, 0.93, 0.97)
    assert all(low <= c <= high for c in covered), (covered, low, high)
    assert control[1] < low, (control, low)


def test_a_noise_dominated_fit_is_flagged_shrunk_undetermined_and_weak() -> None:
    """Few rows per site: the release's floor shrinks the value, an eigenvalue lies within the
    noise of 0 (``undetermined``), and coefficients whose interval contains 0 are flagged; every
    flag gives its reason.

    ``undetermined`` sits on the interval, so no such interval counts as trusted
    (:attr:`Estimate.reliable` is false; ``--json`` says ``"on": "interval"``): nothing
    guarantees a bounded interval's coverage where the data leave the fit undetermined (Dufour
    1997), and it was measured at 89.9-100 % per coefficient (docs/results.md). Control: the
    code before put the flag on the value (``on == "value"``), and every one of these intervals
    was reliable.
    """
    spec, sites = _synthetic("linear", 2)
    small = [(x[:40], y[:40]) for x, y in sites]
    result = run_capefm(
        small, "linear", 1.0, 1e-6, np.random.default_rng(0), SeededNoise(np.random.default_rng(3))
    )
    estimates = capefm_estimates(
        result.plan,
        result.fit,
        spec.coefficient_labels,
        spec.raw_map(),
        np.random.default_rng(4),
        task_covers=spec.covers,
    )
    codes = {f.code for e in estimates for f in e.flags}
    assert {"shrunk", "undetermined", "sign_not_resolved"} <= codes
    undetermined = [f for e in estimates for f in e.flags if f.code == "undetermined"]
    assert len(undetermined) == len(estimates)
    assert all(f.on == "interval" for f in undetermined)
    assert not any(e.reliable for e in estimates)
    rows = [e.to_json() for e in estimates]
    assert all({"code": "undetermined", "on": "interval"}.items() <= f.items()
               for r in rows for f in r["flags"] if f["code"] == "undetermined")  # fmt: skip
    # The interval is still reported (value, standard error, interval), only not trusted.
    assert all(r["interval"] is not None and r["standard_error"] is not None for r in rows)
    assert all(f.reason for e in estimates for f in e.flags)
    assert all(e.low is not None and e.low <= e.high for e in estimates)  # type: ignore[operator]
    # The reason says the interval does not hold its level, in both directions.
    assert all("does not hold its level" in f.reason for f in undetermined)


def test_an_undetermined_direction_is_covered_and_the_one_sigma_floor_is_not() -> None:
    """Two features nearly equal (x1 = x0 + N(0, 0.1)) with opposite slopes of 2: the fit lies
    along the Gram matrix's weak direction, whose eigenvalue is within one noise std of 0 in most
    of 200 fits (``undetermined``). Each coefficient's interval, built on a solve with a floor of
    INTERVAL_FLOOR_SIGMAS = 0.2 noise std, covers at least at the lower end of [0.93, 0.97]
    (failure probability 1e-4 per coefficient); the control, the same bootstrap on the solve
    with a floor of one noise std (what the intervals used before), shrinks every re-solve along
    that direction alike and covers the two slopes about 70 % of the time, failing the bound."""
    reps, n = 200, 400
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-1.0, 1.0, n)
    x = np.column_stack(
        [x0, np.clip(x0 + 0.1 * rng.standard_normal(n), -1.0, 1.0), rng.uniform(-1.0, 1.0, n)]
    )
    y = np.clip(x @ np.array([2.0, -2.0, 0.3]) + 0.3 * rng.standard_normal(n), -3.0, 3.0)
    spec = CapeJobSpec(
        "linear",
        tuple((f"x{i}", -1.0, 1.0) for i in range(3)),
        ("y", -3.0, 3.0),
        1.0,
        1e-6,
        colluders=COLLUDERS,
    )
    xs, ys = spec.scaled(x, y)
    sites = [(xs[p], ys[p]) for p in np.array_split(np.arange(n), SITES)]
    truth = _truth(spec, sites)
    labels, raw_map = spec.coefficient_labels, spec.raw_map()
    covered = np.zeros(len(labels), dtype=int)
    control = np.zeros(len(labels), dtype=int)
    undetermined = 0
    for r in range(reps):
        result = run_capefm(
            sites,
            "linear",
            1.0,
            1e-6,
            np.random.default_rng(r),
            SeededNoise(np.random.default_rng([r, 1])),
            colluders=COLLUDERS,
        )
        estimates = capefm_estimates(
            result.plan,
            result.fit,
            labels,
            raw_map,
            np.random.default_rng([r, 2]),
            task_covers=spec.covers,
            replicates=200,
        )
        undetermined += any(f.code == "undetermined" for f in estimates[0].flags)
        covered += [e.contains(t) for e, t in zip(estimates, truth, strict=True)]
        one_sigma = capefm_estimates(
            result.plan,
            result.fit,
            labels,
            raw_map,
            np.random.default_rng([r, 2]),
            interval_floor=result.plan.aggregator_scales(None)[2],
            task_covers=spec.covers,
            replicates=200,
        )
        control += [e.contains(t) for e, t in zip(one_sigma, truth, strict=True)]
    low, _ = _bounds(reps, 0.93, 0.97)
    assert undetermined > reps // 2, undetermined
    assert all(c >= low for c in covered), (covered, low)
    assert control[0] < low and control[1] < low, (control, low)


def test_estimates_are_in_raw_units_with_the_intercept_last() -> None:
    spec, sites = _synthetic("linear", 3)
    result = run_capefm(
        sites, "linear", 1.0, 1e-6, np.random.default_rng(0), SeededNoise(np.random.default_rng(5))
    )
    weights, intercept = spec.raw_coefficients(result.fit.w)
    estimates = capefm_estimates(
        result.plan,
        result.fit,
        spec.coefficient_labels,
        spec.raw_map(),
        np.random.default_rng(6),
        task_covers=spec.covers,
    )
    assert [e.label for e in estimates] == ["x0", "x1", "x2", INTERCEPT]
    np.testing.assert_allclose([e.value for e in estimates], [*weights, intercept], atol=1e-12)
    assert "least squares" in estimates[0].covers
    assert estimates[0].method.startswith("parametric bootstrap")
    rng = np.random.default_rng(7)
    m, c = spec.raw_map()
    for _ in range(5):
        w = rng.standard_normal(spec.dim)
        weights, intercept = spec.raw_coefficients(w)
        np.testing.assert_allclose(m @ w + c, [*weights, intercept], rtol=1e-12, atol=1e-9)


def test_bootstrap_replicates_shrink_with_the_dimension_within_bounds() -> None:
    assert bootstrap_replicates(3) == 1000
    assert bootstrap_replicates(100) == 200
    assert 200 <= bootstrap_replicates(60) < 1000


# ------------------------------------------------------------------------------- flags and JSON
def test_noise_flags_name_their_numbers() -> None:
    assert noise_flags(2.0, 0.5, 1.0, 3.0) == []
    flags = noise_flags(0.3, 0.5, -0.7, 1.3)
    assert [f.code for f in flags] == ["sign_not_resolved", "noise_dominates"]
    assert "[-0.7, 1.3]" in flags[0].reason and "0.5" in flags[1].reason


def test_a_network_carries_a_flag_without_an_interval() -> None:
    (e,) = training_estimates([0.25], ["b2"], learning_rate=2.0, last_noise_std=0.01)
    assert e.value == 0.25 and e.standard_error is None and e.low is None
    assert not e.reliable and not e.contains(0.25)
    (flag,) = e.flags
    assert flag.code == "no_interval" and "0.02" in flag.reason


def test_an_estimate_survives_json() -> None:
    e = Estimate(
        "bmi", 1.5, 0.2, 1.1, 1.9, 0.95, "analytic", "the pooled mean", (Flag("x", "why"),)
    )
    assert Estimate.from_json(json.loads(json.dumps(e.to_json()))) == e
    document = e.to_json()
    assert document["interval"] == [1.1, 1.9]
    assert document["flags"] == [{"code": "x", "on": "value", "reason": "why"}]
    with pytest.raises(ValueError, match="malformed"):
        Estimate.from_json({"label": "x"})


def test_weak_eigenvalues_are_covered_by_the_hull_and_not_by_the_floored_draws() -> None:
    """The geometry of Ecdat Computers' logistic regression (docs/results.md): the noise-free
    Gram matrix has eigenvalues 1.2, 1.5, 5 and 300 noise std, the fit lies along the second.
    The release is drawn from the aggregator's noise law (independent Gaussian entries of the
    plan's per-order std). A noisy eigenvalue often falls below 0 (``undetermined``); the
    bootstrap over every draw floors it at 0.2 std and puts the third coefficient's interval
    above the truth about 12 % of the time (882 of 1,000 covered at these seeds). The interval
    as reported, the hull of that bootstrap and of its positive semidefinite draws, covers each
    coefficient at least at the lower end of [0.93, 0.97] (failure probability 1e-4 per
    coefficient; 943 of 1,000 for the third); the control, the floored bootstrap alone
    (``hull=False``), fails that bound."""
    reps = 1000
    spec = CapeJobSpec("logistic", (("a", 0.0, 1.0), ("b", 0.0, 1.0), ("c", 0.0, 1.0)),
                       ("y", 0.0, 1.0), 1.0, 1e-6)  # fmt: skip
    plan = spec.plan([1000, 1000, 1000])
    scales = plan.aggregator_scales(None)
    d = plan.dim
    basis = np.linalg.qr(np.random.default_rng(0).standard_normal((d, d)))[0]
    lam2 = (basis * (np.array([1.2, 1.5, 5.0, 300.0]) * scales[2])) @ basis.T
    truth = basis @ (np.array([0.0, 20.0, 0.0, 1.0]) * scales[1] / scales[2])
    lam1 = -2.0 * lam2 @ truth
    raw_map = (np.eye(d), np.zeros(d))
    covered = np.zeros(d, dtype=int)
    control = np.zeros(d, dtype=int)
    for r in range(reps):
        noise = np.random.default_rng([r, 1])
        coefficients = FMCoefficients(
            math.log(2.0), lam1 + noise.normal(0.0, scales[1], d),
            lam2 + noise.normal(0.0, scales[2], (d, d)),
        )  # fmt: skip
        fit = fit_coefficients(
            coefficients, noise_std2=scales[2], floor=default_floor(d, scales[2]), scales=scales
        )
        for hull, tally in ((True, covered), (False, control)):
            estimates = capefm_estimates(
                plan, fit, list("abcd"), raw_map, np.random.default_rng([r, 2]),
                task_covers="", replicates=100, hull=hull,
            )  # fmt: skip
            tally += [e.contains(t) for e, t in zip(estimates, truth, strict=True)]
    low, _ = _bounds(reps, 0.93, 0.97)
    assert all(c >= low for c in covered), (covered, low)
    assert control[2] < low, (control, low)
