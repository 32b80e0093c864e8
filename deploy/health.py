"""``dpmarket health``: probe a service's grpc.health.v1 status over mTLS.

Every container of deploy/docker-compose.yml runs this as its health check every few seconds, so it
is a module of its own that imports only click, grpc and the runtime (:mod:`dpmarket.runtime.cli`):
the command tree (:mod:`dpmarket.deploy.cli`) loads it alone, about a fifth of the CPU time of
loading every command.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from dpmarket.runtime.cli import security_from_options, tls_options
from dpmarket.runtime.identity import Identity

__all__ = ["health_command"]

console = Console(stderr=True)


@click.command(
    "health", context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.option("--target", required=True, metavar="HOST:PORT", help="The service to probe.")
@click.option(
    "--expect",
    default=None,
    metavar="ROLE:NAME",
    help="The identity the service's certificate must carry (required with mTLS).",
)
@click.option(
    "--service",
    default="",
    metavar="NAME",
    help="The service whose status to ask: empty for the whole server; at a curator, "
    "owner:NAME is SERVING while it is connected to that owner.",
)
@click.option("--timeout", default=3.0, type=click.FloatRange(min=0.1), help="Seconds.")
@tls_options
def health_command(
    target: str, expect: str | None, service: str, timeout: float, **tls: Any
) -> None:
    """Probe a service's grpc.health.v1 status over mTLS; exit 0 when it is SERVING.

    Any party's certificate will do (with --pki-dir, the one named --name there, whatever its
    role). A service that cannot be reached is named with the reason in one line."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dpmarket.common.errors import DPMarketError
    from dpmarket.runtime.transport import connected_channel

    security = security_from_options(None, **tls)
    expected = None
    if not security.insecure:
        if not expect:
            raise click.UsageError("--expect ROLE:NAME is required with mTLS")
        try:
            expected = Identity.parse(expect)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--expect") from exc
    try:
        channel = connected_channel(target, security, expected, connect_timeout=timeout)
    except DPMarketError as exc:
        raise click.ClickException(str(exc)) from exc
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            raise click.ClickException(f"{target}: {exc.code().name}: {exc.details()}") from exc
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    console.print(f"{target}{f' {service}' if service else ''}: {status}")
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise SystemExit(1)
