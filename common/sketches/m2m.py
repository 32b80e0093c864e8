"""The M2M estimator (M2M paper, Section 3.2 and Appendix B): averages of functions from a sketch.

To estimate ``f_bar = (1/n) sum_i f(x_i)`` from a sketch ``z_hat`` of the feature map ``Phi``, M2M
fits a linear model ``<a, Phi(x)> ~ f(x)`` by ridge regression on synthetic points
``x~_1..x~_ns`` drawn from a prior ``psi`` over the public domain,

    a = argmin_a (1/ns) ||P a - F||^2 + lambda ||a||^2,   P = (Phi(x~_i))_i,  F = (f(x~_i))_i,

and returns ``<a, z_hat>``: because the sketch is an average of features, ``<a, z_D> =
(1/n) sum_i <a, Phi(x_i)> ~ f_bar`` (Eq. 3). The regression never sees data; only ``z_hat``
does, so every estimate is post-processing of the sketch.

The work is split so that it is done once and reused:

* :class:`SyntheticDesign` (the prior's sample, its features and the Gram matrix
  ``G = P^T P / ns``) depends on the feature map and the prior only. Owners who share a public map
  share one design; each value of ``lambda`` costs one Cholesky factorization, cached.
* :class:`M2MEstimator` binds a design to one sketch (and its ``lambda``) and answers any number of
  target functions: each costs ``P^T F`` and a triangular solve, for many functions at once
  (columns of ``F``).

The regularization ``lambda`` (Appendix B, step 2) is set from the sketch's noise level
``sigma_xi^2`` (the variance of each coordinate of the noise on the sum) and the count estimate
``n_hat`` by a rule (:func:`regularization`): ``"theorem"``, ``sigma_xi^2 / n_hat^2`` (the value
under which the M2M loss bounds the estimate's mean squared error, Theorem 3.1), or ``"paper"``,
``sigma_xi^2 / n_hat`` (Eq. 5, what the paper's experiments use), or a fixed number. The default
is ``"theorem"``, chosen by measurement (docs/how-it-works.md, "Private sketches and M2M").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import DEFAULT_CHUNK_SIZE, FeatureMap, OneHotFeatureMap
from dpmarket.common.sketches.sketch import SketchLike
from dpmarket.common.validation import check_matrix, check_positive_int

__all__ = [
    "DEFAULT_LAMBDA_RULE",
    "DEFAULT_N_SYNTHETIC",
    "LAMBDA_RULES",
    "MIN_LAMBDA",
    "LambdaRule",
    "M2MEstimator",
    "Prior",
    "SyntheticDesign",
    "TargetMoments",
    "regularization",
]

LambdaRule = Literal["theorem", "paper"]
LAMBDA_RULES: tuple[LambdaRule, ...] = ("theorem", "paper")
#: ``sigma_xi^2 / n_hat^2``, chosen by measuring both rules on Random10 and on a real data set
#: (docs/how-it-works.md, "Private sketches and M2M").
DEFAULT_LAMBDA_RULE: LambdaRule = "theorem"
#: Floor of a rule's lambda: the paper's ``lambda = 1e-9`` "for numeric stability" of the exact
#: sketch (Section 4.1), where the noise level is 0 and HIST's Gram matrix is singular (every
#: block of its features sums to 1).
MIN_LAMBDA = 1e-9
#: The paper's number of synthetic points (Section 4: "n_s = 10^5 samples").
DEFAULT_N_SYNTHETIC = 100_000
#: Cholesky factorizations kept per design (one per distinct lambda and intercept setting).
_FACTOR_CACHE_SIZE = 16
#: Domains a design remembers its points passed (:meth:`SyntheticDesign.check_within`).
_DOMAINS_KEPT = 8

#: A prior over the domain: ``prior(n, rng)`` returns ``n`` points, shape (n, d).
Prior = Callable[[int, np.random.Generator], ArrayLike]


def regularization(
    sketch: SketchLike,
    rule: LambdaRule | float = DEFAULT_LAMBDA_RULE,
    *,
    min_lambda: float = MIN_LAMBDA,
    n_hat: float | None = None,
) -> float:
    """The ridge parameter ``lambda`` for a sketch (Appendix B, step 2).

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
        Provides ``sigma_xi^2 = sketch.sum_noise_variance`` (``2 b^2`` for Laplace noise of scale
        ``b = Delta_1 / epsilon_num``; summed over the parts of a union) and
        ``n_hat = sketch.count_estimate``.
    rule : {"theorem", "paper"} or float
        ``"theorem"``: ``sigma_xi^2 / n_hat^2``. ``"paper"``: ``sigma_xi^2 / n_hat``
        (Eq. 5: ``2 Delta_1^2 / (epsilon_num^2 (|D| + zeta))``). A float: that value, used as is
        (finite, ``>= 0``).
    min_lambda : float
        Floor applied to a rule's value (not to an explicit float), ``>= 0``.
    n_hat : float, optional
        The record count estimate the fit divides the sum by, ``>= 1`` (default
        ``sketch.count_estimate``, the noisy count alone). ``explore``'s bounded M2M answers
        pass the combined estimate their point and interval use
        (:func:`dpmarket.common.sketches.intervals.count_estimate`), so that one ``n`` serves
        the whole answer.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        On an unknown rule, a negative or non-finite float, a negative ``min_lambda``, or an
        ``n_hat`` below 1 or not finite.

    Notes
    -----
    The M2M loss is ``J(a) = (1/ns) ||P a - F||^2 + lambda ||a||^2`` with the squared error
    *averaged* over the synthetic points (Section 3.2, "Solving for J"). The estimate's error
    has a noise part ``<a, xi> / n`` of variance ``sigma_xi^2 ||a||^2 / n^2``, so
    ``lambda = sigma_xi^2 / n^2`` weighs ``||a||^2`` exactly as the noise does (Theorem 3.1: then
    ``J`` bounds the mean squared error). The paper's experiments drop the square (Eq. 5), a
    ``n`` times larger lambda; it shrinks ``a`` towards 0, hence every estimate towards 0, which
    costs little only when the data look like the prior (measured in the README).
    """
    floor = float(min_lambda)
    if not (math.isfinite(floor) and floor >= 0.0):
        raise ValueError(f"min_lambda must be a finite number >= 0, got {min_lambda!r}")
    if isinstance(rule, str):
        variance = float(sketch.sum_noise_variance)
        n = float(sketch.count_estimate) if n_hat is None else float(n_hat)
        if not (math.isfinite(n) and n >= 1.0):
            raise ValueError(f"n_hat must be a finite number >= 1, got {n_hat!r}")
        if rule == "theorem":
            value = variance / (n * n)
        elif rule == "paper":
            value = variance / n
        else:
            raise ValueError(f"lambda rule must be one of {LAMBDA_RULES} or a number, got {rule!r}")
        return max(value, floor)
    value = float(rule)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"lambda must be a finite number >= 0, got {rule!r}")
    return value


def _values_2d(values: ArrayLike, n_rows: int) -> tuple[NDArray[np.float64], bool]:
    """Targets as an (n_s, k) float64 array; also whether the caller gave a vector."""
    arr = np.asarray(values, dtype=np.float64)
    vector = arr.ndim == 1
    if vector:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] != n_rows:
        raise ValueError(
            f"target values must have shape ({n_rows},) or ({n_rows}, k), one row per synthetic "
            f"point, got {np.shape(values)}"
        )
    if not np.isfinite(arr).all():
        row, col = (int(v) for v in np.argwhere(~np.isfinite(arr))[0])
        raise ValueError(
            f"target values hold NaN or inf, first at synthetic point {row}, column {col}"
        )
    return arr, vector


@dataclass(frozen=True, eq=False)
class TargetMoments:
    """Everything M2M needs from target values: ``P^T F / n_s`` and the mean of ``F``.

    Computed once per design by :meth:`SyntheticDesign.target_moments` and reused for any number
    of sketches (each owner's, unions, every epsilon): an estimate then costs an ``m x k``
    product instead of a pass over the ``n_s`` synthetic points.

    Attributes
    ----------
    design : SyntheticDesign
        The design the moments belong to (estimators of another design refuse them).
    cross : ndarray of shape (m, k)
        ``P^T F / n_s``.
    mean : ndarray of shape (k,)
        ``F^T 1 / n_s``.
    vector : bool
        Whether the values were one function given as a vector (estimates are then floats).
    """

    design: SyntheticDesign
    cross: NDArray[np.float64]
    mean: NDArray[np.float64]
    vector: bool

    @property
    def n_targets(self) -> int:
        """``k``, the number of target functions."""
        return int(self.mean.shape[0])


def _one_hot_gram(cols: NDArray[np.integer], fmap: OneHotFeatureMap) -> NDArray[np.float64]:
    """``P^T P`` for one-hot blocks from each row's columns, shape (n, n_blocks): entry
    ``(i, j)`` counts the rows with a 1 in both columns.

    Counts block row by block row (one ``bincount`` of the pairs of block ``b`` and every block
    from ``b`` on, mirrored below the diagonal): ``n B^2 / 2`` increments, and memory for one
    block row, where a sparse product would build all ``m^2`` entries as a sparse matrix first.
    """
    sizes = fmap.block_sizes
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(offsets[-1])
    gram = np.zeros((m, m), dtype=np.float64)
    cols64 = cols.astype(np.int64, copy=False)
    for b in range(sizes.shape[0]):
        lo, width = int(offsets[b]), int(sizes[b])
        rest = m - lo
        codes = (cols64[:, b] - lo)[:, None] * rest + (cols64[:, b:] - lo)
        block = np.bincount(codes.ravel(), minlength=width * rest).reshape(width, rest)
        gram[lo : lo + width, lo:] = block
        gram[lo:, lo : lo + width] = block.T
    return gram


class SyntheticDesign:
    """The sketch-independent part of M2M: synthetic points, their features and Gram matrix.

    Parameters
    ----------
    feature_map : FeatureMap
    points : array-like of shape (n_s, d)
        The synthetic points ``x~_i`` (drawn from the prior; :meth:`draw`), ``n_s >= 1``.
    chunk_size : int
        Rows featurized at once.

    Attributes
    ----------
    feature_map : FeatureMap
    points : ndarray of shape (n_s, d), float64, read-only
    matrix : ndarray or scipy.sparse.csr_array of shape (n_s, m)
        ``P``: dense for RFF; sparse (one 1 per block and row) for RACE and HIST, whose ``m`` can
        be thousands.
    gram : ndarray of shape (m, m), float64
        ``G = P^T P / n_s``.
    feature_mean : ndarray of shape (m,), float64
        ``p_bar = P^T 1 / n_s``, for the intercept variant.

    Raises
    ------
    ValueError
        If ``points`` is not a finite ``(n_s, d)`` array with ``n_s >= 1``.

    Notes
    -----
    Memory: the dense ``P`` holds ``n_s m`` float64 values (160 MB at the paper's
    ``n_s = 1e5``, ``m = 200``); the Gram matrix ``m^2`` (8 MB at ``m = 1000``, 330 MB at RACE's
    ``m = 6400``). Cholesky factors are cached per ``(lambda, intercept)``, at most 16.
    """

    def __init__(
        self, feature_map: FeatureMap, points: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> None:
        if not isinstance(feature_map, FeatureMap):
            raise ValueError(f"feature_map must be a FeatureMap, got {type(feature_map).__name__}")
        pts = np.array(
            check_matrix(points, "synthetic points", n_features=feature_map.n_attributes),
            dtype=np.float64,
        )
        pts.setflags(write=False)
        self.feature_map = feature_map
        self.points = pts
        self.matrix = feature_map.design_matrix(pts, chunk_size=chunk_size)
        n_s = pts.shape[0]
        if isinstance(self.matrix, np.ndarray):
            gram = self.matrix.T @ self.matrix
            mean = self.matrix.sum(axis=0)
        else:
            # One-hot rows: exactly one column per block, in block order (design_matrix).
            assert isinstance(feature_map, OneHotFeatureMap)
            assert self.matrix.nnz == n_s * feature_map.n_blocks
            gram = _one_hot_gram(self.matrix.indices.reshape(n_s, -1), feature_map)
            mean = np.asarray(self.matrix.sum(axis=0)).ravel()
        self.gram: NDArray[np.float64] = np.ascontiguousarray(gram, dtype=np.float64) / n_s
        self.feature_mean: NDArray[np.float64] = np.asarray(mean, dtype=np.float64) / n_s
        self._factors: dict[tuple[float, bool], tuple[NDArray[np.float64], bool]] = {}
        self._within: list[Domain] = []

    def check_within(self, domain: Domain) -> None:
        """Check that every synthetic point lies in ``domain`` (:meth:`Domain.check`), once per
        domain object: the points are read-only, so a domain they passed they pass again (an
        explorer's noise refits share their sketch's domain and skip the ``n_s``-row check).

        Raises
        ------
        InvalidArgumentError
            If a point lies outside ``domain`` (naming it).
        """
        if any(seen is domain for seen in self._within):
            return
        domain.check(self.points, "synthetic points")
        self._within = [*self._within[-(_DOMAINS_KEPT - 1) :], domain]

    @classmethod
    def draw(
        cls,
        feature_map: FeatureMap,
        domain: Domain,
        rng: np.random.Generator,
        *,
        n_synthetic: int = DEFAULT_N_SYNTHETIC,
        prior: Prior | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> SyntheticDesign:
        """Draw ``n_synthetic`` points from the prior and build the design.

        Parameters
        ----------
        feature_map : FeatureMap
        domain : Domain
            The public domain; the prior's points must lie in it.
        rng : numpy.random.Generator
            Passed to the prior.
        n_synthetic : int
            ``n_s >= 1`` (default 1e5, the paper's).
        prior : callable, optional
            ``prior(n, rng) -> (n, d)``; default ``domain.sample_uniform`` (the paper's uniform
            prior, Section 3.2).
        chunk_size : int

        Returns
        -------
        SyntheticDesign

        Raises
        ------
        ValueError
            If ``n_synthetic < 1``, the map and the domain disagree on ``d``, or the prior
            returns points of the wrong shape or outside the domain (naming row and column).
        """
        n_s = check_positive_int(n_synthetic, "n_synthetic")
        if feature_map.n_attributes != domain.n_attributes:
            raise ValueError(
                f"the feature map takes {feature_map.n_attributes} attributes but the domain has "
                f"{domain.n_attributes}"
            )
        sample = domain.sample_uniform if prior is None else prior
        points = domain.check(sample(n_s, rng), "prior sample")
        if points.shape[0] != n_s:
            raise ValueError(f"the prior returned {points.shape[0]} points, expected {n_s}")
        return cls(feature_map, points, chunk_size=chunk_size)

    @property
    def n_synthetic(self) -> int:
        """``n_s``, the number of synthetic points."""
        return int(self.points.shape[0])

    @property
    def dimension(self) -> int:
        """``m``, the feature dimension."""
        return self.feature_map.dimension

    def _factor(self, lam: float, intercept: bool) -> tuple[NDArray[np.float64], bool]:
        key = (float(lam), bool(intercept))
        factor = self._factors.get(key)
        if factor is None:
            system = self.gram.copy()
            if intercept:
                system -= np.outer(self.feature_mean, self.feature_mean)
            system[np.diag_indices_from(system)] += lam
            try:
                factor = scipy.linalg.cho_factor(system, lower=False, check_finite=False)
            except np.linalg.LinAlgError:
                raise ValueError(
                    f"the M2M system G + lambda I is not positive definite at lambda = {lam:g} "
                    f"(m = {self.dimension}, n_s = {self.n_synthetic}); use a larger lambda"
                ) from None
            if len(self._factors) >= _FACTOR_CACHE_SIZE:
                self._factors.pop(next(iter(self._factors)))
            self._factors[key] = factor
        return factor

    def target_moments(self, values: ArrayLike | TargetMoments) -> TargetMoments:
        """``P^T F / n_s`` and the mean of ``F`` for targets given by their values.

        Parameters
        ----------
        values : array-like of shape (n_s,) or (n_s, k), or TargetMoments
            ``F``: the target functions' values at :attr:`points`, one column per function
            (moments already computed on this design are returned as they are).

        Returns
        -------
        TargetMoments

        Raises
        ------
        ValueError
            On a shape mismatch, NaN/inf values, or moments of another design.
        """
        if isinstance(values, TargetMoments):
            if values.design is not self:
                raise ValueError("these target moments were computed on another design")
            return values
        f, vector = _values_2d(values, self.n_synthetic)
        cross = np.asarray(self.matrix.T @ f, dtype=np.float64) / self.n_synthetic
        return TargetMoments(self, cross, f.mean(axis=0), vector)

    def solve(self, rhs: ArrayLike, lam: float, *, intercept: bool = False) -> NDArray[np.float64]:
        """``(G + lambda I)^{-1} rhs`` (``G`` centered, ``G - p_bar p_bar^T``, with an intercept),
        by the cached Cholesky factor.

        Parameters
        ----------
        rhs : array-like of shape (m,) or (m, k)
        lam : float
            ``lambda >= 0``.
        intercept : bool

        Returns
        -------
        ndarray of the shape of ``rhs``

        Raises
        ------
        ValueError
            If ``rhs`` does not have ``m`` rows or the system is not positive definite.
        """
        b = np.asarray(rhs, dtype=np.float64)
        if b.ndim not in (1, 2) or b.shape[0] != self.dimension:
            raise ValueError(f"rhs must have {self.dimension} rows, got shape {b.shape}")
        return np.asarray(
            scipy.linalg.cho_solve(self._factor(lam, intercept), b, check_finite=False),
            dtype=np.float64,
        )

    def coefficients(
        self, values: ArrayLike | TargetMoments, lam: float, *, intercept: bool = False
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Ridge coefficients of the targets on the features.

        Parameters
        ----------
        values : array-like of shape (n_s,) or (n_s, k), or TargetMoments
            ``F``: the target functions' values at the synthetic points, one column per function.
        lam : float
            ``lambda >= 0``.
        intercept : bool
            Also fit an unpenalized constant ``a_0`` (the average of the constant function is
            exactly 1 over any data set, so it needs no sketch coordinate and carries no noise).

        Returns
        -------
        a : ndarray of shape (m, k)
            ``(G + lambda I)^{-1} P^T F / n_s`` (centered ``G`` and ``F`` with an intercept).
        a0 : ndarray of shape (k,)
            The intercepts (zeros without).

        Raises
        ------
        ValueError
            On a shape mismatch, NaN/inf targets, or a system that is not positive definite.
        """
        tm = self.target_moments(values)
        rhs = tm.cross - np.outer(self.feature_mean, tm.mean) if intercept else tm.cross
        a = self.solve(rhs, lam, intercept=intercept)
        a0 = tm.mean - self.feature_mean @ a if intercept else np.zeros(tm.n_targets)
        return a, a0

    def weights(self, z: ArrayLike, lam: float, *, intercept: bool = False) -> NDArray[np.float64]:
        """Implicit-M2M weights ``w_i`` of the synthetic points for a sketch ``z`` (Section 3.5).

        ``sum_i w_i f(x~_i)`` equals the M2M estimate of ``f_bar`` for *every* target ``f``:
        ``w_i = Phi(x~_i)^T (G + lambda I)^{-1} z / n_s`` (the paper's ``Phi^T S z_hat`` with the
        ``1 / n_s`` that its ``S`` leaves out); with an intercept,
        ``w_i = (1 + (Phi(x~_i) - p_bar)^T (G_c + lambda I)^{-1} (z - p_bar)) / n_s``.

        Parameters
        ----------
        z : array-like of shape (m,)
        lam : float
        intercept : bool

        Returns
        -------
        ndarray of shape (n_s,), float64 (entries may be negative)
        """
        return self._weights_from_dual(self._dual(z, lam, intercept), intercept)

    def _weights_from_dual(self, v: NDArray[np.float64], intercept: bool) -> NDArray[np.float64]:
        w = np.asarray(self.matrix @ v, dtype=np.float64)
        if intercept:
            w = w + (1.0 - self.feature_mean @ v)
        return w / self.n_synthetic

    def _dual(self, z: ArrayLike, lam: float, intercept: bool) -> NDArray[np.float64]:
        """``v = (G + lambda I)^{-1} z`` (centered: ``(G_c + lambda I)^{-1} (z - p_bar)``)."""
        vec = np.asarray(z, dtype=np.float64)
        if vec.shape != (self.dimension,):
            raise ValueError(f"z must have shape ({self.dimension},), got {vec.shape}")
        if intercept:
            vec = vec - self.feature_mean
        return self.solve(vec, lam, intercept=intercept)


class M2MEstimator:
    """M2M on one sketch: estimates ``(1/n) sum_i f(x_i)`` for any ``f`` (Algorithm 1).

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
        The released sketch (or a union of sketches).
    design : SyntheticDesign, optional
        A design with the sketch's feature map and points inside its domain (reused across
        sketches that share the map). Drawn from ``prior`` with ``rng`` when omitted.
    rng : numpy.random.Generator, optional
        Needed when ``design`` is omitted.
    n_synthetic : int
        ``n_s`` when drawing a design (default 1e5).
    prior : callable, optional
        ``prior(n, rng)``; default uniform on the sketch's domain.
    lambda_rule : {"theorem", "paper"} or float
        See :func:`regularization` (default ``"theorem"``).
    min_lambda : float
        Floor of a rule's lambda (default 1e-9).
    intercept : bool
        Fit an unpenalized constant (see :meth:`SyntheticDesign.coefficients`); default
        ``False`` (the paper's model).
    n_hat : float, optional
        The record count the embedding ``z_hat`` divides the noisy sum by, the lambda rule
        reads (:func:`regularization`) and an implicit fit's weights add up to
        (:func:`~dpmarket.common.sketches.tasks.implicit_logistic_regression`), ``>= 1``
        (default ``sketch.count_estimate``, the noisy count alone). ``explore`` passes the
        combined estimate (:func:`dpmarket.common.sketches.intervals.count_estimate`: for a
        one-hot map, the count and every block's total), the one ``n`` its other answers take.

    Attributes
    ----------
    sketch, design, lam, intercept, n_hat

    Raises
    ------
    ValueError
        If the design's map differs from the sketch's, its points leave the sketch's domain,
        neither ``design`` nor ``rng`` is given, the lambda rule is invalid, or ``n_hat`` is
        below 1 or not finite.

    Notes
    -----
    Error sources (Section 3.3): the prior's sampling (``n_s``), the approximation of ``f`` by
    ``<a, Phi>``, the shift between prior and data, and the sketch's noise, whose part in the
    estimate is ``<a, xi> / n_hat`` (variance ``sigma_xi^2 ||a||^2 / n_hat^2``) plus the relative
    error ``zeta / n_hat`` of the count, which scales every estimate.
    """

    def __init__(
        self,
        sketch: SketchLike,
        *,
        design: SyntheticDesign | None = None,
        rng: np.random.Generator | None = None,
        n_synthetic: int = DEFAULT_N_SYNTHETIC,
        prior: Prior | None = None,
        lambda_rule: LambdaRule | float = DEFAULT_LAMBDA_RULE,
        min_lambda: float = MIN_LAMBDA,
        intercept: bool = False,
        n_hat: float | None = None,
    ) -> None:
        n = float(sketch.count_estimate) if n_hat is None else float(n_hat)
        if not (math.isfinite(n) and n >= 1.0):
            raise ValueError(f"n_hat must be a finite number >= 1, got {n_hat!r}")
        if design is None:
            if rng is None:
                raise ValueError("M2MEstimator needs a design or an rng to draw one")
            design = SyntheticDesign.draw(
                sketch.feature_map, sketch.domain, rng, n_synthetic=n_synthetic, prior=prior
            )
        else:
            if design.feature_map != sketch.feature_map:
                raise ValueError(
                    "the design's feature map differs from the sketch's: M2M must regress on the "
                    "features the sketch was made with"
                )
            design.check_within(sketch.domain)
        self.sketch = sketch
        self.design = design
        self.lambda_rule = lambda_rule
        self.n_hat = n
        self.lam = regularization(sketch, lambda_rule, min_lambda=min_lambda, n_hat=n)
        self.intercept = bool(intercept)
        z = np.asarray(sketch.mean_embedding, dtype=np.float64)
        # z_hat = noisy sum / n: the sketch's own embedding divides by its count estimate.
        self._z = z if n_hat is None else z * (float(sketch.count_estimate) / n)
        self._v: NDArray[np.float64] | None = None

    @property
    def points(self) -> NDArray[np.float64]:
        """The synthetic points, shape (n_s, d): evaluate target functions here."""
        return self.design.points

    @property
    def domain(self) -> Domain:
        """The sketch's public domain."""
        return self.sketch.domain

    def coefficients(
        self, values: ArrayLike | TargetMoments
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(a, a0)`` for target values at :attr:`points` (or their moments); see
        :meth:`SyntheticDesign.coefficients`."""
        return self.design.coefficients(values, self.lam, intercept=self.intercept)

    def _dual(self) -> NDArray[np.float64]:
        if self._v is None:
            self._v = self.design._dual(self._z, self.lam, self.intercept)
        return self._v

    def estimate_values(self, values: ArrayLike | TargetMoments) -> float | NDArray[np.float64]:
        """``a0 + <a, z_hat>`` for targets given by their values at :attr:`points`.

        Computed as ``(P^T F / n_s)^T v`` with ``v = (G + lambda I)^{-1} z_hat`` solved once per
        estimator (``<a, z> = <(G + lambda I)^{-1} P^T F / n_s, z>`` and ``G`` is symmetric), so
        each further target costs a product with ``P``, or nothing but an ``m x k`` product when
        its :class:`TargetMoments` are given.

        Parameters
        ----------
        values : array-like of shape (n_s,) or (n_s, k), or TargetMoments of this design

        Returns
        -------
        float for a vector of values, else ndarray of shape (k,)

        Raises
        ------
        ValueError
            On a shape mismatch, NaN/inf values, or moments of another design.
        """
        tm = self.design.target_moments(values)
        v = self._dual()
        if self.intercept:
            cross = tm.cross - np.outer(self.design.feature_mean, tm.mean)
            out = tm.mean + cross.T @ v
        else:
            out = tm.cross.T @ v
        return float(out[0]) if tm.vector else np.asarray(out, dtype=np.float64)

    def estimate(
        self, f: Callable[[NDArray[np.float64]], ArrayLike]
    ) -> float | NDArray[np.float64]:
        """Estimate ``(1/n) sum_i f(x_i)`` over the sketched data.

        Parameters
        ----------
        f : callable
            ``f(points)`` with ``points`` of shape (n_s, d) returns shape (n_s,) or (n_s, k)
            (``k`` functions estimated at once).

        Returns
        -------
        float or ndarray of shape (k,)
        """
        return self.estimate_values(f(self.points))

    def weights(self) -> NDArray[np.float64]:
        """Implicit-M2M weights of :attr:`points` (:meth:`SyntheticDesign.weights`), shape (n_s,).

        ``weights() @ f(points) == estimate(f)`` up to rounding, for every ``f``.
        """
        return self.design._weights_from_dual(self._dual(), self.intercept)
