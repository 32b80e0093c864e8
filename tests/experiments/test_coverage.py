"""The coverage harness's accounting (dpmarket.experiments.coverage): what counts as flagged and
as covered, on answers built by hand (the intervals' own coverage tests are in
tests/consumer/test_intervals.py and tests/common/sketches/test_marginals_bounds.py)."""

from __future__ import annotations

import numpy as np

from dpmarket.common.uncertainty import Flag
from dpmarket.consumer.explore import Answer, Query
from dpmarket.experiments.coverage import _rows, summarize

QUERY = Query("cdf", columns=("a",), points=(1.0, 2.0, 3.0, 4.0))


def _answer(flags: tuple[tuple[Flag, ...], ...], low: list[float], high: list[float]) -> Answer:
    k = len(flags)
    return Answer(
        QUERY,
        tuple(f"v{j}" for j in range(k)),
        np.full(k, 0.5),
        errors=np.full(k, 0.01),
        flags=flags,
        low=np.array(low),
        high=np.array(high),
        basis=("bounds",) * k,
    )


def test_a_flag_on_the_value_keeps_its_interval_counted_one_on_the_interval_does_not() -> None:
    """A model's guess inside bounds that hold whatever the joint still claims to cover: its
    interval counts, and a miss there is a miss. An interval flagged on itself is left out of
    the unflagged coverage and counted as flagged."""
    guess = Flag("model-guess", "the independence guess", "value")
    wide = Flag("few-records", "the count is known within 40 %", "interval")
    answer = _answer(((), (guess,), (guess,), (wide,)), [0.4, 0.4, 0.4, 0.4], [0.6] * 4)
    truth = Answer(QUERY, answer.labels, np.array([0.5, 0.55, 0.9, 0.9]))
    rows = _rows("t", "tuning", 0, "union", "marginals", answer, truth, np.ones(4))
    assert [r["flag"] for r in rows] == ["", "", "", "few-records"]
    assert [r["covered"] for r in rows] == [True, True, False, False]
    s = summarize(rows)["tuning"]["marginals"]["cdf"]
    assert s["values"] == 4 and s["unflagged"] == 3 and s["flagged"] == 0.25
    assert s["coverage_unflagged"] == 2 / 3 and s["coverage_all"] == 0.5
    assert s["flags"] == {"few-records": 1}
    # The control: were the flag on the value taken as a flag on the interval, the miss at
    # index 2 would vanish from the unflagged coverage and the harness would report 100 %.
    careless = _answer(((), (wide,), (wide,), (wide,)), [0.4] * 4, [0.6] * 4)
    rows = _rows("t", "tuning", 0, "union", "marginals", careless, truth, np.ones(4))
    assert summarize(rows)["tuning"]["marginals"]["cdf"]["coverage_unflagged"] == 1.0


def test_an_uninformative_value_keeps_its_interval_counted_and_its_share_is_reported() -> None:
    """``uninformative`` is on the value: its interval counts (a miss there is a miss) and the
    summary reports the share of such answers beside the flagged fraction."""
    wide = Flag("uninformative", "spans most of [0, 1]", "value")
    answer = _answer(((), (wide,), (wide,), ()), [0.0, 0.0, 0.0, 0.4], [0.6, 1.0, 0.6, 0.6])
    truth = Answer(QUERY, answer.labels, np.array([0.5, 0.9, 0.9, 0.5]))
    rows = _rows("t", "tuning", 0, "union", "rff", answer, truth, np.ones(4))
    s = summarize(rows)["tuning"]["rff"]["cdf"]
    assert s["flagged"] == 0.0 and s["unflagged"] == 4
    assert s["coverage_unflagged"] == 0.75  # the uninformative miss at index 2 counts
    assert s["uninformative"] == 0.5 and s["value_flags"] == {"uninformative": 2}
