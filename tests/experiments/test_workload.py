"""The counting-query workload experiment on a small synthetic table: every method answers every
query, the errors are fractions of n, MST and AIM spend exactly their zCDP budget, and the
document ends with the ratio line per table."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from rich.console import Console

from dpmarket.common.sketches.domain import Domain
from dpmarket.experiments.workload import (
    METHODS,
    Workload,
    WorkloadTable,
    _exact_marginal,
    _uniform,
    ratio_lines,
    run_table,
)


def _table(n: int = 1500) -> WorkloadTable:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, n)
    b = (a + (rng.random(n) < 0.2)) % 3
    c = rng.uniform(0.0, 4.0, n)
    x = np.column_stack([a, b, c]).astype(float)
    domain = Domain(
        np.zeros(3),
        np.array([2.0, 2.0, 4.0]),
        names=("a", "b", "c"),
        levels=(np.arange(3.0), np.arange(3.0), None),
    )
    return WorkloadTable("toy", domain, x, [1, 1, 4], 2)


def test_the_workload_holds_every_cell_and_its_ranges() -> None:
    table = _table()
    fmap = table.marginals_map()
    sizes = fmap.cells.tolist()
    workload = Workload.draw(sizes, 7, np.random.default_rng(1))
    assert (workload.kinds == "1-way").sum() == sum(sizes)
    assert (workload.kinds == "2-way").sum() == sum(
        sizes[i] * sizes[j] for i, j in itertools.combinations(range(3), 2)
    )
    assert (workload.kinds == "range").sum() == 7
    cells = fmap.cell_indices(table.records)
    truth = workload.answer(_exact_marginal(cells, sizes))
    one_way = truth[workload.kinds == "1-way"]
    assert one_way[:3].sum() == pytest.approx(1.0)  # column a's cells
    # The uniform answer of a 2-way cell of two 3-level columns is 1/9.
    uniform = workload.answer(lambda cols: _uniform(fmap, table.domain, cols))
    assert uniform[workload.kinds == "2-way"][0] == pytest.approx(1 / 9)
    # As closed ranges in the domain's units, the exact range counts agree with the cells'.
    lower, upper = workload.bounds(fmap, table.domain)
    x = table.records
    inside = ((x[None] >= lower[:, None]) & (x[None] <= upper[:, None])).all(axis=2).mean(axis=1)
    continuous_edge = np.isin(x[:, 2], fmap.edges(2)).any()
    if not continuous_edge:
        np.testing.assert_allclose(inside, truth, atol=1e-12)


@pytest.mark.slow
def test_every_method_answers_and_the_ratio_line_is_printed() -> None:
    doc = run_table(
        _table(), [0], n_ranges=10, aim_rounds=8, n_synthetic=1000, console=Console(quiet=True)
    )
    assert list(doc["mean"]) == list(METHODS)
    for method, m in doc["mean"].items():
        assert 0 <= m["all"] < 1 and math.isfinite(m["2-way"]), method
    # With data, every method beats answering without it on this strongly dependent pair.
    assert doc["mean"]["catalogue"]["2-way"] < doc["mean"]["uniform"]["2-way"]
    assert doc["mean"]["AIM"]["2-way"] < doc["mean"]["uniform"]["2-way"]
    (line,) = ratio_lines({"tables": [doc]})
    r = doc["mean"]["catalogue"]["all"] / doc["mean"]["AIM"]["all"]
    assert line == f"toy: catalogue error / AIM error = {r:.3f}"


def test_mst_measures_within_its_budget() -> None:
    """MST's measurements spend two thirds of rho (1-way marginals, then the tree's pairs; the
    selections the last third): each third is split over the marginals measured together, as
    the reference's ``measure`` does (a port that gave every marginal the third's sigma spent
    about 2d/3 times the budget)."""
    from dpmarket.common.privacy.accounting import gaussian_zcdp_rho
    from dpmarket.experiments.workload import mst

    table = _table(300)
    fmap = table.marginals_map()
    rho = 0.05
    model = mst(fmap, fmap.cell_indices(table.records), rho, np.random.default_rng(0))
    ones = [m for m in model.measurements if len(m.clique) == 1]
    pairs = [m for m in model.measurements if len(m.clique) == 2]
    assert (len(ones), len(pairs)) == (3, 2)
    for group in (ones, pairs):
        assert math.fsum(gaussian_zcdp_rho(m.sigma) for m in group) == pytest.approx(rho / 3)


def test_the_catalogue_runs_at_the_mechanisms_own_defaults() -> None:
    """Without a rule, the workload's catalogue is the mechanism an owner's declaration gets
    (its derived 1-way share and cell-weighted noise); the control, the ``fixed`` split that was
    the table's default, measures another mechanism (the share 0.2, no cell weights)."""
    from dpmarket.common.sketches.marginals import ONEWAY_SHARE, MarginalsMechanism
    from dpmarket.experiments.workload import DELTA, EPSILON, TABLES, _catalogue

    table = TABLES["Arrests"]()
    fmap = table.marginals_map()
    default = MarginalsMechanism(fmap, table.domain, EPSILON, DELTA)
    ran = _catalogue(table, fmap)
    assert (ran.measurements, ran.rounds, ran.oneway_share, ran.weight_by_cells) == (
        default.measurements,
        default.rounds,
        default.oneway_share,
        default.weight_by_cells,
    )
    fixed = WorkloadTable(table.name, table.domain, table.records, table.bins, split="fixed")
    control = _catalogue(fixed, fmap)
    assert (control.oneway_share, control.weight_by_cells) == (ONEWAY_SHARE, False)
    assert (control.oneway_share, control.weight_by_cells) != (
        default.oneway_share,
        default.weight_by_cells,
    )


@pytest.mark.parametrize(
    ("name", "shape"),
    [("NMES1988", (4406, 12)), ("PSID7682", (4165, 12)), ("Fertility", (254654, 8))],
)
def test_the_held_out_tables_load_on_their_discretisation(
    name: str, shape: tuple[int, int]
) -> None:
    """The tables never used to choose the defaults: every row kept, every value inside the
    public domain, every column with more than one cell in use."""
    from dpmarket.experiments.workload import TABLES

    table = TABLES[name]()
    assert table.records.shape == shape
    cells = table.marginals_map().cell_indices(table.records)
    assert all(np.unique(cells[:, j]).size > 1 for j in range(shape[1]))
