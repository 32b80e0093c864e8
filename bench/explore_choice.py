"""The "best available" sketch on the tutorial's deployment: how often the choice made before
computing (:func:`dpmarket.consumer.explore.choose_source`, which fits an RFF or RACE answer
only when no histogram or marginals answer says anything) differs from the narrowest of every
sketch's answer, how much wider the chosen interval then is, and what each costs.

docs/tutorial.md's commands up to the clinics' sketches run in a scratch directory
(:mod:`tests.console.clinics`; or ``--deployment DIR`` reuses one already deployed there). The
consumer then asks ``--questions`` seeded random questions of the catalogue (means, second
moments, CDFs at chosen or default points, counts of one to three predicates, covariances of two
to nine columns, logistic regressions of the label on one to nine features; of the three clinics
together, or of one of them), each answered from every spec that expresses it (``--spec``: the
old rule compared these answers' honest half-widths, :func:`~dpmarket.consumer.explore.
honest_half_width`) and by "best available" (:func:`dpmarket.consumer.catalogue.explore`, no spec
named). Per question: each spec's honest half-width and CPU time, the old rule's choice
(:func:`~dpmarket.consumer.explore.narrowest` of every width) and the new one. The process's CPU
time (``time.process_time``) is the measure, BLAS on ``--blas-threads`` threads (default 1, as
``dpmarket console`` and ``consumer explore`` run it); wall time varies with the machine's load.

Prints the agreement, the ratio of half-widths where the choices differ, and CPU per question
(old: the sum of every spec's answer, as "best available" computed them all — for a logistic
regression, whose rule is unchanged, the chosen spec's; new: the answer by "best available");
writes the rows into ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.consumer import catalogue
from dpmarket.consumer.client import CuratorClient
from dpmarket.consumer.explore import Answer, Query, narrowest
from dpmarket.runtime.cli import curator_identity, security_from_options
from tests.console.clinics import deploy, stop

KINDS = ("mean", "moment2", "cdf", "count", "covariance", "logreg")


def question(rng: random.Random, domain: Domain, label: str) -> Query:
    """A random question about ``domain``'s columns (``label``: a logistic regression's
    target)."""
    names = list(domain.names)
    continuous = [c for j, c in enumerate(names) if domain.level_values(j) is None]
    kind = rng.choice(KINDS)
    if kind in ("mean", "moment2"):
        return Query(kind, columns=tuple(rng.sample(names, rng.randint(1, 9))))
    if kind == "covariance":
        return Query(kind, columns=tuple(rng.sample(names, rng.randint(2, 9))))
    if kind == "logreg":
        features = [c for c in names if c != label]
        return Query(kind, columns=tuple(rng.sample(features, rng.randint(1, 9))), target=label)
    if kind == "cdf":
        columns = tuple(rng.sample(continuous, rng.randint(1, 4)))
        if rng.random() < 0.5:
            return Query(kind, columns=columns)
        j = names.index(columns[0])
        lo, hi = float(domain.low[j]), float(domain.high[j])
        points = sorted(round(rng.uniform(lo, hi), 1) for _ in range(rng.randint(1, 3)))
        return Query(kind, columns=columns, points=tuple(points))
    where = []
    for column in rng.sample(names, rng.randint(1, 3)):
        j = names.index(column)
        levels = domain.level_values(j)
        if levels is not None and levels.size <= 10:
            v = float(rng.choice(list(levels)))
            where.append((column, v, v))
            continue
        lo, hi = float(domain.low[j]), float(domain.high[j])
        cut = round(rng.uniform(lo + 0.2 * (hi - lo), lo + 0.8 * (hi - lo)), 1)
        where.append((column, cut, math.inf) if rng.random() < 0.5 else (column, -math.inf, cut))
    return Query("count", where=tuple(where))


def _cpu(call: Any) -> tuple[Any, float]:
    start = time.process_time()
    out = call()
    return out, time.process_time() - start


def ask(client: Any, query: Query, owners: tuple[str, ...], kept: dict[Any, Any]) -> dict[str, Any]:
    """Every spec's answer to ``query`` and its honest half-width, then "best available"'s."""
    options = catalogue.ExploreOptions()
    widths: dict[str, float] = {}
    seconds: dict[str, float] = {}
    specs = []
    for spec, entries in catalogue._candidates(client, None, owners):
        try:
            pinned, cpu = _cpu(
                lambda s=spec: catalogue.explore(
                    client, query, spec=s.name, owners=owners, explorers=kept
                )
            )
        except InvalidArgumentError:  # a spec that does not express the query
            continue
        specs.append(spec)
        seconds[spec.name] = cpu
        answer = pinned.answer

        def answer_of(_: SketchSpec, a: Answer = answer) -> Answer:
            return a

        widths[spec.name] = catalogue._expected_error(
            query,
            spec,
            list(entries),
            lambda s: catalogue._explorer(kept, s, options),
            answer_of,
        )
    best, cpu = _cpu(lambda: catalogue.explore(client, query, owners=owners, explorers=kept))
    old = narrowest(specs, widths).name
    return {
        "query": best.answer.as_dict()["query"],
        "owners": list(owners),
        "widths": widths,
        "cpu_seconds": seconds,
        "old": old,
        "new": best.spec.name,
        "new_cpu_seconds": cpu,
        "reason": best.reason,
    }


@contextmanager
def _deployment(existing: Path | None) -> Iterator[Path]:
    if existing is not None:
        yield existing
        return
    with tempfile.TemporaryDirectory(prefix="dpmarket-explore-choice-") as scratch:
        clinics = deploy(Path(scratch))
        try:
            yield clinics
        finally:
            stop(clinics)


def run(questions: int, seed: int, existing: Path | None) -> list[dict[str, Any]]:
    """Deploy (or reuse ``existing``) and ask ``questions`` questions; the rows."""
    rng = random.Random(seed)
    rows = []
    with _deployment(existing) as clinics:
        port = (clinics / "run" / "curator.port").read_text().strip()
        pki = str(clinics / "pki" / "consumer-consumer")
        security = security_from_options("consumer", None, None, None, pki, "consumer", False)
        with CuratorClient(
            f"127.0.0.1:{port}", security, curator=curator_identity("curator")
        ) as client:
            kept: dict[Any, Any] = {}
            catalogue.warm(client, explorers=kept)
            specs, _ = client.sketch_catalogue()
            domain = specs[0].domain
            owners = sorted({e.owner for s in specs for e in client.sketches(s)})
            for _ in range(questions):
                query = question(rng, domain, domain.names[-1])
                who = () if rng.random() < 0.6 else (rng.choice(owners),)
                rows.append(ask(client, query, who, kept))
    return rows


def old_cpu(row: dict[str, Any]) -> float:
    """What the old rule's answer cost: every spec's answer (it computed them all to compare
    their widths), or for a logistic regression, whose rule compares standard errors and
    computes no answer but the chosen one (unchanged), the chosen spec's."""
    if row["query"]["kind"] == "logreg":
        return float(row["cpu_seconds"][row["old"]])
    return float(sum(row["cpu_seconds"].values()))


