"""Shared fixtures and helpers: the bundled digits scenario, small and real; an owner ledger
whose lifetime budget is spent."""

from __future__ import annotations

import pytest

from dpmarket.experiments.scenarios import Scenario, digits_scenario
from dpmarket.owner.ledger import OwnerLedger


@pytest.fixture(scope="session")
def digits() -> Scenario:
    """The Appendix G split of scikit-learn's digits (five owners, task 3/4)."""
    return digits_scenario(seed=0)


def exhaust(ledger: OwnerLedger) -> None:
    """Spend the default lifetime budget (epsilon 10) on five earlier sessions of epsilon 2."""
    for j in range(5):
        ledger.charge(
            session=f"earlier-{j}",
            consumer="consumer:bob",
            curator="curator:curator",
            mechanism="Laplace relevance count",
            epsilon=2.0,
            delta=0.0,
            points=0,
        )
