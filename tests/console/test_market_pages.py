"""The market's panels of the console, served by the real application (Starlette's test client,
no network): an owner's earnings (a statement signed by a curator key, checked against the
owner's real ledger and recorded by :class:`~dpmarket.owner.earnings.Earnings`) and prices; the
consumer's statements page and quote action, whose POST goes through the same origin and form
token checks as every other."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.testclient import TestClient

from dpmarket.common.errors import DPMarketError
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    SessionRecord,
    SettlementTerms,
    settle,
    sign_statement,
)
from dpmarket.common.market.terms import MarketTerms, session_quote
from dpmarket.console import plots
from dpmarket.console.app import create_app
from dpmarket.console.auth import ConsoleToken
from dpmarket.console.consumer import ConsumerConsole, in_form_terms
from dpmarket.console.owner import OwnerConsole
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.explore import Query
from dpmarket.consumer.history import SessionHistory
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.transport import TransportSecurity

PORT = 8471
ORIGIN = "http://testserver"
#: 0.01 per point read, 0.05 per point delivered, 2 per unit of ε, a 1-credit minimum.
PRICES = OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)
OWNERS = ("young", "senior")
CURATOR, CONSUMER = "curator:curator", "consumer:alice"
SID = "9663fef5ac6196908c073ec1c659183d"


def _earning_ledger(data_dir: Path) -> None:
    """The young owner's ledger: one session charged (18 points read, ε 1) and its statement
    recorded; without a reward the delivered price is paid on the points read up to p (18 of
    p = 20: the summary's 6 are not stated), so 0.18 + 0.90 + 2.00 = 3.08 credits."""
    settlement = SettlementTerms(summary_size=20, validation_size=40)
    quoted = session_quote(
        dict.fromkeys(OWNERS, PRICES), dict.fromkeys(OWNERS, 60), 1.0, settlement
    )
    records = {"young": SessionRecord(18, 6, 1.0), "senior": SessionRecord(30, 14, 1.0)}
    statement = settle(SID, CONSUMER, quoted, dict.fromkeys(OWNERS, PRICES), records)
    key = ec.generate_private_key(ec.SECP256R1())
    with OwnerLedger.create(data_dir, OwnerPolicy(prices=PRICES)) as ledger:
        ledger.charge(session=SID, consumer=CONSUMER, curator=CURATOR, mechanism="candidates",
                      epsilon=1.0, delta=0.0, points=18)  # fmt: skip
        earnings = Earnings(ledger, "young")
        earnings.accept(
            curator=CURATOR,
            session=SID,
            consumer=CONSUMER,
            market=MarketTerms.of(quoted, "young", settlement),
            prices=PRICES,
        )
        part = statement.for_owner("young")
        earnings.record(
            part.encode(), sign_statement(part, key), curator=CURATOR, curator_key=key.public_key()
        )


def test_the_owner_sees_its_earnings_and_prices(tmp_path: Path) -> None:
    _earning_ledger(tmp_path)
    owner = Identity("owner", "young")
    token = ConsoleToken.load_or_create(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, owner)
    client = TestClient(create_app(party, owner, token, port=PORT), follow_redirects=False)
    page = client.get(f"{token.prefix}/owner", headers={"Authorization": f"Bearer {token.value}"})
    assert page.status_code == 200
    earnings = page.text.split('id="earnings"', 1)[1].split("</section>", 1)[0]
    assert re.search(r'id="earned-total">3\.08<', earnings), earnings
    row = re.search(r"<tbody>\s*<tr>(.*?)</tr>", earnings, flags=re.DOTALL)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    # recorded at, session, consumer, read, delivered, ε, charge, reward, total
    assert cells[1:] == [SID[:8], "alice", "18", "18", "1", "3.08", "0.00", "3.08"], cells
    assert "senior" not in page.text  # another owner's line is not in this owner's statement
    prices = page.text.split('id="prices"', 1)[1].split("</section>", 1)[0]
    assert "<dt>per raw point read</dt><dd>0.01</dd>" in prices
    assert "<dt>per unit of ε</dt><dd>2.00</dd>" in prices
    assert "<dt>minimum per session</dt><dd>1.00</dd>" in prices


def test_an_owner_without_statements_says_so(tmp_path: Path) -> None:
    with OwnerLedger.create(tmp_path, OwnerPolicy()):
        pass
    owner = Identity("owner", "young")
    token = ConsoleToken.load_or_create(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, owner)
    client = TestClient(create_app(party, owner, token, port=PORT), follow_redirects=False)
    page = client.get(f"{token.prefix}/owner", headers={"Authorization": f"Bearer {token.value}"})
    assert page.status_code == 200
    assert 'id="earned-total">0.00<' in page.text and "No statement recorded yet" in page.text


def _charges_chart(page: str) -> str:
    """The owner page's charges chart, its matplotlib ids (random per drawing) made one."""
    svg = page.split('id="charges"', 1)[1].split("</section>", 1)[0]
    svg = svg[svg.index("<svg") : svg.rindex("</svg>") + 6]
    return re.sub(r"\b([a-z])[0-9a-f]{10}\b", r"\1-id", svg)


def test_the_owners_chart_is_drawn_once_per_change_of_its_ledger(tmp_path: Path) -> None:
    """The charges chart was drawn on every fetch (most of the page's server time): it is kept
    by its numbers, so a fetch with no new charge shows the kept drawing (the same object) and
    a new charge a new one; each is what a fresh drawing of the ledger shows."""
    _earning_ledger(tmp_path)
    owner = Identity("owner", "young")
    token = ConsoleToken.load_or_create(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, owner)
    client = TestClient(create_app(party, owner, token, port=PORT), follow_redirects=False)
    headers = {"Authorization": f"Bearer {token.value}"}

    def drawn_afresh() -> tuple[str, str]:
        entries = party.view()["entries"]
        numbers = ([e["at"] for e in entries], [e["epsilon"] or 0.0 for e in entries],
                   [e["points"] for e in entries])  # fmt: skip
        title = "charges to young's ledger over time (UTC)"
        kept = plots.charges_plot(*numbers, title=title)
        assert plots.charges_plot(*numbers, title=title) is kept  # not drawn again
        fresh = cast(Any, plots.charges_plot).__wrapped__(*numbers, title=title)
        return _charges_chart(f'id="charges"{kept}'), _charges_chart(f'id="charges"{fresh}')

    first = _charges_chart(client.get(f"{token.prefix}/owner", headers=headers).text)
    again = _charges_chart(client.get(f"{token.prefix}/owner", headers=headers).text)
    kept, fresh = drawn_afresh()
    assert first == again == kept == fresh
    with OwnerLedger(tmp_path, None) as ledger:
        ledger.charge(session="0" * 32, consumer=CONSUMER, curator=CURATOR, mechanism="candidates",
                      epsilon=0.5, delta=0.0, points=7)  # fmt: skip
    after = _charges_chart(client.get(f"{token.prefix}/owner", headers=headers).text)
    assert after != first  # the control: a new charge is drawn
    kept, fresh = drawn_afresh()
    assert after == kept == fresh


# ------------------------------------------------------------------------------ consumer
CONSUMER_PORT = 8472


def _consumer_console(tmp_path: Path) -> tuple[TestClient, ConsoleToken]:
    """A consumer's console whose curator is not there (a real client of a closed port: the
    checks under test come before any call, and a call fails at once)."""
    client = CuratorClient(
        "127.0.0.1:9", TransportSecurity.plaintext(), timeout=0.5, connect_timeout=None
    )
    consumer = Identity("consumer", "alice")
    party = ConsumerConsole(client, tmp_path, None)
    token = ConsoleToken.load_or_create(tmp_path)
    app = create_app(party, consumer, token, port=CONSUMER_PORT)
    return TestClient(app, follow_redirects=False), token


def test_a_quote_without_the_form_token_is_refused(tmp_path: Path) -> None:
    client, token = _consumer_console(tmp_path)
    base = token.prefix
    assert client.get(f"{base}/login?token={token.value}").status_code == 303  # signed in
    page = client.get(f"{base}/consumer")  # 503: no curator, but the form is there
    assert 'formaction="' + base + '/consumer/quote"' in page.text
    assert 'name="max_cost"' in page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    fields = {"p": "10", "max_cost": "a lot"}
    for headers, form in (
        ({"Origin": ORIGIN}, fields),  # no form token
        ({"Origin": "http://testserver:18555"}, {**fields, "csrf": found.group(1)}),
    ):
        refused = client.post(f"{base}/consumer/quote", headers=headers, data=form)
        assert refused.status_code == 403 and "nothing was done" in refused.text
    # The control: the page's own form token and origin reach the quote, which names the bad
    # field (before it would read the file or ask the curator).
    done = client.post(
        f"{base}/consumer/quote",
        headers={"Origin": ORIGIN},
        data={**fields, "csrf": found.group(1)},
    )
    assert done.status_code == 400
    assert "Most it may cost (max_cost): &#39;a lot&#39; is not an amount of credits" in done.text


def test_the_statements_page_says_when_the_curator_does_not_answer(tmp_path: Path) -> None:
    client, token = _consumer_console(tmp_path)
    page = client.get(
        f"{token.prefix}/consumer/statements", headers={"Authorization": f"Bearer {token.value}"}
    )
    assert page.status_code == 503
    assert "the curator did not answer" in page.text and "Not read." in page.text
    # Without the token: nothing.
    assert client.get(f"{token.prefix}/consumer/statements").status_code == 401


def test_a_summary_with_a_malformed_cap_is_refused_before_anything_is_asked(
    tmp_path: Path,
) -> None:
    client, token = _consumer_console(tmp_path)
    bearer = {"Authorization": f"Bearer {token.value}"}
    for cap, why in (("-1", ">= 0"), ("1.0000001", "at most six decimals")):
        refused = client.post(
            f"{token.prefix}/consumer/summary", headers=bearer, data={"p": "10", "max_cost": cap}
        )
        assert refused.status_code == 400
        text = html.unescape(refused.text)
        assert f"Most it may cost (max_cost): '{cap}' is not an amount of credits" in text
        assert why in text
        # What was entered is shown again (but the file, which the page asks for again), and
        # the page's script brings the error into sight under the form's own address.
        assert f'name="max_cost" inputmode="decimal" placeholder="no cap" value="{cap}"' in text
        assert 'name="p" min="1" value="10"' in text
        assert 'data-in-sight data-address="' + token.prefix + '/consumer#request"' in text
        assert "choose your file again" in text
    # The control: the form as first shown has none of it.
    first = html.unescape(client.get(f"{token.prefix}/consumer", headers=bearer).text)
    assert 'placeholder="no cap" value=""' in first and "data-in-sight" not in first
    assert "choose your file again" not in first
    assert not any((tmp_path / "sessions").glob("*"))  # nothing recorded


def test_a_session_whose_record_lacks_an_epsilon_figure_shows_a_dash(tmp_path: Path) -> None:
    """A uniform session releases no Theorem 7 / PLD epsilon: its page shows "—" where a
    private session shows its figures (it answered 500 when a figure was missing)."""
    client, token = _consumer_console(tmp_path)
    history = SessionHistory(tmp_path)
    uniform = history.record(
        status="done",
        source="request",
        method="uniform",
        summary_size=3,
        session_id="0123456789abcdef",
        result={"epsilon": {"validation": {}, "owners": {}}, "points_per_owner": {"a": 3}},
    )
    private = history.record(
        status="done",
        source="request",
        method="private",
        summary_size=3,
        session_id="fedcba9876543210",
        result={
            "epsilon": {
                "validation": {"theorem7": 0.5, "pld": 0.25},
                "owners": {"theorem7": 1.5, "pld": 1.25},
            },
            "points_per_owner": {"a": 3},
        },
    )
    headers = {"Authorization": f"Bearer {token.value}"}
    page = client.get(f"{token.prefix}/consumer/sessions/{uniform.key}", headers=headers)
    assert page.status_code == 200
    assert _epsilon_rows(page.text) == {
        "your validation set": ["—"] * 4,
        "each owner's data": ["—"] * 4,
    }
    control = client.get(f"{token.prefix}/consumer/sessions/{private.key}", headers=headers)
    assert control.status_code == 200
    rows = _epsilon_rows(control.text)
    assert rows["your validation set"][0::2] == ["0.25", "0.5"]  # PLD, Theorem 7
    assert rows["each owner's data"][0::2] == ["1.25", "1.5"]


def _epsilon_rows(page: str) -> dict[str, list[str]]:
    """The session page's ε table: per party, its cells (PLD ε, its δ, Theorem 7 ε, its δ)."""
    table = page.split('id="session-epsilon"', 1)[1].split("</table>", 1)[0]
    rows = {}
    for row in re.findall(r"<tr><td>(.*?)</tr>", table, flags=re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        rows[html.unescape(re.sub(r"<[^>]+>", "", row.split("</td>", 1)[0]))] = cells
    return rows


def test_a_sessions_two_epsilon_figures_read_as_two_accountings_not_an_overrun(
    tmp_path: Path,
) -> None:
    """The tutorial's candidates session: PLD ε 1.000003, Theorem 7 ε 1.3137 for the same
    releases on the validation set. The page read "ε ... (Theorem 7 / PLD): 1.314 / 1", which
    a newcomer read as 1.314 spent of a budget of 1."""
    client, token = _consumer_console(tmp_path)
    figures = {"theorem7": 1.3137166030177894, "pld": 1.000002870822393,
               "delta_total": 2.999997e-06, "delta_tilde": 1e-06}  # fmt: skip
    record = SessionHistory(tmp_path).record(
        status="done",
        source="request",
        method="candidates",
        summary_size=20,
        session_id="f7512f7c04c6aa",
        result={"epsilon": {"validation": figures, "owners": {**figures, "theorem7": 0.0,
                                                               "pld": 0.0}}},
    )  # fmt: skip
    page = client.get(
        f"{token.prefix}/consumer/sessions/{record.key}",
        headers={"Authorization": f"Bearer {token.value}"},
    )
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "1.314 / 1" not in text  # the old "x / y" that read as spent / budget
    # Each figure under its own name and δ; the note says they are one guarantee.
    assert _epsilon_rows(page.text)["your validation set"] == ["1", "1e-06", "1.314", "3e-06"]
    assert "Two accountings of the same releases, not two charges and not a budget" in text


def test_a_form_error_names_the_forms_fields_not_the_clis_options(tmp_path: Path) -> None:
    """A question the explorer refuses is refused in the CLI's words ("--where"); the form has no
    such option: the console's message names its field."""
    client, token = _consumer_console(tmp_path)
    bearer = {"Authorization": f"Bearer {token.value}"}
    posted = client.post(
        f"{token.prefix}/consumer/explore", headers=bearer, data={"query": "count", "csrf": "x"}
    )  # the form's answer is at an address of its own (its fields, not the form token)
    assert posted.status_code == 303
    assert posted.headers["location"] == f"{token.prefix}/consumer/explore?query=count"
    assert client.get(posted.headers["location"]).status_code == 401  # no token, no answer
    refused = client.get(posted.headers["location"], headers=bearer)
    assert refused.status_code == 400
    text = html.unescape(refused.text)
    assert "a count needs at least one range predicate (the form's “Count predicates (where)”)" in (
        text
    )
    assert "--where" not in text
    # The control: the explorer's own message, as the CLI prints it, names the option.
    with pytest.raises(DPMarketError, match=r"\(--where\)"):
        Query("count")
    # Every option a curator's message may name for a summary form's field.
    assert in_form_terms("raise --max-cost, ask for fewer points (--min-owners N)") == (
        "raise the form's “Most it may cost (max_cost)”, ask for fewer points "
        "(the form's “Fewest owners (min_owners)” N)"
    )
    assert in_form_terms("--pki-dir is kept") == "--pki-dir is kept"  # no such field


def test_the_owner_consoles_warm_up_reads_its_page_and_survives_no_ledger(
    tmp_path: Path,
) -> None:
    """``start_warming`` reads the page once in the background: with a ledger, the chart it
    draws is the one the first fetch shows; before the owner's first start (no ledger), it
    ends quietly (an exception in the thread would fail this test: pytest reports it)."""
    owner = Identity("owner", "young")
    empty = OwnerConsole(tmp_path / "none", TransportSecurity.plaintext(), None, owner)
    empty.start_warming().join(timeout=30)
    _earning_ledger(tmp_path)
    party = OwnerConsole(tmp_path, TransportSecurity.plaintext(), None, owner)
    warming = party.start_warming()
    warming.join(timeout=30)
    assert not warming.is_alive()
    token = ConsoleToken.load_or_create(tmp_path)
    client = TestClient(create_app(party, owner, token, port=PORT), follow_redirects=False)
    page = client.get(f"{token.prefix}/owner", headers={"Authorization": f"Bearer {token.value}"})
    assert page.status_code == 200 and "charges to young" in page.text


def test_a_session_says_which_program_gave_its_id(tmp_path: Path) -> None:
    """A session the console started named ``dpmarket consumer request`` as the program that
    printed its id; it says the console started it (the control: a request's record keeps
    naming the command)."""
    client, token = _consumer_console(tmp_path)
    headers = {"Authorization": f"Bearer {token.value}"}
    history = SessionHistory(tmp_path)
    for source, said, unsaid in (
        ("console", "the session this console started", "consumer request</code> printed"),
        ("request", "<code>dpmarket consumer request</code> printed", "this console started"),
    ):
        record = history.record(
            status="done", source=source, method="uniform", summary_size=3,
            session_id=f"{source}-0123456789", result={"points_per_owner": {"a": 3}},
        )  # fmt: skip
        page = client.get(f"{token.prefix}/consumer/sessions/{record.key}", headers=headers)
        assert page.status_code == 200
        assert said in page.text and unsaid not in page.text, source
