"""Protocol errors, one class per outcome a caller must handle differently.

The services map each class to a gRPC status code (``runtime.status``); the in-process runs raise
them as they are. ``ValueError`` from input validation counts as :class:`InvalidArgumentError`.
"""

from __future__ import annotations


class DPMarketError(Exception):
    """Base class of the errors a protocol step raises on purpose."""


class InvalidArgumentError(DPMarketError, ValueError):
    """Bad input: shape, NaN/inf, out-of-range value, unknown parameter (``INVALID_ARGUMENT``)."""


class NotFoundError(DPMarketError):
    """Unknown session or resource (``NOT_FOUND``)."""


class AlreadyExistsError(DPMarketError):
    """A session id that is already in use (``ALREADY_EXISTS``)."""


class FailedPreconditionError(DPMarketError):
    """A protocol stage called out of order, or a budget exhausted (``FAILED_PRECONDITION``)."""


class PermissionDeniedError(DPMarketError):
    """A request this party is not allowed to make (``PERMISSION_DENIED``)."""


class UnauthenticatedError(DPMarketError):
    """A caller without a verified identity (``UNAUTHENTICATED``)."""


class ResourceExhaustedError(DPMarketError):
    """A limit on concurrent sessions or on a caller's request rate is reached
    (``RESOURCE_EXHAUSTED``); retrying later may succeed."""


class UnavailableError(DPMarketError):
    """A peer is gone or did not answer in time (``UNAVAILABLE``)."""


class AbortedError(DPMarketError):
    """A session that failed; the message says why (``ABORTED``)."""
