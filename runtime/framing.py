"""Requests larger than one gRPC message: sent as consecutive pieces, each method its own total.

A gRPC server reads a message whole, up to its receive limit, before anything can compare the
message with its method's own limit, and grpcio (1.85) has no per-method receive limit on a
server. So that a server's receive limit can be small whatever its largest method needs, every
server the project starts receives messages of at most :data:`FRAME_BYTES` (1 MiB;
:func:`dpmarket.runtime.serving.start_server`), and a unary RPC's request is sent one of two ways:

* one message of the method's request type, as any gRPC client (``grpcurl``) sends it: a
  request of at most :data:`FRAME_BYTES` serialized bytes;
* its serialized bytes in consecutive pieces, each of :data:`FRAME_BYTES` but the last, on the
  same method as a client stream (the wire does not tell a unary request from a client
  stream's: :mod:`dpmarket.runtime.admission` serves every RPC as one), its size declared in the
  call's metadata (:data:`SIZE_METADATA`): a larger request. Its ``.proto`` is unchanged: the
  pieces are the bytes of the same message.

The server (:class:`dpmarket.runtime.admission.Admission`) admits the caller first, as every
call. An undeclared request is the first message. For a declared one, it refuses a size above
the method's own limit (``RESOURCE_EXHAUSTED``) before reading a byte, or sends the response's
headers accepting the size, which the client awaits before it sends the first piece (one round
trip more for a request above :data:`FRAME_BYTES`: a client that wrote while the server refused
would see grpc.aio's ``INTERNAL`` instead of the server's status); it counts the bytes as it
reads the pieces, refuses as soon as their total exceeds the size declared (``INVALID_ARGUMENT``)
or their count what the method's limit needs (:func:`most_pieces`), before it reads the next
one, and parses the joined bytes once they reach the declared size. The message it parses is the
one the client serialized, byte for byte, so an in-process run and a networked one see the same
request. A client stream's messages (``RunRounds``) are each one message, held to
:data:`FRAME_BYTES` and to its method's limit.

Every channel :mod:`dpmarket.runtime.transport` opens sends this way (:class:`PiecesAioChannel`,
:class:`PiecesChannel`): a stub built on it calls unchanged.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

__all__ = [
    "FRAME_BYTES",
    "SIZE_METADATA",
    "PiecesAioChannel",
    "PiecesChannel",
    "most_pieces",
    "pieces",
    "serialized",
]

#: The largest gRPC message a server receives, and the size of each piece of a larger request
#: but its last (1 MiB): what a server buffers of one message before its method's limit can be
#: compared. Every RPC's response is sent as one message (a client receives up to
#: :data:`dpmarket.runtime.serving.MAX_MESSAGE_BYTES`).
FRAME_BYTES = 1 << 20
#: Call metadata key under which a client sending a request in pieces declares its size, bytes
#: (decimal digits), and the server's response headers accept it (the same value).
SIZE_METADATA = "dpmarket-request-bytes"


def most_pieces(limit: int) -> int:
    """The most pieces a request of at most ``limit`` bytes is sent in (at least 1)."""
    return max(1, math.ceil(limit / FRAME_BYTES))


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in consecutive pieces of :data:`FRAME_BYTES` bytes (the last one shorter).

    Each piece is copied out as it is sent, so the sender holds ``data`` and one piece.
    """
    view = memoryview(data)
    for start in range(0, len(data), FRAME_BYTES):
        yield bytes(view[start : start + FRAME_BYTES])


def serialized(request: Any, serializer: Callable[[Any], bytes] | None) -> bytes | None:
    """``request``'s bytes if it is above :data:`FRAME_BYTES` (to be sent in pieces), else None.

    ``request`` is a protobuf message (its ``ByteSize`` decides, without serializing a small
    one) or, with no ``serializer``, bytes already serialized.
    """
    if serializer is None:
        return bytes(request) if len(request) > FRAME_BYTES else None
    size = getattr(request, "ByteSize", None)
    if size is not None and size() <= FRAME_BYTES:
        return None
    data = serializer(request)
    return data if len(data) > FRAME_BYTES else None


# --------------------------------------------------------------------------------- grpc.aio
class _AioUnaryUnary:
    """A ``grpc.aio`` unary-unary method that sends a request above :data:`FRAME_BYTES` in
    pieces: the same call object (awaitable; its code, details and metadata) either way."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
        registered: bool | None,
    ) -> None:
        self._serializer = serializer
        registration: dict[str, Any] = {"_registered_method": registered}  # as the stubs pass
        self._unary = channel.unary_unary(method, serializer, deserializer, **registration)
        self._upload = channel.stream_unary(method, None, deserializer)

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        data = serialized(request, self._serializer)
        if data is None:
            return self._unary(request, **kwargs)
        kwargs["metadata"] = _declaring(kwargs.get("metadata"), data)
        calls: list[Any] = []

        async def send() -> AsyncIterator[bytes]:
            # The server's headers accept the call and its size; a refused call ends without
            # them, and nothing is written to it, nor its end, until its status is in (a write
            # that crosses the status makes grpc.aio report INTERNAL: module docstring).
            call = calls[0]
            headers = await call.initial_metadata()
            if _accepted(headers) != str(len(data)):
                await call.code()
                return
            for piece in pieces(data):
                yield piece

        calls.append(self._upload(send(), **kwargs))
        return calls[0]


def _accepted(headers: Any) -> str | None:
    """The size a server's response headers accept (:data:`SIZE_METADATA`), or None."""
    for key, value in headers or ():
        if key == SIZE_METADATA:
            return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return None


