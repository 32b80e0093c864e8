"""Composition bounds for the privacy ledger: Theorem 7 (Kairouz et al.), advanced composition, PLD.

The ledger's mechanisms are pure ``epsilon_l``-DP (Laplace, exponential, generic pure) or the
Gaussian mechanism, which is ``(epsilon_l, delta_l)``-DP. :func:`kairouz_epsilon` and
:func:`advanced_composition_epsilon` compose pure mechanisms and return the total epsilon at a
slack ``delta_tilde`` (the composition is ``(epsilon, delta_tilde)``-DP);
:func:`kairouz_epsilon_delta` is Theorem 7 with ``delta_l > 0`` and also returns the total delta;
:func:`pld_epsilon` composes privacy loss distributions of all kinds of events exactly (up to a
pessimistic discretization) and returns the epsilon at a given total delta.

Zero-concentrated DP (zCDP, Bun & Steinke 2016) is the currency of the marginals sketch's
mechanisms (Gaussian measurements and exponential-mechanism selections compose by adding their
``rho``): :func:`gaussian_zcdp_rho` and :func:`exponential_zcdp_rho` give one run's ``rho``,
:func:`zcdp_delta` and :func:`zcdp_epsilon` convert a total ``rho`` to ``(epsilon, delta)``-DP
(Canonne, Kamath & Steinke 2020, the tight conversion) and :func:`zcdp_rho` is the largest
``rho`` whose conversion stays within a target ``(epsilon, delta)``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import ArrayLike

from dpmarket.common.validation import check_epsilon, check_positive_int

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

__all__ = [
    "PrivacyEvent",
    "advanced_composition_epsilon",
    "analytic_gaussian_sigma",
    "exponential_zcdp_rho",
    "gaussian_zcdp_rho",
    "kairouz_epsilon",
    "kairouz_epsilon_delta",
    "kairouz_epsilon_homogeneous",
    "load_pld_library",
    "pld_epsilon",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]

_MECHANISMS = ("laplace", "exponential", "pure", "gaussian", "approximate")
_CONSISTENCY_RTOL = 1e-9
# A gaussian event's sigma may fall short of the analytic-Gaussian sigma by this relative amount
# (floating-point slack for a sigma computed elsewhere, e.g. from the closed form).
_GAUSSIAN_SIGMA_RTOL = 1e-6
# Discretization of the PLD: at most this many intervals per smallest epsilon, and at least
# (total basic epsilon) / _PLD_MAX_BUCKETS per interval so that memory stays bounded.
_PLD_BUCKETS_PER_EPSILON = 100
_PLD_MAX_BUCKETS = 1_000_000
_PLD_MIN_MASS = 1e-30


@dataclass(frozen=True)
class PrivacyEvent:
    """One kind of mechanism, run ``count`` times, as charged to the ledger.

    Attributes
    ----------
    mechanism : {"laplace", "exponential", "pure", "gaussian", "approximate"}
        ``"laplace"``: additive Laplace noise of ``scale`` on a query of L1 ``sensitivity``;
        ``"exponential"``: the exponential mechanism calibrated to ``epsilon``-DP (e.g. MWEM's
        selection); ``"pure"``: any other ``epsilon``-DP mechanism (e.g. the pure PrivAuction's
        queries); ``"gaussian"``: additive Gaussian noise of standard deviation ``scale`` on a
        query of L2 ``sensitivity``, ``(epsilon, delta)``-DP; ``"approximate"``: any other
        ``(epsilon, delta)``-DP mechanism (e.g. the printed PrivAuction's bad iterations,
        ``(eps_auc, 1 - exp(-eps_auc))``-DP), accounted by its worst case.
    epsilon : float
        Privacy parameter of *one* run, ``> 0``. For ``"laplace"``, ``sensitivity / scale``; for
        ``"gaussian"``, the epsilon the noise was calibrated for (together with ``delta``).
    count : int
        Number of runs (adaptively composed), ``>= 1``.
    sensitivity : float, optional
        Sensitivity of the query: L1 for ``"laplace"``, L2 for ``"gaussian"`` (required there).
        For ``"laplace"`` it is filled in as ``epsilon * scale`` if omitted (or 1.0 if ``scale``
        is omitted too); for the pure mechanisms it is recorded only.
    scale : float, optional
        Noise scale: the Laplace scale ``b`` (filled in as ``sensitivity / epsilon`` if omitted)
        or the Gaussian standard deviation ``sigma`` (required). Not allowed for the other
        mechanisms.
    delta : float, default 0.0
        delta of *one* run. ``0 < delta < 1`` for ``"gaussian"`` and ``"approximate"``; must be
        0 for the pure mechanisms.

    Raises
    ------
    ValueError
        If ``mechanism`` is unknown, ``epsilon``, ``sensitivity`` or ``scale`` is not finite and
        ``> 0``, ``count < 1``, ``scale`` is given for an exponential or pure event, ``delta``
        is not 0 for a pure mechanism or not in ``(0, 1)`` for a Gaussian one, a Gaussian event
        lacks ``sensitivity`` or ``scale``, ``epsilon != sensitivity / scale`` (relative
        tolerance 1e-9) for a Laplace event, or a Gaussian event's ``scale`` does not give its
        ``(epsilon, delta)``.

    Notes
    -----
    A Gaussian event is consistent when the Gaussian mechanism with standard deviation
    ``scale * (1 + 1e-6)`` and L2 sensitivity ``sensitivity`` is ``(epsilon, delta)``-DP by
    the exact (analytic) privacy profile
    ``delta(eps) = Phi(D / (2 s) - eps s / D) - e^eps Phi(-D / (2 s) - eps s / D)``
    (``D = sensitivity``, ``s = sigma``), evaluated by ``dp_accounting``'s
    ``GaussianPrivacyLoss``; equivalently ``scale * (1 + 1e-6) >=``
    :func:`analytic_gaussian_sigma` ``(epsilon, delta, sensitivity)``. A larger sigma than
    needed is accepted (the stated ``(epsilon, delta)`` then holds with room to spare; the PLD
    accountant uses sigma itself and so is tighter). The neighbouring relation is the caller's:
    ``sensitivity`` is the largest change of the query between neighbouring data sets under
    that relation.

    References
    ----------
    Balle & Wang, "Improving the Gaussian mechanism for differential privacy: analytical
    calibration and optimal denoising", ICML 2018, Theorem 8.
    """

    mechanism: Literal["laplace", "exponential", "pure", "gaussian", "approximate"]
    epsilon: float
    count: int = 1
    sensitivity: float | None = None
    scale: float | None = None
    delta: float = 0.0

    def __post_init__(self) -> None:
        if self.mechanism not in _MECHANISMS:
            raise ValueError(f"mechanism must be one of {_MECHANISMS}, got {self.mechanism!r}")
        eps = check_epsilon(self.epsilon)
        count = check_positive_int(self.count, "count")
        sens = None if self.sensitivity is None else check_epsilon(self.sensitivity, "sensitivity")
        scale = None if self.scale is None else check_epsilon(self.scale, "scale")
        delta = float(self.delta)
        if self.mechanism == "gaussian":
            if sens is None or scale is None:
                raise ValueError(
                    "gaussian event needs its L2 sensitivity and its noise standard deviation "
                    f"(scale), got sensitivity={self.sensitivity}, scale={self.scale}"
                )
            if not (math.isfinite(delta) and 0.0 < delta < 1.0):
                raise ValueError(f"gaussian event: delta must lie in (0, 1), got {self.delta}")
            _check_gaussian_calibration(eps, delta, sens, scale)
        elif self.mechanism == "approximate":
            if not (math.isfinite(delta) and 0.0 < delta < 1.0):
                raise ValueError(f"approximate event: delta must lie in (0, 1), got {self.delta}")
            if scale is not None:
                raise ValueError(
                    f"scale is only meaningful for laplace and gaussian events, got scale={scale}"
                )
        else:
            if delta != 0.0:
                raise ValueError(
                    f"delta is only meaningful for gaussian and approximate events "
                    f"({self.mechanism} events are pure, delta = 0), got delta={self.delta}"
                )
            if self.mechanism == "laplace":
                if sens is None and scale is None:
                    sens = 1.0
                if scale is None:
                    assert sens is not None
                    scale = sens / eps
                elif sens is None:
                    sens = eps * scale
                implied = sens / scale
                if abs(implied - eps) > _CONSISTENCY_RTOL * eps:
                    raise ValueError(
                        f"laplace event: epsilon must equal sensitivity / scale = {sens} / "
                        f"{scale} = {implied}, got epsilon={self.epsilon}"
                    )
            elif scale is not None:
                raise ValueError(
                    f"scale is only meaningful for laplace and gaussian events, got scale={scale}"
                )
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "sensitivity", sens)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "delta", delta)


#: Held while ``dp_accounting`` is imported: its ``pld`` modules import one another, and two
#: threads importing two of them at once (an owner's start-up import beside its first request's)
#: can each take one module's import lock and need the other's, which Python's import system
#: resolves by handing one thread a partially initialized module (``AttributeError``,
#: ``_DeadlockError``). Every lazy import of it here goes through :func:`load_pld_library`.
_PLD_IMPORT_LOCK = threading.Lock()


def load_pld_library() -> None:
    """Import the parts of ``dp_accounting`` this module reads lazily (about 1 s of CPU, more
    on a loaded machine), so that a service can pay for them at start rather than in the first
    request whose cost they compute: an owner's first CAPE open under a curator's deadline.

    Safe to call from several threads at once (one imports, the others wait for it; later calls
    return at once); every function that imports ``dp_accounting`` calls it first."""
    with _PLD_IMPORT_LOCK:
        import dp_accounting.pld.accountant
        import dp_accounting.pld.common
        import dp_accounting.pld.privacy_loss_distribution
        import dp_accounting.pld.privacy_loss_mechanism  # noqa: F401


def _check_gaussian_calibration(
    epsilon: float, delta: float, sensitivity: float, sigma: float
) -> None:
    """Raise unless N(0, sigma^2) noise on an L2-``sensitivity`` query is (epsilon, delta)-DP."""
    load_pld_library()
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    achieved = GaussianPrivacyLoss(
        sigma * (1.0 + _GAUSSIAN_SIGMA_RTOL), sensitivity=sensitivity
    ).get_delta_for_epsilon(epsilon)
    if achieved > delta:
        needed = analytic_gaussian_sigma(epsilon, delta, sensitivity)
        raise ValueError(
            f"gaussian event: scale (sigma) = {sigma} with L2 sensitivity {sensitivity} is not "
            f"({epsilon}, {delta})-DP (it gives delta = {achieved:.6g} at that epsilon); the "
            f"analytic Gaussian mechanism needs sigma >= {needed:.10g}"
        )


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise standard deviation making the Gaussian mechanism ``(epsilon, delta)``-DP.

    The analytic Gaussian mechanism: the smallest ``sigma`` with
    ``Phi(D / (2 sigma) - epsilon sigma / D) - e^epsilon Phi(-D / (2 sigma) - epsilon sigma / D)
    <= delta`` (``D = sensitivity``), found by ``dp_accounting``'s
    ``get_smallest_gaussian_noise`` (binary search on the exact privacy profile).

    Parameters
    ----------
    epsilon : float
        Target epsilon, ``> 0``.
    delta : float
        Target delta, ``0 < delta < 1``.
    sensitivity : float, default 1.0
        L2 sensitivity of the query, ``> 0``, in the query's units.

    Returns
    -------
    float
        ``sigma``, in the query's units. The mechanism with this ``sigma`` is
        ``(epsilon, delta)``-DP (the search returns the upper end of its bracket), and ``sigma``
        exceeds the exact minimum by at most ``1e-7 * sensitivity``.

    Raises
    ------
    ValueError
        If ``epsilon`` or ``sensitivity`` is not finite and ``> 0``, or ``delta`` is not in
        ``(0, 1)``.

    Notes
    -----
    ``sigma`` is linear in the sensitivity, so the search runs at sensitivity 1 and the result
    is multiplied by ``sensitivity``: the search's absolute tolerance (1e-7) then is relative
    to the sensitivity, whatever its units. Unlike the classical ``sqrt(2 ln(1.25/delta)) D /
    epsilon``, the result is valid for every ``epsilon > 0`` and is never larger.

    References
    ----------
    Balle & Wang, "Improving the Gaussian mechanism for differential privacy: analytical
    calibration and optimal denoising", ICML 2018, Theorem 8 and Algorithm 1.
    """
    load_pld_library()
    from dp_accounting.pld.accountant import get_smallest_gaussian_noise
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    eps = check_epsilon(epsilon)
    dl = float(delta)
    if not (math.isfinite(dl) and 0.0 < dl < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    sens = check_epsilon(sensitivity, "sensitivity")
    sigma_unit = get_smallest_gaussian_noise(
        DifferentialPrivacyParameters(eps, dl), num_queries=1, sensitivity=1.0
    )
    return float(sigma_unit) * sens


def _check_delta_tilde(delta_tilde: float) -> float:
    d = float(delta_tilde)
    if not (math.isfinite(d) and 0.0 < d <= 1.0 / math.e):
        raise ValueError(f"delta_tilde must lie in (0, 1/e], got {delta_tilde}")
    return d


def _kairouz_from_groups(epsilons: np.ndarray, counts: np.ndarray, delta_tilde: float) -> float:
    """Theorem 7 for ``counts[j]`` mechanisms of privacy ``epsilons[j]`` each."""
    if epsilons.size == 0:
        return 0.0
    basic = float(np.sum(counts * epsilons))
    # (e^eps - 1) eps / (e^eps + 1) = eps * tanh(eps / 2), stable for small and large eps.
    drift = float(np.sum(counts * epsilons * np.tanh(epsilons / 2.0)))
    sum_sq = float(np.sum(counts * epsilons**2))
    second = drift + math.sqrt(2.0 * sum_sq * math.log(1.0 / delta_tilde))
    third = drift + math.sqrt(
        2.0 * sum_sq * math.log(math.e + math.sqrt(2.0 * sum_sq) / delta_tilde)
    )
    return min(basic, second, third)


def kairouz_epsilon(epsilons: Sequence[float] | ArrayLike, delta_tilde: float) -> float:
    """Total epsilon of the adaptive composition of pure-DP mechanisms, by Theorem 7.

    ``min{ sum e_l,
    sum e_l (e^e_l - 1)/(e^e_l + 1) + sqrt(sum 2 e_l^2 log(1/delta_tilde)),
    sum e_l (e^e_l - 1)/(e^e_l + 1) + sqrt(sum 2 e_l^2 log(e + sqrt(sum 2 e_l^2)/delta_tilde)) }``

    Parameters
    ----------
    epsilons : sequence or ndarray of shape (k,), float
        Privacy parameter of each mechanism, each ``> 0`` (``delta_l = 0``). Equal values are
        grouped, so long homogeneous lists cost ``O(k)`` vectorised work.
    delta_tilde : float
        Slack, ``0 < delta_tilde <= 1/e``.

    Returns
    -------
    float
        ``epsilon_tilde``: the composition is ``(epsilon_tilde, delta_tilde)``-DP. 0.0 when
        ``epsilons`` is empty.

    Raises
    ------
    ValueError
        If ``epsilons`` is not 1-D or holds a value that is not finite and ``> 0``, or if
        ``delta_tilde`` is outside ``(0, 1/e]``.

    Notes
    -----
    The third expression is implemented as quoted in the paper's appendix, with
    ``sqrt(sum 2 e_l^2)`` inside the logarithm. Kairouz, Oh & Viswanath (2017, Theorem 3.5) have
    ``sqrt(sum e_l^2)`` there, which is smaller; the quoted form is therefore a (slightly) larger
    epsilon and just as sound. The expressions are evaluated with
    ``(e^x - 1)/(e^x + 1) = tanh(x/2)``.

    References
    ----------
    Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath, "The composition theorem
    for differential privacy", IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.5.
    """
    dt = _check_delta_tilde(delta_tilde)
    arr = np.asarray(epsilons, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"epsilons must be a 1-D sequence, got shape {arr.shape}")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"every epsilon must be finite and > 0, got epsilons[{j}] = {arr[j]}")
    values, counts = np.unique(arr, return_counts=True)
    return _kairouz_from_groups(values, counts.astype(np.float64), dt)


def kairouz_epsilon_homogeneous(epsilon: float, k: int, delta_tilde: float) -> float:
    """Theorem 7 for ``k`` mechanisms that are each ``epsilon``-DP; ``O(1)`` work.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon, ``> 0``.
    k : int
        Number of mechanisms, ``>= 1``.
    delta_tilde : float
        Slack, ``0 < delta_tilde <= 1/e``.

    Returns
    -------
    float
        Equal to ``kairouz_epsilon([epsilon] * k, delta_tilde)``.

    Raises
    ------
    ValueError
        If ``epsilon <= 0``, ``k < 1`` or ``delta_tilde`` is outside ``(0, 1/e]``.

    References
    ----------
    Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath (2017).
    """
    eps = check_epsilon(epsilon)
    count = check_positive_int(k, "k")
    dt = _check_delta_tilde(delta_tilde)
    return _kairouz_from_groups(np.array([eps]), np.array([float(count)]), dt)


def _total_delta(deltas: np.ndarray, counts: np.ndarray, delta_tilde: float) -> float:
    """``1 - (1 - delta_tilde) prod_j (1 - deltas[j])^counts[j]``, computed in log space."""
    log_keep = math.log1p(-delta_tilde) + float(np.sum(counts * np.log1p(-deltas)))
    return float(-math.expm1(log_keep))


def kairouz_epsilon_delta(
    epsilons: Sequence[float] | ArrayLike,
    deltas: Sequence[float] | ArrayLike,
    delta_tilde: float,
    *,
    counts: Sequence[int] | ArrayLike | None = None,
) -> tuple[float, float]:
    """Theorem 7 for ``(epsilon_l, delta_l)``-DP mechanisms: the total epsilon *and* delta.

    The epsilon is the expression of :func:`kairouz_epsilon` evaluated on the ``epsilon_l``;
    the composition is ``(epsilon_tilde, 1 - (1 - delta_tilde) prod_l (1 - delta_l))``-DP.

    Parameters
    ----------
    epsilons : sequence or ndarray of shape (k,), float
        epsilon of each mechanism (or group of mechanisms, see ``counts``), each ``> 0``.
    deltas : sequence or ndarray of shape (k,), float
        delta of each mechanism, each in ``[0, 1)``; 0 for pure mechanisms.
    delta_tilde : float
        Slack, ``0 < delta_tilde <= 1/e``.
    counts : sequence or ndarray of shape (k,), int, optional
        Number of runs of each ``(epsilon_l, delta_l)`` mechanism, each ``>= 1`` (default: 1
        each), so a group of ``n`` identical runs costs ``O(1)``.

    Returns
    -------
    epsilon : float
        ``epsilon_tilde``; 0.0 when ``epsilons`` is empty.
    total_delta : float
        ``1 - (1 - delta_tilde) prod_l (1 - delta_l)^count_l``, in ``[delta_tilde, 1)``; equal
        to ``delta_tilde`` when every ``delta_l`` is 0 (then ``epsilon`` equals
        :func:`kairouz_epsilon` of the flattened epsilons) or ``epsilons`` is empty.

    Raises
    ------
    ValueError
        If ``epsilons``, ``deltas`` or ``counts`` is not 1-D or their lengths differ, an
        epsilon is not finite and ``> 0``, a delta is not in ``[0, 1)``, a count is not an
        integer ``>= 1``, or ``delta_tilde`` is outside ``(0, 1/e]``.

    Notes
    -----
    Kairouz, Oh & Viswanath (2017, Theorem 3.5) state the heterogeneous bound for
    ``(epsilon_l, delta_l)``-DP mechanisms with this total delta; the summarization paper quotes
    it as Theorem 7 (with ``sqrt(sum 2 e_l^2)`` inside the third logarithm, see
    :func:`kairouz_epsilon`). A Gaussian mechanism enters as the ``(epsilon_l, delta_l)`` it was
    calibrated for; this is loose (one point of its privacy profile stands for the whole
    curve), which is why :func:`pld_epsilon` is reported beside it.

    References
    ----------
    Summarization paper, Appendix D, Theorem 7; Kairouz, Oh & Viswanath, "The composition theorem
    for differential privacy", IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.5.
    """
    dt = _check_delta_tilde(delta_tilde)
    eps = np.asarray(epsilons, dtype=np.float64)
    dls = np.asarray(deltas, dtype=np.float64)
    if eps.ndim != 1:
        raise ValueError(f"epsilons must be a 1-D sequence, got shape {eps.shape}")
    if dls.shape != eps.shape:
        raise ValueError(
            f"deltas must have the shape of epsilons {eps.shape}, got shape {dls.shape}"
        )
    if counts is None:
        cnt = np.ones(eps.shape, dtype=np.float64)
    else:
        raw = np.asarray(counts)
        if raw.shape != eps.shape:
            raise ValueError(
                f"counts must have the shape of epsilons {eps.shape}, got shape {raw.shape}"
            )
        cnt = raw.astype(np.float64)
        bad_c = ~(np.isfinite(cnt) & (cnt >= 1) & (cnt == np.round(cnt)))
        if bad_c.any():
            j = int(np.argmax(bad_c))
            raise ValueError(f"every count must be an integer >= 1, got counts[{j}] = {raw[j]}")
    bad = ~(np.isfinite(eps) & (eps > 0))
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"every epsilon must be finite and > 0, got epsilons[{j}] = {eps[j]}")
    bad_d = ~(np.isfinite(dls) & (dls >= 0) & (dls < 1))
    if bad_d.any():
        j = int(np.argmax(bad_d))
        raise ValueError(f"every delta must lie in [0, 1), got deltas[{j}] = {dls[j]}")
    return _kairouz_from_groups(eps, cnt, dt), _total_delta(dls, cnt, dt)


