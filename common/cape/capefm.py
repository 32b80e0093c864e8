"""capeFM (Algorithm 4): the functional mechanism across S sites with CAPE's zero-sum noise, and
the baselines the paper compares it with on the same data.

Protocol (one noise round for all released orders, packed into one vector of length ``m``):

============  =========================================================================
public        :func:`plan_capefm` (task, D, site sizes ``N_s``, epsilon, delta, S_C): the
              per-site, per-order noise ``tau_j^s``, the weights ``w_s = N_s / N``, the
              privacy report. Both sides compute it from public values.
site s        ``f_s = site_coefficients(X_s, y_s, ...)`` (checks the domain);
              ``e_hat_s = site_noise_share(plan, s, noise)``; sends
              ``secure_aggregation_input(plan, s, e_hat_s)`` to secure aggregation.
aggregator    ``total = sum`` of the inputs (secure aggregation; :func:`aggregate_noise_shares`
              in process) and broadcasts it.
site s        ``a_hat_s = site_release(plan, s, f_s, e_hat_s, total, noise)``: the only
              value that leaves the site, ``Lambda^s + e^s + g^s`` packed.
aggregator    ``lam = aggregate_releases(plan, releases)``;
              ``fit = fit_released(plan, lam)``: symmetrize, project ``Lambda_hat_2`` onto
              ``{M >= floor I}``, solve.
============  =========================================================================

What is released and its sensitivity: each site releases its packed coefficients ``Lambda_j^s``
(order 1: ``D`` values, order 2: ``D^2`` values, order 0 optionally) plus CAPE noise. Order ``j``
has L2 sensitivity ``Delta_j(N_s)``
(:func:`dpmarket.common.cape.functional_mechanism.fm_sensitivities`), the stack divided order-wise
by ``Delta_j`` has sensitivity ``sqrt(k)``; the site noise is ``tau_j^s = kappa Delta_j(N_s)`` with
``kappa`` calibrated by :func:`dpmarket.common.cape.privacy.calibrate_tau` for sensitivity
``sqrt(k)`` against ``S_C`` colluders. All sites must release: a site lost after the noise round
voids the round (:mod:`dpmarket.common.cape.zero_sum`).

References
----------
CAPE paper, Algorithm 4 (capeFM), Section 4.4 (conv), Section 5.2 (baselines: pooled, local,
dp-fm, objPert, non-private), Remark 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.functional_mechanism import (
    FMCoefficients,
    FMRelease,
    Task,
    dpfm,
    entry_scales,
    fit_coefficients,
    fm_coefficients,
    functional_mechanism,
    objective_perturbation_logistic,
    order_scales,
    pack_coefficients,
    packed_size,
    released_orders,
    scale_to_bounds,
    stacked_sensitivity,
    unpack_coefficients,
)
from dpmarket.common.cape.privacy import (
    Calibration,
    cape_guarantee,
    gaussian_sigma,
    remark3_weights,
)
from dpmarket.common.cape.zero_sum import (
    CapePlan,
    cape_average,
    cape_release,
    check_zero_sum,
    draw_gaussian,
    partial_average_variance,
    sum_noise_shares,
    zero_sum_correction,
)
from dpmarket.common.cape.zero_sum import secure_aggregation_input as _secagg_input
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

__all__ = [
    "BASELINES",
    "Baseline",
    "Calibration",
    "CapeFMPlan",
    "CapeFMResult",
    "FitResult",
    "aggregate_noise_shares",
    "aggregate_releases",
    "fit_released",
    "plan_capefm",
    "prepare_sites",
    "run_baseline",
    "run_capefm",
    "secure_aggregation_input",
    "site_coefficients",
    "site_noise_share",
    "site_release",
]

Baseline = Literal["nonprivate", "pooled", "conv", "local", "dpfm", "objpert"]
BASELINES: tuple[Baseline, ...] = ("nonprivate", "pooled", "conv", "local", "dpfm", "objpert")

SiteData = tuple[ArrayLike, ArrayLike]


@dataclass(frozen=True)
class CapeFMPlan(CapePlan):
    """Public parameters of one capeFM run: who adds how much noise, and what it guarantees.

    The shape of every CAPE plan (:class:`~dpmarket.common.cape.zero_sum.CapePlan`), with one
    noise scale per site and released order.

    Attributes
    ----------
    task : {"linear", "logistic"}
    dim : int
        ``D``.
    orders : tuple of int
        Released orders (``(1, 2)`` or ``(0, 1, 2)``).
    sizes : tuple of int
        ``N_s`` per site, in site order.
    weights : ndarray of shape (S,)
        ``w_s = N_s / N`` (Remark 3); ``1/S`` each when the sizes are equal.
    weighted : bool
        Whether the sizes differ (then the zero-sum round uses the weights).
    colluders : int
        ``S_C``.
    epsilon, delta : float
        The target.
    calibration : {"exact", "theorem1", "paper"}
    kappa : float
        Noise multiplier: ``tau_j^s = kappa Delta_j(N_s)``.
    site_scales : tuple of dict
        ``{j: tau_j^s}`` per site.
    sigma_z : float
        Standard deviation of the privacy loss of one site's whole release against ``S_C``
        colluders and the aggregator (:func:`dpmarket.common.cape.privacy.collusion_factor`).
    delta_exact : float
        Exact delta at ``epsilon`` of that loss.
    delta_theorem1 : float or None
        Theorem 1's delta at ``epsilon`` (rederived ``sigma_z``); ``None`` when ``epsilon <=
        mu_z`` (the bound does not apply).
    """

    task: Task
    dim: int
    orders: tuple[int, ...]
    calibration: Calibration
    kappa: float
    site_scales: tuple[dict[int, float], ...]
    sigma_z: float

    @property
    def size(self) -> int:
        """Length ``m`` of the packed vector every site releases."""
        return packed_size(self.dim, self.orders)

    def entry_scales(self, site: int) -> NDArray[np.float64]:
        """Per-entry ``tau_s`` of ``site``'s packed vector (shape ``(m,)``)."""
        return entry_scales(self.site_scales[site], self.dim, self.orders)

    def aggregator_scales(self, released: Sequence[int] | None = None) -> dict[int, float]:
        """``{j: std}`` of the noise left at the aggregator per entry of order ``j``.

        With every site released, ``sqrt(sum_s w_s^2 (tau_j^s)^2 / S)`` (only the ``g_s`` survive;
        Lemma 1). With only the sites ``released`` (indices) averaged, the larger std of
        :func:`dpmarket.common.cape.zero_sum.partial_average_variance` (the lost sites' ``e_s``
        remain).
        """
        kept = range(self.sites) if released is None else released
        return {
            j: math.sqrt(
                float(
                    partial_average_variance(
                        self.weights, [sc[j] for sc in self.site_scales], list(kept)
                    )
                )
            )
            for j in self.orders
        }

    def baseline_scales(self) -> dict[str, dict[int, float]]:
        """``{method: {j: std}}``: the noise per entry of order ``j`` of the averaged
        coefficients for the baselines at the same ``(epsilon, delta)`` on the same sites
        (analytic calibration of the stacked orders, no colluders to defend against):
        ``pooled`` (Algorithm 3 on the pooled data), ``conv`` (each site's own mechanism,
        averaged with ``w_s``) and ``local`` (the first site alone); :func:`run_baseline`."""
        kappa = gaussian_sigma(
            self.epsilon, self.delta, stacked_sensitivity(self.task, self.orders)
        )
        per_site = [order_scales(kappa, self.task, n, self.orders) for n in self.sizes]
        weights = self.weights.tolist()
        return {
            "pooled": order_scales(kappa, self.task, sum(self.sizes), self.orders),
            "conv": {
                j: math.sqrt(
                    sum(w * w * sc[j] ** 2 for w, sc in zip(weights, per_site, strict=True))
                )
                for j in self.orders
            },
            "local": per_site[0],
        }


