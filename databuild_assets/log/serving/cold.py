"""The serving index's cold tier: the events of old, finished build requests in immutable Parquet
segments beside the index, and the reads that answer from them (docs/decisions/0051).

A segment is two files under `<index folder>/segments/`: `segment-<n>.parquet`, the index's flat
`events` rows of the build requests it holds, sorted by (timestamp, event_id), and
`segment-<n>.by-partition.parquet`, one row per (partition_ref, event) for the events that carry
or list a partition (the rows `event_listed_partitions` and `events.partition_ref` give), sorted
by partition_ref (segment_files.py writes them). Both are zstd, in row groups of
`ROWS_PER_GROUP` and `BY_PARTITION_ROWS_PER_GROUP` rows: a partition's events are read from the
row groups whose min/max holds it, a range's and a page's from those of their time, and a build
request's from the row groups `cold_build_requests.row_groups` names (a bitmask written with the
segment: its rows' groups, however long it ran); footers and their row groups' bounds are read once
while the process keeps them (footers.py), and the groups of a file sorted by the column found by
bisection.

`ColdReads` is mixed into the serving index: with no cold build request it answers as the
reference does; with some, the index's rows of cold build requests (the pinned copies kept for
the projections' refresh, evict.py) are left out and the segments' rows merged in.

    rows = read_segment_rows(segments_folder, 3, "build_request_id", {"br-1"}, groups={0, 5})
    [event_from_row(row) for row in rows]
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from databuild_assets.log.interface import EventFilter, EventPage, check_page, decode_cursor, encode_cursor
from databuild_assets.log.serving.arrow import first_in_time_order, in_time_order, page_mask, scalar, strings
from databuild_assets.log.serving.cold_ids import COLD_IDS_TABLE, count_cold_ids
from databuild_assets.log.serving.footers import opened
from databuild_assets.log.serving.pool import each
from databuild_assets.log.serving.segment_files import ROW_COLUMNS, segment_paths
from databuild_assets.log.sqlite.backend import _event_from_row, page_conditions, transaction
from databuild_assets.log.sqlite.schema import (
    BUILD_REQUEST_EVENTS,
    EVENT_COLUMNS_SQL,
    IN_ORDER,
    PARTITION_COUNTS_OF_BUILD_REQUESTS,
    PARTITION_EVENTS,
)
from databuild_assets.runtime.deferred import deferred

if TYPE_CHECKING:
    import pyarrow.parquet as pq

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")

SEGMENTS_FOLDER = "segments"
# The columns of a segment row an event is made of (event_from_row): a read that returns only
# events decodes only these.
EVENT_ROW = ROW_COLUMNS[:5]
_LAST_NS = 2**63 - 1  # a span's open end: no timestamp is later
# A reader paging through cold history (list_events) takes a page of 100 out of a row group of
# thousands: the groups it decoded last are kept, by this index only, so that the next pages
# decode none (ColdReads._decoded_group).
DECODED_GROUPS = 4

# The cold tables of the index (INDEX_FORMAT 3; 4 cold_job_runs.job_events; 5 cold_job_runs only
# for build requests other than the job run's own; 6 the cold ids in buckets; 7 partition counts
# in cold_build_requests, which has no index by segment: a segment's file lists its build
# requests, `still_cold_in`): see evict.py.
COLD_TABLES = """
CREATE TABLE IF NOT EXISTS cold_segments (
    segment INTEGER PRIMARY KEY, events INTEGER NOT NULL, min_timestamp INTEGER NOT NULL,
    max_timestamp INTEGER NOT NULL, stale INTEGER NOT NULL DEFAULT 0  -- 1: a build request came back hot
);
CREATE TABLE IF NOT EXISTS cold_build_requests (
    build_request_id TEXT PRIMARY KEY, segment INTEGER NOT NULL,
    partition_counts TEXT NOT NULL,  -- list_build_requests' counts of its events: {"status code": count}
    row_groups BLOB NOT NULL  -- the row groups of the segment's file holding its rows: bit g, little-endian
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cold_partition_events (
    partition_ref TEXT NOT NULL, segment INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (partition_ref, segment)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cold_job_runs (  -- a cold build request with events of another's job run
    job_run_id TEXT NOT NULL, build_request_id TEXT NOT NULL,
    job_events INTEGER NOT NULL,  -- 1: the build request holds a job or cancel event of the job run
    PRIMARY KEY (job_run_id, build_request_id)) WITHOUT ROWID;
"""
COLD_TABLES += COLD_IDS_TABLE

# The build requests holding events of job run ?1: its own (job_runs.build_request_id, that of its
# first job or cancel event) and any other one listed cold (a hot one is found in `events`).
JOB_RUN_HOLDERS = (
    "SELECT build_request_id FROM main.job_runs WHERE job_run_id = ?1"
    " UNION SELECT build_request_id FROM main.cold_job_runs WHERE job_run_id = ?1"
)

# The index's events of hot build requests: every read of events goes through it once any
# build request is cold (a cold one's pinned rows stay in `events` for the refresh SQL only).
HOT_EVENTS_VIEW = """
CREATE TEMP VIEW IF NOT EXISTS hot_events AS SELECT * FROM main.events
WHERE build_request_id NOT IN (SELECT build_request_id FROM main.cold_build_requests)
"""

# The reads of a key's events when none of them is cold, one statement each (one state of the
# index): a cold build request's rows are not among the hot events; a job run's are cold when
# one of the build requests holding it is; a partition's when a segment holds some.
_HOT_BUILD_REQUEST_EVENTS = BUILD_REQUEST_EVENTS.replace("FROM events", "FROM temp.hot_events")
# (JOB_RUN_HOLDERS' two look-ups apart: its UNION made a temporary B-tree at every read.)
_HOT_JOB_RUN_EVENTS = (
    f"SELECT {EVENT_COLUMNS_SQL} FROM temp.hot_events WHERE job_run_id = ?1"
    " AND NOT EXISTS (SELECT 1 FROM main.job_runs AS j JOIN main.cold_build_requests AS c"
    " ON c.build_request_id = j.build_request_id WHERE j.job_run_id = ?1)"
    " AND NOT EXISTS (SELECT 1 FROM main.cold_job_runs AS r JOIN main.cold_build_requests AS c"
    f" ON c.build_request_id = r.build_request_id WHERE r.job_run_id = ?1) {IN_ORDER}"
)
_NO_COLD_PARTITION_EVENTS = "NOT EXISTS (SELECT 1 FROM main.cold_partition_events WHERE partition_ref = :partition_ref)"
_HOT_PARTITION_EVENTS = PARTITION_EVENTS.replace("FROM events", "FROM temp.hot_events").replace(
    IN_ORDER, f"AND {_NO_COLD_PARTITION_EVENTS}\n{IN_ORDER}"
)


def read_segment_rows(
    folder: str,
    segment: int,
    column: str,
    values: Collection[Any] | None = None,
    by_partition: bool = False,
    spans: Collection[tuple[int, int]] | None = None,
    groups: Collection[int] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The rows of a segment (its by-partition companion with `by_partition`) whose `column` is
    in `values` (every row when None), read from the row groups `groups` when given, else from
    those whose min/max can hold one and, with `spans`, whose timestamps meet one of those (low,
    high) intervals (both ends included); only `columns` (with `column`) when given."""
    file, footer = opened(segment_paths(folder, segment)[1 if by_partition else 0])
    if columns is not None:
        columns = list(dict.fromkeys([*columns, column]))

    def empty() -> pa.Table:  # only when nothing is read: an empty table's arrays import pandas
        table = file.schema_arrow.empty_table()
        return table if columns is None else table.select(columns)

    if values is not None:
        values = sorted(set(values))
        if not values:
            return empty()
    if values is None and spans is None and groups is None:
        return file.read(columns=columns, use_threads=False)
    if groups is not None:
        table = file.read_row_groups(sorted(groups), columns=columns, use_threads=False) if groups else empty()
        return table if values is None else table.filter(_in(table, column, values))
    chosen = set(range(file.metadata.num_row_groups))
    for name, intervals in ((column, None if values is None else [(v, v) for v in values]), ("timestamp", spans)):
        bounds = footer.bounds(file, name) if intervals is not None else None
        if bounds is not None:  # a column some group has no statistics of prunes nothing
            chosen = bounds.meeting(intervals, chosen)
    table = file.read_row_groups(sorted(chosen), columns=columns, use_threads=False) if chosen else empty()
    return table if values is None else table.filter(_in(table, column, values))


def _in(table: pa.Table, column: str, values: list[Any]) -> pa.Array:
    """The mask of `table`'s rows whose `column` is one of `values`."""
    kind = table.schema.field(column).type
    value_set = strings(values) if kind == pa.string() else pa.array(values, kind)
    return pc.is_in(table.column(column), value_set=value_set)


def still_cold_in(connection: Any, segment: int, build_request_ids: Iterable[str]) -> list[str]:
    """Which of `build_request_ids` (those a segment's file holds) are still cold in `segment`:
    of a stale one, those that did not come back hot."""
    return [
        row[0]
        for row in connection.execute(
            "SELECT build_request_id FROM main.cold_build_requests WHERE segment = ?"
            " AND build_request_id IN (SELECT value FROM json_each(?))",
            (segment, json.dumps(list(build_request_ids))),
        )
    ]


def row_groups(mask: bytes) -> list[int]:
    """The row groups a `cold_build_requests.row_groups` bitmask names."""
    bits = int.from_bytes(mask, "little")
    return [number for number in range(bits.bit_length()) if bits >> number & 1]


def cold_by_segment(connection: Any, build_request_ids: Iterable[str]) -> dict[int, tuple[list[str], set[int]]]:
    """The cold ones of `build_request_ids` by segment, with the row groups holding their rows."""
    by_segment: dict[int, tuple[list[str], set[int]]] = {}
    for build_request_id in dict.fromkeys(build_request_ids):
        row = connection.execute(
            "SELECT segment, row_groups FROM main.cold_build_requests WHERE build_request_id = ?", (build_request_id,)
        ).fetchone()
        if row is not None:
            ids, groups = by_segment.setdefault(row[0], ([], set()))
            ids.append(build_request_id)
            groups.update(row_groups(row[1]))
    return by_segment


def event_from_row(row: tuple) -> dict[str, Any]:
    """The event of a segment row, exactly as the reference backend returns it."""
    return _event_from_row(row[:5])


def _in_order(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda event: (event["timestamp"], event["event_id"]))


_SNAPSHOT = "SELECT 1 FROM main.cold_segments LIMIT 1"
_key = itemgetter(1, 0)  # a row's (timestamp, event_id)


def _rows(table: pa.Table, names: Sequence[str] = ROW_COLUMNS) -> list[tuple]:
    columns = [table.column(name).to_pylist() for name in names]
    return list(zip(*columns, strict=True))


class ColdReads:
    """The reads of a serving index that has cold build requests (mixed into ServingIndex, before
    SqliteEventLog): the reference's answers over hot rows and segment rows together."""

    _connection: Any
    segment_folder: str

    def close(self) -> None:
        self.__dict__.pop("_decoded_groups", None)
        super().close()  # type: ignore[misc]

    def _decoded_group(self, segment: int, file: pq.ParquetFile, footer: Any, group: int) -> pa.Table:
        """Row `group` of `segment`'s file in (timestamp, event_id) order, kept decoded among the
        last `DECODED_GROUPS` for the next page, which then takes its first rows by a slice. The
        rows are the file's, before `_live`: a build request that came back hot (a tombstone's
        among them) is left out at each read. A kept group is of the file as the footer cache
        last found it (a file rewritten at the name has another footer); the pipeline's refresh,
        which leaves an erased value out of the segments it writes, makes a new generation of the
        index, and this one's groups go with it."""
        cache = self.__dict__.setdefault("_decoded_groups", OrderedDict())
        hit = cache.get((segment, group))
        if hit is not None and hit[0] is footer:
            cache.move_to_end((segment, group))
            return hit[1]
        table = in_time_order(file.read_row_group(group))
        cache[(segment, group)] = (footer, table)
        while len(cache) > DECODED_GROUPS:
            cache.popitem(last=False)
        return table

    def has_cold(self) -> bool:
        return bool(self._connection.execute("SELECT EXISTS (SELECT 1 FROM main.cold_segments)").fetchone()[0])

    def _live(self, segment: int, table: pa.Table) -> pa.Table:
        """The rows of `table` (of `segment`) whose build request is still cold there: a stale
        segment still holds the rows of build requests that came back hot."""
        stale = self._connection.execute(
            "SELECT stale FROM main.cold_segments WHERE segment = ?", (segment,)
        ).fetchone()
        if stale is None:
            return table.slice(0, 0)
        if not stale[0]:
            return table
        cold = still_cold_in(self._connection, segment, pc.unique(table.column("build_request_id")).to_pylist())
        return table.filter(pc.is_in(table.column("build_request_id"), value_set=strings(cold)))

    def _segment_rows(self, segment: int, column: str, values=None, **options) -> list[tuple]:
        return self._segments_rows([segment], column, values, **options)[0]

    def _segments_rows(
        self,
        segments: Sequence[int],
        column: str,
        values=None,
        by_partition=False,
        keep=None,
        first=None,
        spans=None,
        groups=None,
        columns=ROW_COLUMNS,
    ) -> list[list[tuple]]:
        """The live rows of each of `segments` (their files read side by side, pool.py) whose
        `column` is in `values` (all when None) within `spans` of time or in row `groups`
        (read_segment_rows), those `keep(table)` (an Arrow mask) selects, the `first` of them in
        (timestamp, event_id) order when given: filtered in Arrow, so only returned rows become
        Python tuples, of `columns` (ROW_COLUMNS or a prefix: EVENT_ROW)."""
        read = None if columns == ROW_COLUMNS else columns
        folder = self.segment_folder

        def table_of(segment: int) -> pa.Table:  # the files only: the index's connection stays here
            return read_segment_rows(folder, segment, column, values, by_partition, spans, groups, read)

        found = []
        for segment, table in zip(segments, each(table_of, segments), strict=True):
            table = self._live(segment, table)
            if keep is not None:
                table = table.filter(keep(table))
            if first is not None:
                table = first_in_time_order(table, first)
            found.append(_rows(table, columns))
        return found

    def _cold_of(self, build_request_ids: Iterable[str]) -> dict[int, tuple[list[str], set[int]]]:
        return cold_by_segment(self._connection, build_request_ids)

    # -- the reference's reads, hot rows only, then merged with the segments' ------------------

    def _events(self, sql: str, parameters: Any = ()) -> list[dict[str, Any]]:
        if self.has_cold():
            sql = sql.replace("FROM events", "FROM temp.hot_events")
        return super()._events(sql, parameters)  # type: ignore[misc]

    def _with_cold(self, read):
        """`read()` in one read transaction, so that its hot rows and the segments it looks up
        are of one state of the index (a thaw in between would leave a build request in
        neither); once more if a segment was removed meanwhile (a merge or a refresh replaced
        it), from the index as it is then. Its snapshot is taken before `read` runs, whichever
        table it reads first."""
        try:
            return self._in_one_state(read)
        except FileNotFoundError:
            return self._in_one_state(read)

    def _in_one_state(self, read):
        with transaction(self._connection, "DEFERRED"):
            self._connection.execute(_SNAPSHOT).fetchone()  # a WAL reader's snapshot begins at its first read
            return read()

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        hot = super().get_build_request_events  # type: ignore[misc]
        parameters = {"build_request_id": build_request_id, "since_ns": since_ns}
        found = super()._events(_HOT_BUILD_REQUEST_EVENTS, parameters)  # type: ignore[misc]
        if found or not self.has_cold():  # hot (the service's own builds), or nothing is cold
            return found

        def read() -> list[dict[str, Any]]:
            cold = self._cold_of([build_request_id])
            if not cold:  # hot (a thaw may have brought it back since the last try)
                return hot(build_request_id, since_ns)
            ((segment, (_, groups)),) = cold.items()
            rows = self._segment_rows(segment, "build_request_id", [build_request_id], groups=groups, columns=EVENT_ROW)
            return [event_from_row(row) for row in rows if since_ns is None or row[1] > since_ns]

        return self._with_cold(read)

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        hot_events = super().get_job_run_events  # type: ignore[misc]
        found = super()._events(_HOT_JOB_RUN_EVENTS, (job_run_id,))  # type: ignore[misc]
        if found or not self.has_cold():
            return found

        def read() -> list[dict[str, Any]]:
            hot = hot_events(job_run_id)
            owners = [row[0] for row in self._connection.execute(JOB_RUN_HOLDERS, (job_run_id,))]
            cold = []
            for segment, (build_request_ids, groups) in self._cold_of(owners).items():
                rows = self._segment_rows(segment, "build_request_id", build_request_ids, groups=groups)
                cold.extend(event_from_row(row) for row in rows if row[6] == job_run_id)
            return _in_order(hot + cold)

        return self._with_cold(read)

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        hot_events = super().get_partition_events  # type: ignore[misc]
        parameters = {"partition_ref": partition_ref, "since_ns": since_ns}
        found = super()._events(_HOT_PARTITION_EVENTS, parameters)  # type: ignore[misc]
        if found or not self.has_cold():
            return found

        def read() -> list[dict[str, Any]]:
            hot = hot_events(partition_ref, since_ns)
            segments = self._partition_segments(partition_ref)
            found = self._segments_rows(segments, "key", [partition_ref], by_partition=True, columns=EVENT_ROW)
            cold = [event_from_row(row) for rows in found for row in rows if since_ns is None or row[1] > since_ns]
            return _in_order(hot + cold)

        return self._with_cold(read)

    def _partition_segments(self, partition_ref: str) -> list[int]:
        return [
            row[0]
            for row in self._connection.execute(
                "SELECT segment FROM main.cold_partition_events WHERE partition_ref = ?", (partition_ref,)
            )
        ]

    def _overlapping(self, start_ns: int, end_ns: int) -> list[int]:
        return [
            row[0]
            for row in self._connection.execute(
                "SELECT segment FROM main.cold_segments WHERE max_timestamp >= ? AND min_timestamp < ?"
                " ORDER BY segment",
                (start_ns, end_ns),
            )
        ]

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        hot_events = super().get_events_in_range  # type: ignore[misc]
        if not self.has_cold():
            return hot_events(start_ns, end_ns)

        def read() -> list[dict[str, Any]]:
            hot = hot_events(start_ns, end_ns)

            def within(table: pa.Table) -> pa.Array:
                stamps = table.column("timestamp")
                return pc.and_(pc.greater_equal(stamps, scalar(start_ns)), pc.less(stamps, scalar(end_ns)))

            segments, spans = self._overlapping(start_ns, end_ns), [(start_ns, end_ns - 1)]
            found = self._segments_rows(segments, "timestamp", keep=within, spans=spans, columns=EVENT_ROW)
            cold = [event_from_row(row) for rows in found for row in rows]
            return _in_order(hot + cold)

        return self._with_cold(read)

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        if not self.has_cold():
            return super().list_events(since, filter, limit)  # type: ignore[misc]
        check_page(limit)
        after = decode_cursor(since) if since is not None else None
        where, parameters = page_conditions(since, filter)

        def read() -> list[dict[str, Any]]:
            """The page's `limit` events and one more when there are: the segments' rows first,
            then the hot rows before the last of those (the pinned rows of cold build requests,
            spread over all history, are passed over only within the page's time), merged by
            key; only the rows on the page are decoded."""
            cold = cold_rows()
            hot_where, hot_parameters = where, parameters
            if len(cold) > limit:  # a hot row at or past the last can not be on the page
                hot_where = f"{where} AND (timestamp, event_id) < (?, ?)"
                hot_parameters = [*parameters, *_key(cold[-1])]
            hot = self._connection.execute(
                f"SELECT {EVENT_COLUMNS_SQL} FROM temp.hot_events WHERE {hot_where} {IN_ORDER} LIMIT ?",
                (*hot_parameters, limit + 1),
            ).fetchall()
            return [event_from_row(row) for row in sorted(hot + cold, key=_key)[: limit + 1]]

        def cold_rows() -> list[tuple]:
            def keep_in(segment: int):
                if after is None and filter is None:
                    return None  # every live row passes: no mask to build and apply
                listing: list[str] = []
                if filter is not None and filter.partition_refs is not None:
                    listing = [
                        row[0] for row in self._segment_rows(segment, "key", filter.partition_refs, by_partition=True)
                    ]
                return partial(page_mask, after=after, filter=filter, listing=listing)

            if filter is not None and filter.partition_refs is not None and filter.build_request_ids is None:
                return partition_rows(filter)
            if filter is None or filter.build_request_ids is None:  # (partitions: by `partition_rows`)
                start = after[0] if after is not None else -(2**63)
                among = self._segments_holding(filter) if filter is not None else None
                return self._first_rows(start, keep_in, limit + 1, among)
            rows = []
            for segment, (ids, groups) in self._cold_of(filter.build_request_ids).items():
                rows.extend(
                    self._segment_rows(
                        segment, "build_request_id", ids, keep=keep_in(segment), first=limit + 1, groups=groups
                    )
                )
            return sorted(rows, key=_key)[: limit + 1]

        def partition_rows(filter: EventFilter) -> list[tuple]:
            """The rows of the by-partition files of the segments holding `filter`'s partitions
            (its key is theirs): a page of a few partitions reads their rows there, as
            get_partition_events does, not every row group of those segments' main files."""
            refs, rest = filter.partition_refs, replace(filter, partition_refs=None)
            keep = partial(page_mask, after=after, filter=rest, listing=[])
            segments, spans = sorted(self._segments_holding(filter) or ()), None
            if after is not None:  # past the cursor: the segments, and their groups, that end before it are not read
                spans = [(after[0], _LAST_NS)]
                ending = "SELECT segment FROM main.cold_segments WHERE max_timestamp >= ?"
                later = {row[0] for row in self._connection.execute(ending, (after[0],))}
                segments = [segment for segment in segments if segment in later]
            # An event listing several of the refs has a row for each: enough rows for `limit`
            # + 1 events in each segment.
            found = self._segments_rows(
                segments, "key", refs, by_partition=True, keep=keep, first=(limit + 1) * len(refs), spans=spans
            )
            distinct = {row[0]: row for rows in found for row in rows}
            return sorted(distinct.values(), key=_key)[: limit + 1]

        events = self._with_cold(read)
        has_more, events = len(events) > limit, events[:limit]
        next_cursor = encode_cursor(events[-1]["timestamp"], events[-1]["event_id"]) if events else since
        return EventPage(events=events, next_cursor=next_cursor, has_more=has_more)

    def _segments_holding(self, filter: EventFilter) -> set[int] | None:
        """The segments that can hold an event of `filter`'s partitions and job runs (None: any)."""
        among = None
        for values, sql in (
            (filter.partition_refs, "SELECT segment FROM main.cold_partition_events WHERE partition_ref = ?"),
            (
                filter.job_run_ids,
                f"SELECT segment FROM main.cold_build_requests WHERE build_request_id IN ({JOB_RUN_HOLDERS})",
            ),
        ):
            if values is not None:
                held = {row[0] for value in values for row in self._connection.execute(sql, (value,))}
                among = held if among is None else among & held
        return among

    def _first_rows(self, start_ns: int, keep_in, first: int, among: set[int] | None = None) -> list[tuple]:
        """The `first` live segment rows (of EVENT_ROW's columns) at or after `start_ns` in
        (timestamp, event_id) order that `keep_in(segment)` selects (None: every row), from the
        segments `among` (all when None): row groups read in time order (segments are sorted by
        time) until no later one can hold an earlier row."""
        found = None
        segments = self._connection.execute(
            "SELECT segment, min_timestamp FROM main.cold_segments WHERE max_timestamp >= ? ORDER BY min_timestamp",
            (start_ns,),
        ).fetchall()

        cut = None  # once `first` rows are found: the timestamp no row past the page can be earlier than
        for segment, low in segments:
            if among is not None and segment not in among:
                continue
            if cut is not None and low > cut:
                break
            (file, footer), keep = opened(segment_paths(self.segment_folder, segment)[0]), keep_in(segment)
            bounds = footer.bounds(file, "timestamp")
            for group in range(file.metadata.num_row_groups):
                stamps = (bounds.lows[group], bounds.highs[group]) if bounds is not None else None
                if stamps is not None and stamps[1] < start_ns:
                    continue
                if stamps is not None and cut is not None and stamps[0] > cut:
                    continue  # not `break`: a segment written in another order holds earlier rows later
                table = self._live(segment, self._decoded_group(segment, file, footer, group))
                if keep is not None:
                    table = table.filter(keep(table))
                if found is None:  # the group's rows are in order (`_decoded_group`): the first by a slice
                    found = table.slice(0, first)
                else:
                    found = first_in_time_order(pa.concat_tables([found, table]), first)
                if found.num_rows >= first:
                    cut = found.column("timestamp")[-1].as_py()
        return _rows(found, EVENT_ROW) if found is not None else []

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        active = super().get_active_builds_for_partition(partition_ref)  # type: ignore[misc]
        if not active or not self.has_cold():
            return active
        return [build_request_id for build_request_id in active if not self._cold_of([build_request_id])]

    def _counts_by_build_request(self, sql: str, ids_json: str) -> dict[str, dict[int, int]]:
        if sql != PARTITION_COUNTS_OF_BUILD_REQUESTS or not self.has_cold():
            return super()._counts_by_build_request(sql, ids_json)  # type: ignore[misc]
        counts = super()._counts_by_build_request(sql.replace("FROM events", "FROM temp.hot_events"), ids_json)  # type: ignore[misc]
        for build_request_id, partition_counts in self._connection.execute(
            "SELECT build_request_id, partition_counts FROM main.cold_build_requests"
            " WHERE build_request_id IN (SELECT value FROM json_each(?))",
            (ids_json,),
        ):
            for status_code, count in json.loads(partition_counts).items():
                counts.setdefault(build_request_id, {})[int(status_code)] = count
        return counts

    def _total_events(self) -> int:
        return self._connection.execute("SELECT visible_events FROM serving_stamp").fetchone()[0]

    def cold_facts(self) -> dict[str, int]:
        """How many segments, cold build requests and cold event ids the index holds."""
        with transaction(self._connection, "DEFERRED"):
            facts = {
                table: self._connection.execute(f"SELECT COUNT(*) FROM main.{table}").fetchone()[0]
                for table in ("cold_segments", "cold_build_requests")
            }
            return {**facts, "cold_event_ids": count_cold_ids(self._connection)}


__all__ = [
    "COLD_TABLES",
    "ColdReads",
    "cold_by_segment",
    "HOT_EVENTS_VIEW",
    "JOB_RUN_HOLDERS",
    "SEGMENTS_FOLDER",
    "event_from_row",
    "read_segment_rows",
    "row_groups",
    "still_cold_in",
]
