"""The owner's protocol state: stages, bids, releases, uniform samples, errors."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from dpmarket.common.summarization.kernels import bid_direction
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet

D = 32
ROUNDS = OwnerTerms(SessionMethod.PRIVATE, 1.0, 1e-6, max_rounds=100)
UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)


@pytest.fixture
def owner() -> Owner:
    rng = np.random.default_rng(0)
    return Owner("o", PointSet(rng.normal(size=(40, 3)), np.arange(40) % 2, "o"))


@pytest.fixture
def rff():
    return draw_rff_params(3, D, 0.5, np.random.default_rng(1))


def _open(owner: Owner, rff, sid: str = "s"):
    owner.open_session(sid, rff, 7, terms=ROUNDS)
    session = owner.session(sid)
    session.set_validation_embedding(np.full(D, 0.01))
    return session


def test_bid_is_the_argmax_of_the_corrected_score(owner: Owner, rff) -> None:
    session = _open(owner, rff)
    assert isinstance(owner.data, PointSet)
    g_val = random_fourier_features(owner.data.features[:5], rff, dtype=np.float64).mean(axis=0)
    session.validation_embedding = g_val
    g_sum = random_fourier_features(owner.data.features[10:12], rff, dtype=np.float64).mean(0)
    bid = session.bid(1, g_sum, 2)
    assert bid is not None and bid.times_best == 1
    feats = random_fourier_features(owner.data.features, rff)
    scores = feats @ bid_direction(g_val, g_sum, 2)
    assert bid.bid == pytest.approx(float(scores.max()), rel=1e-6)


def test_never_reoffers_a_sent_point(owner: Owner, rff) -> None:
    session = _open(owner, rff)
    released = []
    for round_ in range(1, 41):
        bid = session.bid(round_, np.zeros(D), 0)
        assert bid is not None
        point = owner.release_point("s", round_).point
        released.append(tuple(point))
    assert len(set(released)) == 40
    assert session.bid(41, np.zeros(D), 0) is None


def test_times_best_counts_consecutive_rounds_and_resets_on_release(owner: Owner, rff) -> None:
    session = _open(owner, rff)
    counts = [session.bid(r, np.zeros(D), 0).times_best for r in (1, 2, 3)]
    assert counts == [1, 2, 3]
    owner.release_point("s", 3)
    assert session.bid(4, np.zeros(D), 0).times_best == 1


def test_stages_out_of_order_fail(owner: Owner, rff) -> None:
    owner.open_session("s", rff, 0, terms=ROUNDS)
    session = owner.session("s")
    with pytest.raises(FailedPreconditionError, match="after SetValidationEmbedding"):
        session.bid(1, np.zeros(D), 0)
    session.set_validation_embedding(np.zeros(D))
    with pytest.raises(FailedPreconditionError, match="expected round 1"):
        session.bid(2, np.zeros(D), 0)
    with pytest.raises(FailedPreconditionError, match="last round bid"):
        owner.release_point("s", 1)
    session.bid(1, np.zeros(D), 0)
    with pytest.raises(FailedPreconditionError, match="set once per session"):
        session.set_validation_embedding(np.ones(D))
    owner.release_point("s", 1)
    with pytest.raises(FailedPreconditionError, match="no unsent point was bid"):
        owner.release_point("s", 1)


def test_bad_input_is_rejected_and_changes_nothing(owner: Owner, rff) -> None:
    session = _open(owner, rff)
    with pytest.raises(InvalidArgumentError, match="length"):
        session.bid(1, np.zeros(D + 1), 0)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        session.bid(1, np.full(D, np.nan), 0)
    with pytest.raises(InvalidArgumentError, match="summary_size"):
        session.bid(1, np.zeros(D), -1)
    assert session.round == 0 and not session.sent.any()
    assert session.bid(1, np.zeros(D), 0) is not None


def test_session_errors(owner: Owner, rff) -> None:
    owner.open_session("s", rff, 0, terms=UNIFORM)
    with pytest.raises(AlreadyExistsError):
        owner.open_session("s", rff, 0, terms=UNIFORM)
    with pytest.raises(NotFoundError, match="unknown session"):
        owner.session("nope")
    wrong = draw_rff_params(4, D, 0.5, np.random.default_rng(1))
    with pytest.raises(InvalidArgumentError, match="4 columns"):
        owner.open_session("t", wrong, 0, terms=UNIFORM)
    owner.close_session("s")
    with pytest.raises(NotFoundError):
        owner.close_session("s")


def test_uniform_sample_is_without_replacement_and_bounded(owner: Owner, rff) -> None:
    owner.open_session("s", rff, 3, terms=UNIFORM)
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        owner.sample_uniform("s", 41)
    with pytest.raises(InvalidArgumentError, match="count"):
        owner.sample_uniform("s", 0)
    points, labels = owner.sample_uniform("s", 40)
    assert len({tuple(r) for r in points}) == 40
    assert labels is not None


def test_a_bid_is_quick_only_in_memory_after_the_terms_and_with_the_session_idle(
    owner: Owner, rff, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service runs a bid on its event loop only when it reads a small table's features in
    memory, writes no ledger (the first bid charges the terms) and waits for no other step."""
    session = _open(owner, rff)
    assert not owner.quick_bid("s")  # the first bid charges the session's terms
    session.bid(1, np.zeros(D), 0)
    assert owner.quick_bid("s")
    with owner._step("s", "curator:local"):  # another step of the session is running
        assert not owner.quick_bid("s")
    monkeypatch.setattr("dpmarket.owner.protocol.QUICK_STEP_BYTES", session.features.nbytes - 1)
    assert not owner.quick_bid("s")
    with pytest.raises(NotFoundError):
        owner.quick_bid("s", curator="curator:other")
