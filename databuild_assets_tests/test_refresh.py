"""Projection refresh: incremental equals a full rebuild; the recorded version drives it; sensors,
checks and the migration command behave as an operator expects."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Definitions,
    RunRequest,
    SensorResult,
    SkipReason,
    define_asset_job,
    materialize,
)
from delta.tables import DeltaTable
from pyspark.sql.types import LongType, StructField, StructType

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.event_log.jobs import ingest_and_refresh_job
from databuild_assets.defs.event_log.sensors import landing_files_sensor
from databuild_assets.defs.maintenance.assets import filtered_event_log, tombstones
from databuild_assets.defs.projections.assets import projection_assets
from databuild_assets.defs.projections.checks import projection_asset_checks
from databuild_assets.defs.projections.sensors import event_log_commits_sensor
from databuild_assets.defs.serving.assets import serving_index
from databuild_assets.events.schema import SCHEMA_VERSION
from databuild_assets.ingest.landing_state import landing_state
from databuild_assets.ingest.writer import append_events
from databuild_assets.log.migrate import migrate_sqlite_to_delta
from databuild_assets.log.sqlite.backend import load_events
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import STATE
from databuild_assets.projections.refresh import (
    ConcurrentRefresh,
    RebuildRule,
    fold_in,
    processed_log_version,
    projection_spec,
    record_processed_version,
    refresh_projection,
    refresh_projections,
    reset,
    table_spec,
)
from databuild_assets.runtime.delta_tables import (
    DELETION_VECTORS_FEATURE,
    current_version,
    ensure_table,
    read_table_properties,
)
from databuild_assets.runtime.lake import RAW_EVENT_LOG, SCHEMA_VERSION_PROPERTY, Lake
from databuild_assets.workload import generate_events, write_landing_files
from databuild_assets_tests.support import (
    FOLD,
    evaluate_sensor,
    lakehouse_for,
    one_partition_build,
    partition_event_at,
    write_landing,
)

PARTITION_STATE = PROJECTIONS["partition_state"]


def stored_rows(spark, lake, projection) -> list[dict]:
    table = spark.read.format("delta").load(lake.table_path(projection_spec(projection)))
    rows = table.select(*projection.schema.fieldNames()).collect()
    return sorted((row.asDict(recursive=True) for row in rows), key=lambda row: row[projection.key])


def rebuilt_rows(spark, lake, projection) -> list[dict]:
    log = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    rows = projection.build(log).select(*projection.schema.fieldNames()).collect()
    return sorted((row.asDict(recursive=True) for row in rows), key=lambda row: row[projection.key])


def refresh_all(spark, lake, full: bool = False) -> dict[str, str]:
    """The three side by side, as the refresh job does."""
    results = refresh_projections(spark, lake, PROJECTIONS.values(), RAW_EVENT_LOG, full=full, rule=FOLD)
    return {name: result.mode for name, result in results.items()}


def pipeline_definitions(lake, job) -> Definitions:
    """The ingestion, filtered log and projection assets with their checks, and `job`, on `lake`."""
    return Definitions(
        assets=[landing_files, ingested_event_log, tombstones, filtered_event_log, *projection_assets, serving_index],
        asset_checks=projection_asset_checks,
        jobs=[job],
        resources={"lakehouse": lakehouse_for(lake)},
    )


@pytest.fixture(scope="module")
def workload() -> list[dict]:
    return list(generate_events(1_500, seed=11))


def test_incremental_refreshes_equal_a_full_rebuild_after_every_batch_including_late_events(spark, lake, workload):
    # Late arrivals: the second batch holds the oldest events, committed last. (Folds one after
    # another, over generated batchings, are test_backend_parity's property test.)
    batches = [workload[500:], workload[:500]]
    modes = []
    for batch in batches:
        append_events(spark, lake, batch)
        modes.append(refresh_all(spark, lake))
        for projection in PROJECTIONS.values():
            if modes[-1][projection.name] == "incremental":  # a full refresh is the rebuild itself
                assert stored_rows(spark, lake, projection) == rebuilt_rows(spark, lake, projection), projection.name

    assert [set(m.values()) for m in modes] == [{"full"}, {"incremental"}]
    assert processed_log_version(spark, lake.table_path(projection_spec(PARTITION_STATE)), "partition_state") == 2


def test_a_refresh_with_no_new_log_commits_writes_nothing(spark, lake):
    append_events(spark, lake, [partition_event_at("p1")])
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    version = current_version(spark, lake.table_path(projection_spec(PARTITION_STATE)))

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)

    assert (result.mode, result.projection_version) == ("up-to-date", version)


def test_full_rebuild_when_asked(spark, lake):
    append_events(spark, lake, [partition_event_at("p1")])
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    path = lake.table_path(projection_spec(PARTITION_STATE))
    version_before = current_version(spark, path)

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, full=True)  # nothing new in the log

    assert (result.mode, result.reason) == ("full", "full rebuild requested")
    assert result.projection_version == current_version(spark, path) == version_before + 1  # the rebuild's commit
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)


def test_a_small_log_or_a_backfill_of_a_tenth_of_the_log_or_more_is_rebuilt_not_folded(spark, lake):
    events = list(generate_events(80, seed=8))
    append_events(spark, lake, events[:20])
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)  # full: the first
    append_events(spark, lake, events[20:40])
    small_log = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)  # the default rule
    append_events(spark, lake, events[40:60])  # a third of the log, but far below the backfill floor
    under_the_floor = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=FOLD)
    append_events(spark, lake, events[60:])  # a quarter of the log, and the floor lowered to 0
    backfill = refresh_projection(
        spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=RebuildRule(small_log_bytes=0, backfill_min_bytes=0)
    )

    assert small_log.mode == "full"
    assert re.fullmatch(r"the log holds [\d,]+ bytes, under 1 MiB: a rebuild is cheaper than a fold", small_log.reason)
    assert under_the_floor.mode == "incremental"
    assert backfill.mode == "full"
    assert backfill.reason.startswith("log commits 4..4 added ") and backfill.reason.endswith(
        " bytes, at least 10%: a rebuild is cheaper than a fold"
    )
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)


def test_a_fold_over_rows_another_refresh_changed_commits_nothing_and_the_refresh_rebuilds(spark, lake):
    path = lake.table_path(projection_spec(PARTITION_STATE))
    append_events(spark, lake, [partition_event_at("p1", ref="data/a")])  # log version 1
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)  # full
    read_at = current_version(spark, path)
    append_events(spark, lake, [partition_event_at("p2", 1, ref="data/a")])  # log version 2
    assert refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=FOLD).mode == "incremental"
    changed_at = current_version(spark, path)

    # A refresh that read the table before that one committed, and folds the same commit in again.
    log = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    with pytest.raises(ConcurrentRefresh, match="another refresh"):
        new = log.where("event_id = 'p2'")
        fold_in(spark, path, PARTITION_STATE, read_at, lambda stored: PARTITION_STATE.fold(stored, new), 1, 2)
    assert current_version(spark, path) == changed_at
    [row] = stored_rows(spark, lake, PARTITION_STATE)
    assert row["event_count"] == 2  # not 3

    # Its rows claim log version 2 while a later refresh reads them as of version 1 (a recorded
    # version that went back): the fold refuses them and the refresh rebuilds in full.
    record_processed_version(spark, path, PARTITION_STATE, 1, "incremental")
    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=FOLD)
    assert result.mode == "full" and "another refresh" in result.reason
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)


def assert_rebuilt_then_folded_into(spark, lake) -> None:
    """partition_state, just rebuilt over an upgraded table, equals a rebuild from the log (p1,
    p2), and the next refresh (of p3) folds into it."""
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)
    append_events(spark, lake, [partition_event_at("p3", 2, ref="data/b")])
    assert refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=FOLD).mode == "incremental"
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)


def test_a_projection_table_without_fold_state_is_rebuilt_with_it(spark, lake):
    # What an earlier release wrote: the read model only, with the processed version recorded.
    path = lake.table_path(projection_spec(PARTITION_STATE))
    append_events(spark, lake, [partition_event_at("p1", ref="data/a")])
    log = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    metadata = '{"projection": "partition_state", "log_version": 1}'
    PARTITION_STATE.build(log).write.format("delta").option("userMetadata", metadata).save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{SCHEMA_VERSION_PROPERTY}' = '{SCHEMA_VERSION}')")
    append_events(spark, lake, [partition_event_at("p2", 1, ref="data/b")])

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)

    assert result.mode == "full" and "no fold state" in result.reason, result
    assert_rebuilt_then_folded_into(spark, lake)


def test_a_projection_whose_fold_state_has_another_layout_is_reset_and_rebuilt(spark, lake):
    # What another release wrote: the same read model, a fold state of other fields (which Delta
    # cannot alter in place), and a recorded log version to fold from.
    path = lake.table_path(projection_spec(PARTITION_STATE))
    append_events(spark, lake, [partition_event_at("p1", ref="data/a")])
    spec = table_spec(spark, PARTITION_STATE)
    other_state = StructType([StructField("a_field_of_another_release", LongType(), True)])
    other = StructType(
        [StructField(f.name, other_state, True, f.metadata) if f.name == STATE else f for f in spec.schema]
    )
    ensure_table(spark, path, replace(spec, schema_of=lambda: other))
    record_processed_version(spark, path, PARTITION_STATE, 1, "full")
    append_events(spark, lake, [partition_event_at("p2", 1, ref="data/b")])

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)

    assert result.mode == "full" and "another layout" in result.reason, result
    table = spark.read.format("delta").load(path)
    assert table.schema[STATE].dataType.simpleString() == spec.schema[STATE].dataType.simpleString()
    assert [f.metadata for f in table.schema] == [f.metadata for f in spec.schema]  # column comments kept
    assert_rebuilt_then_folded_into(spark, lake)


def test_a_refresh_after_a_reset_that_wrote_no_rows_rebuilds_in_full(spark, lake):
    # A process that stopped between `rebuild`'s two commits: the table reset, no rows written.
    path = lake.table_path(projection_spec(PARTITION_STATE))
    append_events(spark, lake, [partition_event_at("p1", ref="data/a")])
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    reset(spark, path, PARTITION_STATE)
    assert spark.read.format("delta").load(path).count() == 0
    append_events(spark, lake, [partition_event_at("p2", 1, ref="data/b")])

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)

    assert (result.mode, result.reason) == ("full", "projection has no recorded log version")
    assert [row["partition_ref"] for row in stored_rows(spark, lake, PARTITION_STATE)] == ["data/a", "data/b"]


def test_a_fold_rewrites_the_file_holding_a_row_it_replaces_and_adds_no_deletion_vectors(spark, lake):
    path = lake.table_path(projection_spec(PARTITION_STATE))
    append_events(spark, lake, [partition_event_at(f"p{n}", n, ref=f"data/{n}") for n in range(40)])
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    append_events(spark, lake, [partition_event_at("again", 40, ref="data/7")])

    assert refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG, rule=FOLD).mode == "incremental"

    metrics = DeltaTable.forPath(spark, path).history(1).first()["operationMetrics"]
    assert (metrics["numTargetDeletionVectorsAdded"], metrics["numTargetFilesRemoved"]) == ("0", "1"), metrics
    assert DELETION_VECTORS_FEATURE not in read_table_properties(spark, path)
    assert stored_rows(spark, lake, PARTITION_STATE) == rebuilt_rows(spark, lake, PARTITION_STATE)


def test_log_commits_that_remove_events_make_a_refresh_recompute_the_keys_they_touch(spark, lake, workload):
    # An erasure's delete: no state can take an event out, so the keys the removed and added
    # events touch are computed again from the log; equal to a rebuild, a key with no event left gone.
    # A job run of br-x whose later events are in br-y: without its first event, br-y owns it.
    owner, heir = one_partition_build("br-x", "data/x", 0), one_partition_build("br-y", "data/x", 10)
    heir[1]["job_event"]["job_run_id"] = heir[2]["partition_event"]["job_run_id"] = "br-x-job"
    append_events(spark, lake, workload + owner + heir)
    refresh_all(spark, lake)
    log_path = lake.table_path(RAW_EVENT_LOG)
    build_request = workload[700]["build_request_id"]
    # Every 7th event, one build request whole, the run's first event, and new events in the same range.
    spark.sql(
        f"DELETE FROM delta.`{log_path}` "
        f"WHERE abs(hash(event_id)) % 7 = 0 AND event_id NOT LIKE 'br-%' "
        f"OR build_request_id = '{build_request}' OR event_id = 'br-x-2'"
    )
    append_events(spark, lake, list(generate_events(200, seed=12)))

    results = refresh_projections(spark, lake, PROJECTIONS.values(), RAW_EVENT_LOG, rule=FOLD)

    for projection in PROJECTIONS.values():
        result = results[projection.name]
        assert (result.mode, result.reason) == (
            "incremental",
            "log commits 2..3 removed data: the keys they touch recomputed",
        )
        assert stored_rows(spark, lake, projection) == rebuilt_rows(spark, lake, projection), projection.name
    requests = {row["build_request_id"]: row for row in stored_rows(spark, lake, PROJECTIONS["build_requests"])}
    assert build_request not in requests
    completed = [requests[br]["job_run_counts"]["JOB_COMPLETED"] for br in ("br-x", "br-y")]
    assert completed == [0, 1]
    # Under the rule's floor a log is rebuilt, removals or not.
    spark.sql(f"DELETE FROM delta.`{log_path}` WHERE abs(hash(event_id)) % 5 = 0")
    small = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    assert small.mode == "full" and small.reason.startswith("log commits 4..4 removed data; the log holds"), small


def test_log_commits_no_longer_on_disk_force_a_full_rebuild(spark, lake):
    log_path = lake.table_path(RAW_EVENT_LOG)
    append_events(spark, lake, [partition_event_at("p1", ref="data/a")])  # version 1
    refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)
    spark.sql(f"ALTER TABLE delta.`{log_path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")  # version 2
    for i, ref in enumerate(["data/b", "data/c"]):  # versions 3 and 4; checkpoint at 4
        append_events(spark, lake, [partition_event_at(f"q{i}", i + 1, ref=ref)])
    # What log cleanup does once a checkpoint covers them: the older commit files go.
    for version in (2, 3):
        os.remove(Path(log_path) / "_delta_log" / f"{version:020d}.json")

    result = refresh_projection(spark, lake, PARTITION_STATE, RAW_EVENT_LOG)

    assert result.mode == "full" and "not all readable" in result.reason
    assert [row["partition_ref"] for row in stored_rows(spark, lake, PARTITION_STATE)] == ["data/a", "data/b", "data/c"]


def test_event_log_sensor_requests_one_run_per_new_version_and_skips_otherwise(spark, lake):
    instance = DagsterInstance.ephemeral()
    resources = {"lakehouse": lakehouse_for(lake)}

    def tick(cursor):
        return evaluate_sensor(event_log_commits_sensor, instance=instance, cursor=cursor, resources=resources)

    assert isinstance(tick(None), SkipReason)  # no log yet
    append_events(spark, lake, [partition_event_at("p1")])

    first = tick(None)
    assert isinstance(first, SensorResult) and first.cursor == "raw_event_log=v1,tombstones=none"
    assert [(r.run_key, r.tags["databuild/log_version"]) for r in first.run_requests] == [
        ("raw_event_log=v1,tombstones=none", "1")
    ]
    assert tick(first.cursor).skip_message == "event log still at version 1, tombstones at None"

    request_erasure(spark, lake, "event_id", "p1", actor="alice", reason="a new tombstone is a change too")
    assert tick(first.cursor).cursor == "raw_event_log=v1,tombstones=v1"

    append_events(spark, lake, [partition_event_at("p2", 1)])
    instance.add_run(
        DagsterRun(job_name="refresh_projections_job", run_id="run-in-flight", status=DagsterRunStatus.STARTED)
    )
    assert (
        tick(first.cursor).skip_message
        == "refresh_projections_job run run-in-flight is in flight; event log at version 2"
    )


def test_a_landing_file_takes_one_run_and_the_event_log_sensor_then_requests_nothing(spark, lake):
    # The landing sensor's run ingests and refreshes; the event-log sensor must not request a
    # second refresh for the commit that run made, nor while such a run is in flight.
    write_landing(lake, "builds.jsonl", one_partition_build("br-fresh", "data/fresh", 0))
    landing = evaluate_sensor(landing_files_sensor, resources={"lakehouse": lakehouse_for(lake)})
    assert landing_files_sensor.job_name == "ingest_and_refresh_job" and len(landing.run_requests) == 1
    result = (
        pipeline_definitions(lake, ingest_and_refresh_job)
        .resolve_job_def("ingest_and_refresh_job")
        .execute_in_process()
    )
    # No checks in it: they scan the whole log, and run on their schedule instead.
    assert result.success and result.get_asset_check_evaluations() == []
    assert [row["partition_ref"] for row in stored_rows(spark, lake, PARTITION_STATE)] == ["data/fresh"]

    instance = DagsterInstance.ephemeral()
    resources = {"lakehouse": lakehouse_for(lake)}

    def tick(cursor):
        return evaluate_sensor(event_log_commits_sensor, instance=instance, cursor=cursor, resources=resources)

    refreshed = tick(None)
    assert refreshed.run_requests == [] and refreshed.cursor == "raw_event_log=v1,tombstones=v0"
    assert refreshed.skip_reason.skip_message == (
        "the filtered log and every projection already reflect raw_event_log v1"
    )

    append_events(spark, lake, [partition_event_at("p-late", 1, ref="data/late")])
    instance.add_run(
        DagsterRun(job_name="ingest_and_refresh_job", run_id="landing-run", status=DagsterRunStatus.STARTED)
    )
    assert (
        tick(refreshed.cursor).skip_message
        == "ingest_and_refresh_job run landing-run is in flight; event log at version 2"
    )
    # With no such run in flight (another instance), a commit no run refreshed is requested.
    instance = DagsterInstance.ephemeral()
    assert [r.run_key for r in tick(refreshed.cursor).run_requests] == ["raw_event_log=v2,tombstones=v0"]


def test_event_log_sensor_gives_a_new_lake_at_the_same_root_new_run_keys(spark, tmp_path):
    # After `make clean-lake` the versions start again at 0: the old lake's run keys must not be
    # reused, or Dagster would skip those runs.
    lake = Lake(str(tmp_path / "lake"))
    instance = DagsterInstance.ephemeral()
    resources = {"lakehouse": lakehouse_for(lake)}

    def tick(cursor):
        return evaluate_sensor(event_log_commits_sensor, instance=instance, cursor=cursor, resources=resources)

    append_events(spark, lake, [partition_event_at("p1")])
    append_events(spark, lake, [partition_event_at("p2", 1)])
    old = tick(None)
    assert old.run_requests[0].run_key == "raw_event_log=v2,tombstones=none"
    shutil.rmtree(lake.root)
    append_events(spark, lake, [partition_event_at("p1")])

    new = tick(old.cursor)
    assert [r.run_key for r in new.run_requests] == ["raw_event_log=v1,tombstones=none,lake-generation=1"]
    append_events(spark, lake, [partition_event_at("p2", 1)])
    assert [r.run_key for r in tick(new.cursor).run_requests] == ["raw_event_log=v2,tombstones=none,lake-generation=1"]
    assert tick(tick(new.cursor).cursor).skip_message == "event log still at version 2, tombstones at None"


def test_landing_sensor_requests_ingestion_for_each_new_newest_file(lake):
    resources = {"lakehouse": lakehouse_for(lake)}

    def tick(cursor):
        return evaluate_sensor(landing_files_sensor, cursor=cursor, resources=resources)

    assert isinstance(tick(None), SkipReason)
    write_landing_files(lake.landing, 10, seed=1, events_per_file=10)
    first = tick(None)
    assert len(first.run_requests) == 1 and isinstance(first.run_requests[0], RunRequest)
    assert isinstance(tick(first.cursor), SkipReason)

    # A file moved in keeps its old modification time: still a change.
    moved = Path(lake.landing) / "moved-in.jsonl"
    moved.write_bytes((Path(lake.landing) / sorted(os.listdir(lake.landing))[0]).read_bytes())
    os.utime(moved, ns=(1_000_000_000, 1_000_000_000))
    second = tick(first.cursor)
    assert len(second.run_requests) == 1 and second.run_requests[0].run_key != first.run_requests[0].run_key
    assert isinstance(tick(second.cursor), SkipReason)


def test_landing_sensor_requests_no_second_run_while_one_waits_in_the_queue(lake):
    # Runs slower than the files land (bench.soak: a file a minute, runs of 100 s on a loaded
    # machine) must not pile up in the queue: the waiting run ingests every file there when it starts.
    resources = {"lakehouse": lakehouse_for(lake)}

    def tick(cursor, run_status):
        instance = DagsterInstance.ephemeral()
        instance.add_run(DagsterRun(job_name="ingest_and_refresh_job", run_id="earlier-run", status=run_status))
        return evaluate_sensor(landing_files_sensor, instance=instance, cursor=cursor, resources=resources)

    write_landing_files(lake.landing, 10, seed=1, events_per_file=10)
    first = evaluate_sensor(landing_files_sensor, resources=resources)
    write_landing(lake, "later.jsonl", one_partition_build("br-later", "data/later", 0))

    for waiting in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING):
        assert tick(first.cursor, waiting).skip_message == (
            "ingest_and_refresh_job run earlier-run is waiting to start; it will ingest the new landing files"
        )
    # A run that has started listed the folder already: a file that lands since is another run's.
    assert len(tick(first.cursor, DagsterRunStatus.STARTED).run_requests) == 1


def test_landing_state_changes_when_a_file_being_written_settles(lake):
    # Ingestion leaves a file without a final newline for later until it is unchanged for the
    # settle time; then a run must come, though the file itself did not change.
    Path(lake.landing).mkdir(parents=True)
    partial = Path(lake.landing) / "partial.jsonl"
    partial.write_bytes(b'{"event_id": "e1"}\n{"event_id": "e2", "times')
    written = partial.stat().st_mtime_ns / 1e9

    waiting = landing_state(lake.landing, settle_seconds=600, now_s=written + 1)
    assert (waiting.files, waiting.waiting) == (1, 1)
    assert landing_state(lake.landing, settle_seconds=600, now_s=written + 599) == waiting
    settled = landing_state(lake.landing, settle_seconds=600, now_s=written + 601)
    assert settled.waiting == 0 and settled.fingerprint != waiting.fingerprint


def test_projection_checks_pass_after_a_run_and_fail_on_a_duplicated_key(spark, lake):
    write_landing_files(lake.landing, 400, seed=5)
    defs = pipeline_definitions(lake, define_asset_job("everything"))
    first = defs.resolve_job_def("everything").execute_in_process()
    results = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in first.get_asset_check_evaluations()}
    assert len(results) == 12 and all(results.values()), results

    path = lake.table_path(projection_spec(PARTITION_STATE))
    spark.read.format("delta").load(path).limit(1).write.format("delta").mode("append").save(path)
    second = defs.resolve_job_def("everything").execute_in_process(raise_on_error=False)
    failed = {
        e.check_name
        for e in second.get_asset_check_evaluations()
        if not e.passed and e.asset_key.to_user_string() == "partition_state"
    }
    assert failed == {"one_row_per_key", "row_count_matches_log"}


def test_a_projection_that_cannot_refresh_fails_the_step_and_the_others_are_refreshed_and_reported(spark, lake):
    # The step refreshes the three at once; one failing must not keep the others stale. Here a
    # newer release has upgraded build_requests (its schema version is ahead of this code's).
    append_events(spark, lake, list(generate_events(300, seed=3)))
    refresh_filtered_log(spark, lake)
    build_requests = PROJECTIONS["build_requests"]
    path = lake.table_path(projection_spec(build_requests))
    ensure_table(spark, path, table_spec(spark, build_requests))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{SCHEMA_VERSION_PROPERTY}' = '{SCHEMA_VERSION + 1}')")

    result = materialize(projection_assets, resources={"lakehouse": lakehouse_for(lake)}, raise_on_error=False)

    assert not result.success
    modes = {
        e.asset_key.to_user_string(): e.materialization.metadata["refresh_mode"].value
        for e in result.get_asset_materialization_events()
    }
    assert modes == {"partition_state": "full", "job_runs": "full"}
    # partition_state is refreshed (and reported) first, alone; then the others side by side.
    assert [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()] == [
        "partition_state",
        "job_runs",
    ]
    [failure] = result.get_step_failure_events()
    message = failure.step_failure_data.error.to_string()
    assert "1 of 3 projection refreshes failed" in message and "build_requests: SchemaVersionError" in message, message
    for name in modes:
        assert stored_rows(spark, lake, PROJECTIONS[name]) == rebuilt_rows(spark, lake, PROJECTIONS[name])


def test_migrating_a_sqlite_log_copies_every_event_once_and_again_adds_nothing(spark, lake, tmp_path, workload):
    sqlite_path = tmp_path / "bel.db"
    load_events(sqlite_path, workload[:300])

    first = migrate_sqlite_to_delta(spark, f"sqlite:///{sqlite_path}", lake, chunk=120)
    again = migrate_sqlite_to_delta(spark, f"sqlite:///{sqlite_path}", lake, chunk=120)

    assert (first.read, first.accepted, first.duplicates, first.commits) == (300, 300, 0, 3)
    assert (again.read, again.accepted, again.duplicates, again.commits) == (300, 0, 300, 0)
    assert again.log_version == first.log_version  # nothing new: the raw log did not move
    ids = [row.event_id for row in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect()]
    assert sorted(ids) == sorted(event["event_id"] for event in workload[:300])
