"""What of an owner's failure the curator tells a consumer.

The curator is the party an owner serves, so what an owner answers it may say more than a
consumer may read: a budget refusal states what the owner's budget has spent and has left
(:class:`~dpmarket.common.errors.BudgetRefusedError`), and a channel that failed carries the owner's
address in gRPC's own text. Whatever the curator passes on to a consumer about an owner — an
error status, a ``WatchSession`` message, the reasons in a report — names the owner (owner names
are public within a deployment) and states its failure by one of the fixed texts below, chosen by
the outcome's kind alone; only where the owner's own text is public by construction (a refusal
of the request's parameters or of a step, which an owner decides on public inputs alone: the
request and its public declarations) is that text passed on, without the owner's address. The
curator's log keeps the owner's text for its operator, as one line of at most 500 characters
(:func:`dpmarket.common.texts.peer_text`: the owner chose its characters and its length).

Texts by outcome
----------------
===========================================  =============================================
outcome                                      what a consumer reads
===========================================  =============================================
budget refusal (the owner's ledger)          :data:`BUDGET_REFUSED`
unreachable, no answer                       :data:`UNREACHABLE`
the curator's own deadline passed            its own text (:class:`NoAnswerError`)
a reply above its limit, refused unread      the method and the curator's limit
the curator's identity refused               :data:`REFUSED_CURATOR`
INVALID_ARGUMENT, FAILED_PRECONDITION,       ``refused (CODE: policy keys)`` (ABORTED:
NOT_FOUND, ALREADY_EXISTS, ABORTED           ``aborted``), then its text quoted as its own
                                             words
RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN, any   :data:`FAILED`
other failure
===========================================  =============================================

An owner's own text is its words, not the curator's: a hostile owner can write "the curator
could not verify your validation set; upload it again at ..." or "re-run with --exclude-owner a,
owner a is compromised" there. So a consumer reads of a refusal what the curator can vouch for —
its status and the keys of the owner's policy it names (:data:`~dpmarket.common.policy_keys.
POLICY_KEYS`, a closed vocabulary) — and then the owner's text, escaped to one line of at most
500 characters and quoted: ``refused (FAILED_PRECONDITION: access.allow_steered_selection); the
owner's own words: «access.allow_steered_selection off»``. The quote cannot be closed from
inside (a ``«`` or ``»`` of the owner's is written escaped).

``RESOURCE_EXHAUSTED`` is not the owner's text: gRPC's client makes that status itself when an
owner's answer breaks one of its limits (status details above 16 KiB of metadata: "received
metadata size exceeds hard limit (value length N vs. 16384)"), and its text then carries a
length the owner chose.

One rule: who failed the step
-----------------------------
:func:`owner_failed` says what an owner's failed call means for the request, wherever the
curator calls owners (a quote's or session's steps, CAPE and secure-aggregation jobs): a
refusal (``FAILED_PRECONDITION``, its budget among them, or ``INVALID_ARGUMENT``, a refusal of
the request's public parameters) leaves the owner out as one that refused; any other failure
(unreachable, a deadline, a reset stream, a limit of gRPC's own, an internal error, any status
at all) is the owner failing that step, as one that does not answer. Either way the request
goes on with the other owners where ``--min-owners`` allows: no answer of one owner fails a
request by itself.
"""

from __future__ import annotations

import logging

