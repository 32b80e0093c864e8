"""Units of the market: credits as integer micro-credits, epsilon and value as integer units.

Money is never a float. A **credit** is the market's currency-free unit of account; every amount
is an ``int`` of **micro-credits** (µcr, :data:`MICRO_CREDITS` = 10^6 per credit), so sums and
products are exact and every party that recomputes an amount from the same integers gets the same
integer. Text in and out goes through :class:`decimal.Decimal` (``"12.5"`` credits is
12,500,000 µcr; more than six decimals is an error, not a rounding).

Quantities that come from floats enter a statement once, as integers, by one rule each:

* epsilon charged, in **micro-epsilon** (:data:`EPSILON_UNITS` = 10^6 per unit of epsilon),
  rounded *up* (:func:`epsilon_units`): a statement never states less than the ledger charged,
  and an owner that applies the same function to its ledger's float gets the same integer;
* an attribution (a value of the objective ``J``, dimensionless) and its noise scale, in
  **nano-value** units (:data:`VALUE_UNITS` = 10^9 per unit of ``J``), rounded half to even
  (:func:`value_units`).

A charge is a count times a price, or ``ceil(epsilon_units * price_per_epsilon / 10^6)``: the
owner is never paid less than its price (:func:`epsilon_charge`).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal, InvalidOperation

__all__ = [
    "EPSILON_UNITS",
    "MICRO_CREDITS",
    "VALUE_UNITS",
    "credits_cap",
    "credits_text",
    "epsilon_charge",
    "epsilon_units",
    "format_credits",
    "parse_credits",
    "value_units",
]

#: Micro-credits per credit.
MICRO_CREDITS = 10**6
#: Micro-epsilon per unit of epsilon.
EPSILON_UNITS = 10**6
#: Nano-value per unit of the objective J.
VALUE_UNITS = 10**9


def parse_credits(amount: str | int | Decimal) -> int:
    """An amount of credits as integer micro-credits, exactly.

    Parameters
    ----------
    amount : str, int or Decimal
        Credits, e.g. ``"12.5"``, ``3`` or ``Decimal("0.000001")``; not a float (whose binary
        value is rarely the decimal written).

    Returns
    -------
    int
        Micro-credits, ``>= 0``.

    Raises
    ------
    ValueError
        If ``amount`` is a float or a bool, is not a number, is negative or not finite, or has
        more than six decimals.
    """
    if isinstance(amount, bool | float):
        raise ValueError(
            f"credits must be given as a decimal string, an int or a Decimal, not {amount!r} "
            f"({type(amount).__name__}): write it as a string, e.g. '{amount}'"
        )
    try:
        value = Decimal(amount) if not isinstance(amount, Decimal) else amount
    except InvalidOperation:
        raise ValueError(f"credits must be a decimal number, got {amount!r}") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"credits must be a finite amount >= 0, got {amount!r}")
    micro = value * MICRO_CREDITS
    if micro != micro.to_integral_value():
        raise ValueError(f"credits have at most six decimals (one micro-credit), got {amount!r}")
    return int(micro)


def credits_cap(amount: str | int | Decimal | None) -> int | None:
    """A cap on a cost (``max_cost`` of the client, ``--max-cost`` of the command line) as
    integer micro-credits: :func:`parse_credits` of an amount of credits, None (no cap) as None.

    Every caller that takes a cost cap from a person or a program reads it through this function,
    so ``"12.5"`` and ``5`` mean 12.5 and 5 credits wherever they are given.

    Raises
    ------
    ValueError
        As :func:`parse_credits`.
    """
    return None if amount is None else parse_credits(amount)


def format_credits(micro: int) -> str:
    """Micro-credits as a decimal string of credits with six decimals (``1500000`` ->
    ``"1.500000"``; negative amounts keep their sign).

    Raises
    ------
    ValueError
        If ``micro`` is not an int.
    """
    if isinstance(micro, bool) or not isinstance(micro, int):
        raise ValueError(f"an amount must be an int of micro-credits, got {micro!r}")
    return str((Decimal(micro) / MICRO_CREDITS).quantize(Decimal("0.000001")))


def credits_text(micro: int) -> str:
    """Micro-credits as credits for a table: at least two decimals, trailing zeros beyond them
    dropped (``1500000`` -> ``"1.50"``, ``125`` -> ``"0.000125"``).

    Raises
    ------
    ValueError
        If ``micro`` is not an int.
    """
    whole, _, decimals = format_credits(micro).partition(".")
    return f"{whole}.{decimals.rstrip('0').ljust(2, '0')}"


def epsilon_units(epsilon: float) -> int:
    """An epsilon as integer micro-epsilon, rounded up.

    The float is converted exactly (``Decimal(float)``) and rounded up, so the same float always
    gives the same integer, and a statement never states less than was charged.

    Parameters
    ----------
    epsilon : float
        ``>= 0`` and finite.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``epsilon`` is negative, NaN or infinite (a non-private charge has no price per unit).
    """
    eps = float(epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(
            f"epsilon must be a finite number >= 0 to be priced, got {epsilon} (a non-private "
            f"session has no price per unit of epsilon)"
        )
    return int((Decimal(eps) * EPSILON_UNITS).to_integral_value(rounding=ROUND_CEILING))


def value_units(value: float) -> int:
    """A value of the objective (an attribution, a noise scale) as integer nano-value, rounded
    half to even.

    Raises
    ------
    ValueError
        If ``value`` is NaN or infinite.
    """
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"a value must be finite, got {value}")
    return int((Decimal(v) * VALUE_UNITS).to_integral_value(rounding=ROUND_HALF_EVEN))


def epsilon_charge(units: int, price_per_epsilon: int) -> int:
    """``ceil(units * price_per_epsilon / 10^6)`` micro-credits: the price of ``units``
    micro-epsilon at ``price_per_epsilon`` micro-credits per unit of epsilon.

    Raises
    ------
    ValueError
        If either is negative or not an int.
    """
    for name, x in (("units", units), ("price_per_epsilon", price_per_epsilon)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{name} must be an int >= 0, got {x!r}")
    return -((-units * price_per_epsilon) // EPSILON_UNITS)
