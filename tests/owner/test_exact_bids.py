"""An owner serves exact bids and steered selection only if its policy trusts the curator with
them (issue 25, attack 2).

The per-round methods answer every Bid with the exact score of the owner's best point for a
direction the curator chooses; their epsilon pays for what the curator releases, not for the
bids it sees. The red team read a column's exact largest and smallest values with two bids under
terms of epsilon 1e-9 (and had terms of 100,000 or 10**12 rounds accepted). The candidates
methods send the rows the owner's local greedy picks along the curator's embedding: a steered
one-point proposal is the row with a column's largest value, charged as a raw point only. Every
test runs an :class:`~dpmarket.owner.protocol.Owner` with its real durable ledger, called as a
deviating curator would call it (the networked attack: ``tests/integration/test_trust.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray

from dpmarket.common.errors import BudgetRefusedError, FailedPreconditionError, NotFoundError
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.hash_keys import HashKeyParty
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
    its rounds are bounded by that. (Its 4 points charged straight to the ledger, as by a
    build that kept no record of the id's first terms: a reopen under other terms than the
    first open's is refused before the rounds are counted, tests/owner/test_reopen_terms.py.)"""
    owner, ledger = _owner(data, tmp_path, allow_exact_bids=True)
    ledger.charge(
        session="s",
        consumer="consumer:local",
        curator="curator:local",
        mechanism="uniform; raw points (uniform sample)",
        epsilon=0.0,
        delta=0.0,
        points=4,
    )
    with pytest.raises(BudgetRefusedError, match=r"\(6\): 6 rounds"):
        owner.open_session("s", PROBE.rff, 0, terms=OwnerTerms(SessionMethod.PRIVATE, 0.5, 0, 7))


#: The terms of the methods that pick their rows along the curator's embedding: the
#: candidates methods by both allocations, and their hashes mode.
STEERED_TERMS = {
    "candidates-counts": OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 0.5, 0.0),
    "candidates-sketch": OwnerTerms(SessionMethod.CANDIDATES_SKETCH, 0.0, 0.0),
    "hashes-counts": OwnerTerms(SessionMethod.HASHES_COUNTS, 0.5, 0.0),
    "hashes-sketch": OwnerTerms(SessionMethod.HASHES_SKETCH, 0.0, 0.0),
}


def _hashing_owner(data: PointSet, tmp_path: Path, **policy: object) -> tuple[Owner, OwnerLedger]:
    """An owner that takes part in the hashes mode (its own hash-key identity)."""
    ledger = OwnerLedger.create(tmp_path / "owner", OwnerPolicy(**policy))  # type: ignore[arg-type]
    key = ec.generate_private_key(ec.SECP256R1())
    party = HashKeyParty("o", EcdsaSigner(key), EcdsaVerifier({"o": key.public_key()}))
    return Owner("o", data, ledger=ledger, hash_party=party), ledger


def _steered_pick(owner: Owner, sid: str, name: str, largest: bool) -> NDArray[np.float64]:
    """The deviating curator's one-point proposal, steered to the row with the column's
    largest (or smallest) value: the embedding along h1's coordinate that is monotone in the
    column; the counts allocation's count first (its step order); the hashes mode's key
    agreement first. Returns the row (raw, or its hash)."""
    owner.set_validation_embedding(sid, np.full(D, -1.0 if largest else 1.0))
    if name.endswith("counts"):
        owner.noisy_relevant_count(sid, 0.0)
    if name.startswith("hashes"):
        owner.hash_distribute(sid, {"o": owner.hash_advertise(sid)})
        hashes, _ = owner.propose_hashes(sid, 1, PROBE.rff.gamma)
        return hashes[0]
    points, _ = owner.propose_candidates(sid, 1)
    return points[0]


