"""Feature maps of the private sketches: RFF, RACE and HIST (M2M paper, Section 2.1).

A feature map ``Phi : R^d -> R^m`` turns one record into a bounded vector; a sketch is the sum
(then the mean) of ``Phi`` over a data set. Every map here is defined by public parameters held as
plain arrays and numbers (never a seed into a library's generator), so that an owner, the curator
and every consumer compute identical features from the parameters they received as data, on any
machine and library version. Randomized parameters are drawn by :func:`draw_rff` and
:func:`draw_race` from an injected ``numpy.random.Generator``; :func:`histogram_map` is
deterministic.

Each map states ``dimension`` (``m``) and the L1 and L2 sensitivities of the sum of features
under adding or removing one record, ``max_x ||Phi(x)||_1`` and ``max_x ||Phi(x)||_2``, derived in
its docstring. :meth:`FeatureMap.parameters` and :func:`feature_map_from_parameters` convert a map
to and from plain values (for messages).

References
----------
M2M paper, Section 2.1 (Definitions 2 and 3, HIST) and Section 2.3 (sensitivities);
Rahimi & Recht, "Random features for large-scale kernel machines", NeurIPS 2008;
Coleman & Shrivastava, "Sub-linear RACE sketches for approximate kernel density estimation on
streaming data", WWW 2020; Datar, Immorlica, Indyk & Mirrokni, "Locality-sensitive hashing
scheme based on p-stable distributions", SoCG 2004.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.sparse
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.fourier import cos_sin32
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.validation import check_epsilon, check_matrix, check_positive_int

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "FEATURE_MAP_KINDS",
    "FeatureMap",
    "HISTMap",
    "OneHotFeatureMap",
    "RACEMap",
    "RFFMap",
    "draw_race",
    "draw_rff",
    "feature_map_from_parameters",
    "histogram_map",
]

#: Rows processed at once by :meth:`FeatureMap.features` and friends: bounds the float64 working
#: memory to ``DEFAULT_CHUNK_SIZE * m`` values (13 MB at m = 200) whatever the number of records.
DEFAULT_CHUNK_SIZE = 8192

#: Most angles (rows x frequencies) an RFF feature sum computes at once: 4 MiB of float64.
CACHE_BLOCK_VALUES = 1 << 19

#: Relative margin under each declared norm that a computed RFF row is scaled into (covers the
#: float64 rounding of the row's norms; :class:`RFFMap` Notes).
NORM_MARGIN = 1.0 - 1e-9

#: The ``kind`` of every feature map, as :func:`feature_map_from_parameters` accepts it.
FEATURE_MAP_KINDS = ("rff", "race", "hist")


def _readonly_matrix(value: ArrayLike, name: str) -> NDArray[np.float64]:
    out = np.array(check_matrix(value, name), dtype=np.float64)
    out.setflags(write=False)
    return out


def _readonly_vector(value: ArrayLike, name: str, size: int) -> NDArray[np.float64]:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    out = np.array(arr, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ValueError(f"{name} holds NaN or inf values")
    out.setflags(write=False)
    return out


class FeatureMap(abc.ABC):
    """A bounded feature map ``Phi : R^d -> R^m`` with public parameters (abstract base).

    Subclasses are frozen dataclasses whose fields are the public parameters. Equality compares
    the parameters exactly (two sketches can be merged or compared only under equal maps).
    """

    #: Short name of the map: ``"rff"``, ``"race"`` or ``"hist"``.
    kind: ClassVar[str]

    @property
    @abc.abstractmethod
    def n_attributes(self) -> int:
        """``d``, the number of attributes of a record."""

    @property
    @abc.abstractmethod
    def dimension(self) -> int:
        """``m``, the length of a feature vector (and of the sketch)."""

    @property
    @abc.abstractmethod
    def l1_sensitivity(self) -> float:
        """``max_x ||Phi(x)||_1``: the L1 change of the sum of features when a record is added
        or removed (see the subclass for the derivation)."""

    @property
    @abc.abstractmethod
    def l2_sensitivity(self) -> float:
        """``max_x ||Phi(x)||_2``: the L2 change of the sum of features when a record is added
        or removed."""

    @abc.abstractmethod
    def parameters(self) -> dict[str, Any]:
        """The public parameters as plain values: numpy arrays, floats and ints.

        ``feature_map_from_parameters(self.kind, self.parameters()) == self``.
        """

    @abc.abstractmethod
    def _features_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.float64]:
        """Features of a validated block of rows, shape (rows, m); ``row0`` is the block's first
        row in the caller's array (for error messages)."""

    def _check_points(self, x: ArrayLike) -> NDArray[np.float64]:
        return np.asarray(
            check_matrix(x, "x", n_features=self.n_attributes, allow_empty=True), dtype=np.float64
        )

    def features(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.float64]:
        """Map every record to its feature vector.

        Parameters
        ----------
        x : array-like of shape (n, d)
            Records; zero rows are allowed.
        chunk_size : int
            Rows computed at once (bounds the working memory; the result does not depend on it).

        Returns
        -------
        ndarray of shape (n, m), float64

        Raises
        ------
        ValueError
            If ``x`` is not 2-D with ``d`` columns or holds NaN or inf (and, for HIST, a value
            outside the histogram's range, naming row and column), or ``chunk_size < 1``.
        """
        arr = self._check_points(x)
        step = check_positive_int(chunk_size, "chunk_size")
        out = np.empty((arr.shape[0], self.dimension), dtype=np.float64)
        for start in range(0, arr.shape[0], step):
            out[start : start + step] = self._features_chunk(arr[start : start + step], start)
        return out

    def feature_sum(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.float64]:
        """``sum_i Phi(x_i)``, the sum of features (the sketch's numerator, Definition 1).

        Computed chunk by chunk without holding all ``n x m`` features in memory.

        Parameters
        ----------
        x : array-like of shape (n, d)
        chunk_size : int

        Returns
        -------
        ndarray of shape (m,), float64 (zeros for ``n = 0``)

        Raises
        ------
        ValueError
            As :meth:`features`.
        """
        arr = self._check_points(x)
        step = check_positive_int(chunk_size, "chunk_size")
        total = np.zeros(self.dimension, dtype=np.float64)
        for start in range(0, arr.shape[0], step):
            total += self._features_chunk(arr[start : start + step], start).sum(axis=0)
        return total

    def design_matrix(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.float64] | scipy.sparse.csr_array:
        """The features of ``x`` as the matrix M2M regresses on: dense here, sparse for one-hot
        maps (:class:`OneHotFeatureMap`). Shape (n, m), float64."""
        return self.features(x, chunk_size=chunk_size)

    def __eq__(self, other: object) -> bool:
        """Same kind and exactly equal parameters."""
        if not isinstance(other, FeatureMap):
            return NotImplemented
        if self.kind != other.kind:
            return False
        mine, theirs = self.parameters(), other.parameters()
        if mine.keys() != theirs.keys():
            return False
        return all(np.array_equal(np.asarray(mine[k]), np.asarray(theirs[k])) for k in mine)

    __hash__ = None  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        """Kind, sizes and sensitivities as plain values (for reports; no arrays)."""
        return {
            "kind": self.kind,
            "n_attributes": self.n_attributes,
            "dimension": self.dimension,
            "l1_sensitivity": self.l1_sensitivity,
            "l2_sensitivity": self.l2_sensitivity,
        }


