"""The console as a Starlette application: one party's pages, behind its token.

:func:`create_app` serves the pages of one role, the one of the certificate the console runs
with (:mod:`dpmarket.console.cli`): a consumer's console has the consumer's routes only, an
owner's the owner's, a curator's the curator's. Another role's page is not there (404), so a
console run with a consumer's certificate has no route to an owner's ledger or to the curator's
sessions, besides holding no credential that would read them.

Every page is served under the console's secret path (:attr:`ConsoleToken.prefix`, printed in
its address), and nothing else is: ``/`` and any other path are 404, so a program or a page that
does not know the console's address learns nothing, and the browser's cookie, scoped to that
path, is sent to no other local server (:mod:`dpmarket.console.auth`). Every state-changing
request needs proof that it comes from the console's own pages (:mod:`dpmarket.console.csrf`).

Every answer has an address it can be reopened at: an exploration's is a ``GET`` with its
question in the URL (computed here from the published sketches, it changes and charges
nothing, like any page); a ranking's or a quote's (they read an uploaded file) is where their
``POST`` redirects, kept in this process's memory (the newest :data:`KEPT_ANSWERS`). The
address of a form's action, opened, is the form.

Pages are rendered on the server (Jinja2 templates, matplotlib SVG plots,
:mod:`dpmarket.console.plots`, drawn in worker threads so that one page's plot does not hold up
the others); the one script (``static/console.js``) follows a summary's progress
from its server-sent events, and shows on the request form what a request with the chosen
fewest owners would do (the page holds each choice's state,
:func:`~dpmarket.console.consumer.method_form`). Every response carries a
Content-Security-Policy that allows this origin only (no CDN: the console works offline), forbids
framing, and sends a referrer to this origin only (so a login address with the token never leaks
to another site, while the console's own requests keep the ``Origin`` the CSRF check needs).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from dpmarket.common.errors import DPMarketError
from dpmarket.common.market.statement import StatementError
from dpmarket.common.summarization.methods import METHODS
from dpmarket.common.summarization.terms import MethodOffer
from dpmarket.common.uncertainty import interval_text
from dpmarket.console import plots
from dpmarket.console.auth import ConsoleToken, TokenMiddleware, cookie_name, session_of
from dpmarket.console.consumer import (
    ConsumerConsole,
    UserError,
    form_credits,
    form_number,
    method_form,
    quote_view,
    statement_view,
)
from dpmarket.console.csrf import FIELD, guarded
from dpmarket.console.curator import CuratorConsole
from dpmarket.console.owner import OwnerConsole
from dpmarket.console.sessions import SignIns
from dpmarket.runtime.identity import Identity

__all__ = ["Party", "create_app"]

HERE = Path(__file__).resolve().parent
Party = ConsumerConsole | OwnerConsole | CuratorConsole
#: Seconds between two looks at a running summary for its event stream.
EVENT_POLL_SECONDS = 0.2
#: Explore's query kinds offered by the form (``synthetic`` draws records: not a plot).
EXPLORE_QUERIES = ("mean", "moment2", "cdf", "count", "covariance", "logreg", "marginal")
#: The explore form's fields, the parameters of an answer's address.
EXPLORE_FIELDS = ("query", "spec", "owner", "column", "points", "where", "target")
#: Seconds an explore page waits for its answer; a longer one is computed off the request and
#: the page says so, reloading itself after :data:`ANSWER_REFRESH_SECONDS` until it is there.
#: Each reload waits as long again, so the reloads are a long poll: the answer shows within
#: a page's load of being ready (a reload every second showed one ready after 1.02 s at 2.0 s).
ANSWER_WAIT_SECONDS = 0.5
ANSWER_REFRESH_SECONDS = 0
#: The summary form's fields shown again, as entered, with its error (a file field cannot be).
SUMMARY_FIELDS = ("p", "method", "gamma", "min_owners", "max_cost")
#: Rankings and quotes kept at an address of their own (the newest; in memory).
KEPT_ANSWERS = 32

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class _SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for key, value in SECURITY_HEADERS.items():
                    if key.lower().encode() not in present:
                        headers.append((key.lower().encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _utc(at: float) -> str:
    """Unix time as ``2024-05-01 12:00 UTC``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _number(value: float | None, spec: str = ".4g") -> str:
    """``value`` formatted with ``spec``; "—" for a figure a record does not hold (None, not
    finite, or a key the record lacks: e.g. a uniform session releases no Theorem 7 epsilon)."""
    if (
        value is None
        or isinstance(value, jinja2.Undefined)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        return "—"
    return format(value, spec)


def _interval(pair: Sequence[float] | None, decimals: int = 0) -> str:
    """``"[low, high]"`` rounded outwards
    (:func:`dpmarket.common.uncertainty.interval_text`); "—" without an interval."""
    if pair is None or isinstance(pair, jinja2.Undefined):
        return "—"
    return interval_text(float(pair[0]), float(pair[1]), decimals)


def console_templates(identity: Identity, base: str) -> Jinja2Templates:
    """The console's templates, with its filters (``num``, ``interval``, ``utc``) and the
    globals every page
    reads (``identity``, ``base``: the console's secret path, ``form_field``)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["num"] = _number
    templates.env.filters["interval"] = _interval
    templates.env.filters["utc"] = _utc
    templates.env.globals["identity"] = identity
    templates.env.globals["base"] = base
    templates.env.globals["form_field"] = FIELD
    return templates


def create_app(
    party: Party,
    identity: Identity,
    token: ConsoleToken,
    *,
    port: int,
    https: bool = False,
    sessions: SignIns | None = None,
) -> Starlette:
    """The console's ASGI application for ``party``, its pages under ``token.prefix``.

    Parameters
    ----------
    party : ConsumerConsole, OwnerConsole or CuratorConsole
        What the pages read (its role decides which pages exist).
    identity : Identity
        The party's identity, shown on every page.
    token : ConsoleToken
        The token every page but ``/login`` requires (:mod:`dpmarket.console.auth`); it also
        gives the console's secret path.
    port : int
        The port the console serves on (in its cookie's name, so that two consoles in one
        browser keep one cookie each).
    https : bool
        The console is served over HTTPS: its cookie is ``Secure`` and ``__Secure-`` named.
    sessions : SignIns, optional
        The sign-ins the console's cookies name (:mod:`dpmarket.console.sessions`); a new, empty
        table by default (each console process has its own: a restart signs everyone out).
    """
    base = token.prefix
    sessions = SignIns() if sessions is None else sessions
    cookie = cookie_name(port, secure=https)
    templates = console_templates(identity, base)
    role = identity.role

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        # Each page's forms carry the form token of the session that asked for it (csrf).
        form_token = sessions.form_token(session_of(request.scope))
        return templates.TemplateResponse(
            request,
            name,
            {"role": role, "now": time.time(), "form_token": form_token, **context},
            status_code=status,
        )

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{base}/{role}", status_code=303)

    async def login(request: Request) -> Response:
        presented = request.query_params.get("token")
        if request.method == "POST":
            form = await request.form()
            presented = str(form.get("token", ""))
            target = str(form.get("next", "/"))
        else:
            target = request.query_params.get("next", "/")
        if not _local(target):
            target = "/"
        if presented is None:
            return page(request, "login.html", {"next": target, "error": ""})
        if not token.matches(presented.strip()):
            return page(
                request,
                "login.html",
                {"next": target, "error": "That is not this console's token."},
                401,
            )
        # A new session for every sign-in; the browser's previous one (if any) ends.
        sessions.revoke(session_of(request.scope))
        response = RedirectResponse(base + target, status_code=303)
        response.set_cookie(
            cookie, sessions.issue(), httponly=True, samesite="strict", secure=https, path=base
        )
        return response

    async def logout(request: Request) -> Response:
        # Ended here, not only in the browser: a copy of the cookie opens nothing any more.
        sessions.revoke(session_of(request.scope))
        response = RedirectResponse(f"{base}/login", status_code=303)
        response.delete_cookie(cookie, path=base, secure=https, httponly=True, samesite="strict")
        return response

    routes: list[Any] = [
        Route("/", home),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if isinstance(party, ConsumerConsole):
        routes += _consumer_routes(party, page)
    elif isinstance(party, OwnerConsole):
        routes += _owner_routes(party, page)
    else:
        routes += _curator_routes(party, page)
    routes = [
        Route(r.path, guarded(r.endpoint, token, sessions), methods=r.methods)
        if isinstance(r, Route)
        else r
        for r in routes
    ]
    pages = Starlette(
        routes=routes,
        middleware=[Middleware(TokenMiddleware, token=token, cookie=cookie, sessions=sessions)],
    )
    return Starlette(
        routes=[Mount(base, app=pages)],
        middleware=[Middleware(_SecurityHeaders)],
        exception_handlers={404: _elsewhere},
    )


async def _elsewhere(request: Request, exc: Exception) -> Response:
    """Any path outside the console's secret path: nothing, not even whether a console runs."""
    return PlainTextResponse(
        "404: nothing here. A console's pages are under the address `dpmarket console` printed "
        "when it started (its path comes from the console-token file).",
        status_code=404,
    )


def _local(target: str) -> bool:
    """Whether ``target`` is a path of this console (no scheme, host or ``//``)."""
    parts = urlsplit(target)
    return not parts.scheme and not parts.netloc and target.startswith("/")


Page = Callable[..., Response]


# ------------------------------------------------------------------------------- consumer
def _consumer_routes(consumer: ConsumerConsole, page: Page) -> list[Route]:
    async def overview(request: Request, extra: dict[str, Any] | None = None) -> Response:
        error, catalogue = "", None
        try:
            catalogue = await run_in_threadpool(consumer.catalogue)
        except DPMarketError as exc:
            error = f"the curator did not answer: {exc}"
        try:
            offers = await run_in_threadpool(consumer.methods)
        except DPMarketError:  # an older curator, or none: every method offered
            offers = [MethodOffer(m, True) for m in METHODS]
        history = await run_in_threadpool(consumer.history.entries, 20)
        last = next((r for r in history if r.status == "done"), None)
        share_svg = ""
        if last is not None and last.points_per_owner:
            share_svg = await run_in_threadpool(
                _share_plot,
                last.points_per_owner,
                last.left_out,
                f"each owner's share of your last summary ({last.short_id})",
            )
        context = {
            "catalogue": catalogue,
            "error": error,
            "history": history,
            "last": last,
            "share_svg": share_svg,
            "running": [j for j in consumer.jobs.values() if not j.finished],
            "queries": EXPLORE_QUERIES,
            "methods": method_form(offers),
            "request_id": uuid.uuid4().hex,
            **(extra or {}),
        }
        return page(request, "consumer.html", context, 503 if error else 200)

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    async def explore(request: Request) -> Response:
        """An answer at an address: ``GET /consumer/explore?query=...`` (what the form sends;
        nothing is changed or charged, so the address can be reopened, kept or shared with
        the console's other tabs); a ``POST`` of the same fields (checked as every POST is,
        :mod:`dpmarket.console.csrf`) is redirected there."""
        if request.method == "POST":
            form = await request.form()
            fields = [(k, str(v)) for k, v in form.multi_items() if k in EXPLORE_FIELDS]
            return RedirectResponse(
                f"{root(request)}/consumer/explore?{urlencode(fields)}", status_code=303
            )
        asked = request.query_params
        if "query" not in asked:  # the bare address: the form
            return RedirectResponse(f"{root(request)}/consumer#explore", status_code=303)
        question = {
            "query": asked.get("query", "mean"),
            "spec": asked.get("spec", ""),
            "owners": [o for o in asked.getlist("owner") if o],
            "columns": [c for c in asked.getlist("column") if c],
            "points": _split(asked.get("points", "")),
            "where": [w for w in (x.strip() for x in asked.get("where", "").split(";")) if w],
            "target": asked.get("target", ""),
        }
        try:
            answer, seconds = await run_in_threadpool(
                consumer.explore_soon, question, ANSWER_WAIT_SECONDS
            )
        except UserError as exc:
            asked_again = {"explore_error": str(exc), "explore_asked": question}
            return await _with_status(overview(request, asked_again), 400)
        if answer is None:  # computed off the request: this page reloads until it is there
            context = {"question": question, "seconds": seconds, "refresh": ANSWER_REFRESH_SECONDS}
            return page(request, "computing.html", context, 202)
        context = {"answer": answer, "svg": answer["svg"], "question": question}
        return page(request, "explore.html", context)

    #: Answers of uploaded files (rankings, quotes), kept at an address of their own so that
    #: the page a POST redirects to can be reopened: the newest :data:`KEPT_ANSWERS`, in this
    #: process only.
    kept: collections.OrderedDict[str, tuple[str, dict[str, Any]]] = collections.OrderedDict()

    def keep(kind: str, context: dict[str, Any]) -> str:
        key = secrets.token_urlsafe(12)
        kept[key] = (kind, context)
        while len(kept) > KEPT_ANSWERS:
            kept.popitem(last=False)
        return key

    async def kept_answer(request: Request) -> Response:
        kind = request.url.path.rstrip("/").split("/")[-2]
        found = kept.get(request.path_params["key"])
        if found is None or found[0] != kind:
            message = (
                f"no such answer: this console keeps its last {KEPT_ANSWERS} rankings and "
                "quotes until it restarts; ask again from the forms"
            )
            return page(request, "missing.html", {"message": message}, 404)
        template = "ranking.html" if kind == "rankings" else "quote.html"
        return page(request, template, found[1])

    async def to_form(request: Request) -> Response:
        """The address of a form's action, opened (a reload, a bookmark): the form."""
        anchor = {"rank": "rank", "summary": "request", "quote": "request"}
        part = anchor[request.url.path.rstrip("/").rsplit("/", 1)[-1]]
        return RedirectResponse(f"{root(request)}/consumer#{part}", status_code=303)

    async def rank(request: Request) -> Response:
        if request.method != "POST":  # a HEAD too: only a POST, checked, submits
            return await to_form(request)
        form = await request.form()
        upload = form.get("validation")
        data, name = await _read_upload(upload)
        try:
            ranking = await run_in_threadpool(
                consumer.rank, data, name, str(form.get("spec", "")) or None
            )
        except UserError as exc:
            again = {"rank_error": str(exc), "rank_asked": {"spec": str(form.get("spec", ""))}}
            return await _with_status(overview(request, again), 400)
        svg = await run_in_threadpool(
            plots.ranking_plot, ranking["rows"], title=f"owners by MMD² to {name}"
        )
        key = keep("rankings", {"ranking": ranking, "svg": svg, "file": name})
        return RedirectResponse(f"{root(request)}/consumer/rankings/{key}", status_code=303)

    def summary_request(form: Any) -> dict[str, Any]:
        """The summary form's parameters (raises UserError for a malformed number)."""
        return {
            "summary_size": _form_number(form, "p", "Points", int, default="0") or 0,
            "method": str(form.get("method", "candidates")),
            "gamma": _form_number(form, "gamma", "Kernel γ", float, default=""),
            "min_owners": _form_number(form, "min_owners", "Fewest owners", int, default="0") or 0,
            "max_cost": form_credits(str(form.get("max_cost", "")), "max_cost", "Most it may cost"),
        }

    def summary_again(form: Any, exc: UserError) -> dict[str, Any]:
        """The summary form's error and what was entered in it (but the file), to show again."""
        entered = {k: str(form.get(k, "")) for k in SUMMARY_FIELDS}
        return {"summary_error": str(exc), "summary_asked": entered}

    async def summary(request: Request) -> Response:
        if request.method != "POST":  # a HEAD too: only a POST, checked, submits
            return await to_form(request)
        form = await request.form()
        data, name = await _read_upload(form.get("validation"))
        try:
            asked = summary_request(form)
            request_id = str(form.get("request_id", "")) or uuid.uuid4().hex
            session_id = await run_in_threadpool(
                lambda: consumer.start_summary(data, name, request_id=request_id, **asked)
            )
        except UserError as exc:
            return await _with_status(overview(request, summary_again(form, exc)), 400)
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/consumer/sessions/{session_id}", status_code=303)

    async def quote(request: Request) -> Response:
        if request.method != "POST":  # a HEAD too: only a POST, checked, submits
            return await to_form(request)
        form = await request.form()
        data, name = await _read_upload(form.get("validation"))
        try:
            asked = summary_request(form)
            quoted = await run_in_threadpool(lambda: consumer.quote(data, name, **asked))
        except UserError as exc:
            return await _with_status(overview(request, summary_again(form, exc)), 400)
        context = {"quote": quote_view(quoted, asked["max_cost"]), "file": name, "asked": asked}
        key = keep("quotes", context)
        return RedirectResponse(f"{root(request)}/consumer/quotes/{key}", status_code=303)

    async def statements(request: Request) -> Response:
        context: dict[str, Any]
        try:
            settled = await run_in_threadpool(consumer.statements)
        except StatementError as exc:  # a signature that does not verify: nothing is shown
            context = {"statements": [], "error": f"refused the curator's statements: {exc}"}
            return page(request, "statements.html", context, 502)
        except DPMarketError as exc:
            context = {
                "statements": [],
                "error": f"the curator did not answer: {exc}",
            }
            return page(request, "statements.html", context, 503)
        context = {"statements": [statement_view(s) for s in settled], "error": ""}
        return page(request, "statements.html", context)

    async def session(request: Request) -> Response:
        key = request.path_params["key"]
        job = consumer.jobs.get(key)
        if job is not None and not job.finished:
            return page(request, "progress.html", {"job": job})
        record = job.record if job is not None else None
        if record is None:
            record = await run_in_threadpool(consumer.record, key)
        if record is None:
            error = job.error if job is not None else f"no session {key} in your history"
            return page(request, "missing.html", {"message": error}, 404)
        share_svg = curve_svg = ""
        if record.points_per_owner or record.left_out:
            share_svg = await run_in_threadpool(
                _share_plot, record.points_per_owner, record.left_out, "each owner's share"
            )
        if record.mmd_curve.get("sizes"):
            curve_svg = await run_in_threadpool(
                _drawn_curve,
                tuple(int(s) for s in record.mmd_curve["sizes"]),
                tuple(float(v) for v in record.mmd_curve["mmd2"]),
            )
        downloadable = consumer.summary_file(record) is not None
        return page(
            request,
            "session.html",
            {
                "record": record,
                "share_svg": share_svg,
                "curve_svg": curve_svg,
                "downloadable": downloadable,
            },
        )

    async def events(request: Request) -> Response:
        job = consumer.jobs.get(request.path_params["key"])
        if job is None:
            return Response("no running session of this console by that id", status_code=404)

        async def stream() -> AsyncIterator[str]:
            sent = 0
            while True:
                events = job.events[sent:]
                for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
                sent += len(events)
                if job.finished:
                    yield f"event: end\ndata: {json.dumps({'error': job.error})}\n\n"
                    return
                if await request.is_disconnected():
                    return
                await asyncio.sleep(EVENT_POLL_SECONDS)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    async def download(request: Request) -> Response:
        record = await run_in_threadpool(consumer.record, request.path_params["key"])
        path = None if record is None else consumer.summary_file(record)
        if record is None or path is None:
            return Response("this summary's file is not in your data directory", status_code=404)
        return FileResponse(
            path, media_type="text/csv", filename=f"summary-{record.short_id}{path.suffix}"
        )

    return [
        Route("/consumer", overview),
        Route("/consumer/explore", explore, methods=["GET", "POST"]),
        Route("/consumer/rank", rank, methods=["GET", "POST"]),
        Route("/consumer/rankings/{key}", kept_answer),
        Route("/consumer/summary", summary, methods=["GET", "POST"]),
        Route("/consumer/quote", quote, methods=["GET", "POST"]),
        Route("/consumer/quotes/{key}", kept_answer),
        Route("/consumer/statements", statements),
        Route("/consumer/sessions/{key}", session),
        Route("/consumer/sessions/{key}/events", events),
        Route("/consumer/sessions/{key}/summary.csv", download),
    ]


def _share_plot(shares: dict[str, int], left_out: dict[str, str], title: str) -> str:
    """:func:`plots.share_plot`, drawn once per recorded share (a record does not change; the
    main page shows the last summary's at every load)."""
    return _drawn_share(tuple(sorted(shares.items())), tuple(sorted(left_out.items())), title)


@functools.lru_cache(maxsize=64)
def _drawn_share(
    shares: tuple[tuple[str, int], ...], left_out: tuple[tuple[str, str], ...], title: str
) -> str:
    return plots.share_plot(dict(shares), dict(left_out), title=title)


@functools.lru_cache(maxsize=64)
def _drawn_curve(sizes: tuple[int, ...], mmd2: tuple[float, ...]) -> str:
    """:func:`plots.mmd_curve_plot` of a recorded session's curve, drawn once (a record does
    not change)."""
    return plots.mmd_curve_plot(
        list(sizes), list(mmd2), title="MMD² of the summary's first k points to your validation set"
    )


async def _with_status(response: Awaitable[Response], status: int) -> Response:
    done = await response
    done.status_code = status
    return done


async def _read_upload(upload: Any) -> tuple[bytes, str]:
    """An uploaded file's bytes and name (closed once read: its spooled temporary file is not
    left for the garbage collector); ``(b"", "")`` when the field holds no file."""
    if isinstance(upload, UploadFile):
        try:
            return await upload.read(), upload.filename or "validation"
        finally:
            await upload.close()
    return b"", ""


def _form_number(
    form: Any, field: str, label: str, kind: type[int] | type[float], *, default: str
) -> Any:
    """The number a form's ``field`` holds (``None`` when it is blank and ``default`` is "").

    Raises
    ------
    UserError
        If it is not a number of ``kind`` (:func:`~dpmarket.console.consumer.form_number`).
    """
    text = str(form.get(field, default)).strip() or default
    if not text:
        return None
    return form_number(text, field, label, kind, "20" if kind is int else "1e-4")


def _split(text: str) -> list[str]:
    return [t for t in (x.strip() for x in text.replace(";", ",").split(",")) if t]


# --------------------------------------------------------------------------------- owner
def _owner_routes(owner: OwnerConsole, page: Page) -> list[Route]:
    async def overview(request: Request) -> Response:
        try:
            view = await run_in_threadpool(owner.view)
        except FileNotFoundError as exc:
            return page(request, "missing.html", {"message": str(exc)}, 503)
        charges_svg = await run_in_threadpool(owner.charges_chart, view["entries"])
        return page(request, "owner.html", {"view": view, "charges_svg": charges_svg})

    return [Route("/owner", overview)]


# ------------------------------------------------------------------------------- curator
def _curator_routes(curator: CuratorConsole, page: Page) -> list[Route]:
    async def overview(request: Request) -> Response:
        try:
            view = await run_in_threadpool(curator.view)
        except FileNotFoundError as exc:
            return page(request, "missing.html", {"message": str(exc)}, 503)
        rate_svg = await run_in_threadpool(curator.rate_chart, view["rates"])
        return page(request, "curator.html", {"view": view, "rate_svg": rate_svg})

    return [Route("/curator", overview)]
