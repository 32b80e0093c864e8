"""Issue 28's repro of the marginals kind's measured values: a small owner's sparse pairs.

One owner of ``ROWS`` records (default 150) of a four-column table, ``a`` binomial(5, 0.2) over
levels 0-5, ``b`` following ``a``, two coins ``c`` and ``y`` (``y`` depending on ``a``), releases
a marginals sketch at epsilon 1 (delta 1e-6, one round, two measured pairs) for each of
``SEEDS`` seeds. Each release is asked every cell of its measured pairs, the mean of every column
and the covariance of the two coins (``dpmarket.consumer.explore.MarginalsExplorer``, bootstrap
``BOOTSTRAP``). Over the values whose basis is ``measured`` it prints how often the interval
covers the truth, how often the value lies inside its interval, how often ``value -+ 1.96 se``
covers the truth and how far the values lie from the truth in standard errors; over the two
coins' variances (at most 0.25: Popoviciu), how often the interval's upper end exceeds 0.25.

Usage: ``python -m bench.marginals_values [ROWS [SEEDS [BOOTSTRAP]]]`` (defaults 150, 20, 4).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.marginals import MarginalsMechanism
from dpmarket.common.sketches.spec import SketchDeclaration
from dpmarket.consumer.explore import MarginalsExplorer, Query, exact_answer

#: The table's declaration: four discrete columns, a marginals map of two measured pairs.
SPARSE = SketchDeclaration.from_mapping(
    {
        "name": "sparse",
        "mechanism": {"epsilon": 1.0, "epsilon_range": [0.1, 2.0]},
        "columns": [
            {"name": "a", "low": 0, "high": 5, "levels": [0, 1, 2, 3, 4, 5]},
            {"name": "b", "low": 0, "high": 5, "levels": [0, 1, 2, 3, 4, 5]},
            {"name": "c", "low": 0, "high": 1, "levels": [0, 1]},
            {"name": "y", "low": 0, "high": 1, "levels": [0, 1]},
        ],
        "maps": {"marginals": {"bins": 4, "rounds": 1, "measurements": 2, "delta": 1e-6}},
    }
)
NAMES = ["a", "b", "c", "y"]


def sparse_records(n: int, seed: int = 1) -> NDArray[np.float64]:
    """``n`` records of the table, shape (n, 4), seeded."""
    rng = np.random.default_rng(seed)
    a = rng.binomial(5, 0.2, n)
    b = np.clip(a + rng.integers(-1, 2, n), 0, 5)
    c = (rng.random(n) < 0.3).astype(float)
    y = (rng.random(n) < np.where(a >= 2, 0.8, 0.2)).astype(float)
    return np.column_stack([a, b, c, y]).astype(float)


def main() -> None:
    spec = next(s for s in SPARSE.draw(np.random.default_rng(0)) if s.kind == "marginals")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    seeds = range(int(sys.argv[2]) if len(sys.argv) > 2 else 20)
    boot = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    x = sparse_records(n)
    mech = spec.mechanism(1.0)
    assert isinstance(mech, MarginalsMechanism)
    ex = MarginalsExplorer(spec, bootstrap=boot, seed=0, cache=None)
    names = NAMES
    tot = cov = normal = inside = 0
    zs_list: list[float] = []
    var_n = var_over = var_cov = 0
    var_max = 0.0
    worst = 0.0
    wl: Any = None
    t0 = time.time()
    for s in seeds:
        rng = np.random.default_rng(s)
        sk = mech.release(x, SeededNoise(rng), rng=rng)
        pairs = [m.clique for m in sk.measurements if len(m.clique) == 2]
        qs = [Query("marginal", columns=tuple(names[j] for j in p)) for p in pairs]
        qs += [Query("mean", columns=tuple(names)), Query("covariance", columns=("c", "y"))]
        for q in qs:
            ans = ex.answer(q, [sk])
            if q.kind == "marginal":
                idx = [names.index(c) for c in q.columns]
                levels = [spec.domain.level_values(j) for j in idx]
                cells = [0 if lv is None else len(lv) for lv in levels]
                codes = [
                    np.searchsorted(np.asarray(lv), x[:, j])
                    for lv, j in zip(levels, idx, strict=True)
                ]
                flat = np.ravel_multi_index(tuple(codes), cells)
                truth = np.bincount(flat, minlength=int(np.prod(cells))) / x.shape[0]
            else:
                truth = exact_answer(q, x, spec.domain).values
            lo, hi = ans.interval()
            if q.kind == "covariance":
                for v in (0, 2):  # var(c), var(y): binary columns, at most 0.25 (Popoviciu)
                    var_n += 1
                    var_over += bool(hi[v] > 0.25)
                    var_cov += bool(lo[v] <= truth[v] <= hi[v])
                    var_max = max(var_max, float(hi[v]))
            for v in range(len(ans.values)):
                if ans.basis[v] != "measured":
                    continue
                tot += 1
                cov += bool(lo[v] <= truth[v] <= hi[v])
                inside += bool(lo[v] <= ans.values[v] <= hi[v])
                se = ans.errors[v]
                normal += bool(np.isfinite(se)) and bool(abs(ans.values[v] - truth[v]) <= 1.96 * se)
                if np.isfinite(se) and se > 0:
                    z = float(abs(ans.values[v] - truth[v]) / se)
                    zs_list.append(z)
                    if z > worst:
                        worst = z
                        wl = (s, q.kind, ans.labels[v], ans.values[v], truth[v], se, lo[v], hi[v])
    zs = np.array(zs_list)
    print(f"n={n} seeds={len(seeds)} bootstrap={boot}: measured values {tot}")
    print(f"  interval covers {cov} ({cov / tot:.3f}); value inside its interval {inside}")
    print(f"  value -+ 1.96 se covers {normal} ({normal / tot:.3f})")
    print(
        f"  |value-truth|/se: median {np.median(zs):.2f}, share > 3: {np.mean(zs > 3):.3f}, "
        f"> 10: {np.mean(zs > 10):.3f}, worst {worst:.3g}"
    )
    print("  worst:", wl)
    print(
        f"  variances of binary columns: {var_n}, upper end > 0.25: {var_over}, "
        f"max {var_max:.3f}, covered {var_cov}"
    )
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
