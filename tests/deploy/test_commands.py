"""The ``dpmarket`` command tree (:mod:`dpmarket.deploy.cli`): the listing comes from the static
table without importing any command; a command imports only its own module; no service command
imports the lab (:mod:`dpmarket.experiments`); a lab command without the ``lab`` extra stops in
one line; the old names run the new commands after one notice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dpmarket import __version__
from dpmarket.deploy import cli
from dpmarket.deploy.cli import ALIASES, LAB_MODULES, TREE, Command, Group, command_at, main

REPO = Path(__file__).resolve().parents[2]

#: Every command a deployment runs (a party's service and tools, the PKI, the health probe and a
#: local deployment): none may import the lab.
SERVICE_COMMANDS = [
    ("owner", "serve"),
    ("owner", "publish"),
    ("owner", "published"),
    ("owner", "ledger"),
    ("owner", "ledger", "init"),
    ("owner", "ledger", "backup"),
    ("owner", "ledger", "verify"),
    ("curator", "serve"),
    ("curator", "sessions"),
    ("curator", "charges"),
    ("consumer", "request"),
    ("consumer", "explore"),
    ("consumer", "rank-owners"),
    ("consumer", "specs"),
    ("consumer", "sketches"),
    ("consumer", "sessions"),
    ("consumer", "cape", "mean"),
    ("consumer", "cape", "linreg"),
    ("consumer", "cape", "logreg"),
    ("consumer", "cape", "train"),
    ("pki", "init"),
    ("pki", "issue"),
    ("pki", "show"),
    ("pki", "peers"),
    ("health",),
    ("init",),
    ("up",),
    ("down",),
]

#: Runs each command line given as a JSON list on stdin, in this one interpreter, and prints after
#: each the watched modules it has loaded so far (a command that loads one is the first to show it).
_PROBE = """
import json, sys
from dpmarket.deploy.cli import main
watched = ("numpy", "pandas", "scipy", "sklearn", "grpc", "dpmarket.experiments", "dpmarket.owner",
           "dpmarket.curator", "dpmarket.consumer")
for argv in json.loads(sys.stdin.read()):
    try:
        main(argv, prog_name="dpmarket")
    except SystemExit as exit:
        assert not exit.code, (argv, exit.code)
    loaded = sorted(w for w in watched if any(m == w or m.startswith(w + ".") for m in sys.modules))
    print("PROBE", json.dumps(loaded))
"""


def _probe(*argvs: list[str], env: dict[str, str] | None = None) -> list[list[str]]:
    """The watched modules loaded after each command line, run in turn in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    return [json.loads(line.removeprefix("PROBE ")) for line in lines]


def _entries(
    group: Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Command | Group]]:
    for name, entry in group.commands.items():
        yield (*path, name), entry
        if isinstance(entry, Group):
            yield from _entries(entry, (*path, name))


def test_the_listing_imports_no_command() -> None:
    (top, owner) = _probe(["--help"], ["owner", "--help"])
    assert top == []  # click and the table: no numerical library, no grpc, no party
    assert owner == []


def test_the_health_probe_and_the_pki_load_no_party() -> None:
    """Every container runs the probe every few seconds; the pki job runs once per identity."""
    health, pki = _probe(["health", "--help"], ["pki", "issue", "--help"])
    for loaded in (health, pki):
        assert "numpy" not in loaded and "pandas" not in loaded and "scipy" not in loaded
        assert not any(m.startswith("dpmarket.") for m in loaded), loaded


def test_a_command_s_help_loads_neither_scikit_learn_nor_pandas() -> None:
    """``--help`` of a party's command reads no table and fits no model: the packages it imports
    (the market's money, the methods' options) must not pull them in."""
    argvs = [["owner", "serve", "--help"], ["consumer", "request", "--help"]]
    for argv, loaded in zip(argvs, _probe(*argvs), strict=True):
        assert "sklearn" not in loaded and "pandas" not in loaded, (argv, loaded)


def test_no_service_command_imports_the_lab(tmp_path: Path) -> None:
    """Each service command's help, then a configuration file read by one (which loads every
    command that takes --config, to check the file's keys), in a fresh interpreter."""
    config = tmp_path / "consumer.toml"
    config.write_text('curator = "127.0.0.1:1"\n[request]\nsummary-size = 3\n', encoding="utf-8")
    argvs = [[*path, "--help"] for path in SERVICE_COMMANDS]
    argvs.append(["consumer", "request", "--config", str(config), "--help"])
    loaded = _probe(*argvs)
    assert len(loaded) == len(argvs)
    for argv, modules in zip(argvs, loaded, strict=True):
        assert "dpmarket.experiments" not in modules, f"dpmarket {' '.join(argv)} loads the lab"


def _messages(log: Path) -> str:
    """The log's lines but the import times."""
    return "\n".join(x for x in log.read_text().splitlines() if not x.startswith("import time"))


