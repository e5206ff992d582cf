"""The JVM-free appends keep the raw log checkpointed as it grows (log/serving/checkpoints.py):
within the table's checkpoint interval of its newest version whoever commits, in a checkpoint
Spark, delta-rs and our own log readers read, and that holds no erasable value."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from databuild_assets.log import SqliteEventLog
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import append_files, raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.checkpoints import (
    CHECKPOINT_BASE,
    Checkpointer,
    checkpoint_due,
    checkpoint_if_due,
    checkpoint_interval,
)
from databuild_assets.log.serving.follower import DeltaFollower
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.log_checkpoints import thin_checkpoints
from databuild_assets.runtime.commit_lock import checkpoint_lock_path
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_log import checkpoint_path, last_checkpoint, read_log
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.lock_files import lock_if_free
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases

_ERASABLE_KEYS = ("event_id", "build_request_id", "job_run_id", "partition_ref", "requested_partitions")


def _append_in_batches(log: DeltaRsEventLog, events: list[dict[str, Any]], size: int = 5) -> None:
    for start in range(0, len(events), size):
        log.append_events(events[start : start + size])


def _commit_info(path: str, version: int) -> dict[str, Any]:
    first_line = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()[0]
    return json.loads(first_line)["commitInfo"]


def _erasable_values(value: Any, key: str = "") -> set[str]:
    """Every value an erasure can name in `value` (an event): its ids and partition refs."""
    if isinstance(value, dict):
        return set().union(*(_erasable_values(inner, name) for name, inner in value.items()))
    if isinstance(value, list):
        return set().union(set(), *(_erasable_values(inner, key) for inner in value))
    return {value} if key in _ERASABLE_KEYS and isinstance(value, str) else set()


def _field_names(data_type: pa.DataType) -> set[str]:
    if not pa.types.is_struct(data_type):
        return set()
    return set().union(*({field.name} | _field_names(field.type) for field in data_type))


def test_jvm_free_appends_keep_a_checkpoint_within_the_interval_that_spark_delta_rs_and_our_readers_read(
    spark, lake: Lake
) -> None:
    path = lake.table_path(RAW_EVENT_LOG)
    events = list(generate_events(650, seed=21))
    with DeltaRsEventLog(lake) as log:
        _append_in_batches(log, events[:300])
        compact(spark, lake)  # removes the appended files: the next checkpoint carries remove actions
        compacted = deltalake.DeltaTable(path).version()
        _append_in_batches(log, events[300:])
    newest = deltalake.DeltaTable(path).version()
    last = DeltaFollower(path).last_checkpoint()
    checkpoint = pq.read_table(checkpoint_path(path, last))
    removes = checkpoint.num_rows - checkpoint.column("remove").null_count
    assert removes >= 60  # it holds the compaction's removes, kept as tombstones
    # The interval counts every action an open reads, the tombstones too, not the live files only.
    assert last_checkpoint(path) == (last, checkpoint.num_rows)
    interval = checkpoint_interval({}, checkpoint.num_rows)

    assert newest - compacted > 3 * interval  # the appends alone crossed the interval, more than once
    assert last is not None and compacted < last <= newest < last + interval
    assert _commit_info(path, last)["engineInfo"] == "databuild-assets"  # an append's, not Spark's
    # Written from the checkpoint before and the commits since (runtime/delta_checkpoint.py), not
    # by delta-rs, whose load lists `_delta_log`.
    assert pq.ParquetFile(checkpoint_path(path, last)).metadata.created_by.startswith("parquet-cpp-arrow")

    # Our own log reader builds the state from that checkpoint, and it is delta-rs's.
    state = read_log(path)
    assert (state.checkpoint, state.version, state.damage) == (last, newest, [])
    delta_rs_files = set(deltalake.DeltaTable(path).get_add_actions(flatten=True).column("path").to_pylist())
    assert set(state.files) == delta_rs_files

    # Spark reads the checkpointed table as delta-rs does, and travels back past the checkpoint.
    by_spark = sorted(row["event_id"] for row in spark.read.format("delta").load(path).select("event_id").collect())
    by_delta_rs = sorted(DeltaFollower(path).load(["event_id"]).column("event_id").to_pylist())
    assert by_spark == by_delta_rs == sorted(event["event_id"] for event in events)
    assert spark.read.format("delta").option("versionAsOf", 30).load(path).count() == 150
    assert spark.read.format("delta").option("versionAsOf", last).load(path).count() == len(events) - 5 * (
        newest - last
    )

    # A serving index built afresh from the checkpointed table answers as the reference backend.
    shutil.rmtree(Path(lake.root) / "serving_index")
    with DeltaRsEventLog(lake) as rebuilt, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(rebuilt, *keys) == bel_cases.answers(reference, *keys)


def test_a_checkpoint_another_writer_left_due_is_written_by_the_next_append(lake: Lake) -> None:
    # A writer that never checkpoints (or an appender that died before its checkpoint) commits
    # past the interval; the next append finds the log that far past `_last_checkpoint`.
    behind = 3 * CHECKPOINT_BASE
    events = list(generate_events(5 * (behind + 6), seed=22))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    path = lake.table_path(RAW_EVENT_LOG)
    columns = list(deltalake.DeltaTable(path).metadata().configuration["delta.dataSkippingStatsColumns"].split(","))
    for version in range(2, behind + 6):
        rows = raw_log_rows(enumerate(canonical_event(e) for e in events[5 * (version - 1) : 5 * version]), "other")
        append_files(path, version, rows, ["event_date"], columns)
    assert DeltaFollower(path).last_checkpoint() is None

    with DeltaRsEventLog(lake) as log:
        log.append_events(events[-5:])

    newest = deltalake.DeltaTable(path).version()
    assert newest == behind + 6
    assert DeltaFollower(path).last_checkpoint() == newest
    assert read_log(path).checkpoint == newest


def test_an_append_leaves_a_due_checkpoint_to_the_appender_already_writing_one(lake: Lake) -> None:
    # While one process writes a checkpoint (holding the checkpoint lock) the others commit and
    # return without writing their own; the next append after it is released writes one.
    events = list(generate_events(5 * (CHECKPOINT_BASE + 2), seed=25))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])  # creates the raw log
        with lock_if_free(checkpoint_lock_path(path)) as held:
            assert held
            _append_in_batches(log, events[5:-5])
            log._checkpoints.wait()
            assert DeltaFollower(path).last_checkpoint() is None  # due since version 15, left to the holder
        log.append_events(events[-5:])
    newest = deltalake.DeltaTable(path).version()
    assert newest == CHECKPOINT_BASE + 2  # the create, then one commit a batch
    assert DeltaFollower(path).last_checkpoint() == newest  # written once the lock was free
    assert oct(os.stat(checkpoint_lock_path(path)).st_mode & 0o777) == "0o600"


def test_a_checkpoint_falling_due_while_the_previous_one_is_written_is_written_after_it(lake: Lake) -> None:
    # The last appends of a run can fall due while this process's thread still writes the
    # previous checkpoint; no later append comes to write theirs, so the thread does.
    events = list(generate_events(5 * (2 * CHECKPOINT_BASE + 1), seed=27))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    columns = deltalake.DeltaTable(path).metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    for version in range(2, 2 * CHECKPOINT_BASE + 1):
        rows = raw_log_rows(enumerate(canonical_event(e) for e in events[5 * (version - 1) : 5 * version]), "other")
        append_files(path, version, rows, ["event_date"], columns)

    checkpoints = Checkpointer(path)
    assert checkpoints.after_commit(CHECKPOINT_BASE - 1, {})  # versions 0 to 15: due
    assert not checkpoints.after_commit(2 * CHECKPOINT_BASE, {})  # due too, while v15's is written
    checkpoints.wait()
    assert DeltaFollower(path).last_checkpoint() == 2 * CHECKPOINT_BASE
    assert (Path(path) / "_delta_log" / f"{CHECKPOINT_BASE - 1:020d}.checkpoint.parquet").exists()


def test_the_appends_checkpoint_is_written_while_another_process_holds_the_commit_lock(lake: Lake, monkeypatch) -> None:
    # The checkpoint is written beside the appends: it never waits for the commit lock, which an
    # ingestion, a compaction or the other appenders hold meanwhile.
    events = list(generate_events(5 * (CHECKPOINT_BASE + 1), seed=26))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    columns = deltalake.DeltaTable(path).metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    for version in range(2, CHECKPOINT_BASE + 2):
        rows = raw_log_rows(enumerate(canonical_event(e) for e in events[5 * (version - 1) : 5 * version]), "other")
        append_files(path, version, rows, ["event_date"], columns)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_COMMIT_LOCK, path], stdout=subprocess.PIPE, text=True)
    monkeypatch.setenv("DATABUILD_LOCK_TIMEOUT_S", "5")  # a wait for the commit lock would fail, not hang
    try:
        assert holder.stdout.readline().strip() == "held"
        assert checkpoint_if_due(path, CHECKPOINT_BASE + 1) == CHECKPOINT_BASE + 1
    finally:
        holder.kill()
        holder.wait()
    assert DeltaFollower(path).last_checkpoint() == CHECKPOINT_BASE + 1


def test_a_checkpoint_lists_the_log_again_when_a_listing_missed_a_commit_being_written(lake: Lake) -> None:
    # Outside the commit lock a listing of the log can miss commit N while it shows N+1 (ext4
    # lists in hash order; seen in bench.soak). A gap that is gone at the next listing is that
    # race; one that stays is a damaged log, raised.
    events = list(generate_events(5 * (CHECKPOINT_BASE + 2), seed=27))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
        with lock_if_free(checkpoint_lock_path(path)):  # no checkpoint of the appends' own
            _append_in_batches(log, events[5:])
            log._checkpoints.wait()
    newest = deltalake.DeltaTable(path).version()
    missing = Path(path) / "_delta_log" / f"{newest - 1:020d}.json"
    aside = Path(path).parent / "commit-aside.json"
    missing.rename(aside)
    with pytest.raises(Exception, match="found gap"):
        checkpoint_if_due(path, newest)
    assert DeltaFollower(path).last_checkpoint() is None

    back = threading.Timer(0.02, aside.rename, args=(missing,))
    back.start()
    try:
        assert checkpoint_if_due(path, newest) == newest
    finally:
        back.join()
    assert DeltaFollower(path).last_checkpoint() == newest


_HOLD_COMMIT_LOCK = """
import sys, time
from databuild_assets.runtime.commit_lock import commit_lock
with commit_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_checkpoint_written_by_the_appends_holds_no_erasable_value(lake: Lake) -> None:
    # EVENTS.md, Tombstones: statistics only on columns no tombstone can name, in the log's
    # checkpoints too, since a checkpoint holds every live file's statistics.
    events = list(generate_events(5 * (CHECKPOINT_BASE + 2), seed=23))
    with DeltaRsEventLog(lake) as log:
        _append_in_batches(log, events)
    path = lake.table_path(RAW_EVENT_LOG)
    last = DeltaFollower(path).last_checkpoint()
    assert last is not None
    checkpoint = pq.read_table(checkpoint_path(path, last))

    assert "stats_parsed" not in _field_names(pa.struct(list(checkpoint.schema)))
    statistics = [json.loads(add["stats"]) for add in checkpoint.column("add").to_pylist() if add is not None]
    assert len(statistics) >= CHECKPOINT_BASE - 1  # every append but version 0, the create
    assert {
        name for stats in statistics for kind in ("minValues", "maxValues", "nullCount") for name in stats[kind]
    } <= set(RAW_EVENT_LOG.stats_columns)
    text = json.dumps(checkpoint.to_pylist(), default=str)
    values = set().union(*(_erasable_values(event) for event in events))
    assert len(values) > 100
    assert sorted(value for value in values if value in text) == []


