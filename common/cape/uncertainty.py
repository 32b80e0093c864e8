"""Standard errors, 95 % intervals and warnings for CAPE's answers, from the known noise law.

Every CAPE answer is a function of the aggregator's average ``a_hat = a + n`` of the sites'
releases, where ``a`` is the pooled statistic (the sites' exact statistics averaged with Remark 3's
weights) and ``n`` the noise left after the zero-sum shares cancel: Gaussian, independent across
entries, of the standard deviation the public plan states (``CapeMeanPlan.aggregator_std``,
``CapeFMPlan.aggregator_scales``; larger, and still Gaussian, when a site was lost at its release:
:func:`dpmarket.common.cape.zero_sum.partial_average_variance`). So the noise's effect on an answer
is known exactly, and computing it is post-processing of the release: no owner releases anything
more, no privacy is spent.

==========  ====================================================================================
answer      interval (``level`` 0.95 by default) and what it covers
==========  ====================================================================================
mean        ``a_hat_d -+ z sigma``, ``sigma`` the plan's noise std (:func:`mean_estimates`). Exact:
            the estimate is linear in the noise. Covers the mean of the pooled records *after each
            owner clamped them into the public bounds*, with probability ``level`` over the noise.
            Value and interval are then cut to the column's bounds, keeping ``z sigma`` of width
            at the edge cut at (the one cut of every bounded answer,
            :func:`dpmarket.common.uncertainty.cut_keeping_noise`): the truth lies inside the
            bounds, so the cut never removes it.
capeFM      Parametric bootstrap over the noise (:func:`capefm_estimates`): draw ``n*`` from the
            known law, re-solve the fit from ``a_hat + n*``, map to the raw units, and take the
            2.5 % and 97.5 % quantiles of the draws (the standard error is their standard
            deviation). The re-solves use an eigenvalue floor of 0.2 noise standard deviation, not
            the release's larger one (which shrinks the released value in a way no bootstrap sees;
            :func:`capefm_estimates`, Notes). When an eigenvalue of the released Gram matrix lies
            within one noise std of 0 (``undetermined``), the interval is the hull of that
            bootstrap and of the same bootstrap kept to its positive semidefinite draws (the
            noise-free Gram matrix is one; :func:`capefm_bootstrap`, Notes). Covers the
            non-private fit of the same model on the
            pooled, clamped records: ordinary least squares for ``linear``; for ``logistic`` the
            minimizer of the second-order Taylor approximation of the logistic loss the functional
            mechanism releases (Appendix H), not the maximum-likelihood fit.
network     No interval (:func:`training_estimates`): the loss of the 2-layer network is not
            convex, so the noise's effect on the weights cannot be propagated from what the
            aggregator holds (re-running gradient descent needs the data). Every parameter is
            flagged, with the one exact statement available: its noise standard deviation is at
            least ``learning_rate x`` the last iteration's (that step's noise enters the final
            parameters linearly and independently of everything before).
==========  ====================================================================================

None of these intervals includes sampling error of the data (the owners' records are the
population they describe), nor the bias of clamping records into public bounds.

Flags (:class:`dpmarket.common.uncertainty.Flag`), per value, on the value or on the interval:

* ``sign_not_resolved`` (on the value): the interval contains 0, so the noise alone could have
  given the sign.
* ``noise_dominates`` (on the value): the standard error exceeds the value's magnitude.
* ``outside_bounds`` (on the value, mean): the raw estimate lay outside the column's bounds,
  where no mean of clamped records can be: the noise moved it there (the value is cut to them).
* ``uninformative`` (on the value, mean): the interval, before or after the cut, spans more than
  half of the column's bounds (:func:`dpmarket.common.uncertainty.uninformative_flag`, the rule
  ``explore`` applies).
* ``shrunk`` (on the value, capeFM): the release's eigenvalue floor raised eigenvalues of the
  released Gram matrix (:func:`dpmarket.common.cape.functional_mechanism.fit_coefficients`): the
  value is shrunk towards 0 along directions the noise hides, and may lie outside its interval
  (which is built on the less regularized solve).
* ``undetermined`` (on the interval, capeFM): an eigenvalue of the released Gram matrix lies
  within one noise standard deviation of 0, so the data do not determine the fit along it, and
  the interval (the hull of two bootstraps) does not mean what it says: where the data leave the
  fit undetermined, any interval with guaranteed coverage is unbounded with positive probability
  (J.-M. Dufour, Econometrica 65, 1997), and this bounded one's coverage depends on the noise-free
  eigenvalue, which the release does not determine: measured on real tables, among the releases
  so flagged, at 89.9-100 % per coefficient, above 98 % on most of Computers' and NMES1988's
  regressions and below 92 % on diamonds' carat and spam7's make (docs/results.md, "CAPE
  intervals conditional on the undetermined flag"), lower on some synthetic geometries
  (:func:`capefm_estimates`, Notes). Until 2026-11-29 the flag sat on the value, and such
  intervals counted as trusted. An unflagged interval is one whose fit the release resolves:
  those covered 90.8-97.3 % per coefficient on diamonds' and spam7's fits (260-343 of 400
  releases), but spam7's ``n000`` at 99.1 %, and flagged are 14-35 % of those fits' answers and
  82-100 % of Computers', NMES1988's and diabetes' (docs/results.md, "``undetermined`` on the
  interval, prepivoting the unflagged ones measured, not adopted").
* ``no_interval`` (on the interval, network): as above.

A flag on the value leaves the interval meaning what it says; a flag on the interval says it does
not. Every interval here covers the noise only (basis ``"noise"``; no bias bound): the one model
of :mod:`dpmarket.common.uncertainty`, which :meth:`Estimate.to_json` writes.

References
----------
CAPE paper, Lemma 1 (the aggregator's noise), Algorithm 4 and Appendix H (capeFM); B. Efron and
R. Tibshirani, *An Introduction to the Bootstrap* (1993), Chapter 13 (percentile and basic
intervals).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.capefm import CapeFMPlan
from dpmarket.common.cape.functional_mechanism import FMRelease, fit_coefficients
from dpmarket.common.cape.mean import CapeMeanPlan
from dpmarket.common.uncertainty import (
    LEVEL,
    Flag,
    cut_keeping_noise,
    interval_row,
    trusted,
    uninformative_flag,
)
from dpmarket.common.validation import check_positive_int

__all__ = [
    "DEFAULT_LEVEL",
    "Estimate",
    "Flag",
    "bootstrap_replicates",
    "capefm_bootstrap",
    "capefm_estimates",
    "mean_estimates",
    "noise_flags",
    "training_estimates",
]

#: Nominal coverage of every interval.
DEFAULT_LEVEL = LEVEL
#: Bootstrap draws for a small model; fewer for a large one (:func:`bootstrap_replicates`).
MAX_REPLICATES = 1000
#: The fewest draws a bootstrap takes, whatever the model's size.
MIN_REPLICATES = 200
#: Work budget of one bootstrap, in units of ``D^3`` (one eigendecomposition costs about that):
#: 1000 draws up to ``D = 50``; 200 at ``D`` above 85 (a few seconds at ``D = 200``).
BOOTSTRAP_WORK = 1.25e8
#: The eigenvalue floor of the solve an interval is built on, in noise standard deviations of one
#: entry of the aggregator's ``Lambda_2`` (:func:`capefm_estimates`, Notes).
INTERVAL_FLOOR_SIGMAS = 0.2
#: An eigenvalue of the released Gram matrix within this many noise standard deviations of 0 is
#: not resolved by the data (flag ``undetermined``).
UNRESOLVED_SIGMAS = 1.0
#: The most draws a bootstrap makes, in multiples of its replicates, to keep that many whose Gram
#: matrix is positive semidefinite (:func:`capefm_bootstrap`, Notes).
PSD_MAX_DRAWS = 10
#: Entries of the ``(draws, D, D)`` arrays held at once by the bootstrap (32 MB of float64).
_BATCH_ENTRIES = 4_000_000

Method = Literal["basic", "percentile"]


@dataclass(frozen=True)
class Estimate:
    """One answer with its uncertainty.

    Attributes
    ----------
    label : str
        What the value is (a column, ``"(intercept)"``, a network parameter's name).
    value : float
        The released estimate, in the column's raw units.
    standard_error : float or None
        Standard deviation of the estimate due to the noise (``None``: not available).
    low, high : float or None
        The interval at ``level`` (``None``: not available).
    level : float
        Nominal coverage of ``[low, high]``.
    method : str
        How the interval was made.
    covers : str
        What the interval covers, with probability ``level`` over the noise.
    flags : tuple of Flag
        Each on the value or on the interval (module docstring).
    """

    label: str
    value: float
    standard_error: float | None
    low: float | None
    high: float | None
    level: float
    method: str
    covers: str
    flags: tuple[Flag, ...] = ()

    @property
    def reliable(self) -> bool:
        """Whether the interval means what it says: there is one and no flag is on it."""
        return trusted(self.flags, self.low is not None and self.high is not None)

    @property
    def basis(self) -> str:
        """What the interval covers: ``"noise"`` (the noise only), ``"none"`` without one."""
        return "none" if self.low is None or self.high is None else "noise"

    def contains(self, truth: float) -> bool:
        """Whether ``low <= truth <= high`` (``False`` without an interval)."""
        return self.low is not None and self.high is not None and self.low <= truth <= self.high

    def to_json(self) -> dict[str, Any]:
        """The row of :func:`dpmarket.common.uncertainty.interval_row` (``label``, ``value``,
        ``standard_error``, ``interval``, ``level``, ``basis``, ``covers``, ``bias_bound``
        (``null``), ``flags``) and ``method``."""
        row = interval_row(
            self.label,
            self.value,
            self.standard_error,
            self.low,
            self.high,
            basis=self.basis,
            covers=self.covers,
            flags=self.flags,
            level=self.level,
        )
        return {**row, "method": self.method}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Estimate:
        """Inverse of :meth:`to_json`.

        Raises
        ------
        ValueError
            On a missing field, an interval that is not a pair, or a malformed flag.
        """
        try:
            interval = data["interval"]
            if interval is not None and len(interval) != 2:
                raise ValueError(f"an interval is [low, high], got {interval!r}")
            se = data["standard_error"]
            return cls(
                label=str(data["label"]),
                value=float(data["value"]),
                standard_error=None if se is None else float(se),
                low=None if interval is None else float(interval[0]),
                high=None if interval is None else float(interval[1]),
                level=float(data["level"]),
                method=str(data["method"]),
                covers=str(data["covers"]),
                flags=tuple(Flag.from_json(f) for f in data["flags"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed estimate {data!r}: {exc}") from None


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from scipy.stats import norm  # about a second: on first use, importing the module stays light

    return float(norm.ppf(0.5 + level / 2.0))


def noise_flags(value: float, standard_error: float, low: float, high: float) -> list[Flag]:
    """The warnings of a value whose noise is known: ``sign_not_resolved`` when ``low <= 0 <=
    high``, ``noise_dominates`` when ``standard_error > |value|``.

    Parameters
    ----------
    value, standard_error, low, high : float
        The estimate, its standard error and its interval.

    Returns
    -------
    list of Flag
        Both on the value: the interval still means what it says.
    """
    out = []
    if low <= 0.0 <= high:
        out.append(
            Flag(
                "sign_not_resolved",
                f"the interval [{low:.4g}, {high:.4g}] contains 0: the noise alone could give "
                "this sign",
            )
        )
    if standard_error > abs(value):
        out.append(
            Flag(
                "noise_dominates",
                f"the noise's standard error {standard_error:.4g} exceeds the value's magnitude "
                f"{abs(value):.4g}",
            )
        )
    return out


#: What a mean's interval covers.
MEAN_COVERS = (
    "the mean of the pooled records after each owner clamped them into the public bounds (noise "
    "only: no sampling error of the data)"
)


def mean_estimates(
    plan: CapeMeanPlan,
    estimate: ArrayLike,
    labels: Sequence[str],
    *,
    released: Sequence[int] | None = None,
    level: float = DEFAULT_LEVEL,
) -> tuple[Estimate, ...]:
    """Every column of a CAPE mean with its exact standard error and interval.

    Parameters
    ----------
    plan : CapeMeanPlan
        The plan the releases followed.
    estimate : array-like of shape (D,)
        The aggregator's average (:func:`dpmarket.common.cape.capefm.aggregate_releases`).
    labels : sequence of str, length D
        The columns.
    released : sequence of int, optional
        The sites that released, when some were lost after the noise round.
    level : float
        Nominal coverage.

    Returns
    -------
    tuple of Estimate, one per column

    Raises
    ------
    ValueError
        If the lengths disagree or ``level`` is not in (0, 1).

    Notes
    -----
    The estimate is ``pooled mean + n`` with ``n ~ N(0, sigma^2 I)`` and ``sigma =
    plan.aggregator_std(released)`` (Lemma 1; ``F`` times the pooled mechanism's variance), so
    ``estimate_d -+ z sigma`` covers the pooled mean of column ``d`` with probability exactly
    ``level``; ``z = Phi^-1((1 + level) / 2)``. That mean lies inside the column's bounds, so
    the value and interval are cut to them (:func:`dpmarket.common.uncertainty.cut_keeping_noise`,
    keeping ``z sigma`` of width at the edge cut at) and the coverage is at least ``level``; the
    raw estimate (unbiased) is the caller's ``estimate`` and is quoted in ``outside_bounds``'s
    reason (the curator's job returns the cut values as its mean: one value per column). Every
    column has the one ``sigma``, set by the bounds' diagonal (the mean's L2 sensitivity,
    :func:`dpmarket.common.cape.mean.mean_sensitivity`): a narrow column's interval can span
    its bounds, flagged ``uninformative``.
    """
    v = np.asarray(estimate, dtype=np.float64)
    if v.shape != (plan.dim,) or len(labels) != plan.dim:
        raise ValueError(
            f"estimate and labels must have length {plan.dim}, got {v.shape} and {len(labels)}"
        )
    z = _z(level)
    sigma = plan.aggregator_std(released)
    bounds = np.asarray(plan.bounds, dtype=np.float64)
    b_low, b_high = bounds[:, 0], bounds[:, 1]
    raw_low, raw_high = v - z * sigma, v + z * sigma
    # The one cut of every bounded answer: to the column's bounds, keeping the noise's 95 %
    # half-width (explore's _noise_floor: 1.96 standard errors) at the edge cut at.
    low, high = cut_keeping_noise(raw_low, raw_high, b_low, b_high, np.full(v.shape, z * sigma))
    values = np.clip(np.clip(v, b_low, b_high), low, high)
    out = []
    for d, label in enumerate(labels):
        raw, value = float(v[d]), float(values[d])
        lo, hi = float(low[d]), float(high[d])
        flags = noise_flags(value, sigma, lo, hi)
        lo_b, hi_b = float(b_low[d]), float(b_high[d])
        if not lo_b <= raw <= hi_b:
            flags.append(
                Flag(
                    "outside_bounds",
                    f"the raw estimate {raw:.4g} lies outside the bounds [{lo_b:g}, {hi_b:g}], "
                    "where no mean of clamped records can be: the noise moved it there; the "
                    f"value is cut to {value:.4g}",
                )
            )
        flags.extend(
            uninformative_flag(
                2 * z * sigma, hi_b - lo_b, f"the bounds [{lo_b:g}, {hi_b:g}]", hi - lo
            )
        )
        out.append(
            Estimate(
                label=label,
                value=value,
                standard_error=sigma,
                low=lo,
                high=hi,
                level=level,
                method="analytic (Gaussian noise of known variance), cut to the column's bounds",
                covers=MEAN_COVERS,
                flags=tuple(flags),
            )
        )
    return tuple(out)


def bootstrap_replicates(dim: int) -> int:
    """Draws of a capeFM bootstrap for ``D`` coefficients: ``BOOTSTRAP_WORK / D^3`` between
    :data:`MIN_REPLICATES` and :data:`MAX_REPLICATES`."""
    d = check_positive_int(dim, "dim")
    return int(min(MAX_REPLICATES, max(MIN_REPLICATES, BOOTSTRAP_WORK // d**3)))


def _solve_draws(
    plan: CapeFMPlan,
    fit: FMRelease,
    rng: np.random.Generator,
    count: int,
    scales: dict[int, float],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``count`` re-solves of ``fit`` under fresh noise: their weights ``(count, D)`` and the
    smallest eigenvalue of each draw's symmetrized Gram matrix ``(count,)``, before the floor."""
    d = plan.dim
    lam1 = np.asarray(fit.coefficients.lam1, dtype=np.float64)
    lam2 = np.asarray(fit.coefficients.lam2, dtype=np.float64)
    weights = np.empty((count, d))
    smallest = np.empty(count)
    batch = max(1, _BATCH_ENTRIES // (d * d))
    for start in range(0, count, batch):
        k = min(batch, count - start)
        l1 = lam1 + rng.normal(0.0, scales[1], (k, d))
        l2 = lam2 + rng.normal(0.0, scales[2], (k, d, d))
        sym = 0.5 * (l2 + np.swapaxes(l2, 1, 2))
        vals, vecs = np.linalg.eigh(sym)
        smallest[start : start + k] = vals[:, 0]
        inv = 1.0 / np.maximum(vals, fit.floor)
        proj = np.einsum("bji,bj->bi", vecs, l1) * inv
        weights[start : start + k] = -0.5 * np.einsum("bij,bj->bi", vecs, proj)
    return weights, smallest


def capefm_bootstrap(
    plan: CapeFMPlan,
    fit: FMRelease,
    rng: np.random.Generator,
    replicates: int,
    *,
    released: Sequence[int] | None = None,
    psd: bool = True,
) -> tuple[NDArray[np.float64], bool]:
    """Re-solve a capeFM fit under fresh draws of its noise: the parametric bootstrap, kept to
    the draws whose Gram matrix a Gram matrix can be.

    Parameters
    ----------
    plan : CapeFMPlan
    fit : FMRelease
        :func:`dpmarket.common.cape.capefm.fit_released` of the averaged releases: its noisy
        (unsymmetrized) coefficients and floor.
    rng : numpy.random.Generator
        The bootstrap's draws (post-processing: they protect nothing, so a seeded generator
        serves).
    replicates : int
        ``B``: the draws kept.
    released : sequence of int, optional
        The sites that released (the noise is then larger).
    psd : bool
        Keep only the draws whose symmetrized Gram matrix is positive semidefinite (default; the
        Notes); ``False`` keeps every draw (the construction before, kept as a control).

    Returns
    -------
    weights : ndarray of shape (B', D), float64
        The scaled-domain weights re-solved from ``Lambda_hat + n*_b``: ``B' = B`` draws, except
        when too few draws are positive semidefinite (then every draw, ``B`` of them).
    conditioned : bool
        Whether the draws were kept to the positive semidefinite ones.

    Notes
    -----
    ``n*_b`` has the law of the aggregator's noise: independent Gaussian entries of the plan's
    per-order standard deviation, ``D`` for ``Lambda_1`` and ``D^2`` for the unsymmetrized
    ``Lambda_2`` (order 0 does not move the minimizer). Each draw is solved as
    :func:`dpmarket.common.cape.functional_mechanism.minimize_fm` solves the release: symmetrize,
    raise the eigenvalues below the same floor to it, ``w = -(1/2) P^-1 lam1``.

    Which draws are kept. The noise is Gaussian and symmetric, so ``Lambda_hat + n*`` has the law
    of the noise-free coefficients given the release under a flat prior; the percentile interval
    is that law's central interval. But the noise-free ``Lambda_2`` is a Gram matrix (``X^T X``
    of the clamped records, times a positive constant): positive semidefinite. A draw with a
    negative eigenvalue cannot be the truth, and its floored solve is the most extreme one along
    that eigenvector (``1 / floor``): kept, such draws pile up at one end and push the interval
    off the truth on one side where the noise-free eigenvalue is about one noise std (Ecdat
    Computers' logistic regression: :func:`capefm_estimates`, Notes). With ``psd`` the draws are
    made in batches of ``B`` until ``B`` of them are positive semidefinite, at most
    :data:`PSD_MAX_DRAWS` ``B`` in all and no more than ten times :data:`BOOTSTRAP_WORK` (the
    law conditioned on the constraint, by rejection; at ``D`` above about 180, one batch).
    When fewer than ``min(B,`` :data:`MIN_REPLICATES` ``)`` pass
    (the release is far from any Gram matrix: diabetes at 88 rows per owner, nine of eleven
    eigenvalues at or below 0.4 noise std), no conditioned law can be estimated and every draw of
    the first batch is kept, unconditioned.
    """
    b = check_positive_int(replicates, "replicates")
    scales = plan.aggregator_scales(released)
    weights, smallest = _solve_draws(plan, fit, rng, b, scales)
    if not psd:
        return weights, False
    need = min(b, MIN_REPLICATES)
    most = max(b, min(PSD_MAX_DRAWS * b, int(10 * BOOTSTRAP_WORK // plan.dim**3)))
    kept = [weights[smallest >= 0.0]]
    accepted, drawn = kept[0].shape[0], b
    # Stop at once when even the most draws at this rate would not reach the minimum.
    if accepted * most < need * b:
        return weights, False
    while accepted < b and drawn < most:
        more, low = _solve_draws(plan, fit, rng, b, scales)
        kept.append(more[low >= 0.0])
        accepted += kept[-1].shape[0]
        drawn += b
    if accepted < need:
        return weights, False
    return np.concatenate(kept)[:b], True


def _bootstrap_interval(
    plan: CapeFMPlan,
    solve: FMRelease,
    rng: np.random.Generator,
    replicates: int,
    released: Sequence[int] | None,
    raw_map: tuple[NDArray[np.float64], NDArray[np.float64]],
    level: float,
    method: Method,
    *,
    psd: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], str]:
    """Per raw coefficient: the interval's ends, the standard error and the construction's name
    from :func:`capefm_bootstrap` of ``solve`` (name ``""`` when ``psd`` asked for the positive
    semidefinite draws and too few were)."""
    m, c = raw_map
    draws, conditioned = capefm_bootstrap(plan, solve, rng, replicates, released=released, psd=psd)
    if psd and not conditioned:
        return np.empty(0), np.empty(0), np.empty(0), ""
    raw = draws @ m.T + c
    alpha = (1.0 - level) / 2.0
    q_lo, q_hi = np.quantile(raw, [alpha, 1.0 - alpha], axis=0)
    if method == "basic":
        centers = m @ solve.w + c
        q_lo, q_hi = 2.0 * centers - q_hi, 2.0 * centers - q_lo
    kept = "positive semidefinite Gram matrices" if conditioned else "draws"
    name = f"parametric bootstrap over the noise ({draws.shape[0]} {kept}), {method} interval"
    return q_lo, q_hi, raw.std(axis=0, ddof=1), name


def capefm_estimates(
    plan: CapeFMPlan,
    fit: FMRelease,
    labels: Sequence[str],
    raw_map: tuple[ArrayLike, ArrayLike],
    rng: np.random.Generator,
    *,
    task_covers: str,
    released: Sequence[int] | None = None,
    replicates: int | None = None,
    level: float = DEFAULT_LEVEL,
    method: Method = "percentile",
    interval_floor: float | None = None,
    values: ArrayLike | None = None,
    hull: bool = True,
) -> tuple[Estimate, ...]:
    """Every coefficient of a capeFM fit, in raw units, with a bootstrap standard error and
    interval (:func:`capefm_bootstrap`).

    Parameters
    ----------
    plan : CapeFMPlan
    fit : FMRelease
        The released fit.
    labels : sequence of str, length K
        What each raw coefficient is.
    raw_map : (M, c)
        ``M`` of shape (K, D) and ``c`` of shape (K,): the raw coefficients are ``M @ w + c``
        (:meth:`dpmarket.common.cape.spec.CapeJobSpec.raw_map`; affine, so every draw maps
        exactly).
    rng : numpy.random.Generator
    task_covers : str
        What the non-private fit is, for :attr:`Estimate.covers`.
    released : sequence of int, optional
        The sites that released, when some were lost after the noise round.
    replicates : int, optional
        ``B``; default :func:`bootstrap_replicates` of ``D``.
    level : float
    method : {"percentile", "basic"}
        ``"percentile"`` (default): the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
        the draws; ``"basic"``: those quantiles reflected around the solve, ``[2 v - q_hi, 2 v -
        q_lo]`` (kept to measure against: it over-covers where the fit is skewed, e.g. 0.99 on
        spam7, against 0.96 for the percentile interval; docs/results.md).
    interval_floor : float, optional
        The eigenvalue floor of the fit the interval is built on; default
        :data:`INTERVAL_FLOOR_SIGMAS` times the aggregator's order-2 noise std.
    values : array-like of shape (K,), optional
        The released raw coefficients as the caller computed them (so that the estimates repeat
        them bit for bit); default ``M @ fit.w + c``.
    hull : bool
        For an undetermined fit (an eigenvalue of the released Gram matrix within
        :data:`UNRESOLVED_SIGMAS` noise std of 0), the interval is the hull of the bootstrap's
        over every draw and over the positive semidefinite draws (default; Notes); ``False``:
        the first alone (the construction before, kept as a control).

    Returns
    -------
    tuple of Estimate, one per label

    Raises
    ------
    ValueError
        If the shapes disagree, or ``method`` or ``level`` is invalid.

    Notes
    -----
    Which fit the interval is built on. The released fit raises every eigenvalue of the noisy
    Gram matrix below ``2 sigma_2 sqrt(2 D)`` (the noise's spectral norm, doubled:
    :func:`dpmarket.common.cape.functional_mechanism.default_floor`), which serves prediction
    but shrinks the coefficients along those directions by an amount no bootstrap sees: every
    re-solve is shrunk alike. One eigenvalue's noise is only ``sigma_2`` (``v^T E v`` for a unit
    ``v``), so the interval is built on the same solve with the floor at ``INTERVAL_FLOOR_SIGMAS
    sigma_2``: its bias is second order wherever an eigenvalue is resolved, and its bootstrap
    spread is wide where one is not. The released value keeps the larger floor, so it may lie
    outside its interval (flag ``shrunk``). The floor is 0.2 sigma, not 1: where eigenvalues lie
    within the noise of 0 (diabetes at 88 rows per owner, nine of eleven), a floor of one sigma
    still shrinks every re-solve along them alike, and its intervals covered 77 % over 200
    repetitions (per coefficient 23-98 %); at 0.5, 0.3, 0.2 and 0.1 sigma they covered 92, 96, 97
    and 99 % over 60 (per coefficient at 0.2: 90-100 %), while diamonds' and spam7's fits, whose
    eigenvalues are resolved, covered the same as at one sigma (97 % and 96 % over 100).

    Which draws, where the fit is undetermined. A floor of 0.2 sigma suits eigenvalues whose
    noise-free value is near 0 (diabetes), but where it is about one sigma (Ecdat Computers'
    logistic regression: 1.2 and 1.5 sigma), every draw whose eigenvalue the noise made negative
    is floored far below the truth, and the interval of ``hd`` missed it on one side: it lay
    above the truth in 6.7 % of 1,000 repetitions and below it in 0.1 % (93.2 % covered). Kept
    to its positive semidefinite draws (:func:`capefm_bootstrap`), the bootstrap covers there
    but misses where the noise-free eigenvalue is near 0 (88 % on a synthetic weak direction).
    The release does not say which holds, so the interval is the hull of both, each
    coefficient's ``[min low, max high]`` with the larger standard error (98.6 % on ``hd``; it
    over-covers, 97.5-98.6 % per coefficient). Resolved fits (no eigenvalue within one sigma of
    0) keep the one bootstrap. Coverage along an undetermined direction is measured, not
    guaranteed (docs/results.md, "CAPE intervals per coefficient").

    No guaranteed interval is bounded there. The gradient of the released objective at the
    pooled fit is exactly Gaussian with a covariance known from that fit, so the Anderson-Rubin
    set (an exact test inverted; :mod:`dpmarket.experiments.cape_ar`) covers jointly at exactly
    ``level``; but its profile per coefficient is the whole line whenever an eigenvalue of the
    released Gram matrix lies within ``sqrt(chi2_1(level))`` (1.96) noise std of 0, so on every
    undetermined fit but those whose eigenvalue the noise made very negative, and it covered
    99-100 % per coefficient on Computers, NMES1988 and diabetes (docs/results.md, "an exact test
    inverted"). As Dufour (1997) shows for any model whose parameters can be unidentified, a set
    that holds its level at every Gram matrix must be unbounded with positive probability: the
    bootstrap's bounded intervals trade that guarantee for width.

    Prepivoting on resolved fits, measured and not adopted. The floored bootstrap at a level per
    coefficient from Beran's double bootstrap (pseudo-truth the released fit) brought spam7's
    ``n000`` from 99.1 to 97.1 % and NMES1988's resolved fits from 98.4 to 95.6 %, but left
    diamonds' carat below 92 % (91.5; its misses are one-sided) and Computers' logistic
    regression above 98 (:mod:`dpmarket.experiments.cape_rules`, rule ``prepivoted``;
    docs/results.md).

    Bias corrections on resolved fits, measured and not adopted. Carat's one-sided miss on
    diamonds (unflagged 90.8 %, the interval above the truth) is not corrected by moving the
    interval: Efron's bias-corrected percentile interval (Efron, JASA 1987) brings carat to
    93.5 % but lifts five other diamonds coefficients to 98.1-99.6 %, and subtracting the
    analytic second-order bias of ``(A + E)^-1 (b + e)`` under the noise law (before a symmetric
    interval, or twice from the percentile interval) over-covers every case (98.3-100 % pooled);
    the percentile-t interval with a delta-method standard error under-covers (59-93 %). The
    percentile interval of a resolved fit is off-centre and too wide at once (carat: median
    width 2.2 times the 95 % range of the estimator), the two errors offsetting
    (:mod:`dpmarket.experiments.cape_rules`, rules ``bc``, ``debiased``, ``shifted``,
    ``studentized``; docs/results.md, "CAPE intervals on resolved fits").
    """
    m = np.asarray(raw_map[0], dtype=np.float64)
    c = np.asarray(raw_map[1], dtype=np.float64)
    k = len(labels)
    if m.shape != (k, plan.dim) or c.shape != (k,):
        raise ValueError(
            f"raw_map must be ({k}, {plan.dim}) and ({k},) for {k} labels, got {m.shape} and "
            f"{c.shape}"
        )
    if method not in ("basic", "percentile"):
        raise ValueError(f"method must be 'basic' or 'percentile', got {method!r}")
    _z(level)
    scales = plan.aggregator_scales(released)
    floor = INTERVAL_FLOOR_SIGMAS * scales[2] if interval_floor is None else interval_floor
    solve = fit_coefficients(fit.coefficients, noise_std2=scales[2], floor=floor, scales=scales)
    sym = 0.5 * (fit.coefficients.lam2 + fit.coefficients.lam2.T)
    unresolved = int(np.sum(np.linalg.eigvalsh(sym) < UNRESOLVED_SIGMAS * scales[2]))
    b = bootstrap_replicates(plan.dim) if replicates is None else replicates
    values = m @ fit.w + c if values is None else np.asarray(values, dtype=np.float64)
    if values.shape != (k,):
        raise ValueError(f"values must have shape ({k},), got {values.shape}")
    common = (plan, solve, rng, b, released, (m, c), level, method)
    lows, highs, ses, name = _bootstrap_interval(*common, psd=False)
    if hull and unresolved:
        c_lows, c_highs, c_ses, c_name = _bootstrap_interval(*common, psd=True)
        if c_name:
            lows, highs = np.minimum(lows, c_lows), np.maximum(highs, c_highs)
            ses = np.maximum(ses, c_ses)
            name = f"hull of two parametric bootstraps over the noise: {name}; {c_name}"
    out = []
    for j, label in enumerate(labels):
        value, se = float(values[j]), float(ses[j])
        low, high = float(lows[j]), float(highs[j])
        out.append(
            Estimate(
                label=label,
                value=value,
                standard_error=se,
                low=low,
                high=high,
                level=level,
                method=name,
                covers=task_covers,
                flags=_capefm_flags(value, se, low, high, fit, unresolved, plan.dim),
            )
        )
    return tuple(out)


def _capefm_flags(
    value: float, se: float, low: float, high: float, fit: FMRelease, unresolved: int, dim: int
) -> tuple[Flag, ...]:
    """A capeFM coefficient's flags: :func:`noise_flags`, then ``shrunk`` when the released fit
    raised eigenvalues to its noise floor, and ``undetermined`` when ``unresolved`` eigenvalues
    of the released Gram matrix lie within one noise std of 0 (:func:`capefm_estimates`,
    Notes)."""
    flags = noise_flags(value, se, low, high)
    if fit.clipped:
        where = "" if low <= value <= high else "; it lies outside its interval"
        flags.append(
            Flag(
                "shrunk",
                f"the value is regularized: the noise floor {fit.floor:.3g} raised "
                f"{fit.clipped} of the {dim} eigenvalues of the released Gram matrix, "
                f"shrinking it towards 0 along directions the noise hides{where}; the "
                f"interval is built on the solve with a floor of {INTERVAL_FLOOR_SIGMAS:g} noise "
                "std",
            )
        )
    if unresolved:
        flags.append(
            Flag(
                "undetermined",
                f"{unresolved} eigenvalue(s) of the released Gram matrix lie within one "
                "noise std of 0: the data do not determine the fit along them, so no bounded "
                "interval's coverage can be guaranteed (Dufour 1997); this one's depends on what "
                "the noise hides and does not hold its level: measured on real tables at "
                "89.9-100 % per coefficient, above 98 % on most and below 92 % on some",
                "interval",
            )
        )
    return tuple(flags)


def training_estimates(
    parameters: ArrayLike,
    labels: Sequence[str],
    learning_rate: float,
    last_noise_std: float,
) -> tuple[Estimate, ...]:
    """Every parameter of a network trained by CAPE gradient descent, flagged ``no_interval``.

    Parameters
    ----------
    parameters : array-like of shape (P,)
    labels : sequence of str, length P
    learning_rate : float
        The step size.
    last_noise_std : float
        The noise standard deviation of the last iteration's averaged gradient.

    Returns
    -------
    tuple of Estimate
        ``standard_error``, ``low`` and ``high`` are ``None``.

    Raises
    ------
    ValueError
        If the lengths disagree.

    Notes
    -----
    ``theta_T = theta_{T-1} - eta (g(theta_{T-1}) + n_{T-1})`` with ``n_{T-1}`` independent of
    ``theta_{T-1}``: the final parameters' noise variance is at least ``eta^2 sigma_{T-1}^2`` per
    coordinate. Nothing tighter can be said without the data (the network is not convex).
    """
    theta = np.asarray(parameters, dtype=np.float64)
    if theta.ndim != 1 or len(labels) != theta.shape[0]:
        raise ValueError(
            f"parameters and labels must have one length, got {theta.shape} and {len(labels)}"
        )
    floor = learning_rate * last_noise_std
    flag = Flag(
        "no_interval",
        "the network is not convex: the noise's effect on its weights cannot be computed "
        f"from the release; each weight's noise std is at least {floor:.3g} (the last step's)",
        "interval",
    )
    return tuple(
        Estimate(
            label=label,
            value=float(theta[j]),
            standard_error=None,
            low=None,
            high=None,
            level=DEFAULT_LEVEL,
            method="none",
            covers="nothing",
            flags=(flag,),
        )
        for j, label in enumerate(labels)
    )
