"""The candidates method's sketch allocation: owners' published sketches decide where to read.

Every owner publishes, once, a differentially private RFF sketch of its data (M2M paper, Section
2.3; :mod:`dpmarket.common.sketches`): a noisy sum of random Fourier features and a noisy count,
already charged to its own ledger and reusable by every consumer. The curator, which holds the
consumer's validation set ``D_v``, scores every owner's relevance to ``D_v`` from those sketches and
releases to the owners only a K-dimensional decision that is differentially private with respect to
``D_v``:

1. For every validation point ``v`` and owner ``k`` a non-negative relevance ``u_k(v)``, a
   function of ``v`` and of the public sketches only (:func:`relevance_matrix`):

   * ``"density"``: ``<z_k, Phi(v)> / m'``, the mean embedding inner product: owner k's
     kernel density at ``v`` under the sketch's Gaussian kernel
     ``k(x, v) = exp(-||x - v||^2 / (2 sigma^2))``;
   * ``"mass"``: the same times the noisy count, ``<Sigma_k + xi_k, Phi(v)> / m'``, the
     sketch's estimate of ``sum_{x in D_k} k(x, v)``: how much of owner k's data lies near ``v``;
   * ``"m2m"``: ``n_k`` times M2M's estimate (implicit weights, Section 3.5) of the average over
     D_k of a narrower kernel ``k_h(x, v) = exp(-||x - v||^2 / (2 h^2))``, ``h = bandwidth``:
     "how many of owner k's points lie within about h of v";
   * ``"mmd"``: the owner whose sketch is nearest to ``v`` in MMD,
     ``argmin_k ||Phi(v) - z_k||^2`` (debiased), as a one-hot vector.

   Negative estimates (noise) are clipped to 0.
2. Responsibilities ``pi(v)``, a point of the probability simplex per validation point
   (:func:`responsibilities`): by default the vote of ``v`` for the owner of largest relevance
   (one-hot), or ``u(v) / sum_k u_k(v)``; uniform when every ``u_k(v)`` is 0. The vote measured
   better than the proportional split: kernel densities differ between owners by small factors,
   which the proportional split flattens.
3. The released decision ``r~ = (1/m) sum_v pi(v) + N(0, s^2 I_K)`` (:func:`noisy_relevance`),
   shrunk towards the even split ``1/K`` by as much as its noise hides it
   (:func:`shrink_decision`), and the candidate budget split in proportion to its positive part
   after an even share (:func:`dpmarket.common.summarization.candidates.allocate_candidates`). The
   validation party's budget is split between the embedding and the decision by
   :func:`derived_allocation_share` (public m, K, epsilon, delta) unless the request fixes it.
4. Each owner proposes its share by a local greedy against the validation embedding released
   beside the decision, shrunk by as much as its noise hides it: towards the public seed set's mean
   h1 (:func:`dpmarket.common.summarization.candidates.shrink_embedding`, at the curator) or,
   without a seed set, towards the owner's own mean h1 in the metric of its own scores
   (:func:`dpmarket.common.summarization.candidates.shrink_towards_points`, at the owner); never
   towards zero, which only scales the embedding down (docs/results.md, "Scenario suite").

Privacy (Notes of :func:`relevance_sensitivity`): replacing one validation point moves ``r``
by at most ``sqrt(2) / m`` in L2 whatever the relevance score and norm weight, so the Gaussian
mechanism calibrated on that sensitivity is ``(epsilon, delta)``-DP with respect to ``D_v``, and
with the embedding the two compose to the validation party's ``(epsilon, delta)`` for every
split (:func:`split_gaussian_sigmas`); everything the owners receive from it (their shares, the
shrunk decision) is post-processing with public values. The sketches are post-processed too:
they cost their owners nothing beyond what their publication charged.

With the mass cap on, a third Gaussian release about ``D_v``, its mean features in the sketches'
own maps (:func:`sketch_validation_means`, L2 sensitivity :func:`sketch_validation_sensitivity`),
gives each owner's mass near ``D_v`` with no transfer between maps (:func:`sketch_masses`); it
takes :data:`MASS_RELEASE_SHARE` of the same budget, so the three still compose to the validation
party's ``(epsilon, delta)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.accounting import analytic_gaussian_sigma
from dpmarket.common.privacy.noise import NoiseSource
from dpmarket.common.sketches import RFFMap, SketchLike, SyntheticDesign, regularization
from dpmarket.common.summarization.candidates import (
    shrink_embedding,
    validation_embedding_sensitivity,
)
from dpmarket.common.validation import check_matrix, check_positive_int, check_vector

__all__ = [
    "DEFAULT_M2M_SYNTHETIC",
    "MASS_RELEASE_SHARE",
    "RELEVANCE_SCORES",
    "RelevanceScore",
    "noisy_relevance",
    "relevance_matrix",
    "relevance_sensitivity",
    "responsibilities",
    "shrink_decision",
    "sketch_map_count",
    "sketch_masses",
    "sketch_validation_means",
    "sketch_validation_sensitivity",
    "split_gaussian_sigmas",
]

RelevanceScore = Literal["share", "density", "mass", "m2m", "mmd"]
#: Every relevance score, the default first (docs/results.md, "Scenario suite").
RELEVANCE_SCORES: tuple[RelevanceScore, ...] = ("share", "mmd", "density", "mass", "m2m")
#: The scores whose responsibilities are a vote for the owner of largest relevance; ``"share"``
#: splits each validation point among the owners in proportion to their kernel mass.
VOTING_SCORES: tuple[RelevanceScore, ...] = ("mmd", "density", "mass", "m2m")
#: Synthetic points of the M2M design of the ``"m2m"`` score (the paper uses 1e5; the estimate
#: is an average over them, so 2e4 keeps its sampling error well below the sketches' noise).
DEFAULT_M2M_SYNTHETIC = 20_000
#: Validation points whose kernel values against the synthetic points are computed at once.
_CHUNK = 512


def relevance_sensitivity(m: int) -> float:
    """L2 sensitivity of ``r = (1/m) sum_v pi(v)`` when one of the m validation points is replaced.

    Parameters
    ----------
    m : int
        Validation set size (public), >= 1.

    Returns
    -------
    float
        ``sqrt(2) / m``.

    Notes
    -----
    Neighbouring validation sets have the same public size m and differ in one point, ``v``
    replaced by ``v'``. Each ``pi(v)`` is a function of ``v`` and of public values only (the
    released sketches, their public maps and the synthetic points drawn from a public prior), so
    only one term of the average changes: ``r' - r = (pi(v') - pi(v)) / m``. Both are points of the
    probability simplex, whose L2 diameter is ``sqrt(2)`` (``||a - b||^2 = sum (a_i - b_i)^2 <=
    sum |a_i - b_i| max_i |a_i - b_i| <= 2 * 1``, attained by two vertices); hence
    ``||r' - r||_2 <= sqrt(2) / m`` for every relevance score, K included (the bound does not
    grow with the number of owners). The L1 sensitivity is ``2 / m``.
    """
    m = check_positive_int(m, "m")
    return math.sqrt(2.0) / m


def split_gaussian_sigmas(
    epsilon: float, delta: float, sensitivities: Sequence[float], shares: Sequence[float]
) -> list[float]:
    """Noise of several Gaussian releases about one party whose composition is ``(epsilon, delta)``.

    Parameters
    ----------
    epsilon, delta : float
        The party's total target, ``epsilon > 0``, ``0 < delta < 1``.
    sensitivities : sequence of float
        L2 sensitivity ``Delta_i > 0`` of each release.
    shares : sequence of float
        Each release's share of the squared privacy-loss scale, ``> 0``, summing to 1.

    Returns
    -------
    list of float
        ``sigma_i = Delta_i * sigma_u / sqrt(share_i)`` with ``sigma_u =
        analytic_gaussian_sigma(epsilon, delta, 1)``.

    Raises
    ------
    ValueError
        If the lengths differ, a sensitivity or share is not positive, or the shares do not sum
        to 1.

    Notes
    -----
    A Gaussian mechanism with sensitivity ``Delta`` and noise ``sigma`` has the privacy loss of
    ``N(mu^2 / 2, mu^2)`` with ``mu = Delta / sigma``; the adaptive composition of several has
    ``mu^2 = sum_i mu_i^2`` (the Gaussian-DP composition theorem, Dong, Roth & Su 2019, exact).
    With the sigmas above, ``mu^2 = sum_i share_i / sigma_u^2 = 1 / sigma_u^2``: together they are
    exactly the ``(epsilon, delta)``-DP Gaussian mechanism of sensitivity 1 and noise ``sigma_u``.
    """
    if len(sensitivities) != len(shares) or not shares:
        raise ValueError("sensitivities and shares must be non-empty and of equal length")
    for value in (*sensitivities, *shares):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"sensitivities and shares must be finite and > 0, got {value}")
    if abs(math.fsum(shares) - 1.0) > 1e-9:
        raise ValueError(f"shares must sum to 1, got {math.fsum(shares)}")
    sigma_u = analytic_gaussian_sigma(epsilon, delta, 1.0)
    return [d * sigma_u / math.sqrt(s) for d, s in zip(sensitivities, shares, strict=True)]


def _rff_map(sketch: SketchLike, index: int, n_features: int) -> RFFMap:
    fmap = sketch.feature_map
    if not isinstance(fmap, RFFMap):
        raise ValueError(f"sketch {index} has a {fmap.kind} feature map; the allocation needs RFF")
    if fmap.n_attributes != n_features:
        raise ValueError(
            f"sketch {index} describes {fmap.n_attributes} attributes but the validation set has "
            f"{n_features}"
        )
    return fmap


def _groups(sketches: Sequence[SketchLike], n_features: int) -> list[list[int]]:
    """Indices of the sketches grouped by equal feature maps (features computed once per map)."""
    groups: list[list[int]] = []
    maps: list[RFFMap] = []
    for k, sketch in enumerate(sketches):
        fmap = _rff_map(sketch, k, n_features)
        for g, other in enumerate(maps):
            if other == fmap:
                groups[g].append(k)
                break
        else:
            maps.append(fmap)
            groups.append([k])
    return groups


def relevance_matrix(
    sketches: Sequence[SketchLike],
    validation: ArrayLike,
    *,
    score: RelevanceScore,
    rng: np.random.Generator | None = None,
    bandwidth: float | None = None,
    n_synthetic: int = DEFAULT_M2M_SYNTHETIC,
    norm_weight: float = 1.0,
) -> NDArray[np.float64]:
    """Relevance ``u_k(v) >= 0`` of every owner's sketch to every validation point.

    Parameters
    ----------
    sketches : sequence of PrivateSketch (or SketchUnion), length K
        The owners' published RFF sketches (each with its own public map and domain).
    validation : array-like of shape (m, n)
        ``D_v``.
    score : {"mass", "density", "m2m", "mmd"}
        See the module docstring.
    rng : numpy.random.Generator, optional
        Draws the M2M design's synthetic points (``"m2m"`` only; public randomness).
    bandwidth : float, optional
        ``h`` of the ``"m2m"`` target kernel, in the data's units (default: half the sketch's
        sigma).
    n_synthetic : int
        Synthetic points of the M2M design (``"m2m"``).
    norm_weight : float
        ``"mmd"`` only: the weight ``lambda`` in [0, 1] of the sketch's squared norm in the
        distance ``lambda ||z_k||^2 - 2 <z_k, Phi(v)> / m'`` (1: the MMD between ``v`` and the
        owner's data; 0: the vote for the densest owner at ``v``). The norm favours diffuse
        owners whatever their points near ``v``, and for a small owner it is mostly its
        sketch's noise; a weight below 1 keeps part of it (docs/results.md, "Scenario suite").

    Returns
    -------
    ndarray of shape (m, K), float64, every entry >= 0
        (one-hot rows for ``"mmd"``).

    Raises
    ------
    ValueError
        If there is no sketch, a sketch is not RFF or has another attribute count than
        ``validation``, the score is unknown, ``"m2m"`` is asked without ``rng``, or
        ``norm_weight`` is outside [0, 1].

    Notes
    -----
    Row ``v`` depends on ``v`` and on the sketches (and the synthetic points) only, never on the
    other validation points: what :func:`relevance_sensitivity` needs. Post-processing of the
    sketches: it costs the owners nothing more.
    """
    if not sketches:
        raise ValueError("the allocation needs at least one sketch")
    if score not in RELEVANCE_SCORES:
        raise ValueError(f"score must be one of {RELEVANCE_SCORES}, got {score!r}")
    if not (math.isfinite(norm_weight) and 0.0 <= norm_weight <= 1.0):
        raise ValueError(f"norm_weight must lie in [0, 1], got {norm_weight}")
    v = np.asarray(check_matrix(validation, "validation set"), dtype=np.float64)
    k = len(sketches)
    out = np.zeros((v.shape[0], k), dtype=np.float64)
    for group in _groups(sketches, v.shape[1]):
        fmap = sketches[group[0]].feature_map
        assert isinstance(fmap, RFFMap)
        if score == "m2m":
            if rng is None:
                raise ValueError("the m2m relevance needs an rng for its synthetic points")
            h = 0.5 * fmap.sigma if bandwidth is None else float(bandwidth)
            if not (math.isfinite(h) and h > 0):
                raise ValueError(f"bandwidth must be a finite number > 0, got {bandwidth}")
            out[:, group] = _m2m_mass(
                [sketches[i] for i in group], v, rng, h, check_positive_int(n_synthetic, "n_s")
            )
            continue
        phi = fmap.features(v)  # (m, 2 m')
        scale = fmap.l2_sensitivity**2  # m': Phi(x) . Phi(y) / m' estimates k(x, y)
        if score in ("mass", "share"):
            # z_hat * n_hat: the noisy sum (exactly, when the noisy count is at least 1).
            sums = np.stack(
                [sketches[i].mean_embedding * sketches[i].count_estimate for i in group]
            )
            out[:, group] = phi @ sums.T / scale
            if score == "share":
                # <xi, Phi(v)> / m' ~ N(0, sigma_xi^2 / m') since ||Phi(v)||^2 = m': a mass
                # counts only by how far it stands above its sketch's noise.
                sd = np.array([math.sqrt(sketches[i].sum_noise_variance / scale) for i in group])
                out[:, group] -= share_threshold(k) * sd
        elif score == "density":
            means = np.stack([sketches[i].mean_embedding for i in group])
            out[:, group] = phi @ means.T / scale
        else:  # "mmd": -||Phi(v) - z_k||^2 / m', debiased, up to the constant ||Phi(v)||^2
            means = np.stack([sketches[i].mean_embedding for i in group])
            bias = np.array(
                [
                    fmap.dimension
                    * sketches[i].sum_noise_variance
                    / sketches[i].count_estimate ** 2
                    for i in group
                ]
            )
            norms = (np.einsum("kj,kj->k", means, means) - bias) / scale
            out[:, group] = 2.0 * (phi @ means.T) / scale - norm_weight * norms
    if score == "mmd":
        hard = np.zeros_like(out)
        hard[np.arange(out.shape[0]), np.argmax(out, axis=1)] = 1.0
        return hard
    return np.maximum(out, 0.0)


def _m2m_mass(
    sketches: Sequence[SketchLike],
    v: NDArray[np.float64],
    rng: np.random.Generator,
    h: float,
    n_synthetic: int,
) -> NDArray[np.float64]:
    """``n_hat_k * sum_i w_k,i k_h(x~_i, v)``: M2M's implicit weights (Section 3.5) of each
    sketch on one design drawn from the uniform prior over the (shared) public domain."""
    first = sketches[0]
    design = SyntheticDesign.draw(first.feature_map, first.domain, rng, n_synthetic=n_synthetic)
    weights = np.stack(
        [
            s.count_estimate * design.weights(s.mean_embedding, regularization(s), intercept=False)
            for s in sketches
        ],
        axis=1,
    )  # (n_s, K_group)
    points = design.points
    sq_points = np.einsum("ij,ij->i", points, points)
    out = np.empty((v.shape[0], len(sketches)), dtype=np.float64)
    for start in range(0, v.shape[0], _CHUNK):
        block = v[start : start + _CHUNK]
        d2 = (
            np.einsum("ij,ij->i", block, block)[:, None]
            + sq_points[None, :]
            - 2.0 * block @ points.T
        )
        kernel = np.exp(-np.maximum(d2, 0.0) / (2.0 * h * h))
        out[start : start + _CHUNK] = kernel @ weights
    return out


#: The mass release's share of the validation party's squared privacy-loss scale when the
#: mass cap is on (:func:`split_gaussian_sigmas`); the embedding and the decision keep their
#: split (:func:`derived_allocation_share`) of the rest. A public constant, not tuned
#: (docs/results.md, "The mass cap in the sketches' own map").
MASS_RELEASE_SHARE = 0.1
#: Standard deviations of the masses' noise added to each mass (an upper bound, so that a
#: noisy release loosens the cap instead of tightening it at random).
MASS_NOISE_Z = 2.0


def sketch_map_count(sketches: Sequence[SketchLike], n_features: int) -> int:
    """The number of distinct feature maps among the owners' RFF sketches (public): the blocks
    of :func:`sketch_validation_means`.

    Raises
    ------
    ValueError
        If a sketch is not RFF or describes another number of attributes than ``n_features``.
    """
    return len(_groups(sketches, n_features))


def sketch_validation_sensitivity(m: int, n_maps: int) -> float:
    """L2 sensitivity of :func:`sketch_validation_means` when one of the m validation points is
    replaced.

    Parameters
    ----------
    m : int
        Validation set size (public), >= 1.
    n_maps : int
        Number of distinct sketch feature maps among the owners (public), >= 1.

    Returns
    -------
    float
        ``2 sqrt(n_maps) / m``.

    Raises
    ------
    ValueError
        If an argument is not a positive integer.

    Notes
    -----
    The release is the concatenation over the distinct maps of ``(1/m) sum_v u(v)``, with
    ``u(v) = Phi(v) / sqrt(m')`` a unit vector (``||Phi(v)||^2 = m'`` for every ``v``: each
    frequency contributes ``cos^2 + sin^2 = 1``). Replacing ``v`` by ``v'`` moves one map's
    block by ``(u(v') - u(v)) / m``, of norm at most ``2 / m``; every block moves at once, so
    the concatenation moves by at most ``sqrt(n_maps) * 2 / m``. The bound is reached with one
    frequency (``m' = 1``) and ``omega . v' = omega . v + pi``.
    """
    m = check_positive_int(m, "m")
    n_maps = check_positive_int(n_maps, "n_maps")
    return 2.0 * math.sqrt(n_maps) / m


def sketch_validation_means(
    sketches: Sequence[SketchLike], validation: ArrayLike
) -> NDArray[np.float64]:
    """D_v's mean features in the owners' own sketch maps, before noise: the mass release.

    Parameters
    ----------
    sketches : sequence of PrivateSketch (or SketchUnion), length K
        The owners' published RFF sketches (their public maps only are read).
    validation : array-like of shape (m, n)
        ``D_v``.

    Returns
    -------
    ndarray of shape (sum over the distinct maps of 2 m',), float64
        For each distinct map, in the order of first appearance among ``sketches``, the block
        ``(1/m) sum_v Phi(v) / ||Phi(v)||`` (``||Phi(v)|| = sqrt(m')`` up to the float32
        cosines): a mean of unit vectors, so of norm <= 1.

    Raises
    ------
    ValueError
        If there is no sketch, a sketch is not RFF or describes another number of attributes
        than ``validation``.

    Notes
    -----
    Reads D_v: the curator releases it only with Gaussian noise calibrated on
    :func:`sketch_validation_sensitivity`, charged to D_v's ledger before any function of it
    leaves the curator (:meth:`dpmarket.curator.summarization.allocation.Allocator.by_sketches`).
    """
    if not sketches:
        raise ValueError("the mass release needs at least one sketch")
    v = np.asarray(check_matrix(validation, "validation set"), dtype=np.float64)
    blocks = []
    for group in _groups(sketches, v.shape[1]):
        fmap = sketches[group[0]].feature_map
        assert isinstance(fmap, RFFMap)
        phi = np.asarray(fmap.features(v), dtype=np.float64)  # (m, 2 m')
        # ||Phi(v)|| = sqrt(m') up to the float32 cosines: dividing by the computed norm keeps
        # every row of norm 1 exactly, which the sensitivity needs.
        norms = np.linalg.norm(phi, axis=1, keepdims=True)
        blocks.append((phi / np.maximum(norms, 1e-300)).mean(axis=0))
    return np.concatenate(blocks)


def sketch_masses(
    sketches: Sequence[SketchLike],
    released: ArrayLike,
    sigma: float,
    *,
    z: float = MASS_NOISE_Z,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each owner's mass near D_v, ``sum_{x in D_k} mean_v k(x, v)``, from its published sketch
    and D_v's mean features released in the same map: the basis of the mass cap
    (:func:`dpmarket.common.summarization.candidates.mass_read_caps`).

    With ``S_k = z_hat_k n_hat_k`` the owner's noisy sum of features and ``u~`` the released
    block of its map (:func:`sketch_validation_means` plus noise), the mass is
    ``M_k = <S_k, u~> / sqrt(m')``: without noise exactly
    ``sum_{x in D_k} mean_v Phi(x) . Phi(v) / m'``, the sketch's RFF estimate of
    ``sum_{x in D_k} mean_v k(x, v)`` under the sketch's kernel
    ``k(x, v) = exp(-||x - v||^2 / (2 sigma_s^2))`` (the ``"mass"`` relevance score of
    :func:`relevance_matrix` averaged over D_v). No design and no transfer between maps.

    Parameters
    ----------
    sketches : sequence of PrivateSketch (or SketchUnion), length K
        The owners' published RFF sketches.
    released : array-like of shape (sum over the distinct maps of 2 m',)
        ``sketch_validation_means(sketches, D_v) + N(0, sigma^2 I)``, as released.
    sigma : float
        The release's noise per coordinate (public), >= 0.
    z : float
        The upper bound's multiple of the mass's standard deviation, >= 0.

    Returns
    -------
    upper : ndarray of shape (K,), float64, entries >= 0
        ``max(0, M_k + z s_k)``, ``s_k^2 = (sigma^2 ||S_k||^2 + sigma_xi,k^2) / m'``: the mass
        raised by ``z`` standard deviations of both noises (kernel units: an owner holding
        ``n`` copies of a one-point D_v has ``n``).
    mass : ndarray of shape (K,), float64
        ``M_k`` itself (may be negative).

    Raises
    ------
    ValueError
        If a sketch is not RFF, ``released`` does not have one block per distinct map, or an
        argument is out of range.

    Notes
    -----
    Error: ``M_k - M_k* = (<xi_k, u> + <S_k, eta>) / sqrt(m')`` with ``xi_k`` the sketch's
    noise (variance ``sigma_xi,k^2`` per coordinate) and ``eta ~ N(0, sigma^2 I)`` the
    release's. Given the published ``S_k`` the second term is ``N(0, sigma^2 ||S_k||^2 / m')``;
    the first has variance ``sigma_xi,k^2 ||u||^2 / m' <= sigma_xi,k^2 / m'`` (``||u|| <= 1``).

    Privacy: a function of the owners' published sketches (charged to their owners at
    publication) and of the released ``u~`` with its public ``sigma`` (charged to D_v's ledger
    before it was computed on): post-processing, no further cost to anybody, and neither do
    caps derived from it. It reads neither D_v nor any owner's data.
    """
    u = check_vector(released, "released").astype(np.float64)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
    if not (math.isfinite(z) and z >= 0):
        raise ValueError(f"z must be a finite number >= 0, got {z}")
    if not sketches:
        raise ValueError("the masses need at least one sketch")
    first_map = sketches[0].feature_map
    if not isinstance(first_map, RFFMap):
        raise ValueError(f"sketch 0 has a {first_map.kind} feature map; the masses need RFF")
    groups = _groups(sketches, first_map.n_attributes)
    dims = [sketches[g[0]].feature_map.dimension for g in groups]
    if u.shape[0] != sum(dims):
        raise ValueError(
            f"released must have {sum(dims)} entries (one block per distinct map), got {u.shape[0]}"
        )
    mass = np.zeros(len(sketches), dtype=np.float64)
    sd = np.zeros(len(sketches), dtype=np.float64)
    start = 0
    for group, dim in zip(groups, dims, strict=True):
        block = u[start : start + dim]
        start += dim
        fmap = sketches[group[0]].feature_map
        assert isinstance(fmap, RFFMap)
        root = fmap.l2_sensitivity  # sqrt(m')
        sums = np.stack([sketches[i].mean_embedding * sketches[i].count_estimate for i in group])
        mass[group] = sums @ block / root
        noise = np.array([sketches[i].sum_noise_variance for i in group], dtype=np.float64)
        sd[group] = np.sqrt(sigma**2 * np.einsum("kj,kj->k", sums, sums) + noise) / root
    return np.maximum(mass + z * sd, 0.0), mass


def responsibilities(relevance: ArrayLike, *, vote: bool = True) -> NDArray[np.float64]:
    """Each validation point's responsibilities: a point of the simplex per relevance row.

    Parameters
    ----------
    relevance : array-like of shape (m, K), entries >= 0
    vote : bool
        One-hot on the row's largest entry (the first on ties), or the row divided by its sum.

    Returns
    -------
    ndarray of shape (m, K)
        Rows summing to 1; a row of zeros becomes ``1/K`` everywhere.

    Raises
    ------
    ValueError
        If ``relevance`` is not a finite 2-D array or has a negative entry.
    """
    u = check_matrix(relevance, "relevance")
    if (u < 0).any():
        raise ValueError("relevance values must be >= 0")
    totals = u.sum(axis=1, keepdims=True)
    if vote:
        one_hot = np.zeros_like(u)
        one_hot[np.arange(u.shape[0]), np.argmax(u, axis=1)] = 1.0
        u, totals = one_hot, np.where(totals > 0, 1.0, 0.0)
    uniform = np.full_like(u, 1.0 / u.shape[1])
    return np.where(totals > 0, u / np.where(totals > 0, totals, 1.0), uniform)


def noisy_relevance(
    pi: ArrayLike, sigma: float, noise: NoiseSource
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The released decision: the mean responsibility per owner plus Gaussian noise.

    Parameters
    ----------
    pi : array-like of shape (m, K)
        Responsibilities (:func:`responsibilities`).
    sigma : float
        Noise standard deviation per owner, ``>= relevance_sensitivity(m) * sigma_u`` for the
        intended ``(epsilon, delta)`` (:func:`split_gaussian_sigmas`).
    noise : NoiseSource
        OpenDP in production, seeded in tests.

    Returns
    -------
    exact : ndarray of shape (K,)
        ``(1/m) sum_v pi(v)`` (never released).
    noisy : ndarray of shape (K,)
        ``exact + N(0, sigma^2 I_K)``: the release.

    Raises
    ------
    ValueError
        If ``sigma`` is not a finite number > 0.
    """
    p = check_matrix(pi, "responsibilities")
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma}")
    exact = p.mean(axis=0)
    return exact, exact + noise.gaussian(sigma, exact.shape[0])


def shrink_decision(noisy: ArrayLike, sigma: float) -> tuple[NDArray[np.float64], float]:
    """James-Stein shrinkage of the released decision towards the even split ``1/K``.

    Parameters
    ----------
    noisy : array-like of shape (K,)
        ``r~ = r + N(0, sigma^2 I_K)`` (:func:`noisy_relevance`), with ``r`` on the simplex.
    sigma : float
        The release's noise per owner, > 0 (public).

    Returns
    -------
    shrunk : ndarray of shape (K,), float64
        ``1/K + alpha (r~ - 1/K)``.
    alpha : float
        ``max(0, 1 - (K - 2) sigma^2 / ||r~ - 1/K||^2)`` in [0, 1]; 1 for K <= 2.

    Raises
    ------
    ValueError
        If ``noisy`` is not a finite vector or ``sigma`` is not a finite number > 0.

    Notes
    -----
    Post-processing of the release with the public sigma: no further privacy cost. With many
    owners and a small validation set the noise of each owner's share (``sigma`` grows as
    ``1/m``) is as large as the shares themselves (``1/K``); read as is, the split then follows
    the noise and changes wildly from one session to the next. Shrunk, it moves from the even
    split only as far as the release shows a difference (the risk argument of
    :func:`dpmarket.common.summarization.candidates.shrink_embedding`, with d = K).
    """
    r = check_vector(noisy, "noisy decision").astype(np.float64)
    prior = np.full(r.shape[0], 1.0 / r.shape[0])
    return shrink_embedding(r, prior, sigma)


#: The typical spread of an owner's scores ``g . h1(x)`` that the validation embedding must
#: resolve (kernel units; chosen on the scenario suite, docs/results.md "Scenario suite").
SCORE_SIGNAL = 0.1


def derived_allocation_share(
    m: int, k: int, epsilon: float, delta: float, *, signal: float | None = None
) -> float:
    """The sketch allocation's share of the validation party's budget, from public m, K, epsilon
    and delta.

    The validation party's budget pays for two Gaussian releases
    (:func:`split_gaussian_sigmas`): the embedding, whose noise per owner score is
    ``sigma_g = 2 sigma_u / (m sqrt(1 - a))``
    (:func:`~dpmarket.common.summarization.candidates.validation_embedding_sensitivity`), against a
    signal of about ``signal`` (:data:`SCORE_SIGNAL`); and the decision, whose noise per owner
    is ``sigma_a = sqrt(2) sigma_u / (m sqrt(a))``, against shares of about ``1 / K``. Each
    release's relative noise ``x = (noise / signal)^2`` costs ``x / (1 + x)``: close to ``x``
    while it is small, close to 1 (the release is useless) when the noise swamps the signal.
    The share ``a`` minimises the sum of the two costs, on a grid of ``a`` in [0.05, 0.95]
    (step 0.01)::

        x_g = A / (1 - a),  A = (2 sigma_u / (m * signal))^2
        x_a = B / a,        B = (sqrt(2) sigma_u K / m)^2

    With a large validation set both releases are accurate and the split follows
    ``a / (1 - a) = sqrt(B / A) = K signal / sqrt(2)`` (flights, m = 2,456, K = 8: a = 0.36);
    with a small one the embedding cannot be made useful and the decision gets most of it
    (digits, m = 44, K = 5: a = 0.88).

    Parameters
    ----------
    m : int
        Validation set size, >= 1.
    k : int
        Number of owners, >= 1.
    epsilon, delta : float
        The validation party's budget (``sigma_u = analytic_gaussian_sigma(epsilon, delta, 1)``).
    signal : float, optional
        Score signal scale, > 0 (default :data:`SCORE_SIGNAL`).

    Returns
    -------
    float
        ``a`` in [0.05, 0.95].

    Raises
    ------
    ValueError
        If an argument is out of range.

    Notes
    -----
    A function of public values only: it changes how the budget is split, not the total, so
    the two releases still compose to ``(epsilon, delta)`` (:func:`split_gaussian_sigmas`).
    """
    m = check_positive_int(m, "m")
    k = check_positive_int(k, "k")
    s = SCORE_SIGNAL if signal is None else float(signal)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"signal must be a finite number > 0, got {signal}")
    sigma_u = analytic_gaussian_sigma(epsilon, delta, 1.0)
    big_a = (validation_embedding_sensitivity(m) * sigma_u / s) ** 2
    big_b = (relevance_sensitivity(m) * sigma_u * k) ** 2
    grid = np.round(np.arange(0.05, 0.9501, 0.01), 2)
    x_g = big_a / (1.0 - grid)
    x_a = big_b / grid
    cost = x_g / (1.0 + x_g) + x_a / (1.0 + x_a)
    return float(grid[int(np.argmin(cost))])


#: Expected number of owners whose kernel mass at a validation point passes the ``"share"``
#: score's threshold by their sketch's noise alone (the threshold is derived from K with it).
SHARE_FALSE_POSITIVES = 0.5


def share_threshold(k: int) -> float:
    """The ``"share"`` score's threshold, in standard deviations of a sketch's mass noise.

    ``t = Phi^{-1}(1 - SHARE_FALSE_POSITIVES / K)`` (``Phi`` the standard normal CDF, at least
    0): among K owners whose true mass at a validation point is 0, about
    ``SHARE_FALSE_POSITIVES`` pass ``t`` by noise alone, whatever K.

    Parameters
    ----------
    k : int
        Number of owners (public), >= 1.

    Returns
    -------
    float
        ``t >= 0``.
    """
    from scipy.stats import norm

    k = check_positive_int(k, "k")
    return max(0.0, float(norm.ppf(1.0 - SHARE_FALSE_POSITIVES / k)))
