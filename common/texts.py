"""Another party's text as a log line or an error may carry it: one line, of bounded length.

A service quotes what another party sent it (a gRPC status's details, a string of its answer, an
id it chose) in its errors and its log. The party chose that text, its length and its
characters: a newline in it would start a forged line of the log (``2026-... ERROR ... owner a:
...``), an escape sequence would rewrite an operator's terminal, and 12,000 characters would
bury the log. :func:`peer_text` is the one form in which every service keeps such a text.
"""

from __future__ import annotations

import unicodedata

__all__ = ["PEER_TEXT_CHARS", "peer_text"]

#: Characters of another party's text (a status's details, a string of its answer) that a
#: service keeps in an error or writes to its log.
PEER_TEXT_CHARS = 500
#: Unicode categories written escaped: control characters (C0, DEL, C1: newline, carriage
#: return, escape, NUL, NEL), format characters (bidirectional overrides and isolates such as
#: U+202E and U+2066, which reorder what a terminal shows; zero-width spaces and joiners, the
#: byte-order mark, the soft hyphen, which hide text) and the line and paragraph separators.
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp"})


def peer_text(text: str, limit: int = PEER_TEXT_CHARS) -> str:
    """Another party's ``text`` as one line a log may carry: control characters escaped, at
    most ``limit`` characters of it kept.

    Parameters
    ----------
    text : str
        What the party sent (a gRPC status's details, a name or value of its answer).
    limit : int
        Characters of ``text`` kept; a longer text is cut and ends with ``"... (cut)"``
        (never its length, which is the party's).

    Returns
    -------
    str
        The text with every character of :data:`_ESCAPED`'s categories written as Python
        writes it in a string literal (``\\n``, ``\\x1b``, ``\\u2028``), cut to ``limit``
        characters: the party cannot start a line in a log, hide or reorder text on a
        terminal or make a line longer than ``limit`` characters and the escapes of those kept.
    """
    kept = "".join(_escaped(c) for c in text[:limit])
    return kept + ("... (cut)" if len(text) > limit else "")


def _escaped(char: str) -> str:
    """``char``, or its escape when it is a control, format or line-breaking character."""
    if unicodedata.category(char) in _ESCAPED:
        return char.encode("unicode_escape").decode("ascii")
    return char
