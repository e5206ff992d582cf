"""Where an append's time goes, for `bench.soak`'s appenders: the waits for the raw log's commit
lock and for the serving index's write transaction, the catch-up, the commit, the index update.

`trace()` wraps those steps of the JVM-free backend in this process (a bench's own process, not a
test: nothing is replaced, every step still runs); `take()` returns the milliseconds each step took
since the last call, which the appender writes beside the append's own time. A slow append then
shows whether it waited (on a lock another process held) or worked (CPU shared with Spark).

    trace()
    log.append_events(events)
    take()  # {"commit_lock_wait": 0.02, "catch_up": 1.3, "index_wait": 0.0, "commit": 2.1, ...}
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

_spent: defaultdict[str, float] = defaultdict(float)


def _timed(name: str, function: Callable) -> Callable:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _spent[name] += time.perf_counter() - started

    return timed


def _entered(name: str, manager: Callable) -> Callable:
    """`manager` (a context manager factory) with the time its `__enter__` took: a lock's wait."""

    @functools.wraps(manager)
    @contextmanager
    def entered(*args: Any, **kwargs: Any):
        started = time.perf_counter()
        with manager(*args, **kwargs) as value:
            _spent[name] += time.perf_counter() - started
            yield value

    return entered


def trace() -> None:
    """Time the append's steps in this process from now on."""
    from databuild_assets.log.serving import appends, backend, checkpoints, index

    appends.commit_lock = _entered("commit_lock_wait", appends.commit_lock)
    appends.commit_append = _timed("commit", appends.commit_append)
    appends.IndexedAppends._stage = _timed("stage", appends.IndexedAppends._stage)
    backend.DeltaRsEventLog._catch_up = _timed("catch_up", backend.DeltaRsEventLog._catch_up)
    index.ServingIndex.updating = _entered("index_wait", index.ServingIndex.updating)
    index.ServingIndex.add_events = _timed("index_add", index.ServingIndex.add_events)
    index.ServingIndex.known_event_ids = _timed("dedup", index.ServingIndex.known_event_ids)
    checkpoints.Checkpointer.after_commit = _timed("checkpoint_start", checkpoints.Checkpointer.after_commit)


def take() -> dict[str, float]:
    """Milliseconds per step since the last call (steps that took no time left out)."""
    spent = {name: round(seconds * 1000, 3) for name, seconds in _spent.items() if seconds}
    _spent.clear()
    return spent


__all__ = ["take", "trace"]
