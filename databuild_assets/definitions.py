"""Assembles the Dagster definitions; each domain's assets live under defs/<domain>/."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.resources import LakehouseResource

# Every asset, in one run (the main job of the README).
all_assets_job = define_asset_job(
    "all_assets_job", selection=AssetSelection.all() - AssetSelection.assets(landing_files.key)
)

defs = Definitions(
    assets=[landing_files, ingested_event_log],
    jobs=[all_assets_job],
    resources={"lakehouse": LakehouseResource.from_env()},
    # One process per run, so one JVM per run: a SparkSession cannot be shared across processes.
    executor=in_process_executor,
)
