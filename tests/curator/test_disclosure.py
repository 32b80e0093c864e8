"""What of an owner's failure the curator passes on to a consumer: the owner's name and a public
text, never its address or a budget figure (the whole answer stays in the curator's log)."""

from __future__ import annotations

import grpc
import pytest

from dpmarket.common import errors
from dpmarket.curator.disclosure import (
    BUDGET_REFUSED,
    FAILED,
    REFUSED_CURATOR,
    UNREACHABLE,
    NoAnswerError,
    owner_failed,
    public_error,
    public_text,
)
from dpmarket.runtime.status import error_from_rpc


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, budget: bool = False) -> None:
        self._code, self._details = code, details
        self._trailing = (("dpmarket-refusal", "budget"),) if budget else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc-stubs types the trailing metadata as _Metadatum objects; grpc gives (key, value) pairs
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._trailing


def _over_the_wire(
    code: grpc.StatusCode, details: str, budget: bool = False
) -> errors.DPMarketError:
    return error_from_rpc(_Failed(code, details, budget), "owner clinic-a")


ADDRESS = "ipv4:10.1.2.3:50051"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            _over_the_wire(
                grpc.StatusCode.FAILED_PRECONDITION,
                "owner budget exceeded: epsilon over the lifetime: spent 9.5 of 10, 0.5 left",
                budget=True,
            ),
            BUDGET_REFUSED,
        ),
        (_over_the_wire(grpc.StatusCode.UNAVAILABLE, f"failed to connect: {ADDRESS}"), UNREACHABLE),
        (_over_the_wire(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), UNREACHABLE),
        (_over_the_wire(grpc.StatusCode.INTERNAL, "internal error; see the server log"), FAILED),
        (
            _over_the_wire(grpc.StatusCode.UNKNOWN, f"Exception calling application {ADDRESS}"),
            FAILED,
        ),
        (
            _over_the_wire(grpc.StatusCode.PERMISSION_DENIED, "curator:x is not served"),
            REFUSED_CURATOR,
        ),
        # Refusals an owner decides on public inputs: its own text, without its name twice.
        (
            _over_the_wire(grpc.StatusCode.INVALID_ARGUMENT, "h1 dimension d=9000 exceeds 4096"),
            "h1 dimension d=9000 exceeds 4096",
        ),
        (
            _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, "expected round 2, got round 5"),
            "expected round 2, got round 5",
        ),
        (_over_the_wire(grpc.StatusCode.ABORTED, "the job was aborted"), "the job was aborted"),
        # gRPC's own status for an owner's details above 16 KiB: the length is the owner's.
        (
            _over_the_wire(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "Stream removed (received metadata size exceeds hard limit (value length 17115 "
                "vs. 16384))",
            ),
            FAILED,
        ),
        # Raised in process (no status): by class; the curator's own deadline keeps its text.
        (errors.BudgetRefusedError("spent 2 of 2"), BUDGET_REFUSED),
        (errors.UnavailableError(f"nothing listening at {ADDRESS}"), UNREACHABLE),
        (NoAnswerError("no answer within 30 s"), "no answer within 30 s"),
        (errors.AbortedError("a signed count does not verify"), "a signed count does not verify"),
        (errors.PrivateDataError("row 17 holds 151.0"), FAILED),
    ],
)
def test_an_owners_failure_reads_as_its_public_text(
    error: errors.DPMarketError, expected: str
) -> None:
    assert public_text(error) == expected


def test_the_relayed_error_keeps_the_class_names_the_owner_and_logs_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answer = _over_the_wire(
        grpc.StatusCode.FAILED_PRECONDITION, "owner budget exceeded: spent 1 of 2, 1 left", True
    )
    with caplog.at_level("WARNING", logger="dpmarket.curator.disclosure"):
        relayed = public_error("clinic-a", answer, where="session 1234…, open")
    assert type(relayed) is errors.BudgetRefusedError
    assert str(relayed) == f"owner clinic-a: {BUDGET_REFUSED}"
    assert "spent 1 of 2, 1 left" in caplog.text and "session 1234…, open" in caplog.text
    gone = public_error("clinic-a", _over_the_wire(grpc.StatusCode.UNAVAILABLE, ADDRESS))
    assert type(gone) is errors.UnavailableError and ADDRESS not in str(gone)


@pytest.mark.parametrize(
    ("code", "failed"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, True),
        (grpc.StatusCode.INTERNAL, True),
        (grpc.StatusCode.UNKNOWN, True),
        (grpc.StatusCode.ABORTED, True),
        (grpc.StatusCode.NOT_FOUND, True),
        (grpc.StatusCode.PERMISSION_DENIED, True),
        (grpc.StatusCode.CANCELLED, True),
        (grpc.StatusCode.FAILED_PRECONDITION, False),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
    ],
)
def test_every_failure_but_a_refusal_is_the_owner_failing_the_step(
    code: grpc.StatusCode, failed: bool
) -> None:
    assert owner_failed(_over_the_wire(code, "x")) is failed


def test_an_owner_s_text_is_kept_as_one_line_of_at_most_500_characters() -> None:
    """An owner's refusal text (a forged log line, then 12,000 characters), which the consumer
    reads, is relayed escaped and cut (the control, the text taken whole, is in
    tests/curator/test_owner_errors.py)."""
    forged = "ok\n2026-01-01 ERROR owner a: FORGED LINE\n" + "z" * 12_000
    relayed = public_text(_over_the_wire(grpc.StatusCode.INVALID_ARGUMENT, forged))
    assert "\n" not in relayed and relayed.startswith("ok\\n2026-01-01 ERROR owner a: FORGED")
    assert relayed.endswith("... (cut)") and relayed.count("z") < 500
