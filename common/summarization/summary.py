"""What a summarization session returns and reports, shared by curator and consumer (each
method's configuration: :mod:`dpmarket.common.summarization.methods`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.market.pricing import Quote
from dpmarket.common.market.terms import NO_REWARD, RewardOffer, quote_from_json, quote_to_json
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.summarization.methods import Method, SummarizationConfig
from dpmarket.common.summarization.session_ledger import SessionLedger

#: Where a session is, as its progress events report it (WatchSession).
SessionStage = Literal["setup", "rounds", "done", "failed"]


@dataclass(frozen=True)
class SessionReport:
    """What a session did: parsimony, privacy spent, failures and time.

    Attributes
    ----------
    owner_points_accessed, validation_points_accessed : int
        Raw points the curator received from owners (summary included) and from the consumer.
    all_owners_bound : int
        K * p.
    paper_bound : float
        Lemma 5's expected bound ``p (1/eps_auc + K/tau) + m`` (private method; 0 otherwise).
    ledger : SessionLedger
        The session's privacy ledger (per party, per composition method) and the parts that
        explain it (terms, allocation, auction); empty for a session that failed before it
        opened.
    wall_time_seconds : float
        Seconds from the start of the session to its end.
    round_seconds : tuple of float
        Wall time of every round, seconds (one entry for the uniform method).
    error : str
        Why the session failed; empty when it succeeded.
    owner_spend : dict of str to SessionSpend
        What each owner's own ledger recorded for the session (owners that closed it).
    left_out : dict of str to str
        Every owner the session ran without, with a public reason (:data:`LEFT_OUT_REASONS`):
        excluded by the consumer, refused by its budget, unreachable, or dropped mid-session.
    quote : Quote or None
        The quote the session was accepted under (:mod:`dpmarket.common.market.terms`): the most
        it could cost; None for a session that failed before it was quoted.
    cost : int or None
        What the session cost, micro-credits, as its signed settlement statement states it
        (:mod:`dpmarket.curator.settlement`); None while it is not settled.
    """

    method: Method
    summary_size: int
    rounds: int
    owner_points_accessed: int
    validation_points_accessed: int
    all_owners_bound: int
    paper_bound: float
    dropped_owners: tuple[str, ...]
    ledger: SessionLedger
    wall_time_seconds: float
    rejected_points: int = 0
    round_seconds: tuple[float, ...] = ()
    error: str = ""
    owner_spend: dict[str, SessionSpend] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    quote: Quote | None = None
    cost: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON object the curator stores and ``report.json`` holds: every
        field by name, the ledger as :meth:`SessionLedger.to_json`, owner spends as objects
        (infinities as JSON ``Infinity``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            dropped_owners=list(self.dropped_owners),
            ledger=self.ledger.to_json(),
            round_seconds=list(self.round_seconds),
            owner_spend={owner: asdict(spend) for owner, spend in self.owner_spend.items()},
            left_out=dict(self.left_out),
            quote=None if self.quote is None else quote_to_json(self.quote),
        )
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionReport:
        """The inverse of :meth:`to_json`.

        Raises
        ------
        ValueError, TypeError, KeyError
            If ``data`` is not a report's JSON object.
        """
        values = dict(data)
        values["dropped_owners"] = tuple(values.get("dropped_owners", ()))
        values["round_seconds"] = tuple(values.get("round_seconds", ()))
        values["ledger"] = SessionLedger.from_json(values.get("ledger") or {})
        values["owner_spend"] = {
            owner: SessionSpend(**spend) for owner, spend in values.get("owner_spend", {}).items()
        }
        quoted = values.get("quote")
        values["quote"] = None if quoted is None else quote_from_json(quoted)
        return cls(**values)


#: The public reasons a session gives for running without an owner (``SessionReport.left_out``):
#: each depends on the request, the owner's budget or the network, never on the owner's data.
#: One more form names the curator's own limit on an owner's reply, which it refused unread:
#: ``"reply over 1.04 MiB to GetOwnerInfo"`` (the method and the limit, nothing of the reply).
LEFT_OUT_REASONS: tuple[str, ...] = (
    "excluded by the consumer",
    "budget refused",
    "refused the session",
    "unreachable",
    "refused a step",
    "broke the protocol",
)


@dataclass(frozen=True)
class OwnerSelection:
    """Which owners a session may run without.

    Parameters
    ----------
    min_owners : int, default 0
        The fewest owners the session may open with. 0: every owner it asks (all but
        ``exclude``). An owner that refuses its terms ("budget refused", "refused the
        session") or cannot be reached ("unreachable") when the session opens is left out,
        and the session runs if at least ``min_owners`` (by default: all) owners remain; else
        it fails, nothing released or charged anywhere, saying how many of the owners asked
        were reachable and who was left out and why (``UNAVAILABLE`` when an owner could not be
        reached, else ``FAILED_PRECONDITION``). A left-out owner is charged nothing and sent
        nothing after its refusal. An owner lost later, mid-session, is dropped and the
        session finishes with the others (the report names it).
    exclude : tuple of str, default ()
        Owners, by name, the consumer leaves out: never asked anything.

    Raises
    ------
    ValueError
        If ``min_owners`` is negative or not an integer, or ``exclude`` repeats a name or holds
        an empty one.
    """

    min_owners: int = 0
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.min_owners, bool) or not isinstance(self.min_owners, int):
            raise ValueError(f"min_owners must be an integer >= 0, got {self.min_owners!r}")
        if self.min_owners < 0:
            raise ValueError(f"min_owners must be an integer >= 0, got {self.min_owners}")
        names = tuple(self.exclude)
        if any(not isinstance(n, str) or not n for n in names):
            raise ValueError(f"exclude must hold owner names, got {list(names)}")
        if len(set(names)) != len(names):
            raise ValueError(f"exclude must not repeat a name, got {list(names)}")
        object.__setattr__(self, "exclude", names)


@dataclass(frozen=True)
class SummaryResult:
    """A finished summary: points in the order they were added, their labels and owners.

    Attributes
    ----------
    points : ndarray of shape (p, n_features), float64
        Of shape (0, n_features) in the hashes mode.
    labels : ndarray of shape (p,), int64, or None when an owner has no labels
    owner_ids : tuple of str, length p
    report : SessionReport
    hashes : ndarray of shape (p, d), float64, or None
        The hashes mode (:class:`~dpmarket.common.summarization.methods.HashesConfig`): h1 of
        the summary points under the owners' secret map
        (:mod:`dpmarket.common.summarization.hashes`); None otherwise.
    """

    points: NDArray[np.float64]
    labels: NDArray[np.int64] | None
    owner_ids: tuple[str, ...]
    report: SessionReport
    hashes: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a session, for progress display and the WatchSession stream."""

    stage: SessionStage
    round: int
    total_rounds: int
    points_accessed: int
    message: str = ""

    @property
    def finished(self) -> bool:
        """Whether the session has ended (done or failed)."""
        return self.stage in ("done", "failed")


@dataclass(frozen=True)
class SessionRequest:
    """What a consumer asks of a summarization session.

    Attributes
    ----------
    config : SummarizationConfig
        The method's configuration (its type is the method), p among its fields.
    validation : ndarray of shape (m, n)
        The consumer's validation set D_v (features only; its labels never leave the consumer).
    seed_set : ndarray of shape (n0, n), or None
        The public seed set D_init; None: none (zero rows).
    seed : int or None
        Seeds every random draw of the session, noise included (reproducible runs; a curator
        honours it only with ``--allow-seeded-sessions``); None: a CSPRNG-seeded generator and
        OpenDP's samplers.
    selection : OwnerSelection
        Owners to leave out by name, and the fewest the session may run with.
    schema : Schema or None
        The public schema the validation set was read through (owners that declare another are
        refused).
    feature_names : tuple of str
        The validation set's column names when it was read from a table without a schema
        (owners with a schema must have these features, in this order).
    unread : dict of str to value
        Parameters of other methods the request carried (the wire carries every method's):
        bounded by the curator's policy like the method's own, then ignored.
    max_cost : int or None
        The most the consumer pays, micro-credits (``request --max-cost``); None: no cap. A
        quote above it is refused before anything is released or charged
        (:func:`~dpmarket.common.market.pricing.check_cap`).
    reward : RewardOffer
        A value-based reward split by the private payout release
        (:class:`~dpmarket.common.market.terms.RewardOffer`); default none.

    Notes
    -----
    The arrays are checked by the session that runs the request (shape, NaN/inf, widths).
    """

    config: SummarizationConfig
    validation: NDArray[np.float64]
    seed_set: NDArray[np.float64] | None = None
    seed: int | None = None
    selection: OwnerSelection = field(default_factory=lambda: OwnerSelection())
    schema: Schema | None = None
    feature_names: tuple[str, ...] = ()
    unread: dict[str, Any] = field(default_factory=dict)
    max_cost: int | None = None
    reward: RewardOffer = NO_REWARD

    @property
    def seed_points(self) -> NDArray[np.float64]:
        """The seed set, of shape (n0, n) (zero rows when there is none)."""
        if self.seed_set is not None:
            return self.seed_set
        return np.zeros((0, np.shape(self.validation)[-1]))
