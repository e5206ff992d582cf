"""The serving index as an asset: what a live service's JVM-free reads answer from, kept current by
the same runs that refresh the projections, so that opening the log never pays a build."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from databuild_assets.defs.catalog import SERVING_INDEX
from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.log.serving.backend import ServingIndexStatus, refresh_serving_index
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, is_local


@asset(
    name=SERVING_INDEX,
    deps=[RAW_EVENT_LOG.name, TOMBSTONES.name],
    group_name="serving",
    kinds={"sqlite"},
    tags={"databuild/layer": "serving", "databuild/erasure": "purged"},
    description="The visible event log and its projections in SQLite under <lake root>/serving_index/, stamped "
    "with the raw log's and the tombstones' versions: what `open_event_log('delta:///...')` reads. Build requests "
    "that finished before the hot window (an hour of log time) are in Parquet segments under serving_index/segments/.",
    pool="serving_index",
)
@reports_damage
def serving_index(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    lake = lakehouse.lake
    if not is_local(lake.root):
        # On an object store each reading machine keeps its own index in its cache folder, built
        # and followed by its readers (log/serving/store.py: index_folder_of); none lives in the lake.
        context.log.info(f"{lake.root} is not on a local disk: its readers keep the serving index on their own disks")
        return MaterializeResult(metadata={"skipped": MetadataValue.text("lake not on a local disk")})
    status = refresh_serving_index(lake, progress=context.log.info)
    context.log.info(
        f"serving_index: raw_event_log v{status.raw_log_version}, tombstones v{status.tombstones_version}, "
        f"{status.events:,} visible events, {status.cold_build_requests:,} build requests cold in "
        f"{status.segments:,} segments ({status.segment_bytes:,} B)"
    )
    return MaterializeResult(metadata=serving_index_metadata(status))


def serving_index_metadata(status: ServingIndexStatus) -> dict[str, MetadataValue]:
    """What a materialization of the serving index reports (this asset's, and compaction's)."""
    return {
        "raw_log_version": MetadataValue.int(status.raw_log_version),
        "tombstones_version": MetadataValue.int(status.tombstones_version),
        "events": MetadataValue.int(status.events),
        "bytes": MetadataValue.int(status.bytes),
        "path": MetadataValue.path(status.path),
        "cold_build_requests": MetadataValue.int(status.cold_build_requests),
        "segments": MetadataValue.int(status.segments),
        "segment_bytes": MetadataValue.int(status.segment_bytes),
    }
