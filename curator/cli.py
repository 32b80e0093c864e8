"""The curator's command: ``serve-curator``, the parsimonious curator for a fixed set of owners
with its catalogue of the owners' private sketches, over mTLS."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import click

from common.errors import DPMarketError
from runtime.cli import ensure_info_logging, security_from_options, tls_options
from runtime.identity import Identity
from runtime.transport import BindError

__all__ = ["serve_curator"]

logger = logging.getLogger("dpmarket")


def _owner_target(text: str, insecure: bool) -> tuple[Identity | None, str]:
    """``NAME@HOST:PORT`` -> (owner identity, address); plain ``HOST:PORT`` only if insecure."""
    name, at, target = text.rpartition("@")
    if not at:
        if insecure:
            return None, text
        raise click.BadParameter(
            f"{text!r}: give NAME@HOST:PORT, NAME being the owner's certificate name",
            param_hint="--owner",
        )
    try:
        return Identity("owner", name), target
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--owner") from exc


@click.command("serve-curator")
@click.option(
    "--owner",
    "owners",
    multiple=True,
    required=True,
    metavar="NAME@HOST:PORT",
    help="An owner service and the name its certificate must carry; repeat for every owner.",
)
@click.option("--host", default="127.0.0.1", help="Address to bind.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--port-file", default=None, help="Write the bound port to this file.")
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The curator's policy file (TOML: parameter ranges, sessions, retention; see "
    "deploy/policies/curator.toml). Default: the built-in defaults.",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the curator keeps sessions and charges (SQLite). Default: "
    "dpmarket-state/curator-<name>.",
)
@click.option(
    "--allow-seeded-sessions",
    is_flag=True,
    help="Accept requests that fix the session seed (reproducible runs; never in "
    "production: whoever knows the seed knows the noise). Overrides the policy.",
)
@click.option(
    "--owner-timeout",
    default=30.0,
    type=click.FloatRange(min=0.1),
    help="Seconds after which an owner that has not answered a call is dropped.",
)
@click.option(
    "--sketch-spec",
    "sketch_specs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A sketch declaration (TOML, e.g. deploy/sketches/flights.toml) for the catalogue; "
    "repeat. Its parameters are drawn and stored the first time, checked against the stored "
    "ones afterwards. Specs stored before are served whether given again or not.",
)
@click.option(
    "--sketch-seed",
    default=None,
    type=click.IntRange(min=0),
    help="Draw new sketch specs' parameters from this seed (reproducible runs; the parameters "
    "are public either way). Default: a CSPRNG.",
)
@click.option(
    "--allocation-sketch-spec",
    default=None,
    metavar="NAME",
    help="The catalogue's RFF spec (e.g. digits/rff) whose published sketches the candidates "
    "method reads to split its candidate budget; its columns must be the owners' summarization "
    "features, in order. Without it, or for owners that published no sketch under it, sessions "
    "split the budget by the owners' noisy relevance counts.",
)
@tls_options
def serve_curator(
    owners: tuple[str, ...],
    host: str,
    port: int,
    port_file: str | None,
    policy_path: str | None,
    data_dir: str | None,
    allow_seeded_sessions: bool,
    owner_timeout: float,
    sketch_specs: tuple[str, ...],
    sketch_seed: int | None,
    allocation_sketch_spec: str | None,
    **tls: Any,
) -> None:
    """Serve the parsimonious curator for a fixed set of owners (mTLS), with its catalogue of
    the owners' private sketches."""
    from curator.owners import GrpcOwnerEndpoint
    from curator.policy import CuratorPolicy, load_curator_policy
    from curator.service import serve_curator as serve
    from curator.sketches import SketchCatalog
    from curator.store import CuratorStore

    ensure_info_logging()
    security = security_from_options("curator", **tls)
    targets = [_owner_target(text, security.insecure) for text in owners]
    try:
        policy = load_curator_policy(policy_path) if policy_path else CuratorPolicy()
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if allow_seeded_sessions:
        policy = policy.with_overrides(allow_seeded_sessions=True)
    name = security.identity.name if security.identity is not None else "insecure"
    state = Path(data_dir) if data_dir else Path("dpmarket-state") / f"curator-{name}"
    try:
        store = CuratorStore(state)
    except (OSError, ValueError, RuntimeError) as exc:
        raise click.ClickException(f"{state}: {exc}") from exc
    owner_names = [identity.name for identity, _ in targets if identity is not None]
    try:
        catalog = SketchCatalog.from_files(
            state, sketch_specs, policy=policy, owners=owner_names, seed=sketch_seed
        )
    except (OSError, ValueError, RuntimeError) as exc:
        store.close()
        raise click.ClickException(str(exc)) from exc
    logger.info(
        "sketch catalogue: %s",
        ", ".join(s.name for s in catalog.specs()) or "no spec",
    )
    if allocation_sketch_spec is not None:
        try:
            kind = catalog.spec(allocation_sketch_spec).kind
        except DPMarketError as exc:
            catalog.close()
            store.close()
            raise click.ClickException(f"--allocation-sketch-spec: {exc}") from exc
        if kind != "rff":
            catalog.close()
            store.close()
            raise click.ClickException(
                f"--allocation-sketch-spec: {allocation_sketch_spec!r} is a {kind} spec; the "
                "allocation reads RFF sketches"
            )

    async def run() -> None:
        endpoints = [
            GrpcOwnerEndpoint(target, security, expected, deadline=owner_timeout)
            for expected, target in targets
        ]
        await serve(
            endpoints,
            f"{host}:{port}",
            security,
            policy=policy,
            store=store,
            sketches=catalog,
            allocation_spec=allocation_sketch_spec,
            call_timeout=owner_timeout,
            port_file=port_file,
        )

    try:
        asyncio.run(run())
    except BindError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        catalog.close()
        store.close()
