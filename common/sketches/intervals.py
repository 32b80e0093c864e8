"""Intervals that cover the estimator's bias as well as the noise: the kernels behind ``explore``.

A sketch answer is wrong for two reasons: the release's noise, and the estimator's bias (the
binning of a histogram, M2M's linear fit and its shrinkage). A standard error covers the first
only. Every interval built here is

    [L_hat - q, U_hat + q]

where ``[L, U]`` is a pair of functionals of the *noise-free* release between which the true
answer lies whatever the records (a bound on the bias, derived per estimator below), ``L_hat`` and
``U_hat`` the same functionals of the noisy release, and ``q`` the 95 % quantile of
``max(L_hat - L, U - U_hat)`` over the release's noise, drawn from its public law (a parametric
simulation: :func:`noise_replicates`); noisy bounds that cross are taken in order (the ordered
interval contains ``[L_hat - q, U_hat + q]`` whenever that is not empty). The interval then holds
with probability at least 95 %
over the noise for every data set, up to the simulation's plug-in (the replicates are centred on
the noisy release, not the true one) and, for M2M, the design's estimate of a supremum
(:func:`m2m_residual_range`).

* :func:`count_estimate` combines the noisy count with every one-hot block's noisy total (each is
  ``n`` plus independent noise): an inverse-variance average, 3-8 times less variable than the
  count alone for the catalogue's HIST and RACE maps.
* :func:`bin_ranges` gives, per histogram bin, the least, largest and average value of a target
  function over the values the bin can hold: the histogram's bounds are then
  ``sum_k p_k min_k g <= mean(g) <= sum_k p_k max_k g`` (the worst case over where the mass sits
  in each bin).
* :func:`domain_range` gives the same over every value a column's records can hold (its levels,
  its whole numbers or its declared interval): a target whose least and largest values there are
  equal is fixed by the public domain, whatever the records and the sketch kind.
* :func:`m2m_residual_range` bounds M2M's bias: ``mean(f) - <a, z> - a0`` is the data's average
  of the residual ``r = f - <a, Phi> - a0``, hence within ``[min r, max r]`` over the domain.
* :func:`bounded_interval` turns bounds and replicates into the interval, the standard error of
  the point estimate and the half-width of the bias bound.
* :func:`ratio_interval`: where the bounds are ratios of linear functionals of the release over
  the count (:class:`RatioBounds`) and the count is poorly known, the interval by inverting a
  test whose statistic's law is the public noise's (Fieller's construction): no plug-in of the
  count estimate, valid for every data set however noisy the count.
* :func:`count_interval`: a count of records (not a fraction) whose bounds are ``n`` times ratio
  bounds is bounded by linear functionals of the release (``n`` itself is one: the noise-free
  count and block totals), so its interval takes the noise of the sums and of ``n`` together,
  from their public law, with no plug-in of the count estimate.
* :func:`record_count_interval`: the record count's own interval, from its noise law.

Pure numpy: the replicates' generator is the consumer's own (seeded), and only public values
(the release, its noise scales, the map) enter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import HISTMap, OneHotFeatureMap
from dpmarket.common.sketches.m2m import SyntheticDesign
from dpmarket.common.sketches.sketch import PrivateSketch, SketchLike, SketchUnion

__all__ = [
    "COVERAGE",
    "DEFAULT_REPLICATES",
    "RATIO_GRID",
    "BinTarget",
    "Bounded",
    "RatioBounds",
    "bin_ranges",
    "bounded_interval",
    "count_estimate",
    "count_interval",
    "count_weights",
    "domain_range",
    "m2m_residual_range",
    "noise_replicates",
    "ratio_interval",
    "record_count_interval",
    "release_totals",
]

#: Nominal coverage of every interval.
COVERAGE = 0.95
#: Noise replicates behind each interval's quantile (the quantile's own Monte Carlo error is
#: about 0.007 in coverage at 1,000).
DEFAULT_REPLICATES = 1000
#: Candidates per value searched by :func:`ratio_interval`.
RATIO_GRID = 400

Array = NDArray[np.float64]


def _parts(sketch: SketchLike) -> tuple[PrivateSketch, ...]:
    if isinstance(sketch, SketchUnion):
        return sketch.parts
    assert isinstance(sketch, PrivateSketch)
    return (sketch,)


def release_totals(sketch: SketchLike) -> tuple[Array, Array]:
    """The release's noisy sum, shape (1, m), and noisy count, shape (1,) (a union's add its
    parts')."""
    parts = _parts(sketch)
    total = np.sum([p.noisy_sum for p in parts], axis=0)[None, :]
    return total, np.array([math.fsum(p.noisy_count for p in parts)])


