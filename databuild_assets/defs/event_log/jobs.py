"""The ingestion job: what the landing-files sensor requests."""

from dagster import AssetSelection, define_asset_job

from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.assets(RAW_EVENT_LOG.name, EVENT_QUARANTINE.name),
    description="Ingest new landing files into raw_event_log and event_quarantine.",
)