def advanced_composition_epsilon(epsilon: float, k: int, delta_tilde: float) -> float:
    """Advanced composition: ``epsilon sqrt(2 k ln(1/delta_tilde)) + k epsilon (e^epsilon - 1)``.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon, ``> 0``.
    k : int
        Number of adaptively composed ``epsilon``-DP mechanisms, ``>= 1``.
    delta_tilde : float
        Slack, ``0 < delta_tilde < 1``.

    Returns
    -------
    float
        The composition is ``(result, delta_tilde)``-DP.

    Raises
    ------
    ValueError
        If ``epsilon <= 0``, ``k < 1`` or ``delta_tilde`` is outside ``(0, 1)``.

    Notes
    -----
    The summarization paper's Section 4 numbers come from this bound with *one* ``epsilon``-DP
    mechanism per MWEM iteration: ``advanced_composition_epsilon(0.01, 1656, 0.01) = 1.40`` and
    ``advanced_composition_epsilon(0.01 / sqrt(5 p), 5 p, 1e-4) = 0.043`` for every ``p``.

    References
    ----------
    Dwork, Rothblum & Vadhan, "Boosting and differential privacy", FOCS 2010, Theorem III.3;
    Dwork & Roth (2014), Theorem 3.20.
    """
    eps = check_epsilon(epsilon)
    count = check_positive_int(k, "k")
    dt = float(delta_tilde)
    if not (math.isfinite(dt) and 0.0 < dt < 1.0):
        raise ValueError(f"delta_tilde must lie in (0, 1), got {delta_tilde}")
    if eps > 700.0:  # e^eps overflows a float: the bound is vacuous anyway
        return math.inf
    return eps * math.sqrt(2.0 * count * math.log(1.0 / dt)) + count * eps * math.expm1(eps)