def summary(rows: list[dict[str, Any]]) -> str:
    """Agreement, the widening where the choices differ, and CPU per question, by kind."""
    lines = [
        "| questions | choice differs | chosen / narrowest half-width where it differs | "
        "CPU s per question, old: median / max | new: median / max |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for kind in (*KINDS, "all"):
        mine = [r for r in rows if kind in ("all", r["query"]["kind"])]
        if not mine:
            continue
        differ = [r for r in mine if r["old"] != r["new"]]
        ratios = [r["widths"][r["new"]] / r["widths"][r["old"]] for r in differ]
        old = [old_cpu(r) for r in mine]
        new = [r["new_cpu_seconds"] for r in mine]
        widened = (
            f"{min(ratios):.3g}-{max(ratios):.3g} (median {statistics.median(ratios):.3g})"
            if ratios
            else "-"
        )
        lines.append(
            f"| {kind}: {len(mine)} | {len(differ)} | {widened} | "
            f"{statistics.median(old):.2f} / {max(old):.2f} | "
            f"{statistics.median(new):.2f} / {max(new):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/explore-choice.json", help="JSON file")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--deployment", type=Path, default=None, help="a tutorial deployment's folder to reuse"
    )
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads (1: as the console and explore run by default)",
    )
    args = parser.parse_args()
    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        rows = run(args.questions, args.seed, args.deployment)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(summary(rows))
    for r in rows:
        if r["old"] != r["new"]:
            print(f"  differs: {r['query']} {r['owners']}: old {r['old']}, new {r['new']}, "
                  f"widths {r['widths']}")  # fmt: skip


if __name__ == "__main__":
    main()
