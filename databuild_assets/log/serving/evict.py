"""Moving finished build requests out of the serving index into segments (cold.py).

`evict` runs in the pipeline's refresh only, under the index folder's build lock: the build
requests that are terminal and whose last event is older than the log's newest event minus the
hot window are written to a new segment, then in one transaction recorded cold and their events
deleted from the index, except the pinned ones. For each partition their events touch, the
events the partition_state refresh SQL picks among all cold events (the latest of each kind, over
every segment: a pin that a later-evicted row supersedes leaves) stay in `events`, so a later
refresh over what remains gives the reference's answer: the max over what remains is the max
over all. A pinned partition event keeps an empty payload, which that SQL never reads, and no
pinned event lists partitions (reads of a cold build request's events go to its segment). A job
run pins nothing (its job and cancel events live in one build request): its
cold build requests come back hot before one of its job or cancel events is added or deleted
(`thaw_job_runs`). What the SQL would count over the evicted events is kept per key
(`cold_partition_events`, `cold_build_requests.partition_counts`), and every evicted event id
(cold_ids.py), so an append still dedupes against the whole log.

`thaw` (thaw.py) brings cold build requests back hot; their segment is then stale, and the next
`evict` writes what it still holds into a new segment and drops it.

    with folder.build_lock():
        evict(index, folder_path, window_ns=3_600 * 10**9)
        sweep_segments(index, folder_path)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping

from databuild_assets.events.enums import TERMINAL_BUILD_REQUEST_STATUSES
from databuild_assets.log.serving.cold import SEGMENTS_FOLDER, still_cold_in
from databuild_assets.log.serving.cold_ids import DeferredColdIds, add_cold_ids
from databuild_assets.log.serving.footers import parquet_file
from databuild_assets.log.serving.segment_files import (
    ROW_COLUMNS,
    SegmentWrites,
    rows_table,
    segment_paths,
    write_segment,
)
from databuild_assets.log.serving.store import IndexFolder
from databuild_assets.log.serving.thaw import (
    JOB_RUN_EVENT_TYPES,
    PIN_CANDIDATES_OF_FROZEN,
    keep_latest_pins,
    pin_latest,
    pin_latest_of,
    thaw,
    work_tables,
)
from databuild_assets.log.sqlite.backend import transaction
from databuild_assets.log.sqlite.schema import (
    PARTITION_COUNTS_OF_BUILD_REQUESTS,
    select_listed_partitions,
)
from databuild_assets.runtime.deferred import deferred

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")

# A segment holds about this many events at most: the rows of one eviction's transaction are in
# memory while it is written.
SEGMENT_EVENTS = 262_144
# Segments smaller than SEGMENT_EVENTS / MERGE_FANIN are merged, MERGE_FANIN of a size at a time:
# a refresh every few seconds that evicts a few build requests each time leaves a number of
# segments that follows the history's size, not its age.
MERGE_FANIN = 4
_MERGE_ROUNDS = 16  # a merge makes one segment of the next size up, which may complete a merge there
HOT_WINDOW_ENV = "DATABUILD_SERVING_HOT_WINDOW_S"
PROGRESS_EVERY_S = 10.0
# SQLite's page cache while evicting: a segment's deletes touch the pages of every index of
# `events`, and SQLite's default (2 MiB) reads most of them again from the OS per row. Pages are
# taken as used, so a small eviction costs nothing more.
EVICTION_CACHE_KIB = 262_144
# An hour of log time: what a service reads again is recent, and an hour of it at a service's rate
# (tens of events a second) is a hot set of some hundred thousand events, whatever the history.
DEFAULT_HOT_WINDOW_S = 3_600.0
_TERMINAL = ", ".join(str(int(code)) for code in sorted(TERMINAL_BUILD_REQUEST_STATUSES))
_COLUMNS = ", ".join(ROW_COLUMNS)
log = logging.getLogger(__name__)
_SEGMENT_FILE = re.compile(r"^segment-(\d+)\.(?:by-partition\.)?parquet(?:\.building)?$")


def hot_window_ns(window_s: float | None = None) -> int | None:
    """The hot window in nanoseconds of log time: `window_s`, else DATABUILD_SERVING_HOT_WINDOW_S,
    else DEFAULT_HOT_WINDOW_S; None (nothing is evicted) for `inf`. A value that is not a number of
    seconds, 0 or more, is refused."""
    if window_s is None:
        text = os.environ.get(HOT_WINDOW_ENV, "").strip()
        if not text:
            window_s = DEFAULT_HOT_WINDOW_S
        else:
            try:
                window_s = float(text)
            except ValueError:
                window_s = None
            if window_s is None or not window_s >= 0:
                raise ValueError(
                    f"{HOT_WINDOW_ENV}={text!r} is not a number of seconds: set the hot window of the serving "
                    f"index (0 or more; inf keeps every event in the index; unset is {DEFAULT_HOT_WINDOW_S:.0f})"
                )
    if not window_s >= 0:
        raise ValueError(f"the hot window must be a number of seconds, 0 or more, got {window_s!r}")
    if window_s == float("inf"):
        return None
    return round(window_s * 1e9)


_FROZEN = "(SELECT * FROM main.events WHERE build_request_id IN (SELECT build_request_id FROM temp.freezing))"
_JOB_RUN_TYPES_SQL = ", ".join(f"'{name}'" for name in JOB_RUN_EVENT_TYPES)
# list_build_requests' counts of the evicting build requests (cold_build_requests.partition_counts).
_COUNTS_OF_FROZEN = PARTITION_COUNTS_OF_BUILD_REQUESTS.replace(
    "FROM events\n    WHERE build_request_id IN (SELECT value FROM json_each(?)) AND", "FROM temp.frozen WHERE"
)
if _COUNTS_OF_FROZEN == PARTITION_COUNTS_OF_BUILD_REQUESTS:
    raise ImportError("sqlite/schema.py PARTITION_COUNTS_OF_BUILD_REQUESTS changed: evict.py reads it of temp.frozen")


# The candidates of `keep_latest_pins` in an eviction: the rows it pins (temp.pinned) and the
# pins already kept (the rows of cold build requests in `events`) of the partitions they carry.
_PINS_OF_PINNED_REFS = (
    "SELECT event_id FROM temp.pinned UNION SELECT e.event_id FROM main.events AS e"
    " JOIN main.cold_build_requests AS c ON c.build_request_id = e.build_request_id WHERE e.partition_ref IN"
    " (SELECT partition_ref FROM main.events WHERE event_id IN (SELECT event_id FROM temp.pinned))"
)
# The superseded pins of build requests evicted before (the evicting rows leave with the others).
_DROP_SUPERSEDED_COLD_PINS = (
    "DELETE FROM main.events WHERE event_id IN (SELECT s.event_id FROM temp.superseded AS s"
    " JOIN main.events AS e USING (event_id) JOIN main.cold_build_requests AS c"
    " ON c.build_request_id = e.build_request_id)"
)
# The refresh SQL reads no payload field of a partition event (only a delegation's and an
# invalidation's): a pinned one keeps an empty payload while its build request is cold. Its whole
# row is in the segment; `thaw` puts the payload back.
_SLIM_PINNED = (
    "UPDATE main.events SET payload = '{}' WHERE event_type = 'partition_event'"
    " AND event_id IN (SELECT event_id FROM temp.pinned)"
)


def _next_segment(connection: sqlite3.Connection, folder: str) -> int:
    names = os.listdir(folder) if os.path.isdir(folder) else []
    on_disk = [int(m.group(1)) for name in names if (m := _SEGMENT_FILE.match(name))]
    recorded = connection.execute("SELECT MAX(segment) FROM main.cold_segments").fetchone()[0] or 0
    return max([recorded, *on_disk]) + 1


def evict(
    connection: sqlite3.Connection,
    index_folder: str,
    window_ns: int | None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Rewrite the stale segments, then move the build requests cold by `window_ns` (None: none)
    into new segments, and merge small segments; returns how many events left the index. Under
    the build lock. An eviction that lasts (a window first set on a full index, a first build)
    tells `progress` (default: this module's logger) how far it is every PROGRESS_EVERY_S."""
    with eviction_cache(connection):
        return evict_rows(connection, index_folder, window_ns, progress, None)


