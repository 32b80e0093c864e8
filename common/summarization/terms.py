"""What a summarization session spends of each owner's privacy: the terms an owner is offered.

Before a session opens, the curator tells every owner what the whole session will cost its data
(:class:`OwnerTerms`); the owner checks the terms against its own policy and charges them to its own
ledger before its first release. The terms are computed here, from the session's configuration
alone, by the same event lists the curator's ledger charges
(:mod:`dpmarket.common.summarization.calibration`), so that what an owner is told and what the
session charges cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.summarization.calibration import paper_mode_events, rounds_mode_events
from dpmarket.common.summarization.summary import SummarizationConfig
from dpmarket.common.validation import check_positive_int

__all__ = ["OwnerTerms", "approximate_delta", "owner_terms"]


@dataclass(frozen=True)
class OwnerTerms:
    """The privacy a session spends of one owner's data, as offered to the owner.

    Attributes
    ----------
    mechanism : str
        Description for the owner's ledger.
    epsilon : float
        epsilon of the whole session with respect to one owner's data (replace one point of one
        owner's data); ``0`` when the session releases only raw points (uniform sampling);
        ``inf`` for a non-private session.
    delta : float
        The delta at which ``epsilon`` holds, in ``[0, 1)``.
    non_private : bool
        The session releases exact statistics of the owners' data to the other owners.

    Raises
    ------
    ValueError
        If ``epsilon`` is negative or NaN, infinite without ``non_private``, or ``delta`` is
        outside ``[0, 1)``.
    """

    mechanism: str
    epsilon: float
    delta: float
    non_private: bool = False

    def __post_init__(self) -> None:
        eps, dl = float(self.epsilon), float(self.delta)
        if math.isnan(eps) or eps < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if math.isinf(eps) and not self.non_private:
            raise ValueError("an infinite epsilon is only meaningful for non-private terms")
        if not (math.isfinite(dl) and 0.0 <= dl < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dl)


def approximate_delta(events: list[PrivacyEvent]) -> float:
    """Probability mass of infinite privacy loss that approximate events add.

    ``1 - prod (1 - delta_l)^count_l`` over the ``"approximate"`` events (the PLD of an
    ``(epsilon, delta)``-DP event has infinite loss with probability ``delta``); Gaussian events'
    deltas are not included: their PLDs are exact.
    """
    log_keep = sum(e.count * math.log1p(-e.delta) for e in events if e.mechanism == "approximate")
    return -math.expm1(log_keep)


def _composed(events: list[PrivacyEvent], base_delta: float, label: str) -> OwnerTerms:
    """``(pld_epsilon(events, delta), delta)`` with ``delta`` the base delta plus the
    approximate events' infinite-loss mass (:func:`approximate_delta`)."""
    delta = base_delta + approximate_delta(events)
    if delta >= 1.0:
        raise ValueError(f"{label}: the session's delta {delta:.6g} is not below 1")
    return OwnerTerms(label, pld_epsilon(events, delta) if events else 0.0, delta)


def owner_terms(
    config: SummarizationConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    """The terms of a session of ``config`` with ``n_owners`` owners.

    Parameters
    ----------
    config : SummarizationConfig
    n_owners : int
        ``K``, the owners the session opens with (PrivAuction's parameters depend on it), >= 1.
    validation_size : int
        ``m = |D_v|``, >= 1.
    seed_set_size : int
        Size of the public seed set, >= 0.
    sketch_allocation : bool
        Candidates method: whether the session splits its budget by the owners' published
        sketches (the session decides: ``config.allocation == "sketch"`` and every owner has
        one) rather than by their noisy relevance counts.

    Returns
    -------
    OwnerTerms
        * ``"uniform"``: ``(0, 0)``: only raw points, which the owner's point limits bound.
        * ``"greedy"``: non-private (exact embeddings of acquired points reach every owner).
        * ``"candidates"``: ``(epsilon_owners_total, 0)``: the one Laplace release of the
          relevance counts, whose noise the owner draws itself; with the sketch allocation
          ``(0, 0)``: the owners release only raw points to the trusted curator, and the shares
          they receive are post-processing of the published sketches (whose epsilon their
          publication charged once) and of a release about D_v.
        * ``"private"``: the PLD epsilon of :func:`paper_mode_events`'s owner events at
          ``delta_owners`` plus, for the printed auction, its infinite-loss mass.
        * ``"rounds"``: the same for :func:`rounds_mode_events` at ``delta``.

    Raises
    ------
    ValueError
        If an integer argument is out of range, or the printed auction's delta reaches 1.

    Notes
    -----
    Everything an owner receives in a session is post-processing of the releases these events
    describe, so the terms bound what the session reveals to an owner about the other owners'
    data (the neighbouring relation of the ledger's ``"owners"`` party). The PLD epsilon at a
    delta above the approximate events' mass is finite and sound: the PLD of an
    ``(epsilon, delta)`` event puts mass ``delta`` on infinite loss, which a composition's delta
    must cover.
    """
    k = check_positive_int(n_owners, "n_owners")
    m = check_positive_int(validation_size, "validation_size")
    method = config.method
    if method == "uniform":
        return OwnerTerms("uniform sample: raw points only", 0.0, 0.0)
    if method == "greedy":
        return OwnerTerms("non-private greedy: exact embeddings", math.inf, 0.0, non_private=True)
    if method == "candidates" and sketch_allocation:
        return OwnerTerms("candidates by published sketches: raw points only", 0.0, 0.0)
    if method == "candidates":
        return OwnerTerms("Laplace relevance count", config.epsilon_owners_total, 0.0)
    if method == "private":
        events = paper_mode_events(config, k, seed_set_size=seed_set_size)["owners"]
        label = f"h2 summary embeddings + PrivAuction ({config.auction})"
        return _composed(events, config.delta_owners, label)
    events = rounds_mode_events(config, k, validation_size=m, seed_set_size=seed_set_size)["owners"]
    label = f"{config.summary_release} summary release + PrivAuction ({config.auction})"
    return _composed(events, config.delta, label)
