"""The in-process runs that the compose stack's answers are compared with (test_compose_stack).

Run inside the stack's own image, with no network, on the very files the owners and the consumer
hold (their data volumes mounted read-only), so that the comparison is with the same code and the
same numerical libraries as the services, bit for bit:

    docker run -i --network none -v <volume>:/owners/owner-0:ro ... dpmarket:local python - < job

Reads a JSON job on stdin, writes ``reference.json`` (and the summary's files) to the directory
the job names, and prints nothing else on stdout. Every party runs in this one process:

* ``summary``: ``dpmarket lab simulate`` with the consumer's options (the owners' point files).
* ``cape``: each job by :func:`dpmarket.experiments.runner.run_cape` on the owners' tables, named as
  the owners.
* ``sketch``: a catalogue opened from the same declaration and seed as the curator's, each owner's
  sketch published with its seeded noise and its policy
  (:func:`dpmarket.owner.sketches.publish_to`), then the consumer's query on the union by
  :class:`dpmarket.consumer.explore.Explorer`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from dpmarket.common.cape.spec import CapeJobSpec, CapeMeanSpec
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.sketch import PrivateSketch, merge_sketches
from dpmarket.consumer.explore import Explorer, Query
from dpmarket.curator.cape import CapeMeanEstimate, CapeResult
from dpmarket.curator.sketches import SketchCatalog
from dpmarket.deploy.cli import main
from dpmarket.experiments.runner import run_cape
from dpmarket.owner.ledger import OwnerLedger
from dpmarket.owner.policy import load_owner_policy
from dpmarket.owner.sketches import SketchPublisher, publish_to
from dpmarket.runtime.tables import load_table


def _summary(job: dict[str, Any], out: Path) -> dict[str, Any]:
    argv = [*job["argv"], "--out", str(out / "summary.npy"), "--report", str(out / "report.json")]
    main(argv, standalone_mode=False)
    summary = np.load(out / "summary.npy")
    return {"points": summary.tolist(), "report": json.loads((out / "report.json").read_text())}


def _columns(items: list[list[Any]]) -> tuple[tuple[str, float, float], ...]:
    return tuple((str(c), float(lo), float(hi)) for c, lo, hi in items)


def _cape(job: dict[str, Any], tables: list[Any]) -> dict[str, Any]:
    spec: CapeMeanSpec | CapeJobSpec
    if job["task"] == "mean":
        spec = CapeMeanSpec(_columns(job["features"]), job["epsilon"], job["delta"])
    else:
        (target,) = _columns([job["target"]])
        spec = CapeJobSpec(
            job["task"], _columns(job["features"]), target, job["epsilon"], job["delta"]
        )
    result, spend = run_cape(tables, spec, seed=job["seed"])
    answer: dict[str, Any] = {"spend": {o: s.epsilon for o, s in spend.items()}}
    if isinstance(result, CapeMeanEstimate):
        answer["mean"] = result.mean.tolist()
    else:
        assert isinstance(result, CapeResult)
        answer["weights"] = result.weights.tolist()
        answer["intercept"] = result.intercept
    return answer


def _sketch(job: dict[str, Any], tables: dict[str, Any], scratch: Path) -> dict[str, Any]:
    policy = load_owner_policy(job["policy"])
    with SketchCatalog.from_files(
        scratch / "curator", [job["declaration"]], owners=list(tables), seed=job["catalogue_seed"]
    ) as catalog:
        for owner, table in tables.items():
            with OwnerLedger.create(scratch / owner, policy) as ledger:
                noise = SeededNoise(np.random.default_rng(job["owner_seeds"][owner]))
                publish_to(
                    catalog.endpoint(owner),
                    SketchPublisher(ledger, noise=noise),
                    table,
                    [job["spec"]],
                )
        spec = catalog.spec(job["spec"])
        entries = catalog.sketches(job["spec"])
    sketches = [e.sketch for e in entries]
    private = [s for s in sketches if isinstance(s, PrivateSketch)]
    assert len(private) == len(sketches), "the reference explores private (M2M) sketches"
    # As `dpmarket consumer explore` answers by default (--blas-threads 1): the same BLAS
    # threads give the same sums to the last bit.
    with threadpool_limits(limits=1, user_api="blas"):
        explorer = Explorer(spec, n_synthetic=job["synthetic"], seed=job["explore_seed"])
        merged = merge_sketches(private)
        answer = explorer.answer(Query(job["query"]), explorer.estimator(merged))
    return {"owners": [e.owner for e in entries], "values": answer.values.tolist()}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Every reference answer the job asks for (see the module docstring)."""
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    owners = job["owners"]
    tables = {
        o: load_table(Path(job["owner_dir"]) / o / f"{o}-table.parquet", name=o) for o in owners
    }
    result: dict[str, Any] = {"summary": _summary(job["summary"], out)}
    result["cape"] = {name: _cape(c, list(tables.values())) for name, c in job["cape"].items()}
    with tempfile.TemporaryDirectory() as scratch:
        result["sketch"] = _sketch(job["sketch"], tables, Path(scratch))
    return result


if __name__ == "__main__":
    job = json.loads(sys.stdin.read())
    answer = run(job)
    (Path(job["out"]) / "reference.json").write_text(json.dumps(answer), encoding="utf-8")
