"""Asset checks on each projection: one row per key, known status codes, the row count the log
implies, and that it is up to date with the log (`projections/table_stats.py` measures them)."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, multi_asset_check

from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import Projection
from databuild_assets.projections.table_stats import projection_table_stats

CHECK_NAMES = ("one_row_per_key", "status_codes_in_enum", "row_count_matches_log", "up_to_date_with_log")


def projection_checks(projection: Projection):
    specs = [AssetCheckSpec(name, asset=projection.name) for name in CHECK_NAMES]

    @multi_asset_check(specs=specs, name=f"{projection.name}_checks")
    @reports_damage
    def checks(context: AssetCheckExecutionContext, lakehouse: LakehouseResource):
        stats = projection_table_stats(lakehouse.spark_session, lakehouse.lake, projection)
        processed, expected_keys = stats.processed_log_version, stats.keys_in_log_then

        yield AssetCheckResult(
            check_name="one_row_per_key",
            asset_key=projection.name,
            passed=stats.rows == stats.distinct_keys,
            metadata={"rows": stats.rows, "distinct_keys": stats.distinct_keys},
        )
        yield AssetCheckResult(
            check_name="status_codes_in_enum",
            asset_key=projection.name,
            passed=stats.rows_with_unknown_status_code == 0,
            metadata={
                "rows_with_unknown_status_code": stats.rows_with_unknown_status_code,
                "valid_codes": stats.valid_status_codes,
            },
        )
        yield AssetCheckResult(
            check_name="row_count_matches_log",
            asset_key=projection.name,
            passed=expected_keys is not None and expected_keys == stats.rows,
            metadata={
                "rows": stats.rows,
                "distinct_keys_in_log": -1 if expected_keys is None else expected_keys,
                "at_log_version": -1 if processed is None else processed,
            },
        )
        yield AssetCheckResult(
            check_name="up_to_date_with_log",
            asset_key=projection.name,
            passed=processed == stats.log_version,
            # A projection behind the log is stale, not wrong: the sensor catches it up.
            severity=AssetCheckSeverity.WARN,
            metadata={
                "processed_log_version": -1 if processed is None else processed,
                "log_version": stats.log_version,
            },
        )

    return checks


projection_asset_checks = [projection_checks(projection) for projection in PROJECTIONS.values()]
