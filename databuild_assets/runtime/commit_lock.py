"""One lock per local table for the commits whose check must hold until they land.

Delta's optimistic concurrency rests on an atomic "write the next commit file if absent", which
every writer of a local lake does by a hard link: delta-rs, the JVM-free appends, and Spark
through our log store (delta-jars/logstore, docs/decisions/0055-spark-commits-a-local-table-by-hard-link.md).
So two commits never overwrite each other; what this lock adds is that a writer's *reading* and
its commit are one step. An append or an ingestion dedupes against the raw log and must commit
before another writer adds the same event: both hold this lock from their dedupe to their
commit. So do the steps that rewrite a table's log in ways Delta cannot check (create, VACUUM's
records, schema upgrade, repair): an OS advisory lock (flock) on a hidden file beside the
table's folder (`tables/.raw_event_log.commit-lock`), released by the OS if the holder dies. A
purge's MERGE and a bin-pack only remove what is already there, so they run without it first
(the purge again under it when an append landed in a partition it rewrites): Delta checks them
against whatever committed meanwhile, and the appends go on beside them.

The lock file is made 0600 and must be this user's, and a wait is bounded (runtime/lock_files.py):
a lock others could open would let them stall every commit. A process that commits narrows its
umask (runtime/file_modes.py), so what delta-rs writes under the lock is not readable by others.

    with commit_lock(lake.table_path(RAW_EVENT_LOG)):
        merge_new_events(...)

Object stores (s3a://, abfss://) are not locked here: every commit there is a conditional write
(docs/decisions/0009-one-commit-lock-for-the-raw-log.md, 0040).
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


def holds_commit_lock(table_path: str) -> bool:
    """Whether this thread holds the commit lock of the table at `table_path` already (`commit_lock`
    is re-entrant: taking it again releases nothing at the end of the inner block)."""
    return str(lock_path(table_path)) in _held.__dict__.get("paths", ())


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
    if not path.parent.is_dir():
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


__all__ = ["checkpoint_lock", "checkpoint_lock_path", "commit_lock", "holds_commit_lock", "lock_path"]
