"""A summarization session's terms on the wire: ``SessionTerms`` <-> :class:`OwnerTerms`.

The curator sends them (:func:`terms_to_proto`), each owner reads them (:func:`terms_from_proto`);
one mapping of :class:`~dpmarket.common.summarization.terms.SessionMethod` to its proto enum
serves both.
"""

from __future__ import annotations

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.summarization.terms import OwnerTerms, SessionMethod
from dpmarket.runtime.market import market_terms_from_proto, market_terms_to_proto
from dpmarket.v1 import owner_pb2

__all__ = ["terms_from_proto", "terms_to_proto"]

_METHOD_TO_PROTO = {
    SessionMethod.UNIFORM: owner_pb2.SESSION_METHOD_UNIFORM,
    SessionMethod.CANDIDATES_COUNTS: owner_pb2.SESSION_METHOD_CANDIDATES_COUNTS,
    SessionMethod.CANDIDATES_SKETCH: owner_pb2.SESSION_METHOD_CANDIDATES_SKETCH,
    SessionMethod.HASHES_COUNTS: owner_pb2.SESSION_METHOD_HASHES_COUNTS,
    SessionMethod.HASHES_SKETCH: owner_pb2.SESSION_METHOD_HASHES_SKETCH,
    SessionMethod.PRIVATE: owner_pb2.SESSION_METHOD_PRIVATE,
    SessionMethod.ROUNDS: owner_pb2.SESSION_METHOD_ROUNDS,
    SessionMethod.GREEDY: owner_pb2.SESSION_METHOD_GREEDY,
}
_METHOD_FROM_PROTO = {v: k for k, v in _METHOD_TO_PROTO.items()}
assert set(_METHOD_TO_PROTO) == set(SessionMethod)


def terms_to_proto(terms: OwnerTerms) -> owner_pb2.SessionTerms:
    """OwnerTerms -> SessionTerms (the description stays with the curator's report)."""
    return owner_pb2.SessionTerms(
        method=_METHOD_TO_PROTO[terms.method],
        epsilon=terms.epsilon,
        delta=terms.delta,
        max_rounds=terms.max_rounds,
        market=None if terms.market is None else market_terms_to_proto(terms.market),
    )


def terms_from_proto(message: owner_pb2.SessionTerms) -> OwnerTerms:
    """SessionTerms -> OwnerTerms.

    Raises
    ------
    InvalidArgumentError
        If the method is unspecified or unknown, or the terms are malformed for it
        (:class:`~dpmarket.common.summarization.terms.OwnerTerms`: an epsilon that is not what the
        method's steps release, a delta outside ``[0, 1)``, ``max_rounds`` wrong for the method),
        or its market terms are malformed
        (:func:`~dpmarket.runtime.market.market_terms_from_proto`).
    """
    method = _METHOD_FROM_PROTO.get(message.method)
    if method is None:
        names = ", ".join(m.value for m in SessionMethod)
        raise InvalidArgumentError(
            f"terms.method must name the session's method ({names}), got {message.method}"
        )
    market = market_terms_from_proto(message.market) if message.HasField("market") else None
    try:
        return OwnerTerms(
            method,
            float(message.epsilon),
            float(message.delta),
            int(message.max_rounds),
            market=market,
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"terms: {exc}") from exc
