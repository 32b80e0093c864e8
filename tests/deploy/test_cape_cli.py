"""``dpmarket cape``: argument checks before any call to a curator."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from dpmarket.deploy.cli import main


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["cape", "linreg", "--insecure", *args])
    return result.exit_code, result.output


def test_a_fit_needs_features_and_a_target() -> None:
    code, output = _run("--curator", "127.0.0.1:9", "--feature", "carat=0:6")
    assert code != 0 and "the target" in output


def test_a_bound_must_be_column_low_high() -> None:
    code, output = _run("--curator", "127.0.0.1:9", "--feature", "carat", "--target", "y=0:1")
    assert code != 0 and "COLUMN=LOW:HIGH" in output
    code, output = _run("--curator", "127.0.0.1:9", "--feature", "carat=6:0", "--target", "y=0:1")
    assert code != 0 and "low < high" in output


SCHEMA = """
[[columns]]
name = "carat"
low = 0
high = 6

[[columns]]
name = "depth"
type = "integer"
low = 40
high = 80
"""


def test_a_fit_needs_a_target_or_a_schema_label(tmp_path: Path) -> None:
    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA, encoding="utf-8")
    code, output = _run("--curator", "127.0.0.1:9", "--bounds", str(schema))
    assert code != 0 and "the target" in output


def test_the_old_bounds_layout_is_refused_with_the_new_one_named(tmp_path: Path) -> None:
    bounds = tmp_path / "bounds.toml"
    bounds.write_text("[features]\ncarat = [0, 6]\n[target]\nprice = [0, 1]\n", encoding="utf-8")
    code, output = _run("--curator", "127.0.0.1:9", "--bounds", str(bounds))
    assert code != 0 and "[[columns]]" in output and "label = COLUMN" in output


def test_a_feature_named_without_bounds_takes_them_from_the_schema(tmp_path: Path) -> None:
    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA, encoding="utf-8")
    code, output = _command("mean", "--schema", str(schema), "--feature", "price")
    assert code != 0 and "no column 'price'" in output and "carat, depth" in output


def test_epsilon_must_be_positive() -> None:
    code, output = _run(
        "--curator", "127.0.0.1:9", "--feature", "a=0:1", "--target", "y=0:1", "--epsilon", "0"
    )
    assert code != 0 and "epsilon" in output.lower()


def _command(command: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["cape", command, "--insecure", "--curator", "127.0.0.1:9", *args]
    )
    return result.exit_code, result.output


def test_a_mean_needs_columns_with_bounds() -> None:
    code, output = _command("mean")
    assert code != 0 and "--bounds or --feature" in output
    code, output = _command("mean", "--feature", "carat=0:6", "--feature", "carat=0:7")
    assert code != 0 and "distinct" in output


def test_a_mean_reads_the_columns_of_a_bounds_file_without_a_target(tmp_path: Path) -> None:
    bounds = tmp_path / "bounds.toml"
    bounds.write_text(SCHEMA, encoding="utf-8")
    code, output = _command("mean", "--bounds", str(bounds), "--feature", "depth=x:1")
    assert code != 0 and "'depth=x:1'" in output  # the file was read; the bad option named


def test_a_training_needs_a_label_and_positive_hyper_parameters() -> None:
    code, output = _command("train", "--feature", "a=0:1")
    assert code != 0 and "--target" in output
    for option, value in (
        ("--iterations", "0"),
        ("--hidden-units", "0"),
        ("--learning-rate", "0"),
        ("--clip-norm", "-1"),
    ):
        code, output = _command("train", "--feature", "a=0:1", "--target", "y", option, value)
        assert code != 0 and option in output, option
