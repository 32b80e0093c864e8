"""Giving freed memory back to the operating system after a large request.

glibc's ``malloc`` keeps what a process frees for its own next allocations: the heap of each of
its arenas (one per thread that allocated, up to eight per core) shrinks only from its top, and
only when the free space there exceeds ``M_TRIM_THRESHOLD``. gRPC receives a message in many
small buffers on its own threads, and Python copies it, parses it and decodes its arrays on the
event loop's thread; the freed buffers stay scattered over the arenas, between chunks still in
use. A service that received a few large requests then keeps their size in its RSS for good:
refused 15 MiB ``CreateSession`` requests (40 in a row, then three bursts of 32) left a curator
at 712 MiB from 239 MiB with nothing of them alive in Python, and ``malloc_trim(0)`` gave all
but 35 MiB back (``MALLOC_ARENA_MAX=2`` or a fixed ``M_MMAP_THRESHOLD`` alone left
815 and 954 MiB). :func:`release_free_memory` is that call; the admission of every call
(:mod:`dpmarket.runtime.admission`) makes it when a call that received at least
:data:`RELEASE_AFTER_BYTES` ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RELEASE_AFTER_BYTES", "large_call_began", "large_call_ended", "release_free_memory"]

logger = logging.getLogger(__name__)

#: Request bytes of one call after which its end gives the process's free memory back (1 MiB):
#: far above an id-and-scalars request, far below the array payloads that leave megabytes
#: behind.
RELEASE_AFTER_BYTES = 1 << 20


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library: musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Return the free pages of every malloc arena to the operating system (``malloc_trim(0)``).

    Memory in use is untouched; only the pages of free chunks are released (``madvise``), so the
    next allocations fault them in again. It takes a few milliseconds with hundreds of MiB free
    and holds each arena's lock in turn.

    Returns
    -------
    bool
        Whether memory was released (False also where the C library has no ``malloc_trim``).
    """
    if _TRIM is None:
        return False
    start = time.perf_counter()
    released = bool(_TRIM(0))
    logger.debug(
        "malloc_trim: %s in %.1f ms",
        "released free memory" if released else "nothing to release",
        (time.perf_counter() - start) * 1e3,
    )
    return released


_lock = threading.Lock()
_large_calls = 0


def large_call_began() -> None:
    """Count in a call that has received :data:`RELEASE_AFTER_BYTES` or more."""
    global _large_calls
    with _lock:
        _large_calls += 1


def large_call_ended() -> None:
    """Count out a call counted in by :func:`large_call_began`; the last one in progress to end
    gives the process's free memory back (:func:`release_free_memory`).

    Raises
    ------
    RuntimeError
        If no such call is in progress.
    """
    global _large_calls
    with _lock:
        if _large_calls < 1:
            raise RuntimeError("large_call_ended without a large call in progress")
        _large_calls -= 1
        last = _large_calls == 0
    if last:
        release_free_memory()