@contextlib.contextmanager
def eviction_cache(connection: sqlite3.Connection) -> Iterator[None]:
    """EVICTION_CACHE_KIB of page cache for `main` and `temp` while an eviction runs, and its
    work rows (temp.frozen: a segment's events; temp.evictable) emptied however it ends."""
    previous = [connection.execute(f"PRAGMA {schema}.cache_size").fetchone()[0] for schema in ("main", "temp")]
    for schema in ("main", "temp"):
        connection.execute(f"PRAGMA {schema}.cache_size = -{EVICTION_CACHE_KIB}")
    try:
        yield
    finally:
        for schema, size in zip(("main", "temp"), previous, strict=True):
            connection.execute(f"PRAGMA {schema}.cache_size = {size}")
        with contextlib.suppress(sqlite3.OperationalError):  # made by the eviction, if it began
            connection.execute("DELETE FROM temp.frozen")  # the last segment's rows
            connection.execute("DELETE FROM temp.evictable")


def evict_rows(
    connection: sqlite3.Connection,
    index_folder: str,
    window_ns: int | None,
    progress: Callable[[str], None] | None,
    building: DeferredColdIds | None,
    writes: SegmentWrites | None = None,
) -> int:
    """`evict`; with `building` (an index being built, build.py `evict_building`), the evicted ids are
    gathered there, the evicted rows stay in `events`, no segments are merged (the caller copies
    out what stays, then merges) and the segments' files are written by `writes`."""
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    work_tables(connection)
    evicted = 0
    started = reported = time.monotonic()
    for _ in range(_MERGE_ROUNDS):
        stale = [row[0] for row in connection.execute("SELECT segment FROM main.cold_segments WHERE stale")]
        for segment in stale:  # its build requests come back hot, and are evicted again below
            with transaction(connection):
                thaw(connection, index_folder, _cold_in(connection, folder, segment))
                connection.execute("DELETE FROM main.cold_partition_events WHERE segment = ?", (segment,))
                connection.execute("DELETE FROM main.cold_segments WHERE segment = ?", (segment,))
        if window_ns is None:
            break
        cut, after = _list_evictable(connection, window_ns), 0
        while cut is not None:
            with transaction(connection):
                moved, after = _evict_one(connection, folder, cut, after, building, writes)
            if not moved:
                break
            evicted += moved
            if time.monotonic() - reported >= PROGRESS_EVERY_S:
                reported = time.monotonic()
                (progress or log.info)(
                    f"serving index: {evicted:,} events moved to segments ({reported - started:.0f} s)"
                )
        merging = [] if building else _small_segments_to_merge(connection)
        if not merging:
            break
        for group in merging:
            _merge(connection, folder, group)
    _shrink_if_mostly_free(connection)
    return evicted


