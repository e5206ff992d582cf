"""The projections: one asset each, refreshed by one step (a multi-asset) in waves: partition_state
first and alone, then the other selected ones side by side (`refresh_waves`); a full rebuild
refreshes them all at once. Each refresh is incremental unless a full rebuild is needed or asked."""

from dagster import AssetExecutionContext, AssetSpec, Config, MaterializeResult, MetadataValue, multi_asset
from pydantic import Field

from databuild_assets.defs.catalog import TABLE_KINDS
from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.metadata import delta_table_metadata, preview
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import Projection
from databuild_assets.projections.refresh import (
    ProjectionRefreshError,
    RefreshResult,
    projection_spec,
    refresh_projections,
)
from databuild_assets.projections.refresh_all import PROJECTION_SOURCE


class RefreshConfig(Config):
    full_rebuild: bool = Field(
        default=False,
        description="Rebuild the selected projections from the whole log instead of folding in new commits.",
    )


@multi_asset(
    name="projections",
    specs=[
        AssetSpec(
            name,
            deps=[PROJECTION_SOURCE.name],
            group_name="projections",
            kinds=TABLE_KINDS,
            tags={"databuild/layer": "projection", "databuild/erasure": "purged"},
            description=f"{projection_spec(projection).description} A pure function of the visible event log.",
        )
        for name, projection in PROJECTIONS.items()
    ],
    # Any subset: materializing one projection refreshes that one only.
    can_subset=True,
    # Refreshes of the projections never overlap: each MERGE builds on the version the last one recorded.
    pool="projections",
)
@reports_damage
def projections(context: AssetExecutionContext, config: RefreshConfig, lakehouse: LakehouseResource):
    """Refresh the selected projections from the filtered log: partition_state first, then the
    others side by side (`FIRST`); a full rebuild refreshes them all at once."""
    spark, lake = lakehouse.spark_session, lakehouse.lake
    selected = [PROJECTIONS[key.path[-1]] for key in sorted(context.selected_asset_keys)]
    waves = [selected] if config.full_rebuild else refresh_waves(selected)
    context.log.info("refreshing " + " then ".join(_wave_text(wave) for wave in waves))
    refreshed, failures, first_error = {}, {}, None
    for wave in waves:
        try:
            results = refresh_projections(spark, lake, wave, PROJECTION_SOURCE, full=config.full_rebuild)
        except ProjectionRefreshError as error:  # the others' refreshes stand: report them, then fail
            results, first_error = error.results, first_error or error.__cause__
            failures.update(error.failures)
        refreshed.update(results)
        for result in results.values():
            yield _materialization(context, spark, lake, result)
    if failures:
        raise ProjectionRefreshError(refreshed, failures) from first_error


# Refreshed before the others, alone: partition_state is what a DataBuild service reads to decide
# what to build, so a landing file's run makes it fresh first instead of sharing two cores with
# the other two folds (docs/decisions/0016-partition-state-first.md).
FIRST = ("partition_state",)


def refresh_waves(selected: list[Projection]) -> list[list[Projection]]:
    """`selected` in the order the asset refreshes them: those in `FIRST`, then the rest at once."""
    first = [p for p in selected if p.name in FIRST]
    rest = [p for p in selected if p.name not in FIRST]
    return [wave for wave in (first, rest) if wave]


def _wave_text(wave: list[Projection]) -> str:
    names = ", ".join(p.name for p in wave)
    return f"{names} (side by side)" if len(wave) > 1 else names


# What a projection's preview shows: statuses, times and counts. Its keys, the ids it holds and
# its free text (reasons, job configs) are what a tombstone names, so they stay out (`preview`).
PREVIEW_COLUMNS: dict[str, tuple[str, ...]] = {
    "partition_state": ("status_name", "is_available", "invalidated", "updated_at", "event_count"),
    "job_runs": ("job_label", "status_name", "started_at", "ended_at", "duration_ns"),
    "build_requests": ("status_name", "received_at", "ended_at", "duration_ns", "partition_counts"),
}


def _materialization(context: AssetExecutionContext, spark, lake, result: RefreshResult) -> MaterializeResult:
    projection = PROJECTIONS[result.projection]
    context.log.info(
        f"{projection.name}: {result.mode} refresh ({result.reason}); "
        f"log version {result.from_version} -> {result.to_version}"
    )
    path = lake.table_path(projection_spec(projection))
    return MaterializeResult(
        asset_key=projection.name,
        metadata={
            "refresh_mode": MetadataValue.text(result.mode),
            "refresh_reason": MetadataValue.text(result.reason),
            "log_version_processed": MetadataValue.int(result.to_version),
            "log_version_before": MetadataValue.int(-1 if result.from_version is None else result.from_version),
            "keys_refreshed": MetadataValue.int(result.keys_refreshed or 0),
            **delta_table_metadata(spark, path),
            "preview": preview(spark, path, list(PREVIEW_COLUMNS[projection.name])),
        },
    )


projection_assets = [projections]