def _check_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(check_positive_int(n, f"sizes[{j}]") for j, n in enumerate(sizes))
    if len(out) < 2:
        raise ValueError(f"capeFM needs at least 2 sites, got {len(out)}")
    return out


def plan_capefm(
    task: Task,
    dim: int,
    sizes: Sequence[int],
    epsilon: float,
    delta: float,
    *,
    colluders: int | None = None,
    calibration: Calibration = "exact",
    include_constant: bool = False,
) -> CapeFMPlan:
    """Calibrate capeFM from public values.

    Parameters
    ----------
    task : {"linear", "logistic"}
    dim : int
        ``D``.
    sizes : sequence of int, shape (S,)
        ``N_s`` per site (public: they set the sensitivities).
    epsilon : float
        ``> 0``.
    delta : float
        In ``(0, 1)``.
    colluders : int, optional
        ``S_C``; default ``ceil(S / 3) - 1``.
    calibration : {"exact", "theorem1", "paper"}
        ``"exact"`` (default): ``kappa = calibrate_tau(epsilon, delta, sites=S, colluders=S_C,
        sensitivity=sqrt(k), method="exact")``, so every site is ``(epsilon, delta)``-DP against
        the aggregator and ``S_C`` colluders (tight); ``"theorem1"``: the same with Theorem 1's
        bound (more noise); ``"paper"``: ``kappa = sqrt(2 log(1.25 / delta)) / epsilon`` as in
        Section 5.2, which ignores both the composition over orders and the collusion (its real
        delta is reported in ``delta_exact``).
    include_constant : bool, default False
        Release ``Lambda_0`` too (linear regression).

    Returns
    -------
    CapeFMPlan

    Raises
    ------
    ValueError
        On invalid parameters, or if ``calibration="theorem1"`` cannot meet the target.
    """
    d = check_positive_int(dim, "dim")
    n = _check_sizes(sizes)
    orders = released_orders(task, include_constant=include_constant)
    guarantee = cape_guarantee(
        epsilon,
        delta,
        sites=len(n),
        colluders=colluders,
        unit=stacked_sensitivity(task, orders),
        calibration=calibration,
    )
    site_scales = tuple(order_scales(guarantee.kappa, task, ns, orders) for ns in n)
    weighted = len(set(n)) > 1
    return CapeFMPlan(
        task=task,
        dim=d,
        orders=orders,
        sizes=n,
        weights=remark3_weights(n),
        weighted=weighted,
        colluders=guarantee.colluders,
        epsilon=float(epsilon),
        delta=float(delta),
        calibration=calibration,
        kappa=guarantee.kappa,
        site_scales=site_scales,
        sigma_z=guarantee.sigma_z,
        delta_exact=guarantee.delta_exact,
        delta_theorem1=guarantee.delta_theorem1,
    )


# --------------------------------------------------------------------------- site side
def site_coefficients(
    plan: CapeFMPlan, site: int, X_s: ArrayLike, y_s: ArrayLike
) -> NDArray[np.float64]:
    """Site side: the packed exact coefficients ``Lambda_j^s`` of the site's data.

    Parameters
    ----------
    plan : CapeFMPlan
    site : int
        This site's index in the plan.
    X_s : array-like of shape (N_s, D)
        Records in the domain (``||x|| <= 1``; :func:`dpmarket.common.cape.functional_mechanism.
        scale_to_bounds` with the request's public bounds).
    y_s : array-like of shape (N_s,)

    Returns
    -------
    ndarray of shape (plan.size,), float64
        Never released as is.

    Raises
    ------
    ValueError
        If a record is outside the domain, or the data's shape disagrees with the plan (``N_s``
        and ``D`` are public parameters of the plan).
    """
    x = np.asarray(X_s)
    if x.ndim != 2 or x.shape != (plan.sizes[site], plan.dim):
        raise ValueError(
            f"site {site} data must have shape ({plan.sizes[site]}, {plan.dim}) as planned, "
            f"got {x.shape}"
        )
    return pack_coefficients(fm_coefficients(x, y_s, plan.task), plan.orders)


def site_noise_share(plan: CapePlan, site: int, noise: NoiseSource) -> NDArray[np.float64]:
    """Site side, Algorithm 1 step 2: ``e_hat_s ~ N(0, (tau_j^s)^2)`` per entry.

    Draws, in order: one ``noise.gaussian`` call per released order (0, 1, 2), ``1``, ``D`` and
    ``D^2`` values.

    Returns
    -------
    ndarray of shape (plan.size,), float64
    """
    return plan.noise_share(site, noise)


