"""An owner's computations on a dataset larger than memory, partition by partition.

:class:`PartitionedData` is an owner's table as a :class:`~dpmarket.owner.dataset.Dataset` and an
:class:`~dpmarket.owner.engine.Engine`: every computation maps a task over the partitions (each task
reads its partition's columns, computes, and returns a small result) and merges the results here. No
array of ``n x D`` values or features is ever held whole: a task holds one partition's rows and
their features, and drops them when it returns.

What is merged how (:mod:`dpmarket.common.summarization.partitioned` for the selections):

* sums over rows are sums: h1 scores counted above a threshold, a sketch's feature sum, CAPE's
  means, functional-mechanism coefficients and clipped-gradient averages (each a mean over rows,
  merged as ``sum_p n_p f(X_p) / N``);
* bids: a global argmax; candidates: GreeDi (a local greedy per partition, then a greedy over
  the union); uniform samples: per-partition counts from the multivariate hypergeometric law.

Privacy: each row contributes once to each merged result, exactly as in the in-memory
computation, so every mechanism's sensitivity and analysis is unchanged; the owner draws the
noise once, after the merge, never per partition. The tasks run on private data: what they raise
is re-raised at the owner under :func:`dpmarket.common.errors.on_private_data` by the callers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.summarization.partitioned import (
    DEFAULT_GREEDY_EVALUATIONS,
    Best,
    greedi_merge,
    local_greedy,
    merge_best,
    partition_best,
    sample_counts,
)
from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.owner.dataset import Dataset, Partition, read_partition
from dpmarket.owner.engine import Engine, Progress

__all__ = [
    "CHUNK_ROWS",
    "GREEDY_CHUNK_ROWS",
    "SUM_ROWS",
    "PartitionedData",
    "mean_statistic",
]

#: Rows whose h1 features a bid task holds at once (the best of each block is merged).
CHUNK_ROWS = 1 << 16
#: Rows whose h1 features a task holds at once when it sums or counts them: small enough for the
#: CPU's cache (2.2 MiB in float64 at d = 140; 1.6 times faster here than 2^16 rows).
SUM_ROWS = 1 << 11
#: Rows whose h1 features a candidates task holds at once (73 MiB in float32 at d = 140).
GREEDY_CHUNK_ROWS = 1 << 17


def _local_exclude(partition: Partition, sent: NDArray[np.int64]) -> NDArray[np.int64]:
    """The sent points of ``partition``, as local indices (``sent`` sorted, global)."""
    lo = np.searchsorted(sent, partition.offset)
    hi = np.searchsorted(sent, partition.offset + partition.rows)
    return sent[lo:hi] - partition.offset


# ------------------------------------------------------------------------------------ tasks
# Module-level functions: Dask pickles them by reference and runs them on its workers.


@dataclass(frozen=True)
class _Reader:
    """What a task needs to read its partition: every column of the dataset, the features and
    the label column."""

    all_columns: tuple[str, ...]
    features: tuple[str, ...]
    label: str | None

    def read(self, partition: Partition) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
        wanted = (*self.features, self.label) if self.label is not None else self.features
        values = read_partition(partition, wanted, self.all_columns)
        labels = values[:, -1].copy() if self.label is not None else None
        return np.ascontiguousarray(values[:, : len(self.features)]), labels

    def read_columns(self, partition: Partition, columns: Sequence[str]) -> NDArray[np.float64]:
        return read_partition(partition, tuple(columns), self.all_columns)


def _best_task(
    partition: Partition,
    reader: _Reader,
    rff: RFFParams,
    direction: NDArray[np.float32],
    sent: NDArray[np.int64],
) -> tuple[Best | None, NDArray[np.float64] | None, float | None]:
    """The partition's best unsent point by bid, with its raw row and label."""
    x, labels = reader.read(partition)
    exclude = _local_exclude(partition, sent)
    bests: list[Best | None] = []
    for start in range(0, x.shape[0], CHUNK_ROWS):
        features = random_fourier_features(x[start : start + CHUNK_ROWS], rff)
        local = exclude[(exclude >= start) & (exclude < start + CHUNK_ROWS)] - start
        bests.append(partition_best(features, direction, start, local))
    best = merge_best(bests)
    if best is None:
        return None, None, None
    row = x[best.index].copy()
    label = None if labels is None else float(labels[best.index])
    return Best(best.score, partition.offset + best.index), row, label


def _count_task(
    partition: Partition,
    reader: _Reader,
    rff: RFFParams,
    direction: NDArray[np.float32],
    threshold: float,
    sent: NDArray[np.int64],
) -> int:
    """Unsent points of the partition whose score ``h1(x) . direction`` is >= threshold."""
    from dpmarket.common.summarization.kernels import bid_scores

    x, _ = reader.read(partition)
    keep = np.ones(x.shape[0], dtype=bool)
    keep[_local_exclude(partition, sent)] = False
    count = 0
    for start in range(0, x.shape[0], SUM_ROWS):
        scores = bid_scores(random_fourier_features(x[start : start + SUM_ROWS], rff), direction)
        count += int(np.count_nonzero((scores >= threshold) & keep[start : start + SUM_ROWS]))
    return count


