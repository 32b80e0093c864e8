"""A data owner's commands, all run on the owner's own machine: ``serve-owner``, ``owner ledger``,
``sketch publish`` and ``sketch published``.

``serve-owner`` serves the owner's data over mTLS under its own policy and ledger. ``sketch
publish`` fetches specs from the curator's catalogue, computes and charges each sketch to the
owner's own ledger (stored beside it), then sends it (:func:`owner.sketches.publish_to`);
``sketch published`` lists, offline, what the owner's data directory has released.
``owner ledger`` prints what the owner's ledger (:mod:`owner.ledger`) has charged and what is
left of each budget, under the policy last recorded in the ledger, so it needs no policy file
and can run while the owner service is serving (SQLite's WAL lets it read beside the writer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from common.errors import DPMarketError
from owner.ledger import LEDGER_FILE, LedgerEntry, OwnerLedger, Totals, ledger_path
from owner.policy import OwnerPolicy
from runtime.cli import (
    check_outputs,
    console,
    curator_identity,
    curator_options,
    ensure_info_logging,
    security_from_options,
    tls_options,
    write_output,
)
from runtime.transport import BindError

__all__ = [
    "ledger_report",
    "owner",
    "publish_command",
    "published_command",
    "serve_owner",
]

logger = logging.getLogger("dpmarket")


def _iso(at: float) -> str:
    """Unix time as ISO 8601 in UTC, to the second: ``2024-05-01T12:00:00Z``."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _entry(e: LedgerEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": e.at,
        "time": _iso(e.at),
        "session": e.session,
        "consumer": e.consumer,
        "curator": e.curator,
        "mechanism": e.mechanism,
        "epsilon": None if e.non_private else e.epsilon,
        "delta": e.delta,
        "points": e.points,
        "non_private": e.non_private,
    }


def _budget(spent: Totals, limits: tuple[float, float, int]) -> dict[str, Any]:
    epsilon, delta, points = limits
    return {
        "epsilon": {
            "spent": spent.epsilon,
            "limit": epsilon,
            "left": max(epsilon - spent.epsilon, 0.0),
        },
        "delta": {"spent": spent.delta, "limit": delta, "left": max(delta - spent.delta, 0.0)},
        "points": {"spent": spent.points, "limit": points, "left": max(points - spent.points, 0)},
        "non_private": spent.non_private,
    }


