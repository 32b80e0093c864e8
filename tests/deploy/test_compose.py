"""Tests of deploy/Dockerfile and deploy/docker-compose.yml without a Docker engine.

The compose file is validated and normalised by ``docker-compose config`` (the only compose command
that needs no engine) and the resolved configuration is checked: the topology of ``make demo``
(one data job, five owners, a curator, a consumer), the start-up order, that every address and port
agrees with the command lines, that every command line parses with the real CLI, and that the files
the data job writes are the files the other services read. The healthcheck one-liners are run
against a real gRPC health server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from deploy.cli import main

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
OWNERS = [f"owner-{i}" for i in range(5)]
VOLUME_TARGET = "/data"
# Options whose values are files the service reads (they must exist once the data job has run).
INPUT_OPTIONS = ("--data", "--validation", "--seed-set", "--test")
OUTPUT_OPTIONS = ("--out", "--report")


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
    return config["services"]


def _argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert command, f"service has no command: {service}"
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


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


def _port(argv: list[str]) -> int | None:
    found = _values(argv, "--port")
    return int(_value(argv, "--port")) if found else None


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    assert host and port.isdigit(), f"not a host:port address: {address!r}"
    return host, int(port)


def _published_container_ports(service: dict[str, Any]) -> list[int]:
    """Container-side ports of ``ports`` (short ``[ip:]host:container[/proto]`` or long form)."""
    result = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            result.append(int(entry["target"]))
        else:
            result.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
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


def _mounts_data_volume(service: dict[str, Any]) -> bool:
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "volume" and volume.get("target") == VOLUME_TARGET:
                return True
        else:
            parts = str(volume).split(":")
            if len(parts) >= 2 and parts[1] == VOLUME_TARGET and not parts[0].startswith("/"):
                return True
    return False


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


def _run_health_probe(argv: list[str], env: dict[str, str]) -> int:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=env
    ).returncode


def _probe_results(make_argv: Any) -> tuple[int, int, int]:
    """Exit codes of a health probe against SERVING, NOT_SERVING and a stopped server."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    target = f"127.0.0.1:{port}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        serving = _run_health_probe(make_argv(target), env)
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        not_serving = _run_health_probe(make_argv(target), env)
    finally:
        server.stop(None).wait()
    stopped = _run_health_probe(make_argv(target), env)
    return serving, not_serving, stopped


# ------------------------------------------------------------------------ compose topology
def test_services_are_the_demo_topology(config: dict[str, Any]) -> None:
    services = _services(config)
    assert set(services) == {"data", *OWNERS, "curator", "consumer"}
    assert _argv(services["data"]) == ["scenario", "digits", "--out", VOLUME_TARGET]
    for name, service in services.items():
        assert _mounts_data_volume(service), f"{name} does not mount the data volume on /data"
        build = service.get("build")
        assert build, f"{name} has no build section"
        assert Path(build["context"]).resolve() == REPO, f"{name} builds from {build['context']}"
        assert build.get("dockerfile") == "deploy/Dockerfile"
    assert "data" in config.get("volumes", {}), "the data volume must be a named volume"


def test_each_owner_serves_its_own_file(config: dict[str, Any]) -> None:
    services = _services(config)
    data_files = []
    for name in OWNERS:
        argv = _argv(services[name])
        assert argv[0] == "serve-owner"
        assert _value(argv, "--data") == f"{VOLUME_TARGET}/{name}.parquet"
        assert _value(argv, "--owner-id") == name
        data_files.append(_value(argv, "--data"))
    assert len(set(data_files)) == len(OWNERS)


def test_curator_lists_every_owner_address_exactly_once(config: dict[str, Any]) -> None:
    services = _services(config)
    argv = _argv(services["curator"])
    assert argv[0] == "serve-curator"
    expected = {f"{name}:{_port(_argv(services[name]))}" for name in OWNERS}
    counts = Counter(_values(argv, "--owner"))
    assert set(counts) == expected
    assert all(n == 1 for n in counts.values()), counts


def test_consumer_requests_a_private_summary_from_the_curator(config: dict[str, Any]) -> None:
    services = _services(config)
    argv = _argv(services["consumer"])
    assert argv[0] == "request"
    assert _value(argv, "--method") in ("candidates", "private")
    host, port = _split_address(_value(argv, "--curator"))
    assert host == "curator"
    assert port == _port(_argv(services["curator"]))
    for option in OUTPUT_OPTIONS:
        path = _value(argv, option)
        assert path.startswith(VOLUME_TARGET + "/"), f"{option} {path} is not on the volume"
    if _values(argv, "--seed"):
        # A fixed session seed is refused unless the curator allows it.
        assert "--allow-seeded-sessions" in _argv(services["curator"])


def test_start_order_uses_conditions(config: dict[str, Any]) -> None:
    services = _services(config)
    for name in OWNERS:
        assert _depends_on(services[name]) == {"data": "service_completed_successfully"}
    assert _depends_on(services["curator"]) == dict.fromkeys(OWNERS, "service_healthy")
    assert _depends_on(services["consumer"]).get("curator") == "service_healthy"
    for name, service in services.items():
        for dependency, condition in _depends_on(service).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition == "service_healthy":
                assert _healthcheck_test(services[dependency]), f"{dependency} has no healthcheck"
            if condition == "service_completed_successfully":
                assert _port(_argv(services[dependency])) is None, f"{dependency} is a server"


