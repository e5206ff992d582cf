"""The build_requests projection: one row per build_request_id seen in any event, with its status,
timing and the counts of its partitions and job runs by status (EVENTS.md, Projections).

Row for row what the SQLite reference's `list_build_requests` returns (log/sqlite/backend.py:
the `build_requests` table plus the counts it computes on read); the columns are the fields of
`log.interface.BuildRequestSummary`, in its order.

Its job_run_counts count the job runs it owns: those whose first job or task cancel event is in
the request (the job_runs projection's build_request_id), by their job_runs status. Its state
keeps the whole state of those runs, so that a late event of a run, even one carrying another
build_request_id, is folded in exactly (`fold`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
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
    STATE,
    STATUS_COUNTS_TYPE,
    Merge,
    Projection,
    codes,
    column,
    event_with,
    first,
    fold_state,
    later,
    latest,
    merge_first,
    merge_latest,
    merge_map,
    merge_max,
    merge_min,
    merge_struct,
    merge_sum,
    status_counts,
    status_name,
    stored_states_of,
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


def _scalar_fields() -> dict[str, tuple[Column, Merge]]:
    """The state fields that one aggregate over a request's events computes."""
    event_type = F.col("event_type")
    at = F.col("timestamp")
    is_request = event_type == "build_request_event"
    is_cancel = event_type == "build_cancel_event"
    request_status = F.col("build_request_event.status_code")
    requested = F.col("build_request_event.requested_partitions")
    ends = is_cancel | (is_request & request_status.isin(codes(TERMINAL_BUILD_REQUEST_STATUSES)))
    return {
        "received_at": (F.min(at), merge_min),
        "started_at": (
            F.min(F.when(is_request & (request_status == int(BuildRequestStatus.BUILD_REQUEST_EXECUTING)), at)),
            merge_min,
        ),
        "ended_at": (F.min(F.when(ends, at)), merge_min),
        "updated_at": (F.max(at), merge_max),
        "event_count": (F.count(F.lit(1)), merge_sum),
        "status": (latest(event_with(status_code=request_status), is_request), merge_latest),
        "requested_partitions": (latest(event_with(value=requested), is_request & requested.isNotNull()), merge_latest),
        "cancel": (latest(event_with(reason=F.col("build_cancel_event.reason")), is_cancel), merge_latest),
    }


# Per partition_ref of its partition_events: the request's latest one for the ref.
_MERGE_PARTITIONS = merge_map(merge_latest)


def _run_fields() -> dict[str, tuple[Column, Merge]]:
    """What decides a job run's owner (the request of its first job or task cancel event) and its
    status, from its events of all requests."""
    event_type = F.col("event_type")
    return {
        "first": (first(event_with(build_request_id=F.col(KEY))), merge_first),
        "status": (
            latest(event_with(status_code=F.col("job_event.status_code")), event_type == "job_event"),
            merge_latest,
        ),
        "cancel": (latest(event_with(), event_type == "task_cancel_event"), merge_latest),
    }


def _run_states(events: DataFrame, run_state: Column) -> DataFrame:
    """(job_run_id, run): the state (`run_state`, from `fold_state(_run_fields())`) of each job
    run in `events`."""
    return (
        events.select("*", job_runs.job_run_id_of_event().alias("job_run_id"))
        .where(F.col("job_run_id").isNotNull())
        .groupBy("job_run_id")
        .agg(run_state.alias("run"))
    )


def _run_maps(runs: DataFrame) -> DataFrame:
    """(KEY, job_runs): each owner's map of its runs, from rows (KEY, job_run_id, run)."""
    return runs.groupBy(KEY).agg(F.map_from_entries(F.collect_list(F.struct("job_run_id", "run"))).alias("job_runs"))


