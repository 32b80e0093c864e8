"""h2: the MWEM private mean of a set of h1 features (summarization paper, Algorithm 2).

The distribution ``P_t`` over ``S^d`` is kept in the product form of Lemma 1: ``d`` marginals over
the grid ``S``, i.e. a ``(d, |S|)`` array, never the ``|S|^d`` joint table. Only the marginal means
``w(P, i) = q * sum_s s P_i(s)`` enter the output, and they are linear in ``P``, so ``P_avg`` is
never materialised either: the release averages the ``T`` vectors of marginal means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.noise import NoiseSource, SeededNoise
from dpmarket.common.summarization.quantization import quantization_grid, quantize_features
from dpmarket.common.validation import check_epsilon, check_matrix, check_positive_int, check_vector

__all__ = ["MWEMRelease", "MWEMState", "h2_private_mean"]

# Sensitivity of w(D_Q, i) and of the score psi_i when one point is replaced (entries in [-1, 1]).
_SENSITIVITY = 2.0

_SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class MWEMRelease:
    """Output of one call of h2 (Algorithm 2) and what it cost.

    Attributes
    ----------
    embedding : ndarray of shape (d,), float64
        Private estimate of the *mean* of h1 over the set:
        ``sqrt(2/d) * w(P_avg, i) / q`` for ``i = 1..d``.
    selected : ndarray of shape (T,), int64
        The coordinate ``i(t)`` picked by the exponential mechanism at each iteration.
    measurements : ndarray of shape (T,), float64
        The noisy measurements ``mu_{i(t)} = w(D_Q, i(t)) + Lap(sensitivity / epsilon)``.
    epsilon : float
        Privacy parameter of *each* of the ``2 T`` mechanisms (``T`` exponential mechanisms and
        ``T`` Laplace measurements), in units of epsilon.
    iterations : int
        ``T``.
    sensitivity : float
        Sensitivity used to calibrate both mechanisms (2.0, see :class:`MWEMState`).
    """

    embedding: NDArray[np.float64]
    selected: NDArray[np.int64]
    measurements: NDArray[np.float64]
    epsilon: float
    iterations: int
    sensitivity: float


def _sample_softmax(logits: NDArray[np.float64], rng: np.random.Generator) -> int:
    """Draw index ``i`` with probability ``softmax(logits)_i`` using one uniform draw.

    Stable: the maximum logit is subtracted before exponentiating, so the largest weight is 1 and
    the normaliser lies in ``[1, len(logits)]``. The CDF is inverted at ``u * total``.
    """
    weights = np.exp(logits - logits.max())
    cdf = np.cumsum(weights)
    u = rng.random() * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), logits.shape[0] - 1)


def _normalise_log(row: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return ``row - logsumexp(row)`` computed stably."""
    top = row.max()
    return row - (top + math.log(float(np.exp(row - top).sum())))


