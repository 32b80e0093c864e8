"""A local deployment of one's own data: ``dpmarket init``, ``up`` and ``down``.

:func:`init_deployment` writes, into one folder, everything a marketplace over the user's own
CSV or Parquet files needs to run on this machine: the deployment's PKI
(:mod:`dpmarket.deploy.pki`: a CA in the offline folder ``ca/``, which no service reads, and a
certificate for the curator, every owner and a consumer, each in the service's own
``pki/<role>-<name>/`` with ``ca.crt`` and nothing of the CA's key), a schema drafted from the
data (:func:`dpmarket.common.schema.draft_schema`, marked as a draft), a sketch declaration over
the schema's columns for the curator's catalogue and one over its features (the label excluded)
that the candidates method's allocation reads, one configuration file per service
(``--config``: every option of ``owner serve``, ``curator serve`` and the consumer's commands),
each owner's data directory with its policy — whose ``[peers]`` pin every other owner's public
key, the roster of its CAPE jobs — and its ledger
(:func:`dpmarket.owner.ledger_admin.init_ledger`: the only place an owner's ledger is created),
and ``deployment.toml``, the list of services :func:`up`
starts.

The CA's key signs certificates and nothing else: no service needs it to run. Whoever holds it
can mint a certificate under any name, so ``init`` leaves it in ``ca/`` for the operator to move
off the machine (docs/howto-certificates.md, "The offline CA"), and pins what it cannot forge:
each owner accepts as a CAPE peer only the keys its policy lists.

The drafted schema's bounds are the minimum and maximum of the private data: they disclose it.
Owners refuse to serve a draft (:meth:`dpmarket.common.schema.Schema.check_confirmed`), so nothing
runs until the user has replaced every drafted bound with public knowledge and removed the draft
mark.

:func:`up` starts every service of a deployment as a background process (logs in ``logs/``,
process ids and ports in ``run/``), waits until each reports its port, then has every owner
publish, once, its sketch under the curator's allocation spec (``allocation.toml``: an RFF map
of the schema's features, the label excluded, :data:`ALLOCATION_EPSILON` charged to each
owner's ledger), so that the summaries split their budget by the published sketches and charge
the owners nothing for it; :func:`down` stops them with SIGTERM (graceful), then SIGKILL.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.common.errors import DPMarketError, InvalidArgumentError, UnavailableError
from dpmarket.common.schema import draft_schema
from dpmarket.deploy.pki import init_ca, issue_all, owner_pins
from dpmarket.owner.ledger_admin import init_ledger
from dpmarket.owner.policy import POLICY_FILE, OwnerPolicy
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.tables import load_table
from dpmarket.runtime.transport import TransportSecurity

__all__ = [
    "ALLOCATION_EPSILON",
    "ALLOCATION_FILE",
    "CA_DIR",
    "DEPLOYMENT_FILE",
    "DRAFT_NOTES",
    "AllocationSketch",
    "Deployment",
    "Started",
    "down",
    "draft_owner_policy",
    "init_deployment",
    "publish_allocation_sketches",
    "service_pki_dir",
    "up",
]

#: The list of a deployment's services, in the folder ``init`` writes.
DEPLOYMENT_FILE = "deployment.toml"
#: Seconds ``up`` waits for a service to report its port (an owner of a large table checks
#: every value before it serves; a service that exits is reported at once).
START_TIMEOUT_SECONDS = 300.0
#: Seconds ``up`` waits, once every service reports its port, for the curator to report
#: every owner connected (its health service: ``owner:NAME`` SERVING).
CONNECT_TIMEOUT_SECONDS = 60.0
#: Seconds ``down`` waits for a service to stop after SIGTERM before killing it.
STOP_TIMEOUT_SECONDS = 30.0
CURATOR = "curator"
#: A manifest's commands for the curator and the owners (the names before the CLI's regrouping
#: too: deployments written then).
_CURATOR_COMMANDS = ("curator serve", "serve-curator")
_OWNER_COMMANDS = ("owner serve", "serve-owner")
#: The CA's folder in a deployment (``ca.crt``, ``ca.key``): read by ``dpmarket pki issue`` only.
CA_DIR = "ca"
#: What a drafted owner policy says above the keys it sets away from the production defaults,
#: and above a default whose disclosure an operator should weigh before changing it
#: (:meth:`dpmarket.owner.policy.OwnerPolicy.to_toml`'s ``notes``).
DRAFT_NOTES = {
    "allow_steered_selection": (
        "true: this deployment is one operator's (`dpmarket init` built the curator, every owner\n"
        "and their certificates in one folder), and its default method, candidates, needs it.\n"
        "What it reveals: this owner sends the rows its local greedy finds most relevant to a\n"
        "validation embedding and h1 parameters the curator chooses. Each row is charged as a\n"
        "raw point; its being chosen is not: a curator steering the greedy receives, e.g., the\n"
        "row with a column's largest value and learns that it beats every other row on that\n"
        "column, for at most min(session.points, floor(session.points_fraction * rows)) rows a\n"
        "session. Set false when someone else runs the curator: this owner then serves the\n"
        "uniform method only and refuses candidates sessions when they open, charging nothing."
    ),
    "allow_reward_disclosure": (
        "false: sessions with a consumer's reward (request --reward) are refused when they open,\n"
        "charging nothing. What a reward discloses: each owner's statement states exactly how\n"
        "many of its points the summary holds (the reward pays on that count). That count depends\n"
        "on the consumer's validation set and on every other owner's points and is not a DP\n"
        "release: this owner would learn it of the others, and they of this owner. Set true only\n"
        "if this owner consents to that; a session runs with a reward only among owners that all\n"
        "set it."
    ),
}


def service_pki_dir(identity: Identity) -> Path:
    """A service's own PKI folder in a deployment, relative to it: ``pki/<role>-<name>``, with
    ``ca.crt`` and the service's certificate and key (never the CA's key)."""
    return Path("pki") / f"{identity.role}-{identity.name}"


@dataclass(frozen=True)
class Deployment:
    """What :func:`init_deployment` wrote.

    Attributes
    ----------
    directory : Path
    schema : Path
        The drafted schema (to confirm).
    owners : dict of str to Path
        Each owner's configuration file.
    curator, consumer : Path
        The curator's and the consumer's configuration files.
    ca : Path
        The CA's folder (``ca.crt`` and ``ca.key``): no service reads it; keep it offline.
    """

    directory: Path
    schema: Path
    owners: dict[str, Path]
    curator: Path
    consumer: Path
    ca: Path

    def next_commands(self) -> list[str]:
        """The three commands that follow ``init``: confirm the schema, start, ask."""
        d = self.directory
        return [
            f"$EDITOR {self.schema}   # replace every drafted bound by public knowledge, "
            "then delete the line `draft = true`",
            f"dpmarket up {d}",
            f"dpmarket consumer request --config {self.consumer} --validation VALIDATION.csv "
            "-p 20 "
            "--out summary.csv",
        ]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _toml(value: object) -> str:
    """A TOML value: strings and lists of strings as JSON (a TOML subset), numbers as is."""
    return json.dumps(value)


def _config(comment: str, values: Mapping[str, object]) -> str:
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines.append("")
    lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _sketch_declaration(name: str, rows: int) -> str:
    """The drafted catalogue: M2M maps for moments, CDFs and ranking, and a marginals map, which
    ``consumer explore`` prefers for what it expresses (counts, CDFs, marginal tables, synthetic
    records, moments of discrete columns: ``choose_source``). ``rows`` is the smallest owner's
    table, rounded down to one significant digit."""
    return f"""# A sketch declaration of the curator's catalogue (curator serve --sketch-spec): the
