"""What the network costs, per protocol: round trips on the critical path, calls and bytes.

Every protocol runs once per size on a :class:`dpmarket.deploy.launcher.LocalCluster` (K
``owner serve`` processes and a ``curator serve`` process on 127.0.0.1 over mTLS), with the call
record of :mod:`dpmarket.runtime.rpc_trace` switched on for every process (``DPMARKET_RPC_TRACE``,
inherited by the services), then a secure-aggregation round of S site processes (those of
:mod:`bench.secagg`) driven by this process as the curator. For each run the report gives, from the
curator's calls to the owners:

``waves``
    Round trips on the critical path (:func:`dpmarket.runtime.rpc_trace.waves`: maximal groups of
    overlapping calls; owners called concurrently make one wave);
``calls``, ``request_bytes``, ``response_bytes``
    The curator's calls to owners, the bytes it sent them and received from them (serialized
    protobuf messages; TLS, HTTP/2 and gRPC framing not counted);
``predicted_waves``
    The round-trip formula of :data:`ROUND_TRIPS` for the run's K, p and S;

(for sketch publication, the owners' calls to the curator: every owner publishes its sketches
of a three-spec catalogue at once), and the same counts for the consumer's calls to the curator
(``consumer_to_curator``, against the formula's ``consumer`` round trips:
``predicted_consumer_waves``). The formulas of
:data:`ROUND_TRIPS` are the ones ``docs/reference.md`` states (:func:`docs_table`; a test keeps
both equal and checks them against the measurement).

Run ``python -m bench.network --into out/bench.json`` (``make bench``: the report goes under the
key ``network``) or ``--quick`` (K = 3, p in {2, 4}, S = 3: about 25 s on loopback);
``--wan PROFILE ...`` (root) adds wall times with the owners and the curator on WAN hosts
(:func:`run_wan`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.report import write_section
from bench.rounds import BENCH_OWNER_POLICY
from dpmarket.common.summarization.methods import Method, method_config
from dpmarket.deploy.wan import PROFILES as WAN_PROFILES
from dpmarket.runtime import rpc_trace
from dpmarket.runtime.tables import PointSet, save_point_set

logger = logging.getLogger("bench.network")


# ---------------------------------------------------------------------------- the formulas
@dataclass(frozen=True)
class RoundTrips:
    """The round trips on the critical path of one protocol, as a formula.

    Attributes
    ----------
    protocol : str
        The protocol's name in the report and in the docs.
    formula : str
        The formula as the docs print it, in K (owners), p (summary size, or iterations T for
        gradient descent), S (sites of a secure-aggregation round) and, for the auctions of
        the private and rounds methods, I (auction iterations: p, plus one per iteration that
        acquired no point) and A (iterations whose auction asked at least one owner; A <= I,
        and A < p when later rounds take points from the pool of earlier releases).
    terms : str
        What each term is: the waves in the order they run.
    count : callable
        ``count(k, p, s, i, a) -> int``, the formula's value (``i``, ``a``: I and A).
    consumer : int
        The consumer's round trips to the curator, before and after the owners' waves (which
        run between its request and its answer): a summary's CreateSession, WatchSession to
        its last event and GetSummary; a CAPE job's one call; 0 where no consumer takes part.
        A new channel adds its connection set-up (TCP, then TLS 1.3: two more on a WAN).
    """

    protocol: str
    formula: str
    terms: str
    count: Callable[[int, int, int, int, int], int]
    consumer: int


#: Sites from which a secure-aggregation round uses SecAgg+'s sparse graph, which adds a wave
#: (:data:`dpmarket.common.secagg.graph.SPARSE_MIN_SITES`; the bench checks the two agree).
SPARSE_FROM = 40


def _secagg(s: int) -> int:
    """Waves of one secure-aggregation round of ``s`` sites."""
    return 5 if s < SPARSE_FROM else 6


_SECAGG_TERMS = (
    "AdvertiseKeys, ShareKeys, MaskedInput, ConsistencyCheck, Unmask; "
    f"A(S) = 6 from S = {SPARSE_FROM} (SecAgg+'s sparse graph adds RevealNonce before "
    "ShareKeys); independent of the vector's length"
)

#: The curator's call that delivers a settled statement to an owner after a session: off the
#: critical path, so outside the round-trip formulas (:func:`measure_run` counts it apart).
SETTLEMENT_CALL = "RecordStatement"

#: The round-trip formula of every protocol, the one home of these formulas (the docs' table is
#: :func:`docs_table`). Setup waves shared by the summarization methods: GetOwnerInfo,
#: OpenSession (h1), and CloseSession at the end.
ROUND_TRIPS: dict[str, RoundTrips] = {
    r.protocol: r
    for r in (
        RoundTrips(
            "summarization/candidates",
            "6",
            "GetOwnerInfo, OpenSession, SetValidationEmbedding, CountRelevant, "
            "ProposeCandidates, CloseSession; 5 with the sketch allocation (no CountRelevant); "
            "independent of K and p",
            lambda k, p, s, i, a: 6,
            3,
        ),
        RoundTrips(
            "summarization/private",
            "4 + I + A",
            "GetOwnerInfo, OpenSession, SetValidationEmbedding, then per auction iteration one "
            "Bid wave, and one ReleasePoint wave (the owners the auction asks, concurrently) "
            "when it asks any, both steps of each owner's RunRounds stream, CloseSession; I (p, "
            "plus one per iteration that acquired no point) "
            "and A <= I (fewer than p when a round takes its point from the pool of earlier "
            "releases) depend on the auction's coins; independent of K",
            lambda k, p, s, i, a: 4 + i + a,
            3,
        ),
        RoundTrips(
            "summarization/greedy",
            "4 + 2p",
            "GetOwnerInfo, OpenSession, SetValidationEmbedding, then per round one Bid wave and "
            "one ReleasePoint wave (the top bidder), steps of each owner's RunRounds stream, "
            "CloseSession; independent of K",
            lambda k, p, s, i, a: 4 + 2 * p,
            3,
        ),
        RoundTrips(
            "summarization/uniform",
            "4",
            "GetOwnerInfo, OpenSession, SampleUniform, CloseSession; independent of K and p",
            lambda k, p, s, i, a: 4,
            3,
        ),
        RoundTrips(
            "summarization/rounds",
            "4 + I + A",
            "as private",
            lambda k, p, s, i, a: 4 + i + a,
            3,
        ),
        RoundTrips(
            "cape/mean",
            "6 + A(K)",
            "GetOwnerInfo (the prices the job is quoted from), OpenCapeJob, AttestCapePlan, "
            "PlanCapeJob, one secure-aggregation round of the K sites (A(K) waves, below), "
            "ReleaseCape, CloseCapeJob",
            lambda k, p, s, i, a: 6 + _secagg(k),
            1,
        ),
        RoundTrips(
            "cape/fm",
            "6 + A(K)",
            "as cape/mean (capeFM releases its objective's coefficients in one ReleaseCape)",
            lambda k, p, s, i, a: 6 + _secagg(k),
            1,
        ),
        RoundTrips(
            "cape/dpgd",
            "5 + A(K) + p",
            "GetOwnerInfo (the quote), OpenCapeJob, AttestCapePlan, PlanCapeJob, one "
            "secure-aggregation round for the noise of all p = T iterations, one "
            "ReleaseCapeGradient wave per iteration, CloseCapeJob (no site lost; a lost site "
            "adds a noise round)",
            lambda k, p, s, i, a: 5 + _secagg(k) + p,
            1,
        ),
        RoundTrips(
            "sketch-publication",
            "1 + 2m",
            "per owner, on its own and independent of K: ListSketchSpecs, then for each of the m "
            "specs it publishes GetSketchSpec and PublishSketch (owner to curator); with "
            "`--epsilon`, one more GetSketchSpec per spec first (1 + 3m), so that a spec "
            "released at another ε refuses the run before anything is charged",
            lambda k, p, s, i, a: 1 + 2 * p,
            0,
        ),
        RoundTrips(
            "secure-aggregation",
            "A(S)",
            "A(S) = 5 for S < 40: " + _SECAGG_TERMS,
            lambda k, p, s, i, a: _secagg(s),
            0,
        ),
    )
}


def predicted(
    protocol: str, *, k: int, p: int = 0, s: int = 0, iterations: int = 0, asked: int = 0
) -> int:
    """The formula's round trips for ``protocol`` (a key of :data:`ROUND_TRIPS`); ``iterations``
    and ``asked`` are I and A of the auctions (:class:`RoundTrips`)."""
    return ROUND_TRIPS[protocol].count(k, p, s, iterations, asked)


def docs_table() -> str:
    """The round-trip table of ``docs/reference.md``, generated from :data:`ROUND_TRIPS`."""
    lines = [
        "| protocol | curator to owners | consumer to curator | waves, in order |",
        "| --- | --- | --- | --- |",
    ]
    for r in ROUND_TRIPS.values():
        lines.append(f"| {r.protocol} | {r.formula} | {r.consumer} | {r.terms} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- data
#: Raw features of the summarization points and numeric columns of the CAPE tables.
N_FEATURES = 4
COLUMNS = tuple(f"x{i}" for i in range(N_FEATURES))
BINARY = "b"


def write_data(work_dir: Path, k: int, n_points: int, seed: int) -> tuple[list[Path], list[Path]]:
    """Synthetic owners: points (Gaussian clouds) and tables (uniform on [0, 1] with a 0/1
    column ``b``), ``n_points`` rows each. The values do not matter to what is measured."""
    rng = np.random.default_rng(seed)
    files, tables = [], []
    for i in range(k):
        name = f"owner-{i:02d}"
        points = PointSet(
            features=rng.normal(rng.normal(size=N_FEATURES), 1.0, (n_points, N_FEATURES)),
            labels=None,
            name=name,
        )
        files.append(work_dir / f"{name}.npz")
        save_point_set(points, files[-1])
        frame = pd.DataFrame(rng.uniform(0.0, 1.0, (n_points, N_FEATURES)), columns=list(COLUMNS))
        frame[BINARY] = (frame[COLUMNS[0]] > 0.5).astype(np.float64)
        tables.append(work_dir / f"{name}.parquet")
        frame.to_parquet(tables[-1])
    return files, tables


_CURATOR_POLICY = """
[requests]
methods = ["candidates", "private", "rounds", "uniform", "greedy"]
delta_owners = [1e-12, 0.5]
owners_delta = [0.0, 0.5]
owners_epsilon = [0.0, 1e5]
train_iterations = [1, 100]
train_hidden_units = [1, 8]
train_work = [1, 1000000]
[sessions]
per_consumer_per_minute = 1000
"""


#: The sketch declaration of the curator's catalogue: three specs (rff, race, hist) over the
#: tables' numeric columns.
_SKETCH_SPEC = (
    """
