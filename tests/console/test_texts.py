"""The console's words: the pages name flags, counts and sources as the CLI does, say what a
figure is, and show no figure that is not one (templates rendered as the application renders
them, :func:`dpmarket.console.app.console_templates`)."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from starlette.requests import Request

from dpmarket.console.app import console_templates
from dpmarket.console.consumer import _how, _why, count_row
from dpmarket.consumer.catalogue import RANK_FLAG_NAMES, Exploration, noisy_count_text
from dpmarket.consumer.cli import _print_answer, _print_explored
from dpmarket.consumer.explore import Answer, Flag, Query, _logreg_reason
from dpmarket.runtime.identity import Identity

BASE = "/k3y"


def _render(name: str, **context: Any) -> str:
    templates = console_templates(Identity("consumer", "alice"), BASE)
    scope = {"type": "http", "method": "GET", "path": f"{BASE}/consumer", "headers": []}
    page = templates.get_template(name).render(
        request=Request(scope), role="consumer", form_token="t", now=0.0, **context
    )
    return html.unescape(page)


def _row(owner: str, rank: int, flags: list[dict[str, str]]) -> dict[str, Any]:
    return {"rank": rank, "owner": owner, "value": 0.01, "interval": [0.0, 0.02],
            "epsilon": 1.0, "n": 400.0, "covers": "the noise", "flags": flags}  # fmt: skip


def test_a_ranking_names_its_flags_as_rank_owners_does() -> None:
    reason = "its order against senior (difference +0.001 ± 0.002) is within the noise"
    flag = {"code": "order_not_resolved", "reason": reason, "on": "value"}
    rows = [_row("young", 1, [{**flag, "name": RANK_FLAG_NAMES[flag["code"]]}]), _row("old", 2, [])]
    page = _render("ranking.html", ranking={"spec": "s/rff", "validation_points": 40,
                                            "rows": rows}, svg="", file="v.csv")  # fmt: skip
    assert "tie?" in page and f'title="{reason}"' in page  # the tooltip
    assert "tie? (young)" in page and reason in page  # the legend
    assert "order_not_resolved" not in page  # the internal code, shown before


def test_a_ranking_shows_each_owners_rank_range_and_which_pairs_are_resolved() -> None:
    """As ``rank-owners`` prints them: a rank range where the resolved pairs leave several
    ranks (``1–2``), one rank where they leave one, and the line naming the resolved pairs.
    Control: a row without a range (the page before) shows its point-estimate rank."""
    rows = [
        {**_row("young", 1, []), "rank_interval": [1, 2]},
        {**_row("middle", 2, []), "rank_interval": [1, 2]},
        {**_row("old", 3, []), "rank_interval": [3, 3]},
    ]
    said = "resolved (each pair's difference's 95 % interval excludes 0): young < old"
    ranking = {"spec": "s/rff", "validation_points": 40, "rows": rows, "resolution": said}
    page = _render("ranking.html", ranking=ranking, svg="", file="v.csv")
    cells = re.findall(r'<tr[^>]*><td class="n">([^<]*)</td>', page)
    assert cells == ["1–2", "1–2", "3"], cells
    assert said in page
    alone = {"spec": "s/rff", "validation_points": 40, "rows": [_row("young", 1, [])]}
    plain = _render("ranking.html", ranking=alone, svg="", file="v.csv")
    assert re.findall(r'<tr[^>]*><td class="n">([^<]*)</td>', plain) == ["1"]


def _answer(**row: Any) -> dict[str, Any]:
    base_row = {"label": "cov(age, bmi)", "value": 0.0, "standard_error": 0.0, "flags": [],
                "interval": [-1146.0, 1146.0], "basis": "bounds", "covers": "x"}  # fmt: skip
    return {"title": "covariance of young", "spec": "clinics/hist", "source": "histogram",
            "n": 412.3, "reason": "the only sketch", "rows": [{**base_row, **row}],
            "count": None, "bases": []}  # fmt: skip


def test_an_answer_says_what_its_n_is_and_shows_no_standard_error_for_a_guess() -> None:
    guess = {"code": "model-guess", "on": "value", "reason": "the independence guess"}
    page = _render("explore.html", answer=_answer(flags=[guess]), svg="", question={})
    text = re.sub(r"<[^>]+>", "", page)
    assert "From clinics/hist (histogram), n ≈ 412 (the noisy record count" in text
    assert "— (guess)" in page and "[-1146, 1146]" in page and "model-guess" in page
    assert '<td class="n">0</td>' not in page  # no "± 0" beside the interval
    # The control: an estimate (no guess) shows its standard error.
    plain = _render("explore.html", answer=_answer(standard_error=0.25), svg="", question={})
    assert '<td class="n">0.25</td>' in plain and "(guess)" not in plain


def test_the_source_is_not_named_twice() -> None:
    assert _how("clinics/hist (histogram)", "clinics/hist") == "histogram"
    assert _how("clinics/hist (graphical model)", "clinics/hist") == "graphical model"
    assert _how("something else", "clinics/hist") == "something else"
    # The page's sentence reads "From clinics/hist (histogram), n ≈ 295 (...): <why>".
    why = "clinics/hist: narrowest 95 % interval, honestly compared"
    assert _why(why, "clinics/hist") == "narrowest 95 % interval, honestly compared"
    assert _why(why, "clinics/m2m") == why  # another sketch's name stays


def test_a_negative_noisy_count_shows_as_0_with_its_release() -> None:
    assert noisy_count_text(129.4) == "129"
    assert noisy_count_text(-20.4) == "0 (released -20)"
    assert noisy_count_text(0.0) == "0"


def test_the_header_names_the_party_once() -> None:
    """The tutorial's consumer is named "consumer": its header read "consumer consumer"."""
    scope = {"type": "http", "method": "GET", "path": f"{BASE}/consumer", "headers": []}

    def header(identity: Identity) -> str:
        page = (
            console_templates(identity, BASE)
            .get_template("base.html")
            .render(request=Request(scope), role=identity.role, form_token="t", now=0.0)
        )
        found = re.search(r'<span class="who"[^>]*>(.*?)</span>', page)
        assert found is not None
        return re.sub(r"<[^>]+>", "", found.group(1))

    assert header(Identity("consumer", "consumer")) == "consumer"
    assert header(Identity("consumer", "alice")) == "consumer alice"  # the control: role and name


