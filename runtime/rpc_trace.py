"""Count what the network costs: an opt-in record of every client RPC (a measurement facility).

When the environment variable :data:`TRACE_ENV` names a file, every channel that
:mod:`dpmarket.runtime.transport` opens (``aio_channel``, ``sync_channel`` and so every channel of
the curator, the owners and the consumer client) carries gRPC client interceptors (the library's
``grpc.aio.UnaryUnaryClientInterceptor`` / ``grpc.aio.StreamStreamClientInterceptor`` and
``grpc.UnaryUnaryClientInterceptor`` / ``grpc.UnaryStreamClientInterceptor``; the
``StreamUnary`` ones for a unary request sent in pieces, :mod:`dpmarket.runtime.framing`) that
append one JSON line per call (per exchange of a bidirectional stream) to that file. Unset (the
default, and what production runs), no interceptor is installed and nothing changes. The
variable is read when a channel is created, so a process started with it (a
:class:`dpmarket.deploy.launcher.LocalCluster` inherits the launcher's environment) records every
call.

A record holds only names, sizes and times, never a value of a message:

``caller``, ``peer``
    The calling party's and the server's identity (``role:name``, from the certificates; the
    address for a plaintext server, ``"?"`` for a plaintext caller).
``method``
    The full gRPC method name, e.g. ``/dpmarket.v1.OwnerService/Bid``.
``start``, ``end``
    ``time.monotonic()`` in seconds when the call was made and when its (last) response
    arrived or it failed. CLOCK_MONOTONIC is system-wide on Linux, so records of processes on
    one host compare.
``request_bytes``, ``response_bytes``
    Serialized sizes of the protobuf messages (``ByteSize()``), bytes, summed over the messages
    of a stream; HTTP/2, TLS and gRPC framing are not counted.
``responses``
    Messages received (1 for a unary call; the count of a server stream).
``code``
    The gRPC status code name (``OK`` when the call succeeded).
``step``
    Empty for a call. A bidirectional stream whose requests are answered one for one and in
    order (``OwnerService/RunRounds``) is recorded as one record per exchange, a request and its
    answer, as if each were a unary call (its ``start`` when the request is sent, its ``end`` when
    the answer arrives); ``step`` names the field the request's oneof sets (``bid``,
    ``release_point``). The stream itself has no record.

Critical-path round trips (:func:`waves`): the calls of one request (one party to its peers)
are merged by their ``[start, end]`` intervals; every maximal group of overlapping intervals is
one *wave*. Owners contacted concurrently in one stage overlap and make one wave; stages that
wait for the previous one's answers do not overlap and make one wave each. The number of waves
is the number of network round trips on the critical path of the request (each wave costs at
least one round-trip time on a WAN), whatever the number of calls in it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import grpc

#: Environment variable naming the JSON-lines file that records every client call; unset: off.
TRACE_ENV = "DPMARKET_RPC_TRACE"


@dataclass(frozen=True)
class CallRecord:
    """One client RPC as recorded (see the module docstring for the fields and their units)."""

    caller: str
    peer: str
    method: str
    start: float
    end: float
    request_bytes: int
    response_bytes: int
    responses: int
    code: str
    step: str = ""

    @property
    def name(self) -> str:
        """The RPC's name (the method's last component), and for an exchange of a stream its
        step after a dot: ``Bid``, ``RunRounds.bid``."""
        name = self.method.rsplit("/", 1)[-1]
        return f"{name}.{self.step}" if self.step else name


def trace_path() -> Path | None:
    """The file named by :data:`TRACE_ENV`, or None when recording is off."""
    value = os.environ.get(TRACE_ENV, "")
    return Path(value) if value else None


_write_lock = threading.Lock()


def _append(path: Path, record: CallRecord) -> None:
    """Append one record as one line, in one ``write`` to a file opened with ``O_APPEND`` (lines
    of several processes writing the same file do not interleave)."""
    line = (json.dumps(asdict(record), separators=(",", ":")) + "\n").encode("utf-8")
    with _write_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _method_name(details: Any) -> str:
    method = details.method
    return method.decode("utf-8") if isinstance(method, bytes) else str(method)


def _size(message: Any) -> int:
    if isinstance(message, bytes):  # serialized already, or a piece of a request
        return len(message)
    size = getattr(message, "ByteSize", None)
    return int(size()) if size is not None else 0


def _step(message: Any) -> str:
    """The field a message's only oneof sets (``""`` when it has none or sets none)."""
    oneofs: Sequence[Any] = message.DESCRIPTOR.oneofs if hasattr(message, "DESCRIPTOR") else ()
    if len(oneofs) != 1:
        return ""
    return str(message.WhichOneof(oneofs[0].name) or "")


class _Recorder:
    """Builds and writes the records of one channel."""

    def __init__(self, path: Path, caller: str, peer: str) -> None:
        self.path = path
        self.caller = caller
        self.peer = peer

    def write(
        self,
        method: str,
        start: float,
        request_bytes: int,
        response_bytes: int,
        responses: int,
        code: str,
        step: str = "",
    ) -> None:
        _append(
            self.path,
            CallRecord(
                self.caller,
                self.peer,
                method,
                start,
                time.monotonic(),
                request_bytes,
                response_bytes,
                responses,
                code,
                step,
            ),
        )


