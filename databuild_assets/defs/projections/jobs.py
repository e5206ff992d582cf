"""The projection refresh job: what the raw-log sensor requests."""

from dagster import AssetSelection, define_asset_job

from databuild_assets.projections import PROJECTIONS

refresh_projections_job = define_asset_job(
    "refresh_projections_job",
    selection=AssetSelection.assets(*PROJECTIONS),
    description="Fold the event log's new commits into every projection.",
)
