"""Work a page starts and does not wait for: run by key in the background, its result read later.

A console page whose answer takes longer than a page should (an answer fitted on a synthetic
design, a second or more on a loaded machine) starts it here and answers at once with a page that
reloads itself until the result is there (:meth:`Background.result`): the request never blocks
on the computation, and asking again for the same key while it runs starts nothing new.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Generic, TypeVar

__all__ = ["KEPT", "Background"]

T = TypeVar("T")

#: Computations kept by key: the running ones and the finished ones not read yet (the oldest
#: finished one is dropped beyond this many).
KEPT = 32


class Background(Generic[T]):
    """Computations by key, one at a time on a worker thread of their own.

    Parameters
    ----------
    name : str
        The worker thread's name.
    """

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._jobs: OrderedDict[Hashable, tuple[Future[T], float]] = OrderedDict()

    def result(
        self, key: Hashable, compute: Callable[[], T], wait: float
    ) -> tuple[T | None, float]:
        """``compute()``'s result for ``key``, started now unless it runs or ended unread.

        Waits at most ``wait`` seconds. Returns ``(result, seconds since it started)``, the
        result None while it runs. A result (or the exception ``compute`` raised, re-raised
        here) is handed out once; the next call for ``key`` computes again.

        Raises
        ------
        Exception
            Whatever ``compute`` raised.
        """
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = (self._pool.submit(compute), time.monotonic())
                self._jobs[key] = job
                self._trim()
        future, started = job
        try:
            out = future.result(timeout=wait)
        except FutureTimeout:
            return None, time.monotonic() - started
        finally:
            if future.done():
                with self._lock:
                    if self._jobs.get(key) is job:
                        del self._jobs[key]
        return out, time.monotonic() - started

    def _trim(self) -> None:
        """Drop the oldest finished computations beyond :data:`KEPT` (the lock held)."""
        finished = [k for k, (f, _) in self._jobs.items() if f.done()]
        for key in finished[: max(0, len(self._jobs) - KEPT)]:
            del self._jobs[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def shutdown(self) -> None:
        """Stop taking work; what runs finishes on its own (its thread ends with it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
