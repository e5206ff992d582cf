"""Asset checks on each projection: one row per key, known status codes, the row count the log
implies, and that it is up to date with the log."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, multi_asset_check
from pyspark.sql import functions as F

from databuild_assets.defs.projections.assets import PROJECTION_SOURCE
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import Projection
from databuild_assets.projections.refresh import processed_log_version, projection_spec
from databuild_assets.runtime.delta_tables import current_version

STATUS_ENUMS = {"partition_state": PartitionStatus, "job_runs": JobStatus, "build_requests": BuildRequestStatus}
CHECK_NAMES = ("one_row_per_key", "status_codes_in_enum", "row_count_matches_log", "up_to_date_with_log")


def projection_checks(projection: Projection):
    specs = [AssetCheckSpec(name, asset=projection.name) for name in CHECK_NAMES]

    @multi_asset_check(specs=specs, name=f"{projection.name}_checks")
    def checks(context: AssetCheckExecutionContext, lakehouse: LakehouseResource):
        spark, lake = lakehouse.spark_session, lakehouse.lake
        path = lake.table_path(projection_spec(projection))
        table = spark.read.format("delta").load(path)
        enum = STATUS_ENUMS[projection.name]
        low, high = min(enum).value, max(enum).value
        stats = table.agg(
            F.count("*").alias("rows"),
            F.countDistinct(projection.key).alias("keys"),
            F.sum(F.when(~F.col("status_code").between(low, high) | F.col("status_code").isNull(), 1).otherwise(0)).alias("bad_status"),
        ).first()
        processed = processed_log_version(spark, path, projection.name)
        log_path = lake.table_path(PROJECTION_SOURCE)
        log_version = current_version(spark, log_path)
        expected_keys = None
        if processed is not None:
            log_then = spark.read.format("delta").option("versionAsOf", processed).load(log_path)
            expected_keys = projection.keys_of(log_then).count()

        yield AssetCheckResult(
            check_name="one_row_per_key", asset_key=projection.name,
            passed=stats["rows"] == stats["keys"],
            metadata={"rows": stats["rows"], "distinct_keys": stats["keys"]},
        )
        yield AssetCheckResult(
            check_name="status_codes_in_enum", asset_key=projection.name,
            passed=(stats["bad_status"] or 0) == 0,
            metadata={"rows_with_unknown_status_code": stats["bad_status"] or 0, "valid_codes": f"{enum.__name__} {low}..{high}"},
        )
        yield AssetCheckResult(
            check_name="row_count_matches_log", asset_key=projection.name,
            passed=expected_keys is not None and expected_keys == stats["rows"],
            metadata={"rows": stats["rows"], "distinct_keys_in_log": -1 if expected_keys is None else expected_keys,
                      "at_log_version": -1 if processed is None else processed},
        )
        yield AssetCheckResult(
            check_name="up_to_date_with_log", asset_key=projection.name,
            passed=processed == log_version,
            # A projection behind the log is stale, not wrong: the sensor catches it up.
            severity=AssetCheckSeverity.WARN,
            metadata={"processed_log_version": -1 if processed is None else processed, "log_version": log_version},
        )

    return checks


projection_asset_checks = [projection_checks(projection) for projection in PROJECTIONS.values()]
