"""The landing-files sensor: a change in <lake root>/landing requests one run that ingests the new
files and refreshes the filtered log and the projections."""

from dagster import RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.event_log.jobs import ingest_and_refresh_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing_state import landing_state
from databuild_assets.runtime.lake import is_local

# Dagster's sensor daemon loops every 5 s and evaluates a sensor when its minimum interval has
# passed since its last tick. With 5 here, the last tick (stamped a little after its loop began) is
# often just short of 5 s old at the next loop, so every other loop skipped it: ticks came 10 s
# apart. Under the loop's period, the sensor is evaluated at every loop. This sensor's tick lists
# one folder and starts no JVM; the event-log sensor shares the interval.
SENSOR_INTERVAL_SECONDS = 1


@sensor(
    job=ingest_and_refresh_job,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    description="Requests ingestion and a refresh of the filtered log and projections when the landing folder changes.",
)
def landing_files_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    landing = lakehouse.lake.landing
    if not is_local(landing):
        return SkipReason(f"{landing} is not on a local disk: schedule ingest_job instead of this sensor")
    state = landing_state(landing)
    if state is None or state.fingerprint == context.cursor:
        return SkipReason(f"no new landing files in {landing}")
    # Ingestion takes every file not yet ingested, so one run per change of the folder is enough.
    context.log.info(f"{landing}: {state.files} landing files, {state.waiting} still being written")
    return SensorResult(run_requests=[RunRequest(run_key=f"landing-{state.fingerprint}")], cursor=state.fingerprint)
