"""Exploration of published sketches: M2M answers and owner ranking, computed by the consumer.

Everything here is post-processing of sketches the consumer already holds (read from the curator's
catalogue, :meth:`dpmarket.consumer.client.CuratorClient.sketches`): no owner is called, no owner
learns a query, and the consumer's validation set never leaves this process. Each query costs the
owners nothing more, whatever the consumer asks and however often.

* :class:`Query` is one analysis of the M2M paper's Sections 3.4-3.5 on named columns: ``mean``
  and ``moment2`` (raw moments), ``cdf`` (at chosen points), ``covariance``, ``count`` (a
  conjunction of range predicates: the fraction of records and the count) and ``logreg`` (a
  logistic regression by implicit M2M).
* :class:`Explorer` answers queries for any sketch of one spec (one owner's, or the union of
  several: :func:`dpmarket.common.sketches.sketch.merge_sketches`) from one synthetic design, drawn
  once from the spec's domain; :func:`exact_answer` gives the same quantity on raw records (for
  those who hold them: the demo, tests).
* :class:`MarginalsExplorer` answers from marginals sketches through a graphical model
  (:class:`dpmarket.common.sketches.marginals.MarginalsModel`): counts, CDFs, marginal tables,
  moments of discrete columns and synthetic records.
* :func:`choose_source` picks, per query, which of the available specs answers it (the rule is
  in its docstring).
* :func:`rank_owners` orders owners by the squared MMD between the consumer's validation set and
  each owner's RFF sketch (:func:`dpmarket.common.sketches.sketch.sketch_mmd2`, debiased), each
  with its interval and the owners its order is not resolved against
  (:mod:`dpmarket.common.sketches.mmd`).

Every answer carries, per value, the one interval model of :mod:`dpmarket.common.uncertainty`:
a standard error, a 95 % interval, its basis (what it covers), the bias bound inside it and flags
``on`` the value or the interval, each with its reason (:data:`FLAGS`). For HIST, RFF and RACE
means, moments, CDFs, counts and covariances the interval includes a bound on the estimator's
bias (the binning of a histogram, M2M's residual range for its fit and shrinkage: ``noise+bias``)
or holds whatever the joint (Fréchet or Cauchy-Schwarz bounds for what one histogram per column
does not identify: ``bounds``, the independence guess flagged on the value), widened by the 95 %
quantile of the noise (:mod:`dpmarket.consumer.intervals` states each construction); a CDF or
count the declared bounds settle is exact (``public``: :meth:`Explorer._settled`). The
marginals kind's counts, CDFs, cells, moments and covariances whose columns every owner measured
together are the measured marginals' own estimate, with its noise's standard error and the
interval built around it (``measured``; the graphical model's value is not printed there: it is
biased where the noise is large against a cell); the others, and every count or CDF whose
predicate cuts a cell, are the graphical model's guess (flagged ``model-guess`` on the value)
inside bounds that hold whatever the joint and wherever the records lie inside a cut cell:
Fréchet bounds from the measured marginals, Cauchy-Schwarz bounds from the two variances for a
covariance (``bounds``; :mod:`dpmarket.common.sketches.marginals_bounds`); a count or CDF the
public domain fixes (every record lies within the declared bounds) is exact (``public``). A
logistic regression's bias is not bounded: its intervals cover the noise only and are flagged
``unbounded`` on the interval.
Where the record count is known within 20 % or worse, the means, moments, CDFs and counts whose
bounds are ratios over the count get an interval exact in the count's noise (Fieller's test
inversion: :func:`dpmarket.common.sketches.intervals.ratio_interval`); the others are flagged
``few-records``. Values and intervals of every sketch kind are cut to what the quantity can be —
a mean to its column's public bounds, a fraction to [0, 1], a variance to [0, w^2/4]
(Popoviciu), a covariance to [-w_a w_b/4, w_a w_b/4] — the raw estimate kept
beside them; an interval the cut leaves narrower than the noise alone spreads its value over (the
larger of the noise's quantile and 1.96 standard errors) keeps that width, from the edge inwards
(:func:`~dpmarket.common.uncertainty.cut_keeping_noise`: no CDF ``[0.9999, 1]`` narrower than
its standard error, no count ``[0, 0]``, from a noisy release).

The synthetic design's randomness is the consumer's own and protects nothing (the sketches are
already private), so it is seeded (default 0): the same sketch and query give the same answer,
bit for bit, wherever they are computed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.sketches import tasks
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import HISTMap
from dpmarket.common.sketches.intervals import (
    DEFAULT_REPLICATES,
    BinTarget,
    Bounded,
    bin_ranges,
    count_estimate,
    count_weights,
    domain_range,
    record_count_interval,
    release_totals,
)
from dpmarket.common.sketches.m2m import (
    DEFAULT_LAMBDA_RULE,
    LambdaRule,
    M2MEstimator,
    SyntheticDesign,
)
from dpmarket.common.sketches.marginals import (
    DEFAULT_BOOTSTRAP,
    MarginalsMap,
    MarginalsModel,
    MarginalsSketch,
    Measurement,
    bound_weights,
    cell_weights,
    free_compiled,
    public_share,
)
from dpmarket.common.sketches.marginals_bounds import (
    MeasuredEstimate,
    covariance_bounds,
    covariance_estimate,
    fraction_bounds,
    fraction_estimate,
    record_count_bounds,
    total_count,
    union_count_bounds,
    unmeasured_covariance_bounds,
)
from dpmarket.common.sketches.marginals_fit import carried_fit, fit_sketch
from dpmarket.common.sketches.mmd import MMDEstimate, mmd2_difference, sketch_mmd2_estimate
from dpmarket.common.sketches.sketch import (
    PrivateSketch,
    SketchLike,
    SketchUnion,
    merge_sketches,
)
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.common.uncertainty import (
    BASES,
    Flag,
    On,
    cut_keeping_noise,
    interval_row,
    trusted,
    uninformative_flag,
)
from dpmarket.common.uncertainty import UNINFORMATIVE as _UNINFORMATIVE
from dpmarket.consumer import model_store
from dpmarket.consumer.intervals import hist_bounded, interval_basis, m2m_bounded

__all__ = [
    "DEFAULT_EXPLORE_SYNTHETIC",
    "FLAGS",
    "MARGINALS_MODELS",
    "NO_TRUSTED",
    "QUERIES",
    "READ_KINDS",
    "Answer",
    "Explorer",
    "MarginalsExplorer",
    "ModelCache",
    "Query",
    "RankedOwner",
    "bounded_answer",
    "choose_source",
    "exact_answer",
    "honest_half_width",
    "m2m_standard_errors",
    "m2m_target",
    "narrowest",
    "parse_where",
    "rank_owners",
    "record_count",
    "sketch_digest",
    "uninformed_half_width",
]

logger = logging.getLogger(__name__)

#: The analyses a consumer can run on a sketch (``marginal`` and ``synthetic`` need a
#: marginals sketch).
QUERIES = ("mean", "moment2", "cdf", "covariance", "count", "logreg", "marginal", "synthetic")
#: Two-sided normal quantile of the 95 % intervals shown beside the standard errors.
Z95 = 1.959963984540054
#: Bootstrap replicates of M2M's non-linear answers (covariance, logistic regression).
M2M_BOOTSTRAP = 32
#: Synthetic points of an exploration's design: 2e4 keeps a query under a second at m = 400
#: (the paper uses 1e5; ``n_synthetic`` raises it).
DEFAULT_EXPLORE_SYNTHETIC = 20_000
#: CDF points per column when none are given: the column's range cut in this many equal parts.
CDF_DEFAULT_PARTS = 10
#: A CDF's or count's set that fewer design points reach is probed by the design's points moved
#: into it (:func:`_face_points`): the residual's range over a set the design barely samples is
#: not an estimate of its supremum there.
SET_DESIGN_POINTS = 50

_WHERE = re.compile(r"^\s*([^<>=\s]+)\s*(<=|>=|=)\s*([^\s]+)\s*$")


def parse_where(text: str) -> tuple[str, float, float]:
    """``"distance>=1000"``, ``"hour<=12"`` or ``"delayed=1"`` -> ``(column, low, high)``.

    ``>=`` leaves the upper side open (``inf``), ``<=`` the lower one; ``=`` is both.

    Raises
    ------
    InvalidArgumentError
        If the text is not ``COLUMN<=VALUE``, ``COLUMN>=VALUE`` or ``COLUMN=VALUE``.
    """
    match = _WHERE.fullmatch(text)
    if match is None:
        raise InvalidArgumentError(
            f"range predicate {text!r}: expected COLUMN<=VALUE, COLUMN>=VALUE or COLUMN=VALUE"
        )
    column, op, raw = match.groups()
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"range predicate {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise InvalidArgumentError(f"range predicate {text!r}: the value must be finite")
    if op == "<=":
        return column, -math.inf, value
    if op == ">=":
        return column, value, math.inf
    return column, value, value


@dataclass(frozen=True)
class Query:
    """One analysis on named columns.

    Attributes
    ----------
    kind : {"mean", "moment2", "cdf", "covariance", "count", "logreg"}
    columns : tuple of str
        ``mean``, ``moment2``, ``cdf``, ``covariance``: the columns (empty: every column; for
        ``cdf``, every continuous one); ``logreg``: the features (empty: every column but the
        target).
    points : tuple of float
        ``cdf``: the thresholds, the same for every column (empty: each column's range cut in
        :data:`CDF_DEFAULT_PARTS` parts, interior points).
    where : tuple of (str, float, float)
        ``count``: the conjunction ``low <= column <= high`` (``-inf`` / ``inf`` open a side);
        at least one.
    target : str
        ``logreg``: the label column, declared discrete with two levels in the domain.
    rows : int
        ``synthetic``: how many records to draw (>= 1).

    Raises
    ------
    InvalidArgumentError
        For an unknown kind, options that do not belong to it, or a column named twice.
    """

    kind: str
    columns: tuple[str, ...] = ()
    points: tuple[float, ...] = ()
    where: tuple[tuple[str, float, float], ...] = ()
    target: str = ""
    rows: int = 0

    def __post_init__(self) -> None:
        if self.kind not in QUERIES:
            raise InvalidArgumentError(f"query must be one of {QUERIES}, got {self.kind!r}")
        if self.kind == "count" and not self.where:
            raise InvalidArgumentError("a count needs at least one range predicate (--where)")
        if self.where and self.kind != "count":
            raise InvalidArgumentError(f"range predicates belong to count, not {self.kind}")
        if self.points and self.kind != "cdf":
            raise InvalidArgumentError(f"points belong to cdf, not {self.kind}")
        if self.kind == "logreg" and not self.target:
            raise InvalidArgumentError("a logistic regression needs a target column (--target)")
        if self.target and self.kind != "logreg":
            raise InvalidArgumentError(f"a target belongs to logreg, not {self.kind}")
        if self.columns and self.kind == "count":
            raise InvalidArgumentError("count takes no columns (its predicates name them)")
        if self.target and self.target in self.columns:
            raise InvalidArgumentError(f"the target {self.target!r} cannot also be a feature")
        twice = sorted({c for c in self.columns if self.columns.count(c) > 1})
        if twice:
            # cov(x, x) named twice would be answered twice, once as a variance and once by the
            # cross-moment rule, with two intervals for one quantity.
            raise InvalidArgumentError(
                f"column(s) {', '.join(map(repr, twice))} named more than once (--column): "
                "name each column once"
            )
        if any(not math.isfinite(p) for p in self.points):
            raise InvalidArgumentError(f"cdf points must be finite, got {list(self.points)}")
        if self.kind == "marginal" and not 1 <= len(self.columns) <= 3:
            raise InvalidArgumentError(
                f"a marginal names 1 to 3 columns (--column), got {len(self.columns)}"
            )
        if (self.kind == "synthetic") != (self.rows > 0):
            raise InvalidArgumentError(
                f"rows (>= 1) belong to synthetic, got rows = {self.rows} for {self.kind}"
            )


@dataclass(frozen=True)
class Answer:
    """A query's answer: one value per label, in order, with its uncertainty in the one model
    every consumer reads (:mod:`dpmarket.common.uncertainty`).

    Attributes
    ----------
    query : Query
    labels : tuple of str
        What each value is, e.g. ``"distance"``, ``"P[distance <= 500]"``,
        ``"cov(distance, air_time)"``, ``"coef(hour)"``.
    values : ndarray of shape (len(labels),), float64
        Clipped to what the quantity can be (module docstring); see :attr:`raw`.
    extra : dict
        ``count``: ``count`` (the fraction times the count estimate; a marginals count whose
        columns were measured together, the measured count itself), ``n``,
        ``count_standard_error`` (``None`` where there is none: a graphical model's guess over
        columns no measurement holds together) and ``count_interval`` (the count's own
        interval, holding ``count``);
        ``synthetic``: ``records`` (rows of values in the spec's column order) and ``columns``.
    errors : ndarray of shape (len(labels),), float64
        Standard error of each value from the release's noise (NaN when none is available, and
        for a graphical model's guess, ``basis`` ``"bounds"``: its error is the guess's bias).
    columns : tuple of tuple of str
        The columns each value is about.
    flags : tuple of tuple of Flag
        Per value, why it or its interval needs care (:data:`FLAGS`): a flag ``on = "value"``
        leaves the interval meaning what :attr:`basis` says (e.g. the value is a model's guess
        inside bounds that hold whatever the joint); one ``on = "interval"`` says it does not.
    raw : ndarray of shape (len(labels),), float64
        The estimates before clipping.
    source : str
        What answered: ``"<spec> (M2M)"``, ``"<spec> (histogram)"`` or
        ``"<spec> (graphical model)"``.
    low, high : ndarray of shape (len(labels),), float64
        The 95 % interval, when it is not ``values -+ 1.96 errors`` (a bias bound, Fréchet
        bounds or a measured marginal's interval), within what the quantity can be. Empty: the
        normal interval of :attr:`errors`.
    bias : ndarray of shape (len(labels),), float64
        Half-width of the bias bound inside the interval; NaN where there is none.
    basis : tuple of str
        Per value, what its interval covers
        (:data:`~dpmarket.common.uncertainty.BASES`: ``"noise"``, ``"noise+bias"``,
        ``"measured"``, ``"bounds"``, ``"public"`` or ``"none"``).
    covers : tuple of str
        Per value, one line: how its interval was built and what it covers.
    """

    query: Query
    labels: tuple[str, ...]
    values: NDArray[np.float64]
    extra: dict[str, Any] = field(default_factory=dict)
    errors: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    columns: tuple[tuple[str, ...], ...] = ()
    flags: tuple[tuple[Flag, ...], ...] = ()
    raw: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    source: str = ""
    low: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    high: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    bias: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    basis: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        k = len(self.labels)
        if self.errors.shape != (k,):
            object.__setattr__(self, "errors", np.full(k, np.nan))
        if self.bias.shape != (k,):
            object.__setattr__(self, "bias", np.full(k, np.nan))
        if len(self.basis) != k:
            noise = ["noise" if math.isfinite(e) else "none" for e in self.errors]
            object.__setattr__(self, "basis", tuple(noise))
        if len(self.covers) != k:
            object.__setattr__(self, "covers", tuple(BASES[b] for b in self.basis))
        if len(self.columns) != k:
            object.__setattr__(self, "columns", ((),) * k)
        if len(self.flags) != k:
            object.__setattr__(self, "flags", ((),) * k)
        if self.raw.shape != (k,):
            object.__setattr__(self, "raw", np.asarray(self.values, dtype=np.float64).copy())

    def interval(self, z: float = Z95) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The 95 % interval: :attr:`low`, :attr:`high` when given, else ``values -+ z *
        errors`` (``z`` applies to the latter only)."""
        k = len(self.labels)
        if self.low.shape == (k,) and self.high.shape == (k,):
            return self.low, self.high
        return self.values - z * self.errors, self.values + z * self.errors

    def codes(self, on: str | None = None) -> tuple[str, ...]:
        """Per value, its flags' codes joined by ``", "`` (``""``: none), only those ``on``
        ``"value"`` or ``"interval"`` when given."""
        return tuple(
            ", ".join(f.code for f in flags if on is None or f.on == on) for flags in self.flags
        )

    def trusted(self) -> NDArray[np.bool_]:
        """Per value, whether its interval means what its basis says: there is one and no flag
        is on it (:func:`dpmarket.common.uncertainty.trusted`)."""
        low, high = self.interval()
        return np.array(
            [
                trusted(flags, bool(np.isfinite(lo) and np.isfinite(hi)))
                for flags, lo, hi in zip(self.flags, low, high, strict=True)
            ],
            dtype=bool,
        )

    def rows(self) -> list[dict[str, Any]]:
        """One dict per value: ``label``, ``columns`` and the fields of
        :func:`dpmarket.common.uncertainty.interval_row` (``value``, ``standard_error``,
        ``interval``, ``level``, ``basis``, ``covers``, ``bias_bound``, ``flags``); ``raw``,
        the estimate before clipping, where it differs from ``value``."""
        low, high = self.interval()
        out = []
        for j, label in enumerate(self.labels):
            row = interval_row(
                label,
                float(self.values[j]),
                float(self.errors[j]),
                float(low[j]),
                float(high[j]),
                basis=self.basis[j],
                covers=self.covers[j],
                bias_bound=float(self.bias[j]),
                flags=self.flags[j],
            )
            row = {"label": label, "columns": list(self.columns[j]), **row}
            if self.raw[j] != self.values[j]:
                row["raw"] = float(self.raw[j])
            out.append(row)
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: ``{"query", "source", "values": {label: value}, "rows": [...],
        **extra}`` (:meth:`rows`)."""
        q = self.query
        query: dict[str, Any] = {"kind": q.kind}
        if q.columns:
            query["columns"] = list(q.columns)
        if q.points:
            query["points"] = list(q.points)
        if q.where:
            query["where"] = [[c, lo, hi] for c, lo, hi in q.where]
        if q.target:
            query["target"] = q.target
        if q.rows:
            query["rows"] = q.rows
        return {
            "query": query,
            "source": self.source,
            "values": dict(zip(self.labels, self.values.tolist(), strict=True)),
            "rows": self.rows(),
            **self.extra,
        }


def _index(domain: Domain, names: Sequence[str]) -> NDArray[np.int64]:
    known = {domain.attribute_name(j): j for j in range(domain.n_attributes)}
    missing = [n for n in names if n not in known]
    if missing:
        raise InvalidArgumentError(
            f"unknown column(s) {missing}; the spec's columns are {list(known)}"
        )
    return np.array([known[n] for n in names], dtype=np.int64)


def _columns(query: Query, domain: Domain) -> NDArray[np.int64]:
    if query.columns:
        return _index(domain, query.columns)
    every = list(range(domain.n_attributes))
    if query.kind == "cdf":
        every = [j for j in every if domain.level_values(j) is None] or every
    return np.array(every, dtype=np.int64)


def _thresholds(query: Query, domain: Domain, idx: NDArray[np.int64]) -> NDArray[np.float64]:
    if query.points:
        return np.broadcast_to(
            np.array(query.points, dtype=np.float64), (idx.size, len(query.points))
        )
    parts = np.arange(1, CDF_DEFAULT_PARTS) / CDF_DEFAULT_PARTS
    return domain.low[idx, None] + parts[None, :] * domain.width()[idx, None]


def _bounds(query: Query, domain: Domain) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    lower = np.full((1, domain.n_attributes), -np.inf)
    upper = np.full((1, domain.n_attributes), np.inf)
    idx = _index(domain, [c for c, _, _ in query.where])
    for j, (_, lo, hi) in zip(idx, query.where, strict=True):
        lower[0, j] = max(lower[0, j], lo)
        upper[0, j] = min(upper[0, j], hi)
    return lower, upper


def _where_label(query: Query) -> str:
    parts = []
    for c, lo, hi in query.where:
        if lo == hi:
            parts.append(f"{c} = {lo:g}")
        elif math.isinf(lo):
            parts.append(f"{c} <= {hi:g}")
        elif math.isinf(hi):
            parts.append(f"{c} >= {lo:g}")
        else:
            parts.append(f"{lo:g} <= {c} <= {hi:g}")
    return "P[" + " and ".join(parts) + "]"


def _labels(query: Query, domain: Domain) -> tuple[str, ...]:
    name = domain.attribute_name
    if query.kind in ("mean", "moment2"):
        return tuple(name(int(j)) for j in _columns(query, domain))
    if query.kind == "cdf":
        idx = _columns(query, domain)
        t = _thresholds(query, domain, idx)
        return tuple(
            f"P[{name(int(j))} <= {s:.6g}]" for j, row in zip(idx, t, strict=True) for s in row
        )
    if query.kind == "covariance":
        idx = _columns(query, domain)
        rows, cols = np.triu_indices(idx.size)
        return tuple(
            f"cov({name(int(idx[a]))}, {name(int(idx[b]))})"
            for a, b in zip(rows, cols, strict=True)
        )
    if query.kind == "count":
        return (_where_label(query),)
    features = [name(int(j)) for j in _features(query, domain)]
    return (*(f"coef({f})" for f in features), "intercept")


def _features(query: Query, domain: Domain) -> NDArray[np.int64]:
    """A logistic regression's feature columns: the query's, or every column but the target."""
    if query.columns:
        return _index(domain, query.columns)
    label = int(_index(domain, [query.target])[0])
    return np.array([j for j in range(domain.n_attributes) if j != label], dtype=np.int64)


def _check_target(query: Query, domain: Domain) -> int:
    label = int(_index(domain, [query.target])[0])
    levels = domain.level_values(label)
    if levels is None or levels.shape[0] != 2:
        raise InvalidArgumentError(
            f"the target {query.target!r} must be declared discrete with two levels in the "
            "spec's domain"
        )
    return label


def _value_columns(query: Query, domain: Domain) -> tuple[tuple[str, ...], ...]:
    """The columns each value of ``query`` is about, in the order of :func:`_labels`."""
    name = domain.attribute_name
    if query.kind in ("mean", "moment2"):
        return tuple((name(int(j)),) for j in _columns(query, domain))
    if query.kind == "cdf":
        idx = _columns(query, domain)
        t = _thresholds(query, domain, idx)
        return tuple((name(int(j)),) for j in idx for _ in range(t.shape[1]))
    if query.kind == "covariance":
        idx = _columns(query, domain)
        rows, cols = np.triu_indices(idx.size)
        return tuple(
            (name(int(idx[a])), name(int(idx[b]))) for a, b in zip(rows, cols, strict=True)
        )
    if query.kind == "count":
        return (tuple(dict.fromkeys(c for c, _, _ in query.where)),)
    if query.kind == "logreg":
        features = [name(int(j)) for j in _features(query, domain)]
        return (*((f, query.target) for f in features), (query.target,))
    return ()


#: Why a value or its interval is flagged (:attr:`Answer.flags`): code -> (what the flag is on,
#: what it means). Each flag's reason says it with the value's numbers.
FLAGS: dict[str, tuple[On, str]] = {
    "clipped": (
        "interval",
        "the estimate is impossible (outside what the quantity can be) even allowing for its "
        "interval",
    ),
    "uninformative": (
        "value",
        "the interval, before it is cut to what the quantity can be, spans more than half of "
        "it: the bias bound or the noise dominates, so the value says little; the interval "
        "still covers (cutting it to what the quantity can be never removes the truth), and "
        "the reason gives its width before the cut",
    ),
    "unbounded": (
        "interval",
        "the estimator's bias cannot be bounded from the release: the interval covers the noise "
        "only",
    ),
    "few-records": (
        "interval",
        "the record count is estimated within 20 % or worse and the value's bounds are not a "
        "ratio over the count (a covariance, a histogram's count over several columns): the "
        "interval's plug-in of the count estimate has no guarantee there",
    ),
    "model-guess": (
        "value",
        "the value is a model's guess (columns no measurement or histogram holds together taken "
        "as independent, or records taken as spread evenly inside a cell a predicate cuts); its "
        "interval holds whatever the joint and wherever those records lie",
    ),
}
#: The share of its possible range above which an interval is flagged ``uninformative``
#: (:data:`dpmarket.common.uncertainty.UNINFORMATIVE`).
UNINFORMATIVE = _UNINFORMATIVE
#: The count estimate's relative standard error above which a value is flagged ``few-records``.
FEW_RECORDS = 0.2


#: Why a marginals value whose predicate cuts a cell is a guess, and why its bounds hold.
_INSIDE_CELL = (
    "a predicate cuts a cell, and the records' positions inside a cell are not measured: the "
    "value takes them as spread evenly inside it; the interval counts that cell whole in its "
    "upper end and not at all in its lower end, so it holds wherever they lie"
)
#: Why a histogram value whose predicate meets a bin only at an edge is a guess inside it.
_INSIDE_BIN = (
    "a guess inside a bin: the predicate holds only an edge of a bin (a threshold at a bin's "
    "lower edge, where records may pile up at a column's declared bound), and the records' "
    "positions inside a bin are not measured: the value takes them as spread evenly inside it, "
    "so that bin counts for nothing (or for all) of it; the interval counts that bin whole in "
    "its upper end and not at all in its lower end, so it holds wherever they lie"
)
#: Why an M2M value whose predicate meets the domain only at an edge is a guess (in the words of
#: :data:`_INSIDE_BIN` where they fit): the set is a face of measure 0 (``x = low``).
_ON_FACE = (
    "a guess at the domain's edge: the predicate holds only an edge of the domain (a threshold "
    "at a continuous column's declared lower bound, where records may pile up, or a single "
    "value of it), and M2M's fit is continuous: the value takes the records as spread with no "
    "mass on any single value, so that edge counts for nothing of it; the interval takes M2M's "
    "residual range over that face of the domain too (the design's points moved onto it), so "
    "it holds records piled there"
)
#: Per sketch family, how the interval of a value whose predicate meets a bin (a histogram) or
#: the domain (M2M) only at an edge is built, and why the value is a guess
#: (:meth:`Explorer._settle`).
_EDGE_GUESS = {
    "hist": (
        "every bin's mass anywhere in its bin: the bins the predicate holds whole and every bin "
        "it touches, widened by the noise; they hold wherever the records lie inside a bin",
        _INSIDE_BIN,
    ),
    "m2m": (
        "M2M's residual range over the design and over the set's face (its fit and shrinkage), "
        "widened by the noise; the value, M2M's continuous fit, puts no mass on that face",
        _ON_FACE,
    ),
}


def _flag(code: str, reason: str) -> Flag:
    """A flag of :data:`FLAGS` with its reason in words."""
    return Flag(code, reason, FLAGS[code][0])


def _possible(
    query: Query, domain: Domain, k: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], list[str]]:
    """What each of the ``k`` values can be, whatever the data: ``(low, high, description)``
    (infinite where nothing bounds it)."""
    low = np.full(k, -np.inf)
    high = np.full(k, np.inf)
    what = [""] * k
    if query.kind in ("mean", "moment2"):
        idx = _columns(query, domain)
        lo, hi = domain.low[idx], domain.high[idx]
        if query.kind == "mean":
            low, high = lo.copy(), hi.copy()
            what = ["the column's public bounds"] * k
        else:
            low = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
            high = np.maximum(lo * lo, hi * hi)
            what = ["the squares of the column's public bounds"] * k
    elif query.kind in ("cdf", "count", "marginal"):
        low, high = np.zeros(k), np.ones(k)
        what = ["[0, 1] (a fraction)"] * k
    elif query.kind == "covariance":
        idx = _columns(query, domain)
        rows, cols = np.triu_indices(idx.size)
        width = domain.width()[idx]
        for v, (a, b) in enumerate(zip(rows, cols, strict=True)):
            if a == b:  # a variance: in [0, w^2 / 4] (Popoviciu)
                low[v], high[v] = 0.0, width[a] ** 2 / 4.0
                what[v] = "a variance's range [0, w^2/4]"
            else:  # |cov| <= sd_a sd_b <= w_a w_b / 4
                high[v] = width[a] * width[b] / 4.0
                low[v] = -high[v]
                what[v] = "a covariance's range [-w_a w_b/4, w_a w_b/4]"
    return low, high, what


def _clip(
    query: Query, domain: Domain, values: NDArray[np.float64]
) -> tuple[NDArray[np.float64], tuple[tuple[Flag, ...], ...]]:
    """Clip values to what the quantity can be; flag the ones moved ``clipped`` (module
    docstring), for answers whose interval does not account for the cut.

    Returns the clipped values and, per value, its flags."""
    k = values.shape[0]
    low, high, what = _possible(query, domain, k)
    clipped = np.clip(values, low, high)
    flags = tuple(
        (_flag("clipped", f"clipped to {what[j]}: the raw estimate {values[j]:.6g} is impossible"),)
        if clipped[j] != values[j]
        else ()
        for j in range(k)
    )
    return clipped, flags


def _bounded_flags(
    query: Query,
    domain: Domain,
    raw: NDArray[np.float64],
    raw_low: NDArray[np.float64],
    raw_high: NDArray[np.float64],
    count_rse: float,
    noise_width: NDArray[np.float64] | None = None,
) -> tuple[
    NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], tuple[tuple[Flag, ...], ...]
]:
    """Values and intervals of a bounded answer within what the quantity can be
    (:func:`_possible`), and flags: :func:`bounded_answer` over the query's possible range."""
    low, high, what = _possible(query, domain, raw.shape[0])
    return bounded_answer(raw, raw_low, raw_high, low, high, what, count_rse, noise_width)


def bounded_answer(
    raw: NDArray[np.float64],
    raw_low: NDArray[np.float64],
    raw_high: NDArray[np.float64],
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    what: Sequence[str],
    count_rse: float,
    noise_width: NDArray[np.float64] | None = None,
) -> tuple[
    NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], tuple[tuple[Flag, ...], ...]
]:
    """Values and intervals within what the quantities can be, and their flags: the one rule
    of ``clipped``, ``few-records`` and ``uninformative`` (:data:`FLAGS`), read by ``explore``
    (:func:`_bounded_flags`) and ``rank-owners``
    (:func:`dpmarket.consumer.catalogue.Ranking.rows`).

    A value outside the possible range is clipped silently when its interval still reaches the
    range (the noise or the bias bound explains it), and flagged ``clipped`` when it does not;
    an interval wider than :data:`UNINFORMATIVE` of the range is flagged ``uninformative``; a
    count estimate with a relative standard error above :data:`FEW_RECORDS`, ``few-records``
    (at most one per value; the caller passes 0 for an interval exact in the count's noise,
    :func:`dpmarket.common.sketches.intervals.ratio_interval`). ``clipped`` is on the interval
    (the whole interval is impossible: it missed), and so is ``few-records`` (the interval
    plugs in a count estimate that is known within 20 % or worse); ``uninformative`` is on the
    value: a wide interval still covers, and cutting it to what the quantity can be never
    removes the truth. ``noise_width``, shape (k,), is what the noise alone spreads each value
    over (:func:`_noise_floor`): an interval the cut leaves narrower keeps that width, from
    the edge it was cut at, inwards (:func:`~dpmarket.common.uncertainty.cut_keeping_noise`),
    and ``uninformative`` is
    judged on the wider of the interval before the cut and the one returned. A value outside
    its returned interval is moved to its nearest end (the raw estimate is kept beside it).

    Parameters
    ----------
    raw, raw_low, raw_high : ndarray of shape (k,)
        The estimates and their intervals before any cut, in the quantities' units.
    low, high : ndarray of shape (k,)
        What each quantity can be, whatever the data (infinite where nothing bounds it).
    what : sequence of k str
        That range in words, for the flags' reasons (e.g. ``"[0, 1] (a fraction)"``).
    count_rse : float
        The record count estimate's relative standard error (0: the intervals need no count).
    noise_width : ndarray of shape (k,), optional

    Returns
    -------
    values, interval_low, interval_high : ndarray of shape (k,)
    flags : tuple of k tuples of Flag
    """
    k = raw.shape[0]
    values = np.clip(raw, low, high)
    lo, hi = cut_keeping_noise(raw_low, raw_high, low, high, noise_width)
    # A value outside its own interval (a plug-in ratio over a count estimate near 1, outside
    # the test-inverted interval: a 67-record owner's mean lotSize, raw -1994, shown as 0 beside
    # [12.68, 20]) is moved to the interval's nearest end, the raw estimate kept.
    values = np.clip(values, lo, hi)
    flags: list[tuple[Flag, ...]] = []
    span = high - low
    # Judged on the interval before it is cut to the possible range: cutting a wild estimate's
    # interval at a bound makes it narrow, and exactly those would otherwise pass unflagged;
    # and on the interval shown, when the noise's width made it wider ([0, 20] from [12.68,
    # 20] passed unflagged): _uninformative.
    raw_width = raw_high - raw_low
    # Round-off is not an impossible estimate: a marginal's cell fractions that sum to 1 read
    # 1 + 2e-16, flagged ``clipped`` beside an interval that held the truth (a stranger's
    # P[price <= 300000] at the column's upper bound).
    slack = 1e-9 * np.where(np.isfinite(span), np.maximum(span, 1.0), 1.0)
    for j in range(k):
        if raw_high[j] < low[j] - slack[j] or raw_low[j] > high[j] + slack[j]:
            flag = _flag(
                "clipped",
                f"clipped to {what[j]}: the raw estimate {raw[j]:.6g} and its whole interval "
                f"[{raw_low[j]:.4g}, {raw_high[j]:.4g}] are impossible",
            )
        elif count_rse > FEW_RECORDS:
            flag = _flag(
                "few-records",
                f"the record count is known within {100 * count_rse:.0f} % only: the noise "
                "dominates every ratio, and the interval's plug-in of the count has no "
                "guarantee",
            )
        else:
            flags.append(_uninformative(raw_width[j], span[j], what[j], float(hi[j] - lo[j])))
            continue
        flags.append((flag,))
    return values, lo, hi, tuple(flags)