def _local_states(events: DataFrame, fields: dict[str, tuple[Column, Merge]]) -> DataFrame:
    """(KEY, STATE) of each build request in `events`, with the fields its own events decide
    (`fields`, from `_scalar_fields()`, and partitions; job_runs left null)."""
    event_type = F.col("event_type")
    scalars = events.groupBy(KEY).agg(*(value.alias(name) for name, (value, _) in fields.items()))
    partition_ref = F.col("partition_event.partition_ref")
    partitions = (
        events.where((event_type == "partition_event") & partition_ref.isNotNull())
        .groupBy(KEY, partition_ref.alias("partition_ref"))
        .agg(latest(event_with(status_code=F.col("partition_event.status_code"))).alias("latest"))
        .groupBy(KEY)
        .agg(F.map_from_entries(F.collect_list(F.struct("partition_ref", "latest"))).alias("partitions"))
    )
    return scalars.join(partitions, KEY, "left").select(F.col(KEY), F.struct(*fields, "partitions").alias(STATE))


def _merge_local(fields: dict[str, tuple[Column, Merge]]) -> Merge:
    """The merge of two `_local_states` states of `fields`."""
    merges = {name: field_merge for name, (_, field_merge) in fields.items()}
    return merge_struct({**merges, "partitions": _MERGE_PARTITIONS})


def _without_runs(state: Column) -> Column:
    return state.dropFields("job_runs")


def aggregate(events: DataFrame) -> DataFrame:
    """The state of each build request in `events`: its scalar fields, the map of its partitions
    to their latest status in it, and the map of the job runs it owns to their state."""
    run_state, _ = fold_state(_run_fields())
    owned = _run_states(events, run_state).select(F.col("run.first.build_request_id").alias(KEY), "job_run_id", "run")
    return (
        _local_states(events, _scalar_fields())
        .join(_run_maps(owned), KEY, "left")
        .select(F.col(KEY), F.col(STATE).withField("job_runs", F.col("job_runs")).alias(STATE))
    )


def fold(states: DataFrame, events: DataFrame) -> DataFrame:
    """The states of the requests that `events` change: those they belong to, and the owners,
    before and after, of the job runs they touch (a late event can move a run to another request)."""
    stored = states.select(KEY, STATE)
    run_state, merge_run = fold_state(_run_fields())
    fields = _scalar_fields()
    new_runs = _run_states(events, run_state)
    # The touched runs' stored states, with their owners, from the owners' maps.
    old_runs = stored.select(
        F.col(KEY).alias("old_owner"), F.explode(F.col(f"{STATE}.job_runs")).alias("job_run_id", "old_run")
    )
    old_runs = stored_states_of(old_runs, new_runs.select("job_run_id"))
    # `runs` and `local` are read three and two times below; computed once here instead (a local
    # checkpoint: two small jobs, the blocks dropped with the DataFrames), since recomputing them
    # per read costs several times more (docs/decisions/0011-incremental-fold.md). Eager: a lazy
    # checkpoint computes them after Spark has cleaned up the original plans' metrics, and logs an
    # ERROR per task.
    runs = (
        new_runs.join(old_runs, "job_run_id", "left")
        .select("job_run_id", "old_owner", merge_run(F.col("old_run"), F.col("run")).alias("run"))
        .withColumn(KEY, F.col("run.first.build_request_id"))
    ).localCheckpoint()
    local = _local_states(events, fields).localCheckpoint()
    affected = (
        local.select(KEY)
        .union(runs.select(KEY))
        .union(runs.where(F.col("old_owner").isNotNull()).select(F.col("old_owner").alias(KEY)))
        .distinct()
    )
    # Their maps: the stored entries of runs not touched, and the touched runs they now own.
    stored_affected = stored_states_of(stored, affected).localCheckpoint()  # read twice below
    kept = stored_affected.select(F.col(KEY), F.explode(F.col(f"{STATE}.job_runs")).alias("job_run_id", "run")).join(
        runs.select("job_run_id"), "job_run_id", "left_anti"
    )
    run_maps = _run_maps(kept.unionByName(runs.select(KEY, "job_run_id", "run")))
    merged = _merge_local(fields)(_without_runs(F.col(f"old.{STATE}")), F.col(f"new.{STATE}"))
    return (
        affected.join(stored_affected.alias("old"), KEY, "left")
        .join(local.alias("new"), KEY, "left")
        .join(run_maps, KEY, "left")
        .select(F.col(KEY), merged.withField("job_runs", F.col("job_runs")).alias(STATE))
    )