def ledger_report(
    ledger: OwnerLedger, *, session: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """What ``dpmarket owner ledger --json`` prints.

    Parameters
    ----------
    ledger : OwnerLedger
    session : str, optional
        Only this session's charges, and its totals against the per-session limits.
    limit : int, optional
        Only the last ``limit`` charges (the totals always cover every charge).

    Returns
    -------
    dict
        ``{"ledger": path, "policy": {field: value}, "window": "the lifetime" or "the last N
        days", "entries": [{"id", "at" (Unix seconds), "time" (ISO 8601 UTC), "session",
        "consumer", "curator", "mechanism", "epsilon" (None for a non-private release),
        "delta", "points", "non_private"}, ...] oldest first, "budget": {"epsilon", "delta",
        "points": {"spent", "limit", "left"}, "non_private": bool} over the window,
        "session": the same against the per-session limits, with "id", or None}``. Strictly
        JSON: no NaN or infinity.
    """
    policy: OwnerPolicy = ledger.policy
    report: dict[str, Any] = {
        "ledger": str(ledger.path),
        "policy": policy.as_dict(),
        "window": policy.window_description,
        "entries": [_entry(e) for e in ledger.entries(session=session, limit=limit)],
        "budget": _budget(
            ledger.window_totals(),
            (policy.epsilon_total, policy.delta_total, policy.points_total),
        ),
        "session": None,
    }
    if session is not None:
        report["session"] = {
            "id": session,
            **_budget(
                ledger.session_totals(session),
                (policy.epsilon_per_session, policy.delta_per_session, policy.points_per_session),
            ),
        }
    return report


def _num(x: float) -> str:
    return f"{x:.6g}"


def _charges_table(report: dict[str, Any]) -> Table:
    non_private = any(e["non_private"] for e in report["entries"])
    table = Table(
        title=f"charges in {report['ledger']}",
        title_justify="left",
        caption="inf: a non-private release (not summed into epsilon or delta)"
        if non_private
        else None,
        caption_justify="left",
    )
    # Fixed-width columns never wrap; names fold rather than lose characters to an ellipsis.
    table.add_column("time (UTC)", no_wrap=True)
    for header in ("session", "consumer", "curator", "mechanism"):
        table.add_column(header, overflow="fold")
    for header in ("epsilon", "delta", "points"):
        table.add_column(header, justify="right", no_wrap=True)
    for e in report["entries"]:
        table.add_row(
            e["time"],
            Text(e["session"]),
            Text(e["consumer"]),
            Text(e["curator"]),
            Text(e["mechanism"]),
            "inf" if e["non_private"] else _num(e["epsilon"]),
            _num(e["delta"]),
            str(e["points"]),
        )
    return table


def _budget_table(report: dict[str, Any]) -> Table:
    table = Table(
        title=f"budgets under the recorded policy (window: {report['window']})",
        title_justify="left",
    )
    for header in ("budget", "", "spent", "limit", "left"):
        table.add_column(header, justify="left" if header in ("budget", "") else "right")
    scopes = [(f"over {report['window']}", report["budget"])]
    if report["session"] is not None:
        scopes.append((f"session {report['session']['id']}", report["session"]))
    for scope, budget in scopes:
        for quantity in ("epsilon", "delta", "points"):
            row = budget[quantity]
            table.add_row(
                Text(scope),
                quantity,
                _num(row["spent"]),
                _num(row["limit"]),
                _num(row["left"]),
            )
        if budget["non_private"]:
            table.add_row(Text(scope), "non-private releases", "yes", "", "")
    return table


@click.group("owner", context_settings={"help_option_names": ["-h", "--help"]})
def owner() -> None:
    """Tools for a data owner: inspect its own privacy ledger."""


@owner.command("ledger")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"The owner's data directory (holds {LEDGER_FILE}).",
)
@click.option(
    "--session",
    default=None,
    help="Only this session's charges, and its totals against the per-session limits.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Only the last N charges (the totals always cover every charge).",
)
def ledger(data_dir: Path, session: str | None, as_json: bool, limit: int | None) -> None:
    """Show what the owner's data has been charged, and what is left of each budget.

    Uses the policy last recorded in the ledger (no policy file needed). Non-private releases
    are listed with epsilon inf and are not summed into epsilon or delta.
    """
    if not ledger_path(data_dir).is_file():
        raise click.ClickException(
            f"{data_dir} holds no owner ledger ({LEDGER_FILE} not found): is it the data "
            "directory of an owner that has served a session?"
        )
    try:
        with OwnerLedger(data_dir, None) as book:
            report = ledger_report(book, session=session, limit=limit)
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(report, indent=2, allow_nan=False))
        return
    out = Console()
    if report["entries"]:
        out.print(_charges_table(report))
    else:
        where = f" in session {session!r}" if session is not None else ""
        out.print(f"no charges{where} in {report['ledger']}", markup=False, highlight=False)
    out.print(_budget_table(report))


# -------------------------------------------------------------------------- service
@click.command("serve-owner")
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
    "--binary-column",
    "binary_columns",
    multiple=True,
    metavar="COLUMN",
    help="A column of --table declared to hold only 0 and 1 (checked now; repeat): the only "
    "columns a CAPE logistic regression or training may take as its target. A public "
    "declaration: requests are refused on it, never on the values.",
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
    binary_columns: tuple[str, ...],
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
    from owner.data import load_point_set, load_table
    from owner.policy import load_owner_policy
    from owner.protocol import Owner
    from owner.service import serve_owner as serve

    ensure_info_logging()
    if data_path is None and table_path is None:
        raise click.UsageError("give --data (points to summarize), --table (for CAPE), or both")
    if binary_columns and table_path is None:
        raise click.UsageError("--binary-column declares columns of --table: give --table")
    security = security_from_options("owner", **tls)
    name = security.identity.name if security.identity is not None else None
    if name is not None and owner_id is not None and owner_id != name:
        raise click.BadParameter(
            f"the certificate names this owner {name!r}, not {owner_id!r}", param_hint="--owner-id"
        )
    try:
        data = (
            load_point_set(data_path, label_column=label_column) if data_path is not None else None
        )
        table = load_table(table_path, binary=binary_columns) if table_path is not None else None
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
    if table is not None and table.binary:
        rows += f" (declared 0/1: {', '.join(table.binary)})"
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
    except BindError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        ledger.close()


