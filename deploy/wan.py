"""Parties on separate hosts over a WAN, on one Linux machine: a test and benchmark topology.

Each party (an owner, the curator, a consumer) is a **host**: its own network namespace with one
address, reached only through its one link to the harness, and its own directory (files,
certificates, state). Between hosts, the harness plays the WAN:

* **bandwidth**: every link is shaped with ``tc tbf`` in both directions (the host's upload on its
  side of the veth pair, its download on the harness's side), at the profile's rate;
* **delay**: the kernel has no ``netem``, so a host reaches another only through a
  :class:`DelayRelay` in the harness, a TCP relay that holds every chunk of bytes for the
  profile's one-way delay in each direction before passing it on (order kept, nothing limited
  but by the links). A connection's data thus sees the profile's round-trip time; the TCP
  handshake with the relay does not (it is local to each link).

A host has no route but its link's subnet, so it reaches nothing but the relay's listeners at
its own gateway address: ``10.N.<host index>.1:<port>``, one per route the harness opened
(:meth:`WanTopology.route`). Profiles: :data:`PROFILES` (LAN: no delay; 20 and 100 ms round
trips; all at 100 Mbit/s). Needs root and iproute2 (``ip``, ``tc``); everything made here (name
spaces, links, qdiscs) is removed on exit.

The steps a real deployment runs on its hosts (certificates, firewall, services) are in
``deploy/README.md`` ("Owners on separate hosts"); ``tests/deploy/test_wan.py`` runs them here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "PROFILES",
    "DelayRelay",
    "Host",
    "RouteStats",
    "WanProfile",
    "WanTopology",
    "wait_for_port",
]

#: Bytes a relay reads at once.
_CHUNK = 65536
#: tc tbf: bucket size and the longest a packet may wait in the queue.
_TBF_BURST = "64kb"
_TBF_LATENCY = "200ms"


@dataclass(frozen=True)
class WanProfile:
    """The network between any two hosts.

    Attributes
    ----------
    name : str
    rtt_ms : float
        Round-trip time the relay adds between two hosts, milliseconds (half each way).
    rate_mbit : float
        Every host's link rate, each direction, Mbit/s.
    """

    name: str
    rtt_ms: float
    rate_mbit: float

    @property
    def one_way_seconds(self) -> float:
        """The relay's delay in each direction, seconds."""
        return self.rtt_ms / 2000.0


#: LAN (no added delay), 20 ms and 100 ms round trips, all at 100 Mbit/s.
PROFILES: dict[str, WanProfile] = {
    p.name: p
    for p in (
        WanProfile("lan", 0.0, 100.0),
        WanProfile("rtt20", 20.0, 100.0),
        WanProfile("rtt100", 100.0, 100.0),
    )
}


@dataclass
class RouteStats:
    """What crossed one route of the relay.

    Attributes
    ----------
    connections : int
    bytes_forward, bytes_back : int
        Bytes towards the route's target, and back.
    min_hold_seconds : float
        The shortest time a chunk was held before being passed on (``inf`` before any).
    """

    connections: int = 0
    bytes_forward: int = 0
    bytes_back: int = 0
    min_hold_seconds: float = float("inf")


