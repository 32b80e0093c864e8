"""The marginals sketch: noisy marginals chosen AIM-style, answered through a graphical model.

An owner publishes, once, Gaussian-noised counts of a few marginals of its table over a public
discretisation of the domain (:class:`MarginalsMap`), chosen by its own private selection
(:class:`MarginalsMechanism`: every 1-way marginal, then rounds of an exponential-mechanism
selection of the 2-way marginals its current model fits worst, McKenna et al.'s AIM, with
several selections per round). A consumer fits a graphical model to the measurements
(:class:`MarginalsModel`, Private-PGM through the ``mbi`` library) and answers counting
queries, marginals and synthetic samples from it, with errors by parametric bootstrap from the
public noise scales. Everything a consumer computes is post-processing of the release.

Privacy is accounted in zero-concentrated DP: the owner's ``(epsilon, delta)`` becomes a budget
``rho`` (:func:`dpmarket.common.privacy.accounting.zcdp_rho`, the tight conversion), which the 1-way
measurements, the selections and the 2-way measurements split by adding their ``rho``
(:meth:`MarginalsMechanism.plan`). The release states every noise scale and every selection's
epsilon, so a receiver re-adds them (:meth:`MarginalsSketch.validate`).

Pure computation (numpy, jax through ``mbi``): no I/O, no gRPC, no logging of data.

References
----------
McKenna, Mullins, Sheldon & Miklau, "AIM: an adaptive and iterative mechanism for
differentially private synthetic data", VLDB 2022 (selection, budget annealing, bias-corrected
scores); McKenna, Sheldon & Miklau, "Graphical-model based estimation and inference for
differential privacy", ICML 2019 (Private-PGM, the ``mbi`` library); McKenna, Miklau & Sheldon,
"Winning the NIST contest: a scalable and general approach to differentially private synthetic
data", JPC 2021 (MST); Bun & Steinke, TCC 2016 (zCDP); Cesar & Rogers, ALT 2021 (the exponential
mechanism's ``epsilon^2 / 8``); Durfee & Rogers, NeurIPS 2019 (one-shot Gumbel top-k = k
peeling exponential mechanisms).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.accounting import (
    PrivacyEvent,
    exponential_zcdp_rho,
    gaussian_zcdp_rho,
    zcdp_rho,
)
from dpmarket.common.privacy.noise import NoiseSource, SeededNoise
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import OneHotFeatureMap
from dpmarket.common.sketches.marginals_tree import ChowLiuTree
from dpmarket.common.validation import check_positive_int

if TYPE_CHECKING:
    import mbi


__all__ = [
    "ASSUMED_ROWS",
    "AUTO",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_MAX_CELLS",
    "DEFAULT_MEASUREMENTS",
    "MarginalsMap",
    "MarginalsMechanism",
    "MarginalsModel",
    "MarginalsSketch",
    "Measurement",
    "RoundPlan",
    "bound_weights",
    "cell_weights",
    "default_measurements",
    "default_oneway_share",
    "default_rounds",
    "free_compiled",
    "marginals_map",
    "model_size_mb",
    "public_share",
]

#: ``measurements = 0`` / ``rounds = 0`` in a map: derive them from the domain, the budget and
#: the declared rows (:func:`default_measurements`, :func:`default_rounds`).
AUTO = 0
#: The typical dependence between two columns that :func:`default_measurements` plans for: the
#: L1 distance between a pair's joint distribution and the product of its margins, as a
#: fraction of the rows, that a measurement should be able to see above its noise. Chosen
#: leave-one-table-out over 0.06, 0.12 and 0.18 with the derived plan's other choices, on five
#: tables (docs/results.md, "Counting queries").
DEPENDENCE = 0.18
#: Rows assumed per owner when a declaration states none (``rows``): a small table, hence few
#: measurements (the noise weighs more on a small table's cells).
ASSUMED_ROWS = 5_000
#: Kept for declarations written before the measurements were derived: the old constant.
DEFAULT_MEASUREMENTS = AUTO
#: The largest marginal a selection may measure, in cells.
DEFAULT_MAX_CELLS = 10_000
#: Parametric bootstrap replicates behind every standard error.
DEFAULT_BOOTSTRAP = 32
#: Share of ``rho`` spent on the 1-way marginals (measured first, all of them) when the map
#: states its rounds.
ONEWAY_SHARE = 0.2
#: Whether the derived plan (rounds not stated) takes its 1-way share from
#: :func:`default_oneway_share` rather than :data:`ONEWAY_SHARE`, and weights each pair's noise
#: by its cells when it measures every pair (:meth:`MarginalsMechanism.pair_sigmas`). Chosen
#: leave-one-table-out on five tables (docs/results.md, "Counting queries").
DERIVED_ONEWAY_SHARE = True
DERIVED_CELL_WEIGHTS = True
#: Share of each round's ``rho`` spent on its selections (AIM's 0.1); the rest measures.
SELECTION_SHARE = 0.1
#: Mirror-descent iterations of a fit during selection, of the final fit, of a bootstrap refit
#: (warm-started from the final model).
SELECTION_ITERS = 500
FINAL_ITERS = 2000
BOOTSTRAP_ITERS = 500
#: The largest junction-tree model (MB of float64 tables, ``mbi``'s measure) a selection may
#: grow; bounds the owner's and the consumers' work.
MAX_MODEL_MB = 32.0
#: The largest junction-tree model (MB, :func:`model_size_mb`) the derived plan's every-pair
#: measurements may form (:meth:`MarginalsMechanism.every_pair_plan`): about the models the
#: one-round selection plan formed (0.2-0.8 MB for GSSvocab's 23 pairs, docs/results.md), whose
#: fit takes a consumer tens of seconds of CPU (its bootstrap refits several times that). Every
#: pair of eight columns of up to 21 cells is one 28 MB clique: minutes of CPU before a
#: consumer's first answer. Below 0.48 MB the owner can also publish the fit (the model and its
#: :data:`DEFAULT_BOOTSTRAP` refits within
#: :data:`~dpmarket.common.sketches.marginals_fit.MAX_FIT_BYTES`), and a consumer fits nothing;
#: a cap that low drops the pairs that carry most of some tables' dependence (docs/results.md).
#: Decided from the declared cells only (public).
EVERY_PAIR_MAX_MODEL_MB = 1.0
# Relative slack when a received plan's rho is re-added (sums of floats).
_RHO_RTOL = 1e-9


@functools.cache
def _mbi() -> Any:
    """Import ``mbi`` with jax in float64 and without the persistent compilation cache (the
    library's recommendations; both are process-wide jax settings that nothing else here
    uses)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi

    return mbi


def free_compiled() -> None:
    """Drop the executables jax compiled for ``mbi``'s estimation and inference.

    jax compiles once per model structure (set of cliques) and keeps every executable for the
    life of the process, each holding its own memory mappings; a long-lived process that fits
    many structures (an owner publishing sketch after sketch, a consumer fitting many owners'
    sketches, an experiment of hundreds of AIM rounds) would eventually exhaust the kernel's
    ``vm.max_map_count`` and abort inside LLVM. Callers drop them once a release or a fit and
    its bootstrap (which share one structure) is done; the next structure compiles afresh.
    Nothing to drop (and nothing imported) in a process that has not imported jax.
    """
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()


# ------------------------------------------------------------------------------------ map
@dataclass(frozen=True, eq=False)
class MarginalsMap(OneHotFeatureMap):
    """The public discretisation and selection settings of a marginals sketch.

    Attributes
    ----------
    low, high : ndarray of shape (d,), float64
        The domain's box (the outer edges of every column's first and last cell).
    cuts : ndarray of shape (sum(cells) - d,), float64
        Every column's interior cut points, concatenated in column order, strictly increasing
        within a column and strictly inside ``(low_j, high_j)``. Cell ``k`` of column ``j`` is
        ``[e_k, e_{k+1})`` with ``e = [low_j, cuts_j..., high_j]``; the last cell holds
        ``high_j``.
    cells : ndarray of shape (d,), int64
        Cells per column, each >= 1.
    rounds : int
        Selection rounds (:class:`MarginalsMechanism`), each later one scored against a fitted
        graphical model; 0 (:data:`AUTO`, the default): the derived plan, one selection per
        round (:func:`default_rounds`) scored against a closed-form tree, no fit.
    measurements : int
        2-way marginals selected over all rounds (``ceil(measurements / rounds)`` per round); 0
        (:data:`AUTO`, the default): :func:`default_measurements` of the domain, the release's
        budget and ``rows``.
    max_cells : int
        A 2-way marginal with more cells is never a candidate.
    rows : int
        A public estimate of an owner's rows that the default measurements plan for (0: not
        declared, :data:`ASSUMED_ROWS`). Only the plan depends on it, never the privacy.

    Raises
    ------
    ValueError
        For bounds that are not finite with ``low < high``, ``cells`` of the wrong shape or
        below 1, cut points that do not match ``cells``, are not increasing or leave the box,
        or settings below 1.

    Notes
    -----
    As a feature map it is the one-hot of each column's cell (a HIST map with the declared cells):
    ``Delta_1 = d``, ``Delta_2 = sqrt(d)``. The release is not a noisy sum of these features but
    noisy marginal tables (:class:`MarginalsMechanism`), whose sensitivities are derived there. Not
    registered with :func:`dpmarket.common.sketches.feature_maps.feature_map_from_parameters` (its
    release has its own type, :class:`MarginalsSketch`).
    """

    low: NDArray[np.float64]
    high: NDArray[np.float64]
    cuts: NDArray[np.float64]
    cells: NDArray[np.int64]
    rounds: int = AUTO
    measurements: int = AUTO
    max_cells: int = DEFAULT_MAX_CELLS
    rows: int = AUTO
    kind: ClassVar[str] = "marginals"

    def __post_init__(self) -> None:
        box = Domain(self.low, self.high)
        d = box.n_attributes
        cells = np.asarray(self.cells)
        if cells.ndim == 0:
            cells = np.full(d, cells)
        if cells.shape != (d,):
            raise ValueError(f"marginals cells must have shape ({d},), got {cells.shape}")
        counts = np.array([check_positive_int(c, "marginals cells") for c in cells], np.int64)
        cuts = np.asarray(self.cuts, dtype=np.float64).reshape(-1)
        if cuts.shape[0] != int(counts.sum()) - d:
            raise ValueError(
                f"marginals cuts must hold sum(cells) - d = {int(counts.sum()) - d} values, got "
                f"{cuts.shape[0]}"
            )
        if not np.isfinite(cuts).all():
            raise ValueError("marginals cuts hold NaN or inf values")
        start = 0
        for j, c in enumerate(counts):
            col = cuts[start : start + c - 1]
            start += c - 1
            if col.size and (
                (np.diff(col) <= 0).any() or col[0] <= box.low[j] or col[-1] >= box.high[j]
            ):
                raise ValueError(
                    f"marginals cuts of column {j} must increase strictly inside "
                    f"({box.low[j]!r}, {box.high[j]!r}), got {col.tolist()}"
                )
        cuts.setflags(write=False)
        counts.setflags(write=False)
        object.__setattr__(self, "low", box.low)
        object.__setattr__(self, "high", box.high)
        object.__setattr__(self, "cuts", cuts)
        object.__setattr__(self, "cells", counts)
        object.__setattr__(self, "max_cells", check_positive_int(self.max_cells, "max_cells"))
        for name in ("rounds", "measurements", "rows"):
            value = getattr(self, name)
            if value != AUTO:
                value = check_positive_int(value, name)
            object.__setattr__(self, name, int(value))

    @property
    def n_attributes(self) -> int:
        return int(self.low.shape[0])

    @property
    def block_sizes(self) -> NDArray[np.int64]:
        return self.cells

    def parameters(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "high": self.high,
            "cuts": self.cuts,
            "cells": self.cells,
            "rounds": self.rounds,
            "measurements": self.measurements,
            "max_cells": self.max_cells,
            "rows": self.rows,
        }

    def column_cuts(self, column: int) -> NDArray[np.float64]:
        """Interior cut points of ``column``, shape (cells[column] - 1,)."""
        start = int(self.cells[:column].sum()) - column
        return self.cuts[start : start + int(self.cells[column]) - 1]

    def edges(self, column: int) -> NDArray[np.float64]:
        """``[low_j, cuts_j..., high_j]``, shape (cells[column] + 1,)."""
        return np.concatenate(
            [[self.low[column]], self.column_cuts(column), [self.high[column]]]
        ).astype(np.float64)

    def _buckets_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.int64]:
        outside = (x < self.low) | (x > self.high)
        if outside.any():
            row, col = (int(v) for v in np.argwhere(outside)[0])
            raise ValueError(
                f"x row {row0 + row}, column {col} lies outside the domain "
                f"[{float(self.low[col])!r}, {float(self.high[col])!r}]"
            )
        out = np.empty(x.shape, dtype=np.int64)
        for j in range(x.shape[1]):
            out[:, j] = np.searchsorted(self.column_cuts(j), x[:, j], side="right")
        return out

    def cell_indices(self, x: ArrayLike) -> NDArray[np.int64]:
        """The cell of every record in every column, shape (n, d), entry ``(i, j)`` in
        ``[0, cells[j])``.

        Raises
        ------
        ValueError
            If ``x`` is not (n, d), holds NaN or inf, or a value outside the box.
        """
        return self.bucket_indices(x) - self._offsets()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "cells": self.cells.tolist(),
            "rounds": self.rounds,
            "measurements": self.measurements,
            "max_cells": self.max_cells,
            "rows": self.rows,
        }


