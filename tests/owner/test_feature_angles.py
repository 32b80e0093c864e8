"""Curator-chosen feature maps cannot turn a step's status into a membership oracle.

A curator that picks h1's frequencies and phases so that ``omega . x + phase`` is huge for one
value of a column and small for the others once made the float32 cosine NaN on exactly the rows
holding that value; the local greedy then failed (INTERNAL, charged nothing) iff such a row
existed. The owner now refuses such parameters at the open, from the request and its public
schema alone, and its features are finite whatever the parameters, so even past the refusal the
same requests get the same statuses whatever the rows hold. Each test fails without its defence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpmarket.common.errors import DPMarketError, InvalidArgumentError
from dpmarket.common.fourier import ANGLE_LIMIT
from dpmarket.common.schema import Column, Schema
from dpmarket.common.summarization.kernels import feature_scaling
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.curator.policy import DEFAULT_RANGES
from dpmarket.owner import protocol
from dpmarket.owner.protocol import EMBEDDING_LIMIT, Owner
from dpmarket.runtime.tables import PointSet

N = 24
SCHEMA = Schema(
    (
        Column("kids", "integer", 0.0, 5.0),
        Column("age", "continuous", 18.0, 90.0),
        Column("income", "continuous", 0.0, 1e5),
        Column("label", "binary", 0.0, 1.0),
    ),
    "label",
)
TERMS = OwnerTerms(SessionMethod.CANDIDATES_SKETCH, 0.0, 0.0)
#: The session's feature scaling: the schema's bounds, which the owner requires of h1.
SCALING = feature_scaling(SCHEMA)
assert SCALING is not None


def _owner(with_value: bool) -> Owner:
    """Two tables of the same public shape: column ``kids`` is 0 in every row, but for one
    row that holds 2 in the second table (the one fact the crafted parameters ask about)."""
    rng = np.random.default_rng(3)
    x = np.column_stack(
        [np.zeros(N), rng.uniform(18, 90, N), rng.uniform(0, 1e5, N)],
    )
    if with_value:
        x[7, 0] = 2.0
    return Owner("o", PointSet(x, rng.integers(0, 2, N), "o"), schema=SCHEMA)


def _crafted() -> RFFParams:
    """The stranger's kind of parameters, scaled down: a frequency of 3e299 on ``kids`` and
    small phases, so the angle is the phase at ``kids = 0`` and 6e299 at ``kids = 2`` (before
    the fix: its float64 reduction left ~1e283, an infinite float32 angle, a NaN feature)."""
    omega = np.zeros((2, 3))
    omega[:, 0] = 3e299
    return RFFParams(omega=omega, phase=np.array([0.5, 1.0]), gamma=1.0, scaling=SCALING)


def _outcome(step: Callable[[], Any]) -> str:
    try:
        step()
    except (DPMarketError, ValueError) as exc:
        return type(exc).__name__
    return "ok"


def _session(owner: Owner, rff: RFFParams) -> list[str]:
    """Open, embed, propose one candidate: each step's outcome."""
    g = np.full(rff.d, 0.1)
    return [
        _outcome(lambda: owner.open_session("s", rff, 0, terms=TERMS)),
        _outcome(lambda: owner.set_validation_embedding("s", g)),
        _outcome(lambda: owner.propose_candidates("s", 1)),
    ]


def test_crafted_h1_parameters_are_refused_at_the_open_before_any_row_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the owner computed features of its rows")

    monkeypatch.setattr(Owner, "_features", staticmethod(no_read))
    for with_value in (False, True):
        owner = _owner(with_value)
        with pytest.raises(InvalidArgumentError, match=r"h1 row \d+ reaches an angle"):
            owner.open_session("s", _crafted(), 0, terms=TERMS)
        assert owner.sessions == {}


def test_without_the_refusal_the_steps_answer_alike_whatever_the_rows_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The refusal off: the features themselves are finite (an angle beyond the limit is 0), so
    # the greedy succeeds on both tables. Before the fix the second table's proposal failed.
    monkeypatch.setattr(protocol, "check_angle_bound", lambda *a, **k: None)
    seen = [_session(_owner(with_value), _crafted()) for with_value in (False, True)]
    assert seen[0] == seen[1] == ["ok", "ok", "ok"]


def test_honest_parameters_at_the_largest_gamma_and_dimension_pass() -> None:
    gamma = DEFAULT_RANGES["gamma"][1]
    d = int(DEFAULT_RANGES["rff_dimension"][1])
    owner = _owner(True)
    for seed in range(3):
        rff = draw_rff_params(3, d, gamma, np.random.default_rng(seed), scaling=SCALING)
        assert _session(owner, rff) == ["ok", "ok", "ok"]
        owner.close_session("s")


