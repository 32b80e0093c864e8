"""``make image`` (deploy/build-image.sh) without a Docker engine stops at once, its first line
naming the missing engine, not a registry pull."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "build-image.sh"
BASH = shutil.which("bash") or "/bin/bash"


def _build(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_without_an_engine_the_first_line_says_so(tmp_path: Path) -> None:
    done = _build({**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"})
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    if shutil.which("docker"):
        assert first.startswith("build-image: no Docker engine answers ("), first
        assert "no-engine.sock" in first and first.endswith("then make image")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "pull" not in done.stderr and not done.stdout


def test_without_a_docker_command_the_first_line_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "rm"):  # what the script runs before and after its check
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    done = _build({**os.environ, "PATH": str(bin_dir)})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "build-image: no docker command: install Docker (deploy/docker-engine.sh does, as root), "
        "then make image"
    ]
