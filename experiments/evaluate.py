"""Evaluation harness: summary quality against privacy, over scenarios, sizes and seeds.

``dpmarket lab evaluate`` (``make evaluate``) runs every summarization method in one process
(:func:`dpmarket.experiments.runner.simulate`, the same protocol code as the services) on the
bundled scenarios, for several summary sizes ``p``, privacy targets ``epsilon`` and session seeds,
and measures each summary as the consumer would (:func:`dpmarket.consumer.report.evaluate_summary`).
It measures whether the private summary is worth buying: how close each private
method gets to uniform sampling and to the exact-kernel greedy reference, at what privacy cost and
how many raw owner points the curator reads.

Methods (:data:`EVAL_METHODS`):

``exact-greedy``
    Non-private greedy with the exact kernel on the pooled owners' data (reference; reads every
    point). Deterministic given the data, so it is computed once per (scenario, p) and measured
    per seed (the classifier's seed).
``greedy``
    Non-private greedy on exact mean RFF embeddings (session method ``"greedy"``).
``uniform``
    p/K points from every owner (session method ``"uniform"``).
``paper``
    Algorithm 3 (session method ``"private"``) with its per-iteration epsilons scaled by
    :func:`dpmarket.common.summarization.calibration.calibrate_paper_mode` so that each party's PLD
    epsilon at ``delta`` equals the target. PrivAuction is the pure-DP variant (``auction="pure"``,
    the default).
``paper-auction-printed``
    The same with PrivAuction as printed in Algorithm 3 (``auction="paper"``: rank 1 always
    asked). Calibrated as the pure auction (the calibration cannot scale the printed auction's
    delta away), so each bad iteration adds ``1 - exp(-eps_auc)`` to the owners' delta: the
    owners' PLD epsilon at ``delta`` is unbounded, and the session charges the owners the PLD
    epsilon at ``delta + 1 - (1 - (1 - exp(-eps_auc)))**tau`` instead (``owners_delta_spent``).
``candidates``
    The candidates method with ``epsilon_validation_total = epsilon_owners_total = epsilon`` at
    ``delta``; it re-ranks the candidates with the exact kernel. Its budget is split by the owners'
    sketches (the default allocation), each owner's released in-process at ``epsilon``
    (:meth:`dpmarket.experiments.scenarios.Scenario.sketch_mechanism`, Gaussian at ``delta``, noise
    seeded by the session seed; no ledger is charged in-process, and the sketch's epsilon is added
    to the owners' figure: ``owners_epsilon_with_sketch``).
``candidates-counts``
    The same with the counts allocation, by the owners' Laplace-noised relevance counts
    (``allocation="counts"``), at the same budget.
``candidates-sketch-density``, ``candidates-sketch-mass``, ``candidates-sketch-m2m``
    The sketch allocation with another relevance score than the default MMD vote
    (``relevance_score``).
``candidates-embedding-rerank``
    The same as ``candidates``, re-ranking by the private embedding (``embedding_rerank=True``).
``rounds``
    The per-round protocol (session method ``"rounds"``) with its defaults: Gaussian validation
    embedding, binary-tree summary release, exact pool scoring, PrivAuction;
    :func:`dpmarket.common.summarization.calibration.calibrate_rounds_mode` makes each party's PLD
    epsilon the target. PrivAuction is the pure-DP variant (the default).
``rounds-auction-printed``
    The same with PrivAuction as printed (``auction="paper"``), calibrated as ``rounds``; its
    owners' delta grows as for ``paper-auction-printed``.
``rounds-none``
    The same without any summary broadcast (``summary_release="none"``; the auction gets the
    owners' whole budget).
``rounds-embedding``
    The same as ``rounds`` with the paper's pool scoring by the private-embedding bid
    (``pool_scoring="embedding"``).

Every run records what the session charges each owner's data (the ledger's ``owner_terms``:
``owners_epsilon_spent`` at ``owners_delta_spent``) beside each party's PLD epsilon at ``delta``,
so the pure and printed auctions can be compared on the same footing.

The first three do not depend on epsilon and run once per (scenario, p, seed). The scenario split
always uses seed 0; seed ``s`` is the session seed and the downstream classifier's seed.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from dpmarket.common.summarization.methods import (
    CandidatesConfig,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
    method_config,
)
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import SummaryResult

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_SCENARIOS",
    "DEFAULT_SEEDS",
    "DEFAULT_SIZES",
    "EPSILON_FREE_METHODS",
    "EVAL_METHODS",
    "GOALS",
    "PRIVATE_METHODS",
    "QUICK",
    "evaluation_table",
    "plot_quality_vs_epsilon",
    "run_evaluation",
]

#: Every method the harness knows, in display order.
#: Methods whose result does not depend on epsilon (run once per scenario, p and seed).
EPSILON_FREE_METHODS: tuple[str, ...] = ("exact-greedy", "greedy", "uniform")
#: Differentially private methods (run once per scenario, p, epsilon and seed).
PRIVATE_METHODS: tuple[str, ...] = (
    "paper",
    "paper-auction-printed",
    "candidates",
    "candidates-counts",
    "candidates-sketch-density",
    "candidates-sketch-mass",
    "candidates-sketch-m2m",
    "candidates-embedding-rerank",
    "rounds",
    "rounds-auction-printed",
    "rounds-none",
    "rounds-embedding",
)
#: Every method the harness evaluates, epsilon-free ones first.
EVAL_METHODS: tuple[str, ...] = EPSILON_FREE_METHODS + PRIVATE_METHODS

DEFAULT_SCENARIOS: tuple[str, ...] = ("digits", "flights", "flights50")
DEFAULT_SIZES: tuple[int, ...] = (50, 200, 500)
DEFAULT_EPSILONS: tuple[float, ...] = (0.3, 1.0, 3.0)
DEFAULT_SEEDS = 3
#: ``--quick``: the smoke-test grid.
QUICK: dict[str, Any] = {"scenarios": ("digits",), "sizes": (20,), "epsilons": (1.0,), "seeds": 1}

#: The targets. At epsilon = 1: MMD² to D_v (mean over seeds) at most 0.2 x uniform's,
#: accuracy at least exact greedy's minus 0.01, owner points accessed at most 0.5 K p (every
#: seed), and the owners' delta spent at most the evaluation's delta (every seed; the target is
#: "epsilon <= 1 at delta"). At epsilon = 3: MMD² at most 5 x exact greedy's.
GOALS: dict[str, float] = {
    "epsilon_main": 1.0,
    "mmd2_over_uniform_max": 0.2,
    "accuracy_drop_max": 0.01,
    "accessed_fraction_max": 0.5,
    "epsilon_high": 3.0,
    "mmd2_over_exact_greedy_max": 5.0,
    # The sketch allocation's targets (at epsilon_main, every party, sketch included): accuracy
    # within 3 points of exact greedy, MMD² at most 0.5 x uniform's and at most 1.0 x exact
    # greedy's (the latter two are checked everywhere; the README says which scenario each is
    # stated for), owner points read at most 3 p (every seed).
    "accuracy_drop_sketch_max": 0.03,
    "mmd2_over_uniform_sketch_max": 0.5,
    "mmd2_over_exact_greedy_sketch_max": 1.0,
    "points_read_over_p_max": 3.0,
}

#: Owners' sketches in a run with session seed s are released with noise seed s + this.
_SKETCH_SEED_OFFSET = 1000

#: Per-run quantities that are aggregated over seeds (mean and std).
_METRICS: tuple[str, ...] = (
    "mmd2_validation",
    "mmd2_test",
    "accuracy",
    "owner_points_accessed",
    "accessed_fraction",
    "epsilon_validation_pld",
    "epsilon_validation_theorem7",
    "epsilon_owners_pld",
    "epsilon_owners_theorem7",
    "owners_epsilon_spent",
    "owners_delta_spent",
    "owners_epsilon_with_sketch",
    "owners_delta_with_sketch",
    "points_read_over_p",
    "mmd2_over_uniform",
    "mmd2_over_exact_greedy",
    "accuracy_minus_exact_greedy",
)

_LABELS: dict[str, str] = {
    "exact-greedy": "exact greedy (pooled)",
    "greedy": "greedy (RFF)",
    "uniform": "uniform",
    "paper": "paper (Alg. 3, calibrated, pure auction)",
    "paper-auction-printed": "paper (Alg. 3, calibrated, printed auction)",
    "candidates": "candidates (sketch allocation, MMD)",
    "candidates-counts": "candidates (counts allocation)",
    "candidates-sketch-density": "candidates (sketch allocation, density)",
    "candidates-sketch-mass": "candidates (sketch allocation, mass)",
    "candidates-sketch-m2m": "candidates (sketch allocation, M2M mass)",
    "candidates-embedding-rerank": "candidates (embedding re-rank)",
    "rounds": "rounds (Gaussian + tree + exact, pure auction)",
    "rounds-auction-printed": "rounds (Gaussian + tree + exact, printed auction)",
    "rounds-none": "rounds (no summary release)",
    "rounds-embedding": "rounds (embedding pool scoring)",
}
#: Methods that run PrivAuction as printed in Algorithm 3 (``auction="paper"``); each is drawn in
#: its pure counterpart's colour with a dotted line.
_PRINTED_AUCTION: dict[str, str] = {
    "paper-auction-printed": "paper",
    "rounds-auction-printed": "rounds",
}
#: The paper mode's variants' options (the rest are PrivateConfig's defaults).
_PAPER_OPTIONS: dict[str, dict[str, str]] = {
    "paper": {},
    "paper-auction-printed": {"auction": "paper"},
}
#: The candidates variants' options (the rest are CandidatesConfig's defaults).
_CANDIDATES_OPTIONS: dict[str, dict[str, Any]] = {
    "candidates": {},
    "candidates-counts": {"allocation": "counts"},
    "candidates-sketch-density": {"relevance_score": "density"},
    "candidates-sketch-mass": {"relevance_score": "mass"},
    "candidates-sketch-m2m": {"relevance_score": "m2m"},
    "candidates-embedding-rerank": {"embedding_rerank": True},
}
#: The rounds variants' options (the rest are RoundsConfig's defaults).
_ROUNDS_OPTIONS: dict[str, dict[str, str]] = {
    "rounds": {},
    "rounds-auction-printed": {"auction": "paper"},
    "rounds-none": {"summary_release": "none"},
    "rounds-embedding": {"pool_scoring": "embedding"},
}


# ------------------------------------------------------------------------------ configs
def _session_config(
    method: str,
    p: int,
    gamma: float,
    epsilon: float | None,
    delta: float,
    *,
    n_owners: int,
    seed_set_size: int,
) -> SummarizationConfig:
    """The session configuration of one evaluated method (not for ``exact-greedy``)."""
    if method in ("greedy", "uniform"):
        return method_config(method, summary_size=p, gamma=gamma)
    if epsilon is None:  # pragma: no cover - guarded by the caller
        raise ValueError(f"method {method!r} needs an epsilon")
    if method in _PAPER_OPTIONS:
        from dpmarket.common.summarization.calibration import calibrate_paper_mode

        base = PrivateConfig(summary_size=p, gamma=gamma, **_PAPER_OPTIONS[method])  # type: ignore[arg-type]
        return calibrate_paper_mode(
            base, n_owners, epsilon_target=epsilon, delta=delta, seed_set_size=seed_set_size
        )
    if method in _CANDIDATES_OPTIONS:
        return CandidatesConfig(
            summary_size=p,
            gamma=gamma,
            epsilon_validation_total=epsilon,
            epsilon_owners_total=epsilon,
            delta=delta,
            **_CANDIDATES_OPTIONS[method],
        )
    if method in _ROUNDS_OPTIONS:
        from dpmarket.common.summarization.calibration import calibrate_rounds_mode

        rounds = RoundsConfig(summary_size=p, gamma=gamma, **_ROUNDS_OPTIONS[method])  # type: ignore[arg-type]
        return calibrate_rounds_mode(rounds, n_owners, epsilon_target=epsilon, delta=delta)
    raise ValueError(f"method must be one of {EVAL_METHODS}, got {method!r}")


def _finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing or not finite (JSON has no infinity)."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _party_epsilons(ledger: SessionLedger) -> dict[str, Any]:
    """Each party's privacy as the session's ledger reports it.

    Returns
    -------
    dict
        ``epsilon_{party}_pld`` and ``epsilon_{party}_theorem7`` (epsilon units) and
        ``delta_{party}`` (the ``delta_tilde`` they hold at) for ``party`` in ``validation``,
        ``owners``; None without a ledger, and a PLD epsilon is None when it is unbounded at that
        delta (the printed auction's infinite-loss mass exceeds it). ``delta_owners_theorem7``:
        the delta of the owners' Theorem 7 figure (the ledger's ``delta_total``).
        ``owners_epsilon_spent`` and ``owners_delta_spent``: what the session charges each
        owner's data (the ledger's ``owner_terms``: the PLD epsilon at the session's delta plus
        the printed auction's infinite-loss mass); None for a non-private session or without
        terms. ``owners_non_private``: the session released exact statistics to the owners.
    """
    out: dict[str, Any] = {}
    for party in ("validation", "owners"):
        report = ledger.party(party)
        row = None if report is None else report.parties[party]
        out[f"epsilon_{party}_pld"] = _finite(None if row is None else row.pld)
        out[f"epsilon_{party}_theorem7"] = _finite(None if row is None else row.theorem7)
        out[f"delta_{party}"] = None if report is None else report.delta_tilde
    owners = ledger.owners
    out["delta_owners_theorem7"] = _finite(
        None if owners is None else owners.parties["owners"].delta_total
    )
    terms = ledger.owner_terms
    non_private = terms is not None and terms.non_private
    spent = terms is not None and not non_private
    out["owners_epsilon_spent"] = _finite(terms.epsilon) if spent and terms else None
    out["owners_delta_spent"] = _finite(terms.delta) if spent and terms else None
    out["owners_non_private"] = non_private
    # The published sketches' own budget (charged once, at publication), added by basic
    # composition to what the session charges: the owners' figure with the sketch, not
    # amortised over the consumers who reuse it.
    sketches = ledger.owner_sketches or {}
    sketch_eps = max((float(v.epsilon) for v in sketches.values()), default=0.0)
    sketch_delta = max((float(v.delta) for v in sketches.values()), default=0.0)
    out["sketch_epsilon"] = sketch_eps if sketches else None
    out["owners_epsilon_with_sketch"] = (
        None if out["owners_epsilon_spent"] is None else out["owners_epsilon_spent"] + sketch_eps
    )
    out["owners_delta_with_sketch"] = (
        None if out["owners_delta_spent"] is None else out["owners_delta_spent"] + sketch_delta
    )
    return out


# ------------------------------------------------------------------------------ running
def _record(
    scenario: Any,
    method: str,
    p: int,
    epsilon: float | None,
    seed: int,
    result: SummaryResult,
    config: SummarizationConfig | None,
) -> dict[str, Any]:
    """Measure one summary; the machine-independent part of a run record."""
    from dpmarket.consumer.report import evaluate_summary

    row = evaluate_summary(
        result, scenario.validation, scenario.gamma, test=scenario.test, seed=seed
    )
    k = len(scenario.owners)
    accessed = int(result.report.owner_points_accessed)
    ledger = result.report.ledger
    record: dict[str, Any] = {
        "scenario": scenario.name,
        "p": p,
        "method": method,
        "epsilon": epsilon,
        "seed": seed,
        "status": "ok",
        "summary_size": int(row.summary_size),
        "mmd2_validation": float(row.mmd2_validation),
        "mmd2_test": row.mmd2_test,
        "accuracy": row.accuracy,
        "owner_points_accessed": accessed,
        "accessed_fraction": accessed / (k * p),
        "points_read_over_p": accessed / p,
        "rejected_points": int(result.report.rejected_points),
        "dropped_owners": list(result.report.dropped_owners),
        "points_per_owner": {o: b.points for o, b in row.owners.items() if b.points},
        **_party_epsilons(ledger),
    }
    if ledger.auction is not None:
        record["auction"] = {
            key: getattr(ledger.auction, key)
            for key in ("variant", "eps_auc", "tau", "delta_per_bad_iteration")
        }
    if ledger.candidates is not None:
        record["candidate_budget"] = ledger.candidates.budget
        record["candidate_shares"] = ledger.candidates.shares
        record["allocation"] = ledger.candidates.allocation
    if config is not None and method in _PAPER_OPTIONS:
        record["paper_config"] = {
            key: getattr(config, key)
            for key in (
                "epsilon_validation",
                "epsilon_first_epoch",
                "epsilon_summary",
                "epsilon_auction",
                "delta_validation",
                "delta_owners",
            )
        }
    return record


def _add_ratios(runs: list[dict[str, Any]]) -> None:
    """Add per-seed ratios against uniform and exact greedy of the same (scenario, p, seed)."""
    refs: dict[tuple[str, int, int, str], dict[str, Any]] = {
        (r["scenario"], r["p"], r["seed"], r["method"]): r
        for r in runs
        if r["status"] == "ok" and r["method"] in ("uniform", "exact-greedy")
    }
    for run in runs:
        if run["status"] != "ok":
            continue
        key = (run["scenario"], run["p"], run["seed"])
        uniform = refs.get((*key, "uniform"))
        exact = refs.get((*key, "exact-greedy"))
        run["mmd2_over_uniform"] = _ratio(run["mmd2_validation"], uniform, "mmd2_validation")
        run["mmd2_over_exact_greedy"] = _ratio(run["mmd2_validation"], exact, "mmd2_validation")
        run["accuracy_minus_exact_greedy"] = (
            None
            if exact is None or run["accuracy"] is None or exact["accuracy"] is None
            else run["accuracy"] - exact["accuracy"]
        )


def _ratio(value: float, ref: Mapping[str, Any] | None, key: str) -> float | None:
    if ref is None or ref[key] is None or ref[key] <= 0:
        return None
    return float(value / ref[key])


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1; None with fewer than two values)."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None, None
    arr = np.asarray(v)
    std = float(arr.std(ddof=1)) if arr.size > 1 else None
    return float(arr.mean()), std


def _aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (scenario, p, method, epsilon)."""
    groups: dict[tuple[str, int, str, float | None], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["scenario"], run["p"], run["method"], run["epsilon"])
        groups.setdefault(key, []).append(run)
    out = []
    for (scenario, p, method, epsilon), members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        row: dict[str, Any] = {
            "scenario": scenario,
            "p": p,
            "method": method,
            "epsilon": epsilon,
            "n_seeds": len(ok),
            "n_failed": len(members) - len(ok),
            "errors": sorted({r["error"] for r in members if r["status"] != "ok"}),
        }
        for metric in _METRICS:
            mean, std = _mean_std([r.get(metric) for r in ok])
            row[metric] = {"mean": mean, "std": std}
        row["accessed_fraction"]["max"] = max((r["accessed_fraction"] for r in ok), default=None)
        row["points_read_over_p"]["max"] = max((r["points_read_over_p"] for r in ok), default=None)
        row["owners_delta_spent"]["max"] = max(
            (r["owners_delta_spent"] for r in ok if r.get("owners_delta_spent") is not None),
            default=None,
        )
        deltas = {r.get(f"delta_{party}") for r in ok for party in ("validation", "owners")}
        deltas.discard(None)
        row["delta"] = sorted(deltas)
        row["owners_non_private"] = any(r.get("owners_non_private") for r in ok)
        out.append(row)
    return out


