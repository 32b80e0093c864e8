"""Calibrating the paper's private summarization (Algorithm 3) to a target total epsilon.

:func:`paper_mode_events` lists the privacy events a completed ``method="private"`` session charges
to its ledgers; :func:`calibrate_paper_mode` scales the configuration's per-iteration epsilons so
that the composed epsilon of each party equals a target, e.g. to compare methods at equal privacy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal

from common.accounting import PrivacyEvent, kairouz_epsilon_delta, pld_epsilon
from common.auction import auction_parameters
from common.summary import SummarizationConfig
from common.validation import check_delta, check_epsilon, check_positive_int

__all__ = [
    "CALIBRATION_RTOL",
    "MWEM_SENSITIVITY",
    "calibrate_paper_mode",
    "paper_mode_events",
]

#: Sensitivity ``Delta`` of MWEM's score and measurement (``common.mwem``): every coordinate of the
#: quantized sum moves by at most 2 when one point of the set is replaced.
MWEM_SENSITIVITY = 2.0
#: Calibrated epsilons lie in ``[(1 - CALIBRATION_RTOL) * target, target]``.
CALIBRATION_RTOL = 1e-3
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
    config: SummarizationConfig, n_owners: int, *, seed_set_size: int
) -> dict[Party, list[PrivacyEvent]]:
    """The privacy events a completed private session of ``config`` charges, per party.

    Parameters
    ----------
    config : SummarizationConfig
        Session configuration; the events are those of ``method="private"`` (Algorithm 3),
        whatever ``config.method`` says.
    n_owners : int
        ``K``, the number of owners the session is opened with (``auction_parameters`` uses it),
        ``>= 1``.
    seed_set_size : int
        Number of points in the public seed set ``D_init``, ``>= 0``.

    Returns
    -------
    dict
        ``{"validation": [...], "owners": [...], "public": [...]}``, each a list of
        :class:`~common.accounting.PrivacyEvent` whose repeat counts add up to what the session
        charges (it charges one pair of events per h2 release; these lists merge the identical
        ones, which every accountant of :mod:`common.accounting` treats alike):

        * ``"validation"``: ``T_init`` exponential-mechanism selections and ``T_init`` Laplace
          measurements (sensitivity 2, scale ``2 / epsilon_validation``) at
          ``config.epsilon_validation`` (Algorithm 3, step 3).
        * ``"owners"``: PrivAuction's ``tau`` pure events at ``eps_auc``, with
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
    This mirrors ``curator.protocol.SummarizationSession._run_greedy``: in round ``l`` the
    summary holds ``q = seed_set_size + l - 1`` points. Round 1 releases the seed set only (party
    ``"public"``) or, when ``q = 0``, releases nothing; every later round has ``q >= 1`` and
    releases an h2 embedding of a set holding owners' points, charged to ``"owners"`` at
    ``epsilon_summary / sqrt(p T_subs)`` per iteration. So the owners' charges do not depend on
    the seed set's size. PrivAuction is charged once, in round 1, over ``tau`` bad iterations
    (Appendix D, proof of Theorem 6). The counts assume a session that runs all ``p`` rounds
    with at least one bid in round 1; an aborted session charges a prefix of these events.
    Neighbouring relation: replacing one point of ``D_v`` (validation) or of one owner's data
    (owners); MWEM's sensitivity under it is 2 (``common.mwem``).

    References
    ----------
    Summarization paper, Algorithm 3 (steps 3 and 5), Section 4 (parameters), Appendix D
    (Theorem 6, auction parameters).
    """
    k = check_positive_int(n_owners, "n_owners")
    n_seed = _check_seed_set_size(seed_set_size)
    p = config.summary_size
    auction = auction_parameters(config.epsilon_auction, config.delta_owners, k)
    owners = [PrivacyEvent("pure", auction.eps_auc, auction.tau)]
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
    config: SummarizationConfig,
    n_owners: int,
    *,
    epsilon_target: float,
    delta: float,
    seed_set_size: int,
    method: CalibrationMethod = "pld",
) -> SummarizationConfig:
    """Scale the private method's per-iteration epsilons so each party spends ``epsilon_target``.

    Parameters
    ----------
    config : SummarizationConfig
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
        Accountant the target is met with: :func:`~common.accounting.pld_epsilon` at ``delta``
        (the ledger's ``"pld"`` figure) or Theorem 7 with slack ``delta`` (its ``"theorem7"``
        figure; all events are pure, so it holds at ``delta`` too).

    Returns
    -------
    SummarizationConfig
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
    configuration. The guarantee is the PLD (or Theorem 7) epsilon of the charged events; it
    does not include the PrivAuction caveat the session reports beside the ledger (a bad
    iteration is not pure, ``delta_per_bad_iteration``).

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

    def validation_config(c: float) -> SummarizationConfig:
        return dataclasses.replace(base, epsilon_validation=c * config.epsilon_validation)

    def owners_config(c: float) -> SummarizationConfig:
        return dataclasses.replace(
            base,
            epsilon_summary=c * config.epsilon_summary,
            epsilon_auction=c * config.epsilon_auction,
        )

    def epsilon_of(
        party: Party, make: Callable[[float], SummarizationConfig]
    ) -> Callable[[float], float]:
        def run(c: float) -> float:
            events = paper_mode_events(make(c), k, seed_set_size=n_seed)[party]
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
