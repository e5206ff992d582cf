"""The landing-files sensor: a change in <lake root>/landing (a folder, or a prefix on S3) requests
one run that ingests the new files and refreshes the filtered log and the projections; none while
such a run waits in the run queue (it will take every file there when it starts), nor while the
newest commit of the raw log or the ingest ledger does not parse (the skip names that file)."""

from dagster import DagsterRunStatus, RunRequest, RunsFilter, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.event_log.jobs import ingest_and_refresh_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing_state import landing_state
from databuild_assets.runtime.damage import new_commits_damage
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.lake import INGEST_LEDGER, RAW_EVENT_LOG, is_local
from databuild_assets.runtime.object_store import is_s3

# Dagster's sensor daemon loops every 5 s and evaluates a sensor when its minimum interval has
# passed since its last tick. With 5 here, the last tick (stamped a little after its loop began) is
# often just short of 5 s old at the next loop, so every other loop skipped it: ticks came 10 s
# apart. Under the loop's period, the sensor is evaluated at every loop. This sensor's tick lists
# one folder and starts no JVM; the event-log sensor shares the interval.
SENSOR_INTERVAL_SECONDS = 1
# A run in these states has not listed the landing folder yet: it will ingest what lands meanwhile.
NOT_YET_LISTED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]


@sensor(
    job=ingest_and_refresh_job,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    description="Requests ingestion and a refresh of the filtered log and projections when the landing folder changes.",
)
def landing_files_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    landing = lakehouse.lake.landing
    if not (is_local(landing) or is_s3(landing)):
        return SkipReason(f"{landing} is neither on a local disk nor on S3: schedule ingest_job instead of this sensor")
    state = landing_state(landing)
    if state is None or state.fingerprint == context.cursor:
        return SkipReason(f"no new landing files in {landing}")
    lake = lakehouse.lake
    for table in (RAW_EVENT_LOG, INGEST_LEDGER):
        # An ingestion over a commit that does not parse would only fail: say which file, and keep
        # the cursor, so that the tick after a repair requests the run.
        path = lake.table_path(table)
        newest = latest_version_on_disk(path) if is_local(path) else None  # on S3: the run reports it
        if newest is not None and (damage := new_commits_damage(path, newest - 1, newest)) is not None:
            return SkipReason(str(damage))
    # Ingestion takes every file not yet ingested, so one run per change of the folder is enough,
    # and none while one waits to start: when runs take longer than files take to land, a run per
    # change would pile up in the queue, ahead of compaction and erasures (bench.soak found it).
    # The cursor stays, so the first tick after that run starts requests the files it missed.
    waiting = context.instance.get_run_records(
        RunsFilter(job_name=ingest_and_refresh_job.name, statuses=NOT_YET_LISTED), limit=1
    )
    if waiting:
        run = waiting[0].dagster_run
        return SkipReason(f"{run.job_name} run {run.run_id} is waiting to start; it will ingest the new landing files")
    context.log.info(f"{landing}: {state.files} landing files, {state.waiting} still being written")
    return SensorResult(run_requests=[RunRequest(run_key=f"landing-{state.fingerprint}")], cursor=state.fingerprint)
