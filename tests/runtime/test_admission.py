"""Every call is admitted before its request is read: role, calls at once, the RPC's own limit.

Real grpc.aio servers started by :func:`dpmarket.runtime.serving.start_server` over mTLS with
certificates of a test CA serve small probe servicers (an owner's unary ``GetProgress`` and
bidirectional ``RunRounds``, a curator's server-streaming ``WatchSession``) whose handlers count
what reaches them. A status of ``PERMISSION_DENIED`` for a request above the server's own receive
limit shows that nothing of it was read: gRPC answers a message it reads above that limit
``RESOURCE_EXHAUSTED``. The limits every production servicer declares are checked against requests
built at its policy's bounds. How much memory a refused party can make a real service process hold
is measured in ``tests/integration/test_trust.py``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.secagg.protocol import KeyAdvertisement
from dpmarket.common.sketches.marginals import MarginalsMechanism
from dpmarket.common.sketches.spec import SketchDeclaration
from dpmarket.curator.cape_service import cape_limits
from dpmarket.curator.policy import CuratorPolicy
from dpmarket.curator.service import curator_limits
from dpmarket.curator.sketch_service import catalog_limits
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.cape_service import (
    MAX_SITES,
    SITE_BYTES,
    cape_site_limits,
    secure_aggregation_limits,
)
from dpmarket.owner.protocol import Owner
from dpmarket.owner.service import owner_limits
from dpmarket.runtime import admission, allocator, cape_messages, rpc_trace, sketch_messages
from dpmarket.runtime.admission import (
    OPEN_CALLS_PER_CALLER,
    OPEN_CALLS_PER_CLASS,
    OTHERS,
    READS_AT_ONCE,
    READS_PER_CALLER,
    SMALL_REQUEST_BYTES,
    CallerShares,
    RequestBudget,
    ServiceLimits,
)
from dpmarket.runtime.allocator import release_free_memory
from dpmarket.runtime.arrays import array_from_proto, array_to_proto
from dpmarket.runtime.authz import Authorizer, rpc, rpc_stream
from dpmarket.runtime.framing import FRAME_BYTES, PiecesAioChannel, most_pieces
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.tables import PointSet, Table
from dpmarket.runtime.transport import TransportSecurity, aio_channel, sync_channel
from dpmarket.v1 import (
    cape_pb2,
    curator_pb2,
    curator_pb2_grpc,
    owner_pb2,
    owner_pb2_grpc,
    secure_aggregation_pb2,
    sketch_pb2,
)
from tests.runtime.test_authz import SERVICES

CURATOR = Identity("curator", "curator")
OWNER = Identity("owner", "owner-0")
ALICE = Identity("consumer", "alice")
BOB = Identity("consumer", "bob")
#: Consumers whose calls send nothing (many identities), and two more curators of the owner.
SILENT = [Identity("consumer", f"silent-{k}") for k in range(8)]
CURATOR_B = Identity("curator", "curator-b")
CURATOR_C = Identity("curator", "curator-c")
#: The probe owner's limits: GetProgress's, RunRounds', Bid's and OpenSession's (above one
#: message: its requests come in pieces).
PROGRESS_LIMIT = 4096
ROUNDS_LIMIT = 8192
SERVER_LIMIT = 256 << 10
UPLOAD_LIMIT = 3 * FRAME_BYTES + (64 << 10)
#: Deadline of every call: a safety net against a hang, not a timing assertion.
DEADLINE = 30.0
SEND = [("grpc.max_send_message_length", 64 << 20)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_ca(root)
    issue_all(root, [CURATOR, OWNER, ALICE, BOB, CURATOR_B, CURATOR_C, *SILENT])
    return root


def _security(pki: Path, identity: Identity) -> TransportSecurity:
    return TransportSecurity.from_files(*identity_files(pki, identity))


class ProbeOwner(owner_pb2_grpc.OwnerServiceServicer):
    """An owner's GetProgress and RunRounds for the curator; counts the requests they read.

    ``GetProgress`` waits for :attr:`release` while :attr:`hold` is set."""

    def __init__(self, concurrent_calls: int = 64, calls_per_caller: int | None = None) -> None:
        self.authorizer = Authorizer({"curator": ("curator", "curator-b", "curator-c")})
        self.limits = ServiceLimits(
            {
                "GetProgress": PROGRESS_LIMIT,
                "RunRounds": ROUNDS_LIMIT,
                "Bid": SERVER_LIMIT,
                "OpenSession": UPLOAD_LIMIT,
            },
            concurrent_calls=concurrent_calls,
            calls_per_caller=calls_per_caller,
        )
        self.reached = 0
        self.hold = False
        self.release = asyncio.Event()
        #: The bytes of every OpenSession request it received, as it serializes them.
        self.opened: list[bytes] = []

    @rpc("curator")
    async def OpenSession(self, request, context, caller):
        self.reached += 1
        self.opened.append(request.SerializeToString())
        return owner_pb2.OpenSessionResponse(num_points=request.omega.ByteSize())

    @rpc("curator")
    async def GetProgress(self, request, context, caller):
        self.reached += 1
        if self.hold:
            await self.release.wait()
        return owner_pb2.GetProgressResponse(done=len(request.session_id))

    @rpc_stream("curator")
    async def RunRounds(self, request_iterator, context, caller):
        async for _request in request_iterator:
            self.reached += 1
            yield owner_pb2.RunRoundsResponse(bid=owner_pb2.BidResponse(times_best=self.reached))


class ProbeCurator(curator_pb2_grpc.CuratorServiceServicer):
    """A curator's WatchSession for consumers: two events per call."""

    def __init__(self) -> None:
        self.authorizer = Authorizer({"consumer": None})
        self.reached = 0

    @rpc_stream("consumer")
    async def WatchSession(self, request, context, caller):
        self.reached += 1
        for round_ in (1, 2):
            yield curator_pb2.WatchSessionResponse(round=round_, message=request.session_id[:8])


Scenario = Callable[[Callable[[Identity], grpc.aio.Channel], ProbeOwner, ProbeCurator], Any]


def _run(
    pki: Path,
    scenario: Scenario,
    owner: ProbeOwner | None = None,
    target: list[str] | None = None,
    *,
    served: list[Authorizer] | None = None,
) -> None:
    """Serve the probes (as one owner-0 server) and run ``scenario(connect, owner, curator)``;
    the server's address is appended to ``target``, if given. ``served``: the authorizers of the
    parties the server serves (``start_server``'s), whose roles' classes keep their own health
    and reflection calls."""
    # The generated servicer stubs declare every RPC abstract; grpc's servicer answers
    # UNIMPLEMENTED for those a probe does not define.
    owner = owner or ProbeOwner()  # type: ignore[abstract]
    curator = ProbeCurator()  # type: ignore[abstract]

    async def main() -> None:
        def register(server: grpc.aio.Server) -> None:
            owner_pb2_grpc.add_OwnerServiceServicer_to_server(owner, server)
            curator_pb2_grpc.add_CuratorServiceServicer_to_server(curator, server)

        names = ["dpmarket.v1.OwnerService", "dpmarket.v1.CuratorService"]
        security = _security(pki, OWNER)
        server, port, _ = await start_server(
            register, names, "127.0.0.1:0", security, served=served
        )
        if target is not None:
            target.append(f"127.0.0.1:{port}")
        channels: list[grpc.aio.Channel] = []

        def connect(caller: Identity) -> grpc.aio.Channel:
            channel = aio_channel(f"127.0.0.1:{port}", _security(pki, caller), OWNER, SEND)
            channels.append(channel)
            return channel

        try:
            await scenario(connect, owner, curator)
        finally:
            for channel in channels:
                await channel.close(None)
            await server.stop(None)

    asyncio.run(main())


