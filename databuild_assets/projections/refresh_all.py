"""Refreshing every projection from the log they are read from: what compaction, the maintenance
jobs, the tests and the benchmarks call to bring them all up to date. (The projections asset
refreshes the subset a run selects, from the same source.)

    results = refresh_all_projections(spark, lake)
    results["partition_state"].mode  # "full", "incremental" or "up-to-date"
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import RebuildRule, RefreshResult, refresh_projections
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
