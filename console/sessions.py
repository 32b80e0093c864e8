"""A console's sign-ins: server-side sessions, kept in the console process's memory only.

A browser that presents the console token at ``/login`` gets a **session id**, 32 fresh random
bytes (:func:`secrets.token_urlsafe`), as its cookie (:mod:`dpmarket.console.auth`). The id is
nothing but a key of :class:`SignIns`, a table in the console's memory, so:

* every sign-in gets a new id (another browser, another sign-in of the same browser: another
  id); nothing about it derives from the token, so a cookie says nothing of the token, and a
  cookie seen once (by a server that took over the console's old port after it stopped, say)
  is worth nothing once the session it names ends;
* signing out (``/logout``) removes the id from the table: a copy of the cookie, taken before,
  is refused after;
* a session unused for :data:`IDLE_SECONDS` expires, and the table holds at most
  :data:`CAPACITY` sessions (the least recently used goes first), so no flood of sign-ins grows
  the console's memory;
* a console that stops forgets every session: a restarted console (the same token, the same
  secret path) refuses every cookie of the one before, and its user signs in again with the
  token.

The table keeps the SHA-256 of each id, not the id, so a lookup's timing depends on a hash of
what was presented, never on how much of a real id it shares.

Each session also has its own **form token** (:meth:`SignIns.form_token`, an HMAC of the
session id under a key made at random when the console starts), which the console's pages
render into their forms (:mod:`dpmarket.console.csrf`): a page another sign-in was served, or
the sign-in page an anonymous visitor is served, carries a form token that authorizes nothing
with this session's cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["CAPACITY", "IDLE_SECONDS", "SignIns"]

#: Seconds a session lives without a request (12 hours).
IDLE_SECONDS = 12 * 3600.0
#: Most sessions a console keeps at once; beyond, the least recently used one ends.
CAPACITY = 256


def _digest(session: str) -> bytes:
    return hashlib.sha256(session.encode("utf-8")).digest()


class SignIns:
    """The sessions of one console process (module docstring).

    Parameters
    ----------
    idle_seconds : float
        Seconds of disuse after which a session expires (> 0).
    capacity : int
        Most sessions kept (>= 1); a sign-in beyond it ends the least recently used session.
    clock : callable
        Seconds, monotonic (:func:`time.monotonic`; tests pass their own).

    Raises
    ------
    ValueError
        If ``idle_seconds`` or ``capacity`` is not positive.
    """

    def __init__(
        self,
        *,
        idle_seconds: float = IDLE_SECONDS,
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds={idle_seconds!r}: give a positive number of seconds")
        if capacity < 1:
            raise ValueError(f"capacity={capacity!r}: give at least 1 session")
        self.idle_seconds = float(idle_seconds)
        self.capacity = int(capacity)
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._last_used: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._last_used)

    def issue(self) -> str:
        """A new session id (43 URL-safe characters), valid from now."""
        session = secrets.token_urlsafe(32)
        with self._lock:
            now = self._clock()
            self._expire(now)
            while len(self._last_used) >= self.capacity:
                self._last_used.popitem(last=False)
            self._last_used[_digest(session)] = now
        return session

    def touch(self, session: str | None) -> bool:
        """Whether ``session`` is a live session of this process; if so, it is used now (its
        idle time starts again). ``None`` or empty: never."""
        if not session:
            return False
        key = _digest(session)
        with self._lock:
            now = self._clock()
            self._expire(now)
            if key not in self._last_used:
                return False
            self._last_used[key] = now
            self._last_used.move_to_end(key)
            return True

    def revoke(self, session: str | None) -> None:
        """End ``session`` (nothing if it is not live)."""
        if session:
            with self._lock:
                self._last_used.pop(_digest(session), None)

    def form_token(self, session: str | None) -> str:
        """The form token of ``session``, or of an anonymous visitor (``None``: the sign-in
        form's, which authorizes nothing but a sign-in). An HMAC-SHA256 under this process's
        random key, base64url without padding (43 characters)."""
        label = b"anonymous" if not session else b"session " + session.encode("utf-8")
        digest = hmac.new(self._key, b"dpmarket console form v2: " + label, hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode("ascii").rstrip("=")

    def _expire(self, now: float) -> None:
        """Drop the sessions idle longer than :attr:`idle_seconds` (the oldest come first)."""
        while self._last_used:
            key, used = next(iter(self._last_used.items()))
            if now - used <= self.idle_seconds:
                return
            del self._last_used[key]