def test_ports_match_the_command_lines(config: dict[str, Any]) -> None:
    services = _services(config)
    servers = {name for name, s in services.items() if _port(_argv(s)) is not None}
    assert servers == {*OWNERS, "curator"}
    for name, service in services.items():
        argv = _argv(service)
        port = _port(argv)
        published = _published_container_ports(service)
        if port is None:
            assert not published, f"{name} publishes {published} but serves nothing"
            assert _healthcheck_test(service) is None, f"{name} serves nothing but has a check"
            continue
        assert port != 0, f"{name} must bind a fixed port for the others to reach it"
        assert _value(argv, "--host") == "0.0.0.0", f"{name} must listen beyond loopback"
        assert set(published) <= {port}, f"{name} publishes {published}, serves on {port}"
        test = _healthcheck_test(service)
        assert test is not None, f"{name} serves on {port} but has no healthcheck"
        assert _split_address(test[-1])[1] == port, f"{name}'s healthcheck probes {test[-1]}"
        assert _split_address(test[-1])[0] in {"127.0.0.1", "localhost"}
    # Every address in a command line names a service and the port that service binds.
    for name, service in services.items():
        argv = _argv(service)
        for address in _values(argv, "--owner") + _values(argv, "--curator"):
            host, port = _split_address(address)
            assert host in services, f"{name} refers to unknown service {host}"
            assert port == _port(_argv(services[host])), f"{name}: {address}"


# ------------------------------------------------------------------- commands vs the CLI
def test_compose_commands_are_real_subcommands_and_options(config: dict[str, Any]) -> None:
    runner = CliRunner()
    for name, service in _services(config).items():
        argv = _argv(service)
        subcommand = argv[0]
        assert subcommand in main.commands, f"{name}: dpmarket has no subcommand {subcommand}"
        result = runner.invoke(main, [subcommand, "--help"])
        assert result.exit_code == 0, result.output
        for token in argv[1:]:
            if token.startswith("-"):
                option = token.split("=", 1)[0]
                assert _option_in_help(option, result.output), (
                    f"{name}: `dpmarket {subcommand}` has no option {option}"
                )


def test_data_job_writes_every_file_the_services_read(
    config: dict[str, Any], tmp_path: Path
) -> None:
    """Run the data service's command for real, then parse every other command with the CLI."""
    services = _services(config)

    def on_tmp(argv: list[str]) -> list[str]:
        return [
            str(tmp_path) + t[len(VOLUME_TARGET) :]
            if t == VOLUME_TARGET or t.startswith(VOLUME_TARGET + "/")
            else t
            for t in argv
        ]

    result = CliRunner().invoke(main, on_tmp(_argv(services["data"])))
    assert result.exit_code == 0, result.output
    for name, service in services.items():
        if name == "data":
            continue
        argv = _argv(service)
        for option in INPUT_OPTIONS:
            for path in _values(argv, option):
                assert path.startswith(VOLUME_TARGET + "/"), f"{name}: {option} {path}"
                written = tmp_path / path[len(VOLUME_TARGET) + 1 :]
                assert written.is_file(), f"{name} reads {path}, which the data job does not write"
        # Full parse (required options, types, choices, existing files) without running it.
        command = main.commands[argv[0]]
        with command.make_context(argv[0], on_tmp(argv[1:])) as ctx:
            assert ctx.params


def test_compose_healthcheck_probes_grpc_health(config: dict[str, Any]) -> None:
    test = _healthcheck_test(_services(config)["curator"])
    assert test is not None
    assert test[:3] == ["CMD", "python", "-c"], test
    code = test[3]

    def argv(target: str) -> list[str]:
        return [sys.executable, "-c", code, target]

    serving, not_serving, stopped = _probe_results(argv)
    assert serving == 0
    assert not_serving != 0
    assert stopped != 0


# ------------------------------------------------------------------------------ Dockerfile
def test_dockerfile_entrypoint_user_and_sources() -> None:
    instructions = _dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    entrypoints = [json.loads(args) for k, args in instructions if k == "ENTRYPOINT"]
    assert entrypoints[-1] == ["dpmarket"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["dpmarket"] == "deploy.cli:main"
    # Runs as a non-root user from the last USER on.
    users = [args for k, args in instructions if k == "USER"]
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    assert keywords.index("ENTRYPOINT") > max(i for i, k in enumerate(keywords) if k == "USER")
    # `pip install .` needs pyproject, the readme and every package directory.
    copied = set()
    for keyword, args in instructions:
        if keyword == "COPY":
            sources = [a for a in shlex.split(args)[:-1] if not a.startswith("--")]
            copied.update(s.rstrip("/") for s in sources)
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {p.split("/")[0] for p in pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= copied, f"Dockerfile does not copy {sorted(needed - copied)}"
    assert any(k == "RUN" and "pip install ." in args for k, args in instructions)


def test_dockerfile_healthcheck_probes_grpc_health() -> None:
    checks = [args for k, args in _dockerfile_instructions() if k == "HEALTHCHECK"]
    assert len(checks) == 1
    command = re.split(r"\bCMD\s+", checks[0], maxsplit=1)[1]  # after --interval=... options

    def argv(target: str) -> list[str]:
        # Shell form, as Docker runs it; the target comes from the image's environment variable.
        return ["sh", "-c", f"DPMARKET_HEALTH_TARGET={target}; {command}"]

    serving, not_serving, stopped = _probe_results(argv)
    assert serving == 0
    assert not_serving != 0
    assert stopped != 0
