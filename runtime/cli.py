"""What every role's ``dpmarket`` commands share: a configuration file per service
(:func:`config_option`), the mTLS options every gRPC command takes, the output check that runs
before anything is released, the console and logging set-up, the progress bar of a summarization
session, the options naming the curator, and writing a command's JSON output.

The commands themselves live with their role (:mod:`dpmarket.owner.cli`,
:mod:`dpmarket.curator.cli`, :mod:`dpmarket.consumer.cli`, :mod:`dpmarket.deploy.pki`,
:mod:`dpmarket.experiments.cli`); :mod:`dpmarket.deploy.cli` composes them
into the ``dpmarket`` command."""

from __future__ import annotations

import logging
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dpmarket.runtime.files import json_text, write_json
from dpmarket.runtime.identity import ROLES, Identity, identity_files
from dpmarket.runtime.logs import console, ensure_info_logging, setup_logging
from dpmarket.runtime.transport import TransportSecurity

if TYPE_CHECKING:  # the health probe imports this module: no numerical library at start
    from dpmarket.common.summarization.summary import ProgressEvent

__all__ = [
    "CONFIG_HELP",
    "SectionedCommand",
    "SectionedOption",
    "check_outputs",
    "config_option",
    "console",
    "curator_identity",
    "curator_options",
    "ensure_info_logging",
    "json_option",
    "print_json",
    "print_table",
    "progress_printer",
    "security_from_options",
    "setup_logging",
    "tls_options",
    "write_output",
]

logger = logging.getLogger("dpmarket")


CONFIG_HELP = (
    "A TOML file of option values, keyed by the options' long names without the dashes (e.g. "
    'data-dir = "state", owner = ["a@host:1"]); options given on the command line '
    "override it. Keys at the top level apply to every command that takes them (one file per "
    "party); a table named after a command ([owner.serve], [consumer.request], "
    "[consumer.cape.mean]) applies to that command only. Relative paths are relative to the "
    "file's folder. A key no command takes is an error."
)


def _option_keys(command: click.Command) -> dict[str, click.Parameter]:
    """A command's config keys: every long option name without its dashes (also with
    underscores), mapped to its parameter."""
    keys: dict[str, click.Parameter] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "config" or not param.expose_value:
            continue
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--"):
                keys[opt[2:]] = param
                keys[opt[2:].replace("-", "_")] = param
    return keys


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of a command tree that may take ``--config``, with its path below the root.

    A group that loads its commands on demand (:class:`dpmarket.deploy.cli.LazyGroup`) names
    those whose tree takes ``--config`` (``config_commands``): only they are imported."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=path[-1] if path else None)
        names = getattr(command, "config_commands", command.list_commands)(ctx)
        for name in names:
            sub = command.get_command(ctx, name)
            if sub is not None:
                yield from _commands(sub, (*path, name))


def _command_path(ctx: click.Context) -> tuple[str, ...]:
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return tuple(reversed(names))


def _config_value(param: click.Parameter, value: Any, folder: Path, where: str) -> Any:
    """A config value for ``param``: a list for a repeated option, relative paths anchored at
    the config file's folder."""
    if isinstance(value, Mapping):
        raise click.BadParameter(f"{where}: a table, not an option value", param_hint="--config")
    if param.multiple and not isinstance(value, list):
        value = [value]
    if isinstance(param.type, click.Path):

        def anchor(v: Any) -> Any:
            return str(folder / v) if isinstance(v, str) and not Path(v).is_absolute() else v

        value = [anchor(v) for v in value] if isinstance(value, list) else anchor(value)
    return value