def test_an_angle_just_within_the_limit_passes_and_one_beyond_is_refused() -> None:
    # |omega|_1 * max|z| + |phase| at the schema's bounds, h1 reading every feature scaled to
    # [0, 1] by them: max|z| = 1.
    for scale, expected in ((0.999, "ok"), (1.001, "InvalidArgumentError")):
        omega = np.array([[0.0, 0.0, scale * (ANGLE_LIMIT - 1.0)]])
        rff = RFFParams(omega=omega, phase=np.array([1.0]), gamma=1.0, scaling=SCALING)
        owner = _owner(False)
        assert _outcome(functools.partial(owner.open_session, "s", rff, 0, terms=TERMS)) == expected


def _opened(with_value: bool) -> Owner:
    """An owner (its table with or without the value) with session "s" open."""
    owner = _owner(with_value)
    rff = draw_rff_params(3, 8, 1e-6, np.random.default_rng(0), scaling=SCALING)
    owner.open_session("s", rff, 0, terms=TERMS)
    return owner


def _embedding_outcome(owner: Owner, entry: float) -> str:
    """The outcome of a validation embedding holding ``entry`` (the rest 0.1)."""
    g = np.full(8, 0.1)
    g[3] = entry
    return _outcome(functools.partial(owner.set_validation_embedding, "s", g))


@pytest.mark.parametrize("entry", [EMBEDDING_LIMIT * 10, 1e30, -1e300])
def test_an_embedding_beyond_its_limit_is_refused_alike(entry: float) -> None:
    outcomes = [_embedding_outcome(_opened(with_value), entry) for with_value in (False, True)]
    assert outcomes == ["InvalidArgumentError"] * 2


def _tiny_frequency() -> RFFParams:
    """The stranger's subnormal kind (a frequency of 1e-310 on ``kids``, inside every bound): its
    product with a row's value is subnormal exactly where ``kids != 0``, so the open's time
    counted those rows."""
    omega = np.full((2, 3), 0.01)
    omega[:, 0] = 1e-310
    return RFFParams(omega=omega, phase=np.array([0.5, 1.0]), gamma=1.0, scaling=SCALING)


def test_subnormal_h1_parameters_are_refused_at_the_open_before_any_row_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the owner computed features of its rows")

    monkeypatch.setattr(Owner, "_features", staticmethod(no_read))
    tiny_phase = RFFParams(
        omega=np.full((2, 3), 0.01), phase=np.array([1e-300, 1.0]), gamma=1.0, scaling=SCALING
    )
    for rff, what in ((_tiny_frequency(), "h1 frequencies"), (tiny_phase, "h1 phases")):
        for with_value in (False, True):
            owner = _owner(with_value)
            with pytest.raises(InvalidArgumentError, match=f"{what} holds [12] non-zero value"):
                owner.open_session("s", rff, 0, terms=TERMS)
            assert owner.sessions == {}


def test_without_the_floor_the_open_reads_rows_whose_products_are_subnormal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The control: with the floor off the open computes h1 on the rows, and the number of
    # subnormal products omega_ij x_j (the slow operations) is the number of rows with kids != 0.
    monkeypatch.setattr(protocol, "check_not_tiny", lambda *a, **k: None)
    rff = _tiny_frequency()
    tiny = np.finfo(np.float64).tiny
    counts = []
    for with_value in (False, True):
        owner = _owner(with_value)
        assert _outcome(functools.partial(owner.open_session, "s", rff, 0, terms=TERMS)) == "ok"
        assert isinstance(owner.data, PointSet)
        products = owner.data.features[:, :1] * rff.omega[:, 0]
        counts.append(int(((products != 0) & (np.abs(products) < tiny)).sum()))
    assert counts == [0, rff.d]


@pytest.mark.parametrize("entry", [1e-310, -1e-40, 1e-21])
def test_an_embedding_or_threshold_below_the_floor_is_refused_alike(entry: float) -> None:
    outcomes = []
    for with_value in (False, True):
        owner = _opened(with_value)
        outcomes.append(_embedding_outcome(owner, entry))
        sigma = functools.partial(
            owner.set_validation_embedding, "s", np.full(8, 0.1), shrinkage_sigma=abs(entry)
        )
        outcomes.append(_outcome(sigma))
        owner.set_validation_embedding("s", np.full(8, 0.1))
        session = owner.session("s")
        outcomes.append(_outcome(functools.partial(session.relevant_count, entry)))
        assert _outcome(functools.partial(session.relevant_count, 0.0)) == "ok"
    assert outcomes == ["InvalidArgumentError"] * 6