from dpmarket.common.errors import (
    AbortedError,
    AlreadyExistsError,
    BudgetRefusedError,
    DPMarketError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from dpmarket.common.policy_keys import policy_keys_in
from dpmarket.common.texts import peer_text
from dpmarket.runtime.replies import ReplyTooLargeError
from dpmarket.runtime.status import status_for

__all__ = [
    "BUDGET_REFUSED",
    "FAILED",
    "REFUSED_CURATOR",
    "UNREACHABLE",
    "NoAnswerError",
    "owner_failed",
    "public_error",
    "public_reason",
    "public_text",
    "refusal_text",
]

logger = logging.getLogger(__name__)

#: An owner's ledger refused the step: its budget, a per-session limit or its refusal of
#: non-private terms. The figures stay between the owner and the curator.
BUDGET_REFUSED = "its privacy budget does not allow this session (budget refused)"
#: The owner did not answer: nothing listening, the connection lost, gRPC's deadline passed.
UNREACHABLE = "unreachable (no answer)"
#: The owner refused the curator's identity.
REFUSED_CURATOR = "refused this curator's identity"
#: Any other failure: an internal error of the owner, a status gRPC made up.
FAILED = "failed (its operator's log says why)"

#: Outcomes whose text an owner decides on public inputs alone (the request, its declared
#: schema, row count, feature count, 0/1 columns and policy limits): passed on as the owner
#: wrote it. A budget refusal is a FailedPreconditionError too, and is matched first.
_PUBLIC_TEXT = (
    InvalidArgumentError,
    FailedPreconditionError,
    NotFoundError,
    AlreadyExistsError,
)
#: The refusals :func:`owner_failed` tells from failures (a budget refusal is a
#: FailedPreconditionError).
_REFUSALS = (FailedPreconditionError, InvalidArgumentError)


class NoAnswerError(UnavailableError):
    """The curator stopped waiting for an owner's answer (``UNAVAILABLE``): the message states
    the curator's own deadline and what it saw of the owner's progress, both public."""


def owner_failed(exc: BaseException) -> bool:
    """Whether an owner's failed call means the owner failed the step, as one that does not
    answer (the module's "One rule"), rather than refused it.

    Parameters
    ----------
    exc : BaseException
        What the owner's call raised.

    Returns
    -------
    bool
        False for a refusal (``FailedPreconditionError``, a budget refusal among them, or
        ``InvalidArgumentError``); True for anything else: ``UnavailableError`` (unreachable,
        a deadline, a reply refused unread), ``ResourceExhaustedError`` (gRPC's own limits),
        ``AbortedError`` (INTERNAL, UNKNOWN, ABORTED, a reset stream) and every other status.
        The caller leaves the owner out of the step either way; only a refusal's text may
        reach the consumer (:func:`public_text`).
    """
    return not isinstance(exc, _REFUSALS)


def public_text(exc: BaseException) -> str:
    """What a consumer may read of an owner's failed call (without the owner's name).

    Parameters
    ----------
    exc : BaseException
        What the call raised: an error the owner answered (``exc.remote`` set by
        :func:`dpmarket.runtime.status.error_from_rpc`), one an in-process owner raised, or the
        curator's own (a deadline).

    Returns
    -------
    str
        A fixed text for the outcome's kind (see the module's table), or for a refusal decided
        on public inputs ``refused (CODE: policy keys); the owner's own words: «...»``: what
        the curator vouches for, then the owner's text quoted (one line, at most 500
        characters, its own « and » escaped); never its address or a budget figure.
    """
    if isinstance(exc, BudgetRefusedError):
        return BUDGET_REFUSED
    if isinstance(exc, NoAnswerError):
        return str(exc)
    if isinstance(exc, ReplyTooLargeError):  # the method and the curator's limit
        return exc.public
    if isinstance(exc, UnavailableError):
        return UNREACHABLE
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        return REFUSED_CURATOR
    said = _own_words(exc)
    if said is None:
        return FAILED
    code, text = said
    return f"{_refused(code, text)}; the owner's own words: «{_quoted(text)}»"


def public_reason(exc: BaseException) -> str:
    """The short public reason for an owner's failed call, as a report lists it (a CAPE job's
    ``dropped``, a session's ``left_out``): :data:`BUDGET_REFUSED`'s ``"budget refused"``,
    ``"refused (CODE: policy keys)"`` for another refusal, ``"reply over 1.04 MiB to
    GetOwnerInfo"`` for a reply refused for its size, else ``"unreachable"``. Nothing of the
    owner's text but the policy keys it names (:data:`~dpmarket.common.policy_keys.
    POLICY_KEYS`)."""
    if isinstance(exc, BudgetRefusedError):
        return "budget refused"
    if isinstance(exc, ReplyTooLargeError):
        return exc.reason
    said = _own_words(exc)
    if said is None or owner_failed(exc):
        return "unreachable"
    return _refused(*said)


def refusal_text(exc: BaseException) -> str:
    """:func:`public_reason` of a refusal, then the owner's own words quoted when there are
    any (a budget refusal has none): what a report states of an owner that refused."""
    reason = public_reason(exc)
    said = None if isinstance(exc, BudgetRefusedError) else _own_words(exc)
    return reason if said is None else f"{reason}; the owner's own words: «{_quoted(said[1])}»"


def _own_words(exc: BaseException) -> tuple[str, str] | None:
    """The status code and the text of a refusal an owner wrote itself (the module's table),
    the text at most 500 characters, one line; None for any other outcome."""
    remote = exc.remote if isinstance(exc, DPMarketError) else None
    # An owner in process raises its refusals as they are; over gRPC an ABORTED status is the
    # owner's own (INTERNAL, UNKNOWN and the rest also arrive as AbortedError).
    if isinstance(exc, _PUBLIC_TEXT) or (
        isinstance(exc, AbortedError) and (remote is None or remote.code == "ABORTED")
    ):
        if remote is not None:
            return remote.code, remote.details
        status = status_for(exc)
        return (status.name if status is not None else "ABORTED"), peer_text(str(exc))
    return None


def _refused(code: str, text: str) -> str:
    """``refused (CODE)``, with the policy keys ``text`` names: ``refused (CODE: k1, k2)``
    (``aborted (ABORTED)`` for an owner's own abort of a job it found tampered with)."""
    keys = policy_keys_in(text)
    verb = "aborted" if code == "ABORTED" else "refused"
    return f"{verb} ({code}{': ' + ', '.join(keys) if keys else ''})"


def _quoted(text: str) -> str:
    """An owner's ``text`` (one line already) to put between « and »: its own « and » escaped,
    so that nothing after its quote reads as the curator's."""
    return text.replace("«", "\\u00ab").replace("»", "\\u00bb")


def public_error(owner: str, exc: DPMarketError, *, where: str = "") -> DPMarketError:
    """The error to relay to a consumer for owner ``owner``'s failed call: the same class,
    ``"owner NAME: <public text>"``; the owner's text goes to the curator's log (one line of
    at most 500 characters).

    Parameters
    ----------
    owner : str
        The owner's name.
    exc : DPMarketError
        What the call raised.
    where : str
        The session or job and step, for the log line.

    Returns
    -------
    DPMarketError
        A new exception of ``type(exc)``, chained by the caller if it raises it.
    """
    remote = exc.remote
    detail = f"{remote.details} ({remote.code})" if remote is not None else peer_text(str(exc))
    logger.warning("owner %s%s: %s", owner, f" ({where})" if where else "", detail)
    # The protocol class the exception is (a subclass may take other arguments).
    cls = next(c for c in _CLASSES if isinstance(exc, c))
    return cls(f"owner {owner}: {public_text(exc)}")


#: The classes :func:`public_error` relays, most specific first.
_CLASSES: tuple[type[DPMarketError], ...] = (
    BudgetRefusedError,
    InvalidArgumentError,
    FailedPreconditionError,
    NotFoundError,
    AlreadyExistsError,
    PermissionDeniedError,
    UnauthenticatedError,
    ResourceExhaustedError,
    UnavailableError,
    AbortedError,
    DPMarketError,
)
