"""The owners' shrinkage strength read from the release (``shrinkage_strength``), on the design
half of the suite beside the default (issue 27; docs/results.md, "A shrinkage strength that
reads m").

For each allocation path and strength rule (:data:`RULES`), the method itself runs in process
(:class:`~dpmarket.experiments.suite_paths.PathsRunner`, the suite's cache) at every party's
epsilon, session seeds ``0 .. n-1``; per scenario it reports the geometric mean over the seeds of
the summary's MMD² to D_v over exact greedy's, and per path and rule the median, the worst and
the score ``sqrt(median * worst)``, the medians per family, and the worst seed over the median
seed. A held-out scenario is refused before anything runs
(:func:`~dpmarket.experiments.suite_split.require_design`).

``python -m dpmarket.experiments.suite_strength --seeds 3 --out out/suite`` writes
``<out>/strength.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.experiments.suite_decomposition import _family
from dpmarket.experiments.suite_eval import SuiteRunner, SuiteSetting, _geomean
from dpmarket.experiments.suite_paths import PathSetting, PathsRunner, half_names
from dpmarket.experiments.suite_split import require_design

__all__ = ["RULES", "main", "strength_rows", "summarize"]

#: The strength rules compared (``CandidatesConfig.shrinkage_strength``), main's first.
RULES: tuple[str, ...] = ("fixed", "snr", "share")


def strength_rows(
    paths: PathsRunner,
    names: Sequence[str],
    seeds: Sequence[int],
    *,
    epsilon: float,
    rules: Sequence[str | float] = RULES,
    path_list: Sequence[str] = ("sketch", "counts"),
    option: str = "shrinkage_strength",
) -> list[dict[str, Any]]:
    """Per path, rule and scenario: the geometric mean over ``seeds`` of MMD² over exact
    greedy's, the per-seed ratios and the worst seed over the median seed. ``option`` is the
    ``CandidatesConfig`` field the rules are values of (``read_cap``: the size cap's divisor;
    ``mass_cap``: the mass cap's factor)."""
    require_design(names, f"the option {option}")
    rows = []
    for path in path_list:
        for rule in rules:
            setting = SuiteSetting({option: rule})
            ps = PathSetting(path, epsilon, setting)  # type: ignore[arg-type]
            for name in names:
                ratios = []
                for seed in seeds:
                    record = paths.run(ps, name, seed)
                    base = paths.runner.baselines(name, seed)
                    ratios.append(record["mmd2"] / base["exact"]["mmd2"])
                row = {
                    "path": path,
                    "rule": rule,
                    "epsilon": epsilon,
                    "scenario": name,
                    "family": _family(name),
                    "over_exact": _geomean(ratios),
                    "per_seed": ratios,
                    "seed_spread": float(max(ratios) / np.median(ratios)),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (path, rule, epsilon): median, worst, score and family medians."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["path"], r["rule"], r["epsilon"]), []).append(r)
    out = []
    for (path, rule, eps), rs in groups.items():
        x = [r["over_exact"] for r in rs]
        fam: dict[str, list[float]] = {}
        for r in rs:
            fam.setdefault(r["family"], []).append(r["over_exact"])
        worst = int(np.argmax(x))
        out.append(
            {
                "path": path,
                "rule": rule,
                "epsilon": eps,
                "median": float(np.median(x)),
                "worst": float(max(x)),
                "worst_scenario": rs[worst]["scenario"],
                "score": float(np.sqrt(np.median(x) * max(x))),
                "families": {k: float(np.median(v)) for k, v in sorted(fam.items())},
                "seed_spread": float(max(r["seed_spread"] for r in rs)),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--seeds``, ``--out``, ``--epsilon``, ``--rule`` (repeatable),
    ``--path`` (repeatable), ``--scenario`` (repeatable; design half only)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("out/suite"))
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--rule", action="append", choices=RULES)
    parser.add_argument(
        "--read-cap",
        action="append",
        type=float,
        help="compare these read_cap divisors (0: no cap) instead of the strength rules",
    )
    parser.add_argument(
        "--mass-cap",
        action="append",
        type=float,
        help="compare these mass_cap factors (0: no cap) instead of the strength rules",
    )
    parser.add_argument("--path", action="append", choices=("sketch", "counts"))
    parser.add_argument("--scenario", action="append")
    args = parser.parse_args(argv)
    names = half_names("design", args.scenario)
    option = "mass_cap" if args.mass_cap else "read_cap" if args.read_cap else "shrinkage_strength"
    prefix = {"mass_cap": "masscap", "read_cap": "readcap"}.get(option, "strength")
    paths = PathsRunner(SuiteRunner(args.out / "cache"))
    start = time.perf_counter()
    rows = strength_rows(
        paths,
        names,
        list(range(args.seeds)),
        epsilon=args.epsilon,
        rules=args.mass_cap or args.read_cap or args.rule or RULES,
        path_list=args.path or ("sketch", "counts"),
        option=option,
    )
    summary = summarize(rows)
    for s in summary:
        print(json.dumps(s), flush=True)
    document = {"rows": rows, "summary": summary, "seconds": time.perf_counter() - start}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{prefix}-eps{args.epsilon:g}.json"
    (args.out / name).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"-> {args.out / name} ({document['seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
