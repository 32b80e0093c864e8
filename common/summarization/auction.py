"""PrivAuction: which owners the curator asks for their best point in a round.

The curator ranks the owners by bid, always asks the top bidder, asks the owner of rank ``r``
independently with probability ``exp(-eps_auc (r - 1))``, and also asks for any point that has been
its owner's best point ``tau`` times (Algorithm 3 as printed, variant ``"paper"``). Variant
``"pure"`` asks rank ``r`` with probability ``e^eps_auc / (1 + e^eps_auc) * exp(-eps_auc (r - 1))``,
rank 1 included, which makes every bad iteration pure ``eps_auc``-DP
(:func:`choose_owners_to_ask`, Notes). The rest of the round (the pool of acquired points, verifying
bids against the raw points, adding the pool point with the largest bid) is protocol logic in the
curator; this module holds the pure, randomized decision.

References
----------
Summarization paper, Algorithm 3, steps 11-16; appendix D (proof of Theorem 6, Lemma 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

#: PrivAuction variants: Algorithm 3 as printed, or the pure-DP variant.
AuctionVariant = Literal["paper", "pure"]
AUCTION_VARIANTS: tuple[AuctionVariant, ...] = ("pure", "paper")

__all__ = [
    "AUCTION_VARIANTS",
    "AuctionParams",
    "AuctionVariant",
    "ask_probabilities",
    "auction_events",
    "auction_parameters",
    "choose_owners_to_ask",
    "expected_points_per_round",
    "iteration_limit",
    "parsimony_bound",
    "rank_owners",
    "repeat_limit",
]


@dataclass(frozen=True)
class AuctionParams:
    """Parameters of PrivAuction.

    Attributes
    ----------
    eps_auc : float
        Privacy parameter of one bad iteration (epsilon units), > 0; rank ``r`` is asked with
        probability ``exp(-eps_auc (r - 1))``.
    tau : int
        A point that has been its owner's best point ``tau`` times is asked for, >= 1.
    variant : {"paper", "pure"}, default "paper"
        ``"paper"``: rank 1 always asked (Algorithm 3 as printed; each bad iteration is
        ``(eps_auc, 1 - exp(-eps_auc))``-DP). ``"pure"``: every rank's probability scaled by
        ``e^eps_auc / (1 + e^eps_auc)`` (each bad iteration pure ``eps_auc``-DP).

    Raises
    ------
    ValueError
        If ``eps_auc`` is not a finite number > 0, ``tau`` is not an integer >= 1 or
        ``variant`` is unknown.

    References
    ----------
    Summarization paper, Algorithm 3 (inputs ``eps_auc``, ``tau``; steps 12-14).
    """

    eps_auc: float
    tau: int
    variant: AuctionVariant = "paper"

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps_auc", check_epsilon(self.eps_auc, "eps_auc"))
        object.__setattr__(self, "tau", check_positive_int(self.tau, "tau"))
        if self.variant not in AUCTION_VARIANTS:
            raise ValueError(
                f"auction variant must be one of {AUCTION_VARIANTS}, got {self.variant!r}"
            )


def auction_parameters(
    epsilon: float, delta: float, n_owners: int, *, variant: AuctionVariant = "paper"
) -> AuctionParams:
    """The auction parameters of Appendix D for a target ``(epsilon, delta)`` and ``K`` owners.

    ``eps_auc = epsilon / (3 sqrt(2 log(1/delta))) * K**(-1/3)`` and ``tau = ceil(K**(2/3))``.

    Parameters
    ----------
    epsilon : float
        Target epsilon of the auction's releases to one owner, > 0.
    delta : float
        Target delta, in (0, 1) (the paper's theorems assume ``delta < 1/e``).
    n_owners : int
        Number of owners ``K``, >= 1.
    variant : {"paper", "pure"}, default "paper"
        See :class:`AuctionParams`.

    Returns
    -------
    AuctionParams

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0, ``delta`` is not in (0, 1), or ``n_owners`` is
        not an integer >= 1.

    Notes
    -----
    The paper sets ``tau = K**(2/3)``, which is not an integer in general. ``tau`` counts
    iterations, so it is rounded up (``K**(2/3)`` is first snapped to the nearest integer when
    within ``1e-9`` of it, so that ``K = 8`` gives 4 whatever the floating-point rounding).
    Rounding up keeps the paper's parsimony (at most ``p K / tau <= p K**(1/3)`` forced asks); it
    can add less than one iteration to the ``tau`` iterations over which the privacy proof composes,
    so the ledger must compose over the integer ``tau`` returned here, not over ``K**(2/3)``.

    References
    ----------
    Appendix D, proof of Theorem 6 ("We set eps_auc = ... and tau = K^(2/3)").
    """
    eps = check_epsilon(epsilon)
    dlt = check_delta(delta)
    k = check_positive_int(n_owners, "n_owners")
    eps_auc = eps / (3.0 * math.sqrt(2.0 * math.log(1.0 / dlt))) * k ** (-1.0 / 3.0)
    t = k ** (2.0 / 3.0)
    nearest = round(t)
    tau = int(nearest) if abs(t - nearest) <= 1e-9 else math.ceil(t)
    return AuctionParams(eps_auc=eps_auc, tau=max(tau, 1), variant=variant)


def auction_events(params: AuctionParams) -> list[PrivacyEvent]:
    """What PrivAuction's winner notification costs each owner: ``tau`` bad iterations.

    Returns
    -------
    list of PrivacyEvent
        ``"pure"`` variant: ``tau`` pure ``eps_auc`` events. ``"paper"`` variant: ``tau``
        approximate ``(eps_auc, 1 - exp(-eps_auc))`` events (the "not asked" event has no bounded
        ratio at rank 1, :func:`choose_owners_to_ask`, Notes).

    References
    ----------
    Appendix D, proof of Theorem 6 (at most ``tau`` bad iterations per point).
    """
    if params.variant == "pure":
        return [PrivacyEvent("pure", params.eps_auc, params.tau)]
    return [
        PrivacyEvent("approximate", params.eps_auc, params.tau, delta=-math.expm1(-params.eps_auc))
    ]


def ask_probabilities(n_bidding: int, params: AuctionParams) -> NDArray[np.float64]:
    """Probability that the owner of each rank ``1..n_bidding`` is asked by the coin flips.

    ``"paper"``: ``exp(-eps_auc (r - 1))`` (rank 1: 1). ``"pure"``:
    ``e^eps_auc / (1 + e^eps_auc) * exp(-eps_auc (r - 1))``.

    Returns
    -------
    ndarray of shape (n_bidding,), float64

    Raises
    ------
    ValueError
        If ``n_bidding`` is not an integer >= 0.
    """
    if isinstance(n_bidding, bool) or int(n_bidding) != n_bidding or n_bidding < 0:
        raise ValueError(f"n_bidding must be an integer >= 0, got {n_bidding}")
    probs = np.exp(-params.eps_auc * np.arange(int(n_bidding), dtype=np.float64))
    if params.variant == "pure":
        # e^x / (1 + e^x), computed as 1 / (1 + e^-x) to avoid overflow for large x.
        probs = probs / (1.0 + math.exp(-params.eps_auc))
    return probs


def _check_bids(bids: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(bids)
    if arr.ndim != 1:
        raise ValueError(
            f"bids must be a 1-D array with one entry per owner, got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"bids must hold real numbers, got dtype {arr.dtype}")
    out = np.asarray(arr, dtype=np.float64)
    inf = np.isinf(out)
    if inf.any():
        raise ValueError(
            f"bids must be finite or NaN (no bid), got {out[inf][0]} for owner "
            f"{int(np.flatnonzero(inf)[0])}"
        )
    return out


def rank_owners(bids: ArrayLike) -> NDArray[np.int64]:
    """Owner indices by decreasing bid; ties to the lower owner index; owners without a bid dropped.

    Parameters
    ----------
    bids : array-like of shape (K,), float64
        ``bids[i]`` is owner ``i``'s bid, NaN when owner ``i`` did not bid this round (no unsent
        points left, or it failed to answer).

    Returns
    -------
    ndarray of shape (n_bidding,), int64
        ``out[r - 1]`` is the owner of rank ``r``; ``n_bidding`` is the number of non-NaN bids.

    Raises
    ------
    ValueError
        If ``bids`` is not 1-D, not real, or holds +-inf.

    References
    ----------
    Summarization paper, Algorithm 3, step 12 (order the owners by decreasing bid).
    """
    b = _check_bids(bids)
    bidding = np.flatnonzero(~np.isnan(b))
    order = np.argsort(-b[bidding], kind="stable")
    return bidding[order].astype(np.int64)


def choose_owners_to_ask(
    bids: ArrayLike,
    times_best: ArrayLike,
    params: AuctionParams,
    rng: np.random.Generator,
) -> NDArray[np.bool_]:
    """Decide which owners the curator asks for their current best point (PrivAuction).

    Variant ``"paper"``: the owner of rank 1 is always asked; the owner of rank ``r >= 2`` is
    asked independently with probability ``exp(-eps_auc (r - 1))``. Variant ``"pure"``: the owner
    of rank ``r >= 1`` is asked independently with probability
    ``e^eps_auc / (1 + e^eps_auc) * exp(-eps_auc (r - 1))``. In both, every bidding owner with
    ``times_best >= tau`` is asked too. Owners with a NaN bid are never asked.

    Parameters
    ----------
    bids : array-like of shape (K,), float64
        One bid per owner, NaN for "no bid" (see :func:`rank_owners`).
    times_best : array-like of shape (K,), int64
        ``times_best[i]`` is the number of rounds, this one included, in which owner ``i``'s current
        best point has been its best point (not necessarily consecutive rounds: Algorithm 3's
        "chosen tau times"); >= 0. Ignored for owners with a NaN bid.
    params : AuctionParams
    rng : numpy.random.Generator
        Source of the coins. Variant ``"paper"``: exactly ``n_bidding - 1`` uniforms are drawn
        (none if fewer than two owners bid), as ``rng.random(n_bidding - 1)``, the ``j``-th for
        rank ``j + 2``; variant ``"pure"``: ``rng.random(n_bidding)``, the ``j``-th for rank
        ``j + 1``; whether or not that owner is also forced by ``tau``, so the same seed gives the
        same coins.

    Returns
    -------
    ndarray of shape (K,), bool
        ``True`` for the owners to ask.

    Raises
    ------
    ValueError
        If ``bids`` is not 1-D real or holds +-inf, or ``times_best`` is not a 1-D integer array of
        the same length with entries >= 0.

    Notes
    -----
    Privacy (appendix D, proof of Theorem 6). Fix an owner ``j`` and neighbouring unions of the
    other owners' data ``D`` and ``D' = D + {x}``, ``x`` held by owner ``i' != j``. An iteration is
    *bad* if ``x`` is ``i'``'s best point (the paper also requires that ``x`` is not acquired; the
    iteration in which it is acquired is counted here as well). Only in such an iteration can ``x``
    change the ranking seen by ``j``, and then only by moving ``j`` down one rank, ``r -> r + 1``;
    the probability that ``j`` is asked changes by the factor
    ``exp(-eps_auc (r - 1)) / exp(-eps_auc r) = exp(eps_auc)``. A point that has been its owner's
    best ``tau`` times is asked for and never offered again, so there are at most ``tau`` bad
    iterations per point, and the auction's queries to ``j`` compose at most ``tau`` such
    mechanisms (Theorem 7; the paper's ``eps_auc`` and ``tau = K**(2/3)`` give
    ``epsilon / 3 + O(epsilon**2)``).

    The factor above bounds the event "``j`` is asked". Under variant ``"paper"`` the
    complementary event, "``j`` is not asked", has probabilities ``1 - exp(-eps_auc (r - 1))`` and
    ``1 - exp(-eps_auc r)``, whose ratio tends to ``r / (r - 1)`` for small ``eps_auc`` and is
    unbounded for ``r = 1`` (rank 1 is always asked, rank 2 is not always). A bad iteration is
    therefore ``(eps_auc, 1 - exp(-eps_auc))``-DP rather than pure ``eps_auc``-DP for an owner
    that observes whether it was asked, and :func:`auction_events` charges it so.

    Variant ``"pure"`` asks rank ``r`` with ``q_r = a exp(-eps_auc (r - 1))``, ``a = e^eps_auc /
    (1 + e^eps_auc)``. "Asked": ``q_r / q_{r+1} = e^eps_auc``. "Not asked": ``(1 - q_{r+1}) /
    (1 - q_r)`` grows as ``r`` falls, so its largest value is at ``r = 1``:
    ``(1 - a e^-eps_auc) / (1 - a) = (e^eps_auc / (1 + e^eps_auc)) / (1 / (1 + e^eps_auc)) =
    e^eps_auc``. Both events change by at most ``e^eps_auc`` when ``j`` moves one rank, so a bad
    iteration is pure ``eps_auc``-DP (rank 1 is asked as in randomized response). The price: a
    round may ask nobody; the curator then bids again (the points' ``times_best`` grow, and the
    ``tau`` rule forces an ask within ``tau`` rounds).

    References
    ----------
    Summarization paper, Algorithm 3, steps 12-14; appendix D, proof of Theorem 6.
    """
    b = _check_bids(bids)
    k = b.shape[0]
    tb = np.asarray(times_best)
    if tb.ndim != 1 or tb.shape[0] != k:
        raise ValueError(f"times_best must have shape ({k},) to match bids, got {tb.shape}")
    if tb.size and not np.issubdtype(tb.dtype, np.integer):
        raise ValueError(f"times_best must hold integers, got dtype {tb.dtype}")
    tb = tb.astype(np.int64)
    if (tb < 0).any():
        bad = int(np.flatnonzero(tb < 0)[0])
        raise ValueError(f"times_best must be >= 0, got {int(tb[bad])} for owner {bad}")

    ranked = rank_owners(b)
    ask = np.zeros(k, dtype=np.bool_)
    n_bidding = ranked.shape[0]
    if n_bidding == 0:
        return ask
    probs = ask_probabilities(n_bidding, params)
    if params.variant == "pure":
        ask[ranked] = rng.random(n_bidding) < probs
    else:
        ask[ranked[0]] = True
        if n_bidding > 1:
            ask[ranked[1:]] = rng.random(n_bidding - 1) < probs[1:]
    ask[ranked] |= tb[ranked] >= params.tau
    return ask


def expected_points_per_round(n_bidding: int, eps_auc: float) -> float:
    """Expected number of owners asked by the coin flips in one round.

    ``sum_{r=1}^{n_bidding} exp(-eps_auc (r - 1)) = (1 - exp(-eps_auc n)) / (1 - exp(-eps_auc))``,
    not counting owners forced by the ``tau`` rule.

    Parameters
    ----------
    n_bidding : int
        Number of owners that bid, >= 0.
    eps_auc : float
        Auction epsilon, > 0.

    Returns
    -------
    float
        Between ``min(n_bidding, 1)`` and ``min(n_bidding, 1 + 1 / eps_auc)``.

    Raises
    ------
    ValueError
        If ``n_bidding`` is not an integer >= 0 or ``eps_auc`` is not a finite number > 0.

    References
    ----------
    Appendix D, Lemma 5 (proof, first step).
    """
    if isinstance(n_bidding, bool) or int(n_bidding) != n_bidding or n_bidding < 0:
        raise ValueError(f"n_bidding must be an integer >= 0, got {n_bidding}")
    x = check_epsilon(eps_auc, "eps_auc")
    n = int(n_bidding)
    # -expm1(-y) = 1 - exp(-y), accurate for small eps_auc.
    return float(-math.expm1(-x * n) / -math.expm1(-x)) if n > 0 else 0.0


def parsimony_bound(p: int, n_owners: int, params: AuctionParams, validation_size: int) -> float:
    """Lemma 5's bound, corrected, on the expected number of raw points the curator accesses.

    ``p (1 + 1 / eps_auc + K / tau) + m``.

    Parameters
    ----------
    p : int
        Summary size (number of rounds), >= 1.
    n_owners : int
        Number of owners ``K``, >= 1.
    params : AuctionParams
    validation_size : int
        ``m = |D_v|``, >= 1: the validation points the curator holds.

    Returns
    -------
    float
        Upper bound on the expected number of points accessed (auction asks plus validation set).

    Raises
    ------
    ValueError
        If an argument is not an integer >= 1.

    Notes
    -----
    Two corrections to Lemma 5 as printed:

    * The statement prints ``p (K tau + 1 / eps_auc)``; its proof (and the stated equality with
      ``(1 + 3 sqrt(2 log(1/delta)) / epsilon) p K**(1/3)``) gives ``p K / tau``: over ``p`` rounds
      there are ``p K`` (owner, round) best-point slots and each point forced by the ``tau`` rule
      uses ``tau`` of them.
    * The proof bounds the coin-flip asks per round by
      ``sum_r exp(-eps_auc (r - 1)) <= 1 / (1 - exp(-eps_auc)) <= 1 / eps_auc``, but the last
      inequality is the wrong way round: ``1 - exp(-x) < x``, so ``1 / (1 - exp(-x)) > 1 / x``. The
      correct bound is ``1 / (1 - exp(-x)) <= 1 / x + 1`` (equivalent to ``exp(x) >= 1 + x``), hence
      the ``+ 1`` per round here, i.e. ``p`` more points than the printed bound.

    The bound is on the expectation (the coin flips); the forced asks are bounded surely.

    References
    ----------
    Appendix D, Lemma 5; Summarization paper, Section 2 (rho-parsimonious curator).
    """
    p = check_positive_int(p, "p")
    k = check_positive_int(n_owners, "n_owners")
    m = check_positive_int(validation_size, "validation_size")
    return p * (1.0 + 1.0 / params.eps_auc + k / params.tau) + m


def repeat_limit(params: AuctionParams | None) -> int:
    """How many auction iterations in a row may acquire no point with the session bidding again;
    one more aborts it.

    An iteration acquires nothing when the auction asks nobody (the pure variant) or every point
    it received failed verification, and the pool is empty; the session then bids again. The
    ``tau`` rule forces an ask within ``tau`` iterations, so ``tau + 1`` repeats are allowed;
    without an auction (non-private greedy, which always asks its top bidder) only one, after an
    owner's point failed verification.

    Parameters
    ----------
    params : AuctionParams or None
        The session's auction, or ``None`` for the non-private greedy.

    Returns
    -------
    int, >= 1
    """
    return (params.tau if params is not None else 0) + 1


def iteration_limit(summary_size: int, params: AuctionParams | None) -> int:
    """The most auction iterations (Bid rounds at every owner) a session of ``p`` points runs.

    Each summary point takes at most ``repeat_limit(params) + 1`` iterations: up to
    :func:`repeat_limit` that acquire nothing, then one that acquires a point (or the one more
    empty iteration after which the session aborts). The per-round methods' terms state this
    bound and each owner refuses a Bid beyond it
    (:class:`~dpmarket.common.summarization.terms.OwnerTerms`).

    Parameters
    ----------
    summary_size : int
        ``p``, >= 1.
    params : AuctionParams or None
        As :func:`repeat_limit`.

    Returns
    -------
    int
        ``p * (repeat_limit(params) + 1)``.

    Raises
    ------
    ValueError
        If ``summary_size`` is not an integer >= 1.
    """
    p = check_positive_int(summary_size, "summary_size")
    return p * (repeat_limit(params) + 1)
