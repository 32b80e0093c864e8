"""Every ``dpmarket …`` command line the documentation quotes names a command that exists: its
path through the command tree (:data:`dpmarket.deploy.cli.TREE`, then the click groups beneath)
resolves, under its current name. Only the tutorial's blocks run (``test_tutorial``): the other
pages' command lines had no check, so renamed commands lived on in them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from dpmarket.deploy.cli import ALIASES, TREE, Group, command_at

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: A word that may name a command (not an option, a placeholder, a value or a path).
_NAME = re.compile(r"[a-z][a-z0-9-]*")
#: Code spans and fenced code blocks.
_SPAN = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)


def command_lines(text: str) -> Iterator[str]:
    """The command lines of a Markdown page: every line of a code block, and every code span,
    that starts with ``dpmarket `` (after an optional ``$ ``); the listing of the command tree
    (its lines hold `` | ``) and the quoted deprecation notice are left out."""
    for block, span in _SPAN.findall(text):
        for line in block.splitlines() if block else [span]:
            line = line.strip().removeprefix("$ ")
            deprecation = line.endswith("(deprecated)")  # the notice an old name prints
            if line.startswith("dpmarket ") and " | " not in line and not deprecation:
                yield line


def unresolved(line: str) -> str | None:
    """Why the command path of ``line`` does not resolve (None: it does)."""
    words = line.split()[1:]
    entry: Group | object = TREE
    path: tuple[str, ...] = ()
    for i, word in enumerate(words):
        if not _NAME.fullmatch(word):
            return None
        old = (*path, word)
        if old in ALIASES:
            return f"{' '.join(old)} is an old name"
        if isinstance(entry, Group):
            if word not in entry.commands:
                return f"dpmarket {' '.join(path)} has no command {word!r}"
            entry, path = entry.commands[word], old
            continue
        command = command_at(*path)
        for rest in words[i:]:
            if not isinstance(command, click.Group) or not _NAME.fullmatch(rest):
                return None
            if rest not in command.commands:
                return f"dpmarket {' '.join(path)} has no command {rest!r}"
            command, path = command.commands[rest], (*path, rest)
        return None
    return None


def _paths(group: Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the tree (its groups' and commands')."""
    for name, entry in group.commands.items():
        yield (*prefix, name)
        if isinstance(entry, Group):
            yield from _paths(entry, (*prefix, name))


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_command_line_in_the_docs_names_a_command(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    bad = [f"{line!r}: {why}" for line in command_lines(text) if (why := unresolved(line))]
    assert not bad, "\n".join(bad)


def test_the_check_catches_what_it_is_for() -> None:
    """Control: a command that does not exist, one under its old name and a subcommand of a
    click group that does not exist are caught."""
    assert unresolved("dpmarket consumer cape coverage --reps 4") is not None
    assert unresolved("dpmarket serve-owner --config x.toml") == "serve-owner is an old name"
    assert unresolved("dpmarket owner ledger nope") is not None
    assert unresolved("dpmarket owner ledger init --data-dir state") is None
    assert unresolved("dpmarket lab cape-coverage --reps 400") is None
    assert list(command_lines("`dpmarket init DIR`\n```sh\n$ dpmarket up DIR\n```\n")) == [
        "dpmarket init DIR",
        "dpmarket up DIR",
    ]


def test_the_reference_s_table_of_old_names_is_the_aliases_table() -> None:
    """Each row of the reference's old-name table pairs each old name with its new one as
    :data:`ALIASES` does, and the notice it quotes is the one an old name prints."""
    text = (DOCS / "reference.md").read_text(encoding="utf-8")
    assert "`dpmarket serve-owner is now dpmarket owner serve (deprecated)`" in text
    table = text[text.index("| old | new |") :].split("\n\n", 1)[0].splitlines()[2:]
    pairs: list[tuple[str, str]] = []
    for row in table:
        olds, news = (
            [name.strip(" `…") for name in cell.split(",") if name.strip(" `…")]
            for cell in row.strip("|").split("|")
        )
        pairs += zip(olds, news, strict=True)
    assert len(pairs) >= 15
    for old, new in pairs:
        words = tuple(old.split())
        n = max(k for k in range(1, len(words) + 1) if words[:k] in ALIASES)  # the longest
        renamed = ALIASES[words[:n]]
        assert renamed is not None and (*renamed, *words[n:]) == tuple(new.split()), (old, new)


REPO = DOCS.parent
#: Old names that are no current command's word: found anywhere, not only after ``dpmarket``.
_OLD_WORDS = sorted(
    {
        old[0]
        for old in ALIASES
        if len(old) == 1 and "-" in old[0] and all(old[0] not in new for new in _paths(TREE))
    }
)


def deprecated_names(text: str) -> list[str]:
    """The lines of ``text`` that name a command by an old name (``dpmarket serve-owner``,
    ``dpmarket sketch publish``, ``serve-curator --owner``, …), but for the deprecation notice
    and table (which quote them on purpose) and the code that keeps them working."""
    patterns = [r"\bdpmarket " + re.escape(" ".join(old)) + r"(?![\w-])" for old in ALIASES]
    patterns += [r"(?<![\w-])" + re.escape(word) + r"(?![\w-])" for word in _OLD_WORDS]
    old_name = re.compile("|".join(patterns))
    keep = ("(deprecated)", "@click.command(", "_COMMANDS = (", "| `", "[serve-owner]")
    return [
        line.strip()
        for line in text.splitlines()
        if old_name.search(line) and not any(k in line for k in keep)
    ]


def test_no_message_or_doc_names_a_deprecated_command() -> None:
    """Error messages, help, docstrings, templates and docs name the commands as they are now;
    the old names live only in :data:`ALIASES` (and the reference's table of them)."""
    files = [
        p
        for pattern in ("*.py", "*.md", "*.html", "*.toml")
        for p in REPO.rglob(pattern)
        if not {".venv", "tests", ".git", "v1"} & set(p.relative_to(REPO).parts)
        and p != REPO / "deploy" / "cli.py"
    ]
    assert len(files) > 200
    found = [
        f"{p.relative_to(REPO)}: {line}"
        for p in files
        for line in deprecated_names(p.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def test_the_old_name_check_catches_them() -> None:
    """Control: the messages this check was written for."""
    assert deprecated_names("(dpmarket sketch publish --spec x)")
    assert deprecated_names('f"its owners declare 0/1 (serve-owner --binary-column)"')
    assert deprecated_names("as `dpmarket explore` computes them")
    assert not deprecated_names("as `dpmarket consumer explore` and `consumer rank-owners` do")
    assert not deprecated_names("`dpmarket serve-owner is now dpmarket owner serve (deprecated)`")
