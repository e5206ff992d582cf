"""Our tables' columns as Dagster's catalog shows them (the Columns tab): each column's Spark type,
nullability and description, derived from the Spark schemas in runtime/lake.py, events/schema.py
and the projections, so the catalog cannot disagree with the tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dagster import TableColumn, TableColumnConstraints, TableSchema
from pyspark.sql.types import StructField

from databuild_assets.events.schema import PAYLOADS
from databuild_assets.projections.projection import STATE, STATE_LOG_VERSION, Projection
from databuild_assets.projections.refresh import projection_spec
from databuild_assets.runtime.lake import EVENT_QUARANTINE, FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES, TableSpec


def _payload_description(event_type: str) -> str:
    fields = ", ".join(
        f"{field.name} ({field.status_enum.__name__})" if field.status_enum else field.name
        for field in PAYLOADS[event_type]
    )
    return f"The {event_type} payload, set only when event_type is '{event_type}': {fields}."


_CORE = {
    "event_id": "UUID of the event; unique across the log (the idempotency key).",
    "timestamp": "When the event happened, Unix epoch nanoseconds. The log's order is (timestamp, event_id).",
    "build_request_id": "The build request the event belongs to.",
    "event_type": "Which payload column is set: one of " + ", ".join(PAYLOADS) + ".",
}

_EVENT_LOG = {
    **_CORE,
    **{event_type: _payload_description(event_type) for event_type in PAYLOADS},
    "event_date": "UTC date of timestamp: the table's partition column.",
    "source_file": "The landing file the event came from, or writer:<name> for the writer API.",
    "source_line": "Its line number in that landing file (null for the writer API).",
    "ingested_at": "When ingestion committed the event.",
}

# What each column of the tables that carry no column comments of their own means. The
# projections' columns are described where they are declared (projection.column(...)).
COLUMN_DESCRIPTIONS: dict[str, Mapping[str, str]] = {
    RAW_EVENT_LOG.name: _EVENT_LOG,
    FILTERED_EVENT_LOG.name: _EVENT_LOG,
    EVENT_QUARANTINE.name: {
        "source_file": "The landing file that held the bad line.",
        "line_number": "Its line number in that file (from 1).",
        "reason": "Why the line was refused, in words a person can act on.",
        "line": "The line as text (invalid UTF-8 replaced), for people.",
        "raw_line": "The line's exact bytes: nothing is lost.",
        "ingest_batch": "The ingestion batch that read the line.",
        "quarantined_at": "When the line was quarantined.",
    },
    TOMBSTONES.name: {
        "tombstone_id": "The erasure request; it has one 'requested' record, and an 'applied' one once purged.",
        "record": "'requested' when asked, 'applied' when compaction purged the matching rows.",
        "key": "What value names: event_id, build_request_id, job_run_id or partition_ref.",
        "value": "The value to erase. Kept here on purpose: the audit record of what was erased.",
        "actor": "Who asked.",
        "reason": "Why (e.g. a ticket).",
        "requested_at": "When the erasure was requested.",
        "applied_at": "When compaction purged the matching rows ('applied' records).",
        "applied_log_version": "The raw_event_log version of that purge ('applied' records).",
    },
}


def column_description(table: str, field: StructField) -> str | None:
    """The column's own comment (the projections') or its entry in COLUMN_DESCRIPTIONS."""
    return field.metadata.get("comment") or COLUMN_DESCRIPTIONS.get(table, {}).get(field.name)


def table_column(
    table: str, field: StructField, *, unique: bool = False, partition: bool = False, type_name: str | None = None
) -> TableColumn:
    """One column: Spark's type as Spark SQL spells it (`struct<...>`, `array<string>`), its
    nullability, whether it is unique or the partition column, and its description."""
    return TableColumn(
        name=field.name,
        type=type_name or field.dataType.simpleString(),
        description=column_description(table, field),
        constraints=TableColumnConstraints(
            nullable=field.nullable, unique=unique, other=["partition column"] if partition else []
        ),
    )


def table_schema(spec: TableSpec, unique: Iterable[str] = (), extra: Iterable[TableColumn] = ()) -> TableSchema:
    """The Dagster TableSchema of `spec`'s columns, in table order, then `extra` columns.

    table_schema(RAW_EVENT_LOG, unique=["event_id"])
    """
    unique = set(unique)
    columns = [
        table_column(spec.name, field, unique=field.name in unique, partition=field.name in spec.partition_by)
        for field in spec.schema.fields
    ]
    return TableSchema(columns=[*columns, *extra])


def projection_table_schema(projection: Projection) -> TableSchema:
    """The projection table's columns: its read model, then the two internal columns a refresh
    keeps beside each row (projections/refresh.py, `table_spec`). The fold state's exact struct
    type is planned by Spark from the projection's aggregate, which definitions must not start
    a JVM for, so the catalog calls it `struct`. The descriptions are refresh.py's column
    comments (test_definitions compares them with a materialized table's)."""
    internal = {"databuild/internal": "true"}
    return table_schema(
        projection_spec(projection),
        unique=[projection.key],
        extra=[
            TableColumn(
                STATE,
                "struct",
                tags=internal,
                description="Internal: the mergeable aggregates this row is computed from, which "
                "refreshes fold new events into. Not part of the read model; its layout may change "
                "between releases.",
            ),
            TableColumn(
                STATE_LOG_VERSION,
                "bigint",
                tags=internal,
                description="Internal: the log version this row was last computed at.",
            ),
        ],
    )
