"""deploy/docker-compose.yml run end to end on a real Docker engine (``make compose-test``).

``make compose-test`` (deploy/compose-test.sh) starts an engine when none runs, builds the images
(``MONITORING=1 make image``) and runs this module, then test_compose_monitoring.py on the same
stack; plain ``pytest`` leaves them out (marker ``compose``). The stack (``stack`` in
tests/deploy/conftest.py) is the compose file itself with its monitoring profile, and one override
file that changes only what a comparison needs: the owners take ``--allow-seeded-sessions`` (so that
a seeded request fixes their noise too), the curator draws its sketch catalogue from a fixed
``--sketch-seed`` and waits ``OWNER_TIMEOUT`` seconds, not 30, for an owner that is gone. Every step
goes through the real entry points, the ``dpmarket`` CLI in the stack's containers, as a user would
run them:

* the consumer service as composed: a private summary by the default (candidates) method;
* the consumer's ``cape mean`` and ``cape linreg`` (zero-sum noise by secure aggregation);
* each owner's ``owner publish`` (in a one-off container of that owner: its volumes, its
  certificate, its network), then the consumer's ``explore`` on the union;
* faults: an owner's container killed (SIGKILL) in the middle of a CAPE training and restarted,
  the curator killed and restarted; what each owner spent is read from its own ledger in its own
  volume with ``dpmarket owner ledger --json``, never from the curator's report.

Answers are compared, bit for bit, with the same jobs run in one process
(tests/deploy/compose_reference.py) inside the same image with no network, on the files the
owners hold (their volumes mounted read-only): the same code and numerical libraries as the
services. The image itself is inspected: non-root, and the CA bundle handed to its build stage is
in neither its filesystem nor its history. The stack is removed with its volumes (``down -v``)
before and after the test session, whatever happens.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.compose]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
REFERENCE_SCRIPT = Path(__file__).resolve().parent / "compose_reference.py"
OWNERS = [f"owner-{i}" for i in range(5)]
PROJECT = os.environ.get("COMPOSE_PROJECT_NAME", "dpmarket-compose-test")
#: The CA bundle deploy/build-image.sh hands to the build stage by default.
EXTRA_CA = os.environ.get("EXTRA_CA", "/etc/ssl/certs/ca-certificates.crt")
#: Seconds the curator waits for an owner that does not answer (compose's default is 30).
OWNER_TIMEOUT = 10
#: Seed of the catalogue's sketch parameters (public either way).
SKETCH_SEED = 5
#: Safety nets against a hang (never timing assertions).
COMMAND_TIMEOUT = 600
HEALTH_TIMEOUT = 180
#: The consumer's connection to the curator, as the compose file's consumer gives it.
CONSUMER_TLS = ["--curator", "curator:50050", "--pki-dir", "/pki", "--name", "consumer"]
#: The owners' tables: the columns of deploy/sketches/flights.toml, with its public bounds.
BOUNDS = {
    "month": (1.0, 12.0),
    "hour": (0.0, 24.0),
    "distance": (0.0, 5000.0),
    "air_time": (0.0, 720.0),
    "delayed": (0.0, 1.0),
}
EPSILON, DELTA = 1.0, 1e-6
#: The CAPE jobs compared with the in-process runs: (options of `dpmarket consumer cape ...`,
#: the job).
CAPE_JOBS: dict[str, dict[str, Any]] = {
    "mean": {
        "task": "mean",
        "features": [[c, *BOUNDS[c]] for c in BOUNDS],
        "epsilon": EPSILON,
        "delta": DELTA,
        "seed": 11,
    },
    "linreg": {
        "task": "linear",
        "features": [["distance", *BOUNDS["distance"]], ["hour", *BOUNDS["hour"]]],
        "target": ["air_time", *BOUNDS["air_time"]],
        "epsilon": EPSILON,
        "delta": DELTA,
        "seed": 12,
    },
    # After the faults: every owner again, the restarted one included.
    "mean_after_restart": {
        "task": "mean",
        "features": [[c, *BOUNDS[c]] for c in BOUNDS],
        "epsilon": EPSILON,
        "delta": DELTA,
        "seed": 13,
    },
}
SKETCH_SPEC = "flights/rff"
SKETCH_OWNER_SEEDS = {owner: 100 + k for k, owner in enumerate(OWNERS)}
EXPLORE: dict[str, Any] = {"query": "mean", "synthetic": 2000, "seed": 3}
#: The training that an owner's kill interrupts: long enough to be mid-way when the kill lands.
TRAINING = [
    *("--feature", "month=1:12", "--feature", "hour=0:24"),
    *("--feature", "distance=0:5000", "--feature", "air_time=0:720"),
    *("--target", "delayed", "--iterations", "1000", "--hidden-units", "4"),
    *("--epsilon", "1", "--delta", "1e-6", "--seed", "21", "--request-id", "training-under-fault"),
]
KILLED = "owner-2"


# ------------------------------------------------------------------------------------ helpers
def _compose_command() -> list[str]:
    """docker-compose (v1, Debian's) or the compose plugin of the docker CLI (v2)."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor `docker compose` is installed: run make compose-test")


def _docker(*args: str, input: bytes | None = None, check: bool = True) -> bytes:
    done = subprocess.run(
        ["docker", *args], input=input, capture_output=True, timeout=COMMAND_TIMEOUT
    )
    if check and done.returncode:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{done.stderr.decode()}")
    return done.stdout


def _untar(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {
            Path(m.name).name: archive.extractfile(m).read()  # type: ignore[union-attr]
            for m in archive.getmembers()
            if m.isfile()
        }


def _option(argv: Sequence[str], name: str) -> str:
    return argv[list(argv).index(name) + 1]


@dataclass
class Stack:
    """The compose project: the compose file plus the test's override, a fixed project name."""

    command: list[str]
    config: dict[str, Any]
    _last_ledgers: dict[str, list[dict[str, Any]]] | None = None

    def __call__(
        self, *args: str, check: bool = True, input: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [*self.command, *args],
            cwd=REPO,
            input=input,
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
        )
        if check and done.returncode:
            raise AssertionError(
                f"{' '.join(args[:3])} ... failed ({done.returncode}):\n"
                f"{done.stdout.decode(errors='replace')[-3000:]}\n"
                f"{done.stderr.decode(errors='replace')[-3000:]}"
            )
        return done

    def run_args(self, service: str, argv: Sequence[str]) -> list[str]:
        """``dpmarket ARGV`` in a one-off container of ``service`` (its image, volumes, networks
        and certificate; not its dependencies), in /tmp/out; prints a tar of /tmp/out."""
        script = 'mkdir -p /tmp/out && cd /tmp/out && dpmarket "$@" >&2 && tar -cf - .'
        return ["run", "--rm", "--no-deps", "-T", "--entrypoint", "sh", service, "-euc", script]

    def run(self, service: str, *argv: str) -> dict[str, bytes]:
        """Run ``dpmarket ARGV`` as ``service``; return the files it wrote (by name)."""
        done = self(*self.run_args(service, argv), "sh", *argv)
        return _untar(done.stdout)

    def popen(self, service: str, *argv: str) -> subprocess.Popen[bytes]:
        """:meth:`run` in the background."""
        return subprocess.Popen(
            [*self.command, *self.run_args(service, argv), "sh", *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def container(self, service: str) -> str:
        """The id of the service's container, running or stopped (not a one-off's), found by
        the labels compose gives it: what ``docker-compose ps -q SERVICE`` prints (the stack
        fixture checks that once), asked of the engine by the docker CLI in about 0.02 s of CPU
        where docker-compose (v1, Python) takes about 1 s. Every ledger read, health poll, kill
        and the fault test's poll for the charge look a container up."""
        out = _docker(
            "ps", "-aq", "--no-trunc",
            "--filter", f"label=com.docker.compose.project={self.project_label}",
            "--filter", f"label=com.docker.compose.service={service}",
            "--filter", "label=com.docker.compose.oneoff=False",
        )  # fmt: skip
        ids = out.decode().split()
        assert len(ids) == 1, f"{service} has {len(ids)} containers, not one: {ids}"
        return ids[0]

    def compose_containers(self) -> set[str]:
        """The ids of the project's containers as docker-compose itself lists them (``ps -q``:
        running or stopped, and any one-off run's; the stack fixture asks before any run)."""
        return set(self("ps", "-q").stdout.decode().split())

    def health(self, service: str) -> str:
        state = _docker("inspect", "--format", "{{json .State}}", self.container(service))
        status = json.loads(state)
        return str(status.get("Health", {}).get("Status") or status["Status"])

    def wait_healthy(self, *services: str) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        for service in services:
            while (status := self.health(service)) != "healthy":
                assert status not in ("exited", "dead", "unhealthy"), f"{service}: {status}"
                assert time.monotonic() < deadline, f"{service} is not healthy: {status}"
                time.sleep(1)

    def ledger(self, owner: str) -> list[dict[str, Any]]:
        """The owner's charges, from its own ledger in its own volume (the running service's
        container)."""
        out = _docker(
            "exec",
            self.container(owner),
            "dpmarket",
            "owner",
            "ledger",
            "--data-dir",
            "/state",
            "--json",
        )
        entries: list[dict[str, Any]] = json.loads(out)["entries"]
        return entries

    def charge_count(self, owner: str) -> int:
        """How many charges the owner's ledger holds, read in its container without starting
        the CLI (a trigger that must be quick; :meth:`ledger` is what assertions read)."""
        code = (
            "import sqlite3; db = sqlite3.connect('file:/state/owner.sqlite3?mode=ro', uri=True);"
            " print(db.execute('SELECT count(*) FROM charges').fetchone()[0])"
        )
        return int(_docker("exec", self.container(owner), "python", "-c", code))

    def ledgers(self) -> dict[str, list[dict[str, Any]]]:
        """Every owner's charges (read at once)."""
        with ThreadPoolExecutor(len(OWNERS)) as pool:
            return dict(zip(OWNERS, pool.map(self.ledger, OWNERS), strict=True))

    def ledgers_after(self) -> dict[str, list[dict[str, Any]]]:
        """:meth:`ledgers`, kept for the next test's :meth:`ledgers_before` (nothing acts on the
        stack between two tests)."""
        self._last_ledgers = self.ledgers()
        return self._last_ledgers

    def ledgers_before(self) -> dict[str, list[dict[str, Any]]]:
        """The ledgers as the previous test last read them, or read now (each snapshot serves
        once: a test that failed before reading them leaves none)."""
        last, self._last_ledgers = self._last_ledgers, None
        return last if last is not None else self.ledgers()

    def volume(self, name: str) -> str:
        """The engine's name of one of the project's named volumes."""
        out = _docker(
            "volume",
            "ls",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={self.project_label}",
            "--filter",
            f"label=com.docker.compose.volume={name}",
        )
        (volume,) = out.decode().split()
        return volume

    @property
    def project_label(self) -> str:
        return re.sub(r"[^-_a-z0-9]", "", PROJECT.lower())


def _new_entries(
    before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Per owner, the charges added since ``before``; the earlier ones must be unchanged."""
    new = {}
    for owner, entries in after.items():
        old = before[owner]
        assert entries[: len(old)] == old, f"{owner}'s ledger lost or changed a charge"
        new[owner] = entries[len(old) :]
    return new


def _image_label(image: str, key: str) -> str:
    labels = json.loads(_docker("image", "inspect", "--format", "{{json .Config.Labels}}", image))
    return str((labels or {}).get(key, ""))


def _pem_certificates(text: str) -> list[str]:
    """The base64 bodies of the PEM certificates in a bundle, one string each."""
    blocks = re.findall(
        r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", text, flags=re.S
    )
    return ["".join(b.split()) for b in blocks]


def _grep_image(image: str, needles: Sequence[str]) -> set[str]:
    """The needles found in the image's file system (fixed strings, one pass over every file)."""
    patterns = [arg for needle in needles for arg in ("-e", needle)]
    out = _docker(
        "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "grep", image,
        "-rhoF", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev", *patterns, "/",
        check=False,
    )  # fmt: skip
    return set(out.decode().split()) & set(needles)


def _needle(body: str) -> str:
    """A 64-character line from the middle of a certificate's PEM body (as PEM files wrap it)."""
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return lines[len(lines) // 2]


# ----------------------------------------------------------------------------------- fixtures
# `image` and `stack` are in conftest.py: one stack serves this module and the monitoring one.
@pytest.fixture(scope="module")
def reference(stack: Stack, image: str) -> dict[str, Any]:
    """Every compared job run in one process, in the image, with no network, on the owners' and
    the consumer's own files (tests/deploy/compose_reference.py)."""
    consumer = list(stack.config["services"]["consumer"]["command"])
    assert consumer[:2] == ["consumer", "request"]
    simulate = ["lab", "simulate"]
    skip_next = False
    for token in consumer[2:]:
        if skip_next:
            skip_next = False
        elif token in ("--curator", "--curator-name", "--pki-dir", "--name", "--out", "--report"):
            skip_next = True
        else:
            simulate.append(token.replace("/data/", "/consumer/"))
    for owner in OWNERS:
        simulate += ["--owner-data", f"/owners/{owner}/{owner}.parquet"]
    job = {
        "out": "/tmp/ref",
        "owners": OWNERS,
        "owner_dir": "/owners",
        "summary": {"argv": simulate},
        "cape": CAPE_JOBS,
        "sketch": {
            "declaration": "/sketches/flights.toml",
            "catalogue_seed": SKETCH_SEED,
            "spec": SKETCH_SPEC,
            "owner_seeds": SKETCH_OWNER_SEEDS,
            "policy": "/policies/owner.toml",
            "query": EXPLORE["query"],
            "synthetic": EXPLORE["synthetic"],
            "explore_seed": EXPLORE["seed"],
        },
    }
    mounts = []
    for owner in OWNERS:
        mounts += ["-v", f"{stack.volume(f'data-{owner}')}:/owners/{owner}:ro"]
    mounts += ["-v", f"{stack.volume('data-consumer')}:/consumer:ro"]
    mounts += ["-v", f"{REPO / 'deploy' / 'sketches'}:/sketches:ro"]
    mounts += ["-v", f"{REPO / 'deploy' / 'policies'}:/policies:ro"]
    mounts += ["-v", f"{REFERENCE_SCRIPT}:/reference.py:ro"]
    script = "python /reference.py >&2 && tar -C /tmp/ref -cf - reference.json"
    out = _docker(
        "run", "--rm", "-i", "--network", "none", *mounts,
        "--entrypoint", "sh", image, "-euc", script,
        input=json.dumps(job).encode(),
    )  # fmt: skip
    answer: dict[str, Any] = json.loads(_untar(out)["reference.json"])
    return answer


# -------------------------------------------------------------------------------------- image
def test_image_runs_as_non_root_and_keeps_no_build_ca(image: str) -> None:
    """The final image runs as its own user, and no certificate that only the extra CA bundle
    brought (a proxy's CA) is in its filesystem or its history; the same search finds a
    certificate the image does hold (certifi's, in the virtual environment's pip)."""
    user = _docker("image", "inspect", "--format", "{{.Config.User}}", image).decode().strip()
    assert user == "dpmarket"
    uid = _docker("run", "--rm", "--network", "none", "--entrypoint", "id", image, "-u")
    assert uid.decode().strip() == "10001"
    history = _docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).decode()
    assert "extra-ca" not in history and "pip-ca" not in history and "PIP_CERT" not in history

    base = _image_label(image, "org.opencontainers.image.base.name")
    assert base, "the image does not name its base (label org.opencontainers.image.base.name)"
    held = _docker(
        "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "sh", base, "-c",
        "cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null || true",
    ).decode()  # fmt: skip
    held += _docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
        "find /opt/dpmarket -name cacert.pem -exec cat {} +",
    ).decode()  # fmt: skip
    known = set(_pem_certificates(held))
    assert known, "no CA certificate at all in the base or the virtual environment"
    extra_path = Path(EXTRA_CA)
    extra = set(_pem_certificates(extra_path.read_text())) if extra_path.is_file() else set()
    only_extra = [_needle(b) for b in sorted(extra - known)]
    control = _needle(sorted(known & extra)[0] if known & extra else sorted(known)[0])
    found = _grep_image(image, [*only_extra, control])
    assert control in found, "the search does not find a certificate the image holds"
    leaked = found & set(only_extra)
    assert not leaked, f"{len(leaked)} certificate(s) that only {EXTRA_CA} holds are in the image"


# ------------------------------------------------------------------------------- the protocols
def test_the_composed_consumer_gets_the_in_process_summary(
    stack: Stack, reference: dict[str, Any]
) -> None:
    """The consumer service as composed (a candidates summary, seed 0) returns the summary the
    same session gives in one process; every owner's ledger gains the session's one charge."""
    before = stack.ledgers_before()
    # The service's own command; --no-deps: its dependencies are up (without it, docker-compose
    # runs the pki and data jobs again first, about 10 s, and the data the reference read is
    # generated a second time).
    stack("run", "--rm", "--no-deps", "consumer")
    command = stack.config["services"]["consumer"]["command"]
    out, report = _option(command, "--out"), _option(command, "--report")
    files = _untar(
        stack(
            "run", "--rm", "--no-deps", "-T", "--entrypoint", "tar", "consumer",
            "-C", "/data", "-cf", "-", Path(out).name, Path(report).name,
        ).stdout
    )  # fmt: skip
    summary = np.load(io.BytesIO(files[Path(out).name]))
    expected = np.asarray(reference["summary"]["points"])
    assert summary.shape == expected.shape == (int(_option(command, "-p")), 13)
    assert summary.tobytes() == expected.tobytes()
    networked = json.loads(files[Path(report).name])["result"]
    local = reference["summary"]["report"]["result"]
    for key in ("mmd2_validation", "mmd2_test", "accuracy", "owner_points_accessed"):
        assert networked[key] == local[key], key
    assert networked["dropped_owners"] == []
    # One session at every owner: its terms charged once (epsilon 1, delta 0, with the first
    # release), then the candidates it released; together at most max(p, 3 p) points.
    new = _new_entries(before, stack.ledgers_after())
    assert len({e["session"] for o in OWNERS for e in new[o]}) == 1
    for owner in OWNERS:
        assert sum(e["epsilon"] for e in new[owner]) == 1.0
        assert sum(e["delta"] for e in new[owner]) == 0.0
        assert len([e for e in new[owner] if e["epsilon"] > 0]) == 1
    assert 0 < sum(e["points"] for o in OWNERS for e in new[o]) <= 150


def _cape_argv(name: str) -> list[str]:
    job = CAPE_JOBS[name]
    command = "mean" if job["task"] == "mean" else "linreg"
    argv = ["consumer", "cape", command, *CONSUMER_TLS]
    for column, low, high in job["features"]:
        argv += ["--feature", f"{column}={low}:{high}"]
    if "target" in job:
        column, low, high = job["target"]
        argv += ["--target", f"{column}={low}:{high}"]
    argv += ["--epsilon", str(job["epsilon"]), "--delta", str(job["delta"])]
    return [*argv, "--seed", str(job["seed"]), "--request-id", name, "--out", f"{name}.json"]


@pytest.mark.parametrize("name", ["mean", "linreg"])
def test_cape_jobs_equal_the_in_process_ones_and_charge_each_owner_once(
    stack: Stack, reference: dict[str, Any], name: str
) -> None:
    before = stack.ledgers_before()
    answer = json.loads(stack.run("consumer", *_cape_argv(name))[f"{name}.json"])
    local = reference["cape"][name]
    if name == "mean":
        assert list(answer["mean"].values()) == local["mean"]
    else:
        assert list(answer["weights"].values()) == local["weights"]
        assert answer["intercept"] == local["intercept"]
    report = answer["report"]
    assert report["sites"] == OWNERS and report["dropped"] == {}
    new = _new_entries(before, stack.ledgers_after())
    for owner in OWNERS:
        (entry,) = new[owner]
        assert (entry["epsilon"], entry["delta"]) == (EPSILON, DELTA)
        assert entry["epsilon"] == local["spend"][owner]
        assert report["owner_spend"][owner]["epsilon"] == entry["epsilon"]
    assert len({new[o][0]["session"] for o in OWNERS}) == 1


def test_published_sketches_answer_an_exploration_as_in_process(
    stack: Stack, reference: dict[str, Any]
) -> None:
    """Each owner's operator publishes with ``dpmarket owner publish`` from the owner's own
    container (its table, ledger, policy and certificate); the consumer's ``explore`` on the
    union equals the in-process publication and M2M; each owner is charged once, by itself."""
    before = stack.ledgers_before()
    publications = {}
    for owner in OWNERS:  # every owner's operator at once
        command = stack.config["services"][owner]["command"]
        publications[owner] = stack.popen(
            owner, "owner", "publish", "--curator", "curator:50050",
            "--table", _option(command, "--table"), "--data-dir", _option(command, "--data-dir"),
            "--policy", _option(command, "--policy"),
            "--pki-dir", "/pki", "--name", owner,
            "--spec", SKETCH_SPEC, "--seed", str(SKETCH_OWNER_SEEDS[owner]), "--out", "p.json",
        )  # fmt: skip
    for owner, process in publications.items():
        out, err = process.communicate(timeout=COMMAND_TIMEOUT)
        assert process.returncode == 0, f"{owner}: {err.decode(errors='replace')[-3000:]}"
        (row,) = json.loads(_untar(out)["p.json"])["sketches"]
        assert row["spec"] == SKETCH_SPEC and row["charged_now"]
    answer = json.loads(
        stack.run(
            "consumer", "consumer", "explore", *CONSUMER_TLS, "--spec", SKETCH_SPEC, "--all",
            "--query", EXPLORE["query"], "--synthetic", str(EXPLORE["synthetic"]),
            "--seed", str(EXPLORE["seed"]), "--out", "explore.json",
        )["explore.json"]
    )  # fmt: skip
    local = reference["sketch"]
    assert answer["owners"] == local["owners"] == OWNERS
    assert list(answer["answer"]["values"].values()) == local["values"]
    new = _new_entries(before, stack.ledgers_after())
    for owner in OWNERS:
        (entry,) = new[owner]
        assert (entry["epsilon"], entry["delta"], entry["points"]) == (EPSILON, 0.0, 0)
        assert "sketch (RFF" in entry["mechanism"]


# ------------------------------------------------------------------------------------- faults
def test_an_owner_killed_mid_training_loses_no_charge_and_the_training_completes_without_it(
    stack: Stack,
) -> None:
    """SIGKILL to one owner's container while a CAPE training runs: the training completes over
    the others (the lost owner's last iteration is averaged with its larger noise stated); once
    restarted, the owner's ledger in its volume still holds every charge, the training's once."""
    before = stack.ledgers_before()
    training = stack.popen(
        "consumer", "consumer", "cape", "train", *CONSUMER_TLS, *TRAINING, "--out", "t.json"
    )
    try:
        # Killed as soon as it has charged the training (then about 1,000 iterations remain).
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while stack.charge_count(KILLED) == len(before[KILLED]):
            if training.poll() is not None:
                _, err = training.communicate()
                tail = err.decode(errors="replace")[-3000:]
                raise AssertionError(f"the training ended before the owner charged it: {tail}")
            assert time.monotonic() < deadline, f"{KILLED} never charged the training"
        _docker("kill", "--signal", "KILL", stack.container(KILLED))
        out, err = training.communicate(timeout=COMMAND_TIMEOUT)
    finally:
        if training.poll() is None:
            training.kill()
    assert training.returncode == 0, err.decode(errors="replace")[-3000:]
    report = json.loads(_untar(out)["t.json"])["report"]
    assert KILLED in report["lost_at_release"] or KILLED in report["dropped"], report
    assert KILLED not in report["segments"][-1]["sites"]
    assert report["segments"][0]["sites"] == OWNERS

    stack("start", KILLED)
    stack.wait_healthy(KILLED)
    new = _new_entries(before, stack.ledgers_after())
    (charge,) = new[KILLED]  # the training's charge survived the kill, and only once
    for owner in OWNERS:
        (entry,) = new[owner]
        assert entry["session"] == charge["session"]
        assert entry["epsilon"] == report["epsilon"] <= 1.0
    # The curator states what the owners that closed the job spent; the killed one's record it
    # could not get: marked so, not missing (its ledger holds the charge).
    assert set(report["owner_spend"]) == set(OWNERS)
    assert report["owner_spend"][KILLED]["unknown"] == "owner unreachable"
    for owner, spent in report["owner_spend"].items():
        if owner != KILLED:
            assert spent["epsilon"] == new[owner][0]["epsilon"] and not spent["unknown"]


def test_a_restarted_curator_returns_the_stored_answer_and_charges_nothing_twice(
    stack: Stack, reference: dict[str, Any]
) -> None:
    """The curator killed (SIGKILL) and started again: the retried training (same request id)
    returns the stored network without any owner being charged; a new job reaches every owner,
    the restarted one included, and equals its in-process run."""
    first = stack.run(
        "consumer", "consumer", "cape", "train", *CONSUMER_TLS, *TRAINING, "--out", "t.json"
    )
    before = stack.ledgers_before()
    _docker("kill", "--signal", "KILL", stack.container("curator"))
    stack("start", "curator")
    stack.wait_healthy("curator")
    again = stack.run(
        "consumer", "consumer", "cape", "train", *CONSUMER_TLS, *TRAINING, "--out", "t.json"
    )
    stored, answered = json.loads(again["t.json"]), json.loads(first["t.json"])
    # The training ran while an owner was down (training-under-fault): its cost read "not
    # settled yet" then, and is the settled statement's total once that owner answered.
    settled = stored["report"].pop("cost")
    assert answered["report"].pop("cost") in (None, settled)
    # So is that owner's record, "unknown" first (the rest is the same answer).
    records = stored["report"].pop("owner_spend")
    first_records = answered["report"].pop("owner_spend")
    assert records.keys() == first_records.keys()
    for owner, record in first_records.items():
        assert record.get("unknown") or record == records[owner], (owner, record, records)
    assert stored == answered
    assert stack.ledgers_after() == before

    answer = json.loads(
        stack.run("consumer", *_cape_argv("mean_after_restart"))["mean_after_restart.json"]
    )
    assert answer["report"]["sites"] == OWNERS
    assert list(answer["mean"].values()) == reference["cape"]["mean_after_restart"]["mean"]
    new = _new_entries(before, stack.ledgers_after())
    assert all(len(new[o]) == 1 for o in OWNERS), new


def test_the_owners_hold_their_own_data_only(stack: Stack) -> None:
    """Each owner's volume holds its points and its table, nothing of another party's."""
    for owner in OWNERS:
        listing = _docker("exec", stack.container(owner), "ls", "/data").decode()
        assert sorted(listing.split()) == sorted([f"{owner}.parquet", f"{owner}-table.parquet"])
