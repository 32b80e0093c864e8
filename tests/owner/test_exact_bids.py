"""An owner serves exact bids only if its policy trusts the curator with them (issue 25, attack 2).

The per-round methods answer every Bid with the exact score of the owner's best point for a
direction the curator chooses; their epsilon pays for what the curator releases, not for the
bids it sees. The red team read a column's exact largest and smallest values with two bids under
terms of epsilon 1e-9 (and had terms of 100,000 or 10**12 rounds accepted). Every test runs an
:class:`~dpmarket.owner.protocol.Owner` with its real durable ledger, called as a deviating
curator would call it (the networked attack: ``tests/integration/test_trust.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dpmarket.common.errors import BudgetRefusedError, FailedPreconditionError
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet
from tests.conftest import ColumnProbe

D = 8
N_POINTS = 40
#: floor(0.25 * 40): the most raw points one session may receive under the default fraction.
ALLOWANCE = 10
COLUMN = 1
PROBE = ColumnProbe(3, D, (COLUMN,), scale=2.0)  # the data lie in [0, 1]
#: What the red team's terms stated (a1_order.py, a2_bid_tiny_eps.py).
RED_TEAM_TERMS = {
    "private 1e-9, 100000 rounds": OwnerTerms(SessionMethod.PRIVATE, 1e-9, 0.0, 100_000),
    "rounds 1e-300, 10**12 rounds": OwnerTerms(SessionMethod.ROUNDS, 1e-300, 0.0, 10**12),
    "private 1e-9, 2 rounds": OwnerTerms(SessionMethod.PRIVATE, 1e-9, 0.0, 2),
    "greedy": OwnerTerms(SessionMethod.GREEDY, math.inf, 0.0, 2),
}


@pytest.fixture
def data() -> PointSet:
    rng = np.random.default_rng(3)
    return PointSet(rng.uniform(0.0, 1.0, size=(N_POINTS, 3)), np.arange(N_POINTS) % 2, "o")


def _owner(data: PointSet, tmp_path: Path, **policy: object) -> tuple[Owner, OwnerLedger]:
    ledger = OwnerLedger.create(tmp_path / "owner", OwnerPolicy(**policy))  # type: ignore[arg-type]
    return Owner("o", data, ledger=ledger), ledger


def _read_extremes(owner: Owner, sid: str) -> list[float]:
    """The deviating curator's two bids: the column's largest, then its smallest value."""
    owner.set_validation_embedding(sid, np.zeros(D))
    out = []
    for round_, largest in ((1, True), (2, False)):
        bid = owner.bid(sid, round_, PROBE.summary_embedding(0, largest), 1)
        assert bid is not None
        out.append(PROBE.value(bid.bid, largest))
    return out


@pytest.mark.parametrize("name", list(RED_TEAM_TERMS))
def test_terms_that_answer_exact_bids_are_refused_by_default_and_charge_nothing(
    data: PointSet, tmp_path: Path, name: str
) -> None:
    owner, ledger = _owner(data, tmp_path, allow_non_private=True)
    with pytest.raises(FailedPreconditionError, match=r"access\.allow_exact_bids = false") as info:
        owner.open_session("s", PROBE.rff, 0, terms=RED_TEAM_TERMS[name])
    # A refusal of the policy, decided on the terms alone: its text may reach a consumer.
    assert not isinstance(info.value, BudgetRefusedError)
    assert ledger.entries() == [] and owner.sessions == {}


def test_an_owner_that_trusts_its_curator_with_exact_bids_gives_the_column_extremes(
    data: PointSet, tmp_path: Path
) -> None:
    """Control: with the opt-in, two bids at epsilon 1e-9 read the column's exact extremes
    (what the default refuses), and the ledger records only the terms' 1e-9."""
    owner, ledger = _owner(data, tmp_path, allow_exact_bids=True)
    owner.open_session("s", PROBE.rff, 0, terms=RED_TEAM_TERMS["private 1e-9, 2 rounds"])
    read = _read_extremes(owner, "s")
    column = data.features[:, COLUMN]
    np.testing.assert_allclose(read, [column.max(), column.min()], atol=1e-5)
    assert [(e.epsilon, e.delta, e.points) for e in ledger.entries()] == [(1e-9, 0.0, 0)]


@pytest.mark.parametrize(("per_point", "accepted"), [(1, ALLOWANCE), (3, 3 * ALLOWANCE)])
def test_terms_ask_at_most_rounds_per_point_rounds_per_point_of_the_allowance(
    data: PointSet, tmp_path: Path, per_point: int, accepted: int
) -> None:
    owner, ledger = _owner(data, tmp_path, allow_exact_bids=True, rounds_per_point=per_point)
    for rounds in (accepted + 1, 100_000, 10**12):
        terms = OwnerTerms(SessionMethod.PRIVATE, 0.5, 1e-7, rounds)
        with pytest.raises(BudgetRefusedError, match=r"session\.rounds_per_point") as info:
            owner.open_session(f"r{rounds}", PROBE.rff, 0, terms=terms)
        assert f"up to {rounds} Bid rounds" in str(info.value)
        assert f"({ALLOWANCE}): {accepted} rounds" in str(info.value)
    assert ledger.entries() == [] and owner.sessions == {}
    terms = OwnerTerms(SessionMethod.PRIVATE, 0.5, 1e-7, accepted)
    assert owner.open_session("ok", PROBE.rff, 0, terms=terms) == (N_POINTS, ALLOWANCE)


def test_the_rounds_bound_follows_what_the_session_may_still_receive(
    data: PointSet, tmp_path: Path
) -> None:
    """A session id reopened after it received points gets only what is left of its share:
    its rounds are bounded by that."""
    owner, _ = _owner(data, tmp_path, allow_exact_bids=True)
    uniform = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
    owner.open_session("s", PROBE.rff, 0, terms=uniform)
    owner.sample_uniform("s", 4)
    owner.close_session("s")
    with pytest.raises(BudgetRefusedError, match=r"\(6\): 6 rounds"):
        owner.open_session("s", PROBE.rff, 0, terms=OwnerTerms(SessionMethod.PRIVATE, 0.5, 0, 7))


def test_the_candidates_order_statistic_is_charged_as_a_point_only(
    data: PointSet, tmp_path: Path
) -> None:
    """The known limitation (docs/how-it-works.md, trust model): the candidates method's local
    greedy follows a direction the curator gives, so a curator steering it receives the row
    with a column's largest value, which reveals that the row beats every other on it. The
    owner charges the row as a raw point (epsilon 0) and nothing for the order; the session's
    point allowance bounds how many rows, hence how many such comparisons, it gets."""
    owner, ledger = _owner(data, tmp_path)
    sketch = OwnerTerms(SessionMethod.CANDIDATES_SKETCH, 0.0, 0.0)
    column = data.features[:, COLUMN]
    for sid, sign, expected in (("max", -1.0, column.argmax()), ("min", 1.0, column.argmin())):
        owner.open_session(sid, PROBE.rff, 0, terms=sketch)
        owner.set_validation_embedding(sid, np.full(D, sign))
        (index,) = owner.session(sid).propose_candidates(1)
        assert index == expected
    assert [(e.epsilon, e.delta, e.points) for e in ledger.entries()] == [(0.0, 0.0, 1)] * 2
    owner.open_session("many", PROBE.rff, 0, terms=sketch)
    owner.set_validation_embedding("many", np.full(D, -1.0))
    with pytest.raises(BudgetRefusedError, match=f"may receive {ALLOWANCE} raw points"):
        owner.session("many").propose_candidates(ALLOWANCE + 1)
    assert len(ledger.entries()) == 2
