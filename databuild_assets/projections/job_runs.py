"""The job_runs projection: one row per job_run_id seen in a job_event or task_cancel_event
(EVENTS.md, Projections).

Its job_run_id, build_request_id, status_code and cancel_reason are, row for row, the SQLite
reference's `job_runs` table (log/sqlite/backend.py), which keeps only those; the other columns
are the rest of EVENTS.md's job_runs. A partition_event's job_run_id does not make a run.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructType

from databuild_assets.events.enums import TERMINAL_JOB_STATUSES, JobStatus
from databuild_assets.projections.projection import (
    Merge,
    Projection,
    by_key,
    codes,
    column,
    event_with,
    events_by_key,
    first,
    fold_state,
    later,
    latest,
    merge_first,
    merge_latest,
    merge_max,
    merge_min,
    merge_sum,
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


def _state() -> tuple[Column, Merge]:
    event_type = F.col("event_type")
    job = F.col("job_event")
    is_job = event_type == "job_event"
    is_cancel = event_type == "task_cancel_event"
    at = F.col("timestamp")

    def latest_given(field: str) -> tuple[Column, Merge]:
        return latest(event_with(value=job[field]), is_job & job[field].isNotNull()), merge_latest

    def first_at(where: Column) -> tuple[Column, Merge]:
        return F.min(F.when(where, at)), merge_min

    return fold_state(
        {
            "first": (first(event_with(build_request_id=F.col("build_request_id"))), merge_first),
            "status": (latest(event_with(status_code=job["status_code"]), is_job), merge_latest),
            "cancel": (latest(event_with(reason=F.col("task_cancel_event.reason")), is_cancel), merge_latest),
            "job_label": latest_given("job_label"),
            "target_partitions": latest_given("target_partitions"),
            "config": latest_given("config"),
            "manifests": latest_given("manifests"),
            "scheduled_at": first_at(is_job & (job["status_code"] == int(JobStatus.JOB_SCHEDULED))),
            "started_at": first_at(is_job & (job["status_code"] == int(JobStatus.JOB_RUNNING))),
            "ended_at": first_at(is_cancel | (is_job & job["status_code"].isin(codes(TERMINAL_JOB_STATUSES)))),
            "updated_at": (F.max(at), merge_max),
            "event_count": (F.count(F.lit(1)), merge_sum),
        }
    )


# The state of each job run in some events, and the fold of new events into stored states.
aggregate, fold = by_key(KEY, job_run_id_of_event, _state)
# The keys that changed events touch, and the events a key's row is computed from.
affected, events_of = events_by_key(job_run_id_of_event, keys_of)


def status_of(status: Column, cancel: Column) -> Column:
    """A run's JobStatus code from its latest job_event (`event_with(status_code)`) and latest
    task_cancel_event: JOB_CANCELLED when the cancel is later (or there is no job_event)."""
    return F.when(later(cancel, status), F.lit(int(JobStatus.JOB_CANCELLED))).otherwise(status["status_code"])


def finish(state: Column) -> list[Column]:
    """A job_runs row (after its key) from its state."""
    cancelled = later(state["cancel"], state["status"])
    status_code = status_of(state["status"], state["cancel"])
    return [
        state["first"]["build_request_id"].alias("build_request_id"),
        status_code.alias("status_code"),
        status_name(JobStatus, status_code).alias("status_name"),
        F.when(cancelled, state["cancel"]["reason"]).alias("cancel_reason"),
        state["job_label"]["value"].alias("job_label"),
        state["target_partitions"]["value"].alias("target_partitions"),
        state["config"]["value"].alias("config"),
        state["manifests"]["value"].alias("manifests"),
        state["scheduled_at"].alias("scheduled_at"),
        state["started_at"].alias("started_at"),
        state["ended_at"].alias("ended_at"),
        (state["ended_at"] - state["started_at"]).alias("duration_ns"),
        state["updated_at"].alias("updated_at"),
        state["event_count"].alias("event_count"),
    ]


JOB_RUNS = Projection(
    name="job_runs",
    key=KEY,
    schema=SCHEMA,
    aggregate=aggregate,
    fold=fold,
    finish=finish,
    keys_of=keys_of,
    affected=affected,
    events_of=events_of,
)
