"""The default method on both allocation paths, at epsilon 1 and 1,000, with the seed spread.

Issue 27 asks the suite to separate what privacy costs from what the method costs, on both paths
a deployment can take:

* **counts**: no owner has published a sketch, so the candidates method splits its budget by
  the owners' Laplace-noised relevance counts (what a deployment made by ``dpmarket init`` and
  ``up`` uses: the session's default configuration, no catalogue);
* **sketch**: every owner's RFF sketch is published (in process, at the same epsilon as every
  other party, kernel scale ``SKETCH_SCALE / sqrt(2 gamma)`` as ``docs/reference.md``
  recommends) and the curator splits the budget by them.

Each runs the session's default configuration at epsilon = 1 per party (the goal's setting) and
at epsilon = 1,000 per party (every release all but noise-free: the method's own cost), delta =
1e-6, over session seeds 0 .. n-1. Per scenario it reports the geometric mean over seeds of the
summary's MMD² to D_v over three references:

* exact greedy on the pooled data with the same gamma, the summary alone
  (:func:`dpmarket.experiments.suite.exact_greedy_reference`);
* non-private greedy on the same random Fourier features (:func:`rff_greedy_reference`: the
  session's h1, d = 140, on the pooled data, no seed set), the goal's reference at epsilon
  1,000;
* uniform sampling (p/K points per owner, the same session seed);

and the seed-to-seed spread: the worst seed's MMD² over the median seed's.

Every run is cached on disk beside :class:`dpmarket.experiments.suite_eval.SuiteRunner`'s, keyed
by the scenario's digest, every configuration field, the path, the sketches' scale and epsilon,
and the seed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from dpmarket.common.summarization.kernels import rff_greedy
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.summary import SummarizationConfig
from dpmarket.experiments.scenarios import Scenario
from dpmarket.experiments.suite import SUITE_NAMES, scenario_digest
from dpmarket.experiments.suite_eval import (
    DEFAULT_SETTING,
    DELTA,
    EPSILON,
    SuiteRunner,
    SuiteSetting,
    _cached,
    _digest,
    _geomean,
    _labels,
    _measure,
    _table,
    run_suite,
)
from dpmarket.experiments.suite_split import Half, load_split, require_design

__all__ = [
    "EPSILONS",
    "GOALS",
    "PATHS",
    "PathSetting",
    "PathsRunner",
    "aggregate_paths",
    "half_names",
    "path_summary",
    "paths_markdown",
    "paths_table",
    "rff_greedy_reference",
    "run_half",
]

Path_ = Literal["counts", "sketch"]
#: The two allocation paths, in report order.
PATHS: tuple[Path_, ...] = ("counts", "sketch")
#: Every party's epsilon: the goal's, and all but noise-free.
EPSILONS: tuple[float, ...] = (1.0, 1000.0)
#: Owners' sketches of a run with session seed s are released with noise seed s + this (as
#: :class:`~dpmarket.experiments.suite_eval.SuiteRunner`).
_SKETCH_SEED_OFFSET = 1000
#: Issue 27's goals (epsilon 1 per party, delta 1e-6): median and every scenario's ratio to
#: exact greedy; at epsilon 1,000 every scenario's ratio to non-private RFF greedy; the worst
#: of 8 seeds over the median seed.
GOALS: dict[str, float] = {
    "median_over_exact_max": 2.0,
    "worst_over_exact_max": 5.0,
    "noise_free_over_rff_max": 1.5,
    "worst_seed_over_median_max": 3.0,
}


@dataclass(frozen=True)
class PathSetting:
    """One measured configuration: the allocation path, every party's epsilon, the method's
    constants.

    Attributes
    ----------
    path : {"counts", "sketch"}
    epsilon : float
        Every party's epsilon (validation set, owners' counts, owners' sketches), > 0.
    setting : SuiteSetting
        The method's constants (default: the session's defaults and the suite's sketch scale).
    """

    path: Path_
    epsilon: float
    setting: SuiteSetting = DEFAULT_SETTING

    @property
    def label(self) -> str:
        """A short, stable description."""
        return f"{self.path} eps={self.epsilon:g}"

    def config(self, scenario: Scenario) -> SummarizationConfig:
        """The session configuration on ``scenario`` at this epsilon."""
        return replace(
            self.setting.config(scenario),
            epsilon_validation_total=self.epsilon,
            epsilon_owners_total=self.epsilon,
        )


def rff_greedy_reference(scenario: Scenario, seed: int, d: int) -> np.ndarray:
    """Indices (into the pooled owners' points) of non-private greedy on the session's h1.

    h1's parameters are drawn as a session with seed ``seed`` draws them (the first draw of
    ``numpy.random.default_rng(seed)``:
    :func:`~dpmarket.common.summarization.rff.draw_rff_params`, checked against a session in
    the tests); the greedy (:func:`~dpmarket.common.summarization.kernels.rff_greedy`) matches
    the exact mean h1 of D_v with the pooled points' float32 features, as an owner scores them,
    no seed set.

    Returns
    -------
    ndarray of shape (p,), int64
    """
    params = draw_rff_params(scenario.n_features, d, scenario.gamma, np.random.default_rng(seed))
    pool = np.concatenate([o.features for o in scenario.owners])
    features = random_fourier_features(pool, params)
    validation = random_fourier_features(scenario.validation, params, dtype=np.float64)
    empty = np.zeros((0, d))
    return rff_greedy(features, validation, empty, scenario.default_p)


class PathsRunner:
    """Runs (and caches) the default on both paths and epsilons, and the RFF-greedy reference.

    Parameters
    ----------
    runner : SuiteRunner
        Its cache directory, scenarios and baselines (exact greedy, uniform) are shared.
    """

    def __init__(self, runner: SuiteRunner) -> None:
        self.runner = runner
        self._sketches: dict[tuple[str, float, float, int], Any] = {}

    def sketches(self, name: str, sketch_scale: float, epsilon: float, seed: int) -> Any:
        """Every owner's sketch released in process at ``epsilon`` (Gaussian, delta 1e-6)."""
        from dpmarket.experiments.runner import publish_sketches

        key = (name, float(sketch_scale), float(epsilon), seed)
        if key not in self._sketches:
            scenario = self.runner.scenario(name, sketch_scale)
            self._sketches[key] = publish_sketches(
                scenario.owners,
                scenario.sketch_mechanism(epsilon, delta=DELTA),
                seed=_SKETCH_SEED_OFFSET + seed,
            )
        return self._sketches[key]

    def run(self, ps: PathSetting, name: str, seed: int) -> dict[str, Any]:
        """One session of ``ps`` on scenario ``name`` with session seed ``seed`` (the sketch
        path at epsilon 1 is :meth:`SuiteRunner.run`'s run, the same session)."""
        if ps.path == "sketch" and ps.epsilon == EPSILON:
            return self.runner.run(ps.setting, name, seed)
        scale = ps.setting.sketch_scale
        scenario = self.runner.scenario(name, scale)
        record = self.runner.session(
            ("path-run", "path"),
            scenario,
            ps.config(scenario),
            seed,
            lambda: self.sketches(name, scale, ps.epsilon, seed) if ps.path == "sketch" else None,
            f"path={ps.path} sketch_scale={scale!r} sketch_epsilon={ps.epsilon!r}",
        )
        if record["allocation"] != ps.path:
            raise RuntimeError(
                f"{name}: the {ps.path} path ran the {record['allocation']} allocation"
            )
        return record

    def rff_greedy(self, name: str, seed: int) -> dict[str, Any]:
        """Non-private greedy on the session's h1 (:func:`rff_greedy_reference`), measured."""
        scenario = self.runner.scenario(name)
        d = DEFAULT_SETTING.config(scenario).rff_dimension
        digest = scenario_digest(scenario, scenario.default_p)
        key = _digest("rff-greedy", digest, f"d={d}", str(seed))

        def compute() -> dict[str, Any]:
            chosen = rff_greedy_reference(scenario, seed, d)
            pool = np.concatenate([o.features for o in scenario.owners])
            labels = np.concatenate([_labels(o) for o in scenario.owners])
            return _measure(scenario, pool[chosen], labels[chosen], seed)

        return _cached(self.runner.cache_dir / "runs" / f"rff-{key}.json", compute)


