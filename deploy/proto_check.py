"""Check that the committed generated protobuf modules match the ``.proto`` sources.

Run as ``python -m dpmarket.deploy.proto_check`` (``make proto-check``); exits 1 and names the stale
files when ``make proto`` would change anything.
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE = Path("dpmarket") / "v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: Path) -> None:
    """Run protoc (grpc_tools) with the mypy plugins on every source into ``out_dir``.

    Raises
    ------
    subprocess.CalledProcessError
        If protoc fails.
    """
    bin_dir = Path(sys.executable).parent
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--mypy_out={out_dir}",
            f"--mypy_grpc_out={out_dir}",
            *sources,
        ],
        check=True,
        capture_output=True,
    )


def stale_files() -> list[str]:
    """Return the generated files that are missing, extra or different from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = {p.name for p in (out / PACKAGE).iterdir() if p.name.endswith(SUFFIXES)}
        committed = {p.name for p in (PROTO_ROOT / PACKAGE).iterdir() if p.name.endswith(SUFFIXES)}
        stale = sorted(fresh ^ committed)
        for name in sorted(fresh & committed):
            if not filecmp.cmp(out / PACKAGE / name, PROTO_ROOT / PACKAGE / name, shallow=False):
                stale.append(name)
        return stale


def main() -> int:
    """Print the stale files and return 1, or return 0 when everything is up to date."""
    if shutil.which("protoc-gen-mypy", path=str(Path(sys.executable).parent)) is None:
        print("protoc-gen-mypy is not installed: run `make venv`", file=sys.stderr)
        return 1
    stale = stale_files()
    if stale:
        print("generated protobuf modules are stale, run `make proto`: " + ", ".join(stale))
        return 1
    print("generated protobuf modules are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
