"""The raw-log sensor: when the event log's Delta version moves, request one projection refresh."""

from dagster import DagsterRunStatus, RunRequest, RunsFilter, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.projections.assets import PROJECTION_SOURCE
from databuild_assets.defs.projections.jobs import refresh_projections_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.runtime.delta_tables import current_version, latest_version_on_disk
from databuild_assets.runtime.lake import is_local

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


@sensor(job=refresh_projections_job, minimum_interval_seconds=30,
        description="Requests a projection refresh when the event log gets new commits.")
def event_log_commits_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    path = lakehouse.lake.table_path(PROJECTION_SOURCE)
    # Local tables are read without a JVM; remote ones need Spark to list object storage.
    version = latest_version_on_disk(path) if is_local(path) else current_version(lakehouse.spark_session, path)
    if version is None:
        return SkipReason(f"no event log at {path} yet")
    requested = int(context.cursor) if context.cursor else None
    if requested is not None and version <= requested:
        return SkipReason(f"event log still at version {version}")
    in_flight = context.instance.get_run_records(
        RunsFilter(job_name=refresh_projections_job.name, statuses=IN_FLIGHT), limit=1
    )
    if in_flight:
        # The cursor stays: once that run ends, the next tick requests the versions it missed.
        return SkipReason(f"refresh run {in_flight[0].dagster_run.run_id} is in flight; event log at version {version}")
    return SensorResult(
        run_requests=[RunRequest(run_key=f"{PROJECTION_SOURCE.name}-v{version}", tags={"databuild/log_version": str(version)})],
        cursor=str(version),
    )