def _small_segments_to_merge(connection: sqlite3.Connection) -> list[list[int]]:
    """The small segments of each size tier (tiers MERGE_FANIN times apart), MERGE_FANIN of a
    tier at a time: each event is merged about log(SEGMENT_EVENTS / its first segment's size) /
    log(MERGE_FANIN) times, and the segments number about MERGE_FANIN per tier plus the full ones."""
    tiers: dict[int, list[int]] = {}
    for segment, events in connection.execute(
        "SELECT segment, events FROM main.cold_segments WHERE NOT stale AND events < ? ORDER BY segment",
        (SEGMENT_EVENTS // MERGE_FANIN,),
    ):
        tier = 0
        while events >= MERGE_FANIN:
            events //= MERGE_FANIN
            tier += 1
        tiers.setdefault(tier, []).append(segment)
    return [
        tier[start : start + MERGE_FANIN]
        for tier in tiers.values()
        for start in range(0, len(tier) - MERGE_FANIN + 1, MERGE_FANIN)
    ]


def _merge(connection: sqlite3.Connection, folder: str, segments: list[int]) -> bool:
    """Write the rows of `segments` into one new segment, then point their build requests and
    partition counts at it in one short transaction: their events stay cold, and the appends,
    which wait for the index's write lock, wait only for that switch (a merge that thawed the
    segments and evicted them again held it for seconds). False, with nothing changed, when a
    thaw (a late event, a tombstone) made one of them stale meanwhile: the next round rewrites it."""
    rows = pa.concat_tables(parquet_file(segment_paths(folder, segment)[0]).read() for segment in segments)
    merged = _next_segment(connection, folder)
    low, high, groups, _ = write_segment(folder, merged, rows)
    marks = ", ".join("?" * len(segments))
    live = 0
    requests = sorted(groups)  # a segment not stale holds its build requests all cold
    try:
        with transaction(connection):
            live = connection.execute(
                f"SELECT COUNT(*) FROM main.cold_segments WHERE NOT stale AND segment IN ({marks})", segments
            ).fetchone()[0]
            if live == len(segments):
                _switch_to_merged(connection, segments, requests, merged, (rows.num_rows, low, high), groups)
    finally:
        if live != len(segments):  # given up, or the switch failed: no row names the new files
            for path in segment_paths(folder, merged):
                os.unlink(path)
    return live == len(segments)


def _switch_to_merged(
    connection: sqlite3.Connection,
    segments: list[int],
    requests: list[str],
    merged: int,
    facts: tuple,
    groups: dict[str, bytes],
) -> None:
    """Inside the merge's transaction: the merged segment in place of `segments` (`facts`: its
    events, min and max timestamp; `requests`: the build requests they hold, `groups`: their row
    groups in the merged file), and the pins of its build requests chosen again over all of them,
    so that a partition keeps the latest of each kind of the merged segment, not of each one (each
    segment's pins hold the latest of its own: the latest among them is the merged one's). The
    rows no longer pinned leave `events` and join the partition counts."""
    marks = ", ".join("?" * len(segments))
    connection.execute("INSERT INTO main.cold_segments VALUES (?, ?, ?, ?, 0)", (merged, *facts))
    connection.executemany(
        "UPDATE main.cold_build_requests SET segment = ?, row_groups = ? WHERE build_request_id = ?",
        ((merged, groups[build_request_id], build_request_id) for build_request_id in requests),
    )
    connection.execute(
        "INSERT INTO main.cold_partition_events (partition_ref, segment, count) SELECT partition_ref, ?,"
        f" SUM(count) FROM main.cold_partition_events WHERE segment IN ({marks}) GROUP BY partition_ref",
        (merged, *segments),
    )
    connection.execute(f"DELETE FROM main.cold_partition_events WHERE segment IN ({marks})", segments)
    connection.execute(f"DELETE FROM main.cold_segments WHERE segment IN ({marks})", segments)
    connection.execute("DELETE FROM temp.freezing")
    connection.execute("DELETE FROM temp.pinned")
    connection.executemany("INSERT INTO temp.freezing VALUES (?)", ((i,) for i in requests))
    pin_latest(connection, _FROZEN)
    unpinned = f"{_FROZEN} WHERE event_id NOT IN (SELECT event_id FROM temp.pinned)"
    connection.execute(
        "INSERT INTO main.cold_partition_events (partition_ref, segment, count)"
        f" SELECT partition_ref, ?, COUNT(*) FROM {unpinned} AND partition_ref IS NOT NULL GROUP BY partition_ref"
        " ON CONFLICT (partition_ref, segment) DO UPDATE SET count = count + excluded.count",
        (merged,),
    )
    connection.execute(f"DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM {unpinned})")


def _shrink_if_mostly_free(connection: sqlite3.Connection) -> None:
    """Evicted rows free pages that later rows reuse, and their cells are zeroed (secure_delete):
    an eviction need not write the file whole (an erasure does, index.py `deleted_events`). It
    does when most of the file is free pages, e.g. after a window is first set on a full index,
    so that the file shrinks."""
    free = connection.execute("PRAGMA main.freelist_count").fetchone()[0]
    pages = connection.execute("PRAGMA main.page_count").fetchone()[0]
    if free * 2 > pages:
        with transaction(connection):
            _count_deleted(connection, free)


def evict_under_lock(
    folder: IndexFolder,
    connection: sqlite3.Connection,
    window_ns: int | None,
    marker,
    progress: Callable[[str], None] | None = None,
) -> None:
    """`evict` and `sweep_segments` under the folder's build lock, unless the generation in use is
    no longer `marker`'s (another process published one: the next refresh evicts)."""
    with folder.build_lock():
        if folder.marker() == marker:
            evict(connection, folder.path, window_ns, progress)
            sweep_segments(connection, folder.path)


def _cold_in(connection: sqlite3.Connection, folder: str, segment: int) -> list[str]:
    """The build requests still cold in `segment`: those its file holds that did not come back."""
    table = parquet_file(segment_paths(folder, segment)[0]).read(columns=["build_request_id"])
    return still_cold_in(connection, segment, pc.unique(table.column("build_request_id")).to_pylist())


def _list_evictable(connection: sqlite3.Connection, window_ns: int) -> int | None:
    """Into temp.evictable, in the order segments take them (a segment holds a stretch of time:
    a range reads one): the build requests cold by `window_ns` now; returns the cut (their last
    event is at or before it), None when the index holds no event. Listed once per eviction,
    not per segment: sorting every terminal build request for each of a 10M first build's 38
    segments was most of its eviction."""
    newest = connection.execute(
        "SELECT MAX(t) FROM (SELECT MAX(timestamp) AS t FROM main.events"
        " UNION ALL SELECT MAX(max_timestamp) FROM main.cold_segments)"
    ).fetchone()[0]
    connection.execute("DELETE FROM temp.evictable")
    if newest is None:
        return None
    connection.execute(
        "INSERT INTO temp.evictable SELECT build_request_id FROM main.build_requests"
        f" WHERE status_code IN ({_TERMINAL}) AND updated_at <= ?"
        " AND build_request_id NOT IN (SELECT build_request_id FROM main.cold_build_requests)"
        " ORDER BY updated_at, build_request_id",
        (newest - window_ns,),
    )
    return newest - window_ns


def _evict_one(
    connection: sqlite3.Connection,
    folder: str,
    cut: int,
    after: int,
    building: DeferredColdIds | None,
    writes: SegmentWrites | None,
) -> tuple[int, int]:
    """One segment's worth of the build requests temp.evictable lists past position `after`,
    inside the caller's transaction (`building`: see `_evict`); returns how many events left the
    index and the position reached. Each is checked again here: an append may have added to it
    since it was listed (it is then no longer terminal, or no longer older than `cut`)."""
    chosen, total = [], 0
    for position, build_request_id, count in connection.execute(
        "SELECT e.rowid, e.build_request_id, b.event_count FROM temp.evictable AS e"
        " CROSS JOIN main.build_requests AS b ON b.build_request_id = e.build_request_id"
        f" WHERE e.rowid > ? AND b.status_code IN ({_TERMINAL}) AND b.updated_at <= ?"
        " AND e.build_request_id NOT IN (SELECT build_request_id FROM main.cold_build_requests) ORDER BY e.rowid",
        (after, cut),
    ):
        if chosen and total + count > SEGMENT_EVENTS:
            break
        chosen.append(build_request_id)
        total += count
        after = position
    if not chosen:
        return 0, after
    connection.execute("DELETE FROM temp.freezing")
    connection.execute("DELETE FROM temp.pinned")
    connection.executemany("INSERT INTO temp.freezing VALUES (?)", ((i,) for i in chosen))
    # Their rows copied once: what follows reads them ten times, and `events` at 10M is mostly
    # not in SQLite's cache.
    connection.execute("DELETE FROM temp.frozen")
    connection.execute(f"INSERT INTO temp.frozen SELECT {_COLUMNS} FROM {_FROZEN}")
    rows = rows_table(connection.execute(f"SELECT {_COLUMNS} FROM temp.frozen"))
    segment = _next_segment(connection, folder)
    low, high, groups, refs = write_segment(folder, segment, rows, writes)
    pin_latest_of(connection, rows)
    if building is None:  # the pins of the partitions these rows carry, over every segment
        keep_latest_pins(connection, _PINS_OF_PINNED_REFS)
        connection.execute(_DROP_SUPERSEDED_COLD_PINS)
    connection.execute(_SLIM_PINNED)
    connection.execute("INSERT INTO main.cold_segments VALUES (?, ?, ?, ?, 0)", (segment, rows.num_rows, low, high))
    by_request: dict[str, dict[str, int]] = {build_request_id: {} for build_request_id in chosen}
    for build_request_id, status_code, count in connection.execute(_COUNTS_OF_FROZEN):
        by_request[build_request_id][str(status_code)] = count
    connection.executemany(
        "INSERT INTO main.cold_build_requests VALUES (?, ?, ?, ?)",
        ((i, segment, json.dumps(c, separators=(",", ":")), groups.get(i, b"")) for i, c in by_request.items()),
    )
    # partition_state.event_count counts the events carrying the ref: those deleted here are kept
    # as a count; a ref only listed gets a row of 0, its pointer to this segment (of every ref the
    # rows carry or list: the carried ones get their count next).
    connection.executemany(
        "INSERT OR IGNORE INTO main.cold_partition_events VALUES (?, ?, 0)", ((ref, segment) for ref in refs)
    )
    connection.execute(
        "INSERT INTO main.cold_partition_events (partition_ref, segment, count)"
        " SELECT partition_ref, ?, COUNT(*) FILTER (WHERE event_id NOT IN (SELECT event_id FROM temp.pinned))"
        " FROM temp.frozen WHERE partition_ref IS NOT NULL GROUP BY partition_ref"
        " ON CONFLICT (partition_ref, segment) DO UPDATE SET count = excluded.count",
        (segment,),
    )
    # A job run's own build request is found by its projection row (JOB_RUN_HOLDERS): only the
    # others that hold events of it are listed.
    connection.execute(
        "INSERT OR IGNORE INTO main.cold_job_runs SELECT job_run_id, build_request_id,"
        f" MAX(event_type IN ({_JOB_RUN_TYPES_SQL})) FROM temp.frozen AS f WHERE job_run_id IS NOT NULL"
        " GROUP BY job_run_id, build_request_id HAVING NOT EXISTS (SELECT 1 FROM main.job_runs AS r"
        " WHERE r.job_run_id = f.job_run_id AND r.build_request_id = f.build_request_id)"
    )  # looked up once a pair, not once an event
    event_ids = rows.column("event_id").to_pylist()
    if building is not None:  # the rows stay until `_keep_only_staying`, and the ids are written once
        building.add(event_ids)
        connection.execute("INSERT OR IGNORE INTO temp.staying_pins SELECT event_id FROM temp.pinned")
        connection.execute(PIN_CANDIDATES_OF_FROZEN)  # read here, not looked up in `events` at the end
        return rows.num_rows, after
    add_cold_ids(connection, event_ids)
    # Reads of a cold build request's partitions go to the segment: the pinned rows list none.
    # By the table's own key (the refs their rows list), not by event_id: that would scan it whole.
    connection.execute(
        "DELETE FROM main.event_listed_partitions WHERE (partition_ref, timestamp, event_id) IN ("
        + select_listed_partitions("e", source="temp.frozen AS e, ")
        + ")"
    )
    leaving = "SELECT event_id FROM temp.frozen WHERE event_id NOT IN (SELECT event_id FROM temp.pinned)"
    connection.execute(f"DELETE FROM main.events WHERE event_id IN ({leaving})")
    return rows.num_rows, after


def _count_deleted(connection: sqlite3.Connection, deleted: int) -> None:
    """Have the refresh write the file whole (index.py `deleted_events`)."""
    if deleted:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS main.deleted_events"
            " (one INTEGER PRIMARY KEY CHECK (one = 1), count INTEGER NOT NULL)"
        )
        connection.execute(
            "INSERT INTO main.deleted_events VALUES (1, ?) ON CONFLICT (one) DO UPDATE SET count = count + ?",
            (deleted, deleted),
        )


