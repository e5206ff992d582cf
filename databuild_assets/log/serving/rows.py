"""The serving index's `events` rows of an Arrow table of events: the SQLite backend's `event_row`
(the payload as JSON with every field of its struct, and the columns the lookups key on),
computed by DuckDB over Arrow for a large table.

    rows = event_rows(raw_log_table)   # [(event_id, timestamp, build_request_id, ...), ...]
"""

from __future__ import annotations

from databuild_assets.events.schema import EVENT_COLUMNS, PAYLOADS
from databuild_assets.log.sqlite.backend import event_row
from databuild_assets.runtime.deferred import deferred

pa = deferred("pyarrow")

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


# Below this many rows, converting in Python beats starting a DuckDB query.
_VECTORIZED_FROM_ROWS = 5_000


def event_rows(events: pa.Table) -> list[tuple]:
    """The `events` rows of an Arrow table of events (columns of the event schema)."""
    events = events.select(list(EVENT_COLUMNS))
    if events.num_rows < _VECTORIZED_FROM_ROWS:
        return [event_row(event) for event in events.to_pylist()]
    import duckdb  # here: a reader that only appends and catches up never pays its import

    connection = duckdb.connect()
    try:
        connection.register("events", events)
        rows = connection.sql(_EVENT_ROWS_SQL).to_arrow_table()
    finally:
        connection.close()
    return list(zip(*(column.to_pylist() for column in rows.columns), strict=True))


__all__ = ["event_rows"]
