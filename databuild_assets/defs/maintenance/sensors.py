"""The compaction sensor: compaction by file count, beside the daily schedule. When the raw log
has gained DATABUILD_COMPACT_AT_FILES data files since its last whole-table bin-pack, request one
compaction_job run that packs every date (`open_days=0`), unless a compaction run is in flight.
The count is read from the Delta log without a JVM (maintenance/compaction_trigger.py)."""

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from databuild_assets.defs.event_log.sensors import SENSOR_INTERVAL_SECONDS
from databuild_assets.defs.maintenance.jobs import compaction_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.maintenance.compaction_trigger import (
    COMPACT_AT_FILES_ENV,
    DamagedCommitError,
    FilesSincePack,
    compact_at_files,
    files_since_pack,
)
from databuild_assets.runtime.lake import RAW_EVENT_LOG, is_local

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
PACK_EVERY_DATE = {"ops": {"compact_lake": {"config": {"open_days": 0}}}}


@sensor(
    job=compaction_job,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    # On by default, as the maintenance schedules are: it launches nothing until a service has
    # left that many small files, and then it is what keeps an open of the raw log cheap.
    default_status=DefaultSensorStatus.RUNNING,
    description=f"Requests compaction of every date when the raw log has gained {COMPACT_AT_FILES_ENV} data files "
    "since its last whole-table bin-pack.",
)
def compaction_by_file_count_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    lake = lakehouse.lake
    path = lake.table_path(RAW_EVENT_LOG)
    if not is_local(path):
        return SkipReason(
            f"{path} is not on a local disk: this sensor counts files on a local lake only; "
            "set DATABUILD_COMPACTION_CRON to compact more often"
        )
    threshold = compact_at_files()
    previous = FilesSincePack.parse(context.cursor)
    try:
        count = files_since_pack(path, previous, stop_above=threshold)
    except DamagedCommitError as damage:
        return SkipReason(str(damage))  # the cursor stays: counted again once repaired
    if count is None:
        return SkipReason(f"no event log at {path} yet")
    state = f"{count.files} files added to raw_event_log since its last whole-table bin-pack (v{count.version})"
    if count.files < threshold:
        return SensorResult(skip_reason=f"{state}; compaction at {threshold}", cursor=count.cursor())
    in_flight = [
        record.dagster_run
        for record in context.instance.get_run_records(RunsFilter(statuses=IN_FLIGHT, job_name=compaction_job.name))
    ]
    if in_flight:
        run = in_flight[0]
        return SensorResult(skip_reason=f"{state}; compaction run {run.run_id} is in flight", cursor=count.cursor())
    if count.requested_at is not None and count.files < count.requested_at + threshold:
        # The run requested then ended without a whole-table bin-pack (it failed, or was
        # cancelled): ask again only after as many files again, not every tick.
        return SensorResult(
            skip_reason=f"{state}; the compaction requested at {count.requested_at} files packed nothing, "
            f"requested again at {count.requested_at + threshold}",
            cursor=count.cursor(),
        )
    context.log.info(f"{state}: requesting compaction of every date")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_config=PACK_EVERY_DATE,
                tags={
                    "databuild/raw_log_files_since_pack": str(count.files),
                    "databuild/log_version": str(count.version),
                },
            )
        ],
        cursor=count.requested().cursor(),
    )
