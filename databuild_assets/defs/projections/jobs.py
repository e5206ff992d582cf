"""The projection refresh job: what the raw-log sensor requests."""

from dagster import AssetSelection, define_asset_job

from databuild_assets.defs.serving.assets import SERVING_INDEX
from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG

refresh_projections_job = define_asset_job(
    "refresh_projections_job",
    selection=AssetSelection.assets(FILTERED_EVENT_LOG.name, *PROJECTIONS, SERVING_INDEX),
    description="Fold the event log's new commits and new tombstones into the filtered log, every projection "
    "and the serving index.",
)
