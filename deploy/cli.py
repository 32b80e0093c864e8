"""``dpmarket``: one entry point for every role of the marketplace.

Subcommands: ``serve-owner`` and ``serve-curator`` run the services; ``request`` runs a consumer
request against a running curator; ``simulate`` runs the same protocol in one process on the same
inputs; ``scenario`` writes a bundled real-data scenario to files; ``demo`` launches the whole
marketplace as separate processes and compares the methods; ``evaluate`` measures every method's
summary quality against epsilon over scenarios, summary sizes and seeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.errors import DPMarketError
from common.summarization.summary import (
    METHODS,
    PARAMETER_NAMES,
    POOL_SCORINGS,
    SUMMARY_RELEASES,
    VALIDATION_RELEASES,
    ProgressEvent,
    SummarizationConfig,
    SummaryResult,
)
from owner.data import PointSet, load_point_set

logger = logging.getLogger("dpmarket")
console = Console(stderr=True)

_DEFAULTS = SummarizationConfig(summary_size=1)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """dpmarket: a differentially private data marketplace (private distributed summarization)."""
    _setup_logging(verbose)


# ------------------------------------------------------------------------------- services
@main.command("serve-owner")
@click.option(
    "--data",
    "data_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The owner's points: .npy, .npz, numeric .csv or .parquet.",
)
@click.option(
    "--label-column",
    default="label",
    help="Column of integer labels in .csv/.parquet files (absent: unlabeled).",
)
@click.option("--owner-id", default=None, help="Name in reports (default: the file's stem).")
@click.option("--host", default="127.0.0.1", help="Address to bind.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--port-file", default=None, help="Write the bound port to this file.")
@click.option(
    "--blas-threads",
    default=1,
    type=click.IntRange(min=1),
    help="BLAS threads for the bid products. One per owner avoids spinning threads when "
    "several owners share a machine; raise it for an owner alone on many cores.",
)
def serve_owner(
    data_path: str,
    label_column: str,
    owner_id: str | None,
    host: str,
    port: int,
    port_file: str | None,
    blas_threads: int,
) -> None:
    """Serve one data owner's private dataset over gRPC."""
    from threadpoolctl import threadpool_limits

    from owner.protocol import Owner
    from owner.service import serve_owner as serve

    _ensure_info_logging()
    data = _load(data_path, label_column=label_column)
    owner = Owner(owner_id or data.name, data)
    logger.info("owner %s: %d points, %d features", owner.owner_id, *data.features.shape)
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        asyncio.run(serve(owner, f"{host}:{port}", port_file))


@main.command("serve-curator")
@click.option(
    "--owner",
    "owners",
    multiple=True,
    required=True,
    metavar="HOST:PORT",
    help="An owner service; repeat for every owner.",
)
@click.option("--host", default="127.0.0.1", help="Address to bind.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--port-file", default=None, help="Write the bound port to this file.")
@click.option(
    "--allow-seeded-sessions",
    is_flag=True,
    help="Accept requests that fix the session seed (reproducible runs; never in "
    "production: whoever knows the seed knows the noise).",
)
@click.option(
    "--owner-timeout",
    default=30.0,
    type=click.FloatRange(min=0.1),
    help="Seconds after which an owner that has not answered a call is dropped.",
)
def serve_curator(
    owners: tuple[str, ...],
    host: str,
    port: int,
    port_file: str | None,
    allow_seeded_sessions: bool,
    owner_timeout: float,
) -> None:
    """Serve the parsimonious curator for a fixed set of owners."""
    from curator.owners import GrpcOwnerEndpoint
    from curator.service import serve_curator as serve

    _ensure_info_logging()

    async def run() -> None:
        endpoints = [GrpcOwnerEndpoint(target, deadline=owner_timeout) for target in owners]
        await serve(
            endpoints,
            f"{host}:{port}",
            allow_seeded_sessions=allow_seeded_sessions,
            call_timeout=owner_timeout,
            port_file=port_file,
        )

    asyncio.run(run())


