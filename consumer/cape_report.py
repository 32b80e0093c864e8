"""The curator's report of a CAPE job, typed: what :class:`~dpmarket.consumer.client.CapeFit`,
:class:`~dpmarket.consumer.client.CapeMean` and :class:`~dpmarket.consumer.client.CapeNetwork`
carry, and what ``dpmarket consumer cape ... --json`` prints under ``report``.

The curator sends the report as JSON (``report_json`` of cape.proto's answers; built by
:mod:`dpmarket.curator.cape` and :mod:`dpmarket.curator.cape_service`). :meth:`CapeReport.from_json`
reads the fields every program needs into typed attributes and keeps the document whole, so that
:meth:`CapeReport.to_json` gives back exactly the keys and values the curator sent (those a field
does not cover too: the secure-aggregation graph, the calibration, the noise scales per order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from dpmarket.common.cape.uncertainty import Estimate
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.ledger import SessionSpend

__all__ = ["CapeFitReport", "CapeMeanReport", "CapeReport", "CapeTrainingReport"]


@dataclass(frozen=True)
class CapeReport:
    """What the curator states of every CAPE job.

    Attributes
    ----------
    task : str
        ``"linear"``, ``"logistic"``, ``"mean"`` or ``"train"``.
    sites : tuple of str
        The owners whose releases are in the answer (for a training: those of its first
        segment).
    sizes : mapping of str to int
        Each site's row count, as it signed it.
    dropped : mapping of str to str
        Owners dropped before they released, with why.
    noise_rounds : int
        Secure-aggregation rounds run for the zero-sum noise.
    epsilon : float
        What each owner guarantees against the curator (for a training: over every iteration).
    delta_target, delta_exact : float
        The requested delta, and the delta of the exact privacy profile.
    delta_theorem1 : float or None
        The CAPE paper's Theorem 1 bound, when it applies.
    colluders, default_colluders : int
        The colluding owners ``S_C`` the guarantee holds against, and the default for the sites.
    owner_spend : mapping of str to SessionSpend
        What each owner recorded in its own ledger for the job (or why the curator does not know).
    seconds : mapping of str to float
        Wall time per phase, and ``"total"``.
    document : mapping
        The report as the curator sent it (:meth:`to_json`).
    """

    task: str
    sites: tuple[str, ...]
    sizes: Mapping[str, int]
    dropped: Mapping[str, str]
    noise_rounds: int
    epsilon: float
    delta_target: float
    delta_exact: float
    delta_theorem1: float | None
    colluders: int
    default_colluders: int
    owner_spend: Mapping[str, SessionSpend]
    seconds: Mapping[str, float]
    document: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Self:
        """Read a report the curator sent.

        Raises
        ------
        InvalidArgumentError
            If a field is missing or of the wrong type (naming it).
        """
        try:
            return cls(**cls._fields_of(document), document=dict(document))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidArgumentError(
                f"the curator's CAPE report is malformed ({type(exc).__name__}: {exc}); "
                "is the curator of another dpmarket version?"
            ) from None

    @classmethod
    def _fields_of(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        theorem1 = d["delta_theorem1"]
        return {
            "task": str(d["task"]),
            "sites": tuple(str(s) for s in d["sites"]),
            "sizes": {str(k): int(v) for k, v in d["sizes"].items()},
            "dropped": {str(k): str(v) for k, v in d["dropped"].items()},
            "noise_rounds": int(d["noise_rounds"]),
            "epsilon": float(d["epsilon"]),
            "delta_target": float(d["delta_target"]),
            "delta_exact": float(d["delta_exact"]),
            "delta_theorem1": None if theorem1 is None else float(theorem1),
            "colluders": int(d["colluders"]),
            "default_colluders": int(d["default_colluders"]),
            "owner_spend": {
                str(owner): SessionSpend(**spend) for owner, spend in d["owner_spend"].items()
            },
            "seconds": {str(k): float(v) for k, v in d["seconds"].items()},
        }

    @property
    def quoted(self) -> int | None:
        """The most the job could cost, micro-credits (its quote's total; None from a curator
        that does not quote CAPE jobs)."""
        quote = self.document.get("quote")
        return None if not isinstance(quote, Mapping) else int(quote["total"])

    @property
    def cost(self) -> int | None:
        """What the job cost, micro-credits: its signed statement's total (None while it is not
        settled; ``dpmarket consumer statements`` lists the statement)."""
        cost = self.document.get("cost")
        return None if cost is None else int(cost)

    def to_json(self, *, estimates: bool = True) -> dict[str, Any]:
        """The report as the curator sent it (its keys unchanged); without ``estimates`` when
        ``estimates`` is false (a document that carries them at its top level)."""
        return {k: v for k, v in self.document.items() if estimates or k != "estimates"}


def _estimates(d: Mapping[str, Any]) -> tuple[Estimate, ...]:
    return tuple(Estimate.from_json(e) for e in d["estimates"])


@dataclass(frozen=True)
class CapeFitReport(CapeReport):
    """The report of a capeFM fit (a linear or logistic regression).

    Attributes
    ----------
    lost_at_release : tuple of str
        Sites lost at their release, whose zero-sum noise the answer keeps (stated larger).
    estimates : tuple of Estimate
        Every coefficient (the columns, then the intercept) with its standard error, 95 %
        interval and flags (:func:`dpmarket.common.cape.uncertainty.capefm_estimates`).
    """

    lost_at_release: tuple[str, ...]
    estimates: tuple[Estimate, ...]

    @classmethod
    def _fields_of(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_of(d),
            "lost_at_release": tuple(str(s) for s in d["lost_at_release"]),
            "estimates": _estimates(d),
        }


@dataclass(frozen=True)
class CapeMeanReport(CapeReport):
    """The report of a CAPE mean.

    Attributes
    ----------
    lost_at_release : tuple of str
        As :attr:`CapeFitReport.lost_at_release`.
    estimates : tuple of Estimate
        Every column's mean with its exact standard error, 95 % interval and flags
        (:func:`dpmarket.common.cape.uncertainty.mean_estimates`).
    aggregator_noise_std : float
        Standard deviation of the noise left in each coordinate of the mean, in the columns'
        units scaled to [0, 1] by their bounds.
    baseline_noise_std : mapping of str to float
        The same for the baselines (``pooled``, ``conv``, ``local``).
    """

    lost_at_release: tuple[str, ...]
    estimates: tuple[Estimate, ...]
    aggregator_noise_std: float
    baseline_noise_std: Mapping[str, float]

    @classmethod
    def _fields_of(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_of(d),
            "lost_at_release": tuple(str(s) for s in d["lost_at_release"]),
            "estimates": _estimates(d),
            "aggregator_noise_std": float(d["aggregator_noise_std"]),
            "baseline_noise_std": {str(k): float(v) for k, v in d["baseline_noise_std"].items()},
        }


@dataclass(frozen=True)
class CapeTrainingReport(CapeReport):
    """The report of a training by CAPE gradient descent (CAPE paper, Section 5.1).

    Attributes
    ----------
    iterations : int
    lost_at_release : mapping of str to int
        Each site lost at a release, with the last iteration it released.
    segments : tuple of mapping
        Runs of iterations over one set of sites (``sites``, and the iterations they ran).
    noise_std_per_iteration : tuple of float
        Standard deviation of the noise in each iteration's aggregated gradient.
    """

    iterations: int
    lost_at_release: Mapping[str, int]
    segments: tuple[Mapping[str, Any], ...]
    noise_std_per_iteration: tuple[float, ...]

    @classmethod
    def _fields_of(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_of(d),
            "iterations": int(d["iterations"]),
            "lost_at_release": {str(k): int(v) for k, v in d["lost_at_release"].items()},
            "segments": tuple(dict(s) for s in d["segments"]),
            "noise_std_per_iteration": tuple(float(s) for s in d["noise_std_per_iteration"]),
        }