async def _code(call: Coroutine[Any, Any, Any] | Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _progress(size: int) -> owner_pb2.GetProgressRequest:
    """A GetProgressRequest of exactly ``size`` bytes (``size >= 2``)."""
    n = size - 2
    request = owner_pb2.GetProgressRequest(session_id="x" * n)
    while request.ByteSize() > size:
        n -= 1
        request.session_id = "x" * n
    assert request.ByteSize() == size
    return request


# ------------------------------------------------------------------------------ behaviour
def test_a_refused_caller_is_answered_before_its_request_is_read(pki: Path) -> None:
    async def scenario(connect, owner, curator):
        huge = _progress(4 * SERVER_LIMIT)  # above what this server reads at all
        for caller in (ALICE, CURATOR):
            stub = owner_pb2_grpc.OwnerServiceStub(connect(caller))
            code, details = await _code(stub.GetProgress(huge, timeout=DEADLINE))
            if caller == ALICE:
                # Refused on the certificate: read, the request would be RESOURCE_EXHAUSTED.
                assert code == grpc.StatusCode.PERMISSION_DENIED, details
                assert "may not call" in details
            else:
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert owner.reached == 0
        # The same for a stream: refused at its start, before its first message is read.
        stub = owner_pb2_grpc.OwnerServiceStub(connect(ALICE))
        big = owner_pb2.RunRoundsRequest(bid=owner_pb2.BidRequest(session_id="y" * SERVER_LIMIT))
        code, _ = await _code(_drain(stub.RunRounds(iter([big]), timeout=DEADLINE)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        curator_stub = curator_pb2_grpc.CuratorServiceStub(connect(CURATOR))
        watch = curator_pb2.WatchSessionRequest(session_id="z" * (4 * SERVER_LIMIT))
        code, _ = await _code(_drain(curator_stub.WatchSession(watch, timeout=DEADLINE)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert owner.reached == 0 and curator.reached == 0

    _run(pki, scenario)


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (polling every 10 ms); fail after :data:`DEADLINE` seconds."""
    for _ in range(int(DEADLINE * 100)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not hold in time")


async def _drain(call: Any) -> list[Any]:
    return [message async for message in call]


def test_an_admitted_request_is_held_to_its_rpcs_own_limit_unparsed(pki: Path) -> None:
    async def scenario(connect, owner, curator):
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        request = _progress(PROGRESS_LIMIT)
        response = await stub.GetProgress(request, timeout=DEADLINE)
        assert response.done == len(request.session_id)
        code, details = await _code(stub.GetProgress(_progress(PROGRESS_LIMIT + 1)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            f"a GetProgress request of {PROGRESS_LIMIT + 1} bytes exceeds this method's limit "
            f"of {PROGRESS_LIMIT} bytes"
        ) in details
        assert owner.reached == 1
        # Each message of a client stream is held to the limit as its handler reads it.
        small = owner_pb2.RunRoundsRequest(bid=owner_pb2.BidRequest(session_id="s"))
        large = owner_pb2.RunRoundsRequest(bid=owner_pb2.BidRequest(session_id="l" * ROUNDS_LIMIT))
        responses: list[Any] = []

        async def stream() -> None:
            async for message in stub.RunRounds(iter([small, small, large]), timeout=DEADLINE):
                responses.append(message)

        code, details = await _code(stream())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "RunRounds request of" in details
        assert [r.bid.times_best for r in responses] == [2, 3]
        assert owner.reached == 3
        # A consumer's admitted server stream is served whole.
        watcher = curator_pb2_grpc.CuratorServiceStub(connect(ALICE))
        events = await _drain(watcher.WatchSession(curator_pb2.WatchSessionRequest(session_id="s")))
        assert [e.round for e in events] == [1, 2]

    _run(pki, scenario)


def _opening(size: int) -> owner_pb2.OpenSessionRequest:
    """An OpenSessionRequest of about ``size`` bytes: random omega values (so that a piece out
    of place would change them), an id and terms."""
    values = np.random.default_rng(size).standard_normal(size // 8)
    return owner_pb2.OpenSessionRequest(
        session_id="s" * 40, omega=array_to_proto(values), gamma=0.5, consumer="consumer:alice"
    )


def test_a_request_above_one_message_arrives_in_pieces_byte_for_byte(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unary request above FRAME_BYTES goes in pieces; the handler gets the very message the
    client serialized (async and blocking channels), and its RPC's own limit holds its total:
    declared above it, refused before a byte is read; undeclared, a request is one message. The
    call record (``rpc_trace``) counts a call in pieces once, with the request's size."""
    trace = tmp_path / "calls.jsonl"
    monkeypatch.setenv(rpc_trace.TRACE_ENV, str(trace))
    request = _opening(3 * FRAME_BYTES)
    sent = request.SerializeToString()
    assert FRAME_BYTES < len(sent) <= UPLOAD_LIMIT
    too_large = _opening(4 * FRAME_BYTES).SerializeToString()
    open_session = "/dpmarket.v1.OwnerService/OpenSession"

    def blocking_calls(target: str) -> list[tuple[grpc.StatusCode, str]]:
        with sync_channel(target, _security(pki, CURATOR), OWNER, SEND) as channel:
            stub = owner_pb2_grpc.OwnerServiceStub(channel)
            stub.OpenSession(request, timeout=DEADLINE)
            stub.OpenSession.future(request, timeout=DEADLINE).result()
            # Clients that send otherwise (the channel under the pieces): their status each.
            raw = channel.channel.stream_unary(open_session, None, None)

            def declaring(size: int) -> tuple[tuple[str, str | bytes], ...]:
                return (("dpmarket-request-bytes", str(size)),)

            def cut(data: bytes, size: int) -> list[bytes]:
                return [data[i : i + size] for i in range(0, len(data), size)]

            outcomes = []
            for pieces, metadata in [
                (cut(sent, 1024), declaring(len(sent))),  # more pieces than the limit needs
                (cut(sent, FRAME_BYTES), None),  # undeclared: the first message is the request
                (cut(sent, FRAME_BYTES), declaring(len(sent) - 1)),  # more than declared
                ([sent], None),  # one message above the frame: gRPC refuses it
                # A size int() cannot read (over 4,300 digits): refused as a bad declaration.
                (cut(sent, FRAME_BYTES), (("dpmarket-request-bytes", "9" * 5000),)),
            ]:
                try:
                    raw(iter(pieces), metadata=metadata, timeout=DEADLINE)
                    outcomes.append((grpc.StatusCode.OK, ""))
                except grpc.RpcError as exc:
                    outcomes.append((exc.code(), exc.details() or ""))
            return outcomes

    async def scenario(connect, owner, curator):
        channel = connect(CURATOR)
        assert isinstance(channel, PiecesAioChannel)
        stub = owner_pb2_grpc.OwnerServiceStub(channel)
        response = await stub.OpenSession(request, timeout=DEADLINE)
        assert response.num_points == request.omega.ByteSize()
        assert owner.opened == [sent]
        # Declared above the method's limit: refused before a piece is read.
        too = owner_pb2.OpenSessionRequest.FromString(too_large)
        code, details = await _code(stub.OpenSession(too, timeout=DEADLINE))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert (
            f"a OpenSession request of {len(too_large)} bytes exceeds this method's limit of "
            f"{UPLOAD_LIMIT} bytes"
        ) in details
        # A refused caller's pieces: refused for what it is, none of them read.
        alice = owner_pb2_grpc.OwnerServiceStub(connect(ALICE))
        code, details = await _code(alice.OpenSession(request, timeout=DEADLINE))
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        assert owner.reached == 1
        outcomes = await asyncio.to_thread(blocking_calls, channel_target[0])
        assert owner.opened == [sent] * 3
        tiny, undeclared, lying, whole, unreadable = outcomes
        assert tiny[0] == grpc.StatusCode.RESOURCE_EXHAUSTED, tiny
        assert f"in more than {most_pieces(UPLOAD_LIMIT)} pieces" in tiny[1]
        assert undeclared == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "the OpenSession request does not parse",
        )
        assert lying[0] == grpc.StatusCode.INVALID_ARGUMENT, lying
        assert f"more than the {len(sent) - 1} bytes" in lying[1]
        assert whole[0] == grpc.StatusCode.RESOURCE_EXHAUSTED, whole
        assert unreadable[0] == grpc.StatusCode.INVALID_ARGUMENT, unreadable
        assert "must be the request's size in bytes" in unreadable[1]
        assert owner.reached == 3
        opened = [r for r in rpc_trace.read_records(trace) if r.name == "OpenSession"]
        served = [(r.request_bytes, r.responses) for r in opened if r.code == "OK"]
        assert served == [(len(sent), 1)] * 3

    channel_target: list[str] = []
    _run(pki, scenario, target=channel_target)


@pytest.mark.parametrize(("wait", "caller"), [(0.5, CURATOR_B), (None, CURATOR_B), (0.5, CURATOR)])
def test_calls_that_send_nothing_hold_the_reads_only_for_a_while_once_others_wait(
    pki: Path, monkeypatch: pytest.MonkeyPatch, wait: float | None, caller: Identity
) -> None:
    """READS_AT_ONCE calls that open and send no request (no deadline) took every read slot, and
    every other call of every service waited behind them until they ended: once another call
    waits (here another curator's, for a turn; the turns' grace is off, to show this rule
    alone), they are refused (RESOURCE_EXHAUSTED) at their next look, READ_WAIT_SECONDS apart,
    until it is served: one, here, whose turn goes to it. Control (``wait`` None: no bound):
    the waiting call misses its deadline. The staller's own next call is no other call
    waiting (``caller`` CURATOR): a caller alone keeps its reads however slow its link, and its
    own calls wait behind them.
    (One caller makes the stalled calls: it may hold every turn here, as any caller could
    before :class:`~dpmarket.runtime.admission.CallerShares`, whose tests follow.)"""
    monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 1e9 if wait is None else wait)
    monkeypatch.setattr(admission, "READS_PER_CALLER", READS_AT_ONCE)
    monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 1e9)
    method = "/dpmarket.v1.OwnerService/GetProgress"

    async def scenario(connect, owner, curator):
        channel = connect(CURATOR)
        stall = channel.channel.stream_unary(method, None, None)
        stalled = [asyncio.ensure_future(_code(stall())) for _ in range(READS_AT_ONCE)]
        await asyncio.sleep(0.2)  # the stalled calls have taken their slots
        stub = owner_pb2_grpc.OwnerServiceStub(connect(caller))
        code, details = await _code(stub.GetProgress(_progress(8), timeout=3.0))
        if wait is None or caller == CURATOR:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
            assert not any(call.done() for call in stalled)
            for call in stalled:
                call.cancel()
            return
        assert code == grpc.StatusCode.OK, details
        # One stalled call was refused, its turn handed on; nobody waits now: the rest keep
        # theirs. The refusal reaches this client's loop on its own schedule (under load, after
        # GetProgress's answer): wait for the first to end, then give any other a moment to.
        await asyncio.wait(stalled, timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.3)
        refused = [call for call in stalled if call.done()]
        assert len(refused) == 1
        code, details = refused[0].result()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "did not arrive within 0.5 s" in details
        for call in stalled:
            call.cancel()

    _run(pki, scenario)


@pytest.fixture
def admissions(monkeypatch: pytest.MonkeyPatch) -> list[admission.Admission]:
    """The Admission of each server a test starts, in order."""
    made: list[admission.Admission] = []
    real = admission.Admission.__init__

    def recording(self: admission.Admission, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(admission.Admission, "__init__", recording)
    return made


def _others_calls(connect: Callable[[Identity], grpc.aio.Channel]) -> list[Any]:
    """Another party's calls on the server, with a deadline well under READ_WAIT_SECONDS: a
    consumer's WatchSession (a protected service) and a health Check (an open one)."""
    watcher = curator_pb2_grpc.CuratorServiceStub(connect(ALICE))
    health = health_pb2_grpc.HealthStub(connect(BOB))
    watch = watcher.WatchSession(curator_pb2.WatchSessionRequest(session_id="s"), timeout=3.0)
    return [_code(_drain(watch)), _code(health.Check(health_pb2.HealthCheckRequest(), timeout=3.0))]


@pytest.mark.parametrize("fair", [True, False])
def test_one_callers_stalled_calls_do_not_delay_another_callers_reads(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], fair: bool
) -> None:
    """The curator opens READS_AT_ONCE calls that send nothing (each would hold a read turn for
    READ_WAIT_SECONDS): it holds its share of the turns, its other calls wait on their own, and
    a consumer's
    calls (a protected service and an open one) are served at once. Its own next call waits
    behind its stalled ones and is served once they end; its share is then dropped. Control
    (one caller may hold every turn, and keeps a turn READ_WAIT_SECONDS whoever waits): the
    consumer's protected call misses its deadline."""
    if not fair:
        monkeypatch.setattr(admission, "READS_PER_CALLER", READS_AT_ONCE)
        monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 1e9)
    method = "/dpmarket.v1.OwnerService/GetProgress"

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        stall = connect(CURATOR).channel.stream_unary(method, None, None)
        stalled = [asyncio.ensure_future(_code(stall())) for _ in range(READS_AT_ONCE)]

        def calls() -> int:
            return sum(share.calls for share in shares.callers.values())

        await _until(lambda: calls() == READS_AT_ONCE)
        mine = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        own = asyncio.ensure_future(_code(mine.GetProgress(_progress(8), timeout=DEADLINE)))
        await _until(lambda: calls() == READS_AT_ONCE + 1)
        outcomes = await asyncio.gather(*_others_calls(connect))
        if not fair:  # the health check reads apart from the turns (OPEN_READS_APART)
            assert [code for code, _ in outcomes] == [
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.OK,
            ]
        else:
            assert outcomes == [(grpc.StatusCode.OK, "")] * 2
            assert owner.reached == 0 and not own.done()  # behind its own stalled calls
        for call in stalled:
            call.cancel()
        assert await own == (grpc.StatusCode.OK, "")
        assert owner.reached == 1
        await _until(lambda: not shares.callers)
        assert shares.budget.held == 0

    _run(pki, scenario)


@pytest.mark.parametrize("apart", [True, False])
def test_stalled_health_probes_of_two_identities_do_not_hold_the_other_services_reads(
    pki: Path, monkeypatch: pytest.MonkeyPatch, apart: bool
) -> None:
    """Two consumers and two more curators open a health call each and send nothing (four in
    all): the curator's call to the owner service is served at once, as the open services
    read outside the server's turns. Control (they read with the turns, each kept
    READ_WAIT_SECONDS whoever waits): the four stalled probes hold every turn and the curator's
    call misses its deadline (a stranger's finding: a consumer and an owner's certificate slowed
    every curator call to an owner by about 10 s)."""
    monkeypatch.setattr(admission, "OPEN_READS_APART", apart)
    if not apart:
        monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 1e9)
    method = "/grpc.health.v1.Health/Check"

    async def scenario(connect, owner, curator):
        stalled = [
            asyncio.ensure_future(_code(connect(who).channel.stream_unary(method, None, None)()))
            for who in (ALICE, BOB, CURATOR_B, CURATOR_C)
        ]
        await asyncio.sleep(0.5)  # the probes are admitted and waiting for their requests
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        code, details = await _code(stub.GetProgress(_progress(8), timeout=3.0))
        for call in stalled:
            call.cancel()
        if apart:
            assert code == grpc.StatusCode.OK, details
        else:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details

    _run(pki, scenario)


