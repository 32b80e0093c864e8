"""The CAPE estimate of a mean vector across sites (Algorithm 2 applied to the sites' means).

Each site ``s`` holds ``N_s`` records ``x_i`` in a public box ``[low, high]`` of ``R^D`` and
releases its mean ``f(x_s) = (1/N_s) sum_i x_i`` through CAPE
(:mod:`dpmarket.common.cape.zero_sum`):

============  =========================================================================
public        :func:`plan_mean` (bounds, sizes ``N_s``, epsilon, delta, ``S_C``): the noise
              ``tau_s = kappa Delta_s`` of every site, Remark 3's weights ``w_s = N_s / N``,
              the guarantee. Every party computes it from public values.
site s        ``e_hat_s`` (:func:`dpmarket.common.cape.capefm.site_noise_share`); its (weighted) sum
              goes through secure aggregation; then it releases
              ``site_mean(...) + e_s + g_s`` (:func:`dpmarket.common.cape.capefm.site_release`).
aggregator    ``sum_s w_s a_hat_s`` (:func:`dpmarket.common.cape.capefm.aggregate_releases`): the
pooled
              mean plus noise of standard deviation :meth:`CapeMeanPlan.aggregator_std`.
============  =========================================================================

Sensitivity (:func:`mean_sensitivity`). Neighbouring data sets differ in one record of one site,
*replaced* by another record of the box (``N_s`` is public and unchanged, as in the paper's mean
example with sensitivity ``1 / N_s``). The site's mean moves by ``(x' - x) / N_s``, and ``||x' -
x||_2 <= ||high - low||_2`` for two points of the box (attained by opposite corners), so ``Delta_s =
||high - low||_2 / N_s``. The noise is isotropic: every coordinate gets the same ``tau_s``, in the
columns' raw units. The sensitivity holds for an owner's raw data, whatever it holds: the owner
clamps every record into the box first (:mod:`dpmarket.common.cape.spec`), which maps one replaced
record to one replaced record of the box.

Lemma 1 and Remark 3: with ``w_s = N_s / N``, ``w_s tau_s = kappa ||high - low||_2 / N`` is the same
at every site, the ``e_s`` cancel in the weighted average and the ``g_s ~ N(0, tau_s^2 / S)`` leave
a variance ``sum_s w_s^2 tau_s^2 / S = (kappa ||high - low||_2 / N)^2`` per coordinate: the
pooled-data Gaussian mechanism's with the same multiplier ``kappa``
(:func:`dpmarket.common.cape.privacy.remark3_weights`). That ``kappa`` is calibrated against the
aggregator's view of every site's release and ``S_C`` colluders, whose privacy loss has ``sigma_z^2
= F / kappa^2`` with ``F = S (S + S_H) / (S_H (S + 1))``
(:func:`dpmarket.common.cape.privacy.collusion_factor`); the pooled mechanism at the same
``(epsilon, delta)`` needs only ``kappa / sqrt(F)``. So the estimate's variance is ``F`` times the
pooled mechanism's at the same guarantee (``CapeMeanPlan.baseline_stds()["pooled"]``): 1.875 at ``S
= 5, S_C = 1``, ``2 S / (S + 1)`` without colluders, against ``S`` times for independent noise per
site.

References
----------
CAPE paper, Algorithms 1 and 2, Theorem 1, Lemma 1, Proposition 1, Remark 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.capefm import (
    aggregate_noise_shares,
    aggregate_releases,
    secure_aggregation_input,
    site_noise_share,
    site_release,
)
from dpmarket.common.cape.privacy import (
    Calibration,
    cape_guarantee,
    gaussian_sigma,
    remark3_weights,
)
from dpmarket.common.cape.zero_sum import UniformNoisePlan, check_zero_sum, conv_release
from dpmarket.common.cape.zero_sum import zero_sum_correction as _correction
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_positive_int

__all__ = [
    "MEAN_BASELINES",
    "CapeMeanPlan",
    "CapeMeanResult",
    "MeanBaseline",
    "check_box",
    "mean_baseline",
    "mean_sensitivity",
    "plan_mean",
    "run_cape_mean",
    "site_mean",
]

MeanBaseline = Literal["nonprivate", "pooled", "conv", "local"]
MEAN_BASELINES: tuple[MeanBaseline, ...] = ("nonprivate", "pooled", "conv", "local")


def _check_bounds(bounds: ArrayLike) -> NDArray[np.float64]:
    b = np.asarray(bounds, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 2 or b.shape[0] < 1:
        raise ValueError(f"bounds must have shape (D, 2) with D >= 1, got {b.shape}")
    if not (np.isfinite(b).all() and (b[:, 0] < b[:, 1]).all()):
        raise ValueError("every bound must be finite with low < high")
    return b


def mean_sensitivity(bounds: ArrayLike, n: int) -> float:
    """L2 sensitivity of the mean of ``n`` records of the box ``bounds``: ``||high - low||_2 / n``.

    Parameters
    ----------
    bounds : array-like of shape (D, 2)
        Public ``[low_d, high_d]`` per coordinate, ``low_d < high_d``.
    n : int
        Records averaged (``N_s``, public).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        On malformed bounds or ``n < 1``.

    Notes
    -----
    Replace-one neighbours (``n`` fixed): the mean changes by ``(x' - x) / n`` and two points of
    the box are at most its diagonal ``||high - low||_2`` apart (opposite corners attain it).
    """
    b = _check_bounds(bounds)
    return float(np.linalg.norm(b[:, 1] - b[:, 0])) / check_positive_int(n, "n")


def check_box(values: ArrayLike, bounds: ArrayLike, name: str = "values") -> NDArray[np.float64]:
    """``values`` as a float64 matrix of shape (n, D) inside the box; ``ValueError`` otherwise.

    NaN and inf are outside every box. Nothing is clipped here: an owner clamps its records into the
    box before (:meth:`dpmarket.common.cape.spec.CapeMeanSpec.clamped`), so this never fails on its
    data (and it runs under :func:`dpmarket.common.errors.on_private_data` at the owner).
    """
    b = _check_bounds(bounds)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != b.shape[0] or x.shape[0] < 1:
        raise ValueError(f"{name} must have shape (n >= 1, {b.shape[0]}), got {x.shape}")
    outside = ~((x >= b[:, 0]) & (x <= b[:, 1]))
    if outside.any():
        row, col = (int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"{name}[{row}, {col}] = {x[row, col]} is outside [{b[col, 0]}, {b[col, 1]}]"
        )
    return x


@dataclass(frozen=True)
class CapeMeanPlan(UniformNoisePlan):
    """Public parameters of one CAPE mean: who adds how much noise, and what it guarantees.

    The shape of every CAPE plan (:class:`~dpmarket.common.cape.zero_sum.CapePlan`), with one
    noise scale per site (:class:`~dpmarket.common.cape.zero_sum.UniformNoisePlan`, whose
    ``aggregator_std`` is here Lemma 1's ``kappa ||high - low||_2 / N``).

    Attributes
    ----------
    bounds : ndarray of shape (D, 2)
        The columns' public bounds.
    sizes : tuple of int
        ``N_s`` per site, in site order.
    weights : ndarray of shape (S,)
        ``w_s = N_s / N`` (Remark 3).
    weighted : bool
        Whether the sizes differ (then the noise round sums ``w_s e_hat_s``).
    colluders : int
        ``S_C``.
    epsilon, delta : float
        Each site's target against the aggregator and ``S_C`` colluders.
    calibration : {"exact", "theorem1", "paper"}
    kappa : float
        ``tau_s = kappa Delta_s`` with ``Delta_s = ||high - low||_2 / N_s``.
    site_scales : tuple of float
        ``tau_s`` per site, in the columns' units.
    sigma_z : float
        Standard deviation of one site's privacy loss (:class:`dpmarket.common.cape.privacy.
        SiteGuarantee`).
    delta_exact : float
        Exact delta at ``epsilon``.
    delta_theorem1 : float or None
        Theorem 1's delta at ``epsilon`` (``None`` where it does not apply).
    """

    bounds: NDArray[np.float64]
    calibration: Calibration
    kappa: float
    sigma_z: float

    @property
    def dim(self) -> int:
        """``D``."""
        return int(self.bounds.shape[0])

    @property
    def size(self) -> int:
        """Length of every site's release: ``D``."""
        return self.dim

    def baseline_stds(self) -> dict[str, float]:
        """Noise standard deviation per coordinate of the baselines at the same ``(epsilon,
        delta)`` on the same sites (analytic Gaussian calibration, no colluders to defend
        against): ``pooled`` (one Gaussian mechanism on the pooled mean, sensitivity
        ``||high - low|| / N``), ``conv`` (each site's own mechanism, averaged with ``w_s``:
        ``sqrt(S)`` times pooled when ``w_s sigma_s`` is the same at every site, Proposition 1)
        and ``local`` (the first site alone)."""

        def sigma(n: int) -> float:
            return gaussian_sigma(self.epsilon, self.delta, mean_sensitivity(self.bounds, n))

        pairs = zip(self.weights.tolist(), self.sizes, strict=True)
        conv = math.sqrt(sum(w * w * sigma(n) ** 2 for w, n in pairs))
        return {"pooled": sigma(sum(self.sizes)), "conv": conv, "local": sigma(self.sizes[0])}


def plan_mean(
    bounds: ArrayLike,
    sizes: Sequence[int],
    epsilon: float,
    delta: float,
    *,
    colluders: int | None = None,
    calibration: Calibration = "exact",
) -> CapeMeanPlan:
    """Calibrate a CAPE mean from public values.

    Parameters
    ----------
    bounds : array-like of shape (D, 2)
        The columns' public ``[low, high]``: parameters of the request, never statistics of the
        private data.
    sizes : sequence of int, shape (S,)
        ``N_s`` per site, ``S >= 2``.
    epsilon, delta : float
        Each site's target.
    colluders : int, optional
        ``S_C``; default ``ceil(S / 3) - 1``.
    calibration : {"exact", "theorem1", "paper"}
        As :func:`dpmarket.common.cape.privacy.cape_guarantee` (one statistic: ``unit = 1``).

    Returns
    -------
    CapeMeanPlan

    Raises
    ------
    ValueError
        On invalid parameters, fewer than 2 sites, or a Theorem 1 target that cannot be met.
    """
    b = _check_bounds(bounds)
    n = tuple(check_positive_int(v, f"sizes[{j}]") for j, v in enumerate(sizes))
    if len(n) < 2:
        raise ValueError(f"a CAPE mean needs at least 2 sites, got {len(n)}")
    guarantee = cape_guarantee(
        epsilon, delta, sites=len(n), colluders=colluders, calibration=calibration
    )
    return CapeMeanPlan(
        bounds=b,
        sizes=n,
        weights=remark3_weights(n),
        weighted=len(set(n)) > 1,
        colluders=guarantee.colluders,
        epsilon=float(epsilon),
        delta=float(delta),
        calibration=calibration,
        kappa=guarantee.kappa,
        site_scales=tuple(guarantee.kappa * mean_sensitivity(b, ns) for ns in n),
        sigma_z=guarantee.sigma_z,
        delta_exact=guarantee.delta_exact,
        delta_theorem1=guarantee.delta_theorem1,
    )


def site_mean(plan: CapeMeanPlan, site: int, values: ArrayLike) -> NDArray[np.float64]:
    """Site side: the exact mean of the site's records (never released as is).

    Parameters
    ----------
    plan : CapeMeanPlan
    site : int
        This site's index in the plan.
    values : array-like of shape (N_s, D)
        The site's records, inside the plan's bounds.

    Returns
    -------
    ndarray of shape (D,), float64

    Raises
    ------
    ValueError
        If the shape disagrees with the plan (``N_s`` and ``D`` are public) or a value lies
        outside the bounds (the owner clamps its records into them first).
    """
    x = check_box(values, plan.bounds, f"site {site} values")
    if x.shape[0] != plan.sizes[site]:
        raise ValueError(f"site {site} holds {x.shape[0]} records, planned {plan.sizes[site]}")
    out: NDArray[np.float64] = x.mean(axis=0)
    return out


@dataclass(frozen=True)
class CapeMeanResult:
    """An in-process CAPE mean.

    Attributes
    ----------
    estimate : ndarray of shape (D,)
    plan : CapeMeanPlan
    zero_sum_residual : float
        ``max |sum_s w_s e_s|`` (float rounding only).
    """

    estimate: NDArray[np.float64]
    plan: CapeMeanPlan
    zero_sum_residual: float


def run_cape_mean(
    sites_values: Sequence[ArrayLike],
    bounds: ArrayLike,
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    *,
    colluders: int | None = None,
    calibration: Calibration = "exact",
) -> CapeMeanResult:
    """The CAPE mean in one process: every site's steps and the aggregator's, in order.

    Parameters
    ----------
    sites_values : sequence of array-like, each of shape (N_s, D)
    bounds : array-like of shape (D, 2)
    epsilon, delta, colluders, calibration
        As :func:`plan_mean`.
    noise : NoiseSource
        Order of draws: ``e_hat_s`` for each site in order, then ``g_s`` for each site in order
        (one ``noise.gaussian`` call each).

    Returns
    -------
    CapeMeanResult

    Raises
    ------
    ValueError
        On invalid parameters or a value outside the bounds.
    """
    if not sites_values:
        raise ValueError("sites_values is empty")
    b = _check_bounds(bounds)
    data = [check_box(v, b, f"site {s} values") for s, v in enumerate(sites_values)]
    plan = plan_mean(
        b, [x.shape[0] for x in data], epsilon, delta, colluders=colluders, calibration=calibration
    )
    stats = [site_mean(plan, s, x) for s, x in enumerate(data)]
    e_hats = [site_noise_share(plan, s, noise) for s in range(plan.sites)]
    total = aggregate_noise_shares(
        [secure_aggregation_input(plan, s, e) for s, e in enumerate(e_hats)]
    )
    releases = [site_release(plan, s, stats[s], e_hats[s], total, noise) for s in range(plan.sites)]
    weights = plan.weights if plan.weighted else None
    corrected = [
        _correction(e, total, plan.sites, weight=None if weights is None else float(weights[s]))
        for s, e in enumerate(e_hats)
    ]
    residual = check_zero_sum(corrected, e_hats, weights)
    return CapeMeanResult(aggregate_releases(plan, releases), plan, residual)


def mean_baseline(
    method: MeanBaseline,
    sites_values: Sequence[ArrayLike],
    bounds: ArrayLike,
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    *,
    local_site: int = 0,
) -> NDArray[np.float64]:
    """A baseline mean on the same sites' data.

    Parameters
    ----------
    method : {"nonprivate", "pooled", "conv", "local"}
        ``"nonprivate"``: the exact pooled mean. ``"pooled"``: the Gaussian mechanism on the
        pooled mean (sensitivity ``||high - low|| / N``; the best any distributed scheme can
        do). ``"conv"``: every site releases its mean with its own Gaussian mechanism at
        ``(epsilon, delta)``, averaged with ``w_s = N_s / N``. ``"local"``: site ``local_site``
        alone.
    sites_values, bounds, epsilon, delta
        As :func:`run_cape_mean`.
    noise : NoiseSource
        One ``noise.gaussian`` call (``"pooled"``, ``"local"``) or one per site in order
        (``"conv"``).
    local_site : int

    Returns
    -------
    ndarray of shape (D,)

    Raises
    ------
    ValueError
        On an unknown method, invalid parameters or a value outside the bounds.
    """
    b = _check_bounds(bounds)
    data = [check_box(v, b, f"site {s} values") for s, v in enumerate(sites_values)]
    if not data:
        raise ValueError("sites_values is empty")
    sizes = [x.shape[0] for x in data]
    if method == "nonprivate":
        out: NDArray[np.float64] = np.vstack(data).mean(axis=0)
        return out
    if method == "pooled":
        sigma = gaussian_sigma(epsilon, delta, mean_sensitivity(b, sum(sizes)))
        return np.vstack(data).mean(axis=0) + noise.gaussian(sigma, b.shape[0])
    if method == "local":
        if not 0 <= local_site < len(data):
            raise ValueError(f"local_site must be in [0, {len(data) - 1}], got {local_site}")
        x = data[local_site]
        sigma = gaussian_sigma(epsilon, delta, mean_sensitivity(b, x.shape[0]))
        return x.mean(axis=0) + noise.gaussian(sigma, b.shape[0])
    if method == "conv":
        weights = remark3_weights(sizes)
        out = np.zeros(b.shape[0])
        for x, w in zip(data, weights, strict=True):
            sigma = gaussian_sigma(epsilon, delta, mean_sensitivity(b, x.shape[0]))
            out += float(w) * conv_release(x.mean(axis=0), sigma, noise)
        return out
    raise ValueError(f"method must be one of {MEAN_BASELINES}, got {method!r}")
