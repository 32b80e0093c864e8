"""The curator's session registry: who sees which session, retries, rate and concurrency limits,
expiry and recovery, with in-process owners that keep their own ledgers and an injected clock."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dpmarket.common.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from dpmarket.common.summarization.methods import (
    CandidatesConfig,
    SummarizationConfig,
    UniformConfig,
)
from dpmarket.common.summarization.summary import ProgressEvent, SessionReport, SessionRequest
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.store import RESTART_ERROR, CuratorStore
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner

#: The owners' policy: the defaults, and the candidates methods served (their rows are picked
#: along the curator's embedding: tests/owner/test_exact_bids.py, the default refuses them).
SERVING = OwnerPolicy(allow_steered_selection=True)

ALICE, BOB = "consumer:alice", "consumer:bob"
CONFIG = CandidatesConfig(summary_size=5, rff_dimension=32)
T = TypeVar("T")


class Clock:
    def __init__(self, now: float = 10_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class World:
    manager: SessionManager
    store: CuratorStore
    owners: list[Owner]
    ledgers: list[OwnerLedger]
    clock: Clock
    digits: Scenario

    async def create(
        self, consumer: str = ALICE, config: SummarizationConfig = CONFIG, **kw: Any
    ) -> str:
        request = SessionRequest(
            config, self.digits.validation, self.digits.seed_set, seed=kw.pop("seed", 7)
        )
        return await self.manager.create(request, consumer=consumer, **kw)

    async def finish(
        self, sid: str, consumer: str = ALICE
    ) -> tuple[ProgressEvent, SessionReport | None]:
        last = None
        async for event, report in self.manager.watch(sid, consumer):
            last = (event, report)
        assert last is not None
        return last

    def charges(self) -> int:
        with self.store._lock:
            return int(self.store._conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0])

    def sessions(self) -> int:
        with self.store._lock:
            return int(self.store._conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def ledger_entries(self) -> list[int]:
        return [len(ledger.entries()) for ledger in self.ledgers]


def _world(
    tmp_path: Path,
    digits: Scenario,
    *,
    owner_policy: OwnerPolicy | None = None,
    **policy: Any,
) -> World:
    clock = Clock()
    store = CuratorStore(tmp_path / "curator", clock=clock)
    owners, ledgers = [], []
    for data in digits.owners[:2]:
        ledger = OwnerLedger.create(tmp_path / data.name, owner_policy or SERVING)
        owners.append(Owner(data.name, data, ledger=ledger))
        ledgers.append(ledger)
    manager = SessionManager(
        [LocalOwnerEndpoint(o) for o in owners],
        policy=CuratorPolicy(allow_seeded_sessions=True).with_overrides(**policy),
        store=store,
        clock=clock,
    )
    return World(manager, store, owners, ledgers, clock, digits)


def _run(world_factory: Callable[[], World], body: Callable[[World], Awaitable[T]]) -> T:
    async def main() -> T:
        world = world_factory()
        try:
            return await body(world)
        finally:
            await world.manager.close()

    return asyncio.run(main())


async def _watch_all(manager: SessionManager, sid: str, consumer: str) -> None:
    async for _ in manager.watch(sid, consumer):
        pass


# ------------------------------------------------------------------------- ownership
def test_a_consumer_never_sees_another_consumers_session(tmp_path: Path, digits: Scenario) -> None:
    async def body(w: World) -> None:
        sid = await w.create(ALICE)
        with pytest.raises(NotFoundError, match="unknown session"):
            await _watch_all(w.manager, sid, BOB)
        with pytest.raises(NotFoundError, match="unknown session"):
            w.manager.result(sid, BOB)
        event, report = await w.finish(sid)
        assert event.stage == "done" and report is not None
        with pytest.raises(NotFoundError):
            w.manager.result(sid, BOB)
        # The message shows only a prefix of the id, never the whole.
        with pytest.raises(NotFoundError) as info:
            await _watch_all(w.manager, sid, BOB)
        assert sid not in str(info.value) and sid[:8] in str(info.value)
        assert w.manager.result(sid, ALICE).points.shape[0] == CONFIG.summary_size

        # After a restart the stored session is still alice's alone.
        restarted = SessionManager(w.manager.owners, policy=w.manager.policy, store=w.store)
        with pytest.raises(NotFoundError):
            restarted.result(sid, BOB)
        with pytest.raises(NotFoundError):
            await _watch_all(restarted, sid, BOB)
        assert restarted.result(sid, ALICE).points.shape[0] == CONFIG.summary_size

    _run(lambda: _world(tmp_path, digits), body)


# ----------------------------------------------------------------------- idempotency
def test_a_retried_request_returns_the_same_session_and_charges_nothing_new(
    tmp_path: Path, digits: Scenario
) -> None:
    async def body(w: World) -> None:
        sid = await w.create(request_id="r-1", request_digest="digest-1")
        # A retry while the first attempt still runs.
        assert await w.create(request_id="r-1", request_digest="digest-1") == sid
        await w.finish(sid)
        charges, sessions, entries = w.charges(), w.sessions(), w.ledger_entries()
        assert charges > 0 and all(n > 0 for n in entries)
        assert await w.create(request_id="r-1", request_digest="digest-1") == sid
        assert (w.charges(), w.sessions(), w.ledger_entries()) == (charges, sessions, entries)
        with pytest.raises(InvalidArgumentError, match="'r-1' was already used for another"):
            await w.create(request_id="r-1", request_digest="digest-2")
        assert (w.charges(), w.sessions(), w.ledger_entries()) == (charges, sessions, entries)
        # After a restart the key is found in the store.
        restarted = SessionManager(
            w.manager.owners, policy=w.manager.policy, store=w.store, clock=w.clock
        )
        again = await restarted.create(
            SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=7),
            consumer=ALICE,
            request_id="r-1",
            request_digest="digest-1",
        )
        assert again == sid
        assert (w.charges(), w.sessions(), w.ledger_entries()) == (charges, sessions, entries)
        # The key is the consumer's own: bob's "r-1" is a new session.
        other = await w.create(BOB, request_id="r-1", request_digest="digest-1")
        assert other != sid
        await w.finish(other, BOB)

    _run(lambda: _world(tmp_path, digits), body)


@pytest.mark.parametrize("key", ["x" * 129, "tab\there", "naïve"])
def test_malformed_request_ids_are_refused(tmp_path: Path, digits: Scenario, key: str) -> None:
    async def body(w: World) -> None:
        with pytest.raises(InvalidArgumentError, match="request_id must be 1 to 128 printable"):
            await w.create(request_id=key, request_digest="d")
        assert w.sessions() == 0

    _run(lambda: _world(tmp_path, digits), body)


# --------------------------------------------------------------------------- limits
def test_the_request_rate_is_limited_per_consumer(tmp_path: Path, digits: Scenario) -> None:
    uniform = UniformConfig(summary_size=CONFIG.summary_size, rff_dimension=CONFIG.rff_dimension)

    async def body(w: World) -> None:
        for _ in range(2):
            await w.finish(await w.create(config=uniform))
        with pytest.raises(ResourceExhaustedError, match="2 sessions per minute; retry in 60 s"):
            await w.create(config=uniform)
        await w.finish(await w.create(BOB, config=uniform), BOB)
        w.clock.now += 59.0
        with pytest.raises(ResourceExhaustedError, match="retry in 1 s"):
            await w.create(config=uniform)
        w.clock.now += 1.0
        await w.finish(await w.create(config=uniform))

    _run(lambda: _world(tmp_path, digits, per_consumer_per_minute=2), body)


def test_sessions_beyond_max_running_are_refused_and_leave_nothing(
    tmp_path: Path, digits: Scenario
) -> None:
    async def body(w: World) -> None:
        first = await w.create(ALICE)
        assert w.manager.running == 1
        sessions, entries = w.sessions(), w.ledger_entries()
        with pytest.raises(ResourceExhaustedError, match="at most 1 sessions at once"):
            await w.create(BOB)
        assert (w.sessions(), w.ledger_entries()) == (sessions, entries)
        await w.finish(first)
        await w.finish(await w.create(BOB), BOB)

    _run(lambda: _world(tmp_path, digits, max_running=1), body)


def test_refused_requests_release_and_charge_nothing(tmp_path: Path, digits: Scenario) -> None:
    async def body(w: World) -> None:
        bad = dataclasses.replace(CONFIG, candidate_fraction=0.9)
        with pytest.raises(
            InvalidArgumentError, match=r"candidate_fraction = 0\.9 .*\[0\.05, 0\.5\]"
        ):
            await w.create(config=bad)
        with pytest.raises(PermissionDeniedError, match="seeded"):
            await SessionManager(w.manager.owners, store=w.store).create(
                SessionRequest(CONFIG, digits.validation, digits.seed_set, seed=1), consumer=ALICE
            )
        # The owners' policies refuse the terms: epsilon_owners_total above their per-session 2.
        over_budget = dataclasses.replace(CONFIG, epsilon_owners_total=3.0)
        with pytest.raises(FailedPreconditionError) as refused:
            await w.create(config=over_budget)
        # The owners' refusals name what is spent and left; the consumer reads none of it.
        assert "left out: owner-0-1 (budget refused), owner-3-4 (budget refused)" in str(
            refused.value
        )
        assert "spent" not in str(refused.value) and " of 2" not in str(refused.value)
        assert w.sessions() == 0 and w.charges() == 0
        assert w.ledger_entries() == [0, 0]
        assert all(owner.sessions == {} for owner in w.owners), "opened sessions are closed"

    _run(
        lambda: _world(tmp_path, digits, ranges={"candidate_fraction": (0.05, 0.5)}),
        body,
    )


# --------------------------------------------------------------------- expiry, restart
def test_finished_results_expire_after_their_ttls(tmp_path: Path, digits: Scenario) -> None:
    async def body(w: World) -> None:
        fetched, unfetched = await w.create(), await w.create()
        await w.finish(fetched)
        await w.finish(unfetched)
        start = w.clock.now
        w.clock.now = start + 1.0
        w.manager.result(fetched, ALICE)  # expires 10 s from now
        w.clock.now = start + 10.9
        w.manager.expire()
        w.manager.result(fetched, ALICE)  # a second fetch does not extend it
        w.clock.now = start + 11.0
        w.manager.expire()
        with pytest.raises(NotFoundError, match=r"expired|unknown"):
            w.manager.result(fetched, ALICE)
        with pytest.raises(NotFoundError):
            await _watch_all(w.manager, fetched, ALICE)
        assert w.manager.result(unfetched, ALICE) is not None
        w.clock.now = start + 100.0
        w.manager.expire()
        with pytest.raises(NotFoundError):
            w.manager.result(unfetched, ALICE)

    _run(
        lambda: _world(tmp_path, digits, result_ttl_seconds=99.0, fetched_result_ttl_seconds=10.0),
        body,
    )


def test_a_session_running_when_the_curator_stopped_is_reported_failed(
    tmp_path: Path, digits: Scenario
) -> None:
    async def body(w: World) -> None:
        w.store.create(
            "crashed",
            consumer=ALICE,
            request_id=None,
            request_digest="d",
            method=CONFIG.method,
            config=dataclasses.asdict(CONFIG),
        )
        restarted = SessionManager(w.manager.owners, policy=w.manager.policy, store=w.store)
        last = None
        async for event, report in restarted.watch("crashed", ALICE):
            last = (event, report)
        assert last is not None
        event, report = last
        assert event.stage == "failed" and RESTART_ERROR in event.message
        assert report is not None and report.error == RESTART_ERROR
        with pytest.raises(AbortedError, match="restarted"):
            restarted.result("crashed", ALICE)
        with pytest.raises(NotFoundError):
            restarted.result("crashed", BOB)

    _run(lambda: _world(tmp_path, digits), body)
