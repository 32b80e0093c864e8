"""Retried CAPE requests, as summarization's: the same answer for the same key, nothing charged
twice, never a storage error; a refusal leaves nothing under its key. In-process owners and the
curator's real SQLite store (a restart is a new :class:`CapeJobs` over the same directory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.errors import (
    AbortedError,
    BudgetRefusedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from dpmarket.curator.cape_service import CapeJobs
from dpmarket.curator.policy import CuratorPolicy, RequestRate
from dpmarket.curator.store import CuratorStore
from dpmarket.experiments.runner import local_cape_sites
from dpmarket.owner.local import LocalCapeSiteEndpoint
from dpmarket.runtime.tables import Table

CONSUMER = "consumer:alice"
SPEC = CapeMeanSpec((("a", 0.0, 1.0), ("b", -1.0, 1.0)), 1.0, 1e-6)
MISSING = CapeMeanSpec((("weight", 0.0, 1.0),), 1.0, 1e-6)


class Counting(LocalCapeSiteEndpoint):
    """An in-process owner that counts its releases and may refuse every one."""

    def __init__(
        self, inner: LocalCapeSiteEndpoint, *, fail_release: bool, down: bool = False
    ) -> None:
        super().__init__(inner.site, inner.rounds)
        self.fail_release = fail_release
        self.down = down
        #: A refusal to raise when the job opens (as the owner's ledger or policy would).
        self.refuse: DPMarketError | None = None
        self.releases = 0

    async def open_job(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise UnavailableError("not reachable")
        if self.refuse is not None:
            raise self.refuse
        return await super().open_job(*args, **kwargs)

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        self.releases += 1
        if self.fail_release:
            raise UnavailableError("gone at its release")
        return await super().release(*args, **kwargs)


def _owners(fail_release: bool = False) -> list[Counting]:
    rng = np.random.default_rng(0)
    tables = [
        Table(("a", "b"), np.column_stack([rng.uniform(0, 1, 30), rng.uniform(-1, 1, 30)]), n)
        for n in ("site-0", "site-1", "site-2")
    ]
    return [Counting(e, fail_release=fail_release) for e in local_cape_sites(tables, seeded=False)]


def _jobs(owners: list[Counting], directory: Path) -> CapeJobs:
    return CapeJobs(
        owners,
        policy=CuratorPolicy(per_consumer_per_minute=1000),
        store=CuratorStore(directory),
        rate=RequestRate(1000),
    )


def _fit(jobs: CapeJobs, spec: CapeMeanSpec, request_id: str, digest: str) -> Any:
    return asyncio.run(
        jobs.fit(spec, None, consumer=CONSUMER, request_id=request_id, request_digest=digest)
    )


def _error(jobs: CapeJobs, spec: CapeMeanSpec, request_id: str, digest: str) -> DPMarketError:
    with pytest.raises(DPMarketError) as info:
        _fit(jobs, spec, request_id, digest)
    return info.value


def test_a_job_needs_every_owner_unless_min_owners_says_otherwise(tmp_path: Path) -> None:
    """One owner of three is down when the job opens: by default the job fails
    FAILED_PRECONDITION saying how many could take part, nothing drawn, released or charged (as
    a summarization request); with min_owners 2 it runs on the other two and its report names
    the one left out. (Before, it ran on two of three and answered as if complete.)"""
    owners = _owners()
    owners[2].down = True
    jobs = _jobs(owners, tmp_path)
    refused = _error(jobs, SPEC, "all", "mean")
    assert isinstance(refused, FailedPreconditionError), refused
    assert "2 of 3 owners can take part; the job needs all 3" in str(refused)
    assert jobs.store is not None
    assert jobs.store.find_request(CONSUMER, "all") is None  # refused: nothing kept, charged
    assert sum(o.releases for o in owners) == 0
    with pytest.raises(InvalidArgumentError, match="min_owners=4 is outside"):
        asyncio.run(jobs.fit(SPEC, None, consumer=CONSUMER, min_owners=4))
    ran = asyncio.run(
        jobs.fit(SPEC, None, consumer=CONSUMER, request_id="two", request_digest="m", min_owners=2)
    )
    assert list(ran["report"]["dropped"]) == ["site-2"]
    assert ran["report"]["sites"] == ["site-0", "site-1"]


def test_a_refused_job_retried_is_refused_again_and_its_key_then_serves_another_request(
    tmp_path: Path,
) -> None:
    """An owner refuses at open (a missing column): the retry with the same key gets the same
    refusal (not INTERNAL from a storage constraint) and charges nothing; the key holds nothing,
    so a corrected request may use it, and its own retries return its answer."""
    owners = _owners()
    jobs = _jobs(owners, tmp_path)
    first = _error(jobs, MISSING, "r-1", "missing")
    again = _error(jobs, MISSING, "r-1", "missing")
    assert isinstance(first, InvalidArgumentError) and type(again) is type(first)
    assert str(again) == str(first) and "'weight'" in str(first)
    assert jobs.store is not None
    done = _fit(jobs, SPEC, "r-1", "mean")
    (row,) = [jobs.store.find_request(CONSUMER, "r-1")]
    assert row is not None and len(jobs.store.charges(row.id)) == 1
    assert _fit(jobs, SPEC, "r-1", "mean") == done
    # After a restart too: the stored document, nothing run or charged again.
    restarted = _jobs(owners, tmp_path)
    assert _fit(restarted, SPEC, "r-1", "mean") == done
    assert sum(o.releases for o in owners) == 3 and len(jobs.store.charges(row.id)) == 1
    with pytest.raises(InvalidArgumentError, match="already used for another request"):
        _fit(restarted, SPEC, "r-1", "another")


def test_a_job_that_failed_after_its_charge_fails_again_on_retry_charging_nothing(
    tmp_path: Path,
) -> None:
    """Every owner is lost at its release, after the job's charge: the retry answers the same
    error (class and message) without running the job or charging again, before and after a
    restart of the curator."""
    owners = _owners(fail_release=True)
    jobs = _jobs(owners, tmp_path)
    first = _error(jobs, SPEC, "r-2", "mean")
    assert isinstance(first, AbortedError) and "no site released" in str(first)
    assert jobs.store is not None
    row = jobs.store.find_request(CONSUMER, "r-2")
    assert row is not None and row.status == "failed"
    charges = jobs.store.charges(row.id)
    assert len(charges) == 1
    releases = sum(o.releases for o in owners)
    for retrying in (jobs, _jobs(owners, tmp_path)):
        again = _error(retrying, SPEC, "r-2", "mean")
        assert type(again) is AbortedError and str(again) == str(first)
    assert sum(o.releases for o in owners) == releases
    assert jobs.store.charges(row.id) == charges


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (BudgetRefusedError("epsilon: spent 9.5 of 10, 0.5 left"), "open: budget refused"),
        (
            FailedPreconditionError("S_C=1 is below this owner's floor (cape.min_colluders)"),
            "open: refused (FAILED_PRECONDITION: cape.min_colluders); the owner's own words: «",
        ),
    ],
)
def test_an_owner_refusing_at_open_is_left_out_where_min_owners_allows(
    tmp_path: Path, refusal: DPMarketError, reason: str
) -> None:
    """One owner of three refuses the job when it opens (its budget, its policy): with
    min_owners 2 the mean runs on the other two, planned over them alone, the third in the
    report's ``dropped`` with its public reason, asked for no release and charged nothing; by
    default (every owner) the job fails naming it, nothing kept or charged. (Before, the
    refusal failed the job whatever min_owners said.)"""
    owners = _owners()
    owners[2].refuse = refusal
    jobs = _jobs(owners, tmp_path)
    ran = asyncio.run(
        jobs.fit(SPEC, None, consumer=CONSUMER, request_id="two", request_digest="m", min_owners=2)
    )
    report = ran["report"]
    assert report["sites"] == ["site-0", "site-1"] == list(report["sizes"])
    assert report["dropped"]["site-2"].startswith(reason), report["dropped"]
    assert "0.5 left" not in json.dumps(report)
    assert [o.releases for o in owners] == [1, 1, 0]
    spent = report["owner_spend"]
    assert spent["site-2"]["epsilon"] == 0 and spent["site-0"]["epsilon"] > 0

    failed = _error(jobs, SPEC, "all", "mean")
    assert type(failed) is type(refusal), failed
    assert str(failed).startswith("owner site-2: ") and "0.5 left" not in str(failed)
    assert jobs.store is not None and jobs.store.find_request(CONSUMER, "all") is None
    owners[1].refuse = refusal  # two of three refuse: min_owners 2 is not met either
    with pytest.raises(DPMarketError) as info:
        asyncio.run(jobs.fit(SPEC, None, consumer=CONSUMER, min_owners=2))
    failed = info.value
    assert type(failed) is type(refusal) and str(failed).startswith("owner site-1: ")
    assert "1 of 3 owners can take part; the job needs at least 2" in str(failed)
    assert [o.releases for o in owners] == [1, 1, 0]
