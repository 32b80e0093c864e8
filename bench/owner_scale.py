"""Owner scale: an owner's computations on a table larger than memory, partition by partition on
Dask, against the in-memory numpy kernels.

For each size (default 10^6 and 10^7 rows of 10 float64 columns; 10^8 with ``--rows 1e8``, opt-in:
about 8 GB of Parquet and tens of minutes on 2 cores), a Parquet dataset is generated once under
``out/owner-scale/rows-N/`` (row groups of 2^19 rows; reused by later runs; skipped, saying so,
when the disk has not room for it), a local Dask cluster of one worker process per core is
started, and each owner computation is timed as the owner service runs it
(:class:`dpmarket.owner.partitioned.PartitionedData`):

* ``validate``: the start-up pass (every value checked, every partition counted);
* ``h1_embedding``: the mean h1 embedding (d = 140) of every row, a sum per partition;
* ``relevance_count``: the candidates method's count of rows scoring above a threshold;
* ``candidates``: GreeDi for 600 candidates (3 p at the default p = 200), stochastic greedy in
  every partition too large to scan once per candidate;
* ``sketch_rff``: a private RFF sketch's feature sum (1,000 frequencies);
* ``cape_mean`` and ``cape_fm``: CAPE's mean of the 10 columns and capeFM's linear-regression
  coefficients (9 features, 1 target).

Each reports seconds, rows/s per core (rows / seconds / workers) and the peak resident memory of
the whole process tree (this process, the Dask scheduler and workers: psutil, sampled every
0.1 s). The sub-second CAPE passes are timed on both paths as the best of three runs after an
untimed one (``warm``: the workers' first run of a computation imports its modules). At 10^6
rows the same computations run in memory, in this process on one core (numpy, one BLAS thread),
as the in-memory owner runs them (features of every row held), for the ratio the goal is stated
in: per-core throughput of the Dask path over the in-memory kernel's.

``--service ROWS`` adds the end-to-end check of a large owner started as the tutorial starts
one: ``dpmarket init`` with a CSV of that many rows next to two small owners, ``dpmarket up``,
then two default requests in a row (``-p 20``); it reports each request's time, the owners it
dropped, and the owner's peak resident memory (its process tree) over both; then three requests
at once, and what each session beyond the first added to that peak. ``--service-dataset ROWS``
serves the generated Parquet dataset of that size the same way (its owner's ``data`` is the
dataset's directory) and makes one request of ``-p`` points (default 200).

The 1-minute load average before and after each step is in the report (the machine may be
shared). Results go under the key ``owner_scale`` of ``--into`` (merged, like ``bench.secagg``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.report import merge_section

COLUMNS = tuple(f"x{j}" for j in range(10))
ROW_GROUP = 1 << 19
D = 140
CANDIDATES = 600
SKETCH_FREQUENCIES = 1000
#: Timed runs of a warm step (the best is reported).
WARM_REPEATS = 3
#: Requests the service check runs at once after its two in a row (the curator runs at most 4).
CONCURRENT = 3


def _tree_rss(root: psutil.Process) -> int:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


class PeakRSS:
    """The peak resident memory of a process tree, sampled in a thread."""

    def __init__(self, pid: int | None = None, period: float = 0.1) -> None:
        self.root = psutil.Process(pid)
        self.period = period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, _tree_rss(self.root))
            self._stop.wait(self.period)

    def __enter__(self) -> PeakRSS:
        self.peak = _tree_rss(self.root)
        self._thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_rss(self.root))


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def generate(root: Path, rows: int, seed: int = 0) -> Path:
    """A Parquet dataset of ``rows`` rows of 10 float64 columns (8 Gaussian clusters), written
    once into ``root / rows-N`` in files of at most 2^23 rows; reused when complete."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = root / f"rows-{rows}"
    marker = target / "_COMPLETE"
    if marker.is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=3.0, size=(8, len(COLUMNS)))
    per_file = 1 << 23
    written = 0
    for f in range(0, rows, per_file):
        n_file = min(per_file, rows - f)
        schema = pa.schema([(c, pa.float64()) for c in COLUMNS])
        with pq.ParquetWriter(target / f"part-{f // per_file:05d}.parquet", schema) as writer:
            for start in range(0, n_file, ROW_GROUP):
                n = min(ROW_GROUP, n_file - start)
                x = centers[rng.integers(0, 8, n)] + rng.normal(size=(n, len(COLUMNS)))
                writer.write_table(
                    pa.table({c: x[:, j] for j, c in enumerate(COLUMNS)}, schema=schema),
                    row_group_size=ROW_GROUP,
                )
        written += n_file
    marker.write_text(json.dumps({"rows": written, "seed": seed}), encoding="utf-8")
    return target


