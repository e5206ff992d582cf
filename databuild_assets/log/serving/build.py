"""A new serving index from a lake's raw log and tombstones, in bounded memory.

The raw log's live files are read a few at a time (about 200,000 events) and loaded into a new
SQLite file with its indexes dropped (in a build that evicts, its key on event_id too); then the
events a tombstone matches are hidden, the indexes are built once and the projections computed
for every key, all in SQLite on disk. Memory stays that of one batch and SQLite's cache whatever
the history's size. The stamp is the versions the snapshot was read at: a catch-up then applies
only the commits after them. The pipeline's build then evicts what is cold into segments
(`evict_building`, evict.py's eviction without its row-by-row deletes) before the file is anyone's.

    stamp = build_index(lake, "/data/lake/serving_index/.index-4.sqlite.building")
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable

from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log.serving.cold import SEGMENTS_FOLDER
from databuild_assets.log.serving.cold_ids import DeferredColdIds
from databuild_assets.log.serving.evict import evict_rows, eviction_cache
from databuild_assets.log.serving.follower import DeltaFollower, follower_for
from databuild_assets.log.serving.index import ServingIndex, Stamp, TableMark, create_index_file
from databuild_assets.log.serving.rows import event_rows
from databuild_assets.log.serving.segment_files import segment_paths, segment_writes
from databuild_assets.log.serving.store import remove_index_files
from databuild_assets.log.serving.thaw import keep_latest_pins, work_tables
from databuild_assets.log.sqlite.backend import build_event_indexes, transaction
from databuild_assets.log.sqlite.schema import EVENTS_TABLE
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_local import iter_local_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake

pa = deferred("pyarrow")

log = logging.getLogger(__name__)

_EVENT_COLUMNS = list(EVENT_COLUMNS)
# `events` as a build that evicts loads it: without its key on event_id, which is built once the
# load is done (inserting into it event by event was most of a large load). The eviction makes
# the table again, keyed, of the rows that stay (`_keep_only_staying`).
_UNKEYED_EVENTS = EVENTS_TABLE.replace("event_id         TEXT    NOT NULL PRIMARY KEY,", "event_id TEXT NOT NULL,")
if _UNKEYED_EVENTS == EVENTS_TABLE:
    raise ImportError("sqlite/schema.py EVENTS_TABLE changed: build.py loads `events` without its key")
# Of an unkeyed load, the rows whose event_id an earlier row has: the first of an event_id wins.
_LATER_COPIES = (
    "DELETE FROM main.events WHERE rowid IN (SELECT e.rowid FROM (SELECT event_id, MIN(rowid) AS first"
    " FROM main.events GROUP BY event_id HAVING COUNT(*) > 1) AS d JOIN main.events AS e"
    " ON e.event_id = d.event_id WHERE e.rowid > d.first)"
)
_SNAPSHOT_ATTEMPTS = 3
_PROGRESS_EVERY_S = 10.0


def values_by_key(records: pa.Table) -> dict[str, set[str]]:
    """{key: values} of every erasure request in tombstone records (applied or not: an applied
    one still hides an event that arrives again)."""
    values: dict[str, set[str]] = {}
    if not records.num_rows:
        return values
    for record, key, value in zip(
        *(records.column(name).to_pylist() for name in ("record", "key", "value")), strict=True
    ):
        if record == "requested":
            values.setdefault(key, set()).add(value)
    return values


def table_mark(follower: DeltaFollower, version: int | None, table_id: str | None) -> TableMark:
    """How the index stamps a followed table at `version` (None: the table does not exist)."""
    if version is None:
        return TableMark()
    return TableMark(version, table_id, follower.commit_mark(version))


def tombstone_values(lake: Lake) -> tuple[dict[str, set[str]], TableMark]:
    """Every tombstone value by key, at the tombstones table's latest version, and its mark."""
    follower = follower_for(lake.table_path(TOMBSTONES))
    if not follower.exists():
        return {}, TableMark()
    table = follower.open_table()
    records = follower.load(["record", "key", "value"])
    return values_by_key(records), table_mark(follower, follower.version, table.metadata().id)


def build_index(
    lake: Lake,
    path: str,
    progress: Callable[[str], None] | None = None,
    cold: tuple[str, int] | None = None,
) -> Stamp:
    """Build the serving index of `lake` at `path` (a new file; removed if the build fails)
    from the raw log's latest snapshot; returns its stamp. A data file removed while it was
    read (a vacuum) starts the build again from a newer snapshot. With `cold` (the index folder
    and the hot window in ns), the build requests cold by that window move to segments before
    the file is anyone's (`evict_building`)."""
    progress = progress or log.info
    for attempt in range(_SNAPSHOT_ATTEMPTS):
        try:
            return _build(lake, path, progress, cold)
        except FileNotFoundError:
            if attempt == _SNAPSHOT_ATTEMPTS - 1:
                raise
            progress(f"a data file of the raw log's snapshot was removed while the index was built; again ({path})")
    raise AssertionError("unreachable")


