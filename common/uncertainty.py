"""One model of an answer's uncertainty, for every number a consumer reads.

``explore`` (every query kind, every sketch kind), ``rank-owners`` and the CAPE jobs (mean,
linreg, logreg, the network) state each value the same way, in their tables and their ``--json``
rows (:func:`interval_row`):

==================  ===============================================================================
``value``           the estimate (cut to what the quantity can be; ``raw``, where present, is the
                    estimate before the cut)
``standard_error``  its standard deviation over the release's noise (``null``: none computed)
``interval``        ``[low, high]`` at ``level`` (``null``: no interval can be stated)
``level``           the interval's nominal coverage, 0.95
``basis``           what the interval covers, one of :data:`BASES`
``covers``          one line: how the interval was built and what it covers
``bias_bound``      half-width of the bound on the estimator's bias inside the interval (``null``:
                    there is none, because the estimator is unbiased or because its bias is not
                    bounded; a flag on the interval says which)
``flags``           a list of :class:`Flag` as ``{"code", "on", "reason"}``: ``on = "value"`` when
                    the value needs care but its interval still means what it says (a model's
                    guess, a sign the noise could have given, a clipped value), ``on =
                    "interval"`` when the interval cannot be trusted to cover what ``basis`` says
==================  ===============================================================================

An interval is *trusted* when it exists and no flag is on it (:func:`trusted`): those are the
intervals whose coverage the project measures against its nominal rate, and the ones
:func:`dpmarket.consumer.explore.choose_source` compares.

One rule cuts a value's interval to what the value can be and flags a wide one, for every
producer that knows its quantities' bounds (``explore``, ``rank-owners``, the CAPE mean):
:func:`cut_keeping_noise` and :func:`uninformative_flag`.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BASES",
    "LEVEL",
    "UNINFORMATIVE",
    "Basis",
    "Flag",
    "On",
    "cut_keeping_noise",
    "interval_row",
    "interval_text",
    "outward",
    "trusted",
    "uninformative_flag",
]

#: Nominal coverage of every interval a consumer reads.
LEVEL = 0.95

#: The share of its possible range above which an interval is flagged ``uninformative``.
UNINFORMATIVE = 0.5

On = Literal["value", "interval"]
Basis = Literal["noise", "noise+bias", "measured", "bounds", "public", "none"]

#: What an interval covers, by its ``basis``.
BASES: dict[str, str] = {
    "noise": "the release's randomness only (its noise; for an RFF sketch's MMD², the draw of "
    "its frequencies too), around an unbiased estimator or one whose bias is not bounded (then "
    "a flag on the interval says so)",
    "noise+bias": "the release's noise and a bound on the estimator's bias (bias_bound), whatever "
    "the records",
    "measured": "the noise of the estimate from the measured marginals that hold the value's "
    "columns, which is the value (unbiased count over the measured record count)",
    "bounds": "bounds that hold whatever the joint distribution (Fréchet bounds from what was "
    "measured) and wherever the records lie inside a cell a predicate cuts, widened by the "
    "noise; the value inside them is a guess",
    "public": "the value is fixed by the public domain (every record lies within the columns' "
    "declared bounds, e.g. a CDF at or above a column's upper bound is 1): exact, no noise",
    "none": "no interval can be stated",
}


@dataclass(frozen=True)
class Flag:
    """Why a value, or its interval, needs care.

    Attributes
    ----------
    code : str
        A short name (each producer lists its own: :data:`dpmarket.consumer.explore.FLAGS`,
        :mod:`dpmarket.common.cape.uncertainty`, ``rank-owners``).
    reason : str
        One sentence with the numbers behind it.
    on : {"value", "interval"}
        ``"value"``: the value is weak or a guess, and its interval still means what it says;
        ``"interval"``: the interval does not cover what its basis states.
    """

    code: str
    reason: str
    on: On = "value"

    def __post_init__(self) -> None:
        if self.on not in ("value", "interval"):
            raise ValueError(f"a flag is on 'value' or 'interval', got {self.on!r}")

    def to_json(self) -> dict[str, str]:
        """``{"code", "on", "reason"}``."""
        return {"code": self.code, "on": self.on, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Flag:
        """Inverse of :meth:`to_json`.

        Raises
        ------
        ValueError
            On a missing field or an ``on`` that is neither ``"value"`` nor ``"interval"``.
        """
        try:
            return cls(str(data["code"]), str(data["reason"]), data["on"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed flag {data!r}: {exc}") from None


def trusted(flags: Iterable[Flag], has_interval: bool = True) -> bool:
    """Whether an interval means what its basis says: it exists and no flag is on it."""
    return has_interval and all(f.on != "interval" for f in flags)


def _number(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def interval_row(
    label: str,
    value: float,
    standard_error: float | None,
    low: float | None,
    high: float | None,
    *,
    basis: str,
    covers: str,
    bias_bound: float | None = None,
    flags: Sequence[Flag] = (),
    level: float = LEVEL,
) -> dict[str, Any]:
    """One value as a consumer reads it (module docstring): ``{"label", "value",
    "standard_error", "interval", "level", "basis", "covers", "bias_bound", "flags"}``.

    NaN becomes ``null``; an interval with a NaN or infinite end is ``null`` and its basis
    ``"none"`` (``covers`` is kept: it may say why there is none).

    Raises
    ------
    ValueError
        If ``basis`` is not one of :data:`BASES`.
    """
    if basis not in BASES:
        raise ValueError(f"basis must be one of {sorted(BASES)}, got {basis!r}")
    stated = low is not None and high is not None and math.isfinite(low) and math.isfinite(high)
    return {
        "label": label,
        "value": float(value),
        "standard_error": _number(standard_error),
        "interval": [float(low), float(high)] if stated else None,  # type: ignore[arg-type]
        "level": level,
        "basis": basis if stated else "none",
        "covers": covers,
        "bias_bound": _number(bias_bound),
        "flags": [f.to_json() for f in flags],
    }


def cut_keeping_noise(
    raw_low: NDArray[np.float64],
    raw_high: NDArray[np.float64],
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    noise_width: NDArray[np.float64] | None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Intervals ``[raw_low, raw_high]`` cut to what the values can be, ``[low, high]``, each at
    least ``noise_width`` wide (up to the range's width), all of shape (k,), in the values' units.

    An interval that reaches an edge of the range and is narrower than ``noise_width`` is
    widened from that edge inwards to that width (at an interval reaching both edges, the range
    itself). ``None``: the plain cut. The one cut of ``explore``, ``rank-owners``
    (:func:`dpmarket.consumer.explore.bounded_answer`) and the CAPE mean
    (:func:`dpmarket.common.cape.uncertainty.mean_estimates`).

    Notes
    -----
    Cutting to the range never removes the truth, so the plain cut keeps the coverage; but it
    can leave an interval far narrower than the noise: a HIST CDF ``[0.9999, 1]``, narrower
    than its standard error, a count over several columns ``[0, 0]`` whose noisy upper bound,
    widened by the noise replicates' quantile, landed on 0, a CAPE mean of a binary column
    whose noise put it far below 0. Such an interval claims a certainty the release does not
    have. Widening contains the cut interval, so the coverage can only rise; only intervals
    narrower than the noise change. The marginals kind moves an interval wholly outside the
    range inside whole (:func:`dpmarket.common.sketches.marginals_bounds.fraction_bounds`);
    here such an interval gets the noise's width at the edge, and its producer flags it
    (``clipped`` in ``explore``, ``outside_bounds`` in CAPE).
    """
    lo = np.clip(raw_low, low, high)
    hi = np.clip(raw_high, low, high)
    if noise_width is None:
        return lo, hi
    width = np.minimum(noise_width, high - low)
    short = hi - lo < width
    at_high = short & (hi >= high)
    at_low = short & (lo <= low) & ~at_high
    lo = np.where(at_high, np.maximum(hi - width, low), lo)
    hi = np.where(at_low, np.minimum(lo + width, high), hi)
    return lo, hi


