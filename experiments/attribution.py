"""The market's value attribution on the scenario suite (``dpmarket lab evaluate --attribution``).

For every suite scenario with at most :data:`MAX_OWNERS` owners, the default method's summary
(run in process, :func:`dpmarket.experiments.runner.simulate`, as ``evaluate --suite`` runs it:
epsilon 1 per party, the owners' sketches published in process) is attributed to its owners
(:mod:`dpmarket.common.market`) and the private payouts are drawn many times at each payout
epsilon. Reported per scenario, as means over session seeds and noise draws, Spearman rank
correlations with the exact, non-private Shapley values of

* the embedding game the payouts release (:class:`~dpmarket.common.market.EmbeddingGame`),
  whose rank agreement measures what the privacy costs; and
* the paper's game ``v(C) = J(S_C)`` (the summary's utility), which adds the change of utility;

of the private payouts (:class:`~dpmarket.common.market.ValueReward`, the default, and the
budget-balanced :class:`~dpmarket.common.market.ProportionalSplit`), of the same value rule
without its shrinkage (the noisy value clipped to ``[0, n_j / p]``), and, without noise, of the
delivered counts ``n_j`` alone (no privacy needed: each owner knows its own), the paper's rule,
leave-one-out and the embedding game's values. Beside them, the own-data release
(:func:`~dpmarket.common.market.payouts.release_own_payouts`: each owner's own-data part of its
Shapley value of ``J(S_C)``, whose release needs no noise for the other owners) against the
paper's game, and a diagnosis of that game's values (null and tied owners, their gaps against
the payout noise, the same pipeline at epsilon 1,000).

The value rule's prior (:data:`~dpmarket.common.market.payouts.POINT_VALUE_MEAN`,
:data:`~dpmarket.common.market.payouts.POINT_VALUE_SPREAD`) is fitted on the design half of the
suite's split (``experiments/suite_split.toml``, :func:`prior_fit`; the embedding game's Shapley
values are in closed form whatever K); each scenario's half is reported beside it, and the
held-out half is the measure.

And the cost: the time of the attribution (kernel blocks, the paper's rule, exact Shapley values
of the paper's game over 2^16 coalitions, leave-one-out, the embedding game's closed form, the
own-data values) and of the payout releases (both) and the signed statements, at K = 16 and
p = 200, against the default session's own time in process.

Owners with no delivered point have value 0 under every rule and receive exactly 0; the rank
correlation runs over all K owners (ties ranked by their mean rank). A constant vector (every
payout 0) counts as a correlation of 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich import box
from rich.console import Console
from rich.table import Table
from scipy.stats import rankdata

from dpmarket.common.market import (
    ObjectiveGame,
    OwnerLimits,
    OwnerPrices,
    ProportionalSplit,
    SessionRecord,
    SummaryBlocks,
    ValueReward,
    embedding_shapley,
    exact_shapley,
    leave_one_out,
    paper_rule,
    payout_noise_scale,
    quote,
    release_payouts,
    settle,
    sign_statement,
)
from dpmarket.common.market.attribution import own_shapley
from dpmarket.common.market.payouts import (
    POINT_VALUE_MEAN,
    POINT_VALUE_SPREAD,
    release_own_payouts,
)
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.experiments.attribution_limits import LIMIT_EPSILONS, measure_limits
from dpmarket.experiments.suite_split import load_split, require_design

__all__ = [
    "COST_SCENARIOS",
    "EPSILONS",
    "MAX_OWNERS",
    "ScenarioAttribution",
    "attribution_table",
    "diagnosis_table",
    "limits_table",
    "own_table",
    "prior_fit",
    "run_attribution",
    "spearman",
]

#: Suite scenarios with at most this many owners are measured (the scope of GOAL).
MAX_OWNERS = 16
#: Payout epsilons measured.
EPSILONS: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
#: The goal: Spearman of the payouts at epsilon 1 against exact Shapley values.
GOAL = 0.9
#: Scenarios of the cost measurement (K = 16) and their summary size.
COST_SCENARIOS: tuple[str, ...] = ("digits-16", "txhousing-16")
COST_P = 200
#: Noise draws per session and epsilon.
DRAWS = 200
#: The payout epsilon of the pipeline's limit (:attr:`ScenarioAttribution.limit_j`): the same
#: release and value rule with noise 1,000 times smaller than at epsilon 1, so what is left
#: of the gap to ``J(S_C)``'s values is the game and the rule, not the noise.
LIMIT_EPSILON = LIMIT_EPSILONS[-1]


def spearman(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Spearman's rank correlation with mean ranks for ties; 0 if either vector is constant."""
    rx, ry = rankdata(x), rankdata(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return 0.0
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


@dataclass
class ScenarioAttribution:
    """One scenario's measurements (means over session seeds; lists per seed where noted)."""

    name: str
    half: str
    owners: int
    m: int
    p: int
    delivering: list[int] = field(default_factory=list)
    #: Without noise, per seed, against the paper's game's Shapley values.
    paper_rule: list[float] = field(default_factory=list)
    leave_one_out: list[float] = field(default_factory=list)
    embedding: list[float] = field(default_factory=list)
    counts_j: list[float] = field(default_factory=list)
    #: The delivered counts against the embedding game's Shapley values.
    counts_e: list[float] = field(default_factory=list)
    #: Per seed: ``J(S)``, the summary's value (every game's grand value), and the standard
    #: deviation of the embedding game's exact values over the owners with a delivered point
    #: divided by the payout noise scale at epsilon 1 (value rule): how much of the ranking the
    #: noise leaves.
    grand: list[float] = field(default_factory=list)
    signal_noise: list[float] = field(default_factory=list)
    #: ``{rule: {epsilon: [mean Spearman per seed]}}`` of the payouts against the paper's game's
    #: Shapley values (``payouts_j``) and the embedding game's (``payouts_e``); ``payouts_j5``:
    #: the 5th percentile over draws.
    payouts_j: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    payouts_e: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    payouts_j5: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: ``{epsilon: [...]}``: the value rule's release paid without shrinkage.
    unshrunk_j: dict[str, list[float]] = field(default_factory=dict)
    unshrunk_e: dict[str, list[float]] = field(default_factory=dict)
    #: Per seed, the diagnosis of the exact Shapley values of ``J(S_C)`` (the goal's
    #: reference): owners with no delivered point (value exactly 0 under every rule, payout
    #: exactly 0: tied with each other in both rankings); delivering owners whose value equals
    #: another delivering owner's (to 1e-12; Spearman gives tied owners their mean rank, as
    #: ``scipy.stats.rankdata`` does); the standard deviation of the values over the
    #: delivering owners over the payout noise scale at epsilon 1; the share of adjacent pairs
    #: of distinct values in the values' order (all K owners; exact ties left out) closer than
    #: that noise scale (pairs no release at this noise orders reliably); and the value rule's
    #: payouts at :data:`LIMIT_EPSILON` against the values (mean Spearman over draws: the
    #: pipeline without its noise).
    null_owners: list[int] = field(default_factory=list)
    tied_owners: list[int] = field(default_factory=list)
    spread_j: list[float] = field(default_factory=list)
    close_pairs: list[float] = field(default_factory=list)
    limit_j: list[float] = field(default_factory=list)
    #: The own-data release (:func:`~dpmarket.common.market.payouts.release_own_payouts`)
    #: against the paper's game's Shapley values: its exact values per seed (``own_exact``: no
    #: noise) and ``{epsilon: [mean Spearman per seed]}`` of its released values (``own_j``)
    #: and of those values clipped at 0 (``own_paid_j``: the ranking of any payout that is a
    #: nondecreasing function of the owner's own value, 0 below 0, with no cap reached).
    own_exact: list[float] = field(default_factory=list)
    own_j: dict[str, list[float]] = field(default_factory=dict)
    own_paid_j: dict[str, list[float]] = field(default_factory=dict)
    #: The own-data release at :data:`LIMIT_EPSILON` (mean Spearman per seed).
    own_limit_j: list[float] = field(default_factory=list)
    #: Per seed, what any release can reach against ``J(S_C)``'s values
    #: (:func:`~dpmarket.experiments.attribution_limits.measure_limits`).
    limits: list[dict[str, Any]] = field(default_factory=list)


def _summary(name: str, seed: int) -> tuple[Any, Any]:
    """The default method's summary on a suite scenario, run as ``evaluate --suite`` runs it."""
    from dpmarket.experiments.runner import publish_sketches, simulate
    from dpmarket.experiments.suite_eval import DELTA, EPSILON, SuiteSetting

    runner_scenario = _scenario(name)
    sketches = publish_sketches(
        runner_scenario.owners,
        runner_scenario.sketch_mechanism(EPSILON, delta=DELTA),
        seed=1000 + seed,
    )
    result = simulate(
        runner_scenario.owners,
        runner_scenario.validation,
        runner_scenario.seed_set,
        SuiteSetting().config(runner_scenario),
        seed=seed,
        owner_sketches=sketches,
    )
    return runner_scenario, result


_SCENARIOS: dict[str, Any] = {}


def _scenario(name: str) -> Any:
    from dpmarket.experiments.suite import suite_scenario

    if name not in _SCENARIOS:
        _SCENARIOS[name] = suite_scenario(name, 0)
    return _SCENARIOS[name]


def measure_scenario(
    name: str, seeds: int, epsilons: Sequence[float], draws: int = DRAWS
) -> ScenarioAttribution:
    """Attribute the default method's summaries of one scenario and draw its private payouts.

    Parameters
    ----------
    name : str
        A suite scenario.
    seeds : int
        Session seeds 0 .. seeds - 1.
    epsilons : sequence of float
        Payout epsilons.
    draws : int
        Payout releases drawn per seed and epsilon (noise seeded per seed).
    """
    scenario = _scenario(name)
    owners = tuple(o.name for o in scenario.owners)
    out = ScenarioAttribution(
        name,
        load_split().half_of(name),
        len(owners),
        scenario.validation.shape[0],
        scenario.default_p,
    )
    rules: dict[str, ValueReward | ProportionalSplit] = {
        "value": ValueReward(10**6),
        "proportional": ProportionalSplit(10**6),
    }
    keys = [f"{e:g}" for e in epsilons]
    for table in (out.payouts_j, out.payouts_e, out.payouts_j5):
        table.update({rule: {k: [] for k in keys} for rule in rules})
    out.unshrunk_j.update({k: [] for k in keys})
    out.unshrunk_e.update({k: [] for k in keys})
    out.own_j.update({k: [] for k in keys})
    out.own_paid_j.update({k: [] for k in keys})
    for seed in range(seeds):
        _, result = _summary(name, seed)
        blocks = SummaryBlocks.from_summary(
            result.points, result.owner_ids, scenario.validation, scenario.gamma, owners=owners
        )
        game = ObjectiveGame(blocks)
        shapley = exact_shapley(game).values
        embedded = embedding_shapley(blocks).values
        share = blocks.counts / blocks.p
        out.delivering.append(int((blocks.counts > 0).sum()))
        out.paper_rule.append(spearman(paper_rule(game).values, shapley))
        out.leave_one_out.append(spearman(leave_one_out(game).values, shapley))
        out.embedding.append(spearman(embedded, shapley))
        out.counts_j.append(spearman(share, shapley))
        out.counts_e.append(spearman(share, embedded))
        out.grand.append(game.grand_value())
        active = blocks.counts > 0
        scale = payout_noise_scale(blocks.m, blocks.p, 1.0, rules["value"])
        out.signal_noise.append(float(embedded[active].std() / scale))
        out.null_owners.append(int((~active).sum()))
        delivering = np.sort(shapley[active])
        out.tied_owners.append(_tied(delivering))
        out.spread_j.append(float(delivering.std() / scale))
        gaps = np.diff(np.sort(shapley))
        distinct = gaps[gaps > 1e-12]
        out.close_pairs.append(float(np.mean(distinct < scale)) if distinct.size else 0.0)
        limit_noise = SeededNoise(np.random.default_rng(10_000 * seed + 8))
        limit = []
        for _ in range(draws):
            release = release_payouts(blocks, LIMIT_EPSILON, rules["value"], limit_noise)
            limit.append(spearman(np.array(release.payouts, np.float64), shapley))
        out.limit_j.append(float(np.mean(limit)))
        out.own_exact.append(spearman(own_shapley(blocks).values, shapley))
        own_noise = SeededNoise(np.random.default_rng(10_000 * seed + 9))
        for eps, key in zip(epsilons, keys, strict=True):
            released, paid = [], []
            for _ in range(draws):
                values = release_own_payouts(blocks, eps, rules["value"], own_noise).values
                released.append(spearman(values, shapley))
                paid.append(spearman(np.maximum(values, 0.0), shapley))
            out.own_j[key].append(float(np.mean(released)))
            out.own_paid_j[key].append(float(np.mean(paid)))
        own_limit = [
            spearman(
                release_own_payouts(blocks, LIMIT_EPSILON, rules["value"], own_noise).values,
                shapley,
            )
            for _ in range(draws)
        ]
        out.own_limit_j.append(float(np.mean(own_limit)))
        limits_rng = np.random.default_rng(10_000 * seed + 10)
        out.limits.append(
            measure_limits(
                blocks,
                shapley,
                result.points,
                scenario.validation,
                scenario.gamma,
                draws,
                limits_rng,
            )
        )
        for rule_name, rule in rules.items():
            noise = SeededNoise(np.random.default_rng(10_000 * seed + 7))
            for eps, key in zip(epsilons, keys, strict=True):
                against_j, against_e, raw_j, raw_e = [], [], [], []
                for _ in range(draws):
                    release = release_payouts(blocks, eps, rule, noise)
                    pays = np.array(release.payouts, np.float64)
                    against_j.append(spearman(pays, shapley))
                    against_e.append(spearman(pays, embedded))
                    if rule_name == "value":
                        raw = np.clip(release.values, 0.0, share)
                        raw_j.append(spearman(raw, shapley))
                        raw_e.append(spearman(raw, embedded))
                out.payouts_j[rule_name][key].append(float(np.mean(against_j)))
                out.payouts_e[rule_name][key].append(float(np.mean(against_e)))
                out.payouts_j5[rule_name][key].append(float(np.percentile(against_j, 5)))
                if rule_name == "value":
                    out.unshrunk_j[key].append(float(np.mean(raw_j)))
                    out.unshrunk_e[key].append(float(np.mean(raw_e)))
    return out


def _tied(values: NDArray[np.float64]) -> int:
    """Owners whose value equals another's to 1e-12 (``values`` sorted ascending)."""
    if values.size < 2:
        return 0
    same = np.diff(values) <= 1e-12
    tied = np.zeros(values.size, dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    return int(tied.sum())


def prior_fit(seeds: int = 2) -> dict[str, Any]:
    """The value rule's prior fitted on the design half of the suite (empirical Bayes): the mean
    and the standard deviation, over the owners with a delivered point, of a point's value
    ``phi_j / (n_j / p)`` (the embedding game's exact Shapley value per share of the summary)
    on every design scenario, whatever its K (the values are in closed form), session seeds
    0 .. seeds - 1. How :data:`~dpmarket.common.market.payouts.POINT_VALUE_MEAN` and
    :data:`~dpmarket.common.market.payouts.POINT_VALUE_SPREAD` were chosen (rounded to 0.01).

    Raises
    ------
    dpmarket.experiments.suite_split.HeldOutScenarioError
        Never for the recorded split (the check guards against a held-out scenario).
    """
    names = load_split().design
    require_design(names, "the value rule's prior")
    per_point: list[float] = []
    for name in names:
        scenario = _scenario(name)
        owners = tuple(o.name for o in scenario.owners)
        for seed in range(seeds):
            _, result = _summary(name, seed)
            blocks = SummaryBlocks.from_summary(
                result.points,
                result.owner_ids,
                scenario.validation,
                scenario.gamma,
                owners=owners,
            )
            share = blocks.counts / blocks.p
            active = share > 0
            per_point += list(embedding_shapley(blocks).values[active] / share[active])
    values = np.array(per_point)
    return {
        "scenarios": list(names),
        "seeds": seeds,
        "owners": int(values.size),
        "point_mean": float(values.mean()),
        "point_spread": float(values.std()),
    }


def measure_cost(name: str, p: int = COST_P, repeats: int = 7) -> dict[str, Any]:
    """Seconds of the default session, of the attribution and of payout + statement, K = 16.

    The attribution is what a curator would run after the session: the kernel blocks, the
    paper's rule, exact Shapley values of the paper's game (2^16 coalitions), leave-one-out, the
    embedding game's closed form and the own-data values; the payout step releases the noisy
    values (the embedding game's and the own-data ones), quotes, settles and signs the statement
    (ECDSA P-256). The least of ``repeats`` runs of each (the run least
    disturbed by other work on the machine), and their ratio.
    """
    from cryptography.hazmat.primitives.asymmetric import ec

    from dpmarket.common.privacy.noise import OpenDPNoise
    from dpmarket.experiments.runner import publish_sketches, simulate
    from dpmarket.experiments.suite_eval import DELTA, EPSILON, SuiteSetting

    scenario = _scenario(name)
    owners = tuple(o.name for o in scenario.owners)
    config = replace(SuiteSetting().config(scenario), summary_size=p)
    sketches = publish_sketches(
        scenario.owners, scenario.sketch_mechanism(EPSILON, delta=DELTA), seed=1000
    )
    key = ec.generate_private_key(ec.SECP256R1())
    session, attribution, settlement = [], [], []
    for r in range(repeats):
        start = time.perf_counter()
        result = simulate(
            scenario.owners,
            scenario.validation,
            scenario.seed_set,
            config,
            seed=r,
            owner_sketches=sketches,
        )
        session.append(time.perf_counter() - start)
        start = time.perf_counter()
        blocks = SummaryBlocks.from_summary(
            result.points, result.owner_ids, scenario.validation, scenario.gamma, owners=owners
        )
        game = ObjectiveGame(blocks)
        paper_rule(game)
        exact_shapley(game)
        leave_one_out(game)
        embedding_shapley(blocks)
        own_shapley(blocks)
        attribution.append(time.perf_counter() - start)
        start = time.perf_counter()
        rule = ValueReward(10**6)
        release = release_payouts(blocks, 1.0, rule, OpenDPNoise())
        release_own_payouts(blocks, 1.0, rule, OpenDPNoise())
        prices = {o: OwnerPrices(1, 10, 1000, 0) for o in owners}
        limits = {o: OwnerLimits(3 * p, 0.0, release.epsilon) for o in owners}
        quoted = quote(prices, limits, p, rule)
        counts = dict(zip(owners, (int(n) for n in blocks.counts), strict=True))
        spend = result.report.owner_spend
        records = {
            o: SessionRecord(
                spend[o].points if o in spend else counts[o],
                counts[o],
                0.0,
                release.owner_epsilon(o),
            )
            for o in owners
        }
        statement = settle("cost", "consumer", quoted, prices, records, release)
        sign_statement(statement, key)
        for o in owners:
            sign_statement(statement.for_owner(o), key)
        settlement.append(time.perf_counter() - start)
    return {
        "scenario": name,
        "owners": len(owners),
        "p": p,
        "session_seconds": min(session),
        "attribution_seconds": min(attribution),
        "payout_seconds": min(settlement),
        "overhead": (min(attribution) + min(settlement)) / min(session),
    }


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def attribution_table(
    results: Sequence[ScenarioAttribution], epsilons: Sequence[float]
) -> tuple[Table, Table]:
    """Two tables of Spearman correlations, each within 80 columns for five epsilons: against the
    embedding game's exact Shapley values (the payouts' own utility: the cost of privacy) and
    against the paper's game's, with the summary's value ``J(S)`` and the values' spread over the
    noise at epsilon 1 (``sd/b``); each row names its scenario's half of the suite's split
    (``h``: D design, H held-out; the held-out half is the measure). ``n_j``: ranking by the
    delivered counts; ``raw``: the value rule's release paid without shrinkage, epsilon 1;
    ``prop``: the proportional split, epsilon 1; ``rule``: the paper's rule; ``e``: the
    embedding game's exact values; ``p5 1``: the 5th percentile over draws at epsilon 1."""
    keys = [f"{e:g}" for e in epsilons]

    def table(title: str, columns: Sequence[str]) -> Table:
        out = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for name in columns:
            left = name in ("scenario", "h")
            out.add_column(name, justify="left" if left else "right", no_wrap=True)
        return out

    own = table(
        "Spearman with the embedding game's exact Shapley values (value rule)",
        ["scenario", "h", "K/has", "n_j", *(f"ε {k}" for k in keys), "raw", "prop"],
    )
    paper = table(
        "Spearman with the exact Shapley values of J(S_C)",
        ["scenario", "h", "J(S)", "sd/b", "rule", "LOO", "e", "n_j", "ε 1", "ε 10", "p5 1"],
    )
    for r in results:
        half = "H" if r.half == "held-out" else "D"
        own.add_row(
            r.name,
            half,
            f"{r.owners}/{_mean(r.delivering):.0f}",
            f"{_mean(r.counts_e):.2f}",
            *(f"{_mean(r.payouts_e['value'][k]):.2f}" for k in keys),
            f"{_mean(r.unshrunk_e.get('1', [])):.2f}",
            f"{_mean(r.payouts_e['proportional'].get('1', [])):.2f}",
        )
        paper.add_row(
            r.name,
            half,
            f"{_mean(r.grand):.2f}",
            f"{_mean(r.signal_noise):.1f}",
            f"{_mean(r.paper_rule):.2f}",
            f"{_mean(r.leave_one_out):.2f}",
            f"{_mean(r.embedding):.2f}",
            f"{_mean(r.counts_j):.2f}",
            f"{_mean(r.payouts_j['value'].get('1', [])):.2f}",
            f"{_mean(r.payouts_j['value'].get('10', [])):.2f}",
            f"{_mean(r.payouts_j5['value'].get('1', [])):.2f}",
        )
    return own, paper


def own_table(results: Sequence[ScenarioAttribution], epsilons: Sequence[float]) -> Table:
    """The own-data release against ``J(S_C)``'s exact Shapley values, within 80 columns for
    five epsilons: its exact values (``own``, no noise), its released values at each epsilon,
    and those clipped at 0 at epsilon 1 (``≥0 ε 1``), beside the value rule's payouts at
    epsilon 1 (``pay ε 1``)."""
    keys = [f"{e:g}" for e in epsilons]
    out = Table(
        title="The own-data release against J(S_C)'s Shapley values",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["scenario", "h", "own", *(f"ε {k}" for k in keys), "≥0 ε 1", "pay ε 1"]
    for name in columns:
        left = name in ("scenario", "h")
        out.add_column(name, justify="left" if left else "right", no_wrap=True)
    for r in results:
        out.add_row(
            r.name,
            "H" if r.half == "held-out" else "D",
            f"{_mean(r.own_exact):.2f}",
            *(f"{_mean(r.own_j[k]):.2f}" for k in keys),
            f"{_mean(r.own_paid_j.get('1', [])):.2f}",
            f"{_mean(r.payouts_j['value'].get('1', [])):.2f}",
        )
    return out


def limits_table(results: Sequence[ScenarioAttribution]) -> Table:
    """What any release can reach against ``J(S_C)``'s exact Shapley values, within 80 columns
    (:mod:`dpmarket.experiments.attribution_limits`); at epsilon 1 but where marked ``k``
    (epsilon 1,000): the median gap between adjacent delivering owners' values over the
    oracle's noise scale (``gap``); the bound on every epsilon-DP mechanism from the values
    after one or two replaced validation points (``any``; their Spearman is in the record);
    the oracle, the values plus Laplace noise of their sensitivity to one validation point
    (``orc``) or to that and one owner's point (``orcO``); the value rule's payouts (``pay``)
    and the own-data release (``own``); the paper's rule (``rule``, no noise)."""
    out = Table(
        title="What any release reaches against J(S_C)'s Shapley values",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["scenario", "h", "gap", "any", "orc", "orcO", "pay", "own"]
    columns += ["orcK", "payK", "ownK", "rule"]
    for name in columns:
        left = name in ("scenario", "h")
        out.add_column(name, justify="left" if left else "right", no_wrap=True)
    one, big = (f"{e:g}" for e in LIMIT_EPSILONS)
    for r in results:
        out.add_row(
            r.name,
            "H" if r.half == "held-out" else "D",
            f"{_mean([x['gap_median'] for x in r.limits]):.1f}",
            f"{_mean([x['bound'][one] for x in r.limits]):.2f}",
            f"{_mean([x['oracle'][one] for x in r.limits]):.2f}",
            f"{_mean([x['oracle_owners'][one] for x in r.limits]):.2f}",
            f"{_mean(r.payouts_j['value'].get(one, [])):.2f}",
            f"{_mean(r.own_j.get(one, [])):.2f}",
            f"{_mean([x['oracle'][big] for x in r.limits]):.2f}",
            f"{_mean(r.limit_j):.2f}",
            f"{_mean(r.own_limit_j):.2f}",
            f"{_mean(r.paper_rule):.2f}",
        )
    return out


def diagnosis_table(results: Sequence[ScenarioAttribution]) -> Table:
    """Where the ranking against ``J(S_C)``'s exact Shapley values is lost, within 80 columns:
    per scenario, owners with no delivered point (``null``: exactly 0 in both rankings, tied),
    delivering owners tied with another (``tied``), the values' spread over the payout noise
    scale at epsilon 1 (``sd/b``) and the share of adjacent pairs of distinct values closer than
    it (``<b``; exact ties left out), beside the embedding game's exact values (``e``: the
    change of game without noise), the value rule's payouts at epsilon 1 and the same pipeline
    at :data:`LIMIT_EPSILON` (``ε 1000``: the game and the rule without their noise)."""
    out = Table(
        title="Where the ranking against J(S_C)'s values is lost",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["scenario", "h", "K/has", "null", "tied", "sd/b", "<b", "e", "ε 1", "ε 1000"]
    for name in columns:
        left = name in ("scenario", "h")
        out.add_column(name, justify="left" if left else "right", no_wrap=True)
    for r in results:
        out.add_row(
            r.name,
            "H" if r.half == "held-out" else "D",
            f"{r.owners}/{_mean(r.delivering):.0f}",
            f"{_mean(r.null_owners):.0f}",
            f"{_mean(r.tied_owners):.0f}",
            f"{_mean(r.spread_j):.1f}",
            f"{_mean(r.close_pairs):.2f}",
            f"{_mean(r.embedding):.2f}",
            f"{_mean(r.payouts_j['value'].get('1', [])):.2f}",
            f"{_mean(r.limit_j):.2f}",
        )
    return out


def run_attribution(
    out_dir: Path,
    *,
    seeds: int = 3,
    epsilons: Sequence[float] = EPSILONS,
    names: Sequence[str] | None = None,
    cost: bool = True,
    prior: bool = True,
    draws: int = DRAWS,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure every suite scenario with at most :data:`MAX_OWNERS` owners (or those named), the
    cost at K = 16, p = 200 (``cost``) and the value rule's prior (``prior``); write
    ``<out_dir>/attribution.json`` and print the tables.

    Raises
    ------
    ValueError
        If a named scenario is not in the suite or has more than :data:`MAX_OWNERS` owners.
    """
    from dpmarket.experiments.suite import SUITE_NAMES

    console = console or Console()
    chosen = list(names) if names else list(SUITE_NAMES)
    results = []
    for name in chosen:
        scenario = _scenario(name)
        if len(scenario.owners) > MAX_OWNERS:
            if names:
                raise ValueError(
                    f"{name} has {len(scenario.owners)} owners, more than "
                    f"{MAX_OWNERS}: exact Shapley values are the reference"
                )
            continue
        console.print(f"[bold]{name}[/]: {seeds} seed(s) × {len(epsilons)} ε × {draws} draws")
        results.append(measure_scenario(name, seeds, epsilons, draws))
    costs = [measure_cost(name) for name in COST_SCENARIOS] if cost else []
    fit = prior_fit() if prior else {}
    report = {
        "seeds": seeds,
        "draws": draws,
        "epsilons": list(epsilons),
        "goal": GOAL,
        "scenarios": [asdict(r) for r in results],
        "cost": costs,
        "prior_fit": fit,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "attribution.json").write_text(json.dumps(report, indent=2))
    for table in attribution_table(results, epsilons):
        console.print(table)
    console.print(diagnosis_table(results))
    console.print(own_table(results, epsilons))
    console.print(limits_table(results))
    if fit:
        console.print(
            f"value rule's prior fitted on the design half ({len(fit['scenarios'])} scenarios, "
            f"{fit['owners']} owners): a point's value has mean {fit['point_mean']:.3f} and "
            f"standard deviation {fit['point_spread']:.3f}; the default is "
            f"{POINT_VALUE_MEAN / 1e9:g}, {POINT_VALUE_SPREAD / 1e9:g}"
        )
    for c in costs:
        console.print(
            f"cost {c['scenario']} (K = {c['owners']}, p = {c['p']}): session "
            f"{c['session_seconds']:.2f} s, attribution {c['attribution_seconds']:.3f} s, payout "
            f"+ statement {c['payout_seconds']:.3f} s: +{100 * c['overhead']:.1f} %"
        )
    return report
