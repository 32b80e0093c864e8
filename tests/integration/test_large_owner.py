"""An owner whose table is served partition by partition on its own Dask cluster, across real
processes (``dpmarket init`` and ``up``, mTLS, real ledgers): it answers a default request next
to owners held in memory, publishes a sketch summed over its partitions, and an owner whose
dataset cannot be read refuses to start, naming the file and the column, having charged
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dpmarket.deploy.cli import main
from dpmarket.deploy.local import down, init_deployment, up
from dpmarket.owner.ledger import LEDGER_FILE, OwnerLedger

pytestmark = pytest.mark.integration

SCHEMA = """
label = "high"

[[columns]]
name = "age"
type = "integer"
low = 0
high = 120

[[columns]]
name = "bmi"
low = 10
high = 70

[[columns]]
name = "bp"
low = 40
high = 200

[[columns]]
name = "high"
type = "binary"
"""
SMALL = ("young", "senior")
LARGE = "network"
LARGE_ROWS = 40_000


def _frame(rng: np.random.Generator, ages: tuple[int, int], n: int) -> pd.DataFrame:
    bmi = rng.uniform(18, 42, n).round(1)
    return pd.DataFrame(
        {
            "age": rng.integers(*ages, n),
            "bmi": bmi,
            "bp": rng.uniform(62, 133, n).round(0),
            "high": (bmi + rng.normal(0, 3, n) > 28).astype(int),
        }
    )


def _dpmarket(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), terminal_width=200)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("large-owner")
    rng = np.random.default_rng(0)
    tables = {}
    for k, owner in enumerate((*SMALL, LARGE)):
        tables[owner] = tmp / f"{owner}.csv"
        _frame(rng, (20 + 30 * k, 50 + 30 * k), 150).to_csv(tables[owner], index=False)
    _frame(rng, (40, 70), 40).to_csv(tmp / "validation.csv", index=False)
    # The large owner's real table: a directory of Parquet files, 4 row groups each.
    parts = tmp / "network"
    parts.mkdir()
    for i in range(4):
        frame = _frame(rng, (20, 90), LARGE_ROWS // 4)
        pq.write_table(
            pa.Table.from_pandas(frame, preserve_index=False),
            parts / f"part-{i}.parquet",
            row_group_size=LARGE_ROWS // 16,
        )
    root = tmp / "clinics"
    init_deployment(root, tables, label="high")
    (root / "schema.toml").write_text(SCHEMA, encoding="utf-8")
    config = root / f"owner-{LARGE}.toml"
    text = config.read_text(encoding="utf-8").replace(
        f'data = "{tables[LARGE]}"', f'data = "{parts}"'
    )
    assert str(parts) in text
    config.write_text(text + "in-memory-values = 1000\ndask-workers = 2\n", encoding="utf-8")
    up(root)
    try:
        yield root
    finally:
        down(root)


def test_the_large_owner_serves_partition_by_partition(deployment: Path) -> None:
    log = (deployment / "logs" / f"{LARGE}.log").read_text(encoding="utf-8")
    assert f"{LARGE_ROWS} points of 3 features (partitioned, on 2 Dask worker(s))" in log
    assert f"{LARGE_ROWS} rows checked" in log


def test_a_default_request_takes_points_from_the_partitioned_owner(deployment: Path) -> None:
    summary = deployment.parent / "summary.csv"
    report = deployment.parent / "report.json"
    code, output = _dpmarket(
        "request", "--config", str(deployment / "consumer.toml"),
        "--validation", str(deployment.parent / "validation.csv"), "-p", "20",
        "--gamma", "1e-3", "--allocation", "counts",
        "--out", str(summary), "--report", str(report),
    )  # fmt: skip
    assert code == 0, output
    assert "owners dropped" not in output
    frame = pd.read_csv(summary)
    assert len(frame) == 20 and LARGE in set(frame["owner"])
    parts = pd.concat(
        pd.read_parquet(p) for p in sorted((deployment.parent / "network").glob("*.parquet"))
    )
    rows = {tuple(r) for r in parts[["age", "bmi", "bp"]].to_numpy(float)}
    for _, row in frame[frame["owner"] == LARGE].iterrows():
        assert tuple(row[["age", "bmi", "bp"]].to_numpy(float)) in rows
    with OwnerLedger(deployment / "owners" / LARGE, None) as ledger:
        entries = ledger.entries()
    # Every candidate it proposed was charged before it left; the summary keeps some of them.
    assert any(e.mechanism == "raw points (candidates)" for e in entries)
    # `up` had it publish the allocation's sketch, summed over its partitions on Dask, once.
    sketches = [e for e in entries if e.mechanism.startswith("private sketch")]
    assert [e.epsilon for e in sketches] == [1.0]
    assert sum(e.points for e in entries) >= int((frame["owner"] == LARGE).sum())


def test_an_unreadable_dataset_refuses_to_start_naming_the_file(
    deployment: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in sorted((deployment.parent / "network").glob("*.parquet")):
        frame = pd.read_parquet(path)
        if path.name == "part-2.parquet":
            frame = frame.rename(columns={"bp": "blood_pressure"})
        frame.to_parquet(broken / path.name, index=False)
    data_dir = tmp_path / "state"
    code, output = _dpmarket(
        "serve-owner", "--data", str(broken), "--schema", str(deployment / "schema.toml"),
        "--data-dir", str(data_dir), "--insecure", "--in-memory-values", "1000",
        "--dask-workers", "1",
    )  # fmt: skip
    text = " ".join(output.split())
    assert code == 1
    assert "schema drift:" in text and "part-2.parquet lacks column 'bp'" in text
    # The data is checked before the ledger opens: nothing could be charged.
    if (data_dir / LEDGER_FILE).exists():
        with OwnerLedger(data_dir, None) as ledger:
            assert ledger.entries() == []
