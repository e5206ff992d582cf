"""tombstones (erasure requests) and filtered_event_log (the log minus what they match)."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from databuild_assets.defs.catalog import TABLE_KINDS
from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.metadata import delta_table_metadata
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import TOMBSTONE_KEYS, read_tombstones, request_erasures, validate_request
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES


class ErasureRequest(Config):
    """An erasure request, as typed in the launchpad. Leave all empty to only report the table."""

    key: str | None = Field(default=None, description=f"What the value is: one of {', '.join(TOMBSTONE_KEYS)}.")
    value: str | None = Field(default=None, description="The value to erase, e.g. a partition_ref.")
    values: list[str] | None = Field(
        default=None, description="Several values of the same key, erased by one request (one commit, one refresh)."
    )
    actor: str | None = Field(default=None, description="Who asks (kept in the audit record).")
    reason: str | None = Field(default=None, description="Why (kept in the audit record), e.g. a ticket.")


@asset(
    name=TOMBSTONES.name,
    group_name="maintenance",
    description=TOMBSTONES.description,
    kinds=TABLE_KINDS,
    # The audit record keeps each erased value on purpose; erasure scans everything else.
    tags={"databuild/layer": "audit", "databuild/erasure": "kept"},
)
@reports_damage
def tombstones(
    context: AssetExecutionContext, config: ErasureRequest, lakehouse: LakehouseResource
) -> MaterializeResult:
    spark, lake = lakehouse.spark_session, lakehouse.lake
    values = [*([config.value] if config.value is not None else []), *(config.values or [])]
    given = {"key": config.key, "actor": config.actor, "reason": config.reason}
    recorded = []
    if values or any(v is not None for v in given.values()):
        # Refused requests raise TombstoneError before anything is written.
        for value in values or [""]:
            validate_request(value=value, **{k: v or "" for k, v in given.items()})
        recorded = request_erasures(spark, lake, values=values, **given)
        context.log.info(
            f"{len(recorded)} tombstone(s) ({recorded[0].tombstone_id}...): {config.key} erased by {config.actor} "
            f"({config.reason})"
        )
    all_tombstones = read_tombstones(spark, lake)
    return MaterializeResult(
        metadata={
            "recorded_tombstone_id": MetadataValue.text(
                ", ".join(t.tombstone_id for t in recorded) if recorded else "(none: report only)"
            ),
            "recorded_tombstones": MetadataValue.int(len(recorded)),
            "tombstones": MetadataValue.int(len(all_tombstones)),
            "pending": MetadataValue.int(sum(t.pending for t in all_tombstones)),
            "applied": MetadataValue.int(sum(not t.pending for t in all_tombstones)),
            **delta_table_metadata(spark, lake.table_path(TOMBSTONES)),
        }
    )


class FilteredLogConfig(Config):
    full_rebuild: bool = Field(default=False, description="Rebuild from the whole raw log.")


@asset(
    name=FILTERED_EVENT_LOG.name,
    deps=[RAW_EVENT_LOG.name, TOMBSTONES.name],
    group_name="event_log",
    description=FILTERED_EVENT_LOG.description,
    kinds=TABLE_KINDS,
    tags={"databuild/layer": "filtered", "databuild/erasure": "purged"},
    pool="filtered_event_log",
)
@reports_damage
def filtered_event_log(
    context: AssetExecutionContext, config: FilteredLogConfig, lakehouse: LakehouseResource
) -> MaterializeResult:
    spark, lake = lakehouse.spark_session, lakehouse.lake
    result = refresh_filtered_log(spark, lake, full=config.full_rebuild)
    context.log.info(f"filtered_event_log: {result.mode} ({result.reason}); +{result.inserted} -{result.deleted} rows")
    path = lake.table_path(FILTERED_EVENT_LOG)
    return MaterializeResult(
        metadata={
            "refresh_mode": MetadataValue.text(result.mode),
            "refresh_reason": MetadataValue.text(result.reason),
            "rows_inserted": MetadataValue.int(result.inserted),
            "rows_hidden": MetadataValue.int(result.deleted),
            "raw_log_version": MetadataValue.int(result.raw_log_version),
            "tombstones_version": MetadataValue.int(result.tombstones_version),
            **delta_table_metadata(spark, path),
        }
    )
