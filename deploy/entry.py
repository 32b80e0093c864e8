"""The ``dpmarket`` console script.

``dpmarket health`` runs in every container's health check every few seconds (deploy/Dockerfile,
deploy/docker-compose.yml); ``dpmarket owner ledger`` is what an owner's operator (and the compose
test) runs to read a ledger, and ``dpmarket pki`` what the compose stack's pki job runs once per
identity. Starting the whole CLI, :mod:`dpmarket.deploy.cli`, imports numpy, pandas, scipy and every
protocol: 1.4 to 1.9 s of CPU on this project's 2-core reference machine, so six services probed
every 5 s kept 1.7 cores busy at rest. Those commands need much less (0.1 to 0.7 s), so this entry
point runs them from their own modules (:data:`LIGHT_COMMANDS`) and every other command line through
:func:`dpmarket.deploy.cli.main`, which lists them too (``dpmarket -v health ...`` takes that slower
path).

``dpmarket owner`` runs under a root of the owner's own commands (``serve-owner``, ``owner``,
``sketch publish`` / ``published``, all from :mod:`dpmarket.owner.cli`), so that one ``--config``
file written for the owner's commands reads the same on this path as through the whole CLI.
"""

from __future__ import annotations

import importlib
import sys

import click

__all__ = ["LIGHT_COMMANDS", "main"]

#: Subcommands run without loading :mod:`dpmarket.deploy.cli`: name -> (module, click command).
LIGHT_COMMANDS = {
    "health": ("dpmarket.deploy.health", "health_command"),
    "owner": ("dpmarket.owner.cli", "owner"),
    "pki": ("dpmarket.deploy.pki", "pki"),
}


def _owner_root() -> click.Group:
    """The owner's commands under a ``dpmarket`` root (the module docstring)."""
    from dpmarket.owner import cli

    sketch = click.Group("sketch", commands=[cli.publish_command, cli.published_command])
    return click.Group("dpmarket", commands=[cli.serve_owner, cli.owner, sketch])


def main() -> None:
    """Run ``dpmarket`` with ``sys.argv``: a light command alone, or the whole CLI."""
    light = LIGHT_COMMANDS.get(sys.argv[1]) if len(sys.argv) > 1 else None
    if light is not None and sys.argv[1] == "owner":
        _owner_root().main(sys.argv[1:], prog_name="dpmarket")
    elif light is not None:
        module, name = light
        command = getattr(importlib.import_module(module), name)
        command.main(sys.argv[2:], prog_name=f"dpmarket {sys.argv[1]}")
    else:
        from dpmarket.deploy.cli import main as cli

        cli()
