"""The event model of EVENTS.md: schema, status enums and validation. Everything imports it from here."""

from databuild_assets.events import schema
from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.schema import EVENT_COLUMNS, EVENT_TYPES, PAYLOADS, SCHEMA_VERSION
from databuild_assets.events.validation import InvalidEventError, event_error, parse_line, require_valid


def __getattr__(name: str):
    if name == "EVENT_SCHEMA":  # the Spark schema, built (pyspark imported) on first use
        return schema.event_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BuildRequestStatus",
    "JobStatus",
    "PartitionStatus",
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "PAYLOADS",
    "SCHEMA_VERSION",
    "InvalidEventError",
    "event_error",
    "parse_line",
    "require_valid",
]
