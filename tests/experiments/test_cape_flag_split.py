"""The coverage of CAPE's intervals conditional on their flag (issue 28): which answers count as
unflagged or ``undetermined``, the Wilson interval of each proportion, and the band's verdict.

Control: before this split, :mod:`dpmarket.experiments.cape_coverage` had no ``split_by_flag``,
``flag_group`` or ``wilson_interval`` (``ImportError``), its tally no ``by_flag`` entry and
``cape_rules.simulate`` no ``*_count`` entries (``KeyError``): every coverage figure pooled
flagged and unflagged releases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from dpmarket.common.cape.uncertainty import Estimate
from dpmarket.common.uncertainty import Flag
from dpmarket.experiments.cape_coverage import (
    FLAG_GROUPS,
    _tally,
    band_verdict,
    flag_group,
    split_by_flag,
    wilson_interval,
)

UNDETERMINED = Flag("undetermined", "an eigenvalue within one noise std of 0")
SIGN = Flag("sign_not_resolved", "the interval contains 0")
SHRUNK = Flag("shrunk", "the floor raised an eigenvalue")
NO_INTERVAL = Flag("no_interval", "no interval", on="interval")


def _estimate(low: float, high: float, *flags: Flag) -> Estimate:
    return Estimate("b", 0.5 * (low + high), 1.0, low, high, 0.95, "test", "test", flags)


def test_a_tiny_tally_splits_each_answer_by_its_flag_with_known_counts() -> None:
    """Five repetitions of two answers, truth 0 for both. Answer 0: two unflagged intervals
    (one covers; one carries only value flags, ``sign_not_resolved`` and ``shrunk``, which do
    not move it out of the unflagged group, and covers), three ``undetermined`` (two cover).
    Answer 1: one unflagged (misses), three ``undetermined`` (all cover), one ``no_interval``
    (in neither group, though its ends contain 0). The pooled coverage stays over every answer:
    8 of 10."""
    covers, misses = (-1.0, 1.0), (1.0, 2.0)
    rows: list[tuple[Estimate, ...]] = [
        (_estimate(*covers), _estimate(*misses)),
        (_estimate(*covers, SIGN, SHRUNK), _estimate(*covers, UNDETERMINED)),
        (_estimate(*covers, UNDETERMINED, SHRUNK), _estimate(*covers, UNDETERMINED)),
        (_estimate(*covers, UNDETERMINED), _estimate(*covers, UNDETERMINED, SIGN)),
        (_estimate(*misses, UNDETERMINED), _estimate(*covers, NO_INTERVAL)),
    ]
    tally = _tally(rows, np.zeros(2))
    assert tally["coverage"] == pytest.approx(8 / 10)
    unflagged, undetermined = (tally["by_flag"][g] for g in FLAG_GROUPS)
    assert unflagged["count"] == [2, 1] and unflagged["covered"] == [2, 0]
    assert undetermined["count"] == [3, 3] and undetermined["covered"] == [2, 3]
    assert unflagged["coverage"] == [1.0, 0.0]
    assert undetermined["coverage"] == pytest.approx([2 / 3, 1.0])
    assert unflagged["wilson"][0] == pytest.approx(list(wilson_interval(2, 2)))
    assert flag_group(rows[4][1]) is None


def test_an_empty_group_has_no_coverage_and_unknown_groups_are_refused() -> None:
    split = split_by_flag([["unflagged"], ["unflagged"]], np.array([[True], [False]]))
    assert split["undetermined"].count == (0,) and split["undetermined"].coverage() == [None]
    assert split["undetermined"].verdicts() == ["none"]
    assert split["unflagged"].coverage() == [0.5]
    with pytest.raises(ValueError, match="unknown flag groups"):
        split_by_flag([["shrunk"]], np.array([[True]]))
    with pytest.raises(ValueError, match="differ in shape"):
        split_by_flag([["unflagged", None]], np.array([[True]]))


@pytest.mark.parametrize(("covered", "count"), [(0, 1), (3, 7), (190, 200), (400, 400)])
def test_the_wilson_interval_is_scipys(covered: int, count: int) -> None:
    expected = binomtest(covered, count).proportion_ci(0.95, method="wilson")
    assert wilson_interval(covered, count) == pytest.approx((expected.low, expected.high))


def test_the_band_verdict_needs_an_interval_around_95_inside_92_to_98() -> None:
    """380 of 400 (Wilson 92.4-96.7) passes; 190 of 200 (91.0-97.3) cannot tell; 400 of 400
    (99.0-100) is above; 360 of 400 (86.7-92.6) below."""
    assert band_verdict(380, 400) == "pass"
    assert band_verdict(190, 200) == "too few"
    assert band_verdict(400, 400) == "above"
    assert band_verdict(360, 400) == "below"
    assert band_verdict(0, 0) == "none"
    with pytest.raises(ValueError, match="count"):
        wilson_interval(3, 2)


def test_cape_rules_counts_each_release_in_the_group_the_curator_flags() -> None:
    """Computers' logistic regression, six releases: per coefficient the two groups hold every
    release, the ``undetermined`` count is the harness's own count of undetermined fits (an
    eigenvalue within one noise std of 0, judged independently of the flags), and the groups'
    covered counts add up to the pooled coverage."""
    from dpmarket.experiments.cape_rules import flag_split, simulate

    reps = 6
    result = simulate("computers-logreg", reps, rules=("floored", "hull"))
    for rule in ("floored", "hull"):
        split = flag_split(result, rule)
        counts = np.add(split["unflagged"].count, split["undetermined"].count)
        np.testing.assert_array_equal(counts, reps)
        np.testing.assert_array_equal(
            split["undetermined"].count, round(float(result["undetermined"]) * reps)
        )
        covered = np.add(split["unflagged"].covered, split["undetermined"].covered)
        np.testing.assert_allclose(covered, result[rule] * reps)


def test_an_undetermined_flag_on_the_interval_keeps_its_answer_in_its_group() -> None:
    """Since ``undetermined`` sits on the interval (the curator's estimates), its answers are not
    reliable, yet they still form the ``undetermined`` group, whichever side the flag is on;
    ``no_interval`` alone leaves the answer in no group. Control: the rule before returned
    ``None`` for any answer that was not reliable, so every undetermined answer left the split."""
    on_interval = Flag("undetermined", "an eigenvalue within one noise std of 0", on="interval")
    answer = _estimate(-1.0, 1.0, on_interval, SHRUNK)
    assert not answer.reliable
    assert flag_group(answer) == "undetermined"
    assert flag_group(_estimate(-1.0, 1.0, UNDETERMINED)) == "undetermined"
    assert flag_group(_estimate(-1.0, 1.0, SHRUNK)) == "unflagged"
    assert flag_group(_estimate(-1.0, 1.0, NO_INTERVAL)) is None
