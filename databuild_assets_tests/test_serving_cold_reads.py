"""The cold tier's reads (docs/decisions/0051, cold.py): a partition's events over many segments,
their files read side by side by the process's pool (pool.py), answer as the reference does, in
the process that made the pool and in a child forked from it; a sorted companion's row groups are
found by bisecting a few groups' statistics (footers.py)."""

from __future__ import annotations

import math
import multiprocessing
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from databuild_assets.events.erasure_rule import matches
from databuild_assets.log.interface import EventFilter
from databuild_assets.log.serving import cold, evict, footers, segment_files
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.sqlite.backend import SqliteEventLog
from databuild_assets.runtime.lake import Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests.serving_support import request_erasure_without_spark


def _all_cold(lake: Lake, n_events: int, seed: int) -> list[dict[str, Any]]:
    """`n_events` generated events appended, then every finished build request made cold."""
    events = list(generate_events(n_events, seed=seed))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    return events


def test_a_partition_over_many_segments_is_read_side_by_side_and_in_a_forked_child_too(lake: Lake, monkeypatch) -> None:
    # The segments' files are read by a thread pool of the process (pool.py); a child forked
    # after the parent used it inherits the pool object but none of its threads, and a read
    # there waited forever when the pool was not the child's own.
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 500)
    events = _all_cold(lake, 3000, seed=8)
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        held = log._store()._connection.execute(
            "SELECT partition_ref FROM cold_partition_events GROUP BY 1 ORDER BY COUNT(*) DESC LIMIT 3"
        )
        refs = [row[0] for row in held]
        assert len(log._store()._partition_segments(refs[0])) > 2
        expected = {ref: reference.get_partition_events(ref) for ref in refs}
        assert {ref: log.get_partition_events(ref) for ref in refs} == expected
        context = multiprocessing.get_context("fork")
        answers = context.Queue()
        child = context.Process(target=_answer_in_child, args=(lake.root, refs, answers))
        child.start()
        try:
            assert answers.get(timeout=60) == expected
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0


def _answer_in_child(root: str, refs: list[str], answers: Any) -> None:
    with DeltaRsEventLog(Lake(root)) as log:
        answers.put({ref: log.get_partition_events(ref) for ref in refs})


def test_a_partitions_row_groups_in_a_companion_are_found_by_bisecting_a_few_groups_statistics(
    lake: Lake, monkeypatch
) -> None:
    # A companion is sorted by key across its row groups and says so in its schema metadata;
    # a read bisects the groups' statistics rather than taking every group's first (a fresh
    # process's first read of an old partition walked every group of every segment holding it).
    monkeypatch.setattr(segment_files, "BY_PARTITION_ROWS_PER_GROUP", 16)
    events = _all_cold(lake, 2000, seed=5)
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        index = log._store()
        segment, ref = index._connection.execute("SELECT segment, partition_ref FROM cold_partition_events").fetchone()
        file, footer = footers.opened(segment_files.segment_paths(index.segment_folder, segment)[1])
        assert file.metadata.num_row_groups > 64
        assert log.get_partition_events(ref) == reference.get_partition_events(ref)
        bounds = footer.bounds(file, "key")  # every group's when not bisected
        probed = len(getattr(bounds, "_seen", range(file.metadata.num_row_groups)))
        assert 0 < probed <= 2 * math.ceil(math.log2(file.metadata.num_row_groups)) + 2, probed
        refs = [row[0] for row in index._connection.execute("SELECT DISTINCT partition_ref FROM cold_partition_events")]
        assert {r: log.get_partition_events(r) for r in refs} == {r: reference.get_partition_events(r) for r in refs}


def test_the_footers_kept_stay_within_their_bound_and_a_rewritten_file_replaces_its_own(tmp_path, monkeypatch) -> None:
    # A process kept every footer it read: about ten times its serialized size each, every
    # segment's over a long-running reader's life, and the footers of segments merged away too.
    table = pa.table({"key": [f"data/p{i:05d}" for i in range(4096)], "timestamp": list(range(4096))})
    paths = [str(tmp_path / f"segment-{n}.parquet") for n in range(8)]
    for path in paths:
        pq.write_table(table, path, row_group_size=64)
    one = footers.footer_bytes(pq.ParquetFile(paths[0]).metadata)
    monkeypatch.setattr(footers, "FOOTER_CACHE_BYTES", 3 * one)
    first_read = [footers.opened(path)[1] for path in paths]
    assert footers.kept_footers() == (3, 3 * one)
    recent = footers.opened(paths[-1])[1]
    assert recent is first_read[-1]  # still kept: its footer is not read again
    assert footers.opened(paths[0])[1] is not first_read[0]  # the least recently read was dropped

    pq.write_table(table.slice(0, 1000), paths[-1] + ".new", row_group_size=64)
    os.replace(paths[-1] + ".new", paths[-1])  # rewritten in place: another inode, another footer
    file, footer = footers.opened(paths[-1])
    assert footer is not recent and footer.metadata.num_rows == 1000 == file.metadata.num_rows
    assert footers.kept_footers()[1] <= 3 * one


