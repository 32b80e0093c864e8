"""The console's token: generated once, kept readable by the party's user only, required by every
page, compared in constant time; the browser's cookie is not the token but a session of the
console's process (new at each sign-in, ended by signing out and by a restart), scoped to the
console's secret path and named by its port; a state-changing request needs proof that it comes
from a page of the same sign-in. Served by the real application (Starlette's test client, no
network): an owner's console over an owner's data directory holding a real ledger."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import dpmarket.console.app as console_app
from dpmarket.console.app import create_app
from dpmarket.console.auth import TOKEN_FILE, ConsoleToken, cookie_name
from dpmarket.console.owner import OwnerConsole
from dpmarket.console.sessions import SignIns
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

OWNER = Identity("owner", "young")
PORT = 8470
COOKIE = cookie_name(PORT)
#: The console's own origin as the test client addresses it.
ORIGIN = "http://testserver"


def _owner_console(tmp_path: Path, **options: Any) -> tuple[TestClient, ConsoleToken]:
    """An owner's console (its ledger charged 1.5 ε once) and its token."""
    if not (tmp_path / "owner.sqlite3").exists():
        _charged_ledger(tmp_path)
    token = ConsoleToken.load_or_create(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, OWNER)
    app = create_app(party, OWNER, token, port=PORT, **options)
    return TestClient(app, follow_redirects=False), token


def _charged_ledger(tmp_path: Path) -> None:
    with OwnerLedger.create(tmp_path, OwnerPolicy()) as ledger:
        ledger.charge(
            session="s1",
            consumer="consumer:alice",
            curator="curator:curator",
            mechanism="relevance count",
            epsilon=1.5,
            delta=0.0,
            points=0,
        )


@pytest.fixture
def console(tmp_path: Path) -> tuple[TestClient, ConsoleToken]:
    return _owner_console(tmp_path)


def _signed_in(client: TestClient, token: ConsoleToken) -> str:
    """Sign ``client`` in (the address's form); return its session cookie."""
    signed = client.get(f"{token.prefix}/login?token={token.value}")
    cookie = client.cookies.get(COOKIE)
    assert signed.status_code == 303 and cookie is not None
    assert token.value not in cookie and len(cookie) >= 40
    return cookie


def _form_token(client: TestClient, path: str) -> str:
    """The form token a page of ``client``'s sign-in (or its anonymous sign-in form) carries."""
    page = client.get(path)
    assert page.status_code in (200, 503), page.status_code
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text[:500]
    return found.group(1)


def test_the_token_is_made_once_and_kept_for_the_party_only(tmp_path: Path) -> None:
    first = ConsoleToken.load_or_create(tmp_path)
    assert first.created and len(first.value) >= 40
    assert stat.S_IMODE(os.stat(tmp_path / TOKEN_FILE).st_mode) == 0o600
    again = ConsoleToken.load_or_create(tmp_path)
    assert not again.created and again.value == first.value
    os.chmod(tmp_path / TOKEN_FILE, 0o644)  # readable by others: refused, not used
    with pytest.raises(PermissionError, match="chmod 600"):
        ConsoleToken.load_or_create(tmp_path)


def test_every_page_needs_the_token(console: tuple[TestClient, ConsoleToken]) -> None:
    client, token = console
    base = token.prefix
    refused = client.get(f"{base}/owner")
    assert refused.status_code == 401 and "young" not in refused.text and "1.5" not in refused.text
    assert client.get(f"{base}/owner", headers={"Authorization": "Bearer nope"}).status_code == 401
    # The refusal names the sign-in page that exists (the root's /login is nothing, below).
    assert f"sign in at {base}/login " in refused.text
    assert client.get(f"{base}/login").status_code == 200
    page = client.get(f"{base}/owner", headers={"Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"] == f"{base}/login?next=/owner"
    bearer = {"Authorization": f"Bearer {token.value}"}
    shown = client.get(f"{base}/owner", headers=bearer)
    assert shown.status_code == 200 and "8.5" in shown.text  # ε left: 10 - 1.5
    assert client.get(f"{base}/consumer", headers=bearer).status_code == 404
    # Outside its secret path the console is nothing, even with the token: a program or page
    # that does not know the printed address learns neither the path nor the party.
    for path in ("/", "/owner", "/login", "/static/console.css", base[:-1] + "/owner"):
        elsewhere = client.get(path, headers=bearer)
        assert elsewhere.status_code == 404, path
        assert base not in elsewhere.text and "young" not in elsewhere.text


def test_signing_in_sets_a_cookie_scripts_cannot_read(
    console: tuple[TestClient, ConsoleToken],
) -> None:
    client, token = console
    base, own = token.prefix, {"Origin": ORIGIN}
    form = {"csrf": _form_token(client, f"{base}/login"), "next": "/owner"}
    wrong = client.post(f"{base}/login", data={**form, "token": "guess"}, headers=own)
    assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
    signed = client.post(f"{base}/login", data={**form, "token": token.value}, headers=own)
    assert signed.status_code == 303 and signed.headers["location"] == f"{base}/owner"
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"dpmarket_console_{PORT}=")
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert f"Path={base};" in cookie  # sent to this console's pages only
    assert token.value not in cookie  # the cookie is not the token
    assert client.get(f"{base}/owner").status_code == 200  # the cookie signs in now
    # No open redirect: a sign-in never sends the browser to another site.
    away = client.get(f"{base}/login?token={token.value}&next=//evil.example/x")
    assert away.headers["location"] == f"{base}/"


