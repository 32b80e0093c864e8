"""Smoke test of dpmarket.experiments.cape_rules: candidate intervals for undetermined capeFM fits
scored on releases drawn from the noise law."""

from __future__ import annotations

import numpy as np

from dpmarket.experiments.cape_rules import RULES, simulate


def test_every_rule_is_scored_per_coefficient_and_the_hull_contains_its_floored_part() -> None:
    """Computers' logistic regression (four coefficients), three releases: each rule's coverage
    is a fraction per coefficient; the hull is built from the floored bootstrap's own draws (the
    same generator), so it covers wherever that bootstrap does."""
    result = simulate("computers-logreg", 3)
    for rule in RULES:
        assert result[rule].shape == (4,)
        assert np.all((result[rule] >= 0.0) & (result[rule] <= 1.0))
    assert np.all(result["hull"] >= result["floored"])
    assert 0.0 <= float(result["undetermined"]) <= 1.0
    # Per release: the clipped eigenvalues, each coefficient's flag group and every rule's hits.
    assert result["clipped"].shape == (3,) and result["group"].shape == (3, 4)
    assert set(np.unique(result["group"])) <= {-1.0, 0.0, 1.0}
    for rule in RULES:
        assert result[f"{rule}_hits"].shape == (3, 4)
        assert np.allclose(result[f"{rule}_hits"].mean(axis=0), result[rule])
    # prepivoted is the hull wherever the fit is undetermined (group 1).
    undetermined = result["group"][:, 0] == 1.0
    assert np.array_equal(
        result["prepivoted_hits"][undetermined], result["hull_hits"][undetermined]
    )