@pytest.mark.parametrize("fair", [True, False])
def test_one_callers_stalled_declared_requests_do_not_hold_the_others_budget(
    pki: Path, admissions: list[Any], monkeypatch: pytest.MonkeyPatch, fair: bool
) -> None:
    """With a budget of two declared requests, the curator declares two and sends nothing: it
    holds its share, one of them, its second waits on its own share, and the consumer's calls
    are served at once. Its own next request is served once its stalled ones end. Control (a
    caller's share is the whole budget, no lane for small requests beyond it): the two stalled
    requests hold it all, and the consumer's calls miss their deadline."""
    declared = UPLOAD_LIMIT
    real = admission.Admission.__init__

    def sized(self: admission.Admission, *args: Any, **kwargs: Any) -> None:
        caller_bytes = declared if fair else 2 * declared
        real(self, *args, budget_bytes=2 * declared, caller_bytes=caller_bytes, **kwargs)

    monkeypatch.setattr(admission.Admission, "__init__", sized)
    if not fair:
        monkeypatch.setattr(admission, "SMALL_LANE_BYTES", 0)
    request = _opening(3 * FRAME_BYTES)
    metadata = (("dpmarket-request-bytes", str(declared)),)
    method = "/dpmarket.v1.OwnerService/OpenSession"

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        stall = connect(CURATOR).channel.stream_unary(method, None, None)
        stalled = [asyncio.ensure_future(_code(stall(metadata=metadata))) for _ in range(2)]
        await _until(lambda: shares.budget.held == (1 if fair else 2) * declared)
        await _until(lambda: sum(s.calls for s in shares.callers.values()) == 2)
        mine = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        own = asyncio.ensure_future(_code(mine.OpenSession(request, timeout=DEADLINE)))
        outcomes = await asyncio.gather(*_others_calls(connect))
        if not fair:
            assert [code for code, _ in outcomes] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
        else:
            assert outcomes == [(grpc.StatusCode.OK, "")] * 2
            assert shares.budget.held == declared and not own.done()
        for call in stalled:
            call.cancel()
        assert await own == (grpc.StatusCode.OK, "")
        assert owner.opened == [request.SerializeToString()]
        await _until(lambda: not shares.callers)
        assert shares.budget.held == 0

    _run(pki, scenario)


@pytest.mark.parametrize("fair", [True, False])
def test_one_callers_stalled_calls_at_its_cap_leave_the_others_calls_at_once(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], fair: bool
) -> None:
    """A consumer opens as many ``WatchSession`` calls as the service serves at once and sends
    nothing on any: it holds half of them (its own cap), the rest are refused at once
    (RESOURCE_EXHAUSTED, naming its limit), and another consumer's call is served. Control (a
    caller's cap is the service's limit, as every caller's was): the stalled calls fill the
    service, and the other consumer's call is RESOURCE_EXHAUSTED. Nothing is kept of either
    caller once its calls have ended."""
    calls = 8
    limits = ServiceLimits(concurrent_calls=calls, calls_per_caller=None if fair else calls)
    monkeypatch.setattr(ProbeCurator, "limits", limits, raising=False)
    service = "dpmarket.v1.CuratorService"

    async def scenario(connect, owner, curator):
        active = admissions[0].active
        stall = connect(ALICE).channel.stream_stream(f"/{service}/WatchSession", None, None)
        stalled = [stall() for _ in range(calls)]
        admitted = calls // 2 if fair else calls
        await _until(lambda: active.get(service) == admitted)
        await _until(lambda: sum(call.done() for call in stalled) == calls - admitted)
        for call in stalled:
            if call.done():
                assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"{ALICE} has its limit of {admitted} calls at once" in await call.details()
        watcher = curator_pb2_grpc.CuratorServiceStub(connect(BOB))
        request = curator_pb2.WatchSessionRequest(session_id="s")
        code, details = await _code(_drain(watcher.WatchSession(request, timeout=3.0)))
        if fair:
            assert (code, details) == (grpc.StatusCode.OK, "")
            assert curator.reached == 1
        else:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert f"serving its limit of {calls} calls at once" in details
        for call in stalled:
            call.cancel()
        await _until(lambda: not active and not admissions[0].shares.callers)

    _run(pki, scenario)


