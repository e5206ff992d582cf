"""The SQLite backend of the Build Event Log: the reference implementation of `BuildEventLog`.

Events live in one `events` table (payload as JSON, plus the columns that lookups key on). The
three projections of EVENTS.md (partition_state, job_runs, build_requests) are kept as tables,
recomputed in the same transaction for every key an append touches, so reads are index lookups.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from databuild_assets.events.enums import (
    ACTIVE_PARTITION_STATUSES,
    TERMINAL_BUILD_REQUEST_STATUSES,
    BuildRequestStatus,
    JobStatus,
    PartitionStatus,
)
from databuild_assets.events.schema import EVENT_COLUMNS, PAYLOADS
from databuild_assets.events.validation import require_valid
from databuild_assets.log.interface import (
    ActivitySummary,
    AppendResult,
    BuildEventLog,
    BuildRequestSummary,
    EventFilter,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
    check_page,
    decode_cursor,
    encode_cursor,
    status_counts,
)

# Bumped whenever the tables below change; kept in PRAGMA user_version.
SQLITE_SCHEMA_VERSION = 1


def _codes(statuses: Iterable[int]) -> str:
    return ", ".join(str(int(code)) for code in sorted(statuses))


_AVAILABLE = int(PartitionStatus.PARTITION_AVAILABLE)
_ACTIVE_PARTITION = _codes(ACTIVE_PARTITION_STATUSES)
_EXECUTING = int(BuildRequestStatus.BUILD_REQUEST_EXECUTING)
_BUILD_CANCELLED = int(BuildRequestStatus.BUILD_REQUEST_CANCELLED)
_TERMINAL_BUILD = _codes(TERMINAL_BUILD_REQUEST_STATUSES)
_JOB_CANCELLED = int(JobStatus.JOB_CANCELLED)

# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------

def _select_listed_partitions(row: str, source: str = "") -> str:
    """SELECT (partition_ref, timestamp, event_id) for the refs that the event `row` lists."""
    return f"""
    SELECT listed.value, {row}.timestamp, {row}.event_id
    FROM {source}json_each(
        {row}.payload,
        CASE {row}.event_type WHEN 'build_request_event' THEN '$.requested_partitions' ELSE '$.target_partitions' END
    ) AS listed
    WHERE {row}.event_type IN ('build_request_event', 'job_event') AND listed.type = 'text'"""


# The lookup paths into `events`, by name. A bulk load into an empty log drops them (and the
# trigger) and builds them once at the end, which is several times faster than maintaining them.
_EVENT_INDEXES = {
    "events_in_order": "CREATE INDEX IF NOT EXISTS events_in_order ON events (timestamp, event_id)",
    "events_by_type": "CREATE INDEX IF NOT EXISTS events_by_type ON events (event_type, timestamp, event_id)",
    "events_by_build_request": """CREATE INDEX IF NOT EXISTS events_by_build_request
        ON events (build_request_id, event_type, timestamp, event_id)""",
    "events_by_partition": """CREATE INDEX IF NOT EXISTS events_by_partition
        ON events (partition_ref, event_type, timestamp, event_id) WHERE partition_ref IS NOT NULL""",
    "events_by_job_run": """CREATE INDEX IF NOT EXISTS events_by_job_run
        ON events (job_run_id, event_type, timestamp, event_id) WHERE job_run_id IS NOT NULL""",
}

_EVENT_INDEXES_DDL = ";\n".join(_EVENT_INDEXES.values())

# Keeps event_listed_partitions in step with `events`. It fires only for rows actually inserted,
# not for duplicates that INSERT OR IGNORE skips.
_LIST_PARTITIONS_TRIGGER = f"""
CREATE TRIGGER IF NOT EXISTS events_list_partitions
AFTER INSERT ON events
WHEN NEW.event_type IN ('build_request_event', 'job_event')
BEGIN
    INSERT OR IGNORE INTO event_listed_partitions (partition_ref, timestamp, event_id)
    {_select_listed_partitions("NEW")};
END"""

_SCHEMA = f"""
-- One row per event. `payload` is the JSON object of the event_type's payload with every field
-- present; the columns after it are copied out of it for the lookups below.
CREATE TABLE IF NOT EXISTS events (
    event_id         TEXT    NOT NULL PRIMARY KEY,
    timestamp        INTEGER NOT NULL,
    build_request_id TEXT    NOT NULL,
    event_type       TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    partition_ref    TEXT,     -- partition_event, delegation_event, partition_invalidation_event
    job_run_id       TEXT,     -- partition_event, job_event, task_cancel_event
    status_code      INTEGER   -- build_request_event, partition_event, job_event
);
{_EVENT_INDEXES_DDL};

-- The partition_refs an event lists rather than carries: build_request_event.requested_partitions
-- and job_event.target_partitions, one row per (ref, event), for get_partition_events.
CREATE TABLE IF NOT EXISTS event_listed_partitions (
    partition_ref TEXT    NOT NULL,
    timestamp     INTEGER NOT NULL,
    event_id      TEXT    NOT NULL,
    PRIMARY KEY (partition_ref, timestamp, event_id)
) WITHOUT ROWID;
{_LIST_PARTITIONS_TRIGGER};

-- Projection partition_state: one row per partition_ref seen in a partition, delegation or
-- partition_invalidation event. status_* describe its latest partition_event (NULL if none).
CREATE TABLE IF NOT EXISTS partition_state (
    partition_ref                   TEXT    NOT NULL PRIMARY KEY,
    status_code                     INTEGER NOT NULL,
    invalidated                     INTEGER NOT NULL,
    is_available                    INTEGER NOT NULL,
    updated_at                      INTEGER NOT NULL,
    last_event_id                   TEXT    NOT NULL,
    last_build_request_id           TEXT    NOT NULL,
    status_timestamp                INTEGER,
    status_event_id                 TEXT,
    status_build_request_id         TEXT,
    status_job_run_id               TEXT,
    last_job_run_id                 TEXT,
    last_available_at               INTEGER,
    last_available_build_request_id TEXT,
    delegated_to_build_request_id   TEXT,
    invalidation_reason             TEXT,
    event_count                     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS partition_state_by_recency ON partition_state (updated_at DESC, partition_ref);
CREATE INDEX IF NOT EXISTS partition_state_by_status ON partition_state (status_code, is_available, invalidated);

-- Projection job_runs (the columns the queries need): one row per job_run_id seen in a job_event
-- or task_cancel_event; build_request_id is that of its first such event.
CREATE TABLE IF NOT EXISTS job_runs (
    job_run_id       TEXT    NOT NULL PRIMARY KEY,
    build_request_id TEXT    NOT NULL,
    status_code      INTEGER NOT NULL,
    cancel_reason    TEXT
);
CREATE INDEX IF NOT EXISTS job_runs_by_build_request ON job_runs (build_request_id, status_code);
CREATE INDEX IF NOT EXISTS job_runs_by_status ON job_runs (status_code);

-- Projection build_requests: one row per build_request_id. Its partition and job run counts are
-- computed on read, for the page asked for.
CREATE TABLE IF NOT EXISTS build_requests (
    build_request_id     TEXT    NOT NULL PRIMARY KEY,
    status_code          INTEGER NOT NULL,
    cancel_reason        TEXT,
    requested_partitions TEXT    NOT NULL,  -- JSON array
    received_at          INTEGER NOT NULL,
    started_at           INTEGER,
    ended_at             INTEGER,
    updated_at           INTEGER NOT NULL,
    event_count          INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS build_requests_by_received ON build_requests (received_at DESC, build_request_id);
CREATE INDEX IF NOT EXISTS build_requests_by_status
    ON build_requests (status_code, received_at DESC, build_request_id);
"""

# The keys an append touched, per connection; their projection rows are recomputed.
_DIRTY_TABLES = """
CREATE TEMP TABLE IF NOT EXISTS dirty_partition_refs (partition_ref TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS dirty_job_runs (job_run_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS dirty_build_requests (build_request_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

_INSERT_EVENT = """
INSERT OR IGNORE INTO events
    (event_id, timestamp, build_request_id, event_type, payload, partition_ref, job_run_id, status_code)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

# ---------------------------------------------------------------------------------------------
# Projection refreshes: each recomputes the rows of the dirty keys from all of their events, so
# an event that arrives late (with an older timestamp) lands exactly where it would have.
# ---------------------------------------------------------------------------------------------

_LATEST = "ORDER BY timestamp DESC, event_id DESC LIMIT 1"

_REFRESH_PARTITION_STATE = f"""
INSERT INTO partition_state
WITH latest AS (
    SELECT
        dirty.partition_ref,
        (SELECT COUNT(*) FROM events WHERE partition_ref = dirty.partition_ref) AS event_count,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            {_LATEST}) AS last_event_id,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            AND event_type = 'partition_event' {_LATEST}) AS status_event_id,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            AND event_type = 'partition_event' AND job_run_id IS NOT NULL {_LATEST}) AS job_run_event_id,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            AND event_type = 'partition_event' AND status_code = {_AVAILABLE} {_LATEST}) AS available_event_id,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            AND event_type = 'delegation_event' {_LATEST}) AS delegation_event_id,
        (SELECT event_id FROM events WHERE partition_ref = dirty.partition_ref
            AND event_type = 'partition_invalidation_event' {_LATEST}) AS invalidation_event_id
    FROM temp.dirty_partition_refs AS dirty
),
judged AS (
    SELECT
        latest.partition_ref,
        latest.event_count,
        last.timestamp AS updated_at,
        last.event_id AS last_event_id,
        last.build_request_id AS last_build_request_id,
        status.status_code,
        status.timestamp AS status_timestamp,
        status.event_id AS status_event_id,
        status.build_request_id AS status_build_request_id,
        status.job_run_id AS status_job_run_id,
        job_run.job_run_id AS last_job_run_id,
        available.timestamp AS last_available_at,
        available.build_request_id AS last_available_build_request_id,
        json_extract(delegation.payload, '$.delegated_to_build_request_id') AS delegated_to_build_request_id,
        invalidation.event_id IS NOT NULL AND (
            status.event_id IS NULL
            OR (invalidation.timestamp, invalidation.event_id) > (status.timestamp, status.event_id)
        ) AS invalidated,
        json_extract(invalidation.payload, '$.reason') AS invalidation_reason
    FROM latest
    JOIN events AS last ON last.event_id = latest.last_event_id
    LEFT JOIN events AS status ON status.event_id = latest.status_event_id
    LEFT JOIN events AS job_run ON job_run.event_id = latest.job_run_event_id
    LEFT JOIN events AS available ON available.event_id = latest.available_event_id
    LEFT JOIN events AS delegation ON delegation.event_id = latest.delegation_event_id
    LEFT JOIN events AS invalidation ON invalidation.event_id = latest.invalidation_event_id
)
SELECT
    partition_ref,
    COALESCE(status_code, {int(PartitionStatus.PARTITION_UNKNOWN)}),
    invalidated,
    COALESCE(status_code = {_AVAILABLE}, 0) AND NOT invalidated,
    updated_at,
    last_event_id,
    last_build_request_id,
    status_timestamp,
    status_event_id,
    status_build_request_id,
    status_job_run_id,
    last_job_run_id,
    last_available_at,
    last_available_build_request_id,
    delegated_to_build_request_id,
    CASE WHEN invalidated THEN invalidation_reason END,
    event_count
