"""The benchmarks' JSON reports: one file (``out/bench.json`` under ``make bench``) that several
benchmarks fill, each under its own key, without losing the others' sections."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["configure_logging", "merge_section", "write_section"]


def configure_logging(verbose: bool) -> None:
    """A benchmark's log on stderr: timestamped, at DEBUG with ``--verbose``, else INFO."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )


def merge_section(path: Path, key: str, section: Any) -> Path:
    """Write ``section`` under ``key`` of the JSON object in ``path``, keeping its other keys
    (the file is created when missing), atomically: a reader never sees a half-written report.

    Raises
    ------
    SystemExit
        If ``path`` holds JSON that is not an object.
    """
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if not isinstance(report, dict):
        raise SystemExit(f"{path} does not hold a JSON object")
    report[key] = section
    _write_json(path, report)
    return path


def write_section(
    key: str, section: Any, *, out: Path | None, into: Path | None, default_out: Path
) -> list[Path]:
    """``section`` merged under ``key`` of ``into`` (:func:`merge_section`) and/or written alone to
    ``out``; alone to ``default_out`` when neither is given. Returns the paths written."""
    written = []
    if into is not None:
        written.append(merge_section(into, key, section))
    if out is not None or into is None:
        target = out or default_out
        _write_json(target, section)
        written.append(target)
    return written


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8"
    ) as fh:
        fh.write(json.dumps(value, indent=2) + "\n")
    os.replace(fh.name, path)
