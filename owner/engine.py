"""Where an owner's per-partition work runs: in its own process, or on Dask.

An :class:`Engine` maps a function over partitions and returns the results in partition order; the
owner merges them (sums as sums, selections by their merge rule, :mod:`dpmarket.owner.partitioned`).

* :class:`SerialEngine` runs every partition in the calling thread (tests, small tables);
* :class:`DaskEngine` runs them on ``dask.distributed``: a :class:`distributed.LocalCluster` of
  worker processes on this machine by default, or the owner's own scheduler by address
  (``owner serve --dask-scheduler tcp://HOST:8786``). The workers read the partitions themselves
  (every worker must see the files at the same paths or URLs); only the partitions' small
  results come back.

Both report progress (partitions done of total) and stop at once when their ``cancel`` event is
set: no new partition starts, the pending ones are cancelled on the cluster, and
:class:`WorkCancelled` is raised. Given the same function and partitions, both return the same
results: the tests compare them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from dpmarket.common.errors import AbortedError

__all__ = ["DaskEngine", "Engine", "SerialEngine", "WorkCancelled", "start_engine"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: glibc settings of the local cluster's workers. Dask sets ``MALLOC_TRIM_THRESHOLD_`` to 64 KiB
#: (to hand freed memory back to the system at once), which also turns off glibc's adaptive
#: mmap threshold: every array above 128 KiB is then a fresh mmap whose pages fault in zeroed,
#: and a computation that allocates cache-sized blocks (RFF features, 512 to 2,048 rows at a
#: time) spent most of its time in the kernel (an RFF sketch 31 us per row against 4.9 us, one
#: core). Blocks below 32 MiB come from the heap instead, and up to 64 MiB of free heap is kept
#: per worker.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": 64 << 20, "MALLOC_MMAP_THRESHOLD_": 32 << 20}

#: Arrays larger than this are scattered to the cluster once rather than sent with every task.
_SCATTER_BYTES = 1 << 16
Progress = Callable[[int, int], None]


class WorkCancelled(AbortedError):
    """The work was cancelled (its session closed or its caller gone); nothing was released."""


class Engine(Protocol):
    """Maps a function over partitions (see the module docstring)."""

    @property
    def workers(self) -> int:
        """Processes (or threads) computing at once."""
        ...

    def map(
        self,
        fn: Callable[..., T],
        items: Sequence[Any],
        *args: Any,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> list[T]:
        """``[fn(item, *args) for item in items]``, in order.

        Raises
        ------
        WorkCancelled
            If ``cancel`` is set before every item is done.
        Exception
            Whatever ``fn`` raised for the first failing item.
        """
        ...

    def close(self) -> None:
        """Release the engine's processes (a cluster it started)."""
        ...


class SerialEngine:
    """Every partition in the calling thread, in order."""

    @property
    def workers(self) -> int:
        """One."""
        return 1

    def map(
        self,
        fn: Callable[..., T],
        items: Sequence[Any],
        *args: Any,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> list[T]:
        """See :meth:`Engine.map`."""
        out = []
        for done, item in enumerate(items):
            if cancel is not None and cancel.is_set():
                raise WorkCancelled("the work was cancelled")
            out.append(fn(item, *args))
            if progress is not None:
                progress(done + 1, len(items))
        return out

    def close(self) -> None:
        """Nothing to release."""


class DaskEngine:
    """Partitions as tasks of a ``dask.distributed`` cluster.

    Parameters
    ----------
    client : distributed.Client
    cluster : distributed.LocalCluster, optional
        A cluster this engine started (closed with it).
    poll : float
        Seconds between checks of the cancel event while tasks run.
    """

    def __init__(self, client: Any, cluster: Any = None, *, poll: float = 0.1) -> None:
        self.client = client
        self.cluster = cluster
        self.poll = poll

    @property
    def workers(self) -> int:
        """Threads of the cluster's workers (at least one)."""
        info = self.client.scheduler_info(n_workers=-1) if self.client else {}
        threads = sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values())
        return max(threads, 1)

    @property
    def address(self) -> str:
        """The scheduler's address."""
        return str(self.client.scheduler.address)

    def map(
        self,
        fn: Callable[..., T],
        items: Sequence[Any],
        *args: Any,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> list[T]:
        """See :meth:`Engine.map`. Arguments are sent to the cluster once (scattered), not
        once per partition; results come back as each partition finishes."""
        if not items:
            return []
        import numpy as np

        # Large arrays go to the cluster once; other arguments are small and travel with tasks.
        shared = [
            self.client.scatter(a, broadcast=False, hash=False)
            if isinstance(a, np.ndarray) and a.nbytes > _SCATTER_BYTES
            else a
            for a in args
        ]
        scattered = [s for s, a in zip(shared, args, strict=True) if s is not a]
        futures = self.client.map(fn, list(items), *[[s] * len(items) for s in shared], pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(items)
        done = 0
        finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for future in futures:
            future.add_done_callback(finished.put)
        try:
            while done < len(items):
                if cancel is not None and cancel.is_set():
                    raise WorkCancelled("the work was cancelled")
                # Wakes as soon as a partition finishes (a short job costs no polling delay),
                # and at least every `poll` seconds to look at the cancel event.
                try:
                    future = finished.get(timeout=self.poll)
                except queue.Empty:
                    continue
                results[index[future.key]] = future.result()
                future.release()
                done += 1
                if progress is not None:
                    progress(done, len(items))
        except BaseException:
            self.client.cancel(futures)
            raise
        finally:
            for s in scattered:
                s.release()
        return results

    def close(self) -> None:
        """Close the client, and the cluster when this engine started it."""
        self.client.close(timeout=10)
        if self.cluster is not None:
            self.cluster.close(timeout=20)


def start_engine(
    scheduler: str | None = None, *, workers: int | None = None, memory_limit: str | int = "auto"
) -> DaskEngine:
    """Connect to the owner's Dask scheduler, or start a local cluster of worker processes.

    Parameters
    ----------
    scheduler : str, optional
        ``tcp://HOST:PORT`` of a running scheduler (``owner serve --dask-scheduler``); default: a
        new :class:`distributed.LocalCluster` on this machine.
    workers : int, optional
        Worker processes of the local cluster, one thread each (default: the CPUs this process
        may use).
    memory_limit : str or int
        Per worker of the local cluster (Dask's ``memory_limit``).

    Raises
    ------
    OSError
        If the scheduler cannot be reached (the message names it).
    """
    from distributed import Client, LocalCluster

    # Dask's own chatter (workers starting, connections closing) is not the owner's business.
    for name in ("distributed", "tornado"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s", set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise OSError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        logger.info("Dask: scheduler %s", scheduler)
        return DaskEngine(client)
    import dask

    n = workers or len(os.sched_getaffinity(0))
    with dask.config.set(
        {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in MALLOC_ENV.items()}
    ):
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            # The scheduler's HTTP server (no dashboard) on a free port: a fixed 8787 collides
            # with a second owner's engine on the same host.
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
            memory_limit=memory_limit,
            silence_logs=logging.WARNING,
        )
    client = Client(cluster, set_as_default=False)
    logger.info("Dask: local cluster of %d worker process(es) at %s", n, cluster.scheduler_address)
    return DaskEngine(client, cluster)
