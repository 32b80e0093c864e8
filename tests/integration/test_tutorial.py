"""The tutorial runs as written: every ``sh`` block of docs/tutorial.md, in order, in a fresh
directory, with real processes (so the document cannot drift from the product)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpmarket.owner.ledger import OwnerLedger

pytestmark = pytest.mark.integration

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
#: Seconds the whole tutorial may take (it takes about two minutes on 2 shared cores).
TIMEOUT_SECONDS = 900


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


def test_every_command_of_the_tutorial_runs_on_a_fresh_directory(tmp_path: Path) -> None:
    script = "set -euo pipefail\n" + "\n".join(
        tutorial_commands(TUTORIAL.read_text(encoding="utf-8"))
    )
    (tmp_path / "tutorial.sh").write_text(script, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    try:
        done = subprocess.run(
            ["bash", "tutorial.sh"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
    finally:
        if (tmp_path / "clinics" / "deployment.toml").exists():
            subprocess.run(
                [sys.executable, "-m", "dpmarket.deploy.cli", "down", "clinics"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                timeout=120,
            )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns)[-3:] == ["progression", "high", "owner"] and len(summary) == 20
    assert set(summary["owner"]) <= {"young", "middle", "senior"}
    # What the tutorial says the young clinic spent: 1 (the allocation's sketch, published by
    # `up`) + 0 (the summary: split by that sketch, no noisy count since `up` publishes it)
    # + 3 (its HIST, RFF and marginals sketches) + 3 (CAPE).
    with OwnerLedger(tmp_path / "clinics" / "owners" / "young", None) as ledger:
        spent = ledger.window_totals()
        entries = ledger.entries()
    assert spent.epsilon == pytest.approx(7.0, abs=1e-5)
    sketches = [e for e in entries if e.mechanism.startswith("private sketch")]
    assert [e.epsilon for e in sketches][:3] == [1.0, 1.0, 1.0]  # the allocation's, HIST, RFF
    summary_charges = [e for e in entries if "candidates" in e.mechanism]
    assert summary_charges and sum(e.epsilon for e in summary_charges) == 0.0
    said = " ".join((done.stdout + done.stderr).split())
    assert "published the allocation sketch clinics-allocation/rff, charged epsilon 1" in said
    assert "allocation: sketch (the owners' published sketches; no charge to them)" in said
    # The count came with its interval from the sketch its last line names, as the tutorial
    # says: the narrowest of the half-widths listed (the marginals sketch's among them, or the
    # histogram's when every clinic measured the pair).
    assert "95 % interval" in done.stdout
    chosen, widths = answered_from(said)  # (explore says it on stderr)
    assert "clinics/marginals" in widths and "clinics/hist" in widths, widths
    assert widths[chosen] == min(widths.values()), (chosen, widths)
    assert "left" in done.stdout or "left" in done.stderr


def answered_from(output: str) -> tuple[str, dict[str, float]]:
    """The spec a best-available answer names on its last line and the mean half-width it
    lists per spec (``answered from clinics/hist: narrowest ... (mean half-width: clinics/hist
    0.273, clinics/marginals 0.5; ...)``)."""
    found = re.search(r"answered from (\S+): narrowest .*?\(mean half-width: ([^;)]*)", output)
    assert found, output[-2000:]
    widths = {}
    for part in found.group(2).split(","):
        name, width = part.split()
        widths[name] = float(width)
    return found.group(1), widths
