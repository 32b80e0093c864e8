"""The tutorial's deployment, for the console's browser tests and benchmark: docs/tutorial.md's
commands, as written, up to the clinics' sketches (three clinics, a curator and a consumer over
mTLS; every clinic's allocation sketch published by ``dpmarket up``; one summary requested with
``dpmarket consumer request``; every clinic's HIST, RFF and marginals sketches published), in a
fresh directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
#: The last tutorial command this deployment runs (the blocks after it are not run).
LAST = "dpmarket owner publish"
#: Seconds the commands may take (about a minute on 2 shared cores).
TIMEOUT_SECONDS = 600
#: The sign-in line a console prints when it first starts: its address (scheme, host, port and
#: secret path) and its token.
SIGN_IN = re.compile(r"sign in at (https?://[^/\s]+/[^/\s]+)/login .*\): (\S+)\s*$")


def environment() -> dict[str, str]:
    """The environment the tutorial's commands run in: this interpreter's ``dpmarket`` first."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    return env


def commands() -> str:
    """The tutorial's ``sh`` blocks up to the one running :data:`LAST`."""
    text = TUTORIAL.read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)
    end = next(k for k, block in enumerate(blocks) if LAST in block)
    return "set -euo pipefail\n" + "\n".join(blocks[: end + 1])


def deploy(directory: Path) -> Path:
    """Run the tutorial up to the sketches in ``directory``; return the deployment's folder
    (``directory / "clinics"``). Stop it with :func:`stop`.

    Raises
    ------
    RuntimeError
        If a command fails (its output's end in the message).
    """
    script = directory / "tutorial.sh"
    script.write_text(commands(), encoding="utf-8")
    done = subprocess.run(
        ["bash", script.name],
        cwd=directory,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        stop(directory / "clinics")
        raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
    return directory / "clinics"


def stop(deployment: Path) -> None:
    """``dpmarket down`` the deployment (nothing when it was never written)."""
    if (deployment / "deployment.toml").exists():
        subprocess.run(
            [sys.executable, "-m", "dpmarket.deploy.cli", "down", str(deployment)],
            env=environment(),
            capture_output=True,
            timeout=120,
        )
