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
    public_reason,
    public_text,
    refusal_text,
)
from dpmarket.runtime.replies import ReplyTooLargeError
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


def _own(code: str, text: str) -> str:
    """What a consumer reads of an owner's refusal ``text`` of status ``code`` naming no key."""
    verb = "aborted" if code == "ABORTED" else "refused"
    return f"{verb} ({code}); the owner's own words: «{text}»"


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
        # Refusals an owner decides on public inputs: the status, then its own text quoted as
        # its own words, without its name twice.
        (
            _over_the_wire(grpc.StatusCode.INVALID_ARGUMENT, "h1 dimension d=9000 exceeds 4096"),
            _own("INVALID_ARGUMENT", "h1 dimension d=9000 exceeds 4096"),
        ),
        (
            _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, "expected round 2, got round 5"),
            _own("FAILED_PRECONDITION", "expected round 2, got round 5"),
        ),
        (
            _over_the_wire(grpc.StatusCode.ABORTED, "the job was aborted"),
            _own("ABORTED", "the job was aborted"),
        ),
        # A key of the owner's policy is named by the curator, in the status's brackets.
        (
            _over_the_wire(
                grpc.StatusCode.FAILED_PRECONDITION, "access.allow_steered_selection off"
            ),
            "refused (FAILED_PRECONDITION: access.allow_steered_selection); the owner's own "
            "words: «access.allow_steered_selection off»",
        ),
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
        (
            errors.AbortedError("a signed count does not verify"),
            _own("ABORTED", "a signed count does not verify"),
        ),
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
    assert "\n" not in relayed
    forged_head = "ok\\n2026-01-01 ERROR owner a: FORGED"
    assert relayed.startswith(_own("INVALID_ARGUMENT", forged_head)[:-1])
    assert relayed.endswith("... (cut)»") and relayed.count("z") < 500


HOSTILE = (
    "please re-run with --exclude-owner a --min-owners 1, owner a is compromised» owner a: "
    "its privacy budget does not allow this session (budget refused)"
)


def test_a_hostile_refusal_reads_as_the_owners_own_words_not_the_curators() -> None:
    """A hostile owner's refusal written as advice of the system's reaches the consumer only
    inside a quote it cannot close (its » escaped), after what the curator vouches for: the
    status, and no policy key (the text names none of the list's as a whole dotted name)."""
    answer = _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, HOSTILE)
    relayed = str(public_error("b", answer))
    head = "owner b: refused (FAILED_PRECONDITION); the owner's own words: «please re-run"
    assert relayed.startswith(head), relayed
    assert relayed.endswith("»") and relayed.count("»") == 1 and "\\u00bb owner a:" in relayed
    assert public_reason(answer) == "refused (FAILED_PRECONDITION)"


def test_the_control_the_owners_text_taken_whole_reads_as_the_curators() -> None:
    """Control: relayed as it came (the form before quoting), the same refusal reads as the
    curator's own advice, with a forged second reason after it."""
    answer = _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, HOSTILE)
    assert answer.remote is not None
    whole = f"owner b: {answer.remote.details}"
    assert whole.startswith("owner b: please re-run with --exclude-owner a")
    assert "» owner a: its privacy budget" in whole


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        (
            "access.allow_exact_bids and access.allow_steered_selection off",
            "access.allow_exact_bids, access.allow_steered_selection",
        ),
        ("below this owner's floor of 2 (its policy's cape.min_colluders)", "cape.min_colluders"),
        ("cape.made_up off", ""),  # a dotted name that is no policy key
        ("access.curators.evil off", ""),  # a key inside a longer dotted name
    ],
)
def test_only_keys_of_the_owners_policy_are_named_as_the_curators_words(
    text: str, keys: str
) -> None:
    answer = _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, text)
    assert public_reason(answer) == f"refused (FAILED_PRECONDITION{': ' + keys if keys else ''})"


def test_the_short_reasons_of_a_report() -> None:
    """A report's reason: budget refused (without its figures), a refusal's status and keys,
    the method and limit of a reply refused for its size, else unreachable."""
    budget = _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, "spent 9.5 of 10", budget=True)
    assert public_reason(budget) == "budget refused" == refusal_text(budget)
    big = ReplyTooLargeError("owner b", "GetOwnerInfo", 1_089_536)
    assert public_reason(big) == "reply over 1.04 MiB to GetOwnerInfo"
    assert public_reason(_over_the_wire(grpc.StatusCode.UNAVAILABLE, ADDRESS)) == "unreachable"
    floor = _over_the_wire(grpc.StatusCode.FAILED_PRECONDITION, "floor (cape.min_colluders)")
    assert refusal_text(floor) == (
        "refused (FAILED_PRECONDITION: cape.min_colluders); the owner's own words: "
        "«floor (cape.min_colluders)»"
    )
