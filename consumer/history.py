"""The consumer's own record of its summaries, kept in its data directory.

The curator keeps a finished session's summary and report only until they expire (a minute after
the consumer fetched them, by default: the curator is parsimonious), so what a consumer learned
from a session lives with the consumer. ``dpmarket consumer request --data-dir DIR`` and the
consumer's console (``dpmarket console``) record each session they ran in ``DIR/sessions/``, one
JSON file per session: what was asked (method, p), how it ended, what it spent, each owner's
share of the summary, its MMD² to the validation set and its MMD curve, and where the summary was
written. The validation set itself is never recorded. ``request`` writes the record as soon as
the curator has created the session (status ``running``, with its id, request key, quote and
owners) and updates it when the session ends, so that a session whose curator was lost (killed,
restarted) is listed unfinished by ``dpmarket consumer sessions``, which can ask the curator
about it again (``--check``).

Files are written atomically and readable by the consumer's user only (mode 0600, folder 0700).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.runtime.files import atomic_write

__all__ = ["HISTORY_DIR", "RecordedSession", "SessionHistory", "spent"]

#: The folder of the records, inside the consumer's data directory.
HISTORY_DIR = "sessions"
#: Version of a record's layout.
RECORD_VERSION = 1
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,160}$")


@dataclass(frozen=True)
class RecordedSession:
    """One summarization session as the consumer recorded it.

    Attributes
    ----------
    key : str
        The record's name in the history (unique; ``<created>-<id>``).
    created : float
        Unix time, seconds, when the record was last written (the session's end, once known).
    status : {"running", "done", "failed"}
        ``running``: created at the curator, its end not known to the consumer (the program
        stopped or lost the curator before it).
    source : {"request", "console"}
        Which program ran the session.
    method : str
        The summarization method (``candidates``, ``private``, ...).
    summary_size : int
        p, as requested.
    session_id : str
        The curator's session id when the program knew it ("" otherwise).
    points_per_owner : dict of str to int
        Points of the summary from each owner (its share; empty for a failed session).
    left_out : dict of str to str
        Owners the session ran without, with the curator's public reason.
    mmd2_validation : float or None
        MMD² of the summary to the validation set (the consumer's own measurement).
    epsilon : dict or None
        The session's reported epsilons on the validation set and on the owners' data
        (:func:`dpmarket.consumer.report.epsilon_summary`); None for a non-private method.
    owner_spend : dict
        What each owner's own ledger recorded for the session (ε, δ, raw points).
    error : str
        Why the session failed ("" when it succeeded).
    summary_path : str
        Where the summary was written ("" when nowhere).
    mmd_curve : dict
        ``{"sizes": [k, ...], "mmd2": [...]}``: MMD² of the first k summary points to the
        validation set (empty when not computed).
    request_id : str
        The request's idempotency key ("" when not known): the same request with the same key
        returns the same session and charges nothing new.
    quote : dict
        The quote the session was accepted under
        (:func:`dpmarket.consumer.market.quote_json`; empty when not known).
    owners : list of str
        The owners the quote names.
    """

    key: str
    created: float
    status: str
    source: str
    method: str
    summary_size: int
    session_id: str = ""
    points_per_owner: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    mmd2_validation: float | None = None
    epsilon: dict[str, Any] | None = None
    owner_spend: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    summary_path: str = ""
    mmd_curve: dict[str, list[float]] = field(default_factory=dict)
    request_id: str = ""
    quote: dict[str, Any] = field(default_factory=dict)
    owners: list[str] = field(default_factory=list)

    @property
    def unfinished(self) -> bool:
        """Whether the consumer does not know how the session ended."""
        return self.status == "running"

    @property
    def short_id(self) -> str:
        """The first 8 characters of the session id, or of the key."""
        return (self.session_id or self.key.partition("-")[2] or self.key)[:8]


def spent(report: Any) -> dict[str, Any] | None:
    """What a failed session's report says it spent, as :meth:`SessionHistory.record` takes it:
    ``{"epsilon", "owner_spend", "left_out"}`` (None without a report).

    Parameters
    ----------
    report : SessionReport or None
        The last WatchSession message's report (ledger included).
    """
    if report is None:
        return None
    from dpmarket.consumer.report import epsilon_summary, owner_spend

    return {
        "epsilon": epsilon_summary(report.ledger),
        "owner_spend": owner_spend(report.owner_spend),
        "left_out": dict(report.left_out),
    }


class SessionHistory:
    """The records of one consumer's sessions (``DATA_DIR/sessions/*.json``).

    Parameters
    ----------
    data_dir : path
        The consumer's data directory (created, mode 0700, on the first record).
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.folder = Path(data_dir) / HISTORY_DIR

    def record(
        self,
        *,
        status: str,
        source: str,
        method: str,
        summary_size: int,
        session_id: str = "",
        result: Mapping[str, Any] | None = None,
        error: str = "",
        summary_path: str = "",
        mmd_curve: Mapping[str, list[float]] | None = None,
        left_out: Mapping[str, str] | None = None,
        now: float | None = None,
        key: str | None = None,
        request_id: str = "",
        quote: Mapping[str, Any] | None = None,
        owners: list[str] | None = None,
    ) -> RecordedSession:
        """Write one session's record (or replace the record ``key``); return it.

        Parameters
        ----------
        status : {"running", "done", "failed"}
        source : {"request", "console"}
        method : str
        summary_size : int
        session_id : str
        result : mapping, optional
            The consumer's evaluation of the summary
            (:func:`dpmarket.consumer.report.evaluate_summary`): its ``points_per_owner``,
            ``left_out``, ``mmd2_validation``, ``epsilon`` and ``owner_spend`` are recorded.
        error : str
        summary_path : str
        mmd_curve : mapping, optional
            ``{"sizes": [...], "mmd2": [...]}``.
        left_out : mapping, optional
            For a failed session without a result: the owners left out.
        now : float, optional
            Unix time of the record (default: now).
        key : str, optional
            Replace this record (a running session's, as it ends); its request key, quote and
            owners are kept when not given.
        request_id : str
        quote : mapping, optional
            :func:`dpmarket.consumer.market.quote_json` of the session's quote.
        owners : list of str, optional

        Raises
        ------
        ValueError
            If ``status`` or ``source`` is unknown.
        OSError
            If the folder cannot be written.
        """
        if status not in ("running", "done", "failed"):
            raise ValueError(f"status must be 'running', 'done' or 'failed', got {status!r}")
        if source not in ("request", "console"):
            raise ValueError(f"source must be 'request' or 'console', got {source!r}")
        created = time.time() if now is None else float(now)
        before = None if key is None else self.get(key)
        if before is not None:
            request_id = request_id or before.request_id
            quote = quote if quote is not None else before.quote
            owners = owners if owners is not None else before.owners
        if key is None or not _KEY.match(key):
            tag = re.sub(r"[^A-Za-z0-9]", "", session_id)[:32] or os.urandom(6).hex()
            key = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(created))}-{tag}"
        r = dict(result or {})
        entry = RecordedSession(
            key=key,
            created=created,
            status=status,
            source=source,
            method=method,
            summary_size=int(summary_size),
            session_id=session_id,
            points_per_owner={str(k): int(v) for k, v in r.get("points_per_owner", {}).items()},
            left_out=dict(r.get("left_out", left_out or {})),
            mmd2_validation=r.get("mmd2_validation"),
            epsilon=r.get("epsilon"),
            owner_spend=dict(r.get("owner_spend", {})),
            error=error,
            summary_path=summary_path,
            mmd_curve={k: list(v) for k, v in (mmd_curve or {}).items()},
            request_id=request_id,
            quote=dict(quote or {}),
            owners=list(owners or []),
        )
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.folder / f"{key}.json"
        text = json.dumps({"version": RECORD_VERSION, **asdict(entry)}, indent=1, default=float)
        with atomic_write(path) as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(text.encode("utf-8"))
        return entry

    def entries(self, limit: int | None = None) -> list[RecordedSession]:
        """The records, newest first (the first ``limit``); unreadable files are skipped."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.glob("*.json"), reverse=True):
            entry = self._read(path)
            if entry is not None:
                out.append(entry)
            if limit is not None and len(out) >= limit:
                break
        return out

    def get(self, key: str) -> RecordedSession | None:
        """The record called ``key``, or None (also for a key that is not a record's name)."""
        if not _KEY.match(key):
            return None
        return self._read(self.folder / f"{key}.json")

    @staticmethod
    def _read(path: Path) -> RecordedSession | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.pop("version", None) != RECORD_VERSION:
            return None
        try:
            return RecordedSession(**data)
        except TypeError:
            return None
