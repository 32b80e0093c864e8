"""Admission of every call before its request is read: who calls, how many at once, how large.

A gRPC server reads a unary request whole, up to its receive limit, before any handler runs, so an
authorization in the handler (:func:`dpmarket.runtime.authz.rpc`) came after the service had already
held the message: six concurrent 230 MB requests that were each refused took an owner from 292 MiB
to 3.5 GiB. :class:`Admission`, a server interceptor installed on every server the project starts
(:func:`dpmarket.runtime.serving.start_server`), decides at the start of each call, from the
caller's verified certificate (the call's auth context) and nothing it sent:

1. **who**: an RPC wrapped by ``rpc``/``rpc_stream`` admits the roles and names its servicer's
   :class:`~dpmarket.runtime.authz.Authorizer` serves for it; the health and reflection services,
   which every party of the deployment may call, admit any verified dpmarket identity. A refused
   call is answered ``PERMISSION_DENIED`` or ``UNAUTHENTICATED`` before a byte of its request is
   read: HTTP/2 flow control then bounds what the server buffers of it to the stream's window (64
   KiB to a few MiB), and the rest is never sent.
2. **how many**: each service serves at most :attr:`ServiceLimits.concurrent_calls` calls at
   once, and of them at most :attr:`ServiceLimits.per_caller` of one caller (half, unless its
   servicer says otherwise; the health and reflection services :data:`OPEN_CALLS_PER_CLASS`
   together per class of callers, and :data:`OPEN_CALLS_PER_CALLER` per caller); the next is
   answered ``RESOURCE_EXHAUSTED``, again before its request is read.
3. **how large**: each RPC has its own receive limit (:attr:`ServiceLimits.requests`, or
   :data:`SMALL_REQUEST_BYTES` for one that carries ids and scalars only), derived by its
   servicer from the policy's bounds and documented in ``docs/reference.md``; a request (each
   message of a client stream) above it is answered ``RESOURCE_EXHAUSTED`` and never parsed. The
   server's own receive limit, which gRPC applies to a message's declared length before
   buffering it, is small and the same for every server
   (:data:`~dpmarket.runtime.framing.FRAME_BYTES`, 1 MiB): a larger unary request comes in
   pieces of that size (:mod:`dpmarket.runtime.framing`), counted against its RPC's own limit
   as they are read, so that no RPC's request is read beyond its own limit plus one piece.

To do so every RPC is served as a client-streaming one (the wire format does not tell them
apart): its request is read by :meth:`grpc.aio.ServicerContext.read` once the call is admitted.
The servicer's wrapper still authorizes the call itself (the ``rpc`` semantics are unchanged).
No thread is involved: a unary request is the bytes gRPC read (joined, if it came in pieces),
checked by length and parsed by its message's own parser; a stream's messages are checked one by
one as its handler reads them.

Notes
-----
What a party can make a service hold, in request bytes (its handlers' own memory apart):

* refused (wrong role or name, no identity): nothing of the request, only the flow-control
  window of its connection while the refusal is sent: the server grants a fixed window (gRPC's
  bandwidth-delay probing off) and accepts a bounded number of connections
  (:data:`~dpmarket.runtime.serving.TRANSPORT_BOUND_OPTIONS`);
* admitted: at most ``concurrent_calls`` calls of each service, each holding at most its RPC's
  limit (the pieces read so far, then the parsed request), and all of them together at most the
  server's :class:`RequestBudget` (:data:`REQUEST_BUDGET_BYTES`, or one request larger than it
  alone), taken before a byte is read. While a piece is being read, before its length can be
  counted, gRPC buffers at most ``FRAME_BYTES``, and at most :data:`READS_AT_ONCE` pieces are
  read at once, the joined request parsed in the last one's turn (a client stream's messages,
  ``RunRounds``, are read as its handler asks: at most one per stream, outside the budget);
* the health and reflection services: at most :data:`OPEN_CALLS_PER_CALLER` calls per caller,
  :data:`OPEN_CALLS_PER_CLASS` per class of callers and :data:`OPEN_CONCURRENT_CALLS` in all
  (the two services together), each read up to one piece and dropped at once when above
  :data:`SMALL_REQUEST_BYTES`.

and only while the calls run: the exception a call ends with keeps none of its frames
(:func:`_forgetting`), and the last of the calls in progress that received
:data:`~dpmarket.runtime.allocator.RELEASE_AFTER_BYTES` or more gives the process's free memory
back when it ends (:func:`~dpmarket.runtime.allocator.large_call_ended`). Reading a message
holds about twice its size for a moment (gRPC's buffers, then the bytes its parser reads).

What one caller can make the others wait for, or be refused, is bounded as well. A caller (an
identity; on plaintext transport, a connection) has at most its service's
:attr:`ServiceLimits.per_caller` calls in progress (half its calls at once by default), so that
its calls alone never fill a service and make another's ``RESOURCE_EXHAUSTED``; it reads at
most :data:`READS_PER_CALLER` of the :data:`READS_AT_ONCE` pieces at once and holds at most
:data:`REQUEST_BYTES_PER_CALLER` of the budget (or one larger request while it holds nothing
else), its further calls waiting on its own share (:class:`CallerShares`). Calls that send
nothing, or declared requests that then stall, thus delay no other caller's read, nor another
caller's request that fits in the budget beside what the staller may hold (16 MiB on an owner,
15 MiB on the curator, at the defaults), and refuse no other caller's call; and once another call
waits, a call queued for its caller's read turn gives its slot of its service's calls at once
back within :data:`READ_WAIT_SECONDS`, not one round per call queued before it (one queued for
its caller's share of the budget waits while its caller's own requests are read, as only that
caller's slots do). A caller alone (no other call waiting for a read turn or, of a caller not
stalling, for the budget) is never refused for its link's speed: its reads and its queued calls
wait as long as its messages take (:data:`WAIT_ALONE`). It takes
``READS_AT_ONCE / READS_PER_CALLER`` distinct identities (two; two for a service's calls at
once as well) stalling together to fill what the others need (the services whose only callers
are the curators an owner's policy names keep a curator's calls at once at what it runs:
:func:`dpmarket.owner.service.owner_limits`).

What many identities together can make a caller that sends its requests wait for is bounded
whatever their number. Once a call waits for a read turn, a turn held without its message past
its grace (:data:`TURN_GRACE_SECONDS` and the message's most bytes at
:data:`MIN_UPLOAD_BYTES_PER_SECOND`) is taken back (:class:`ReadTurns`); once a call waits for
the request budget, a declared request holding some has :data:`CONTENDED_UPLOAD_SECONDS` more
at most; and a caller whose call gave up a turn without its message, or a declared request
before its end, is served after the others for :data:`STALL_MEMORY_SECONDS`
(:meth:`CallerShares.stall`). A call of a caller that is not stalling, with none such before it,
thus waits at most one grace for a read turn (1.25 s for requests of at most 64 KiB, 5 s for a
1 MiB piece) and ``CONTENDED_UPLOAD_SECONDS`` for the budget, once each stalling identity has
stalled once. The health and reflection services keep :data:`OPEN_CALLS_PER_CLASS` calls for
each role the server's own services serve (``served``) and as many for every other identity
(:meth:`Admission.open_class`): no class of callers fills another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from dpmarket.common.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
)
from dpmarket.runtime.allocator import RELEASE_AFTER_BYTES, large_call_began, large_call_ended
from dpmarket.runtime.authz import ROLES_ATTRIBUTE, Authorizer
from dpmarket.runtime.framing import FRAME_BYTES, SIZE_METADATA, most_pieces
from dpmarket.runtime.identity import ROLES, Identity, peer_identity
from dpmarket.runtime.status import abort_for

__all__ = [
    "COLUMN_BYTES",
    "CONTENDED_UPLOAD_SECONDS",
    "DEFAULT_CONCURRENT_CALLS",
    "ITSELF",
    "MIN_UPLOAD_BYTES_PER_SECOND",
    "OPEN_CALLS_PER_CALLER",
    "OPEN_CALLS_PER_CLASS",
    "OPEN_CONCURRENT_CALLS",
    "OPEN_SERVICES",
    "OTHERS",
    "READS_AT_ONCE",
    "READS_PER_CALLER",
    "REQUEST_BUDGET_BYTES",
    "REQUEST_BYTES_PER_CALLER",
    "SMALL_LANE_BYTES",
    "SMALL_REQUEST_BYTES",
    "STALL_MEMORY_SECONDS",
    "TURN_GRACE_SECONDS",
    "VALUE_BYTES",
    "Admission",
    "CallerShares",
    "ReadTurns",
    "RequestBudget",
    "RequestTooLargeError",
    "ServiceLimits",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Receive limit of an RPC whose request carries ids, names and scalars only (64 KiB): a session
#: id of at most 256 characters, privacy terms, a consumer's name, a few numbers.
SMALL_REQUEST_BYTES = 64 << 10
#: Bytes of one named column in a request (a CAPE spec's bounds, a schema's column): a name of up
#: to 256 characters, its type and two bounds, encoded.
COLUMN_BYTES = 512
#: Bytes of one float64 value of an ``Array`` on the wire.
VALUE_BYTES = 8
#: Calls one service serves at once unless its servicer says otherwise (of them, one caller's at
#: most half: :attr:`ServiceLimits.per_caller`).
DEFAULT_CONCURRENT_CALLS = 64
#: Calls of the health and reflection services (together) that one class of their callers holds
#: at once (:meth:`Admission.open_class`): each role whose identities the server's own services
#: serve (by role and name) is a class, and every other identity is one more. Each is read up to
#: one piece (``FRAME_BYTES``) before its own limit is compared; a probe calls once every few
#: seconds. (At 16 in all, 1,000 concurrent 4 MB health checks raised an owner by up to 131 MiB
#: of reads.)
OPEN_CALLS_PER_CLASS = 2
#: The class of the health and reflection services' callers that the server's own services do
#: not serve (:meth:`Admission.open_class`).
OTHERS = "others"
#: The class of the server's own identity (its operator's checks of it: a compose healthcheck,
#: its console, ``dpmarket up``'s readiness at the curator), whom no other caller's calls fill.
ITSELF = "itself"
#: Calls the health and reflection services serve at once, together, at most: each class's
#: :data:`OPEN_CALLS_PER_CLASS`, for a class per role, :data:`OTHERS` and :data:`ITSELF`. So
#: they may make a server hold 10 x 2 x 1 MiB, whoever calls.
OPEN_CONCURRENT_CALLS = OPEN_CALLS_PER_CLASS * (len(ROLES) + 2)
#: Pieces of unary requests a server reads at once, over all its services; an admitted call
#: waits for its turn before each piece of its request is read (HTTP/2 flow control meanwhile
#: holds the request at the client, but for the stream's window, 64 KiB:
#: ``serving.STREAM_WINDOW_BYTES``). gRPC reads a message whole, up to the server's receive
#: limit F (``framing.FRAME_BYTES``), before it can be counted, and the read holds about 2 F for
#: a moment (its buffers, then Python's bytes): admitted callers' reads in progress hold at most
#: ``READS_AT_ONCE`` x 2 F (8 MiB), and the joining and parsing of at most ``READS_AT_ONCE``
#: requests a second copy of each; each admitted call, between its pieces and once read, at most
#: its RPC's own limit. Without it every admitted call would read at once: 64 per service.
READS_AT_ONCE = 4
#: Of the ``READS_AT_ONCE`` read turns, those one caller holds at once (:class:`CallerShares`;
#: a caller is an identity, or on plaintext transport a connection). Two: one caller alone leaves
#: the others half the turns, so its calls that send nothing never delay another's read, and it
#: takes two distinct identities stalling together to hold every turn (four with one each). A
#: caller's own concurrent requests keep most of their speed (each HTTP/2 stream's window bounds
#: its rate): through a 50 ms round-trip relay, 8 concurrent 2 MB ``OpenSession`` of one caller
#: took 0.72 s with two turns, 1.24 s with one and 0.51 s with four; 4 x 0.5 MB 0.25, 0.33 and
#: 0.31 s (``python -m bench.caller_reads``).
READS_PER_CALLER = 2
#: Seconds between looks at a read slot waiting for the message it was taken for (one message,
#: or one piece of at most ``framing.FRAME_BYTES``, 1 MiB): a look that finds it not arrived
#: while another call waits (:meth:`CallerShares.contended`) refuses the call
#: (RESOURCE_EXHAUSTED) and the slot goes to the next call; nobody waiting, the read goes on
#: (:data:`WAIT_ALONE`). A caller that opens calls and sends nothing would otherwise hold every
#: slot until its deadline (none, if it sets none), and every other caller of every service of
#: the server would wait behind it. A call waiting for one of its caller's own read turns
#: (:meth:`CallerShares.reading`) is looked at the same way, so that calls queued behind their
#: caller's stalled ones give their calls-at-once slots back as soon as those do, not one round
#: per call queued before them. The open services' reads (health checks of at most 64 KiB) are
#: refused at the first look, whoever waits.
READ_WAIT_SECONDS = 10.0
#: Least rate, bytes per second, at which a message must arrive while another call waits for a
#: read turn (256 KiB/s, 2 Mbit/s): it sets a turn's grace (:data:`TURN_GRACE_SECONDS`) and
#: which slow messages make their caller stalling. With :data:`WAIT_ALONE` off it was also the
#: least average rate of a declared request whoever waited (refused unless read within
#: ``READ_WAIT_SECONDS + declared / MIN_UPLOAD_BYTES_PER_SECOND`` of taking its budget); a
#: declared request holding bytes another call waits for now has
#: :data:`CONTENDED_UPLOAD_SECONDS` (a 16 MiB ``CreateSession`` sending a 1 MiB piece every 9.5 s
#: held 16 MiB of the curator's budget for 160 s before either, and two such callers froze every
#: other request above 0 bytes that did not fit).
MIN_UPLOAD_BYTES_PER_SECOND = 256 << 10
#: Request bytes a server's admitted calls hold at once, all services together (32 MiB): each
#: unary call reserves its request's declared size (or, sent as one message, its RPC's limit up
#: to one message, then the size it had) before a byte of it is read, and gives it back when it
#: ends; a call that does not fit waits (its request held at the client by flow control), and
#: one larger than the budget is served alone. So what admitted callers make a server hold in
#: requests (and in what their handlers decode of them, about as much again) does not grow with
#: its services' calls at once (64 each) times their RPCs' limits: an owner's three services
#: 0.66 GiB at the defaults, the curator's ``CreateSession`` alone 64 x 17 MiB (64 such calls of
#: 15 MB at once raised a curator by 1.5 GiB; with this budget by 142 MiB). Seven of an owner's
#: largest requests (4.1 MiB) fit at once; one of the curator's largest (``CreateSession`` and
#: ``QuoteSession``, 17 MiB) and, beside it, requests of up to 15 MiB, so that a second such
#: request waits while the first is read and held (two would need 34 MiB).
REQUEST_BUDGET_BYTES = 32 << 20
#: Of the request budget, the bytes one caller's calls hold at once (:class:`CallerShares`): half
#: of it, so that beside one caller's share a request of up to the other half fits (each RPC's
#: limit at the defaults is below it, but the curator's ``CreateSession`` and ``QuoteSession``,
#: 17 MiB). A request larger than the share is served when its caller holds nothing else (and,
#: larger than the budget, alone): beside such a request of the curator's, 15 MiB fit.
REQUEST_BYTES_PER_CALLER = REQUEST_BUDGET_BYTES // 2
#: Seconds a read turn waits for its message, beyond what the message's most bytes (its RPC's
#: limit, at most ``framing.FRAME_BYTES``) take at :data:`MIN_UPLOAD_BYTES_PER_SECOND`, once
#: another call waits for a turn (:class:`ReadTurns`): the turn is then taken back, its call
#: refused (RESOURCE_EXHAUSTED), and the turn handed on. A 1 MiB piece thus has 5 s, a request
#: of at most 64 KiB 1.25 s. Without it a turn held without its message was kept
#: ``READ_WAIT_SECONDS`` whoever waited, and calls that send nothing, two per identity, were
#: queued before a well-behaved caller's: 12 consumer identities kept a consumer's and an
#: owner's calls at the curator waiting 57 s.
TURN_GRACE_SECONDS = 1.0
#: Seconds a caller counts as stalling once one of its calls gave up a read turn without its
#: message (refused, taken back, or gone), or had its message arrive slower than
#: ``TURN_GRACE_SECONDS`` and its size at the least rate while another call waited for a turn, or
#: gave up a declared request without its last byte: its calls
#: waiting for a read turn or for the request budget are then served after those of every caller
#: that is not stalling (:meth:`CallerShares.stalled`), so that identities whose calls send
#: nothing are no longer queued before a caller that sends its requests.
STALL_MEMORY_SECONDS = 60.0
#: Callers remembered as stalling at most (the oldest forgotten first): the marks do not grow
#: with the callers (on plaintext transport, connections) a server has seen.
STALLING_CALLERS = 4096
#: Seconds a declared request still has to arrive whole once a call of a caller that is not
#: stalling waits for the request budget: a request holding bytes others wait for must then
#: arrive at whatever rate finishes it within this (a 16 MiB request barely started: 1.6 MiB/s),
#: or it is refused RESOURCE_EXHAUSTED and its bytes go to the first caller waiting that is not
#: stalling. On a quiet server (no such call waiting for the budget) it has no deadline
#: (:data:`WAIT_ALONE`). Without it two identities uploading 16 MiB each at 260 KiB/s held the
#: curator's budget 63 s per round.
CONTENDED_UPLOAD_SECONDS = 10.0
#: Bytes the request budget serves beyond :data:`REQUEST_BUDGET_BYTES` to requests of at most
#: :data:`SMALL_REQUEST_BYTES` each (1 MiB: 16 of them), ahead of larger requests waiting
#: (:class:`RequestBudget`): requests of ids and scalars, most of every service's, then never wait
#: for large ones, which two identities' declared uploads could hold whole (the curator's
#: ``ListSketchSpecs`` waited for them 10 s, 60 s before ``CONTENDED_UPLOAD_SECONDS``).
SMALL_LANE_BYTES = 1 << 20
#: Name under which the health and reflection services' calls are counted together.
OPEN_SERVICES = "the health and reflection services"
#: Calls one caller may have in progress on the health or reflection service (a probe calls
#: once every few seconds).
OPEN_CALLS_PER_CALLER = 2
#: Whether the health and reflection services read their requests outside the server's
#: :data:`READS_AT_ONCE` turns. Any identity may call them, so two identities' stalled probes
#: (two each) held every turn and slowed every other call of the server by up to
#: :data:`READ_WAIT_SECONDS`; apart, they hold at most ``OPEN_CONCURRENT_CALLS`` reads of one
#: message each (2 x 8 x 1 MiB) beside the turns.
OPEN_READS_APART = True
#: Whether a wait that :data:`READ_WAIT_SECONDS` bounds (a read turn's for its message, a call's
#: for one of its caller's own read turns) ends in a refusal only while another call waits (for
#: a read turn, or, a call of a caller that is not stalling, for the request budget:
#: :meth:`CallerShares.contended`), looked at every ``READ_WAIT_SECONDS``, and a declared request
#: has a deadline only from then (:data:`CONTENDED_UPLOAD_SECONDS`). A caller alone on a server
#: is then never refused for its link's speed. Whoever waited, a curator on a 30 KiB/s uplink
#: to an owner, its four concurrent ``OpenSession`` of 0.2 MB sharing it, had one refused after
#: 10 s and the owner left out of the request (and a declared request needed 256 KiB/s on a
#: quiet server).
WAIT_ALONE = True


class RequestNotSentError(ResourceExhaustedError):
    """A call's request (or its next piece) had not arrived at a look, :data:`READ_WAIT_SECONDS`
    apart, while another call waited (:meth:`CallerShares.patiently`): the read slot is given
    back and the call refused."""


class RequestTooSlowError(ResourceExhaustedError):
    """A declared request did not arrive whole within :data:`CONTENDED_UPLOAD_SECONDS` of a call
    of a caller that is not stalling waiting for the request budget (with :data:`WAIT_ALONE`
    off, also within ``READ_WAIT_SECONDS + declared / MIN_UPLOAD_BYTES_PER_SECOND`` of taking its
    budget): its budget is given back and the call refused."""


class TurnTakenBackError(RequestNotSentError):
    """A call's message did not arrive within its turn's grace (:data:`TURN_GRACE_SECONDS` and
    its most bytes at :data:`MIN_UPLOAD_BYTES_PER_SECOND`) while another call waited for a read
    turn: the turn is handed on and the call refused."""


class TurnsTakenError(ResourceExhaustedError):
    """A call waiting for one of its caller's own read turns (:meth:`CallerShares.reading`), all
    taken by the caller's other calls, still waited at a look, :data:`READ_WAIT_SECONDS` apart,
    while another call waited: it is refused."""


class RequestTooLargeError(ResourceExhaustedError):
    """A request above its RPC's receive limit (``RESOURCE_EXHAUSTED``); it was not parsed."""


