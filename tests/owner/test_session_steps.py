"""Every owner session is a state machine the owner enforces (issue 25, attacks 1 and 2).

One test per step (RPC) of ``OwnerService`` and of the hashes mode: a deviating curator — one
that repeats a step, takes it out of order, asks it under terms that do not charge it, or asks
a step of another method than its terms — gets a refusal (``FailedPreconditionError``) or the
release it already had, and the owner's real ledger (:class:`dpmarket.owner.ledger.OwnerLedger`) is
unchanged by every refusal. Each attack has a control: what the same request gets through the
computation the step guards when nothing stops it (the exact statistic a bid or a count is
made of, fresh noise averaged away), so that a test fails if the defence does nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.errors import FailedPreconditionError, InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.summarization.kernels import bid_direction
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params, random_fourier_features
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner.hash_keys import HashKeyParty
from dpmarket.owner.ledger import LedgerEntry, OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.runtime.tables import PointSet
from dpmarket.runtime.terms import terms_from_proto
from dpmarket.v1 import owner_pb2
from tests.conftest import ColumnProbe

D = 16
N_POINTS = 40
G = np.full(D, 0.05)

UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
COUNTS = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 0.5, 0.0)
SKETCH = OwnerTerms(SessionMethod.CANDIDATES_SKETCH, 0.0, 0.0)
PRIVATE = OwnerTerms(SessionMethod.PRIVATE, 0.5, 1e-7, max_rounds=3)
HASHES = OwnerTerms(SessionMethod.HASHES_SKETCH, 0.0, 0.0)
#: Every method's terms but those named: the terms under which a step must be refused.
ALL_TERMS = {
    "uniform": UNIFORM,
    "counts": COUNTS,
    "sketch": SKETCH,
    "private": PRIVATE,
    "hashes": HASHES,
}


def _others(*allowed: str) -> list[str]:
    return [name for name in ALL_TERMS if name not in allowed]


@pytest.fixture
def data() -> PointSet:
    rng = np.random.default_rng(0)
    return PointSet(rng.normal(size=(N_POINTS, 3)), np.arange(N_POINTS) % 2, "o")


@pytest.fixture
def rff() -> RFFParams:
    return draw_rff_params(3, D, 0.5, np.random.default_rng(1))


@pytest.fixture
def ledger(tmp_path: Path) -> OwnerLedger:
    # ALL_TERMS include the per-round methods and the candidates methods: this owner trusts its
    # curator with exact bids and steered selection (tests/owner/test_exact_bids.py: the
    # default refuses both).
    policy = OwnerPolicy(allow_exact_bids=True, allow_steered_selection=True)
    return OwnerLedger.create(tmp_path / "owner", policy)


@pytest.fixture
def owner(data: PointSet, ledger: OwnerLedger) -> Owner:
    key = ec.generate_private_key(ec.SECP256R1())
    party = HashKeyParty("o", EcdsaSigner(key), EcdsaVerifier({"o": key.public_key()}))
    return Owner("o", data, ledger=ledger, hash_party=party)


def _entries(ledger: OwnerLedger) -> list[LedgerEntry]:
    return ledger.entries()


def _refused(call: object, match: str) -> None:
    with pytest.raises(FailedPreconditionError, match=match):
        call()  # type: ignore[operator]


def _open(owner: Owner, rff: RFFParams, sid: str, name: str, *, embedding: bool = True) -> None:
    terms = ALL_TERMS[name]
    owner.open_session(sid, rff, 3, terms=terms)
    if embedding and name != "uniform":
        owner.set_validation_embedding(sid, G)


# ------------------------------------------------------------------------------- OpenSession
@pytest.mark.parametrize(
    ("message", "match"),
    [
        (owner_pb2.SessionTerms(epsilon=0.5), "terms.method must name the session's method"),
        (
            owner_pb2.SessionTerms(method=owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS),
            "needs a finite epsilon > 0",
        ),
        (
            owner_pb2.SessionTerms(method=owner_pb2.SESSION_METHOD_UNIFORM, epsilon=1.0),
            "releases only raw points",
        ),
        (
            owner_pb2.SessionTerms(method=owner_pb2.SESSION_METHOD_PRIVATE, epsilon=1.0),
            "max_rounds must be >= 1",
        ),
        (
            owner_pb2.SessionTerms(
                method=owner_pb2.SESSION_METHOD_GREEDY, epsilon=math.inf, max_rounds=0
            ),
            "max_rounds must be >= 1",
        ),
    ],
)
def test_open_session_refuses_terms_that_do_not_charge_what_their_method_releases(
    message: owner_pb2.SessionTerms, match: str
) -> None:
    """Terms are typed: a method the owner can check, an epsilon that pays for its steps (the
    count allocation's > 0: the count is drawn at it), rounds for the per-round methods."""
    with pytest.raises(InvalidArgumentError, match=match):
        terms_from_proto(message)


def test_open_session_serves_non_private_terms_only_when_the_policy_allows_them(
    data: PointSet, rff: RFFParams, tmp_path: Path
) -> None:
    greedy = OwnerTerms(SessionMethod.GREEDY, math.inf, 0.0, max_rounds=4)
    # Greedy's bids are exact too: it needs both opt-ins, each refused by its own key.
    for name, policy, key in (
        ("a", OwnerPolicy(allow_non_private=True), "allow_exact_bids = false"),
        ("b", OwnerPolicy(allow_exact_bids=True), "allow_non_private = false"),
    ):
        refusing = Owner("o", data, ledger=OwnerLedger.create(tmp_path / name, policy))
        _refused(lambda: refusing.open_session("s", rff, 0, terms=greedy), key)  # noqa: B023
        assert refusing.ledger is not None and refusing.ledger.entries() == []
    both = OwnerPolicy(allow_non_private=True, allow_exact_bids=True)
    allowing = Owner("o", data, ledger=OwnerLedger.create(tmp_path / "c", both))
    allowing.open_session("s", rff, 0, terms=greedy)
    allowing.set_validation_embedding("s", G)
    assert allowing.bid("s", 1, np.zeros(D), 0) is not None


# -------------------------------------------------------------------- SetValidationEmbedding
def test_set_validation_embedding_is_set_once_and_refused_where_no_step_reads_it(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    owner.open_session("u", rff, 0, terms=UNIFORM)
    _refused(lambda: owner.set_validation_embedding("u", G), "method uniform.* allow no Set")
    _open(owner, rff, "s", "counts")
    session = owner.session("s")
    # The same embedding again changes nothing; another one is refused, before and after the
    # step that reads it.
    owner.set_validation_embedding("s", G.copy())
    _refused(lambda: owner.set_validation_embedding("s", 2 * G), "set once per session")
    _refused(
        lambda: owner.set_validation_embedding("s", G, shrinkage_sigma=0.1), "set once per session"
    )
    _refused(
        lambda: owner.set_validation_embedding("s", G, score_metric=True), "set once per session"
    )
    first = owner.noisy_relevant_count("s", 0.0)
    _refused(lambda: owner.set_validation_embedding("s", -G), "set once per session")
    np.testing.assert_array_equal(session.validation_embedding, G)
    assert owner.noisy_relevant_count("s", 0.0) == first
    # Control: a second embedding would make the same step count other points.
    features = random_fourier_features(owner.data.features, rff)  # type: ignore[union-attr]
    assert np.count_nonzero(features @ G >= 0.0) != np.count_nonzero(features @ -G >= 0.0)
    assert [e.epsilon for e in _entries(ledger)] == [0.5]


# ------------------------------------------------------------------------ Bid (and RunRounds)
@pytest.mark.parametrize("name", _others("private"))
def test_bid_is_refused_under_terms_that_do_not_charge_it(
    owner: Owner, ledger: OwnerLedger, data: PointSet, name: str
) -> None:
    """Attack 2: terms that charge nothing (uniform, the sketch allocation) or only a count,
    then Bids steered to read the largest and smallest value of a column: refused, nothing
    recorded, and the terms' epsilon (0 for most) is all the ledger ever says."""
    probe = ColumnProbe(3, D, columns=(1, 2), scale=20.0)
    owner.open_session("s", probe.rff, 3, terms=ALL_TERMS[name])
    if name != "uniform":
        owner.set_validation_embedding("s", np.zeros(D))
    steers = [(k, largest) for k in (0, 1) for largest in (True, False)]
    for k, largest in steers:
        g = probe.summary_embedding(k, largest)
        _refused(lambda g=g: owner.bid("s", 1, g, 1), "allow no Bid")
    session = owner.session("s")
    assert session.round == 0 and _entries(ledger) == []
    # Control: the unguarded computation the Bid step runs, on the same session, reads the two
    # columns' exact extremes.
    for k, largest in steers:
        column = data.features[:, k + 1]
        direction = bid_direction(np.zeros(D), probe.summary_embedding(k, largest), 1)
        found = session.work.best(direction, session.sent_indices, session.progress, session.cancel)
        assert found is not None
        exact = column.max() if largest else column.min()
        assert probe.value(found[1], largest) == pytest.approx(exact, abs=1e-4)
    assert owner.close_session("s").epsilon == 0.0


def test_bid_rounds_run_in_order_within_the_terms_and_charge_them_once(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "s", "private")
    assert owner.bid("s", 1, np.zeros(D), 0) is not None
    charged = _entries(ledger)
    assert [(e.epsilon, e.delta) for e in charged] == [(0.5, 1e-7)]
    _refused(lambda: owner.bid("s", 1, np.zeros(D), 0), "expected round 2, got round 1")
    _refused(lambda: owner.bid("s", 3, np.zeros(D), 0), "expected round 2, got round 3")
    assert owner.bid("s", 2, np.zeros(D), 0) is not None
    assert owner.bid("s", 3, np.zeros(D), 0) is not None
    # The terms cover PRIVATE.max_rounds = 3 rounds: a fourth bid is refused.
    _refused(lambda: owner.bid("s", 4, np.zeros(D), 0), "terms cover 3 Bid rounds")
    assert owner.session("s").round == 3 and _entries(ledger) == charged


# ------------------------------------------------------------------------------ ReleasePoint
@pytest.mark.parametrize("name", _others("private"))
def test_release_point_is_refused_outside_the_rounds(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams, name: str
) -> None:
    _open(owner, rff, "s", name)
    _refused(lambda: owner.release_point("s", 1), "allow no Bid/ReleasePoint")
    assert _entries(ledger) == [] and owner.session("s").released == 0


def test_release_point_is_answered_once_for_the_round_just_bid(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "s", "private")
    _refused(lambda: owner.release_point("s", 1), "not the last round bid")
    owner.bid("s", 1, np.zeros(D), 0)
    owner.bid("s", 2, np.zeros(D), 0)
    _refused(lambda: owner.release_point("s", 1), "round 1 is not the last round bid")
    owner.release_point("s", 2)
    entries = _entries(ledger)
    _refused(lambda: owner.release_point("s", 2), "no unsent point was bid in round 2")
    assert _entries(ledger) == entries and sum(e.points for e in entries) == 1


# ----------------------------------------------------------------------------- SampleUniform
@pytest.mark.parametrize("name", _others("uniform"))
def test_sample_uniform_is_refused_under_other_methods(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams, name: str
) -> None:
    _open(owner, rff, "s", name)
    _refused(lambda: owner.sample_uniform("s", 1), "allow no SampleUniform")
    assert _entries(ledger) == [] and owner.session("s").released == 0


def test_sample_uniform_is_drawn_once(owner: Owner, ledger: OwnerLedger, rff: RFFParams) -> None:
    _open(owner, rff, "s", "uniform")
    owner.sample_uniform("s", 5)
    entries = _entries(ledger)
    _refused(lambda: owner.sample_uniform("s", 5), "SampleUniform was already answered")
    assert _entries(ledger) == entries and owner.session("s").released == 5


# ----------------------------------------------------------------------------- CountRelevant
def test_count_relevant_is_released_once_and_a_repeat_returns_the_same_count(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    """Attack 1: the count again and again in one session. Every answer is the one release,
    charged once; another threshold (a second statistic) is refused."""
    _open(owner, rff, "s", "counts")
    answers = [owner.noisy_relevant_count("s", 0.0) for _ in range(2000)]
    assert len(set(answers)) == 1
    _refused(lambda: owner.noisy_relevant_count("s", 0.1), "answered in this session at threshold")
    (entry,) = _entries(ledger)
    assert (entry.epsilon, entry.points) == (0.5, 0)
    # Control: the same 2,000 calls drawing fresh Laplace(1 / epsilon) noise each, as the step
    # did before, average back to the exact count; the answers' average is the one release.
    exact = owner.session("s").relevant_count(0.0)
    noise = SeededNoise(np.random.default_rng(7))
    fresh = exact + noise.laplace(1.0 / COUNTS.epsilon, len(answers))
    assert round(float(fresh.mean())) == exact
    assert float(np.mean(answers)) == pytest.approx(answers[0], abs=1e-9)


@pytest.mark.parametrize("name", _others("counts"))
def test_count_relevant_is_refused_under_terms_that_do_not_charge_it(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams, name: str
) -> None:
    """Only the count allocation's terms charge a count; the sketch allocation's ``(0, 0)``,
    uniform's and the per-round methods' do not."""
    _open(owner, rff, "s", name)
    _refused(lambda: owner.noisy_relevant_count("s", 0.0), "allow no CountRelevant")
    assert _entries(ledger) == []


def test_count_relevant_comes_after_the_embedding_and_before_the_candidates(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "s", "counts", embedding=False)
    _refused(lambda: owner.noisy_relevant_count("s", 0.0), "after SetValidationEmbedding")
    owner.set_validation_embedding("s", G)
    _refused(lambda: owner.propose_candidates("s", 3), "ProposeCandidates comes after Count")
    assert _entries(ledger) == []
    first = owner.noisy_relevant_count("s", 0.0)
    owner.propose_candidates("s", 3)
    # After the candidates the count is still the one released (and nothing new is charged).
    entries = _entries(ledger)
    assert owner.noisy_relevant_count("s", 0.0) == first and _entries(ledger) == entries


# ------------------------------------------------------------------------- ProposeCandidates
@pytest.mark.parametrize("name", _others("counts", "sketch"))
def test_propose_candidates_is_refused_under_other_methods(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams, name: str
) -> None:
    """Among them the hashes mode, whose curator must never receive a raw point."""
    _open(owner, rff, "s", name)
    _refused(lambda: owner.propose_candidates("s", 2), "allow no ProposeCandidates")
    assert _entries(ledger) == [] and owner.session("s").released == 0


def test_propose_candidates_is_answered_once(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "s", "sketch")
    points, _ = owner.propose_candidates("s", 4, uniform_count=2)
    entries = _entries(ledger)
    _refused(lambda: owner.propose_candidates("s", 4), "ProposeCandidates was already answered")
    assert _entries(ledger) == entries and sum(e.points for e in entries) == 4 == len(points)


# ------------------------------------------------------------------------------- hashes mode
def test_the_hashes_steps_run_in_order_once_and_only_under_hashes_terms(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "c", "sketch")
    for call, what in (
        (lambda: owner.hash_advertise("c"), "HashAdvertise"),
        (lambda: owner.hash_distribute("c", {}), "HashDistribute"),
        (lambda: owner.propose_hashes("c", 2, 0.5), "ProposeHashes"),
    ):
        _refused(call, f"method candidates-sketch.* allow no {what}")
    _open(owner, rff, "h", "hashes", embedding=False)
    _refused(lambda: owner.hash_advertise("h"), "after SetValidationEmbedding")
    owner.set_validation_embedding("h", G)
    _refused(lambda: owner.hash_distribute("h", {}), "after HashAdvertise")
    _refused(lambda: owner.propose_hashes("h", 2, 0.5), "after HashAdvertise")
    advert = owner.hash_advertise("h")
    _refused(lambda: owner.hash_advertise("h"), "HashAdvertise was already answered")
    owner.hash_distribute("h", {"o": advert})  # the only owner leads: no envelope to send
    _refused(lambda: owner.hash_distribute("h", {"o": advert}), "already answered")
    assert _entries(ledger) == []
    hashes, _ = owner.propose_hashes("h", 3, 0.5)
    assert hashes.shape == (3, D)
    entries = _entries(ledger)
    _refused(lambda: owner.propose_hashes("h", 1, 0.5), "ProposeHashes was already answered")
    assert _entries(ledger) == entries and sum(e.points for e in entries) == 3
    # Control: the raw points the hashes session refuses, under the terms that allow them.
    points, _ = owner.propose_candidates("c", 3)
    assert points.shape == (3, 3)


@pytest.mark.parametrize("gamma", [0.0, -1.0, math.nan, math.inf])
def test_propose_hashes_refuses_a_bad_gamma_before_it_charges_or_marks_a_point_sent(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams, gamma: float
) -> None:
    """A bad kernel parameter for the hash map is refused (INVALID_ARGUMENT) before the step
    charges or marks a point sent (main charged the points and marked them sent, then raised
    a ValueError computing the map: the points were paid for and never sent, and the step
    could not be asked again). The control: the same step with a good gamma then answers."""
    _open(owner, rff, "h", "hashes")
    advert = owner.hash_advertise("h")
    owner.hash_distribute("h", {"o": advert})
    before = _entries(ledger)
    with pytest.raises(InvalidArgumentError, match="gamma must be a finite number > 0"):
        owner.propose_hashes("h", 3, gamma)
    session = owner.session("h")
    assert _entries(ledger) == before and session.released == 0
    assert len(session.sent_indices) == 0
    hashes, _ = owner.propose_hashes("h", 3, 0.5)
    assert hashes.shape == (3, D) and sum(e.points for e in _entries(ledger)) == 3


# -------------------------------------------- GetOwnerInfo, GetProgress, CloseSession: any state
def test_info_progress_and_close_are_answered_in_every_state(
    owner: Owner, ledger: OwnerLedger, rff: RFFParams
) -> None:
    _open(owner, rff, "s", "counts")
    _refused(lambda: owner.bid("s", 1, G, 0), "allow no Bid")
    assert owner.info().num_points == N_POINTS
    assert owner.progress("s") == ("", 0, 0, owner.progress("s")[3])
    owner.noisy_relevant_count("s", 0.0)
    spent = owner.close_session("s")
    assert (spent.epsilon, spent.delta, spent.points) == (0.5, 0.0, 0)
