"""The SQLite event log's tables and SQL: the `events` table with its lookup indexes, the three
projection tables of EVENTS.md, the statements that recompute a projection's rows for the keys
an append touched, and the read queries. `sqlite_backend.py` runs them.
"""

from __future__ import annotations

from collections.abc import Iterable

from databuild_assets.events.enums import (
    ACTIVE_PARTITION_STATUSES,
    TERMINAL_BUILD_REQUEST_STATUSES,
    BuildRequestStatus,
    JobStatus,
    PartitionStatus,
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


def select_listed_partitions(row: str, source: str = "") -> str:
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
EVENT_INDEXES = {
    "events_in_order": "CREATE INDEX IF NOT EXISTS events_in_order ON events (timestamp, event_id)",
    "events_by_type": "CREATE INDEX IF NOT EXISTS events_by_type ON events (event_type, timestamp, event_id)",
    "events_by_build_request": """CREATE INDEX IF NOT EXISTS events_by_build_request
        ON events (build_request_id, event_type, timestamp, event_id)""",
    "events_by_partition": """CREATE INDEX IF NOT EXISTS events_by_partition
        ON events (partition_ref, event_type, timestamp, event_id) WHERE partition_ref IS NOT NULL""",
    "events_by_job_run": """CREATE INDEX IF NOT EXISTS events_by_job_run
        ON events (job_run_id, event_type, timestamp, event_id) WHERE job_run_id IS NOT NULL""",
}

EVENT_INDEXES_DDL = ";\n".join(EVENT_INDEXES.values())

# Keeps event_listed_partitions in step with `events`. It fires only for rows actually inserted,
# not for duplicates that INSERT OR IGNORE skips.
LIST_PARTITIONS_TRIGGER = f"""
CREATE TRIGGER IF NOT EXISTS events_list_partitions
AFTER INSERT ON events
WHEN NEW.event_type IN ('build_request_event', 'job_event')
BEGIN
    INSERT OR IGNORE INTO event_listed_partitions (partition_ref, timestamp, event_id)
    {select_listed_partitions("NEW")};
END"""

# One row per event. `payload` is the JSON object of the event_type's payload with every field
# present; the columns after it are copied out of it for the lookups below.
EVENTS_TABLE = """CREATE TABLE IF NOT EXISTS events (
    event_id         TEXT    NOT NULL PRIMARY KEY,
    timestamp        INTEGER NOT NULL,
    build_request_id TEXT    NOT NULL,
    event_type       TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    partition_ref    TEXT,     -- partition_event, delegation_event, partition_invalidation_event
    job_run_id       TEXT,     -- partition_event, job_event, task_cancel_event
    status_code      INTEGER   -- build_request_event, partition_event, job_event
)"""

SCHEMA = f"""
{EVENTS_TABLE};
{EVENT_INDEXES_DDL};

-- The partition_refs an event lists rather than carries: build_request_event.requested_partitions
-- and job_event.target_partitions, one row per (ref, event), for get_partition_events.
CREATE TABLE IF NOT EXISTS event_listed_partitions (
    partition_ref TEXT    NOT NULL,
    timestamp     INTEGER NOT NULL,
    event_id      TEXT    NOT NULL,
    PRIMARY KEY (partition_ref, timestamp, event_id)
) WITHOUT ROWID;
{LIST_PARTITIONS_TRIGGER};

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
-- computed on read, for the page asked for. WITHOUT ROWID: keyed by its id alone, with no second
-- index of the ids (a log written before keeps its rowid table: the same rows, the same SQL).
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
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS build_requests_by_received ON build_requests (received_at DESC, build_request_id);
CREATE INDEX IF NOT EXISTS build_requests_by_status
    ON build_requests (status_code, received_at DESC, build_request_id);
"""

# The keys an append touched, per connection; their projection rows are recomputed.
DIRTY_TABLES = """
CREATE TEMP TABLE IF NOT EXISTS dirty_partition_refs (partition_ref TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS dirty_job_runs (job_run_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS dirty_build_requests (build_request_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

INSERT_EVENT = """
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

REFRESHES = (
    ("dirty_partition_refs", "partition_ref", "partition_state", _REFRESH_PARTITION_STATE),
    ("dirty_job_runs", "job_run_id", "job_runs", _REFRESH_JOB_RUNS),
    ("dirty_build_requests", "build_request_id", "build_requests", _REFRESH_BUILD_REQUESTS),
)

# ---------------------------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------------------------

EVENT_COLUMNS_SQL = "event_id, timestamp, build_request_id, event_type, payload"
IN_ORDER = "ORDER BY timestamp, event_id"

BUILD_REQUEST_EVENTS = (
    f"SELECT {EVENT_COLUMNS_SQL} FROM events"
    " WHERE build_request_id = :build_request_id AND (:since_ns IS NULL OR timestamp > :since_ns)"
    f" {IN_ORDER}"
)

PARTITION_EVENTS = f"""
SELECT {EVENT_COLUMNS_SQL} FROM events
WHERE event_id IN (
    SELECT event_id FROM events WHERE partition_ref = :partition_ref
    UNION ALL
    SELECT event_id FROM event_listed_partitions WHERE partition_ref = :partition_ref
)
AND (:since_ns IS NULL OR timestamp > :since_ns)
{IN_ORDER}
"""

ACTIVE_BUILDS_FOR_PARTITION = f"""
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
PARTITION_SUMMARY_FIELDS = (
    "partition_ref", "status_code", "is_available", "invalidated", "updated_at", "last_event_id",
    "last_build_request_id", "last_job_run_id", "last_available_at", "last_available_build_request_id",
    "delegated_to_build_request_id", "invalidation_reason", "event_count",
)  # fmt: skip
BUILD_REQUEST_FIELDS = (
    "build_request_id", "status_code", "cancel_reason", "requested_partitions", "received_at",
    "started_at", "ended_at", "updated_at", "event_count",
)  # fmt: skip

# Per build request of a page: its partitions, by the status of its own latest event for each.
PARTITION_COUNTS_OF_BUILD_REQUESTS = """
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

JOB_RUN_COUNTS_OF_BUILD_REQUESTS = """
SELECT build_request_id, status_code, COUNT(*)
FROM job_runs
WHERE build_request_id IN (SELECT value FROM json_each(?))
GROUP BY build_request_id, status_code
"""
