"""Noise sources: OpenDP's floating-point-safe samplers in production, seeded numpy in tests.

Every additive-noise mechanism of the protocols (MWEM's Laplace measurements, the Laplace counts
of the candidates method, the Gaussian validation embedding and tree nodes) draws its noise from
a :class:`NoiseSource`. :func:`noise_source` picks the implementation: :class:`OpenDPNoise` when no
seed is given (production), :class:`SeededNoise` on ``np.random.default_rng(seed)`` when one is
(tests and explicitly seeded, reproducible sessions).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = ["NoiseSource", "OpenDPNoise", "SeededNoise", "noise_source"]

#: Compiled OpenDP measurements kept per (kind, scale, size). A session uses a handful of
#: distinct triples (one Laplace scale for MWEM, one per count vector, one Gaussian sigma), so
#: the bound only matters for long-lived processes serving many sessions.
_MEASUREMENT_CACHE_SIZE = 256

_Kind = Literal["laplace", "gaussian"]


def _check_scale(value: float, name: str) -> float:
    """Return ``value`` as float if it is a finite real number > 0; raise ``ValueError``."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}") from None
    if not math.isfinite(out) or out <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def _check_size(size: int) -> int:
    """Return ``size`` as int if it is an integer (not bool) >= 1; raise ``ValueError``."""
    if isinstance(size, bool | np.bool_):
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    try:
        out = operator.index(size)
    except TypeError:
        raise ValueError(f"size must be an integer >= 1, got {size!r}") from None
    if out < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    return out


@runtime_checkable
class NoiseSource(Protocol):
    """Where additive noise comes from: i.i.d. Laplace or Gaussian vectors of a known length.

    Implementations validate their arguments identically: ``scale`` / ``sigma`` must be finite and
    ``> 0`` and ``size`` an integer ``>= 1``, else ``ValueError`` naming the value.
    """

    @property
    def seeded(self) -> bool:
        """Whether the draws are reproducible from a seed (``True`` only for test sources)."""
        ...

    def laplace(self, scale: float, size: int) -> NDArray[np.float64]:
        """Return ``size`` i.i.d. draws of Laplace(0, ``scale``).

        Parameters
        ----------
        scale : float
            Laplace scale ``b > 0`` (standard deviation ``b * sqrt(2)``), in the units of the
            query the noise is added to; ``b = sensitivity_1 / epsilon`` for epsilon-DP.
        size : int
            Number of draws, ``>= 1``.

        Returns
        -------
        ndarray of shape (size,), float64

        Raises
        ------
        ValueError
            If ``scale`` is not finite and ``> 0`` or ``size`` is not an integer ``>= 1``.
        """
        ...

    def gaussian(self, sigma: float, size: int) -> NDArray[np.float64]:
        """Return ``size`` i.i.d. draws of N(0, ``sigma**2``).

        Parameters
        ----------
        sigma : float
            Standard deviation ``> 0``, in the units of the query the noise is added to.
        size : int
            Number of draws, ``>= 1``.

        Returns
        -------
        ndarray of shape (size,), float64

        Raises
        ------
        ValueError
            If ``sigma`` is not finite and ``> 0`` or ``size`` is not an integer ``>= 1``.
        """
        ...


