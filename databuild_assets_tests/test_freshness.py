"""Projection freshness: a projection is behind the raw event log from the first raw commit with
data it does not reflect, and its Dagster check fails once that lasts longer than the bound."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import deltalake
from dagster import AssetSelection, Definitions, define_asset_job

from databuild_assets.defs.projections.assets import projection_assets
from databuild_assets.defs.projections.freshness import FRESHNESS_CHECK, projection_freshness_checks
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.freshness import commit_time, projection_lag
from databuild_assets.projections.refresh import refresh_projections
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG
from databuild_assets.workload import generate_events
from databuild_assets_tests.support import lakehouse_for

JOB_RUNS = PROJECTIONS["job_runs"]


def refresh(spark, lake) -> None:
    refresh_filtered_log(spark, lake)
    refresh_projections(spark, lake, [JOB_RUNS], FILTERED_EVENT_LOG)


def freshness_results(lake, max_lag: timedelta) -> dict[str, tuple[bool, dict]]:
    """Run the freshness checks alone, as the schedule does; each projection's (passed, metadata)."""
    checks = projection_freshness_checks(max_lag)
    defs = Definitions(
        assets=projection_assets,
        asset_checks=[checks],
        jobs=[define_asset_job("freshness", selection=AssetSelection.checks(checks))],
        resources={"lakehouse": lakehouse_for(lake)},
    )
    result = defs.resolve_job_def("freshness").execute_in_process()
    return {
        e.asset_key.to_user_string(): (e.passed, {k: v.value for k, v in e.metadata.items()})
        for e in result.get_asset_check_evaluations()
        if e.check_name == FRESHNESS_CHECK
    }


def test_a_projection_lags_from_the_first_raw_commit_with_data_it_does_not_reflect(spark, lake):
    events = list(generate_events(200, seed=21))
    append_events(spark, lake, events[:150])
    refresh(spark, lake)
    raw_path = lake.table_path(RAW_EVENT_LOG)
    refreshed_at = current_version(spark, raw_path)
    assert projection_lag(spark, lake, JOB_RUNS).lag == timedelta(0)

    # A commit that changes no rows (as OPTIMIZE or vacuum make) leaves it fresh.
    spark.sql(f"ALTER TABLE delta.`{raw_path}` SET TBLPROPERTIES ('databuild.test' = 'no rows changed')")
    lag = projection_lag(spark, lake, JOB_RUNS)
    assert (lag.fresh, lag.raw_log_version, lag.reflected_raw_version) == (True, refreshed_at + 1, refreshed_at)

    append_events(spark, lake, events[150:])
    appended_at = current_version(spark, raw_path)
    since = commit_time(spark, raw_path, appended_at)
    lag = projection_lag(spark, lake, JOB_RUNS, now=since + timedelta(minutes=5))
    assert (lag.fresh, lag.behind_since_version, lag.behind_since, lag.lag) == (
        False,
        appended_at,
        since,
        timedelta(minutes=5),
    )
    # The other projections were never refreshed: behind since the log's first data commit.
    never = projection_lag(spark, lake, PROJECTIONS["partition_state"])
    assert (never.reflected_raw_version, never.behind_since_version) == (None, 1)

    refresh(spark, lake)
    assert projection_lag(spark, lake, JOB_RUNS).fresh


def test_the_freshness_check_fails_when_the_lag_exceeds_its_bound(spark, lake):
    events = list(generate_events(200, seed=22))
    append_events(spark, lake, events[:100])
    refresh(spark, lake)
    append_events(spark, lake, events[100:])  # job_runs is behind from now on

    within = freshness_results(lake, max_lag=timedelta(hours=1))
    exceeded = freshness_results(lake, max_lag=timedelta(0))

    raw_version = current_version(spark, lake.table_path(RAW_EVENT_LOG))
    assert within["job_runs"][0] is True
    assert within["job_runs"][1]["behind_since_raw_log_version"] == raw_version
    assert exceeded["job_runs"][0] is False
    assert exceeded["job_runs"][1]["lag_seconds"] > 0
    assert set(exceeded) == set(PROJECTIONS)


def test_the_lag_is_read_from_the_newest_commits_not_the_whole_history(spark, lake):
    """A service's appends add tens of thousands of raw-log commits an hour, kept for the log's
    retention: the check, which runs with every refresh, must not read each of them. Commits
    older than a checkpoint are unreadable here, as a history read would find them slow."""
    events = list(generate_events(200, seed=23))
    append_events(spark, lake, events[:100])
    refresh(spark, lake)
    append_events(spark, lake, events[100:])
    for spec in (RAW_EVENT_LOG, FILTERED_EVENT_LOG):
        path = lake.table_path(spec)
        deltalake.DeltaTable(path).create_checkpoint()
        (Path(path) / "_delta_log" / f"{0:020d}.json").write_text("not a commit\n")
    raw_path = lake.table_path(RAW_EVENT_LOG)
    appended_at = current_version(spark, raw_path)

    lag = projection_lag(spark, lake, JOB_RUNS)

    assert (lag.fresh, lag.behind_since_version) == (False, appended_at)
    assert lag.behind_since == commit_time(spark, raw_path, appended_at)
