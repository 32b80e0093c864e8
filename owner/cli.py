"""A data owner's commands (``dpmarket owner ...``), all run on the owner's own machine: ``serve``,
``ledger`` (and its ``init``, ``backup``, ``restore``, ``verify``, ``resolve``, ``rebind``),
``publish`` and ``published``.

``owner serve`` serves the owner's data over mTLS under its own policy and ledger. ``owner
publish`` fetches specs from the curator's catalogue, computes and charges each sketch to the
owner's own ledger (stored beside it), then sends it (:func:`dpmarket.owner.sketches.publish_to`);
``owner published`` lists, offline, what the owner's data directory has released. ``owner ledger``
prints what the owner's ledger (:mod:`dpmarket.owner.ledger`) has charged and what is left of each
budget, under the policy last recorded in the ledger, so it needs no policy file and can run while
the owner service is serving (SQLite's WAL lets it read beside the writer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dpmarket.common.errors import DPMarketError
from dpmarket.common.market.money import EPSILON_UNITS, credits_text
from dpmarket.common.schema import Schema
from dpmarket.owner.earnings import Earning
from dpmarket.owner.engine import Engine
from dpmarket.owner.ledger import (
    LEDGER_FILE,
    LedgerMissingError,
    OwnerLedger,
    ledger_path,
)
from dpmarket.owner.ledger_chain import LedgerOwner
from dpmarket.owner.limits import DEFAULT_IN_MEMORY_VALUES, WorkLimits
from dpmarket.owner.policy import POLICY_FILE, OwnerPolicy, data_dir_policy
from dpmarket.owner.statement import iso_time, ledger_statement
from dpmarket.runtime.cli import (
    check_outputs,
    config_option,
    console,
    curator_identity,
    curator_options,
    ensure_info_logging,
    json_option,
    print_json,
    print_table,
    security_from_options,
    tls_options,
    write_output,
)
from dpmarket.runtime.metrics import metrics_options, start_metrics
from dpmarket.runtime.schemas import load_schema
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.transport import BindError, TransportSecurity

if TYPE_CHECKING:  # dpmarket.owner.data reads partitioned tables: scipy, not for `owner ledger`
    from dpmarket.owner.cape import CapeSite
    from dpmarket.owner.data import OwnerData
    from dpmarket.owner.protocol import Owner

__all__ = [
    "ledger",
    "ledger_report",
    "publish_command",
    "published_command",
    "serve_owner",
    "short_mechanism",
    "short_session",
]

logger = logging.getLogger("dpmarket")

DATA_DIR_HELP = (
    f"The owner's data directory: its ledger ({LEDGER_FILE}, what its data has been charged) "
    f"and its policy ({POLICY_FILE}). Required: an owner started elsewhere would begin a new "
    "ledger with its whole budget."
)
POLICY_HELP = (
    "A policy file (TOML: {what}; see deploy/policies/owner.toml) to install as "
    "DATA_DIR/policy.toml, the owner's policy that every owner command reads; when DATA_DIR "
    "holds one already the two must agree. Default: DATA_DIR/policy.toml, or the built-in "
    "defaults when there is none."
)


def ledger_report(
    ledger: OwnerLedger, *, session: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """What ``dpmarket owner ledger --json`` prints: the ledger's statement
    (:func:`dpmarket.owner.statement.ledger_statement`) as JSON.

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
    return ledger_statement(ledger, session=session, limit=limit).to_json()


def _num(x: float) -> str:
    return f"{x:.6g}"


#: Words a compact ledger table shortens, in order (``--wide`` shows them whole).
_ABBREVIATIONS = (
    ("private sketch", "sketch"),
    ("relevance count", "count"),
    ("raw points", "points"),
    ("candidates", "cand."),
    ("Laplace", "Lap."),
    ("Gaussian", "Gauss."),
    ("secure aggregation", "SecAgg"),
    ("regression", "reg."),
    ("; ", ": "),
)


def short_mechanism(text: str) -> str:
    """A mechanism as a compact table shows it: ``"private sketch (HIST, Laplace)"`` ->
    ``"sketch (HIST, Lap.)"``, ``"raw points (candidates)"`` -> ``"points (cand.)"``."""
    for long, short in _ABBREVIATIONS:
        text = text.replace(long, short)
    return text


def short_session(session: str) -> str:
    """A session id as a compact table shows it: the first 8 characters of a random id, the
    spec of a sketch's session (``sketch:clinics/hist:<key>`` -> ``clinics/hist``)."""
    parts = session.split(":")
    if len(parts) >= 2 and parts[0] == "sketch":
        return parts[1]
    return session[:8]


def _charges_table(report: dict[str, Any], *, wide: bool = False) -> Table:
    """The charges: every column in full with ``wide``; else fitting 80 columns (time to the
    minute, short ids, abbreviated mechanisms, no curator column)."""
    non_private = any(e["non_private"] for e in report["entries"])
    caption = (
        "inf: a non-private release (not summed into epsilon or delta)" if non_private else None
    )
    if not wide:
        caption = "; ".join(
            c for c in (caption, "--wide: every column, whole ids and mechanisms") if c
        )
    table = Table(
        title=f"charges in {report['ledger']}",
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    if not wide:
        table.box, table.pad_edge, table.collapse_padding = box.SIMPLE_HEAD, False, True
    if wide:
        # Fixed-width columns never wrap; names fold rather than lose characters to an ellipsis.
        table.add_column("time (UTC)", no_wrap=True)
        for header in ("session", "consumer", "curator", "mechanism"):
            table.add_column(header, overflow="fold")
        for header in ("epsilon", "delta", "points"):
            table.add_column(header, justify="right", no_wrap=True)
    else:
        table.add_column("UTC", no_wrap=True)
        table.add_column("session", no_wrap=True)
        table.add_column("consumer", overflow="fold")
        table.add_column("mechanism", overflow="fold")
        for header in ("ε", "δ", "pts"):
            table.add_column(header, justify="right", no_wrap=True)
    for e in report["entries"]:
        epsilon = "inf" if e["non_private"] else _num(e["epsilon"])
        if wide:
            table.add_row(
                e["time"],
                Text(e["session"]),
                Text(e["consumer"]),
                Text(e["curator"]),
                Text(e["mechanism"]),
                epsilon,
                _num(e["delta"]),
                str(e["points"]),
            )
        else:
            table.add_row(
                e["time"][5:16].replace("T", " "),
                Text(short_session(e["session"])),
                Text(e["consumer"].split(":", 1)[-1] if e["consumer"].startswith("consumer:")
                     else e["consumer"].split(":", 1)[0]),
                Text(short_mechanism(e["mechanism"])),
                epsilon,
                f"{e['delta']:.2g}",
                str(e["points"]),
            )  # fmt: skip
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


_LEDGER_DIR = click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"The owner's data directory (holds {LEDGER_FILE}).",
)


