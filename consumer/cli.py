"""A consumer's commands: ``request`` a summary, ``health`` of a service, the ``cape`` jobs
(``mean``, ``linreg``, ``logreg``, ``train``), the sketch catalogue (``consumer specs``,
``consumer sketches``), ``explore`` and ``rank-owners``.

``request`` and the ``cape`` jobs ask the curator, over mTLS, to run a session or a job across
the owners. Exploration and ranking read the catalogue once and compute locally
(:mod:`dpmarket.consumer.explore`): no owner is called, and the validation set never leaves the
consumer's process. :func:`protocol_options` and the input helpers are shared with
``dpmarket lab simulate`` (:mod:`dpmarket.experiments.cli`).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from dpmarket.common.errors import DPMarketError, InvalidArgumentError
from dpmarket.common.market.money import credits_text, parse_credits
from dpmarket.common.market.payouts import PAYOUT_CHARGE_LABEL
from dpmarket.common.market.terms import NO_REWARD, RewardOffer
from dpmarket.common.schema import Schema
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.common.summarization.methods import (
    SummarizationConfig,
)
from dpmarket.common.summarization.session_ledger import CountsAllocationReport
from dpmarket.common.summarization.summary import OwnerSelection, SessionReport, SummaryResult
from dpmarket.common.uncertainty import interval_text
from dpmarket.consumer.client import SessionFailedError
from dpmarket.consumer.options import (
    BASIC_FIELDS,
    METHOD_SECTIONS,
    check_method_options,
    method_options,
    summarization_config,
)
from dpmarket.runtime.cli import (
    SectionedCommand,
    check_outputs,
    console,
    curator_identity,
    curator_options,
    json_option,
    print_json,
    print_table,
    progress_printer,
    security_from_options,
    tls_options,
    write_output,
)
from dpmarket.runtime.files import write_json
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.schemas import load_schema
from dpmarket.runtime.tables import PointSet, load_point_set

__all__ = [
    "CAPE_COMMANDS",
    "Inputs",
    "cape_group",
    "explore_command",
    "finish",
    "list_command",
    "load_points",
    "protocol_options",
    "rank_owners_command",
    "rank_sketches",
    "read_inputs",
    "request",
    "specs_command",
    "summarization_config",
    "summary_output_options",
]

if TYPE_CHECKING:
    from rich.progress import Progress

    from dpmarket.common.cape.spec import AnyCapeSpec
    from dpmarket.common.cape.uncertainty import Estimate, Flag
    from dpmarket.common.market.pricing import Quote
    from dpmarket.consumer.cape_report import CapeReport
    from dpmarket.consumer.catalogue import Exploration, Ranking
    from dpmarket.consumer.client import CapeNetwork, CuratorClient
    from dpmarket.consumer.explore import Query

logger = logging.getLogger("dpmarket")


# ------------------------------------------------------------------------- summaries
#: Where ``request`` and ``simulate`` list the options their commands add, after the basics,
#: and the methods' sections (:data:`dpmarket.consumer.options.SECTIONS`), in the help's order.
BASIC_OPTIONS = (
    "config",
    "curator",
    "owner_paths",
    "validation_path",
    *BASIC_FIELDS[:1],
    "method",
    *BASIC_FIELDS[1:],
    "seed",
    "out_path",
    "report_path",
)
INPUT_OPTIONS = ("seed_set_path", "test_path")
OUTPUT_OPTIONS = ("wide", "as_json", "plot_path")
TLS_OPTIONS = ("ca_path", "cert_path", "key_path", "pki_dir", "name", "insecure")
#: ``--config``'s help in the basics (its whole help: ``runtime.cli.CONFIG_HELP``, every other
#: command's ``--help``).
CONFIG_BRIEF = "Option values from a TOML file."


def summary_sections(*command: tuple[str, tuple[str, ...]]) -> list[tuple[str, tuple[str, ...]]]:
    """The help's sections of a summarization command: the basics, the command's own
    sections, inputs and outputs, the methods' options, the connection."""
    return [
        ("Basics", BASIC_OPTIONS),
        *command,
        ("Inputs and outputs", (*INPUT_OPTIONS, *OUTPUT_OPTIONS)),
        *((title, ()) for title in METHOD_SECTIONS),
        ("Connection (mTLS)", TLS_OPTIONS),
    ]


def protocol_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by ``request`` and ``simulate``: the inputs, the outputs and the
    method's options (:func:`dpmarket.consumer.options.method_options`, generated from the
    methods' configuration fields; defaults: Section 4, Table 1)."""
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--validation",
            "validation_path",
            required=True,
            type=click.Path(exists=True, dir_okay=False),
            help="The validation set D_v (no labels sent).",
        ),
        click.option(
            "--seed-set",
            "seed_set_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="Public seed set D_init (default: none).",
        ),
        method_options,
        click.option(
            "--test",
            "test_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="Labeled target test set: adds MMD² to it and downstream accuracy.",
        ),
        click.option(
            "--seed",
            default=None,
            type=click.IntRange(min=0),
            help="Seed every draw (default: a CSPRNG).",
        ),
        click.option(
            "--out",
            "out_path",
            default="summary.npy",
            type=click.Path(dir_okay=False),
            help="The summary (.npy, .csv or .parquet).",
        ),
        click.option(
            "--report",
            "report_path",
            default="report.json",
            type=click.Path(dir_okay=False),
            help="The JSON report.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def load_points(
    path: str, *, label_column: str | None = "label", schema: Schema | None = None
) -> PointSet:
    """Read a points file (:func:`dpmarket.runtime.tables.load_point_set`); a missing or
    malformed file fails the command with its name. With a schema, a table's features are
    selected by name in the schema's order (another column order is reordered, a column the
    schema lacks refused)."""
    try:
        return load_point_set(path, label_column=label_column, schema=schema, by_name=True)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


def read_schema(path: str | None, option: str = "--schema") -> Schema | None:
    """Read a schema file (``None``: none given); a bad file is a bad parameter."""
    if path is None:
        return None
    try:
        return load_schema(path)
    except (OSError, ValueError) as exc:
        hint = ""
        if "['features'" in str(exc) or "'target'" in str(exc):
            hint = (
                ". The [features]/[target] layout is replaced by the schema's: [[columns]] "
                "tables (name, type, low, high or levels) and label = COLUMN (docs/reference.md)"
            )
        raise click.BadParameter(f"{exc}{hint}", param_hint=option) from exc


def _seed_set(path: str | None, n_features: int, schema: Schema | None) -> NDArray[np.float64]:
    if path is None:
        return np.zeros((0, n_features))
    seed_set = load_points(path, schema=schema)
    _check_width(seed_set, n_features, path, "--seed-set")
    return seed_set.features


def _check_width(points: PointSet, n_features: int, path: str, option: str) -> None:
    if points.n_features != n_features:
        raise click.BadParameter(
            f"{path} has {points.n_features} features per point but the validation set has "
            f"{n_features}",
            param_hint=option,
        )


@dataclass(frozen=True)
class Inputs:
    """A consumer's inputs, all read and checked before anything is released."""

    validation: PointSet
    seed_set: NDArray[np.float64]
    test: PointSet | None
    schema: Schema | None = None


def read_inputs(
    validation_path: str,
    seed_set_path: str | None,
    test_path: str | None,
    schema: Schema | None = None,
) -> Inputs:
    """Read and check every input file, and check every output can be written, before a session.

    A bad file (NaN/inf, wrong width, unreadable, a table unlike the schema) is refused here
    with the file's name, so no privacy is spent on a run whose results could not be evaluated
    or saved. With a schema, tables are read through it (columns by name). A test set without
    labels (a plain ``.npy`` with no ``<stem>.labels.npy`` beside it) is accepted: the report
    then gives the summary's MMD² to it and no accuracy.
    """
    validation = load_points(validation_path, schema=schema)
    n = validation.n_features
    seed_set = _seed_set(seed_set_path, n, schema)
    test = None
    if test_path is not None:
        test = load_points(test_path, schema=schema)
        _check_width(test, n, test_path, "--test")
        if test.labels is None:
            console.print(
                f"{test_path} has no labels: the report gives MMD² to it, and no accuracy"
            )
    return Inputs(validation, seed_set, test, schema)