# ----------------------------------------------------------------- protocol options
def protocol_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by ``request`` and ``simulate`` (defaults: Section 4, Table 1)."""
    d = _DEFAULTS
    options = [
        click.option(
            "--validation",
            "validation_path",
            required=True,
            type=click.Path(exists=True, dir_okay=False),
            help="The consumer's validation set D_v (.npy/.npz/.csv/.parquet; labels "
            "are ignored and never sent).",
        ),
        click.option(
            "--seed-set",
            "seed_set_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="Public seed set D_init (default: none).",
        ),
        click.option(
            "-p",
            "--summary-size",
            required=True,
            type=click.IntRange(min=1),
            help="p: number of owner points in the summary.",
        ),
        click.option(
            "--method",
            type=click.Choice(METHODS),
            default="candidates",
            help="candidates: private candidates with exact re-ranking (the default private "
            "method: best measured quality); private: the paper's Algorithm 3; greedy: "
            "non-private greedy on exact mean h1 embeddings; uniform: p/K points from every "
            "owner; rounds: Algorithm 3's per-round protocol with the releases and pool scoring "
            "chosen by --validation-release, --summary-release and --pool-scoring.",
        ),
        click.option(
            "--test",
            "test_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="Labeled target test set: adds MMD² to it and downstream accuracy.",
        ),
        click.option(
            "-d",
            "--rff-dimension",
            default=d.rff_dimension,
            type=click.IntRange(min=1),
            help="d, dimension of h1.",
        ),
        click.option(
            "--gamma",
            default=d.gamma,
            type=click.FloatRange(min=0, min_open=True),
            help="RBF kernel parameter, exp(-gamma ||x-y||²).",
        ),
        click.option(
            "--epsilon-validation",
            default=d.epsilon_validation,
            type=float,
            help="epsilon per h2 iteration on D_v.",
        ),
        click.option(
            "--iterations-initial",
            default=d.iterations_initial,
            type=int,
            help="T_init (0: floor(d^1.5) = 1656 for d = 140).",
        ),
        click.option(
            "--iterations-subsequent",
            default=d.iterations_subsequent,
            type=int,
            help="T_subs, MWEM iterations per later epoch.",
        ),
        click.option(
            "--epsilon-first-epoch",
            default=d.epsilon_first_epoch,
            type=float,
            help="epsilon per h2 iteration in epoch 1 (public seed set).",
        ),
        click.option(
            "--epsilon-summary",
            default=d.epsilon_summary,
            type=float,
            help="Later epochs use epsilon_summary / sqrt(p T_subs) per iteration.",
        ),
        click.option(
            "--quantization-step",
            default=d.quantization_step,
            type=float,
            help="eta of the quantization grid (0: 1/d).",
        ),
        click.option(
            "--epsilon-auction",
            default=d.epsilon_auction,
            type=float,
            help="Total epsilon of PrivAuction (Theorem 6).",
        ),
        click.option(
            "--delta-owners",
            default=d.delta_owners,
            type=float,
            help="delta of the auction and of the owners' composition bound.",
        ),
        click.option(
            "--delta-validation",
            default=d.delta_validation,
            type=float,
            help="delta~ of the validation set's composition bound.",
        ),
        click.option(
            "--epsilon-validation-total",
            default=d.epsilon_validation_total,
            type=float,
            help="candidates: epsilon of the Gaussian validation embedding.",
        ),
        click.option(
            "--epsilon-owners-total",
            default=d.epsilon_owners_total,
            type=float,
            help="candidates: epsilon of the owners' noisy relevance counts.",
        ),
        click.option(
            "--delta",
            default=d.delta,
            type=float,
            help="candidates: delta of the Gaussian mechanism and of the reported epsilons.",
        ),
        click.option(
            "--candidate-fraction",
            default=d.candidate_fraction,
            type=float,
            help="candidates: at most this fraction of K*p owner points are read.",
        ),
        click.option(
            "--relevance-threshold",
            default=d.relevance_threshold,
            type=float,
            help="candidates: a point is relevant when its score is >= this * ||g||².",
        ),
        click.option(
            "--candidate-even-share",
            default=d.candidate_even_share,
            type=float,
            help="candidates: share of the budget split evenly before the relevance split.",
        ),
        click.option(
            "--embedding-rerank",
            is_flag=True,
            help="candidates: re-rank by the private embedding, not the exact kernel.",
        ),
        click.option(
            "--validation-release",
            type=click.Choice(VALIDATION_RELEASES),
            default=d.validation_release,
            help="rounds: gtilde by the Gaussian mechanism or by h2 (MWEM) as the paper.",
        ),
        click.option(
            "--summary-release",
            type=click.Choice(SUMMARY_RELEASES),
            default=d.summary_release,
            help="rounds: summary embedding by the binary-tree continual release, by h2 "
            "(MWEM) every round as the paper, or not broadcast at all.",
        ),
        click.option(
            "--pool-scoring",
            type=click.Choice(POOL_SCORINGS),
            default=d.pool_scoring,
            help="rounds: add the pool point with the largest exact marginal gain or the "
            "largest private-embedding bid.",
        ),
        click.option(
            "--auction-share",
            default=d.auction_share,
            type=float,
            help="rounds: PrivAuction's share of epsilon_owners_total (Theorem-6 epsilon).",
        ),
        click.option(
            "--seed",
            default=None,
            type=click.IntRange(min=0),
            help="Seed of every random draw (reproducible runs); default: a "
            "cryptographically seeded generator.",
        ),
        click.option(
            "--out",
            "out_path",
            default="summary.npy",
            type=click.Path(dir_okay=False),
            help="Where to write the summary points (.npy; labels to .labels.npy).",
        ),
        click.option(
            "--report",
            "report_path",
            default="report.json",
            type=click.Path(dir_okay=False),
            help="Where to write the JSON report.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _config(summary_size: int, method: str, kwargs: dict[str, Any]) -> SummarizationConfig:
    try:
        return SummarizationConfig(
            summary_size=summary_size,
            method=method,  # type: ignore[arg-type]
            **{k: kwargs[k] for k in PARAMETER_NAMES},
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _load(path: str, *, label_column: str | None = "label") -> PointSet:
    try:
        return load_point_set(path, label_column=label_column)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


def _seed_set(path: str | None, n_features: int) -> NDArray[np.float64]:
    if path is None:
        return np.zeros((0, n_features))
    return _load(path).features


def _ensure_info_logging() -> None:
    if logger.getEffectiveLevel() > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)


def progress_printer(label: str) -> tuple[Progress, Callable[[ProgressEvent], None]]:
    """A rich progress bar and the callback that advances it from session events."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("accessed {task.fields[accessed]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(label, total=None, accessed=0)

    def update(event: ProgressEvent) -> None:
        progress.update(
            task, completed=event.round, total=event.total_rounds, accessed=event.points_accessed
        )
        if event.message and ("dropped" in event.message or event.stage == "failed"):
            progress.console.print(f"[yellow]{label}: {event.message}")

    return progress, update


def _finish(
    result: SummaryResult,
    validation: PointSet,
    config: SummarizationConfig,
    test_path: str | None,
    out_path: str,
    report_path: str,
    seed: int | None,
) -> None:
    from consumer.report import comparison_table, evaluate_summary, write_json
    from owner.data import save_point_set

    test = _load(test_path) if test_path else None
    row = evaluate_summary(result, validation.features, config.gamma, test=test, seed=seed or 0)
    row["label"] = config.method
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_point_set(PointSet(result.points, result.labels, "summary"), out)
    write_json({"config": asdict(config), "result": row}, report_path)
    title = f"{config.method} summary of {len(result.points)} points"
    Console().print(comparison_table([row], title=title))
    console.print(f"summary -> {out}, report -> {report_path}")


# ------------------------------------------------------------------------- consumer
@main.command("request")
@click.option("--curator", required=True, metavar="HOST:PORT", help="The curator service.")
@protocol_options
def request(
    curator: str,
    summary_size: int,
    method: str,
    validation_path: str,
    seed_set_path: str | None,
    test_path: str | None,
    seed: int | None,
    out_path: str,
    report_path: str,
    **kwargs: Any,
) -> None:
    """Ask a running curator for a summary matching a validation set."""
    from consumer.client import CuratorClient

    config = _config(summary_size, method, kwargs)
    validation = _load(validation_path)
    seed_set = _seed_set(seed_set_path, validation.features.shape[1])
    progress, update = progress_printer(method)
    try:
        with CuratorClient(curator) as client, progress:
            result = client.summarize(
                config, validation.features, seed_set, seed=seed, on_progress=update
            )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(result, validation, config, test_path, out_path, report_path, seed)


@main.command("simulate")
@click.option(
    "--owner-data",
    "owner_paths",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="An owner's data file; repeat for every owner.",
)
@protocol_options
def simulate_command(
    owner_paths: tuple[str, ...],
    summary_size: int,
    method: str,
    validation_path: str,
    seed_set_path: str | None,
    test_path: str | None,
    seed: int | None,
    out_path: str,
    report_path: str,
    **kwargs: Any,
) -> None:
    """Run the same protocol with every party in this process (same seeds, same summary)."""
    from deploy.runner import simulate

    config = _config(summary_size, method, kwargs)
    owners = [_load(p) for p in owner_paths]
    validation = _load(validation_path)
    seed_set = _seed_set(seed_set_path, validation.features.shape[1])
    progress, update = progress_printer(method)
    try:
        with progress:
            result = simulate(
                owners, validation.features, seed_set, config, seed=seed, on_progress=update
            )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(result, validation, config, test_path, out_path, report_path, seed)


# ------------------------------------------------------------------------ data, demo
@main.command("scenario")
@click.argument("name", type=click.Choice(["digits", "flights"]))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the owner, validation, seed-set and test files.",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the split.")
def scenario_command(name: str, out_dir: str, seed: int) -> None:
    """Write a bundled real-data scenario (digits or nycflights13) to files."""
    from deploy.scenarios import SCENARIOS, write_scenario

    scenario = SCENARIOS[name](seed)
    paths = write_scenario(scenario, out_dir)
    console.print(scenario.description)
    for key, path in paths.items():
        console.print(f"  {key}: {path}")


