"""Private payouts: what an owner learns of its value is a Laplace release, charged to its subjects.

The consumer holds the summary ``S`` and ``D_v``: it may compute any attribution itself
(:mod:`dpmarket.common.market.attribution`). An owner may not: its share of the value is a
function of ``D_v`` and of the other owners' delivered points. So the curator releases to each
owner its Shapley value under :class:`~dpmarket.common.market.attribution.EmbeddingGame` plus
Laplace noise (:func:`release_payouts`), and pays it a post-processing of that noisy value
(a :class:`ValueReward`, on an estimate of the owner's value that shrinks the noisy value
towards what its delivered points are worth a priori, or a :class:`ProportionalSplit` of the
consumer's reward).

Notation: ``S`` has ``p`` points, ``n_j`` of owner ``j`` (``S_j``); ``D_v`` has ``m``;
``k`` in [0, 1] with ``k(x, x) = 1``; ``kV(x) = (1 / m) sum_{v in D_v} k(v, x)``,
``kS(x) = (1 / p) sum_{y in S} k(x, y)``. The released value of owner ``j`` is
(:func:`~dpmarket.common.market.attribution.embedding_shapley`)::

    phi_j = (1 / p) sum_{x in S_j} s(x),    s(x) = 2 kV(x) - kS(x),    sum_j phi_j = J(S).

Notes
-----
**The neighbouring relations.** Both hold the summary's composition fixed: which owner delivered
each of the ``p`` points, hence ``n_j``, ``p`` and ``m`` (``p`` and ``m`` are public in the
session's terms). (i) *Neighbouring D_v*: one validation point ``v`` replaced by ``v'``.
(ii) *Neighbouring owner data*: one delivered point ``x`` of owner ``j`` replaced by ``x'``.

**(i) Sensitivity to one validation point.** Only ``kV`` depends on ``D_v``; at every ``x`` it
moves by ``delta(x) / m`` with ``delta(x) = k(v', x) - k(v, x)`` in [-1, 1]. So
``Delta phi_j = (2 / (m p)) sum_{x in S_j} delta(x)`` and, over *all* owners,

    ``sum_j |Delta phi_j| <= (2 / (m p)) sum_{x in S} |delta(x)| <= 2 / m``   (L1, tight as
    ``delta -> +-1``; the L2 norm has the same worst case, one owner holding all of ``S``).

For comparison, every coalition value moves by at most ``2 / m`` under either game
(``Delta J(S_C) = (2 / (m n_C)) sum_{x in S_C} delta(x)``), but the Shapley vector of the
paper's game ``v(C) = J(S_C)`` is only bounded by ``(2 / m) (1 + 2 min(K - 1, ln p))`` in L1: its
``Delta v`` is ``2 / m`` times a weighted mean of ``delta`` over the coalition's owners, the
Shapley vector of which has L1 norm at most ``2 E_pi[sum_t n_t / N_t] - 1`` (``n_t`` the points
of the t-th owner of a random order, ``N_t`` those of the first ``t``; the sum is at most
``1 + min(K - 1, ln p)`` because ``n_t / N_t <= ln(N_t / N_{t-1})``): a bound 8 to 12 times
larger for ``p`` = 30 to 200.

**(ii) Sensitivity to one delivered point of owner j.** ``kS(y)`` moves by ``dk(y) / p`` at every
other ``y``, ``dk(y) = k(y, x') - k(y, x)`` in [-1, 1] (the self term ``k(x, x) = 1`` does not
move); ``kV`` moves only at the replaced point. For every other owner ``l``,
``Delta phi_l = -(1 / p^2) sum_{y in S_l} dk(y)``, so

    ``sum_{l != j} |Delta phi_l| <= (p - n_j) / p^2 <= (p - 1) / p^2 < 1 / p``.

Owner ``j``'s own value moves by ``(1 / p) (2 (kV(x') - kV(x)) - (1 / p) sum_{y != x} dk(y))
- (1 / p^2) sum_{y in S_j, y != x} dk(y)``, at most ``2 / p + (p + n_j - 2) / p^2`` in absolute
value; with the others', ``2 / p + 2 (p - 1) / p^2 < 4 / p``. Owner ``j`` need not be protected
from itself, but a payout that depends on *every* noisy value (the :class:`ProportionalSplit`,
which divides the reward by their sum) shows ``phi_j`` to the other owners, so that rule uses
this larger bound. The paper's game has no useful bound here: a coalition of one owner with one
point has ``J({x}) = 2 kV(x) - 1``, which the replaced point moves by up to 2, and every coalition
``C`` containing it by up to ``4 / n_C``; summed along a random order this gives ``O(log p)`` on
the other owners' values, not ``O(1 / p)`` -- the reason the payouts use the embedding game,
which keeps each point at its weight ``1 / p`` whatever the coalition.

**Calibration.** With ``D_V = 2 / m`` and ``D_O`` the bound of (ii) the reward rule needs
(:func:`payout_sensitivity`), every owner with ``n_j >= 1`` receives ``phi_j + Lap(b)``,
``b = max(D_V, D_O) / epsilon``, i.i.d.; an owner with no delivered point has ``phi_j = 0``
under both relations and receives exactly 0 (it knows it delivered nothing). The Laplace
mechanism on a vector of L1 sensitivity ``D`` is ``D / b``-DP, so the release is

* ``epsilon_validation = D_V / b <= epsilon``-DP for D_v, against any coalition of owners (the
  L1 bound is over all of them), charged to the validation set's ledger at the curator;
* ``epsilon_owner = D_O / b <= epsilon``-DP for each point an owner delivered, against any
  coalition of the other owners, charged to the ledger of every owner with a delivered point (it
  becomes part of the terms that owner signs). An owner's whole contribution of ``n_j`` points
  is protected at ``n_j epsilon_owner`` (group privacy).

**Post-processing.** A payout is a function of the noisy values and of public numbers (``p``, the
reward) and of what its recipient knows (its own ``n_j``), so clipping at 0, capping and
dividing a reward cost nothing more: the guarantee above holds for the payouts, the statement
lines and anything computed from them.

**What is not protected.** The composition of ``S`` is held fixed: how many points each owner
delivered (and which) is known to the curator and the consumer, and the values depend on it
(the redundancy ``kS`` reflects the other owners' points). The selection of ``S`` is a function
of the data that this release does not account for; the session's own terms do, for what the
session released.

**The own-data release** (:func:`release_own_payouts`). It releases instead each owner's
own-data part of its Shapley value of the paper's game
(:func:`~dpmarket.common.market.attribution.own_shapley`), which ranks owners closer to that
game's Shapley values::

    psi_j = (2 a_j / m) E[1 / N_j] - (B_jj - n_j) E[1 / N_j^2] + c_j,

with ``a_j = sum_{v, x in S_j} k(v, x)``, ``B_jj`` the kernel sum over pairs of j's points,
and ``E[1 / N_j]``, ``E[1 / N_j^2]``, ``c_j`` functions of the counts alone
(:class:`~dpmarket.common.market.attribution.OwnWeights`; ``0 < E[1 / N_j^2] <= E[1 / N_j]
<= 1 / n_j``). (i) One validation point replaced moves only ``a_j``, by ``sum_{x in S_j}
delta(x)`` (``delta`` as above), so ``|Delta psi_j| <= (2 / m) n_j E[1 / N_j]`` and

    ``sum_j |Delta psi_j| <= D_V = (2 / m) sum_j n_j E[1 / N_j]``   (L1, attained when every
    ``delta = +1``; ``sum_j n_j E[1 / N_j]`` is in ``[1, 1 + min(K - 1, ln p)]``, the bound of
    the paper's game above, now exact for the counts).

(ii) One delivered point of owner i replaced moves no other owner's ``psi_l`` (it reads only
owner l's points, ``D_v`` and the counts, which the relation holds fixed): ``D_O = 0``, and the
release charges no owner's ledger. Owner i's own value moves by at most ``2 E[1 / N_i] +
2 (n_i - 1) E[1 / N_i^2]`` (``a_i`` by up to ``m``, ``B_ii - n_i`` by up to ``2 (n_i - 1)``);
a reward rule that shows every value to every owner needs the largest of these over the
owners as ``D_O`` (:func:`own_payout_sensitivity`). The noise scale ``b = max(D_V, D_O) /
epsilon`` is a function of ``m`` and the counts: it shows the owners a function of the
composition, which the curator knows from the session's output (post-processing; see "What is
not protected"). An owner checking its statement needs the counts' weights (or ``D_V``) stated
to recompute ``b``.

References
----------
Dwork, McSherry, Nissim & Smith (2006), the Laplace mechanism; summarization paper, Section 2
("Incentives": "other data sources do not know about their data (in a differential privacy
sense)").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.market.attribution import (
    OwnWeights,
    SummaryBlocks,
    embedding_shapley,
    own_shapley,
    own_weights,
)
from dpmarket.common.market.money import VALUE_UNITS, value_units
from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.validation import check_epsilon, check_positive_int

__all__ = [
    "PAYOUT_CHARGE_LABEL",
    "POINT_VALUE_MEAN",
    "POINT_VALUE_SPREAD",
    "PayoutRelease",
    "PayoutSensitivity",
    "ProportionalSplit",
    "RewardRule",
    "ValueReward",
    "own_payout_sensitivity",
    "payout_noise_scale",
    "payout_sensitivity",
    "release_own_payouts",
    "release_payouts",
]


def _check_amount(amount: int, name: str) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise ValueError(f"{name} must be an int of micro-credits >= 0, got {amount!r}")
    return amount


def _check_counts(shares: Sequence[int], counts: Sequence[int], p: int) -> None:
    if len(shares) != len(counts):
        raise ValueError(f"{len(shares)} shares for {len(counts)} owners' counts")
    if any(int(n) < 0 for n in counts) or sum(int(n) for n in counts) != p:
        raise ValueError(f"the owners' counts {list(counts)} must be >= 0 and sum to p = {p}")


#: ValueReward's prior on the value of one delivered point ``phi_j / (n_j / p)``, in nano-value
#: (units of J / 10^9): its mean and standard deviation across owners, fitted (to 0.01) by
#: ``dpmarket lab evaluate --attribution`` on the design half of the scenario suite
#: (``experiments/suite_split.toml``; docs/results.md, "The market").
POINT_VALUE_MEAN = 410_000_000
POINT_VALUE_SPREAD = 210_000_000


@dataclass(frozen=True)
class ValueReward:
    """The consumer pays ``reward`` per unit of value, each owner on an estimate of its own value.

    Owner j's estimate shrinks its noisy value ``s_j`` towards what its ``n_j`` delivered points
    are worth a priori, by the linear estimate of least mean squared error: with ``w = n_j / p``
    (its share of the summary), a prior of mean ``mu w`` and standard deviation ``tau w`` on its
    value (``mu``, ``tau``: the value of one point, :data:`POINT_VALUE_MEAN`,
    :data:`POINT_VALUE_SPREAD`) and noise of variance ``2 b^2`` (Laplace of scale ``b``)::

        v_j = mu w + lambda (s_j - mu w),    lambda = tau^2 w^2 / (tau^2 w^2 + 2 b^2),

    and it is paid ``reward * clip(v_j, 0, w)``, rounded down to a micro-credit. The cap ``w``
    bounds the total by ``reward`` whatever the noise. When the noise is small next to an owner's
    value (many points, large m and p) the estimate follows the release; when it is not, the
    owner is paid mostly for its delivered points -- the best one can do at that epsilon.

    Notes
    -----
    A payout depends only on the owner's own noisy value, its own count (which it knows: its
    statement line states it) and public numbers (``p``, ``b``, the constants, ``reward``), so it
    is post-processing of what that owner is shown: it costs no privacy, and the other owners'
    values need not be protected from it. Computed in exact rational arithmetic from the
    statement's integers, so the owner recomputes its reward to the micro-credit.

    Attributes
    ----------
    reward : int
        Micro-credits per unit of value; also the most the consumer pays in reward.
    point_mean, point_spread : int
        ``mu`` and ``tau`` in nano-value, ``>= 0`` (``tau = 0``: pay by delivered points only).
    """

    reward: int
    point_mean: int = POINT_VALUE_MEAN
    point_spread: int = POINT_VALUE_SPREAD
    reveals_other_values: ClassVar[bool] = False
    name: ClassVar[str] = "value"

    def __post_init__(self) -> None:
        _check_amount(self.reward, "reward")
        for name in ("point_mean", "point_spread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int of nano-value >= 0, got {value!r}")

    def max_total(self) -> int:
        """The most the rule pays in all, micro-credits (for the quote)."""
        return self.reward

    def estimate(self, share: int, count: int, p: int, noise_scale: int) -> Fraction:
        """One owner's value estimate ``v_j`` (units of J), exactly.

        Parameters
        ----------
        share : int
            The owner's noisy value in nano-value units
            (:func:`~dpmarket.common.market.money.value_units`).
        count : int
            Its delivered points ``n_j``, in ``[0, p]``.
        p : int
            The summary's size, >= 1.
        noise_scale : int
            The release's Laplace scale ``b`` in nano-value, >= 0.

        Raises
        ------
        ValueError
            If ``count`` is outside ``[0, p]``, ``p < 1`` or ``noise_scale < 0``.
        """
        if p < 1 or not 0 <= count <= p or noise_scale < 0:
            raise ValueError(
                f"need 0 <= count <= p, p >= 1 and noise_scale >= 0, got count {count}, p {p}, "
                f"noise_scale {noise_scale}"
            )
        w = Fraction(int(count), int(p))
        prior = w * Fraction(self.point_mean, VALUE_UNITS)
        signal = (w * Fraction(self.point_spread, VALUE_UNITS)) ** 2
        noise = 2 * Fraction(int(noise_scale), VALUE_UNITS) ** 2
        weight = signal / (signal + noise) if signal + noise > 0 else Fraction(1)
        return prior + weight * (Fraction(int(share), VALUE_UNITS) - prior)

    def payout(self, share: int, count: int, p: int, noise_scale: int) -> int:
        """One owner's reward, micro-credits: ``floor(reward * clip(v_j, 0, n_j / p))``
        (:meth:`estimate`; the same arguments and errors)."""
        value = self.estimate(share, count, p, noise_scale)
        clipped = min(max(value, Fraction(0)), Fraction(int(count), int(p)))
        return math.floor(self.reward * clipped)

    def payouts(
        self, shares: Sequence[int], counts: Sequence[int], p: int, noise_scale: int
    ) -> tuple[int, ...]:
        """Every owner's reward (:meth:`payout`), micro-credits.

        Raises
        ------
        ValueError
            If the lengths differ or the counts are negative or do not sum to ``p``.
        """
        _check_counts(shares, counts, p)
        return tuple(
            self.payout(s, int(n), p, noise_scale) for s, n in zip(shares, counts, strict=True)
        )


@dataclass(frozen=True)
class ProportionalSplit:
    """The consumer's ``reward`` split exactly, in proportion to the owners' clipped noisy values.

    Owner j gets ``reward * max(s_j, 0) / sum_l max(s_l, 0)`` (largest remainder to the
    micro-credit, ties to the earlier owner); when no value is positive, the split follows the
    counts ``n_j / p``. The payouts sum to ``reward`` exactly, so each depends on every owner's
    noisy value: the release must protect owner j's own value from the others
    (:func:`payout_sensitivity` with ``reveals_other_values``), at up to four times the noise of
    :class:`ValueReward`.

    Attributes
    ----------
    reward : int
        Micro-credits split among the owners.
    """

    reward: int
    reveals_other_values: ClassVar[bool] = True
    name: ClassVar[str] = "proportional"

    def __post_init__(self) -> None:
        _check_amount(self.reward, "reward")

    def max_total(self) -> int:
        """The rule pays exactly ``reward``."""
        return self.reward

    def payouts(
        self, shares: Sequence[int], counts: Sequence[int], p: int, noise_scale: int = 0
    ) -> tuple[int, ...]:
        """Every owner's part of the reward (see the class), summing to ``reward``
        (``noise_scale`` is not used: the same signature as :meth:`ValueReward.payouts`)."""
        _check_counts(shares, counts, p)
        weights = [max(int(s), 0) for s in shares]
        if sum(weights) == 0:
            weights = [int(n) for n in counts]
        total = sum(weights)
        floors = [self.reward * w // total for w in weights]
        remainders = [self.reward * w % total for w in weights]
        left = self.reward - sum(floors)
        order = sorted(range(len(weights)), key=lambda i: (-remainders[i], i))
        for i in order[:left]:
            floors[i] += 1
        return tuple(floors)


RewardRule = ValueReward | ProportionalSplit


@dataclass(frozen=True)
class PayoutSensitivity:
    """The L1 sensitivities of the released values (see the module's Notes).

    Attributes
    ----------
    validation : float
        ``2 / m``: over all owners' values, one validation point replaced.
    owner : float
        One delivered point of an owner replaced: ``(p - 1) / p^2`` over the other owners'
        values, or ``2 / p + 2 (p - 1) / p^2`` over all of them when the reward rule shows
        every value to every owner.
    """

    validation: float
    owner: float


def payout_sensitivity(m: int, p: int, *, reveals_other_values: bool) -> PayoutSensitivity:
    """The sensitivities of a payout release, from the public ``m`` and ``p`` alone.

    Parameters
    ----------
    m : int
        ``|D_v|``, >= 1.
    p : int
        The summary's size, >= 1.
    reveals_other_values : bool
        Whether an owner's payout depends on the other owners' noisy values (the reward rule's
        ``reveals_other_values``).

    Returns
    -------
    PayoutSensitivity

    Raises
    ------
    ValueError
        If ``m`` or ``p`` is not an integer >= 1.

    Notes
    -----
    Derived in the Notes of :mod:`dpmarket.common.market.payouts`; checked by an adversarial test
    that searches for neighbouring validation sets and owner tables that move the values most.
    """
    m = check_positive_int(m, "m")
    p = check_positive_int(p, "p")
    others = (p - 1) / p**2
    owner = 2.0 / p + 2.0 * others if reveals_other_values else others
    return PayoutSensitivity(validation=2.0 / m, owner=owner)


def payout_noise_scale(m: int, p: int, epsilon: float, rule: RewardRule) -> float:
    """The Laplace scale of a payout release: ``max(D_V, D_O) / epsilon``.

    A function of public numbers only (``m``, ``p``, the payout epsilon and the reward rule), so
    an owner recomputes it from its terms and checks the statement's.

    Raises
    ------
    ValueError
        If ``m`` or ``p`` is not an integer >= 1 or ``epsilon`` not a finite number > 0.
    """
    eps = check_epsilon(epsilon, "payout epsilon")
    sens = payout_sensitivity(m, p, reveals_other_values=rule.reveals_other_values)
    return max(sens.validation, sens.owner) / eps


@dataclass(frozen=True)
class PayoutRelease:
    """A payout release: every owner's noisy value, its noise, its payout and its privacy cost.

    Attributes
    ----------
    owners : tuple of str, length K
    counts : ndarray of shape (K,), int64
        Delivered points per owner.
    values : ndarray of shape (K,), float64
        Noisy Shapley values (units of ``J``); exactly 0 for an owner with no delivered point.
    noise_scale : float
        The Laplace scale ``b`` added to every owner with a delivered point.
    epsilon : float
        The payout epsilon the release was calibrated to.
    sensitivity : PayoutSensitivity
    rule : ValueReward or ProportionalSplit
    payouts : tuple of int, length K
        Micro-credits per owner, a post-processing of ``values``.
    """

    owners: tuple[str, ...]
    counts: NDArray[np.int64]
    values: NDArray[np.float64]
    noise_scale: float
    epsilon: float
    sensitivity: PayoutSensitivity
    rule: RewardRule
    payouts: tuple[int, ...]

    @property
    def epsilon_validation(self) -> float:
        """``D_V / b`` (<= ``epsilon``): charged to the validation set's ledger."""
        return self.sensitivity.validation / self.noise_scale

    @property
    def epsilon_owner(self) -> float:
        """``D_O / b`` (<= ``epsilon``): charged to each owner with a delivered point."""
        return self.sensitivity.owner / self.noise_scale

    @property
    def charged_owners(self) -> tuple[str, ...]:
        """The owners whose ledgers the release charges: those with a delivered point."""
        return tuple(o for o, n in zip(self.owners, self.counts, strict=True) if n > 0)

    def owner_epsilon(self, owner: str) -> float:
        """What the release charges ``owner``'s ledger: ``epsilon_owner``, or 0 for an owner
        with no delivered point.

        Raises
        ------
        KeyError
            If ``owner`` is not an owner of the release.
        """
        n = dict(zip(self.owners, self.counts, strict=True))[owner]
        return self.epsilon_owner if n > 0 else 0.0

    def privacy_events(self) -> dict[str, list[PrivacyEvent]]:
        """The ledger events: ``{"validation": [...], "owners": [...]}`` (one Laplace event
        each; ``"owners"`` is what every charged owner's ledger records; a sensitivity of 0, when
        ``p = 1`` leaves no other owner's value to protect, records no owner event)."""
        b = self.noise_scale
        events: dict[str, list[PrivacyEvent]] = {"validation": [], "owners": []}
        for party, sens in (
            ("validation", self.sensitivity.validation),
            ("owners", self.sensitivity.owner),
        ):
            if sens > 0:
                events[party].append(PrivacyEvent("laplace", sens / b, sensitivity=sens, scale=b))
        return events

    def value_units(self) -> tuple[int, ...]:
        """The noisy values in nano-value units, as a statement records them."""
        return tuple(value_units(v) for v in self.values)


#: How a session's ledger labels the payout release's charges (one on the validation set, one on
#: the owners: every owner that released a point charged ``epsilon_owner`` to its own ledger).
PAYOUT_CHARGE_LABEL = "payout release (Laplace on the owners' values)"


def release_payouts(
    blocks: SummaryBlocks, epsilon: float, rule: RewardRule, noise: NoiseSource
) -> PayoutRelease:
    """Release every owner's noisy value and pay it by ``rule``.

    Parameters
    ----------
    blocks : SummaryBlocks
        The delivered summary against ``D_v`` (the curator computes them; they never leave it).
    epsilon : float
        The payout epsilon, > 0: each of ``epsilon_validation`` and ``epsilon_owner`` is at most
        this.
    rule : ValueReward or ProportionalSplit
    noise : NoiseSource
        Laplace draws (OpenDP's sampler in production; a seeded one in tests).

    Returns
    -------
    PayoutRelease

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0 or the summary is empty.

    Notes
    -----
    Sensitivity, calibration and what the release protects: the Notes of
    :mod:`dpmarket.common.market.payouts`. The exact values are computed here and dropped;
    only the noisy ones leave.
    """
    eps = check_epsilon(epsilon, "payout epsilon")
    if blocks.p < 1:
        raise ValueError("the summary is empty: there is nothing to attribute or pay for")
    sens = payout_sensitivity(blocks.m, blocks.p, reveals_other_values=rule.reveals_other_values)
    scale = payout_noise_scale(blocks.m, blocks.p, eps, rule)
    exact = embedding_shapley(blocks).values
    active = blocks.counts > 0
    values = np.zeros(blocks.n_owners, dtype=np.float64)
    values[active] = exact[active] + noise.laplace(scale, int(active.sum()))
    shares = tuple(value_units(v) for v in values)
    payouts = rule.payouts(shares, [int(n) for n in blocks.counts], blocks.p, value_units(scale))
    return PayoutRelease(
        owners=blocks.owners,
        counts=blocks.counts.copy(),
        values=values,
        noise_scale=scale,
        epsilon=eps,
        sensitivity=sens,
        rule=rule,
        payouts=payouts,
    )


def own_payout_sensitivity(
    counts: Sequence[int] | NDArray[np.int64],
    m: int,
    *,
    reveals_other_values: bool,
    weights: OwnWeights | None = None,
) -> PayoutSensitivity:
    """The sensitivities of the own-data release, from ``m`` and the delivered counts.

    Parameters
    ----------
    counts : sequence of int, length K
        Delivered points per owner (``>= 0``, at least one ``>= 1``).
    m : int
        ``|D_v|``, >= 1.
    reveals_other_values : bool
        Whether an owner's payout depends on the other owners' noisy values.
    weights : OwnWeights, optional
        ``own_weights(counts)``, if the caller has them already.

    Returns
    -------
    PayoutSensitivity
        ``validation = (2 / m) sum_j n_j E[1 / N_j]``; ``owner = 0``, or, when the rule
        reveals every value, ``max_i 2 E[1 / N_i] + 2 (n_i - 1) E[1 / N_i^2]``.

    Raises
    ------
    ValueError
        If ``m`` is not an integer >= 1 or the counts are negative, not integers or all 0.

    Notes
    -----
    Derived in the Notes of :mod:`dpmarket.common.market.payouts` ("The own-data release");
    checked by an adversarial test on neighbouring validation sets and owner tables.
    """
    m = check_positive_int(m, "m")
    n = np.asarray(counts)
    w = own_weights(n) if weights is None else weights
    if n.sum() < 1:
        raise ValueError(f"the counts {list(n)} deliver no point: there is nothing to release")
    validation = 2.0 / m * float(n @ w.inverse)
    owner = 0.0
    if reveals_other_values:
        active = n > 0
        owner = float(
            np.max(2.0 * w.inverse[active] + 2.0 * (n[active] - 1) * w.inverse_square[active])
        )
    return PayoutSensitivity(validation=validation, owner=owner)


def release_own_payouts(
    blocks: SummaryBlocks, epsilon: float, rule: RewardRule, noise: NoiseSource
) -> PayoutRelease:
    """Release every owner's own-data value with Laplace noise and pay it by ``rule``.

    The value is :func:`~dpmarket.common.market.attribution.own_shapley`'s.

    Parameters
    ----------
    blocks : SummaryBlocks
        The delivered summary against ``D_v`` (the curator computes them; they never leave it).
    epsilon : float
        The payout epsilon, > 0: ``epsilon_validation`` is this; ``epsilon_owner`` is 0 unless
        the rule shows every value to every owner.
    rule : ValueReward or ProportionalSplit
        Its payouts are computed from the released values as they are (the value rule's prior
        was fitted to the embedding game's values: a post-processing like any other, but not
        tuned to these).
    noise : NoiseSource

    Returns
    -------
    PayoutRelease
        ``values``: ``psi_j + Lap(b)`` for every owner with a delivered point, exactly 0 for
        the others; ``noise_scale = max(D_V, D_O) / epsilon`` (:func:`own_payout_sensitivity`).

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0 or the summary is empty.

    Notes
    -----
    Sensitivity and calibration: the Notes of :mod:`dpmarket.common.market.payouts`, "The
    own-data release". The exact values are computed here and dropped.
    """
    eps = check_epsilon(epsilon, "payout epsilon")
    if blocks.p < 1:
        raise ValueError("the summary is empty: there is nothing to attribute or pay for")
    weights = own_weights(blocks.counts)
    sens = own_payout_sensitivity(
        blocks.counts, blocks.m, reveals_other_values=rule.reveals_other_values, weights=weights
    )
    scale = max(sens.validation, sens.owner) / eps
    exact = own_shapley(blocks, weights=weights).values
    active = blocks.counts > 0
    values = np.zeros(blocks.n_owners, dtype=np.float64)
    values[active] = exact[active] + noise.laplace(scale, int(active.sum()))
    shares = tuple(value_units(v) for v in values)
    payouts = rule.payouts(shares, [int(n) for n in blocks.counts], blocks.p, value_units(scale))
    return PayoutRelease(
        owners=blocks.owners,
        counts=blocks.counts.copy(),
        values=values,
        noise_scale=scale,
        epsilon=eps,
        sensitivity=sens,
        rule=rule,
        payouts=payouts,
    )
