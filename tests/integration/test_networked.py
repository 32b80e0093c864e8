"""Real processes, real gRPC over mTLS: owners and curator as separate OS processes on loopback.

The cluster's policies allow the non-private greedy baseline (curator ``methods`` and owners'
``allow_non_private``) and the per-round methods' exact bids (owners' ``allow_exact_bids``, with
``rounds_per_point`` for greedy's 240 rounds against the smallest owner's 44-point share), and
the candidates method's rows picked along the curator's embedding (``allow_steered_selection``),
so that every method's networked run can be compared with its in-process run.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpmarket.common.summarization.methods import CandidatesConfig, GreedyConfig, method_config
from dpmarket.common.summarization.summary import ProgressEvent
from dpmarket.consumer.client import CuratorClient
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.experiments.runner import simulate
from dpmarket.experiments.scenarios import Scenario, write_scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.statement import LedgerStatement
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import curator_pb2, curator_pb2_grpc, owner_pb2, owner_pb2_grpc

pytestmark = pytest.mark.integration

P = 15


@pytest.fixture(scope="module")
def files(digits: Scenario, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_scenario(digits, tmp_path_factory.mktemp("digits"))


def _owner_files(files: dict[str, Path], k: int = 5) -> list[Path]:
    return [files[f"owner-{i}"] for i in range(k)]


OWNER_POLICY = """
[budget]
epsilon = 1000.0
delta = 0.5
points = 1000000
[session]
epsilon = 100.0
delta = 0.1
points = 100000
rounds_per_point = 8
[access]
allow_steered_selection = true
allow_non_private = true
allow_exact_bids = true
"""
CURATOR_POLICY = """
[requests]
methods = ["candidates", "private", "rounds", "uniform", "greedy"]
[sessions]
per_consumer_per_minute = 1000
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("policies")
    (directory / "owner.toml").write_text(OWNER_POLICY, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    return directory / "owner.toml", directory / "curator.toml"


def _start(digits: Scenario, files: dict[str, Path], log_dir: Path, policies, k: int = 5, **kw):
    names = [o.name for o in digits.owners[:k]]
    return LocalCluster(
        _owner_files(files, k),
        names,
        log_dir,
        owner_policy=policies[0],
        curator_policy=policies[1],
        **kw,
    )


@pytest.fixture(scope="module")
def cluster(
    digits: Scenario,
    files: dict[str, Path],
    policies: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalCluster]:
    with _start(digits, files, tmp_path_factory.mktemp("logs"), policies) as c:
        yield c


def _channel(cluster: LocalCluster, target: str, expected: Identity, caller: Identity):
    security = TransportSecurity.from_files(*identity_files(cluster.pki_dir, caller))
    return sync_channel(target, security, expected)


CONSUMER = Identity("consumer", "consumer")
CURATOR = Identity("curator", CURATOR_NAME)


@pytest.mark.parametrize("method", ["private", "greedy", "uniform", "candidates", "rounds"])
def test_networked_run_equals_in_process_run(
    cluster: LocalCluster, digits: Scenario, method: str
) -> None:
    config = method_config(method, summary_size=P)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        events: list[ProgressEvent] = []
        networked = client.summarize(
            config, digits.validation, digits.seed_set, seed=11, on_progress=events.append
        )
    local = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=11)
    np.testing.assert_array_equal(networked.points, local.points)
    np.testing.assert_array_equal(networked.labels, local.labels)
    assert networked.owner_ids == local.owner_ids
    assert networked.report.owner_points_accessed == local.report.owner_points_accessed
    assert networked.report.ledger == local.report.ledger
    assert events[-1].stage == "done" and events[-1].round == events[-1].total_rounds


def test_networked_score_metric_shrinkage_equals_in_process(
    cluster: LocalCluster, digits: Scenario
) -> None:
    """shrinkage_metric = "scores" crosses both wires (the consumer's request, the curator's
    SetValidationEmbedding): the networked summary is the in-process one, and (the control) not
    the default's, so a flag lost on the way would show."""
    config = method_config("candidates", summary_size=P, shrinkage_metric="scores")
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        networked = client.summarize(config, digits.validation, digits.seed_set, seed=11)
    local = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=11)
    default = simulate(
        digits.owners,
        digits.validation,
        digits.seed_set,
        method_config("candidates", summary_size=P),
        seed=11,
    )
    np.testing.assert_array_equal(networked.points, local.points)
    assert networked.report.ledger == local.report.ledger
    assert not np.array_equal(local.points, default.points)