class RequestBudget:
    """The request bytes a server's calls hold at once (:data:`REQUEST_BUDGET_BYTES`).

    :meth:`take` waits until ``size`` fits beside what is held, or nothing is held (a request
    larger than the budget is served alone); :meth:`give` returns bytes taken. Calls are served
    first come first served, those of a caller that is not stalling (:attr:`stalled`) before
    those of one that is; a call of a caller that is not stalling that starts waiting calls
    each of :attr:`watchers` (the declared requests being read, whose deadline then shortens:
    :data:`CONTENDED_UPLOAD_SECONDS`).
    A request of at most :data:`SMALL_REQUEST_BYTES` may also take bytes of ``small_lane``
    beyond ``total``, at once, whoever waits. Runs on the server's event loop.

    Parameters
    ----------
    total : int
        The budget, bytes (positive).
    small_lane : int, optional
        Bytes beyond ``total`` that small requests may take (:data:`SMALL_LANE_BYTES` for a
        server's budget; none by default).
    """

    def __init__(self, total: int, small_lane: int = 0) -> None:
        if total < 1:
            raise ValueError(f"total must be a positive number of bytes, got {total}")
        self.total = total
        self.small_lane = small_lane
        #: Bytes taken and not given back.
        self.held = 0
        #: Whether a caller is stalling (its waiting calls are served after the others'); by
        #: default none is.
        self.stalled: Callable[[str], bool] = lambda caller: False
        #: Called whenever a call starts waiting.
        self.watchers: set[Callable[[], None]] = set()
        self._waiting: deque[tuple[int, str, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.total or self._in_lane(size)

    def _in_lane(self, size: int) -> bool:
        """Whether ``size`` is a small request that fits in the lane (the budget has one) beyond
        what is held."""
        return (
            self.small_lane > 0
            and size <= SMALL_REQUEST_BYTES
            and self.held + size <= self.total + self.small_lane
        )

    @property
    def waiting(self) -> bool:
        """Whether a call waits for bytes."""
        return bool(self._waiting)

    @property
    def pressed(self) -> bool:
        """Whether a call of a caller that is not stalling waits for bytes: only such a call
        shortens the declared requests being read (a stalling caller's waiting calls hurried an
        honest upload until it was refused, every time: two identities that sent nothing stopped
        every upload longer than :data:`CONTENDED_UPLOAD_SECONDS`)."""
        return any(not self.stalled(caller) for _, caller, _ in self._waiting)

    async def take(self, size: int, caller: str = "") -> None:
        """Take ``size`` bytes for ``caller``, waiting for them if need be."""
        if (not self._waiting and self._fits(size)) or self._in_lane(size):
            self.held += size
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (size, caller, granted)
        self._waiting.append(entry)
        if not self.stalled(caller):
            for watcher in list(self.watchers):
                watcher()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(size)  # granted as the call went away
            else:
                self._waiting.remove(entry)
                self._grant()
            raise

    def give(self, size: int) -> None:
        """Give back ``size`` bytes taken, and serve the calls waiting that now fit."""
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            entry = _first_not_stalling(self._waiting, self.stalled)
            if not self._fits(entry[0]):
                small = [e for e in self._waiting if self._in_lane(e[0])]
                if not small:
                    return
                entry = small[0]
            size, _, granted = entry
            self._waiting.remove(entry)
            if not granted.done():
                self.held += size
                granted.set_result(None)


def _first_not_stalling(waiting: deque[Any], stalled: Callable[[str], bool]) -> Any:
    """The first of ``waiting`` (entries whose second item is the caller) whose caller is not
    stalling, or the first."""
    for entry in waiting:
        if not stalled(entry[1]):
            return entry
    return waiting[0]


@dataclass(eq=False)
class _Turn:
    """One of the server's read turns, held by a call (:class:`ReadTurns`)."""

    #: Seconds its message may take once another call waits for a turn.
    grace: float
    #: The read of its message in progress (None between reads).
    reader: asyncio.Future[Any] | None = None
    #: When that read began (event loop time).
    since: float = 0.0
    #: Whether it was taken back (its read cancelled).
    taken_back: bool = False
    #: Whether another call waited for a turn while its read was in progress.
    pressed: bool = False
    timer: asyncio.TimerHandle | None = None


class ReadTurns:
    """The server's read turns (:data:`READS_AT_ONCE`): who reads a message now, who waits.

    A waiting call gets the next free turn, first come first served, a caller's that is not
    stalling (:meth:`CallerShares.stalled`) before a stalling one's. While a call waits, a turn
    whose read has waited for its message longer than the turn's grace
    (:data:`TURN_GRACE_SECONDS` plus its most bytes at :data:`MIN_UPLOAD_BYTES_PER_SECOND`) is
    taken back: its read is cancelled (the call is refused, :class:`TurnTakenBackError`) and the
    turn handed on. Nobody waiting, a read keeps its turn as long as its message takes
    (:meth:`CallerShares.patiently`).

    Parameters
    ----------
    turns : int
        Messages read at once (positive).
    stalled : callable
        Whether a caller (by name) is stalling.

    Notes
    -----
    A call of a caller that is not stalling, first in line among those, waits for a turn at most
    the longest grace of the turns' holders (5 s at the defaults, a 1 MiB piece; 1.25 s if they
    are requests of at most 64 KiB) for every non-stalling call before it, whatever the number
    of stalling callers: each turn is then either given back with its message read or taken back
    at its grace, and handed to it. A caller counts as stalling from its first turn given up
    without its message, so k identities whose calls send nothing delay it once each (at most
    ``READS_PER_CALLER`` turns each, a grace per ``READS_AT_ONCE`` of them) before they are served
    after it, and again only :data:`STALL_MEMORY_SECONDS` after their last such turn. A caller
    whose message, read while others waited, took longer than ``TURN_GRACE_SECONDS`` and its
    own size at the least rate counts as stalling as well (``_Gate._read_in_slot``), so that
    callers sending small messages slowly, just within the grace, are served after it too;
    callers sending at the least rate or faster are served first come first served among
    themselves, each turn held at most its grace.
    """

    def __init__(self, turns: int, stalled: Callable[[str], bool]) -> None:
        if turns < 1:
            raise ValueError(f"turns must be positive, got {turns}")
        self.turns = turns
        self.stalled = stalled
        #: The turns held.
        self.held: set[_Turn] = set()
        self._waiting: deque[tuple[float, str, asyncio.Future[_Turn]]] = deque()

    @property
    def waiting(self) -> int:
        """Calls waiting for a turn."""
        return len(self._waiting)

    def locked(self) -> bool:
        """Whether every turn is held."""
        return len(self.held) >= self.turns

    async def take(self, caller: str, grace: float) -> _Turn:
        """A turn for ``caller``'s call, whose message may take ``grace`` seconds once others
        wait; waits for it if need be."""
        if not self._waiting and not self.locked():
            return self._hand(grace)
        granted: asyncio.Future[_Turn] = asyncio.get_running_loop().create_future()
        entry = (grace, caller, granted)
        self._waiting.append(entry)
        for turn in self.held:
            self._press(turn)
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(granted.result())  # granted as the call went away
            else:
                self._waiting.remove(entry)
            raise

    def give(self, turn: _Turn) -> None:
        """Give ``turn`` back and hand the free turns to the calls waiting."""
        self.held.discard(turn)
        self.read(turn)
        while self._waiting and not self.locked():
            entry = _first_not_stalling(self._waiting, self.stalled)
            self._waiting.remove(entry)
            grace, _, granted = entry
            if not granted.done():
                granted.set_result(self._hand(grace))

    def reading(self, turn: _Turn, reader: asyncio.Future[Any]) -> None:
        """``turn``'s call now waits for its message, read by ``reader``."""
        turn.reader = reader
        turn.since = asyncio.get_running_loop().time()
        turn.pressed = False
        if self._waiting:
            self._press(turn)

    def read(self, turn: _Turn) -> None:
        """``turn``'s read has ended."""
        turn.reader = None
        if turn.timer is not None:
            turn.timer.cancel()
            turn.timer = None

    def _hand(self, grace: float) -> _Turn:
        turn = _Turn(grace)
        self.held.add(turn)
        return turn

    def _press(self, turn: _Turn) -> None:
        """Take ``turn`` back if its read has waited past its grace; else look again then."""
        if turn.reader is None or turn.taken_back:
            return
        turn.pressed = True
        loop = asyncio.get_running_loop()
        due = turn.since + turn.grace
        if loop.time() >= due:
            turn.taken_back = True
            turn.reader.cancel()
        elif turn.timer is None:
            turn.timer = loop.call_at(due, self._again, turn)

    def _again(self, turn: _Turn) -> None:
        turn.timer = None
        if self._waiting:
            self._press(turn)


@dataclass
class _Share:
    """One caller's share of a server's reads and request budget, while it has calls."""

    caller: str
    reads: asyncio.Semaphore
    budget: RequestBudget
    calls: int = 0


class CallerShares:
    """Each caller's share of a server's read turns and request budget.

    A caller (the identity its call's authorizer names; on plaintext transport, a connection)
    reads at most ``reads_per_caller`` of the server's ``reads`` messages at once and holds at
    most ``bytes_per_caller`` of its ``budget`` at once, or one request larger than that while it
    holds nothing else (a request larger than the whole budget is then served alone, as
    :class:`RequestBudget` serves it). A call waits for its caller's own share first and only
    then for the server's, so that a caller's queued calls hold nothing the others need. A
    caller's state lives from its first call in progress (:meth:`enter`) to the end of its last
    (:meth:`leave`): it does not grow with the callers or connections a server has seen. Runs on
    the server's event loop.

    Parameters
    ----------
    reads : int
        Messages the server reads at once (:data:`READS_AT_ONCE`).
    reads_per_caller : int
        Of those, the messages one caller reads at once (:data:`READS_PER_CALLER`).
    budget : RequestBudget
        The server's request budget (:data:`REQUEST_BUDGET_BYTES`).
    bytes_per_caller : int
        Of it, the bytes one caller's calls hold at once (:data:`REQUEST_BYTES_PER_CALLER`).

    Raises
    ------
    ValueError
        If a count or ``bytes_per_caller`` is not positive, or a caller's share of the reads
        exceeds the reads.

    Notes
    -----
    What one caller A can make another caller B wait for, B's own calls apart. **Reads**: A
    reads at most ``reads_per_caller`` messages at once, each as long as it takes while nobody
    waits (:meth:`patiently`); B waits for a turn only while every turn is
    taken, which takes ``reads / reads_per_caller`` distinct callers (2 at the defaults): A alone
    never delays B's read. **Request bytes**: A holds at most ``h = max(bytes_per_caller, r)``,
    r the largest request of the RPCs A may call, so a request of at most ``total - h`` fits
    beside whatever A holds (an owner at the defaults: 16 MiB, above each of its RPCs' limits;
    the curator: 15 MiB, as one consumer may hold a 17 MiB ``CreateSession``). B's request
    waits for A only if it, or a request queued before it (the budget serves first come first
    served), is larger than that: the curator's ``CreateSession`` or ``QuoteSession`` above 15
    MiB, for as long as A's own large request is being read (from B's wait,
    :data:`CONTENDED_UPLOAD_SECONDS` at most). **A's queued calls**: once another call waits, a
    call of A waiting for one of A's read turns is refused at its next look,
    :data:`READ_WAIT_SECONDS` apart (:meth:`reading`), so that it holds its slot of its
    service's calls at once (of which A has at most :attr:`ServiceLimits.per_caller`, half by
    default: :class:`Admission` refuses B's call for A's only if two identities fill them) that
    long at most, not until every call of A before it has been refused in turn. **Several
    identities together**: k distinct callers hold k shares; ``reads / reads_per_caller``
    callers that send nothing can again hold every read turn, and ``total / bytes_per_caller``
    (2) callers the budget, but only until a call waits: a turn without its message is then
    taken back at its grace (:class:`ReadTurns`), a declared request has
    :data:`CONTENDED_UPLOAD_SECONDS` more at most, and a caller that gave either up unfinished
    counts as stalling (:meth:`stall`), its waiting calls served after every other caller's
    (module docstring: the bounds).
    """

    def __init__(
        self, reads: int, reads_per_caller: int, budget: RequestBudget, bytes_per_caller: int
    ) -> None:
        if not 1 <= reads_per_caller <= reads:
            raise ValueError(
                f"reads_per_caller must be between 1 and reads ({reads}), got {reads_per_caller}"
            )
        if bytes_per_caller < 1:
            raise ValueError(f"bytes_per_caller must be positive, got {bytes_per_caller}")
        #: When each caller that stalled lately stops counting as stalling (monotonic time),
        #: oldest first.
        self.stalling: dict[str, float] = {}
        self.reads = ReadTurns(reads, self.stalled)
        self.budget = budget
        budget.stalled = self.stalled
        self.reads_per_caller = reads_per_caller
        self.bytes_per_caller = bytes_per_caller
        #: Each caller with calls in progress, and its share.
        self.callers: dict[str, _Share] = {}

    def stall(self, caller: str) -> None:
        """Count ``caller`` as stalling for :data:`STALL_MEMORY_SECONDS` from now: one of its
        calls gave up a read turn without its message, or a declared request before its end."""
        now = time.monotonic()
        self.stalling.pop(caller, None)
        self.stalling[caller] = now + STALL_MEMORY_SECONDS
        for name, until in list(self.stalling.items()):
            if until > now and len(self.stalling) <= STALLING_CALLERS:
                break
            del self.stalling[name]

    def stalled(self, caller: str) -> bool:
        """Whether ``caller`` counts as stalling (:meth:`stall`)."""
        until = self.stalling.get(caller)
        return until is not None and until > time.monotonic()

    def contended(self) -> bool:
        """Whether another call waits: for one of the server's read turns, or (a call of a
        caller that is not stalling) for the request budget (:attr:`RequestBudget.pressed`)."""
        return bool(self.reads.waiting) or self.budget.pressed

    async def patiently(self, wait: Callable[[], Awaitable[_T]], bounded: bool = False) -> _T:
        """``wait()``'s result, looked at every :data:`READ_WAIT_SECONDS` (``wait`` is called
        anew for each look, and cancelled at its end).

        Raises
        ------
        TimeoutError
            At the first look that finds it not done while another call waits
            (:meth:`contended`); with ``bounded``, or :data:`WAIT_ALONE` off, at the first look.
        """
        while True:
            try:
                return await asyncio.wait_for(wait(), READ_WAIT_SECONDS)
            except TimeoutError:
                if bounded or not WAIT_ALONE or self.contended():
                    raise

    def enter(self, caller: str) -> _Share:
        """Count a call of ``caller`` in; return its caller's share."""
        share = self.callers.get(caller)
        if share is None:
            reads = asyncio.Semaphore(self.reads_per_caller)
            budget = RequestBudget(self.bytes_per_caller)
            share = self.callers[caller] = _Share(caller, reads, budget)
        share.calls += 1
        return share

    def leave(self, caller: str) -> None:
        """Count a call of ``caller`` out (its reads ended, its bytes given back); the caller's
        share is dropped with its last call."""
        share = self.callers[caller]
        share.calls -= 1
        if not share.calls:
            del self.callers[caller]

    @contextlib.asynccontextmanager
    async def reading(self, share: _Share, grace: float = 0.0) -> AsyncIterator[_Turn]:
        """Hold one of the caller's read turns, then one of the server's (:class:`ReadTurns`,
        its message's ``grace`` seconds), while a message is read; yield the server's turn.

        The caller's own turn is waited for :meth:`patiently`: its turns are taken only by its
        own calls, each of which holds one, once another call waits, until its next look at
        most if it sends nothing, so that a call queued behind its caller's stalled calls is
        refused as soon as they are, rather than holding its service's calls at once for as many
        rounds as there are calls before it; alone, it waits behind its caller's slow reads. The
        server's turn is waited for without a bound of its own: every turn is held by another
        caller's read, itself bounded (by its grace once this call waits: :class:`ReadTurns`).

        Raises
        ------
        TurnsTakenError
            If the caller's read turns are still taken at a look while another call waits:
            nothing is held for the call.
        """
        wait = READ_WAIT_SECONDS
        try:
            await self.patiently(share.reads.acquire)
        except TimeoutError:
            raise TurnsTakenError(
                f"this caller's {self.reads_per_caller} read turns stayed taken by its other "
                f"calls for {wait:g} s: send fewer requests at once, each as soon as its call "
                "starts"
            ) from None
        try:
            turn = await self.reads.take(share.caller, grace)
            try:
                yield turn
            finally:
                self.reads.give(turn)
        finally:
            share.reads.release()

    async def take(self, share: _Share, size: int) -> None:
        """Take ``size`` request bytes from the caller's share, then from the server's budget,
        waiting for each if need be."""
        await share.budget.take(size)
        try:
            await self.budget.take(size, share.caller)
        except BaseException:  # cancelled: the call went away while it waited
            share.budget.give(size)
            raise

    def give(self, share: _Share, size: int) -> None:
        """Give back ``size`` request bytes taken (to the server's budget and the caller's
        share)."""
        self.budget.give(size)
        share.budget.give(size)


@dataclass(frozen=True)
class ServiceLimits:
    """What one service's callers may make it hold: its RPCs' receive limits, its calls at once.

    A servicer sets it as its ``limits`` attribute; a servicer without one gets the defaults.

    Parameters
    ----------
    requests : mapping of str to int
        Receive limit, bytes, of an RPC (by its name, e.g. ``"OpenSession"``): the largest
        request (for a client stream, the largest message) the RPC legitimately needs under
        the service's policy. RPCs not named get :data:`SMALL_REQUEST_BYTES`.
    concurrent_calls : int
        Calls the service serves at once (streams included, until they end); the next is
        answered ``RESOURCE_EXHAUSTED`` before its request is read.
    calls_per_caller : int, optional
        Of those, the calls one caller (an identity; on plaintext transport, a connection) has
        in progress at once; its next is answered ``RESOURCE_EXHAUSTED`` before its request is
        read. By default half of ``concurrent_calls`` (:attr:`per_caller`), so that one
        identity alone never fills the service: a service whose callers need more sets both.

    Raises
    ------
    ValueError
        If a limit, ``concurrent_calls`` or ``calls_per_caller`` is not a positive integer, or
        ``calls_per_caller`` exceeds ``concurrent_calls``.
    """

    requests: Mapping[str, int] = field(default_factory=dict)
    concurrent_calls: int = DEFAULT_CONCURRENT_CALLS
    calls_per_caller: int | None = None

    def __post_init__(self) -> None:
        counts = {**self.requests, "concurrent_calls": self.concurrent_calls}
        if self.calls_per_caller is not None:
            counts["calls_per_caller"] = self.calls_per_caller
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.per_caller > self.concurrent_calls:
            raise ValueError(
                f"calls_per_caller ({self.per_caller}) must not exceed concurrent_calls "
                f"({self.concurrent_calls}): lower it, or raise concurrent_calls"
            )
        object.__setattr__(self, "requests", dict(self.requests))

    @property
    def per_caller(self) -> int:
        """The calls one caller has in progress at once: ``calls_per_caller``, or half of
        ``concurrent_calls`` (at least one)."""
        if self.calls_per_caller is not None:
            return self.calls_per_caller
        return max(1, self.concurrent_calls // 2)

    def request_bytes(self, rpc: str) -> int:
        """The receive limit of ``rpc``, bytes."""
        return self.requests.get(rpc, SMALL_REQUEST_BYTES)

    @property
    def largest(self) -> int:
        """The largest receive limit of any of the service's RPCs, bytes."""
        return max([SMALL_REQUEST_BYTES, *self.requests.values()])


def limits_of(servicer: object) -> ServiceLimits:
    """A servicer's :class:`ServiceLimits` (its ``limits`` attribute), or the defaults."""
    limits = getattr(servicer, "limits", None)
    return limits if isinstance(limits, ServiceLimits) else ServiceLimits()


Behaviour = Callable[..., Any]


class _Gate:
    """Admission of one RPC: its authorization, its service's count, its receive limit."""

    def __init__(
        self,
        admission: Admission,
        service: str,
        rpc: str,
        authorize: Callable[[grpc.aio.ServicerContext], str],
        limit: int,
        concurrent_calls: int,
        per_caller: int,
    ) -> None:
        self.admission = admission
        self.service = service
        self.rpc = rpc
        self.authorize = authorize
        self.limit = limit
        self.concurrent_calls = concurrent_calls
        self.per_caller = per_caller
        #: The health and reflection services (read outside the server's read turns).
        self.open = service == OPEN_SERVICES and OPEN_READS_APART

    def admit(self, context: grpc.aio.ServicerContext) -> tuple[_Share, Callable[[], None]]:
        """Authorize the call and count it in; return its caller's :class:`CallerShares` share
        and what counts it out.

        Raises
        ------
        UnauthenticatedError, PermissionDeniedError
            As the servicer's authorizer (or, on an open service, without an identity).
        ResourceExhaustedError
            If this caller, or the service, has its most calls at once (the caller's count is
            compared first, so that a caller at its own limit is told so).
        """
        caller = self.authorize(context)
        # On plaintext transport every caller of a protected service has the one identity: each
        # connection is then a caller of its own.
        fair = f"insecure {context.peer()}" if self.admission.insecure else caller
        active = self.admission.active
        key = (self.service, fair)
        if active.get(key, 0) >= self.per_caller:
            raise ResourceExhaustedError(
                f"{fair} has its limit of {self.per_caller} calls at once in progress on "
                f"{self.service}; retry when one has ended"
            )
        if active.get(self.service, 0) >= self.concurrent_calls:
            raise ResourceExhaustedError(
                f"{self.service} is serving its limit of {self.concurrent_calls} calls at once; "
                "retry when one has ended"
            )
        keys: tuple[Any, ...] = (self.service, key)
        if self.service == OPEN_SERVICES:
            whom = self.admission.open_class(context)
            group = (OPEN_SERVICES, whom, None)  # the calls of the caller's class
            if active.get(group, 0) >= OPEN_CALLS_PER_CLASS:
                named = {
                    OTHERS: "parties their server's own services do not serve",
                    ITSELF: "the server's own identity",
                }
                raise ResourceExhaustedError(
                    f"{self.service} are serving the {OPEN_CALLS_PER_CLASS} calls at once they "
                    f"keep for {named.get(whom, whom + 's')}; retry when one has ended"
                )
            keys += (group,)
        for k in keys:
            active[k] = active.get(k, 0) + 1
        shares = self.admission.shares
        share = shares.enter(fair)

        def release() -> None:
            shares.leave(fair)
            for k in keys:
                left = active[k] - 1
                if left:
                    active[k] = left
                else:
                    del active[k]

        return share, release

    def _received(self, size: int) -> None:
        """Count ``size`` more bytes into the current call's received total (its end gives
        memory back if the total is large: :func:`_forgetting`)."""
        received = _received.get()
        if received is not None:  # a call served by _forgetting, as every call is
            if received[0] < RELEASE_AFTER_BYTES <= received[0] + size:
                large_call_began()
            received[0] += size

    def _too_large(self, size: int) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"a {self.rpc} request of {size} bytes exceeds this method's limit of "
            f"{self.limit} bytes, set by the service's policy (docs/reference.md, "
            '"Message limits"): send a smaller request'
        )

    def _parse(self, parse: Callable[[bytes], Any] | None, raw: bytes) -> Any:
        if parse is None:
            return raw
        try:
            return parse(raw)
        except DecodeError:
            raise InvalidArgumentError(f"the {self.rpc} request does not parse") from None

    def deserializer(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        """``parse`` behind the receive limit, for each message of a client stream: a message
        above it raises :class:`RequestTooLargeError` unparsed; one that does not parse,
        InvalidArgumentError."""

        def deserialize(raw: bytes) -> Any:
            self._received(len(raw))
            if len(raw) > self.limit:
                raise self._too_large(len(raw))
            return self._parse(parse, raw)

        return deserialize

    def handler(self, inner: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``inner`` served as a client stream whose requests are read once admitted: a unary
        request's pieces (:mod:`dpmarket.runtime.framing`) as raw bytes, joined and parsed by
        :meth:`_read_request`; a client stream's messages each parsed as its handler reads it."""
        serialize = inner.response_serializer
        behaviour = _behaviour(inner)
        if not inner.request_streaming:
            parse = inner.request_deserializer
            if not inner.response_streaming:
                return grpc.stream_unary_rpc_method_handler(
                    _forgetting(self._unary_unary(behaviour, parse)), None, serialize
                )
            return grpc.stream_stream_rpc_method_handler(
                _forgetting(self._unary_stream(behaviour, parse)), None, serialize
            )
        deserialize = self.deserializer(inner.request_deserializer)
        if not inner.response_streaming:
            return grpc.stream_unary_rpc_method_handler(
                _forgetting(self._stream_unary(behaviour)), deserialize, serialize
            )
        return grpc.stream_stream_rpc_method_handler(
            _forgetting(self._stream_stream(behaviour)), deserialize, serialize
        )

    def _give_back(self, share: _Share, held: list[int]) -> None:
        """Give the request bytes a call took (:meth:`_read_request`) back to the budget."""
        for size in held:
            self.admission.shares.give(share, size)

    async def _refuse(self, exc: Exception, context: grpc.aio.ServicerContext) -> None:
        """Abort with the status of an admission or reading error (always raises)."""
        await abort_for(exc, context, self.rpc)

    def _declared(self, context: grpc.aio.ServicerContext) -> int | None:
        """The request size a client sending pieces declared
        (:data:`~dpmarket.runtime.framing.SIZE_METADATA`), or None.

        Raises
        ------
        InvalidArgumentError
            If the declaration is not a non-negative integer.
        """
        for key, value in context.invocation_metadata() or ():
            if key == SIZE_METADATA:
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
                # ASCII digits only, at most 19 (int() refuses other Unicode digits and more
                # than 4,300 digits with ValueError, which would leave the call UNKNOWN).
                if not (text.isascii() and text.isdigit() and len(text) <= 19):
                    raise InvalidArgumentError(
                        f"{SIZE_METADATA} must be the request's size in bytes, got {text[:32]!r}"
                    )
                return int(text)
        return None

    def _grace(self) -> float:
        """Seconds this RPC's message may take in its read turn once others wait for one
        (:class:`ReadTurns`): :data:`TURN_GRACE_SECONDS` and its most bytes at
        :data:`MIN_UPLOAD_BYTES_PER_SECOND`."""
        most = min(self.limit, self.admission.frame_bytes)
        return TURN_GRACE_SECONDS + most / MIN_UPLOAD_BYTES_PER_SECOND

    async def _read_in_slot(
        self, context: grpc.aio.ServicerContext, share: _Share, turn: _Turn | None
    ) -> Any:
        """The call's next message (or ``_EOF``), read while the caller holds read ``turn``
        (None: the open services, read apart). A call whose read ends without its message
        (refused, or gone), or whose message, while another call waited for a turn, took longer
        than :data:`TURN_GRACE_SECONDS` and its own size at :data:`MIN_UPLOAD_BYTES_PER_SECOND`,
        makes its caller stalling (:meth:`CallerShares.stall`).

        Raises
        ------
        RequestNotSentError
            If it has not arrived at a look, :data:`READ_WAIT_SECONDS` apart, while another
            call waits (:meth:`CallerShares.patiently`; an open service's, at the first look):
            the slot is given back and the call refused, so that a caller that sends nothing
            cannot hold the server's reads.
        TurnTakenBackError
            If it did not arrive within the turn's grace while another call waited for a turn
            (:class:`ReadTurns`).
        """
        shares = self.admission.shares
        reader = asyncio.ensure_future(context.read())
        if turn is not None:
            shares.reads.reading(turn, reader)
        try:
            message = await shares.patiently(lambda: asyncio.shield(reader), turn is None)
        except TimeoutError:
            shares.stall(share.caller)
            raise RequestNotSentError(
                f"the {self.rpc} request did not arrive within {READ_WAIT_SECONDS:g} s of its "
                "turn to be read: send a request as soon as the call starts"
            ) from None
        except asyncio.CancelledError:
            shares.stall(share.caller)
            task = asyncio.current_task()
            if turn is None or not turn.taken_back or (task is not None and task.cancelling()):
                raise
            raise TurnTakenBackError(
                f"the {self.rpc} request did not arrive within {turn.grace:g} s of its turn to "
                "be read while other calls waited for one: send a request as soon as the call "
                "starts, at 2 Mbit/s at least"
            ) from None
        finally:
            reader.cancel()  # (done by now, unless refused or the call went away)
            if turn is not None:
                shares.reads.read(turn)
        if turn is not None and turn.pressed and isinstance(message, bytes):
            # Arrived within the turn's grace, but slower than its own size needs while others
            # waited: a caller sending small messages slowly is served after them as well.
            took = asyncio.get_running_loop().time() - turn.since
            if took > TURN_GRACE_SECONDS + len(message) / MIN_UPLOAD_BYTES_PER_SECOND:
                shares.stall(share.caller)
        return message

    async def _read_request(
        self,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
        share: _Share,
        held: list[int],
    ) -> Any:
        """Read a unary request (one message, or the pieces of its declared size); return it
        parsed.

        A request declared above the method's limit is refused before a byte of it is read.
        Otherwise the call first takes the bytes its request may hold from the server's
        :class:`RequestBudget` (the declared size; for a request sent as one message, the
        method's limit up to one message, then the size it had), appended to ``held`` for the
        caller to give back when the call ends; a declared request is then told to start (the
        response's headers, which a client sending pieces awaits:
        :mod:`dpmarket.runtime.framing`). Each message is read holding one of the server's
        :data:`READS_AT_ONCE` read slots (gRPC buffers it whole, up to
        :data:`~dpmarket.runtime.framing.FRAME_BYTES`, when it is read); pieces are joined and
        parsed in the last one's slot, so that at most ``READS_AT_ONCE`` requests are held twice
        at once. The end of the client's stream is not awaited: an undeclared request is its
        first message, a declared one its pieces up to the declared size.

        Raises
        ------
        RequestTooLargeError
            If the declared size exceeds the method's limit (nothing read), or a message
            exceeds it, or the pieces' count what that limit needs
            (:func:`~dpmarket.runtime.framing.most_pieces`): nothing more is read.
        RequestTooSlowError
            If a declared request is not read whole within its deadline
            (:meth:`_read_declared`).
        InvalidArgumentError
            If the call ends without a request or before its declared size, its pieces hold
            more than that, or the request does not parse.
        """
        declared = self._declared(context)
        if declared is not None and declared > self.limit:
            raise self._too_large(declared)
        reserved = min(self.limit, self.admission.frame_bytes) if declared is None else declared
        shares = self.admission.shares
        await shares.take(share, reserved)
        held.append(reserved)
        if declared is None:  # one message, as any gRPC client sends a unary request
            # The health and reflection services read outside the server's turns: their calls
            # are few (OPEN_CONCURRENT_CALLS, each at most one message), and any identity may
            # make them, so two identities' stalled probes must not hold every turn the other
            # services read with.
            async with (
                contextlib.nullcontext() if self.open else shares.reading(share, self._grace())
            ) as turn:
                raw = await self._read_in_slot(context, share, turn)
                if raw is _EOF:
                    raise InvalidArgumentError(f"the {self.rpc} call ended without a request")
                self._received(len(raw))
                if len(raw) > self.limit:
                    raise self._too_large(len(raw))
                request = self._parse(parse, raw)
            shares.give(share, reserved - len(raw))  # keep what the request holds
            held[-1] = len(raw)
            return request
        await context.send_initial_metadata(((SIZE_METADATA, str(declared)),))
        return await self._read_declared(context, parse, share, declared)

    async def _read_declared(
        self,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
        share: _Share,
        declared: int,
    ) -> Any:
        """Read a declared request (:meth:`_read_pieces`) within its deadline:
        :data:`CONTENDED_UPLOAD_SECONDS` from the moment a call of a caller that is not stalling
        waits for the request budget, none before (with :data:`WAIT_ALONE` off, its least rate,
        :data:`MIN_UPLOAD_BYTES_PER_SECOND`, as well). A request that ends before it is whole,
        refused or gone, makes its caller stalling.

        Raises
        ------
        RequestTooSlowError
            If it is not read whole within its deadline.
        """
        loop = asyncio.get_running_loop()
        shares = self.admission.shares
        allowed = READ_WAIT_SECONDS + declared / MIN_UPLOAD_BYTES_PER_SECOND
        contended: list[float] = []  # when another call first waited for the budget
        try:
            async with asyncio.timeout(None if WAIT_ALONE else allowed) as deadline:

                def press() -> None:
                    when, sooner = deadline.when(), loop.time() + CONTENDED_UPLOAD_SECONDS
                    if not contended and (when is None or sooner < when):
                        contended.append(sooner)
                        deadline.reschedule(sooner)

                shares.budget.watchers.add(press)
                try:
                    if shares.budget.pressed:
                        press()
                    return await self._read_pieces(context, parse, share, declared)
                finally:
                    shares.budget.watchers.discard(press)
        except TimeoutError:
            shares.stall(share.caller)
            if contended:
                raise RequestTooSlowError(
                    f"the {self.rpc} request of {declared} bytes did not arrive within "
                    f"{CONTENDED_UPLOAD_SECONDS:g} s of another call waiting for the server's "
                    "request budget: send it faster, or a smaller one"
                ) from None
            raise RequestTooSlowError(
                f"the {self.rpc} request of {declared} bytes did not arrive within {allowed:g} s "
                f"({READ_WAIT_SECONDS:g} s and {MIN_UPLOAD_BYTES_PER_SECOND} bytes per second): "
                "send it faster, or a smaller one"
            ) from None
        except asyncio.CancelledError:
            shares.stall(share.caller)
            raise

    async def _read_pieces(
        self,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
        share: _Share,
        declared: int,
    ) -> Any:
        """Read the pieces of a declared request (:meth:`_read_request`) and return it parsed."""
        shares = self.admission.shares
        parts: list[bytes] = []
        total = 0
        most = most_pieces(self.limit)
        while True:
            # A piece arrives right after the one before: a read slot is held for a moment
            # (longer only by a client that sends slowly: while others wait, a grace at most).
            async with shares.reading(share, self._grace()) as turn:
                if total == declared:
                    raw = parts[0] if len(parts) == 1 else b"".join(parts)
                    parts.clear()
                    return self._parse(parse, raw)
                if len(parts) == most:
                    raise RequestTooLargeError(
                        f"a {self.rpc} request in more than {most} pieces exceeds what this "
                        f"method's limit of {self.limit} bytes needs: send pieces of "
                        f'{FRAME_BYTES} bytes (docs/reference.md, "Message limits")'
                    )
                piece = await self._read_in_slot(context, share, turn)
            if piece is _EOF:
                raise InvalidArgumentError(
                    f"the {self.rpc} call ended after {total} of the {declared} bytes its "
                    f"{SIZE_METADATA} declared"
                )
            self._received(len(piece))
            total += len(piece)
            if total > declared:
                raise InvalidArgumentError(
                    f"the {self.rpc} request's pieces hold more than the {declared} bytes its "
                    f"{SIZE_METADATA} declared"
                )
            parts.append(piece)

    def _unary_unary(self, inner: Behaviour, parse: Callable[[bytes], Any] | None) -> Behaviour:
        async def behaviour(_: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                share, release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            held: list[int] = []
            try:
                try:
                    request = await self._read_request(context, parse, share, held)
                except _UNREADABLE as exc:
                    return await self._refuse(exc, context)
                return await inner(request, context)
            finally:
                self._give_back(share, held)
                release()

        return behaviour

    def _unary_stream(self, inner: Behaviour, parse: Callable[[bytes], Any] | None) -> Behaviour:
        async def behaviour(_: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            try:
                share, release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            held: list[int] = []
            try:
                request = await self._read_request(context, parse, share, held)
                await _respond(inner, request, context)
            except _UNREADABLE as exc:
                await self._refuse(exc, context)
            finally:
                self._give_back(share, held)
                release()

        return behaviour

    def _stream_unary(self, inner: Behaviour) -> Behaviour:
        async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                _, release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            try:
                return await inner(requests, context)
            except _UNREADABLE as exc:
                await self._refuse(exc, context)
            finally:
                release()

        return behaviour

    def _stream_stream(self, inner: Behaviour) -> Behaviour:
        async def behaviour(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> None:
            try:
                _, release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            try:
                await _respond(inner, requests, context)
            except _UNREADABLE as exc:
                await self._refuse(exc, context)
            finally:
                release()

        return behaviour


def _behaviour(handler: grpc.RpcMethodHandler) -> Behaviour:
    """The function that serves a method handler (whichever of its four kinds it is)."""
    behaviour = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    if behaviour is None:
        raise ValueError("a method handler without a behaviour")
    return behaviour


def _forgetting(behaviour: Behaviour) -> Behaviour:
    """``behaviour`` whose ending exception keeps none of the call's frames (and so none of its
    request) once the call has ended.

    A call that ends in an error ends in :class:`grpc.aio.AbortError` (the status already sent,
    :func:`~dpmarket.runtime.status.abort_for`) or :class:`asyncio.CancelledError` (the client
    went away). gRPC keeps the AbortError in the call's state, which the server's loop holds
    until its next call, and the exception's traceback holds every frame the error passed
    through, and their locals: the request, its decoded arrays, the handler's copies. Each such
    frame also holds the call's context, which holds the call's state: a reference cycle that
    only a full garbage collection frees, which a long-lived service runs rarely. Refused 15 MiB
    ``CreateSession`` requests, 40 in a row and three bursts of 32, took a curator from 239 MiB
    to 2.6 GiB this way. The tracebacks of the exception and of every exception it
    chains are therefore dropped as it leaves, so that the frames are freed at once; any other
    exception (a bug) keeps its traceback for gRPC's log.
    """

    async def serve(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        received = [0]
        _received.set(received)
        try:
            return await behaviour(requests, context)
        except (grpc.aio.AbortError, asyncio.CancelledError) as exc:
            _drop_tracebacks(exc)
            raise
        finally:
            if received[0] >= RELEASE_AFTER_BYTES:
                large_call_ended()

    return serve


#: Request bytes the current call has received, in a one-element list: each call is served in
#: its own task, whose context is its own, and a task its handler starts shares the list.
_received: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "received", default=None
)


def _drop_tracebacks(exc: BaseException) -> None:
    """Set the traceback of ``exc`` and of every exception it chains (cause, context, group
    members) to None."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]
        pending += getattr(current, "exceptions", ())


async def _respond(inner: Behaviour, request: Any, context: grpc.aio.ServicerContext) -> None:
    """Serve a response stream: an async generator's messages are written one by one (as gRPC
    does); a coroutine function writes its own (gRPC's reader/writer API)."""
    if inspect.iscoroutinefunction(inner):
        await inner(request, context)
        return
    async for response in inner(request, context):
        await context.write(response)


#: What :meth:`grpc.aio.ServicerContext.read` returns at the end of the requests (grpc-stubs
#: does not declare it).
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]
#: What admission refuses a call for, and what reading its request may raise (a handler wrapped
#: by ``rpc``/``rpc_stream`` turns the latter into a status itself; these catch the rest).
_REFUSALS = (UnauthenticatedError, PermissionDeniedError, ResourceExhaustedError)
_UNREADABLE = (
    RequestTooLargeError,
    RequestNotSentError,
    RequestTooSlowError,
    TurnsTakenError,
    InvalidArgumentError,
)


class Admission(grpc.aio.ServerInterceptor):
    """Server interceptor that admits every call before its request is read (module docstring).

    Parameters
    ----------
    frame_bytes : int
        The server's receive limit, bytes: the largest message it reads
        (:data:`~dpmarket.runtime.framing.FRAME_BYTES`). A unary request may be larger, in
        pieces; a client stream's message may not, and a streaming RPC whose own limit is larger
        is held to it (a warning says so once).
    insecure : bool
        Plaintext transport (``--insecure``): no caller has an identity; the health and
        reflection services then admit every caller (the servicers' authorizers name the one
        identity every caller is taken to have).
    budget_bytes : int
        The request bytes its unary calls hold at once (:class:`RequestBudget`).
    caller_bytes : int, optional
        Of those, the bytes one caller's calls hold at once (:class:`CallerShares`); by default
        half the budget (:data:`REQUEST_BYTES_PER_CALLER` at the default budget).
    served : sequence of Authorizer, optional
        The authorizers of the server's own services: the identities one of them serves (by
        role and name) take the health and reflection services' calls of their role's class,
        every other identity those of :data:`OTHERS` (:meth:`open_class`;
        :data:`OPEN_CALLS_PER_CLASS` each). None (the default): every identity takes its role's.
    own : Identity, optional
        The server's own identity: its calls of the health and reflection services take the
        class :data:`ITSELF` (a stranger's single consumer identity, holding the calls of
        "the rest", refused every check an owner's operator made of it with its own
        certificate).
    """

    def __init__(
        self,
        frame_bytes: int = FRAME_BYTES,
        *,
        insecure: bool = False,
        budget_bytes: int = REQUEST_BUDGET_BYTES,
        caller_bytes: int | None = None,
        served: Sequence[Authorizer] | None = None,
        own: Identity | None = None,
    ) -> None:
        self.frame_bytes = frame_bytes
        self.own = own
        #: The request bytes its calls hold at once.
        self.budget = RequestBudget(budget_bytes, SMALL_LANE_BYTES)
        #: Unary requests being read at once (:data:`READS_AT_ONCE`), whichever the service, and
        #: the budget, each caller within its share (:data:`READS_PER_CALLER`, ``caller_bytes``).
        self.shares = CallerShares(
            READS_AT_ONCE,
            READS_PER_CALLER,
            self.budget,
            budget_bytes // 2 if caller_bytes is None else caller_bytes,
        )
        self.insecure = insecure
        self.served = None if served is None else tuple(served)
        #: Calls in progress per service name, and per (service, caller).
        self.active: dict[Any, int] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(  # type: ignore[override]  # None: no such method
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            inner = await continuation(handler_call_details)
            if inner is None:  # an unknown method: UNIMPLEMENTED, nothing read
                return None
            handler = self._handlers[method] = self._gate(method, inner).handler(inner)
        return handler

    def _gate(self, method: str, inner: grpc.RpcMethodHandler) -> _Gate:
        service, _, rpc = method.lstrip("/").rpartition("/")
        behaviour = _behaviour(inner)
        roles = getattr(behaviour, ROLES_ATTRIBUTE, None)
        servicer = getattr(behaviour, "__self__", None)
        authorizer = getattr(servicer, "authorizer", None)
        if roles is None or not isinstance(authorizer, Authorizer):
            return _Gate(
                self,
                OPEN_SERVICES,
                rpc,
                self._any_identity,
                SMALL_REQUEST_BYTES,
                OPEN_CONCURRENT_CALLS,
                OPEN_CALLS_PER_CALLER,
            )
        limits = limits_of(servicer)
        limit = limits.request_bytes(rpc)
        if inner.request_streaming and limit > self.frame_bytes:
            logger.warning(
                "%s: its messages' limit of %d bytes is above the server's largest message, %d "
                "bytes: held to it",
                method,
                limit,
                self.frame_bytes,
            )
            limit = self.frame_bytes

        def authorize(context: grpc.aio.ServicerContext) -> str:
            return str(authorizer.authorize(context, roles))

        return _Gate(
            self, service, rpc, authorize, limit, limits.concurrent_calls, limits.per_caller
        )

    def open_class(self, context: grpc.aio.ServicerContext) -> str:
        """The class whose :data:`OPEN_CALLS_PER_CLASS` calls of the health and reflection
        services the caller's call takes: its role, if the server's own services serve it (by
        role and name; every identity, without ``served``), else :data:`OTHERS`; the server's
        own identity (``own``) is :data:`ITSELF`. One rule at every server: at the curator
        consumers, owners, the curator itself (``dpmarket up``'s checks) and the rest each have
        their own calls, so that consumer identities holding theirs refuse no owner's check; at
        an owner the curators it serves, the owner itself (its compose healthcheck, its
        console) and the rest. On plaintext transport every caller is in one class. Its identity
        is already verified (:meth:`_any_identity`)."""
        if self.insecure:
            return "insecure callers"
        identity = peer_identity(context)
        if identity is None:
            return OTHERS
        if identity == self.own:
            return ITSELF
        if self.served is None:
            return identity.role
        for authorizer in self.served:
            if identity.role in authorizer.allowed:
                names = authorizer.allowed[identity.role]
                if names is None or identity.name in names:
                    return identity.role
        return OTHERS

    def _any_identity(self, context: grpc.aio.ServicerContext) -> str:
        """Any verified dpmarket identity (the health and reflection services)."""
        if self.insecure:  # no identities: each connection is a caller
            return f"insecure {context.peer()}"
        try:
            identity = peer_identity(context)
        except ValueError as exc:
            raise UnauthenticatedError(f"the client certificate is not usable: {exc}") from None
        if identity is None:
            raise UnauthenticatedError("no verified client certificate: connect with mTLS")
        return str(identity)
