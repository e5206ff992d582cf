"""Checkpoints of a local table the JVM-free appends commit to, written as its log grows.

Spark writes a checkpoint only when its own commit lands on a multiple of the table's interval,
and delta-rs only after its own commits (its post-commit hook, which `commit_exactly` keeps on
S3); a commit file written by `append_files` triggers neither. A log grown by those appends alone
would make every open by Spark or delta-rs replay every commit since the last checkpoint. So
after each append the appender compares its commit with the newest checkpoint
(`_last_checkpoint`), and once it is the interval past it a `Checkpointer` thread writes a
checkpoint of that version after the commit lock is released (Spark checkpoints only versions
it committed, so the two never write the same file): the append returns at once and the other
appenders go on committing. One process writes at a time (a lock beside the commit lock,
`tables/.raw_event_log.checkpoint-lock`, taken without waiting: the others skip it); a
checkpoint an appender died before writing is written after the next append. `repair` holds
that lock too while it restores the log.

How far: an open reads the newest checkpoint, at a cost that follows its actions, then replays
each commit after it. A checkpoint's actions are the live files and the files removed in the
last `delta.deletedFileRetentionDuration` (kept as tombstones), so after a compaction a
checkpoint of a few hundred live files can hold tens of thousands of removes. The interval grows
with them: CHECKPOINT_BASE commits plus one per ACTIONS_PER_COMMIT actions of the last
checkpoint (16 commits with none, 66 at 10,000, 246 at 46,000), which keeps an open within
about 2x of a freshly checkpointed table's just before the next checkpoint falls due, and the
checkpoint bytes written per commit within a few tens of KB (compaction thins old checkpoints,
maintenance/log_checkpoints.py; the figures: docs/decisions/0047). A table
that sets `delta.checkpointInterval` gets that interval instead.

The checkpoint is a classic single-file one, which Spark, delta-rs and runtime/delta_log.py
read, written from the newest checkpoint and the commits since (runtime/delta_checkpoint.py; the
actions of this process's own commits from memory), or by delta-rs when that replay does not
apply (the table's first checkpoint, for one). Either copies each add's `stats` string as
committed and writes no `stats_parsed`, so it holds statistics of
`delta.dataSkippingStatsColumns` only: no erasable value (runtime/lake.py, COMMON_TABLE_PROPERTIES).

    checkpoints = Checkpointer(table_path)
    checkpoints.after_commit(version, table.metadata().configuration, actions)
    checkpoints.close()  # done with the table: waits for the one being written
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from databuild_assets.runtime.commit_lock import checkpoint_lock_path
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_log import checkpoint_path, commit_path, last_checkpoint, log_folder
from databuild_assets.runtime.lock_files import lock_if_free

deltalake = deferred("deltalake")
# Imported by the first append: a process that only reads needs none of it (decision 0057).
delta_checkpoint = deferred("databuild_assets.runtime.delta_checkpoint")

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
# An open's cost of replaying this many commits is about its cost of reading a checkpoint of no
# actions, and of ACTIONS_PER_COMMIT actions about one more commit (bench figures: docs/decisions/0047).
CHECKPOINT_BASE = 16
ACTIONS_PER_COMMIT = 200
# delta-rs's errors for a log listing with a version missing: between two commits, or after the
# newest checkpoint.
_LISTING_GAPS = ("Expected contiguous commit files, but found gap", "Gap between checkpoint version")


def checkpoint_interval(configuration: dict[str, str], actions: int) -> int:
    """The table's `delta.checkpointInterval` when it sets a positive whole number; else
    CHECKPOINT_BASE commits plus one per ACTIONS_PER_COMMIT actions of the last checkpoint."""
    try:
        interval = int(configuration.get(CHECKPOINT_INTERVAL_PROPERTY, 0))
    except ValueError:
        interval = 0
    return interval if interval > 0 else CHECKPOINT_BASE + actions // ACTIONS_PER_COMMIT


def checkpoint_due(version: int, last: int | None, actions: int, configuration: dict[str, str]) -> bool:
    """Whether `version` is its interval past the newest checkpoint `last` (holding `actions`).

    checkpoint_due(15, None, 0, {})   # True: versions 0 to 15 and no checkpoint
    """
    return version - (-1 if last is None else last) >= checkpoint_interval(configuration, actions)


def checkpoint_if_due(
    table_path: str, version: int, known: Mapping[int, tuple[tuple[int, int, int], Sequence[dict]]] | None = None
) -> int | None:
    """Write a checkpoint of version `version` of the local table at `table_path` (a commit of
    the JVM-free appends: Spark checkpoints only versions it committed, so the two never write
    the same file) if it is still the interval past the newest checkpoint and no other process
    is writing one; `known`: by version, the commits this process wrote (`delta_checkpoint.replay`).
    Returns `version` once written, or None. Raises what failed (a lock file
    another user planted, a Delta, Arrow or I/O error); the commits before it stand either way.

        checkpoint_if_due(lake.table_path(RAW_EVENT_LOG), 1_234)
    """
    with lock_if_free(checkpoint_lock_path(table_path)) as held:
        if not held:
            return None  # another appender is writing one
        last, actions = last_checkpoint(table_path) or (None, 0)
        if last is not None and last >= version or checkpoint_path(table_path, version).exists():
            return None
        try:
            # from the last checkpoint and the commits since, by name
            state = delta_checkpoint.replay(table_path, version, known)
        except delta_checkpoint.NotReplayable as why:
            log.debug("%s: the checkpoint of v%d is delta-rs's: %s", table_path, version, why)
            state = None
        if state is not None:
            if not checkpoint_due(version, last, actions, state.configuration) or not state.write():
                return None  # written by another process since the append looked
        else:
            table = open_listed(table_path, version)
            if not checkpoint_due(version, last, actions, table.metadata().configuration):
                return None
            table.create_checkpoint()
        _drop_stale_checksum(table_path)
        return version


def open_listed(
    table_path: str, version: int | None = None, attempts: int = 3, pause_s: float = 0.05
) -> deltalake.DeltaTable:
    """The table at `version` (None: the newest), its log listed again when the listing had a gap: read while the
    other appenders write commits, a folder listing may return commit N+1 and miss N (ext4 lists
    a large folder in hash order; seen in bench.soak). A gap still there after `attempts`
    listings, `pause_s` times the attempt apart, is raised: a damaged log, which `check` names."""
    for attempt in range(attempts):
        try:
            return deltalake.DeltaTable(table_path, version=version)
        except Exception as error:
            if not any(gap in str(error) for gap in _LISTING_GAPS) or attempt == attempts - 1:
                raise
            time.sleep(pause_s * (attempt + 1))
    raise AssertionError("unreachable")


class Checkpointer:
    """Writes the checkpoints a local table's appends make due, in a thread of this process
    (`checkpoint_if_due`), one at a time. A failed one is logged and the appends go on; the next
    is tried RETRY_AFTER_S later. `wait` before the process ends (the interpreter also waits for
    it at exit)."""

    RETRY_AFTER_S = 60.0
    WAIT_S = 120.0
    KNOWN_COMMITS = 10_000

    def __init__(self, table_path: str) -> None:
        self.table_path = table_path
        self._thread: threading.Thread | None = None
        self._retry_at = -math.inf
        # The newest version this process committed, and whether the thread is still writing; an
        # append that finds it writing leaves its version here for the thread to pick up, else a
        # checkpoint falling due while the previous one is written waits for the next append,
        # which may never come.
        self._guard = threading.Lock()
        self._newest = -1
        self._writing = False
        # The newest checkpoint `_last_checkpoint` named when last read (-1: none; inf: not read).
        self._read_last: float = math.inf
        # The actions of this process's commits since, by version: the checkpoint replays them
        # from memory, not from their files.
        self._known: dict[int, tuple[tuple[int, int, int], list[dict]]] = {}

    def after_commit(self, version: int, configuration: dict[str, str], actions: Sequence[dict] | None = None) -> bool:
        """Start writing a checkpoint of `version` (just committed by this process, with
        `actions` when the caller has them) when it is the interval past the newest one and none
        is being written here (the one being written is followed by the newest due version);
        whether one was started."""
        with self._guard:
            if actions is not None:
                try:  # the commit file this process just wrote, to tell it from one put there later
                    identity = delta_checkpoint.file_identity(commit_path(self.table_path, version))
                    self._known[version] = (identity, list(actions))
                except FileNotFoundError:
                    pass
                while len(self._known) > self.KNOWN_COMMITS:  # no checkpoint for a long while
                    del self._known[next(iter(self._known))]
            self._newest = max(self._newest, version)
            if self._writing or time.monotonic() < self._retry_at or not self._due(version, configuration):
                return False
            self._writing = True
        self._thread = threading.Thread(
            target=self._write, args=(version, configuration), name=f"checkpoint {self.table_path}"
        )
        self._thread.start()
        return True

    def _due(self, version: int, configuration: dict[str, str]) -> bool:
        # Checkpoints only move forward and the interval is never shorter than with no actions:
        # until `version` is that far past the newest checkpoint read, none is due, unread.
        if self._read_last <= version < self._read_last + checkpoint_interval(configuration, 0):
            return False
        last, actions = last_checkpoint(self.table_path) or (None, 0)
        self._read_last = -1 if last is None else last
        self._forget_known(self._read_last)  # checkpointed, by any process
        return checkpoint_due(version, last, actions, configuration)

    def _forget_known(self, through: float) -> None:
        """Drop the actions kept for commits up to `through`, which a checkpoint holds (under the guard)."""
        for at in [at for at in self._known if at <= through]:
            del self._known[at]

    def _write(self, version: int, configuration: dict[str, str]) -> None:
        try:
            while self._write_one(version, configuration):
                with self._guard:
                    if self._newest <= version or not self._due(self._newest, configuration):
                        return
                    version = self._newest  # fell due while this one was written
        finally:
            with self._guard:
                self._writing = False

    def _write_one(self, version: int, configuration: dict[str, str]) -> bool:
        """Write the checkpoint of `version` if still due; whether it was written."""
        with self._guard:
            known = {at: actions for at, actions in self._known.items() if at <= version}
        try:
            if checkpoint_if_due(self.table_path, version, known) is not None:
                with self._guard:
                    self._forget_known(version)
                return True
        except Exception as error:  # noqa: BLE001 - in a thread beside the appends, which must go on
            self._retry_at = time.monotonic() + self.RETRY_AFTER_S
            log.warning(
                "%s: the checkpoint of v%d failed; the appends go on and try again in %.0f s: %s",
                self.table_path,
                version,
                self.RETRY_AFTER_S,
                error,
            )
            return False
        last, actions = last_checkpoint(self.table_path) or (None, 0)
        behind = version - (-1 if last is None else last)
        if behind > 4 * checkpoint_interval(configuration, actions):  # left to a holder that is not writing it
            self._retry_at = time.monotonic() + self.RETRY_AFTER_S
            log.warning(
                "%s: v%d is %d commits past the newest checkpoint and %s is held by another process; "
                "every open replays those commits until it is released",
                self.table_path,
                version,
                behind,
                checkpoint_lock_path(self.table_path),
            )
        return False

    def wait(self) -> None:
        """Until the checkpoint being written, if any, is done (at most WAIT_S, then a warning)."""
        if self._thread is not None:
            self._thread.join(self.WAIT_S)
            if self._thread.is_alive():
                log.warning("%s: a checkpoint is still being written after %.0f s", self.table_path, self.WAIT_S)
            self._thread = None

    def close(self) -> None:
        """Wait for the checkpoint being written (`wait`), then drop what this process kept of
        the table's log for the next one: the commits' actions and the last checkpoint's rows."""
        self.wait()
        with self._guard:
            self._known.clear()
        if "databuild_assets.runtime.delta_checkpoint" in sys.modules:  # else it holds nothing of the table
            delta_checkpoint.forget(self.table_path)


def _drop_stale_checksum(table_path: str) -> None:
    """Spark writes `_last_checkpoint` through Hadoop's local filesystem, which keeps a checksum
    of it in `._last_checkpoint.crc` and checks it at every read; delta-rs rewrites the file and
    not that checksum. Spark would then fail the check, sleep and retry, and fall back to listing
    the log at every open. Without the checksum file Hadoop reads the file unchecked."""
    try:
        os.unlink(log_folder(table_path) / "._last_checkpoint.crc")
    except FileNotFoundError:
        pass


__all__ = [
    "ACTIONS_PER_COMMIT",
    "CHECKPOINT_BASE",
    "Checkpointer",
    "checkpoint_due",
    "checkpoint_if_due",
    "checkpoint_interval",
]
