"""What large requests make a service hold: RSS of real owner and curator processes.

Each case starts a fresh :class:`dpmarket.deploy.launcher.LocalCluster` (one owner of the digits
scenario and the curator, each its own OS process, mTLS with the launcher's certificates), sends
``--calls`` concurrent requests of ``--size-mb`` MB each from one identity, and reads the service's
resident set size (``psutil``) before the calls, every 10 ms while they run (the peak) and one
second after the last answer:

* ``owner-refused``: a consumer calls the owner's ``OpenSession`` (open to its curators only);
* ``curator-refused``: an owner calls the curator's ``CreateSession`` (open to consumers only);
* ``curator-oversized``: a consumer calls ``CreateSession``, which it may, with a request over
  the method's own receive limit;
* ``owner-health``: a consumer calls the owner's ``grpc.health.v1`` ``Check``, which every
  certificate of the deployment may, with an oversized request;
* ``curator-admitted``: a consumer calls ``CreateSession`` with a request of
  :data:`ADMITTED_MB` MB, under the method's limit, whose validation set (6 columns, about
  300,000 rows) the curator's policy refuses (``INVALID_ARGUMENT``, after decoding it), in
  :data:`ADMITTED_ROUNDS` floods one after the other: what a service keeps of requests it read
  and refused (issue 25: 40 calls and three bursts of 32 left a curator at 2.6 GiB).

Every call must fail (the status of each is recorded). The request bytes are built once and sent
raw, so the client holds one copy whatever ``--calls``. Run ``python -m bench.memory`` (the
memory attack: 230 MB messages, one and eight at once; about a minute) or ``--quick``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import psutil

from bench.report import configure_logging, write_section
from dpmarket.deploy.launcher import CURATOR_NAME, LocalCluster
from dpmarket.experiments.scenarios import digits_scenario, write_scenario
from dpmarket.runtime.identity import Identity, Role, identity_files
from dpmarket.runtime.transport import TransportSecurity, sync_channel
from dpmarket.v1 import array_pb2, curator_pb2, owner_pb2

logger = logging.getLogger("bench.memory")

#: Every case, with the service it targets, the caller's role and the method path.
CASES: dict[str, tuple[str, Role, str]] = {
    "owner-refused": ("owner", "consumer", "/dpmarket.v1.OwnerService/OpenSession"),
    "curator-refused": ("curator", "owner", "/dpmarket.v1.CuratorService/CreateSession"),
    "curator-oversized": ("curator", "consumer", "/dpmarket.v1.CuratorService/CreateSession"),
    "owner-health": ("owner", "consumer", "/grpc.health.v1.Health/Check"),
    "curator-admitted": ("curator", "consumer", "/dpmarket.v1.CuratorService/CreateSession"),
}
#: ``curator-admitted``: its request size (MB, whatever ``--size-mb``: under the curator's
#: 17 MiB ``CreateSession`` limit) and its floods in a row.
ADMITTED_MB = 15.0
ADMITTED_ROUNDS = 3
MIB = 1 << 20
#: Channel option that lets the client send the largest requests measured.
SEND_OPTIONS = [("grpc.max_send_message_length", 1 << 30)]


@dataclass(frozen=True)
class Measurement:
    """One case at one concurrency; RSS in MiB."""

    case: str
    calls: int
    size_mb: float
    before_mib: float
    peak_growth_mib: float
    after_growth_mib: float
    statuses: list[str]
    seconds: float


def request_bytes(case: str, size: int) -> bytes:
    """A serialized request of about ``size`` bytes for ``case``: one large float64 array."""
    columns = 6 if case == "curator-admitted" else 64
    rows = size // (8 * columns)
    array = array_pb2.Array(
        dtype=array_pb2.DTYPE_FLOAT64, shape=[rows, columns], data=bytes(rows * 8 * columns)
    )
    if case == "curator-admitted":
        return curator_pb2.CreateSessionRequest(
            validation=array, summary_size=5, method=curator_pb2.METHOD_CANDIDATES
        ).SerializeToString()
    if case == "owner-refused":
        return owner_pb2.OpenSessionRequest(session_id="probe", omega=array).SerializeToString()
    if case == "owner-health":
        # A HealthCheckRequest's field 1 is a string: the same length-delimited bytes.
        return b"\x0a" + _varint(len(array.data)) + array.data
    return curator_pb2.CreateSessionRequest(validation=array).SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


class RssSampler(threading.Thread):
    """Samples a process's RSS every 10 ms until stopped; keeps the peak."""

    def __init__(self, process: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.peak = process.memory_info().rss
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self.halt.wait(0.01)


@contextmanager
def cluster(directory: Path) -> Iterator[LocalCluster]:
    """One digits owner and the curator, with the launcher's default policies."""
    digits = digits_scenario(seed=0)
    files = write_scenario(digits, directory / "data")
    with LocalCluster(
        [files["owner-0"]], [digits.owners[0].name], directory / "logs", state_dir=directory
    ) as running:
        yield running


def measure(running: LocalCluster, case: str, calls: int, size_mb: float) -> Measurement:
    """Send ``calls`` concurrent requests of ``size_mb`` MB for ``case``; read the RSS."""
    service, caller_role, path = CASES[case]
    if service == "owner":
        target = running.owner_targets[0]
        expected = Identity("owner", running.owner_ids[0])
        process = psutil.Process(running.owner_processes[0].pid)
    else:
        assert running.curator_process is not None
        target = running.curator_target
        expected = Identity("curator", CURATOR_NAME)
        process = psutil.Process(running.curator_process.pid)
    caller = Identity(caller_role, running.owner_ids[0] if caller_role == "owner" else "consumer")
    security = TransportSecurity.from_files(*identity_files(running.pki_dir, caller))
    admitted = case == "curator-admitted"
    size_mb = ADMITTED_MB if admitted else size_mb
    payload = request_bytes(case, int(size_mb * 1e6))
    with sync_channel(target, security, expected, SEND_OPTIONS) as channel:
        floods = [
            flood(channel, path, payload, calls, process)
            for _ in range(ADMITTED_ROUNDS if admitted else 1)
        ]
    before = floods[0].before
    return Measurement(
        case,
        calls,
        size_mb,
        before / MIB,
        max(f.before + f.peak_growth for f in floods) / MIB - before / MIB,
        (floods[-1].before + floods[-1].after_growth - before) / MIB,
        [status for f in floods for status in f.statuses],
        sum(f.seconds for f in floods),
    )


@dataclass(frozen=True)
class Flood:
    """What :func:`flood` saw: every call's status, the RSS before (bytes) and its growth."""

    statuses: list[str]
    before: int
    peak_growth: int
    after_growth: int
    seconds: float


def flood(
    channel: grpc.Channel | Sequence[grpc.Channel],
    path: str,
    payload: bytes,
    calls: int,
    process: psutil.Process,
    *,
    settle: float = 1.0,
) -> Flood:
    """Send ``payload`` (a serialized request) to ``path`` on ``calls`` concurrent calls; read
    ``process``'s RSS before, every 10 ms meanwhile (the peak) and ``settle`` seconds after.

    Over several channels (each its own connection: ``grpc.use_local_subchannel_pool``), the
    calls take them in turn. A first call on each with an empty request connects it and warms
    the server's path of the method, ``settle / 2`` seconds before the RSS is read. Every status
    is recorded (``"OK"`` or the code's name); nothing raises.
    """
    channels = [channel] if isinstance(channel, grpc.Channel) else list(channel)
    methods: list[Callable[..., bytes]] = [
        c.unary_unary(path, request_serializer=None, response_deserializer=None) for c in channels
    ]
    for method in methods:
        _status(method, b"")
    time.sleep(settle / 2)
    before = process.memory_info().rss
    sampler = RssSampler(process)
    sampler.start()
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(calls) as pool:
            statuses = list(
                pool.map(lambda i: _status(methods[i % len(methods)], payload), range(calls))
            )
        seconds = time.perf_counter() - start
        time.sleep(settle)
        after = process.memory_info().rss
    finally:
        sampler.halt.set()
        sampler.join()
    peak = max(sampler.peak, after)
    return Flood(statuses, before, peak - before, after - before, seconds)


def _status(call: Callable[..., bytes], payload: bytes) -> str:
    try:
        call(payload, timeout=120)
    except grpc.RpcError as exc:
        return exc.code().name
    return "OK"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Write the JSON section here.")
    parser.add_argument("--into", type=Path, default=None, help="Merge into this JSON report.")
    parser.add_argument("--size-mb", type=float, default=230.0, help="Request size, MB.")
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 8], help="Concurrencies.")
    parser.add_argument("--case", choices=sorted(CASES), nargs="+", default=list(CASES))
    parser.add_argument("--quick", action="store_true", help="20 MB requests, 1 and 4 at once.")
    parser.add_argument("--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    size, concurrency = (20.0, [1, 4]) if args.quick else (args.size_mb, args.calls)
    results = []
    for case in args.case:
        for calls in concurrency:
            with (
                tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp,
                cluster(Path(tmp)) as c,
            ):
                m = measure(c, case, calls, size)
            logger.info(
                "%-18s %d x %.0f MB: RSS %.0f MiB, peak +%.0f MiB, after +%.0f MiB (%s)",
                case,
                calls,
                m.size_mb,
                m.before_mib,
                m.peak_growth_mib,
                m.after_growth_mib,
                ", ".join(sorted(set(m.statuses))),
            )
            results.append(asdict(m))
    write_section(
        "memory",
        {"size_mb": size, "results": results},
        out=args.out,
        into=args.into,
        default_out=Path("out/memory.json"),
    )


if __name__ == "__main__":
    main()