# columns of the deployment's schema, a map of each kind, and the mechanism. Specs:
# {name}/rff, {name}/race, {name}/hist and {name}/marginals. An owner publishes with
#   dpmarket owner publish --config owner-NAME.toml --spec {name}/marginals --spec {name}/hist
# (each charged once to its ledger); consumers then explore and rank owners at no further cost.
# `dpmarket consumer explore` answers counts, CDFs, marginal tables and synthetic records from
# the marginals sketch (every discrete column with its levels, every other cut in `bins` cells).
name = "{name}"
schema = "schema.toml"

[mechanism]
noise = "laplace"
epsilon = 1.0
epsilon_range = [0.1, 1.0]

[maps.rff]
frequencies = 100
sigma = 0.5

[maps.race]
hashes = 20
buckets = 20
width = 0.2

[maps.hist]
bins = 10

[maps.marginals]
bins = 8
# DRAFT, drawn from your tables (the smallest owner's rows, to one significant digit): the
# default number of measured marginals plans for it. Replace it by a public estimate.
rows = {rows}
delta = 1e-6
"""


#: The allocation's sketch declaration ``init`` writes, and the suffix of its name.
ALLOCATION_FILE = "allocation.toml"
ALLOCATION_SUFFIX = "-allocation"
#: Epsilon each owner's allocation sketch costs it, once (its ledger; the default policy's
#: ``sketches.epsilon`` allows it).
ALLOCATION_EPSILON = 1.0


def allocation_declaration_name(name: str) -> str:
    """The allocation declaration's name for a deployment named ``name`` (at most 64
    characters, as every declaration's name); its spec is ``<that>/rff``."""
    return name[: 64 - len(ALLOCATION_SUFFIX)] + ALLOCATION_SUFFIX


