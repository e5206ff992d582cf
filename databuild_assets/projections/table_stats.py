"""What a projection table holds, measured against the log it was refreshed from: its rows and
distinct keys, rows whose status code is not in its enum, the log version it processed and the
keys the log held then. The projections' asset checks judge these figures.

    stats = projection_table_stats(spark, lake, PROJECTIONS["job_runs"])
    stats.rows == stats.distinct_keys  # one row per key
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.projections.projection import Projection
from databuild_assets.projections.refresh import processed_log_version, projection_spec
from databuild_assets.projections.refresh_all import PROJECTION_SOURCE
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import Lake

# The enum each projection's status_code column takes its values from.
STATUS_ENUMS: dict[str, type[IntEnum]] = {
    "partition_state": PartitionStatus,
    "job_runs": JobStatus,
    "build_requests": BuildRequestStatus,
}


@dataclass(frozen=True)
class ProjectionTableStats:
    projection: str
    rows: int
    distinct_keys: int
    rows_with_unknown_status_code: int  # null, or outside the status enum's codes
    status_enum: type[IntEnum]
    processed_log_version: int | None  # the source log version the rows reflect; None: never refreshed
    log_version: int  # the source log's latest version
    keys_in_log_then: int | None  # distinct keys the source log held at processed_log_version

    @property
    def valid_status_codes(self) -> str:
        """The enum's range in words, e.g. "JobStatus 0..6"."""
        return f"{self.status_enum.__name__} {min(self.status_enum).value}..{max(self.status_enum).value}"


def projection_table_stats(spark: SparkSession, lake: Lake, projection: Projection) -> ProjectionTableStats:
    """Measure `projection`'s table and its source log (the filtered log): one aggregate over the
    table, and a count of the log's distinct keys at the version the table processed."""
    path = lake.table_path(projection_spec(projection))
    enum = STATUS_ENUMS[projection.name]
    low, high = min(enum).value, max(enum).value
    unknown_status = ~F.col("status_code").between(low, high) | F.col("status_code").isNull()
    stats = (
        spark.read.format("delta")
        .load(path)
        .agg(
            F.count("*").alias("rows"),
            F.countDistinct(projection.key).alias("keys"),
            F.sum(F.when(unknown_status, 1).otherwise(0)).alias("bad_status"),
        )
        .first()
    )
    processed = processed_log_version(spark, path, projection.name)
    log_path = lake.table_path(PROJECTION_SOURCE)
    keys_in_log_then = None
    if processed is not None:
        log_then = spark.read.format("delta").option("versionAsOf", processed).load(log_path)
        keys_in_log_then = projection.keys_of(log_then).count()
    return ProjectionTableStats(
        projection=projection.name,
        rows=stats["rows"],
        distinct_keys=stats["keys"],
        rows_with_unknown_status_code=stats["bad_status"] or 0,
        status_enum=enum,
        processed_log_version=processed,
        log_version=current_version(spark, log_path),
        keys_in_log_then=keys_in_log_then,
    )
