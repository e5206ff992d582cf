"""The ingestion jobs: what the landing-files sensor requests, and ingestion alone."""

from dagster import AssetSelection, define_asset_job

from databuild_assets.defs.serving.assets import SERVING_INDEX
from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import EVENT_QUARANTINE, FILTERED_EVENT_LOG, RAW_EVENT_LOG

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.assets(RAW_EVENT_LOG.name, EVENT_QUARANTINE.name),
    description="Ingest new landing files into raw_event_log and event_quarantine.",
)

# One run (one process, one JVM) from a landing file to what readers see: ingestion, then the
# filtered log and the projections. Two runs would pay the run's start, the JVM's and the first
# Delta jobs' twice, and wait for a second sensor tick in between. The projections' checks are
# left to their schedule (`projection_freshness_schedule`): they scan the whole log, and in this
# run they would hold the one run slot the next landing file waits for.
ingest_and_refresh_job = define_asset_job(
    "ingest_and_refresh_job",
    selection=AssetSelection.assets(
        RAW_EVENT_LOG.name, EVENT_QUARANTINE.name, FILTERED_EVENT_LOG.name, *PROJECTIONS, SERVING_INDEX
    ).without_checks(),
    description="Ingest new landing files, then fold them into the filtered log, every projection and the "
    "serving index (the projections' checks run on projection_freshness_schedule).",
)
