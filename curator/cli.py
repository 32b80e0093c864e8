"""The curator's commands: ``curator serve``, the parsimonious curator for a fixed set of owners
with its catalogue of the owners' private sketches, over mTLS; ``curator sessions`` and
``curator charges``, what its durable store holds (read-only)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dpmarket.common.errors import DPMarketError
from dpmarket.runtime.cli import (
    config_option,
    ensure_info_logging,
    json_option,
    print_json,
    security_from_options,
    tls_options,
)
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.metrics import metrics_options, start_metrics
from dpmarket.runtime.transport import BindError

if TYPE_CHECKING:
    from dpmarket.curator.owners import GrpcOwnerEndpoint
    from dpmarket.curator.policy import CuratorPolicy
    from dpmarket.curator.sketches import SketchCatalog

__all__ = ["charges_command", "serve_curator", "sessions_command"]

logger = logging.getLogger("dpmarket")


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


def _warn_about_allocation(catalog: Any, spec: str | None, owners: list[str]) -> None:
    """Say at start-up when candidates sessions will charge every owner through the counts
    allocation: no allocation spec beside RFF specs in the catalogue, or owners that have not
    published under it yet."""
    if spec is None:
        rff = [s.name for s in catalog.specs() if s.kind == "rff"]
        if rff:
            logger.warning(
                "the catalogue holds RFF spec(s) %s but no --allocation-sketch-spec names one: "
                "candidates sessions split their budget by noisy relevance counts, charging "
                "every owner, and read no published sketch",
                ", ".join(rff),
            )
        return
    published = catalog.published(owners, spec=spec)
    missing = [o for o in owners if o not in published]
    if missing:
        logger.warning(
            "no sketch under %s yet from %s: until every owner publishes one (dpmarket owner "
            "publish --spec %s; dpmarket up does it in a deployment dpmarket init wrote), "
            "candidates sessions split their budget by noisy relevance counts, charging every "
            "owner",
            spec,
            ", ".join(missing),
            spec,
        )


def _owner_endpoints(
    targets: list[tuple[Any, str]],
    security: Any,
    owner_timeout: float,
    store: Any,
    policy: CuratorPolicy,
) -> list[GrpcOwnerEndpoint]:
    """The curator's endpoint of each configured owner ``(identity, host:port)``: its calls'
    deadline, its receipts kept in ``store``, and the largest schema it may publish as many
    columns as the policy lets a CAPE job use (at least ``SCHEMA_COLUMNS``)."""
    from dpmarket.curator.owners import SCHEMA_COLUMNS, GrpcOwnerEndpoint

    columns = max(SCHEMA_COLUMNS, int(policy.ranges.get("cape_columns", (0, 0))[1]))
    return [
        GrpcOwnerEndpoint(
            target,
            security,
            expected,
            deadline=owner_timeout,
            receipts=store,
            schema_columns=columns,
        )
        for expected, target in targets
    ]


def _curator_policy(policy_path: str | None, allow_seeded_sessions: bool) -> CuratorPolicy:
    """The curator's policy from ``--policy`` (defaults without), seeded sessions allowed when
    ``--allow-seeded-sessions`` says so (:class:`click.ClickException` if it cannot be read)."""
    from dpmarket.curator.policy import CuratorPolicy, load_curator_policy

    try:
        policy = load_curator_policy(policy_path) if policy_path else CuratorPolicy()
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if allow_seeded_sessions:
        policy = policy.with_overrides(allow_seeded_sessions=True)
    return policy


def _open_catalog(
    state: Path,
    sketch_specs: tuple[str, ...],
    policy: CuratorPolicy,
    owner_names: list[str],
    sketch_seed: int | None,
    allocation_sketch_spec: str | None,
) -> SketchCatalog:
    """The curator's sketch catalogue from ``--sketch-spec`` files, its allocation spec (when
    given) checked to be one of its RFF specs.

    Raises
    ------
    click.ClickException
        If a spec cannot be read, or the allocation spec is not an RFF spec of the catalogue
        (the catalogue is closed).
    """
    from dpmarket.curator.sketches import SketchCatalog

    try:
        catalog = SketchCatalog.from_files(
            state, sketch_specs, policy=policy, owners=owner_names, seed=sketch_seed
        )
    except (OSError, ValueError, RuntimeError) as exc:
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
            raise click.ClickException(f"--allocation-sketch-spec: {exc}") from exc
        if kind != "rff":
            catalog.close()
            raise click.ClickException(
                f"--allocation-sketch-spec: {allocation_sketch_spec!r} is a {kind} spec; the "
                "allocation reads RFF sketches"
            )
    return catalog


@click.command("serve-curator")
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
@metrics_options
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
    metrics_port: int | None,
    metrics_host: str,
    **tls: Any,
) -> None:
    """Serve the parsimonious curator for a fixed set of owners (mTLS), with its catalogue of
    the owners' private sketches."""
    from dpmarket.curator.owners import check_owners
    from dpmarket.curator.service import serve_curator as serve
    from dpmarket.curator.store import CuratorStore

    ensure_info_logging()
    security = security_from_options("curator", **tls)
    start_metrics(metrics_host, metrics_port, logger)
    targets = [_owner_target(text, security.insecure) for text in owners]
    policy = _curator_policy(policy_path, allow_seeded_sessions)
    name = security.identity.name if security.identity is not None else "insecure"
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"curator-{name}"
    try:
        store = CuratorStore(state)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    owner_names = [identity.name for identity, _ in targets if identity is not None]
    try:
        catalog = _open_catalog(
            state, sketch_specs, policy, owner_names, sketch_seed, allocation_sketch_spec
        )
    except click.ClickException:
        store.close()
        raise
    allocation_columns = (
        None
        if allocation_sketch_spec is None
        else list(catalog.spec(allocation_sketch_spec).domain.names)
    )
    _warn_about_allocation(catalog, allocation_sketch_spec, owner_names)

    async def run() -> None:
        endpoints = _owner_endpoints(targets, security, owner_timeout, store, policy)
        try:
            await check_owners(
                endpoints,
                allocation_columns=allocation_columns,
                allocation_spec=allocation_sketch_spec or "",
            )
        except DPMarketError:
            await asyncio.gather(*(e.close() for e in endpoints))
            raise
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
    except (BindError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        catalog.close()
        store.close()


# -------------------------------------------------------------------------- the store
_DATA_DIR = click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False),
    help="The curator's data directory (curator serve --data-dir; holds curator.sqlite3).",
)


