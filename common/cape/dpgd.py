"""Distributed differentially private gradient descent for the paper's 2-layer network.

Network (Section 5.1): ``y_hat = sigmoid(w2 . ReLU(W1 x + b1) + b2)`` with ``W1`` of shape ``(H,
D)``, trained on the average cross-entropy loss (equation (13)). Each iteration every site
computes the average of its records' per-example gradients, each clipped to L2 norm ``C``
(:func:`site_gradient`), and releases it with noise; the aggregator averages and takes a step:

``"cape"``
    one CAPE round per iteration (:mod:`dpmarket.common.cape.zero_sum`): the site releases ``g_s +
    e_s + g'_s`` with ``tau`` from :func:`dpmarket.common.cape.privacy.calibrate_tau`; the average
    carries noise of variance ``F`` times the pooled mechanism's at the same budget
    (:func:`dpmarket.common.cape.privacy.collusion_factor`, ``F = S (S + S_H) / (S_H (S + 1))``: the
    price of a guarantee against the aggregator's view of every site's release and ``S_C``
    colluders), against ``S`` times for ``"conv"``.
``"conv"``
    each site releases ``g_s + N(0, tau_conv^2)``, its own Gaussian mechanism.
``"nonprivate"``
    the exact (clipped) averages.

The paper gives neither the hidden width, the clipping norm, the step size nor the number of
iterations; they are parameters here (the experiments' values are in
``experiments/cape_experiments.py``). The paper states epsilon per iteration (with delta 0.01 per
iteration); :func:`total_epsilon` composes the iterations with a privacy-loss-distribution
accountant (``dpmarket.common.privacy.accounting.pld_epsilon``) to the total epsilon of the whole
training, and :func:`train_dpgd` can also be given that total budget directly.

Parameters are a flat vector ``theta`` of length ``P = H D + 2 H + 1``: ``W1`` (row-major),
``b1``, ``w2``, ``b2``.

References
----------
CAPE paper, Section 5.1 (architecture, cross-entropy (13), Figure 2); Abadi et al., "Deep
learning with differential privacy", CCS 2016 (per-example clipping).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.cape.privacy import (
    calibrate_tau,
    collusion_factor,
    default_colluders,
    exact_delta,
    gaussian_sigma,
    remark3_weights,
    theorem1_delta_from_loss,
)
from dpmarket.common.cape.zero_sum import (
    UniformNoisePlan,
    cape_average,
    cape_release,
    conv_release,
    draw_noise_share,
    secure_aggregation_input,
    sum_noise_shares,
    zero_sum_correction,
)
from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_delta, check_epsilon, check_matrix, check_positive_int

__all__ = [
    "NOISE_TAIL",
    "SCHEMES",
    "CapeTrainingPlan",
    "DPGDResult",
    "Scheme",
    "accuracy",
    "init_params",
    "iteration_loss_sigma",
    "loss",
    "n_params",
    "parameter_bound",
    "per_example_terms",
    "plan_training",
    "predict_proba",
    "site_gradient",
    "total_epsilon",
    "train_dpgd",
    "training_loss_sigma",
    "training_noise_share",
]

Scheme = Literal["cape", "conv", "nonprivate"]
SCHEMES: tuple[Scheme, ...] = ("cape", "conv", "nonprivate")


def n_params(dim: int, hidden: int) -> int:
    """``P = H D + 2 H + 1``."""
    return check_positive_int(hidden, "hidden") * (check_positive_int(dim, "dim") + 2) + 1


def _unpack(
    theta: NDArray[np.float64], dim: int, hidden: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    if theta.shape != (n_params(dim, hidden),):
        raise ValueError(f"theta must have shape ({n_params(dim, hidden)},), got {theta.shape}")
    hd = hidden * dim
    w1 = theta[:hd].reshape(hidden, dim)
    b1 = theta[hd : hd + hidden]
    w2 = theta[hd + hidden : hd + 2 * hidden]
    return w1, b1, w2, float(theta[-1])


def init_params(dim: int, hidden: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """He-normal ``W1`` (std ``sqrt(2 / D)``), ``w2`` (std ``sqrt(1 / H)``), zero biases.

    Draws ``H D`` then ``H`` standard normals from ``rng``.

    Returns
    -------
    ndarray of shape (P,), float64
    """
    d = check_positive_int(dim, "dim")
    h = check_positive_int(hidden, "hidden")
    w1 = rng.standard_normal((h, d)) * math.sqrt(2.0 / d)
    w2 = rng.standard_normal(h) * math.sqrt(1.0 / h)
    return np.concatenate([w1.ravel(), np.zeros(h), w2, np.zeros(1)])


def _forward(
    theta: NDArray[np.float64], x: NDArray[np.floating], hidden: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    w1, b1, w2, b2 = _unpack(theta, x.shape[1], hidden)
    z1 = x @ w1.T + b1
    a1 = np.maximum(z1, 0.0)
    z2 = a1 @ w2 + b2
    return z1, a1, z2


def predict_proba(theta: ArrayLike, X: ArrayLike, hidden: int) -> NDArray[np.float64]:
    """``P[y = 1 | x]`` for each row.

    Parameters
    ----------
    theta : array-like of shape (P,)
    X : array-like of shape (n, D)
    hidden : int

    Returns
    -------
    ndarray of shape (n,), float64, in ``[0, 1]``.
    """
    x = check_matrix(X, "X")
    _, _, z2 = _forward(np.asarray(theta, dtype=np.float64), x, hidden)
    out: NDArray[np.float64] = np.exp(-np.logaddexp(0.0, -z2))
    return out


def loss(theta: ArrayLike, X: ArrayLike, y: ArrayLike, hidden: int) -> float:
    """Average cross-entropy ``-y log y_hat - (1 - y) log(1 - y_hat)`` (equation (13))."""
    x = check_matrix(X, "X")
    _, _, z2 = _forward(np.asarray(theta, dtype=np.float64), x, hidden)
    yy = np.asarray(y, dtype=np.float64)
    return float(np.mean(np.logaddexp(0.0, z2) - yy * z2))


def accuracy(theta: ArrayLike, X: ArrayLike, y: ArrayLike, hidden: int) -> float:
    """Percent accuracy ``100 mean(round(y_hat) == y)`` (Section 5.1)."""
    p = predict_proba(theta, X, hidden)
    return float(100.0 * np.mean((p >= 0.5) == (np.asarray(y) == 1)))


#: Beyond this |z|, the sigmoid an owner's gradient uses is taken as exactly 0 or 1: below,
#: ``exp`` and the products after it would reach subnormal numbers (z in [-745, -708] gave
#: subnormal probabilities), whose arithmetic is slower, so that a gradient's time counted the
#: rows a curator's parameters put there. ``sigmoid(-230) = 1.3e-100``: what is dropped is below
#: 1e-100 of a gradient term, and every product of the kept values with the others (each 0 or
#: at least 1e-20 in magnitude) stays a normal number.
SIGMOID_Z_LIMIT = 230.0


def _sigmoid_normal(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """``1 / (1 + exp(-z))`` on ``z`` clipped to ``[-SIGMOID_Z_LIMIT, SIGMOID_Z_LIMIT]``, and 0
    below it: no subnormal number is computed (:data:`SIGMOID_Z_LIMIT`)."""
    clipped = np.clip(z, -SIGMOID_Z_LIMIT, SIGMOID_Z_LIMIT)
    out: NDArray[np.float64] = np.exp(-np.logaddexp(0.0, -clipped)) * (z >= -SIGMOID_Z_LIMIT)
    return out


def per_example_terms(
    theta: NDArray[np.float64], x: NDArray[np.floating], y: NDArray[np.float64], hidden: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Back-propagation per example, without materializing the ``(n, P)`` gradient matrix.

    Returns
    -------
    delta1 : ndarray of shape (n, H)
        ``dL/dz1 = (p - y) w2 * 1[z1 > 0]``; the gradient of ``W1`` is ``outer(delta1, x)``,
        of ``b1`` is ``delta1``.
    a1 : ndarray of shape (n, H)
        Hidden activations; the gradient of ``w2`` is ``(p - y) a1``.
    delta2 : ndarray of shape (n,)
        ``dL/dz2 = p - y``, also the gradient of ``b2``.
    norms : ndarray of shape (n,)
        Each example's full gradient norm: ``sqrt(||delta1||^2 (||x||^2 + 1) + delta2^2
        (||a1||^2 + 1))``.
    """
    # Parameters far from any training's (a curator's crafted ones) may overflow a term: the
    # terms are then inf or NaN, without a warning, and site_gradient counts that example as 0.
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        z1, a1, z2 = _forward(theta, x, hidden)
        _, _, w2, _ = _unpack(theta, x.shape[1], hidden)
        delta2 = _sigmoid_normal(z2) - y
        delta1 = delta2[:, None] * w2[None, :] * (z1 > 0.0)
        sq_x = np.einsum("ij,ij->i", x, x)
        sq_d1 = np.einsum("ij,ij->i", delta1, delta1)
        sq_a1 = np.einsum("ij,ij->i", a1, a1)
        norms = np.sqrt(sq_d1 * (sq_x + 1.0) + delta2 * delta2 * (sq_a1 + 1.0))
    return delta1, a1, delta2, norms


