"""The cold tier's reads (docs/decisions/0051, cold.py): a partition's events over many segments,
their files read side by side by the process's pool (pool.py), answer as the reference does, in
the process that made the pool and in a child forked from it."""

from __future__ import annotations

import multiprocessing
from typing import Any

from databuild_assets.log.serving import evict
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.sqlite.backend import SqliteEventLog
from databuild_assets.runtime.lake import Lake
from databuild_assets.workload import generate_events


def test_a_partition_over_many_segments_is_read_side_by_side_and_in_a_forked_child_too(lake: Lake, monkeypatch) -> None:
    # The segments' files are read by a thread pool of the process (pool.py); a child forked
    # after the parent used it inherits the pool object but none of its threads, and a read
    # there waited forever when the pool was not the child's own.
    monkeypatch.setattr(evict, "SEGMENT_EVENTS", 500)
    events = list(generate_events(3000, seed=8))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
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
