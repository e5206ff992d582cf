"""A new serving index from a lake's raw log and tombstones, in bounded memory.

The raw log's live files are read a few at a time (about 200,000 events) and loaded into a new
SQLite file with its indexes dropped (in a build that evicts, its key on event_id too); then the
events a tombstone matches are hidden, the indexes are built once and the projections computed
for every key, all in SQLite on disk. Memory stays that of one batch and SQLite's cache whatever
the history's size. The stamp is the versions the
snapshot was read at: a catch-up then applies only the commits after them.

    stamp = build_index(lake, "/data/lake/serving_index/.index-4.sqlite.building")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log.serving.evict import evict_building
from databuild_assets.log.serving.follower import DeltaFollower, follower_for
from databuild_assets.log.serving.index import ServingIndex, Stamp, TableMark, create_index_file
from databuild_assets.log.serving.rows import event_rows
from databuild_assets.log.serving.store import remove_index_files
from databuild_assets.log.sqlite.schema import EVENTS_TABLE
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_local import iter_local_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake

pa = deferred("pyarrow")

log = logging.getLogger(__name__)

_EVENT_COLUMNS = list(EVENT_COLUMNS)
# `events` as a build that evicts loads it: without its key on event_id, which is built once the
# load is done (inserting into it event by event was most of a large load). The eviction makes
# the table again, keyed, of the rows that stay (evict.py `_keep_only_staying`).
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
    the file is anyone's (evict.py `evict_building`)."""
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


__all__ = ["build_index", "table_mark", "tombstone_values", "values_by_key"]
