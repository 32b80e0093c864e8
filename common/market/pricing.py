"""Prices, charges and quotes: what a session may cost, known before anything is charged.

An owner's policy sets its prices (:class:`OwnerPrices`): per point the curator reads, per point
delivered in the summary, per unit of epsilon its ledger is charged, and a minimum per session.
A session's terms bound what it may take from each owner (:class:`OwnerLimits`: the points it may
read at most, the epsilon it charges). From the two, before any release, the curator quotes the
request's **maximum** cost (:func:`quote`): every owner's charge at its limits, plus the most the
consumer's reward rule can pay. The consumer's cap refuses a request whose quote exceeds it
(:func:`check_cap`), so a request over its cap is refused before anything is charged anywhere.

Every amount is an ``int`` of micro-credits and every epsilon an ``int`` of micro-epsilon
(:mod:`dpmarket.common.market.money`): the same inputs give the same integers at the curator, the
owner and the consumer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.money import (
    epsilon_charge,
    epsilon_units,
    format_credits,
    parse_credits,
)
from dpmarket.common.market.payouts import RewardRule

__all__ = [
    "PRICE_KEYS",
    "Charge",
    "CostCapExceededError",
    "OwnerLimits",
    "OwnerPrices",
    "Quote",
    "QuoteLine",
    "check_cap",
    "owner_charge",
    "quote",
]

#: The price keys of an owner's policy (``[prices]`` table), in credits as decimal strings.
PRICE_KEYS: tuple[str, ...] = ("per_point_read", "per_point_delivered", "per_epsilon", "minimum")


def _check_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


class CostCapExceededError(FailedPreconditionError):
    """A request's quoted maximum cost exceeds the consumer's cap (``FAILED_PRECONDITION``):
    the request is refused before any release, and nothing is charged anywhere."""


@dataclass(frozen=True)
class OwnerPrices:
    """An owner's prices, in micro-credits.

    Attributes
    ----------
    per_point_read : int
        Per raw point the curator reads from the owner (the points its ledger records as
        released).
    per_point_delivered : int
        Per point of the owner's in the delivered summary.
    per_epsilon : int
        Per unit of epsilon charged to the owner's ledger by the session and its payout release
        (``ceil(micro-epsilon * price / 10^6)``).
    minimum : int
        The least the owner is paid for taking part in a session.

    Raises
    ------
    ValueError
        If a price is not an int >= 0.
    """

    per_point_read: int = 0
    per_point_delivered: int = 0
    per_epsilon: int = 0
    minimum: int = 0

    def __post_init__(self) -> None:
        for key in PRICE_KEYS:
            _check_int(getattr(self, key), key)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "prices") -> OwnerPrices:
        """Prices from a policy table of credits (``{"per_point_read": "0.01", ...}``).

        Parameters
        ----------
        table : mapping
            Keys from :data:`PRICE_KEYS` (missing ones are 0); values decimal strings or ints
            of credits.
        where : str
            Where the table comes from, for error messages.

        Raises
        ------
        ValueError
            Naming ``where`` and the key, if a key is unknown or a value is not an amount of
            credits (:func:`~dpmarket.common.market.money.parse_credits`: floats are refused).
        """
        unknown = sorted(set(table) - set(PRICE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown price(s) {unknown}; the prices are {PRICE_KEYS}")
        values = {}
        for key in PRICE_KEYS:
            try:
                values[key] = parse_credits(table.get(key, 0))
            except ValueError as exc:
                raise ValueError(f"{where}.{key}: {exc}") from None
        return cls(**values)

    def as_table(self) -> dict[str, str]:
        """The prices as credits (decimal strings), the inverse of :meth:`from_table`."""
        return {key: format_credits(getattr(self, key)) for key in PRICE_KEYS}


@dataclass(frozen=True)
class Charge:
    """What one owner is paid for one session's releases, by component, in micro-credits.

    Attributes
    ----------
    points_read, points_delivered : int
    epsilon_units : int
        Micro-epsilon charged to the owner's ledger (session and payout release, each rounded
        up on its own).
    read, delivered, epsilon : int
        The price components: ``points_read * per_point_read``, ``points_delivered *
        per_point_delivered``, ``ceil(epsilon_units * per_epsilon / 10^6)``.
    minimum_topup : int
        What brings the components up to the owner's minimum (0 when they reach it).
    """

    points_read: int
    points_delivered: int
    epsilon_units: int
    read: int
    delivered: int
    epsilon: int
    minimum_topup: int

    @property
    def total(self) -> int:
        """The owner's charge, micro-credits: the components and the top-up."""
        return self.read + self.delivered + self.epsilon + self.minimum_topup


def owner_charge(
    prices: OwnerPrices, points_read: int, points_delivered: int, epsilon_units: int
) -> Charge:
    """An owner's charge for a session's releases.

    Parameters
    ----------
    prices : OwnerPrices
    points_read : int
        Raw points the curator read from the owner, >= 0.
    points_delivered : int
        Of them, points in the delivered summary, ``<= points_read``.
    epsilon_units : int
        Micro-epsilon charged to the owner's ledger, >= 0.

    Returns
    -------
    Charge

    Raises
    ------
    ValueError
        If a count is not an int >= 0, or more points are delivered than read.
    """
    read = _check_int(points_read, "points_read")
    delivered = _check_int(points_delivered, "points_delivered")
    units = _check_int(epsilon_units, "epsilon_units")
    if delivered > read:
        raise ValueError(f"{delivered} points delivered but only {read} read from the owner")
    components = (
        read * prices.per_point_read,
        delivered * prices.per_point_delivered,
        epsilon_charge(units, prices.per_epsilon),
    )
    topup = max(0, prices.minimum - sum(components))
    return Charge(read, delivered, units, *components, topup)