class DelayRelay:
    """TCP relays that delay every chunk by a fixed one-way time, in a background event loop.

    Parameters
    ----------
    one_way_seconds : float
        Initial delay in each direction (>= 0); :attr:`one_way_seconds` may be changed at any
        time and applies to chunks read from then on.
    """

    def __init__(self, one_way_seconds: float = 0.0) -> None:
        if not one_way_seconds >= 0:
            raise ValueError(f"one_way_seconds must be >= 0, got {one_way_seconds}")
        self.one_way_seconds = one_way_seconds
        self.stats: dict[str, RouteStats] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread.start()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def add(self, name: str, listen: tuple[str, int], target: tuple[str, int]) -> int:
        """Relay connections to ``listen`` to ``target``; return the port bound (``listen[1]``
        may be 0). ``name`` keys :attr:`stats`."""
        stats = self.stats.setdefault(name, RouteStats())

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._handlers.add(task)
            self._writers.add(writer)
            try:
                try:
                    up_reader, up_writer = await asyncio.open_connection(*target)
                except OSError:
                    return
                self._writers.add(up_writer)
                stats.connections += 1
                await asyncio.gather(
                    self._pipe(reader, up_writer, stats, forward=True),
                    self._pipe(up_reader, writer, stats, forward=False),
                )
                up_writer.close()
                self._writers.discard(up_writer)
            finally:
                writer.close()
                self._writers.discard(writer)
                self._handlers.discard(task)

        async def start() -> int:
            server = await asyncio.start_server(handle, *listen)
            self._servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        port: int = self._run(start())
        return port

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stats: RouteStats,
        *,
        forward: bool,
    ) -> None:
        """Copy ``reader`` to ``writer``, each chunk held until its read time plus the delay;
        the end of ``reader`` is passed on, delayed too, as a half close."""
        line: asyncio.Queue[tuple[float, float, bytes]] = asyncio.Queue()

        async def read() -> None:
            try:
                while data := await reader.read(_CHUNK):
                    now = self._loop.time()
                    line.put_nowait((now, now + self.one_way_seconds, data))
            except (ConnectionError, OSError):
                pass
            now = self._loop.time()
            line.put_nowait((now, now + self.one_way_seconds, b""))

        async def write() -> None:
            try:
                while True:
                    read_at, due, data = await line.get()
                    await asyncio.sleep(max(0.0, due - self._loop.time()))
                    if not data:
                        if writer.can_write_eof():
                            writer.write_eof()
                        return
                    stats.min_hold_seconds = min(
                        stats.min_hold_seconds, self._loop.time() - read_at
                    )
                    if forward:
                        stats.bytes_forward += len(data)
                    else:
                        stats.bytes_back += len(data)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                writer.transport.abort()

        await asyncio.gather(read(), write())

    def close(self) -> None:
        """Stop listening, drop open connections and stop the loop."""

        async def stop() -> None:
            for server in self._servers:
                server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            if self._handlers:
                _, pending = await asyncio.wait(list(self._handlers), timeout=10)
                for task in pending:
                    task.cancel()
            for server in self._servers:
                await server.wait_closed()

        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@dataclass
class Host:
    """One party's machine: a network namespace, its address and its directory.

    Attributes
    ----------
    name : str
    index : int
        Its link's number: the host is ``10.N.<index>.2``, its gateway ``10.N.<index>.1``.
    namespace : str
    address : str
    gateway : str
        The harness's end of the link, where the relay's routes for this host listen.
    directory : Path
    processes : list of Popen
        What :meth:`WanTopology.spawn` started on this host.
    """

    name: str
    index: int
    namespace: str
    address: str
    gateway: str
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=60)


def _free_second_octet() -> int:
    """A second octet N such that no address of this machine lies in 10.N.0.0/16."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    used = {int(w.split(".")[1]) for w in out.split() if w.startswith("10.") and "/" in w}
    for octet in range(200, 250):
        if octet not in used:
            return octet
    raise RuntimeError("no free 10.N.0.0/16 subnet in 10.200-10.249")


class WanTopology:
    """Hosts in network namespaces joined by shaped links and a delaying relay.

    Parameters
    ----------
    names : sequence of str
        One host per name (e.g. ``"curator"``, ``"owner-0"``, ``"alice"``).
    root : path
        Each host's directory is ``root / name`` (created).
    profile : WanProfile
        The initial profile (:meth:`set_profile` changes it).

    Raises
    ------
    PermissionError
        If not run as root.
    FileNotFoundError
        If ``ip`` or ``tc`` is missing.
    """

    def __init__(self, names: Sequence[str], root: str | os.PathLike[str], profile: WanProfile):
        if os.geteuid() != 0:
            raise PermissionError("a WAN topology needs root (network namespaces, tc)")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise FileNotFoundError(f"{tool} (iproute2) is not installed")
        if len(set(names)) != len(names):
            raise ValueError(f"host names repeat: {list(names)}")
        self.root = Path(root)
        self.profile = profile
        self.relay = DelayRelay(profile.one_way_seconds)
        self._tag = f"{os.getpid() % 100000}"
        self._octet = _free_second_octet()
        self.hosts: dict[str, Host] = {}
        try:
            for index, name in enumerate(names, start=1):
                self.hosts[name] = self._add_host(name, index)
        except BaseException:
            self.close()
            raise

    def _links(self, index: int) -> tuple[str, str]:
        """Interface names (at most 15 characters): the host's end and the harness's end."""
        return f"dw{self._tag}h{index}", f"dw{self._tag}w{index}"

    def _add_host(self, name: str, index: int) -> Host:
        namespace = f"dpm-wan-{self._tag}-{index}"
        inside, outside = self._links(index)
        gateway = f"10.{self._octet}.{index}.1"
        address = f"10.{self._octet}.{index}.2"
        _ip("netns", "add", namespace)
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        _ip("link", "set", inside, "netns", namespace)
        _ip("addr", "add", f"{gateway}/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        host = Host(name, index, namespace, address, gateway, directory)
        self._shape(host)
        return host

    def _shape(self, host: Host) -> None:
        """tc tbf at the profile's rate on both ends of the host's link."""
        inside, outside = self._links(host.index)
        rate = f"{self.profile.rate_mbit}mbit"
        tbf = ["root", "tbf", "rate", rate, "burst", _TBF_BURST, "latency", _TBF_LATENCY]
        for prefix, device in ((["ip", "netns", "exec", host.namespace], inside), ([], outside)):
            subprocess.run(
                [*prefix, "tc", "qdisc", "replace", "dev", device, *tbf],
                check=True,
                capture_output=True,
                timeout=60,
            )

    def qdiscs(self, host: str) -> tuple[str, str]:
        """``tc qdisc show`` of the host's end and of the harness's end of its link."""
        h = self.hosts[host]
        inside, outside = self._links(h.index)
        show = ["tc", "qdisc", "show", "dev"]
        ns = ["ip", "netns", "exec", h.namespace]
        return (
            subprocess.run([*ns, *show, inside], capture_output=True, text=True).stdout,
            subprocess.run([*show, outside], capture_output=True, text=True).stdout,
        )

    def set_profile(self, profile: WanProfile) -> None:
        """Change every link's rate and the relay's delay (for connections' later bytes)."""
        self.profile = profile
        self.relay.one_way_seconds = profile.one_way_seconds
        for host in self.hosts.values():
            self._shape(host)

    def route(self, source: str, target: str, port: int) -> str:
        """Let ``source`` reach ``target``'s ``port`` over the WAN; return the address
        (``HOST:PORT``) ``source`` connects to: the relay, at ``source``'s gateway."""
        src, dst = self.hosts[source], self.hosts[target]
        bound = self.relay.add(f"{source}->{target}:{port}", (src.gateway, 0), (dst.address, port))
        return f"{src.gateway}:{bound}"

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on ``host`` (in its network namespace)."""
        return ["ip", "netns", "exec", self.hosts[host].namespace, *argv]

    def run(
        self, host: str, argv: Sequence[str], *, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host``, in its directory; wait for it."""
        done = subprocess.run(
            self.command(host, argv),
            cwd=self.hosts[host].directory,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode:
            raise RuntimeError(
                f"{host}: {' '.join(argv[:4])} ... exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def spawn(self, host: str, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host``, in its directory, logging to ``<log_name>.log`` there."""
        h = self.hosts[host]
        with (h.directory / f"{log_name}.log").open("ab") as log:
            process = subprocess.Popen(
                self.command(host, argv),
                cwd=h.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        h.processes.append(process)
        return process

    @staticmethod
    def stop(process: subprocess.Popen[bytes], *, kill: bool = False) -> None:
        """Stop a spawned process (SIGTERM, or SIGKILL) and wait for it."""
        if process.poll() is None:
            process.kill() if kill else process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        """Stop every spawned process, the relay, and remove the namespaces and links."""
        for host in self.hosts.values():
            for process in host.processes:
                self.stop(process)
        self.relay.close()
        for index in range(1, len(self.hosts) + 2):
            namespace = f"dpm-wan-{self._tag}-{index}"
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
            subprocess.run(["ip", "link", "del", self._links(index)[1]], capture_output=True)

    def __enter__(self) -> WanTopology:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_for_port(topology: WanTopology, host: str, port: int, *, timeout: float = 60.0) -> None:
    """Wait until something listens on ``port`` of ``host`` (its own address).

    Raises
    ------
    TimeoutError
        If nothing listens within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    probe = ["ss", "-Hltn", f"sport = :{port}"]
    while time.monotonic() < deadline:
        if topology.run(host, probe, check=False).stdout.strip():
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s")
