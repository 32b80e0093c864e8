"""What a consumer answers from the sketch catalogue: ``consumer explore``, ``rank-owners``.

Both read the owners' published sketches once and compute here (:mod:`dpmarket.consumer.explore`):
no owner is called, and the validation set never leaves the consumer's process. This module is
their one home: ``dpmarket consumer explore`` / ``rank-owners`` print what :func:`explore` and
:func:`rank` return, and :class:`dpmarket.client.Consumer` returns it.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.errors import InvalidArgumentError, NotFoundError
from dpmarket.common.sketches import SketchLike
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.intervals import record_count_interval
from dpmarket.common.sketches.marginals import MarginalsSketch
from dpmarket.common.sketches.marginals_fit import FIT_TOLERANCE, carried_fit
from dpmarket.common.sketches.sketch import PrivateSketch, merge_sketches
from dpmarket.common.sketches.spec import PublishedSketch, SketchSpec
from dpmarket.common.uncertainty import Flag, interval_row
from dpmarket.consumer.explore import (
    DEFAULT_EXPLORE_SYNTHETIC,
    Z95,
    Answer,
    Explorer,
    MarginalsExplorer,
    Query,
    RankedOwner,
    bounded_answer,
    choose_source,
    honest_half_width,
    m2m_standard_errors,
    m2m_target,
    rank_owners,
    record_count,
    record_count_interval_of,
)

__all__ = [
    "MMD2_RANGE",
    "RANK_COVERS",
    "Exploration",
    "ExplorationCache",
    "ExploreOptions",
    "GraphicalModel",
    "M2MModel",
    "Ranking",
    "SpecChoiceError",
    "choose_spec",
    "exploration_key",
    "explore",
    "published",
    "published_fits",
    "rank",
    "refit_into_store",
    "verify_fits",
    "warm",
]


logger = logging.getLogger(__name__)

#: Modules the answers import on first use, which :func:`warm` imports ahead: scikit-learn's
#: logistic regression (about a second of CPU, with pandas and pyarrow) and ``scipy.stats``
#: (half a second; owners ranked, a summary's evaluation).
IMPORTED_AHEAD = ("sklearn.linear_model", "scipy.stats")


class SpecChoiceError(InvalidArgumentError):
    """The catalogue's specs do not say which one to read: name one (``--spec``)."""


@dataclass(frozen=True)
class ExploreOptions:
    """How a query is answered from the sketches (the consumer's own randomness and models).

    Attributes
    ----------
    synthetic : int or None
        M2M's synthetic points n_s (None: :data:`DEFAULT_EXPLORE_SYNTHETIC`).
    seed : int
        Seed of the consumer's own randomness (synthetic points, bootstrap, records).
    lambda_rule : {"theorem", "paper"}
        M2M's ridge parameter: sigma^2/n^2 (theorem) or sigma^2/n (the paper's experiments).
    intercept : bool
        Fit an unpenalized constant in M2M.
    bootstrap : int
        Bootstrap models per marginals sketch behind its standard errors (0: none).
    refit : bool
        Fit every marginals sketch here, even one carrying its owner's fit (default False: use
        the published fit when it matches ``bootstrap`` and ``seed`` and passes its checks;
        :class:`~dpmarket.consumer.explore.MarginalsExplorer`).
    """

    synthetic: int | None = None
    seed: int = 0
    lambda_rule: Literal["theorem", "paper"] = "theorem"
    intercept: bool = False
    bootstrap: int = 32
    refit: bool = False


@dataclass(frozen=True)
class M2MModel:
    """The M2M estimator behind an answer from an RFF, RACE or HIST sketch (M2M paper, Algorithm 1).

    Attributes
    ----------
    n_synthetic : int
        Synthetic points of its design.
    seed : int
        Seed of the design's points (public randomness).
    lambda_rule : {"theorem", "paper"}
        How its ridge parameter was chosen (:func:`dpmarket.common.sketches.m2m.regularization`).
    lam : float
        The ridge parameter used.
    intercept : bool
        Whether it fitted an intercept.
    """

    n_synthetic: int
    seed: int
    lambda_rule: str
    lam: float
    intercept: bool

    def to_json(self) -> dict[str, Any]:
        """``{"m2m": {...}}``, as ``explore --json`` prints it (``lam`` as ``lambda``)."""
        return {
            "m2m": {
                "n_synthetic": self.n_synthetic,
                "seed": self.seed,
                "lambda_rule": self.lambda_rule,
                "lambda": self.lam,
                "intercept": self.intercept,
            }
        }


@dataclass(frozen=True)
class GraphicalModel:
    """The graphical model behind an answer from marginals sketches.

    Attributes
    ----------
    bootstrap : int
        Parametric bootstrap refits behind its intervals.
    seed : int
        Seed of the bootstrap (public randomness).
    """

    bootstrap: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        """``{"graphical_model": {...}}``, as ``explore --json`` prints it."""
        return {"graphical_model": {"bootstrap": self.bootstrap, "seed": self.seed}}