def _timed(
    steps: dict[str, Any],
    name: str,
    rows: int,
    workers: int,
    fn: Callable[[], Any],
    *,
    warm: bool = False,
) -> Any:
    """Time ``fn`` once; with ``warm``, the best of :data:`WARM_REPEATS` runs after one untimed
    run (a Dask worker imports a computation's modules the first time it runs it: a one-off
    cost per worker process that dominates a sub-second pass, whose time also varies by tens of
    per cent between runs here)."""
    if warm:
        fn()
    before = _load()
    seconds = math.inf
    with PeakRSS() as peak:
        for _ in range(WARM_REPEATS if warm else 1):
            start = time.perf_counter()
            out = fn()
            seconds = min(seconds, time.perf_counter() - start)
    steps[name] = {
        "warm": warm,
        "seconds": round(max(seconds, 1e-6), 6),
        "rows_per_second_per_core": round(rows / max(seconds, 1e-6) / workers),
        "peak_rss_mib": round(peak.peak / 2**20, 1),
        "load_before": before,
        "load_after": _load(),
    }
    print(
        f"  {name:16s} {seconds:8.2f} s  {rows / seconds / workers:12,.0f} rows/s/core  "
        f"peak {peak.peak / 2**20:7.0f} MiB  (load {before} -> {steps[name]['load_after']})",
        flush=True,
    )
    return out


def _problem(rng: np.random.Generator) -> dict[str, Any]:
    from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec
    from dpmarket.common.sketches.domain import Domain
    from dpmarket.common.sketches.feature_maps import draw_rff
    from dpmarket.common.summarization.rff import draw_rff_params

    bounds = tuple((c, -20.0, 20.0) for c in COLUMNS)

    class _Spec:  # what the sketch task reads of a spec
        domain = Domain(np.full(len(COLUMNS), -20.0), np.full(len(COLUMNS), 20.0), COLUMNS)
        feature_map = draw_rff(len(COLUMNS), SKETCH_FREQUENCIES, 3.0, rng)

    return {
        "rff": draw_rff_params(len(COLUMNS), D, 0.02, rng),
        "sketch": _Spec(),
        "mean": CapeMeanSpec(bounds, epsilon=1.0, delta=1e-5),
        "fm": CapeJobSpec("linear", bounds[:-1], bounds[-1], epsilon=1.0, delta=1e-5),
    }


def partitioned_steps(location: Path, engine: Any, rows: int, seed: int) -> dict[str, Any]:
    """Every owner computation on the dataset, on ``engine``."""
    from dpmarket.owner.cape import _fm_part, _mean_part
    from dpmarket.owner.dataset import open_dataset
    from dpmarket.owner.partitioned import PartitionedData, mean_statistic
    from dpmarket.owner.sketches import _sketch_part
    from dpmarket.owner.validation import validate_dataset

    workers = engine.workers
    problem = _problem(np.random.default_rng(seed))
    steps: dict[str, Any] = {}
    dataset = _timed(
        steps,
        "validate",
        rows,
        workers,
        lambda: validate_dataset(open_dataset(str(location)), engine),
    )
    data = PartitionedData(dataset, engine, features=COLUMNS)
    rff = problem["rff"]
    g = _timed(steps, "h1_embedding", rows, workers, lambda: data.h1_mean(rff))
    none = np.zeros(0, dtype=np.int64)
    _timed(
        steps,
        "relevance_count",
        rows,
        workers,
        lambda: data.count_at_least(rff, g.astype(np.float32), float(g @ g), none),
    )
    found = _timed(
        steps,
        "candidates",
        rows,
        workers,
        lambda: data.candidates(rff, g, CANDIDATES, none, seed),
    )
    steps["candidates"]["stochastic_partitions"] = int(found[3])
    steps["candidates"]["partitions"] = len(dataset.partitions)
    _timed(
        steps,
        "sketch_rff",
        rows,
        workers,
        lambda: data.statistic(COLUMNS, functools.partial(_sketch_part, problem["sketch"])),
    )
    _timed(
        steps,
        "cape_mean",
        rows,
        workers,
        lambda: mean_statistic(
            [
                (n, v)
                for n, v, _ in data.statistic(
                    COLUMNS, functools.partial(_mean_part, problem["mean"])
                )
            ]
        ),
        warm=True,
    )
    _timed(
        steps,
        "cape_fm",
        rows,
        workers,
        lambda: mean_statistic(
            [
                (n, v)
                for n, v, _ in data.statistic(
                    COLUMNS, functools.partial(_fm_part, problem["fm"], "linear", (0, 1, 2))
                )
            ]
        ),
        warm=True,
    )
    return steps


