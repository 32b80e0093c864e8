"""Cost of a secure-aggregation round, per phase: in one process, and over gRPC between processes.

For every workload (``S`` sites, vectors of length ``D``, with no dropout or with one site lost
after key sharing, i.e. before its masked input arrives, so the aggregator must rebuild its key
and remove its pairwise masks) a round runs ``--repeat`` times after one warm-up run, on each
transport:

``in-process``
    :func:`dpmarket.common.secagg.protocol.run_in_process`. Everything is sequential: the reported
    seconds are the total work of all ``S`` sites and the aggregator, as one core would do it. The
    sites' identity keys (their certificate keys in the service) are made once per workload, outside
    the timing.
``grpc``
    ``S`` owner processes (``python -m bench.secagg_site``: the real
    :class:`dpmarket.owner.cape_service.SecureAggregationServicer`,
    :class:`dpmarket.owner.secagg.SiteRounds` and :class:`dpmarket.owner.secagg.SiteIdentity`,
    certificates issued by :mod:`dpmarket.deploy.pki`, mTLS) and this process as the curator,
    driving each round with :func:`dpmarket.curator.secagg.aggregate` over
    :class:`dpmarket.curator.owners.GrpcOwnerEndpoint` (``grpc.aio``), as a CAPE job's noise round
    does. The processes start once per ``S`` (start-up is reported apart, never in a round) and
    serve every ``D``: each site holds one benchmark job per length, whose input it draws itself
    (:class:`bench.secagg_site.SyntheticJobs`). The dropout is real: the dropped site's process is
    killed (SIGKILL) as soon as its ShareKeys answer has reached the curator, so the curator's
    MaskedInput call finds nobody (UNAVAILABLE); the kill and the wait until the process is gone
    fall in the ``share_keys`` phase (``median_kill_seconds``). Between rounds, outside the timing,
    the site is restarted, its connection opened and its first round run (untimed, as every site's
    first round is). CPU seconds are those of the curator process and of every site process
    (``/proc/<pid>/stat``, 10 ms ticks), killed ones included.

Each run is a production round: a fresh round id, key material from ``os.urandom``, the rounding
coins from a CSPRNG-seeded generator, every advertisement authenticated to every holder (over
gRPC, with every site's certificate checked against the CA and its name): the binding of the
site's static key, an ECDSA P-256 signature verified once per peer and key for the site's life
(in-process, every site's keyring meets every peer before the warm-up round, as an owner that has
run rounds with its peers has; over gRPC, in the untimed first round), and per round an HMAC under
the pair's key of the round (:mod:`dpmarket.common.secagg.pairkeys`), the
consistency check (every survivor signs the survivor list and checks ``t`` others' signatures
before unmasking), and the threshold a CAPE job of ``S`` sites uses against its default
``S_C = ceil(S / 3) - 1`` colluders: the least ``t`` with ``2 t > S + S_C`` (14 of 20, 4 of 5).
Every result is checked against the plain sum of the survivors' inputs (within the quantization
bound) before it is recorded.

After the grid, in-process: SecAgg+ (:mod:`dpmarket.common.secagg.sparse`) at S = 100, D = 100,000
beside the complete graph (:data:`SCALE_CASES`; the cases S_C = 5 and S_C = 33 — a CAPE job's
default at 100 owners —, allowance 2, carry the 1.0 s targets of :data:`SPARSE_TARGETS`), and
Flower's SecAgg+ (flwr 1.42, :mod:`bench.flower_secaggplus`, run by a Python of its own
virtual environment, ``out/.venv-flower``, made on first use) for the same S and D
(:data:`FLOWER_CASES`), each Flower record with its seconds over ours (``compared_with``).
``--no-scale`` and ``--no-flower`` skip them.

``--baseline TREE`` (a checkout of another revision) runs every in-process case with that tree's
code right before this tree's, both in fresh processes, and records the ratios
(``compared_with_baseline``): how a change's cost is measured on a shared machine.

Run ``python -m bench.secagg --out out/bench-secagg.json``; ``--into out/bench.json`` adds the
records to that JSON object under the key ``secure_aggregation`` (``make bench``); ``--quick``
for a few seconds; ``--transports in-process`` or ``grpc`` for one of them. The records have keys
``sites``, ``vector_length``, ``dropouts``, ``transport`` (``"in-process"`` or ``"grpc"``),
``median_seconds`` (wall clock), ``phases`` (median seconds per phase: ``advertise_keys``,
``share_keys``, ``masked_input``, ``consistency_check``, ``unmask``, ``finish``), and the details
of the run (colluders, threshold, encoding, every run's seconds, CPU seconds, load average, the
target if any).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from numpy.typing import NDArray

from bench.report import write_section
from bench.secagg_site import job_id, synthetic_input
from dpmarket.common.cape.privacy import default_colluders
from dpmarket.common.privacy.rng import production_rng
from dpmarket.common.secagg import run_in_process
from dpmarket.common.secagg.crypto import EcdsaSigner, EcdsaVerifier
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.graph import best_graph
from dpmarket.common.secagg.pairkeys import PairKeyring
from dpmarket.common.secagg.protocol import RoundParams, min_threshold
from dpmarket.curator.owners import CALL_DEADLINE_SECONDS, GrpcOwnerEndpoint
from dpmarket.curator.secagg import aggregate
from dpmarket.deploy.pki import init_ca, issue_all
from dpmarket.runtime.identity import Identity, identity_files
from dpmarket.runtime.transport import TransportSecurity

SITES: tuple[int, ...] = (5, 20)
LENGTHS: tuple[int, ...] = (1_000, 100_000)
DROPOUTS: tuple[int, ...] = (0, 1)
QUICK_SITES: tuple[int, ...] = (3, 5)
QUICK_LENGTHS: tuple[int, ...] = (100, 1_000)
TRANSPORTS: tuple[str, ...] = ("in-process", "grpc")
DEFAULT_REPEAT = 7
#: Inputs in [-CLIP, CLIP] on a grid of 2^RESOLUTION_BITS - 1 steps (k = 32 + ceil(log2 S)).
CLIP = 1.0
RESOLUTION_BITS = 32
#: The targets for S = 20, D = 100,000 on the project's 2-core machine, seconds (the
#: consistency round included).
TARGET_SITES = 20
TARGET_LENGTH = 100_000
TARGET_SECONDS = {"in-process": 0.15, "grpc": 0.5}
#: SecAgg+ at scale, in-process, in the same run: (S, D, S_C, allowance, dropouts); allowance
#: None is the complete graph at CAPE's default S_C. The first sparse case carries the target.
SCALE_CASES: tuple[tuple[int, int, int, int | None, int], ...] = (
    (100, 100_000, 33, None, 0),
    (100, 100_000, 5, 2, 0),
    (100, 100_000, 5, 2, 1),
    (100, 100_000, 5, 5, 0),
    (100, 100_000, 33, 2, 0),
)
QUICK_SCALE_CASES: tuple[tuple[int, int, int, int | None, int], ...] = (
    (40, 1_000, 13, None, 0),
    (40, 1_000, 2, 2, 0),
)
#: The targets of SecAgg+, S = 100, D = 100,000 in one process, 1.0 s each: against 5 colluders
#: (the first target, the case Flower is compared with), and against the 33 a CAPE job of 100
#: owners defends against by default (ceil(S / 3) - 1), with CAPE's allowance of 2.
SPARSE_TARGETS: tuple[dict[str, int], ...] = (
    {"sites": 100, "vector_length": 100_000, "colluders": 5, "allowance": 2},
    {"sites": 100, "vector_length": 100_000, "colluders": 33, "allowance": 2},
)
SPARSE_TARGET = SPARSE_TARGETS[0]
SPARSE_TARGET_SECONDS = 1.0
#: Flower's SecAgg+ in the same run: (S, D, num_shares, reconstruction_threshold); at S = 20 the
#: complete graph with this project's threshold there (14), at S = 100 a ring of 19 (the mean
#: closed neighbourhood of the graph the target case runs, k = 5 and a ring of 8, is 18.0; of
#: the k = 9 graph it ran before, 18.2) with threshold 17.
FLOWER_CASES: tuple[tuple[int, int, int, int], ...] = (
    (20, 100_000, 20, 14),
    (100, 100_000, 19, 17),
)
QUICK_FLOWER_CASES: tuple[tuple[int, int, int, int], ...] = ((5, 1_000, 5, 4),)
FLOWER_VERSION = "1.42.0"
FLOWER_REPEAT = 3
PHASES = (
    "advertise_keys",
    "reveal_nonces",
    "share_keys",
    "masked_input",
    "consistency_check",
    "unmask",
    "finish",
)
#: The curator's certificate name, and the seed of the sites' synthetic inputs (gRPC).
CURATOR = "curator"
INPUT_SEED = 20240601
#: Seconds to wait for the site processes of one S to report their ports.
START_TIMEOUT_SECONDS = 180.0
ROOT = Path(__file__).resolve().parents[1]


def colluders_for(sites: int) -> int:
    """``S_C`` of a CAPE job of ``S`` sites by default: ``ceil(S / 3) - 1`` (6 for ``S = 20``)."""
    return default_colluders(sites)


def threshold_for(sites: int) -> int:
    """The smallest threshold allowed against :func:`colluders_for` colluders: the least ``t``
    with ``2 t > S + S_C`` (:func:`dpmarket.common.secagg.protocol.min_threshold`)."""
    return min_threshold(sites, colluders_for(sites))

    return sites // 2 + 1


def site_names(sites: int) -> list[str]:
    """The owner names of a workload, sorted; the dropped site is the second."""
    return [f"owner-{i:02d}" for i in range(sites)]


def _check_sum(result: NDArray[np.float64], expected: NDArray[np.float64], bound: float) -> float:
    """The largest error of ``result``; raise unless it is below the quantization bound."""
    error = float(np.max(np.abs(result - expected)))
    if not error < bound:
        raise AssertionError(f"sum off by {error}, above the quantization bound {bound}")
    return error


def _target(sites: int, length: int, transport: str, median: float) -> dict[str, Any]:
    if sites != TARGET_SITES or length != TARGET_LENGTH:
        return {}
    limit = TARGET_SECONDS[transport]
    return {"target_seconds": limit, "target_met": median <= limit}


def _summary(
    walls: Sequence[float], phases: Sequence[Mapping[str, float]], cpus: Sequence[float]
) -> dict[str, Any]:
    return {
        "median_seconds": statistics.median(walls),
        "phases": {p: statistics.median(ph.get(p, 0.0) for ph in phases) for p in PHASES},
        "median_cpu_seconds": statistics.median(cpus),
        "runs_seconds": list(walls),
    }


# ------------------------------------------------------------------------------ in-process
def measure(
    sites: int,
    length: int,
    dropouts: int,
    repeat: int,
    *,
    colluders: int | None = None,
    allowance: int | None = None,
) -> dict[str, Any]:
    """Time ``repeat`` in-process rounds (after a warm-up) of one workload; return its record.

    The complete graph against ``colluders`` (CAPE's default for ``sites`` when ``None``) with
    the least threshold, or, with ``allowance``, SecAgg+'s sparse graph of least mean degree
    meeting the 2^-40 target (:func:`dpmarket.common.secagg.graph.best_graph`: ``k`` choices
    per site and a ring)."""
    names = site_names(sites)
    keys = {name: ec.generate_private_key(ec.SECP256R1()) for name in names}
    signers = {name: EcdsaSigner(key) for name, key in keys.items()}
    verifier = EcdsaVerifier({name: key.public_key() for name, key in keys.items()})
    # Each site's long-lived pair keys, as an owner process holds them across rounds and jobs:
    # every peer's static-key binding verified and every pair key derived once, here, outside
    # the timing (a site pays this once per peer for its static key's life, not per round).
    # Timed apart (``first_meeting_cpu_seconds``): what a fresh owner's first rounds add, at
    # most, before its keyring has met every peer (a sparse graph meets only its neighbours).
    first_meeting = time.process_time()
    keyrings = {name: PairKeyring(name, signer) for name, signer in signers.items()}
    for name, keyring in keyrings.items():
        for peer, other in keyrings.items():
            if peer != name:
                keyring.pair_key(peer, other.current.public, other.current.signature, verifier)
    first_meeting = time.process_time() - first_meeting
    fixed_point = FixedPoint(CLIP, RESOLUTION_BITS, sites)
    colluders = colluders_for(sites) if colluders is None else colluders
    graph: dict[str, Any] = {"graph": "complete"}
    if allowance is None:
        threshold, neighbours, ring = min_threshold(sites, colluders), 0, 0
    else:
        plan = best_graph(sites, colluders, allowance)
        if plan is None:
            raise SystemExit(f"no sparse graph for S={sites}, S_C={colluders}, {allowance=}")
        threshold, neighbours, ring = 0, plan.neighbours, plan.ring
        graph = {
            "graph": "sparse",
            "neighbours": neighbours,
            "ring": ring,
            "allowance": allowance,
            "mean_degree": plan.mean_degree,
            "failure_bound": plan.failure,
        }
    data_rng = np.random.default_rng(sites * 1_000_003 + length)
    inputs = {name: data_rng.uniform(-CLIP, CLIP, length) for name in names}
    drop_at: dict[str, Any] = {name: "mask" for name in names[1 : 1 + dropouts]}
    expected = np.sum([inputs[n] for n in names if n not in drop_at], axis=0)
    bound = (sites - dropouts) / fixed_point.scale

    walls: list[float] = []
    cpus: list[float] = []
    phases: list[dict[str, float]] = []
    max_error = 0.0
    load_before = os.getloadavg()[0]
    for run in range(repeat + 1):
        params = RoundParams.create(
            names,
            threshold,
            length,
            fixed_point,
            colluders=colluders,
            neighbours=neighbours,
            allowance=allowance or 0,
            ring=ring,
        )
        phase_seconds: dict[str, float] = {}
        wall, cpu = time.perf_counter(), time.process_time()
        result = run_in_process(
            params,
            inputs,
            drop_at=drop_at,
            signers=signers,
            verifier=verifier,
            rng=production_rng(),
            phase_seconds=phase_seconds,
            keyrings=keyrings,
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        error = _check_sum(result, expected, bound)
        if run == 0:
            continue  # warm-up: first-use allocations and imports
        walls.append(wall)
        cpus.append(cpu)
        phases.append(phase_seconds)
        max_error = max(max_error, error)
    summary = _summary(walls, phases, cpus)
    return {
        "sites": sites,
        "vector_length": length,
        "dropouts": dropouts,
        "transport": "in-process",
        **summary,
        "repeat": repeat,
        "colluders": colluders,
        "threshold": threshold,
        **graph,
        "dropped_after": "share_keys" if dropouts else None,
        "resolution_bits": RESOLUTION_BITS,
        "modulus_bits": fixed_point.modulus_bits,
        "max_abs_error": max_error,
        "error_bound": bound,
        "first_meeting_cpu_seconds": first_meeting,
        "first_meetings": sites * (sites - 1),
        "loadavg_1min_before": load_before,
        "loadavg_1min_after": os.getloadavg()[0],
        **(
            _target(sites, length, "in-process", summary["median_seconds"])
            if allowance is None
            else _sparse_target(sites, length, colluders, allowance, summary)
        ),
    }


def _sparse_target(
    sites: int, length: int, colluders: int, allowance: int, summary: Mapping[str, Any]
) -> dict[str, Any]:
    case = {"sites": sites, "vector_length": length, "colluders": colluders}
    if {**case, "allowance": allowance} not in SPARSE_TARGETS:
        return {}
    return {
        "target_seconds": SPARSE_TARGET_SECONDS,
        "target_met": summary["median_seconds"] <= SPARSE_TARGET_SECONDS,
        "target_met_in_cpu_seconds": summary["median_cpu_seconds"] <= SPARSE_TARGET_SECONDS,
    }


def measure_in(tree: Path, **case: Any) -> dict[str, Any]:
    """:func:`measure` of ``case`` with the code of another source tree (``tree``'s
    ``bench.secagg``, ``common`` and ``protos``), in a process of its own.

    Raises
    ------
    subprocess.CalledProcessError
        If the run fails (its stderr is in the exception).
    """
    code = (
        "import json, sys; from bench.secagg import measure; "
        "print(json.dumps(measure(**json.loads(sys.argv[1]))))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "protos")])}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(case)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def measure_against(baseline: Path, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each in-process case with the baseline tree's code, then with this tree's, back to back
    (both in fresh processes: the same load, the same start), so that a change's cost is read
    off one run. This tree's records carry ``compared_with_baseline`` (CPU and wall-clock
    ratios); the baseline's have the transport ``"in-process baseline"``."""
    records: list[dict[str, Any]] = []
    for case in cases:
        base = measure_in(baseline, **case)
        ours = measure_in(ROOT, **case)
        base["transport"] = "in-process baseline"
        base["source"] = str(baseline)
        ours["compared_with_baseline"] = {
            "baseline": str(baseline),
            "cpu_ratio": ours["median_cpu_seconds"] / base["median_cpu_seconds"],
            "wall_ratio": ours["median_seconds"] / base["median_seconds"],
        }
        records += [ours, base]
    return records


def measure_scale(
    cases: Sequence[tuple[int, int, int, int | None, int]], repeat: int
) -> list[dict[str, Any]]:
    """The SecAgg+ cases (:data:`SCALE_CASES`) and the complete graph beside them, in-process."""
    return [
        measure(s, d, drop, repeat, colluders=sc, allowance=allowance)
        for s, d, sc, allowance, drop in cases
    ]


# -------------------------------------------------------------------------------- Flower
def flower_python(venv: Path) -> Path:
    """The Python of a virtual environment holding flwr (``FLOWER_VERSION``), made on first use
    apart from the project's (Flower pins grpcio and protobuf)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"flwr=={FLOWER_VERSION}"],
            check=True,
        )
    return python


def measure_flower(
    cases: Sequence[tuple[int, int, int, int]], repeat: int, venv: Path
) -> list[dict[str, Any]]:
    """Flower's SecAgg+ (:mod:`bench.flower_secaggplus`, run by the Flower environment's Python)
    for each (S, D, num_shares, threshold); its records, ``transport`` ``"flower-in-process"``."""
    python = flower_python(venv)
    records = []
    for sites, length, shares, threshold in cases:
        load_before = os.getloadavg()[0]
        done = subprocess.run(
            [
                str(python),
                str(ROOT / "bench" / "flower_secaggplus.py"),
                "--sites",
                str(sites),
                "--lengths",
                str(length),
                "--num-shares",
                str(shares),
                "--thresholds",
                str(threshold),
                "--repeat",
                str(repeat),
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        for line in done.stdout.splitlines():
            record = json.loads(line)
            record.update(
                transport="flower-in-process",
                dropouts=0,
                graph="ring" if shares < sites else "complete",
                loadavg_1min_before=load_before,
                loadavg_1min_after=os.getloadavg()[0],
            )
            records.append(record)
    return records


def flower_ratios(
    ours: Sequence[Mapping[str, Any]], flower: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Flower's seconds over ours for the same S and D without dropout: at S = 20 against our
    complete graph, at larger S against our sparse target case (ring of similar size)."""
    out = []
    for f in flower:
        matches = [
            r
            for r in ours
            if r["transport"] == "in-process"
            and r["sites"] == f["sites"]
            and r["vector_length"] == f["vector_length"]
            and r["dropouts"] == 0
            and (
                r.get("graph") == "complete"
                if f["graph"] == "complete"
                else r.get("allowance") == SPARSE_TARGET["allowance"]
                and r["colluders"] == SPARSE_TARGET["colluders"]
            )
        ]
        for r in matches[:1]:
            out.append(
                {
                    "sites": f["sites"],
                    "vector_length": f["vector_length"],
                    "flower_graph": f["graph"],
                    "flower_num_shares": f["num_shares"],
                    "ours_graph": r.get("graph", "complete"),
                    "ours_neighbours": r.get("neighbours"),
                    "flower_over_ours_seconds": f["median_seconds"] / r["median_seconds"],
                    "flower_over_ours_cpu_seconds": f["median_cpu_seconds"]
                    / r["median_cpu_seconds"],
                }
            )
    return out


