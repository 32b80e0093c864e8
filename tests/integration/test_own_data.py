"""One's own data across real processes (``dpmarket init`` and ``up``, mTLS, real ledgers): the
schema mismatch and the reordered validation columns a newcomer hit, now refused or handled."""

from __future__ import annotations

import json
import os
import signal
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from dpmarket.common.summarization.kernels import mmd2
from dpmarket.common.summarization.rff import draw_rff_params
from dpmarket.deploy.cli import main
from dpmarket.deploy.local import CURATOR, down, init_deployment, service_pki_dir, up
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

pytestmark = pytest.mark.integration

CONFIRMED = """
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
OWNERS = ("young", "middle", "senior")


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


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("own-data")
    rng = np.random.default_rng(0)
    tables = {}
    for k, owner in enumerate(OWNERS):
        tables[owner] = tmp / f"{owner}.csv"
        _frame(rng, (20 + 20 * k, 40 + 20 * k), 120).to_csv(tables[owner], index=False)
    _frame(rng, (50, 70), 30).to_csv(tmp / "validation.csv", index=False)
    root = tmp / "clinics"
    init_deployment(root, tables, label="high")
    (root / "schema.toml").write_text(CONFIRMED, encoding="utf-8")
    up(root)
    try:
        yield root
    finally:
        down(root)


def _dpmarket(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), terminal_width=200)
    return result.exit_code, result.output


def _charges(root: Path) -> int:
    total = 0
    for owner in OWNERS:
        with OwnerLedger(root / "owners" / owner, None) as ledger:
            total += len(ledger.entries())
    return total


def test_a_consumer_schema_unlike_the_owners_is_refused_naming_the_column(
    deployment: Path,
) -> None:
    other = deployment.parent / "wider.toml"
    other.write_text(CONFIRMED.replace("high = 70", "high = 80"), encoding="utf-8")
    before = _charges(deployment)
    code, output = _dpmarket(
        "request", "--config", str(deployment / "consumer.toml"), "--schema", str(other),
        "--validation", str(deployment.parent / "validation.csv"), "-p", "10",
        "--gamma", "1e-3", "--out", str(deployment.parent / "s.csv"),
        "--report", str(deployment.parent / "r.json"),
    )  # fmt: skip
    assert code == 1
    assert (
        "the schemas differ: column 'bmi': the consumer declares bmi (continuous in [10, 80]), "
        "owner young bmi (continuous in [10, 70])"
    ) in " ".join(output.split())
    code, output = _dpmarket(
        "cape", "mean", "--config", str(deployment / "consumer.toml"), "--schema", str(other),
        "--feature", "bmi", "--out", str(deployment.parent / "m.json"),
    )  # fmt: skip
    assert code == 1 and "the schemas differ: column 'bmi'" in " ".join(output.split())
    assert _charges(deployment) == before  # refused before anything was charged


def test_validation_columns_in_another_order_are_reordered_by_the_schema(
    deployment: Path,
) -> None:
    validation = pd.read_csv(deployment.parent / "validation.csv")
    reordered = deployment.parent / "reordered.csv"
    validation[["bp", "high", "bmi", "age"]].to_csv(reordered, index=False)
    summary = deployment.parent / "summary.csv"
    code, output = _dpmarket(
        "request", "--config", str(deployment / "consumer.toml"),
        "--validation", str(reordered), "-p", "10", "--gamma", "1e-3",
        "--out", str(summary), "--report", str(deployment.parent / "r.json"),
    )  # fmt: skip
    assert code == 0, output
    frame = pd.read_csv(summary)
    assert list(frame.columns) == ["age", "bmi", "bp", "high", "owner"]
    assert len(frame) == 10 and set(frame["owner"]) <= set(OWNERS)
    # Every summary point is a row of the owner it names, in the schema's column order.
    for _, row in frame.iterrows():
        table = pd.read_csv(deployment.parent / f"{row['owner']}.csv")
        matches = table[["age", "bmi", "bp"]].to_numpy() == row[["age", "bmi", "bp"]].to_numpy(
            float
        )
        assert matches.all(axis=1).any()


def test_validation_columns_in_another_order_without_a_schema_are_refused(
    deployment: Path,
) -> None:
    validation = pd.read_csv(deployment.parent / "validation.csv")
    reordered = deployment.parent / "reordered-features.csv"
    validation[["bmi", "age", "bp"]].to_csv(reordered, index=False)
    consumer = (deployment / "consumer.toml").read_text(encoding="utf-8")
    (deployment / "no-schema.toml").write_text(
        consumer.replace('schema = "schema.toml"', ""), encoding="utf-8"
    )
    before = _charges(deployment)
    code, output = _dpmarket(
        "request", "--config", str(deployment / "no-schema.toml"),
        "--validation", str(reordered), "-p", "10", "--gamma", "1e-3",
        "--out", str(deployment.parent / "s.csv"), "--report", str(deployment.parent / "r.json"),
    )  # fmt: skip
    assert code == 1
    assert "column 1 is 'bmi' in the validation set but 'age' in the owners' schema" in " ".join(
        output.split()
    )
    assert _charges(deployment) == before


def _epsilon_spent(root: Path) -> dict[str, float]:
    spent = {}
    for owner in OWNERS:
        with OwnerLedger(root / "owners" / owner, None) as ledger:
            spent[owner] = ledger.window_totals().epsilon
    return spent


def test_up_published_each_allocation_sketch_once_and_a_request_splits_by_it(
    deployment: Path,
) -> None:
    """``init`` + ``up``: every owner's sketch under the curator's allocation spec is in the
    catalogue, charged ε 1 once to the owner's own ledger; a default request splits its budget
    by them, says so, and charges no owner any ε (its ledgers agree); a second ``up``
    publishes nothing and charges nothing. Control: the same request splitting by noisy counts
    charges every owner ε 1."""
    code, output = _dpmarket("consumer", "sketches", "--config", str(deployment / "consumer.toml"),
                             "--spec", "clinics-allocation/rff", "--json")  # fmt: skip
    assert code == 0, output
    listed = json.loads(output)["sketches"]
    assert sorted(r["owner"] for r in listed) == sorted(OWNERS)
    assert {r["epsilon"] for r in listed} == {1.0}
    for owner in OWNERS:
        with OwnerLedger(deployment / "owners" / owner, None) as ledger:
            sketches = [e for e in ledger.entries() if e.mechanism.startswith("private sketch")]
        assert [e.epsilon for e in sketches] == [1.0], owner  # once, ε 1

    before = _epsilon_spent(deployment)
    report = deployment.parent / "sketch-allocation.json"
    request = (
        "consumer", "request", "--config", str(deployment / "consumer.toml"),
        "--validation", str(deployment.parent / "validation.csv"), "-p", "10", "--gamma", "1e-3",
        "--out", str(deployment.parent / "sketch-allocation.csv"), "--report", str(report),
    )  # fmt: skip
    code, output = _dpmarket(*request)
    assert code == 0, output
    text = " ".join(output.split())
    assert "allocation: sketch (the owners' published sketches; no charge to them)" in text
    result = json.loads(report.read_text(encoding="utf-8"))["result"]
    assert result["ledger"]["candidates"]["allocation"] == "sketch"
    for owner in OWNERS:
        spend = result["owner_spend"][owner]
        assert spend["epsilon"] == 0.0
        assert f"{owner} epsilon 0 ({spend['points']} points read)" in text
    assert _epsilon_spent(deployment) == before  # the owners' own ledgers agree

    again = up(deployment)
    assert [(a.owner, a.held, a.epsilon, a.error) for a in again.allocation] == [
        (o, True, 0.0, "") for o in OWNERS
    ]
    assert _epsilon_spent(deployment) == before

    code, output = _dpmarket(*request, "--allocation", "counts")
    assert code == 0, output
    assert "allocation: counts" in " ".join(output.split())
    spent = _epsilon_spent(deployment)
    assert all(spent[o] == pytest.approx(before[o] + 1.0) for o in OWNERS), (spent, before)


def test_a_curator_whose_allocation_spec_includes_the_label_refuses_to_start(
    deployment: Path, tmp_path: Path
) -> None:
    """The deployment's curator started (``up`` returned) with ``init``'s allocation spec, the
    features only. Control: the catalogue's other declaration, whose RFF spec includes the
    label column, named as the allocation's spec: the curator refuses to start, naming every
    owner and the column counts, before anything is charged."""
    log = (deployment / "logs" / "curator.log").read_text(encoding="utf-8")
    assert "clinics-allocation/rff" in log and "Error" not in log
    before = _charges(deployment)
    code, output = _dpmarket(
        "curator", "serve", "--config", str(deployment / "curator.toml"), "--port", "0",
        "--data-dir", str(tmp_path / "curator"),
        "--sketch-spec", str(deployment / "sketches.toml"),
        "--allocation-sketch-spec", "clinics/rff",
    )  # fmt: skip
    assert code == 1
    text = " ".join(output.split())
    for owner in OWNERS:
        assert (
            "--allocation-sketch-spec clinics/rff has 4 column(s) (age, bmi, bp, high) but "
            f"owner {owner} at "
        ) in text
    assert text.count("holds points of 3 features") == len(OWNERS)
    assert _charges(deployment) == before


# Last in the module: it kills an owner (and has `up` start it again).
@pytest.mark.slow
def test_a_request_needs_every_owner_and_one_up_restarted_is_reachable_at_once(
    deployment: Path,
) -> None:
    """An owner's machine dies (SIGKILL): a request without ``--min-owners`` fails, nothing
    charged anywhere, saying how many owners were reachable and naming the owner, never its
    address. While the owner stays down the curator's channel keeps failing its attempts (gRPC
    spaces them out up to two minutes apart by default); ``dpmarket up`` starts the owner
    again and returns once the curator reports it connected, and the very next request gets
    every owner."""
    run = deployment / "run"
    pid = int((run / "senior.pid").read_text(encoding="utf-8"))
    port = (run / "senior.port").read_text(encoding="utf-8").strip()
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)  # `up` (the fixture, in this process) started it: reap it
    except ChildProcessError:
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
    report = deployment.parent / "restart.json"
    request = (
        "request", "--config", str(deployment / "consumer.toml"),
        "--validation", str(deployment.parent / "validation.csv"), "-p", "10", "--gamma", "1e-3",
        "--out", str(deployment.parent / "restart.csv"), "--report", str(report),
    )  # fmt: skip
    before = _charges(deployment)
    code, output = _dpmarket(*request)
    assert code == 1, output
    text = " ".join(output.split())
    assert (
        "2 of the 3 owner(s) this request asks were reachable and 2 can take part; the request "
        "needs all 3 (--min-owners N lets it run with N); left out: senior (unreachable)"
    ) in text
    assert f":{port}" not in text
    assert _charges(deployment) == before  # nothing released, nothing charged
    curator = f"127.0.0.1:{(run / 'curator.port').read_text(encoding='utf-8').strip()}"
    health = (
        "health", "--target", curator, "--expect", "curator:curator",
        "--pki-dir", str(deployment / "pki" / "consumer-consumer"), "--name", "consumer",
        "--service", "owner:senior",
    )  # fmt: skip
    code, output = _dpmarket(*health)
    assert code == 1 and "owner:senior: NOT_SERVING" in output

    time.sleep(6.0)  # the owner stays down a while: the curator's channel backs off meanwhile
    started = up(deployment)
    assert started.ports["senior"] == port
    code, output = _dpmarket(*health)  # `up` returned: the curator is connected to it
    assert code == 0 and "owner:senior: SERVING" in output, output
    code, output = _dpmarket(*request)
    assert code == 0, output
    result = json.loads(report.read_text(encoding="utf-8"))["result"]
    assert result["left_out"] == {}
    assert sorted(result["owner_spend"]) == sorted(OWNERS)


#: The confirmed schema's feature bounds (age, bmi, bp), in its order.
BOUNDS = np.array([[0.0, 120.0], [10.0, 70.0], [40.0, 200.0]])


def test_a_raw_unit_request_runs_with_the_kernel_in_bounds_scaled_units(
    deployment: Path,
) -> None:
    """The clinics' tables are in raw units (ages in years, blood pressure in mmHg); ``--gamma
    1`` reads them scaled to [0, 1] by the schema's bounds (median kernel value 0.95 between the
    validation points so scaled). The request runs: every party reads the kernel in those units,
    the summary is raw rows of the owners it names, and the report's MMD² is the one of the
    scaled points. Control: main refused this request before calling the curator ("gamma = 1
    makes the RBF kernel between typical validation points 6.21e-219 (median squared distance
    502) ... Use a gamma around 1 / 502 = 0.00199"): one gamma read every feature in its own
    units."""
    summary = deployment.parent / "scaled-summary.csv"
    report = deployment.parent / "scaled-report.json"
    code, output = _dpmarket(
        "request", "--config", str(deployment / "consumer.toml"),
        "--validation", str(deployment.parent / "validation.csv"), "-p", "10", "--gamma", "1",
        "--out", str(summary), "--report", str(report),
    )  # fmt: skip
    assert code == 0, output
    frame = pd.read_csv(summary)
    assert len(frame) == 10 and set(frame["owner"]) <= set(OWNERS)
    points = frame[["age", "bmi", "bp"]].to_numpy(float)
    for point, owner in zip(points, frame["owner"], strict=True):
        table = pd.read_csv(deployment.parent / f"{owner}.csv")[["age", "bmi", "bp"]]
        assert (table.to_numpy(float) == point).all(axis=1).any()
    validation = pd.read_csv(deployment.parent / "validation.csv")[["age", "bmi", "bp"]]
    width = BOUNDS[:, 1] - BOUNDS[:, 0]
    scaled = mmd2(
        (points - BOUNDS[:, 0]) / width, (validation.to_numpy(float) - BOUNDS[:, 0]) / width, 1.0
    )
    result = json.loads(report.read_text(encoding="utf-8"))["result"]
    assert result["mmd2_validation"] == pytest.approx(scaled, rel=1e-9)


def test_an_owner_refuses_a_feature_scaling_unlike_its_declaration(deployment: Path) -> None:
    """The curator may lie about the session's feature scaling: an owner opens a session only
    under its own declaration's bounds. A scaling with another bound for ``bp`` (the refusal
    names the column) and none at all are refused with INVALID_ARGUMENT, before anything is
    computed or charged. Control: the declared bounds open the session (then closed,
    charging nothing). On main the owner had no scaling to check: any bounds opened the
    session."""
    config = tomllib.loads((deployment / "owner-young.toml").read_text(encoding="utf-8"))
    target = f"{config['host']}:{config['port']}"
    curator = Identity("curator", CURATOR)
    files = identity_files(deployment / service_pki_dir(curator), curator)
    rff = draw_rff_params(3, 16, 1.0, np.random.default_rng(2))

    def scaling(high: np.ndarray) -> owner_pb2.FeatureScaling:
        return owner_pb2.FeatureScaling(low=array_to_proto(BOUNDS[:, 0]), high=array_to_proto(high))

    def request(sid: str, scaled: owner_pb2.FeatureScaling | None) -> Any:
        return owner_pb2.OpenSessionRequest(
            session_id=sid,
            omega=array_to_proto(rff.omega),
            phase=array_to_proto(rff.phase),
            sampling_seed=1,
            gamma=rff.gamma,
            consumer="consumer:consumer",
            terms=owner_pb2.SessionTerms(method=owner_pb2.SESSION_METHOD_CANDIDATES_SKETCH),
            scaling=scaled,
        )

    lied = BOUNDS[:, 1] * np.array([1.0, 1.0, 10.0])
    before = _charges(deployment)
    security = TransportSecurity.from_files(*files)
    with sync_channel(target, security, Identity("owner", "young")) as channel:
        stub = owner_pb2_grpc.OwnerServiceStub(channel)
        for scaled, says in ((scaling(lied), "at column 'bp'"), (None, "no feature scaling")):
            with pytest.raises(grpc.RpcError) as refused:
                stub.OpenSession(request("scale-" + uuid.uuid4().hex, scaled), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert says in str(refused.value.details())
        assert _charges(deployment) == before  # refused: nothing charged
        sid = "scale-" + uuid.uuid4().hex
        opened = stub.OpenSession(request(sid, scaling(BOUNDS[:, 1])), timeout=30)
        assert opened.num_points == 120
        stub.CloseSession(owner_pb2.CloseSessionRequest(session_id=sid), timeout=30)
