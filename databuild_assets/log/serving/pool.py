"""Segment files read side by side: a read that spans many segments (a partition's events over a
long history, a range over many segments) decodes a row group in each, and Arrow's decoding
releases the GIL, so a small pool of threads shared by the process reads them at once.

    tables = each(lambda segment: read_segment_rows(folder, segment, "key", [ref], True), segments)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # imported with the first pool: a read of a hot key needs none (decision 0057)
    from concurrent.futures import ThreadPoolExecutor

Item = TypeVar("Item")
Result = TypeVar("Result")

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _after_fork() -> None:  # a lock another thread held at the fork would stay held in the child
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _pool() -> ThreadPoolExecutor:
    """The process's pool: one per process id, because a forked child inherits the parent's
    executor object but none of its threads (a task given to it would wait forever)."""
    with _lock:
        pool = _pools.get(os.getpid())
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            workers = max(2, os.cpu_count() or 1)  # the reads decode with Arrow's threads off
            pool = _pools[os.getpid()] = ThreadPoolExecutor(workers, thread_name_prefix="databuild-segments")
        return pool


def each(function: Callable[[Item], Result], items: Iterable[Item]) -> list[Result]:
    """`function` of each of `items`, in their order: side by side when there are several (the
    exception of the first that raised, in that order, is raised)."""
    items = list(items)
    if len(items) < 2:
        return [function(item) for item in items]
    return list(_pool().map(function, items))


__all__ = ["each"]
