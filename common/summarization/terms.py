"""What a summarization session spends of each owner's privacy, and what it may ask: its terms.

Before a session opens, the curator tells every owner what the whole session will cost its data
and which method it runs (:class:`OwnerTerms`); the owner checks the terms against its own policy
and charges them to its own ledger before its first release. The terms are computed here, from
the session's configuration alone, by the same event lists the curator's ledger charges
(:mod:`dpmarket.common.summarization.calibration`), so that what an owner is told and what the
session charges cannot drift apart.

The method is typed (:class:`SessionMethod`), not a description: each owner derives from it the
steps it answers, in their order (:data:`METHOD_STEPS`), and refuses every other step, so a
curator cannot ask for a data-dependent answer the terms do not charge (a bid under the uniform
method's ``(0, 0)``) nor repeat a noisy release for fresh noise (:mod:`dpmarket.owner.steps`).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.summarization.auction import iteration_limit
from dpmarket.common.summarization.calibration import (
    paper_auction,
    paper_mode_events,
    rounds_auction,
    rounds_mode_events,
)
from dpmarket.common.summarization.methods import (
    AllocationFields,
    CandidatesConfig,
    GreedyConfig,
    HashesConfig,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
    UniformConfig,
)
from dpmarket.common.validation import check_positive_int

if TYPE_CHECKING:
    from dpmarket.common.market.terms import MarketTerms

__all__ = [
    "METHOD_STEPS",
    "MIN_NOISE_EPSILON",
    "SERVED_AS",
    "MethodOffer",
    "OwnerAccess",
    "OwnerTerms",
    "SessionMethod",
    "Step",
    "TermsEpsilon",
    "access_refusal",
    "approximate_delta",
    "owner_terms",
    "reward_refusal",
]


class SessionMethod(enum.Enum):
    """The method a session runs at an owner, as its terms state it.

    One value per way the curator may use an owner: the summarization methods, the candidates
    method split by its allocation (the noisy counts are a release of the owner's data, the
    sketches' shares are not) and by the form of its summary (raw points, or the less-trusted
    curator's hashes, :mod:`dpmarket.common.summarization.hashes`).
    """

    UNIFORM = "uniform"
    CANDIDATES_COUNTS = "candidates-counts"
    CANDIDATES_SKETCH = "candidates-sketch"
    HASHES_COUNTS = "hashes-counts"
    HASHES_SKETCH = "hashes-sketch"
    PRIVATE = "private"
    ROUNDS = "rounds"
    GREEDY = "greedy"


class Step(enum.Enum):
    """A step of a summarization session at an owner: an RPC of ``OwnerService`` (or an
    in-process call of the hashes mode), named by its value."""

    VALIDATION_EMBEDDING = "SetValidationEmbedding"
    SAMPLE = "SampleUniform"
    COUNT = "CountRelevant"
    CANDIDATES = "ProposeCandidates"
    HASH_ADVERT = "HashAdvertise"
    HASH_SECRET = "HashDistribute/HashReceive"
    HASHES = "ProposeHashes"
    ROUNDS = "Bid/ReleasePoint"


#: The steps each method's terms allow, in the order an owner answers them. Every step is
#: answered once, except the rounds (one Bid per round, up to the terms' ``max_rounds``, and
#: at most one ReleasePoint of the point bid in the round just bid).
METHOD_STEPS: dict[SessionMethod, tuple[Step, ...]] = {
    SessionMethod.UNIFORM: (Step.SAMPLE,),
    SessionMethod.CANDIDATES_COUNTS: (Step.VALIDATION_EMBEDDING, Step.COUNT, Step.CANDIDATES),
    SessionMethod.CANDIDATES_SKETCH: (Step.VALIDATION_EMBEDDING, Step.CANDIDATES),
    SessionMethod.HASHES_COUNTS: (
        Step.VALIDATION_EMBEDDING,
        Step.COUNT,
        Step.HASH_ADVERT,
        Step.HASH_SECRET,
        Step.HASHES,
    ),
    SessionMethod.HASHES_SKETCH: (
        Step.VALIDATION_EMBEDDING,
        Step.HASH_ADVERT,
        Step.HASH_SECRET,
        Step.HASHES,
    ),
    SessionMethod.PRIVATE: (Step.VALIDATION_EMBEDDING, Step.ROUNDS),
    SessionMethod.ROUNDS: (Step.VALIDATION_EMBEDDING, Step.ROUNDS),
    SessionMethod.GREEDY: (Step.VALIDATION_EMBEDDING, Step.ROUNDS),
}


#: The session method a summarization method runs at an owner, as far as what it asks of the
#: owner's policy goes (the candidates method's counts allocation and hashes mode ask the same
#: access as its sketch allocation).
SERVED_AS: dict[str, SessionMethod] = {
    "uniform": SessionMethod.UNIFORM,
    "candidates": SessionMethod.CANDIDATES_SKETCH,
    "private": SessionMethod.PRIVATE,
    "rounds": SessionMethod.ROUNDS,
    "greedy": SessionMethod.GREEDY,
}


@dataclass(frozen=True)
class OwnerAccess:
    """The flags of an owner's policy that decide which summarization methods it serves,
    published in its description so that a consumer learns, before it asks, which methods a
    deployment serves (they are the owner's terms, not its data).

    Attributes
    ----------
    allow_exact_bids : bool
        ``access.allow_exact_bids``: the per-round methods (private, rounds, greedy).
    allow_steered_selection : bool
        ``access.allow_steered_selection``: the candidates method (and its hashes mode).
    allow_non_private : bool
        ``access.allow_non_private``: a non-private method (greedy).
    allow_reward_disclosure : bool
        ``access.allow_reward_disclosure``: a session with a consumer's reward, whatever its
        method (:func:`reward_refusal`).
    """

    allow_exact_bids: bool = False
    allow_steered_selection: bool = False
    allow_non_private: bool = False
    allow_reward_disclosure: bool = False


@dataclass(frozen=True)
class MethodOffer:
    """A summarization method as a deployment serves it (the curator's ``ListMethods``:
    :meth:`dpmarket.curator.sessions.SessionManager.methods`).

    Attributes
    ----------
    method : str
    served : bool
        The curator's policy serves it and no owner is known to refuse it.
    reason : str
        Why not, or what to know ("" when the curator and every owner serve it).
    serving, refusing : tuple of str
        The owners that would serve it (their published access allows it, or they publish
        none), and those that refuse it.
    """

    method: str
    served: bool
    reason: str = ""
    serving: tuple[str, ...] = ()
    refusing: tuple[str, ...] = ()

    @property
    def by_policy(self) -> bool:
        """Whether the curator's policy serves the method (it names the refusing owners only
        of a method it serves)."""
        return self.served or bool(self.refusing)

    def runs_with(self, min_owners: int) -> bool:
        """Whether a session of this method asking every owner, with ``min_owners`` as
        :class:`~dpmarket.common.summarization.summary.OwnerSelection` takes it, would open:
        with 0, only when no owner is known to refuse it (:attr:`served`); otherwise when the
        curator's policy serves it and at least ``min_owners`` owners do (the refusing ones are
        left out when the session opens, charged nothing).

        Raises
        ------
        ValueError
            If ``min_owners`` is negative.
        """
        if min_owners < 0:
            raise ValueError(f"min_owners must be >= 0, got {min_owners}")
        if min_owners == 0:
            return self.served
        return self.by_policy and len(self.serving) >= min_owners


def access_refusal(method: str, access: OwnerAccess) -> str | None:
    """Why an owner whose policy has ``access`` refuses a session of the summarization
    ``method`` when it opens (the checks of :mod:`dpmarket.owner.terms` and its ledger's
    refusal of a non-private method), or None when its access lets the method run.

    Parameters
    ----------
    method : str
        A summarization method (:data:`SERVED_AS`).
    access : OwnerAccess
        The owner's published access flags.

    Returns
    -------
    str or None
        The policy flags it leaves off, e.g. ``"access.allow_exact_bids off"``.

    Raises
    ------
    KeyError
        For an unknown method.
    """
    session = SERVED_AS[method]
    steps = set(METHOD_STEPS[session])
    missing = []
    if Step.ROUNDS in steps and not access.allow_exact_bids:
        missing.append("access.allow_exact_bids")
    if {Step.CANDIDATES, Step.HASHES} & steps and not access.allow_steered_selection:
        missing.append("access.allow_steered_selection")
    if session is SessionMethod.GREEDY and not access.allow_non_private:
        missing.append("access.allow_non_private")
    return None if not missing else f"{' and '.join(missing)} off"


def reward_refusal(access: OwnerAccess) -> str | None:
    """Why an owner whose policy has ``access`` refuses a session with a consumer's reward when
    it opens (:func:`dpmarket.owner.terms.check_reward_disclosure`), or None when it consents.

    Returns
    -------
    str or None
        ``"access.allow_reward_disclosure off"``, or None.
    """
    return None if access.allow_reward_disclosure else "access.allow_reward_disclosure off"


class TermsEpsilon(enum.Enum):
    """What a method's terms must state as epsilon, from what its steps release."""

    #: Raw points only (each charged as a point): ``(0, 0)``.
    NONE = "0: raw points only"
    #: The owner's own Laplace count, the one release its epsilon pays for: finite, > 0.
    OWNER_NOISE = "> 0: the owner's Laplace relevance count"
    #: Bids to the curator, whose releases and auction the epsilon pays for: finite, > 0.
    CURATOR_RELEASES = "> 0: the curator's embeddings and auction over the bids"
    #: Exact statistics to every owner: infinite (non-private).
    NON_PRIVATE = "inf: non-private"


