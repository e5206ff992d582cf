"""Maintenance jobs: erase (an erasure request from the launchpad), compaction, vacuum, and the
erasure report. Compaction and vacuum share the `lake_maintenance` pool: never both at once."""

import os

from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    MetadataValue,
    OpExecutionContext,
    Output,
    RetryRequested,
    define_asset_job,
    job,
    op,
)
from delta.exceptions import DeltaConcurrentModificationException
from pydantic import Field

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.erasure_report import erasure_report, format_report
from databuild_assets.maintenance.vacuum import DEFAULT_RETENTION_HOURS, vacuum_lake
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import refresh_projections
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, INGEST_LEDGER, TOMBSTONES

# Tables of the lake that are not assets: ingestion's bookkeeping. Maintenance reports their
# figures in the op's output metadata only; a materialization on them would make the UI show an
# asset no definition declares.
NOT_ASSETS = frozenset({INGEST_LEDGER.name})


def _markdown_table(header: tuple[str, ...], rows: list[tuple]) -> MetadataValue:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return MetadataValue.md("\n".join(lines))

# Records the tombstone, then hides its events at once: the filtered log and the projections.
erase_job = define_asset_job(
    "erase_job",
    selection=AssetSelection.assets(TOMBSTONES.name, FILTERED_EVENT_LOG.name, *PROJECTIONS),
    description="Record an erasure request (ops.tombstones.config) and hide the matching events at once.",
)


def refresh_all_projections(spark, lake) -> None:
    refresh_projections(spark, lake, PROJECTIONS.values(), FILTERED_EVENT_LOG)


class CompactionConfig(Config):
    open_days: int = Field(default=2, description="Most recent event dates left out of bin-packing (writers may append).")


@op(pool="lake_maintenance")
def compact_lake(context: OpExecutionContext, config: CompactionConfig, lakehouse: LakehouseResource):
    """Purge pending tombstones from every table (verified first), then bin-pack small files."""
    spark, lake = lakehouse.spark_session, lakehouse.lake
    try:
        result = compact(spark, lake, open_days=config.open_days, refresh_projections=refresh_all_projections)
    except DeltaConcurrentModificationException as conflict:
        # Delta's own retries (8 per write) ran out: try the whole run again later.
        raise RetryRequested(max_retries=3, seconds_to_wait=60) from conflict
    for table in result.tables:
        if table.table in NOT_ASSETS:
            continue
        yield AssetMaterialization(
            asset_key=table.table,
            description="compaction",
            metadata={
                "files_before": MetadataValue.int(table.before.num_files),
                "files_after": MetadataValue.int(table.after.num_files),
                "bytes_before": MetadataValue.int(table.before.size_bytes),
                "bytes_after": MetadataValue.int(table.after.size_bytes),
                "version_before": MetadataValue.int(table.before.version),
                "version_after": MetadataValue.int(table.after.version),
                "rows_purged": MetadataValue.int(table.rows_purged),
                "files_compacted": MetadataValue.int(table.files_compacted),
            },
        )
    context.log.info(f"tombstones applied: {len(result.applied)}; rows purged per tombstone: {result.rows_purged_per_tombstone}")
    yield Output(None, metadata={
        "tombstones_applied": MetadataValue.int(len(result.applied)),
        "rows_purged_per_tombstone": MetadataValue.json(result.rows_purged_per_tombstone),
        "tables": _markdown_table(
            ("table", "files before", "files after", "bytes before", "bytes after", "rows purged", "files compacted"),
            [(t.table, t.before.num_files, t.after.num_files, t.before.size_bytes, t.after.size_bytes,
              t.rows_purged, t.files_compacted) for t in result.tables],
        ),
    })


@job(description="Daily: purge what tombstones match from every table, and bin-pack small files.")
def compaction_job():
    compact_lake()


# A minimum raised above the default retention raises the default with it: otherwise the
# scheduled vacuum (default config) would refuse to run.
_MINIMUM_RETENTION_HOURS = float(os.environ.get("DATABUILD_VACUUM_MIN_RETENTION_HOURS", DEFAULT_RETENTION_HOURS))


class VacuumConfig(Config):
    retention_hours: float = Field(
        default=max(DEFAULT_RETENTION_HOURS, _MINIMUM_RETENTION_HOURS), description="Keep files younger than this."
    )
    minimum_retention_hours: float = Field(
        default=_MINIMUM_RETENTION_HOURS,
        description="A shorter retention is refused unless allow_short_retention is set.",
    )
    allow_short_retention: bool = Field(default=False, description="Override the minimum (logged as a warning).")


@op(pool="lake_maintenance")
def vacuum_tables(context: OpExecutionContext, config: VacuumConfig, lakehouse: LakehouseResource):
    """Delete files older than the retention that no table version within it needs."""
    if config.allow_short_retention and config.retention_hours < config.minimum_retention_hours:
        context.log.warning(
            f"vacuum retention {config.retention_hours} h is below the minimum {config.minimum_retention_hours} h: "
            "override allow_short_retention is set"
        )
    results = vacuum_lake(lakehouse.spark_session, lakehouse.lake, config.retention_hours,
                          config.minimum_retention_hours, config.allow_short_retention)
    for table in results:
        if table.table in NOT_ASSETS:
            continue
        yield AssetMaterialization(
            asset_key=table.table, description="vacuum",
            metadata={"files_deleted": MetadataValue.int(table.files_deleted), "bytes_deleted": MetadataValue.int(table.bytes_deleted)},
        )
    yield Output(None, metadata={
        "files_deleted": MetadataValue.int(sum(t.files_deleted for t in results)),
        "bytes_deleted": MetadataValue.int(sum(t.bytes_deleted for t in results)),
        "tables": _markdown_table(("table", "files deleted", "bytes deleted"),
                                  [(t.table, t.files_deleted, t.bytes_deleted) for t in results]),
    })


@job(description="Weekly: remove files older than the retention (default 168 h).")
def vacuum_job():
    vacuum_tables()


@op
def report_erasure(context: OpExecutionContext, lakehouse: LakehouseResource):
    """Scan every data file for every tombstone's value; any row found fails the op."""
    findings = erasure_report(lakehouse.spark_session, lakehouse.lake)
    context.log.info("\n" + format_report(findings))
    remaining = sum(f.rows_in_data_files + f.delta_log_mentions for f in findings)
    yield Output(None, metadata={"report": MetadataValue.md("```\n" + format_report(findings) + "\n```"),
                                 "rows_still_holding_values": MetadataValue.int(remaining)})
    if remaining:
        raise RuntimeError(f"{remaining} rows or log entries still hold an erased value; see the report")


@job(description="Proof of erasure: scan the disk for every tombstone's value.")
def erasure_report_job():
    report_erasure()
