"""What an owner's ledger says: its charges, and what is left of each budget.

:func:`ledger_statement` reads an :class:`~dpmarket.owner.ledger.OwnerLedger` into a
:class:`LedgerStatement` (typed: the charges as :class:`~dpmarket.owner.ledger.LedgerEntry`, each
budget as :class:`BudgetUse`); ``dpmarket owner ledger`` prints it and
:func:`dpmarket.client.ledger` returns it. :meth:`LedgerStatement.to_json` is what
``dpmarket owner ledger --json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpmarket.owner.ledger import LedgerEntry, OwnerLedger, Totals
from dpmarket.owner.policy import OwnerPolicy

__all__ = ["BudgetUse", "LedgerStatement", "Limit", "iso_time", "ledger_statement"]


def iso_time(at: float) -> str:
    """Unix time as ISO 8601 in UTC, to the second: ``2024-05-01T12:00:00Z``."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Limit:
    """One budget: what was spent of it, its limit and what is left (never below 0).

    Attributes
    ----------
    spent, limit, left : float (int for points)
        In the budget's unit: epsilon, delta or raw points.
    """

    spent: float
    limit: float
    left: float


@dataclass(frozen=True)
class BudgetUse:
    """What a ledger's charges spent of a policy's budgets (over its window, or in one
    session against the per-session limits).

    Attributes
    ----------
    epsilon, delta, points : Limit
    non_private : bool
        Whether a non-private release was recorded (not summed into epsilon or delta).
    """

    epsilon: Limit
    delta: Limit
    points: Limit
    non_private: bool

    @classmethod
    def of(cls, spent: Totals, limits: tuple[float, float, int]) -> BudgetUse:
        """``spent`` against ``(epsilon, delta, points)`` limits."""
        epsilon, delta, points = limits
        return cls(
            epsilon=Limit(spent.epsilon, epsilon, max(epsilon - spent.epsilon, 0.0)),
            delta=Limit(spent.delta, delta, max(delta - spent.delta, 0.0)),
            points=Limit(spent.points, points, max(points - spent.points, 0)),
            non_private=spent.non_private,
        )

    def to_json(self) -> dict[str, Any]:
        """``{"epsilon", "delta", "points": {"spent", "limit", "left"}, "non_private"}``."""
        return {
            "epsilon": vars(self.epsilon).copy(),
            "delta": vars(self.delta).copy(),
            "points": vars(self.points).copy(),
            "non_private": self.non_private,
        }


@dataclass(frozen=True)
class LedgerStatement:
    """An owner's ledger, read.

    Attributes
    ----------
    path : Path
        The ledger's file.
    policy : OwnerPolicy
        The policy the ledger recorded at the owner's last start.
    window : str
        The budgets' window (``"the lifetime"`` or ``"the last N days"``).
    entries : tuple of LedgerEntry
        The charges asked for, oldest first.
    budget : BudgetUse
        Every charge of the window against the policy's budgets.
    session : str or None
        The session the statement is about, if any.
    session_budget : BudgetUse or None
        That session's charges against the per-session limits.
    """

    path: Path
    policy: OwnerPolicy
    window: str
    entries: tuple[LedgerEntry, ...]
    budget: BudgetUse
    session: str | None = None
    session_budget: BudgetUse | None = None

    def to_json(self) -> dict[str, Any]:
        """What ``dpmarket owner ledger --json`` prints: ``{"ledger": path, "policy": {field:
        value}, "window", "entries": [{"id", "at" (Unix seconds), "time" (ISO 8601 UTC),
        "session", "consumer", "curator", "mechanism", "epsilon" (None for a non-private
        release), "delta", "points", "non_private"}, ...] oldest first, "budget": {"epsilon",
        "delta", "points": {"spent", "limit", "left"}, "non_private": bool} over the window,
        "session": the same against the per-session limits, with "id", or None}``. Strictly
        JSON: no NaN or infinity."""
        session = None
        if self.session is not None and self.session_budget is not None:
            session = {"id": self.session, **self.session_budget.to_json()}
        return {
            "ledger": str(self.path),
            "policy": self.policy.as_dict(),
            "window": self.window,
            "entries": [_entry(e) for e in self.entries],
            "budget": self.budget.to_json(),
            "session": session,
        }


def _entry(e: LedgerEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": e.at,
        "time": iso_time(e.at),
        "session": e.session,
        "consumer": e.consumer,
        "curator": e.curator,
        "mechanism": e.mechanism,
        "epsilon": None if e.non_private else e.epsilon,
        "delta": e.delta,
        "points": e.points,
        "non_private": e.non_private,
    }


def ledger_statement(
    ledger: OwnerLedger, *, session: str | None = None, limit: int | None = None
) -> LedgerStatement:
    """Read ``ledger``.

    Parameters
    ----------
    ledger : OwnerLedger
    session : str, optional
        Only this session's charges, and its totals against the per-session limits.
    limit : int, optional
        Only the last ``limit`` charges (the totals always cover every charge).

    Returns
    -------
    LedgerStatement
    """
    policy: OwnerPolicy = ledger.policy
    session_budget = None
    if session is not None:
        session_budget = BudgetUse.of(
            ledger.session_totals(session),
            (policy.epsilon_per_session, policy.delta_per_session, policy.points_per_session),
        )
    return LedgerStatement(
        path=Path(ledger.path),
        policy=policy,
        window=policy.window_description,
        entries=tuple(ledger.entries(session=session, limit=limit)),
        budget=BudgetUse.of(
            ledger.window_totals(),
            (policy.epsilon_total, policy.delta_total, policy.points_total),
        ),
        session=session,
        session_budget=session_budget,
    )
