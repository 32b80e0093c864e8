"""Random Fourier features of the RBF kernel: the shared hash function h1.

``h1(x) @ h1(y)`` is an unbiased estimate of ``exp(-gamma * ||z(x) - z(y)||**2)``; the curator draws
the parameters once per session and sends them to the owners as data (see DESIGN, "h1
parameters"). ``z`` is the session's feature scaling (:class:`FeatureScaling`): with a schema,
every feature is mapped to [0, 1] by its public bounds, ``z = (x - low) / (high - low)``, before
the map, so one ``gamma`` serves features whose raw ranges differ by orders of magnitude; without
one, ``z(x) = x``.

References
----------
Summarization paper, Algorithm 1; Rahimi & Recht, "Random features for large-scale kernel
machines", NeurIPS 2008.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from dpmarket.common.fourier import cos32
from dpmarket.common.validation import check_matrix, check_positive_int

__all__ = [
    "FeatureScaling",
    "RFFParams",
    "draw_rff_params",
    "kernel_points",
    "random_fourier_features",
]


@dataclass(frozen=True, eq=False)
class FeatureScaling:
    """How a session's kernel reads each feature: ``z = (x - low) / (high - low)``.

    The bounds are a schema's declared public ``(low, high)`` per feature
    (:func:`dpmarket.common.summarization.kernels.feature_bounds`), so the scaling releases
    nothing: every party holds the declaration. A point within its bounds maps into
    ``[0, 1]`` per feature; unit bounds (``low = 0``, ``high = 1``) leave every value bit for
    bit as it is (``(x - 0.0) / 1.0 == x`` in IEEE arithmetic).

    Attributes
    ----------
    low, high : ndarray of shape (n_features,), float64
        Each feature's public bounds, in its own units; finite, ``low < high`` and ``high -
        low`` finite.
    width : ndarray of shape (n_features,), float64
        ``high - low`` (derived, > 0).

    Raises
    ------
    ValueError
        If ``low`` or ``high`` is not 1-D, their lengths differ or are 0, or a bound is NaN,
        infinite, ``low >= high`` or ``high - low`` overflows.

    Notes
    -----
    Read-only float64 copies; equality compares the arrays exactly; unhashable. Every party
    computes ``z`` by the same two float64 operations (:meth:`apply`), so an owner's features
    and the curator's recomputation of a released point agree bit for bit.
    """

    low: NDArray[np.float64]
    high: NDArray[np.float64]
    width: NDArray[np.float64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        low = np.array(self.low, dtype=np.float64)
        high = np.array(self.high, dtype=np.float64)
        if low.ndim != 1 or high.shape != low.shape or low.size == 0:
            raise ValueError(
                f"feature scaling bounds must be two 1-D arrays of one length >= 1, got shapes "
                f"{low.shape} and {high.shape}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            width = high - low
        if not (np.isfinite(low).all() and np.isfinite(high).all() and np.isfinite(width).all()):
            raise ValueError("feature scaling bounds must be finite, with a finite high - low")
        if not (width > 0).all():
            column = int(np.argmax(~(width > 0)))
            raise ValueError(
                f"feature scaling bounds must satisfy low < high, got [{low[column]:g}, "
                f"{high[column]:g}] for feature {column}"
            )
        low.setflags(write=False)
        high.setflags(write=False)
        width.setflags(write=False)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "width", width)

    @classmethod
    def of_bounds(cls, bounds: ArrayLike) -> FeatureScaling:
        """From an array of shape (n_features, 2) of ``(low, high)`` rows (a schema's
        :func:`~dpmarket.common.summarization.kernels.feature_bounds`).

        Raises
        ------
        ValueError
            If ``bounds`` is not of shape (n_features, 2), or as the constructor.
        """
        b = np.asarray(bounds, dtype=np.float64)
        if b.ndim != 2 or b.shape[1] != 2:
            raise ValueError(f"bounds must have shape (n_features, 2), got {b.shape}")
        return cls(low=b[:, 0], high=b[:, 1])

    @property
    def n_features(self) -> int:
        """Number of features ``n``."""
        return int(self.low.shape[0])

    def apply(self, x: NDArray[np.floating]) -> NDArray[np.float64]:
        """``(x - low) / (high - low)`` of a 2-D array ``x`` of shape (n_points, n_features),
        float64; a new array."""
        return (np.asarray(x, dtype=np.float64) - self.low) / self.width

    def __eq__(self, other: object) -> bool:
        """Exact equality of the bounds."""
        if not isinstance(other, FeatureScaling):
            return NotImplemented
        return np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high)

    __hash__ = None  # type: ignore[assignment]


def kernel_points(x: NDArray[np.floating], scaling: FeatureScaling | None) -> NDArray[np.floating]:
    """The points as a session's kernel reads them: ``scaling.apply(x)``, or ``x`` itself
    without a scaling.

    Parameters
    ----------
    x : ndarray of shape (n_points, n_features)
    scaling : FeatureScaling or None

    Returns
    -------
    ndarray of shape (n_points, n_features)

    Raises
    ------
    ValueError
        If ``x`` is not 2-D with ``scaling.n_features`` columns.
    """
    if scaling is None:
        return x
    if x.ndim != 2 or x.shape[1] != scaling.n_features:
        raise ValueError(
            f"points of shape {x.shape} do not match a scaling of {scaling.n_features} features"
        )
    return scaling.apply(x)


@dataclass(frozen=True, eq=False)
class RFFParams:
    """Parameters of h1: ``d`` frequencies and ``d`` phases, drawn once per session.

    Attributes
    ----------
    omega : ndarray of shape (d, n_features), float64
        Frequencies; row ``i`` is ``omega_i`` drawn from ``N(0, 2 * gamma * I)``, the Fourier
        transform of the RBF kernel ``exp(-gamma * ||x - y||**2)``.
    phase : ndarray of shape (d,), float64
        Phases ``b_i`` drawn from ``Uniform[0, 2 pi)``.
    gamma : float
        RBF kernel parameter (inverse squared length), > 0, in 1 / squared units of the
        scaled features ``z`` (the raw features' own units without a scaling).
    scaling : FeatureScaling or None
        How every party maps a point before the features: ``z = (x - low) / (high - low)``
        by the schema's public bounds; None: ``z = x`` (a session without a schema).

    Raises
    ------
    ValueError
        If ``omega`` is not 2-D, ``phase`` is not 1-D of length ``omega.shape[0]``, either holds
        NaN or inf, ``gamma`` is not a finite number > 0, or ``scaling`` is neither None nor a
        :class:`FeatureScaling` of ``omega.shape[1]`` features.

    Notes
    -----
    The arrays are stored as read-only float64 copies. Equality compares the arrays (and the
    scalings) exactly; instances are unhashable.

    References
    ----------
    Summarization paper, Algorithm 1, steps 3-4.
    """

    omega: NDArray[np.float64]
    phase: NDArray[np.float64]
    gamma: float
    scaling: FeatureScaling | None = None

    def __post_init__(self) -> None:
        omega = check_matrix(self.omega, "RFF frequency matrix omega")
        if self.scaling is not None and (
            not isinstance(self.scaling, FeatureScaling)
            or self.scaling.n_features != omega.shape[1]
        ):
            raise ValueError(
                f"the feature scaling must be a FeatureScaling of {omega.shape[1]} features to "
                f"match omega of shape {omega.shape}, got {self.scaling!r}"
            )
        phase = np.asarray(self.phase)
        if phase.ndim != 1 or phase.shape[0] != omega.shape[0]:
            raise ValueError(
                f"RFF phase must have shape ({omega.shape[0]},) to match omega of shape "
                f"{omega.shape}, got {phase.shape}"
            )
        if not np.issubdtype(phase.dtype, np.number) or np.issubdtype(
            phase.dtype, np.complexfloating
        ):
            raise ValueError(f"RFF phase must hold real numbers, got dtype {phase.dtype}")
        phase = np.ascontiguousarray(phase, dtype=np.float64)
        if not np.isfinite(phase).all():
            raise ValueError("RFF phase holds NaN or inf values")
        gamma = float(self.gamma)
        if not math.isfinite(gamma) or gamma <= 0:
            raise ValueError(f"gamma must be a finite number > 0, got {self.gamma}")
        # Store validated float64 copies that cannot be mutated through the caller's references.
        omega = omega.copy() if omega is self.omega else omega
        phase = phase.copy() if phase is self.phase else phase
        omega.setflags(write=False)
        phase.setflags(write=False)
        object.__setattr__(self, "omega", omega)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "gamma", gamma)

    def __eq__(self, other: object) -> bool:
        """Exact equality of ``omega``, ``phase``, ``gamma`` and ``scaling`` (arrays compared
        elementwise)."""
        if not isinstance(other, RFFParams):
            return NotImplemented
        if (self.scaling is None) != (other.scaling is None):
            return False
        return (
            self.gamma == other.gamma
            and np.array_equal(self.omega, other.omega)
            and np.array_equal(self.phase, other.phase)
            and (self.scaling is None or self.scaling == other.scaling)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def d(self) -> int:
        """Number of random features ``d`` (the h1 output dimension)."""
        return int(self.omega.shape[0])

    @property
    def n_features(self) -> int:
        """Dimension ``n`` of the input points."""
        return int(self.omega.shape[1])


def draw_rff_params(
    n_features: int,
    d: int,
    gamma: float,
    rng: np.random.Generator,
    *,
    scaling: FeatureScaling | None = None,
) -> RFFParams:
    """Draw the h1 parameters for an RBF kernel with parameter ``gamma``.

    Parameters
    ----------
    n_features : int
        Dimension ``n`` of the input points, >= 1.
    d : int
        Number of random features, >= 1 (the paper's experiments use ``d = 140``).
    gamma : float
        RBF kernel parameter, > 0 (the paper's experiments use ``gamma = 0.1``).
    rng : numpy.random.Generator
        Source of randomness; production code passes
        :func:`dpmarket.common.privacy.rng.production_rng`.
    scaling : FeatureScaling, optional
        The session's feature scaling (:class:`FeatureScaling`), carried by the parameters;
        it draws nothing (the same ``rng`` gives the same ``omega`` and ``phase`` with or
        without it).

    Returns
    -------
    RFFParams
        ``omega`` of shape (d, n_features) with i.i.d. ``N(0, 2 * gamma)`` entries, then ``phase``
        of shape (d,) with i.i.d. ``Uniform[0, 2 pi)`` entries, drawn in that order from ``rng``;
        ``scaling`` as given.

    Raises
    ------
    ValueError
        If ``n_features`` or ``d`` is not an integer >= 1, ``gamma`` is not a finite number > 0,
        or ``scaling`` has another feature count.

    References
    ----------
    Summarization paper, Algorithm 1, steps 3-4: ``p(omega) = N(0, 2 gamma I_n)`` for the RBF
    kernel ``k(Delta) = exp(-gamma Delta**2)``.
    """
    n_features = check_positive_int(n_features, "n_features")
    d = check_positive_int(d, "d")
    gamma_f = float(gamma)
    if not math.isfinite(gamma_f) or gamma_f <= 0:
        raise ValueError(f"gamma must be a finite number > 0, got {gamma}")
    omega = rng.normal(loc=0.0, scale=math.sqrt(2.0 * gamma_f), size=(d, n_features))
    phase = rng.uniform(0.0, 2.0 * math.pi, size=d)
    return RFFParams(omega=omega, phase=phase, gamma=gamma_f, scaling=scaling)


def random_fourier_features(
    x: ArrayLike,
    params: RFFParams,
    *,
    dtype: DTypeLike = np.float32,
    chunk_size: int = 2048,
) -> NDArray[np.floating]:
    """Map points to random Fourier features of the RBF kernel (h1).

    Computes ``sqrt(2/d) * cos(z @ omega.T + phase)``, ``z`` the points under the parameters'
    feature scaling (``(x - low) / (high - low)``, :class:`FeatureScaling`; ``z = x`` without
    one), so that ``h1(x) @ h1(y)`` is an unbiased estimate of ``exp(-gamma * ||z(x) -
    z(y)||**2)``.

    Parameters
    ----------
    x : array-like of shape (n_points, n_features)
        Points in their own units (the scaling, if any, is applied here, chunk by chunk);
        zero rows are allowed.
    params : RFFParams
        The session's h1 parameters.
    dtype : numpy floating dtype, default float32
        Output dtype. The projection ``x @ omega.T + phase`` is computed in float64, the cosine in
        float32 (:func:`dpmarket.common.fourier.cos32`, which first reduces every angle in
        float64, whatever its size, so that the time does not depend on the rows: within 4e-6
        of the float64 cosine, about 15 times faster), the scaling in
        ``dtype``. An angle that is NaN, infinite or beyond
        :data:`dpmarket.common.fourier.ANGLE_LIMIT` (parameters far beyond any honest draw for
        the data's scale) is taken as 0: the features are finite whatever the parameters.
    chunk_size : int, default 2048
        Number of rows processed at once; bounds the float64 working memory to
        ``chunk_size * (d + n_features)`` values (2.3 MiB at d = 140: the default keeps them in
        the CPU's cache, 1.7 times faster here than 65,536 rows). The result does not depend on
        it (bit for bit).

    Returns
    -------
    ndarray of shape (n_points, d) and dtype ``dtype``
        Every entry is finite and lies in ``[-sqrt(2/d), sqrt(2/d)]`` (the cosine is clipped to
        ``[-1, 1]`` before scaling, so the bound holds exactly for float64 output: an owner's sums
        of h1 keep the sensitivity their docstrings derive from it).

    Raises
    ------
    ValueError
        If ``x`` is not 2-D, ``x.shape[1] != params.n_features``, ``x`` holds NaN or inf, or
        ``chunk_size`` is not an integer >= 1.

    Notes
    -----
    Row ``i`` of the output is a function of row ``i`` of ``x`` alone, computed by the same
    floating-point operations whatever the chunking: the projection is a batched
    ``(1, n) @ (n, d)`` product per row rather than one ``(chunk, n) @ (n, d)`` GEMM, whose BLAS
    kernels change the summation order with the number of rows (measured with OpenBLAS: a
    single-row GEMM differs from a 1000-row GEMM in the last bits, enough to flip float32 values).
    So an owner's features and the curator's recomputation of one acquired point agree exactly.

    References
    ----------
    Summarization paper, Algorithm 1, step 5; Rahimi & Recht (2008).
    """
    arr = check_matrix(x, "x", n_features=params.n_features, allow_empty=True)
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    out_dtype = np.dtype(dtype)
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a floating dtype, got {out_dtype}")
    d = params.d
    scale = math.sqrt(2.0 / d)
    omega_t = np.ascontiguousarray(params.omega.T)  # (n_features, d)
    out = np.empty((arr.shape[0], d), dtype=out_dtype)
    for start in range(0, arr.shape[0], chunk_size):
        block = np.ascontiguousarray(kernel_points(arr[start : start + chunk_size], params.scaling))
        with np.errstate(over="ignore", invalid="ignore"):  # cos32 takes such angles as 0
            z = np.matmul(block[:, None, :], omega_t)[:, 0, :]  # (rows, d), float64
            z += params.phase
        rows = out[start : start + block.shape[0]]
        rows[...] = cos32(z)
        rows *= scale
    return out
