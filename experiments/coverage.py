"""Coverage of ``explore``'s 95 % intervals: per query kind and sketch kind, over tables and seeds.

``dpmarket lab sketch-figures coverage`` builds each table of :mod:`dpmarket.experiments.tables`,
splits it into its owners, has every owner publish every sketch of the catalogue ``init`` drafts
(HIST, RFF, RACE at epsilon 1, Laplace) plus a marginals sketch (epsilon 1, delta 1e-6), and
answers, for each owner alone and for the union of all, a battery of queries through the
consumer's own code (:class:`dpmarket.consumer.explore.Explorer`,
:class:`~dpmarket.consumer.explore.MarginalsExplorer` as it is, and
:func:`~dpmarket.consumer.explore.choose_source` for ``auto``, the answer ``explore --spec
DECLARATION`` gives among every sketch kind that expresses the query, the marginals sketch
included where it was released):

* ``mean`` and ``moment2`` of every column; ``cdf`` at the default nine points of every
  continuous column; ``covariance`` of random pairs of columns; ``count`` of random
  conjunctions of one to three range predicates (thresholds between the 5 % and 95 % quantiles
  of the table; ``=`` a level for a discrete column);
* ``logreg`` of the table's label on two columns (the union only, first seed: each costs tens of
  seconds).

The marginals sketches are released and answered on the first seed only (a release and its
models take minutes per table).

Each value is compared with the exact answer on the raw records (:func:`~dpmarket.consumer.
explore.exact_answer`). A value counts as *flagged* when a flag is on its interval (the interval
does not mean what its basis says: :mod:`dpmarket.common.uncertainty`); a flag on the value only
(a model's guess inside bounds that hold whatever the joint; ``uninformative``: the interval
spans more than half of what the value can be) leaves its interval counted, since it still
claims to cover; the ``uninformative`` share is reported beside the flagged fraction (such an
interval covers but says little). Reported per split (tuning tables, held-out tables), sketch
kind and query kind: the values, the flagged fraction (by code), the coverage of the unflagged
intervals and of all intervals, and the median width of the intervals as a share of what the
value can be.
Written to ``coverage.json`` (settings, the summary and one row per table) and printed.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table as RichTable
from threadpoolctl import threadpool_limits

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.marginals import MarginalsMechanism, free_compiled
from dpmarket.common.sketches.sketch import PrivateSketch, SketchMechanism, merge_sketches
from dpmarket.common.sketches.spec import SketchSpec
from dpmarket.consumer.explore import (
    Answer,
    Explorer,
    MarginalsExplorer,
    Query,
    _possible,
    choose_source,
    exact_answer,
    honest_half_width,
)
from dpmarket.experiments.tables import HELD_OUT, TUNING, OwnerTable, build, declaration

__all__ = ["KINDS", "QUERY_KINDS", "print_coverage", "queries", "run_coverage", "run_table"]

Array = NDArray[np.float64]
#: Sketch kinds reported (``auto``: :func:`choose_source` among every kind answered).
KINDS = ("hist", "rff", "race", "auto", "marginals")
QUERY_KINDS = ("mean", "moment2", "cdf", "covariance", "count", "logreg")
#: The goals: unflagged coverage at least GOAL_COVERAGE, at most GOAL_FLAGGED flagged.
GOAL_COVERAGE = 0.90
GOAL_FLAGGED = 0.20


def queries(table: OwnerTable, rng: np.random.Generator, *, counts: int, pairs: int) -> list[Query]:
    """The battery of one seed (module docstring), logistic regressions excluded."""
    domain = table.domain
    names = domain.names
    out = [Query("mean"), Query("moment2"), Query("cdf")]
    d = domain.n_attributes
    for _ in range(pairs):
        a, b = rng.choice(d, size=2, replace=False)
        out.append(Query("covariance", columns=(names[int(a)], names[int(b)])))
    lo_q, hi_q = np.quantile(table.records, [0.05, 0.95], axis=0)
    for _ in range(counts):
        k = int(rng.integers(1, 4))
        where = []
        for j in rng.choice(d, size=min(k, d), replace=False):
            j = int(j)
            levels = domain.level_values(j)
            if levels is not None and rng.random() < 0.5:
                v = float(levels[rng.integers(levels.shape[0])])
                where.append((names[j], v, v))
                continue
            t = float(rng.uniform(lo_q[j], hi_q[j]))
            where.append(
                (names[j], -math.inf, t) if rng.random() < 0.5 else (names[j], t, math.inf)
            )
        out.append(Query("count", where=tuple(where)))
    return out


def _logreg(table: OwnerTable, rng: np.random.Generator) -> Query:
    domain = table.domain
    features = [n for n in domain.names if n != table.label]
    chosen = rng.choice(len(features), size=min(2, len(features)), replace=False)
    return Query("logreg", target=table.label, columns=tuple(features[int(j)] for j in chosen))


def _rows(
    table: str,
    split: str,
    seed: int,
    target: str,
    kind: str,
    answer: Answer,
    truth: Answer,
    span: Array,
) -> list[dict[str, Any]]:
    low, high = answer.interval()
    flagged = answer.codes("interval")
    noted = answer.codes("value")
    out = []
    for j, label in enumerate(answer.labels):
        lo, hi, t = float(low[j]), float(high[j]), float(truth.values[j])
        finite = math.isfinite(lo) and math.isfinite(hi)
        out.append(
            {
                "table": table,
                "split": split,
                "seed": seed,
                "target": target,
                "kind": kind,
                "query": answer.query.kind,
                "label": label,
                "truth": t,
                "value": float(answer.values[j]),
                "low": lo if finite else None,
                "high": hi if finite else None,
                "covered": bool(finite and lo - 1e-9 <= t <= hi + 1e-9),
                "flag": flagged[j],
                "value_flag": noted[j],
                "basis": answer.basis[j],
                "width": (hi - lo) / float(span[j]) if finite and math.isfinite(span[j]) else None,
            }
        )
    return out


def _lookup(widths: dict[str, float]) -> Callable[[SketchSpec], float]:
    """``spec -> widths[spec.name]`` (choose_source's expected error)."""
    return lambda spec: widths[spec.name]


def _half_width(answer: Answer, domain: Domain) -> float:
    """What ``explore`` compares (:func:`dpmarket.consumer.cli._expected_error`): the honest
    half-width, or for a logistic regression (untrusted everywhere) the standard error."""
    if answer.query.kind == "logreg":
        return float(np.nanmean(answer.errors))
    return honest_half_width(answer, domain)


def run_table(
    table: OwnerTable,
    seeds: Sequence[int],
    *,
    split: str,
    counts: int = 60,
    pairs: int = 4,
    logreg: bool = True,
    n_synthetic: int = 20_000,
    replicates: int = 1000,
    bootstrap: int = 16,
    marginals: bool = True,
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """One row per value answered on ``table`` (module docstring)."""
    con = console or Console()
    rows: list[dict[str, Any]] = []
    k_owners = len(table.owner_names)
    for seed in seeds:
        start = time.perf_counter()
        rng = np.random.default_rng([seed, 28])
        with_marginals = marginals and seed == seeds[0]
        specs = {
            s.kind: s
            for s in declaration(table, marginals=None if with_marginals else {}).draw(rng)
        }
        noise = SeededNoise(np.random.default_rng([seed, 1]))
        parts = [table.part(k) for k in range(k_owners)]
        released: dict[str, list[Any]] = {}
        for kind in ("hist", "rff", "race"):
            mech = specs[kind].mechanism(1.0)
            assert isinstance(mech, SketchMechanism)
            released[kind] = [mech.release(p, noise) for p in parts]
        if with_marginals:
            mrng = np.random.default_rng([seed, 2])
            mmech = specs["marginals"].mechanism(1.0)
            assert isinstance(mmech, MarginalsMechanism)
            released["marginals"] = [mmech.release(p, noise, rng=mrng) for p in parts]
            free_compiled()
        battery = queries(table, np.random.default_rng([seed, 3]), counts=counts, pairs=pairs)
        targets: list[tuple[str, list[int]]] = [
            (name, [k]) for k, name in enumerate(table.owner_names)
        ] + [("union", list(range(k_owners)))]
        explorers = {
            kind: Explorer(specs[kind], n_synthetic=n_synthetic, seed=seed)
            for kind in ("hist", "rff", "race")
        }
        mexplorer = (
            MarginalsExplorer(specs["marginals"], bootstrap=bootstrap, seed=seed)
            if with_marginals
            else None
        )
        for target, members in targets:
            records = np.concatenate([parts[k] for k in members])
            asked = list(battery)
            if logreg and target == "union" and seed == seeds[0]:
                asked.append(_logreg(table, np.random.default_rng([seed, 4])))
            for q in asked:
                truth = exact_answer(q, records, table.domain)
                span_lo, span_hi, _ = _possible(q, table.domain, len(truth.labels))
                span = span_hi - span_lo
                answers: dict[str, Answer] = {}
                for kind, explorer in explorers.items():
                    chosen = [released[kind][k] for k in members]
                    sketch = chosen[0] if len(chosen) == 1 else merge_sketches(chosen)
                    assert isinstance(sketch, PrivateSketch) or len(chosen) > 1
                    try:
                        answers[kind] = explorer.answer(q, sketch, replicates=replicates)
                    except ValueError as exc:  # a logistic regression with no fit
                        con.print(f"[yellow]{table.name} {target} {kind} {q.kind}: {exc}")
                        continue
                    rows += _rows(table.name, split, seed, target, kind, answers[kind], truth, span)
                if mexplorer is not None and MarginalsExplorer.expresses(q, table.domain):
                    chosen_m = [released["marginals"][k] for k in members]
                    answers["marginals"] = mexplorer.answer(q, chosen_m)
                    rows += _rows(
                        table.name,
                        split,
                        seed,
                        target,
                        "marginals",
                        answers["marginals"],
                        truth,
                        span,
                    )
                if answers:
                    by_name = {specs[k].name: k for k in answers}
                    widths = {
                        specs[k].name: _half_width(a, table.domain) for k, a in answers.items()
                    }
                    spec, _ = choose_source(q, [specs[k] for k in answers], _lookup(widths))
                    auto = answers[by_name[spec.name]]
                    rows += _rows(table.name, split, seed, target, "auto", auto, truth, span)
        free_compiled()
        done = sum(r["seed"] == seed for r in rows)
        con.print(f"{table.name} seed {seed}: {done} values in {time.perf_counter() - start:.0f} s")
    return rows


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per split, sketch kind and query kind (and ``all`` queries): values, flagged fraction,
    flags by reason, coverage of the unflagged and of all intervals, median relative width."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        for q in (r["query"], "all"):
            groups[(r["split"], r["kind"], q)].append(r)
    out: dict[str, Any] = {}
    for (split, kind, q), members in sorted(groups.items()):
        n = len(members)
        unflagged = [r for r in members if not r["flag"]]
        widths = [r["width"] for r in unflagged if r["width"] is not None]
        out.setdefault(split, {}).setdefault(kind, {})[q] = {
            "values": n,
            "flagged": 1.0 - len(unflagged) / n,
            "flags": dict(Counter(r["flag"] for r in members if r["flag"])),
            # Flags on the value (the interval still counts): how many answers are weak.
            "value_flags": dict(
                Counter(
                    code
                    for r in members
                    for code in str(r.get("value_flag", "")).split(", ")
                    if code
                )
            ),
            "uninformative": sum("uninformative" in str(r.get("value_flag", "")) for r in members)
            / n,
            "coverage_unflagged": (
                sum(r["covered"] for r in unflagged) / len(unflagged) if unflagged else None
            ),
            "unflagged": len(unflagged),
            "coverage_all": sum(r["covered"] for r in members) / n,
            "median_width": float(np.median(widths)) if widths else None,
        }
    return out


def run_coverage(
    out_dir: str | Path,
    *,
    tables: Sequence[str] = TUNING,
    held_out: Sequence[str] = HELD_OUT,
    seeds: Sequence[int] = (0, 1, 2),
    quick: bool = False,
    marginals: bool = True,
    logreg: bool = True,
    n_synthetic: int | None = None,
    counts: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run every table, write ``out_dir/coverage.json`` and print the summary.

    ``marginals`` / ``logreg``: include the marginals sketches / the logistic regressions (the
    slow parts); ``n_synthetic``, ``counts``: override M2M's synthetic points and the count
    queries per seed."""
    con = console or Console()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = (
        {"counts": 8, "pairs": 1, "n_synthetic": 2000, "replicates": 200, "bootstrap": 4}
        if quick
        else {"counts": 40, "pairs": 3, "n_synthetic": 20_000, "replicates": 500, "bootstrap": 8}
    )
    if n_synthetic is not None:
        settings["n_synthetic"] = n_synthetic
    if counts is not None:
        settings["counts"] = counts
    settings.update(marginals=marginals, logreg=logreg)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    per_table: dict[str, Any] = {}
    for names, split in ((tables, "tuning"), (held_out, "held-out")):
        for name in names:
            table = build(name)
            with threadpool_limits(1):  # BLAS threads only fight over small matrices
                got = run_table(table, seeds, split=split, console=con, **settings)
            rows += got
            per_table[name] = {
                "split": split,
                "rows": int(table.records.shape[0]),
                "columns": list(table.domain.names),
                "owners": dict(
                    zip(table.owner_names, np.bincount(table.owners).tolist(), strict=True)
                ),
                "by_covariate": table.split,
                "summary": summarize(got)[split],
            }
            (out / "coverage-partial.json").write_text(
                json.dumps({"tables": per_table, "summary": summarize(rows)}, indent=1),
                encoding="utf-8",
            )
    doc = {
        "settings": {
            **settings,
            "seeds": list(seeds),
            "epsilon": 1.0,
            "catalogue": "HIST 10 bins, RFF m'=100 sigma 0.5, RACE 20x20 width 0.2 (Laplace); "
            "marginals bins 10, delta 1e-6 (Gaussian)",
            "tables": list(tables),
            "held_out": list(held_out),
        },
        "summary": summarize(rows),
        "tables": per_table,
        "seconds": time.perf_counter() - start,
    }
    (out / "coverage.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
    (out / "coverage-rows.json").write_text(json.dumps(rows), encoding="utf-8")
    con.print(f"coverage -> {out / 'coverage.json'} ({doc['seconds']:.0f} s)")
    print_coverage(doc, con)
    return doc


def print_coverage(doc: Mapping[str, Any], console: Console) -> None:
    """One table per split: per sketch kind and query kind, values, flagged fraction and the
    unflagged coverage, marked against the goals (>= 90 % covered, <= 20 % flagged)."""
    for split, kinds in doc["summary"].items():
        table = RichTable(
            title=f"coverage of the 95 % intervals ({split} tables)", title_justify="left"
        )
        for column in ("sketch", *QUERY_KINDS, "all"):
            table.add_column(column, justify="left" if column == "sketch" else "right")
        for kind in KINDS:
            if kind not in kinds:
                continue
            cells = []
            for q in (*QUERY_KINDS, "all"):
                s = kinds[kind].get(q)
                if s is None:
                    cells.append("—")
                    continue
                cov = s["coverage_unflagged"]
                cov_text = "—" if cov is None else f"{100 * cov:.0f}%"
                mark = "" if cov is None or cov >= GOAL_COVERAGE else "*"
                wide = s.get("uninformative", 0.0)
                cells.append(
                    f"{cov_text}{mark} f{100 * s['flagged']:.0f}% u{100 * wide:.0f}% n{s['values']}"
                )
            table.add_row(kind, *cells)
        console.print(table)
    console.print(
        "cell: coverage of the unflagged intervals (* below 90 %), f: flagged fraction (a flag "
        "on the interval), u: uninformative (a flag on the value: the interval spans more than "
        "half of what the value can be, and still counts), n: values"
    )