def affected(states: DataFrame, log: DataFrame, changed: DataFrame) -> DataFrame:
    """The requests whose rows the `changed` events can change: the requests they belong to, and
    the owners, before and after, of the job runs they touch (removing a run's first event hands
    the run to the request of its next one)."""
    runs = job_runs.keys_of(changed)
    owned = states.select(F.col(KEY).alias("owner"), F.explode(F.col(f"{STATE}.job_runs")).alias("job_run_id", "run"))
    owners_before = stored_states_of(owned, runs).select(F.col("owner").alias(KEY))
    candidates_after = stored_states_of(log.select(KEY, job_runs.job_run_id_of_event().alias("job_run_id")), runs)
    return keys_of(changed).union(owners_before).union(candidates_after.select(KEY)).distinct()


def events_of(log: DataFrame, keys: DataFrame) -> DataFrame:
    """The events a request's row is computed from: its own, and every event of each job run that
    has one of its own (the run's first event decides which request owns it)."""
    with_run = log.withColumn("_run", job_runs.job_run_id_of_event())
    mine = F.broadcast(keys.select(F.col(KEY), F.lit(True).alias("_mine")))
    runs = with_run.join(mine, KEY, "left_semi").where(F.col("_run").isNotNull()).select("_run").distinct()
    of_my_runs = F.broadcast(runs.withColumn("_of_my_runs", F.lit(True)))
    return (
        with_run.join(mine, KEY, "left")
        .join(of_my_runs, "_run", "left")
        .where(F.col("_mine") | F.col("_of_my_runs"))
        .drop("_run", "_mine", "_of_my_runs")
    )


def finish(state: Column) -> list[Column]:
    """A build_requests row (after its key) from its state."""
    status, cancel = state["status"], state["cancel"]
    cancelled = later(cancel, status)
    status_code = F.when(cancelled, F.lit(int(BuildRequestStatus.BUILD_REQUEST_CANCELLED))).otherwise(
        F.coalesce(status["status_code"], F.lit(int(BuildRequestStatus.BUILD_REQUEST_UNKNOWN)))
    )
    partition_statuses = F.transform(F.map_values(state["partitions"]), lambda latest: latest["status_code"])
    job_run_statuses = F.transform(
        F.map_values(state["job_runs"]), lambda run: job_runs.status_of(run["status"], run["cancel"])
    )
    return [
        status_code.alias("status_code"),
        status_name(BuildRequestStatus, status_code).alias("status_name"),
        F.when(cancelled, cancel["reason"]).alias("cancel_reason"),
        F.coalesce(state["requested_partitions"]["value"], F.array().cast(ArrayType(StringType(), True))).alias(
            "requested_partitions"
        ),
        state["received_at"].alias("received_at"),
        state["started_at"].alias("started_at"),
        state["ended_at"].alias("ended_at"),
        (state["ended_at"] - state["received_at"]).alias("duration_ns"),
        state["updated_at"].alias("updated_at"),
        state["event_count"].alias("event_count"),
        status_counts(PartitionStatus, partition_statuses).alias("partition_counts"),
        status_counts(JobStatus, job_run_statuses).alias("job_run_counts"),
    ]


BUILD_REQUESTS = Projection(
    name="build_requests",
    key=KEY,
    schema=SCHEMA,
    aggregate=aggregate,
    fold=fold,
    finish=finish,
    keys_of=keys_of,
    affected=affected,
    events_of=events_of,
)
