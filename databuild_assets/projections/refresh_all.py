"""Refreshing every projection from the log they are read from: what compaction, the maintenance
jobs, the tests and the benchmarks call to bring them all up to date. (The projections asset
refreshes the subset a run selects, from the same source.)

    results = refresh_all_projections(spark, lake)
    results["partition_state"].mode  # "full", "incremental" or "up-to-date"
    reflected_versions_on_disk(lake)  # (raw log, tombstones) versions every reader sees, no JVM
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import (
    RebuildRule,
    RefreshResult,
    projection_spec,
    recorded_log_version,
    refresh_projections,
)
from databuild_assets.runtime.commits import latest_commit_metadata_on_disk
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, Lake

# The table the projections read: the visible (tombstone-filtered) log, so that no projection
# holds an event a tombstone hides.
PROJECTION_SOURCE = FILTERED_EVENT_LOG


def refresh_all_projections(
    spark: SparkSession, lake: Lake, full: bool = False, rule: RebuildRule = RebuildRule()
) -> dict[str, RefreshResult]:
    """Bring every projection up to date with the filtered log, side by side
    (`refresh_projections`); their results by name.

    Refreshes the projections only: the filtered log is maintenance's to refresh
    (`maintenance.filtered_log.refresh_filtered_log`), first, when the raw log has changed.
    Raises ProjectionRefreshError once all have finished if any failed.
    """
    return refresh_projections(spark, lake, PROJECTIONS.values(), PROJECTION_SOURCE, full=full, rule=rule)


def reflected_versions_on_disk(lake: Lake) -> tuple[int, int] | None:
    """The raw log and tombstones versions that the filtered log and every projection reflect,
    read from their newest commits' metadata on a local disk without a JVM (for sensors): the
    filtered log's recorded versions, when every projection's latest refresh processed the
    filtered log's latest version. None when that is not so or not known (a table missing, a
    projection behind, a commit of another kind since, the commits no longer on disk)."""
    filtered_version, filtered = latest_commit_metadata_on_disk(
        lake.table_path(PROJECTION_SOURCE), lambda m: "raw_log_version" in m and "tombstones_version" in m
    )
    if filtered is None:
        return None
    for projection in PROJECTIONS.values():
        _, metadata = latest_commit_metadata_on_disk(
            lake.table_path(projection_spec(projection)), lambda m, name=projection.name: m.get("projection") == name
        )
        if recorded_log_version(metadata) != filtered_version:
            return None
    return int(filtered["raw_log_version"]), int(filtered["tombstones_version"])