def test_an_owner_starts_and_serves_without_the_lab(tmp_path: Path) -> None:
    """A real start-up (the configuration file, the data, the ledger, the gRPC server), with
    every import logged by ``python -X importtime``."""
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n5,6\n", encoding="utf-8")
    (tmp_path / "owner.toml").write_text(
        'data = "t.csv"\ndata-dir = "state"\ninsecure = true\nowner-id = "t"\nport = 0\n'
        'port-file = "port"\n',
        encoding="utf-8",
    )
    config = ["--config", str(tmp_path / "owner.toml")]
    init = [sys.executable, "-m", "dpmarket", "owner", "ledger", "init", *config]
    subprocess.run(init, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    log = tmp_path / "imports.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "dpmarket", "owner", "serve", *config],
            stdout=subprocess.DEVNULL, stderr=stderr, cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "port").exists() and process.poll() is None:
            assert time.monotonic() < deadline, _messages(log)
            time.sleep(0.2)
        assert process.poll() is None, _messages(log)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    imported = re.findall(r"\|\s+(dpmarket[\w.]*)\s*$", log.read_text(), flags=re.MULTILINE)
    assert "dpmarket.owner.service" in imported  # the log holds the service's imports
    assert not [m for m in imported if m.startswith("dpmarket.experiments")]


def test_every_command_of_the_table_loads_and_says_if_it_takes_a_config() -> None:
    ctx = click.Context(main)
    for path, entry in _entries(TREE):
        command = command_at(*path)
        assert isinstance(command, click.Command), path
        if isinstance(entry, Group):
            continue

        def takes_config(c: click.Command) -> bool:
            if any(p.name == "config" for p in c.params):
                return True
            if isinstance(c, click.Group):
                return any(takes_config(s) for s in c.commands.values())
            return False

        assert entry.config == takes_config(command), path
        assert entry.help and len(entry.help) <= 64, path
    assert main.list_commands(ctx) == list(TREE.commands)
    listed = {n for _, names in TREE.sections for n in names}
    assert listed == set(TREE.commands)


def test_old_names_run_the_new_commands_after_one_notice() -> None:
    for old, new in ALIASES.items():
        result = CliRunner().invoke(main, [*old, "--help"], prog_name="dpmarket")
        if new is None:
            assert result.exit_code == 2 and "split by party" in result.output, old
            continue
        assert result.exit_code == 0, (old, result.output)
        assert result.stderr == (
            f"dpmarket {' '.join(old)} is now dpmarket {' '.join(new)} (deprecated)\n"
        )
        assert result.stdout.startswith(f"Usage: dpmarket {' '.join(new)} "), old
        assert len(result.stderr) <= 81  # one line in 80 columns
        assert command_at(*old) is command_at(*new)
    # An old name's second word: `cape mean` is `consumer cape mean`.
    assert command_at("cape", "mean") is command_at("consumer", "cape", "mean")


def test_a_config_section_may_name_a_command_old_or_new(tmp_path: Path) -> None:
    """``[request]`` and ``[consumer.request]`` both set ``consumer request``'s options;
    ``[sketch.publish]`` an owner's publication."""
    from dpmarket.runtime import cli as runtime_cli

    for text in ("[request]\nsummary-size = 7\n", "[consumer.request]\nsummary-size = 7\n"):
        path = tmp_path / "c.toml"
        path.write_text(text, encoding="utf-8")
        command = command_at("consumer", "request")
        root = click.Context(main, info_name="dpmarket")
        group = click.Context(command_at("consumer"), info_name="consumer", parent=root)
        ctx = click.Context(command, info_name="request", parent=group)
        config = next(p for p in command.params if p.name == "config")
        runtime_cli._load_config(ctx, config, str(path))
        assert ctx.default_map is not None and ctx.default_map["summary_size"] == 7, text
    path = tmp_path / "o.toml"
    path.write_text("[sketch.publish]\nseed = 3\n[sketch]\nx = 1\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["owner", "publish", "--config", str(path)])
    assert result.exit_code == 2 and "[sketch] is not a dpmarket command" in result.output


def test_a_lab_command_without_the_extra_stops_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "LAB_MODULES", (*LAB_MODULES, "dpmarket_no_such_module"))
    for argv, path in (
        (["lab", "scenario", "digits"], "lab scenario"),
        (["demo"], "demo"),
        (["simulate", "--help"], "lab simulate"),
    ):
        result = CliRunner().invoke(main, argv, prog_name="dpmarket")
        assert result.exit_code == 1, argv
        assert result.stderr.splitlines()[-1] == (
            f"Error: dpmarket {path} needs the lab extra (dpmarket_no_such_module is not "
            "installed): pip install 'dpmarket[lab]'"
        )
        assert result.stdout == ""


def test_the_lab_extra_installs_the_lab_modules() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    lab = pyproject["project"]["optional-dependencies"]["lab"]
    names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in lab}
    assert names == set(LAB_MODULES)
    assert not names & {
        re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in pyproject["project"]["dependencies"]
    }


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"dpmarket {__version__}\n"
    done = subprocess.run(
        [sys.executable, "-m", "dpmarket", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.stdout == f"dpmarket {__version__}\n"