#: The smallest epsilon terms may state for an owner's own Laplace count
#: (:attr:`TermsEpsilon.OWNER_NOISE`): one micro-epsilon, the market's unit of epsilon
#: (:data:`dpmarket.common.market.money.EPSILON_UNITS`), so the count's noise scale
#: ``1 / epsilon`` (sensitivity 1) is at most 10^6, finite. Below it (5e-324 gives a scale of
#: inf) the count cannot be drawn, and terms accepted there would charge a session that
#: releases nothing; they are refused before anything is charged.
MIN_NOISE_EPSILON = 1e-6

#: What each method's epsilon must be (checked by :class:`OwnerTerms`).
METHOD_EPSILON: dict[SessionMethod, TermsEpsilon] = {
    SessionMethod.UNIFORM: TermsEpsilon.NONE,
    SessionMethod.CANDIDATES_COUNTS: TermsEpsilon.OWNER_NOISE,
    SessionMethod.CANDIDATES_SKETCH: TermsEpsilon.NONE,
    SessionMethod.HASHES_COUNTS: TermsEpsilon.OWNER_NOISE,
    SessionMethod.HASHES_SKETCH: TermsEpsilon.NONE,
    SessionMethod.PRIVATE: TermsEpsilon.CURATOR_RELEASES,
    SessionMethod.ROUNDS: TermsEpsilon.CURATOR_RELEASES,
    SessionMethod.GREEDY: TermsEpsilon.NON_PRIVATE,
}


