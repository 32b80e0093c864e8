"""The package layout: no import circle, and each layer imports only the layers below it.

The import graph is read from the source with :mod:`ast`, so every import counts wherever it is
written: at module level, inside a function (imports deferred for start-up time) and under
``if TYPE_CHECKING:``. A circle hidden in a function still makes two modules depend on each other.

Layers, bottom up: ``common`` (pure kernels: no gRPC, no generated protobuf code, no services),
``runtime`` (the service runtime every party shares), the roles ``curator``, ``owner`` and
``consumer``, the parties' web ``console`` (which reads each role's own state), then
``experiments`` (reproductions and the evaluation harness) and ``deploy`` (the command line, the
launcher and the demos, which may use the experiments).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "common",
    "runtime",
    "curator",
    "owner",
    "consumer",
    "console",
    "deploy",
    "experiments",
    "bench",
)
ROLES = ("curator", "owner", "consumer")
#: The one top-level name the wheel installs: every package but ``bench`` lives under it.
NAMESPACE = "dpmarket"

#: Imports between roles the code makes on purpose: none (the point and table files every party
#: reads and writes have their home below the roles, in :mod:`dpmarket.runtime.tables`).
ALLOWED_ROLE_EDGES: set[tuple[str, str]] = set()


@dataclass
class ImportGraph:
    """Modules of the project's packages, the project modules each imports, and the top-level
    names of everything else it imports (``grpc``, ``dpmarket``, ``numpy``, ...)."""

    files: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)
    external: dict[str, set[str]] = field(default_factory=dict)


def _module_files(root: Path, packages: Iterable[str], namespace: str = "") -> dict[str, Path]:
    """Module name -> file; every package but the benchmarks installs under ``namespace``."""
    files = {}
    for package in packages:
        prefix = f"{namespace}." if namespace and package != "bench" else ""
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[prefix + ".".join(parts)] = path
    return files


def _imported_names(module: str, is_package: bool, tree: ast.AST) -> list[str]:
    """Every dotted name the module imports, with ``from X import Y`` giving ``X.Y`` (which is
    ``X``'s submodule or a name in ``X``: :func:`build_graph` resolves which)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def build_graph(root: Path, packages: Iterable[str], namespace: str = "") -> ImportGraph:
    """Read every module of ``packages`` under ``root`` (installed under ``namespace``) and
    resolve its imports."""
    graph = ImportGraph(_module_files(root, packages, namespace))
    for module, path in graph.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets, external = set(), set()
        for name in _imported_names(module, path.name == "__init__.py", tree):
            resolved = name
            while resolved and resolved not in graph.files:
                resolved = resolved.rpartition(".")[0]
            if resolved:
                if resolved != module:
                    targets.add(resolved)
            else:
                external.add(name)
        graph.edges[module] = targets
        graph.external[module] = external
    return graph


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import circle of the graph as ``[a, b, ..., a]``, or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found is not None:
                return found
    return None


def _package(module: str) -> str:
    """The layer of a project module: its folder (``dpmarket.owner.cli`` -> ``owner``)."""
    return module.removeprefix(f"{NAMESPACE}.").split(".")[0]


def _violations(graph: ImportGraph, importer: str, forbidden: Iterable[str]) -> list[str]:
    """``importer``'s imports of a module in (or under) one of ``forbidden``."""
    bad = []
    for module in sorted(m for m in graph.files if _package(m) == importer):
        tops = [(t, _package(t)) for t in graph.edges[module]]
        tops += [(t, t.split(".")[0]) for t in graph.external[module]]
        for target, top in sorted(tops):
            if top in forbidden or any(top.startswith(f"{f}_") for f in forbidden):
                bad.append(f"{module} -> {target}")
    return bad


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph(REPO, PACKAGES, NAMESPACE)


def test_the_graph_reads_every_kind_of_import(tmp_path: Path) -> None:
    """Known answer on a package written here: module-level, relative, in-function and
    TYPE_CHECKING imports are all edges, and the circle they close is found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\nimport grpc\n")
    (package / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\ng = 1\n"
    )
    (package / "d.py").write_text("import pkg.c\n")
    small = build_graph(tmp_path, ["pkg"])
    assert small.edges == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a"},
        "pkg.d": {"pkg.c"},
    }
    assert small.external["pkg.a"] == {"grpc"}
    assert find_cycle(small.edges) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_the_graph_covers_the_project(graph: ImportGraph) -> None:
    found = {_package(m) for m in graph.files}
    assert found == set(PACKAGES)
    # A few edges that must be seen, one of each kind (guards against a graph that reads nothing).
    assert "dpmarket.runtime.transport" in graph.edges["dpmarket.runtime.serving"]  # module level
    assert "dpmarket.deploy.launcher" in graph.edges["dpmarket.deploy.demo_cli"]  # in a function
    endpoints = graph.edges["dpmarket.common.summarization.endpoints"]
    assert "dpmarket.common.summarization.terms" in endpoints  # typing


def test_no_import_circle(graph: ImportGraph) -> None:
    cycle = find_cycle(graph.edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_common_imports_no_service_code(graph: ImportGraph) -> None:
    forbidden = ("runtime", *ROLES, "deploy", "experiments", "bench", "grpc", "dpmarket")
    bad = _violations(graph, "common", forbidden)
    bad += [
        f"{m} -> {t}"
        for m in graph.files
        if _package(m) == "common"
        for t in graph.external[m]
        if "_pb2" in t
    ]
    assert not bad, "common must stay pure:\n" + "\n".join(bad)


def test_runtime_imports_no_role(graph: ImportGraph) -> None:
    bad = _violations(graph, "runtime", (*ROLES, "deploy", "experiments", "bench"))
    assert not bad, "the runtime is below every role:\n" + "\n".join(bad)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_imports_no_other_role_nor_deploy(graph: ImportGraph, role: str) -> None:
    bad = _violations(graph, role, ("deploy", "experiments", "bench"))
    for module in sorted(m for m in graph.files if _package(m) == role):
        for target in sorted(graph.edges[module]):
            other = _package(target)
            if other in ROLES and other != role and (role, target) not in ALLOWED_ROLE_EDGES:
                bad.append(f"{module} -> {target}")
    assert not bad, f"{role} must not import deploy, experiments or another role:\n" + "\n".join(
        bad
    )


def test_the_console_imports_neither_deploy_nor_experiments(graph: ImportGraph) -> None:
    bad = _violations(graph, "console", ("deploy", "experiments", "bench"))
    for module in sorted(m for m in graph.files if _package(m) in (*ROLES, "runtime", "common")):
        bad += [f"{module} -> {t}" for t in graph.edges[module] if _package(t) == "console"]
    assert not bad, "the console sits above the roles and below deploy:\n" + "\n".join(bad)


def test_experiments_do_not_import_deploy(graph: ImportGraph) -> None:
    bad = _violations(graph, "experiments", ("deploy", "bench"))
    assert not bad, "deploy may use the experiments, not the other way round:\n" + "\n".join(bad)


#: The deploy modules that may import the lab (dpmarket.experiments): the demos, which run on its
#: bundled data (``dpmarket demo``, ``demo-cape``, ``demo-sketch``; the lab extra).
LAB_USERS = {
    "dpmarket.deploy.demo_cli",
    "dpmarket.deploy.launcher",
    "dpmarket.deploy.cape_demo",
    "dpmarket.deploy.sketch_demo",
}


def test_only_the_demos_import_the_lab(graph: ImportGraph) -> None:
    """The product apart from the lab: no deploy module but the demos imports the experiments
    (tests/deploy/test_commands.py checks what each command loads when it runs)."""
    bad = [
        f"{m} -> {t}"
        for m in sorted(graph.files)
        if _package(m) == "deploy" and m not in LAB_USERS
        for t in sorted(graph.edges[m])
        if _package(t) == "experiments"
    ]
    assert not bad, "only the demos may import the lab:\n" + "\n".join(bad)


def test_every_import_of_the_project_goes_through_the_namespace(graph: ImportGraph) -> None:
    """``import owner.cli`` would load a second copy of a module the wheel installs as
    ``dpmarket.owner.cli`` (and, installed, fail): project code names the namespace."""
    bare = set(PACKAGES) - {"bench"}
    bad = sorted(
        f"{m} -> {t}" for m in graph.files for t in graph.external[m] if t.split(".")[0] in bare
    )
    assert not bad, f"import through {NAMESPACE}.:\n" + "\n".join(bad)
