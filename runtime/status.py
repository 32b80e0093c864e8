"""Mapping between :mod:`dpmarket.common.errors` and gRPC status codes, both directions.

Servicers wrap every handler with :func:`dpmarket.runtime.authz.rpc`, which aborts with
:func:`abort_for`; clients turn a failed call back into the same exception with
:func:`error_from_rpc`. No stack trace ever goes on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc

from dpmarket.common import errors
from dpmarket.common.texts import PEER_TEXT_CHARS, peer_text

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


#: Trailing metadata that marks a refusal by a party's privacy budget
#: (:class:`errors.BudgetRefusedError`), so the caller recognises it without reading the text.
REFUSAL_KEY = "dpmarket-refusal"
BUDGET_REFUSAL = "budget"


def _budget_refusal(exc: grpc.RpcError) -> bool:
    """Whether a failed call's trailing metadata marks a budget refusal."""
    try:
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:  # a status without metadata has no mark
        return False
    # (key, value) pairs: grpc.aio's Metadata, or the sync API's tuple of metadata pairs.
    pairs: Iterable[Any] = trailing or ()
    return any(tuple(item) == (REFUSAL_KEY, BUDGET_REFUSAL) for item in pairs)


def error_from_rpc(
    exc: grpc.RpcError, peer: str, *, limit: int = PEER_TEXT_CHARS
) -> errors.DPMarketError:
    """Turn a failed call into the matching :mod:`dpmarket.common.errors` exception.

    Codes with no protocol meaning (INTERNAL, UNKNOWN, ...) become :class:`errors.AbortedError`;
    a ``FAILED_PRECONDITION`` marked as a budget refusal (:func:`abort_for`) becomes
    :class:`errors.BudgetRefusedError`. The message is ``"{peer}: {details} (CODE)"``; the
    exception's ``remote`` keeps the code and the details alone. The details are the other
    party's text: they are kept as :func:`peer_text` writes them (at most ``limit``
    characters, control characters escaped), so the error can be logged as one line.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    # grpc types details() as optional: a status without details has none to relay.
    raw = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    details = peer_text(raw, limit)
    cls = _EXCEPTIONS.get(code, errors.AbortedError)
    if code == grpc.StatusCode.FAILED_PRECONDITION and _budget_refusal(exc):
        cls = errors.BudgetRefusedError
    # A status relayed by a service (a curator passing on an owner's refusal) already ends with
    # its code: name it once.
    suffix = f" ({code.name})"
    error = cls(f"{peer}: {details}" + ("" if details.endswith(suffix) else suffix))
    error.remote = errors.RemoteStatus(code.name, details.removesuffix(suffix))
    return error


#: The details of every INTERNAL status: the same whatever failed, so that neither a stack trace nor
#: an owner's private data (:class:`dpmarket.common.errors.PrivateDataError`) reaches the wire.
INTERNAL_MESSAGE = "internal error; see the server log"


async def abort_for(exc: BaseException, context: grpc.aio.ServicerContext, where: str) -> None:
    """Abort the call with the status of ``exc`` (always raises).

    Protocol errors abort with their code and message; an ``AbortError`` (the call was already
    aborted) propagates; a :class:`~dpmarket.common.errors.PrivateDataError` is logged here (its
    message may name an owner's rows) and, like any other exception (logged with its traceback),
    aborts with INTERNAL and :data:`INTERNAL_MESSAGE`, so no stack trace and no private value
    reaches the wire.
    """
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    code = None if isinstance(exc, errors.PrivateDataError) else status_for(exc)
    if code is None:
        if isinstance(exc, errors.PrivateDataError):
            logger.error("%s failed on this owner's data (not sent): %s", where, exc)
        else:
            logger.error("internal error in %s", where, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    elif isinstance(exc, errors.BudgetRefusedError):
        await context.abort(code, str(exc), trailing_metadata=((REFUSAL_KEY, BUDGET_REFUSAL),))
    else:
        await context.abort(code, str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover
