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
from databuild_assets.log.sqlite.schema import (
    ACTIVE_BUILDS_FOR_PARTITION,
    BUILD_REQUEST_EVENTS,
    BUILD_REQUEST_FIELDS,
    DIRTY_TABLES,
    EVENT_COLUMNS_SQL,
    EVENT_INDEXES,
    IN_ORDER,
    INSERT_EVENT,
    JOB_RUN_COUNTS_OF_BUILD_REQUESTS,
    LIST_PARTITIONS_TRIGGER,
    PARTITION_COUNTS_OF_BUILD_REQUESTS,
    PARTITION_EVENTS,
    PARTITION_SUMMARY_FIELDS,
    REFRESHES,
    SCHEMA,
    SQLITE_SCHEMA_VERSION,
    select_listed_partitions,
)
from databuild_assets.log.uris import EventLogNotFoundError
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.file_modes import create_new_file

msgspec_json = deferred("msgspec.json")  # a read of events only: an append or a status read never imports it


_NO_EVENT: dict[str, Any] = dict.fromkeys(EVENT_COLUMNS)


def payload_of(text: str) -> Any:
    """A stored payload's JSON, parsed by msgspec (an event read is mostly its payload's parse,
    and msgspec's costs a fraction of json's; orjson's, as quick, turns an integer past 64 bits
    into a float), or by json.loads where msgspec refuses what json accepts (an escaped lone
    surrogate, NaN, a number past a double's range): every stored payload reads as json reads it.

    payload_of('{"partition_ref": "data/a"}')   # -> {'partition_ref': 'data/a'}
    """
    try:
        return msgspec_json.decode(text)
    except ValueError:  # msgspec.DecodeError is one
        return json.loads(text)


def _event_from_row(row: tuple[str, int, str, str, str]) -> dict[str, Any]:
    event_id, timestamp, build_request_id, event_type, payload = row
    event = _NO_EVENT.copy()  # every column, in the schema's order, None
    event["event_id"] = event_id
    event["timestamp"] = timestamp
    event["build_request_id"] = build_request_id
    event["event_type"] = event_type
    event[event_type] = payload_of(payload)
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


def event_row(event: Mapping[str, Any], dirty: _DirtyKeys | None = None) -> tuple:
    """The `events` row of a valid event, noting the projection keys it touches in `dirty`."""
    event_type = event["event_type"]
    given = event[event_type]
    payload = {name: given.get(name) for name in _FIELD_NAMES[event_type]}
    partition_ref = payload.get("partition_ref")
    job_run_id = payload.get("job_run_id")
    build_request_id = event["build_request_id"]
    if dirty is not None:
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
    folder = os.path.dirname(path)
    if path != ":memory:" and folder and not os.path.isdir(folder):
        raise EventLogNotFoundError(
            f"cannot open SQLite event log {path}: its folder {folder} does not exist; create it "
            f"(mkdir -p {folder}) or fix the path"
        )
    if path not in ("", ":memory:"):  # "": SQLite's private temporary database
        _made_for_its_owner(path)
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
            with transaction(connection):  # IMMEDIATE: of two processes creating one file, one waits
                _create_schema_if_new(connection, path)
        version = _schema_version(connection)
        if version != SQLITE_SCHEMA_VERSION:
            raise ValueError(
                f"{path}: SQLite event log schema version {version}, this code reads version "
                f"{SQLITE_SCHEMA_VERSION}; open it with the version of databuild_assets that wrote it"
            )
        connection.executescript(DIRTY_TABLES)
    except sqlite3.Error as error:
        connection.close()
        raise ValueError(f"cannot open SQLite event log {path}: {error}") from error
    except BaseException:
        connection.close()
        raise
    return connection


