"""Maintenance jobs: erase (an erasure request from the launchpad), compaction (the lake, the
serving index, then Dagster's own storage), vacuum (with the landing files' retention), and the
erasure report. Compaction and vacuum share the `lake_maintenance` pool: never both at once."""

import os
from typing import Literal

from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    In,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Output,
    RetryRequested,
    define_asset_job,
    job,
    op,
)
from delta.exceptions import DeltaConcurrentModificationException
from pydantic import Field

from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.defs.serving.assets import SERVING_INDEX, serving_index_metadata
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.dagster_home import ERASE_JOB, ERASED, scrub_dagster_home, storage_notes
from databuild_assets.maintenance.erasure_report import erasure_report, format_report
from databuild_assets.maintenance.landing_files import (
    DEFAULT_RETENTION_DAYS,
    DEFAULT_RETENTION_MODE,
    RETENTION_MODES,
    retain_landing_files,
)
from databuild_assets.maintenance.tombstones import read_tombstones
from databuild_assets.maintenance.vacuum import DEFAULT_RETENTION_HOURS, vacuum_lake
from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, INGEST_LEDGER, TOMBSTONES, is_local

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
    ERASE_JOB,
    selection=AssetSelection.assets(TOMBSTONES.name, FILTERED_EVENT_LOG.name, *PROJECTIONS, SERVING_INDEX),
    description="Record an erasure request (ops.tombstones.config) and hide the matching events at once.",
)


class CompactionConfig(Config):
    open_days: int = Field(
        default=2,
        ge=0,
        description="Most recent event dates left out of bin-packing (writers may append); 0 packs every date "
        "(what compaction_by_file_count_sensor requests).",
    )


@op(pool="lake_maintenance")
@reports_damage
def compact_lake(context: OpExecutionContext, config: CompactionConfig, lakehouse: LakehouseResource):
    """Purge pending tombstones from every table (verified first), then bin-pack small files."""
    spark, lake = lakehouse.spark_session, lakehouse.lake
    try:
        result = compact(spark, lake, open_days=config.open_days)
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
                "files_rewritten": MetadataValue.int(table.files_rewritten),
                "files_compacted": MetadataValue.int(table.files_compacted),
            },
        )
    landing = result.landing
    context.log.info(
        f"tombstones applied: {len(result.applied)}; rows purged per tombstone: {result.rows_purged_per_tombstone}"
    )
    context.log.info(
        f"landing files: {landing.files_scanned} ingested or archived files read, {landing.files_parsed} of them "
        f"parsed (the others hold no erased value), {landing.files_rewritten} rewritten "
        f"into the archive, {landing.files_removed} removed (every line erased), "
        f"{landing.lines_removed} lines removed; "
        f"{landing.not_ingested} not ingested yet and {len(landing.changed)} changed since ingestion, not read"
    )
    yield Output(
        None,
        metadata={
            "tombstones_applied": MetadataValue.int(len(result.applied)),
            "landing_files_read": MetadataValue.int(landing.files_scanned),
            "landing_files_parsed": MetadataValue.int(landing.files_parsed),
            "landing_files_rewritten": MetadataValue.int(landing.files_rewritten),
            "landing_files_removed": MetadataValue.int(landing.files_removed),
            "landing_lines_removed": MetadataValue.int(landing.lines_removed),
            "landing_files_not_ingested": MetadataValue.int(landing.not_ingested),
            "rows_purged_per_tombstone": MetadataValue.json(result.rows_purged_per_tombstone),
            "phase_seconds": MetadataValue.json(result.phase_seconds),
            "tables": _markdown_table(
                (
                    "table",
                    "files before",
                    "files after",
                    "bytes before",
                    "bytes after",
                    "rows purged",
                    "files rewritten by the purge",
                    "files compacted",
                ),
                [
                    (
                        t.table,
                        t.before.num_files,
                        t.after.num_files,
                        t.before.size_bytes,
                        t.after.size_bytes,
                        t.rows_purged,
                        f"{t.files_rewritten} of {t.before.num_files}",
                        t.files_compacted,
                    )
                    for t in result.tables
                ],
            ),
        },
    )


@op(ins={"compacted": In(Nothing)})
@reports_damage
def refresh_index_after_compaction(context: OpExecutionContext, lakehouse: LakehouseResource):
    """The serving index follows the purge: the erased events leave its file's bytes too."""
    lake = lakehouse.lake
    if is_local(lake.root):
        status = refresh_serving_index(lake, progress=context.log.info)
        context.log.info(f"serving_index: raw_event_log v{status.raw_log_version}, {status.events:,} visible events")
        yield AssetMaterialization(
            asset_key=SERVING_INDEX, description="compaction", metadata=serving_index_metadata(status)
        )
    yield Output(None)  # on any lake: Dagster's storage is scrubbed next