def noise_replicates(
    sketch: SketchLike, replicates: int, rng: np.random.Generator
) -> tuple[Array, Array]:
    """The release with ``replicates`` fresh draws of its own noise added.

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
        Each part's noise is drawn from its own mechanism (Laplace or Gaussian) at its own
        public scales; a union's replicate adds its parts'.
    replicates : int
        ``R >= 2``.
    rng : numpy.random.Generator
        The consumer's own randomness.

    Returns
    -------
    sums : ndarray of shape (R, m)
        ``noisy_sum + xi*``.
    counts : ndarray of shape (R,)
        ``noisy_count + zeta*``.

    Notes
    -----
    The law of ``noisy_release* - noisy_release`` is the law of ``noisy_release - release``
    exactly (the noise is additive and independent of the data), so any functional linear in
    the release has, across replicates, exactly the noise distribution of its estimate; for a
    ratio (a sum over a noisy count) the replicates are the usual plug-in approximation.
    """
    parts = _parts(sketch)
    m = parts[0].noisy_sum.shape[0]
    xi = np.zeros((replicates, m))
    zeta = np.zeros(replicates)
    for part in parts:
        mech = part.mechanism
        assert mech.sum_scale is not None and mech.count_scale is not None
        if mech.mechanism == "laplace":
            xi += rng.laplace(0.0, mech.sum_scale, (replicates, m))
            zeta += rng.laplace(0.0, mech.count_scale, replicates)
        elif mech.mechanism == "gaussian":
            xi += rng.normal(0.0, mech.sum_scale, (replicates, m))
            zeta += rng.normal(0.0, mech.count_scale, replicates)
    total = np.sum([p.noisy_sum for p in parts], axis=0)
    count = math.fsum(p.noisy_count for p in parts)
    return total[None, :] + xi, count + zeta


def count_estimate(sketch: SketchLike, sums: Array, counts: Array) -> tuple[Array, float]:
    """The record count from the noisy count and every one-hot block's noisy total.

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
        For its map and noise variances.
    sums : ndarray of shape (R, m)
    counts : ndarray of shape (R,)

    Returns
    -------
    n_hat : ndarray of shape (R,)
        Floored at 1 (the least count a release can have).
    variance : float
        The variance of ``n_hat`` before the floor.

    Notes
    -----
    Every record has exactly one 1 in each block of a one-hot map (HIST: a column; RACE: a
    hash), so each block's noisy total is ``n`` plus the sum of its ``B`` coordinates' noise, of
    variance ``B sigma_xi^2``, independent of the count's noise ``sigma_zeta^2`` and of the other
    blocks'. The inverse-variance average of these unbiased estimates is unbiased with variance
    ``1 / (1/sigma_zeta^2 + sum_b 1/(B_b sigma_xi^2))``. An RFF map has no such blocks: the
    noisy count alone. This is post-processing of the release.
    """
    w_count, w_sums, variance = count_weights(sketch)
    n_hat = w_count * counts if w_sums is None else w_count * counts + sums @ w_sums
    return np.maximum(n_hat, 1.0), variance


def count_weights(sketch: SketchLike) -> tuple[float, Array | None, float]:
    """The linear form of :func:`count_estimate` before its floor:
    ``n_hat = w_count * count + sums @ w_sums``.

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion

    Returns
    -------
    w_count : float
    w_sums : ndarray of shape (m,), or None
        ``None`` when the count alone is used (no one-hot blocks, or a noise-free part).
    variance : float
        The variance of ``n_hat`` (:func:`count_estimate`'s Notes).
    """
    var_count = float(sketch.count_noise_variance)
    var_sum = float(sketch.sum_noise_variance)
    fmap = sketch.feature_map
    if not isinstance(fmap, OneHotFeatureMap) or var_sum == 0.0 or var_count == 0.0:
        return 1.0, None, var_count
    sizes = np.asarray(fmap.block_sizes)
    w_blocks = 1.0 / (sizes * var_sum)
    w_count = 1.0 / var_count
    norm = w_count + float(w_blocks.sum())
    return w_count / norm, np.repeat(w_blocks / norm, sizes), 1.0 / norm


