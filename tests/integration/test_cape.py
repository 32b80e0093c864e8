"""CAPE across real processes: five owners and a curator over mTLS fit capeFM on real data.

Owners hold parquet tables of scikit-learn's diabetes data (440 of its 442 rows, 88 per owner:
columns ``c0`` .. ``c9``, ``target`` and a 0/1 ``high`` for logistic regression; all but the last
owner also hold a column ``extra``). Two clusters, each an OS process per party started by
:class:`deploy.launcher.LocalCluster` with seeded runs allowed:

* ``cluster``: five owners with room for many jobs; what is fitted, charged and refused.
* ``budget_cluster``: two owners whose lifetime epsilon is 1.5 (1.0 per job).

What each owner spent is read from its own durable ledger, never from what the curator reports;
the report's ``owner_spend`` must agree with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pytest
from google.protobuf.message_factory import GetMessageClass
from sklearn.datasets import load_diabetes

from common.cape.spec import CapeJobSpec
from consumer.client import CapeFit, CuratorClient
from curator.cape import CapeResult
from deploy.cape_experiments import DIABETES_BOUNDS, DIABETES_TARGET
from deploy.launcher import CURATOR_NAME, LocalCluster
from deploy.pki import identity_files
from deploy.runner import fit_cape
from dpmarket import cape_messages
from dpmarket.identity import Identity
from dpmarket.transport import TransportSecurity, sync_channel
from dpmarket.v1 import cape_pb2, secure_aggregation_pb2
from owner.data import Table, load_table
from owner.ledger import LedgerEntry, OwnerLedger

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
[sessions]
per_consumer_per_minute = 1000
"""
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
    cluster: LocalCluster, spec: CapeJobSpec, request_id: str = ""
) -> tuple[grpc.StatusCode, str]:
    """A FitCape that must fail: its status code and details."""
    request = cape_pb2.FitCapeRequest(
        spec=cape_messages.spec_to_proto(spec), request_id=request_id, seed=SEED
    )
    with sync_channel(cluster.curator_target, cluster.consumer_security(), CURATOR) as channel:
        return _unary_status(channel, CAPE_SERVICE.methods_by_name["FitCape"], request)


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
    loaded: list[Table] = [load_table(tables[o]) for o in owners]
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
    report = fit.report
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
        spent = report["owner_spend"][owner]
        assert spent == {
            "epsilon": entry.epsilon,
            "delta": entry.delta,
            "points": 0,
            "non_private": False,
        }
    assert len(sessions) == 1  # one job, the same id at every owner


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
    # The same key for another request is refused, and charges nothing either.
    code, details = _fit_status(cluster, _linear(epsilon=0.5), request_id="cape-retry-1")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "cape-retry-1" in details and "another request" in details
    assert _ledgers(cluster) == before


# ----------------------------------------------------------------------------------------- budgets
def test_an_owner_without_budget_left_refuses_the_job_before_any_release(
    budget_cluster: LocalCluster,
) -> None:
    """Lifetime epsilon 1.5: a first job at epsilon 1 is charged once per owner; a second at
    epsilon 1 is refused when it opens (FAILED_PRECONDITION) and no ledger gains an entry; a job
    at epsilon 0.5 still fits in what is left."""
    owners = tuple(budget_cluster.owner_ids)
    first = _fit(budget_cluster, _linear(epsilon=1.0))
    assert first.report["sites"] == list(owners)
    after_first = _ledgers(budget_cluster)
    assert all(len(after_first[o]) == 1 for o in owners)

    code, details = _fit_status(budget_cluster, _linear(epsilon=1.0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "budget" in details and "epsilon" in details and "0.5 left" in details
    assert _ledgers(budget_cluster) == after_first

    last = _fit(budget_cluster, _linear(epsilon=0.5))
    assert last.report["sites"] == list(owners)
    new = _new_entries(after_first, _ledgers(budget_cluster))
    assert all([e.epsilon for e in new[o]] == [0.5] for o in owners)


# ------------------------------------------------------------------------------ columns and bounds
def test_a_column_an_owner_lacks_is_refused_and_charges_nothing(cluster: LocalCluster) -> None:
    before = _ledgers(cluster)
    spec = _linear(features=(*FEATURES[:3], ("extra", 10.0, 60.0)))
    code, details = _fit_status(cluster, spec)
    assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
    assert "'extra'" in details and OWNERS[-1] in details
    assert _ledgers(cluster) == before


def test_a_value_outside_its_public_bounds_is_refused_naming_row_and_column(
    cluster: LocalCluster, tables: dict[str, Path]
) -> None:
    """Body mass index bounded by [10, 35], listed first, while owners hold heavier patients:
    the first owner (in site order) refuses, naming its first row outside and the column by its
    name (the spec's column 0 is the table's ``c2``), and nothing is charged."""
    before = _ledgers(cluster)
    narrow = (("c2", 10.0, 35.0), *(f for f in FEATURES if f[0] != "c2"))
    code, details = _fit_status(cluster, _linear(features=narrow))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    bmi = load_table(tables[OWNERS[0]]).select(["c2"])[:, 0]
    row = int(np.argmax(bmi > 35.0))
    assert row > 0  # the row is named, not just the first one
    assert OWNERS[0] in details and f"row {row}" in details and "'c2'" in details
    assert _ledgers(cluster) == before


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
def test_the_cape_service_refuses_an_owner_or_curator_certificate(
    cluster: LocalCluster, caller: Identity
) -> None:
    before = _ledgers(cluster)
    request = cape_pb2.FitCapeRequest(spec=cape_messages.spec_to_proto(_linear()), seed=SEED)
    with _channel(cluster, cluster.curator_target, CURATOR, caller) as channel:
        code, details = _unary_status(channel, CAPE_SERVICE.methods_by_name["FitCape"], request)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert str(caller) in details
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
