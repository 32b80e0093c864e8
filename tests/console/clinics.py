"""The tutorial's deployment, for the console's browser tests and benchmark: docs/tutorial.md's
commands, as written, up to the clinics' sketches (three clinics, a curator and a consumer over
mTLS; every clinic's allocation sketch published by ``dpmarket up``; one summary requested with
``dpmarket consumer request``; every clinic's HIST, RFF and marginals sketches published), in a
fresh directory; or every command but the last, ``dpmarket down`` (:data:`BEFORE_DOWN`), which
:func:`run_last_blocks` then runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
#: The last tutorial command this deployment runs (the blocks after it are not run).
LAST = "dpmarket owner publish"
#: The last command of the whole tutorial but its final block (``dpmarket down clinics``).
BEFORE_DOWN = "dpmarket owner earnings"
#: Seconds the commands may take (about a minute, up to the sketches, on 2 shared cores).
TIMEOUT_SECONDS = 600
#: The sign-in line a console prints when it first starts: its address (scheme, host, port and
#: secret path) and its token.
SIGN_IN = re.compile(r"sign in at (https?://[^/\s]+/[^/\s]+)/login .*\): (\S+)\s*$")


def environment() -> dict[str, str]:
    """The environment the tutorial's commands run in: this interpreter's ``dpmarket`` first."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    return env


def _blocks() -> list[str]:
    """The tutorial's ``sh`` blocks, in order."""
    text = TUTORIAL.read_text(encoding="utf-8")
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def _through(last: str) -> int:
    """How many blocks run up to the first one running ``last``, that one included."""
    return next(k for k, block in enumerate(_blocks()) if last in block) + 1


def commands(last: str = LAST) -> str:
    """The tutorial's ``sh`` blocks up to the one running ``last``."""
    return "set -euo pipefail\n" + "\n".join(_blocks()[: _through(last)])


def _run_script(directory: Path, name: str, script: str) -> subprocess.CompletedProcess[str]:
    (directory / name).write_text(script, encoding="utf-8")
    return subprocess.run(
        ["bash", name],
        cwd=directory,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )


def run_tutorial(directory: Path, last: str = LAST) -> subprocess.CompletedProcess[str]:
    """Run the tutorial's blocks up to the one running ``last`` in ``directory``, as one
    ``bash -euo pipefail`` script; return the finished script (its output captured). The
    deployment is ``directory / "clinics"``; stop it with :func:`stop` (also when the script
    failed: it may have started services)."""
    return _run_script(directory, "tutorial.sh", commands(last))


def run_last_blocks(directory: Path, last: str) -> subprocess.CompletedProcess[str]:
    """Run, in ``directory``, the tutorial's blocks after the one running ``last`` (after
    :func:`run_tutorial` with that ``last``): with :data:`BEFORE_DOWN`, its last block,
    ``dpmarket down clinics``."""
    rest = _blocks()[_through(last) :]
    return _run_script(directory, "tutorial-end.sh", "set -euo pipefail\n" + "\n".join(rest))


def deploy(directory: Path) -> Path:
    """Run the tutorial up to the sketches in ``directory``; return the deployment's folder
    (``directory / "clinics"``). Stop it with :func:`stop`.

    Raises
    ------
    RuntimeError
        If a command fails (its output's end in the message).
    """
    done = run_tutorial(directory)
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
