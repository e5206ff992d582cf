"""The cold tier's reads (docs/decisions/0051, cold.py): a partition's events over many segments,
their files read side by side by the process's pool (pool.py), answer as the reference does, in
the process that made the pool and in a child forked from it; a sorted companion's row groups are
found by bisecting a few groups' statistics (footers.py)."""

from __future__ import annotations

import math
import multiprocessing
from typing import Any

from databuild_assets.log.serving import evict, footers, segment_files
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.sqlite.backend import SqliteEventLog
from databuild_assets.runtime.lake import Lake
from databuild_assets.workload import generate_events


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
