"""``dpmarket sketch``, ``explore`` and ``rank-owners``: argument checks before any call."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from dpmarket.deploy.cli import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_explore_needs_owners_or_all_and_the_options_of_its_query() -> None:
    base = ("explore", "--insecure", "--curator", "127.0.0.1:9")
    code, output = _run(*base, "--query", "mean")
    assert code != 0 and "--owner NAME" in output
    code, output = _run(*base, "--query", "mean", "--owner", "a", "--all")
    assert code != 0 and "--all" in output
    code, output = _run(*base, "--query", "count", "--all")
    assert code != 0 and "range predicate" in output
    code, output = _run(*base, "--query", "count", "--all", "--where", "distance>1000")
    assert code != 0 and "COLUMN<=VALUE" in output
    code, output = _run(*base, "--query", "logreg", "--all")
    assert code != 0 and "target column" in output
    code, output = _run(*base, "--query", "median", "--all")
    assert code != 0 and "median" in output
    code, output = _run(*base, "--query", "synthetic", "--all")
    assert code != 0 and "rows (>= 1) belong to synthetic" in output
    code, output = _run(*base, "--query", "marginal", "--all")
    assert code != 0 and "1 to 3 columns" in output


def test_publish_needs_an_owner_certificate(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("a\n1\n", encoding="utf-8")
    args = ("sketch", "publish", "--curator", "127.0.0.1:9", "--table", str(table),
            "--data-dir", str(tmp_path / "state"))  # fmt: skip
    code, output = _run(*args)
    assert code != 0 and "--ca" in output and "--insecure" in output
    code, output = _run(*args, "--insecure")
    assert code != 0 and "certificate" in output


def test_rank_owners_needs_a_validation_file() -> None:
    code, output = _run("rank-owners", "--insecure", "--curator", "127.0.0.1:9")
    assert code != 0 and "--validation" in output
