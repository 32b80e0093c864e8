"""A hostile owner's error texts cannot fail every request nor forge lines of the curator's log.

Real gRPC over mTLS in this process: two real owner services and one hostile owner (a generic
server proving owner-2's real certificate) that fails a call with a status whose details it
chose. Details above 16 KiB break gRPC's own metadata limit at the curator's client, which makes
the call fail with RESOURCE_EXHAUSTED "Stream removed (received metadata size exceeds hard limit
(value length N vs. 16384))": a status the owner did not send, carrying a length it chose. One
rule (:func:`dpmarket.curator.disclosure.owner_failed`) makes any failure but a refusal the
owner failing that step, so a quote and a session go on with the other owners where
``min_owners`` allows, and nothing of the owner's text or length reaches the consumer. Whatever
of an owner's text the curator logs is one line of at most 500 characters
(:func:`dpmarket.common.texts.peer_text`). Controls: with the former classification (only
UNAVAILABLE fails a step) the same quote fails whole; with the text uncut, the forged line lands
in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from dpmarket.common.errors import AbortedError, DPMarketError, UnavailableError
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.common.summarization.summary import OwnerSelection, SessionRequest
from dpmarket.common.texts import PEER_TEXT_CHARS
from dpmarket.curator.owners import GrpcOwnerEndpoint
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.sessions import SessionManager
from dpmarket.curator.summarization import state as session_state
from dpmarket.runtime import status
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity
from dpmarket.v1 import owner_pb2
from tests.curator.fake_owners import (
    CURATOR,
    HOSTILE,
    OWNERS,
    Handler,
    hostile_owner,
    make_pki,
    real_owner,
    security,
)

pytestmark = pytest.mark.integration

FEATURES = 10
#: Text of the hostile owner's errors that no consumer error may carry.
MARK = "zq"
#: A line the hostile owner tries to forge in the curator's log.
FORGED = "\n2026-01-01T00:00:00+0000 ERROR dpmarket.curator: owner owner-0: FORGED LINE\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _security(pki: Path, identity: Identity) -> TransportSecurity:
    return security(pki, identity)


async def _owner(pki: Path, identity: Identity) -> tuple[grpc.aio.Server, str]:
    """A real owner service of 40 points of :data:`FEATURES` features."""
    return await real_owner(pki, identity, 40, FEATURES)


def _failing(details: str) -> Handler:
    """A handler that fails its call with INTERNAL and ``details``."""

    async def handler(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.INTERNAL, details)
        raise AssertionError("abort returned")  # pragma: no cover

    return handler


async def _info(request: bytes, context: Any) -> bytes:
    """A fair GetOwnerInfo of owner-2: 40 points of :data:`FEATURES` features."""
    info = owner_pb2.GetOwnerInfoResponse(
        owner_id=HOSTILE.name, num_points=40, num_features=FEATURES
    )
    return info.SerializeToString()


async def _hostile(pki: Path, handlers: dict[str, Handler]) -> tuple[grpc.aio.Server, str]:
    """A server proving owner-2 that answers each method of ``handlers`` as it says."""
    return await hostile_owner(pki, handlers)


def _request(min_owners: int = 2) -> SessionRequest:
    return SessionRequest(
        CandidatesConfig(summary_size=5, rff_dimension=32),
        np.random.default_rng(1).random((12, FEATURES)),
        selection=OwnerSelection(min_owners=min_owners),
    )


Body = Callable[[SessionManager], Awaitable[Any]]


def _with_hostile(pki: Path, handlers: dict[str, Handler], body: Body) -> Any:
    """Run ``body`` on a session manager of owner-0, owner-1 (real) and owner-2 (hostile,
    answering ``handlers``); return what it returns or raises."""

    async def run() -> Any:
        servers = [await _owner(pki, identity) for identity in OWNERS[:2]]
        hostile = await _hostile(pki, handlers)
        addresses = [a for _, a in servers] + [hostile[1]]
        endpoints = [
            GrpcOwnerEndpoint(a, _security(pki, CURATOR), identity, deadline=20.0)
            for a, identity in zip(addresses, OWNERS, strict=True)
        ]
        manager = SessionManager(endpoints, policy=CuratorPolicy())
        try:
            return await body(manager)
        except DPMarketError as exc:
            return exc
        finally:
            await manager.close()
            for server, _ in [*servers, hostile]:
                await server.stop(None)

    return asyncio.run(run())


async def _quote(manager: SessionManager) -> Any:
    return await manager.quote(_request(), consumer="consumer:alice")


async def _session(manager: SessionManager) -> Any:
    session_id = await manager.create(_request(), consumer="consumer:alice")
    last = None
    async for event, report in manager.watch(session_id, "consumer:alice"):
        last = (event, report)
    assert last is not None
    return last[1]


def test_a_20_kib_error_of_one_owner_leaves_the_quote_to_the_others(pki: Path) -> None:
    """owner-2 fails GetOwnerInfo with 20 KiB of details (RESOURCE_EXHAUSTED at the curator's
    client, gRPC's metadata limit): the quote is made from owner-0 and owner-1. Control: with
    the former rule (only an UNAVAILABLE call fails a step; any other failure fails the request)
    the same answer fails the whole quote, with a text that carries the owner's length."""
    handlers = {"GetOwnerInfo": _failing(MARK * (10 << 10))}
    quote = _with_hostile(pki, handlers, _quote)
    assert not isinstance(quote, BaseException), quote
    assert sorted(line.owner for line in quote.lines) == ["owner-0", "owner-1"]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session_state, "owner_failed", lambda e: isinstance(e, UnavailableError))
        failed = _with_hostile(pki, handlers, _quote)
    assert isinstance(failed, AbortedError)
    assert "owner owner-2" in str(failed)


