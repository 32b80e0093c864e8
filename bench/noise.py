"""Cost of the noise sources: OpenDP's floating-point-safe samplers against numpy.

For every case (a noise kind and vector length the protocols use) both sources of
:mod:`dpmarket.common.privacy.noise` are timed in one invocation, through their public methods
(argument checks included):

* **numpy**: :class:`~dpmarket.common.privacy.noise.SeededNoise` on
  :func:`dpmarket.common.privacy.rng.production_rng` (the CSPRNG-seeded PCG64 that production used
  before);
* **opendp**: :class:`~dpmarket.common.privacy.noise.OpenDPNoise` (the production source now).

Per call it reports the median over ``--repeat`` timeit-style repeats (each repeat runs the call
enough times to last ``--min-seconds``, measured with ``time.perf_counter``), the OpenDP/numpy
ratio, OpenDP's one-off costs (importing the library; building each measurement, which is then
cached) and the added seconds per session for the summarization paper's MWEM (1,656 scalar
Laplace measurements) and for the candidates method (one d = 140 Gaussian vector and one vector
of K Laplace counts). The report is written as JSON and summarised as a table on stdout.

Run ``python -m bench.noise --out out/bench-noise.json``, or ``--quick`` for a few seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import logging
import math
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bench.report import configure_logging
from bench.rounds import machine_info
from dpmarket.common.privacy.noise import NoiseSource, OpenDPNoise, SeededNoise
from dpmarket.common.privacy.rng import production_rng

logger = logging.getLogger("bench.noise")

#: Dimension of the h1 features: the validation embedding and every tree node are d-vectors.
D = 140
#: MWEM measurements per session in the summarization paper (Section 4, T_init = 1,656), each one
#: scalar Laplace draw.
MWEM_DRAWS = 1_656
#: Owner counts of the candidates method: one vector of K Laplace counts per session.
CANDIDATE_K: tuple[int, ...] = (8, 50)
LARGE_SIZE = 1_000_000
QUICK_LARGE_SIZE = 10_000
#: Noise scale and standard deviation of every case. The cost does not depend on them (OpenDP's
#: sampler works on integers of a fixed size at the default grid); ``scale_check`` in the report
#: measures d = 140 at three scales to show it.
SCALE = 1.0
SCALE_CHECK = (1e-3, 1.0, 1e3)

DEFAULT_REPEAT = 7
DEFAULT_MIN_SECONDS = 0.05
DEFAULT_BUDGET_SECONDS = 10.0

Kind = Literal["laplace", "gaussian"]


@dataclass(frozen=True)
class Case:
    """One benchmarked draw: ``size`` i.i.d. values of ``kind`` noise in one call."""

    name: str
    kind: Kind
    size: int
    use: str


def cases(large_size: int) -> list[Case]:
    """The protocols' noise shapes, plus ``large_size`` values of each kind."""
    return [
        Case("gaussian_d140", "gaussian", D, "validation embedding, tree node (d = 140)"),
        Case("laplace_k8", "laplace", 8, "candidates: K = 8 Laplace counts"),
        Case("laplace_k50", "laplace", 50, "candidates: K = 50 Laplace counts"),
        Case("laplace_scalar", "laplace", 1, f"one MWEM measurement ({MWEM_DRAWS} per session)"),
        Case("laplace_large", "laplace", large_size, "large vector"),
        Case("gaussian_large", "gaussian", large_size, "large vector"),
    ]