@dataclass(frozen=True)
class OwnerTerms:
    """What a session may ask of one owner and what it spends of the owner's privacy.

    Attributes
    ----------
    method : SessionMethod
        The method the session runs; the owner answers only its steps (:data:`METHOD_STEPS`).
    epsilon : float
        epsilon of the whole session with respect to one owner's data (replace one point of one
        owner's data): ``0`` for the methods that release only raw points (uniform, the
        candidates method with the sketch allocation); finite and ``> 0`` for the count
        allocation (the owner's Laplace count, drawn at this epsilon, is its only release that
        is not a raw point) and the per-round methods; ``inf`` for the non-private greedy.
    delta : float
        The delta at which ``epsilon`` holds, in ``[0, 1)``; ``0`` with ``epsilon`` 0.
    max_rounds : int
        The per-round methods: the most Bid rounds the session runs
        (:func:`~dpmarket.common.summarization.auction.iteration_limit`), >= 1; 0 for the others.
    description : str
        What the epsilon pays for, for the curator's report; decides nothing and is not sent to
        the owners (an owner describes a session by its method).
    market : MarketTerms or None
        One owner's part of the session's quote and settlement
        (:class:`~dpmarket.common.market.terms.MarketTerms`), set per owner when the session
        opens; None: the session carries no quote (accepted only by a free owner).

    Raises
    ------
    ValueError
        If ``method`` is not a :class:`SessionMethod`, ``epsilon`` is not what the method
        releases (:data:`METHOD_EPSILON`: 0, finite and > 0 (at least
        :data:`MIN_NOISE_EPSILON` for the owner's Laplace count), or infinite), ``delta`` is outside
        ``[0, 1)`` (or not 0 with ``epsilon`` 0), or ``max_rounds`` is not >= 1 for a
        per-round method and 0 for the others.
    """

    method: SessionMethod
    epsilon: float
    delta: float
    max_rounds: int = 0
    description: str = ""
    market: MarketTerms | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, SessionMethod):
            raise ValueError(
                f"method must be one of {[m.value for m in SessionMethod]}, got {self.method!r}"
            )
        eps, dl = float(self.epsilon), float(self.delta)
        name = self.method.value
        if math.isnan(eps) or eps < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if not (math.isfinite(dl) and 0.0 <= dl < 1.0):
            raise ValueError(f"delta must lie in [0, 1), got {self.delta}")
        rule = METHOD_EPSILON[self.method]
        if rule is TermsEpsilon.NONE and (eps != 0.0 or dl != 0.0):
            raise ValueError(
                f"the {name} method releases only raw points: its epsilon and delta must be 0, "
                f"got ({eps:g}, {dl:g})"
            )
        if rule in (TermsEpsilon.OWNER_NOISE, TermsEpsilon.CURATOR_RELEASES) and not (
            math.isfinite(eps) and eps > 0
        ):
            raise ValueError(
                f"the {name} method needs a finite epsilon > 0 ({rule.value}), got {eps:g}"
            )
        if rule is TermsEpsilon.OWNER_NOISE and eps < MIN_NOISE_EPSILON:
            raise ValueError(
                f"the {name} method draws the owner's Laplace count at its epsilon: it must be "
                f"at least {MIN_NOISE_EPSILON:g} (noise scale 1/epsilon at most "
                f"{1 / MIN_NOISE_EPSILON:g}), got {eps:g}; ask for a larger epsilon"
            )
        if rule is TermsEpsilon.NON_PRIVATE and not math.isinf(eps):
            raise ValueError(
                f"the {name} method is non-private: its epsilon must be inf, got {eps:g}"
            )
        rounds = self.max_rounds
        if isinstance(rounds, bool) or int(rounds) != rounds:
            raise ValueError(f"max_rounds must be an integer, got {rounds!r}")
        if Step.ROUNDS in METHOD_STEPS[self.method]:
            if rounds < 1:
                raise ValueError(f"the {name} method bids in rounds: max_rounds must be >= 1")
        elif rounds != 0:
            raise ValueError(f"the {name} method has no rounds: max_rounds must be 0")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dl)
        object.__setattr__(self, "max_rounds", int(rounds))

    @property
    def non_private(self) -> bool:
        """The session releases exact statistics of the owners' data to the other owners."""
        return METHOD_EPSILON[self.method] is TermsEpsilon.NON_PRIVATE

    @property
    def exact_bids(self) -> bool:
        """The session's steps answer the curator with exact values computed from the owner's
        rows: the per-round methods, whose ``Bid`` returns the exact score of the owner's best
        point for a direction the curator chooses (the paper's auction trusts the curator with
        them; the epsilon pays for what the curator releases, not for the bids it sees).
        An owner serves them only if its policy says so (``access.allow_exact_bids``)."""
        return Step.ROUNDS in METHOD_STEPS[self.method]

    @property
    def steered_selection(self) -> bool:
        """The session's steps send rows (or their hashes) that the owner picks by their score
        along an embedding the curator sends (the validation embedding, in h1's features whose
        parameters the curator draws): the candidates methods and their hashes mode. Which rows
        are picked says how they compare with the rows not sent, which no epsilon charges; an
        owner serves them only if its policy says so (``access.allow_steered_selection``)."""
        return bool({Step.CANDIDATES, Step.HASHES} & set(METHOD_STEPS[self.method]))

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps the terms allow, in order (:data:`METHOD_STEPS`)."""
        return METHOD_STEPS[self.method]

    @property
    def mechanism(self) -> str:
        """How an owner's ledger names the session's terms: the method."""
        return self.method.value


def approximate_delta(events: list[PrivacyEvent]) -> float:
    """Probability mass of infinite privacy loss that approximate events add.

    ``1 - prod (1 - delta_l)^count_l`` over the ``"approximate"`` events (the PLD of an
    ``(epsilon, delta)``-DP event has infinite loss with probability ``delta``); Gaussian events'
    deltas are not included: their PLDs are exact.
    """
    log_keep = sum(e.count * math.log1p(-e.delta) for e in events if e.mechanism == "approximate")
    return -math.expm1(log_keep)


def _composed(
    events: list[PrivacyEvent],
    base_delta: float,
    label: str,
    method: SessionMethod,
    max_rounds: int,
) -> OwnerTerms:
    """``(pld_epsilon(events, delta), delta)`` with ``delta`` the base delta plus the
    approximate events' infinite-loss mass (:func:`approximate_delta`)."""
    delta = base_delta + approximate_delta(events)
    if delta >= 1.0:
        raise ValueError(f"{label}: the session's delta {delta:.6g} is not below 1")
    return OwnerTerms(method, pld_epsilon(events, delta), delta, max_rounds, label)