def _allocation_declaration(name: str, features: Sequence[str]) -> str:
    """The declaration of the sketch the candidates method's allocation reads: an RFF map over
    the schema's features (the label excluded: an owner's summarization points have the
    features only, and the curator refuses a spec of another width at start)."""
    return f"""# The sketch the curator's summaries read to split their budget among the owners
# (curator serve --allocation-sketch-spec {name}/rff): a random-feature sketch of the
# schema's features, in order, without the label (the owners' summarization points have no
# label: the curator refuses at start a spec of another width). `dpmarket up` has every owner
# publish it once, charging epsilon {ALLOCATION_EPSILON:g} to its own ledger; the summaries then
# charge the owners nothing to split their budget (without it, each summary charges each
# owner epsilon 1 for a noisy count). Keep `columns` the schema's columns but its label.
name = "{name}"
schema = "schema.toml"
columns = {_toml(list(features))}

[mechanism]
noise = "laplace"
epsilon = {ALLOCATION_EPSILON!r}
epsilon_range = [0.1, 1.0]

[maps.rff]
frequencies = 100
sigma = 0.5
"""


def _read_owner_tables(owners: Mapping[str, Path]) -> tuple[list[str], np.ndarray, list[int]]:
    """Every owner's table (the pitfalls refused, naming file and column), concatenated, and each
    one's rows; they must share their columns, in order."""
    names: list[str] | None = None
    first = ""
    blocks = []
    for owner, path in owners.items():
        table = load_table(path, name=owner)
        if names is None:
            names, first = list(table.columns), str(path)
        elif list(table.columns) != names:
            raise InvalidArgumentError(
                f"{path} has the columns {list(table.columns)}, {first} has {names}: every "
                "owner's table must have the same columns in the same order"
            )
        blocks.append(table.values)
    assert names is not None
    return names, np.concatenate(blocks), [b.shape[0] for b in blocks]


def draft_owner_policy(peers: Sequence[tuple[str, str]] = ()) -> OwnerPolicy:
    """The policy drafted for an owner of a deployment one operator builds for itself.

    ``dpmarket init`` writes it into every owner's data directory (with :data:`DRAFT_NOTES`),
    and :class:`dpmarket.deploy.launcher.LocalCluster` runs its owners under it when given no
    policy. The production defaults (:class:`~dpmarket.owner.policy.OwnerPolicy`), except
    ``access.allow_steered_selection = true``: the one operator runs the curator too, and the
    tutorial's default method (candidates) picks its rows along the curator's embedding, which
    an owner serves only with that key (:func:`dpmarket.owner.terms.check_steered_selection`).
    Exact bids, non-private sessions and sessions with a consumer's reward
    (``access.allow_reward_disclosure``, drafted false with a note saying what it discloses)
    stay refused.

    Parameters
    ----------
    peers : sequence of (str, str)
        The owners accepted as CAPE peers, each with the pin of its public key.

    Returns
    -------
    OwnerPolicy
    """
    return OwnerPolicy(curators=(CURATOR,), allow_steered_selection=True, peers=tuple(peers))


def init_deployment(
    directory: str | os.PathLike[str],
    owners: Mapping[str, str | os.PathLike[str]],
    *,
    label: str | None = None,
    consumer: str = "consumer",
    host: str = "127.0.0.1",
    base_port: int | None = None,
    name: str | None = None,
) -> Deployment:
    """Write a local deployment for ``owners``' own tables into ``directory``.

    Parameters
    ----------
    directory : path
        Created; must not hold a deployment already.
    owners : mapping of str to path
        Owner name (its certificate's) to its table (.csv or .parquet with a header); the
        tables must share their columns, in order.
    label : str, optional
        The schema's label column.
    consumer : str
        The consumer's certificate name.
    host : str
        The address every service binds and is reached at.
    base_port : int, optional
        The curator listens on it, the owners on the next ports; default: free ports now.
    name : str, optional
        The schema's and the sketch declaration's name; default: the folder's name.

    Returns
    -------
    Deployment

    Raises
    ------
    FileExistsError
        If ``directory`` holds a deployment.
    FileNotFoundError, ValueError
        If a table is missing, unreadable, holds a pitfall (index column, no header, text) or
        the tables' columns differ; if a name is not a valid certificate name or a column is
        constant (no bounds can be drafted).

    Notes
    -----
    The schema's bounds are drafted from the data and disclose it: the file says so and is
    marked a draft, which every owner refuses to serve.
    """
    root = Path(directory)
    if (root / DEPLOYMENT_FILE).exists():
        raise FileExistsError(f"{root} holds a deployment already ({DEPLOYMENT_FILE})")
    if not owners:
        raise InvalidArgumentError("a deployment needs at least one owner")
    identities = [Identity("curator", CURATOR), Identity("consumer", consumer)]
    identities += [Identity("owner", o) for o in owners]
    paths = {o: Path(p).resolve() for o, p in owners.items()}
    columns, values, counts = _read_owner_tables(paths)
    if label is not None and label not in columns:
        raise InvalidArgumentError(f"--label {label!r} is not a column; the columns: {columns}")
    title = name or root.resolve().name
    schema = draft_schema(columns, values, label=label, name=title)

    root.mkdir(parents=True, exist_ok=True)
    ca = root / CA_DIR
    init_ca(ca)
    pki_dirs = {identity: service_pki_dir(identity) for identity in identities}
    for identity, pki_dir in pki_dirs.items():
        issue_all(ca, [identity], out_dir=root / pki_dir)
    pins = {
        i.name: owner_pins(root / d, [i.name])[i.name]
        for i, d in pki_dirs.items()
        if i.role == "owner"
    }
    schema_path = root / "schema.toml"
    schema_path.write_text(schema.as_toml(), encoding="utf-8")
    smallest = max(1, min(counts))
    scale = 10 ** (len(str(smallest)) - 1)
    (root / "sketches.toml").write_text(
        _sketch_declaration(schema.name, smallest // scale * scale), encoding="utf-8"
    )
    allocation = allocation_declaration_name(schema.name)
    (root / ALLOCATION_FILE).write_text(
        _allocation_declaration(allocation, schema.feature_names), encoding="utf-8"
    )

    ports = (
        [base_port + k for k in range(len(owners) + 1)]
        if base_port is not None
        else [_free_port(host) for _ in range(len(owners) + 1)]
    )
    curator_target = f"{host}:{ports[0]}"
    owner_files: dict[str, Path] = {}
    services = []
    for k, (owner, data) in enumerate(paths.items()):
        state = root / "owners" / owner
        state.mkdir(parents=True, exist_ok=True)
        peers = tuple((o, pin) for o, pin in pins.items() if o != owner)
        policy = draft_owner_policy(peers)
        (state / POLICY_FILE).write_text(policy.to_toml(DRAFT_NOTES), "utf-8")
        # The owner's ledger, created now and bound to its certificate: no owner command
        # creates one, so a ledger lost later is refused rather than started again.
        identity = Identity("owner", owner)
        files = identity_files(root / pki_dirs[identity], identity)
        security = TransportSecurity.from_files(*files)
        init_ledger(state, owner, security)
        config = root / f"owner-{owner}.toml"
        config.write_text(
            _config(
                f"Owner {owner}: dpmarket owner serve --config {config.name}\n"
                "(also read by: dpmarket owner publish, dpmarket owner ledger).\n"
                f"Its policy: owners/{owner}/{POLICY_FILE}; its ledger beside it.",
                {
                    "data": str(data),
                    "schema": "schema.toml",
                    "data-dir": f"owners/{owner}",
                    "pki-dir": str(service_pki_dir(Identity("owner", owner))),
                    "name": owner,
                    "host": host,
                    "port": ports[k + 1],
                    "curator": curator_target,
                },
            ),
            encoding="utf-8",
        )
        owner_files[owner] = config
        services.append(("owner", owner, config.name))
    curator_config = root / "curator.toml"
    curator_config.write_text(
        _config(
            "The curator: dpmarket curator serve --config curator.toml",
            {
                "owner": [f"{o}@{host}:{ports[k + 1]}" for k, o in enumerate(paths)],
                "host": host,
                "port": ports[0],
                "data-dir": "curator",
                "pki-dir": str(service_pki_dir(Identity("curator", CURATOR))),
                "name": CURATOR,
                "sketch-spec": ["sketches.toml", ALLOCATION_FILE],
                "allocation-sketch-spec": f"{allocation}/rff",
            },
        ),
        encoding="utf-8",
    )
    services.append((CURATOR, CURATOR, curator_config.name))
    consumer_config = root / "consumer.toml"
    consumer_config.write_text(
        _config(
            "The consumer: dpmarket consumer request | cape ... | sketches | explore |\n"
            "rank-owners --config consumer.toml. Its tables are read through the schema\n"
            "(columns by name). Its data directory keeps its sessions' records and its\n"
            "console's token (dpmarket console --config consumer.toml).",
            {
                "curator": curator_target,
                "curator-name": CURATOR,
                "pki-dir": str(service_pki_dir(Identity("consumer", consumer))),
                "name": consumer,
                "schema": "schema.toml",
                "data-dir": "consumer",
            },
        ),
        encoding="utf-8",
    )
    manifest = "# The services `dpmarket up` starts, in order; `dpmarket down` stops them.\n"
    for role, service, config_name in services:
        command = "curator serve" if role == CURATOR else "owner serve"
        manifest += (
            f'\n[[service]]\nname = "{service}"\ncommand = "{command}"\nconfig = "{config_name}"\n'
        )
    (root / DEPLOYMENT_FILE).write_text(manifest, encoding="utf-8")
    return Deployment(root, schema_path, owner_files, curator_config, consumer_config, ca)


def _services(root: Path) -> list[dict[str, str]]:
    path = root / DEPLOYMENT_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{root} holds no deployment ({DEPLOYMENT_FILE}): create one with dpmarket init"
        ) from None
    services = data.get("service", [])
    for s in services:
        if set(s) != {"name", "command", "config"}:
            raise InvalidArgumentError(f"{path}: each [[service]] has name, command and config")
    return list(services)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(run: Path, name: str) -> int | None:
    path = run / f"{name}.pid"
    if not path.is_file():
        return None
    pid = int(path.read_text(encoding="utf-8").strip() or 0)
    return pid if pid > 0 and _alive(pid) else None


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    return lines[-1].strip() if lines else "(empty log)"