@pytest.mark.parametrize("wait", [0.5, None])
def test_a_call_queued_behind_its_callers_stalled_reads_is_refused_within_the_read_wait(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], wait: float | None
) -> None:
    """The curator's read turns are held by its calls that send nothing (their wait for a
    message unbounded here), and another of its calls queues for a turn while another call
    waits (curator-b's stalled calls hold the server's other turns, curator-c's call waits for
    one; the turns' grace is off): it is refused (RESOURCE_EXHAUSTED) once it has waited
    ``READ_WAIT_SECONDS``, unread, and gives its calls-at-once slot back while the stalled calls
    still hold theirs. Control (``wait`` None: no bound on the wait for a turn): the queued call
    holds its slot until its client's deadline. (Alone, a caller's queued calls wait behind its
    slow reads: the test above.)"""
    monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 1e9)
    monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 1e9)
    method = "/dpmarket.v1.OwnerService/GetProgress"
    key = ("dpmarket.v1.OwnerService", str(CURATOR))

    async def scenario(connect, owner, curator):
        shares, active = admissions[0].shares, admissions[0].active
        stalled = []
        for who in (CURATOR, CURATOR_B):
            stall = connect(who).channel.stream_unary(method, None, None)
            stalled += [asyncio.ensure_future(_code(stall())) for _ in range(READS_PER_CALLER)]
        await _until(shares.reads.locked)
        other = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR_C))
        waiting = asyncio.ensure_future(_code(other.GetProgress(_progress(8), timeout=DEADLINE)))
        stalled.append(waiting)
        await _until(lambda: shares.reads.waiting == 1)
        monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 1e9 if wait is None else wait)
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        code, details = await _code(stub.GetProgress(_progress(8), timeout=3.0))
        if wait is None:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
        else:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert "read turns stayed taken by its other calls for 0.5 s" in details
            await _until(lambda: active[key] == READS_PER_CALLER)
            assert not any(call.done() for call in stalled)
        assert owner.reached == 0
        for call in stalled:
            call.cancel()
        await _until(lambda: not active and not shares.callers)

    _run(pki, scenario)


@pytest.mark.parametrize("alone", [True, False])
def test_a_declared_request_sent_slowly_on_a_quiet_server_is_served(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], alone: bool
) -> None:
    """The curator declares a 2 MiB OpenSession and sends its three pieces one every 0.6 s: each
    slower than the read wait (0.4 s here), and the whole request slower than the least rate
    (here its size in 0.2 s: 0.6 s in all). No other call waits for a read turn or the budget,
    so it is served whole, its budget held until its last piece and given back (a stranger's
    finding: a curator on a 30 KiB/s uplink to an owner had an ``OpenSession`` refused after
    10 s, and the owner left out). Control (the earlier rule, ``WAIT_ALONE`` off: the read wait
    and least rate whoever waits): it is refused RESOURCE_EXHAUSTED before its last piece."""
    request = _opening(2 * FRAME_BYTES).SerializeToString()
    pieces = [request[i : i + FRAME_BYTES] for i in range(0, len(request), FRAME_BYTES)]
    assert len(pieces) == 3
    monkeypatch.setattr(admission, "WAIT_ALONE", alone)
    monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 0.4)
    monkeypatch.setattr(admission, "MIN_UPLOAD_BYTES_PER_SECOND", len(request) / 0.2)
    metadata = (("dpmarket-request-bytes", str(len(request))),)
    method = "/dpmarket.v1.OwnerService/OpenSession"

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        sent: list[int] = []  # the budget held as each piece is sent

        async def slowly() -> Any:
            for piece in pieces:
                await asyncio.sleep(0.6)
                sent.append(shares.budget.held)
                yield piece

        upload = connect(CURATOR).channel.stream_unary(method, None, None)
        code, details = await _code(upload(slowly(), metadata=metadata, timeout=DEADLINE))
        if alone:
            assert code == grpc.StatusCode.OK, details
            assert sent == [len(request)] * 3
            assert owner.opened == [request]
            assert not shares.stalled(str(CURATOR))
        else:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert "did not arrive within 0.4 s" in details
            assert len(sent) < len(pieces) and owner.reached == 0
        await _until(lambda: not shares.callers)
        assert shares.budget.held == 0

    _run(pki, scenario)


@pytest.mark.parametrize("rule", ["taken back", "kept"])
def test_many_silent_identities_delay_a_sending_caller_by_one_grace_at_most(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], rule: str
) -> None:
    """Eight consumer identities keep two ``WatchSession`` calls each open without a request (16
    calls for the 4 read turns), each opened again as it is refused (a stranger's finding: 12
    identities kept a consumer's call at the curator waiting 57 s). Once each of them has given
    up a turn without its message, so counts as stalling, another consumer's call is first in
    line for the next turn, and a turn held without its message while it waits is taken back at
    its grace (0.2 s + 64 KiB at 256 KiB/s: 0.45 s here): it is served within a deadline of
    3 s, whatever the number of identities, and the silent calls were refused for their turns'
    grace. Control (the old rule: a turn kept READ_WAIT_SECONDS, 3 s here, whoever waits, first
    come first served): it waits behind the silent calls queued before it, four per 3 s round,
    and misses its deadline."""
    monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 3.0)
    monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 0.2)
    if rule == "kept":
        monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 1e9)
        monkeypatch.setattr(admission, "STALL_MEMORY_SECONDS", 0.0)
    method = "/dpmarket.v1.CuratorService/WatchSession"

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        stop = asyncio.Event()
        refusals: list[str] = []

        async def silent(channel: Any) -> None:
            watch = channel.channel.stream_stream(method, None, None)
            while not stop.is_set():
                call = watch(timeout=DEADLINE)
                try:
                    await call.code()
                    refusals.append(await call.details() or "")
                finally:
                    call.cancel()

        channels = [connect(who) for who in SILENT]
        attack = [
            asyncio.ensure_future(silent(c)) for c in channels for _ in range(READS_PER_CALLER)
        ]
        if rule == "taken back":
            await _until(lambda: all(shares.stalled(str(who)) for who in SILENT))
        else:
            await _until(lambda: shares.reads.waiting >= len(attack) - READS_AT_ONCE)
        assert not shares.stalled(str(BOB))
        watcher = curator_pb2_grpc.CuratorServiceStub(connect(BOB))
        request = curator_pb2.WatchSessionRequest(session_id="s")
        code, details = await _code(_drain(watcher.WatchSession(request, timeout=3.0)))
        stop.set()
        for task in attack:
            task.cancel()
        await asyncio.gather(*attack, return_exceptions=True)
        if rule == "taken back":
            assert (code, details) == (grpc.StatusCode.OK, "")
            assert curator.reached == 1
            assert any("within 0.45 s of its turn to be read while other" in r for r in refusals)
        else:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
            assert curator.reached == 0
        await _until(lambda: not shares.callers and not shares.reads.held)

    _run(pki, scenario)


@pytest.mark.parametrize("grace", [0.3, 10.0])
def test_a_caller_sending_small_pieces_slowly_while_others_wait_counts_as_stalling(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], grace: float
) -> None:
    """One read turn (READS_AT_ONCE 1). A curator sends a small declared OpenSession in three
    pieces, one every 0.5 s: each arrives within its turn's grace (0.3 s + 1 MiB at the least
    rate), so it is not taken back, but slower than its own size needs (0.3 s + a few dozen
    bytes at the least rate) while another curator's call waits for the turn: its caller then
    counts as stalling (its next calls are served after the others'), its upload is still
    served, and the waiting call is served. Control (a grace of 10 s, above the pieces' gaps):
    it does not count as stalling."""
    monkeypatch.setattr(admission, "READS_AT_ONCE", 1)
    monkeypatch.setattr(admission, "READS_PER_CALLER", 1)
    monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", grace)
    request = _opening(8).SerializeToString()
    size = -(-len(request) // 3)
    pieces = [request[i : i + size] for i in range(0, len(request), size)]
    assert len(pieces) == 3
    method = "/dpmarket.v1.OwnerService/OpenSession"

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares

        async def slowly() -> Any:
            for piece in pieces:
                await asyncio.sleep(0.5)
                yield piece

        upload = connect(CURATOR_B).channel.stream_unary(method, None, None)
        metadata = (("dpmarket-request-bytes", str(len(request))),)
        sending = asyncio.ensure_future(
            _code(upload(slowly(), metadata=metadata, timeout=DEADLINE))
        )
        await _until(lambda: shares.reads.locked())
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR_C))
        code, details = await _code(stub.GetProgress(_progress(8), timeout=DEADLINE))
        assert (code, details) == (grpc.StatusCode.OK, "")
        assert await sending == (grpc.StatusCode.OK, "")
        assert owner.opened == [request]
        assert shares.stalled(str(CURATOR_B)) == (grace < 0.5)
        assert not shares.stalled(str(CURATOR_C))

    _run(pki, scenario)


def _sized_budget(monkeypatch: pytest.MonkeyPatch, declared: int) -> None:
    """Servers started next hold a budget of two requests of ``declared`` bytes, one per caller."""
    real = admission.Admission.__init__

    def sized(self: admission.Admission, *args: Any, **kwargs: Any) -> None:
        real(self, *args, budget_bytes=2 * declared, caller_bytes=declared, **kwargs)

    monkeypatch.setattr(admission.Admission, "__init__", sized)


def _slow_upload(
    channel: Any,
    request: bytes,
    gap: float,
    held: list[int],
    budget: Any,
    timeout: float = DEADLINE,
) -> Any:
    """An OpenSession declared at ``len(request)`` whose pieces are sent ``gap`` seconds apart
    (``held`` gets the budget held as each is sent); returns the call's (code, details)."""
    pieces = [request[i : i + FRAME_BYTES] for i in range(0, len(request), FRAME_BYTES)]

    async def slowly() -> Any:
        for piece in pieces:
            await asyncio.sleep(gap)
            held.append(budget.held)
            yield piece

    upload = channel.channel.stream_unary("/dpmarket.v1.OwnerService/OpenSession", None, None)
    metadata = (("dpmarket-request-bytes", str(len(request))),)
    return _code(upload(slowly(), metadata=metadata, timeout=timeout))


