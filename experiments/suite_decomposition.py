"""Where the default's cost at epsilon 1 comes from: one release about D_v at a time replaced by
its exact value, on the design half of the suite (a laboratory, never reachable from a
deployment).

The candidates method sends the owners two things that depend on the validation set ``D_v``:
the validation embedding ``gtilde`` (which each owner's local greedy follows, after shrinking it
towards its own mean h1 with the default ``embedding_prior = "owner"``) and the allocation of the
candidate budget (the sketch path's decision ``r~``, a Gaussian release of D_v's mean
responsibilities; the counts path's Laplace-noised relevance counts). Each *oracle* below runs
the method itself, in process, with one of them replaced:

``default``
    The session's defaults (the reference row).
``prior-none``
    ``embedding_prior = "none"``: owners follow gtilde as released (a setting, not an oracle).
``exact-embedding``
    Owners receive ``mean h1(D_v)`` itself, no shrinkage; the allocation as released.
``exact-decision``
    Sketch path: the decision without its Gaussian noise (the owners' sketches keep theirs);
    gtilde as released.
``exact-decision-full-embedding``
    Sketch path: the decision free and exact, gtilde with 0.99 of D_v's budget (what the split
    between the two releases costs).
``oracle-allocation``
    The targeted budget split among owners as exact greedy's summary is (the hedge of p uniform
    points unchanged); gtilde as released and shrunk as by default.
``oracle-allocation-prior-none``
    The same, owners following gtilde as released.
``exact-both``
    ``exact-embedding`` and ``oracle-allocation`` together.
``validation-epsilon-3``, ``validation-epsilon-10``
    The method itself with D_v's budget raised to 3 or 10 (the owners' stays 1): how much more
    privacy budget the validation party would need for the releases as they are.

Every replaced release is still drawn and charged exactly as the method draws and charges it
(the session's noise stream is the same as the default's), and then discarded, so that the other
release's noise is the default's own draw. The oracles are installed for the duration of a
session only (:func:`installed`: the candidates strategy's allocator class is swapped in this
process and restored), by this module only; no configuration field, message or command of a
deployment reaches them.

``dpmarket lab evaluate --suite --decompose --seeds 2`` runs it on the design half (a held-out
scenario is refused) and writes ``<out>/decomposition.json``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from rich.console import Console

import dpmarket.curator.summarization.candidates as candidates_strategy
from dpmarket.common.summarization.methods import AllocationFields
from dpmarket.curator.summarization.allocation import Allocator, CandidateBudget, CandidateRequest
from dpmarket.curator.summarization.release import Releases
from dpmarket.curator.summarization.state import SessionState
from dpmarket.experiments.suite import SUITE, exact_greedy_reference
from dpmarket.experiments.suite_eval import SuiteRunner, SuiteSetting, _geomean, _table
from dpmarket.experiments.suite_paths import PathSetting, PathsRunner, half_names
from dpmarket.experiments.suite_split import require_design

__all__ = ["ORACLES", "Oracle", "decomposition_rows", "installed", "run_decomposition"]


#: The decision's share of D_v's budget when the decision is free (an oracle): the embedding gets
#: the rest.
FREE_DECISION_SHARE = 0.01


@dataclass(frozen=True)
class Oracle:
    """Which releases about D_v a session replaces by their exact values.

    Attributes
    ----------
    name : str
    exact_embedding : bool
        Owners receive ``mean h1(D_v)`` and no shrinkage.
    exact_decision : bool
        The sketch allocation's decision without its Gaussian noise.
    oracle_allocation : bool
        The targeted budget split as exact greedy's summary is among the owners (its points per
        owner, given to :func:`installed`).
    options : mapping of str to Any
        Configuration fields changed (a setting, e.g. ``embedding_prior``).
    validation_epsilon : float, optional
        D_v's epsilon instead of the path's (the owners' unchanged).
    """

    name: str
    exact_embedding: bool = False
    exact_decision: bool = False
    oracle_allocation: bool = False
    options: Mapping[str, Any] | None = None
    validation_epsilon: float | None = None

    @property
    def replaces(self) -> bool:
        """Whether a release is replaced (else the run is the method itself)."""
        return self.exact_embedding or self.exact_decision or self.oracle_allocation


#: Every variant, the reference first.
ORACLES: tuple[Oracle, ...] = (
    Oracle("default"),
    Oracle("prior-none", options={"embedding_prior": "none"}),
    Oracle("exact-embedding", exact_embedding=True),
    Oracle("exact-decision", exact_decision=True),
    Oracle(
        "exact-decision-full-embedding",
        exact_decision=True,
        options={"allocation_share": FREE_DECISION_SHARE},
    ),
    Oracle("oracle-allocation", oracle_allocation=True),
    Oracle(
        "oracle-allocation-prior-none",
        oracle_allocation=True,
        options={"embedding_prior": "none"},
    ),
    Oracle("exact-both", exact_embedding=True, oracle_allocation=True),
    Oracle("validation-epsilon-3", validation_epsilon=3.0),
    Oracle("validation-epsilon-10", validation_epsilon=10.0),
)


class _ExactReleases(Releases):
    """The counts path's gtilde drawn and charged as released, then replaced by the exact
    embedding (noise 0: no debiasing of the threshold, no shrinkage at the owners)."""

    def gaussian_validation_release(
        self, embedding: NDArray[np.float64], m: int, config: Any
    ) -> tuple[NDArray[np.float64], float]:
        super().gaussian_validation_release(embedding, m, config)
        return embedding, 0.0


def _oracle_allocator(oracle: Oracle, weights: Mapping[str, float]) -> type[Allocator]:
    """An :class:`Allocator` whose releases ``oracle`` replaces."""

    class OracleAllocator(Allocator):
        def __init__(
            self,
            state: SessionState,
            config: AllocationFields,
            releases: Releases,
            budget: CandidateBudget,
        ) -> None:
            if oracle.exact_embedding:
                releases = _ExactReleases(state)
            super().__init__(state, config, releases, budget)

        def embedding_release(
            self, embedding: NDArray[np.float64], sigma: float
        ) -> NDArray[np.float64]:
            noisy = super().embedding_release(embedding, sigma)
            return embedding.copy() if oracle.exact_embedding else noisy

        def owner_view(
            self, sigma: float, g_val: NDArray[np.float64]
        ) -> tuple[float, NDArray[np.float64] | None]:
            if oracle.exact_embedding:
                return 0.0, None
            return super().owner_view(sigma, g_val)

        def decision_release(
            self, pi: NDArray[np.float64], sigma: float
        ) -> tuple[NDArray[np.float64], NDArray[np.float64], float]:
            noisy, decision, alpha = super().decision_release(pi, sigma)
            if oracle.exact_decision:
                exact = np.asarray(pi, dtype=np.float64).mean(axis=0)
                return exact, exact, 1.0
            return noisy, decision, alpha

        def requests(
            self,
            owners: Sequence[int],
            weights_: NDArray[np.float64],
            masses: NDArray[np.float64] | None = None,
        ) -> dict[int, CandidateRequest]:
            if oracle.oracle_allocation:
                names = [self.state.owner_name(i) for i in owners]
                weights_ = np.array([weights.get(n, 0.0) for n in names], dtype=np.float64)
            return super().requests(owners, weights_, masses)

    return OracleAllocator


@contextlib.contextmanager
def installed(oracle: Oracle, weights: Mapping[str, float]) -> Iterator[None]:
    """Within the block, every candidates session in this process uses ``oracle``'s
    allocator (``weights``: exact greedy's points per owner name, read when the oracle replaces
    the allocation). Restored on exit."""
    original = candidates_strategy.Allocator
    candidates_strategy.Allocator = _oracle_allocator(oracle, weights)  # type: ignore[misc]
    try:
        yield
    finally:
        candidates_strategy.Allocator = original  # type: ignore[misc]


def _exact_weights(runner: SuiteRunner, name: str) -> dict[str, float]:
    """Exact greedy's summary points per owner name."""
    scenario = runner.scenario(name)
    chosen = exact_greedy_reference(scenario, scenario.default_p, runner.cache_dir)
    owner_of = np.concatenate([np.full(o.n_points, k) for k, o in enumerate(scenario.owners)])
    counts = np.bincount(owner_of[chosen], minlength=len(scenario.owners))
    return {o.name: float(c) for o, c in zip(scenario.owners, counts, strict=True)}


def _run(paths: PathsRunner, oracle: Oracle, path: str, name: str, seed: int) -> dict[str, Any]:
    """One session of ``oracle`` on ``path`` at epsilon 1."""
    setting = SuiteSetting(dict(oracle.options or {}))
    ps = PathSetting("sketch" if path == "sketch" else "counts", 1.0, setting)
    if not oracle.replaces and oracle.validation_epsilon is None:
        return paths.run(ps, name, seed)
    runner = paths.runner
    scenario = runner.scenario(name, setting.sketch_scale)
    config = ps.config(scenario)
    if oracle.validation_epsilon is not None:
        assert isinstance(config, AllocationFields)  # the candidates method's
        config = replace(config, epsilon_validation_total=oracle.validation_epsilon)
    with installed(oracle, _exact_weights(runner, name)):
        return runner.session(
            ("decomposition", "decomp"),
            scenario,
            config,
            seed,
            lambda: (
                paths.sketches(name, setting.sketch_scale, 1.0, seed) if path == "sketch" else None
            ),
            f"path={path} oracle={oracle.name} sketch_scale={setting.sketch_scale!r}",
        )


def _family(name: str) -> str:
    return next(e.family for e in SUITE if e.name == name)


def decomposition_rows(
    paths: PathsRunner,
    names: Sequence[str],
    seeds: Sequence[int],
    *,
    oracles: Sequence[Oracle] = ORACLES,
    path_list: Sequence[str] = ("sketch", "counts"),
) -> list[dict[str, Any]]:
    """Per path, oracle and scenario: the geometric mean over ``seeds`` of the summary's MMD² to
    D_v over exact greedy's, at epsilon 1."""
    rows = []
    for path in path_list:
        for oracle in oracles:
            if oracle.exact_decision and path != "sketch":
                continue
            for name in names:
                ratios = []
                for seed in seeds:
                    record = _run(paths, oracle, path, name, seed)
                    base = paths.runner.baselines(name, seed)
                    ratios.append(record["mmd2"] / base["exact"]["mmd2"])
                rows.append(
                    {
                        "path": path,
                        "oracle": oracle.name,
                        "scenario": name,
                        "family": _family(name),
                        "over_exact": _geomean(ratios),
                        "per_seed": ratios,
                    }
                )
    return rows


def _by(rows: Sequence[Mapping[str, Any]], key: str) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(r[key], []).append(r)
    return out


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per path and oracle: the median and worst over scenarios, and the median per family."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for path, in_path in _by(rows, "path").items():
        out[path] = {}
        for oracle, group in _by(in_path, "oracle").items():
            values = [r["over_exact"] for r in group]
            cell = {"median": float(np.median(values)), "worst": float(max(values))}
            for family, members in _by(group, "family").items():
                cell[family] = float(np.median([r["over_exact"] for r in members]))
            out[path][oracle] = cell
    return out


def run_decomposition(
    out: Path,
    *,
    seeds: int,
    names: Sequence[str] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """``dpmarket lab evaluate --suite --decompose``: every oracle on both paths at epsilon 1 on
    the design half; prints the table per family and writes ``out/decomposition.json``.

    Raises
    ------
    HeldOutScenarioError
        If a scenario is not in the design half.
    """
    from dpmarket.runtime.files import write_json

    console = console or Console()
    require_design(list(names or ()), "the decomposition (--decompose)")
    chosen = half_names("design", names)
    start = time.perf_counter()
    paths = PathsRunner(SuiteRunner(out / "cache"))
    rows = decomposition_rows(paths, chosen, list(range(seeds)))
    summary = summarize(rows)
    families = sorted({r["family"] for r in rows})
    table = _table(
        f"design half, ε = 1: × exact greedy (geometric mean over seeds 0-{seeds - 1}; "
        "median over scenarios, per family)",
        ["path", "variant", "median", "worst", *families],
    )
    for path, per_oracle in summary.items():
        for oracle, cell in per_oracle.items():
            table.add_row(
                path,
                oracle,
                f"{cell['median']:.2f}",
                f"{cell['worst']:.2f}",
                *[f"{cell[f]:.2f}" if f in cell else "" for f in families],
            )
    console.print(table)
    document = {
        "rows": rows,
        "summary": summary,
        "seeds": seeds,
        "seconds_total": time.perf_counter() - start,
    }
    write_json(document, out / "decomposition.json")
    console.print(f"results -> {out / 'decomposition.json'} ({document['seconds_total']:.0f} s)")
    return document
