"""Evaluate summaries and present them: metrics, the comparison table and the MMD plot.

Results are typed: :func:`evaluate_summary` returns a :class:`SummaryEvaluation` (with every
owner's :class:`OwnerBreakdown`), :func:`plot_request` the :class:`MMDCurve` it drew; their
``to_json`` write the rows ``report.json`` holds.

The consumer holds the validation set and a labeled target test set, so it is the party that
measures a summary: exact MMD^2 (Eq. 1) to the validation set and to held-out target data, and the
accuracy of a linear SVM trained on the summary (Section 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich import box
from rich.table import Table

from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.summarization.kernels import PopulationMMD, mmd2, mmd2_to_population
from dpmarket.common.summarization.rff import FeatureScaling, kernel_points
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import SummaryResult
from dpmarket.consumer.evaluation import downstream_accuracy
from dpmarket.runtime.tables import PointSet


@dataclass(frozen=True)
class OwnerBreakdown:
    """One owner's part in a summary and its session.

    Attributes
    ----------
    points : int
        Summary points from the owner (0 for an owner left out).
    spend : SessionSpend or None
        What the owner's own ledger recorded for the session (None: not reported, e.g. the
        owner was left out or could not close the session).
    left_out : str
        Why the session ran without the owner, in public words
        (:data:`~dpmarket.common.summarization.summary.LEFT_OUT_REASONS`); empty when it took
        part.
    """

    points: int = 0
    spend: SessionSpend | None = None
    left_out: str = ""


@dataclass(frozen=True)
class SummaryEvaluation:
    """One summary as its consumer measures it, with what its session reported.

    Attributes
    ----------
    method : str
        The method (or, in a comparison, the row's key).
    summary_size : int
        Points in the summary.
    mmd2_validation : float
        Exact MMD² (Eq. 1) of the summary to the validation set, in kernel units.
    mmd2_test : float or None
        MMD² to the held-out target data (None without it).
    accuracy : float or None
        Accuracy in [0, 1] of a linear SVM trained on the summary and scored on the test set
        (None when either has no labels).
    owner_points_accessed : int or None
        Raw owner points the curator read (None where it does not apply: the pooled exact
        greedy).
    validation_points_accessed, points_accessed : int
        Points of D_v the curator read; both together.
    all_owners_bound : int or None
        K * p.
    paper_bound : float or None
        Lemma 5's bound (None for the methods without PrivAuction).
    dropped_owners : tuple of str
    rejected_points : int
    wall_time_seconds : float
    ledger : SessionLedger
        The session's ledger.
    owners : dict of str to OwnerBreakdown
        Every owner that gave points, had its spend recorded or was left out, by name (the
        owners with points first, in name order).
    label : str or None
        The row's label in a comparison table.
    relative_to : str or None
        The reference (its label) :attr:`mmd2_over_reference_percent` is measured against.
    mmd2_over_reference_percent : float or None
        ``(MMD² - ref) / ref * 100`` (Figure 1's measure); None when the reference's MMD² is
        not positive.
    population : PopulationMMD or None
        The summary's MMD² to the distribution the test set was drawn from, with its interval
        (:func:`~dpmarket.common.summarization.kernels.mmd2_to_population`); None without a
        test set.
    n_test : int or None
        Test points behind :attr:`accuracy` and :attr:`population`.
    """

    method: str
    summary_size: int
    mmd2_validation: float
    mmd2_test: float | None
    accuracy: float | None
    owner_points_accessed: int | None
    validation_points_accessed: int
    points_accessed: int
    all_owners_bound: int | None
    paper_bound: float | None
    dropped_owners: tuple[str, ...]
    rejected_points: int
    wall_time_seconds: float
    ledger: SessionLedger
    owners: dict[str, OwnerBreakdown]
    label: str | None = None
    relative_to: str | None = None
    mmd2_over_reference_percent: float | None = None
    population: PopulationMMD | None = None
    n_test: int | None = None

    @property
    def epsilon(self) -> dict[str, Any] | None:
        """The reported epsilons (:func:`epsilon_summary`)."""
        return epsilon_summary(self.ledger)

    @property
    def uncertainty(self) -> dict[str, Any]:
        """What each number is: exact, a bound, or an estimate with its interval
        (:func:`uncertainty`), as JSON."""
        return uncertainty({"accuracy": self.accuracy}, self.population, self.n_test)

    def to_json(self) -> dict[str, Any]:
        """The evaluation as the JSON row ``report.json`` holds (its ``result``): the fields
        above, the ledger as JSON, its ``epsilon`` summary, and the owners split into
        ``points_per_owner``, ``owner_spend`` (:func:`owner_spend`) and ``left_out``, its
        ``uncertainty``; ``label`` when set, ``mmd2_over_reference_percent`` when compared."""
        row: dict[str, Any] = {
            "method": self.method,
            "summary_size": self.summary_size,
            "mmd2_validation": self.mmd2_validation,
            "mmd2_test": self.mmd2_test,
            "accuracy": self.accuracy,
            "owner_points_accessed": self.owner_points_accessed,
            "validation_points_accessed": self.validation_points_accessed,
            "points_accessed": self.points_accessed,
            "all_owners_bound": self.all_owners_bound,
            "paper_bound": self.paper_bound,
            "dropped_owners": list(self.dropped_owners),
            "rejected_points": self.rejected_points,
            "wall_time_seconds": self.wall_time_seconds,
            "epsilon": self.epsilon,
            "ledger": self.ledger.to_json(),
            "points_per_owner": {o: b.points for o, b in self.owners.items() if b.points},
            "owner_spend": owner_spend(
                {o: b.spend for o, b in self.owners.items() if b.spend is not None}
            ),
            "left_out": {o: b.left_out for o, b in self.owners.items() if b.left_out},
            "uncertainty": self.uncertainty,
        }
        if self.label is not None:
            row["label"] = self.label
        if self.relative_to is not None:
            row["mmd2_over_reference_percent"] = self.mmd2_over_reference_percent
        return row


def evaluate_summary(
    result: SummaryResult,
    validation: NDArray[np.float64],
    gamma: float,
    *,
    test: PointSet | None = None,
    seed: int = 0,
    scaling: FeatureScaling | None = None,
) -> SummaryEvaluation:
    """Measure one summary.

    Parameters
    ----------
    result : SummaryResult
        Summary points of shape (p, n) with labels (p,) when the owners have labels.
    validation : ndarray of shape (m, n)
    gamma : float
        RBF kernel parameter of the MMD (in the units ``scaling`` gives the features).
    test : PointSet, optional
        Labeled held-out target data: adds MMD^2 to it and downstream accuracy.
    seed : int
        Seed of the downstream classifier.
    scaling : FeatureScaling, optional
        The session's feature scaling (the schema's public bounds,
        :class:`~dpmarket.common.summarization.rff.FeatureScaling`): every MMD² reads the
        points so scaled, as the session's kernel did; the classifier reads them as they are.

    Returns
    -------
    SummaryEvaluation
        MMD² to D_v and to the test set (or None), accuracy (or None when either the summary
        or the test set has no labels), the session report's figures and every owner's part;
        its :attr:`~SummaryEvaluation.uncertainty` says what each number is, with an interval
        where it is an estimate (:func:`uncertainty`).
    """
    r = result.report
    mmd2_test = accuracy = population = None
    points = kernel_points(result.points, scaling)
    if test is not None:
        population = mmd2_to_population(points, kernel_points(test.features, scaling), gamma)
        mmd2_test = population.v_statistic
        if result.labels is not None and test.labels is not None:
            train = PointSet(result.points, result.labels, f"{r.method} summary")
            accuracy = downstream_accuracy(train, test, seed=seed)
    return SummaryEvaluation(
        method=r.method,
        summary_size=int(result.points.shape[0]),
        mmd2_validation=mmd2(points, kernel_points(validation, scaling), gamma),
        mmd2_test=mmd2_test,
        accuracy=accuracy,
        owner_points_accessed=r.owner_points_accessed,
        validation_points_accessed=r.validation_points_accessed,
        points_accessed=r.owner_points_accessed + r.validation_points_accessed,
        all_owners_bound=r.all_owners_bound,
        paper_bound=r.paper_bound or None,
        dropped_owners=tuple(r.dropped_owners),
        rejected_points=r.rejected_points,
        wall_time_seconds=r.wall_time_seconds,
        ledger=r.ledger,
        owners=owner_breakdown(result),
        population=population,
        n_test=None if test is None else test.n_points,
    )


def owner_breakdown(result: SummaryResult) -> dict[str, OwnerBreakdown]:
    """Every owner's part in ``result``: its points, its spend, why it was left out; the owners
    with points first (by name), then the others in the report's order."""
    points = _count(result.owner_ids)
    spend = result.report.owner_spend
    left = result.report.left_out
    names = [*sorted(points), *(o for o in (*sorted(spend), *left) if o not in points)]
    return {
        o: OwnerBreakdown(points.get(o, 0), spend.get(o), left.get(o, ""))
        for o in dict.fromkeys(names)
    }


#: What each exact number of a summary's report is (it has no interval: nothing in it is noisy).
EXACT_NOTES = {
    "mmd2_validation": "exact: computed by the consumer from the summary and D_v themselves (no "
    "noise); in-sample, so optimistic as a measure against the target distribution (the "
    "summary was chosen to match D_v)",
    "mmd2_over_reference_percent": "exact, in-sample: the ratio of two exact MMD² to D_v",
    "points_per_owner": "exact: the summary's points counted by the owner they came from",
    "owner_points_accessed": "exact: raw points the curator received, counted",
    "epsilon": "upper bounds on the privacy loss from the accountants, at the stated delta: "
    "guarantees, not estimates",
}


def uncertainty(
    row: Mapping[str, Any],
    population: PopulationMMD | None,
    n_test: int | None,
    *,
    level: float = 0.95,
) -> dict[str, Any]:
    """What each number of a summary's report is: exact (with a note), or an estimate with its
    standard error and interval.

    Parameters
    ----------
    row : mapping
        :func:`evaluate_summary`'s row (``accuracy`` read from it).
    population : PopulationMMD, optional
        The summary's MMD² to the test set's distribution
        (:func:`dpmarket.common.summarization.kernels.mmd2_to_population`, at ``level``).
    n_test : int, optional
        Test points behind ``accuracy``.
    level : float
        Of the accuracy's interval.

    Returns
    -------
    dict
        ``{field: {"kind": "exact" | "bound", "note"}}`` for the exact numbers, and for
        ``mmd2_test`` and ``accuracy`` (when measured) ``{"kind": "estimate", "value",
        "standard_error", "interval", "level", "covers"}``: the summary's MMD² to the
        distribution the test set was drawn from (its ``value`` is the unbiased estimate, below
        the report's V-statistic by about ``1 / n_test``), and the classifier's accuracy on it
        (Wilson score interval). Both cover the test set's sampling error only: the summary and
        the classifier are fixed.
    """
    out: dict[str, Any] = {
        field: {"kind": "bound" if field == "epsilon" else "exact", "note": note}
        for field, note in EXACT_NOTES.items()
    }
    if population is None or n_test is None:
        return out
    out["mmd2_test"] = {
        "kind": "estimate",
        "value": population.value,
        "standard_error": population.standard_error,
        "interval": [population.low, population.high],
        "level": population.level,
        "covers": "the summary's MMD² to the distribution the test set was drawn from (the "
        "test set's sampling error; the summary fixed)",
    }
    accuracy = row.get("accuracy")
    if accuracy is not None:
        n = n_test
        k = round(accuracy * n)
        from scipy.stats import binomtest  # about a second: on first use

        interval = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
        out["accuracy"] = {
            "kind": "estimate",
            "value": accuracy,
            "standard_error": math.sqrt(accuracy * (1.0 - accuracy) / n),
            "interval": [float(interval.low), float(interval.high)],
            "level": level,
            "covers": "the classifier's accuracy on the distribution the test set was drawn "
            f"from (Wilson interval over its {n} points; the summary and the classifier fixed)",
        }
    return out


def owner_spend(spend: Mapping[str, SessionSpend]) -> dict[str, dict[str, Any]]:
    """What each owner's own ledger recorded for the session, as JSON: ``{owner: {"epsilon"
    (None for a non-private session), "delta", "points", "non_private"}}``; an owner whose
    record the curator could not get is ``{owner: {"unknown": reason, "epsilon": None,
    "delta": None, "points": None, "non_private": None}}`` (its own ledger says what it
    charged)."""
    return {
        owner: (
            dict.fromkeys(("epsilon", "delta", "points", "non_private"), None)
            | {"unknown": s.unknown}
            if s.unknown
            else {
                "epsilon": None if s.non_private else s.epsilon,
                "delta": s.delta,
                "points": s.points,
                "non_private": s.non_private,
            }
        )
        for owner, s in sorted(spend.items())
    }


def epsilon_summary(ledger: SessionLedger) -> dict[str, Any] | None:
    """The reported epsilons of a session's ledger, as JSON (None: nothing reported).

    Returns
    -------
    dict or None
        ``{"validation": {...}, "owners": {...}}``, each with the Theorem 7, PLD, basic and
        advanced-composition epsilons, the delta of the Theorem 7 figure, the budget, the
        mechanisms run and the delta~ they hold for (only ``delta_tilde``, None, when the party
        has no ledger: a session that charged nothing).
    """
    if ledger.empty:
        return None
    out: dict[str, Any] = {}
    for party in ("validation", "owners"):
        report = ledger.party(party)
        row = {} if report is None else asdict(report.parties[party])
        row["delta_tilde"] = None if report is None else report.delta_tilde
        out[party] = row
    return out


def _count(owner_ids: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for owner in owner_ids:
        counts[owner] = counts.get(owner, 0) + 1
    return counts


def add_relative_mmd(rows: Sequence[SummaryEvaluation], reference: str) -> list[SummaryEvaluation]:
    """The rows with ``mmd2_over_reference_percent`` = (MMD² - ref) / ref * 100 against the
    row whose method is ``reference`` (Figure 1's measure; None when it is missing or its
    MMD² is not positive)."""
    ref = next((r.mmd2_validation for r in rows if r.method == reference), None)
    out = []
    for row in rows:
        pct = None if ref is None or ref <= 0 else (row.mmd2_validation - ref) / ref * 100.0
        out.append(replace(row, relative_to=reference, mmd2_over_reference_percent=pct))
    return out


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _epsilons(row: Mapping[str, Any], spec: str, sep: str) -> tuple[str, str]:
    """The row's epsilon on D_v and on the owners' data, each "Theorem 7 / PLD"."""
    eps = row.get("epsilon")
    if not eps:
        text = "none released" if row["method"] == "uniform" else "non-private"
        if sep == "/":  # compact
            text = "—" if row["method"] == "uniform" else "n/a"
        return text, text
    v, o = eps["validation"], eps["owners"]
    return (
        f"{_fmt(v.get('theorem7'), spec)}{sep}{_fmt(v.get('pld'), spec)}",
        f"{_fmt(o.get('theorem7'), spec)}{sep}{_fmt(o.get('pld'), spec)}",
    )


def _with_interval(row: Mapping[str, Any], field: str, spec: str) -> str:
    """``value [low, high]``: the 95 % interval itself when the row's ``uncertainty`` has one
    (a Wilson interval is asymmetric: a half-width such as ``0.680±0.090`` would read as
    [0.590, 0.770] for [0.583, 0.763])."""
    text = _fmt(row.get(field), spec)
    stated = (row.get("uncertainty") or {}).get(field) or {}
    interval = stated.get("interval")
    if text == "-" or interval is None:
        return text
    return f"{text} [{format(interval[0], spec)},{format(interval[1], spec)}]"


def _interval(row: Mapping[str, Any], field: str, spec: str) -> str:
    """``[low, high]`` of the row's ``uncertainty`` for ``field``, or ``-``."""
    interval = ((row.get("uncertainty") or {}).get(field) or {}).get("interval")
    if interval is None:
        return "-"
    return f"[{format(interval[0], spec)}, {format(interval[1], spec)}]"


def comparison_table(
    evaluations: Sequence[SummaryEvaluation | Mapping[str, Any]],
    *,
    title: str,
    wide: bool = False,
) -> Table:
    """Render the comparison of methods as a rich table (one row per method).

    Parameters
    ----------
    evaluations : sequence of SummaryEvaluation or mapping
        :func:`evaluate_summary` rows with a ``label``, or their JSON rows
        (:meth:`SummaryEvaluation.to_json`).
    title : str
    wide : bool
        Every column (about 170 terminal columns for the demo's rows). Default: a compact
        table that fits 80 columns (MMD² to D_v, % over the reference when present, accuracy
        when present, points read, epsilon on D_v and on the owners by Theorem 7 / PLD), the
        method's name folding onto more lines rather than any value being cut.
    """
    rows = [r.to_json() if isinstance(r, SummaryEvaluation) else r for r in evaluations]
    if wide:
        return _wide_table(rows, title=title)
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption="points read: owners' + D_v's; ε: Theorem 7/PLD; MMD² D_v: exact, in-sample; "
        "acc.: on the test set [its 95 % interval]",
        caption_justify="left",
    )
    reference = any(r.get("mmd2_over_reference_percent") is not None for r in rows)
    accuracy = any(r.get("accuracy") is not None for r in rows)
    table.add_column("method", overflow="fold", min_width=8)
    table.add_column("MMD² D_v", justify="right", no_wrap=True)
    if reference:
        table.add_column("vs greedy", justify="right", no_wrap=True)
    if accuracy:
        table.add_column("acc.", justify="right", no_wrap=True)
    for header in ("points", "ε D_v", "ε owners"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        accessed = row.get("owner_points_accessed")
        points = (
            "-" if accessed is None else f"{accessed}+{row.get('validation_points_accessed', 0)}"
        )
        eps_v, eps_o = _epsilons(row, ".2g", "/")
        cells = [str(row["label"]), _fmt(row["mmd2_validation"], ".3g")]
        if reference:
            pct = row.get("mmd2_over_reference_percent")
            cells.append("-" if pct is None else f"{pct:+.0f}%")
        if accuracy:
            cells.append(_with_interval(row, "accuracy", ".3f"))
        cells += [points, eps_v, eps_o]
        table.add_row(*cells)
    return table


def _wide_table(rows: Sequence[Mapping[str, Any]], *, title: str) -> Table:
    """Every column of the comparison (``--wide``)."""
    table = Table(title=title, title_justify="left")
    for header in (
        "method",
        "MMD² to D_v",
        "% over greedy",
        "MMD² to test",
        "its 95 % interval (population)",
        "accuracy",
        "accessed (owners + D_v)",
        "K·p",
        "paper bound",
        "ε D_v (Thm 7 / PLD)",
        "ε owners (Thm 7 / PLD)",
        "time (s)",
    ):
        table.add_column(header, justify="left" if header == "method" else "right")
    for row in rows:
        eps_v, eps_o = _epsilons(row, ".3g", " / ")
        accessed = row.get("owner_points_accessed")
        table.add_row(
            str(row["label"]),
            _fmt(row["mmd2_validation"], ".4g"),
            _fmt(row.get("mmd2_over_reference_percent"), "+.0f"),
            _fmt(row.get("mmd2_test"), ".4g"),
            _interval(row, "mmd2_test", ".3g"),
            _with_interval(row, "accuracy", ".3f"),
            "-" if accessed is None else f"{accessed} + {row.get('validation_points_accessed', 0)}",
            _fmt(row.get("all_owners_bound"), "d"),
            _fmt(row.get("paper_bound"), ".0f"),
            eps_v,
            eps_o,
            _fmt(row.get("wall_time_seconds"), ".2f"),
        )
    return table


@dataclass(frozen=True)
class MMDCurve:
    """MMD² to the validation set of a summary's first k points, for each k.

    Attributes
    ----------
    sizes : tuple of int
        The k, increasing.
    mmd2 : tuple of float
        MMD² (Eq. 1, kernel units) of the first k points, for each k.
    shares : dict of str to int
        Each owner's points in the whole summary (an owner left out: 0); empty when not drawn.
    """

    sizes: tuple[int, ...]
    mmd2: tuple[float, ...]
    shares: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """``{"sizes": [k, ...], "mmd2": [...], "shares": {owner: points}}``."""
        return {"sizes": list(self.sizes), "mmd2": list(self.mmd2), "shares": dict(self.shares)}


def mmd_curve(
    points: NDArray[np.floating],
    validation: NDArray[np.floating],
    gamma: float,
    sizes: Sequence[int],
) -> list[float]:
    """MMD^2 to the validation set of the first ``k`` summary points, for each k in ``sizes``."""
    return [mmd2(points[:k], validation, gamma) for k in sizes if 0 < k <= points.shape[0]]


def summary_curve(
    result: SummaryResult,
    validation: NDArray[np.float64],
    gamma: float,
    *,
    scaling: FeatureScaling | None = None,
) -> MMDCurve:
    """MMD² to the validation set of the summary's first k points, for k up to p (50 steps at
    most, p last), and every owner's share (those left out: 0, after the others).

    Parameters
    ----------
    result : SummaryResult
        Points of shape (p, n) in the order they were added, their owners, the report.
    validation : ndarray of shape (m, n)
    gamma : float
        RBF kernel parameter of the MMD.
    scaling : FeatureScaling, optional
        The session's feature scaling: the MMD² reads the points so scaled
        (:func:`evaluate_summary`).
    """
    p = int(result.points.shape[0])
    step = max(1, p // 50)
    sizes = sorted({*range(step, p + 1, step), p}) if p else []
    values = mmd_curve(
        kernel_points(result.points, scaling), kernel_points(validation, scaling), gamma, sizes
    )
    counts = _count(result.owner_ids)
    owners = sorted(counts) + [o for o in result.report.left_out if o not in counts]
    return MMDCurve(tuple(sizes), tuple(values), {o: counts.get(o, 0) for o in owners})


def plot_mmd_curves(
    curves: Mapping[str, MMDCurve],
    path: str | Path,
    *,
    title: str,
    reference: str | None = None,
) -> None:
    """Plot MMD^2 against summary size per method (the paper's Figures 1-2) into a PNG.

    Parameters
    ----------
    curves : mapping of label -> MMDCurve
    path : str or Path
        Output PNG.
    reference : str, optional
        Label of the curve the lower panel measures the others against, in percent.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if reference in curves else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 4 * panels), squeeze=False)
    ax = axes[0][0]
    for label, curve in curves.items():
        ax.plot(curve.sizes, curve.mmd2, marker="o", markersize=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("summary size p")
    ax.set_ylabel("MMD² to validation set")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if panels == 2 and reference is not None:
        ax2 = axes[1][0]
        ref = dict(zip(curves[reference].sizes, curves[reference].mmd2, strict=True))
        for label, curve in curves.items():
            if label == reference:
                continue
            pct = [
                (v - ref[s]) / ref[s] * 100 for s, v in zip(curve.sizes, curve.mmd2, strict=True)
            ]
            ax2.plot(curve.sizes, pct, marker="o", markersize=3, label=label)
        ax2.set_xlabel("summary size p")
        ax2.set_ylabel(f"% MMD² over {reference}")
        ax2.grid(True, alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_request(
    result: SummaryResult,
    validation: NDArray[np.float64],
    gamma: float,
    path: str | Path,
    *,
    title: str,
    scaling: FeatureScaling | None = None,
) -> MMDCurve:
    """Plot a consumer's own summary into a PNG: MMD² to its validation set of the first k
    summary points against k (the points read under ``scaling``, :func:`summary_curve`), and
    each owner's share of the summary.

    Parameters
    ----------
    result : SummaryResult
        Points of shape (p, n) in the order they were added, their owners, the report (whose
        ``left_out`` owners are drawn with a share of 0 and their reason).
    validation : ndarray of shape (m, n)
    gamma : float
        RBF kernel parameter of the MMD.
    path : str or Path
        Output PNG.
    title : str

    Returns
    -------
    MMDCurve
        What is drawn: the MMD² of the first k points for k up to p (50 steps at most), and
        every owner's share (the left-out owners' 0).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = summary_curve(result, validation, gamma, scaling=scaling)
    sizes, values, shares = list(drawn.sizes), list(drawn.mmd2), drawn.shares
    left_out = dict(result.report.left_out)
    owners = list(shares)
    fig, (curve, bars) = plt.subplots(1, 2, figsize=(11, 4))
    curve.plot(sizes, values, marker="o", markersize=3)
    curve.set_yscale("log")
    curve.set_xlabel("first k summary points")
    curve.set_ylabel("MMD² to the validation set")
    curve.grid(True, alpha=0.3)
    counts = [shares.get(o, 0) for o in owners]
    bars.bar(range(len(owners)), counts, color=["C0" if shares[o] else "0.7" for o in owners])
    bars.set_xticks(
        range(len(owners)),
        [f"{o}\n({left_out[o]})" if not shares[o] and o in left_out else o for o in owners],
        rotation=30,
        ha="right",
        fontsize=8,
    )
    bars.set_ylabel("summary points")
    bars.set_title("each owner's share")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn
