"""Owners on separate hosts over a WAN: the steps of deploy/README.md ("Owners on separate
hosts"), run on hosts made of network namespaces (:mod:`dpmarket.deploy.wan`, ``make wan-test``).

Five hosts, each a network namespace with one address, its own directory and its own
certificate: three owners, the curator and a consumer (``alice``); the CA is a directory of the
harness (an offline machine). Every link is shaped with ``tc tbf`` at 100 Mbit/s and every
connection between hosts goes through the harness's delaying relay: the 100 ms round-trip
profile. Each host's firewall admits only what the how-to opens. The consumer then runs a
summary by the default method and a CAPE mean; both equal the same jobs run in one process
(the owners allow seeded sessions, as a test must), and every byte between hosts crossed the
relay and waited its delay. Then owner-0's certificate is rotated as the how-to says, and the
curator, unchanged, talks to owner-0 under its new certificate.

Needs root (namespaces, tc, iptables): plain ``pytest`` leaves it out (marker ``wan``).
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dpmarket.common.cape.spec import CapeMeanSpec
from dpmarket.curator.cape import CapeMeanEstimate
from dpmarket.deploy.cli import main
from dpmarket.deploy.wan import PROFILES, WanTopology, wait_for_port
from dpmarket.experiments.runner import run_cape
from dpmarket.runtime.identity import Identity
from dpmarket.runtime.tables import load_table

pytestmark = [pytest.mark.integration, pytest.mark.wan]

REPO = Path(__file__).resolve().parents[2]
DPMARKET = str(Path(sys.executable).parent / "dpmarket")
OWNERS = ["owner-0", "owner-1", "owner-2"]
CURATOR, CONSUMER = "curator", "alice"
OWNER_PORT, CURATOR_PORT = 50051, 50050
PROFILE = PROFILES["rtt100"]
SUMMARY = ["-p", "20", "--seed", "0"]
MEAN = ["--feature", "distance=0:5000", "--feature", "air_time=0:720", "--seed", "4"]
MEAN_COLUMNS = (("distance", 0.0, 5000.0), ("air_time", 0.0, 720.0))
#: The firewall of deploy/README.md, step 3: loopback, replies, then each host's one service.
FIREWALL_BASE = [
    ["-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
    ["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
]


def _pki(*args: str) -> None:
    result = CliRunner().invoke(main, ["pki", *args])
    assert result.exit_code == 0, result.output


def _install_identity(issued: Path, host_dir: Path, identity: Identity) -> None:
    """Step 1: the three files a party needs, and nothing else (never ca.key)."""
    pki = host_dir / "pki"
    pki.mkdir(exist_ok=True)
    for name in ("ca.crt", f"{identity.role}-{identity.name}.crt"):
        shutil.copy2(issued / name, pki / name)
    key = f"{identity.role}-{identity.name}.key"
    shutil.copy2(issued / key, pki / key)
    (pki / key).chmod(0o600)


def _firewall(topology: WanTopology, host: str, rules: list[list[str]]) -> None:
    for rule in [*FIREWALL_BASE, *rules, ["-P", "INPUT", "DROP"]]:
        topology.run(host, ["iptables", *rule])


def _owner_argv(owner: str) -> list[str]:
    return [
        DPMARKET, "serve-owner", "--data", f"{owner}.parquet", "--table", f"{owner}-table.parquet",
        "--host", "0.0.0.0", "--port", str(OWNER_PORT), "--pki-dir", "pki", "--name", owner,
        "--policy", "owner.toml", "--data-dir", "state",
        "--allow-seeded-sessions",  # a test's reproducible run: never in production
    ]  # fmt: skip


def _served_certificate(address: str, ca: Path, cert: Path, key: Path) -> bytes:
    """The DER certificate a service presents at ``address`` to this client certificate."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=30) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