@dataclass(frozen=True)
class BinTarget:
    """A function of one column whose range over a histogram bin is known in closed form.

    Attributes
    ----------
    kind : {"power", "centered2", "indicator"}
        ``"power"``: ``x ** order``; ``"centered2"``: ``(x - center) ** 2``; ``"indicator"``:
        ``1{low <= x <= high}``.
    order : int
        For ``"power"``: 1 or 2.
    center : float
    low, high : float
        For ``"indicator"`` (``-inf`` / ``inf`` open a side).
    """

    kind: str
    order: int = 1
    center: float = 0.0
    low: float = -math.inf
    high: float = math.inf

    def values(self, x: Array) -> Array:
        """The function at values ``x`` (any shape)."""
        if self.kind == "power":
            return np.asarray(x, dtype=np.float64) ** self.order
        if self.kind == "centered2":
            return (np.asarray(x, dtype=np.float64) - self.center) ** 2
        return ((x >= self.low) & (x <= self.high)).astype(np.float64)

    def on_interval(self, a: float, b: float, closed: bool) -> tuple[float, float, float]:
        """``(min, max, average)`` over ``[a, b)`` (``[a, b]`` when ``closed``), the average
        under the uniform distribution."""
        if self.kind == "power" and self.order == 1:
            return a, b, (a + b) / 2.0
        if self.kind in ("power", "centered2"):
            c = self.center if self.kind == "centered2" else 0.0
            lo = 0.0 if a <= c <= b else min((a - c) ** 2, (b - c) ** 2)
            hi = max((a - c) ** 2, (b - c) ** 2)
            u, v = a - c, b - c
            return lo, hi, (u * u + u * v + v * v) / 3.0
        contained = self.low <= a and self.high >= b
        touches = self.high >= a and (self.low <= b if closed else self.low < b)
        overlap = max(0.0, min(b, self.high) - max(a, self.low))
        return float(contained), float(touches), overlap / (b - a)


def bin_ranges(
    fmap: HISTMap, domain: Domain, column: int, target: BinTarget
) -> tuple[Array, Array, Array]:
    """Least, largest and average value of ``target`` over what each bin of a column can hold.

    Parameters
    ----------
    fmap : HISTMap
    domain : Domain
        A discrete column's bins hold its levels only (an empty bin gets 0, 0, 0: its true mass
        is 0, so its coefficient only weighs noise); a continuous column's bin ``k`` holds
        ``[e_k, e_{k+1})``, the last one ``[e_{B-1}, e_B]``, clipped to the domain's bounds; an
        integer column's (:attr:`Domain.integers`) the whole numbers in it only, so a CDF
        threshold on a bin's lower edge counts that edge's records below it, and one inside a
        bin of one whole number does not split it as if uniform.
    column : int
    target : BinTarget

    Returns
    -------
    low, high, mid : ndarray of shape (n_bins[column],)
        The average is over the bin's levels (discrete) or whole numbers (integer), or uniform
        over its interval.
    """
    edges = fmap.bin_edges(column)
    bins = int(fmap.n_bins[column])
    low = np.zeros(bins)
    high = np.zeros(bins)
    mid = np.zeros(bins)
    levels = domain.level_values(column)
    if levels is not None:
        point = np.zeros((levels.shape[0], domain.n_attributes))
        point[:, column] = levels
        point = np.clip(point, fmap.low, fmap.high)
        which = fmap.bucket_indices(point)[:, column] - int(fmap.n_bins[:column].sum())
        vals = target.values(levels)
        for k in range(bins):
            here = vals[which == k]
            if here.size:
                low[k], high[k], mid[k] = here.min(), here.max(), here.mean()
        return low, high, mid
    lo_d, hi_d = float(domain.low[column]), float(domain.high[column])
    whole = domain.is_integer(column)
    for k in range(bins):
        a, b = max(float(edges[k]), lo_d), min(float(edges[k + 1]), hi_d)
        if a > b:
            continue
        closed = k == bins - 1
        if whole:
            low[k], high[k], mid[k] = _on_integers(target, a, b, closed)
        else:
            low[k], high[k], mid[k] = target.on_interval(a, b, closed=closed)
    return low, high, mid


