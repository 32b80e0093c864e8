"""A settled id serves nothing more, in sessions and CAPE jobs alike, and ids are one namespace.

A stranger's curator (issue 25, seventh pass) re-ran a CAPE job under an id whose statement was
recorded (every owner charged and released again, a second charge no statement can pay), reused a
settled session id as a CAPE job id, recorded a session's statement while it was still open and
then had raw points released under the settled id, and recorded a CAPE job's statement between its
noise round and its release. Each test runs a real :class:`dpmarket.owner.protocol.Owner` and a
real :class:`dpmarket.owner.cape.CapeSite` on one durable ledger (the owner's one namespace of
ids), with statements signed by a real key and recorded by the owner's
:class:`dpmarket.owner.earnings.Earnings`; each fails on main, and carries its control.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.cape.agreement import SizeAttestation, plan_statement
from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.common.errors import FailedPreconditionError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    NO_SUMMARY,
    SessionRecord,
    SettlementTerms,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import MarketTerms, cape_quote, session_quote
from dpmarket.common.secagg.crypto import EcdsaSigner
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.common.summarization.rff import RFFParams, draw_rff_params
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.owner import ids as owner_ids
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.owner.protocol import Owner
from dpmarket.owner.secagg import SiteIdentity
from dpmarket.runtime.tables import PointSet, Table

N = 40
D = 8
CURATOR = "curator:curator"
CONSUMER = "consumer:c"
PRICES = OwnerPrices(per_point_read=10_000, per_point_delivered=50_000, per_epsilon=2_000_000)
SETTLEMENT = SettlementTerms(summary_size=4, validation_size=10)
SITES = ("other", "owner")
ROWS = {"other": 30, "owner": N}
SPEC = CapeMeanSpec((("x", 0.0, 1.0), ("y", 0.0, 1.0)), 0.5, 1e-7)
COUNTS = OwnerTerms(SessionMethod.CANDIDATES_COUNTS, 0.5, 0.0)
UNIFORM = OwnerTerms(SessionMethod.UNIFORM, 0.0, 0.0)
#: The validation embedding of the sessions (h1 of dimension D).
G = np.full(D, 0.05)


@dataclasses.dataclass
class Parties:
    """One owner's sessions and CAPE site on one ledger, and the keys of the other parties."""

    owner: Owner
    cape: CapeSite
    ledger: OwnerLedger
    curator_key: ec.EllipticCurvePrivateKey
    other_key: ec.EllipticCurvePrivateKey

    def record(self, id_: str, quoted: Any, spent: SessionRecord) -> None:
        """Record the curator's signed statement of ``id_`` (``spent``: the owner's line)."""
        statement = settle(id_, CONSUMER, quoted, {"owner": PRICES}, {"owner": spent})
        part = statement.for_owner("owner")
        Earnings(self.ledger, "owner").record(
            part.encode(),
            sign_statement(part, self.curator_key),
            curator=CURATOR,
            curator_key=self.curator_key.public_key(),
        )


@pytest.fixture
def parties(tmp_path: Path) -> Parties:
    policy = OwnerPolicy(
        prices=PRICES,
        allow_steered_selection=True,
        points_fraction_per_session=1.0,
        cape_min_colluders=0,
    )
    ledger = OwnerLedger.create(tmp_path, policy)
    rng = np.random.default_rng(0)
    owner = Owner("owner", PointSet(rng.normal(size=(N, 3)), np.arange(N) % 2, "o"), ledger=ledger)
    keys = {s: ec.generate_private_key(ec.SECP256R1()) for s in SITES}
    identity = SiteIdentity("owner", keys["owner"], b"", None).trusting(
        {s: k.public_key() for s, k in keys.items()}
    )
    table = Table(("x", "y"), rng.uniform(0, 1, size=(N, 2)), "owner")
    cape = CapeSite(
        "owner", table, ledger=ledger, identity=identity, min_colluders=0, clock=lambda: 0.0
    )
    return Parties(owner, cape, ledger, ec.generate_private_key(ec.SECP256R1()), keys["other"])


@pytest.fixture
def rff() -> RFFParams:
    return draw_rff_params(3, D, 0.5, np.random.default_rng(1))


def _cape_line(spec: CapeMeanSpec = SPEC) -> tuple[Any, MarketTerms]:
    quoted = cape_quote({"owner": PRICES}, spec.cost[0])
    return quoted, MarketTerms.of(quoted, "owner", NO_SUMMARY)


