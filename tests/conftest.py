"""Shared fixtures and helpers: the bundled digits scenario, small and real; a new owner
ledger, as ``dpmarket owner ledger init`` creates one; an owner ledger whose lifetime budget is
spent."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.scenarios import Scenario, digits_scenario
from owner.ledger import OwnerLedger
from owner.policy import OwnerPolicy


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


def new_ledger(data_dir: Path, policy: OwnerPolicy | None = None) -> Path:
    """Create an owner's ledger in ``data_dir`` (unbound: the first owner that serves it binds
    it), for an owner a test starts by hand; return ``data_dir``."""
    OwnerLedger.create(data_dir, policy or OwnerPolicy()).close()
    return data_dir
