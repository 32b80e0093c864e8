"""An owner's resource limits: when its table is kept in memory, and which work it refuses.

**In memory or partitioned.** A table of at most :data:`DEFAULT_IN_MEMORY_VALUES` values (rows x
columns; 32 MiB in float64, e.g. 419,430 rows of 10 columns) and at most :data:`MAX_IN_MEMORY_ROWS`
rows is read into memory and served from there: each session computes the h1 features of every point
once, when it opens, and holds them (n x d float32: at most 100 MiB at the default d = 140, so each
further concurrent session adds no more). A larger table is served partition by partition on Dask
(:mod:`dpmarket.owner.partitioned`): nothing of size n is held, each step is a pass over the
partitions, and a session holds only its state. Both give the same sums and the same bids; the
candidates differ by design (GreeDi). ``owner serve --in-memory-values`` (config key
``in_memory_values``) moves the values threshold.

**Budgets.** Before a session opens, the owner estimates its work from public sizes only — the
row count, the column count, h1's dimension d and the largest partition — and refuses the
session when the estimate exceeds its policy's ``limits.session_memory_mib`` (memory the session
would hold: the features of every point in memory, or a partition's features per worker) or
``limits.step_seconds`` (one pass over the table at :data:`ASSUMED_ROWS_PER_SECOND` per worker).
The owner's console says which budget and by how much; the curator gets a fixed message
(:data:`REFUSED`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dpmarket.common.errors import FailedPreconditionError

__all__ = [
    "ASSUMED_ROWS_PER_SECOND",
    "DEFAULT_IN_MEMORY_VALUES",
    "MAX_IN_MEMORY_ROWS",
    "QUICK_STEP_BYTES",
    "REFUSED",
    "WorkLimits",
    "session_estimate",
]

logger = logging.getLogger(__name__)

#: Most values (rows x columns) of a table kept in memory; above, it is partitioned.
DEFAULT_IN_MEMORY_VALUES = 1 << 22
#: Most rows of a table kept in memory, whatever its columns: an in-memory session holds the h1
#: features of every row, 4 bytes x d per row, at most 100 MiB at the default d = 140
#: (``SummarizationConfig.rff_dimension``); a narrow table of more rows (e.g. 2 million rows of
#: 2 columns, 1.1 GiB of features per session) is partitioned.
MAX_IN_MEMORY_ROWS = (100 << 20) // (4 * 140)
#: Most bytes of features a step may read on the service's event loop rather than in a worker
#: thread (a bid of a session held in memory: one matrix-vector product over them, about 5 ms at
#: this size here): the largest in-memory session at the default d = 140.
QUICK_STEP_BYTES = 100 << 20
#: Rows per second one worker computes h1 features of (d = 140, 10 columns), for the time
#: estimate: a conservative figure below the ones ``make bench`` measures (bench/owner_scale.py).
ASSUMED_ROWS_PER_SECOND = 150_000.0
#: What the curator hears when a budget refuses a session.
REFUSED = "this owner's resource limits refuse the session"
#: Bytes a partitioned session holds at the owner whatever n (its state and the partitions'
#: results), for the estimate.
_SESSION_OVERHEAD = 16 << 20


def session_estimate(
    *,
    n_rows: int,
    n_features: int,
    d: int,
    partitioned: bool,
    largest_partition: int,
    workers: int,
    rows_per_second: float = ASSUMED_ROWS_PER_SECOND,
) -> tuple[int, float]:
    """A session's memory (bytes) and the time of its longest step (seconds), from sizes.

    In memory: the float32 features of every row (``4 n d``) and one float64 working block;
    the step is the features' computation. Partitioned: the session's own state, plus one
    partition's rows and features per worker (``largest x (8 columns + 4 d)``); a step is a pass
    over every row, shared by the workers.
    """
    if not partitioned:
        memory = 4 * n_rows * d + 8 * min(n_rows, 1 << 16) * d
        return memory, n_rows / rows_per_second
    memory = _SESSION_OVERHEAD + workers * largest_partition * (8 * n_features + 4 * d)
    return memory, n_rows / (rows_per_second * max(workers, 1))


@dataclass(frozen=True)
class WorkLimits:
    """The owner's budgets and what it knows of its engine.

    Attributes
    ----------
    memory_bytes : int or None
        Most memory one session may need (``None``: no limit).
    step_seconds : float or None
        Longest estimated step (``None``: no limit).
    largest_partition : int
        Rows of the largest partition (0 for a table in memory).
    workers : int
        Workers computing at once.
    rows_per_second : float
        Assumed h1 throughput of one worker.
    """

    memory_bytes: int | None = None
    step_seconds: float | None = None
    largest_partition: int = 0
    workers: int = 1
    rows_per_second: float = ASSUMED_ROWS_PER_SECOND

    def check_session(
        self, *, n_rows: int, n_features: int, d: int, partitioned: bool, open_sessions: int
    ) -> None:
        """Refuse a session whose estimated work exceeds a budget.

        Raises
        ------
        FailedPreconditionError
            With the fixed message :data:`REFUSED` (the owner's log says which budget).
        """
        memory, seconds = session_estimate(
            n_rows=n_rows,
            n_features=n_features,
            d=d,
            partitioned=partitioned,
            largest_partition=self.largest_partition,
            workers=self.workers,
            rows_per_second=self.rows_per_second,
        )
        if self.memory_bytes is not None and memory > self.memory_bytes:
            logger.warning(
                "session refused: it would need about %.0f MiB (%d rows, d=%d%s), over this "
                "owner's limits.session_memory_mib = %.0f MiB",
                memory / 2**20,
                n_rows,
                d,
                ", partitioned" if partitioned else ", in memory",
                self.memory_bytes / 2**20,
            )
            raise FailedPreconditionError(REFUSED)
        if self.step_seconds is not None and seconds > self.step_seconds:
            logger.warning(
                "session refused: one pass over %d rows would take about %.0f s at %.0f rows/s "
                "on %d worker(s), over this owner's limits.step_seconds = %.0f s",
                n_rows,
                seconds,
                self.rows_per_second,
                self.workers,
                self.step_seconds,
            )
            raise FailedPreconditionError(REFUSED)