@dataclass(frozen=True)
class AllocationSketch:
    """An owner's allocation sketch after :func:`up`.

    Attributes
    ----------
    owner, spec : str
        The owner and the curator's allocation spec (``curator serve --allocation-sketch-spec``).
    epsilon : float
        What this call charged the owner's ledger for it: the spec's epsilon when it published
        it now, 0 when the catalogue held it already (or the owner's ledger had released it).
    held : bool
        Whether the catalogue held it already (nothing read, charged or sent).
    error : str
        Why the owner did not publish it (its policy, its budget, its table), empty otherwise:
        summaries then split their budget by noisy counts, charging every owner.
    """

    owner: str
    spec: str
    epsilon: float = 0.0
    held: bool = False
    error: str = ""


@dataclass(frozen=True)
class Started:
    """What :func:`up` did.

    Attributes
    ----------
    ports : dict of str to str
        Every service's port, by name.
    allocation : tuple of AllocationSketch
        Every owner's allocation sketch, in the deployment's order (empty when the curator
        names no allocation spec: a deployment written before ``init`` declared one).
    """

    ports: dict[str, str]
    allocation: tuple[AllocationSketch, ...] = ()


def up(directory: str | os.PathLike[str]) -> Started:
    """Start every service of a deployment in the background, then have every owner publish
    the allocation's sketch once.

    Services already running are left alone. Each runs ``dpmarket -v <command> --config
    <file>`` in its own session (it outlives this call), writes its log to
    ``logs/<name>.log`` and its process id and port to ``run/``. Once every service reports
    its port and the curator reports a connection to every owner (so the next request finds
    every owner, one restarted by this call included), every owner whose sketch under the
    curator's allocation spec is not in the catalogue publishes it
    (:func:`publish_allocation_sketches`): charged to its own ledger before it is sent,
    :data:`ALLOCATION_EPSILON` as ``init`` declares it; a repeated ``up`` charges nothing.

    Raises
    ------
    FileNotFoundError
        If ``directory`` holds no deployment.
    UnavailableError
        If a service exits or reports no port within :data:`START_TIMEOUT_SECONDS` (the message
        quotes the last line of its log, e.g. a draft schema refused), or the curator reports
        an owner not connected within :data:`CONNECT_TIMEOUT_SECONDS`; the services started by
        this call are stopped again.
    """
    root = Path(directory)
    services = _services(root)
    run, logs = root / "run", root / "logs"
    run.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    started: list[str] = []
    ready: dict[str, str] = {}
    waves: list[list[dict[str, str]]] = []
    for service in services:  # consecutive services of one command start together
        if waves and waves[-1][0]["command"] == service["command"]:
            waves[-1].append(service)
        else:
            waves.append([service])
    try:
        for wave in waves:
            spawned = []
            for service in wave:
                name = service["name"]
                port_file = run / f"{name}.port"
                if _pid(run, name) is not None and port_file.is_file():
                    ready[name] = port_file.read_text(encoding="utf-8").strip()
                    continue
                port_file.unlink(missing_ok=True)
                log_path = logs / f"{name}.log"
                pid = _spawn(
                    [sys.executable, "-m", "dpmarket", "-v", *service["command"].split(),
                     "--config", str(root / service["config"]), "--port-file", str(port_file)],
                    log_path,
                )  # fmt: skip
                (run / f"{name}.pid").write_text(str(pid), encoding="utf-8")
                started.append(name)
                spawned.append((name, pid, port_file, log_path))
            for name, pid, port_file, log_path in spawned:
                ready[name] = _wait_port(name, pid, port_file, log_path)
        for service in services:
            if service["command"] in _CURATOR_COMMANDS:
                _wait_connected(root, service, ready[service["name"]], logs)
    except BaseException:
        _stop(run, started)
        raise
    return Started(ready, publish_allocation_sketches(root, services, ready))