def secure_aggregation_input(plan: CapePlan, site: int, e_hat_s: ArrayLike) -> NDArray[np.float64]:
    """Site side: ``e_hat_s`` (equal sizes) or ``w_s e_hat_s`` (Remark 3), for secure aggregation.

    Returns
    -------
    ndarray of shape (plan.size,), float64
    """
    return _secagg_input(e_hat_s, plan.site_weight(site))


def site_release(
    plan: CapePlan,
    site: int,
    f_s: ArrayLike,
    e_hat_s: ArrayLike,
    total: ArrayLike,
    noise: NoiseSource,
) -> NDArray[np.float64]:
    """Site side, Algorithm 4 steps 5-8: ``Lambda_hat^s = Lambda^s + e^s + g^s``.

    Parameters
    ----------
    plan : CapeFMPlan
    site : int
    f_s : array-like of shape (plan.size,)
        :func:`site_coefficients`.
    e_hat_s : array-like of shape (plan.size,)
        :func:`site_noise_share` of this site.
    total : array-like of shape (plan.size,)
        The broadcast sum over exactly the plan's sites.
    noise : NoiseSource
        ``g_s ~ N(0, (tau_j^s)^2 / S)``: one ``noise.gaussian`` call per order.

    Returns
    -------
    ndarray of shape (plan.size,), float64
        What the site sends to the aggregator.
    """
    e_s = zero_sum_correction(e_hat_s, total, plan.sites, weight=plan.site_weight(site))
    tau_g = plan.entry_scales(site) / math.sqrt(plan.sites)
    return cape_release(f_s, e_s, tau_g, noise)


# --------------------------------------------------------------------------- aggregator side
def aggregate_noise_shares(shares: Sequence[ArrayLike]) -> NDArray[np.float64]:
    """Aggregator side (in process): the sum of the sites' secure-aggregation inputs."""
    return sum_noise_shares(shares)


def aggregate_releases(
    plan: CapePlan, releases: Sequence[ArrayLike], released: Sequence[int] | None = None
) -> NDArray[np.float64]:
    """Aggregator side, Algorithm 4 step 11: ``Lambda_hat = sum_s w_s Lambda_hat^s``.

    Parameters
    ----------
    plan : CapeFMPlan
    releases : sequence of array-like of shape (plan.size,)
        In site order: every site's, or those of the sites ``released``.
    released : sequence of int, optional
        Indices (increasing) of the sites that released when some were lost after the noise
        round; their weights are renormalised and the estimate carries the larger noise of
        ``plan.aggregator_scales(released)``.

    Raises
    ------
    ValueError
        If the number of releases differs from the plan's sites (or from ``released``), or
        ``released`` is not increasing within the plan's sites.
    """
    if released is None:
        if len(releases) != plan.sites:
            raise ValueError(
                f"the noise round had {plan.sites} sites but {len(releases)} released: pass the "
                "indices of the sites that released"
            )
        return cape_average(releases, plan.weights if plan.weighted else None)
    kept = list(released)
    if len(kept) != len(releases) or kept != sorted(set(kept)) or not kept:
        raise ValueError(f"released must list the {len(releases)} releases' sites in order")
    if kept[0] < 0 or kept[-1] >= plan.sites:
        raise ValueError(f"released holds a site outside [0, {plan.sites}): {kept}")
    w = plan.weights[kept]
    return cape_average(releases, w / w.sum())


