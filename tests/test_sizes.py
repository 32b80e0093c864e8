"""The size of the protocol packages' functions and classes, read from the source with :mod:`ast`.

The rule (issue 26), for every module of ``common``, ``runtime``, ``owner``, ``curator`` and
``consumer``:

* **a function** (a method, a nested function) has at most :data:`MAX_FUNCTION_LINES` lines, counted
  from its ``def`` line to its last line, its docstring left out (a numpydoc docstring may be as
  long as its shapes, units, errors and sources need; decorators are not counted either);
* **a class** has at most :data:`MAX_PUBLIC_METHODS` public methods: the functions defined in its
  body whose name does not start with ``_``; properties are attributes, not counted.

A function or class may be larger when its docstring says why, on a line of its own that starts
with ``Size:``, e.g.::

    Size: one step of the protocol, whose checks must run in this order before any release;
    split, each part would have to re-establish what the previous one checked.

The reason must be specific to that code (why splitting would make it harder to read or to trust),
never "legacy" or "big". :data:`ALLOWED` would list code over the rule without such a reason;
it is empty and a test fails on an entry that does not need to be there.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "runtime", "owner", "curator", "consumer")
MAX_FUNCTION_LINES = 80
MAX_PUBLIC_METHODS = 20
#: The marker of a reason, at the start of a docstring line.
REASON = "Size:"

#: Code over the rule with no reason in its docstring yet, by ``path:qualified.name``: empty, and it
#: may only stay so (new code over the rule is split, or says why in a ``Size:`` line).
ALLOWED: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Oversized:
    """A function or class over the rule, as ``path:qualified.name`` with what it measures."""

    key: str
    measure: str
    has_reason: bool


def _docstring_and_its_lines(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
) -> tuple[str, int]:
    """The docstring of ``node`` ('' when none) and how many source lines it takes."""
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        first = body[0]
        assert first.end_lineno is not None
        return body[0].value.value, first.end_lineno - first.lineno + 1
    return "", 0


def _has_reason(docstring: str) -> bool:
    return any(line.strip().startswith(REASON) for line in docstring.splitlines())


def _is_property(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id in ("property", "cached_property"):
            return True
        if isinstance(decorator, ast.Attribute) and decorator.attr in (
            "setter",
            "deleter",
            "cached_property",
        ):
            return True
    return False


def oversized(tree: ast.AST, path: str) -> Iterator[Oversized]:
    """Every function and class of a module's tree over the rule (module docstring)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[Oversized]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                docstring, doc_lines = _docstring_and_its_lines(child)
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1 - doc_lines
                if lines > MAX_FUNCTION_LINES:
                    yield Oversized(
                        f"{path}:{prefix}{child.name}", f"{lines} lines", _has_reason(docstring)
                    )
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                docstring, _ = _docstring_and_its_lines(child)
                public = [
                    c
                    for c in child.body
                    if isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not c.name.startswith("_")
                    and not _is_property(c)
                ]
                if len(public) > MAX_PUBLIC_METHODS:
                    yield Oversized(
                        f"{path}:{prefix}{child.name}",
                        f"{len(public)} public methods",
                        _has_reason(docstring),
                    )
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


@pytest.fixture(scope="module")
def found() -> list[Oversized]:
    out: list[Oversized] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            out += oversized(tree, path.relative_to(REPO).as_posix())
    return out


def test_no_function_or_class_is_over_the_size_rule_without_a_reason(
    found: list[Oversized],
) -> None:
    unexplained = [o for o in found if not o.has_reason and o.key not in ALLOWED]
    assert not unexplained, (
        "over the size rule with no 'Size:' line in the docstring (tests/test_sizes.py): split "
        "them, or say why not: " + "; ".join(f"{o.key} ({o.measure})" for o in unexplained)
    )


def test_the_allow_list_only_holds_code_still_over_the_rule(found: list[Oversized]) -> None:
    still = {o.key for o in found if not o.has_reason}
    stale = sorted(ALLOWED - still)
    assert not stale, f"remove from tests/test_sizes.py's allow-list (now within the rule): {stale}"


def test_the_rule_counts_what_it_says() -> None:
    """A control: an 81-line function, a 21-method class and each with a reason."""
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    long_function = f'def f():\n    """Doc\n\n    over two lines."""\n{body}\n'
    methods = "\n".join(f"    def m{i}(self): pass" for i in range(21))
    wide_class = f"class C:\n{methods}\n    @property\n    def p(self): pass\n"
    found = {o.key: o for o in oversized(ast.parse(long_function + wide_class), "m.py")}
    assert found["m.py:f"].measure == "81 lines" and not found["m.py:f"].has_reason
    assert found["m.py:C"].measure == "21 public methods" and not found["m.py:C"].has_reason
    short = f"def g():\n{chr(10).join(body.splitlines()[:79])}\n"
    assert not list(oversized(ast.parse(short), "m.py"))
    reasoned = long_function.replace("over two lines.", "Size: the reason.")
    assert next(iter(oversized(ast.parse(reasoned), "m.py"))).has_reason
