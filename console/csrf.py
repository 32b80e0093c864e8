"""Proof that a state-changing request comes from the console's own pages (no cross-site
request forgery).

A browser signed in to a console attaches the console's cookie to any request for the console's
address, whichever page makes it; ``SameSite`` does not stop a page served from *another port of
the same host* (a site ignores ports), and a ``fetch(..., {mode: "no-cors"})`` posts a
multipart form without a preflight. So every request that is not ``GET``, ``HEAD`` or
``OPTIONS`` and is authenticated by the cookie must carry two proofs (:func:`guarded`), checked
before its body is read and before anything is done or charged:

1. **Its origin is the console's** (:func:`origin_refusal`): ``Origin`` (or, when a browser sends
   none, the origin of ``Referer``) equals the console's own origin as the browser addressed it,
   ``scheme://Host`` (scheme, host *and* port), and ``Sec-Fetch-Site``, which Chromium and
   Firefox send, is ``same-origin`` when present. A browser sets these headers itself; no page
   can forge them. The pages' ``Referrer-Policy: same-origin`` keeps both for the console's own
   requests (``no-referrer`` would make a browser send ``Origin: null``) and sends nothing to
   other sites.
2. **It carries its session's form token** (:meth:`SignIns.form_token
   <dpmarket.console.sessions.SignIns.form_token>`, an HMAC of the session id the request's
   cookie presents), rendered into each form of that session's pages as the hidden field
   :data:`FIELD` and compared in constant time. Another page cannot read the console's pages
   (same-origin policy, and the console answers no CORS request), so it cannot learn it; the
   form token of the sign-in page an anonymous visitor gets (anyone who knows the console's
   address may load it) is the anonymous one, which authorizes a sign-in only, never a request
   of a signed-in session, and another sign-in's form token authorizes nothing with this one's
   cookie.

A request that fails either is refused with ``403`` and a message saying which proof was
missing; nothing of it is read further. A request authenticated by ``Authorization: Bearer``
(a program) needs neither: a browser attaches no bearer header by itself, and a page on another
origin cannot add one without a CORS preflight the console never grants.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from dpmarket.console.auth import ConsoleToken, bearer_token, same_secret, session_of
from dpmarket.console.sessions import SignIns

__all__ = ["FIELD", "guarded", "origin_refusal"]

#: The hidden form field holding the synchronizer token.
FIELD = "csrf"
#: Methods that change nothing (served without the proofs).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Endpoint = Callable[[Request], Awaitable[Response]]


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url
    return f"{parts.scheme}://{parts.netloc}".lower()


def origin_refusal(request: Request) -> str | None:
    """Why ``request`` is not proven to come from the console's own origin, or ``None``.

    The console's origin is ``scheme://Host`` of the request itself: the address the browser
    connected to (also through an SSH tunnel on another local port). A forged request from
    another origin carries that origin in ``Origin`` (browsers set it on every ``POST``), so it
    differs; with DNS rebinding the names differ from the console's and the browser sends no
    cookie of the console.
    """
    host = request.headers.get("host", "")
    own = f"{request.url.scheme}://{host}".lower()
    origin = request.headers.get("origin")
    referer = request.headers.get("referer")
    if origin is not None:
        if origin.lower() != own:
            return f"it comes from {origin} (Origin), not from this console ({own})"
    elif referer is None:
        return "it says neither where it comes from (no Origin, no Referer)"
    elif _origin_of(referer) != own:
        return f"it comes from {_origin_of(referer)} (Referer), not from this console ({own})"
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        return f"the browser says it comes from a {fetch_site} page (Sec-Fetch-Site)"
    return None


def _refused(reason: str) -> Response:
    return PlainTextResponse(
        f"403: refused, nothing was done: {reason}. Use the forms of this console's own pages "
        "(reload the page if it is old), or send Authorization: Bearer TOKEN from a program.",
        status_code=403,
    )


def guarded(endpoint: Endpoint, token: ConsoleToken, sessions: SignIns) -> Endpoint:
    """``endpoint``, refusing a state-changing request without both proofs (module docstring).

    ``GET``, ``HEAD`` and ``OPTIONS`` pass through, and so does a request whose bearer token is
    the console's. Otherwise the origin is checked first (before the body is read), then the
    form's :data:`FIELD` against the form token of the session the request's cookie presents
    (the anonymous one without a live session: only the sign-in form, an open path, gets that
    far without one); the form read stays cached for ``endpoint``.
    """

    @functools.wraps(endpoint)
    async def checked(request: Request) -> Response:
        if request.method in SAFE_METHODS or token.matches(bearer_token(request)):
            return await endpoint(request)
        reason = origin_refusal(request)
        if reason is not None:
            return _refused(reason)
        form = await request.form()
        presented = form.get(FIELD)
        if not isinstance(presented, str) or not presented:
            return _refused(f"its form has no {FIELD} field (this console's form token)")
        session = session_of(request.scope)
        if not same_secret(presented, sessions.form_token(session)):
            whose = "this sign-in's" if session else "this console's sign-in"
            return _refused(f"its form's {FIELD} field is not {whose} form token")
        return await endpoint(request)

    return checked