def _session_line(points: int, epsilon: float) -> tuple[Any, MarketTerms]:
    quoted = session_quote({"owner": PRICES}, {"owner": points}, epsilon, SETTLEMENT)
    return quoted, MarketTerms.of(quoted, "owner", SETTLEMENT)


def _quoted(terms: OwnerTerms, line: MarketTerms) -> OwnerTerms:
    return dataclasses.replace(terms, market=line)


def _open_session(p: Parties, sid: str, rff: RFFParams, terms: OwnerTerms) -> None:
    p.owner.open_session(sid, rff, 0, terms=terms, curator=CURATOR, consumer=CONSUMER)


def _open_job(p: Parties, job: str, spec: CapeMeanSpec = SPEC, market: Any = None) -> None:
    p.cape.open(job, spec, 1, curator=CURATOR, consumer=CONSUMER, market=market)


def _noise_round(p: Parties, job: str, spec: CapeMeanSpec = SPEC) -> tuple[Any, RoundParams]:
    """Plan ``job`` over two sites (the other's count signed by its key) and run one noise
    round at the owner: what comes before the release."""
    own, _ = p.cape.attest(job, SITES, 0, curator=CURATOR)
    message = plan_statement(job, spec, SITES, 0, 0, "other", ROWS["other"])
    other = SizeAttestation("other", ROWS["other"], EcdsaSigner(p.other_key).sign(message))
    plan = p.cape.plan(job, SITES, 0, {"owner": own, "other": other}, {}, curator=CURATOR)
    params = RoundParams.create(
        SITES, min_threshold(2, 0), plan.size, FixedPoint(1.0, 16, 2), colluders=0
    )
    p.cape.check_round(job, params)
    p.cape.noise_input(job, params)
    p.cape.round_finished(job, params.round_id, SITES)
    return plan, params


def _run_job(p: Parties, job: str, spec: CapeMeanSpec = SPEC, market: Any = None) -> None:
    """Open, plan, one noise round, release (charged), close."""
    _open_job(p, job, spec, market)
    plan, params = _noise_round(p, job, spec)
    p.cape.release(job, params.round_id, np.zeros(plan.size), curator=CURATOR)
    p.cape.close(job, curator=CURATOR)


# --------------------------------------------------------------- 1. a CAPE job id settles
def test_a_settled_cape_job_id_is_refused_whatever_its_terms_nothing_charged(
    parties: Parties,
) -> None:
    """c4: a job at epsilon 0.5 under its quote line, run, settled by its recorded statement,
    then opened again under the same id (its own terms, another epsilon and line, no line): each
    FAILED_PRECONDITION "is settled", before anything is read or charged (main: opened, charged
    0.5 again and released, a charge no statement can pay). Control: a new id opens."""
    p = parties
    quoted, line = _cape_line()
    _run_job(p, "job", market=line)
    p.record("job", quoted, SessionRecord(0, 0, SPEC.epsilon))
    before = p.ledger.entries()
    cheaper = dataclasses.replace(SPEC, epsilon=0.1)
    for spec, market in ((SPEC, line), (cheaper, _cape_line(cheaper)[1]), (SPEC, None)):
        with pytest.raises(FailedPreconditionError, match="is settled"):
            _open_job(p, "job", spec, market)
    assert p.ledger.entries() == before and not p.cape._jobs
    _open_job(p, "job-2", market=line)  # control


def test_an_unsettled_cape_job_id_reopens_only_under_its_first_terms_and_charges_once(
    parties: Parties,
) -> None:
    """c1b: a job id first opened at epsilon 0.5 under its line (not run), reopened at epsilon
    0.1 under another line, or for another consumer: refused (main: opened, the first line
    kept for its statement). Control: the same terms reopen. Once charged under its line, even
    the same terms are refused: a rerun would charge its epsilon again beyond the line."""
    p = parties
    _, line = _cape_line()
    _open_job(p, "job", market=line)
    p.cape.close("job", curator=CURATOR)
    cheaper = dataclasses.replace(SPEC, epsilon=0.1)
    with pytest.raises(FailedPreconditionError, match=r"other terms \(market, spec differ\)"):
        _open_job(p, "job", cheaper, _cape_line(cheaper)[1])
    with pytest.raises(FailedPreconditionError, match=r"other terms \(consumer differ\)"):
        p.cape.open("job", SPEC, 1, curator=CURATOR, consumer="consumer:x", market=line)
    assert p.ledger.entries() == []
    plan, params = (None, None)
    _open_job(p, "job", market=line)  # control: its first terms
    plan, params = _noise_round(p, "job")
    p.cape.release("job", params.round_id, np.zeros(plan.size), curator=CURATOR)
    p.cape.close("job", curator=CURATOR)
    charged = p.ledger.entries()
    with pytest.raises(FailedPreconditionError, match="charged its terms' epsilon already"):
        _open_job(p, "job", market=line)
    assert p.ledger.entries() == charged and len(charged) == 1


