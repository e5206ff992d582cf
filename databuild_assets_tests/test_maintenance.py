"""Tombstones, the filtered log, compaction's verified purge, vacuum, and the proof of erasure."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from dagster import Definitions, validate_run_config
from delta.tables import DeltaTable

from databuild_assets.definitions import defs as project_defs
from databuild_assets.defs.maintenance.jobs import (
    compaction_job,
    erasure_report_job,
    vacuum_job,
)
from databuild_assets.events.erasure_rule import matches
from databuild_assets.ingest.landing import ensure_ingest_tables
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.compaction import PurgeVerificationError, bin_pack, compact, purge_events
from databuild_assets.maintenance.erasure_report import erasure_report
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import (
    Tombstone,
    TombstoneError,
    lines_mentioning,
    matching_events,
    read_tombstones,
    request_erasure,
    request_erasures,
)
from databuild_assets.maintenance.vacuum import RetentionTooShortError, vacuum_lake
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import projection_spec, refresh_projection
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.delta_tables import current_version, ensure_table, table_size
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, INGEST_LEDGER, RAW_EVENT_LOG, TOMBSTONES
from databuild_assets_tests.support import FOLD, lakehouse_for, one_partition_build, op_output_metadata

REF, OTHER = "data/users/id=42", "data/sales/date=2025-11-18"


@pytest.fixture
def two_builds(spark, lake):
    append_events(spark, lake, one_partition_build("br-a", REF, 0) + one_partition_build("br-b", OTHER, 10))
    return lake


def event_ids(spark, path) -> list[str]:
    return sorted(row.event_id for row in spark.read.format("delta").load(path).collect())


def live_parquet_rows_holding(spark, path: str, value: str) -> int:
    """Rows of the table's live data files that hold `value`, read from the files directly."""
    files = spark.read.format("delta").load(path).inputFiles()
    if not files:
        return 0
    from pyspark.sql import functions as F

    rows = spark.read.parquet(*files).select(F.to_json(F.struct("*")).alias("row"))
    return rows.where(F.col("row").contains(value)).count()


def test_an_erasure_request_with_an_unknown_key_or_missing_fields_is_refused_and_writes_nothing(spark, lake):
    with pytest.raises(TombstoneError) as error:
        request_erasure(spark, lake, key="user_id", value="", actor="alice", reason=" ")
    assert str(error.value) == (
        "erasure request refused, nothing written: key 'user_id' is not one of event_id, build_request_id, "
        "job_run_id, partition_ref; value is empty: a tombstone needs the value to erase; "
        "reason is empty: a tombstone needs the reason for the audit record"
    )
    assert read_tombstones(spark, lake) == []


def test_one_erasure_request_names_many_values_in_one_commit_and_one_bad_value_writes_none(spark, two_builds):
    lake = two_builds
    with pytest.raises(TombstoneError, match="value is empty"):
        request_erasures(spark, lake, "build_request_id", ["br-a", " "], actor="alice", reason="ticket 9")
    assert read_tombstones(spark, lake) == []

    recorded = request_erasures(spark, lake, "build_request_id", ["br-a", "br-b", "br-a"], actor="alice", reason="t9")

    assert sorted(t.value for t in recorded) == ["br-a", "br-b"]
    assert current_version(spark, lake.table_path(TOMBSTONES)) == 1  # created, then one commit
    assert sorted(t.value for t in read_tombstones(spark, lake)) == ["br-a", "br-b"]
    from databuild_assets.log.spark.backend import DeltaEventLog

    assert DeltaEventLog(spark, lake).get_activity_summary().total_events == 0  # both builds hidden


def test_a_partition_ref_tombstone_hides_at_once_the_partition_build_request_and_job_events_that_list_it(
    spark, two_builds
):
    lake = two_builds
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)
    # A second build of REF, folded in: the fold rewrote the file that held partition_state's
    # old REF row (no deletion vectors), so only the live row holds it.
    append_events(spark, lake, one_partition_build("br-c", REF, 20))
    refresh_filtered_log(spark, lake)
    refresh_projection(spark, lake, PROJECTIONS["partition_state"], FILTERED_EVENT_LOG, rule=FOLD)
    partition_state = lake.table_path(projection_spec(PROJECTIONS["partition_state"]))
    assert DeltaTable.forPath(spark, partition_state).history(1).first()["operation"] == "MERGE"
    assert live_parquet_rows_holding(spark, partition_state, REF) == 1

    request_erasure(spark, lake, "partition_ref", REF, actor="alice", reason="ticket 1")
    result = refresh_filtered_log(spark, lake)
    refreshed = refresh_all_projections(spark, lake, rule=FOLD)  # the keys the erased events touch recomputed

    assert {r.mode for r in refreshed.values()} == {"incremental"}
    assert (result.mode, result.deleted) == ("incremental", 6)
    assert event_ids(spark, lake.table_path(FILTERED_EVENT_LOG)) == ["br-b-1", "br-b-2", "br-b-3"]
    partitions = spark.read.format("delta").load(lake.table_path(projection_spec(PROJECTIONS["partition_state"])))
    assert [row.partition_ref for row in partitions.collect()] == [OTHER]
    for projection in PROJECTIONS.values():
        assert live_parquet_rows_holding(spark, lake.table_path(projection_spec(projection)), REF) == 0
    assert len(event_ids(spark, lake.table_path(RAW_EVENT_LOG))) == 9  # soft delete: the raw log keeps them


