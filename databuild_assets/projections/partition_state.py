"""The partition_state projection: one row per partition_ref seen in a partition_event,
delegation_event or partition_invalidation_event, with its status (EVENTS.md, Projections).

Row for row the SQLite reference's `partition_state` table (log/sqlite/backend.py), plus the
status name; its columns are those of `log.interface.PartitionSummary`, then the status_* fields
of `PartitionStatusInfo` (the latest partition_event itself).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructType

from databuild_assets.events.enums import PartitionStatus
from databuild_assets.projections.projection import (
    Merge,
    Projection,
    by_key,
    column,
    event_with,
    events_by_key,
    fold_state,
    later,
    latest,
    merge_latest,
    merge_sum,
    status_name,
)

KEY = "partition_ref"
# The event types that carry a partition_ref, and so make and change partition_state rows.
EVENT_TYPES = ("partition_event", "delegation_event", "partition_invalidation_event")

SCHEMA = StructType(
    [
        column(KEY, StringType(), False, "The partition."),
        column("status_code", IntegerType(), False,
               "PartitionStatus of the latest partition_event; 0 (UNKNOWN) when the ref has none."),
        column("status_name", StringType(), False, "The PartitionStatus name of status_code."),
        column("is_available", BooleanType(), False, "status is PARTITION_AVAILABLE and not invalidated."),
        column("invalidated", BooleanType(), False,
               "A partition_invalidation_event is later than the latest partition_event (or there is none)."),
        column("updated_at", LongType(), False,
               "Timestamp (ns) of the latest event of the ref, of any of the three types."),
        column("last_event_id", StringType(), False, "event_id of that latest event."),
        column("last_build_request_id", StringType(), False, "build_request_id of that latest event."),
        column("last_job_run_id", StringType(), True, "The latest non-null job_run_id of its partition_events."),
        column("last_available_at", LongType(), True,
               "Timestamp of its latest PARTITION_AVAILABLE event, even if later events superseded it."),
        column("last_available_build_request_id", StringType(), True, "build_request_id of that AVAILABLE event."),
        column("delegated_to_build_request_id", StringType(), True, "Target of its latest delegation_event."),
        column("invalidation_reason", StringType(), True,
               "Reason of its latest partition_invalidation_event, only while invalidated."),
        column("event_count", LongType(), False, "Number of its partition, delegation and invalidation events."),
        column("status_timestamp", LongType(), True, "Timestamp of the latest partition_event (null if none)."),
        column("status_event_id", StringType(), True, "event_id of the latest partition_event."),
        column("status_build_request_id", StringType(), True, "build_request_id of the latest partition_event."),
        column("status_job_run_id", StringType(), True, "job_run_id of the latest partition_event."),
    ]
)  # fmt: skip


def partition_ref_of_event() -> Column:
    """The partition_ref an event carries (null for the event types that carry none)."""
    event_type = F.col("event_type")
    ref = None
    for name in EVENT_TYPES:
        value = F.col(f"{name}.partition_ref")
        ref = F.when(event_type == name, value) if ref is None else ref.when(event_type == name, value)
    return ref


def keys_of(events: DataFrame) -> DataFrame:
    """The partition_refs that `events` touch."""
    return events.select(partition_ref_of_event().alias(KEY)).where(F.col(KEY).isNotNull()).distinct()


def _state() -> tuple[Column, Merge]:
    event_type = F.col("event_type")
    partition = F.col("partition_event")
    is_partition = event_type == "partition_event"
    is_available = is_partition & (partition["status_code"] == int(PartitionStatus.PARTITION_AVAILABLE))
    from_request = event_with(build_request_id=F.col("build_request_id"))
    return fold_state(
        {
            "event_count": (F.count(F.lit(1)), merge_sum),
            "last": (latest(from_request), merge_latest),
            "status": (
                latest(
                    event_with(
                        build_request_id=F.col("build_request_id"),
                        status_code=partition["status_code"],
                        job_run_id=partition["job_run_id"],
                    ),
                    is_partition,
                ),
                merge_latest,
            ),
            "job_run": (
                latest(
                    event_with(job_run_id=partition["job_run_id"]), is_partition & partition["job_run_id"].isNotNull()
                ),
                merge_latest,
            ),
            "available": (latest(from_request, is_available), merge_latest),
            "delegation": (
                latest(
                    event_with(delegated_to=F.col("delegation_event.delegated_to_build_request_id")),
                    event_type == "delegation_event",
                ),
                merge_latest,
            ),
            "invalidation": (
                latest(
                    event_with(reason=F.col("partition_invalidation_event.reason")),
                    event_type == "partition_invalidation_event",
                ),
                merge_latest,
            ),
        }
    )


# The state of each partition_ref in some events, and the fold of new events into stored states.
aggregate, fold = by_key(KEY, partition_ref_of_event, _state)
# The keys that changed events touch, and the events a key's row is computed from.
affected, events_of = events_by_key(partition_ref_of_event, keys_of)


def finish(state: Column) -> list[Column]:
    """A partition_state row (after its key) from its state."""
    status, invalidation = state["status"], state["invalidation"]
    status_code = F.coalesce(status["status_code"], F.lit(int(PartitionStatus.PARTITION_UNKNOWN)))
    invalidated = later(invalidation, status)
    return [
        status_code.alias("status_code"),
        status_name(PartitionStatus, status_code).alias("status_name"),
        ((status_code == int(PartitionStatus.PARTITION_AVAILABLE)) & ~invalidated).alias("is_available"),
        invalidated.alias("invalidated"),
        state["last"]["timestamp"].alias("updated_at"),
        state["last"]["event_id"].alias("last_event_id"),
        state["last"]["build_request_id"].alias("last_build_request_id"),
        state["job_run"]["job_run_id"].alias("last_job_run_id"),
        state["available"]["timestamp"].alias("last_available_at"),
        state["available"]["build_request_id"].alias("last_available_build_request_id"),
        state["delegation"]["delegated_to"].alias("delegated_to_build_request_id"),
        F.when(invalidated, invalidation["reason"]).alias("invalidation_reason"),
        state["event_count"].alias("event_count"),
        status["timestamp"].alias("status_timestamp"),
        status["event_id"].alias("status_event_id"),
        status["build_request_id"].alias("status_build_request_id"),
        status["job_run_id"].alias("status_job_run_id"),
    ]


PARTITION_STATE = Projection(
    name="partition_state",
    key=KEY,
    schema=SCHEMA,
    aggregate=aggregate,
    fold=fold,
    finish=finish,
    keys_of=keys_of,
    affected=affected,
    events_of=events_of,
)