def _owner_security(root: Path, config: Mapping[str, Any]) -> TransportSecurity:
    identity = Identity("owner", str(config["name"]))
    return TransportSecurity.from_files(*identity_files(root / config["pki-dir"], identity))


def publish_allocation_sketches(
    root: Path, services: Sequence[Mapping[str, str]], ports: Mapping[str, str]
) -> tuple[AllocationSketch, ...]:
    """Have every owner of a running deployment publish its sketch under the curator's
    allocation spec, unless the catalogue holds it already.

    Each owner is asked as ``dpmarket owner publish --config owner-NAME.toml --spec SPEC``
    would (:func:`dpmarket.owner.publishing.publish_sketches`: its table read through the
    schema, its policy checked and its ledger charged before anything is sent); when the
    catalogue holds its sketch, nothing is read, charged or sent.

    Returns
    -------
    tuple of AllocationSketch
        One per owner, in order; empty when the curator names no allocation spec. An owner
        that refuses (its policy, its budget) or cannot read its table is reported with the
        reason (its sessions then split by noisy counts); ``up`` still succeeds.
    """
    from dpmarket.owner.engine import start_engine
    from dpmarket.owner.publishing import publish_sketches
    from dpmarket.owner.sketch_client import CatalogClient

    curator = next((s for s in services if s["command"] in _CURATOR_COMMANDS), None)
    if curator is None:
        return ()
    curator_config = tomllib.loads((root / curator["config"]).read_text(encoding="utf-8"))
    spec = curator_config.get("allocation-sketch-spec")
    if not spec or "pki-dir" not in curator_config:
        return ()
    curator_name = str(curator_config.get("name", CURATOR))
    target = f"{curator_config.get('host', '127.0.0.1')}:{ports[curator['name']]}"
    done = []
    for service in services:
        if service["command"] not in _OWNER_COMMANDS:
            continue
        config = tomllib.loads((root / service["config"]).read_text(encoding="utf-8"))
        owner = str(config["name"])
        security = _owner_security(root, config)
        try:
            with CatalogClient(target, security, curator=Identity("curator", curator_name)) as c:
                if c.spec(spec).published:
                    done.append(AllocationSketch(owner, spec, held=True))
                    continue
            workers = config.get("dask-workers")
            scheduler = config.get("dask-scheduler")
            published = publish_sketches(
                target,
                security,
                table_path=str(config["data"]),
                data_dir=root / config["data-dir"],
                specs=[spec],
                schema_path=str(root / config["schema"]) if "schema" in config else None,
                policy_path=str(root / config["policy"]) if "policy" in config else None,
                curator_name=curator_name,
                engine=functools.partial(start_engine, scheduler, workers=workers),
                in_memory_values=config.get("in-memory-values"),
            )
        except (OSError, ValueError, RuntimeError, DPMarketError) as exc:
            done.append(AllocationSketch(owner, spec, error=str(exc)))
            continue
        (delivery,) = published.deliveries
        charged = delivery.publication.charged_now
        epsilon = delivery.publication.sketch.mechanism.epsilon if charged else 0.0
        done.append(AllocationSketch(owner, spec, epsilon=epsilon))
    return tuple(done)


