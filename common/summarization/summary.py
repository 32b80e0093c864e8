"""Configuration and result types of a summarization session, shared by curator and consumer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.auction import AUCTION_VARIANTS, AuctionVariant
from dpmarket.common.summarization.sketch_allocation import RELEVANCE_SCORES, RelevanceScore
from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

Method = Literal["private", "greedy", "uniform", "candidates", "rounds"]
Stage = Literal["setup", "rounds", "done", "failed"]
METHODS: tuple[Method, ...] = ("candidates", "private", "greedy", "uniform", "rounds")
ValidationRelease = Literal["mwem", "gaussian"]
SummaryRelease = Literal["mwem", "tree", "none"]
PoolScoring = Literal["embedding", "exact"]
Allocation = Literal["sketch", "counts"]
EmbeddingPrior = Literal["owner", "seed", "none"]
SummaryForm = Literal["points", "hashes"]
#: Allowed values of the ``"rounds"`` method's options.
VALIDATION_RELEASES: tuple[ValidationRelease, ...] = ("mwem", "gaussian")
SUMMARY_RELEASES: tuple[SummaryRelease, ...] = ("mwem", "tree", "none")
POOL_SCORINGS: tuple[PoolScoring, ...] = ("embedding", "exact")
#: How the candidates method splits its candidate budget among owners (default first).
ALLOCATIONS: tuple[Allocation, ...] = ("sketch", "counts")
#: delta~ of the owners' composition bound in the summarization paper's Section 4 (its summary
#: and auction); reproductions of the paper's settings pass it as ``delta_owners``.
PAPER_DELTA_OWNERS = 1e-4
#: What an owner's candidate proposal shrinks the noisy validation embedding towards (default
#: first).
EMBEDDING_PRIORS: tuple[EmbeddingPrior, ...] = ("owner", "seed", "none")
#: What the curator and the consumer receive of the summary (default first).
SUMMARY_FORMS: tuple[SummaryForm, ...] = ("points", "hashes")
#: PrivAuction variants (``dpmarket.common.summarization.auction``).
AUCTIONS: tuple[AuctionVariant, ...] = AUCTION_VARIANTS


@dataclass(frozen=True)
class SummarizationConfig:
    """Parameters of one summarization session; defaults follow Section 4 and Table 1.

    Parameters
    ----------
    summary_size : int
        p, the number of owner points in the summary (seed set excluded).
    method : {"candidates", "private", "greedy", "uniform", "rounds"}
        The candidates method (:mod:`dpmarket.common.summarization.candidates`, the default: best
        measured quality at a given epsilon), Algorithm 3 (h2 embeddings + PrivAuction), non-private
        greedy on exact mean h1 embeddings, p/K points drawn uniformly from every owner, or
        ``"rounds"``: Algorithm 3's per-round protocol whose validation release, summary release and
        pool scoring are chosen by ``validation_release``, ``summary_release`` and ``pool_scoring``
        (docs/how-it-works.md, "Methods").
    rff_dimension : int
        d, the dimension of h1 (Table 1: 140).
    gamma : float
        RBF kernel parameter in ``exp(-gamma ||x - y||^2)`` (Table 1: 0.1), in 1 / squared
        feature units.
    epsilon_validation : float
        epsilon of each h2 iteration on the validation set (Table 1: 0.01).
    iterations_initial : int
        MWEM iterations T_init for the validation set and the first epoch (Table 1: d^1.5 = 1656;
        0 means ``floor(d ** 1.5)``).
    iterations_subsequent : int
        MWEM iterations T_subs per later epoch (Table 1: 5).
    epsilon_first_epoch : float
        epsilon per h2 iteration in epoch 1, whose summary is the public seed set (Table 1: 0.05).
    epsilon_summary : float
        Later epochs use ``epsilon_summary / sqrt(p * T_subs)`` per iteration (Table 1: 0.01).
    quantization_step : float
        eta of the grid {-1, -1+eta, ..., 1} (Theorem 2: eta <= 1/d; 0 means the largest eta <= 1/d
        with 2/eta an integer).
    epsilon_auction : float
        Total epsilon of PrivAuction's winner notification (Theorem 6).
    delta_owners : float
        delta of the auction's eps_auc and of the owners' composition bound (Theorem 7's delta~),
        which the private method's terms state to every owner. Default 1e-6, the delta every
        method states by default (``delta``) and the most the shipped owner policy allows one
        session; Section 4 uses :data:`PAPER_DELTA_OWNERS` (1e-4).
    delta_validation : float
        delta~ of the validation set's composition bound (Section 4: 0.01).
    epsilon_validation_total : float
        Candidates and rounds methods: epsilon of the Gaussian release of the validation
        embedding.
    epsilon_owners_total : float
        Candidates method: epsilon of the Laplace-noised relevance counts, w.r.t. each owner's
        data. Rounds method: PLD epsilon (at ``delta``) of everything the owners' data
        influences (summary releases and PrivAuction) when ``summary_release`` is ``"tree"`` or
        ``"none"``.
    delta : float
        Candidates and rounds methods: delta of the Gaussian mechanisms and of every reported
        epsilon.
    candidate_fraction : float
        Candidates method: when > 0, the previous budget rule: the curator accesses at most
        ``max(p, floor(candidate_fraction * K * p))`` owner points (it grows with K). 0 (the
        default): ``candidate_multiple`` decides.
    candidate_multiple : float
        Candidates method: the curator accesses at most ``max(p, floor(candidate_multiple * p))``
        owner points, whatever the number of owners K (default 3; ``candidate_fraction`` > 0
        overrides it).
    allocation : {"sketch", "counts"}
        Candidates method: split the candidate budget by the owners' published RFF sketches
        (:mod:`dpmarket.common.summarization.sketch_allocation`: a Gaussian release about D_v only,
        charged to the validation party; the owners pay nothing at summarization time) when every
        owner has one, else (or with ``"counts"``) by the owners' Laplace-noised relevance counts.
    relevance_score : {"mmd", "share", "density", "mass", "m2m"}
        Sketch allocation: the per-validation-point relevance of an owner's sketch
        (:func:`dpmarket.common.summarization.sketch_allocation.relevance_matrix`). The default and
        every constant of the allocation below were chosen by leave-one-scenario-out on the scenario
        suite (:mod:`dpmarket.experiments.suite_eval`, docs/results.md "Scenario suite").
    relevance_norm_weight : float
        Sketch allocation, ``"mmd"`` score: the weight in (0, 1] of each sketch's squared norm
        in its distance to a validation point (1: the MMD; the norm favours diffuse owners;
        default 0.25).
    allocation_share : float
        Sketch allocation: share of the validation party's budget (of the squared Gaussian
        privacy-loss scale,
        :func:`~dpmarket.common.summarization.sketch_allocation.split_gaussian_sigmas`) spent on the
        allocation; the validation embedding gets the rest. In (0, 1), or 0 (the default): derived
        from the public m, K, epsilon and delta
        (:func:`~dpmarket.common.summarization.sketch_allocation.derived_allocation_share`).
    embedding_prior : {"owner", "seed", "none"}
        Candidates method: what each owner's proposal shrinks the noisy validation embedding towards
        (James-Stein, at the owner) before its local greedy: ``"owner"`` (the default), the owner's
        own mean h1; ``"seed"``, the public seed set's mean h1 or the owner's own, whichever the
        release lies nearer to in the metric of the owner's scores (the owner's own without a seed
        set); ``"none"``, nothing
        (:func:`dpmarket.common.summarization.candidates.shrink_towards_points`). Never towards
        zero: that only scales the embedding down (docs/results.md, "Scenario suite").
    shrinkage : float
        Candidates method: the strength of that shrinkage, a multiple > 0 of the embedding's
        noise variance (1, the default: the James-Stein amount).
    summary_form : {"points", "hashes"}
        Candidates method: what the curator and the consumer receive of the summary: the raw points,
        or (the paper's less-trusted curator, Appendix F) only their h1 hashes under a map the
        owners agree on among themselves (:mod:`dpmarket.common.summarization.hashes`; budget p, no
        re-ranking). In process only in this release: networked requests do not carry it.
    relevance_threshold : float
        Candidates method: a point is relevant when its score ``gtilde . h1(x)`` is at least
        ``relevance_threshold * ||gtilde||^2`` (the typical score of a validation point).
    candidate_even_share : float
        Candidates method: share of the budget beyond its uniform sample of p points that is
        split evenly among owners before the rest is split in proportion to the noisy relevance
        counts or decision (chosen on the scenario suite: docs/results.md, "Scenario suite").
    embedding_rerank : bool
        Candidates method: choose the summary among the candidates by the private embedding
        instead of the exact kernel (to measure what exact re-ranking adds).
    validation_release : {"gaussian", "mwem"}
        Rounds method: gtilde by the Gaussian mechanism on ``mean h1(D_v)`` at
        ``(epsilon_validation_total, delta)``, or by h2 (MWEM) exactly as the paper's mode
        (``epsilon_validation`` per iteration, ``T_init`` iterations).
    summary_release : {"tree", "mwem", "none"}
        Rounds method: the running summary embedding by the binary-tree continual release of the
        prefix sum of h1 of the acquired points (:mod:`dpmarket.common.summarization.continual`;
        noise calibrated so the owners' PLD epsilon is ``epsilon_owners_total``), by h2 each round
        as the paper, or not at all (owners bid with the validation embedding only).
    pool_scoring : {"exact", "embedding"}
        Rounds method: the curator adds the pool point with the largest exact marginal gain
        (:func:`dpmarket.common.summarization.kernels.marginal_gain_score`; it holds D_v and the
        summary) or the largest private-embedding bid (the paper's step 15).
    auction_share : float
        Rounds method, ``summary_release`` "tree" or "mwem": PrivAuction gets
        ``auction_share * epsilon_owners_total`` as its Theorem-6 epsilon, in (0, 1].
    auction : {"pure", "paper"}
        Private and rounds methods: the PrivAuction variant. ``"pure"`` (default) asks every
        rank, the first included, with a probability below 1, so that each bad iteration is pure
        ``eps_auc``-DP; ``"paper"`` is Algorithm 3 as printed, whose bad iterations are
        ``(eps_auc, 1 - exp(-eps_auc))``-DP and are charged so
        (:func:`dpmarket.common.summarization.auction.auction_events`).

    Raises
    ------
    ValueError
        If any value is out of range.
    """

    summary_size: int
    method: Method = "candidates"
    rff_dimension: int = 140
    gamma: float = 0.1
    epsilon_validation: float = 0.01
    iterations_initial: int = 0
    iterations_subsequent: int = 5
    epsilon_first_epoch: float = 0.05
    epsilon_summary: float = 0.01
    quantization_step: float = 0.0
    epsilon_auction: float = 1.0
    delta_owners: float = 1e-6
    delta_validation: float = 0.01
    epsilon_validation_total: float = 1.0
    epsilon_owners_total: float = 1.0
    delta: float = 1e-6
    candidate_fraction: float = 0.0
    candidate_multiple: float = 3.0
    relevance_threshold: float = 0.5
    candidate_even_share: float = 0.0
    embedding_rerank: bool = False
    validation_release: ValidationRelease = "gaussian"
    summary_release: SummaryRelease = "tree"
    pool_scoring: PoolScoring = "exact"
    auction_share: float = 0.5
    auction: AuctionVariant = "pure"
    allocation: Allocation = "sketch"
    relevance_score: RelevanceScore = "mmd"
    allocation_share: float = 0.0
    embedding_prior: EmbeddingPrior = "owner"
    shrinkage: float = 1.0
    relevance_norm_weight: float = 0.25
    summary_form: SummaryForm = "points"

    def __post_init__(self) -> None:
        check_positive_int(self.summary_size, "summary_size")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        check_positive_int(self.rff_dimension, "rff_dimension")
        check_epsilon(self.gamma, "gamma")
        check_epsilon(self.epsilon_validation, "epsilon_validation")
        if self.iterations_initial != 0:
            check_positive_int(self.iterations_initial, "iterations_initial")
        check_positive_int(self.iterations_subsequent, "iterations_subsequent")
        check_epsilon(self.epsilon_first_epoch, "epsilon_first_epoch")
        check_epsilon(self.epsilon_summary, "epsilon_summary")
        if self.quantization_step != 0:
            eta = float(self.quantization_step)
            if not (0 < eta <= 1) or abs(2 / eta - round(2 / eta)) > 1e-9:
                raise ValueError(
                    f"quantization_step must be in (0, 1] with 2/eta an integer, got {eta}"
                )
        check_epsilon(self.epsilon_auction, "epsilon_auction")
        check_delta(self.delta_owners, "delta_owners", upper=1 / math.e)
        check_delta(self.delta_validation, "delta_validation", upper=1 / math.e)
        check_epsilon(self.epsilon_validation_total, "epsilon_validation_total")
        check_epsilon(self.epsilon_owners_total, "epsilon_owners_total")
        check_delta(self.delta, "delta", upper=1 / math.e)
        if not (math.isfinite(self.candidate_fraction) and self.candidate_fraction >= 0):
            raise ValueError(
                f"candidate_fraction must be a finite number >= 0, got {self.candidate_fraction}"
            )
        if not (math.isfinite(self.candidate_multiple) and self.candidate_multiple >= 1.0):
            raise ValueError(
                f"candidate_multiple must be a finite number >= 1, got {self.candidate_multiple}"
            )
        if not (math.isfinite(self.allocation_share) and 0.0 <= self.allocation_share < 1.0):
            raise ValueError(
                f"allocation_share must lie in (0, 1), or be 0 (derived from m and K), got "
                f"{self.allocation_share}"
            )
        if not (
            math.isfinite(self.relevance_norm_weight) and 0.0 < self.relevance_norm_weight <= 1.0
        ):
            raise ValueError(
                f"relevance_norm_weight must lie in (0, 1], got {self.relevance_norm_weight}"
            )
        if not (math.isfinite(self.shrinkage) and self.shrinkage > 0):
            raise ValueError(f"shrinkage must be a finite number > 0, got {self.shrinkage}")
        if not math.isfinite(self.relevance_threshold):
            raise ValueError(f"relevance_threshold must be finite, got {self.relevance_threshold}")
        if not 0.0 <= self.candidate_even_share <= 1.0:
            raise ValueError(
                f"candidate_even_share must lie in [0, 1], got {self.candidate_even_share}"
            )
        for name, allowed in (
            ("validation_release", VALIDATION_RELEASES),
            ("summary_release", SUMMARY_RELEASES),
            ("pool_scoring", POOL_SCORINGS),
            ("auction", AUCTIONS),
            ("allocation", ALLOCATIONS),
            ("relevance_score", RELEVANCE_SCORES),
            ("embedding_prior", EMBEDDING_PRIORS),
            ("summary_form", SUMMARY_FORMS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not (math.isfinite(self.auction_share) and 0.0 < self.auction_share <= 1.0):
            raise ValueError(f"auction_share must lie in (0, 1], got {self.auction_share}")
        if self.summary_form == "hashes" and self.method != "candidates":
            raise ValueError(
                f"summary_form 'hashes' is a mode of the candidates method, got {self.method!r}"
            )

    @property
    def t_init(self) -> int:
        """T_init: the configured value, or ``floor(d ** 1.5)`` (1656 for d = 140)."""
        return self.iterations_initial or math.floor(self.rff_dimension**1.5)

    @property
    def eta(self) -> float:
        """Quantization step: the configured value, or ``2 / (2 d)`` = 1/d (Theorem 2)."""
        return self.quantization_step or 2.0 / (2 * self.rff_dimension)

    @property
    def epsilon_per_later_iteration(self) -> float:
        """epsilon_{l,T} for epochs l >= 2: ``epsilon_summary / sqrt(p * T_subs)`` (Table 1)."""
        return self.epsilon_summary / math.sqrt(self.summary_size * self.iterations_subsequent)


#: Protocol parameters: the SummarizationConfig fields that the SummarizationParams message
#: carries under the same names (every field but summary_size, method and summary_form: the
#: hashes mode runs in process only in this release).
PARAMETER_NAMES: tuple[str, ...] = tuple(
    f.name
    for f in fields(SummarizationConfig)
    if f.name not in ("summary_size", "method", "summary_form")
)


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
    ledger : dict
        The privacy ledger's report (per party, per composition method); empty for non-private
        methods.
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
    """

    method: Method
    summary_size: int
    rounds: int
    owner_points_accessed: int
    validation_points_accessed: int
    all_owners_bound: int
    paper_bound: float
    dropped_owners: tuple[str, ...]
    ledger: dict[str, Any]
    wall_time_seconds: float
    rejected_points: int = 0
    round_seconds: tuple[float, ...] = ()
    error: str = ""
    owner_spend: dict[str, SessionSpend] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)


#: The public reasons a session gives for running without an owner (``SessionReport.left_out``):
#: each depends on the request, the owner's budget or the network, never on the owner's data.
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
        The hashes mode (``summary_form="hashes"``): h1 of the summary points under the owners'
        secret map (:mod:`dpmarket.common.summarization.hashes`); None otherwise.
    """

    points: NDArray[np.float64]
    labels: NDArray[np.int64] | None
    owner_ids: tuple[str, ...]
    report: SessionReport
    hashes: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a session, for progress display and the WatchSession stream."""

    stage: Stage
    round: int
    total_rounds: int
    points_accessed: int
    message: str = ""

    @property
    def finished(self) -> bool:
        """Whether the session has ended (done or failed)."""
        return self.stage in ("done", "failed")
