"""Calibrating the paper's private summarization (Algorithm 3) to a target total epsilon.

:func:`paper_mode_events` lists the privacy events a completed ``method="private"`` session charges
to its ledgers; :func:`calibrate_paper_mode` scales the configuration's per-iteration epsilons so
that the composed epsilon of each party equals a target, e.g. to compare methods at equal privacy.
:func:`rounds_mode_events` and :func:`calibrate_rounds_mode` do the same for ``method="rounds"``;
:func:`rounds_auction` and :func:`rounds_tree_sigma` are the session's own calibrations
(PrivAuction's parameters and the binary tree's noise), derived from the configuration alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

from dpmarket.common.privacy.accounting import (
    PrivacyEvent,
    analytic_gaussian_sigma,
    kairouz_epsilon_delta,
    load_pld_library,
    pld_epsilon,
)
from dpmarket.common.summarization.auction import AuctionParams, auction_events, auction_parameters
from dpmarket.common.summarization.candidates import H1_NORM_BOUND, validation_embedding_sensitivity
from dpmarket.common.summarization.continual import TreePrefixSum, tree_levels
from dpmarket.common.summarization.methods import PrivateConfig, RoundsConfig, SummarizationConfig
from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

__all__ = [
    "CALIBRATION_RTOL",
    "MWEM_SENSITIVITY",
    "TREE_INCREMENT_SENSITIVITY",
    "calibrate_paper_mode",
    "calibrate_rounds_mode",
    "gaussian_epsilon",
    "paper_auction",
    "paper_mode_events",
    "rounds_auction",
    "rounds_mode_events",
    "rounds_tree_sigma",
    "session_auction",
]

#: Sensitivity ``Delta`` of MWEM's score and measurement (``dpmarket.common.summarization.mwem``):
#: every coordinate of the quantized sum moves by at most 2 when one point of the set is replaced.
MWEM_SENSITIVITY = 2.0
#: Calibrated epsilons lie in ``[(1 - CALIBRATION_RTOL) * target, target]``.
CALIBRATION_RTOL = 1e-3
#: L2 sensitivity of one increment of the summary tree: replacing one acquired point changes its
#: h1 vector by at most ``2 sqrt(2)`` (``||h1(x)||_2 <= sqrt(2)``).
TREE_INCREMENT_SENSITIVITY = TreePrefixSum.increment_sensitivity(H1_NORM_BOUND)
# The search scales the configuration's epsilons by factors within [1/_MAX_FACTOR, _MAX_FACTOR].
_MAX_FACTOR = 1e12
_MAX_STEPS = 200

Party = Literal["validation", "owners", "public"]
CalibrationMethod = Literal["pld", "theorem7"]


def _h2_events(epsilon: float, iterations: int) -> list[PrivacyEvent]:
    """``iterations`` MWEM iterations at ``epsilon``: selections and Laplace measurements."""
    return [
        PrivacyEvent("exponential", epsilon, iterations, MWEM_SENSITIVITY),
        PrivacyEvent(
            "laplace", epsilon, iterations, MWEM_SENSITIVITY, scale=MWEM_SENSITIVITY / epsilon
        ),
    ]


def _check_seed_set_size(seed_set_size: int) -> int:
    if isinstance(seed_set_size, bool) or int(seed_set_size) != seed_set_size or seed_set_size < 0:
        raise ValueError(f"seed_set_size must be an integer >= 0, got {seed_set_size}")
    return int(seed_set_size)


def paper_mode_events(
    config: PrivateConfig, n_owners: int, *, seed_set_size: int
) -> dict[Party, list[PrivacyEvent]]:
    """The privacy events a completed private session of ``config`` charges, per party.

    Parameters
    ----------
    config : PrivateConfig
        The private method's configuration (Algorithm 3).
    n_owners : int
        ``K``, the number of owners the session is opened with (``auction_parameters`` uses it),
        ``>= 1``.
    seed_set_size : int
        Number of points in the public seed set ``D_init``, ``>= 0``.

    Returns
    -------
    dict
        ``{"validation": [...], "owners": [...], "public": [...]}``, each a list of
        :class:`~dpmarket.common.privacy.accounting.PrivacyEvent` whose repeat counts add up to what
        the session charges (it charges one pair of events per h2 release; these lists merge the
        identical ones, which every accountant of :mod:`dpmarket.common.privacy.accounting` treats
        alike):

        * ``"validation"``: ``T_init`` exponential-mechanism selections and ``T_init`` Laplace
          measurements (sensitivity 2, scale ``2 / epsilon_validation``) at
          ``config.epsilon_validation`` (Algorithm 3, step 3).
        * ``"owners"``: PrivAuction's ``tau`` events at ``eps_auc`` (pure, or approximate with
          delta ``1 - exp(-eps_auc)`` for ``auction="paper"``: :func:`auction_events`), with
          ``(eps_auc, tau) = auction_parameters(epsilon_auction, delta_owners, K)`` (Theorem 6),
          then ``(p - 1) T_subs`` selections and as many Laplace measurements at
          ``config.epsilon_per_later_iteration`` (the summary embeddings of rounds 2..p); the
          h2 events are absent when ``p = 1``.
        * ``"public"``: round 1's release of the seed set, ``T_init`` selections and
          measurements at ``epsilon_first_epoch`` (recorded, never counted); empty when
          ``seed_set_size == 0``.

    Raises
    ------
    ValueError
        If ``n_owners`` is not an integer ``>= 1`` or ``seed_set_size`` is not an integer
        ``>= 0``.

    Notes
    -----
    This mirrors ``dpmarket.curator.summarization.selection.Selection.rounds``: in round ``l``
    the summary holds ``q = seed_set_size + l - 1`` points. Round 1 releases the seed set only
    (party ``"public"``) or, when ``q = 0``, releases nothing; every later round has ``q >= 1`` and
    releases an h2 embedding of a set holding owners' points, charged to ``"owners"`` at
    ``epsilon_summary / sqrt(p T_subs)`` per iteration. So the owners' charges do not depend on the
    seed set's size. PrivAuction is charged once, in round 1, over ``tau`` bad iterations (Appendix
    D, proof of Theorem 6). The counts assume a session that runs all ``p`` rounds with at least one
    bid in round 1; an aborted session charges a prefix of these events.
    Neighbouring relation: replacing one point of ``D_v`` (validation) or of one owner's data
    (owners); MWEM's sensitivity under it is 2 (``dpmarket.common.summarization.mwem``).

    References
    ----------
    Summarization paper, Algorithm 3 (steps 3 and 5), Section 4 (parameters), Appendix D
    (Theorem 6, auction parameters).
    """
    k = check_positive_int(n_owners, "n_owners")
    n_seed = _check_seed_set_size(seed_set_size)
    p = config.summary_size
    owners = auction_events(paper_auction(config, k))
    if p > 1:
        owners += _h2_events(
            config.epsilon_per_later_iteration, (p - 1) * config.iterations_subsequent
        )
    return {
        "validation": _h2_events(config.epsilon_validation, config.t_init),
        "owners": owners,
        "public": _h2_events(config.epsilon_first_epoch, config.t_init) if n_seed > 0 else [],
    }


def _composed_epsilon(events: list[PrivacyEvent], delta: float, method: CalibrationMethod) -> float:
    if method == "pld":
        return pld_epsilon(events, delta)
    epsilons = [e.epsilon for e in events]
    return kairouz_epsilon_delta(
        epsilons, [e.delta for e in events], delta, counts=[e.count for e in events]
    )[0]


def _solve_factor(epsilon_of: Callable[[float], float], target: float, what: str) -> float:
    """Largest-found factor ``c`` with ``(1 - rtol) target <= epsilon_of(c) <= target``.

    ``epsilon_of`` must be non-decreasing. Brackets the target by doubling / halving from an
    initial guess (linear extrapolation from ``c = 1``), then bisects ``log c``, always keeping a
    lower end whose epsilon is ``<= target``.
    """

    def evaluate(c: float) -> float:
        try:
            return float(epsilon_of(c))
        except (ValueError, OverflowError) as exc:
            raise ValueError(
                f"cannot reach epsilon target {target} for {what}: the accountant failed at "
                f"scale factor {c:.6g} ({exc})"
            ) from exc

    def unreachable(reason: str) -> ValueError:
        return ValueError(f"cannot reach epsilon target {target} for {what}: {reason}")

    eps_one = evaluate(1.0)
    guess = target / eps_one if eps_one > 0 else 2.0
    c = min(max(guess, 1.0 / _MAX_FACTOR), _MAX_FACTOR)
    eps_c = evaluate(c)
    if eps_c <= target:
        lo, eps_lo = c, eps_c
        hi = c * 2.0
        eps_hi = evaluate(hi)
        while eps_hi <= target:
            lo, eps_lo = hi, eps_hi
            if hi >= _MAX_FACTOR:
                raise unreachable(
                    f"the configuration's epsilons scaled by {hi:.3g} still give {eps_hi:.6g}"
                )
            hi = min(hi * 2.0, _MAX_FACTOR)
            eps_hi = evaluate(hi)
    else:
        hi = c
        lo = c / 2.0
        eps_lo = evaluate(lo)
        while eps_lo > target:
            hi = lo
            if lo <= 1.0 / _MAX_FACTOR:
                raise unreachable(
                    f"the configuration's epsilons scaled by {lo:.3g} still give {eps_lo:.6g}"
                )
            lo = max(lo / 2.0, 1.0 / _MAX_FACTOR)
            eps_lo = evaluate(lo)
    for _ in range(_MAX_STEPS):
        if eps_lo >= (1.0 - CALIBRATION_RTOL) * target:
            return lo
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        eps_mid = evaluate(mid)
        if eps_mid <= target:
            lo, eps_lo = mid, eps_mid
        else:
            hi = mid
    raise unreachable(
        f"the composed epsilon jumps from {eps_lo:.6g} to above the target between scale factors "
        f"{lo:.10g} and {hi:.10g}"
    )


def calibrate_paper_mode(
    config: PrivateConfig,
    n_owners: int,
    *,
    epsilon_target: float,
    delta: float,
    seed_set_size: int,
    method: CalibrationMethod = "pld",
) -> PrivateConfig:
    """Scale the private method's per-iteration epsilons so each party spends ``epsilon_target``.

    Parameters
    ----------
    config : PrivateConfig
        Starting configuration; its ``epsilon_summary : epsilon_auction`` ratio (how the owners'
        budget is split between summary embeddings and PrivAuction) is kept.
    n_owners : int
        ``K``, the number of owners of the session, ``>= 1``.
    epsilon_target : float
        Total epsilon for the validation set and for the owners' data, each, ``> 0``.
    delta : float
        Total delta of both guarantees, ``0 < delta < 1/e``.
    seed_set_size : int
        Size of the public seed set, ``>= 0`` (it changes no counted charge, see
        :func:`paper_mode_events`, but is checked and passed on).
    method : {"pld", "theorem7"}, default "pld"
        Accountant the target is met with: :func:`~dpmarket.common.privacy.accounting.pld_epsilon`
        at ``delta`` (the ledger's ``"pld"`` figure) or Theorem 7 with slack ``delta`` (its
        ``"theorem7"`` figure; all events are pure, so it holds at ``delta`` too).

    Returns
    -------
    PrivateConfig
        ``dataclasses.replace(config, ...)`` with ``epsilon_validation`` scaled by a factor
        ``c_v``, ``epsilon_summary`` and ``epsilon_auction`` scaled by one factor ``c_o``, and
        ``delta_owners = delta_validation = delta``; every other field is unchanged. With
        ``E_party`` the chosen accountant over ``paper_mode_events(result, ...)[party]`` at
        ``delta``: ``(1 - 1e-3) epsilon_target <= E_party <= epsilon_target`` for both
        ``"validation"`` and ``"owners"``.

    Raises
    ------
    ValueError
        If ``epsilon_target`` is not finite and ``> 0``, ``delta`` is outside ``(0, 1/e)``,
        ``n_owners`` or ``seed_set_size`` is out of range, ``method`` is unknown, or the target
        cannot be reached: no factor within ``[1e-12, 1e12]`` of the configuration's epsilons
        brackets it, the accountant fails at a factor the search tries (e.g. an overflow for
        per-run epsilons in the hundreds), or the composed epsilon jumps over the band
        ``[(1 - 1e-3) target, target]`` (not seen with the default discretization).

    Notes
    -----
    Each party's composed epsilon is a non-decreasing function of its scale factor (every
    event's epsilon scales with it, and PrivAuction's ``eps_auc`` is linear in
    ``epsilon_auction``; counts ``T_init``, ``(p - 1) T_subs`` and ``tau`` do not depend on
    epsilon). The search brackets the target from a linear extrapolation of ``c = 1`` and
    bisects ``log c`` until the lower end, whose epsilon never exceeds the target, is within
    ``1e-3`` of it; each step composes a handful of homogeneous groups (``self_compose``), so a
    calibration costs well under a second for ``p = 500`` once ``dp_accounting`` is imported.
    Because ``delta_owners`` changes ``eps_auc``, the events are recomputed from each candidate
    configuration. The auction is calibrated as the pure variant (``auction="pure"``, each bad
    iteration pure ``eps_auc``-DP); with ``auction="paper"`` the session also charges the
    printed auction's delta per bad iteration, which no scaling of epsilon removes.

    References
    ----------
    Summarization paper, Algorithm 3, Section 4 and Appendix D (Theorems 6 and 7).
    """
    target = check_epsilon(epsilon_target, "epsilon_target")
    dl = check_delta(delta, "delta", upper=1.0 / math.e)
    k = check_positive_int(n_owners, "n_owners")
    n_seed = _check_seed_set_size(seed_set_size)
    if method not in ("pld", "theorem7"):
        raise ValueError(f"method must be 'pld' or 'theorem7', got {method!r}")
    base = dataclasses.replace(config, delta_owners=dl, delta_validation=dl)

    def validation_config(c: float) -> PrivateConfig:
        return dataclasses.replace(base, epsilon_validation=c * config.epsilon_validation)

    def owners_config(c: float) -> PrivateConfig:
        return dataclasses.replace(
            base,
            epsilon_summary=c * config.epsilon_summary,
            epsilon_auction=c * config.epsilon_auction,
        )

    def epsilon_of(
        party: Party, make: Callable[[float], PrivateConfig]
    ) -> Callable[[float], float]:
        def run(c: float) -> float:
            # Calibrated as the pure auction: the printed auction's delta cannot be scaled away.
            cfg = dataclasses.replace(make(c), auction="pure")
            events = paper_mode_events(cfg, k, seed_set_size=n_seed)[party]
            return _composed_epsilon(events, dl, method)

        return run

    c_v = _solve_factor(epsilon_of("validation", validation_config), target, "the validation set")
    c_o = _solve_factor(epsilon_of("owners", owners_config), target, "the owners' data")
    return dataclasses.replace(
        base,
        epsilon_validation=c_v * config.epsilon_validation,
        epsilon_summary=c_o * config.epsilon_summary,
        epsilon_auction=c_o * config.epsilon_auction,
    )


# ------------------------------------------------------------------------------ rounds method
def gaussian_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """epsilon at ``delta`` of one Gaussian mechanism with noise ``sigma`` and L2 ``sensitivity``.

    The inverse of :func:`~dpmarket.common.privacy.accounting.analytic_gaussian_sigma` (exact
    privacy profile, ``dp_accounting``'s ``GaussianPrivacyLoss``, bisected on epsilon keeping the
    upper end), nudged up by ``1e-9`` relative so that the event ``PrivacyEvent("gaussian", eps,
    sensitivity=sensitivity, scale=sigma, delta=delta)`` passes its consistency check.

    Raises
    ------
    ValueError
        If ``sigma`` or ``sensitivity`` is not finite and ``> 0`` or ``delta`` is outside (0, 1).
    """
    load_pld_library()
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    s = check_epsilon(sigma, "sigma")
    sens = check_epsilon(sensitivity, "sensitivity")
    dl = check_delta(delta, "delta")
    loss = GaussianPrivacyLoss(s, sensitivity=sens)

    def delta_at(eps: float) -> float:
        return float(loss.get_delta_for_epsilon(eps))

    lo, hi = 0.0, 1.0
    while delta_at(hi) > dl:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            raise ValueError(f"sigma = {s} gives no finite epsilon at delta = {dl}")
    for _ in range(200):  # delta_at is decreasing; keep delta_at(hi) <= dl
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi or hi - lo <= 1e-12 * hi:
            break
        if delta_at(mid) > dl:
            lo = mid
        else:
            hi = mid
    return max(hi, 1e-12) * (1.0 + 1e-9)


def _tree_levels_for(p: int) -> int:
    """Levels of the summary tree of a p-round session: rounds 2..p release prefixes of 1..p-1."""
    return tree_levels(max(p - 1, 1))


@functools.lru_cache(maxsize=256)
def _pure_epsilon_for_target(tau: int, target: float, delta: float) -> float:
    """Per-event epsilon whose tau-fold pure composition has PLD epsilon in [(1-rtol) t, t]."""

    def epsilon_of(c: float) -> float:
        return pld_epsilon([PrivacyEvent("pure", c * target / tau, tau)], delta)

    return _solve_factor(epsilon_of, target, "PrivAuction alone") * target / tau


def paper_auction(config: PrivateConfig, n_owners: int) -> AuctionParams:
    """PrivAuction's parameters in the private method: Appendix D's at ``(epsilon_auction,
    delta_owners)`` (:func:`~dpmarket.common.summarization.auction.auction_parameters`).

    Raises
    ------
    ValueError
        If ``n_owners`` is not an integer ``>= 1``.
    """
    k = check_positive_int(n_owners, "n_owners")
    return auction_parameters(
        config.epsilon_auction, config.delta_owners, k, variant=config.auction
    )


def session_auction(config: SummarizationConfig, n_owners: int) -> AuctionParams | None:
    """PrivAuction's parameters in a session of ``config`` with ``K`` owners: the private
    method's (:func:`paper_auction`) or the rounds method's (:func:`rounds_auction`); ``None``
    for every other method (the non-private greedy asks its top bidder; the one-round methods
    hold no auction).

    Raises
    ------
    ValueError
        If ``n_owners`` is not an integer ``>= 1``.
    """
    k = check_positive_int(n_owners, "n_owners")
    auction = _SESSION_AUCTIONS.get(type(config))
    return None if auction is None else auction(config, k)


def rounds_auction(config: RoundsConfig, n_owners: int) -> AuctionParams:
    """PrivAuction's parameters in the rounds method (a pure function of the configuration).

    With a summary release (``"tree"`` or ``"mwem"``) the auction gets
    ``auction_share * epsilon_owners_total`` as its Theorem-6 epsilon:
    ``auction_parameters(auction_share * epsilon_owners_total, delta, K)``. With
    ``summary_release="none"`` the auction is the owners' only release and gets their whole
    budget: ``tau = ceil(K^(2/3))`` as Appendix D, and ``eps_auc`` such that the PLD epsilon of
    ``tau`` pure ``eps_auc`` events at ``delta`` lies in ``[(1 - 1e-3), 1] * epsilon_owners_total``.

    Raises
    ------
    ValueError
        If ``n_owners`` is not an integer ``>= 1``.
    """
    k = check_positive_int(n_owners, "n_owners")
    if config.summary_release == "none":
        tau = auction_parameters(1.0, config.delta, k).tau
        eps_auc = _pure_epsilon_for_target(tau, config.epsilon_owners_total, config.delta)
        return AuctionParams(eps_auc=eps_auc, tau=tau, variant=config.auction)
    return auction_parameters(
        config.epsilon_owners_total * config.auction_share, config.delta, k, variant=config.auction
    )


def _auction_events(auction: AuctionParams) -> list[PrivacyEvent]:
    """The auction's events as calibrated: pure ``eps_auc`` (the printed variant's extra delta
    per bad iteration cannot be calibrated away; the session charges it beside)."""
    return auction_events(dataclasses.replace(auction, variant="pure"))


def _tree_events(sigma: float, levels: int, delta: float) -> list[PrivacyEvent]:
    sens = TREE_INCREMENT_SENSITIVITY
    return [
        PrivacyEvent(
            "gaussian",
            gaussian_epsilon(sigma, delta, sens),
            levels,
            sens,
            scale=sigma,
            delta=delta,
        )
    ]


@functools.lru_cache(maxsize=256)
def _tree_sigma(target: float, delta: float, levels: int, eps_auc: float, tau: int) -> float:
    auction = _auction_events(AuctionParams(eps_auc=eps_auc, tau=tau))
    sens = TREE_INCREMENT_SENSITIVITY
    if pld_epsilon(auction, delta) >= target:
        raise ValueError(
            f"cannot reach owners' epsilon target {target}: PrivAuction alone spends "
            f"{pld_epsilon(auction, delta):.6g} (lower auction_share)"
        )
    # sigma = s0 / c: the owners' epsilon is non-decreasing in c.
    s0 = analytic_gaussian_sigma(target, delta, sens * math.sqrt(levels))

    def epsilon_of(c: float) -> float:
        return pld_epsilon([*auction, *_tree_events(s0 / c, levels, delta)], delta)

    return s0 / _solve_factor(epsilon_of, target, "the owners' data (tree + PrivAuction)")


def rounds_tree_sigma(config: RoundsConfig, n_owners: int) -> float:
    """Noise standard deviation of every node of the rounds method's summary tree.

    The smallest-found ``sigma`` such that ``levels`` Gaussian mechanisms of L2 sensitivity
    :data:`TREE_INCREMENT_SENSITIVITY` (``2 sqrt(2)``) and noise ``sigma``, composed with
    PrivAuction's ``tau`` pure ``eps_auc`` events (:func:`rounds_auction`), have PLD epsilon at
    ``config.delta`` in ``[(1 - 1e-3), 1] * epsilon_owners_total``; ``levels =``
    :func:`dpmarket.common.summarization.continual.tree_levels` ``(p - 1)`` (rounds 2..p release the
    prefix sums of the first 1..p-1 acquired points). Cached: a pure function of the configuration
    and ``K``.

    Returns
    -------
    float
        sigma, in h1 units (per coordinate of the noisy node sums).

    Raises
    ------
    ValueError
        If PrivAuction alone already spends the target, or the search fails.
    """
    auction = rounds_auction(config, n_owners)
    levels = _tree_levels_for(config.summary_size)
    return _tree_sigma(
        config.epsilon_owners_total, config.delta, levels, auction.eps_auc, auction.tau
    )


def rounds_mode_events(
    config: RoundsConfig, n_owners: int, *, validation_size: int, seed_set_size: int
) -> dict[Party, list[PrivacyEvent]]:
    """The privacy events a completed ``method="rounds"`` session charges, per party.

    Parameters
    ----------
    config : RoundsConfig
        The rounds configuration (``validation_release``, ``summary_release``, ...).
    n_owners : int
        ``K``, >= 1.
    validation_size : int
        ``m``, >= 1 (the Gaussian release's sensitivity is ``2 / m``).
    seed_set_size : int
        Size of the public seed set, >= 0.

    Returns
    -------
    dict
        * ``"validation"``: one Gaussian event ``(epsilon_validation_total, delta)`` of
          sensitivity ``2 / m`` and sigma ``analytic_gaussian_sigma(...)``, or the
          paper's ``T_init`` MWEM selections and measurements at ``epsilon_validation``.
        * ``"owners"``: PrivAuction's ``tau`` events (:func:`rounds_auction`,
          :func:`~dpmarket.common.summarization.auction.auction_events`), then for
          ``"tree"`` ``levels`` Gaussian events (sensitivity ``2 sqrt(2)``, sigma
          :func:`rounds_tree_sigma`, ``delta``), for ``"mwem"`` ``(p - 1) T_subs`` selections
          and measurements at ``epsilon_summary / sqrt(p T_subs)``, for ``"none"`` nothing more.
          The summary events are absent when ``p = 1`` (no release depends on acquired points).
        * ``"public"``: the seed set's h2 release in round 1 (``"mwem"`` only, seed set
          non-empty).

    Raises
    ------
    ValueError
        If an integer argument is out of range.
    """
    k = check_positive_int(n_owners, "n_owners")
    m = check_positive_int(validation_size, "validation_size")
    n_seed = _check_seed_set_size(seed_set_size)
    p = config.summary_size
    if config.validation_release == "gaussian":
        sens = validation_embedding_sensitivity(m)
        sigma = analytic_gaussian_sigma(config.epsilon_validation_total, config.delta, sens)
        validation = [
            PrivacyEvent(
                "gaussian",
                config.epsilon_validation_total,
                1,
                sens,
                scale=sigma,
                delta=config.delta,
            )
        ]
    else:
        validation = _h2_events(config.epsilon_validation, config.t_init)
    owners = auction_events(rounds_auction(config, k))
    public: list[PrivacyEvent] = []
    if config.summary_release == "tree" and p > 1:
        owners += _tree_events(rounds_tree_sigma(config, k), _tree_levels_for(p), config.delta)
    elif config.summary_release == "mwem":
        if p > 1:
            owners += _h2_events(
                config.epsilon_per_later_iteration, (p - 1) * config.iterations_subsequent
            )
        if n_seed > 0:
            public = _h2_events(config.epsilon_first_epoch, config.t_init)
    return {"validation": validation, "owners": owners, "public": public}


def calibrate_rounds_mode(
    config: RoundsConfig,
    n_owners: int,
    *,
    epsilon_target: float,
    delta: float,
) -> RoundsConfig:
    """Configure the rounds method so that each party's PLD epsilon at ``delta`` is the target.

    Parameters
    ----------
    config : RoundsConfig
        Starting configuration; its rounds options and ``auction_share`` are kept.
    n_owners : int
        ``K``, >= 1.
    epsilon_target : float
        PLD epsilon for the validation set and for the owners' data, each, ``> 0``.
    delta : float
        Total delta of both guarantees, ``0 < delta < 1/e``.

    Returns
    -------
    RoundsConfig
        ``config`` with ``epsilon_validation_total = epsilon_owners_total = epsilon_target`` and
        ``delta = delta``, and:

        * ``validation_release="gaussian"``: nothing else (the session's sigma is the closed
          form ``analytic_gaussian_sigma(epsilon_target, delta, 2 / m)``, exactly
          ``(epsilon_target, delta)``-DP); ``"mwem"``: ``epsilon_validation`` scaled so that the
          ``T_init`` MWEM iterations compose to the target.
        * ``summary_release="tree"`` or ``"none"``: nothing else (the session derives the tree's
          sigma, :func:`rounds_tree_sigma`, and PrivAuction's ``eps_auc``,
          :func:`rounds_auction`, from ``epsilon_owners_total``); ``"mwem"``: ``epsilon_summary``
          scaled so that PrivAuction (fixed at ``auction_share * epsilon_target``) plus the
          ``(p - 1) T_subs`` MWEM iterations compose to the target.

        With ``E_party`` the PLD epsilon of :func:`rounds_mode_events` ``(result, ...)[party]``
        at ``delta``: ``(1 - 1e-3) epsilon_target <= E_party <= epsilon_target`` for both parties
        (for the owners when ``p > 1`` or ``summary_release="none"``; with ``p = 1`` and a
        summary release only the auction is charged).

    Raises
    ------
    ValueError
        If an argument is out of range or the target cannot be reached (e.g. PrivAuction alone
        spends more than the target).
    """
    target = check_epsilon(epsilon_target, "epsilon_target")
    dl = check_delta(delta, "delta", upper=1.0 / math.e)
    k = check_positive_int(n_owners, "n_owners")
    out = dataclasses.replace(
        config, epsilon_validation_total=target, epsilon_owners_total=target, delta=dl
    )
    if out.validation_release == "mwem":
        base_v = out

        def validation_epsilon(c: float) -> float:
            return pld_epsilon(_h2_events(c * base_v.epsilon_validation, base_v.t_init), dl)

        c_v = _solve_factor(validation_epsilon, target, "the validation set")
        out = dataclasses.replace(out, epsilon_validation=c_v * out.epsilon_validation)
    if out.summary_release == "mwem" and out.summary_size > 1:
        base_o = out
        auction = _auction_events(rounds_auction(base_o, k))

        def owners_epsilon(c: float) -> float:
            cfg = dataclasses.replace(base_o, epsilon_summary=c * base_o.epsilon_summary)
            h2 = _h2_events(
                cfg.epsilon_per_later_iteration,
                (cfg.summary_size - 1) * cfg.iterations_subsequent,
            )
            return pld_epsilon([*auction, *h2], dl)

        c_o = _solve_factor(owners_epsilon, target, "the owners' data (h2 + PrivAuction)")
        out = dataclasses.replace(out, epsilon_summary=c_o * out.epsilon_summary)
    elif out.summary_release == "tree" and out.summary_size > 1:
        rounds_tree_sigma(out, k)  # fail early (and warm the cache) if unreachable
    return out


#: The methods that hold PrivAuction, and how each derives its parameters.
_SESSION_AUCTIONS: dict[type[SummarizationConfig], Callable[[Any, int], AuctionParams]] = {
    PrivateConfig: paper_auction,
    RoundsConfig: rounds_auction,
}