def test_the_cookie_is_no_bearer_token_and_its_name_is_the_consoles(tmp_path: Path) -> None:
    client, token = _owner_console(tmp_path)
    _signed_in(client, token)
    stolen = client.cookies.get(COOKIE)
    assert stolen is not None and stolen != token.value
    # A copy of the cookie (what another local server would have received) is no bearer token,
    # and a cookie of another name (another console's port) signs nothing in.
    fresh = TestClient(client.app, follow_redirects=False)
    assert (
        fresh.get(
            f"{token.prefix}/owner", headers={"Authorization": f"Bearer {stolen}"}
        ).status_code
        == 401
    )
    fresh.cookies.set(cookie_name(PORT + 1), stolen)
    assert fresh.get(f"{token.prefix}/owner").status_code == 401
    # Over HTTPS: Secure, and a __Secure- name no plain-HTTP server may set.
    https, _ = _owner_console(tmp_path, https=True)
    cookie = https.get(f"{token.prefix}/login?token={token.value}").headers["set-cookie"]
    assert cookie.startswith(f"__Secure-dpmarket_console_{PORT}=") and "; secure" in cookie.lower()


def test_every_response_forbids_framing_scripts_from_elsewhere_and_referrers(
    console: tuple[TestClient, ConsoleToken],
) -> None:
    client, token = console
    for response in (client.get(f"{token.prefix}/login"), client.get(f"{token.prefix}/owner")):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        # No referrer to another site (the login address holds the token); this origin's own
        # requests keep theirs, so that a browser sends their Origin (not "null").
        assert response.headers["referrer-policy"] == "same-origin"
        assert response.headers["x-frame-options"] == "DENY"


# ------------------------------------------------------------------ forged requests (CSRF)
#: A page on another port of the same host: the same *site* for SameSite cookies.
OTHER_PORT = "http://testserver:18555"


