"""A pass over an owner's table has a deadline scaled to its declared rows, and progress keeps a
slow owner in the session; a silent or stalled one is dropped, named, and its call cancelled."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from dpmarket.common.summarization.endpoints import OwnerInfo
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.summary import SessionRequest
from dpmarket.curator.summarization.state import (
    PROGRESS_GRACE,
    SECONDS_PER_ROW,
    SessionContext,
    SessionState,
    stage_deadline,
)

TIMEOUT = 0.2


class _Owner:
    """An owner whose pass takes ``seconds``; with ``progress``, it reports growing ticks (or
    frozen ones when ``stalled``)."""

    def __init__(self, name: str, seconds: float, *, progress: bool, stalled: bool = False) -> None:
        self.name = name
        self.seconds = seconds
        self.stalled = stalled
        self.ticks = 0
        self.cancelled = False
        if progress:
            self.progress = self._progress

    async def _progress(self, session_id: str) -> tuple[str, int, int, int]:
        assert session_id == "s"
        if not self.stalled:
            self.ticks += 1
        return "count", self.ticks, 100, self.ticks

    async def count(self) -> int:
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return 7


def _state(owners: list[_Owner], rows: list[int]) -> SessionState:
    state = SessionState(
        SessionRequest(CandidatesConfig(summary_size=1), np.zeros((2, 3)), seed=0),
        owners,  # type: ignore[arg-type]
        SessionContext(session_id="s", call_timeout=TIMEOUT),
    )
    for slot, owner, n in zip(state.slots, owners, rows, strict=True):
        slot.info = OwnerInfo(owner.name, n, 3, False)
    return state


def test_the_deadline_of_a_pass_scales_with_the_declared_rows() -> None:
    assert stage_deadline(30.0, 10**7, "call") == 30.0
    assert stage_deadline(30.0, 10**7, "open") == pytest.approx(30.0 + 10**7 * SECONDS_PER_ROW)
    # A 10^7-row owner: 530 s before its progress is asked for, the old 30 s per call gone.
    assert stage_deadline(30.0, 10**7, "candidates") == pytest.approx(530.0)


def test_progress_keeps_a_slow_owner_and_silence_drops_one() -> None:
    owners = [
        _Owner("slow-but-working", 4 * TIMEOUT, progress=True),
        _Owner("stalled", 60.0, progress=True, stalled=True),
        _Owner("silent", 4 * TIMEOUT, progress=False),
        _Owner("large", 4 * TIMEOUT, progress=False),
    ]
    # The large owner declares rows enough for a deadline of TIMEOUT + 2 s.
    state = _state(owners, [0, 0, 0, int(2.0 / SECONDS_PER_ROW)])

    async def run() -> dict[int, int]:
        return await state.gather(range(4), lambda i: owners[i].count(), stage="count")

    answers = asyncio.run(run())
    assert answers == {0: 7, 3: 7}
    assert state.dropped() == ("stalled", "silent")
    notes = state.drop_notes()
    assert "stalled: no answer within" in notes and "no progress in the last 0.2 s" in notes
    assert "silent: no answer within 0 s" in notes
    assert owners[1].cancelled and owners[2].cancelled
    assert not owners[0].cancelled and not owners[3].cancelled


def test_a_round_trip_keeps_the_call_timeout() -> None:
    owners = [_Owner("slow", 4 * TIMEOUT, progress=True)]
    state = _state(owners, [10**9])

    async def run() -> dict[int, int]:
        return await state.gather([0], lambda i: owners[i].count())

    assert asyncio.run(run()) == {}
    assert state.dropped() == ("slow",) and owners[0].cancelled


def test_progress_is_not_waited_on_forever() -> None:
    owners = [_Owner("forever", 60.0, progress=True)]
    state = _state(owners, [0])

    async def run() -> dict[int, int]:
        return await state.gather([0], lambda i: owners[i].count(), stage="bid")

    assert asyncio.run(run()) == {}
    assert f"no answer within {PROGRESS_GRACE:g} times its deadline" in state.drop_notes()
