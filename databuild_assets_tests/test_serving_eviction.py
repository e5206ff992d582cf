"""How the pipeline's refresh moves build requests to segments (evict.py): one segment at a time,
each in its own transaction beside the service's appends, with progress; a first build evicts
before the index is anyone's, and a failed one leaves no segment behind."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import uuid
from typing import Any

import deltalake
import pyarrow.parquet
import pytest

from databuild_assets.events.enums import BuildRequestStatus, PartitionStatus
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving import cold, cold_ids, evict, segment_files, thaw
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.sqlite.schema import select_listed_partitions
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.serving_support import reference_answers


def test_a_build_request_an_append_reopens_while_the_eviction_runs_stays_hot(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 300)  # an eviction of several segments
    events = list(generate_events(3000, seed=11))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=float("inf"))  # every event hot, then evicted below
    real_transaction, reopened, evicted = evict.transaction, [], []

    @contextlib.contextmanager
    def then_append(connection):  # between two segments' transactions, as a service appends
        with real_transaction(connection):
            yield
        segments = connection.execute("SELECT COUNT(*) FROM main.cold_segments").fetchone()[0]
        if reopened:  # a later segment took it, reopened or not (a catch-up would thaw it again)
            cold_now = "SELECT 1 FROM main.cold_build_requests WHERE build_request_id = ?"
            evicted.extend(connection.execute(cold_now, (reopened[0]["build_request_id"],)).fetchall())
        elif segments:  # after the first segment: the last build request listed gets a new event
            (last,) = connection.execute("SELECT build_request_id FROM temp.evictable ORDER BY rowid DESC").fetchone()
            mine = [e for e in events if e["build_request_id"] == last]
            event = next(e for e in reversed(mine) if e["event_type"] == "build_request_event")
            executing = BuildRequestStatus.BUILD_REQUEST_EXECUTING
            late = {
                **event,
                "event_id": str(uuid.uuid4()),
                "timestamp": max(e["timestamp"] for e in events) + 1,
                "build_request_event": {
                    **event["build_request_event"],
                    "status_code": int(executing),
                    "status_name": executing.name,
                },
            }
            with DeltaRsEventLog(lake) as appender:
                appender.append_events([late])
            reopened.append(late)

    monkeypatch.setattr(evict, "transaction", then_append)
    refresh_serving_index(lake, hot_window_s=0)
    (late,) = reopened
    assert not evicted  # it was listed, and is no longer terminal when its turn came
    with DeltaRsEventLog(lake) as log:
        index = log._store()
        assert index.cold_facts()["cold_segments"] > 1
        cold_ones = {row[0] for row in index._connection.execute("SELECT build_request_id FROM cold_build_requests")}
        assert late["build_request_id"] not in cold_ones  # no longer terminal: it stays hot
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers([*events, late])


def test_an_eviction_that_lasts_says_how_far_it_is(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 200)  # several segments, each one reported
    monkeypatch.setattr(evict, "PROGRESS_EVERY_S", 0.0)
    with DeltaRsEventLog(lake) as log:
        log.append_events(list(generate_events(1500, seed=4)))
    lines: list[str] = []
    refresh_serving_index(lake, progress=lines.append, hot_window_s=0)
    moved = [line for line in lines if "events moved to segments" in line]
    assert len(moved) > 1, lines


def test_the_pipelines_first_build_evicts_before_the_index_is_published(lake: Lake) -> None:
    events = list(generate_events(3000, seed=8))
    first, later = events[:2000], events[2000:]
    with DeltaRsEventLog(lake) as log:
        log.append_events(first)
    shutil.rmtree(os.path.join(lake.root, "serving_index"))  # a new machine, or an index lost
    lines: list[str] = []
    refresh_serving_index(lake, progress=lines.append, hot_window_s=0)
    assert any("written whole without the events that left" in line for line in lines), lines
    with DeltaRsEventLog(lake) as log:
        index = log._store()
        assert index.cold_facts()["cold_build_requests"] > 50
        assert index._connection.execute("PRAGMA freelist_count").fetchone()[0] == 0
        assert index.deleted_events() == 0  # published whole: no second write of the file
        assert bel_cases.answers(log, *bel_cases.keys_of(first)) == reference_answers(first)
        # Later events of the same partitions: their rows are refreshed over the pins it kept.
        log.append_events(later)
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


@pytest.mark.parametrize("hot_window_s", [0, float("inf")])
def test_a_first_build_of_a_raw_log_holding_an_event_twice_keeps_the_first(lake: Lake, hot_window_s: float) -> None:
    # A build that evicts loads `events` without its key on event_id (index.py), so it finds the
    # copies itself.
    events = list(generate_events(2000, seed=12))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    original = next(e for e in events if e["event_type"] == "partition_event")
    lost = PartitionStatus.PARTITION_FAILED
    copy = {
        **original,
        "timestamp": max(e["timestamp"] for e in events) + 1,
        "partition_event": {**original["partition_event"], "status_code": int(lost), "status_name": lost.name},
    }
    rows = raw_log_rows([(0, canonical_event(copy))], "another writer")  # past the appends' dedupe
    deltalake.write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")
    shutil.rmtree(os.path.join(lake.root, "serving_index"))
    refresh_serving_index(lake, hot_window_s=hot_window_s)
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


def test_a_first_build_whose_eviction_fails_leaves_no_segment_behind(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = list(generate_events(3000, seed=9))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    shutil.rmtree(os.path.join(lake.root, "serving_index"))

    def disk_full(self: cold_ids.DeferredColdIds, connection: Any) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(cold_ids.DeferredColdIds, "write", disk_full)
    with pytest.raises(OSError, match="no space left"):
        refresh_serving_index(lake, hot_window_s=0)
    segments = os.path.join(lake.root, "serving_index", cold.SEGMENTS_FOLDER)
    assert not os.path.isdir(segments) or os.listdir(segments) == []  # each retry would add a set
    monkeypatch.undo()
    refresh_serving_index(lake, hot_window_s=0)
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


@pytest.mark.parametrize("seed", range(5))
def test_pinning_a_segments_rows_in_arrow_picks_what_the_refresh_sql_picks(seed: int) -> None:
    # Few refs, timestamps and types, so that ties on timestamp and missing values are common.
    rng = random.Random(seed)
    types = ["partition_event", "delegation_event", "partition_invalidation_event", "job_event"]
    rows = [
        (
            f"e-{rng.randrange(10**6):06d}-{n}",
            rng.randrange(8),
            "br",
            rng.choice(types),
            "{}",
            rng.choice([None, "p/a", "p/b", "p/c"]),
            rng.choice([None, "jr"]),
            rng.choice([None, 1, 2, 3]),
        )
        for n in range(400)
    ]
    pins = []
    for arrow in (False, True):
        connection = sqlite3.connect(":memory:")
        thaw.work_tables(connection)
        connection.executemany("INSERT INTO temp.frozen VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        if arrow:
            thaw.pin_latest_of(connection, segment_files.rows_table(rows))
        else:
            thaw.pin_latest(connection, "temp.frozen")
        pins.append(connection.execute("SELECT event_id FROM temp.pinned ORDER BY event_id").fetchall())
    assert pins[0] == pins[1] and len(pins[0]) >= 6


@pytest.mark.parametrize("failing", ["the thread's write", "the caller's next step"])
def test_a_first_build_that_fails_beside_its_segment_writes_raises_and_leaves_no_file(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    # The second segment's main file fails halfway on the writer thread (its error raised by the
    # caller), or the caller fails while that segment's files are being written (its transaction
    # rolls back: no row names them): either way no file of the build is left, nor half of one.
    events = list(generate_events(3000, seed=9))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    shutil.rmtree(os.path.join(lake.root, "serving_index"))
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 500)
    calls = {"write": 0, "add": 0}
    write_table, add = pyarrow.parquet.write_table, cold_ids.DeferredColdIds.add

    def half_then_full(table: Any, file: Any, **options: Any) -> None:
        calls["write"] += 1
        if calls["write"] == 4 and failing == "the thread's write":  # segment 2's main file
            file.write(b"PAR1 half a file")
            raise OSError("no space left on device")
        write_table(table, file, **options)

    def fails_second(self: cold_ids.DeferredColdIds, event_ids: Any) -> None:
        calls["add"] += 1
        if calls["add"] == 2 and failing == "the caller's next step":
            raise OSError("no space left on device")
        add(self, event_ids)

    monkeypatch.setattr(segment_files.pq, "write_table", half_then_full)  # the module's own (deferred) copy
    monkeypatch.setattr(cold_ids.DeferredColdIds, "add", fails_second)
    with pytest.raises(OSError, match="no space left"):
        refresh_serving_index(lake, hot_window_s=0)
    assert calls["write"] >= 4
    segments = os.path.join(lake.root, "serving_index", cold.SEGMENTS_FOLDER)
    assert not os.path.isdir(segments) or os.listdir(segments) == []


@pytest.mark.parametrize(
    "payload",
    [
        '{"requested_partitions": ["p/a", 1, null, "p/b", "p/a"], "x": {"y": [1]}}',
        '{"requested_partitions": null}',
        '{"requested_partitions": "p/a"}',
        '{"requested_partitions": {"k": "p/a", "n": 2}}',
        '{"requested_partitions": 3}',
        '{"other": 1}',
    ],
)
def test_the_refs_a_segment_lists_are_those_the_sqlite_backend_lists(payload: str) -> None:
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE e (event_id, timestamp, event_type, payload)")
    connection.execute("INSERT INTO e VALUES ('e1', 1, 'build_request_event', ?)", (payload,))
    expected = {ref for ref, _, _ in connection.execute(select_listed_partitions("e", source="e, "))}
    assert segment_files.listed_partitions("build_request_event", payload) == expected


def test_a_listing_payload_msgspec_refuses_lists_what_json_reads() -> None:
    # An escaped lone surrogate and NaN: msgspec refuses both, json.loads reads them.
    payload = '{"requested_partitions": ["p/\\ud800", "p/b"], "n": NaN}'
    assert segment_files.listed_partitions("build_request_event", payload) == {"p/\ud800", "p/b"}
