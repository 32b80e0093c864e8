"""Evaluate summaries and present them: metrics, the comparison table and the MMD plot.

The consumer holds the validation set and a labeled target test set, so it is the party that
measures a summary: exact MMD^2 (Eq. 1) to the validation set and to held-out target data, and the
accuracy of a linear SVM trained on the summary (Section 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.table import Table

from common.summarization.kernels import mmd2
from common.summarization.summary import SummaryResult
from consumer.evaluation import downstream_accuracy
from owner.data import PointSet


def evaluate_summary(
    result: SummaryResult,
    validation: NDArray[np.float64],
    gamma: float,
    *,
    test: PointSet | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure one summary.

    Parameters
    ----------
    result : SummaryResult
        Summary points of shape (p, n) with labels (p,) when the owners have labels.
    validation : ndarray of shape (m, n)
    gamma : float
        RBF kernel parameter of the MMD.
    test : PointSet, optional
        Labeled held-out target data: adds MMD^2 to it and downstream accuracy.
    seed : int
        Seed of the downstream classifier.

    Returns
    -------
    dict
        ``mmd2_validation``, ``mmd2_test`` (or None), ``accuracy`` (or None when either the
        summary or the test set has no labels), and the session report's fields.
    """
    r = result.report
    row: dict[str, Any] = {
        "method": r.method,
        "summary_size": int(result.points.shape[0]),
        "mmd2_validation": mmd2(result.points, validation, gamma),
        "mmd2_test": None,
        "accuracy": None,
        "owner_points_accessed": r.owner_points_accessed,
        "validation_points_accessed": r.validation_points_accessed,
        "points_accessed": r.owner_points_accessed + r.validation_points_accessed,
        "all_owners_bound": r.all_owners_bound,
        "paper_bound": r.paper_bound or None,
        "dropped_owners": list(r.dropped_owners),
        "rejected_points": r.rejected_points,
        "wall_time_seconds": r.wall_time_seconds,
        "epsilon": epsilon_summary(r.ledger),
        "ledger": r.ledger,
        "points_per_owner": _count(result.owner_ids),
    }
    if test is not None:
        row["mmd2_test"] = mmd2(result.points, test.features, gamma)
        if result.labels is not None and test.labels is not None:
            train = PointSet(result.points, result.labels, f"{r.method} summary")
            row["accuracy"] = downstream_accuracy(train, test, seed=seed)
    return row


def epsilon_summary(ledger: Mapping[str, Any]) -> dict[str, Any] | None:
    """Pick the reported epsilons out of a session's ledger report (None: non-private method).

    Returns
    -------
    dict or None
        ``{"validation": {...}, "owners": {...}}``, each with the Theorem 7, PLD, basic and
        advanced-composition epsilons and the delta~ they hold for.
    """
    if not ledger:
        return None
    out: dict[str, Any] = {}
    for party in ("validation", "owners"):
        report = ledger.get(party, {})
        row = dict(report.get("parties", {}).get(party, {}))
        row["delta_tilde"] = report.get("delta_tilde")
        out[party] = row
    return out


def _count(owner_ids: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for owner in owner_ids:
        counts[owner] = counts.get(owner, 0) + 1
    return counts


def add_relative_mmd(rows: list[dict[str, Any]], reference: str) -> None:
    """Add ``mmd2_over_reference_percent`` = (MMD^2 - ref) / ref * 100 (Figure 1's measure)."""
    ref = next((r["mmd2_validation"] for r in rows if r["method"] == reference), None)
    for row in rows:
        if ref is None or ref <= 0:
            row["mmd2_over_reference_percent"] = None
        else:
            row["mmd2_over_reference_percent"] = (row["mmd2_validation"] - ref) / ref * 100.0


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def comparison_table(rows: Sequence[Mapping[str, Any]], *, title: str) -> Table:
    """Render the comparison of methods as a rich table (one row per method)."""
    table = Table(title=title, title_justify="left")
    for header in (
        "method",
        "MMD² to D_v",
        "% over greedy",
        "MMD² to test",
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
        eps = row.get("epsilon")
        if eps:
            v, o = eps["validation"], eps["owners"]
            eps_v = f"{_fmt(v.get('theorem7'), '.3g')} / {_fmt(v.get('pld'), '.3g')}"
            eps_o = f"{_fmt(o.get('theorem7'), '.3g')} / {_fmt(o.get('pld'), '.3g')}"
        else:
            eps_v = eps_o = "none released" if row["method"] == "uniform" else "non-private"
        accessed = row.get("owner_points_accessed")
        table.add_row(
            str(row["label"]),
            _fmt(row["mmd2_validation"], ".4g"),
            _fmt(row.get("mmd2_over_reference_percent"), "+.0f"),
            _fmt(row.get("mmd2_test"), ".4g"),
            _fmt(row.get("accuracy"), ".3f"),
            "-" if accessed is None else f"{accessed} + {row.get('validation_points_accessed', 0)}",
            _fmt(row.get("all_owners_bound"), "d"),
            _fmt(row.get("paper_bound"), ".0f"),
            eps_v,
            eps_o,
            _fmt(row.get("wall_time_seconds"), ".2f"),
        )
    return table


def mmd_curve(
    points: NDArray[np.float64], validation: NDArray[np.float64], gamma: float, sizes: Sequence[int]
) -> list[float]:
    """MMD^2 to the validation set of the first ``k`` summary points, for each k in ``sizes``."""
    return [mmd2(points[:k], validation, gamma) for k in sizes if 0 < k <= points.shape[0]]


def plot_mmd_curves(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    path: str | Path,
    *,
    title: str,
    reference: str | None = None,
) -> None:
    """Plot MMD^2 against summary size per method (the paper's Figures 1-2) into a PNG.

    Parameters
    ----------
    curves : mapping of label -> (sizes, MMD^2 values)
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
    for label, (sizes, values) in curves.items():
        ax.plot(sizes, values, marker="o", markersize=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("summary size p")
    ax.set_ylabel("MMD² to validation set")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if panels == 2 and reference is not None:
        ax2 = axes[1][0]
        ref_sizes, ref_values = curves[reference]
        ref = dict(zip(ref_sizes, ref_values, strict=True))
        for label, (sizes, values) in curves.items():
            if label == reference:
                continue
            pct = [(v - ref[s]) / ref[s] * 100 for s, v in zip(sizes, values, strict=True)]
            ax2.plot(sizes, pct, marker="o", markersize=3, label=label)
        ax2.set_xlabel("summary size p")
        ax2.set_ylabel(f"% MMD² over {reference}")
        ax2.grid(True, alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
