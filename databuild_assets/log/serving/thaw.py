"""Bringing cold build requests back into the serving index (evict.py moves them out).

`thaw` reads a build request's rows back from its segment into `events` (its partition counts
taken off, its cold ids dropped) and marks the segment stale; the next eviction writes what the
segment still holds into a new one; the pins that were their rows are replaced by the latest of
the still-cold rows of every segment holding those partitions (`_repin`), so that deleting the
rows that came back never takes a partition's cold maximum out of `events`. It runs before a late
event of a cold build request is added, before a tombstone hides one of its events or a
compaction purges one, and before a job run of its changes (`thaw_job_runs`): a job run pins
nothing, so its job and cancel events come back hot together before anything recomputes its row.

    with transaction(connection):
        thaw(connection, index_folder, cold_build_requests_among(connection, ["br-1"]))
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Collection, Iterable

from databuild_assets.events.enums import PartitionStatus
from databuild_assets.log.serving.arrow import strings
from databuild_assets.log.serving.cold import (
    JOB_RUN_HOLDERS,
    SEGMENTS_FOLDER,
    cold_by_segment,
    read_segment_rows,
    still_cold_in,
)
from databuild_assets.log.serving.cold_ids import drop_cold_ids, known_cold_ids
from databuild_assets.log.serving.segment_files import ROW_COLUMNS
from databuild_assets.log.sqlite.schema import select_listed_partitions
from databuild_assets.runtime.deferred import deferred

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")

JOB_RUN_EVENT_TYPES = ("job_event", "task_cancel_event")
_COLUMNS = ", ".join(ROW_COLUMNS)
_UNLESS_PAYLOAD = [name for name in ROW_COLUMNS if name != "payload"]

_WORK = """
CREATE TEMP TABLE IF NOT EXISTS freezing (build_request_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS pinned (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS pin_candidates (
    event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL,
    event_type TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
CREATE TEMP TABLE IF NOT EXISTS superseded (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS evictable (build_request_id TEXT NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS frozen (
    event_id TEXT NOT NULL, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL, event_type TEXT NOT NULL,
    payload TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
CREATE TEMP TABLE IF NOT EXISTS repinning (
    segment INTEGER NOT NULL, event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL,
    build_request_id TEXT NOT NULL, event_type TEXT NOT NULL, payload TEXT NOT NULL, partition_ref TEXT,
    job_run_id TEXT, status_code INTEGER
);
CREATE TEMP TABLE IF NOT EXISTS thawing (
    event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL,
    event_type TEXT NOT NULL, payload TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
"""


# The events the refresh SQL of partition_state picks for a partition: the latest, the latest
# partition event, with a job run, available, delegation and invalidation. Each is (its event type
# or None for any, whether it needs a job run, the status it needs or None); `pin_latest` renders
# them as SQL and `pin_latest_of` as Arrow masks, so the two cannot drift apart.
_AVAILABLE = int(PartitionStatus.PARTITION_AVAILABLE)
_PICKS: tuple[tuple[str | None, bool, int | None], ...] = (
    (None, False, None),
    ("partition_event", False, None),
    ("partition_event", True, None),
    ("partition_event", False, _AVAILABLE),
    ("delegation_event", False, None),
    ("partition_invalidation_event", False, None),
)


def _pick_sql(event_type: str | None, job_run: bool, status: int | None) -> str:
    conditions = ["partition_ref IS NOT NULL"]
    if event_type is not None:
        conditions.append(f"event_type = '{event_type}'")
    if job_run:
        conditions.append("job_run_id IS NOT NULL")
    if status is not None:
        conditions.append(f"status_code = {int(status)}")
    return " AND ".join(conditions)


def _pick_mask(rows: pa.Table, event_type: str | None, job_run: bool, status: int | None) -> pa.ChunkedArray:
    mask = pc.is_valid(rows.column("partition_ref"))
    if event_type is not None:
        mask = pc.and_(mask, pc.equal(rows.column("event_type"), event_type))
    if job_run:
        mask = pc.and_(mask, pc.is_valid(rows.column("job_run_id")))
    if status is not None:
        mask = pc.and_(mask, pc.equal(rows.column("status_code"), status))
    return pc.fill_null(mask, False)


# The columns of temp.pin_candidates, of rows `e`.
_PIN_CANDIDATE_COLUMNS = (
    "SELECT e.event_id, e.timestamp, e.build_request_id, e.event_type, e.partition_ref, e.job_run_id, e.status_code"
)
# The rows of a segment being written that it pins, as candidates (a first build's eviction).
PIN_CANDIDATES_OF_FROZEN = (
    f"INSERT OR IGNORE INTO temp.pin_candidates {_PIN_CANDIDATE_COLUMNS} FROM temp.frozen AS e"
    " WHERE e.event_id IN (SELECT event_id FROM temp.pinned)"
)


def pin_latest(connection: sqlite3.Connection, rows: str) -> None:
    """Into temp.pinned: the event ids among `rows` (a FROM expression of `events` rows) that
    the refresh SQL of partition_state would pick, for each partition they carry."""
    for pick in _PICKS:
        connection.execute(
            "INSERT OR IGNORE INTO temp.pinned SELECT event_id FROM (SELECT event_id, ROW_NUMBER() OVER"
            " (PARTITION BY partition_ref ORDER BY timestamp DESC, event_id DESC) AS n FROM"
            f" {rows} WHERE {_pick_sql(*pick)}) WHERE n = 1"
        )


def pin_latest_of(connection: sqlite3.Connection, rows: pa.Table) -> None:
    """`pin_latest` of `rows` (segment_files.py `segment_schema()`) already in memory, in Arrow: for
    each pick, the rows of the latest timestamp per partition, then of those the greatest
    event_id (ORDER BY timestamp DESC, event_id DESC; both orders bytewise). Six window queries
    over a segment's rows in SQLite were a tenth of a first build's segments."""
    keys = rows.select(["partition_ref", "timestamp", "event_id"])
    chosen: set[str] = set()
    for pick in _PICKS:
        candidates = keys.filter(_pick_mask(rows, *pick))
        if not candidates.num_rows:
            continue
        latest = candidates.group_by("partition_ref").aggregate([("timestamp", "max")])
        at_latest = candidates.join(latest, "partition_ref").filter(
            pc.equal(pc.field("timestamp"), pc.field("timestamp_max"))
        )
        chosen.update(at_latest.group_by("partition_ref").aggregate([("event_id", "max")]).column(1).to_pylist())
    connection.executemany("INSERT OR IGNORE INTO temp.pinned VALUES (?)", ((i,) for i in sorted(chosen)))


def keep_latest_pins(connection: sqlite3.Connection, candidates: str | None) -> None:
    """Of `candidates` (a SELECT of the event ids of rows in `events`: the pins of cold build
    requests, with the rows an eviction is pinning), only the latest of each kind per partition
    stay pinned (temp.pinned): the cold tier pins a partition's cold maximum once, over every
    segment, not once per segment. The others are listed in temp.superseded, and those of build
    requests already cold join their segment's partition counts; the caller takes them out of
    `events`. The maximum of each kind over all cold rows is the maximum of the segments' own, so
    it is among the candidates. `candidates` None: temp.pin_candidates holds their rows already
    (a first build gathers them segment by segment: PIN_CANDIDATES_OF_FROZEN)."""
    # The candidates' rows read once: the picks below scan them six times.
    if candidates is not None:
        connection.execute("DELETE FROM temp.pin_candidates")
        connection.execute(
            f"INSERT OR IGNORE INTO temp.pin_candidates {_PIN_CANDIDATE_COLUMNS} FROM ({candidates}) AS p"
            " JOIN main.events AS e USING (event_id)"
        )
    connection.execute("DELETE FROM temp.pinned")
    pin_latest(connection, "temp.pin_candidates")
    connection.execute("DELETE FROM temp.superseded")
    connection.execute(
        "INSERT INTO temp.superseded SELECT event_id FROM temp.pin_candidates"
        " WHERE event_id NOT IN (SELECT event_id FROM temp.pinned)"
    )
    connection.execute(
        "INSERT INTO main.cold_partition_events (partition_ref, segment, count)"
        " SELECT p.partition_ref, c.segment, COUNT(*) FROM temp.pin_candidates AS p"
        " JOIN main.cold_build_requests AS c ON c.build_request_id = p.build_request_id"
        " WHERE p.event_id IN (SELECT event_id FROM temp.superseded) GROUP BY p.partition_ref, c.segment"
        " ON CONFLICT (partition_ref, segment) DO UPDATE SET count = count + excluded.count"
    )


def _take_off_counts(connection: sqlite3.Connection, segment: int, rows: str) -> None:
    """Take `rows` (a FROM ... WHERE of thawing rows `t`), now in `events`, off `segment`'s counts.
    Counted once per partition, then joined: a subquery per partition would scan every thawing
    row for each (a whole segment thawed: minutes)."""
    connection.execute(
        "UPDATE main.cold_partition_events AS c SET count = c.count - n.k FROM"
        f" (SELECT t.partition_ref, COUNT(*) AS k FROM {rows} GROUP BY t.partition_ref) AS n"
        " WHERE c.segment = ? AND c.partition_ref = n.partition_ref",
        (segment,),
    )


def _repin(connection: sqlite3.Connection, folder: str, refs: Collection[str]) -> None:
    """After build requests came back hot: the pins of `refs` may have been their rows, so the
    latest of each kind among the still-cold rows of each ref, in every segment that holds it,
    joins `events` (a partition event's payload empty, as evict.py pins it) and leaves that
    segment's counts. A later deletion of the hot rows then leaves each partition's cold maximum
    in `events`. The rows are read without their payloads, which only a picked delegation or
    invalidation needs (read again for those): a large partition's rows in every segment are
    read here."""
    connection.execute("DELETE FROM temp.repinning")
    segments = connection.execute(
        "SELECT DISTINCT segment FROM main.cold_partition_events"
        " WHERE partition_ref IN (SELECT value FROM json_each(?))",
        (json.dumps(sorted(refs)),),
    ).fetchall()
    for (segment,) in segments:
        table = read_segment_rows(folder, segment, "key", refs, by_partition=True, columns=_UNLESS_PAYLOAD)
        carried = table.filter(pc.equal(table.column("key"), table.column("partition_ref")))
        cold = still_cold_in(connection, segment, pc.unique(carried.column("build_request_id")).to_pylist())
        carried = carried.filter(pc.is_in(carried.column("build_request_id"), value_set=strings(cold)))
        payloads = ["{}"] * carried.num_rows  # read for the picks that need one, below
        values = [payloads if name == "payload" else carried.column(name).to_pylist() for name in ROW_COLUMNS]
        connection.executemany(
            f"INSERT OR IGNORE INTO temp.repinning VALUES (?, {', '.join('?' * 8)})",
            zip([segment] * carried.num_rows, *values, strict=True),
        )
    connection.execute("DELETE FROM temp.pinned")
    pin_latest(connection, "temp.repinning")
    new = (
        "temp.repinning AS t WHERE t.event_id IN (SELECT event_id FROM temp.pinned)"
        " AND NOT EXISTS (SELECT 1 FROM main.events AS e WHERE e.event_id = t.event_id)"
    )
    for segment, ref, event_id in connection.execute(  # payloads the refresh SQL reads
        f"SELECT t.segment, t.partition_ref, t.event_id FROM {new} AND t.event_type <> 'partition_event'"
    ).fetchall():
        table = read_segment_rows(folder, segment, "key", [ref], by_partition=True)
        payload = table.filter(pc.equal(table.column("event_id"), event_id)).column("payload")[0].as_py()
        connection.execute("UPDATE temp.repinning SET payload = ? WHERE event_id = ?", (payload, event_id))
    for (segment,) in segments:
        _take_off_counts(connection, segment, f"{new} AND t.segment = {int(segment)}")
    slim = "CASE t.event_type WHEN 'partition_event' THEN '{}' ELSE t.payload END"
    columns = ", ".join(slim if name == "payload" else f"t.{name}" for name in ROW_COLUMNS)
    connection.execute(f"INSERT INTO main.events ({_COLUMNS}) SELECT {columns} FROM {new}")
    connection.execute("DELETE FROM temp.repinning")


def thaw(connection: sqlite3.Connection, index_folder: str, build_request_ids: Iterable[str]) -> int:
    """Bring cold build requests back into `events` (their segment marked stale); returns how many
    were cold. Inside the caller's write transaction."""
    by_segment = cold_by_segment(connection, build_request_ids)
    if not by_segment:
        return 0
    work_tables(connection)
    folder = os.path.join(index_folder, SEGMENTS_FOLDER)
    thawed = 0
    pinned: set[str] = set()
    for segment, (ids, groups) in by_segment.items():
        pinned.update(  # a cold build request's rows in `events` are pins
            row[0]
            for row in connection.execute(
                "SELECT DISTINCT partition_ref FROM main.events WHERE partition_ref IS NOT NULL"
                " AND build_request_id IN (SELECT value FROM json_each(?))",
                (json.dumps(ids),),
            )
        )
        table = read_segment_rows(folder, segment, "build_request_id", ids, groups=groups)
        expected = sum(_event_counts(connection, ids))
        if table.num_rows != expected:  # never lose a row: read them all
            table = read_segment_rows(folder, segment, "build_request_id", ids)
        rows = list(zip(*(table.column(name).to_pylist() for name in ROW_COLUMNS), strict=True))
        connection.execute("DELETE FROM temp.thawing")
        connection.executemany(f"INSERT INTO temp.thawing VALUES ({', '.join('?' * 8)})", rows)
        new = "temp.thawing AS t WHERE NOT EXISTS (SELECT 1 FROM main.events AS e WHERE e.event_id = t.event_id)"
        _take_off_counts(connection, segment, new)
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
    if pinned:
        _repin(connection, folder, pinned)
    return thawed


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
        table = table.filter(pc.is_in(table.column("event_id"), value_set=strings(cold)))
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
    "PIN_CANDIDATES_OF_FROZEN",
    "JOB_RUN_EVENT_TYPES",
    "cold_build_requests_among",
    "cold_build_requests_holding",
    "cold_build_requests_matching",
    "job_runs_of",
    "keep_latest_pins",
    "pin_latest",
    "pin_latest_of",
    "thaw",
    "thaw_job_runs",
    "work_tables",
]