@dataclass(frozen=True)
class OwnerLimits:
    """What a session's terms allow it to take from one owner: the quote's inputs.

    Attributes
    ----------
    max_points_read : int
        The most raw points the session may read from the owner.
    epsilon : float
        The session's epsilon on the owner's data (its terms), finite and >= 0.
    payout_epsilon : float
        The most the payout release charges the owner's ledger (0 without a payout release).

    Raises
    ------
    ValueError
        If a value is out of range (an infinite epsilon, a non-private session, has no price).
    """

    max_points_read: int
    epsilon: float
    payout_epsilon: float = 0.0

    def __post_init__(self) -> None:
        _check_int(self.max_points_read, "max_points_read")
        epsilon_units(self.epsilon)
        epsilon_units(self.payout_epsilon)

    @property
    def epsilon_units(self) -> int:
        """The most micro-epsilon the session charges: each part rounded up."""
        return epsilon_units(self.epsilon) + epsilon_units(self.payout_epsilon)


@dataclass(frozen=True)
class QuoteLine:
    """One owner's part of a quote: its limits and its charge at those limits."""

    owner: str
    limits: OwnerLimits
    charge: Charge


@dataclass(frozen=True)
class Quote:
    """The most a request can cost, computed from the terms before anything is charged.

    Attributes
    ----------
    summary_size : int
        p: no owner can deliver more.
    lines : tuple of QuoteLine
        One per owner, sorted by name.
    reward : int
        The most the consumer's reward rule pays, micro-credits (0 without one).
    """

    summary_size: int
    lines: tuple[QuoteLine, ...]
    reward: int

    @property
    def total(self) -> int:
        """The maximum cost, micro-credits: every owner's maximum charge plus the reward."""
        return sum(line.charge.total for line in self.lines) + self.reward

    def line(self, owner: str) -> QuoteLine:
        """The owner's line.

        Raises
        ------
        KeyError
            If the quote has no line for ``owner``.
        """
        for line in self.lines:
            if line.owner == owner:
                return line
        raise KeyError(f"the quote has no line for owner {owner!r}")


def quote(
    prices: Mapping[str, OwnerPrices],
    limits: Mapping[str, OwnerLimits],
    summary_size: int,
    reward_rule: RewardRule | None = None,
) -> Quote:
    """The maximum cost of a request, from every owner's prices and the session's terms.

    Each owner's line charges it at its limits: ``max_points_read`` read,
    ``min(max_points_read, p)`` delivered, the terms' epsilon and the payout epsilon, and the
    minimum if those come to less; the reward rule adds the most it pays
    (``reward_rule.max_total()``).

    Parameters
    ----------
    prices : mapping of str to OwnerPrices
        Every owner's prices, by name.
    limits : mapping of str to OwnerLimits
        The terms' limits for every owner of the session, by name.
    summary_size : int
        p, >= 1; 0 for a job that delivers no raw point (a CAPE job: every ``max_points_read``
        is 0 then, and only epsilon and the minimum are charged).
    reward_rule : ValueReward or ProportionalSplit, optional

    Returns
    -------
    Quote

    Raises
    ------
    ValueError
        If ``summary_size`` is not an int >= 0, or an owner of ``limits`` has no prices.

    Notes
    -----
    The quote is an upper bound of the settlement: a session cannot read more than its terms
    allow nor deliver more than it read or than p, the ledger's epsilon is the terms' and the
    payout's at most, and every charge is monotone in these. :func:`settle
    <dpmarket.common.market.statement.settle>` checks each line against it.
    """
    p = _check_int(summary_size, "summary_size")
    missing = sorted(set(limits) - set(prices))
    if missing:
        raise ValueError(f"owner(s) {missing} have no prices: every owner of a session needs them")
    lines = []
    for owner in sorted(limits):
        lim = limits[owner]
        charge = owner_charge(
            prices[owner],
            lim.max_points_read,
            min(lim.max_points_read, p),
            lim.epsilon_units,
        )
        lines.append(QuoteLine(owner, lim, charge))
    reward = reward_rule.max_total() if reward_rule is not None else 0
    return Quote(p, tuple(lines), reward)


def check_cap(quoted: Quote, max_cost: int | None) -> None:
    """Refuse a request whose quoted maximum exceeds the consumer's cap.

    Parameters
    ----------
    quoted : Quote
    max_cost : int or None
        The consumer's cap in micro-credits (``request --max-cost``); None: no cap.

    Raises
    ------
    CostCapExceededError
        If ``quoted.total > max_cost``; the message gives both in credits.
    ValueError
        If ``max_cost`` is not an int >= 0.
    """
    if max_cost is None:
        return
    cap = _check_int(max_cost, "max_cost")
    if quoted.total > cap:
        raise CostCapExceededError(
            f"the request may cost up to {format_credits(quoted.total)} credits, more than its "
            f"cap of {format_credits(cap)}: raise --max-cost, ask for fewer points or exclude "
            f"owners; nothing was charged"
        )