def path_summary(
    paths: PathsRunner, ps: PathSetting, name: str, seeds: Sequence[int]
) -> dict[str, Any]:
    """``ps`` on one scenario over ``seeds``: geometric-mean ratios to exact greedy, RFF greedy
    and uniform sampling; the worst seed's ratio over the median seed's; runs above uniform."""
    runs = [paths.run(ps, name, s) for s in seeds]
    bases = [paths.runner.baselines(name, s) for s in seeds]
    rffs = [paths.rff_greedy(name, s) for s in seeds]
    exact = np.array([r["mmd2"] / b["exact"]["mmd2"] for r, b in zip(runs, bases, strict=True)])
    return {
        "scenario": name,
        "setting": ps.label,
        "seeds": list(seeds),
        "over_exact": _geomean(exact.tolist()),
        "over_exact_per_seed": exact.tolist(),
        "over_rff": _geomean([r["mmd2"] / f["mmd2"] for r, f in zip(runs, rffs, strict=True)]),
        "over_uniform": _geomean(
            [r["mmd2"] / b["uniform"]["mmd2"] for r, b in zip(runs, bases, strict=True)]
        ),
        "above_uniform": int(
            sum(r["mmd2"] > b["uniform"]["mmd2"] for r, b in zip(runs, bases, strict=True))
        ),
        "worst_over_median_seed": float(exact.max() / np.median(exact)),
        "hedge_kept": int(sum(r.get("hedge_kept") == "uniform sample" for r in runs)),
        "points_read": max(r["points_read"] for r in runs),
        "p": paths.runner.scenario(name).default_p,
        "rff_over_exact": _geomean(
            [f["mmd2"] / b["exact"]["mmd2"] for f, b in zip(rffs, bases, strict=True)]
        ),
        "uniform_over_exact": _geomean([b["uniform"]["mmd2"] / b["exact"]["mmd2"] for b in bases]),
    }