def _build(lake: Lake, path: str, progress: Callable[[str], None], cold: tuple[str, int] | None) -> Stamp:
    remove_index_files(path)
    hidden_by, tombstones = tombstone_values(lake)
    raw = follower_for(lake.table_path(RAW_EVENT_LOG))
    connection = create_index_file(path)
    if cold is not None:
        connection.execute("DROP TABLE main.events")
        connection.execute(_UNKEYED_EVENTS)
    index = ServingIndex(path, connection)
    try:
        raw_mark, loaded = TableMark(), 0
        if raw.exists():
            table = raw.open_table()
            started = reported = time.monotonic()
            # In time order (nearly): a build request's or a partition's events share pages, as
            # in a log that was appended to over time.
            for batch, total in iter_local_table(table, _EVENT_COLUMNS, order_by="timestamp"):
                index.load(event_rows(batch))
                loaded += batch.num_rows
                if time.monotonic() - reported >= _PROGRESS_EVERY_S:
                    reported = time.monotonic()
                    progress(f"serving index: {loaded:,} of {total:,} events loaded ({reported - started:.0f} s)")
            raw_mark = table_mark(raw, table.version(), table.metadata().id)
        progress(f"serving index: {loaded:,} events loaded; hiding, indexing, projecting")
        started = time.monotonic()
        if cold is not None:
            connection.execute("CREATE INDEX main.events_by_id ON events (event_id)")
            connection.execute(_LATER_COPIES)
        index.finish_build(hidden_by, progress, evicting=cold is not None)
        progress(f"serving index: indexes and projections built ({time.monotonic() - started:.0f} s)")
        with index.updating():
            index.set_stamp(Stamp(raw_mark, tombstones))
            index.count_events()
        if cold is not None:
            evict_building(connection, *cold, progress)
    except BaseException:
        index.close()
        remove_index_files(path)
        raise
    index.close()
    return Stamp(raw_mark, tombstones)


def evict_building(
    connection: sqlite3.Connection, index_folder: str, window_ns: int, progress: Callable[[str], None]
) -> None:
    """`evict` on an index being built (no process reads it yet, under the build lock): the
    evicted rows are not deleted one by one from `events` and its indexes but left there while
    the segments are written, then the rows that stay (the hot build requests' and the pins) are
    copied out into `events` made again, with the partitions they list and the indexes built over
    them (`_keep_only_staying`); the file is then written whole (VACUUM), so that it is published
    without the free pages of the events that left. Deleting most of a first build's events from
    every index of `events` was most of its time."""
    unread = ("events_by_type", "events_by_partition", "events_by_job_run")
    for name in unread:
        connection.execute(f"DROP INDEX IF EXISTS main.{name}")
    connection.execute("PRAGMA secure_delete = OFF")
    connection.execute("CREATE TEMP TABLE IF NOT EXISTS staying_pins (event_id TEXT PRIMARY KEY) WITHOUT ROWID")
    connection.execute("DELETE FROM temp.staying_pins")
    work_tables(connection)
    connection.execute("DELETE FROM temp.pin_candidates")
    building = DeferredColdIds()
    try:
        with eviction_cache(connection), segment_writes() as writes:
            evict_rows(connection, index_folder, window_ns, progress, building, writes)
            writes.wait()  # every segment's files on disk before the rows that left them are dropped
            with transaction(connection):
                building.write(connection)
                # Each segment pinned its own latest: of those, only the latest over all stay.
                keep_latest_pins(connection, None)
                connection.execute(
                    "DELETE FROM temp.staying_pins WHERE event_id IN (SELECT event_id FROM temp.superseded)"
                )
                _keep_only_staying(connection)
            progress("serving index: the events that stay copied out and indexed")
            evict_rows(connection, index_folder, window_ns, progress, None)  # merges, if any
    except BaseException as error:
        _remove_segments_of(connection, index_folder)  # the file is dropped: nothing names them
        if isinstance(error, FileNotFoundError):  # not a raw log's file gone: no new snapshot helps
            raise RuntimeError(f"the serving index's eviction while it was built failed: {error}") from error
        raise
    connection.execute("PRAGMA secure_delete = ON")
    progress("serving index: written whole without the events that left")
    connection.execute("DROP TABLE IF EXISTS main.deleted_events")  # the VACUUM leaves none of their bytes
    connection.execute("PRAGMA journal_mode = DELETE")  # VACUUM through a rollback journal, not the WAL
    connection.execute("VACUUM")
    connection.execute("PRAGMA journal_mode = WAL")


def _keep_only_staying(connection: sqlite3.Connection) -> None:
    """Inside the build's transaction: `events` made again (with its key on event_id: a build
    that evicts loads it without, index.py `create_index_file`) of only the rows of hot build
    requests and the pins (temp.staying_pins), in the order it had them, and
    event_listed_partitions of only what they list (a pin lists nothing), with every index
    built over them."""
    connection.execute(
        "CREATE TEMP TABLE staying_events AS SELECT * FROM main.events WHERE build_request_id NOT IN"
        " (SELECT build_request_id FROM main.cold_build_requests)"
        " OR event_id IN (SELECT event_id FROM temp.staying_pins) ORDER BY rowid"
    )
    connection.execute("DROP TRIGGER IF EXISTS main.events_list_partitions")
    connection.execute("DROP TABLE main.events")  # its indexes with it
    connection.execute(EVENTS_TABLE)
    connection.execute("DELETE FROM main.event_listed_partitions")
    connection.execute("INSERT INTO main.events SELECT * FROM temp.staying_events")
    connection.execute("DROP TABLE temp.staying_events")
    connection.execute("DROP TABLE temp.staying_pins")
    build_event_indexes(connection)


def _remove_segments_of(connection: sqlite3.Connection, index_folder: str) -> None:
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    for (segment,) in connection.execute("SELECT segment FROM main.cold_segments").fetchall():
        for path in segment_paths(folder, segment):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


__all__ = ["build_index", "evict_building", "table_mark", "tombstone_values", "values_by_key"]