@pytest.mark.parametrize("contended", [0.5, None])
def test_slow_uploads_holding_the_budget_hurry_once_another_call_waits_for_it(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], contended: float | None
) -> None:
    """Two curators each declare an OpenSession of a caller's share of the budget (which holds
    two) and send a piece every 2 s: fast enough for the least rate (here any), so each holds its
    bytes about 6 s (a stranger's finding: two identities at 260 KiB/s held the curator's
    budget 63 s per round). A third curator's request as large then waits for the budget (sent
    at once, with a deadline of 3 s): each upload has
    ``CONTENDED_UPLOAD_SECONDS`` (0.5 s) from then, is refused, saying so, its caller counts as
    stalling, and the waiting call is served within a deadline of 3 s. Control (no contended
    deadline): it waits behind the uploads, still in progress, and misses its deadline."""
    request = _opening(2 * FRAME_BYTES).SerializeToString()
    _sized_budget(monkeypatch, len(request))
    monkeypatch.setattr(admission, "MIN_UPLOAD_BYTES_PER_SECOND", 1.0)
    monkeypatch.setattr(admission, "CONTENDED_UPLOAD_SECONDS", contended or 1e9)

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        budget = shares.budget
        uploads = [
            asyncio.ensure_future(_slow_upload(connect(who), request, 2.0, [], budget))
            for who in (CURATOR, CURATOR_B)
        ]
        await _until(lambda: budget.held == budget.total)
        victim = _slow_upload(connect(CURATOR_C), request, 0.0, [], budget, timeout=3.0)
        code, details = await victim
        if contended:
            assert (code, details) == (grpc.StatusCode.OK, "")
            for code, details in await asyncio.gather(*uploads):
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
                assert "within 0.5 s of another call waiting for the server's request" in details
            assert shares.stalled(str(CURATOR)) and shares.stalled(str(CURATOR_B))
            assert not shares.stalled(str(CURATOR_C)) and owner.opened == [request]
        else:
            # Not served in its deadline. gRPC reports the miss as DEADLINE_EXCEEDED, or, on a
            # loaded machine where the deadline fires while the client is still writing the
            # request, as INTERNAL "Internal error from Core" (one CI dry run).
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                code == grpc.StatusCode.INTERNAL and "from Core" in details
            ), (code, details)
            assert owner.opened == []  # nothing reached the owner
            assert not any(upload.done() for upload in uploads)  # still holding the budget
            for upload in uploads:
                upload.cancel()
        await _until(lambda: not shares.callers)
        assert budget.held == 0

    _run(pki, scenario)


@pytest.mark.parametrize("waiter_stalling", [True, False])
def test_a_stalling_callers_waiting_call_does_not_hurry_an_upload(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any], waiter_stalling: bool
) -> None:
    """Two curators' uploads fill the budget, each sending a piece every 0.4 s (about 1.2 s
    whole, longer than ``CONTENDED_UPLOAD_SECONDS``, 0.5 s); a third curator counted as
    stalling then asks for the budget: its waiting call hurries nobody, both uploads are served
    and then it is (a stranger's finding: two identities that sent nothing, each refused as
    stalling, kept calls waiting and so cut every honest upload longer than 10 s short, 0 of 4
    served in 75 s). Control: the same waiting call from a caller that is not stalling hurries
    both uploads, which are refused."""
    request = _opening(2 * FRAME_BYTES).SerializeToString()
    _sized_budget(monkeypatch, len(request))
    monkeypatch.setattr(admission, "MIN_UPLOAD_BYTES_PER_SECOND", 1.0)
    monkeypatch.setattr(admission, "CONTENDED_UPLOAD_SECONDS", 0.5)

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        budget = shares.budget
        if waiter_stalling:
            shares.stall(str(CURATOR_C))
        uploads = [
            asyncio.ensure_future(_slow_upload(connect(who), request, 0.4, [], budget))
            for who in (CURATOR, CURATOR_B)
        ]
        await _until(lambda: budget.held == budget.total)
        waiter = _slow_upload(connect(CURATOR_C), request, 0.0, [], budget)
        codes = await asyncio.gather(*uploads, waiter)
        if waiter_stalling:
            assert codes == [(grpc.StatusCode.OK, "")] * 3, codes
            assert owner.opened == [request] * 3
        else:
            for code, details in codes[:2]:
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
                assert "within 0.5 s of another call waiting" in details
            assert codes[2] == (grpc.StatusCode.OK, "")
        await _until(lambda: not shares.callers)
        assert budget.held == 0

    _run(pki, scenario)


def test_an_upload_at_the_least_rate_on_a_quiet_server_is_served(
    pki: Path, monkeypatch: pytest.MonkeyPatch, admissions: list[Any]
) -> None:
    """A declared OpenSession sent just above the least rate (three pieces 0.6 s apart; the
    least rate here: its size in 2.2 s, so it must arrive within 1 s + 2.2 s) takes longer than
    ``CONTENDED_UPLOAD_SECONDS`` (0.5 s)
    in all, and each piece longer than ``TURN_GRACE_SECONDS`` (0.1 s) in its turn: no other
    call waits for the budget or a turn, so neither applies and it is served whole. (With a
    call waiting, the same kind of upload is refused: the test above.)"""
    request = _opening(2 * FRAME_BYTES).SerializeToString()
    monkeypatch.setattr(admission, "READ_WAIT_SECONDS", 1.0)
    monkeypatch.setattr(admission, "MIN_UPLOAD_BYTES_PER_SECOND", len(request) / 2.2)
    monkeypatch.setattr(admission, "CONTENDED_UPLOAD_SECONDS", 0.5)
    monkeypatch.setattr(admission, "TURN_GRACE_SECONDS", 0.1)

    async def scenario(connect, owner, curator):
        shares = admissions[0].shares
        held: list[int] = []
        outcome = await _slow_upload(connect(CURATOR), request, 0.6, held, shares.budget)
        assert outcome == (grpc.StatusCode.OK, "")
        assert held == [len(request)] * 3 and owner.opened == [request]
        assert not shares.stalled(str(CURATOR))

    _run(pki, scenario)


#: The parties each kind of server serves (``start_server``'s ``served``): an owner's, the
#: curators its policy names; the curator's, every consumer and its configured owners.
SERVES = {
    "owner": [Authorizer({"curator": ("curator", "curator-b", "curator-c")})],
    "curator": [Authorizer({"consumer": None}), Authorizer({"owner": (OWNER.name,)})],
}


@pytest.mark.parametrize("per_class", [True, False])
@pytest.mark.parametrize(
    ("server", "victim"), [("owner", CURATOR), ("curator", OWNER), ("owner", OWNER)]
)
def test_a_served_partys_health_checks_keep_their_calls_whoever_holds_the_others(
    pki: Path,
    monkeypatch: pytest.MonkeyPatch,
    admissions: list[Any],
    per_class: bool,
    server: str,
    victim: Identity,
) -> None:
    """Two consumers open two health checks each and send nothing (a stranger's findings: two
    identities filled an owner's health calls, and the curator's checks, refused, showed a
    healthy owner down; then four consumer identities, whom the curator serves, did the same at
    the curator, refusing the owners' checks of it). At an owner, which does not serve them, and
    at the curator, which does, the consumers' class keeps ``OPEN_CALLS_PER_CLASS`` calls: their
    calls beyond are refused at once, naming it, and the served party's check (the curator's of
    an owner, an owner's of the curator) is served, and so is the server's own check of itself
    (class ``ITSELF``: one consumer refused every check an owner's operator made with the
    owner's own certificate, which fell in the rest). Control (every caller in one class, as the
    calls were shared before): the consumers' calls fill the class and the check is refused."""
    if not per_class:
        monkeypatch.setattr(admission.Admission, "open_class", lambda self, context: OTHERS)
    method = "/grpc.health.v1.Health/Check"

    async def scenario(connect, owner, curator):
        stalled = [
            connect(who).channel.stream_unary(method, None, None)()
            for who in (ALICE, ALICE, BOB, BOB)
        ]
        active = admissions[0].active
        await _until(lambda: active.get(admission.OPEN_SERVICES) == OPEN_CALLS_PER_CLASS)
        await _until(lambda: sum(call.done() for call in stalled) == 2)
        whom = "consumers" if server == "curator" and per_class else "parties their server's"
        for call in stalled:
            if call.done():
                assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"calls at once they keep for {whom}" in await call.details()
        health = health_pb2_grpc.HealthStub(connect(victim))
        code, details = await _code(health.Check(health_pb2.HealthCheckRequest(), timeout=3.0))
        if per_class:
            assert (code, details) == (grpc.StatusCode.OK, "")
        else:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert f"the {OPEN_CALLS_PER_CLASS} calls at once they keep" in details
        for call in stalled:
            call.cancel()
        await _until(lambda: not active)

    _run(pki, scenario, served=SERVES[server])