def _wait_connected(root: Path, service: Mapping[str, str], port: str, logs: Path) -> None:
    """Wait until the curator reports a connection to each of its owners (its health service,
    ``owner:NAME``), so that the next request finds every owner ``up`` reported serving.

    Raises
    ------
    UnavailableError
        If an owner is not connected within :data:`CONNECT_TIMEOUT_SECONDS` (naming it and the
        curator's log).
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dpmarket.curator.owners import OWNER_HEALTH_PREFIX
    from dpmarket.runtime.identity import identity_files
    from dpmarket.runtime.transport import TransportSecurity, connected_channel

    config = tomllib.loads((root / service["config"]).read_text(encoding="utf-8"))
    owners = [str(text).split("@", 1)[0] for text in config.get("owner", [])]
    if not owners or "pki-dir" not in config:  # plaintext deployments name owners by address
        return
    identity = Identity("curator", str(config.get("name", CURATOR)))
    security = TransportSecurity.from_files(*identity_files(root / config["pki-dir"], identity))
    target = f"{config.get('host', '127.0.0.1')}:{port}"
    pending = set(owners)
    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    with connected_channel(target, security, identity) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while pending:
            for owner in sorted(pending):
                request = health_pb2.HealthCheckRequest(service=OWNER_HEALTH_PREFIX + owner)
                try:
                    status = health.Check(request, timeout=5.0).status
                except grpc.RpcError as exc:  # NOT_FOUND: its monitor has not reported yet
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise UnavailableError(
                            f"{service['name']}: health check failed: {exc.code().name}"
                        ) from None
                    continue
                if status == health_pb2.HealthCheckResponse.SERVING:
                    pending.discard(owner)
            if pending and time.monotonic() > deadline:
                raise UnavailableError(
                    f"{service['name']} reports no connection to owner(s) "
                    f"{', '.join(sorted(pending))} after {CONNECT_TIMEOUT_SECONDS:.0f} s "
                    f"(log: {logs / (service['name'] + '.log')})"
                )
            if pending:
                time.sleep(0.05)


def _spawn(argv: list[str], log_path: Path) -> int:
    """Start ``argv`` in a new session (it outlives this process), its output appended to
    ``log_path`` and no input; return its process id."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, log, 1),
                (os.POSIX_SPAWN_DUP2, log, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(devnull)
        os.close(log)


def _exit_code(pid: int) -> int | None:
    """A child's exit code once it has exited (reaping it), else ``None``; ``-1`` for a process
    of another parent that is gone."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None if _alive(pid) else -1
    return os.waitstatus_to_exitcode(status) if done else None


def _wait_port(name: str, pid: int, port_file: Path, log_path: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not port_file.exists():
        code = _exit_code(pid)
        if code is not None:
            raise UnavailableError(
                f"{name} exited with code {code}: {_last_line(log_path)} (log: {log_path})"
            )
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"{name} reported no port within {START_TIMEOUT_SECONDS:.0f} s (log: {log_path})"
            )
        time.sleep(0.05)
    return port_file.read_text(encoding="utf-8").strip()


def _stop(run: Path, names: Sequence[str]) -> list[str]:
    stopped = []
    pids = {name: _pid(run, name) for name in names}
    for pid in pids.values():
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    for name, pid in pids.items():
        if pid is not None:
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while _exit_code(pid) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            stopped.append(name)
        for suffix in (".pid", ".port"):
            (run / f"{name}{suffix}").unlink(missing_ok=True)
    return stopped


def down(directory: str | os.PathLike[str]) -> list[str]:
    """Stop every running service of a deployment (SIGTERM, then SIGKILL after
    :data:`STOP_TIMEOUT_SECONDS`); return the names of those stopped.

    Raises
    ------
    FileNotFoundError
        If ``directory`` holds no deployment.
    """
    root = Path(directory)
    names = [s["name"] for s in _services(root)]
    return _stop(root / "run", list(reversed(names)))
