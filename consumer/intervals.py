"""Query-level intervals of ``explore`` that include a bound on the estimator's bias.

:class:`dpmarket.consumer.explore.Explorer` answers through here every query whose bias can be
bounded from the release and the public map; the kernels (noise replicates, bin ranges, M2M's
residual range, the interval itself) are :mod:`dpmarket.common.sketches.intervals`. Per sketch
kind and query kind, the point estimate and the bounds ``[L, U]`` that hold for every data set
(before the noise, which :func:`~dpmarket.common.sketches.intervals.bounded_interval` adds):

HIST (read from the bins directly: ``p_k`` = bin ``k``'s noisy count over the combined count
estimate, :func:`~dpmarket.common.sketches.intervals.count_estimate`)
    *mean, moment2, cdf, one-column count*: ``g`` averaged over the data lies between
    ``sum_k p_k min_{bin k} g`` and ``sum_k p_k max_{bin k} g`` (worst case over where the mass
    sits in each bin; a discrete column's bins hold its levels only, so a binary column's mean is
    exact up to the noise); the point estimate takes ``g``'s average in each bin. A bound the
    same on every bin (a CDF's lower bound 0 at a threshold in the lowest bin, its upper bound 1
    in the top bin) holds whatever the records and is read exactly (:func:`_centre`). The bias bound
    reported (the half-width ``(U - L) / 2``) is read from the release with its negative bin
    counts cut to 0 (every noise-free mass is ``>= 0``): from the noisy release as is, a bin
    whose noisy mass falls below 0 swaps its least and largest value, and a small owner's
    bounds crossed (a negative bias bound). The interval keeps the noisy release's ``L_hat``,
    ``U_hat`` (taken in order where they cross) and their noise: it covers either way.
    *count over several columns*: the Fréchet bounds of a conjunction from each column's bounds,
    ``max(0, sum_j L_j - (k - 1)) <= P <= min_j U_j`` (they hold whatever the joint, which one
    histogram per column does not identify); the point estimate is the product (independence).
    The cut at 0 (like a variance's at ``[0, w^2/4]``) is made on the interval after the noise
    replicates, not on the bounds before them: a cut there flattens the replicates' spread.
    *variance*: ``var = E(x - c)^2 - (E x - c)^2`` for the point estimate ``c`` of the mean: the
    first term bounded bin by bin, the second over the mean's bounds.
    *covariance of two columns*: not identified; ``|cov| <= sd_a sd_b`` (Cauchy-Schwarz) with
    each variance at the upper end of its own interval at level ``1 - alpha/2`` (noise
    included, so both hold at once with probability ``1 - alpha``: Bonferroni), cut to
    ``w^2/4``; point estimate 0 (independence). The noise is added to each variance's bound
    before the product: a noisy release whose variance bound falls below 0 would otherwise
    give the interval ``[0, 0]`` in every noise replicate too.
RFF and RACE (M2M with an unpenalized intercept; the ridge parameter per value from the rule's
value times 10^-3 .. 10, the one giving the narrowest expected interval; the rule's ``n``, the
point's and the interval's are one estimate, the combined count)
    *mean, moment2, cdf, count*: ``[estimate + min r, estimate + max r]``, ``r`` M2M's residual
    over the design (:func:`~dpmarket.common.sketches.intervals.m2m_residual_range`), which
    holds the fit's approximation error and its shrinkage; for a set of measure 0 under the
    design that records may fill (a CDF at a column's lower bound, an equality on a continuous
    column), also over the set's face, where the residual is ``1 - fit`` (a point mass: the
    design's residual alone is 0 there and gave ``[0, 0]``).
    *covariance*: ``E(x_a - c_a)(x_b - c_b) - (E x_a - c_a)(E x_b - c_b)`` with both terms
    bounded that way (interval arithmetic for the product).
A poorly known count (explore's ``few-records`` regime): the means, moments, CDFs and counts
whose bounds are ratios of linear functionals of the release over the count (every M2M linear
answer; a histogram's one-column functionals) get
:func:`~dpmarket.common.sketches.intervals.ratio_interval`'s interval, which takes the count's
noise into account jointly with the sums' (Fieller's test inversion) instead of plugging in the
count estimate; an M2M covariance combines three such intervals (the centred product's moment
and the two means, each at ``1 - alpha/3``: Bonferroni). A histogram's covariances and counts
over several columns keep the plug-in (flagged ``few-records`` there).
A count's number of records (not its fraction): its bounds are ``n`` times the fraction's, linear
in the release once ``n`` is (the noise-free count and block totals are), so its interval
(:func:`~dpmarket.common.sketches.intervals.count_interval`) takes the noise of the sums and of
``n`` from their public law together: a one-column count's or M2M's ``[n L_hat - q, n U_hat +
q]``, a histogram's conjunction's Fréchet bounds ``[sum_j n L_j - (k - 1) n, min_j n U_j]``
widened the same way. The fraction's interval times the count estimate ignored ``n``'s noise.
Logistic regressions (every kind): no bound on the bias; the interval is the noise's
(bootstrap) and the value is flagged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import HISTMap
from dpmarket.common.sketches.intervals import (
    COVERAGE,
    DEFAULT_REPLICATES,
    BinTarget,
    Bounded,
    RatioBounds,
    bin_ranges,
    bounded_interval,
    count_estimate,
    count_interval,
    m2m_residual_range,
    ratio_interval,
    release_totals,
)
from dpmarket.common.sketches.m2m import SyntheticDesign, regularization
from dpmarket.common.sketches.sketch import SketchLike

__all__ = [
    "LAMBDA_FACTORS",
    "hist_bounded",
    "m2m_bounded",
]

Array = NDArray[np.float64]
#: Multiples of the lambda rule's value tried per value (the narrowest expected interval wins).
LAMBDA_FACTORS = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
_Z = 1.959963984540054
#: (point, low, high), each of shape (R, k).
Triple = tuple[Array, Array, Array]


def _hist_offsets(fmap: HISTMap) -> NDArray[np.int64]:
    return np.concatenate([[0], np.cumsum(fmap.n_bins)]).astype(np.int64)


def _centre(low: Array, high: Array) -> tuple[float, float]:
    """The constants ``c_L``, ``c_U`` of ``sum_k p_k g_k = c + sum_k p_k (g_k - c)`` (the true
    masses ``p_k`` add up to 1) by which a bin functional's bounds ``low`` and ``high``, each of
    shape (n_bins,), are read: the value of a bound that is the same on every bin, else the
    middle of their joint range; one ``c`` for both unless both are the same on every bin.

    Notes
    -----
    Centring keeps the noise of the masses' sum from multiplying ``g``'s offset (a year near
    2006 would otherwise carry 2006 times the count's relative error). A bound that is the same
    on every bin holds that value whatever the records (a CDF's lower bound 0 at a threshold
    in a column's lowest bin, its upper bound 1 in the top bin): centred on it, its weights are
    0 and it is read exactly, with no noise. Centred on the joint range's middle, it carries
    half the noise of the column's total against the count: a stranger's ``P[distance <= 0]``,
    whose lower bound is 0 for every data set, was answered ``[0.00081, 0.562]`` so (now ``[0,
    0.527]``). Sharing ``c`` keeps ``U - L = sum_k p_k (high_k - low_k)``, ``>= 0`` wherever the
    masses are (the bias bound read at masses cut to 0:
    :func:`~dpmarket.common.sketches.intervals.bounded_interval`); with both bounds the same on
    every bin, each is read exactly and ``U - L`` is their constant difference.
    """
    low_fixed, high_fixed = low.min() == low.max(), high.min() == high.max()
    if low_fixed and high_fixed:
        return float(low[0]), float(high[0])
    if low_fixed or high_fixed:
        c = float(low[0]) if low_fixed else float(high[0])
        return c, c
    c = (float(low.min()) + float(high.max())) / 2.0
    return c, c


class _HistColumns:
    """Per-column bounded functionals of a HIST release."""

    def __init__(self, fmap: HISTMap, domain: Domain) -> None:
        self.fmap = fmap
        self.domain = domain
        self.offsets = _hist_offsets(fmap)

    def ratio(self, column: int, target: BinTarget) -> RatioBounds:
        """The functional's bounds as ratios over the count (one value): bin weights on the
        column's bins, zero elsewhere, plus the centring constant (:meth:`functional`)."""
        low, high, _ = bin_ranges(self.fmap, self.domain, column, target)
        a, b = int(self.offsets[column]), int(self.offsets[column + 1])
        c_low, c_high = _centre(low, high)
        w_low = np.zeros((int(self.offsets[-1]), 1))
        w_high = np.zeros_like(w_low)
        w_low[a:b, 0], w_high[a:b, 0] = low - c_low, high - c_high
        return RatioBounds(w_low, np.array([c_low]), w_high, np.array([c_high]))

    def functional(self, column: int, target: BinTarget) -> Callable[[Array, Array], Triple]:
        low, high, mid = bin_ranges(self.fmap, self.domain, column, target)
        a, b = int(self.offsets[column]), int(self.offsets[column + 1])
        # The bins' true masses add up to 1 exactly, so sum_k p_k g_k = c + sum_k p_k (g_k - c)
        # for any constant c (_centre); a point estimate the same on every bin is that value.
        c_low, c_high = _centre(low, high)
        c_mid = float(mid[0]) if mid.min() == mid.max() else c_low
        mid, low, high = mid - c_mid, low - c_low, high - c_high

        def f(sums: Array, n_hat: Array) -> Triple:
            p = sums[:, a:b] / n_hat[:, None]
            return c_mid + p @ mid, c_low + p @ low, c_high + p @ high

        return f


def _variance(cols: _HistColumns, column: int, center: float) -> Callable[[Array, Array], Triple]:
    """The variance's bounds (module docstring) for a fixed ``center``."""
    second = cols.functional(column, BinTarget("centered2", center=center))
    first = cols.functional(column, BinTarget("power", order=1))

    def f(sums: Array, n_hat: Array) -> Triple:
        bp, bl, bh = second(sums, n_hat)
        mp, ml, mh = first(sums, n_hat)
        far = np.maximum((ml - center) ** 2, (mh - center) ** 2)
        near = np.where(
            (ml <= center) & (center <= mh), 0.0, np.minimum((ml - center) ** 2, (mh - center) ** 2)
        )
        # Not cut to [0, cap] here: the interval's noise term is the spread of these bounds
        # over noise replicates around the release, and a cut flattens it (a small owner's
        # noisy upper bound below 0 gave 0 in every replicate, the interval [0, 0], which
        # missed 14-18 % of variances). ``explore`` cuts the interval to what a variance can
        # be afterwards, which never removes the truth. The bounds are only kept ordered.
        low = bl - far
        return bp - (mp - center) ** 2, low, np.maximum(bh - near, low)

    return f


def hist_bounded(
    kind: str,
    fmap: HISTMap,
    domain: Domain,
    sketch: SketchLike,
    rng: np.random.Generator,
    *,
    columns: NDArray[np.int64] | None = None,
    thresholds: Array | None = None,
    predicates: dict[int, tuple[float, float]] | None = None,
    replicates: int | None = None,
    span: tuple[Array, Array] | None = None,
) -> Bounded:
    """Bounded answers of a HIST release (module docstring).

    Parameters
    ----------
    kind : {"mean", "moment2", "cdf", "count", "covariance"}
    fmap : HISTMap
    domain : Domain
    sketch : PrivateSketch or SketchUnion
        Made under ``fmap``.
    rng : numpy.random.Generator
        The noise replicates' generator.
    columns : ndarray of int
        ``mean``, ``moment2``, ``cdf``, ``covariance``: the columns, in the query's order.
    thresholds : ndarray of shape (len(columns), q)
        ``cdf``: the points per column.
    predicates : dict of column -> (low, high)
        ``count``: one (intersected) range per column.
    replicates : int, optional
        Noise replicates (default :data:`~dpmarket.common.sketches.intervals.DEFAULT_REPLICATES`).
    span : (ndarray, ndarray), optional
        What each value can be. Given, the means, moments, CDFs and one-column counts get
        :func:`~dpmarket.common.sketches.intervals.ratio_interval`'s interval (exact in the
        count's noise: for a poorly known count); covariances and counts over several columns
        keep the plug-in (their bounds are not ratios of linear functionals).

    Returns
    -------
    Bounded
        Values in the order :func:`dpmarket.consumer.explore._labels` lists them.
    """
    cols = _HistColumns(fmap, domain)
    if kind == "covariance":
        assert columns is not None
        return _hist_covariance(cols, columns, sketch, rng, replicates)
    if kind in ("mean", "moment2"):
        assert columns is not None
        order = 1 if kind == "mean" else 2
        targets = [(int(j), BinTarget("power", order=order)) for j in columns]
    elif kind == "cdf":
        assert columns is not None and thresholds is not None
        targets = [
            (int(j), BinTarget("indicator", high=float(t)))
            for j, row in zip(columns, thresholds, strict=True)
            for t in row
        ]
    elif kind == "count":
        assert predicates
        targets = [
            (j, BinTarget("indicator", low=lo, high=hi))
            for j, (lo, hi) in sorted(predicates.items())
        ]
    else:
        raise ValueError(f"HIST bounds answer mean, moment2, cdf, count, covariance; got {kind!r}")
    parts = [cols.functional(j, target) for j, target in targets]
    estimate = _frechet(parts) if kind == "count" else _stack(parts)
    ratio = None
    if span is not None and (kind != "count" or len(targets) == 1):
        ratio = _stack_ratios([cols.ratio(j, target) for j, target in targets])
    reps = DEFAULT_REPLICATES if replicates is None else replicates
    bounded = bounded_interval(
        estimate, sketch, rng, ratio=ratio, span=span, replicates=reps, masses=True
    )
    if kind != "count":
        return bounded
    columns_ratios = [cols.ratio(j, target) for j, target in targets]
    records = count_interval(columns_ratios, sketch, rng, replicates=reps)
    return dataclasses.replace(bounded, count=records)


def _stack_ratios(parts: list[RatioBounds]) -> RatioBounds:
    """One :class:`RatioBounds` of every part's values, in order."""
    return RatioBounds(
        np.hstack([p.low_weights for p in parts]),
        np.concatenate([p.low_offset for p in parts]),
        np.hstack([p.high_weights for p in parts]),
        np.concatenate([p.high_offset for p in parts]),
    )


def _stack(parts: list[Callable[[Array, Array], Triple]]) -> Callable[[Array, Array], Triple]:
    def f(sums: Array, n_hat: Array) -> Triple:
        out = [part(sums, n_hat) for part in parts]
        return (
            np.column_stack([o[0] for o in out]),
            np.column_stack([o[1] for o in out]),
            np.column_stack([o[2] for o in out]),
        )

    return f


def _frechet(parts: list[Callable[[Array, Array], Triple]]) -> Callable[[Array, Array], Triple]:
    """A conjunction's Fréchet bounds from its columns' bounds; point: independence."""

    def f(sums: Array, n_hat: Array) -> Triple:
        out = [part(sums, n_hat) for part in parts]
        k = len(out)
        point = np.prod([np.clip(o[0], 0.0, 1.0) for o in out], axis=0)
        # Noise-free, sum L_j - (k - 1) <= L_i <= U_i for every i, and 0 <= U_i. The upper
        # bound is not cut at 0, nor kept at least a lower bound cut at 0: that flattened the
        # noise replicates' spread, and a noisy upper bound below 0 gave the interval [0, 0]
        # (explore cuts the interval to [0, 1] after the replicates, which never removes the
        # truth). The lower bound's cut at 0 holds without noise (a count is >= 0) and is kept
        # where the upper bound allows: a lower bound below 0 only widens the interval (a
        # wage count of two columns `uninformative` 71 % of the time against 12 %).
        low = np.sum([o[1] for o in out], axis=0) - (k - 1)
        high = np.maximum(np.min([o[2] for o in out], axis=0), low)
        low = np.minimum(np.maximum(low, 0.0), high)
        if k == 1:
            point, low, high = out[0]
        return point[:, None], low[:, None], high[:, None]

    return f


def _hist_point_means(
    cols: _HistColumns, columns: NDArray[np.int64], sketch: SketchLike
) -> NDArray[np.float64]:
    total, count = release_totals(sketch)
    n0, _ = count_estimate(sketch, total, count)
    means = []
    for j in columns:
        p, _, _ = cols.functional(int(j), BinTarget("power", order=1))(total, n0)
        lo, hi = float(cols.domain.low[j]), float(cols.domain.high[j])
        means.append(float(np.clip(p[0], lo, hi)))
    return np.array(means)


def _hist_covariance(
    cols: _HistColumns,
    columns: NDArray[np.int64],
    sketch: SketchLike,
    rng: np.random.Generator,
    replicates: int | None,
) -> Bounded:
    """Variances and cross-covariances of ``columns`` (upper triangle; module docstring)."""
    centers = _hist_point_means(cols, columns, sketch)
    variances = _stack(
        [_variance(cols, int(j), float(c)) for j, c in zip(columns, centers, strict=True)]
    )
    reps = DEFAULT_REPLICATES if replicates is None else replicates
    var = bounded_interval(variances, sketch, rng, replicates=reps, masses=True)
    # A cross term needs both variances' bounds at once: each at 1 - alpha/2.
    both = bounded_interval(
        variances, sketch, rng, coverage=1.0 - (1.0 - COVERAGE) / 2.0, replicates=reps
    )
    cap = cols.domain.width()[columns] ** 2 / 4.0
    upper = np.clip(both.high, 0.0, cap)
    upper_bias = np.clip(both.high - both.noise, 0.0, cap)  # before the noise's widening
    rows, cols_ = np.triu_indices(columns.size)
    out: dict[str, list[float]] = {k: [] for k in ("value", "low", "high", "se", "bias", "noise")}
    for a, b in zip(rows, cols_, strict=True):
        if a == b:
            entry = [var.value[a], var.low[a], var.high[a], var.se[a], var.bias[a], var.noise[a]]
        else:
            bound = math.sqrt(upper[a] * upper[b])
            bias = math.sqrt(upper_bias[a] * upper_bias[b])
            entry = [0.0, -bound, bound, 0.0, bias, bound - bias]
        for key, v in zip(out, entry, strict=True):
            out[key].append(float(v))
    arr = {k: np.array(v) for k, v in out.items()}
    return Bounded(arr["value"], arr["low"], arr["high"], arr["se"], arr["bias"], arr["noise"])


# ----------------------------------------------------------------------------------- M2M
class _M2MLinear:
    """M2M coefficients and residual range of linear targets, the ridge parameter chosen per
    target among ``rule x LAMBDA_FACTORS`` by the expected half-width.

    ``probes``, optional ``(points, values)`` of shapes (n_p, d) and (n_p, k): more points of
    the domain, with the targets there, over which the residual's range is taken too (the
    faces of a query's set that the design cannot reach: :func:`m2m_bounded`)."""

    def __init__(
        self,
        design: SyntheticDesign,
        sketch: SketchLike,
        values: Array,
        *,
        lambda_rule: str | float,
        intercept: bool,
        probes: tuple[Array, Array] | None = None,
    ) -> None:
        k = values.shape[1]
        probe_matrix = None if probes is None else design.feature_map.design_matrix(probes[0])
        tm = design.target_moments(values)
        n_hat, _ = count_estimate(sketch, *release_totals(sketch))
        n = float(n_hat[0])
        var_sum = float(sketch.sum_noise_variance)
        if isinstance(lambda_rule, str):
            # The rule's n is the point's and the interval's (the combined estimate), not the
            # noisy count alone: one n per release (a RACE map's differ).
            base = regularization(sketch, lambda_rule, n_hat=n)  # type: ignore[arg-type]
            grid = [base * f for f in LAMBDA_FACTORS]
        else:
            grid = [float(lambda_rule)]
        best = np.full(k, np.inf)
        self.a = np.zeros((design.dimension, k))
        self.a0 = np.zeros(k)
        self.r_low = np.zeros(k)
        self.r_high = np.zeros(k)
        self.lam = np.zeros(k)
        for lam in grid:
            try:
                a, a0 = design.coefficients(tm, lam, intercept=intercept)
            except ValueError:  # not positive definite at this lambda
                continue
            lo, hi = m2m_residual_range(design, values, a, a0)
            if probes is not None and probe_matrix is not None and probes[0].shape[0]:
                r = probes[1] - np.asarray(probe_matrix @ a, dtype=np.float64) - a0[None, :]
                lo, hi = np.minimum(lo, r.min(axis=0)), np.maximum(hi, r.max(axis=0))
            width = (hi - lo) / 2.0 + _Z * np.sqrt(var_sum * (a * a).sum(axis=0)) / n
            better = width < best
            best = np.where(better, width, best)
            self.a[:, better] = a[:, better]
            self.a0[better] = a0[better]
            self.r_low[better] = lo[better]
            self.r_high[better] = hi[better]
            self.lam[better] = lam

    def __call__(self, sums: Array, n_hat: Array) -> Triple:
        point = sums @ self.a / n_hat[:, None] + self.a0[None, :]
        return point, point + self.r_low[None, :], point + self.r_high[None, :]

    def ratio(self) -> RatioBounds:
        """The bounds as ratios over the count: ``S a / n + a0 + [min r, max r]``."""
        return RatioBounds(self.a, self.a0 + self.r_low, self.a, self.a0 + self.r_high)


def m2m_bounded(
    kind: str,
    design: SyntheticDesign,
    sketch: SketchLike,
    rng: np.random.Generator,
    *,
    values: Array | None = None,
    columns: NDArray[np.int64] | None = None,
    lambda_rule: str | float = "theorem",
    intercept: bool = True,
    replicates: int | None = None,
    span: tuple[Array, Array] | None = None,
    column_bounds: tuple[Array, Array] | None = None,
    probes: tuple[Array, Array] | None = None,
    count: bool = False,
) -> tuple[Bounded, Array]:
    """Bounded M2M answers of an RFF or RACE release (module docstring).

    Parameters
    ----------
    kind : {"linear", "covariance"}
        ``linear``: the targets' ``values`` at the design's points, shape (n_s, k) (mean,
        moment2, cdf, count); ``covariance``: the ``columns`` (upper triangle in
        ``numpy.triu_indices`` order).
    design : SyntheticDesign
    sketch : PrivateSketch or SketchUnion
    rng : numpy.random.Generator
    lambda_rule : {"theorem", "paper"} or float
        A rule's value is scaled by :data:`LAMBDA_FACTORS`; a float is used as is.
    intercept : bool
    replicates : int, optional
    span : (ndarray, ndarray), optional
        What each value can be. Given, a ``linear`` answer gets
        :func:`~dpmarket.common.sketches.intervals.ratio_interval`'s interval (exact in the
        count's noise); a covariance, with ``column_bounds``, a Bonferroni combination of such
        intervals (:func:`_m2m_covariance`).
    column_bounds : (ndarray, ndarray), optional
        ``covariance``: the public bounds of ``columns``.
    probes : (ndarray, ndarray), optional
        ``linear``: more points of the domain, shape (n_p, d), and the targets there, shape
        (n_p, k), over which the residual's range is taken as well as over the design's. A set
        of measure 0 under the design (a CDF at a column's lower bound, an equality on a
        continuous column: a point mass the records may hold) has no design point, so the fit
        and its residual there are 0 and the bound ``[0, 0]`` would be wrong; its face probed
        (``explore``'s ``_face_points``) gives the residual ``f - fit`` where
        the records may sit.

    Returns
    -------
    (Bounded, ndarray)
        The answers and the ridge parameter of each.
    """
    reps = DEFAULT_REPLICATES if replicates is None else replicates
    if kind == "linear":
        assert values is not None
        fit = _M2MLinear(
            design, sketch, values, lambda_rule=lambda_rule, intercept=intercept, probes=probes
        )
        ratio = fit.ratio() if span is not None else None
        bounded = bounded_interval(fit, sketch, rng, ratio=ratio, span=span, replicates=reps)
        if count:
            records = count_interval([fit.ratio()], sketch, rng, replicates=reps)
            bounded = dataclasses.replace(bounded, count=records)
        return bounded, fit.lam
    assert columns is not None
    return _m2m_covariance(
        design,
        sketch,
        rng,
        columns,
        lambda_rule=lambda_rule,
        intercept=intercept,
        replicates=reps,
        column_bounds=column_bounds if span is not None else None,
    )


def _product_range(
    dl: Array, dh: Array, rows: NDArray[np.intp], cols: NDArray[np.intp]
) -> tuple[Array, Array]:
    """Least and largest ``d_a d_b`` for ``d`` in ``[dl, dh]`` (last axis: columns) per pair
    ``(rows, cols)``; a square's least is 0 where its interval straddles 0."""
    corners = np.stack(
        [
            dl[..., rows] * dl[..., cols],
            dl[..., rows] * dh[..., cols],
            dh[..., rows] * dl[..., cols],
            dh[..., rows] * dh[..., cols],
        ]
    )
    pmin, pmax = corners.min(axis=0), corners.max(axis=0)
    diagonal = rows == cols
    straddles = (dl <= 0.0) & (dh >= 0.0)
    pmin[..., diagonal] = np.where(straddles, 0.0, np.minimum(dl**2, dh**2))
    return pmin, pmax


def _m2m_covariance(
    design: SyntheticDesign,
    sketch: SketchLike,
    rng: np.random.Generator,
    columns: NDArray[np.int64],
    *,
    lambda_rule: str | float,
    intercept: bool,
    replicates: int,
    column_bounds: tuple[Array, Array] | None,
) -> tuple[Bounded, Array]:
    """:func:`m2m_bounded`'s covariances. With ``column_bounds`` (a poorly known count), the
    interval is the Bonferroni combination of three intervals exact in the count's noise
    (:func:`~dpmarket.common.sketches.intervals.ratio_interval`), each at ``1 - alpha/3``: the
    centred product's moment and the two means, combined by interval arithmetic (all three hold
    at once with probability at least ``1 - alpha``)."""
    points = design.points
    means = _M2MLinear(
        design, sketch, points[:, columns], lambda_rule=lambda_rule, intercept=intercept
    )
    total, count = release_totals(sketch)
    n0, _ = count_estimate(sketch, total, count)
    centers = means(total, n0)[0][0]
    rows, cols = np.triu_indices(columns.size)
    centred = points[:, columns] - centers[None, :]
    products = _M2MLinear(
        design,
        sketch,
        centred[:, rows] * centred[:, cols],
        lambda_rule=lambda_rule,
        intercept=intercept,
    )

    def estimate(sums: Array, n_hat: Array) -> Triple:
        mp, ml, mh = means(sums, n_hat)
        bp, bl, bh = products(sums, n_hat)
        pmin, pmax = _product_range(ml - centers[None, :], mh - centers[None, :], rows, cols)
        dp = mp - centers[None, :]
        return bp - dp[:, rows] * dp[:, cols], bl - pmax, bh - pmin

    lam = np.maximum(means.lam[rows], products.lam)
    bounded = bounded_interval(estimate, sketch, rng, replicates=replicates)
    if column_bounds is None:
        return bounded, lam
    level = 1.0 - (1.0 - COVERAGE) / 3.0
    lo_c, hi_c = (np.asarray(v, dtype=np.float64) for v in column_bounds)
    ml, mh = ratio_interval(
        means.ratio(), sketch, rng, (lo_c, hi_c), replicates=replicates, coverage=level
    )
    # What each centred product can be over the columns' box (its span for the search).
    span_p = _product_range(lo_c - centers, hi_c - centers, rows, cols)
    bl, bh = ratio_interval(
        products.ratio(), sketch, rng, span_p, replicates=replicates, coverage=level
    )
    pmin, pmax = _product_range(ml - centers, mh - centers, rows, cols)
    low, high = bl - pmax, bh - pmin
    return (
        Bounded(
            value=bounded.value,
            low=low,
            high=high,
            se=bounded.se,
            bias=bounded.bias,
            noise=np.maximum(((high - low) - 2.0 * bounded.bias) / 2.0, 0.0),
            count_free=True,
        ),
        lam,
    )


def interval_basis(kind: str, query_kind: str, n_columns: int) -> tuple[str, str]:
    """What a value's interval covers (its basis,
    :data:`dpmarket.common.uncertainty.BASES`) and one line on how it was built.

    Parameters
    ----------
    kind : {"hist", "rff", "race"}
        The sketch kind.
    query_kind : str
        :attr:`dpmarket.consumer.explore.Query.kind`.
    n_columns : int
        The columns the value is about (a count's predicated columns; 1 for a variance).

    Returns
    -------
    (str, str)
        ``"noise"`` for a logistic regression (its bias is not bounded), ``"bounds"`` where one
        histogram per column leaves the value unidentified (a count over several columns, a
        covariance of two: bounds that hold whatever the joint, around the independence
        guess), ``"noise+bias"`` otherwise; and the construction in words.
    """
    if query_kind == "logreg":
        return (
            "noise",
            "bootstrap over the release's noise (16 refits): the fit's bias is not bounded",
        )
    if kind == "hist":
        if query_kind == "count" and n_columns > 1:
            return (
                "bounds",
                "Fréchet bounds of the conjunction from each column's histogram (they hold "
                "whatever the joint), widened by the noise; the value assumes independence",
            )
        if query_kind == "covariance" and n_columns > 1:
            return (
                "bounds",
                "|cov| <= sd_a sd_b (Cauchy-Schwarz): one histogram per column does not "
                "identify a relation between columns; the value assumes independence",
            )
        return (
            "noise+bias",
            "every bin's mass anywhere in its bin (binning bound), widened by the noise",
        )
    return (
        "noise+bias",
        "M2M's residual range over the design (its fit and shrinkage), widened by the noise",
    )


def finite_or_nan(values: Array) -> Array:
    """``values`` with infinities replaced by NaN (for JSON)."""
    out = np.asarray(values, dtype=np.float64).copy()
    out[~np.isfinite(out)] = math.nan
    return out