def site_gradient(
    theta: ArrayLike, X_s: ArrayLike, y_s: ArrayLike, *, clip: float, hidden: int
) -> NDArray[np.float64]:
    """Site side: the average of the per-example gradients, each clipped to L2 norm ``clip``; an
    example whose gradient is not finite counts as 0.

    Parameters
    ----------
    theta : array-like of shape (P,)
        Any values (a curator chooses them; an owner bounds them first,
        :func:`parameter_bound`, but the result is finite whatever they are).
    X_s : array-like of shape (N_s, D)
    y_s : array-like of shape (N_s,)
        Labels in {0, 1}.
    clip : float
        ``C > 0``.
    hidden : int

    Returns
    -------
    ndarray of shape (P,), float64
        Finite, of L2 norm ``<= C``, for every ``theta``. L2 sensitivity ``2 C / N_s`` under
        replacing one record.

    Raises
    ------
    ValueError
        On shapes, labels not in {0, 1}, or ``clip <= 0`` (public checks, or checks an owner's
        records pass by construction: never on ``theta``'s values).

    Notes
    -----
    The computation is total: at parameters that overflow a term of some example (its
    pre-activation, its gradient or its gradient's norm is inf or NaN: parameters near the
    largest float, as a curator may craft), that example's clipped gradient is taken to be 0,
    with the same arithmetic on every row (no branch and no error depends on which rows overflow).
    Each example's contribution is then a function ``g~(theta, x_i, y_i)`` of its own record with
    ``||g~|| <= C`` (``C`` after clipping, or 0), so replacing one record moves the average by
    ``(g~_i - g~'_i) / N_s``, of norm at most ``2 C / N_s``: the sensitivity is the clipped one's
    whatever ``theta`` and whichever examples are zeroed. The sum of ``N_s`` terms of norm
    ``<= C / N_s`` is finite. Without this, the one example that overflows would make the whole
    average non-finite: a release, or a refusal, that tells whether any record crosses a
    threshold the parameters encode.
    """
    x = check_matrix(X_s, "X_s")
    yy = np.asarray(y_s, dtype=np.float64)
    if yy.shape != (x.shape[0],):
        raise ValueError(f"y_s must have shape ({x.shape[0]},), got {yy.shape}")
    if not np.isin(yy, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    c = check_epsilon(clip, "clip")
    th = np.asarray(theta, dtype=np.float64)
    delta1, a1, delta2, norms = per_example_terms(th, x, yy, hidden)
    finite = (
        np.isfinite(norms)
        & np.isfinite(delta2)
        & np.isfinite(delta1).all(axis=1)
        & np.isfinite(a1).all(axis=1)
    )
    with np.errstate(under="ignore"):
        scale = np.where(finite, np.minimum(1.0, c / np.maximum(norms, 1e-300)), 0.0)
        scale /= x.shape[0]
        d1 = np.where(finite[:, None], delta1, 0.0) * scale[:, None]
        d2 = np.where(finite, delta2, 0.0) * scale
        a1 = np.where(finite[:, None], a1, 0.0)
        return np.concatenate([(d1.T @ x).ravel(), d1.sum(axis=0), a1.T @ d2, [d2.sum()]])


#: Standard deviations within which every Gaussian draw of an honest training lies: a draw beyond
#: 40 standard deviations has probability below ``1e-340`` (below the smallest double).
NOISE_TAIL = 40.0


def parameter_bound(
    *, clip: float, learning_rate: float, iteration: int, noise_scale: float
) -> float:
    """The largest ``|theta_j|`` an honest training can reach after ``iteration`` steps.

    Parameters
    ----------
    clip : float
        ``C``.
    learning_rate : float
        ``eta``.
    iteration : int
        ``t >= 0``: the steps taken before the parameters of iteration ``t``.
    noise_scale : float
        The largest ``tau_s`` (a site's noise std per coordinate and iteration) of any plan of
        the training's first ``t`` iterations.

    Returns
    -------
    float
        ``B_t = z sqrt(2) + eta t (C + 3 z tau_max)`` with ``z =`` :data:`NOISE_TAIL`.

    Notes
    -----
    Honest parameters (:class:`dpmarket.curator.cape.CapeTrainingJob`) start at
    :func:`init_params`: He-normal entries of std ``sqrt(2 / D) <= sqrt(2)`` and
    ``sqrt(1 / H) <= 1``, zero biases, so ``|theta_0,j| <= z sqrt(2)`` unless a draw lies beyond
    ``z`` standard deviations. Each step subtracts ``eta`` times a convex combination (Remark 3's
    weights, renormalised over the sites that released) of releases ``g_s + e_s + g'_s``:
    ``|g_s,j| <= ||g_s|| <= C`` (:func:`site_gradient`); ``e_s = e_hat_s - total / (S w_s)``
    with ``total = sum_r w_r e_hat_r`` and ``w_r tau_r = (N_r / N) sqrt(F) 2 C / (N_r r)`` the same
    for every site, so ``|total_j| / (S w_s) <= z sum_r w_r tau_r / (S w_s) = z tau_s`` (with
    equal sizes, ``w_r = 1`` and the same); ``|e_hat_s,j| <= z tau_s`` and ``|g'_s,j| <= z tau_s /
    sqrt(S)``. So each coordinate of a step is at most ``C + 3 z tau_max`` and ``|theta_t,j| <=
    B_t``. The bound fails only when a Gaussian draw of the training lies beyond ``z = 40``
    standard deviations (probability below ``1e-340`` per draw).
    """
    t = int(iteration)
    if t < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    z = NOISE_TAIL
    return z * math.sqrt(2.0) + float(learning_rate) * t * (
        float(clip) + 3.0 * z * float(noise_scale)
    )


def total_epsilon(loss_sigma: float, iterations: int, delta_total: float) -> float:
    """Total epsilon at ``delta_total`` of ``iterations`` Gaussian releases of ratio ``loss_sigma``.

    Composes ``iterations`` runs of a Gaussian mechanism whose sensitivity-to-noise ratio (the
    standard deviation of its privacy loss) is ``loss_sigma`` with
    :func:`dpmarket.common.privacy.accounting.pld_epsilon` (``PrivacyEvent("gaussian", sensitivity=
    loss_sigma, scale=1, count=iterations)``).

    Parameters
    ----------
    loss_sigma : float
        ``> 0``: ``sigma_z`` for CAPE (:func:`dpmarket.common.cape.privacy.privacy_loss_sigma`),
        ``Delta / tau`` for a plain Gaussian release.
    iterations : int
        ``>= 1``.
    delta_total : float
        In ``(0, 1)``.

    Returns
    -------
    float
        An upper bound (the PLD is pessimistic); the exact value is that of one Gaussian
        mechanism of ratio ``loss_sigma sqrt(iterations)`` (Gaussian losses add up).
    """
    r = check_epsilon(loss_sigma, "loss_sigma")
    t = check_positive_int(iterations, "iterations")
    dt = check_delta(delta_total, "delta_total")
    # epsilon of one run at a delta it meets exactly, for the event's consistency check
    eps1 = _epsilon_of_ratio(r, 1e-6)
    event = PrivacyEvent(
        "gaussian",
        epsilon=eps1,
        delta=exact_delta(eps1, 0.5 * r * r, r),
        sensitivity=r,
        scale=1.0,
        count=t,
    )
    return pld_epsilon([event], dt)


def _epsilon_of_ratio(ratio: float, delta: float) -> float:
    """Exact epsilon at ``delta`` of a Gaussian mechanism of ratio ``ratio`` (bisection)."""
    from scipy.optimize import brentq

    mu = 0.5 * ratio * ratio

    def f(eps: float) -> float:
        return exact_delta(eps, mu, ratio) - delta

    if f(0.0) <= 0.0:
        return 1e-12
    hi = 1.0
    while f(hi) > 0.0:
        hi *= 2.0
    return float(brentq(f, 0.0, hi, xtol=1e-13)) * (1.0 + 1e-9) + 1e-12


@dataclass(frozen=True)
class DPGDResult:
    """A trained network and its privacy.

    Attributes
    ----------
    theta : ndarray of shape (P,)
    dim, hidden : int
    scheme : {"cape", "conv", "nonprivate"}
    site_noise : tuple of float
        Per site, the standard deviation ``tau_s`` of the site's noise per iteration (CAPE:
        ``e_hat_s``; conv: its Gaussian mechanism); empty for non-private.
    aggregator_std : float
        Standard deviation of the noise per coordinate of the averaged gradient.
    loss_sigma : float
        Per-iteration privacy-loss standard deviation of one site (its sensitivity-to-noise
        ratio; CAPE's includes the collusion factor); 0 for non-private.
    epsilon_per_iteration, delta_per_iteration : float or None
        The per-iteration target, when training was calibrated per iteration.
    epsilon_total : float
        Over all iterations at ``delta_total`` (PLD accountant); ``inf`` for non-private.
    delta_total : float
    history : ndarray of shape (iterations + 1,)
        Pooled training loss before each step and after the last.
    """

    theta: NDArray[np.float64]
    dim: int
    hidden: int
    scheme: Scheme
    site_noise: tuple[float, ...]
    aggregator_std: float
    loss_sigma: float
    epsilon_per_iteration: float | None
    delta_per_iteration: float | None
    epsilon_total: float
    delta_total: float
    history: NDArray[np.float64]


def iteration_loss_sigma(
    *,
    iterations: int,
    epsilon_total: float | None = None,
    delta_total: float = 1e-5,
    epsilon_per_iteration: float | None = None,
    delta_per_iteration: float | None = None,
    scheme: Literal["cape", "conv"] = "conv",
    sites: int = 2,
    colluders: int | None = None,
) -> float:
    """Per-iteration privacy-loss standard deviation ``r`` of one site for a budget.

    Total budget (``epsilon_total``): ``T`` Gaussian releases of ratio ``r`` compose exactly to
    one of ratio ``r sqrt(T)`` (Gaussian losses add up), so ``r = 1 / (gaussian_sigma(
    epsilon_total, delta_total) sqrt(T))``, whatever the scheme. Per-iteration budget (the
    paper's): conv ``r = 1 / gaussian_sigma(eps, delta)``; CAPE ``r = sqrt(F) / calibrate_tau(
    eps, delta, sites=S, colluders=S_C, sensitivity=1)``.

    Parameters
    ----------
    iterations : int
    epsilon_total : float, optional
        Exclusive with the per-iteration pair.
    delta_total : float, default 1e-5
    epsilon_per_iteration, delta_per_iteration : float, optional
    scheme : {"cape", "conv"}
    sites : int
    colluders : int, optional

    Returns
    -------
    float
        ``r``; the site noise is ``tau_s = sqrt(F) Delta_s / r`` (CAPE) or ``Delta_s / r`` (conv)
        with ``Delta_s = 2 C / N_s``.

    Raises
    ------
    ValueError
        If both or neither budget is given, or on out-of-range values.
    """
    t = check_positive_int(iterations, "iterations")
    per_iteration = epsilon_per_iteration is not None or delta_per_iteration is not None
    if (epsilon_total is None) == (not per_iteration):
        raise ValueError(
            "give either epsilon_total or both epsilon_per_iteration and delta_per_iteration"
        )
    if epsilon_total is not None:
        sigma = gaussian_sigma(epsilon_total, check_delta(delta_total, "delta_total"), 1.0)
        return 1.0 / (sigma * math.sqrt(t))
    if epsilon_per_iteration is None or delta_per_iteration is None:
        raise ValueError("the per-iteration budget needs both epsilon and delta")
    eps = check_epsilon(epsilon_per_iteration, "epsilon_per_iteration")
    dl = check_delta(delta_per_iteration, "delta_per_iteration")
    if scheme == "conv":
        return 1.0 / gaussian_sigma(eps, dl, 1.0)
    kappa = calibrate_tau(eps, dl, sites=sites, colluders=colluders, sensitivity=1.0)
    return math.sqrt(collusion_factor(sites, colluders)) / kappa


def _site_taus(
    sizes: Sequence[int], clip: float, loss_sigma: float, inflate: float
) -> tuple[float, ...]:
    """``tau_s = inflate (2 C / N_s) / r`` per site (``inflate = sqrt(F)`` for CAPE, 1 for conv)."""
    return tuple(inflate * (2.0 * clip / n) / loss_sigma for n in sizes)


@functools.lru_cache(maxsize=256)
def training_loss_sigma(epsilon: float, delta: float, iterations: int) -> tuple[float, float]:
    """Per-iteration loss ratio ``r`` of a training whose total budget is ``(epsilon, delta)``,
    and the total epsilon the PLD accountant states for it.

    ``r`` starts from the exact composition (:func:`iteration_loss_sigma`: ``T`` Gaussian losses
    of ratio ``r`` are one of ratio ``r sqrt(T)``) and shrinks until :func:`total_epsilon` (the
    privacy-loss-distribution accountant, pessimistic by about 1e-5 relative) states at most
    ``epsilon``: the charged total is then never above the request.

    Parameters
    ----------
    epsilon : float
        Total epsilon over all iterations, ``> 0``.
    delta : float
        Total delta, in ``(0, 1)``.
    iterations : int
        ``T >= 1``.

    Returns
    -------
    loss_sigma : float
        ``r``.
    epsilon_total : float
        ``total_epsilon(r, T, delta) <= epsilon``.

    Raises
    ------
    ValueError
        On out-of-range parameters.
    """
    eps = check_epsilon(epsilon)
    dl = check_delta(delta)
    t = check_positive_int(iterations, "iterations")
    r = iteration_loss_sigma(iterations=t, epsilon_total=eps, delta_total=dl)
    for _ in range(20):
        stated = total_epsilon(r, t, dl)
        if stated <= eps:
            return r, stated
        r *= eps / stated * (1.0 - 1e-9)
    raise ValueError(f"no noise found whose total epsilon the accountant states <= {eps}")


@dataclass(frozen=True)
class CapeTrainingPlan(UniformNoisePlan):
    """Public parameters of CAPE gradient descent from one iteration on (one noise round).

    The shape of every CAPE plan (:class:`~dpmarket.common.cape.zero_sum.CapePlan`), with one
    noise scale per site (:class:`~dpmarket.common.cape.zero_sum.UniformNoisePlan`, whose
    ``aggregator_std`` is here the std of one iteration's averaged gradient); its noise round
    covers every iteration from ``first_iteration`` on (:attr:`round_length`).

    Each iteration ``t`` every site releases its clipped-gradient average (L2 sensitivity
    ``Delta_s = 2 C / N_s``, :func:`site_gradient`) plus ``e_s,t + g_s,t`` with ``e_hat_s,t ~
    N(0, tau_s^2)`` and ``g_s,t ~ N(0, tau_s^2 / S)``, ``tau_s = sqrt(F) Delta_s / r``
    (Algorithm 2 per iteration, Remark 3's weights): every iteration is a Gaussian mechanism of
    loss ratio ``r`` against the aggregator and ``S_C`` colluders, whatever ``S``, and the ``T``
    iterations compose to the ratio ``r sqrt(T)``.

    Attributes
    ----------
    dim, hidden : int
        ``D``, ``H``.
    clip : float
        ``C``.
    iterations : int
        ``T`` of the whole training.
    first_iteration : int
        The first iteration this plan (its noise round) covers; it covers ``first_iteration ..
        T - 1``.
    sizes : tuple of int
        ``N_s`` of the plan's sites, in site order.
    weights : ndarray of shape (S,)
        ``w_s = N_s / N`` (Remark 3).
    weighted : bool
    colluders : int
        ``S_C``, fixed for the whole training.
    epsilon : float
        Total epsilon of the whole training at ``delta`` by the PLD accountant
        (:func:`training_loss_sigma`): what every site is charged.
    epsilon_requested : float
    delta : float
        Total delta.
    loss_sigma : float
        ``r``: per-iteration privacy-loss standard deviation of one site.
    site_scales : tuple of float
        ``tau_s`` per site (per coordinate and iteration).
    delta_exact : float
        Exact delta at ``epsilon`` of the composed loss (ratio ``r sqrt(T)``).
    delta_theorem1 : float or None
        Theorem 1's tail bound at ``epsilon`` of the composed Gaussian loss (``None`` where it
        does not apply).
    """

    dim: int
    hidden: int
    clip: float
    iterations: int
    first_iteration: int
    epsilon_requested: float
    loss_sigma: float

    @property
    def size(self) -> int:
        """``P``: the parameters, the length of one iteration's release."""
        return n_params(self.dim, self.hidden)

    @property
    def round_iterations(self) -> int:
        """Iterations the plan's noise round covers: ``T - first_iteration``."""
        return self.iterations - self.first_iteration

    @property
    def round_length(self) -> int:
        """Length of the noise round's vector: ``(T - first_iteration) P``."""
        return self.round_iterations * self.size

    @property
    def sigma_z(self) -> float:
        """Standard deviation of the whole training's privacy loss: ``r sqrt(T)``."""
        return self.loss_sigma * math.sqrt(self.iterations)

    def noise_share(self, site: int, noise: NoiseSource) -> NDArray[np.float64]:
        """:func:`training_noise_share`: shape ``(T - first_iteration, P)``, a row per
        iteration the plan covers."""
        return training_noise_share(self, site, noise)

    def baseline_stds(self) -> dict[str, float]:
        """Noise std per coordinate of one iteration's gradient for the baselines at the same
        per-iteration loss ratio ``r`` (so the same total budget): ``pooled`` (one Gaussian
        mechanism on the pooled gradient, ``(2 C / N) / r``) and ``conv`` (each site's own
        mechanism ``(2 C / N_s) / r``, averaged with ``w_s``)."""
        conv = _site_taus(self.sizes, self.clip, self.loss_sigma, 1.0)
        pairs = zip(self.weights.tolist(), conv, strict=True)
        return {
            "pooled": 2.0 * self.clip / sum(self.sizes) / self.loss_sigma,
            "conv": math.sqrt(sum(w * w * t * t for w, t in pairs)),
        }


def plan_training(
    *,
    dim: int,
    hidden: int,
    clip: float,
    iterations: int,
    sizes: Sequence[int],
    epsilon: float,
    delta: float,
    colluders: int | None = None,
    first_iteration: int = 0,
) -> CapeTrainingPlan:
    """Calibrate CAPE gradient descent from public values.

    Parameters
    ----------
    dim, hidden : int
        ``D``, ``H``.
    clip : float
        Per-example clipping norm ``C > 0``.
    iterations : int
        ``T >= 1``.
    sizes : sequence of int, shape (S,)
        ``N_s`` per site, ``S >= 2``.
    epsilon, delta : float
        Each site's total budget over all ``T`` iterations.
    colluders : int, optional
        ``S_C``; default ``ceil(S / 3) - 1``. Keep it fixed when re-planning a training with
        fewer sites, so that every iteration has the same guarantee.
    first_iteration : int, default 0
        In ``[0, T)``.

    Returns
    -------
    CapeTrainingPlan

    Raises
    ------
    ValueError
        On invalid parameters, fewer than 2 sites or ``S_C > S - 1``.

    Notes
    -----
    The loss ratio ``r`` depends on ``(epsilon, delta, T)`` only, so re-planning with other
    sites keeps it; ``tau_s = sqrt(F(S, S_C)) (2 C / N_s) / r`` follows the sites.
    """
    d = check_positive_int(dim, "dim")
    h = check_positive_int(hidden, "hidden")
    c = check_epsilon(clip, "clip")
    t = check_positive_int(iterations, "iterations")
    n = tuple(check_positive_int(v, f"sizes[{j}]") for j, v in enumerate(sizes))
    if len(n) < 2:
        raise ValueError(f"distributed training needs at least 2 sites, got {len(n)}")
    if isinstance(first_iteration, bool) or not 0 <= int(first_iteration) < t:
        raise ValueError(f"first_iteration must lie in [0, {t}), got {first_iteration}")
    sc = default_colluders(len(n)) if colluders is None else colluders
    factor = collusion_factor(len(n), sc)
    r, stated = training_loss_sigma(float(epsilon), float(delta), t)
    total = r * math.sqrt(t)
    return CapeTrainingPlan(
        dim=d,
        hidden=h,
        clip=c,
        iterations=t,
        first_iteration=int(first_iteration),
        sizes=n,
        weights=remark3_weights(n),
        weighted=len(set(n)) > 1,
        colluders=int(sc),
        epsilon=stated,
        epsilon_requested=float(epsilon),
        delta=float(delta),
        loss_sigma=r,
        site_scales=_site_taus(n, c, r, math.sqrt(factor)),
        delta_exact=exact_delta(stated, 0.5 * total * total, total),
        delta_theorem1=(
            theorem1_delta_from_loss(stated, 0.5 * total * total, total)
            if stated > 0.5 * total * total
            else None
        ),
    )


def training_noise_share(
    plan: CapeTrainingPlan, site: int, noise: NoiseSource
) -> NDArray[np.float64]:
    """Site side, Algorithm 1 step 2 for every iteration of the plan at once: ``e_hat_s,t ~
    N(0, tau_s^2)``, one ``noise.gaussian`` call.

    Returns
    -------
    ndarray of shape (T - first_iteration, P), float64
        Row ``k`` is iteration ``first_iteration + k``. Its (weighted) flattening is the site's
        input of the plan's secure-aggregation round.
    """
    draws = draw_noise_share(plan.site_scales[site], plan.round_length, noise)
    return draws.reshape(plan.round_iterations, plan.size)


def _checked_sites(
    sites_data: Sequence[tuple[ArrayLike, ArrayLike]],
) -> list[tuple[NDArray[np.floating], NDArray[np.float64]]]:
    """Each site's ``(X_s, y_s)`` checked (finite ``X_s``, ``y_s`` in {0, 1}), at least 2 sites.

    Raises
    ------
    ValueError
        Naming the site whose data is malformed, or when fewer than 2 sites are given.
    """
    data = []
    for s, (x, y) in enumerate(sites_data):
        xs = check_matrix(x, f"site {s} X")
        ys = np.asarray(y, dtype=np.float64)
        if ys.shape != (xs.shape[0],) or not np.isin(ys, (0.0, 1.0)).all():
            raise ValueError(f"site {s}: y must have shape ({xs.shape[0]},) with labels 0 or 1")
        data.append((xs, ys))
    if len(data) < 2:
        raise ValueError(f"distributed training needs at least 2 sites, got {len(data)}")
    return data


def _aggregated_step(
    scheme: Scheme,
    grads: Sequence[NDArray[np.float64]],
    taus: Sequence[float],
    weights: NDArray[np.float64] | None,
    noise: NoiseSource,
) -> NDArray[np.float64]:
    """One iteration's aggregated gradient of shape ``(P,)`` under ``scheme`` (see
    :func:`train_dpgd`'s ``noise`` for the order of the draws).

    ``weights`` are the Remark 3 weights when the sites' sizes differ, ``None`` for the plain
    average (and the unweighted zero-sum round).
    """
    if scheme == "nonprivate":
        return cape_average(grads, weights)
    if scheme == "conv":
        return cape_average(
            [conv_release(g, t, noise) for g, t in zip(grads, taus, strict=True)], weights
        )
    n_sites = len(grads)
    p = grads[0].shape[0]
    site_weights: list[float | None] = (
        [None] * n_sites if weights is None else [float(w) for w in weights]
    )
    e_hats = [draw_noise_share(t, p, noise) for t in taus]
    total = sum_noise_shares(
        [secure_aggregation_input(e, w) for e, w in zip(e_hats, site_weights, strict=True)]
    )
    releases = []
    for g, e_hat, t, w in zip(grads, e_hats, taus, site_weights, strict=True):
        e_s = zero_sum_correction(e_hat, total, n_sites, weight=w)
        releases.append(cape_release(g, e_s, t / math.sqrt(n_sites), noise))
    return cape_average(releases, weights)


def train_dpgd(
    sites_data: Sequence[tuple[ArrayLike, ArrayLike]],
    *,
    scheme: Scheme,
    iterations: int,
    learning_rate: float,
    clip: float,
    hidden: int,
    rng: np.random.Generator,
    noise: NoiseSource,
    epsilon_total: float | None = None,
    delta_total: float = 1e-5,
    epsilon_per_iteration: float | None = None,
    delta_per_iteration: float | None = None,
    colluders: int | None = None,
    theta0: ArrayLike | None = None,
) -> DPGDResult:
    """Distributed (DP) gradient descent across sites, in one process.

    Parameters
    ----------
    sites_data : sequence of (X_s, y_s)
        ``X_s`` of shape ``(N_s, D)`` (any finite values: the clipping bounds the sensitivity),
        ``y_s`` of shape ``(N_s,)`` in {0, 1}.
    scheme : {"cape", "conv", "nonprivate"}
    iterations : int
        ``T >= 1`` full-batch steps.
    learning_rate : float
        Step size ``> 0``.
    clip : float
        Per-example clipping norm ``C > 0``.
    hidden : int
        ``H``.
    rng : numpy.random.Generator
        The initial parameters (:func:`init_params`) unless ``theta0`` is given.
    noise : NoiseSource
        Per iteration, in order: CAPE: ``e_hat_s`` for each site in order, then ``g_s`` for each
        site in order; conv: each site's noise in order; none for non-private.
    epsilon_total : float, optional
        Each site's budget for the whole training at ``delta_total`` (beyond the paper; see
        :func:`iteration_loss_sigma`). Exclusive with the per-iteration pair.
    delta_total : float, default 1e-5
        Delta of the total budget, and the delta at which the total epsilon is reported.
    epsilon_per_iteration, delta_per_iteration : float, optional
        Each site's per-iteration target, as the paper states it (its delta is 0.01).
    colluders : int, optional
        ``S_C`` (CAPE); default ``ceil(S / 3) - 1``.
    theta0 : array-like of shape (P,), optional

    Returns
    -------
    DPGDResult

    Raises
    ------
    ValueError
        On invalid parameters or data, or a private scheme without a budget.

    Notes
    -----
    Sensitivity: the site's averaged clipped gradient changes by at most ``2 C / N_s`` in L2 when
    one of its records is replaced (:func:`site_gradient`). CAPE's site noise is ``tau_s =
    sqrt(F) (2 C / N_s) / r`` and conv's ``(2 C / N_s) / r`` for the same per-iteration loss
    ratio ``r``: both give every site the same guarantee, CAPE against ``S_C`` colluders.
    Weights: the aggregator averages with ``w_s = N_s / N`` (Remark 3; the zero-sum round is
    weighted when the sizes differ).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    data = _checked_sites(sites_data)
    n_sites = len(data)
    dim = data[0][0].shape[1]
    t_max = check_positive_int(iterations, "iterations")
    lr = check_epsilon(learning_rate, "learning_rate")
    c = check_epsilon(clip, "clip")
    h = check_positive_int(hidden, "hidden")
    dt = check_delta(delta_total, "delta_total")
    sizes = [x.shape[0] for x, _ in data]
    weights = remark3_weights(sizes)
    weighted = len(set(sizes)) > 1
    taus: tuple[float, ...] = ()
    loss_sigma, agg_std, eps_total = 0.0, 0.0, math.inf
    if scheme != "nonprivate":
        sc = default_colluders(n_sites) if colluders is None else colluders
        loss_sigma = iteration_loss_sigma(
            iterations=t_max,
            epsilon_total=epsilon_total,
            delta_total=dt,
            epsilon_per_iteration=epsilon_per_iteration,
            delta_per_iteration=delta_per_iteration,
            scheme=scheme,
            sites=n_sites,
            colluders=sc,
        )
        inflate = math.sqrt(collusion_factor(n_sites, sc)) if scheme == "cape" else 1.0
        taus = _site_taus(sizes, c, loss_sigma, inflate)
        share = 1.0 / n_sites if scheme == "cape" else 1.0  # CAPE keeps only g_s ~ tau^2 / S
        pairs = zip(weights.tolist(), taus, strict=True)
        agg_std = math.sqrt(sum(w * w * t * t * share for w, t in pairs))
        eps_total = total_epsilon(loss_sigma, t_max, dt)

    p = n_params(dim, h)
    theta = init_params(dim, h, rng) if theta0 is None else np.asarray(theta0, dtype=np.float64)
    if theta.shape != (p,):
        raise ValueError(f"theta0 must have shape ({p},), got {theta.shape}")
    x_all = np.vstack([x for x, _ in data])
    y_all = np.concatenate([y for _, y in data])
    history = np.empty(t_max + 1)
    for it in range(t_max):
        history[it] = loss(theta, x_all, y_all, h)
        grads = [site_gradient(theta, x, y, clip=c, hidden=h) for x, y in data]
        step = _aggregated_step(scheme, grads, taus, weights if weighted else None, noise)
        theta = theta - lr * step
    history[t_max] = loss(theta, x_all, y_all, h)
    return DPGDResult(
        theta=theta,
        dim=dim,
        hidden=h,
        scheme=scheme,
        site_noise=taus,
        aggregator_std=agg_std,
        loss_sigma=loss_sigma,
        epsilon_per_iteration=epsilon_per_iteration,
        delta_per_iteration=delta_per_iteration,
        epsilon_total=eps_total,
        delta_total=dt,
        history=history,
    )