# ------------------------------------------------------------------------------------ gRPC
def _process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process, all its threads (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: state is field 3 of stat(5), utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SiteProcesses:
    """The site processes of one workload on 127.0.0.1, over mTLS (:func:`running_sites`).

    Parameters
    ----------
    names : sequence of str
        Owner names; each has a certificate in ``pki_dir``.
    pki_dir : Path
        The CA's certificate and every party's key and certificate
        (:func:`dpmarket.deploy.pki.issue`).
    lengths : sequence of int
        The vector lengths the sites hold a job for.
    work_dir : Path
        Port files and logs.

    Raises
    ------
    RuntimeError
        If a process exits or does not report its port within ``START_TIMEOUT_SECONDS``.
    """

    def __init__(
        self, names: Sequence[str], pki_dir: Path, lengths: Sequence[int], work_dir: Path
    ) -> None:
        self.names = list(names)
        self.pki_dir = pki_dir
        self.lengths = list(lengths)
        self.work_dir = work_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self._killed_cpu = 0.0
        self.kill_seconds: list[float] = []

    def _port_file(self, name: str) -> Path:
        return self.work_dir / f"{name}.port"

    def _log_file(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    def start(self, names: Sequence[str]) -> None:
        """Start the named sites, all at once, and wait until each serves."""
        for name in names:
            self._port_file(name).unlink(missing_ok=True)
            with self._log_file(name).open("ab") as log:
                self.processes[name] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.secagg_site",
                        "--pki-dir",
                        str(self.pki_dir),
                        "--name",
                        name,
                        "--curator",
                        CURATOR,
                        "--lengths",
                        *map(str, self.lengths),
                        "--seed",
                        str(INPUT_SEED),
                        "--clip",
                        str(CLIP),
                        "--port-file",
                        str(self._port_file(name)),
                    ],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        for name in names:
            port_file, process = self._port_file(name), self.processes[name]
            while not port_file.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    text = self._log_file(name).read_text(encoding="utf-8", errors="replace")
                    raise RuntimeError(f"site {name} did not start; its log ends:\n{text[-2000:]}")
                time.sleep(0.02)
            self.ports[name] = int(port_file.read_text(encoding="utf-8"))

    def target(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by every site process, those killed included."""
        live = (_process_cpu_seconds(p.pid) for p in self.processes.values() if p.poll() is None)
        return self._killed_cpu + sum(c for c in live if c is not None)

    def kill(self, name: str) -> None:
        """Kill a site abruptly (SIGKILL), as a crashed machine vanishes, and wait until it is
        gone; keep its CPU seconds and the seconds this took (``kill_seconds``)."""
        process = self.processes[name]
        self._killed_cpu += _process_cpu_seconds(process.pid) or 0.0
        started = time.perf_counter()
        process.kill()
        process.wait()
        self.kill_seconds.append(time.perf_counter() - started)

    def stop(self) -> None:
        """SIGTERM every site (graceful), then SIGKILL after 10 s."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def running_sites(
    names: Sequence[str], pki_dir: Path, lengths: Sequence[int], work_dir: Path
) -> Iterator[SiteProcesses]:
    """Start the sites (:class:`SiteProcesses`), and stop them on the way out, whatever happens."""
    processes = SiteProcesses(names, pki_dir, lengths, work_dir)
    try:
        processes.start(names)
        yield processes
    finally:
        processes.stop()


class SiteEndpoint(GrpcOwnerEndpoint):
    """The curator's real endpoint of a benchmark site, whose process can be made to die.

    With ``dies_after_sharing`` set, the site's process is killed (SIGKILL) as soon as its
    ShareKeys answer has reached the curator; its MaskedInput call then fails (UNAVAILABLE) and
    the curator counts it as dropped after key sharing.
    """

    def __init__(self, processes: SiteProcesses, security: TransportSecurity, name: str) -> None:
        super().__init__(processes.target(name), security, Identity("owner", name))
        self.processes = processes
        self.dies_after_sharing = False

    async def share_keys(self, *args: Any, **kwargs: Any) -> dict[str, bytes]:
        out = await super().share_keys(*args, **kwargs)
        if self.dies_after_sharing:
            await asyncio.to_thread(self.processes.kill, self.name)
        return out


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence a logger's warnings (each dropout's); the records say who dropped and why."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


