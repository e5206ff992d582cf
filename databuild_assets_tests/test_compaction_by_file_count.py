"""Compaction by file count: the sensor that requests compaction of every date when the raw log has
gained DATABUILD_COMPACT_AT_FILES files since its last whole-table bin-pack."""

from __future__ import annotations

import time

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SensorResult

from databuild_assets.defs.maintenance.sensors import PACK_EVERY_DATE, compaction_by_file_count_sensor
from databuild_assets.events.enums import PartitionStatus
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.compaction_trigger import (
    COMPACT_AT_FILES_ENV,
    DEFAULT_COMPACT_AT_FILES,
    CompactionTriggerError,
    compact_at_files,
)
from databuild_assets.runtime.delta_log import commit_path, read_log
from databuild_assets.runtime.lake import RAW_EVENT_LOG
from databuild_assets_tests import bel_cases
from databuild_assets_tests.support import evaluate_sensor, lakehouse_for, project_job


def append_one_today(spark, lake, event_id: str) -> None:
    """One event of today, in a commit of its own: one small file in today's date, as a service's
    append leaves (the daily compaction leaves today's date alone)."""
    event = bel_cases.partition_event(event_id, time.time_ns(), "br-1", "data/a", PartitionStatus.PARTITION_AVAILABLE)
    append_events(spark, lake, [event])


def ticker(lake, instance):
    resources = {"lakehouse": lakehouse_for(lake)}
    return lambda cursor: evaluate_sensor(
        compaction_by_file_count_sensor, instance=instance, cursor=cursor, resources=resources
    )


def test_the_compaction_sensor_requests_every_date_packed_at_the_file_count_and_counts_afresh_after_it(
    spark, lake, monkeypatch
):
    monkeypatch.setenv(COMPACT_AT_FILES_ENV, "3")
    path = lake.table_path(RAW_EVENT_LOG)
    tick = ticker(lake, DagsterInstance.ephemeral())
    assert tick(None).skip_message == f"no event log at {path} yet"

    append_one_today(spark, lake, "e1")
    append_one_today(spark, lake, "e2")
    state = read_log(path)
    assert len(state.files) == 2
    below = tick(None)
    assert isinstance(below, SensorResult) and below.run_requests == []
    assert below.skip_reason.skip_message == (
        f"2 files added to raw_event_log since its last whole-table bin-pack (v{state.version}); compaction at 3"
    )

    append_one_today(spark, lake, "e3")
    at = tick(below.cursor)  # counted from the cursor: only the new commit is read
    assert [(r.run_config, r.tags["databuild/raw_log_files_since_pack"]) for r in at.run_requests] == [
        (PACK_EVERY_DATE, "3")
    ]
    assert at.cursor.endswith(",files=3,requested_at=3")

    busy = DagsterInstance.ephemeral()
    busy.add_run(DagsterRun(job_name="compaction_job", run_id="compaction-running", status=DagsterRunStatus.STARTED))
    assert ticker(lake, busy)(below.cursor).skip_reason.skip_message.endswith(
        "; compaction run compaction-running is in flight"
    )
    # Requested, and no whole-table bin-pack since (the run failed): not again at every tick.
    assert tick(at.cursor).skip_reason.skip_message.endswith(
        "; the compaction requested at 3 files packed nothing, requested again at 6"
    )

    run = project_job(lake, "compaction_job").execute_in_process(run_config=at.run_requests[0].run_config)
    assert run.success
    assert len(read_log(path).files) == 1  # today's three small files, packed into one

    after = tick(at.cursor)
    assert after.run_requests == [] and after.cursor.endswith(",files=0,requested_at=none")
    assert after.skip_reason.skip_message.startswith("0 files added to raw_event_log since its last whole-table")
    assert tick(None).cursor == after.cursor  # without a cursor, walked back to that bin-pack
    append_one_today(spark, lake, "e4")
    assert tick(after.cursor).cursor.endswith(",files=1,requested_at=none")


def test_the_daily_compaction_leaves_todays_files_counted_and_a_damaged_commit_stops_the_count(spark, lake):
    path = lake.table_path(RAW_EVENT_LOG)
    tick = ticker(lake, DagsterInstance.ephemeral())
    append_one_today(spark, lake, "e1")
    append_one_today(spark, lake, "e2")
    first = tick(None)
    assert first.cursor.endswith(",files=2,requested_at=none")

    daily = project_job(lake, "compaction_job").execute_in_process()  # open_days=2: today stays unpacked
    assert daily.success and len(read_log(path).files) == 2
    counted = tick(first.cursor)
    assert counted.cursor.endswith(",files=2,requested_at=none")

    newest = read_log(path).version
    commit_path(path, newest + 1).write_text('{"add": {"path": "x.parquet"\n')
    damaged = tick(counted.cursor)
    assert damaged.skip_message.startswith(f"{commit_path(path, newest + 1)} does not parse")


def test_the_file_count_setting_is_a_whole_number_of_files_or_a_one_line_refusal():
    assert compact_at_files({}) == DEFAULT_COMPACT_AT_FILES
    assert compact_at_files({COMPACT_AT_FILES_ENV: " 250 "}) == 250
    for bad in ("0", "-5", "1e4", "many"):
        with pytest.raises(CompactionTriggerError, match=f"^{COMPACT_AT_FILES_ENV}='{bad}' is not a number of files"):
            compact_at_files({COMPACT_AT_FILES_ENV: bad})