@dataclass(frozen=True)
class Exploration:
    """A query answered from published sketches.

    Attributes
    ----------
    spec : SketchSpec
        The spec answered from.
    reason : str
        Why it was chosen (:func:`~dpmarket.consumer.explore.choose_source`).
    entries : tuple of PublishedSketch
        The sketches read (one owner's, or several owners' for their union).
    answer : Answer
        The estimates, with standard errors, intervals and flags.
    n_hat : float
        The estimated number of records behind the answer.
    n_interval : (float, float) or None
        The 95 % interval of that number, from the noise law of the counts it is estimated
        from (:func:`~dpmarket.common.sketches.intervals.record_count_interval`; a marginals
        sketch's: :func:`~dpmarket.consumer.explore.record_count_interval_of`), holding
        :attr:`n_hat`.
    model : M2MModel or GraphicalModel or None
        The model that answered, with its parameters.
    """

    spec: SketchSpec
    reason: str
    entries: tuple[PublishedSketch, ...]
    answer: Answer
    n_hat: float
    model: M2MModel | GraphicalModel | None = None
    n_interval: tuple[float, float] | None = None

    @property
    def owners(self) -> tuple[str, ...]:
        """The owners whose sketches were read."""
        return tuple(e.owner for e in self.entries)

    def to_json(self, curator: str) -> dict[str, Any]:
        """What ``dpmarket consumer explore --json`` prints (``curator``: ``NAME@HOST:PORT``)."""
        return {
            "curator": curator,
            "spec": self.spec.name,
            "source": self.answer.source,
            "reason": self.reason,
            "owners": list(self.owners),
            "sketches": [e.describe() for e in self.entries],
            **(self.model.to_json() if self.model is not None else {}),
            "n": self.n_hat,
            "n_interval": None if self.n_interval is None else list(self.n_interval),
            "answer": self.answer.as_dict(),
        }


#: Explorations an :class:`ExplorationCache` keeps by default (the least recently used are
#: dropped beyond it; each holds one answer's arrays, kilobytes).
EXPLORATION_CACHE_SIZE = 256