def _group_pld(event: PrivacyEvent, count: int, interval: float) -> PrivacyLossDistribution:
    """PLD of ``count`` adaptive runs of ``event`` (dp_accounting is imported lazily: ~0.6 s).

    Laplace: ``from_laplace_mechanism`` (connect-the-dots discretization) then ``self_compose``.
    Gaussian: ``from_gaussian_mechanism`` (connect-the-dots) then ``self_compose``.
    Pure / exponential: the exact ``count``-fold composition of the worst-case pure-epsilon pair
    (randomized response), built from its binomial law and rounded up to the grid *once*.
    Approximate ``(epsilon, delta)``: the worst-case pair of an ``(epsilon, delta)``-DP mechanism
    (Kairouz, Oh & Viswanath 2015, Theorem 2.1), whose privacy loss is ``+inf`` with probability
    ``delta`` and otherwise that of randomized response: the ``count``-fold composition has
    infinite loss with probability ``1 - (1 - delta)**count`` and the pure binomial law scaled by
    ``(1 - delta)**count`` elsewhere.
    ``from_privacy_parameters(...).self_compose(count)`` would instead round ``-epsilon`` up a
    bucket in every run; with ``epsilon = 0.01`` and an interval of ``epsilon / 100`` that
    doubles the mean privacy loss (``~epsilon^2 / 2`` per run) and overstates the epsilon of
    1656 runs by 11%.
    """
    load_pld_library()
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from scipy.special import expit
    from scipy.stats import binom

    if event.mechanism == "laplace":
        assert event.scale is not None and event.sensitivity is not None
        single = pld_lib.from_laplace_mechanism(
            parameter=event.scale,
            sensitivity=event.sensitivity,
            value_discretization_interval=interval,
        )
        return single.self_compose(count) if count > 1 else single

    if event.mechanism == "gaussian":
        assert event.scale is not None and event.sensitivity is not None
        single = pld_lib.from_gaussian_mechanism(
            standard_deviation=event.scale,
            sensitivity=event.sensitivity,
            value_discretization_interval=interval,
        )
        return single.self_compose(count) if count > 1 else single

    eps = event.epsilon
    # Under the first distribution each run has loss +eps w.p. e^eps / (1 + e^eps) and -eps
    # w.p. 1 / (1 + e^eps); with n_neg ~ Binomial(count, 1 / (1 + e^eps)) negative runs the
    # composed loss is eps * (count - 2 n_neg).
    n_neg = np.arange(count + 1)
    pmf = binom.pmf(n_neg, count, expit(-eps))
    infinite = 0.0
    if event.mechanism == "approximate":
        # log1p/expm1 keep (1 - delta)^count accurate for small delta.
        finite = math.exp(count * math.log1p(-event.delta))
        infinite = -math.expm1(count * math.log1p(-event.delta))
        pmf = pmf * finite
    keep = pmf > _PLD_MIN_MASS
    # Dropped mass goes to infinite loss: pessimistic, and at most count * 1e-30 in total.
    dropped = float(pmf[~keep].sum()) + infinite
    indices = np.ceil(eps * (count - 2 * n_neg[keep]) / interval).astype(np.int64)
    rounded: dict[int, float] = {}
    for index, mass in zip(indices.tolist(), pmf[keep].tolist(), strict=True):
        rounded[index] = rounded.get(index, 0.0) + mass
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        rounded, dropped, interval
    )