class SeededNoise:
    """numpy's Laplace and Gaussian samplers on an injected generator: for tests only.

    Draws exactly ``rng.laplace(0.0, scale, size=size)`` and ``rng.normal(0.0, sigma,
    size=size)``, so a seeded run that switches from calling ``rng`` directly to this class keeps
    its draws bit for bit (a scalar ``rng.laplace(0.0, b)`` equals ``rng.laplace(0.0, b,
    size=1)[0]`` and advances the generator alike).

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of every draw; shared with the caller, who may draw from it in between.

    Raises
    ------
    TypeError
        If ``rng`` is not a ``numpy.random.Generator``.

    Notes
    -----
    "Tests only" means: not for a release whose privacy matters. numpy's samplers compute
    Laplace and Gaussian variates in floating point from uniform doubles (e.g. a logarithm of a
    uniform), so the set of floats they can return is porous and depends on the value the noise
    is added to; Mironov (2012) shows that the low-order bits of such a noisy output can reveal
    the exact input, breaking the epsilon-DP guarantee however large the scale. A seed also makes
    the noise reproducible by anyone who knows it. Use this class in unit tests, statistical
    tests and explicitly seeded (reproducible) sessions, whose reports say they are seeded;
    production sessions use :class:`OpenDPNoise`.

    References
    ----------
    Mironov, "On significance of the least significant bits for differential privacy", ACM CCS
    2012.
    """

    __slots__ = ("rng",)

    def __init__(self, rng: np.random.Generator) -> None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self.rng = rng

    @property
    def seeded(self) -> bool:
        """Always ``True``: the draws are reproducible from the generator's seed."""
        return True

    def laplace(self, scale: float, size: int) -> NDArray[np.float64]:
        """Return ``rng.laplace(0.0, scale, size=size)``; see :meth:`NoiseSource.laplace`."""
        b = _check_scale(scale, "scale")
        n = _check_size(size)
        return self.rng.laplace(0.0, b, size=n)

    def gaussian(self, sigma: float, size: int) -> NDArray[np.float64]:
        """Return ``rng.normal(0.0, sigma, size=size)``; see :meth:`NoiseSource.gaussian`."""
        s = _check_scale(sigma, "sigma")
        n = _check_size(size)
        return self.rng.normal(0.0, s, size=n)

    def __repr__(self) -> str:
        return f"SeededNoise({self.rng!r})"


@functools.lru_cache(maxsize=_MEASUREMENT_CACHE_SIZE)
def _opendp_measurement(
    kind: _Kind, scale: float, size: int
) -> tuple[Callable[[list[float]], list[float]], list[float]]:
    """Build OpenDP's float-vector noise measurement and the zero input it is applied to.

    Returns the measurement (a callable ``list[float] -> list[float]``) and ``[0.0] * size``.
    Cached: building costs about a millisecond, a call on a short vector less than that.
    """
    import opendp.prelude as dp

    # The additive-noise constructors are gated behind "contrib" (not yet fully vetted by
    # OpenDP's process). Enabling it only allows constructors; it does not weaken the
    # samplers. "idealized-numerics" (formerly "floating-point") is deliberately not enabled: it
    # would admit constructors that ignore finite-precision effects, the very thing this module
    # avoids. enable_features is process-global and idempotent.
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    if kind == "laplace":
        measurement = dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)
    else:
        measurement = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    return measurement, [0.0] * size