def test_the_interval_grows_with_the_actions_a_checkpoint_holds():
    # An open reads the checkpoint (a cost per action: live files and tombstones) and replays the
    # commits after it (a cost per commit): the interval keeps the replay within about the
    # checkpoint's read.
    assert checkpoint_due(15, None, 0, {})  # versions 0 to 15, no checkpoint yet
    assert not checkpoint_due(14, None, 0, {})
    assert checkpoint_due(99 + 16, 99, 100, {})  # 100 actions: still the base
    assert not checkpoint_due(99 + 65, 99, 10_000, {})  # 10,000 actions: due 66 commits past
    assert checkpoint_due(99 + 66, 99, 10_000, {})
    assert checkpoint_due(149, 99, 50_000, {"delta.checkpointInterval": "50"})  # the table's own
    assert not checkpoint_due(148, 99, 0, {"delta.checkpointInterval": "50"})
    assert checkpoint_due(99 + 16, 99, 0, {"delta.checkpointInterval": "x"})


def test_old_checkpoints_are_thinned_to_one_an_hour_and_every_version_still_reads(spark, tmp_path: Path) -> None:
    # A checkpoint every interval under a service's appends, each listing every live file, would
    # keep gigabytes an hour for the log's retention: compaction keeps the first of each hour.
    path = str(tmp_path / "table")
    now = 1_800_000_000.0  # an hour boundary: 500,000 hours
    ages = {1: 3 * 3600 - 10, 2: 3 * 3600 - 20, 3: 3 * 3600 - 30, 4: 2 * 3600 - 10, 5: 2 * 3600 - 20, 6: 60, 7: 30}
    for version in range(8):
        deltalake.write_deltalake(path, pa.table({"n": [version]}), mode="append")
        if version in ages:
            deltalake.DeltaTable(path).create_checkpoint()
            os.utime(checkpoint_path(path, version), (now - ages[version], now - ages[version]))
    log_files = sorted(p.name for p in (Path(path) / "_delta_log").iterdir())

    assert thin_checkpoints(path, now=now) == 3

    kept = {v for v in ages if checkpoint_path(path, v).exists()}
    assert kept == {1, 4, 6, 7}  # the first of each old hour; the last ten minutes' ones
    assert {p.name for p in (Path(path) / "_delta_log").iterdir()} == set(log_files) - {
        checkpoint_path(path, v).name for v in (2, 3, 5)
    }
    assert thin_checkpoints(path, now=now) == 0
    for version in range(8):  # time travel to every version, by Spark and by delta-rs
        expected = list(range(version + 1))
        by_spark = spark.read.format("delta").option("versionAsOf", version).load(path).collect()
        assert sorted(row["n"] for row in by_spark) == expected
        assert sorted(deltalake.DeltaTable(path, version=version).to_pyarrow_table()["n"].to_pylist()) == expected
    state = read_log(path)
    assert (state.checkpoint, state.version, state.damage) == (7, 7, [])


