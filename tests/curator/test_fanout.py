"""The curator calls every owner of a stage at once: summarization and CAPE with many owners.

Each owner here waits, in every call of the stages under test, on a barrier shared by all the
owners of the stage: the barrier opens only once every owner's call is in flight, so a curator
that called owners one after another would never get a first answer (the test's deadline, a
safety net against that hang and no timing assertion, would then fail it). The CAPE job has 40
sites, so its noise round runs SecAgg+ (:mod:`dpmarket.common.secagg.sparse`), whose six stages are
checked the same way, as is a re-plan after a site lost before revealing its graph nonce.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from dpmarket.common.summarization.methods import PrivateConfig
from dpmarket.curator.cape import CapeJob
from dpmarket.experiments.runner import run_session
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet
from tests.curator.test_cape import (
    Site,
    _check_zero_sum_over_averaged_sites,
    _sites,
    _spec,
    _tables,
)

#: Seconds a barrier waits for the other owners: a guard against a hang, not a measurement.
DEADLINE = 120.0


class Meeting:
    """One barrier per stage, for ``parties`` owners, made in the running event loop."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.barriers: dict[str, asyncio.Barrier] = {}
        self.met: defaultdict[str, int] = defaultdict(int)

    async def meet(self, stage: str) -> None:
        barrier = self.barriers.setdefault(stage, asyncio.Barrier(self.parties))
        await asyncio.wait_for(barrier.wait(), DEADLINE)
        self.met[stage] += 1


class MeetingOwner(LocalOwnerEndpoint):
    """An in-process owner whose first call of each stage waits for every other owner's."""

    def __init__(self, owner: Owner, meeting: Meeting) -> None:
        super().__init__(owner)
        self.meeting = meeting
        self.done: set[str] = set()

    async def _once(self, stage: str) -> None:
        if stage not in self.done:
            self.done.add(stage)
            await self.meeting.meet(stage)

    async def info(self):
        await self._once("info")
        return await super().info()

    async def open_session(self, *args, **kwargs):
        await self._once("open")
        return await super().open_session(*args, **kwargs)

    async def bid(self, *args, **kwargs):
        await self._once("bid")
        return await super().bid(*args, **kwargs)

    async def close_session(self, *args, **kwargs):
        await self._once("close")
        return await super().close_session(*args, **kwargs)


def test_a_summarization_session_calls_its_30_owners_at_once(digits: Scenario) -> None:
    """The digits owners cut into 30: the owners' info, the session openings, the first
    auction's bids and the closings all meet at their barriers, and the session completes."""
    parts = [
        PointSet(owner.features[i::6], owner.labels[i::6], f"{owner.name}-{i}")  # type: ignore[index]
        for owner in digits.owners
        for i in range(6)
    ]
    meeting = Meeting(len(parts))
    endpoints = [MeetingOwner(Owner(p.name, p), meeting) for p in parts]
    config = PrivateConfig(summary_size=10)
    result = run_session(endpoints, digits.validation, digits.seed_set, config, seed=2)
    assert len(result.points) == 10
    assert dict(meeting.met) == {s: 30 for s in ("info", "open", "bid", "close")}


STAGES = (
    "open",
    "attest",
    "plan",
    "advertise",
    "reveal",
    "share",
    "mask",
    "check",
    "unmask",
    "release",
)


class MeetingSite(Site):
    """A CAPE site whose every protocol stage waits for all the sites' calls of that stage."""

    meeting: Meeting

    def _reach(self, stage: str, iteration: int | None = None) -> None:
        super()._reach(stage, iteration)
        self._stage = stage

    async def _meet(self) -> None:
        await self.meeting.meet(self._stage)

    async def open_job(self, *args, **kwargs):
        result = await super().open_job(*args, **kwargs)
        await self._meet()
        return result

    async def attest_plan(self, *args, **kwargs):
        result = await super().attest_plan(*args, **kwargs)
        await self._meet()
        return result

    async def plan_job(self, *args, **kwargs):
        result = await super().plan_job(*args, **kwargs)
        await self._meet()
        return result

    async def advertise_keys(self, *args, **kwargs):
        result = await super().advertise_keys(*args, **kwargs)
        await self._meet()
        return result

    async def reveal_nonce(self, *args, **kwargs):
        result = await super().reveal_nonce(*args, **kwargs)
        await self._meet()
        return result

    async def share_keys(self, *args, **kwargs):
        result = await super().share_keys(*args, **kwargs)
        await self._meet()
        return result

    async def masked_input(self, *args, **kwargs):
        result = await super().masked_input(*args, **kwargs)
        await self._meet()
        return result

    async def consistency_check(self, *args, **kwargs):
        result = await super().consistency_check(*args, **kwargs)
        await self._meet()
        return result

    async def unmask(self, *args, **kwargs):
        result = await super().unmask(*args, **kwargs)
        await self._meet()
        return result

    async def release(self, *args, **kwargs):
        result = await super().release(*args, **kwargs)
        await self._meet()
        return result


@pytest.mark.slow
def test_a_cape_job_of_40_sites_calls_them_at_once_and_runs_secagg_plus() -> None:
    """A capeFM linear regression over 40 sites against 2 colluders: every stage of the job
    and of its sparse noise round meets at its barrier, and the zero-sum noise holds over the
    averaged sites."""
    names = tuple(f"site-{i:02d}" for i in range(40))
    tables = _tables(60, seed=4, sites=names)
    meeting = Meeting(len(names))
    MeetingSite.meeting = meeting
    sites = _sites(tables, kinds={n: MeetingSite for n in names})
    spec = dataclasses.replace(_spec(), colluders=2)
    job = CapeJob("job-fan", spec, list(sites.values()), np.random.default_rng(4))
    result = asyncio.run(job.run())
    assert result.report["secure_aggregation"]["graph"] == "sparse"
    assert result.report["secure_aggregation"]["failure_bound"] <= 2.0**-40
    assert dict(meeting.met) == {s: 40 for s in STAGES}
    _check_zero_sum_over_averaged_sites(spec, sites, result, 1e-5)


@pytest.mark.slow
def test_a_site_lost_before_its_nonce_is_re_planned_without_and_nothing_released() -> None:
    """Site 7 vanishes when asked for its graph nonce: the round aborts before any share leaves
    a site, the job re-plans over the other 39 and their noise is zero-sum over them."""
    names = tuple(f"site-{i:02d}" for i in range(40))
    tables = _tables(60, seed=5, sites=names)
    sites = _sites(tables, lose={"site-07": "reveal"})
    spec = dataclasses.replace(_spec(), colluders=2)
    job = CapeJob("job-lost", spec, list(sites.values()), np.random.default_rng(5))
    result = asyncio.run(job.run())
    assert "site-07" not in result.report["sites"] and len(result.report["sites"]) == 39
    assert "site-07" in result.report["dropped"]
    assert result.report["noise_rounds"] == 2
    assert not sites["site-07"].releases
    _check_zero_sum_over_averaged_sites(spec, sites, result, 1e-5)