def in_memory_steps(location: Path, rows: int, seed: int) -> dict[str, Any]:
    """The same computations as the in-memory owner runs them, in this process on one core."""
    from threadpoolctl import threadpool_limits

    from dpmarket.common.cape.functional_mechanism import fm_coefficients, pack_coefficients
    from dpmarket.common.summarization.kernels import bid_scores, embedding_greedy
    from dpmarket.common.summarization.rff import random_fourier_features
    from dpmarket.owner.dataset import open_dataset
    from dpmarket.owner.engine import SerialEngine
    from dpmarket.owner.validation import read_all

    problem = _problem(np.random.default_rng(seed))
    rff = problem["rff"]
    x = read_all(open_dataset(str(location)), SerialEngine())
    steps: dict[str, Any] = {}
    with threadpool_limits(limits=1):
        features = _timed(steps, "h1_features", rows, 1, lambda: random_fourier_features(x, rff))
        g = features.mean(axis=0, dtype=np.float64)
        _timed(
            steps,
            "relevance_count",
            rows,
            1,
            lambda: int(np.count_nonzero(bid_scores(features, g.astype(np.float32)) >= g @ g)),
        )
        _timed(
            steps,
            "candidates",
            rows,
            1,
            lambda: embedding_greedy(features, g, np.zeros((0, D)), CANDIDATES),
        )
        sketch = problem["sketch"]
        _timed(
            steps,
            "sketch_rff",
            rows,
            1,
            lambda: sketch.feature_map.feature_sum(sketch.domain.clamp(x, "x")[0]),
        )
        _timed(
            steps,
            "cape_mean",
            rows,
            1,
            lambda: problem["mean"].clamped(x)[0].mean(axis=0),
            warm=True,
        )
        fm = problem["fm"]

        def capefm() -> Any:
            xs, ys = fm.scaled(x[:, :-1], x[:, -1])
            return pack_coefficients(fm_coefficients(xs, ys, "linear"), (0, 1, 2))

        _timed(steps, "cape_fm", rows, 1, capefm, warm=True)
    return steps


def _ratios(dask_steps: dict[str, Any], memory: dict[str, Any], rows: int) -> dict[str, float]:
    """Per-core throughput of the Dask path over the in-memory kernel's, per computation. The
    in-memory owner computes the features of every row once per session: they count in its h1
    embedding, relevance count and candidates."""
    feat = memory["h1_features"]["seconds"]
    seconds = {
        "h1_embedding": feat,
        "relevance_count": feat + memory["relevance_count"]["seconds"],
        "candidates": feat + memory["candidates"]["seconds"],
        "sketch_rff": memory["sketch_rff"]["seconds"],
        "cape_mean": memory["cape_mean"]["seconds"],
        "cape_fm": memory["cape_fm"]["seconds"],
    }
    return {
        name: round(dask_steps[name]["rows_per_second_per_core"] / (rows / s), 3)
        for name, s in seconds.items()
    }


def _request_command(deployment: Path, work: Path, k: int, p: int) -> list[str]:
    """``dpmarket consumer request`` of ``p`` points, as the tutorial runs it; files numbered
    ``k``."""
    return [
        str(Path(sys.executable).parent / "dpmarket"),
        "consumer",
        "request",
        "--config",
        str(deployment / "consumer.toml"),
        "--validation",
        str(work / "validation.csv"),
        "-p",
        str(p),
        "--out",
        str(work / f"summary-{k}.csv"),
        "--report",
        str(work / f"report-{k}.json"),
    ]


def _request_outcome(
    work: Path, k: int, done: subprocess.CompletedProcess[str], t0: float
) -> dict[str, Any]:
    """Time, exit code, dropped owners and last error line of request ``k``."""
    out = work / f"report-{k}.json"
    result = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "exit_code": done.returncode,
        "dropped_owners": result.get("result", {}).get("dropped_owners"),
        "error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
        "load_after": _load(),
    }


