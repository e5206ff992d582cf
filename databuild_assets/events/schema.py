"""The event schema of EVENTS.md, declared once.

`PAYLOADS` lists each payload struct's fields with their kind and, for status codes, their
enum. The Spark schema (`EVENT_SCHEMA`) and the validator (`validation.py`) are both
derived from it, so the two cannot drift apart. `EVENT_SCHEMA` is built on first use: the query
path (log/) reads the field lists only and imports no pyspark (docs/decisions/0057).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

# Bumped whenever the stored event schema changes; written to every table's properties.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Field:
    """One payload field. `kind` is "string", "int" or "array<string>"."""

    name: str
    kind: str
    status_enum: type[IntEnum] | None = None


def _status_fields(enum: type[IntEnum]) -> list[Field]:
    return [Field("status_code", "int", enum), Field("status_name", "string")]


PAYLOADS: dict[str, tuple[Field, ...]] = {
    "build_request_event": (
        *_status_fields(BuildRequestStatus),
        Field("requested_partitions", "array<string>"),
        Field("message", "string"),
    ),
    "partition_event": (
        Field("partition_ref", "string"),
        *_status_fields(PartitionStatus),
        Field("message", "string"),
        Field("job_run_id", "string"),
    ),
    "job_event": (
        Field("job_run_id", "string"),
        Field("job_label", "string"),
        Field("target_partitions", "array<string>"),
        *_status_fields(JobStatus),
        Field("message", "string"),
        Field("config", "string"),
        Field("manifests", "string"),
    ),
    "delegation_event": (
        Field("partition_ref", "string"),
        Field("delegated_to_build_request_id", "string"),
        Field("message", "string"),
    ),
    "job_graph_event": (Field("job_graph", "string"), Field("message", "string")),
    "partition_invalidation_event": (Field("partition_ref", "string"), Field("reason", "string")),
    "task_cancel_event": (Field("job_run_id", "string"), Field("reason", "string")),
    "build_cancel_event": (Field("reason", "string"),),
}

EVENT_TYPES: tuple[str, ...] = tuple(PAYLOADS)

# The four core fields: all required (NOT NULL).
CORE_FIELDS: tuple[Field, ...] = (
    Field("event_id", "string"),
    Field("timestamp", "bigint"),
    Field("build_request_id", "string"),
    Field("event_type", "string"),
)
EVENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in CORE_FIELDS) + EVENT_TYPES


@functools.cache
def _spark_types() -> dict[str, DataType]:
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType

    return {
        "string": StringType(),
        "int": IntegerType(),
        "bigint": LongType(),
        # Elements are nullable in storage (as from_json produces them); validation refuses null elements.
        "array<string>": ArrayType(StringType(), containsNull=True),
    }


def spark_type(field: Field) -> DataType:
    return _spark_types()[field.kind]


def payload_struct(event_type: str) -> StructType:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, spark_type(f), nullable=True) for f in PAYLOADS[event_type]])


@functools.cache
def event_schema() -> StructType:
    """One event, exactly as writers hand it over (and as JSON Lines parse into): `EVENT_SCHEMA`."""
    from pyspark.sql.types import StructField, StructType

    return StructType(
        [StructField(f.name, spark_type(f), nullable=False) for f in CORE_FIELDS]
        + [StructField(name, payload_struct(name), nullable=True) for name in EVENT_TYPES]
    )


def __getattr__(name: str) -> Any:
    if name == "EVENT_SCHEMA":
        return event_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def normalize_event(event: dict) -> dict:
    """The canonical shape of an event: every column present, the unset payloads None, and in
    the set payload every field present (None when unset). Backends return events this way,
    so events compare equal whatever wrote or stored them."""
    normalized = {field.name: event.get(field.name) for field in CORE_FIELDS}
    for name in EVENT_TYPES:
        payload = event.get(name)
        normalized[name] = None if payload is None else {f.name: payload.get(f.name) for f in PAYLOADS[name]}
    return normalized


def event_from_row(row) -> dict:
    """A Spark Row of the raw log (or of EVENT_SCHEMA) -> the event dict, normalized."""
    data = row.asDict(recursive=True)
    return normalize_event({name: data.get(name) for name in EVENT_COLUMNS})