def domain_range(domain: Domain, column: int, target: BinTarget) -> tuple[float, float, float]:
    """Least, largest and average value of ``target`` over every value a column's records can
    hold: its levels (a discrete column), the whole numbers within its declared bounds (an
    integer column, :attr:`Domain.integers`), else the closed interval ``[low, high]``.

    Every record of a release lies in the domain (an owner clamps it there before the release),
    so where the least and largest values are equal the target's mean over the records is that
    value exactly, whatever the records and whichever sketch was released: ``P[x <= t]`` is 1
    for ``t`` at or above the column's upper bound and 0 below its lower bound, while
    ``P[x <= low]`` (least 0, largest 1: records may sit at the bound) is not fixed. It is the
    whole domain read as one histogram bin (:func:`bin_ranges`).

    Parameters
    ----------
    domain : Domain
    column : int
    target : BinTarget

    Returns
    -------
    (least, largest, average) : tuple of float
        The average is over the levels or whole numbers, or uniform over the interval.
    """
    levels = domain.level_values(column)
    if levels is not None:
        vals = target.values(levels)
        return float(vals.min()), float(vals.max()), float(vals.mean())
    lo, hi = float(domain.low[column]), float(domain.high[column])
    if domain.is_integer(column) and math.ceil(lo) <= math.floor(hi):
        return _on_integers(target, lo, hi, closed=True)
    least, largest, mid = target.on_interval(lo, hi, closed=True)
    return float(least), float(largest), float(mid)


#: Whole numbers of one bin enumerated exactly; a wider bin is taken as the interval between its
#: first and last whole number (its bounds still hold; its average is the uniform one's).
_INTEGER_ENUMERATION = 100_000


def _on_integers(target: BinTarget, a: float, b: float, closed: bool) -> tuple[float, float, float]:
    """``(min, max, average)`` of ``target`` over the whole numbers in ``[a, b)`` (``[a, b]``
    when ``closed``), the average uniform over them; ``(0, 0, 0)`` when there are none (the
    bin's true mass is 0, so its coefficient only weighs noise)."""
    first = math.ceil(a)
    last = math.floor(b) if closed else math.ceil(b) - 1
    if first > last:
        return 0.0, 0.0, 0.0
    if last - first >= _INTEGER_ENUMERATION:
        return target.on_interval(float(first), float(last), closed=True)
    vals = target.values(np.arange(first, last + 1, dtype=np.float64))
    return float(vals.min()), float(vals.max()), float(vals.mean())


def m2m_residual_range(
    design: SyntheticDesign, values: Array, a: Array, a0: Array
) -> tuple[Array, Array]:
    """Range of M2M's residual ``r = f - <a, Phi> - a0`` over the design's points.

    Parameters
    ----------
    design : SyntheticDesign
    values : ndarray of shape (n_s, k)
        ``f`` at the design's points.
    a : ndarray of shape (m, k)
    a0 : ndarray of shape (k,)

    Returns
    -------
    low, high : ndarray of shape (k,)
        ``min r`` and ``max r``.

    Notes
    -----
    The noise-free estimate is ``<a, z> + a0 = mean_i(f(x_i)) - mean_i(r(x_i))``, so the
    truth lies in ``[estimate + min r, estimate + max r]`` with the extremes taken over the
    domain, wherever the records sit (the bias of the linear fit and of its shrinkage both live
    in ``r``). The design's ``n_s`` points stand for the domain: an estimate of the supremum
    (exact for a function of one-hot buckets that every bucket's points reach), reported as such.
    """
    # values - (P a + a0), with one (n_s, k) array: its extremes are those of values - P a,
    # shifted by a0 (a shift keeps the order).
    r = np.asarray(design.matrix @ a, dtype=np.float64)
    np.subtract(values, r, out=r)
    return r.min(axis=0) - a0, r.max(axis=0) - a0