def default_measurements(
    cells: Sequence[int],
    rho: float,
    rows: int = AUTO,
    max_cells: int = DEFAULT_MAX_CELLS,
    *,
    dependence: float = DEPENDENCE,
    per_pair: bool = False,
) -> int:
    """How many 2-way marginals a marginals sketch measures by default.

    Parameters
    ----------
    cells : sequence of int
        Cells per column (``d`` columns).
    rho : float
        The release's zCDP budget (:func:`dpmarket.common.privacy.accounting.zcdp_rho` of its
        epsilon and delta), > 0.
    rows : int
        A public estimate of the rows (0: :data:`ASSUMED_ROWS`).
    max_cells : int
        Pairs with more cells are not candidates.
    dependence : float
        ``D``, default :data:`DEPENDENCE`.
    per_pair : bool
        Apply the test below to each pair's own cells ``c_ab`` rather than to their mean: ``K``
        is then the largest number such that at least ``K`` pairs pass it at ``sigma(K)``.

    Returns
    -------
    int
        ``K = floor(2 (1 - s) (1 - o) rho (D n / (sqrt(2 / pi) c))^2)``, clipped to ``[min(d -
        1, P), P]``, with ``P`` the candidate pairs, ``c`` their mean cells, ``n`` the rows,
        ``D`` = ``dependence``, ``s`` = :data:`SELECTION_SHARE`, ``o`` = :data:`ONEWAY_SHARE`;
        at least 1.

    Raises
    ------
    ValueError
        If ``rho`` is not > 0 or ``rows`` is negative.

    Notes
    -----
    With ``K`` measurements the plan (:meth:`MarginalsMechanism.plan`) gives each 2-way marginal
    noise of variance ``sigma^2 = K / (2 (1 - s) (1 - o) rho)`` per cell (whatever the rounds),
    whose expected L1 norm over a pair's ``c`` cells is ``sqrt(2 / pi) sigma c`` (AIM's bias
    correction). A measurement shows a pair's dependence ``D n`` (the L1 distance between its
    joint and the product of its margins, which is what the model gets wrong without it) only
    above that noise: ``sqrt(2 / pi) sigma(K) c <= D n`` gives the formula. Below ``d - 1`` (a
    spanning tree, MST's choice) every column would not even be linked to the others.
    """
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    if rows < 0:
        raise ValueError(f"rows must be >= 0 (0: not declared), got {rows!r}")
    sizes = [int(a) * int(b) for a, b in itertools.combinations(cells, 2)]
    pairs = [c for c in sizes if c <= max_cells]
    if not pairs:
        return 1
    n = rows or ASSUMED_ROWS
    scale = 2.0 * (1.0 - SELECTION_SHARE) * (1.0 - ONEWAY_SHARE) * rho
    if per_pair:  # the largest K with K pairs whose own cells pass the test at sigma(K)
        passes = sorted(
            (
                math.floor(scale * (dependence * n / (math.sqrt(2.0 / math.pi) * c)) ** 2)
                for c in pairs
            ),
            reverse=True,
        )
        k = max(min(i + 1, limit) for i, limit in enumerate(passes))
    else:
        mean_cells = float(np.mean(pairs))
        k = math.floor(scale * (dependence * n / (math.sqrt(2.0 / math.pi) * mean_cells)) ** 2)
    return max(1, min(len(pairs), max(min(len(cells) - 1, len(pairs)), k)))


def default_oneway_share(cells: Sequence[int], measurements: int) -> float:
    """The derived plan's 1-way share of rho: the one that minimises a model of the summed L1
    error of every 1- and 2-way marginal.

    Parameters
    ----------
    cells : sequence of int
        Cells per column (``d`` columns).
    measurements : int
        ``K``, the 2-way marginals measured.

    Returns
    -------
    float
        In ``[0.1, 0.9]``.

    Notes
    -----
    In units of ``sqrt(2 / pi) / sqrt(2 rho')`` (``rho'`` the measurements' budget), with ``o``
    the 1-way share, ``s`` = :data:`SELECTION_SHARE`, ``K``
    pairs of mean ``c2`` cells measured and columns of mean ``c1`` cells: a measured pair's L1
    error is its noise, ``c2 sqrt(K / ((1 - s)(1 - o)))``; an unmeasured pair's, besides the
    dependence it misses (independent of ``o``), is its two columns' 1-way errors carried
    through the product, ``||e_a||_1 + ||e_b||_1``, and each column's 1-way error (of its 1-way
    measurement, ``d / o`` per cell, pooled with the ``2 K / d`` measured pairs that hold it,
    ``c1 K / ((1 - s)(1 - o))`` per cell each) is ``c1 sqrt(d / (o + 2 (1 - s)(1 - o) / c1))``;
    a column counts in ``d - 2 K / d`` (at least 1) unmeasured pairs and its own 1-way cells.
    The share minimising ``K c2 sigma_2 + d (d - 2 K / d) c1 e_1`` over a grid of ``[0.1,
    0.9]`` (at least 0.1: the first selection scores against the 1-way measurements).
    """
    d = len(cells)
    c1 = float(np.mean(cells))
    c2 = float(np.mean([a * b for a, b in itertools.combinations(cells, 2)]))
    s = SELECTION_SHARE
    grid = np.linspace(0.1, 0.9, 81)
    pair_sigma = np.sqrt(measurements / ((1.0 - s) * (1.0 - grid)))
    oneway = c1 * np.sqrt(d / (grid + 2.0 * (1.0 - s) * (1.0 - grid) / c1))
    unmeasured = max(d - 2.0 * measurements / d, 1.0)
    cost = measurements * c2 * pair_sigma + d * unmeasured * oneway
    return float(grid[int(np.argmin(cost))])


def default_rounds(measurements: int) -> int:
    """Selection rounds by default: one per measurement (never below 1), each scored against
    the closed-form tree of the measurements before it (:class:`MarginalsMechanism` Notes)."""
    return max(1, int(measurements))


def marginals_map(
    domain: Domain,
    bins: int | Sequence[int],
    *,
    rounds: int = AUTO,
    measurements: int = AUTO,
    max_cells: int = DEFAULT_MAX_CELLS,
    cuts: Mapping[str, Sequence[float]] | None = None,
    rows: int = AUTO,
) -> MarginalsMap:
    """The discretisation a declaration asks for.

    Parameters
    ----------
    domain : Domain
        Public bounds; a discrete column gets one cell per level (cut at the midpoints between
        levels, so that a value clamped to its nearest level lands in that level's cell).
    bins : int or sequence of int
        Equal-width cells of each continuous column over ``[low, high]`` (one number, or one per
        column; ignored for discrete columns).
    rounds, measurements, max_cells, rows : int
        :class:`MarginalsMap`'s selection settings (0: derived).
    cuts : mapping of column name to increasing numbers, optional
        Explicit interior cut points of continuous columns (e.g. a log scale for wages),
        replacing their ``bins``.

    Returns
    -------
    MarginalsMap

    Raises
    ------
    ValueError
        For a wrong number of ``bins``, a ``cuts`` entry naming no continuous column, or cut
        points the map refuses.
    """
    d = domain.n_attributes
    per_column = [int(bins)] * d if isinstance(bins, int | np.integer) else [int(b) for b in bins]
    if len(per_column) != d:
        raise ValueError(f"bins must be one number or one per column ({d}), got {len(per_column)}")
    explicit = dict(cuts or {})
    names = [domain.attribute_name(j) for j in range(d)]
    continuous = {n for j, n in enumerate(names) if domain.level_values(j) is None}
    unknown = sorted(set(explicit) - continuous)
    if unknown:
        raise ValueError(f"cuts name no continuous column: {unknown}")
    all_cuts: list[NDArray[np.float64]] = []
    cells = []
    for j in range(d):
        levels = domain.level_values(j)
        if levels is not None:
            col = (levels[1:] + levels[:-1]) / 2.0
        elif names[j] in explicit:
            col = np.asarray(explicit[names[j]], dtype=np.float64)
        else:
            b = check_positive_int(per_column[j], "bins")
            col = domain.low[j] + (domain.high[j] - domain.low[j]) * np.arange(1, b) / b
        all_cuts.append(col)
        cells.append(col.size + 1)
    return MarginalsMap(
        domain.low,
        domain.high,
        np.concatenate(all_cuts) if all_cuts else np.zeros(0),
        np.array(cells, dtype=np.int64),
        rounds=rounds,
        measurements=measurements,
        max_cells=max_cells,
        rows=rows,
    )


