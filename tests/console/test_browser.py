"""The tutorial, run as written, and each party's console in a real headless Chromium on its
deployment.

One deployment (docs/tutorial.md's every command but its last, ``dpmarket down``, in a fresh
directory: three clinics, a curator and a consumer over mTLS, one summary asked with ``dpmarket
request``, the clinics' sketches, the CAPE jobs; its last command runs, and must succeed, once
the consoles are done), checked as the tutorial says (its output, the young clinic's ledger as the
commands left it), one console per role
(``dpmarket console --config PARTY.toml``, the consumer's, the young clinic's and the curator's,
each a process on its own certificate) and one browser (Debian's Chromium, driven by Playwright;
never a browser Playwright downloads), signed in once to each console (one context per role, in
which each test opens its pages; the tests about signing in and cookies make their own), serve
every test. Pages are checked on their content, as a newcomer reads them: the clinic's remaining
budget equals what its own ledger says, the last summary's per-owner share equals the consumer's
record, a catalogue answer comes with its interval.
Each role's main page is saved as a screenshot into docs/ (docs/howto-console.md shows them).
Against another local web server (a stranger's, on another port of 127.0.0.1: the same site for
the browser's cookies): its page cannot make the consumer's console start a summary or answer a
form, and it never receives a console's cookie, while the consumer's and the clinic's consoles
stay signed in side by side.
"""

from __future__ import annotations

import csv
import html
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpmarket.common.market.money import credits_text
from dpmarket.consumer.history import SessionHistory
from dpmarket.curator.store import CuratorRecords
from dpmarket.owner.cli import short_session
from dpmarket.owner.earnings import Earnings
from dpmarket.owner.ledger import LedgerEntry, OwnerLedger
from tests.console.clinics import (
    BEFORE_DOWN,
    SIGN_IN,
    environment,
    run_last_blocks,
    run_tutorial,
    stop,
)

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("DPMARKET_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Seconds a console may take to print its address (it imports the whole CLI on a busy machine).
START_SECONDS = 120.0
#: Milliseconds a summary started from the console may take (a safety net, not a timing
#: assertion).
SUMMARY_MS = 180_000


@dataclass
class Console:
    """A running console: its process, address and token."""

    role: str
    process: subprocess.Popen[str]
    url: str
    token: str

    @property
    def origin(self) -> str:
        """``scheme://host:port``, without the console's secret path."""
        return self.url.rsplit("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The console's secret path (``/`` and 22 characters)."""
        return "/" + self.url.rsplit("/", 1)[1]

    def get(self, path: str, token: str | None = None) -> tuple[int, str]:
        """GET ``path`` as a program would (``Authorization: Bearer``), without a browser."""
        return self.send(urllib.request.Request(self.url + path), token)

    def post(self, path: str, fields: dict[str, str], token: str) -> tuple[int, str]:
        """POST ``fields`` as a multipart form, as a program would (bearer token)."""
        boundary = uuid.uuid4().hex
        body = (
            "".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                for k, v in fields.items()
            )
            + f"--{boundary}--\r\n"
        )
        request = urllib.request.Request(self.url + path, data=body.encode("utf-8"))
        request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
        return self.send(request, token)

    def post_file(self, path: str, fields: dict[str, str], upload: Path) -> tuple[int, str]:
        """POST ``fields`` and the file ``upload`` (as ``validation``), as a program would."""
        boundary = uuid.uuid4().hex
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items()
        ]
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="validation"; '
            f'filename="{upload.name}"\r\nContent-Type: text/csv\r\n\r\n'.encode()
            + upload.read_bytes()
            + b"\r\n"
        )
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        request = urllib.request.Request(self.url + path, data=body)
        request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
        return self.send(request, self.token)

    def send(self, request: urllib.request.Request, token: str | None) -> tuple[int, str]:
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8")