name = "bench"
[mechanism]
epsilon = 1.0
epsilon_range = [0.5, 1.0]
"""
    + "".join(f'[[columns]]\nname = "{c}"\nlow = 0\nhigh = 1\n' for c in COLUMNS)
    + """
[maps.rff]
frequencies = 8
sigma = 0.5
[maps.race]
hashes = 4
buckets = 8
width = 0.25
[maps.hist]
bins = [4, 4, 4, 4]
"""
)
#: Specs of :data:`_SKETCH_SPEC`, all published by every owner (``owner publish --all``).
SKETCH_SPECS = 3


# ---------------------------------------------------------------------------------- runs
@contextlib.contextmanager
def _tracing(path: Path) -> Iterator[None]:
    """Record every client call of this process and of the processes started inside."""
    saved = os.environ.get(rpc_trace.TRACE_ENV)
    os.environ[rpc_trace.TRACE_ENV] = str(path)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(rpc_trace.TRACE_ENV, None)
        else:
            os.environ[rpc_trace.TRACE_ENV] = saved


def measure_run(
    trace: Path, start: float, end: float, *, protocol: str, k: int, p: int, s: int
) -> dict[str, Any]:
    """The record of one run: the curator's calls to owners (waves, calls, bytes) and the
    consumer's calls to the curator made between ``start`` and ``end`` (monotonic seconds),
    with the formula's prediction."""
    records = rpc_trace.read_records(trace)
    traced = rpc_trace.select(
        records, caller_role="curator", peer_role="owner", start=start, end=end
    )
    # A settled statement's delivery (RecordStatement) runs after the session, off the
    # consumer's path, and may end before or after the run's end: counted apart, not as a wave.
    owners = [r for r in traced if r.name != SETTLEMENT_CALL]
    consumer = rpc_trace.select(
        records, caller_role="consumer", peer_role="curator", start=start, end=end
    )
    measured = rpc_trace.totals(owners)
    methods = dict(rpc_trace.iter_methods(owners))
    # The auction's I and A: its Bid waves and its ReleasePoint waves (RunRounds steps).
    iterations = rpc_trace.waves(r for r in owners if r.name == "RunRounds.bid")
    asked = rpc_trace.waves(r for r in owners if r.name == "RunRounds.release_point")
    expected = predicted(protocol, k=k, p=p, s=s, iterations=iterations, asked=asked)
    return {
        "protocol": protocol,
        "k": k,
        "p": p,
        "s": s,
        "auction_iterations": iterations,
        "auction_asked": asked,
        "formula": ROUND_TRIPS[protocol].formula,
        "predicted_waves": expected,
        "curator_to_owners": measured,
        "predicted_consumer_waves": ROUND_TRIPS[protocol].consumer,
        "matches": measured["waves"] == expected
        and rpc_trace.waves(consumer) == ROUND_TRIPS[protocol].consumer,
        "calls_by_method": methods,
        "settlement_calls": len(traced) - len(owners),
        "consumer_to_curator": rpc_trace.totals(consumer),
        "seconds": end - start,
    }


