"""The curator refuses a session or a CAPE job whose parties declare different schemas, naming
the column, before any owner opens it (nothing charged)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.schema import Column, Schema
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.summary import SessionRequest
from dpmarket.curator.cape_service import CapeJobs
from dpmarket.curator.policy import CuratorPolicy, RequestRate
from dpmarket.curator.summarization.session import SessionContext, SummarizationSession
from dpmarket.experiments.runner import local_cape_sites
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalCapeSiteEndpoint, LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet, Table

#: The owners' policy: the defaults, and the candidates methods served (their rows are picked
#: along the curator's embedding: tests/owner/test_exact_bids.py, the default refuses them).
SERVING = OwnerPolicy(allow_steered_selection=True)

COLUMNS = (
    Column("age", "integer", 0, 120),
    Column("bmi", "continuous", 10, 60),
    Column("high", "binary", 0, 1),
)
SCHEMA = Schema(COLUMNS, "high")
WIDER = Schema((COLUMNS[0], Column("bmi", "continuous", 10, 70), COLUMNS[2]), "high")


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.c_[rng.integers(20, 80, 40), rng.uniform(18, 40, 40), rng.integers(0, 2, 40)]


def _owner(
    tmp_path: Path, name: str, schema: Schema | None, seed: int
) -> tuple[Owner, OwnerLedger]:
    rows = _rows(seed)
    ledger = OwnerLedger.create(tmp_path / name, SERVING)
    points = PointSet(rows[:, :2], rows[:, 2].astype(int), name, columns=("age", "bmi"))
    return Owner(name, points, ledger=ledger, schema=schema), ledger


def _session(owners: list[Owner], **declared: object) -> SummarizationSession:
    validation = _rows(9)[:10, :2]
    config = CandidatesConfig(summary_size=5, gamma=0.001)
    request = SessionRequest(config, validation, np.zeros((0, 2)), seed=0, **declared)  # type: ignore[arg-type]
    return SummarizationSession(
        request, [LocalOwnerEndpoint(o) for o in owners], SessionContext(session_id="s" * 32)
    )


def test_an_owner_with_another_schema_is_refused_naming_it_and_the_column(tmp_path: Path) -> None:
    a, ledger_a = _owner(tmp_path, "clinic-a", SCHEMA, 1)
    b, ledger_b = _owner(tmp_path, "clinic-b", WIDER, 2)
    session = _session([a, b], schema=SCHEMA)
    with pytest.raises(FailedPreconditionError) as info:
        asyncio.run(session.prepare())
    assert str(info.value) == (
        "the schemas differ: column 'bmi': the consumer declares bmi (continuous in [10, 60]), "
        "owner clinic-b bmi (continuous in [10, 70])"
    )
    assert not a.sessions and not b.sessions  # no owner opened it
    assert ledger_a.entries() == [] and ledger_b.entries() == []


def test_owners_that_disagree_are_refused_without_a_consumer_schema(tmp_path: Path) -> None:
    a, _ = _owner(tmp_path, "clinic-a", SCHEMA, 1)
    b, _ = _owner(tmp_path, "clinic-b", None, 2)
    with pytest.raises(FailedPreconditionError, match="owner clinic-b declares no schema"):
        asyncio.run(_session([a, b]).prepare())


def test_validation_columns_in_another_order_are_refused(tmp_path: Path) -> None:
    a, _ = _owner(tmp_path, "clinic-a", SCHEMA, 1)
    with pytest.raises(
        FailedPreconditionError, match="column 1 is 'bmi' in the validation set but 'age'"
    ):
        asyncio.run(_session([a], feature_names=("bmi", "age")).prepare())


def test_matching_schemas_open_the_session(tmp_path: Path) -> None:
    a, _ = _owner(tmp_path, "clinic-a", SCHEMA, 1)
    b, _ = _owner(tmp_path, "clinic-b", SCHEMA, 2)
    session = _session([a, b], schema=SCHEMA, feature_names=())
    asyncio.run(session.prepare())
    assert len(a.sessions) == 1 and len(b.sessions) == 1
    asyncio.run(session.abandon())


class OpenCounting(LocalCapeSiteEndpoint):
    """Counts the jobs the curator opens at this site."""

    def __init__(self, inner: LocalCapeSiteEndpoint) -> None:
        super().__init__(inner.site, inner.rounds)
        self.opened = 0

    async def open_job(self, job_id, spec, seed, consumer, market=None):
        self.opened += 1
        return await super().open_job(job_id, spec, seed, consumer, market)


def _jobs(schemas: tuple[Schema, ...]) -> tuple[CapeJobs, list[OpenCounting]]:
    tables = [
        Table(("age", "bmi", "high"), _rows(k), f"clinic-{k}", ("high",), schema)
        for k, schema in enumerate(schemas)
    ]
    sites = [OpenCounting(site) for site in local_cape_sites(tables)]
    policy = CuratorPolicy().with_overrides(allow_seeded_sessions=True)
    return CapeJobs(sites, policy=policy, store=None, rate=RequestRate(1000)), sites


def test_a_cape_job_with_another_schema_is_refused_before_any_site_opens() -> None:
    jobs, sites = _jobs((SCHEMA, WIDER, SCHEMA))
    spec = CapeMeanSpec((("age", 0.0, 120.0),), 1.0, 1e-6)
    with pytest.raises(FailedPreconditionError, match=r"column 'bmi'.*owner clinic-1"):
        asyncio.run(jobs.fit(spec, 1, consumer="consumer:c", schema=SCHEMA))
    assert [s.opened for s in sites] == [0, 0, 0]
    jobs, sites = _jobs((SCHEMA, SCHEMA, SCHEMA))
    document = asyncio.run(jobs.fit(spec, 1, consumer="consumer:c", schema=SCHEMA))
    assert len(document["mean"]) == 1 and [s.opened for s in sites] == [1, 1, 1]
