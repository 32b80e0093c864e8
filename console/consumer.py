"""What the consumer's console reads and does: the catalogue, exploration, rankings, summaries.

Every call goes to the consumer's curator over mTLS with the consumer's own certificate
(:class:`dpmarket.consumer.client.CuratorClient`); exploration and ranking are computed here from
the published sketches, as ``dpmarket consumer explore`` and ``rank-owners`` compute them
(:func:`dpmarket.consumer.catalogue.explore`, :func:`dpmarket.consumer.cli.rank_sketches`),
so no owner is asked anything. A summary request runs as a session at the curator; a thread
follows its WatchSession stream (:class:`SummaryJob`), fetches the summary, writes it to the
consumer's data directory and records the outcome in the consumer's history
(:mod:`dpmarket.consumer.history`), which also lists what
``dpmarket consumer request --data-dir`` ran.
The validation set a form uploads is read from a private temporary file and deleted at once; it
stays in this process's memory only while its session runs.

Extension points
----------------
* **The typed client** (:mod:`dpmarket.client`): :class:`ConsumerConsole` is the one place
  that calls the curator and the exploration functions. Exploration and ranking already run the
  functions ``dpmarket.client.Consumer.explore`` and ``rank_owners`` wrap
  (:mod:`dpmarket.consumer.catalogue`). A summary stays on ``CuratorClient``'s
  ``create_session``, ``watch`` and ``get_summary``: the form needs the session's id at once,
  which ``Consumer.summarize`` (blocking until the summary) does not give.
* **Quotes and statements** (the market): the request form's *quote only* action asks the
  curator's QuoteSession (:meth:`ConsumerConsole.quote`: nothing released, charged or created),
  its max-cost field caps both the quote and the session; the statements page lists the
  curator's ListStatements for this consumer (:meth:`ConsumerConsole.statements`). A session's
  statement could also be shown beside its record on the session page (not done yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import multiprocessing
import os
import re
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from dpmarket.common.errors import DPMarketError
from dpmarket.common.market.money import EPSILON_UNITS, credits_text, parse_credits
from dpmarket.common.market.pricing import Quote
from dpmarket.common.schema import Schema
from dpmarket.common.summarization.kernels import (
    feature_bounds,
    feature_scaling,
    suggested_gamma,
)
from dpmarket.common.summarization.methods import SummarizationConfig, method_config
from dpmarket.common.summarization.summary import OwnerSelection
from dpmarket.common.summarization.terms import MethodOffer
from dpmarket.console import plots
from dpmarket.console.background import Background, GiveWay
from dpmarket.consumer import model_store
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.history import RecordedSession, SessionHistory, spent
from dpmarket.consumer.market import SettledStatement

if TYPE_CHECKING:
    from dpmarket.consumer.catalogue import ExplorationCache

__all__ = [
    "Catalogue",
    "ConsumerConsole",
    "SummaryJob",
    "UserError",
    "count_row",
    "form_credits",
    "form_number",
    "in_form_terms",
    "method_form",
    "quote_view",
    "statement_view",
]

logger = logging.getLogger(__name__)

#: Seconds a catalogue read is reused (the sketches change only when an owner publishes).
CATALOGUE_TTL_SECONDS = 10.0
#: Summary jobs kept in memory (the oldest finished ones are forgotten beyond it).
MAX_JOBS = 16
#: Statements the statements page lists (the newest).
STATEMENTS_SHOWN = 100
#: CPU priority the refits of published fits run at, above the console's (nice).
REFIT_NICENESS = 10
#: Seconds between the refitting process's looks at whether the console still runs.
PARENT_CHECK_SECONDS = 0.5
#: The explore form's questions answered ahead by the warm-up: the query kinds the form asks
#: with its defaults alone (a count, a logistic regression and a marginal need a field more).
ANSWERED_AHEAD = ("mean", "moment2", "cdf", "covariance")
#: Answer pages (their rows and plot) kept, the most recent.
VIEWS_KEPT = 64
#: Largest validation file a form may upload, bytes.
MAX_UPLOAD_BYTES = 64 << 20


class UserError(Exception):
    """A request the console refuses with a message for the person at the browser (the CLI
    options a message names are put in the form's terms: :func:`in_form_terms`)."""

    def __init__(self, message: str) -> None:
        super().__init__(in_form_terms(message))


@dataclass(frozen=True)
class Catalogue:
    """The sketch catalogue as the consumer sees it.

    Attributes
    ----------
    specs : list of dict
        ``{"name", "kind", "epsilon", "delta", "columns": [{"name", "low", "high", ...}],
        "allocation": bool, "published": int}`` per spec declared at the curator
        (``published``: how many owners published a sketch of it; a spec nobody published
        answers nothing, and the forms do not offer it).
    sketches : list of dict
        ``{"spec", "owner", "epsilon", "delta", "noisy_count", "published_at", "age"}`` per
        published sketch.
    owners : list of str
        Every owner with a published sketch.
    schema : list of dict
        The consumer's public schema (its columns), or empty.
    """

    specs: list[dict[str, Any]]
    sketches: list[dict[str, Any]]
    owners: list[str]
    schema: list[dict[str, Any]]
    read_at: float

    @property
    def published_specs(self) -> list[dict[str, Any]]:
        """The specs with at least one published sketch (what the forms offer)."""
        return [s for s in self.specs if s["published"]]

    @property
    def columns(self) -> list[dict[str, Any]]:
        """The columns of the first published spec that is not the allocation's (its features
        alone), else of the first published one (empty without any)."""
        published = self.published_specs
        chosen = next((s for s in published if not s["allocation"]), None) or next(
            iter(published), None
        )
        return [] if chosen is None else list(chosen["columns"])


def age_text(seconds: float) -> str:
    """A duration in words a person reads at a glance: ``"42 s"``, ``"5 min"``, ``"3 h"``,
    ``"2 d"``."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


#: The form field each CLI option of a message stands for (label and field name, as the form's
#: own errors name them).
FORM_FIELDS = {
    "--where": "Count predicates (where)",
    "--column": "Columns (column)",
    "--points": "CDF thresholds (points)",
    "--target": "Logistic target (target)",
    "--spec": "Sketch (spec)",
    "--owner": "Owners (owner)",
    "--all": "Owners (owner)",
    "--exclude-owner": "Owners (owner)",
    "--validation": "Validation file (validation)",
    "-p": "Points (p)",
    "--method": "Method (method)",
    "--gamma": "Kernel γ (gamma)",
    "--min-owners": "Fewest owners (min_owners)",
    "--max-cost": "Most it may cost (max_cost)",
}
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*|-p)(?![\w-])")


def in_form_terms(message: str) -> str:
    """``message`` (the CLI's, the curator's) with each CLI option it names replaced by the
    form field that stands for it (:data:`FORM_FIELDS`): "raise --max-cost" becomes "raise
    the form's “Most it may cost (max_cost)”"; an option the forms do not have stays as is."""

    def field(found: re.Match[str]) -> str:
        label = FORM_FIELDS.get(found.group(1))
        return found.group(1) if label is None else f"the form's “{label}”"

    return _OPTION.sub(field, message)


def _names(owners: Sequence[str]) -> str:
    return ", ".join(owners)


def method_state(offer: MethodOffer, min_owners: int, owners: int) -> dict[str, Any]:
    """What a request of ``offer``'s method with the form's “Fewest owners” at ``min_owners``
    would do (:meth:`~dpmarket.common.summarization.terms.MethodOffer.runs_with`), as the form
    shows it: ``{"runs", "label", "note"}`` (``label``: the option's text; ``note``: how many
    owners would take part, or why it would be refused, in the form's terms).

    Parameters
    ----------
    offer : MethodOffer
        ListMethods' answer for the method.
    min_owners : int
        The form's “Fewest owners” (0: every owner).
    owners : int
        How many owners the deployment's answer names (:func:`method_form`).
    """
    k, refusing = len(offer.serving), offer.refusing
    refuse = f"{_names(refusing)} refuse{'s' if len(refusing) == 1 else ''} it" if refusing else ""
    if offer.runs_with(min_owners):
        label = offer.method if not refusing else f"{offer.method} ({k} of {owners} owners)"
        note = f"would run with {k} of {owners} owners ({_names(offer.serving)})"
        if refusing:
            note += f"; {refuse} and would be left out, charged nothing"
        if not refusing and offer.reason:
            note += f"; {in_form_terms(offer.reason)}"
        return {"runs": True, "label": label, "note": note}
    if not offer.by_policy or k == 0 or min_owners == 0:
        why = "not served here" if not offer.by_policy or k == 0 else "not with every owner"
        label = f"{offer.method} ({why})"
        return {"runs": False, "label": label, "note": in_form_terms(offer.reason)}
    only, also = ("only ", f"; {refuse}") if refusing else ("", "")
    note = (
        f"{only}{k} of {owners} owners serve it ({_names(offer.serving)}{also}): a request "
        f"needing {min_owners} would be refused, nothing charged; set the form's "
        f"“{FORM_FIELDS['--min-owners']}” to {k} or fewer"
    )
    plural = "s serve" if k > 1 else " serves"
    label = f"{offer.method} ({only}{k} owner{plural} it)"
    return {"runs": False, "label": label, "note": note}


def method_form(offers: Sequence[MethodOffer]) -> dict[str, Any]:
    """The request form's method choices for every value of its “Fewest owners” field
    (:func:`method_state`): ``{"owners", "levels", "methods": [{"method", "states"}]}``,
    ``states[i]`` for ``min_owners = levels[i]``: 0 (every owner), 1 to ``owners`` (the
    owners ListMethods names), and ``owners + 1`` standing for any larger value. The page
    shows the states of the field's value (``static/console.js`` follows it as it changes).
    """
    owners = max((len(o.serving) + len(o.refusing) for o in offers), default=0)
    levels = list(range(owners + 2))
    return {
        "owners": owners,
        "levels": levels,
        "methods": [
            {"method": o.method, "states": [method_state(o, m, owners) for m in levels]}
            for o in offers
        ],
    }


def count_row(fraction: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A count answer's row in records, from its fraction's row: the count estimate, standard
    error and 95 % interval of ``extra`` (:attr:`dpmarket.consumer.explore.Answer.extra`: the
    fraction's, times the record count estimate ``n``), with the fraction's flags and basis;
    the label says of how many records; ``guess`` says the value is the independence guess
    (flagged ``model-guess``: it has no standard error, its interval is what holds)."""
    interval = extra.get("count_interval")
    count_se = extra.get("count_standard_error")  # None: a model's guess has none
    label = str(fraction["label"])
    if label.startswith("P[") and label.endswith("]"):
        label = label[2:-1]
    return {
        **fraction,
        "label": f"records with {label} (of n ≈ {extra['n']:.0f})",
        "value": float(extra["count"]),
        "standard_error": math.nan if count_se is None else float(count_se),
        "interval": None if interval is None else [float(interval[0]), float(interval[1])],
        "guess": any(f["code"] == "model-guess" for f in fraction["flags"]),
    }


def form_number(
    text: str, field: str, label: str, kind: type[int] | type[float], example: str
) -> Any:
    """The number a form's field holds, as ``kind`` (finite).

    Parameters
    ----------
    text : str
        What the field holds.
    field, label : str
        The field's name and its label on the page (both named in the message).
    kind : int or float
    example : str
        A valid value, shown in the message.

    Raises
    ------
    UserError
        If ``text`` is not a finite number of ``kind``: the message names the field and the
        value, and says what to give.
    """
    what = "a whole number" if kind is int else "a number"
    try:
        value = kind(text)
    except ValueError:
        raise UserError(f"{label} ({field}): {text!r} is not {what}; give e.g. {example}") from None
    if not math.isfinite(value):
        raise UserError(f"{label} ({field}): {text!r} is not a finite number; give e.g. {example}")
    return value


def form_credits(text: str, field: str, label: str) -> int | None:
    """An amount of credits a form's field holds, as micro-credits (None when it is blank).

    Raises
    ------
    UserError
        If ``text`` is not a non-negative amount of credits with at most six decimals
        (:func:`~dpmarket.common.market.money.parse_credits`): the message names the field and
        the value.
    """
    text = text.strip()
    if not text:
        return None
    try:
        return parse_credits(text)
    except ValueError as exc:
        raise UserError(
            f"{label} ({field}): {text!r} is not an amount of credits ({exc}); give e.g. 12.5"
        ) from None


def quote_view(quoted: Quote, max_cost: int | None) -> dict[str, Any]:
    """A quote as the quote page shows it: ``{"summary_size", "lines": [{"owner", "read",
    "delivered", "epsilon", "charge"}], "reward", "total", "max_cost"}`` (amounts as credits
    text; ``max_cost`` None without a cap)."""
    return {
        "summary_size": quoted.summary_size,
        "lines": [
            {
                "owner": line.owner,
                "read": line.charge.points_read,
                "delivered": line.charge.points_delivered,
                "epsilon": line.charge.epsilon_units / EPSILON_UNITS,
                "charge": credits_text(line.charge.total),
            }
            for line in quoted.lines
        ],
        "reward": credits_text(quoted.reward) if quoted.reward else "",
        "total": credits_text(quoted.total),
        "max_cost": None if max_cost is None else credits_text(max_cost),
    }


def statement_view(settled: SettledStatement) -> dict[str, Any]:
    """A settled statement as the statements page shows it: ``{"session_id", "short",
    "owner_session_id", "owner_short", "settled_at", "owners": [{"owner", "read", "delivered",
    "epsilon", "reward", "total"}], "total", "recorded", "owner_count"}`` (amounts as credits
    text; ``owner_session_id``, the id the owners' ledgers list the session by:
    :func:`dpmarket.consumer.market.owner_session_id`)."""
    st = settled.statement
    return {
        "session_id": settled.session_id,
        "short": settled.session_id[:8],
        "owner_session_id": st.header.session_id,
        "owner_short": st.header.session_id[:8],
        "settled_at": settled.settled_at,
        "owners": [
            {
                "owner": line.owner,
                "read": line.points_read,
                "delivered": line.points_delivered,
                "epsilon": (line.epsilon_session + line.epsilon_payout) / EPSILON_UNITS,
                "reward": credits_text(line.reward),
                "total": credits_text(line.total),
            }
            for line in st.lines
        ],
        "total": credits_text(st.total),
        "recorded": settled.owners_recorded,
        "owner_count": len(st.lines),
    }


@dataclass
class SummaryJob:
    """A summary session this console started, followed to its end.

    Attributes
    ----------
    session_id : str
    config : SummarizationConfig
    events : list of dict
        Progress as it came (``stage``, ``round``, ``total_rounds``, ``points_accessed``,
        ``message``).
    record : RecordedSession or None
        The outcome, once recorded.
    error : str
        Why the job failed ("" otherwise).
    """

    session_id: str
    config: SummarizationConfig
    validation: Any
    names: list[str]
    label: str
    request_id: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    record: RecordedSession | None = None
    error: str = ""
    finished: bool = False
    started: float = field(default_factory=time.time)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def add(self, event: dict[str, Any]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def finish(self, record: RecordedSession | None, error: str = "") -> None:
        with self.changed:
            self.record, self.error, self.finished = record, error, True
            self.validation = None  # the validation set is not kept once the session has ended
            self.changed.notify_all()


class ConsumerConsole:
    """The consumer's side of the console.

    Parameters
    ----------
    client : CuratorClient
        Connected with the consumer's certificate.
    data_dir : Path
        The consumer's data directory: its history and its summaries.
    schema : Schema, optional
        The consumer's public schema (validation files are read through it).
    """

    def __init__(self, client: CuratorClient, data_dir: Path, schema: Schema | None) -> None:
        self.client = client
        self.data_dir = Path(data_dir)
        self.schema = schema
        self.history = SessionHistory(self.data_dir)
        self.jobs: dict[str, SummaryJob] = {}
        self._lock = threading.Lock()
        self._catalogue: Catalogue | None = None
        self._methods: tuple[float, list[MethodOffer]] | None = None
        #: Each spec's M2M explorer, kept for the console's lifetime (its synthetic design); one
        #: exploration at a time uses them.
        self._explorers: dict[Any, Any] = {}
        #: Explorations kept by question and sketch content (a reopened or repeated question
        #: is answered at once): :meth:`_kept_answers`.
        self._answers: ExplorationCache | None = None
        self._exploring = threading.Lock()
        #: Answer pages (rows and plot) by their exploration's id, the exploration held
        #: beside each: :meth:`_view`.
        self._views: OrderedDict[int, tuple[Any, dict[str, Any]]] = OrderedDict()
        self._stop_warming = threading.Event()
        #: Answers computed off the request (:meth:`explore_soon`).
        self._background: Background[dict[str, Any]] = Background("explore-answer")
        #: The warm-up gives way, between its steps, to those answers.
        self._give_way = GiveWay()
        #: Marginals models kept on disk (shared with ``dpmarket consumer explore --data-dir``).
        self.model_dir = self.data_dir / model_store.FOLDER
        self.warming: threading.Thread | None = None
        self._refitter: multiprocessing.process.BaseProcess | None = None

    def start_warming(self) -> threading.Thread:
        """Compute the exploration caches ahead in a background thread: every published
        marginals sketch's model and bootstrap refits (the owner's published fit where there is
        one) and every spec's M2M design (:func:`dpmarket.consumer.catalogue.warm`), then this
        console's own refit of every published fit
        (:func:`dpmarket.consumer.catalogue.verify_fits`), fitted in a child process at a lower
        CPU priority (:func:`dpmarket.consumer.catalogue.refit_into_store`, into the model store
        the check then reads). After the designs, and again after the refits (the answers kept
        read the published fits: they are forgotten), the explore form's questions as it opens
        are answered ahead (:data:`ANSWERED_AHEAD`), so that their pages are read from the
        kept explorations. Start-up and pages do not wait for it; an answer waits only for the
        design or the model it needs, or the step in progress: the warm-up gives way to an
        answer a page asked for (:meth:`explore_soon`) before each of its steps
        (:class:`~dpmarket.console.background.GiveWay`)."""
        self.warming = threading.Thread(target=self._warm, name="explore-warm", daemon=True)
        self.warming.start()
        return self.warming

    def stop_warming(self) -> None:
        """Stop the warm-up before its next step (and its refitting process at once)."""
        self._stop_warming.set()
        refitter = self._refitter
        if refitter is not None and refitter.is_alive():
            refitter.terminate()

    def _warm(self) -> None:
        from dpmarket.console import plots
        from dpmarket.consumer.catalogue import published_fits, unstored_fits, verify_fits, warm

        try:
            # What the main page waits for on its first fetch: the process's first figure
            # and the catalogue's read (the curator's channel opened).
            plots.warm_up()
            self.catalogue()
            # At the console's priority: it holds the lock answers take while it draws a
            # design (a second or so each), and a starved holder would keep them waiting.
            # First, before anything else, as a first answer needs what it computes.
            warm(
                self.client,
                explorers=self._explorers,
                lock=self._exploring,
                stop=self._stop_warming,
                model_dir=self.model_dir,
                pause=self._give_way.pause,
            )
            # Fits this console made before (kept in its model store, e.g. before a restart)
            # are what answers read from the start: only the others change under them. (The
            # warm-up keeps no published fit in the store: the same ones are unstored after.)
            fits = published_fits(self.client)
            changing = unstored_fits(fits, self.model_dir)
            # The refits take seconds of CPU each (about 20 s for the tutorial's three): in
            # this process they would share its interpreter lock with every page for minutes,
            # whatever this thread's priority. A child process at a lower priority fits them
            # into the model store; this thread then reads them from there and checks them.
            self._answer_ahead()
            if changing and not self._stop_warming.is_set():
                self._refit_elsewhere(changing)
            refitted = not self._stop_warming.is_set() and verify_fits(
                self.client,
                stop=self._stop_warming,
                model_dir=self.model_dir,
                pause=self._give_way.pause,
            )
            if refitted and changing:  # answers now read this console's own fits, those kept
                # the published ones of the sketches in ``changing``
                with self._exploring:
                    self._kept_answers().clear()
                self._answer_ahead()
        except Exception as exc:  # best effort: the first answer computes what is missing
            logger.warning("the explore warm-up stopped: %s", exc)

    def _answer_ahead(self) -> None:
        """Answer the explore form's questions as it opens (:data:`ANSWERED_AHEAD`: each
        query kind that needs no other field) into the kept explorations, one at a time
        (an answer asked meanwhile waits at most for the one in progress)."""
        for kind in ANSWERED_AHEAD:
            self._give_way.pause()
            if self._stop_warming.is_set():
                return
            try:
                self.explore({"query": kind, "owners": []})
            except UserError as exc:  # e.g. no sketch answers it: the form will say so
                logger.info("explore %s not answered ahead: %s", kind, exc)

    def _refit_elsewhere(self, fits: list[Any]) -> None:
        """Run :func:`~dpmarket.consumer.catalogue.refit_into_store` on ``fits`` in a child
        process at CPU priority +:data:`REFIT_NICENESS` and wait for it (an error there is
        logged: :func:`~dpmarket.consumer.catalogue.verify_fits` then fits what is missing)."""
        context = multiprocessing.get_context("spawn")  # no copy of this process's threads
        child = context.Process(
            target=_refit_child,
            args=(fits, str(self.model_dir), os.getpid()),
            name="explore-refit",
            daemon=True,  # ends with the console
        )
        self._refitter = child
        child.start()
        child.join()
        if child.exitcode not in (0, None) and not self._stop_warming.is_set():
            logger.warning("the explore refits' process ended with %s", child.exitcode)

    # ------------------------------------------------------------------------ catalogue
    def catalogue(self) -> Catalogue:
        """The specs and published sketches (ListSketchSpecs, then ListSketches per spec)."""
        from dpmarket.consumer.catalogue import noisy_count_text

        with self._lock:
            cached = self._catalogue
        now = time.time()
        if cached is not None and now - cached.read_at < CATALOGUE_TTL_SECONDS:
            return cached
        specs, allocation = self.client.sketch_catalogue()
        spec_rows, sketch_rows = [], []
        for spec in specs:
            entries = list(self.client.sketches(spec))
            spec_rows.append(
                {
                    "name": spec.name,
                    "kind": spec.kind,
                    "epsilon": spec.epsilon,
                    "delta": spec.delta,
                    "columns": spec.domain.describe(),
                    "allocation": spec.name == allocation,
                    "published": len(entries),
                }
            )
            for entry in entries:
                d = entry.describe()
                sketch_rows.append(
                    {
                        "spec": entry.spec,
                        "owner": entry.owner,
                        "epsilon": d["epsilon"],
                        "delta": d["delta"],
                        "noisy_count": d["noisy_count"],
                        "noisy_count_text": noisy_count_text(d["noisy_count"]),
                        "published_at": entry.published_at,
                        "age": age_text(now - entry.published_at),
                    }
                )
        schema = []
        if self.schema is not None:
            schema = [
                {
                    "name": c.name,
                    "type": c.type,
                    "describe": c.describe(),
                    "label": c.name == self.schema.label,
                }
                for c in self.schema.columns
            ]
        catalogue = Catalogue(
            spec_rows, sketch_rows, sorted({s["owner"] for s in sketch_rows}), schema, now
        )
        with self._lock:
            self._catalogue = catalogue
        return catalogue

    def methods(self) -> list[MethodOffer]:
        """The summarization methods as this deployment serves them (ListMethods: the
        curator's policy and the owners' published access flags), for the request form
        (:func:`method_form`); read again after :data:`CATALOGUE_TTL_SECONDS`.

        Raises
        ------
        DPMarketError
            When the curator does not answer.
        """
        with self._lock:
            cached = self._methods
        now = time.time()
        if cached is not None and now - cached[0] < CATALOGUE_TTL_SECONDS:
            return cached[1]
        offers = self.client.methods()
        with self._lock:
            self._methods = (now, offers)
        return offers

    # ------------------------------------------------------------------------ exploring
    def _kept_answers(self) -> ExplorationCache:
        """The explorations this console keeps (made when first needed: the exploration
        modules are imported by the warm-up, not before the console serves). Called with
        the exploring lock held."""
        if self._answers is None:
            from dpmarket.consumer.catalogue import ExplorationCache

            self._answers = ExplorationCache()
        return self._answers

    def explore(self, form: dict[str, Any]) -> dict[str, Any]:
        """Answer an exploration form: ``query``, ``spec``, ``owners`` (none: every owner),
        ``columns``, ``points``, ``where``, ``target``.

        Returns
        -------
        dict
            ``{"title", "spec", "reason", "owners", "n", "source", "rows", "plotted",
            "count", "bases", "svg"}``,
            ``rows`` as :meth:`dpmarket.consumer.explore.Answer.rows` (each with its 95 %
            interval and flags; a count's first row is in records, :func:`count_row`, as the
            CLI prints it, then the fraction), ``plotted`` the rows of one unit the plot
            draws, ``count`` a count's row in records (None for another query), ``bases`` the
            distinct ``(basis, covers)`` pairs (what the intervals cover), ``svg`` the plot
            (:func:`dpmarket.console.plots.interval_plot`). A question asked again of the same
            sketches is answered from the explorations this console keeps
            (:class:`dpmarket.consumer.catalogue.ExplorationCache`), its page from the one
            drawn then. The dict is shared: read it, do not change it.

        Raises
        ------
        UserError
            For a malformed question, or one no sketch answers.
        """
        from dpmarket.consumer.catalogue import explore
        from dpmarket.consumer.explore import Query, parse_where

        points = tuple(
            form_number(p, "points", "CDF thresholds", float, "25, 30")
            for p in form.get("points", ())
        )
        try:
            where = tuple(parse_where(w) for w in form.get("where", ()))
        except DPMarketError as exc:
            raise UserError(f"Count predicates (where): {exc}") from exc
        try:
            query = Query(
                form["query"],
                columns=tuple(form.get("columns", ())),
                points=points,
                where=where,
                target=form.get("target", ""),
            )
            with self._exploring:
                explored = explore(
                    self.client,
                    query,
                    spec=form.get("spec") or None,
                    owners=tuple(form["owners"]),
                    explorers=self._explorers,
                    model_dir=self.model_dir,
                    answers=self._kept_answers(),
                )
        except click.ClickException as exc:
            raise UserError(exc.format_message()) from exc
        except (DPMarketError, ValueError) as exc:
            raise UserError(str(exc)) from exc
        return self._view(explored)

    def explore_soon(
        self, form: dict[str, Any], wait: float
    ) -> tuple[dict[str, Any] | None, float]:
        """:meth:`explore`'s answer when it is ready within ``wait`` seconds, else None: it is
        computed off the request (:class:`~dpmarket.console.background.Background`, one
        computation per question; a page asking again reads it when done).

        Returns
        -------
        (dict or None, float)
            The answer (None while it is computed) and the seconds since it started.

        Raises
        ------
        UserError
            As :meth:`explore` (once, to the request that reads the result).
        """
        key = json.dumps(form, sort_keys=True)

        def answer() -> dict[str, Any]:
            with self._give_way.asked():
                return self.explore(form)

        return self._background.result(key, answer, wait)

    def _view(self, explored: Any) -> dict[str, Any]:
        """An exploration as its page shows it (:meth:`explore`), with its plot; kept for
        as long as the exploration is (a kept exploration's page is not drawn again)."""
        with self._lock:
            found = self._views.get(id(explored))
        if found is not None and found[0] is explored:  # held in the entry: its id is its own
            return found[1]
        answer = explored.answer
        rows = answer.rows()
        owners = [e.owner for e in explored.entries]
        who = owners[0] if len(owners) == 1 else f"the union of {', '.join(owners)}"
        plotted, count = rows, None
        if "count" in answer.extra:
            # In records, as `dpmarket consumer explore` prints a count; the fraction beside it.
            count = count_row(rows[0], answer.extra)
            plotted = [count]
            rows = [*plotted, {**rows[0], "label": f"{rows[0]['label']} (the fraction)"}]
        title = f"{answer.query.kind} of {who}"
        view = {
            "title": title,
            "spec": explored.spec.name,
            "reason": _why(explored.reason, explored.spec.name),
            "owners": owners,
            "n": explored.n_hat,
            "n_interval": explored.n_interval,
            "source": _how(answer.source, explored.spec.name),
            "rows": rows,
            "plotted": plotted,
            "count": count,
            "bases": list(dict.fromkeys((r["basis"], r["covers"]) for r in rows)),
            "svg": plots.interval_plot(plotted, title=title),
        }
        with self._lock:
            self._views[id(explored)] = (explored, view)
            while len(self._views) > VIEWS_KEPT:
                self._views.popitem(last=False)
        return view

    def rank(self, upload: bytes, filename: str, spec: str | None) -> dict[str, Any]:
        """Rank the owners against an uploaded validation file (``rank-owners``).

        Raises
        ------
        UserError
            For a file that cannot be read or does not match the spec, or no RFF sketch.
        """
        from dpmarket.consumer.catalogue import RANK_FLAG_NAMES
        from dpmarket.consumer.cli import rank_sketches

        with self._uploaded(upload, filename) as path:
            try:
                ranking = rank_sketches(self.client, str(path), spec)
            except click.ClickException as exc:
                raise UserError(exc.format_message()) from exc
            except (DPMarketError, ValueError) as exc:
                raise UserError(str(exc)) from exc
        rows = ranking.rows()
        for row in rows:  # named as rank-owners names them
            for flag in row["flags"]:
                flag["name"] = RANK_FLAG_NAMES.get(flag["code"], flag["code"])
        return {
            "spec": ranking.spec.name,
            "validation_points": ranking.validation_points,
            "rows": rows,
            "resolution": ranking.resolution_text(),
        }

    # ------------------------------------------------------------------------ summaries
    def _prepared(
        self,
        upload: bytes,
        filename: str,
        *,
        summary_size: int,
        method: str,
        gamma: float | None,
        min_owners: int,
    ) -> tuple[SummarizationConfig, OwnerSelection, Any]:
        """The request a summary form describes: its configuration (``gamma`` None: the width
        suited to the file's points), owner selection and validation points.

        Raises
        ------
        UserError
            For a file or parameters the console refuses.
        """
        from dpmarket.runtime.tables import load_point_set

        try:
            config = method_config(method, summary_size=summary_size)
            if gamma is not None:
                config = dataclasses.replace(config, gamma=gamma)
            selection = OwnerSelection(min_owners=min_owners)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        with self._uploaded(upload, filename) as path:
            try:
                points = load_point_set(path, schema=self.schema, by_name=True)
            except (OSError, ValueError) as exc:
                raise UserError(f"{filename}: {exc}") from exc
        # gamma None: the width the curator's refusal would suggest for these points, in the
        # units its kernel reads them (each feature scaled by the schema's bounds, if any)
        if gamma is None:
            try:
                gamma_fits = suggested_gamma(points.features, bounds=feature_bounds(self.schema))
                config = dataclasses.replace(config, gamma=gamma_fits)
            except ValueError as exc:
                raise UserError(f"{filename}: {exc}") from exc
        return config, selection, points

    def quote(
        self,
        upload: bytes,
        filename: str,
        *,
        summary_size: int,
        method: str,
        gamma: float | None,
        min_owners: int,
        max_cost: int | None,
    ) -> Quote:
        """The most the summary a form describes would cost, per owner (QuoteSession): nothing
        is released or charged, no session is created, nothing is written.

        Raises
        ------
        UserError
            For a file or parameters the console or the curator refuses, or a quote above
            ``max_cost`` (micro-credits).
        """
        config, selection, points = self._prepared(
            upload,
            filename,
            summary_size=summary_size,
            method=method,
            gamma=gamma,
            min_owners=min_owners,
        )
        try:
            return self.client.quote_session(
                config,
                points.features,
                np.zeros((0, points.n_features)),
                selection=selection,
                schema=self.schema,
                feature_names=() if self.schema is not None else points.columns,
                max_cost=max_cost,
            )
        except DPMarketError as exc:
            raise UserError(str(exc)) from exc

    def statements(self) -> list[SettledStatement]:
        """This consumer's settlement statements, newest first, at most
        :data:`STATEMENTS_SHOWN` (ListStatements).

        Raises
        ------
        DPMarketError
            When the curator does not answer.
        """
        return self.client.statements(None, STATEMENTS_SHOWN)

    def start_summary(
        self,
        upload: bytes,
        filename: str,
        *,
        summary_size: int,
        method: str,
        gamma: float | None,
        min_owners: int,
        request_id: str,
        max_cost: int | None = None,
    ) -> str:
        """Read the validation file, create the session (CreateSession) and follow it in a
        thread; return its id. A form posted twice (the same ``request_id``) gets the same
        session. ``gamma`` None (the form's field left empty): the kernel width suited to the
        file's points, the one the curator's refusal of another width names
        (:func:`dpmarket.common.summarization.kernels.suggested_gamma`). ``max_cost``
        (micro-credits): a session quoted above it is refused before anything is released.

        Raises
        ------
        UserError
            For a file or parameters the console or the curator refuses (nothing is spent).
        """
        config, selection, points = self._prepared(
            upload,
            filename,
            summary_size=summary_size,
            method=method,
            gamma=gamma,
            min_owners=min_owners,
        )
        existing = next((j for j in self.jobs.values() if j.request_id == request_id), None)
        if existing is not None:
            return existing.session_id
        try:
            session_id = self.client.create_session(
                config,
                points.features,
                np.zeros((0, points.n_features)),
                request_id=request_id,
                selection=selection,
                schema=self.schema,
                feature_names=() if self.schema is not None else points.columns,
                max_cost=max_cost,
            )
        except DPMarketError as exc:
            raise UserError(str(exc)) from exc
        names = list(self.schema.feature_names if self.schema is not None else points.columns)
        label = (self.schema.label if self.schema is not None else None) or "label"
        job = SummaryJob(session_id, config, points.features, names, label, request_id)
        with self._lock:
            self.jobs[session_id] = job
            finished = [k for k, j in self.jobs.items() if j.finished]
            for k in finished[: max(0, len(self.jobs) - MAX_JOBS)]:
                del self.jobs[k]
        threading.Thread(
            target=self._follow, args=(job,), name=f"summary-{session_id[:8]}", daemon=True
        ).start()
        return session_id

    def _follow(self, job: SummaryJob) -> None:
        """Follow a session to its end, fetch, write and record its summary."""
        from dpmarket.consumer.report import evaluate_summary, summary_curve
        from dpmarket.runtime.tables import PointSet, save_point_set

        cfg = job.config
        try:
            last_report = None
            for event, report in self.client.watch(job.session_id):
                job.add(
                    {
                        "stage": event.stage,
                        "round": event.round,
                        "total_rounds": event.total_rounds,
                        "points_accessed": event.points_accessed,
                        "message": event.message,
                    }
                )
                last_report = report
            if job.events and job.events[-1]["stage"] == "failed":
                result = spent(last_report)
                error = job.events[-1]["message"] or "the session failed"
                record = self.history.record(
                    status="failed",
                    source="console",
                    method=cfg.method,
                    summary_size=cfg.summary_size,
                    session_id=job.session_id,
                    result=result,
                    error=error,
                )
                job.finish(record, error)
                return
            summary = self.client.get_summary(job.session_id)
            folder = self.data_dir / "summaries"
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = folder / f"{job.session_id}.csv"
            save_point_set(
                PointSet(summary.points, summary.labels, "summary", columns=tuple(job.names)),
                path,
                owners=summary.owner_ids,
                label_column=job.label,
            )
            os.chmod(path, 0o600)
            scaling = feature_scaling(self.schema)  # as the session's kernel read the points
            row = evaluate_summary(summary, job.validation, cfg.gamma, scaling=scaling)
            curve = summary_curve(summary, job.validation, cfg.gamma, scaling=scaling)
            record = self.history.record(
                status="done",
                source="console",
                method=cfg.method,
                summary_size=cfg.summary_size,
                session_id=job.session_id,
                result=row.to_json(),
                summary_path=str(path),
                mmd_curve={"sizes": [float(s) for s in curve.sizes], "mmd2": list(curve.mmd2)},
            )
            job.finish(record)
        except (DPMarketError, OSError, ValueError) as exc:
            logger.warning("summary %s: %s", job.session_id[:8], exc)
            job.finish(None, str(exc))

    def record(self, key: str) -> RecordedSession | None:
        """A recorded session by its key or its session id."""
        found = self.history.get(key)
        if found is not None:
            return found
        return next(
            (r for r in self.history.entries() if r.session_id and r.session_id == key), None
        )

    def summary_file(self, record: RecordedSession) -> Path | None:
        """The summary file of a record, when it is the consumer's and still there."""
        if not record.summary_path:
            return None
        path = Path(record.summary_path)
        return path if path.is_file() else None

    # ------------------------------------------------------------------------ uploads
    def _uploaded(self, data: bytes, filename: str) -> _Upload:
        if not data:
            raise UserError("choose a validation file (.csv, .parquet, .npy)")
        if len(data) > MAX_UPLOAD_BYTES:
            raise UserError(f"{filename} is over {MAX_UPLOAD_BYTES >> 20} MiB")
        suffix = Path(filename).suffix.lower()
        if suffix not in (".csv", ".parquet", ".npy", ".npz"):
            raise UserError(f"{filename}: a .csv, .parquet, .npy or .npz file, please")
        return _Upload(data, suffix, self.data_dir)


def _how(source: str, spec: str) -> str:
    """What answered (``"<spec> (histogram)"``...), without the spec's name the page shows
    beside it: ``"histogram"``."""
    prefix = f"{spec} ("
    if source.startswith(prefix) and source.endswith(")"):
        return source[len(prefix) : -1]
    return source


def _why(reason: str, spec: str) -> str:
    """Why the sketch was chosen (``"<spec>: narrowest 95 % interval..."``), without the
    spec's name the page's sentence starts with (``"From <spec> (histogram), n ≈ ...: "``)."""
    return reason.removeprefix(f"{spec}: ")


def end_with(parent: int) -> threading.Thread:
    """In a child process: end it (``os._exit(0)``) once its parent ``parent`` (a pid) has
    ended, looked at every :data:`PARENT_CHECK_SECONDS` by a daemon thread (returned)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)  # what is half written is a temporary file: the store keeps whole files

    thread = threading.Thread(target=watch, name="end-with-parent", daemon=True)
    thread.start()
    return thread


def _refit_child(fits: list[Any], model_dir: str, console: int) -> None:
    """The refitting process (:meth:`ConsumerConsole._refit_elsewhere`): lower its priority,
    then fit into the model store; it ends as soon as the console's process ``console`` has
    (a console stopped by a signal exits without ending its children: the refits went on for
    a minute or more beside the next console's)."""
    from dpmarket.consumer.catalogue import refit_into_store

    end_with(console)
    with contextlib.suppress(OSError):
        os.nice(REFIT_NICENESS)
    refit_into_store(fits, model_dir)


class _Upload:
    """An uploaded file on disk for as long as it is read: a private temporary file (0600) in
    the consumer's data directory, deleted on exit."""

    def __init__(self, data: bytes, suffix: str, folder: Path) -> None:
        self.data, self.suffix, self.folder = data, suffix, folder
        self.path: Path | None = None

    def __enter__(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(
            prefix=f".upload-{uuid.uuid4().hex[:8]}-", suffix=self.suffix, dir=self.folder
        )
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.data)
        self.path = Path(name)
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