def aggregate_paths(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and worst over scenarios of one setting's rows, and the goals they meet."""
    exact = [r["over_exact"] for r in rows]
    rff = [r["over_rff"] for r in rows]
    spread = [r["worst_over_median_seed"] for r in rows]
    worst = int(np.argmax(exact))
    return {
        "median_over_exact": float(np.median(exact)),
        "worst_over_exact": float(max(exact)),
        "worst_scenario": rows[worst]["scenario"],
        "above_5x": int(sum(x > GOALS["worst_over_exact_max"] for x in exact)),
        "median_over_rff": float(np.median(rff)),
        "worst_over_rff": float(max(rff)),
        "worst_seed_spread": float(max(spread)),
        "spread_above_3x": int(sum(x > GOALS["worst_seed_over_median_max"] for x in spread)),
        "runs_above_uniform": int(sum(r["above_uniform"] for r in rows)),
        "runs": int(sum(len(r["seeds"]) for r in rows)),
    }


def paths_table(
    rows: Mapping[str, Sequence[Mapping[str, Any]]], names: Sequence[str], *, title: str
) -> Table:
    """Per scenario: the ratio to exact greedy on each path at epsilon 1 and 1,000, the ratio to
    RFF greedy at 1,000, the seed spread at epsilon 1, and the references' own ratios; then the
    median and worst rows.

    Parameters
    ----------
    rows : mapping of PathSetting label to rows (:func:`path_summary`, in ``names`` order)
    names : sequence of str
    """
    columns = [
        ("counts eps=1", "over_exact", "counts ε=1 × exact"),
        ("counts eps=1000", "over_exact", "ε=1000 × exact"),
        ("counts eps=1000", "over_rff", "ε=1000 × RFF"),
        ("counts eps=1", "worst_over_median_seed", "seeds worst/med"),
        ("sketch eps=1", "over_exact", "sketch ε=1 × exact"),
        ("sketch eps=1000", "over_exact", "ε=1000 × exact"),
        ("sketch eps=1000", "over_rff", "ε=1000 × RFF"),
        ("sketch eps=1", "worst_over_median_seed", "seeds worst/med"),
    ]
    table = _table(title, ["scenario", *[c[2] for c in columns], "RFF / uniform × exact"])
    for i, name in enumerate(names):
        cells = [f"{rows[label][i][key]:.2f}" for label, key, _ in columns]
        ref = rows["counts eps=1"][i]
        table.add_row(
            name, *cells, f"{ref['rff_over_exact']:.2f} / {ref['uniform_over_exact']:.0f}"
        )
    for stat, fn in (("median", np.median), ("worst", np.max)):
        cells = [f"{fn([r[key] for r in rows[label]]):.2f}" for label, key, _ in columns]
        table.add_row(f"[b]{stat}[/b]", *cells, "")
    return table


def half_names(half: Half, names: Sequence[str] | None = None) -> list[str]:
    """The scenarios of ``half`` in report order, or those of ``names`` (all in that half).

    Raises
    ------
    ValueError
        If a name is not in ``half`` (a held-out scenario is reported with ``half="held-out"``
        only, so that designing on the other half never shows it).
    """
    split = load_split()
    members = set(split.names(half))
    if names:
        outside = sorted(set(names) - members)
        if outside:
            raise ValueError(
                f"{', '.join(outside)} not in the {half} half of the suite's split; pass the "
                "half they are in"
            )
        members = set(names)
    return [n for n in SUITE_NAMES if n in members]


def run_half(
    out: Path,
    *,
    half: Half,
    seeds: int,
    loso: bool = False,
    hashes: bool = True,
    names: Sequence[str] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """``dpmarket lab evaluate --suite --half HALF``: the default's tables on one half of the suite.

    Runs :func:`dpmarket.experiments.suite_eval.run_suite` on the half's scenarios (the default
    at epsilon 1 on the sketch path against exact greedy, uniform sampling and uniform reads;
    the hashes mode; with ``loso``, the constants chosen by leave-one-scenario-out, which refuses
    a held-out scenario), then both allocation paths at epsilon 1 and 1,000 (:data:`PATHS`,
    :data:`EPSILONS`) with the seed spread, and writes everything to ``out/suite.json``.

    Raises
    ------
    HeldOutScenarioError
        If ``loso`` and a scenario is not in the design half.
    ValueError
        As :func:`half_names`.
    """
    from dpmarket.runtime.files import write_json

    console = console or Console()
    chosen = half_names(half, names)
    if loso:
        require_design(chosen, "leave-one-scenario-out (--loso)")
    start = time.perf_counter()
    document = run_suite(out, seeds=seeds, loso=loso, hashes=hashes, names=chosen, console=console)
    paths = PathsRunner(SuiteRunner(out / "cache"))
    seed_list = list(range(seeds))
    rows: dict[str, list[dict[str, Any]]] = {}
    for path in PATHS:
        for epsilon in EPSILONS:
            ps = PathSetting(path, epsilon)
            rows[ps.label] = []
            for name in chosen:
                rows[ps.label].append(path_summary(paths, ps, name, seed_list))
            console.print(f"  {half} half, {ps.label}: done")
    title = (
        f"{half} half: the default on both allocation paths (δ = 1e-6; every ratio a geometric "
        f"mean over seeds 0-{seeds - 1}; seeds worst/med at ε = 1)"
    )
    console.print(paths_table(rows, chosen, title=title))
    summary = {label: aggregate_paths(r) for label, r in rows.items()}
    for label, agg in summary.items():
        console.print(
            f"{label}: × exact median {agg['median_over_exact']:.2f}, worst "
            f"{agg['worst_over_exact']:.2f} ({agg['worst_scenario']}), {agg['above_5x']} above "
            f"5 ×; × RFF greedy median {agg['median_over_rff']:.2f}, worst "
            f"{agg['worst_over_rff']:.2f}; seed spread worst {agg['worst_seed_spread']:.2f} "
            f"({agg['spread_above_3x']} above 3); runs above uniform "
            f"{agg['runs_above_uniform']} of {agg['runs']}"
        )
    document["half"] = half
    document["paths"] = {"rows": rows, "summary": summary, "goals": GOALS}
    document["seconds_total"] = time.perf_counter() - start
    write_json(document, out / "suite.json")
    console.print(f"results -> {out / 'suite.json'} ({document['seconds_total']:.0f} s in all)")
    return document


def paths_markdown(rows: Mapping[str, Sequence[Mapping[str, Any]]], names: Sequence[str]) -> str:
    """:func:`paths_table` as a Markdown table (for docs/results.md), with the median and worst
    rows."""
    labels = [f"{path} eps={eps:g}" for path in PATHS for eps in EPSILONS]
    head = (
        "| scenario | counts ε=1 × exact | ε=1,000 × exact | ε=1,000 × RFF greedy | seeds worst / "
        "median (ε=1) | sketch ε=1 × exact | ε=1,000 × exact | ε=1,000 × RFF greedy | seeds "
        "worst / median (ε=1) | RFF greedy × exact | uniform × exact |"
    )
    lines = [head, "|" + " --- |" * 11]

    def cells(get: Any) -> list[str]:
        out = []
        for path in PATHS:
            one, free = (f"{path} eps={eps:g}" for eps in EPSILONS)
            out += [
                get(one, "over_exact"),
                get(free, "over_exact"),
                get(free, "over_rff"),
                get(one, "worst_over_median_seed"),
            ]
        return out

    for i, name in enumerate(names):
        ref = rows[labels[0]][i]
        row = cells(lambda label, key, i=i: f"{rows[label][i][key]:.2f}")
        lines.append(
            f"| {name} | "
            + " | ".join(row)
            + f" | {ref['rff_over_exact']:.2f} | {ref['uniform_over_exact']:.0f} |"
        )
    for stat, fn in (("median", np.median), ("worst", np.max)):
        row = cells(lambda label, key, fn=fn: f"**{fn([r[key] for r in rows[label]]):.2f}**")
        lines.append(f"| **{stat}** | " + " | ".join(row) + " | | |")
    return "\n".join(lines) + "\n"
