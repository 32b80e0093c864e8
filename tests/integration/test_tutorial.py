"""The tutorial's commands cover every step it teaches. They run as written, every ``sh`` block of
docs/tutorial.md in order in a fresh directory with real processes, in
tests/console/test_browser.py (``test_every_command_of_the_tutorial_runs_on_a_fresh_directory``),
whose consoles show the deployment they leave: one run of the commands, not two."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def tutorial_commands(text: str) -> list[str]:
    """The tutorial's ``sh`` blocks, in order (``text`` blocks are shown, not run)."""
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def test_the_tutorial_has_commands_for_every_step() -> None:
    blocks = tutorial_commands(TUTORIAL.read_text(encoding="utf-8"))
    text = "\n".join(blocks)
    for command in ("dpmarket init", "dpmarket up", "dpmarket consumer request",
                    "dpmarket owner publish", "dpmarket consumer explore",
                    "dpmarket consumer rank-owners", "dpmarket consumer cape mean",
                    "dpmarket consumer cape linreg", "dpmarket consumer cape logreg",
                    "dpmarket owner ledger", "dpmarket down"):  # fmt: skip
        assert command in text, command
