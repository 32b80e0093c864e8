"""Cost of a secure-aggregation round in one process, per phase.

For every workload (``S`` sites, vectors of length ``D``, with no dropout or with one site lost
after key sharing, i.e. before its masked input arrives, so the aggregator must rebuild its key
and remove its pairwise masks) the round of :func:`common.secagg.protocol.run_in_process` runs
``--repeat`` times after one warm-up run. Everything is sequential: the reported seconds are the
total work of all ``S`` sites and the aggregator, as one core would do it.

Each run is a production round: a fresh round id, key material from ``os.urandom``, the rounding
coins from :func:`common.privacy.rng.production_rng`, ECDSA P-256 signatures on the key
advertisements checked by every site. The sites' identity keys (their certificate keys in the
service) are made once per workload, outside the timing. Every result is checked against the
plain sum (within the quantization bound) before it is recorded.

Run ``python -m bench.secagg --out out/bench-secagg.json``; ``--quick`` for a few seconds.
The report is a JSON list of records with keys ``sites``, ``vector_length``, ``dropouts``,
``transport`` (``"in-process"``), ``median_seconds`` (wall clock), ``phases`` (median seconds per
phase: ``advertise_keys``, ``share_keys``, ``masked_input``, ``unmask``, ``finish``), and the
details of the run (threshold, encoding, every run's seconds, CPU seconds, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from common.privacy.rng import production_rng
from common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from common.secagg.fixedpoint import FixedPoint
from common.secagg.protocol import RoundParams, run_in_process

SITES: tuple[int, ...] = (5, 20)
LENGTHS: tuple[int, ...] = (1_000, 100_000)
DROPOUTS: tuple[int, ...] = (0, 1)
QUICK_SITES: tuple[int, ...] = (3, 5)
QUICK_LENGTHS: tuple[int, ...] = (100, 1_000)
DEFAULT_REPEAT = 7
#: Inputs in [-CLIP, CLIP] on a grid of 2^RESOLUTION_BITS - 1 steps (k = 32 + ceil(log2 S)).
CLIP = 1.0
RESOLUTION_BITS = 32
#: The spec's target for S = 20, D = 100,000 in-process on the project's 2-core machine.
TARGET_SECONDS = 0.3
PHASES = ("advertise_keys", "share_keys", "masked_input", "unmask", "finish")


def threshold_for(sites: int) -> int:
    """The smallest threshold allowed: ``floor(S / 2) + 1``."""
    return sites // 2 + 1


def measure(sites: int, length: int, dropouts: int, repeat: int) -> dict[str, Any]:
    """Time ``repeat`` rounds (after a warm-up) of one workload; return its record."""
    names = [f"owner-{i:02d}" for i in range(sites)]
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in names}
    signers = {name: EcdsaSigner(key) for name, key in keys.items()}
    verifier = EcdsaVerifier({name: key.public_key() for name, key in keys.items()})
    fixed_point = FixedPoint(CLIP, RESOLUTION_BITS, sites)
    threshold = threshold_for(sites)
    data_rng = np.random.default_rng(sites * 1_000_003 + length)
    inputs = {name: data_rng.uniform(-CLIP, CLIP, length) for name in names}
    drop_at: dict[str, Any] = {name: "mask" for name in names[1 : 1 + dropouts]}
    expected = np.sum([inputs[n] for n in names if n not in drop_at], axis=0)
    bound = (sites - dropouts) / fixed_point.scale

    walls: list[float] = []
    cpus: list[float] = []
    phases: list[dict[str, float]] = []
    max_error = 0.0
    load_before = os.getloadavg()[0]
    for run in range(repeat + 1):
        params = RoundParams.create(names, threshold, length, fixed_point)
        phase_seconds: dict[str, float] = {}
        wall, cpu = time.perf_counter(), time.process_time()
        result = run_in_process(
            params,
            inputs,
            drop_at=drop_at,
            signers=signers,
            verifier=verifier,
            rng=production_rng(),
            phase_seconds=phase_seconds,
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        error = float(np.max(np.abs(result - expected)))
        if not error < bound:
            raise AssertionError(f"sum off by {error}, above the quantization bound {bound}")
        if run == 0:
            continue  # warm-up: first-use allocations and imports
        walls.append(wall)
        cpus.append(cpu)
        phases.append(phase_seconds)
        max_error = max(max_error, error)
    return {
        "sites": sites,
        "vector_length": length,
        "dropouts": dropouts,
        "transport": "in-process",
        "median_seconds": statistics.median(walls),
        "phases": {p: statistics.median(ph[p] for ph in phases) for p in PHASES},
        "median_cpu_seconds": statistics.median(cpus),
        "runs_seconds": walls,
        "repeat": repeat,
        "threshold": threshold,
        "dropped_after": "share_keys" if dropouts else None,
        "resolution_bits": RESOLUTION_BITS,
        "modulus_bits": fixed_point.modulus_bits,
        "max_abs_error": max_error,
        "error_bound": bound,
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": os.getloadavg()[0],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.secagg", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out/bench-secagg.json"))
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="timed runs per case")
    parser.add_argument("--sites", type=int, nargs="+", help=f"site counts (default {SITES})")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help=f"vector lengths (default {LENGTHS})"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and 2 runs each: a few seconds"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the grid, write the JSON list of records, print a table; return the records."""
    args = build_parser().parse_args(argv)
    sites = tuple(args.sites or (QUICK_SITES if args.quick else SITES))
    lengths = tuple(args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS))
    repeat = 2 if args.quick else args.repeat
    if repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, got {repeat}")
    records = [measure(s, d, drop, repeat) for s in sites for d in lengths for drop in DROPOUTS]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")

    header = f"{'S':>3} {'D':>8} {'drop':>4} {'median s':>9}  " + " ".join(
        f"{p:>14}" for p in PHASES
    )
    print(header)
    for r in records:
        cells = " ".join(f"{r['phases'][p]:>14.4f}" for p in PHASES)
        print(
            f"{r['sites']:>3} {r['vector_length']:>8} {r['dropouts']:>4} "
            f"{r['median_seconds']:>9.4f}  {cells}"
        )
    for r in records:
        if r["sites"] == 20 and r["vector_length"] == 100_000:
            verdict = "met" if r["median_seconds"] <= TARGET_SECONDS else "NOT met"
            print(
                f"target S=20, D=100,000, {r['dropouts']} dropout(s): "
                f"{r['median_seconds']:.3f} s <= {TARGET_SECONDS} s {verdict}"
            )
    print(f"wrote {args.out}")
    return records


if __name__ == "__main__":
    main()