class Deployment:
    """The hosts, what the how-to put on them, and the addresses each one uses."""

    def __init__(self, topology: WanTopology, ca: Path, data: Path) -> None:
        self.topology = topology
        self.ca = ca
        self.data = data
        self.owner_routes: dict[str, str] = {}
        self.curator_route = ""
        self.owner_processes: dict[str, subprocess.Popen[bytes]] = {}

    def dir(self, host: str) -> Path:
        return self.topology.hosts[host].directory


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.fail("iproute2 (ip, tc) is needed: apt-get install iproute2")
    root = tmp_path_factory.mktemp("wan")
    try:
        topology = WanTopology([*OWNERS, CURATOR, CONSUMER], root / "hosts", PROFILE)
    except PermissionError as exc:
        pytest.fail(f"{exc}: run `make wan-test` as root")
    with topology:
        dep = Deployment(topology, root / "ca-host", root / "owners-data")
        # Step 0 (not the how-to's: each owner brings its own data): the flights scenario.
        written = CliRunner().invoke(
            main, ["scenario", "flights", "--out", str(dep.data), "--owners", "3",
                   "--max-points-per-owner", "500"],
        )  # fmt: skip
        assert written.exit_code == 0, written.output
        # Step 1: the CA (offline) issues one identity per party; each host gets its files.
        _pki("init", "--out", str(dep.ca / "ca"))
        parties = [*(Identity("owner", o) for o in OWNERS)]
        parties += [Identity("curator", CURATOR), Identity("consumer", CONSUMER)]
        for identity in parties:
            issued = dep.ca / "issued" / identity.name
            _pki("issue", "--ca-dir", str(dep.ca / "ca"), "--role", identity.role,
                 "--name", identity.name, "--out", str(issued))  # fmt: skip
            _install_identity(issued, dep.dir(identity.name), identity)
        # Step 2: each owner's data and policy on its host; the consumer's sets on its host.
        for owner in OWNERS:
            for name in (f"{owner}.parquet", f"{owner}-table.parquet"):
                shutil.copy2(dep.data / name, dep.dir(owner) / name)
            shutil.copy2(REPO / "deploy" / "policies" / "owner.toml", dep.dir(owner))
            # Its roster: the other owners' certificates (public), as the CA's operator hands
            # them out, pinned in its policy's [peers].
            policy = str(dep.dir(owner) / "owner.toml")
            others = [
                str(dep.ca / "issued" / other / f"owner-{other}.crt")
                for other in OWNERS
                if other != owner
            ]
            _pki("peers", "--policy", policy, "--out", policy, *others)
            # The consumer's default method, candidates: these owners trust their curator with
            # steered selection, as the how-to's step 2 sets it.
            text = Path(policy).read_text(encoding="utf-8")
            opted = text.replace(
                "allow_steered_selection = false", "allow_steered_selection = true"
            )
            assert opted != text
            Path(policy).write_text(opted, encoding="utf-8")
        shutil.copy2(REPO / "deploy" / "policies" / "curator.toml", dep.dir(CURATOR))
        # Each owner creates its ledger, bound to its certificate (it never starts without).
        for owner in OWNERS:
            topology.run(owner, [DPMARKET, "owner", "ledger", "init", "--data-dir", "state",
                                 "--policy", "owner.toml", "--pki-dir", "pki",
                                 "--name", owner])  # fmt: skip
        for name in ("validation.npy", "seed_set.npy"):
            shutil.copy2(dep.data / name, dep.dir(CONSUMER) / name)
        # The WAN: the curator reaches each owner's port, the consumer the curator's.
        for owner in OWNERS:
            dep.owner_routes[owner] = topology.route(CURATOR, owner, OWNER_PORT)
        dep.curator_route = topology.route(CONSUMER, CURATOR, CURATOR_PORT)
        # Step 3: firewalls. An owner admits its port from the curator only (here the address
        # the curator's connections come from: the WAN relay at the owner's gateway).
        for owner in OWNERS:
            source = topology.hosts[owner].gateway
            rule = ["-A", "INPUT", "-p", "tcp", "--dport", str(OWNER_PORT), "-s", source]
            _firewall(topology, owner, [[*rule, "-j", "ACCEPT"]])
        _firewall(topology, CURATOR, [["-A", "INPUT", "-p", "tcp", "--dport",
                                       str(CURATOR_PORT), "-j", "ACCEPT"]])  # fmt: skip
        _firewall(topology, CONSUMER, [])
        # Step 4: every owner serves and checks itself; step 5: the curator, told its owners by
        # name and address.
        for owner in OWNERS:
            dep.owner_processes[owner] = topology.spawn(owner, _owner_argv(owner), owner)
        for owner in OWNERS:
            wait_for_port(topology, owner, OWNER_PORT)
            # Each owner's host checks its service (its own certificate, over loopback).
            topology.run(owner, [DPMARKET, "health", "--target", f"127.0.0.1:{OWNER_PORT}",
                                 "--expect", f"owner:{owner}", "--pki-dir", "pki",
                                 "--name", owner])  # fmt: skip
        curator = [
            DPMARKET, "serve-curator", "--host", "0.0.0.0", "--port", str(CURATOR_PORT),
            "--pki-dir", "pki", "--name", CURATOR, "--policy", "curator.toml",
            "--data-dir", "state", "--allow-seeded-sessions",
        ]  # fmt: skip
        for owner in OWNERS:
            curator += ["--owner", f"{owner}@{dep.owner_routes[owner]}"]
        topology.spawn(CURATOR, curator, CURATOR)
        wait_for_port(topology, CURATOR, CURATOR_PORT)
        yield dep


def _cape_mean(dep: Deployment, out: str) -> dict[str, Any]:
    dep.topology.run(
        CONSUMER,
        [DPMARKET, "cape", "mean", "--curator", dep.curator_route, "--curator-name", CURATOR,
         "--pki-dir", "pki", "--name", CONSUMER, *MEAN, "--out", out],
    )  # fmt: skip
    answer: dict[str, Any] = json.loads((dep.dir(CONSUMER) / out).read_text())
    return answer


def test_every_link_is_shaped_and_every_host_reaches_only_the_relay(deployment: Deployment) -> None:
    topology = deployment.topology
    for host in topology.hosts:
        for side in topology.qdiscs(host):
            assert "tbf" in side and "rate 100Mbit" in side, side
    # An owner cannot reach another owner, nor the curator's address, directly.
    probe = [
        "python3",
        "-c",
        "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)",
    ]
    curator = topology.hosts[CURATOR]
    done = topology.run("owner-0", [*probe, curator.address, str(CURATOR_PORT)], check=False)
    assert done.returncode != 0 and "unreachable" in done.stderr.lower()


def test_a_default_summary_and_a_cape_mean_over_a_100_ms_wan_equal_their_in_process_runs(
    deployment: Deployment,
) -> None:
    dep = deployment
    consumer = dep.dir(CONSUMER)
    dep.topology.run(
        CONSUMER,
        [DPMARKET, "request", "--curator", dep.curator_route, "--curator-name", CURATOR,
         "--pki-dir", "pki", "--name", CONSUMER, "--validation", "validation.npy",
         "--seed-set", "seed_set.npy", *SUMMARY, "--out", "summary.npy",
         "--report", "report.json"],
    )  # fmt: skip
    report = json.loads((consumer / "report.json").read_text())
    assert report["config"]["method"] == "candidates"  # the default
    assert report["result"]["dropped_owners"] == []

    local_dir = dep.data / "in-process"
    owners = [arg for o in OWNERS for arg in ("--owner-data", str(dep.data / f"{o}.parquet"))]
    local = CliRunner().invoke(
        main,
        ["simulate", *owners, "--validation", str(dep.data / "validation.npy"),
         "--seed-set", str(dep.data / "seed_set.npy"), *SUMMARY,
         "--out", str(local_dir / "summary.npy"), "--report", str(local_dir / "report.json")],
    )  # fmt: skip
    assert local.exit_code == 0, local.output
    networked = np.load(consumer / "summary.npy")
    assert networked.shape == (20, 13)
    assert networked.tobytes() == np.load(local_dir / "summary.npy").tobytes()

    answer = _cape_mean(dep, "mean.json")
    assert answer["report"]["sites"] == OWNERS
    tables = [load_table(dep.data / f"{o}-table.parquet", name=o) for o in OWNERS]
    expected, _ = run_cape(tables, CapeMeanSpec(MEAN_COLUMNS, 1.0, 1e-6), seed=4)
    assert isinstance(expected, CapeMeanEstimate)
    assert list(answer["mean"].values()) == expected.mean.tolist()

    # Every byte between hosts crossed the relay and was held for the profile's one-way delay.
    stats = dep.topology.relay.stats
    assert set(stats) == {f"{CURATOR}->{o}:{OWNER_PORT}" for o in OWNERS} | {
        f"{CONSUMER}->{CURATOR}:{CURATOR_PORT}"
    }
    for name, route in stats.items():
        assert route.connections >= 1 and route.bytes_forward > 0 and route.bytes_back > 0, name
        assert route.min_hold_seconds >= PROFILE.one_way_seconds, name


def test_a_rotated_owner_certificate_is_served_and_the_curator_needs_no_change(
    deployment: Deployment,
) -> None:
    """deploy/README.md, "Rotating an owner's certificate": a new certificate of the same name
    for the same key (``--keep-key``, so the other owners' pins hold) from the CA, installed on
    the owner's host, the owner restarted; the curator keeps its command line and accepts the
    new certificate, since it checks the CA and the name, and the other owners plan with it."""
    dep = deployment
    owner = "owner-0"
    curator_pki = dep.dir(CURATOR) / "pki"
    client = (curator_pki / "ca.crt", curator_pki / "curator-curator.crt")
    client_key = curator_pki / "curator-curator.key"
    before = _served_certificate(dep.owner_routes[owner], *client, client_key)

    issued = dep.ca / "issued" / owner
    _pki("issue", "--ca-dir", str(dep.ca / "ca"), "--role", "owner", "--name", owner,
         "--out", str(issued), "--keep-key")  # fmt: skip
    _install_identity(issued, dep.dir(owner), Identity("owner", owner))
    dep.topology.stop(dep.owner_processes[owner])
    dep.owner_processes[owner] = dep.topology.spawn(owner, _owner_argv(owner), owner)
    wait_for_port(dep.topology, owner, OWNER_PORT)

    after = _served_certificate(dep.owner_routes[owner], *client, client_key)
    new_cert = (dep.dir(owner) / "pki" / f"owner-{owner}.crt").read_text()
    assert after != before
    assert after == ssl.PEM_cert_to_DER_cert(new_cert)
    answer = _cape_mean(dep, "mean-after-rotation.json")
    assert answer["report"]["sites"] == OWNERS and answer["report"]["dropped"] == {}
