"""Freshness of the projections: an asset check on each that fails when it has lagged the raw
event log longer than a bound (`projections/freshness.py` measures the lag), and a schedule that
runs those checks, since a projection falls behind exactly when nothing refreshes it."""

from collections.abc import Sequence
from datetime import timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetSelection,
    DefaultScheduleStatus,
    MetadataValue,
    ScheduleDefinition,
    define_asset_job,
    multi_asset_check,
)

from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.freshness import projection_lag

FRESHNESS_CHECK = "fresh_with_raw_log"


def projection_freshness_checks(max_lag: timedelta):
    """One check per projection, all in one step (one Spark session): passes while the
    projection reflects every raw log commit that changed data, or has lagged it for at most
    `max_lag`."""
    specs = [
        AssetCheckSpec(
            FRESHNESS_CHECK,
            asset=name,
            description=f"Fails when {name} has lagged the raw event log for more than {_words(max_lag)}.",
        )
        for name in PROJECTIONS
    ]

    @multi_asset_check(specs=specs, name="projection_freshness_checks", can_subset=True)
    @reports_damage
    def checks(context: AssetCheckExecutionContext, lakehouse: LakehouseResource):
        spark, lake = lakehouse.spark_session, lakehouse.lake
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.asset_key.to_user_string()):
            projection = PROJECTIONS[key.asset_key.path[-1]]
            lag = projection_lag(spark, lake, projection)
            passed = lag.lag <= max_lag
            if not passed:
                context.log.warning(
                    f"{projection.name} has lagged the raw event log for {_words(lag.lag)} (bound {_words(max_lag)}): "
                    f"it reflects raw_event_log v{lag.reflected_raw_version}, and v{lag.behind_since_version} "
                    f"({lag.behind_since:%Y-%m-%d %H:%M:%S} UTC) changed data since. Check that "
                    "the sensors are running and that ingest_and_refresh_job and refresh_projections_job runs succeed."
                )
            yield AssetCheckResult(
                check_name=FRESHNESS_CHECK,
                asset_key=projection.name,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "lag_seconds": MetadataValue.float(lag.lag.total_seconds()),
                    "max_lag_seconds": MetadataValue.float(max_lag.total_seconds()),
                    "raw_log_version": MetadataValue.int(-1 if lag.raw_log_version is None else lag.raw_log_version),
                    "reflected_raw_log_version": MetadataValue.int(
                        -1 if lag.reflected_raw_version is None else lag.reflected_raw_version
                    ),
                    "behind_since_raw_log_version": MetadataValue.int(
                        -1 if lag.behind_since_version is None else lag.behind_since_version
                    ),
                    "behind_since": MetadataValue.text(
                        "" if lag.behind_since is None else lag.behind_since.isoformat()
                    ),
                },
            )

    return checks


def projection_freshness_schedule(checks: Sequence, cron: str) -> ScheduleDefinition:
    """Runs `checks` (the freshness checks, and the projections' other checks, which the landing
    run leaves out) alone, with no materialization, on `cron`."""
    job = define_asset_job(
        "projection_freshness_job",
        selection=AssetSelection.checks(*checks),
        description="Check every projection: that it keeps up with the raw event log, and its rows.",
    )
    return ScheduleDefinition(
        name="projection_freshness_schedule",
        job=job,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Runs the projections' checks: freshness and rows ({cron} UTC; DATABUILD_FRESHNESS_CRON).",
    )


def _words(duration: timedelta) -> str:
    seconds = int(duration.total_seconds())
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60} min"
    return f"{duration.total_seconds():g} s"