class _Recording:
    """What every trace interceptor holds: the recorder of its channel's calls.

    Parameters
    ----------
    path : Path
        The JSON-lines file (appended to).
    caller, peer : str
        The identities written into each record.
    """

    def __init__(self, path: Path, caller: str, peer: str) -> None:
        self._recorder = _Recorder(path, caller, peer)


class AioTraceInterceptor(_Recording, grpc.aio.UnaryUnaryClientInterceptor):
    """Records every unary call of a ``grpc.aio`` channel; the call itself is returned as is.
    Parameters as :class:`_Recording`."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        start = time.monotonic()
        method = _method_name(client_call_details)
        call = await continuation(client_call_details, request)
        try:
            response = await call
        except grpc.RpcError as exc:
            self._recorder.write(method, start, _size(request), 0, 0, _status_name(exc))
            return call  # awaiting it raises the same error for the caller
        self._recorder.write(method, start, _size(request), _size(response), 1, "OK")
        return call


class AioUploadTraceInterceptor(_Recording, grpc.aio.StreamUnaryClientInterceptor):
    """Records every unary call of a ``grpc.aio`` channel whose request went in pieces
    (:mod:`dpmarket.runtime.framing`) as one call: its request bytes are the pieces' total.
    The call is returned at once and recorded when it ends (its pieces wait for the server's
    headers, which the call returned must deliver). Parameters as :class:`_Recording`."""

    def __init__(self, path: Path, caller: str, peer: str) -> None:
        super().__init__(path, caller, peer)
        self._recording: set[asyncio.Task[None]] = set()

    async def intercept_stream_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        start = time.monotonic()
        method = _method_name(client_call_details)
        sent = [0]

        async def requests() -> AsyncIterator[Any]:
            async for request in _aiter(request_iterator):
                sent[0] += _size(request)
                yield request

        call = await continuation(client_call_details, requests())

        async def record() -> None:
            try:
                response = await call
            except grpc.RpcError as exc:
                self._recorder.write(method, start, sent[0], 0, 0, _status_name(exc))
            except asyncio.CancelledError:
                self._recorder.write(method, start, sent[0], 0, 0, "CANCELLED")
            else:
                self._recorder.write(method, start, sent[0], _size(response), 1, "OK")

        task = asyncio.ensure_future(record())
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)
        return call


class AioExchangeTraceInterceptor(_Recording, grpc.aio.StreamStreamClientInterceptor):
    """Records every exchange of a bidirectional stream of a ``grpc.aio`` channel, for streams
    whose requests are answered one for one and in order: one record per request and its
    answer (see the module docstring, ``step``). Messages pass through unchanged. Parameters as
    :class:`_Recording`."""

    async def intercept_stream_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        method = _method_name(client_call_details)
        sent: deque[tuple[float, int, str]] = deque()

        async def requests() -> AsyncIterator[Any]:
            async for request in _aiter(request_iterator):
                sent.append((time.monotonic(), _size(request), _step(request)))
                yield request

        call = await continuation(client_call_details, requests())

        def finish(response_bytes: int, code: str) -> None:
            start, request_bytes, step = sent.popleft()
            responses = 1 if code == "OK" else 0
            self._recorder.write(
                method, start, request_bytes, response_bytes, responses, code, step
            )

        async def responses() -> AsyncIterator[Any]:
            try:
                async for response in call:
                    finish(_size(response), "OK")
                    yield response
            except grpc.RpcError as exc:
                if sent:
                    finish(0, _status_name(exc))
                raise
            except asyncio.CancelledError:
                if sent:
                    finish(0, "CANCELLED")
                raise

        return responses()


async def _aiter(requests: Any) -> AsyncIterator[Any]:
    """The messages of a stream's request iterator, asynchronous or not."""
    if hasattr(requests, "__aiter__"):
        async for request in requests:
            yield request
    else:
        for request in requests:
            yield request