def _load_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--config``'s callback (eager): read the file and make its values the command's
    defaults (:data:`CONFIG_HELP`)."""
    if value is None:
        return
    path = Path(value)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--config") from exc
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{path}: not valid TOML: {exc}", param_hint="--config") from exc
    command = ctx.command
    here = _command_path(ctx)
    root = ctx.find_root().command
    # An old name of a command (a hidden alias of the root) names the same section as its new.
    canonical: Callable[[tuple[str, ...]], tuple[str, ...]] = getattr(root, "canonical_path", tuple)
    tree = list(_commands(root))
    known = {key for _, c in tree for key in _option_keys(c)}
    paths = {p for p, _ in tree}
    mine = _option_keys(command)
    values: dict[str, Any] = {}

    def apply(
        table: Mapping[str, Any], raw: tuple[str, ...], prefix: tuple[str, ...] | None, active: bool
    ) -> None:
        # Keys of a section apply to the commands below it; this command takes its own.
        # ``raw`` is the section as written, ``prefix`` the command path it names (None: an old
        # group whose commands moved to different groups, which holds sections only).
        where = f"{path}" + (f" [{'.'.join(raw)}]" if raw else "")
        if prefix is None:
            below: set[str] = set()
        else:
            below = {key for p, c in tree if p[: len(prefix)] == prefix for key in _option_keys(c)}
        for key, item in table.items():
            if isinstance(item, Mapping):
                section_raw = (*raw, key)
                section = canonical(section_raw)
                if section in paths:
                    apply(item, section_raw, section, active and here[: len(section)] == section)
                elif item and all(isinstance(v, Mapping) for v in item.values()):
                    apply(item, section_raw, None, active)
                else:
                    raise click.BadParameter(
                        f"{where}: [{'.'.join(section_raw)}] is not a dpmarket command",
                        param_hint="--config",
                    )
                continue
            if prefix is None:
                raise click.BadParameter(
                    f"{where} is not a dpmarket command", param_hint="--config"
                )
            if key not in (below if prefix else known):
                raise click.BadParameter(
                    f"{where}: unknown key {key!r} (no "
                    + (f"'{' '.join(raw)}' " if raw else "")
                    + f"command has an option --{key}); "
                    + f"{' '.join(here) or command.name} takes: "
                    + ", ".join(sorted(k for k in mine if "_" not in k)),
                    param_hint="--config",
                )
            if active and key in mine:
                target = mine[key]
                assert target.name is not None
                values[target.name] = _config_value(
                    target, item, path.resolve().parent, f"{where} {key}"
                )

    apply(data, (), (), True)
    ctx.default_map = {**(ctx.default_map or {}), **values}


#: The widest option column of a sectioned help (click's default is 30).
_OPTION_COLUMN = 32


class SectionedOption(click.Option):
    """An option that names the section of its command's help it belongs to
    (:class:`SectionedCommand`), and may be listed there with a brief help.

    Parameters
    ----------
    section : str, optional
        The section's title (None: the command decides).
    brief : str, optional
        The help ``--help`` lists (the option's ``help`` stays its documentation).
    """

    def __init__(
        self, *args: Any, section: str | None = None, brief: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.section = section
        self.brief = brief

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        """The listing's row, with the brief help when there is one."""
        if self.brief is None:
            return super().get_help_record(ctx)
        full, self.help = self.help, self.brief
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = full


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options in titled sections, with click's own
    formatter (:meth:`click.HelpFormatter.section`).

    Parameters
    ----------
    sections : sequence of (str, sequence of str)
        Each section's title and the names (``param.name``) of the options it lists first, in
        that order; the titles' order is the help's. An option listed nowhere goes to the
        section its :class:`SectionedOption` names (after the listed sections, in the order the
        options come), else to "Other options".
    briefs : mapping of str to str, optional
        A shorter help for some options in this command's listing (by name).
    *args, **kwargs
        As :class:`click.Command`.
    """

    def __init__(
        self,
        *args: Any,
        sections: Sequence[tuple[str, Sequence[str]]] = (),
        briefs: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = [(title, tuple(names)) for title, names in sections]
        self.briefs = dict(briefs or {})

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Write the options section by section."""
        placed = {name: title for title, names in self.sections for name in names}
        rank = {name: k for _, names in self.sections for k, name in enumerate(names)}
        rows: dict[str, list[tuple[int, tuple[str, str]]]] = {t: [] for t, _ in self.sections}
        for k, param in enumerate(self.get_params(ctx)):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name = param.name or ""
            if name in self.briefs:
                record = (record[0], self.briefs[name])
            title = placed.get(name) or getattr(param, "section", None) or "Other options"
            rows.setdefault(title, []).append((rank.get(name, len(rank) + k), record))
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    ordered = [r for _, r in sorted(records, key=lambda x: x[0])]
                    formatter.write_dl(ordered, col_max=_OPTION_COLUMN)


def config_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE``: option values from a TOML file (:data:`CONFIG_HELP`), read first."""
    return click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load_config,
        help=CONFIG_HELP,
    )(func)


def tls_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """mTLS options shared by every command that talks gRPC, and ``--config``
    (:func:`config_option`)."""
    options = [
        click.option(
            "--ca",
            "ca_path",
            default=None,
            type=click.Path(dir_okay=False),
            help="The deployment CA's certificate (ca.crt from dpmarket pki init).",
        ),
        click.option(
            "--cert",
            "cert_path",
            default=None,
            type=click.Path(dir_okay=False),
            help="This party's certificate (from dpmarket pki issue).",
        ),
        click.option(
            "--key",
            "key_path",
            default=None,
            type=click.Path(dir_okay=False),
            help="This party's private key.",
        ),
        click.option(
            "--pki-dir",
            default=None,
            type=click.Path(file_okay=False),
            help="Instead of --ca/--cert/--key: a directory holding ca.crt and "
            "<role>-<name>.crt/.key (the layout dpmarket pki issue writes); needs --name.",
        ),
        click.option(
            "--name",
            default=None,
            help="This party's name, to find its files in --pki-dir.",
        ),
        click.option(
            "--insecure",
            is_flag=True,
            help="Plaintext gRPC with no identities: anyone who reaches the port is served "
            "(development only; logged as a warning).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return config_option(func)


def _role_in(pki_dir: str, name: str) -> str:
    """The role of the one ``<role>-<name>.crt`` in ``pki_dir`` (a command any role may run,
    e.g. ``health``, finds its party's files so)."""
    try:
        found = [
            role
            for role in ROLES
            if identity_files(Path(pki_dir), Identity(role, name))[1].is_file()
        ]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--name") from exc
    if len(found) != 1:
        held = sorted(p.name for p in Path(pki_dir).glob("*.crt")) if Path(pki_dir).is_dir() else []
        raise click.UsageError(
            f"--pki-dir {pki_dir} holds {'no' if not found else 'more than one'} certificate "
            f"named {name!r} (<role>-{name}.crt; it holds {', '.join(held) or 'none'}): give "
            "--ca, --cert and --key"
        )
    return found[0]


def security_from_options(
    role: str | None,
    ca_path: str | None,
    cert_path: str | None,
    key_path: str | None,
    pki_dir: str | None,
    name: str | None,
    insecure: bool,
) -> TransportSecurity:
    """Build the transport security from the TLS options; check the certificate's role.

    ``role`` None: any role (with ``--pki-dir``, the role of the one certificate named
    ``--name`` there)."""
    given = [o for o, v in (("--ca", ca_path), ("--cert", cert_path), ("--key", key_path)) if v]
    if insecure:
        if given or pki_dir:
            raise click.UsageError("--insecure cannot be combined with certificates")
        logger.warning(
            "--insecure: plaintext gRPC, no identities: any process that reaches this port is "
            "served as a trusted peer"
        )
        return TransportSecurity.plaintext()
    if pki_dir:
        if given:
            raise click.UsageError("give either --pki-dir and --name, or --ca, --cert and --key")
        if not name:
            raise click.UsageError("--pki-dir needs --name (this party's certificate name)")
        if role is None:
            role = _role_in(pki_dir, name)
        try:
            ca_path, cert_path, key_path = (
                str(p)
                for p in identity_files(Path(pki_dir), Identity(role, name))  # type: ignore[arg-type]
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--name") from exc
    elif not (ca_path and cert_path and key_path):
        missing = sorted({"--ca", "--cert", "--key"} - set(given))
        raise click.UsageError(
            f"missing {', '.join(missing)}: every channel is mTLS (issue certificates with "
            "dpmarket pki init / issue), or pass --insecure for a plaintext development setup"
        )
    try:
        security = TransportSecurity.from_files(ca_path, cert_path, key_path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    identity = security.identity
    if role is not None and (identity is None or identity.role != role):
        raise click.ClickException(f"the certificate {cert_path} is for {identity}, not a {role}")
    return security


def check_outputs(*paths: str) -> None:
    """Create the output directories and check they are writable, before any session."""
    for path in paths:
        directory = Path(path).resolve().parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as exc:
            raise click.ClickException(f"cannot write {path}: {exc}") from exc


def progress_printer(label: str) -> tuple[Progress, Callable[[ProgressEvent], None]]:
    """A rich progress bar and the callback that advances it from session events."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("accessed {task.fields[accessed]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(label, total=None, accessed=0)

    def update(event: ProgressEvent) -> None:
        progress.update(
            task, completed=event.round, total=event.total_rounds, accessed=event.points_accessed
        )
        if event.message and ("dropped" in event.message or event.stage == "failed"):
            progress.console.print(f"[yellow]{label}: {event.message}")

    return progress, update


def curator_identity(curator_name: str) -> Identity:
    """The identity the curator's certificate must carry; a bad ``--curator-name`` is a bad
    parameter."""
    try:
        return Identity("curator", curator_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--curator-name") from exc


def curator_options(func: Any) -> Any:
    """``--curator HOST:PORT`` and ``--curator-name`` (what its certificate must carry)."""
    func = click.option(
        "--curator-name", default="curator", help="The name the curator's certificate must carry."
    )(func)
    return click.option("--curator", required=True, metavar="HOST:PORT", help="The curator.")(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: print the command's result as JSON on stdout instead of tables (messages
    and progress stay on stderr)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print JSON on stdout instead of tables (messages stay on stderr).",
    )(func)


def print_table(table: Table, *, wide: bool = False) -> None:
    """Print a rich ``table`` on stdout. A ``--wide`` table is printed at its own natural width
    when that exceeds the terminal's (80 columns through a pipe), so that no cell is cut to an
    ellipsis: wide output is for reading every column, and a terminal narrower than the table
    wraps lines rather than losing digits."""
    out = Console()
    if wide:
        natural = Measurement.get(out, out.options.update_width(100_000), table).maximum
        if natural > out.width:
            out = Console(width=natural)
    out.print(table)


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (:func:`dpmarket.runtime.files.json_text`)."""
    click.echo(json_text(data), nl=False)


def write_output(data: Any, out_path: str | None) -> None:
    """Write a command's JSON output to ``--out`` (atomically) and say where; nothing without
    ``--out``."""
    if out_path is None:
        return
    write_json(data, out_path)
    console.print(f"-> {out_path}")
