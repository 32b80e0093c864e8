"""Docstrings and comments say what the code does, not how it came to be: no issue numbers, no
"as before", no "today's" in the packages a user builds on (the lab, :mod:`dpmarket.experiments`,
cites the issues whose measurements it reproduces)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "runtime", "owner", "curator", "consumer", "deploy", "console")
#: Words that tell a reader the code's history instead of what it does.
HISTORY = re.compile(r"\b[Ii]ssue \d+\b|\bas before\b|\btoday's\b")


def history_lines(text: str) -> list[str]:
    """The lines of ``text`` that speak of the code's history."""
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


def test_the_packages_speak_of_what_the_code_does() -> None:
    files = [p for package in PACKAGES for p in (REPO / package).rglob("*.py")]
    files += sorted((REPO / "protos" / "dpmarket").glob("*.py"))
    assert len(files) > 100
    found = [
        f"{p.relative_to(REPO)}: {line}"
        for p in files
        for line in history_lines(p.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def test_the_check_catches_history() -> None:
    """Control: the phrases this check was written for."""
    assert history_lines("# Before, every admitted call read at once (issue 25).")
    assert history_lines("rows is read into memory and served as before: each session")
    assert not history_lines("the previous charge's hash; a receipt the ledger no longer holds")