@dataclass(frozen=True, eq=False)
class RFFMap(FeatureMap):
    """Random Fourier features ``Phi(x) = [cos(Omega^T x), sin(Omega^T x)]`` (Definition 2).

    Attributes
    ----------
    omega : ndarray of shape (m', d), float64
        The ``m'`` frequency vectors ``omega_j`` (rows), drawn i.i.d. from the Fourier transform
        of the kernel: ``N(0, sigma^-2 I_d)`` for the Gaussian kernel
        ``exp(-||x - x'||^2 / (2 sigma^2))`` (:func:`draw_rff`). ``m = 2 m'``.
    sigma : float
        The kernel's length scale (the paper's sigma), > 0, in the units ``omega`` was drawn in:
        the data's units for :func:`draw_rff`; a fraction of each column's width for a
        catalogue spec, whose columns are scaled by their widths
        (:mod:`dpmarket.common.sketches.spec`). Recorded for the consumer; the features depend on
        ``omega`` only.

    Raises
    ------
    ValueError
        If ``omega`` is not a finite 2-D array or ``sigma`` is not a finite number > 0.

    Notes
    -----
    Features: column ``j`` is ``cos(omega_j . x)`` and column ``m' + j`` is ``sin(omega_j . x)``,
    so ``Phi(x) . Phi(x') = sum_j cos(omega_j . (x - x'))``, ``m'`` times a Monte Carlo estimate
    of the kernel (Bochner's theorem); no ``1/sqrt(m')`` factor, as in the paper.

    Sensitivities (adding or removing one record ``x`` changes the sum of features by
    ``Phi(x)``, so each is the maximum norm of one feature vector):

    * L2: ``||Phi(x)||_2^2 = sum_j (cos^2 + sin^2)(omega_j . x) = m'`` for every ``x``, so
      ``Delta_2 = sqrt(m')``, attained by every record.
    * L1: ``|cos t| + |sin t| = sqrt(cos^2 t + sin^2 t + 2 |cos t sin t|) = sqrt(1 + |sin 2t|)
      <= sqrt(2)``, with equality at ``t = pi/4 (mod pi/2)``; summing over the ``m'``
      frequencies, ``||Phi(x)||_1 <= m' sqrt(2) = Delta_1`` (the paper's value, Section 2.3,
      citing Chatalic et al.). It is the supremum over ``R^d``: for a given ``omega`` and a
      bounded domain the maximum can be lower, but the bound does not depend on the data.

    Computed values: the cosines and sines are evaluated in float32 (:func:`dpmarket.common.fourier.
    cos_sin32`, within 4e-6 of the exact values, 15 times faster than float64), so a row's
    norms can exceed the bounds above by about 1e-7 relative. Each row is therefore multiplied by
    ``min(1, margin Delta_2 / ||Phi(x)||_2, margin Delta_1 / ||Phi(x)||_1)``, its norms computed
    in float64 from the float32 values and ``margin = 1 - 1e-9`` (:data:`NORM_MARGIN`) covering
    the float64 rounding of those norms: every row the sketch sums has an L2 norm of at most
    ``Delta_2`` and an L1 norm of at most ``Delta_1``, by construction, so both sensitivities hold
    for the computed sum whatever the float32 kernel's rounding. The scaling changes a row by
    about 1e-7 relative (far below the mechanism's noise even summed over 10^8 rows).
    """

    omega: NDArray[np.float64]
    sigma: float
    kind: ClassVar[str] = "rff"

    def __post_init__(self) -> None:
        object.__setattr__(self, "omega", _readonly_matrix(self.omega, "RFF frequencies omega"))
        object.__setattr__(self, "sigma", check_epsilon(self.sigma, "RFF sigma"))

    @property
    def n_frequencies(self) -> int:
        """``m'``, the number of frequency vectors (``m = 2 m'``)."""
        return int(self.omega.shape[0])

    @property
    def n_attributes(self) -> int:
        return int(self.omega.shape[1])

    @property
    def dimension(self) -> int:
        return 2 * self.n_frequencies

    @property
    def l1_sensitivity(self) -> float:
        """``m' sqrt(2)`` (derivation in the class Notes)."""
        return self.n_frequencies * math.sqrt(2.0)

    @property
    def l2_sensitivity(self) -> float:
        """``sqrt(m')`` (derivation in the class Notes)."""
        return math.sqrt(self.n_frequencies)

    def parameters(self) -> dict[str, Any]:
        return {"omega": self.omega, "sigma": self.sigma}

    def _cos_sin_scaled(
        self, x: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """The cosines and sines of a block of rows, shape (rows, m') each, and each row's scale
        into the declared norms, shape (rows,), all float64 (see the class Notes)."""
        with np.errstate(over="ignore", invalid="ignore"):  # cos_sin32 takes such angles as 0
            t = x @ self.omega.T
        cos, sin = cos_sin32(t)
        l1 = np.abs(cos).sum(axis=1, dtype=np.float64)
        l1 += np.abs(sin).sum(axis=1, dtype=np.float64)
        cos64, sin64 = cos.astype(np.float64), sin.astype(np.float64)
        del cos, sin
        l2 = np.sqrt(np.einsum("ij,ij->i", cos64, cos64) + np.einsum("ij,ij->i", sin64, sin64))
        scale = np.minimum(self.l2_sensitivity * NORM_MARGIN / l2, 1.0)
        np.minimum(scale, self.l1_sensitivity * NORM_MARGIN / l1, out=scale)
        return cos64, sin64, scale

    def _features_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.float64]:
        cos, sin, scale = self._cos_sin_scaled(x)
        out = np.concatenate([cos, sin], axis=1)
        out *= scale[:, None]
        return out

    def feature_sum(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.float64]:
        """``sum_i Phi(x_i)``: the column sums of the scaled cos and sin, chunk by chunk (see
        :meth:`FeatureMap.feature_sum`), without assembling the feature rows."""
        arr = self._check_points(x)
        step = check_positive_int(chunk_size, "chunk_size")
        mp = self.n_frequencies
        # Blocks of at most CACHE_BLOCK_VALUES angles keep the temporaries in the CPU's cache:
        # 512 rows at m' = 1,000, 2.5-3 times faster here than 8,192 rows.
        step = min(step, max(1, CACHE_BLOCK_VALUES // mp))
        total = np.zeros(2 * mp, dtype=np.float64)
        for start in range(0, arr.shape[0], step):
            cos, sin, scale = self._cos_sin_scaled(arr[start : start + step])
            total[:mp] += scale @ cos
            total[mp:] += scale @ sin
        return total


class OneHotFeatureMap(FeatureMap):
    """A map made of blocks, each one-hot: exactly one 1 per block (RACE and HIST).

    Subclasses give the block sizes and each record's bucket in every block; features, sums and
    the sparse design matrix follow. Column ``offset_b + k`` is bucket ``k`` of block ``b``.
    """

    @property
    @abc.abstractmethod
    def block_sizes(self) -> NDArray[np.int64]:
        """Number of buckets of every block, shape (n_blocks,)."""

    @abc.abstractmethod
    def _buckets_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.int64]:
        """Bucket of every row in every block, shape (rows, n_blocks), values in
        ``[0, block_sizes[b])``; ``row0`` is the first row's index in the caller's array (for
        error messages)."""

    @property
    def n_blocks(self) -> int:
        """Number of one-hot blocks (R for RACE, d for HIST)."""
        return int(self.block_sizes.shape[0])

    @property
    def dimension(self) -> int:
        return int(self.block_sizes.sum())

    @property
    def l1_sensitivity(self) -> float:
        """Number of blocks: a record has exactly one 1 per block."""
        return float(self.n_blocks)

    @property
    def l2_sensitivity(self) -> float:
        """Square root of the number of blocks."""
        return math.sqrt(self.n_blocks)

    def _offsets(self) -> NDArray[np.int64]:
        sizes = self.block_sizes
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    def bucket_indices(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.int64]:
        """Column of the 1 in every block for every record.

        Parameters
        ----------
        x : array-like of shape (n, d)
        chunk_size : int

        Returns
        -------
        ndarray of shape (n, n_blocks), int64; entry ``(i, b)`` lies in
        ``[offset_b, offset_b + block_sizes[b])`` and ``Phi(x_i)`` is 1 exactly there.

        Raises
        ------
        ValueError
            As :meth:`FeatureMap.features`.
        """
        arr = self._check_points(x)
        step = check_positive_int(chunk_size, "chunk_size")
        offsets = self._offsets()
        out = np.empty((arr.shape[0], self.n_blocks), dtype=np.int64)
        for start in range(0, arr.shape[0], step):
            out[start : start + step] = self._buckets_chunk(arr[start : start + step], start)
        out += offsets
        return out

    def _features_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.float64]:
        cols = self._buckets_chunk(x, row0) + self._offsets()
        out = np.zeros((x.shape[0], self.dimension), dtype=np.float64)
        np.put_along_axis(out, cols, 1.0, axis=1)
        return out

    def feature_sum(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> NDArray[np.float64]:
        """Bucket counts: ``sum_i Phi(x_i)`` computed by counting (see
        :meth:`FeatureMap.feature_sum`)."""
        cols = self.bucket_indices(x, chunk_size=chunk_size)
        return np.bincount(cols.ravel(), minlength=self.dimension).astype(np.float64)

    def design_matrix(
        self, x: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> scipy.sparse.csr_array:
        """The features as a sparse CSR matrix of shape (n, m): ``n_blocks`` ones per row."""
        cols = self.bucket_indices(x, chunk_size=chunk_size)
        n, b = cols.shape
        return scipy.sparse.csr_array(
            (np.ones(n * b), cols.ravel(), np.arange(0, n * b + 1, b)),
            shape=(n, self.dimension),
        )


@dataclass(frozen=True, eq=False)
class RACEMap(OneHotFeatureMap):
    """RACE: ``R`` locality-sensitive hashes into ``W`` buckets each, one-hot (Definition 3).

    Hash ``r`` is the p-stable (Gaussian) Euclidean LSH of Datar et al., rehashed into ``W``
    buckets as in Coleman & Shrivastava's RACE::

        h_r(x) = floor((a_r . x + b_r) / w) mod W

    Attributes
    ----------
    projections : ndarray of shape (R, d), float64
        ``a_r``, i.i.d. standard normal entries (:func:`draw_race`).
    offsets : ndarray of shape (R,), float64
        ``b_r``, uniform on ``[0, w)``.
    bucket_width : float
        ``w`` > 0, in the data's units: the LSH kernel's length scale (the paper's sigma for
        RACE in Section 4.3).
    n_buckets : int
        ``W >= 1``, buckets per hash; ``m = R W``.

    Raises
    ------
    ValueError
        If ``projections`` is not a finite 2-D array, ``offsets`` does not have shape (R,) or
        has an entry outside ``[0, w)``, ``bucket_width`` is not a finite number > 0, or
        ``n_buckets`` is not an integer >= 1.

    Notes
    -----
    Choice of LSH family. The M2M paper uses RACE without naming its LSH (Section 2.1: "for all
    choices of LSH, there exists a kernel"); its RACE sketch has one parameter sigma besides R and
    W (Section 4.3), i.e. a length scale, which rules out sign random projections (angular LSH,
    scale-free). The RACE paper's construction for Euclidean kernels is the p-stable LSH above,
    whose collision probability is a decreasing function of ``||x - x'|| / w``
    (Datar et al., Eq. 1); its integer hash is folded into ``W`` buckets by ``mod W``, which adds
    a small collision probability between far records and keeps the sketch size fixed. So that is
    the family used here.

    Sensitivities: ``Phi(x)`` has exactly one 1 in each of the ``R`` blocks, so
    ``||Phi(x)||_1 = R`` and ``||Phi(x)||_2 = sqrt(R)`` for every record: ``Delta_1 = R``
    (Section 2.3) and ``Delta_2 = sqrt(R)``.

    Determinism: ``a_r . x`` is computed by one small product per record (not one matrix
    product per chunk, whose summation order depends on the number of rows), so a record's
    buckets do not depend on how the records are chunked.
    """

    projections: NDArray[np.float64]
    offsets: NDArray[np.float64]
    bucket_width: float
    n_buckets: int
    kind: ClassVar[str] = "race"

    def __post_init__(self) -> None:
        proj = _readonly_matrix(self.projections, "RACE projections")
        width = check_epsilon(self.bucket_width, "RACE bucket_width")
        offsets = _readonly_vector(self.offsets, "RACE offsets", proj.shape[0])
        if (offsets < 0).any() or (offsets >= width).any():
            j = int(np.flatnonzero((offsets < 0) | (offsets >= width))[0])
            raise ValueError(
                f"RACE offsets must lie in [0, bucket_width = {width}), got offsets[{j}] = "
                f"{offsets[j]}"
            )
        object.__setattr__(self, "projections", proj)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "bucket_width", width)
        object.__setattr__(self, "n_buckets", check_positive_int(self.n_buckets, "RACE n_buckets"))

    @property
    def n_hashes(self) -> int:
        """``R``, the number of hash functions."""
        return int(self.projections.shape[0])

    @property
    def n_attributes(self) -> int:
        return int(self.projections.shape[1])

    @property
    def block_sizes(self) -> NDArray[np.int64]:
        return np.full(self.n_hashes, self.n_buckets, dtype=np.int64)

    def parameters(self) -> dict[str, Any]:
        return {
            "projections": self.projections,
            "offsets": self.offsets,
            "bucket_width": self.bucket_width,
            "n_buckets": self.n_buckets,
        }

    def _buckets_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.int64]:
        with np.errstate(over="ignore", invalid="ignore"):
            proj = np.matmul(np.ascontiguousarray(x)[:, None, :], self.projections.T)[:, 0, :]
            codes = np.floor((proj + self.offsets) / self.bucket_width)
            buckets = np.mod(codes, self.n_buckets)
        # A code that overflowed (projections far beyond any draw for the domain's scale) goes
        # to bucket 0, whatever the row: the map stays total, a row's bucket always in range.
        buckets[~np.isfinite(buckets)] = 0.0
        return buckets.astype(np.int64)


