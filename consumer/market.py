"""What the consumer is shown of the market: a request's quote and what it cost, as tables.

``dpmarket consumer request`` prints the quote it was accepted under (one line) and, with
``--quote-only``, the whole quote (:func:`quote_table`: one row per owner, 80 columns; ``--wide``
every component); :func:`quote_json` is its ``--json`` form.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dpmarket.common.market.money import EPSILON_UNITS, format_credits
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.terms import quote_to_json

__all__ = ["credits", "quote_json", "quote_line", "quote_table"]


def credits(micro: int) -> str:
    """Micro-credits as credits, without trailing zeros beyond two decimals (``1.50``,
    ``0.000125``)."""
    text = format_credits(micro)
    whole, _, decimals = text.partition(".")
    decimals = decimals.rstrip("0")
    return f"{whole}.{decimals.ljust(2, '0')}"


def quote_line(quoted: Quote) -> str:
    """One line: ``quote: at most 12.50 credits (3 owners' prices 10.50, reward 2.00)``."""
    prices = quoted.total - quoted.reward
    reward = f", reward {credits(quoted.reward)}" if quoted.reward else ""
    return (
        f"quote: at most {credits(quoted.total)} credits ({len(quoted.lines)} owners' prices "
        f"{credits(prices)}{reward})"
    )


def quote_table(quoted: Quote, *, wide: bool = False) -> Table:
    """The quote, one row per owner: the most points read and delivered, the most epsilon
    charged, and the owner's charge at those limits (credits); ``wide`` adds the components."""
    table = Table(
        title=f"quote for p = {quoted.summary_size}: at most {credits(quoted.total)} credits",
        title_justify="left",
    )
    table.add_column("owner", overflow="fold")
    for header in ("read", "delivered", "epsilon"):
        table.add_column(header, justify="right")
    if wide:
        for header in ("per read", "per delivered", "per epsilon", "minimum top-up"):
            table.add_column(header, justify="right")
    table.add_column("charge", justify="right")
    for line in quoted.lines:
        c = line.charge
        row = [line.owner, str(c.points_read), str(c.points_delivered)]
        row.append(f"{c.epsilon_units / EPSILON_UNITS:g}")
        if wide:
            row += [credits(x) for x in (c.read, c.delivered, c.epsilon, c.minimum_topup)]
        row.append(credits(c.total))
        table.add_row(*row)
    if quoted.reward:
        table.add_row("reward", "", "", "", *([""] * 4 if wide else []), credits(quoted.reward))
    return table


def quote_json(quoted: Quote) -> dict[str, Any]:
    """The quote as ``request --quote-only --json`` prints it: amounts in micro-credits
    (:func:`~dpmarket.common.market.terms.quote_to_json`) and the total in credits."""
    return {**quote_to_json(quoted), "total_credits": format_credits(quoted.total)}
