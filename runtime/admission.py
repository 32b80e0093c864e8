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
   once (the health and reflection services :data:`OPEN_CONCURRENT_CALLS` together, and
   :data:`OPEN_CALLS_PER_CALLER` per caller); the next is answered ``RESOURCE_EXHAUSTED``, again
   before its request is read.
3. **how large**: each RPC has its own receive limit (:attr:`ServiceLimits.requests`, or
   :data:`SMALL_REQUEST_BYTES` for one that carries ids and scalars only), derived by its
   servicer from the policy's bounds and documented in ``docs/reference.md``; a request (each
   message of a client stream) above it is answered ``RESOURCE_EXHAUSTED`` and never parsed. The
   server's own receive limit, which gRPC applies to the declared length before buffering, is
   the largest of its RPCs' (:func:`largest_request`).

To do so every RPC is served as a client-streaming one (the wire format does not tell them
apart): its request is read by :meth:`grpc.aio.ServicerContext.read` once the call is admitted.
The servicer's wrapper still authorizes the call itself (the ``rpc`` semantics are unchanged).
Nothing is copied and no thread is involved: a request is the bytes gRPC read, checked by length
and parsed by its message's own parser; a stream's messages are checked one by one as its handler
reads them.

Notes
-----
What a party can make a service hold, in request bytes (its handlers' own memory apart):

* refused (wrong role or name, no identity): nothing of the request, only the flow-control
  window of its connection while the refusal is sent: the server grants a fixed window (gRPC's
  bandwidth-delay probing off) and accepts a bounded number of connections
  (:data:`~dpmarket.runtime.serving.TRANSPORT_BOUND_OPTIONS`);
* admitted: at most ``concurrent_calls`` calls of each service, each holding at most its RPC's
  limit once read. While a message is being read, before its length can be compared with the
  RPC's limit, gRPC buffers at most the server's limit, and at most :data:`READS_AT_ONCE`
  unary requests are read at once (a client stream's messages, ``RunRounds``, are read as its
  handler asks: at most one per stream);
* the health and reflection services: at most :data:`OPEN_CALLS_PER_CALLER` calls per caller and
  :data:`OPEN_CONCURRENT_CALLS` in all (the two services together), each read up to the
  server's limit and dropped at once when above :data:`SMALL_REQUEST_BYTES`.

and only while the calls run: the exception a call ends with keeps none of its frames
(:func:`_forgetting`), and the last of the calls in progress that received
:data:`~dpmarket.runtime.allocator.RELEASE_AFTER_BYTES` or more gives the process's free memory
back when it ends (:func:`~dpmarket.runtime.allocator.large_call_ended`). Reading a message
holds about twice its size for a moment (gRPC's buffers, then the bytes its parser reads).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
from dpmarket.runtime.identity import peer_identity
from dpmarket.runtime.status import abort_for

__all__ = [
    "COLUMN_BYTES",
    "DEFAULT_CONCURRENT_CALLS",
    "OPEN_CALLS_PER_CALLER",
    "OPEN_CONCURRENT_CALLS",
    "OPEN_SERVICES",
    "READS_AT_ONCE",
    "SMALL_REQUEST_BYTES",
    "VALUE_BYTES",
    "Admission",
    "RequestTooLargeError",
    "ServiceLimits",
    "largest_request",
]

logger = logging.getLogger(__name__)

#: Receive limit of an RPC whose request carries ids, names and scalars only (64 KiB): a session
#: id of at most 256 characters, privacy terms, a consumer's name, a few numbers.
SMALL_REQUEST_BYTES = 64 << 10
#: Bytes of one named column in a request (a CAPE spec's bounds, a schema's column): a name of up
#: to 256 characters, its type and two bounds, encoded.
COLUMN_BYTES = 512
#: Bytes of one float64 value of an ``Array`` on the wire.
VALUE_BYTES = 8
#: Calls one service serves at once unless its servicer says otherwise.
DEFAULT_CONCURRENT_CALLS = 64
#: Calls the health and reflection services serve at once, together and from all callers: each
#: is read up to the server's receive limit before its own is compared, so they may make a
#: server hold 2 x 4 x its limit (an owner 33 MiB, the curator 136 MiB), whoever calls. A probe
#: calls once every few seconds. (At 16 each, 1,000 concurrent 4 MB health checks raised an
#: owner by up to 131 MiB of reads.)
OPEN_CONCURRENT_CALLS = 4
#: Unary requests a server reads at once, over all its services; an admitted call waits for
#: its turn before its request is read (HTTP/2 flow control meanwhile holds the request at the
#: client, but for the stream's window, 64 KiB: ``serving.STREAM_WINDOW_BYTES``).
#: gRPC reads a message whole, up to the server's receive limit L, before its RPC's own limit
#: can be compared, and the read holds about 2 L for a moment (its buffers, then Python's
#: bytes): admitted callers' reads in progress hold at most ``READS_AT_ONCE`` x 2 L (an owner
#: 33 MiB, the curator 136 MiB), and each admitted call, once read, at most its RPC's own limit.
#: Without it every admitted call would read at once: 64 per service.
READS_AT_ONCE = 4
#: Name under which the health and reflection services' calls are counted together.
OPEN_SERVICES = "the health and reflection services"
#: Calls one caller may have in progress on the health or reflection service (a probe calls
#: once every few seconds).
OPEN_CALLS_PER_CALLER = 2


class RequestTooLargeError(ResourceExhaustedError):
    """A request above its RPC's receive limit (``RESOURCE_EXHAUSTED``); it was not parsed."""


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

    Raises
    ------
    ValueError
        If a limit or ``concurrent_calls`` is not a positive integer.
    """

    requests: Mapping[str, int] = field(default_factory=dict)
    concurrent_calls: int = DEFAULT_CONCURRENT_CALLS

    def __post_init__(self) -> None:
        for name, value in {**self.requests, "concurrent_calls": self.concurrent_calls}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        object.__setattr__(self, "requests", dict(self.requests))

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


def largest_request(servicers: Iterable[object]) -> int:
    """The server receive limit that serves ``servicers``: the largest of their RPCs' limits
    (at least :data:`SMALL_REQUEST_BYTES`), bytes."""
    return max([SMALL_REQUEST_BYTES, *(limits_of(s).largest for s in servicers)])


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
        per_caller: int | None,
    ) -> None:
        self.admission = admission
        self.service = service
        self.rpc = rpc
        self.authorize = authorize
        self.limit = limit
        self.concurrent_calls = concurrent_calls
        self.per_caller = per_caller

    def admit(self, context: grpc.aio.ServicerContext) -> Callable[[], None]:
        """Authorize the call and count it in; return what counts it out.

        Raises
        ------
        UnauthenticatedError, PermissionDeniedError
            As the servicer's authorizer (or, on an open service, without an identity).
        ResourceExhaustedError
            If the service (or this caller, on an open service) has its most calls at once.
        """
        caller = self.authorize(context)
        active = self.admission.active
        if active.get(self.service, 0) >= self.concurrent_calls:
            raise ResourceExhaustedError(
                f"{self.service} is serving its limit of {self.concurrent_calls} calls at once; "
                "retry when one has ended"
            )
        key = (self.service, caller)
        if self.per_caller is not None and active.get(key, 0) >= self.per_caller:
            raise ResourceExhaustedError(
                f"{caller} has its limit of {self.per_caller} calls at once in progress on "
                f"{self.service}; retry when one has ended"
            )
        keys: tuple[Any, ...] = (self.service,) if self.per_caller is None else (self.service, key)
        for k in keys:
            active[k] = active.get(k, 0) + 1

        def release() -> None:
            for k in keys:
                left = active[k] - 1
                if left:
                    active[k] = left
                else:
                    del active[k]

        return release

    def deserializer(self, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        """``parse`` behind the receive limit: a message above it raises
        :class:`RequestTooLargeError` unparsed; one that does not parse, InvalidArgumentError."""
        limit, rpc = self.limit, self.rpc

        def deserialize(raw: bytes) -> Any:
            received = _received.get()
            if received is not None:  # a call served by _forgetting, as every call is
                if received[0] < RELEASE_AFTER_BYTES <= received[0] + len(raw):
                    large_call_began()
                received[0] += len(raw)
            if len(raw) > limit:
                raise RequestTooLargeError(
                    f"a {rpc} request of {len(raw)} bytes exceeds this method's limit of "
                    f"{limit} bytes, set by the service's policy (docs/reference.md, "
                    '"Message limits"): send a smaller request'
                )
            if parse is None:
                return raw
            try:
                return parse(raw)
            except DecodeError:
                raise InvalidArgumentError(f"the {rpc} request does not parse") from None

        return deserialize

    def handler(self, inner: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``inner`` served as a client stream whose requests are read once admitted."""
        deserialize = self.deserializer(inner.request_deserializer)
        serialize = inner.response_serializer
        behaviour = _behaviour(inner)
        if not inner.request_streaming and not inner.response_streaming:
            return grpc.stream_unary_rpc_method_handler(
                _forgetting(self._unary_unary(behaviour)), deserialize, serialize
            )
        if not inner.request_streaming:
            return grpc.stream_stream_rpc_method_handler(
                _forgetting(self._unary_stream(behaviour)), deserialize, serialize
            )
        if not inner.response_streaming:
            return grpc.stream_unary_rpc_method_handler(
                _forgetting(self._stream_unary(behaviour)), deserialize, serialize
            )
        return grpc.stream_stream_rpc_method_handler(
            _forgetting(self._stream_stream(behaviour)), deserialize, serialize
        )

    async def _refuse(self, exc: Exception, context: grpc.aio.ServicerContext) -> None:
        """Abort with the status of an admission or reading error (always raises)."""
        await abort_for(exc, context, self.rpc)

    async def _read_one(self, context: grpc.aio.ServicerContext) -> Any:
        # A unary request arrives with its call: a read slot is held for a moment (longer only
        # by a client that sends its request slowly, until its deadline).
        async with self.admission.reads:
            request = await context.read()
        if request is _EOF:
            raise InvalidArgumentError(f"the {self.rpc} call ended without a request")
        return request

    def _unary_unary(self, inner: Behaviour) -> Behaviour:
        async def behaviour(_: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            try:
                try:
                    request = await self._read_one(context)
                except _UNREADABLE as exc:
                    return await self._refuse(exc, context)
                return await inner(request, context)
            finally:
                release()

        return behaviour

    def _unary_stream(self, inner: Behaviour) -> Behaviour:
        async def behaviour(_: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            try:
                release = self.admit(context)
            except _REFUSALS as exc:
                return await self._refuse(exc, context)
            try:
                await _respond(inner, await self._read_one(context), context)
            except _UNREADABLE as exc:
                await self._refuse(exc, context)
            finally:
                release()

        return behaviour

    def _stream_unary(self, inner: Behaviour) -> Behaviour:
        async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                release = self.admit(context)
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
                release = self.admit(context)
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
_UNREADABLE = (RequestTooLargeError, InvalidArgumentError)


class Admission(grpc.aio.ServerInterceptor):
    """Server interceptor that admits every call before its request is read (module docstring).

    Parameters
    ----------
    max_request_bytes : int
        The server's receive limit (:func:`largest_request` of its servicers): an RPC whose own
        limit is larger is held to it, and a warning says so once.
    insecure : bool
        Plaintext transport (``--insecure``): no caller has an identity; the health and
        reflection services then admit every caller (the servicers' authorizers name the one
        identity every caller is taken to have).
    """

    def __init__(self, max_request_bytes: int, *, insecure: bool = False) -> None:
        self.max_request_bytes = max_request_bytes
        self.insecure = insecure
        #: Calls in progress per service name, and per (service, caller) on open services.
        self.active: dict[Any, int] = {}
        #: Unary requests being read at once (:data:`READS_AT_ONCE`), whichever the service.
        self.reads = asyncio.Semaphore(READS_AT_ONCE)
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
                min(SMALL_REQUEST_BYTES, self.max_request_bytes),
                OPEN_CONCURRENT_CALLS,
                OPEN_CALLS_PER_CALLER,
            )
        limits = limits_of(servicer)
        limit = limits.request_bytes(rpc)
        if limit > self.max_request_bytes:
            logger.warning(
                "%s: its limit of %d bytes is above the server's %d: held to the server's",
                method,
                limit,
                self.max_request_bytes,
            )
            limit = self.max_request_bytes

        def authorize(context: grpc.aio.ServicerContext) -> str:
            return str(authorizer.authorize(context, roles))

        return _Gate(self, service, rpc, authorize, limit, limits.concurrent_calls, None)

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
