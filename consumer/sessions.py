"""``dpmarket consumer sessions``: the consumer's record of its sessions, unfinished ones marked.

``dpmarket consumer request --data-dir DIR`` records a session in ``DIR/sessions/`` as soon as
the curator has created it (status ``running``, with its id, request key, quote and owners:
:mod:`dpmarket.consumer.history`) and updates the record when the session ends. A session whose
end the consumer never saw (the curator killed or restarted, the connection lost) stays
``running``; this command lists it, and ``--check`` asks the curator how it ended (WatchSession,
which follows a session still running to its end) and records the answer: ``failed`` with the
reason and what it spent, or ``done`` (its summary is the curator's until it expires: run the
same request again with ``--request-id KEY``, which returns the same session and charges nothing
new).
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from dpmarket.common.errors import DPMarketError
from dpmarket.consumer.history import RecordedSession, SessionHistory, spent
from dpmarket.runtime.cli import (
    console,
    curator_identity,
    json_option,
    print_json,
    security_from_options,
    tls_options,
)

__all__ = ["check_unfinished", "sessions_command"]


def check_unfinished(history: SessionHistory, client: Any) -> list[RecordedSession]:
    """Ask the curator how each unfinished session of ``history`` ended and record it.

    Parameters
    ----------
    history : SessionHistory
    client : CuratorClient
        Connected to the curator that ran the sessions.

    Returns
    -------
    list of RecordedSession
        The records written (one per unfinished session with an id).

    Raises
    ------
    DPMarketError
        If the curator cannot be reached or does not know a session (``NotFoundError``: its
        record is left as it was, and the sessions after it are not asked about).
    """
    out = []
    for entry in history.entries():
        if not entry.unfinished or not entry.session_id:
            continue
        last = None
        for event, report in client.watch(entry.session_id):
            last = (event, report)
        failed = last is None or last[0].stage == "failed"
        out.append(
            history.record(
                status="failed" if failed else "done",
                source=entry.source,
                method=entry.method,
                summary_size=entry.summary_size,
                session_id=entry.session_id,
                result=spent(last[1]) if last is not None else None,
                error=(
                    f"session failed: {last[0].message if last is not None else 'no event'}"
                    if failed
                    else ""
                ),
                key=entry.key,
            )
        )
    return out


def _table(entries: list[RecordedSession]) -> Table:
    table = Table(title="sessions (newest first)", title_justify="left")
    for column in ("record", "status", "session", "request key", "method", "p", "quote", "owners"):
        table.add_column(column)
    for e in entries:
        table.add_row(
            e.key,
            e.status + (" (unfinished)" if e.unfinished else ""),
            e.session_id,
            e.request_id,
            e.method,
            str(e.summary_size),
            str(e.quote.get("total_credits", "")),
            ", ".join(e.owners),
        )
    return table


@click.command("sessions")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False),
    help="The consumer's data directory (what request --data-dir recorded).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Ask the curator (--curator) how each unfinished session ended, and record it.",
)
@click.option("--curator", default=None, metavar="HOST:PORT", help="The curator (for --check).")
@click.option(
    "--curator-name", default="curator", help="The name the curator's certificate must carry."
)
@click.option("--limit", type=click.IntRange(min=1), default=50, help="The newest N only.")
@json_option
@tls_options
def sessions_command(
    data_dir: str,
    check: bool,
    curator: str | None,
    curator_name: str,
    limit: int,
    as_json: bool,
    **tls: Any,
) -> None:
    """The sessions this consumer ran, newest first, unfinished ones marked (offline).

    request --data-dir records a session as soon as the curator creates it and updates it when
    it ends; one whose curator was lost stays unfinished, with its id, request key, quote and
    owners. --check asks the curator, once it is back, how each ended and records it."""
    history = SessionHistory(data_dir)
    if check:
        if curator is None:
            raise click.UsageError("--check needs --curator HOST:PORT (or --config)")
        from dpmarket.consumer.client import CuratorClient

        security = security_from_options("consumer", **tls)
        try:
            with CuratorClient(curator, security, curator=curator_identity(curator_name)) as client:
                for entry in check_unfinished(history, client):
                    fetch = (
                        f"; its summary: the same request again with --request-id "
                        f"{entry.request_id} (nothing charged again)"
                        if entry.status == "done" and entry.request_id
                        else ""
                    )
                    console.print(
                        f"session {entry.session_id}: {entry.status}"
                        + (f" ({entry.error})" if entry.error else "")
                        + fetch,
                        highlight=False,
                        markup=False,
                    )
        except DPMarketError as exc:
            raise click.ClickException(str(exc)) from exc
    entries = history.entries(limit)
    if as_json:
        from dataclasses import asdict

        print_json({"sessions": [{**asdict(e), "unfinished": e.unfinished} for e in entries]})
        return
    if not entries:
        console.print(f"no sessions recorded in {data_dir}")
        return
    Console().print(_table(entries))
