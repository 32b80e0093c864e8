"""A curator's metrics (:mod:`dpmarket.runtime.metrics`): its summarization sessions by stage.

Read at every scrape from the session manager: ``dpmarket_sessions{party, stage}`` counts the
sessions it holds (running, or finished and not yet expired) at ``setup``, ``rounds``, ``done``
or ``failed``. The calls themselves, refusals included, are counted by the server's interceptor.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpmarket.curator.sessions import SessionManager

__all__ = ["CuratorCollector"]

#: Every stage, so that a stage with no session reads 0 rather than disappearing.
STAGES = ("setup", "rounds", "done", "failed")


class CuratorCollector(Collector):
    """Collects a curator's sessions by stage.

    Parameters
    ----------
    manager : SessionManager
    party : str
        The curator's identity (``curator:NAME``).
    """

    def __init__(self, manager: SessionManager, party: str) -> None:
        self.manager = manager
        self.party = party

    def collect(self) -> Iterator[Metric]:
        counts = self.manager.stages()
        sessions = GaugeMetricFamily(
            "dpmarket_sessions", "Sessions held, by stage", labels=["party", "stage"]
        )
        for stage in STAGES:
            sessions.add_metric([self.party, stage], float(counts.get(stage, 0)))  # type: ignore[call-overload]
        yield sessions