FROM judged
"""

_REFRESH_JOB_RUNS = f"""
INSERT INTO job_runs (job_run_id, build_request_id, status_code, cancel_reason)
WITH latest AS (
    SELECT
        dirty.job_run_id,
        (SELECT event_id FROM events WHERE job_run_id = dirty.job_run_id
            AND event_type IN ('job_event', 'task_cancel_event')
            ORDER BY timestamp, event_id LIMIT 1) AS first_event_id,
        (SELECT event_id FROM events WHERE job_run_id = dirty.job_run_id
            AND event_type = 'job_event' {_LATEST}) AS status_event_id,
        (SELECT event_id FROM events WHERE job_run_id = dirty.job_run_id
            AND event_type = 'task_cancel_event' {_LATEST}) AS cancel_event_id
    FROM temp.dirty_job_runs AS dirty
),
judged AS (
    SELECT
        latest.job_run_id,
        first.build_request_id,
        status.status_code,
        cancel.event_id IS NOT NULL AND (
            status.event_id IS NULL
            OR (cancel.timestamp, cancel.event_id) > (status.timestamp, status.event_id)
        ) AS cancelled,
        json_extract(cancel.payload, '$.reason') AS cancel_reason
    FROM latest
    JOIN events AS first ON first.event_id = latest.first_event_id
    LEFT JOIN events AS status ON status.event_id = latest.status_event_id
    LEFT JOIN events AS cancel ON cancel.event_id = latest.cancel_event_id
)
SELECT
    job_run_id,
    build_request_id,
    CASE WHEN cancelled THEN {_JOB_CANCELLED} ELSE status_code END,
    CASE WHEN cancelled THEN cancel_reason END
FROM judged
"""

_REFRESH_BUILD_REQUESTS = f"""
INSERT INTO build_requests
    (build_request_id, status_code, cancel_reason, requested_partitions,
     received_at, started_at, ended_at, updated_at, event_count)
WITH stats AS (
    SELECT
        build_request_id,
        MIN(timestamp) AS received_at,
        MIN(CASE WHEN event_type = 'build_request_event' AND status_code = {_EXECUTING}
            THEN timestamp END) AS started_at,
        MIN(CASE WHEN event_type = 'build_cancel_event'
                   OR (event_type = 'build_request_event' AND status_code IN ({_TERMINAL_BUILD}))
            THEN timestamp END) AS ended_at,
        MAX(timestamp) AS updated_at,
        COUNT(*) AS event_count
    FROM events
    WHERE build_request_id IN (SELECT build_request_id FROM temp.dirty_build_requests)
    GROUP BY build_request_id
),
latest AS (
    SELECT
        stats.*,
        (SELECT event_id FROM events WHERE build_request_id = stats.build_request_id
            AND event_type = 'build_request_event' {_LATEST}) AS status_event_id,
        (SELECT event_id FROM events WHERE build_request_id = stats.build_request_id
            AND event_type = 'build_request_event'
            AND json_extract(payload, '$.requested_partitions') IS NOT NULL {_LATEST}) AS requested_event_id,
        (SELECT event_id FROM events WHERE build_request_id = stats.build_request_id
            AND event_type = 'build_cancel_event' {_LATEST}) AS cancel_event_id
    FROM stats
),
judged AS (
    SELECT
        latest.*,
        status.status_code,
        json_extract(requested.payload, '$.requested_partitions') AS requested_partitions,
        cancel.event_id IS NOT NULL AND (
            status.event_id IS NULL
            OR (cancel.timestamp, cancel.event_id) > (status.timestamp, status.event_id)
        ) AS cancelled,
        json_extract(cancel.payload, '$.reason') AS cancel_reason
    FROM latest
    LEFT JOIN events AS status ON status.event_id = latest.status_event_id
    LEFT JOIN events AS requested ON requested.event_id = latest.requested_event_id
    LEFT JOIN events AS cancel ON cancel.event_id = latest.cancel_event_id
)
SELECT
    build_request_id,
    CASE WHEN cancelled THEN {_BUILD_CANCELLED}
         ELSE COALESCE(status_code, {int(BuildRequestStatus.BUILD_REQUEST_UNKNOWN)}) END,
    CASE WHEN cancelled THEN cancel_reason END,
    COALESCE(requested_partitions, '[]'),
    received_at,
    started_at,
    ended_at,
    updated_at,
    event_count
FROM judged
"""

_REFRESHES = (
    ("dirty_partition_refs", "partition_ref", "partition_state", _REFRESH_PARTITION_STATE),
    ("dirty_job_runs", "job_run_id", "job_runs", _REFRESH_JOB_RUNS),
    ("dirty_build_requests", "build_request_id", "build_requests", _REFRESH_BUILD_REQUESTS),
)

# ---------------------------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------------------------

_EVENT_COLUMNS_SQL = "event_id, timestamp, build_request_id, event_type, payload"
_IN_ORDER = "ORDER BY timestamp, event_id"

_PARTITION_EVENTS = f"""
SELECT {_EVENT_COLUMNS_SQL} FROM events
WHERE event_id IN (
    SELECT event_id FROM events WHERE partition_ref = :partition_ref
    UNION ALL
    SELECT event_id FROM event_listed_partitions WHERE partition_ref = :partition_ref
)
AND (:since_ns IS NULL OR timestamp > :since_ns)
{_IN_ORDER}
"""

_ACTIVE_BUILDS_FOR_PARTITION = f"""
WITH latest_for_ref AS (
    SELECT
        build_request_id,
        status_code,
        ROW_NUMBER() OVER (PARTITION BY build_request_id ORDER BY timestamp DESC, event_id DESC) AS recency
    FROM events
    WHERE partition_ref = ? AND event_type = 'partition_event'
)
SELECT request.build_request_id
FROM latest_for_ref AS request
WHERE request.recency = 1
  AND request.status_code IN ({_ACTIVE_PARTITION})
  AND NOT EXISTS (
      SELECT 1 FROM events
      WHERE build_request_id = request.build_request_id AND event_type = 'build_cancel_event')
  AND COALESCE(
      (SELECT status_code FROM events
       WHERE build_request_id = request.build_request_id AND event_type = 'build_request_event' {_LATEST}),
      {int(BuildRequestStatus.BUILD_REQUEST_UNKNOWN)}
  ) NOT IN ({_TERMINAL_BUILD})
ORDER BY request.build_request_id
"""

# Columns of partition_state and build_requests named like the summary fields they fill.
_PARTITION_SUMMARY_FIELDS = (
    "partition_ref", "status_code", "is_available", "invalidated", "updated_at", "last_event_id",
    "last_build_request_id", "last_job_run_id", "last_available_at", "last_available_build_request_id",
    "delegated_to_build_request_id", "invalidation_reason", "event_count",
)  # fmt: skip
_BUILD_REQUEST_FIELDS = (
    "build_request_id", "status_code", "cancel_reason", "requested_partitions", "received_at",
    "started_at", "ended_at", "updated_at", "event_count",
)  # fmt: skip

# Per build request of a page: its partitions, by the status of its own latest event for each.
_PARTITION_COUNTS_OF_BUILD_REQUESTS = """
WITH latest_per_partition AS (
    SELECT
        build_request_id,
        status_code,
        ROW_NUMBER() OVER (
            PARTITION BY build_request_id, partition_ref ORDER BY timestamp DESC, event_id DESC
        ) AS recency
    FROM events
    WHERE build_request_id IN (SELECT value FROM json_each(?)) AND event_type = 'partition_event'
)
SELECT build_request_id, status_code, COUNT(*)
FROM latest_per_partition
WHERE recency = 1
GROUP BY build_request_id, status_code
"""

_JOB_RUN_COUNTS_OF_BUILD_REQUESTS = """
SELECT build_request_id, status_code, COUNT(*)
FROM job_runs
WHERE build_request_id IN (SELECT value FROM json_each(?))
GROUP BY build_request_id, status_code
"""


def _event_from_row(row: tuple[str, int, str, str, str]) -> dict[str, Any]:
    event_id, timestamp, build_request_id, event_type, payload = row
    event: dict[str, Any] = dict.fromkeys(EVENT_COLUMNS)
    event["event_id"] = event_id
    event["timestamp"] = timestamp
    event["build_request_id"] = build_request_id
    event["event_type"] = event_type
    event[event_type] = json.loads(payload)
    return event


def _json_list(values: Iterable[str]) -> str:
    return json.dumps(list(values), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Writes
# ---------------------------------------------------------------------------------------------

_FIELD_NAMES: dict[str, tuple[str, ...]] = {
    event_type: tuple(field.name for field in fields) for event_type, fields in PAYLOADS.items()
}
_JOB_RUN_EVENT_TYPES = frozenset({"job_event", "task_cancel_event"})
# One encoder for all rows: json.dumps with options builds a new encoder on every call.
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class _DirtyKeys:
    """The partition_refs, job_run_ids and build_request_ids of the events being appended."""

    def __init__(self) -> None:
        self.partition_refs: set[str] = set()
        self.job_run_ids: set[str] = set()
        self.build_request_ids: set[str] = set()

    def by_table(self) -> dict[str, set[str]]:
        return {
            "dirty_partition_refs": self.partition_refs,
            "dirty_job_runs": self.job_run_ids,
            "dirty_build_requests": self.build_request_ids,
        }


def _event_row(event: Mapping[str, Any], dirty: _DirtyKeys) -> tuple:
    """The `events` row of a valid event, noting the projection keys it touches in `dirty`."""
    event_type = event["event_type"]
    given = event[event_type]
    payload = {name: given.get(name) for name in _FIELD_NAMES[event_type]}
    partition_ref = payload.get("partition_ref")
    job_run_id = payload.get("job_run_id")
    build_request_id = event["build_request_id"]
    if partition_ref is not None:
        dirty.partition_refs.add(partition_ref)
    if event_type in _JOB_RUN_EVENT_TYPES:
        dirty.job_run_ids.add(job_run_id)
    dirty.build_request_ids.add(build_request_id)
    return (
        event["event_id"],
        event["timestamp"],
        build_request_id,
        event_type,
        _to_json(payload),
        partition_ref,
        job_run_id,
        payload.get("status_code"),
    )


def _connect(path: str) -> sqlite3.Connection:
    """Open the log at `path`, creating its tables in a new (or empty) database file."""
    try:
        # isolation_level=None: transactions are opened explicitly (BEGIN ...), never implicitly.
        connection = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as error:
        raise ValueError(f"cannot open SQLite event log {path}: {error}") from error
    try:
        connection.execute("PRAGMA busy_timeout = 10000")
        if path != ":memory:":
            connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute("PRAGMA temp_store = MEMORY")
        if _schema_version(connection) == 0:
            with _transaction(connection):  # IMMEDIATE: of two processes creating one file, one waits
                _create_schema_if_new(connection, path)
        version = _schema_version(connection)
        if version != SQLITE_SCHEMA_VERSION:
            raise ValueError(
                f"{path}: SQLite event log schema version {version}, this code reads version "
                f"{SQLITE_SCHEMA_VERSION}; open it with the version of databuild_assets that wrote it"
            )
        connection.executescript(_DIRTY_TABLES)
    except sqlite3.Error as error:
        connection.close()
        raise ValueError(f"cannot open SQLite event log {path}: {error}") from error
    except BaseException:
        connection.close()
        raise
    return connection


def _schema_version(connection: sqlite3.Connection) -> int:
    return connection.execute("PRAGMA user_version").fetchone()[0]


def _create_schema_if_new(connection: sqlite3.Connection, path: str) -> None:
    if _schema_version(connection) != 0:
        return  # another process created it while we waited for the lock
    if connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
        raise ValueError(
            f"{path} is a SQLite database but not an event log (it has tables and no event log schema "
            "version); point the URI at a new file or an existing event log"
        )
    for statement in _statements(_SCHEMA):
        connection.execute(statement)
    connection.execute(f"PRAGMA user_version = {SQLITE_SCHEMA_VERSION}")


def _statements(script: str) -> Iterator[str]:
    """The statements of an SQL script, one by one (a trigger's body does not end its statement)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""


@contextmanager
def _transaction(connection: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    """One transaction: IMMEDIATE for writes (take the write lock up front), DEFERRED for reads
    that run several statements and must see one snapshot."""
    connection.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        if connection.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _insert_events(
    connection: sqlite3.Connection, events: Iterable[Mapping[str, Any]], validate: bool, bulk: bool = False
) -> AppendResult:
    """Insert `events` in one transaction and refresh the projections of the keys they touch.

    With `validate`, each event is validated as it streams in; an invalid one rolls everything
    back. Without, the caller has validated them all. With `bulk` and an empty log, the indexes
    of `events` are built once at the end instead of row by row.
    """
    dirty = _DirtyKeys()
    offered = 0

    def rows() -> Iterator[tuple]:
        nonlocal offered
        for index, event in enumerate(events):
            if validate:
                require_valid(event, f"events[{index}]")
            offered += 1
            yield _event_row(event, dirty)

    with _transaction(connection):
        build_indexes_after = bulk and connection.execute("SELECT NOT EXISTS (SELECT 1 FROM events)").fetchone()[0]
        if build_indexes_after:
            # DDL is transactional in SQLite: a failed load rolls this back too.
            connection.execute("DROP TRIGGER events_list_partitions")
            for name in _EVENT_INDEXES:
                connection.execute(f"DROP INDEX {name}")
        accepted = max(connection.executemany(_INSERT_EVENT, rows()).rowcount, 0)
        if build_indexes_after:
            for ddl in _EVENT_INDEXES.values():
                connection.execute(ddl)
            connection.execute(
                "INSERT OR IGNORE INTO event_listed_partitions (partition_ref, timestamp, event_id)"
                + _select_listed_partitions("event", source="events AS event, ")
            )
            connection.execute(_LIST_PARTITIONS_TRIGGER)
        if accepted:
            _refresh_projections(connection, dirty)
    return AppendResult(accepted=accepted, duplicates=offered - accepted)


def _refresh_projections(connection: sqlite3.Connection, dirty: _DirtyKeys) -> None:
    keys_by_table = dirty.by_table()
    for dirty_table, key, projection, refresh in _REFRESHES:
        keys = keys_by_table[dirty_table]
        if not keys:
            continue
        connection.execute(f"DELETE FROM temp.{dirty_table}")
        connection.executemany(f"INSERT INTO temp.{dirty_table} VALUES (?)", ((value,) for value in keys))
        connection.execute(f"DELETE FROM {projection} WHERE {key} IN (SELECT {key} FROM temp.{dirty_table})")
        connection.execute(refresh)
        connection.execute(f"DELETE FROM temp.{dirty_table}")


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


class SqliteEventLog(BuildEventLog):
    """The Build Event Log in one SQLite file (or ":memory:"), created on first open.

    One instance per thread (sqlite3's rule); several processes may share the file (WAL).

        with SqliteEventLog("/var/lib/databuild/bel.db") as log:
            log.get_latest_partition_status("data/date=2024-01-01")
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._connection = _connect(self.path)

    def __repr__(self) -> str:
        return f"SqliteEventLog({self.path!r})"

    # -- writes ---------------------------------------------------------------------------------

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        events = list(events)
        for index, event in enumerate(events):
            require_valid(event, f"events[{index}]")
        return _insert_events(self._connection, events, validate=False)

    # -- events ---------------------------------------------------------------------------------

    def _events(self, sql: str, parameters: Mapping[str, Any] | tuple = ()) -> list[dict[str, Any]]:
        return [_event_from_row(row) for row in self._connection.execute(sql, parameters)]

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events(
            f"SELECT {_EVENT_COLUMNS_SQL} FROM events"
            " WHERE build_request_id = :build_request_id AND (:since_ns IS NULL OR timestamp > :since_ns)"
            f" {_IN_ORDER}",
            {"build_request_id": build_request_id, "since_ns": since_ns},
        )

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events(_PARTITION_EVENTS, {"partition_ref": partition_ref, "since_ns": since_ns})

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._events(f"SELECT {_EVENT_COLUMNS_SQL} FROM events WHERE job_run_id = ? {_IN_ORDER}", (job_run_id,))

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        if end_ns < start_ns:
            raise ValueError(f"end_ns {end_ns} is before start_ns {start_ns}; the range is [start_ns, end_ns)")
        return self._events(
            f"SELECT {_EVENT_COLUMNS_SQL} FROM events WHERE timestamp >= ? AND timestamp < ? {_IN_ORDER}",
            (start_ns, end_ns),
        )

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        check_page(limit)
        conditions: list[str] = []
        parameters: list[Any] = []
        if since is not None:
            conditions.append("(timestamp, event_id) > (?, ?)")
            parameters.extend(decode_cursor(since))
        if filter is not None:
            if filter.event_types is not None:
                conditions.append("event_type IN (SELECT value FROM json_each(?))")
                parameters.append(_json_list(filter.event_types))
            if filter.build_request_ids is not None:
                conditions.append("build_request_id IN (SELECT value FROM json_each(?))")
                parameters.append(_json_list(filter.build_request_ids))
            if filter.job_run_ids is not None:
                conditions.append("job_run_id IN (SELECT value FROM json_each(?))")
                parameters.append(_json_list(filter.job_run_ids))
            if filter.partition_refs is not None:
                conditions.append(
                    "(partition_ref IN (SELECT value FROM json_each(?)) OR event_id IN ("
                    "SELECT event_id FROM event_listed_partitions"
                    " WHERE partition_ref IN (SELECT value FROM json_each(?))))"
                )
                parameters.extend([_json_list(filter.partition_refs)] * 2)
        where = " AND ".join(conditions) or "1"
        # One row more than asked tells whether there is another page.
        events = self._events(
            f"SELECT {_EVENT_COLUMNS_SQL} FROM events WHERE {where} {_IN_ORDER} LIMIT ?", (*parameters, limit + 1)
        )
        has_more = len(events) > limit
        events = events[:limit]
        next_cursor = encode_cursor(events[-1]["timestamp"], events[-1]["event_id"]) if events else since
        return EventPage(events=events, next_cursor=next_cursor, has_more=has_more)

    # -- projections ----------------------------------------------------------------------------

    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        row = self._connection.execute(
            "SELECT status_code, status_timestamp, status_event_id, status_build_request_id, status_job_run_id,"
            " invalidated, is_available"
            " FROM partition_state WHERE partition_ref = ? AND status_event_id IS NOT NULL",
            (partition_ref,),
        ).fetchone()
        if row is None:
            return None
        status_code, timestamp, event_id, build_request_id, job_run_id, invalidated, is_available = row
        return PartitionStatusInfo(
            partition_ref=partition_ref,
            status_code=status_code,
            status_name=PartitionStatus(status_code).name,
            timestamp=timestamp,
            event_id=event_id,
            build_request_id=build_request_id,
            job_run_id=job_run_id,
            invalidated=bool(invalidated),
            is_available=bool(is_available),
        )

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        return [row[0] for row in self._connection.execute(_ACTIVE_BUILDS_FOR_PARTITION, (partition_ref,))]

    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        row = self._connection.execute(
            "SELECT status_build_request_id FROM partition_state WHERE partition_ref = ? AND is_available",
            (partition_ref,),
        ).fetchone()
        return row[0] if row else None

    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        check_page(limit, offset)
        where, parameters = "", []
        if status is not None:
            where = "WHERE status_code = ?"
            parameters.append(int(BuildRequestStatus(status)))
        with _transaction(self._connection, "DEFERRED"):
            rows = self._connection.execute(
                f"SELECT {', '.join(_BUILD_REQUEST_FIELDS)} FROM build_requests {where}"
                " ORDER BY received_at DESC, build_request_id LIMIT ? OFFSET ?",
                (*parameters, limit, offset),
            ).fetchall()
            page_ids = _json_list(row[0] for row in rows)
            partition_counts = self._counts_by_build_request(_PARTITION_COUNTS_OF_BUILD_REQUESTS, page_ids)
            job_run_counts = self._counts_by_build_request(_JOB_RUN_COUNTS_OF_BUILD_REQUESTS, page_ids)
        summaries = []
        for row in rows:
            fields = dict(zip(_BUILD_REQUEST_FIELDS, row))
            build_request_id, ended_at = fields["build_request_id"], fields["ended_at"]
            fields.update(
                status_name=BuildRequestStatus(fields["status_code"]).name,
                requested_partitions=tuple(json.loads(fields["requested_partitions"])),
                duration_ns=None if ended_at is None else ended_at - fields["received_at"],
                partition_counts=status_counts(PartitionStatus, partition_counts.get(build_request_id, {})),
                job_run_counts=status_counts(JobStatus, job_run_counts.get(build_request_id, {})),
            )
            summaries.append(BuildRequestSummary(**fields))
        return summaries

    def _counts_by_build_request(self, sql: str, ids_json: str) -> dict[str, dict[int, int]]:
        counts: dict[str, dict[int, int]] = {}
        for build_request_id, status_code, count in self._connection.execute(sql, (ids_json,)):
            counts.setdefault(build_request_id, {})[status_code] = count
        return counts

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        check_page(limit, offset)
        rows = self._connection.execute(
            f"SELECT {', '.join(_PARTITION_SUMMARY_FIELDS)} FROM partition_state"
            " ORDER BY updated_at DESC, partition_ref LIMIT ? OFFSET ?",
            (limit, offset),
        ).fetchall()
        summaries = []
        for row in rows:
            fields = dict(zip(_PARTITION_SUMMARY_FIELDS, row))
            fields.update(
                status_name=PartitionStatus(fields["status_code"]).name,
                is_available=bool(fields["is_available"]),
                invalidated=bool(fields["invalidated"]),
            )
            summaries.append(PartitionSummary(**fields))
        return summaries

    def get_activity_summary(self) -> ActivitySummary:
        connection = self._connection
        with _transaction(connection, "DEFERRED"):
            total_events = connection.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            build_requests = dict(connection.execute("SELECT status_code, COUNT(*) FROM build_requests GROUP BY 1"))
            partitions = dict(connection.execute("SELECT status_code, COUNT(*) FROM partition_state GROUP BY 1"))
            job_runs = dict(connection.execute("SELECT status_code, COUNT(*) FROM job_runs GROUP BY 1"))
            available, invalidated = connection.execute(
                "SELECT COALESCE(SUM(is_available), 0), COALESCE(SUM(invalidated), 0) FROM partition_state"
            ).fetchone()
        terminal = {int(code) for code in TERMINAL_BUILD_REQUEST_STATUSES}
        return ActivitySummary(
            total_events=total_events,
            total_build_requests=sum(build_requests.values()),
            total_partitions=sum(partitions.values()),
            total_job_runs=sum(job_runs.values()),
            active_builds=sum(count for code, count in build_requests.items() if code not in terminal),
            available_partitions=available,
            invalidated_partitions=invalidated,
            build_requests_by_status=status_counts(BuildRequestStatus, build_requests),
            partitions_by_status=status_counts(PartitionStatus, partitions),
            job_runs_by_status=status_counts(JobStatus, job_runs),
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


def load_events(path: str | os.PathLike[str], events: Iterable[Mapping[str, Any]]) -> AppendResult:
    """Bulk-load `events` (any iterable, e.g. a generator of 1,000,000) into the SQLite log at
    `path` in one transaction: each event is validated as it streams in, an invalid one rolls
    the whole load back (InvalidEventError naming its index), duplicates are skipped and counted.

        load_events("/tmp/bel.db", generate_events(seed=1))  # AppendResult(accepted=..., duplicates=0)
    """
    with SqliteEventLog(path) as log:
        connection = log._connection
        connection.execute("PRAGMA cache_size = -262144")  # 256 MiB: index inserts stay in memory
        return _insert_events(connection, events, validate=True, bulk=True)
