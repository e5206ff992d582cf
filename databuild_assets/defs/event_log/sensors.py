"""The landing-files sensor: a change in <lake root>/landing requests one ingestion run."""

from dagster import RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.event_log.jobs import ingest_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing_state import landing_state
from databuild_assets.runtime.lake import is_local


@sensor(job=ingest_job, minimum_interval_seconds=30, description="Requests ingestion when the landing folder changes.")
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