def summary_output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--wide``, ``--json`` and ``--plot``: how ``request`` and ``simulate`` show a summary."""
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--wide",
            is_flag=True,
            help="Every column of the result table (default: a compact table for 80 columns).",
        ),
        json_option,
        click.option(
            "--plot",
            "plot_path",
            default=None,
            type=click.Path(dir_okay=False),
            help="Also draw the summary into this PNG: MMD² of its first k points to the "
            "validation set, and each owner's share.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def finish(
    result: SummaryResult,
    inputs: Inputs,
    config: SummarizationConfig,
    out_path: str,
    report_path: str,
    seed: int | None,
    *,
    wide: bool = False,
    as_json: bool = False,
    plot_path: str | None = None,
) -> dict[str, Any]:
    """Evaluate a summary as the consumer would, write it and its report, show the result.

    The report (``{"config", "result"}``) goes to ``report_path`` and, with ``as_json``, to
    stdout instead of the table; ``plot_path`` also gets the plot
    (:func:`dpmarket.consumer.report.plot_request`). Returns the report.
    """
    from dpmarket.common.summarization.kernels import feature_scaling
    from dpmarket.consumer.report import comparison_table, evaluate_summary, plot_request
    from dpmarket.runtime.tables import save_point_set

    # The MMD² read as the session's kernel read the points: scaled by the schema's bounds.
    scaling = feature_scaling(inputs.schema)
    evaluation = replace(
        evaluate_summary(
            result,
            inputs.validation.features,
            config.gamma,
            test=inputs.test,
            seed=seed or 0,
            scaling=scaling,
        ),
        label=config.method,
    )
    out = Path(out_path)
    names = inputs.schema.feature_names if inputs.schema is not None else inputs.validation.columns
    label = inputs.schema.label if inputs.schema is not None else None
    save_point_set(
        PointSet(result.points, result.labels, "summary", columns=names),
        out,
        owners=result.owner_ids,
        label_column=label or "label",
        schema=inputs.schema,
    )
    document = {"config": config.to_json(), "result": evaluation.to_json()}
    write_json(document, report_path)
    title = f"{config.method} summary of {len(result.points)} points"
    if plot_path is not None:
        plot_request(
            result,
            inputs.validation.features,
            config.gamma,
            plot_path,
            title=title,
            scaling=scaling,
        )
    if as_json:
        print_json(document)
    else:
        print_table(comparison_table([evaluation], title=title, wide=wide), wide=wide)
    for line in charge_lines(result.report):
        console.print(line, highlight=False)
    report = result.report
    if report.cost is not None:
        quoted = (
            "" if report.quote is None else f" (quoted at most {credits_text(report.quote.total)})"
        )
        console.print(
            f"cost: {credits_text(report.cost)} credits{quoted}; the signed statement: "
            "dpmarket consumer statements",
            highlight=False,
        )
    if result.report.left_out:
        console.print(
            "[yellow]left out: "
            + ", ".join(f"{o} ({why})" for o, why in result.report.left_out.items()),
            highlight=False,
        )
    written = f"summary -> {out}, report -> {report_path}"
    console.print(written + ("" if plot_path is None else f", plot -> {plot_path}"))
    return document


def charge_lines(report: SessionReport) -> list[str]:
    """Which allocation a candidates session used and what each owner's ledger recorded for the
    session (``report.owner_spend``), as ``request`` prints them.

    Returns
    -------
    list of str
        ``allocation: sketch (...)`` or ``allocation: counts (...)`` (in rich's yellow when the
        sketches were missing) when the method has an allocation, then ``charged: OWNER epsilon
        E (N points read), ...`` when the owners' spends are known.
    """
    lines = []
    allocation = report.ledger.candidates
    if isinstance(allocation, CountsAllocationReport):
        why = allocation.allocation_note or "requested"
        warn = "" if why == "requested" else "[yellow]"  # the sketches were missing
        lines.append(
            f"{warn}allocation: counts (each owner's noisy relevance count, charged to it; {why})"
        )
    elif allocation is not None:
        lines.append("allocation: sketch (the owners' published sketches; no charge to them)")
    if report.owner_spend:
        payout = _payout_epsilon(report)
        charges = []
        for owner, spend in sorted(report.owner_spend.items()):
            if spend.unknown:
                charges.append(f"{owner} unknown ({spend.unknown})")
                continue
            delta = f", delta {spend.delta:g}" if spend.delta else ""
            # The payout release: charged by every owner that released a point (before it did).
            paid = f" + payout release {payout:g}" if payout and spend.points else ""
            charges.append(
                f"{owner} epsilon {spend.epsilon:g}{delta}{paid} ({spend.points} points read)"
            )
        lines.append("charged: " + ", ".join(charges))
    return lines


def _payout_epsilon(report: SessionReport) -> float:
    """The epsilon the session's payout release charged each owner that released a point (the
    ``"owners"`` charges of the session's ledger labelled :data:`PAYOUT_CHARGE_LABEL`), 0 when
    there is none."""
    book = report.ledger.party("owners")
    if book is None:
        return 0.0
    return sum(
        c.event.epsilon * c.event.count for c in book.entries if c.label == PAYOUT_CHARGE_LABEL
    )


def _failed(exc: SessionFailedError, config: SummarizationConfig, report_path: str) -> None:
    """Write a failed session's report (its ledger: what it spent) and fail the command."""
    report = exc.report.to_json() if exc.report is not None else None
    write_json({"config": config.to_json(), "error": str(exc), "report": report}, report_path)
    spent = ""
    if exc.report is not None and not exc.report.ledger.empty:
        parties = {
            party: book.parties[party].basic
            for party in ("validation", "owners")
            if (book := exc.report.ledger.party(party)) is not None
        }
        spent = "; spent (basic composition): " + ", ".join(
            f"epsilon {eps:g} on {party}" for party, eps in parties.items()
        )
    raise click.ClickException(f"{exc}{spent}; report with the ledger -> {report_path}")


