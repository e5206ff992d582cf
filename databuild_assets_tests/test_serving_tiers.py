"""The serving index's cold tier (docs/decisions/0051): finished build requests older than the hot
window leave the index for Parquet segments at the pipeline's refresh, answers stay the
reference's, a late event or a tombstone brings a build request back, and an erased value leaves
every file of serving_index/ once the pipeline refreshes."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake

from databuild_assets.events.enums import TERMINAL_BUILD_REQUEST_STATUSES, BuildRequestStatus
from databuild_assets.log.interface import EventFilter, canonical_event
from databuild_assets.log.serving import cold, cold_ids, evict, segment_files, thaw
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.serving.footers import parquet_file
from databuild_assets.log.serving.store import IndexFolder
from databuild_assets.log.sqlite.backend import SqliteEventLog
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.serving_support import (
    files_holding,
    folder_bytes,
    reference_answers,
    request_erasure_without_spark,
    without_write_access,
)
from databuild_assets_tests.support import REPO_ROOT


def _cold(lake: Lake) -> dict[str, int]:
    with DeltaRsEventLog(lake) as log:
        return log._store().cold_facts()


def _terminal_request(events: list[dict[str, Any]]) -> str:
    return next(e["build_request_id"] for e in events if _is_terminal(e))


def _cold_request(lake: Lake, n_events: int, seed: int) -> tuple[list[dict[str, Any]], str]:
    """`n_events` generated events appended, every finished build request cold, and one of them."""
    events = list(generate_events(n_events, seed=seed))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    return events, _terminal_request(events)


def _is_terminal(event: dict[str, Any]) -> bool:
    terminal = {int(code) for code in TERMINAL_BUILD_REQUEST_STATUSES}
    return event["event_type"] == "build_request_event" and event["build_request_event"]["status_code"] in terminal


def test_finished_build_requests_leave_the_index_for_segments_and_every_answer_stays_the_references(
    lake: Lake,
) -> None:
    events = list(generate_events(3000, seed=3))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:1500])
    refresh_serving_index(lake, hot_window_s=0)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[1500:])  # late events of cold build requests among them
    refresh_serving_index(lake, hot_window_s=0)
    cold = _cold(lake)
    assert cold["cold_build_requests"] > 50 and cold["cold_event_ids"] > 1000
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)
        assert log._store().event_count() == len(events)


def _pages(log: Any, filter: EventFilter | None) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = log.list_events(since=cursor, filter=filter, limit=7)
        pages.append(bel_cases.ids(page.events))
        cursor = page.next_cursor
        if not page.has_more:
            return pages


def test_the_default_window_keeps_the_last_hour_of_log_time_hot_and_inf_keeps_everything(
    lake: Lake, monkeypatch
) -> None:
    monkeypatch.delenv(evict.HOT_WINDOW_ENV, raising=False)
    events = list(generate_events(3000, seed=3))  # three days of log time
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    newest = max(e["timestamp"] for e in events)
    last_event: dict[str, int] = {}
    for e in events:
        last_event[e["build_request_id"]] = max(last_event.get(e["build_request_id"], 0), e["timestamp"])
    terminal = {e["build_request_id"] for e in events if _is_terminal(e)}
    old = {b for b in terminal if last_event[b] <= newest - evict.DEFAULT_HOT_WINDOW_S * 1e9}
    assert old and old != terminal  # some finished within the hour: they stay hot

    monkeypatch.setenv(evict.HOT_WINDOW_ENV, "inf")
    refresh_serving_index(lake)
    assert _cold(lake)["cold_build_requests"] == 0
    monkeypatch.delenv(evict.HOT_WINDOW_ENV)
    status = refresh_serving_index(lake)
    assert _cold(lake)["cold_build_requests"] == status.cold_build_requests == len(old)
    assert status.segments >= 1 and status.segment_bytes > 0  # the asset's metadata
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)

    monkeypatch.setenv(evict.HOT_WINDOW_ENV, "an hour")
    with pytest.raises(ValueError, match=r"DATABUILD_SERVING_HOT_WINDOW_S='an hour' is not a number of seconds"):
        refresh_serving_index(lake)


def test_reads_that_skip_a_segments_row_groups_by_time_answer_as_the_reference(lake: Lake, monkeypatch) -> None:
    monkeypatch.setattr(segment_files, "ROWS_PER_GROUP", 50)  # segments of many row groups
    monkeypatch.setattr(segment_files, "BY_PARTITION_ROWS_PER_GROUP", 40)  # found by bisection
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 700)  # and several segments, their times overlapping
    events = list(generate_events(3000, seed=8))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    stamps = sorted(e["timestamp"] for e in events)
    request = _terminal_request(events)
    refs, requests, runs = bel_cases.keys_of(events)
    filters = [
        None,
        EventFilter(event_types=("partition_event", "job_event")),
        EventFilter(partition_refs=(refs[0], refs[-1])),
        EventFilter(build_request_ids=(request, requests[-1])),
        EventFilter(job_run_ids=(runs[0],)),
    ]
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        assert (
            parquet_file(
                str(next(Path(log._store().segment_folder).glob("segment-*[0-9].parquet")))
            ).metadata.num_row_groups
            > 10
        )
        reference.append_events(events)
        for start, end in ((stamps[0], stamps[100]), (stamps[1500], stamps[1510] + 1), (stamps[-60], stamps[-1] + 1)):
            assert log.get_events_in_range(start, end) == reference.get_events_in_range(start, end)
        for filter in filters:
            assert _pages(log, filter) == _pages(reference, filter)
        assert log.get_build_request_events(request) == reference.get_build_request_events(request)
        assert log.get_job_run_events(runs[0]) == reference.get_job_run_events(runs[0])
        companion = next(Path(log._store().segment_folder).glob("segment-*.by-partition.parquet"))
        assert parquet_file(str(companion)).metadata.num_row_groups > 10
        for ref in refs:
            assert log.get_partition_events(ref) == reference.get_partition_events(ref), ref
        _assert_row_groups_exact(log)


def _assert_row_groups_exact(log: DeltaRsEventLog) -> None:
    """Each cold build request names exactly the row groups of its segment's file holding its
    rows (it is read from those, not from every group its time span meets)."""
    index = log._store()
    rows = index._connection.execute("SELECT build_request_id, segment, row_groups FROM cold_build_requests")
    for build_request_id, segment, mask in rows:
        file = parquet_file(segment_files.segment_paths(index.segment_folder, segment)[0])
        owners = file.read(columns=["build_request_id"]).column(0).to_pylist()
        holding = {n // segment_files.ROWS_PER_GROUP for n, owner in enumerate(owners) if owner == build_request_id}
        assert cold.row_groups(mask) == sorted(holding)


def test_refreshes_that_each_evict_a_few_build_requests_leave_merged_segments_not_one_each(
    lake: Lake, monkeypatch
) -> None:
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 4000)  # segments under 1,000 events are small
    events = list(generate_events(3000, seed=3))
    evicting = 0
    for start in range(0, len(events), 100):  # a refresh after every 100 events, as a sensor would
        with DeltaRsEventLog(lake) as log:
            log.append_events(events[start : start + 100])
        before = _cold(lake)["cold_build_requests"]
        refresh_serving_index(lake, hot_window_s=0)
        evicting += _cold(lake)["cold_build_requests"] > before
    with DeltaRsEventLog(lake) as log:
        connection = log._store()._connection
        sizes = [row[0] for row in connection.execute("SELECT events FROM cold_segments ORDER BY segment")]
        assert sum(sizes) == log._store().cold_facts()["cold_event_ids"]
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)
    small = [size for size in sizes if size < 1000]
    tiers = [len([size for size in small if low <= size < low * 4]) for low in (1, 4, 16, 64, 256)]
    assert max(tiers) < evict.MERGE_FANIN, sizes  # every tier of MERGE_FANIN small ones was merged
    assert evicting >= 20 and len(sizes) <= evicting / 2, sizes
    assert [path.name for path in Path(lake.path("serving_index"), "segments").iterdir()] and len(
        list(Path(lake.path("serving_index"), "segments").glob("segment-*.by-partition.parquet"))
    ) == len(sizes)  # the merged segments' files are gone


def _small_segments(lake: Lake, monkeypatch) -> list[dict[str, Any]]:
    """2,000 events evicted 200 at a time into small segments, none merged yet; the events."""
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 4000)
    monkeypatch.setattr(evict, "MERGE_FANIN", 1000)  # no merge while the small segments are made
    events = list(generate_events(2000, seed=8))
    for start in range(0, len(events), 200):
        with DeltaRsEventLog(lake) as log:
            log.append_events(events[start : start + 200])
        refresh_serving_index(lake, hot_window_s=0)
    monkeypatch.setattr(evict, "MERGE_FANIN", 4)
    return events


def test_a_merge_of_small_segments_writes_a_new_one_without_bringing_their_events_back(lake: Lake, monkeypatch) -> None:
    # A merge that thawed its segments wrote every event of them into the index and deleted them
    # again, holding the write lock the appends wait for: seconds under a service's load.
    monkeypatch.setattr(
        segment_files, "ROWS_PER_GROUP", 50
    )  # files of many row groups: each build request names its own
    events = _small_segments(lake, monkeypatch)
    with DeltaRsEventLog(lake) as log:
        index = log._store()
        connection, folder = index._connection, str(Path(index.segment_folder).parent)
        sizes = "SELECT segment, events FROM cold_segments"
        pinned = (
            "SELECT COUNT(*) FROM events WHERE build_request_id IN (SELECT build_request_id FROM cold_build_requests)"
        )
        pins = connection.execute(pinned).fetchone()[0]
        before, changes = dict(connection.execute(sizes).fetchall()), connection.total_changes
        assert len([n for n in before.values() if n < 1000]) >= 4, before  # small ones to merge
        evict.evict_under_lock(IndexFolder(folder), connection, 2**62, IndexFolder(folder).marker())  # merges only
        after = dict(connection.execute(sizes).fetchall())
        merged = sum(n for segment, n in before.items() if segment not in after)
        assert merged and len(after) < len(before) and sum(after.values()) == sum(before.values())
        assert connection.total_changes - changes < merged / 2  # the cold tables' rows, not the events
        # A partition's pins are the latest of each kind over every segment already: a merge keeps them.
        assert connection.execute(pinned).fetchone()[0] == pins
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)
        _assert_row_groups_exact(log)
    assert len(list(Path(folder, "segments").glob("segment-*.by-partition.parquet"))) == len(after)


def _evict_as_the_pipeline(lake: Lake, window_ns: int | None) -> None:
    """The refresh's evictions, merges and sweep, by a connection of their own (as the pipeline's)."""
    with DeltaRsEventLog(lake) as pipeline:
        index = pipeline._store()
        folder = IndexFolder(str(Path(index.segment_folder).parent))
        evict.evict_under_lock(folder, index._connection, window_ns, folder.marker())


def _a_cold_request_and_a_late_event_for_it(lake: Lake) -> tuple[list[dict[str, Any]], dict[str, Any], EventFilter]:
    """1,200 events, every finished build request cold; a late event for one; a page of its events."""
    events, request = _cold_request(lake, 1200, seed=4)
    late = bel_cases.partition_event("late-1", 5, request, "data/late", bel_cases.P.PARTITION_AVAILABLE)
    return events, late, EventFilter(build_request_ids=(request,))


@pytest.mark.parametrize(
    "method, key_of_segment",
    [
        ("get_build_request_events", "SELECT build_request_id FROM cold_build_requests WHERE segment = ?"),
        ("get_partition_events", "SELECT partition_ref FROM cold_partition_events WHERE segment = ?"),
    ],
)
def test_a_read_whose_segment_a_merge_replaced_meanwhile_reads_the_merged_one(
    lake: Lake, monkeypatch, method: str, key_of_segment: str
) -> None:
    # The read had looked up which segment holds the key; a merge in the pipeline's process then
    # replaced that segment and removed its files. The second try looked in the same one again.
    events = _small_segments(lake, monkeypatch)
    with DeltaRsEventLog(lake) as reader, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        connection = reader._store()._connection
        group = evict._small_segments_to_merge(connection)[0]
        key = connection.execute(key_of_segment, (group[0],)).fetchone()[0]
        read_rows, merges, once = cold.read_segment_rows, [], threading.Lock()

        def merged_first(*args, **kwargs):  # segments are read side by side (pool.py): once, by one
            with once:
                if not merges:
                    _evict_as_the_pipeline(lake, 2**62)  # merges only
                    merges.append(group)
            return read_rows(*args, **kwargs)

        monkeypatch.setattr(cold, "read_segment_rows", merged_first)

        assert getattr(reader, method)(key) == getattr(reference, method)(key)

        assert merges
        assert reader._store()._connection is connection  # answered without reopening the index
        assert not connection.execute("SELECT 1 FROM cold_segments WHERE segment = ?", (group[0],)).fetchone()


def test_a_page_read_while_a_late_event_brought_its_build_request_back_hot_keeps_its_events(
    lake: Lake, monkeypatch
) -> None:
    # The page's hot rows were read, then a late event brought the build request back into the
    # index and the refresh rewrote its segment without it: read again from the segments alone,
    # the page held the request's events neither hot nor cold.
    events, late, page_of = _a_cold_request_and_a_late_event_for_it(lake)
    with DeltaRsEventLog(lake) as reader, SqliteEventLog(":memory:") as reference:
        reference.append_events(events + [late])
        connection = reader._store()._connection
        read_rows, thawed, once = cold.read_segment_rows, [], threading.Lock()

        def thawed_first(*args, **kwargs):  # once, by one of the pool's threads
            with once:
                if not thawed:
                    with DeltaRsEventLog(lake) as pipeline:
                        pipeline.append_events([late])
                    _evict_as_the_pipeline(lake, None)  # window inf: its old segment rewritten without it
                    thawed.append(late)
            return read_rows(*args, **kwargs)

        monkeypatch.setattr(cold, "read_segment_rows", thawed_first)

        page = reader.list_events(filter=page_of, limit=1000)

        assert thawed and page.events == reference.list_events(filter=page_of, limit=1000).events
        assert reader._store()._connection is connection


def test_a_page_read_while_a_late_event_brings_its_build_request_back_hot_is_of_one_state_of_the_index(
    lake: Lake, monkeypatch
) -> None:
    # The page's hot rows were read, then a late event brought the build request back into the
    # index (its segment left as it was), then the page looked up the segments: the request was
    # in neither.
    events, late, page_of = _a_cold_request_and_a_late_event_for_it(lake)
    with DeltaRsEventLog(lake) as reader, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        cold_of, thawed = cold.ColdReads._cold_of, []

        def thawed_first(index, build_request_ids):
            if not thawed:
                with DeltaRsEventLog(lake) as pipeline:
                    pipeline.append_events([late])
                thawed.append(late)
            return cold_of(index, build_request_ids)

        monkeypatch.setattr(cold.ColdReads, "_cold_of", thawed_first)

        page = reader.list_events(filter=page_of, limit=1000)

        assert thawed and page.events == reference.list_events(filter=page_of, limit=1000).events


def test_a_merge_gives_up_when_a_late_event_made_one_of_its_segments_stale(lake: Lake, monkeypatch) -> None:
    events = _small_segments(lake, monkeypatch)
    with DeltaRsEventLog(lake) as log:
        index = log._store()
        connection, folder = index._connection, index.segment_folder
        group = evict._small_segments_to_merge(connection)[0]
        request = connection.execute(
            "SELECT build_request_id FROM cold_build_requests WHERE segment = ?", (group[-1],)
        ).fetchone()[0]
        late = bel_cases.partition_event("late-1", 5, request, "data/late", bel_cases.P.PARTITION_AVAILABLE)
        log.append_events([late])  # the request back hot: its segment stale
        tables = (
            "SELECT * FROM cold_segments UNION ALL SELECT build_request_id, segment, 0, 0, 0 FROM cold_build_requests"
        )
        state, files = connection.execute(tables).fetchall(), set(os.listdir(folder))

        assert evict._merge(connection, folder, group) is False

        assert connection.execute(tables).fetchall() == state and set(os.listdir(folder)) == files
        assert bel_cases.answers(log, *bel_cases.keys_of(events + [late])) == reference_answers(events + [late])


def test_a_late_event_for_a_cold_build_request_brings_it_back_hot_and_its_segment_is_rewritten(lake: Lake) -> None:
    events, request = _cold_request(lake, 1200, seed=4)
    segments_before = {name for name in files_holding(lake, request) if name.startswith("segment-")}
    assert segments_before
    late = bel_cases.partition_event("late-1", 5, request, "data/late", bel_cases.P.PARTITION_AVAILABLE)
    with DeltaRsEventLog(lake) as log:
        log.append_events([late])
        with log._store()._connection as connection:
            assert not connection.execute(
                "SELECT 1 FROM cold_build_requests WHERE build_request_id = ?", (request,)
            ).fetchone()
        assert bel_cases.answers(log, *bel_cases.keys_of(events + [late])) == reference_answers(events + [late])
    refresh_serving_index(lake, hot_window_s=0)  # cold again, in a new segment; the stale one is gone
    assert not segments_before & set(files_holding(lake, request))
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events + [late])) == reference_answers(events + [late])


def test_a_reader_that_cannot_write_the_lake_answers_after_the_lakes_refresh_rewrote_a_segment_it_named(
    lake: Lake,
) -> None:
    events, request = _cold_request(lake, 1200, seed=4)
    code = (
        "import sys\n"
        f"print(len(log.get_build_request_events({request!r})), flush=True)\n"
        "sys.stdin.readline()\n"
        f"print(len(log.get_build_request_events({request!r})), flush=True)\n"
    )
    reader = subprocess.Popen(
        without_write_access(lake, code), cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        count = int(reader.stdout.readline())  # its copy of the index names the segment
        late = bel_cases.partition_event("late-1", 5, request, "data/late", bel_cases.P.PARTITION_AVAILABLE)
        with DeltaRsEventLog(lake) as log:  # the pipeline, which can write the lake
            log.append_events([late])
        refresh_serving_index(lake, hot_window_s=0)  # the request cold again in a new segment, the old one removed
        out, _ = reader.communicate("go\n", timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0 and out.split() == [str(count + 1)]


def _job_runs(log: Any) -> list[tuple]:
    return log._connection.execute("SELECT * FROM job_runs ORDER BY job_run_id").fetchall()


def _reference_job_runs(events: list[dict[str, Any]]) -> list[tuple]:
    with SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        return _job_runs(reference)


def test_a_cold_job_run_pins_nothing_and_comes_back_hot_before_another_build_request_changes_it(lake: Lake) -> None:
    events = list(generate_events(1200, seed=5))
    request = _terminal_request(events)
    job = next(e for e in events if e["build_request_id"] == request and e["event_type"] == "job_event")
    job_run_id = job["job_event"]["job_run_id"]

    def refreshed_and_cold() -> None:
        refresh_serving_index(lake, hot_window_s=0)
        with DeltaRsEventLog(lake) as log:
            connection = log._store()._connection
            cold = "SELECT 1 FROM cold_build_requests WHERE build_request_id = ?"
            assert connection.execute(cold, (request,)).fetchone()
            assert not connection.execute(
                "SELECT 1 FROM events WHERE build_request_id = ? AND job_run_id = ?"
                " AND event_type IN ('job_event', 'task_cancel_event')",
                (request, job_run_id),
            ).fetchone()  # nothing of the job run pinned

    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refreshed_and_cold()
    # Another build request reports a job event of that run before its first and a cancel before
    # its last: the first names the other request, the status stays the cold request's last.
    assert max(e["timestamp"] for e in events if e.get("job_event", {}).get("job_run_id") == job_run_id) > (
        job["timestamp"] + 1
    )
    other = "another-build-request"
    report = bel_cases.job_event("other-1", job["timestamp"] - 1, other, job_run_id, bel_cases.J.JOB_RUNNING)
    cancel = bel_cases.task_cancel_event("other-2", job["timestamp"] + 1, other, job_run_id, "stop")
    with DeltaRsEventLog(lake) as log:  # this process's own append (add_events)
        log.append_events([report])
        assert _job_runs(log._store()) == _reference_job_runs(events + [report])
    refreshed_and_cold()
    # Another writer's commit, which a reader applies at its catch-up (add).
    rows = raw_log_rows([(0, canonical_event(cancel))], "other")
    write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")
    with DeltaRsEventLog(lake) as log:
        assert _job_runs(log._store()) == _reference_job_runs(events + [report, cancel])
        assert bel_cases.answers(log, *bel_cases.keys_of(events + [report, cancel])) == reference_answers(
            events + [report, cancel]
        )
    refreshed_and_cold()
    request_erasure_without_spark(lake, "build_request_id", other)  # both leave (hide)
    with DeltaRsEventLog(lake) as log:
        assert _job_runs(log._store()) == _reference_job_runs(events)
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


def test_a_thaw_brings_back_every_row_of_a_build_request_whatever_its_row_groups_say(lake: Lake, monkeypatch) -> None:
    events, request = _cold_request(lake, 600, seed=9)
    found = thaw.cold_by_segment  # each segment's row groups named as none
    monkeypatch.setattr(thaw, "cold_by_segment", lambda *a: {s: (i, set()) for s, (i, _) in found(*a).items()})
    late = bel_cases.partition_event("late-9", 5, request, "data/late", bel_cases.P.PARTITION_AVAILABLE)
    with DeltaRsEventLog(lake) as log:
        log.append_events([late])
        assert bel_cases.answers(log, *bel_cases.keys_of(events + [late])) == reference_answers(events + [late])


def test_an_append_of_a_cold_event_id_is_a_duplicate(lake: Lake) -> None:
    events, request = _cold_request(lake, 600, seed=6)
    cold_one = next(e for e in events if e["build_request_id"] == request)
    with DeltaRsEventLog(lake) as log:
        assert log.known_event_ids([cold_one["event_id"], "never-seen"]) == {cold_one["event_id"]}
        again = dict(cold_one, build_request_id="someone-else")  # the same id, whatever it says
        assert log.append_events([again]).duplicates == 1
        assert log._store().cold_facts()["cold_build_requests"] > 0
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


def test_a_partition_that_a_cold_build_request_only_lists_finds_it_in_its_segment(lake: Lake) -> None:
    listing = [  # requested, then failed before any event of the partition
        bel_cases.build_request_event("l-1", 100, "br-l", BuildRequestStatus.BUILD_REQUEST_RECEIVED, ["data/listed"]),
        bel_cases.build_request_event("l-2", 200, "br-l", BuildRequestStatus.BUILD_REQUEST_FAILED),
    ]
    events = listing + list(generate_events(300, seed=4))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    for first_build in (False, True):  # a refresh's eviction, then the pipeline's first build's
        if first_build:
            shutil.rmtree(os.path.join(lake.root, "serving_index"))
        refresh_serving_index(lake, hot_window_s=0)
        with DeltaRsEventLog(lake) as log:
            connection = log._store()._connection
            assert connection.execute("SELECT 1 FROM cold_build_requests WHERE build_request_id = 'br-l'").fetchone()
            assert bel_cases.ids(log.get_partition_events("data/listed")) == ["l-1"]
            assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


def test_the_cold_ids_are_what_was_evicted_and_not_thawed(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "ids.sqlite")
    connection.executescript(cold_ids.COLD_IDS_TABLE)
    ids = [str(uuid.UUID(int=random.Random(1).getrandbits(128) + n)) for n in range(300_000)]
    with connection:  # many entries per bucket, rows rewritten in three batches
        for start in range(0, 240_000, 80_000):
            cold_ids.add_cold_ids(connection, ids[start : start + 80_000])
        cold_ids.drop_cold_ids(connection, ids[:60_000])
    assert cold_ids.count_cold_ids(connection) == 180_000
    sample = range(0, len(ids), 97)
    known = cold_ids.known_cold_ids(connection, (ids[n] for n in sample))
    assert known == {ids[n] for n in sample if 60_000 <= n < 240_000}
    for (blob,) in connection.execute("SELECT digests FROM cold_event_ids"):
        entries = [blob[at : at + 8] for at in range(0, len(blob), 8)]
        assert entries == sorted(set(entries))


def test_a_fresh_process_reads_cold_keys_from_their_segments_without_importing_pandas(lake: Lake) -> None:
    # pyarrow imports pandas to convert a Python value (pa.array): a one-shot reader of an old key
    # would spend more on that import than on its answer (log/serving/arrow.py).
    events, request = _cold_request(lake, 600, seed=7)
    ref = next(e["partition_event"]["partition_ref"] for e in events if e["build_request_id"] == request
               and e["event_type"] == "partition_event")  # fmt: skip
    job = next(e["job_event"]["job_run_id"] for e in events if e["build_request_id"] == request
               and e["event_type"] == "job_event")  # fmt: skip
    code = (
        "import json, sys\n"
        "from databuild_assets.log import open_event_log\n"
        "from databuild_assets.log.interface import EventFilter\n"
        "with open_event_log(sys.argv[1]) as log:\n"
        "    ids = lambda found: [e['event_id'] for e in found]\n"
        "    print(json.dumps(ids(log.get_build_request_events(sys.argv[2]))))\n"
        "    page = log.list_events(filter=EventFilter(partition_refs=[sys.argv[3]]), limit=1000)\n"
        "    after = log.list_events(since=log.list_events(limit=5).next_cursor, limit=20)\n"
        "    span = log.get_events_in_range(int(sys.argv[5]), int(sys.argv[5]) + 10**12)\n"
        "    print(json.dumps([ids(log.get_partition_events(sys.argv[3])), ids(log.get_job_run_events(sys.argv[4])),"
        " ids(page.events), ids(after.events), ids(span)]))\n"
        "print(json.dumps('pandas' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, f"delta://{lake.root}", request, ref, job, str(events[0]["timestamp"])],
        capture_output=True, text=True, cwd=REPO_ROOT, check=True,
    )  # fmt: skip
    expected = [e["event_id"] for e in sorted(events, key=lambda e: (e["timestamp"], e["event_id"]))]
    requests_events, others, pandas = map(json.loads, done.stdout.splitlines())
    assert requests_events == [i for i in expected if any(
        e["event_id"] == i and e["build_request_id"] == request for e in events
    )]  # fmt: skip
    with SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        page = reference.list_events(filter=EventFilter(partition_refs=[ref]), limit=1000)
        after = reference.list_events(since=reference.list_events(limit=5).next_cursor, limit=20)
        span = reference.get_events_in_range(events[0]["timestamp"], events[0]["timestamp"] + 10**12)
        answers = [reference.get_partition_events(ref), reference.get_job_run_events(job), page.events]
        answers += [after.events, span]
        assert others == [[e["event_id"] for e in found] for found in answers]
    assert all(others)
    assert pandas is False


def test_the_index_keeps_only_hot_events_with_the_window_at_0(lake: Lake, capsys) -> None:
    events = list(generate_events(50_000, seed=1))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    whole = refresh_serving_index(lake, hot_window_s=float("inf"))  # every event hot
    whole_bytes = folder_bytes(lake)
    tiered = refresh_serving_index(lake, hot_window_s=0)
    tiered_bytes = folder_bytes(lake)
    with DeltaRsEventLog(lake) as log:
        segment_bytes = sum(path.stat().st_size for path in Path(log._store().segment_folder).iterdir())
        cold = log._store().cold_facts()
    n = len(events)
    with capsys.disabled():
        print(
            f"\n{n:,} events: all hot: index {whole.bytes:,} B ({whole.bytes / n:.0f} B/event), folder {whole_bytes:,}"
            f"; window 0: index {tiered.bytes:,} B ({tiered.bytes / n:.0f} B/event), segments {segment_bytes:,} B"
            f" ({segment_bytes / n:.0f} B/event), folder {tiered_bytes:,} B ({tiered_bytes / n:.0f} B/event); {cold}"
        )
    assert tiered_bytes < whole_bytes / 2
