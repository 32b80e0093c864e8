"""Cost of an owner's budget decision against the length of its ledger's history.

Every release an owner makes is first charged to its durable ledger (:class:`dpmarket.owner.ledger.
OwnerLedger`): one ``BEGIN IMMEDIATE`` transaction that sums what is spent, decides, inserts,
chains the charge to the one before it (a SHA-256 over the previous hash and the row) and
commits with ``synchronous=FULL``. An owner serves sessions for months, so the decision must not
grow with the history. For each history length H this benchmark writes H earlier charges (spread
over the last 365 days, in one transaction, as many sessions of 50 rounds) into a fresh ledger, then
times :meth:`~dpmarket.owner.ledger.OwnerLedger.charge` and
:meth:`~dpmarket.owner.ledger.OwnerLedger.check` of one more step, under a lifetime policy (decided
from the running totals) and under a 30-day rolling window (decided from the window's charges, found
by their time index).

Run ``python -m bench.ledger --into out/bench.json`` (``make bench``), or ``--quick``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.report import configure_logging, write_section
from bench.rounds import machine_info
from dpmarket.owner.ledger import DAY, OwnerLedger, ledger_path
from dpmarket.owner.ledger_chain import charge_hash, genesis
from dpmarket.owner.policy import OwnerPolicy

logger = logging.getLogger("bench.ledger")

HISTORIES: tuple[int, ...] = (0, 1_000, 10_000, 100_000)
QUICK_HISTORIES: tuple[int, ...] = (0, 200)
#: Timed steps per history and policy (the median is reported).
STEPS = 40
QUICK_STEPS = 5
#: Epsilon of one earlier charge and of the timed step (a round's bid release).
EPSILON = 0.01
NOW = 1.9e9
#: Budgets large enough that no step is refused: the decision is timed, not the refusal.
POLICIES = {
    "lifetime": OwnerPolicy(
        epsilon_total=1e9, delta_total=0.5, points_total=10**12, window_days=0.0
    ),
    "window_30_days": OwnerPolicy(
        epsilon_total=1e9, delta_total=0.5, points_total=10**12, window_days=30.0
    ),
}


def write_history(data_dir: Path, policy: OwnerPolicy, history: int) -> None:
    """Create a ledger under ``policy`` and add ``history`` charges of :data:`EPSILON`, one
    point each, dated uniformly over the 365 days before :data:`NOW`, in one transaction (the
    ledger's trigger keeps its running totals), each chained as a charge is
    (:func:`dpmarket.owner.ledger_chain.charge_hash`), so the timed charges extend a chain of that
    length."""
    OwnerLedger.create(data_dir, policy, clock=lambda: NOW).close()
    rows = [
        (j + 1, NOW - 365 * DAY * (j + 1) / max(history, 1), f"s{j // 50}", EPSILON)
        for j in range(history)
    ]
    with closing(sqlite3.connect(ledger_path(data_dir))) as conn, conn:
        conn.executemany(
            "INSERT INTO charges (id, at, session, consumer, curator, mechanism, epsilon, delta, "
            "points, non_private) VALUES (?, ?, ?, 'consumer', 'curator', 'bid', ?, 0, 1, 0)",
            rows,
        )
        (ledger_id,) = conn.execute("SELECT ledger_id FROM ledger_identity").fetchone()
        chain, previous = [], genesis(ledger_id)
        for charge_id, at, session, epsilon in rows:
            row = (charge_id, at, session, "consumer", "curator", "bid", epsilon, 0.0, 1, 0)
            previous = charge_hash(previous, row)
            chain.append((charge_id, previous))
        conn.executemany("INSERT INTO charge_chain (charge, hash) VALUES (?, ?)", chain)


def time_steps(data_dir: Path, policy: OwnerPolicy, steps: int) -> dict[str, float]:
    """Milliseconds to open the ledger (the owner's check of its whole history at start:
    :mod:`dpmarket.owner.ledger_guard`), and the median of ``steps`` charges and of ``steps``
    checks of one more step."""
    t0 = time.perf_counter()
    opened = OwnerLedger(data_dir, policy, clock=lambda: NOW)
    open_ms = 1e3 * (time.perf_counter() - t0)
    with opened as ledger:
        charge: list[float] = []
        check: list[float] = []
        for _ in range(steps):
            for calls, method in ((check, ledger.check), (charge, ledger.charge)):
                t0 = time.perf_counter()
                method(
                    session="timed",
                    consumer="consumer",
                    curator="curator",
                    mechanism="bid",
                    epsilon=EPSILON,
                    delta=0.0,
                    points=1,
                )
                calls.append(time.perf_counter() - t0)
        spent = ledger.window_totals()
    return {
        "open_ms": open_ms,
        "charge_ms": 1e3 * statistics.median(charge),
        "check_ms": 1e3 * statistics.median(check),
        "window_epsilon": spent.epsilon,
        "window_points": spent.points,
    }


def run(histories: Sequence[int], steps: int) -> list[dict[str, Any]]:
    """One record per (history, policy)."""
    records = []
    for history in histories:
        for name, policy in POLICIES.items():
            with tempfile.TemporaryDirectory(prefix="dpmarket-bench-ledger-") as tmp:
                data_dir = Path(tmp) / "owner"
                write_history(data_dir, policy, history)
                timed = time_steps(data_dir, policy, steps)
            records.append({"history": history, "policy": name, "steps": steps, **timed})
            logger.info(
                "history %7d, %-14s: charge %.2f ms, check %.3f ms",
                history,
                name,
                timed["charge_ms"],
                timed["check_ms"],
            )
    return records


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="histories 0 and 200, 5 steps")
    parser.add_argument("--out", type=Path, help="write the report alone to this JSON file")
    parser.add_argument("--into", type=Path, help="merge the report into this JSON file")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the report (under ``"owner_ledger"``), print the table."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    started = time.perf_counter()
    histories = QUICK_HISTORIES if args.quick else HISTORIES
    steps = QUICK_STEPS if args.quick else STEPS
    records = run(histories, steps)
    report = {
        "benchmark": "bench.ledger",
        "machine": machine_info(),
        "parameters": {"histories": list(histories), "steps": steps, "epsilon": EPSILON},
        "units": {"open_ms": "ms, once", "charge_ms": "ms, median", "check_ms": "ms, median"},
        "cases": records,
        "seconds": time.perf_counter() - started,
    }
    print(f"{'history':>8} {'policy':<15} {'open ms':>9} {'charge ms':>10} {'check ms':>9}")
    for r in records:
        print(
            f"{r['history']:>8} {r['policy']:<15} {r['open_ms']:>9.1f} {r['charge_ms']:>10.2f} "
            f"{r['check_ms']:>9.3f}"
        )
    largest = [r for r in records if r["history"] == max(histories)]
    smallest = [r for r in records if r["history"] == min(histories)]
    for big, small in zip(largest, smallest, strict=True):
        ratio = big["check_ms"] / small["check_ms"] if small["check_ms"] > 0 else math.nan
        print(
            f"{big['policy']}: a check after {big['history']:,} charges costs x{ratio:.2f} "
            f"one after {small['history']:,}"
        )
    for path in write_section(
        "owner_ledger",
        report,
        out=args.out,
        into=args.into,
        default_out=Path("out/bench-ledger.json"),
    ):
        logger.info("report -> %s", path)
    return report


if __name__ == "__main__":
    main()