class _Credits(click.ParamType):
    """An amount of credits (a decimal string, six decimals at most), as micro-credits, read by
    :func:`~dpmarket.common.market.money.parse_credits` as the client reads ``max_cost``: ``5``
    (on the command line or in a configuration file) is 5 credits."""

    name = "credits"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_credits(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


#: The type of every option that takes credits (``--max-cost``, ``--reward``).
CREDITS = _Credits()


@click.command(
    "request",
    cls=SectionedCommand,
    sections=summary_sections(
        (
            "Request",
            ("curator_name", "request_id", "min_owners", "exclude_owners", "schema_path"),
        ),
        ("Market", ("max_cost", "quote_only", "reward", "reward_rule", "payout_epsilon")),
    ),
    briefs={"config": CONFIG_BRIEF},
)
@click.option("--curator", required=True, metavar="HOST:PORT", help="The curator service.")
@click.option(
    "--curator-name",
    default="curator",
    help="The name the curator's certificate must carry.",
)
@click.option(
    "--request-id",
    default=None,
    help="Idempotency key: a retry with the same key returns the same session and spends "
    "nothing new (default: a fresh random key).",
)
@click.option(
    "--min-owners",
    default=None,
    type=click.IntRange(min=1),
    metavar="N",
    help="Let the session run without owners that refuse their terms (budget) or cannot be "
    "reached when it opens, as long as at least N take part; the report names who was left "
    "out and why. Default: every owner asked (all but --exclude-owner) must take part, or the "
    "request fails saying how many were reachable, nothing spent.",
)
@click.option(
    "--exclude-owner",
    "exclude_owners",
    multiple=True,
    metavar="NAME",
    help="Leave this owner out of the session (never asked anything); repeat.",
)
@click.option(
    "--schema",
    "schema_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The data's public schema (TOML): tables are read through it (features by name, in "
    "its order) and the curator refuses owners that declare another.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The consumer's data directory: each request's outcome (method, spend, each owner's "
    "share, MMD², where the summary went; never the validation set) is recorded in its "
    "sessions/ folder, where `dpmarket console` lists the consumer's past sessions.",
)
@click.option(
    "--max-cost",
    default=None,
    type=CREDITS,
    metavar="CREDITS",
    help="The most the request may cost, in credits (e.g. 12.5). The curator quotes the "
    "request's maximum cost from every owner's prices before anything is released; a quote "
    "above this cap is refused and nothing is released or charged anywhere. Default: no cap.",
)
@click.option(
    "--reward",
    default=None,
    type=CREDITS,
    metavar="CREDITS",
    help="A value-based reward paid on top of the owners' prices, split among the owners by a "
    "private attribution of the summary's value against your validation set (a Laplace "
    "release of every owner's Shapley value, charged to your validation set and to the "
    "owners that delivered points). Default: none.",
)
@click.option(
    "--reward-rule",
    type=click.Choice(["value", "proportional"]),
    default="value",
    show_default=True,
    help="value: the reward per unit of value, each owner paid on an estimate of its own value "
    "(at most the reward in all); proportional: the reward split in proportion to the noisy "
    "values (exactly the reward, at up to 4x the noise).",
)
@click.option(
    "--payout-epsilon",
    type=float,
    default=1.0,
    show_default=True,
    help="epsilon of the payout release (with --reward).",
)
@click.option(
    "--quote-only",
    is_flag=True,
    help="Print the request's quote (the most it can cost, per owner) and stop: nothing is "
    "released or charged, no session is created, nothing is written.",
)
@protocol_options
@summary_output_options
@tls_options
def request(
    curator: str,
    curator_name: str,
    request_id: str | None,
    min_owners: int | None,
    exclude_owners: tuple[str, ...],
    schema_path: str | None,
    data_dir: str | None,
    max_cost: int | None,
    reward: int | None,
    reward_rule: str,
    payout_epsilon: float,
    quote_only: bool,
    summary_size: int,
    method: str,
    validation_path: str,
    seed_set_path: str | None,
    test_path: str | None,
    seed: int | None,
    out_path: str,
    report_path: str,
    wide: bool,
    as_json: bool,
    plot_path: str | None,
    ca_path: str | None,
    cert_path: str | None,
    key_path: str | None,
    pki_dir: str | None,
    name: str | None,
    insecure: bool,
    **kwargs: Any,
) -> None:
    """Ask a running curator (over mTLS) for a summary matching a validation set."""

    from dpmarket.consumer.client import CuratorClient

    check_method_options(click.get_current_context(), method)
    security = security_from_options(
        "consumer", ca_path, cert_path, key_path, pki_dir, name, insecure
    )
    config = summarization_config(summary_size, method, kwargs)
    try:
        selection = OwnerSelection(min_owners or 0, exclude_owners)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--exclude-owner") from exc
    schema = read_schema(schema_path)
    inputs = read_inputs(validation_path, seed_set_path, test_path, schema)
    _check_kernel(inputs, config, schema)
    offer = _reward_offer(reward, reward_rule, payout_epsilon)
    ask = _Ask(config, inputs, schema, seed, selection, max_cost, offer)
    connect = functools.partial(
        CuratorClient, curator, security, curator=curator_identity(curator_name)
    )
    if quote_only:
        _print_quote(connect, ask, as_json=as_json, wide=wide)
        return
    check_outputs(out_path, report_path, *([] if plot_path is None else [plot_path]))
    result, session_id, record = _summarize(connect, ask, method, request_id, data_dir, report_path)
    document = finish(
        result,
        inputs,
        config,
        out_path,
        report_path,
        seed,
        wide=wide,
        as_json=as_json,
        plot_path=plot_path,
    )
    if data_dir is not None:
        _record_done(
            data_dir,
            config,
            document,
            out_path,
            result,
            inputs.validation.features,
            session_id,
            record,
            inputs.schema,
        )


def _check_kernel(inputs: Inputs, config: SummarizationConfig, schema: Schema | None) -> None:
    """Refuse, before the curator is called (nothing asked of an owner, nothing charged), a
    validation set the curator's session would refuse: too few points, or a ``gamma`` that
    cannot tell its points apart
    (:func:`~dpmarket.common.summarization.kernels.check_validation_set`, the curator's own
    check; its message names the ``--gamma`` that fits, or how to rescale the features by the
    schema's public bounds when no ``gamma`` the curator's default range admits does).

    Raises
    ------
    click.UsageError
        With the check's message.
    """
    from dpmarket.common.summarization.kernels import check_validation_set, feature_bounds

    try:
        check_validation_set(
            inputs.validation.features, config.gamma, bounds=feature_bounds(schema)
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


@dataclass(frozen=True)
class _Ask:
    """What ``request`` asks the curator, the same for its quote and for its session."""

    config: SummarizationConfig
    inputs: Inputs
    schema: Schema | None
    seed: int | None
    selection: OwnerSelection
    max_cost: int | None
    reward: RewardOffer

    def data(self) -> tuple[SummarizationConfig, NDArray[np.float64], NDArray[np.float64]]:
        """The configuration, validation features and seed set (positional arguments of
        :meth:`~dpmarket.consumer.client.CuratorClient.quote_session` and ``summarize``)."""
        return self.config, self.inputs.validation.features, self.inputs.seed_set

    def terms(self) -> dict[str, Any]:
        """Their keyword arguments shared by the quote and the session: seed, owner selection,
        schema (or the validation set's column names without one), cost cap and reward."""
        return {
            "seed": self.seed,
            "selection": self.selection,
            "schema": self.schema,
            "feature_names": () if self.schema is not None else self.inputs.validation.columns,
            "max_cost": self.max_cost,
            "reward": self.reward,
        }


def _print_quote(
    connect: Callable[[], CuratorClient], ask: _Ask, *, as_json: bool, wide: bool
) -> None:
    """Ask the curator what ``ask`` would cost (QuoteSession: nothing released or charged) and
    print the quote, as JSON or a table; :class:`click.ClickException` on the curator's refusal."""
    from dpmarket.consumer.market import quote_json, quote_table

    try:
        with connect() as client:
            quoted = client.quote_session(*ask.data(), **ask.terms())
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        print_json(quote_json(quoted))
    else:
        print_table(quote_table(quoted, wide=wide), wide=wide)


def _summarize(
    connect: Callable[[], CuratorClient],
    ask: _Ask,
    method: str,
    request_id: str | None,
    data_dir: str | None,
    report_path: str,
) -> tuple[SummaryResult, str, str | None]:
    """Run ``ask``'s session to its summary, printing its quote, id and progress (as
    ``--method``'s progress printer shows it); return the summary, the session's id (as
    printed; "" if the curator named none) and its record's key in ``data_dir``'s history
    (None without one). The record is written as soon as the curator has created the session
    (``running``, with its id, request key, quote and owners), so that a session whose curator
    is lost stays listed (``dpmarket consumer sessions``).

    Raises
    ------
    click.ClickException
        If the session failed (its report, with what it spent, written to ``report_path`` and
        recorded in ``data_dir``'s history), or the curator refused or was lost (naming the
        session when it was created, so that its report can be asked for later).
    """
    from dpmarket.consumer.market import quote_line

    config = ask.config
    progress, update = progress_printer(method)
    created: list[str] = []
    record: list[str] = []  # the history record's key, once written
    key = request_id if request_id is not None else uuid.uuid4().hex

    def on_created(session_id: str) -> None:
        created.append(session_id)
        console.print(f"session {session_id} created", highlight=False)
        if data_dir is not None:
            record.extend(_record_running(data_dir, config, session_id, key, client.last_quote))

    try:
        with connect() as client, progress:
            result = client.summarize(
                *ask.data(),
                **ask.terms(),
                on_progress=update,
                request_id=key,
                on_quote=lambda q: progress.console.print(quote_line(q), highlight=False),
                on_created=on_created,
            )
    except SessionFailedError as exc:
        if data_dir is not None:
            _record_failure(data_dir, exc, config, record[0] if record else None)
        _failed(exc, config, report_path)
    except DPMarketError as exc:
        # After the session was created (the curator lost, say): name it, so that it can be
        # asked about once the curator is back; its record stays unfinished, with the reason.
        where = f" (session {created[0]})" if created else ""
        if data_dir is not None and record:
            where += (
                f"; recorded as unfinished in {data_dir}: dpmarket consumer sessions --data-dir "
                f"{data_dir} --check asks the curator again"
            )
            _record_lost(data_dir, config, created[0], record[0], exc)
        raise click.ClickException(f"{exc}{where}") from exc
    return result, (created[0] if created else ""), (record[0] if record else None)


def _reward_offer(reward: int | None, reward_rule: str, payout_epsilon: float) -> RewardOffer:
    """``--reward`` (micro-credits, read by :data:`CREDITS`) with its rule and payout epsilon as
    a reward offer; :class:`click.BadParameter` naming the option."""
    if reward is None:
        return NO_REWARD
    try:
        return RewardOffer(reward_rule, reward, payout_epsilon)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--reward") from exc


def _record_done(
    data_dir: str,
    config: SummarizationConfig,
    document: dict[str, Any],
    out_path: str,
    result: SummaryResult,
    validation: NDArray[np.float64],
    session_id: str,
    key: str | None,
    schema: Schema | None = None,
) -> None:
    """Record a finished request in the consumer's history (best effort: a warning on error):
    with the session's id as printed (one id in the CLI and the console alike) and the MMD
    curve the console draws for its own sessions (the points scaled by ``schema``'s bounds, as
    the session's kernel read them); ``key``: the running record it replaces."""
    from dpmarket.common.summarization.kernels import feature_scaling
    from dpmarket.consumer.history import SessionHistory
    from dpmarket.consumer.report import summary_curve

    scaling = feature_scaling(schema)
    curve = summary_curve(result, validation, config.gamma, scaling=scaling)
    try:
        SessionHistory(data_dir).record(
            status="done",
            source="request",
            method=config.method,
            summary_size=config.summary_size,
            session_id=session_id,
            result=document["result"],
            summary_path=str(Path(out_path).resolve()),
            mmd_curve={"sizes": [float(k) for k in curve.sizes], "mmd2": list(curve.mmd2)},
            key=key,
        )
    except OSError as exc:
        console.print(f"[yellow]not recorded in {data_dir}: {exc}", highlight=False)


def _record_failure(
    data_dir: str, exc: SessionFailedError, config: SummarizationConfig, key: str | None
) -> None:
    """Record a failed request in the consumer's history (best effort: a warning on error),
    replacing its running record ``key``."""
    from dpmarket.consumer.history import SessionHistory, spent

    try:
        SessionHistory(data_dir).record(
            status="failed",
            source="request",
            method=config.method,
            summary_size=config.summary_size,
            session_id=exc.session_id,
            result=spent(exc.report),
            error=str(exc),
            key=key,
        )
    except OSError as err:
        console.print(f"[yellow]not recorded in {data_dir}: {err}", highlight=False)


def _record_running(
    data_dir: str,
    config: SummarizationConfig,
    session_id: str,
    request_id: str,
    quoted: Quote | None,
) -> list[str]:
    """Record a session the curator has just created (``running``, with its request key,
    quote and owners; best effort: a warning on error); ``[its key]``, or ``[]``."""
    from dpmarket.consumer.history import SessionHistory
    from dpmarket.consumer.market import quote_json

    try:
        entry = SessionHistory(data_dir).record(
            status="running",
            source="request",
            method=config.method,
            summary_size=config.summary_size,
            session_id=session_id,
            request_id=request_id,
            quote=None if quoted is None else quote_json(quoted),
            owners=[] if quoted is None else [line.owner for line in quoted.lines],
        )
    except OSError as exc:
        console.print(f"[yellow]not recorded in {data_dir}: {exc}", highlight=False)
        return []
    return [entry.key]


def _record_lost(
    data_dir: str, config: SummarizationConfig, session_id: str, key: str, exc: Exception
) -> None:
    """Keep a session's record unfinished, with why its end is not known (the curator lost)."""
    from dpmarket.consumer.history import SessionHistory

    try:
        SessionHistory(data_dir).record(
            status="running",
            source="request",
            method=config.method,
            summary_size=config.summary_size,
            session_id=session_id,
            error=f"lost before the session ended: {exc}",
            key=key,
        )
    except OSError as err:
        console.print(f"[yellow]not recorded in {data_dir}: {err}", highlight=False)


# ------------------------------------------------------------------------------ CAPE
def _bound(text: str, option: str) -> tuple[str, float, float]:
    """``COLUMN=LOW:HIGH`` -> (column, low, high)."""
    column, eq, rest = text.partition("=")
    low, colon, high = rest.partition(":")
    try:
        if not (column and eq and colon):
            raise ValueError("expected COLUMN=LOW:HIGH")
        return column, float(low), float(high)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint=option) from exc


def _feature(text: str, schema: Schema | None) -> tuple[str, float, float]:
    """``--feature``: ``COLUMN=LOW:HIGH``, or ``COLUMN`` with its bounds from the schema."""
    if schema is None or "=" in text:
        return _bound(text, "--feature")
    try:
        return schema.bounds([text])[0]
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc), param_hint="--feature") from exc


