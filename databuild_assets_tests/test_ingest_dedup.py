"""Every event_id stored once, by either way of knowing which are new (ingest/dedup.py): the serving
index's keys when the lake has one that can be followed, else a MERGE on event_id."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from databuild_assets.ingest.landing import (
    EVENTS_APP_ID,
    _Ledger,
    ensure_ingest_tables,
    ingest_landing_files,
    write_batch,
)
from databuild_assets.ingest.landing_folder import list_landing_files
from databuild_assets.ingest.writer import append_events
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER, IndexFolder
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_log import commit_path
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets_tests.serving_support import data_files_named, data_files_on_disk, soon
from databuild_assets_tests.support import partition_event_at, write_landing

DAY_NS = 86_400 * 10**9


def stored(spark, lake) -> list[tuple[str, int, str]]:
    """(event_id, timestamp, source file name) of every raw log row."""
    rows = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect()
    return sorted((row.event_id, row.timestamp, row.source_file.rsplit("/", 1)[-1]) for row in rows)


def operations(spark, lake) -> list[str]:
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.table_path(RAW_EVENT_LOG)}`").collect()
    return [h.operation for h in sorted(history, key=lambda h: h.version)]


@pytest.mark.parametrize("serving_index", [True, False], ids=["key-lookup", "merge"])
def test_a_redelivery_with_another_timestamp_is_skipped_whichever_way_the_batch_is_deduplicated(
    spark, lake, serving_index
):
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), partition_event_at("a2", 1)])
    ingest_landing_files(spark, lake)
    if serving_index:
        refresh_serving_index(lake)
    # a2 again a day later (another event_date partition), b1 twice, and one new event.
    redelivered = {**partition_event_at("a2", 1), "timestamp": partition_event_at("a2", 1)["timestamp"] + DAY_NS}
    write_landing(lake, "b.jsonl", [redelivered, partition_event_at("b1", 2), partition_event_at("b1", 2)])
    write_landing(lake, "c.jsonl", [partition_event_at("c1", 3)])

    result = ingest_landing_files(spark, lake)
    again = ingest_landing_files(spark, lake)
    write_landing(lake, "d.jsonl", [partition_event_at("a1"), partition_event_at("c1", 3)])
    only_duplicates = ingest_landing_files(spark, lake)

    a = partition_event_at("a1")["timestamp"]
    assert (result.lines_read, result.accepted, result.duplicates) == (4, 2, 2)
    assert again.batches == ()
    assert (only_duplicates.accepted, only_duplicates.duplicates) == (0, 2)
    assert stored(spark, lake) == [
        ("a1", a, "a.jsonl"),
        ("a2", a + 1, "a.jsonl"),
        ("b1", a + 2, "b.jsonl"),
        ("c1", a + 3, "c.jsonl"),
    ]
    # A batch of duplicates only commits too: the raw log's record of the batch.
    assert operations(spark, lake) == ["CREATE TABLE", "MERGE", *[("WRITE" if serving_index else "MERGE")] * 2]


def test_the_lookup_catches_the_index_up_with_commits_made_since_its_stamp(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1")])
    ingest_landing_files(spark, lake)
    refresh_serving_index(lake)
    # Two commits the index has not seen: the writer API's, and a MERGE (a lake without a
    # followable index at that moment would make one; repair's put-back makes one too).
    append_events(spark, lake, [partition_event_at("w1", 1)], writer="svc")
    write_landing(lake, "b.jsonl", [{**partition_event_at("w1", 1), "timestamp": 7}, partition_event_at("b1", 2)])

    result = ingest_landing_files(spark, lake)

    assert (result.accepted, result.duplicates) == (1, 1)
    assert [row[0] for row in stored(spark, lake)] == ["a1", "b1", "w1"]
    assert operations(spark, lake)[-2:] == ["WRITE", "WRITE"]


def test_a_batch_replayed_after_its_append_committed_writes_nothing_again(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a0")])
    ingest_landing_files(spark, lake)
    refresh_serving_index(lake)
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 1), partition_event_at("b2", 2), "not json"])
    ledger = _Ledger(spark, lake)
    batch_id, files = ledger.plan(list_landing_files(spark, lake.landing), ledger.rows())
    write_batch(spark, lake, batch_id, files)  # the append lands; the process "dies" before recording

    (replay,) = ingest_landing_files(spark, lake).batches

    assert (replay.batch_id, replay.replayed, replay.accepted, replay.duplicates) == (batch_id, True, 2, 0)
    assert [row[0] for row in stored(spark, lake)] == ["a0", "b1", "b2"]
    assert operations(spark, lake)[-1] == "WRITE"


def test_an_index_that_cannot_be_followed_is_left_to_its_asset_and_the_batch_merges(spark, lake):
    ensure_ingest_tables(spark, lake)
    refresh_serving_index(lake)  # stamped with the empty raw log's first version
    folder = IndexFolder(lake.path(SERVING_INDEX_FOLDER))
    index_before = folder.current()[0]
    # The raw log replaced at its path: the index followed another table.
    shutil.rmtree(lake.table_path(RAW_EVENT_LOG))
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), partition_event_at("a1")])

    result = ingest_landing_files(spark, lake)

    assert (result.accepted, result.duplicates) == (1, 1)
    assert operations(spark, lake) == ["CREATE TABLE", "MERGE"]
    assert folder.current()[0] == index_before  # no build in the ingestion: the serving_index asset's work


def test_an_index_ahead_of_a_raw_log_restored_to_an_older_version_is_not_asked(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1")])
    ingest_landing_files(spark, lake)
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 1)])
    ingest_landing_files(spark, lake)
    refresh_serving_index(lake)  # holds b1
    # A copy (the session's Delta caches know the original) whose raw log is back at the version
    # before b1: what `repair` does to a damaged newer commit.
    restored = Lake(str(shutil.copytree(lake.root, Path(lake.root).with_name("restored"))))
    newest = max(Path(restored.table_path(RAW_EVENT_LOG), "_delta_log").glob("*.json"))
    for file in newest.parent.glob(f"*{newest.stem}.*"):  # its commit, checksum and Hadoop .crc files
        file.rename(newest.parent.parent / file.name)
    write_landing(restored, "b-again.jsonl", [partition_event_at("b1", 1)])

    result = ingest_landing_files(spark, restored)

    # The copy's ledger names the original's landing files: its own three files are new to it.
    assert (result.lines_read, result.accepted, result.duplicates) == (3, 1, 2)
    assert [row[0] for row in stored(spark, restored)] == ["a1", "b1"]


def test_a_batch_looked_up_by_key_writes_its_files_before_it_takes_the_commit_lock(spark, lake):
    # Every JVM-free appender waits while an ingestion holds the raw log's commit lock. A Spark
    # commit under it held them 3 to 11 s at every landing file in bench.soak; the files are now
    # written before the lock, and under it the batch is looked up and a commit file written.
    write_landing(lake, "a.jsonl", [partition_event_at("a0")])
    ingest_landing_files(spark, lake)
    refresh_serving_index(lake)
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 1), partition_event_at("b2", 2)])
    path, outcome = lake.table_path(RAW_EVENT_LOG), {}
    committed = data_files_named(path)
    thread = threading.Thread(target=lambda: outcome.update(result=ingest_landing_files(spark, lake)))
    with commit_lock(path):  # held by this thread: the ingestion's thread waits for it
        thread.start()
        staged = soon(lambda: data_files_on_disk(path) - committed, timeout_s=120)
        assert staged, "the ingestion wrote no data file before taking the commit lock"
        assert thread.is_alive()
    thread.join(300)

    (batch,) = outcome["result"].batches
    assert (batch.accepted, batch.duplicates) == (2, 0)
    assert [row[0] for row in stored(spark, lake)] == ["a0", "b1", "b2"]
    assert data_files_on_disk(path) == data_files_named(path) == committed | staged
    actions = [json.loads(line) for line in commit_path(path, batch.log_version).read_text().splitlines()]
    info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
    assert json.loads(info["userMetadata"]) == {"ingest_batch": batch.batch_id}
    (txn,) = [action["txn"] for action in actions if "txn" in action]  # a replay of the batch writes nothing
    assert (txn["appId"], txn["version"]) == (EVENTS_APP_ID, batch.batch_id)
