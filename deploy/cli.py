"""``dpmarket``: one entry point for every role of the marketplace.

Subcommands: ``serve-owner`` and ``serve-curator`` run the services (the curator with its
sketch catalogue); ``request`` runs a consumer request against a running curator; ``sketch``
publishes an owner's private sketches and lists the catalogue, ``explore`` and ``rank-owners``
compute from them (:mod:`deploy.sketch_commands`); ``simulate`` runs the same protocol in one
process on the same inputs; ``scenario`` writes a bundled real-data scenario to files; ``demo``
launches the whole marketplace as separate processes and compares the methods; ``evaluate``
measures every method's summary quality against epsilon over scenarios, summary sizes and
seeds; ``pki`` issues the deployment's certificates; ``owner ledger`` lists an owner's privacy
ledger; ``health`` probes a service over mTLS; ``sketch-experiments`` reproduces the
M2M paper's results.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from common.errors import DPMarketError
from common.summarization.sketch_allocation import RELEVANCE_SCORES
from common.summarization.summary import (
    ALLOCATIONS,
    AUCTIONS,
    METHODS,
    PARAMETER_NAMES,
    POOL_SCORINGS,
    SUMMARY_RELEASES,
    VALIDATION_RELEASES,
    ProgressEvent,
    SummarizationConfig,
    SummaryResult,
)
from consumer.client import SessionFailedError
from deploy.cape_experiments import cape_figures
from deploy.cli_common import check_outputs as _check_outputs
from deploy.cli_common import security_from_options as _security
from deploy.cli_common import tls_options
from deploy.evaluate import EVAL_METHODS
from deploy.health import health_command
from deploy.owner_commands import owner as owner_group
from deploy.pki import pki
from deploy.scenarios import SCENARIO_NAMES
from deploy.sketch_commands import explore_command, rank_owners_command, sketch_group
from deploy.sketch_experiments import sketch_experiments
from dpmarket.identity import Identity
from owner.data import PointSet, load_point_set

logger = logging.getLogger("dpmarket")
console = Console(stderr=True)

_DEFAULTS = SummarizationConfig(summary_size=1)


def _setup_logging(verbose: int) -> None:
    """Rich output on a terminal; one plain, unwrapped line per record otherwise (services
    writing to a log file or a container's log)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    if console.is_terminal:
        logging.basicConfig(
            level=level,
            format="%(message)s",
            handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
        )
    else:
        logging.basicConfig(
            level=level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S%z",
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
    default=None,
    type=click.Path(dir_okay=False),
    help="The owner's points for summarization: .npy, .npz, numeric .csv or .parquet.",
)
@click.option(
    "--table",
    "table_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The owner's numeric table with named columns for joint statistics (CAPE): .csv or "
    ".parquet. At least one of --data and --table.",
)
@click.option(
    "--label-column",
    default="label",
    help="Column of integer labels in .csv/.parquet files (absent: unlabeled).",
)
@click.option(
    "--owner-id",
    default=None,
    help="Name in reports; with mTLS it must be the certificate's name (the default).",
)
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
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The owner's policy file (TOML: budgets, point limits, curators served; see "
    "deploy/policies/owner.toml). Default: the built-in defaults.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the owner keeps its ledger (SQLite). Default: dpmarket-state/owner-<name>.",
)
@click.option(
    "--allow-seeded-sessions",
    is_flag=True,
    help="Let a session's seed drive this owner's sampling and noise (reproducible runs; "
    "never in production: whoever knows the seed knows the noise).",
)
@tls_options
def serve_owner(
    data_path: str | None,
    table_path: str | None,
    label_column: str,
    owner_id: str | None,
    host: str,
    port: int,
    port_file: str | None,
    blas_threads: int,
    policy_path: str | None,
    data_dir: str | None,
    allow_seeded_sessions: bool,
    **tls: Any,
) -> None:
    """Serve one data owner's private dataset over gRPC (mTLS), under its own policy."""
    from threadpoolctl import threadpool_limits

    from owner.cape import CapeSite
    from owner.data import load_table
    from owner.ledger import OwnerLedger
    from owner.policy import OwnerPolicy, load_owner_policy
    from owner.protocol import Owner
    from owner.service import serve_owner as serve

    _ensure_info_logging()
    if data_path is None and table_path is None:
        raise click.UsageError("give --data (points to summarize), --table (for CAPE), or both")
    security = _security("owner", **tls)
    name = security.identity.name if security.identity is not None else None
    if name is not None and owner_id is not None and owner_id != name:
        raise click.BadParameter(
            f"the certificate names this owner {name!r}, not {owner_id!r}", param_hint="--owner-id"
        )
    data = _load(data_path, label_column=label_column) if data_path is not None else None
    try:
        table = load_table(table_path) if table_path is not None else None
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    default_name = data.name if data is not None else table.name if table is not None else ""
    owner_id = name or owner_id or default_name
    try:
        policy = load_owner_policy(policy_path) if policy_path else OwnerPolicy()
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"owner-{owner_id}"
    try:
        ledger = OwnerLedger(state, policy)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    owner = Owner(
        owner_id,
        data,
        ledger=ledger,
        max_sessions=policy.max_sessions,
        idle_timeout=policy.session_idle_timeout_seconds,
        max_rff_dimension=policy.max_rff_dimension,
        allow_seeded_sessions=allow_seeded_sessions,
    )
    cape = CapeSite(
        owner_id,
        table,
        ledger=ledger,
        max_jobs=policy.max_sessions,
        idle_timeout=policy.session_idle_timeout_seconds,
        allow_seeded_sessions=allow_seeded_sessions,
    )
    left = ledger.remaining()
    points = (
        "no points" if data is None else f"{data.n_points} points of {data.n_features} features"
    )
    rows = "no table" if table is None else f"a table of {table.n_rows} rows"
    logger.info(
        "owner %s: %s, %s; ledger %s; left %s: epsilon %g, delta %g, %d points",
        owner.owner_id,
        points,
        rows,
        ledger.path,
        left.window,
        left.epsilon,
        left.delta,
        left.points,
    )
    try:
        with threadpool_limits(limits=blas_threads, user_api="blas"):
            asyncio.run(
                serve(
                    owner,
                    f"{host}:{port}",
                    security,
                    curators=policy.curators,
                    cape=cape,
                    port_file=port_file,
                )
            )
    finally:
        ledger.close()


