"""A session's kernel reads every feature scaled to [0, 1] by the schema's public bounds.

A table in raw units (columns of the digits scenario multiplied by 10^3 to 10^5 and shifted,
the schema declaring the matching bounds) gives, in process, exactly the summary of the same
table pre-scaled to [0, 1] under a unit-bounds schema: the same rows of the same owners, for
every method that reads the kernel. A unit-bounds schema gives the summary of a session without
one, bit for bit (what every session gave before the scaling existed). Control: on main the
raw-unit session was refused before any owner was opened (``gamma = 0.1 makes the RBF kernel
between typical validation points 0``, InvalidArgumentError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.schema import Column, Schema
from dpmarket.common.summarization.methods import method_config
from dpmarket.common.summarization.rff import FeatureScaling
from dpmarket.common.summarization.summary import SessionRequest, SummaryResult
from dpmarket.curator.summarization.session import SessionContext, SummarizationSession
from dpmarket.experiments.scenarios import Scenario
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet

P = 12
#: Per-column factors and offsets of the raw table: ranges that differ by up to 10^5.
FACTORS = np.resize(np.array([1e3, 1e4, 1e5, 1.0, 2.5e4]), 64)
OFFSETS = np.resize(np.array([0.0, 40.0, -3e4, 0.0, 1e3]), 64)


def _schema(low: np.ndarray, high: np.ndarray) -> Schema:
    columns = [
        Column(f"p{j}", "continuous", float(lo), float(hi))
        for j, (lo, hi) in enumerate(zip(low, high, strict=True))
    ]
    return Schema((*columns, Column("digit", "integer", 0.0, 9.0)), "digit")


def _raw(x: np.ndarray) -> np.ndarray:
    return x * FACTORS + OFFSETS


RAW_SCHEMA = _schema(OFFSETS, FACTORS + OFFSETS)
UNIT_SCHEMA = _schema(np.zeros(64), np.ones(64))
SCALING = FeatureScaling(low=OFFSETS, high=FACTORS + OFFSETS)


def _run(
    scenario: Scenario,
    method: str,
    schema: Schema | None,
    transform: Callable[[np.ndarray], np.ndarray],
    seed: int = 4,
) -> SummaryResult:
    """One in-process session over the scenario's owners, every table (and D_v and the seed
    set) passed through ``transform``, every party declaring ``schema``."""
    owners = [
        LocalOwnerEndpoint(
            Owner(o.name, PointSet(transform(o.features), o.labels, o.name), schema=schema)
        )
        for o in scenario.owners
    ]
    config = method_config(method, summary_size=P)
    request = SessionRequest(
        config,
        transform(scenario.validation),
        transform(scenario.seed_set),
        seed=seed,
        schema=schema,
    )

    async def run() -> SummaryResult:
        session = SummarizationSession(request, owners, SessionContext(session_id="scaled"))
        await session.prepare()
        return await session.run()

    return asyncio.run(run())


@pytest.mark.parametrize("method", ["candidates", "rounds", "greedy", "uniform"])
def test_a_raw_unit_table_gives_the_summary_of_the_table_pre_scaled(
    digits: Scenario, method: str
) -> None:
    """The same rows of the same owners, in the same order: the raw summary's points scaled
    by the schema's bounds are the pre-scaled summary's, bit for bit (and its labels)."""
    raw = _run(digits, method, RAW_SCHEMA, _raw)
    scaled = _run(digits, method, UNIT_SCHEMA, lambda x: SCALING.apply(_raw(x)))
    assert raw.points.shape == (P, 64)
    assert raw.owner_ids == scaled.owner_ids
    np.testing.assert_array_equal(raw.labels, scaled.labels)
    np.testing.assert_array_equal(SCALING.apply(raw.points), scaled.points)
    # The raw summary holds raw rows of its owners (nothing of the scaling leaks into it).
    tables = {o.name: _raw(o.features) for o in digits.owners}
    for point, owner in zip(raw.points, raw.owner_ids, strict=True):
        assert (tables[owner] == point).all(axis=1).any()


@pytest.mark.parametrize("method", ["candidates", "rounds"])
def test_a_unit_bounds_schema_gives_the_summary_without_one_bit_for_bit(
    digits: Scenario, method: str
) -> None:
    """Unit bounds scale every value to itself ((x - 0) / 1 == x): the summary of a session
    whose parties declare [0, 1] per feature is that of a session without a schema, which
    reads the features as they are (as every session did before the scaling)."""
    unit = _run(digits, method, UNIT_SCHEMA, lambda x: x)
    none = _run(digits, method, None, lambda x: x)
    np.testing.assert_array_equal(unit.points, none.points)
    assert unit.owner_ids == none.owner_ids
    assert unit.report.ledger.to_json() == none.report.ledger.to_json()


def test_the_raw_unit_session_checks_its_kernel_width_in_scaled_units(digits: Scenario) -> None:
    """The width check reads the scaled units too: a gamma far too large for [0, 1] features
    is refused before any owner is opened, naming the gamma of the scaled units; without the
    schema, the raw-unit validation set is refused as main refused it (the features' scale)."""
    with pytest.raises(InvalidArgumentError, match="in units of each feature scaled to"):
        _run_config(digits, RAW_SCHEMA, gamma=1e5)
    with pytest.raises(InvalidArgumentError, match="features' scale is the problem"):
        _run_config(digits, None, gamma=0.1)


def _run_config(scenario: Scenario, schema: Schema | None, *, gamma: float) -> None:
    owners = [
        LocalOwnerEndpoint(
            Owner(o.name, PointSet(_raw(o.features), o.labels, o.name), schema=schema)
        )
        for o in scenario.owners
    ]
    config = method_config("candidates", summary_size=P, gamma=gamma)
    request = SessionRequest(
        config, _raw(scenario.validation), _raw(scenario.seed_set), seed=1, schema=schema
    )

    async def prepare() -> None:
        session = SummarizationSession(request, owners, SessionContext(session_id="width"))
        await session.prepare()

    asyncio.run(prepare())
