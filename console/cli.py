"""``dpmarket console``: serve one party's console on its own credentials.

The role is the certificate's (``--pki-dir`` and ``--name``, or ``--ca``/``--cert``/``--key``): a
consumer's certificate gives the consumer's pages, an owner's the owner's, the curator's the
curator's. ``--config`` takes the party's own configuration file as ``dpmarket init`` writes it:
its ``data-dir`` (where the console keeps its token), ``host`` and ``port`` (the party's own
service, whose health the owner's page checks), ``curator`` (the consumer's curator), ``owner``
(the curator's owners) and ``schema`` (the consumer's) are read from it; ``listen`` (or a
``[console]`` table in the file) is where the console itself serves.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

import click

from dpmarket.runtime.cli import security_from_options, tls_options
from dpmarket.runtime.identity import Identity

__all__ = ["WILDCARDS", "console_command", "shown_host"]

logger = logging.getLogger("dpmarket")


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{text!r}: give HOST:PORT (port 0: any free port)")
    return host.strip("[]"), int(port)


#: Hosts that bind every interface: no address another machine could use.
WILDCARDS = ("0.0.0.0", "::", "")


def _route_address(family: socket.AddressFamily) -> str | None:
    """The address this machine sends from on its default route (a UDP socket connected to a
    documentation address: no packet is sent), or None when there is no route."""
    target = ("2001:db8::1", 9) if family == socket.AF_INET6 else ("198.51.100.1", 9)
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(target)
        except OSError:
            return None
        return str(probe.getsockname()[0])


def shown_host(bind_host: str) -> str:
    """The host to print in the console's address for ``bind_host``: itself, except for a
    wildcard (``0.0.0.0``, ``::``, which no other machine can connect to), then this machine's
    name where it resolves to an address other than the loopback, else the address of its
    default route.

    Raises
    ------
    click.UsageError
        For a wildcard on a machine with neither (say what to pass instead).
    """
    if bind_host not in WILDCARDS:
        return bind_host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    name = socket.gethostname()
    try:
        found = {a[4][0] for a in socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)}
    except OSError:
        found = set()
    if found and not any(ipaddress.ip_address(a).is_loopback for a in found):
        return name
    routed = _route_address(family)
    if routed is not None and not ipaddress.ip_address(routed).is_loopback:
        return routed
    raise click.UsageError(
        f"--listen {bind_host or '[::]'}: this machine has no name or address another machine "
        "could reach it by; give --listen with the address it is reached at (HOST:PORT), or "
        "keep 127.0.0.1:0 and reach it through an SSH tunnel"
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot serve the console on {host}:{port}: {exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@click.command(
    "console", context_settings={"help_option_names": ["-h", "--help"], "show_default": True}
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    metavar="HOST:PORT",
    help="Where the console serves (port 0: any free port, printed). Another address than "
    "127.0.0.1 lets other machines in: they need the token, and HTTPS (--https-cert) keeps it "
    "from the network. On 0.0.0.0 (every interface) the address printed names this machine "
    "(its name, else its routed address; refused when it has neither).",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The party's data directory (its config's data-dir): the owner's ledger, the "
    "curator's store, the consumer's session records; the console's token is kept there "
    "(console-token, mode 0600).",
)
@click.option(
    "--host", default=None, help="This party's own service: its address (the config's host)."
)
@click.option(
    "--port",
    default=None,
    type=click.IntRange(0, 65535),
    help="This party's own service: its port (the config's port), for its health check (an "
    "owner's) or its channels to the owners (the curator's).",
)
@click.option("--curator", default=None, metavar="HOST:PORT", help="A consumer's curator.")
@click.option(
    "--curator-name", default="curator", help="The name the curator's certificate must carry."
)
@click.option(
    "--owner",
    "owners",
    multiple=True,
    metavar="NAME@HOST:PORT",
    help="A curator's owner (the config's owner list), for its health check; repeat.",
)
@click.option(
    "--schema",
    "schema_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A consumer's public schema: validation files are read through it.",
)
@click.option(
    "--https-cert",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Serve HTTPS with this certificate (PEM), e.g. for remote use.",
)
@click.option(
    "--https-key",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The private key of --https-cert.",
)
@click.option(
    "--blas-threads",
    default=1,
    type=click.IntRange(min=1),
    help="BLAS threads for the consumer's answers. One (the default, as owner serve's) avoids "
    "threads spinning on a shared machine, where they cost a first answer more CPU than they "
    "save; raise it for large sketches alone on many cores.",
)
@tls_options
def console_command(
    listen: str,
    data_dir: str | None,
    host: str | None,
    port: int | None,
    curator: str | None,
    curator_name: str,
    owners: tuple[str, ...],
    schema_path: str | None,
    https_cert: str | None,
    https_key: str | None,
    blas_threads: int,
    **tls: Any,
) -> None:
    """Serve this party's web console (its role is its certificate's): the consumer's catalogue,
    exploration and summaries; the owner's budget, charges, sketches and policy; the curator's
    owners, sessions and catalogue. Every page needs the console's token (printed once)."""
    import uvicorn
    from threadpoolctl import threadpool_limits

    from dpmarket.console.app import create_app
    from dpmarket.console.auth import ConsoleToken

    security = security_from_options(None, **tls)
    identity = security.identity
    if identity is None:
        raise click.UsageError(
            "the console runs on the party's own certificate (--pki-dir and --name, or --ca, "
            "--cert and --key): it has no role without one"
        )
    if data_dir is None:
        raise click.UsageError(
            f"give --data-dir: the {identity.role}'s data directory (or data-dir in its config)"
        )
    if bool(https_cert) != bool(https_key):
        raise click.UsageError("give both --https-cert and --https-key")
    bind_host, bind_port = _listen(listen)
    host_shown = shown_host(bind_host)  # before anything starts: a wildcard may be refused
    party = _party(identity, security, Path(data_dir), host, port, curator, curator_name, owners,
                   schema_path)  # fmt: skip
    try:
        token = ConsoleToken.load_or_create(data_dir)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    sock = _bind(bind_host, bind_port)
    bound = sock.getsockname()[1]
    app = create_app(party, identity, token, port=bound, https=https_cert is not None)
    from dpmarket.console.consumer import ConsumerConsole

    # Process-wide, for the warm-up thread and the answers alike.
    threadpool_limits(limits=blas_threads, user_api="blas")
    party.start_warming()  # its explore caches, or its chart, in the background
    scheme = "https" if https_cert else "http"
    shown = f"[{host_shown}]" if ":" in host_shown else host_shown
    base = f"{scheme}://{shown}:{bound}{token.prefix}"
    every = f" (serving on every interface, {bind_host or '::'})" if bind_host in WILDCARDS else ""
    click.echo(f"{identity}'s console: {base}/{every}")
    if token.created:
        # The token is not put into an address: a browser would keep it in its history.
        click.echo(
            f"sign in at {base}/login with its token (printed this once; kept in {token.path}, "
            f"mode 0600; paste it into the form): {token.value}"
        )
    else:
        click.echo(f"sign in with the token in {token.path}")
    if bind_host not in ("127.0.0.1", "localhost", "::1") and not https_cert:
        logger.warning(
            "the console serves %s over plain HTTP: the token and the pages cross the network "
            "in the clear; use --https-cert/--https-key or an SSH tunnel",
            bind_host,
        )
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        ssl_certfile=https_cert,
        ssl_keyfile=https_key,
        proxy_headers=False,
        server_header=False,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if isinstance(party, ConsumerConsole):
            party.stop_warming()  # its refitting process too: not left behind the console


