"""Who may use a party's console: the holder of its token.

The console serves a party's own view of the market (its ledger, its sessions, its catalogue
answers) to whoever reaches its HTTP port, so every page but the login form and the style sheet
asks for the party's **console token**: 32 random bytes (``secrets.token_urlsafe``), generated the
first time the console starts, printed once, and kept in the party's data directory as
``console-token`` (mode 0600, readable by the party's user only). A program sends
``Authorization: Bearer TOKEN``. A browser presents the token once, at ``/login`` (a form, or
``/login?token=...``, which leaves the token in the browser's history) and then holds a
**cookie that is not the token**:

* its value is a **session id** of this sign-in (:mod:`dpmarket.console.sessions`): random, new
  at every sign-in, kept in the console process's memory, ended by signing out, by 12 hours
  unused or by the console stopping; accepted as a cookie only, never as a bearer token, and
  derived from nothing, so a copy of it neither reveals the token nor outlives its session;
* its ``Path`` is the console's **secret path** (:attr:`ConsoleToken.prefix`, an HMAC of the
  token): every page is served under it and nothing else is. Browsers send a ``127.0.0.1`` cookie
  to every port of ``127.0.0.1`` (cookies ignore ports), so another local web server the user
  visits would receive a ``Path=/`` cookie; it does not know the secret path, so the browser
  never sends it this cookie;
* its name carries the console's port (:func:`cookie_name`), so the consoles of two parties open
  in one browser keep one cookie each; ``HttpOnly`` (no script reads it), ``SameSite=Strict``,
  and over HTTPS ``Secure`` with the ``__Secure-`` name prefix (``__Host-`` would demand
  ``Path=/``).

Every comparison of a secret takes constant time (:func:`hmac.compare_digest`; sessions are
looked up by a hash of the id). State-changing requests also need proof that they come from
the console's own pages of the same sign-in (:mod:`dpmarket.console.csrf`).

The console binds to 127.0.0.1 by default, and the token is required there too: other users of a
shared machine reach the loopback address as well. For remote use, bind another address and keep
the token to the people who may see the party's data (docs/howto-console.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dpmarket.console.sessions import SignIns

__all__ = [
    "TOKEN_FILE",
    "ConsoleToken",
    "TokenMiddleware",
    "bearer_token",
    "cookie_name",
    "route_path",
    "same_secret",
    "session_of",
]

#: The token's file in the party's data directory.
TOKEN_FILE = "console-token"
#: The browser cookie's name, before the console's port (:func:`cookie_name`).
COOKIE_STEM = "dpmarket_console"
#: Paths (under the console's secret path) served without the token: the login form and the
#: style sheet.
OPEN_PATHS = ("/login", "/static/")
#: The ASGI scope's key holding the session id a request's cookie presented (when live).
SESSION_SCOPE_KEY = "dpmarket.console.session"
#: Characters of the secret path (base64url of an HMAC: 22 characters hold 132 bits).
PATH_CHARS = 22


def cookie_name(port: int, *, secure: bool = False) -> str:
    """The console's cookie name: one per console port, ``__Secure-`` prefixed over HTTPS.

    Parameters
    ----------
    port : int
        The port the console serves on.
    secure : bool
        The console serves HTTPS (the cookie is ``Secure``; browsers then refuse a
        ``__Secure-`` cookie set by plain HTTP, so no other local server can plant one).
    """
    name = f"{COOKIE_STEM}_{port}"
    return f"__Secure-{name}" if secure else name


def cookie_values(headers: list[str], name: str) -> list[str]:
    """Every value the ``Cookie`` request headers give the cookie ``name``, in order.

    Parameters
    ----------
    headers : list of str
        The request's ``Cookie`` headers (``name=value; other=value`` each).
    name : str
        The cookie's name.

    Returns
    -------
    list of str
        Its values; empty when none is sent. Browsers send one per matching path, so a
        cookie of the same name set by another server on a wider path comes along.
    """
    values = []
    for header in headers:
        for part in header.split(";"):
            key, sep, value = part.strip().partition("=")
            if sep and key == name:
                values.append(value.strip().strip('"'))
    return values


@dataclass(frozen=True)
class ConsoleToken:
    """A party's console token and where it is kept.

    Attributes
    ----------
    value : str
        The token (URL-safe text, 43 characters).
    path : Path
        Its file (mode 0600).
    created : bool
        Whether :meth:`load_or_create` generated it now (then it is printed once).
    """

    value: str
    path: Path
    created: bool

    @classmethod
    def load_or_create(cls, data_dir: str | os.PathLike[str]) -> ConsoleToken:
        """The token in ``data_dir/console-token``, generated when there is none.

        Raises
        ------
        PermissionError
            If the file is readable by other users (its mode allows group or others): the
            message says to ``chmod 600`` it or delete it for a new token.
        ValueError
            If the file is empty.
        OSError
            If the directory cannot be created or the file written.
        """
        folder = Path(data_dir)
        path = folder / TOKEN_FILE
        if path.exists():
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                raise PermissionError(
                    f"{path} is readable by other users (mode {mode:o}): chmod 600 it, or delete "
                    "it to have a new token generated"
                )
            value = path.read_text(encoding="utf-8").strip()
            if not value:
                raise ValueError(f"{path} is empty: delete it to have a new token generated")
            return cls(value, path, created=False)
        folder.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(value + "\n")
        return cls(value, path, created=True)

    def matches(self, presented: str | None) -> bool:
        """Whether ``presented`` is the token (constant time)."""
        return same_secret(presented, self.value)

    def derive(self, purpose: str) -> str:
        """HMAC-SHA256 of ``purpose`` keyed by the token, base64url without padding (43
        characters): a secret for one purpose that reveals neither the token nor another
        purpose's secret."""
        digest = hmac.new(self.value.encode("utf-8"), purpose.encode("utf-8"), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode("ascii").rstrip("=")

    @property
    def prefix(self) -> str:
        """The console's secret path (``/`` and 22 characters): every page is served under it,
        and the browser's cookie is scoped to it (module docstring). Stable while the token
        is (bookmarks keep working); a new token gives a new path."""
        return "/" + self.derive("dpmarket console path v1")[:PATH_CHARS]


def same_secret(presented: str | None, expected: str) -> bool:
    """Whether ``presented`` equals ``expected`` (constant time; ``None`` or empty never)."""
    if not presented:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


def route_path(scope: Scope) -> str:
    """The request's path below the console's secret path (its ``root_path``, set by the
    mount), e.g. ``/owner``."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def session_of(scope: Scope) -> str | None:
    """The live session id the request's cookie presented (:class:`TokenMiddleware` puts it in
    the scope), or ``None``: no cookie, an ended session, or a bearer token."""
    session = scope.get(SESSION_SCOPE_KEY)
    return session if isinstance(session, str) else None


def bearer_token(conn: HTTPConnection) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if any."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


class TokenMiddleware:
    """ASGI middleware refusing every request without the console token (module docstring):
    the token as ``Authorization: Bearer``, or the cookie ``cookie`` holding a live session id
    of ``sessions``.

    A browser asking for a page is sent to the login form (303); any other request (the event
    stream, a download, a program) is answered ``401 Unauthorized``. Nothing of the party's data
    is read before the token is checked. Mounted under the console's secret path, it sees that
    path as its ``root_path``. A live session's id goes into the scope (:func:`session_of`), also
    on the open paths (the sign-in form of a signed-in browser carries its session's form token).
    """

    def __init__(self, app: ASGIApp, token: ConsoleToken, cookie: str, sessions: SignIns) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie
        self.sessions = sessions

    def admits(self, conn: HTTPConnection) -> bool:
        """Whether ``conn`` presents the token (bearer) or a live session's cookie (then its id
        goes into ``conn.scope``, and its idle time starts again)."""
        bearer = bearer_token(conn)
        if bearer is not None:
            return self.token.matches(bearer)
        # Every cookie of this name, not only the one a parser keeps: another local server may
        # set one of the same name on a wider path (ports do not separate cookies), and a parser
        # that keeps the last would let it sign the browser out for good.
        for session in cookie_values(conn.headers.getlist("cookie"), self.cookie):
            if self.sessions.touch(session):
                conn.scope[SESSION_SCOPE_KEY] = session
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope.pop(SESSION_SCOPE_KEY, None)
        conn = HTTPConnection(scope)
        path = route_path(scope)
        if self.admits(conn) or path.startswith(OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        response: Response
        wants_page = scope["type"] == "http" and "text/html" in conn.headers.get("accept", "")
        if wants_page and conn.scope.get("method") == "GET":
            target = path + (f"?{conn.url.query}" if conn.url.query else "")
            root = scope.get("root_path", "")
            response = RedirectResponse(f"{root}/login?next={quote(target)}", status_code=303)
        else:
            # The path under which this request came is the console's own: its sign-in page
            # is there (the root's /login is nothing).
            login = f"{scope.get('root_path', '')}/login"
            response = PlainTextResponse(
                "401: this console needs its token (the console-token file in the party's data "
                f"directory): sign in at {login} (the address `dpmarket console` printed) or "
                "send Authorization: Bearer TOKEN",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        await response(scope, receive, send)