def test_networked_shrinkage_strength_equals_in_process(
    cluster: LocalCluster, digits: Scenario
) -> None:
    """shrinkage_strength crosses the consumer's request (curator.proto field 32): a setting
    other than the default gives the in-process summary, and (the control) not the default's,
    so a value lost on the way would show. (Old code: no such field.)"""
    default_config = method_config("candidates", summary_size=P)
    assert isinstance(default_config, CandidatesConfig)
    other = "fixed" if default_config.shrinkage_strength != "fixed" else "share"
    config = method_config("candidates", summary_size=P, shrinkage_strength=other)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        networked = client.summarize(config, digits.validation, digits.seed_set, seed=11)
    local = simulate(digits.owners, digits.validation, digits.seed_set, config, seed=11)
    default = simulate(digits.owners, digits.validation, digits.seed_set, default_config, seed=11)
    np.testing.assert_array_equal(networked.points, local.points)
    assert networked.report.ledger == local.report.ledger
    assert not np.array_equal(local.points, default.points)


def _status(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        response = call(request, timeout=30)
        if hasattr(response, "__iter__") and not hasattr(response, "DESCRIPTOR"):
            list(response)
    return info.value.code(), info.value.details() or ""


def _create(validation: np.ndarray, p: int = P, **kw) -> curator_pb2.CreateSessionRequest:
    return curator_pb2.CreateSessionRequest(
        validation=array_to_proto(validation),
        summary_size=p,
        method=kw.pop("method", curator_pb2.METHOD_PRIVATE),
        **kw,
    )


def test_curator_maps_bad_requests_to_statuses(cluster: LocalCluster, digits: Scenario) -> None:
    channel = _channel(cluster, cluster.curator_target, CURATOR, CONSUMER)
    stub = curator_pb2_grpc.CuratorServiceStub(channel)
    v = digits.validation
    nan = v.copy()
    nan[3, 7] = np.nan
    cases = [
        (_create(v[:, :10]), grpc.StatusCode.INVALID_ARGUMENT, "features"),
        (_create(nan), grpc.StatusCode.INVALID_ARGUMENT, "row 3, column 7"),
        (_create(v[:0]), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (_create(v, p=3000), grpc.StatusCode.INVALID_ARGUMENT, "exceeds"),
        (_create(v, p=10**6), grpc.StatusCode.INVALID_ARGUMENT, "allowed range [1, 5000]"),
        (
            _create(v, params=curator_pb2.SummarizationParams(epsilon_owners_total=1e300)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "epsilon_owners_total",
        ),
        (_create(v, p=0), grpc.StatusCode.INVALID_ARGUMENT, "summary_size"),
        (_create(v, method=0), grpc.StatusCode.INVALID_ARGUMENT, "method"),
        (
            _create(v, params=curator_pb2.SummarizationParams(delta_owners=0.5)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "delta_owners",
        ),
    ]
    for request, code, text in cases:
        got, details = _status(stub.CreateSession, request)
        assert got == code and text in details, (got, details)
        assert "Traceback" not in details
    unknown = curator_pb2.GetSummaryRequest(session_id="nope")
    assert _status(stub.GetSummary, unknown)[0] == grpc.StatusCode.NOT_FOUND
    watch = curator_pb2.WatchSessionRequest(session_id="nope")
    assert _status(stub.WatchSession, watch)[0] == grpc.StatusCode.NOT_FOUND
    channel.close()


def test_owner_maps_out_of_order_stages_to_statuses(cluster: LocalCluster) -> None:
    owner = Identity("owner", cluster.owner_ids[0])
    channel = _channel(cluster, cluster.owner_targets[0], owner, CURATOR)
    stub = owner_pb2_grpc.OwnerServiceStub(channel)
    info = stub.GetOwnerInfo(owner_pb2.GetOwnerInfoRequest(), timeout=10)
    n, d = int(info.num_features), 8
    rng = np.random.default_rng(0)
    bid = owner_pb2.BidRequest(
        session_id="s-direct", round=1, summary_embedding=array_to_proto(np.zeros(d))
    )
    assert _status(stub.Bid, bid)[0] == grpc.StatusCode.NOT_FOUND
    terms = owner_pb2.SessionTerms(
        method=owner_pb2.SESSION_METHOD_PRIVATE, epsilon=0.5, delta=1e-6, max_rounds=10
    )
    bad_open = owner_pb2.OpenSessionRequest(
        session_id="s-direct",
        omega=array_to_proto(rng.normal(size=(d, n + 1))),
        phase=array_to_proto(rng.uniform(0, 6, size=d)),
        gamma=0.1,
        consumer="consumer:consumer",
        terms=terms,
    )
    code, details = _status(stub.OpenSession, bad_open)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "features" in details
    good_open = owner_pb2.OpenSessionRequest(
        session_id="s-direct",
        omega=array_to_proto(rng.normal(size=(d, n))),
        phase=array_to_proto(rng.uniform(0, 6, size=d)),
        gamma=0.1,
        consumer="consumer:consumer",
        terms=terms,
    )
    # Terms whose epsilon does not pay for their method's steps, and the in-process hashes
    # methods, are refused before anything is computed.
    for method, epsilon, code, text in (
        (owner_pb2.SESSION_METHOD_UNSPECIFIED, 0.5, grpc.StatusCode.INVALID_ARGUMENT, "method"),
        (owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS, 0.0, grpc.StatusCode.INVALID_ARGUMENT,
         "needs a finite epsilon > 0"),
        # Issue 25, B5: a noise scale 1/epsilon of inf (5e-324), or of 1e300: refused before
        # the charge (they were charged, then the count failed or released noise alone).
        (owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS, 5e-324, grpc.StatusCode.INVALID_ARGUMENT,
         "must be at least 1e-06"),
        (owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS, 1e-300, grpc.StatusCode.INVALID_ARGUMENT,
         "must be at least 1e-06"),
        (owner_pb2.SESSION_METHOD_HASHES_SKETCH, 0.0, grpc.StatusCode.FAILED_PRECONDITION,
         "runs in process only"),
    ):  # fmt: skip
        wrong = owner_pb2.OpenSessionRequest()
        wrong.CopyFrom(good_open)
        wrong.terms.CopyFrom(owner_pb2.SessionTerms(method=method, epsilon=epsilon))
        got, details = _status(stub.OpenSession, wrong)
        assert got == code and text in details, (got, details)
    with OwnerLedger(cluster.owner_state(owner.name), None) as ledger:
        assert ledger.session_totals("s-direct").epsilon == 0  # refused: nothing charged
    stub.OpenSession(good_open, timeout=30)
    assert _status(stub.OpenSession, good_open)[0] == grpc.StatusCode.ALREADY_EXISTS
    assert _status(stub.Bid, bid)[0] == grpc.StatusCode.FAILED_PRECONDITION
    release = owner_pb2.ReleasePointRequest(session_id="s-direct", round=1)
    assert _status(stub.ReleasePoint, release)[0] == grpc.StatusCode.FAILED_PRECONDITION
    # The same steps on a RunRounds stream end it with the same statuses.
    for step in (
        owner_pb2.RunRoundsRequest(bid=bid),
        owner_pb2.RunRoundsRequest(release_point=release),
    ):
        assert _status(stub.RunRounds, iter([step]))[0] == grpc.StatusCode.FAILED_PRECONDITION
    unknown = owner_pb2.BidRequest(
        session_id="nope", round=1, summary_embedding=bid.summary_embedding
    )
    assert _status(stub.RunRounds, iter([owner_pb2.RunRoundsRequest(bid=unknown)]))[0] == (
        grpc.StatusCode.NOT_FOUND
    )
    code, details = _status(stub.RunRounds, iter([owner_pb2.RunRoundsRequest()]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "bid or a release_point" in details
    bad_embedding = owner_pb2.SetValidationEmbeddingRequest(
        session_id="s-direct", validation_embedding=array_to_proto(np.zeros(d + 1))
    )
    assert _status(stub.SetValidationEmbedding, bad_embedding)[0] == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    stub.CloseSession(owner_pb2.CloseSessionRequest(session_id="s-direct"), timeout=10)
    channel.close()


def test_a_rounds_stream_answers_as_the_unary_steps(cluster: LocalCluster) -> None:
    """Two sessions opened alike at one owner: one bids and releases by unary calls, the other
    by one RunRounds stream; every answer is the same (bids, times best, released points)."""
    owner = Identity("owner", cluster.owner_ids[0])
    channel = _channel(cluster, cluster.owner_targets[0], owner, CURATOR)
    stub = owner_pb2_grpc.OwnerServiceStub(channel)
    n = int(stub.GetOwnerInfo(owner_pb2.GetOwnerInfoRequest(), timeout=10).num_features)
    rng = np.random.default_rng(5)
    d = 16
    omega, phase = rng.normal(scale=0.3, size=(d, n)), rng.uniform(0, 2 * np.pi, size=d)
    embeddings = [rng.normal(scale=0.1, size=d) for _ in range(4)]
    terms = owner_pb2.SessionTerms(
        method=owner_pb2.SESSION_METHOD_PRIVATE, epsilon=0.5, delta=1e-6, max_rounds=10
    )
    for sid in ("s-unary", "s-stream"):
        stub.OpenSession(
            owner_pb2.OpenSessionRequest(
                session_id=sid,
                omega=array_to_proto(omega),
                phase=array_to_proto(phase),
                gamma=0.1,
                consumer="consumer:consumer",
                terms=terms,
            ),
            timeout=30,
        )
        stub.SetValidationEmbedding(
            owner_pb2.SetValidationEmbeddingRequest(
                session_id=sid, validation_embedding=array_to_proto(embeddings[0])
            ),
            timeout=10,
        )

    def steps(sid: str) -> list[owner_pb2.RunRoundsRequest]:
        out = []
        for r, g in enumerate(embeddings[1:], start=1):
            out.append(
                owner_pb2.RunRoundsRequest(
                    bid=owner_pb2.BidRequest(
                        session_id=sid, round=r, summary_embedding=array_to_proto(g), summary_size=r
                    )
                )
            )
            if r != 2:  # round 2's point is not asked for
                out.append(
                    owner_pb2.RunRoundsRequest(
                        release_point=owner_pb2.ReleasePointRequest(session_id=sid, round=r)
                    )
                )
        return out

    unary = []
    for step in steps("s-unary"):
        if step.WhichOneof("step") == "bid":
            unary.append(owner_pb2.RunRoundsResponse(bid=stub.Bid(step.bid, timeout=10)))
        else:
            released = stub.ReleasePoint(step.release_point, timeout=10)
            unary.append(owner_pb2.RunRoundsResponse(release_point=released))
    streamed = list(stub.RunRounds(iter(steps("s-stream")), timeout=30))
    assert streamed == unary
    assert [r.WhichOneof("step") for r in streamed] == [
        "bid",
        "release_point",
        "bid",
        "bid",
        "release_point",
    ]
    for sid in ("s-unary", "s-stream"):
        stub.CloseSession(owner_pb2.CloseSessionRequest(session_id=sid), timeout=10)
    channel.close()


def test_services_report_serving_health(cluster: LocalCluster) -> None:
    servers = [CURATOR, *(Identity("owner", o) for o in cluster.owner_ids)]
    targets = [cluster.curator_target, *cluster.owner_targets]
    for target, server in zip(targets, servers, strict=True):
        with _channel(cluster, target, server, CONSUMER) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_seeded_sessions_are_refused_unless_allowed(
    digits: Scenario, files: dict[str, Path], policies: tuple[Path, Path], tmp_path: Path
) -> None:
    with _start(digits, files, tmp_path, policies, k=2, allow_seeded_sessions=False) as cluster:
        channel = _channel(cluster, cluster.curator_target, CURATOR, CONSUMER)
        stub = curator_pb2_grpc.CuratorServiceStub(channel)
        code, details = _status(stub.CreateSession, _create(digits.validation, seed=3))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "seeded" in details
        channel.close()


def test_an_owner_that_dies_mid_session_is_dropped_and_reported(
    digits: Scenario, files: dict[str, Path], policies: tuple[Path, Path], tmp_path: Path
) -> None:
    names = [o.name for o in digits.owners]
    config = GreedyConfig(summary_size=120)
    with (
        _start(digits, files, tmp_path, policies) as cluster,
        CuratorClient(cluster.curator_target, cluster.consumer_security()) as client,
    ):
        session_id = client.create_session(config, digits.validation, digits.seed_set, seed=1)
        killed = False
        for event, _ in client.watch(session_id):
            if not killed and event.round >= 2:
                cluster.kill_owner(1)
                killed = True
        result = client.get_summary(session_id)
    assert killed
    assert result.report.dropped_owners == (names[1],)
    assert result.points.shape == (120, digits.n_features)
    # The dropped owner is not missing from what the owners charged: its record could not be
    # got (it may have charged the session), and the report says so; the others' are there.
    spend = result.report.owner_spend
    assert sorted(spend) == sorted(names[: len(spend)]) and names[1] in spend
    assert spend[names[1]].unknown == "owner unreachable"
    assert all(not s.unknown for o, s in spend.items() if o != names[1])


def test_cli_request_and_simulate_write_the_same_summary(
    cluster: LocalCluster, files: dict[str, Path], tmp_path: Path
) -> None:
    common = [
        "--validation", str(files["validation"]), "--seed-set", str(files["seed_set"]),
        "--test", str(files["test"]), "-p", "10", "--method", "private", "--seed", "4",
    ]  # fmt: skip
    dpmarket = [sys.executable, "-m", "dpmarket.deploy.cli"]
    owners = [arg for path in _owner_files(files) for arg in ("--owner-data", str(path))]
    consumer_tls = ["--pki-dir", str(cluster.pki_dir), "--name", CONSUMER.name]
    runs = {
        "net": [*dpmarket, "request", "--curator", cluster.curator_target, *consumer_tls],
        "local": [*dpmarket, "simulate", *owners],
    }
    for name, argv in runs.items():
        out = tmp_path / f"{name}.npy"
        report = tmp_path / f"{name}.json"
        subprocess.run(
            [*argv, *common, "--out", str(out), "--report", str(report)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        assert report.exists()
    np.testing.assert_array_equal(np.load(tmp_path / "net.npy"), np.load(tmp_path / "local.npy"))
    np.testing.assert_array_equal(
        np.load(tmp_path / "net.labels.npy"), np.load(tmp_path / "local.labels.npy")
    )


def test_cli_reports_a_bad_file_clearly(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,x\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "dpmarket.deploy.cli", "simulate", "--owner-data", str(bad),
         "--validation", str(files["validation"]), "-p", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Error" in result.stderr and "'b'" in result.stderr
    assert "Traceback" not in result.stderr


NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "examples" / "client.ipynb"


def test_the_client_notebook_runs_against_the_deployment(
    cluster: LocalCluster,
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """docs/examples/client.ipynb, executed in a real kernel against the curator and owners
    this module started (mTLS): a summary through dpmarket.client, its typed report, an owner's
    own ledger recording the session's charge."""
    import nbformat
    from nbclient import NotebookClient

    owner = cluster.owner_ids[0]
    before = len(dpmarket_ledger(cluster.owner_state(owner)).entries)
    for key, value in {
        "DPMARKET_CURATOR": cluster.curator_target,
        "DPMARKET_PKI_DIR": str(cluster.pki_dir),
        "DPMARKET_CONSUMER": cluster.consumers[0],
        "DPMARKET_VALIDATION": str(files["validation"]),
        "DPMARKET_OWNER_DATA_DIR": str(cluster.owner_state(owner)),
        "DPMARKET_SEED": "3",
        "JUPYTER_PLATFORM_DIRS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()
    printed = "".join(
        output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
    )
    assert "read " in printed and "owner points for a summary of 10" in printed
    assert "each owner: epsilon 1 (candidates-counts)" in printed
    assert "the last session spent epsilon 1 of this owner's data" in printed
    # The owner's own ledger holds the session's charges, which its terms stated.
    assert len(dpmarket_ledger(cluster.owner_state(owner)).entries) > before


def dpmarket_ledger(data_dir: Path) -> LedgerStatement:
    """The owner's ledger as :func:`dpmarket.client.ledger` reads it."""
    from dpmarket.client import ledger

    return ledger(data_dir)
