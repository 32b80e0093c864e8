"""``dpmarket simulate`` on a user's files: an unlabeled test set, a declared sketch spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from dpmarket.deploy.cli import main
from dpmarket.deploy.launcher import sketch_declaration_toml
from dpmarket.experiments.scenarios import Scenario, write_scenario


def _files(digits: Scenario, tmp_path: Path) -> dict[str, Path]:
    files = write_scenario(digits, tmp_path / "data")
    plain = tmp_path / "target.npy"  # a plain .npy, no <stem>.labels.npy beside it
    np.save(plain, digits.test.features)
    files["plain_test"] = plain
    assert digits.domain_low is not None and digits.domain_high is not None
    spec = tmp_path / "mine.toml"
    spec.write_text(
        sketch_declaration_toml(
            "mine", digits.domain_low, digits.domain_high, frequencies=32, sigma=1.0
        ),
        encoding="utf-8",
    )
    files["spec"] = spec
    return files


def _simulate(files: dict[str, Path], tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    report = tmp_path / "report.json"
    args = [
        "simulate",
        *(a for k in ("owner-0", "owner-1", "owner-2") for a in ("--owner-data", str(files[k]))),
        "--validation", str(files["validation"]), "--seed-set", str(files["seed_set"]),
        "-p", "6", "--seed", "3", "--out", str(tmp_path / "s.npy"), "--report", str(report),
        *extra,
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output, report


def test_an_unlabeled_test_set_gives_mmd_and_no_accuracy(digits: Scenario, tmp_path: Path) -> None:
    files = _files(digits, tmp_path)
    code, output, report = _simulate(
        files, tmp_path, "--test", str(files["plain_test"]), "--method", "uniform"
    )
    assert code == 0, output
    assert "has no labels" in " ".join(output.split())
    row = json.loads(report.read_text(encoding="utf-8"))["result"]
    assert row["mmd2_test"] is not None and row["accuracy"] is None


def test_a_declared_spec_releases_every_owners_sketch_in_process(
    digits: Scenario, tmp_path: Path
) -> None:
    files = _files(digits, tmp_path)
    code, output, report = _simulate(
        files, tmp_path, "--sketch-spec", str(files["spec"]), "--sketch-seed", "4"
    )
    assert code == 0, output
    ledger = json.loads(report.read_text(encoding="utf-8"))["result"]["ledger"]
    assert ledger["candidates"]["allocation"] == "sketch"
    assert sorted(ledger["owner_sketches"]) == ["owner-0", "owner-1", "owner-2"]
    assert {s["frequencies"] for s in ledger["owner_sketches"].values()} == {32}
    # The same files and seeds give the same sketches, hence the same summary.
    first = np.load(tmp_path / "s.npy")
    assert (
        _simulate(files, tmp_path, "--sketch-spec", str(files["spec"]), "--sketch-seed", "4")[0]
        == 0
    )
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), first)


def test_sketch_options_need_a_spec_and_a_spec_names_its_map(
    digits: Scenario, tmp_path: Path
) -> None:
    files = _files(digits, tmp_path)
    code, output, _ = _simulate(files, tmp_path, "--sketch-seed", "4")
    assert code == 2 and "--sketch-spec" in output
    code, output, _ = _simulate(
        files, tmp_path, "--sketch-spec", str(files["spec"]), "--allocation-sketch-spec", "x/rff"
    )
    assert code == 2 and "'x/rff'" in output
