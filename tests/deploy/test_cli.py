"""The CLI exposes every protocol parameter and refuses bad values clearly."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dpmarket.common.summarization.methods import METHODS, PARAMETER_NAMES
from dpmarket.deploy.cli import main


@pytest.mark.parametrize("command", ["request", "simulate"])
def test_every_protocol_parameter_has_an_option(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    for name in PARAMETER_NAMES:
        assert f"--{name.replace('_', '-')}" in result.output, name
    for method in METHODS:
        assert method in result.output


def test_out_of_range_parameter_is_a_usage_error(tmp_path) -> None:
    import numpy as np

    data = tmp_path / "a.npy"
    np.save(data, np.zeros((4, 2)))
    result = CliRunner().invoke(
        main,
        ["simulate", "--owner-data", str(data), "--validation", str(data), "-p", "2",
         "--delta-owners", "0.9"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "delta_owners" in result.output


def test_scenario_sizes_the_flights_split_and_refuses_sizes_for_digits(tmp_path) -> None:
    import json

    runner = CliRunner()
    out = tmp_path / "flights"
    args = ["scenario", "flights", "--out", str(out), "--owners", "2"]
    result = runner.invoke(main, [*args, "--max-points-per-owner", "30"])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "scenario.json").read_text())
    assert [o["n_points"] for o in meta["owners"]] == [30, 30]
    assert [o["table"] for o in meta["owners"]] == [
        "owner-0-table.parquet",
        "owner-1-table.parquet",
    ]
    assert (out / "owner-1-table.parquet").is_file()
    digits = runner.invoke(
        main, ["scenario", "digits", "--out", str(tmp_path / "d"), "--owners", "2"]
    )
    assert digits.exit_code == 2 and "fixed split" in digits.output
    too_many = runner.invoke(main, [*args[:-1], "99", "--max-points-per-owner", "30"])
    assert too_many.exit_code == 2 and "n_owners" in too_many.output


def test_serve_owner_checks_its_declared_0_1_columns_before_serving(tmp_path) -> None:
    """The declaration is checked at start-up, on the owner's console (row and value named):
    the owner does not start with a declaration its table contradicts."""
    import pandas as pd

    table = tmp_path / "owner-0.parquet"
    pd.DataFrame({"x": [0.5, 1.5], "sex": [1.0, 2.0], "spam": [0.0, 1.0]}).to_parquet(table)
    base = ["serve-owner", "--insecure", "--owner-id", "o", "--data-dir", str(tmp_path / "s")]
    result = CliRunner().invoke(main, [*base, "--table", str(table), "--binary-column", "sex"])
    assert result.exit_code == 1
    assert "column 'sex' of table 'owner-0' is declared 0/1 but holds 2.0 at row 1" in result.output
    result = CliRunner().invoke(main, [*base, "--data", str(table), "--binary-column", "spam"])
    assert result.exit_code == 2 and "give --table" in result.output


@pytest.mark.parametrize("command", ["request", "simulate"])
def test_the_basics_come_first_and_each_method_has_its_section(command: str) -> None:
    """The basics (p, the method, epsilon and delta per party, the outputs) fit the first 25
    lines of an 80-column help; each method's own options follow under its own heading, and
    an option appears once."""
    from dpmarket.common.summarization.methods import (
        PrivateConfig,
        RoundsConfig,
        method_fields,
    )

    result = CliRunner().invoke(main, [command, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = "\n".join(lines[:25])
    for option in (
        "--validation",
        "--summary-size",
        "--method",
        "--epsilon-validation-total",
        "--epsilon-owners-total",
        "--delta ",
        "--seed",
        "--out",
        "--report",
        *(["--config", "--curator "] if command == "request" else ["--owner-data"]),
    ):
        assert option in head, option
    sections = {
        line[:-1]: k for k, line in enumerate(lines) if line.endswith(":") and line[0] != " "
    }
    private = sections[f"--method private: {PrivateConfig.title}"]
    rounds = sections[f"--method rounds: {RoundsConfig.title}"]
    assert lines[private + 1].lstrip().startswith("--epsilon-auction")
    assert lines[rounds + 1].lstrip().startswith("--validation-release")
    listed = [t.rstrip(",") for line in lines for t in line.split()[:2] if t.startswith("-")]
    for name in method_fields():
        assert listed.count(f"--{name.replace('_', '-')}") == 1, name


def test_an_option_of_another_method_is_refused_naming_who_reads_it(tmp_path) -> None:
    import numpy as np

    data = tmp_path / "a.npy"
    np.save(data, np.zeros((4, 2)))
    base = ["simulate", "--owner-data", str(data), "--validation", str(data), "-p", "2"]
    result = CliRunner().invoke(main, [*base, "--auction-share", "0.3"])
    assert result.exit_code == 2
    assert "--auction-share is read by --method rounds, not by --method candidates" in (
        result.output
    )
    result = CliRunner().invoke(main, [*base, "--method", "uniform", "--auction", "paper"])
    assert result.exit_code == 2
    assert "--auction is read by --method private or --method rounds" in result.output


def test_request_on_raw_units_says_how_to_rescale_before_calling_the_curator(
    tmp_path, monkeypatch
) -> None:
    """Issue 28: a validation table in raw units (house prices up to 300,000) with the default
    gamma 0.1. The gamma that fits its units (about 1e-9) lies outside the curator's default
    range, so no --gamma alone serves. ``request`` refuses before any call to the curator
    (nothing asked of an owner, nothing charged, nothing written) with a usage error that says
    to rescale every feature to [0, 1] by the schema's public bounds, in the validation set
    and every owner's table alike, and names the --gamma that fits the rescaled points. The
    control: the old ``request`` called the curator, whose refusal (after asking every owner
    for its schema) advised standardizing by each one's mean and sd and no gamma for it."""
    import numpy as np
    import pandas as pd

    from dpmarket.common.summarization.kernels import suggested_gamma
    from dpmarket.consumer import client

    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "price": rng.integers(25_000, 190_000, 40),
            "lotsize": rng.integers(1_650, 16_200, 40),
            "bedrooms": rng.integers(1, 6, 40),
        }
    )
    table.to_csv(tmp_path / "validation.csv", index=False)
    (tmp_path / "schema.toml").write_text(
        'name = "housing"\n\n'
        '[[columns]]\nname = "price"\ntype = "integer"\nlow = 0\nhigh = 300000\n\n'
        '[[columns]]\nname = "lotsize"\ntype = "integer"\nlow = 0\nhigh = 25000\n\n'
        '[[columns]]\nname = "bedrooms"\ntype = "categorical"\nlevels = [1, 2, 3, 4, 5, 6, 7]\n'
    )

    def no_call(*args: object, **kwargs: object) -> None:
        raise AssertionError("the curator was called")

    monkeypatch.setattr(client.CuratorClient, "__init__", no_call)
    out, report = tmp_path / "summary.npy", tmp_path / "report.json"
    result = CliRunner().invoke(
        main,
        ["consumer", "request", "--curator", "127.0.0.1:1", "--insecure",
         "--schema", str(tmp_path / "schema.toml"), "--validation",
         str(tmp_path / "validation.csv"), "-p", "5", "--out", str(out), "--report", str(report)],
        terminal_width=400,
    )  # fmt: skip
    assert result.exit_code == 2, (result.output, result.exception)
    text = " ".join(result.output.split())
    scaled = table.to_numpy(dtype=float) - [0.0, 0.0, 1.0]
    fits = suggested_gamma(scaled / [300_000.0, 25_000.0, 6.0])
    assert "Rescale every feature to [0, 1] by its public bounds" in text, text
    assert "every owner's table alike" in text, text
    assert f"--gamma {fits:.3g} fits" in text, text
    assert not out.exists() and not report.exists()