def _loss_scale(event: PrivacyEvent) -> float:
    """Per-run scale of the privacy loss: epsilon (pure), sensitivity / sigma (Gaussian)."""
    if event.mechanism == "gaussian":
        assert event.scale is not None and event.sensitivity is not None
        return event.sensitivity / event.scale
    return event.epsilon


def _sort_key(event: PrivacyEvent) -> tuple[str, float, float, float, float]:
    return (
        event.mechanism,
        event.epsilon,
        event.delta,
        event.sensitivity or 0.0,
        event.scale or 0.0,
    )


#: Per-event epsilon above which pld_epsilon reports inf instead of composing.
_PLD_EPSILON_CAP = 30.0


def pld_epsilon(
    events: Sequence[PrivacyEvent],
    delta: float,
    *,
    value_discretization_interval: float | None = None,
) -> float:
    """Total epsilon at ``delta`` by composing privacy loss distributions (``dp_accounting``).

    PLDs are built and composed directly (no ``PLDAccountant``). Identical events are merged and
    each group of ``count`` runs becomes one PLD: for Laplace events
    ``from_laplace_mechanism(parameter=scale, sensitivity=sensitivity).self_compose(count)``; for
    Gaussian events ``from_gaussian_mechanism(standard_deviation=scale,
    sensitivity=sensitivity).self_compose(count)`` (the exact privacy loss of the noise actually
    added, not the ``(epsilon, delta)`` it was calibrated for); for exponential and generic pure
    events the exact ``count``-fold composition of the worst-case
    pure-``epsilon`` pair (the PLD that ``from_privacy_parameters(epsilon, 0)`` describes),
    rounded to the grid once. Groups are combined with ``compose`` and the answer is
    ``get_epsilon_for_delta(delta)``.

    Parameters
    ----------
    events : sequence of PrivacyEvent
        Adaptively composed events. Identical events are merged (their counts add).
    delta : float
        Target delta, ``0 < delta < 1``.
    value_discretization_interval : float, optional
        Discretization of the privacy loss. Default: ``max(scale_min / 100 * (1 + 1e-9),
        sum(count * eps) / 1e6)``, where ``scale_min`` is the smallest per-run loss scale:
        ``epsilon`` for pure events and ``sensitivity / sigma`` (the standard deviation of the
        Gaussian privacy loss) for Gaussian ones. Without Gaussian events ``scale_min`` is the
        smallest epsilon; the ``1 + 1e-9`` then makes ``+eps_min`` fall just inside a whole
        number of intervals so that the upward rounding does not push it up a bucket. The second
        term bounds memory.

    Returns
    -------
    float
        The composition is ``(result, delta)``-DP, ``delta`` being the *total* delta (Gaussian
        events included); 0.0 when ``events`` is empty.

    Raises
    ------
    ValueError
        If ``delta`` is outside ``(0, 1)``, an element is not a :class:`PrivacyEvent`, or the
        interval is not finite and ``> 0``.

    Notes
    -----
    The PLD is pessimistic (losses rounded up to the grid), so the result is an upper bound on
    the exact epsilon of the composition. Pure groups are rounded once, so they add at most one
    interval each; ``self_compose`` of a once-rounded pure PLD would add up to one interval *per
    run* to the mean loss, which for small epsilon is of the order of the loss itself (measured:
    +11% for 1656 runs at epsilon 0.01). ``PLDAccountant`` is not used: in dp-accounting 0.6 it
    ignores the repeat count of a ``SelfComposedDpEvent`` wrapping a ``RandomizedResponseDpEvent``
    (docs/how-it-works.md, Composition). Composition of these PLDs is valid under adaptive
    composition because each is a dominating pair for its mechanism (every ``epsilon``-DP
    mechanism is dominated by randomized response). For the exponential mechanism the generic
    pure-DP PLD is sound but not tight. The Gaussian PLD is that of ``N(0, sigma^2)`` versus
    ``N(sensitivity, sigma^2)``, a dominating pair for any query whose L2 change between
    neighbouring data sets (under the caller's relation) is at most ``sensitivity``; it is
    symmetric, so add/remove and replace-one relations give the same PLD for the same
    sensitivity.

    References
    ----------
    Meiser & Mohammadi, "Tight on budget?", CCS 2018; Koskela, Jälkö & Honkela, AISTATS 2020;
    Doroshenko et al., "Connect the dots", PETS 2022 (the ``dp_accounting`` PLD implementation).
    """
    dl = float(delta)
    if not (math.isfinite(dl) and 0.0 < dl < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    grouped: Counter[PrivacyEvent] = Counter()
    for j, event in enumerate(events):
        if not isinstance(event, PrivacyEvent):
            raise ValueError(f"events[{j}] must be a PrivacyEvent, got {type(event).__name__}")
        grouped[replace(event, count=1)] += event.count
    if not grouped:
        return 0.0
    if max(e.epsilon for e in grouped) > _PLD_EPSILON_CAP:
        # The PLD library overflows (e^eps) long before this; the guarantee is vacuous anyway.
        return math.inf
    if value_discretization_interval is None:
        scale_min = min(_loss_scale(e) for e in grouped)
        total = sum(e.epsilon * n for e, n in grouped.items())
        interval = max(
            scale_min / _PLD_BUCKETS_PER_EPSILON * (1.0 + 1e-9), total / _PLD_MAX_BUCKETS
        )
    else:
        interval = check_epsilon(value_discretization_interval, "value_discretization_interval")

    composed: PrivacyLossDistribution | None = None
    for event, count in sorted(grouped.items(), key=lambda kv: _sort_key(kv[0])):
        pld = _group_pld(event, count, interval)
        composed = pld if composed is None else composed.compose(pld)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(dl))


