"""Local multi-process launcher: owners and a curator as separate OS processes on loopback.

:class:`LocalCluster` issues the deployment's certificates (a CA, the curator, every owner and a
consumer), then starts one ``dpmarket owner serve`` process per owner data file and one
``dpmarket curator serve`` process, all over mTLS, each with its own state directory (ledger,
sessions) and policy, each binding port 0 and reporting its real port through a file;
:func:`run_demo` drives it as a consumer (``make demo``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table

from dpmarket.common.errors import UnavailableError
from dpmarket.common.summarization.methods import (
    METHODS,
    PAPER_DELTA_OWNERS,
    CandidatesConfig,
    PrivateConfig,
    SummarizationConfig,
    method_config,
)
from dpmarket.common.summarization.session_ledger import SketchAllocationReport
from dpmarket.common.summarization.summary import SummaryResult
from dpmarket.deploy.local import DRAFT_NOTES, draft_owner_policy
from dpmarket.deploy.pki import init_ca, issue_all, owner_pins
from dpmarket.experiments.runner import exact_greedy_summary, owner_sketch_seed
from dpmarket.owner.policy import load_owner_policy
from dpmarket.runtime.cli import progress_printer
from dpmarket.runtime.identity import CA_CERT, Identity, identity_files
from dpmarket.runtime.tables import feature_columns
from dpmarket.runtime.transport import TransportSecurity

#: Seconds to wait for a service to report its port.
START_TIMEOUT_SECONDS = 60.0
#: Seconds an owner's ``dpmarket owner publish`` may take.
PUBLISH_TIMEOUT_SECONDS = 300.0


#: The consumer identity the launcher issues a certificate for.
CONSUMER_NAME = "consumer"
#: The curator identity the launcher issues a certificate for.
CURATOR_NAME = "curator"


class LocalCluster:
    """Owner and curator processes on 127.0.0.1 over mTLS; a context manager that stops them.

    Parameters
    ----------
    owner_files : sequence of path
        One data file per owner (any format ``dpmarket owner serve --data`` reads), or empty
        when the owners hold tables only.
    owner_ids : sequence of str
        Owner names, one per file (their certificates' names).
    log_dir : path
        Each process writes ``<name>.log`` there.
    state_dir : path, optional
        Holds ``pki/`` (the CA and every certificate, issued when missing), ``owner-<name>/``
        (each owner's ledger) and ``curator/`` (sessions and charges). Default: a temporary
        directory removed on exit.
    owner_policy, curator_policy : path, optional
        Policy files of every owner and of the curator. The owners' default is the policy
        ``dpmarket init`` drafts (:func:`dpmarket.deploy.local.draft_owner_policy`: the
        built-in defaults, and the candidates methods served, since the cluster's operator
        runs its curator); the curator's, the built-in defaults. With certificates, each owner
        gets its policy with a ``[peers]`` section added: the public-key pins of every owner of
        the cluster and of ``peer_owners`` (:attr:`owner_policy_file`), as ``dpmarket init``
        writes them.
    allow_seeded_sessions : bool
        Passed to the curator and the owners (reproducible runs).
    owner_timeout : float
        The curator's per-call deadline for owners, seconds.
    consumers : sequence of str
        Names of the consumer certificates to issue (the first is :meth:`consumer_security`'s
        default).
    owner_tables : sequence of path, optional
        One table per owner (``dpmarket owner serve --table``) for CAPE jobs.
    owner_binary_columns : sequence of str
        Columns every owner declares 0/1 (``owner serve --binary-column``): the targets CAPE
        logistic regressions and trainings may use.
    peer_owners : sequence of str
        Owners the cluster does not run (a test plays them in-process) that are issued
        certificates and pinned in every owner's ``[peers]``, as an owner the operators agreed
        on would be.
    owners_per_process : int
        1 (default): one ``dpmarket owner serve`` process per owner, as in a deployment. More:
        owners are served in groups of that many per process (:mod:`dpmarket.deploy.owner_group`),
        each still with its own gRPC server, port, certificate, policy and ledger: for many owners
        on one machine (an owner process takes ~240 MB). :meth:`kill_owner` is then refused.
    insecure : bool
        Plaintext gRPC with no certificates (``--insecure`` on every service): only to measure
        what mTLS costs (``make bench``).
    sketch_specs : sequence of path, optional
        Sketch declarations for the curator's catalogue (``curator serve --sketch-spec``).
    sketch_seed : int, optional
        Seed of the catalogue's new specs (``curator serve --sketch-seed``).
    allocation_sketch_spec : str, optional
        The RFF spec whose sketches the candidates method's allocation reads
        (``curator serve --allocation-sketch-spec``).
    init_ledgers : bool
        True (default): create the ledger of every owner whose data directory holds none, bound
        to its certificate, as a new deployment's set-up does (``dpmarket owner ledger init``);
        an empty or damaged ledger file is never replaced. False: an owner without its ledger
        refuses to start (as every owner started by hand does).

    Raises
    ------
    UnavailableError
        If a process exits or does not report its port within ``START_TIMEOUT_SECONDS``.
    """

    def __init__(
        self,
        owner_files: Sequence[str | os.PathLike[str]],
        owner_ids: Sequence[str],
        log_dir: str | os.PathLike[str],
        *,
        state_dir: str | os.PathLike[str] | None = None,
        owner_policy: str | os.PathLike[str] | None = None,
        curator_policy: str | os.PathLike[str] | None = None,
        allow_seeded_sessions: bool = True,
        owner_timeout: float = 30.0,
        consumers: Sequence[str] = (CONSUMER_NAME,),
        owner_tables: Sequence[str | os.PathLike[str]] = (),
        owner_binary_columns: Sequence[str] = (),
        insecure: bool = False,
        sketch_specs: Sequence[str | os.PathLike[str]] = (),
        sketch_seed: int | None = None,
        allocation_sketch_spec: str | None = None,
        owners_per_process: int = 1,
        peer_owners: Sequence[str] = (),
        init_ledgers: bool = True,
    ) -> None:
        if owners_per_process < 1:
            raise ValueError(f"owners_per_process must be >= 1, got {owners_per_process}")
        self.owners_per_process = owners_per_process
        self.owner_files = [str(f) for f in owner_files]
        self.owner_tables = [str(t) for t in owner_tables]
        self.owner_binary_columns = list(owner_binary_columns)
        self.owner_ids = list(owner_ids)
        self.log_dir = Path(log_dir)
        self.owner_policy = None if owner_policy is None else str(owner_policy)
        self.peer_owners = list(peer_owners)
        self.curator_policy = None if curator_policy is None else str(curator_policy)
        self.allow_seeded_sessions = allow_seeded_sessions
        self.owner_timeout = owner_timeout
        self.consumers = list(consumers)
        self.insecure = insecure
        self.sketch_specs = [str(p) for p in sketch_specs]
        self.sketch_seed = sketch_seed
        self.allocation_sketch_spec = allocation_sketch_spec
        self.init_ledgers = init_ledgers
        self.owner_processes: list[subprocess.Popen[bytes]] = []
        self.owner_targets: list[str] = []
        self.curator_process: subprocess.Popen[bytes] | None = None
        self.curator_target = ""
        self._tmp = tempfile.TemporaryDirectory(prefix="dpmarket-cluster-")
        self.state_dir = Path(state_dir) if state_dir is not None else Path(self._tmp.name)
        self.pki_dir = self.state_dir / "pki"

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def owner_state(self, owner_id: str) -> Path:
        """The data directory (ledger) of an owner."""
        return self.state_dir / f"owner-{owner_id}"

    @property
    def curator_state(self) -> Path:
        """The curator's data directory (sessions and charges)."""
        return self.state_dir / "curator"

    def consumer_security(self, name: str | None = None) -> TransportSecurity:
        """mTLS credentials of an issued consumer (default: the first); plaintext if insecure."""
        if self.insecure:
            return TransportSecurity.plaintext()
        identity = Identity("consumer", name or self.consumers[0])
        return TransportSecurity.from_files(*identity_files(self.pki_dir, identity))

    def issue_certificates(self) -> None:
        """Create the CA and every party's certificate in ``pki/``, keeping what exists."""
        if not (self.pki_dir / CA_CERT).exists():
            init_ca(self.pki_dir)
        identities = [
            Identity("curator", CURATOR_NAME),
            *(Identity("owner", o) for o in [*self.owner_ids, *self.peer_owners]),
            *(Identity("consumer", c) for c in self.consumers),
        ]
        missing = [i for i in identities if not identity_files(self.pki_dir, i)[1].exists()]
        if missing:
            issue_all(self.pki_dir, missing)

    @property
    def owner_policy_file(self) -> str | None:
        """The policy file every owner command of the cluster gets (``--policy``): with
        certificates, ``owner_policy`` (or the drafted policy) with the ``[peers]`` pins of every
        owner of the cluster and of ``peer_owners``, written into the state directory; plaintext
        clusters pass ``owner_policy`` as it is (no CAPE without certificates), or the drafted
        policy written there."""
        if self.insecure and self.owner_policy is not None:
            return self.owner_policy
        return str(self.state_dir / "owner-policy.toml")

    def _write_owner_policy(self) -> None:
        """Write :attr:`owner_policy_file`: the owners pin each other's keys (with
        certificates), as ``dpmarket init`` makes them."""
        drafted = self.owner_policy is None
        base = draft_owner_policy() if drafted else load_owner_policy(str(self.owner_policy))
        if not self.insecure:
            pins = owner_pins(self.pki_dir, [*self.owner_ids, *self.peer_owners])
            base = dataclasses.replace(base, peers=tuple(pins.items()))
        path = Path(str(self.owner_policy_file))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(base.to_toml(DRAFT_NOTES if drafted else None), encoding="utf-8")

    def owner_security(self, owner_id: str) -> TransportSecurity:
        """mTLS credentials of an owner of the cluster (plaintext if insecure)."""
        if self.insecure:
            return TransportSecurity.plaintext()
        return TransportSecurity.from_files(
            *identity_files(self.pki_dir, Identity("owner", owner_id))
        )

    def create_ledgers(self) -> list[str]:
        """Create the ledger of every owner whose data directory holds no ledger file, bound to
        its certificate, under the cluster's owner policy (``dpmarket owner ledger init``);
        return their names. A data directory holding a ledger file, even an empty one, is left
        as it is (its owner then starts on it, or refuses to)."""
        from dpmarket.owner.ledger import LEDGER_FILE
        from dpmarket.owner.ledger_admin import init_ledger

        created = []
        for owner_id in self.owner_ids:
            state = self.owner_state(owner_id)
            if (state / LEDGER_FILE).exists():
                continue
            init_ledger(
                state, owner_id, self.owner_security(owner_id), policy=self.owner_policy_file
            )
            created.append(owner_id)
        return created

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port_file = Path(self._tmp.name) / f"{name}.port"
        port_file.unlink(missing_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpmarket.deploy.cli",
                "-v",
                *args,
                "--port-file",
                str(port_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return process, port_file

    def _wait_port(self, name: str, process: subprocess.Popen[bytes], port_file: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if port_file.exists():
                return int(port_file.read_text(encoding="utf-8").strip())
            if process.poll() is not None:
                raise UnavailableError(
                    f"{name} exited with code {process.returncode} before serving; see "
                    f"{self.log_dir / (name + '.log')}"
                )
            time.sleep(0.05)
        raise UnavailableError(f"{name} did not start within {START_TIMEOUT_SECONDS:.0f} s")

    def _owner_args(self, i: int, owner_id: str) -> list[str]:
        """``owner serve`` arguments of owner ``i`` (``--port-file`` apart)."""
        args = ["--port", "0"]
        if self.owner_files:
            args += ["--data", self.owner_files[i]]
        if self.owner_tables:
            args += ["--table", self.owner_tables[i]]
            for column in self.owner_binary_columns:
                args += ["--binary-column", column]
        args += self._tls_args(owner_id)
        args += ["--data-dir", str(self.owner_state(owner_id))]
        if self.owner_policy_file is not None:
            args += ["--policy", self.owner_policy_file]
        if self.allow_seeded_sessions:
            args.append("--allow-seeded-sessions")
        return args

    def start(self) -> None:
        """Issue the certificates, start every owner, then the curator pointed at them."""
        if not self.insecure:
            self.issue_certificates()
        if not (self.insecure and self.owner_policy is not None):
            self._write_owner_policy()
        if self.init_ledgers:
            self.create_ledgers()
        if self.owners_per_process > 1:
            self._start_owner_groups()
        else:
            spawned = []
            for i, owner_id in enumerate(self.owner_ids):
                args = ["owner", "serve", *self._owner_args(i, owner_id)]
                process, port_file = self._spawn(owner_id, args)
                self.owner_processes.append(process)
                spawned.append((owner_id, process, port_file))
            for owner_id, process, port_file in spawned:
                port = self._wait_port(owner_id, process, port_file)
                self.owner_targets.append(f"127.0.0.1:{port}")
        self.start_curator()

    def _start_owner_groups(self) -> None:
        """Start the owners in groups of ``owners_per_process`` per process."""
        size = self.owners_per_process
        tmp = Path(self._tmp.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        waiting = []
        for first in range(0, len(self.owner_ids), size):
            group = self.owner_ids[first : first + size]
            specs, port_files = [], []
            for i, owner_id in enumerate(group, start=first):
                port_file = tmp / f"{owner_id}.port"
                port_file.unlink(missing_ok=True)
                specs.append([*self._owner_args(i, owner_id), "--port-file", str(port_file)])
                port_files.append(port_file)
            name = f"owners-{first // size}"
            spec = tmp / f"{name}.json"
            spec.write_text(json.dumps(specs), encoding="utf-8")
            log = (self.log_dir / f"{name}.log").open("ab")
            process = subprocess.Popen(
                [sys.executable, "-m", "dpmarket.deploy.owner_group", str(spec)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            self.owner_processes.append(process)
            waiting += [(name, process, f) for f in port_files]
        for name, process, port_file in waiting:
            self.owner_targets.append(f"127.0.0.1:{self._wait_port(name, process, port_file)}")

    def start_curator(self) -> None:
        """Start (or restart) the curator against the running owners."""
        args = ["curator", "serve", "--port", "0", "--owner-timeout", str(self.owner_timeout)]
        args += self._tls_args(CURATOR_NAME)
        args += ["--data-dir", str(self.curator_state)]
        for owner_id, target in zip(self.owner_ids, self.owner_targets, strict=True):
            args += ["--owner", f"{owner_id}@{target}"]
        if self.curator_policy is not None:
            args += ["--policy", self.curator_policy]
        if self.allow_seeded_sessions:
            args.append("--allow-seeded-sessions")
        for path in self.sketch_specs:
            args += ["--sketch-spec", path]
        if self.sketch_seed is not None:
            args += ["--sketch-seed", str(self.sketch_seed)]
        if self.allocation_sketch_spec is not None:
            args += ["--allocation-sketch-spec", self.allocation_sketch_spec]
        self.curator_process, port_file = self._spawn("curator", args)
        port = self._wait_port("curator", self.curator_process, port_file)
        self.curator_target = f"127.0.0.1:{port}"

    def publish_sketches(
        self, tables: Mapping[str, str | os.PathLike[str]], out_dir: Path, *, seed: int | None
    ) -> dict[str, dict[str, Any]]:
        """Run ``dpmarket owner publish`` for every owner at once, one OS process each, as each
        owner's operator would: the owner's table, data directory (ledger) and policy, its
        certificate, against the running curator's catalogue.

        Parameters
        ----------
        tables : mapping of owner name to path
            The table each owner publishes from (columns named as the catalogue's specs).
        out_dir : Path
            ``publish-<owner>.json`` (what each publication printed) is written there.
        seed : int, optional
            Seeds each owner's noise (``--seed``: reproducible demos and tests); ``None``: OpenDP.

        Returns
        -------
        dict
            Each owner's ``--out`` JSON.

        Raises
        ------
        UnavailableError
            If a publication fails or takes longer than :data:`PUBLISH_TIMEOUT_SECONDS`; the
            message names its log.
        """
        out_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        processes = {}
        for k, (owner, table) in enumerate(tables.items()):
            out = out_dir / f"publish-{owner}.json"
            args = [
                sys.executable, "-m", "dpmarket.deploy.cli", "-v", "owner", "publish",
                "--curator", self.curator_target,
                "--table", str(table),
                "--data-dir", str(self.owner_state(owner)),
                *self._tls_args(owner),
                "--out", str(out), "--all",
            ]  # fmt: skip
            if self.owner_policy_file is not None:
                args += ["--policy", self.owner_policy_file]
            if seed is not None:
                args += ["--seed", str(owner_sketch_seed(seed, k))]
            with (self.log_dir / f"publish-{owner}.log").open("wb") as log:
                processes[owner] = (
                    subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT),
                    out,
                )
        results = {}
        for owner, (process, out) in processes.items():
            try:
                code = process.wait(timeout=PUBLISH_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = -1
            if code != 0:
                raise UnavailableError(
                    f"dpmarket owner publish for {owner} failed (exit {code}); see "
                    f"{self.log_dir / f'publish-{owner}.log'}"
                )
            results[owner] = json.loads(out.read_text(encoding="utf-8"))
        return results

    def _tls_args(self, name: str) -> list[str]:
        if self.insecure:
            return ["--insecure", "--owner-id", name] if name != CURATOR_NAME else ["--insecure"]
        return ["--pki-dir", str(self.pki_dir), "--name", name]

    def kill_curator(self) -> None:
        """Kill the curator abruptly (SIGKILL): no shutdown handler runs."""
        assert self.curator_process is not None
        self.curator_process.kill()
        self.curator_process.wait()

    def kill_owner(self, index: int) -> None:
        """Kill one owner process abruptly (SIGKILL), as a crashed machine would vanish.

        Raises
        ------
        ValueError
            If owners share processes (``owners_per_process > 1``).
        """
        if self.owners_per_process > 1:
            raise ValueError("owners share processes: killing one would kill its whole group")
        process = self.owner_processes[index]
        process.kill()
        process.wait()

    def restart_owner(self, index: int) -> None:
        """Start again, on the same port and data directory, an owner :meth:`kill_owner`
        killed (a machine back after a crash; the curator reaches it at the same address).

        Raises
        ------
        ValueError
            If owners share processes, or the owner is still running.
        """
        if self.owners_per_process > 1:
            raise ValueError("owners share processes: restart the whole group instead")
        if self.owner_processes[index].poll() is None:
            raise ValueError(f"owner {self.owner_ids[index]} is still running")
        owner_id = self.owner_ids[index]
        port = self.owner_targets[index].rsplit(":", 1)[1]
        args = self._owner_args(index, owner_id)
        args[args.index("--port") + 1] = port
        process, port_file = self._spawn(owner_id, ["owner", "serve", *args])
        self.owner_processes[index] = process
        self._wait_port(owner_id, process, port_file)

    def stop(self) -> None:
        """Stop every process: SIGTERM (graceful), then SIGKILL after 10 s."""
        processes = [*self.owner_processes]
        if self.curator_process is not None:
            processes.insert(0, self.curator_process)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._tmp.cleanup()


def _round_robin(result: SummaryResult) -> SummaryResult:
    """Reorder a uniform sample so that every prefix takes near-equal shares from every owner."""
    order: list[int] = []
    by_owner: dict[str, list[int]] = {}
    for i, owner in enumerate(result.owner_ids):
        by_owner.setdefault(owner, []).append(i)
    queues = list(by_owner.values())
    while any(queues):
        for queue in queues:
            if queue:
                order.append(queue.pop(0))
    idx = np.asarray(order, dtype=np.int64)
    return SummaryResult(
        points=result.points[idx],
        labels=None if result.labels is None else result.labels[idx],
        owner_ids=tuple(result.owner_ids[i] for i in order),
        report=result.report,
    )


#: Policy files shipped with the package (examples and the demo's).
POLICIES = Path(__file__).resolve().parent / "policies"


def owner_budgets(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """What each owner of a cluster has spent and has left, read from its own ledger."""
    return ledger_budgets({o: cluster.owner_state(o) for o in cluster.owner_ids})


def owner_ledger_entries(cluster: LocalCluster) -> dict[str, list[Any]]:
    """Every charge of every owner of a cluster, read from its own SQLite ledger (owner ->
    :class:`dpmarket.owner.ledger.LedgerEntry` list, oldest first)."""
    from dpmarket.owner.ledger import OwnerLedger

    out: dict[str, list[Any]] = {}
    for owner_id in cluster.owner_ids:
        with OwnerLedger(cluster.owner_state(owner_id), None) as ledger:
            out[owner_id] = list(ledger.entries())
    return out


def ledger_budgets(data_dirs: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
    """What each owner has spent and has left, read from its own ledger (owner -> data dir)."""
    from dpmarket.owner.ledger import OwnerLedger

    out: dict[str, dict[str, Any]] = {}
    for owner_id, data_dir in data_dirs.items():
        with OwnerLedger(data_dir, None) as ledger:
            spent, left, policy = ledger.window_totals(), ledger.remaining(), ledger.policy
            sessions = {e.session for e in ledger.entries()}
        out[owner_id] = {
            "sessions": len(sessions),
            "epsilon_spent": spent.epsilon,
            "epsilon_left": left.epsilon,
            "epsilon_budget": policy.epsilon_total,
            "delta_spent": spent.delta,
            "delta_left": left.delta,
            "delta_budget": policy.delta_total,
            "points_released": spent.points,
            "points_left": left.points,
            "points_budget": policy.points_total,
        }
    return out


def budget_table(budgets: dict[str, dict[str, Any]]) -> Table:
    """A rich table of :func:`owner_budgets`."""
    table = Table(title="each owner's own ledger: spent / budget (left)", title_justify="left")
    for column in ("owner", "sessions", "epsilon", "delta", "raw points"):
        table.add_column(
            column,
            justify="left" if column == "owner" else "right",
            overflow="fold",
        )
    for owner_id, b in budgets.items():
        table.add_row(
            owner_id,
            str(b["sessions"]),
            f"{b['epsilon_spent']:.4g} / {b['epsilon_budget']:g} ({b['epsilon_left']:.4g})",
            f"{b['delta_spent']:.3g} / {b['delta_budget']:g} ({b['delta_left']:.3g})",
            f"{b['points_released']} / {b['points_budget']} ({b['points_left']})",
        )
    return table


def sketch_declaration_toml(
    name: str,
    domain_low: Sequence[float] | NDArray[np.float64],
    domain_high: Sequence[float] | NDArray[np.float64],
    *,
    frequencies: int,
    sigma: float,
    epsilon: float = 1.0,
    delta: float = 1e-6,
    description: str = "",
) -> str:
    """A catalogue declaration (``curator serve --sketch-spec``) for a scenario's summarization
    features: one RFF map over the columns ``f0, f1, ...`` of the owners' tables.

    Parameters
    ----------
    name : str
        The declaration's name; the spec is ``<name>/rff``.
    domain_low, domain_high : sequence of float
        The scenario's public domain box, one bound per feature.
    frequencies : int
        ``m'``.
    sigma : float
        The kernel's length scale in the features' own units (``scale = "absolute"``): the
        scenario's public choice, the one its in-process runs use.
    epsilon, delta : float
        Every owner's sketch is the Gaussian mechanism at exactly this ``(epsilon, delta)``.
    description : str

    Returns
    -------
    str
        TOML text (:meth:`dpmarket.common.sketches.spec.SketchDeclaration.from_mapping` reads it).
    """
    columns = ",\n".join(
        f"  {{ name = {json.dumps(c)}, low = {float(lo)!r}, high = {float(hi)!r} }}"
        for c, lo, hi in zip(feature_columns(len(domain_low)), domain_low, domain_high, strict=True)
    )
    return (
        f"name = {json.dumps(name)}\n"
        f"description = {json.dumps(description)}\n"
        f"columns = [\n{columns},\n]\n\n"
        "[mechanism]\n"
        'noise = "gaussian"\n'
        f"epsilon = {float(epsilon)!r}\n"
        f"epsilon_range = [{float(epsilon)!r}, {float(epsilon)!r}]\n"
        f"delta = {float(delta)!r}\n\n"
        "[maps.rff]\n"
        f"frequencies = {int(frequencies)}\n"
        f"sigma = {float(sigma)!r}\n"
        'scale = "absolute"\n'
    )


def run_demo(
    scenario_name: str,
    out_dir: Path,
    *,
    summary_size: int | None,
    seed: int,
    in_process: bool,
    console: Console,
    wide: bool = False,
) -> dict[str, Any]:
    """Run the marketplace on a bundled scenario and compare the methods (``make demo``).

    Issues the deployment's certificates into ``out_dir/state/pki``, starts five (digits) or
    eight (flights) owner processes under the demo owner policy (``deploy/policies/
    demo-owner.toml``, fresh ledgers in ``out_dir/state``) and a curator, all over mTLS; then, as
    the consumer, requests a summary of size p by every private method and a uniform sample over
    gRPC. Non-private greedy on RFF embeddings, which the owners' policy refuses, runs in-process
    on the same data as a reference, as does the exact-kernel greedy on the pooled data. Prints
    the table (compact for 80 columns; every column with ``wide``) and every owner's remaining
    budget, and writes ``report.json`` and ``mmd.png`` into ``out_dir``.

    Returns
    -------
    dict
        The JSON report.
    """
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.consumer.report import (
        MMDCurve,
        add_relative_mmd,
        comparison_table,
        evaluate_summary,
        mmd_curve,
        plot_mmd_curves,
    )
    from dpmarket.experiments.runner import publish_sketches, simulate
    from dpmarket.experiments.scenarios import SCENARIOS, write_scenario
    from dpmarket.runtime.files import write_json

    out = Console(width=max(console.width, 170)) if wide else console
    scenario = SCENARIOS[scenario_name](seed)
    p = summary_size or scenario.default_p
    data_dir = out_dir / "data"
    paths = write_scenario(scenario, data_dir)
    owner_files = [paths[f"owner-{i}"] for i in range(len(scenario.owners))]
    owner_ids = [o.name for o in scenario.owners]
    console.print(f"[bold]{scenario.name}[/bold]: {scenario.description}")
    console.print(
        f"{len(owner_ids)} owners ({sum(o.n_points for o in scenario.owners)} points), "
        f"m = {scenario.validation.shape[0]} validation points, p = {p}, gamma = {scenario.gamma}"
    )
    configs: dict[str, SummarizationConfig] = {
        m: method_config(m, summary_size=p, gamma=scenario.gamma) for m in METHODS
    }
    # Algorithm 3 at the paper's settings (Section 4: delta~ 1e-4 on the owners), which the
    # demo's owner policy (deploy/policies/demo-owner.toml) allows one session.
    private = PrivateConfig(summary_size=p, gamma=scenario.gamma, delta_owners=PAPER_DELTA_OWNERS)
    candidates = CandidatesConfig(summary_size=p, gamma=scenario.gamma)
    configs.update(private=private, candidates=candidates)
    results: dict[str, SummaryResult] = {}
    budgets: dict[str, dict[str, Any]] = {}
    networked = [] if in_process else [m for m in METHODS if m != "greedy"]
    # Every owner publishes one private RFF sketch of its data (epsilon 1 at the candidates
    # method's delta) before any session; the candidates method's allocation reads them.
    sketched = scenario.domain_low is not None
    delta = candidates.delta
    for method, config in configs.items():
        if method in networked:
            continue
        progress, update = progress_printer(f"{method} (in-process)")
        with progress:
            results[method] = simulate(
                scenario.owners,
                scenario.validation,
                scenario.seed_set,
                config,
                seed=seed,
                on_progress=update,
                owner_sketches=(
                    publish_sketches(
                        scenario.owners, scenario.sketch_mechanism(1.0, delta=delta), seed=seed
                    )
                    if sketched and method == "candidates"
                    else None
                ),
            )
    if networked:
        state_dir = out_dir / "state"
        shutil.rmtree(state_dir, ignore_errors=True)  # a demo starts from fresh ledgers
        state_dir.mkdir(parents=True)
        spec_files = []
        if sketched:
            assert scenario.domain_low is not None and scenario.domain_high is not None
            spec_files.append(state_dir / f"{scenario.name}-sketches.toml")
            spec_files[0].write_text(
                sketch_declaration_toml(
                    scenario.name,
                    scenario.domain_low,
                    scenario.domain_high,
                    frequencies=scenario.sketch_frequencies,
                    sigma=scenario.sketch_sigma,
                    delta=delta,
                    description=f"{scenario.name}: the owners' summarization features",
                ),
                encoding="utf-8",
            )
        with LocalCluster(
            owner_files,
            owner_ids,
            out_dir / "logs",
            state_dir=state_dir,
            owner_policy=POLICIES / "demo-owner.toml",
            sketch_specs=spec_files,
            sketch_seed=seed,
            allocation_sketch_spec=f"{scenario.name}/rff" if sketched else None,
        ) as cluster:
            console.print(
                f"mTLS with certificates in {cluster.pki_dir}; curator at "
                f"{cluster.curator_target}; owners at " + ", ".join(cluster.owner_targets)
            )
            if sketched:
                cluster.publish_sketches(
                    dict(zip(owner_ids, owner_files, strict=True)),
                    out_dir / "publications",
                    seed=seed,
                )
                console.print(
                    f"every owner published its private sketch ({scenario.name}/rff, "
                    f"epsilon 1, delta {delta:g}) to the curator's catalogue"
                )
            with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
                for method in networked:
                    progress, update = progress_printer(method)
                    with progress:
                        results[method] = client.summarize(
                            configs[method],
                            scenario.validation,
                            scenario.seed_set,
                            seed=seed,
                            on_progress=update,
                        )
            budgets = owner_budgets(cluster)
    results["exact-greedy"] = exact_greedy_summary(
        scenario.owners, scenario.validation, p, scenario.gamma
    )
    results["uniform"] = _round_robin(results["uniform"])
    labels = {
        "candidates": "private (candidates, default)",
        "private": "private (Algorithm 3)",
        "rounds": "private (rounds: Gaussian, tree, exact)",
        "greedy": "greedy, RFF embeddings" + ("" if in_process else " (in-process)"),
        "uniform": "uniform sampling",
        "exact-greedy": "greedy, exact kernel (pooled)",
    }
    rows = []
    for key, result in results.items():
        evaluation = replace(
            evaluate_summary(
                result, scenario.validation, scenario.gamma, test=scenario.test, seed=seed
            ),
            method=key,
            label=labels[key],
        )
        if key == "exact-greedy":
            evaluation = replace(evaluation, owner_points_accessed=None, all_owners_bound=None)
        rows.append(evaluation)
    rows = add_relative_mmd(rows, reference="exact-greedy")
    step = max(1, p // 20)
    sizes = list(range(step, p + 1, step))
    curves = {
        labels[k]: MMDCurve(
            tuple(sizes), tuple(mmd_curve(r.points, scenario.validation, scenario.gamma, sizes))
        )
        for k, r in results.items()
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_path = out_dir / "mmd.png"
    plot_mmd_curves(
        curves,
        plot_path,
        title=f"{scenario.name}: MMD² of the first k summary points",
        reference=labels["exact-greedy"],
    )
    report = {
        "scenario": {
            "name": scenario.name,
            "description": scenario.description,
            "owners": {o.name: o.n_points for o in scenario.owners},
            "validation_points": int(scenario.validation.shape[0]),
            "test_points": scenario.test.n_points,
            "seed_set_points": int(scenario.seed_set.shape[0]),
            "gamma": scenario.gamma,
        },
        "summary_size": p,
        "seed": seed,
        "transport": (
            "in-process"
            if in_process
            else "gRPC with mTLS, separate processes (greedy, RFF: in-process reference)"
        ),
        "config": {k: v for k, v in private.to_json().items() if k != "method"},
        "methods": [row.to_json() for row in rows],
        "curves": {
            label: {"sizes": list(c.sizes), "mmd2": list(c.mmd2)} for label, c in curves.items()
        },
    }
    if budgets:  # read from the owners' own ledgers, before the report is written
        report["owner_budgets"] = budgets
    write_json(report, out_dir / "report.json")
    out.print(comparison_table(rows, title=f"{scenario.name}, p = {p}, seed = {seed}", wide=wide))
    if budgets:
        out.print(budget_table(budgets))
    ledger = results["candidates"].report.ledger
    allocation = ledger.candidates
    if isinstance(allocation, SketchAllocationReport) and ledger.owner_sketches is not None:
        sketch_eps = sorted({s.epsilon for s in ledger.owner_sketches.values()})
        out.print(
            f"candidates: the budget of {allocation.budget} candidates was split by the owners' "
            f"published sketches ({allocation.relevance_score} vote, released with Gaussian "
            f"noise sigma {allocation.allocation_sigma:.3g}): "
            + ", ".join(f"{o} {n}" for o, n in allocation.shares.items())
            + "; owners spend nothing in the session, their sketch (epsilon "
            + "/".join(f"{e:g}" for e in sketch_eps)
            + ", published once and read by every session) is on their ledgers."
        )
    out.print(
        "ε: Theorem 7 (Kairouz et al.) / PLD (dp-accounting); Algorithm 3 at the paper's settings "
        f"for delta~ = {private.delta_validation} (D_v) and "
        f"{private.delta_owners} (owners), candidates for delta = "
        f"{candidates.delta}. '% over greedy' is against the exact-kernel greedy on "
        "pooled data."
    )
    console.print(f"report -> {out_dir / 'report.json'}, plot -> {plot_path}")
    return report
