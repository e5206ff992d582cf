"""One lock per table that every committer of a local lake takes: Spark jobs and delta-rs writers.

Delta's optimistic concurrency rests on an atomic "write the next commit file if absent". On a
local disk, delta-rs does that atomically (a hard link), but Spark's default log store for
`file:` checks and renames in two steps, guarded only inside its own JVM. A Spark job and a
JVM-free appender committing to the same table at the same instant could both write version N.
So every code path that commits to a table a JVM-free process also writes (the raw event log)
holds this lock while it reads what it checks and commits: an OS advisory lock (flock) on
a hidden file beside the table's folder (`tables/.raw_event_log.commit-lock`), released by
the OS if the holder dies. The raw log's MERGE (ingestion, writer API) takes it, and so do
the paths shared by every table (create, purge, OPTIMIZE, VACUUM, schema upgrade): a system
call each.

The lock file is made 0600 and must be this user's, and a wait is bounded (runtime/lock_files.py):
a lock others could open would let them stall every commit. A process that commits narrows its
umask (runtime/file_modes.py), so what delta-rs writes under the lock is not readable by others.

    with commit_lock(lake.table_path(RAW_EVENT_LOG)):
        merge_new_events(...)

Object stores (s3a://, abfss://) are not locked here: they need a log store made for them
(docs/decisions/0009-one-commit-lock-for-the-raw-log.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from databuild_assets.runtime.file_modes import make_folders, restrict_umask
from databuild_assets.runtime.lake import is_local
from databuild_assets.runtime.lock_files import held_lock

# flock conflicts between two descriptors of one process too, so a thread that already holds a
# table's lock (a compaction that appends) must not take it again: it would wait for itself.
_held = threading.local()


def lock_path(table_path: str) -> Path:
    """The lock file of the table at `table_path`: hidden, beside the table's folder (not in
    it, where vacuum would see an unknown file)."""
    return _beside(table_path, "commit-lock")


def checkpoint_lock_path(table_path: str) -> Path:
    """The lock file an appender holds while it writes the table's checkpoint, beside the commit
    lock: the others skip the checkpoint meanwhile instead of writing one each
    (log/serving/checkpoints.py)."""
    return _beside(table_path, "checkpoint-lock")


def _beside(table_path: str, kind: str) -> Path:
    table = Path(table_path.removeprefix("file://").removeprefix("file:"))
    return table.parent / f".{table.name}.{kind}"


@contextmanager
def commit_lock(table_path: str, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the commit lock of the table at `table_path` for the block (re-entrant within a
    thread). Waits for another holder at most `timeout_s` (default: DATABUILD_LOCK_TIMEOUT_S,
    30 minutes), then raises LockTimeoutError naming the lock file and its holder; a lock file
    that is a symbolic link or another user's raises UnsafeLockFileError. A table on an object
    store takes no lock.
    """
    held: set[str] = _held.__dict__.setdefault("paths", set())
    if not is_local(table_path):
        yield
        return
    path = lock_path(table_path)
    key = str(path)
    if key in held:
        yield
        return
    restrict_umask()
    make_folders(str(path.parent))
    with held_lock(path, "the commit lock", timeout_s):
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)


@contextmanager
def checkpoint_lock(table_path: str, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the table's checkpoint lock for the block, waiting for an appender writing a
    checkpoint (as `commit_lock` waits): for work that must keep the appends' checkpoints out
    too, such as `repair` restoring a log. A table on an object store takes no lock."""
    if not is_local(table_path):
        yield
        return
    with held_lock(checkpoint_lock_path(table_path), "the checkpoint lock", timeout_s):
        yield


__all__ = ["checkpoint_lock", "checkpoint_lock_path", "commit_lock", "lock_path"]