class MWEMState:
    """Product-form MWEM distribution of h2, kept between calls for warm starts.

    Holds ``d`` marginal distributions over the grid ``S`` (Lemma 1), uniform at construction.
    :meth:`release` runs Algorithm 2 from the current marginals and leaves them at ``P_T``, so the
    next call continues from there (Section 4: the ``T_subs`` iterations of a later epoch continue
    from the previous distribution).

    Parameters
    ----------
    d : int
        Dimension of the h1 features (number of marginals), ``d >= 1``.
    eta : float
        Grid spacing, ``0 < eta <= 1`` with ``2 / eta`` an integer; ``|S| = 2 / eta + 1``.

    Raises
    ------
    ValueError
        If ``d < 1`` or ``eta`` is invalid.

    Notes
    -----
    **Privacy.** Neighbouring sets differ by *replacing* one point; the set size ``q`` is public.
    Quantization acts on each point independently, so (coupling the rounding coins of the other
    points) neighbouring inputs give quantized sets that differ in one row, whose entries lie in
    ``[-1, 1]``. Hence ``w(D_Q, i) = sum_j v_ji`` changes by at most ``Delta = 2`` for every
    ``i``, and so does the score ``psi_i = |w(P_{t-1}, i) - w(D_Q, i)|`` (``w(P_{t-1}, i)`` is a
    function of earlier releases only). Each iteration therefore runs

    * the exponential mechanism selecting ``i`` with probability
      ``∝ exp(epsilon * psi_i / (2 Delta))``: ``epsilon``-DP (McSherry & Talwar 2007), and
    * the Laplace mechanism ``w(D_Q, i(t)) + Lap(Delta / epsilon)``: ``epsilon``-DP,

    so one release with ``T`` iterations is the adaptive composition of ``2 T`` ``epsilon``-DP
    mechanisms; charge them to the ledger as such.

    This calibration deliberately deviates from the printed Algorithm 2, which samples with
    ``exp(epsilon psi_i)`` and adds ``Lap(1 / epsilon)``: with ``Delta = 2`` those are
    ``4 epsilon``-DP and ``2 epsilon``-DP, whereas the paper's privacy proof (Appendix D, proof of
    Theorem 6: "each of them is epsilon differentially private") assumes ``epsilon``-DP each. The
    cost is noise larger by a factor 2 (Laplace) and 4 (selection temperature).

    The marginals (and ``P_avg``) are deterministic functions of the released ``i(t)``,
    ``mu_{i(t)}`` and ``q``, so keeping them for a warm start is post-processing and costs no
    privacy; they hold nothing about the set that was not released.

    **Accuracy.** Theorem 4 (Hardt et al. 2012) carries over with the noise term scaled by
    ``Delta``: with probability ``>= 1 - 2T/d^c``,
    ``max_i |w(D_Q, i) - w(P_avg, i)| / q <= 2 sqrt(d ln|S| / T) + (3c + 2) Delta ln d / (q eps)``.

    **Noise.** The Laplace measurements come from :meth:`release`'s ``noise`` source: OpenDP's
    floating-point-safe sampler in production sessions
    (:class:`dpmarket.common.privacy.noise.OpenDPNoise`, hardened against the attacks of Mironov
    2012), seeded numpy draws from ``rng`` in tests and seeded sessions. The selection's uniform
    draw comes from ``rng`` (CSPRNG-seeded in production,
    :func:`dpmarket.common.privacy.rng.production_rng`); docs/how-it-works.md, "Privacy accounting".

    References
    ----------
    Summarization paper, Algorithm 2 and Lemma 1 (product form); Hardt, Ligett & McSherry (2012),
    MWEM.
    """

    def __init__(self, d: int, eta: float) -> None:
        self._d = check_positive_int(d, "d")
        self._grid = quantization_grid(eta)
        self._eta = 2.0 / (self._grid.shape[0] - 1)
        # Log-marginals, each row normalised (logsumexp == 0); uniform at the start.
        self._log_marginals = np.full(
            (self._d, self._grid.shape[0]), -math.log(self._grid.shape[0]), dtype=np.float64
        )
        # m[i] = sum_s s P_i(s), kept in step with the rows so that a warm start continues with
        # exactly the values a single longer call would have used; w(P, i) = q * m[i].
        self._means = np.array([float(np.exp(row) @ self._grid) for row in self._log_marginals])

    @property
    def d(self) -> int:
        """Number of coordinates (marginals)."""
        return self._d

    @property
    def eta(self) -> float:
        """Grid spacing (exactly ``2 / (|S| - 1)``)."""
        return self._eta

    @property
    def grid(self) -> NDArray[np.float64]:
        """The grid ``S``, shape ``(|S|,)`` float64 (a copy)."""
        return self._grid.copy()

    @property
    def marginals(self) -> NDArray[np.float64]:
        """Current marginals ``P_i(s)``, shape ``(d, |S|)`` float64, rows summing to 1 (a copy)."""
        p = np.exp(self._log_marginals)
        return p / p.sum(axis=1, keepdims=True)

    def release(
        self,
        quantized_sums: ArrayLike,
        q: int,
        iterations: int,
        epsilon: float,
        rng: np.random.Generator,
        noise: NoiseSource | None = None,
    ) -> MWEMRelease:
        """Run ``T`` MWEM iterations on the quantized sums and release the private mean.

        For ``t = 1..T``: score ``psi_i = |w(P_{t-1}, i) - w(D_Q, i)|``; select ``i(t)`` with
        probability ``∝ exp(epsilon psi_i / (2 Delta))``; measure
        ``mu = w(D_Q, i(t)) + Lap(Delta / epsilon)``; update the marginal of ``i(t)`` as
        ``P_t,i(s) ∝ P_{t-1,i}(s) exp(s (mu - w(P_{t-1}, i(t))) / (2 q))`` (in log space). The
        output is ``sqrt(2/d) w(P_avg, .) / q`` with ``P_avg = (1/T) sum_t P_t``.

        Parameters
        ----------
        quantized_sums : array-like of shape (d,)
            ``w(D_Q, i) = sum_j v_ji``, the column sums of the quantized set (sums of grid
            values), each with ``|w| <= q``.
        q : int
            Number of points in the set (public), ``q >= 1``.
        iterations : int
            ``T >= 1``.
        epsilon : float
            Privacy parameter of each of the ``2 T`` mechanisms, ``> 0``.
        rng : numpy.random.Generator
            Source of the selection and Laplace noise (two draws per iteration, always in the
            same order, so ``T = a + b`` in one call equals ``a`` then ``b`` on one state).
        noise : NoiseSource, optional
            Source of the Laplace noise instead (production: OpenDP's floating-point-safe sampler,
            :class:`dpmarket.common.privacy.noise.OpenDPNoise`); default ``SeededNoise(rng)``, the
            same draws as ``rng.laplace``.

        Returns
        -------
        MWEMRelease

        Raises
        ------
        ValueError
            If ``quantized_sums`` is not a finite vector of length ``d`` with ``|w_i| <= q``, or
            ``q``, ``iterations`` or ``epsilon`` is out of range. Nothing is changed then.

        Notes
        -----
        Privacy: ``2 T`` ``epsilon``-DP mechanisms with respect to replacing one point of the set
        (see the class Notes for the sensitivity ``Delta = 2`` and the deviation from the printed
        Algorithm 2). Memory is ``O(d |S|)`` and each iteration costs ``O(d + |S|)``.

        References
        ----------
        Summarization paper, Algorithm 2, steps 4-9; Lemma 1; Theorems 3 and 4.
        """
        q_int = check_positive_int(q, "q")
        t_total = check_positive_int(iterations, "iterations")
        eps = check_epsilon(epsilon)
        sums = check_vector(quantized_sums, "quantized_sums", size=self._d)
        too_big = np.abs(sums) > q_int * (1.0 + _SUM_TOLERANCE)
        if too_big.any():
            i = int(np.argmax(too_big))
            raise ValueError(
                f"quantized_sums must satisfy |w_i| <= q = {q_int} (sums of q values in [-1, 1]), "
                f"got w_{i} = {sums[i]}"
            )

        delta = _SENSITIVITY
        temperature = eps / (2.0 * delta)
        laplace_scale = delta / eps
        laplace = (noise if noise is not None else SeededNoise(rng)).laplace
        grid = self._grid
        log_marginals = self._log_marginals.copy()
        means = self._means.copy()  # only the updated row's mean changes per iteration
        mean_sum = np.zeros(self._d, dtype=np.float64)
        selected = np.empty(t_total, dtype=np.int64)
        measurements = np.empty(t_total, dtype=np.float64)

        for t in range(t_total):
            w_prev = q_int * means
            scores = np.abs(w_prev - sums)
            i = _sample_softmax(temperature * scores, rng)
            mu = float(sums[i] + laplace(laplace_scale, 1)[0])
            row = _normalise_log(log_marginals[i] + grid * ((mu - w_prev[i]) / (2.0 * q_int)))
            log_marginals[i] = row
            means[i] = float(np.exp(row) @ grid)
            mean_sum += means
            selected[t] = i
            measurements[t] = mu

        self._log_marginals = log_marginals
        self._means = means
        embedding = math.sqrt(2.0 / self._d) * (mean_sum / t_total)
        return MWEMRelease(
            embedding=embedding,
            selected=selected,
            measurements=measurements,
            epsilon=eps,
            iterations=t_total,
            sensitivity=delta,
        )


