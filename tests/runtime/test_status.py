"""Mapping failed calls to protocol errors, across one hop and across a relay, and failures on an
owner's private data to the one fixed INTERNAL status."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dpmarket.common import errors
from dpmarket.runtime.status import INTERNAL_MESSAGE, abort_for, error_from_rpc


class _Failed(grpc.RpcError):
    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        trailing: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc-stubs types the trailing metadata as _Metadatum objects; grpc gives (key, value) pairs
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._trailing


def test_a_failed_call_becomes_the_error_of_its_code_naming_peer_and_code() -> None:
    exc = error_from_rpc(_Failed(grpc.StatusCode.FAILED_PRECONDITION, "no budget"), "owner at x")
    assert isinstance(exc, errors.FailedPreconditionError)
    assert str(exc) == "owner at x: no budget (FAILED_PRECONDITION)"


def test_a_relayed_status_names_its_code_once() -> None:
    owner = error_from_rpc(_Failed(grpc.StatusCode.INVALID_ARGUMENT, "bad row 3"), "owner at x")
    # The curator aborts with the owner's message; the consumer maps the relayed status.
    relayed = error_from_rpc(_Failed(grpc.StatusCode.INVALID_ARGUMENT, str(owner)), "curator at y")
    assert str(relayed) == "curator at y: owner at x: bad row 3 (INVALID_ARGUMENT)"


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN])
def test_codes_without_protocol_meaning_abort(code: grpc.StatusCode) -> None:
    assert isinstance(error_from_rpc(_Failed(code, "boom"), "p"), errors.AbortedError)


class _Aborted(Exception):
    pass


class _Context:
    """What :func:`abort_for` needs of a servicer context: ``abort`` records and raises."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None
        self.trailing: tuple[tuple[str, str], ...] = ()

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[()] = ()
    ) -> None:
        self.status = (code, details)
        self.trailing = tuple(trailing_metadata)
        raise _Aborted


def _abort(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    context = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(abort_for(exc, context, "Handler"))  # type: ignore[arg-type]
    return context.status


def _private(value: float) -> errors.PrivateDataError:
    with pytest.raises(errors.PrivateDataError) as info, errors.on_private_data("CAPE release"):
        raise ValueError(f"value out of bounds at row 17: {value}")
    return info.value


def test_a_failure_on_private_data_leaves_as_the_fixed_internal_status_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever the rows hold, the wire carries INTERNAL and the one fixed message of every
    internal error; the detail is in the owner's log."""
    statuses = set()
    with caplog.at_level("ERROR", logger="dpmarket.runtime.status"):
        for value in (151.0, 2.0, -7.5):
            statuses.add(_abort(_private(value)))
    assert statuses == {(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)}
    assert _abort(RuntimeError("a bug")) == (grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    assert "CAPE release: value out of bounds at row 17: 151.0" in caplog.text


def test_deliberate_errors_keep_their_code_and_text_and_pass_through_the_guard() -> None:
    """A refusal raised on purpose (public text) is relayed as is; the guard never wraps a
    PrivateDataError twice and lets BaseException through."""
    refusal = errors.FailedPreconditionError("budget: 0.5 left")
    assert _abort(refusal) == (grpc.StatusCode.FAILED_PRECONDITION, "budget: 0.5 left")
    inner = _private(1.0)
    with pytest.raises(errors.PrivateDataError) as info, errors.on_private_data("outer"):
        raise inner
    assert info.value is inner
    with pytest.raises(KeyboardInterrupt), errors.on_private_data("outer"):
        raise KeyboardInterrupt


def test_a_budget_refusal_is_marked_on_the_wire_and_recognised_without_its_text() -> None:
    """An owner's budget refusal leaves as FAILED_PRECONDITION with a mark in its trailing
    metadata; its caller (the curator) gets a BudgetRefusedError, whatever the text says, and
    keeps the owner's own text apart from its name. The control: the same status unmarked is
    a plain FailedPreconditionError."""
    context = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(abort_for(errors.BudgetRefusedError("spent 1 of 2, 1 left"), context, "Bid"))  # type: ignore[arg-type]
    assert context.status == (grpc.StatusCode.FAILED_PRECONDITION, "spent 1 of 2, 1 left")
    marked = _Failed(grpc.StatusCode.FAILED_PRECONDITION, "spent 1 of 2, 1 left", context.trailing)
    exc = error_from_rpc(marked, "owner o")
    assert isinstance(exc, errors.BudgetRefusedError)
    assert exc.remote == errors.RemoteStatus("FAILED_PRECONDITION", "spent 1 of 2, 1 left")
    plain = error_from_rpc(_Failed(grpc.StatusCode.FAILED_PRECONDITION, "x"), "owner o")
    assert type(plain) is errors.FailedPreconditionError