@pytest.mark.parametrize("name", list(STEERED_TERMS))
def test_terms_that_pick_rows_along_the_curators_embedding_are_refused_by_default(
    data: PointSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Without ``access.allow_steered_selection`` the owner refuses the candidates methods'
    terms (both allocations, and the hashes mode) when the session opens: before any work on
    the rows (h1's features, the count, the greedy), naming the key, charging nothing; the
    session's steps then find no session. The uniform method stays served."""
    owner, ledger = _hashing_owner(data, tmp_path)

    def features(*args: object) -> None:
        raise AssertionError("the refusal must come before any work on the rows")

    monkeypatch.setattr(Owner, "_features", staticmethod(features))
    with pytest.raises(FailedPreconditionError, match=r"access\.allow_steered_selection = false"):
        owner.open_session("s", PROBE.rff, 0, terms=STEERED_TERMS[name])
    with pytest.raises(NotFoundError):
        owner.set_validation_embedding("s", np.full(D, -1.0))
    with pytest.raises(NotFoundError):
        owner.noisy_relevant_count("s", 0.0)
    assert ledger.entries() == [] and owner.sessions == {}
    monkeypatch.undo()
    owner.open_session("u", PROBE.rff, 0, terms=OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0))
    owner.sample_uniform("u", 2)
    assert [(e.epsilon, e.points) for e in ledger.entries()] == [(0.0, 2)]


def test_the_refusal_of_steered_selection_says_what_to_do_and_depends_on_the_policy_only(
    data: PointSet, tmp_path: Path
) -> None:
    """A refusal of the policy (not of the budget: its text may reach a consumer), the same
    whatever the owner's budget, naming the method, the key and the way out."""
    texts = set()
    for k, policy in enumerate(({}, {"epsilon_total": 0.001, "epsilon_per_session": 0.001})):
        owner, _ = _owner(data, tmp_path / str(k), **policy)
        with pytest.raises(FailedPreconditionError) as info:
            owner.open_session("s", PROBE.rff, 0, terms=STEERED_TERMS["candidates-counts"])
        assert not isinstance(info.value, BudgetRefusedError)
        texts.add(str(info.value))
    (text,) = texts
    assert "candidates-counts method" in text
    assert "Use the uniform method" in text
    assert "set access.allow_steered_selection = true" in text


@pytest.mark.parametrize("name", list(STEERED_TERMS))
def test_an_owner_that_trusts_its_curator_with_steered_selection_gives_the_column_extremes(
    data: PointSet, tmp_path: Path, name: str
) -> None:
    """Control, and what the opt-in reveals (docs/how-it-works.md, trust model): the local
    greedy follows the curator's embedding, so a curator steering it receives the row with a
    column's largest value (another session: the smallest), which reveals that the row beats
    every other on that column. The owner charges the row as a raw point (and the count
    allocation's epsilon), nothing for the order; the session's point allowance bounds how many
    rows, hence how many such comparisons, it gets."""
    owner, ledger = _hashing_owner(data, tmp_path, allow_steered_selection=True)
    terms = STEERED_TERMS[name]
    column = data.features[:, COLUMN]
    for sid, largest, row in (("max", True, column.argmax()), ("min", False, column.argmin())):
        owner.open_session(sid, PROBE.rff, 0, terms=terms)
        picked = _steered_pick(owner, sid, name, largest)
        expected = data.features[row]
        if name.startswith("hashes"):
            key_id = owner.hash_key_id(sid)
            expected = owner.hash_points(key_id, expected[None, :], D, PROBE.rff.gamma)[0]
        np.testing.assert_array_equal(picked, expected)
    charges = [(e.epsilon, e.delta, e.points) for e in ledger.entries()]
    per_session = [(terms.epsilon, 0.0, 0)] if terms.epsilon > 0 else []
    assert charges == [*per_session, (0.0, 0.0, 1)] * 2
    if name == "candidates-sketch":
        owner.open_session("many", PROBE.rff, 0, terms=terms)
        owner.set_validation_embedding("many", np.full(D, -1.0))
        with pytest.raises(BudgetRefusedError, match=f"may receive {ALLOWANCE} raw points"):
            owner.session("many").propose_candidates(ALLOWANCE + 1)
        assert len(ledger.entries()) == len(charges)
