"""Session identifiers: random, unguessable, and shortened wherever they are shown."""

from __future__ import annotations

import secrets

#: Random bits in a session id.
SESSION_ID_BITS = 128


def new_session_id() -> str:
    """A fresh session id: 128 random bits from the operating system's CSPRNG, as 32 hex digits.

    Knowing an id is never enough to use a session (every service also checks who calls), but
    ids are unguessable so that one session cannot be found from another's.
    """
    return secrets.token_hex(SESSION_ID_BITS // 8)


def short_id(session_id: str) -> str:
    """The first 8 characters of a session id and an ellipsis: what logs and messages show."""
    return f"{session_id[:8]}…" if len(session_id) > 8 else session_id