def fit_released(
    plan: CapeFMPlan,
    aggregate: ArrayLike,
    *,
    floor: float | None = None,
    released: Sequence[int] | None = None,
) -> FMRelease:
    """Aggregator side, Algorithm 4 steps 12-13: minimize ``f_hat`` of the averaged coefficients.

    Parameters
    ----------
    plan : CapeFMPlan
    aggregate : array-like of shape (plan.size,)
        :func:`aggregate_releases`.
    floor : float, optional
        Eigenvalue floor; default :func:`dpmarket.common.cape.functional_mechanism.default_floor` of
        the aggregator's order-2 noise (public).
    released : sequence of int, optional
        As for :func:`aggregate_releases`: the noise of the average is then larger.

    Returns
    -------
    FMRelease
        ``scales`` holds the aggregator's per-order noise.
    """
    lam0 = math.log(2.0) if plan.task == "logistic" else 0.0
    coeffs = unpack_coefficients(aggregate, plan.dim, plan.orders, lam0=lam0)
    agg = plan.aggregator_scales(released)
    return fit_coefficients(coeffs, noise_std2=agg[2], floor=floor, scales=agg)


# --------------------------------------------------------------------------- drivers
@dataclass(frozen=True)
class CapeFMResult:
    """What an in-process capeFM run returns.

    Attributes
    ----------
    fit : FMRelease
        ``fit.w`` is the released model.
    plan : CapeFMPlan
        Calibration and privacy report.
    zero_sum_residual : float
        ``max |sum_s w_s e_s|`` (float rounding only).
    """

    fit: FMRelease
    plan: CapeFMPlan
    zero_sum_residual: float

    @property
    def w(self) -> NDArray[np.float64]:
        """The released model, shape ``(D,)``."""
        return self.fit.w