@dataclass(frozen=True, eq=False)
class HISTMap(OneHotFeatureMap):
    """HIST: one 1-D histogram per attribute with equal-width bins, one-hot (Section 2.1.1).

    Attributes
    ----------
    low, high : ndarray of shape (d,), float64
        The histogram's range per attribute, ``low < high`` (normally the domain's box:
        :func:`histogram_map`).
    n_bins : ndarray of shape (d,), int64
        Bins per attribute, each >= 1; ``m = sum(n_bins)`` (the paper's ``d * n_bins``).

    Raises
    ------
    ValueError
        If the bounds are not finite vectors of one length with ``low < high``, or ``n_bins``
        does not have that length or holds an entry < 1.

    Notes
    -----
    Bin ``k`` of attribute ``j`` is ``[e_k, e_{k+1})`` with ``e_k = low_j + k (high_j - low_j) /
    n_bins_j``; the last bin also holds ``high_j``. A value outside ``[low_j, high_j]`` is an error
    naming its row and column, never clipped into an edge bin here; an owner projects its records
    onto the domain before (:meth:`dpmarket.common.sketches.domain.Domain.clamp`), which puts an
    outside value in the edge bin as a clamped value.

    Sensitivities: a record falls in exactly one bin of each of the ``d`` attributes, so
    ``||Phi(x)||_1 = d`` and ``||Phi(x)||_2 = sqrt(d)`` for every record: ``Delta_1 = d`` (the
    paper's "k", the number of attributes, Section 2.3) and ``Delta_2 = sqrt(d)``.
    """

    low: NDArray[np.float64]
    high: NDArray[np.float64]
    n_bins: NDArray[np.int64]
    kind: ClassVar[str] = "hist"

    def __post_init__(self) -> None:
        box = Domain(self.low, self.high)  # validates the bounds
        d = box.n_attributes
        bins = np.asarray(self.n_bins)
        if bins.ndim == 0:
            bins = np.full(d, bins)
        if bins.shape != (d,):
            raise ValueError(f"HIST n_bins must have shape ({d},), got {bins.shape}")
        counts = np.array([check_positive_int(b, "HIST n_bins") for b in bins], dtype=np.int64)
        counts.setflags(write=False)
        object.__setattr__(self, "low", box.low)
        object.__setattr__(self, "high", box.high)
        object.__setattr__(self, "n_bins", counts)

    @property
    def n_attributes(self) -> int:
        return int(self.low.shape[0])

    @property
    def block_sizes(self) -> NDArray[np.int64]:
        return self.n_bins

    def bin_edges(self, attribute: int) -> NDArray[np.float64]:
        """The ``n_bins[j] + 1`` edges of attribute ``j``'s bins, shape (n_bins[j] + 1,)."""
        return np.linspace(self.low[attribute], self.high[attribute], self.n_bins[attribute] + 1)

    def bin_widths(self) -> NDArray[np.float64]:
        """Width of one bin per attribute, shape (d,)."""
        return (self.high - self.low) / self.n_bins

    def parameters(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "n_bins": self.n_bins}

    def _buckets_chunk(self, x: NDArray[np.float64], row0: int) -> NDArray[np.int64]:
        outside = (x < self.low) | (x > self.high)
        if outside.any():
            row, col = (int(v) for v in np.argwhere(outside)[0])
            raise InvalidArgumentError(
                f"x row {row0 + row}, column {col}: value {float(x[row, col])!r} lies outside the "
                f"histogram's range [{float(self.low[col])!r}, {float(self.high[col])!r}]"
            )
        pos = np.floor((x - self.low) / (self.high - self.low) * self.n_bins)
        return np.minimum(pos.astype(np.int64), self.n_bins - 1)