def _records(data_dir: str) -> Any:
    import sqlite3

    from dpmarket.curator.store import CuratorRecords

    try:
        return CuratorRecords(data_dir)
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc


def _eps(book: dict[str, float], party: str, kind: str = "summarization") -> str:
    """A session's ε (or δ) on ``party``'s data: ``-`` when not known, ``n/a`` for D_v of a
    CAPE job (it touches no validation set)."""
    if party == "validation" and kind == "cape":
        return "n/a"
    return f"{book[party]:.3g}" if party in book else "-"


@click.command("sessions", context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@_DATA_DIR
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Only the last N sessions and jobs."
)
@click.option(
    "--wide",
    is_flag=True,
    help="Every column: whole ids and times, kind, δ, charges, who was left out, whether the "
    "result is kept (default: a table for 80 columns).",
)
@json_option
def sessions_command(data_dir: str, limit: int | None, wide: bool, as_json: bool) -> None:
    """List the summarization sessions and CAPE jobs: who asked, what, how it ended, and what
    it charged (basic composition of its charges, on the owners' data and on D_v)."""
    from rich.console import Console

    with _records(data_dir) as records:
        rows = records.sessions(limit=limit)
    if as_json:
        print_json({"data_dir": data_dir, "sessions": rows})
        return
    table = _wide_sessions(rows) if wide else _compact_sessions(rows)
    out = Console()
    out.print(f"curator store {data_dir}", markup=False, highlight=False)
    if rows:
        out.print(table)
    else:
        out.print(f"no session in {data_dir}", markup=False, highlight=False)
    failed = [r for r in rows if r["status"] == "failed"]
    for r in failed:
        out.print(f"{r['id'][:8]} failed: {r['error']}", markup=False, highlight=False)


