"""``dpmarket owner``: tools a data owner runs on its own machine.

``owner ledger`` prints what the owner's ledger (:mod:`owner.ledger`) has charged and what is
left of each budget, under the policy last recorded in the ledger, so it needs no policy file
and can run while the owner service is serving (SQLite's WAL lets it read beside the writer).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from owner.ledger import LEDGER_FILE, LedgerEntry, OwnerLedger, Totals, ledger_path
from owner.policy import OwnerPolicy

__all__ = ["ledger_report", "owner"]


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
