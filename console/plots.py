"""The console's plots, drawn on the server by matplotlib as inline SVG.

Nothing is fetched by the browser (deployments may be offline): every plot is an ``<svg>`` element
in the page, its text kept as text (``svg.fonttype = "none"``) so that it scales, can be searched
and is read by screen readers and tests, and its size follows the page's width (the fixed width
and height matplotlib writes are dropped; the ``viewBox`` stays). Each function takes plain
numbers and returns the SVG markup; none reads a party's state. They may be called from any
thread (the console draws off its event loop): one draws at a time, since each sets matplotlib's
process-wide style (``rc_context``) while it draws. A page drawn on every fetch from a party's own
records (the owner's charges, the curator's requests per hour) keeps its last few drawings by
their numbers (:func:`_remembered`): the same numbers give the same SVG, so the chart is drawn
once per change of the records, not once per fetch.
"""

from __future__ import annotations

import functools
import io
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

__all__ = [
    "charges_plot",
    "interval_plot",
    "mmd_curve_plot",
    "ranking_plot",
    "rate_plot",
    "share_plot",
]

#: Colours (colour-blind safe: Okabe-Ito) for estimates, flagged values and bars.
BLUE, ORANGE, GREY, GREEN = "#0072B2", "#D55E00", "#999999", "#009E73"
_RC: Any = {
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_SIZE = re.compile(r'\s(width|height)="[^"]*pt"')
#: Held while a plot is drawn: ``rc_context`` changes matplotlib's process-wide settings.
_DRAWING = threading.Lock()


def _one_at_a_time(draw: Callable[..., str]) -> Callable[..., str]:
    """``draw``, holding :data:`_DRAWING` while it runs."""

    @functools.wraps(draw)
    def drawn(*args: Any, **kwargs: Any) -> str:
        with _DRAWING:
            return draw(*args, **kwargs)

    return drawn


#: Drawings :func:`_remembered` keeps per plot function (a few pages' charts at once).
REMEMBERED = 8


def _key(value: Any) -> Any:
    """``value`` (a number, text, or a flat sequence or mapping of them) as a hashable key."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_key(v) for v in value)
    return value


def _remembered(draw: Callable[..., str]) -> Callable[..., str]:
    """``draw`` (a plot of plain numbers, texts, flat lists and mappings of them), keeping its
    last :data:`REMEMBERED` drawings keyed by its arguments: drawn again only when a number
    changes. Its arguments are copied into the key (a caller changing its list later changes
    nothing kept)."""
    kept: OrderedDict[Any, str] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(draw)
    def remembered(*args: Any, **kwargs: Any) -> str:
        key = (_key(args), _key(kwargs))
        with lock:
            if key in kept:
                kept.move_to_end(key)
                return kept[key]
        svg = draw(*args, **kwargs)
        with lock:
            kept[key] = svg
            while len(kept) > REMEMBERED:
                kept.popitem(last=False)
        return svg

    return remembered


def _svg(fig: Figure, label: str, *, tight: bool = True) -> str:
    """``fig`` as an inline, width-following SVG element labelled ``label`` (its ``aria-label``).

    ``tight``: crop to a bounding box measured in a first drawing (keeps every label of a plot
    laid out by matplotlib; a layout engine on top would lay it out twice); False for a figure
    laid out ahead (:func:`_lay_out`), drawn once."""
    buffer = io.StringIO()
    fig.savefig(
        buffer, format="svg", bbox_inches="tight" if tight else None, metadata={"Date": None}
    )
    text = buffer.getvalue()
    start = text.index("<svg")
    svg = _SIZE.sub("", text[start:], count=2)
    safe = label.replace('"', "'").replace("<", "(").replace(">", ")")
    return svg.replace("<svg", f'<svg class="plot" role="img" aria-label="{safe}"', 1)


def warm_up() -> None:
    """Draw one small labelled figure and drop it: a process's first figure loads the fonts
    and the SVG backend (0.15-0.34 s measured on a loaded machine), which the first page with
    a plot would otherwise wait for. A console calls it at start, in its warm-up thread."""
    with _DRAWING:
        fig = _figure(2.0, 1.0)
        ax = fig.add_subplot()
        ax.bar(["a"], [1.0])
        ax.set_title("warm-up")
        _svg(fig, "warm-up")


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height))
        fig.set_dpi(96)
    return fig


@_one_at_a_time
def interval_plot(
    rows: Sequence[Mapping[str, Any]],
    *,
    title: str,
    xlabel: str = "estimate with its 95 % interval (orange: flagged)",
) -> str:
    """An answer's values with their 95 % intervals; flagged values in orange, marked ``!``.

    Drawn with a handful of artists whatever the number of rows (one line collection and one
    marker series per colour) and laid out from the labels' lengths rather than measured in a
    first drawing (a CDF of every column has about a hundred rows: per-row artists and a
    measured layout made its page take over a second).

    Parameters
    ----------
    rows : sequence of mapping
        Rows of the one interval model (:func:`dpmarket.common.uncertainty.interval_row`, as
        :meth:`dpmarket.consumer.explore.Answer.rows`): ``label``, ``value``, ``interval``
        (``[low, high]`` or None) and ``flags`` (a list of ``{"code", "on", "reason"}``; empty
        when none).
    title : str
    """
    labels = [str(r["label"]) for r in reversed(rows)]
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, _PLOT_MARGINS_IN + _ROW_IN * max(len(rows), 1))
        _lay_out(fig, labels)
        ax = fig.add_subplot()
        for flagged, colour in ((False, BLUE), (True, ORANGE)):
            ys = [len(rows) - 1 - k for k, r in enumerate(rows) if bool(r.get("flags")) == flagged]
            if not ys:
                continue
            chosen = [rows[len(rows) - 1 - y] for y in ys]
            spans = [
                (y, r["interval"])
                for y, r in zip(ys, chosen, strict=True)
                if r.get("interval") is not None and all(math.isfinite(v) for v in r["interval"])
            ]
            if spans:
                ax.hlines(
                    [y for y, _ in spans],
                    [ci[0] for _, ci in spans],
                    [ci[1] for _, ci in spans],
                    colors=colour,
                    linewidth=2.2,
                )
            values = [r["value"] for r in chosen]
            ax.plot(values, ys, "o", color=colour, markersize=5, linestyle="none")
            if flagged:  # the "!" beside each flagged value: a marker, not one text per row
                ax.plot(
                    values,
                    ys,
                    marker="$!$",
                    color=ORANGE,
                    markersize=8,
                    linestyle="none",
                    transform=ax.transData + ScaledTranslation(7 / 72, 3 / 72, fig.dpi_scale_trans),
                )
        ax.set_yticks(range(len(rows)), labels)
        ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
        ax.set_title(title, loc="left", y=1.0, pad=6)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_label_coords(0.5, -_XLABEL_IN / fig.get_figheight() / _axes_height(fig))
        ax.yaxis.set_label_coords(-0.01, 0.5)
        ax.grid(axis="x", color="#e5e5e5")
        return _svg(fig, title, tight=False)


#: Inches of an interval plot's height besides its rows (title, x axis and its label), and per
#: row.
_PLOT_MARGINS_IN, _ROW_IN = 0.95, 0.24
#: Inches from the axes' bottom to the x label's top (below the tick labels).
_XLABEL_IN = 0.28
#: A label character's width as a fraction of the font size (DejaVu Sans averages about 0.55;
#: the margin errs wide).
_CHAR_EM = 0.62


def _lay_out(fig: Figure, labels: Sequence[str]) -> None:
    """Margins for tick labels ``labels`` at the left and a title and x label, computed from the
    labels' lengths (no drawing to measure them)."""
    width, height = fig.get_figwidth(), fig.get_figheight()
    size = float(_RC["font.size"])
    longest = max((len(t) for t in labels), default=1)
    left_in = min(0.12 + longest * _CHAR_EM * size / 72, 0.45 * width)
    fig.subplots_adjust(
        left=left_in / width,
        right=1 - 0.2 / width,
        top=1 - 0.35 / height,
        bottom=0.6 / height,
    )


def _axes_height(fig: Figure) -> float:
    """The axes' height as a fraction of the figure's (after :func:`_lay_out`)."""
    return float(fig.subplotpars.top - fig.subplotpars.bottom)


def ranking_plot(rows: Sequence[Mapping[str, Any]], *, title: str) -> str:
    """Owners by MMD² to the validation set (smaller: a closer match), each with its 95 %
    interval; flagged owners (clipped, or an order within the noise) in orange.

    Parameters
    ----------
    rows : sequence of mapping
        ``owner``, ``value`` (the MMD²), ``interval`` (``[low, high]``) and ``flags`` (a list),
        best first: :meth:`dpmarket.consumer.catalogue.Ranking.rows`.
    """
    return interval_plot(
        [{**r, "label": r["owner"]} for r in rows],
        title=title,
        xlabel="MMD² to the validation set, with its 95 % interval (orange: flagged)",
    )


@_one_at_a_time
def mmd_curve_plot(sizes: Sequence[int], values: Sequence[float], *, title: str) -> str:
    """MMD² to the validation set of the summary's first k points, against k."""
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, 2.6)
        ax = fig.add_subplot()
        ax.plot(list(sizes), list(values), color=BLUE, marker="." if len(sizes) < 30 else None)
        ax.set_xlabel("k: the summary's first k points")
        ax.set_ylabel("MMD² to your validation set")
        ax.set_title(title, loc="left")
        ax.grid(color="#e5e5e5")
        return _svg(fig, title)


