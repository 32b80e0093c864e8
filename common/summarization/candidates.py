"""The candidates method: private relevance counts allocate a candidate budget among owners.

Protocol (one round, instead of Algorithm 3's p rounds):

1. The curator releases ``gtilde = mean h1(D_v) + N(0, sigma^2 I)`` (Gaussian mechanism).
2. Each owner counts its relevant points, ``#{x : gtilde . h1(x) >= kappa ||gtilde||^2}``.
3. The curator adds Laplace noise to every count and splits a budget of
   ``floor(fraction * K * p)`` candidates among owners (:func:`allocate_candidates`).
4. Each owner proposes its share by a local greedy against ``gtilde`` on its own points (with
   the sketch allocation, ``gtilde`` shrunk towards the public seed set's embedding first:
   :func:`shrink_embedding`).
5. The trusted curator, which holds ``D_v``, chooses the p summary points among the candidates by
   the exact marginal gain (non-private greedy on the candidate pool).

Every message an owner receives (``gtilde`` and its share) is a post-processing of the Gaussian
release and of the noisy counts, so it is DP with respect to ``D_v`` and to every other owner's
data; the final re-ranking happens after the last message and releases nothing to owners.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.common.validation import check_matrix, check_positive_int, check_vector

#: L2 norm bound of one h1 feature vector: ``||h1(x)||^2 = (2/d) sum cos^2 <= 2``.
H1_NORM_BOUND = math.sqrt(2.0)


def validation_embedding(features: ArrayLike) -> NDArray[np.float64]:
    """The validation set's mean embedding as the Gaussian release computes it: the mean of its
    h1 features, each row scaled to unit L2 norm.

    ``||h1(x)||^2 = (2/d) sum_j cos^2(w_j . x + b_j)`` is 1 on average and at most 2; scaling every
    row to norm 1 keeps the embedding's direction (each point's kernel estimate
    ``h1(x) . h1(v) / ||h1(v)||`` is the normalised random-feature estimate, within
    ``O(1/sqrt(d))`` of the plain one) and halves the squared L2 sensitivity of the mean
    (:func:`validation_embedding_sensitivity`).

    Parameters
    ----------
    features : array-like of shape (m, d)
        h1 features of the validation set, m >= 1.

    Returns
    -------
    ndarray of shape (d,), float64
        ``(1/m) sum_v h1(v) / ||h1(v)||`` (a row of zeros, which h1 never produces, stays zero).

    Raises
    ------
    ValueError
        If ``features`` is not a finite non-empty 2-D array.
    """
    x = check_matrix(features, "validation features").astype(np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray((x / np.where(norms > 0, norms, 1.0)).mean(axis=0), dtype=np.float64)


def validation_embedding_in_chunks(
    points: ArrayLike, rff: RFFParams, *, chunk_rows: int = 4096
) -> NDArray[np.float64]:
    """:func:`validation_embedding` of ``h1(points)``, the features made ``chunk_rows`` rows at a
    time: the m x d feature matrix is never held whole (at a policy's largest m = 100,000 and
    d = 2,048 it is 1.6 GB, and one consumer request took a curator to 4.8 GiB).

    Parameters
    ----------
    points : array-like of shape (m, n_features)
        The validation set, m >= 1.
    rff : RFFParams
        The session's h1.
    chunk_rows : int, default 4096
        Rows mapped at once: the working memory is about ``chunk_rows * d`` float64 values.

    Returns
    -------
    ndarray of shape (d,), float64
        As :func:`validation_embedding` (the same value up to the order of the sum).

    Raises
    ------
    ValueError
        If ``points`` is not a finite non-empty 2-D array, or ``chunk_rows`` < 1.
    """
    x = check_matrix(points, "validation points")
    check_positive_int(chunk_rows, "chunk_rows")
    total = np.zeros(rff.phase.shape[0], dtype=np.float64)
    for start in range(0, x.shape[0], chunk_rows):
        chunk = random_fourier_features(x[start : start + chunk_rows], rff, dtype=np.float64)
        norms = np.linalg.norm(chunk, axis=1, keepdims=True)
        total += (chunk / np.where(norms > 0, norms, 1.0)).sum(axis=0)
    return total / x.shape[0]


def validation_embedding_sensitivity(m: int) -> float:
    """L2 sensitivity of :func:`validation_embedding` when one of the m validation points is
    replaced.

    Parameters
    ----------
    m : int
        Validation set size (public), >= 1.

    Returns
    -------
    float
        ``2 / m``.

    Notes
    -----
    Replacing ``x`` by ``x'`` changes the mean of the unit-norm rows ``u(x) = h1(x) / ||h1(x)||``
    by ``(u(x') - u(x)) / m``, whose norm is at most ``(||u(x')|| + ||u(x)||) / m = 2 / m``.
    (Unscaled rows would give ``2 sqrt(2) / m``, since every entry of h1 lies in
    ``[-sqrt(2/d), sqrt(2/d)]`` and ``||h1(x)|| <= sqrt(2)``; under add/remove the bound would
    be 1 on the sum.)
    """
    m = check_positive_int(m, "m")
    return 2.0 / m


def shrink_embedding(
    noisy: ArrayLike, prior: ArrayLike, noise_sigma: float
) -> tuple[NDArray[np.float64], float]:
    """Positive-part James-Stein shrinkage of a Gaussian-noised embedding towards a public one.

    Returns ``prior + alpha * (noisy - prior)`` with
    ``alpha = max(0, 1 - (d - 2) sigma^2 / ||noisy - prior||^2)``: the noisy validation
    embedding pulled towards a public embedding (the candidates method uses ``mean h1`` of the
    public seed set) by as much as its noise hides it. With a large validation set the noise is
    small and ``alpha`` close to 1 (flights, m = 2456: 0.94-0.98); with a small one the noise
    dominates and ``alpha`` is close to 0 (digits, m = 44: 0-0.17), so an owner's local greedy
    matches the public embedding with its own points (a representative proposal) instead of
    chasing the noise's direction (a proposal far from D_v: docs/results.md, "Sketch allocation").

    Parameters
    ----------
    noisy : array-like of shape (d,)
        ``g + N(0, noise_sigma^2 I_d)``, the released embedding.
    prior : array-like of shape (d,)
        A public embedding, fixed before the release (zeros when there is none).
    noise_sigma : float
        The release's noise standard deviation per coordinate, > 0 (public: a function of the
        public epsilon, delta and m).

    Returns
    -------
    shrunk : ndarray of shape (d,), float64
    alpha : float
        In [0, 1]; 1 when ``d <= 2`` (no shrinkage), 0 when ``noisy == prior``.

    Raises
    ------
    ValueError
        If the vectors are not finite, their shapes differ, or ``noise_sigma`` is not a finite
        number > 0.

    Notes
    -----
    Privacy: a function of the release, of the public ``noise_sigma`` and of the public
    ``prior`` only, so post-processing: it costs nothing beyond the release.

    Accuracy: for ``d >= 3`` the James-Stein estimator ``prior + (1 - (d - 2) sigma^2 /
    ||noisy - prior||^2) (noisy - prior)`` has a smaller expected squared error than ``noisy``
    for every ``g`` (James & Stein 1961), and its positive part (``alpha`` clipped at 0) is
    smaller still (Baranchik 1964). Rederived: with ``y = noisy - prior = theta + n``,
    ``E ||(1 - c / ||y||^2) y - theta||^2 = d sigma^2 - (2 c (d - 2) sigma^2 - c^2)
    E[1 / ||y||^2]`` by Stein's lemma, minimised at ``c = (d - 2) sigma^2``.

    References
    ----------
    James, W. & Stein, C. (1961), "Estimation with quadratic loss"; Baranchik, A. J. (1964).
    """
    y = check_vector(noisy, "noisy embedding").astype(np.float64)
    g0 = check_vector(prior, "prior embedding", size=y.shape[0]).astype(np.float64)
    if not (math.isfinite(noise_sigma) and noise_sigma > 0):
        raise ValueError(f"noise_sigma must be a finite number > 0, got {noise_sigma}")
    diff = y - g0
    d = y.shape[0]
    norm2 = float(diff @ diff)
    if d <= 2:
        alpha = 1.0
    elif norm2 == 0.0:
        alpha = 0.0
    else:
        alpha = max(0.0, 1.0 - (d - 2) * noise_sigma**2 / norm2)
    return g0 + alpha * diff, alpha


def shrink_in_score_metric(
    noisy: ArrayLike, prior: ArrayLike, second_moment: ArrayLike, noise_sigma: float
) -> tuple[NDArray[np.float64], float]:
    """:func:`shrink_embedding`'s rule in the metric of one owner's scores: the amount read from
    how noisy the release is where that owner's points see it, not in all d coordinates.

    Returns ``prior + alpha * (noisy - prior)`` with
    ``alpha = clip(1 - sigma^2 tr(Sigma) / ((noisy - prior)^T Sigma (noisy - prior)), 0, 1)``,
    ``Sigma = mean_x h1(x) h1(x)^T`` over the owner's points. An owner uses the embedding only
    through its scores ``g . h1(x)`` on its own points, whose squared error, averaged over them,
    is ``(g^ - g)^T Sigma (g^ - g)``; in that metric the release's noise is ``sigma^2 tr(Sigma)``
    (about ``sigma^2``: ``||h1(x)|| ~ 1``), where :func:`shrink_embedding` charges all d
    coordinates, ``(d - 2) sigma^2`` (11.1 at m = 30, epsilon 1, d = 140, against a signal
    ``||g - mu||^2`` below 1). So with a small validation set James-Stein in R^d shrinks an
    owner's target almost to its own mean (alpha 0-0.05), while in the owner's metric the
    release still carries most of what its scores need (alpha 0.3-0.9); with a large one both
    are close to 1.

    Parameters
    ----------
    noisy : array-like of shape (d,)
        ``g + N(0, noise_sigma^2 I_d)``, the released embedding.
    prior : array-like of shape (d,)
        What to shrink towards (the owner's own mean h1).
    second_moment : array-like of shape (d, d)
        ``Sigma``, the owner's points' uncentered h1 second moment (symmetric positive
        semi-definite).
    noise_sigma : float
        The noise standard deviation per coordinate the shrinkage assumes, > 0 (public: the
        release's, times the square root of the session's shrinkage strength).

    Returns
    -------
    shrunk : ndarray of shape (d,), float64
    alpha : float
        In [0, 1]; 0 when ``noisy - prior`` is 0 in the metric.

    Raises
    ------
    ValueError
        If a value is not finite, the shapes differ, or ``noise_sigma`` is not a finite number
        > 0.

    Notes
    -----
    Privacy: a function of the release, of the public ``noise_sigma`` and of the owner's own data
    (``prior``, ``Sigma``), computed at the owner, whose result never leaves it; post-processing
    of the release for the validation set: it costs nothing beyond the release.

    Derivation: with ``r = noisy - prior = theta + n``, ``theta = g - prior``,
    ``n ~ N(0, sigma^2 I)``, ``E[r^T Sigma r] = theta^T Sigma theta + sigma^2 tr(Sigma)``, so
    ``r^T Sigma r - sigma^2 tr(Sigma)`` estimates the signal ``s = theta^T Sigma theta`` without
    bias. Among ``prior + a r`` the error ``E (a r - theta)^T Sigma (a r - theta)`` is least at
    ``a = s / (s + sigma^2 tr Sigma)``; the plug-in estimate of it is ``alpha`` above (the
    method-of-moments, or "positive-part", James-Stein factor; in the identity metric,
    ``Sigma = I``, it is :func:`shrink_embedding`'s with d for d - 2). Stein's unbiased risk
    estimate gives the same rule with ``tr(Sigma) - 2 r^T Sigma^2 r / r^T Sigma r`` in place of
    ``tr(Sigma)`` (Bock 1975, for a quadratic loss of general matrix): the plug-in shrinks a
    little more, never less.

    References
    ----------
    James, W. & Stein, C. (1961), "Estimation with quadratic loss"; Bock, M. E. (1975),
    "Minimax estimators of the mean of a multivariate normal distribution", Ann. Statist. 3;
    the summarization paper's h1 embedding (Algorithm 1) and its Gaussian release (Algorithm 3,
    step 3).
    """
    y = check_vector(noisy, "noisy embedding").astype(np.float64)
    g0 = check_vector(prior, "prior embedding", size=y.shape[0]).astype(np.float64)
    sigma = _check_second_moment(second_moment, y.shape[0])
    if not (math.isfinite(noise_sigma) and noise_sigma > 0):
        raise ValueError(f"noise_sigma must be a finite number > 0, got {noise_sigma}")
    diff = y - g0
    signal = float(diff @ sigma @ diff)
    noise = noise_sigma**2 * float(np.trace(sigma))
    alpha = 0.0 if signal <= 0.0 else min(1.0, max(0.0, 1.0 - noise / signal))
    return g0 + alpha * diff, alpha


#: The strength rules :func:`shrinkage_strength` knows (``CandidatesConfig.shrinkage_strength``).
SHRINKAGE_STRENGTH_RULES = ("fixed", "snr", "share")


def shrinkage_strength(noisy: ArrayLike, noise_sigma: float, rule: str = "snr") -> float:
    """The owners' shrinkage strength read from the release: how much of ``gtilde`` is signal.

    The owners shrink ``gtilde = g + N(0, sigma^2 I_d)`` towards their own mean h1 by
    James-Stein with the noise variance scaled by a strength ``c``
    (:func:`shrink_embedding` with ``sqrt(c) sigma``). ``c = 1`` is James-Stein's amount; with a
    small validation set (m <= 100 at epsilon 1, d = 140) the noise energy ``d sigma^2`` is
    4-16 times the signal's ``||g||^2`` and that amount (``alpha`` about 0.04) turns every
    owner's proposal into a sample of its own data, away from a kind it holds little of, while
    with a large one the pull towards the owner's mean is what keeps proposals representative
    (docs/results.md, "The shrinkage per allocation path"). The rule reads which case a request
    is in from the release itself: since ``E ||gtilde||^2 = ||g||^2 + d sigma^2``, the signal
    energy is estimated by ``||gtilde||^2 - d sigma^2`` (unbiased), and

    * ``"snr"``: ``c = min(1, max(0, ||gtilde||^2 - d sigma^2) / (d sigma^2))``, the estimated
      signal energy over the noise energy, capped at James-Stein's amount (reached when the two
      are equal);
    * ``"share"``: ``c = max(0, 1 - d sigma^2 / ||gtilde||^2)``, the estimated signal's share
      of the release's energy (the positive-part James-Stein factor of ``gtilde`` towards 0,
      with ``d`` for ``d - 2``);
    * ``"fixed"``: ``c = 1``.

    The same ``c`` for every owner of a request (a function of m through ``sigma``, not of an
    owner's prior: docs/results.md, "Choosing the metric per owner").

    Parameters
    ----------
    noisy : array-like of shape (d,)
        The released embedding ``gtilde``.
    noise_sigma : float
        The release's noise standard deviation per coordinate, > 0 (public: from m, epsilon and
        delta).
    rule : {"snr", "share", "fixed"}

    Returns
    -------
    float
        The strength ``c`` in [0, 1] (0: no shrinkage; below 1e-6 it is returned as 0).

    Raises
    ------
    ValueError
        If ``noisy`` is not a finite vector, ``noise_sigma`` is not a finite number > 0, or
        ``rule`` is unknown.

    Notes
    -----
    Privacy: a function of the release and of the public ``noise_sigma`` and d only, so
    post-processing; computed by the curator and sent as the noise the owners assume.

    References
    ----------
    James & Stein (1961); the noise energy ``d sigma^2`` of the Gaussian mechanism's release.
    """
    y = check_vector(noisy, "noisy embedding").astype(np.float64)
    if not (math.isfinite(noise_sigma) and noise_sigma > 0):
        raise ValueError(f"noise_sigma must be a finite number > 0, got {noise_sigma}")
    if rule not in SHRINKAGE_STRENGTH_RULES:
        raise ValueError(f"rule must be one of {SHRINKAGE_STRENGTH_RULES}, got {rule!r}")
    if rule == "fixed":
        return 1.0
    noise = y.shape[0] * noise_sigma**2
    energy = float(y @ y)
    if rule == "snr":
        c = min(1.0, max(0.0, energy - noise) / noise)
    else:
        c = max(0.0, 1.0 - noise / energy) if energy > 0 else 0.0
    return c if c >= 1e-6 else 0.0


def _check_second_moment(second_moment: ArrayLike, d: int) -> NDArray[np.float64]:
    """``second_moment`` as a finite (d, d) float64 matrix, or ValueError naming its shape."""
    sigma = np.asarray(second_moment, dtype=np.float64)
    if sigma.shape != (d, d) or not np.all(np.isfinite(sigma)):
        raise ValueError(
            f"second_moment must be a finite ({d}, {d}) matrix, got shape {sigma.shape}"
        )
    return sigma


def relevance_threshold(embedding: ArrayLike, kappa: float, *, noise_sigma: float = 0.0) -> float:
    """Score threshold ``kappa * ||g||^2`` above which a point counts as relevant.

    ``gtilde . h1(x)`` estimates ``mean_v k(x, v)``, and ``||g||^2`` its average over the
    validation points themselves; ``kappa = 1`` asks for points as typical as a validation point.
    ``||g||^2`` is estimated without bias from the noisy ``gtilde = g + N(0, sigma^2 I)`` as
    ``||gtilde||^2 - d sigma^2`` (clipped at 0): post-processing of the release and the public
    sigma.

    Parameters
    ----------
    embedding : array-like of shape (d,)
        gtilde.
    kappa : float
        Fraction of ``||g||^2``.
    noise_sigma : float
        Standard deviation of the Gaussian noise in ``embedding`` (0 for an exact embedding).

    Raises
    ------
    ValueError
        If the embedding is not a finite vector, or ``kappa`` or ``noise_sigma`` is not finite.
    """
    g = check_vector(embedding, "embedding")
    if not math.isfinite(kappa):
        raise ValueError(f"kappa must be finite, got {kappa}")
    if not (math.isfinite(noise_sigma) and noise_sigma >= 0):
        raise ValueError(f"noise_sigma must be finite and >= 0, got {noise_sigma}")
    norm2 = max(float(g @ g) - g.shape[0] * noise_sigma**2, 0.0)
    return float(kappa * norm2)


def allocate_candidates(
    budget: int,
    weights: ArrayLike,
    caps: Sequence[int],
    *,
    even_share: float,
) -> NDArray[np.int64]:
    """Split ``budget`` candidates among owners: an even part, then in proportion to ``weights``.

    ``floor(even_share * budget)`` is split evenly; the rest in proportion to the weights (noisy
    relevance counts clipped at 0), by water-filling so that no owner gets more than its cap and
    what a capped owner cannot take goes to the others; integer parts by largest remainder. If
    every weight is 0 the rest is split evenly too.

    Parameters
    ----------
    budget : int
        Total number of candidates, >= 0.
    weights : array-like of shape (K,)
        Non-negative finite weights.
    caps : sequence of int, length K
        Most candidates each owner can give (e.g. ``min(points, p)``), >= 0.
    even_share : float
        In [0, 1].

    Returns
    -------
    ndarray of shape (K,), int64
        Shares summing to ``min(budget, sum(caps))``, each within its cap.

    Raises
    ------
    ValueError
        If the weights are negative or not finite, shapes differ, or ``even_share`` is outside
        [0, 1].
    """
    w: NDArray[np.float64] = check_vector(weights, "weights").astype(np.float64)
    caps_arr = np.asarray(caps, dtype=np.int64)
    if caps_arr.shape != w.shape:
        raise ValueError(f"caps must have shape {w.shape}, got {caps_arr.shape}")
    if (w < 0).any() or (caps_arr < 0).any():
        raise ValueError("weights and caps must be >= 0")
    if not 0.0 <= even_share <= 1.0:
        raise ValueError(f"even_share must lie in [0, 1], got {even_share}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    total = int(min(budget, int(caps_arr.sum())))
    even_total = math.floor(even_share * total)
    shares = np.zeros(w.shape[0], dtype=np.float64)
    shares = _water_fill(shares, np.ones_like(w), caps_arr, even_total)
    rest = total - even_total
    shares = _water_fill(shares, w, caps_arr, rest)
    out = np.floor(shares).astype(np.int64)
    missing = total - int(out.sum())
    order = np.argsort(-(shares - out), kind="stable")
    while missing > 0:  # largest remainders first; total <= sum(caps) guarantees room
        for i in order:
            if missing > 0 and out[i] < caps_arr[i]:
                out[i] += 1
                missing -= 1
    return out


def size_read_caps(
    caps: Sequence[int], sizes: Sequence[int], divisor: float, amount: int
) -> NDArray[np.int64]:
    """Each owner's most targeted reads by its size: ``min(cap_k, ceil(n_k / c))``.

    A local greedy asked for most of its owner's table proposes nearly all of it whatever the
    validation set, so a decision that concentrates on one small owner (the sketch decision's
    vote counts density, not how many of the kind an owner holds: tv16-40 in docs/results.md,
    "A size cap on the targeted reads") reads that owner's other points. The cap bounds each
    owner's targeted reads by a fraction ``1/c`` of its size; :func:`allocate_candidates` then
    gives what a capped owner cannot take to the others in
    proportion to their weights (water-filling). When the capped owners together cannot supply
    ``amount``, ``c`` is halved until they can (``c <= 1`` leaves ``caps`` as they are, since
    ``cap_k <= n_k``), so the budget is conserved.

    Parameters
    ----------
    caps : sequence of int, length K
        The owners' caps before this one (e.g. capacity minus the uniform share), >= 0.
    sizes : sequence of int, length K
        The owners' sizes ``n_k`` (public: each owner's GetOwnerInfo ``num_points``), >= 0.
    divisor : float
        ``c > 0``.
    amount : int
        The targeted reads to place, >= 0.

    Returns
    -------
    ndarray of shape (K,), int64
        ``min(cap_k, ceil(n_k / c'))`` with ``c' = c / 2^j``, ``j >= 0`` the least for which the
        sum reaches ``min(amount, sum(caps))``.

    Raises
    ------
    ValueError
        If the lengths differ, a cap or size is negative, or ``divisor`` is not finite and > 0.

    Notes
    -----
    Privacy: a function of the owners' sizes, which every owner releases in the clear when it
    describes itself (and which the curator's capacities already read), of the public ``c`` and
    of the caps; applied to the released decision's weights by :func:`allocate_candidates`, it is
    post-processing of public values and of the decision, so it costs no privacy to anyone.
    """
    caps_arr = np.asarray(caps, dtype=np.int64)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    if caps_arr.shape != sizes_arr.shape or caps_arr.ndim != 1:
        raise ValueError(f"caps and sizes must be vectors of one length, got {caps_arr.shape}")
    if (caps_arr < 0).any() or (sizes_arr < 0).any():
        raise ValueError("caps and sizes must be >= 0")
    if not (math.isfinite(divisor) and divisor > 0):
        raise ValueError(f"divisor must be a finite number > 0, got {divisor}")
    need = min(int(amount), int(caps_arr.sum()))
    c = float(divisor)
    while True:
        out = np.minimum(caps_arr, np.ceil(sizes_arr / c).astype(np.int64))
        if int(out.sum()) >= need or c <= 1.0:
            return out
        c = max(1.0, c / 2.0)


def mass_read_caps(
    caps: Sequence[int], masses: ArrayLike, factor: float, amount: int
) -> NDArray[np.int64]:
    """Each owner's most targeted reads by its share of the owners' mass near D_v.

    Owner k may be asked for at most ``ceil(c * amount * M_k / sum_j M_j)`` targeted reads
    (and ``cap_k``): no owner gets more than ``c`` times its share of the mass, so a decision
    that sends most of the reads to one owner whose estimated mass near D_v is small (the
    sketch decision's vote counts density, not how much of the kind an owner holds: tv16-40 in
    docs/results.md, "A size cap on the targeted reads") gives the excess to the others
    (:func:`allocate_candidates` water-fills it by their weights). When the capped owners
    together cannot supply ``amount``, ``c`` is doubled until they can (the caps tend to
    ``caps`` as ``c`` grows), so the budget is read in full. With no positive mass, or when only
    owners of zero mass could supply the rest, the caps are ``caps`` unchanged.

    Parameters
    ----------
    caps : sequence of int, length K
        The owners' caps before this one (e.g. capacity minus the uniform share), >= 0.
    masses : array-like of shape (K,)
        ``M_k >= 0``, finite: each owner's mass near D_v, any common unit
        (:func:`dpmarket.common.summarization.sketch_allocation.sketch_masses`).
    factor : float
        ``c > 0``.
    amount : int
        The targeted reads to place, >= 0.

    Returns
    -------
    ndarray of shape (K,), int64
        ``min(cap_k, ceil(c' * amount * M_k / sum_j M_j))`` with ``c' = c 2^j``, ``j >= 0`` the
        least for which the sum reaches ``min(amount, sum(caps))``.

    Raises
    ------
    ValueError
        If the lengths differ, a cap is negative, a mass is negative or not finite, or
        ``factor`` is not finite and > 0.

    Notes
    -----
    Privacy: a function of public values (the caps, ``c``, ``amount``) and of ``masses``; when
    those are post-processing of releases already charged (as
    :func:`~dpmarket.common.summarization.sketch_allocation.sketch_masses` are), so are the caps,
    and the shares :func:`allocate_candidates` derives from them and the released decision.
    """
    caps_arr = np.asarray(caps, dtype=np.int64)
    mass = check_vector(masses, "masses").astype(np.float64)
    if caps_arr.shape != mass.shape or caps_arr.ndim != 1:
        raise ValueError(f"caps and masses must be vectors of one length, got {caps_arr.shape}")
    if (caps_arr < 0).any() or (mass < 0).any():
        raise ValueError("caps and masses must be >= 0")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor}")
    total = float(mass.sum())
    if total <= 0.0:
        return caps_arr
    need = min(int(amount), int(caps_arr.sum()))
    share = mass / total
    full = np.where(share > 0, caps_arr, 0)
    c = float(factor)
    while True:
        out = np.minimum(caps_arr, np.ceil(c * need * share)).astype(np.int64)
        if int(out.sum()) >= need:
            return out
        c *= 2.0
        if np.array_equal(out, full) or not math.isfinite(c * need):
            # Only owners without mass (or of a mass too small to count) can supply the rest.
            return caps_arr


def _water_fill(
    shares: NDArray[np.float64], weights: NDArray[np.float64], caps: NDArray[np.int64], amount: int
) -> NDArray[np.float64]:
    """Add ``amount`` to ``shares`` in proportion to ``weights``, never past ``caps``."""
    shares = shares.copy()
    remaining = float(amount)
    for _ in range(2 * shares.shape[0] + 2):
        open_ = (shares < caps) & (weights > 0)
        if remaining <= 1e-9 or not (shares < caps).any():
            break
        if not open_.any():  # only owners without weight have room left: split evenly
            weights = np.ones_like(weights)
            continue
        give = remaining * weights * open_ / weights[open_].sum()
        room = caps - shares
        give = np.minimum(give, room)
        shares += give
        remaining -= float(give.sum())
    return shares


def shrink_towards_points(
    noisy: ArrayLike,
    features: ArrayLike,
    noise_sigma: float,
    *,
    prior: ArrayLike | None = None,
    score_metric: bool = False,
) -> tuple[NDArray[np.float64], float, bool]:
    """Shrink a Gaussian-noised embedding towards a point set's own mean h1, or towards a public
    prior when the release lies nearer to that in the metric of the set's own scores.

    An owner proposing candidates scores its own points by ``g . h1(x)``; the error of those
    scores is measured by ``Sigma = mean_x h1(x) h1(x)^T`` over its points. Of the two priors,
    its own mean ``mu`` and a public ``prior`` (the seed set's mean h1), it takes the one with
    the smaller ``(noisy - pi)^T Sigma (noisy - pi)``: both distances carry the same expected
    noise, ``sigma^2 tr Sigma``, so the comparison is between the priors' distances to the
    validation embedding where the owner's scores see it. It then shrinks towards it by
    positive-part James-Stein (:func:`shrink_embedding`), whose factor charges the noise of all
    d directions: with a small validation set the proposal is a representative sample of the
    owner's points (or of those nearest the public prior), which the curator's exact re-ranking
    sorts; with a large one it follows the embedding. With ``score_metric`` the amount is read in
    the metric of the set's scores instead (:func:`shrink_in_score_metric`): the noise the scores
    see, not the noise of all d coordinates.

    Parameters
    ----------
    noisy : array-like of shape (d,)
        ``g + N(0, noise_sigma^2 I_d)``, the released embedding.
    features : array-like of shape (n, d)
        h1 features of the points (an owner's own), n >= 1.
    noise_sigma : float
        The release's noise per coordinate, > 0 (public).
    prior : array-like of shape (d,), optional
        A public embedding fixed before the release.
    score_metric : bool
        Shrink by :func:`shrink_in_score_metric` (False: :func:`shrink_embedding`).

    Returns
    -------
    shrunk : ndarray of shape (d,), float64
    alpha : float
        The James-Stein factor in [0, 1] (1: the release as is).
    public : bool
        Whether ``prior`` was the nearer (False without one).

    Raises
    ------
    ValueError
        If the shapes differ, a value is not finite, or ``noise_sigma`` is not a finite number
        > 0.

    Notes
    -----
    Privacy: a function of the release, the public ``noise_sigma`` and ``prior`` and the points'
    owner's own data; post-processing for the validation set, computed where the points are.
    """
    y = check_vector(noisy, "noisy embedding").astype(np.float64)
    x = np.asarray(features)
    if x.ndim != 2 or x.shape[1] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"features must have shape (n >= 1, {y.shape[0]}), got {getattr(x, 'shape', None)}"
        )
    mean = x.mean(axis=0, dtype=np.float64)
    second = np.zeros((x.shape[1], x.shape[1]), dtype=np.float64)
    if prior is not None or score_metric:
        for start in range(0, x.shape[0], _MOMENT_BLOCK):
            block = np.asarray(x[start : start + _MOMENT_BLOCK], dtype=np.float64)
            second += block.T @ block
        second /= x.shape[0]
    return shrink_towards_moments(
        y, mean, second, noise_sigma, prior=prior, score_metric=score_metric
    )


#: Rows whose h1 second moment :func:`shrink_towards_points` adds at once (in float64).
_MOMENT_BLOCK = 8192


def shrink_towards_moments(
    noisy: ArrayLike,
    mean: ArrayLike,
    second_moment: ArrayLike,
    noise_sigma: float,
    *,
    prior: ArrayLike | None = None,
    score_metric: bool = False,
) -> tuple[NDArray[np.float64], float, bool]:
    """:func:`shrink_towards_points` from the points' h1 moments instead of the points: for a
    table read partition by partition, whose moments are sums over partitions.

    Parameters
    ----------
    noisy : array-like of shape (d,)
        The released embedding.
    mean : array-like of shape (d,)
        ``mu = mean_x h1(x)`` over the points.
    second_moment : array-like of shape (d, d)
        ``Sigma = mean_x h1(x) h1(x)^T`` (uncentered), symmetric positive semi-definite; read
        only with a ``prior`` or ``score_metric``.
    noise_sigma : float
        The release's noise per coordinate, > 0 (public).
    prior : array-like of shape (d,), optional
        A public embedding fixed before the release.
    score_metric : bool
        As :func:`shrink_towards_points`.

    Returns
    -------
    shrunk, alpha, public
        As :func:`shrink_towards_points`.

    Raises
    ------
    ValueError
        If the shapes differ, a value is not finite, or ``noise_sigma`` is not a finite number
        > 0.
    """
    y = check_vector(noisy, "noisy embedding").astype(np.float64)
    mu = check_vector(mean, "mean", size=y.shape[0]).astype(np.float64)
    if not (math.isfinite(noise_sigma) and noise_sigma > 0):
        raise ValueError(f"noise_sigma must be a finite number > 0, got {noise_sigma}")
    public = False
    if prior is not None:
        g0 = check_vector(prior, "prior embedding", size=y.shape[0]).astype(np.float64)
        sigma = _check_second_moment(second_moment, y.shape[0])
        own, other = y - mu, y - g0
        if float(other @ sigma @ other) < float(own @ sigma @ own):
            mu, public = g0, True
    if score_metric:
        shrunk, alpha = shrink_in_score_metric(y, mu, second_moment, noise_sigma)
    else:
        shrunk, alpha = shrink_embedding(y, mu, noise_sigma)
    return shrunk, alpha, public