def _goals(
    aggregates: list[dict[str, Any]], delta: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Check the targets (:data:`GOALS`) per scenario, p and private method."""
    by_key = {(a["scenario"], a["p"], a["method"], a["epsilon"]): a for a in aggregates}
    cells = sorted({(a["scenario"], a["p"]) for a in aggregates})
    methods = [m for m in PRIVATE_METHODS if any(a["method"] == m for a in aggregates)]
    eps_main, eps_high = GOALS["epsilon_main"], GOALS["epsilon_high"]
    goals = []
    for scenario, p in cells:
        uniform = by_key.get((scenario, p, "uniform", None))
        exact = by_key.get((scenario, p, "exact-greedy", None))
        for method in methods:
            entry: dict[str, Any] = {"scenario": scenario, "p": p, "method": method}
            main = by_key.get((scenario, p, method, eps_main))
            entry[f"eps_{eps_main:g}"] = _goals_main(main, uniform, exact, delta)
            high = by_key.get((scenario, p, method, eps_high))
            entry[f"eps_{eps_high:g}"] = _goals_high(high, exact)
            checks = [
                c["met"]
                for part in (entry[f"eps_{eps_main:g}"], entry[f"eps_{eps_high:g}"])
                for c in part.values()
            ]
            entry["all_met"] = None if any(c is None for c in checks) or not checks else all(checks)
            goals.append(entry)
    spec = {**GOALS, "delta": delta}
    return goals, spec


def _mean(agg: Mapping[str, Any] | None, metric: str) -> float | None:
    if agg is None or agg["n_seeds"] == 0:
        return None
    value = agg[metric]["mean"]
    return None if value is None else float(value)


def _check(value: float | None, bound: float | None, *, at_least: bool = False) -> dict[str, Any]:
    if value is None or bound is None:
        return {"met": None, "value": value, "bound": bound}
    met = value >= bound if at_least else value <= bound
    return {"met": bool(met), "value": value, "bound": bound}


def _goals_main(
    agg: Mapping[str, Any] | None,
    uniform: Mapping[str, Any] | None,
    exact: Mapping[str, Any] | None,
    delta: float,
) -> dict[str, Any]:
    u_mmd, e_acc = _mean(uniform, "mmd2_validation"), _mean(exact, "accuracy")
    e_mmd = _mean(exact, "mmd2_validation")
    acc_max = None if agg is None else agg["accessed_fraction"].get("max")
    delta_max = None if agg is None else agg["owners_delta_spent"].get("max")
    return {
        "mmd2_vs_uniform": _check(
            _mean(agg, "mmd2_validation"),
            None if u_mmd is None else GOALS["mmd2_over_uniform_max"] * u_mmd,
        ),
        "accuracy_vs_exact_greedy": _check(
            _mean(agg, "accuracy"),
            None if e_acc is None else e_acc - GOALS["accuracy_drop_max"],
            at_least=True,
        ),
        "accessed_fraction": _check(acc_max, GOALS["accessed_fraction_max"]),
        # The target epsilon holds at delta only if the session spends no more delta than that
        # (the printed PrivAuction spends more, see the module docstring).
        "owners_delta": _check(delta_max, delta),
        # The sketch allocation's targets.
        "accuracy_within_3_points": _check(
            _mean(agg, "accuracy"),
            None if e_acc is None else e_acc - GOALS["accuracy_drop_sketch_max"],
            at_least=True,
        ),
        "mmd2_vs_half_uniform": _check(
            _mean(agg, "mmd2_validation"),
            None if u_mmd is None else GOALS["mmd2_over_uniform_sketch_max"] * u_mmd,
        ),
        "mmd2_vs_exact_greedy": _check(
            _mean(agg, "mmd2_validation"),
            None if e_mmd is None else GOALS["mmd2_over_exact_greedy_sketch_max"] * e_mmd,
        ),
        "points_read_over_p": _check(
            None if agg is None else agg["points_read_over_p"].get("max"),
            GOALS["points_read_over_p_max"],
        ),
        # Every party's epsilon, the sketch's included (not amortised), at most the target.
        "owners_epsilon_with_sketch": _check(
            None if agg is None else agg["owners_epsilon_with_sketch"]["mean"],
            None if agg is None else float(agg["epsilon"] or 0.0) * (1 + 1e-6),
        ),
    }


def _goals_high(agg: Mapping[str, Any] | None, exact: Mapping[str, Any] | None) -> dict[str, Any]:
    e_mmd = _mean(exact, "mmd2_validation")
    return {
        "mmd2_vs_exact_greedy": _check(
            _mean(agg, "mmd2_validation"),
            None if e_mmd is None else GOALS["mmd2_over_exact_greedy_max"] * e_mmd,
        )
    }


def _plan(
    scenario_names: Sequence[str],
    sizes: Sequence[int],
    epsilons: Sequence[float],
    seeds: Sequence[int],
    methods: Sequence[str],
    scenarios: Mapping[str, Any],
) -> tuple[list[tuple[str, int, str, float | None, int]], list[dict[str, Any]]]:
    """The runs to do, in order, and the (scenario, p) cells skipped because p is too large."""
    plan: list[tuple[str, int, str, float | None, int]] = []
    skipped = []
    for name in scenario_names:
        total = sum(o.n_points for o in scenarios[name].owners)
        for p in sizes:
            if p > total:
                skipped.append({"scenario": name, "p": p, "reason": f"p > {total} owner points"})
                continue
            for seed in seeds:
                for method in methods:
                    if method in EPSILON_FREE_METHODS:
                        plan.append((name, p, method, None, seed))
                    else:
                        plan.extend((name, p, method, float(eps), seed) for eps in epsilons)
    return plan, skipped


def run_evaluation(
    scenarios: Sequence[str],
    sizes: Sequence[int],
    epsilons: Sequence[float],
    seeds: int | Sequence[int],
    methods: Sequence[str],
    out_dir: str | Path,
    *,
    delta: float = 1e-6,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run every method over scenarios, sizes, epsilons and seeds; write JSON, plot and table.

    Parameters
    ----------
    scenarios : sequence of str
        Names in :data:`dpmarket.experiments.scenarios.SCENARIOS` (split with seed 0).
    sizes : sequence of int
        Summary sizes p; a p larger than the scenario's total owner points is skipped (and listed
        under ``"skipped"``).
    epsilons : sequence of float
        Privacy targets, each > 0: every private party's epsilon at ``delta``.
    seeds : int or sequence of int
        Session seeds (an int n means ``0 .. n-1``); seed s is the session seed and the
        downstream classifier's.
    methods : sequence of str
        Subset of :data:`EVAL_METHODS`.
    out_dir : str or Path
        Receives ``evaluation.json`` and ``quality_vs_epsilon.png`` (created if missing).
    delta : float, default 1e-6
        delta at which every private method's epsilons hold.
    console : rich Console, optional
        Progress bar and table (default: a new console on stdout).

    Returns
    -------
    dict
        The JSON document: ``config``, ``runs`` (one record per run: MMD² to the validation
        and test sets, accuracy, owner points accessed and ``accessed_fraction = accessed / (K
        p)``, each party's PLD and Theorem 7 epsilon and the delta they hold for, the epsilon
        and delta the session charges each owner (``owners_epsilon_spent``,
        ``owners_delta_spent``), PrivAuction's variant, ``eps_auc``, ``tau`` and delta per bad
        iteration (``auction``), ratios against
        uniform and exact greedy of the same scenario, p and seed; ``status`` "ok" or "failed"
        with ``error``), ``aggregates`` (mean and std over seeds), ``goals`` (the
        targets, each ``{"met", "value", "bound"}``; ``met`` is None when a needed run is
        missing), ``skipped`` and ``timing`` (wall times, seconds: the only machine-dependent
        part).

    Raises
    ------
    ValueError
        If a scenario or method is unknown, or a size, epsilon or seed list is empty or invalid.

    Notes
    -----
    A run that raises (a :class:`dpmarket.common.errors.DPMarketError`, a ``ValueError`` from the
    calibration, or a bug) is recorded as failed with the exception's type and message, printed,
    and the evaluation goes on; aggregates count only successful runs, and a goal that needs a
    failed cell is ``None`` (not evaluated).
    """
    from dpmarket.experiments.runner import exact_greedy_summary, publish_sketches, simulate
    from dpmarket.experiments.scenarios import SCENARIOS

    console = console or Console()
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    scenario_names = list(dict.fromkeys(scenarios))
    method_list = [m for m in EVAL_METHODS if m in set(methods)]
    unknown = sorted(set(methods) - set(EVAL_METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {EVAL_METHODS}")
    unknown = sorted(set(scenario_names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}")
    if not (scenario_names and sizes and seed_list and method_list):
        raise ValueError("scenarios, sizes, seeds and methods must not be empty")
    if any(m in PRIVATE_METHODS for m in method_list) and not epsilons:
        raise ValueError("private methods need at least one epsilon")
    for target in epsilons:
        if not (math.isfinite(target) and target > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {target}")
    for size in sizes:
        if int(size) != size or size < 1:
            raise ValueError(f"p must be an integer >= 1, got {size}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    built = {name: SCENARIOS[name](0) for name in scenario_names}
    plan, skipped = _plan(
        scenario_names, [int(p) for p in sizes], epsilons, seed_list, method_list, built
    )

    runs: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    configs: dict[tuple[str, int, str, float | None], SummarizationConfig] = {}
    exact_cache: dict[tuple[str, int], tuple[SummaryResult, float]] = {}
    sketch_cache: dict[tuple[str, float, int], dict[str, Any]] = {}

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
    with progress:
        task = progress.add_task("evaluate", total=len(plan))
        for name, p, method, eps, seed in plan:
            scenario = built[name]
            eps_text = "" if eps is None else f" ε={eps:g}"
            progress.update(task, description=f"{name} p={p} {method}{eps_text} seed={seed}")
            t0 = time.perf_counter()
            config: SummarizationConfig | None = None
            try:
                if method == "exact-greedy":
                    if (name, p) not in exact_cache:
                        g0 = time.perf_counter()
                        res = exact_greedy_summary(
                            scenario.owners, scenario.validation, p, scenario.gamma
                        )
                        exact_cache[(name, p)] = (res, time.perf_counter() - g0)
                    result, session_seconds = exact_cache[(name, p)]
                else:
                    key = (name, p, method, eps)
                    if key not in configs:
                        configs[key] = _session_config(
                            method,
                            p,
                            scenario.gamma,
                            eps,
                            delta,
                            n_owners=len(scenario.owners),
                            seed_set_size=int(scenario.seed_set.shape[0]),
                        )
                    config = configs[key]
                    sketches = None
                    if isinstance(config, CandidatesConfig) and config.allocation == "sketch":
                        assert eps is not None
                        if (name, eps, seed) not in sketch_cache:
                            sketch_cache[(name, eps, seed)] = publish_sketches(
                                scenario.owners,
                                scenario.sketch_mechanism(eps, delta=delta),
                                seed=_SKETCH_SEED_OFFSET + seed,
                            )
                        sketches = sketch_cache[(name, eps, seed)]
                    result = simulate(
                        scenario.owners,
                        scenario.validation,
                        scenario.seed_set,
                        config,
                        seed=seed,
                        owner_sketches=sketches,
                    )
                    session_seconds = result.report.wall_time_seconds
                record = _record(scenario, method, p, eps, seed, result, config)
            except Exception as exc:  # one failed run must not end the evaluation
                session_seconds = math.nan
                record = {
                    "scenario": name,
                    "p": p,
                    "method": method,
                    "epsilon": eps,
                    "seed": seed,
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                }
                progress.console.print(
                    f"[red]failed[/red] {name} p={p} {method}{eps_text} "
                    f"seed={seed}: {record['error']}"
                )
            runs.append(record)
            timings.append(
                {
                    "scenario": name,
                    "p": p,
                    "method": method,
                    "epsilon": eps,
                    "seed": seed,
                    "session_seconds": None if math.isnan(session_seconds) else session_seconds,
                    "run_seconds": time.perf_counter() - t0,
                }
            )
            progress.advance(task)

    _add_ratios(runs)
    aggregates = _aggregate(runs)
    goals, goal_spec = _goals(aggregates, delta)
    total_seconds = time.perf_counter() - start
    document: dict[str, Any] = {
        "config": {
            "scenarios": scenario_names,
            "scenario_split_seed": 0,
            "sizes": [int(p) for p in sizes],
            "epsilons": [float(e) for e in epsilons],
            "seeds": seed_list,
            "methods": method_list,
            "delta": delta,
            "goals": goal_spec,
            "scenario_info": {
                name: {
                    "owners": {o.name: o.n_points for o in s.owners},
                    "validation_points": int(s.validation.shape[0]),
                    "test_points": s.test.n_points,
                    "seed_set_points": int(s.seed_set.shape[0]),
                    "gamma": s.gamma,
                }
                for name, s in built.items()
            },
            "session_configs": [
                {"scenario": k[0], "p": k[1], "method": k[2], "epsilon": k[3], **asdict(c)}
                for k, c in configs.items()
            ],
        },
        "runs": runs,
        "aggregates": aggregates,
        "goals": goals,
        "skipped": skipped,
        "timing": {
            "total_seconds": total_seconds,
            "machine": platform.platform(),
            "runs": timings,
            "mean_session_seconds": _timing_means(timings),
        },
    }
    _write_outputs(document, out, console)
    return document


def _timing_means(timings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, str, float | None], list[float]] = {}
    for t in timings:
        if t["session_seconds"] is not None:
            key = (t["scenario"], t["p"], t["method"], t["epsilon"])
            groups.setdefault(key, []).append(float(t["session_seconds"]))
    return [
        {"scenario": k[0], "p": k[1], "method": k[2], "epsilon": k[3], "mean": float(np.mean(v))}
        for k, v in groups.items()
    ]


def _write_outputs(document: dict[str, Any], out: Path, console: Console) -> None:
    from dpmarket.runtime.files import write_json

    write_json(document, out / "evaluation.json")
    plot_quality_vs_epsilon(document, out / "quality_vs_epsilon.png")
    wide = Console(
        file=console.file,
        width=max(console.width, 180),
        force_terminal=console.is_terminal,
        no_color=console.no_color,
    )
    wide.print(evaluation_table(document))
    wide.print(goals_table(document))
    wide.print(
        f"ε D_v: PLD (dp-accounting) at δ = {document['config']['delta']:g} (paper: calibrated "
        "to the target; candidates: Gaussian + Laplace). Owners ε / δ spent: what the session "
        "charges each owner's data (PLD ε at the session's δ, which the printed PrivAuction "
        "raises by its (ε_auc, 1 − e^−ε_auc) bad iterations). '% over exact' "
        "compares MMD² to D_v with the exact-kernel greedy on pooled data (mean of per-seed "
        "ratios). ± is the std over seeds."
    )
    console.print(
        f"results -> {out / 'evaluation.json'}, plot -> {out / 'quality_vs_epsilon.png'} "
        f"({document['timing']['total_seconds']:.0f} s)"
    )


# ------------------------------------------------------------------------------ presenting
def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _sort_key(agg: Mapping[str, Any]) -> tuple[str, int, int, float]:
    eps = agg["epsilon"]
    return (agg["scenario"], agg["p"], EVAL_METHODS.index(agg["method"]), eps or 0.0)


def evaluation_table(document: Mapping[str, Any]) -> Table:
    """The aggregated results as a rich table (one row per scenario, p, method, epsilon)."""
    table = Table(title="summary quality vs privacy (mean over seeds)", title_justify="left")
    for header in (
        "scenario",
        "p",
        "method",
        "ε",
        "MMD² to D_v",
        "% over exact",
        "× uniform",
        "accuracy",
        "accessed / Kp",
        "ε D_v (PLD)",
        "owners ε / δ spent",
        "seeds",
    ):
        table.add_column(header, justify="left" if header in ("scenario", "method") else "right")
    previous: tuple[str, int] | None = None
    for agg in sorted(document["aggregates"], key=_sort_key):
        cell = (agg["scenario"], agg["p"])
        if previous is not None and cell != previous:
            table.add_section()
        previous = cell
        mmd, ratio = agg["mmd2_validation"], agg["mmd2_over_exact_greedy"]
        pct = None if ratio["mean"] is None else (ratio["mean"] - 1.0) * 100.0
        acc = agg["accuracy"]
        eps_o, delta_o = agg["owners_epsilon_spent"]["mean"], agg["owners_delta_spent"]["mean"]
        if agg.get("owners_non_private"):
            owners_text = "non-private"
        elif eps_o is None and delta_o is None:
            owners_text = "-"
        else:
            owners_text = f"{_fmt(eps_o, '.3g')} / {_fmt(delta_o, '.3g')}"
            eps_s = agg["owners_epsilon_with_sketch"]["mean"]
            if eps_s is not None and eps_o is not None and eps_s > eps_o:
                owners_text += f" (+ sketch: {_fmt(eps_s, '.3g')})"
        seeds = f"{agg['n_seeds']}" + (f" ({agg['n_failed']} failed)" if agg["n_failed"] else "")
        table.add_row(
            agg["scenario"],
            str(agg["p"]),
            _LABELS.get(agg["method"], agg["method"]),
            _fmt(agg["epsilon"], "g"),
            f"{_fmt(mmd['mean'], '.3g')} ± {_fmt(mmd['std'], '.1g')}",
            _fmt(pct, "+.0f"),
            _fmt(agg["mmd2_over_uniform"]["mean"], ".2f"),
            f"{_fmt(acc['mean'], '.3f')} ± {_fmt(acc['std'], '.2f')}",
            _fmt(agg["accessed_fraction"]["mean"], ".3f"),
            _fmt(agg["epsilon_validation_pld"]["mean"], ".3g"),
            owners_text,
            seeds,
        )
    return table


def goals_table(document: Mapping[str, Any]) -> Table:
    """The targets per scenario, p and private method: met or not, with the numbers."""
    table = Table(title="goals: a private summary worth buying", title_justify="left")
    for header in ("scenario", "p", "method", "check", "value", "bound", "met"):
        table.add_column(
            header, justify="left" if header in ("scenario", "method", "check") else "right"
        )
    for entry in document["goals"]:
        for part in (k for k in entry if k.startswith("eps_")):
            for check, c in entry[part].items():
                met = c["met"]
                mark = "[green]yes" if met else "-" if met is None else "[red]no"
                table.add_row(
                    entry["scenario"],
                    str(entry["p"]),
                    entry["method"],
                    f"ε={part[4:]}: {check}",
                    _fmt(c["value"], ".4g"),
                    _fmt(c["bound"], ".4g"),
                    mark,
                )
        table.add_section()
    return table


def plot_quality_vs_epsilon(document: Mapping[str, Any], path: str | Path) -> None:
    """Plot MMD² to D_v (log scale) and accuracy against epsilon into one PNG.

    One row per (scenario, p), two columns (MMD², accuracy); one line with error bars (std over
    seeds) per private method, epsilon-free methods as horizontal dashed lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aggregates = document["aggregates"]
    cells = sorted({(a["scenario"], a["p"]) for a in aggregates})
    rows = max(1, len(cells))
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.4 * rows), squeeze=False)
    # tab10 has ten colours: a printed-auction variant shares its pure counterpart's colour and is
    # told apart by a dotted line and open square markers.
    own_color = [m for m in EVAL_METHODS if m not in _PRINTED_AUCTION]
    colors: dict[str, Any] = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(own_color)}
    colors.update({m: colors[pure] for m, pure in _PRINTED_AUCTION.items()})
    metrics: tuple[tuple[str, str], ...] = (
        ("mmd2_validation", "MMD² to D_v"),
        ("accuracy", "accuracy on target test set"),
    )
    for row, (scenario, p) in enumerate(cells):
        members = [a for a in aggregates if a["scenario"] == scenario and a["p"] == p]
        for col, (metric, ylabel) in enumerate(metrics):
            ax = axes[row][col]
            plotted = False
            for method in EVAL_METHODS:
                mine = sorted(
                    (a for a in members if a["method"] == method and a[metric]["mean"] is not None),
                    key=lambda a: a["epsilon"] or 0.0,
                )
                if not mine:
                    continue
                label = _LABELS[method]
                if method in EPSILON_FREE_METHODS:
                    ax.axhline(
                        mine[0][metric]["mean"],
                        linestyle="--",
                        linewidth=1.2,
                        color=colors[method],
                        label=label,
                    )
                else:
                    eps = [a["epsilon"] for a in mine]
                    mean = [a[metric]["mean"] for a in mine]
                    std = [a[metric]["std"] or 0.0 for a in mine]
                    printed = method in _PRINTED_AUCTION
                    ax.errorbar(
                        eps,
                        mean,
                        yerr=std,
                        marker="s" if printed else "o",
                        markersize=4,
                        markerfacecolor="none" if printed else colors[method],
                        linestyle=":" if printed else "-",
                        capsize=3,
                        color=colors[method],
                        label=label,
                    )
                plotted = True
            ax.set_xscale("log")
            ticks = document["config"]["epsilons"]
            if ticks:
                ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
                ax.minorticks_off()
            if metric == "mmd2_validation" and plotted:
                ax.set_yscale("log")
            ax.set_xlabel("ε (each party, at δ = {:g})".format(document["config"]["delta"]))
            ax.set_ylabel(ylabel)
            ax.set_title(f"{scenario}, p = {p}")
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend_inches = 0.6
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - legend_inches / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
