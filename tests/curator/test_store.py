"""The curator's durable store: sessions, results and charges across restarts, with an injected
clock for expiry."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import NO_SUMMARY
from dpmarket.common.market.terms import FREE, cape_quote
from dpmarket.common.privacy.accounting import PrivacyEvent
from dpmarket.common.privacy.ledger import (
    UNKNOWN_RESTARTED,
    UNKNOWN_UNREACHABLE,
    Charge,
    LedgerReport,
    SessionSpend,
)
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.session_ledger import SessionLedger
from dpmarket.common.summarization.summary import SessionReport, SummaryResult
from dpmarket.curator.settlement import SessionMarket, settle_session
from dpmarket.curator.store import RESTART_ERROR, CuratorStore
from dpmarket.v1 import privacy_pb2

CONFIG = CandidatesConfig(summary_size=2)
CHARGES = [
    Charge("validation", "gtilde", PrivacyEvent("laplace", 0.5, 1, 1.0)),
    Charge("owners", "relevance counts", PrivacyEvent("laplace", 0.3, 1, 1.0)),
]


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _create(
    store: CuratorStore, sid: str, consumer: str = "consumer:alice", key: str | None = None
) -> None:
    store.create(
        sid,
        consumer=consumer,
        request_id=key,
        request_digest=f"digest-{sid}",
        method=CONFIG.method,
        config=dataclasses.asdict(CONFIG),
    )


def _result(points: np.ndarray) -> SummaryResult:
    report = SessionReport(
        method="candidates",
        summary_size=points.shape[0],
        rounds=1,
        owner_points_accessed=5,
        validation_points_accessed=10,
        all_owners_bound=4,
        paper_bound=0.0,
        dropped_owners=(),
        ledger=SessionLedger(owners=LedgerReport(1e-6, {}, ())),
        wall_time_seconds=0.5,
    )
    return SummaryResult(points, np.array([1, 2]), ("o-1", "o-2"), report)


POINTS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]])


def test_a_finished_session_and_its_charges_survive_reopening(tmp_path: Path) -> None:
    store = CuratorStore(tmp_path)
    _create(store, "s1", key="k1")
    store.record_charges("s1", CHARGES)
    store.finish("s1", _result(POINTS), ttl=100.0)
    store.close()

    again = CuratorStore(tmp_path)
    assert again.recover(ttl=100.0) == [], "a finished session is not touched by recovery"
    row = again.get("s1")
    assert row is not None and row.status == "done" and row.has_result
    assert row.consumer == "consumer:alice" and row.request_id == "k1"
    result = again.result("s1")
    assert result is not None
    np.testing.assert_array_equal(result.points, POINTS)
    assert result.owner_ids == ("o-1", "o-2") and result.report.owner_points_accessed == 5
    assert again.charges("s1") == CHARGES
    assert again.find_request("consumer:alice", "k1") == row
    assert again.find_request("consumer:bob", "k1") is None


def test_recover_fails_running_sessions_once_and_keeps_their_charges(tmp_path: Path) -> None:
    store = CuratorStore(tmp_path)
    _create(store, "running")
    store.record_charges("running", CHARGES)
    _create(store, "done")
    store.finish("done", _result(POINTS), ttl=100.0)
    store.close()  # the curator "crashes" here

    again = CuratorStore(tmp_path)
    assert again.recover(ttl=100.0) == ["running"]
    row = again.get("running")
    assert row is not None and row.status == "failed" and row.error == RESTART_ERROR
    assert not row.has_result
    assert row.report is not None and row.report.error == RESTART_ERROR
    # The rebuilt report's ledger holds what was charged, party by party.
    parties = row.report.ledger.to_json()
    assert parties["validation"]["parties"]["validation"]["basic"] == pytest.approx(0.5)
    assert parties["owners"]["parties"]["owners"]["basic"] == pytest.approx(0.3)
    assert again.charges("running") == CHARGES
    assert again.result("running") is None
    assert again.get("done").status == "done"  # type: ignore[union-attr]
    # A second restart finds nothing running and duplicates nothing.
    again.close()
    third = CuratorStore(tmp_path)
    assert third.recover(ttl=100.0) == []
    assert third.charges("running") == CHARGES


def test_what_owners_charged_is_kept_as_soon_as_known_and_rebuilt_after_a_restart(
    tmp_path: Path,
) -> None:
    """A session open at three owners when the curator dies: one had closed it (its record is
    written as soon as it came), one could not be reached, one was still open. The restarted
    curator's report names all three: the record, the reason, and "restarted" for the one it
    then asks (and, once asked, its record)."""
    store = CuratorStore(tmp_path)
    _create(store, "s")
    store.owners_opened("s", "owner-side-id", ["o-1", "o-2", "o-3"])
    store.record_owner_spend("s", "o-1", SessionSpend(0.5, 1e-6, 7))
    store.record_owner_spend("s", "o-2", SessionSpend.unknown_because(UNKNOWN_UNREACHABLE))
    store.close()  # the curator "crashes" here, the session running

    again = CuratorStore(tmp_path)
    assert again.recover(ttl=100.0) == ["s"]
    report = again.get("s").report  # type: ignore[union-attr]
    assert report is not None
    assert report.owner_spend == {
        "o-1": SessionSpend(0.5, 1e-6, 7),
        "o-2": SessionSpend.unknown_because(UNKNOWN_UNREACHABLE),
        "o-3": SessionSpend.unknown_because(UNKNOWN_RESTARTED),
    }
    assert report.owner_points_accessed == 7  # the points the owners' records say they released
    # What the restarted curator asks the owners for: every record it does not have, the one a
    # restart interrupted and the one of the owner it could not reach (so that it can settle).
    assert again.unrecorded_owner_sessions() == [
        ("s", "o-2", "owner-side-id", False),
        ("s", "o-3", "owner-side-id", False),
    ]
    again.record_owner_spend("s", "o-3", SessionSpend(0.5, 1e-6, 2))
    again.refresh_owner_spend("s")
    assert again.unrecorded_owner_sessions() == [("s", "o-2", "owner-side-id", False)]
    # A running session's owners are not asked (the session closes them itself).
    _create(again, "running")
    again.owners_opened("running", "other-id", ["o-1"])
    again.record_owner_spend("running", "o-1", SessionSpend.unknown_because(UNKNOWN_UNREACHABLE))
    assert again.unrecorded_owner_sessions() == [("s", "o-2", "owner-side-id", False)]
    report = again.get("s").report  # type: ignore[union-attr]
    assert report is not None and report.owner_spend["o-3"] == SessionSpend(0.5, 1e-6, 2)
    assert report.owner_points_accessed == 9
    assert report.error == RESTART_ERROR


def test_results_expire_on_the_clock_but_rows_and_charges_stay(tmp_path: Path) -> None:
    clock = Clock(1_000.0)
    store = CuratorStore(tmp_path, clock=clock)
    _create(store, "s")
    store.record_charges("s", CHARGES)
    store.finish("s", _result(POINTS), ttl=100.0)
    clock.now = 1_099.9
    assert store.expire() == 0 and store.result("s") is not None
    clock.now = 1_100.0
    assert store.expire() == 1
    assert store.result("s") is None
    row = store.get("s")
    assert row is not None and not row.has_result and row.report is None
    assert store.charges("s") == CHARGES, "charges are never deleted"
    assert store.expire() == 0


def test_fetching_shortens_the_expiry_and_never_extends_it(tmp_path: Path) -> None:
    clock = Clock(0.0)
    store = CuratorStore(tmp_path, clock=clock)
    _create(store, "long")
    store.finish("long", _result(POINTS), ttl=3_600.0)
    clock.now = 10.0
    store.mark_fetched("long", ttl=60.0)
    row = store.get("long")
    assert row is not None and (row.fetched_at, row.expires_at) == (10.0, 70.0)
    clock.now = 20.0
    store.mark_fetched("long", ttl=60.0)  # a second fetch does not restart the clock
    row = store.get("long")
    assert row is not None and (row.fetched_at, row.expires_at) == (10.0, 70.0)
    clock.now = 69.0
    assert store.expire() == 0 and store.result("long") is not None
    clock.now = 70.0
    assert store.expire() == 1 and store.result("long") is None

    _create(store, "short")
    store.finish("short", _result(POINTS), ttl=30.0)  # expires at 100
    clock.now = 80.0
    store.mark_fetched("short", ttl=60.0)
    assert store.get("short").expires_at == 100.0  # type: ignore[union-attr]


def test_failed_sessions_keep_their_report_until_they_expire(tmp_path: Path) -> None:
    clock = Clock(0.0)
    store = CuratorStore(tmp_path, clock=clock)
    _create(store, "f")
    report = dataclasses.replace(_result(POINTS).report, error="owner refused")
    store.fail("f", "owner refused", report, ttl=50.0)
    row = store.get("f")
    assert row is not None and row.status == "failed" and row.report == report
    assert store.result("f") is None
    clock.now = 50.0
    assert store.expire() == 1 and store.get("f").report is None  # type: ignore[union-attr]


def test_request_ids_are_unique_per_consumer_and_counted_by_time(tmp_path: Path) -> None:
    clock = Clock(100.0)
    store = CuratorStore(tmp_path, clock=clock)
    _create(store, "a", key="k")
    _create(store, "b", consumer="consumer:bob", key="k")  # another consumer, same key
    with pytest.raises(sqlite3.IntegrityError):
        _create(store, "c", key="k")
    with pytest.raises(sqlite3.IntegrityError):
        _create(store, "a", consumer="consumer:carol")
    clock.now = 160.0
    _create(store, "d")
    assert store.created_since("consumer:alice", 100.0) == 2
    assert store.created_since("consumer:alice", 100.5) == 1
    assert store.created_since("consumer:bob", 0.0) == 1
    assert store.get("c") is None


def test_a_recovered_sessions_report_expires_like_any_other_but_its_charges_stay(
    tmp_path: Path,
) -> None:
    clock = Clock(1_000.0)
    store = CuratorStore(tmp_path, clock=clock)
    _create(store, "crashed")
    store.record_charges("crashed", CHARGES)
    store.close()
    again = CuratorStore(tmp_path, clock=clock)
    assert again.recover(ttl=30.0) == ["crashed"]
    clock.now += 29.0
    assert again.expire() == 0
    assert again.get("crashed").report is not None  # type: ignore[union-attr]
    clock.now += 2.0
    assert again.expire() == 1
    row = again.get("crashed")
    assert row is not None and row.status == "failed" and row.report is None
    assert again.charges("crashed") == CHARGES
    again.close()


def test_each_owners_last_ledger_receipt_survives_reopening(tmp_path: Path) -> None:
    """What the curator presents at an owner's next session must outlive a curator restart: a
    receipt kept only in memory would be lost with it, and a rolled-back owner go unseen."""
    store = CuratorStore(tmp_path / "curator")
    assert store.owner_receipt("owner-0") is None
    store.record_owner_receipt("owner-0", b"first", certificate=b"cert-0")
    store.record_owner_receipt("owner-1", b"other", certificate=b"cert-1")
    # The last one replaces the one before, with the certificate that came with it (none).
    store.record_owner_receipt("owner-0", b"second")
    store.close()
    again = CuratorStore(tmp_path / "curator")
    try:
        assert again.owner_receipt_and_certificate("owner-0") == (b"second", None)
        assert again.owner_receipt_and_certificate("owner-1") == (b"other", b"cert-1")
        assert again.owner_receipt("owner-2") is None
        assert again.owner_receipt_and_certificate("owner-2") is None
    finally:
        again.close()


def _receipt(ledger: str, sequence: int) -> bytes:
    """A serialized receipt claiming ``ledger`` up to charge ``sequence`` (unsigned: the curator
    cannot check signatures, only the owner can)."""
    state = privacy_pb2.LedgerState(ledger_id=ledger, owner="owner-0", sequence=sequence)
    return privacy_pb2.LedgerReceipt(state=state.SerializeToString()).SerializeToString()


def test_a_receipt_sent_with_a_publication_never_replaces_a_later_one(tmp_path: Path) -> None:
    """A ledger restored from an older copy publishes a sketch and sends its own (older)
    receipt: kept over the curator's later one, it would hide the rollback at the owner's next
    session. A publication's receipt replaces only an earlier one of the same ledger; a session's
    (which the owner returns after checking the held one) replaces whatever is held."""
    store = CuratorStore(tmp_path / "curator")
    try:
        store.record_owner_receipt("owner-0", _receipt("L", 5))
        store.record_owner_receipt("owner-0", _receipt("L", 3), only_later=True)
        assert store.owner_receipt("owner-0") == _receipt("L", 5)
        store.record_owner_receipt("owner-0", _receipt("M", 9), only_later=True)
        assert store.owner_receipt("owner-0") == _receipt("L", 5)
        store.record_owner_receipt("owner-0", b"not a receipt", only_later=True)
        assert store.owner_receipt("owner-0") == _receipt("L", 5)
        store.record_owner_receipt("owner-0", _receipt("L", 7), only_later=True)
        assert store.owner_receipt("owner-0") == _receipt("L", 7)
        store.record_owner_receipt("owner-1", _receipt("N", 1), only_later=True)  # none held
        assert store.owner_receipt("owner-1") == _receipt("N", 1)
        # Control: unconditioned (a session's receipt), the older one replaces the later one.
        store.record_owner_receipt("owner-0", _receipt("L", 3))
        assert store.owner_receipt("owner-0") == _receipt("L", 3)
    finally:
        store.close()


def _cape_job(store: CuratorStore, job: str) -> None:
    store.create(
        job,
        consumer="consumer:alice",
        request_id=None,
        request_digest=f"digest-{job}",
        method="cape-mean",
        config={},
    )
    store.owners_opened(job, job, ["o-1", "o-2"])


def test_a_cape_job_is_settled_once_it_charged_with_its_statement_stored_as_it_ends(
    tmp_path: Path,
) -> None:
    """A CAPE job's market is kept with its first charge: a job that ends without a charge is
    never settled (the control), one that charged is listed unsettled once it ends, delivers
    no point, and its unknown owner is asked with CloseCapeJob. Its statement is stored in the
    transaction that ends it, once: a second statement is refused."""
    key = ec.generate_private_key(ec.SECP256R1())
    prices = {"o-1": OwnerPrices(per_epsilon=2_000_000), "o-2": FREE}
    store = CuratorStore(tmp_path)
    _cape_job(store, "refused")
    store.fail_document("refused", "an owner refused", {}, ttl=100.0)
    _cape_job(store, "job")
    market = SessionMarket("job", "consumer:alice", cape_quote(prices, 1.0), prices, NO_SUMMARY)
    store.record_charges("job", CHARGES[1:], market=market)
    assert store.market("job") == market and store.market("refused") is None
    assert store.unsettled() == []  # running
    store.record_owner_spend("job", "o-1", SessionSpend(1.0, 1e-6, 0))
    store.record_owner_spend("job", "o-2", SessionSpend.unknown_because(UNKNOWN_UNREACHABLE))
    store.fail_document("job", "a site was lost", {}, ttl=100.0)
    assert store.unsettled() == ["job"] and store.delivered_points("job") == {}
    assert store.unrecorded_owner_sessions() == [("job", "o-2", "job", True)]
    assert settle_session(market, store.owner_spend("job"), {}, key) is None  # o-2 unknown
    store.record_owner_spend("job", "o-2", SessionSpend(1.0, 1e-6, 0))
    settled = settle_session(market, store.owner_spend("job"), {}, key)
    assert settled is not None and store.record_settlement("job", settled)
    assert store.unsettled() == [] and not store.record_settlement("job", settled)

    _cape_job(store, "done")
    done = SessionMarket("done", "consumer:alice", cape_quote(prices, 1.0), prices, NO_SUMMARY)
    store.record_charges("done", CHARGES[1:], market=done)
    for owner in prices:
        store.record_owner_spend("done", owner, SessionSpend(1.0, 1e-6, 0))
    statement = settle_session(done, store.owner_spend("done"), {}, key)
    assert statement is not None
    document = {"mean": [0.5], "report": {"quote": {}, "cost": statement.statement.total}}
    store.finish_document("done", document, ttl=100.0, settlement=statement)
    assert store.document("done") == document
    assert store.statement_total("done") == statement.statement.total == 2_000_000
    store.finish_document("done", document, ttl=100.0, settlement=statement)  # no second one
    assert [s.session for s in store.statements("consumer:alice")].count("done") == 1
    assert store.unsettled() == []