def prepare_sites(
    sites_data: Sequence[SiteData],
    task: Task,
    feature_bounds: ArrayLike | None,
    target_bounds: ArrayLike | None,
) -> list[tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """Each site's data mapped into the domain with the public bounds (or as given if ``None``).

    Raises
    ------
    ValueError
        If there are no sites, or a value lies outside the bounds (naming the site, row and
        column).
    """
    if not sites_data:
        raise ValueError("sites_data is empty")
    out = []
    for s, (x, y) in enumerate(sites_data):
        try:
            if feature_bounds is None:
                xs = np.asarray(x, dtype=np.float64)
                ys = np.asarray(y, dtype=np.float64)
            else:
                xs, ys = scale_to_bounds(x, y, feature_bounds, target_bounds, task=task)
        except ValueError as err:
            raise ValueError(f"site {s}: {err}") from None
        out.append((xs, ys))
    return out


def run_capefm(
    sites_data: Sequence[SiteData],
    task: Task,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    noise: NoiseSource,
    *,
    colluders: int | None = None,
    calibration: Calibration = "exact",
    include_constant: bool = False,
    feature_bounds: ArrayLike | None = None,
    target_bounds: ArrayLike | None = None,
    floor: float | None = None,
) -> CapeFMResult:
    """capeFM (Algorithm 4) in one process: every site's steps and the aggregator's, in order.

    Parameters
    ----------
    sites_data : sequence of (X_s, y_s)
        Per site: ``X_s`` of shape ``(N_s, D)``, ``y_s`` of shape ``(N_s,)``. In the domain, or
        raw with ``feature_bounds`` (and ``target_bounds`` for linear regression).
    task : {"linear", "logistic"}
    epsilon, delta : float
        Per-site target (see :func:`plan_capefm`).
    rng : numpy.random.Generator
        Not drawn from: capeFM's only randomness is its noise (kept for the drivers' common
        signature).
    noise : NoiseSource
        Order of draws (the service layer's in-process run must follow it to match bit for
        bit): first, for each site ``s = 0..S-1`` in order, ``e_hat_s`` (one call per released
        order: 0, 1, 2); then, for each site in order, ``g_s`` (one call per order).
    colluders, calibration, include_constant
        As :func:`plan_capefm`.
    feature_bounds : array-like of shape (D, 2), optional
    target_bounds : array-like of shape (2,), optional
        Public bounds (:func:`dpmarket.common.cape.functional_mechanism.scale_to_bounds`).
    floor : float, optional
        As :func:`fit_released`.

    Returns
    -------
    CapeFMResult

    Raises
    ------
    ValueError
        On invalid data or parameters.
    """
    del rng  # capeFM draws only noise
    data = prepare_sites(sites_data, task, feature_bounds, target_bounds)
    dim = data[0][0].shape[1]
    plan = plan_capefm(
        task,
        dim,
        [x.shape[0] for x, _ in data],
        epsilon,
        delta,
        colluders=colluders,
        calibration=calibration,
        include_constant=include_constant,
    )
    stats = [site_coefficients(plan, s, x, y) for s, (x, y) in enumerate(data)]
    e_hats = [site_noise_share(plan, s, noise) for s in range(plan.sites)]
    total = aggregate_noise_shares(
        [secure_aggregation_input(plan, s, e) for s, e in enumerate(e_hats)]
    )
    releases = [site_release(plan, s, stats[s], e_hats[s], total, noise) for s in range(plan.sites)]
    weight = plan.weights if plan.weighted else None
    e_shares = [
        zero_sum_correction(
            e, total, plan.sites, weight=None if weight is None else float(weight[s])
        )
        for s, e in enumerate(e_hats)
    ]
    residual = check_zero_sum(e_shares, e_hats, weight)
    fit = fit_released(plan, aggregate_releases(plan, releases), floor=floor)
    return CapeFMResult(fit=fit, plan=plan, zero_sum_residual=residual)


@dataclass(frozen=True)
class FitResult:
    """A baseline's model and how it was obtained.

    Attributes
    ----------
    method : str
    w : ndarray of shape (D,), float64
    details : dict
        Method-specific: noise scales, floor, clipped eigenvalues, privacy notes.
    """

    method: str
    w: NDArray[np.float64]
    details: dict[str, object] = field(default_factory=dict)


def _pool(
    data: Sequence[tuple[NDArray[np.float64], NDArray[np.float64]]],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    return np.vstack([x for x, _ in data]), np.concatenate([y for _, y in data])


def _release_details(rel: FMRelease) -> dict[str, object]:
    return {"scales": dict(rel.scales), "floor": rel.floor, "clipped": rel.clipped}


def run_baseline(
    method: Baseline,
    sites_data: Sequence[SiteData],
    task: Task,
    epsilon: float,
    delta: float,
    *,
    rng: np.random.Generator,
    noise: NoiseSource,
    calibration: Literal["analytic", "paper"] = "analytic",
    include_constant: bool = False,
    feature_bounds: ArrayLike | None = None,
    target_bounds: ArrayLike | None = None,
    floor: float | None = None,
    local_site: int = 0,
    reg: float = 1e-3,
) -> FitResult:
    """A baseline of Section 5.2 on the same sites' data.

    Parameters
    ----------
    method : {"nonprivate", "pooled", "conv", "local", "dpfm", "objpert"}
        ``"nonprivate"``: exact minimizer of the pooled (approximated) cost. ``"pooled"``:
        Algorithm 3 on the pooled data (``(epsilon, delta)``-DP for the pooled data set).
        ``"conv"``: each site releases its coefficients with its own Gaussian mechanism
        (``(epsilon, delta)``-DP alone, noise ``kappa Delta_j(N_s)``), the aggregator averages
        with ``w_s = N_s / N``: Section 4.4. ``"local"``: Algorithm 3 on site ``local_site``
        alone. ``"dpfm"``: Zhang et al.'s functional mechanism on the pooled data
        (``epsilon``-DP; ``delta`` unused). ``"objpert"``: Chaudhuri et al.'s objective
        perturbation on the pooled data (logistic regression only; ``epsilon``-DP).
    sites_data, task, epsilon, delta, feature_bounds, target_bounds, floor
        As :func:`run_capefm`.
    rng : numpy.random.Generator
        Used by ``"objpert"`` only (direction, then norm of its noise vector).
    noise : NoiseSource
        Draws: ``"pooled"`` / ``"local"``: orders 1, 2 (0 first if released); ``"conv"``: for each
        site in order, its orders; ``"dpfm"``: as :func:`dpmarket.common.cape.functional_mechanism.
        dpfm`; none for ``"nonprivate"`` and ``"objpert"``.
    calibration : {"analytic", "paper"}
        For ``"pooled"``, ``"conv"``, ``"local"``: analytic Gaussian calibration of the stacked
        orders (sound) or Section 5.2's per-order formula.
    include_constant : bool
    local_site : int
    reg : float
        ``"objpert"``'s regularization (public).

    Returns
    -------
    FitResult

    Raises
    ------
    ValueError
        On an unknown method, ``"objpert"`` with linear regression (see
        :func:`dpmarket.common.cape.functional_mechanism.objective_perturbation_logistic`), or
        invalid data.
    """
    data = prepare_sites(sites_data, task, feature_bounds, target_bounds)
    x_all, y_all = _pool(data)
    if method == "nonprivate":
        coeffs = fm_coefficients(x_all, y_all, task)
        rel = fit_coefficients(coeffs, noise_std2=0.0, floor=floor, scales={})
        return FitResult(method, rel.w, _release_details(rel))
    if method == "pooled":
        rel = functional_mechanism(
            x_all,
            y_all,
            task,
            epsilon,
            delta,
            noise,
            include_constant=include_constant,
            calibration=calibration,
            floor=floor,
        )
        return FitResult(method, rel.w, _release_details(rel))
    if method == "local":
        if not 0 <= local_site < len(data):
            raise ValueError(f"local_site must be in [0, {len(data) - 1}], got {local_site}")
        xs, ys = data[local_site]
        rel = functional_mechanism(
            xs,
            ys,
            task,
            epsilon,
            delta,
            noise,
            include_constant=include_constant,
            calibration=calibration,
            floor=floor,
        )
        return FitResult(method, rel.w, _release_details(rel))
    if method == "conv":
        return _conv(data, task, epsilon, delta, noise, calibration, include_constant, floor)
    if method == "dpfm":
        rel = dpfm(x_all, y_all, task, epsilon, noise, floor=floor)
        return FitResult(method, rel.w, _release_details(rel))
    if method == "objpert":
        if task != "logistic":
            raise ValueError(
                "objective perturbation (Chaudhuri et al. 2011) needs a loss with a bounded "
                "derivative: it has no guarantee for linear regression's square loss"
            )
        w = objective_perturbation_logistic(x_all, y_all, epsilon, reg=reg, rng=rng)
        return FitResult(method, w, {"reg": reg})
    raise ValueError(f"method must be one of {BASELINES}, got {method!r}")


def _conv(
    data: Sequence[tuple[NDArray[np.float64], NDArray[np.float64]]],
    task: Task,
    epsilon: float,
    delta: float,
    noise: NoiseSource,
    calibration: Literal["analytic", "paper"],
    include_constant: bool,
    floor: float | None,
) -> FitResult:
    eps = check_epsilon(epsilon)
    dl = check_delta(delta)
    orders = released_orders(task, include_constant=include_constant)
    if calibration == "analytic":
        kappa = gaussian_sigma(eps, dl, stacked_sensitivity(task, orders))
    elif calibration == "paper":
        kappa = math.sqrt(2.0 * math.log(1.25 / dl)) / eps
    else:
        raise ValueError(f"calibration must be 'analytic' or 'paper', got {calibration!r}")
    sizes = [x.shape[0] for x, _ in data]
    weights = remark3_weights(sizes)
    dim = data[0][0].shape[1]
    releases = []
    agg_var2 = 0.0
    for (x, y), n_s, w_s in zip(data, sizes, weights, strict=True):
        scales = order_scales(kappa, task, n_s, orders)
        f_s = pack_coefficients(fm_coefficients(x, y, task), orders)
        releases.append(f_s + draw_gaussian(entry_scales(scales, dim, orders), f_s.shape[0], noise))
        agg_var2 += float(w_s) ** 2 * scales[2] ** 2
    packed = cape_average(releases, weights)
    lam0 = math.log(2.0) if task == "logistic" else 0.0
    coeffs: FMCoefficients = unpack_coefficients(packed, dim, orders, lam0=lam0)
    rel = fit_coefficients(coeffs, noise_std2=math.sqrt(agg_var2), floor=floor, scales={})
    details = _release_details(rel)
    details["aggregator_std2"] = math.sqrt(agg_var2)
    details["kappa"] = kappa
    return FitResult("conv", rel.w, details)