def cell_weights(
    fmap: MarginalsMap, domain: Domain, column: int, low: float, high: float
) -> NDArray[np.float64]:
    """How much of each cell of ``column`` the predicate ``low <= x <= high`` covers.

    A discrete column's cell holds one level: weight 1 if the level satisfies the predicate, else
    0 (exact). A continuous column's cell ``[e_k, e_{k+1})`` gets the covered fraction of its
    width, i.e. the records are taken as uniform within a cell (exact when the predicate's ends
    are cut points); an integer column's (:attr:`Domain.integers`), the covered fraction of the
    whole numbers within it (exact when a cell holds one: ``screen >= 17`` and the cell
    ``[16.5, 17.625)``).

    Returns
    -------
    ndarray of shape (cells[column],), float64, entries in [0, 1].
    """
    levels = domain.level_values(column)
    if levels is not None:
        return ((levels >= low) & (levels <= high)).astype(np.float64)
    e = fmap.edges(column)
    if domain.is_integer(column):
        return _integer_shares(e, low, high)[0]
    lo = np.clip(low, e[:-1], e[1:])
    hi = np.clip(high, e[:-1], e[1:])
    return np.clip((hi - lo) / (e[1:] - e[:-1]), 0.0, 1.0)


def bound_weights(
    fmap: MarginalsMap, domain: Domain, column: int, low: float, high: float
) -> NDArray[np.float64]:
    """Which cells of ``column`` the predicate ``low <= x <= high`` holds whole (1), in part
    (0.5) or not at all (0), whatever the values inside a cell: the weights bounds need
    (:func:`dpmarket.common.sketches.marginals_bounds.count_bounds` reads only whether a weight
    is 0, 1 or between).

    A continuous column's cell ``[e_k, e_{k+1})`` (the last one closed) holds values from
    ``e_k`` on: a predicate that ends at ``e_k`` (``x <= 3`` and the cell ``[3, 10)``, holding
    the records at exactly 3, as an integer-valued column does) holds part of it, where
    :func:`cell_weights`' uniform share gives 0. A discrete column's cells are exact
    (:func:`cell_weights`); an integer column's (:attr:`Domain.integers`) cell is held whole,
    in part or not at all as the whole numbers within it are.

    Returns
    -------
    ndarray of shape (cells[column],), float64, entries in {0, 0.5, 1}.
    """
    if domain.level_values(column) is not None:
        return cell_weights(fmap, domain, column, low, high)
    e = fmap.edges(column)
    if domain.is_integer(column):
        share, empty = _integer_shares(e, low, high)
        # A cell with no whole number holds no record: any weight bounds it; 0 keeps it out.
        return np.where(empty, 0.0, np.where(share >= 1.0, 1.0, np.where(share > 0, 0.5, 0.0)))
    left, right = e[:-1], e[1:]
    last = np.arange(left.size) == left.size - 1
    reach = (high >= left) & ((low < right) | (last & (low <= right)))
    whole = (low <= left) & (high >= right)
    return np.where(whole, 1.0, np.where(reach, 0.5, 0.0))


def public_share(
    fmap: MarginalsMap, domain: Domain, column: int, weights: NDArray[np.float64]
) -> float | None:
    """The share of the records a predicate on ``column`` holds when the public domain fixes
    it: 0 when it reaches no cell (every bound weight 0), 1 when it holds every cell a record
    can lie in (the weights of ``-inf <= x <= inf``), None otherwise.

    Parameters
    ----------
    fmap : MarginalsMap
    domain : Domain
        The spec's domain (levels and integer columns).
    column : int
    weights : ndarray of shape (cells[column],)
        The predicate's :func:`bound_weights`.

    Returns
    -------
    float or None
        0.0, 1.0 or None.

    Notes
    -----
    Every record of a release lies in the domain (an owner clamps it there before the release),
    so such a predicate's share is a public fact, exact, with no noise: ``price <= 400000``
    over a column declared ``[0, 300000]`` holds every record, ``price <= -1`` none. It is the
    marginals form of the histogram's rule that a bound the same on every bin is read exactly
    (``dpmarket.consumer.intervals``): a conjunction whose lower bound holds every cell of each
    column is 1, one whose upper bound holds no cell of some column is 0.
    """
    w = np.asarray(weights, dtype=np.float64)
    if not (w > 0.0).any():
        return 0.0
    if np.array_equal(w, bound_weights(fmap, domain, column, -math.inf, math.inf)):
        return 1.0
    return None