# ------------------------------------------------------------ 2. one namespace of ids
def test_a_session_id_is_not_a_cape_job_id_nor_the_reverse(
    parties: Parties, rff: RFFParams
) -> None:
    """c3: a settled summarization session id opened as a CAPE job: refused (main: every owner
    charged 0.2 and released under the settled id). Unsettled ids too: an id first opened as a
    session is refused as a CAPE job, and one first opened as a CAPE job is refused as a
    session, before anything is read or charged. Control: each kind reopens as itself."""
    p = parties
    quoted, line = _session_line(4, 0.0)
    _open_session(p, "s", rff, _quoted(UNIFORM, line))
    p.owner.sample_uniform("s", 2, CURATOR)
    p.owner.close_session("s", CURATOR)
    p.record("s", quoted, SessionRecord(2, 0, 0.0))
    _open_session(p, "t", rff, _quoted(UNIFORM, line))
    p.owner.close_session("t", CURATOR)
    _open_job(p, "job", market=_cape_line()[1])
    p.cape.close("job", curator=CURATOR)
    before = p.ledger.entries()
    with pytest.raises(FailedPreconditionError, match="is settled"):
        _open_job(p, "s", market=_cape_line()[1])
    with pytest.raises(FailedPreconditionError, match="first opened as a session"):
        _open_job(p, "t", market=_cape_line()[1])
    with pytest.raises(FailedPreconditionError, match="first opened as a CAPE job"):
        _open_session(p, "job", rff, _quoted(UNIFORM, line))
    assert p.ledger.entries() == before and not p.cape._jobs and p.owner.sessions == {}
    _open_session(p, "t", rff, _quoted(UNIFORM, line))  # control
    _open_job(p, "job", market=_cape_line()[1])


def test_an_id_charged_before_its_kind_was_recorded_keeps_the_kind_of_its_charges(
    parties: Parties,
) -> None:
    """An id opened before the owner recorded kinds (a ledger of an earlier schema): its kind is
    that of its charges (a CAPE job's mechanism), so it is refused as a session id."""
    p = parties
    p.ledger.charge(
        session="old-job", consumer=CONSUMER, curator=CURATOR, mechanism=SPEC.mechanism,
        epsilon=0.1, delta=0.0, points=0,
    )  # fmt: skip
    state = owner_ids.IdState(p.ledger, "owner")
    with pytest.raises(FailedPreconditionError, match="first opened as a CAPE job"):
        state.check_open(CURATOR, "old-job", "session")
    state.check_open(CURATOR, "old-job", "cape")  # control


# ------------------------------------------- 3. a statement ends an open session's steps
def _steps(p: Parties) -> dict[str, Callable[[], object]]:
    o = p.owner
    return {
        "ProposeCandidates": lambda: o.propose_candidates("s", 6, CURATOR),
        "SampleUniform": lambda: o.sample_uniform("s", 4, CURATOR),
        "CountRelevant": lambda: o.noisy_relevant_count("s", 0.0, CURATOR),
        "SetValidationEmbedding": lambda: o.set_validation_embedding("s", G, CURATOR),
        "Bid": lambda: o.bid("s", 0, np.zeros(D), 0, CURATOR),
        "ReleasePoint": lambda: o.release_point("s", 0, CURATOR),
        "HashAdvertise": lambda: o.hash_advertise("s", CURATOR),
    }


def test_a_statement_recorded_while_a_session_is_open_ends_its_steps_nothing_charged(
    parties: Parties, rff: RFFParams
) -> None:
    """e1: candidates-counts quoted at 6 points and epsilon 0.5: open, the validation embedding,
    the count (epsilon charged), then the statement recorded (0 points, epsilon 0.5: the ledger
    then). Every later step under the id is refused, "is settled", before it reads or charges
    (main: ProposeCandidates released and charged 6 raw points no statement pays); the session
    still closes, answered from the ledger. Control: the same session without the early
    statement is served its 6 candidates."""
    p = parties
    quoted, line = _session_line(6, 0.5)
    for sid in ("s", "control"):
        _open_session(p, sid, rff, _quoted(COUNTS, line))
        p.owner.set_validation_embedding(sid, G, CURATOR)
        p.owner.noisy_relevant_count(sid, 0.0, CURATOR)
    p.record("s", quoted, SessionRecord(0, 0, 0.5))
    before = p.ledger.entries()
    for step, call in _steps(p).items():
        with pytest.raises(FailedPreconditionError, match="is settled"):
            call()
        assert p.ledger.entries() == before, step
    assert p.owner.close_session("s", CURATOR).points == 0
    points, _ = p.owner.propose_candidates("control", 6, CURATOR)  # control
    assert len(points) == 6 and p.ledger.session_totals("control").points == 6