# ---------------------------------------------------------------------------------- timing
def time_calls(
    fn: Callable[[], object], *, repeat: int, min_seconds: float, budget_seconds: float
) -> dict[str, Any]:
    """Time ``fn`` like ``timeit``: median over repeats of the mean time of one call.

    One untimed-for-the-median call first estimates the cost; each repeat then runs ``number``
    calls, enough to last ``min_seconds``. Repeats are cut so that the total stays within
    ``budget_seconds``; when a single call exceeds the budget, that first call is the only sample
    (``single_call`` is then true).

    Returns
    -------
    dict
        ``per_call_us`` (median), ``min_us``, ``max_us``, ``first_call_us``, ``number``,
        ``repeat`` (repeats actually run) and ``single_call``; times in microseconds.
    """
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first >= budget_seconds:
        samples = [first]
        number, repeats, single = 1, 1, True
    else:
        number = max(1, math.ceil(min_seconds / max(first, 1e-9)))
        repeats = max(1, min(repeat, int(budget_seconds // (max(first, 1e-9) * number))))
        totals = timeit.repeat(fn, timer=time.perf_counter, number=number, repeat=repeats)
        samples = [t / number for t in totals]
        single = False
    return {
        "per_call_us": statistics.median(samples) * 1e6,
        "min_us": min(samples) * 1e6,
        "max_us": max(samples) * 1e6,
        "first_call_us": first * 1e6,
        "number": number,
        "repeat": repeats,
        "single_call": single,
    }


def _draw(source: NoiseSource, kind: Kind, scale: float, size: int) -> Callable[[], object]:
    method = source.laplace if kind == "laplace" else source.gaussian
    return lambda: method(scale, size)


def opendp_import_ms() -> dict[str, Any]:
    """Time importing OpenDP (loading its native library) and enabling its "contrib" feature."""
    already = "opendp" in sys.modules
    t0 = time.perf_counter()
    import opendp.prelude as dp

    imported = time.perf_counter() - t0
    dp.enable_features("contrib")
    return {
        "version": importlib.metadata.version("opendp"),
        "import_ms": imported * 1e3,
        "already_imported": already,
    }


def build_us(kind: Kind, scale: float, size: int) -> float:
    """Time building one OpenDP measurement (a cache miss of ``OpenDPNoise``), in microseconds."""
    from dpmarket.common.privacy.noise import _opendp_measurement

    _opendp_measurement.cache_clear()
    t0 = time.perf_counter()
    _opendp_measurement(kind, scale, size)
    return (time.perf_counter() - t0) * 1e6


def run_case(case: Case, *, repeat: int, min_seconds: float, budget: float) -> dict[str, Any]:
    """Time one case with numpy and OpenDP; return its JSON record (microseconds)."""
    numpy_source = SeededNoise(production_rng())
    opendp_source = OpenDPNoise()
    numpy_t = time_calls(
        _draw(numpy_source, case.kind, SCALE, case.size),
        repeat=repeat,
        min_seconds=min_seconds,
        budget_seconds=budget,
    )
    build = build_us(case.kind, SCALE, case.size)
    opendp_t = time_calls(
        _draw(opendp_source, case.kind, SCALE, case.size),
        repeat=repeat,
        min_seconds=min_seconds,
        budget_seconds=budget,
    )
    opendp_t["build_us"] = build
    ratio = opendp_t["per_call_us"] / numpy_t["per_call_us"]
    return {
        **asdict(case),
        "numpy": numpy_t,
        "opendp": opendp_t,
        "ratio_opendp_over_numpy": ratio,
        "opendp_us_per_value": opendp_t["per_call_us"] / case.size,
        "numpy_us_per_value": numpy_t["per_call_us"] / case.size,
    }


def scale_check(*, repeat: int, min_seconds: float, budget: float) -> list[dict[str, Any]]:
    """OpenDP's per-call time at d = 140 for several scales (it should not depend on them)."""
    source = OpenDPNoise()
    out = []
    for kind in ("laplace", "gaussian"):
        for scale in SCALE_CHECK:
            t = time_calls(
                _draw(source, kind, scale, D),
                repeat=repeat,
                min_seconds=min_seconds,
                budget_seconds=budget,
            )
            out.append({"kind": kind, "size": D, "scale": scale, "per_call_us": t["per_call_us"]})
    return out


def session_estimates(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Noise seconds per session with each source, and what OpenDP adds, from the per-call medians.

    MWEM: ``MWEM_DRAWS`` scalar Laplace calls. Candidates: one d = 140 Gaussian call plus one call
    of K Laplace counts, for each K in ``CANDIDATE_K``.
    """
    by_name = {r["name"]: r for r in records}

    def seconds(names: Sequence[tuple[str, int]], source: str) -> float:
        return sum(by_name[n][source]["per_call_us"] * calls for n, calls in names) / 1e6

    out: dict[str, Any] = {}
    mwem = [("laplace_scalar", MWEM_DRAWS)]
    out["mwem"] = {
        "draws": f"{MWEM_DRAWS} scalar Laplace calls",
        "numpy_seconds": seconds(mwem, "numpy"),
        "opendp_seconds": seconds(mwem, "opendp"),
    }
    for k in CANDIDATE_K:
        calls = [("gaussian_d140", 1), (f"laplace_k{k}", 1)]
        out[f"candidates_k{k}"] = {
            "draws": f"one d={D} Gaussian vector + one vector of K={k} Laplace counts",
            "numpy_seconds": seconds(calls, "numpy"),
            "opendp_seconds": seconds(calls, "opendp"),
        }
    for est in out.values():
        est["added_seconds"] = est["opendp_seconds"] - est["numpy_seconds"]
    return out


# ------------------------------------------------------------------------------ reporting
def format_table(report: dict[str, Any]) -> str:
    """A small human-readable table of the report."""
    header = (
        f"{'case':<15} {'kind':<9} {'size':>8} {'numpy us':>10} {'opendp us':>12} "
        f"{'ratio':>7} {'opendp us/value':>15} {'build us':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in report["cases"]:
        single = " (1 call)" if r["opendp"]["single_call"] else ""
        lines.append(
            f"{r['name']:<15} {r['kind']:<9} {r['size']:>8} {r['numpy']['per_call_us']:>10.1f} "
            f"{r['opendp']['per_call_us']:>12.1f} {r['ratio_opendp_over_numpy']:>7.0f} "
            f"{r['opendp_us_per_value']:>15.2f} {r['opendp']['build_us']:>9.0f}{single}"
        )
    lines.append("")
    imp = report["opendp"]
    lines.append(f"opendp {imp['version']}: import {imp['import_ms']:.0f} ms (once per process)")
    lines.append(
        "opendp d=140 per call by scale: "
        + ", ".join(
            f"{c['kind']} {c['scale']:g}: {c['per_call_us']:.0f} us" for c in report["scale_check"]
        )
    )
    for name, est in report["sessions"].items():
        lines.append(
            f"session {name} ({est['draws']}): numpy {est['numpy_seconds'] * 1e3:.3f} ms, "
            f"opendp {est['opendp_seconds'] * 1e3:.1f} ms, added {est['added_seconds']:.3f} s"
        )
    lines.append(f"total bench runtime: {report['total_runtime_seconds']:.1f} s")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CLI
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.noise",
        description="Per-call cost of OpenDP's noise samplers against numpy's.",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/bench-noise.json"), help="JSON report."
    )
    parser.add_argument(
        "--repeat", type=_positive_int, default=DEFAULT_REPEAT, help="timeit repeats per case."
    )
    parser.add_argument(
        "--min-seconds",
        type=_positive_float,
        default=DEFAULT_MIN_SECONDS,
        help="Least duration of one repeat (sets the calls per repeat).",
    )
    parser.add_argument(
        "--budget",
        type=_positive_float,
        default=DEFAULT_BUDGET_SECONDS,
        help="Most seconds of repeats per case and source; a single call over it is timed once.",
    )
    parser.add_argument(
        "--large-size",
        type=_positive_int,
        default=None,
        help=f"Length of the large vectors (default {LARGE_SIZE}).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"Smoke run: large vectors of {QUICK_LARGE_SIZE}, 3 repeats of 0.01 s.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the JSON report, print the table; return the report."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    started = time.perf_counter()
    large: int = args.large_size or (QUICK_LARGE_SIZE if args.quick else LARGE_SIZE)
    repeat: int = 3 if args.quick else args.repeat
    min_seconds: float = 0.01 if args.quick else args.min_seconds
    budget: float = min(args.budget, 1.0) if args.quick else args.budget
    machine = machine_info()
    opendp_info = opendp_import_ms()
    machine["opendp"] = opendp_info["version"]
    parameters = {
        "large_size": large,
        "repeat": repeat,
        "min_seconds": min_seconds,
        "budget_seconds": budget,
        "scale": SCALE,
        "d": D,
        "mwem_draws": MWEM_DRAWS,
        "candidate_k": list(CANDIDATE_K),
        "quick": args.quick,
    }
    logger.info("bench.noise: %s", parameters)
    records = []
    for case in cases(large):
        logger.info("%s: %s, %d value(s) per call", case.name, case.kind, case.size)
        rec = run_case(case, repeat=repeat, min_seconds=min_seconds, budget=budget)
        logger.info(
            "  numpy %.1f us, opendp %.1f us per call (x%.0f)",
            rec["numpy"]["per_call_us"],
            rec["opendp"]["per_call_us"],
            rec["ratio_opendp_over_numpy"],
        )
        records.append(rec)
    scales = scale_check(repeat=repeat, min_seconds=min_seconds, budget=budget)
    machine["loadavg_end"] = list(os.getloadavg())
    report: dict[str, Any] = {
        "benchmark": "bench.noise",
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [sys.executable, "-m", "bench.noise", *(sys.argv[1:] if argv is None else argv)],
        "machine": machine,
        "parameters": parameters,
        "units": {
            "per_call_us": "median over repeats of the mean wall time of one call, microseconds "
            "(time.perf_counter), argument checks and array conversion included",
            "build_us": "building one OpenDP measurement (once per kind, scale and size; cached)",
            "first_call_us": "the first call of the case (OpenDP: measurement already built)",
            "session seconds": "per-call medians times the calls a session makes",
        },
        "sources": {
            "numpy": "SeededNoise(production_rng()): numpy's samplers on a CSPRNG-seeded PCG64",
            "opendp": "OpenDPNoise(): OpenDP make_laplace / make_gaussian on a zero float vector "
            "of the case's size, default (finest) granularity 2^-1074",
        },
        "opendp": opendp_info,
        "cases": records,
        "scale_check": scales,
        "sessions": session_estimates(records),
    }
    report["total_runtime_seconds"] = time.perf_counter() - started
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(format_table(report))
    logger.info("report -> %s (%.1f s)", out, report["total_runtime_seconds"])
    return report


if __name__ == "__main__":
    main()