def _integer_shares(
    edges: NDArray[np.float64], low: float, high: float
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Per cell ``[e_k, e_{k+1})`` (the last one closed): the fraction of its whole numbers that
    ``low <= x <= high`` holds (0 for a cell with none), and whether it holds none."""
    left, right = edges[:-1], edges[1:]
    first = np.ceil(left)
    last = np.ceil(right) - 1.0
    last[-1] = np.floor(right[-1])
    size = np.maximum(last - first + 1.0, 0.0)
    lo = np.maximum(first, math.ceil(low) if math.isfinite(low) else -np.inf)
    hi = np.minimum(last, math.floor(high) if math.isfinite(high) else np.inf)
    held = np.maximum(hi - lo + 1.0, 0.0)
    empty = size == 0
    return np.where(empty, 0.0, held / np.where(empty, 1.0, size)), empty


# ------------------------------------------------------------------------------------ release
@dataclass(frozen=True, eq=False)
class Measurement:
    """One noisy marginal.

    Attributes
    ----------
    clique : tuple of int
        Column indices, strictly increasing.
    values : ndarray of shape (prod(cells[clique]),), float64
        Counts of the clique's cells (C order over the clique's columns) plus
        ``N(0, sigma^2)`` noise each.
    sigma : float
        The noise's standard deviation, > 0.
    """

    clique: tuple[int, ...]
    values: NDArray[np.float64]
    sigma: float

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float64).reshape(-1)
        values.setflags(write=False)
        object.__setattr__(self, "clique", tuple(int(c) for c in self.clique))
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "sigma", float(self.sigma))


@dataclass(frozen=True)
class RoundPlan:
    """The public budget of one selection round.

    Attributes
    ----------
    selections : int
        2-way marginals selected (one exponential mechanism each).
    epsilon : float
        Each selection's exponential-mechanism epsilon (scores of sensitivity 1); 0 when the
        round selects nothing but measures every candidate, in order.
    sigma : float
        Each selected marginal's noise standard deviation.
    """

    selections: int
    epsilon: float
    sigma: float


@dataclass(frozen=True, eq=False)
class MarginalsMechanism:
    """The public side of a marginals sketch and the owner's release.

    Parameters
    ----------
    feature_map : MarginalsMap
        The discretisation and selection settings.
    domain : Domain
        The public domain (its box must be the map's).
    epsilon : float
        ``> 0``: the release is ``(epsilon, delta)``-DP.
    delta : float
        ``0 < delta < 1``.
    oneway_share : float, optional
        The share of ``rho`` the 1-way marginals get, in ``(0, 1)``; 0 (:data:`AUTO`, the
        default): the derived plan's
        (:func:`default_oneway_share`) when the map states no rounds, :data:`ONEWAY_SHARE`
        otherwise. Public (every receiver derives the same default); an explicit value is for
        experiments.
    weight_by_cells : bool, optional
        Whether a plan that measures every pair (:attr:`measures_every_pair`) weights each
        pair's noise by its cells (:meth:`pair_sigmas`); default: the derived plan does.

    Attributes
    ----------
    mechanism : str
        ``"gaussian"`` (what ledgers and catalogues record as the noise).
    rho : float
        The zCDP budget, ``zcdp_rho(epsilon, delta)``.

    Raises
    ------
    ValueError
        For a map that is not a :class:`MarginalsMap`, a domain whose box differs from the map's,
        or epsilon / delta out of range.

    Notes
    -----
    Neighbouring tables differ by adding or removing one record (unbounded DP, as every sketch
    here). A record lies in exactly one cell of any marginal, so a marginal's count vector
    changes by one unit vector: L2 (and L1) sensitivity 1.

    *Measurements.* ``N(0, sigma^2)`` noise on each cell of a marginal is
    ``1 / (2 sigma^2)``-zCDP (:func:`dpmarket.common.privacy.accounting.gaussian_zcdp_rho`).

    *Selections.* A candidate 2-way marginal ``c`` is scored ``q_c = ||M_c(D) - M_c(model)||_1 -
    sqrt(2/pi) sigma n_c`` (AIM's bias-corrected error: the model is fitted to earlier releases
    only, and ``sqrt(2/pi) sigma n_c`` is the expected L1 norm of the noise the measurement would
    add over its ``n_c`` cells). Adding or removing a record changes ``M_c(D)`` by a unit vector and
    nothing else, so ``q_c`` changes by at most 1: sensitivity 1. The exponential mechanism picks
    ``c`` with probability proportional to ``exp(epsilon q_c / 2)``, ``epsilon^2 / 8``-zCDP
    (:func:`dpmarket.common.privacy.accounting.exponential_zcdp_rho`); ``k`` selections of a round
    are drawn at once as the top ``k`` of ``epsilon q_c / 2 + Gumbel(0, 1)``, which has the
    distribution of ``k`` exponential mechanisms run one after another without replacement (Durfee &
    Rogers 2019), hence costs ``k epsilon^2 / 8``. A candidate that would grow the model past
    :data:`MAX_MODEL_MB` with the round's earlier picks is passed over: the next pick is then the
    exponential mechanism over the candidates still allowed (a set fixed by the earlier, public,
    picks; the Gumbel argmax of a subset does not depend on the others' keys), and a round that
    runs out of candidates spends less than its plan.

    *Budget* (:meth:`plan`). ``rho_1 = o rho`` (``o`` = ``oneway_share``, default
    :data:`ONEWAY_SHARE`, 0.2) measures all ``d`` 1-way marginals at ``sigma_1 = sqrt(d / (2
    rho_1))``; each of the ``T`` rounds (:attr:`rounds`) gets ``rho_r = (1 - o) rho / T``, ``0.1
    rho_r`` for its ``k = ceil(K / T)`` selections (``K`` = :attr:`measurements`: the map's, or
    derived from the domain, ``rho`` and the declared rows) (``epsilon_r = sqrt(0.8 rho_r / k)``)
    and ``0.9 rho_r`` for their measurements (``sigma_r = sqrt(k / (1.8 rho_r))``). A round with
    fewer candidates than ``k`` spends its unused selection budget on its measurements. The
    derived plan (rounds not stated) runs ``T = K`` rounds of one selection each — the same
    ``sigma`` and the same total selection budget as one round of ``K`` (``K epsilon_r^2 / 8 =
    0.1 (1 - o) rho`` either way) — unless ``K`` reaches every candidate pair
    (:attr:`measures_every_pair`): then which pairs are measured is public, nothing is
    selected, and one round measures the candidates that keep the model within
    :data:`EVERY_PAIR_MAX_MODEL_MB` (:meth:`every_pair_plan`, decided from the declared cells
    alone) at ``sigma = sqrt(P / (2 (1 - o) rho))`` for those ``P`` pairs: ``P`` Gaussian
    mechanisms, ``(1 - o) rho`` in all. zCDP composes
    adaptively by adding ``rho``, so the release is ``rho``-zCDP, hence ``(epsilon,
    delta)``-DP (:func:`dpmarket.common.privacy.accounting.zcdp_rho` returns a ``rho`` whose
    tight conversion gives at most ``delta`` at ``epsilon``). The ledger records that
    ``(epsilon, delta)`` (:meth:`privacy_events`).

    *Models scored against.* The first round scores against the 1-way measurements' own model
    (every column independent: closed form, no fit). In the derived plan each later round scores
    the pairs not yet measured against the closed-form Chow–Liu tree of everything measured so
    far (:class:`~dpmarket.common.sketches.marginals_tree.ChowLiuTree`: no fit, microseconds per
    candidate; a measured pair is not a candidate again); with ``rounds`` stated, against a
    graphical model fitted to everything measured so far (AIM's; each fit costs a jax
    compilation). The scoring model is computed from earlier releases only (post-processing), so
    every score keeps sensitivity 1. No model is fitted after the last round (the owner needs
    none).

    References
    ----------
    McKenna et al., AIM (VLDB 2022), Algorithm 1 and Section 4; module docstring.
    """

    feature_map: MarginalsMap
    domain: Domain
    epsilon: float
    delta: float
    oneway_share: float = AUTO
    weight_by_cells: bool | None = None
    mechanism: str = field(default="gaussian", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.feature_map, MarginalsMap):
            raise ValueError(
                f"feature_map must be a MarginalsMap, got {type(self.feature_map).__name__}"
            )
        if not isinstance(self.domain, Domain):
            raise ValueError(f"domain must be a Domain, got {type(self.domain).__name__}")
        if not (
            np.array_equal(self.domain.low, self.feature_map.low)
            and np.array_equal(self.domain.high, self.feature_map.high)
        ):
            raise ValueError("the marginals map's box must be the domain's")
        eps, dl = float(self.epsilon), float(self.delta)
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (math.isfinite(dl) and 0.0 < dl < 1.0):
            raise ValueError(f"the marginals sketch needs 0 < delta < 1, got {self.delta!r}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dl)
        if self.oneway_share == AUTO:
            cells = [int(c) for c in self.feature_map.cells]
            derived = self.tree_scored and DERIVED_ONEWAY_SHARE
            share = default_oneway_share(cells, self.measurements) if derived else ONEWAY_SHARE
        else:
            share = float(self.oneway_share)
        if not 0.0 < share < 1.0:
            raise ValueError(f"oneway_share must lie in (0, 1), got {self.oneway_share!r}")
        object.__setattr__(self, "oneway_share", share)
        if self.weight_by_cells is None:
            object.__setattr__(self, "weight_by_cells", self.tree_scored and DERIVED_CELL_WEIGHTS)

    @property
    def private(self) -> bool:
        """Always ``True``."""
        return True

    @property
    def rho(self) -> float:
        """The zCDP budget of the release."""
        return zcdp_rho(self.epsilon, self.delta)

    @property
    def measurements(self) -> int:
        """2-way marginals selected over all rounds: the map's, or
        :func:`default_measurements` of the domain's cells, :attr:`rho` and the map's rows."""
        fmap = self.feature_map
        if fmap.measurements != AUTO:
            return fmap.measurements
        return default_measurements(
            [int(c) for c in fmap.cells], self.rho, fmap.rows, fmap.max_cells
        )

    @property
    def rounds(self) -> int:
        """Selection rounds: the map's, or :func:`default_rounds` of :attr:`measurements`."""
        fmap = self.feature_map
        if fmap.rounds != AUTO:
            return fmap.rounds
        return 1 if self.measures_every_pair else default_rounds(self.measurements)

    @property
    def tree_scored(self) -> bool:
        """Whether each round scores against the closed-form tree of what is measured so far
        (:class:`~dpmarket.common.sketches.marginals_tree.ChowLiuTree`, the derived plan:
        rounds not stated) rather than a fitted graphical model (rounds stated)."""
        return self.feature_map.rounds == AUTO

    @property
    def oneway_sigma(self) -> float:
        """Noise standard deviation of the 1-way marginals."""
        d = self.domain.n_attributes
        return math.sqrt(d / (2.0 * self.oneway_share * self.rho))

    @property
    def measures_every_pair(self) -> bool:
        """Whether the derived plan's ``K`` reaches every candidate pair (then nothing is
        selected, and the pairs measured are :meth:`every_pair_plan`'s: class Notes,
        "Budget")."""
        return self.tree_scored and self.measurements >= len(self.candidates())

    def pair_sigmas(self) -> dict[tuple[int, int], float]:
        """Each measured pair's noise when the derived plan measures every pair
        (:attr:`measures_every_pair`; the pairs of :meth:`every_pair_plan`): the plan's one
        sigma, or with ``weight_by_cells`` ``sigma_ab = lambda c_ab^(-1/3)`` with ``sum 1 / (2
        sigma_ab^2) = (1 - o) rho`` over those pairs (class Notes, "Budget").

        Raises
        ------
        ValueError
            Unless the plan measures every pair.
        """
        if not self.measures_every_pair:
            raise ValueError("only a plan that measures every pair fixes each pair's noise")
        pairs = self.every_pair_plan()
        cells = self.feature_map.cells
        if not self.weight_by_cells:
            sigma = self.plan()[0].sigma
            return dict.fromkeys(pairs, sigma)
        size = {c: float(cells[c[0]] * cells[c[1]]) for c in pairs}
        rho_m = (1.0 - self.oneway_share) * self.rho
        scale = math.sqrt(sum(v ** (2.0 / 3.0) for v in size.values()) / (2.0 * rho_m))
        return {c: scale * size[c] ** (-1.0 / 3.0) for c in pairs}

    def plan(self) -> tuple[RoundPlan, ...]:
        """Every round's public budget (class Notes, "Budget"), before any data is read."""
        if self.measures_every_pair:
            pairs = len(self.every_pair_plan())
            rho_m = (1.0 - self.oneway_share) * self.rho
            return (RoundPlan(pairs, 0.0, math.sqrt(pairs / (2.0 * rho_m))),)
        rounds = self.rounds
        rho_r = (1.0 - self.oneway_share) * self.rho / rounds
        k = math.ceil(self.measurements / rounds)
        eps = math.sqrt(8.0 * SELECTION_SHARE * rho_r / k)
        sigma = math.sqrt(k / (2.0 * (1.0 - SELECTION_SHARE) * rho_r))
        return tuple(RoundPlan(k, eps, sigma) for _ in range(rounds))

    def every_pair_plan(self) -> list[tuple[int, int]]:
        """The pairs a plan that measures every pair (:attr:`measures_every_pair`) measures, in
        column order: the candidates taken fewest cells first (ties in column order), each kept
        if the junction tree of the 1-way marginals, the pairs kept so far and it stays within
        :data:`EVERY_PAIR_MAX_MODEL_MB` (:func:`model_size_mb`). Public: the declared cells
        decide it, no data; every receiver derives the same list.

        Raises
        ------
        ValueError
            Unless the plan measures every pair.
        """
        if not self.measures_every_pair:
            raise ValueError("only a plan that measures every pair measures a public set of pairs")
        return list(self._every_pair_plan)

    @functools.cached_property
    def _every_pair_plan(self) -> tuple[tuple[int, int], ...]:
        fmap, cells = self.feature_map, self.feature_map.cells
        pairs = self.candidates()
        held: list[tuple[int, ...]] = [(j,) for j in range(self.domain.n_attributes)]
        for c in sorted(pairs, key=lambda c: int(cells[c[0]]) * int(cells[c[1]])):
            if model_size_mb(fmap, [*held, c]) <= EVERY_PAIR_MAX_MODEL_MB:
                held.append(c)
        kept = set(held)
        return tuple(c for c in pairs if c in kept)

    def candidates(self) -> list[tuple[int, int]]:
        """The 2-way marginals a round may select: every pair of columns with at most
        ``max_cells`` cells (before the model-size limit, which depends on earlier
        selections)."""
        cells = self.feature_map.cells
        d = self.domain.n_attributes
        return [
            (a, b)
            for a, b in itertools.combinations(range(d), 2)
            if int(cells[a]) * int(cells[b]) <= self.feature_map.max_cells
        ]

    def privacy_events(self) -> list[PrivacyEvent]:
        """What the release costs: one ``(epsilon, delta)`` event (the ``rho``-zCDP release,
        converted; class Notes)."""
        return [PrivacyEvent("approximate", self.epsilon, delta=self.delta)]

    def release(
        self,
        x: ArrayLike,
        noise: NoiseSource | None = None,
        *,
        rng: np.random.Generator,
    ) -> MarginalsSketch:
        """Measure, select and measure again (class Notes): the owner's release.

        Parameters
        ----------
        x : array-like of shape (n, d)
            The owner's records, inside the domain (projected onto it first:
            :meth:`dpmarket.common.sketches.domain.Domain.clamp`).
        noise : NoiseSource, optional
            The Gaussian noise of the measurements (OpenDP's in production); default
            ``SeededNoise(rng)``.
        rng : numpy.random.Generator
            The selections' Gumbel draws (CSPRNG-seeded in production,
            :func:`dpmarket.common.privacy.rng.production_rng`).

        Returns
        -------
        MarginalsSketch

        Raises
        ------
        ValueError
            If ``x`` is not (n, d) inside the domain (naming row and column, not the value).
        """
        source = noise if noise is not None else SeededNoise(rng)
        fmap = self.feature_map
        cells = fmap.cell_indices(self.domain.check(x, "x"))
        shape = tuple(int(c) for c in fmap.cells)

        def exact(clique: tuple[int, ...]) -> NDArray[np.float64]:
            sizes = [shape[j] for j in clique]
            flat = np.ravel_multi_index(tuple(cells[:, j] for j in clique), sizes)
            return np.bincount(flat, minlength=math.prod(sizes)).astype(np.float64)

        def measure(clique: tuple[int, ...], sigma: float) -> Measurement:
            true = exact(clique)
            return Measurement(clique, true + source.gaussian(sigma, true.size), sigma)

        sigma1 = self.oneway_sigma
        measurements = [measure((j,), sigma1) for j in range(self.domain.n_attributes)]
        selections: list[float] = []
        independent = _IndependentModel(fmap, measurements)
        model: MarginalsModel | _IndependentModel | ChowLiuTree = independent
        pairs = self.candidates()
        plans = self.plan()
        tree = self.tree_scored
        for r, plan in enumerate(plans):
            held = [m.clique for m in measurements]
            if self.measures_every_pair:  # public: within EVERY_PAIR_MAX_MODEL_MB
                allowed = self.every_pair_plan()
            elif tree:  # a measured pair is not a candidate again
                allowed = [
                    c
                    for c in pairs
                    if c not in held and model_size_mb(fmap, [*held, c]) <= MAX_MODEL_MB
                ]
            else:
                allowed = [
                    c
                    for c in pairs
                    if model.covers(c) or model.grown_size_mb(c) <= MAX_MODEL_MB  # type: ignore[union-attr]
                ]
            for clique, sigma, eps in _select(plan, allowed, held, fmap, model, exact, rng):
                if eps == 0.0 and bool(self.weight_by_cells):
                    sigma = self.pair_sigmas()[clique]
                measurements.append(measure(clique, sigma))
                if eps > 0:
                    selections.append(eps)
            if r + 1 == len(plans):
                continue  # no model after the last round: the owner needs none
            if tree:  # the next round scores against the closed-form tree of everything so far
                two = {m.clique: m.values for m in measurements if len(m.clique) == 2}
                model = ChowLiuTree(independent.shares, independent.total, two)
            else:  # ... or against a graphical model fitted to it
                warm = model if isinstance(model, MarginalsModel) else None
                model = MarginalsModel.fit(fmap, measurements, iters=SELECTION_ITERS, warm=warm)
        free_compiled()  # the selection's structures are not used again
        return MarginalsSketch(self, tuple(measurements), tuple(selections))

    def describe(self) -> dict[str, Any]:
        """Every public value as plain JSON-able data."""
        return {
            "feature_map": self.feature_map.describe(),
            "domain": self.domain.describe(),
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho": self.rho,
            "oneway_sigma": self.oneway_sigma,
            "measurements": self.measurements,
            "rounds": self.rounds,
            "plan": [vars(p) for p in self.plan()],
        }


class CarriedFit(Protocol):
    """What a sketch needs of the fit its owner published with it: that it can check it belongs
    to the sketch's release. Implemented by
    :class:`dpmarket.common.sketches.marginals_fit.MarginalsFit` (typed here as a protocol: that
    module builds on this one)."""

    def check_release(self, sketch: MarginalsSketch) -> None:
        """Raise ``ValueError`` unless this fit is of ``sketch``'s release."""


@dataclass(frozen=True, eq=False)
class MarginalsSketch:
    """A released marginals sketch.

    Attributes
    ----------
    mechanism : MarginalsMechanism
        Every public parameter.
    measurements : tuple of Measurement
        The 1-way marginals of every column, in column order, then the selected 2-way ones.
    selections : tuple of float
        The epsilon of every selection made (one exponential mechanism each), in order.
    fit : MarginalsFit or None
        The graphical model and bootstrap its owner fitted to the measurements when it published
        them (:mod:`dpmarket.common.sketches.marginals_fit`): post-processing carried beside the
        release, not part of it (no privacy cost; not in :attr:`digest`).

    Raises
    ------
    ValueError
        From :meth:`validate`, at construction.

    Notes
    -----
    Which marginals were selected is part of the release (it is data-dependent, and paid for
    by the selections' budget). Everything computed from the sketch is post-processing.
    """

    mechanism: MarginalsMechanism
    measurements: tuple[Measurement, ...]
    selections: tuple[float, ...] = ()
    fit: CarriedFit | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "measurements", tuple(self.measurements))
        object.__setattr__(self, "selections", tuple(float(e) for e in self.selections))
        self.validate()

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the release's content: every measurement's clique, noise scale and
        noisy values, in order (not the selections' epsilons, nor :attr:`fit`). Two sketches
        with the same digest give the same fitted model."""
        h = hashlib.sha256()
        for m in self.measurements:
            values = np.ascontiguousarray(m.values, dtype="<f8")
            h.update(np.asarray(m.clique, dtype="<i8").tobytes())
            h.update(np.float64(m.sigma).astype("<f8").tobytes())
            h.update(np.int64(values.size).astype("<i8").tobytes())
            h.update(values.tobytes())
        return h.hexdigest()

    def with_fit(self, fit: CarriedFit | None) -> MarginalsSketch:
        """The same release carrying ``fit`` (its owner's fitted model and bootstrap:
        :mod:`dpmarket.common.sketches.marginals_fit`), validated."""
        return MarginalsSketch(self.mechanism, self.measurements, self.selections, fit)

    @property
    def feature_map(self) -> MarginalsMap:
        """The public discretisation."""
        return self.mechanism.feature_map

    @property
    def domain(self) -> Domain:
        """The public domain."""
        return self.mechanism.domain

    @property
    def rho_spent(self) -> float:
        """``sum 1 / (2 sigma_i^2) + sum epsilon_j^2 / 8`` over the measurements and the
        selections."""
        return math.fsum(
            [gaussian_zcdp_rho(m.sigma) for m in self.measurements]
            + [exponential_zcdp_rho(e) for e in self.selections]
        )

    def validate(self) -> None:
        """Check the release against its public parameters (what a receiver runs).

        Checks every clique (increasing column indices in range, 1 or 2 columns, a 2-way one
        among the candidates), every value vector's length and finiteness, every scale, that
        the 1-way marginals of all columns come first, and that the measurements and
        selections add up to at most the mechanism's ``rho``; and that a :attr:`fit` is of this
        release (:meth:`~dpmarket.common.sketches.marginals_fit.MarginalsFit.check_release`).

        Raises
        ------
        ValueError
            Naming the first inconsistency.
        """
        mech = self.mechanism
        if not isinstance(mech, MarginalsMechanism):
            raise ValueError(f"mechanism must be a MarginalsMechanism, got {type(mech).__name__}")
        d = mech.domain.n_attributes
        cells = mech.feature_map.cells
        allowed = set(mech.candidates())
        if len(self.measurements) < d:
            raise ValueError(f"a marginals sketch measures every column: {d} 1-way marginals")
        for i, m in enumerate(self.measurements):
            if not isinstance(m, Measurement):
                raise ValueError(f"measurement {i} must be a Measurement")
            if i < d and m.clique != (i,):
                raise ValueError(f"measurement {i} must be column {i}'s 1-way marginal")
            if i >= d and m.clique not in allowed:
                raise ValueError(
                    f"measurement {i}: clique {list(m.clique)} is not a candidate 2-way marginal"
                )
            size = math.prod(int(cells[j]) for j in m.clique)
            if m.values.shape != (size,):
                raise ValueError(
                    f"measurement {i} of clique {list(m.clique)} must hold {size} values, got "
                    f"{m.values.shape[0]}"
                )
            if not np.isfinite(m.values).all():
                raise ValueError(f"measurement {i} holds NaN or inf values")
            if not (math.isfinite(m.sigma) and m.sigma > 0):
                raise ValueError(f"measurement {i}: sigma must be finite and > 0, got {m.sigma}")
        if any(not (math.isfinite(e) and e > 0) for e in self.selections):
            raise ValueError(f"selection epsilons must be finite and > 0, got {self.selections}")
        spent, budget = self.rho_spent, mech.rho
        if spent > budget * (1.0 + _RHO_RTOL):
            raise ValueError(
                f"the sketch spends rho = {spent:.6g}, more than its (epsilon, delta) = "
                f"({mech.epsilon:g}, {mech.delta:g}) allows, rho = {budget:.6g}"
            )
        if self.fit is not None:
            self.fit.check_release(self)

    @property
    def count_estimate(self) -> float:
        """The inverse-variance weighted mean of the 1-way marginals' totals, at least 1."""
        totals = np.array([m.values.sum() for m in self.measurements if len(m.clique) == 1])
        variances = np.array(
            [m.sigma**2 * m.values.size for m in self.measurements if len(m.clique) == 1]
        )
        return max(1.0, float(np.sum(totals / variances) / np.sum(1.0 / variances)))

    @property
    def noisy_count(self) -> float:
        """:attr:`count_estimate` (what catalogue listings show as the noisy count)."""
        return self.count_estimate


def _select(
    plan: RoundPlan,
    allowed: Sequence[tuple[int, int]],
    held: list[tuple[int, ...]],
    fmap: MarginalsMap,
    model: Any,
    exact: Callable[[tuple[int, ...]], NDArray[np.float64]],
    rng: np.random.Generator,
) -> list[tuple[tuple[int, int], float, float]]:
    """One round's selections (:class:`MarginalsMechanism` Notes, "Selections"): the top
    ``plan.selections`` of the Gumbel-perturbed scores of ``allowed`` against ``model``, passing
    over a pick that would outgrow :data:`MAX_MODEL_MB` with ``held`` (extended in place).

    Returns
    -------
    list of (clique, sigma, epsilon)
        Each pick, the noise it is to be measured with (the plan's, or more budget when fewer
        than the plan's candidates remain) and its selection's epsilon.
    """
    if not allowed:
        return []
    out: list[tuple[tuple[int, int], float, float]] = []
    if plan.epsilon == 0.0:  # nothing to select: every candidate, in order
        for candidate in allowed:
            if model_size_mb(fmap, [*held, candidate]) <= MAX_MODEL_MB:
                held.append(candidate)
                out.append((candidate, plan.sigma, 0.0))
        return out
    shape = [int(c) for c in fmap.cells]
    k = min(plan.selections, len(allowed))
    sigma = plan.sigma
    if k < plan.selections:  # the unused selection budget goes to the measurements
        rho_r = plan.selections * (exponential_zcdp_rho(plan.epsilon) + gaussian_zcdp_rho(sigma))
        sigma = math.sqrt(k / (2.0 * (rho_r - k * exponential_zcdp_rho(plan.epsilon))))
    scores = np.array(
        [
            np.abs(exact(c) - model.marginal(c).reshape(-1)).sum()
            - math.sqrt(2.0 / math.pi) * sigma * shape[c[0]] * shape[c[1]]
            for c in allowed
        ]
    )
    keys = plan.epsilon * scores / 2.0 + rng.gumbel(size=scores.size)
    for i in np.argsort(-keys, kind="stable"):
        if len(out) == k:
            break
        candidate = allowed[int(i)]
        if model_size_mb(fmap, [*held, candidate]) > MAX_MODEL_MB:
            continue  # with this round's earlier picks, it would outgrow the model
        held.append(candidate)
        out.append((candidate, sigma, plan.epsilon))
    return out


# ------------------------------------------------------------------------------------ model
class _IndependentModel:
    """What the 1-way measurements alone say: every column independent, each 1-way marginal
    its measurement clipped at 0 and scaled to their inverse-variance weighted total (the
    graphical model of the 1-way marginals, in closed form: the first round scores against it
    without a fit)."""

    def __init__(self, feature_map: MarginalsMap, measurements: Sequence[Measurement]) -> None:
        d = feature_map.n_attributes
        ones = measurements[:d]
        totals = np.array([m.values.sum() for m in ones])
        weights = np.array([1.0 / (m.sigma**2 * m.values.size) for m in ones])
        self.total = max(1.0, float(np.sum(totals * weights) / np.sum(weights)))
        self.shares = []
        for m in ones:
            kept = np.clip(m.values, 0.0, None)
            mass = float(kept.sum())
            self.shares.append(kept / mass if mass > 0 else np.full(kept.size, 1.0 / kept.size))
        self.feature_map = feature_map

    def marginal(self, clique: Sequence[int]) -> NDArray[np.float64]:
        out = np.ones(())
        for j in clique:
            out = np.multiply.outer(out, self.shares[int(j)])
        return np.asarray(out * self.total, dtype=np.float64)

    def covers(self, clique: Sequence[int]) -> bool:
        return len(clique) <= 1

    def grown_size_mb(self, clique: Sequence[int]) -> float:
        d = self.feature_map.n_attributes
        return model_size_mb(self.feature_map, [*((j,) for j in range(d)), tuple(clique)])


class MarginalsModel:
    """A graphical model fitted to noisy marginals (Private-PGM), answering in numpy.

    Build it with :meth:`fit`. The estimation is ``mbi``'s mirror descent on the measurements'
    squared error, weighted by their noise (McKenna et al. 2019, Algorithm 1). The library's
    junction-tree message passing then calibrates it once: its beliefs on the maximal cliques
    are read into numpy, and every marginal is a sum of one belief or one ``numpy.einsum`` over
    the smallest subtree holding its columns (:meth:`marginal`), without per-query compilation
    and at a cost that depends on that subtree, not on the whole model.

    Attributes
    ----------
    feature_map : MarginalsMap
    measurements : tuple of Measurement
    total : float
        The model's record count (``mbi``'s minimum-variance estimate from the 1-way
        marginals).
    """

    #: The ``potentials``, ``marginals`` and ``total`` of :meth:`state` that
    #: :attr:`mbi_model` is built from when first read (None once built, or without).
    _mbi_parts: Mapping[str, Any] | None
    _mbi_model: Any

    def __init__(
        self,
        feature_map: MarginalsMap,
        measurements: Sequence[Measurement],
        model: mbi.MarkovRandomField,
        *,
        beliefs: Sequence[tuple[Sequence[str], Sequence[str], ArrayLike]] | None = None,
    ) -> None:
        lib = _mbi()
        # The junction tree of the model's cliques and its calibrated beliefs (counts on every
        # maximal clique, summing to the total): one message-passing pass of the library's
        # oracle, in log space (compiled once per model structure, shared by the bootstrap);
        # or the beliefs :meth:`state` kept.
        tree, _ = lib.junction_tree.make_junction_tree(model.domain, model.cliques)
        nodes = lib.junction_tree.maximal_cliques(tree)
        if beliefs is None:
            passed = lib.marginal_oracles.message_passing_shafer_shenoy(
                model.potentials.expand(nodes), float(model.total)
            )
            beliefs = [
                (node, passed[tuple(node)].domain.attributes, passed[tuple(node)].values)
                for node in nodes
            ]
        self._setup(feature_map, measurements, float(model.total), tree, beliefs)
        self.mbi_model = model

    @property
    def mbi_model(self) -> Any:
        """``mbi``'s model (an ``mbi.MarkovRandomField``); None for a model built
        :meth:`from_beliefs`. A model rebuilt :meth:`from_state` builds it when first read
        (importing ``mbi`` and jax then): its answers need only its beliefs."""
        if self._mbi_model is None and self._mbi_parts is not None:
            self._mbi_model = _mbi_model_of(self.feature_map, self._mbi_parts)
            self._mbi_parts = None
        return self._mbi_model

    @mbi_model.setter
    def mbi_model(self, model: Any) -> None:
        self._mbi_model = model
        self._mbi_parts = None

    def _setup(
        self,
        feature_map: MarginalsMap,
        measurements: Sequence[Measurement],
        total: float,
        tree: Any,
        beliefs: Sequence[tuple[Sequence[str], Sequence[str], ArrayLike]],
    ) -> None:
        """Hold the calibrated junction tree ``tree`` (a networkx graph on tuples of attribute
        names) and its ``beliefs`` (per node: the node, its table's axes, the table)."""
        self.feature_map = feature_map
        self.measurements = tuple(measurements)
        self.total = float(total)
        d = feature_map.n_attributes
        self._letters = {str(j): _einsum_letter(j) for j in range(d)}
        self._tree = tree
        # Per tree node, its belief and the belief's axes (its own order of the node's variables).
        self._beliefs: dict[tuple[str, ...], NDArray[np.float64]] = {}
        self._axes: dict[tuple[str, ...], str] = {}
        for node, attributes, values in beliefs:
            self._beliefs[tuple(node)] = np.asarray(values, dtype=np.float64)
            self._axes[tuple(node)] = "".join(self._letters[a] for a in attributes)
        if set(self._beliefs) != {tuple(n) for n in tree.nodes}:
            raise ValueError("the beliefs given are not on the model's junction tree's cliques")
        self._cache: dict[tuple[int, ...], NDArray[np.float64]] = {}

    @classmethod
    def from_beliefs(
        cls,
        feature_map: MarginalsMap,
        measurements: Sequence[Measurement],
        total: float,
        beliefs: Sequence[tuple[Sequence[int], Sequence[int], ArrayLike]],
        edges: Sequence[tuple[int, int]],
        *,
        rtol: float = 1e-6,
    ) -> MarginalsModel:
        """A model from a calibrated junction tree alone, checked (no ``mbi``, no jax: nothing
        imported, compiled or fitted), such as an owner's published fit
        (:class:`dpmarket.common.sketches.marginals_fit.MarginalsFit`).

        Parameters
        ----------
        feature_map : MarginalsMap
        measurements : sequence of Measurement
            The release the model was fitted to.
        total : float
            The model's record count, finite and > 0.
        beliefs : sequence of (node, axes, table)
            Per tree node: its columns (distinct indices), its table's axes (the same columns
            in the table's order) and the table, ndarray of float64 of shape
            ``cells[axes]``: the model's counts on the node's cells.
        edges : sequence of (int, int)
            The tree's edges, as indices into ``beliefs``.
        rtol : float
            Relative tolerance of the sums checked (of ``total``).

        Returns
        -------
        MarginalsModel
            Answers as the fitted model whose tree and beliefs these are; :attr:`mbi_model` is
            None (:meth:`refit` starts cold).

        Raises
        ------
        ValueError
            Naming the first check that fails: a node with an unknown or repeated column, a
            table of the wrong shape or with a negative, NaN or inf count, a table that does not
            sum to ``total``, edges that do not form a tree on the nodes, a column whose nodes
            are not connected (not a junction tree), adjacent tables that disagree on their
            shared columns (not calibrated: no distribution has these marginals), a measured
            clique inside no node, or a column in none.

        Notes
        -----
        A tree whose every column's nodes are connected (the running intersection property)
        and whose adjacent tables agree on their shared columns defines one distribution,
        ``prod_C mu_C / prod_S mu_S``, whose marginals on the nodes are the tables (Lauritzen
        & Spiegelhalter 1988; Koller & Friedman 2009, Proposition 10.5): what these checks
        establish is that the tables are a genuine model of the release's structure, not that
        it is the best fit to the release (refitting checks that).
        """
        d = feature_map.n_attributes
        cells = [int(c) for c in feature_map.cells]
        total = float(total)
        if not (math.isfinite(total) and total > 0):
            raise ValueError(f"a model's total must be finite and > 0, got {total}")
        named: list[tuple[tuple[str, ...], tuple[str, ...], NDArray[np.float64]]] = []
        for k, (node, axes, values) in enumerate(beliefs):
            columns = tuple(int(c) for c in node)
            order = tuple(int(c) for c in axes)
            if len(set(columns)) != len(columns) or any(not 0 <= c < d for c in columns):
                raise ValueError(f"belief {k}: columns must be distinct in [0, {d}), got {columns}")
            if sorted(order) != sorted(columns):
                raise ValueError(f"belief {k}: axes {order} are not its columns {columns}")
            table = np.asarray(values, dtype=np.float64)
            shape = tuple(cells[c] for c in order)
            if table.shape != shape:
                raise ValueError(
                    f"belief {k} over {order} must have shape {shape}, got {table.shape}"
                )
            if not np.isfinite(table).all() or (table < 0).any():
                raise ValueError(f"belief {k} holds a negative, NaN or inf count")
            if abs(float(table.sum()) - total) > rtol * total:
                raise ValueError(
                    f"belief {k} sums to {float(table.sum()):.9g}, not the total {total:.9g}"
                )
            named.append((tuple(str(c) for c in columns), tuple(str(c) for c in order), table))
        tree = _junction_tree(
            d, tuple(n for n, _, _ in named), tuple((int(a), int(b)) for a, b in edges)
        )
        model = cls.__new__(cls)
        model.mbi_model = None
        model._setup(feature_map, measurements, total, tree, [(n, a, t) for n, a, t in named])
        for u, v in tree.edges:
            separator = tuple(a for a in u if a in v)
            letters = "".join(model._letters[a] for a in separator)
            left = np.einsum(f"{model._axes[u]}->{letters}", model._beliefs[u])
            right = np.einsum(f"{model._axes[v]}->{letters}", model._beliefs[v])
            if np.abs(left - right).max(initial=0.0) > rtol * total:
                raise ValueError(
                    f"the beliefs on {list(u)} and {list(v)} disagree on their shared columns "
                    f"{list(separator)}: not a calibrated model"
                )
        for m in measurements:
            if not model.covers(m.clique):
                raise ValueError(
                    f"the measured clique {list(m.clique)} lies in no node of the model"
                )
        return model

    @classmethod
    def fit(
        cls,
        feature_map: MarginalsMap,
        measurements: Sequence[Measurement],
        *,
        iters: int = FINAL_ITERS,
        warm: MarginalsModel | None = None,
    ) -> MarginalsModel:
        """Fit the model to ``measurements`` (``warm``: start from that model's potentials).

        Parameters
        ----------
        feature_map : MarginalsMap
        measurements : sequence of Measurement
            With every column's 1-way marginal (the total comes from them).
        iters : int
            Mirror-descent iterations (rounded up to ``mbi``'s block of 50).
        warm : MarginalsModel, optional

        Returns
        -------
        MarginalsModel
        """
        mbi = _mbi()
        domain = _mbi_domain(feature_map)
        linear = [
            mbi.LinearMeasurement(m.values, tuple(str(j) for j in m.clique), stddev=m.sigma)
            for m in measurements
        ]
        model = mbi.estimation.MirrorDescent().estimate(
            domain,
            linear,
            iters=check_positive_int(iters, "iters"),
            warm_start=None if warm is None else warm.mbi_model,
        )
        return cls(feature_map, measurements, model)

    @property
    def nbytes(self) -> int:
        """Bytes of the model's float64 tables: its calibrated beliefs, and ``mbi``'s
        potentials and marginals (when it has an ``mbi`` model)."""
        n = sum(b.nbytes for b in self._beliefs.values())
        if self._mbi_parts is not None:  # not built yet: the same tables, as numpy
            parts = self._mbi_parts
            return int(n + sum(t.nbytes for k in ("potentials", "marginals") for *_, t in parts[k]))
        for name in ("potentials", "marginals") if self.mbi_model is not None else ():
            vector = getattr(self.mbi_model, name)
            n += sum(8 * math.prod(vector.tables[c].domain.shape) for c in vector.cliques)
        return int(n)

    def beliefs(self) -> list[tuple[tuple[int, ...], tuple[int, ...], NDArray[np.float64]]]:
        """The calibrated junction tree's beliefs, in the tree's node order: per node, its
        columns, its table's axes (columns) and the table (float64, the model's counts on the
        node's cells; read-only views of the model's own arrays)."""
        out = []
        for node, belief in self._beliefs.items():
            view = belief.view()
            view.setflags(write=False)
            axes = _attribute_of(self._letters, self._axes[node])
            out.append((tuple(int(a) for a in node), tuple(int(a) for a in axes), view))
        return out

    def tree_edges(self) -> list[tuple[int, int]]:
        """The junction tree's edges, as indices into :meth:`beliefs` (what
        :meth:`from_beliefs` takes)."""
        index = {node: k for k, node in enumerate(self._beliefs)}
        pairs = ((index[u], index[v]) for u, v in self._tree.edges)
        return sorted((min(a, b), max(a, b)) for a, b in pairs)

    def state(self) -> dict[str, Any]:
        """The fitted model as plain data (what :meth:`from_state` rebuilds it from).

        Returns
        -------
        dict
            ``{"total": float, "potentials": [...], "marginals": [...], "beliefs": [...],
            "edges": [...]}``, each of the first three lists holding per clique (of ``mbi``'s
            vectors; of the junction tree, for the calibrated beliefs) ``(clique, attributes,
            table)``: the clique's attribute names, its table's axes' names, and the table
            (ndarray of float64, one axis per attribute, of its column's cells); ``edges`` the
            junction tree's (:meth:`tree_edges`).

        Raises
        ------
        ValueError
            For a model built :meth:`from_beliefs` (it has no ``mbi`` model).
        """
        out: dict[str, Any] = {
            "beliefs": [
                (node, tuple(_attribute_of(self._letters, self._axes[node])), belief)
                for node, belief in self._beliefs.items()
            ],
            "edges": self.tree_edges(),
        }
        if self._mbi_parts is not None:  # not built: what it would be built from
            parts = self._mbi_parts
            return {**out, **{k: parts[k] for k in ("total", "potentials", "marginals")}}
        out["total"] = float(self._mbi_fitted().total)
        for name in ("potentials", "marginals"):
            vector = getattr(self._mbi_fitted(), name)
            out[name] = [
                (
                    tuple(clique),
                    tuple(vector.tables[clique].domain.attributes),
                    np.asarray(vector.tables[clique].values, dtype=np.float64),
                )
                for clique in vector.cliques
            ]
        return out

    @classmethod
    def from_state(
        cls,
        feature_map: MarginalsMap,
        measurements: Sequence[Measurement],
        state: Mapping[str, Any],
    ) -> MarginalsModel:
        """The model :meth:`state` described: the same potentials and calibrated beliefs
        (no message passing, nothing compiled), hence the same answers bit for bit.

        With the junction tree's ``edges`` in ``state`` (every :meth:`state` has them), the
        model is rebuilt from its beliefs and tree as :meth:`from_beliefs` does (checked, with
        no ``mbi`` and no jax), and :attr:`mbi_model` only when first read (a refit's warm
        start): a console's first answer from a kept model does not wait for jax's import
        (about 2 s). Without them (a state written before), ``mbi``'s model is built at once
        and the tree computed from it.

        Raises
        ------
        ValueError
            If a table's shape is not its attributes' cells, or an attribute is unknown; or
            a check of :meth:`from_beliefs` fails.
        """
        if "edges" in state:
            beliefs = [
                (tuple(int(a) for a in node), tuple(int(a) for a in axes), table)
                for node, axes, table in state["beliefs"]
            ]
            edges = [(int(a), int(b)) for a, b in state["edges"]]
            total = float(state["total"])
            model = cls.from_beliefs(feature_map, measurements, total, beliefs, edges)
            _mbi_model_of(feature_map, state, check_only=True)
            model._mbi_parts = {
                "total": total,
                "potentials": list(state["potentials"]),
                "marginals": list(state["marginals"]),
            }
            return model
        return cls(
            feature_map, measurements, _mbi_model_of(feature_map, state), beliefs=state["beliefs"]
        )

    @property
    def mbi_domain(self) -> Any:
        """The model's ``mbi.Domain`` (attributes ``"0"`` … ``"d-1"``)."""
        return _mbi_domain(self.feature_map)

    def _mbi_fitted(self) -> Any:
        """The ``mbi`` model (ValueError for a model built :meth:`from_beliefs`)."""
        if self.mbi_model is None:
            raise ValueError("this model was built from its beliefs: it has no mbi model")
        return self.mbi_model

    @property
    def cliques(self) -> list[tuple[str, ...]]:
        """The model's cliques, as ``mbi`` names them (for a model built :meth:`from_beliefs`,
        its junction tree's nodes)."""
        if self._mbi_parts is not None:  # not built: its potentials' cliques
            return [tuple(c) for c, _, _ in self._mbi_parts["potentials"]]
        if self.mbi_model is None:
            return list(self._beliefs)
        return [tuple(c) for c in self.mbi_model.cliques]

    @staticmethod
    def names(clique: Sequence[int]) -> tuple[str, ...]:
        """Column indices -> ``mbi`` attribute names."""
        return tuple(str(j) for j in clique)

    def covers(self, clique: Sequence[int]) -> bool:
        """Whether ``clique`` lies inside one of the model's cliques (measuring it does not
        grow the model)."""
        names = set(self.names(clique))
        return any(names <= set(c) for c in self.cliques)

    def grown_size_mb(self, clique: Sequence[int]) -> float:
        """The size (MB, :func:`model_size_mb`) of the model's junction tree if ``clique`` were
        measured too."""
        cliques = [tuple(int(a) for a in c) for c in self.cliques]
        return model_size_mb(self.feature_map, [*cliques, tuple(clique)])

    def marginal(self, clique: Sequence[int]) -> NDArray[np.float64]:
        """The model's counts on ``clique``'s cells.

        Parameters
        ----------
        clique : sequence of int
            Distinct column indices, in the order of the result's axes.

        Returns
        -------
        ndarray of shape (cells[clique[0]], cells[clique[1]], ...), float64
            Non-negative, summing to :attr:`total`.

        Raises
        ------
        ValueError
            For repeated or out-of-range columns.
        """
        key = tuple(int(c) for c in clique)
        d = self.feature_map.n_attributes
        if len(set(key)) != len(key) or any(not 0 <= c < d for c in key):
            raise ValueError(f"a marginal needs distinct columns in [0, {d}), got {list(key)}")
        found = self._cache.get(key)
        if found is None:
            joint = self._junction_marginal(self.names(key))
            mass = float(joint.sum())
            found = joint * (self.total / mass) if mass > 0 else joint
            found.setflags(write=False)
            self._cache[key] = found
        return found

    def _junction_marginal(self, names: tuple[str, ...]) -> NDArray[np.float64]:
        """The model's counts on ``names`` from the calibrated junction tree.

        A marginal inside one maximal clique is a sum of its belief. Otherwise the variables
        span the smallest subtree whose cliques hold them all (the union of the tree paths
        between cliques holding them); a connected subtree of a junction tree is a junction
        tree of its variables, whose joint is ``prod_C mu_C / prod_S mu_S`` over its cliques
        ``C`` and separators ``S`` (Lauritzen & Spiegelhalter 1988; Koller & Friedman 2009,
        Proposition 10.5), and one ``einsum`` sums it down to ``names``. Components of a
        forest are independent: their product is divided by ``total`` once per extra component.
        The work depends on the subtree, never on the whole model.
        """
        import networkx as nx

        wanted = set(names)
        for node, belief in self._beliefs.items():
            if wanted <= set(node):
                out = "".join(self._letters[a] for a in names)
                return np.asarray(np.einsum(f"{self._axes[node]}->{out}", belief), dtype=np.float64)
        # Terminals: for each variable, a clique holding it (the one holding most of the others).
        terminals: set[tuple[str, ...]] = set()
        for a in names:
            if not any(a in t for t in terminals):
                holding = [n for n in self._beliefs if a in n]
                terminals.add(max(holding, key=lambda n: len(wanted & set(n))))
        nodes: set[tuple[str, ...]] = set()
        components = 0
        for part in nx.connected_components(self._tree.subgraph(self._beliefs)):
            inside = sorted(t for t in terminals if t in part)
            if not inside:
                continue
            components += 1
            nodes.add(inside[0])
            for t in inside[1:]:
                nodes.update(nx.shortest_path(self._tree, inside[0], t))
        # Sorted: the operands' order, hence the floating-point result, is the same in every
        # process (sets of strings iterate in a per-process hash order).
        subscripts, tables = [], []
        for node in sorted(nodes):
            subscripts.append(self._axes[node])
            tables.append(self._beliefs[node])
        for u, v in sorted(tuple(sorted(e)) for e in self._tree.subgraph(nodes).edges):
            separator = tuple(a for a in u if a in v)
            letters = "".join(self._letters[a] for a in separator)
            sums = np.einsum(f"{self._axes[u]}->{letters}", self._beliefs[u])
            subscripts.append(letters)
            tables.append(np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0))
        expression = ",".join(subscripts) + "->" + "".join(self._letters[a] for a in names)
        path = _einsum_path(expression, tuple(t.shape for t in tables))
        joint = np.einsum(expression, *tables, optimize=path)
        return np.asarray(joint, dtype=np.float64) / self.total ** (components - 1)

    def query(self, weights: Mapping[int, NDArray[np.float64]]) -> float:
        """The model's count of records weighted by a product of per-column cell weights
        (a conjunction of predicates: :func:`cell_weights`).

        Parameters
        ----------
        weights : mapping of column to ndarray of shape (cells[column],)

        Returns
        -------
        float
            ``sum_cells prod_j w_j(cell_j) * count(cell)``.
        """
        columns = sorted(weights)
        if not columns:
            return self.total
        table = self.marginal(columns)
        for axis, j in enumerate(columns):
            shape = [1] * len(columns)
            shape[axis] = -1
            table = table * np.asarray(weights[j], dtype=np.float64).reshape(shape)
        return float(table.sum())

    def refit(self, measurements: Sequence[Measurement], *, iters: int) -> MarginalsModel:
        """A model of the same structure fitted to other values (warm-started from this one)."""
        return MarginalsModel.fit(self.feature_map, measurements, iters=iters, warm=self)

    def bootstrap(
        self, replicates: int, rng: np.random.Generator, *, iters: int = BOOTSTRAP_ITERS
    ) -> list[MarginalsModel]:
        """Parametric bootstrap: models refitted to this model's marginals plus fresh noise of
        the public scales.

        Parameters
        ----------
        replicates : int
        rng : numpy.random.Generator
            The consumer's own randomness (it protects nothing: the release is public).
        iters : int

        Returns
        -------
        list of MarginalsModel
            ``replicates`` models; the spread of an answer across them estimates its standard
            error from the measurement noise (the selected structure held fixed).

        Notes
        -----
        Replicate ``b`` refits to ``y*_i = M_i(model) + N(0, sigma_i^2)`` for every
        measurement ``i``: the release's noise model with this model as the truth. The
        estimator is not linear in the noise (the fit is constrained to distributions), hence
        the bootstrap rather than an analytic variance.
        """
        out = []
        for _ in range(check_positive_int(replicates, "replicates")):
            noisy = [
                Measurement(
                    m.clique,
                    self.marginal(m.clique).reshape(-1) + rng.normal(0.0, m.sigma, m.values.size),
                    m.sigma,
                )
                for m in self.measurements
            ]
            out.append(self.refit(noisy, iters=iters))
        return out

    def sample(self, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """Synthetic records' cells, drawn from the model.

        Parameters
        ----------
        n : int
            Records, >= 1.
        rng : numpy.random.Generator

        Returns
        -------
        ndarray of shape (n, d), int64
            Cell indices; column ``j`` in ``[0, cells[j])``.

        Notes
        -----
        Forward sampling along the model's junction tree, breadth first from a root of each
        of its trees (as ``mbi``'s ``synthetic_data`` does along its elimination order, but with
        the caller's generator): each column is drawn from its conditional given the already
        drawn columns it shares a junction-tree clique with, which for a junction tree is the
        conditional given all drawn columns (the nodes holding a column form a subtree whose
        first node visited holds every drawn column it shares a node with).
        """
        import networkx as nx

        count = check_positive_int(n, "n")
        d = self.feature_map.n_attributes
        groups = [set(c) for c in self._beliefs]
        order: list[str] = []
        for part in sorted(sorted(c) for c in nx.connected_components(self._tree)):
            for node in nx.bfs_tree(self._tree, part[0]):
                order.extend(a for a in sorted(node, key=int) if a not in order)
        out = np.zeros((count, d), dtype=np.int64)
        drawn: list[int] = []
        for name in order:
            col = int(name)
            near = {int(a) for g in groups if name in g for a in g}
            parents = [j for j in drawn if j in near]
            table = self.marginal([*parents, col]).reshape(-1, int(self.feature_map.cells[col]))
            table = np.maximum(table, 0.0)
            sums = table.sum(axis=1, keepdims=True)
            cond = np.where(sums > 0, table / np.where(sums > 0, sums, 1.0), 1.0 / table.shape[1])
            if parents:
                row = np.ravel_multi_index(
                    tuple(out[:, j] for j in parents),
                    [int(self.feature_map.cells[j]) for j in parents],
                )
            else:
                row = np.zeros(count, dtype=np.int64)
            cdf = np.cumsum(cond, axis=1)[row]
            u = rng.random(count) * cdf[:, -1]
            out[:, col] = np.minimum((u[:, None] >= cdf).sum(axis=1), table.shape[1] - 1)
            drawn.append(col)
        return out

    def cell_values(self, cells: NDArray[np.int64], domain: Domain) -> NDArray[np.float64]:
        """Records in the domain's units for cell indices: a discrete column's level, a
        continuous column's value drawn uniformly in its cell is not reproducible without a
        generator, so this returns the cell's midpoint.

        Parameters
        ----------
        cells : ndarray of shape (n, d), int
        domain : Domain

        Returns
        -------
        ndarray of shape (n, d), float64
        """
        out = np.empty(cells.shape, dtype=np.float64)
        for j in range(cells.shape[1]):
            levels = domain.level_values(j)
            if levels is not None:
                out[:, j] = levels[cells[:, j]]
            else:
                e = self.feature_map.edges(j)
                out[:, j] = ((e[:-1] + e[1:]) / 2.0)[cells[:, j]]
        return out


def _mbi_model_of(
    feature_map: MarginalsMap, state: Mapping[str, Any], *, check_only: bool = False
) -> Any:
    """``mbi``'s ``MarkovRandomField`` of :meth:`MarginalsModel.state`'s ``potentials``,
    ``marginals`` and ``total``; with ``check_only``, only the tables' shapes are checked
    (nothing imported) and None is returned.

    Raises
    ------
    ValueError
        If a table's shape is not its attributes' cells, or an attribute is unknown.
    """
    cells = {str(j): int(c) for j, c in enumerate(feature_map.cells)}
    for name in ("potentials", "marginals"):
        for _, attributes, values in state[name]:
            unknown = [a for a in attributes if a not in cells]
            if unknown:
                raise ValueError(f"unknown attribute(s) {unknown} in a {name} table")
            shape = tuple(cells[a] for a in attributes)
            if np.shape(values) != shape:
                raise ValueError(
                    f"a table over {list(attributes)} must have shape {shape}, "
                    f"got {np.shape(values)}"
                )
    if check_only:
        return None
    mbi = _mbi()
    import jax.numpy as jnp

    domain = _mbi_domain(feature_map)
    vectors = []
    for name in ("potentials", "marginals"):
        tables = {}
        cliques = []
        for clique, attributes, values in state[name]:
            sub = domain.project(tuple(attributes))
            cliques.append(tuple(clique))
            tables[tuple(clique)] = mbi.Factor(sub, jnp.asarray(np.asarray(values, np.float64)))
        vectors.append(mbi.CliqueVector(domain, cliques, tables))
    return mbi.MarkovRandomField(
        potentials=vectors[0], marginals=vectors[1], total=float(state["total"])
    )


@functools.lru_cache(maxsize=64)
def _junction_tree(
    d: int, nodes: tuple[tuple[str, ...], ...], edges: tuple[tuple[int, int], ...]
) -> Any:
    """The forest of ``edges`` (indices into ``nodes``) on ``nodes`` (tuples of attribute
    names), checked to be a junction tree of ``d`` columns: distinct nodes, a forest, every
    column in a node, and each column's nodes connected (the running intersection property).
    Checked once per structure (a model's bootstrap refits share it); callers do not modify
    the graph.

    Raises
    ------
    ValueError
        Naming the first property that fails.
    """
    import networkx as nx

    if len(set(nodes)) != len(nodes) or not nodes:
        raise ValueError("a model's beliefs must be on distinct nodes, at least one")
    tree = nx.Graph()
    tree.add_nodes_from(nodes)
    for a, b in edges:
        if not (0 <= a < len(nodes) and 0 <= b < len(nodes)) or a == b:
            raise ValueError(f"edge ({a}, {b}) is not between two of the {len(nodes)} nodes")
        tree.add_edge(nodes[a], nodes[b])
    if not nx.is_forest(tree) or tree.number_of_edges() != len(edges):
        raise ValueError("the edges given do not form a forest on the beliefs' nodes")
    for j in range(d):
        holding = [n for n in nodes if str(j) in n]
        if not holding:
            raise ValueError(f"column {j} is in no node of the model")
        if not nx.is_connected(tree.subgraph(holding)):
            raise ValueError(f"the nodes holding column {j} are not connected: not a junction tree")
    return tree


@functools.lru_cache(maxsize=4096)
def _einsum_path(expression: str, shapes: tuple[tuple[int, ...], ...]) -> list[Any]:
    """``numpy.einsum_path``'s greedy contraction order for ``expression`` on operands of
    ``shapes``: computed once per junction subtree and query (the bootstrap models share their
    structure), not per call (finding it costs more than contracting)."""
    operands = [np.empty(shape, dtype=np.float64) for shape in shapes]
    path, _ = np.einsum_path(expression, *operands, optimize="greedy")
    return list(path)


def model_size_mb(feature_map: MarginalsMap, cliques: Sequence[Sequence[int]]) -> float:
    """The size in MB of the float64 tables of the junction tree of a model over ``cliques``
    (column indices), as ``mbi``'s ``hypothetical_model_size`` counts it."""
    return float(
        _mbi().junction_tree.hypothetical_model_size(
            _mbi_domain(feature_map), [tuple(str(j) for j in c) for c in cliques]
        )
    )


def _attribute_of(letters: Mapping[str, str], axes: str) -> list[str]:
    """The attribute names of a belief's ``axes`` (einsum letters)."""
    names = {letter: name for name, letter in letters.items()}
    return [names[a] for a in axes]


def _einsum_letter(j: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if j >= len(letters):
        raise ValueError(f"the marginals model handles at most {len(letters)} columns, got {j + 1}")
    return letters[j]


def _mbi_domain(feature_map: MarginalsMap) -> Any:
    mbi = _mbi()
    d = feature_map.n_attributes
    return mbi.Domain([str(j) for j in range(d)], [int(c) for c in feature_map.cells])