def test_a_charge_racing_the_statement_is_rolled_back_in_its_own_transaction(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's check passed just before the statement was recorded (the race, played by
    turning the check off): its charge sees the recorded statement in its own transaction and
    is rolled back, so nothing is released and the ledger holds only what the statement pays.
    Control: without a statement, the same step is charged and served."""
    p = parties
    quoted, line = _session_line(4, 0.0)
    for sid in ("s", "control"):
        _open_session(p, sid, rff, _quoted(UNIFORM, line))
    p.record("s", quoted, SessionRecord(0, 0, 0.0))
    monkeypatch.setattr(owner_ids.IdState, "check_unsettled", lambda *_: None)
    with pytest.raises(FailedPreconditionError, match="is settled"):
        p.owner.sample_uniform("s", 4, CURATOR)
    assert p.ledger.entries() == [] and p.owner.session("s", CURATOR).released == 0
    points, _ = p.owner.sample_uniform("control", 4, CURATOR)
    assert len(points) == 4 and len(p.ledger.entries()) == 1


def test_a_statement_checked_while_a_charge_lands_is_refused_and_not_recorded(
    parties: Parties, rff: RFFParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement is checked against the ledger and recorded in one transaction: a charge
    that lands between the check and the record (a step still running) refuses it, nothing
    recorded, and the session keeps being served; delivered again after the charge with the
    same figures it is refused as not matching (the ledger's record wins). Control: with no
    charge in between, it is recorded."""
    p = parties
    quoted, line = _session_line(4, 0.0)
    _open_session(p, "s", rff, _quoted(UNIFORM, line))
    checked = Earnings._check_against_ledger

    def check_then_step(self: Earnings, *args: Any) -> None:
        checked(self, *args)
        p.owner.sample_uniform("s", 2, CURATOR)  # the step's charge lands now

    monkeypatch.setattr(Earnings, "_check_against_ledger", check_then_step)
    with pytest.raises(FailedPreconditionError, match="charged while its statement was checked"):
        p.record("s", quoted, SessionRecord(0, 0, 0.0))
    assert not Earnings(p.ledger, "owner").settled(CURATOR, "s")
    monkeypatch.setattr(Earnings, "_check_against_ledger", checked)
    p.owner.close_session("s", CURATOR)
    p.record("s", quoted, SessionRecord(2, 0, 0.0))  # control: the ledger's figures
    assert Earnings(p.ledger, "owner").settled(CURATOR, "s")


# ------------------------------------------------- 4. a statement before ReleaseCape
def test_a_statement_recorded_between_the_noise_round_and_the_release_refuses_the_release(
    parties: Parties,
) -> None:
    """e2: the job's statement (epsilon 0: the ledger before its release) recorded between its
    noise round and ReleaseCape: the release is refused, "is settled", nothing charged (main:
    charged 0.1 and released, the recorded statement stating 0), and so is another noise round.
    Control: the same job under another id releases, charged once."""
    p = parties
    quoted, line = _cape_line()
    plans = {}
    for job in ("job", "control"):
        _open_job(p, job, market=line)
        plans[job] = _noise_round(p, job)
    p.record("job", quoted, SessionRecord(0, 0, 0.0))
    plan, params = plans["job"]
    with pytest.raises(FailedPreconditionError, match="is settled"):
        p.cape.release("job", params.round_id, np.zeros(plan.size), curator=CURATOR)
    with pytest.raises(FailedPreconditionError, match="is settled"):
        p.cape.noise_input("job", params)
    assert p.ledger.entries() == []
    assert p.cape.close("job", curator=CURATOR).epsilon == 0.0
    plan, params = plans["control"]
    p.cape.release("control", params.round_id, np.zeros(plan.size), curator=CURATOR)
    assert [e.session for e in p.ledger.entries()] == ["control"]
