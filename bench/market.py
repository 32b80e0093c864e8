"""What the market adds to a session: attribution (the payout release) and settlement, timed
against a default session (issue 29's cost goal: at most 10 % at K = 16, p = 200).

The session is the default method (candidates, every parameter at its default) run in process
(:func:`dpmarket.experiments.runner.simulate`: no network, so its time is the smallest a session
takes, and the market's share of it the largest). The market's part is everything the curator
and the owners compute for it after the summary exists:

* attribution: the kernel blocks of the summary against D_v (:class:`SummaryBlocks`) and the
  private payout release (:func:`release_payouts`, a value reward at epsilon 1);
* settlement at the curator: the quote, the statement (:func:`settle`), its signature and every
  owner's part signed (ECDSA P-256);
* at each owner (on its own machine, all owners at once, after the consumer has its summary: the
  parts are delivered off the consumer's path): the signature verified and
  :func:`check_statement`, reported per owner and not added to the session's time.

(The durable writes, a row per statement and per owner part in SQLite, and one RecordStatement
call per owner are not in the in-process figure; they are a few milliseconds each.)

Usage::

    python -m bench.market --out out/bench-market.json     # K = 16, p = 200, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from bench.rounds import Workload, make_data
from dpmarket.common.market.attribution import SummaryBlocks
from dpmarket.common.market.payouts import release_payouts
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.statement import (
    OwnerRecord,
    SessionRecord,
    check_statement,
    settle,
    sign_statement,
    verify_statement,
)
from dpmarket.common.market.terms import RewardOffer, owner_payout_epsilon, session_quote
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.summarization.methods import CandidatesConfig
from dpmarket.experiments.runner import simulate

PRICES = OwnerPrices(10_000, 50_000, 2_000_000, 1_000_000)


def market_seconds(result: Any, validation: np.ndarray, gamma: float, k: int) -> dict[str, float]:
    """Time the attribution and the settlement of one finished session."""
    owners = sorted({f"owner-{i:02d}" for i in range(k)})
    p, m = len(result.owner_ids), len(validation)
    reward = RewardOffer("value", 5_000_000, 1.0)
    settlement = reward.settlement(p, m)
    key = ec.generate_private_key(ec.SECP256R1())

    start = time.perf_counter()
    blocks = SummaryBlocks.from_summary(
        result.points, list(result.owner_ids), validation, gamma, owners=owners
    )
    release = release_payouts(blocks, 1.0, settlement.rule(), SeededNoise(np.random.default_rng(0)))  # type: ignore[arg-type]
    attribution = time.perf_counter() - start

    start = time.perf_counter()
    read = {o: int(result.report.owner_spend[o].points) for o in owners}
    eps = {o: float(result.report.owner_spend[o].epsilon) for o in owners}
    quoted = session_quote(dict.fromkeys(owners, PRICES), read, max(eps.values()), settlement)
    delivered = {o: list(result.owner_ids).count(o) for o in owners}
    payout = owner_payout_epsilon(settlement)
    records = {
        o: SessionRecord(read[o], delivered[o], eps[o], payout if read[o] else 0.0) for o in owners
    }
    statement = settle(
        "s" * 32, "consumer:c", quoted, dict.fromkeys(owners, PRICES), records, release
    )
    sign_statement(statement, key)
    parts = {o: statement.for_owner(o) for o in owners}
    signatures = {o: sign_statement(part, key) for o, part in parts.items()}
    settlement_time = time.perf_counter() - start

    start = time.perf_counter()
    for o, part in parts.items():
        verify_statement(part, signatures[o], key.public_key())
        check_statement(
            part,
            OwnerRecord("s" * 32, "consumer:c", read[o], eps[o], payout if read[o] else 0.0),
            PRICES,
            settlement,
            owner=o,
        )
    owner_check = (time.perf_counter() - start) / len(parts)
    return {"attribution": attribution, "settlement": settlement_time, "owner_check": owner_check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("-p", type=int, default=200)
    parser.add_argument("--n", type=int, default=5000, help="points per owner")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    w = Workload(
        k=args.k,
        n_points=args.n,
        rounds=args.p,
        d=140,
        n_features=16,
        validation_size=200,
        seed_set_size=0,
        seed=7,
    )
    data = make_data(w)
    config = CandidatesConfig(summary_size=args.p)
    ids = [o.name for o in data.owners]
    sessions, market = [], []
    warm = simulate(data.owners, data.validation, data.seed_set, config, seed=99, owner_ids=ids)
    market_seconds(warm, data.validation, config.gamma, args.k)  # one-time imports, as a service
    for r in range(args.repeats):
        start = time.perf_counter()
        result = simulate(
            data.owners, data.validation, data.seed_set, config, seed=100 + r, owner_ids=ids
        )
        sessions.append(time.perf_counter() - start)
        market.append(market_seconds(result, data.validation, config.gamma, args.k))
    session = statistics.median(sessions)
    attribution = statistics.median(m["attribution"] for m in market)
    settlement = statistics.median(m["settlement"] for m in market)
    report = {
        "k": args.k,
        "p": args.p,
        "n_points": args.n,
        "method": "candidates (default)",
        "session_seconds": sessions,
        "attribution_seconds": [m["attribution"] for m in market],
        "settlement_seconds": [m["settlement"] for m in market],
        "owner_check_seconds": [m["owner_check"] for m in market],
        "market_share_of_session": (attribution + settlement) / session,
    }
    print(
        f"K={args.k} p={args.p}: session {session:.3f} s (median of {args.repeats}), "
        f"attribution {attribution * 1e3:.1f} ms, settlement {settlement * 1e3:.1f} ms: "
        f"+{100 * (attribution + settlement) / session:.1f} %; each owner's check "
        f"{statistics.median(m['owner_check'] for m in market) * 1e3:.1f} ms (at the owner)"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
