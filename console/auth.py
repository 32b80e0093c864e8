"""Who may use a party's console: the holder of its token.

The console serves a party's own view of the market (its ledger, its sessions, its catalogue
answers) to whoever reaches its HTTP port, so every page but the login form and the style sheet
asks for the party's **console token**: 32 random bytes (``secrets.token_urlsafe``), generated the
first time the console starts, printed once, and kept in the party's data directory as
``console-token`` (mode 0600, readable by the party's user only). A browser presents it once, at
``/login`` (a form, or ``/login?token=...`` from the printed address), and keeps it in a cookie
that is ``HttpOnly`` (no script reads it) and ``SameSite=Strict`` (no other site's page can make
the browser send it, so a form on another site cannot post to the console); a program sends
``Authorization: Bearer TOKEN``. Every comparison takes constant time (:func:`hmac.compare_digest`).

The console binds to 127.0.0.1 by default, and the token is required there too: other users of a
shared machine reach the loopback address as well. For remote use, bind another address and keep
the token to the people who may see the party's data (docs/howto-console.md).
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from starlette.datastructures import URL
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["COOKIE", "TOKEN_FILE", "ConsoleToken", "TokenMiddleware"]

#: The token's file in the party's data directory.
TOKEN_FILE = "console-token"
#: The browser cookie that carries the token.
COOKIE = "dpmarket_console"
#: Paths served without the token: the login form and the style sheet.
OPEN_PATHS = ("/login", "/static/")


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
        if not presented:
            return False
        return hmac.compare_digest(presented.encode("utf-8"), self.value.encode("utf-8"))


def presented_token(conn: HTTPConnection) -> str | None:
    """The token a request presents: ``Authorization: Bearer``, else the cookie."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return conn.cookies.get(COOKIE)


class TokenMiddleware:
    """ASGI middleware refusing every request without the console token (module docstring).

    A browser asking for a page is sent to the login form (303); any other request (the event
    stream, a download, a program) is answered ``401 Unauthorized``. Nothing of the party's data
    is read before the token is checked.
    """

    def __init__(self, app: ASGIApp, token: ConsoleToken) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        path = conn.url.path
        if path.startswith(OPEN_PATHS) or self.token.matches(presented_token(conn)):
            await self.app(scope, receive, send)
            return
        response: Response
        wants_page = scope["type"] == "http" and "text/html" in conn.headers.get("accept", "")
        if wants_page and conn.scope.get("method") == "GET":
            target = URL(path=path, query=conn.url.query).path + (
                f"?{conn.url.query}" if conn.url.query else ""
            )
            response = RedirectResponse(f"/login?next={quote(target)}", status_code=303)
        else:
            response = PlainTextResponse(
                "401: this console needs its token (the console-token file in the party's data "
                "directory): sign in at /login or send Authorization: Bearer TOKEN",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        await response(scope, receive, send)