@functools.singledispatch
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
        A method's configuration; each method states its own terms (one function registered
        per configuration class below).
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
        * uniform: method ``UNIFORM``, ``(0, 0)``: only raw points, which the owner's
          point limits bound.
        * greedy: ``GREEDY``, non-private (exact embeddings of acquired points reach every
          owner), at most ``2 p`` Bid rounds.
        * candidates: ``CANDIDATES_COUNTS``, ``(epsilon_owners_total, 0)``: the one
          Laplace release of the relevance count, whose noise the owner draws itself; with the
          sketch allocation ``CANDIDATES_SKETCH``, ``(0, 0)``: the owners release only raw
          points to the trusted curator, and the shares they receive are post-processing of the
          published sketches (whose epsilon their publication charged once) and of a release
          about D_v. ``HASHES_COUNTS`` and ``HASHES_SKETCH`` alike in the hashes
          mode (:class:`~dpmarket.common.summarization.methods.HashesConfig`).
        * private: ``PRIVATE``, the PLD epsilon of :func:`paper_mode_events`'s owner
          events at ``delta_owners`` plus, for the printed auction, its infinite-loss mass.
        * rounds: ``ROUNDS``, the same for :func:`rounds_mode_events` at ``delta``.

        The per-round methods state the most Bid rounds the session runs
        (:func:`~dpmarket.common.summarization.auction.iteration_limit` of the session's auction).

    Raises
    ------
    ValueError
        If an integer argument is out of range, or the printed auction's delta reaches 1.
    TypeError
        If ``config`` is not a method's configuration.

    Notes
    -----
    Everything an owner receives in a session is post-processing of the releases these events
    describe, so the terms bound what the session reveals to an owner about the other owners'
    data (the neighbouring relation of the ledger's ``"owners"`` party). The PLD epsilon at a
    delta above the approximate events' mass is finite and sound: the PLD of an
    ``(epsilon, delta)`` event puts mass ``delta`` on infinite loss, which a composition's delta
    must cover.
    """
    raise TypeError(f"no terms for {type(config).__name__}: not a method's configuration")


def _counts(n_owners: int, validation_size: int) -> None:
    """Check the arguments every method's terms take."""
    check_positive_int(n_owners, "n_owners")
    check_positive_int(validation_size, "validation_size")


@owner_terms.register
def _uniform(
    config: UniformConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    return OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0, 0, "uniform sample: raw points only")


@owner_terms.register
def _greedy(
    config: GreedyConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    rounds = iteration_limit(config.summary_size, None)
    label = "non-private greedy: exact embeddings"
    return OwnerTerms(SessionMethod.GREEDY, math.inf, 0.0, rounds, label)


def _allocation_terms(
    config: AllocationFields,
    sketch_allocation: bool,
    by_sketch: SessionMethod,
    by_counts: SessionMethod,
) -> OwnerTerms:
    """The candidates method's terms (and its hashes mode's): ``(0, 0)`` by sketches, the
    Laplace count's ``(epsilon_owners_total, 0)`` by counts."""
    if sketch_allocation:
        return OwnerTerms(
            by_sketch, 0.0, 0.0, 0, "candidates by published sketches: raw points only"
        )
    return OwnerTerms(by_counts, config.epsilon_owners_total, 0.0, 0, "Laplace relevance count")


@owner_terms.register
def _candidates(
    config: CandidatesConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    return _allocation_terms(
        config, sketch_allocation, SessionMethod.CANDIDATES_SKETCH, SessionMethod.CANDIDATES_COUNTS
    )


@owner_terms.register
def _hashes(
    config: HashesConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    return _allocation_terms(
        config, sketch_allocation, SessionMethod.HASHES_SKETCH, SessionMethod.HASHES_COUNTS
    )


@owner_terms.register
def _private(
    config: PrivateConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    rounds = iteration_limit(config.summary_size, paper_auction(config, n_owners))
    events = paper_mode_events(config, n_owners, seed_set_size=seed_set_size)["owners"]
    label = f"h2 summary embeddings + PrivAuction ({config.auction})"
    return _composed(events, config.delta_owners, label, SessionMethod.PRIVATE, rounds)


@owner_terms.register
def _rounds(
    config: RoundsConfig,
    n_owners: int,
    *,
    validation_size: int,
    seed_set_size: int,
    sketch_allocation: bool = False,
) -> OwnerTerms:
    _counts(n_owners, validation_size)
    rounds = iteration_limit(config.summary_size, rounds_auction(config, n_owners))
    events = rounds_mode_events(
        config, n_owners, validation_size=validation_size, seed_set_size=seed_set_size
    )["owners"]
    label = f"{config.summary_release} summary release + PrivAuction ({config.auction})"
    return _composed(events, config.delta, label, SessionMethod.ROUNDS, rounds)