def test_on_plaintext_each_connection_is_a_caller_of_its_own(admissions: list[Any]) -> None:
    """Plaintext transport (no identities; every caller is taken to be the curator): calls that
    send nothing on one connection hold that connection's share only, and a call on another is
    served at once; a call on the same connection waits behind them (control). Nothing is kept
    of either connection once its calls have ended."""
    owner = ProbeOwner()  # type: ignore[abstract]  # (as in _run)
    owner.authorizer = Authorizer({"curator": ("curator",)}, insecure_peer=CURATOR)
    plaintext = TransportSecurity.plaintext()
    method = "/dpmarket.v1.OwnerService/GetProgress"
    own_connection = [*SEND, ("grpc.use_local_subchannel_pool", 1)]

    async def main() -> None:
        def register(server: grpc.aio.Server) -> None:
            owner_pb2_grpc.add_OwnerServiceServicer_to_server(owner, server)

        server, port, _ = await start_server(
            register, ["dpmarket.v1.OwnerService"], "127.0.0.1:0", plaintext
        )
        first = aio_channel(f"127.0.0.1:{port}", plaintext, None, own_connection)
        second = aio_channel(f"127.0.0.1:{port}", plaintext, None, own_connection)
        try:
            shares = admissions[0].shares
            stall = first.channel.stream_unary(method, None, None)
            stalled = [asyncio.ensure_future(_code(stall(None))) for _ in range(READS_AT_ONCE)]
            await _until(lambda: sum(s.calls for s in shares.callers.values()) == READS_AT_ONCE)
            assert len(shares.callers) == 1
            other = owner_pb2_grpc.OwnerServiceStub(second)
            response = await other.GetProgress(_progress(8), timeout=3.0)
            assert response.done == 6
            same = owner_pb2_grpc.OwnerServiceStub(first)
            code, _ = await _code(same.GetProgress(_progress(8), timeout=1.0))
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            for call in stalled:
                call.cancel()
            await _until(lambda: not shares.callers and not admissions[0].active)
        finally:
            await first.close(None)
            await second.close(None)
            await server.stop(None)

    asyncio.run(main())


def test_caller_shares_wait_on_their_own_share_first_and_are_dropped_when_idle() -> None:
    async def scenario() -> None:
        budget = RequestBudget(20)
        shares = CallerShares(2, 1, budget, 10)
        a, b = shares.enter("a"), shares.enter("b")
        assert shares.enter("a") is a and a.calls == 2
        # Reads: a's second read waits on a's own turn, not on a shared one; b reads at once.
        first = shares.reading(a)
        await first.__aenter__()
        again = shares.reading(a)
        second = asyncio.ensure_future(again.__aenter__())
        await asyncio.sleep(0)
        assert not second.done() and not shares.reads.locked()
        async with shares.reading(b):
            assert shares.reads.locked()
        await first.__aexit__(None, None, None)
        await second  # a's second read has its turn now, and one of the server's
        async with shares.reading(b):
            assert shares.reads.locked()
        await again.__aexit__(None, None, None)
        # Bytes: a holds its share, its next request waits on it (outside the server's queue);
        # b's request of the other half is served at once.
        await shares.take(a, 10)
        more = asyncio.ensure_future(shares.take(a, 1))
        await asyncio.sleep(0)
        assert not more.done()
        await asyncio.wait_for(shares.take(b, 10), DEADLINE)
        assert budget.held == 20
        more.cancel()  # gone while it waited: nothing held for it
        await asyncio.sleep(0)
        shares.give(b, 10)
        shares.give(a, 10)
        assert budget.held == 0 and a.budget.held == 0
        # A request larger than the share is served while its caller holds nothing else.
        await shares.take(b, 15)
        assert budget.held == 15
        shares.give(b, 15)
        shares.leave("a")
        shares.leave("b")
        assert list(shares.callers) == ["a"]
        shares.leave("a")
        assert shares.callers == {}

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="between 1 and reads"):
        CallerShares(4, 5, RequestBudget(1), 1)
    with pytest.raises(ValueError, match="got 0"):
        CallerShares(4, 1, RequestBudget(1), 0)


class _VirtualClock(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to its next live timer whenever nothing else is ready: a
    fake clock, so that waits of seconds or hours take none and their ends are exact."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def _run_once(self) -> None:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if not self._ready:  # type: ignore[attr-defined]
            live = [handle.when() for handle in scheduled if not handle.cancelled()]
            if live:
                self.now = max(self.now, min(live))
        super()._run_once()  # type: ignore[misc]


def _on_virtual_clock(scenario: Callable[[_VirtualClock], Coroutine[Any, Any, None]]) -> None:
    loop = _VirtualClock()
    try:
        loop.run_until_complete(scenario(loop))
    finally:
        loop.close()


@pytest.mark.parametrize("alone", [True, False])
def test_a_caller_alone_waits_for_its_slow_messages_and_is_refused_once_another_waits(
    monkeypatch: pytest.MonkeyPatch, alone: bool
) -> None:
    """On a fake clock: caller a's message takes an hour (a peer on a slow link), and its second
    call waits behind it for a's own read turn; nobody else waits, so neither is refused and the
    message is read at 3,600 s. Then a's next message never comes and b's request waits for the
    budget a holds from 105 s: a's read and its queued call are refused at their next look,
    110 s, within ``READ_WAIT_SECONDS`` of b's wait (a stranger's finding: a curator on a 30
    KiB/s uplink had an owner's ``OpenSession`` refused after 10 s, alone). Control (the earlier
    rule, ``WAIT_ALONE`` off): both are refused at 10 s, alone."""
    monkeypatch.setattr(admission, "WAIT_ALONE", alone)
    wait = admission.READ_WAIT_SECONDS

    async def scenario(loop: _VirtualClock) -> None:
        shares = CallerShares(2, 1, RequestBudget(10), 10)
        a, b = shares.enter("a"), shares.enter("b")
        await shares.take(a, 10)  # the whole budget
        late = loop.create_future()
        loop.call_later(3600.0, late.set_result, b"late")
        first, second = shares.reading(a), shares.reading(a)
        queued = asyncio.ensure_future(first.__aenter__())
        async with shares.reading(a):
            try:
                got = await shares.patiently(lambda: asyncio.shield(late))
            except TimeoutError:
                assert not alone and loop.time() == wait
                with pytest.raises(admission.TurnsTakenError):
                    await queued
                return
        assert alone and got == b"late" and loop.time() == 3600.0
        await queued  # a's queued call has its turn now, unrefused
        never = loop.create_future()
        loop.call_later(105.0, lambda: asyncio.ensure_future(shares.take(b, 5)))
        queued = asyncio.ensure_future(second.__aenter__())
        with pytest.raises(TimeoutError):
            await shares.patiently(lambda: asyncio.shield(never))
        assert loop.time() == 3600.0 + 110.0 and shares.budget.pressed
        with pytest.raises(admission.TurnsTakenError):
            await queued
        assert loop.time() == 3600.0 + 110.0
        await first.__aexit__(None, None, None)

    _on_virtual_clock(scenario)


def test_the_request_budget_serves_in_order_what_fits_and_a_larger_request_alone() -> None:
    async def scenario() -> None:
        budget = RequestBudget(10)
        await budget.take(6)
        waiting = [asyncio.ensure_future(budget.take(size)) for size in (5, 1, 20)]
        await asyncio.sleep(0)
        # First come first served: 5 does not fit beside 6, and 1 waits behind it.
        assert [w.done() for w in waiting] == [False, False, False]
        gone = asyncio.ensure_future(budget.take(3))
        await asyncio.sleep(0)
        gone.cancel()  # a call that goes away while waiting leaves the queue
        budget.give(6)
        await asyncio.sleep(0)
        assert [w.done() for w in waiting] == [True, True, False]
        assert budget.held == 6
        budget.give(5)
        budget.give(1)
        await asyncio.sleep(0)
        assert waiting[2].done() and budget.held == 20  # larger than the budget: alone
        budget.give(20)
        assert budget.held == 0 and gone.cancelled()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="got 0"):
        RequestBudget(0)