def test_a_refresh_with_a_new_tombstone_and_new_events_rewrites_only_the_files_of_the_dates_they_touch(spark, lake):
    day = 86_400 * 10**9
    append_events(spark, lake, one_partition_build("br-a", REF, 0) + one_partition_build("br-b", OTHER, 2 * day))
    refresh_filtered_log(spark, lake)
    path = lake.table_path(FILTERED_EVENT_LOG)
    before = set(spark.read.format("delta").load(path).inputFiles())

    request_erasure(spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 4")
    append_events(spark, lake, one_partition_build("br-c", OTHER, 4 * day) + one_partition_build("br-d", REF, 5 * day))
    result = refresh_filtered_log(spark, lake)  # one MERGE: br-a's rows out, br-c's and br-d's in

    assert (result.mode, result.inserted, result.deleted) == ("incremental", 6, 3)
    assert event_ids(spark, path) == sorted(f"{br}-{i}" for br in ("br-b", "br-c", "br-d") for i in (1, 2, 3))
    after = set(spark.read.format("delta").load(path).inputFiles())
    untouched = {f for f in before if "event_date=2025-11-20" in f}  # br-b's date (T0 is 2025-11-18)
    assert untouched and untouched <= after
    metrics = DeltaTable.forPath(spark, path).history(1).first()["operationMetrics"]
    assert metrics["numTargetFilesRemoved"] == "1"  # the one file of br-a's date


def test_compaction_purges_matching_rows_from_the_live_files_and_marks_only_its_tombstones_applied(spark, two_builds):
    lake = two_builds
    tombstone = request_erasure(spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 2")

    result = compact(spark, lake)

    assert result.rows_purged_per_tombstone == {tombstone.tombstone_id: 3}
    assert event_ids(spark, lake.table_path(RAW_EVENT_LOG)) == ["br-b-1", "br-b-2", "br-b-3"]
    for path in [lake.table_path(RAW_EVENT_LOG), lake.table_path(FILTERED_EVENT_LOG)] + [
        lake.table_path(projection_spec(p)) for p in PROJECTIONS.values()
    ]:
        assert live_parquet_rows_holding(spark, path, '"br-a"') == 0, path
    [state] = read_tombstones(spark, lake)
    assert not state.pending and state.applied_log_version == current_version(spark, lake.table_path(RAW_EVENT_LOG))
    # The dry runs' clones are gone, and their commit lock files with them.
    scratch = Path(lake.path("_scratch"))
    assert not [p for p in scratch.rglob("*") if p.is_file()], list(scratch.rglob("*"))

    late = request_erasure(spark, lake, "event_id", "br-b-3", actor="bob", reason="ticket 3")
    assert [t.tombstone_id for t in read_tombstones(spark, lake) if t.pending] == [late.tombstone_id]


def test_after_a_purge_the_filtered_log_and_the_projections_follow_the_raw_log_without_a_rebuild(spark, two_builds):
    # The purge removed only events the filtered log hides already: its commit is read past, and
    # the next landing of events folds in as usual (a rebuild would read the whole log).
    lake = two_builds
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)
    request_erasure(spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 5")
    compact(spark, lake)
    append_events(spark, lake, one_partition_build("br-c", "data/new/c", 30))

    after = refresh_filtered_log(spark, lake)
    projections = refresh_all_projections(spark, lake, rule=FOLD)

    assert (after.mode, after.inserted, after.deleted) == ("incremental", 3, 0)
    assert "1 purges of hidden events read past" in after.reason, after.reason
    assert {result.mode for result in projections.values()} == {"incremental"}
    assert event_ids(spark, lake.table_path(FILTERED_EVENT_LOG)) == event_ids(spark, lake.table_path(RAW_EVENT_LOG))
    assert event_ids(spark, lake.table_path(RAW_EVENT_LOG)) == [
        "br-b-1",
        "br-b-2",
        "br-b-3",
        "br-c-1",
        "br-c-2",
        "br-c-3",
    ]

    def read_models() -> dict[str, list]:
        return {
            p.name: sorted(
                map(
                    str,
                    spark.read.format("delta")
                    .load(lake.table_path(projection_spec(p)))
                    .select(*p.schema.names)
                    .collect(),
                )
            )
            for p in PROJECTIONS.values()
        }

    folded = read_models()
    refresh_all_projections(spark, lake, full=True)
    assert read_models() == folded


def test_a_purge_that_rewrote_a_file_the_filtered_log_has_not_read_yet_makes_it_rebuild(spark, two_builds):
    # Events landed after the filtered log's last refresh, in the file the purge then rewrote: the
    # rows it kept are in no file the filtered log would read as added, so it rebuilds.
    lake = two_builds
    refresh_filtered_log(spark, lake)
    append_events(
        spark, lake, one_partition_build("br-c", "data/new/c", 30) + one_partition_build("br-d", "data/new/d", 40)
    )
    request_erasure(spark, lake, "build_request_id", "br-c", actor="alice", reason="ticket 6")
    tombstones_version = current_version(spark, lake.table_path(TOMBSTONES))
    purge_events(spark, lake, RAW_EVENT_LOG, read_tombstones(spark, lake), tombstones_version=tombstones_version)

    result = refresh_filtered_log(spark, lake)

    assert result.mode == "full" and "removed data" in result.reason, result
    assert event_ids(spark, lake.table_path(FILTERED_EVENT_LOG)) == [
        "br-a-1", "br-a-2", "br-a-3", "br-b-1", "br-b-2", "br-b-3", "br-d-1", "br-d-2", "br-d-3"
    ]  # fmt: skip


def test_compaction_packs_the_small_files_that_refreshes_leave_in_the_projections(spark, two_builds):
    lake = two_builds
    partition_state = PROJECTIONS["partition_state"]
    path = lake.table_path(projection_spec(partition_state))
    for n in range(3):  # a full rebuild, then two folds that each add a partition's row in a file of its own
        append_events(spark, lake, one_partition_build(f"br-{n}", f"data/new/{n}", 20 + 10 * n))
        refresh_projection(spark, lake, partition_state, RAW_EVENT_LOG, rule=FOLD)
    rows = sorted(map(str, spark.read.format("delta").load(path).collect()))
    files = table_size(spark, path).num_files
    assert files == 3

    ensure_table(spark, lake.table_path(TOMBSTONES), TOMBSTONES)  # compaction reads it
    result = compact(spark, lake)

    [packed] = [table for table in result.tables if table.table == "partition_state"]
    assert (packed.files_compacted, packed.after.num_files) == (files, 1)
    assert sorted(map(str, spark.read.format("delta").load(path).collect())) == rows


def test_a_bin_pack_leaves_the_files_already_packed_to_size_and_packs_only_the_small_ones(spark, lake):
    # A service's raw log is bin-packed every ~10,000 appends: with Delta's default (files under
    # 1 GB are packed) each bin-pack would rewrite the day so far, under the commit lock.
    path = lake.table_path(RAW_EVENT_LOG)
    builds = [one_partition_build(f"br-{n}", f"data/a/{n}", 10 + 10 * n) for n in range(19)]
    for first in (0, 8):  # two files of 8 builds: packed, larger than a file of one build
        append_events(spark, lake, [event for build in builds[first : first + 8] for event in build])
    rows = sorted(map(str, spark.read.format("delta").load(path).collect()))
    bin_pack(spark, lake, RAW_EVENT_LOG, None)
    assert sorted(map(str, spark.read.format("delta").load(path).collect())) == rows  # every value, as Spark wrote it
    [packed] = DeltaTable.forPath(spark, path).detail().select("numFiles", "sizeInBytes").collect()
    assert packed["numFiles"] == 1
    first = set(spark.read.format("delta").load(path).inputFiles())
    for build in builds[16:]:
        append_events(spark, lake, build)

    rewritten = bin_pack(spark, lake, RAW_EVENT_LOG, None, packed_bytes=packed["sizeInBytes"])

    files = set(spark.read.format("delta").load(path).inputFiles())
    assert first <= files  # the packed file stays as it is
    assert rewritten == 3 and len(files) == 2  # the three small ones became one
    assert spark.read.format("delta").load(path).count() == sum(map(len, builds))


def test_erased_events_that_arrive_again_stay_hidden_and_the_next_compaction_purges_them(spark, two_builds):
    # A writer retries a call whose events were erased and purged meanwhile (or a landing file
    # comes again): the log no longer holds those event_ids, so they are appended again.
    from databuild_assets.log.spark.backend import DeltaEventLog

    lake = two_builds
    tombstone = request_erasure(spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 9")
    compact(spark, lake)
    append_events(spark, lake, one_partition_build("br-a", REF, 0))

    assert DeltaEventLog(spark, lake).get_build_request_events("br-a") == []
    again = compact(spark, lake)

    assert again.rows_purged_per_tombstone == {tombstone.tombstone_id: 3} and again.applied == ()
    assert event_ids(spark, lake.table_path(RAW_EVENT_LOG)) == ["br-b-1", "br-b-2", "br-b-3"]
    assert live_parquet_rows_holding(spark, lake.table_path(RAW_EVENT_LOG), '"br-a"') == 0
    assert compact(spark, lake).rows_purged_per_tombstone == {}


def test_after_the_compaction_and_vacuum_jobs_no_file_on_disk_holds_an_erased_value(spark, two_builds):
    # Through the Dagster jobs an operator runs, so their wiring and metadata are tested too.
    lake = two_builds
    ensure_ingest_tables(spark, lake)  # the ingest ledger too: a table of the lake that is no asset
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)
    request_erasure(spark, lake, "partition_ref", REF, actor="alice", reason="ticket 4")
    before = {f.table: f.rows_in_data_files for f in erasure_report(spark, lake)}
    assert before[RAW_EVENT_LOG.name] == 3  # old and live files still hold it: soft delete only
    resources = {"lakehouse": lakehouse_for(lake)}

    compaction = compaction_job.execute_in_process(resources=resources)
    with pytest.raises(RetentionTooShortError):
        vacuum_lake(spark, lake, retention_hours=0)
    short = {"ops": {"vacuum_tables": {"config": {"retention_hours": 0, "allow_short_retention": True}}}}
    vacuum = vacuum_job.execute_in_process(run_config=short, resources=resources)
    report = erasure_report_job.execute_in_process(resources=resources)

    asset_keys = {key.to_user_string() for key in project_defs.resolve_asset_graph().get_all_asset_keys()}
    for run, op in ((compaction, "compact_lake"), (vacuum, "vacuum_tables")):
        materialized = {event.asset_key.to_user_string() for event in run.get_asset_materialization_events()}
        assert {RAW_EVENT_LOG.name, FILTERED_EVENT_LOG.name, TOMBSTONES.name} <= materialized <= asset_keys
        assert f"| {INGEST_LEDGER.name} |" in op_output_metadata(run, op)["tables"]  # reported, not materialized
    assert op_output_metadata(compaction, "compact_lake")["tombstones_applied"] == 1
    # Where a run's time went, phase by phase, in the order they ran (a tombstone was pending: a purge ran).
    assert list(op_output_metadata(compaction, "compact_lake")["phase_seconds"]) == [
        "tombstones", "bin-pack logs", "purge", "projections", "bin-pack", "landing files", "record applied",
        "checkpoints",
    ]  # fmt: skip
    assert op_output_metadata(vacuum, "vacuum_tables")["files_deleted"] > 0
    assert op_output_metadata(report, "report_erasure")["rows_still_holding_values"] == 0
    findings = erasure_report(spark, lake)
    assert {f.table for f in findings} >= {RAW_EVENT_LOG.name, FILTERED_EVENT_LOG.name, "partition_state"}
    assert TOMBSTONES.name not in {f.table for f in findings}
    assert [
        (f.table, f.rows_in_data_files, f.delta_log_mentions)
        for f in findings
        if f.rows_in_data_files or f.delta_log_mentions
    ] == []


def test_a_purge_whose_dry_run_keeps_other_rows_than_expected_fails_and_leaves_the_table_unchanged(spark, two_builds):
    lake = two_builds
    tombstone = request_erasure(spark, lake, "event_id", "br-a-1", actor="alice", reason="ticket 5")
    path = lake.table_path(RAW_EVENT_LOG)
    version = current_version(spark, path)
    wrong_ids = spark.createDataFrame([("br-a-1",), ("br-b-1",)], "event_id string")  # one too many

    with pytest.raises(PurgeVerificationError) as error:
        purge_events(spark, lake, RAW_EVENT_LOG, [tombstone], event_ids=wrong_ids)

    assert "The table is unchanged" in str(error.value)
    assert current_version(spark, path) == version and len(event_ids(spark, path)) == 6


def test_a_purge_rewrites_only_the_files_that_held_erased_rows_and_checks_only_their_partitions(spark, lake):
    day = 86_400 * 10**9
    for i in range(3):  # three builds, a day apart: a file each, in three date partitions
        append_events(spark, lake, one_partition_build(f"br-{i}", f"data/d/{i}", i * day))
    path = lake.table_path(RAW_EVENT_LOG)
    tombstone = request_erasure(spark, lake, "build_request_id", "br-1", actor="alice", reason="ticket 8")
    # Ids of another partition slipped into the delete: the check reads that partition too.
    wrong_ids = spark.createDataFrame([("br-1-1",), ("br-1-2",), ("br-1-3",), ("br-2-1",)], "event_id string")
    with pytest.raises(PurgeVerificationError):
        purge_events(spark, lake, RAW_EVENT_LOG, [tombstone], event_ids=wrong_ids)

    result = compact(spark, lake)

    raw = next(t for t in result.tables if t.table == RAW_EVENT_LOG.name)
    assert (raw.rows_purged, raw.files_rewritten, raw.before.num_files) == (3, 1, 3)
    assert event_ids(spark, path) == ["br-0-1", "br-0-2", "br-0-3", "br-2-1", "br-2-2", "br-2-3"]


def test_appends_that_arrive_while_compaction_runs_all_land(spark, two_builds):
    lake = two_builds
    request_erasure(spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 6")
    sent = [one_partition_build(f"br-late-{i}", f"data/late/{i}", 100 + 10 * i) for i in range(4)]
    errors = []

    def writer():
        try:
            for events in sent:
                append_events(spark, lake, events, writer="during-compaction")
        except Exception as error:  # surfaced below
            errors.append(error)

    thread = threading.Thread(target=writer)
    thread.start()
    compact(spark, lake)
    thread.join()

    ids = event_ids(spark, lake.table_path(RAW_EVENT_LOG))
    assert errors == []
    assert ids == sorted(["br-b-1", "br-b-2", "br-b-3"] + [e["event_id"] for events in sent for e in events])


def test_the_schedules_and_the_erase_jobs_config_validate():
    Definitions.validate_loadable(project_defs)
    schedules = {
        name: (schedule.cron_schedule, schedule.job_name)
        for name in ("compaction_schedule", "vacuum_schedule")
        for schedule in [project_defs.resolve_schedule_def(name)]
    }
    assert schedules == {
        "compaction_schedule": ("0 3 * * *", "compaction_job"),
        "vacuum_schedule": ("0 4 * * 0", "vacuum_job"),
    }
    erase = project_defs.resolve_job_def("erase_job")
    request = {
        "ops": {
            "tombstones": {"config": {"key": "partition_ref", "value": REF, "actor": "alice", "reason": "ticket 7"}}
        }
    }
    assert validate_run_config(erase, request)
    many = {"key": "partition_ref", "values": [REF, OTHER], "actor": "a", "reason": "r"}
    assert validate_run_config(erase, {"ops": {"tombstones": {"config": many}}})
    vacuum = project_defs.resolve_job_def("vacuum_job")
    assert validate_run_config(vacuum, {"ops": {"vacuum_tables": {"config": {"retention_hours": 200}}}})


def test_the_delta_query_api_hides_tombstoned_events_from_the_moment_the_tombstone_is_committed(spark, two_builds):
    from databuild_assets.log.spark.backend import DeltaEventLog

    lake = two_builds
    bel = DeltaEventLog(spark, lake)
    assert [e["event_id"] for e in bel.get_build_request_events("br-a")] == ["br-a-1", "br-a-2", "br-a-3"]
    assert {b.build_request_id for b in bel.list_build_requests()} == {"br-a", "br-b"}

    request_erasure(
        spark, lake, "build_request_id", "br-a", actor="alice", reason="ticket 8"
    )  # no refresh, no compaction

    assert bel.get_build_request_events("br-a") == []
    assert bel.get_partition_events(REF) == []
    assert {b.build_request_id for b in bel.list_build_requests()} == {"br-b"}
    assert bel.get_latest_partition_status(REF) is None


def test_the_filtered_log_follows_a_raw_log_that_was_replaced_by_a_younger_one(spark, lake, tmp_path):
    for n in range(3):  # refreshed as they land: appends with the idempotent ids of raw log versions 1 and 2
        append_events(spark, lake, one_partition_build(f"br-old-{n}", f"data/old{n}", n), writer="old")
        refresh_filtered_log(spark, lake)
    shutil.rmtree(lake.table_path(RAW_EVENT_LOG))  # a new raw log: its versions start again at 0

    append_events(spark, lake, one_partition_build("br-new-1", "data/new1", 10), writer="new")
    replaced = refresh_filtered_log(spark, lake)
    append_events(spark, lake, one_partition_build("br-new-2", "data/new2", 20), writer="new")
    after = refresh_filtered_log(spark, lake)  # raw log version 1 again: Delta skips the append, the MERGE runs

    assert replaced.mode == "full" and "newer than" in replaced.reason
    assert after.mode == "incremental" and after.inserted == 3
    visible = spark.read.format("delta").load(lake.table_path(FILTERED_EVENT_LOG))
    assert sorted(row.build_request_id for row in visible.select("build_request_id").distinct().collect()) == [
        "br-new-1",
        "br-new-2",
    ]


def test_the_spark_rule_matches_json_text_fields_as_the_python_rule_does_with_one_or_many_tombstones(spark, lake):
    ref = "data/users/id=42"
    configs = {
        "named": json.dumps({"inputs": [ref]}),
        "as-a-key": json.dumps({ref: 1}),
        "first": f'"{ref}" and more',
        "longer-ref": json.dumps({"inputs": [ref + "/part=1"]}),
        "prefixed-ref": json.dumps({"inputs": ["x" + ref]}),
        "no-quote-before": ref + '"',
        "slash-escaped": json.dumps({"inputs": [ref]}).replace("/", "\\/"),
        "empty": "",
        "quoted-value": json.dumps({"inputs": ['say "hi"']}),
        "nested": json.dumps({"config": json.dumps({"inputs": [ref]})}),
    }
    events = []
    for name, config in configs.items():
        (build_event, job, available) = one_partition_build(f"br-{name}", "data/other", 0)
        job["job_event"]["config"] = config
        job["job_event"]["target_partitions"] = []
        events.append(job)
    # A value Spark's SQL would read otherwise if it were not quoted right: a quote, backslashes, non-ASCII.
    odd = "data/o'brien\\u0041\\/é"
    *_, odd_available = one_partition_build("br-odd", odd, 0)
    odd_job = one_partition_build("br-odd-config", "data/other", 0)[1]
    odd_job["job_event"].update(config=json.dumps({"inputs": [odd]}), target_partitions=[])
    events += [odd_available, odd_job]
    append_events(spark, lake, events)
    rows = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    noise = [f"data/nothing/id={i}" for i in range(500)]  # many tombstones that match nothing
    for values in ([ref], ['say "hi"'], [odd], ["data/o'brien"], [ref, *noise], ['say "hi"', odd, *noise]):
        tombstones = [Tombstone(f"t{i}", "partition_ref", value, "a", "r", None) for i, value in enumerate(values)]
        in_spark = {row.event_id for row in matching_events(rows, tombstones).collect()}
        in_python = {e["event_id"] for e in events if matches(e, {"partition_ref": set(values)})}
        assert in_spark == in_python, values
    assert {e["event_id"] for e in events if matches(e, {"partition_ref": {ref}})} == {
        "br-named-2",
        "br-as-a-key-2",
        "br-first-2",
    }
    assert {e["event_id"] for e in events if matches(e, {"partition_ref": {odd}})} == {"br-odd-3", "br-odd-config-2"}


def test_a_bad_line_is_matched_by_its_text_with_one_tombstone_or_thousands(spark):
    ref = "data/o'brien/id=1"
    texts = [f'{{"partition_ref": {json.dumps(ref)}', ref.replace("/", "\\/"), "nothing here", None]
    lines = spark.createDataFrame([(text,) for text in texts], "line string")
    for noise in (0, 3000):  # 3,000 values: a chain of their tests overflowed Spark's analyzer
        values = [ref, *(f"data/nothing/id={i}" for i in range(noise))]
        tombstones = [Tombstone(f"t{i}", "partition_ref", value, "a", "r", None) for i, value in enumerate(values)]
        assert [row.line for row in lines_mentioning(lines, "line", tombstones).collect()] == texts[:2]