def _noise_floor(se: NDArray[np.float64], noise: NDArray[np.float64]) -> NDArray[np.float64]:
    """The width the release's noise alone spreads each value over, shape (k,): the larger of
    the interval's noise share ``q`` (:attr:`~dpmarket.common.sketches.intervals.Bounded.noise`)
    and 1.96 standard errors (the point estimate's own 95 % half-width; ``q`` is not that where
    the interval was test-inverted, :func:`~dpmarket.common.sketches.intervals.ratio_interval`,
    and is cut there already). NaN and negative inputs count as 0."""
    floor = np.maximum(np.nan_to_num(noise, nan=0.0), Z95 * np.nan_to_num(se, nan=0.0))
    return np.maximum(floor, 0.0)


def _uninformative(
    width: float, span: float, what: str, shown: float | None = None
) -> tuple[Flag, ...]:
    """The one rule of ``uninformative``
    (:func:`dpmarket.common.uncertainty.uninformative_flag`) at :data:`UNINFORMATIVE`."""
    return uninformative_flag(width, span, what, shown, UNINFORMATIVE)


def _outside(
    raw: float, interval: NDArray[np.float64], low: float, high: float, what: str
) -> tuple[Flag, ...]:
    """``(clipped,)`` when a value's whole interval, ``[interval[0], interval[1]]`` before
    the cut, lies outside what the value can be, ``[low, high]`` (``what``): it has missed;
    ``()`` otherwise (a raw estimate outside the range whose interval reaches it is clipped
    silently, as :func:`_bounded_flags` does)."""
    if interval[1] >= low and interval[0] <= high:
        return ()
    return (
        _flag(
            "clipped",
            f"clipped to {what}: the raw estimate {raw:.6g} and its whole interval "
            f"[{interval[0]:.4g}, {interval[1]:.4g}] are impossible",
        ),
    )