@click.group(
    "ledger", invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@config_option
@click.option(
    "--data-dir",
    default=None,
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
@click.option(
    "--wide",
    is_flag=True,
    help="Every column, whole ids and mechanisms (default: a table for 80 columns).",
)
@click.pass_context
def ledger(
    ctx: click.Context,
    data_dir: Path | None,
    session: str | None,
    as_json: bool,
    limit: int | None,
    wide: bool,
) -> None:
    """Show what the owner's data has been charged, and what is left of each budget.

    Uses the policy last recorded in the ledger (no policy file needed). Non-private releases
    are listed with epsilon inf and are not summed into epsilon or delta. The subcommands
    create the ledger (init), copy it while the owner serves (backup), put a copy back
    (restore), check it whole (verify), clear a rollback the owner found (resolve), bind it
    to a new CA (rebind) and upgrade one of an earlier release (upgrade): see
    docs/howto-ledger.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    if data_dir is None:
        raise click.UsageError("give --data-dir DIR (or a subcommand: init, backup, ...)")
    try:
        with OwnerLedger(data_dir, None) as book:
            report = ledger_report(book, session=session, limit=limit)
            note = _policy_note(data_dir, book.policy)
    except LedgerMissingError as exc:
        raise click.ClickException(f"{data_dir} holds no owner ledger: {exc}") from exc
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(report, indent=2, allow_nan=False))
        if note:
            console.print(note)
        return
    out = Console()
    if report["entries"]:
        print_table(_charges_table(report, wide=wide), wide=wide)
    else:
        where = f" in session {session!r}" if session is not None else ""
        out.print(f"no charges{where} in {report['ledger']}", markup=False, highlight=False)
    out.print(_budget_table(report))
    if note:
        console.print(note)


@ledger.command("init")
@_LEDGER_DIR
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help=POLICY_HELP.format(what="budgets, point limits, curators served"),
)
@click.option(
    "--owner-id",
    default=None,
    help="With --insecure only: the owner's name (with certificates, the certificate's).",
)
@tls_options
def ledger_init(data_dir: Path, policy_path: str | None, owner_id: str | None, **tls: Any) -> None:
    """Create the owner's ledger, empty, bound to this owner's certificate.

    The only way a ledger is created: owner serve, owner publish and every other owner command
    refuse a data directory without one (or with an empty or foreign one), since a new ledger
    starts the owner's budget again in full. Refused if DATA_DIR holds a ledger already.
    """
    security = security_from_options("owner", **tls)
    if security.identity is not None:
        name = security.identity.name
        if owner_id is not None and owner_id != name:
            raise click.BadParameter(
                f"the certificate names this owner {name!r}, not {owner_id!r}",
                param_hint="--owner-id",
            )
    elif owner_id is None:
        raise click.UsageError("with --insecure, name the owner: --owner-id NAME")
    else:
        name = owner_id
    from dpmarket.owner.ledger_admin import init_ledger

    found_before = sorted(p.name for p in data_dir.iterdir()) if data_dir.is_dir() else []
    try:
        identity = init_ledger(data_dir, name, security, policy=policy_path)
        with OwnerLedger(data_dir, None) as book:
            policy = book.policy
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(
        f"ledger {identity.ledger_id} created in {ledger_path(data_dir)} for owner "
        f"{identity.owner}"
        + ("" if identity.ca is None else f" (deployment CA {identity.ca[:16]})")
        + f"; back it up with: dpmarket owner ledger backup --data-dir {data_dir} --out FILE",
        markup=False,
        highlight=False,
    )
    console.print(
        f"It starts with owner {identity.owner}'s whole budget: epsilon {policy.epsilon_total:g}, "
        f"delta {policy.delta_total:g}, {policy.points_total} points over "
        f"{policy.window_description}, nothing spent. If this owner has served before, this "
        "resets what its earlier ledger charged: stop here and restore that ledger's latest "
        f"backup instead (dpmarket owner ledger restore --data-dir {data_dir} --from BACKUP "
        "--replace-other-ledger). A curator holding a receipt of the earlier ledger makes this "
        "owner refuse to serve until you restore it or accept the loss on record (dpmarket "
        "owner ledger resolve --accept-replaced-ledger).",
        markup=False,
        highlight=False,
    )
    if found_before:
        console.print(
            f"warning: {data_dir} already held {', '.join(found_before)}: this owner may have "
            "served before (an earlier ledger moved aside, a policy, published sketches)",
            markup=False,
            highlight=False,
        )


@ledger.command("backup")
@config_option
@_LEDGER_DIR
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The backup file (must not exist): one self-contained SQLite file.",
)
def ledger_backup(data_dir: Path, out_path: Path) -> None:
    """Copy the ledger consistently, while the owner may be serving.

    SQLite's online backup API: every committed charge, those still only in the -wal file
    included (a copy of owner.sqlite3 alone loses them). The copy is verified.
    """
    from dpmarket.owner.ledger_admin import backup_ledger

    try:
        found = backup_ledger(data_dir, out_path)
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(
        f"{out_path}: {found.charges} charges up to charge {found.sequence} (chain head "
        f"{found.head.hex()[:16]}), verified",
        markup=False,
        highlight=False,
    )


def _owner_from_options(tls: dict[str, Any]) -> LedgerOwner | None:
    """The owner the TLS options (--config, --pki-dir/--name, --ca/--cert/--key) name, or None
    when they name none (a ledger command run without them)."""
    if not (tls["insecure"] or tls["pki_dir"] or tls["cert_path"]):
        return None
    security = security_from_options("owner", **tls)
    if security.identity is None:
        return None
    return LedgerOwner.from_security(security.identity.name, security)


@ledger.command("restore")
@_LEDGER_DIR
@click.option(
    "--from",
    "backup_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The backup to restore (from dpmarket owner ledger backup).",
)
@click.option(
    "--replace-other-ledger",
    is_flag=True,
    help="Restore even though DATA_DIR holds another ledger (another ledger id) than the backup's.",
)
@tls_options
def ledger_restore(
    data_dir: Path, backup_path: Path, replace_other_ledger: bool, **tls: Any
) -> None:
    """Put a backup in place of the ledger. Stop the owner first.

    The backup is verified first; the files it replaces (owner.sqlite3 and its -wal and -shm)
    are moved aside, never deleted. Charges made after the backup was taken are not in it: a
    curator's receipt of them makes the owner refuse to serve until resolved (see resolve).
    With the owner's certificate (--config, or --pki-dir/--name), a backup of another owner is
    refused even into an empty data directory.
    """
    from dpmarket.owner.ledger_admin import replaced_ledger, restore_ledger

    try:
        before = replaced_ledger(data_dir)
        found, moved = restore_ledger(
            data_dir,
            backup_path,
            replace_other=replace_other_ledger,
            owner=_owner_from_options(tls),
        )
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    for path in moved:
        console.print(f"moved aside: {path}", markup=False, highlight=False)
    if (
        before is not None
        and before.identity is not None
        and found.identity is not None
        and before.identity.ledger_id != found.identity.ledger_id
    ):
        console.print(
            f"replaced ledger {before.identity.ledger_id} ({before.charges} charges, lifetime "
            f"epsilon {float(before.totals[0]):.6g}, {before.totals[2]} points): recorded in "
            "the restored ledger as replaced on your request, as one entry charging what it "
            f"spent (its budget stays spent), and its receipts up to its charge {before.sequence} "
            "no longer stop the owner (a receipt of a later charge of it still does: resolve "
            "then charges what it shows beyond what this entry counted)",
            markup=False,
            highlight=False,
        )
    console.print(
        f"{ledger_path(data_dir)} restored from {backup_path}: {found.charges} charges up to "
        f"charge {found.sequence}",
        markup=False,
        highlight=False,
    )


@ledger.command("verify")
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"The owner's data directory (its {LEDGER_FILE} is verified).",
)
@click.option(
    "--file",
    "file_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A ledger file to verify instead, e.g. a backup.",
)
@json_option
@tls_options
def ledger_verify(data_dir: Path | None, file_path: Path | None, as_json: bool, **tls: Any) -> None:
    """Check a ledger whole: file, schema, identity, hash chain and running totals.

    With the owner's certificate (--pki-dir/--name, --config), also that the ledger is this
    owner's. Exits with 1 when anything is wrong, or the ledger was found behind a receipt and
    not resolved.
    """
    from dpmarket.owner.ledger_admin import verify_file

    if (data_dir is None) == (file_path is None):
        raise click.UsageError("give --data-dir DIR or --file FILE")
    path = file_path if file_path is not None else ledger_path(data_dir)  # type: ignore[arg-type]
    try:
        found = verify_file(path, owner=_owner_from_options(tls))
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(f"{path}: {exc}") from exc
    identity = found.identity
    epsilon, delta, points = float(found.totals[0]), float(found.totals[1]), found.totals[2]
    document: dict[str, Any] = {
        "ledger": str(path),
        "ok": found.ok,
        "ledger_id": None if identity is None else identity.ledger_id,
        "owner": None if identity is None else identity.owner,
        "ca": None if identity is None else identity.ca,
        "keys": [] if identity is None else list(identity.keys),
        "charges": found.charges,
        "chained_from_creation": None if identity is None else identity.charges_at_creation == 0,
        "sequence": found.sequence,
        "head": found.head.hex(),
        "totals": {"epsilon": epsilon, "delta": delta, "points": points},
        "open_rollbacks": found.open_rollbacks,
        "problems": [{"charge": p.charge, "what": p.what} for p in found.problems],
    }
    if as_json:
        print_json(document)
    else:
        click.echo(
            f"{path}: ledger {document['ledger_id']} of owner {document['owner'] or '(unbound)'}"
            f", {found.charges} charges, chain head at charge {found.sequence} "
            f"({found.head.hex()[:16]}); lifetime epsilon {epsilon:.6g}, delta {delta:.3g}, "
            f"{points} points"
        )
        if identity is not None and identity.charges_at_creation:
            click.echo(
                f"the first {identity.charges_at_creation} charges were chained when the ledger "
                "was upgraded to a chain: unchanged since then"
            )
        for problem in found.problems:
            click.echo(f"problem: {problem.what}")
        if found.open_rollbacks:
            click.echo(
                f"{found.open_rollbacks} receipt(s) show this ledger behind what its owner signed: "
                f"the owner serves nothing until dpmarket owner ledger resolve (or a newer backup)"
            )
    if not found.ok:
        sys.exit(1)


@ledger.command("rebind")
@_LEDGER_DIR
@tls_options
def ledger_rebind(data_dir: Path, **tls: Any) -> None:
    """Bind the ledger to this owner's certificate of a new CA.

    After the deployment's CA was replaced (docs/howto-certificates.md), an owner's ledger, bound
    to the CA that issued its old certificate, is refused as another deployment's until its
    operator runs this with the owner's new certificate. The owner's name must be the ledger's.
    """
    from dpmarket.owner.ledger_chain import LedgerOwner

    security = security_from_options("owner", **tls)
    if security.identity is None:
        raise click.UsageError("rebind needs the owner's certificate (--pki-dir and --name)")
    owner_id = LedgerOwner.from_security(security.identity.name, security)
    try:
        with OwnerLedger(data_dir, None) as book:
            before, after = book.rebind(owner_id)
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(
        f"{ledger_path(data_dir)}: owner {owner_id.name} bound to CA "
        f"{(after or 'none')[:16]} (was {(before or 'none')[:16]})",
        markup=False,
        highlight=False,
    )


@ledger.command("resolve")
@config_option
@_LEDGER_DIR
@click.option(
    "--accept-replaced-ledger",
    is_flag=True,
    help="Also resolve receipts of another ledger of this owner (one this ledger replaced): "
    "record it as replaced up to the receipt's charge; what it charged up to there is lost to "
    "the budget, on record, unless this ledger replaced it by restore --replace-other-ledger "
    "(then what the receipt shows beyond what the restore counted is charged). A receipt of a "
    "later charge of it stops the owner again.",
)
@click.option(
    "--dismiss-unverified-receipts",
    is_flag=True,
    help="Also resolve receipts naming this owner that no key of the ledger verifies and whose "
    "totals do not open under the ledger's key (forged by a curator): nothing is charged, on "
    "record. Restore the latest backup that verifies instead if the ledger's keys were edited. "
    "Never a receipt whose certificate (kept by the curator) the owner's CA issued to this owner, "
    "whose key signed it and whose totals this ledger sealed: that one is genuine.",
)
def ledger_resolve(
    data_dir: Path, accept_replaced_ledger: bool, dismiss_unverified_receipts: bool
) -> None:
    """Clear a rollback the owner found: charge what the lost charges spent, then serve again.

    When a curator presents a receipt the owner signed for charges its ledger no longer holds
    (restored from an older copy), the owner refuses every session. Restore a newer backup if
    there is one; otherwise this charges, as one entry now, what the receipt's totals hold
    beyond the ledger's charges up to it, and the owner serves again. A receipt of another
    ledger of this owner (the ledger was created anew, or upgraded from an earlier format)
    cannot be charged back: restore that ledger, or pass --accept-replaced-ledger. A receipt
    naming this owner that no key of its ledger verifies is charged back the same way when its
    totals open under the ledger's own key (the ledger's keys were edited); otherwise it is
    forged: pass --dismiss-unverified-receipts. A receipt that came with a certificate the
    owner's CA issued to this owner, whose key signed it and whose totals this ledger sealed, is
    genuine and never dismissed; one this ledger never sealed is unverified, whatever signed it.
    """
    try:
        with OwnerLedger(data_dir, None) as book:
            resolved = book.resolve_rollbacks(
                accept_replaced_ledger=accept_replaced_ledger,
                dismiss_unverified=dismiss_unverified_receipts,
            )
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not resolved:
        console.print(f"{ledger_path(data_dir)}: no rollback to resolve")
        return
    for r in resolved:
        charged = (
            f"charged epsilon {r.epsilon:.6g}, delta {r.delta:.3g}, {r.points} points (charge "
            f"{r.charge})"
            if r.epsilon or r.delta or r.points
            else f"nothing was missing (recorded as charge {r.charge}, of nothing)"
        )
        if r.replaced_ledger is not None and r.counted_replaced:
            charged = (
                f"a receipt of ledger {r.replaced_ledger}, which this ledger replaced (restore "
                f"--replace-other-ledger), recorded as replaced up to charge "
                f"{r.receipt_sequence}: what it shows beyond the charges of it counted here was "
                f"{charged}"
            )
        elif r.replaced_ledger is not None:
            charged = (
                f"a receipt of ledger {r.replaced_ledger}, recorded as replaced by this one up "
                f"to charge {r.receipt_sequence}: what it charged up to there is not counted "
                "(its totals are sealed under its own key); a receipt of a later charge of it "
                "stops the owner again"
            )
        if r.dismissed:
            charged = "an unverified receipt (forged), dismissed on record: nothing charged"
        console.print(
            f"rollback {r.rollback} (receipt up to charge {r.receipt_sequence} presented by "
            f"{r.curator}, ledger at charge {r.ledger_sequence}): {charged}",
            markup=False,
            highlight=False,
        )


@ledger.command("upgrade")
@config_option
@_LEDGER_DIR
def ledger_upgrade(data_dir: Path) -> None:
    """Upgrade a ledger of an earlier dpmarket release to this one's format. Stop the owner first.

    The owner never upgrades its ledger on its own: a ledger file taken back to an earlier
    format (its chain and identity dropped, charges deleted) would otherwise be taken in with a
    new id and its budget reset. Run this once, after upgrading dpmarket, for a ledger that
    ran the earlier release until now; never for one that already ran this release (restore
    its backup). The upgrade is recorded in the ledger.
    """
    from dpmarket.owner.ledger_admin import upgrade_ledger

    try:
        done = upgrade_ledger(data_dir)
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    where = ledger_path(data_dir)
    if done.before == done.after:
        console.print(f"{where} is at schema {done.after} already: nothing to upgrade")
        return
    console.print(
        f"{where} upgraded from schema {done.before} to {done.after}: ledger {done.ledger_id}, "
        f"{done.charges} charges"
        + (
            " (a new ledger id, its charges chained as found; bound to the first owner that "
            "serves it). A curator's receipt of this owner's earlier ledger makes the owner "
            "refuse to serve until you restore that ledger or accept the loss (dpmarket owner "
            "ledger resolve --accept-replaced-ledger)"
            if done.new_identity
            else ""
        )
        + "; recorded in the ledger",
        markup=False,
        highlight=False,
    )


def _policy_note(data_dir: Path, recorded: OwnerPolicy) -> str:
    """A warning when the data directory's policy file is not the one the ledger recorded at
    the owner's last start (it applies from the next start)."""
    try:
        current, source = data_dir_policy(data_dir)
    except (OSError, ValueError) as exc:
        return f"warning: {exc}"
    if current == recorded or not (data_dir / POLICY_FILE).is_file():
        return ""
    return (
        f"note: {source} differs from the policy the ledger recorded at the owner's last start "
        "(shown above); it applies from the next start"
    )


# -------------------------------------------------------------------------- service
def open_ledger(
    data_dir: Path, policy: OwnerPolicy, name: str, security: TransportSecurity
) -> OwnerLedger:
    """Open the owner ``name``'s ledger for a command that charges it (owner serve, owner
    publish), bound to its certificate (:func:`dpmarket.owner.publishing.open_owner_ledger`): a
    missing, empty, damaged or foreign ledger fails the command, saying what to do."""
    from dpmarket.owner.publishing import open_owner_ledger

    try:
        return open_owner_ledger(data_dir, policy, name, security)
    except sqlite3.DatabaseError as exc:
        raise _unreadable_ledger(data_dir, exc) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


def _unreadable_ledger(data_dir: Path, exc: sqlite3.DatabaseError) -> click.ClickException:
    """What to do about a ledger that does not read: restore its latest backup."""
    return click.ClickException(
        f"{ledger_path(data_dir)} is not a readable ledger ({exc}): restore it from its "
        f"latest backup: dpmarket owner ledger restore --data-dir {data_dir} --from BACKUP "
        "(docs/howto-ledger.md)"
    )


def dask_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--dask-scheduler``, ``--dask-workers``, ``--in-memory-values`` (config keys
    ``dask_scheduler``, ``dask_workers``, ``in_memory_values``)."""
    options = [
        click.option(
            "--dask-scheduler",
            default=None,
            metavar="tcp://HOST:PORT",
            help="The owner's own Dask scheduler, which computes on a table too large for "
            "memory (its workers must see the data at the same path or URL). Default: a local "
            "cluster of worker processes, started only for such a table.",
        ),
        click.option(
            "--dask-workers",
            default=None,
            type=click.IntRange(min=1),
            help="Worker processes of the local Dask cluster (default: one per CPU).",
        ),
        click.option(
            "--in-memory-values",
            default=DEFAULT_IN_MEMORY_VALUES,
            show_default=True,
            type=click.IntRange(min=1),
            help="A table of at most this many values (rows x columns) is read into memory; "
            "a larger one is served partition by partition on Dask.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def engine_starter(scheduler: str | None, workers: int | None) -> Callable[[], Engine]:
    """What starts the owner's engine when its table is partitioned (:func:`dpmarket.owner.engine.
    start_engine`); an unreachable scheduler fails the command."""

    def start() -> Engine:
        from dpmarket.owner.engine import start_engine

        try:
            return start_engine(scheduler, workers=workers)
        except OSError as exc:
            raise click.ClickException(str(exc)) from exc

    return start


def work_limits(policy: OwnerPolicy, found: OwnerData) -> WorkLimits:
    """The owner's budgets (its policy's ``limits``) and its engine's size."""
    from dpmarket.owner.dataset import largest_partition
    from dpmarket.owner.partitioned import PartitionedData

    data = found.points
    partitioned = isinstance(data, PartitionedData)
    return WorkLimits(
        memory_bytes=int(policy.session_memory_mib * 2**20),
        step_seconds=policy.step_seconds,
        largest_partition=largest_partition(data.dataset) if partitioned else 0,  # type: ignore[union-attr]
        workers=found.engine.workers if found.engine is not None else 1,
    )


def read_owner_data(
    schema_path: str | None,
    data_path: str | None,
    table_path: str | None,
    binary_columns: tuple[str, ...],
    label_column: str,
    *,
    in_memory_values: int = DEFAULT_IN_MEMORY_VALUES,
    engine: Callable[[], Engine] | None = None,
) -> tuple[Schema | None, OwnerData]:
    """Read the owner's schema and data as ``owner serve`` takes them: with a schema, the one
    table ``data_path`` checked against it (both capabilities); without, the points of
    ``data_path`` and the table of ``table_path``. A table above ``in_memory_values`` values is
    served partition by partition on the engine ``engine()`` starts. Any problem fails the
    command on the owner's own console, naming the file and the column."""
    from dpmarket.owner.data import OwnerData, load_owner_data

    try:
        if schema_path is not None:
            assert data_path is not None
            schema = load_schema(schema_path)
            schema.check_confirmed(schema_path)
            found = load_owner_data(
                data_path,
                schema=schema,
                binary=binary_columns,
                in_memory_values=in_memory_values,
                engine=engine,
            )
            return schema, found
        points = (
            load_owner_data(
                data_path,
                label_column=label_column,
                table=False,
                in_memory_values=in_memory_values,
                engine=engine,
            )
            if data_path is not None
            else None
        )
        rows = (
            load_owner_data(
                table_path,
                binary=binary_columns,
                points=False,
                in_memory_values=in_memory_values,
                engine=engine,
            )
            if table_path is not None
            else None
        )
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    engines = [d.engine for d in (points, rows) if d is not None and d.engine is not None]
    return None, OwnerData(
        points.points if points is not None else None,
        rows.table if rows is not None else None,
        engines[0] if engines else None,
    )


@click.command("serve-owner")
@click.option(
    "--data",
    "data_path",
    default=None,
    help="The owner's data. With --schema: its one table (.csv or .parquet with a header, a "
    "directory or glob of Parquet files, or an fsspec URL such as s3://bucket/table/), served "
    "for every capability. Without: the points for summarization (.npy, .npz, numeric .csv or "
    "Parquet). A table above --in-memory-values values is served partition by partition on "
    "Dask.",
)
@click.option(
    "--schema",
    "schema_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The data's public schema (TOML: columns in order, types, public bounds or levels, "
    "label). --data is checked against it now (names, order, types, bounds: errors on this "
    "console only) and it is advertised to the curator, which refuses sessions whose consumer "
    "or other owners declare another. A draft (dpmarket init) is refused.",
)
@click.option(
    "--table",
    "table_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Without --schema: the owner's numeric table with named columns for joint statistics "
    "(CAPE), .csv or .parquet. At least one of --data and --table.",
)
@click.option(
    "--binary-column",
    "binary_columns",
    multiple=True,
    metavar="COLUMN",
    help="Without --schema, a shortcut: a column of --table declared to hold only 0 and 1 "
    "(checked now; repeat), the only columns a CAPE logistic regression or training may take "
    'as its target. With --schema, declare type = "binary" there instead (a column given '
    "here must be binary in the schema).",
)
@click.option(
    "--label-column",
    default="label",
    help="Without --schema: the column of integer labels in .csv/.parquet files (absent: "
    "unlabeled). With --schema, its label.",
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
    help=POLICY_HELP.format(what="budgets, point limits, curators served"),
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False),
    help=DATA_DIR_HELP,
)
@click.option(
    "--allow-seeded-sessions",
    is_flag=True,
    help="Let a session's seed drive this owner's sampling and noise (reproducible runs; "
    "never in production: whoever knows the seed knows the noise).",
)
@dask_options
@metrics_options
@tls_options
def serve_owner(
    data_path: str | None,
    schema_path: str | None,
    table_path: str | None,
    binary_columns: tuple[str, ...],
    label_column: str,
    owner_id: str | None,
    host: str,
    port: int,
    port_file: str | None,
    blas_threads: int,
    policy_path: str | None,
    data_dir: str,
    allow_seeded_sessions: bool,
    dask_scheduler: str | None,
    dask_workers: int | None,
    in_memory_values: int,
    metrics_port: int | None,
    metrics_host: str,
    **tls: Any,
) -> None:
    """Serve one data owner's private dataset over gRPC (mTLS), under its own policy."""
    from threadpoolctl import threadpool_limits

    from dpmarket.owner.service import serve_owner as serve

    ensure_info_logging()
    start_metrics(metrics_host, metrics_port, logger)
    opened = open_owner(
        data_path,
        schema_path,
        table_path,
        binary_columns,
        label_column,
        owner_id,
        policy_path,
        data_dir,
        allow_seeded_sessions,
        dask_scheduler=dask_scheduler,
        dask_workers=dask_workers,
        in_memory_values=in_memory_values,
        **tls,
    )
    try:
        with threadpool_limits(limits=blas_threads, user_api="blas"):
            asyncio.run(
                serve(
                    opened.owner,
                    f"{host}:{port}",
                    opened.security,
                    curators=opened.policy.curators,
                    cape=opened.cape,
                    port_file=port_file,
                )
            )
    except BindError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        opened.close()


@dataclass
class OpenedOwner:
    """An owner ready to serve (:func:`open_owner`): its protocol objects, ledger, policy and
    transport security. Close the ledger when done."""

    owner: Owner
    cape: CapeSite
    ledger: OwnerLedger
    policy: OwnerPolicy
    security: TransportSecurity
    #: The Dask engine of a partitioned table (None: in memory).
    engine: Any = None

    def close(self) -> None:
        """Close the ledger and stop the Dask engine, if any."""
        self.ledger.close()
        if self.engine is not None:
            self.engine.close()


def _check_data_options(
    data_path: str | None,
    schema_path: str | None,
    table_path: str | None,
    binary_columns: tuple[str, ...],
) -> None:
    """Refuse a combination of ``owner serve``'s data options that names no data or contradicts
    itself (:class:`click.UsageError`, saying which option to give)."""
    if schema_path is not None:
        if data_path is None or table_path is not None:
            raise click.UsageError(
                "with --schema, give --data: the owner's one table, served for every capability "
                "(no --table)"
            )
    elif data_path is None and table_path is None:
        raise click.UsageError("give --data (points to summarize), --table (for CAPE), or both")
    elif binary_columns and table_path is None:
        raise click.UsageError("--binary-column declares columns of --table: give --table")


def _log_cape_peers(owner_id: str, peers: list[str], policy_source: str) -> None:
    """Log the CAPE peers an owner's policy pins, or warn that it pins none (every job refused)."""
    if peers:
        logger.info("owner %s: CAPE peers (pinned keys): %s", owner_id, ", ".join(peers))
    else:
        logger.warning(
            "owner %s: its policy pins no CAPE peers ([peers] of %s): every CAPE job will "
            "be refused until its operator lists them (dpmarket pki show CERT prints a "
            "peer's public-key pin)",
            owner_id,
            policy_source,
        )


def _log_opened(
    owner_id: str,
    found: OwnerData,
    schema_path: str | None,
    schema: Schema | None,
    ledger: OwnerLedger,
    policy_source: str,
) -> None:
    """Log what an opened owner serves (points, table, schema) and what its ledger has left."""
    data, table = found.points, found.table
    left = ledger.remaining()
    points = (
        "no points" if data is None else f"{data.n_points} points of {data.n_features} features"
    )
    if found.engine is not None:
        points += f" (partitioned, on {found.engine.workers} Dask worker(s))"
    rows = "no table" if table is None else f"a table of {table.n_rows} rows"
    if table is not None and table.binary:
        rows += f" (declared 0/1: {', '.join(table.binary)})"
    if schema is not None:
        rows += f"; schema {schema_path} (fingerprint {schema.fingerprint[:16]})"
    logger.info(
        "owner %s: %s, %s; ledger %s; policy %s; left %s: epsilon %g, delta %g, %d points",
        owner_id,
        points,
        rows,
        ledger.path,
        policy_source,
        left.window,
        left.epsilon,
        left.delta,
        left.points,
    )


def open_owner(
    data_path: str | None,
    schema_path: str | None,
    table_path: str | None,
    binary_columns: tuple[str, ...],
    label_column: str,
    owner_id: str | None,
    policy_path: str | None,
    data_dir: str,
    allow_seeded_sessions: bool,
    *,
    dask_scheduler: str | None = None,
    dask_workers: int | None = None,
    in_memory_values: int = DEFAULT_IN_MEMORY_VALUES,
    **tls: Any,
) -> OpenedOwner:
    """Read an owner's data, policy and ledger as ``owner serve`` does, without serving it.

    The options are ``owner serve``'s (:func:`serve_owner`); :mod:`dpmarket.deploy.owner_group`
    serves several owners opened this way from one process.

    Raises
    ------
    click.UsageError, click.BadParameter, click.ClickException
        On bad options, or data, a schema, a policy or a ledger that cannot be read.
    """
    from dpmarket.owner.cape import CapeSite
    from dpmarket.owner.protocol import Owner
    from dpmarket.owner.service import site_identity

    _check_data_options(data_path, schema_path, table_path, binary_columns)
    security = security_from_options("owner", **tls)
    name = security.identity.name if security.identity is not None else None
    if name is not None and owner_id is not None and owner_id != name:
        raise click.BadParameter(
            f"the certificate names this owner {name!r}, not {owner_id!r}", param_hint="--owner-id"
        )
    schema, found = read_owner_data(
        schema_path,
        data_path,
        table_path,
        binary_columns,
        label_column,
        in_memory_values=in_memory_values,
        engine=engine_starter(dask_scheduler, dask_workers),
    )
    data, table = found.points, found.table
    default_name = (
        (data.name if isinstance(data, PointSet) else data.dataset.name)
        if data is not None
        else table.name
        if table is not None
        else ""
    )
    owner_id = name or owner_id or default_name
    state = Path(data_dir)
    try:
        policy, policy_source = data_dir_policy(state, policy_path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    ledger = open_ledger(state, policy, owner_id, security)
    owner = Owner(
        owner_id,
        data,
        ledger=ledger,
        max_sessions=policy.max_sessions,
        idle_timeout=policy.session_idle_timeout_seconds,
        max_rff_dimension=policy.max_rff_dimension,
        allow_seeded_sessions=allow_seeded_sessions,
        schema=schema,
        limits=work_limits(policy, found),
    )
    try:
        identity = site_identity(owner_id, security, policy.peer_pins)
    except ValueError as exc:
        raise click.ClickException(f"{policy_source}: [peers]: {exc}") from exc
    cape = CapeSite(
        owner_id,
        table,
        ledger=ledger,
        max_jobs=policy.max_sessions,
        idle_timeout=policy.session_idle_timeout_seconds,
        allow_seeded_sessions=allow_seeded_sessions,
        identity=identity,
        min_colluders=policy.cape_min_colluders,
    )
    if identity is not None and table is not None:
        _log_cape_peers(owner_id, sorted(identity.roster - {owner_id}), policy_source)
    _log_opened(owner.owner_id, found, schema_path, schema, ledger, policy_source)
    return OpenedOwner(owner, cape, ledger, policy, security, found.engine)


# ------------------------------------------------------------------------- sketches
@click.command("publish")
@curator_options
@click.option(
    "--table",
    "--data",
    "table_path",
    required=True,
    help="The owner's table (.csv or .parquet with named columns, a directory or glob of "
    "Parquet files, an fsspec URL); the spec's columns are selected by name. A table above "
    "--in-memory-values values is summed partition by partition on Dask.",
)
@click.option(
    "--schema",
    "schema_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The table's public schema, checked as owner serve checks it (a draft is refused).",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False),
    help=DATA_DIR_HELP + " Published sketches are stored there too.",
)
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help=POLICY_HELP.format(
        what="its [sketches] decide whether and up to which epsilon it publishes"
    ),
)
@click.option(
    "--spec",
    "specs",
    multiple=True,
    metavar="NAME",
    help="A spec of the catalogue (e.g. flights/rff); repeat. Without --spec or --all the "
    "specs and their cost are listed and, on a terminal, the spec the curator's allocation "
    "reads (or, without one, every spec) is offered for confirmation.",
)
@click.option(
    "--all",
    "all_specs",
    is_flag=True,
    help="Publish under every spec of the catalogue, without asking.",
)
@click.option(
    "--epsilon",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Epsilon of each new sketch (default: the spec's), within the spec's range and the "
    "policy's sketches.epsilon. A spec whose map this owner released at another epsilon is "
    "refused, before anything is charged (exit code 1).",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(min=0),
    help="Seed the sketches' noise (reproducible runs only: whoever knows the seed knows the "
    "noise). Default: OpenDP's samplers.",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@json_option
@dask_options
@tls_options
def publish_command(
    curator: str,
    curator_name: str,
    table_path: str,
    schema_path: str | None,
    data_dir: str,
    policy_path: str | None,
    specs: tuple[str, ...],
    all_specs: bool,
    epsilon: float | None,
    seed: int | None,
    out_path: str | None,
    as_json: bool,
    dask_scheduler: str | None,
    dask_workers: int | None,
    in_memory_values: int,
    **tls: Any,
) -> None:
    """Publish this owner's private sketches to a curator's catalogue: charge first, then send.

    Each sketch is checked against the owner's policy and charged to its own ledger together
    with the sketch itself, before anything is sent; a spec released before is sent again as
    stored, charging nothing (with an --epsilon other than its own the run is refused: the
    stored sketch is not at the epsilon asked). Name the specs (--spec) or take every one
    (--all); with neither, the specs and their cost are listed and the curator's allocation
    spec is offered (a spec released at another epsilon than --epsilon is listed as refused and
    not offered).
    """
    from dpmarket.owner.publishing import publish_sketches

    if specs and all_specs:
        raise click.UsageError("give --spec NAME (repeat) or --all, not both")
    security = security_from_options("owner", **tls)
    if security.identity is None:
        raise click.UsageError(
            "publishing needs the owner's certificate: the catalogue names the publisher by it"
        )
    name = security.identity.name
    curator_identity(curator_name)  # a bad name is a bad parameter
    if out_path is not None:
        check_outputs(out_path)
    try:
        done = publish_sketches(
            curator,
            security,
            table_path=table_path,
            data_dir=data_dir,
            specs=specs,
            choose=None if all_specs else _choose_specs,
            epsilon=epsilon,
            seed=seed,
            schema_path=schema_path,
            policy_path=policy_path,
            curator_name=curator_name,
            engine=engine_starter(dask_scheduler, dask_workers),
            in_memory_values=in_memory_values,
        )
    except sqlite3.DatabaseError as exc:
        raise _unreadable_ledger(Path(data_dir), exc) from exc
    except (OSError, ValueError, RuntimeError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not done.deliveries:
        console.print("nothing published")
        return
    document = done.to_json(f"{curator_name}@{curator}")
    rows = document["sketches"]
    left = done.left
    write_output(document, out_path)
    if as_json:
        print_json(document)
        return
    Console().print(
        _publication_table(f"{name}: sketches in the catalogue of {curator_name}", rows)
    )
    console.print(
        f"ledger {ledger_path(Path(data_dir))}: left over {left.window}: epsilon "
        f"{left.epsilon:.6g}, delta {left.delta:.3g}"
    )


def _publication_table(title: str, rows: list[dict[str, Any]]) -> Table:
    """``owner publish``'s table: one row per spec published (its ``--json`` rows)."""
    table = Table(title=title, title_justify="left")
    for column in ("spec", "epsilon", "delta", "charged now", "noisy count", "catalogue"):
        table.add_column(column, justify="left" if column == "spec" else "right", overflow="fold")
    for r in rows:
        table.add_row(
            r["spec"],
            f"{r['epsilon']:g}",
            f"{r['delta']:g}",
            "yes" if r["charged_now"] else "no (stored)",
            f"{r['noisy_count']:.1f}",
            "held already" if r["already_in_catalogue"] else "published",
        )
    return table


def _interactive() -> bool:
    """Whether a person can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def _choose_specs(
    client: Any,
    catalogue: list[Any],
    allocation: str | None,
    epsilon: float | None,
    stored: Mapping[str, float],
) -> list[str]:
    """List the catalogue's specs with what publishing each costs this owner, then offer the
    allocation spec (or every spec) for confirmation on a terminal; refuse to guess otherwise.

    Parameters
    ----------
    client : CatalogEndpoint
    catalogue : list of SketchSpec
    allocation : str or None
        The spec the curator's allocation reads.
    epsilon : float or None
        The ``--epsilon`` asked (None: each spec's own).
    stored : mapping of str to float
        The epsilon of this owner's stored release under each spec's map (its ledger's; absent:
        none). Such a spec is sent again free, and refused under another ``--epsilon``
        (:func:`dpmarket.owner.sketches.check_stored_epsilon`): the list says so, and it is not
        offered.

    Returns
    -------
    list of str
        The specs to publish (empty: the person declined, or every spec offered is refused).

    Raises
    ------
    click.UsageError
        When no one can be asked (stdin is not a terminal): name --spec and --all.
    """
    table = Table(title="specs of the curator's catalogue", title_justify="left")
    for column in ("spec", "kind", "epsilon", "delta", "published", "note"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta") else "left")
    cost: dict[str, tuple[float, float]] = {}
    refused: set[str] = set()
    for spec in catalogue:
        released = stored.get(spec.name)
        published = released is not None or client.spec(spec.name).published
        eps = 0.0 if published else (epsilon if epsilon is not None else spec.epsilon)
        dlt = 0.0 if published or spec.noise != "gaussian" else spec.delta
        cost[spec.name] = (eps, dlt)
        if released is not None and epsilon is not None and float(epsilon) != released:
            refused.add(spec.name)
            status = f"yes at epsilon {released:g}: --epsilon {float(epsilon):g} refused"
        else:
            status = "yes (sent again, free)" if published else "no"
        table.add_row(
            spec.name,
            spec.kind,
            f"{eps:g}",
            f"{dlt:g}",
            status,
            "the curator's allocation reads it" if spec.name == allocation else "",
        )
    console.print(table)
    listed = [allocation] if allocation is not None else [s.name for s in catalogue]
    offer = [n for n in listed if n not in refused]
    total_eps = sum(cost[n][0] for n in offer)
    total_delta = sum(cost[n][1] for n in offer)
    what = (
        f"{allocation} (the spec the curator's allocation reads)"
        if allocation is not None
        else f"every spec ({len(offer)})"
        if len(offer) == len(listed)
        else f"every spec but the refused ({len(offer)} of {len(listed)})"
    )
    if not _interactive():
        hint = f"; the curator's allocation reads {allocation}" if allocation else ""
        raise click.UsageError(
            f"choose the specs to publish: --spec NAME (repeat) or --all (every spec: epsilon "
            f"{sum(c[0] for c in cost.values()):g} in all){hint}"
        )
    if not offer:
        console.print(
            f"nothing to offer: this owner released {', '.join(listed)} at another epsilon "
            "than --epsilon asks (a map is published once); publish without --epsilon to send "
            "the stored sketch again at no cost"
        )
        return []
    if click.confirm(
        f"Publish {what}, charging this owner's ledger epsilon {total_eps:g}, delta "
        f"{total_delta:g}?",
        default=False,
        err=True,
    ):
        return offer
    return []


@click.command("published")
@config_option
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="The owner's data directory.",
)
@json_option
def published_command(data_dir: str, as_json: bool) -> None:
    """List the sketches this owner's data directory has released (offline, read-only)."""
    from dpmarket.owner.sketches import SketchPublisher

    try:
        with OwnerLedger(data_dir, None) as ledger:
            rows = SketchPublisher(ledger).published()
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        print_json(
            {
                "data_dir": data_dir,
                "sketches": [
                    {"spec": spec, "key": key, "epsilon": epsilon, "delivered_to": list(curators)}
                    for spec, key, epsilon, curators in rows
                ],
            }
        )
        return
    table = Table(title=f"sketches released from {data_dir}", title_justify="left")
    for column in ("spec", "key", "epsilon", "delivered to"):
        table.add_column(column, overflow="fold")
    for spec, key, epsilon, curators in rows:
        table.add_row(spec, key[:16], f"{epsilon:g}", ", ".join(curators) or "nobody yet")
    Console().print(table)


def earnings_table(earnings: list[Earning], *, wide: bool = False) -> Table:
    """The owner's earnings, one row per statement: when, the session, the consumer, points
    read and delivered, epsilon, charge, reward and total (credits); 80 columns unless
    ``wide`` (whole ids, the curator and the price components)."""
    credits = credits_text
    table = Table(title="earnings (credits)", title_justify="left")
    headers = ["recorded", "session", "consumer", "read", "deliv.", "epsilon"]
    if wide:
        headers += ["curator", "per read", "per deliv.", "per eps.", "top-up"]
    headers += ["reward", "total"]
    for header in headers:
        right = header not in ("recorded", "session", "consumer", "curator")
        table.add_column(header, justify="right" if right else "left", overflow="fold")
    for e in earnings:
        line = e.statement.line
        eps = (line.epsilon_session + line.epsilon_payout) / EPSILON_UNITS
        row = [
            iso_time(e.recorded_at) if wide else iso_time(e.recorded_at)[:10],
            e.session if wide else short_session(e.session),
            e.consumer if wide else e.consumer.removeprefix("consumer:"),
            str(line.points_read),
            str(line.points_delivered),
            f"{eps:g}",
        ]
        if wide:
            row += [e.curator]
            row += [
                credits(x)
                for x in (
                    line.read_charge,
                    line.delivered_charge,
                    line.epsilon_charge,
                    line.minimum_topup,
                )
            ]
        row += [credits(e.reward), credits(e.total)]
        table.add_row(*row)
    blank = [""] * (len(headers) - 2)
    table.add_row("[bold]all", *blank, f"[bold]{credits(sum(e.total for e in earnings))}")
    return table


@click.command("earnings", context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@_LEDGER_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--wide", is_flag=True, help="Every column and whole ids (default: 80 columns).")
def earnings_command(data_dir: Path, as_json: bool, wide: bool) -> None:
    """Show what the owner has earned: every settlement statement it checked against its own
    ledger (points released, epsilon charged) and recorded, with the total.

    Reads the owner's database only (no policy file, no network)."""
    from dpmarket.owner.earnings import Earnings

    try:
        with OwnerLedger(data_dir, None) as book:
            earnings = Earnings(book, book.identity.owner or "").all()
    except LedgerMissingError as exc:
        raise click.ClickException(f"{data_dir} holds no owner ledger: {exc}") from exc
    except (OSError, ValueError, RuntimeError, sqlite3.DatabaseError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        document = {
            "ledger": str(ledger_path(data_dir)),
            "total": sum(e.total for e in earnings),
            "earnings": [e.to_json() for e in earnings],
        }
        click.echo(json.dumps(document, indent=2, allow_nan=False))
        return
    if not earnings:
        Console().print(f"no earnings recorded in {ledger_path(data_dir)}", highlight=False)
        return
    print_table(earnings_table(earnings, wide=wide), wide=wide)
