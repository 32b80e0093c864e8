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


class _CuratorCalled(Exception):
    """Raised by a stand-in for the curator's client: the request got past its own checks."""


def _raw_housing(tmp_path, monkeypatch):
    """A validation table in raw units (house prices up to 300,000), its schema, and a
    ``request`` runner whose curator client raises :class:`_CuratorCalled` when created."""
    import numpy as np
    import pandas as pd

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

    def called(*args: object, **kwargs: object) -> None:
        raise _CuratorCalled

    monkeypatch.setattr(client.CuratorClient, "__init__", called)
    out, report = tmp_path / "summary.npy", tmp_path / "report.json"

    def request(*extra: str):
        return CliRunner().invoke(
            main,
            ["consumer", "request", "--curator", "127.0.0.1:1", "--insecure", "--validation",
             str(tmp_path / "validation.csv"), "-p", "5", "--out", str(out), "--report",
             str(report), *extra],
            terminal_width=400,
        )  # fmt: skip

    return table, request, out, report


def test_request_on_raw_units_with_a_schema_reads_the_kernel_in_scaled_units(
    tmp_path, monkeypatch
) -> None:
    """Issue 28, then the kernel in bounds-scaled units: a validation table in raw units (house
    prices up to 300,000) read through a schema with the default gamma 0.1 passes ``request``'s
    own kernel check, which reads every feature scaled to [0, 1] by the schema's bounds as the
    session does: the request goes on to the curator. A gamma that cannot tell the scaled points
    apart is refused before any call, naming the gamma of the scaled units. Control: main
    refused the first request (exit status 2, "Rescale every feature to [0, 1] by its public
    bounds ... in every owner's table alike") before calling the curator."""
    from dpmarket.common.summarization.kernels import suggested_gamma

    table, request, out, report = _raw_housing(tmp_path, monkeypatch)
    schema = ("--schema", str(tmp_path / "schema.toml"))
    result = request(*schema)
    assert isinstance(result.exception, _CuratorCalled), (result.output, result.exception)
    result = request(*schema, "--gamma", "1e4")
    assert result.exit_code == 2, (result.output, result.exception)
    text = " ".join(result.output.split())
    scaled = (table.to_numpy(dtype=float) - [0.0, 0.0, 1.0]) / [300_000.0, 25_000.0, 6.0]
    fits = suggested_gamma(scaled)
    assert f"= {fits:.3g} (in units of each feature scaled to [0, 1] by its schema bounds)" in text
    assert not out.exists() and not report.exists()


def test_request_on_raw_units_without_a_schema_says_to_declare_the_bounds(
    tmp_path, monkeypatch
) -> None:
    """Without a schema the kernel reads the raw units, where the gamma that fits (about 1e-9)
    lies outside the curator's default range: ``request`` refuses before any call to the
    curator (nothing asked of an owner, nothing charged, nothing written) and says to read the
    tables through a schema that declares each feature's public bounds, naming the raw-unit
    gamma only for a curator whose range holds it. Control: main told the user to rescale every
    feature by hand in the validation set and every owner's table alike."""
    _, request, out, report = _raw_housing(tmp_path, monkeypatch)
    result = request()
    assert result.exit_code == 2, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert "The features' scale is the problem" in text, text
    assert "a schema that declares each feature's public bounds (--schema" in text, text
    assert "every owner's table alike" not in text, text
    assert not out.exists() and not report.exists()
