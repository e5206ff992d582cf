"""The JVM-free Delta backend: `BuildEventLog` over a local lake or one on S3, for a live DataBuild service.

Reads are answered by the lake's serving index (`log/serving/index.py`: the SQLite reference
backend's tables, indexes and SQL in a file under `<root>/serving_index/`, for S3 in this
machine's cache folder: `store.index_folder_of`), stamped with the
versions of raw_event_log and tombstones it reflects. Opening the log opens the index and
applies only the commits after its stamp (`log/serving/follower.py`), so the cost of an open
follows what changed since, not the history; the pipeline's serving_index asset keeps it
current. Before a read one `stat` per table says whether either moved, so a read sees every
append and every tombstone committed before it, its own included; on S3, where that `stat` is a
request to the store, a read asks at most once per `max_staleness` (1 s unless given) and may miss
what other processes committed in that last second, never what this one appended
(docs/decisions/0041-reads-on-s3-may-be-a-second-old.md). Appends (`appends.py`) are one
commit under the raw log's commit lock, which the Spark jobs take too
(`runtime/commit_lock.py`), deduplicated by event_id against the whole log; on S3, with no lock,
the commit takes exactly the next version with S3's conditional write, or dedupes again
(docs/decisions/0040-every-s3-writer-commits-with-conditional-writes.md).

    log = open_event_log("delta:///data/lake")          # no SparkSession: this backend
    log.append_events(events)
    log.get_latest_partition_status("data/date=2024-01-01")
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log.interface import (
    BuildEventLog,
)
from databuild_assets.log.serving import appends
from databuild_assets.log.serving.answers import IndexAnswers
from databuild_assets.log.serving.appends import CatchUpFirst, IndexedAppends
from databuild_assets.log.serving.bucket import BucketPublication
from databuild_assets.log.serving.build import build_index, table_mark, tombstone_values, values_by_key
from databuild_assets.log.serving.checkpoints import Checkpointer
from databuild_assets.log.serving.evict import evict_under_lock, hot_window_ns
from databuild_assets.log.serving.follower import Changes, follower_for
from databuild_assets.log.serving.index import IndexUnusableError, ServingIndex, Stamp
from databuild_assets.log.serving.publish import mark_generation, publication_folder, publication_of
from databuild_assets.log.serving.reader_cache import adopt
from databuild_assets.log.serving.rows import event_rows
from databuild_assets.log.serving.store import IndexFolder, PrivateFolder, index_folder_of, remove_index_files
from databuild_assets.log.serving.wal import WalCopier
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake
from databuild_assets.runtime.object_store import is_s3

deltalake = deferred("deltalake")
pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")

log = logging.getLogger(__name__)

_EVENT_COLUMNS = list(EVENT_COLUMNS)
# A catch-up reads the new files a few at a time, at most this many files or rows (by their
# statistics) at once, and adds their events this many rows at a time: its memory follows the
# batch, not the files Spark wrote (a quarter of a million rows each, or more).
_FILES_PER_BATCH = 16
_ROWS_PER_BATCH = 100_000
# A catch-up applies its commits in one transaction (a read sees whole commits), each event
# indexed into B-trees that hold the history, its pages in the write-ahead log until it commits;
# a build loads the events and sorts each index once. An index behind the lake by more than this
# many events, and by more than half the events it holds, is built again instead (a backfill
# ingested at once, an index left behind for a long while).
REBUILD_BEHIND_EVENTS = 200_000
_CHECKPOINT_WAIT_S = 30.0
# On S3 a check of the lake is two HEAD requests (milliseconds, and billed); a read asks at most
# once per this many seconds (decision 0041).
S3_MAX_STALENESS_S = 1.0


class IndexNotFollowableError(RuntimeError):
    """The lake has no serving index that can be followed to its latest versions, and the caller
    asked not to build one (`DeltaRsEventLog(..., build=False)`)."""


class _NotFollowable(Exception):
    """The index cannot be brought to the lake's latest versions commit by commit: rebuild it."""


