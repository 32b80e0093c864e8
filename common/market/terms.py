"""A session's market terms: its quote, fixed before anything is charged, that each owner checks.

The curator quotes a request from every owner's published prices and the session's terms
(:func:`session_quote`: the most raw points it may read from each owner, the epsilon the terms
charge and the payout release's), checks the consumer's cap against the quote
(:func:`~dpmarket.common.market.pricing.check_cap`) and only then opens the session, sending each
owner its own part (:class:`MarketTerms`: its line of the quote and the settlement the terms fix).
The owner recomputes its charge at those limits from its *own* prices and refuses a quote below
them (:func:`check_quote`); it then releases no more raw points than its line's
``max_points_read``, so the quote bounds what the statement can say
(:func:`~dpmarket.common.market.statement.settle` checks every line against it).

Epsilon is priced when finite. A non-private session (terms' epsilon ``inf``, the greedy
baseline) has no price per unit of epsilon: it is priced at 0 epsilon when the owner's
``per_epsilon`` is 0, and refused by an owner that prices epsilon (:func:`priced_epsilon`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.money import epsilon_units, format_credits
from dpmarket.common.market.payouts import PayoutRelease, payout_noise_scale, payout_sensitivity
from dpmarket.common.market.pricing import (
    Charge,
    OwnerLimits,
    OwnerPrices,
    Quote,
    QuoteLine,
    owner_charge,
    quote,
)
from dpmarket.common.market.statement import NO_SUMMARY, REWARD_RULES, SettlementTerms
from dpmarket.common.privacy.accounting import PrivacyEvent

__all__ = [
    "FREE",
    "NO_REWARD",
    "MarketTerms",
    "QuoteRefusedError",
    "RewardOffer",
    "cape_quote",
    "check_quote",
    "owner_payout_epsilon",
    "owner_payout_event",
    "priced_epsilon",
    "quote_from_json",
    "quote_to_json",
    "release_from_json",
    "release_to_json",
    "session_quote",
    "silent_release",
]

#: The prices of an owner that sets none (and of one that publishes none): free.
FREE = OwnerPrices()


@dataclass(frozen=True)
class RewardOffer:
    """A consumer's value-based reward, as it asks for it: paid on top of the owners' prices and
    split among them by the private payout release
    (:func:`~dpmarket.common.market.payouts.release_payouts`).

    Attributes
    ----------
    rule : {"none", "value", "proportional"}
        :class:`~dpmarket.common.market.payouts.ValueReward` or
        :class:`~dpmarket.common.market.payouts.ProportionalSplit`; ``"none"``: no reward and no
        payout release.
    amount : int
        Micro-credits (per unit of value, or split), > 0 with a rule, 0 without.
    epsilon : float
        The payout release's epsilon, finite and > 0 with a rule, 0 without.

    Raises
    ------
    ValueError
        If the rule is unknown or the three do not agree.
    """

    rule: str = "none"
    amount: int = 0
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        if self.rule not in REWARD_RULES:
            raise ValueError(f"reward rule must be one of {REWARD_RULES}, got {self.rule!r}")
        amount = self.amount
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"reward amount must be an int of micro-credits >= 0, got {amount!r}")
        eps = float(self.epsilon)
        if self.rule == "none":
            if amount != 0 or eps != 0:
                raise ValueError(
                    f"a reward amount ({amount}) or payout epsilon ({eps}) needs a reward rule "
                    "(value or proportional)"
                )
        else:
            if amount == 0:
                raise ValueError(f"a {self.rule} reward needs an amount > 0 micro-credits")
            if not (math.isfinite(eps) and eps > 0):
                raise ValueError(
                    f"a {self.rule} reward needs a payout epsilon that is finite and > 0, "
                    f"got {self.epsilon}"
                )
            epsilon_units(eps)
        object.__setattr__(self, "epsilon", eps)

    def settlement(self, summary_size: int, validation_size: int) -> SettlementTerms:
        """The settlement terms of a session of ``p = summary_size`` and ``m =
        validation_size`` with this reward."""
        return SettlementTerms(
            summary_size=summary_size,
            validation_size=validation_size,
            payout_epsilon=self.epsilon,
            reward_rule=self.rule,
            reward=self.amount,
        )


#: No reward: the owners are paid their prices only.
NO_REWARD = RewardOffer()


class QuoteRefusedError(FailedPreconditionError):
    """An owner refuses a session's quote (``FAILED_PRECONDITION``): the quoted charge is below
    its prices at the terms' limits, or it prices what the terms cannot price. Nothing is
    charged; the message names public figures only (the owner's prices and the quote)."""


def priced_epsilon(epsilon: float, prices: OwnerPrices, owner: str) -> float:
    """The epsilon a session is priced at: the terms' own when finite.

    Parameters
    ----------
    epsilon : float
        The terms' epsilon (>= 0; ``inf`` for a non-private session).
    prices : OwnerPrices
    owner : str
        For the message.

    Returns
    -------
    float
        ``epsilon``, or 0 for a non-private session of an owner whose ``per_epsilon`` is 0.

    Raises
    ------
    QuoteRefusedError
        If ``epsilon`` is infinite and the owner prices epsilon.
    """
    if math.isfinite(epsilon):
        return float(epsilon)
    if prices.per_epsilon > 0:
        raise QuoteRefusedError(
            f"owner {owner} charges {format_credits(prices.per_epsilon)} credits per unit of "
            f"epsilon, and a non-private session (epsilon inf) has no price per unit: use a "
            f"private method, or leave the owner out"
        )
    return 0.0


def _limits(
    max_points_read: int, epsilon: float, payout_epsilon: float, prices: OwnerPrices, owner: str
) -> OwnerLimits:
    return OwnerLimits(max_points_read, priced_epsilon(epsilon, prices, owner), payout_epsilon)


def session_quote(
    prices: Mapping[str, OwnerPrices],
    max_points_read: Mapping[str, int],
    epsilon: float,
    settlement: SettlementTerms,
) -> Quote:
    """The most a session can cost, before anything is charged.

    Parameters
    ----------
    prices : mapping of str to OwnerPrices
        Every owner's published prices, by name (an owner that published none: :data:`FREE`).
    max_points_read : mapping of str to int
        The most raw points the session may read from each owner it asks (each owner enforces
        its own: it releases no more than its line states).
    epsilon : float
        The terms' epsilon on each owner's data (``inf``: non-private, :func:`priced_epsilon`).
    settlement : SettlementTerms
        p, m, the payout epsilon and the reward rule.

    Returns
    -------
    Quote
        One line per owner of ``max_points_read``, charged at its limits, plus the most the
        reward rule pays.

    Raises
    ------
    QuoteRefusedError
        If the session is non-private and an owner prices epsilon.
    ValueError
        If an owner has no prices or a count is negative.
    """
    limits = {
        owner: _limits(n, epsilon, settlement.payout_epsilon, prices.get(owner, FREE), owner=owner)
        for owner, n in max_points_read.items()
    }
    return quote(
        {o: prices.get(o, FREE) for o in limits},
        limits,
        settlement.summary_size,
        settlement.rule(),
    )


def cape_quote(prices: Mapping[str, OwnerPrices], epsilon: float) -> Quote:
    """The most a CAPE job can cost, before any owner opens it.

    A CAPE job reads no raw point and delivers none: each owner's ledger is charged the job's
    epsilon (``spec.cost``; a training's whole total), so its line is its price per unit epsilon
    at that epsilon, raised to its minimum (:data:`~dpmarket.common.market.statement.NO_SUMMARY`:
    p = 0, no reward). The settlement charges the epsilon the owner's ledger recorded, never
    more: the quote is its upper bound.

    Parameters
    ----------
    prices : mapping of str to OwnerPrices
        Every owner the job asks, by name (:data:`FREE` for one that publishes none).
    epsilon : float
        The epsilon each owner's ledger is charged, finite and >= 0.

    Returns
    -------
    Quote

    Raises
    ------
    ValueError
        If ``epsilon`` is not finite and >= 0.
    """
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"a CAPE job's epsilon must be finite and >= 0, got {epsilon}")
    return session_quote(prices, dict.fromkeys(prices, 0), epsilon, NO_SUMMARY)