def measure_publication(trace: Path, start: float, end: float, *, k: int) -> dict[str, Any]:
    """The record of every owner publishing its sketches at once: each owner's calls to the
    curator are one request; ``waves`` is the most any owner needed (they run in parallel),
    calls and bytes are summed over the owners."""
    records = rpc_trace.read_records(trace)
    calls = rpc_trace.select(
        records, caller_role="owner", peer_role="curator", start=start, end=end
    )
    by_owner: dict[str, list[rpc_trace.CallRecord]] = {}
    for r in calls:
        by_owner.setdefault(r.caller, []).append(r)
    measured = rpc_trace.totals(calls)
    measured["waves"] = max((rpc_trace.waves(v) for v in by_owner.values()), default=0)
    expected = predicted("sketch-publication", k=k, p=SKETCH_SPECS)
    return {
        "protocol": "sketch-publication",
        "k": k,
        "p": SKETCH_SPECS,
        "s": 0,
        "auction_iterations": 0,
        "auction_asked": 0,
        "formula": ROUND_TRIPS["sketch-publication"].formula,
        "predicted_waves": expected,
        "curator_to_owners": measured,
        "direction": "owners to curator",
        "waves_by_owner": {o: rpc_trace.waves(v) for o, v in sorted(by_owner.items())},
        "predicted_consumer_waves": 0,
        "matches": len(by_owner) == k
        and all(rpc_trace.waves(v) == expected for v in by_owner.values()),
        "calls_by_method": dict(rpc_trace.iter_methods(calls)),
        "consumer_to_curator": rpc_trace.totals([]),
        "seconds": end - start,
    }