def test_flag_texts_write_plus_minus() -> None:
    text = _logreg_reason(True, 5)
    assert "± 1.96 ×" in text and "-+" not in text


def test_explore_prints_no_standard_error_for_a_guess_either(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``dpmarket consumer explore``'s table says what the page says of a guessed value."""
    query = Query("covariance", columns=("age", "bmi"))
    guess = (Flag("model-guess", "the independence guess", "value"),)
    for flags, shown in (((guess,), "— (guess)"), (((),), "0.25")):  # the control: an estimate
        answer = Answer(query, ("cov(age, bmi)",), np.array([0.0]), {},
                        errors=np.array([0.25 if not flags[0] else 0.0]),
                        columns=(("age", "bmi"),), flags=flags,
                        low=np.array([-1146.0]), high=np.array([1146.0]))  # fmt: skip
        _print_answer(answer, "cov")
        printed = capsys.readouterr().out
        assert shown in printed, printed


def _count_answer(guessed: bool) -> Answer:
    """A count of ``bmi>=30`` whose fraction is the independence guess (or, the control, an
    estimate with its standard error)."""
    flags = (Flag("model-guess", "the independence guess", "value"),) if guessed else ()
    query = Query("count", where=(("bmi", 30.0, float("inf")),))
    return Answer(query, ("P[bmi>=30]",), np.array([0.0]),
                  {"count": 0.0, "n": 295.0, "count_standard_error": 15.4,
                   "count_interval": (0.0, 120.0)},
                  errors=np.array([0.0 if guessed else 0.05]), columns=(("bmi",),),
                  flags=(flags,), low=np.array([0.0]), high=np.array([0.4]))  # fmt: skip


@pytest.mark.parametrize("guessed", [True, False])
def test_a_guessed_counts_headline_shows_no_plus_minus(
    guessed: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guessed count's headline read "Count ≈ 0.0 ± 15.4" while its table said "— (guess)":
    the console's and ``consumer explore``'s headlines show the value, the flag and the
    interval, no ± (the control: an estimate keeps its ±)."""
    answer = _count_answer(guessed)
    count = count_row(answer.rows()[0], answer.extra)
    page = _render("explore.html", answer={**_answer(), "count": count}, svg="", question={})
    line = re.sub(r"<[^>]+>", "", page.split('id="count-line">', 1)[1].split("</p>", 1)[0])
    found = Exploration(None, "r", (SimpleNamespace(owner="young"),), answer, 295.0)  # type: ignore[arg-type]
    _print_explored(found, "count", "count")
    printed = " ".join(capsys.readouterr().err.split("count ≈", 1)[1].split())  # unwrapped
    for headline in (line, printed):
        assert ("±" not in headline) == guessed, headline
        assert ("model-guess" in headline) == guessed, headline
        assert "95 % interval [0.0, 120.0]" in headline, headline


def test_explore_and_rank_owners_print_bracketed_labels_as_they_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A CDF's label ``P[price <= 0]`` printed as ``P`` in ``consumer explore``'s table (a
    stranger's report: rich read ``[price <= 0]`` as a style tag, so thresholds and counts could
    not be told apart), and an owner named ``[b]`` vanished from ``rank-owners``. The control:
    rich's default console drops the same label."""
    from rich.console import Console

    from dpmarket.consumer.cli import _print_ranking

    query = Query("cdf", columns=("price",), points=(0.0, 60000.0))
    labels = ("P[price <= 0]", "P[price <= 60000]")
    answer = Answer(query, labels, np.array([0.0, 0.1]), {}, errors=np.array([0.01, 0.02]),
                    columns=(("price",), ("price",)), flags=((), ()),
                    low=np.array([0.0, 0.05]), high=np.array([0.02, 0.15]))  # fmt: skip
    _print_answer(answer, "cdf of price")
    printed = capsys.readouterr().out
    assert all(label in printed for label in labels), printed

    flag = {"code": "order_not_resolved", "reason": "within [the] noise", "on": "value"}
    rows = [{**_row("[b]", 1, [flag]), "n_interval": [380.0, 420.0], "rank_interval": [1, 1]}]
    _print_ranking({"ranking": rows}, "ranking", "no pair of owners is resolved (0 of 0)")
    printed = "".join(capsys.readouterr())  # the table on stdout, the reasons on stderr
    assert "│ [b]" in printed and "[b]: within [the] noise" in printed, printed

    Console(width=80).print("P[price <= 0]")
    assert capsys.readouterr().out.strip() == "P"  # the control