# ------------------------------------------------------------------------------------ zCDP
#: Bisection steps of the zCDP conversions: each halves the bracket, so 100 steps reach the
#: float64 resolution of any epsilon below 1e6.
_ZCDP_BISECTION_STEPS = 100


def _bisect(holds: Callable[[float], bool], low: float, high: float, *, holds_above: bool) -> float:
    """The end of ``[low, high]`` where a monotone ``holds`` is true, after
    :data:`_ZCDP_BISECTION_STEPS` halvings: the smallest value found true if it holds above
    the threshold, the largest otherwise (so the result always satisfies it)."""
    for _ in range(_ZCDP_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if holds(mid) == holds_above:
            high = mid
        else:
            low = mid
    return high if holds_above else low


def _check_rho(rho: float) -> float:
    value = float(rho)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"rho must be a finite number >= 0, got {rho}")
    return value


def gaussian_zcdp_rho(sigma: float, sensitivity: float = 1.0) -> float:
    """``rho`` of the Gaussian mechanism: ``sensitivity^2 / (2 sigma^2)``.

    Parameters
    ----------
    sigma : float
        Noise standard deviation, ``> 0``, in the query's units.
    sensitivity : float, default 1.0
        L2 sensitivity of the query, ``> 0``, in the same units.

    Returns
    -------
    float
        The mechanism is ``rho``-zCDP.

    Raises
    ------
    ValueError
        If ``sigma`` or ``sensitivity`` is not finite and ``> 0``.

    Notes
    -----
    The Renyi divergence of order ``alpha`` between ``N(mu, sigma^2 I)`` and
    ``N(mu', sigma^2 I)`` is ``alpha ||mu - mu'||^2 / (2 sigma^2)``, at most ``alpha rho`` with
    the ``rho`` above for queries whose L2 change is at most ``sensitivity``.

    References
    ----------
    Bun & Steinke, "Concentrated differential privacy: simplifications, extensions, and lower
    bounds", TCC 2016, Proposition 1.6.
    """
    s = check_epsilon(sigma, "sigma")
    d = check_epsilon(sensitivity, "sensitivity")
    return d * d / (2.0 * s * s)