def sweep_segments(connection: sqlite3.Connection, index_folder: str) -> list[str]:
    """Remove the segment files the index does not name (rewritten, or of a dead eviction);
    under the build lock. Returns the paths removed."""
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    if not os.path.isdir(folder):
        return []
    named = {row[0] for row in connection.execute("SELECT segment FROM main.cold_segments")}
    removed = []
    for name in sorted(os.listdir(folder)):
        match = _SEGMENT_FILE.match(name)
        if match and (int(match.group(1)) not in named or name.endswith(".building")):
            os.unlink(os.path.join(folder, name))
            removed.append(os.path.join(folder, name))
    return removed


def segment_files(index_folder: str, connection: sqlite3.Connection) -> list[str]:
    """The files of the segments the index names."""
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    return [
        path
        for (segment,) in connection.execute("SELECT segment FROM main.cold_segments")
        for path in segment_paths(folder, segment)
    ]


def visible_values(index_folder: str, connection: sqlite3.Connection) -> Mapping[str, pa.Table]:
    """Each named segment file's rows (for a scan of the values they hold)."""
    return {path: parquet_file(path).read() for path in segment_files(index_folder, connection)}


__all__ = [
    "DEFAULT_HOT_WINDOW_S",
    "HOT_WINDOW_ENV",
    "MERGE_FANIN",
    "SEGMENT_EVENTS",
    "evict",
    "evict_rows",
    "evict_under_lock",
    "eviction_cache",
    "hot_window_ns",
    "segment_files",
    "sweep_segments",
]
