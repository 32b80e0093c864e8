"""What the curator's console reads: its owners' health, its sessions, its catalogue, its load.

Everything but the health checks comes from the curator's own store, read as ``dpmarket curator
sessions`` reads it (:class:`dpmarket.curator.store.CuratorRecords`) and from its catalogue
(:class:`dpmarket.curator.sketches.SketchCatalog`); each owner is asked one ``grpc.health.v1``
Check per page, over mTLS with the curator's certificate, and the curator's own service whether
its channel to each owner is connected (its health service's ``owner:NAME``). What the page
shows is what the curator holds about each party: who asked for what, when, how it ended and
what it charged; never a summary's points, a consumer's validation set or an owner's ledger.

Extension point
---------------
**Statements** (the market): the curator's signed settlement statements are stored
with their sessions; :meth:`CuratorConsole.view`'s ``sessions`` rows are where a statement's
totals go, and the session table has a column for them once they exist.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpmarket.console import plots
from dpmarket.console.consumer import age_text
from dpmarket.console.probe import Probe, Prober
from dpmarket.curator.owners import OWNER_HEALTH_PREFIX
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.curator.store import DATABASE_FILE, CuratorRecords
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

__all__ = ["CuratorConsole"]

#: Hours of request history the rate plot shows.
RATE_HOURS = 24


@dataclass
class CuratorConsole:
    """The curator's side of the console.

    Parameters
    ----------
    data_dir : Path
        The curator's data directory (``curator.sqlite3``).
    security : TransportSecurity
        The curator's certificate, for the owners' health checks.
    owners : sequence of (Identity, str)
        Each configured owner and its address (``curator serve --owner NAME@HOST:PORT``).
    service : str or None
        ``host:port`` of the curator's own service, whose health service reports each owner's
        channel (``owner:NAME``: SERVING while connected); None: not asked.
    identity : Identity or None
        The curator's identity (what its service's certificate carries).
    """

    data_dir: Path
    security: TransportSecurity
    owners: Sequence[tuple[Identity, str]]
    service: str | None = None
    identity: Identity | None = None
    #: Last time each owner answered a health check of this console (Unix seconds).
    last_up: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prober = Prober(self.security)

    def rate_chart(self, rates: dict[str, Any]) -> str:
        """The page's chart of ``rates`` (:meth:`view`'s; :func:`~dpmarket.console.plots.
        rate_plot` keeps it, so the same numbers draw once)."""
        return plots.rate_plot(
            rates["hours"], rates["counts"], title="requests per hour (UTC), by consumer"
        )

    def start_warming(self) -> threading.Thread:
        """Read the page once in the background (a daemon thread): its chart drawn, the
        store read and the health checks' channels open (their TLS handshakes done) before
        the first fetch (which took 0.9-1.7 s on a loaded machine without it); a store not
        there yet draws nothing (the page says so)."""

        def warm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.rate_chart(self.view()["rates"])

        thread = threading.Thread(target=warm, name="curator-chart", daemon=True)
        thread.start()
        return thread

    def probes(self) -> list[tuple[Probe, Probe | None]]:
        """Per owner, concurrently: its own answer to a health check, and (with ``service``)
        whether the curator's service holds a connected channel to it."""
        if not self.owners:
            return []

        def both(owner: tuple[Identity, str]) -> tuple[Probe, Probe | None]:
            own = self.prober.check(owner[1], owner[0])
            link = None
            if self.service is not None:
                link = self.prober.check(
                    self.service, self.identity, OWNER_HEALTH_PREFIX + owner[0].name
                )
            return own, link

        with ThreadPoolExecutor(max_workers=min(16, len(self.owners))) as pool:
            found = list(pool.map(both, self.owners))
        for (identity, _), (result, _) in zip(self.owners, found, strict=True):
            if result.up:
                self.last_up[identity.name] = result.at
        return found

    def view(self) -> dict[str, Any]:
        """Everything the curator's page shows.

        Returns
        -------
        dict
            ``owners`` (name, address, health, the curator's channel to it, last seen up,
            last session, last publication), ``running`` and ``sessions`` (newest first, as
            ``curator sessions``), ``catalogue`` (spec, owner, ε, age), ``rates`` (requests
            per hour and per consumer over the last :data:`RATE_HOURS` hours).

        Raises
        ------
        FileNotFoundError
            If the data directory holds no curator store yet.
        """
        if not (self.data_dir / DATABASE_FILE).is_file():
            raise FileNotFoundError(
                f"{self.data_dir} holds no curator store yet: start the curator once"
            )
        now = time.time()
        with CuratorRecords(self.data_dir) as records:
            sessions = records.sessions()
        with SketchCatalog(self.data_dir) as catalog:
            catalogue: list[dict[str, Any]] = [
                {
                    "spec": e.spec,
                    "owner": e.owner,
                    "epsilon": e.sketch.mechanism.epsilon,
                    "published_at": e.published_at,
                    "age": age_text(now - e.published_at),
                }
                for spec in catalog.specs()
                for e in catalog.sketches(spec.name)
            ]
        sessions.reverse()  # newest first
        health = self.probes()
        rows = []
        for (identity, target), (result, link) in zip(self.owners, health, strict=True):
            name = identity.name
            last_session = next((s["created"] for s in sessions if name not in s["left_out"]), None)
            published: list[float] = [c["published_at"] for c in catalogue if c["owner"] == name]
            rows.append(
                {
                    "name": name,
                    "target": target,
                    "health": result,
                    "link": link,
                    "last_up": _ago(now, self.last_up.get(name)),
                    "last_session": last_session,
                    "last_publication": _ago(now, max(published) if published else None),
                }
            )
        return {
            "owners": rows,
            "running": [s for s in sessions if s["status"] == "running"],
            "sessions": sessions[:100],
            "catalogue": catalogue,
            "rates": _rates(sessions, now),
            "read_at": now,
        }


def _ago(now: float, at: float | None) -> str:
    return "never" if at is None else f"{age_text(now - at)} ago"


def _rates(sessions: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Requests (sessions and jobs created) per hour of the last :data:`RATE_HOURS` hours, by
    consumer, and totals over the last hour and day."""
    start = int(now // 3600) - RATE_HOURS + 1
    hours = [
        datetime.fromtimestamp((start + k) * 3600, UTC).strftime("%H:00") for k in range(RATE_HOURS)
    ]
    counts: dict[str, list[int]] = {}
    last_hour = Counter[str]()
    for s in sessions:
        created = datetime.fromisoformat(s["created"].replace("Z", "+00:00")).timestamp()
        slot = int(created // 3600) - start
        who = s["consumer"].removeprefix("consumer:")
        if 0 <= slot < RATE_HOURS:
            counts.setdefault(who, [0] * RATE_HOURS)[slot] += 1
        if now - created <= 3600:
            last_hour[who] += 1
    return {
        "hours": hours,
        "counts": counts,
        "last_hour": sum(last_hour.values()),
        "last_day": sum(sum(v) for v in counts.values()),
        "by_consumer": {who: sum(v) for who, v in sorted(counts.items())},
    }