def _made_for_its_owner(path: str) -> None:
    """A new log's file made, empty, with the project's file mode before SQLite opens it; SQLite
    gives its -wal and -shm files the database file's mode. Left to SQLite, the three followed
    the umask: 0644 under the usual 022, every local user could read the events, values not yet
    erased included (docs/security.md). An existing file, or one another process made first,
    keeps its mode."""
    try:
        os.close(create_new_file(path))
    except FileExistsError:
        pass
    except OSError as error:
        raise ValueError(f"cannot open SQLite event log {path}: {error}") from error


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
    for statement in _statements(SCHEMA):
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
def transaction(connection: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    """One transaction: IMMEDIATE for writes (take the write lock up front), DEFERRED for reads
    that run several statements and must see one snapshot. Inside a transaction already open, a
    savepoint: the block commits with the outer transaction, or rolls back alone."""
    if connection.in_transaction:
        connection.execute("SAVEPOINT nested")
        try:
            yield
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK TO nested")
                connection.execute("RELEASE nested")
            raise
        connection.execute("RELEASE nested")
        return
    connection.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        if connection.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def insert_events(
    connection: sqlite3.Connection,
    events: Iterable[Mapping[str, Any]],
    validate: bool,
    bulk: bool = False,
    refreshes: tuple = REFRESHES,
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
            yield event_row(event, dirty)

    with transaction(connection):
        build_indexes_after = bulk and connection.execute("SELECT NOT EXISTS (SELECT 1 FROM events)").fetchone()[0]
        if build_indexes_after:
            drop_event_indexes(connection)
        accepted = max(connection.executemany(INSERT_EVENT, rows()).rowcount, 0)
        if build_indexes_after:
            build_event_indexes(connection)
        if accepted:
            _refresh_projections(connection, dirty, refreshes)
    return AppendResult(accepted=accepted, duplicates=offered - accepted)


def drop_event_indexes(connection: sqlite3.Connection) -> None:
    """Drop the lookup indexes of `events` and the trigger that fills event_listed_partitions,
    before loading many events into an empty log (DDL is transactional in SQLite: a failed load
    rolls this back too)."""
    connection.execute("DROP TRIGGER events_list_partitions")
    for name in EVENT_INDEXES:
        connection.execute(f"DROP INDEX {name}")


def build_event_indexes(connection: sqlite3.Connection) -> None:
    """Build what `drop_event_indexes` dropped, once, over every event now stored."""
    for ddl in EVENT_INDEXES.values():
        connection.execute(ddl)
    connection.execute(
        "INSERT OR IGNORE INTO event_listed_partitions (partition_ref, timestamp, event_id)"
        + select_listed_partitions("event", source="events AS event, ")
    )
    connection.execute(LIST_PARTITIONS_TRIGGER)


def _refresh_projections(connection: sqlite3.Connection, dirty: _DirtyKeys, refreshes: tuple = REFRESHES) -> None:
    for dirty_table, keys in dirty.by_table().items():
        connection.executemany(f"INSERT OR IGNORE INTO temp.{dirty_table} VALUES (?)", ((value,) for value in keys))
    refresh_dirty_projections(connection, refreshes)


def refresh_dirty_projections(connection: sqlite3.Connection, refreshes: tuple = REFRESHES) -> None:
    """Recompute the projection rows of every key in the temp.dirty_* tables from the events
    now stored (a key left with no events loses its row), then empty those tables. `refreshes`:
    the statements (the serving index adds its cold events' counts, log/serving/index.py)."""
    for dirty_table, key, projection, refresh in refreshes:
        if connection.execute(f"SELECT NOT EXISTS (SELECT 1 FROM temp.{dirty_table})").fetchone()[0]:
            continue
        connection.execute(f"DELETE FROM {projection} WHERE {key} IN (SELECT {key} FROM temp.{dirty_table})")
        connection.execute(refresh)
        connection.execute(f"DELETE FROM temp.{dirty_table}")


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


def page_conditions(since: str | None, filter: EventFilter | None) -> tuple[str, list[Any]]:
    """The WHERE clause over `events` (and its parameters) of the rows `list_events` pages
    through after the cursor `since` that `filter` selects; the serving index's cold reads select
    the same rows' keys first.

        where, parameters = page_conditions(None, EventFilter(event_types=["job_event"]))
    """
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
    return " AND ".join(conditions) or "1", parameters


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
        return insert_events(self._connection, events, validate=False)

    # -- events ---------------------------------------------------------------------------------

    def _events(self, sql: str, parameters: Mapping[str, Any] | tuple = ()) -> list[dict[str, Any]]:
        return [_event_from_row(row) for row in self._connection.execute(sql, parameters)]

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events(BUILD_REQUEST_EVENTS, {"build_request_id": build_request_id, "since_ns": since_ns})

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events(PARTITION_EVENTS, {"partition_ref": partition_ref, "since_ns": since_ns})

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._events(f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE job_run_id = ? {IN_ORDER}", (job_run_id,))

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        if end_ns < start_ns:
            raise ValueError(f"end_ns {end_ns} is before start_ns {start_ns}; the range is [start_ns, end_ns)")
        return self._events(
            f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE timestamp >= ? AND timestamp < ? {IN_ORDER}",
            (start_ns, end_ns),
        )

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        check_page(limit)
        where, parameters = page_conditions(since, filter)
        # One row more than asked tells whether there is another page.
        events = self._events(
            f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE {where} {IN_ORDER} LIMIT ?", (*parameters, limit + 1)
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
        return [row[0] for row in self._connection.execute(ACTIVE_BUILDS_FOR_PARTITION, (partition_ref,))]

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
        with transaction(self._connection, "DEFERRED"):
            rows = self._connection.execute(
                f"SELECT {', '.join(BUILD_REQUEST_FIELDS)} FROM build_requests {where}"
                " ORDER BY received_at DESC, build_request_id LIMIT ? OFFSET ?",
                (*parameters, limit, offset),
            ).fetchall()
            page_ids = _json_list(row[0] for row in rows)
            partition_counts = self._counts_by_build_request(PARTITION_COUNTS_OF_BUILD_REQUESTS, page_ids)
            job_run_counts = self._counts_by_build_request(JOB_RUN_COUNTS_OF_BUILD_REQUESTS, page_ids)
        summaries = []
        for row in rows:
            fields = dict(zip(BUILD_REQUEST_FIELDS, row, strict=True))
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

    def _total_events(self) -> int:
        return self._connection.execute("SELECT COUNT(*) FROM events").fetchone()[0]

    def _counts_by_build_request(self, sql: str, ids_json: str) -> dict[str, dict[int, int]]:
        counts: dict[str, dict[int, int]] = {}
        for build_request_id, status_code, count in self._connection.execute(sql, (ids_json,)):
            counts.setdefault(build_request_id, {})[status_code] = count
        return counts

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        check_page(limit, offset)
        rows = self._connection.execute(
            f"SELECT {', '.join(PARTITION_SUMMARY_FIELDS)} FROM partition_state"
            " ORDER BY updated_at DESC, partition_ref LIMIT ? OFFSET ?",
            (limit, offset),
        ).fetchall()
        summaries = []
        for row in rows:
            fields = dict(zip(PARTITION_SUMMARY_FIELDS, row, strict=True))
            fields.update(
                status_name=PartitionStatus(fields["status_code"]).name,
                is_available=bool(fields["is_available"]),
                invalidated=bool(fields["invalidated"]),
            )
            summaries.append(PartitionSummary(**fields))
        return summaries

    def get_activity_summary(self) -> ActivitySummary:
        connection = self._connection
        with transaction(connection, "DEFERRED"):
            total_events = self._total_events()
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
        return insert_events(connection, events, validate=True, bulk=True)
