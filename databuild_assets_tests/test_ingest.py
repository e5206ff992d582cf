"""Landing files -> raw_event_log and event_quarantine: exactly once, nothing lost."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from databuild_assets.events.schema import event_from_row, normalize_event
from databuild_assets.events.validation import MAX_LINE_BYTES, InvalidEventError
from databuild_assets.ingest.landing import _Ledger, ensure_ingest_tables, ingest_landing_files, write_batch
from databuild_assets.ingest.landing_folder import list_landing_files
from databuild_assets.ingest.writer import append_events
from databuild_assets.runtime.delta_tables import check_schema_version
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG
from databuild_assets_tests.support import ONE_EVENT_OF_EACH_TYPE, partition_event_at, write_landing


def raw_log_events(spark, lake) -> list[dict]:
    rows = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).orderBy("timestamp", "event_id").collect()
    return [event_from_row(row) for row in rows]


def quarantine(spark, lake) -> dict[int, str]:
    rows = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()
    return {row.line_number: row.reason for row in rows}


def test_every_event_type_round_trips_from_json_through_delta_unchanged(spark, lake):
    write_landing(lake, "events-00000.jsonl", ONE_EVENT_OF_EACH_TYPE)

    result = ingest_landing_files(spark, lake)

    assert result.accepted == 8
    assert raw_log_events(spark, lake) == [normalize_event(event) for event in ONE_EVENT_OF_EACH_TYPE]


def test_raw_log_is_partitioned_by_utc_event_date_and_carries_schema_version(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("late-evening", offset_ns=-1), partition_event_at("midnight")])
    ingest_landing_files(spark, lake)

    dates = {
        r.event_id: str(r.event_date) for r in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect()
    }
    assert dates == {"late-evening": "2025-11-17", "midnight": "2025-11-18"}
    assert sorted(os.listdir(lake.table_path(RAW_EVENT_LOG))) == [
        "_delta_log",
        "event_date=2025-11-17",
        "event_date=2025-11-18",
    ]
    assert check_schema_version(spark, lake.table_path(RAW_EVENT_LOG)) == 1


def test_each_kind_of_bad_line_is_quarantined_with_its_own_reason_and_good_lines_land(spark, lake):
    good = partition_event_at("good-1")
    bad_lines = {
        2: "this is not json",
        3: {**partition_event_at("x1"), "event_type": "mystery_event"},
        4: {**partition_event_at("x2"), "job_event": {"job_run_id": "jr", "status_code": 1}},
        5: {k: v for k, v in partition_event_at("x3").items() if k != "build_request_id"},
        6: {**partition_event_at("x4"), "timestamp": "yesterday"},
        7: {
            **partition_event_at("x5"),
            "partition_event": {"partition_ref": "p", "status_code": 4, "status_name": "PARTITION_FAILED"},
        },
        8: {**partition_event_at("x6"), "partition_event": {"partition_ref": "p", "status_code": 9}},
        9: "",
        10: json.dumps(
            {**partition_event_at("x7"), "partition_event": {"partition_ref": "p" * MAX_LINE_BYTES, "status_code": 4}}
        ),
        11: b'{"event_id": "\xff\xfe"}',
    }
    lines = [good] + [bad_lines[n] for n in range(2, 12)] + [partition_event_at("good-2", 1)]
    write_landing(lake, "mixed.jsonl", lines)

    result = ingest_landing_files(spark, lake)

    assert quarantine(spark, lake) == {
        2: "not valid JSON: Expecting value at column 1",
        3: "event_type 'mystery_event' names no payload (one of: build_request_event, partition_event, job_event, "
        "delegation_event, job_graph_event, partition_invalidation_event, task_cancel_event, build_cancel_event)",
        4: "event_type is 'partition_event' but job_event is also set; exactly one payload must be set",
        5: "missing required field 'build_request_id'",
        6: 'timestamp must be an integer, got string "yesterday"',
        7: "partition_event.status_name 'PARTITION_FAILED' does not match status_code 4 (PARTITION_AVAILABLE); "
        "the code is authoritative",
        8: "partition_event.status_code 9 is not a PartitionStatus (0..6)",
        9: "empty line: expected one event as a JSON object",
        10: f"line is {len(bad_lines[10]):,} bytes, over the 1,048,576-byte limit for one event (only its first "
        "1,024 bytes are kept)",
        11: "not valid UTF-8: byte 0xff at offset 14",
    }
    assert [e["event_id"] for e in raw_log_events(spark, lake)] == ["good-1", "good-2"]
    assert (result.lines_read, result.accepted, result.duplicates, result.quarantined) == (12, 2, 0, 10)


def test_quarantine_keeps_each_bad_line_byte_for_byte(spark, lake):
    raw = b'{"event_id": "\xff\xfe", "broken": tru'
    write_landing(lake, "bytes.jsonl", [raw])
    ingest_landing_files(spark, lake)

    row = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).first()
    assert (bytes(row.raw_line), row.source_file.endswith("/landing/bytes.jsonl"), row.line_number) == (raw, True, 1)


def test_ingesting_the_same_files_twice_adds_nothing(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), "bad line", partition_event_at("a2", 1)])
    first = ingest_landing_files(spark, lake)
    version = first.log_version

    second = ingest_landing_files(spark, lake)

    assert (first.accepted, first.quarantined) == (2, 1)
    assert second.batches == () and second.log_version == version
    assert len(raw_log_events(spark, lake)) == 2 and len(quarantine(spark, lake)) == 1


def test_a_new_file_is_ingested_and_an_event_id_already_in_the_log_is_skipped_and_counted(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), partition_event_at("a2", 1)])
    ingest_landing_files(spark, lake)
    write_landing(
        lake, "b.jsonl", [partition_event_at("a2", 1), partition_event_at("b1", 2), partition_event_at("b1", 2)]
    )

    result = ingest_landing_files(spark, lake)

    assert [b.files[0].rsplit("/", 1)[1] for b in result.batches] == ["b.jsonl"]
    assert (result.lines_read, result.accepted, result.duplicates, result.quarantined) == (3, 1, 2, 0)
    assert [e["event_id"] for e in raw_log_events(spark, lake)] == ["a1", "a2", "b1"]


def test_hidden_and_underscore_files_are_not_ingested_until_renamed(spark, lake):
    write_landing(lake, ".events-1.jsonl.tmp", [partition_event_at("in-flight")])
    write_landing(lake, "_events-2.jsonl", [partition_event_at("staging")])
    assert list_landing_files(spark, lake.landing) == []

    os.replace(Path(lake.landing) / ".events-1.jsonl.tmp", Path(lake.landing) / "events-1.jsonl")
    assert ingest_landing_files(spark, lake).accepted == 1


def test_a_crash_after_the_commit_but_before_bookkeeping_does_not_duplicate(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), partition_event_at("a2", 1), "not json"])
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    batch_id, files = ledger.plan(list_landing_files(spark, lake.landing), ledger.rows())
    write_batch(spark, lake, batch_id, files)  # both data commits land; the process "dies" before recording
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 2)])  # and a new file arrives meanwhile

    result = ingest_landing_files(spark, lake)

    replay, new = result.batches
    assert (replay.batch_id, replay.replayed, replay.accepted, replay.quarantined) == (batch_id, True, 2, 1)
    assert (new.replayed, new.accepted) == (False, 1)
    assert [e["event_id"] for e in raw_log_events(spark, lake)] == ["a1", "a2", "b1"]
    assert len(quarantine(spark, lake)) == 1
    assert ingest_landing_files(spark, lake).batches == ()


def test_a_crash_after_planning_but_before_any_commit_ingests_the_planned_files_once(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1")])
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    ledger.plan(list_landing_files(spark, lake.landing), ledger.rows())

    result = ingest_landing_files(spark, lake)

    assert [(b.replayed, b.accepted) for b in result.batches] == [(True, 1)]
    assert [e["event_id"] for e in raw_log_events(spark, lake)] == ["a1"]


def test_a_plan_made_from_a_stale_read_of_the_ledger_plans_again_without_the_files_taken(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1")])
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 1)])
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    stale = ledger.rows()  # empty: read before another run planned a.jsonl as batch 1
    files = list_landing_files(spark, lake.landing)
    assert ledger.plan(files[:1], ledger.rows()) == (1, [files[0].path])

    # Planned from the stale read, batch 1 again: Delta skips the write (batch 1 is recorded
    # under the plan's app id), so the plan reads the ledger again and takes b.jsonl only.
    assert ledger.plan(files, stale) == (2, [files[1].path])

    planned = sorted((row.batch_id, row.file_path) for row in ledger.rows() if row.stage == "planned")
    assert planned == [(1, files[0].path), (2, files[1].path)]


def test_planning_goes_on_after_the_ledgers_newest_plan_rows_were_removed(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1")])
    write_landing(lake, "b.jsonl", [partition_event_at("b1", 1)])
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    files = list_landing_files(spark, lake.landing)
    assert ledger.plan(files[:1], ledger.rows()) == (1, [files[0].path])
    # An operator removes batch 1's rows (a DELETE or a RESTORE); Delta still records batch 1
    # under the plan's app id, so a plan of batch 1 again would be skipped every time.
    spark.sql(f"DELETE FROM delta.`{ledger.path}` WHERE batch_id = 1")

    assert ledger.plan(files[1:], ledger.rows()) == (2, [files[1].path])


def test_two_runs_planning_at_once_take_each_file_once(spark, lake):
    for name in ("a", "b", "c"):
        write_landing(lake, f"{name}.jsonl", [partition_event_at(name)])
    ensure_ingest_tables(spark, lake)
    files = list_landing_files(spark, lake.landing)
    rows = _Ledger(spark, lake).rows()
    start, plans, errors = threading.Barrier(2), [], []

    def plan(chosen) -> None:
        ledger = _Ledger(spark.newSession(), lake)
        start.wait()
        try:
            plans.append(ledger.plan(chosen, rows))
        except Exception as error:  # surfaced below
            errors.append(error)

    # Both read the same empty ledger and both want b.jsonl.
    threads = [threading.Thread(target=plan, args=(chosen,)) for chosen in (files[:2], files[1:])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    planned = [(row.batch_id, row.file_path) for row in _Ledger(spark, lake).rows() if row.stage == "planned"]
    assert sorted(path for _, path in planned) == sorted(f.path for f in files)  # each file once
    assert sorted(plan[0] for plan in plans) == [1, 2]  # the loser planned the next batch, with what was left
    assert {batch_id for batch_id, _ in planned} == {1, 2}


def test_writer_api_appends_in_one_commit_and_skips_event_ids_already_there(spark, lake):
    first = append_events(spark, lake, [partition_event_at("w1"), partition_event_at("w2", 1)], writer="svc")
    again = append_events(spark, lake, [partition_event_at("w2", 1), partition_event_at("w3", 2)], writer="svc")

    assert (first.accepted, first.duplicates, again.accepted, again.duplicates) == (2, 0, 1, 1)
    assert [e["event_id"] for e in raw_log_events(spark, lake)] == ["w1", "w2", "w3"]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.table_path(RAW_EVENT_LOG)}`").collect()
    assert [h.operation for h in sorted(history, key=lambda h: h.version)] == ["CREATE TABLE", "MERGE", "MERGE"]


def test_writer_api_refuses_a_batch_with_any_invalid_event_and_writes_nothing(spark, lake):
    bad = {**partition_event_at("w2"), "partition_event": {"partition_ref": "p", "status_code": 9}}

    with pytest.raises(InvalidEventError) as error:
        append_events(spark, lake, [partition_event_at("w1"), bad])

    assert str(error.value) == (
        "1 of 2 events are invalid; nothing was written.\n"
        "  events[1] (event_id 'w2'): partition_event.status_code 9 is not a PartitionStatus (0..6)"
    )
    assert not os.path.exists(lake.table_path(RAW_EVENT_LOG))


def test_concurrent_writers_lose_nothing_and_duplicate_nothing(spark, lake):
    ensure_ingest_tables(spark, lake)
    writers, calls, per_call = 4, 3, 25
    # Every writer also re-sends the previous writer's first call: overlapping event_ids race.
    batches = {
        w: [[partition_event_at(f"w{w}-c{c}-{i}", i) for i in range(per_call)] for c in range(calls)]
        for w in range(writers)
    }
    errors = []

    def run(w: int) -> None:
        try:
            for batch in batches[w] + [batches[(w + 1) % writers][0]]:
                append_events(spark, lake, batch, writer=f"w{w}")
        except Exception as error:  # surfaced below: a lost append must fail the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    ids = [e["event_id"] for e in raw_log_events(spark, lake)]
    assert errors == []
    assert len(ids) == len(set(ids)) == writers * calls * per_call
