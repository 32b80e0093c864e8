"""The console's token: generated once, kept readable by the party's user only, required by every
page, compared in constant time, carried by a cookie scripts cannot read and other sites cannot
send. Served by the real application (Starlette's test client, no network): an owner's console
over an owner's data directory holding a real ledger."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from dpmarket.console.app import create_app
from dpmarket.console.auth import COOKIE, TOKEN_FILE, ConsoleToken
from dpmarket.console.owner import OwnerConsole
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

OWNER = Identity("owner", "young")


@pytest.fixture
def console(tmp_path: Path) -> tuple[TestClient, ConsoleToken]:
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
    token = ConsoleToken.load_or_create(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, OWNER)
    return TestClient(create_app(party, OWNER, token), follow_redirects=False), token


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
    refused = client.get("/owner")
    assert refused.status_code == 401 and "young" not in refused.text and "1.5" not in refused.text
    assert client.get("/owner", headers={"Authorization": "Bearer nope"}).status_code == 401
    page = client.get("/owner", headers={"Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/owner"
    shown = client.get("/owner", headers={"Authorization": f"Bearer {token.value}"})
    assert shown.status_code == 200 and "8.5" in shown.text  # ε left: 10 - 1.5
    assert (
        client.get("/consumer", headers={"Authorization": f"Bearer {token.value}"}).status_code
        == 404
    )


def test_signing_in_sets_a_cookie_scripts_cannot_read(
    console: tuple[TestClient, ConsoleToken],
) -> None:
    client, token = console
    wrong = client.post("/login", data={"token": "guess", "next": "/owner"})
    assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
    signed = client.post("/login", data={"token": token.value, "next": "/owner"})
    assert signed.status_code == 303 and signed.headers["location"] == "/owner"
    cookie = signed.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert client.get("/owner").status_code == 200  # the cookie carries the token now
    # No open redirect: a sign-in never sends the browser to another site.
    away = client.get(f"/login?token={token.value}&next=//evil.example/x")
    assert away.headers["location"] == "/"


def test_every_response_forbids_framing_scripts_from_elsewhere_and_referrers(
    console: tuple[TestClient, ConsoleToken],
) -> None:
    client, _ = console
    for response in (client.get("/login"), client.get("/owner")):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-frame-options"] == "DENY"
