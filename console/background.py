"""Work a page starts and does not wait for: run by key in the background, its result read later.

A console page whose answer takes longer than a page should (an answer fitted on a synthetic
design, a second or more on a loaded machine) starts it here and answers at once with a page that
reloads itself until the result is there (:meth:`Background.result`): the request never blocks
on the computation, and asking again for the same key while it runs starts nothing new.

Work done ahead of any page (a console's warm-up) gives way to the pages' own:
:class:`GiveWay` holds it between its steps while a page's computation runs, which would
otherwise share the interpreter with it (a first answer in a console's first seconds took
1.0 s instead of 0.3 s beside the warm-up).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["KEPT", "Background", "GiveWay"]

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


class GiveWay:
    """Work asked for by a page before work done ahead: :meth:`asked` marks a page's
    computation while it runs; :meth:`pause`, called by the work ahead between its steps,
    returns once none runs (or after ``limit`` seconds of waiting, so that a stream of
    questions cannot hold the work ahead for ever).

    Parameters
    ----------
    limit : float
        Seconds :meth:`pause` waits at most, in a row.
    """

    def __init__(self, limit: float = 30.0) -> None:
        self._limit = limit
        self._running = 0
        self._quiet = threading.Condition()

    @contextmanager
    def asked(self) -> Iterator[None]:
        """Around a page's computation: work ahead pauses before its next step meanwhile."""
        with self._quiet:
            self._running += 1
        try:
            yield
        finally:
            with self._quiet:
                self._running -= 1
                self._quiet.notify_all()

    def pause(self) -> None:
        """Return once no page's computation runs (at most ``limit`` seconds from now)."""
        with self._quiet:
            self._quiet.wait_for(lambda: self._running == 0, timeout=self._limit)
