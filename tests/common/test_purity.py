"""``dpmarket.common`` is pure: importing any of its packages loads no gRPC, no generated
protobuf code and no service (the import graph of tests/test_layout.py checks the source; this
checks what a fresh interpreter actually loads, lazy imports of dependencies included)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = ("cape", "market", "privacy", "secagg", "sketches", "summarization")


@pytest.mark.parametrize("package", PURE)
def test_importing_a_kernel_package_loads_no_service_code(package: str) -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module('dpmarket.common.{package}')\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or (\n"
        "    m.startswith('dpmarket.') and m.split('.')[1] != 'common'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"dpmarket.common.{package} loads {out.stdout.strip()}"


def test_the_check_sees_service_code() -> None:
    """Control: the same check flags a package that does load the service runtime."""
    code = (
        "import sys, dpmarket.runtime.serving\n"
        "print(any(m.split('.')[0] == 'grpc' for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
