"""Composition bounds for the privacy ledger: Theorem 7 (Kairouz et al.), advanced composition, PLD.

All bounds here compose *pure* ``epsilon_l``-DP mechanisms (``delta_l = 0``) under adaptive
composition and return the total epsilon at a slack ``delta_tilde``; the composed mechanism is then
``(epsilon, delta_tilde)``-DP.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike

from common.validation import check_epsilon, check_positive_int

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

__all__ = [
    "PrivacyEvent",
    "advanced_composition_epsilon",
    "kairouz_epsilon",
    "kairouz_epsilon_homogeneous",
    "pld_epsilon",
]

_MECHANISMS = ("laplace", "exponential", "pure")
_CONSISTENCY_RTOL = 1e-9
# Discretization of the PLD: at most this many intervals per smallest epsilon, and at least
# (total basic epsilon) / _PLD_MAX_BUCKETS per interval so that memory stays bounded.
_PLD_BUCKETS_PER_EPSILON = 100
_PLD_MAX_BUCKETS = 1_000_000
_PLD_MIN_MASS = 1e-30


@dataclass(frozen=True)
class PrivacyEvent:
    """One kind of pure-DP mechanism, run ``count`` times, as charged to the ledger.

    Attributes
    ----------
    mechanism : {"laplace", "exponential", "pure"}
        ``"laplace"``: additive Laplace noise of ``scale`` on a query of L1 ``sensitivity``;
        ``"exponential"``: the exponential mechanism calibrated to ``epsilon``-DP (e.g. MWEM's
        selection); ``"pure"``: any other ``epsilon``-DP mechanism (e.g. PrivAuction's queries).
    epsilon : float
        Privacy parameter of *one* run, ``> 0``. For ``"laplace"``, ``sensitivity / scale``.
    count : int
        Number of runs (adaptively composed), ``>= 1``.
    sensitivity : float, optional
        L1 sensitivity of the query. For ``"laplace"`` it is filled in as ``epsilon * scale`` if
        omitted (or 1.0 if ``scale`` is omitted too); for the other mechanisms it is recorded only.
    scale : float, optional
        Laplace scale ``b``; only for ``"laplace"`` (filled in as ``sensitivity / epsilon``).

    Raises
    ------
    ValueError
        If ``mechanism`` is unknown, ``epsilon``, ``sensitivity`` or ``scale`` is not finite and
        ``> 0``, ``count < 1``, ``scale`` is given for a non-Laplace mechanism, or
        ``epsilon != sensitivity / scale`` (relative tolerance 1e-9) for a Laplace event.
    """

    mechanism: Literal["laplace", "exponential", "pure"]
    epsilon: float
    count: int = 1
    sensitivity: float | None = None
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in _MECHANISMS:
            raise ValueError(f"mechanism must be one of {_MECHANISMS}, got {self.mechanism!r}")
        eps = check_epsilon(self.epsilon)
        count = check_positive_int(self.count, "count")
        sens = None if self.sensitivity is None else check_epsilon(self.sensitivity, "sensitivity")
        scale = None if self.scale is None else check_epsilon(self.scale, "scale")
        if self.mechanism == "laplace":
            if sens is None and scale is None:
                sens = 1.0
            if scale is None:
                assert sens is not None
                scale = sens / eps
            elif sens is None:
                sens = eps * scale
            implied = sens / scale
            if abs(implied - eps) > _CONSISTENCY_RTOL * eps:
                raise ValueError(
                    f"laplace event: epsilon must equal sensitivity / scale = {sens} / {scale} = "
                    f"{implied}, got epsilon={self.epsilon}"
                )
        elif scale is not None:
            raise ValueError(f"scale is only meaningful for laplace events, got scale={scale}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "sensitivity", sens)
        object.__setattr__(self, "scale", scale)


def _check_delta_tilde(delta_tilde: float) -> float:
    d = float(delta_tilde)
    if not (math.isfinite(d) and 0.0 < d <= 1.0 / math.e):
        raise ValueError(f"delta_tilde must lie in (0, 1/e], got {delta_tilde}")
    return d


def _kairouz_from_groups(epsilons: np.ndarray, counts: np.ndarray, delta_tilde: float) -> float:
    """Theorem 7 for ``counts[j]`` mechanisms of privacy ``epsilons[j]`` each."""
    if epsilons.size == 0:
        return 0.0
    basic = float(np.sum(counts * epsilons))
    # (e^eps - 1) eps / (e^eps + 1) = eps * tanh(eps / 2), stable for small and large eps.
    drift = float(np.sum(counts * epsilons * np.tanh(epsilons / 2.0)))
    sum_sq = float(np.sum(counts * epsilons**2))
    second = drift + math.sqrt(2.0 * sum_sq * math.log(1.0 / delta_tilde))
    third = drift + math.sqrt(
        2.0 * sum_sq * math.log(math.e + math.sqrt(2.0 * sum_sq) / delta_tilde)
    )
    return min(basic, second, third)


def kairouz_epsilon(epsilons: Sequence[float] | ArrayLike, delta_tilde: float) -> float:
    """Total epsilon of the adaptive composition of pure-DP mechanisms, by Theorem 7.

    ``min{ sum e_l,
    sum e_l (e^e_l - 1)/(e^e_l + 1) + sqrt(sum 2 e_l^2 log(1/delta_tilde)),
    sum e_l (e^e_l - 1)/(e^e_l + 1) + sqrt(sum 2 e_l^2 log(e + sqrt(sum 2 e_l^2)/delta_tilde)) }``

    Parameters
    ----------
    epsilons : sequence or ndarray of shape (k,), float
        Privacy parameter of each mechanism, each ``> 0`` (``delta_l = 0``). Equal values are
        grouped, so long homogeneous lists cost ``O(k)`` vectorised work.
    delta_tilde : float
        Slack, ``0 < delta_tilde <= 1/e``.

    Returns
    -------
    float
        ``epsilon_tilde``: the composition is ``(epsilon_tilde, delta_tilde)``-DP. 0.0 when
        ``epsilons`` is empty.

    Raises
    ------
    ValueError
        If ``epsilons`` is not 1-D or holds a value that is not finite and ``> 0``, or if
        ``delta_tilde`` is outside ``(0, 1/e]``.

    Notes
    -----
    The third expression is implemented as quoted in the paper's appendix, with
    ``sqrt(sum 2 e_l^2)`` inside the logarithm. Kairouz, Oh & Viswanath (2017, Theorem 3.5) have
    ``sqrt(sum e_l^2)`` there, which is smaller; the quoted form is therefore a (slightly) larger
    epsilon and just as sound. The expressions are evaluated with
    ``(e^x - 1)/(e^x + 1) = tanh(x/2)``.

    References
    ----------
    Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath, "The composition theorem
    for differential privacy", IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.5.
    """
    dt = _check_delta_tilde(delta_tilde)
    arr = np.asarray(epsilons, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"epsilons must be a 1-D sequence, got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"every epsilon must be finite and > 0, got epsilons[{j}] = {arr[j]}")
    values, counts = np.unique(arr, return_counts=True)
    return _kairouz_from_groups(values, counts.astype(np.float64), dt)


def kairouz_epsilon_homogeneous(epsilon: float, k: int, delta_tilde: float) -> float:
    """Theorem 7 for ``k`` mechanisms that are each ``epsilon``-DP; ``O(1)`` work.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon, ``> 0``.
    k : int
        Number of mechanisms, ``>= 1``.
    delta_tilde : float
        Slack, ``0 < delta_tilde <= 1/e``.

    Returns
    -------
    float
        Equal to ``kairouz_epsilon([epsilon] * k, delta_tilde)``.

    Raises
    ------
    ValueError
        If ``epsilon <= 0``, ``k < 1`` or ``delta_tilde`` is outside ``(0, 1/e]``.

    References
    ----------
    Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath (2017).
    """
    eps = check_epsilon(epsilon)
    count = check_positive_int(k, "k")
    dt = _check_delta_tilde(delta_tilde)
    return _kairouz_from_groups(np.array([eps]), np.array([float(count)]), dt)


def advanced_composition_epsilon(epsilon: float, k: int, delta_tilde: float) -> float:
    """Advanced composition: ``epsilon sqrt(2 k ln(1/delta_tilde)) + k epsilon (e^epsilon - 1)``.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon, ``> 0``.
    k : int
        Number of adaptively composed ``epsilon``-DP mechanisms, ``>= 1``.
    delta_tilde : float
        Slack, ``0 < delta_tilde < 1``.

    Returns
    -------
    float
        The composition is ``(result, delta_tilde)``-DP.

    Raises
    ------
    ValueError
        If ``epsilon <= 0``, ``k < 1`` or ``delta_tilde`` is outside ``(0, 1)``.

    Notes
    -----
    The summarization paper's Section 4 numbers come from this bound with *one* ``epsilon``-DP
    mechanism per MWEM iteration: ``advanced_composition_epsilon(0.01, 1656, 0.01) = 1.40`` and
    ``advanced_composition_epsilon(0.01 / sqrt(5 p), 5 p, 1e-4) = 0.043`` for every ``p``.

    References
    ----------
    Dwork, Rothblum & Vadhan, "Boosting and differential privacy", FOCS 2010, Theorem III.3;
    Dwork & Roth (2014), Theorem 3.20.
    """
    eps = check_epsilon(epsilon)
    count = check_positive_int(k, "k")
    dt = float(delta_tilde)
    if not (math.isfinite(dt) and 0.0 < dt < 1.0):
        raise ValueError(f"delta_tilde must lie in (0, 1), got {delta_tilde}")
    return eps * math.sqrt(2.0 * count * math.log(1.0 / dt)) + count * eps * math.expm1(eps)


def _group_pld(event: PrivacyEvent, count: int, interval: float) -> PrivacyLossDistribution:
    """PLD of ``count`` adaptive runs of ``event`` (dp_accounting is imported lazily: ~0.6 s).

    Laplace: ``from_laplace_mechanism`` (connect-the-dots discretization) then ``self_compose``.
    Pure / exponential: the exact ``count``-fold composition of the worst-case pure-epsilon pair
    (randomized response), built from its binomial law and rounded up to the grid *once*.
    ``from_privacy_parameters(...).self_compose(count)`` would instead round ``-epsilon`` up a
    bucket in every run; with ``epsilon = 0.01`` and an interval of ``epsilon / 100`` that
    doubles the mean privacy loss (``~epsilon^2 / 2`` per run) and overstates the epsilon of
    1656 runs by 11%.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from scipy.stats import binom

    if event.mechanism == "laplace":
        assert event.scale is not None and event.sensitivity is not None
        single = pld_lib.from_laplace_mechanism(
            parameter=event.scale,
            sensitivity=event.sensitivity,
            value_discretization_interval=interval,
        )
        return single.self_compose(count) if count > 1 else single

    eps = event.epsilon
    # Under the first distribution each run has loss +eps w.p. e^eps / (1 + e^eps) and -eps
    # w.p. 1 / (1 + e^eps); with n_neg ~ Binomial(count, 1 / (1 + e^eps)) negative runs the
    # composed loss is eps * (count - 2 n_neg).
    n_neg = np.arange(count + 1)
    pmf = binom.pmf(n_neg, count, 1.0 / (1.0 + math.exp(eps)))
    keep = pmf > _PLD_MIN_MASS
    # Dropped mass goes to infinite loss: pessimistic, and at most count * 1e-30 in total.
    dropped = float(pmf[~keep].sum())
    indices = np.ceil(eps * (count - 2 * n_neg[keep]) / interval).astype(np.int64)
    rounded: dict[int, float] = {}
    for index, mass in zip(indices.tolist(), pmf[keep].tolist(), strict=True):
        rounded[index] = rounded.get(index, 0.0) + mass
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        rounded, dropped, interval
    )


