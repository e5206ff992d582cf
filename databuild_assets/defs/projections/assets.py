"""One asset per projection; each refresh is incremental unless a full rebuild is needed or asked."""

from dagster import AssetExecutionContext, AssetsDefinition, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field
from pyspark.sql import functions as F

from databuild_assets.defs.metadata import delta_table_metadata, preview
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import Projection
from databuild_assets.projections.refresh import projection_spec, refresh_projection
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG

# The table the projections read: the visible (tombstone-filtered) log.
PROJECTION_SOURCE = FILTERED_EVENT_LOG


class RefreshConfig(Config):
    full_rebuild: bool = Field(default=False, description="Rebuild from the whole log instead of folding in new commits.")


def projection_asset(projection: Projection) -> AssetsDefinition:
    @asset(
        name=projection.name,
        deps=[PROJECTION_SOURCE.name],
        group_name="projections",
        description=f"{projection_spec(projection).description} A pure function of the visible event log.",
        # A projection's refreshes never overlap: each MERGE builds on the version the last one recorded.
        pool=f"projection_{projection.name}",
    )
    def refresh(context: AssetExecutionContext, config: RefreshConfig, lakehouse: LakehouseResource) -> MaterializeResult:
        spark, lake = lakehouse.spark_session, lakehouse.lake
        result = refresh_projection(spark, lake, projection, PROJECTION_SOURCE, full=config.full_rebuild)
        context.log.info(
            f"{projection.name}: {result.mode} refresh ({result.reason}); "
            f"log version {result.from_version} -> {result.to_version}"
        )
        path = lake.table_path(projection_spec(projection))
        table = spark.read.format("delta").load(path)
        return MaterializeResult(
            metadata={
                "refresh_mode": MetadataValue.text(result.mode),
                "refresh_reason": MetadataValue.text(result.reason),
                "log_version_processed": MetadataValue.int(result.to_version),
                "log_version_before": MetadataValue.int(-1 if result.from_version is None else result.from_version),
                "keys_refreshed": MetadataValue.int(result.keys_refreshed or 0),
                **delta_table_metadata(spark, path),
                "dagster/row_count": MetadataValue.int(table.count()),
                "preview": preview(table.orderBy(F.col(projection.key))),
            }
        )

    return refresh


projection_assets = [projection_asset(projection) for projection in PROJECTIONS.values()]