def dataset_service_check(location: Path, rows: int, root: Path, p: int) -> dict[str, Any]:
    """An owner serving a generated Parquet dataset (:func:`generate`) through ``dpmarket up``,
    next to two owners of 2,000 rows of the same columns, and one default request of ``p``
    points: its time, the owners it dropped, and the large owner's peak resident memory."""
    import pandas as pd

    from dpmarket.deploy.local import down, init_deployment, up

    work = root / f"service-dataset-{rows}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = np.random.default_rng(1)
    centers = rng.normal(scale=3.0, size=(8, len(COLUMNS)))

    def frame(n: int, clusters: Sequence[int]) -> pd.DataFrame:
        x = centers[rng.choice(clusters, n)] + rng.normal(size=(n, len(COLUMNS)))
        return pd.DataFrame({c: x[:, j].round(4) for j, c in enumerate(COLUMNS)})

    tables = {}
    for name, clusters in (("small-a", (0, 1)), ("small-b", (2, 3)), ("big", range(8))):
        tables[name] = work / f"{name}.csv"
        frame(2000, list(clusters)).to_csv(tables[name], index=False)
    frame(200, [5]).to_csv(work / "validation.csv", index=False)
    deployment = work / "warehouse"
    init_deployment(deployment, tables)
    config = deployment / "owner-big.toml"
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace(str(tables["big"].resolve()), str(location.resolve())), encoding="utf-8"
    )
    (deployment / "schema.toml").write_text(
        "".join(f'[[columns]]\nname = "{c}"\nlow = -50\nhigh = 50\n\n' for c in COLUMNS),
        encoding="utf-8",
    )
    started = time.perf_counter()
    up(deployment)
    report: dict[str, Any] = {
        "rows": rows,
        "p": p,
        "start_seconds": round(time.perf_counter() - started, 1),
    }
    pid = int((deployment / "run" / "big.pid").read_text(encoding="utf-8").strip())
    try:
        with PeakRSS(pid, period=0.5) as peak:
            t0 = time.perf_counter()
            done = subprocess.run(
                _request_command(deployment, work, 0, p),
                capture_output=True,
                text=True,
                check=False,
            )
            report["request"] = _request_outcome(work, 0, done, t0)
        report["owner_peak_rss_mib"] = round(peak.peak / 2**20, 1)
        print(f"  {report}", flush=True)
    finally:
        down(deployment)
    return report


