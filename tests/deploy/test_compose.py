"""Tests of deploy/Dockerfile and deploy/docker-compose.yml without a Docker engine (the stack
itself runs in tests/deploy/test_compose_stack.py, ``make compose-test``).

The compose file is validated and normalised by ``docker-compose config`` (the only compose command
that needs no engine) and the resolved configuration is checked: the topology of ``make demo``
(a pki job, a data job, five owners, a curator, a consumer), the networks (who can reach whom), the
volumes (only the pki job holds the CA; every other volume belongs to one service), the start-up
order, that every address, port and certificate name agrees with the command lines, that every
command line parses with the real CLI and runs with mTLS, and that the policies admit the
consumer's session. The two one-shot jobs' scripts are run for real on temporary directories
standing in for their volumes: the files they write are the files the services read, each service
receives its own identity and no CA key, and a second run of the pki job changes nothing. The
healthcheck command lines (compose's and the Dockerfile's) are run against a real mTLS server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import pytest
from click.testing import CliRunner
from cryptography import x509
from grpc_health.v1 import health_pb2

from dpmarket.common.summarization.methods import CandidatesConfig, config_from_fields
from dpmarket.common.summarization.terms import owner_terms
from dpmarket.curator.policy import load_curator_policy
from dpmarket.deploy.cli import main, resolve
from dpmarket.deploy.pki import CA_KEY, init_ca, issue
from dpmarket.owner.policy import load_owner_policy
from dpmarket.runtime.identity import Identity, identity_files, key_fingerprint
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.tables import load_point_set, load_table
from dpmarket.runtime.transport import TransportSecurity

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
POLICIES = REPO / "deploy" / "policies"
SKETCH_SPECS = REPO / "deploy" / "sketches"
OWNERS = [f"owner-{i}" for i in range(5)]
SERVERS = {*OWNERS, "curator"}
JOBS = {"pki", "data", "ledgers"}
PARTIES = {*SERVERS, "consumer"}
# The command each party's container runs, and the role its certificate must carry.
ROLE_OF: dict[tuple[str, ...], str] = {
    ("owner", "serve"): "owner",
    ("curator", "serve"): "curator",
    ("consumer", "request"): "consumer",
}
# Mount points inside the parties' containers.
DATA_TARGET, PKI_TARGET, STATE_TARGET, POLICY_TARGET = "/data", "/pki", "/state", "/etc/dpmarket"
SKETCH_TARGET = "/etc/dpmarket-sketches"
# Options whose values are files the service reads (they must exist once the data job has run).
INPUT_OPTIONS = ("--data", "--table", "--validation", "--seed-set", "--test")
OUTPUT_OPTIONS = ("--out", "--report")
TLS_FILE_OPTIONS = ("--ca", "--cert", "--key")

T = TypeVar("T")


# --------------------------------------------------------------------------- helpers
def _quiet(argv: list[str]) -> int:
    return subprocess.run(argv, capture_output=True, check=False, timeout=900).returncode


def _compose_binary() -> str:
    found = shutil.which("docker-compose")
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if found is None and is_root and os.environ.get("CI"):
        install = ["apt-get", "install", "-y", "-q", "docker-compose"]
        if _quiet(install):
            _quiet(["apt-get", "update", "-q"])
            _quiet(install)
        found = shutil.which("docker-compose")
    if found is None:
        pytest.skip(
            "docker-compose is not on PATH, so deploy/docker-compose.yml cannot be validated "
            "(Debian/Ubuntu: apt-get install docker-compose; installed automatically only as "
            "root with CI set)"
        )
    return found


def _yaml_to_data(text: str, binary: str) -> Any:
    """Parse YAML with PyYAML if the venv has it, else with the interpreter of docker-compose 1.x.

    docker-compose 1.x is a Python script that imports PyYAML itself, so its interpreter can
    always parse the YAML that it printed.
    """
    try:
        import yaml
    except ModuleNotFoundError:
        pass
    else:
        return yaml.safe_load(text)
    with open(binary, "rb") as handle:
        first_line = handle.readline()
    if not first_line.startswith(b"#!"):
        pytest.skip(f"PyYAML is not installed and {binary} is not a Python script: add pyyaml")
    interpreter = shlex.split(first_line[2:].decode().strip())
    code = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    done = subprocess.run(
        [*interpreter, "-c", code], input=text, capture_output=True, text=True, timeout=120
    )
    if done.returncode:
        pytest.skip(f"PyYAML is not installed and {interpreter} cannot parse YAML: add pyyaml")
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """``docker-compose config`` of deploy/docker-compose.yml, parsed (fails if it is invalid)."""
    binary = _compose_binary()
    base = [binary, "--file", str(COMPOSE_FILE)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )

    # Compose v2 prints JSON; v1 has no --format (it prints its usage, exit status 0).
    as_json = run("config", "--format", "json")
    if as_json.returncode == 0 and as_json.stdout.lstrip().startswith("{"):
        return json.loads(as_json.stdout)
    done = run("config")
    assert done.returncode == 0, f"docker-compose config rejected the file:\n{done.stderr}"
    return _yaml_to_data(done.stdout, binary)


def _services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stack's services, without those of optional profiles (the monitoring profile's
    Prometheus: tests/deploy/test_monitoring_files.py)."""
    return {name: s for name, s in config["services"].items() if not s.get("profiles")}


def _argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert command, f"service has no command: {service}"
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _unescape(text: str) -> str:
    """Undo compose's ``$$`` escape (``config`` may print it), as compose does for the engine."""
    return text.replace("$$", "$")


def _entrypoint(service: dict[str, Any]) -> list[str] | None:
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        return None
    if isinstance(entrypoint, str):
        entrypoint = shlex.split(entrypoint)
    return [_unescape(str(e)) for e in entrypoint]