def _candidates_task(
    partition: Partition,
    reader: _Reader,
    rff: RFFParams,
    target: NDArray[np.float64],
    k: int,
    seed: int,
    sent: NDArray[np.int64],
    max_evaluations: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None, bool]:
    """GreeDi's first stage on the partition: global indices, raw rows and labels of its local
    greedy choice, and whether stochastic greedy made part of it.

    The partition's features are computed :data:`GREEDY_CHUNK_ROWS` rows at a time: each block
    proposes its local greedy choice, and a greedy over the blocks' union makes the partition's
    (GreeDi within the partition), so a task holds one block's features, whatever the
    partition's size.
    """
    x, labels = reader.read(partition)
    exclude = _local_exclude(partition, sent)
    rng = np.random.default_rng([seed, partition.index])
    chosen: list[NDArray[np.int64]] = []
    features: list[NDArray[np.float32]] = []
    stochastic = False
    for start in range(0, x.shape[0], GREEDY_CHUNK_ROWS):
        block = random_fourier_features(x[start : start + GREEDY_CHUNK_ROWS], rff)
        local = exclude[(exclude >= start) & (exclude < start + block.shape[0])] - start
        picked, by_sampling = local_greedy(
            block, target, k, rng, exclude=local, max_evaluations=max_evaluations
        )
        stochastic |= by_sampling
        chosen.append(picked + start)
        features.append(block[picked])
        del block
    index = np.concatenate(chosen)
    if len(chosen) > 1 and index.size > 0:
        order = greedi_merge(np.concatenate(features), target, min(k, index.size))
        index = index[order]
    rows = x[index].copy()
    return (
        index + partition.offset,
        rows,
        None if labels is None else labels[index].copy(),
        stochastic,
    )


def _h1_sum_task(
    partition: Partition, reader: _Reader, rff: RFFParams
) -> tuple[int, NDArray[np.float64]]:
    """The partition's rows and the sum of their h1 features (float64), chunk by chunk."""
    x, _ = reader.read(partition)
    total = np.zeros(rff.d)
    for start in range(0, x.shape[0], SUM_ROWS):
        total += random_fourier_features(x[start : start + SUM_ROWS], rff, dtype=np.float64).sum(
            axis=0
        )
    return int(x.shape[0]), total


def _h1_moments_task(
    partition: Partition, reader: _Reader, rff: RFFParams
) -> tuple[int, NDArray[np.float64], NDArray[np.float64]]:
    """The partition's rows, the sum of their h1 features and of their outer products."""
    x, _ = reader.read(partition)
    total = np.zeros(rff.d)
    outer = np.zeros((rff.d, rff.d))
    for start in range(0, x.shape[0], SUM_ROWS):
        h = random_fourier_features(x[start : start + SUM_ROWS], rff, dtype=np.float64)
        total += h.sum(axis=0)
        outer += h.T @ h
    return int(x.shape[0]), total, outer


def _available_task(partition: Partition, sent: NDArray[np.int64]) -> int:
    return partition.rows - int(_local_exclude(partition, sent).size)


def _sample_task(
    partition: Partition, reader: _Reader, k: int, seed: int, sent: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None]:
    """``k`` unsent rows of the partition drawn uniformly without replacement."""
    x, labels = reader.read(partition)
    keep = np.ones(x.shape[0], dtype=bool)
    keep[_local_exclude(partition, sent)] = False
    rng = np.random.default_rng([seed, partition.index])
    local = np.sort(rng.choice(np.flatnonzero(keep), size=k, replace=False)).astype(np.int64)
    return local + partition.offset, x[local].copy(), (None if labels is None else labels[local])


def _rows_task(
    partition: Partition, reader: _Reader, local: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    x, labels = reader.read(partition)
    return x[local].copy(), (None if labels is None else labels[local].copy())


def _statistic_task(
    partition: Partition,
    reader: _Reader,
    columns: tuple[str, ...],
    fn: Callable[[NDArray[np.float64]], Any],
) -> Any:
    """``fn`` of the partition's ``columns`` (a per-partition statistic)."""
    return fn(reader.read_columns(partition, columns))


def mean_statistic(
    parts: Sequence[tuple[int, NDArray[np.float64]]],
) -> tuple[int, NDArray[np.float64]]:
    """Merge per-partition means ``(n_p, f(X_p))`` into ``(N, sum_p n_p f(X_p) / N)``: the mean
    over every row (partitions with no row skipped)."""
    total = sum(n for n, _ in parts)
    acc: NDArray[np.float64] | None = None
    for n, value in parts:
        if n == 0:
            continue
        term = np.asarray(value, dtype=np.float64) * n
        acc = term if acc is None else acc + term
    if acc is None or total == 0:
        raise ValueError("no row to average")
    return total, acc / total


# ------------------------------------------------------------------------------- the data
class PartitionedData:
    """An owner's table on an engine: what the owner's protocols compute, partition by partition.

    Parameters
    ----------
    dataset : Dataset
        Validated, with its row counts (:func:`dpmarket.owner.validation.validate_dataset`).
    engine : Engine
    features : sequence of str
        The columns that are the summarized points' features (the schema's features).
    label : str, optional
        The label column, if any.
    max_evaluations : int
        :func:`dpmarket.common.summarization.partitioned.local_greedy`'s switch to stochastic
        greedy.
    """

    def __init__(
        self,
        dataset: Dataset,
        engine: Engine,
        *,
        features: Sequence[str],
        label: str | None = None,
        max_evaluations: int = DEFAULT_GREEDY_EVALUATIONS,
    ) -> None:
        if not dataset.counted:
            raise ValueError("the dataset's rows must be counted (validate it first)")
        dataset.column_indices([*features, *([label] if label else [])])
        self.dataset = dataset
        self.engine = engine
        self.reader = _Reader(dataset.columns, tuple(features), label)
        self.max_evaluations = max_evaluations

    @property
    def n_points(self) -> int:
        """Rows in all."""
        return self.dataset.n_rows

    @property
    def n_features(self) -> int:
        """Feature columns."""
        return len(self.reader.features)

    @property
    def has_labels(self) -> bool:
        """Whether a label column is read."""
        return self.reader.label is not None

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """The dataset's partitions."""
        return self.dataset.partitions

    def _map(
        self,
        fn: Callable[..., Any],
        *args: Any,
        parts: Sequence[Partition] | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Any]:
        items = self.partitions if parts is None else parts
        return self.engine.map(fn, items, *args, progress=progress, cancel=cancel)

    # ----------------------------------------------------------------- summarization steps
    def best(
        self,
        rff: RFFParams,
        direction: NDArray[np.float32],
        sent: NDArray[np.int64],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[Best, NDArray[np.float64], float | None] | None:
        """The best unsent point by bid (global argmax), its raw row and label."""
        found = self._map(
            _best_task, self.reader, rff, direction, sent, progress=progress, cancel=cancel
        )
        best = merge_best([b for b, _, _ in found])
        if best is None:
            return None
        for b, row, label in found:
            if b is not None and b.index == best.index:
                assert row is not None
                return best, row, label
        raise AssertionError("the merged best comes from a partition")

    def h1_mean(
        self,
        rff: RFFParams,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> NDArray[np.float64]:
        """The mean h1 embedding of every point, ``sum_i h1(x_i) / n``: a sum per partition,
        summed (each row counted once, so the sensitivity of any release of it is the in-memory
        one's)."""
        found = self._map(_h1_sum_task, self.reader, rff, progress=progress, cancel=cancel)
        total = sum(t for _, t in found)
        return np.asarray(total, dtype=np.float64) / sum(n for n, _ in found)

    def h1_moments(
        self,
        rff: RFFParams,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The mean h1 embedding (shape (d,)) and the uncentered second moment
        ``sum_i h1(x_i) h1(x_i)^T / n`` (shape (d, d)) of every point, summed over partitions: what
        :func:`dpmarket.common.summarization.candidates.shrink_towards_moments` reads. Never leaves
        the owner."""
        found = self._map(_h1_moments_task, self.reader, rff, progress=progress, cancel=cancel)
        n = sum(k for k, _, _ in found)
        total = np.asarray(sum(t for _, t, _ in found), dtype=np.float64)
        outer = np.asarray(sum(o for _, _, o in found), dtype=np.float64)
        return total / n, outer / n

    def count_at_least(
        self,
        rff: RFFParams,
        direction: NDArray[np.float32],
        threshold: float,
        sent: NDArray[np.int64],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> int:
        """Unsent points whose score is at least ``threshold`` (a sum of per-partition counts)."""
        counts = self._map(
            _count_task,
            self.reader,
            rff,
            direction,
            float(threshold),
            sent,
            progress=progress,
            cancel=cancel,
        )
        return int(sum(counts))

    def candidates(
        self,
        rff: RFFParams,
        target: NDArray[np.float64],
        count: int,
        sent: NDArray[np.int64],
        seed: int,
        *,
        start: NDArray[np.floating] | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None, int]:
        """GreeDi: ``count`` unsent points, their raw rows and labels, and how many partitions
        ran stochastic greedy.

        Each partition proposes its local greedy choice of ``count`` points (seeded by ``seed``
        and its index); the owner runs the exact greedy over their union, continuing from the
        h1 features ``start`` (shape (s, d)) of points already chosen, if any.
        """
        found = self._map(
            _candidates_task,
            self.reader,
            rff,
            np.asarray(target, dtype=np.float64),
            int(count),
            int(seed),
            sent,
            int(self.max_evaluations),
            progress=progress,
            cancel=cancel,
        )
        index = np.concatenate([f[0] for f in found])
        rows = np.concatenate([f[1] for f in found])
        labels = None if found[0][2] is None else np.concatenate([f[2] for f in found])
        stochastic = sum(1 for f in found if f[3])
        if index.size < count:
            raise ValueError(f"count {count} exceeds the {index.size} points not yet sent")
        union = random_fourier_features(rows, rff)
        order = greedi_merge(union, target, count, start=start)
        return index[order], rows[order], (None if labels is None else labels[order]), stochastic

    def sample(
        self,
        count: int,
        sent: NDArray[np.int64],
        rng: np.random.Generator,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None]:
        """``count`` unsent points drawn uniformly without replacement, their rows and labels."""
        available = [_available_task(p, sent) for p in self.partitions]
        counts = sample_counts(available, count, rng)
        seed = int(rng.integers(0, 2**63 - 1))
        chosen = [(p, int(k)) for p, k in zip(self.partitions, counts, strict=True) if k > 0]
        found = self.engine.map(
            _sample_one,
            chosen,
            self.reader,
            seed,
            sent,
            progress=progress,
            cancel=cancel,
        )
        index = np.concatenate([f[0] for f in found])
        rows = np.concatenate([f[1] for f in found])
        labels = None if found[0][2] is None else np.concatenate([f[2] for f in found])
        return index, rows, labels

    def rows(
        self, index: NDArray[np.int64], *, cancel: threading.Event | None = None
    ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
        """The raw rows and labels at global ``index`` (any order)."""
        index = np.asarray(index, dtype=np.int64)
        starts = np.array([p.offset for p in self.partitions])
        which = np.searchsorted(starts, index, side="right") - 1
        out = np.empty((index.size, self.n_features))
        labels = np.empty(index.size) if self.has_labels else None
        groups = sorted(set(which.tolist()))
        items = [
            (self.partitions[g], index[which == g] - self.partitions[g].offset) for g in groups
        ]
        found = self.engine.map(_rows_one, items, self.reader, cancel=cancel)
        for g, (x, lab) in zip(groups, found, strict=True):
            out[which == g] = x
            if labels is not None and lab is not None:
                labels[which == g] = lab
        return out, labels

    # ------------------------------------------------------------------- statistics (CAPE)
    def statistic(
        self,
        columns: Sequence[str],
        fn: Callable[[NDArray[np.float64]], Any],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Any]:
        """``fn`` of every partition's ``columns`` (in partition order), for the caller to
        merge (e.g. :func:`mean_statistic`)."""
        self.dataset.column_indices(columns)
        return self._map(
            _statistic_task,
            self.reader,
            tuple(columns),
            fn,
            progress=progress,
            cancel=cancel,
        )


def _sample_one(
    item: tuple[Partition, int], reader: _Reader, seed: int, sent: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None]:
    partition, k = item
    return _sample_task(partition, reader, k, seed, sent)


def _rows_one(
    item: tuple[Partition, NDArray[np.int64]], reader: _Reader
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    partition, local = item
    return _rows_task(partition, reader, local)


class PartitionedTable:
    """An owner's table for joint statistics (CAPE) and sketches, partitioned: its public
    declarations (column names, row count, declared 0/1 columns, schema) and its
    :class:`PartitionedData`, whose :meth:`PartitionedData.statistic` computes on it.

    Parameters
    ----------
    data : PartitionedData
    name : str
    binary : tuple of str
        Columns declared 0/1 (checked by the validation pass).
    schema : Schema, optional
    """

    def __init__(
        self,
        data: PartitionedData,
        name: str,
        binary: tuple[str, ...] = (),
        schema: Any = None,
    ) -> None:
        missing = [c for c in binary if c not in data.dataset.columns]
        if missing:
            raise ValueError(
                f"table {name!r} has no column(s) {missing} to declare 0/1; its columns are "
                f"{list(data.dataset.columns)}"
            )
        self.data = data
        self.name = name
        self.binary = tuple(binary)
        self.schema = schema

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names, in file order."""
        return self.data.dataset.columns

    @property
    def n_rows(self) -> int:
        """Rows in all."""
        return self.data.n_points

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise ``ValueError`` naming the columns the table lacks (names only)."""
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise ValueError(
                f"table {self.name!r} has no column(s) {missing}; its columns are "
                f"{list(self.columns)}"
            )