def _spawn(deployment: Path, config: str) -> subprocess.Popen[str]:
    command = ["console", "--config", str(deployment / config)]
    return subprocess.Popen(
        [sys.executable, "-m", "dpmarket.deploy.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )


def _address(process: subprocess.Popen[str], role: str) -> Console:
    """The console's address and token, from the sign-in line it prints when it starts."""
    assert process.stdout is not None
    deadline = time.monotonic() + START_SECONDS
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = SIGN_IN.search(line)
        if found:
            return Console(role, process, found.group(1), found.group(2))
    process.kill()
    raise AssertionError(f"the {role} console printed no address:\n{''.join(lines)}")


@dataclass(frozen=True)
class TutorialRun:
    """The tutorial's commands but its last, as they left the deployment: the script's output,
    the consumer's ``summary.csv``, and the young clinic's ledger (read before any console acts:
    a console's summary is charged to it too)."""

    clinics: Path
    done: subprocess.CompletedProcess[str]
    summary: pd.DataFrame
    spent_epsilon: float
    entries: list[LedgerEntry]


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TutorialRun]:
    """docs/tutorial.md's every block but its last in a fresh directory, one ``bash -euo
    pipefail`` script; the last block, ``dpmarket down clinics``, at the module's end, where its
    failure fails the module (the consoles' deployment serves every test meanwhile: one run of
    the tutorial's commands serves both its own check and the consoles')."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's chromium (deploy/chromium.sh, as root; "
            "make test does) or set DPMARKET_CHROMIUM"
        )
    root = tmp_path_factory.mktemp("console")
    clinics = root / "clinics"
    try:
        done = run_tutorial(root, BEFORE_DOWN)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with OwnerLedger(clinics / "owners" / "young", None) as ledger:
            spent, entries = ledger.window_totals(), ledger.entries()
        summary = pd.read_csv(root / "summary.csv")
    except BaseException:
        stop(clinics)
        raise
    yield TutorialRun(clinics, done, summary, spent.epsilon, entries)
    ended = run_last_blocks(root, BEFORE_DOWN)
    if ended.returncode != 0:
        stop(clinics)
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr[-3000:]


@pytest.fixture(scope="module")
def deployment(tutorial: TutorialRun) -> Path:
    return tutorial.clinics


@pytest.fixture(scope="module")
def consoles(deployment: Path) -> Iterator[dict[str, Console]]:
    started: dict[str, Console] = {}
    configs = {"consumer": "consumer.toml", "owner": "owner-young.toml", "curator": "curator.toml"}
    processes = {role: _spawn(deployment, config) for role, config in configs.items()}
    try:
        for role, process in processes.items():  # they start at once; each prints its line
            started[role] = _address(process, role)
        yield started
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def signed_in(browser: Any, consoles: dict[str, Console]) -> Iterator[dict[str, Any]]:
    """One browser context per role, signed in once by the console's printed address (the
    tests' pages open in it: the console's cookie is the context's)."""
    contexts = {}
    for role, console in consoles.items():
        contexts[role] = browser.new_context(viewport={"width": 1280, "height": 900})
        page = contexts[role].new_page()
        page.goto(f"{console.url}/login?token={console.token}")
        page.wait_for_url(f"{console.url}/{role}")
        page.close()
    try:
        yield contexts
    finally:
        for context in contexts.values():
            context.close()


@pytest.fixture
def opened(signed_in: dict[str, Any]) -> Iterator[Callable[..., Any]]:
    """``opened(console, width=1280)``: a new page in the role's signed-in context (closed
    after the test)."""
    pages: list[Any] = []

    def open_page(console: Console, width: int = 1280) -> Any:
        page = signed_in[console.role].new_page()
        if width != 1280:
            page.set_viewport_size({"width": width, "height": 900})
        pages.append(page)
        return page

    try:
        yield open_page
    finally:
        for page in pages:
            page.close()


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(DOCS / name), full_page=True)


# -------------------------------------------------------------------------------- tutorial
def test_every_command_of_the_tutorial_runs_on_a_fresh_directory(tutorial: TutorialRun) -> None:
    """Every ``sh`` block of docs/tutorial.md ran, in order, in a fresh directory, with real
    processes (so the document cannot drift from the product); the last, ``dpmarket down``, runs
    and is checked at the module's end (:func:`tutorial`)."""
    done, summary = tutorial.done, tutorial.summary
    assert list(summary.columns)[-3:] == ["progression", "high", "owner"] and len(summary) == 20
    assert set(summary["owner"]) <= {"young", "middle", "senior"}
    # What the tutorial says the young clinic spent: 1 (the allocation's sketch, published by
    # `up`) + 0 (the summary: split by that sketch, no noisy count since `up` publishes it)
    # + 3 (its HIST, RFF and marginals sketches) + 3 (CAPE).
    assert tutorial.spent_epsilon == pytest.approx(7.0, abs=1e-5)
    entries = tutorial.entries
    sketches = [e for e in entries if e.mechanism.startswith("private sketch")]
    assert [e.epsilon for e in sketches][:3] == [1.0, 1.0, 1.0]  # the allocation's, HIST, RFF
    summary_charges = [e for e in entries if "candidates" in e.mechanism]
    assert summary_charges and sum(e.epsilon for e in summary_charges) == 0.0
    said = " ".join((done.stdout + done.stderr).split())
    assert "published the allocation sketch clinics-allocation/rff, charged epsilon 1" in said
    assert "allocation: sketch (the owners' published sketches; no charge to them)" in said
    # The count came with its interval from the sketch its last line names, as the tutorial
    # says: the narrowest of the half-widths listed (the marginals sketch's among them, or the
    # histogram's when every clinic measured the pair).
    assert "95 % interval" in done.stdout
    chosen, widths = answered_from(said)  # (explore says it on stderr)
    assert "clinics/marginals" in widths and "clinics/hist" in widths, widths
    assert widths[chosen] == min(widths.values()), (chosen, widths)
    assert "left" in done.stdout or "left" in done.stderr


