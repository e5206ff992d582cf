"""The appends of `DeltaRsEventLog` (backend.py): dedupe by event_id against the serving index,
commit under the raw log's commit lock, and index what was committed.

Every appender of a local lake waits for the commit lock's holder, so the holder does as little
as it can: the Parquet files of an append are written before the lock is taken (`_stage`, for the
events the index did not hold then), and under it the append catches up, dedupes again, and
names those files in the next commit file, which is a few hundred bytes. When an event arrived
in between (another appender sent it), or the table changed, the staged files are deleted and
the append writes its files under the lock, as on S3, where no lock is taken and a commit is a
conditional write (decision 0040). What the catch-up under the lock would do at length (index
more than `LOCKED_CATCH_UP_EVENTS` events other writers committed, or build the index again) it
leaves to a catch-up after the lock is released (`CatchUpFirst`), then tries again: the others
commit meanwhile.

    class DeltaRsEventLog(IndexAnswers, IndexedAppends, BuildEventLog): ...
    log.append_events(events)   # -> AppendResult(accepted=5, duplicates=0)
"""

from __future__ import annotations

import logging
import math
import random
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from databuild_assets.events.validation import require_valid
from databuild_assets.log.interface import AppendResult, canonical_event
from databuild_assets.log.serving.append import (
    CommitConflictError,
    commit_append,
    raw_log_rows,
    remove_data_files,
    stage_locally,
)
from databuild_assets.log.serving.build import table_mark
from databuild_assets.log.serving.index import ServingIndex, Stamp, TableMark
from databuild_assets.log.serving.wal import WalCopier
from databuild_assets.runtime.commit_lock import commit_lock, holds_commit_lock
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.object_store import is_s3

deltalake = deferred("deltalake")
pa = deferred("pyarrow")

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 3
# On S3 no lock keeps writers apart: a commit that finds its version taken dedupes and tries again,
# after a random pause so that racing appenders spread out.
_S3_COMMIT_ATTEMPTS = 30
_S3_RETRY_PAUSE_S = (0.02, 0.3)
# Under the commit lock a catch-up indexes at most this many events of other writers' commits (an
# ingestion batch, a backfill): more, and the append releases the lock, catches up, and tries
# again: the lock's other takers (Spark's ingestion and compaction) do not wait for an index's
# work (decision 0052).
LOCKED_CATCH_UP_EVENTS = 5_000
# Appends that found that much to catch up and tried again; the last attempt keeps the lock
# whatever it finds, so that a lake that keeps growing faster still gets the append.
_CATCH_UP_ROUNDS = 3
# Under the commit lock the index's write transaction is waited for this long (another
# process's catch-up holds it; outside the lock the wait is the index's busy timeout, 30 s), then
# the append releases the lock and waits for it there (CatchUpFirst).
LOCKED_INDEX_WAIT_MS = 100


class CatchUpFirst(Exception):
    """The catch-up under the commit lock found work to do without the lock (`LOCKED_CATCH_UP_EVENTS`)."""