def h2_private_mean(
    features: ArrayLike,
    *,
    epsilon: float,
    iterations: int,
    eta: float,
    rng: np.random.Generator,
    state: MWEMState | None = None,
) -> MWEMRelease:
    """Compute h2: the MWEM private mean of a set of h1 features.

    Quantizes ``features`` (:func:`dpmarket.common.summarization.quantization.quantize_features`),
    sums the quantized columns and runs :meth:`MWEMState.release` from ``state`` (a fresh uniform
    state if ``None``).

    Parameters
    ----------
    features : array-like of shape (q, d)
        h1 features of the set, entries in ``[-sqrt(2/d), sqrt(2/d)]``; ``q >= 1``.
    epsilon : float
        Privacy parameter of each of the ``2 T`` mechanisms, ``> 0``.
    iterations : int
        ``T >= 1``.
    eta : float
        Grid spacing, ``0 < eta <= 1`` with ``2 / eta`` an integer. Must equal ``state.eta`` when
        a state is given.
    rng : numpy.random.Generator
        Source of the quantization coins, then of the MWEM noise.
    state : MWEMState, optional
        Warm-start state; advanced to ``P_T`` on return.

    Returns
    -------
    MWEMRelease
        ``embedding`` of shape (d,) estimates ``features.mean(axis=0)``.

    Raises
    ------
    ValueError
        If ``features`` is empty, not 2-D, non-finite or out of range; if ``epsilon``,
        ``iterations`` or ``eta`` is invalid; or if ``state`` has another ``d`` or ``eta``.

    Notes
    -----
    The release is ``2 T`` ``epsilon``-DP mechanisms with respect to replacing one point of the
    set (``q`` public); see :class:`MWEMState`.

    References
    ----------
    Summarization paper, Algorithm 2 and Appendix B.
    """
    x = check_matrix(features, "features")
    q, d = x.shape
    if state is None:
        state = MWEMState(d, eta)
    else:
        if state.d != d:
            raise ValueError(f"state has d={state.d} but features have d={d} columns")
        if quantization_grid(eta).shape != state.grid.shape:
            raise ValueError(f"state has eta={state.eta} but eta={eta} was given")
    check_positive_int(iterations, "iterations")
    check_epsilon(epsilon)
    quantized = quantize_features(features, eta, rng)
    sums = quantized.sum(axis=0)
    return state.release(sums, q, iterations, epsilon, rng)