@dataclass(frozen=True)
class Bounded:
    """A value with a 95 % interval that includes a bound on its estimator's bias.

    Attributes
    ----------
    value : ndarray of shape (k,)
        The point estimate.
    low, high : ndarray of shape (k,)
        The interval ``[L_hat - q, U_hat + q]`` (module docstring), the noisy bounds taken in
        order: ``[min(L_hat, U_hat) - q, max(L_hat, U_hat) + q]``.
    se : ndarray of shape (k,)
        Standard deviation of the point estimate over the noise replicates.
    bias : ndarray of shape (k,)
        ``(U_hat - L_hat) / 2``: the half-width of the bias bound alone (for masses, from the
        release with its negative masses cut to 0: :func:`bounded_interval`), ``>= 0``.
    noise : ndarray of shape (k,)
        ``q``, the noise's share of the half-width (for a test-inverted interval: how much
        wider than the bias bound it is, per side on average).
    count_free : bool
        ``True`` when the interval was obtained by :func:`ratio_interval` (the count's noise
        taken into account exactly, no plug-in of the count estimate).
    count : (float, float) or None
        For a counting query (one value, a fraction): the 95 % interval of the number of
        records it holds (:func:`count_interval`), in records; ``None`` otherwise.
    """

    value: Array
    low: Array
    high: Array
    se: Array
    bias: Array
    noise: Array
    count_free: bool = False
    count: tuple[float, float] | None = None


@dataclass(frozen=True)
class RatioBounds:
    """Bounds on ``k`` quantities that are ratios of linear functionals of the noise-free
    release over the record count ``n``:
    ``L = S @ low_weights / n + low_offset <= truth <= S @ high_weights / n + high_offset = U``.

    Attributes
    ----------
    low_weights, high_weights : ndarray of shape (m, k)
    low_offset, high_offset : ndarray of shape (k,)
    """

    low_weights: Array
    low_offset: Array
    high_weights: Array
    high_offset: Array


def bounded_interval(
    estimate: Callable[[Array, Array], tuple[Array, Array, Array]],
    sketch: SketchLike,
    rng: np.random.Generator,
    *,
    replicates: int = DEFAULT_REPLICATES,
    coverage: float = COVERAGE,
    ratio: RatioBounds | None = None,
    span: tuple[Array, Array] | None = None,
    masses: bool = False,
) -> Bounded:
    """The interval of a bounded estimator (module docstring).

    Parameters
    ----------
    estimate : callable
        ``estimate(sums, n_hat) -> (point, low, high)``, with ``sums`` of shape (R, m) and
        ``n_hat`` of shape (R,) (:func:`count_estimate`), each output of shape (R, k): the point
        estimate and the bounds ``L``, ``U`` of the quantity computed from that release.
    sketch : PrivateSketch or SketchUnion
    rng : numpy.random.Generator
        Draws the noise replicates.
    replicates : int
    coverage : float
        Nominal coverage, in (0, 1).
    ratio : RatioBounds, optional
        The same bounds as ratios of linear functionals of the release over the count.
    span : (ndarray, ndarray), optional
        What each value can be. With ``ratio``, the interval is :func:`ratio_interval`'s (exact
        in the count's noise) instead of the replicates' plug-in; ``value`` and ``se`` are the
        same either way.
    masses : bool
        The release's sums are masses, ``>= 0`` without noise (a histogram's bin counts): the
        bias half-width ``(U - L) / 2`` is then read from the release with its negative sums cut
        to 0, where it is ``>= 0`` (from the noisy release as is, a bin whose noisy mass is
        below 0 swaps its least and largest value, and the bounds can cross). The interval is
        the same either way.

    Returns
    -------
    Bounded
    """
    total, count = release_totals(sketch)
    n0, _ = count_estimate(sketch, total, count)
    point, low, high = (np.asarray(v, dtype=np.float64)[0] for v in estimate(total, n0))
    sums, counts = noise_replicates(sketch, replicates, rng)
    n_star, _ = count_estimate(sketch, sums, counts)
    p_star, l_star, h_star = (np.asarray(v, dtype=np.float64) for v in estimate(sums, n_star))
    se = p_star.std(axis=0, ddof=1)
    if masses:  # the half-width of the bounds at masses >= 0 (parameter masses)
        _, w_low, w_high = (
            np.asarray(v, dtype=np.float64)[0] for v in estimate(np.maximum(total, 0.0), n0)
        )
        bias = (w_high - w_low) / 2.0
    else:
        bias = (high - low) / 2.0
    if ratio is not None and span is not None:
        lo, hi = ratio_interval(
            ratio, sketch, rng, span, replicates=replicates, coverage=coverage, inside=(low, high)
        )
        return Bounded(
            value=point,
            low=lo,
            high=hi,
            se=se,
            bias=bias,
            noise=np.maximum(((hi - lo) - (high - low)) / 2.0, 0.0),
            count_free=True,
        )
    excess = np.maximum(l_star - low[None, :], high[None, :] - h_star)
    q = np.maximum(np.quantile(excess, coverage, axis=0), 0.0)
    # Noisy bounds can cross (a histogram's bin whose noisy mass is below 0 swaps its least and
    # largest value): by more than 2 q, [L_hat - q, U_hat + q] was inverted, an interval that
    # holds nothing, unflagged (a 150-record owner's P[months <= 270] = 0.90 was answered
    # [0.961, 0.955]). Widening the ordered pair contains [L_hat - q, U_hat + q] whenever that
    # is not empty, so the coverage argument (module docstring) is unchanged.
    return Bounded(
        value=point,
        low=np.minimum(low, high) - q,
        high=np.maximum(low, high) + q,
        se=se,
        bias=bias,
        noise=q,
    )