def _columns(
    schema: Schema | None, features: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> list[tuple[str, float, float]]:
    """The job's columns: each ``--feature``, or else every feature column of the schema (its
    columns but the label and ``exclude``)."""
    if features:
        columns = [_feature(f, schema) for f in features]
    elif schema is not None:
        columns = [c for c in schema.bounds() if c[0] not in exclude]
    else:
        columns = []
    if not columns:
        raise click.UsageError("give the columns and their bounds (--bounds or --feature)")
    return columns


def _target(text: str | None, schema: Schema | None, task: str) -> tuple[str, float, float] | None:
    """``--target``: ``COLUMN=LOW:HIGH``; ``COLUMN`` (bounds from the schema, or 0/1 for a
    logistic target); or, left out, the schema's label."""
    if text is not None and "=" in text:
        return _bound(text, "--target")
    column = text if text is not None else None if schema is None else schema.label
    if column is None:
        return None
    if task == "logistic":  # a 0/1 column the owners declare: it needs no bounds
        return (column, 0.0, 1.0)
    if schema is None:
        raise click.BadParameter(
            f"{column!r}: a linear regression's target needs public bounds: --target "
            f"{column}=LOW:HIGH, or a schema (--bounds) that declares them",
            param_hint="--target",
        )
    try:
        return schema.bounds([column])[0]
    except InvalidArgumentError as exc:
        raise click.BadParameter(str(exc), param_hint="--target") from exc


def _cape_options(default_out: str, default_delta: float) -> list[Callable[..., Any]]:
    """Options every ``dpmarket consumer cape`` job command takes."""
    return [
        click.option("--curator", required=True, metavar="HOST:PORT", help="The curator."),
        click.option("--curator-name", default="curator", help="The curator's certificate name."),
        click.option(
            "--bounds",
            "--schema",
            "bounds_path",
            default=None,
            type=click.Path(exists=True, dir_okay=False),
            help="The data's public schema (TOML, [[columns]] with public bounds): the job's "
            "columns and bounds come from it (default: every column but the label; a model's "
            "target: --target, or the label), and the curator refuses owners that declare "
            "another schema. Public bounds, never statistics of the private data; owners clamp "
            "values outside them.",
        ),
        click.option(
            "--feature",
            "features",
            multiple=True,
            metavar="COLUMN[=LOW:HIGH]",
            help="A column and its public bounds (bounds from --schema when left out); repeat. "
            "Default: the schema's columns.",
        ),
        click.option("--epsilon", default=1.0, type=click.FloatRange(min=0, min_open=True)),
        click.option(
            "--delta",
            default=default_delta,
            type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
        ),
        click.option(
            "--colluders",
            default=None,
            type=click.IntRange(min=0),
            help="S_C: owners that may collude with the curator (default ceil(S/3) - 1, raised "
            "to every owner's policy floor; an owner refuses a value below its floor); the "
            "noise variance grows with it: F = S (S + S_H) / (S_H (S + 1)) times the pooled "
            "mechanism's, S_H = S - S_C.",
        ),
        click.option("--seed", default=None, type=click.IntRange(min=0), help="Reproducible runs."),
        click.option("--request-id", default=None, help="Idempotency key (default: random)."),
        click.option(
            "--max-cost",
            default=None,
            type=CREDITS,
            metavar="CREDITS",
            help="The most the job may cost, in credits (e.g. 12.5). The curator quotes it from "
            "every owner's prices (per unit of epsilon, and each owner's minimum) before any "
            "owner opens it; a quote above this cap is refused and nothing is charged anywhere. "
            "Default: no cap.",
        ),
        click.option(
            "--quote-only",
            is_flag=True,
            help="Print the job's quote (the most it can cost, per owner) and stop: nothing is "
            "opened, released or charged, no job is recorded, nothing is written.",
        ),
        click.option(
            "--min-owners",
            default=None,
            type=click.IntRange(min=1),
            metavar="N",
            help="Let the job run without owners that cannot be reached or refuse it (their "
            "budget, their policy) when it opens, as long as at least N open it (the report's "
            "'dropped' names who was left out, and why). Default: every "
            "owner the curator serves must, or the job fails before anything is charged.",
        ),
        click.option(
            "--out",
            "out_path",
            default=default_out,
            type=click.Path(dir_okay=False),
            help="Where to write the estimate or model and its report (JSON).",
        ),
        json_option,
    ]


_CALIBRATION_OPTION = click.option(
    "--calibration",
    type=click.Choice(["exact", "theorem1"]),
    default="exact",
    help="Noise from the exact privacy profile (tight) or Theorem 1's bound.",
)


def _cape_command(
    name: str, options: list[Callable[..., Any]], doc: str
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Make ``dpmarket consumer cape NAME`` with the shared options, then ``options``, then
    mTLS; the command joins :data:`CAPE_COMMANDS`."""

    def register(func: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            func = option(func)
        for option in reversed(_cape_options(*_CAPE_DEFAULTS[name])):
            func = option(func)
        func = tls_options(func)
        func.__doc__ = doc
        command = click.command(name)(func)
        CAPE_COMMANDS.append(command)
        return command

    return register


#: The consumer's ``dpmarket consumer cape`` commands (:func:`cape_group`).
CAPE_COMMANDS: list[click.Command] = []

#: Per command: default --out and --delta.
_CAPE_DEFAULTS = {
    "linreg": ("model.json", 1e-6),
    "logreg": ("model.json", 1e-6),
    "mean": ("mean.json", 1e-6),
    "train": ("network.json", 1e-6),
}


def _ask_curator(
    curator: str, curator_name: str, tls: dict[str, Any], call: Callable[[Any], Any]
) -> Any:
    """Call the curator as a consumer; a refusal becomes a ClickException."""

    from dpmarket.consumer.client import CuratorClient

    security = security_from_options("consumer", **tls)
    try:
        with CuratorClient(curator, security, curator=Identity("curator", curator_name)) as c:
            return call(c)
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


def _job_options(
    seed: int | None,
    request_id: str | None,
    schema: Any,
    min_owners: int | None,
    max_cost: int | None,
) -> dict[str, Any]:
    """The keyword arguments every CAPE call of :class:`CuratorClient` takes, from the options."""
    return {
        "seed": seed,
        "request_id": request_id,
        "schema": schema,
        "min_owners": min_owners or 0,
        "max_cost": max_cost,
    }


def _print_cape_quote(
    curator: str,
    curator_name: str,
    tls: dict[str, Any],
    spec: AnyCapeSpec,
    options: dict[str, Any],
    as_json: bool,
) -> None:
    """``--quote-only``: ask the curator what the job would cost (QuoteCape: nothing opened,
    released or charged) and print the quote, as JSON or a table."""
    from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec
    from dpmarket.consumer.market import quote_json, quote_table

    terms = {k: v for k, v in options.items() if k != "request_id"}
    quoted = _ask_curator(curator, curator_name, tls, lambda c: c.quote_cape(spec, **terms))
    if as_json:
        print_json(quote_json(quoted))
    else:
        task = spec.task if isinstance(spec, CapeJobSpec | CapeMeanSpec) else "training"
        Console().print(quote_table(quoted, subject=f"a CAPE {task}"))


def _print_cost(report: CapeReport) -> None:
    """``cost: X credits (quoted at most Y)`` under a CAPE job's output, when it was priced."""
    if report.quoted is None:
        return
    cost = "not settled yet" if report.cost is None else f"{credits_text(report.cost)} credits"
    console.print(
        f"cost: {cost} (quoted at most {credits_text(report.quoted)}); the signed statement: "
        "dpmarket consumer statements",
        highlight=False,
    )


def _delta_text(report: CapeReport) -> str:
    theorem1 = report.delta_theorem1
    return f"{report.delta_exact:.3g} exactly" + (
        f", {theorem1:.3g} by Theorem 1" if theorem1 is not None else ""
    )


#: How a table names each flag of :mod:`dpmarket.common.cape.uncertainty` (short; the reasons
#: follow the table).
_FLAG_NAMES = {
    "sign_not_resolved": "sign?",
    "noise_dominates": "noisy",
    "outside_bounds": "outside",
    "shrunk": "shrunk",
    "undetermined": "undetermined",
    "no_interval": "no interval",
}


def _estimates_table(title: str, header: str, estimates: Sequence[Estimate]) -> RichTable:
    """One row per estimate: label, value, standard error, 95 % interval, flags (short)."""
    table = RichTable(title=title, title_justify="left")
    table.add_column("column", overflow="fold")
    table.add_column(header, justify="right", no_wrap=True)
    table.add_column("std. err.", justify="right", no_wrap=True)
    table.add_column("95 % interval", justify="right", no_wrap=True)
    table.add_column("flags", overflow="fold")
    for e in estimates:
        se = "-" if e.standard_error is None else f"{e.standard_error:.3g}"
        interval = "-" if e.low is None else f"[{e.low:.4g}, {e.high:.4g}]"
        flags = ", ".join(_FLAG_NAMES.get(f.code, f.code) for f in e.flags)
        table.add_row(e.label, f"{e.value:.6g}", se, interval, flags)
    return table


#: What a flag whose reason quotes one value's numbers means, for the legend under a table
#: (the JSON holds every value's own reason).
_FLAG_LEGEND = {
    "sign_not_resolved": "the 95 % interval contains 0: the noise alone could give the sign",
    "noise_dominates": "the standard error exceeds the value's magnitude",
    "outside_bounds": "the raw estimate lay outside the column's bounds, where no mean of "
    "clamped records can be (the noise moved it there); the value and its interval are cut to "
    "the bounds",
    "uninformative": "the interval spans more than half of the column's bounds: the release "
    "barely constrains this value",
}


def _print_flags(estimates: Sequence[Estimate]) -> None:
    """Under a table: what each flag means and the values it marks; then what the intervals
    cover."""
    seen: dict[str, tuple[Flag, list[str]]] = {}
    for e in estimates:
        for f in e.flags:
            seen.setdefault(f.code, (f, []))[1].append(e.label)
    for code, (flag, labels) in seen.items():
        style = "red" if flag.on == "interval" else "yellow"
        where = ", ".join(labels) if len(labels) <= 6 else f"{len(labels)} values"
        console.print(
            f"[{style}]{_FLAG_NAMES.get(code, code)}[/{style}] "
            + escape(f"({where}): {_FLAG_LEGEND.get(code, flag.reason)}"),
            highlight=False,
        )
    if estimates and estimates[0].low is not None:
        console.print(
            f"intervals: {estimates[0].method}; they cover {estimates[0].covers}",
            markup=False,
            highlight=False,
        )


def _fit_command(task: str) -> Callable[..., None]:
    def command(
        curator: str,
        curator_name: str,
        bounds_path: str | None,
        features: tuple[str, ...],
        target: str | None,
        epsilon: float,
        delta: float,
        colluders: int | None,
        calibration: str,
        no_intercept: bool,
        seed: int | None,
        request_id: str | None,
        max_cost: int | None,
        quote_only: bool,
        min_owners: int | None,
        out_path: str,
        as_json: bool,
        **tls: Any,
    ) -> None:
        from dpmarket.common.cape.spec import CapeJobSpec

        schema = read_schema(bounds_path, "--bounds")
        target_bound = _target(target, schema, task)
        if target_bound is None:
            raise click.UsageError(
                "give the features and the target (--bounds with a label, or --feature/--target)"
            )
        feature_bounds = _columns(schema, features, exclude=(target_bound[0],))
        try:
            spec = CapeJobSpec(
                task=task,  # type: ignore[arg-type]
                features=tuple(feature_bounds),
                target=target_bound,
                epsilon=epsilon,
                delta=delta,
                colluders=colluders,
                calibration=calibration,
                fit_intercept=not no_intercept,
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
        options = _job_options(seed, request_id, schema, min_owners, max_cost)
        if quote_only:
            _print_cape_quote(curator, curator_name, tls, spec, options, as_json)
            return
        check_outputs(out_path)
        fit = _ask_curator(curator, curator_name, tls, lambda c: c.fit_cape(spec, **options))
        estimates = fit.estimates
        model = {
            "task": task,
            "target": spec.target[0],
            "weights": dict(zip(spec.columns, fit.weights.tolist(), strict=True)),
            "intercept": fit.intercept,
            "estimates": [e.to_json() for e in estimates],
            "report": fit.report.to_json(estimates=False),
        }
        write_json(model, out_path)
        r = fit.report
        if as_json:
            print_json(model)
        else:
            shown = estimates if spec.fit_intercept else estimates[:-1]
            Console(markup=False).print(
                _estimates_table(
                    f"{task} regression of {spec.target[0]} over {len(r.sites)} owners",
                    "weight" if task == "linear" else "log-odds",
                    shown,
                )
            )
            _print_flags(shown)
        console.print(
            f"{task} regression over {len(r.sites)} owners ({', '.join(r.sites)}); every "
            f"owner ({epsilon}, {_delta_text(r)})-DP against the curator and "
            f"{r.colluders} colluder(s); model -> {out_path}"
        )
        _print_cost(r)

    return command


_FIT_OPTIONS = [
    click.option(
        "--target",
        default=None,
        metavar="COLUMN[=LOW:HIGH]",
        help="The target column and its public bounds (from --schema when left out; default: "
        "the schema's label). Logistic: a column the owners declared binary, no bounds.",
    ),
    _CALIBRATION_OPTION,
    click.option("--no-intercept", is_flag=True, help="Fit without an intercept."),
]
for _task, _name in (("linear", "linreg"), ("logistic", "logreg")):
    _cape_command(
        _name,
        _FIT_OPTIONS,
        f"Fit a {_task} regression across the curator's owners by capeFM (Algorithm 4).",
    )(_fit_command(_task))


@_cape_command(
    "mean",
    [_CALIBRATION_OPTION],
    "The mean of some columns across the curator's owners by CAPE (Algorithm 2).",
)
def cape_mean_command(
    curator: str,
    curator_name: str,
    bounds_path: str | None,
    features: tuple[str, ...],
    epsilon: float,
    delta: float,
    colluders: int | None,
    calibration: str,
    seed: int | None,
    request_id: str | None,
    max_cost: int | None,
    quote_only: bool,
    min_owners: int | None,
    out_path: str,
    as_json: bool,
    **tls: Any,
) -> None:
    from dpmarket.common.cape.spec import CapeMeanSpec

    schema = read_schema(bounds_path, "--bounds")
    columns = _columns(schema, features)
    try:
        spec = CapeMeanSpec(tuple(columns), epsilon, delta, colluders, calibration)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    options = _job_options(seed, request_id, schema, min_owners, max_cost)
    if quote_only:
        _print_cape_quote(curator, curator_name, tls, spec, options, as_json)
        return
    check_outputs(out_path)
    estimate = _ask_curator(
        curator, curator_name, tls, lambda c: c.estimate_cape_mean(spec, **options)
    )
    estimates = estimate.estimates
    document = {
        "task": "mean",
        "mean": estimate.by_column,
        "estimates": [e.to_json() for e in estimates],
        "report": estimate.report.to_json(estimates=False),
    }
    write_json(document, out_path)
    r = estimate.report
    if as_json:
        print_json(document)
    else:
        Console(markup=False).print(
            _estimates_table(f"mean over {len(r.sites)} owners", "mean", estimates)
        )
        _print_flags(estimates)
    console.print(
        f"mean of {len(columns)} column(s) over {len(r.sites)} owners "
        f"({', '.join(r.sites)}), noise std {r.aggregator_noise_std:.3g} per column; "
        f"every owner ({epsilon}, {_delta_text(r)})-DP against the curator and "
        f"{r.colluders} colluder(s); estimate -> {out_path}"
    )
    _print_cost(r)


@_cape_command(
    "train",
    [
        click.option(
            "--target",
            required=True,
            metavar="COLUMN",
            help="The label: a column the owners declared 0/1 (owner serve --binary-column).",
        ),
        click.option("--iterations", default=50, type=click.IntRange(min=1), help="T."),
        click.option("--learning-rate", default=1.0, type=click.FloatRange(min=0, min_open=True)),
        click.option("--hidden-units", default=16, type=click.IntRange(min=1), help="H."),
        click.option(
            "--clip-norm",
            default=1.0,
            type=click.FloatRange(min=0, min_open=True),
            help="C: each example's gradient is clipped to this L2 norm.",
        ),
    ],
    "Train the CAPE paper's 2-layer network across the curator's owners by CAPE gradient "
    "descent (Section 5.1); --epsilon and --delta are each owner's total over all iterations.",
)
def cape_train_command(
    curator: str,
    curator_name: str,
    bounds_path: str | None,
    features: tuple[str, ...],
    epsilon: float,
    delta: float,
    colluders: int | None,
    target: str,
    iterations: int,
    learning_rate: float,
    hidden_units: int,
    clip_norm: float,
    seed: int | None,
    request_id: str | None,
    max_cost: int | None,
    quote_only: bool,
    min_owners: int | None,
    out_path: str,
    as_json: bool,
    **tls: Any,
) -> None:
    from dpmarket.common.cape.spec import CapeTrainingSpec

    schema = read_schema(bounds_path, "--bounds")
    columns = _columns(schema, features, exclude=(target,))
    try:
        spec = CapeTrainingSpec(
            features=tuple(columns),
            target=target,
            epsilon=epsilon,
            delta=delta,
            iterations=iterations,
            learning_rate=learning_rate,
            hidden=hidden_units,
            clip=clip_norm,
            colluders=colluders,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    options = _job_options(seed, request_id, schema, min_owners, max_cost)
    if quote_only:
        _print_cape_quote(curator, curator_name, tls, spec, options, as_json)
        return
    check_outputs(out_path)
    progress, update = _iterations_progress(iterations)
    with progress:
        network = _ask_curator(
            curator, curator_name, tls, lambda c: c.train_cape(spec, on_progress=update, **options)
        )
        update(iterations, iterations)
    document = _network_document(network)
    write_json(document, out_path)
    if as_json:
        print_json(document)
    else:
        _print_flags(network.estimates)
    r = network.report
    console.print(
        f"{iterations} iterations over {len(r.sites)} owners ({', '.join(r.sites)}); "
        f"every owner ({r.epsilon:.6g}, {_delta_text(r)})-DP over the whole training against "
        f"the curator and {r.colluders} colluder(s); network -> {out_path}"
    )


def _iterations_progress(iterations: int) -> tuple[Progress, Callable[[int, int], None]]:
    """A progress bar over a training's ``iterations`` (shown on a terminal only) and the
    callback that advances it: ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress(
        "[bold]train",
        BarColumn(),
        MofNCompleteColumn(),
        "iterations",
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    task = progress.add_task("train", total=iterations)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def _network_document(network: CapeNetwork) -> dict[str, Any]:
    """The trained network as ``cape train`` writes it: its features' bounds, its parameters
    by layer (``W1`` of shape ``(H, D)``, ``b1`` ``(H,)``, ``w2`` ``(H,)``, ``b2``), its
    estimates and its report."""
    spec = network.spec
    hidden, theta = spec.hidden, network.parameters
    return {
        "task": "train",
        "features": [{"column": c, "low": lo, "high": hi} for c, lo, hi in spec.features],
        "target": spec.target,
        "hidden_units": hidden,
        "network": "sigmoid(w2 . relu(W1 x + b1) + b2), x = 2 (raw - low) / (high - low) - 1",
        "parameters": {
            "W1": theta[: hidden * spec.dim].reshape(hidden, spec.dim).tolist(),
            "b1": theta[hidden * spec.dim : -hidden - 1].tolist(),
            "w2": theta[-hidden - 1 : -1].tolist(),
            "b2": float(theta[-1]),
        },
        "estimates": [e.to_json() for e in network.estimates],
        "report": network.report.to_json(estimates=False),
    }


# -------------------------------------------------------------------------- sketches
def _client(curator: str, curator_name: str, tls: dict[str, Any]) -> Any:

    from dpmarket.consumer.client import CuratorClient

    security = security_from_options("consumer", **tls)
    return CuratorClient(curator, security, curator=curator_identity(curator_name))


@click.command("specs")
@curator_options
@json_option
@tls_options
def specs_command(curator: str, curator_name: str, as_json: bool, **tls: Any) -> None:
    """List the catalogue's specs (as a consumer), marking the one the curator's summarization
    allocation reads."""
    try:
        with _client(curator, curator_name, tls) as client:
            specs, allocation = client.sketch_catalogue()
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = [
        {
            "spec": s.name,
            "kind": s.kind,
            "dimension": s.feature_map.dimension,
            "noise": s.noise,
            "epsilon": s.epsilon,
            "epsilon_range": list(s.epsilon_range),
            "delta": s.delta,
            "columns": s.domain.describe(),
            "allocation": s.name == allocation,
        }
        for s in specs
    ]
    if as_json:
        print_json(
            {"curator": f"{curator_name}@{curator}", "allocation_spec": allocation, "specs": rows}
        )
        return
    table = RichTable(
        title=f"sketch specs of {curator_name}",
        title_justify="left",
        caption=None if allocation is None else "*: read by the curator's allocation",
        caption_justify="left",
    )
    table.add_column("spec", no_wrap=True)
    for column in ("m", "noise", "ε (range)", "δ"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("columns", overflow="fold")
    for s, row in zip(specs, rows, strict=True):
        low, high = s.epsilon_range
        table.add_row(
            s.name + (" *" if row["allocation"] else ""),
            str(row["dimension"]),
            s.noise,
            f"{s.epsilon:g} ({low:g}-{high:g})",
            f"{s.delta:g}",
            ", ".join(f"{c['name']} [{c['low']:g}, {c['high']:g}]" for c in row["columns"]),
        )
    Console().print(table)


@click.command("list")
@curator_options
@click.option("--spec", default=None, metavar="NAME", help="One spec (default: every spec).")
@json_option
@tls_options
def list_command(
    curator: str, curator_name: str, spec: str | None, as_json: bool, **tls: Any
) -> None:
    """List the published sketches (as a consumer): owner, epsilon, noisy count."""
    from dpmarket.consumer.catalogue import noisy_count_text

    try:
        with _client(curator, curator_name, tls) as client:
            specs = [client.sketch_spec(spec)] if spec else client.sketch_specs()
            entries = [e for s in specs for e in client.sketches(s)]
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = []
    for e in entries:
        d = e.describe()
        rows.append(
            {
                "spec": e.spec,
                "owner": e.owner,
                "epsilon": d["epsilon"],
                "delta": d["delta"],
                "noisy_count": d["noisy_count"],
                "dimension": d["dimension"],
            }
        )
    if as_json:
        print_json({"curator": f"{curator_name}@{curator}", "sketches": rows})
        return
    table = RichTable(title=f"published sketches at {curator_name}", title_justify="left")
    for column in ("spec", "owner", "epsilon", "delta", "noisy count", "m"):
        table.add_column(
            column,
            justify="left" if column in ("spec", "owner") else "right",
            overflow="fold",
        )
    for r in rows:
        table.add_row(
            r["spec"],
            r["owner"],
            f"{r['epsilon']:g}",
            f"{r['delta']:g}",
            noisy_count_text(r["noisy_count"]),
            str(r["dimension"]),
        )
    Console().print(table)


@click.command("explore")
@curator_options
@click.option(
    "--spec",
    default=None,
    metavar="NAME",
    help="A spec (decl/kind) to answer from, or a declaration whose best sketch per query is "
    "chosen (default: the only declaration besides the curator's allocation spec's).",
)
@click.option("--owner", "owners", multiple=True, help="An owner; repeat for their union.")
@click.option("--all", "all_owners", is_flag=True, help="The union of every owner's sketch.")
@click.option(
    "--query",
    required=True,
    type=click.Choice(
        ["mean", "moment2", "cdf", "covariance", "count", "logreg", "marginal", "synthetic"]
    ),
)
@click.option(
    "--column",
    "columns",
    multiple=True,
    help="mean, moment2, cdf, covariance, marginal: a column; logreg: a feature (repeat; default "
    "every column, but the target for logreg).",
)
@click.option("--point", "points", multiple=True, type=float, help="cdf: a threshold (repeat).")
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="COLUMN<=V|COLUMN>=V|COLUMN=V",
    help="count: a range predicate; repeat for their conjunction.",
)
@click.option("--target", default="", help="logreg: the 0/1 label column.")
@click.option("--rows", default=0, type=click.IntRange(min=0), help="synthetic: records to draw.")
@click.option(
    "--synthetic",
    default=None,
    type=click.IntRange(min=100),
    help="M2M's synthetic points n_s (default 20000).",
)
@click.option(
    "--seed",
    default=0,
    type=click.IntRange(min=0),
    help="Seed of the consumer's own randomness (synthetic points, bootstrap, records).",
)
@click.option(
    "--lambda-rule",
    default="theorem",
    type=click.Choice(["theorem", "paper"]),
    help="M2M's ridge parameter: sigma^2/n^2 (theorem) or sigma^2/n (the paper's experiments).",
)
@click.option("--intercept", is_flag=True, help="Fit an unpenalized constant in M2M.")
@click.option(
    "--bootstrap",
    default=32,
    type=click.IntRange(min=0),
    help="Bootstrap models per marginals sketch behind its standard errors (0: none).",
)
@click.option(
    "--blas-threads",
    default=1,
    type=click.IntRange(min=1),
    help="BLAS threads for the answer. One (the default, as owner serve's) avoids threads "
    "spinning on a shared machine; raise it for large sketches alone on many cores.",
)
@click.option(
    "--refit",
    is_flag=True,
    help="Fit each marginals sketch's graphical model and bootstrap here, even where its owner "
    "published them with the sketch (default: use those, checked, when they match --bootstrap "
    "and --seed).",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The consumer's data directory: marginals models fitted here are kept in its "
    "explore-models/ and reused by the next answer on the same sketches.",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@json_option
@tls_options
def explore_command(
    curator: str,
    curator_name: str,
    spec: str | None,
    owners: tuple[str, ...],
    all_owners: bool,
    query: str,
    columns: tuple[str, ...],
    points: tuple[float, ...],
    where: tuple[str, ...],
    target: str,
    rows: int,
    synthetic: int | None,
    seed: int,
    lambda_rule: str,
    intercept: bool,
    bootstrap: int,
    blas_threads: int,
    refit: bool,
    data_dir: str | None,
    out_path: str | None,
    as_json: bool,
    **tls: Any,
) -> None:
    """Answer a question about one owner's data, or several owners' union, from their
    published sketches, with its standard error (computed here: no owner is asked anything).

    Each query is answered from the best sketch available (dpmarket.consumer.explore.choose_source):
    among the sketches that express it (a marginals sketch: counts, CDFs, marginals, synthetic
    records, moments of discrete columns; HIST, RFF, RACE: all but marginals and records), the
    one whose honest 95 % interval is narrowest; for a logistic regression, where no sketch's
    interval is trusted, a sketch whose fit identifies the model (RFF, RACE) with the least
    noise, and the reason says no candidate has a trusted interval."""
    from threadpoolctl import threadpool_limits

    from dpmarket.consumer import model_store
    from dpmarket.consumer.catalogue import ExploreOptions, SpecChoiceError, explore

    if bool(owners) == all_owners:
        raise click.UsageError("give --owner NAME (repeat for a union) or --all")
    q = _explore_query(query, columns, points, where, target, rows)
    if out_path is not None:
        check_outputs(out_path)
    options = ExploreOptions(
        synthetic=synthetic,
        seed=seed,
        lambda_rule=lambda_rule,  # type: ignore[arg-type]
        intercept=intercept,
        bootstrap=bootstrap,
        refit=refit,
    )
    try:
        with (
            _client(curator, curator_name, tls) as client,
            threadpool_limits(limits=blas_threads, user_api="blas"),
        ):
            found = explore(
                client,
                q,
                spec=spec,
                owners=owners,
                options=options,
                model_dir=None if data_dir is None else Path(data_dir) / model_store.FOLDER,
            )
    except SpecChoiceError as exc:
        raise click.UsageError(str(exc)) from exc
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    report = found.to_json(f"{curator_name}@{curator}")
    write_output(report, out_path)
    if as_json:
        print_json(report)
        return
    _print_explored(found, query, q.kind)


def _explore_query(
    query: str,
    columns: tuple[str, ...],
    points: tuple[float, ...],
    where: tuple[str, ...],
    target: str,
    rows: int,
) -> Query:
    """``explore``'s question from its options (:class:`click.UsageError` when malformed)."""
    from dpmarket.consumer.explore import Query, parse_where

    try:
        return Query(
            query,
            columns=columns,
            points=points,
            where=tuple(parse_where(w) for w in where),
            target=target,
            rows=rows,
        )
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc


def _print_explored(found: Exploration, query: str, kind: str) -> None:
    """An explored answer as text: its table (whose owners, which sketch), where it was
    answered from, the count behind it and, for synthetic records, how many."""
    entries, answer = found.entries, found.answer
    who = (
        entries[0].owner if len(entries) == 1 else f"union of {', '.join(e.owner for e in entries)}"
    )
    n_text = f"n ≈ {found.n_hat:.0f}"
    if found.n_interval is not None:
        n_text += f", 95 % {interval_text(*found.n_interval)}"
    _print_answer(answer, f"{query} of {who} ({answer.source}, {n_text})")
    console.print(f"answered from {found.reason}")
    if "count" in answer.extra:
        interval = answer.extra.get("count_interval")
        n_interval = answer.extra.get("n_interval")
        # The independence guess has no standard error (the table says "— (guess)").
        guess = any(f["code"] == "model-guess" for f in answer.rows()[0]["flags"])
        count_se = answer.extra["count_standard_error"]
        spread = (
            " (model-guess: no standard error; the interval is what holds)"
            if guess
            else ""
            if count_se is None
            else f" ± {count_se:.1f}"
        )
        console.print(
            f"count ≈ {answer.extra['count']:.1f}{spread}"
            + (f", 95 % interval {interval_text(interval[0], interval[1], 1)}" if interval else "")
            + f" of n ≈ {answer.extra['n']:.0f}"
            + (f" (95 % {interval_text(*n_interval)})" if n_interval else "")
        )
    if kind == "synthetic":
        console.print(f"{len(answer.extra['records'])} synthetic records (--out writes them)")


def _print_answer(answer: Any, title: str) -> None:
    """The answer as a table: every value with its columns, standard error, 95 % interval and
    flags (their codes; a code on the interval is upper case); then what each interval covers
    and why values are flagged."""
    table = RichTable(title=title, title_justify="left")
    for column in ("", "columns", "estimate", "± s.e.", "95 % interval", "flags"):
        left = column in ("", "columns", "flags")
        table.add_column(
            column,
            justify="left" if left else "right",
            overflow="fold" if left else "ellipsis",
            no_wrap=not left,
        )
    rows = answer.rows()
    for row in rows:
        se = row["standard_error"]
        ci = row["interval"]
        # An independence guess has no standard error (its 0 is none): its bounds hold.
        guess = any(f["code"] == "model-guess" for f in row["flags"])
        table.add_row(
            row["label"],
            ", ".join(row["columns"]),
            f"{row['value']:.6g}",
            "— (guess)" if guess else "—" if se is None else f"{se:.3g}",
            "—" if ci is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]",
            ", ".join(
                f["code"].upper() if f["on"] == "interval" else f["code"] for f in row["flags"]
            ),
        )
    # No console markup: a label such as "P[price <= 0]" is data, and rich would read its
    # "[price <= 0]" as a style tag and print "P".
    out = Console(markup=False)
    out.print(table)
    for basis, covers in dict.fromkeys((row["basis"], row["covers"]) for row in rows):
        out.print(f"interval ({basis}): {covers}", highlight=False)
    reasons = dict.fromkeys((f["code"], f["on"], f["reason"]) for row in rows for f in row["flags"])
    for code, on, reason in reasons:
        out.print(f"{code} (on the {on}): {reason}", highlight=False)


def _validation(path: str, spec: SketchSpec, label: str | None = None) -> NDArray[np.float64]:
    """The validation set in the spec's column order: a table's named columns, or an array file
    whose columns are the spec's, in order; with ``label`` (the schema's label column), a set
    may lack that column (the ranking then completes it over its values:
    :func:`~dpmarket.consumer.catalogue.label_completed`)."""
    from dpmarket.runtime.tables import load_point_set, load_table

    names = list(spec.domain.names)
    try:
        if Path(path).suffix.lower() in (".csv", ".parquet"):
            table = load_table(path)
            if label in names and label not in table.columns:
                names.remove(label)
            return table.select(names)
        points = load_point_set(path, label_column=None).features
        if label in names and points.shape[1] == len(names) - 1:
            return points
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if points.shape[1] != spec.domain.n_attributes:
        raise click.BadParameter(
            f"{path} has {points.shape[1]} columns, the spec {spec.domain.n_attributes} "
            f"({', '.join(spec.domain.names)})",
            param_hint="--validation",
        )
    return points


def rank_sketches(
    client: Any,
    validation_path: str,
    spec: str | None,
    owners: tuple[str, ...] = (),
    label: str | None = None,
) -> Ranking:
    """Rank owners as ``dpmarket consumer rank-owners`` does
    (:func:`dpmarket.consumer.catalogue.rank`): the RFF spec ``spec`` (or the only one), the
    validation file read in its column order (:meth:`~dpmarket.consumer.catalogue.Ranking.rows`
    lists the owners, best first). Computed here: the validation set never leaves this process.
    (``rank-owners`` and the consumer's console, :mod:`dpmarket.console`, both call this.)
    ``label``, the schema's label column: a validation file without it is completed over its
    values when the spec's columns include it.

    Raises
    ------
    click.BadParameter
        The file does not match the spec.
    dpmarket.consumer.catalogue.SpecChoiceError
        No RFF spec is named and the catalogue has not exactly one.
    dpmarket.common.errors.DPMarketError, ValueError
        From the curator or the computation (no sketch of an owner asked about, ...).
    """
    from dpmarket.consumer.catalogue import rank

    return rank(
        client,
        lambda chosen: _validation(validation_path, chosen, label),
        spec=spec,
        owners=owners,
        label=label,
    )


@click.command("rank-owners")
@curator_options
@click.option(
    "--validation",
    "validation_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The consumer's validation set: .csv/.parquet with the spec's columns by name, or "
    ".npy/.npz with them in order. It never leaves this process.",
)
@click.option(
    "--spec",
    default=None,
    metavar="NAME",
    help="An RFF spec (default: the only one besides the curator's allocation spec's).",
)
@click.option("--owner", "owners", multiple=True, help="Rank only these owners (repeat).")
@click.option(
    "--schema",
    "schema_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The data's public schema (TOML): when the spec's columns include its label and the "
    "validation set has no label column, every label value is weighted equally.",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@json_option
@tls_options
def rank_owners_command(
    curator: str,
    curator_name: str,
    validation_path: str,
    spec: str | None,
    owners: tuple[str, ...],
    schema_path: str | None,
    out_path: str | None,
    as_json: bool,
    **tls: Any,
) -> None:
    """Rank owners by the MMD between a validation set and their RFF sketches, computed here."""
    from dpmarket.consumer.catalogue import SpecChoiceError

    if out_path is not None:
        check_outputs(out_path)
    schema = read_schema(schema_path)
    try:
        with _client(curator, curator_name, tls) as client:
            ranking = rank_sketches(
                client, validation_path, spec, owners, None if schema is None else schema.label
            )
    except SpecChoiceError as exc:
        raise click.UsageError(str(exc)) from exc
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    chosen = ranking.spec
    document = ranking.to_json(f"{curator_name}@{curator}")
    write_output(document, out_path)
    if as_json:
        print_json(document)
        return
    _print_ranking(
        document,
        f"owners by MMD² to {Path(validation_path).name} ({chosen.name})",
        ranking.resolution_text(),
    )


def _rank_text(row: dict[str, Any]) -> str:
    """A ranking row's rank as the table shows it: ``2``, or ``1–3`` when the pairs the
    sketches resolve leave it several ranks (the point estimates' order is not its rank)."""
    best, worst = row["rank_interval"]
    return f"{best}" if best == worst else f"{best}–{worst}"


def _print_ranking(document: dict[str, Any], title: str, resolution: str) -> None:
    """``rank-owners``' table, its flags' reasons, which pairs it resolves (``resolution``,
    :meth:`~dpmarket.consumer.catalogue.Ranking.resolution_text`) and what its intervals
    cover."""
    from dpmarket.consumer.catalogue import RANK_COVERS, RANK_FLAG_NAMES

    rows = document["ranking"]
    table = RichTable(title=title, title_justify="left")
    for column in ("rank", "owner", "MMD²", "95 % interval", "ε", "n ≈ [95 %]", "flags"):
        left = column in ("owner", "flags")
        table.add_column(
            column,
            justify="left" if left else "right",
            overflow="fold" if left else "ellipsis",
            no_wrap=not left,
        )
    for r in rows:
        low, high = r["interval"]
        table.add_row(
            _rank_text(r),
            r["owner"],
            f"{r['value']:.3g}",
            f"[{low:.3g}, {high:.3g}]",
            f"{r['epsilon']:g}",
            f"{r['n']:.0f} {interval_text(*r['n_interval'])}",
            ", ".join(RANK_FLAG_NAMES[f["code"]] for f in r["flags"]),
        )
    Console(markup=False).print(table)  # owners' names are data, never style tags
    for code, name in RANK_FLAG_NAMES.items():
        reasons = [
            f"{r['owner']}: {f['reason']}" for r in rows for f in r["flags"] if f["code"] == code
        ]
        if reasons:
            console.print(f"[yellow]{name}[/yellow] " + escape("; ".join(reasons)), highlight=False)
    if rows:
        console.print(resolution, markup=False, highlight=False)
        console.print(f"intervals: {RANK_COVERS}", highlight=False)


@click.group("cape", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def cape_group() -> None:
    """Joint estimates and models across owners by CAPE (zero-sum noise through secure
    aggregation): means, linear and logistic regressions, a network by gradient descent.

    At the same (epsilon, delta) per owner the answer's noise variance is F = S (S + S_H) /
    (S_H (S + 1)) times the pooled-data mechanism's (S owners, S_H = S - S_C of them honest;
    F = 1.875 at S = 5, S_C = 1), against S times for independent noise per owner. Values
    outside the public bounds are clamped to them by every owner; a logistic or training target
    must be a column the owners declared 0/1 (owner serve --binary-column)."""


for _command in CAPE_COMMANDS:
    cape_group.add_command(_command)


# ----------------------------------------------------------------------------- the market
@click.command("statements")
@curator_options
@click.option("--session", "session_id", default=None, help="Only this session's statement.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="The last N only.")
@click.option(
    "--csv",
    "csv_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write one row per (session, owner) to this CSV file (amounts in micro-credits).",
)
@click.option("--wide", is_flag=True, help="Every column and whole ids (default: 80 columns).")
@json_option
@tls_options
def statements_command(
    curator: str,
    curator_name: str,
    session_id: str | None,
    limit: int | None,
    csv_path: str | None,
    wide: bool,
    as_json: bool,
    **tls: Any,
) -> None:
    """The consumer's settlement statements: what each session cost, owner by owner.

    Each statement is signed by the curator and settled from the owners' own ledgers (points
    read, epsilon charged) at the prices quoted when the session opened; each owner checks its
    own line before recording it."""
    from dpmarket.consumer.market import statement_json, statements_table

    if csv_path is not None:
        check_outputs(csv_path)
    try:
        with _client(curator, curator_name, tls) as client:
            settled = client.statements(session_id, limit)
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    if csv_path is not None:
        _write_statements_csv(settled, csv_path)
    if as_json:
        print_json({"statements": [statement_json(s) for s in settled]})
        return
    if not settled:
        console.print("no settled statements")
        return
    print_table(statements_table(settled, wide=wide), wide=wide)


def _write_statements_csv(settled: Sequence[Any], path: str) -> None:
    """One row per (session, owner), amounts in micro-credits, epsilon in micro-epsilon."""
    import csv
    import dataclasses
    import io

    out = io.StringIO()
    writer = None
    for item in settled:
        for line in item.statement.lines:
            row = {
                "session_id": item.session_id,
                "owner_session_id": item.statement.header.session_id,
                **dataclasses.asdict(line),
                "total": line.total,
            }
            if writer is None:
                writer = csv.DictWriter(out, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
    try:
        Path(path).write_text(out.getvalue(), encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc}") from exc
    console.print(f"-> {path}")