def _cut_flags(
    flags: Sequence[tuple[Flag, ...]],
    raw: NDArray[np.float64],
    bounds: NDArray[np.float64],
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    possible: tuple[NDArray[np.float64], NDArray[np.float64], list[str]],
) -> tuple[tuple[Flag, ...], ...]:
    """``flags`` with, per value, ``clipped`` where its whole interval ``bounds[v]`` (shape
    (k, 2), before the cut) lies outside what it can be (:func:`_outside`; ``possible`` as
    :func:`_possible` returns it) and ``uninformative`` judged on that interval and on the one
    shown, ``[low, high]`` (:func:`_uninformative`)."""
    p_low, p_high, what = possible
    return tuple(
        (
            *f,
            *_outside(float(raw[v]), bounds[v], float(p_low[v]), float(p_high[v]), what[v]),
            *_uninformative(
                float(bounds[v, 1] - bounds[v, 0]),
                float(p_high[v] - p_low[v]),
                what[v],
                float(high[v] - low[v]),
            ),
        )
        for v, f in enumerate(flags)
    )


def _public_covers(query: Query, exact: float) -> str:
    """How a CDF or count the public domain settles is known (basis ``public``), in words:
    every record lies within the declared bounds, so the predicate holds every record
    (``exact`` 1) or none (0); one text for every sketch kind."""
    several = query.kind == "count" and len({c for c, _, _ in query.where}) > 1
    return (
        f"exact: every record lies within the {'columns' if several else 'column'}' declared "
        "bounds, so the predicate holds "
        + ("every record" if exact == 1.0 else "no record")
        + " whatever the data; no noise enters"
    )


def _guess_flags(
    flags: Sequence[tuple[Flag, ...]],
    stated: Sequence[tuple[str, str]],
    reasons: Sequence[str | None] | None = None,
) -> tuple[tuple[Flag, ...], ...]:
    """``flags`` with ``model-guess`` on the value added where the basis is ``bounds``: there
    the value inside the bounds is a guess (``reasons[v]``, a guess inside a histogram bin,
    where given; else the independence guess), while its interval holds whatever the joint
    and wherever the records lie in a bin (so it still covers)."""
    independence = (
        "the independence guess: one histogram per column does not hold these columns "
        "together; the interval is bounds that hold whatever the joint"
    )
    why = list(reasons) if reasons is not None else [None] * len(flags)
    return tuple(
        (_flag("model-guess", r or independence), *f) if b == "bounds" else f
        for f, (b, _), r in zip(flags, stated, why, strict=True)
    )


def _logreg_reason(histogram: bool, refits: int | None) -> str:
    """Why a logistic regression's interval is flagged ``unbounded``, in words: what is not
    bounded, and what the interval is (``refits`` successful refits behind it; ``None``: no
    interval asked for)."""
    if refits is None:
        interval = "no interval was computed (errors off)"
    elif refits > 1:
        interval = (
            f"the interval, value ± 1.96 × the spread of {refits} refits to fresh draws of "
            "the release's noise, covers that noise only"
        )
    else:
        interval = "no interval: fewer than two refits to fresh draws of the noise could be fitted"
    if histogram:
        return (
            "not identified: one histogram per column holds no relation between the label and "
            "the features, so the fit is the synthetic design's independence guess whatever "
            f"the records; {interval}"
        )
    return (
        "M2M's residual range bounds averages of the records only; a logistic regression's "
        "coefficients solve a nonlinear equation in the re-weighted synthetic points, and the "
        "fit's approximation error and shrinkage towards the prior move them by an amount the "
        f"release does not bound; {interval}"
    )


def m2m_target(query: Query, domain: Domain) -> tasks.Target | None:
    """The target function of a query M2M answers linearly, or ``None`` (covariance, logreg)."""
    if query.kind in ("mean", "moment2"):
        return tasks.moment_function(1 if query.kind == "mean" else 2, _columns(query, domain))
    if query.kind == "cdf":
        idx = _columns(query, domain)
        return tasks.cdf_function(_thresholds(query, domain, idx), idx)
    if query.kind == "count":
        lower, upper = _bounds(query, domain)
        return tasks.range_function(lower, upper)
    return None


def _face_points(query: Query, domain: Domain, points: NDArray[np.float64]) -> NDArray[np.float64]:
    """The design's ``points`` moved into each set of a CDF or count that fewer than
    :data:`SET_DESIGN_POINTS` of them reach but that may hold records: shape (n_sets * n_s, d),
    empty when there is none.

    A set no design point reaches has measure 0 where one of its continuous columns is held to
    a single value within the domain: an equality (``education = 12``: an integer column is
    continuous in the domain) or a threshold at a column's lower bound (``hours <= 0`` where
    ``hours >= 0``); a set only a few reach is a small box, e.g. two thresholds just above
    their columns' lower bounds (``stobacco <= 0.0005 and salcohol <= 0.047``: 2e-5 of the
    domain, where most of a table's records may sit at a point mass). Records may sit there, no
    design point does, so M2M's fit and residual there are never seen (the residual's range
    read 0 there and the interval ``[0, 0]`` for a truth of 0.6); these points are (each
    predicated continuous column clipped into the set's range within the domain; discrete
    columns keep the design's levels) domain points in that set, over which
    :func:`dpmarket.consumer.intervals.m2m_bounded` takes the residual's range too. Other sets
    keep the design's own points (the design samples them)."""
    boxes: list[dict[int, tuple[float, float]]] = []
    if query.kind == "cdf":
        idx = _columns(query, domain)
        for j, row in zip(idx, _thresholds(query, domain, idx), strict=True):
            boxes.extend({int(j): (-math.inf, float(t))} for t in row)
    elif query.kind == "count":
        lower, upper = _bounds(query, domain)
        boxes.append(
            {
                int(j): (float(lower[0, j]), float(upper[0, j]))
                for j in np.flatnonzero(np.isfinite(lower[0]) | np.isfinite(upper[0]))
            }
        )
    out = []
    for box in boxes:
        ranges = {
            j: (max(lo, float(domain.low[j])), min(hi, float(domain.high[j])))
            for j, (lo, hi) in box.items()
            if domain.level_values(j) is None
        }
        if any(a > b for a, b in ranges.values()):  # empty within the domain: f is 0 there
            continue
        inside = np.ones(points.shape[0], dtype=bool)
        for j, (a, b) in box.items():
            inside &= (points[:, j] >= a) & (points[:, j] <= b)
        if int(inside.sum()) >= SET_DESIGN_POINTS:
            continue
        face = points.copy()
        for j, (a, b) in ranges.items():
            face[:, j] = np.clip(face[:, j], a, b)
        out.append(face)
    return np.concatenate(out) if out else np.zeros((0, domain.n_attributes))


def m2m_standard_errors(est: M2MEstimator, target: tasks.Target) -> NDArray[np.float64]:
    """Standard errors of M2M estimates from the sketch's public noise scales.

    The estimate is ``a0 + <a, z_hat>`` with ``z_hat = (S + xi) / n_hat``: linear in the noise
    ``xi`` of the sum, so its variance given the count is ``sigma_xi^2 ||a||^2 / n_hat^2``;
    the count's noise ``zeta`` scales ``<a, z_hat>`` by ``n / n_hat``, adding (first order)
    ``<a, z_hat>^2 sigma_zeta^2 / n_hat^2``. Where ``n_hat`` is the combined count of a
    one-hot map (:meth:`Explorer.estimator`, ``n_hat = w_c (n + zeta) + <w_s, S + xi>``,
    :func:`~dpmarket.common.sketches.intervals.count_weights`), both enter it to first order:
    ``(sigma_xi^2 ||a - <a, z_hat> w_s||^2 + <a, z_hat>^2 w_c^2 sigma_zeta^2) / n_hat^2``.

    Parameters
    ----------
    est : M2MEstimator
    target : callable
        ``f(points)``, shape (n_s,) or (n_s, k).

    Returns
    -------
    ndarray of shape (k,), float64

    Notes
    -----
    Only public values enter (``sigma_xi``, ``sigma_zeta``, ``n_hat``, ``a``), so the error
    itself is post-processing. It covers the noise, not M2M's approximation bias.
    """
    values = target(est.points)
    a, a0 = est.coefficients(values)
    sketch = est.sketch
    n_hat = est.n_hat
    linear = np.atleast_1d(np.asarray(est.estimate_values(values), dtype=np.float64)) - a0
    w_count, w_sums, _ = count_weights(sketch)
    combined = float(count_estimate(sketch, *release_totals(sketch))[0][0])
    if w_sums is not None and n_hat == combined:
        # n_hat = w_count * count + <w_sums, sum> (a one-hot map's combined count): the sum's
        # noise enters through n_hat too.
        a = a - np.outer(w_sums, linear)
    else:
        w_count = 1.0
    variance = sketch.sum_noise_variance * (a * a).sum(axis=0) + (linear * w_count) ** 2 * (
        sketch.count_noise_variance
    )
    return np.asarray(np.sqrt(variance) / n_hat, dtype=np.float64)


def _perturbed(sketch: SketchLike, rng: np.random.Generator) -> SketchLike:
    """The sketch with a fresh draw of its own noise added (parametric bootstrap)."""
    if isinstance(sketch, SketchUnion):
        return merge_sketches([_perturbed_part(p, rng) for p in sketch.parts])
    assert isinstance(sketch, PrivateSketch)
    return _perturbed_part(sketch, rng)


def _perturbed_part(sketch: PrivateSketch, rng: np.random.Generator) -> PrivateSketch:
    mech = sketch.mechanism
    assert mech.sum_scale is not None and mech.count_scale is not None
    m = sketch.noisy_sum.shape[0]
    if mech.mechanism == "laplace":
        xi, zeta = rng.laplace(0.0, mech.sum_scale, m), rng.laplace(0.0, mech.count_scale)
    else:
        xi, zeta = rng.normal(0.0, mech.sum_scale, m), rng.normal(0.0, mech.count_scale)
    return PrivateSketch(mech, sketch.noisy_sum + xi, sketch.noisy_count + zeta)


