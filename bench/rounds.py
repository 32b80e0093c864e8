"""Round latency of the summarization protocol, in-process against networked (``make bench``).

For every workload (K owners of N points each) and every method (``private``, ``greedy``) the
same session, with the same seed, runs three times in one invocation:

* **in-process**: :func:`dpmarket.experiments.runner.simulate`, owners as plain objects in this
  process;
* **in-process with ledgers**: the same owners each charging a durable ledger under the networked
  owners' policy (SQLite, ``synchronous=FULL``), as an owner process does before every release:
  the networked run over this one isolates what the transport costs;
* **networked, mTLS** (the production transport): :class:`dpmarket.deploy.launcher.LocalCluster` (K
  owner processes and a curator process on 127.0.0.1, certificates issued by the launcher) driven by
  :meth:`dpmarket.consumer.client.CuratorClient.summarize`;
* **networked, plaintext**: the same on a second cluster started with ``insecure=True`` (every
  service ``--insecure``), to measure what mTLS costs.

It records the per-round wall time the curator measures (``SessionReport.round_seconds``), the
session and end-to-end times, the bid throughput, the networked/in-process and mTLS/plaintext
ratios, whether the three runs returned the same summary, and a micro-benchmark of the arithmetic
floor of a round (one float32 ``(N, d) @ (d,)`` product, mask and argmax per owner, and the time
reading every owner's features once takes on the machine's cores). The report is
written as JSON and summarised as a table on stdout; progress goes to stderr.

Run ``python -m bench.rounds --out out/bench.json`` (``make bench``) or ``--quick`` for a tiny run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.report import configure_logging
from dpmarket.common.summarization.methods import Method, method_config
from dpmarket.common.summarization.summary import ProgressEvent, SummaryResult
from dpmarket.runtime.tables import PointSet, save_point_set

logger = logging.getLogger("bench.rounds")

#: Methods benchmarked by default (``uniform`` has a single round and no bids).
DEFAULT_METHODS: tuple[Method, ...] = ("private", "greedy")
DEFAULT_K: tuple[int, ...] = (5, 16)
DEFAULT_N = 50_000
DEFAULT_ROUNDS = 200
DEFAULT_D = 140
DEFAULT_N_FEATURES = 16
DEFAULT_VALIDATION = 500
DEFAULT_SEED_SET = 30
DEFAULT_SEED = 20240501
QUICK_K: tuple[int, ...] = (2,)
QUICK_N = 2_000
QUICK_ROUNDS = 10

#: Spec targets. ``RATIO_TARGET``: networked median round latency over in-process median round
#: latency. ``ROUND_TARGET_MS``: networked median round latency with ``ROUND_TARGET_K`` owners of
#: ``ROUND_TARGET_N`` points each, on loopback.
RATIO_TARGET = 1.3
ROUND_TARGET_MS = 15.0
ROUND_TARGET_K = 16
ROUND_TARGET_N = 50_000

#: Standard deviation of the owners' and the validation set's means around 0 (covariate shift).
MEAN_SHIFT = 1.0

DATA_NOTE = (
    "Synthetic: every owner holds a Gaussian cloud N(mu_i, I) with its own seeded mean "
    "mu_i ~ N(0, MEAN_SHIFT^2 I) (covariate-shifted owners); the validation set is drawn around "
    "another mean mu_v, the seed set around 0. Synthetic data because the benchmark needs "
    "controlled sizes (K owners of exactly N points, n_features columns) far beyond the bundled "
    "real scenarios, and the cost of a round depends only on N, K and d, not on the values."
)


# ------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Workload:
    """One benchmark point: K owners of ``n_points`` points with ``n_features`` raw features."""

    k: int
    n_points: int
    rounds: int
    d: int
    n_features: int
    validation_size: int
    seed_set_size: int
    seed: int


@dataclass(frozen=True)
class WorkloadData:
    """The generated sets of a workload."""

    owners: list[PointSet]
    validation: NDArray[np.float64]
    seed_set: NDArray[np.float64]


def make_data(w: Workload) -> WorkloadData:
    """Generate the synthetic owners, validation set and seed set of a workload (see DATA_NOTE).

    Returns
    -------
    WorkloadData
        ``k`` point sets of shape (n_points, n_features), float64, named ``owner-00`` ...;
        a validation set of shape (validation_size, n_features) and a seed set of shape
        (seed_set_size, n_features).
    """
    rng = np.random.default_rng(w.seed)
    means = rng.normal(0.0, MEAN_SHIFT, size=(w.k, w.n_features))
    validation_mean = rng.normal(0.0, MEAN_SHIFT, size=w.n_features)
    owners = [
        PointSet(
            features=rng.normal(means[i], 1.0, size=(w.n_points, w.n_features)),
            labels=None,
            name=f"owner-{i:02d}",
        )
        for i in range(w.k)
    ]
    validation = rng.normal(validation_mean, 1.0, size=(w.validation_size, w.n_features))
    seed_set = rng.normal(0.0, 1.0, size=(w.seed_set_size, w.n_features))
    return WorkloadData(owners=owners, validation=validation, seed_set=seed_set)


# ---------------------------------------------------------------------------------- timing
def latency_stats(seconds: Sequence[float]) -> dict[str, float | int]:
    """Median, p90, max, mean and min of per-round wall times, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    if ms.size == 0:
        return {"rounds": 0}
    return {
        "rounds": int(ms.size),
        "median_ms": float(np.median(ms)),
        "p90_ms": float(np.percentile(ms, 90)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "min_ms": float(ms.min()),
        "first_round_ms": float(ms[0]),
        "sum_s": float(ms.sum() / 1e3),
    }


def run_record(
    result: SummaryResult, end_to_end: float, w: Workload, transport: str, load_before: float
) -> dict[str, Any]:
    """Timings of one finished session (seconds and milliseconds, as named)."""
    rounds = result.report.round_seconds
    total_rounds = float(sum(rounds))
    return {
        "transport": transport,
        "round_latency": latency_stats(rounds),
        "session_wall_seconds": result.report.wall_time_seconds,
        "end_to_end_seconds": end_to_end,
        "outside_rounds_seconds": end_to_end - total_rounds,
        "bid_throughput_points_per_second": (
            w.k * w.n_points * len(rounds) / total_rounds if total_rounds > 0 else None
        ),
        "owner_points_accessed": result.report.owner_points_accessed,
        "rejected_points": result.report.rejected_points,
        "dropped_owners": list(result.report.dropped_owners),
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": os.getloadavg()[0],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(local: dict[str, Any], networked: dict[str, Any]) -> dict[str, float | None]:
    """Ratios ``networked / local`` of the main timings (e.g. networked over in-process, or
    mTLS over plaintext when ``local`` is the plaintext run)."""
    lr, nr = local["round_latency"], networked["round_latency"]
    return {
        "median_round": _ratio(nr.get("median_ms"), lr.get("median_ms")),
        "p90_round": _ratio(nr.get("p90_ms"), lr.get("p90_ms")),
        "mean_round": _ratio(nr.get("mean_ms"), lr.get("mean_ms")),
        "session_wall": _ratio(networked["session_wall_seconds"], local["session_wall_seconds"]),
        "end_to_end": _ratio(networked["end_to_end_seconds"], local["end_to_end_seconds"]),
    }


def same_summary(a: SummaryResult, b: SummaryResult) -> dict[str, bool]:
    """Whether two runs returned the same summary (points bit for bit, labels, owners)."""
    points = bool(np.array_equal(a.points, b.points))
    labels = (a.labels is None and b.labels is None) or (
        a.labels is not None and b.labels is not None and bool(np.array_equal(a.labels, b.labels))
    )
    owners = a.owner_ids == b.owner_ids
    return {
        "summaries_identical": points and labels and owners,
        "points_identical": points,
        "owner_ids_identical": owners,
    }


def _progress_logger(label: str, total: int) -> Callable[[ProgressEvent], None]:
    step = max(1, total // 4)

    def log(event: ProgressEvent) -> None:
        if event.stage == "rounds" and event.round % step == 0 and event.round > 0:
            logger.info("  %s: round %d/%d", label, event.round, event.total_rounds)
        elif event.stage in ("setup", "failed"):
            logger.info("  %s: %s: %s", label, event.stage, event.message)

    return log


# ----------------------------------------------------------------------------------- floor
def arithmetic_floor(
    k_values: Sequence[int],
    n_points: int,
    d: int,
    *,
    seed: int,
    repeat: int = 7,
    number: int = 10,
) -> dict[str, Any]:
    """Time a round's arithmetic: per owner its bid scores
    (:func:`dpmarket.common.summarization.kernels.bid_scores`, one float32 dot product per point),
    mask and argmax.

    ``per_owner_ms`` repeats the bid on one matrix (which may stay in the last-level cache);
    ``k_owners_sequential_ms[K]`` runs it over K distinct matrices one after the other on one
    core, as an in-process round does, so every matrix streams from memory.
    ``k_owners_read_ms[K]`` only reads the K matrices once (a float32 sum of each), split over
    the machine's ``read_threads`` cores: the least time any round can take on this machine,
    whatever the transport, since every bid reads all of its owner's features. Best of
    ``repeat`` timeit runs of ``number`` calls each, in milliseconds per call.
    """
    from concurrent.futures import ThreadPoolExecutor

    from dpmarket.common.summarization.kernels import bid_scores

    rng = np.random.default_rng(seed)
    scale = np.float32(np.sqrt(2.0 / d))
    k_max = max(k_values)
    mats = [rng.uniform(-scale, scale, size=(n_points, d)).astype(np.float32) for _ in range(k_max)]
    w = rng.normal(size=d).astype(np.float32)
    sent = np.zeros(n_points, dtype=bool)
    sent[:: max(1, n_points // 200)] = True

    def bid(f: NDArray[np.float32]) -> int:
        scores = bid_scores(f, w)
        scores[sent] = -np.inf
        return int(np.argmax(scores))

    def best_ms(fn: Callable[[], object]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e3

    threads = max(1, min(os.cpu_count() or 1, k_max))
    out: dict[str, Any] = {
        "n_points": n_points,
        "d": d,
        "dtype": "float32",
        "repeat": repeat,
        "number": number,
        "read_threads": threads,
        "per_owner_ms": best_ms(lambda: bid(mats[0])),
        "matvec_only_ms": best_ms(lambda: bid_scores(mats[0], w)),
        "k_owners_sequential_ms": {},
        "per_owner_in_sequence_ms": {},
        "k_owners_read_ms": {},
    }
    with ThreadPoolExecutor(threads) as pool:  # numpy's sum releases the GIL
        for k in sorted(set(k_values)):

            def sequential(subset: Sequence[NDArray[np.float32]] = mats[:k]) -> list[int]:
                return [bid(f) for f in subset]

            def read(subset: Sequence[NDArray[np.float32]] = mats[:k]) -> list[np.float32]:
                return list(pool.map(lambda f: f.sum(dtype=np.float32), subset))

            t = best_ms(sequential)
            out["k_owners_sequential_ms"][str(k)] = t
            out["per_owner_in_sequence_ms"][str(k)] = t / k
            out["k_owners_read_ms"][str(k)] = best_ms(read)
    return out


# ----------------------------------------------------------------------------------- runs
@contextlib.contextmanager
def _environ(extra: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the processes spawned inside the block, then restore them.

    This process's own libraries (numpy's BLAS) read their variables at import and are unaffected.
    """
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: Policies of the benchmark's services: budgets far above what the measured sessions spend, and
#: the non-private greedy baseline and the per-round methods' exact bids (with as many rounds as
#: they ask) allowed: a benchmark measures speed, not privacy.
BENCH_OWNER_POLICY = """
[budget]
epsilon = 1e6
delta = 0.9
points = 100000000
[session]
epsilon = 1e5
delta = 0.5
points = 10000000
rounds_per_point = 1000
[access]
allow_non_private = true
allow_exact_bids = true
allow_steered_selection = true
"""
_BENCH_CURATOR_POLICY = """
[requests]
methods = ["candidates", "private", "rounds", "uniform", "greedy"]
delta_owners = [1e-12, 0.5]
owners_delta = [0.0, 0.5]
owners_epsilon = [0.0, 1e5]
[sessions]
per_consumer_per_minute = 1000
"""


def _bench_policies(work_dir: Path) -> tuple[Path, Path]:
    owner, curator = work_dir / "owner-policy.toml", work_dir / "curator-policy.toml"
    owner.write_text(BENCH_OWNER_POLICY, encoding="utf-8")
    curator.write_text(_BENCH_CURATOR_POLICY, encoding="utf-8")
    return owner, curator


def _ledgered_owners(owners: Sequence[PointSet], root: Path, policy_path: Path) -> list[Any]:
    """In-process owners that each charge a durable ledger (in ``root``) under the networked
    owners' policy, as an owner process does before every release."""
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.local import LocalOwnerEndpoint
    from dpmarket.owner.policy import load_owner_policy
    from dpmarket.owner.protocol import Owner

    policy = load_owner_policy(policy_path)
    return [
        LocalOwnerEndpoint(
            Owner(
                o.name,
                o,
                ledger=OwnerLedger.create(root / o.name, policy),
                allow_seeded_sessions=True,
            )
        )
        for o in owners
    ]


#: The networked transports, in the order the first method runs them (later methods alternate).
TRANSPORTS: tuple[str, ...] = ("mtls", "plaintext")
#: ``transport`` label of each networked run in the report.
TRANSPORT_LABELS: dict[str, str] = {
    "mtls": "grpc-loopback-mtls",
    "plaintext": "grpc-loopback-plaintext",
}


def run_workload(
    w: Workload,
    methods: Sequence[Method],
    work_dir: Path,
    log_dir: Path,
    *,
    service_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run every method in-process, over mTLS and over plaintext gRPC; return its JSON record.

    Two clusters serve the same owner files: the production one (mTLS, certificates issued by
    :class:`dpmarket.deploy.launcher.LocalCluster`) and a plaintext one (``insecure=True``, every
    service with ``--insecure``), both up for the whole workload. Per method the in-process run
    comes first, then the two networked runs, whose order alternates from one method to the next
    (mTLS first for the first method) so that a drift in machine load does not always favour the
    same transport. All three runs use the same seed, so their summaries must be equal.

    ``service_env`` is added to the environment of the owner and curator processes only (e.g.
    ``OPENBLAS_NUM_THREADS=1`` to measure a fix); the in-process run is unaffected.
    """
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.deploy.launcher import LocalCluster
    from dpmarket.experiments.runner import run_session, simulate

    t0 = time.perf_counter()
    data = make_data(w)
    paths = []
    for owner in data.owners:
        path = work_dir / f"k{w.k}-n{w.n_points}-{owner.name}.npy"
        save_point_set(owner, path)
        paths.append(path)
    logger.info("K=%d N=%d: data generated in %.1f s", w.k, w.n_points, time.perf_counter() - t0)
    record: dict[str, Any] = {**asdict(w), "methods": {}, "cluster_start_seconds": {}}
    names = [o.name for o in data.owners]
    owner_policy, curator_policy = _bench_policies(work_dir)
    with contextlib.ExitStack() as stack:
        clients: dict[str, Any] = {}
        for transport in TRANSPORTS:
            t0 = time.perf_counter()
            with _environ(service_env or {}):
                cluster = stack.enter_context(
                    LocalCluster(
                        paths,
                        names,
                        log_dir / f"k{w.k}-n{w.n_points}-{transport}",
                        owner_policy=owner_policy,
                        curator_policy=curator_policy,
                        insecure=transport == "plaintext",
                    )
                )
            record["cluster_start_seconds"][transport] = time.perf_counter() - t0
            logger.info(
                "K=%d N=%d: %d owner processes and the curator up (%s) in %.1f s",
                w.k,
                w.n_points,
                w.k,
                transport,
                record["cluster_start_seconds"][transport],
            )
            clients[transport] = stack.enter_context(
                CuratorClient(cluster.curator_target, cluster.consumer_security(), timeout=600.0)
            )
        for index, method in enumerate(methods):
            config = method_config(method, summary_size=w.rounds, rff_dimension=w.d)
            label = f"K={w.k} N={w.n_points} {method}"
            load = os.getloadavg()[0]
            start = time.perf_counter()
            local = simulate(
                data.owners,
                data.validation,
                data.seed_set,
                config,
                seed=w.seed,
                on_progress=_progress_logger(f"{label} in-process", w.rounds),
            )
            local_rec = run_record(local, time.perf_counter() - start, w, "in-process", load)
            logger.info(
                "%s in-process: median round %.2f ms, %.1f s end to end",
                label,
                local_rec["round_latency"]["median_ms"],
                local_rec["end_to_end_seconds"],
            )
            # The same in process, with every owner charging a durable ledger under the
            # networked owners' policy: what an owner process does besides its transport.
            load = os.getloadavg()[0]
            start = time.perf_counter()
            ledgered = run_session(
                _ledgered_owners(data.owners, work_dir / f"ledgers-{method}", owner_policy),
                data.validation,
                data.seed_set,
                config,
                seed=w.seed,
                on_progress=_progress_logger(f"{label} in-process, ledgers", w.rounds),
            )
            ledgered_rec = run_record(
                ledgered, time.perf_counter() - start, w, "in-process-ledgers", load
            )
            order = TRANSPORTS if index % 2 == 0 else TRANSPORTS[::-1]
            results: dict[str, SummaryResult] = {}
            recs: dict[str, dict[str, Any]] = {}
            for transport in order:
                load = os.getloadavg()[0]
                start = time.perf_counter()
                results[transport] = clients[transport].summarize(
                    config,
                    data.validation,
                    data.seed_set,
                    seed=w.seed,
                    on_progress=_progress_logger(f"{label} {transport}", w.rounds),
                )
                recs[transport] = run_record(
                    results[transport],
                    time.perf_counter() - start,
                    w,
                    TRANSPORT_LABELS[transport],
                    load,
                )
                logger.info(
                    "%s %s: median round %.2f ms, %.1f s end to end",
                    label,
                    transport,
                    recs[transport]["round_latency"]["median_ms"],
                    recs[transport]["end_to_end_seconds"],
                )
            record["methods"][method] = {
                "in_process": local_rec,
                "in_process_ledgers": ledgered_rec,
                "networked": recs["mtls"],
                "networked_plaintext": recs["plaintext"],
                "networked_order": list(order),
                "networked_over_in_process": compare(local_rec, recs["mtls"]),
                "networked_over_in_process_ledgers": compare(ledgered_rec, recs["mtls"]),
                "ledgers_summary_identical": same_summary(local, ledgered)["summaries_identical"],
                "plaintext_over_in_process": compare(local_rec, recs["plaintext"]),
                "mtls_over_plaintext": compare(recs["plaintext"], recs["mtls"]),
                **same_summary(local, results["mtls"]),
                "plaintext_summary_identical": same_summary(results["mtls"], results["plaintext"])[
                    "summaries_identical"
                ],
            }
    return record


def evaluate_targets(
    workloads: Sequence[dict[str, Any]], floor: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check the spec's targets against the measured workloads; with the ``floor`` of
    :func:`arithmetic_floor`, the round-latency target also states the least time reading the
    K owners' features once takes here (``memory_floor_ms``), below which no transport goes."""
    ratio_checks = []
    round_checks = []
    for rec in workloads:
        for method, m in rec["methods"].items():
            ratio = m["networked_over_in_process"]["median_round"]
            ratio_checks.append(
                {
                    "k": rec["k"],
                    "n_points": rec["n_points"],
                    "method": method,
                    "median_round_ratio": ratio,
                    "end_to_end_ratio": m["networked_over_in_process"]["end_to_end"],
                    "met": ratio is not None and ratio <= RATIO_TARGET,
                }
            )
            if rec["k"] == ROUND_TARGET_K and rec["n_points"] == ROUND_TARGET_N:
                median = m["networked"]["round_latency"].get("median_ms")
                round_checks.append(
                    {
                        "k": rec["k"],
                        "n_points": rec["n_points"],
                        "method": method,
                        "networked_median_round_ms": median,
                        "networked_p90_round_ms": m["networked"]["round_latency"].get("p90_ms"),
                        "met": median is not None and median <= ROUND_TARGET_MS,
                    }
                )
    memory_floor = (floor or {}).get("k_owners_read_ms", {}).get(str(ROUND_TARGET_K))
    return {
        "networked_vs_in_process": {
            "target": f"networked median round latency <= {RATIO_TARGET} x in-process",
            "threshold": RATIO_TARGET,
            "checks": ratio_checks,
            "met": all(c["met"] for c in ratio_checks) if ratio_checks else None,
        },
        "round_latency_k16_n50k": {
            "target": (
                f"networked median round latency <= {ROUND_TARGET_MS:g} ms with "
                f"K={ROUND_TARGET_K} owners x {ROUND_TARGET_N} points on loopback"
            ),
            "threshold_ms": ROUND_TARGET_MS,
            "checks": round_checks,
            "met": all(c["met"] for c in round_checks) if round_checks else None,
            "memory_floor_ms": memory_floor,
            **({} if round_checks else {"note": "workload not run (e.g. --quick)"}),
        },
    }


# ------------------------------------------------------------------------------ reporting
def machine_info() -> dict[str, Any]:
    """CPU count, platform, library versions, BLAS configuration, load and memory."""
    import grpc

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "env": {
            key: os.environ.get(key)
            for key in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
        },
        "loadavg_start": list(os.getloadavg()),
    }
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = threadpool_info()
    except ImportError:
        info["blas"] = None
    try:
        info["memory_total_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        info["memory_total_bytes"] = None
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def mtls_cost(workloads: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What mTLS adds per workload and method: mTLS and plaintext round latency, their ratio.

    Returns
    -------
    list of dict
        One entry per (K, N, method): median and p90 round latency in ms over mTLS and over
        plaintext gRPC, the ratios mTLS / plaintext of the median, p90 and end-to-end time, the
        added median milliseconds per round, and whether both returned the same summary.
    """
    out = []
    for rec in workloads:
        for method, m in rec["methods"].items():
            tls, plain = m["networked"]["round_latency"], m["networked_plaintext"]["round_latency"]
            ratios = m["mtls_over_plaintext"]
            added = (
                tls["median_ms"] - plain["median_ms"]
                if tls.get("median_ms") is not None and plain.get("median_ms") is not None
                else None
            )
            out.append(
                {
                    "k": rec["k"],
                    "n_points": rec["n_points"],
                    "method": method,
                    "mtls_median_ms": tls.get("median_ms"),
                    "mtls_p90_ms": tls.get("p90_ms"),
                    "plaintext_median_ms": plain.get("median_ms"),
                    "plaintext_p90_ms": plain.get("p90_ms"),
                    "median_ratio": ratios["median_round"],
                    "p90_ratio": ratios["p90_round"],
                    "end_to_end_ratio": ratios["end_to_end"],
                    "added_median_ms": added,
                    "summaries_identical": m["plaintext_summary_identical"],
                }
            )
    return out


#: Rows of the table: report key of the run and the ratio it is shown with.
_TABLE_RUNS: tuple[tuple[str, str | None], ...] = (
    ("in_process", None),
    ("in_process_ledgers", None),
    ("networked", "networked_over_in_process"),
    ("networked_plaintext", "plaintext_over_in_process"),
)


def format_table(report: dict[str, Any]) -> str:
    """A small human-readable table of the report.

    ``x in-proc`` is a networked run's median round over the in-process one's; ``same`` says
    whether the run's summary equals the in-process one (mTLS row) or the mTLS one (plaintext
    row). The mTLS cost follows the table.
    """
    header = (
        f"{'K':>3} {'N':>7} {'method':<8} {'transport':<23} {'med ms':>8} {'p90 ms':>8} "
        f"{'max ms':>8} {'Mpts/s':>8} {'session s':>9} {'e2e s':>7} {'x in-proc':>9} "
        f"{'same':>5}"
    )
    lines = [header, "-" * len(header)]
    for rec in report["workloads"]:
        for method, m in rec["methods"].items():
            for key, ratio_key in _TABLE_RUNS:
                r = m[key]
                lat = r["round_latency"]
                tput = r["bid_throughput_points_per_second"]
                ratio = None if ratio_key is None else m[ratio_key]["median_round"]
                identical = {
                    "in_process_ledgers": m["ledgers_summary_identical"],
                    "networked": m["summaries_identical"],
                    "networked_plaintext": m["plaintext_summary_identical"],
                }.get(key)
                same = "" if identical is None else ("yes" if identical else "NO")
                lines.append(
                    f"{rec['k']:>3} {rec['n_points']:>7} {method:<8} {r['transport']:<23} "
                    f"{_fmt(lat.get('median_ms'), '8.2f')} {_fmt(lat.get('p90_ms'), '8.2f')} "
                    f"{_fmt(lat.get('max_ms'), '8.1f')} "
                    f"{_fmt(None if tput is None else tput / 1e6, '8.1f')} "
                    f"{r['session_wall_seconds']:9.2f} {r['end_to_end_seconds']:7.2f} "
                    f"{_fmt(ratio, '9.2f')} "
                    f"{same:>5}"
                )
    lines.append("")
    for rec in report["workloads"]:
        for method, m in rec["methods"].items():
            lines.append(
                f"K={rec['k']} N={rec['n_points']} {method}: networked median round over the "
                "in-process one with the owners' durable ledgers (the transport alone): x"
                f"{_fmt(m['networked_over_in_process_ledgers']['median_round'], '.2f')}"
            )
    lines.append("")
    for c in report["mtls_cost"]:
        lines.append(
            f"mTLS cost K={c['k']} N={c['n_points']} {c['method']}: median round "
            f"{_fmt(c['mtls_median_ms'], '.2f')} ms (mTLS) vs "
            f"{_fmt(c['plaintext_median_ms'], '.2f')} ms (plaintext), x"
            f"{_fmt(c['median_ratio'], '.3f')} ({_fmt(c['added_median_ms'], '+.2f')} ms); p90 "
            f"{_fmt(c['mtls_p90_ms'], '.2f')} vs {_fmt(c['plaintext_p90_ms'], '.2f')} ms, x"
            f"{_fmt(c['p90_ratio'], '.3f')}; end to end x{_fmt(c['end_to_end_ratio'], '.3f')}"
        )
    floor = report["floor"]
    lines.append("")
    lines.append(
        f"arithmetic floor (N={floor['n_points']}, d={floor['d']}, float32 matvec+mask+argmax): "
        f"{floor['per_owner_ms']:.2f} ms per owner (one matrix, cache-warm); "
        + ", ".join(
            f"K={k}: {t:.2f} ms sequential; reading the K matrices once on "
            f"{floor['read_threads']} cores: {floor['k_owners_read_ms'][k]:.2f} ms"
            for k, t in floor["k_owners_sequential_ms"].items()
        )
    )
    for name, target in report["targets"].items():
        met = target["met"]
        memory = target.get("memory_floor_ms")
        below = (
            f" (below the {memory:.1f} ms that reading the features once takes here)"
            if memory is not None and memory > target.get("threshold_ms", 0.0)
            else ""
        )
        lines.append(
            f"target {name}: {target['target']}: "
            + ("not evaluated" if met is None else ("MET" if met else "NOT MET"))
            + below
        )
    lines.append(f"total bench runtime: {report['total_runtime_seconds']:.1f} s")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CLI
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.rounds",
        description="Per-round latency of the summarization protocol: in-process, "
        "networked over mTLS and networked over plaintext gRPC.",
    )
    parser.add_argument("--out", type=Path, default=Path("out/bench.json"), help="JSON report.")
    parser.add_argument(
        "--k", type=_positive_int, nargs="+", default=None, help="Owner counts (default: 5 16)."
    )
    parser.add_argument(
        "--n", type=_positive_int, default=None, help="Points per owner (default: 50000)."
    )
    parser.add_argument(
        "-p", "--rounds", type=_positive_int, default=None, help="Summary size = rounds (200)."
    )
    parser.add_argument("--d", type=_positive_int, default=DEFAULT_D, help="h1 dimension d.")
    parser.add_argument(
        "--n-features", type=_positive_int, default=DEFAULT_N_FEATURES, help="Raw features."
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=["private", "greedy"],
        default=list(DEFAULT_METHODS),
        help="Methods to run.",
    )
    parser.add_argument("--validation-size", type=_positive_int, default=DEFAULT_VALIDATION)
    parser.add_argument("--seed-set-size", type=_nonnegative_int, default=DEFAULT_SEED_SET)
    parser.add_argument(
        "--seed", type=_nonnegative_int, default=DEFAULT_SEED, help="Data and session seed."
    )
    parser.add_argument(
        "--floor-repeat", type=_positive_int, default=7, help="timeit repeats of the floor."
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="Service logs (default: <out dir>/bench-logs).",
    )
    parser.add_argument(
        "--service-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Extra environment of the owner and curator processes, e.g. "
        "OPENBLAS_NUM_THREADS=1 (repeatable; default: this process's environment as is).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"Tiny run: K={QUICK_K[0]}, N={QUICK_N}, p={QUICK_ROUNDS} (smoke test).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the JSON report, print the table; return the report."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    started = time.perf_counter()
    k_values: list[int] = args.k or list(QUICK_K if args.quick else DEFAULT_K)
    n_points: int = args.n or (QUICK_N if args.quick else DEFAULT_N)
    rounds: int = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    methods: list[Method] = list(args.methods)
    service_env: dict[str, str] = dict(args.service_env)
    out: Path = args.out
    log_dir: Path = args.log_dir or out.parent / "bench-logs"
    machine = machine_info()
    parameters = {
        "k": k_values,
        "n_points": n_points,
        "rounds": rounds,
        "d": args.d,
        "n_features": args.n_features,
        "validation_size": args.validation_size,
        "seed_set_size": args.seed_set_size,
        "methods": methods,
        "seed": args.seed,
        "quick": args.quick,
        "service_env": service_env,
        "config_defaults": "the methods' configuration defaults (Table 1) but summary_size and d",
    }
    logger.info("bench.rounds: %s", parameters)
    logger.info(
        "arithmetic floor: %d matrices of (%d, %d) float32", max(k_values), n_points, args.d
    )
    floor = arithmetic_floor(k_values, n_points, args.d, seed=args.seed, repeat=args.floor_repeat)
    logger.info(
        "floor: %.2f ms per owner; %s",
        floor["per_owner_ms"],
        ", ".join(f"K={k}: {t:.2f} ms" for k, t in floor["k_owners_sequential_ms"].items()),
    )
    workloads = []
    with tempfile.TemporaryDirectory(prefix="dpmarket-bench-") as tmp:
        for k in k_values:
            w = Workload(
                k=k,
                n_points=n_points,
                rounds=rounds,
                d=args.d,
                n_features=args.n_features,
                validation_size=args.validation_size,
                seed_set_size=args.seed_set_size,
                seed=args.seed,
            )
            workloads.append(run_workload(w, methods, Path(tmp), log_dir, service_env=service_env))
    machine["loadavg_end"] = list(os.getloadavg())
    report: dict[str, Any] = {
        "benchmark": "bench.rounds",
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [
            sys.executable,
            "-m",
            "bench.rounds",
            *(sys.argv[1:] if argv is None else argv),
        ],
        "machine": machine,
        "data": {"synthetic": True, "description": DATA_NOTE, "mean_shift": MEAN_SHIFT},
        "parameters": parameters,
        "units": {
            "round_latency": "milliseconds of curator wall time per round "
            "(SessionReport.round_seconds)",
            "session_wall_seconds": "SessionReport.wall_time_seconds (curator side)",
            "end_to_end_seconds": "client-side call: session setup, owners' h1 features, "
            "rounds, result transfer",
            "bid_throughput_points_per_second": "K * N * rounds / sum(round_seconds)",
            "mtls_cost": "median and p90 round latency (ms) over mTLS and plaintext gRPC, "
            "ratios mTLS / plaintext",
        },
        "floor": floor,
        "workloads": workloads,
        "targets": evaluate_targets(workloads, floor),
        "mtls_cost": mtls_cost(workloads),
        "log_dir": str(log_dir),
    }
    report["total_runtime_seconds"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(format_table(report))
    logger.info("report -> %s (%.1f s)", out, report["total_runtime_seconds"])
    return report


if __name__ == "__main__":
    main()
