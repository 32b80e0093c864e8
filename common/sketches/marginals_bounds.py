"""Intervals for counting queries on a marginals sketch that hold whatever the joint distribution.

A marginals sketch (:mod:`dpmarket.common.sketches.marginals`) measures a few marginals of an
owner's table with Gaussian noise of public scales. A consumer's graphical model answers any query
from them, but where no measurement holds the query's columns together its answer is a guess (the
model takes them as conditionally independent given what was measured) whose error no noise scale
shows. This module bounds a count from the measurements alone:

* **measured** — the query's columns all lie in one measured marginal (every 1-way query; a 2-way
  query on a selected pair): the count is a linear function of that marginal, estimated without
  bias by the inverse-variance weighted mean of every measurement that holds those columns
  (:func:`event_count`); its error is Gaussian with a known variance, so ``estimate -+ z sd``
  covers at the nominal rate exactly;
* **bounds** — otherwise: Fréchet–Bonferroni bounds (Fréchet 1951; Bonferroni inequalities), which
  hold for every table with the measured marginals. Upper: the count of any measured sub-event,
  ``N(A_1 ... A_k) <= N(A_P)`` for ``P`` inside a measured marginal, and for three events ``N(ABC)
  <= n - N(A) - N(B) - N(C) + N(AB) + N(AC) + N(BC)``. Lower: chains over measured sub-events,
  ``N(X Y) >= N(X) + N(Y) - N(Z)`` for ``X, Y`` inside ``Z`` (``Z`` = the events ``X`` and ``Y``
  share; ``n`` when none), e.g. ``N(AB) >= N(A) + N(B) - n``, ``N(ABC) >= N(AB) + N(AC) - N(A)``.
  Each candidate is a linear function of the measurements, widened by ``z sd``; the interval is
  ``[max lower, min upper]`` with the union bound over the candidates (``z`` at ``alpha / (2 K)``
  for ``K`` distinct candidates a side), so it covers with probability at least ``1 - alpha``
  whatever the joint.

Every upper candidate estimates a count (or a sum of counts) that cannot be negative, so its
estimate is raised to 0 before it is widened, ``max(U, 0) + z sd`` (:func:`_upper`): the raised
estimate is never farther below the truth, so the candidate fails no more often, and an upper
bound is never below ``z sd`` of the measurement that sets it — an interval is never narrower
than that measurement's noise can resolve (the *power-constrained limit* of Cowan, Cranmer,
Gross & Vitells 2011, at the median). Without the raise (``U + z sd`` cut at 0), one 2-way
measurement whose noise falls about 3 sd below its cell sets a three-column count's upper bound
at or near 0 (``[0, 0]`` when every candidate falls below 0), below what its own two-column
part's interval allows; such intervals are among the rare releases the union bound allows to
miss, but they claim a certainty no measurement has: all 5 narrower than one sd in 400
simulated releases miss (``tests/common/sketches/test_marginals_bounds.py``).

A predicate that cuts a continuous column inside a cell (``x <= 3.7`` where a cell is ``[3, 4)``)
leaves the cell's records unknown: lower bounds count only the cells the predicate covers whole,
upper bounds every cell it touches, so the interval holds whatever the records' values inside a
cell too.

Counts become fractions by dividing by the record count, bounded likewise from every measurement's
total (:func:`total_count`): a Bonferroni bound over numerator and denominator
(:func:`fraction_bounds`), valid however noisy the record count is; where its lower end reaches
the floor of 1 record, the fraction's interval is all of [0, 1]. A count of the union's records
is bounded directly (:func:`union_count_bounds`), never as a fraction's interval times the
estimated record count, which would take that estimate as exact. The covariance of two discrete
columns measured together is bounded the same way from four measured sums
(:func:`covariance_bounds`). Pure computation (numpy, scipy): no I/O.

References
----------
Fréchet, "Sur les tableaux de corrélation dont les marges sont données", 1951; Dobra & Fienberg,
"Bounds for cell entries in contingency tables given marginal totals and decomposable graphs",
PNAS 2000 (sharp bounds from marginals); Boole–Bonferroni inequalities; Cowan, Cranmer, Gross &
Vitells, "Power-constrained limits", arXiv:1105.3166, 2011 (an upper limit kept at least the one
its measurement's noise gives when the truth is 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.marginals import Measurement

__all__ = [
    "ALPHA",
    "TOTAL_SHARE",
    "CountBounds",
    "Linear",
    "MeasuredEstimate",
    "count_bounds",
    "covariance_bounds",
    "covariance_estimate",
    "event_count",
    "fraction_bounds",
    "fraction_estimate",
    "record_count_bounds",
    "total_count",
    "union_count_bounds",
    "unmeasured_covariance_bounds",
]

#: Two-sided miss probability of every interval (a 95 % interval).
ALPHA = 0.05
#: Share of ``alpha`` spent on the record count when a count becomes a fraction.
TOTAL_SHARE = 0.2

Weights = Mapping[int, NDArray[np.float64]]


@dataclass(frozen=True)
class Linear:
    """A linear function of a sketch's measurements: ``sum_i <coef_i, y_i>``.

    Attributes
    ----------
    terms : dict of int to ndarray
        Measurement index to a coefficient vector of that measurement's length.
    """

    terms: dict[int, NDArray[np.float64]]

    def __add__(self, other: Linear) -> Linear:
        out = dict(self.terms)
        for i, c in other.terms.items():
            out[i] = out[i] + c if i in out else c
        return Linear(out)

    def __neg__(self) -> Linear:
        return Linear({i: -c for i, c in self.terms.items()})

    def __sub__(self, other: Linear) -> Linear:
        return self + (-other)

    def scaled(self, factor: float) -> Linear:
        """``factor`` times it."""
        return Linear({i: c * factor for i, c in self.terms.items()})

    def value(self, measurements: Sequence[Measurement]) -> float:
        """Its value on the noisy measurements."""
        return math.fsum(float(c @ measurements[i].values) for i, c in self.terms.items())

    def sd(self, measurements: Sequence[Measurement]) -> float:
        """The standard deviation of its noise, ``sqrt(sum_i sigma_i^2 ||coef_i||^2)`` (the
        measurements' noises are independent)."""
        return math.sqrt(
            math.fsum(measurements[i].sigma ** 2 * float(c @ c) for i, c in self.terms.items())
        )

    def covariance(self, other: Linear, measurements: Sequence[Measurement]) -> float:
        """The covariance of its noise and ``other``'s, ``sum_i sigma_i^2 <coef_i, other_i>``
        over the measurements both read (the measurements' noises are independent)."""
        return math.fsum(
            measurements[i].sigma ** 2 * float(c @ other.terms[i])
            for i, c in self.terms.items()
            if i in other.terms
        )


def _coefficients(
    clique: tuple[int, ...], cells: Sequence[int], weights: Weights
) -> NDArray[np.float64]:
    """``prod_j w_j(cell_j)`` over a measured clique's cells (C order), 1 for its columns not in
    ``weights``."""
    out = np.ones((), dtype=np.float64)
    for j in clique:
        w = weights.get(j)
        out = np.multiply.outer(out, np.ones(int(cells[j])) if w is None else w)
    return np.asarray(out, dtype=np.float64).reshape(-1)


def event_count(
    measurements: Sequence[Measurement], cells: Sequence[int], weights: Weights
) -> Linear | None:
    """The minimum-variance unbiased linear estimate of ``sum_cells prod_j w_j(cell_j) N(cell)``
    over the columns of ``weights``, from every measurement that holds all of them.

    Parameters
    ----------
    measurements : sequence of Measurement
        A sketch's noisy marginals.
    cells : sequence of int
        Cells per column.
    weights : mapping of column to ndarray of shape (cells[column],)
        Empty: the record count ``n`` (every measurement's total estimates it).

    Returns
    -------
    Linear or None
        ``None`` when no measurement holds every column of ``weights``.

    Notes
    -----
    Each measurement ``i`` holding the columns gives ``<c_i, y_i>``, unbiased with variance
    ``v_i = sigma_i^2 ||c_i||^2``; the weights ``(1 / v_i) / sum_k (1 / v_k)`` depend only on
    public values, so the combination stays linear and unbiased, with variance
    ``1 / sum_i (1 / v_i)`` (Gauss–Markov for independent estimates).
    """
    columns = set(weights)
    found = [
        (i, _coefficients(m.clique, cells, weights))
        for i, m in enumerate(measurements)
        if columns <= set(m.clique)
    ]
    if not found:
        return None
    inverse = [1.0 / max(measurements[i].sigma ** 2 * float(c @ c), 1e-300) for i, c in found]
    total = math.fsum(inverse)
    return Linear({i: c * (v / total) for (i, c), v in zip(found, inverse, strict=True)})


def total_count(measurements: Sequence[Measurement], cells: Sequence[int]) -> Linear:
    """The record count's estimate (:func:`event_count` with no column)."""
    found = event_count(measurements, cells, {})
    assert found is not None  # every sketch measures every column
    return found


@dataclass(frozen=True)
class CountBounds:
    """A count's interval.

    Attributes
    ----------
    low, high : float
        Records; ``low <= high``.
    measured : bool
        ``True``: one measured marginal holds every column of the query and the interval is the
        unbiased estimate's ``-+ z sd``, its upper end from the estimate raised to 0 (covers at
        ``1 - alpha``, more where the estimate fell below 0); ``False``: Fréchet–Bonferroni
        bounds (cover at ``1 - alpha`` or more, whatever the joint).
    candidates : int
        Linear bounds compared (upper and lower).
    """

    low: float
    high: float
    measured: bool
    candidates: int


def _maximal(sets: Sequence[frozenset[int]]) -> list[frozenset[int]]:
    unique = sorted(set(sets), key=lambda s: (-len(s), sorted(s)))
    out: list[frozenset[int]] = []
    for s in unique:
        if not any(s <= t for t in out):
            out.append(s)
    return out


def _chains(query: frozenset[int], pieces: Sequence[frozenset[int]]) -> list[list[frozenset[int]]]:
    """Covers of ``query`` by ``pieces``, one greedy chain from each first piece: each step adds
    the piece with most new columns, then most overlap with those covered (a larger shared event
    subtracts less)."""
    out: list[list[frozenset[int]]] = []
    seen: set[tuple[frozenset[frozenset[int]], tuple[tuple[int, ...], ...]]] = set()
    for first in pieces:
        chain, covered = [first], set(first)
        while covered != query:
            best = max(
                (p for p in pieces if p - covered),
                key=lambda p: (len(p - covered), len(p & covered), sorted(p)),
                default=None,
            )
            if best is None:
                break
            chain.append(best)
            covered |= best
        if covered != query:
            continue
        # The bound is sum_k N(p_k) - sum_{k>0} N(p_k & earlier) (n where empty): it depends on
        # the pieces and the multiset of what each later one shares, not on their order (a
        # chain A, B and the chain B, A give the same N(A) + N(B) - N(A & B), one candidate).
        shared = sorted(
            tuple(sorted(p & set().union(*chain[:k]))) for k, p in enumerate(chain) if k
        )
        key = (frozenset(chain), tuple(shared))
        if key not in seen:
            seen.add(key)
            out.append(chain)
    return out


def count_bounds(
    measurements: Sequence[Measurement],
    cells: Sequence[int],
    weights: Weights,
    *,
    alpha: float = ALPHA,
) -> CountBounds:
    """An interval for a conjunction's count from a sketch's measurements (module docstring).

    Parameters
    ----------
    measurements : sequence of Measurement
        Every column's 1-way marginal and the selected ones.
    cells : sequence of int
        Cells per column.
    weights : mapping of column to ndarray of shape (cells[column],)
        The share of each cell the column's predicate covers, in [0, 1] (1: whole, 0: none; a
        fraction where the predicate cuts the cell). At least one column. Any finite weights
        (e.g. a discrete column's levels, for its mean) when one measured marginal holds every
        column: the count is then any linear function of that marginal.
    alpha : float
        Two-sided miss probability, in (0, 1).

    Returns
    -------
    CountBounds

    Raises
    ------
    ValueError
        For no column, weights of the wrong length or not finite, weights outside [0, 1] for
        columns no measured marginal holds together, or ``alpha`` outside (0, 1).

    Notes
    -----
    Lower bounds use each column's whole cells (``w == 1``), upper bounds every cell it touches
    (``w > 0``): the count lies between the counts of those two events whatever the records'
    values inside a cell. A lower candidate ``L`` and an upper one ``U`` are linear in the
    measurements with noise sds ``s_L``, ``s_U``; the interval ``[max(0, max_k (L_k - z_L
    s_Lk)), min_k (max(U_k, 0) + z_U s_Uk)]`` misses only if some candidate's noise exceeds its
    ``z s``, with probability at most ``K_L Phi(-z_L) + K_U Phi(-z_U) = alpha`` for ``z =
    Phi^-1(1 - alpha / (2 K))``. Each ``U_k`` estimates a count ``u_k >= 0`` at least the
    query's, and ``max(U_k, 0) + z s >= u_k`` whenever ``U_k + z s >= u_k``: raising a
    negative estimate to 0 (:func:`_upper`) adds coverage only, and keeps the upper bound at
    least ``z_U min_k s_Uk`` (module docstring). A measured count's upper end is ``max(U, 0) +
    z s`` likewise (``U`` its outer event's estimate; ``z`` at ``alpha / 2``): 95 % exactly
    where ``U >= 0``, more where it is not.
    """
    if not weights:
        raise ValueError("a count's bounds need at least one column")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    inner: dict[int, NDArray[np.float64]] = {}
    outer: dict[int, NDArray[np.float64]] = {}
    shares = True
    for j, w in weights.items():
        arr = np.asarray(w, dtype=np.float64)
        if arr.shape != (int(cells[j]),) or not np.isfinite(arr).all():
            raise ValueError(f"column {j}'s weights must be {int(cells[j])} finite numbers")
        shares = shares and bool(((arr >= 0) & (arr <= 1)).all())
        inner[j] = (arr >= 1.0).astype(np.float64)
        outer[j] = (arr > 0.0).astype(np.float64)
    query = frozenset(int(j) for j in weights)
    if not shares:  # a linear function of one measured marginal, or nothing
        exact = event_count(measurements, cells, weights)
        if exact is None:
            raise ValueError(
                f"weights outside [0, 1] need one measured marginal holding columns {sorted(query)}"
            )
        z = _normal_quantile(1.0 - alpha / 2.0)
        value, sd = exact.value(measurements), exact.sd(measurements)
        return CountBounds(value - z * sd, value + z * sd, True, 1)

    def sub(ws: Mapping[int, NDArray[np.float64]], part: frozenset[int]) -> Linear:
        found = event_count(measurements, cells, {j: ws[j] for j in part})
        assert found is not None  # parts are measured
        return found

    whole = event_count(measurements, cells, inner)
    if whole is not None:  # one measured marginal holds every column
        z = _normal_quantile(1.0 - alpha / 2.0)
        up = event_count(measurements, cells, outer)
        assert up is not None
        low = whole.value(measurements) - z * whole.sd(measurements)
        high = _upper(up, measurements, z)
        return CountBounds(*_cut(low, high, 0.0, math.inf), True, 2)
    pieces = _maximal(
        [frozenset(m.clique) & query for m in measurements if frozenset(m.clique) & query]
    )
    uppers = [sub(outer, p) for p in pieces]
    if len(query) == 3 and all(any(frozenset(pair) <= p for p in pieces) for pair in _pairs(query)):
        singles = [sub(outer, frozenset([j])) for j in sorted(query)]
        doubles = [sub(outer, frozenset(pair)) for pair in _pairs(query)]
        union_bound = total_count(measurements, cells)
        for s in singles:
            union_bound = union_bound - s
        for d in doubles:
            union_bound = union_bound + d
        uppers.append(union_bound)
    lowers = []
    for chain in _chains(query, pieces):
        bound = sub(inner, chain[0])
        covered = set(chain[0])
        for p in chain[1:]:
            shared = frozenset(p & covered)
            bound = bound + sub(inner, p)
            bound = bound - (sub(inner, shared) if shared else total_count(measurements, cells))
            covered |= p
        lowers.append(bound)
    z_up = _normal_quantile(1.0 - alpha / (2.0 * len(uppers)))
    high = min(_upper(u, measurements, z_up) for u in uppers)
    low = 0.0
    if lowers:
        z_low = _normal_quantile(1.0 - alpha / (2.0 * len(lowers)))
        low = max(0.0, max(b.value(measurements) - z_low * b.sd(measurements) for b in lowers))
    return CountBounds(min(low, high), max(low, high), False, len(uppers) + len(lowers))


def _upper(bound: Linear, measurements: Sequence[Measurement], z: float) -> float:
    """An upper confidence bound on a count ``u >= 0`` from its unbiased estimate ``U`` (noise
    sd ``s``): ``max(U, 0) + z s``, in records; at least ``z s``.

    ``P(max(U, 0) + z s < u) <= P(U + z s < u) = Phi(-z)``: the estimate raised to the least
    value the count can take is never farther below it. Without the raise, an estimate that
    falls below ``-z s`` gives a bound cut to 0, an interval narrower than the noise allows
    (:func:`count_bounds`' Notes).
    """
    return max(bound.value(measurements), 0.0) + z * bound.sd(measurements)


def _normal_quantile(q: float) -> float:
    """The standard normal quantile ``Phi^{-1}(q)``: ``scipy.special.ndtri``, the function
    ``scipy.stats.norm.ppf`` computes it with (the same value), without importing
    ``scipy.stats`` (about half a second of CPU on the first answer that needs it)."""
    from scipy.special import ndtri

    return float(ndtri(q))


def _pairs(query: frozenset[int]) -> list[tuple[int, int]]:
    ordered = sorted(query)
    return [(a, b) for k, a in enumerate(ordered) for b in ordered[k + 1 :]]


def record_count_bounds(
    sketches: Sequence[Sequence[Measurement]], cells: Sequence[int], *, alpha: float = ALPHA
) -> tuple[float, float]:
    """The union's record count's bounds :func:`fraction_bounds` divides by: ``sum_s
    max(n_s -+ z sd_s, 1)``, each owner's record count (:func:`total_count`) at ``z`` for
    ``TOTAL_SHARE alpha`` split evenly over the ``S`` owners, two-sided.

    Parameters
    ----------
    sketches : sequence of sequence of Measurement
        Each owner's measurements (at least one owner).
    cells : sequence of int
    alpha : float
        As :func:`fraction_bounds`'.

    Returns
    -------
    (n_low, n_high)
        Records, ``n_low <= n_high``, each owner's term floored at 1.

    Raises
    ------
    ValueError
        If ``sketches`` is empty.
    """
    if not sketches:
        raise ValueError("no sketch to bound from")
    z_n = _normal_quantile(1.0 - TOTAL_SHARE * alpha / (2.0 * len(sketches)))
    n_low = n_high = 0.0
    for ms in sketches:
        n = total_count(ms, cells)
        value, sd = n.value(ms), n.sd(ms)
        n_low += max(value - z_n * sd, 1.0)
        n_high += max(value + z_n * sd, 1.0)
    return n_low, n_high


def fraction_bounds(
    sketches: Sequence[Sequence[Measurement]],
    cells: Sequence[int],
    weights: Weights,
    *,
    alpha: float = ALPHA,
    record_counts: tuple[float, float] | None = None,
) -> tuple[float, float, bool]:
    """An interval for the fraction of the union's records that a conjunction holds: a Bonferroni
    bound over the counts (numerators) and the record counts (denominator), failure probability
    at most ``alpha`` however noisy the record count.

    Parameters
    ----------
    sketches : sequence of sequence of Measurement
        Each owner's measurements (at least one owner).
    cells : sequence of int
    weights : mapping of column to ndarray
        As :func:`count_bounds`.
    alpha : float
        Two-sided miss probability of the whole interval.
    record_counts : (float, float), optional
        :func:`record_count_bounds` of ``sketches`` at ``alpha``, when already computed (they
        do not depend on ``weights``: the values of one answer share them); computed here
        otherwise.

    Returns
    -------
    (low, high, measured)
        ``low <= high``, in [0, 1] for weights in [0, 1]; ``measured`` when every owner's count
        was measured (not bounded).

    Raises
    ------
    ValueError
        If ``sketches`` is empty.

    Notes
    -----
    ``(1 - TOTAL_SHARE) alpha`` goes to the counts and ``TOTAL_SHARE alpha`` to the record
    counts, each split evenly over the ``S`` owners (union bound): with probability at least
    ``1 - alpha`` every owner's count lies in ``[L_s, U_s]`` and its record count in ``n_s -+ z
    sd``, so the fraction lies between ``sum L_s / sum n_s^-+`` and ``sum U_s / sum n_s^-+``
    (the smaller and the larger of each pair; ``[sum L_s / sum n_s^+, sum U_s / sum n_s^-]``
    for a count). Each ``n_s^-`` is floored at 1 (an owner holds a record at least), so where
    the record count's interval reaches 0 the upper end is the count's upper bound over 1
    record, at least ``z sd`` of its measurement: the interval is then [0, 1], what a fraction
    over an unknown number of records can be.

    Measured at epsilon 0.3 on a 67-record owner whose records all lie in one cell (the
    drafted plan's ``sigma``, 70.2 for a 1-way marginal and 62.5 for a pair; the record count's
    estimate has sd 50, its lower end at the floor in 353 of 400 simulated releases, each with
    the fraction's interval [0, 1]), one-column fractions cover in 395 to 400 of 400
    (``tests/common/sketches/test_marginals_bounds.py``). An upper count bound taken as ``U + z
    sd`` cut at 0, its estimate not raised to 0 first (:func:`_upper`), can end below 1 record:
    a real release of that owner read ``[0, 0.403]`` for a truth of 1.0 (``[0, 0]`` in the
    test's control, [0, 1] here), one of the misses the union bound allows, but one that looks
    informative. The fraction is not a count: ``[low, high]`` times the estimated record count
    misses a count whenever that estimate is far off (half the simulated releases of that
    owner); :func:`union_count_bounds` bounds the count.
    """
    if not sketches:
        raise ValueError("no sketch to bound from")
    s = len(sketches)
    low = high = 0.0
    measured = True
    for ms in sketches:
        b = count_bounds(ms, cells, weights, alpha=(1.0 - TOTAL_SHARE) * alpha / s)
        low += b.low
        high += b.high
        measured = measured and b.measured
    n_low, n_high = (
        record_counts
        if record_counts is not None
        else record_count_bounds(sketches, cells, alpha=alpha)
    )
    lo = min(low / n_low, low / n_high)
    hi = max(high / n_low, high / n_high)
    if all(((np.asarray(w) >= 0) & (np.asarray(w) <= 1)).all() for w in weights.values()):
        lo, hi = _cut(lo, hi, 0.0, 1.0)
    return lo, hi, measured


def union_count_bounds(
    sketches: Sequence[Sequence[Measurement]],
    cells: Sequence[int],
    weights: Weights,
    *,
    alpha: float = ALPHA,
) -> tuple[float, float, bool]:
    """An interval for the count of the union's records that a conjunction holds, in records:
    the sum over the ``S`` owners of :func:`count_bounds` at ``alpha / S`` (union bound: every
    owner's interval holds at once with probability at least ``1 - alpha``).

    Parameters
    ----------
    sketches : sequence of sequence of Measurement
        Each owner's measurements (at least one owner).
    cells : sequence of int
    weights : mapping of column to ndarray
        As :func:`count_bounds`.
    alpha : float
        Two-sided miss probability of the whole interval, in (0, 1).

    Returns
    -------
    (low, high, measured)
        Records, ``0 <= low <= high`` for weights in [0, 1]; ``measured`` when every owner's
        count was measured (not bounded).

    Raises
    ------
    ValueError
        If ``sketches`` is empty, or as :func:`count_bounds`.

    Notes
    -----
    No record count enters: a count's interval does not depend on how well the number of
    records is known. Its control is :func:`fraction_bounds`' interval times the estimated
    record count (:func:`total_count`), which takes that estimate as exact: on a 67-record
    owner at epsilon 0.3 (record count sd 50) it covered a count of 67 in 195 of 400
    simulated releases, this interval in 400 (``tests/common/sketches/
    test_marginals_bounds.py``; a real release of such an owner was read ``[0, 4.5]`` for 67
    records).
    """
    if not sketches:
        raise ValueError("no sketch to bound from")
    s = len(sketches)
    low = high = 0.0
    measured = True
    for ms in sketches:
        b = count_bounds(ms, cells, weights, alpha=alpha / s)
        low += b.low
        high += b.high
        measured = measured and b.measured
    return low, high, measured


def _cut(low: float, high: float, floor: float, ceil: float) -> tuple[float, float]:
    """``[low, high]`` cut to what the quantity can be, ``[floor, ceil]``; an interval wholly
    outside is moved inside whole (its width kept, up to the range's) instead of collapsed
    onto the edge.

    Notes
    -----
    An interval wholly outside the range has already missed (the quantity lies in the range),
    an event of probability at most ``alpha``; intersecting it with the range would leave an
    empty interval, or one of width 0 at the edge once widened to hold the model's value — a
    fraction of 0.99886 answered ``[0.999999, 1]`` when the noise put a count's lower bound
    above the record count's upper bound. Moving it whole keeps the spread the noise showed.
    Intervals that meet the range are intersected with it, as the cut does not change whether
    they cover; moving the others can only add coverage.
    """
    width = high - low
    if low > ceil:
        return max(ceil - width, floor), ceil
    if high < floor:
        return floor, min(floor + width, ceil)
    return max(low, floor), min(high, ceil)


def _covariance_sums(
    columns: tuple[int, int], values: Sequence[NDArray[np.float64]]
) -> dict[str, dict[int, NDArray[np.float64]]]:
    """The weights of the four sums a covariance of ``columns`` reads (``S_xy``, ``S_x``,
    ``S_y`` and the record count ``n``), as :func:`event_count` takes them: per column, its
    cells' values (shape ``(levels,)``); ``x * x`` for a variance."""
    a, b = columns
    x, y = (np.asarray(v, dtype=np.float64) for v in values)
    return {"xy": {a: x * x} if a == b else {a: x, b: y}, "x": {a: x}, "y": {b: y}, "n": {}}


def covariance_bounds(
    sketches: Sequence[Sequence[Measurement]],
    cells: Sequence[int],
    columns: tuple[int, int],
    values: tuple[NDArray[np.float64], NDArray[np.float64]],
    *,
    alpha: float = ALPHA,
) -> tuple[float, float] | None:
    """An interval for the covariance of two discrete columns over the union's records, from
    the measured marginals that hold both (a variance when the two are the same column).

    Parameters
    ----------
    sketches : sequence of sequence of Measurement
        Each owner's measurements (at least one owner).
    cells : sequence of int
        Cells per column.
    columns : (int, int)
        ``a`` and ``b`` (equal for a variance).
    values : (ndarray, ndarray)
        The value of each cell of ``a`` and of ``b`` (a discrete column's levels), shapes
        ``(cells[a],)`` and ``(cells[b],)``.
    alpha : float
        Two-sided miss probability of the whole interval.

    Returns
    -------
    (low, high) or None
        ``None`` when some owner measured no marginal holding both columns (nothing bounds the
        covariance from the release then: the model's value is a guess).

    Raises
    ------
    ValueError
        If ``sketches`` is empty.

    Notes
    -----
    ``cov = S_xy / n - (S_x / n)(S_y / n)`` with ``S_xy = sum x y``, ``S_x``, ``S_y`` and the
    record count ``n`` over the union's records: each is a sum over owners of a linear function
    of that owner's measurements with an unbiased estimate (:func:`event_count`, exact Gaussian
    noise of known variance, independent across owners). Each of the four lies within its
    estimate ``-+ z sd`` with ``z`` at ``alpha / 8`` a side, so all four at once with probability
    at least ``1 - alpha`` (union bound); the covariance then lies in the range interval
    arithmetic gives over that box (``n`` floored at 1): ``E xy`` and the means from the corners
    of their ratio boxes, the product of the means from its four corners (a variance's square
    from 0 when the mean's range straddles it). No model enters, so the graphical model's fit —
    its bias for a measured pair included — cannot make it miss.
    """
    if not sketches:
        raise ValueError("no sketch to bound from")
    sums = _covariance_sums(columns, values)
    z = _normal_quantile(1.0 - alpha / 8.0)
    box: dict[str, tuple[float, float]] = {}
    for key, weights in sums.items():
        value = variance = 0.0
        for ms in sketches:
            found = event_count(ms, cells, weights)
            if found is None:
                return None
            value += found.value(ms)
            variance += found.sd(ms) ** 2
        half = z * math.sqrt(variance)
        box[key] = (value - half, value + half)
    n_lo = max(box["n"][0], 1.0)
    n_hi = max(box["n"][1], n_lo)

    def ratio(key: str) -> tuple[float, float]:
        corners = [v / n for v in box[key] for n in (n_lo, n_hi)]
        return min(corners), max(corners)

    exy, mx, my = ratio("xy"), ratio("x"), ratio("y")
    if columns[0] == columns[1]:
        squares = (mx[0] ** 2, mx[1] ** 2)
        pmin = 0.0 if mx[0] <= 0.0 <= mx[1] else min(squares)
        pmax = max(squares)
    else:
        products = [p * q for p in mx for q in my]
        pmin, pmax = min(products), max(products)
    return exy[0] - pmax, exy[1] - pmin


def unmeasured_covariance_bounds(
    sketches: Sequence[Sequence[Measurement]],
    cells: Sequence[int],
    columns: tuple[int, int],
    values: tuple[NDArray[np.float64], NDArray[np.float64]],
    *,
    alpha: float = ALPHA,
) -> tuple[float, float]:
    """An interval for the covariance of two discrete columns that holds whatever their joint:
    ``|cov| <= sd_a sd_b`` (Cauchy-Schwarz), each variance at the upper end of its own
    :func:`covariance_bounds` interval at ``alpha / 2`` (Bonferroni: both hold at once with
    probability at least ``1 - alpha``).

    Parameters
    ----------
    sketches, cells, alpha
        As :func:`covariance_bounds`.
    columns : (int, int)
        ``a`` and ``b``, distinct.
    values : (ndarray, ndarray)
        The value of each cell of ``a`` and of ``b``.

    Returns
    -------
    (low, high)
        ``(-s, s)`` with ``s = sqrt(var_a^+ var_b^+)``.

    Notes
    -----
    Every column is measured alone in every sketch (its 1-way marginal), so each variance's
    bound exists. Used where no measured marginal holds the pair: the graphical model's value
    is then its independence guess, and these bounds are what the release says whatever the
    joint.
    """
    a, b = columns
    upper = []
    for j, v in ((a, values[0]), (b, values[1])):
        found = covariance_bounds(sketches, cells, (j, j), (v, v), alpha=alpha / 2.0)
        assert found is not None  # every column is measured alone
        upper.append(max(found[1], 0.0))
    s = math.sqrt(upper[0] * upper[1])
    return -s, s


@dataclass(frozen=True)
class MeasuredEstimate:
    """A value estimated from the measured marginals alone, and its noise.

    Attributes
    ----------
    value : float
        The estimate (a fraction, a mean, a second moment or a covariance over the union's
        records).
    sd : float
        Its standard error over the release's Gaussian noise: a fraction's to first order in
        the record count's noise (the delta method; exact for a count); a covariance's to
        second order, its bias included (:func:`covariance_estimate`).
    count : float
        The numerator in records: the unbiased estimate of the weighted count (the sum of the
        owners' :func:`event_count`); NaN for a covariance.
    count_sd : float
        ``count``'s standard deviation (exact: it is linear in the measurements); NaN for a
        covariance.
    """

    value: float
    sd: float
    count: float = math.nan
    count_sd: float = math.nan


def fraction_estimate(
    sketches: Sequence[Sequence[Measurement]], cells: Sequence[int], weights: Weights
) -> MeasuredEstimate | None:
    """The measured estimate of a weighted fraction of the union's records, ``C / N``: ``C``
    the sum over owners of the unbiased weighted count (:func:`event_count`), ``N`` the sum of
    their unbiased record counts (:func:`total_count`), floored at 1 record.

    Parameters
    ----------
    sketches : sequence of sequence of Measurement
        Each owner's measurements (at least one owner).
    cells : sequence of int
        Cells per column.
    weights : mapping of column to ndarray of shape (cells[column],)
        Per-column cell weights (:func:`~dpmarket.common.sketches.marginals.cell_weights`, a
        discrete column's levels or their squares for a mean or a second moment).

    Returns
    -------
    MeasuredEstimate or None
        ``None`` when some owner measured no marginal holding every column of ``weights``
        (the value is then the graphical model's guess, bounded by :func:`fraction_bounds`).

    Raises
    ------
    ValueError
        If ``sketches`` is empty.

    Notes
    -----
    ``C`` and ``N`` are linear in the owners' Gaussian measurements, so ``C`` is unbiased
    with a known variance and ``C / N`` is consistent, its error to first order ``(C - f N) /
    N`` at ``f = C / N``, also linear in the measurements: ``sd = sqrt(sum_s Var(C_s - f N_s))
    / N``, with the covariance of ``C_s`` and ``N_s`` (they share measurements) included. This
    is the estimate :func:`fraction_bounds`' measured interval is built around, so the value,
    its standard error and its interval describe one estimator. The graphical model's value,
    printed before, is a projection of the noisy marginals onto a distribution: it is biased
    where the noise is large against a cell (a sparse cell's model value 1.3e-131, its
    bootstrap spread 1.3e-150, for a truth of 0.027 on a 150-record owner at epsilon 1), and
    its bootstrap spread is not its error.
    """
    if not sketches:
        raise ValueError("no sketch to estimate from")
    counts: list[Linear] = []
    totals: list[Linear] = []
    for ms in sketches:
        found = event_count(ms, cells, weights)
        if found is None:
            return None
        counts.append(found)
        totals.append(total_count(ms, cells))
    count = math.fsum(c.value(ms) for c, ms in zip(counts, sketches, strict=True))
    n = max(math.fsum(t.value(ms) for t, ms in zip(totals, sketches, strict=True)), 1.0)
    f = count / n
    error = math.fsum(
        (c - t.scaled(f)).sd(ms) ** 2 for c, t, ms in zip(counts, totals, sketches, strict=True)
    )
    count_var = math.fsum(c.sd(ms) ** 2 for c, ms in zip(counts, sketches, strict=True))
    return MeasuredEstimate(f, math.sqrt(error) / n, count, math.sqrt(count_var))


def covariance_estimate(
    sketches: Sequence[Sequence[Measurement]],
    cells: Sequence[int],
    columns: tuple[int, int],
    values: tuple[NDArray[np.float64], NDArray[np.float64]],
) -> MeasuredEstimate | None:
    """The measured plug-in estimate of the covariance of two discrete columns over the union's
    records (a variance when the two are the same column), ``S_xy / N - (S_x / N)(S_y / N)``
    from the four unbiased measured sums :func:`covariance_bounds` bounds.

    Parameters
    ----------
    sketches, cells, columns, values
        As :func:`covariance_bounds`.

    Returns
    -------
    MeasuredEstimate or None
        ``None`` when some owner measured no marginal holding both columns.

    Raises
    ------
    ValueError
        If ``sketches`` is empty.

    Notes
    -----
    ``N`` is floored at 1 record, as :func:`covariance_bounds` floors its box, so the estimate
    lies inside that box's interval. Its standard error is the root mean square error of the
    estimate's second-order Taylor expansion in the four sums' Gaussian noise (covariance
    ``S``, 4 x 4: each owner's four linear functions share measurements; owners' noises are
    independent): ``g' S g + tr((H S)^2) / 2 + (tr(H S) / 2)^2`` with ``g = (1/N, -E y/N, -E
    x/N, (2 E x E y - E xy)/N)`` the covariance's gradient in ``(S_xy, S_x, S_y, N)`` and ``H``
    its Hessian (the three terms: the delta method's variance, the quadratic term's variance,
    and its mean, the plug-in's bias, squared; the cross term vanishes for Gaussian noise).
    The first-order term alone vanishes where the gradient does: a coin's variance ``p(1 - p)``
    at ``p = 1/2``, where the estimate's error ``-(p_hat - 1/2)^2`` does not (alone, it gives a
    coin's variance estimated at 0.249997 for a truth of 0.226 an sd of 0.00022: 106 sd off,
    on a 150-record owner at epsilon 1). For a coin the
    second-order terms are ``3 sd_p^4``; in the normal model of ``p_hat``, ``value -+ 1.96 sd``
    then covers at least 92.8 % whatever ``p`` (at worst 2.6 ``sd_p`` from 1/2), against 86 %
    for the first-order sd alone.
    """
    if not sketches:
        raise ValueError("no sketch to estimate from")
    sums = _covariance_sums(columns, values)
    linear: list[dict[str, Linear]] = []
    for ms in sketches:
        own: dict[str, Linear] = {}
        for key, weights in sums.items():
            found = event_count(ms, cells, weights)
            if found is None:
                return None
            own[key] = found
        linear.append(own)
    total = {
        key: math.fsum(own[key].value(ms) for own, ms in zip(linear, sketches, strict=True))
        for key in sums
    }
    n = max(total["n"], 1.0)
    exy, ex, ey = total["xy"] / n, total["x"] / n, total["y"] / n
    keys = ("xy", "x", "y", "n")
    # The four totals' noise covariance: each owner's four sums share measurements; owners'
    # noises are independent.
    sigma = np.array(
        [
            [
                math.fsum(
                    own[p].covariance(own[q], ms) for own, ms in zip(linear, sketches, strict=True)
                )
                for q in keys
            ]
            for p in keys
        ]
    )
    gradient = np.array([1.0, -ey, -ex, 2.0 * ex * ey - exy]) / n
    n2 = n * n
    hessian = np.array(
        [
            [0.0, 0.0, 0.0, -1.0 / n2],
            [0.0, 0.0, -1.0 / n2, 2.0 * ey / n2],
            [0.0, -1.0 / n2, 0.0, 2.0 * ex / n2],
            [-1.0 / n2, 2.0 * ey / n2, 2.0 * ex / n2, (2.0 * exy - 6.0 * ex * ey) / n2],
        ]
    )
    curvature = hessian @ sigma
    variance = float(gradient @ sigma @ gradient) + 0.5 * float(np.trace(curvature @ curvature))
    bias = 0.5 * float(np.trace(curvature))
    return MeasuredEstimate(exy - ex * ey, math.sqrt(max(variance, 0.0) + bias * bias))