def service_check(rows: int, root: Path) -> dict[str, Any]:
    """A large owner started as the tutorial starts one, and two default requests in a row."""
    import pandas as pd

    from dpmarket.deploy.local import down, init_deployment, up

    work = root / f"service-{rows}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def frame(n: int, shift: float) -> pd.DataFrame:
        x = rng.normal(loc=shift, size=(n, 3))
        return pd.DataFrame(
            {
                "a": x[:, 0].round(3),
                "b": x[:, 1].round(3),
                "c": x[:, 2].round(3),
                "y": (x[:, 0] > shift).astype(int),
            }
        )

    tables = {}
    for name, n, shift in (("small-a", 2000, 0.0), ("small-b", 2000, 1.0)):
        tables[name] = work / f"{name}.csv"
        frame(n, shift).to_csv(tables[name], index=False)
    big = work / "big.csv"
    with big.open("w", encoding="utf-8") as fh:
        fh.write("a,b,c,y\n")
        for start in range(0, rows, 1 << 20):
            frame(min(1 << 20, rows - start), 0.5).to_csv(fh, index=False, header=False)
    tables["big"] = big
    frame(200, 0.7).to_csv(work / "validation.csv", index=False)
    deployment = work / "clinics"
    init_deployment(deployment, tables, label="y")
    schema = (
        'label = "y"\n'
        + "".join(f'[[columns]]\nname = "{c}"\nlow = -10\nhigh = 10\n\n' for c in "abc")
        + '[[columns]]\nname = "y"\ntype = "binary"\n'
    )
    (deployment / "schema.toml").write_text(schema, encoding="utf-8")
    started = time.perf_counter()
    up(deployment)
    report: dict[str, Any] = {
        "rows": rows,
        "start_seconds": round(time.perf_counter() - started, 1),
    }
    pid = int((deployment / "run" / "big.pid").read_text(encoding="utf-8").strip())

    def command(k: int) -> list[str]:
        return _request_command(deployment, work, k, 20)

    requests = []
    try:
        with PeakRSS(pid, period=0.2) as peak:
            for k in range(2):
                t0 = time.perf_counter()
                done = subprocess.run(command(k), capture_output=True, text=True, check=False)
                requests.append(_request_outcome(work, k, done, t0))
                print(f"  request {k + 1}: {requests[-1]}", flush=True)
        report["requests"] = requests
        report["owner_peak_rss_mib"] = round(peak.peak / 2**20, 1)
        # Then CONCURRENT requests at once: what each further session adds to the owner.
        with PeakRSS(pid, period=0.2) as together:
            t0 = time.perf_counter()
            running = [
                subprocess.Popen(
                    command(2 + k), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
                for k in range(CONCURRENT)
            ]
            finished = []
            for k, proc in enumerate(running):
                stdout, stderr = proc.communicate()
                finished.append(
                    _request_outcome(
                        work,
                        2 + k,
                        subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                        t0,
                    )
                )
        report["concurrent"] = {
            "sessions": CONCURRENT,
            "requests": finished,
            "owner_peak_rss_mib": round(together.peak / 2**20, 1),
            "added_per_further_session_mib": round(
                (together.peak - peak.peak) / 2**20 / (CONCURRENT - 1), 1
            ),
        }
        print(f"  {CONCURRENT} concurrent requests: {report['concurrent']}", flush=True)
    finally:
        down(deployment)
    return report


def _disk_room(root: Path, rows: int) -> tuple[bool, str]:
    need = rows * len(COLUMNS) * 8 * 1.1
    free = shutil.disk_usage(root if root.exists() else root.parent).free
    if (root / f"rows-{rows}" / "_COMPLETE").is_file():
        return True, ""
    if free < 1.2 * need:
        return False, f"needs about {need / 2**30:.1f} GiB of disk, {free / 2**30:.1f} GiB free"
    return True, ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.owner_scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rows", type=float, nargs="*", default=[1e6, 1e7], help="Sizes (none: skip the steps)."
    )
    parser.add_argument("--data", type=Path, default=Path("out/owner-scale"))
    parser.add_argument("--workers", type=int, default=None, help="Dask workers (default: CPUs)")
    parser.add_argument("--service", type=float, default=None, metavar="ROWS")
    parser.add_argument(
        "--service-dataset",
        type=float,
        default=None,
        metavar="ROWS",
        help="Serve the generated ROWS-row Parquet dataset through dpmarket up; one request.",
    )
    parser.add_argument("-p", type=int, default=200, help="Points of --service-dataset's request.")
    parser.add_argument("--into", type=Path, default=Path("out/bench.json"))
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, merge the section into the report, print the lines."""
    from dpmarket.owner.engine import start_engine

    args = build_parser().parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {
        "machine": {
            "nproc": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_at_start": _load(),
        },
        "sizes": {},
    }
    with _engine(start_engine, args.workers) as engine:
        section["machine"]["dask_workers"] = engine.workers
        for value in args.rows:
            rows = int(value)
            ok, why = _disk_room(args.data, rows)
            if not ok:
                print(f"rows {rows:,}: skipped: {why}", flush=True)
                section["sizes"][str(rows)] = {"skipped": why}
                continue
            t0 = time.perf_counter()
            location = generate(args.data, rows, args.seed)
            print(
                f"rows {rows:,}: data in {location} ({time.perf_counter() - t0:.0f} s)", flush=True
            )
            entry: dict[str, Any] = {"dask": partitioned_steps(location, engine, rows, args.seed)}
            if rows <= 1_000_000:
                print("  in memory, one core:", flush=True)
                entry["in_memory"] = in_memory_steps(location, rows, args.seed)
                entry["dask_over_in_memory_per_core"] = _ratios(
                    entry["dask"], entry["in_memory"], rows
                )
                print(f"  per-core ratio: {entry['dask_over_in_memory_per_core']}", flush=True)
            section["sizes"][str(rows)] = entry
    if args.service is not None:
        print(f"service check, {int(args.service):,} rows:", flush=True)
        section["service"] = service_check(int(args.service), args.data)
    if args.service_dataset is not None:
        rows = int(args.service_dataset)
        print(f"service check on the Parquet dataset, {rows:,} rows, p = {args.p}:", flush=True)
        section["service_dataset"] = dataset_service_check(
            generate(args.data, rows, args.seed), rows, args.data, args.p
        )
    section["machine"]["load_at_end"] = _load()
    merge_section(args.into, "owner_scale", section)
    return section


@contextlib.contextmanager
def _engine(start: Callable[..., Any], workers: int | None) -> Iterator[Any]:
    engine = start(workers=workers)
    try:
        yield engine
    finally:
        engine.close()


if __name__ == "__main__":
    main()
