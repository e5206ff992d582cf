"""Bringing cold build requests back into the serving index (evict.py moves them out).

`thaw` reads a build request's rows back from its segment into `events` (its partition counts
taken off, its cold ids dropped) and marks the segment stale; the next eviction writes what the
segment still holds into a new one. It runs before a late event of a cold build request is
added, before a tombstone hides one of its events or a compaction purges one, and before a job
run of its changes (`thaw_job_runs`): a job run pins nothing, so its job and cancel events come
back hot together before anything recomputes its row.

    with transaction(connection):
        thaw(connection, index_folder, cold_build_requests_among(connection, ["br-1"]))
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from databuild_assets.log.serving.cold import (
    JOB_RUN_HOLDERS,
    ROW_COLUMNS,
    SEGMENTS_FOLDER,
    read_segment_rows,
    request_spans,
    still_cold_in,
)
from databuild_assets.log.serving.cold_ids import drop_cold_ids, known_cold_ids
from databuild_assets.log.sqlite.schema import select_listed_partitions

JOB_RUN_EVENT_TYPES = ("job_event", "task_cancel_event")
_COLUMNS = ", ".join(ROW_COLUMNS)

_WORK = """
CREATE TEMP TABLE IF NOT EXISTS freezing (build_request_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS pinned (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS thawing (
    event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL,
    event_type TEXT NOT NULL, payload TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
"""


def thaw(connection: sqlite3.Connection, index_folder: str, build_request_ids: Iterable[str]) -> int:
    """Bring cold build requests back into `events` (their segment marked stale); returns how many
    were cold. Inside the caller's write transaction."""
    by_segment: dict[int, list[str]] = {}
    for build_request_id in dict.fromkeys(build_request_ids):
        row = connection.execute(
            "SELECT segment FROM main.cold_build_requests WHERE build_request_id = ?", (build_request_id,)
        ).fetchone()
        if row is not None:
            by_segment.setdefault(row[0], []).append(build_request_id)
    if not by_segment:
        return 0
    work_tables(connection)
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    thawed = 0
    for segment, ids in by_segment.items():
        table = read_segment_rows(folder, segment, "build_request_id", ids, spans=request_spans(connection, ids))
        expected = sum(_event_counts(connection, ids))
        if table.num_rows != expected:  # the projection's span missed rows: never lose them, read all
            table = read_segment_rows(folder, segment, "build_request_id", ids)
        rows = list(zip(*(table.column(name).to_pylist() for name in ROW_COLUMNS), strict=True))
        connection.execute("DELETE FROM temp.thawing")
        connection.executemany(f"INSERT INTO temp.thawing VALUES ({', '.join('?' * 8)})", rows)
        new = "temp.thawing AS t WHERE NOT EXISTS (SELECT 1 FROM main.events AS e WHERE e.event_id = t.event_id)"
        # Counted once per partition, then joined: a subquery per partition would scan every
        # thawing row for each (a whole segment thawed: minutes).
        connection.execute(
            "UPDATE main.cold_partition_events AS c SET count = c.count - n.k FROM"
            f" (SELECT t.partition_ref, COUNT(*) AS k FROM {new} GROUP BY t.partition_ref) AS n"
            " WHERE c.segment = ? AND c.partition_ref = n.partition_ref",
            (segment,),
        )
        # The pinned rows get their payloads and listed partitions back (_SLIM_PINNED); the rest
        # are inserted (the events table's trigger lists their partitions).
        connection.execute(
            "UPDATE main.events AS e SET payload = t.payload FROM temp.thawing AS t"
            " WHERE e.event_id = t.event_id AND e.payload <> t.payload"
        )
        connection.execute(
            "INSERT OR IGNORE INTO main.event_listed_partitions (partition_ref, timestamp, event_id)"
            + select_listed_partitions("t", source="temp.thawing AS t, ")
            + " AND EXISTS (SELECT 1 FROM main.events AS e WHERE e.event_id = t.event_id)"
        )
        connection.execute(f"INSERT INTO main.events ({_COLUMNS}) SELECT {_COLUMNS} FROM {new}")
        connection.execute(
            "DELETE FROM main.cold_job_runs WHERE (job_run_id, build_request_id) IN"
            " (SELECT job_run_id, build_request_id FROM temp.thawing WHERE job_run_id IS NOT NULL)"
        )
        drop_cold_ids(connection, (row[0] for row in rows))
        for build_request_id in ids:
            connection.execute("DELETE FROM main.cold_build_requests WHERE build_request_id = ?", (build_request_id,))
        connection.execute("UPDATE main.cold_segments SET stale = 1 WHERE segment = ?", (segment,))
        connection.execute("DELETE FROM temp.thawing")
        thawed += len(ids)
    return thawed


def thaw_before_deleting(connection: sqlite3.Connection, index_folder: str, build_request_ids: Iterable[str]) -> int:
    """`thaw` the cold build requests some of whose events are about to be deleted, and with them
    the build requests of their segments that hold events of a partition they pin: a segment pins
    only its latest event of each kind per partition, so once that row is gone the segment's
    next latest must be in `events` for the partition's refresh to find it. Inside the caller's
    write transaction; returns how many build requests came back."""
    leaving = cold_build_requests_among(connection, build_request_ids)
    pinned: dict[int, set[str]] = {}
    for segment, partition_ref in connection.execute(
        "SELECT DISTINCT c.segment, e.partition_ref FROM main.events AS e"
        " JOIN main.cold_build_requests AS c ON c.build_request_id = e.build_request_id"
        " WHERE e.build_request_id IN (SELECT value FROM json_each(?)) AND e.partition_ref IS NOT NULL",
        (json.dumps(leaving),),
    ):
        pinned.setdefault(segment, set()).add(partition_ref)
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    sharing: list[str] = []
    for segment, refs in pinned.items():
        table = read_segment_rows(folder, segment, "key", refs, by_partition=True)
        carried = table.filter(pc.equal(table.column("key"), table.column("partition_ref")))
        sharing += still_cold_in(connection, segment, pc.unique(carried.column("build_request_id")).to_pylist())
    return thaw(connection, index_folder, [*leaving, *sharing])


def job_runs_of(rows: Iterable[tuple]) -> set[str]:
    """The job runs whose job or cancel event is among `rows` (`events` rows)."""
    return {row[6] for row in rows if row[3] in JOB_RUN_EVENT_TYPES and row[6] is not None}


def thaw_job_runs(connection: sqlite3.Connection, index_folder: str, job_run_ids: Iterable[str]) -> int:
    """Bring back hot the cold build requests holding a job or cancel event of `job_run_ids`,
    before a job or cancel event of theirs is added or deleted: nothing of a job run is pinned,
    so its row is recomputed only over all of its events. Inside the caller's write transaction;
    returns how many build requests came back."""
    holders: dict[str, None] = {}
    own_and_reporting = JOB_RUN_HOLDERS + " AND job_events"  # the job run's own holds a job event
    for job_run_id in job_run_ids:
        holders.update((row[0], None) for row in connection.execute(own_and_reporting, (job_run_id,)))
    return thaw(connection, index_folder, holders) if holders else 0


def _event_counts(connection: sqlite3.Connection, build_request_ids: Iterable[str]) -> list[int]:
    return [
        row[0]
        for i in build_request_ids
        for row in connection.execute("SELECT event_count FROM main.build_requests WHERE build_request_id = ?", (i,))
    ]


def work_tables(connection: sqlite3.Connection) -> None:
    for statement in _WORK.strip().split(";"):
        if statement.strip():
            connection.execute(statement)


def cold_build_requests_among(connection: sqlite3.Connection, build_request_ids: Iterable[str]) -> list[str]:
    """Which of `build_request_ids` are cold."""
    return [
        i
        for i in dict.fromkeys(build_request_ids)
        if connection.execute("SELECT 1 FROM main.cold_build_requests WHERE build_request_id = ?", (i,)).fetchone()
    ]


def cold_build_requests_holding(
    connection: sqlite3.Connection, index_folder: str, event_ids: Collection[str]
) -> list[str]:
    """The cold build requests whose segments hold any of `event_ids` (the kept cold ids say
    which are cold; the segments, which build requests hold them)."""
    cold = known_cold_ids(connection, event_ids)
    if not cold:
        return []
    found: set[str] = set()
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    for (segment,) in connection.execute("SELECT segment FROM main.cold_segments").fetchall():
        table = read_segment_rows(folder, segment, "event_id")
        table = table.filter(pc.is_in(table.column("event_id"), value_set=pa.array(list(cold), pa.string())))
        found.update(table.column("build_request_id").to_pylist())
    return cold_build_requests_among(connection, found)


def cold_build_requests_matching(connection: sqlite3.Connection, index_folder: str, rule: str) -> list[str]:
    """The cold build requests holding an event the tombstone rule `rule` (index.py
    `tombstone_rule_sql` over a row `e`) matches: every segment's rows, through the rule's SQL."""
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    work_tables(connection)
    found: set[str] = set()
    for (segment,) in connection.execute("SELECT segment FROM main.cold_segments").fetchall():
        table = read_segment_rows(folder, segment, "event_id")
        for batch in table.to_batches(max_chunksize=8192):
            rows = list(zip(*(batch.column(name).to_pylist() for name in ROW_COLUMNS), strict=True))
            connection.execute("DELETE FROM temp.thawing")
            connection.executemany(f"INSERT OR IGNORE INTO temp.thawing VALUES ({', '.join('?' * 8)})", rows)
            found.update(
                row[0]
                for row in connection.execute(f"SELECT DISTINCT build_request_id FROM temp.thawing AS e WHERE {rule}")
            )
    connection.execute("DELETE FROM temp.thawing")
    return cold_build_requests_among(connection, found)


__all__ = [
    "JOB_RUN_EVENT_TYPES",
    "cold_build_requests_among",
    "cold_build_requests_holding",
    "cold_build_requests_matching",
    "job_runs_of",
    "thaw",
    "thaw_before_deleting",
    "thaw_job_runs",
    "work_tables",
]