@main.command("demo")
@click.option(
    "--scenario",
    "scenario_name",
    type=click.Choice(["digits", "flights"]),
    default="digits",
    help="Real-data scenario.",
)
@click.option(
    "--out",
    "out_dir",
    default="out/demo",
    type=click.Path(file_okay=False),
    help="Directory for data files, logs, report.json and mmd.png.",
)
@click.option(
    "-p",
    "--summary-size",
    default=None,
    type=click.IntRange(min=1),
    help="p (default: the scenario's).",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of split and sessions.")
@click.option(
    "--in-process",
    is_flag=True,
    help="Run every party in this process instead of separate gRPC services.",
)
def demo(
    scenario_name: str, out_dir: str, summary_size: int | None, seed: int, in_process: bool
) -> None:
    """Launch curator, owners and consumer as processes and compare private, greedy, uniform."""
    from deploy.launcher import run_demo

    try:
        run_demo(
            scenario_name,
            Path(out_dir),
            summary_size=summary_size,
            seed=seed,
            in_process=in_process,
            console=Console(),
        )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


# ------------------------------------------------------------------------------ evaluate
@main.command("evaluate")
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    type=click.Choice(["digits", "flights"]),
    help="Real-data scenario; repeat for several (default: digits and flights).",
)
@click.option(
    "--p",
    "sizes",
    multiple=True,
    type=click.IntRange(min=1),
    help="Summary size p; repeat for several (default: 50, 200, 500; a p above the owners' "
    "total points is skipped).",
)
@click.option(
    "--epsilon",
    "epsilons",
    multiple=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Privacy target, each party's epsilon at --delta; repeat (default: 0.3, 1, 3).",
)
@click.option(
    "--seeds",
    default=None,
    type=click.IntRange(min=1),
    help="Number of session seeds 0..n-1 (default: 3; the scenario split always uses seed 0).",
)
@click.option(
    "--method",
    "methods",
    multiple=True,
    type=click.Choice(
        ["exact-greedy", "greedy", "uniform", "paper", "candidates", "candidates-embedding-rerank"]
    ),
    help="Method to evaluate; repeat (default: all).",
)
@click.option(
    "--delta",
    default=1e-6,
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    help="delta of every private method's epsilon.",
)
@click.option(
    "--out",
    "out_dir",
    default="out/evaluate",
    type=click.Path(file_okay=False),
    help="Directory for evaluation.json and quality_vs_epsilon.png.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smoke test: digits, p = 20, epsilon 1, one seed (options given explicitly win).",
)
def evaluate(
    scenario_names: tuple[str, ...],
    sizes: tuple[int, ...],
    epsilons: tuple[float, ...],
    seeds: int | None,
    methods: tuple[str, ...],
    delta: float,
    out_dir: str,
    quick: bool,
) -> None:
    """Compare every method's summary quality against epsilon over scenarios, p and seeds."""
    from deploy.evaluate import (
        DEFAULT_EPSILONS,
        DEFAULT_SCENARIOS,
        DEFAULT_SEEDS,
        DEFAULT_SIZES,
        EVAL_METHODS,
        QUICK,
        run_evaluation,
    )

    defaults: dict[str, Any] = (
        QUICK
        if quick
        else {
            "scenarios": DEFAULT_SCENARIOS,
            "sizes": DEFAULT_SIZES,
            "epsilons": DEFAULT_EPSILONS,
            "seeds": DEFAULT_SEEDS,
        }
    )
    try:
        run_evaluation(
            scenario_names or defaults["scenarios"],
            sizes or defaults["sizes"],
            epsilons or defaults["epsilons"],
            seeds or defaults["seeds"],
            methods or EVAL_METHODS,
            Path(out_dir),
            delta=delta,
            console=Console(),
        )
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()