# ------------------------------------------------------------------------- sketches
@click.command("publish")
@curator_options
@click.option(
    "--table",
    "table_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The owner's table (.csv or .parquet with named columns); the spec's columns are "
    "selected by name.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The owner's data directory (its ledger; published sketches are stored there too). "
    "Default: dpmarket-state/owner-<name>, as serve-owner.",
)
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The owner's policy (TOML; [sketches] decides whether and up to which epsilon it "
    "publishes). Default: the built-in defaults.",
)
@click.option(
    "--spec",
    "specs",
    multiple=True,
    metavar="NAME",
    help="A spec of the catalogue (e.g. flights/rff); repeat. Default: every spec.",
)
@click.option(
    "--epsilon",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Epsilon of each new sketch (default: the spec's), within the spec's range and the "
    "policy's sketches.epsilon.",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(min=0),
    help="Seed the sketches' noise (reproducible runs only: whoever knows the seed knows the "
    "noise). Default: OpenDP's samplers.",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@tls_options
def publish_command(
    curator: str,
    curator_name: str,
    table_path: str,
    data_dir: str | None,
    policy_path: str | None,
    specs: tuple[str, ...],
    epsilon: float | None,
    seed: int | None,
    out_path: str | None,
    **tls: Any,
) -> None:
    """Publish this owner's private sketches to a curator's catalogue: charge first, then send.

    Each sketch is checked against the owner's policy and charged to its own ledger together
    with the sketch itself, before anything is sent; a spec released before is sent again as
    stored, charging nothing.
    """
    from common.privacy.noise import OpenDPNoise, SeededNoise
    from owner.data import load_table
    from owner.policy import load_owner_policy
    from owner.sketch_client import CatalogClient
    from owner.sketches import SketchPublisher, publish_to

    security = security_from_options("owner", **tls)
    if security.identity is None:
        raise click.UsageError(
            "publishing needs the owner's certificate: the catalogue names the publisher by it"
        )
    name = security.identity.name
    try:
        policy = load_owner_policy(policy_path) if policy_path else OwnerPolicy()
        table = load_table(table_path, name=name)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if out_path is not None:
        check_outputs(out_path)
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"owner-{name}"
    noise = OpenDPNoise() if seed is None else SeededNoise(np.random.default_rng(seed))
    if seed is not None:
        logger.warning("--seed: the sketches' noise is reproducible by whoever knows the seed")
    try:
        ledger = OwnerLedger(state, policy)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    try:
        with CatalogClient(curator, security, curator=curator_identity(curator_name)) as client:
            names = list(specs) or client.spec_names()
            publisher = SketchPublisher(ledger, noise=noise)
            deliveries = publish_to(client, publisher, table, names, epsilon=epsilon)
        left = ledger.remaining()
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        ledger.close()
    table_out = Table(title=f"{name}: sketches in the catalogue of {curator_name}")
    for column in ("spec", "epsilon", "delta", "charged now", "noisy count", "catalogue"):
        table_out.add_column(column, justify="left" if column == "spec" else "right")
    rows = []
    for d in deliveries:
        mech = d.publication.sketch.mechanism
        rows.append(
            {
                "spec": d.spec,
                "key": d.publication.key,
                "epsilon": mech.epsilon,
                "delta": mech.delta,
                "charged_now": d.publication.charged_now,
                "noisy_count": d.publication.sketch.noisy_count,
                "already_in_catalogue": d.already_in_catalogue,
                "ledger_entry": d.publication.charge.id,
            }
        )
        table_out.add_row(
            d.spec,
            f"{mech.epsilon:g}",
            f"{mech.delta:g}",
            "yes" if d.publication.charged_now else "no (stored)",
            f"{d.publication.sketch.noisy_count:.1f}",
            "held already" if d.already_in_catalogue else "published",
        )
    Console().print(table_out)
    console.print(
        f"ledger {ledger.path}: left over {left.window}: epsilon {left.epsilon:.6g}, "
        f"delta {left.delta:.3g}"
    )
    write_output(
        {
            "owner": name,
            "curator": f"{curator_name}@{curator}",
            "sketches": rows,
            "left": {"epsilon": left.epsilon, "delta": left.delta, "window": left.window},
        },
        out_path,
    )


@click.command("published")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="The owner's data directory.",
)
def published_command(data_dir: str) -> None:
    """List the sketches this owner's data directory has released (offline, read-only)."""
    from owner.sketches import SketchPublisher

    try:
        with OwnerLedger(data_dir, None) as ledger:
            rows = SketchPublisher(ledger).published()
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    table = Table(title=f"sketches released from {data_dir}")
    for column in ("spec", "key", "epsilon", "delivered to"):
        table.add_column(column)
    for spec, key, epsilon, curators in rows:
        table.add_row(spec, key[:16], f"{epsilon:g}", ", ".join(curators) or "nobody yet")
    Console().print(table)
