"""The event-log sensor: when the raw log or the tombstones get a commit, request one refresh of
the filtered log and the projections (what readers see changed), unless a run that refreshes
them is in flight, or they already reflect that commit (the landing sensor's run ingests and
refreshes in one, and erase_job refreshes after recording its tombstone)."""

from dagster import DagsterRunStatus, RunRequest, RunsFilter, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.event_log.jobs import ingest_and_refresh_job
from databuild_assets.defs.event_log.sensors import SENSOR_INTERVAL_SECONDS
from databuild_assets.defs.maintenance.jobs import erase_job
from databuild_assets.defs.projections.jobs import refresh_projections_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.log.serving.follower import follower_for
from databuild_assets.projections.refresh_all import reflected_versions_on_disk
from databuild_assets.runtime.damage import DamagedTableError, new_commits_damage
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, is_local
from databuild_assets.runtime.object_store import is_s3

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
# The jobs whose runs end with the filtered log and the projections refreshed.
REFRESHING_JOBS = [refresh_projections_job.name, ingest_and_refresh_job.name, erase_job.name]


@sensor(
    job=refresh_projections_job,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    description="Requests a projection refresh when the event log gets new commits.",
)
def event_log_commits_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    lake = lakehouse.lake

    def version(path: str) -> int | None:
        # Local tables and tables on S3 are read without a JVM (a listing of their log); on another
        # object store it takes Spark.
        if is_local(path):
            return latest_version_on_disk(path)
        if is_s3(path):
            return follower_for(path).newest_version()
        return current_version(lakehouse.spark_session, path)

    raw = version(lake.table_path(RAW_EVENT_LOG))
    if raw is None:
        return SkipReason(f"no event log at {lake.table_path(RAW_EVENT_LOG)} yet")
    tombstones = version(lake.table_path(TOMBSTONES))
    state = f"raw_event_log=v{raw},tombstones={'none' if tombstones is None else f'v{tombstones}'}"
    seen, generation = _parse_cursor(context.cursor)
    if seen == state:
        return SkipReason(f"event log still at version {raw}, tombstones at {tombstones}")
    if is_local(lake.root):
        # A refresh run over a commit that does not parse would only fail: say which file, and
        # keep the cursor, so that the tick after a repair requests the run.
        for path, newest in ((lake.table_path(RAW_EVENT_LOG), raw), (lake.table_path(TOMBSTONES), tombstones)):
            if newest is not None and (damage := new_commits_damage(path, newest - 1, newest)) is not None:
                return SkipReason(str(damage))
    if seen is not None and raw < _raw_version(seen):
        # The log went back: a new lake at the same root (`make clean-lake`). Its versions start
        # again at 0, so its run keys get a generation, or Dagster would not run the ones the old
        # lake already used.
        generation += 1
        context.log.info(f"event log went back from {seen} to {state}: a new lake, generation {generation}")
    run_key = state if generation == 0 else f"{state},lake-generation={generation}"
    in_flight = [
        record.dagster_run
        for record in context.instance.get_run_records(RunsFilter(statuses=IN_FLIGHT))
        if record.dagster_run.job_name in REFRESHING_JOBS
    ]
    if in_flight:
        # The cursor stays: once that run ends, the next tick requests the versions it missed.
        run = in_flight[0]
        return SkipReason(f"{run.job_name} run {run.run_id} is in flight; event log at version {raw}")
    try:
        reflected = reflected_versions_on_disk(lake) if is_local(lake.root) else None
    except DamagedTableError as damage:  # a derived table's commit: its refresh would fail on it
        return SkipReason(str(damage))
    if reflected == (raw, tombstones):
        # Another run refreshed them already (ingest_and_refresh_job, erase_job): nothing to request.
        return SensorResult(
            skip_reason=f"the filtered log and every projection already reflect raw_event_log v{raw}",
            cursor=run_key,
        )
    return SensorResult(
        run_requests=[RunRequest(run_key=run_key, tags={"databuild/log_version": str(raw)})],
        cursor=run_key,
    )


def _parse_cursor(cursor: str | None) -> tuple[str | None, int]:
    """The versions a cursor saw, and the lake generation: "raw_event_log=v5,tombstones=none" is
    generation 0; "...,lake-generation=2" after the log went back twice."""
    if not cursor:
        return None, 0
    state, _, generation = cursor.partition(",lake-generation=")
    return state, int(generation or 0)


def _raw_version(state: str) -> int:
    return int(state.split(",")[0].removeprefix("raw_event_log=v"))