def _declaring(metadata: Any, data: bytes) -> tuple[tuple[str, str], ...]:
    """``metadata`` (a call's, or None) with :data:`SIZE_METADATA` declaring ``data``'s size."""
    return (*(tuple(metadata) if metadata else ()), (SIZE_METADATA, str(len(data))))


class PiecesAioChannel(grpc.aio.Channel):
    """A ``grpc.aio`` channel whose unary-unary methods send large requests in pieces (module
    docstring); everything else is the wrapped channel's.

    Parameters
    ----------
    channel : grpc.aio.Channel
        The channel that carries the calls (with its interceptors).
    """

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def __aenter__(self) -> PiecesAioChannel:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        """Close the wrapped channel (as :meth:`grpc.aio.Channel.close`)."""
        await self.channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """The wrapped channel's state (as :meth:`grpc.aio.Channel.get_state`)."""
        return self.channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        """As :meth:`grpc.aio.Channel.wait_for_state_change` of the wrapped channel."""
        await self.channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        """As :meth:`grpc.aio.Channel.channel_ready` of the wrapped channel."""
        await self.channel.channel_ready()

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-unary method whose requests above :data:`FRAME_BYTES` go in pieces."""
        return _AioUnaryUnary(
            self.channel, method, request_serializer, response_deserializer, _registered_method
        )

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's (a server stream's request is one message)."""
        return self.channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's."""
        return self.channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's (each message of a stream is one message)."""
        return self.channel.stream_stream(*args, **kwargs)


# ------------------------------------------------------------------------------ blocking grpc
class _UnaryUnary(grpc.UnaryUnaryMultiCallable):
    """A blocking unary-unary method that sends a request above :data:`FRAME_BYTES` in pieces
    (``__call__``, ``with_call`` and ``future`` alike)."""

    def __init__(
        self,
        channel: grpc.Channel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
        registered: bool | None,
    ) -> None:
        self._serializer = serializer
        registration: dict[str, Any] = {"_registered_method": registered}  # as the stubs pass
        self._unary = channel.unary_unary(method, serializer, deserializer, **registration)
        self._upload = channel.stream_unary(method, None, deserializer)

    def _call(
        self,
        how: str,
        request: Any,
        timeout: float | None,
        metadata: Any,
        credentials: grpc.CallCredentials | None,
        wait_for_ready: bool | None,
        compression: grpc.Compression | None,
    ) -> Any:
        # A blocking call reports the server's status whenever it ends, also while its pieces
        # are being sent: no need to wait for its headers.
        options: dict[str, Any] = {
            "timeout": timeout,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        data = serialized(request, self._serializer)
        if data is None:
            return getattr(self._unary, how)(request, metadata=metadata, **options)
        declared = _declaring(metadata, data)
        return getattr(self._upload, how)(pieces(data), metadata=declared, **options)

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        return self._call(
            "__call__", request, timeout, metadata, credentials, wait_for_ready, compression
        )

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        """As :meth:`grpc.UnaryUnaryMultiCallable.with_call`."""
        return self._call(
            "with_call", request, timeout, metadata, credentials, wait_for_ready, compression
        )

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        """As :meth:`grpc.UnaryUnaryMultiCallable.future`."""
        return self._call(
            "future", request, timeout, metadata, credentials, wait_for_ready, compression
        )


class PiecesChannel(grpc.Channel):
    """A blocking channel whose unary-unary methods send large requests in pieces (module
    docstring); everything else is the wrapped channel's.

    Parameters
    ----------
    channel : grpc.Channel
        The channel that carries the calls (with its interceptors).
    """

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel

    def __enter__(self) -> PiecesChannel:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.channel.close()

    def close(self) -> None:
        """Close the wrapped channel."""
        self.channel.close()

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        """As :meth:`grpc.Channel.subscribe` of the wrapped channel."""
        self.channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        """As :meth:`grpc.Channel.unsubscribe` of the wrapped channel."""
        self.channel.unsubscribe(callback)

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-unary method whose requests above :data:`FRAME_BYTES` go in pieces."""
        return _UnaryUnary(
            self.channel, method, request_serializer, response_deserializer, _registered_method
        )

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's (a server stream's request is one message)."""
        return self.channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's."""
        return self.channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped channel's (each message of a stream is one message)."""
        return self.channel.stream_stream(*args, **kwargs)
