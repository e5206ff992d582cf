"""The job_runs projection: one row per job_run_id seen in a job_event or task_cancel_event
(EVENTS.md, Projections).

Its job_run_id, build_request_id, status_code and cancel_reason are, row for row, the SQLite
reference's `job_runs` table (log/sqlite_backend.py), which keeps only those; the other columns
are the rest of EVENTS.md's job_runs. A partition_event's job_run_id does not make a run.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructType

from databuild_assets.events.enums import TERMINAL_JOB_STATUSES, JobStatus
from databuild_assets.projections.projection import (
    Projection,
    codes,
    column,
    event_with,
    first,
    latest,
    later,
    semi_join_on_keys,
    status_name,
)

KEY = "job_run_id"
EVENT_TYPES = ("job_event", "task_cancel_event")

SCHEMA = StructType(
    [
        column(KEY, StringType(), False, "The job run."),
        column("build_request_id", StringType(), False,
               "build_request_id of the run's first job or task cancel event."),
        column("status_code", IntegerType(), False,
               "JobStatus of the latest job_event; JOB_CANCELLED (5) when a task_cancel_event is later "
               "(or the run has no job_event)."),
        column("status_name", StringType(), False, "The JobStatus name of status_code."),
        column("cancel_reason", StringType(), True,
               "Reason of that later task_cancel_event, only while it decides the status."),
        column("job_label", StringType(), True, "The latest non-null job_label of its job_events."),
        column("target_partitions", ArrayType(StringType(), True), True,
               "The latest non-null target_partitions of its job_events."),
        column("config", StringType(), True, "The latest non-null config (JobConfig JSON) of its job_events."),
        column("manifests", StringType(), True, "The latest non-null manifests (JSON) of its job_events."),
        column("scheduled_at", LongType(), True, "Timestamp (ns) of its first JOB_SCHEDULED job_event."),
        column("started_at", LongType(), True, "Timestamp of its first JOB_RUNNING job_event."),
        column("ended_at", LongType(), True,
               "Timestamp of its first terminal event: a COMPLETED, FAILED, CANCELLED or SKIPPED job_event, or a "
               "task_cancel_event (the first moment its status was terminal)."),
        column("duration_ns", LongType(), True,
               "ended_at - started_at: how long it ran (null if it never ran or has not ended)."),
        column("updated_at", LongType(), False, "Timestamp of its latest job or task cancel event."),
        column("event_count", LongType(), False, "Number of its job and task cancel events."),
    ]
)  # fmt: skip


def job_run_id_of_event() -> Column:
    """The job_run_id of a job_event or task_cancel_event (null for the other event types: a
    partition_event's job_run_id does not make a run)."""
    event_type = F.col("event_type")
    return F.when(event_type == "job_event", F.col("job_event.job_run_id")).when(
        event_type == "task_cancel_event", F.col("task_cancel_event.job_run_id")
    )


def keys_of(events: DataFrame) -> DataFrame:
    """The job_run_ids that `events` touch."""
    return events.select(job_run_id_of_event().alias(KEY)).where(F.col(KEY).isNotNull()).distinct()


def events_for_keys(events: DataFrame, keys: DataFrame) -> DataFrame:
    """The job_events and task_cancel_events of the job_run_ids in `keys`."""
    return semi_join_on_keys(events, job_run_id_of_event(), keys, KEY)


def build(events: DataFrame) -> DataFrame:
    """One job_runs row per job_run_id in `events`."""
    event_type = F.col("event_type")
    job = F.col("job_event")
    is_job = event_type == "job_event"
    is_cancel = event_type == "task_cancel_event"
    at = F.col("timestamp")

    def latest_given(field: str) -> Column:
        return latest(job[field], is_job & job[field].isNotNull()).alias(field)

    def first_at(where: Column) -> Column:
        return F.min(F.when(where, at))

    per_run = (
        events.select(job_run_id_of_event().alias(KEY), "*")
        .where(F.col(KEY).isNotNull())
        .groupBy(KEY)
        .agg(
            first(F.col("build_request_id")).alias("build_request_id"),
            latest(event_with(status_code=job["status_code"]), is_job).alias("status"),
            latest(event_with(reason=F.col("task_cancel_event.reason")), is_cancel).alias("cancel"),
            latest_given("job_label"),
            latest_given("target_partitions"),
            latest_given("config"),
            latest_given("manifests"),
            first_at(is_job & (job["status_code"] == int(JobStatus.JOB_SCHEDULED))).alias("scheduled_at"),
            first_at(is_job & (job["status_code"] == int(JobStatus.JOB_RUNNING))).alias("started_at"),
            first_at(is_cancel | (is_job & job["status_code"].isin(codes(TERMINAL_JOB_STATUSES)))).alias("ended_at"),
            F.max(at).alias("updated_at"),
            F.count(F.lit(1)).alias("event_count"),
        )
    )

    cancelled = later(F.col("cancel"), F.col("status"))
    status_code = F.when(cancelled, F.lit(int(JobStatus.JOB_CANCELLED))).otherwise(F.col("status.status_code"))
    return per_run.select(
        F.col(KEY),
        F.col("build_request_id"),
        status_code.alias("status_code"),
        status_name(JobStatus, status_code).alias("status_name"),
        F.when(cancelled, F.col("cancel.reason")).alias("cancel_reason"),
        F.col("job_label"),
        F.col("target_partitions"),
        F.col("config"),
        F.col("manifests"),
        F.col("scheduled_at"),
        F.col("started_at"),
        F.col("ended_at"),
        (F.col("ended_at") - F.col("started_at")).alias("duration_ns"),
        F.col("updated_at"),
        F.col("event_count"),
    )


JOB_RUNS = Projection(
    name="job_runs",
    key=KEY,
    schema=SCHEMA,
    build=build,
    keys_of=keys_of,
    events_for_keys=events_for_keys,
)
