"""``dpmarket curator sessions`` fits an 80-column terminal; ``--wide`` keeps every column."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console
from starlette.requests import Request

from dpmarket.console.app import console_templates
from dpmarket.curator.cli import _compact_sessions, _wide_sessions
from dpmarket.runtime.identity import Identity


def _row(k: int, method: str, consumer: str, status: str = "done") -> dict[str, Any]:
    return {
        "id": f"{k:02d}f96ff0b702a9ebc07284a70a76dfae",
        "kind": "cape" if method.startswith("cape") else "summarization",
        "consumer": consumer,
        "method": method,
        "status": status,
        "created": f"2026-11-28T04:{k:02d}:27Z",
        "finished": f"2026-11-28T04:{k:02d}:28Z",
        "error": "",
        "charges": 2,
        "epsilon": {"owners": 1.0, "validation": 1.0},
        "delta": {"owners": 1e-6, "validation": 1e-6},
        "owner_points_accessed": 1517 if k % 2 else None,
        "left_out": {"senior": "budget refused"} if k == 3 else {},
        "result_kept": k == 1,
    }


ROWS = [
    _row(1, "candidates", "consumer:consumer"),
    _row(2, "cape-linear", "consumer:a-research-group-with-a-long-name"),
    _row(3, "rounds", "consumer:bob", "failed"),
    _row(4, "cape-training", "consumer:alice", "running"),
]


def _render(renderable: Any, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_default_table_fits_80_columns_without_cutting_a_value() -> None:
    text = _render(_compact_sessions(ROWS), 80)
    assert "…" not in text, text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text
    for row in ROWS:
        assert row["id"][:8] in text and row["method"] in text and row["status"] in text
    assert ROWS[0]["id"] not in text  # short ids
    assert "1517" in text


def test_the_wide_table_keeps_every_column() -> None:
    text = _render(_wide_sessions(ROWS), 300)
    for row in ROWS:
        assert row["id"] in text and row["consumer"] in text and row["created"] in text
    for header in ("kind", "finished (UTC)", "δ owners", "left out", "result kept"):
        assert header in text
    assert "senior (budget refused)" in text


def test_a_cape_jobs_d_v_column_says_it_does_not_apply() -> None:
    """A CAPE job uses no validation set: its "ε D_v" read "-", the legend's "not known"; it
    reads "n/a", said in the legend (the control: a session missing a figure keeps "-")."""
    cape, session = _row(2, "cape-linear", "consumer:alice"), _row(1, "candidates", "consumer:bob")
    cape["epsilon"], session["epsilon"] = {"owners": 1.0}, {"owners": 1.0}
    text = _render(_compact_sessions([cape, session]), 80)
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert "n/a" in lines[cape["id"][:8]]
    assert "n/a" not in lines[session["id"][:8]] and "-" in lines[session["id"][:8]]
    assert "n/a: does not apply (a CAPE job uses no D_v)" in " ".join(text.split())
    wide = _render(_wide_sessions([cape]), 300)
    assert wide.count("n/a") == 2  # ε D_v and δ D_v
    page = _curator_page([cape, session])
    cells = re.findall(r"<tr class=\"done\">(.*?)</tr>", page, flags=re.S)
    assert "n/a" in cells[0] and "n/a" not in cells[1]
    assert "n/a: does not apply (a CAPE job uses no D_v)" in page


def _curator_page(sessions: list[dict[str, Any]]) -> str:
    """The curator console's page (its template as the application renders it) with only
    ``sessions``."""
    templates = console_templates(Identity("curator", "curator"), "/k3y")
    scope = {"type": "http", "method": "GET", "path": "/k3y/curator", "headers": []}
    view = {"owners": [], "running": [], "sessions": sessions, "catalogue": [],
            "rates": {"last_hour": 0, "last_day": 0, "by_consumer": {}}}  # fmt: skip
    return templates.get_template("curator.html").render(
        request=Request(scope), role="curator", form_token="t", now=0.0, view=view, rate_svg=""
    )