def run_cluster(
    k: int,
    ps: Sequence[int],
    methods: Sequence[Method],
    iterations: Sequence[int],
    work_dir: Path,
    *,
    n_points: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Run every summarization method at every p and the CAPE jobs on one cluster of ``k``
    owners; return one record per run (:func:`measure_run`)."""
    from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.deploy.launcher import LocalCluster

    cluster_dir = work_dir / f"k{k}"
    cluster_dir.mkdir(parents=True, exist_ok=True)
    files, tables = write_data(cluster_dir, k, n_points, seed)
    owner_policy, curator_policy = cluster_dir / "owner.toml", cluster_dir / "curator.toml"
    owner_policy.write_text(BENCH_OWNER_POLICY, encoding="utf-8")
    curator_policy.write_text(_CURATOR_POLICY, encoding="utf-8")
    trace = cluster_dir / "calls.jsonl"
    rng = np.random.default_rng(seed + 1)
    validation = rng.normal(0.0, 1.0, (50, N_FEATURES))
    seed_set = rng.normal(0.0, 1.0, (5, N_FEATURES))
    features = tuple((c, 0.0, 1.0) for c in COLUMNS[1:])
    sketch_spec = cluster_dir / "bench.toml"
    sketch_spec.write_text(_SKETCH_SPEC, encoding="utf-8")
    owner_ids = [f"owner-{i:02d}" for i in range(k)]
    records: list[dict[str, Any]] = []
    with (
        _tracing(trace),
        LocalCluster(
            files,
            owner_ids,
            cluster_dir / "logs",
            sketch_specs=[sketch_spec],
            sketch_seed=seed,
            owner_tables=tables,
            owner_binary_columns=[BINARY],
            owner_policy=owner_policy,
            curator_policy=curator_policy,
        ) as cluster,
        CuratorClient(cluster.curator_target, cluster.consumer_security(), timeout=600.0) as client,
    ):

        def timed(protocol: str, p: int, run: Callable[[], object]) -> None:
            start = time.monotonic()
            run()
            end = time.monotonic()
            record = measure_run(trace, start, end, protocol=protocol, k=k, p=p, s=k)
            logger.info(
                "K=%d %-26s p=%-3d waves %3d predicted %3d",
                k,
                protocol,
                p,
                record["curator_to_owners"]["waves"],
                record["predicted_waves"],
            )
            records.append(record)

        for method in methods:
            for p in ps if method not in ("uniform", "candidates") else ps[:1]:
                config = method_config(method, summary_size=p, rff_dimension=32)
                timed(
                    f"summarization/{method}",
                    p,
                    functools.partial(client.summarize, config, validation, seed_set, seed=seed),
                )
        timed(
            "cape/mean",
            0,
            lambda: client.estimate_cape_mean(CapeMeanSpec(features, 1.0, 1e-6), seed=seed),
        )
        timed(
            "cape/fm",
            0,
            lambda: client.fit_cape(
                CapeJobSpec("linear", features[:-1], (COLUMNS[-1], 0.0, 1.0), 1.0, 1e-6),
                seed=seed,
            ),
        )
        for t in iterations:
            spec = CapeTrainingSpec(features, BINARY, 1.0, 1e-6, t, 0.5, 2, 1.0)
            timed("cape/dpgd", t, functools.partial(client.train_cape, spec, seed=seed))
        start = time.monotonic()
        cluster.publish_sketches(
            dict(zip(owner_ids, tables, strict=True)), cluster_dir / "published", seed=seed
        )
        record = measure_publication(trace, start, time.monotonic(), k=k)
        logger.info(
            "K=%d sketch-publication waves %d predicted %d",
            k,
            record["curator_to_owners"]["waves"],
            record["predicted_waves"],
        )
        records.append(record)
    return records


#: Length of the secure-aggregation benchmark's vectors (its bytes grow with it; waves do not).
SECAGG_LENGTH = 1_000
DEFAULT_SITES: tuple[int, ...] = (5, 20)
QUICK_SITES: tuple[int, ...] = (3,)


def run_secure_aggregation(
    sites: int, work_dir: Path, *, length: int = SECAGG_LENGTH
) -> dict[str, Any]:
    """One secure-aggregation round of ``sites`` site processes (the sites of
    :mod:`bench.secagg`: real servicers over mTLS, each drawing its own input of ``length``
    values) driven by this process as the curator (:func:`dpmarket.curator.secagg.aggregate`); the
    record of :func:`measure_run`."""
    import asyncio

    from bench.secagg import (
        CLIP,
        CURATOR,
        RESOLUTION_BITS,
        colluders_for,
        running_sites,
        site_names,
        threshold_for,
    )
    from bench.secagg_site import job_id
    from dpmarket.common.secagg.fixedpoint import FixedPoint
    from dpmarket.common.secagg.protocol import RoundParams
    from dpmarket.curator.owners import CALL_DEADLINE_SECONDS, GrpcOwnerEndpoint
    from dpmarket.curator.secagg import aggregate
    from dpmarket.deploy.pki import init_ca, issue_all
    from dpmarket.runtime.identity import Identity, identity_files
    from dpmarket.runtime.transport import TransportSecurity

    run_dir = work_dir / f"secagg-s{sites}"
    pki_dir = run_dir / "pki"
    init_ca(pki_dir)
    curator = Identity("curator", CURATOR)
    names = site_names(sites)
    issue_all(pki_dir, [curator, *(Identity("owner", n) for n in names)])
    security = TransportSecurity.from_files(*identity_files(pki_dir, curator))
    trace = run_dir / "calls.jsonl"

    async def one_round() -> tuple[float, float]:
        endpoints = {
            n: GrpcOwnerEndpoint(processes.target(n), security, Identity("owner", n)) for n in names
        }
        try:
            for endpoint in endpoints.values():
                await endpoint.connect()
            params = RoundParams.create(
                names,
                threshold_for(sites),
                length,
                FixedPoint(CLIP, RESOLUTION_BITS, sites),
                colluders=colluders_for(sites),
            )
            start = time.monotonic()
            await aggregate(endpoints, job_id(length), params, timeout=CALL_DEADLINE_SECONDS)
            return start, time.monotonic()
        finally:
            for endpoint in endpoints.values():
                await endpoint.close()

    with _tracing(trace), running_sites(names, pki_dir, [length], run_dir) as processes:
        start, end = asyncio.run(one_round())
    record = measure_run(trace, start, end, protocol="secure-aggregation", k=sites, p=0, s=sites)
    record["vector_length"] = length
    logger.info(
        "S=%d secure-aggregation waves %d predicted %d",
        sites,
        record["curator_to_owners"]["waves"],
        record["predicted_waves"],
    )
    return record


#: Ports of the services on their WAN hosts.
WAN_OWNER_PORT, WAN_CURATOR_PORT = 50051, 50050


def run_wan(
    profiles: Sequence[str], k: int, p: int, work_dir: Path, *, n_points: int, seed: int
) -> list[dict[str, Any]]:
    """Wall time of a default summary, a greedy summary of ``p`` points and a CAPE mean with the
    owners and the curator on hosts of their own (:class:`dpmarket.deploy.wan.WanTopology`: network
    namespaces, every link shaped to the profile's rate, every connection between hosts held
    for the profile's delay by the harness's relay), under each profile of
    :data:`dpmarket.deploy.wan.PROFILES`. The consumer is this process, reaching the curator through
    the relay (delayed, its own link not shaped). Needs root.

    Returns
    -------
    list of dict
        Per profile and protocol: the record of :func:`measure_run` with ``profile``,
        ``rtt_seconds``, ``wall_seconds`` (the consumer's call, start to answer) and
        ``waves_times_rtt`` (the measured waves times the profile's round trip: the part of the
        wall time no bandwidth or computation can remove).
    """
    from dpmarket.common.cape.spec import CapeMeanSpec
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.deploy.pki import init_ca, issue_all
    from dpmarket.deploy.wan import WanTopology, wait_for_port
    from dpmarket.owner.ledger_admin import init_ledger
    from dpmarket.runtime.identity import Identity, identity_files
    from dpmarket.runtime.transport import TransportSecurity

    run_dir = work_dir / f"wan-k{k}"
    run_dir.mkdir(parents=True, exist_ok=True)
    files, tables = write_data(run_dir, k, n_points, seed)
    owner_policy, curator_policy = run_dir / "owner.toml", run_dir / "curator.toml"
    owner_policy.write_text(BENCH_OWNER_POLICY, encoding="utf-8")
    curator_policy.write_text(_CURATOR_POLICY, encoding="utf-8")
    owners = [f"owner-{i:02d}" for i in range(k)]
    pki = run_dir / "pki"
    init_ca(pki)
    consumer = Identity("consumer", "consumer")
    issue_all(
        pki, [Identity("curator", "curator"), consumer, *(Identity("owner", o) for o in owners)]
    )
    trace = run_dir / "calls.jsonl"
    dpmarket = str(Path(sys.executable).parent / "dpmarket")
    rng = np.random.default_rng(seed + 1)
    validation = rng.normal(0.0, 1.0, (50, N_FEATURES))
    seed_set = rng.normal(0.0, 1.0, (5, N_FEATURES))
    features = tuple((c, 0.0, 1.0) for c in COLUMNS[1:])
    records: list[dict[str, Any]] = []
    with (
        _tracing(trace),
        WanTopology([*owners, "curator"], run_dir / "hosts", WAN_PROFILES[profiles[0]]) as wan,
    ):
        for i, owner in enumerate(owners):
            # Each owner's new ledger, bound to its certificate (dpmarket owner ledger init).
            init_ledger(
                wan.hosts[owner].directory / "state",
                owner,
                TransportSecurity.from_files(*identity_files(pki, Identity("owner", owner))),
                policy=owner_policy,
            )
            wan.spawn(
                owner,
                [dpmarket, "owner", "serve", "--data", str(files[i]), "--table", str(tables[i]),
                 "--binary-column", BINARY, "--host", "0.0.0.0", "--port", str(WAN_OWNER_PORT),
                 "--pki-dir", str(pki), "--name", owner, "--policy", str(owner_policy),
                 "--data-dir", "state", "--allow-seeded-sessions"],
                owner,
            )  # fmt: skip
        curator = [
            dpmarket, "curator", "serve", "--host", "0.0.0.0", "--port", str(WAN_CURATOR_PORT),
            "--pki-dir", str(pki), "--name", "curator", "--policy", str(curator_policy),
            "--data-dir", "state", "--allow-seeded-sessions",
        ]  # fmt: skip
        for owner in owners:
            wait_for_port(wan, owner, WAN_OWNER_PORT)
            curator += ["--owner", f"{owner}@{wan.route('curator', owner, WAN_OWNER_PORT)}"]
        wan.spawn("curator", curator, "curator")
        wait_for_port(wan, "curator", WAN_CURATOR_PORT)
        address = wan.hosts["curator"].address
        port = wan.relay.add("consumer->curator", ("127.0.0.1", 0), (address, WAN_CURATOR_PORT))
        security = TransportSecurity.from_files(*identity_files(pki, consumer))
        with CuratorClient(f"127.0.0.1:{port}", security, timeout=600.0) as client:
            runs: list[tuple[str, int, Callable[[], object]]] = [
                (
                    f"summarization/{method}",
                    p,
                    functools.partial(
                        client.summarize,
                        method_config(method, summary_size=p, rff_dimension=32),
                        validation,
                        seed_set,
                        seed=seed,
                    ),
                )
                for method in ("candidates", "greedy")
            ] + [
                (
                    "cape/mean",
                    0,
                    functools.partial(
                        client.estimate_cape_mean, CapeMeanSpec(features, 1.0, 1e-6), seed=seed
                    ),
                ),
            ]
            for name in profiles:
                profile = WAN_PROFILES[name]
                wan.set_profile(profile)
                for protocol, size, call in runs:
                    start = time.monotonic()
                    call()
                    end = time.monotonic()
                    record = measure_run(trace, start, end, protocol=protocol, k=k, p=size, s=k)
                    record["profile"] = name
                    record["rtt_seconds"] = profile.rtt_ms / 1e3
                    record["rate_mbit"] = profile.rate_mbit
                    record["wall_seconds"] = end - start
                    record["waves_times_rtt"] = (
                        record["curator_to_owners"]["waves"] * profile.rtt_ms / 1e3
                    )
                    logger.info(
                        "WAN %-6s K=%d %-26s waves %3d wall %.2f s (waves x RTT %.2f s)",
                        name,
                        k,
                        protocol,
                        record["curator_to_owners"]["waves"],
                        record["wall_seconds"],
                        record["waves_times_rtt"],
                    )
                    records.append(record)
    return records


def check_sparse_threshold() -> None:
    """Fail if :data:`SPARSE_FROM` is not where secure aggregation turns sparse."""
    from dpmarket.common.secagg.graph import SPARSE_MIN_SITES

    if SPARSE_MIN_SITES != SPARSE_FROM:
        raise AssertionError(f"SPARSE_FROM is {SPARSE_FROM}, the graph's {SPARSE_MIN_SITES}")


# ----------------------------------------------------------------------------------- report
def format_table(records: Sequence[dict[str, Any]]) -> str:
    """One line per run: K (S for secure aggregation), p, the auction's I and A, measured waves
    against the formula, the calls and the kilobytes of their requests and responses (the
    curator's calls to owners; the owners' calls to the curator for sketch publication), and the
    consumer's kilobytes sent to and received from the curator."""
    head = (
        f"{'protocol':<26} {'K':>2} {'p':>3} {'I/A':>5} {'waves':>5} {'formula':>16} {'pred':>4} "
        f"{'ok':>3} {'calls':>5} {'req kB':>9} {'resp kB':>9} {'cons kB s/r':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        m, c = r["curator_to_owners"], r["consumer_to_curator"]
        auction = f"{r['auction_iterations']}/{r['auction_asked']}" if "+ I" in r["formula"] else ""
        lines.append(
            f"{r['protocol']:<26} {r['k']:>2} {r['p']:>3} {auction:>5} {m['waves']:>5} "
            f"{r['formula']:>16} "
            f"{r['predicted_waves']:>4} {'yes' if r['matches'] else 'NO':>3} {m['calls']:>5} "
            f"{m['request_bytes'] / 1e3:>9.1f} {m['response_bytes'] / 1e3:>9.1f} "
            f"{c['request_bytes'] / 1e3:>6.1f}/{c['response_bytes'] / 1e3:<6.1f}"
        )
    return "\n".join(lines)


def format_wan(records: Sequence[dict[str, Any]]) -> str:
    """One line per WAN run: profile, protocol, waves, wall seconds and waves times RTT."""
    head = (
        f"{'profile':<7} {'protocol':<26} {'K':>2} {'p':>3} {'waves':>5} {'wall s':>7} "
        f"{'waves x RTT s':>13}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['profile']:<7} {r['protocol']:<26} {r['k']:>2} {r['p']:>3} "
            f"{r['curator_to_owners']['waves']:>5} {r['wall_seconds']:>7.2f} "
            f"{r['waves_times_rtt']:>13.2f}"
        )
    return "\n".join(lines)


QUICK_K: tuple[int, ...] = (3,)
QUICK_P: tuple[int, ...] = (2, 4)
DEFAULT_K: tuple[int, ...] = (3, 5)
DEFAULT_P: tuple[int, ...] = (5, 10)
METHODS: tuple[Method, ...] = ("candidates", "private", "greedy", "uniform", "rounds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="K = 3, p in {2, 4}")
    parser.add_argument("--k", type=int, nargs="+", help="owner counts (default 3 5)")
    parser.add_argument("-p", type=int, nargs="+", help="summary sizes and CAPE iterations")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--sites", type=int, nargs="*", help="secure-aggregation sites S (default 5 20)"
    )
    parser.add_argument("--n", type=int, default=200, help="rows per owner (default 200)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--wan",
        nargs="*",
        default=[],
        choices=sorted(WAN_PROFILES),
        help="also time a few protocols on WAN hosts under these dpmarket.deploy.wan profiles "
        "(lan rtt20 rtt100; needs root)",
    )
    parser.add_argument("--into", type=Path, help="merge into this JSON under 'network'")
    parser.add_argument("--out", type=Path, help="write the report alone here")
    parser.add_argument("--work-dir", type=Path, help="data, logs and call records (default: tmp)")
    return parser


def run(
    ks: Sequence[int],
    ps: Sequence[int],
    methods: Sequence[Method],
    work_dir: Path,
    *,
    sites: Sequence[int] = (),
    n_points: int = 200,
    seed: int = 7,
) -> dict[str, Any]:
    """Measure every protocol on a cluster per K, then a secure-aggregation round per S; the
    report of :func:`main`."""
    check_sparse_threshold()
    records: list[dict[str, Any]] = []
    for k in ks:
        records += run_cluster(k, ps, methods, ps, work_dir, n_points=n_points, seed=seed)
    for s in sites:
        records.append(run_secure_aggregation(s, work_dir))
    return {
        "definition": (
            "waves: maximal groups of overlapping [start, end] intervals of the curator's calls "
            "to owners during one request (dpmarket.runtime.rpc_trace.waves); bytes: serialized "
            "protobuf messages (ByteSize), framing not counted"
        ),
        "transport": "grpc-loopback-mtls",
        "formulas": {r.protocol: r.formula for r in ROUND_TRIPS.values()},
        "runs": records,
        "all_match": all(r["matches"] for r in records),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    ks = args.k or (QUICK_K if args.quick else DEFAULT_K)
    ps = args.p or (QUICK_P if args.quick else DEFAULT_P)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        sites = (
            args.sites if args.sites is not None else (QUICK_SITES if args.quick else DEFAULT_SITES)
        )
        report = run(ks, ps, args.methods, work, sites=sites, n_points=args.n, seed=args.seed)
        if args.wan:
            wan = run_wan(args.wan, max(ks), max(ps), work, n_points=args.n, seed=args.seed)
            report["wan"] = wan
            report["all_match"] = report["all_match"] and all(r["matches"] for r in wan)
    print(format_table(report["runs"]))
    if report.get("wan"):
        print()
        print(format_wan(report["wan"]))
    written = write_section(
        "network", report, out=args.out, into=args.into, default_out=Path("out/bench-network.json")
    )
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
