"""Exploration of published sketches: M2M answers and owner ranking, computed by the consumer.

Everything here is post-processing of sketches the consumer already holds (read from the
curator's catalogue, :meth:`consumer.client.CuratorClient.sketches`): no owner is called, no
owner learns a query, and the consumer's validation set never leaves this process. Each query
costs the owners nothing more, whatever the consumer asks and however often.

* :class:`Query` is one analysis of the M2M paper's Sections 3.4-3.5 on named columns: ``mean``
  and ``moment2`` (raw moments), ``cdf`` (at chosen points), ``covariance``, ``count`` (a
  conjunction of range predicates: the fraction of records and the count) and ``logreg`` (a
  logistic regression by implicit M2M).
* :class:`Explorer` answers queries for any sketch of one spec (one owner's, or the union of
  several: :func:`common.sketches.sketch.merge_sketches`) from one synthetic design, drawn once
  from the spec's domain; :func:`exact_answer` gives the same quantity on raw records (for those
  who hold them: the demo, tests).
* :func:`rank_owners` orders owners by the squared MMD between the consumer's validation set and
  each owner's RFF sketch (:func:`common.sketches.sketch.sketch_mmd2`, debiased).

The synthetic design's randomness is the consumer's own and protects nothing (the sketches are
already private), so it is seeded (default 0): the same sketch and query give the same answer,
bit for bit, wherever they are computed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from common.errors import InvalidArgumentError
from common.sketches import tasks
from common.sketches.domain import Domain
from common.sketches.m2m import (
    DEFAULT_LAMBDA_RULE,
    LambdaRule,
    M2MEstimator,
    SyntheticDesign,
)
from common.sketches.sketch import PrivateSketch, SketchLike, sketch_mmd2
from common.sketches.spec import SketchSpec

__all__ = [
    "DEFAULT_EXPLORE_SYNTHETIC",
    "QUERIES",
    "Answer",
    "Explorer",
    "Query",
    "exact_answer",
    "parse_where",
    "rank_owners",
]

#: The analyses a consumer can run on a sketch.
QUERIES = ("mean", "moment2", "cdf", "covariance", "count", "logreg")
#: Synthetic points of an exploration's design: 2e4 keeps a query under a second at m = 400
#: (the paper uses 1e5; ``n_synthetic`` raises it).
DEFAULT_EXPLORE_SYNTHETIC = 20_000
#: CDF points per column when none are given: the column's range cut in this many equal parts.
CDF_DEFAULT_PARTS = 10

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

    Raises
    ------
    InvalidArgumentError
        For an unknown kind or options that do not belong to it.
    """

    kind: str
    columns: tuple[str, ...] = ()
    points: tuple[float, ...] = ()
    where: tuple[tuple[str, float, float], ...] = ()
    target: str = ""

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
        if any(not math.isfinite(p) for p in self.points):
            raise InvalidArgumentError(f"cdf points must be finite, got {list(self.points)}")


@dataclass(frozen=True)
class Answer:
    """A query's answer: one value per label, in order, and what else it reports.

    Attributes
    ----------
    query : Query
    labels : tuple of str
        What each value is, e.g. ``"distance"``, ``"P[distance <= 500]"``,
        ``"cov(distance, air_time)"``, ``"coef(hour)"``.
    values : ndarray of shape (len(labels),), float64
    extra : dict
        ``count``: ``count`` (the fraction times the count estimate) and ``n``; ``logreg``:
        nothing more (the intercept is a value).
    """

    query: Query
    labels: tuple[str, ...]
    values: NDArray[np.float64]
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: ``{"query", "values": {label: value}, **extra}``."""
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
        return {
            "query": query,
            "values": dict(zip(self.labels, self.values.tolist(), strict=True)),
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
        M2M's ridge parameter (:func:`common.sketches.m2m.regularization`).
    intercept : bool
        Fit an unpenalized constant (:class:`common.sketches.m2m.M2MEstimator`).

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
        self.design = SyntheticDesign.draw(
            spec.feature_map,
            spec.domain,
            np.random.default_rng(self.seed),
            n_synthetic=n_synthetic,
        )

    @property
    def domain(self) -> Domain:
        """The spec's domain."""
        return self.spec.domain

    def estimator(self, sketch: SketchLike) -> M2MEstimator:
        """An M2M estimator of ``sketch`` (one owner's or a union) on the shared design.

        Raises
        ------
        InvalidArgumentError
            If a sketch was not made under the spec.
        """
        parts = getattr(sketch, "parts", (sketch,))
        for part in parts:
            if isinstance(part, PrivateSketch):
                self.spec.check_sketch(part)
        return M2MEstimator(
            sketch, design=self.design, lambda_rule=self.lambda_rule, intercept=self.intercept
        )

    def answer(self, query: Query, sketch: SketchLike | M2MEstimator) -> Answer:
        """The M2M estimate of ``query`` on the sketched data.

        Raises
        ------
        InvalidArgumentError
            For an unknown column, a target that is not a two-level column, or a sketch not made
            under the spec.
        ValueError
            If the implicit-M2M weights cannot fit a logistic regression (e.g. no positive
            weight for one class).
        """
        est = sketch if isinstance(sketch, M2MEstimator) else self.estimator(sketch)
        domain = self.domain
        labels = _labels(query, domain)
        extra: dict[str, Any] = {}
        if query.kind in ("mean", "moment2"):
            order = 1 if query.kind == "mean" else 2
            values = tasks.moments(est, order, _columns(query, domain))
        elif query.kind == "cdf":
            idx = _columns(query, domain)
            values = tasks.cdf(est, _thresholds(query, domain, idx), idx).reshape(-1)
        elif query.kind == "covariance":
            idx = _columns(query, domain)
            full = tasks.covariance(est)[np.ix_(idx, idx)]
            values = full[np.triu_indices(idx.size)]
        elif query.kind == "count":
            lower, upper = _bounds(query, domain)
            values = tasks.counting_queries(est, lower, upper)
            n_hat = float(est.sketch.count_estimate)
            extra = {"count": float(values[0]) * n_hat, "n": n_hat}
        else:
            fit = tasks.implicit_logistic_regression(
                est,
                _check_target(query, domain),
                feature_attributes=_features(query, domain).tolist(),
            )
            values = np.concatenate([fit.model.coef_[0], fit.model.intercept_])
        return Answer(query, labels, np.asarray(values, dtype=np.float64), extra)


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


def rank_owners(
    sketches: Mapping[str, PrivateSketch], validation: ArrayLike
) -> list[tuple[str, float]]:
    """Owners ordered by the squared MMD between ``validation`` and their RFF sketches.

    Parameters
    ----------
    sketches : mapping of owner name to PrivateSketch
        RFF sketches of one spec.
    validation : array-like of shape (n_v, d)
        The consumer's validation set, in the spec's column order, inside its domain.

    Returns
    -------
    list of (owner, mmd2)
        Smallest first (the best match); ``mmd2`` debiased by the noise's expected
        contribution, so it can be slightly negative.

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
    scores = []
    for owner, sketch in sketches.items():
        if sketch.feature_map.kind != "rff":
            raise InvalidArgumentError(
                f"owners are ranked by RFF sketches (a kernel mean embedding); {owner}'s is "
                f"{sketch.feature_map.kind}"
            )
        scores.append((owner, sketch_mmd2(sketch, validation)))
    return sorted(scores, key=lambda item: (item[1], item[0]))