class _CountingStream:
    """A server stream's call object that counts the messages it yields; every other attribute
    is the wrapped call's."""

    def __init__(self, call: Any, finish: Callable[[int, int, str], None]) -> None:
        self._call = call
        self._finish = finish
        self._bytes = 0
        self._count = 0
        self._done = False

    def __iter__(self) -> _CountingStream:
        return self

    def __next__(self) -> Any:
        try:
            message = next(self._call)
        except StopIteration:
            self._close("OK")
            raise
        except grpc.RpcError as exc:
            self._close(_status_name(exc))
            raise
        self._bytes += _size(message)
        self._count += 1
        return message

    def cancel(self) -> bool:
        """Cancel the stream (the wrapped call's ``cancel``) and write its record."""
        cancelled = bool(self._call.cancel())
        self._close("CANCELLED")
        return cancelled

    def _close(self, code: str) -> None:
        if not self._done:
            self._done = True
            self._finish(self._bytes, self._count, code)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class SyncTraceInterceptor(
    _Recording,
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
):
    """Records every unary call and server stream of a blocking channel (as
    :class:`AioTraceInterceptor`; a stream's record is written when it ends, fails or is
    cancelled, never for a stream left unread); a unary call whose request went in pieces
    (:mod:`dpmarket.runtime.framing`) is one call of the pieces' total."""

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        start = time.monotonic()
        outcome = continuation(client_call_details, request)
        method = _method_name(client_call_details)
        try:
            response = outcome.result()
        except grpc.RpcError as exc:
            self._recorder.write(method, start, _size(request), 0, 0, _status_name(exc))
            return outcome
        self._recorder.write(method, start, _size(request), _size(response), 1, "OK")
        return outcome

    def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        start = time.monotonic()
        method = _method_name(client_call_details)
        request_bytes = _size(request)

        def finish(response_bytes: int, responses: int, code: str) -> None:
            self._recorder.write(method, start, request_bytes, response_bytes, responses, code)

        return _CountingStream(continuation(client_call_details, request), finish)

    def intercept_stream_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        start = time.monotonic()
        method = _method_name(client_call_details)
        sent = [0]

        def requests() -> Iterator[Any]:
            for request in request_iterator:
                sent[0] += _size(request)
                yield request

        outcome = continuation(client_call_details, requests())
        try:
            response = outcome.result()
        except grpc.RpcError as exc:
            self._recorder.write(method, start, sent[0], 0, 0, _status_name(exc))
            return outcome
        self._recorder.write(method, start, sent[0], _size(response), 1, "OK")
        return outcome


def _status_name(exc: grpc.RpcError) -> str:
    """A failed call's status code name (``UNKNOWN`` when the error carries none)."""
    code = exc.code() if hasattr(exc, "code") else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def aio_interceptors(caller: str, peer: str) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors of a new ``grpc.aio`` channel: an :class:`AioTraceInterceptor`, an
    :class:`AioUploadTraceInterceptor` and an :class:`AioExchangeTraceInterceptor` when
    :data:`TRACE_ENV` is set, none otherwise."""
    path = trace_path()
    if path is None:
        return []
    # The typed stubs leave ClientInterceptor abstract ("cast or ignore").
    return [
        cast(grpc.aio.ClientInterceptor, AioTraceInterceptor(path, caller, peer)),
        cast(grpc.aio.ClientInterceptor, AioUploadTraceInterceptor(path, caller, peer)),
        cast(grpc.aio.ClientInterceptor, AioExchangeTraceInterceptor(path, caller, peer)),
    ]


def sync_interceptor(caller: str, peer: str) -> SyncTraceInterceptor | None:
    """The interceptor of a new blocking channel when :data:`TRACE_ENV` is set, else None."""
    path = trace_path()
    return None if path is None else SyncTraceInterceptor(path, caller, peer)


# ------------------------------------------------------------------------------- reading
def read_records(path: str | os.PathLike[str]) -> list[CallRecord]:
    """The records of a trace file, in the order written (an absent file: none)."""
    file = Path(path)
    if not file.exists():
        return []
    with file.open(encoding="utf-8") as fh:
        return [CallRecord(**json.loads(line)) for line in fh if line.strip()]


def waves(records: Iterable[CallRecord]) -> int:
    """Round trips on the critical path: the number of maximal groups of overlapping
    ``[start, end]`` intervals among ``records`` (see the module docstring).

    Returns
    -------
    int
        0 for no records.
    """
    count, end = 0, float("-inf")
    for record in sorted(records, key=lambda r: r.start):
        if record.start > end:
            count += 1
            end = record.end
        else:
            end = max(end, record.end)
    return count


def select(
    records: Sequence[CallRecord],
    *,
    caller_role: str,
    peer_role: str,
    start: float = float("-inf"),
    end: float = float("inf"),
) -> list[CallRecord]:
    """The records of calls from a party of ``caller_role`` to one of ``peer_role`` made within
    ``[start, end]`` (monotonic seconds)."""
    return [
        r
        for r in records
        if r.caller.split(":", 1)[0] == caller_role
        and r.peer.split(":", 1)[0] == peer_role
        and start <= r.start
        and r.end <= end
    ]


def totals(records: Sequence[CallRecord]) -> dict[str, int]:
    """Calls, waves and bytes of ``records``: ``calls``, ``waves``, ``request_bytes`` (sent by
    the caller) and ``response_bytes`` (received by it), bytes of serialized messages."""
    return {
        "calls": len(records),
        "waves": waves(records),
        "request_bytes": sum(r.request_bytes for r in records),
        "response_bytes": sum(r.response_bytes for r in records),
    }


def iter_methods(records: Iterable[CallRecord]) -> Iterator[tuple[str, int]]:
    """``(name, calls)`` per :attr:`CallRecord.name` (a stream's exchanges by step), in
    first-call order."""
    counts: dict[str, int] = {}
    for r in sorted(records, key=lambda r: r.start):
        counts[r.name] = counts.get(r.name, 0) + 1
    yield from counts.items()
