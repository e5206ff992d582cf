"""tombstones (erasure requests) and filtered_event_log (the log minus what they match)."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from dagster._check import CheckError  # what a step context without a code location raises
from pydantic import Field

from databuild_assets.defs.catalog import TABLE_KINDS
from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.metadata import delta_table_metadata
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.maintenance.erasure_values import AmbiguousValueError, ambiguous_values, overridden, refusal
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import TOMBSTONE_KEYS, read_tombstones, request_erasures, validate_request
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES

_STORED_RUNS_READ = 1000  # the latest runs: their job names, for `_deployment_names`


class ErasureRequest(Config):
    """An erasure request, as typed in the launchpad. Leave all empty to only report the table."""

    key: str | None = Field(default=None, description=f"What the value is: one of {', '.join(TOMBSTONE_KEYS)}.")
    value: str | None = Field(default=None, description="The value to erase, e.g. a partition_ref.")
    values: list[str] | None = Field(
        default=None, description="Several values of the same key, erased by one request (one commit, one refresh)."
    )
    actor: str | None = Field(default=None, description="Who asks (kept in the audit record).")
    reason: str | None = Field(default=None, description="Why (kept in the audit record), e.g. a ticket.")
    allow_ambiguous: bool = Field(
        default=False,
        description="Erase a value that would match more than its field (short, another field's value, or inside "
        "stored values), which is refused otherwise; recorded in the tombstone's reason, and text is then matched "
        "by whole tokens only.",
    )


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
        # Anyone who reaches the UI can launch this: a value that would match more than its
        # field is refused (one line), unless allow_ambiguous says so, recorded in the reason.
        problems = ambiguous_values(spark, lake, config.key, values, _deployment_names(context))
        if problems and not config.allow_ambiguous:
            raise AmbiguousValueError(refusal(problems))
        if problems:
            context.log.warning(f"allow_ambiguous: {refusal(problems)}")
        recorded = request_erasures(
            spark, lake, values=values, overridden=overridden(problems) if problems else None, **given
        )
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


def _deployment_names(context: AssetExecutionContext) -> dict[str, str]:
    """Names of Dagster's own records that no erasure may name: the deployment's jobs and assets
    (from its code location; a run in process has none, so this job's assets instead), and the
    job names of the latest runs Dagster stored (a run record's job_name)."""
    try:
        repository = context.repository_def
    except CheckError:  # no code location: a job executed in process
        jobs, assets = [context.job_def.name], context.job_def.asset_layer.asset_graph.get_all_asset_keys()
    else:
        jobs, assets = repository.job_names, repository.asset_graph.get_all_asset_keys()
    stored = {run.job_name for run in context.instance.get_runs(limit=_STORED_RUNS_READ)}
    names = {name: "a Dagster job's name" for name in (*jobs, *stored)}
    names.update({key.to_user_string(): "a Dagster asset's name" for key in assets})
    return names


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