def ratio_interval(
    ratio: RatioBounds,
    sketch: SketchLike,
    rng: np.random.Generator,
    span: tuple[Array, Array],
    *,
    replicates: int = DEFAULT_REPLICATES,
    coverage: float = COVERAGE,
    inside: tuple[Array, Array] | None = None,
    grid: int = RATIO_GRID,
) -> tuple[Array, Array]:
    """A 95 % interval for ratio bounds that accounts for the count's noise exactly
    (Fieller's construction, test inversion), with no plug-in of the count estimate.

    Parameters
    ----------
    ratio : RatioBounds
        ``k`` quantities.
    sketch : PrivateSketch or SketchUnion
    rng : numpy.random.Generator
        Draws the noise replicates.
    span : (ndarray, ndarray), each of shape (k,)
        What each quantity can be, whatever the data (finite): the candidates searched.
    replicates : int
    coverage : float
    inside : (ndarray, ndarray), optional
        ``(L_hat, U_hat)``, added to the candidates (accepted whenever ``n_hat > 0``).
    grid : int
        Candidates per quantity, evenly spaced over ``span``.

    Returns
    -------
    low, high : ndarray of shape (k,)
        The hull of the accepted candidates widened by one grid step, within ``span``; the
        whole ``span`` when no candidate is accepted.

    Raises
    ------
    ValueError
        If a ``span`` is not finite.

    Notes
    -----
    With the count estimate ``n_hat = n + eta`` and the sums ``S_hat = S + xi`` (``eta`` and
    ``xi`` the release's noise mapped linearly, :func:`count_weights`), a candidate ``t`` is
    tested by

        D(t) = max(S_hat w_L - (t - c_L) n_hat, (t - c_U) n_hat - S_hat w_U).

    At the truth ``theta`` (``L <= theta <= U`` and ``n > 0``) both noise-free terms are
    ``<= 0``, so ``D(theta) <= E(theta) = max(xi w_L - (theta - c_L) eta,
    (theta - c_U) eta - xi w_U)``, whose law is the public noise's, whatever the data. ``t`` is
    accepted when ``D(t) <= q(t)``, the ``coverage`` quantile of ``E(t)`` over ``replicates``
    draws of the noise; the truth is accepted with probability at least ``coverage`` (up to the
    quantile's Monte Carlo error, about 0.007 at 1,000 replicates). The accepted set need not be
    an interval (Fieller's sets are not); its hull widened by one grid step contains every
    accepted value between grid points unless a component of the set falls between two grid
    points away from the others. Unlike :func:`bounded_interval`'s replicates centred on the
    noisy release, nothing here depends on how close ``n_hat`` is to ``n``: it stays valid when
    the count is known within 20 % or worse.
    """
    span_low, span_high = (np.asarray(v, dtype=np.float64) for v in span)
    if not (np.all(np.isfinite(span_low)) and np.all(np.isfinite(span_high))):
        raise ValueError(
            f"ratio_interval searches a finite span; got [{span_low}, {span_high}]: pass what "
            "each quantity can be (e.g. a mean's public bounds)"
        )
    total, count = release_totals(sketch)
    w_count, w_sums, _ = count_weights(sketch)
    sums, counts = noise_replicates(sketch, replicates, rng)
    xi = sums - total
    n_hat = w_count * float(count[0])
    eta = w_count * (counts - count[0])
    if w_sums is not None:
        n_hat += float(total[0] @ w_sums)
        eta = eta + xi @ w_sums
    s_low, s_high = total[0] @ ratio.low_weights, total[0] @ ratio.high_weights
    e_low, e_high = xi @ ratio.low_weights, xi @ ratio.high_weights  # (R, k)
    k = s_low.shape[0]
    low, high = span_low.copy(), span_high.copy()
    for j in range(k):
        t = np.linspace(span_low[j], span_high[j], grid)
        step = float(t[1] - t[0]) if grid > 1 else 0.0
        if inside is not None:
            extra = np.clip([inside[0][j], inside[1][j]], span_low[j], span_high[j])
            t = np.sort(np.concatenate([t, extra]))
        dl, du = t - ratio.low_offset[j], t - ratio.high_offset[j]
        noise = np.maximum(
            e_low[None, :, j] - dl[:, None] * eta[None, :],
            du[:, None] * eta[None, :] - e_high[None, :, j],
        )
        q = np.quantile(noise, coverage, axis=1)
        d = np.maximum(s_low[j] - dl * n_hat, du * n_hat - s_high[j])
        accepted = t[d <= q]
        if accepted.size:
            low[j] = max(float(accepted[0]) - step, float(span_low[j]))
            high[j] = min(float(accepted[-1]) + step, float(span_high[j]))
    return low, high