class OpenDPNoise:
    """OpenDP's floating-point-safe Laplace and Gaussian samplers: the production noise source.

    Each call applies OpenDP's additive-noise measurement (``make_laplace`` on
    ``vector_domain(atom_domain(T=float, nan=False), size=size)`` with ``l1_distance``, or
    ``make_gaussian`` with ``l2_distance``) to a zero vector of length ``size`` and returns the
    result, which is the noise itself. Measurements are built once per (kind, scale, size) and
    cached (at most 256 in the process, least recently used evicted). OpenDP's privacy maps are not
    used: accounting stays with :mod:`dpmarket.common.privacy.accounting`, which is given the same
    ``scale`` / ``sigma``.

    Raises
    ------
    ValueError
        From :meth:`laplace` and :meth:`gaussian`, if ``scale`` / ``sigma`` is not finite and
        ``> 0`` or ``size`` is not an integer ``>= 1``.
    opendp.mod.OpenDPException
        If OpenDP fails to build a measurement or to sample, e.g. when the operating system has
        no entropy to give.
    RuntimeError
        If OpenDP returns a vector whose length is not ``size`` (a guard; not expected).

    Notes
    -----
    Floating-point safety. Textbook samplers, numpy's among them, compute a Laplace variate as
    ``b`` times the logarithm of a uniform double; the result takes only some float values,
    unevenly, and which values ``x + noise`` can take depends on ``x``, so an observer can tell
    neighbouring inputs apart with high probability however large ``b`` is (Mironov 2012).
    Gaussian samplers working in floating point have the same weakness.

    OpenDP instead, as its user guide states ("Additive Noise Mechanisms", section "Desideratum:
    Floating-Point Granularity"), converts the float input to an exact rational, adds integer
    noise from the discrete Laplace or discrete Gaussian distribution (Canonne, Kamath & Steinke
    2020) to the numerator, and rounds the exact result to the nearest float. By default the grid
    is ``2**-1074``, the spacing of subnormal float64, so "the privacy analysis is as tight as if
    you were to sample truly continuous noise and then postprocess by rounding to the nearest
    float"; ``make_laplace``'s documentation adds that "internally, all sampling is done using the
    discrete Laplace distribution". The default (finest) grid is used here; a coarser grid
    (OpenDP's ``k``) would be faster but adds the rounding distance to the sensitivity.

    What the guarantee covers. The noise returned here is the exact noise rounded once to
    float64, and the sampler's porosity that Mironov's attack exploits is gone. The caller then
    adds the noise to its value in float64 (``value + noise``): one more IEEE rounding, which
    OpenDP's proof does not cover (it rounds only the exact sum). A release that needs the proof
    end to end must pass the value itself through the measurement instead of zeros.

    Randomness. OpenDP cannot be seeded. Its samplers take random bits from its ``fill_bytes``,
    which in the PyPI builds (compiled with the ``use-openssl`` feature) is OpenSSL's
    ``RAND_bytes``: a CSPRNG that seeds itself from the operating system's entropy source and
    fails rather than return weak bytes. Draws are therefore not reproducible; tests of this class
    are distributional (Kolmogorov-Smirnov), not known-answer.

    Cost. Measured by ``python -m bench.noise`` (``bench/README.md``; 2 cores): about 0.1 ms per
    call plus 20 us per Laplace and 50 us per Gaussian value, 80 to 4,700 times numpy. That is
    0.17 s per MWEM session (1,656 scalar draws) and 7 ms for a d = 140 Gaussian vector, but
    19 s and 50 s per million values: measure before using it on large vectors. The first call
    of a process also imports OpenDP (about 0.8 s, loading its native library) and the first
    call per (kind, scale, size) builds the measurement (1 to 4 ms).

    Thread safety. The instance holds no state; the measurement cache is an ``lru_cache`` (two
    threads missing at once may each build the same measurement, which is harmless). OpenDP is
    called through ``ctypes.cdll``, which releases the GIL during the call, so threads sample in
    parallel; each call draws fresh bits from OpenSSL.

    References
    ----------
    Mironov, "On significance of the least significant bits for differential privacy", ACM CCS
    2012. Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy", NeurIPS
    2020. OpenDP Library 0.16, ``opendp.measurements.make_laplace`` and ``make_gaussian``.
    """

    __slots__ = ()

    @property
    def seeded(self) -> bool:
        """Always ``False``: the draws come from the operating system's entropy."""
        return False

    def laplace(self, scale: float, size: int) -> NDArray[np.float64]:
        """Return ``size`` i.i.d. Laplace(0, ``scale``) draws from OpenDP's sampler.

        See :meth:`NoiseSource.laplace` for parameters, shapes and errors.
        """
        return self._draw("laplace", _check_scale(scale, "scale"), _check_size(size))

    def gaussian(self, sigma: float, size: int) -> NDArray[np.float64]:
        """Return ``size`` i.i.d. N(0, ``sigma**2``) draws from OpenDP's sampler.

        See :meth:`NoiseSource.gaussian` for parameters, shapes and errors.
        """
        return self._draw("gaussian", _check_scale(sigma, "sigma"), _check_size(size))

    @staticmethod
    def _draw(kind: _Kind, scale: float, size: int) -> NDArray[np.float64]:
        measurement, zeros = _opendp_measurement(kind, scale, size)
        out = np.asarray(measurement(zeros), dtype=np.float64)
        if out.shape != (size,):
            raise RuntimeError(
                f"OpenDP returned {kind} noise of shape {out.shape}, expected ({size},)"
            )
        return out

    def __repr__(self) -> str:
        return "OpenDPNoise()"


def noise_source(seed: int | None) -> NoiseSource:
    """Return the noise source of a session: seeded numpy for ``seed``, OpenDP without one.

    Parameters
    ----------
    seed : int or None
        ``None`` in production: :class:`OpenDPNoise` (floating-point safe, OS entropy). An int ``>=
        0`` for tests and explicitly seeded sessions: :class:`SeededNoise` on
        ``np.random.default_rng(seed)`` (see its Notes: not for releases whose privacy matters).
        :func:`dpmarket.common.privacy.rng.make_rng` follows the same convention for the session's
        other randomness.

    Returns
    -------
    NoiseSource

    Raises
    ------
    ValueError
        If ``seed`` is negative or not an integer.
    """
    if seed is None:
        return OpenDPNoise()
    if isinstance(seed, bool | np.bool_):
        raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}")
    try:
        value = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}") from None
    if value < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return SeededNoise(np.random.default_rng(value))
