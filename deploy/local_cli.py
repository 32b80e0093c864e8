"""A local deployment of one's own tables: ``dpmarket init`` writes it (PKI, draft schema,
configurations, policies), ``dpmarket up`` starts its services in the background and ``dpmarket
down`` stops them (:mod:`dpmarket.deploy.local`)."""

from __future__ import annotations

from pathlib import Path

import click

from dpmarket.common.errors import DPMarketError

__all__ = ["down_command", "init_command", "up_command"]


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
    """Start the curator and every owner of a deployment (dpmarket init) in the background;
    then every owner publishes, once, the sketch the curator's allocation reads (charged to its
    own ledger: epsilon 1 as init declares it; a repeated up charges nothing)."""
    from dpmarket.deploy.local import up

    try:
        started = up(directory)
    except (OSError, ValueError, DPMarketError) as exc:
        raise click.ClickException(str(exc)) from exc
    for name, port in started.ports.items():
        click.echo(f"{name}: serving on port {port}")
    for sketch in started.allocation:
        if sketch.error:
            click.secho(
                f"{sketch.owner}: did not publish the allocation's sketch {sketch.spec}: "
                f"{sketch.error}; summaries split their budget by noisy counts, charging every "
                "owner epsilon 1 each",
                fg="yellow",
            )
        elif sketch.held:
            click.echo(f"{sketch.owner}: allocation sketch {sketch.spec} in the catalogue "
                       "already: charged nothing")  # fmt: skip
        else:
            click.echo(
                f"{sketch.owner}: published the allocation sketch {sketch.spec}, charged "
                f"epsilon {sketch.epsilon:g} to its ledger (once: summaries then charge it "
                "nothing to split their budget)"
            )
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
