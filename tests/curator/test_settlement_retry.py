"""The background settlement retry's schedule (:class:`dpmarket.curator.settlement.RetrySchedule`):
each failed piece waits twice as long as before, up to the cap; a success or a piece gone is
forgotten; one piece's failures never delay another."""

from __future__ import annotations

import pytest

from dpmarket.curator.settlement import RetrySchedule


def test_each_failure_doubles_the_wait_up_to_the_cap_and_a_success_resets_it() -> None:
    schedule = RetrySchedule(base=1.0, cap=5.0)
    key, other = ("deliver", "s", "o-1"), ("deliver", "s", "o-2")
    now = 100.0
    waits = []
    for _ in range(5):
        assert schedule.due(key, now)
        schedule.outcome(key, False, now)
        start = now
        while not schedule.due(key, now):
            now += 0.5
        waits.append(now - start)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    schedule.outcome(key, False, now)
    assert not schedule.due(key, now) and schedule.due(other, now)  # pieces are independent
    schedule.outcome(key, True, now)
    assert schedule.due(key, now)  # a success forgets the failures
    schedule.outcome(key, False, now)
    assert not schedule.due(key, now + 0.9) and schedule.due(key, now + 1.0)  # from base again
    schedule.outcome(other, False, now)
    schedule.keep({other})  # key's work was done elsewhere: forgotten
    assert schedule.due(key, now) and not schedule.due(other, now)


def test_a_schedule_needs_a_positive_base_below_its_cap() -> None:
    for base, cap in ((0.0, 1.0), (2.0, 1.0)):
        with pytest.raises(ValueError, match="0 < base <= cap"):
            RetrySchedule(base=base, cap=cap)


def test_an_owner_down_for_days_keeps_the_capped_wait() -> None:
    """Thousands of failures (an owner down for days at one try per 30 s) keep the wait at the
    cap; an unbounded ``2 ** failures`` overflowed a float after about 1,025 and stopped every
    later retry pass."""
    schedule = RetrySchedule(base=1.0, cap=30.0)
    key, now = ("deliver", "s", "o-1"), 0.0
    for _ in range(5000):
        schedule.outcome(key, False, now)
        now += 30.0
    schedule.outcome(key, False, now)
    assert not schedule.due(key, now + 29.9) and schedule.due(key, now + 30.0)
