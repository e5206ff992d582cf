"""raw_event_log and event_quarantine: both written by one ingestion step, so one multi-asset."""

from dagster import AssetExecutionContext, AssetSpec, MaterializeResult, MetadataValue, multi_asset

from databuild_assets.defs.catalog import TABLE_KINDS
from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.metadata import delta_table_metadata, preview
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG

landing_files = AssetSpec(
    "landing_files",
    description="JSON Lines files that DataBuild writers drop under <lake root>/landing (written to a "
    "hidden name, then renamed). Not materialized here: they arrive from outside.",
    group_name="event_log",
    kinds={"json"},
    tags={"databuild/layer": "landing"},
)


@multi_asset(
    specs=[
        AssetSpec(
            RAW_EVENT_LOG.name,
            description=RAW_EVENT_LOG.description,
            deps=[landing_files],
            group_name="event_log",
            kinds=TABLE_KINDS,
            tags={"databuild/layer": "raw", "databuild/erasure": "purged"},
        ),
        AssetSpec(
            EVENT_QUARANTINE.name,
            description=EVENT_QUARANTINE.description,
            deps=[landing_files],
            group_name="event_log",
            kinds=TABLE_KINDS,
            tags={"databuild/layer": "quarantine", "databuild/erasure": "purged"},
        ),
    ],
    # One ingestion at a time: a second would only find the first one's files taken.
    pool="databuild_ingest",
)
@reports_damage
def ingested_event_log(context: AssetExecutionContext, lakehouse: LakehouseResource):
    """Ingest every landing file not ingested yet, exactly once (see ingest/landing.py)."""
    spark, lake = lakehouse.spark_session, lakehouse.lake
    result = ingest_landing_files(spark, lake)
    for batch in result.batches:
        context.log.info(
            f"batch {batch.batch_id}{' (replayed after a crash)' if batch.replayed else ''}: "
            f"{len(batch.files)} files, {batch.lines_read} lines -> {batch.accepted} accepted, "
            f"{batch.duplicates} duplicates skipped, {batch.quarantined} quarantined"
        )
    for refusal in result.refused:  # "skipped <path>: <reason>" or "quarantined <path>: <reason>"
        context.log.warning(refusal)
    if not result.batches:
        context.log.info(f"no new landing files in {lake.landing}")
    counts = {
        "files_ingested": MetadataValue.int(len(result.files)),
        "files_not_read": MetadataValue.int(len(result.refused)),
        "lines_read": MetadataValue.int(result.lines_read),
        "accepted": MetadataValue.int(result.accepted),
        "duplicates_skipped": MetadataValue.int(result.duplicates),
        "quarantined": MetadataValue.int(result.quarantined),
    }
    log_path, quarantine_path = lake.table_path(RAW_EVENT_LOG), lake.table_path(EVENT_QUARANTINE)
    yield MaterializeResult(
        asset_key=RAW_EVENT_LOG.name,
        metadata={
            **counts,
            # Landing folder entries left unread (links, FIFOs, other users' files, unreadable names).
            **(
                {"files_not_read_why": MetadataValue.md("\n".join(f"- `{r}`" for r in result.refused))}
                if result.refused
                else {}
            ),
            **delta_table_metadata(spark, log_path),
            # Where the newest events came from, and what they are; not their ids (`preview`).
            "preview": preview(
                spark,
                log_path,
                ["timestamp", "event_type", "event_date", "source_file", "source_line"],
                newest_by="timestamp",
            ),
        },
    )
    yield MaterializeResult(
        asset_key=EVENT_QUARANTINE.name,
        metadata={
            **counts,
            **delta_table_metadata(spark, quarantine_path),
            # A reason may quote a field of the bad line: compaction_job erases a value from it in
            # Dagster's storage (maintenance/dagster_home.py).
            "preview": preview(
                spark, quarantine_path, ["source_file", "line_number", "reason"], newest_by="quarantined_at"
            ),
        },
    )