def _owner_target(text: str, insecure: bool) -> tuple[Identity | None, str]:
    """``NAME@HOST:PORT`` -> (owner identity, address); plain ``HOST:PORT`` only if insecure."""
    name, at, target = text.rpartition("@")
    if not at:
        if insecure:
            return None, text
        raise click.BadParameter(
            f"{text!r}: give NAME@HOST:PORT, NAME being the owner's certificate name",
            param_hint="--owner",
        )
    try:
        return Identity("owner", name), target
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--owner") from exc


@main.command("serve-curator")
@click.option(
    "--owner",
    "owners",
    multiple=True,
    required=True,
    metavar="NAME@HOST:PORT",
    help="An owner service and the name its certificate must carry; repeat for every owner.",
)
@click.option("--host", default="127.0.0.1", help="Address to bind.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--port-file", default=None, help="Write the bound port to this file.")
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The curator's policy file (TOML: parameter ranges, sessions, retention; see "
    "deploy/policies/curator.toml). Default: the built-in defaults.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the curator keeps sessions and charges (SQLite). Default: "
    "dpmarket-state/curator-<name>.",
)
@click.option(
    "--allow-seeded-sessions",
    is_flag=True,
    help="Accept requests that fix the session seed (reproducible runs; never in "
    "production: whoever knows the seed knows the noise). Overrides the policy.",
)
@click.option(
    "--owner-timeout",
    default=30.0,
    type=click.FloatRange(min=0.1),
    help="Seconds after which an owner that has not answered a call is dropped.",
)
@click.option(
    "--sketch-spec",
    "sketch_specs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A sketch declaration (TOML, e.g. deploy/sketches/flights.toml) for the catalogue; "
    "repeat. Its parameters are drawn and stored the first time, checked against the stored "
    "ones afterwards. Specs stored before are served whether given again or not.",
)
@click.option(
    "--sketch-seed",
    default=None,
    type=click.IntRange(min=0),
    help="Draw new sketch specs' parameters from this seed (reproducible runs; the parameters "
    "are public either way). Default: a CSPRNG.",
)
@click.option(
    "--allocation-sketch-spec",
    default=None,
    metavar="NAME",
    help="The catalogue's RFF spec (e.g. digits/rff) whose published sketches the candidates "
    "method reads to split its candidate budget; its columns must be the owners' summarization "
    "features, in order. Without it, or for owners that published no sketch under it, sessions "
    "split the budget by the owners' noisy relevance counts.",
)
@tls_options
def serve_curator(
    owners: tuple[str, ...],
    host: str,
    port: int,
    port_file: str | None,
    policy_path: str | None,
    data_dir: str | None,
    allow_seeded_sessions: bool,
    owner_timeout: float,
    sketch_specs: tuple[str, ...],
    sketch_seed: int | None,
    allocation_sketch_spec: str | None,
    **tls: Any,
) -> None:
    """Serve the parsimonious curator for a fixed set of owners (mTLS), with its catalogue of
    the owners' private sketches."""
    from curator.owners import GrpcOwnerEndpoint
    from curator.policy import CuratorPolicy, load_curator_policy
    from curator.service import serve_curator as serve
    from curator.sketches import SketchCatalog
    from curator.store import CuratorStore

    _ensure_info_logging()
    security = _security("curator", **tls)
    targets = [_owner_target(text, security.insecure) for text in owners]
    try:
        policy = load_curator_policy(policy_path) if policy_path else CuratorPolicy()
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if allow_seeded_sessions:
        policy = policy.with_overrides(allow_seeded_sessions=True)
    name = security.identity.name if security.identity is not None else "insecure"
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"curator-{name}"
    try:
        store = CuratorStore(state)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    owner_names = [identity.name for identity, _ in targets if identity is not None]
    try:
        catalog = SketchCatalog.from_files(
            state, sketch_specs, policy=policy, owners=owner_names, seed=sketch_seed
        )
    except (OSError, ValueError, RuntimeError) as exc:
        store.close()
        raise click.ClickException(str(exc)) from exc
    logger.info(
        "sketch catalogue: %s",
        ", ".join(s.name for s in catalog.specs()) or "no spec",
    )
    if allocation_sketch_spec is not None:
        try:
            kind = catalog.spec(allocation_sketch_spec).kind
        except DPMarketError as exc:
            catalog.close()
            store.close()
            raise click.ClickException(f"--allocation-sketch-spec: {exc}") from exc
        if kind != "rff":
            catalog.close()
            store.close()
            raise click.ClickException(
                f"--allocation-sketch-spec: {allocation_sketch_spec!r} is a {kind} spec; the "
                "allocation reads RFF sketches"
            )

    async def run() -> None:
        endpoints = [
            GrpcOwnerEndpoint(target, security, expected, deadline=owner_timeout)
            for expected, target in targets
        ]
        await serve(
            endpoints,
            f"{host}:{port}",
            security,
            policy=policy,
            store=store,
            sketches=catalog,
            allocation_spec=allocation_sketch_spec,
            call_timeout=owner_timeout,
            port_file=port_file,
        )

    try:
        asyncio.run(run())
    finally:
        catalog.close()
        store.close()


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
            help="candidates: when > 0, at most this fraction of K*p owner points are read "
            "(the previous budget rule).",
        ),
        click.option(
            "--candidate-multiple",
            default=d.candidate_multiple,
            type=float,
            help="candidates: at most max(p, this * p) owner points are read, whatever K "
            "(--candidate-fraction > 0 overrides it).",
        ),
        click.option(
            "--allocation",
            type=click.Choice(ALLOCATIONS),
            default=d.allocation,
            help="candidates: split the candidate budget by the owners' published sketches "
            "(a release about D_v only; falls back to counts when an owner has none) or by the "
            "owners' noisy relevance counts.",
        ),
        click.option(
            "--relevance-score",
            type=click.Choice(RELEVANCE_SCORES),
            default=d.relevance_score,
            help="candidates, sketch allocation: an owner's relevance to a validation point.",
        ),
        click.option(
            "--allocation-share",
            default=d.allocation_share,
            type=float,
            help="candidates, sketch allocation: share of D_v's Gaussian budget spent on the "
            "allocation (the validation embedding gets the rest).",
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
            "--auction",
            type=click.Choice(AUCTIONS),
            default=d.auction,
            help="private and rounds: PrivAuction variant. pure: every rank, the first "
            "included, is asked with probability below 1, so each bad iteration is pure "
            "eps_auc-DP; paper: Algorithm 3 as printed, (eps_auc, 1 - e^-eps_auc)-DP per bad "
            "iteration, charged so (owners' policies usually refuse its delta).",
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
    seed_set = _load(path)
    _check_width(seed_set, n_features, path, "--seed-set")
    return seed_set.features


def _check_width(points: PointSet, n_features: int, path: str, option: str) -> None:
    if points.n_features != n_features:
        raise click.BadParameter(
            f"{path} has {points.n_features} features per point but the validation set has "
            f"{n_features}",
            param_hint=option,
        )


@dataclass(frozen=True)
class _Inputs:
    """A consumer's inputs, all read and checked before anything is released."""

    validation: PointSet
    seed_set: NDArray[np.float64]
    test: PointSet | None


def _inputs(validation_path: str, seed_set_path: str | None, test_path: str | None) -> _Inputs:
    """Read and check every input file, and check every output can be written, before a session.

    A bad file (NaN/inf, wrong width, unlabeled test set, unreadable) is refused here with the
    file's name, so no privacy is spent on a run whose results could not be evaluated or saved.
    """
    validation = _load(validation_path)
    n = validation.n_features
    seed_set = _seed_set(seed_set_path, n)
    test = None
    if test_path is not None:
        test = _load(test_path)
        _check_width(test, n, test_path, "--test")
        if test.labels is None:
            raise click.BadParameter(
                f"{test_path} has no labels: the test set scores the summary's accuracy",
                param_hint="--test",
            )
    return _Inputs(validation, seed_set, test)


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
    inputs: _Inputs,
    config: SummarizationConfig,
    out_path: str,
    report_path: str,
    seed: int | None,
) -> None:
    from consumer.report import comparison_table, evaluate_summary, write_json
    from owner.data import save_point_set

    row = evaluate_summary(
        result, inputs.validation.features, config.gamma, test=inputs.test, seed=seed or 0
    )
    row["label"] = config.method
    out = Path(out_path)
    save_point_set(PointSet(result.points, result.labels, "summary"), out)
    write_json({"config": asdict(config), "result": row}, report_path)
    title = f"{config.method} summary of {len(result.points)} points"
    Console().print(comparison_table([row], title=title))
    console.print(f"summary -> {out}, report -> {report_path}")