@_one_at_a_time
def share_plot(shares: Mapping[str, int], left_out: Mapping[str, str], *, title: str) -> str:
    """Each owner's points in the summary (owners left out drawn at 0, with the reason)."""
    owners = sorted(shares) + [o for o in left_out if o not in shares]
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, 0.6 + 0.32 * max(len(owners), 1))
        ax = fig.add_subplot()
        total = max(sum(shares.values()), 1)
        values = [shares.get(o, 0) for o in owners]
        ax.barh(owners[::-1], values[::-1], color=GREEN)
        for y, owner in enumerate(owners[::-1]):
            n = shares.get(owner, 0)
            text = f"{n} ({100 * n / total:.0f} %)" if owner in shares else left_out[owner]
            ax.annotate(text, (n, y), xytext=(4, 0), textcoords="offset points", va="center")
        ax.set_xlabel("points of the summary")
        ax.set_title(title, loc="left")
        ax.set_xlim(0, max([*values, 1]) * 1.35)
        return _svg(fig, title)


@_remembered
@_one_at_a_time
def charges_plot(
    times: Sequence[float], epsilons: Sequence[float], points: Sequence[int], *, title: str
) -> str:
    """The ledger over time: cumulative ε (basic composition) and raw points released."""
    # The ledger before its first charge: nothing spent.
    times, epsilons, points = [times[0], *times], [0.0, *epsilons], [0, *points]
    when: Any = [datetime.fromtimestamp(t, UTC) for t in times]
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, 2.6)
        ax = fig.add_subplot()
        ax.step(when, _cumsum(epsilons), where="post", color=BLUE, label="ε (cumulative)")
        ax.set_ylabel("ε charged", color=BLUE)
        other = ax.twinx()
        other.step(when, _cumsum(points), where="post", color=ORANGE, label="points")
        other.set_ylabel("raw points released", color=ORANGE)
        other.spines["right"].set_visible(True)
        ax.set_title(title, loc="left")
        ax.grid(color="#e5e5e5")
        fig.autofmt_xdate()
        return _svg(fig, title)


@_remembered
@_one_at_a_time
def rate_plot(hours: Sequence[str], counts: Mapping[str, Sequence[int]], *, title: str) -> str:
    """Requests per hour (UTC), stacked by consumer."""
    with matplotlib.rc_context(_RC):
        fig = _figure(6.4, 2.4)
        ax = fig.add_subplot()
        bottom = [0] * len(hours)
        palette = [BLUE, ORANGE, GREEN, "#CC79A7", "#E69F00", "#56B4E9", GREY]
        for k, (who, values) in enumerate(sorted(counts.items())):
            ax.bar(range(len(hours)), values, bottom=bottom, label=who, color=palette[k % 7])
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        step = max(1, len(hours) // 8)
        ax.set_xticks(range(0, len(hours), step), list(hours)[::step])
        ax.set_ylabel("requests")
        ax.set_title(title, loc="left")
        if counts:
            ax.legend(loc="upper left", frameon=False)
        return _svg(fig, title)


def _cumsum(values: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out
