"""``--config FILE``: one TOML file per service gives every option a key; the command line
overrides it; a key no command takes is an error; relative paths follow the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from dpmarket.deploy.cli import main
from dpmarket.runtime.cli import config_option

seen: dict[str, Any] = {}


@click.group()
def root() -> None:
    """A command tree shaped like dpmarket's."""


@root.command("serve")
@config_option
@click.option("--port", default=0, type=int)
@click.option("--data-dir", required=True, type=click.Path(file_okay=False))
@click.option("--owner", "owners", multiple=True)
@click.option("--insecure", is_flag=True)
def serve(port: int, data_dir: str, owners: tuple[str, ...], insecure: bool) -> None:
    seen.update(port=port, data_dir=data_dir, owners=owners, insecure=insecure)


@root.group("cape")
def cape() -> None:
    """A group."""


@cape.command("mean")
@config_option
@click.option("--epsilon", default=1.0, type=float)
@click.option("--feature", "features", multiple=True)
def mean(epsilon: float, features: tuple[str, ...]) -> None:
    seen.update(epsilon=epsilon, features=features)


def _run(tmp_path: Path, text: str, *args: str) -> click.testing.Result:
    path = tmp_path / "service.toml"
    path.write_text(text, encoding="utf-8")
    seen.clear()
    return CliRunner().invoke(root, [*args[:-1], "--config", str(path), *args[-1:]])


def test_every_option_has_a_key_and_relative_paths_follow_the_file(tmp_path: Path) -> None:
    result = _run(
        tmp_path, 'port = 7000\ndata-dir = "state"\nowner = ["a@h:1", "b@h:2"]\ninsecure = true\n',
        "serve", "--insecure",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert seen == {
        "port": 7000,
        "data_dir": str(tmp_path.resolve() / "state"),
        "owners": ("a@h:1", "b@h:2"),
        "insecure": True,
    }


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "service.toml"
    path.write_text('port = 7000\ndata_dir = "/abs/state"\n', encoding="utf-8")
    result = CliRunner().invoke(root, ["serve", "--config", str(path), "--port", "7001"])
    assert result.exit_code == 0, result.output
    assert seen["port"] == 7001 and seen["data_dir"] == "/abs/state"


def test_one_file_serves_several_commands_and_sections_one_command(tmp_path: Path) -> None:
    text = 'port = 7000\ndata-dir = "s"\nepsilon = 0.5\n[cape.mean]\nfeature = "bmi"\n'
    assert _run(tmp_path, text, "serve", "--insecure").exit_code == 0
    assert "epsilon" not in seen  # a key of another command is ignored by this one
    seen.clear()
    result = CliRunner().invoke(root, ["cape", "mean", "--config", str(tmp_path / "service.toml")])
    assert result.exit_code == 0, result.output
    assert seen == {"epsilon": 0.5, "features": ("bmi",)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('data-dri = "s"\n', "unknown key 'data-dri'"),
        ("[cape.mean]\nport = 1\n", "unknown key 'port' (no 'cape mean' command"),
        ("[serv]\nport = 1\n", "[serv] is not a dpmarket command"),
        ("port = [", "not valid TOML"),
    ],
)
def test_a_key_no_command_takes_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "service.toml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(root, ["serve", "--config", str(path), "--data-dir", "x"])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_required_option_may_come_from_the_file(tmp_path: Path) -> None:
    result = _run(tmp_path, "port = 1\n", "serve", "--insecure")
    assert result.exit_code == 2 and "--data-dir" in result.output


def test_every_service_command_of_dpmarket_takes_a_config() -> None:
    for command in (
        ["serve-owner"],
        ["serve-curator"],
        ["request"],
        ["health"],
        ["cape", "mean"],
        ["cape", "train"],
        ["sketch", "publish"],
        ["sketch", "list"],
        ["explore"],
        ["rank-owners"],
        ["owner", "ledger"],
    ):
        result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and "--config" in result.output, command


def test_an_owner_without_its_data_dir_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving out --data-dir once must not start a fresh ledger with the whole budget."""
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n", encoding="utf-8")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(main, ["serve-owner", "--insecure", "--data", str(table)])
    assert result.exit_code == 2 and "Missing option '--data-dir'" in result.output
    assert list(cwd.iterdir()) == []  # no state directory was created
    result = CliRunner().invoke(main, ["sketch", "publish", "--insecure", "--curator", "h:1",
                                       "--table", str(table)])  # fmt: skip
    assert result.exit_code == 2 and "Missing option '--data-dir'" in result.output


def test_an_owner_config_file_serves_its_ledger_command(tmp_path: Path) -> None:
    (tmp_path / "owner.toml").write_text(
        'data = "clinic.csv"\ndata-dir = "state"\npki-dir = "pki"\nname = "clinic"\n'
        'curator = "127.0.0.1:7000"\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(main, ["owner", "ledger", "--config", str(tmp_path / "owner.toml")])
    assert result.exit_code == 1
    assert f"{tmp_path.resolve() / 'state'} holds no owner ledger" in result.output