def exponential_zcdp_rho(epsilon: float) -> float:
    """``rho`` of the exponential mechanism run at ``epsilon``: ``epsilon^2 / 8``.

    Parameters
    ----------
    epsilon : float
        The exponential mechanism's parameter, ``> 0``: candidates drawn with probability
        proportional to ``exp(epsilon q / (2 Delta))`` for scores of sensitivity ``Delta``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``epsilon`` is not finite and ``> 0``.

    Notes
    -----
    The exponential mechanism is ``epsilon``-bounded-range, and an ``epsilon``-bounded-range
    mechanism is ``epsilon^2 / 8``-zCDP (tighter than the ``epsilon^2 / 2`` of a generic
    ``epsilon``-DP mechanism).

    References
    ----------
    Cesar & Rogers, "Bounding, concentrating, and truncating: unifying privacy loss composition
    for data analytics", ALT 2021, Lemma 3.2; McKenna et al., AIM (VLDB 2022), Section 3.
    """
    eps = check_epsilon(epsilon)
    return eps * eps / 8.0


def zcdp_delta(rho: float, epsilon: float) -> float:
    """delta of the ``(epsilon, delta)``-DP guarantee a ``rho``-zCDP mechanism has.

    ``delta = inf_{alpha > 1} exp((alpha - 1)(alpha rho - epsilon)) / (alpha - 1)
    * (1 - 1/alpha)^alpha``, minimised numerically over ``alpha`` (any ``alpha`` gives a valid
    bound, so an inexact minimiser only loosens it).

    Parameters
    ----------
    rho : float
        ``>= 0``.
    epsilon : float
        ``>= 0``.

    Returns
    -------
    float
        In ``[0, 1]``; 0 for ``rho = 0``.

    Raises
    ------
    ValueError
        If ``rho`` or ``epsilon`` is negative or not finite.

    References
    ----------
    Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020,
    Proposition 12 / Corollary 13 (the conversion AIM and MST use).
    """
    r = _check_rho(rho)
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")
    if r == 0.0:
        return 0.0
    from scipy.optimize import minimize_scalar

    def log_delta(alpha: float) -> float:
        return (
            (alpha - 1.0) * (alpha * r - eps)
            + alpha * math.log1p(-1.0 / alpha)
            - math.log(alpha - 1.0)
        )

    # The minimiser is at least (1 + eps / rho) / 2 and at most (eps + 1) / (2 rho) + 2.
    high = (eps + 1.0) / (2.0 * r) + 2.0
    found = minimize_scalar(
        log_delta, bounds=(1.0 + 1e-9, high), method="bounded", options={"xatol": 1e-12}
    )
    return min(1.0, math.exp(min(float(found.fun), log_delta(high))))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest epsilon with :func:`zcdp_delta` ``(rho, epsilon) <= delta`` (upper side of a
    bisection: the result is always a valid epsilon).

    Parameters
    ----------
    rho : float
        ``>= 0``.
    delta : float
        ``0 < delta < 1``.

    Returns
    -------
    float
        A ``rho``-zCDP mechanism is ``(result, delta)``-DP. Never larger than the classical
        ``rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke 2016, Proposition 1.3).

    Raises
    ------
    ValueError
        If ``rho`` is negative or ``delta`` outside ``(0, 1)``.
    """
    r = _check_rho(rho)
    dl = float(delta)
    if not (math.isfinite(dl) and 0.0 < dl < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if r == 0.0:
        return 0.0
    high = r + 2.0 * math.sqrt(r * math.log(1.0 / dl))
    return _bisect(lambda e: zcdp_delta(r, e) <= dl, 0.0, high, holds_above=True)


@functools.lru_cache(maxsize=256)
def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose zCDP guarantee implies ``(epsilon, delta)``-DP (lower side of a
    bisection: the result never overspends).

    Parameters
    ----------
    epsilon : float
        ``> 0``.
    delta : float
        ``0 < delta < 1``.

    Returns
    -------
    float
        ``rho > 0`` with ``zcdp_delta(rho, epsilon) <= delta``; e.g. 0.02436 at ``(1, 1e-6)``.

    Raises
    ------
    ValueError
        If ``epsilon`` is not finite and ``> 0`` or ``delta`` is outside ``(0, 1)``.

    Notes
    -----
    The conversion is the tight one of Canonne, Kamath & Steinke (2020): a budget in
    ``(epsilon, delta)`` becomes a zCDP budget ``rho`` that mechanisms built from Gaussian
    measurements and exponential-mechanism selections split by adding their ``rho``
    (:func:`gaussian_zcdp_rho`, :func:`exponential_zcdp_rho`). The ledger then records the
    ``(epsilon, delta)`` the whole release was calibrated for.
    """
    eps = check_epsilon(epsilon)
    dl = float(delta)
    if not (math.isfinite(dl) and 0.0 < dl < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return _bisect(lambda r: zcdp_delta(r, eps) <= dl, 0.0, eps + 1.0, holds_above=False)
