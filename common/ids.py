"""Session identifiers: random, unguessable, and shortened wherever they are shown."""

from __future__ import annotations

import secrets

from dpmarket.common.texts import peer_text

#: Random bits in a session id.
SESSION_ID_BITS = 128


def new_session_id() -> str:
    """A fresh session id: 128 random bits from the operating system's CSPRNG, as 32 hex digits.

    Knowing an id is never enough to use a session (every service also checks who calls), but
    ids are unguessable so that one session cannot be found from another's.
    """
    return secrets.token_hex(SESSION_ID_BITS // 8)


def short_id(session_id: str) -> str:
    """The first 8 characters of a session id and an ellipsis: what logs and messages show.

    The id may be another party's (a session or job id a curator sends an owner): its
    characters are kept as :func:`~dpmarket.common.texts.peer_text` writes them (escaped), so
    that it cannot start a line in a log.
    """
    return peer_text(session_id[:8]) + ("…" if len(session_id) > 8 else "")