def test_a_state_changing_request_needs_this_origin_and_the_form_token(tmp_path: Path) -> None:
    client, token = _owner_console(tmp_path)
    _signed_in(client, token)
    logout = f"{token.prefix}/logout"
    good = {"csrf": _form_token(client, f"{token.prefix}/owner")}
    forged: list[tuple[dict[str, str], dict[str, str], str]] = [
        ({"Origin": OTHER_PORT}, good, "http://testserver:18555 (Origin)"),
        ({"Referer": OTHER_PORT + "/cats.html"}, good, "(Referer)"),
        ({"Origin": "null"}, good, "null (Origin)"),
        ({}, good, "no Origin, no Referer"),
        ({"Origin": ORIGIN, "Sec-Fetch-Site": "same-site"}, good, "same-site page"),
        ({"Origin": ORIGIN}, {}, "no csrf field"),
        ({"Origin": ORIGIN}, {"csrf": good["csrf"][:-1] + "x"}, "not this sign-in's form"),
    ]
    for headers, form, reason in forged:
        refused = client.post(logout, headers=headers, data=form)
        assert refused.status_code == 403, (headers, form)
        assert reason in refused.text and "nothing was done" in refused.text
        assert "set-cookie" not in refused.headers  # still signed in
        assert client.get(f"{token.prefix}/owner").status_code == 200
    # The console's own page: its origin (or its referrer) and its form's token.
    for headers in (
        {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"},
        {"Referer": f"{ORIGIN}{token.prefix}/owner"},
    ):
        done = client.post(logout, headers=headers, data=good)
        assert done.status_code == 303 and "Max-Age=0" in done.headers["set-cookie"]
        _signed_in(client, token)
        good = {"csrf": _form_token(client, f"{token.prefix}/owner")}
    # A program with the bearer token needs neither (no browser adds that header by itself).
    bearer = client.post(logout, headers={"Authorization": f"Bearer {token.value}"})
    assert bearer.status_code == 303


def test_without_the_check_a_page_on_another_port_signs_the_browser_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same forged request, the defence off, acts (here: signs out)."""
    monkeypatch.setattr(console_app, "guarded", lambda endpoint, token, sessions: endpoint)
    client, token = _owner_console(tmp_path)
    _signed_in(client, token)
    forged = client.post(f"{token.prefix}/logout", headers={"Origin": OTHER_PORT})
    assert forged.status_code == 303 and "Max-Age=0" in forged.headers["set-cookie"]


def test_a_head_request_with_a_form_submits_nothing(tmp_path: Path) -> None:
    """``HEAD`` passes the forgery checks as a safe method, so it must not submit: a ``HEAD``
    with a summary's, a quote's or a ranking's multipart form and the cookie alone (what a
    stranger sent with curl) is the form's address opened (303 to the form), and nothing is
    asked of the console's party. The control: the same form in a ``POST`` with the console's
    proofs reaches it."""
    from dpmarket.console.consumer import ConsumerConsole
    from dpmarket.consumer.client import CuratorClient

    client_of_curator = CuratorClient(
        "127.0.0.1:9", TransportSecurity.plaintext(), timeout=1.0, connect_timeout=None
    )
    party = ConsumerConsole(client_of_curator, tmp_path, None)
    asked: list[str] = []

    def record(name: str) -> Any:
        def called(*args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            raise console_app.UserError(f"{name} reached")

        return called

    for name in ("start_summary", "quote", "rank"):
        setattr(party, name, record(name))
    token = ConsoleToken.load_or_create(tmp_path)
    consumer = Identity("consumer", "alice")
    client = TestClient(create_app(party, consumer, token, port=PORT), follow_redirects=False)
    _signed_in(client, token)
    upload = {"validation": ("val.csv", b"a,b\n1,2\n", "text/csv")}
    for page in ("summary", "quote", "rank"):
        head = client.request(
            "HEAD", f"{token.prefix}/consumer/{page}", files=upload, data={"p": "5"}
        )
        assert head.status_code == 303 and head.headers["location"].endswith(
            {"summary": "#request", "quote": "#request", "rank": "#rank"}[page]
        )
    assert asked == []
    good = {"csrf": _form_token(client, f"{token.prefix}/consumer"), "p": "5"}
    posted = client.post(
        f"{token.prefix}/consumer/quote", headers={"Origin": ORIGIN}, files=upload, data=good
    )
    assert posted.status_code == 400 and asked == ["quote"]  # the control: a POST reaches it


# ------------------------------------------------------------- sign-in sessions (red team)
def test_a_cookie_copied_before_signing_out_is_refused_after(tmp_path: Path) -> None:
    """Signing out ends the session in the console, not only in the browser: a copy of the
    cookie (what a server squatting the console's old port received) opens nothing after."""
    client, token = _owner_console(tmp_path)
    copied = _signed_in(client, token)
    thief = TestClient(client.app, follow_redirects=False)
    thief.cookies.set(COOKIE, copied)
    assert thief.get(f"{token.prefix}/owner").status_code == 200  # control: before, it works
    good = {"csrf": _form_token(client, f"{token.prefix}/owner")}
    out = client.post(f"{token.prefix}/logout", headers={"Origin": ORIGIN}, data=good)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    refused = thief.get(f"{token.prefix}/owner")
    assert refused.status_code == 401 and "8.5" not in refused.text
    # Every sign-in gets its own session: a new one is neither the old cookie nor revived by it.
    again = _signed_in(client, token)
    assert again != copied and thief.get(f"{token.prefix}/owner").status_code == 401
    assert client.get(f"{token.prefix}/owner").status_code == 200


def test_a_restarted_console_refuses_the_cookies_of_the_one_before(tmp_path: Path) -> None:
    """The same token (so the same secret path) in a new process: its sessions start empty."""
    before, token = _owner_console(tmp_path)
    cookie = _signed_in(before, token)
    assert before.get(f"{token.prefix}/owner").status_code == 200  # control: the same process
    after, same = _owner_console(tmp_path)  # a new application, as a restarted console makes
    assert same.prefix == token.prefix
    after.cookies.set(COOKIE, cookie)
    refused = after.get(f"{token.prefix}/owner", headers={"Accept": "text/html"})
    assert refused.status_code == 303 and "/login" in refused.headers["location"]
    # Its user signs in again with the token (the browser replaces the cookie).
    after.cookies.clear()
    _signed_in(after, token)
    assert after.get(f"{token.prefix}/owner").status_code == 200


def test_the_sign_in_pages_form_token_authorizes_nothing_of_a_session(tmp_path: Path) -> None:
    """The anonymous sign-in form (anyone who knows the address may load it) and another
    sign-in's pages carry form tokens that authorize no request of this session's cookie."""
    client, token = _owner_console(tmp_path)
    stranger = TestClient(client.app, follow_redirects=False)
    anonymous = _form_token(stranger, f"{token.prefix}/login")
    other = TestClient(client.app, follow_redirects=False)
    _signed_in(other, token)
    others = _form_token(other, f"{token.prefix}/owner")
    _signed_in(client, token)
    own = _form_token(client, f"{token.prefix}/owner")
    assert len({anonymous, others, own}) == 3
    logout = f"{token.prefix}/logout"
    for forged, whose in ((anonymous, "anonymous"), (others, "another sign-in's")):
        refused = client.post(logout, headers={"Origin": ORIGIN}, data={"csrf": forged})
        assert refused.status_code == 403, whose
        assert "not this sign-in's form token" in refused.text
        assert client.get(f"{token.prefix}/owner").status_code == 200  # still signed in
    # The control: this session's own page's token does it.
    done = client.post(logout, headers={"Origin": ORIGIN}, data={"csrf": own})
    assert done.status_code == 303 and client.get(f"{token.prefix}/owner").status_code == 401
    # The anonymous form token is what a sign-in needs, and that is all it is good for.
    signed = stranger.post(
        f"{token.prefix}/login",
        headers={"Origin": ORIGIN},
        data={"csrf": anonymous, "token": token.value, "next": "/owner"},
    )
    assert signed.status_code == 303 and stranger.get(f"{token.prefix}/owner").status_code == 200


def test_sessions_expire_unused_and_are_bounded() -> None:
    now = [0.0]
    sessions = SignIns(idle_seconds=10.0, capacity=2, clock=lambda: now[0])
    first = sessions.issue()
    now[0] = 9.0
    assert sessions.touch(first)  # used: its idle time starts again
    now[0] = 18.0
    assert sessions.touch(first)
    now[0] = 28.5
    assert not sessions.touch(first) and len(sessions) == 0  # 10.5 s unused: ended
    a, b = sessions.issue(), sessions.issue()
    assert sessions.touch(a)  # b is now the least recently used
    c = sessions.issue()
    assert sessions.touch(a) and sessions.touch(c) and not sessions.touch(b)
    assert not sessions.touch("") and not sessions.touch(None) and len(sessions) == 2
    with pytest.raises(ValueError, match="idle_seconds"):
        SignIns(idle_seconds=0)


def test_without_session_bound_form_tokens_the_sign_in_pages_token_signs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: one form token for every visitor (as before sessions), and the token
    anyone reads on the sign-in page acts with a signed-in browser's cookie."""
    monkeypatch.setattr(SignIns, "form_token", lambda self, session: "one-for-all")
    client, token = _owner_console(tmp_path)
    anonymous = _form_token(TestClient(client.app), f"{token.prefix}/login")
    _signed_in(client, token)
    forged = client.post(
        f"{token.prefix}/logout", headers={"Origin": ORIGIN}, data={"csrf": anonymous}
    )
    assert forged.status_code == 303 and client.get(f"{token.prefix}/owner").status_code == 401


def test_a_cookie_of_the_same_name_from_another_server_does_not_sign_the_browser_out(
    tmp_path: Path,
) -> None:
    """Another local server may set a cookie of the console's name on ``Path=/`` (ports do not
    separate cookies); the browser then sends both, the console's own first. Every value is
    tried, so the junk one signs nothing out. Control: the junk alone signs nothing in, and
    a parser that keeps one value of a repeated name (Starlette's keeps the last) loses the
    session."""
    client, token = _owner_console(tmp_path)
    session = _signed_in(client, token)
    client.cookies.clear()
    page = f"{token.prefix}/owner"
    for header in (f"{COOKIE}={session}; {COOKIE}=junk", f"{COOKIE}=junk; {COOKIE}={session}"):
        assert client.get(page, headers={"Cookie": header}).status_code == 200, header
    junk = client.get(page, headers={"Cookie": f"{COOKIE}=junk", "Accept": "text/html"})
    assert junk.status_code == 303 and "/login" in junk.headers["location"]
    from starlette.requests import cookie_parser

    assert cookie_parser(f"{COOKIE}={session}; {COOKIE}=junk")[COOKIE] == "junk"