def _linear_count(sketch: SketchLike, sums: Array, counts: Array) -> Array:
    """The record count's linear estimate of :func:`count_weights`, before any floor, per row
    of ``sums`` (R, m) and ``counts`` (R,): shape (R,)."""
    w_count, w_sums, _ = count_weights(sketch)
    n = w_count * np.asarray(counts, dtype=np.float64)
    return n if w_sums is None else n + sums @ w_sums


def count_interval(
    parts: list[RatioBounds],
    sketch: SketchLike,
    rng: np.random.Generator,
    *,
    replicates: int = DEFAULT_REPLICATES,
    coverage: float = COVERAGE,
) -> tuple[float, float]:
    """A ``coverage`` interval for the number of records in a conjunction of ``k`` predicates,
    with the noise of the sums and of the record count ``n`` taken together.

    Parameters
    ----------
    parts : list of RatioBounds
        Per predicate ``j`` (``k >= 1``), bounds of one value each on the fraction of records
        it holds, as ratios over ``n``: ``L_j = S w_L / n + c_L <= P_j <= S w_U / n + c_U =
        U_j`` (a histogram column's bins, M2M's fit and residual range).
    sketch : PrivateSketch or SketchUnion
    rng : numpy.random.Generator
        Draws the noise replicates (the consumer's own).
    replicates : int
    coverage : float
        In (0, 1).

    Returns
    -------
    (low, high)
        Records, ``0 <= low <= high``.

    Notes
    -----
    Multiplied by ``n``, each bound is linear in the noise-free release: ``n L_j = S w_L +
    c_L n``, and ``n`` is itself the linear form of :func:`count_weights` of the noise-free
    count and block totals. So the count ``N`` satisfies (Fréchet, whatever the joint)

        A = sum_j n L_j - (k - 1) n <= N <= min(n, min_j n U_j),

    and the same forms of the noisy release give ``A_hat = A + a``, ``U_hat_j = n U_j + u_j``
    and ``n_lin = n + eta`` (the candidate ``n``), with ``(a, u, eta)`` linear in the release's
    noise, whose law is public: the replicates of :func:`noise_replicates` have it exactly (no
    plug-in: the replicates' ``n`` is not involved). With ``q`` the ``coverage`` quantile of
    ``max(a, -eta, max_j -u_j)``, the interval ``[max(A_hat - q, 0), max(min(n_lin, min_j
    U_hat_j), 0) + q]`` holds ``N`` with probability at least ``coverage`` (up to the
    quantile's Monte Carlo error, about 0.007 at 1,000 replicates) for every data set, however
    noisy ``n``: ``A_hat - q <= A`` when ``a <= q``, and the upper end holds when every ``-u_j
    <= q`` and ``-eta <= q``; the cut and the raise at 0 hold because
    ``N >= 0``. The fraction's interval times the count estimate (what ``explore`` printed
    before) ignores the noise of ``n``: a 153-record owner at epsilon 1 with ``n_hat`` 31 was
    answered ``[0, 30.9]`` for a count of 135.
    """
    total, count = release_totals(sketch)
    sums, counts = noise_replicates(sketch, replicates, rng)
    xi = sums - total
    n_hat = float(_linear_count(sketch, total, count)[0])
    eta = _linear_count(sketch, sums, counts) - n_hat
    k = len(parts)
    a_hat, a = -(k - 1) * n_hat, -(k - 1) * eta
    # N <= n too (every fraction is at most 1): n itself is one more upper candidate.
    u_hat: list[float] = [n_hat]
    worst = -eta
    for p in parts:
        w_low, w_high = p.low_weights[:, 0], p.high_weights[:, 0]
        c_low, c_high = float(p.low_offset[0]), float(p.high_offset[0])
        a_hat += float(total[0] @ w_low) + c_low * n_hat
        a = a + xi @ w_low + c_low * eta
        u_hat.append(float(total[0] @ w_high) + c_high * n_hat)
        worst = np.maximum(worst, -(xi @ w_high + c_high * eta))
    q = max(float(np.quantile(np.maximum(a, worst), coverage)), 0.0)
    high = max(min(u_hat), 0.0) + q
    low = max(a_hat - q, 0.0)
    return min(low, high), max(low, high)