def draw_rff(
    n_attributes: int, n_frequencies: int, sigma: float, rng: np.random.Generator
) -> RFFMap:
    """Draw an RFF map for the Gaussian kernel ``exp(-||x - x'||^2 / (2 sigma^2))``.

    Parameters
    ----------
    n_attributes : int
        ``d`` >= 1.
    n_frequencies : int
        ``m'`` >= 1; the sketch has ``m = 2 m'`` entries (the paper's ``m = 200`` is
        ``m' = 100``).
    sigma : float
        Kernel length scale > 0, in the data's units (the paper: ``sigma = 1`` on ``[0, 1]^d``).
    rng : numpy.random.Generator
        Source of the frequencies: ``rng.normal(0, 1 / sigma, (m', d))``.

    Returns
    -------
    RFFMap

    Raises
    ------
    ValueError
        If a size is not an integer >= 1 or ``sigma`` is not a finite number > 0.

    References
    ----------
    M2M paper, Definition 2: ``Lambda = N(0, sigma^-2 I_d)``.
    """
    d = check_positive_int(n_attributes, "n_attributes")
    mp = check_positive_int(n_frequencies, "n_frequencies")
    s = check_epsilon(sigma, "sigma")
    return RFFMap(omega=rng.normal(0.0, 1.0 / s, size=(mp, d)), sigma=s)