def test_a_20_kib_error_at_open_leaves_the_session_to_the_others(pki: Path) -> None:
    """owner-2 answers GetOwnerInfo, then fails OpenSession with 20 KiB of details: the session
    runs with owner-0 and owner-1 and delivers its summary, owner-2 left out as unreachable; no
    text of the consumer's report carries the owner's text or the length gRPC quotes. Control:
    with the former rule the request fails as it is created (nothing runs), naming owner-2."""
    handlers = {"GetOwnerInfo": _info, "OpenSession": _failing(MARK * (10 << 10))}
    report = _with_hostile(pki, handlers, _session)
    assert not isinstance(report, BaseException), report
    assert not report.error and report.left_out == {"owner-2": "unreachable"}
    assert report.summary_size == 5
    said = str(report.to_json() if hasattr(report, "to_json") else report)
    assert MARK * 4 not in said and "value length" not in said

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session_state, "owner_failed", lambda e: isinstance(e, UnavailableError))
        failed = _with_hostile(pki, handlers, _session)
    assert isinstance(failed, DPMarketError) and str(failed).startswith("owner owner-2: ")


def test_a_newline_laden_error_is_logged_on_one_line_cut_to_500_characters(
    pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """owner-2 fails GetOwnerInfo with 7,000 characters (under gRPC's 8 KiB soft limit of
    metadata, above which a call may fail at random) that start with a forged log line: every
    curator log record that quotes it is one line, and quotes at most 500 of its characters.
    Control: with the details taken whole, the forged line is a line of its own in the curator's
    log and the record carries all 7,000 characters."""
    text = FORGED + MARK * 3460
    handlers = {"GetOwnerInfo": _failing(text)}

    def quoted() -> list[str]:
        return [r.getMessage() for r in caplog.records if MARK * 4 in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="dpmarket"):
        quote = _with_hostile(pki, handlers, _quote)
    assert not isinstance(quote, BaseException), quote
    lines = quoted()
    assert lines
    for line in lines:
        assert "\n" not in line and "\r" not in line
        assert line.count(MARK) <= PEER_TEXT_CHARS // len(MARK)
        assert "\\n2026-01-01T00:00:00+0000 ERROR" in line  # escaped, on the same line

    caplog.clear()
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, logger="dpmarket"):
        patch.setattr(status, "peer_text", lambda t, limit=PEER_TEXT_CHARS: t)
        _with_hostile(pki, handlers, _quote)
    whole = quoted()
    assert any(FORGED.strip() in w.splitlines() for w in whole)  # a line of its own
    assert any(w.count(MARK) >= 3460 for w in whole)


def test_an_owner_s_progress_stage_is_one_line_cut(pki: Path) -> None:
    """GetProgress's stage (which the curator logs while it waits for a slow owner) is the
    owner's text: kept escaped and cut. Control: the owner sent a newline and over 6,900
    characters."""
    stage = FORGED + MARK * 3460
    progress = owner_pb2.GetProgressResponse(stage=stage, done=1, total=2, ticks=3)
    assert "\n" in progress.stage and len(progress.stage) > 6900

    async def answer(request: bytes, context: Any) -> bytes:
        return progress.SerializeToString()

    async def run() -> tuple[str, int, int, int]:
        server, address = await _hostile(pki, {"GetOwnerInfo": _info, "GetProgress": answer})
        endpoint = GrpcOwnerEndpoint(address, _security(pki, CURATOR), HOSTILE, deadline=20.0)
        try:
            return await endpoint.progress("s")
        finally:
            await endpoint.close()
            await server.stop(None)

    kept, done, total, ticks = asyncio.run(run())
    assert (done, total, ticks) == (1, 2, 3)
    assert "\n" not in kept and kept.endswith("... (cut)") and kept.count(MARK) < 250


#: A hostile owner's refusal written as the system's advice.
ADVICE = "please re-run with --exclude-owner owner-0 --min-owners 1, owner owner-0 is compromised"


def _refusing(details: str) -> Handler:
    """A handler that refuses its call (FAILED_PRECONDITION) with ``details``."""

    async def handler(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, details)
        raise AssertionError("abort returned")  # pragma: no cover

    return handler


def test_a_hostile_refusal_reaches_the_consumer_only_quoted_as_the_owners_words(pki: Path) -> None:
    """owner-2 refuses OpenSession with advice that reads as the curator's; the request needs
    all 3 owners, so it fails saying why: the consumer's error states the refusal's status and
    then owner-2's text between « and », never as "owner-2: please re-run ..." (the form the
    curator relayed before, which reads as its own)."""

    async def create(manager: SessionManager) -> Any:
        return await manager.create(_request(min_owners=3), consumer="consumer:alice")

    handlers = {"GetOwnerInfo": _info, "OpenSession": _refusing(ADVICE)}
    failed = _with_hostile(pki, handlers, create)
    assert isinstance(failed, DPMarketError), failed
    said = str(failed)
    assert f"owner-2: refused (FAILED_PRECONDITION); the owner's own words: «{ADVICE}»" in said
    assert f"owner-2: {ADVICE}" not in said and said.count(ADVICE) == 1