async def _connect(
    processes: SiteProcesses, security: TransportSecurity, name: str
) -> SiteEndpoint:
    """The curator's endpoint of a running site, connected (handshake done)."""
    endpoint = SiteEndpoint(processes, security, name)
    await endpoint.connect()
    return endpoint


async def _measure_grpc_workloads(
    processes: SiteProcesses,
    security: TransportSecurity,
    lengths: Sequence[int],
    repeat: int,
    startup_seconds: float,
) -> list[dict[str, Any]]:
    """Every (D, dropouts) case of one S on running site processes."""
    names = processes.names
    sites = len(names)
    endpoints = {n: await _connect(processes, security, n) for n in names}
    fixed_point = FixedPoint(CLIP, RESOLUTION_BITS, sites)
    threshold, colluders = threshold_for(sites), colluders_for(sites)
    records = []
    try:
        for length in lengths:
            inputs = {n: synthetic_input(n, length, INPUT_SEED, CLIP) for n in names}
            for dropouts in DROPOUTS:
                lost = names[1 : 1 + dropouts]
                survivors = tuple(n for n in names if n not in lost)
                expected = np.sum([inputs[n] for n in survivors], axis=0)
                bound = len(survivors) / fixed_point.scale
                walls: list[float] = []
                cpus: list[float] = []
                curator_cpus: list[float] = []
                phases: list[dict[str, float]] = []
                max_error = 0.0
                reason = None
                processes.kill_seconds.clear()
                load_before = os.getloadavg()[0]
                for run in range(repeat + 1):
                    for name in lost:
                        endpoints[name].dies_after_sharing = True
                    params = RoundParams.create(
                        names, threshold, length, fixed_point, colluders=colluders
                    )
                    phase_seconds: dict[str, float] = {}
                    sites_cpu, cpu = processes.cpu_seconds(), time.process_time()
                    wall = time.perf_counter()
                    outcome = await aggregate(
                        endpoints,
                        job_id(length),
                        params,
                        timeout=CALL_DEADLINE_SECONDS,
                        phase_seconds=phase_seconds,
                    )
                    wall = time.perf_counter() - wall
                    cpu = time.process_time() - cpu
                    sites_cpu = processes.cpu_seconds() - sites_cpu
                    if outcome.survivors != survivors or set(outcome.dropped) != set(lost):
                        raise AssertionError(
                            f"survivors {outcome.survivors}, dropped {outcome.dropped}: expected "
                            f"{len(lost)} site(s) lost after key sharing"
                        )
                    error = _check_sum(outcome.total, expected, bound)
                    reason = next(iter(outcome.dropped.values()), None)
                    for name in lost:  # back up for the next round, outside the timing
                        await endpoints[name].close()
                        await asyncio.to_thread(processes.start, [name])
                        endpoints[name] = await _connect(processes, security, name)
                    if lost:  # the new process's first round, untimed as every site's first
                        warm = RoundParams.create(
                            names, threshold, length, fixed_point, colluders=colluders
                        )
                        await aggregate(endpoints, job_id(length), warm)
                    if run == 0:
                        continue  # warm-up: first-use allocations, connections' first streams
                    walls.append(wall)
                    cpus.append(cpu + sites_cpu)
                    curator_cpus.append(cpu)
                    phases.append(phase_seconds)
                    max_error = max(max_error, error)
                summary = _summary(walls, phases, cpus)
                records.append(
                    {
                        "sites": sites,
                        "vector_length": length,
                        "dropouts": dropouts,
                        "transport": "grpc",
                        **summary,
                        "median_curator_cpu_seconds": statistics.median(curator_cpus),
                        "repeat": repeat,
                        "colluders": colluders,
                        "threshold": threshold,
                        "dropped_after": "share_keys" if dropouts else None,
                        "dropout": (
                            "the site's process is killed (SIGKILL) once its ShareKeys answer "
                            "has arrived; restarted between rounds"
                            if dropouts
                            else None
                        ),
                        "dropped_reason": reason,
                        "median_kill_seconds": (
                            statistics.median(processes.kill_seconds[1:]) if dropouts else None
                        ),
                        "resolution_bits": RESOLUTION_BITS,
                        "modulus_bits": fixed_point.modulus_bits,
                        "masked_input_bytes": 8 * length,
                        "max_abs_error": max_error,
                        "error_bound": bound,
                        "site_processes": sites,
                        "startup_seconds": startup_seconds,
                        "loadavg_1min_before": load_before,
                        "loadavg_1min_after": os.getloadavg()[0],
                        **_target(sites, length, "grpc", summary["median_seconds"]),
                    }
                )
    finally:
        for endpoint in endpoints.values():
            await endpoint.close()
    return records


