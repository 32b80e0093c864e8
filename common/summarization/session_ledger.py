"""What a summarization session reports of its privacy: its ledgers and the parts that explain them.

A :class:`SessionLedger` is the typed form of a session report's ``ledger``: the two
:class:`~dpmarket.common.privacy.ledger.LedgerReport` of the session's ledgers (D_v's and the
owners'), the terms the owners were offered (:class:`TermsReport`), the candidates allocation
(:class:`CountsAllocationReport` or :class:`SketchAllocationReport`), PrivAuction's parameters
(:class:`AuctionReport`) and what the owners' published sketches cost them (:class:`SketchCost`).
Each part appears only when the session's method has it. :meth:`SessionLedger.to_json` writes
the JSON document ``report.json`` and the wire (``SessionReport.ledger_json``) carry, and
:meth:`SessionLedger.from_json` reads it back: ``from_json(to_json())`` is the same ledger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from dpmarket.common.privacy.ledger import LedgerReport
from dpmarket.common.summarization.terms import OwnerTerms

__all__ = [
    "AllocationReport",
    "AuctionReport",
    "CountsAllocationReport",
    "HedgeReport",
    "SessionLedger",
    "SketchAllocationReport",
    "SketchCost",
    "TermsReport",
]


@dataclass(frozen=True)
class TermsReport:
    """The terms a session offered every owner (:class:`OwnerTerms`), as its report states them.

    Attributes
    ----------
    method : str
        The terms' method (``OwnerTerms.method.value``, e.g. ``"candidates-sketch"``).
    mechanism : str
        What the epsilon pays for (``OwnerTerms.description``).
    epsilon, delta : float
        The session's spend of one owner's data (``inf`` for the non-private greedy).
    max_rounds : int
        The most Bid rounds (0 for the one-round methods).
    non_private : bool
        Whether exact statistics reach the owners.
    """

    method: str
    mechanism: str
    epsilon: float
    delta: float
    max_rounds: int
    non_private: bool

    @classmethod
    def from_terms(cls, terms: OwnerTerms) -> TermsReport:
        """The report of ``terms``."""
        return cls(
            method=terms.method.value,
            mechanism=terms.description,
            epsilon=terms.epsilon,
            delta=terms.delta,
            max_rounds=terms.max_rounds,
            non_private=terms.non_private,
        )


@dataclass(frozen=True)
class AuctionReport:
    """PrivAuction in a session (Algorithm 3, steps 11-16; Appendix D).

    Attributes
    ----------
    variant : {"pure", "paper"}
    eps_auc : float
        epsilon of one bad iteration.
    tau : int
        The most bad iterations charged (Theorem 6).
    delta_per_bad_iteration : float
        0 for the pure variant; ``1 - exp(-eps_auc)`` for the printed one, whose "not asked" at
        rank 1 (probability 0) has no bounded ratio to rank 2's.
    iterations : int
        Auction iterations the session ran.
    """

    variant: str
    eps_auc: float
    tau: int
    delta_per_bad_iteration: float
    iterations: int


@dataclass(frozen=True)
class SketchCost:
    """What one owner's published RFF sketch cost it: charged once, at publication, to its own
    ledger (not to the sessions that read it).

    Attributes
    ----------
    epsilon, delta : float
        The sketch's guarantee.
    mechanism : str
        Its noise (``"gaussian"``, ``"laplace"``).
    frequencies : int
        m', the RFF map's frequencies (its dimension is 2 m').
    sigma : float or None
        The map's kernel scale, when it has one.
    """

    epsilon: float
    delta: float
    mechanism: str
    frequencies: int
    sigma: float | None


@dataclass(frozen=True)
class HedgeReport:
    """Whether the candidates method kept its own selection or the uniform sample it hedged
    with (the one closer to D_v by the exact MMD²).

    Attributes
    ----------
    uniform_points : int
        Points of the uniform sample (p).
    kept : {"selection", "uniform sample"}
    """

    uniform_points: int
    kept: Literal["selection", "uniform sample"]


@dataclass(frozen=True, kw_only=True)
class AllocationReport:
    """How the candidates method (or its hashes mode) split its budget among the owners.

    Attributes
    ----------
    budget : int
        The most owner points read.
    uniform_shares : dict of str to int
        Each owner's part of the uniform sample the budget starts with.
    gaussian_sigma : float
        The Gaussian validation embedding's noise, in h1 units.
    embedding_prior : str
        What the owners shrank the embedding towards (``"none"`` when they did not).
    shrinkage_metric : str
        Where the owners read the shrinkage's amount (``"embedding"``, ``"scores"`` or
        ``"auto"``: ``CandidatesConfig.shrinkage_metric``; ``"embedding"`` in reports written
        before the field, and meaningless when ``embedding_prior`` is ``"none"``).
    shrinkage_strength : float
        The strength c the owners' shrinkage used, a multiple of the release's noise variance
        (``shrinkage`` times the factor of ``CandidatesConfig.shrinkage_strength``'s rule:
        :func:`dpmarket.common.summarization.candidates.shrinkage_strength`); 0 when the owners
        did not shrink; 1 in reports written before the field.
    shares : dict of str to int
        Each owner's candidates asked for.
    hedge : HedgeReport or None
        The candidates method's choice between its selection and the uniform sample.
    hash_key_id : str or None
        The hashes mode: the id of the key the owners agreed on.
    """

    #: ``"counts"`` or ``"sketch"`` (the subclass's).
    allocation: ClassVar[str] = ""

    budget: int
    uniform_shares: dict[str, int]
    gaussian_sigma: float
    embedding_prior: str
    shares: dict[str, int]
    shrinkage_metric: str = "embedding"
    shrinkage_strength: float = 1.0
    hedge: HedgeReport | None = None
    hash_key_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The allocation's JSON object (``ledger["candidates"]``); ``hedge`` and
        ``hash_key_id`` appear only when set."""
        data = asdict(self)
        for key in ("hedge", "hash_key_id"):
            if data[key] is None:
                del data[key]
        return {"allocation": self.allocation, **data}

    @staticmethod
    def from_json(data: dict[str, Any]) -> AllocationReport:
        """The inverse of :meth:`to_json`.

        Raises
        ------
        ValueError
            If the allocation is neither ``"counts"`` nor ``"sketch"``.
        """
        kinds: dict[str, type[AllocationReport]] = {
            "counts": CountsAllocationReport,
            "sketch": SketchAllocationReport,
        }
        values = dict(data)
        kind = kinds.get(values.pop("allocation", ""))
        if kind is None:
            raise ValueError(f"allocation must be 'counts' or 'sketch', got {data!r}")
        hedge = values.pop("hedge", None)
        return kind(hedge=None if hedge is None else HedgeReport(**hedge), **values)