class ExplorationCache:
    """Explorations kept per question and per the content of the sketches it was answered from
    (a bounded LRU, thread-safe): :func:`explore` given one returns a kept exploration instead
    of computing it again.

    A published sketch does not change (a new publication is a new sketch, with its own
    digest: :attr:`~dpmarket.common.sketches.sketch.PrivateSketch.digest`), and an answer is
    a deterministic function of the question, the options and the sketches (the consumer's
    randomness is seeded by the options), so a kept exploration is exactly what
    :func:`explore` would compute, as long as the marginals models it read stay those the
    process reads: :meth:`clear` it when they change (the console does once it has refitted
    the owners' published fits, :func:`verify_fits`).

    Parameters
    ----------
    size : int
        Explorations kept.
    """

    def __init__(self, size: int = EXPLORATION_CACHE_SIZE) -> None:
        self.size = int(size)
        self._entries: OrderedDict[Hashable, Exploration] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Exploration | None:
        """The exploration kept under ``key`` (made the most recent), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: Hashable, exploration: Exploration) -> None:
        """Keep ``exploration`` under ``key``, dropping the least recently used beyond
        :attr:`size`."""
        with self._lock:
            self._entries[key] = exploration
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every exploration."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def exploration_key(
    query: Query,
    spec: str | None,
    owners: Sequence[str],
    options: ExploreOptions,
    candidates: Sequence[tuple[SketchSpec, Sequence[PublishedSketch]]],
) -> Hashable:
    """What an exploration depends on: the question, the spec and owners asked, the options,
    and each candidate spec's key with the content of every sketch read under it (owner,
    publication time and digest)."""
    read = tuple(
        (
            s.name,
            s.key,
            tuple(sorted((e.owner, e.published_at, e.sketch.digest) for e in entries)),
        )
        for s, entries in candidates
    )
    return (query, spec, tuple(owners), options, read)


@dataclass(frozen=True)
class Ranking:
    """Owners ranked by the MMD between a validation set and their RFF sketches.

    Attributes
    ----------
    spec : SketchSpec
        The RFF spec read.
    validation_points : int
        Points of the validation set (which stayed here).
    owners : tuple of RankedOwner
        Smallest MMD first, each with its interval and the owners it is not resolved against.
    sketches : dict of str to PrivateSketch
        Each ranked owner's sketch (its epsilon and noisy count).
    """

    spec: SketchSpec
    validation_points: int
    owners: tuple[RankedOwner, ...]
    sketches: dict[str, PrivateSketch]

    def rows(self) -> list[dict[str, Any]]:
        """One row per owner, best first, as ``dpmarket consumer rank-owners --json`` lists
        them: ``rank`` (the order of the point estimates), ``rank_interval`` (``[best, worst]``,
        the ranks the resolved pairs leave the owner: :attr:`RankedOwner.ranks`), ``owner``,
        the MMD² as a row of the one interval model
        (:func:`dpmarket.common.uncertainty.interval_row`: ``label``, ``value`` within [0, 2]
        and its interval, with the raw value in ``raw`` when moved, ``standard_error``,
        ``interval``, ``level``, ``basis`` ``"noise"``, ``covers`` (:data:`RANK_COVERS`),
        ``bias_bound``, ``flags``: ``clipped`` and ``few-records`` on the interval,
        ``uninformative`` and ``order_not_resolved`` on the value, the first three by
        ``explore``'s rule, :func:`~dpmarket.consumer.explore.bounded_answer` over
        :data:`MMD2_RANGE`), ``epsilon``, ``n`` (the sketch's noisy count, floored at 1) and
        ``n_interval`` (its 95 % interval from the count's noise law,
        :func:`~dpmarket.common.sketches.intervals.record_count_interval`)."""
        return [
            _ranking_row(k, ranked, self.sketches[ranked.owner])
            for k, ranked in enumerate(self.owners, 1)
        ]

    def resolved_pairs(self) -> list[tuple[str, str]]:
        """Every pair of owners whose order the sketches resolve, as ``(better, worse)`` (the
        smaller MMD² first; the difference's 95 % interval excludes 0), in ranking order."""
        pairs = []
        for i, ranked in enumerate(self.owners):
            tied = {o for o, _, _ in ranked.unresolved}
            pairs += [(ranked.owner, w.owner) for w in self.owners[i + 1 :] if w.owner not in tied]
        return pairs

    def resolution_text(self) -> str:
        """Which pairs of owners the ranking resolves, in one line (``rank-owners`` prints it
        under its table, the console under its own): the resolved pairs as ``A < B`` (A the
        better match), or that none is and the order shown is the point estimates' alone."""
        k = len(self.owners)
        pairs, resolved = k * (k - 1) // 2, self.resolved_pairs()
        if pairs == 0:
            return "one owner: nothing to order"
        if not resolved:
            return (
                f"no pair of owners is resolved (0 of {pairs}): the order above is the point "
                "estimates' only, and every owner can hold any rank"
            )
        listed = ", ".join(f"{a} < {b}" for a, b in resolved)
        return (
            f"resolved (each pair's difference's 95 % interval excludes 0): {listed} "
            f"({len(resolved)} of {pairs} pairs); the rank column gives the ranks these leave "
            "each owner"
        )

    def to_json(self, curator: str) -> dict[str, Any]:
        """What ``dpmarket consumer rank-owners --json`` prints (``curator``:
        ``NAME@HOST:PORT``): the rows (:meth:`rows`), ``resolved_pairs`` (``[better, worse]``,
        :meth:`resolved_pairs`) and ``pairs``, how many pairs of owners there are."""
        k = len(self.owners)
        return {
            "curator": curator,
            "spec": self.spec.name,
            "validation_points": self.validation_points,
            "ranking": self.rows(),
            "resolved_pairs": [list(p) for p in self.resolved_pairs()],
            "pairs": k * (k - 1) // 2,
        }


#: What a ranking's intervals cover.
RANK_COVERS = (
    "the squared MMD of the exact Gaussian kernel between the owner's records and the validation "
    "set, over the draw of the spec's frequencies and of the noise (the RFF approximation, the "
    "sum's and the count's noise; dpmarket.common.sketches.mmd)"
)


def noisy_count_text(value: float) -> str:
    """A sketch's released noisy record count as tables show it: to the record, clamped at 0
    for display (a count cannot be negative; the noise can make its release so), the release
    itself beside it when clamped (``--json`` keeps the release as it is).

    Parameters
    ----------
    value : float
        The noisy count the sketch released (records).
    """
    if value < 0:
        return f"0 (released {value:.0f})"
    return f"{value:.0f}"


#: How a ranking's flags are named where they are shown (``rank-owners``' table and legend,
#: the console's ranking page), by code.
RANK_FLAG_NAMES = {
    "clipped": "CLIPPED",
    "few-records": "FEW-RECORDS",
    "uninformative": "uninformative",
    "order_not_resolved": "tie?",
}


#: What a Gaussian kernel's MMD² can be, whatever the data (``0 <= k <= 1 = k(x, x)``), in the
#: words of a ranking's flags.
MMD2_RANGE = (0.0, 2.0, "[0, 2], where a Gaussian kernel's MMD² can be")


def _tie_text(other: str, difference: float, standard_error: float, reach: float) -> str:
    """An unresolved pair's difference of MMD² (``this - other``) and its 95 % interval, both cut
    to ``[-reach, reach]`` (two values in :data:`MMD2_RANGE` differ by at most its width), as the
    ranking's values are cut to the range: a small owner's raw difference of -163 read as
    "-163 ± 3.67e+04" beside a table that showed its value as 2."""
    value = min(max(difference, -reach), reach)
    low = max(difference - Z95 * standard_error, -reach)
    high = min(difference + Z95 * standard_error, reach)
    return f"{other} (difference {value:+.3g}, 95 % [{low:+.3g}, {high:+.3g}])"


def _ranking_row(rank: int, ranked: RankedOwner, sketch: PrivateSketch) -> dict[str, Any]:
    """One owner of a ranking: its MMD² as a row of the one interval model, its ranks, its ε
    and count.

    The value, its interval and the flags ``clipped``, ``few-records`` and ``uninformative``
    follow ``explore``'s one rule (:func:`~dpmarket.consumer.explore.bounded_answer`) over
    :data:`MMD2_RANGE`; ``order_not_resolved`` names the owners its order against is within
    the noise."""
    e = ranked.estimate
    low, high, what = MMD2_RANGE
    values, lo, hi, (flags,) = bounded_answer(
        np.array([e.value]),
        np.array([e.low]),
        np.array([e.high]),
        np.array([low]),
        np.array([high]),
        [what],
        math.sqrt(sketch.count_noise_variance) / sketch.count_estimate,
        np.array([Z95 * e.standard_error]),
    )
    shown = float(values[0])
    flag_list = list(flags)
    if ranked.unresolved:
        ties = ", ".join(_tie_text(o, d, se, high - low) for o, d, se in ranked.unresolved)
        flag_list.append(
            Flag(
                "order_not_resolved",
                f"its order against {ties} is within the noise and the RFF approximation (the "
                "difference's 95 % interval contains 0)",
                "value",
            )
        )
    row: dict[str, Any] = {
        "rank": rank,
        "rank_interval": list(ranked.ranks),
        "owner": ranked.owner,
        **interval_row(
            f"MMD²({ranked.owner}, validation)",
            shown,
            e.standard_error,
            float(lo[0]),
            float(hi[0]),
            basis="noise",
            covers=RANK_COVERS,
            flags=flag_list,
            level=e.level,
        ),
        "epsilon": sketch.mechanism.epsilon,
        "n": sketch.count_estimate,
        "n_interval": list(_count_interval(sketch)),
    }
    if shown != e.value:
        row["raw"] = e.value
    return row


def _marginals_records(
    marginals: MarginalsExplorer, tables: Sequence[MarginalsSketch]
) -> tuple[float, float, float]:
    """The record count behind a marginals answer (the models' totals) and its 95 % interval
    (:func:`~dpmarket.consumer.explore.record_count_interval_of`)."""
    n_hat = math.fsum(marginals.models(s)[0].total for s in tables)
    low, high = record_count_interval_of(
        [s.measurements for s in tables], [int(c) for c in marginals.feature_map.cells]
    )
    return n_hat, low, high


def _records(sketch: SketchLike, seed: int) -> tuple[float, float, float]:
    """The record count behind an M2M or histogram answer and its 95 % interval: the one a
    count answer states (:func:`~dpmarket.consumer.explore.record_count`)."""
    return record_count(sketch, seed)


def _count_interval(sketch: PrivateSketch) -> tuple[float, float]:
    """A ranked sketch's record count's 95 % interval (the consumer's replicates seeded: the
    same sketch gives the same interval), holding its :attr:`count_estimate`."""
    _, low, high = record_count_interval(sketch, np.random.default_rng([0, 5]))
    n = sketch.count_estimate
    return min(low, n), max(high, n)


def _declaration(spec: str) -> str:
    return spec.split("/")[0]


def _besides_allocation(specs: list[SketchSpec], allocation: str | None) -> list[SketchSpec]:
    """``specs`` without the declaration of the curator's allocation spec when they hold
    another declaration: a deployment made by ``dpmarket init`` has two, the allocation's
    (features only, read by the curator's summaries) and the one over every column, which a
    consumer's question means when it names none."""
    if allocation is None:
        return specs
    others = [s for s in specs if _declaration(s.name) != _declaration(allocation)]
    return others or specs


def choose_spec(client: Any, name: str | None, kind: str | None = None) -> SketchSpec:
    """The spec called ``name``, or the only one (of ``kind``) in the catalogue besides the
    curator's allocation spec's declaration (or that one when it is alone).

    Raises
    ------
    SpecChoiceError
        If ``name`` is of another kind, or it is None and the catalogue has not exactly one
        such spec.
    """
    if name is not None:
        spec: SketchSpec = client.sketch_spec(name)
        if kind is not None and spec.kind != kind:
            raise SpecChoiceError(f"{name} is a {spec.kind} spec, not {kind}")
        return spec
    catalogue, allocation = client.sketch_catalogue()
    specs = [s for s in catalogue if kind is None or s.kind == kind]
    specs = _besides_allocation(specs, allocation)
    if len(specs) != 1:
        names = ", ".join(s.name for s in specs) or "none"
        raise SpecChoiceError(f"choose a spec with --spec (the catalogue has: {names})")
    return specs[0]


def published(
    entries: list[PublishedSketch], owners: Sequence[str], spec: SketchSpec
) -> list[PublishedSketch]:
    """``entries``, checked to hold every owner of ``owners`` and at least one sketch.

    Raises
    ------
    NotFoundError
        If an owner asked about has published no sketch under ``spec``, or no owner has.
    """
    found = {e.owner for e in entries}
    missing = sorted(set(owners) - found)
    if missing:
        raise NotFoundError(
            f"no sketch of {', '.join(missing)} under {spec.name} (published: "
            f"{', '.join(sorted(found)) or 'none'})"
        )
    if not entries:
        raise NotFoundError(f"no owner has published under {spec.name} yet")
    return entries


def _candidates(
    client: Any, name: str | None, owners: Sequence[str]
) -> list[tuple[SketchSpec, list[PublishedSketch]]]:
    """The specs ``name`` allows (one spec, every spec of a declaration, or every spec of the
    only declaration besides the curator's allocation spec's), each with the sketches of the
    owners asked about; specs missing one of them are left out."""
    if name is not None and "/" in name:
        specs = [client.sketch_spec(name)]
    else:
        catalogue, allocation = client.sketch_catalogue()
        specs = [s for s in catalogue if name is None or _declaration(s.name) == name]
        if name is None:
            specs = _besides_allocation(specs, allocation)
        declarations = {_declaration(s.name) for s in specs}
        if not specs or len(declarations) > 1:
            listed = ", ".join(sorted(declarations)) or "none"
            raise SpecChoiceError(
                f"name a declaration or a spec with --spec (the catalogue has: {listed})"
            )
    out = []
    for spec in specs:
        entries = client.sketches(spec, list(owners) or None)
        if entries and set(owners) <= {e.owner for e in entries}:
            out.append((spec, entries))
    if not out:
        names = ", ".join(s.name for s in specs)
        who = ", ".join(owners) or "any owner"
        raise NotFoundError(f"no sketch of {who} under {names}")
    return out


def _merged(entries: Sequence[PublishedSketch]) -> SketchLike:
    """One owner's sketch, or the union's."""
    sketches = [e.sketch for e in entries if isinstance(e.sketch, PrivateSketch)]
    return sketches[0] if len(sketches) == 1 else merge_sketches(sketches)


def _expected_error(
    query: Query,
    spec: SketchSpec,
    entries: list[PublishedSketch],
    make: Callable[[SketchSpec], Explorer],
    answer_of: Callable[[SketchSpec], Answer],
) -> float:
    """Mean half-width of ``spec``'s honest 95 % interval for ``query``
    (:func:`~dpmarket.consumer.explore.honest_half_width` of ``answer_of(spec)``, which keeps the
    answer); for a logistic regression, whose bias no sketch bounds (every interval untrusted),
    the mean standard error of the involved columns' means from the public noise scales."""
    if query.kind != "logreg":
        return honest_half_width(answer_of(spec), spec.domain)
    estimator = make(spec).estimator(_merged(entries))
    columns = tuple(dict.fromkeys((*query.columns, *([query.target] if query.target else []))))
    target = m2m_target(Query("mean", columns=columns), spec.domain)
    assert target is not None
    return float(np.mean(m2m_standard_errors(estimator, target)))


def _explorer(kept: dict[Any, Explorer], spec: SketchSpec, options: ExploreOptions) -> Explorer:
    """``spec``'s M2M explorer under ``options``, made once and kept in ``kept``."""
    key = (spec.name, spec.key, options)
    if key not in kept:
        kept[key] = Explorer(
            spec,
            n_synthetic=options.synthetic or DEFAULT_EXPLORE_SYNTHETIC,
            seed=options.seed,
            lambda_rule=options.lambda_rule,
            intercept=options.intercept,
        )
    return kept[key]


def warm(
    client: Any,
    *,
    options: ExploreOptions | None = None,
    explorers: dict[Any, Explorer] | None = None,
    lock: threading.Lock | None = None,
    stop: threading.Event | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    pause: Callable[[], None] | None = None,
) -> int:
    """Compute ahead what :func:`explore` computes first: every published marginals sketch's
    model and bootstrap refits (into :data:`~dpmarket.consumer.explore.MARGINALS_MODELS`: read
    from the owner's published fit where there is one, a few ms each), then every spec's M2M
    design (into ``explorers``), for the specs a question naming none reads (every spec besides
    the curator's allocation spec's declaration), then the modules answers import on first use
    (:data:`IMPORTED_AHEAD`). Answers are the same whether or not it ran.

    Parameters
    ----------
    client : CuratorClient
        Reads the catalogue (one ListSketchSpecs, one ListSketches per spec).
    options : ExploreOptions, optional
        The options the answers will use (the caches are keyed by them).
    explorers : dict, optional
        The dict later passed to :func:`explore`.
    lock : threading.Lock, optional
        Held around drawing each design: the lock :func:`explore`'s callers hold around an
        answer (an answer waits at most for the design in progress). A sketch's models are
        fitted outside it: an answer that needs them waits for them
        (:meth:`~dpmarket.consumer.explore.ModelCache.fitted`), every other answer runs.
    stop : threading.Event, optional
        Set: stop before the next step.
    model_dir : path, optional
        Where marginals models are kept on disk (as :func:`explore`'s).
    pause : callable, optional
        Called before each step; returns when the step may run (a console waits there while
        a question asked meanwhile is answered, which would otherwise share the interpreter
        with the step).

    Returns
    -------
    int
        The steps done (sketches' models read or fitted, designs drawn).

    Raises
    ------
    dpmarket.common.errors.DPMarketError, ValueError
        From the catalogue or the estimators.
    """
    options = options if options is not None else ExploreOptions()
    kept: dict[Any, Explorer] = explorers if explorers is not None else {}
    guard = lock if lock is not None else threading.Lock()
    catalogue, allocation = client.sketch_catalogue()
    specs = _besides_allocation(list(catalogue), allocation)
    done = 0
    for spec in [s for s in specs if s.kind == "marginals"]:
        marginals = MarginalsExplorer(
            spec,
            bootstrap=options.bootstrap,
            seed=options.seed,
            store=model_dir,
            refit=options.refit,
        )
        for entry in client.sketches(spec):
            if not _go_on(stop, pause):
                return done
            if isinstance(entry.sketch, MarginalsSketch):
                # Not under ``guard``: the model cache makes an answer that needs this
                # sketch wait for it, and lets every other answer run meanwhile.
                marginals.models(entry.sketch)
                done += 1
    for spec in [s for s in specs if s.kind != "marginals"]:
        if not _go_on(stop, pause):
            return done
        with guard:
            _ = _explorer(kept, spec, options).design  # drawn when first read
        done += 1
    for module in IMPORTED_AHEAD:  # imported on an answer's first use otherwise
        if not _go_on(stop, pause):
            return done
        importlib.import_module(module)
    logger.info("explore caches warmed: %d designs and sketch models", done)
    return done


def _go_on(stop: threading.Event | None, pause: Callable[[], None] | None) -> bool:
    """Whether a step ahead of time may run now: after ``pause`` (if any) returns, unless
    ``stop`` is set."""
    if pause is not None:
        pause()
    return stop is None or not stop.is_set()


def published_fits(
    client: Any, *, options: ExploreOptions | None = None
) -> list[tuple[SketchSpec, PublishedSketch]]:
    """Every published marginals sketch whose owner's fit the answers read
    (:meth:`~dpmarket.consumer.explore.MarginalsExplorer.published`): what :func:`verify_fits`
    refits.

    Raises
    ------
    dpmarket.common.errors.DPMarketError
        From the catalogue.
    """
    options = options if options is not None else ExploreOptions()
    catalogue, allocation = client.sketch_catalogue()
    found = []
    for spec in _besides_allocation(list(catalogue), allocation):
        if spec.kind != "marginals":
            continue
        reader = MarginalsExplorer(
            spec, bootstrap=options.bootstrap, seed=options.seed, refit=options.refit, cache=None
        )
        for entry in client.sketches(spec):
            if isinstance(entry.sketch, MarginalsSketch) and reader.published(entry.sketch):
                found.append((spec, entry))
    return found


def unstored_fits(
    fits: list[tuple[SketchSpec, PublishedSketch]],
    model_dir: str | os.PathLike[str],
    options: ExploreOptions | None = None,
) -> list[tuple[SketchSpec, PublishedSketch]]:
    """Those of ``fits`` (:func:`published_fits`) whose sketch has no fit made here kept in
    ``model_dir``: the ones answers read the published fit of until :func:`verify_fits` refits
    them (a kept one is read before the published fit, e.g. after a restart)."""
    options = options if options is not None else ExploreOptions()
    out = []
    for spec, entry in fits:
        assert isinstance(entry.sketch, MarginalsSketch)
        explorer = MarginalsExplorer(
            spec, bootstrap=options.bootstrap, seed=options.seed, store=model_dir, cache=None
        )
        if not explorer.stored(entry.sketch):
            out.append((spec, entry))
    return out


def refit_into_store(
    fits: list[tuple[SketchSpec, PublishedSketch]],
    model_dir: str | os.PathLike[str],
    options: ExploreOptions | None = None,
) -> int:
    """Fit each of ``fits``' sketches here and keep the models in ``model_dir`` (nothing kept
    in memory, nothing compared): the work of :func:`verify_fits`, done ahead, e.g. in another
    process, so that :func:`verify_fits` then reads the models from the store. A sketch whose
    models are kept there already is skipped.

    Returns
    -------
    int
        The sketches fitted or found kept.

    Raises
    ------
    ValueError
        From the fit.
    """
    options = options if options is not None else ExploreOptions()
    for spec, entry in fits:
        assert isinstance(entry.sketch, MarginalsSketch)
        MarginalsExplorer(
            spec,
            bootstrap=options.bootstrap,
            seed=options.seed,
            store=model_dir,
            refit=True,
            cache=None,
        ).models(entry.sketch)
    return len(fits)


def verify_fits(
    client: Any,
    *,
    options: ExploreOptions | None = None,
    stop: threading.Event | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    pause: Callable[[], None] | None = None,
) -> int:
    """Refit here every published marginals sketch whose owner's fit the answers read
    (:func:`published_fits`), so that later answers read this process's own fit, and log a
    warning where the owner's differs from it: the consumer checks the publisher's fit without
    any answer waiting for it (the console runs it in the background after :func:`warm`,
    the fits themselves in another process: :func:`refit_into_store`; an answer meanwhile
    reads the published fit).

    Parameters
    ----------
    client : CuratorClient
    options : ExploreOptions, optional
        The options the answers use (nothing is refitted with ``refit``: nothing published is
        read).
    stop : threading.Event, optional
        Set: stop before the next sketch.
    model_dir : path, optional
        Where marginals models are kept on disk (the refits are kept there too, and read from
        there when :func:`refit_into_store` fitted them).
    pause : callable, optional
        Called before each sketch (as :func:`warm`'s).

    Returns
    -------
    int
        The sketches refitted.

    Raises
    ------
    dpmarket.common.errors.DPMarketError, ValueError
        From the catalogue or the fit.
    """
    options = options if options is not None else ExploreOptions()
    done = 0
    for spec, entry in published_fits(client, options=options):
        if not _go_on(stop, pause):
            return done
        _verify_fit(spec, entry, options, model_dir)
        done += 1
    return done


def _verify_fit(
    spec: SketchSpec,
    entry: PublishedSketch,
    options: ExploreOptions,
    model_dir: str | os.PathLike[str] | None,
) -> None:
    """Refit ``entry``'s marginals sketch here (into the process's model cache, in place of
    its published fit) and log a warning if the owner's fit differs from it."""
    sketch = entry.sketch
    assert isinstance(sketch, MarginalsSketch)
    fit = carried_fit(sketch)
    assert fit is not None
    own = MarginalsExplorer(
        spec, bootstrap=options.bootstrap, seed=options.seed, store=model_dir, refit=True
    ).models(sketch)
    gap = fit.difference(own)
    if gap > FIT_TOLERANCE:
        logger.warning(
            "%s: %s's published fit differs from the one refitted here by %.3g of the total "
            "(answers now read the refitted one)",
            spec.name,
            entry.owner,
            gap,
        )
    else:
        logger.info("%s: %s's published fit checked by refitting", spec.name, entry.owner)


def explore(
    client: Any,
    query: Query,
    *,
    spec: str | None = None,
    owners: Sequence[str] = (),
    options: ExploreOptions | None = None,
    explorers: dict[Any, Explorer] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    answers: ExplorationCache | None = None,
) -> Exploration:
    """Answer ``query`` about ``owners``' data (their union; none: any owner) from their
    published sketches, with standard errors, computed here (no owner is asked anything).

    Each query is answered from the best sketch available
    (:func:`~dpmarket.consumer.explore.choose_source`): among the sketches that express it (a
    marginals sketch: counts, CDFs, marginals, synthetic records, moments of discrete columns;
    HIST, RFF, RACE: all but marginals and records), the one whose honest 95 % interval is
    narrowest (an RFF or RACE answer, an M2M fit, is computed only when no histogram or
    marginals answer says anything); the chosen answer is the one compared. A spec named with
    ``spec`` (``decl/kind``) answers as asked, and the reason says so.

    Parameters
    ----------
    client : CuratorClient
        Reads the catalogue.
    query : Query
    spec : str, optional
        A spec (``decl/kind``) to answer from, or a declaration whose best sketch is chosen
        (default: the only declaration besides the curator's allocation spec's).
    owners : sequence of str
        The owners asked about.
    options : ExploreOptions, optional
    explorers : dict, optional
        Keeps each spec's M2M explorer (its synthetic design, the costly part) across calls,
        keyed by the spec and the options: the consumer's console passes one dict for its
        lifetime. (Marginals models are kept per sketch content in the process:
        :data:`~dpmarket.consumer.explore.MARGINALS_MODELS`.)
    model_dir : path, optional
        A folder where marginals models are also kept on disk, for the next process
        (:mod:`dpmarket.consumer.model_store`; the CLI's ``DATA_DIR/explore-models``).
    answers : ExplorationCache, optional
        Explorations kept across calls, by question and sketch content
        (:func:`exploration_key`): a question asked again of the same sketches is answered
        from it (the catalogue is read all the same). The consumer's console passes one for its
        lifetime.

    Returns
    -------
    Exploration

    Raises
    ------
    SpecChoiceError
        If the catalogue's specs do not say which one to read.
    NotFoundError
        If an owner asked about has no sketch under the specs.
    dpmarket.common.errors.DPMarketError, ValueError
        From the catalogue or the estimators.
    """
    options = options if options is not None else ExploreOptions()
    kept: dict[Any, Explorer] = explorers if explorers is not None else {}

    def make(chosen: SketchSpec) -> Explorer:
        return _explorer(kept, chosen, options)

    marginals_kept: dict[str, MarginalsExplorer] = {}
    answered: dict[str, Answer] = {}

    def answer_of(chosen: SketchSpec) -> Answer:
        """``chosen``'s answer for the owners asked about (computed once)."""
        if chosen.name not in answered:
            entries = by_name[chosen.name][1]
            if chosen.kind == "marginals":
                tables = [e.sketch for e in entries if isinstance(e.sketch, MarginalsSketch)]
                marginals_kept[chosen.name] = MarginalsExplorer(
                    chosen,
                    bootstrap=options.bootstrap,
                    seed=options.seed,
                    store=model_dir,
                    refit=options.refit,
                )
                answered[chosen.name] = marginals_kept[chosen.name].answer(query, tables)
            else:
                answered[chosen.name] = make(chosen).answer(query, _merged(entries))
        return answered[chosen.name]

    candidates = _candidates(client, spec, owners)
    key = exploration_key(query, spec, owners, options, candidates)
    kept_answer = answers.get(key) if answers is not None else None
    if kept_answer is not None:
        return kept_answer
    by_name = {s.name: (s, e) for s, e in candidates}
    chosen, reason = choose_source(
        query,
        [s for s, _ in candidates],
        lambda s: _expected_error(query, s, by_name[s.name][1], make, answer_of),
    )
    if spec is not None and "/" in spec:  # one spec named: nothing was compared
        reason = f"{chosen.name}: the sketch chosen for this question (no other was compared)"
    entries = by_name[chosen.name][1]
    answer = answer_of(chosen)
    if chosen.kind == "marginals":
        marginals = marginals_kept[chosen.name]
        tables = [e.sketch for e in entries if isinstance(e.sketch, MarginalsSketch)]
        n_hat, n_low, n_high = _marginals_records(marginals, tables)
        model: M2MModel | GraphicalModel = GraphicalModel(options.bootstrap, options.seed)
    else:
        explorer = make(chosen)
        estimator = explorer.estimator(_merged(entries))
        n_hat, n_low, n_high = _records(estimator.sketch, options.seed)
        model = M2MModel(
            n_synthetic=explorer.design.n_synthetic,
            seed=options.seed,
            lambda_rule=options.lambda_rule,
            lam=estimator.lam,
            intercept=options.intercept,
        )
    n_interval = (min(n_low, n_hat), max(n_high, n_hat))
    exploration = Exploration(
        chosen, reason, tuple(entries), answer, n_hat, model, n_interval=n_interval
    )
    if answers is not None:
        answers.put(key, exploration)
    return exploration


def rank(
    client: Any,
    validation: Callable[[SketchSpec], NDArray[np.float64]] | NDArray[np.float64],
    *,
    spec: str | None = None,
    owners: Sequence[str] = (),
    label: str | None = None,
) -> Ranking:
    """Rank owners by the MMD between a validation set and their RFF sketches, computed here
    (:func:`~dpmarket.consumer.explore.rank_owners`).

    Parameters
    ----------
    client : CuratorClient
        Reads the catalogue.
    validation : ndarray of shape (m, d), or a callable
        The validation set in the spec's column order, or a function of the chosen spec giving
        it (the CLI reads a table's columns by the spec's names).
    spec : str, optional
        An RFF spec (default: the only one besides the curator's allocation spec's
        declaration, or that one when it is alone).
    owners : sequence of str
        Rank only these owners (default: every owner that published under the spec).
    label : str, optional
        The label column of the consumer's schema. When the spec's columns are the validation
        set's plus this one, the validation set may be given without it, as
        :meth:`dpmarket.client.Consumer.summarize` takes it (:func:`label_completed`).

    Returns
    -------
    Ranking

    Raises
    ------
    SpecChoiceError
        If the spec is not RFF, or none is named and the catalogue has not exactly one.
    NotFoundError
        If an owner asked about has not published under the spec.
    InvalidArgumentError
        If a validation record lies outside the spec's domain, or the validation set has
        neither the spec's columns nor all of them but ``label`` (naming the spec and its
        columns).
    """
    chosen = choose_spec(client, spec, kind="rff")
    points = validation(chosen) if callable(validation) else np.asarray(validation, np.float64)
    m = int(points.shape[0]) if points.ndim == 2 else 0
    points = label_completed(points, chosen, label)
    entries = published(client.sketches(chosen, list(owners) or None), owners, chosen)
    sketches = {e.owner: e.sketch for e in entries if isinstance(e.sketch, PrivateSketch)}
    ranking = rank_owners(sketches, points)
    return Ranking(chosen, m, tuple(ranking), sketches)


#: Most label values a features-only validation set is completed with (:func:`label_completed`).
MAX_LABEL_LEVELS = 100


def label_completed(
    points: NDArray[np.float64], spec: SketchSpec, label: str | None
) -> NDArray[np.float64]:
    """The validation set with the spec's columns: as given, or, when it lacks exactly the
    spec's column ``label``, every row repeated once per value of the label (in the spec's
    domain), that column set to it.

    A sketch of a spec whose columns include the label embeds the owner's records with their
    labels, while D_v is the features only (as summaries take it). Ranking against D_v with
    every label value equally weighted (D_v times the uniform distribution of the label) keeps
    every completed row inside the domain and favours no class: for a binary label, the cross
    term of the MMD then weights every owner record by the same factor of the label kernel, so
    the ranking compares the owners' features to D_v's, plus each owner's own label spread (its
    self term), which D_v does not know.

    Parameters
    ----------
    points : ndarray of shape (m, d) or (m, d - 1)
    spec : SketchSpec
    label : str or None
        The label column (the consumer's schema's).

    Returns
    -------
    ndarray of shape (m, d) or (m * L, d)
        ``L`` the label's values: its levels, or the integers within its bounds.

    Raises
    ------
    InvalidArgumentError
        If the width is neither ``d`` nor ``d - 1`` with ``label`` one of the spec's columns, or
        the label has more than :data:`MAX_LABEL_LEVELS` values; the message names the spec and
        its columns.
    """
    domain = spec.domain
    names = list(domain.names) or [f"column {j}" for j in range(domain.n_attributes)]
    width = points.shape[1] if points.ndim == 2 else None
    if width == domain.n_attributes:
        return points
    if width == domain.n_attributes - 1 and label is not None and label in names:
        j = names.index(label)
        values = _label_values(domain, j)
        if values is not None:
            rows = np.repeat(points, len(values), axis=0)
            column = np.tile(values, points.shape[0])
            return np.insert(rows, j, column, axis=1)
    hint = (
        f"; the label {label!r} is filled for a features-only set only when it is one of them "
        f"and takes at most {MAX_LABEL_LEVELS} values"
        if label is not None
        else "; a set without the label column is accepted when the label is named (schema=)"
    )
    raise InvalidArgumentError(
        f"the validation set has shape {points.shape}: spec {spec.name} ranks records of "
        f"{domain.n_attributes} columns ({', '.join(names)}), in this order{hint}"
    )


def _label_values(domain: Domain, j: int) -> NDArray[np.float64] | None:
    """The values of attribute ``j``: its levels, or the integers within its bounds (None if
    more than :data:`MAX_LABEL_LEVELS`)."""
    levels = domain.levels[j] if domain.levels else None
    if levels is None:
        low, high = math.ceil(float(domain.low[j])), math.floor(float(domain.high[j]))
        if high < low or high - low + 1 > MAX_LABEL_LEVELS:
            return None
        levels = np.arange(low, high + 1, dtype=np.float64)
    if len(levels) > MAX_LABEL_LEVELS:
        return None
    return np.asarray(levels, dtype=np.float64)
