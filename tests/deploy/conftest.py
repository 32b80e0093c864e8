"""Fixtures of the compose tests (marker ``compose``): the image and one stack that both
tests/deploy/test_compose_stack.py and tests/deploy/test_compose_monitoring.py drive, so that
``make compose-test`` brings the stack up once for both.

The stack is the compose file with its monitoring profile (Prometheus scraping every service from
the start) and the override of test_compose_stack.py (seeded sessions allowed, a fixed sketch
seed, a short owner timeout); it is removed with its volumes before and after the session.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from tests.deploy.test_compose_stack import Stack


@pytest.fixture(scope="session")
def image() -> str:
    """The image the compose file names, built by ``make image``."""
    import subprocess

    from tests.deploy.test_compose_stack import COMPOSE_FILE

    if subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.fail("no Docker engine answers: run `make compose-test` (it starts one, as root)")
    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    name = str(raw["services"]["curator"]["image"])
    if subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode:
        pytest.fail(f"no image {name}: run `make image` (or `make compose-test`)")
    return name


@pytest.fixture(scope="session")
def stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack up to a healthy curator (pki, data, five owners) and Prometheus (the monitoring
    profile; its image built by ``MONITORING=1 make image``), removed with its volumes
    afterwards; the services' logs are kept in out/compose-test/stack.log."""
    from tests.deploy.test_compose_stack import (
        COMPOSE_FILE,
        OWNER_TIMEOUT,
        OWNERS,
        PROJECT,
        REPO,
        SKETCH_SEED,
        Stack,
        _compose_command,
    )

    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    services = raw["services"]
    override: dict[str, Any] = {"services": {}}
    for owner in OWNERS:
        override["services"][owner] = {
            "command": [*services[owner]["command"], "--allow-seeded-sessions"]
        }
    curator = [*services["curator"]["command"], "--sketch-seed", str(SKETCH_SEED)]
    curator += ["--owner-timeout", str(OWNER_TIMEOUT)]
    override["services"]["curator"] = {"command": curator}
    path = tmp_path_factory.mktemp("compose") / "seeded.override.yml"
    path.write_text(json.dumps(override, indent=2), encoding="utf-8")  # JSON is YAML
    command = [*_compose_command(), "-p", PROJECT, "-f", str(COMPOSE_FILE), "-f", str(path)]
    command += ["--profile", "monitoring"]
    stack = Stack(command, raw)
    stack("down", "-v", "--remove-orphans")
    try:
        stack("up", "-d", "--no-build", "curator", "prometheus")
        stack.wait_healthy(*OWNERS, "curator")
        # Stack.container asks the engine by compose's labels: one container per service (the
        # jobs', stopped, included), the containers docker-compose lists, checked once.
        jobs = ["pki", "data", "ledgers"]
        found = {stack.container(s) for s in [*jobs, *OWNERS, "curator", "prometheus"]}
        assert found == stack.compose_containers()
        yield stack
    finally:
        logs = stack("logs", "--no-color", "--timestamps", check=False)
        log_file = REPO / "out" / "compose-test" / "stack.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_bytes(logs.stdout + logs.stderr)
        stack("down", "-v", "--remove-orphans", check=False)
