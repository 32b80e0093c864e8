"""Private sketches (M2M paper, Section 2.3): a noisy sum of features and a noisy count.

An owner holding records ``x_1..x_n`` in a public :class:`~dpmarket.common.sketches.domain.Domain`
releases, once, ``(Sigma_Phi(D) + xi, n + zeta)``: the sum of a public feature map over its records
plus noise, and its record count plus noise. The consumer's sketch is their ratio ``z_hat = (sum_i
Phi(x_i) + xi) / (n + zeta)`` (Eq. 2), and the released triplet ``(Phi, z_hat, n + zeta)`` is what
M2M works from (Section 3).

* :class:`SketchMechanism` fixes everything public before any data is touched — feature map,
  domain, mechanism, epsilon (and delta), the budget split, hence the noise scales — and lists the
  privacy events an owner charges to its ledger *before* :meth:`SketchMechanism.release` (charge,
  then release).
* :class:`PrivateSketch` is the release: the mechanism (every public parameter) with the noisy sum
  and the noisy count, kept apart, and :meth:`PrivateSketch.validate`, the check a consumer runs
  on what it received.
* :func:`merge_sketches` forms the sketch of the union of several owners' data (a
  :class:`SketchUnion`): the sum of their noisy sums over the sum of their noisy counts.
* :func:`sketch_mmd2` compares a sketch with a point set (a kernel mean embedding distance).

Why keep the noisy sum and the noisy count apart rather than only ``z_hat``: the pair is what
unions need (``z_hat`` of a union is not a function of the owners' ``z_hat`` alone unless their
counts are kept), it is the representation the paper recommends for combining sketches
(Section 2.1, after Definition 1), and ``z_hat`` and ``n + zeta`` follow from it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.accounting import PrivacyEvent, analytic_gaussian_sigma
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import (
    DEFAULT_CHUNK_SIZE,
    FeatureMap,
    HISTMap,
    OneHotFeatureMap,
)

__all__ = [
    "DEFAULT_NUMERATOR_SHARE",
    "MECHANISMS",
    "Mechanism",
    "PrivateSketch",
    "SketchLike",
    "SketchMechanism",
    "SketchUnion",
    "merge_sketches",
    "sketch_mmd2",
]

Mechanism = Literal["laplace", "gaussian", "none"]
#: ``"laplace"``: pure epsilon-DP (the paper's); ``"gaussian"``: (epsilon, delta)-DP with the L2
#: sensitivity; ``"none"``: the exact, non-private sketch (epsilon = inf), for research runs only.
MECHANISMS: tuple[Mechanism, ...] = ("laplace", "gaussian", "none")
#: Share of the budget spent on the sum of features: the paper's
#: ``epsilon_num = 0.98 epsilon``, ``epsilon_den = 0.02 epsilon`` (Section 4).
DEFAULT_NUMERATOR_SHARE = 0.98
# Relative tolerance when a received noise scale is compared with the one recomputed from the
# public parameters: Laplace scales are closed forms; the Gaussian one comes from a bisection
# (dp_accounting) whose result may move in its last digits between library versions.
_LAPLACE_RTOL = 1e-9
_GAUSSIAN_RTOL = 1e-6


@functools.lru_cache(maxsize=256)
def _unit_gaussian_sigma(epsilon: float, delta: float) -> float:
    """``analytic_gaussian_sigma(epsilon, delta, 1)``, cached: a bisection that every
    construction and validation of a Gaussian sketch would otherwise repeat."""
    return analytic_gaussian_sigma(epsilon, delta, 1.0)


def _check_scale_match(name: str, given: float, expected: float, rtol: float) -> float:
    value = float(given)
    if not (math.isfinite(value) and abs(value - expected) <= rtol * expected):
        raise ValueError(
            f"{name} = {given!r} does not match the noise scale the public parameters imply, "
            f"{expected!r}"
        )
    return value


@dataclass(frozen=True, eq=False)
class SketchMechanism:
    """The public side of a private sketch: map, domain, mechanism, budget and noise scales.

    Parameters
    ----------
    feature_map : FeatureMap
        The public feature map ``Phi`` (its ``n_attributes`` must equal the domain's).
    domain : Domain
        The public domain every record must lie in.
    epsilon : float
        Total privacy budget of the release, ``> 0`` and finite for ``"laplace"`` and
        ``"gaussian"``; ``math.inf`` with ``mechanism="none"`` (no noise: not private).
    mechanism : {"laplace", "gaussian", "none"}
    delta : float
        ``0`` for ``"laplace"`` and ``"none"``; ``0 < delta < 1`` for ``"gaussian"``.
    numerator_share : float
        ``0 < s < 1``: the share of the budget spent on the sum of features; the count gets the
        rest. Laplace: ``epsilon_num = s epsilon``, ``epsilon_den = (1 - s) epsilon``. Gaussian:
        the share of the squared privacy-loss scale ``mu^2`` (Notes). Default 0.98 (the paper).
    sum_scale, count_scale : float, optional
        Noise scales as received with a sketch (Laplace ``b`` or Gaussian standard deviation).
        When given they must equal the scales the other parameters imply (relative tolerance 1e-9
        for Laplace, 1e-6 for Gaussian), else ``ValueError``; when omitted they are computed.

    Attributes
    ----------
    sum_scale : float
        Scale of the noise ``xi`` on every coordinate of the sum of features (0 for ``"none"``).
    count_scale : float
        Scale of the noise ``zeta`` on the count (0 for ``"none"``).

    Raises
    ------
    ValueError
        On any inconsistency: unknown mechanism, epsilon/delta outside their ranges for the
        mechanism, a share outside ``(0, 1)``, a map whose ``n_attributes`` differs from the
        domain's, a HIST map whose range does not cover the domain, or given scales that do not
        match.

    Notes
    -----
    Neighbouring data sets differ by adding or removing one record (unbounded DP, Section 2.2).
    Adding ``x`` changes the sum of features by ``Phi(x)`` and the count by 1, so the sum has L1
    sensitivity ``Delta_1 = max_x ||Phi(x)||_1`` and L2 sensitivity
    ``Delta_2 = max_x ||Phi(x)||_2`` (:class:`FeatureMap`), and the count has sensitivity 1.

    *Laplace* (the paper's mechanism, Definition 5): ``xi_j ~ Laplace(Delta_1 / epsilon_num)``
    i.i.d. and ``zeta ~ Laplace(1 / epsilon_den)``. The noisy sum is ``epsilon_num``-DP, the noisy
    count ``epsilon_den``-DP, and the pair ``epsilon_num + epsilon_den = epsilon``-DP by basic
    composition (it is charged as those two Laplace events: :meth:`privacy_events`).

    *Gaussian*: ``xi ~ N(0, s_1^2 I_m)`` and ``zeta ~ N(0, s_2^2)``. Whitening each part by its
    standard deviation, the pair is one Gaussian mechanism with unit noise on a query whose L2
    sensitivity is ``mu = sqrt((Delta_2 / s_1)^2 + (1 / s_2)^2)`` (both parts change together when a
    record is added). With ``sigma_u = analytic_gaussian_sigma(epsilon, delta, 1)`` (Balle & Wang's
    exact calibration, :func:`dpmarket.common.privacy.accounting.analytic_gaussian_sigma`), the
    choice ``s_1 = Delta_2 sigma_u / sqrt(s)``, ``s_2 = sigma_u / sqrt(1 - s)`` gives ``mu^2 = (s +
    1 - s) / sigma_u^2``, i.e. exactly the ``(epsilon, delta)``-DP Gaussian mechanism with
    sensitivity 1 and noise ``sigma_u``; that single event is what is charged.

    References
    ----------
    M2M paper, Sections 2.2-2.3 and Section 4 (the 0.98 / 0.02 split); Dwork et al. (2006);
    Balle & Wang, ICML 2018 (analytic Gaussian mechanism).
    """

    feature_map: FeatureMap
    domain: Domain
    epsilon: float
    mechanism: Mechanism = "laplace"
    delta: float = 0.0
    numerator_share: float = DEFAULT_NUMERATOR_SHARE
    sum_scale: float | None = None
    count_scale: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.feature_map, FeatureMap):
            raise ValueError(
                f"feature_map must be a FeatureMap, got {type(self.feature_map).__name__}"
            )
        if not isinstance(self.domain, Domain):
            raise ValueError(f"domain must be a Domain, got {type(self.domain).__name__}")
        if self.feature_map.n_attributes != self.domain.n_attributes:
            raise ValueError(
                f"the {self.feature_map.kind} feature map takes {self.feature_map.n_attributes} "
                f"attributes but the domain has {self.domain.n_attributes}"
            )
        if isinstance(self.feature_map, HISTMap) and (
            (self.feature_map.low > self.domain.low).any()
            or (self.feature_map.high < self.domain.high).any()
        ):
            raise ValueError(
                "the HIST map's range must cover the domain (every record must fall in a bin): "
                f"map [{self.feature_map.low.tolist()}, {self.feature_map.high.tolist()}], "
                f"domain [{self.domain.low.tolist()}, {self.domain.high.tolist()}]"
            )
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        eps = float(self.epsilon)
        delta = float(self.delta)
        share = float(self.numerator_share)
        if not (math.isfinite(share) and 0.0 < share < 1.0):
            raise ValueError(f"numerator_share must lie in (0, 1), got {self.numerator_share!r}")
        if self.mechanism == "none":
            if eps != math.inf:
                raise ValueError(
                    f"mechanism 'none' (no noise) means epsilon = inf, got {self.epsilon!r}"
                )
            if delta != 0.0:
                raise ValueError(f"mechanism 'none' takes no delta, got {self.delta!r}")
            sum_scale = count_scale = 0.0
        else:
            if not (math.isfinite(eps) and eps > 0.0):
                raise ValueError(
                    f"epsilon must be a finite number > 0 for mechanism {self.mechanism!r} "
                    f"(use mechanism 'none' for epsilon = inf), got {self.epsilon!r}"
                )
            if self.mechanism == "laplace":
                if delta != 0.0:
                    raise ValueError(f"the Laplace sketch is pure DP: delta must be 0, got {delta}")
                sum_scale = self.feature_map.l1_sensitivity / (share * eps)
                count_scale = 1.0 / ((1.0 - share) * eps)
                rtol = _LAPLACE_RTOL
            else:
                if not (math.isfinite(delta) and 0.0 < delta < 1.0):
                    raise ValueError(
                        f"the Gaussian sketch needs 0 < delta < 1, got delta = {self.delta!r}"
                    )
                sigma_u = _unit_gaussian_sigma(eps, delta)
                sum_scale = self.feature_map.l2_sensitivity * sigma_u / math.sqrt(share)
                count_scale = sigma_u / math.sqrt(1.0 - share)
                rtol = _GAUSSIAN_RTOL
            if self.sum_scale is not None:
                sum_scale = _check_scale_match("sum_scale", self.sum_scale, sum_scale, rtol)
            if self.count_scale is not None:
                count_scale = _check_scale_match("count_scale", self.count_scale, count_scale, rtol)
        if self.mechanism == "none":
            for name, given in (("sum_scale", self.sum_scale), ("count_scale", self.count_scale)):
                if given is not None and float(given) != 0.0:
                    raise ValueError(f"mechanism 'none' has {name} 0, got {given!r}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "numerator_share", share)
        object.__setattr__(self, "sum_scale", float(sum_scale))
        object.__setattr__(self, "count_scale", float(count_scale))

    # ------------------------------------------------------------------ derived public values
    @property
    def private(self) -> bool:
        """Whether the release is differentially private (every mechanism but ``"none"``)."""
        return self.mechanism != "none"

    @property
    def epsilon_sum(self) -> float:
        """``epsilon_num``: the Laplace budget of the sum (``s epsilon``); for the Gaussian
        mechanism the whole ``epsilon`` (one joint event); ``inf`` for ``"none"``."""
        if self.mechanism == "laplace":
            return self.numerator_share * self.epsilon
        return self.epsilon

    @property
    def epsilon_count(self) -> float:
        """``epsilon_den``: the Laplace budget of the count (``(1 - s) epsilon``); as
        :attr:`epsilon_sum` otherwise."""
        if self.mechanism == "laplace":
            return (1.0 - self.numerator_share) * self.epsilon
        return self.epsilon

    @property
    def sum_noise_variance(self) -> float:
        """Variance ``sigma_xi^2`` of each coordinate of ``xi``: ``2 b^2`` (Laplace), ``s_1^2``
        (Gaussian), 0 (none). Appendix B's "noise level"."""
        assert self.sum_scale is not None
        return self._variance(self.sum_scale)

    @property
    def count_noise_variance(self) -> float:
        """Variance of ``zeta``, as :attr:`sum_noise_variance`."""
        assert self.count_scale is not None
        return self._variance(self.count_scale)

    def _variance(self, scale: float) -> float:
        if self.mechanism == "laplace":
            return 2.0 * scale * scale
        return scale * scale

    def privacy_events(self) -> list[PrivacyEvent]:
        """What the release costs, as ledger events (charge them before :meth:`release`).

        Returns
        -------
        list of PrivacyEvent
            ``"laplace"``: two Laplace events, ``(epsilon_num, Delta_1, b_sum)`` and
            ``(epsilon_den, 1, b_count)``, whose epsilons add up to ``epsilon``.
            ``"gaussian"``: one Gaussian event at ``(epsilon, delta)`` with sensitivity 1 and
            noise ``sigma_u`` (the whitened joint mechanism of the class Notes).
            ``"none"``: empty — the exact sketch is not private, and a service must not release
            it as if it were.
        """
        if self.mechanism == "laplace":
            assert self.sum_scale is not None and self.count_scale is not None
            return [
                PrivacyEvent(
                    "laplace",
                    self.epsilon_sum,
                    sensitivity=self.feature_map.l1_sensitivity,
                    scale=self.sum_scale,
                ),
                PrivacyEvent(
                    "laplace", self.epsilon_count, sensitivity=1.0, scale=self.count_scale
                ),
            ]
        if self.mechanism == "gaussian":
            assert self.count_scale is not None
            sigma_u = self.count_scale * math.sqrt(1.0 - self.numerator_share)
            return [
                PrivacyEvent(
                    "gaussian", self.epsilon, sensitivity=1.0, scale=sigma_u, delta=self.delta
                )
            ]
        return []

    def release(
        self,
        x: ArrayLike,
        noise: NoiseSource | None = None,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> PrivateSketch:
        """Compute the sketch of the records ``x``: the noisy sum and the noisy count.

        Parameters
        ----------
        x : array-like of shape (n, d)
            The owner's records, ``n >= 1``, every one inside the domain.
        noise : NoiseSource
            Where the noise comes from: ``OpenDPNoise()`` in production, ``SeededNoise(rng)`` in
            tests. Required unless ``mechanism == "none"`` (then ignored).
        chunk_size : int
            Rows featurized at once (memory bound; the sum does not depend on it beyond
            floating-point summation order).

        Returns
        -------
        PrivateSketch

        Raises
        ------
        InvalidArgumentError
            (a ``ValueError``) if ``x`` is empty, not ``(n, d)``, holds NaN/inf, or a record lies
            outside the domain (the message names the row and the column); nothing is computed.
        ValueError
            If a private mechanism is given no noise source.

        Notes
        -----
        Draws ``m`` values for ``xi`` then one for ``zeta`` (Laplace or Gaussian) from ``noise``.
        The true count and sum never leave this call.
        """
        data = self.domain.check(x, "sketched data")
        if self.private and noise is None:
            raise ValueError(f"a {self.mechanism} sketch needs a noise source, got None")
        total = self.feature_map.feature_sum(data, chunk_size=chunk_size)
        return self.release_sum(total, data.shape[0], noise)

    def release_sum(
        self, feature_sum: ArrayLike, count: int, noise: NoiseSource | None = None
    ) -> PrivateSketch:
        """Add the noise to an exact sum of features and count: the sketch of records whose
        features were summed elsewhere (partition by partition, :mod:`dpmarket.owner.partitioned`).

        Parameters
        ----------
        feature_sum : array-like of shape (m,)
            ``sum_i Phi(x_i)`` over the records, every one inside the domain.
        count : int
            ``n >= 1``, the number of records summed.
        noise : NoiseSource
            As :meth:`release`.

        Returns
        -------
        PrivateSketch

        Raises
        ------
        ValueError
            If the sum has the wrong length or is not finite, ``count < 1``, or a private
            mechanism is given no noise source.

        Notes
        -----
        The sum of a partition's features plus the other partitions' is the table's sum: each
        record contributes once, so the sensitivities of the class Notes hold unchanged, and the
        noise is drawn once, here, after the partitions are merged — never per partition.
        """
        total = np.asarray(feature_sum, dtype=np.float64)
        if total.shape != (self.feature_map.dimension,) or not np.isfinite(total).all():
            raise ValueError(
                f"feature_sum must be a finite vector of length {self.feature_map.dimension}, "
                f"got shape {total.shape}"
            )
        if int(count) < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if self.private and noise is None:
            raise ValueError(f"a {self.mechanism} sketch needs a noise source, got None")
        n = float(count)
        if self.mechanism == "laplace":
            assert noise is not None and self.sum_scale is not None and self.count_scale is not None
            total = total + noise.laplace(self.sum_scale, total.shape[0])
            n = n + float(noise.laplace(self.count_scale, 1)[0])
        elif self.mechanism == "gaussian":
            assert noise is not None and self.sum_scale is not None and self.count_scale is not None
            total = total + noise.gaussian(self.sum_scale, total.shape[0])
            n = n + float(noise.gaussian(self.count_scale, 1)[0])
        return PrivateSketch(self, total, n)

    def describe(self) -> dict[str, Any]:
        """Every public value as plain JSON-able data (no arrays): for reports and catalogues."""
        return {
            "feature_map": self.feature_map.describe(),
            "domain": self.domain.describe(),
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "numerator_share": self.numerator_share,
            "epsilon_sum": self.epsilon_sum,
            "epsilon_count": self.epsilon_count,
            "sum_scale": self.sum_scale,
            "count_scale": self.count_scale,
        }


@runtime_checkable
class SketchLike(Protocol):
    """What M2M needs from a sketch: a :class:`PrivateSketch` or a :class:`SketchUnion`."""

    @property
    def feature_map(self) -> FeatureMap: ...

    @property
    def domain(self) -> Domain: ...

    @property
    def mean_embedding(self) -> NDArray[np.float64]: ...

    @property
    def count_estimate(self) -> float: ...

    @property
    def sum_noise_variance(self) -> float: ...

    @property
    def count_noise_variance(self) -> float: ...


def _count_estimate(noisy_count: float) -> float:
    # Post-processing of a released value: a noisy count below 1 (possible at small epsilon or
    # for tiny data sets) would make z_hat meaningless or infinite; 1 is the least count a
    # published sketch can have.
    return max(float(noisy_count), 1.0)


@dataclass(frozen=True, eq=False)
class PrivateSketch:
    """A released sketch: its public mechanism, the noisy sum of features and the noisy count.

    Attributes
    ----------
    mechanism : SketchMechanism
        Every public parameter: feature map, domain, mechanism, epsilon, delta, budget split,
        noise scales.
    noisy_sum : ndarray of shape (m,), float64
        ``sum_i Phi(x_i) + xi``.
    noisy_count : float
        ``n + zeta`` (may be fractional, or even below 1 at tiny epsilon).

    Raises
    ------
    ValueError
        From :meth:`validate`, at construction.

    Notes
    -----
    The exact count ``n`` is not part of the release. Anything computed from these values
    (``z_hat``, every M2M estimate) is post-processing and costs no further privacy.
    """

    mechanism: SketchMechanism
    noisy_sum: NDArray[np.float64]
    noisy_count: float

    def __post_init__(self) -> None:
        total = np.array(self.noisy_sum, dtype=np.float64)
        total.setflags(write=False)
        object.__setattr__(self, "noisy_sum", total)
        object.__setattr__(self, "noisy_count", float(self.noisy_count))
        self.validate()

    def validate(self) -> None:
        """Check that the sketch is self-consistent; a consumer runs it on what it received.

        Checks that the mechanism's scales match its epsilon, delta, split and the map's
        sensitivity (by rebuilding the mechanism from its public values), that the noisy sum has
        the map's dimension and is finite, that the noisy count is finite, and, for an exact
        (``"none"``) sketch, that the count is a whole number >= 1 and, for one-hot maps
        (RACE, HIST), that every block of the sum adds up to the count.

        Raises
        ------
        ValueError
            Naming the first inconsistency.
        """
        mech = self.mechanism
        if not isinstance(mech, SketchMechanism):
            raise ValueError(f"mechanism must be a SketchMechanism, got {type(mech).__name__}")
        SketchMechanism(
            mech.feature_map,
            mech.domain,
            mech.epsilon,
            mech.mechanism,
            mech.delta,
            mech.numerator_share,
            mech.sum_scale,
            mech.count_scale,
        )
        m = mech.feature_map.dimension
        if self.noisy_sum.shape != (m,):
            raise ValueError(
                f"noisy_sum must have shape ({m},) for the {mech.feature_map.kind} map, got "
                f"{self.noisy_sum.shape}"
            )
        if not np.isfinite(self.noisy_sum).all():
            raise ValueError("noisy_sum holds NaN or inf values")
        if not math.isfinite(self.noisy_count):
            raise ValueError(f"noisy_count must be finite, got {self.noisy_count}")
        if mech.mechanism == "none":
            n = self.noisy_count
            if n < 1 or n != round(n):
                raise ValueError(f"an exact sketch's count must be a whole number >= 1, got {n}")
            fmap = mech.feature_map
            if isinstance(fmap, OneHotFeatureMap):
                edges = np.concatenate([[0], np.cumsum(fmap.block_sizes)])
                sums = np.add.reduceat(self.noisy_sum, edges[:-1])
                if not np.allclose(sums, n, rtol=0.0, atol=1e-6 * n):
                    b = int(np.flatnonzero(~np.isclose(sums, n, rtol=0.0, atol=1e-6 * n))[0])
                    raise ValueError(
                        f"an exact {fmap.kind} sketch's block {b} adds up to {sums[b]}, not to "
                        f"the count {n}"
                    )

    @property
    def feature_map(self) -> FeatureMap:
        """The public feature map ``Phi``."""
        return self.mechanism.feature_map

    @property
    def domain(self) -> Domain:
        """The public domain."""
        return self.mechanism.domain

    @property
    def count_estimate(self) -> float:
        """``n_hat = max(n + zeta, 1)``: the count M2M uses (post-processing; see
        :attr:`mean_embedding`)."""
        return _count_estimate(self.noisy_count)

    @property
    def mean_embedding(self) -> NDArray[np.float64]:
        """``z_hat = (sum_i Phi(x_i) + xi) / n_hat``, shape (m,) (Eq. 2, with the count floored
        at 1)."""
        return self.noisy_sum / self.count_estimate

    @property
    def sum_noise_variance(self) -> float:
        """Per-coordinate variance of the noise on the sum (``sigma_xi^2``)."""
        return self.mechanism.sum_noise_variance

    @property
    def count_noise_variance(self) -> float:
        """Variance of the noise on the count."""
        return self.mechanism.count_noise_variance

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the release's content: its mechanism's public figures (noise,
        epsilon, delta, budget split, noise scales, the map's kind and dimension), the noisy sum
        and the noisy count. Two sketches of one spec with the same digest give the same
        answers (the map itself is the spec's)."""
        mech = self.mechanism
        h = hashlib.sha256()
        h.update(f"{mech.mechanism}|{mech.feature_map.kind}|{mech.feature_map.dimension}|".encode())
        figures = (mech.epsilon, mech.delta, mech.numerator_share, mech.sum_scale,
                   mech.count_scale, self.noisy_count)  # fmt: skip
        h.update(np.asarray(figures, dtype="<f8").tobytes())
        h.update(np.ascontiguousarray(self.noisy_sum, dtype="<f8").tobytes())
        return h.hexdigest()


@dataclass(frozen=True, eq=False)
class SketchUnion:
    """The sketch of the union of several owners' data sets, from their released sketches.

    Attributes
    ----------
    parts : tuple of PrivateSketch
        The owners' sketches, all with equal feature maps and equal domains.

    Raises
    ------
    ValueError
        If ``parts`` is empty or two parts differ in feature map or domain.

    Notes
    -----
    Sums of features and counts add over disjoint data sets, so the union's noisy sum is
    ``sum_k (Sigma_k + xi_k)`` and its noisy count ``sum_k (n_k + zeta_k)``; the noises are
    independent, so the union's per-coordinate noise variance is the sum of the parts'. This is
    post-processing of released sketches: it costs nothing more, and each owner's data keeps
    exactly the guarantee of its own sketch (the parts may have different mechanisms and
    budgets).
    """

    parts: tuple[PrivateSketch, ...]

    def __post_init__(self) -> None:
        parts = tuple(self.parts)
        if not parts:
            raise ValueError("a union needs at least one sketch")
        for k, part in enumerate(parts):
            if not isinstance(part, PrivateSketch):
                raise ValueError(f"sketch {k} must be a PrivateSketch, got {type(part).__name__}")
            if k and part.feature_map != parts[0].feature_map:
                raise ValueError(
                    f"sketch {k} has a different feature map from sketch 0: only sketches made "
                    "with the same public map can be merged"
                )
            if k and part.domain != parts[0].domain:
                raise ValueError(f"sketch {k} has a different domain from sketch 0")
        object.__setattr__(self, "parts", parts)

    def validate(self) -> None:
        """Validate every part (:meth:`PrivateSketch.validate`) and their compatibility."""
        for part in self.parts:
            part.validate()
        SketchUnion(self.parts)

    @property
    def feature_map(self) -> FeatureMap:
        return self.parts[0].feature_map

    @property
    def domain(self) -> Domain:
        return self.parts[0].domain

    @property
    def noisy_sum(self) -> NDArray[np.float64]:
        """Sum of the parts' noisy sums, shape (m,)."""
        return np.sum([p.noisy_sum for p in self.parts], axis=0)

    @property
    def noisy_count(self) -> float:
        """Sum of the parts' noisy counts."""
        return float(math.fsum(p.noisy_count for p in self.parts))

    @property
    def count_estimate(self) -> float:
        """``max(noisy_count, 1)``."""
        return _count_estimate(self.noisy_count)

    @property
    def mean_embedding(self) -> NDArray[np.float64]:
        """``z_hat`` of the union: the summed noisy sums over the floored summed noisy count."""
        return self.noisy_sum / self.count_estimate

    @property
    def sum_noise_variance(self) -> float:
        """Per-coordinate variance of the union's sum noise: the parts' variances added."""
        return float(math.fsum(p.sum_noise_variance for p in self.parts))

    @property
    def count_noise_variance(self) -> float:
        """Variance of the union's count noise."""
        return float(math.fsum(p.count_noise_variance for p in self.parts))


def merge_sketches(sketches: Sequence[PrivateSketch | SketchUnion]) -> SketchUnion:
    """The sketch of the union of the owners' data sets (unions are flattened).

    Parameters
    ----------
    sketches : sequence of PrivateSketch or SketchUnion
        At least one; all with equal feature maps and domains.

    Returns
    -------
    SketchUnion

    Raises
    ------
    ValueError
        If ``sketches`` is empty or the maps or domains differ (naming the first that differs).
    """
    parts: list[PrivateSketch] = []
    for s in sketches:
        if isinstance(s, SketchUnion):
            parts.extend(s.parts)
        else:
            parts.append(s)
    return SketchUnion(tuple(parts))


def sketch_mmd2(
    sketch: SketchLike,
    points: ArrayLike,
    *,
    debias: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> float:
    """Squared MMD between a sketched data set and a point set, from the sketch alone.

    Every map here has ``||Phi(x)||_2 = Delta_2`` for all ``x``, so ``k(x, x') = Phi(x) .
    Phi(x') / Delta_2^2`` is a kernel with ``k(x, x) = 1``: for RFF the Monte Carlo estimate of the
    Gaussian kernel ``exp(-||x - x'||^2 / (2 sigma^2))``, for RACE the LSH collision kernel, for
    HIST the fraction of attributes in a common bin. The sketch is a noisy kernel mean
    embedding, and ``||z_hat - mean_i Phi(v_i)||^2 / Delta_2^2`` estimates the squared MMD of
    the two sets under ``k`` (e.g. to rank owners against a validation set).

    Parameters
    ----------
    sketch : PrivateSketch or SketchUnion
    points : array-like of shape (n_v, d)
        The other set (e.g. the consumer's validation set), inside the sketch's domain.
    debias : bool
        Subtract the noise's expected contribution ``m sigma_xi^2 / (n_hat^2 Delta_2^2)``
        (``E ||xi / n_hat||^2`` for noise independent of the data; the count's noise is
        neglected). Owners with fewer records or a smaller epsilon have a larger bias, so compare
        owners debiased. The debiased value can be negative.
    chunk_size : int

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``points`` is empty or has a record outside the domain (naming row and column).

    Notes
    -----
    Post-processing of the sketch: it costs the sketched data nothing more. ``points`` enters
    the value directly, so releasing the value is a release about ``points``.
    """
    from dpmarket.common.summarization.kernels import mmd2_rff

    fmap = sketch.feature_map
    v = sketch.domain.check(points, "points")
    mean_v = fmap.feature_sum(v, chunk_size=chunk_size) / v.shape[0]
    scale = fmap.l2_sensitivity**2
    value = mmd2_rff(sketch.mean_embedding[None, :], mean_v[None, :]) / scale
    if debias:
        n_hat = sketch.count_estimate
        value -= fmap.dimension * sketch.sum_noise_variance / (n_hat * n_hat * scale)
    return float(value)