@pytest.mark.parametrize("lane", [SMALL_REQUEST_BYTES, 0])
def test_small_requests_pass_large_ones_held_or_waiting_in_the_lane(lane: int) -> None:
    """Two large requests hold the whole budget and a third waits: a small request (at most
    SMALL_REQUEST_BYTES) is served at once beyond the total, within the lane, and the next
    small one once that is full waits for the lane, not for the large requests. Control (no
    lane): the small request waits behind the large ones."""

    async def scenario() -> None:
        total = 4 * SMALL_REQUEST_BYTES
        budget = RequestBudget(total, small_lane=lane)
        for _ in range(2):
            await budget.take(total // 2)
        large = asyncio.ensure_future(budget.take(total // 2, "large"))
        small = asyncio.ensure_future(budget.take(SMALL_REQUEST_BYTES, "small"))
        await asyncio.sleep(0)
        assert not large.done()
        if lane:
            assert small.done() and budget.held == total + SMALL_REQUEST_BYTES
            more = asyncio.ensure_future(budget.take(1))
            await asyncio.sleep(0)
            assert not more.done()  # the lane is full
            budget.give(SMALL_REQUEST_BYTES)
            await asyncio.sleep(0)
            assert more.done() and not large.done()  # past the large request, in the lane
            budget.give(1)
        else:
            assert not small.done()
            small.cancel()
        large.cancel()
        await asyncio.sleep(0)
        assert budget.held == total

    asyncio.run(scenario())


@pytest.mark.parametrize("requests", [2, 3])
def test_admitted_requests_wait_for_the_servers_request_budget(
    pki: Path, monkeypatch: pytest.MonkeyPatch, requests: int
) -> None:
    """With a budget of two requests, the third of three held calls waits, its request unread,
    until one ends; the budget is whole again when all have ended. Control: with a budget of
    three, the third is served while the others are held. (One caller makes the three calls: its
    share of the budget is the whole budget here.)"""
    request = _opening(3 * FRAME_BYTES)
    size = request.ByteSize()
    budgets: list[admission.RequestBudget] = []
    real = admission.Admission.__init__

    def recording(self: admission.Admission, *args: Any, **kwargs: Any) -> None:
        real(self, *args, budget_bytes=requests * size, caller_bytes=requests * size, **kwargs)
        budgets.append(self.budget)

    monkeypatch.setattr(admission.Admission, "__init__", recording)
    owner = HoldingOwner()  # type: ignore[abstract]  # a probe: OpenSession held

    async def scenario(connect, owner, curator):
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        calls = [asyncio.ensure_future(stub.OpenSession(request, timeout=DEADLINE))]
        calls += [asyncio.ensure_future(stub.OpenSession(request, timeout=DEADLINE))]
        await _until(lambda: owner.reached == 2)
        calls.append(asyncio.ensure_future(stub.OpenSession(request, timeout=DEADLINE)))
        if requests == 3:
            await _until(lambda: owner.reached == 3)
        else:
            await asyncio.sleep(0.3)  # the third is not served while the others hold the budget
            assert owner.reached == 2
        assert budgets[0].held == min(requests, 3) * size
        owner.release.set()
        await asyncio.gather(*calls)
        assert owner.reached == 3 and budgets[0].held == 0

    _run(pki, scenario, owner)


class HoldingOwner(ProbeOwner):
    """A probe owner whose ``OpenSession`` waits for :attr:`release` once reached."""

    @rpc("curator")
    async def OpenSession(self, request, context, caller):
        self.reached += 1
        await self.release.wait()
        return owner_pb2.OpenSessionResponse(num_points=1)


def test_a_service_serves_at_most_its_calls_at_once_and_refusals_take_no_slot(pki: Path) -> None:
    # One caller may fill the service here (as the curator nearly may an owner's).
    owner = ProbeOwner(concurrent_calls=2, calls_per_caller=2)  # type: ignore[abstract]
    owner.hold = True

    async def scenario(connect, owner, curator):
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        calls = [stub.GetProgress(_progress(10), timeout=DEADLINE) for _ in range(2)]
        held = [asyncio.ensure_future(call) for call in calls]
        await _until(lambda: owner.reached == 2)
        code, details = await _code(stub.GetProgress(_progress(PROGRESS_LIMIT), timeout=DEADLINE))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "its limit of 2 calls at once" in details
        # A refused caller is refused for what it is, and takes no slot.
        alice = owner_pb2_grpc.OwnerServiceStub(connect(ALICE))
        code, _ = await _code(alice.GetProgress(_progress(10), timeout=DEADLINE))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        # A call its client cancels gives its slot back.
        calls[0].cancel()
        held.append(asyncio.ensure_future(stub.GetProgress(_progress(10), timeout=DEADLINE)))
        await _until(lambda: owner.reached == 3)
        owner.release.set()
        assert [r.done for r in await asyncio.gather(*held[1:])] == [8, 8]
        assert owner.reached == 3

    _run(pki, scenario, owner)


def test_health_and_reflection_serve_every_identity_within_small_limits(pki: Path) -> None:
    ask_health = health_pb2.HealthCheckRequest()

    async def scenario(connect, owner, curator):
        health = health_pb2_grpc.HealthStub(connect(ALICE))
        response = await health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        big = health_pb2.HealthCheckRequest(service="h" * SMALL_REQUEST_BYTES)
        code, _ = await _code(health.Check(big, timeout=DEADLINE))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # One caller holds at most OPEN_CALLS_PER_CALLER calls at once; another class's caller
        # is served (a consumer's class is full: OPEN_CALLS_PER_CLASS).
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(2)]
        for watch in watches:
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        assert len(watches) == OPEN_CALLS_PER_CALLER
        code, details = await _code(health.Check(health_pb2.HealthCheckRequest()))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "consumer:alice has its limit of 2 calls at once" in details
        code, details = await _code(health_pb2_grpc.HealthStub(connect(BOB)).Check(ask_health))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "the 2 calls at once they keep for consumers" in details
        other = health_pb2_grpc.HealthStub(connect(CURATOR_B))
        assert (await other.Check(ask_health)).status == response.status
        for watch in watches:
            watch.cancel()
        reflection = reflection_pb2_grpc.ServerReflectionStub(connect(BOB))
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = await _drain(reflection.ServerReflectionInfo(iter([ask]), timeout=DEADLINE))
        listed = {s.name for s in answers[0].list_services_response.service}
        assert "dpmarket.v1.OwnerService" in listed

    _run(pki, scenario)


class RefusingOwner(ProbeOwner):
    """A probe owner whose ``Bid`` decodes its request's array, keeps a weak reference to it and
    refuses the call (INVALID_ARGUMENT), as a handler refuses a request it has read."""

    def __init__(self) -> None:
        super().__init__()
        self.decoded: list[weakref.ref[np.ndarray]] = []

    @rpc("curator")
    async def Bid(self, request, context, caller):
        embedding = array_from_proto(request.summary_embedding, "summary_embedding")
        self.decoded.append(weakref.ref(embedding))
        if self.hold:
            await self.release.wait()
        raise InvalidArgumentError(f"summary_embedding of {embedding.size} values: refused")


def _bid(values: int) -> owner_pb2.BidRequest:
    return owner_pb2.BidRequest(session_id="s", summary_embedding=array_to_proto(np.ones(values)))


def _refuse_bids(pki: Path, calls: int, values: int) -> RefusingOwner:
    """``calls`` Bid calls of ``values`` float64 each, all refused; then the server stops."""
    owner = RefusingOwner()  # type: ignore[abstract]  # a probe: Bid only

    async def scenario(connect, owner, curator):
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        for _ in range(calls):
            code, details = await _code(stub.Bid(_bid(values), timeout=DEADLINE))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details

    _run(pki, scenario, owner)
    return owner


def test_a_refused_call_keeps_nothing_of_its_request(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC keeps a call's abort in the call's state, and the abort's traceback the handler's
    # frames: their locals (the request, its decoded arrays) stayed in a reference cycle that
    # only a full garbage collection frees (issue 25: a curator grew by GiBs). With the
    # collector off, nothing but those references can keep the arrays.
    collecting = gc.isenabled()
    gc.disable()
    try:
        owner = _refuse_bids(pki, calls=5, values=SERVER_LIMIT // 16)
        assert len(owner.decoded) == 5
        assert [ref() for ref in owner.decoded] == [None] * 5
        # Control: with the tracebacks kept, every refused call's array stays alive.
        monkeypatch.setattr(admission, "_drop_tracebacks", lambda exc: None)
        owner = _refuse_bids(pki, calls=5, values=SERVER_LIMIT // 16)
        assert sum(ref() is not None for ref in owner.decoded) == 5
    finally:
        if collecting:
            gc.enable()
        gc.collect()


def test_the_last_large_call_to_end_gives_the_freed_memory_back(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    releases: list[bool] = []
    monkeypatch.setattr(admission, "RELEASE_AFTER_BYTES", 64 << 10)

    def release() -> bool:
        releases.append(True)
        return True

    monkeypatch.setattr(allocator, "release_free_memory", release)
    _refuse_bids(pki, calls=3, values=100)  # 800 bytes each: nothing to give back
    assert releases == []
    _refuse_bids(pki, calls=3, values=(64 << 10) // 8)  # 64 KiB and more each, one at a time
    assert releases == [True] * 3
    # Two large calls in progress at once: only the second to end gives memory back.
    owner = RefusingOwner()  # type: ignore[abstract]  # a probe: Bid only
    owner.hold = True

    async def scenario(connect, owner, curator):
        stub = owner_pb2_grpc.OwnerServiceStub(connect(CURATOR))
        calls = [_code(stub.Bid(_bid(16 << 10), timeout=DEADLINE)) for _ in range(2)]
        held = [asyncio.ensure_future(call) for call in calls]
        await _until(lambda: len(owner.decoded) == 2)
        assert releases == [True] * 3
        owner.release.set()
        assert [code for code, _ in await asyncio.gather(*held)] == [
            grpc.StatusCode.INVALID_ARGUMENT
        ] * 2

    _run(pki, scenario, owner)
    assert releases == [True] * 4
    assert allocator._large_calls == 0


def test_malloc_trim_is_found_and_a_call_is_counted_out_once() -> None:
    assert allocator._TRIM is not None  # glibc, as every supported platform
    assert release_free_memory() in (True, False)
    with pytest.raises(RuntimeError, match="without a large call in progress"):
        allocator.large_call_ended()


# ------------------------------------------------------------------ the services' limits
LIMITS = {
    "OwnerService": "owner_limits",
    "CapeSiteService": "cape_site_limits",
    "SecureAggregationService": "secure_aggregation_limits",
    "CuratorService": "curator_limits",
    "CapeService": "cape_limits",
    "SketchCatalogService": "catalog_limits",
}


@pytest.mark.parametrize(
    ("service", "servicer"), [(s[0], s[1]) for s in SERVICES], ids=lambda v: getattr(v, "name", "")
)
def test_every_servicer_states_its_limits_for_its_own_rpcs(service: Any, servicer: Any) -> None:
    """Each servicer's ``limits`` comes from its limits function (docs/reference.md)."""
    prop = vars(servicer).get("limits")
    assert isinstance(prop, functools.cached_property), f"{servicer.__name__} states no limits"
    assert LIMITS[service.name] in (prop.func.__doc__ or ""), servicer.__name__


def _owner(n_features: int) -> Owner:
    points = PointSet(np.zeros((3, n_features)), None, "owner-0")
    return Owner("owner-0", points, max_rff_dimension=512, max_sessions=8)


def test_the_owners_limits_admit_requests_at_its_policy_bounds_and_name_its_rpcs() -> None:
    n, d = 17, 512
    limits = owner_limits(_owner(n))
    rpcs = {m.name for m in owner_pb2.DESCRIPTOR.services_by_name["OwnerService"].methods}
    assert set(limits.requests) <= rpcs
    session = "s" * 256
    terms = owner_pb2.SessionTerms(
        method=owner_pb2.SESSION_METHOD_PRIVATE, epsilon=1.0, delta=1e-6, max_rounds=2**62
    )
    embedding = array_to_proto(np.zeros(d))
    requests = {
        "OpenSession": owner_pb2.OpenSessionRequest(
            session_id=session,
            omega=array_to_proto(np.zeros((d, n))),
            phase=embedding,
            sampling_seed=2**63,
            gamma=1.0,
            consumer="consumer:" + "c" * 63,
            terms=terms,
        ),
        "SetValidationEmbedding": owner_pb2.SetValidationEmbeddingRequest(
            session_id=session,
            validation_embedding=embedding,
            shrinkage_sigma=1.0,
            prior_embedding=embedding,
        ),
        "Bid": owner_pb2.BidRequest(
            session_id=session, round=2**40, summary_embedding=embedding, summary_size=2**40
        ),
        "RunRounds": owner_pb2.RunRoundsRequest(
            bid=owner_pb2.BidRequest(session_id=session, summary_embedding=embedding)
        ),
        "ReleasePoint": owner_pb2.ReleasePointRequest(session_id=session, round=2**40),
    }
    for name, request in requests.items():
        assert request.ByteSize() <= limits.request_bytes(name), name
    # An omega wider than the owner's features does not fit.
    wide = owner_pb2.OpenSessionRequest(omega=array_to_proto(np.zeros((d, 2 * n + 10))))
    assert wide.ByteSize() > limits.request_bytes("OpenSession")
    # The curator keeps four calls per session at max_sessions (and at least the default), and
    # alone it fills half the service.
    assert limits.per_caller == 64 and limits.concurrent_calls == 128
    many = owner_limits(Owner("owner-0", PointSet(np.zeros((3, n)), None, "o"), max_sessions=40))
    assert many.per_caller == 4 * 40 and many.concurrent_calls == 2 * 4 * 40


def test_a_services_calls_per_caller_are_half_its_calls_unless_it_says() -> None:
    assert ServiceLimits().per_caller == 32
    assert ServiceLimits(concurrent_calls=1).per_caller == 1
    assert ServiceLimits(concurrent_calls=8, calls_per_caller=8).per_caller == 8
    with pytest.raises(ValueError, match="calls_per_caller \\(9\\) must not exceed"):
        ServiceLimits(concurrent_calls=8, calls_per_caller=9)
    with pytest.raises(ValueError, match="calls_per_caller must be a positive integer, got 0"):
        ServiceLimits(calls_per_caller=0)


def test_the_cape_sites_limits_admit_jobs_of_their_sized_sites_and_columns(pki: Path) -> None:
    columns = tuple(f"column-{'c' * 200}-{j}" for j in range(6))
    table = Table(columns, np.zeros((4, len(columns))), "owner-0")
    limits = cape_site_limits(CapeSite("owner-0", table))
    rounds = secure_aggregation_limits()
    for service, stated in (("CapeSiteService", limits), ("SecureAggregationService", rounds)):
        file = cape_pb2 if service == "CapeSiteService" else secure_aggregation_pb2
        names = {m.name for m in file.DESCRIPTOR.services_by_name[service].methods}
        assert set(stated.requests) <= names
    # One site's share of a round's largest message, with a real certificate.
    certificate = identity_files(pki, OWNER)[1].read_bytes()
    site = "o" * 63
    advertisement = cape_messages.advertisement_to_proto(
        KeyAdvertisement(site, bytes(32), bytes(32), bytes(72), bytes(32)), certificate
    )
    per_site = (
        secure_aggregation_pb2.ShareKeysRequest(
            round=secure_aggregation_pb2.SecureAggregationRound(sites=[site]),
            advertisements=[advertisement],
            nonces=[secure_aggregation_pb2.SiteNonce(site=site, nonce=bytes(32))],
        ).ByteSize()
        + secure_aggregation_pb2.SiteCiphertext(
            sender=site, recipient=site, ciphertext=bytes(512)
        ).ByteSize()
        + 2 * secure_aggregation_pb2.PairTag(sender=site, recipient=site, tag=bytes(32)).ByteSize()
    )
    assert per_site <= SITE_BYTES
    assert rounds.request_bytes("ShareKeys") >= MAX_SITES * SITE_BYTES
    # A training of 256 hidden units over every column, and capeFM's coefficients.
    d = len(columns)
    parameters = array_to_proto(np.zeros(256 * (d + 2) + 1))
    gradient = cape_pb2.ReleaseCapeGradientRequest(
        job_id="j" * 64, round_id=bytes(32), parameters=parameters, noise_total=parameters
    )
    assert gradient.ByteSize() <= limits.request_bytes("ReleaseCapeGradient")
    release = cape_pb2.ReleaseCapeRequest(
        job_id="j" * 64, round_id=bytes(32), noise_total=array_to_proto(np.zeros((d + 2) ** 2))
    )
    assert release.ByteSize() <= limits.request_bytes("ReleaseCape")
    spec = cape_pb2.CapeSpec(
        features=[cape_pb2.ColumnBound(column=c, low=-1.0, high=1.0) for c in columns[:-1]],
        target=cape_pb2.ColumnBound(column=columns[-1], low=0.0, high=1.0),
    )
    job = cape_pb2.OpenCapeJobRequest(job_id="j" * 64, consumer="consumer:c", spec=spec)
    assert job.ByteSize() <= limits.request_bytes("OpenCapeJob")


def test_the_curators_limits_follow_its_policy() -> None:
    policy = CuratorPolicy().with_overrides(ranges={"validation_values": (1, 64 * 1000)})
    limits = curator_limits(policy)
    validation = array_to_proto(np.zeros((900, 64)))
    seed_set = array_to_proto(np.zeros((100, 64)))
    names = [f"feature-{j}" for j in range(64)]
    request = curator_pb2.CreateSessionRequest(
        validation=validation, seed_set=seed_set, request_id="r" * 128, feature_names=names
    )
    assert request.ByteSize() <= limits.request_bytes("CreateSession")
    assert limits.request_bytes("CreateSession") < curator_limits(CuratorPolicy()).request_bytes(
        "CreateSession"
    )
    columns = int(CuratorPolicy().ranges["cape_columns"][1])
    spec = cape_pb2.CapeSpec(
        features=[
            cape_pb2.ColumnBound(column="f" * 250, low=-1.0, high=1.0) for _ in range(columns)
        ]
    )
    fit = cape_pb2.FitCapeRequest(spec=spec, request_id="r" * 128)
    assert fit.ByteSize() <= cape_limits(CuratorPolicy()).request_bytes("FitCape")


def test_the_catalogues_limits_admit_a_sketch_of_each_of_its_specs(tmp_path: Path) -> None:
    """PublishSketch's limit, from the catalogue's specs (a marginals one among them), admits a
    real sketch of each RFF, RACE and HIST spec; the catalogue takes a call of each configured
    owner at once."""
    columns = [{"name": "a", "low": 0, "high": 1}, {"name": "b", "low": -10, "high": 10}]
    declaration = SketchDeclaration.from_mapping(
        {
            "name": "toy",
            "mechanism": {"epsilon": 1.0, "epsilon_range": [0.5, 2.0]},
            "columns": columns,
            "maps": {
                "rff": {"frequencies": 64, "sigma": 0.5},
                "race": {"hashes": 8, "buckets": 16, "width": 0.25},
                "hist": {"bins": 32},
                "marginals": {"bins": 10, "rounds": 2, "measurements": 4, "delta": 1e-6},
            },
        }
    )
    owners = [f"owner-{i}" for i in range(100)]
    rng = np.random.default_rng(0)
    records = np.column_stack([rng.uniform(0, 1, 200), rng.uniform(-10, 10, 200)])
    with SketchCatalog(tmp_path, [declaration], owners=owners, seed=0) as catalog:
        limits = catalog_limits(catalog)
        assert limits.concurrent_calls >= len(owners)
        assert len(catalog.specs()) == 4
        for spec in catalog.specs():
            mechanism = spec.mechanism(1.0)
            if isinstance(mechanism, MarginalsMechanism):
                continue  # its release fits a graphical model (seconds); its limit is larger
            sketch = mechanism.release(records, SeededNoise(np.random.default_rng(1)))
            request = sketch_pb2.PublishSketchRequest(
                spec=spec.name, sketch=sketch_messages.sketch_to_proto(sketch)
            )
            assert request.ByteSize() <= limits.request_bytes("PublishSketch"), spec.name
