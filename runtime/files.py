"""Durable files: a write that replaces a file whole or not at all, and JSON reports.

Every party writes outputs a reader may open at any moment (summaries, reports, a ledger
report): each goes through :func:`atomic_write`, so a reader never sees a partial file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["atomic_write", "read_toml", "write_json"]


@contextmanager
def atomic_write(path: str | Path) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path`` for writing; move it over ``path`` on success.

    A reader never sees a partial file, and a failed write leaves ``path`` as it was.

    Raises
    ------
    OSError
        If the directory is missing or not writable.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _default(obj: Any) -> Any:
    # numpy scalars and arrays as Python ones; without numpy imported, ``obj`` is none of them
    # (so the health probe and the PKI, which write JSON, load no numerical library).
    np = sys.modules.get("numpy")
    if np is None:
        raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def json_text(data: Any) -> str:
    """``data`` as indented JSON text (numpy scalars and arrays converted), newline-terminated."""
    return json.dumps(data, indent=2, default=_default) + "\n"


def write_json(data: Any, path: str | Path) -> None:
    """Write ``data`` as indented JSON (:func:`json_text`), atomically."""
    text = json_text(data)
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Parse a TOML file.

    Parameters
    ----------
    path : str or Path
    what : str
        What the file is, for the message of a missing file (``"schema file"``).

    Raises
    ------
    FileNotFoundError
        If the file does not exist (``"<what> <path> does not exist"``).
    ValueError
        If it is not valid TOML (naming the file and the decoder's message).
    """
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: not valid TOML: {exc}") from None
