"""Mapping failed calls to protocol errors, across one hop and across a relay."""

from __future__ import annotations

import grpc
import pytest

from common import errors
from runtime.status import error_from_rpc


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


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