def measure_grpc(
    site_counts: Sequence[int], lengths: Sequence[int], repeat: int
) -> list[dict[str, Any]]:
    """For each S, start S site processes, time every (D, dropouts) case; return the records."""
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpmarket-bench-secagg-") as tmp:
        work = Path(tmp)
        pki_dir = work / "pki"
        init_ca(pki_dir)
        curator = Identity("curator", CURATOR)
        names = site_names(max(site_counts))
        issue_all(pki_dir, [curator, *(Identity("owner", n) for n in names)])
        security = TransportSecurity.from_files(*identity_files(pki_dir, curator))
        for sites in site_counts:
            started = time.perf_counter()
            with running_sites(site_names(sites), pki_dir, lengths, work) as processes:
                startup = time.perf_counter() - started
                with _quiet("dpmarket.curator.secagg"):
                    records += asyncio.run(
                        _measure_grpc_workloads(processes, security, lengths, repeat, startup)
                    )
    return records


# ------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.secagg", description=__doc__)
    parser.add_argument(
        "--out", type=Path, help="write the records as a JSON list (default out/bench-secagg.json)"
    )
    parser.add_argument(
        "--into",
        type=Path,
        help="add the records to this JSON object under 'secure_aggregation' (make bench)",
    )
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="timed runs per case")
    parser.add_argument("--sites", type=int, nargs="+", help=f"site counts (default {SITES})")
    parser.add_argument(
        "--lengths", type=int, nargs="+", help=f"vector lengths (default {LENGTHS})"
    )
    parser.add_argument(
        "--transports",
        nargs="+",
        choices=TRANSPORTS,
        default=list(TRANSPORTS),
        help="in-process, grpc (S owner processes over mTLS), or both (default)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and 2 runs each: a few seconds"
    )
    parser.add_argument(
        "--no-scale",
        dest="scale",
        action="store_false",
        help="skip SecAgg+ at S = 100 and the complete graph beside it (in-process)",
    )
    parser.add_argument(
        "--no-flower",
        dest="flower",
        action="store_false",
        help="skip Flower's SecAgg+ (the anchor, run in its own virtual environment)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a source tree of another revision (e.g. `git worktree add /tmp/main main`): every "
        "in-process case also runs with its code, right before this tree's (both in fresh "
        "processes), and the records carry the ratios",
    )
    parser.add_argument(
        "--flower-venv",
        type=Path,
        default=Path("out/.venv-flower"),
        help=f"where flwr {FLOWER_VERSION} is installed on first use (default out/.venv-flower)",
    )
    return parser


