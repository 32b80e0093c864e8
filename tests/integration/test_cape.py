"""CAPE across real processes: five owners and a curator over mTLS fit capeFM, estimate means
and train a network by gradient descent on real data.

Owners hold parquet tables of scikit-learn's diabetes data (440 of its 442 rows, 88 per owner:
columns ``c0`` .. ``c9``, ``target`` and a 0/1 ``high`` for logistic regression, which every owner
declares 0/1 when it starts; all but the last owner also hold a column ``extra``). Two clusters,
each an OS process per party started by :class:`dpmarket.deploy.launcher.LocalCluster` with seeded
runs allowed:

* ``cluster``: five owners with room for many jobs; what is fitted, charged and refused.
* ``budget_cluster``: two owners whose lifetime epsilon is 1.5 (1.0 per job).

What each owner spent is read from its own durable ledger, never from what the curator reports;
the report's ``owner_spend`` must agree with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from google.protobuf.message_factory import GetMessageClass
from sklearn.datasets import load_diabetes

from dpmarket.client import Consumer
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.consumer.client import CapeFit, CuratorClient
from dpmarket.curator.cape import CapeMeanEstimate, CapeResult, CapeTrainingResult
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.experiments.cape_experiments import DIABETES_BOUNDS, DIABETES_TARGET
from dpmarket.experiments.runner import fit_cape, run_cape
from dpmarket.owner.ledger import LedgerEntry, OwnerLedger
from dpmarket.runtime import cape_messages
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.tables import Table, load_table
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import cape_pb2, secure_aggregation_pb2

pytestmark = pytest.mark.integration

OWNERS = tuple(f"owner-{i}" for i in range(5))
ROWS_PER_OWNER = 88
COLUMNS = tuple(f"c{i}" for i in range(10))
FEATURES = tuple((c, lo, hi) for c, (lo, hi) in zip(COLUMNS, DIABETES_BOUNDS, strict=True))
CURATOR = Identity("curator", CURATOR_NAME)
CONSUMER = Identity("consumer", "consumer")
SEED = 3
#: Deadline of calls that must fail: a safety net against a hang, not a timing assertion.
CALL_TIMEOUT = 120.0
CAPE_SERVICE = cape_pb2.DESCRIPTOR.services_by_name["CapeService"]

OWNER_POLICY = """
[budget]
epsilon = 100.0
delta = 1e-3
[session]
epsilon = 2.0
delta = 1e-6
"""
CURATOR_POLICY = """
[requests]
owners_epsilon = [0.01, 2.0]
owners_delta = [1e-12, 1e-5]
train_iterations = [1, 20]
train_hidden_units = [1, 8]
train_work = [1, 1000]
[sessions]
per_consumer_per_minute = 1000
"""
#: The column every owner declares 0/1 (``serve-owner --binary-column``).
BINARY = ("high",)
#: Lifetime epsilon 1.5, at most 1.0 per job: one job at epsilon 1 fits, a second does not.
BUDGET_OWNER_POLICY = """
[budget]
epsilon = 1.5
delta = 1e-5
[session]
epsilon = 1.0
delta = 1e-6
"""


def _linear(
    epsilon: float = 1.0,
    delta: float = 1e-6,
    features: tuple[tuple[str, float, float], ...] = FEATURES,
) -> CapeJobSpec:
    return CapeJobSpec("linear", features, ("target", *DIABETES_TARGET), epsilon, delta)


def _logistic(epsilon: float = 1.0, delta: float = 1e-6) -> CapeJobSpec:
    """A 0/1 target: disease progression above its median (the target bounds are ignored)."""
    return CapeJobSpec("logistic", FEATURES, ("high", 0.0, 1.0), epsilon, delta)


def _mean(
    epsilon: float = 1.0,
    features: tuple[tuple[str, float, float], ...] = (*FEATURES, ("target", *DIABETES_TARGET)),
) -> CapeMeanSpec:
    """The mean of every clinical column and of the disease progression."""
    return CapeMeanSpec(features, epsilon, 1e-6)


def _training(
    epsilon: float = 1.0,
    iterations: int = 5,
    hidden: int = 4,
    learning_rate: float = 1.0,
    target: str = "high",
) -> CapeTrainingSpec:
    """The 2-layer network on ``high``; 5 iterations x 49 parameters."""
    return CapeTrainingSpec(FEATURES, target, epsilon, 1e-6, iterations, learning_rate, hidden, 1.0)


# ---------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One parquet table per owner, 88 rows each, named after the owner."""
    x, y = load_diabetes(return_X_y=True, scaled=False)
    x, y = np.asarray(x)[: 5 * ROWS_PER_OWNER], np.asarray(y)[: 5 * ROWS_PER_OWNER]
    high = (y > np.median(y)).astype(np.float64)
    directory = tmp_path_factory.mktemp("cape-tables")
    out = {}
    for i, owner in enumerate(OWNERS):
        rows = slice(i * ROWS_PER_OWNER, (i + 1) * ROWS_PER_OWNER)
        frame = pd.DataFrame(x[rows], columns=list(COLUMNS))
        frame["target"], frame["high"] = y[rows], high[rows]
        if owner != OWNERS[-1]:
            frame["extra"] = x[rows, 2]
        out[owner] = directory / f"{owner}.parquet"
        frame.to_parquet(out[owner])
    return out