def record_count_interval(
    sketch: SketchLike,
    rng: np.random.Generator,
    *,
    replicates: int = DEFAULT_REPLICATES,
    coverage: float = COVERAGE,
) -> tuple[float, float, float]:
    """The record count's estimate and its ``coverage`` interval, from the count's noise law.

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
    rng : numpy.random.Generator
        Draws the noise replicates (the consumer's own).
    replicates : int
    coverage : float
        In (0, 1).

    Returns
    -------
    (n_hat, low, high)
        Records: :func:`count_estimate`'s estimate (floored at 1), and ``n_lin -+ q`` cut at
        0, where ``n_lin`` is the estimate before the floor and ``q`` the ``coverage``
        quantile of ``|n_lin* - n_lin|`` over the noise replicates; widened to hold ``n_hat``.

    Notes
    -----
    ``n_lin - n`` is linear in the release's noise (:func:`count_weights`), so its law is the
    replicates' exactly, whatever the data: the interval covers ``n`` with probability at least
    ``coverage`` up to the quantile's Monte Carlo error. A noisy count alone (RFF) at Laplace
    scale ``b`` gives ``q`` near ``b ln 20``.
    """
    total, count = release_totals(sketch)
    n_lin = float(_linear_count(sketch, total, count)[0])
    sums, counts = noise_replicates(sketch, replicates, rng)
    q = float(np.quantile(np.abs(_linear_count(sketch, sums, counts) - n_lin), coverage))
    n_hat = max(n_lin, 1.0)
    low, high = max(n_lin - q, 0.0), max(n_lin + q, 0.0)
    return n_hat, min(low, n_hat), max(high, n_hat)