@dataclass(frozen=True)
class MarketTerms:
    """One owner's part of a session's market terms, sent with its terms when the session opens.

    Attributes
    ----------
    max_points_read : int
        The most raw points the session reads from this owner (its line's limit); the owner
        releases no more.
    quoted_charge : int
        Its line's charge at those limits, micro-credits: the most it is paid for the releases.
    max_cost : int
        The quote's total, micro-credits (the most the consumer pays in all).
    settlement : SettlementTerms
        What the statement's header must state (p, m, payout epsilon, reward rule).

    Raises
    ------
    ValueError
        If a count or amount is not an int >= 0.
    """

    max_points_read: int
    quoted_charge: int
    max_cost: int
    settlement: SettlementTerms

    def __post_init__(self) -> None:
        for name in ("max_points_read", "quoted_charge", "max_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"market terms: {name} must be an int >= 0, got {value!r}")

    @classmethod
    def of(cls, quoted: Quote, owner: str, settlement: SettlementTerms) -> MarketTerms:
        """``owner``'s part of ``quoted``.

        Raises
        ------
        KeyError
            If the quote has no line for ``owner``.
        """
        line = quoted.line(owner)
        return cls(line.limits.max_points_read, line.charge.total, quoted.total, settlement)


def check_quote(
    prices: OwnerPrices, market: MarketTerms | None, epsilon: float, *, owner: str
) -> int:
    """An owner's check of its part of a session's quote against its own prices.

    Recomputes its charge at the line's limits (``max_points_read`` read,
    ``min(max_points_read, p)`` delivered, the terms' and the payout's epsilon, its minimum)
    from its own prices, and refuses a quoted charge below it.

    Parameters
    ----------
    prices : OwnerPrices
        The owner's prices (its policy's ``[prices]``).
    market : MarketTerms or None
        Its part of the quote; None: the curator sent none (refused unless the owner is free).
    epsilon : float
        The terms' epsilon.
    owner : str
        The owner's name, for messages.

    Returns
    -------
    int
        The owner's own charge at the limits, micro-credits (0 without market terms).

    Raises
    ------
    QuoteRefusedError
        If the owner has prices and the terms carry no quote, the quoted charge is below its
        own or above the terms' ``max_cost`` (the consumer's cap), or the session
        is non-private and the owner prices epsilon. The message states
        the owner's prices and the quote: public figures, no data.
    """
    if market is None:
        if prices != FREE:
            raise QuoteRefusedError(
                f"owner {owner} sells its data (its prices: {prices.as_table()} credits) and "
                "the session's terms carry no quote: use a curator that quotes its sessions"
            )
        return 0
    if market.quoted_charge > market.max_cost:
        raise QuoteRefusedError(
            f"the session's quote pays owner {owner} {format_credits(market.quoted_charge)} "
            f"credits, more than the consumer's cap (max_cost "
            f"{format_credits(market.max_cost)} credits) carried in the same terms: no "
            "statement of this session could pay it within the cap. Nothing charged; ask the "
            "curator to quote within the consumer's max_cost"
        )
    settlement = market.settlement
    limits = _limits(market.max_points_read, epsilon, settlement.payout_epsilon, prices, owner)
    own = owner_charge(
        prices,
        limits.max_points_read,
        min(limits.max_points_read, settlement.summary_size),
        limits.epsilon_units,
    )
    if market.quoted_charge < own.total:
        raise QuoteRefusedError(
            f"the session's quote pays owner {owner} at most "
            f"{format_credits(market.quoted_charge)} credits, below its prices' "
            f"{format_credits(own.total)} for up to {limits.max_points_read} points read and "
            f"epsilon {limits.epsilon:g} (+ payout {limits.payout_epsilon:g}); its prices: "
            f"{prices.as_table()} credits. Ask the curator to quote again"
        )
    return own.total


def quote_to_json(quoted: Quote) -> dict[str, Any]:
    """A quote as a JSON object (what a session's stored report holds): ``{"summary_size",
    "reward", "total", "lines": [{"owner", "limits": {...}, "charge": {...}}, ...]}``."""
    return {
        "summary_size": quoted.summary_size,
        "reward": quoted.reward,
        "total": quoted.total,
        "lines": [
            {"owner": line.owner, "limits": asdict(line.limits), "charge": asdict(line.charge)}
            for line in quoted.lines
        ],
    }


def quote_from_json(data: Mapping[str, Any]) -> Quote:
    """The inverse of :func:`quote_to_json`.

    Raises
    ------
    ValueError, TypeError, KeyError
        If ``data`` is not a quote's JSON object, or its total is not its lines' and reward's.
    """
    lines = tuple(
        QuoteLine(item["owner"], OwnerLimits(**item["limits"]), Charge(**item["charge"]))
        for item in data["lines"]
    )
    quoted = Quote(int(data["summary_size"]), lines, int(data["reward"]))
    if "total" in data and int(data["total"]) != quoted.total:
        raise ValueError(f"a quote's total {data['total']} is not its lines' {quoted.total}")
    return quoted


def owner_payout_event(settlement: SettlementTerms) -> PrivacyEvent | None:
    """The privacy event the payout release the terms fix charges each owner with a delivered
    point (a Laplace event at ``epsilon_owner = D_O / b``, :func:`owner_payout_epsilon`), as a
    session's ledger records it; None without a payout release or when ``D_O = 0`` (``p = 1``).
    The same event as :meth:`~dpmarket.common.market.payouts.PayoutRelease.privacy_events`'s
    ``"owners"``, from the public terms alone: an owner charges it before its first raw point
    leaves, so a session records it when the first point arrives, whether or not it ends."""
    rule = settlement.rule()
    if rule is None:
        return None
    m, p = settlement.validation_size, settlement.summary_size
    sens = payout_sensitivity(m, p, reveals_other_values=rule.reveals_other_values).owner
    if sens <= 0:
        return None
    scale = payout_noise_scale(m, p, settlement.payout_epsilon, rule)
    return PrivacyEvent("laplace", sens / scale, sensitivity=sens, scale=scale)


def owner_payout_epsilon(settlement: SettlementTerms) -> float:
    """What the payout release the terms fix charges an owner with a delivered point:
    ``epsilon_owner = D_O / b`` (<= the payout epsilon), 0 without a payout release
    (:meth:`~dpmarket.common.market.statement.SettlementTerms.owner_epsilon`). The owner
    charges it before its first raw point leaves, so every owner whose points the release is
    about has paid for it."""
    return settlement.owner_epsilon()


def silent_release(owners: Sequence[str], settlement: SettlementTerms) -> PayoutRelease | None:
    """The payout release of a session that delivered nothing (it failed): every owner's value
    and payout exactly 0, nothing released, under the terms' rule and noise scale (so that the
    statement's header states the settlement the terms fixed). None without a payout release."""
    rule = settlement.rule()
    if rule is None:
        return None
    m, p = settlement.validation_size, settlement.summary_size
    k = len(owners)
    return PayoutRelease(
        owners=tuple(owners),
        counts=np.zeros(k, dtype=np.int64),
        values=np.zeros(k, dtype=np.float64),
        noise_scale=payout_noise_scale(m, p, settlement.payout_epsilon, rule),
        epsilon=settlement.payout_epsilon,
        sensitivity=payout_sensitivity(m, p, reveals_other_values=rule.reveals_other_values),
        rule=rule,
        payouts=(0,) * k,
    )


def release_to_json(release: PayoutRelease) -> dict[str, Any]:
    """The parts of a payout release a statement needs, as JSON (the curator keeps them with a
    session until it is settled): owners, counts, noisy values (floats, exact in JSON), payouts."""
    return {
        "owners": list(release.owners),
        "counts": [int(n) for n in release.counts],
        "values": [float(v) for v in release.values],
        "payouts": list(release.payouts),
    }


def release_from_json(data: Mapping[str, Any], settlement: SettlementTerms) -> PayoutRelease:
    """The inverse of :func:`release_to_json`, under the settlement's rule.

    Raises
    ------
    ValueError, KeyError
        If ``data`` is malformed or the terms fix no payout release.
    """
    rule = settlement.rule()
    if rule is None:
        raise ValueError("the terms fix no payout release")
    m, p = settlement.validation_size, settlement.summary_size
    return PayoutRelease(
        owners=tuple(data["owners"]),
        counts=np.asarray(data["counts"], dtype=np.int64),
        values=np.asarray(data["values"], dtype=np.float64),
        noise_scale=payout_noise_scale(m, p, settlement.payout_epsilon, rule),
        epsilon=settlement.payout_epsilon,
        sensitivity=payout_sensitivity(m, p, reveals_other_values=rule.reveals_other_values),
        rule=rule,
        payouts=tuple(int(x) for x in data["payouts"]),
    )
