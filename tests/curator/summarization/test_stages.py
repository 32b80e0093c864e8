"""The session's stages on a bare state, without running a session or calling an owner."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.summarization.endpoints import OwnerBid, ReleasedPoint
from dpmarket.common.summarization.kernels import bid_direction, bid_scores
from dpmarket.common.summarization.methods import (
    CandidatesConfig,
    GreedyConfig,
    SummarizationConfig,
)
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.summary import SessionRequest
from dpmarket.curator.summarization.allocation import split_evenly
from dpmarket.curator.summarization.candidates import CandidatesStrategy
from dpmarket.curator.summarization.rounds import GreedyStrategy
from dpmarket.curator.summarization.state import SessionContext, SessionState
from dpmarket.owner.local import LocalOwnerEndpoint
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet


def _state(config: SummarizationConfig, n_owners: int = 4) -> SessionState:
    rng = np.random.default_rng(0)
    owners = [
        LocalOwnerEndpoint(Owner(f"owner-{k}", PointSet(rng.random((20, 3)), None, f"owner-{k}")))
        for k in range(n_owners)
    ]
    request = SessionRequest(config, rng.random((10, 3)), np.zeros((0, 3)), seed=0)
    return SessionState(request, owners, SessionContext(session_id="s"))


def test_split_evenly_gives_near_equal_shares_within_capacities() -> None:
    assert split_evenly(10, [5, 5, 5]) == [4, 3, 3]
    # A small owner gives all it has; the others share the rest evenly.
    assert split_evenly(10, [1, 100, 100]) == [1, 5, 4]
    assert split_evenly(3, [0, 2, 2]) == [0, 2, 1]
    with pytest.raises(InvalidArgumentError, match="owners hold 3 points, fewer than 4"):
        split_evenly(4, [1, 1, 1])


def test_candidate_budget_follows_the_configuration() -> None:
    config = CandidatesConfig(summary_size=10)
    strategy = CandidatesStrategy(_state(config), config)
    # max(p, floor(c p)) whatever K, with c = candidate_multiple (default 3) ...
    assert strategy.budget().total == 30
    # ... or max(p, floor(f K p)) with a candidate fraction f > 0 (K = 4 owners).
    fraction = CandidatesConfig(summary_size=10, candidate_fraction=0.5)
    assert CandidatesStrategy(_state(fraction), fraction).budget().total == 20


def test_a_released_point_must_match_its_bid() -> None:
    """Step 8: the curator recomputes a released point's bid; a mismatch or a malformed point
    is rejected and counted, every released point counts as accessed."""
    config = GreedyConfig(summary_size=2, rff_dimension=16)
    state = _state(config)
    selection = GreedyStrategy(state, config)
    rng = np.random.default_rng(1)
    rff = draw_rff_params(3, 16, config.gamma, rng)
    direction = bid_direction(rng.normal(size=16), np.zeros(16), 0)
    point = rng.random(3)
    bid = float(bid_scores(random_fourier_features(point[None, :], rff), direction)[0])

    entry = selection.verify(ReleasedPoint(point, 7, bid), 0, OwnerBid(bid, 1), rff, direction)
    assert entry is not None and entry.owner == 0 and entry.label == 7
    np.testing.assert_array_equal(entry.point, point)
    wrong = selection.verify(ReleasedPoint(point, 7, bid), 1, OwnerBid(bid + 1, 1), rff, direction)
    malformed = selection.verify(
        ReleasedPoint(np.array([np.nan, 0.0, 0.0]), None, bid), 2, OwnerBid(bid, 1), rff, direction
    )
    assert wrong is None and malformed is None
    assert state.rejected_points == 2
    assert state.points_accessed == 3


def test_every_method_has_its_strategy_and_its_progress_count() -> None:
    """The session looks a method up by its configuration's type: every registered method has a
    strategy, and the one-round methods count one round, the others p."""
    from dpmarket.common.summarization.methods import METHOD_CONFIGS, method_config
    from dpmarket.curator.summarization.session import SummarizationSession
    from dpmarket.curator.summarization.strategies import STRATEGIES

    assert set(STRATEGIES) == set(METHOD_CONFIGS.values())
    rng = np.random.default_rng(0)
    owner = LocalOwnerEndpoint(Owner("o", PointSet(rng.random((20, 3)), None, "o")))
    for name in METHOD_CONFIGS:
        config = method_config(name, summary_size=7)
        session = SummarizationSession(SessionRequest(config, rng.random((5, 3)), seed=0), [owner])
        assert isinstance(session.strategy, STRATEGIES[type(config)])
        one_round = name in ("uniform", "candidates", "hashes")
        assert session.state.total_rounds == (1 if one_round else 7)