class DagsterHomeErasureError(RuntimeError):
    """Erased values remain in Dagster's storage after the scrub."""


@op(ins={"index_refreshed": In(Nothing)})
def scrub_dagster_home_after_compaction(context: OpExecutionContext, lakehouse: LakehouseResource):
    """Last: every tombstone's value leaves Dagster's own storage (run configs, events with their
    previews and log messages, ticks, compute logs of finished runs), rewritten to "[erased]",
    but the erase requests' own run records (maintenance/dagster_home.py)."""
    result = scrub_dagster_home(context.instance, read_tombstones(lakehouse.spark_session, lakehouse.lake))
    remaining = result.remaining
    if remaining is None:
        context.log.info("ephemeral Dagster instance (no DAGSTER_HOME): nothing stored to scrub")
        yield Output(None, metadata={"dagster_home": MetadataValue.text("(ephemeral instance)")})
        return
    context.log.info(
        f"DAGSTER_HOME {remaining.home}: {result.records_rewritten} stored records and "
        f"{len(result.compute_logs_rewritten)} compute logs rewritten to {ERASED}, "
        f"{len(result.databases_rebuilt)} databases rebuilt; {result.runs_in_progress} runs in progress "
        f"(their compute logs are read next time); {remaining.files_scanned} files scanned after, "
        f"{remaining.total} occurrences left"
    )
    for refused in result.not_reclaimed:
        context.log.warning(f"PostgreSQL storage: old row versions may stay on disk: {refused}")
    for note in remaining.notes:
        context.log.warning(note)
    embedded = sum(remaining.embedded.values())
    if embedded:
        context.log.warning(
            f"{embedded} occurrences of values accepted with allow_ambiguous are inside longer words under "
            f"DAGSTER_HOME and stay as they are: only whole tokens of those values are erased"
        )
    yield Output(
        None,
        metadata={
            "dagster_home": MetadataValue.path(remaining.home),
            "records_rewritten": MetadataValue.int(result.records_rewritten),
            "compute_logs_rewritten": MetadataValue.int(len(result.compute_logs_rewritten)),
            "databases_rebuilt": MetadataValue.int(len(result.databases_rebuilt)),
            "runs_in_progress": MetadataValue.int(result.runs_in_progress),
            "storage_not_scrubbed": MetadataValue.text(", ".join(result.not_scrubbed) or "(none)"),
            "files_scanned": MetadataValue.int(remaining.files_scanned),
            "occurrences_left": MetadataValue.int(remaining.total),
            "occurrences_inside_longer_words": MetadataValue.int(embedded),
            "postgres_not_reclaimed": MetadataValue.text("\n".join(result.not_reclaimed) or "(none)"),
            "outside_the_scan": MetadataValue.text("\n".join(remaining.notes) or "(none)"),
        },
    )
    if remaining.total:
        raise DagsterHomeErasureError(
            f"{remaining.total} occurrences of erased values remain under DAGSTER_HOME after the scrub, in: "
            f"{', '.join(remaining.files_holding)}. A run still in progress writes its compute logs (the next "
            "compaction reads them); otherwise a table or file this release does not rewrite holds them: delete "
            "those runs (`dagster run delete <run_id>`) or files, then run compaction_job again"
        )


@job(
    description="Daily: purge what tombstones match from every table and the serving index, bin-pack small "
    "files, and erase the values from Dagster's own storage."
)
def compaction_job():
    scrub_dagster_home_after_compaction(refresh_index_after_compaction(compact_lake()))


# A minimum raised above the default retention raises the default with it: otherwise the
# scheduled vacuum (default config) would refuse to run.
_MINIMUM_RETENTION_HOURS = float(os.environ.get("DATABUILD_VACUUM_MIN_RETENTION_HOURS", DEFAULT_RETENTION_HOURS))


def _landing_retention_from_env() -> tuple[float | None, str]:
    """DATABUILD_LANDING_RETENTION_DAYS (a number of days, or "off") and DATABUILD_LANDING_RETENTION_MODE."""
    days = os.environ.get("DATABUILD_LANDING_RETENTION_DAYS", str(DEFAULT_RETENTION_DAYS)).strip()
    mode = os.environ.get("DATABUILD_LANDING_RETENTION_MODE", DEFAULT_RETENTION_MODE).strip()
    if mode not in RETENTION_MODES:
        raise ValueError(f"DATABUILD_LANDING_RETENTION_MODE={mode!r}: expected one of {', '.join(RETENTION_MODES)}")
    if days.lower() == "off":
        return None, mode
    try:
        return float(days), mode
    except ValueError:
        raise ValueError(f"DATABUILD_LANDING_RETENTION_DAYS={days!r}: expected a number of days, or off") from None