def draw_race(
    n_attributes: int,
    n_hashes: int,
    n_buckets: int,
    bucket_width: float,
    rng: np.random.Generator,
) -> RACEMap:
    """Draw a RACE map of ``R = n_hashes`` p-stable LSH functions into ``W = n_buckets`` buckets.

    Parameters
    ----------
    n_attributes : int
        ``d`` >= 1.
    n_hashes : int
        ``R`` >= 1 (the paper: 80).
    n_buckets : int
        ``W`` >= 1 (the paper: 80); ``m = R W``.
    bucket_width : float
        LSH bucket width ``w`` > 0 in the data's units (the paper's sigma = 0.1, Section 4.3).
    rng : numpy.random.Generator
        Draws ``projections = rng.standard_normal((R, d))`` then
        ``offsets = rng.uniform(0, w, R)``.

    Returns
    -------
    RACEMap

    Raises
    ------
    ValueError
        If a size is not an integer >= 1 or ``bucket_width`` is not a finite number > 0.
    """
    d = check_positive_int(n_attributes, "n_attributes")
    r = check_positive_int(n_hashes, "n_hashes")
    w = check_epsilon(bucket_width, "bucket_width")
    projections = rng.standard_normal((r, d))
    offsets = np.minimum(rng.uniform(0.0, w, size=r), np.nextafter(w, 0.0))
    return RACEMap(projections, offsets, w, check_positive_int(n_buckets, "n_buckets"))


