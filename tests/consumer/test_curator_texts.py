"""The consumer keeps the curator's texts (progress messages, errors) as one line of at most
:data:`dpmarket.consumer.convert.CURATOR_TEXT_CHARS` characters."""

from __future__ import annotations

import grpc

from dpmarket.consumer.convert import CURATOR_TEXT_CHARS, event_from_proto
from dpmarket.runtime.status import error_from_rpc
from dpmarket.v1 import curator_pb2

FORGED = "owner a dropped\n2026-01-01 ERROR dpmarket: FORGED LINE\x1b[2K"


def test_a_progress_message_is_one_line_cut() -> None:
    """Control: the curator's message as sent holds the newline and the escape sequence."""
    sent = curator_pb2.WatchSessionResponse(message=FORGED + "y" * 5000)
    assert "\n" in sent.message and "\x1b" in sent.message
    kept = event_from_proto(sent).message
    assert "\n" not in kept and "\x1b" not in kept and "\\n2026-01-01 ERROR" in kept
    assert kept.endswith("... (cut)") and len(kept) < CURATOR_TEXT_CHARS + 20


class _Failed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return FORGED + "y" * 5000


def test_a_curator_error_is_one_line_cut() -> None:
    """The same text as a status's details: one line, cut (the consumer's limit, then an
    owner's 500 as the default)."""
    error = str(error_from_rpc(_Failed(), "curator at c:1", limit=CURATOR_TEXT_CHARS))
    assert "\n" not in error and "\x1b" not in error and "... (cut)" in error
    assert error.count("y") == CURATOR_TEXT_CHARS - len(FORGED)
    assert str(error_from_rpc(_Failed(), "curator at c:1")).count("y") == 500 - len(FORGED)