def _failed(exc: SessionFailedError, config: SummarizationConfig, report_path: str) -> None:
    """Write a failed session's report (its ledger: what it spent) and fail the command."""
    from consumer.report import write_json

    report = asdict(exc.report) if exc.report is not None else None
    write_json({"config": asdict(config), "error": str(exc), "report": report}, report_path)
    spent = ""
    if exc.report is not None and exc.report.ledger:
        parties = {
            party: exc.report.ledger[party]["parties"][party]["basic"]
            for party in ("validation", "owners")
            if party in exc.report.ledger
        }
        spent = "; spent (basic composition): " + ", ".join(
            f"epsilon {eps:g} on {party}" for party, eps in parties.items()
        )
    raise click.ClickException(f"{exc}{spent}; report with the ledger -> {report_path}")


# ------------------------------------------------------------------------- consumer
@main.command("request")
@click.option("--curator", required=True, metavar="HOST:PORT", help="The curator service.")
@click.option(
    "--curator-name",
    default="curator",
    help="The name the curator's certificate must carry.",
)
@click.option(
    "--request-id",
    default=None,
    help="Idempotency key: a retry with the same key returns the same session and spends "
    "nothing new (default: a fresh random key).",
)
@protocol_options
@tls_options
def request(
    curator: str,
    curator_name: str,
    request_id: str | None,
    summary_size: int,
    method: str,
    validation_path: str,
    seed_set_path: str | None,
    test_path: str | None,
    seed: int | None,
    out_path: str,
    report_path: str,
    ca_path: str | None,
    cert_path: str | None,
    key_path: str | None,
    pki_dir: str | None,
    name: str | None,
    insecure: bool,
    **kwargs: Any,
) -> None:
    """Ask a running curator (over mTLS) for a summary matching a validation set."""
    from consumer.client import CuratorClient

    security = _security("consumer", ca_path, cert_path, key_path, pki_dir, name, insecure)
    config = _config(summary_size, method, kwargs)
    inputs = _inputs(validation_path, seed_set_path, test_path)
    _check_outputs(out_path, report_path)
    try:
        curator_identity = Identity("curator", curator_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--curator-name") from exc
    progress, update = progress_printer(method)
    try:
        with CuratorClient(curator, security, curator=curator_identity) as client, progress:
            result = client.summarize(
                config,
                inputs.validation.features,
                inputs.seed_set,
                seed=seed,
                on_progress=update,
                request_id=request_id,
            )
    except SessionFailedError as exc:
        _failed(exc, config, report_path)
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(result, inputs, config, out_path, report_path, seed)


@main.command("simulate")
@click.option(
    "--owner-data",
    "owner_paths",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="An owner's data file; repeat for every owner.",
)
@click.option(
    "--sketch-scenario",
    default=None,
    type=click.Choice(sorted(SCENARIO_NAMES)),
    help="candidates, sketch allocation: release every owner's sketch in this process with "
    "this scenario's public domain, kernel scale and RFF map (no ledger is charged). "
    "Default: no sketches (the counts allocation).",
)
@click.option(
    "--sketch-epsilon",
    default=1.0,
    type=click.FloatRange(min=0, min_open=True),
    help="epsilon of the in-process sketches (Gaussian, at --delta).",
)
@protocol_options
def simulate_command(
    owner_paths: tuple[str, ...],
    sketch_scenario: str | None,
    sketch_epsilon: float,
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
    inputs = _inputs(validation_path, seed_set_path, test_path)
    _check_outputs(out_path, report_path)
    sketches = None
    if sketch_scenario is not None:
        from deploy.runner import publish_sketches
        from deploy.scenarios import SCENARIOS

        scenario = SCENARIOS[sketch_scenario](0)
        if scenario.n_features != inputs.validation.n_features:
            raise click.BadParameter(
                f"scenario {sketch_scenario} has {scenario.n_features} features, the validation "
                f"set {inputs.validation.n_features}",
                param_hint="--sketch-scenario",
            )
        try:
            sketches = publish_sketches(
                owners,
                scenario.sketch_mechanism(sketch_epsilon, delta=config.delta),
                seed=seed,
                owner_ids=[o.name for o in owners],
            )
        except ValueError as exc:
            raise click.ClickException(f"an owner's data cannot be sketched: {exc}") from exc
    progress, update = progress_printer(method)
    try:
        with progress:
            result = simulate(
                owners,
                inputs.validation.features,
                inputs.seed_set,
                config,
                seed=seed,
                on_progress=update,
                owner_sketches=sketches,
            )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(result, inputs, config, out_path, report_path, seed)


# ------------------------------------------------------------------------ data, demo
@main.command("scenario")
@click.argument("name", type=click.Choice(sorted(SCENARIO_NAMES)))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the owner, validation, seed-set and test files.",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the split.")
@click.option(
    "--owners",
    "n_owners",
    default=None,
    type=click.IntRange(min=1),
    help="flights, flights50: the number of owners (default: the scenario's).",
)
@click.option(
    "--max-points-per-owner",
    default=None,
    type=click.IntRange(min=1),
    help="flights, flights50: keep a uniform random subset of each owner's flights.",
)
def scenario_command(
    name: str, out_dir: str, seed: int, n_owners: int | None, max_points_per_owner: int | None
) -> None:
    """Write a bundled real-data scenario (digits or nycflights13) to files; the flights
    scenarios also write each owner's flights with named columns (owner-<i>-table.parquet)."""
    from deploy.scenarios import SCENARIOS, write_scenario

    sizes: dict[str, int] = {}
    if n_owners is not None:
        sizes["n_owners"] = n_owners
    if max_points_per_owner is not None:
        sizes["max_points_per_owner"] = max_points_per_owner
    if sizes and name == "digits":
        raise click.UsageError(
            "digits has a fixed split: --owners and --max-points-per-owner "
            "apply to flights and flights50"
        )
    try:
        scenario = SCENARIOS[name](seed, **sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    paths = write_scenario(scenario, out_dir)
    console.print(scenario.description)
    for key, path in paths.items():
        console.print(f"  {key}: {path}")


@main.command("demo")
@click.option(
    "--scenario",
    "scenario_name",
    type=click.Choice(sorted(SCENARIO_NAMES)),
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
    type=click.Choice(sorted(SCENARIO_NAMES)),
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
    type=click.Choice(EVAL_METHODS),
    help="Method to evaluate; repeat (default: all). paper and rounds run the pure-DP "
    "PrivAuction; paper-auction-printed and rounds-auction-printed run it as printed in "
    "Algorithm 3 (a larger owners' delta).",
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


# ---------------------------------------------------------------------------------- CAPE
@click.group("cape", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def cape_group() -> None:
    """Joint estimates and models across owners by CAPE (zero-sum noise through secure
    aggregation): means, linear and logistic regressions, a network by gradient descent."""


def _bound(text: str, option: str) -> tuple[str, float, float]:
    """``COLUMN=LOW:HIGH`` -> (column, low, high)."""
    column, eq, rest = text.partition("=")
    low, colon, high = rest.partition(":")
    try:
        if not (column and eq and colon):
            raise ValueError("expected COLUMN=LOW:HIGH")
        return column, float(low), float(high)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint=option) from exc


def _bounds_file(
    path: str, *, target: bool = True
) -> tuple[list[tuple[str, float, float]], tuple[str, float, float] | None]:
    """A TOML file with ``[features]`` (column = [low, high], in order) and, if ``target``,
    ``[target]`` with one column."""
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        features = [(c, float(b[0]), float(b[1])) for c, b in data["features"].items()]
        if not target:
            return features, None
        ((column, bounds),) = data["target"].items()
        return features, (column, float(bounds[0]), float(bounds[1]))
    except (OSError, tomllib.TOMLDecodeError, KeyError, ValueError, TypeError, IndexError) as exc:
        wanted = "[features] with column = [low, high] entries" + (
            " and a [target] with one" if target else ""
        )
        raise click.BadParameter(f"{path}: needs {wanted} ({exc})", param_hint="--bounds") from exc


def _columns(bounds_path: str | None, features: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """The columns of ``--bounds`` (its ``[features]``), then those of each ``--feature``."""
    columns = [] if bounds_path is None else _bounds_file(bounds_path, target=False)[0]
    columns += [_bound(f, "--feature") for f in features]
    if not columns:
        raise click.UsageError("give the columns and their bounds (--bounds or --feature)")
    return columns


def _cape_options(default_out: str, default_delta: float) -> list[Callable[..., Any]]:
    """Options every ``dpmarket cape`` job command takes."""
    return [
        click.option("--curator", required=True, metavar="HOST:PORT", help="The curator."),
        click.option("--curator-name", default="curator", help="The curator's certificate name."),
        click.option(
            "--bounds",
            "bounds_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="TOML file: [features] column = [low, high] (in order) and, for a model, [target] "
            "column = [low, high]. Public bounds, never statistics of the private data.",
        ),
        click.option(
            "--feature",
            "features",
            multiple=True,
            metavar="COLUMN=LOW:HIGH",
            help="A column and its public bounds; repeat (after those of --bounds).",
        ),
        click.option("--epsilon", default=1.0, type=click.FloatRange(min=0, min_open=True)),
        click.option(
            "--delta",
            default=default_delta,
            type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
        ),
        click.option(
            "--colluders",
            default=None,
            type=click.IntRange(min=0),
            help="S_C: owners that may collude with the curator (default ceil(S/3) - 1).",
        ),
        click.option("--seed", default=None, type=click.IntRange(min=0), help="Reproducible runs."),
        click.option("--request-id", default=None, help="Idempotency key (default: random)."),
        click.option(
            "--out",
            "out_path",
            default=default_out,
            type=click.Path(dir_okay=False),
            help="Where to write the estimate or model and its report (JSON).",
        ),
    ]


_CALIBRATION_OPTION = click.option(
    "--calibration",
    type=click.Choice(["exact", "theorem1"]),
    default="exact",
    help="Noise from the exact privacy profile (tight) or Theorem 1's bound.",
)


def _cape_command(
    name: str, options: list[Callable[..., Any]], doc: str
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``dpmarket cape NAME`` with the shared options, then ``options``, then mTLS."""

    def register(func: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            func = option(func)
        for option in reversed(_cape_options(*_CAPE_DEFAULTS[name])):
            func = option(func)
        func = tls_options(func)
        func.__doc__ = doc
        return cape_group.command(name)(func)

    return register


#: Per command: default --out and --delta.
_CAPE_DEFAULTS = {
    "linreg": ("model.json", 1e-6),
    "logreg": ("model.json", 1e-6),
    "mean": ("mean.json", 1e-6),
    "train": ("network.json", 1e-5),
}


def _ask_curator(
    curator: str, curator_name: str, tls: dict[str, Any], call: Callable[[Any], Any]
) -> Any:
    """Call the curator as a consumer; a refusal becomes a ClickException."""
    from consumer.client import CuratorClient

    security = _security("consumer", **tls)
    try:
        with CuratorClient(curator, security, curator=Identity("curator", curator_name)) as c:
            return call(c)
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


def _delta_text(report: dict[str, Any]) -> str:
    theorem1 = report.get("delta_theorem1")
    return f"{report['delta_exact']:.3g} exactly" + (
        f", {theorem1:.3g} by Theorem 1" if theorem1 is not None else ""
    )


def _fit_command(task: str) -> Callable[..., None]:
    def command(
        curator: str,
        curator_name: str,
        bounds_path: str | None,
        features: tuple[str, ...],
        target: str | None,
        epsilon: float,
        delta: float,
        colluders: int | None,
        calibration: str,
        no_intercept: bool,
        seed: int | None,
        request_id: str | None,
        out_path: str,
        **tls: Any,
    ) -> None:
        from common.cape.spec import CapeJobSpec
        from consumer.report import write_json

        feature_bounds, target_bound = (
            ([], None) if bounds_path is None else _bounds_file(bounds_path)
        )
        feature_bounds += [_bound(f, "--feature") for f in features]
        if target is not None:
            target_bound = _bound(target, "--target") if "=" in target else (target, 0.0, 1.0)
        if not feature_bounds or target_bound is None:
            raise click.UsageError(
                "give the features and the target (--bounds or --feature/--target)"
            )
        try:
            spec = CapeJobSpec(
                task=task,  # type: ignore[arg-type]
                features=tuple(feature_bounds),
                target=target_bound,
                epsilon=epsilon,
                delta=delta,
                colluders=colluders,
                calibration=calibration,
                fit_intercept=not no_intercept,
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
        _check_outputs(out_path)
        fit = _ask_curator(
            curator,
            curator_name,
            tls,
            lambda c: c.fit_cape(spec, seed=seed, request_id=request_id),
        )
        model = {
            "task": task,
            "target": spec.target[0],
            "weights": dict(zip(spec.columns, fit.weights.tolist(), strict=True)),
            "intercept": fit.intercept,
            "report": fit.report,
        }
        write_json(model, out_path)
        r = fit.report
        console.print(
            f"{task} regression over {len(r['sites'])} owners ({', '.join(r['sites'])}); every "
            f"owner ({epsilon}, {_delta_text(r)})-DP against the curator and "
            f"{r['colluders']} colluder(s); model -> {out_path}"
        )

    return command


_FIT_OPTIONS = [
    click.option(
        "--target",
        default=None,
        metavar="COLUMN[=LOW:HIGH]",
        help="The target column and its public bounds (logistic: a 0/1 column, no bounds).",
    ),
    _CALIBRATION_OPTION,
    click.option("--no-intercept", is_flag=True, help="Fit without an intercept."),
]
for _task, _name in (("linear", "linreg"), ("logistic", "logreg")):
    _cape_command(
        _name,
        _FIT_OPTIONS,
        f"Fit a {_task} regression across the curator's owners by capeFM (Algorithm 4).",
    )(_fit_command(_task))


@_cape_command(
    "mean",
    [_CALIBRATION_OPTION],
    "The mean of some columns across the curator's owners by CAPE (Algorithm 2).",
)
def cape_mean_command(
    curator: str,
    curator_name: str,
    bounds_path: str | None,
    features: tuple[str, ...],
    epsilon: float,
    delta: float,
    colluders: int | None,
    calibration: str,
    seed: int | None,
    request_id: str | None,
    out_path: str,
    **tls: Any,
) -> None:
    from common.cape.spec import CapeMeanSpec
    from consumer.report import write_json

    columns = _columns(bounds_path, features)
    try:
        spec = CapeMeanSpec(tuple(columns), epsilon, delta, colluders, calibration)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    _check_outputs(out_path)
    estimate = _ask_curator(
        curator,
        curator_name,
        tls,
        lambda c: c.estimate_cape_mean(spec, seed=seed, request_id=request_id),
    )
    write_json({"task": "mean", "mean": estimate.by_column, "report": estimate.report}, out_path)
    r = estimate.report
    console.print(
        f"mean of {len(columns)} column(s) over {len(r['sites'])} owners "
        f"({', '.join(r['sites'])}), noise std {r['aggregator_noise_std']:.3g} per column; "
        f"every owner ({epsilon}, {_delta_text(r)})-DP against the curator and "
        f"{r['colluders']} colluder(s); estimate -> {out_path}"
    )


@_cape_command(
    "train",
    [
        click.option("--target", required=True, metavar="COLUMN", help="The 0/1 label column."),
        click.option("--iterations", default=50, type=click.IntRange(min=1), help="T."),
        click.option("--learning-rate", default=1.0, type=click.FloatRange(min=0, min_open=True)),
        click.option("--hidden-units", default=16, type=click.IntRange(min=1), help="H."),
        click.option(
            "--clip-norm",
            default=1.0,
            type=click.FloatRange(min=0, min_open=True),
            help="C: each example's gradient is clipped to this L2 norm.",
        ),
    ],
    "Train the CAPE paper's 2-layer network across the curator's owners by CAPE gradient "
    "descent (Section 5.1); --epsilon and --delta are each owner's total over all iterations.",
)
def cape_train_command(
    curator: str,
    curator_name: str,
    bounds_path: str | None,
    features: tuple[str, ...],
    epsilon: float,
    delta: float,
    colluders: int | None,
    target: str,
    iterations: int,
    learning_rate: float,
    hidden_units: int,
    clip_norm: float,
    seed: int | None,
    request_id: str | None,
    out_path: str,
    **tls: Any,
) -> None:
    from common.cape.spec import CapeTrainingSpec
    from consumer.report import write_json

    columns = _columns(bounds_path, features)
    try:
        spec = CapeTrainingSpec(
            features=tuple(columns),
            target=target,
            epsilon=epsilon,
            delta=delta,
            iterations=iterations,
            learning_rate=learning_rate,
            hidden=hidden_units,
            clip=clip_norm,
            colluders=colluders,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    _check_outputs(out_path)
    network = _ask_curator(
        curator,
        curator_name,
        tls,
        lambda c: c.train_cape(spec, seed=seed, request_id=request_id),
    )
    write_json(
        {
            "task": "train",
            "features": [{"column": c, "low": lo, "high": hi} for c, lo, hi in spec.features],
            "target": target,
            "hidden_units": hidden_units,
            "network": "sigmoid(w2 . relu(W1 x + b1) + b2), x = 2 (raw - low) / (high - low) - 1",
            "parameters": {
                "W1": network.parameters[: hidden_units * spec.dim]
                .reshape(hidden_units, spec.dim)
                .tolist(),
                "b1": network.parameters[hidden_units * spec.dim : -hidden_units - 1].tolist(),
                "w2": network.parameters[-hidden_units - 1 : -1].tolist(),
                "b2": float(network.parameters[-1]),
            },
            "report": network.report,
        },
        out_path,
    )
    r = network.report
    console.print(
        f"{iterations} iterations over {len(r['sites'])} owners ({', '.join(r['sites'])}); "
        f"every owner ({r['epsilon']:.6g}, {_delta_text(r)})-DP over the whole training against "
        f"the curator and {r['colluders']} colluder(s); network -> {out_path}"
    )


@cape_group.command("demo")
@click.option("--out", "out_dir", default="out/demo-cape", type=click.Path(file_okay=False))
@click.option("--epsilon", default=1.0, type=click.FloatRange(min=0, min_open=True))
@click.option("--delta", default=1e-6, type=click.FloatRange(min=0, max=1, min_open=True))
@click.option("--seed", default=0, type=click.IntRange(min=0))
def cape_demo_command(out_dir: str, epsilon: float, delta: float, seed: int) -> None:
    """The four CAPE jobs across owner processes on diamonds and spam7 (make demo-cape)."""
    from deploy.cape_demo import run_cape_demo

    try:
        run_cape_demo(Path(out_dir), epsilon=epsilon, delta=delta, seed=seed, console=Console())
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


cape_group.add_command(cape_figures, "figures")


main.add_command(health_command)
main.add_command(pki)
main.add_command(owner_group)
main.add_command(cape_group)
main.add_command(sketch_experiments)
main.add_command(sketch_group)
main.add_command(explore_command)
main.add_command(rank_owners_command)

if __name__ == "__main__":
    main()
