"""Protocol errors, one class per outcome a caller must handle differently.

The services map each class to a gRPC status code (``dpmarket.runtime.status``); the in-process runs
raise them as they are. ``ValueError`` from input validation counts as
:class:`InvalidArgumentError`.

An owner's refusals must depend only on public inputs (the request and the owner's public
declarations: its row count, its columns, its declared 0/1 columns, its policy and budget), never
on its rows. Computations on the rows run under :func:`on_private_data`, which turns whatever they
raise into a :class:`PrivateDataError`: its text stays in the owner's own log and the wire carries
a fixed message (``dpmarket.runtime.status.abort_for``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteStatus:
    """How another service answered a call that failed (set by the client that made it).

    Attributes
    ----------
    code : str
        The gRPC status code's name, e.g. ``"FAILED_PRECONDITION"``.
    details : str
        The service's own text, without the name of the peer it came from.
    """

    code: str
    details: str


class DPMarketError(Exception):
    """Base class of the errors a protocol step raises on purpose.

    Attributes
    ----------
    remote : RemoteStatus or None
        For an error another service answered (``dpmarket.runtime.status.error_from_rpc``): its
        status code and its own text, so that a party relaying it can decide what of it to pass on;
        ``None`` for an error raised here.
    """

    remote: RemoteStatus | None = None


class InvalidArgumentError(DPMarketError, ValueError):
    """Bad input: shape, NaN/inf, out-of-range value, unknown parameter (``INVALID_ARGUMENT``)."""


class NotFoundError(DPMarketError):
    """Unknown session or resource (``NOT_FOUND``)."""


class AlreadyExistsError(DPMarketError):
    """A session id that is already in use (``ALREADY_EXISTS``)."""


class FailedPreconditionError(DPMarketError):
    """A protocol stage called out of order, or a budget exhausted (``FAILED_PRECONDITION``)."""


class BudgetRefusedError(FailedPreconditionError):
    """A party's privacy budget refuses a step (``FAILED_PRECONDITION``).

    Its message may say what is spent and what is left: figures meant for the party's configured
    peer only (an owner's curator). Whoever relays the refusal to anyone else states it in a fixed
    text instead (the curator to a consumer: :mod:`dpmarket.curator.disclosure`). The services mark
    it on the wire (:mod:`dpmarket.runtime.status`), so the peer recognises it without reading the
    text.
    """


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


class PrivateDataError(DPMarketError):
    """A computation on an owner's private data failed; the message may name rows and values.

    It is for the owner's own log only: a service answers ``INTERNAL`` with the fixed message of any
    unexpected error (``dpmarket.runtime.status.abort_for``), so neither the text nor the code tells
    a data-dependent failure from any other. The owner's checks make such a failure a bug, never an
    answer to a request: records are clamped to the request's public bounds, and every other refusal
    is decided on public inputs before the rows are read.
    """


@contextmanager
def on_private_data(what: str) -> Iterator[None]:
    """Run a computation on an owner's private data; re-raise any exception as
    :class:`PrivateDataError` (``"<what>: <original message>"``, chained to the original).

    Parameters
    ----------
    what : str
        What is being computed, for the owner's log (e.g. ``"CAPE release"``).

    Raises
    ------
    PrivateDataError
        Whatever the block raised (``Exception`` subclasses; ``BaseException`` such as
        ``KeyboardInterrupt`` passes through unchanged).
    """
    try:
        yield
    except PrivateDataError:
        raise
    except Exception as exc:
        raise PrivateDataError(f"{what}: {exc}") from exc
