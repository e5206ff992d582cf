"""The build_requests projection: one row per build_request_id seen in any event, with its status,
timing and the counts of its partitions and job runs by status (EVENTS.md, Projections).

Row for row what the SQLite reference's `list_build_requests` returns (log/sqlite_backend.py:
the `build_requests` table plus the counts it computes on read); the columns are the fields of
`log.interface.BuildRequestSummary`, in its order.

Its job_run_counts count the runs whose first job or task cancel event is in the request (the
job_runs projection's build_request_id). Rebuilding a request from its own events alone
(`events_for_keys`) is exact when a job run's job and task cancel events all belong to one build
request, as DataBuild writes them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructType

from databuild_assets.events.enums import (
    TERMINAL_BUILD_REQUEST_STATUSES,
    BuildRequestStatus,
    JobStatus,
    PartitionStatus,
)
from databuild_assets.projections import job_runs
from databuild_assets.projections.projection import (
    STATUS_COUNTS_TYPE,
    Projection,
    codes,
    column,
    event_with,
    latest,
    later,
    semi_join_on_keys,
    status_counts,
    status_name,
)

KEY = "build_request_id"

SCHEMA = StructType(
    [
        column(KEY, StringType(), False, "The build request."),
        column("status_code", IntegerType(), False,
               "BuildRequestStatus of the latest build_request_event; BUILD_REQUEST_CANCELLED (6) when a "
               "build_cancel_event is later (or there is no build_request_event); 0 (UNKNOWN) when neither."),
        column("status_name", StringType(), False, "The BuildRequestStatus name of status_code."),
        column("cancel_reason", StringType(), True,
               "Reason of that later build_cancel_event, only while it decides the status."),
        column("requested_partitions", ArrayType(StringType(), True), False,
               "Of the latest build_request_event that carries them (an empty list counts); [] if none does."),
        column("received_at", LongType(), False, "Timestamp (ns) of its earliest event of any type."),
        column("started_at", LongType(), True, "Timestamp of its first BUILD_REQUEST_EXECUTING event."),
        column("ended_at", LongType(), True,
               "Timestamp of its first COMPLETED, FAILED or CANCELLED build_request_event or build_cancel_event "
               "(ANALYSIS_COMPLETED does not end it)."),
        column("duration_ns", LongType(), True, "ended_at - received_at (null while not ended)."),
        column("updated_at", LongType(), False, "Timestamp of its latest event."),
        column("event_count", LongType(), False, "Number of its events (those whose build_request_id it is)."),
        column("partition_counts", STATUS_COUNTS_TYPE, False,
               "{PartitionStatus name: count} of the refs of its partition_events, each by the status of its own "
               "latest partition_event for the ref; every status present, zeros included."),
        column("job_run_counts", STATUS_COUNTS_TYPE, False,
               "{JobStatus name: count} of the job runs whose build_request_id (job_runs) it is, by job_runs "
               "status; every status present, zeros included."),
    ]
)  # fmt: skip


def keys_of(events: DataFrame) -> DataFrame:
    """The build_request_ids that `events` touch: those of all of them."""
    return events.select(F.col(KEY)).distinct()


def events_for_keys(events: DataFrame, keys: DataFrame) -> DataFrame:
    """Every event whose build_request_id is in `keys`."""
    return semi_join_on_keys(events, F.col(KEY), keys, KEY)


def build(events: DataFrame) -> DataFrame:
    """One build_requests row per build_request_id in `events`."""
    event_type = F.col("event_type")
    partition = F.col("partition_event")
    # One row per event, plus one row per job run (its status, under its build request), so that
    # one grouping by build_request_id computes every column: a single shuffle after job_runs'.
    event_rows = events.select(
        F.col(KEY),
        F.col("timestamp"),
        F.col("event_id"),
        event_type,
        F.col("build_request_event.status_code").alias("request_status_code"),
        F.col("build_request_event.requested_partitions").alias("requested_partitions"),
        F.col("build_cancel_event.reason").alias("cancel_reason"),
        F.when(event_type == "partition_event", partition["partition_ref"]).alias("partition_ref"),
        F.when(event_type == "partition_event", partition["status_code"]).alias("partition_status_code"),
    )
    job_run_rows = job_runs.build(events).select(F.col(KEY), F.col("status_code").alias("job_run_status_code"))
    rows = event_rows.unionByName(job_run_rows, allowMissingColumns=True).repartition(KEY)

    # A request's partition counts once, by the status of the request's own latest event for it.
    newest_first = Window.partitionBy(KEY, "partition_ref").orderBy(F.col("timestamp").desc(), F.col("event_id").desc())
    is_latest_for_partition = F.col("partition_ref").isNotNull() & (F.row_number().over(newest_first) == 1)
    rows = rows.withColumn("partition_status_code", F.when(is_latest_for_partition, F.col("partition_status_code")))

    at = F.col("timestamp")
    is_request = event_type == "build_request_event"
    is_cancel = event_type == "build_cancel_event"
    request_status = F.col("request_status_code")
    per_request = rows.groupBy(KEY).agg(
        F.min(at).alias("received_at"),
        F.min(F.when(is_request & (request_status == int(BuildRequestStatus.BUILD_REQUEST_EXECUTING)), at)).alias(
            "started_at"
        ),
        F.min(F.when(is_cancel | (is_request & request_status.isin(codes(TERMINAL_BUILD_REQUEST_STATUSES))), at)).alias(
            "ended_at"
        ),
        F.max(at).alias("updated_at"),
        F.count(F.col("event_id")).alias("event_count"),  # job run rows have no event_id
        latest(event_with(status_code=request_status), is_request).alias("status"),
        latest(F.col("requested_partitions"), is_request & F.col("requested_partitions").isNotNull()).alias(
            "requested_partitions"
        ),
        latest(event_with(reason=F.col("cancel_reason")), is_cancel).alias("cancel"),
        status_counts(PartitionStatus, F.col("partition_status_code")).alias("partition_counts"),
        status_counts(JobStatus, F.col("job_run_status_code")).alias("job_run_counts"),
    )

    cancelled = later(F.col("cancel"), F.col("status"))
    status_code = F.when(cancelled, F.lit(int(BuildRequestStatus.BUILD_REQUEST_CANCELLED))).otherwise(
        F.coalesce(F.col("status.status_code"), F.lit(int(BuildRequestStatus.BUILD_REQUEST_UNKNOWN)))
    )
    return per_request.select(
        F.col(KEY),
        status_code.alias("status_code"),
        status_name(BuildRequestStatus, status_code).alias("status_name"),
        F.when(cancelled, F.col("cancel.reason")).alias("cancel_reason"),
        F.coalesce(F.col("requested_partitions"), F.array().cast(ArrayType(StringType(), True))).alias(
            "requested_partitions"
        ),
        F.col("received_at"),
        F.col("started_at"),
        F.col("ended_at"),
        (F.col("ended_at") - F.col("received_at")).alias("duration_ns"),
        F.col("updated_at"),
        F.col("event_count"),
        F.col("partition_counts"),
        F.col("job_run_counts"),
    )


BUILD_REQUESTS = Projection(
    name="build_requests",
    key=KEY,
    schema=SCHEMA,
    build=build,
    keys_of=keys_of,
    events_for_keys=events_for_keys,
)