class DeltaRsEventLog(IndexAnswers, IndexedAppends, BucketPublication, BuildEventLog):
    """The Build Event Log of a local lake, read and appended without a JVM (see the module doc).

    Opening it opens the lake's serving index (`<root>/serving_index/`), building it first when
    there is none or it cannot be followed, and applies the commits after its stamp. One instance
    per thread; processes share the lake and the index. `writer` names the appends' source
    ("writer:<writer>"); `progress` receives a build's progress lines. `max_staleness` (seconds)
    is how old a read's view of other processes' commits may be: 0 asks the lake before every
    read; None means 0 on a local lake and `S3_MAX_STALENESS_S` on S3. This process's own
    appends are seen by its next read whatever the bound. `hot_window_s`: evict.py's hot window
    (None: the environment's, else an hour; inf: every event hot). `pipeline`: this is the
    pipeline's refresh (`refresh_serving_index`), whose build moves cold build requests to
    segments before it publishes the file (build.py `evict_building`); a service's never evicts.

        with DeltaRsEventLog(Lake("/data/lake")) as log:
            log.list_build_requests(limit=20)
    """

    def __init__(
        self,
        lake: Lake,
        writer: str = "event-log",
        progress: Callable[[str], None] | None = None,
        build: bool = True,
        max_staleness: float | None = None,
        hot_window_s: float | None = None,
        *,
        pipeline: bool = False,
    ) -> None:
        self.lake = lake
        self._on_s3 = is_s3(lake.root)
        self._hot_window_s = hot_window_s
        if max_staleness is None:
            max_staleness = S3_MAX_STALENESS_S if self._on_s3 else 0.0
        if not max_staleness >= 0:
            raise ValueError(f"max_staleness must be a number of seconds, 0 or more, got {max_staleness!r}")
        self.max_staleness = max_staleness
        self._checked_at = -math.inf  # time.monotonic() when the last check of the lake began
        self._build = build  # False: raise IndexNotFollowableError where an index would be built
        self.writer = writer
        self._progress = progress  # where a build says how far it is (default: this module's logger)
        self._refreshing = pipeline  # the pipeline's refresh (or in refresh_index): a build evicts too
        self._log_path = lake.table_path(RAW_EVENT_LOG)
        self._log = follower_for(self._log_path)
        self._tombstones = follower_for(lake.table_path(TOMBSTONES))
        self._folder = IndexFolder(index_folder_of(lake.root))
        if self._on_s3:  # the index of a lake on S3 lives in this machine's cache folder
            os.makedirs(self._folder.path, exist_ok=True)
        self._index: ServingIndex | None = None
        self._seen = (-1, -1)  # the raw log's and the tombstones' versions last seen in the index
        self._marker: tuple[int, int] | None = None  # CURRENT's identity when the index was opened
        self._private: PrivateFolder | None = None  # on a lake this process cannot write
        self._hidden_by: dict[str, set[str]] = {}
        self._hidden_version: int | None = None  # the tombstones version `_hidden_by` was read at
        self._table: deltalake.DeltaTable | None = None  # the raw log as delta-rs last saw it, for appends
        self._checkpoints = None if self._on_s3 else Checkpointer(self._log_path)
        self._wal = WalCopier()  # the index's write-ahead log, copied beside the appends
        self._open()
        try:
            self._catch_up(fresh=True)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"DeltaRsEventLog({self.lake.root!r})"

    # -- the index ------------------------------------------------------------------------------

    def _store(self) -> ServingIndex:
        if self._index is None:
            raise ValueError(f"{self!r} is closed; open the event log again")
        return self._index

    def _open(self) -> None:
        """Open the index in use (read-only on a lake this process cannot write), or build one."""
        index, why = None, "there is none"
        for _ in range(3):  # a generation published between reading CURRENT and opening its file
            path, self._marker = self._folder.current()
            if path is None:
                break
            try:
                index, why = self._followable(path)
            except FileNotFoundError:
                why = f"{path} is gone"
                continue
            break
        self._replace(index)
        if index is None:
            self._rebuild(why)

    def _reopen(self) -> None:
        """Drop the index in hand for the lake's current one (a segment it named is gone); on S3,
        for the bucket's current publication when its own one's segment is gone from the bucket."""
        log.info("%r: a segment %s names is gone (the lake's refresh rewrote it): reopening", self, self._store().path)
        if self._on_s3 and self._publication_replaced():
            self._rebuild("a segment of the publication it was downloaded from is gone from the bucket")
            return
        self._open()

    def _followable(self, path: str) -> tuple[ServingIndex | None, str]:
        """The index at `path` if it can be followed to the lake's latest versions, else None
        and why not. FileNotFoundError when the file is gone (a newer generation replaced it)."""
        try:
            index = self._open_file(path)
        except IndexUnusableError as error:
            return None, str(error)
        why = self._unfollowable_stamp(index.stamp())
        if why:
            index.close()
            return None, why
        return index, ""

    def _open_file(self, path: str) -> ServingIndex:
        if self._folder.writable():
            return ServingIndex.open(path)
        try:
            return ServingIndex.open(path, read_only=True)
        except sqlite3.OperationalError:
            # SQLite cannot share a file whose write-ahead log and shared memory it cannot make
            # in a read-only folder; reading it without locks could see a writer's torn pages.
            # A copy taken while nothing changed it is read instead.
            return ServingIndex.open(self._private_folder().copy_of(path))

    def _unfollowable_stamp(self, stamp: Stamp) -> str:
        """Why the index's stamp cannot be followed to the lake's latest versions ("" if it can):
        a table replaced at the same path, or commits after the stamp no longer in the log."""
        for follower, mark in ((self._log, stamp.raw_log), (self._tombstones, stamp.tombstones)):
            if mark.version < 0:
                continue
            commit = follower.commit_mark(mark.version)
            if commit == mark.commit:
                continue
            if commit is not None or not follower.exists():
                return f"{follower.path} is not the table the index followed (replaced or removed)"
            if follower.open_table().metadata().id != mark.table_id:
                return f"{follower.path} is not the table the index followed (replaced)"
            newest = follower.newest_version()
            if newest is not None and newest < mark.version:
                # Its log went back (`repair` restored an older version): the index holds more.
                return f"the index reflects {follower.path} v{mark.version}, newer than its log's newest (v{newest})"
            checkpoint = follower.last_checkpoint()
            if follower.commit_mark(mark.version + 1) is None and checkpoint is not None and checkpoint > mark.version:
                return f"the index reflects {follower.path} v{mark.version}, older than its log's retention"
        return ""

    def _replace(self, index: ServingIndex | None) -> None:
        old, self._index = self._index, index
        if index is not None:  # its segments, a private copy's too; a downloaded one's, per publication
            publication = publication_of(index._connection)
            own = self._folder.path
            index.index_folder = publication_folder(own, publication) if publication else own
        self._seen = index.versions() if index is not None else (-1, -1)
        self._table = None  # its protocol or schema may have changed: opened again by the next append
        if old is not None and old is not index:
            old.close()
            if self._private is not None and os.path.dirname(old.path) == self._private.path:
                remove_index_files(old.path)  # a private copy no one else reads

    def _rebuild(self, reason: str) -> None:
        """A new generation of the index from the lake's snapshot, published for every process
        (or private, on a lake this process cannot write)."""
        if not self._build:
            raise IndexNotFollowableError(f"{self._folder.path}: {reason}")
        if not self._folder.writable():
            self._build_private(reason)
            return
        with self._folder.build_lock():
            path, marker = self._folder.current()
            if path is not None and marker != self._marker:
                # Another process published one while this one waited for the lock: use it.
                try:
                    index, _ = self._followable(path)
                except FileNotFoundError:
                    index = None
                if index is not None:
                    self._marker = marker
                    self._replace(index)
                    return
            if self._on_s3 and self._start_from_publication():
                return
            log.info("%r: building the serving index (%s)", self, reason)
            # The pipeline's refresh evicts as it builds, before the file is anyone's (evict_building).
            window_ns = hot_window_ns(self._hot_window_s) if self._refreshing else None
            cold = (self._folder.path, window_ns) if window_ns is not None else None
            self._publish_generation(lambda building: build_index(self.lake, building, self._progress, cold))

    def _publish_generation(self, write: Callable[[str], None]) -> None:
        """Publish (under the build lock) a generation `write(path)` makes; older ones are removed."""
        building = self._folder.new_building_path()
        write(building)
        mark_generation(building)  # what the bucket's publication says it was taken from (publish.py)
        final = self._folder.publish(building)
        self._marker = self._folder.marker()
        self._replace(ServingIndex.open(final))

    def _private_folder(self) -> PrivateFolder:
        if self._private is None:
            self._private = PrivateFolder(self)
        return self._private

    def _build_private(self, reason: str) -> None:
        path = self._private_folder().new_index_path()
        log.info("%r: building a private serving index in %s (%s; the lake is not writable here)", self, path, reason)
        build_index(self.lake, path, self._progress)
        self._replace(ServingIndex.open(path))

    def _make_private(self) -> ServingIndex:
        """A private, writable copy of a read-only index, to catch up on a lake this process
        cannot write."""
        index = self._store()
        if not self._build:
            raise IndexNotFollowableError(f"{index.path} is read-only here and behind the lake")
        path = self._private_folder().new_index_path()
        log.info("%r: the lake is not writable here and its serving index is behind: a private copy %s", self, path)
        index.rewrite_into(path)
        self._replace(ServingIndex.open(path))
        return self._store()

    def _moved(self, versions: tuple[int, int]) -> bool:
        """Whether the raw log or the tombstones has a commit after `versions` (theirs, in that order)."""
        raw_version, tombstones_version = versions
        return self._log.moved_since(raw_version) or self._tombstones.moved_since(tombstones_version)

    def _catch_up(self, fresh: bool = False) -> ServingIndex:
        """The index as of the lake's latest versions, or as of a check begun less than
        `max_staleness` ago (unless `fresh`)."""
        if not fresh and time.monotonic() - self._checked_at < self.max_staleness:
            return self._store()
        checked_at = time.monotonic()
        index = self._follow()
        self._checked_at = checked_at
        if self._on_s3:  # what the bucket no longer publishes leaves, even on a quiet lake
            self._check_publication(deleted=False)
        return index

    def _follow(self) -> ServingIndex:
        """The index, with every commit of the tombstones and the raw log applied: one `stat` of
        each table's next commit file when nothing is new.

        The versions checked are the last this process saw in the index. The index only moves
        forward, and only to versions whose commit files exist, so when neither table has a
        commit after them, the index reflects exactly them, whatever other processes did. A
        table replaced at the same path, or commits gone past the log's retention, are found
        when a table has moved (and at every open): the index is then built again."""
        index = self._store()
        if not self._moved(self._seen):
            return index
        if self._private is None and self._folder.marker() != self._marker:
            self._open()  # another process published a new generation: read that one
            index = self._store()
        self._seen = index.versions()
        if not self._moved(self._seen):
            return index
        if index.read_only:
            index = self._make_private()
        for _ in range(2):
            try:
                with self._index_waited_briefly(index), index.updating():
                    self._apply_since(index, index.stamp())
                self._seen = index.versions()
                if self._private is not None or self._on_s3:  # a reader's cache: no pipeline rewrites it
                    deleted = index.deleted_events() > 0
                    index = self._rewritten_if_deleted(index)
                    if self._on_s3:
                        self._check_publication(deleted)
                return index
            except _NotFollowable as why:
                if self._holding_commit_lock:  # an append's: not a build while the others wait
                    raise CatchUpFirst(str(why)) from why
                self._rebuild(str(why))  # the new index's versions are `_seen` (`_replace`)
                index = self._store()
                if not self._moved(self._seen):
                    return index
        raise RuntimeError(
            f"{self!r}: the serving index could not be brought to the lake's latest versions after a rebuild; "
            "the lake is changing faster than an index can be built, or a table keeps being replaced"
        )

    def _tombstone_values(self, version: int) -> dict[str, set[str]]:
        """Every tombstone value by key, at least as of tombstones `version` (what the index
        reflects): read once per process, and again when the index has moved past what this
        process read. Kept in memory only: the tombstones table is the one place on disk that
        may hold an erased value."""
        if self._hidden_version is None or self._hidden_version < version:
            self._hidden_by, mark = tombstone_values(self.lake)
            self._hidden_version = mark.version
        return self._hidden_by

    def _apply_since(self, index: ServingIndex, stamp: Stamp) -> None:
        """Apply the commits after `stamp` (inside the index's update), and stamp it."""
        why = self._unfollowable_stamp(stamp)  # a table replaced at the same path, or retention
        if why:
            raise _NotFollowable(why)
        tombstones = stamp.tombstones
        if self._tombstones.moved_since(tombstones.version):
            new = None
            if tombstones.version >= 0:
                self._tombstones.version = tombstones.version
                changes = self._tombstones.changes()
                added = self._tombstones.read(changes.added, ["record", "key", "value"]) if changes else None
                if added is not None:
                    new = values_by_key(added)
                    tombstones = table_mark(self._tombstones, changes.version, tombstones.table_id)
            if new is None:  # the first tombstones, or commits not followable: every value again
                new, tombstones = tombstone_values(self.lake)
            if any(new.values()):
                index.hide(new)
        raw = stamp.raw_log
        if self._log.moved_since(raw.version):
            if raw.version < 0:
                raise _NotFollowable("the raw log was created after the index was built")
            self._log.version = raw.version
            changes = self._log.changes()
            if changes is None:
                raise _NotFollowable("a new protocol or schema, or commits no longer in the log")
            # A run that removed files rewrote rows the index holds (a purge keeps those it does
            # not match): not a run of new events, and a catch-up applies it as such.
            added = sum(rows or 0 for rows in changes.added_rows)
            behind = 0 if changes.removed else added
            if self._build and behind > max(REBUILD_BEHIND_EVENTS, index.event_count() // 2):
                raise _NotFollowable(f"{behind:,} events behind the raw log, a build's work rather than a catch-up's")
            if self._holding_commit_lock and added > appends.LOCKED_CATCH_UP_EVENTS:
                raise CatchUpFirst(f"{added:,} events of other writers to index")
            if not self._apply(index, changes, self._tombstone_values(tombstones.version)):
                raise _NotFollowable("a data file of a commit is gone (vacuumed)")
            raw = table_mark(self._log, changes.version, raw.table_id)
        index.set_stamp(Stamp(raw, tombstones))

    def _apply(self, index: ServingIndex, changes: Changes, hidden_by: Mapping[str, set[str]]) -> bool:
        """Apply one run of commits, hiding the new events `hidden_by` (every tombstone value by
        key) matches; False when a file is gone and the index must be rebuilt."""
        added, removed = changes.added, changes.removed
        held = None  # the event ids of the removed files: the index holds them as they were
        if removed:
            removed_ids = self._log.read(removed, ["event_id"])
            added_ids = (
                self._log.read(added, ["event_id"]) if added else pa.table({"event_id": pa.nulls(0, pa.string())})
            )
            if removed_ids is None or added_ids is None:
                return False
            held = removed_ids.column("event_id").combine_chunks()
            # Rows that the commits removed and did not add back (a purge rewrites the rest).
            kept = pc.is_in(held, value_set=added_ids.column("event_id").combine_chunks())
            index.remove(held.filter(pc.invert(kept)).to_pylist())
            if not pc.any(pc.invert(pc.is_in(added_ids.column("event_id"), value_set=held))).as_py():
                return True  # every added row is a kept one (a purge): nothing to add
        for files in _batches(added, changes.added_rows):
            added_events = self._log.read(files, _EVENT_COLUMNS)
            if added_events is None:
                return False
            if held is not None:  # a rewritten file's kept rows are in the index already: not again
                added_events = added_events.filter(pc.invert(pc.is_in(added_events.column("event_id"), value_set=held)))
            for start in range(0, added_events.num_rows, _ROWS_PER_BATCH):
                index.add(event_rows(added_events.slice(start, _ROWS_PER_BATCH)), hidden_by)
        return True

    def refresh_index(self) -> Stamp:
        """Bring the index to the lake's latest versions (the pipeline's serving_index asset),
        remove what a builder that died left, move cold build requests to segments (hot window),
        and empty the write-ahead log, so that the bytes of erased events leave the disk."""
        if self._private is None and self._folder.writable():
            with self._folder.build_lock():  # no build in flight, and what a dead one left removed
                if self._folder.marker() != self._marker:
                    self._open()
        refreshing, self._refreshing = self._refreshing, True
        try:
            index = self._catch_up(fresh=True)
        finally:
            self._refreshing = refreshing
        if self._private is None and not index.read_only:  # cold build requests to segments (evict.py)
            if publication_of(index._connection) is not None:  # downloaded: evictions write its own segments
                with self._folder.build_lock():
                    # A new generation: a reader on this machine keeps the file it reads, whose
                    # segments are the publication's, while evictions change this one's.
                    self._publish_generation(index.rewrite_into)
                    index = self._store()
                    adopt(index._connection, self._folder.path)
                index.index_folder = self._folder.path
            window_ns = hot_window_ns(self._hot_window_s)
            evict_under_lock(self._folder, index._connection, window_ns, self._marker, self._progress)
        deadline = time.monotonic() + _CHECKPOINT_WAIT_S
        while not index.checkpoint():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{index.path}: its write-ahead log could not be emptied in {_CHECKPOINT_WAIT_S:.0f} s (a reader "
                    "kept a transaction open); the bytes of rows deleted since stay in it until the next refresh. "
                    "Run the serving_index asset again"
                )
            time.sleep(0.1)
        index = self._rewritten_if_deleted(index)
        if self._on_s3 and self._private is None and not index.read_only:
            self._publish(index)
        return index.stamp()

    def _rewritten_if_deleted(self, index: ServingIndex) -> ServingIndex:
        """The index written whole if it deleted events since it last was (an erased value's
        bytes may be left in its pages, index.py): a new generation for every process, or a new
        private copy."""
        if not index.deleted_events():
            return index
        if self._private is not None:
            path = self._private_folder().new_index_path()
            index.rewrite_into(path)
            self._replace(ServingIndex.open(path))
            remove_index_files(index.path)
            return self._store()
        with self._folder.build_lock():
            if self._folder.marker() != self._marker:  # another process published one meanwhile
                self._open()
                if not self._store().deleted_events():
                    return self._store()
            self._publish_generation(self._store().rewrite_into)
        return self._store()

    @property
    def index_path(self) -> str:
        """The index file this process reads."""
        return self._store().path

    def known_event_ids(self, event_ids: Iterable[str]) -> set[str]:
        """Which of `event_ids` the raw log holds at its latest version (visible or hidden), by the
        index caught up first: a few primary-key lookups, however long the history."""
        return self._catch_up(fresh=True).known_event_ids(event_ids)

    # -- writes ---------------------------------------------------------------------------------

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The raw log version the index reflects (None when the lake has no log yet)."""
        version = self._store().stamp().raw_log.version
        return None if version < 0 else version

    def index_bytes(self) -> int:
        """The serving index's size in bytes (its pages)."""
        return self._store().stored_bytes()

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.close()
        self._wal.close()
        self._replace(None)
        private, self._private = self._private, None
        if private is not None:
            private.remove()


def _batches(files: list[str], rows: list[int | None]) -> Iterator[list[str]]:
    """`files` in order, a few at a time: at most _FILES_PER_BATCH, and at most _ROWS_PER_BATCH
    rows by their statistics (a larger file alone)."""
    batch: list[str] = []
    held = 0
    for file, count in zip(files, rows, strict=True):
        count = count or 0
        if batch and (len(batch) == _FILES_PER_BATCH or held + count > _ROWS_PER_BATCH):
            yield batch
            batch, held = [], 0
        batch.append(file)
        held += count
    if batch:
        yield batch


@dataclass(frozen=True)
class ServingIndexStatus:
    """What `refresh_serving_index` left: the versions the index reflects, its size, and its
    cold tier (the segments of the build requests that finished before the hot window)."""

    path: str
    raw_log_version: int
    tombstones_version: int
    events: int
    bytes: int
    cold_build_requests: int = 0
    segments: int = 0
    segment_bytes: int = 0


def refresh_serving_index(
    lake: Lake, progress: Callable[[str], None] | None = None, hot_window_s: float | None = None
) -> ServingIndexStatus:
    """Bring the lake's serving index to the latest versions of the raw log and the tombstones
    (built when there is none), with the bytes of deleted rows off the disk: what the pipeline
    runs after every change, so that a service's open never pays a build.

        refresh_serving_index(Lake("/data/lake")).raw_log_version
    """
    with DeltaRsEventLog(lake, "serving-index", progress, hot_window_s=hot_window_s, pipeline=True) as log:
        stamp = log.refresh_index()
        index = log._store()
        cold = index.cold_facts()
        folder = index.segment_folder
        names = os.listdir(folder) if os.path.isdir(folder) else []
        return ServingIndexStatus(
            index.path,
            stamp.raw_log.version,
            stamp.tombstones.version,
            index.event_count(),
            index.stored_bytes(),
            cold["cold_build_requests"],
            cold["cold_segments"],
            sum(os.path.getsize(os.path.join(folder, name)) for name in names),
        )


__all__ = [
    "DeltaRsEventLog",
    "IndexNotFollowableError",
    "ServingIndexStatus",
    "refresh_serving_index",
]
