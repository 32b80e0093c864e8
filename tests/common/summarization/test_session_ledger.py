"""Results leave a session typed: the report, its ledger and its parts, and the consumer's
evaluation; their JSON is the shape report.json has always had, and reads back to the same
objects."""

from __future__ import annotations

import json
import math

import pytest

from dpmarket.common.privacy.ledger import LedgerReport, PartyReport
from dpmarket.common.summarization.methods import method_config
from dpmarket.common.summarization.session_ledger import (
    AuctionReport,
    CountsAllocationReport,
    HedgeReport,
    SessionLedger,
    TermsReport,
)
from dpmarket.common.summarization.summary import SessionReport, SummaryResult
from dpmarket.consumer.report import OwnerBreakdown, evaluate_summary
from dpmarket.experiments.runner import simulate
from dpmarket.experiments.scenarios import Scenario

P = 8

#: The keys every part of a ledger's JSON has had (report.json readers depend on them).
TERMS_KEYS = {"method", "mechanism", "epsilon", "delta", "max_rounds", "non_private"}
PARTY_KEYS = {"theorem7", "advanced", "pld", "basic", "delta_total", "budget", "mechanisms"}
AUCTION_KEYS = {"variant", "eps_auc", "tau", "delta_per_bad_iteration", "iterations"}
COUNTS_KEYS = {
    "allocation",
    "allocation_note",
    "budget",
    "uniform_shares",
    "gaussian_sigma",
    "embedding_prior",
    "shrinkage_metric",
    "shrinkage_strength",
    "relevance_threshold",
    "noisy_counts",
    "shares",
    "hedge",
}


@pytest.fixture(scope="module")
def results(digits: Scenario) -> dict[str, SummaryResult]:
    """One seeded in-process session of every networked method (the counts allocation: no
    sketches published)."""
    return {
        method: simulate(
            digits.owners,
            digits.validation,
            digits.seed_set,
            method_config(method, summary_size=P, rff_dimension=32),
            seed=2,
        )
        for method in ("uniform", "greedy", "private", "rounds", "candidates")
    }


def _json_round_trip(report: SessionReport) -> SessionReport:
    return SessionReport.from_json(json.loads(json.dumps(report.to_json())))


@pytest.mark.parametrize("method", ["uniform", "greedy", "private", "rounds", "candidates"])
def test_a_report_survives_its_json(results: dict[str, SummaryResult], method: str) -> None:
    report = results[method].report
    assert _json_round_trip(report) == report
    # The wire's ledger_json is the same document.
    assert SessionLedger.from_json(json.loads(json.dumps(report.ledger.to_json()))) == (
        report.ledger
    )


def test_the_ledger_is_typed_and_its_json_keeps_its_shape(
    results: dict[str, SummaryResult],
) -> None:
    private = results["private"].report.ledger
    assert isinstance(private.validation, LedgerReport) and isinstance(private.owners, LedgerReport)
    owners = private.owners.parties["owners"]
    assert isinstance(owners, PartyReport) and owners.basic is not None and owners.basic > 0
    assert isinstance(private.auction, AuctionReport) and private.auction.iterations >= P
    assert isinstance(private.owner_terms, TermsReport)
    assert private.owner_terms.method == "private" and private.candidates is None
    data = private.to_json()
    assert set(data) == {"validation", "owners", "auction", "owner_terms"}
    assert set(data["owners"]) == {"delta_tilde", "parties", "entries"}
    assert set(data["owners"]["parties"]["owners"]) == PARTY_KEYS
    assert set(data["auction"]) == AUCTION_KEYS and set(data["owner_terms"]) == TERMS_KEYS
    assert data["owners"]["parties"]["owners"]["basic"] == owners.basic

    candidates = results["candidates"].report.ledger
    assert isinstance(candidates.candidates, CountsAllocationReport)
    assert isinstance(candidates.candidates.hedge, HedgeReport)
    assert sum(candidates.candidates.shares.values()) == candidates.candidates.budget
    assert set(candidates.to_json()["candidates"]) == COUNTS_KEYS
    # Greedy charges nothing and says so; uniform's terms are (0, 0).
    greedy = results["greedy"].report.ledger
    assert set(greedy.to_json()) == {"owner_terms"} and not greedy.empty
    assert greedy.owner_terms is not None and math.isinf(greedy.owner_terms.epsilon)
    assert SessionLedger().empty and SessionLedger().to_json() == {}


def test_the_evaluation_types_each_owners_part(
    results: dict[str, SummaryResult], digits: Scenario
) -> None:
    result = results["candidates"]
    evaluation = evaluate_summary(result, digits.validation, 0.1, test=digits.test)
    assert evaluation.summary_size == P and evaluation.ledger == result.report.ledger
    points = {o: result.owner_ids.count(o) for o in set(result.owner_ids)}
    assert {o: b.points for o, b in evaluation.owners.items() if b.points} == points
    assert all(isinstance(b, OwnerBreakdown) for b in evaluation.owners.values())
    row = json.loads(json.dumps(evaluation.to_json()))
    assert row["points_per_owner"] == points
    assert row["epsilon"]["validation"]["delta_tilde"] == 1e-6
    assert row["ledger"] == json.loads(json.dumps(result.report.ledger.to_json()))
    assert "label" not in row and "mmd2_over_reference_percent" not in row