class IndexedAppends:
    """`append_events` of `BuildEventLog` over the serving index; the class it is mixed into
    provides the lake, the raw log's follower (`_log`) and delta-rs table (`_table`), `_store`,
    `_catch_up` and `_tombstone_values`."""

    # Set while this object's append holds the commit lock (but in its last round): a catch-up
    # then raises CatchUpFirst rather than index many events or build the index again.
    _holding_commit_lock = False
    _wal: WalCopier  # copies the index's write-ahead log beside the appends (wal.py)

    def _catch_up(self, fresh: bool = False) -> ServingIndex:
        raise NotImplementedError

    def _tombstone_values(self, version: int) -> dict[str, set[str]]:
        raise NotImplementedError

    def _store(self) -> ServingIndex:
        raise NotImplementedError

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        events = list(events)
        for index, event in enumerate(events):
            require_valid(event, f"events[{index}]")
        if not events:
            return AppendResult(0, 0)
        for last in [False] * (_CATCH_UP_ROUNDS - 1) + [True]:
            try:
                committed, committed_actions, new = self._append_once(events, last)
                break
            except CatchUpFirst:
                self._catch_up(fresh=True)  # the lock released: the others commit meanwhile
        else:
            raise AssertionError("the last round keeps the lock and raises no CatchUpFirst")
        if committed is not None and self._checkpoints is not None and self._table is not None:
            # Outside the lock: the other appenders commit while the checkpoint is written.
            self._checkpoints.after_commit(committed, self._table.metadata().configuration, committed_actions)
        return AppendResult(accepted=len(new), duplicates=len(events) - len(new))

    def _append_once(
        self, events: list[Mapping[str, Any]], last: bool
    ) -> tuple[int | None, list[dict[str, Any]] | None, dict[str, tuple[int, dict[str, Any]]]]:
        """Stage, then dedupe and commit under the commit lock: the version committed (or None),
        the add actions of that commit when staged here, and the new events. Raises CatchUpFirst
        when the catch-up under the lock has long work to do (not in the `last` round)."""
        s3 = is_s3(self.lake.root)
        attempts = _S3_COMMIT_ATTEMPTS if s3 else _COMMIT_ATTEMPTS
        committed: int | None = None
        committed_actions = None  # the actions of that commit, when staged here
        behind = False  # the index's catch-up past this commit is left for after the lock
        # The data files are written before the lock (`_stage`): every appender waits for the
        # holder, so the lock is held only to dedupe, name the files in a commit, and index them.
        staged = None if s3 else self._stage(events)
        # Bounded only when this block takes the lock (a holder calling again releases nothing).
        bounded = not s3 and not last and not holds_commit_lock(self._log_path)
        try:
            with commit_lock(self._log_path), self._under_commit_lock(bounded):
                for attempt in range(attempts):
                    index = self._catch_up(fresh=True)
                    if staged is not None and index.stamp() == staged.stamp:
                        new = staged.new  # the index has not moved since they were staged: the same dedupe
                    else:
                        new = _new_events(index, events)
                    if staged is not None and (tuple(new) != tuple(staged.new) or self._table is not staged.table):
                        staged.discard()  # an event arrived meanwhile, or the table changed
                        staged = None
                    if not new:
                        break
                    stamp = index.stamp()
                    before, hidden_by = stamp.raw_log, self._tombstone_values(stamp.tombstones.version)
                    rows = staged.rows if staged is not None else raw_log_rows(new.values(), self.writer)
                    try:
                        self._table, committed = commit_append(
                            self._log,
                            self._table,
                            rows,
                            before.version,
                            self.writer,
                            staged=staged.actions if staged is not None else None,
                        )
                    except CommitConflictError:
                        if attempt == attempts - 1:
                            raise
                        if s3:
                            time.sleep(random.uniform(*_S3_RETRY_PAUSE_S))
                        continue  # another writer committed first: dedupe again
                    if staged is not None and committed is not None:
                        committed_actions = staged.actions
                    staged = None  # committed: the log names its files
                    behind = self._index_own_append(index, stamp, new, before, hidden_by, committed)
                    break
        finally:
            if staged is not None:
                staged.discard()
        if behind:  # committed; the lock released
            try:
                self._catch_up(fresh=True)
            except Exception as error:  # noqa: BLE001 - the append is committed: reported so, not failed
                log.warning("%r: the append is committed, its index catch-up failed (%s)", self, error)
                self._checked_at = -math.inf  # the next read tries again, and raises what it meets
        return committed, committed_actions, new

    @contextmanager
    def _under_commit_lock(self, bounded: bool) -> Iterator[None]:
        """Mark the block as holding the commit lock (`_holding_commit_lock`) when `bounded`."""
        self._holding_commit_lock = bounded
        try:
            yield
        finally:
            self._holding_commit_lock = False

    @contextmanager
    def _index_waited_briefly(self, index: ServingIndex) -> Iterator[None]:
        """While `_holding_commit_lock`: the block's wait for the index's write transaction cut to
        LOCKED_INDEX_WAIT_MS, and that wait's end raised as CatchUpFirst."""
        if not self._holding_commit_lock:
            yield
            return
        index.set_busy_timeout(LOCKED_INDEX_WAIT_MS)
        try:
            yield
        except sqlite3.OperationalError as error:
            if "locked" not in str(error):
                raise
            raise CatchUpFirst(f"{index.path} is being updated by another process ({error})") from error
        finally:
            index.set_busy_timeout()

    def _stage(self, events: list[Mapping[str, Any]]) -> _Staged | None:
        """The events the index does not hold yet, written as the raw log's data files ahead of
        their commit (`append.stage_locally`), so that the commit lock is not held while Parquet
        is written; None when there is nothing to write or no fast append to write it for."""
        # The index as it is, not caught up: catching up now would wait for the SQLite write of
        # the appender holding the lock. A commit it missed is found by the dedupe under the lock.
        index = self._store()
        stamp = index.stamp()  # before the dedupe: an index that moves after it has another stamp
        new = _new_events(index, events)
        if not new or stamp.raw_log.version < 0:
            return None
        if self._table is None:
            self._table = self._log.open_table()
        rows = raw_log_rows(new.values(), self.writer)
        actions = stage_locally(self._log.path, self._table, rows)
        return None if actions is None else _Staged(self._log.path, self._table, stamp, new, rows, actions)

    def _index_own_append(
        self,
        index: ServingIndex,
        stamp: Stamp,
        new: dict[str, tuple[int, dict[str, Any]]],
        before: TableMark,
        hidden_by: Mapping[str, set[str]],
        committed: int | None,
    ) -> bool:
        """After this process committed `new` as the version after `before`: add them to the index
        from memory when no process moved the index since `stamp`, else catch up from the log.
        True when that catch-up is long work (`CatchUpFirst`), left for after the lock."""
        applied = False
        if before.version >= 0 and committed is not None and not index.read_only:
            try:
                with self._index_waited_briefly(index), index.updating():
                    if index.stamp() == stamp:
                        # No process moved the index since: apply the events we hold
                        # instead of reading back the file we wrote.
                        index.add_events([event for _, event in new.values()], hidden_by)
                        raw = table_mark(self._log, before.version + 1, before.table_id)
                        index.set_stamp(Stamp(raw, stamp.tombstones))
                        applied = True
            except CatchUpFirst:  # another process updates the index: caught up after the lock
                return True
            except sqlite3.OperationalError as error:
                # The events are committed; the next read's catch-up applies them.
                log.warning("%r: the append is committed, its index update waits (%s)", self, error)
                self._checked_at = -math.inf  # the next read applies it, whatever the bound
                return False
        if applied:
            self._seen = (before.version + 1, stamp.tombstones.version)
            self._wal.after_commit(index.path)
            return False
        try:
            self._catch_up(fresh=True)
        except CatchUpFirst:  # committed: caught up once the lock is released (`_append_once`)
            return True
        return False


def _new_events(index: ServingIndex, events: list[Mapping[str, Any]]) -> dict[str, tuple[int, dict[str, Any]]]:
    """The events the index does not hold, first of each event_id, by event_id in the order given:
    (place in the call, canonical event)."""
    known = index.known_event_ids(event["event_id"] for event in events)
    new: dict[str, tuple[int, dict[str, Any]]] = {}
    for position, event in enumerate(events):
        if event["event_id"] not in known and event["event_id"] not in new:
            new[event["event_id"]] = (position, canonical_event(event))
    return new


@dataclass(frozen=True)
class _Staged:
    """Data files an append wrote before its commit, for the events `new` of `table` that the
    index did not hold at `stamp`: the raw log `rows` they hold, and their `add` actions."""

    path: str
    table: deltalake.DeltaTable
    stamp: Stamp
    new: dict[str, tuple[int, dict[str, Any]]]
    rows: pa.Table
    actions: list[dict[str, Any]]

    def discard(self) -> None:
        """Delete the files (no commit will name them)."""
        remove_data_files(self.path, self.actions)


__all__ = ["LOCKED_CATCH_UP_EVENTS", "CatchUpFirst", "IndexedAppends"]
