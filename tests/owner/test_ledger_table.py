"""``dpmarket owner ledger`` fits an 80-column terminal; ``--wide`` keeps every column whole.

The tutorial's ledger, read as it told a newcomer to, wrapped ids and mechanisms four characters a
line. The tables are rendered here by rich at the terminal's width, as a terminal shows them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from dpmarket.owner.cli import _charges_table, ledger_report, short_mechanism, short_session
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import OwnerPolicy

#: What the tutorial's young clinic records: a candidates session, its sketches, CAPE jobs.
CHARGES = [
    (
        "9663fef5ac6196908c073ec1c659183d",
        "consumer:consumer",
        "candidates-counts; relevance count",
        1.0,
        0,
    ),
    ("9663fef5ac6196908c073ec1c659183d", "consumer:consumer", "raw points (candidates)", 0.0, 18),
    (
        "sketch:clinics/hist:ff1fac687d77526a",
        "catalogue:clinics/hist",
        "private sketch (HIST, Laplace)",
        1.0,
        0,
    ),
    (
        "sketch:clinics/rff:b18c7cd746e442c9",
        "catalogue:clinics/rff",
        "private sketch (RFF, Laplace)",
        1.0,
        0,
    ),
    (
        "cape-0b7c5e1d2f3a4b5c6d7e8f9a0b1c2d3e",
        "consumer:a-consumer-with-a-long-name",
        "CAPE mean (Gaussian, zero-sum noise by secure aggregation)",
        1.0,
        0,
    ),
]


def _render(renderable: Any, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _report(tmp_path: Path) -> dict[str, Any]:
    with OwnerLedger.create(tmp_path, OwnerPolicy()) as ledger:
        for session, consumer, mechanism, epsilon, points in CHARGES:
            ledger.charge(
                session=session,
                consumer=consumer,
                curator="curator:curator",
                mechanism=mechanism,
                epsilon=epsilon,
                delta=1e-7 if "CAPE" in mechanism else 0.0,
                points=points,
            )
        return ledger_report(ledger)


def test_the_default_table_fits_80_columns_without_cutting_a_value(tmp_path: Path) -> None:
    text = _render(_charges_table(_report(tmp_path)), 80)
    lines = text.splitlines()
    assert "…" not in text, text
    assert max(len(line.rstrip()) for line in lines) <= 80, text
    # Every charge on a line of its own, its short session id on that line (nothing wraps it).
    for session, _, mechanism, _, _ in CHARGES:
        assert any(short_session(session) in line for line in lines), session
        assert short_mechanism(mechanism).split(" ")[0] in text
    assert "9663fef5ac61" not in text  # ids are short


def test_the_wide_table_keeps_every_column_whole(tmp_path: Path) -> None:
    text = _render(_charges_table(_report(tmp_path), wide=True), 250)
    for session, consumer, mechanism, _, _ in CHARGES:
        assert session in text and consumer in text and mechanism in text
    assert "curator:curator" in text


def test_abbreviations() -> None:
    assert short_mechanism("private sketch (HIST, Laplace)") == "sketch (HIST, Lap.)"
    assert short_mechanism("raw points (candidates)") == "points (cand.)"
    assert short_session("sketch:clinics/rff:b18c7cd746e442c9") == "clinics/rff"
    assert short_session("9663fef5ac6196908c073ec1c659183d") == "9663fef5"
