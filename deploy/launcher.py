"""Local multi-process launcher: owners and a curator as separate OS processes on loopback.

:class:`LocalCluster` starts one ``dpmarket serve-owner`` process per owner data file and one
``dpmarket serve-curator`` process, each binding port 0 and reporting its real port through a
file; :func:`run_demo` drives it as a consumer (``make demo``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from rich.console import Console

from common.errors import UnavailableError
from common.summarization.kernels import exact_kernel_greedy
from common.summarization.summary import METHODS, SessionReport, SummarizationConfig, SummaryResult

#: Seconds to wait for a service to report its port.
START_TIMEOUT_SECONDS = 60.0


class LocalCluster:
    """Owner and curator processes on 127.0.0.1; a context manager that stops them on exit.

    Parameters
    ----------
    owner_files : sequence of path
        One data file per owner (any format ``dpmarket serve-owner --data`` reads).
    owner_ids : sequence of str
        Owner names, one per file.
    log_dir : path
        Each process writes ``<name>.log`` there.
    allow_seeded_sessions : bool
        Passed to the curator (reproducible runs).
    owner_timeout : float
        The curator's per-call deadline for owners, seconds.

    Raises
    ------
    UnavailableError
        If a process exits or does not report its port within ``START_TIMEOUT_SECONDS``.
    """

    def __init__(
        self,
        owner_files: Sequence[str | os.PathLike[str]],
        owner_ids: Sequence[str],
        log_dir: str | os.PathLike[str],
        *,
        allow_seeded_sessions: bool = True,
        owner_timeout: float = 30.0,
    ) -> None:
        self.owner_files = [str(f) for f in owner_files]
        self.owner_ids = list(owner_ids)
        self.log_dir = Path(log_dir)
        self.allow_seeded_sessions = allow_seeded_sessions
        self.owner_timeout = owner_timeout
        self.owner_processes: list[subprocess.Popen[bytes]] = []
        self.owner_targets: list[str] = []
        self.curator_process: subprocess.Popen[bytes] | None = None
        self.curator_target = ""
        self._tmp = tempfile.TemporaryDirectory(prefix="dpmarket-ports-")

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port_file = Path(self._tmp.name) / f"{name}.port"
        log = (self.log_dir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "-v", *args, "--port-file", str(port_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return process, port_file

    def _wait_port(self, name: str, process: subprocess.Popen[bytes], port_file: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if port_file.exists():
                return int(port_file.read_text(encoding="utf-8").strip())
            if process.poll() is not None:
                raise UnavailableError(
                    f"{name} exited with code {process.returncode} before serving; see "
                    f"{self.log_dir / (name + '.log')}"
                )
            time.sleep(0.05)
        raise UnavailableError(f"{name} did not start within {START_TIMEOUT_SECONDS:.0f} s")

    def start(self) -> None:
        """Start every owner, then the curator pointed at them."""
        spawned = []
        for owner_id, path in zip(self.owner_ids, self.owner_files, strict=True):
            process, port_file = self._spawn(
                owner_id, ["serve-owner", "--data", path, "--owner-id", owner_id, "--port", "0"]
            )
            self.owner_processes.append(process)
            spawned.append((owner_id, process, port_file))
        for owner_id, process, port_file in spawned:
            self.owner_targets.append(f"127.0.0.1:{self._wait_port(owner_id, process, port_file)}")
        args = ["serve-curator", "--port", "0", "--owner-timeout", str(self.owner_timeout)]
        for target in self.owner_targets:
            args += ["--owner", target]
        if self.allow_seeded_sessions:
            args.append("--allow-seeded-sessions")
        self.curator_process, port_file = self._spawn("curator", args)
        port = self._wait_port("curator", self.curator_process, port_file)
        self.curator_target = f"127.0.0.1:{port}"

    def kill_owner(self, index: int) -> None:
        """Kill one owner process abruptly (SIGKILL), as a crashed machine would vanish."""
        process = self.owner_processes[index]
        process.kill()
        process.wait()

    def stop(self) -> None:
        """Stop every process: SIGTERM (graceful), then SIGKILL after 10 s."""
        processes = [*self.owner_processes]
        if self.curator_process is not None:
            processes.insert(0, self.curator_process)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._tmp.cleanup()


def _round_robin(result: SummaryResult) -> SummaryResult:
    """Reorder a uniform sample so that every prefix takes near-equal shares from every owner."""
    order: list[int] = []
    by_owner: dict[str, list[int]] = {}
    for i, owner in enumerate(result.owner_ids):
        by_owner.setdefault(owner, []).append(i)
    queues = list(by_owner.values())
    while any(queues):
        for queue in queues:
            if queue:
                order.append(queue.pop(0))
    idx = np.asarray(order, dtype=np.int64)
    return SummaryResult(
        points=result.points[idx],
        labels=None if result.labels is None else result.labels[idx],
        owner_ids=tuple(result.owner_ids[i] for i in order),
        report=result.report,
    )


def exact_greedy_summary(
    owners: Sequence[Any], validation: np.ndarray, seed_set: np.ndarray, p: int, gamma: float
) -> SummaryResult:
    """Non-private greedy with the exact kernel on the pooled data (a reference, not a service)."""
    start = time.perf_counter()
    pool = np.concatenate([o.features for o in owners])
    labels = (
        np.concatenate([o.labels for o in owners])
        if all(o.labels is not None for o in owners)
        else None
    )
    names = [o.name for o in owners for _ in range(o.n_points)]
    index = exact_kernel_greedy(pool, validation, seed_set, p, gamma)
    elapsed = time.perf_counter() - start
    report = SessionReport(
        method="greedy",
        summary_size=p,
        rounds=p,
        owner_points_accessed=int(pool.shape[0]),
        validation_points_accessed=int(validation.shape[0]),
        all_owners_bound=len(owners) * p,
        paper_bound=0.0,
        dropped_owners=(),
        ledger={},
        wall_time_seconds=elapsed,
    )
    return SummaryResult(
        points=pool[index],
        labels=None if labels is None else labels[index],
        owner_ids=tuple(names[i] for i in index),
        report=report,
    )


def run_demo(
    scenario_name: str,
    out_dir: Path,
    *,
    summary_size: int | None,
    seed: int,
    in_process: bool,
    console: Console,
) -> dict[str, Any]:
    """Run the marketplace on a bundled scenario and compare the methods (``make demo``).

    Starts five (digits) or eight (flights) owner processes and a curator, then, as the consumer,
    requests a private, a non-private greedy and a uniform summary of size p over gRPC; computes
    the exact-kernel greedy summary on the pooled data as the reference; prints the table and
    writes ``report.json`` and ``mmd.png`` into ``out_dir``.

    Returns
    -------
    dict
        The JSON report.
    """
    from consumer.client import CuratorClient
    from consumer.report import (
        add_relative_mmd,
        comparison_table,
        evaluate_summary,
        mmd_curve,
        plot_mmd_curves,
        write_json,
    )
    from deploy.cli import progress_printer
    from deploy.runner import simulate
    from deploy.scenarios import SCENARIOS, write_scenario

    wide = Console(width=max(console.width, 170))
    scenario = SCENARIOS[scenario_name](seed)
    p = summary_size or scenario.default_p
    data_dir = out_dir / "data"
    paths = write_scenario(scenario, data_dir)
    owner_files = [paths[f"owner-{i}"] for i in range(len(scenario.owners))]
    owner_ids = [o.name for o in scenario.owners]
    console.print(f"[bold]{scenario.name}[/bold]: {scenario.description}")
    console.print(
        f"{len(owner_ids)} owners ({sum(o.n_points for o in scenario.owners)} points), "
        f"m = {scenario.validation.shape[0]} validation points, p = {p}, gamma = {scenario.gamma}"
    )
    configs = {
        m: SummarizationConfig(summary_size=p, method=m, gamma=scenario.gamma) for m in METHODS
    }
    results: dict[str, SummaryResult] = {}
    if in_process:
        for method, config in configs.items():
            progress, update = progress_printer(method)
            with progress:
                results[method] = simulate(
                    scenario.owners,
                    scenario.validation,
                    scenario.seed_set,
                    config,
                    seed=seed,
                    on_progress=update,
                )
    else:
        with LocalCluster(owner_files, owner_ids, out_dir / "logs") as cluster:
            console.print(
                f"curator at {cluster.curator_target}; owners at "
                + ", ".join(cluster.owner_targets)
            )
            with CuratorClient(cluster.curator_target) as client:
                for method, config in configs.items():
                    progress, update = progress_printer(method)
                    with progress:
                        results[method] = client.summarize(
                            config,
                            scenario.validation,
                            scenario.seed_set,
                            seed=seed,
                            on_progress=update,
                        )
    results["exact-greedy"] = exact_greedy_summary(
        scenario.owners, scenario.validation, scenario.seed_set, p, scenario.gamma
    )
    results["uniform"] = _round_robin(results["uniform"])
    labels = {
        "candidates": "private (candidates, default)",
        "private": "private (Algorithm 3)",
        "rounds": "private (rounds: Gaussian, tree, exact)",
        "greedy": "greedy, RFF embeddings",
        "uniform": "uniform sampling",
        "exact-greedy": "greedy, exact kernel (pooled)",
    }
    rows = []
    for key, result in results.items():
        row = evaluate_summary(
            result, scenario.validation, scenario.gamma, test=scenario.test, seed=seed
        )
        row["method"] = key
        row["label"] = labels[key]
        if key == "exact-greedy":
            row["owner_points_accessed"] = None
            row["all_owners_bound"] = None
        rows.append(row)
    add_relative_mmd(rows, reference="exact-greedy")
    step = max(1, p // 20)
    sizes = list(range(step, p + 1, step))
    curves = {
        labels[k]: (sizes, mmd_curve(r.points, scenario.validation, scenario.gamma, sizes))
        for k, r in results.items()
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_path = out_dir / "mmd.png"
    plot_mmd_curves(
        curves,
        plot_path,
        title=f"{scenario.name}: MMD² of the first k summary points",
        reference=labels["exact-greedy"],
    )
    report = {
        "scenario": {
            "name": scenario.name,
            "description": scenario.description,
            "owners": {o.name: o.n_points for o in scenario.owners},
            "validation_points": int(scenario.validation.shape[0]),
            "test_points": scenario.test.n_points,
            "seed_set_points": int(scenario.seed_set.shape[0]),
            "gamma": scenario.gamma,
        },
        "summary_size": p,
        "seed": seed,
        "transport": "in-process" if in_process else "gRPC, separate processes",
        "config": {k: v for k, v in configs["private"].__dict__.items() if k != "method"},
        "methods": rows,
        "curves": {label: {"sizes": s, "mmd2": v} for label, (s, v) in curves.items()},
    }
    write_json(report, out_dir / "report.json")
    wide.print(comparison_table(rows, title=f"{scenario.name}, p = {p}, seed = {seed}"))
    wide.print(
        "ε: Theorem 7 (Kairouz et al.) / PLD (dp-accounting); Algorithm 3 at the paper's settings "
        f"for delta~ = {configs['private'].delta_validation} (D_v) and "
        f"{configs['private'].delta_owners} (owners), candidates for delta = "
        f"{configs['candidates'].delta}. '% over greedy' is against the exact-kernel greedy on "
        "pooled data."
    )
    console.print(f"report -> {out_dir / 'report.json'}, plot -> {plot_path}")
    return report