def _compact_sessions(rows: list[dict[str, Any]]) -> Any:
    """The sessions for 80 columns: short ids, times to the minute, ε by party."""
    from rich import box
    from rich.table import Table

    table = Table(
        title="sessions and jobs",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        caption="created: UTC; ε: basic composition (owners: the most any owner's ledger "
        "recorded); points: owner points read; -: not known (an owner's record is missing); "
        "n/a: does not apply (a CAPE job uses no D_v); --wide: every column",
        caption_justify="left",
    )
    table.add_column("id", no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("consumer", overflow="fold")
    for header in ("method", "status"):
        table.add_column(header, no_wrap=True)
    for header in ("ε owners", "ε D_v", "points"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        points = r["owner_points_accessed"]
        table.add_row(
            r["id"][:8],
            (r["created"] or "")[5:16].replace("T", " "),
            r["consumer"].removeprefix("consumer:"),
            r["method"],
            r["status"],
            _eps(r["epsilon"], "owners"),
            _eps(r["epsilon"], "validation", r["kind"]),
            "-" if points is None else str(points),
        )
    return table


def _wide_sessions(rows: list[dict[str, Any]]) -> Any:
    """Every column of ``curator sessions --json``'s rows but the error (printed below)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="sessions and jobs", title_justify="left")
    for header in ("id", "kind", "created (UTC)", "finished (UTC)", "consumer", "method", "status"):
        table.add_column(header, overflow="fold")
    for header in ("charges", "ε owners", "ε D_v", "δ owners", "δ D_v", "points"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("left out", overflow="fold")
    table.add_column("result kept", no_wrap=True)
    for r in rows:
        points = r["owner_points_accessed"]
        table.add_row(
            Text(r["id"]),
            r["kind"],
            r["created"] or "",
            r["finished"] or "",
            Text(r["consumer"]),
            r["method"],
            r["status"],
            str(r["charges"]),
            _eps(r["epsilon"], "owners"),
            _eps(r["epsilon"], "validation", r["kind"]),
            _eps(r["delta"], "owners"),
            _eps(r["delta"], "validation", r["kind"]),
            "-" if points is None else str(points),
            Text(", ".join(f"{o} ({why})" for o, why in r["left_out"].items())),
            "yes" if r["result_kept"] else "no",
        )
    return table


@click.command("charges", context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@_DATA_DIR
@click.option(
    "--session",
    default=None,
    metavar="ID",
    help="Only this session's or job's charges (its id, or the first characters of it).",
)
@json_option
def charges_command(data_dir: str, session: str | None, as_json: bool) -> None:
    """List every charge the curator wrote before the release it paid for: session, party
    (owners' data or D_v), mechanism, epsilon and delta of one run, runs."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    with _records(data_dir) as records:
        rows = records.charges(session=session)
    if as_json:
        print_json({"data_dir": data_dir, "session": session, "charges": rows})
        return
    table = Table(
        title="charges",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("session", no_wrap=True)
    table.add_column("party", no_wrap=True)
    table.add_column("release", overflow="fold")
    for header in ("ε", "δ", "runs"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(
            r["session"][:8],
            r["party"],
            r["label"],
            f"{r['epsilon']:.3g}",
            f"{r['delta']:.2g}",
            str(r["count"]),
        )
    out = Console()
    out.print(f"curator store {data_dir}", markup=False, highlight=False)
    if rows:
        out.print(table)
    else:
        where = f" of session {session!r}" if session else ""
        out.print(f"no charge{where} in {data_dir}", markup=False, highlight=False)