def pld_epsilon(
    events: Sequence[PrivacyEvent],
    delta: float,
    *,
    value_discretization_interval: float | None = None,
) -> float:
    """Total epsilon at ``delta`` by composing privacy loss distributions (``dp_accounting``).

    PLDs are built and composed directly (no ``PLDAccountant``). Identical events are merged and
    each group of ``count`` runs becomes one PLD: for Laplace events
    ``from_laplace_mechanism(parameter=scale, sensitivity=sensitivity).self_compose(count)``; for
    exponential and generic pure events the exact ``count``-fold composition of the worst-case
    pure-``epsilon`` pair (the PLD that ``from_privacy_parameters(epsilon, 0)`` describes),
    rounded to the grid once. Groups are combined with ``compose`` and the answer is
    ``get_epsilon_for_delta(delta)``.

    Parameters
    ----------
    events : sequence of PrivacyEvent
        Adaptively composed events. Identical events are merged (their counts add).
    delta : float
        Target delta, ``0 < delta < 1``.
    value_discretization_interval : float, optional
        Discretization of the privacy loss. Default: ``max(eps_min / 100 * (1 + 1e-9),
        sum(count * eps) / 1e6)``; the ``1 + 1e-9`` makes ``+eps_min`` fall just inside a whole
        number of intervals so that the upward rounding does not push it up a bucket, and the
        second term bounds memory.

    Returns
    -------
    float
        The composition is ``(result, delta)``-DP; 0.0 when ``events`` is empty.

    Raises
    ------
    ValueError
        If ``delta`` is outside ``(0, 1)``, an element is not a :class:`PrivacyEvent`, or the
        interval is not finite and ``> 0``.

    Notes
    -----
    The PLD is pessimistic (losses rounded up to the grid), so the result is an upper bound on
    the exact epsilon of the composition. Pure groups are rounded once, so they add at most one
    interval each; ``self_compose`` of a once-rounded pure PLD would add up to one interval *per
    run* to the mean loss, which for small epsilon is of the order of the loss itself (measured:
    +11% for 1656 runs at epsilon 0.01). ``PLDAccountant`` is not used: in dp-accounting 0.6 it
    ignores the repeat count of a ``SelfComposedDpEvent`` wrapping a
    ``RandomizedResponseDpEvent`` (DESIGN.md). Composition of these PLDs is valid under adaptive
    composition because each is a dominating pair for its mechanism (every ``epsilon``-DP
    mechanism is dominated by randomized response). For the exponential mechanism the generic
    pure-DP PLD is sound but not tight.

    References
    ----------
    Meiser & Mohammadi, "Tight on budget?", CCS 2018; Koskela, Jälkö & Honkela, AISTATS 2020;
    Doroshenko et al., "Connect the dots", PETS 2022 (the ``dp_accounting`` PLD implementation).
    """
    dl = float(delta)
    if not (math.isfinite(dl) and 0.0 < dl < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    grouped: Counter[PrivacyEvent] = Counter()
    for j, event in enumerate(events):
        if not isinstance(event, PrivacyEvent):
            raise ValueError(f"events[{j}] must be a PrivacyEvent, got {type(event).__name__}")
        key = PrivacyEvent(event.mechanism, event.epsilon, 1, event.sensitivity, event.scale)
        grouped[key] += event.count
    if not grouped:
        return 0.0
    if value_discretization_interval is None:
        eps_min = min(e.epsilon for e in grouped)
        total = sum(e.epsilon * n for e, n in grouped.items())
        interval = max(eps_min / _PLD_BUCKETS_PER_EPSILON * (1.0 + 1e-9), total / _PLD_MAX_BUCKETS)
    else:
        interval = check_epsilon(value_discretization_interval, "value_discretization_interval")

    composed: PrivacyLossDistribution | None = None
    for event, count in sorted(grouped.items(), key=lambda kv: (kv[0].mechanism, kv[0].epsilon)):
        pld = _group_pld(event, count, interval)
        composed = pld if composed is None else composed.compose(pld)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(dl))
