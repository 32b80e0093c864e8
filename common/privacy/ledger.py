"""Privacy ledger: every release is charged to the party whose data it touches.

Parties: ``"validation"`` (the consumer's ``D_v``), ``"owners"`` (the union of the owners' data,
i.e. the summary and the auction) and ``"public"`` (recorded for the audit trail, never counted,
e.g. releases computed from the random seed set). Budgets are enforced with Theorem 7 (the bound the
summarization paper uses); tighter or looser accountants are reported beside it. Charged mechanisms
are pure (Laplace, exponential, generic pure) or Gaussian ((epsilon, delta)-DP); with Gaussian
events Theorem 7 holds at a total delta larger than ``delta_tilde``, reported as ``delta_total``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.privacy.accounting import (
    PrivacyEvent,
    _check_delta_tilde,
    _kairouz_from_groups,
    _total_delta,
    advanced_composition_epsilon,
    pld_epsilon,
)

__all__ = [
    "UNKNOWN_NOT_RETURNED",
    "UNKNOWN_RESTARTED",
    "UNKNOWN_UNREACHABLE",
    "BudgetExceededError",
    "Charge",
    "LedgerReport",
    "PartyReport",
    "PrivacyLedger",
    "SessionSpend",
]

_PARTIES = ("validation", "owners", "public")
_COUNTED = ("validation", "owners")
_METHODS = ("theorem7", "advanced", "pld", "basic")


@dataclass(frozen=True)
class Charge:
    """One entry of the ledger: ``event`` charged to ``party``.

    Attributes
    ----------
    party : {"validation", "owners", "public"}
        Whose data the release depends on: ``"validation"`` (the consumer's ``D_v``),
        ``"owners"`` (the union of the owners' data) or ``"public"`` (recorded, not counted).
    label : str
        Human-readable description, e.g. ``"h2(D_v) selections"``.
    event : PrivacyEvent
        What was released.

    Raises
    ------
    ValueError
        If ``party`` is unknown, ``label`` is not a string or ``event`` is not a
        :class:`~dpmarket.common.privacy.accounting.PrivacyEvent`.
    """

    party: Literal["validation", "owners", "public"]
    label: str
    event: PrivacyEvent

    def __post_init__(self) -> None:
        if self.party not in _PARTIES:
            raise ValueError(f"party must be one of {_PARTIES}, got {self.party!r}")
        if not isinstance(self.label, str):
            raise ValueError(f"label must be a string, got {self.label!r}")
        if not isinstance(self.event, PrivacyEvent):
            raise ValueError(f"event must be a PrivacyEvent, got {type(self.event).__name__}")


#: Why the curator has no record of what an owner charged a session (:attr:`SessionSpend.unknown`),
#: in public words: the owner could not be reached to close the session.
UNKNOWN_UNREACHABLE = "owner unreachable"
#: ... the curator restarted while the session ran (until a restarted curator gets the record).
UNKNOWN_RESTARTED = "the curator restarted during the session"
#: ... the owner answered the closing without its record.
UNKNOWN_NOT_RETURNED = "the owner returned no record"


@dataclass(frozen=True)
class SessionSpend:
    """What one session spent of one owner's budget, as the owner's own ledger recorded it.

    Attributes
    ----------
    epsilon, delta : float
        Summed over the session's charges (``epsilon`` is ``inf`` after a non-private charge).
    points : int
        Raw points released.
    non_private : bool
        Whether a non-private charge was recorded.
    unknown : str
        Empty when the figures are the owner's record. Otherwise why the curator does not have
        it (:data:`UNKNOWN_UNREACHABLE`, :data:`UNKNOWN_RESTARTED`,
        :data:`UNKNOWN_NOT_RETURNED`); the figures are then 0 and say nothing: the owner may
        have charged the session (its ledger says what).
    """

    epsilon: float
    delta: float
    points: int
    non_private: bool = False
    unknown: str = ""

    @classmethod
    def unknown_because(cls, reason: str) -> SessionSpend:
        """A spend whose record the curator does not have, for ``reason``."""
        return cls(0.0, 0.0, 0, False, reason)


@dataclass(frozen=True)
class PartyReport:
    """What a ledger has charged to one party, by every accountant it reports.

    Attributes
    ----------
    theorem7, advanced, pld, basic : float or None
        The party's epsilon by Theorem 7 (at :attr:`delta_total`), advanced composition (None
        when its epsilons differ or it has Gaussian events), the PLD accountant (at the ledger's
        ``delta_tilde``) and basic composition (:meth:`PrivacyLedger.epsilon`); None when the
        accountant cannot bound the party's events.
    delta_total : float
        The delta of the ``theorem7`` figure (``delta_tilde`` when every event is pure).
    budget : float or None
        The party's epsilon budget, if it has one.
    mechanisms : int
        Mechanisms run (the sum of the events' counts).
    """

    theorem7: float | None
    advanced: float | None
    pld: float | None
    basic: float | None
    delta_total: float
    budget: float | None
    mechanisms: int


@dataclass(frozen=True)
class LedgerReport:
    """A :class:`PrivacyLedger`'s report: the composed figures of every party and every charge.

    Attributes
    ----------
    delta_tilde : float
        The composition slack.
    parties : dict of str to PartyReport
        ``"validation"``, ``"owners"`` and ``"public"`` (recorded, its epsilons 0).
    entries : tuple of Charge
        Every charge, in the order charged.
    """

    delta_tilde: float
    parties: dict[str, PartyReport]
    entries: tuple[Charge, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"delta_tilde": float, "parties": {party: {"theorem7", "advanced", "pld", "basic",
        "delta_total", "budget", "mechanisms"}}, "entries": [{"party", "label", "event":
        {...}}, ...]}`` (JSON-serialisable; infinities as JSON ``Infinity``)."""
        return {
            "delta_tilde": self.delta_tilde,
            "parties": {party: asdict(row) for party, row in self.parties.items()},
            "entries": [
                {"party": c.party, "label": c.label, "event": asdict(c.event)} for c in self.entries
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerReport:
        """The inverse of :meth:`to_json`.

        Raises
        ------
        ValueError, TypeError, KeyError
            If ``data`` is not a ledger report's JSON object (an event is checked as
            :class:`~dpmarket.common.privacy.accounting.PrivacyEvent` checks it).
        """
        return cls(
            delta_tilde=float(data["delta_tilde"]),
            parties={party: PartyReport(**row) for party, row in data["parties"].items()},
            entries=tuple(
                Charge(e["party"], e["label"], PrivacyEvent(**e["event"])) for e in data["entries"]
            ),
        )


class BudgetExceededError(FailedPreconditionError):
    """Raised when charges would push a party's Theorem-7 epsilon over its budget.

    A ``FailedPreconditionError``: the services answer ``FAILED_PRECONDITION``.
    """


def _theorem7(events: Sequence[PrivacyEvent], delta_tilde: float) -> float:
    eps = np.array([e.epsilon for e in events], dtype=np.float64)
    counts = np.array([e.count for e in events], dtype=np.float64)
    return _kairouz_from_groups(eps, counts, delta_tilde)


def _theorem7_delta(events: Sequence[PrivacyEvent], delta_tilde: float) -> float:
    """Total delta of Theorem 7: ``1 - (1 - delta_tilde) prod (1 - delta_l)^count_l``."""
    if all(e.delta == 0.0 for e in events):
        return delta_tilde
    deltas = np.array([e.delta for e in events], dtype=np.float64)
    counts = np.array([e.count for e in events], dtype=np.float64)
    return _total_delta(deltas, counts, delta_tilde)


class PrivacyLedger:
    """Records privacy charges per party and enforces per-party epsilon budgets.

    Parameters
    ----------
    delta_tilde : float
        Slack of the composition, ``0 < delta_tilde <= 1/e``. While a party's events are all
        pure, every reported epsilon holds at this delta. With Gaussian events, the PLD epsilon
        still holds at ``delta_tilde`` (the PLD includes them exactly), while Theorem 7 holds at
        :meth:`delta_total` ``> delta_tilde``.
    budgets : mapping of str to float, optional
        Epsilon budget of ``"validation"`` and/or ``"owners"``; a party without a budget is not
        limited (but still recorded).
    on_charge : callable, optional
        Called with the charges of every successful :meth:`charge`, after the budget check and
        before they are recorded, e.g. to write them to durable storage before the release they
        pay for. If it raises, nothing is recorded and the error propagates.

    Raises
    ------
    ValueError
        If ``delta_tilde`` is out of range, or a budget names another party or is not finite and
        ``> 0``.

    Notes
    -----
    Budgets are checked with Theorem 7 of the summarization paper (Kairouz et al. 2017), as
    quoted in its appendix, over *all* events charged to the party, in any order: adaptive
    composition is order-free for these bounds. ``check`` and ``charge`` are all-or-nothing, so a
    failed round charges nothing (DESIGN.md, Errors). A Gaussian event enters Theorem 7 as the
    ``(epsilon_l, delta_l)`` it was calibrated for; budgets bound the epsilon only, and the
    delta at which it holds is reported (``delta_total``), not enforced.

    References
    ----------
    Summarization paper, Section 4 and Appendix D (Theorems 6 and 7).
    """

    def __init__(
        self,
        *,
        delta_tilde: float,
        budgets: Mapping[str, float] | None = None,
        on_charge: Callable[[Sequence[Charge]], None] | None = None,
    ) -> None:
        self._delta_tilde = _check_delta_tilde(delta_tilde)
        self._on_charge = on_charge
        self._budgets: dict[str, float] = {}
        for party, budget in (budgets or {}).items():
            if party not in _COUNTED:
                raise ValueError(f"budgets may only name {_COUNTED}, got party {party!r}")
            b = float(budget)
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"budget of {party!r} must be finite and > 0, got {budget}")
            self._budgets[party] = b
        self._entries: list[Charge] = []

    @property
    def delta_tilde(self) -> float:
        """The composition slack ``delta_tilde``."""
        return self._delta_tilde

    @property
    def budgets(self) -> dict[str, float]:
        """Per-party epsilon budgets (a copy)."""
        return dict(self._budgets)

    @property
    def entries(self) -> tuple[Charge, ...]:
        """All recorded charges, in the order they were charged."""
        return tuple(self._entries)

    def _events(self, party: str, extra: Sequence[Charge] = ()) -> list[PrivacyEvent]:
        return [c.event for c in (*self._entries, *extra) if c.party == party]

    @staticmethod
    def _validate(charges: Sequence[Charge]) -> list[Charge]:
        if isinstance(charges, Charge):
            raise ValueError("charges must be a sequence of Charge, got a single Charge")
        out = list(charges)
        for j, c in enumerate(out):
            if not isinstance(c, Charge):
                raise ValueError(f"charges[{j}] must be a Charge, got {type(c).__name__}")
        return out

    def check(self, charges: Sequence[Charge]) -> None:
        """Raise if recording ``charges`` would exceed a party's budget; record nothing.

        Parameters
        ----------
        charges : sequence of Charge

        Raises
        ------
        BudgetExceededError
            If, for a party with a budget, the Theorem-7 epsilon of its recorded events plus the
            new ones exceeds the budget. The message names the party, the epsilon spent so far,
            the would-be epsilon and the budget.
        ValueError
            If an element of ``charges`` is not a :class:`Charge`.
        """
        new = self._validate(charges)
        for party in _COUNTED:
            if party not in self._budgets or not any(c.party == party for c in new):
                continue
            spent = _theorem7(self._events(party), self._delta_tilde)
            would_be = _theorem7(self._events(party, new), self._delta_tilde)
            budget = self._budgets[party]
            if would_be > budget:
                raise BudgetExceededError(
                    f"privacy budget of {party!r} exhausted: spent epsilon={spent:.6g}, these "
                    f"charges would make it {would_be:.6g} > budget {budget:.6g} "
                    f"(Theorem 7, delta_tilde={self._delta_tilde:g})"
                )

    def charge(self, charges: Sequence[Charge]) -> None:
        """Check ``charges`` against the budgets and record them all, or none.

        Raises
        ------
        BudgetExceededError
            As :meth:`check`; nothing is recorded then.
        ValueError
            If an element of ``charges`` is not a :class:`Charge`; nothing is recorded then.
        """
        new = self._validate(charges)
        self.check(new)
        if self._on_charge is not None:
            self._on_charge(new)
        self._entries.extend(new)

    def epsilon(
        self,
        party: str,
        *,
        method: Literal["theorem7", "advanced", "pld", "basic"] = "theorem7",
    ) -> float:
        """Total epsilon (at ``delta_tilde``) spent on ``party``'s data.

        Parameters
        ----------
        party : {"validation", "owners", "public"}
            ``"public"`` always gives 0.0 (its events are not counted).
        method : {"theorem7", "advanced", "pld", "basic"}
            ``"theorem7"``: Theorem 7 over all events (the budget's bound), at
            :meth:`delta_total`. ``"basic"``: the sum of ``count * epsilon``, at delta
            ``1 - prod (1 - delta_l)^count_l`` (0 when all events are pure, else at most
            :meth:`delta_total`). ``"pld"``: :func:`pld_epsilon` at ``delta_tilde``, Gaussian
            events included. ``"advanced"``: advanced composition over the total count at
            ``delta_tilde``, only defined when every event of the party is pure and has the
            same epsilon.

        Returns
        -------
        float
            0.0 when nothing was charged to the party.

        Raises
        ------
        ValueError
            If ``party`` or ``method`` is unknown, or ``method="advanced"`` and the party's
            events have different epsilons or include a Gaussian event.

        Notes
        -----
        The paper's Section 4 figures (1.4 and 0.043) apply advanced composition with *one*
        mechanism per MWEM iteration; the ledger records what is actually run (a selection and a
        measurement per iteration), so its ``"advanced"`` value for an h2 call is that of ``2 T``
        mechanisms.
        """
        if party not in _PARTIES:
            raise ValueError(f"party must be one of {_PARTIES}, got {party!r}")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        if party == "public":
            return 0.0
        events = self._events(party)
        if not events:
            return 0.0
        if method == "theorem7":
            return _theorem7(events, self._delta_tilde)
        if method == "basic":
            return float(math.fsum(e.epsilon * e.count for e in events))
        if method == "pld":
            return pld_epsilon(events, self._delta_tilde)
        if any(e.delta > 0 for e in events):
            raise ValueError(
                f"advanced composition is only reported for pure events; {party!r} has "
                f"{sum(e.count for e in events if e.delta > 0)} gaussian mechanism(s)"
            )
        epsilons = {e.epsilon for e in events}
        if len(epsilons) != 1:
            raise ValueError(
                f"advanced composition needs one epsilon for all events of {party!r}, got "
                f"{len(epsilons)} distinct values {sorted(epsilons)[:5]}"
            )
        total = sum(e.count for e in events)
        return advanced_composition_epsilon(epsilons.pop(), total, self._delta_tilde)

    def delta_total(self, party: str) -> float:
        """The delta at which ``epsilon(party, method="theorem7")`` holds.

        Parameters
        ----------
        party : {"validation", "owners", "public"}

        Returns
        -------
        float
            ``1 - (1 - delta_tilde) prod_l (1 - delta_l)^count_l`` over the party's events
            (Theorem 7); exactly ``delta_tilde`` when they are all pure, when the party has no
            events, and for ``"public"`` (not counted).

        Raises
        ------
        ValueError
            If ``party`` is unknown.

        References
        ----------
        Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath (2017), Theorem 3.5.
        """
        if party not in _PARTIES:
            raise ValueError(f"party must be one of {_PARTIES}, got {party!r}")
        if party == "public":
            return self._delta_tilde
        return _theorem7_delta(self._events(party), self._delta_tilde)

    def report(self) -> LedgerReport:
        """The ledger's report: every party's epsilon by every accountant, and every charge.

        Returns
        -------
        LedgerReport
            ``"public"`` appears with all epsilons 0.0; an accountant that cannot bound a
            party's events (advanced composition of differing epsilons or Gaussian events)
            gives None. The ``"pld"`` figure is the epsilon at ``delta_tilde``
            (:meth:`LedgerReport.to_json` writes it as JSON).
        """
        parties: dict[str, PartyReport] = {}
        for party in _PARTIES:
            row: dict[str, float | None] = {}
            for method in _METHODS:
                try:
                    row[method] = float(self.epsilon(party, method=method))  # type: ignore[arg-type]
                except ValueError:
                    row[method] = None
            parties[party] = PartyReport(
                theorem7=row["theorem7"],
                advanced=row["advanced"],
                pld=row["pld"],
                basic=row["basic"],
                delta_total=float(self.delta_total(party)),
                budget=self._budgets.get(party),
                mechanisms=int(sum(e.count for e in self._events(party))),
            )
        return LedgerReport(self._delta_tilde, parties, tuple(self._entries))
