"""Each summarization method's configuration: one small frozen dataclass per method.

A session runs one method, and its configuration holds only what that method reads:

==============  =========================  ====================================================
method          configuration              what it reads beyond p, d and gamma
==============  =========================  ====================================================
``uniform``     :class:`UniformConfig`     nothing: p/K raw points from every owner
``greedy``      :class:`GreedyConfig`      nothing: exact embeddings (non-private)
``private``     :class:`PrivateConfig`     h2 (MWEM) releases, PrivAuction, two deltas
``rounds``      :class:`RoundsConfig`      Gaussian or h2 releases, the tree, PrivAuction
``candidates``  :class:`CandidatesConfig`  Gaussian releases, the allocation, re-ranking
``hashes``      :class:`HashesConfig`      the candidates allocation; hashes, no re-ranking
==============  =========================  ====================================================

Every field carries its meaning in its metadata (:class:`Param`: a one-line help, its unit and its
source in the papers); the classes' ``Parameters`` documentation, the ``dpmarket consumer request``
options and the range checks are generated from it, so that none of them can drift from the fields.
Fields read by several methods live on a shared base (:class:`H2Fields`, :class:`AuctionFields`,
:class:`GaussianFields`, :class:`AllocationFields`); the concrete classes are registered by name in
:data:`METHOD_CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from dpmarket.common.summarization.auction import AUCTION_VARIANTS, AuctionVariant
from dpmarket.common.summarization.sketch_allocation import RELEVANCE_SCORES, RelevanceScore
from dpmarket.common.validation import check_delta, check_epsilon, check_positive_int

__all__ = [
    "ALLOCATIONS",
    "AUCTIONS",
    "DEFAULT_DELTA",
    "EMBEDDING_PRIORS",
    "METHODS",
    "METHOD_CONFIGS",
    "PAPER_DELTA_OWNERS",
    "PARAMETER_NAMES",
    "POOL_SCORINGS",
    "SHRINKAGE_METRICS",
    "SHRINKAGE_STRENGTHS",
    "SUMMARY_RELEASES",
    "VALIDATION_RELEASES",
    "AllocationFields",
    "AuctionFields",
    "CandidatesConfig",
    "GaussianFields",
    "GreedyConfig",
    "H2Fields",
    "HashesConfig",
    "Method",
    "Param",
    "PrivateConfig",
    "RoundsConfig",
    "SummarizationConfig",
    "UniformConfig",
    "check_field",
    "config_class",
    "config_from_fields",
    "config_from_json",
    "method_config",
    "method_fields",
    "param_info",
]

Method = Literal["private", "greedy", "uniform", "candidates", "rounds"]
#: The methods a request names (``--method``, the wire's ``Method``), the default first.
METHODS: tuple[Method, ...] = ("candidates", "private", "greedy", "uniform", "rounds")
ValidationRelease = Literal["mwem", "gaussian"]
SummaryRelease = Literal["mwem", "tree", "none"]
PoolScoring = Literal["embedding", "exact"]
Allocation = Literal["sketch", "counts"]
EmbeddingPrior = Literal["owner", "seed", "none"]
ShrinkageMetric = Literal["embedding", "scores"]
ShrinkageStrength = Literal["fixed", "snr", "share"]
#: Allowed values of the options with a choice, the default first.
VALIDATION_RELEASES: tuple[ValidationRelease, ...] = ("mwem", "gaussian")
SUMMARY_RELEASES: tuple[SummaryRelease, ...] = ("mwem", "tree", "none")
POOL_SCORINGS: tuple[PoolScoring, ...] = ("embedding", "exact")
ALLOCATIONS: tuple[Allocation, ...] = ("sketch", "counts")
EMBEDDING_PRIORS: tuple[EmbeddingPrior, ...] = ("owner", "seed", "none")
SHRINKAGE_METRICS: tuple[ShrinkageMetric, ...] = ("embedding", "scores")
SHRINKAGE_STRENGTHS: tuple[ShrinkageStrength, ...] = ("fixed", "snr", "share")
#: PrivAuction variants (:mod:`dpmarket.common.summarization.auction`).
AUCTIONS: tuple[AuctionVariant, ...] = AUCTION_VARIANTS
#: delta~ of the owners' composition bound in the summarization paper's Section 4 (its summary
#: and auction); reproductions of the paper's settings pass it as ``delta_owners``.
PAPER_DELTA_OWNERS = 1e-4
#: The delta every method states by default (``delta``, ``delta_owners``): the most the shipped
#: owner policy allows one session.
DEFAULT_DELTA = 1e-6

#: The key of a field's :class:`Param` in its metadata.
_PARAM = "dpmarket"


# --------------------------------------------------------------------------- field metadata
@dataclass(frozen=True)
class Param:
    """What one configuration field means: for the documentation, the CLI and the checks.

    Attributes
    ----------
    help : str
        One or two sentences: what the field decides (the ``--help`` text).
    unit : str
        Its unit (``"epsilon"``, ``"points"``, ``"1 / squared feature units"``, ...), or
        ``"choice"`` / ``"flag"``.
    source : str
        Where it comes from: the paper's algorithm, equation or table, or the project's
        measurement (``docs/results.md``).
    check : callable, optional
        ``check(name, value)`` raises ``ValueError`` naming the field and the value when the
        value is out of range.
    choices : tuple of str
        The allowed values of a choice, the default first.
    short : str, optional
        A short command-line flag (``"-d"``).
    brief : str, optional
        A few words for a listing where :attr:`help` is too long
        (``dpmarket consumer request --help``'s basics).
    """

    help: str
    unit: str
    source: str
    check: Callable[[str, Any], object] | None = None
    choices: tuple[str, ...] = ()
    short: str | None = None
    brief: str | None = None


def param(
    default: Any,
    help: str,
    *,
    unit: str,
    source: str,
    check: Callable[[str, Any], object] | None = None,
    choices: tuple[str, ...] = (),
    short: str | None = None,
    brief: str | None = None,
) -> Any:
    """A dataclass field with its :class:`Param` (``default`` :data:`dataclasses.MISSING`: a
    required field)."""
    info = Param(help, unit, source, check, choices, short, brief)
    return dataclasses.field(default=default, metadata={_PARAM: info})


def param_info(field: dataclasses.Field[Any]) -> Param:
    """The :class:`Param` of a configuration field.

    Raises
    ------
    KeyError
        If the field was not declared with :func:`param`.
    """
    info = field.metadata[_PARAM]
    assert isinstance(info, Param)
    return info


# ------------------------------------------------------------------------------- the checks
def _positive_int(name: str, value: Any) -> None:
    check_positive_int(value, name)


def _zero_or_positive_int(name: str, value: Any) -> None:
    if value != 0:
        check_positive_int(value, name)


def _positive(name: str, value: Any) -> None:
    check_epsilon(value, name)


def _delta(name: str, value: Any) -> None:
    check_delta(value, name, upper=1 / math.e)


def _quantization_step(name: str, value: Any) -> None:
    if value != 0:
        eta = float(value)
        if not (0 < eta <= 1) or abs(2 / eta - round(2 / eta)) > 1e-9:
            raise ValueError(f"{name} must be in (0, 1] with 2/eta an integer, got {eta}")


def _finite(name: str, value: Any) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")


def _at_least(low: float) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not (math.isfinite(value) and value >= low):
            raise ValueError(f"{name} must be a finite number >= {low:g}, got {value}")

    return check


def _half_open_share(name: str, value: Any) -> None:
    """In (0, 1]."""
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{name} must lie in (0, 1], got {value}")


def _closed_share(name: str, value: Any) -> None:
    """In [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def _allocation_share(name: str, value: Any) -> None:
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise ValueError(f"{name} must lie in (0, 1), or be 0 (derived from m and K), got {value}")


def _check(field: dataclasses.Field[Any], value: Any) -> None:
    """Check ``value`` against the field's choices and its check."""
    info = param_info(field)
    if info.choices and value not in info.choices:
        raise ValueError(f"{field.name} must be one of {info.choices}, got {value!r}")
    if info.check is not None:
        info.check(field.name, value)


def _documented(cls: type[SummarizationConfig]) -> type[SummarizationConfig]:
    """Append a numpydoc ``Parameters`` section generated from the fields' :class:`Param`."""
    lines = ["", "    Parameters", "    ----------"]
    for f in fields(cls):
        info = param_info(f)
        kind = f"{{{', '.join(repr(c) for c in info.choices)}}}" if info.choices else f.type
        default = "" if f.default is dataclasses.MISSING else f", default {f.default!r}"
        lines.append(f"    {f.name} : {kind}{default}")
        lines.append(f"        {info.help} Unit: {info.unit}. Source: {info.source}.")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return cls


# --------------------------------------------------------------------------------- the base
@dataclass(frozen=True, kw_only=True)
class SummarizationConfig:
    """The parameters every summarization method reads: the summary's size and h1's kernel.

    The base of the methods' configurations (:data:`METHOD_CONFIGS`); construct a method's own
    class, or :func:`method_config` by name. Every session draws h1's parameters and shares them
    with the owners, whatever its method (public randomness).

    Attributes
    ----------
    name : str
        The method's registry name (class attribute): ``"uniform"``, ..., ``"hashes"``.
    method : str
        The method a request names on the wire and in reports (class attribute); the hashes
        mode is the candidates method's.
    title : str
        One line for the help of the method's options (class attribute).

    Raises
    ------
    TypeError
        If the base or a shared part is constructed instead of a method's class.
    ValueError
        If any value is out of range (the message names the field and the value).
    """

    name: ClassVar[str] = ""
    method: ClassVar[Method]
    title: ClassVar[str] = ""

    summary_size: int = param(
        dataclasses.MISSING,
        "p, the number of owner points in the summary (seed set excluded).",
        unit="points",
        source="summarization paper, Algorithm 3 (input p)",
        check=_positive_int,
        short="-p",
        brief="p: owner points in the summary.",
    )
    rff_dimension: int = param(
        140,
        "d, the dimension of h1 (every session draws h1 and shares it with the owners).",
        unit="coordinates",
        source="Algorithm 1; Table 1 (d = 140)",
        check=_positive_int,
        short="-d",
    )
    gamma: float = param(
        0.1,
        "RBF kernel parameter in exp(-gamma ||x - y||^2).",
        unit="1 / squared feature units",
        source="Eq. 1; Table 1 (0.1)",
        check=_positive,
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise TypeError(
                f"{type(self).__name__} is a shared part of the methods' configurations; "
                f"construct one of {', '.join(c.__name__ for c in METHOD_CONFIGS.values())} "
                "(or method_config(name, ...))"
            )
        for f in fields(self):
            _check(f, getattr(self, f.name))

    def ledger_deltas(self) -> tuple[float, float]:
        """delta~ of the session's two ledgers, ``(validation, owners)``.

        A method that charges nothing (uniform, greedy) keeps empty ledgers whose slack is never
        reported: :data:`PAPER_DELTA_OWNERS`, any valid value.
        """
        return PAPER_DELTA_OWNERS, PAPER_DELTA_OWNERS

    def to_json(self) -> dict[str, Any]:
        """``{"method": name, field: value, ...}``: the method's registry name and every field
        (the inverse of :func:`config_from_json`)."""
        return {"method": self.name, **{f.name: getattr(self, f.name) for f in fields(self)}}


# ------------------------------------------------------------------------ the shared parts
@dataclass(frozen=True, kw_only=True)
class H2Fields(SummarizationConfig):
    """h2 (MWEM) releases: the private method's, and the rounds method's with an MWEM release."""

    epsilon_validation: float = param(
        0.01,
        "epsilon of each h2 (MWEM) iteration on the validation set.",
        unit="epsilon per iteration",
        source="Algorithm 3, step 3; Table 1 (0.01)",
        check=_positive,
    )
    iterations_initial: int = param(
        0,
        "T_init, MWEM iterations for the validation set and the first epoch; 0: floor(d^1.5) "
        "(1656 for d = 140).",
        unit="iterations",
        source="Algorithm 2; Table 1 (d^1.5)",
        check=_zero_or_positive_int,
    )
    iterations_subsequent: int = param(
        5,
        "T_subs, MWEM iterations per later epoch.",
        unit="iterations",
        source="Algorithm 2; Table 1 (5)",
        check=_positive_int,
    )
    epsilon_first_epoch: float = param(
        0.05,
        "epsilon per h2 iteration in epoch 1, whose summary is the public seed set.",
        unit="epsilon per iteration",
        source="Algorithm 3, step 5; Table 1 (0.05)",
        check=_positive,
    )
    epsilon_summary: float = param(
        0.01,
        "Later epochs use epsilon_summary / sqrt(p T_subs) per h2 iteration.",
        unit="epsilon",
        source="Algorithm 3, step 5; Table 1 (0.01)",
        check=_positive,
    )
    quantization_step: float = param(
        0.0,
        "eta of the quantization grid {-1, -1+eta, ..., 1}; 0: 1/d.",
        unit="h1 units",
        source="Theorem 2 (eta <= 1/d)",
        check=_quantization_step,
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


@dataclass(frozen=True, kw_only=True)
class AuctionFields(SummarizationConfig):
    """PrivAuction's variant: the private and rounds methods."""

    auction: AuctionVariant = param(
        "pure",
        "PrivAuction variant. pure: every rank, the first included, is asked with probability "
        "below 1, so each bad iteration is pure eps_auc-DP; paper: Algorithm 3 as printed, "
        "(eps_auc, 1 - e^-eps_auc)-DP per bad iteration, charged so (owners' policies usually "
        "refuse its delta).",
        unit="choice",
        source="Algorithm 3, steps 11-16; Theorem 6",
        choices=AUCTIONS,
    )


@dataclass(frozen=True, kw_only=True)
class GaussianFields(SummarizationConfig):
    """One (epsilon, delta) per party: the candidates and rounds methods' Gaussian releases."""

    epsilon_validation_total: float = param(
        1.0,
        "epsilon of everything released about D_v (the Gaussian validation embedding; with the "
        "sketch allocation, also the allocation's release).",
        unit="epsilon",
        source="the Gaussian mechanism's exact profile (Balle & Wang 2018); docs/how-it-works.md",
        check=_positive,
        brief="epsilon spent on D_v.",
    )
    epsilon_owners_total: float = param(
        1.0,
        "epsilon with respect to each owner's data: candidates, the Laplace-noised relevance "
        "counts; rounds, the PLD epsilon of the summary releases and PrivAuction.",
        unit="epsilon",
        source="Laplace mechanism; PLD accounting (dp-accounting)",
        check=_positive,
        brief="epsilon spent on each owner's data.",
    )
    delta: float = param(
        DEFAULT_DELTA,
        "delta of the Gaussian mechanisms and of every reported epsilon.",
        unit="delta",
        source="docs/how-it-works.md, 'Privacy accounting'",
        check=_delta,
        brief="delta of both parties' guarantees.",
    )

    def ledger_deltas(self) -> tuple[float, float]:
        """``(delta, delta)``: one delta for both parties."""
        return self.delta, self.delta


@dataclass(frozen=True, kw_only=True)
class AllocationFields(GaussianFields):
    """How the candidates budget is split among owners: the candidates method and its hashes
    mode."""

    allocation: Allocation = param(
        "sketch",
        "Split the candidate budget by the owners' published RFF sketches (a Gaussian release "
        "about D_v only; the owners pay nothing at summarization time; falls back to counts when "
        "an owner has none) or by the owners' Laplace-noised relevance counts.",
        unit="choice",
        source="dpmarket.common.summarization.sketch_allocation; docs/results.md, 'Scenario suite'",
        choices=ALLOCATIONS,
    )
    relevance_score: RelevanceScore = param(
        "mmd",
        "Sketch allocation: an owner's sketch's relevance to a validation point.",
        unit="choice",
        source="sketch_allocation.relevance_matrix; chosen by leave-one-scenario-out on the "
        "scenario suite (docs/results.md)",
        choices=RELEVANCE_SCORES,
    )
    relevance_norm_weight: float = param(
        0.25,
        "Sketch allocation, mmd score: the weight in (0, 1] of each sketch's squared norm in its "
        "distance to a validation point (1: the MMD).",
        unit="fraction",
        source="docs/results.md, 'Scenario suite'",
        check=_half_open_share,
    )
    allocation_share: float = param(
        0.0,
        "Sketch allocation: share of D_v's Gaussian budget (of the squared privacy-loss scale) "
        "spent on the allocation, the validation embedding getting the rest; 0: derived from m, "
        "K, epsilon and delta.",
        unit="fraction",
        source="sketch_allocation.split_gaussian_sigmas, derived_allocation_share",
        check=_allocation_share,
    )
    embedding_prior: EmbeddingPrior = param(
        "owner",
        "What each owner's proposal shrinks the noisy validation embedding towards (James-Stein, "
        "at the owner): its own mean h1; the public seed set's or its own, whichever the release "
        "lies nearer to; or nothing.",
        unit="choice",
        source="candidates.shrink_towards_points; docs/results.md, 'Scenario suite'",
        choices=EMBEDDING_PRIORS,
    )
    shrinkage: float = param(
        1.0,
        "The shrinkage's strength, a multiple of the embedding's noise variance (1: the "
        "James-Stein amount).",
        unit="multiple of the noise variance",
        source="James & Stein (1961); candidates.shrink_towards_points",
        check=_positive,
    )
    shrinkage_strength: ShrinkageStrength = param(
        "fixed",
        "How the shrinkage's strength is set: 'shrinkage' as given, or that times a factor in "
        "[0, 1] read from the release (the estimated signal energy ||gtilde||^2 - d sigma^2 over "
        "the noise energy d sigma^2, capped at 1: 'snr'; or over ||gtilde||^2: 'share').",
        unit="choice",
        source="candidates.shrinkage_strength; docs/results.md, 'A shrinkage strength that "
        "reads m'",
        choices=SHRINKAGE_STRENGTHS,
    )
    shrinkage_metric: ShrinkageMetric = param(
        "embedding",
        "Where each owner reads the shrinkage's amount: the release's noise in all d coordinates "
        "of the embedding (James-Stein), or in the metric of the owner's own scores, where the "
        "noise is about d times smaller (per owner and request, from the public noise and the "
        "owner's own points).",
        unit="choice",
        source="candidates.shrink_embedding, candidates.shrink_in_score_metric; docs/results.md, "
        "'The shrinkage read in the owner's score metric'",
        choices=SHRINKAGE_METRICS,
    )
    relevance_threshold: float = param(
        0.5,
        "Counts allocation: a point is relevant when its score gtilde . h1(x) is at least this "
        "times ||gtilde||^2 (the typical score of a validation point).",
        unit="fraction of ||gtilde||^2",
        source="candidates.relevance_threshold",
        check=_finite,
    )
    candidate_even_share: float = param(
        0.0,
        "Share of the budget beyond the uniform sample of p points that is split evenly among "
        "owners before the relevance split.",
        unit="fraction",
        source="candidates.allocate_candidates; docs/results.md, 'Scenario suite'",
        check=_closed_share,
    )
    read_cap: float = param(
        0.0,
        "Divisor c of the size cap on each owner's targeted reads: at most ceil(n_k / c) of an "
        "owner's n_k points beyond its uniform share, the excess water-filled over the other "
        "owners by their weights (halved while the owners cannot supply the budget); 0: no cap.",
        unit="divisor",
        source="candidates.size_read_caps; docs/results.md, 'A size cap on the targeted reads'",
        check=_at_least(0.0),
    )
    mass_cap: float = param(
        0.0,
        "Sketch allocation: factor c of the mass cap on each owner's targeted reads, at most c "
        "times its share of the owners' mass near D_v (from its published sketch and D_v's "
        "mean features released in the sketches' own map, a third Gaussian release about D_v "
        "taking 0.1 of its budget; an upper bound by 2 standard deviations of both noises) times "
        "the targeted budget, the excess water-filled over the other owners by their weights "
        "(doubled while the owners cannot supply the budget); 0: no cap (and no third release).",
        unit="multiple of the mass share",
        source="candidates.mass_read_caps, sketch_allocation.sketch_masses; docs/results.md, "
        "'The mass cap in the sketches' own map'",
        check=_at_least(0.0),
    )


# ------------------------------------------------------------------------------ the methods
@_documented
@dataclass(frozen=True, kw_only=True)
class UniformConfig(SummarizationConfig):
    """The uniform method: p/K points drawn uniformly from every owner (the paper's baseline).

    Releases only raw points; charges no epsilon.
    """

    name: ClassVar[str] = "uniform"
    method: ClassVar[Method] = "uniform"
    title: ClassVar[str] = "p/K points drawn uniformly from every owner"


@_documented
@dataclass(frozen=True, kw_only=True)
class GreedyConfig(SummarizationConfig):
    """The non-private greedy method: Algorithm 3's rounds on exact mean h1 embeddings, the top
    bidder asked each round (a baseline; exact statistics reach every owner)."""

    name: ClassVar[str] = "greedy"
    method: ClassVar[Method] = "greedy"
    title: ClassVar[str] = "non-private greedy on exact mean h1 embeddings"


@_documented
@dataclass(frozen=True, kw_only=True)
class PrivateConfig(H2Fields, AuctionFields):
    """The private method: Algorithm 3 as the paper runs it (h2 embeddings and PrivAuction),
    its defaults Section 4's and Table 1's."""

    name: ClassVar[str] = "private"
    method: ClassVar[Method] = "private"
    title: ClassVar[str] = "Algorithm 3: h2 (MWEM) embeddings and PrivAuction"

    epsilon_auction: float = param(
        1.0,
        "Total epsilon of PrivAuction's winner notification.",
        unit="epsilon",
        source="Theorem 6",
        check=_positive,
    )
    delta_owners: float = param(
        DEFAULT_DELTA,
        "delta of the auction's eps_auc and of the owners' composition bound, stated to every "
        "owner (Section 4 uses 1e-4; 1e-6 is the most the shipped owner policy allows).",
        unit="delta",
        source="Theorem 6; Theorem 7 (delta~)",
        check=_delta,
    )
    delta_validation: float = param(
        0.01,
        "delta~ of the validation set's composition bound.",
        unit="delta",
        source="Theorem 7; Section 4 (0.01)",
        check=_delta,
    )

    def ledger_deltas(self) -> tuple[float, float]:
        """``(delta_validation, delta_owners)``: Theorem 7's delta~ of each party."""
        return self.delta_validation, self.delta_owners


@_documented
@dataclass(frozen=True, kw_only=True)
class RoundsConfig(H2Fields, AuctionFields, GaussianFields):
    """The rounds method: Algorithm 3's per-round protocol whose validation release, summary
    release and pool scoring are its options (docs/how-it-works.md, "Methods"); the h2 options
    apply to its MWEM releases."""

    name: ClassVar[str] = "rounds"
    method: ClassVar[Method] = "rounds"
    title: ClassVar[str] = "Algorithm 3's rounds with chosen releases and pool scoring"

    validation_release: ValidationRelease = param(
        "gaussian",
        "gtilde by the Gaussian mechanism on mean h1(D_v) at (epsilon_validation_total, delta), "
        "or by h2 (MWEM) exactly as the paper.",
        unit="choice",
        source="Algorithm 3, step 3",
        choices=VALIDATION_RELEASES,
    )
    summary_release: SummaryRelease = param(
        "tree",
        "The running summary embedding by the binary-tree continual release (noise calibrated "
        "to epsilon_owners_total), by h2 every round as the paper, or not at all (owners bid "
        "with the validation embedding only).",
        unit="choice",
        source="Algorithm 3, step 5; dpmarket.common.summarization.continual",
        choices=SUMMARY_RELEASES,
    )
    pool_scoring: PoolScoring = param(
        "exact",
        "Add the pool point with the largest exact marginal gain (the curator holds D_v and the "
        "summary) or the largest private-embedding bid (the paper's step 15).",
        unit="choice",
        source="Algorithm 3, step 15; Lemma 3",
        choices=POOL_SCORINGS,
    )
    auction_share: float = param(
        0.5,
        "With a summary release: PrivAuction's share of epsilon_owners_total, its Theorem-6 "
        "epsilon.",
        unit="fraction",
        source="Theorem 6",
        check=_half_open_share,
    )


@_documented
@dataclass(frozen=True, kw_only=True)
class CandidatesConfig(AllocationFields):
    """The candidates method (the default: best measured quality at a given epsilon): one
    private embedding, a private allocation of a candidate budget among owners, local greedy
    proposals and exact re-ranking by the trusted curator
    (:mod:`dpmarket.common.summarization.candidates`)."""

    name: ClassVar[str] = "candidates"
    method: ClassVar[Method] = "candidates"
    title: ClassVar[str] = "private candidates with exact re-ranking (the default)"

    candidate_multiple: float = param(
        3.0,
        "The curator reads at most max(p, floor(this * p)) owner points, whatever the number of "
        "owners K (candidate_fraction > 0 overrides it).",
        unit="multiple of p",
        source="docs/results.md, 'Scenario suite'",
        check=_at_least(1.0),
    )
    candidate_fraction: float = param(
        0.0,
        "When > 0, a budget that grows with K: at most max(p, floor(this * K * p)) owner "
        "points (it grows with K); 0: candidate_multiple decides.",
        unit="fraction of K * p",
        source="docs/results.md",
        check=_at_least(0.0),
    )
    embedding_rerank: bool = param(
        False,
        "Choose the summary among the candidates by the private embedding instead of the exact "
        "kernel (to measure what exact re-ranking adds).",
        unit="flag",
        source="docs/results.md",
    )


@_documented
@dataclass(frozen=True, kw_only=True)
class HashesConfig(AllocationFields):
    """The candidates method's hashes mode (the paper's less-trusted curator, Appendix F): the
    curator and the consumer receive only h1 hashes of p proposals under a map the owners agree
    on among themselves (:mod:`dpmarket.common.summarization.hashes`); a budget of p, no
    re-ranking. In process only: no RPC carries it in this release."""

    name: ClassVar[str] = "hashes"
    method: ClassVar[Method] = "candidates"
    title: ClassVar[str] = "the candidates method's hashes mode (in process only)"


#: Every method's configuration class, by name (the default first).
METHOD_CONFIGS: dict[str, type[SummarizationConfig]] = {
    cls.name: cls
    for cls in (
        CandidatesConfig,
        PrivateConfig,
        GreedyConfig,
        UniformConfig,
        RoundsConfig,
        HashesConfig,
    )
}

#: Every field a method reads but ``summary_size``: the ``SummarizationParams`` message's fields,
#: under the same names (hashes, in process only, adds none).
PARAMETER_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(
        f.name for cls in METHOD_CONFIGS.values() for f in fields(cls) if f.name != "summary_size"
    )
)


def method_fields() -> dict[str, dataclasses.Field[Any]]:
    """Every field of every method, by name, in :data:`PARAMETER_NAMES` order (``summary_size``
    first); a field shared by several methods appears once."""
    out: dict[str, dataclasses.Field[Any]] = {}
    for cls in METHOD_CONFIGS.values():
        for f in fields(cls):
            out.setdefault(f.name, f)
    return out


def check_field(name: str, value: Any) -> None:
    """Check one field's value as every configuration that has the field checks it.

    Raises
    ------
    ValueError
        If the value is out of range (naming the field and the value).
    KeyError
        If no method has a field of that name.
    """
    _check(method_fields()[name], value)


def config_class(name: str) -> type[SummarizationConfig]:
    """The configuration class of the method ``name``.

    Raises
    ------
    ValueError
        If no method has that name.
    """
    cls = METHOD_CONFIGS.get(name)
    if cls is None:
        raise ValueError(f"method must be one of {tuple(METHOD_CONFIGS)}, got {name!r}")
    return cls


def _form(method: str, values: Mapping[str, Any]) -> str:
    """The method a flat mapping names: ``summary_form = "hashes"`` (the flat vocabulary before
    the methods had their own classes) selects the candidates method's hashes mode.

    Raises
    ------
    ValueError
        If ``summary_form`` is neither ``"points"`` nor ``"hashes"``, or ``"hashes"`` is asked
        of another method than candidates.
    """
    form = values.get("summary_form", "points")
    if form not in ("points", "hashes"):
        raise ValueError(f"summary_form must be one of ('points', 'hashes'), got {form!r}")
    if form == "points":
        return method
    if method not in ("candidates", "hashes"):
        raise ValueError(
            f"summary_form 'hashes' is a mode of the candidates method, got {method!r}"
        )
    return "hashes"


def method_config(method: str, /, **values: Any) -> SummarizationConfig:
    """The configuration of ``method`` from its fields by name (``summary_size`` among them;
    ``summary_form="hashes"`` with ``"candidates"`` is the hashes mode).

    Raises
    ------
    ValueError
        If ``method`` is unknown, a value is out of range, or a field is not one the method
        reads (the message names the method's fields).
    """
    method = _form(method, values)
    values = {k: v for k, v in values.items() if k != "summary_form"}
    cls = config_class(method)
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(
            f"the {method} method does not read {', '.join(unknown)}; it reads {', '.join(known)}"
        )
    return cls(**values)


def config_from_fields(method: str, values: Mapping[str, Any]) -> SummarizationConfig:
    """The configuration of ``method`` from a flat mapping of any methods' fields: the wire's
    ``SummarizationParams``, a stored configuration. Fields ``method`` does not read are
    ignored; absent ones take their defaults (``summary_form`` as :func:`method_config`).

    Raises
    ------
    ValueError
        If ``method`` is unknown or a value is out of range.
    """
    cls = config_class(_form(method, values))
    return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


def config_from_json(data: Mapping[str, Any]) -> SummarizationConfig:
    """The inverse of :meth:`SummarizationConfig.to_json`. Also reads the flat form every
    field of every method was stored in before the methods had their own classes
    (``summary_form = "hashes"`` with the candidates method is the hashes mode).

    Raises
    ------
    ValueError
        If the method is unknown or a value is out of range.
    """
    return config_from_fields(str(data.get("method", "candidates")), data)