@dataclass(frozen=True, kw_only=True)
class CountsAllocationReport(AllocationReport):
    """The counts allocation: by the owners' Laplace-noised relevance counts.

    Attributes
    ----------
    allocation_note : str
        Why the counts were used (``"requested"``, or the sketches that were missing).
    relevance_threshold : float
        The score a point must reach to count, in h1 units.
    noisy_counts : dict of str to float
        Each owner's noisy count (post-processing of its Laplace release).
    """

    allocation: ClassVar[str] = "counts"

    allocation_note: str
    relevance_threshold: float
    noisy_counts: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class SketchAllocationReport(AllocationReport):
    """The sketch allocation: by the owners' published sketches (a release about D_v only).

    Attributes
    ----------
    relevance_score : str
        The per-validation-point relevance of a sketch.
    allocation_share : float
        The allocation's share of D_v's Gaussian budget.
    allocation_sigma : float
        The noise of the mean responsibilities' release.
    decision_shrinkage : float
        How far the decision was shrunk towards the even split, in [0, 1].
    noisy_relevance : dict of str to float
        The release itself, per owner.
    """

    allocation: ClassVar[str] = "sketch"

    relevance_score: str
    allocation_share: float
    allocation_sigma: float
    decision_shrinkage: float
    noisy_relevance: dict[str, float]


@dataclass(frozen=True)
class SessionLedger:
    """A session's privacy ledger, as its report states it; a part is None when the session's
    method has none.

    Attributes
    ----------
    validation, owners : LedgerReport or None
        The session's two ledgers (both, once anything was charged): D_v's and the owners'.
    candidates : AllocationReport or None
        The candidates method's allocation.
    owner_sketches : dict of str to SketchCost, or None
        With the sketch allocation: what each owner's sketch cost it.
    auction : AuctionReport or None
        The private and rounds methods' PrivAuction.
    owner_terms : TermsReport or None
        The terms the owners were offered (once the session opened).
    """

    validation: LedgerReport | None = None
    owners: LedgerReport | None = None
    candidates: AllocationReport | None = None
    owner_sketches: dict[str, SketchCost] | None = field(default=None)
    auction: AuctionReport | None = None
    owner_terms: TermsReport | None = None

    @property
    def empty(self) -> bool:
        """Whether the ledger states nothing (a session that failed before it opened)."""
        return self == SessionLedger()

    def party(self, name: Literal["validation", "owners"]) -> LedgerReport | None:
        """The ledger of ``name``'s data."""
        return self.validation if name == "validation" else self.owners

    def to_json(self) -> dict[str, Any]:
        """The ledger's JSON object: a key per part present, in the shape ``report.json`` has
        always had (``{"validation": {"delta_tilde", "parties", "entries"}, "owners": ...,
        "candidates": {...}, "owner_sketches": {...}, "auction": {...}, "owner_terms":
        {...}}``)."""
        out: dict[str, Any] = {}
        if self.validation is not None:
            out["validation"] = self.validation.to_json()
        if self.owners is not None:
            out["owners"] = self.owners.to_json()
        if self.candidates is not None:
            out["candidates"] = self.candidates.to_json()
        if self.owner_sketches is not None:
            out["owner_sketches"] = {o: asdict(c) for o, c in self.owner_sketches.items()}
        if self.auction is not None:
            out["auction"] = asdict(self.auction)
        if self.owner_terms is not None:
            out["owner_terms"] = asdict(self.owner_terms)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionLedger:
        """The inverse of :meth:`to_json`.

        Raises
        ------
        ValueError, TypeError, KeyError
            If ``data`` is not a ledger's JSON object.
        """
        sketches = data.get("owner_sketches")
        return cls(
            validation=_opt(LedgerReport.from_json, data.get("validation")),
            owners=_opt(LedgerReport.from_json, data.get("owners")),
            candidates=_opt(AllocationReport.from_json, data.get("candidates")),
            owner_sketches=(
                None if sketches is None else {o: SketchCost(**c) for o, c in sketches.items()}
            ),
            auction=_opt(lambda d: AuctionReport(**d), data.get("auction")),
            owner_terms=_opt(lambda d: TermsReport(**d), data.get("owner_terms")),
        )


def _opt(read: Any, value: Any) -> Any:
    """``read(value)``, or None for None."""
    return None if value is None else read(value)