def answered_from(output: str) -> tuple[str, dict[str, float]]:
    """The spec a best-available answer names on its last line and the mean half-width it
    lists per spec (``answered from clinics/hist: narrowest ... (mean half-width: clinics/hist
    0.273, clinics/marginals 0.5; ...)``)."""
    found = re.search(r"answered from (\S+): narrowest .*?\(mean half-width: ([^;)]*)", output)
    assert found, output[-2000:]
    widths = {}
    for part in found.group(2).split(","):
        name, width = part.split()
        widths[name] = float(width)
    return found.group(1), widths


# ---------------------------------------------------------------------------------- tokens
def test_a_request_without_the_token_is_refused(consoles: dict[str, Console], browser: Any) -> None:
    for console in consoles.values():
        page_path = f"/{console.role}"
        status, body = console.get(page_path)
        assert status == 401, (console.role, status)
        assert "token" in body and "young" not in body and "SERVING" not in body
        assert console.get(page_path, token="not-the-token")[0] == 401
        assert console.get(page_path, token=console.token)[0] == 200
    # In a browser: the login form, a wrong token refused, the right one lets in; the cookie is
    # not readable by scripts.
    owner = consoles["owner"]
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{owner.url}/owner")
    assert page.url.startswith(f"{owner.url}/login")
    assert page.locator("h1").inner_text() == "Sign in to this console"
    page.fill("input[name=token]", "guess")
    page.click("button[type=submit]")
    assert "That is not this console's token." in page.content()
    assert "Budget" not in page.content()
    page.fill("input[name=token]", owner.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{owner.url}/owner")
    assert page.locator("h1").inner_text() == "Owner young"
    assert page.evaluate("document.cookie") == ""
    context.close()


# -------------------------------------------------------------------------------- consumer
def test_the_consumer_finds_its_last_summarys_share_and_the_catalogue(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["consumer"])
    page.goto(f"{consoles['consumer'].url}/consumer")
    # The last summary (the tutorial's `dpmarket request`, recorded in the consumer's data
    # directory): each owner's share as the record has it.
    (last,) = SessionHistory(deployment / "consumer").entries(limit=1)
    share = page.locator("#last-share tbody tr")
    shown = {row.locator("td").nth(0).inner_text(): row.locator("td").nth(1).inner_text()
             for row in share.all()}  # fmt: skip
    assert shown == {o: str(n) for o, n in last.points_per_owner.items()}
    assert sum(last.points_per_owner.values()) == 20
    assert page.locator("#last-summary svg.plot").count() == 1
    # The catalogue: every clinic's three sketches and the allocation's sketch `up` published,
    # ε 1 each, with their age.
    rows = page.locator("#sketches tbody tr").all()
    listed = {
        (r.locator("td").nth(0).inner_text(), r.locator("td").nth(1).inner_text()) for r in rows
    }
    assert listed == {
        (o, spec)
        for o in ("young", "middle", "senior")
        for spec in ("clinics/hist", "clinics/rff", "clinics/marginals", "clinics-allocation/rff")
    }
    assert {r.locator("td").nth(2).inner_text() for r in rows} == {"1"}
    _shot(page, "console-consumer.png")


def test_the_forms_offer_only_published_sketches(
    consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["consumer"])
    page.goto(f"{consoles['consumer'].url}/consumer")
    # The tutorial's sketches.toml declares clinics/race, which no clinic publishes: the
    # catalogue's specs say so, and no form offers it (it would answer nothing).
    declared = page.locator("#catalogue details li", has_text="clinics/race")
    assert "not published by any owner" in (declared.text_content() or "")
    offered = page.locator("#explore select[name=spec] option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert "clinics/race" not in offered
    assert {"clinics/hist", "clinics/rff", "clinics/marginals"} <= set(offered)
    # The control: the same catalogue lists the declared spec (what the form offered before).
    specs = page.locator("#catalogue details li").all_text_contents()
    assert any(t.startswith("clinics/race") for t in specs)


def test_a_cli_session_shows_under_one_id_with_its_mmd_curve(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    # The tutorial's `dpmarket consumer request`, recorded in the consumer's data directory.
    (record,) = [
        r for r in SessionHistory(deployment / "consumer").entries() if r.source == "request"
    ]
    assert record.session_id and record.mmd_curve["sizes"][-1] == 20
    consumer = consoles["consumer"]
    page = opened(consumer)
    page.goto(f"{consumer.url}/consumer")
    link = page.locator("#sessions a", has_text=record.session_id[:8])
    assert link.count() == 1
    link.click()
    page.wait_for_selector("#session")
    # One id: the list's is the session page's, and the page gives the whole id `request`
    # printed (`session ID created`); the control: the record's own key, a second name, is not
    # shown.
    assert page.locator("#session-id").inner_text() == record.session_id[:8]
    assert record.session_id in page.locator("#session").inner_text()
    assert record.key not in page.locator("main").inner_text()
    # The MMD curve of the CLI's summary, drawn from the record (not the "no curve" note).
    assert page.locator("#session svg.plot").count() == 2
    assert page.locator("#no-curve").count() == 0


def test_a_catalogue_answer_comes_with_its_interval(
    consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["consumer"])
    page.goto(f"{consoles['consumer'].url}/consumer")
    page.select_option("#explore select[name=query]", "mean")
    page.select_option("#explore select[name=column]", ["bmi"])
    page.click("#explore button[type=submit]")
    page.wait_for_selector("#answer-rows")
    cells = page.locator("#answer-rows tbody tr").first.locator("td")
    assert cells.nth(0).inner_text() == "bmi"
    estimate = float(cells.nth(1).inner_text())
    low, high = (float(x) for x in cells.nth(3).inner_text().strip("[]").split(","))
    # The interval is the chosen source's (a bootstrap percentile one for the marginals sketch
    # need not hold its estimate: the deployment's noise is fresh each run); a finite interval
    # of positive width beside a finite estimate is what the page must show.
    assert np.isfinite([estimate, low, high]).all() and low < high
    plot = page.locator("#answer svg.plot")
    assert plot.count() == 1 and "95 %" in plot.inner_html()


def test_a_count_answer_reads_in_records_as_the_cli_prints_it(
    consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["consumer"])
    page.goto(f"{consoles['consumer'].url}/consumer")
    page.select_option("#explore select[name=query]", "count")
    page.fill("#explore input[name=where]", "bmi>=30; high=1")
    page.click("#explore button[type=submit]")
    page.wait_for_selector("#answer-rows")
    rows = page.locator("#answer-rows tbody tr").all()
    cells = [[c.inner_text() for c in r.locator("td").all()] for r in rows]
    (count, fraction) = cells
    n = float(page.locator("#count-line").inner_text().rsplit("n ≈ ", 1)[1].rstrip("."))
    # The first row is the count, in records (the CLI's "count ≈ ..."): its interval reaches
    # beyond a fraction's [0, 1]; the second, the fraction it is n times.
    assert count[0].startswith("records with bmi >= 30 and high = 1")
    low, high = (float(x) for x in count[3].strip("[]").split(","))
    assert high > 1 and 0 <= low <= high <= n + 1  # (both as printed, rounded)
    # (n as the page prints it, to the record: within 0.5 of 400-odd records)
    assert float(count[1]) == pytest.approx(float(fraction[1]) * n, rel=5e-3)
    assert page.locator("#count-line").inner_text().startswith("Count ≈ ")
    # The control: the fraction row still reads in [0, 1] (what the page showed alone).
    flow, fhigh = (float(x) for x in fraction[3].strip("[]").split(","))
    assert 0 <= flow <= fhigh <= 1 and "(the fraction)" in fraction[0]


def test_answers_can_be_reopened_by_their_address(
    deployment: Path, consoles: dict[str, Console], browser: Any, opened: Callable[..., Any]
) -> None:
    consumer = consoles["consumer"]
    page = opened(consumer)
    page.goto(f"{consumer.url}/consumer")
    page.select_option("#explore select[name=query]", "cdf")
    page.select_option("#explore select[name=column]", ["bmi"])
    page.fill("#explore input[name=points]", "25, 30")
    page.click("#explore button[type=submit]")
    page.wait_for_selector("#answer-rows")
    # The question is in the address (a GET: it changes and charges nothing)...
    address = page.url
    assert address.startswith(f"{consumer.url}/consumer/explore?query=cdf")
    assert "column=bmi" in address and "csrf" not in address
    labels = page.locator("#answer-rows tbody td:first-child").all_inner_texts()
    assert labels == ["P[bmi <= 25]", "P[bmi <= 30]"]
    # ... so it reopens, in another tab too, with the same answer (was 405).
    other = page.context.new_page()
    response = other.goto(address)
    assert response is not None and response.status == 200
    assert other.locator("#answer-rows tbody td:first-child").all_inner_texts() == labels
    # A ranking (it reads an uploaded file): the POST redirects to the answer's own address.
    page.goto(f"{consumer.url}/consumer")
    page.set_input_files("#rank input[name=validation]", str(deployment.parent / "validation.csv"))
    page.click("#rank button[type=submit]")
    page.wait_for_url(f"{consumer.url}/consumer/rankings/*")
    owners = page.locator("table tbody tr td:nth-child(2)").all_inner_texts()
    assert sorted(owners) == ["middle", "senior", "young"]
    reopened = other.goto(page.url)
    assert reopened is not None and reopened.status == 200
    assert other.locator("table tbody tr td:nth-child(2)").all_inner_texts() == owners
    # A form's own address, opened: the form, not 405.
    for action, anchor in (("summary", "request"), ("quote", "request"), ("rank", "rank")):
        other.goto(f"{consumer.url}/consumer/{action}")
        assert other.url == f"{consumer.url}/consumer#{anchor}"
    # Without the console's cookie, an answer's address shows nothing (the token check holds).
    stranger_page = browser.new_context().new_page()
    stranger_page.goto(address)
    assert stranger_page.url.startswith(f"{consumer.url}/login?next=")  # the sign-in form
    assert "answer-rows" not in stranger_page.content()
    stranger_page.context.close()


def _in_sight(page: Any, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height


def _comes_in_sight(page: Any, selector: str) -> bool:
    """Whether ``selector`` is scrolled into the viewport within 10 s (the browser scrolls to
    the page's fragment once it has laid the page out: later than the element's appearance
    on a loaded machine)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            """sel => { const r = document.querySelector(sel).getBoundingClientRect();
                        return r.top >= 0 && r.bottom <= window.innerHeight; }""",
            arg=selector,
            timeout=10_000,
        )
    except PlaywrightTimeout:
        return False
    return _in_sight(page, selector)


def test_a_form_error_shows_in_sight_with_what_was_entered(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    consumer = consoles["consumer"]
    page = opened(consumer)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{consumer.url}/consumer")
    page.select_option("#explore select[name=query]", "count")
    page.fill("#explore input[name=where]", "bmi=>30")
    page.click("#explore button[type=submit]")
    page.wait_for_selector("#explore-error")
    assert _comes_in_sight(page, "#explore-error")
    assert page.input_value("#explore select[name=query]") == "count"
    assert page.input_value("#explore input[name=where]") == "bmi=>30"
    # The control: the error sits far down the page (where the reader was not looking).
    page.evaluate("window.scrollTo(0, 0)")
    assert not _in_sight(page, "#explore-error")
    # A summary form's error (a POST): in sight, the values kept but the file (the page says
    # to choose it again), and the address the form's own, so that a reload sends nothing.
    page.goto(f"{consumer.url}/consumer")
    page.set_input_files(
        "#request input[name=validation]", str(deployment.parent / "validation.csv")
    )
    page.fill("#request input[name=p]", "7")
    page.fill("#request input[name=max_cost]", "cheap")
    page.click("#quote-only")
    page.wait_for_selector("#summary-error")
    assert _comes_in_sight(page, "#summary-error")
    assert "max_cost" in page.locator("#summary-error").inner_text()
    assert page.input_value("#request input[name=p]") == "7"
    assert page.input_value("#request input[name=max_cost]") == "cheap"
    assert "choose your file again" in page.locator("#request").inner_text()
    assert page.url == f"{consumer.url}/consumer#request"
    page.reload()
    assert page.locator("#summary-error").count() == 0


def test_the_request_form_offers_only_the_methods_the_deployment_serves(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["consumer"])
    page.goto(f"{consoles['consumer'].url}/consumer")
    options = page.locator("#request select[name=method] option").evaluate_all(
        "options => options.map(o => [o.value, o.disabled])"
    )
    # The tutorial's clinics serve candidates (access.allow_steered_selection, set by init) and
    # uniform; their policies leave exact bids off, and the curator's leaves greedy out.
    assert dict(options) == {
        "candidates": False,
        "private": True,
        "greedy": True,
        "uniform": False,
        "rounds": True,
    }
    terms = page.locator("#method-terms")
    assert terms.get_attribute("open") is not None  # shown before anything is submitted
    private = terms.locator("li[data-method=private]").inner_text()
    assert "refused by" in private and "access.allow_exact_bids off" in private
    assert (
        "curator's policy does not serve it" in terms.locator("li[data-method=greedy]").inner_text()
    )
    # The form follows the fewest owners chosen (tests/console/test_request_form.py has owners
    # that differ): every clinic refuses exact bids, so private stays off at any number, while
    # candidates runs with 1 to 3 owners and not with more than the deployment has.
    candidates = terms.locator("li[data-method=candidates]")
    assert "would run with 3 of 3 owners (middle, senior, young)" in candidates.inner_text()
    for chosen, runs in (("1", True), ("4", False), ("0", True)):
        page.fill("#request input[name=min_owners]", chosen)
        disabled = page.locator("#request select[name=method] option").evaluate_all(
            "options => Object.fromEntries(options.map(o => [o.value, o.disabled]))"
        )
        assert disabled["candidates"] == (not runs) and disabled["private"], (chosen, disabled)
    page.fill("#request input[name=min_owners]", "4")
    assert "a request needing 4 would be refused" in candidates.inner_text()
    assert page.locator("#request select[name=method] option[value=candidates]").inner_text() == (
        "candidates (3 owners serve it)"
    )
    # The control: what the form no longer offers is what the deployment refuses. A private
    # request with the form's other defaults, sent by a program, is refused before anything
    # is released or charged; a candidates one is accepted.
    consumer = consoles["consumer"]
    with CuratorRecords(deployment / "curator") as records:
        before = len(records.sessions())
    status, body = consumer.post_file(
        "/consumer/summary",
        {"p": "5", "method": "private", "request_id": uuid.uuid4().hex},
        deployment.parent / "validation.csv",
    )
    assert status == 400 and "allow_exact_bids" in html.unescape(body)
    # And a candidates request needing more owners than there are, as the form said.
    status, body = consumer.post_file(
        "/consumer/summary",
        {"p": "5", "method": "candidates", "min_owners": "4", "request_id": uuid.uuid4().hex},
        deployment.parent / "validation.csv",
    )
    assert status == 400, (status, body[-500:])
    with CuratorRecords(deployment / "curator") as records:
        assert len(records.sessions()) == before


def test_the_consumer_sees_a_quote_without_running_anything_and_its_statements(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    consumer = consoles["consumer"]
    with CuratorRecords(deployment / "curator") as records:
        sessions_before = len(records.sessions())
    # What `dpmarket consumer statements` lists (the tutorial's summary, settled when it
    # ended), asked while the browser works (its interpreter starts in seconds).
    listing = subprocess.Popen(
        [sys.executable, "-m", "dpmarket.deploy.cli", "consumer", "statements", "--json",
         "--config", str(deployment / "consumer.toml")],
        env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    page = opened(consumer)
    page.goto(f"{consumer.url}/consumer")
    form = "#request"
    page.set_input_files(
        f"{form} input[name=validation]", str(deployment.parent / "validation.csv")
    )
    page.fill(f"{form} input[name=p]", "10")
    page.fill(f"{form} input[name=max_cost]", "5")
    page.click("#quote-only")
    page.wait_for_selector("#quote")
    lines = page.locator("#quote-lines tbody tr").all()
    assert {r.locator("td").nth(0).inner_text() for r in lines} == {"young", "middle", "senior"}
    assert page.locator("#quote-total").inner_text() == "0.00"  # the tutorial's clinics are free
    assert "within your cap of 5.00 credits" in page.locator("#quote").inner_text()
    with CuratorRecords(deployment / "curator") as records:
        assert len(records.sessions()) == sessions_before  # a quote runs nothing
    # The statements page lists what `dpmarket consumer statements` lists, with each one's
    # total cost.
    out, err = listing.communicate(timeout=120)
    assert listing.returncode == 0, err[-2000:]
    settled = json.loads(out)["statements"]
    assert settled
    page.goto(f"{consumer.url}/consumer/statements")
    rows = page.locator("#statements tbody tr[data-session]").all()
    shown = {r.get_attribute("data-session"): r.locator("td.total").inner_text() for r in rows}
    assert shown == {s["session_id"]: credits_text(s["total"]) for s in settled}


def test_a_summary_requested_from_the_console_shows_its_progress_and_result(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    consumer = consoles["consumer"]
    page = opened(consumer)
    page.goto(f"{consumer.url}/consumer")
    form = "#request"
    page.set_input_files(
        f"{form} input[name=validation]", str(deployment.parent / "validation.csv")
    )
    page.fill(f"{form} input[name=p]", "10")
    # Kernel γ left as the form offers it: the width suited to the file, which the curator
    # accepts (the method's own default, 0.1, it would refuse on these units).
    assert page.locator(f"{form} input[name=gamma]").input_value() == ""
    page.click(f"{form} button[type=submit]")
    # The progress page follows the session's events, then shows the result.
    page.wait_for_selector("#session", timeout=SUMMARY_MS)
    key = page.url.rsplit("/", 1)[-1]
    assert "done" in page.locator("#session h1").inner_text()
    assert page.locator("#session svg.plot").count() == 2  # share and MMD curve
    assert "MMD²" in page.locator("#session").inner_text()
    link = page.locator("#download")
    response = page.request.get(consumer.origin + link.get_attribute("href"))
    assert response.status == 200
    rows = list(csv.DictReader(io.StringIO(response.text())))
    assert len(rows) == 10 and {r["owner"] for r in rows} <= {"young", "middle", "senior"}
    record = next(
        r for r in SessionHistory(deployment / "consumer").entries() if r.session_id == key
    )
    assert record.source == "console" and sum(record.points_per_owner.values()) == 10
    counted = {o: sum(r["owner"] == o for r in rows) for o in record.points_per_owner}
    assert counted == record.points_per_owner


# ----------------------------------------------------------------------------------- owner
def test_the_clinic_finds_its_remaining_budget(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["owner"])
    page.goto(f"{consoles['owner'].url}/owner")
    with OwnerLedger(deployment / "owners" / "young", None) as ledger:
        left = ledger.remaining()
        sessions = {e.session for e in ledger.entries()}
    gauge = page.locator(".gauge[data-quantity=ε]")
    assert gauge.locator(".left strong").inner_text() == f"{left.epsilon:.6g}"
    assert left.epsilon < 10  # the tutorial's summary and sketches were charged
    assert page.locator("#health").inner_text() == "SERVING"
    text = page.locator("#sessions").inner_text()
    for session in sessions:
        assert short_session(session) in text
    assert "clinics/hist" in page.locator("#sketches").inner_text()
    assert "epsilon_total" in page.locator("#policy").inner_text()
    assert page.locator("#charges svg.plot").count() == 1
    # Its earnings as its own ledger recorded them (the tutorial's clinics are free: 0 credits).
    with OwnerLedger(deployment / "owners" / "young", None) as ledger:
        earned = Earnings(ledger, "young").all()
    total = credits_text(sum(e.total for e in earned))
    assert page.locator("#earned-total").inner_text() == total
    shown = page.locator("#earnings tbody").inner_text()
    for e in earned:
        assert short_session(e.session) in shown
    if not earned:
        assert "No statement recorded yet" in shown
    assert "per unit of ε" in page.locator("#prices").inner_text()
    _shot(page, "console-owner.png")


# --------------------------------------------------------------------------------- curator
def test_the_curator_sees_its_owners_sessions_and_catalogue(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    page = opened(consoles["curator"])
    page.goto(f"{consoles['curator'].url}/curator")
    owners = page.locator("#owners tbody tr").all()
    health = {
        r.locator("td").nth(0).inner_text(): r.locator(".badge").first.inner_text() for r in owners
    }
    assert health == {"young": "SERVING", "middle": "SERVING", "senior": "SERVING"}
    # The curator's own service holds a connected channel to each (its health service says so).
    assert {r.locator(".badge.link").inner_text() for r in owners} == {"connected"}
    with CuratorRecords(deployment / "curator") as records:
        stored = records.sessions()
    text = page.locator("#sessions").inner_text()
    for session in stored:
        assert session["id"][:8] in text
    assert len(page.locator("#catalogue tbody tr").all()) == 12  # 3 clinics x 4 sketches
    assert page.locator("#rates svg.plot").count() == 1
    # Nothing of a summary's points nor of an owner's ledger.
    assert "owner.sqlite3" not in page.content()
    _shot(page, "console-curator.png")


# ---------------------------------------------------------------------------- boundaries
def test_a_consumers_console_cannot_show_another_partys_data(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    consumer = consoles["consumer"]
    page = opened(consumer)
    for path in ("/owner", "/curator"):
        response = page.goto(consumer.url + path)
        assert response.status == 404
        assert "Budget" not in page.content() and "Owners" not in page.content()
    # Its token opens no other console, and the owner's console has no consumer page.
    for other in ("owner", "curator"):
        assert consoles[other].get(f"/{other}", token=consumer.token)[0] == 401
    assert consoles["owner"].get("/consumer", token=consoles["owner"].token)[0] == 404
    # The consumer's pages hold nothing of the clinic's ledger: no ledger path, no ε left.
    page.goto(consumer.url + "/consumer")
    content = page.content()
    assert "owner.sqlite3" not in content and "left ·" not in content


def test_every_main_page_reads_on_a_phone(
    consoles: dict[str, Console], opened: Callable[..., Any]
) -> None:
    for console in consoles.values():
        page = opened(console, width=390)
        paths = [f"/{console.role}"]
        if console.role == "consumer":
            paths.append("/consumer/statements")
        for path in paths:
            page.goto(console.url + path)
            overflow = page.evaluate("document.documentElement.scrollWidth")
            assert overflow <= 390, (path, overflow)
            size = page.evaluate("parseFloat(getComputedStyle(document.body).fontSize)")
            assert size >= 14


# ------------------------------------------------------------ another local web server
@dataclass
class Stranger:
    """A web server on another port of 127.0.0.1 (the same *site* as the consoles: cookies and
    SameSite ignore ports): it serves the pages it is given and notes every Cookie header."""

    url: str
    pages: dict[str, str] = field(default_factory=dict)
    cookies: list[str] = field(default_factory=list)


@pytest.fixture
def stranger() -> Iterator[Stranger]:
    seen = Stranger("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.cookies.append(self.headers.get("Cookie") or "")
            body = seen.pages.get(self.path, "<h1>cute cats</h1>").encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    seen.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def _forging_page(consumer: Console, validation: str) -> str:
    """A page that makes a signed-in browser start summaries and ask the catalogue: three
    multipart ``no-cors`` fetches with the browser's credentials (as a form would, without a
    preflight), one to the console's address without its secret path, then a form submitted
    to the console's explore page. It knows the console's secret path (the worst case)."""
    target = json.dumps(consumer.url)
    bare = json.dumps(consumer.origin)
    csv_text = json.dumps(validation)
    return f"""<!doctype html><html><body><h1>cute cats</h1><pre id=log></pre>
<form id=f method=post action="{consumer.url}/consumer/explore">
<input name=query value=mean><input name=column value=bmi></form>
<script>
const send = (base, i) => {{
  const fd = new FormData();
  fd.append('request_id', 'forged-' + i + '-' + Date.now());
  fd.append('validation', new Blob([{csv_text}], {{type: 'text/csv'}}), 'v.csv');
  fd.append('p', '5'); fd.append('method', 'candidates'); fd.append('gamma', '1e-4');
  fd.append('csrf', 'a guess');
  return fetch(base + '/consumer/summary',
               {{method: 'POST', mode: 'no-cors', credentials: 'include', body: fd}});
}};
Promise.allSettled([send({target}, 0), send({target}, 1), send({target}, 2), send({bare}, 3)])
  .then(() => {{ document.getElementById('log').textContent = 'sent';
                document.getElementById('f').submit(); }});
</script></body></html>"""


def test_a_page_on_another_port_cannot_make_the_console_act(
    deployment: Path, consoles: dict[str, Console], opened: Callable[..., Any], stranger: Stranger
) -> None:
    consumer = consoles["consumer"]
    validation = (deployment.parent / "validation.csv").read_text(encoding="utf-8")
    stranger.pages["/cats.html"] = _forging_page(consumer, validation)
    with CuratorRecords(deployment / "curator") as records:
        sessions_before = len(records.sessions())
    history_before = len(SessionHistory(deployment / "consumer").entries())
    page = opened(consumer)
    forged: list[Any] = []
    page.on("request", lambda r: forged.append(r) if r.method == "POST" else None)
    page.goto(f"{stranger.url}/cats.html")
    page.wait_for_url(f"{consumer.url}/consumer/explore")  # the form's navigation
    page.wait_for_load_state()
    # The answer to the form: refused, and no answer shown.
    assert "403: refused, nothing was done" in page.content()
    assert "it comes from " + stranger.url in page.content()
    assert "answer-rows" not in page.content()
    # The control: each forged request to the console's secret path was signed in (the browser
    # attached the console's cookie, as SameSite lets a same-site page make it do): the console
    # answered 403 (signed in, refused by the origin check), not 401 (no cookie). Without the
    # check, they were the consumer's own requests. The bare address gets no cookie: 404.
    seen = []
    for request in forged:
        response = request.response()
        seen.append((request.url, response.status if response is not None else None))
    summary = f"{consumer.url}/consumer/summary"
    assert sorted(seen) == sorted(
        [(summary, 403)] * 3
        + [(f"{consumer.origin}/consumer/summary", 404)]
        + [(f"{consumer.url}/consumer/explore", 403)]
    ), seen
    # Nothing was started: no session at the curator, none in the consumer's records.
    with CuratorRecords(deployment / "curator") as records:
        assert len(records.sessions()) == sessions_before
    assert len(SessionHistory(deployment / "consumer").entries()) == history_before


def test_another_local_server_never_receives_a_consoles_cookie(
    consoles: dict[str, Console], browser: Any, stranger: Stranger
) -> None:
    consumer, owner = consoles["consumer"], consoles["owner"]
    context = browser.new_context()
    page = context.new_page()
    for console in (consumer, owner):  # both consoles, one browser: the tutorial's way
        page.goto(f"{console.url}/login?token={console.token}")
        page.wait_for_url(f"{console.url}/{console.role}")
    for path in ("/", "/innocent-link", "/consumer", "/owner"):
        page.goto(stranger.url + path)
    assert len(stranger.cookies) >= 4
    assert not any("dpmarket_console" in c for c in stranger.cookies), stranger.cookies
    # Both consoles still signed in (one cookie each, named by port, each under its own path).
    page.goto(f"{consumer.url}/consumer")
    assert page.locator("h1").first.inner_text().startswith("Consumer")
    page.goto(f"{owner.url}/owner")
    assert page.locator("h1").inner_text() == "Owner young"
    jar = {c["name"]: c for c in context.cookies() if c["name"].startswith("dpmarket_console_")}
    assert len(jar) == 2
    assert {c["path"] for c in jar.values()} == {consumer.prefix, owner.prefix}
    # What a copy of a cookie is worth to a program: nothing (it is not the token).
    for cookie in jar.values():
        assert cookie["value"] not in (consumer.token, owner.token) and cookie["httpOnly"]
        for console in (consumer, owner):
            assert console.get(f"/{console.role}", token=cookie["value"])[0] == 401
    # The control: a cookie of 127.0.0.1 with Path=/ (as the console's was) reaches the stranger.
    context.add_cookies([{"name": "dpmarket_console_probe", "value": "x", "domain": "127.0.0.1",
                          "path": "/", "httpOnly": True, "sameSite": "Strict"}])  # fmt: skip
    page.goto(stranger.url + "/innocent-link")
    assert "dpmarket_console_probe=x" in stranger.cookies[-1]
    context.close()


def test_a_form_error_names_the_field_and_the_value(consoles: dict[str, Console]) -> None:
    consumer = consoles["consumer"]
    cases = {
        "/consumer/summary": ({"p": "abc"}, "Points (p): 'abc' is not a whole number"),
        "/consumer/explore": (
            {"query": "cdf", "column": "bmi", "points": "25, abc"},
            "CDF thresholds (points): 'abc' is not a number",
        ),
    }
    for path, (fields, message) in cases.items():
        status, body = consumer.post(path, fields, consumer.token)
        assert status == 400, (path, status)
        assert message in html.unescape(body) and "invalid literal" not in body
    gamma = {"p": "10", "gamma": "fast", "min_owners": "1.5"}
    status, body = consumer.post("/consumer/summary", gamma, consumer.token)
    assert status == 400 and "Kernel γ (gamma): 'fast' is not a number" in html.unescape(body)
