"""Another party's text is kept as one line of at most 500 characters
(:mod:`dpmarket.common.texts`)."""

from __future__ import annotations

import pytest

from dpmarket.common.ids import short_id
from dpmarket.common.texts import peer_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("refused: d=9000 exceeds 4096", "refused: d=9000 exceeds 4096"),
        ("a\nb\r\x1b[31mred\x00\u2028c\x85", "a\\nb\\r\\x1b[31mred\\x00\\u2028c\\x85"),
        ("é ünïcode ✓ stays", "é ünïcode ✓ stays"),
        ("ok\u202egnp.exe\u2066x\u200b\ufeff\xad", "ok\\u202egnp.exe\\u2066x\\u200b\\ufeff\\xad"),
        ("x" * 501, "x" * 500 + "... (cut)"),
        ("x" * 500, "x" * 500),
    ],
)
def test_peer_text_is_one_line_of_at_most_500_characters(text: str, expected: str) -> None:
    assert peer_text(text) == expected


def test_a_short_id_a_peer_chose_cannot_start_a_log_line() -> None:
    """A session id a curator sent an owner, shown in the owner's log. Control: an id of hex
    digits is shown as it is."""
    assert short_id("\nERROR x") == "\\nERROR x"
    assert short_id("ab\ncdefghij") == "ab\\ncdefg…"
    assert short_id("0123456789abcdef") == "01234567…"
