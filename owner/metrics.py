"""An owner's metrics (:mod:`dpmarket.runtime.metrics`), from its own ledger and sessions.

Read at every scrape, at the owner only (its operator's Prometheus): the budget spent and its
limit over the policy's window (``dpmarket_owner_budget_spent`` and ``_limit``, by ``quantity``:
``epsilon``, ``delta``, ``points``; ``window``: ``lifetime`` or ``Nd``), the charges recorded
(``dpmarket_owner_charges_total``) and the open summarization sessions by the step they stand at
(``dpmarket_sessions{party, stage}``). Every value is what the ledger or the session table
already records; nothing else about the data.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.protocol import Owner
from dpmarket.owner.steps import SessionSteps

__all__ = ["OwnerCollector", "window_label"]


def window_label(days: float) -> str:
    """``"lifetime"`` for a lifetime budget, else ``"<days>d"``."""
    return "lifetime" if days == 0 else f"{days:g}d"


class OwnerCollector(Collector):
    """Collects one owner's budget, charges and open sessions.

    Parameters
    ----------
    owner : Owner
        With its ledger (an owner without one exports its sessions only).
    """

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        party = f"owner:{self.owner.owner_id}"
        ledger: OwnerLedger | None = self.owner.ledger
        if ledger is not None:
            policy = ledger.policy
            spent = ledger.window_totals()
            window = window_label(policy.window_days)
            labels = ["owner", "window", "quantity"]
            used = GaugeMetricFamily(
                "dpmarket_owner_budget_spent",
                "What the owner's ledger has charged over its policy's window",
                labels=labels,
            )
            limit = GaugeMetricFamily(
                "dpmarket_owner_budget_limit",
                "The owner's policy's budget over its window",
                labels=labels,
            )
            name = self.owner.owner_id
            for quantity, value, bound in (
                ("epsilon", spent.epsilon, policy.epsilon_total),
                ("delta", spent.delta, policy.delta_total),
                ("points", float(spent.points), float(policy.points_total)),
            ):
                used.add_metric([name, window, quantity], value)
                limit.add_metric([name, window, quantity], bound)
            yield used
            yield limit
            (count,) = ledger.read(lambda c: c.execute("SELECT COUNT(*) FROM charges").fetchone())
            charges = CounterMetricFamily(
                "dpmarket_owner_charges", "Charges the owner's ledger recorded", labels=["owner"]
            )
            charges.add_metric([name], float(count))
            yield charges
        stages = Counter(
            "answered"
            if s.steps.position >= len(s.steps.steps)
            else s.steps.steps[s.steps.position].value
            for s in self.owner.sessions.values()
        )
        sessions = GaugeMetricFamily(
            "dpmarket_sessions",
            "Open sessions by the step they stand at",
            labels=["party", "stage"],
        )
        for stage, n in sorted(stages.items()):
            sessions.add_metric([party, stage], float(n))
        yield sessions


def _stage(steps: SessionSteps) -> str:
    """The step a session stands at (its next step), or ``answered`` past its last."""
    if steps.position >= len(steps.steps):
        return "answered"
    return steps.steps[steps.position].value
