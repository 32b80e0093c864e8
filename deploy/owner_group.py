"""Several data owners served from one OS process: ``python -m dpmarket.deploy.owner_group
SPEC.json``.

For running many owners on one machine (the 100-owner integration test and benchmarks): an owner
process costs about 240 MB of resident memory whatever its data (the interpreter, numpy, pandas,
pyarrow, grpc, cryptography), so 100 owner processes would need some 24 GB. Here each owner keeps
everything that makes it an owner: its own gRPC server on its own port, its own certificate (its
identity in mTLS and in secure aggregation), its own policy and its own durable ledger; only the
interpreter and the event loop are shared. ``SPEC.json`` is a JSON list with one ``owner serve``
argument list per owner (the same options, parsed by the same command, including
``--port-file``). SIGTERM or SIGINT stops every server gracefully.

A deployment runs one ``dpmarket owner serve`` per owner, each on its own machine; this module is
a launcher's (:class:`dpmarket.deploy.launcher.LocalCluster` with ``owners_per_process``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from dpmarket.owner.cli import OpenedOwner, open_owner, serve_owner
from dpmarket.runtime.cli import ensure_info_logging

logger = logging.getLogger(__name__)

#: ``owner serve`` options that :func:`dpmarket.owner.cli.open_owner` does not take.
_SERVING_OPTIONS = ("host", "port", "port_file", "blas_threads", "metrics_port", "metrics_host")
_OWNER_OPTIONS = (
    "data_path",
    "schema_path",
    "table_path",
    "binary_columns",
    "label_column",
    "owner_id",
    "policy_path",
    "data_dir",
    "allow_seeded_sessions",
)


def parse_owner(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One owner's ``owner serve`` arguments -> (its :func:`~dpmarket.owner.cli.open_owner` keyword
    arguments, its serving options ``host``, ``port``, ``port_file``).

    Raises
    ------
    click.UsageError
        If the arguments are not valid ``owner serve`` arguments.
    """
    context = serve_owner.make_context("owner serve", list(argv))
    params = dict(context.params)
    serving = {k: params.pop(k) for k in _SERVING_OPTIONS}
    if serving["metrics_port"] is not None:
        raise click.UsageError(
            "--metrics-port: owners served as a group share one process and serve no metrics; "
            "serve the owner on its own (dpmarket owner serve) to scrape it"
        )
    return params, serving


async def serve_group(specs: Sequence[Sequence[str]]) -> None:
    """Open every owner of ``specs`` and serve each on its own port until a signal."""
    from dpmarket.owner.service import start_owner
    from dpmarket.runtime.serving import serve_all_until_signalled

    opened: list[OpenedOwner] = []
    running = []
    try:
        for argv in specs:
            params, serving = parse_owner(argv)
            owner_args = [params.pop(k) for k in _OWNER_OPTIONS]
            item = open_owner(*owner_args, **params)
            opened.append(item)
            running.append(
                await start_owner(
                    item.owner,
                    f"{serving['host']}:{serving['port']}",
                    item.security,
                    curators=item.policy.curators,
                    cape=item.cape,
                    port_file=serving["port_file"],
                )
            )
        logger.info("serving %d owners in this process", len(running))
        await serve_all_until_signalled([r.server for r in running])
    finally:
        for r in running:
            await r.close()
        for item in opened:
            item.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the owners of a spec file (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m dpmarket.deploy.owner_group", description=__doc__
    )
    parser.add_argument("spec", type=Path, help="JSON list of owner serve argument lists")
    args = parser.parse_args(argv)
    specs = json.loads(args.spec.read_text(encoding="utf-8"))
    if not isinstance(specs, list) or not all(isinstance(s, list) for s in specs):
        raise SystemExit(f"{args.spec} must hold a JSON list of argument lists")
    ensure_info_logging()
    from threadpoolctl import threadpool_limits

    try:
        with threadpool_limits(limits=1, user_api="blas"):
            asyncio.run(serve_group(specs))
    except click.ClickException as exc:
        raise SystemExit(f"owner group: {exc.format_message()}") from exc


if __name__ == "__main__":
    main()