_LANDING_RETENTION_DAYS, _LANDING_RETENTION_MODE = _landing_retention_from_env()


class VacuumConfig(Config):
    retention_hours: float = Field(
        default=max(DEFAULT_RETENTION_HOURS, _MINIMUM_RETENTION_HOURS), description="Keep files younger than this."
    )
    minimum_retention_hours: float = Field(
        default=_MINIMUM_RETENTION_HOURS,
        description="A shorter retention is refused unless allow_short_retention is set.",
    )
    allow_short_retention: bool = Field(default=False, description="Override the minimum (logged as a warning).")
    landing_retention_days: float | None = Field(
        default=_LANDING_RETENTION_DAYS,
        description="Ingested landing files older than this (days since their ingestion) are archived or deleted; "
        "null keeps them. Files not ingested yet are never touched.",
    )
    landing_retention_mode: Literal["archive", "delete"] = Field(
        default=_LANDING_RETENTION_MODE,
        description="archive: move them to <lake root>/landing_archive; delete: delete them,"
        " and archived files as old.",
    )


@op(pool="lake_maintenance")
@reports_damage
def vacuum_tables(context: OpExecutionContext, config: VacuumConfig, lakehouse: LakehouseResource):
    """Delete files older than the retention that no table version within it needs; then archive
    or delete the ingested landing files past the landing retention."""
    if config.allow_short_retention and config.retention_hours < config.minimum_retention_hours:
        context.log.warning(
            f"vacuum retention {config.retention_hours} h is below the minimum {config.minimum_retention_hours} h: "
            "override allow_short_retention is set"
        )
    results = vacuum_lake(
        lakehouse.spark_session,
        lakehouse.lake,
        config.retention_hours,
        config.minimum_retention_hours,
        config.allow_short_retention,
    )
    for table in results:
        if table.table in NOT_ASSETS:
            continue
        yield AssetMaterialization(
            asset_key=table.table,
            description="vacuum",
            metadata={
                "files_deleted": MetadataValue.int(table.files_deleted),
                "bytes_deleted": MetadataValue.int(table.bytes_deleted),
            },
        )
    landing = retain_landing_files(
        lakehouse.spark_session, lakehouse.lake, config.landing_retention_days, config.landing_retention_mode
    )
    context.log.info(
        f"landing retention ({landing.mode} after {landing.retention_days} days): {len(landing.archived)} archived, "
        f"{len(landing.deleted)} deleted; kept {landing.not_ingested} not ingested, {landing.younger} younger, "
        f"{len(landing.changed)} changed since ingestion, {len(landing.conflicts)} already in the archive"
    )
    yield Output(
        None,
        metadata={
            "landing_files_archived": MetadataValue.int(len(landing.archived)),
            "landing_files_deleted": MetadataValue.int(len(landing.deleted)),
            "landing_bytes_deleted": MetadataValue.int(landing.bytes_deleted),
            "landing_files_not_ingested": MetadataValue.int(landing.not_ingested),
            "files_deleted": MetadataValue.int(sum(t.files_deleted for t in results)),
            "bytes_deleted": MetadataValue.int(sum(t.bytes_deleted for t in results)),
            "tables": _markdown_table(
                ("table", "files deleted", "bytes deleted"),
                [(t.table, t.files_deleted, t.bytes_deleted) for t in results],
            ),
        },
    )


@job(
    description="Weekly: remove table files older than the retention (default 168 h), and archive or delete "
    "ingested landing files older than the landing retention (default 7 days, archive)."
)
def vacuum_job():
    vacuum_tables()


@op
@reports_damage
def report_erasure(context: OpExecutionContext, lakehouse: LakehouseResource):
    """Scan every data file, and every file under DAGSTER_HOME, for every tombstone's value; any
    row found fails the op."""
    findings = erasure_report(lakehouse.spark_session, lakehouse.lake, instance=context.instance)
    # What no scan here reads (a PostgreSQL server's archives and backups), said with the report.
    notes = storage_notes(context.instance)
    report = format_report(findings) + "".join(f"\nnot scanned: {note}" for note in notes)
    context.log.info("\n" + report)
    remaining = sum(f.rows_in_data_files + f.delta_log_mentions for f in findings)
    yield Output(
        None,
        metadata={
            "report": MetadataValue.md("```\n" + report + "\n```"),
            "rows_still_holding_values": MetadataValue.int(remaining),
        },
    )
    if remaining:
        raise RuntimeError(f"{remaining} rows or log entries still hold an erased value; see the report")


@job(description="Proof of erasure: scan the disk for every tombstone's value.")
def erasure_report_job():
    report_erasure()
