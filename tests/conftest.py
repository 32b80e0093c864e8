"""Shared fixtures: the bundled digits scenario, small and real."""

from __future__ import annotations

import pytest

from experiments.scenarios import Scenario, digits_scenario


@pytest.fixture(scope="session")
def digits() -> Scenario:
    """The Appendix G split of scikit-learn's digits (five owners, task 3/4)."""
    return digits_scenario(seed=0)
