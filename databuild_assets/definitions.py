"""Assembles the Dagster definitions; each domain's assets, checks, jobs and sensors live under defs/<domain>/.

What depends on the deployment is read from the environment here, once: the lakehouse resource
(Spark master, lake root) and the catalog settings (owners, freshness bound). The assets' catalog
URIs come from the same lake root the resource is built with.
"""

import os

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from databuild_assets.defs.catalog import CatalogSettings, in_catalog
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.event_log.jobs import ingest_and_refresh_job, ingest_job
from databuild_assets.defs.event_log.sensors import landing_files_sensor
from databuild_assets.defs.maintenance.assets import filtered_event_log, tombstones
from databuild_assets.defs.maintenance.checks import check_lake_job, lake_checks
from databuild_assets.defs.maintenance.jobs import compaction_job, erase_job, erasure_report_job, vacuum_job
from databuild_assets.defs.maintenance.schedules import check_lake_schedule, compaction_schedule, vacuum_schedule
from databuild_assets.defs.projections.assets import projection_assets
from databuild_assets.defs.projections.checks import projection_asset_checks
from databuild_assets.defs.projections.freshness import projection_freshness_checks, projection_freshness_schedule
from databuild_assets.defs.projections.jobs import refresh_projections_job
from databuild_assets.defs.projections.sensors import event_log_commits_sensor
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.defs.serving.assets import serving_index
from databuild_assets.runtime.file_modes import restrict_umask
from databuild_assets.runtime.instance_storage import refuse_psycopg3_storage
from databuild_assets.runtime.lake import Lake

# The code server and every run process load this module first: what they write (Dagster's compute
# logs, the lake, the serving index) is its owner's alone whatever umask they were started with.
restrict_umask()
# Before any run: storage in PostgreSQL under a URL dagster-postgres fails with (psycopg 3).
refuse_psycopg3_storage(os.environ.get("DAGSTER_HOME"))
lakehouse = LakehouseResource.from_env()
catalog = CatalogSettings.from_env()
# Lake(...), not lakehouse.lake: that one checks (and may create) the root, which loading must not do.
assets = in_catalog(
    [landing_files, ingested_event_log, tombstones, filtered_event_log, *projection_assets, serving_index],
    Lake(lakehouse.lake_root),
    catalog,
)
freshness_checks = projection_freshness_checks(catalog.max_projection_lag)
freshness_schedule = projection_freshness_schedule([freshness_checks, *projection_asset_checks], catalog.freshness_cron)

# Every asset, in one run (the main job of the README): ingestion, the filtered log, the projections.
all_assets_job = define_asset_job(
    "all_assets_job", selection=AssetSelection.all() - AssetSelection.assets(landing_files.key)
)

defs = Definitions(
    assets=assets,
    asset_checks=[*projection_asset_checks, freshness_checks, lake_checks],
    jobs=[
        all_assets_job,
        ingest_and_refresh_job,
        ingest_job,
        refresh_projections_job,
        erase_job,
        compaction_job,
        vacuum_job,
        erasure_report_job,
        check_lake_job,
    ],
    schedules=[compaction_schedule, vacuum_schedule, freshness_schedule, check_lake_schedule],
    sensors=[landing_files_sensor, event_log_commits_sensor],
    resources={"lakehouse": lakehouse},
    # One process per run, so one JVM per run: a SparkSession cannot be shared across processes.
    executor=in_process_executor,
)
