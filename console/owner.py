"""What the owner's console reads: its own ledger, policy and sketches, and its service's health.

Everything comes from the owner's data directory, read as ``dpmarket owner ledger`` and ``sketch
published`` read it (:func:`dpmarket.owner.cli.ledger_report`,
:class:`dpmarket.owner.sketches.SketchPublisher`), beside the running service (SQLite's WAL lets
a reader in while the service charges); the one call to the service is a health check over mTLS
with the owner's own certificate. The console never asks the curator or another owner anything.

Earnings (the market): the statements the owner checked against its ledger and recorded
(:class:`dpmarket.owner.earnings.Earnings`, as ``dpmarket owner earnings`` reads them) and its
prices, read in the same ``OwnerLedger`` opening as the budget.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.common.market.money import EPSILON_UNITS, credits_text
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.console import plots
from dpmarket.console.probe import Probe, Prober
from dpmarket.owner.cli import ledger_report, short_session
from dpmarket.owner.earnings import Earning, Earnings
from dpmarket.owner.ledger import OwnerLedger, ledger_path
from dpmarket.owner.sketches import SketchPublisher
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

__all__ = ["OwnerConsole", "earnings_view", "gauge", "price_rows", "service_target"]


def gauge(label: str, spent: float, limit: float, unit: str = "") -> dict[str, Any]:
    """A budget gauge: ``{"label", "spent", "limit", "left", "percent", "unit", "level"}``
    (``level``: ``ok`` below 75 % spent, ``high`` below 100 %, ``full`` at the limit)."""
    left = max(limit - spent, 0.0)
    percent = 100.0 if limit <= 0 else min(100.0, 100.0 * spent / limit)
    level = "full" if percent >= 100.0 - 1e-9 else "high" if percent >= 75.0 else "ok"
    return {
        "label": label,
        "spent": spent,
        "limit": limit,
        "left": left,
        "percent": percent,
        "unit": unit,
        "level": level,
    }


@dataclass
class OwnerConsole:
    """The owner's side of the console.

    Parameters
    ----------
    data_dir : Path
        The owner's data directory (its ledger, policy and sketches).
    security : TransportSecurity
        The owner's certificate, for the health check.
    service : str or None
        ``host:port`` of the owner's own service (``None``: not known, no check).
    identity : Identity
        The owner's identity (what its service's certificate must carry).
    """

    data_dir: Path
    security: TransportSecurity
    service: str | None
    identity: Identity

    def __post_init__(self) -> None:
        self.prober = Prober(self.security)

    def charges_chart(self, entries: list[dict[str, Any]]) -> str:
        """The chart of ``entries`` (:meth:`view`'s charges, oldest first): cumulative ε and raw
        points over time, as inline SVG; "" before the first charge. Drawn once per change of
        the ledger's charges (:func:`~dpmarket.console.plots.charges_plot` keeps it)."""
        if not entries:
            return ""
        return plots.charges_plot(
            [e["at"] for e in entries],
            [e["epsilon"] or 0.0 for e in entries],
            [e["points"] for e in entries],
            title=f"charges to {self.identity.name}'s ledger over time (UTC)",
        )

    def start_warming(self) -> threading.Thread:
        """Read the page once in the background (a daemon thread): its chart drawn and the
        health check's channel open (its TLS handshake done) before the first fetch; a ledger
        not there yet draws nothing (the page says so)."""

        def warm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.charges_chart(self.view()["entries"])

        thread = threading.Thread(target=warm, name="owner-chart", daemon=True)
        thread.start()
        return thread

    def view(self) -> dict[str, Any]:
        """Everything the owner's page shows.

        Returns
        -------
        dict
            ``window`` (its description), ``gauges`` (ε, δ, points over the window), ``session
            limits``, ``entries`` (charges, oldest first), ``sessions`` (per session: consumer,
            curator, mechanisms, ε, δ, points, first and last charge), ``sketches``
            (``spec``, ``epsilon``, ``delivered_to``), ``policy`` (read-only fields),
            ``earnings`` (:func:`earnings_view`: the recorded statements and their total),
            ``prices`` (:func:`price_rows`), ``health``
            (:class:`~dpmarket.console.probe.Probe` or None), ``ledger`` (path).

        Raises
        ------
        FileNotFoundError
            If the data directory holds no ledger yet (the owner has not started).
        """
        if not ledger_path(self.data_dir).is_file():
            raise FileNotFoundError(
                f"{self.data_dir} holds no owner ledger yet: start the owner (owner serve) once"
            )
        with OwnerLedger(self.data_dir, None) as book:
            report = ledger_report(book)
            published = SketchPublisher(book).published()
            policy = book.policy
            earned = Earnings(book, book.identity.owner or self.identity.name).all()
        budget = report["budget"]
        gauges = [
            gauge("ε", budget["epsilon"]["spent"], budget["epsilon"]["limit"]),
            gauge("δ", budget["delta"]["spent"], budget["delta"]["limit"]),
            gauge("raw points", budget["points"]["spent"], budget["points"]["limit"]),
        ]
        sessions: dict[str, dict[str, Any]] = {}
        for e in report["entries"]:
            s = sessions.setdefault(
                e["session"],
                {
                    "session": e["session"],
                    "short": short_session(e["session"]),
                    "consumer": e["consumer"],
                    "curator": e["curator"],
                    "mechanisms": [],
                    "epsilon": 0.0,
                    "delta": 0.0,
                    "points": 0,
                    "non_private": False,
                    "first": e["time"],
                    "last": e["time"],
                },
            )
            if e["mechanism"] not in s["mechanisms"]:
                s["mechanisms"].append(e["mechanism"])
            s["epsilon"] += e["epsilon"] or 0.0
            s["delta"] += e["delta"]
            s["points"] += e["points"]
            s["non_private"] |= e["non_private"]
            s["last"] = e["time"]
        health: Probe | None = None
        if self.service is not None:
            health = self.prober.check(self.service, self.identity)
        return {
            "ledger": report["ledger"],
            "window": report["window"],
            "gauges": gauges,
            "session_limits": {
                "epsilon": policy.epsilon_per_session,
                "delta": policy.delta_per_session,
                "points": policy.points_per_session,
            },
            "non_private": budget["non_private"],
            "entries": report["entries"],
            "sessions": sorted(sessions.values(), key=lambda s: s["last"], reverse=True),
            "sketches": [
                {"spec": spec, "key": key, "epsilon": eps, "delivered_to": list(curators)}
                for spec, key, eps, curators in published
            ],
            "policy": _policy_rows(report["policy"]),
            "earnings": earnings_view(earned),
            "prices": price_rows(policy.prices),
            "health": health,
            "read_at": time.time(),
        }


def earnings_view(earned: list[Earning]) -> dict[str, Any]:
    """The earnings panel: ``{"rows": [...], "total": credits text, "count"}``, the newest
    statement first; each row ``{"session", "short", "consumer", "curator", "charge", "reward",
    "total"`` (credits text), ``"recorded_at"`` (Unix seconds), ``"read", "delivered",
    "epsilon"}`` (the owner's line of the statement: raw points read and delivered, ε charged
    for the session and its payout)."""
    rows = []
    for e in reversed(earned):
        line = e.statement.line
        rows.append(
            {
                "session": e.session,
                "short": short_session(e.session),
                "consumer": e.consumer.removeprefix("consumer:"),
                "curator": e.curator.removeprefix("curator:"),
                "read": line.points_read,
                "delivered": line.points_delivered,
                "epsilon": (line.epsilon_session + line.epsilon_payout) / EPSILON_UNITS,
                "charge": credits_text(e.charge),
                "reward": credits_text(e.reward),
                "total": credits_text(e.total),
                "recorded_at": e.recorded_at,
            }
        )
    return {
        "rows": rows,
        "count": len(rows),
        "total": credits_text(sum(e.total for e in earned)),
    }


def price_rows(prices: OwnerPrices) -> list[tuple[str, str]]:
    """The owner's prices as (what is priced, credits text): per raw point read, per point
    delivered, per unit of ε, the minimum per session (docs/reference.md, ``[prices]``)."""
    return [
        ("per raw point read", credits_text(prices.per_point_read)),
        ("per point delivered", credits_text(prices.per_point_delivered)),
        ("per unit of ε", credits_text(prices.per_epsilon)),
        ("minimum per session", credits_text(prices.minimum)),
    ]


def _policy_rows(policy: dict[str, Any]) -> list[tuple[str, str]]:
    """The policy's fields as (name, value text), peers' pins shortened."""
    rows = []
    for name, value in policy.items():
        if name == "peers":
            text = ", ".join(f"{peer} ({pin[:12]}…)" for peer, pin in value.items()) or "none"
        elif name == "prices":
            text = ", ".join(f"{key} {credits}" for key, credits in value.items()) + " credits"
        elif isinstance(value, list | tuple):
            text = ", ".join(str(v) for v in value) or "none"
        else:
            text = str(value)
        rows.append((name, text))
    return rows


def service_target(host: str | None, port: int | None) -> str | None:
    """Where a party's own service is reached from this machine: its configured host (a
    wildcard address means this machine) and port, or None when the port is not fixed."""
    if not port:
        return None
    if host in (None, "", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"
