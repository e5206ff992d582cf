"""An in-memory SQLite copy of the visible event log, for a query process that follows a lake.

`EventLogReplica` is the SQLite reference backend on a private in-memory database, so every
read answers with the reference's own SQL and indexes. It is fed events as Arrow tables (the
raw log's Parquet files), and it mirrors the raw log exactly: `events` holds the rows no
tombstone matches, `temp.hidden_event_ids` the ids of the rows one does (kept so that an
append deduplicates against the whole log, as the Spark writer does). Nothing is on disk.

    replica = EventLogReplica()
    replica.add(event_rows(arrow_table_of_events), hidden_by={"partition_ref": {"data/users/id=42"}})
    replica.get_latest_partition_status("data/users/id=41")
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import duckdb
import pyarrow as pa

from databuild_assets.events.erasure_rule import ARRAY_FIELDS, JSON_TEXT_FIELDS, SCALAR_FIELDS, matches
from databuild_assets.events.schema import EVENT_COLUMNS, PAYLOADS
from databuild_assets.log.sqlite_backend import (
    SqliteEventLog,
    build_event_indexes,
    drop_event_indexes,
    event_row,
    insert_events,
    refresh_dirty_projections,
    transaction,
)

_ROW_COLUMNS = "event_id, timestamp, build_request_id, event_type, payload, partition_ref, job_run_id, status_code"

_REPLICA_TABLES = """
CREATE TEMP TABLE IF NOT EXISTS staged_events (
    event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL,
    event_type TEXT NOT NULL, payload TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
CREATE TEMP TABLE IF NOT EXISTS hidden_event_ids (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TEMP TABLE IF NOT EXISTS leaving (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

# The `events` row of each event (sqlite_backend's `_event_row`, computed by DuckDB over Arrow):
# the payload as JSON with every field of its struct, and the columns the lookups key on.
_PAYLOAD_JSON = " ".join(f"WHEN '{name}' THEN to_json({name})" for name in PAYLOADS)
_EVENT_ROWS_SQL = f"""
SELECT
    event_id, timestamp, build_request_id, event_type,
    CASE event_type {_PAYLOAD_JSON} END AS payload,
    CASE event_type
        WHEN 'partition_event' THEN partition_event.partition_ref
        WHEN 'delegation_event' THEN delegation_event.partition_ref
        WHEN 'partition_invalidation_event' THEN partition_invalidation_event.partition_ref
    END AS partition_ref,
    CASE event_type
        WHEN 'partition_event' THEN partition_event.job_run_id
        WHEN 'job_event' THEN job_event.job_run_id
        WHEN 'task_cancel_event' THEN task_cancel_event.job_run_id
    END AS job_run_id,
    CASE event_type
        WHEN 'build_request_event' THEN build_request_event.status_code
        WHEN 'partition_event' THEN partition_event.status_code
        WHEN 'job_event' THEN job_event.status_code
    END AS status_code
FROM events
"""

# The keys whose projection rows an event touches, as sqlite_backend's `_DirtyKeys` notes them.
_MARK_DIRTY = (
    "INSERT OR IGNORE INTO temp.dirty_partition_refs SELECT partition_ref FROM {rows} WHERE partition_ref IS NOT NULL",
    "INSERT OR IGNORE INTO temp.dirty_job_runs SELECT job_run_id FROM {rows}"
    " WHERE event_type IN ('job_event', 'task_cancel_event') AND job_run_id IS NOT NULL",
    "INSERT OR IGNORE INTO temp.dirty_build_requests SELECT build_request_id FROM {rows}",
)


# Below this many rows, converting in Python beats starting a DuckDB query.
_VECTORIZED_FROM_ROWS = 5_000


def event_rows(events: pa.Table) -> list[tuple]:
    """The `events` rows of an Arrow table of events (columns of the event schema)."""
    events = events.select(list(EVENT_COLUMNS))
    if events.num_rows < _VECTORIZED_FROM_ROWS:
        return [event_row(event) for event in events.to_pylist()]
    connection = duckdb.connect()
    try:
        connection.register("events", events)
        rows = connection.sql(_EVENT_ROWS_SQL).to_arrow_table()
    finally:
        connection.close()
    return list(zip(*(column.to_pylist() for column in rows.columns), strict=True))


def _json_path_value(path: str) -> str:
    """SQL for a rule field ("payload.field" or a core column) of the event row aliased `e`."""
    payload, dot, field = path.partition(".")
    if not dot:
        return f"e.{path}"
    return f"(CASE WHEN e.event_type = '{payload}' THEN json_extract(e.payload, '$.{field}') END)"


def tombstone_rule_sql(values_by_key: Mapping[str, Collection[str]]) -> tuple[str, list[str]]:
    """The tombstone rule (events/erasure_rule.py) as an SQL condition on an `events` row
    aliased `e`, with its parameters: true for a row that any of the values matches."""
    conditions: list[str] = []
    parameters: list[str] = []
    for key, values in values_by_key.items():
        values = sorted(values)
        if not values:
            continue
        listed = f"({', '.join('?' * len(values))})"
        for path in SCALAR_FIELDS[key]:
            conditions.append(f"{_json_path_value(path)} IN {listed}")
            parameters += values
        for path in ARRAY_FIELDS.get(key, ()):
            payload, _, field = path.partition(".")
            conditions.append(
                f"(e.event_type = '{payload}' AND EXISTS "
                f"(SELECT 1 FROM json_each(e.payload, '$.{field}') WHERE value IN {listed}))"
            )
            parameters += values
        for path in JSON_TEXT_FIELDS.get(key, ()):
            for value in values:
                conditions.append(f"COALESCE(instr({_json_path_value(path)}, ?), 0) > 0")
                parameters.append(json.dumps(value))
    return (" OR ".join(conditions) or "0"), parameters


class EventLogReplica(SqliteEventLog):
    """The SQLite reference backend in memory, fed from a Delta raw log: see the module doc.

    Its reads are `SqliteEventLog`'s; `add`, `hide` and `remove` change it. One per thread.
    """

    def __init__(self) -> None:
        super().__init__(":memory:")
        self._connection.executescript(_REPLICA_TABLES)

    def __repr__(self) -> str:
        return "EventLogReplica()"

    def add(self, rows: list[tuple], hidden_by: Mapping[str, Collection[str]] | None = None) -> int:
        """Store the events of `rows` (`events` rows: `event_rows`, `event_row`) not stored yet
        (visible or hidden; the first of an event_id wins), those that `hidden_by` (tombstone
        values by key) matches as hidden. Returns how many became visible."""
        if not rows:
            return 0
        connection = self._connection
        rule, parameters = tombstone_rule_sql(hidden_by or {})
        insert = f"VALUES ({', '.join('?' * 8)})"
        with transaction(connection):
            if connection.execute("SELECT NOT EXISTS (SELECT 1 FROM main.events)").fetchone()[0]:
                # An empty replica (the first load): straight into `events`, its indexes built once
                # at the end, as sqlite_backend's bulk load does.
                drop_event_indexes(connection)
                connection.executemany(f"INSERT OR IGNORE INTO main.events ({_ROW_COLUMNS}) {insert}", rows)
                connection.execute(
                    "DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM temp.hidden_event_ids)"
                )
                connection.execute(
                    f"INSERT INTO temp.leaving SELECT event_id FROM main.events AS e WHERE {rule}", parameters
                )
                connection.execute("INSERT OR IGNORE INTO temp.hidden_event_ids SELECT event_id FROM temp.leaving")
                connection.execute("DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM temp.leaving)")
                connection.execute("DELETE FROM temp.leaving")
                build_event_indexes(connection)
                added = "main.events"
            else:
                connection.executemany(f"INSERT OR IGNORE INTO temp.staged_events {insert}", rows)
                connection.execute(
                    "DELETE FROM temp.staged_events WHERE event_id IN (SELECT event_id FROM main.events)"
                    " OR event_id IN (SELECT event_id FROM temp.hidden_event_ids)"
                )
                connection.execute(
                    f"INSERT OR IGNORE INTO temp.hidden_event_ids "
                    f" SELECT event_id FROM temp.staged_events AS e WHERE {rule}",
                    parameters,
                )
                connection.execute(
                    "DELETE FROM temp.staged_events WHERE event_id IN (SELECT event_id FROM temp.hidden_event_ids)"
                )
                connection.execute(
                    f"INSERT INTO main.events ({_ROW_COLUMNS}) SELECT {_ROW_COLUMNS} FROM temp.staged_events"
                )
                added = "temp.staged_events"
            accepted = connection.execute(f"SELECT COUNT(*) FROM {added}").fetchone()[0]
            for statement in _MARK_DIRTY:
                connection.execute(statement.format(rows=added))
            connection.execute("DELETE FROM temp.staged_events")
            refresh_dirty_projections(connection)
        return accepted

    def add_events(self, events: list[dict[str, Any]], hidden_by: Mapping[str, Collection[str]]) -> None:
        """Store valid events known to be new to the log (an append this process just committed),
        those that `hidden_by` matches as hidden: the reference backend's own insert."""
        visible = [event for event in events if not matches(event, hidden_by)]
        hidden = [(event["event_id"],) for event in events if matches(event, hidden_by)]
        if hidden:
            with transaction(self._connection):
                self._connection.executemany("INSERT OR IGNORE INTO temp.hidden_event_ids VALUES (?)", hidden)
        if visible:
            insert_events(self._connection, visible, validate=False)

    def hide(self, values_by_key: Mapping[str, Collection[str]]) -> int:
        """Hide every stored event that the tombstone values match; returns how many."""
        rule, parameters = tombstone_rule_sql(values_by_key)
        with transaction(self._connection):
            self._connection.execute(
                f"INSERT OR IGNORE INTO temp.leaving SELECT event_id FROM main.events AS e WHERE {rule}", parameters
            )
            self._connection.execute("INSERT OR IGNORE INTO temp.hidden_event_ids SELECT event_id FROM temp.leaving")
            return self._drop_leaving()

    def remove(self, event_ids: Iterable[str]) -> None:
        """Forget events that left the raw log (compaction purged them): visible or hidden."""
        with transaction(self._connection):
            self._connection.executemany("INSERT OR IGNORE INTO temp.leaving VALUES (?)", ((i,) for i in event_ids))
            self._connection.execute(
                "DELETE FROM temp.hidden_event_ids WHERE event_id IN (SELECT event_id FROM temp.leaving)"
            )
            self._drop_leaving()

    def _drop_leaving(self) -> int:
        """Delete the events listed in temp.leaving and refresh the keys they touched."""
        connection = self._connection
        leaving = "(SELECT e.* FROM main.events AS e JOIN temp.leaving USING (event_id))"
        for statement in _MARK_DIRTY:
            connection.execute(statement.format(rows=leaving))
        connection.execute("DELETE FROM event_listed_partitions WHERE event_id IN (SELECT event_id FROM temp.leaving)")
        dropped = connection.execute(
            "DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM temp.leaving)"
        ).rowcount
        connection.execute("DELETE FROM temp.leaving")
        refresh_dirty_projections(connection)
        return dropped

    def known_event_ids(self, event_ids: Iterable[str]) -> set[str]:
        """Which of `event_ids` the raw log holds (visible or hidden): an append's duplicates."""
        wanted = list(dict.fromkeys(event_ids))
        known: set[str] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            known.update(
                row[0]
                for row in self._connection.execute(
                    f"SELECT event_id FROM main.events WHERE event_id IN ({marks})"
                    f" UNION SELECT event_id FROM temp.hidden_event_ids WHERE event_id IN ({marks})",
                    chunk + chunk,
                )
            )
        return known

    def stored_bytes(self) -> int:
        """The in-memory database's size: its pages, temp tables aside."""
        pages, size = (self._connection.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "page_size"))
        return pages * size


__all__ = ["EventLogReplica", "event_rows", "tombstone_rule_sql"]