def _values(argv: list[str], option: str) -> list[str]:
    """Every value given to ``option`` (``--opt value`` or ``--opt=value``)."""
    found = []
    for i, token in enumerate(argv):
        if token == option:
            assert i + 1 < len(argv), f"{option} has no value in {argv}"
            found.append(argv[i + 1])
        elif token.startswith(option + "="):
            found.append(token.split("=", 1)[1])
    return found


def _value(argv: list[str], option: str) -> str:
    found = _values(argv, option)
    assert len(found) == 1, f"expected {option} once in {argv}, got {found}"
    return found[0]


def _replace_value(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with the value of ``option`` (given once, as ``--opt value``) replaced."""
    out = list(argv)
    index = out.index(option)
    out[index + 1] = value
    return out


def _port(argv: list[str]) -> int | None:
    found = _values(argv, "--port")
    return int(_value(argv, "--port")) if found else None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    assert host and port.isdigit(), f"not a host:port address: {address!r}"
    return host, int(port)


def _path(argv: list[str]) -> tuple[str, ...]:
    """The ``dpmarket`` command a command line runs (its path, e.g. ``("owner", "serve")``)."""
    path, _, _ = resolve(argv)
    return path


def _identity(argv: list[str]) -> Identity:
    """The identity a party's command line runs as: its command's role and its --name."""
    return Identity(ROLE_OF[_path(argv)], _value(argv, "--name"))  # type: ignore[arg-type]


def _published_container_ports(service: dict[str, Any]) -> list[int]:
    """Container-side ports of ``ports`` (short ``[ip:]host:container[/proto]`` or long form)."""
    result = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            result.append(int(entry["target"]))
        else:
            result.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return result


def _published_host_ips(service: dict[str, Any]) -> list[str]:
    result = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            result.append(str(entry.get("host_ip", "")))
        else:
            parts = str(entry).split("/")[0].split(":")
            result.append(parts[0] if len(parts) == 3 else "")
    return result


def _healthcheck_test(service: dict[str, Any]) -> list[str] | None:
    """The healthcheck command, or None if the service has none or disables it."""
    check = service.get("healthcheck")
    if not check or check.get("disable"):
        return None
    test = check.get("test")
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not test or test[0] == "NONE":
        return None
    return [str(t) for t in test]


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency -> condition (the short list form means ``service_started``)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _networks(service: dict[str, Any]) -> set[str]:
    networks = service.get("networks") or {}
    return set(networks)


@dataclass(frozen=True)
class Mount:
    kind: str  # "volume" (named) or "bind"
    source: str
    target: str
    read_only: bool


def _mounts(service: dict[str, Any]) -> list[Mount]:
    """The service's mounts, short (``src:dst[:mode]``) or long form."""
    result = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            result.append(
                Mount(
                    str(entry.get("type", "volume")),
                    str(entry.get("source", "")),
                    str(entry["target"]),
                    bool(entry.get("read_only", False)),
                )
            )
            continue
        parts = str(entry).split(":")
        assert len(parts) in (2, 3), f"anonymous or odd mount {entry!r}"
        source, target = parts[0], parts[1]
        modes = parts[2].split(",") if len(parts) == 3 else []
        kind = "bind" if source.startswith(("/", ".", "~")) else "volume"
        result.append(Mount(kind, source, target, "ro" in modes))
    return result


def _volumes(service: dict[str, Any]) -> dict[str, Mount]:
    """Mount point -> named-volume mount."""
    return {m.target: m for m in _mounts(service) if m.kind == "volume"}


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _option_in_help(option: str, help_text: str) -> bool:
    # Whole-token match: "--seed" must not be found inside "--seed-set".
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        logical.append(current)
        current = ""
    pairs = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def _env_with_dpmarket() -> dict[str, str]:
    """The environment with this interpreter's scripts (``dpmarket``) first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


# --------------------------------------------------------------------- the one-shot jobs
@dataclass(frozen=True)
class JobRun:
    """A job's script run on temporary directories standing in for its volumes."""

    root: Path
    volume_dirs: dict[str, Path]  # named volume -> the directory that stood in for it
    outputs: list[str]  # stdout of each run


def _run_job(service: dict[str, Any], root: Path, *, times: int = 1) -> JobRun:
    """Run a job's ``sh -c`` entry point with its arguments, every container path under ``root``.

    The job's arguments that are absolute paths (its volumes' directories) are moved under
    ``root``; each volume's mount point is created first, as the engine does.
    """
    entrypoint = _entrypoint(service)
    assert entrypoint is not None and entrypoint[:3] == ["/bin/sh", "-eu", "-c"], entrypoint
    args = [str(root) + a if a.startswith("/") else a for a in _argv(service)]
    volume_dirs = {}
    for mount in _mounts(service):
        assert mount.kind == "volume", f"a job mounts only named volumes: {mount}"
        host = root / mount.target.lstrip("/")
        host.mkdir(parents=True, exist_ok=True)
        volume_dirs[mount.source] = host
    outputs = []
    for _ in range(times):
        done = subprocess.run(
            ["sh", *entrypoint[1:], *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=_env_with_dpmarket(),
        )
        assert done.returncode == 0, f"job failed:\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    return JobRun(root, volume_dirs, outputs)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def pki_run(config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> JobRun:
    """The pki job run twice (an ``up`` re-run); the second run must change nothing."""
    root = tmp_path_factory.mktemp("pki-job")
    first = _run_job(_services(config)["pki"], root)
    before = _snapshot(root)
    second = _run_job(_services(config)["pki"], root)
    assert _snapshot(root) == before, "a second run of the pki job changed the certificates"
    assert "keeping the CA" in second.outputs[0]
    return JobRun(root, first.volume_dirs, first.outputs + second.outputs)


@pytest.fixture(scope="module")
def data_run(config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> JobRun:
    return _run_job(_services(config)["data"], tmp_path_factory.mktemp("data-job"))


def _ledgers_job(config: dict[str, Any], pki_run: JobRun, root: Path) -> JobRun:
    """The ledgers job run on ``root``, its certificate volumes holding what the pki job wrote."""
    service = _services(config)["ledgers"]
    for target, mount in _volumes(service).items():
        if mount.read_only:
            shutil.copytree(pki_run.volume_dirs[mount.source], root / target.lstrip("/"))
    return _run_job(service, root)


@pytest.fixture(scope="module")
def ledgers_run(
    config: dict[str, Any], pki_run: JobRun, tmp_path_factory: pytest.TempPathFactory
) -> JobRun:
    return _ledgers_job(config, pki_run, tmp_path_factory.mktemp("ledgers-job"))


def _host_path(service: dict[str, Any], path: str, run: JobRun) -> Path | None:
    """Where a path inside ``service`` lies among the job's stand-in volumes (None: not there)."""
    for target, mount in _volumes(service).items():
        if _under(path, target) and mount.source in run.volume_dirs:
            return run.volume_dirs[mount.source] / path[len(target) :].lstrip("/")
    return None


def _parse_on_host(service: dict[str, Any], *runs: JobRun) -> dict[str, Any]:
    """Parse a party's command line with the real CLI, its container paths moved to the jobs'
    stand-in volumes (or, for the policies and sketch declarations, to deploy/): every check but
    running it."""

    def on_host(token: str) -> str:
        if not token.startswith("/"):
            return token
        if _under(token, POLICY_TARGET):
            return str(POLICIES / token[len(POLICY_TARGET) + 1 :])
        if _under(token, SKETCH_TARGET):
            return str(SKETCH_SPECS / token[len(SKETCH_TARGET) + 1 :])
        for run in runs:
            host = _host_path(service, token, run)
            if host is not None:
                return str(host)
        return token

    path, command, args = resolve(_argv(service))
    with command.make_context(path[-1], [on_host(t) for t in args]) as ctx:
        return dict(ctx.params)


# ------------------------------------------------------------------------ compose topology
def test_services_are_the_demo_topology(config: dict[str, Any]) -> None:
    services = _services(config)
    assert set(services) == {*JOBS, *PARTIES}
    declared = set(config.get("volumes", {}))
    for name, service in services.items():
        build = service.get("build")
        assert build, f"{name} has no build section"
        assert Path(build["context"]).resolve() == REPO, f"{name} builds from {build['context']}"
        assert build.get("dockerfile") == "deploy/Dockerfile"
        for mount in _mounts(service):
            if mount.kind == "volume":
                assert mount.source in declared, f"{name} mounts undeclared volume {mount.source}"
            else:
                # The only bind mounts: the policies, and the curator's sketch declarations,
                # read-only.
                bound = Path(mount.source).resolve()
                if bound == SKETCH_SPECS:
                    assert name == "curator", f"{name} binds the sketch declarations"
                    assert mount.target == SKETCH_TARGET and mount.read_only, f"{name}: {mount}"
                    continue
                assert bound == POLICIES, f"{name} binds {mount.source}"
                assert mount.target == POLICY_TARGET and mount.read_only, f"{name}: {mount}"
    for name in PARTIES:
        assert _entrypoint(services[name]) is None, f"{name} must run the image's dpmarket"
        assert ROLE_OF[_path(_argv(services[name]))] == _identity(_argv(services[name])).role


def test_networks_separate_the_owners_from_the_consumer(config: dict[str, Any]) -> None:
    services = _services(config)
    networks = config["networks"]
    assert set(networks) == {"backend", "frontend"}
    assert networks["backend"].get("internal") is True, "backend must be internal"
    # The curator's published port needs a network with a route to the host.
    assert not (networks["frontend"] or {}).get("internal")
    for name in OWNERS:
        assert _networks(services[name]) == {"backend"}, name
        assert "network_mode" not in services[name]
    assert _networks(services["curator"]) == {"backend", "frontend"}
    assert _networks(services["consumer"]) == {"frontend"}
    for name in JOBS:
        assert services[name].get("network_mode") == "none", f"{name} needs no network"
        assert not _networks(services[name])
    # Only the curator publishes a port, and only on the host's loopback.
    for name, service in services.items():
        if name != "curator":
            assert not service.get("ports"), f"{name} publishes {service['ports']}"
    assert _published_host_ips(services["curator"]) == ["127.0.0.1"]


def test_only_the_pki_job_holds_the_ca(config: dict[str, Any], pki_run: JobRun) -> None:
    services = _services(config)
    ca_dir = _argv(services["pki"])[0]
    ca_volume = _volumes(services["pki"])[ca_dir].source
    for name, service in services.items():
        if name != "pki":
            sources = {m.source for m in _mounts(service)}
            assert ca_volume not in sources, f"{name} mounts the CA volume {ca_volume}"
    # The job's run: the CA key exists in the CA volume and in no other.
    ca_host = pki_run.volume_dirs[ca_volume]
    assert (ca_host / CA_KEY).is_file()
    for volume, directory in pki_run.volume_dirs.items():
        if volume != ca_volume:
            assert not list(directory.rglob(CA_KEY)), f"{volume} holds the CA key"


def test_each_party_mounts_only_its_own_volumes(config: dict[str, Any]) -> None:
    services = _services(config)

    def exports(job: str) -> dict[str, str]:
        """Directory name under the job's export directory -> the volume mounted there."""
        export_dir = _argv(services[job])[1 if job == "pki" else 0]
        return {
            target[len(export_dir) + 1 :]: mount.source
            for target, mount in _volumes(services[job]).items()
            if _under(target, export_dir) and target != export_dir
        }

    pki_exports, data_exports = exports("pki"), exports("data")
    assert set(pki_exports) == PARTIES
    assert set(data_exports) == {*OWNERS, "consumer"}
    owners_of: Counter[str] = Counter()
    for name in PARTIES:
        volumes = _volumes(services[name])
        owners_of.update(m.source for m in volumes.values())
        expected = {PKI_TARGET: pki_exports[name]}
        if name in data_exports:
            expected[DATA_TARGET] = data_exports[name]
        if name in SERVERS:
            state = volumes.get(STATE_TARGET)
            assert state is not None, f"{name} keeps no state volume on {STATE_TARGET}"
            expected[STATE_TARGET] = state.source
        assert {t: m.source for t, m in volumes.items()} == expected, name
        assert volumes[PKI_TARGET].read_only, f"{name} mounts its certificate read-write"
        if name in SERVERS:
            assert not volumes[STATE_TARGET].read_only
        if name in OWNERS:
            assert volumes[DATA_TARGET].read_only, f"{name} mounts its data read-write"
    # No volume is shared by two parties, and no job but the ledgers job mounts a party's
    # state: it mounts each owner's (to create its ledger) and nothing of the curator's.
    assert all(n == 1 for n in owners_of.values()), owners_of
    job_sources = {m.source for job in JOBS - {"ledgers"} for m in _mounts(services[job])}
    ledger_sources = {m.source for m in _mounts(services["ledgers"]) if not m.read_only}
    for name in SERVERS:
        source = _volumes(services[name])[STATE_TARGET].source
        assert source not in job_sources
        assert (source in ledger_sources) == (name in OWNERS), name
    assert len(ledger_sources) == len(OWNERS)


def test_each_owner_serves_its_own_files(config: dict[str, Any]) -> None:
    """Its points for summarization and the same flights as a table (CAPE, sketches)."""
    services = _services(config)
    data_files = []
    for name in OWNERS:
        argv = _argv(services[name])
        assert _path(argv) == ("owner", "serve")
        assert _value(argv, "--data") == f"{DATA_TARGET}/{name}.parquet"
        assert _value(argv, "--table") == f"{DATA_TARGET}/{name}-table.parquet"
        assert _value(argv, "--owner-id") == name
        assert _identity(argv) == Identity("owner", name)
        data_files += [_value(argv, "--data"), _value(argv, "--table")]
    assert len(set(data_files)) == 2 * len(OWNERS)


def test_the_curator_serves_the_flights_sketch_catalogue(
    config: dict[str, Any], data_run: JobRun
) -> None:
    """The declaration the curator loads names columns every owner's table holds."""
    argv = _argv(_services(config)["curator"])
    (spec,) = _values(argv, "--sketch-spec")
    assert _under(spec, SKETCH_TARGET)
    declaration = tomllib.loads((SKETCH_SPECS / spec[len(SKETCH_TARGET) + 1 :]).read_text())
    columns = [c["name"] for c in declaration["columns"]]
    for name in OWNERS:
        table = _host_path(
            _services(config)[name], _value(_argv(_services(config)[name]), "--table"), data_run
        )
        assert table is not None
        assert set(columns) <= set(load_table(table).columns), name


def test_curator_lists_every_owner_and_its_certificate_name_once(config: dict[str, Any]) -> None:
    services = _services(config)
    argv = _argv(services["curator"])
    assert _path(argv) == ("curator", "serve")
    assert _identity(argv) == Identity("curator", "curator")
    counts = Counter(_values(argv, "--owner"))
    assert all(n == 1 for n in counts.values()), counts
    expected = set()
    for name in OWNERS:
        owner = _argv(services[name])
        expected.add(f"{_value(owner, '--name')}@{name}:{_port(owner)}")
    assert set(counts) == expected


def test_consumer_requests_a_private_summary_from_the_curator(config: dict[str, Any]) -> None:
    services = _services(config)
    argv = _argv(services["consumer"])
    curator = _argv(services["curator"])
    assert _path(argv) == ("consumer", "request")
    assert _value(argv, "--method") == "candidates"
    host, port = _split_address(_value(argv, "--curator"))
    assert host == "curator"
    assert port == _port(curator)
    assert _value(argv, "--curator-name") == _identity(curator).name
    assert _identity(argv) == Identity("consumer", "consumer")
    data = _volumes(services["consumer"])[DATA_TARGET]
    assert not data.read_only, "the consumer writes its summary and report to its volume"
    for option in OUTPUT_OPTIONS:
        path = _value(argv, option)
        assert _under(path, DATA_TARGET), f"{option} {path} is not on the consumer's volume"
    # A fixed session seed is refused unless the curator allows it.
    assert _value(argv, "--seed") == "0"
    assert "--allow-seeded-sessions" in curator


def test_every_party_runs_with_mtls(config: dict[str, Any]) -> None:
    services = _services(config)
    for name in PARTIES:
        argv = _argv(services[name])
        assert "--insecure" not in argv, f"{name} runs plaintext"
        assert _value(argv, "--pki-dir") == PKI_TARGET, name
        assert not any(_values(argv, o) for o in TLS_FILE_OPTIONS), f"{name}: use --pki-dir"
    # Nowhere: no command, entry point or healthcheck of any service mentions --insecure.
    assert "--insecure" not in json.dumps(config)


def test_start_order_uses_conditions(config: dict[str, Any]) -> None:
    services = _services(config)
    done = "service_completed_successfully"
    for name in OWNERS:
        assert _depends_on(services[name]) == {"pki": done, "data": done, "ledgers": done}
    assert _depends_on(services["curator"]) == {
        "pki": done,
        **dict.fromkeys(OWNERS, "service_healthy"),
    }
    assert _depends_on(services["consumer"]) == {
        "pki": done,
        "data": done,
        "curator": "service_healthy",
    }
    for name in JOBS - {"ledgers"}:
        assert not _depends_on(services[name])
    assert _depends_on(services["ledgers"]) == {"pki": done}  # it reads the certificates
    for name, service in services.items():
        for dependency, condition in _depends_on(service).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition == "service_healthy":
                assert _healthcheck_test(services[dependency]), f"{dependency} has no healthcheck"
            if condition == done:
                assert dependency in JOBS, f"{dependency} is not a one-shot job"


def test_ports_match_the_command_lines(config: dict[str, Any]) -> None:
    services = _services(config)
    servers = {name for name in PARTIES if _port(_argv(services[name])) is not None}
    assert servers == SERVERS
    for name, service in services.items():
        published = _published_container_ports(service)
        port = _port(_argv(service)) if name in PARTIES else None
        if port is None:
            assert not published, f"{name} publishes {published} but serves nothing"
            assert _healthcheck_test(service) is None, f"{name} serves nothing but has a check"
            continue
        argv = _argv(service)
        assert port != 0, f"{name} must bind a fixed port for the others to reach it"
        assert _value(argv, "--host") == "0.0.0.0", f"{name} must listen beyond loopback"
        assert set(published) <= {port}, f"{name} publishes {published}, serves on {port}"
        test = _healthcheck_test(service)
        assert test is not None, f"{name} serves on {port} but has no healthcheck"
        host, probed = _split_address(_value(test, "--target"))
        assert probed == port, f"{name}'s healthcheck probes port {probed}"
        assert host in {"127.0.0.1", "localhost"}
    # Every address in a command line names a service and the port that service binds.
    for name in PARTIES:
        argv = _argv(services[name])
        owners = [o.rpartition("@")[2] for o in _values(argv, "--owner")]
        for address in owners + _values(argv, "--curator"):
            host, port = _split_address(address)
            assert host in services, f"{name} refers to unknown service {host}"
            assert port == _port(_argv(services[host])), f"{name}: {address}"


def test_healthchecks_probe_the_service_with_its_own_identity(config: dict[str, Any]) -> None:
    services = _services(config)
    _, health, _ = resolve(["health"])
    for name in SERVERS:
        argv = _argv(services[name])
        identity = _identity(argv)
        test = _healthcheck_test(services[name])
        assert test is not None
        assert test[:3] == ["CMD", "dpmarket", "health"], f"{name}: exec form of dpmarket health"
        assert _value(test, "--expect") == str(identity), name
        assert _value(test, "--name") == identity.name, name
        assert _value(test, "--pki-dir") == _value(argv, "--pki-dir"), name
        assert "--insecure" not in test
        with health.make_context("health", test[3:]) as ctx:
            assert ctx.params["expect"] == str(identity)


# ------------------------------------------------------------------- commands vs the CLI
def test_compose_commands_are_real_subcommands_and_options(config: dict[str, Any]) -> None:
    runner = CliRunner()
    for name in PARTIES:
        argv = _argv(_services(config)[name])
        path, command, args = resolve(argv)
        assert not isinstance(command, click.Group), f"{name}: `dpmarket {argv[0]}` is a group"
        assert list(path) == argv[: len(path)], f"{name}: {argv[: len(path)]} is an old name"
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, result.output
        for token in args:
            if token.startswith("-"):
                option = token.split("=", 1)[0]
                assert _option_in_help(option, result.output), (
                    f"{name}: `dpmarket {' '.join(path)}` has no option {option}"
                )


def test_pki_job_gives_each_party_its_identity(config: dict[str, Any], pki_run: JobRun) -> None:
    services = _services(config)
    identities = [Identity.parse(a) for a in _argv(services["pki"])[2:]]
    assert sorted(map(str, identities)) == sorted(
        str(_identity(_argv(services[name]))) for name in PARTIES
    )
    for name in PARTIES:
        argv = _argv(services[name])
        identity = _identity(argv)
        pki_dir = _host_path(services[name], _value(argv, "--pki-dir"), pki_run)
        assert pki_dir is not None, f"{name}'s --pki-dir is not a volume the pki job fills"
        ca, cert, key = identity_files(pki_dir, identity)
        # An owner also gets its policy, whose [peers] pin every owner's key (its CAPE roster).
        policy = ["policy.toml"] if identity.role == "owner" else []
        assert sorted(p.name for p in pki_dir.iterdir()) == sorted(
            [ca.name, cert.name, key.name, *policy]
        )
        assert key.stat().st_mode & 0o077 == 0, f"{key} is readable by others"
        assert TransportSecurity.from_files(ca, cert, key).identity == identity
    owners = {o: _host_path(services[o], PKI_TARGET, pki_run) for o in OWNERS}
    pins = {
        o: key_fingerprint(
            x509.load_pem_x509_certificate(
                identity_files(d, Identity("owner", o))[1].read_bytes()  # type: ignore[arg-type]
            )
        )
        for o, d in owners.items()
    }
    for owner, directory in owners.items():
        assert directory is not None
        policy_path = directory / "policy.toml"
        assert load_owner_policy(policy_path).peer_pins == pins, owner
        assert _value(_argv(services[owner]), "--policy") == f"{PKI_TARGET}/policy.toml"


def test_pki_job_refuses_identities_of_another_ca(
    config: dict[str, Any], pki_run: JobRun, tmp_path: Path
) -> None:
    """A lost CA volume with the services' volumes kept: the job stops instead of starting
    services whose certificates no peer of the new CA would accept."""
    pki = _services(config)["pki"]
    root = tmp_path / "pki-job"
    shutil.copytree(pki_run.root, root)
    ca_volume = _volumes(pki)[_argv(pki)[0]].source
    shutil.rmtree(root / pki_run.volume_dirs[ca_volume].relative_to(pki_run.root))
    with pytest.raises(AssertionError, match="another CA"):
        _run_job(pki, root)


def test_ledgers_job_creates_each_owners_ledger_bound_to_its_certificate(
    config: dict[str, Any], pki_run: JobRun, ledgers_run: JobRun
) -> None:
    """Each owner starts on the ledger the job created in its own state volume; a second run
    keeps them; a volume that lost its ledger stops the job rather than start one anew."""
    from dpmarket.owner.ledger_admin import verify_file
    from dpmarket.owner.ledger_chain import LedgerOwner

    services = _services(config)
    for name in OWNERS:
        argv = _argv(services[name])
        state = _host_path(services[name], _value(argv, "--data-dir"), ledgers_run)
        assert state is not None, f"{name}'s --data-dir is not a volume the ledgers job fills"
        pki = _host_path(services[name], _value(argv, "--pki-dir"), pki_run)
        assert pki is not None
        security = TransportSecurity.from_files(*identity_files(pki, _identity(argv)))
        found = verify_file(
            state / "owner.sqlite3", owner=LedgerOwner.from_security(name, security)
        )
        assert found.ok and found.identity is not None and found.identity.owner == name
    # A second run (an `up` again) keeps every ledger.
    before = _snapshot(ledgers_run.root)
    again = _run_job(services["ledgers"], ledgers_run.root)
    assert _snapshot(ledgers_run.root) == before
    assert again.outputs[0].count("keeping the ledger") == len(OWNERS)


def test_ledgers_job_refuses_a_volume_that_lost_its_ledger(
    config: dict[str, Any], ledgers_run: JobRun, tmp_path: Path
) -> None:
    root = tmp_path / "ledgers-job"
    shutil.copytree(ledgers_run.root, root)
    state = _volumes(_services(config)["owner-2"])[STATE_TARGET].source
    lost = root / ledgers_run.volume_dirs[state].relative_to(ledgers_run.root)
    (lost / "owner.sqlite3").unlink()
    (lost / "policy.toml").write_text("", encoding="utf-8")  # what else the owner kept there
    with pytest.raises(AssertionError, match="restore owner-2's ledger from its backup"):
        _run_job(_services(config)["ledgers"], root)
    assert not (lost / "owner.sqlite3").exists()


def test_data_job_writes_every_file_the_services_read(
    config: dict[str, Any], data_run: JobRun, pki_run: JobRun
) -> None:
    """Each party's volume holds its own files only; every command line parses on them."""
    services = _services(config)
    for name in PARTIES:
        service = services[name]
        argv = _argv(service)
        read = set()
        for option in INPUT_OPTIONS:
            for path in _values(argv, option):
                host = _host_path(service, path, data_run)
                assert host is not None, f"{name}: {option} {path} is not on a data volume"
                assert host.is_file(), f"{name} reads {path}, which the data job does not write"
                read.add(host)
        data = _host_path(service, DATA_TARGET, data_run)
        if data is not None:
            assert set(data.iterdir()) == read, f"{name}'s volume holds files it does not read"

        # Full parse (required options, types, choices, existing files) without running it.
        assert _parse_on_host(service, data_run, pki_run)
    owned = [data_run.volume_dirs[m.source] for m in _mounts(services["data"])]
    assert sum(len(list(d.iterdir())) for d in owned) == 2 * len(OWNERS) + 3


def test_policies_admit_the_consumers_session(
    config: dict[str, Any], data_run: JobRun, pki_run: JobRun
) -> None:
    """The owners' and curator's policy files accept the consumer's candidates session: the
    production defaults, and the owners' opt-in to steered selection (the candidates method)."""
    services = _services(config)
    params = _parse_on_host(services["consumer"], data_run, pki_run)
    session = config_from_fields(params["method"], params)
    assert isinstance(session, CandidatesConfig)
    validation = load_point_set(params["validation_path"])
    seed_set = load_point_set(params["seed_set_path"])
    terms = owner_terms(
        session,
        len(OWNERS),
        validation_size=validation.n_points,
        seed_set_size=seed_set.n_points,
    )
    assert (terms.epsilon, terms.delta) == (1.0, 0.0)
    # The candidates method reads at most max(p, candidate_multiple * p) owner points.
    assert session.candidate_fraction == 0
    points = math.floor(max(1.0, session.candidate_multiple) * session.summary_size)

    def policy_file(argv: list[str]) -> Path:
        path = _value(argv, "--policy")
        assert _under(path, POLICY_TARGET), path
        return POLICIES / path[len(POLICY_TARGET) + 1 :]

    curator_argv = _argv(services["curator"])
    for name in OWNERS:
        # The production defaults, with the pki job's [peers].
        owner_policy = _host_path(
            services[name], _value(_argv(services[name]), "--policy"), pki_run
        )
        assert owner_policy is not None
        policy = load_owner_policy(owner_policy)
        # The stack's operator runs its curator: its owners serve the candidates method.
        assert policy.allow_steered_selection
        production = load_owner_policy(POLICIES / "owner.toml")
        assert dataclasses.replace(policy, peers=(), allow_steered_selection=False) == production
        assert terms.epsilon <= policy.epsilon_per_session <= policy.epsilon_total
        assert terms.delta <= policy.delta_per_session <= policy.delta_total
        assert points <= policy.points_per_session <= policy.points_total
        assert _identity(curator_argv).name in policy.curators
    curator = load_curator_policy(policy_file(curator_argv))
    curator.check_request(session, validation.n_points)
    curator.check_terms(terms)
    assert session.method in curator.methods
    assert not curator.consumers or "consumer" in curator.consumers


# ------------------------------------------------------------- healthchecks, real mTLS server
class _LoopThread:
    """An asyncio loop in a background thread, for a grpc.aio server beside blocking probes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        self.loop.close()


@dataclass
class _Served:
    port: int
    pki_dir: Path
    set_status: Callable[[int], None]
    stop: Callable[[], None]


@contextlib.contextmanager
def _mtls_server(tmp_path: Path, identity: Identity) -> Iterator[_Served]:
    """A real grpc.aio server (health, reflection, a trivial service) with ``identity``'s
    certificate, issued by a fresh CA into ``tmp_path/pki`` as the pki job lays it out."""
    ca_dir, pki_dir = tmp_path / "ca", tmp_path / "pki"
    init_ca(ca_dir)
    issue(ca_dir, identity.role, identity.name, out_dir=pki_dir)
    security = TransportSecurity.from_files(*identity_files(pki_dir, identity))
    loop = _LoopThread()
    server, port, health_servicer = loop.run(
        start_server(lambda server: None, "dpmarket.v1.TrivialService", "127.0.0.1:0", security)
    )
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            loop.run(server.stop(None))
            stopped = True

    try:
        yield _Served(
            port,
            pki_dir,
            lambda status: loop.run(health_servicer.set("", status)),
            stop,
        )
    finally:
        stop()
        loop.close()


@pytest.mark.parametrize("name", ["owner-0", "curator"])
def test_compose_healthcheck_runs_against_a_real_mtls_server(
    config: dict[str, Any], tmp_path: Path, name: str
) -> None:
    """The exact healthcheck command line, with only its port and --pki-dir moved to the test's."""
    service = _services(config)[name]
    test = _healthcheck_test(service)
    assert test is not None and test[:2] == ["CMD", "dpmarket"]
    identity = _identity(_argv(service))
    runner = CliRunner()
    with _mtls_server(tmp_path, identity) as served:

        def probe(expect: str | None = None) -> Any:
            argv = _replace_value(test[2:], "--target", f"127.0.0.1:{served.port}")
            argv = _replace_value(argv, "--pki-dir", str(served.pki_dir))
            if expect is not None:
                argv = _replace_value(argv, "--expect", expect)
            return runner.invoke(main, argv)

        serving = probe()
        assert serving.exit_code == 0, serving.output
        # Another identity of the same role: the server's certificate does not match.
        other = probe(f"{identity.role}:{identity.name}-other")
        assert other.exit_code != 0, other.output
        assert f"is {identity}, not {identity.role}:{identity.name}-other" in other.output
        served.set_status(health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe().exit_code != 0
        served.stop()
        assert probe().exit_code != 0


def test_dockerfile_healthcheck_runs_against_a_real_mtls_server(tmp_path: Path) -> None:
    checks = [args for k, args in _dockerfile_instructions() if k == "HEALTHCHECK"]
    assert len(checks) == 1
    command = re.split(r"\bCMD\s+", checks[0], maxsplit=1)[1]  # after --interval=... options
    assert command.startswith("dpmarket health "), command
    env_lines = " ".join(args for k, args in _dockerfile_instructions() if k == "ENV")
    assert f"DPMARKET_PKI_DIR={PKI_TARGET}" in env_lines, "the image's default pki directory"
    identity = Identity("owner", "owner-0")

    def probe(served: _Served, **env: str) -> subprocess.CompletedProcess[str]:
        # Shell form, as Docker runs it; the environment has only what the test gives.
        full = {k: v for k, v in _env_with_dpmarket().items() if not k.startswith("DPMARKET_")}
        full |= {
            "DPMARKET_HEALTH_TARGET": f"127.0.0.1:{served.port}",
            "DPMARKET_PKI_DIR": str(served.pki_dir),
            **env,
        }
        return subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=60, env=full
        )

    with _mtls_server(tmp_path, identity) as served:
        serving = probe(served, DPMARKET_HEALTH_EXPECT=str(identity))
        assert serving.returncode == 0, serving.stderr
        unset = probe(served)
        assert unset.returncode != 0
        assert "DPMARKET_HEALTH_EXPECT" in unset.stderr


# ------------------------------------------------------------------------------ Dockerfile
def _stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each from its FROM on."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in instructions:
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, args))
    return stages


def test_dockerfile_entrypoint_user_and_sources() -> None:
    instructions = _dockerfile_instructions()
    # The base is a build argument, a public Python image by default, for every stage.
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    stages = _stages(instructions)
    assert len(stages) == 3
    assert [shlex.split(stage[0][1])[0] for stage in stages] == ["${BASE_IMAGE}"] * 3
    requirements, build, final = stages
    assert shlex.split(requirements[0][1])[1:] == ["AS", "requirements"]
    assert shlex.split(build[0][1])[1:] == ["AS", "build"]
    keywords = [k for k, _ in final]
    entrypoints = [json.loads(args) for k, args in final if k == "ENTRYPOINT"]
    assert entrypoints[-1] == ["dpmarket"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["dpmarket"] == "dpmarket.deploy.entry:main"
    # The final stage runs as a non-root user from the last USER on.
    users = [args for k, args in final if k == "USER"]
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    assert keywords.index("ENTRYPOINT") > max(i for i, k in enumerate(keywords) if k == "USER")
    # Nothing of the build context reaches the final stage (sources, the optional CA bundle):
    # it copies the build stage's virtual environment only.
    copies = [shlex.split(args) for k, args in final if k in ("COPY", "ADD")]
    assert copies == [["--from=build", "/opt/dpmarket", "/opt/dpmarket"]], copies
    assert "extra-ca" not in json.dumps(final) and "PIP_CERT" not in json.dumps(final)

    # The build stage: `pip install .` needs pyproject, the readme and every package directory;
    # the CA bundle is optional (a glob beside a file that always exists), copied with the
    # dependency list by the requirements stage, which the build stage copies from.
    def sources(stage: list[tuple[str, str]]) -> set[str]:
        copied: set[str] = set()
        for keyword, args in stage:
            if keyword == "COPY":
                found = [a for a in shlex.split(args)[:-1] if not a.startswith("--")]
                copied.update(s.rstrip("/") for s in found)
        return copied

    copied = sources(build)
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {p.split("/")[0] for p in pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= copied, f"Dockerfile does not copy {sorted(needed - copied)}"
    assert "build/image/extra-ca.pe[m]" in sources(requirements)
    assert ["--from=requirements", "/build/", "/build/"] in [
        shlex.split(args) for k, args in build if k == "COPY"
    ]
    assert any(k == "RUN" and re.search(r"pip install .*--no-deps \.", a) for k, a in build)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "!build/image/extra-ca.pem" in ignored and ".venv*" in ignored


def _docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether the engine leaves ``path`` (relative to the build context, ``/``-separated) out
    of the context, by .dockerignore's rules: the last pattern matching the path or one of its
    parent directories decides, ``!`` re-includes, ``*`` and ``?`` stop at ``/``, ``**``
    spans directories (Docker's documentation, ".dockerignore file")."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, k = "", 0
        while k < len(pattern):
            if pattern.startswith("**/", k):
                out, k = out + "(?:.*/)?", k + 3
            elif pattern.startswith("**", k):
                out, k = out + ".*", k + 2
            elif pattern[k] == "*":
                out, k = out + "[^/]*", k + 1
            elif pattern[k] == "?":
                out, k = out + "[^/]", k + 1
            else:
                out, k = out + re.escape(pattern[k]), k + 1
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    ignored = False
    for line in patterns:
        negated = line.startswith("!")
        matcher = regex(line.lstrip("!").strip("/"))
        if any(matcher.fullmatch(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def test_the_build_context_leaves_out_what_an_editable_install_writes() -> None:
    """``make venv`` (``pip install -e .``) writes the package's egg-info into its source folder,
    protos/ (pyproject.toml's ``package-dir``), not at the top: a context holding it differs
    before and after the install, so .ci/run's early image build (made while ``make venv``
    runs) and compose-test's build after it differed from ``COPY protos/`` on, and
    compose-test's "cached" build reinstalled the package and copied the whole virtual
    environment into the final image again (about 100 s of CI's wall time; 293 s under load in
    a dry run). Control: the old .dockerignore's top-level ``*.egg-info`` left
    protos/dpmarket.egg-info in the context (this test failed)."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    # The matcher reads the file's other rules as the engine does.
    assert _docker_ignored(".venv/bin/python", patterns)
    assert _docker_ignored("common/sketches/__pycache__/marginals.cpython-311.pyc", patterns)
    assert _docker_ignored("build/image/other.pem", patterns)
    assert not _docker_ignored("build/image/extra-ca.pem", patterns)
    assert not _docker_ignored("protos/dpmarket/__init__.py", patterns)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    name = pyproject["project"]["name"]
    written = {
        f"{folder}/{name}.egg-info/PKG-INFO".lstrip("/")
        for folder in pyproject["tool"]["setuptools"]["package-dir"].values()
    }
    written |= {
        f"{p.relative_to(REPO).as_posix()}/PKG-INFO"
        for p in REPO.glob("**/*.egg-info")
        if not p.relative_to(REPO).parts[0].startswith(".venv")
    }
    kept = sorted(p for p in written if not _docker_ignored(p, patterns))
    assert not kept, f".dockerignore keeps an editable install's files in the context: {kept}"


def test_image_creates_every_volume_mount_point_for_its_user(config: dict[str, Any]) -> None:
    """A named volume starts with its mount point's owner; a missing one would be root's."""
    instructions = _dockerfile_instructions()
    user = [args for k, args in instructions if k == "USER"][-1].split(":")[0]
    created: set[str] = set()
    for keyword, args in instructions:
        if keyword != "RUN":
            continue
        for step in args.split("&&"):
            words = shlex.split(step)
            if words[:2] == ["install", "-d"]:
                assert _value(words, "-o") == user, f"mount points owned by {words}"
                created |= {w for w in words if w.startswith("/")}
    targets = {
        mount.target
        for service in _services(config).values()
        for mount in _mounts(service)
        if mount.kind == "volume"
    }
    assert targets <= created, f"the image does not create {sorted(targets - created)}"


# ------------------------------------------------------- deploy/README.md's host consumer
def _readme_block(heading: str) -> str:
    """The first ``sh`` block under ``heading`` in deploy/README.md, its lines joined."""
    text = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None, f"no sh block under {heading}"
    return block.group(1).replace("\\\n", " ")


def test_the_readme_consumer_on_the_host_asks_with_the_stacks_own_data(
    config: dict[str, Any], data_run: JobRun
) -> None:
    """Its validation and seed sets are the consumer's files of the flights scenario (not
    another scenario's points, which the owners would not match), and it asks what the
    `consumer` service asks, of the curator's published port."""
    services = _services(config)
    block = _readme_block("### A consumer on the host")
    request = next(
        shlex.split(line) for line in block.splitlines() if "dpmarket consumer request" in line
    )
    path, command, args = resolve(request[1:])
    assert path == ("consumer", "request")
    # The files it reads come out of the consumer's data volume, as the data job wrote them.
    copied = re.search(r"tar -C /data -cf - ([^']+)' \| tar -C (\S+) -xf -", block)
    assert copied is not None, block
    names, host_dir = copied.group(1).split(), copied.group(2)
    consumer_volume = data_run.volume_dirs[_volumes(services["consumer"])[DATA_TARGET].source]
    for option in ("--validation", "--seed-set"):
        file = Path(_value(args, option))
        assert str(file.parent) == host_dir and file.name in names, option
        assert (consumer_volume / file.name).is_file(), option
    owner_volume = data_run.volume_dirs[_volumes(services["owner-0"])[DATA_TARGET].source]
    owner_points = load_point_set(owner_volume / "owner-0.parquet").features
    validation = load_point_set(consumer_volume / "validation.npy").features
    assert validation.shape[1] == owner_points.shape[1]
    # The request parses, and asks what the consumer service asks.
    consumer = _argv(services["consumer"])
    for option in ("-p", "--gamma", "--method", "--curator-name"):
        assert _value(args, option) == _value(consumer, option), option
    curator_port = _port(_argv(services["curator"]))
    assert _value(args, "--curator") == f"127.0.0.1:{curator_port}"
    assert curator_port in _published_container_ports(services["curator"])
    on_host = [
        str(consumer_volume / Path(a).name) if a.startswith(f"{host_dir}/") else a for a in args
    ]
    with command.make_context(path[-1], on_host) as ctx:
        assert ctx.params["method"] == "candidates"