def _party(
    identity: Identity,
    security: Any,
    data_dir: Path,
    host: str | None,
    port: int | None,
    curator: str | None,
    curator_name: str,
    owners: tuple[str, ...],
    schema_path: str | None,
) -> Any:
    """The role's console object, from the options its role reads."""
    if identity.role == "consumer":
        from dpmarket.console.consumer import ConsumerConsole
        from dpmarket.consumer.client import CuratorClient
        from dpmarket.runtime.schemas import load_schema

        if curator is None:
            raise click.UsageError("a consumer's console needs --curator HOST:PORT")
        try:
            schema = load_schema(schema_path) if schema_path else None
            expected = Identity("curator", curator_name)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc)) from exc
        client = CuratorClient(
            curator, security, curator=expected, timeout=10.0, connect_timeout=None
        )
        return ConsumerConsole(client, data_dir, schema)
    if identity.role == "owner":
        from dpmarket.console.owner import OwnerConsole, service_target

        return OwnerConsole(data_dir, security, service_target(host, port), identity)
    from dpmarket.console.curator import CuratorConsole
    from dpmarket.console.owner import service_target

    targets = []
    for text in owners:
        name, at, address = text.rpartition("@")
        if not at:
            raise click.BadParameter(f"{text!r}: give NAME@HOST:PORT", param_hint="--owner")
        try:
            targets.append((Identity("owner", name), address))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--owner") from exc
    return CuratorConsole(data_dir, security, targets, service_target(host, port), identity)