class Explorer:
    """M2M answers for the sketches of one spec, from one synthetic design.

    Parameters
    ----------
    spec : SketchSpec
        Its map and domain define the design; every sketch answered must have been made under it.
    n_synthetic : int
        Synthetic points ``n_s`` (default :data:`DEFAULT_EXPLORE_SYNTHETIC`).
    seed : int
        Seed of the synthetic points (the consumer's own randomness; module docstring).
    lambda_rule : {"theorem", "paper"} or float
        M2M's ridge parameter (:func:`dpmarket.common.sketches.m2m.regularization`).
    intercept : bool
        Fit an unpenalized constant (:class:`dpmarket.common.sketches.m2m.M2MEstimator`).

    Notes
    -----
    The design costs one featurization of ``n_s`` points and one Gram matrix (``m^2``); each
    sketch then costs one Cholesky solve per lambda, and each query a product with the design.
    """

    def __init__(
        self,
        spec: SketchSpec,
        *,
        n_synthetic: int = DEFAULT_EXPLORE_SYNTHETIC,
        seed: int = 0,
        lambda_rule: LambdaRule | float = DEFAULT_LAMBDA_RULE,
        intercept: bool = False,
    ) -> None:
        self.spec = spec
        self.seed = int(seed)
        self.lambda_rule = lambda_rule
        self.intercept = bool(intercept)
        self.n_synthetic = int(n_synthetic)

    @functools.cached_property
    def design(self) -> SyntheticDesign:
        """The synthetic design (``n_synthetic`` points drawn from the spec's domain with the
        explorer's seed), drawn when first read: a histogram's means, moments, CDFs, counts and
        covariances are read from its bins and never draw it."""
        return SyntheticDesign.draw(
            self.spec.feature_map,
            self.spec.domain,
            np.random.default_rng(self.seed),
            n_synthetic=self.n_synthetic,
        )

    @property
    def domain(self) -> Domain:
        """The spec's domain."""
        return self.spec.domain

    def _check(self, sketch: SketchLike) -> None:
        """Check that every part of ``sketch`` was made under the spec
        (:meth:`SketchSpec.check_sketch`; InvalidArgumentError if not)."""
        for part in getattr(sketch, "parts", (sketch,)):
            if isinstance(part, PrivateSketch):
                self.spec.check_sketch(part)

    def estimator(self, sketch: SketchLike) -> M2MEstimator:
        """An M2M estimator of ``sketch`` (one owner's or a union) on the shared design, dividing
        by the one record count every answer from the release states (:func:`record_count`:
        the noisy count combined with every one-hot block's total, HIST and RACE; the noisy
        count alone, RFF), as the bounded answers' point and interval do.

        Raises
        ------
        InvalidArgumentError
            If a sketch was not made under the spec.
        """
        self._check(sketch)
        return self._estimator(sketch)

    def _estimator(self, sketch: SketchLike) -> M2MEstimator:
        n_hat, _ = count_estimate(sketch, *release_totals(sketch))
        return M2MEstimator(
            sketch,
            design=self.design,
            lambda_rule=self.lambda_rule,
            intercept=self.intercept,
            n_hat=float(n_hat[0]),
        )

    def answer(
        self,
        query: Query,
        sketch: SketchLike | M2MEstimator,
        *,
        errors: bool = True,
        replicates: int | None = None,
    ) -> Answer:
        """The estimate of ``query`` on the sketched data, with its interval and flags.

        Means, moments, CDFs, counts and covariances (:mod:`dpmarket.consumer.intervals`, where
        each construction is stated): from a HIST sketch, read from the bins; from an RFF or
        RACE sketch, by M2M with an unpenalized intercept. Either way the 95 % interval is
        ``[L_hat - q, U_hat + q]``: bounds ``[L, U]`` on the quantity that hold whatever the
        records (the binning bound, Fréchet or Cauchy-Schwarz bounds for what one histogram per
        column does not identify, M2M's residual range for its fit and shrinkage), widened by
        ``q``, the 95 % quantile of their noise over ``replicates`` draws of the release's
        public noise law (generator seeded from :attr:`seed`). The standard error is the point
        estimate's spread over the same draws. Values and intervals are cut to what the
        quantity can be; flags (:data:`FLAGS`): ``clipped`` (impossible even allowing for the
        interval), ``uninformative`` (the interval spans more than half of what the value can
        be), ``few-records`` (the count estimate's relative error exceeds 20 % and the bounds
        are not a ratio over the count). Where the count is known within 20 % or worse and the
        bounds are ratios of linear functionals of the release over the count (every M2M mean,
        moment, CDF and count; a histogram's one-column ones), the interval instead inverts a
        test whose statistic's law is the public noise's, count included (Fieller's
        construction, :func:`dpmarket.common.sketches.intervals.ratio_interval`): exact for
        every data set, however noisy the count, and usually flagged ``uninformative``.
        A CDF or count the declared bounds settle is exact, from every sketch kind (basis
        ``public``, standard error 0, interval ``[v, v]``, no flag: :meth:`_settled`): a CDF at
        or above a column's upper bound (1) or below its lower bound (0), a count whose
        predicates hold every value a record can take (1) or none on some column (0). A
        predicate meeting the domain only at its edge (``P[x <= low]``, where records may sit
        at the bound) is not settled: a histogram's that meets a bin only at its edge is a
        guess inside that bin (basis ``bounds``, flagged ``model-guess``, no standard error),
        and so is M2M's that meets the domain only at an edge of a continuous column (the face
        ``x = low``, on which its continuous fit puts no mass: :meth:`_at_edge`), its interval
        M2M's residual range over that face too (:func:`_face_points`).

        A logistic regression is fitted by implicit M2M with the explorer's lambda rule and
        intercept; its errors are the spread over :data:`M2M_BOOTSTRAP` // 2 refits to the
        sketch with its noise drawn again; its bias is not bounded, so every coefficient is
        flagged ``unbounded``. Its fit and its refits divide by the combined record count of
        their release (:meth:`estimator`: its embedding, ridge parameter and weights' total),
        the ``n`` the other answers and the stated record count take (:func:`record_count`);
        an estimator passed in is fitted as it was made.

        Parameters
        ----------
        query : Query
        sketch : PrivateSketch, SketchUnion or M2MEstimator
            An estimator's sketch is used (its lambda and intercept only for ``logreg``).
        errors : bool
            ``False``: point estimates only (no interval, no noise replicates).
        replicates : int, optional
            Noise replicates behind an interval (default 1,000).

        Raises
        ------
        InvalidArgumentError
            For an unknown column, a target that is not a two-level column, or a sketch not made
            under the spec.
        ValueError
            If the implicit-M2M weights cannot fit a logistic regression (e.g. no positive
            weight for one class).
        """
        if query.kind in ("marginal", "synthetic"):
            raise InvalidArgumentError(f"{query.kind} needs a marginals sketch, not M2M")
        if query.kind != "logreg":  # no estimator: a histogram's answer needs no design
            if isinstance(sketch, M2MEstimator):
                plain = sketch.sketch  # an estimator's sketch is taken as given
            else:
                self._check(sketch)
                plain = sketch
            return self._bounded(query, plain, errors=errors, replicates=replicates)
        est = sketch if isinstance(sketch, M2MEstimator) else self.estimator(sketch)
        raw = self._estimate(query, est)
        domain = self.domain
        se = np.full(raw.values.shape, np.nan)
        draws: list[NDArray[np.float64]] = []
        if errors:
            rng = np.random.default_rng([self.seed, 1])
            for _ in range(M2M_BOOTSTRAP // 2):
                again = self._estimator(_perturbed(est.sketch, rng))
                try:
                    draws.append(self._estimate(query, again).values)
                except ValueError:  # a replicate whose weights cannot fit a model
                    continue
            if len(draws) > 1:
                se = np.std(np.array(draws), axis=0, ddof=1)
        k = raw.values.shape[0]
        basis, covers = interval_basis(self.spec.kind, "logreg", 0)
        reason = _logreg_reason(
            isinstance(self.spec.feature_map, HISTMap), len(draws) if errors else None
        )
        return Answer(
            query,
            raw.labels,
            raw.values,
            dict(raw.extra),
            errors=se,
            columns=_value_columns(query, domain),
            flags=((_flag("unbounded", reason),),) * k,
            raw=raw.values,
            source=f"{self.spec.name} (M2M)",
            basis=(basis,) * k,
            covers=(covers,) * k,
        )

    def _bounded(
        self, query: Query, sketch: SketchLike, *, errors: bool, replicates: int | None
    ) -> Answer:
        """Means, moments, CDFs, counts, covariances: bias-bounded intervals (:meth:`answer`)."""
        domain = self.domain
        rng = np.random.default_rng([self.seed, 4])
        reps = (replicates or DEFAULT_REPLICATES) if errors else 2
        labels = _labels(query, domain)
        idx = _columns(query, domain) if query.kind != "count" else np.zeros(0, dtype=np.int64)
        extra: dict[str, Any] = {}
        n_hat, n_var = count_estimate(sketch, *release_totals(sketch))
        n = float(n_hat[0])
        k = len(labels)
        count_rse = math.sqrt(n_var) / n
        # A poorly known count: where the bounds are ratios over the count, an interval exact in
        # the count's noise (consumer.intervals) rather than the plug-in and a few-records flag.
        span = _possible(query, domain, k)[:2] if errors and count_rse > FEW_RECORDS else None
        if isinstance(self.spec.feature_map, HISTMap):
            bounded, n_columns = self._hist(query, sketch, rng, idx, reps, span)
            source = f"{self.spec.name} (histogram)"
        else:
            bounded, lam = self._m2m(query, sketch, rng, idx, reps, span)
            extra["lambda"] = lam.tolist()
            source, n_columns = f"{self.spec.name} (M2M)", idx.size
        if errors:
            values, low, high, flags = _bounded_flags(
                query,
                domain,
                bounded.value,
                bounded.low,
                bounded.high,
                0.0 if bounded.count_free else count_rse,
                _noise_floor(bounded.se, bounded.noise),
            )
            se, bias = bounded.se, bounded.bias
        else:
            values, flags = _clip(query, domain, bounded.value)
            low = high = np.zeros(0)
            se, bias = np.full(k, np.nan), np.full(k, np.nan)
        stated = self._stated(query, idx, n_columns, k)
        if bounded.count_free:  # the count's noise taken exactly (ratio_interval)
            stated = [
                (b, f"{c}; the count's noise included exactly (Fieller's test inversion)")
                for b, c in stated
            ]
        se, bias = se.copy(), bias.copy()
        public, guesses = self._settle(
            query, idx, stated, values, (low, high) if errors else None, (se, bias)
        )
        # A value the declared bounds settle has no flag: its interval is the value itself.
        flags = tuple(() if e is not None else f for f, e in zip(flags, public, strict=True))
        # A guess (basis "bounds", flagged model-guess) has no standard error: its error is the
        # guess's bias, which only its bounds hold (as a marginals guess's).
        se = np.where([b == "bounds" for b, _ in stated], np.nan, se)
        if query.kind == "count":
            counted = bounded.count if errors else None
            extra.update(self._count_extra(sketch, counted, float(values[0]), se[0], n, public[0]))
        return Answer(
            query,
            labels,
            values,
            extra,
            errors=se,
            columns=_value_columns(query, domain),
            flags=_guess_flags(flags, stated, guesses),
            raw=bounded.value,
            source=source,
            low=low,
            high=high,
            bias=bias,
            basis=tuple(b for b, _ in stated) if errors else (),
            covers=tuple(c for _, c in stated) if errors else (),
        )

    def _count_extra(
        self,
        sketch: SketchLike,
        counted: tuple[float, float] | None,
        fraction: float,
        se: float,
        n: float,
        exact: float | None,
    ) -> dict[str, Any]:
        """A count answer's ``count`` (``fraction`` times the record count ``n``), ``n``,
        ``count_standard_error`` (``se`` times ``n``; None for a guess) and, with the count's
        interval (``counted``, in records; None: no interval asked for), ``count_interval`` and
        ``n_interval``. Where the declared bounds settle the fraction (``exact``,
        :meth:`_settled`): 0 records exactly (``[0, 0]``, standard error 0), or every record,
        ``n`` with ``n``'s interval and no standard error of its own (as
        :meth:`MarginalsExplorer._count_extra` states it)."""
        count = fraction * n
        count_se = None if math.isnan(se) else float(se) * n
        if exact == 1.0:
            count_se = None
        extra: dict[str, Any] = {"count": count, "n": n, "count_standard_error": count_se}
        if counted is None:
            return extra
        # The release's one record count and interval, as every answer from this sketch
        # states it (record_count): replicates of their own, not this query's.
        _, n_low, n_high = record_count(sketch, self.seed)
        extra["n_interval"] = [n_low, n_high]
        if exact is not None:
            extra["count_interval"] = [0.0, 0.0] if exact == 0.0 else [n_low, n_high]
        else:
            # The count's own interval (the noise of the sums and of n together), widened to
            # hold the count estimate (which only adds coverage).
            c_low, c_high = counted
            extra["count_interval"] = [min(c_low, count), max(c_high, count)]
        return extra

    def _hist(
        self,
        query: Query,
        sketch: SketchLike,
        rng: np.random.Generator,
        idx: NDArray[np.int64],
        reps: int,
        span: tuple[NDArray[np.float64], NDArray[np.float64]] | None,
    ) -> tuple[Bounded, int]:
        """A histogram's bounded answer (:func:`dpmarket.consumer.intervals.hist_bounded`) and
        the number of columns the value is about (a count's predicated columns)."""
        domain = self.domain
        fmap = self.spec.feature_map
        assert isinstance(fmap, HISTMap)
        predicates: dict[int, tuple[float, float]] = {}
        if query.kind == "count":
            lower, upper = _bounds(query, domain)
            for j in np.flatnonzero(np.isfinite(lower[0]) | np.isfinite(upper[0])):
                predicates[int(j)] = (float(lower[0, j]), float(upper[0, j]))
        bounded = hist_bounded(
            query.kind,
            fmap,
            domain,
            sketch,
            rng,
            columns=idx,
            thresholds=_thresholds(query, domain, idx) if query.kind == "cdf" else None,
            predicates=predicates,
            replicates=reps,
            span=span,
        )
        return bounded, len(predicates) if query.kind == "count" else idx.size

    def _m2m(
        self,
        query: Query,
        sketch: SketchLike,
        rng: np.random.Generator,
        idx: NDArray[np.int64],
        reps: int,
        span: tuple[NDArray[np.float64], NDArray[np.float64]] | None,
    ) -> tuple[Bounded, NDArray[np.float64]]:
        """An RFF or RACE sketch's bounded answer by M2M
        (:func:`dpmarket.consumer.intervals.m2m_bounded`) and each value's ridge parameter."""
        if query.kind == "covariance":
            return m2m_bounded(
                "covariance",
                self.design,
                sketch,
                rng,
                columns=idx,
                lambda_rule=self.lambda_rule,
                replicates=reps,
                span=span,
                column_bounds=(self.domain.low[idx], self.domain.high[idx]),
            )
        target = m2m_target(query, self.domain)
        assert target is not None
        values = np.asarray(target(self.design.points), dtype=np.float64)
        faces = _face_points(query, self.domain, self.design.points)
        probes = None
        if faces.shape[0]:
            at = np.asarray(target(faces), dtype=np.float64)
            probes = (faces, at.reshape(at.shape[0], -1))
        return m2m_bounded(
            "linear",
            self.design,
            sketch,
            rng,
            values=values.reshape(values.shape[0], -1),
            lambda_rule=self.lambda_rule,
            replicates=reps,
            span=span,
            probes=probes,
            count=query.kind == "count",
        )

    def _settle(
        self,
        query: Query,
        idx: NDArray[np.int64],
        stated: list[tuple[str, str]],
        values: NDArray[np.float64],
        interval: tuple[NDArray[np.float64], NDArray[np.float64]] | None,
        spread: tuple[NDArray[np.float64], NDArray[np.float64]],
    ) -> tuple[list[float | None], list[str | None]]:
        """The values the declared bounds settle (:meth:`_settled`), for every sketch kind,
        and the guesses at an edge (a histogram's inside a bin, M2M's on a face of the domain),
        set in place in ``stated``, ``values``, the interval's ``(low, high)`` (None: no
        interval) and ``spread`` ``(se, bias)`` (each of k values). Returns per value the
        settled value or None, and the ``model-guess`` reason or None."""
        settled = self._settled(query, idx)
        guesses: list[str | None] = [None] * len(stated)
        covers, reason = _EDGE_GUESS[
            "hist" if isinstance(self.spec.feature_map, HISTMap) else "m2m"
        ]
        # What the domain fixes is exact (basis public, as the marginals kind answers it); a
        # predicate meeting a bin (or, from M2M, the domain) only at an edge is a guess there:
        # P[x <= low] reads the records at exactly the lower bound as none of the lowest bin
        # (of M2M's continuous fit), its interval unchanged.
        for v, (exact, edge) in enumerate(settled):
            if exact is not None:
                values[v] = exact
                stated[v] = ("public", _public_covers(query, exact))
                spread[0][v], spread[1][v] = 0.0, 0.0
                if interval is not None:
                    interval[0][v], interval[1][v] = exact, exact
            elif edge:
                stated[v] = ("bounds", covers)
                guesses[v] = reason
        return [e for e, _ in settled], guesses

    def _settled(self, query: Query, idx: NDArray[np.int64]) -> list[tuple[float | None, bool]]:
        """Per value, ``(exact, edge)``: ``exact`` the value where the public domain fixes it,
        whatever the records and the sketch kind
        (:func:`~dpmarket.common.sketches.intervals.domain_range`), else None: a CDF or count
        whose predicates hold every value a record can take (1) or, on some column, none (0).
        Means, moments and covariances are never settled: a declared column holds two values
        or more (``low < high``, two levels or more). ``edge`` whether a histogram's CDF or
        one-column count meets a bin only at an edge
        (:func:`~dpmarket.common.sketches.intervals.bin_ranges` gives that bin least value 0,
        largest 1, and its uniform reading 0 or 1: a ``<=`` threshold at a bin's lower edge),
        so the value is a guess inside that bin, or whether an RFF's or RACE's CDF or count
        meets the domain only at an edge on some column (:meth:`_at_edge`); False for other
        kinds and a histogram's counts over several columns (Fréchet bounds already,
        :func:`interval_basis`)."""
        domain = self.domain
        if query.kind == "cdf":
            per_value = [
                {int(j): BinTarget("indicator", high=float(t))}
                for j, row in zip(idx, _thresholds(query, domain, idx), strict=True)
                for t in row
            ]
        elif query.kind == "count":
            lower, upper = _bounds(query, domain)
            cols = np.flatnonzero(np.isfinite(lower[0]) | np.isfinite(upper[0]))
            per_value = [
                {
                    int(j): BinTarget("indicator", low=float(lower[0, j]), high=float(upper[0, j]))
                    for j in cols
                }
            ]
        else:
            return [(None, False)] * len(_labels(query, domain))
        out: list[tuple[float | None, bool]] = []
        for targets in per_value:
            ranges = [domain_range(domain, j, t)[:2] for j, t in targets.items()]
            if any(r == (0.0, 0.0) for r in ranges):
                out.append((0.0, False))
            elif all(r == (1.0, 1.0) for r in ranges):
                out.append((1.0, False))
            else:
                out.append((None, self._at_edge(targets)))
        return out

    def _at_edge(self, targets: Mapping[int, BinTarget]) -> bool:
        """Whether a CDF's or count's indicator ``targets`` (per column) meet what a column's
        records can hold only at an edge (:meth:`_settled`): least value 0, largest 1, and the
        uniform reading 0 or 1. For a histogram, a bin of its one column
        (:func:`~dpmarket.common.sketches.intervals.bin_ranges`; several columns: False, their
        Fréchet bounds are a guess already). For an RFF or RACE sketch, the whole domain of
        some column read as one bin (:func:`~dpmarket.common.sketches.intervals.domain_range`):
        a continuous or integer column (continuous in M2M's design) held to one value
        (``x <= low``, where records may pile up at the bound), so the set is a face of measure
        0 on which M2M's continuous fit puts no mass (its residual's range over that face,
        :func:`_face_points`, keeps the interval)."""
        fmap = self.spec.feature_map
        if isinstance(fmap, HISTMap):
            if len(targets) != 1:
                return False
            # (least, largest, uniform reading) per bin: shape (3, n_bins), one array a column
            ranges = [np.array(bin_ranges(fmap, self.domain, j, t)) for j, t in targets.items()]
        else:
            # M2M's uniform design reads an integer column as continuous (Domain.sample_uniform):
            # ``x <= low`` there is a face of measure 0 too.
            design = dataclasses.replace(self.domain, integers=())
            ranges = [np.array(domain_range(design, j, t))[:, None] for j, t in targets.items()]
        return any(
            bool(((low < high) & ((mid == low) | (mid == high))).any()) for low, high, mid in ranges
        )

    def _stated(
        self, query: Query, idx: NDArray[np.int64], n_columns: int, k: int
    ) -> list[tuple[str, str]]:
        """Per value, its interval's basis and construction
        (:func:`dpmarket.consumer.intervals.interval_basis`)."""
        if query.kind == "covariance":
            rows, cols = np.triu_indices(idx.size)
            return [
                interval_basis(self.spec.kind, "covariance", 1 if a == b else 2)
                for a, b in zip(rows, cols, strict=True)
            ]
        return [interval_basis(self.spec.kind, query.kind, n_columns)] * k

    def _estimate(self, query: Query, est: M2MEstimator) -> Answer:
        """A logistic regression's coefficients by implicit M2M (the one query kind that
        reaches an estimator: :meth:`answer` reads every other kind through :meth:`_bounded`).

        Raises
        ------
        ValueError
            For a query that is not ``logreg`` (a programming error: no caller passes one), or
            weights that cannot fit a model.
        """
        if query.kind != "logreg":
            raise ValueError(f"only a logreg query is fitted here, got {query.kind!r}")
        domain = self.domain
        fit = tasks.implicit_logistic_regression(
            est,
            _check_target(query, domain),
            feature_attributes=_features(query, domain).tolist(),
        )
        values = np.concatenate([fit.model.coef_[0], fit.model.intercept_])
        return Answer(query, _labels(query, domain), np.asarray(values, dtype=np.float64), {})


def record_count(sketch: SketchLike, seed: int = 0) -> tuple[float, float, float]:
    """A HIST, RFF or RACE release's record count and its 95 % interval: the one estimate of
    ``n`` that every answer from the release states (a count's ``n``, the ``n ≈`` beside any
    answer, whatever the query).

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
    seed : int
        The consumer's seed (:attr:`Explorer.seed`); the noise replicates are drawn from
        ``default_rng([seed, 5])``, :data:`DEFAULT_REPLICATES` of them, whatever the query.

    Returns
    -------
    (n_hat, low, high)
        Records: :func:`~dpmarket.common.sketches.intervals.count_estimate`'s inverse-variance
        combination of the noisy count and every one-hot block's total (floored at 1), and its
        interval from their noise law
        (:func:`~dpmarket.common.sketches.intervals.record_count_interval`), widened to hold
        ``n_hat``.

    Notes
    -----
    Computed with the replicates of one query's interval (after them), a count's ``n``
    interval differed from the one printed beside the same sketch's other answers by the
    quantile's Monte Carlo error (``[50, 90]`` against ``[49, 90]`` printed for a stranger's
    owner). Seeded here alone, the same release gives the same interval everywhere.
    """
    n_hat, low, high = record_count_interval(sketch, np.random.default_rng([seed, 5]))
    return n_hat, min(low, n_hat), max(high, n_hat)


def record_count_interval_of(
    measurements: Sequence[Sequence[Measurement]], cells: Sequence[int]
) -> tuple[float, float]:
    """The record count's 95 % interval of the union of marginals sketches.

    Parameters
    ----------
    measurements : sequence of sequence of Measurement
        Each owner's noisy marginals (Gaussian noise of public scales).
    cells : sequence of int
        Cells per column.

    Returns
    -------
    (low, high)
        Records: ``sum_s n_s -+ 1.96 sqrt(sum_s sd_s^2)``, ``n_s`` each owner's unbiased
        inverse-variance estimate from every measurement's total
        (:func:`~dpmarket.common.sketches.marginals_bounds.total_count`), cut at 0. Exact: the
        estimate is linear in Gaussian measurements.
    """
    value = sd2 = 0.0
    for ms in measurements:
        n = total_count(ms, cells)
        value += n.value(ms)
        sd2 += n.sd(ms) ** 2
    half = Z95 * math.sqrt(sd2)
    return max(value - half, 0.0), max(value + half, 0.0)


def _cell_label(fmap: MarginalsMap, domain: Domain, column: int, cell: int) -> str:
    name = domain.attribute_name(column)
    levels = domain.level_values(column)
    if levels is not None:
        return f"{name} = {levels[cell]:g}"
    e = fmap.edges(column)
    close = "<=" if cell == e.shape[0] - 2 else "<"
    return f"{e[cell]:.6g} <= {name} {close} {e[cell + 1]:.6g}"


def _marginal_labels(fmap: MarginalsMap, domain: Domain, idx: Sequence[int]) -> tuple[str, ...]:
    cells = [range(int(fmap.cells[j])) for j in idx]
    return tuple(
        "P["
        + ", ".join(_cell_label(fmap, domain, j, c) for j, c in zip(idx, combo, strict=True))
        + "]"
        for combo in itertools.product(*cells)
    )


def sketch_digest(sketch: MarginalsSketch) -> str:
    """SHA-256 (hex) of a marginals sketch's content (:attr:`MarginalsSketch.digest`: every
    measurement's clique, noise scale and noisy values, in order). Two sketches with the same
    digest give the same fitted model."""
    return sketch.digest


#: A cache key: the spec's name and key, the sketch's :func:`sketch_digest`, the bootstrap size,
#: the seed.
ModelKey = tuple[str, str, str, int, int]
#: A sketch's fitted model and its bootstrap models.
Fitted = model_store.Fitted
#: Sketches whose models :data:`MARGINALS_MODELS` keeps (each holds 1 + bootstrap models of at
#: most :data:`~dpmarket.common.sketches.marginals.MAX_MODEL_MB` each)...
MODEL_CACHE_SIZE = 16
#: ...and the bytes of their tables it keeps at most (the most recent sketch is kept whatever
#: its size).
MODEL_CACHE_BYTES = 1 << 30


class ModelCache:
    """Fitted marginals models and their bootstrap refits, kept per sketch content (bounded
    LRU, thread-safe): a second answer on the same sketches, of any query kind, refits nothing.

    The key holds the sketch's content digest (:func:`sketch_digest`), so a new publication
    never reads an old entry; the bootstrap size and the seed, so an entry is exactly what
    :meth:`MarginalsExplorer.models` would compute.

    Parameters
    ----------
    size : int
        Sketches kept (the least recently used is dropped beyond it).
    max_bytes : int
        Bytes of the kept models' tables (:attr:`MarginalsModel.nbytes`) beyond which the least
        recently used are dropped (never the most recent).
    """

    def __init__(self, size: int = MODEL_CACHE_SIZE, max_bytes: int = MODEL_CACHE_BYTES) -> None:
        self.size = int(size)
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[ModelKey, Fitted] = OrderedDict()
        self._bytes: dict[ModelKey, int] = {}
        self._pending: dict[ModelKey, threading.Lock] = {}
        self._lock = threading.Lock()

    def fitted(self, key: ModelKey, compute: Callable[[], Fitted]) -> Fitted:
        """The entry of ``key``, computed by ``compute`` and kept if absent; a thread asking
        for a key another thread is computing waits for that computation instead of repeating
        it (the console's warm-up and its first answer)."""
        found = self.get(key)
        if found is not None:
            return found
        with self._lock:
            pending = self._pending.setdefault(key, threading.Lock())
        try:
            with pending:
                found = self.get(key)
                if found is None:
                    found = compute()
                    self.put(key, found)
        finally:
            with self._lock:
                self._pending.pop(key, None)
        return found

    def get(self, key: ModelKey) -> Fitted | None:
        """The entry of ``key`` (made the most recent), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: ModelKey, fitted: Fitted) -> None:
        """Keep ``fitted`` under ``key``, dropping the least recently used beyond :attr:`size`."""
        size = fitted[0].nbytes + sum(m.nbytes for m in fitted[1])
        with self._lock:
            self._entries[key] = fitted
            self._bytes[key] = size
            self._entries.move_to_end(key)
            while len(self._entries) > 1 and (
                len(self._entries) > self.size or sum(self._bytes.values()) > self.max_bytes
            ):
                old, _ = self._entries.popitem(last=False)
                del self._bytes[old]

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


#: The process's marginals models: every :class:`MarginalsExplorer` reads and fills it (the
#: console's, a long-lived :class:`dpmarket.client.Consumer`'s, successive ``explore`` calls).
MARGINALS_MODELS = ModelCache()
# Held around a marginals fit and its bootstrap (MarginalsExplorer._fit).
_FITTING = threading.Lock()


class _Fractions:
    """Fractions of the union of models' records, each weighted by a product of per-column
    cell weights (:meth:`MarginalsModel.query`), evaluated for any models: the values asking
    one column (a CDF's thresholds, a mean, a second moment) by one product per model and
    column with their weights stacked (the same sums, in the same order, as
    :meth:`MarginalsModel.query`'s), the others by :meth:`MarginalsModel.query`.

    Parameters
    ----------
    weights : sequence of mapping of column to ndarray
        Per value, its cell weights (:meth:`MarginalsExplorer._value_weights`).
    """

    def __init__(self, weights: Sequence[Mapping[int, NDArray[np.float64]]]) -> None:
        self.weights = list(weights)
        self.k = len(self.weights)
        grouped: dict[int, list[int]] = {}
        self.others: list[int] = []
        for v, w in enumerate(self.weights):
            if len(w) == 1:
                grouped.setdefault(next(iter(w)), []).append(v)
            else:
                self.others.append(v)
        self.columns = [
            (j, vs, np.stack([np.asarray(self.weights[v][j], dtype=np.float64) for v in vs]))
            for j, vs in grouped.items()
        ]

    def __call__(self, models: Sequence[MarginalsModel]) -> NDArray[np.float64]:
        """The values, shape (k,), on the union of ``models``' data."""
        total = math.fsum(m.total for m in models)
        out = np.empty(self.k)
        for j, vs, stacked in self.columns:
            # Each row summed as MarginalsModel.query sums its table (the same rounding).
            per_model = [(stacked * m.marginal([j])[None, :]).sum(axis=1) for m in models]
            out[vs] = [math.fsum(parts) / total for parts in zip(*per_model, strict=True)]
        for v in self.others:
            out[v] = math.fsum(m.query(self.weights[v]) for m in models) / total
        return out


class MarginalsExplorer:
    """Graphical-model answers for the marginals sketches of one spec.

    Each owner's sketch gets its own model
    (:class:`dpmarket.common.sketches.marginals.MarginalsModel`, fitted once and kept) and
    :data:`~dpmarket.common.sketches.marginals.DEFAULT_BOOTSTRAP` bootstrap models; a union of
    owners adds their counts (each owner's data keep exactly the guarantee of its own sketch), and
    its bootstrap replicate ``b`` adds the owners' replicates ``b``.

    Parameters
    ----------
    spec : SketchSpec
        A marginals spec; every sketch answered must have been made under it.
    bootstrap : int
        Bootstrap models per sketch (0: no errors).
    seed : int
        The consumer's own randomness (bootstrap noise, synthetic records): answers repeat
        bit for bit.
    cache : ModelCache or None
        Where fitted models are kept across explorers (default :data:`MARGINALS_MODELS`, the
        process's); None: this explorer's own only. Answers are the same either way.
    store : path, optional
        A folder where fitted models are also kept on disk across processes
        (:mod:`dpmarket.consumer.model_store`; the consumer's ``DATA_DIR/explore-models``).
    refit : bool
        Fit every sketch here, even one that carries its owner's fit (``explore --refit``);
        default False: a sketch's published fit
        (:class:`~dpmarket.common.sketches.marginals_fit.MarginalsFit`) is used when it is of
        this sketch and of this explorer's bootstrap size and seed, and its trees pass their
        checks (:meth:`~dpmarket.common.sketches.marginals_fit.MarginalsFit.models`; what that
        trusts is stated there), so no answer waits for a fit.

    Raises
    ------
    InvalidArgumentError
        If ``spec`` is not a marginals spec.
    """

    def __init__(
        self,
        spec: SketchSpec,
        *,
        bootstrap: int = DEFAULT_BOOTSTRAP,
        seed: int = 0,
        cache: ModelCache | None = MARGINALS_MODELS,
        store: str | os.PathLike[str] | None = None,
        refit: bool = False,
    ):
        if not isinstance(spec.feature_map, MarginalsMap):
            raise InvalidArgumentError(f"{spec.name} is a {spec.kind} spec, not a marginals one")
        self.spec = spec
        self.feature_map: MarginalsMap = spec.feature_map
        self.bootstrap = int(bootstrap)
        self.seed = int(seed)
        self.cache = cache
        self.store = None if store is None else Path(store)
        self.refit = bool(refit)
        # Keyed by id(); the sketch is kept alive beside its models so that its id is not reused.
        self._models: dict[int, tuple[MarginalsSketch, MarginalsModel, list[MarginalsModel]]] = {}

    @property
    def domain(self) -> Domain:
        """The spec's domain."""
        return self.spec.domain

    @staticmethod
    def expresses(query: Query, domain: Domain) -> bool:
        """Whether marginals answer ``query`` without approximating a column: counts, CDFs,
        marginal tables and synthetic records; means, second moments and covariances of
        discrete columns only (a continuous column's moments would need its values inside a
        cell: M2M's); never a logistic regression."""
        if query.kind in ("count", "cdf", "marginal", "synthetic"):
            return True
        if query.kind in ("mean", "moment2", "covariance"):
            return all(domain.level_values(int(j)) is not None for j in _columns(query, domain))
        return False

    def models(self, sketch: MarginalsSketch) -> tuple[MarginalsModel, list[MarginalsModel]]:
        """The fitted model of ``sketch`` and its bootstrap models (computed once per sketch
        content, bootstrap size and seed in the process: :attr:`cache`).

        Raises
        ------
        InvalidArgumentError
            If the sketch was not made under the spec.
        """
        found = self._models.get(id(sketch))
        if found is None:
            self.spec.check_sketch(sketch)
            key = self.model_key(sketch)
            if self.cache is None:
                fitted = self._stored_or_fit(sketch, key)
            elif self.refit:  # this explorer's own fit, in place of a published one kept
                fitted = self._stored_or_fit(sketch, key)
                self.cache.put(key, fitted)
            else:
                fitted = self.cache.fitted(key, lambda: self._stored_or_fit(sketch, key))
            found = (sketch, *fitted)
            self._models[id(sketch)] = found
        return found[1], found[2]

    def model_key(self, sketch: MarginalsSketch) -> ModelKey:
        """Under which key ``sketch``'s models are kept (:attr:`cache`, :attr:`store`): the
        spec, the sketch's content, this explorer's bootstrap size and seed."""
        return (self.spec.name, self.spec.key, sketch_digest(sketch), self.bootstrap, self.seed)

    def stored(self, sketch: MarginalsSketch) -> bool:
        """Whether :attr:`store` holds a fit of ``sketch`` made here (its models are read from
        there before any published fit)."""
        return (
            self.store is not None
            and model_store.path_of(self.store, self.model_key(sketch)).exists()
        )

    def published(self, sketch: MarginalsSketch) -> Fitted | None:
        """``sketch``'s published fit as models, when this explorer may use it (not
        :attr:`refit`, the fit of this explorer's bootstrap size and seed) and it passes its
        checks; None otherwise (a fit that fails them is logged and ignored)."""
        fit = carried_fit(sketch)
        if fit is None or self.refit or (fit.bootstrap, fit.seed) != (self.bootstrap, self.seed):
            return None
        try:
            return fit.models(sketch)
        except ValueError as exc:
            logger.warning("%s: the sketch's published fit is not used (%s)", self.spec.name, exc)
            return None

    def _stored_or_fit(self, sketch: MarginalsSketch, key: ModelKey) -> Fitted:
        """``sketch``'s models from :attr:`store` if a fit made here is kept there (one this
        process or an earlier one made, e.g. before a restart: what answers read once it is
        made), else from its published fit (:meth:`published`), else fitted (and kept
        there)."""
        if self.store is not None:
            with _FITTING:
                found = model_store.load(self.store, key, self.feature_map, sketch.measurements)
                free_compiled()
            if found is not None:
                return found
        published = self.published(sketch)
        if published is not None:
            return published
        fitted = self._fit(sketch)
        if self.store is not None:
            model_store.save(self.store, key, fitted)
        return fitted

    def _fit(self, sketch: MarginalsSketch) -> Fitted:
        """Fit ``sketch``'s model and its :attr:`bootstrap` refits
        (:func:`~dpmarket.common.sketches.marginals_fit.fit_sketch`, the procedure an owner's
        published fit follows too; one fit at a time in the process:
        :func:`~dpmarket.common.sketches.marginals.free_compiled` drops every jax executable,
        so it must not run in the middle of another thread's fit)."""
        with _FITTING:
            return fit_sketch(
                self.feature_map, sketch.measurements, bootstrap=self.bootstrap, seed=self.seed
            )

    def answer(self, query: Query, sketches: Sequence[MarginalsSketch]) -> Answer:
        """The graphical models' answer to ``query`` for the union of ``sketches``' owners.

        Parameters
        ----------
        query : Query
            One :meth:`expresses` accepts.
        sketches : sequence of MarginalsSketch
            One per owner (at least one).

        Returns
        -------
        Answer
            Values, standard errors, the columns of each value, and each value's interval,
            basis and flags (:meth:`_intervals`). Where every owner measured a marginal holding
            the value's columns (basis ``measured``) the value is the measured marginals' own
            estimate and its standard error that estimate's noise sd (:meth:`_measured`), the
            estimate the interval is built around; elsewhere it is the graphical model's guess,
            with no standard error, inside bounds that hold whatever the joint (``bounds``,
            flagged ``model-guess`` on the value). So is a count or CDF whose predicate cuts a
            cell of a continuous or integer column (:meth:`_cut_cells`), measured columns or
            not: the value takes the records as spread evenly inside the cell, and the interval
            holds wherever they lie. A count or CDF the public domain fixes is exact (``public``,
            standard error 0, interval ``[v, v]``: :meth:`_public`). Intervals are cut to what
            the value can be
            (:func:`_possible`: a fraction to [0, 1], a mean to the column's bounds, a variance
            to [0, w^2/4], a covariance to -+ w_a w_b/4), keeping at least 1.96 standard errors
            of width from the edge
            (:func:`~dpmarket.common.uncertainty.cut_keeping_noise`); a value outside its
            interval is moved to its nearest end, the estimate kept in ``raw``. An interval spanning
            more than :data:`UNINFORMATIVE` of what the value can be is flagged
            ``uninformative`` on the value, as an M2M or histogram answer's is.

        Raises
        ------
        InvalidArgumentError
            For a query marginals cannot express, an unknown column, or no sketch.
        """
        domain = self.domain
        if not sketches:
            raise InvalidArgumentError("no marginals sketch to answer from")
        if not self.expresses(query, domain):
            raise InvalidArgumentError(
                f"a marginals sketch cannot express {query.kind} of continuous columns or a "
                "logistic regression (M2M answers those)"
            )
        fitted = [self.models(s) for s in sketches]
        if query.kind == "synthetic":
            return self._synthetic(query, [m for m, _ in fitted])
        replicates = min((len(b) for _, b in fitted), default=0)
        # The values' cell weights are the same for every model (the estimate's and each
        # bootstrap replicate's): computed once.
        values_of = self._evaluator(query)
        main = values_of([m for m, _ in fitted])
        draws = [values_of([b[r] for _, b in fitted]) for r in range(replicates)]
        se = (
            np.std(np.array(draws), axis=0, ddof=1)
            if replicates > 1
            else np.full(main.shape, np.nan)
        )
        raw, se, measured, public = self._estimates(query, sketches, main, se)
        k = raw.shape[0]
        possible_low, possible_high, what = _possible(query, domain, k)
        values = np.clip(raw, possible_low, possible_high)
        bounds, basis, covers, flags = self._intervals(query, sketches, values)
        noise = np.isnan(bounds).any(axis=1)
        bounds[noise, 0] = values[noise] - Z95 * se[noise]
        bounds[noise, 1] = values[noise] + Z95 * se[noise]
        # The model's guess over columns no measurement holds together has no standard error:
        # its error is the independence guess's bias, which only its Fréchet bounds hold (the
        # bootstrap's spread of the guess, as small as 1e-46, read as a near-exact value).
        se = np.where(np.array(basis) == "bounds", np.nan, se)
        # Cut to what the value can be (a variance to [0, w^2/4], a covariance to -+ w_a w_b/4,
        # a mean to the column's bounds), keeping the noise's width at the edge, as every
        # other kind's interval is (_bounded_flags).
        low, high = cut_keeping_noise(
            bounds[:, 0], bounds[:, 1], possible_low, possible_high, _noise_floor(se, np.zeros(k))
        )
        values = np.clip(values, low, high)
        flags = _cut_flags(flags, raw, bounds, low, high, (possible_low, possible_high, what))
        total = math.fsum(m.total for m, _ in fitted)
        extra: dict[str, Any] = {}
        if query.kind == "count":
            extra = self._count_extra(
                query, sketches, measured[0], float(values[0]), total, public[0]
            )
        if query.kind == "marginal":
            idx = _index(domain, query.columns).tolist()
            labels = _marginal_labels(self.feature_map, domain, idx)
            columns = (tuple(query.columns),) * len(labels)
        else:
            labels = _labels(query, domain)
            columns = _value_columns(query, domain)
        return Answer(
            query,
            labels,
            values,
            extra,
            errors=se,
            columns=columns,
            flags=flags,
            raw=raw,
            source=f"{self.spec.name} (graphical model)",
            low=low,
            high=high,
            basis=basis,
            covers=covers,
        )

    def _estimates(
        self,
        query: Query,
        sketches: Sequence[MarginalsSketch],
        model: NDArray[np.float64],
        model_se: NDArray[np.float64],
    ) -> tuple[
        NDArray[np.float64],
        NDArray[np.float64],
        list[MeasuredEstimate | None],
        list[float | None],
    ]:
        """Each value's estimate and standard error, before any cut, from the graphical
        model's ``model`` and ``model_se`` (shape (k,)), the measured estimates
        (:meth:`_measured`) and what the domain fixes (:meth:`_public`).

        Where every owner measured the value's columns together, the value is the measured
        marginals' own estimate, with its noise's standard error: the estimate the interval
        is built around (the model's value there is biased where the noise is large against
        a cell, and its bootstrap spread is not its error). A value the public domain fixes
        (every record lies within the declared bounds) is that value exactly, standard error
        0. Elsewhere the model's.

        Returns
        -------
        (raw, se, measured, public)
            ``raw`` and ``se`` of shape (k,); per value its measured estimate or None; per
            value of a count or a CDF the value the domain fixes or None (empty for other
            kinds).
        """
        measured = self._measured(query, sketches)
        raw = np.array([model[v] if m is None else m.value for v, m in enumerate(measured)])
        se = np.array([model_se[v] if m is None else m.sd for v, m in enumerate(measured)])
        public = [e for e, _ in self._public(query)] if query.kind in ("count", "cdf") else []
        for v, exact in enumerate(public):
            if exact is not None:
                raw[v], se[v] = exact, 0.0
        return raw, se, measured, public

    def _count_extra(
        self,
        query: Query,
        sketches: Sequence[MarginalsSketch],
        measured: MeasuredEstimate | None,
        fraction: float,
        total: float,
        exact: float | None = None,
    ) -> dict[str, Any]:
        """A count answer's ``count``, ``n`` (the models' ``total``), ``n_interval``,
        ``count_standard_error`` and ``count_interval``: the measured count itself, unbiased
        (cut at 0), with its sd, where every owner measured the count's columns together
        (``measured``); elsewhere the model's guess, its ``fraction`` times ``total``, with no
        standard error. Each interval is widened to hold its value. Where the domain fixes
        the fraction (``exact``, :meth:`_public`): 0 records, exactly, or every record, ``n``
        with ``n``'s interval and no standard error of its own."""
        n_low, n_high = self._record_count_interval(sketches)
        n_interval = [min(n_low, total), max(n_high, total)]
        if exact is not None:
            return {
                "count": exact * total,
                "n": total,
                "n_interval": n_interval,
                "count_standard_error": 0.0 if exact == 0.0 else None,
                "count_interval": [0.0, 0.0] if exact == 0.0 else list(n_interval),
            }
        c_low, c_high = self._count_interval(query, sketches)
        if measured is None:
            count, count_se = fraction * total, None
        else:
            count, count_se = max(measured.count, 0.0), measured.count_sd
        return {
            "count": count,
            "n": total,
            "n_interval": n_interval,
            "count_standard_error": count_se,
            "count_interval": [min(c_low, count), max(c_high, count)],
        }

    def _count_interval(
        self, query: Query, sketches: Sequence[MarginalsSketch]
    ) -> tuple[float, float]:
        """A count query's 95 % interval in records, from the measured counts themselves:
        each owner's count bounds at ``alpha / S`` (union bound over the ``S`` owners), added
        up (:func:`~dpmarket.common.sketches.marginals_bounds.union_count_bounds`). The
        fraction's bounds times the model's record count (what was printed before) ignored the
        record count's noise."""
        cells = [int(c) for c in self.feature_map.cells]
        weights = self._value_weights(query, bounds=True)[0]
        low, high, _ = union_count_bounds([s.measurements for s in sketches], cells, weights)
        return low, high

    def _record_count_interval(self, sketches: Sequence[MarginalsSketch]) -> tuple[float, float]:
        """The union's record count's 95 % interval: the sum of the owners' unbiased estimates
        (:func:`~dpmarket.common.sketches.marginals_bounds.total_count`) -+ 1.96 sd of their
        Gaussian noise, cut at 0."""
        return record_count_interval_of(
            [s.measurements for s in sketches], [int(c) for c in self.feature_map.cells]
        )

    def _value_weights(
        self, query: Query, *, bounds: bool = False
    ) -> list[dict[int, NDArray[np.float64]]]:
        """Per value of ``query`` (count, cdf, marginal, mean, moment2), the per-column cell
        weights whose weighted count over the rows is that value; with ``bounds``, which cells
        a count's or a CDF's predicates hold whole, in part or not at all, whatever the values
        inside a cell (:func:`~dpmarket.common.sketches.marginals.bound_weights`). A column
        whose predicate holds every record the domain admits is left out of its conjunction
        (:meth:`_public`: ``price <= 400000 and bedrooms = 3`` is ``bedrooms = 3``), unless
        the domain fixes the whole value (answered exactly, not from these weights)."""
        found = self._all_weights(query, bounds=bounds)
        if query.kind not in ("count", "cdf"):
            return found
        for v, (exact, held) in enumerate(self._public(query)):
            if exact is None and held:
                found[v] = {j: w for j, w in found[v].items() if j not in held}
        return found

    def _public(self, query: Query) -> list[tuple[float | None, frozenset[int]]]:
        """Per value of a count or a CDF, what the public domain fixes (every record of a
        release lies in it): ``(exact, held)``, ``exact`` the value's share when the domain
        fixes it (0 where some column's predicate reaches no cell, 1 where every column's
        holds every cell a record can lie in) and None otherwise; ``held`` the columns whose
        predicate holds every record
        (:func:`~dpmarket.common.sketches.marginals.public_share`). Other kinds: ``(None,
        frozenset())`` for every value."""
        found = self._all_weights(query, bounds=True)
        if query.kind not in ("count", "cdf"):
            return [(None, frozenset())] * len(found)
        out: list[tuple[float | None, frozenset[int]]] = []
        for weights in found:
            shares = {
                j: public_share(self.feature_map, self.domain, j, w) for j, w in weights.items()
            }
            held = frozenset(j for j, share in shares.items() if share == 1.0)
            if any(share == 0.0 for share in shares.values()):
                out.append((0.0, held))
            elif len(held) == len(shares):
                out.append((1.0, held))
            else:
                out.append((None, held))
        return out

    def _cut_cells(self, query: Query) -> list[bool]:
        """Per value, whether a count's or a CDF's predicate cuts a cell of a continuous or
        integer column (a bound weight strictly between 0 and 1,
        :func:`~dpmarket.common.sketches.marginals.bound_weights`): the records' positions
        inside that cell are not measured, so the value there is a guess (the records taken
        as spread evenly inside the cell) and only bounds hold it. False for the values the
        domain fixes (:meth:`_public`) and for other kinds."""
        weights = self._value_weights(query, bounds=True)
        if query.kind not in ("count", "cdf"):
            return [False] * len(weights)
        return [
            exact is None and any(((w > 0.0) & (w < 1.0)).any() for w in ws.values())
            for ws, (exact, _) in zip(weights, self._public(query), strict=True)
        ]

    def _all_weights(
        self, query: Query, *, bounds: bool = False
    ) -> list[dict[int, NDArray[np.float64]]]:
        """:meth:`_value_weights` with every column of the query kept."""
        domain, fmap = self.domain, self.feature_map
        weigh = bound_weights if bounds else cell_weights
        if query.kind == "count":
            return [self._weights(query, weigh)]
        if query.kind == "cdf":
            idx = _columns(query, domain)
            t = _thresholds(query, domain, idx)
            return [
                {int(j): weigh(fmap, domain, int(j), -np.inf, float(x))}
                for j, row in zip(idx, t, strict=True)
                for x in row
            ]
        if query.kind == "marginal":
            idx = _index(domain, query.columns).tolist()
            out = []
            for combo in itertools.product(*(range(int(fmap.cells[j])) for j in idx)):
                weights = {}
                for j, c in zip(idx, combo, strict=True):
                    w = np.zeros(int(fmap.cells[j]))
                    w[c] = 1.0
                    weights[int(j)] = w
                out.append(weights)
            return out
        order = 1 if query.kind == "mean" else 2
        out = []
        for j in _columns(query, domain):
            levels = domain.level_values(int(j))
            assert levels is not None  # expresses(): discrete columns only
            out.append({int(j): levels**order})
        return out

    def _measured(
        self, query: Query, sketches: Sequence[MarginalsSketch]
    ) -> list[MeasuredEstimate | None]:
        """Per value, its estimate from the measured marginals alone where every owner measured
        a marginal holding the value's columns (None elsewhere): a fraction, mean or second
        moment ``C / N`` (:func:`~dpmarket.common.sketches.marginals_bounds.fraction_estimate`),
        a covariance from the four measured sums
        (:func:`~dpmarket.common.sketches.marginals_bounds.covariance_estimate`); each with its
        noise's standard deviation. None too where the domain fixes the value (:meth:`_public`:
        answered exactly) and where a predicate cuts a cell (:meth:`_cut_cells`: the
        estimate is of the records taken as spread evenly inside the cell, a guess, not a
        measurement)."""
        parts = [s.measurements for s in sketches]
        cells = [int(c) for c in self.feature_map.cells]
        if query.kind != "covariance":
            public = self._public(query)
            cut = self._cut_cells(query)
            return [
                None if cut[v] or public[v][0] is not None else fraction_estimate(parts, cells, w)
                for v, w in enumerate(self._value_weights(query))
            ]
        idx = _columns(query, self.domain)
        out: list[MeasuredEstimate | None] = []
        for a, b in zip(*np.triu_indices(idx.size), strict=True):
            ja, jb = int(idx[a]), int(idx[b])
            la, lb = self.domain.level_values(ja), self.domain.level_values(jb)
            assert la is not None and lb is not None  # expresses(): discrete columns only
            out.append(covariance_estimate(parts, cells, (ja, jb), (la, lb)))
        return out

    def _intervals(
        self,
        query: Query,
        sketches: Sequence[MarginalsSketch],
        values: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], tuple[str, ...], tuple[str, ...], tuple[tuple[Flag, ...], ...]]:
        """Every value's 95 % interval, its basis, how it was built, and its flags.

        Counts and CDFs the public domain fixes (:meth:`_public`): that value, exactly
        (``"public"``). Counts, CDFs, marginal cells, means and second moments:
        :func:`dpmarket.common.sketches.marginals_bounds.fraction_bounds` from the owners'
        measurements — where a predicate cuts a cell (:meth:`_cut_cells`), bounds from the
        cells it holds whole and every cell it touches (``"bounds"``, the value a guess inside
        the cell flagged ``model-guess``); else where one measured marginal holds the value's
        columns (``"measured"``),
        the interval of the measured estimate ``C / N`` that ``values`` holds there
        (:meth:`_measured`): the unbiased count ``-+ z sd`` over the record count's interval,
        Bonferroni; Fréchet bounds that hold whatever the joint otherwise (``"bounds"``; the
        model's value, an independence guess there, is flagged ``model-guess`` on the value and
        moved inside them when outside). Covariances: bounds from the measured sums where
        every owner measured the pair together (``"measured"``), Cauchy-Schwarz bounds
        otherwise (``"bounds"``, the model's guess flagged ``model-guess`` on the value):
        :meth:`_covariance_intervals`. No interval depends on the model's fit.

        Returns
        -------
        (ndarray of shape (k, 2), tuple of str, tuple of str, tuple of tuple of Flag)
            Intervals before the cut to what the values can be (the caller's).
        """
        k = values.shape[0]
        parts = [s.measurements for s in sketches]
        cells = [int(c) for c in self.feature_map.cells]
        if query.kind == "covariance":
            return self._covariance_intervals(query, parts, values)
        per_value = self._value_weights(query, bounds=True)
        public = self._public(query)
        cut = self._cut_cells(query)
        record_counts = record_count_bounds(parts, cells)  # the same for every value
        bounds = np.empty((k, 2))
        basis: list[str] = []
        covers: list[str] = []
        flags: list[tuple[Flag, ...]] = []
        for v, w in enumerate(per_value):
            exact = public[v][0]
            if exact is not None:
                bounds[v] = (exact, exact)
                basis.append("public")
                covers.append(_public_covers(query, exact))
                flags.append(())
                continue
            low, high, measured = fraction_bounds(parts, cells, w, record_counts=record_counts)
            if measured and not cut[v]:
                basis.append("measured")
                covers.append(
                    "the value is the unbiased count from the measured marginals that hold "
                    "these columns (inverse-variance weighted) over the measured record count; "
                    "the interval is that count ± z sd over the record count's interval "
                    "(Bonferroni), which holds the truth with probability 95 % or more"
                )
                flags.append(())
            else:
                how, flag = self._guess(float(values[v]), (low, high), cut[v], measured)
                basis.append("bounds")
                covers.append(how)
                flags.append((flag,))
            bounds[v] = (low, high)
        return bounds, tuple(basis), tuple(covers), tuple(flags)

    @staticmethod
    def _guess(
        value: float, bounds: tuple[float, float], cut: bool, measured: bool
    ) -> tuple[str, Flag]:
        """How the bounds around a count's, CDF's, cell's or moment's guess were built, and
        its ``model-guess`` flag (basis ``bounds``, :meth:`_intervals`): a guess inside a cell
        a predicate cuts where a measured marginal holds the columns (``measured``: bounds
        from the cells held whole and every cell touched), else the graphical model's
        independence guess (Fréchet bounds; ``cut`` adds the cell's reason). The reason says
        where ``value`` lay outside ``bounds`` (moved inside by the caller)."""
        low, high = bounds
        if measured:
            reason, who, it = "a guess inside a cell: " + _INSIDE_CELL, "the guess", "it"
            how = (
                "bounds from the measured marginals that hold these columns: the count of "
                "the cells the predicates hold whole and the count of every cell they "
                "touch, each ± z sd, over the record count's interval (Bonferroni); they "
                "hold wherever the records lie inside a cell"
            )
        else:
            reason = (
                "the graphical model's guess: no measured marginal holds these columns "
                "together, so it assumes them independent given what was measured; the "
                "interval is the Fréchet bounds from the measured marginals, which hold "
                "whatever the joint"
            )
            if cut:
                reason += "; and " + _INSIDE_CELL
            who, it = "the model's", "them"
            how = (
                "Fréchet-Bonferroni bounds from the measured marginals (they hold whatever "
                "the joint), widened by their noise with a union bound over the candidates"
            )
        if not low <= value <= high:
            reason += f" ({who} {value:.6g} lay outside {it}: moved inside)"
        return how, _flag("model-guess", reason)

    def _covariance_intervals(
        self,
        query: Query,
        parts: Sequence[Sequence[Measurement]],
        values: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], tuple[str, ...], tuple[str, ...], tuple[tuple[Flag, ...], ...]]:
        """Covariances (and variances) of discrete columns: where every owner measured a
        marginal holding the pair, bounds from four measured sums
        (:func:`~dpmarket.common.sketches.marginals_bounds.covariance_bounds`; ``"measured"``),
        around the plug-in estimate from the same sums that ``values`` holds there
        (:meth:`_measured`); otherwise Cauchy-Schwarz
        bounds from the two variances' intervals, which hold whatever the joint
        (:func:`~dpmarket.common.sketches.marginals_bounds.unmeasured_covariance_bounds`;
        ``"bounds"``), the model's independence guess flagged ``model-guess`` on the value
        (moved inside them by the caller where outside). No interval depends on the fit."""
        idx = _columns(query, self.domain)
        rows, cols = np.triu_indices(idx.size)
        cells = [int(c) for c in self.feature_map.cells]
        k = values.shape[0]
        bounds = np.full((k, 2), np.nan)
        basis: list[str] = []
        covers: list[str] = []
        flags: list[tuple[Flag, ...]] = []
        for v, (a, b) in enumerate(zip(rows, cols, strict=True)):
            ja, jb = int(idx[a]), int(idx[b])
            levels = (self.domain.level_values(ja), self.domain.level_values(jb))
            assert levels[0] is not None and levels[1] is not None  # expresses()
            found = covariance_bounds(parts, cells, (ja, jb), (levels[0], levels[1]))
            if found is not None:
                bounds[v] = found
                basis.append("measured")
                covers.append(
                    "the value is S_xy/n - S_x S_y/n^2 from the measured marginals that hold "
                    "the pair (each sum unbiased); the interval is each sum ± z sd at alpha/8 a "
                    "side (union bound), combined by interval arithmetic"
                )
                flags.append(())
                continue
            low, high = unmeasured_covariance_bounds(parts, cells, (ja, jb), (levels[0], levels[1]))
            bounds[v] = (low, high)
            basis.append("bounds")
            covers.append(
                "|cov| <= sd_a sd_b (Cauchy-Schwarz), each variance at the upper end of its "
                "measured interval at 97.5 %: holds whatever the joint"
            )
            reason = (
                "the graphical model's independence guess: the pair was never measured "
                "together; the interval holds whatever the joint"
            )
            if not low <= values[v] <= high:
                reason += f" (the model's {values[v]:.6g} lay outside it: moved inside)"
            flags.append((_flag("model-guess", reason),))
        return bounds, tuple(basis), tuple(covers), tuple(flags)

    def _weights(
        self, query: Query, weigh: Callable[..., NDArray[np.float64]] = cell_weights
    ) -> dict[int, NDArray[np.float64]]:
        """Per-column cell weights of a count's conjunction (predicates on one column
        intersected first), by ``weigh`` (:func:`~dpmarket.common.sketches.marginals.cell_weights`
        or :func:`~dpmarket.common.sketches.marginals.bound_weights`)."""
        domain = self.domain
        lower, upper = _bounds(query, domain)
        out = {}
        for j in sorted(set(_index(domain, [c for c, _, _ in query.where]).tolist())):
            out[j] = weigh(self.feature_map, domain, j, lower[0, j], upper[0, j])
        return out

    def _evaluator(self, query: Query) -> Callable[[Sequence[MarginalsModel]], NDArray[np.float64]]:
        """``models -> values``: the query's values on the union of ``models``' data
        (fractions, moments; :meth:`_values`), a count's, CDF's, mean's or second moment's by
        its cell weights (:meth:`_value_weights`) computed here once (:class:`_Fractions`)."""
        if query.kind in ("count", "cdf", "mean", "moment2"):
            return _Fractions(self._value_weights(query))
        return functools.partial(self._values, query)

    def _values(self, query: Query, models: Sequence[MarginalsModel]) -> NDArray[np.float64]:
        """A marginal table's or a covariance's values on the union of ``models``' data."""
        domain = self.domain
        total = math.fsum(m.total for m in models)

        def fraction(weights: dict[int, NDArray[np.float64]]) -> float:
            return math.fsum(m.query(weights) for m in models) / total

        if query.kind == "marginal":
            idx = _index(domain, query.columns).tolist()
            table = sum(m.marginal(idx) for m in models)
            return np.asarray(table, dtype=np.float64).reshape(-1) / total
        idx = _columns(query, domain)
        levels: dict[int, NDArray[np.float64]] = {}
        for j in idx:
            lv = domain.level_values(int(j))
            assert lv is not None  # expresses(): discrete columns only
            levels[int(j)] = lv
        # covariance of discrete columns: E[x_a x_b] - E[x_a] E[x_b]
        means = {int(j): fraction({int(j): levels[int(j)]}) for j in idx}
        rows, cols = np.triu_indices(idx.size)
        out = []
        for a, b in zip(rows, cols, strict=True):
            ja, jb = int(idx[a]), int(idx[b])
            if ja == jb:
                second = fraction({ja: levels[ja] ** 2})
            else:
                second = fraction({ja: levels[ja], jb: levels[jb]})
            out.append(second - means[ja] * means[jb])
        return np.array(out)

    def _synthetic(self, query: Query, models: Sequence[MarginalsModel]) -> Answer:
        """``query.rows`` records from the union: each owner's share of the rows in proportion
        to its model's total (a multinomial draw), cells drawn from its model, then a discrete
        column's level or a value uniform in a continuous column's cell."""
        domain = self.domain
        rng = np.random.default_rng([self.seed, 3])
        totals = np.array([m.total for m in models])
        shares = rng.multinomial(query.rows, totals / totals.sum())
        cells = np.concatenate(
            [m.sample(int(k), rng) for m, k in zip(models, shares, strict=True) if k > 0]
        )
        cells = cells[rng.permutation(cells.shape[0])]
        records = np.empty(cells.shape, dtype=np.float64)
        for j in range(domain.n_attributes):
            levels = domain.level_values(j)
            if levels is not None:
                records[:, j] = levels[cells[:, j]]
            else:
                e = self.feature_map.edges(j)
                u = rng.random(cells.shape[0])
                records[:, j] = e[cells[:, j]] + u * (e[cells[:, j] + 1] - e[cells[:, j]])
        names = [domain.attribute_name(j) for j in range(domain.n_attributes)]
        return Answer(
            query,
            (),
            np.zeros(0),
            {"columns": names, "records": records.tolist()},
            source=f"{self.spec.name} (graphical model)",
        )


def _expresses(query: Query, spec: SketchSpec) -> bool:
    """Whether ``spec``'s sketches can answer ``query`` at all."""
    if spec.kind == "marginals":
        return MarginalsExplorer.expresses(query, spec.domain)
    return query.kind not in ("marginal", "synthetic")


#: Per query kind that some sketch kinds cannot answer: which kinds answer it (:func:`_expresses`)
#: and what to do instead, for :func:`_unanswered`'s message.
_ANSWERED_BY = {
    "marginal": ("a marginals sketch only", "choose (--spec) or publish a marginals sketch"),
    "logreg": (
        "a hist, rff or race sketch (not a marginals sketch)",
        "choose (--spec) or publish a hist, rff or race sketch",
    ),
    "mean": (
        "a hist, rff or race sketch for any column; a marginals sketch for discrete columns "
        "(declared levels) only",
        "name discrete columns with --column, or choose (--spec) or publish a hist, rff or "
        "race sketch",
    ),
}
_ANSWERED_BY["synthetic"] = _ANSWERED_BY["marginal"]
_ANSWERED_BY["moment2"] = _ANSWERED_BY["covariance"] = _ANSWERED_BY["mean"]


def _unanswered(query: Query, specs: Sequence[SketchSpec]) -> str:
    """Why no spec of ``specs`` answers ``query`` (none :func:`_expresses` it): the query, each
    spec with its kind and what it lacks, which kinds answer the query, and what to do."""
    kind = query.kind
    if not specs:
        return f"no published sketch answers {kind}: the owners asked about published none"
    reasons = []
    for spec in specs:
        why = f"{spec.name} is a {spec.kind} sketch"
        if spec.kind == "marginals" and kind in ("mean", "moment2", "covariance"):
            domain = spec.domain
            other = [
                domain.attribute_name(int(j))
                for j in _columns(query, domain)
                if domain.level_values(int(j)) is None
            ]
            discrete = [
                domain.attribute_name(j)
                for j in range(domain.n_attributes)
                if domain.level_values(j) is not None
            ]
            why += (
                f" and {', '.join(other)} not discrete (no declared levels; a query without "
                "--column asks about every column)"
            )
            if discrete:
                why += f"; its discrete columns: {', '.join(discrete)}"
        reasons.append(why)
    which, todo = _ANSWERED_BY.get(kind, ("every sketch kind", "publish a sketch"))
    return (
        f"no published sketch answers {kind}: {'; '.join(reasons)}. {kind} is answered by "
        f"{which}: {todo}"
    )


def honest_half_width(answer: Answer, domain: Domain) -> float:
    """The mean over ``answer``'s values of its honest 95 % interval's half-width.

    A trusted interval (:meth:`Answer.trusted`: there is one and no flag is on it) counts with
    its half-width; any other with half of what the value can be whatever the data (a mean's
    public bounds, [0, 1] for a fraction; infinite where nothing bounds it), since an interval
    that cannot be trusted says no more than that. A value flagged only on the value (a model's
    guess inside bounds that hold whatever the joint) keeps its interval's width.

    Returns
    -------
    float
        NaN for an answer without values (synthetic records).
    """
    k = len(answer.labels)
    if k == 0:
        return math.nan
    low, high = answer.interval()
    possible_low, possible_high, _ = _possible(answer.query, domain, k)
    width = np.where(answer.trusted(), high - low, possible_high - possible_low)
    return float(np.mean(width / 2.0))


#: Sketch kinds whose answers are read from the release (a histogram's bins, the measured
#: marginals: milliseconds); the others (RFF, RACE) need an M2M fit of each of the query's values
#: on the synthetic design and 1,000 noise replicates (tenths of a second to seconds).
READ_KINDS = ("hist", "marginals")


def uninformed_half_width(query: Query, domain: Domain) -> float:
    """:func:`honest_half_width` of an answer to ``query`` whose every interval is untrusted:
    the mean over its values of half of what each can be (infinite where nothing bounds it;
    NaN for a query without such values: a logistic regression, a marginal table, records)."""
    if query.kind in ("logreg", "marginal", "synthetic"):
        return math.nan
    k = len(_labels(query, domain))
    low, high, _ = _possible(query, domain, k)
    return float(np.mean((high - low) / 2.0))


def narrowest(specs: Sequence[SketchSpec], errors: Mapping[str, float]) -> SketchSpec:
    """The spec of ``specs`` (at least one) whose ``errors[spec.name]`` is least (NaN counts as
    infinite); ties go to a marginals spec, then by name (:func:`choose_source`'s order)."""
    return min(
        specs,
        key=lambda s: (
            math.inf if math.isnan(errors[s.name]) else errors[s.name],
            s.kind != "marginals",
            s.name,
        ),
    )


def choose_source(
    query: Query,
    specs: Sequence[SketchSpec],
    expected_error: Callable[[SketchSpec], float] | None = None,
) -> tuple[SketchSpec, str]:
    """Which spec answers ``query``, and why.

    The rule: among the specs whose sketch expresses the query (a marginals spec: what
    :meth:`MarginalsExplorer.expresses` — counts, CDFs, marginal tables, synthetic records,
    moments and covariances of discrete columns; a HIST, RFF or RACE spec: everything but
    marginal tables and synthetic records), the one whose honest 95 % interval is narrowest,
    ``expected_error(spec)``: :func:`honest_half_width` of the spec's answer (for a logistic
    regression, whose bias no sketch bounds, every interval is untrusted: the reason says
    :data:`NO_TRUSTED`, and the spec is chosen among those whose fit identifies the model, RFF
    and RACE, by the least standard error of the involved columns' means, which the caller gives
    as ``expected_error``: :func:`_logreg_source`). Intervals compare alike
    whatever the kind, because each states what it covers: a bias bound, Fréchet bounds or a
    measured marginal's noise, and an interval flagged as untrustworthy counts as wide as what
    the value can be. A sketch whose noise is small but whose estimator cannot resolve the query
    (M2M's fit of a threshold, one histogram per column for a relation between columns, a
    graphical model's guess for columns never measured together) thus loses to one whose
    honest interval is narrower. Ties go to a marginals spec (its values are unbiased in its
    cells up to the model's fit), then by name. A single candidate is chosen without calling
    ``expected_error``; so is, without ``expected_error``, a marginals candidate before the
    others, else the first.

    What is compared is chosen before anything is computed, from the specs' kinds and the
    query's kind: the answers of the kinds read from the release (:data:`READ_KINDS`: a
    histogram's, a marginals sketch's) are computed first, and an RFF or RACE spec's M2M answer,
    the costly one, only when none of them says anything — when the narrowest of them is as
    wide as an answer whose every interval is untrusted (:func:`uninformed_half_width`), or
    there is none. An M2M interval carries M2M's residual range, the fit's own bias bound, which
    does not shrink with the records; the histogram's binning bound does, and so do the
    marginals' noise and Fréchet bounds. The rule so skips the M2M answers where they would
    rarely be the narrowest (``python -m bench.explore_choice`` counts how often on the
    tutorial's deployment, and how much wider the chosen interval then is). A logistic
    regression's ``expected_error`` computes no answer.

    Parameters
    ----------
    query : Query
    specs : sequence of SketchSpec
        The specs with a sketch of every owner asked about.
    expected_error : callable, optional
        ``spec -> float``, the half-width of the spec's honest 95 % interval for ``query``.

    Returns
    -------
    (SketchSpec, str)

    Raises
    ------
    InvalidArgumentError
        If no spec can answer (e.g. a marginal table without a marginals sketch).
    """
    candidates = [s for s in specs if _expresses(query, s)]
    if not candidates:
        raise InvalidArgumentError(_unanswered(query, specs))
    if len(candidates) == 1:
        return candidates[0], f"{candidates[0].name}: the only sketch that expresses {query.kind}"
    if expected_error is None:
        first = next((s for s in candidates if s.kind == "marginals"), candidates[0])
        return first, f"{first.name}: a sketch that expresses {query.kind} (no widths compared)"
    if query.kind == "logreg":
        return _logreg_source(candidates, expected_error)
    read = [s for s in candidates if s.kind in READ_KINDS]
    errors = {s.name: float(expected_error(s)) for s in read}
    known = [e for e in errors.values() if not math.isnan(e)]
    uninformed = uninformed_half_width(query, candidates[0].domain)
    skipped = []
    for s in candidates:
        if s.name in errors:
            continue
        if known and min(known) < uninformed:
            skipped.append(s.name)
        else:
            errors[s.name] = float(expected_error(s))
    best = narrowest([s for s in candidates if s.name in errors], errors)
    listed = ", ".join(f"{n} {e:.3g}" for n, e in errors.items())
    unasked = (
        f"; {', '.join(skipped)} not computed: an M2M answer is fitted only when no histogram "
        "or marginals answer says anything"
        if skipped
        else ""
    )
    return best, (
        f"{best.name}: narrowest 95 % interval, honestly compared, of every sketch that "
        f"expresses {query.kind} (mean half-width: {listed}{unasked})"
    )


#: What :func:`choose_source`'s reason says first where no candidate's interval can be trusted.
NO_TRUSTED = "no candidate has a trusted interval"


def _logreg_source(
    candidates: Sequence[SketchSpec], expected_error: Callable[[SketchSpec], float]
) -> tuple[SketchSpec, str]:
    """:func:`choose_source` for a logistic regression (two or more candidates): every sketch
    kind's fit is flagged ``unbounded`` (no sketch bounds its bias), so no width compares
    anything honest. The rule stated instead: among the specs whose fit identifies the model
    (RFF and RACE: M2M's fit of the released kernel sums; a HIST fit, one histogram per column,
    is the synthetic design's independence guess whatever the records), or all of them if none
    does, the one with the least noise, ``expected_error(spec)`` (the mean standard error of
    the involved columns' means); ties as :func:`narrowest`. The reason starts with the spec's
    name and says :data:`NO_TRUSTED`."""
    identifying = [s for s in candidates if s.kind != "hist"]
    pool = identifying or list(candidates)
    errors = {s.name: float(expected_error(s)) for s in pool}
    best = narrowest(pool, errors)
    listed = ", ".join(f"{n} {e:.3g}" for n, e in errors.items())
    left = [s.name for s in candidates if s not in pool]
    if identifying:
        rule = "the sketch whose fit identifies the model (an RFF or RACE fit) with the least noise"
        if left:
            rule += (
                f"; {', '.join(left)} not compared: a HIST fit is the independence guess "
                "whatever the records"
            )
    else:
        rule = (
            "the least noise; no candidate's fit identifies the model (a HIST fit is the "
            "independence guess whatever the records)"
        )
    return best, (
        f"{best.name}: {NO_TRUSTED} (every sketch's logistic regression is flagged unbounded, "
        f"so no widths are compared); chosen by the rule: {rule} (mean standard error of the "
        f"involved columns' means: {listed})"
    )


def exact_answer(query: Query, records: ArrayLike, domain: Domain) -> Answer:
    """The exact value of ``query`` on raw records (what the sketch estimates).

    ``logreg`` fits scikit-learn's logistic regression on the records (the non-private model,
    with M2M's default ``C = 1``).

    Parameters
    ----------
    query : Query
    records : array-like of shape (n, d)
        Inside ``domain`` (checked, naming row and column otherwise).
    domain : Domain
    """
    x = domain.check(records, "records")
    labels = _labels(query, domain)
    extra: dict[str, Any] = {}
    if query.kind in ("mean", "moment2"):
        order = 1 if query.kind == "mean" else 2
        values = tasks.moment_function(order, _columns(query, domain))(x).mean(axis=0)
    elif query.kind == "cdf":
        idx = _columns(query, domain)
        values = tasks.cdf_function(_thresholds(query, domain, idx), idx)(x).mean(axis=0)
    elif query.kind == "covariance":
        idx = _columns(query, domain)
        full = np.atleast_2d(np.cov(x[:, idx], rowvar=False, bias=True))
        values = full[np.triu_indices(idx.size)]
    elif query.kind == "count":
        lower, upper = _bounds(query, domain)
        values = tasks.range_function(lower, upper)(x).mean(axis=0)
        extra = {"count": float(values[0]) * x.shape[0], "n": float(x.shape[0])}
    else:
        from sklearn.linear_model import LogisticRegression

        label = _check_target(query, domain)
        features = _features(query, domain)
        model = LogisticRegression(C=1.0, max_iter=1000).fit(x[:, features], x[:, label])
        values = np.concatenate([model.coef_[0], model.intercept_])
    return Answer(query, labels, np.asarray(values, dtype=np.float64), extra)


@dataclass(frozen=True)
class RankedOwner:
    """One owner in a ranking by MMD to the consumer's validation set.

    Attributes
    ----------
    owner : str
    estimate : MMDEstimate
        The debiased squared MMD with its standard error and 95 % interval
        (:func:`dpmarket.common.sketches.mmd.sketch_mmd2_estimate`).
    unresolved : tuple of (str, float, float)
        Every other owner whose order against this one the sketches do not resolve: its name,
        the difference ``this - other`` and its standard error
        (:func:`dpmarket.common.sketches.mmd.mmd2_difference`).
    ranks : (int, int)
        The ranks (1 the best match) this owner can hold given the pairs the sketches resolve:
        one more than the owners resolved as better matches, and the number of owners less
        those resolved as worse. ``(r, r)`` when every pair it is in is resolved; ``(1, K)``
        among ``K`` owners when none is.
    """

    owner: str
    estimate: MMDEstimate
    unresolved: tuple[tuple[str, float, float], ...] = ()
    ranks: tuple[int, int] = (1, 1)

    @property
    def mmd2(self) -> float:
        """The debiased squared MMD (can be slightly negative)."""
        return self.estimate.value


def rank_owners(sketches: Mapping[str, PrivateSketch], validation: ArrayLike) -> list[RankedOwner]:
    """Owners ordered by the squared MMD between ``validation`` and their RFF sketches, each with
    its interval and the owners it is not resolved against.

    Parameters
    ----------
    sketches : mapping of owner name to PrivateSketch
        RFF sketches of one spec.
    validation : array-like of shape (n_v, d)
        The consumer's validation set, in the spec's column order, inside its domain.

    Returns
    -------
    list of RankedOwner
        Smallest MMD first (the best match); each MMD debiased by the noise's expected
        contribution, so it can be slightly negative. Its interval covers the squared MMD of
        the exact Gaussian kernel between the owner's records and ``validation``, over the draw
        of the spec's frequencies and of the noise (the RFF approximation, the sum's and the
        count's noise). Two owners are unresolved when the interval of the difference of their
        values contains 0 (the shared frequencies make this test sharper than comparing the two
        intervals); each owner's :attr:`RankedOwner.ranks` are the ranks the resolved pairs
        leave it (each pair tested at 95 % on its own, not simultaneously).

    Raises
    ------
    InvalidArgumentError
        If a sketch is not RFF, or a validation record lies outside the domain (naming row and
        column).

    Notes
    -----
    Computed here: the validation set and the ranking never leave the consumer. Each value is
    post-processing of a sketch (no owner pays anything for it).
    """
    estimates = {}
    for owner, sketch in sketches.items():
        if sketch.feature_map.kind != "rff":
            raise InvalidArgumentError(
                f"owners are ranked by RFF sketches (a kernel mean embedding); {owner}'s is "
                f"{sketch.feature_map.kind}"
            )
        estimates[owner] = sketch_mmd2_estimate(sketch, validation)
    order = sorted(estimates, key=lambda o: (estimates[o].value, o))
    out = []
    for i, owner in enumerate(order):
        unresolved = []
        better = worse = 0  # owners resolved before and after this one
        for j, other in enumerate(order):
            if other == owner:
                continue
            diff, se, resolved = mmd2_difference(estimates[owner], estimates[other])
            if not resolved:
                unresolved.append((other, diff, se))
            elif j < i:
                better += 1
            else:
                worse += 1
        ranks = (1 + better, len(order) - worse)
        out.append(RankedOwner(owner, estimates[owner], tuple(unresolved), ranks))
    return out