def test_an_appends_checkpoint_leaves_no_stale_hadoop_checksum_of_last_checkpoint(spark, lake: Lake) -> None:
    # Spark keeps a checksum of `_last_checkpoint` beside it (Hadoop's local filesystem) and checks
    # it at each read; delta-rs rewrites the file, not the checksum: Spark's every open then
    # failed the check, slept, retried and listed the log instead.
    events = list(generate_events(20, seed=24))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    path = lake.table_path(RAW_EVENT_LOG)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    checksum = Path(path) / "_delta_log" / "._last_checkpoint.crc"
    assert checksum.exists()  # Spark's checkpoint of its own commit

    with DeltaRsEventLog(lake) as log:
        log.append_events(events[5:])

    assert DeltaFollower(path).last_checkpoint() == deltalake.DeltaTable(path).version()  # the append's
    assert not checksum.exists()
    assert spark.read.format("delta").load(path).count() == len(events)


def _listed_newest(table: str) -> int:
    return max(int(name.split(".")[0]) for name in os.listdir(f"{table}/_delta_log") if name.endswith(".json"))


def test_the_newest_version_is_found_from_the_checkpoint_without_listing_and_agrees_with_a_listing(tmp_path) -> None:
    # The log keeps every commit of its retention; a sensor's tick must not read every name.
    table = str(tmp_path / "t")
    deltalake.write_deltalake(table, pa.table({"n": [0]}))
    for newest in range(1, 3):
        deltalake.write_deltalake(table, pa.table({"n": [newest]}), mode="append")
    assert latest_version_on_disk(table) == 2  # no checkpoint yet: listed
    deltalake.DeltaTable(table).create_checkpoint()
    for newest in range(3, 45):
        assert latest_version_on_disk(table) == newest - 1 == _listed_newest(table)
        deltalake.write_deltalake(table, pa.table({"n": [newest]}), mode="append")
    # A name in the folder that no reader follows is not looked for: a commit past a gap.
    (tmp_path / "t" / "_delta_log" / f"{1_000:020d}.json").write_text("{}\n")
    assert latest_version_on_disk(table) == 44
    # The commits before the checkpoint cleaned up: found from the checkpoint all the same.
    for version in range(2):
        os.unlink(tmp_path / "t" / "_delta_log" / f"{version:020d}.json")
    assert latest_version_on_disk(table) == 44
    # A `_last_checkpoint` naming a checkpoint that is not there (several parts, or gone): listed.
    checkpoint_path(table, 2).unlink()
    assert latest_version_on_disk(table) == 1_000
    assert latest_version_on_disk(str(tmp_path / "none")) is None