def test_partitions_read_side_by_side_answer_as_the_reference_while_their_footers_leave_the_cache(
    lake: Lake, monkeypatch
) -> None:
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 500)
    events = _all_cold(lake, 3000, seed=9)
    monkeypatch.setattr(footers, "FOOTER_CACHE_BYTES", 1)  # every footer dropped as the next is read
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        refs = [
            row[0]
            for row in log._store()._connection.execute("SELECT DISTINCT partition_ref FROM cold_partition_events")
        ]
        assert {r: log.get_partition_events(r) for r in refs} == {r: reference.get_partition_events(r) for r in refs}
        assert footers.kept_footers()[0] == 1


def _all_pages(log: Any, filter: EventFilter | None = None, limit: int = 100) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = log.list_events(since=cursor, filter=filter, limit=limit)
        pages.append([event["event_id"] for event in page.events])
        if not page.has_more:
            return pages
        cursor = page.next_cursor


def test_pages_of_cold_history_read_from_kept_row_groups_leave_out_what_a_tombstone_hides(
    lake: Lake, monkeypatch
) -> None:
    # Groups of 500 rows: five pages each, then the next group, one group kept at a time.
    monkeypatch.setattr(segment_files, "ROWS_PER_GROUP", 500)
    monkeypatch.setattr(cold, "DECODED_GROUPS", 1)
    events = _all_cold(lake, 3000, seed=11)
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        assert _all_pages(log) == _all_pages(reference)
        assert len(log._store()._decoded_groups) == 1

        first = log.list_events(limit=100).events[0]  # of a cold build request, from the kept group
        request_erasure_without_spark(lake, "build_request_id", first["build_request_id"])
        page = log.list_events(limit=100)  # the same kept group: its rows of that request left out
        assert first["build_request_id"] not in {event["build_request_id"] for event in page.events}
        visible = [e for e in events if not matches(e, {"build_request_id": {first["build_request_id"]}})]
        with SqliteEventLog(":memory:") as after:
            after.append_events(visible)
            assert _all_pages(log) == _all_pages(after)


def test_pages_of_a_segment_whose_row_groups_are_out_of_time_order_answer_as_the_reference(
    lake: Lake, monkeypatch
) -> None:
    # A page's first rows are a slice of each decoded row group, which is kept in time order:
    # sorted when its file holds it otherwise (each group here rewritten in reverse).
    monkeypatch.setattr(segment_files, "ROWS_PER_GROUP", 500)
    events = _all_cold(lake, 3000, seed=12)
    with DeltaRsEventLog(lake) as log:
        index = log._store()
        (segment,) = [row[0] for row in index._connection.execute("SELECT segment FROM cold_segments")]
        path = segment_files.segment_paths(index.segment_folder, segment)[0]
    file = pq.ParquetFile(path)
    groups = [file.read_row_group(group) for group in range(file.metadata.num_row_groups)]
    assert len(groups) > 2
    with pq.ParquetWriter(path + ".reversed", file.schema_arrow) as writer:
        for group in groups:
            writer.write_table(group.take(pa.array(range(group.num_rows - 1, -1, -1))), row_group_size=500)
    os.replace(path + ".reversed", path)
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        assert _all_pages(log) == _all_pages(reference)


def test_a_partitions_pages_over_many_segments_past_a_cursor_are_the_references(lake: Lake, monkeypatch) -> None:
    # A page past a cursor reads only the segments, and their row groups, that end at or after
    # its time: the pages through a partition spread over many segments are SQLite's still,
    # with groups of two rows, so that a page's cursor is often a group's last time (an event
    # and the partition event it carries share one).
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 500)
    monkeypatch.setattr(segment_files, "BY_PARTITION_ROWS_PER_GROUP", 2)
    events = _all_cold(lake, 3000, seed=8)
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        store = log._store()
        most = "SELECT partition_ref FROM cold_partition_events GROUP BY 1 ORDER BY COUNT(*) DESC LIMIT 1"
        (ref,) = store._connection.execute(most).fetchone()
        assert len(store._partition_segments(ref)) > 2
        for page_of in (
            EventFilter(partition_refs=[ref]),
            EventFilter(partition_refs=[ref], event_types=["job_event"]),
        ):
            for limit in (1, 3):
                pages = _all_pages(log, page_of, limit)
                assert pages == _all_pages(reference, page_of, limit) and len(pages) > 2


def test_a_page_of_several_partitions_holds_an_event_listing_them_all_once(lake: Lake) -> None:
    # A cold page filtered by partitions reads their rows in the by-partition files, where an
    # event listing two of them has a row for each: one event on the page, and a page of one
    # after it still finds the next event.
    events = _all_cold(lake, 2000, seed=13)
    listing = next(
        e for e in events if e["event_type"] == "build_request_event"
        and len(e["build_request_event"]["requested_partitions"]) > 1
    )  # fmt: skip
    page_of = EventFilter(partition_refs=listing["build_request_event"]["requested_partitions"][:2])
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        assert log._store().has_cold()
        for limit in (1, 100):
            assert _all_pages(log, page_of, limit) == _all_pages(reference, page_of, limit)
        assert listing["event_id"] in _all_pages(log, page_of, 100)[0]
