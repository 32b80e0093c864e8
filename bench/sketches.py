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
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.noise import time_calls
from bench.rounds import machine_info
from common.privacy.noise import OpenDPNoise
from common.sketches import (
    Domain,
    FeatureMap,
    M2MEstimator,
    SketchMechanism,
    SyntheticDesign,
    draw_race,
    draw_rff,
    histogram_map,
)
from common.sketches.tasks import moment_function

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
    section["machine"]["loadavg_end"] = list(os.getloadavg())
    section["total_runtime_seconds"] = time.perf_counter() - started
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    if out.exists():
        report = json.loads(out.read_text(encoding="utf-8"))
    report["sketches"] = section
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(format_table(section))
    return section


if __name__ == "__main__":
    main()
