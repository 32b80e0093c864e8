"""Mapping between :mod:`common.errors` and gRPC status codes, both directions.

Servicers wrap every handler with :func:`runtime.authz.rpc`, which aborts with
:func:`abort_for`; clients turn a failed call back into the same exception with
:func:`error_from_rpc`. No stack trace ever goes on the wire.
"""

from __future__ import annotations

import logging

import grpc

from common import errors

logger = logging.getLogger(__name__)

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.AbortedError, grpc.StatusCode.ABORTED),
    (errors.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
)

_EXCEPTIONS: dict[grpc.StatusCode, type[errors.DPMarketError]] = {
    grpc.StatusCode.NOT_FOUND: errors.NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPreconditionError,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: errors.UnauthenticatedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: errors.UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.UnavailableError,
    grpc.StatusCode.ABORTED: errors.AbortedError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgumentError,
}


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    """Return the status code for a protocol error, or None for an unexpected exception."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return None


def error_from_rpc(exc: grpc.RpcError, peer: str) -> errors.DPMarketError:
    """Turn a failed call into the matching :mod:`common.errors` exception.

    Codes with no protocol meaning (INTERNAL, UNKNOWN, ...) become :class:`errors.AbortedError`.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    # grpc types details() as optional: a status without details has none to relay.
    details = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    cls = _EXCEPTIONS.get(code, errors.AbortedError)
    # A status relayed by a service (a curator passing on an owner's refusal) already ends with
    # its code: name it once.
    suffix = f" ({code.name})"
    return cls(f"{peer}: {details}" + ("" if details.endswith(suffix) else suffix))


async def abort_for(exc: BaseException, context: grpc.aio.ServicerContext, where: str) -> None:
    """Abort the call with the status of ``exc`` (always raises).

    Protocol errors abort with their code and message; an ``AbortError`` (the call was already
    aborted) propagates; any other exception is logged here with its traceback and aborts with
    INTERNAL and a generic message, so no stack trace reaches the wire.
    """
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    code = status_for(exc)
    if code is None:
        logger.error("internal error in %s", where, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")
    else:
        await context.abort(code, str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover
