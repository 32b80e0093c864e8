"""What each caller's share of a server's reads costs that caller's own concurrent requests.

A server reads at most ``READS_AT_ONCE`` (4) request messages at once, and one caller at most
``READS_PER_CALLER`` of them (:class:`dpmarket.runtime.admission.CallerShares`), so that one
caller's calls that send nothing cannot hold every read turn. The price falls on a caller that
sends several large requests at once: each HTTP/2 stream's window bounds its rate over a long
round trip, so streams read one after another finish later than streams read together. For each
share (1, 2 and 4 turns, 4 being no share at all) this benchmark starts a real mTLS server (an
owner's ``OpenSession`` and ``GetProgress``, answered at once) behind a relay that delays every
chunk (:class:`dpmarket.deploy.wan.DelayRelay`), has one caller send ``N`` ``OpenSession``
requests of ``B`` bytes at once over one channel (in pieces above 1 MiB, as every channel sends
them), and a ``GetProgress`` 0.2 s later, and reports the best of ``R`` repetitions of the
uploads' wall time and of the small call's.

Run ``python -m bench.caller_reads --into out/bench.json``, or ``--quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.report import configure_logging, write_section
from bench.rounds import machine_info
from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.deploy.wan import DelayRelay
from dpmarket.runtime import admission
from dpmarket.runtime.admission import READS_AT_ONCE, ServiceLimits
from dpmarket.runtime.arrays import array_to_proto
from dpmarket.runtime.authz import Authorizer, rpc
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.serving import start_server
from dpmarket.runtime.transport import TransportSecurity, aio_channel
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

logger = logging.getLogger("bench.caller_reads")

CURATOR = Identity("curator", "curator")
OWNER = Identity("owner", "owner-0")
#: Read turns per caller compared (the last: every turn, i.e. no share).
SHARES: tuple[int, ...] = (1, 2, READS_AT_ONCE)
#: (uploads at once, bytes each) of a full run and of ``--quick``.
CASES: tuple[tuple[int, int], ...] = ((4, 500_000), (4, 2_000_000), (8, 2_000_000))
QUICK_CASES: tuple[tuple[int, int], ...] = ((2, 200_000),)
#: Round-trip time through the relay, seconds; repetitions of each case (the best is reported).
RTT_SECONDS = 0.05
REPEATS = 3
#: Seconds after the uploads start that the small call is sent.
SMALL_AFTER_SECONDS = 0.2


class _Owner(owner_pb2_grpc.OwnerServiceServicer):
    """An owner's OpenSession and GetProgress for the curator, answered at once."""

    authorizer = Authorizer({"curator": ("curator",)})

    def __init__(self, upload_bytes: int) -> None:
        self.limits = ServiceLimits({"OpenSession": upload_bytes + (1 << 20)})

    @rpc("curator")
    async def OpenSession(self, request, context, caller):
        return owner_pb2.OpenSessionResponse(num_points=1)

    @rpc("curator")
    async def GetProgress(self, request, context, caller):
        return owner_pb2.GetProgressResponse(done=1)


async def _measure(
    pki: Path, relay: DelayRelay, share: int, uploads: int, size: int, repeats: int
) -> dict[str, Any]:
    """Best wall times, seconds, of ``uploads`` OpenSession of ``size`` bytes at once and of a
    GetProgress sent among them, with ``share`` read turns per caller."""
    admission.READS_PER_CALLER = share  # read when the server's Admission is made

    def security(identity: Identity) -> TransportSecurity:
        return TransportSecurity.from_files(*identity_files(pki, identity))

    # The generated servicer declares every RPC abstract; gRPC answers UNIMPLEMENTED for the rest.
    owner = _Owner(size)  # type: ignore[abstract]

    def register(server: grpc.aio.Server) -> None:
        owner_pb2_grpc.add_OwnerServiceServicer_to_server(owner, server)

    server, port, _ = await start_server(
        register, "dpmarket.v1.OwnerService", "127.0.0.1:0", security(OWNER)
    )
    relayed = relay.add(f"{share}-{uploads}-{size}", ("127.0.0.1", 0), ("127.0.0.1", port))
    values = np.random.default_rng(0).standard_normal(size // 8)
    request = owner_pb2.OpenSessionRequest(session_id="s", omega=array_to_proto(values))
    options = [("grpc.max_send_message_length", 64 << 20)]
    uploads_best = small_best = float("inf")
    try:
        async with aio_channel(
            f"127.0.0.1:{relayed}", security(CURATOR), OWNER, options
        ) as channel:
            stub = owner_pb2_grpc.OwnerServiceStub(channel)
            await stub.GetProgress(owner_pb2.GetProgressRequest(session_id="w"), timeout=60)
            for _ in range(repeats):
                started = time.perf_counter()
                calls = [
                    asyncio.ensure_future(stub.OpenSession(request, timeout=300))
                    for _ in range(uploads)
                ]
                await asyncio.sleep(SMALL_AFTER_SECONDS)
                sent = time.perf_counter()
                await stub.GetProgress(owner_pb2.GetProgressRequest(session_id="x"), timeout=300)
                small_best = min(small_best, time.perf_counter() - sent)
                await asyncio.gather(*calls)
                uploads_best = min(uploads_best, time.perf_counter() - started)
    finally:
        await server.stop(None)
    return {
        "reads_per_caller": share,
        "uploads": uploads,
        "bytes": size,
        "uploads_seconds": uploads_best,
        "small_call_seconds": small_best,
    }


def run(cases: Sequence[tuple[int, int]], repeats: int, rtt: float) -> list[dict[str, Any]]:
    """Every case under every share (:data:`SHARES`), through one relay of round trip ``rtt``."""
    records = []
    relay = DelayRelay(rtt / 2)
    previous = admission.READS_PER_CALLER
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pki = Path(tmp)
            init_ca(pki)
            issue_all(pki, [CURATOR, OWNER])
            for uploads, size in cases:
                for share in SHARES:
                    record = asyncio.run(_measure(pki, relay, share, uploads, size, repeats))
                    logger.info("%s", record)
                    records.append(record)
    finally:
        admission.READS_PER_CALLER = previous
        relay.close()
    return records


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.caller_reads", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 x 0.2 MB, one repetition")
    parser.add_argument("--rtt-ms", type=float, default=RTT_SECONDS * 1000, help="round trip")
    parser.add_argument("--out", type=Path, help="write the report alone to this JSON file")
    parser.add_argument("--into", type=Path, help="merge the report into this JSON file")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the report (under ``"caller_reads"``), print the table."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    started = time.perf_counter()
    cases = QUICK_CASES if args.quick else CASES
    repeats = 1 if args.quick else REPEATS
    records = run(cases, repeats, args.rtt_ms / 1000)
    report = {
        "benchmark": "bench.caller_reads",
        "machine": machine_info(),
        "parameters": {"rtt_ms": args.rtt_ms, "repeats": repeats, "shares": list(SHARES)},
        "units": {"uploads_seconds": "s, best", "small_call_seconds": "s, best"},
        "cases": records,
        "seconds": time.perf_counter() - started,
    }
    print(f"{'turns':>5} {'uploads':>7} {'MB each':>8} {'uploads s':>10} {'small call s':>13}")
    for r in records:
        print(
            f"{r['reads_per_caller']:>5} {r['uploads']:>7} {r['bytes'] / 1e6:>8.1f} "
            f"{r['uploads_seconds']:>10.2f} {r['small_call_seconds']:>13.3f}"
        )
    for path in write_section(
        "caller_reads",
        report,
        out=args.out,
        into=args.into,
        default_out=Path("out/bench-caller-reads.json"),
    ):
        logger.info("report -> %s", path)
    return report


if __name__ == "__main__":
    main()