def _start(
    directory: Path, owners: tuple[str, ...], tables: dict[str, Path], owner_policy: str
) -> LocalCluster:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "owner.toml").write_text(owner_policy, encoding="utf-8")
    (directory / "curator.toml").write_text(CURATOR_POLICY, encoding="utf-8")
    return LocalCluster(
        [],
        owners,
        directory / "logs",
        owner_tables=[tables[o] for o in owners],
        owner_binary_columns=BINARY,
        owner_policy=directory / "owner.toml",
        curator_policy=directory / "curator.toml",
    )


@pytest.fixture(scope="module")
def cluster(
    tables: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    with _start(tmp_path_factory.mktemp("cape"), OWNERS, tables, OWNER_POLICY) as running:
        yield running


@pytest.fixture(scope="module")
def budget_cluster(
    tables: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("cape-budget")
    with _start(directory, OWNERS[:2], tables, BUDGET_OWNER_POLICY) as running:
        yield running


# ----------------------------------------------------------------------------------------- helpers
def _ledgers(cluster: LocalCluster) -> dict[str, list[LedgerEntry]]:
    """Every charge of every owner's own durable ledger."""
    out = {}
    for owner in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(owner), None) as ledger:
            out[owner] = ledger.entries()
    return out


def _new_entries(
    before: dict[str, list[LedgerEntry]], after: dict[str, list[LedgerEntry]]
) -> dict[str, list[LedgerEntry]]:
    known = {o: {e.id for e in entries} for o, entries in before.items()}
    return {o: [e for e in entries if e.id not in known[o]] for o, entries in after.items()}


def _fit(cluster: LocalCluster, spec: CapeJobSpec, request_id: str | None = None) -> CapeFit:
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        return client.fit_cape(spec, seed=SEED, request_id=request_id, timeout=CALL_TIMEOUT)


def _fit_status(
    cluster: LocalCluster, spec: AnyCapeSpec, request_id: str = ""
) -> tuple[grpc.StatusCode, str]:
    """A CapeService request for ``spec`` (FitCape, EstimateCapeMean or TrainCape) that must
    fail: its status code and details."""
    request: cape_pb2.TrainCapeRequest | cape_pb2.EstimateCapeMeanRequest | cape_pb2.FitCapeRequest
    if isinstance(spec, CapeTrainingSpec):
        method, request = (
            "TrainCape",
            cape_pb2.TrainCapeRequest(spec=cape_messages.training_to_proto(spec)),
        )
    elif isinstance(spec, CapeMeanSpec):
        method = "EstimateCapeMean"
        request = cape_pb2.EstimateCapeMeanRequest(spec=cape_messages.spec_to_proto(spec))
    else:
        method = "FitCape"
        request = cape_pb2.FitCapeRequest(spec=cape_messages.spec_to_proto(spec))
    request.request_id, request.seed = request_id, SEED
    return _raw_status(cluster, method, request)


def _raw_status(cluster: LocalCluster, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    """A CapeService call that must fail: its status code and details."""
    with sync_channel(cluster.curator_target, cluster.consumer_security(), CURATOR) as channel:
        return _unary_status(channel, CAPE_SERVICE.methods_by_name[method], request)


def _unary_status(channel: grpc.Channel, method: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    """Call ``method`` (a method descriptor) with ``request``; it must fail: code and details."""
    service = method.containing_service
    call = channel.unary_unary(
        f"/{service.full_name}/{method.name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=GetMessageClass(method.output_type).FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=CALL_TIMEOUT)
    details = info.value.details() or ""
    assert "Traceback" not in details
    return info.value.code(), details


def _in_process(tables: dict[str, Path], owners: tuple[str, ...], spec: CapeJobSpec) -> CapeResult:
    loaded: list[Table] = [load_table(tables[o], binary=BINARY) for o in owners]
    assert [t.name for t in loaded] == list(owners)
    result, _ = fit_cape(loaded, spec, seed=SEED)
    return result


# ---------------------------------------------------------------------------------- fit and charge
@pytest.mark.parametrize("spec", [_linear(), _logistic()], ids=["linear", "logistic"])
def test_networked_fit_equals_in_process_fit_and_each_owner_charges_it_once(
    cluster: LocalCluster, tables: dict[str, Path], spec: CapeJobSpec
) -> None:
    """FitCape over five owner processes gives the in-process fit bit for bit (same seed), and
    every owner's own ledger gains exactly one charge of the job's (epsilon, delta), which the
    report's ``owner_spend`` repeats."""
    before = _ledgers(cluster)
    fit = _fit(cluster, spec)
    local = _in_process(tables, OWNERS, spec)
    np.testing.assert_array_equal(fit.weights, local.weights)
    assert fit.intercept == local.intercept
    assert fit.weights.shape == (len(COLUMNS),) and np.isfinite(fit.weights).all()
    # The typed report reads the curator's document, which --json prints unchanged.
    assert fit.report.sites == tuple(OWNERS) and fit.report.task == spec.task
    report = fit.report.to_json()
    assert report["task"] == spec.task
    assert report["sites"] == list(OWNERS) and report["dropped"] == {}
    assert report["noise_rounds"] == 1
    assert report["sizes"] == dict.fromkeys(OWNERS, ROWS_PER_OWNER)

    new = _new_entries(before, _ledgers(cluster))
    sessions = set()
    for owner in OWNERS:
        assert len(new[owner]) == 1, (owner, new[owner])
        (entry,) = new[owner]
        assert (entry.epsilon, entry.delta, entry.points) == (spec.epsilon, spec.delta, 0)
        assert not entry.non_private
        assert entry.consumer == str(CONSUMER) and entry.curator == str(CURATOR)
        assert "capeFM" in entry.mechanism and spec.task in entry.mechanism
        sessions.add(entry.session)
        assert fit.report.owner_spend[owner].epsilon == entry.epsilon
        spent = report["owner_spend"][owner]
        assert spent == {
            "epsilon": entry.epsilon,
            "delta": entry.delta,
            "points": 0,
            "non_private": False,
            "unknown": "",  # the owner's own record
        }
    assert len(sessions) == 1  # one job, the same id at every owner


@pytest.mark.parametrize("spec", [_mean(), _training()], ids=["mean", "train"])
def test_a_networked_mean_or_training_equals_the_in_process_one_and_is_charged_once(
    cluster: LocalCluster, tables: dict[str, Path], spec: CapeMeanSpec | CapeTrainingSpec
) -> None:
    """EstimateCapeMean and TrainCape over five owner processes give the in-process answer bit
    for bit (same seed), and every owner's own ledger gains exactly one charge: the mean's
    (epsilon, delta), the training's total over all its iterations by the PLD accountant (never
    above the request), which the report states."""
    before = _ledgers(cluster)
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        if isinstance(spec, CapeMeanSpec):
            answer = client.estimate_cape_mean(spec, seed=SEED, timeout=CALL_TIMEOUT)
            networked, report = answer.mean, answer.report.to_json()
        else:
            network = client.train_cape(spec, seed=SEED, timeout=CALL_TIMEOUT)
            networked, report = network.parameters, network.report.to_json()
    local, _ = run_cape([load_table(tables[o], binary=BINARY) for o in OWNERS], spec, seed=SEED)
    if isinstance(local, CapeMeanEstimate):
        np.testing.assert_array_equal(networked, local.mean)
        assert networked.shape == (len(spec.features),)
    else:
        assert isinstance(local, CapeTrainingResult) and isinstance(spec, CapeTrainingSpec)
        np.testing.assert_array_equal(networked, local.parameters)
        assert len(report["noise_std_per_iteration"]) == spec.iterations
    assert report["sites"] == list(OWNERS) and report["dropped"] == {}
    assert report["noise_rounds"] == 1
    epsilon, delta = spec.cost
    assert report["epsilon"] == epsilon <= spec.epsilon
    assert epsilon >= spec.epsilon * (1 - 1e-4)
    assert report["delta_exact"] <= spec.delta

    new = _new_entries(before, _ledgers(cluster))
    for owner in OWNERS:
        (entry,) = new[owner]
        assert (entry.epsilon, entry.delta, entry.points) == (epsilon, delta, 0)
        assert entry.mechanism == spec.mechanism
        assert report["owner_spend"][owner]["epsilon"] == epsilon
    assert len({new[o][0].session for o in OWNERS}) == 1


# ------------------------------------------------------------------------------------- idempotency
def test_a_retried_fit_returns_the_same_answer_and_charges_nothing_new(
    cluster: LocalCluster,
) -> None:
    first = _fit(cluster, _linear(), request_id="cape-retry-1")
    before = _ledgers(cluster)
    again = _fit(cluster, _linear(), request_id="cape-retry-1")
    np.testing.assert_array_equal(again.weights, first.weights)
    assert again.intercept == first.intercept and again.report == first.report
    assert _ledgers(cluster) == before
    # dpmarket.client reaches the same job by the same key: the same answer, nothing charged.
    with Consumer(
        cluster.curator_target, cluster.consumer_security(), curator_name=CURATOR_NAME
    ) as consumer:
        library = consumer.cape_fit(
            _linear(), seed=SEED, request_id="cape-retry-1", timeout=CALL_TIMEOUT
        )
    np.testing.assert_array_equal(library.weights, first.weights)
    assert library.intercept == first.intercept and library.report == first.report
    assert _ledgers(cluster) == before
    # The same key for another request is refused, and charges nothing either.
    code, details = _fit_status(cluster, _linear(epsilon=0.5), request_id="cape-retry-1")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "cape-retry-1" in details and "another request" in details
    assert _ledgers(cluster) == before


def test_a_retried_refused_job_is_refused_again_the_same_way_charging_nothing(
    cluster: LocalCluster,
) -> None:
    """A job an owner refuses at open, retried with the same request id: the same status and
    message both times (never INTERNAL), no ledger changes; the key then serves the corrected
    request, as a refused CreateSession leaves no key behind."""
    before = _ledgers(cluster)
    spec = _linear(features=(*FEATURES[:3], ("extra", 10.0, 60.0)))
    first = _fit_status(cluster, spec, request_id="cape-refused-1")
    again = _fit_status(cluster, spec, request_id="cape-refused-1")
    assert first == again and first[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert _ledgers(cluster) == before
    fit = _fit(cluster, _linear(), request_id="cape-refused-1")
    assert _fit(cluster, _linear(), request_id="cape-refused-1").report == fit.report


# ----------------------------------------------------------------------------------------- budgets
def test_an_owner_without_budget_left_refuses_the_job_before_any_release(
    budget_cluster: LocalCluster,
) -> None:
    """Lifetime epsilon 1.5: a first job at epsilon 1 is charged once per owner; a second at
    epsilon 1 — a regression, a mean or a training (whose total over all iterations is what the
    owner checks) — is refused when it opens (FAILED_PRECONDITION) and no ledger gains an entry;
    a job at epsilon 0.5 still fits in what is left."""
    owners = tuple(budget_cluster.owner_ids)
    first = _fit(budget_cluster, _linear(epsilon=1.0))
    assert first.report.sites == owners
    after_first = _ledgers(budget_cluster)
    assert all(len(after_first[o]) == 1 for o in owners)

    for refused in (_linear(epsilon=1.0), _mean(epsilon=1.0), _training(epsilon=1.0)):
        code, details = _fit_status(budget_cluster, refused)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, refused.task
        # The owners tell the curator what is left; the consumer reads "budget refused" only.
        assert "(budget refused)" in details and "0.5 left" not in details
        assert _ledgers(budget_cluster) == after_first
    curator_log = (budget_cluster.log_dir / "curator.log").read_text(encoding="utf-8")
    assert "epsilon" in curator_log and "0.5 left" in curator_log

    last = _fit(budget_cluster, _linear(epsilon=0.5))
    assert last.report.sites == owners
    new = _new_entries(after_first, _ledgers(budget_cluster))
    assert all([e.epsilon for e in new[o]] == [0.5] for o in owners)


# ------------------------------------------------------------------------------ columns and bounds
def test_an_owner_refusing_at_open_is_left_out_where_min_owners_allows(
    cluster: LocalCluster,
) -> None:
    """owner-4 lacks the column ``extra`` and refuses a mean of it when the job opens: with
    min_owners 4 the mean runs over owner-0 .. owner-3, planned over their sizes alone, owner-4
    in ``dropped`` with its refusal's status and its text quoted as its own words; owner-4's own
    ledger gains nothing (its record, asked when the job closes, says 0), every other one
    charge. By default (every owner) the same request fails naming owner-4
    (:func:`test_a_column_an_owner_lacks_is_refused_and_charges_nothing`); before, it failed
    whatever min_owners said."""
    before = _ledgers(cluster)
    spec = _mean(features=(*FEATURES[:3], ("extra", 10.0, 60.0)))
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        answer = client.estimate_cape_mean(spec, seed=SEED, timeout=CALL_TIMEOUT, min_owners=4)
    report = answer.report.to_json()
    ran, refusing = list(OWNERS[:4]), OWNERS[4]
    assert report["sites"] == ran and report["sizes"] == dict.fromkeys(ran, ROWS_PER_OWNER)
    dropped = report["dropped"]
    assert list(dropped) == [refusing], dropped
    assert re.match(
        r"open: refused \((INVALID_ARGUMENT|FAILED_PRECONDITION)\); the owner's own words: «.*"
        r"'extra'.*»$",
        dropped[refusing],
    ), dropped
    new = _new_entries(before, _ledgers(cluster))
    assert new[refusing] == [] and all(len(new[o]) == 1 for o in ran)
    assert report["owner_spend"][refusing]["epsilon"] == 0


def test_a_column_an_owner_lacks_is_refused_and_charges_nothing(cluster: LocalCluster) -> None:
    before = _ledgers(cluster)
    spec = _linear(features=(*FEATURES[:3], ("extra", 10.0, 60.0)))
    code, details = _fit_status(cluster, spec)
    assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
    assert "'extra'" in details and OWNERS[-1] in details
    assert _ledgers(cluster) == before


def test_values_outside_their_public_bounds_are_clamped_and_the_fit_charged_once(
    cluster: LocalCluster, tables: dict[str, Path]
) -> None:
    """Body mass index bounded by [10, 35], listed first, while owners hold heavier patients:
    every owner clamps them to 35 (as OpenDP does) and fits; the networked fit equals the
    in-process one on the same tables bit for bit, every ledger gains one charge, the report
    names no row and no count, and only each owner's own log counts the clamped values."""
    narrow = (("c2", 10.0, 35.0), *(f for f in FEATURES if f[0] != "c2"))
    spec = _linear(features=narrow)
    bmi = load_table(tables[OWNERS[0]]).select(["c2"])[:, 0]
    clamped = int(np.sum(bmi > 35.0))
    assert clamped > 0
    before = _ledgers(cluster)
    fit = _fit(cluster, spec)
    np.testing.assert_array_equal(fit.weights, _in_process(tables, OWNERS, spec).weights)
    new = _new_entries(before, _ledgers(cluster))
    assert all(len(new[o]) == 1 for o in OWNERS)
    # The estimates' fixed wording names public terms (what an interval covers: the records
    # "clamped" into the bounds; a value "outside" its interval), the same for every job; their
    # numbers come from the release. Everything else must not mention rows or clamping.
    report = fit.report.to_json(estimates=False)
    text = json.dumps(report)
    assert "row" not in text and "clamp" not in text and "outside" not in text
    assert {e.covers for e in fit.estimates} == {spec.covers}
    log = (cluster.log_dir / f"{OWNERS[0]}.log").read_text(encoding="utf-8")
    assert f"'c2' {clamped} of {ROWS_PER_OWNER} rows" in log


# ----------------------------------------------------------------------------------- authorization
def _channel(cluster: LocalCluster, target: str, server: Identity, caller: Identity) -> Any:
    security = TransportSecurity.from_files(*identity_files(cluster.pki_dir, caller))
    return sync_channel(target, security, server)


OWNER_SERVICES = (
    cape_pb2.DESCRIPTOR.services_by_name["CapeSiteService"],
    secure_aggregation_pb2.DESCRIPTOR.services_by_name["SecureAggregationService"],
)


@pytest.mark.parametrize("caller", [CONSUMER, Identity("owner", OWNERS[1])], ids=str)
def test_every_cape_and_secure_aggregation_rpc_of_an_owner_refuses_a_non_curator(
    cluster: LocalCluster, caller: Identity
) -> None:
    """A consumer (or another owner) calling an owner's CAPE or secure-aggregation RPCs directly
    gets PERMISSION_DENIED before anything runs; no ledger changes."""
    before = _ledgers(cluster)
    target = cluster.owner_targets[0]
    with _channel(cluster, target, Identity("owner", OWNERS[0]), caller) as channel:
        for service in OWNER_SERVICES:
            assert service.methods
            for method in service.methods:
                request = GetMessageClass(method.input_type)()
                code, details = _unary_status(channel, method, request)
                assert code == grpc.StatusCode.PERMISSION_DENIED, (method.name, details)
                assert str(caller) in details
    assert _ledgers(cluster) == before


@pytest.mark.parametrize("caller", [Identity("owner", OWNERS[0]), CURATOR], ids=str)
def test_every_rpc_of_the_cape_service_refuses_an_owner_or_curator_certificate(
    cluster: LocalCluster, caller: Identity
) -> None:
    """FitCape, EstimateCapeMean, TrainCape and QuoteCape, with requests that would run, and
    WatchCapeJob: an owner's or the curator's own certificate gets PERMISSION_DENIED, and
    nothing is charged."""
    before = _ledgers(cluster)
    requests = {
        "FitCape": cape_pb2.FitCapeRequest(spec=cape_messages.spec_to_proto(_linear()), seed=SEED),
        "EstimateCapeMean": cape_pb2.EstimateCapeMeanRequest(
            spec=cape_messages.spec_to_proto(_mean()), seed=SEED
        ),
        "TrainCape": cape_pb2.TrainCapeRequest(
            spec=cape_messages.training_to_proto(_training()), seed=SEED
        ),
        "QuoteCape": cape_pb2.QuoteCapeRequest(
            mean=cape_pb2.EstimateCapeMeanRequest(spec=cape_messages.spec_to_proto(_mean()))
        ),
    }
    assert set(requests) | {"WatchCapeJob"} == {m.name for m in CAPE_SERVICE.methods}
    with _channel(cluster, cluster.curator_target, CURATOR, caller) as channel:
        for name, request in requests.items():
            code, details = _unary_status(channel, CAPE_SERVICE.methods_by_name[name], request)
            assert code == grpc.StatusCode.PERMISSION_DENIED, name
            assert str(caller) in details
        watch = channel.unary_stream(
            f"/{CAPE_SERVICE.full_name}/WatchCapeJob",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=cape_pb2.WatchCapeJobResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            list(watch(cape_pb2.WatchCapeJobRequest(request_id="k"), timeout=CALL_TIMEOUT))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert str(caller) in (info.value.details() or "")
    assert _ledgers(cluster) == before


# -------------------------------------------------------------------------------- curator's policy
@pytest.mark.parametrize(
    ("spec", "range_"),
    [
        (
            _linear(epsilon=3.0),
            "epsilon on every owner's data = 3 is outside this curator's allowed range [0.01, 2]",
        ),
        (_linear(epsilon=0.001), "[0.01, 2]"),
        (
            _linear(delta=1e-4),
            "delta on every owner's data = 0.0001 is outside this curator's "
            "allowed range [1e-12, 1e-05]",
        ),
    ],
    ids=["epsilon-high", "epsilon-low", "delta-high"],
)
def test_a_guarantee_outside_the_curators_policy_is_refused_with_the_range(
    cluster: LocalCluster, spec: CapeJobSpec, range_: str
) -> None:
    before = _ledgers(cluster)
    code, details = _fit_status(cluster, spec)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert range_ in details
    assert _ledgers(cluster) == before


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("spec", "range_"),
    [
        (
            _training(iterations=50),
            "iterations = 50 is outside this curator's allowed range [1, 20]",
        ),
        (_training(hidden=16), "hidden_units = 16 is outside this curator's allowed range [1, 8]"),
        (_training(learning_rate=100.0), "learning_rate = 100 is outside"),
        (
            _training(iterations=20, hidden=8),
            "iterations x parameters (20 x 97) = 1940 is outside this curator's allowed range "
            "[1, 1000]",
        ),
        (_training(epsilon=3.0), "epsilon on every owner's data = 3 is outside"),
    ],
    ids=["iterations", "hidden", "learning-rate", "work", "epsilon"],
)
def test_a_training_outside_the_curators_policy_is_refused_with_the_range(
    cluster: LocalCluster, spec: CapeTrainingSpec, range_: str
) -> None:
    before = _ledgers(cluster)
    code, details = _fit_status(cluster, spec)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert range_ in details
    assert _ledgers(cluster) == before


def test_a_target_no_owner_declared_0_1_is_refused_naming_no_row_or_value(
    cluster: LocalCluster,
) -> None:
    """A training or a logistic regression on the continuous ``target``: the first owner (in
    site order) refuses at open because it did not declare the column 0/1 — a message made of
    the request and the owner's declaration only. Nothing is charged."""
    before = _ledgers(cluster)
    logistic = CapeJobSpec("logistic", FEATURES, ("target", 0.0, 1.0), 1.0, 1e-6)
    for spec, task in ((_training(target="target"), "training"), (logistic, "logistic regression")):
        code, details = _fit_status(cluster, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            f"column 'target' is not a 0/1 column of owner {OWNERS[0]}: a {task} needs a target "
            "its owners declare 0/1 when they start (owner serve --binary-column); this owner "
            "declares ['high']"
        ) in details
        assert "row" not in details
    assert _ledgers(cluster) == before


def test_malformed_requests_are_refused_before_any_owner_is_asked(cluster: LocalCluster) -> None:
    """NaN epsilon or bounds, a mean asked of FitCape, a regression asked of EstimateCapeMean,
    a mean with a target: INVALID_ARGUMENT naming what is wrong, nothing charged."""
    before = _ledgers(cluster)
    training = cape_messages.training_to_proto(_training())
    training.epsilon = float("nan")
    code, details = _raw_status(cluster, "TrainCape", cape_pb2.TrainCapeRequest(spec=training))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "epsilon must be finite" in details
    mean = cape_messages.spec_to_proto(_mean())
    mean.features[0].high = float("nan")
    request = cape_pb2.EstimateCapeMeanRequest(spec=mean)
    code, details = _raw_status(cluster, "EstimateCapeMean", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "bounds of 'c0' must be finite" in details
    fit_a_mean = cape_pb2.FitCapeRequest(spec=cape_messages.spec_to_proto(_mean()))
    code, details = _raw_status(cluster, "FitCape", fit_a_mean)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "EstimateCapeMean" in details
    mean_of_a_fit = cape_pb2.EstimateCapeMeanRequest(spec=cape_messages.spec_to_proto(_linear()))
    code, details = _raw_status(cluster, "EstimateCapeMean", mean_of_a_fit)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "CAPE_TASK_MEAN" in details
    with_target = cape_messages.spec_to_proto(_mean())
    with_target.target.column = "target"
    request = cape_pb2.EstimateCapeMeanRequest(spec=with_target)
    code, details = _raw_status(cluster, "EstimateCapeMean", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "takes no target" in details
    assert _ledgers(cluster) == before


# ------------------------------------------------------------------------------- the command line
def _cli(cluster: LocalCluster, *args: str) -> Any:
    from click.testing import CliRunner

    from dpmarket.deploy.cli import main

    return CliRunner().invoke(
        main,
        [
            args[0], args[1], "--curator", cluster.curator_target,
            "--pki-dir", str(cluster.pki_dir), "--name", "consumer", "--seed", str(SEED),
            *args[2:],
        ],
    )  # fmt: skip


def _check_estimates(document: dict[str, Any], labels: list[str], values: list[float]) -> None:
    """A CAPE document's ``estimates``: per answer, in order, its value, standard error,
    interval and flags, each flag with its code, reason and what it is on."""
    estimates = document["estimates"]
    assert [e["label"] for e in estimates] == labels
    for e, value in zip(estimates, values, strict=True):
        assert e["value"] == value
        assert e["level"] == 0.95 and e["method"] and e["covers"]
        if e["interval"] is None:  # a network: no interval, and a flag that says why
            assert e["standard_error"] is None and e["flags"]
        else:
            low, high = e["interval"]
            assert e["standard_error"] > 0 and low < high
        for flag in e["flags"]:
            assert flag["code"] and flag["reason"] and flag["on"] in ("value", "interval")
    assert "estimates" not in document["report"]  # once, at the top


def test_cape_mean_prints_the_estimate_in_80_columns_and_json(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """``cape mean`` printed the noise level and the file name, not the estimate; then the
    estimate without its standard error and interval."""
    features = [f"--feature={c}={lo:g}:{hi:g}" for c, lo, hi in FEATURES[:4]]
    table = _cli(cluster, "cape", "mean", *features, "--out", str(tmp_path / "mean.json"))
    assert table.exit_code == 0, table.output
    document = json.loads((tmp_path / "mean.json").read_text(encoding="utf-8"))
    _check_estimates(document, list(document["mean"]), list(document["mean"].values()))
    for column, value in document["mean"].items():
        assert f"{column} " in table.output and f"{value:.6g}" in table.output
    for e in document["estimates"]:
        low, high = e["interval"]
        assert f"{e['standard_error']:.3g}" in table.output
        assert f"[{low:.4g}, {high:.4g}]" in table.output
        assert e["standard_error"] == document["report"]["aggregator_noise_std"]
    assert "they cover the mean of the pooled records" in " ".join(table.output.split())
    assert "…" not in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80
    printed = _cli(cluster, "cape", "mean", *features, "--out", str(tmp_path / "m2.json"), "--json")
    assert printed.exit_code == 0, printed.output
    written = json.loads((tmp_path / "m2.json").read_text(encoding="utf-8"))
    assert json.loads(printed.stdout)["mean"] == written["mean"]
    assert json.loads(printed.stdout)["estimates"] == written["estimates"]


def test_cape_logreg_takes_feature_bounds_without_target_bounds(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """``--feature ... --target high``: a 0/1 target needs no bounds. A linear target without
    bounds is refused, naming what to give."""
    features = [f"--feature={c}={lo!r}:{hi!r}" for c, lo, hi in FEATURES[:3]]
    out = str(tmp_path / "model.json")
    fitted = _cli(cluster, "cape", "logreg", *features, "--target", "high", "--out", out)
    assert fitted.exit_code == 0, fitted.output
    model = json.loads(Path(out).read_text(encoding="utf-8"))
    assert list(model["weights"]) == [c for c, _, _ in FEATURES[:3]]
    for column, weight in model["weights"].items():
        assert f"{weight:.6g}" in fitted.output, column
    assert f"{model['intercept']:.6g}" in fitted.output
    _check_estimates(
        model,
        [*model["weights"], "(intercept)"],
        [*model["weights"].values(), model["intercept"]],
    )
    # 440 rows at epsilon 1: the noise hides the fit, and the table says so under it.
    flags = {f["code"]: f for e in model["estimates"] for f in e["flags"]}
    assert "shrunk" in flags
    assert flags["shrunk"]["reason"][:60] in " ".join(fitted.output.split())


def test_cape_train_json_flags_every_weight_without_an_interval(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = str(tmp_path / "network.json")
    printed = _cli(
        cluster, "cape", "train", "--target", "high", "--iterations", "2", "--hidden-units", "2",
        *(f"--feature={c}={lo!r}:{hi!r}" for c, lo, hi in FEATURES[:2]), "--out", out, "--json",
    )  # fmt: skip
    assert printed.exit_code == 0, printed.output
    network = json.loads(printed.stdout)
    p = network["parameters"]
    values = [v for row in p["W1"] for v in row] + p["b1"] + p["w2"] + [p["b2"]]
    labels = ["W1[0,c0]", "W1[0,c1]", "W1[1,c0]", "W1[1,c1]", "b1[0]", "b1[1]", "w2[0]"]
    _check_estimates(network, [*labels, "w2[1]", "b2"], values)
    assert all([f["code"] for f in e["flags"]] == ["no_interval"] for e in network["estimates"])


def test_cape_training_reports_its_progress_from_the_curator(cluster: LocalCluster) -> None:
    """Every iteration's progress reaches the consumer through WatchCapeJob while TrainCape
    runs; the network is the one trained without watching (same seed)."""
    spec = _training(iterations=5)
    events: list[tuple[int, int]] = []
    with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
        watched = client.train_cape(
            spec,
            seed=SEED,
            timeout=CALL_TIMEOUT,
            on_progress=lambda done, total: events.append((done, total)),
        )
        plain = client.train_cape(spec, seed=SEED, timeout=CALL_TIMEOUT)
    np.testing.assert_array_equal(watched.parameters, plain.parameters)
    assert events, "no progress arrived"
    assert all(total == 5 for _, total in events)
    done = [d for d, _ in events]
    assert done == sorted(done) and set(done) <= set(range(6))
    assert len(set(done) & {1, 2, 3, 4, 5}) >= 3  # most iterations were seen


def test_watching_a_refused_training_ends_with_the_refusal(cluster: LocalCluster) -> None:
    spec = _training(epsilon=50.0)  # outside the curator's policy: refused before it starts
    events: list[tuple[int, int]] = []
    with (
        CuratorClient(cluster.curator_target, cluster.consumer_security()) as client,
        pytest.raises(InvalidArgumentError, match="outside this curator's allowed range"),
    ):
        client.train_cape(
            spec, timeout=CALL_TIMEOUT, on_progress=lambda d, t: events.append((d, t))
        )
    assert events == []