def histogram_map(domain: Domain, n_bins: int | Sequence[int]) -> HISTMap:
    """The HIST map over a domain's box: ``n_bins`` equal-width bins per attribute.

    Parameters
    ----------
    domain : Domain
    n_bins : int or sequence of int
        Bins per attribute (one value for all, or one per attribute), each >= 1 (the paper: 100;
        20 in Section 4.3).

    Returns
    -------
    HISTMap

    Raises
    ------
    ValueError
        If ``n_bins`` has the wrong length or an entry < 1.
    """
    bins = np.asarray(n_bins)
    if bins.ndim == 0:
        bins = np.full(domain.n_attributes, bins)
    return HISTMap(domain.low, domain.high, bins)


_KINDS: dict[str, type[FeatureMap]] = {"rff": RFFMap, "race": RACEMap, "hist": HISTMap}


def feature_map_from_parameters(kind: str, parameters: Mapping[str, Any]) -> FeatureMap:
    """Rebuild a feature map from ``kind`` and :meth:`FeatureMap.parameters` (e.g. a message).

    Parameters
    ----------
    kind : {"rff", "race", "hist"}
    parameters : mapping
        Exactly the keys :meth:`FeatureMap.parameters` returns for that kind.

    Returns
    -------
    FeatureMap
        Validated as by the class constructor.

    Raises
    ------
    ValueError
        If ``kind`` is unknown, a key is missing or unexpected, or a value is invalid.
    """
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown feature map kind {kind!r}; expected one of {FEATURE_MAP_KINDS}")
    expected = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = set(parameters)
    if given != expected:
        raise ValueError(
            f"{kind} feature map parameters must be exactly {sorted(expected)}, got "
            f"{sorted(given)} (missing {sorted(expected - given)}, unexpected "
            f"{sorted(given - expected)})"
        )
    return cls(**parameters)
