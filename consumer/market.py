"""What the consumer is shown of the market: a request's quote, what it cost, its statements.

``dpmarket consumer request`` prints the quote it was accepted under (one line) and, with
``--quote-only``, the whole quote (:func:`quote_table`: one row per owner, 80 columns; ``--wide``
every component); :func:`quote_json` is its ``--json`` form. ``dpmarket consumer statements``
lists the consumer's settlement statements (:func:`statements_table`, :func:`statement_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from dpmarket.common.market.money import EPSILON_UNITS, credits_text, format_credits
from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.statement import Statement
from dpmarket.common.market.terms import quote_to_json

__all__ = [
    "SettledStatement",
    "credits",
    "owner_session_id",
    "quote_json",
    "quote_line",
    "quote_table",
    "statement_json",
    "statements_table",
]


credits = credits_text


def quote_line(quoted: Quote) -> str:
    """One line: ``quote: at most 12.50 credits (3 owners' prices 10.50, reward 2.00)``."""
    prices = quoted.total - quoted.reward
    reward = f", reward {credits(quoted.reward)}" if quoted.reward else ""
    return (
        f"quote: at most {credits(quoted.total)} credits ({len(quoted.lines)} owners' prices "
        f"{credits(prices)}{reward})"
    )


def quote_table(quoted: Quote, *, wide: bool = False, subject: str | None = None) -> Table:
    """The quote, one row per owner: the most points read and delivered, the most epsilon
    charged, and the owner's charge at those limits (credits); ``wide`` adds the components.
    ``subject`` names what is quoted in the title (default ``p = <summary size>``)."""
    subject = f"p = {quoted.summary_size}" if subject is None else subject
    table = Table(
        title=f"quote for {subject}: at most {credits(quoted.total)} credits",
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


@dataclass(frozen=True)
class SettledStatement:
    """One of the consumer's settlement statements (``ListStatements``).

    Attributes
    ----------
    session_id : str
        The consumer's session id.
    settled_at : float
        Unix time, seconds.
    statement : Statement
        The whole statement (every owner's line), decoded from its canonical bytes.
    signature : bytes
        The curator's signature over them.
    owners_recorded : int
        How many owners have recorded their part.
    """

    session_id: str
    settled_at: float
    statement: Statement
    signature: bytes
    owners_recorded: int


def owner_session_id(settled: SettledStatement) -> str:
    """The id the session's owners know it by: the statement's own session id (signed with
    it), under which each owner's ledger (``dpmarket owner ledger``) and earnings list the
    session. The curator opens a session at its owners under an id of its own, not the
    consumer's; the consumer reads it here, from the statement it already holds, so nothing
    new is released to anyone."""
    return settled.statement.header.session_id


def statement_json(settled: SettledStatement) -> dict[str, Any]:
    """``{"session_id", "owner_session_id", "settled_at", "total" (micro-credits),
    "total_credits", "owners_recorded", "header": {...}, "lines": [{...}, ...]}`` (the
    statement's own integers; ``owner_session_id``: :func:`owner_session_id`)."""
    st = settled.statement
    return {
        "session_id": settled.session_id,
        "owner_session_id": owner_session_id(settled),
        "settled_at": settled.settled_at,
        "total": st.total,
        "total_credits": format_credits(st.total),
        "owners_recorded": settled.owners_recorded,
        "header": asdict(st.header),
        "lines": [{**asdict(line), "total": line.total} for line in st.lines],
    }


def statements_table(settled: list[SettledStatement], *, wide: bool = False) -> Table:
    """One row per (statement, owner): the session, the id its owners' ledgers list it by
    (:func:`owner_session_id`), the owner, points read and delivered, epsilon charged, the
    charge, the reward and the total, credits; ``wide`` adds the price components and whole
    ids; a caption names each session whose payout release was withheld, and why. Fits 80
    columns without ``wide``."""
    table = Table(title="settlement statements (credits)", title_justify="left")
    table.add_column("session", overflow="fold")
    table.add_column("at owners", overflow="fold")
    table.add_column("owner", overflow="fold")
    for header in ("read", "deliv.", "epsilon"):
        table.add_column(header, justify="right")
    if wide:
        for header in ("per read", "per deliv.", "per eps.", "top-up", "quoted"):
            table.add_column(header, justify="right")
    for header in ("reward", "total"):
        table.add_column(header, justify="right")
    for item in settled:
        sid = item.session_id if wide else item.session_id[:8]
        owners_id = owner_session_id(item) if wide else owner_session_id(item)[:8]
        for line in item.statement.lines:
            eps = (line.epsilon_session + line.epsilon_payout) / EPSILON_UNITS
            row = [sid, owners_id, line.owner, str(line.points_read), str(line.points_delivered)]
            row.append(f"{eps:g}")
            if wide:
                parts = (
                    line.read_charge,
                    line.delivered_charge,
                    line.epsilon_charge,
                    line.minimum_topup,
                    line.quoted,
                )
                row += [credits(x) for x in parts]
            row += [credits(line.reward), credits(line.total)]
            table.add_row(*row)
        blank = [""] * (8 if wide else 3)
        table.add_row(
            sid, owners_id, "[bold]all", *blank, "", f"[bold]{credits(item.statement.total)}"
        )
    withheld = [
        f"session {item.session_id if wide else item.session_id[:8]}: payout withheld, "
        f"{item.statement.header.payout_withheld}"
        for item in settled
        if item.statement.header.payout_withheld
    ]
    if withheld:
        table.caption = "\n".join(withheld)
        table.caption_justify = "left"
    return table