def _graph_cell(r: Mapping[str, Any]) -> str:
    if r.get("graph") == "sparse":
        ring = f"+r{r['ring']}" if r.get("ring") else ""
        return f"k={r['neighbours']}{ring},D={r['allowance']},Sc={r['colluders']}"
    if r.get("graph") == "ring":
        return f"ring {r['num_shares']}"
    return f"complete,Sc={r['colluders']}" if "colluders" in r else "complete"


def format_table(records: Sequence[Mapping[str, Any]]) -> str:
    """One line per record: transport, S, D, dropouts, graph, median seconds, CPU, phases."""
    lines = [
        f"{'transport':>17} {'S':>3} {'D':>8} {'drop':>4} {'graph':>17} {'median s':>9} "
        f"{'cpu s':>7}  " + " ".join(f"{p:>14}" for p in PHASES)
    ]
    for r in records:
        phases = r.get("phases", {})
        cells = " ".join(f"{phases.get(p, 0.0):>14.4f}" for p in PHASES)
        lines.append(
            f"{r['transport']:>17} {r['sites']:>3} {r['vector_length']:>8} {r['dropouts']:>4} "
            f"{_graph_cell(r):>17} {r['median_seconds']:>9.4f} {r['median_cpu_seconds']:>7.3f}  "
            f"{cells}"
        )
    for r in records:
        for c in r.get("compared_with", []):
            lines.append(
                f"Flower SecAgg+ ({r['graph']} of {r['num_shares']}) / ours ({c['ours_graph']}"
                f"{'' if c['ours_neighbours'] is None else ', k=' + str(c['ours_neighbours'])}) "
                f"at S={r['sites']}, D={r['vector_length']:,}: "
                f"{c['flower_over_ours_seconds']:.1f}x the seconds, "
                f"{c['flower_over_ours_cpu_seconds']:.1f}x the CPU seconds"
            )
    for r in records:
        if "compared_with_baseline" in r:
            c = r["compared_with_baseline"]
            lines.append(
                f"this tree / baseline at S={r['sites']}, D={r['vector_length']:,}, "
                f"{r['dropouts']} dropout(s), {_graph_cell(r)}: {c['cpu_ratio']:.3f}x the CPU "
                f"seconds, {c['wall_ratio']:.3f}x the seconds"
            )
    for r in records:
        if "target_seconds" in r:
            verdict = "met" if r["target_met"] else "NOT met"
            lines.append(
                f"target S={r['sites']}, D={r['vector_length']:,}, {r['transport']}, "
                f"{r['dropouts']} dropout(s): {r['median_seconds']:.3f} s <= "
                f"{r['target_seconds']} s {verdict}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the grid, write the records, print a table; return the records."""
    args = build_parser().parse_args(argv)
    sites = tuple(args.sites or (QUICK_SITES if args.quick else SITES))
    lengths = tuple(args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS))
    repeat = 2 if args.quick else args.repeat
    if repeat < 1:
        raise SystemExit(f"--repeat must be >= 1, got {repeat}")
    bad = [s for s in sites if s < 3]
    if bad:
        raise SystemExit(f"--sites must be >= 3 (t > S/2 must survive a dropout), got {bad}")
    records: list[dict[str, Any]] = []
    if "in-process" in args.transports and args.baseline is not None:
        cases: list[dict[str, Any]] = [
            {"sites": s, "length": d, "dropouts": drop, "repeat": repeat}
            for s in sites
            for d in lengths
            for drop in DROPOUTS
        ]
        if args.scale:
            cases += [
                {"sites": s, "length": d, "dropouts": drop, "repeat": repeat,
                 "colluders": sc, "allowance": allowance}
                for s, d, sc, allowance, drop in (QUICK_SCALE_CASES if args.quick else SCALE_CASES)
            ]  # fmt: skip
        records += measure_against(args.baseline.resolve(), cases)
    elif "in-process" in args.transports:
        records += [
            measure(s, d, drop, repeat) for s in sites for d in lengths for drop in DROPOUTS
        ]
        if args.scale:
            records += measure_scale(QUICK_SCALE_CASES if args.quick else SCALE_CASES, repeat)
    if args.flower:
        flower = measure_flower(
            QUICK_FLOWER_CASES if args.quick else FLOWER_CASES,
            1 if args.quick else FLOWER_REPEAT,
            args.flower_venv,
        )
        in_process = records + (
            [measure(s, d, 0, repeat) for s, d, _, _ in QUICK_FLOWER_CASES] if args.quick else []
        )
        for record in flower:
            record["compared_with"] = flower_ratios(in_process, [record])
        records += flower
    if "grpc" in args.transports:
        records += measure_grpc(sites, lengths, repeat)
    written = write_section(
        "secure_aggregation",
        records,
        out=args.out,
        into=args.into,
        default_out=Path("out/bench-secagg.json"),
    )
    print(format_table(records))
    for path in written:
        print(f"wrote {path}")
    return records


if __name__ == "__main__":
    main()