def uninformative_flag(
    width: float,
    span: float,
    what: str,
    shown: float | None = None,
    share: float = UNINFORMATIVE,
) -> tuple[Flag, ...]:
    """``(uninformative,)``, a flag on the value, when an interval ``width`` wide (before any
    cut to what the value can be), or ``shown`` wide as answered (after the cut kept the noise's
    width, :func:`cut_keeping_noise`), spans more than ``share`` of ``span``, the width of
    ``what`` (what the value can be, in words); ``()`` otherwise, and where nothing bounds the
    value (``span`` infinite). Widths and ``span`` are in the value's units."""
    wider = shown is not None and shown > width
    if not (math.isfinite(span) and max(width, shown or 0.0) > share * span):
        return ()
    after = f" and {shown:.4g} wide as shown (the noise's width kept at the cut)" if wider else ""
    return (
        Flag(
            "uninformative",
            f"the interval, {width:.4g} wide before it is cut to {what}{after}, spans more "
            f"than {100 * share:.0f} % of it: the release barely constrains this value",
            "value",
        ),
    )


def outward(low: float, high: float, decimals: int = 0) -> tuple[float, float]:
    """``[low, high]`` rounded outwards to ``decimals`` decimals: the low end down, the high end
    up, so the interval printed holds the one stated (``[47.9, 99.3]`` as ``[47, 100]``; to the
    nearest, ``[48, 99]``, it would claim more certainty than the release has). A difference
    below 1e-9 of the last decimal is floating error and ignored (``0.3`` stays ``0.3``)."""
    f = 10.0**decimals
    return math.floor(round(low * f, 9)) / f, math.ceil(round(high * f, 9)) / f


def interval_text(low: float, high: float, decimals: int = 0) -> str:
    """``"[low, high]"`` with ``decimals`` decimals, rounded outwards (:func:`outward`)."""
    lo, hi = outward(low, high, decimals)
    return f"[{lo:.{decimals}f}, {hi:.{decimals}f}]"
