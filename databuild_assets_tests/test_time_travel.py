"""Time travel: the query API and the projections as of a raw log version or a timestamp, and the
diff of the log between two versions. One history is made once for the module: two appended
batches, an erasure, a compaction; what the live log answered at each step is recorded and the
past views must answer the same (events erased since stay hidden: erased stays erased).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.log.spark.time_travel import (
    ReadOnlyEventLogError,
    TimeTravelError,
    log_commits,
    log_diff,
    resolve_log_version,
)
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.maintenance.vacuum import vacuum_lake
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets_tests.bel_cases import (
    BR,
    J,
    P,
    build_request_event,
    ids,
    job_event,
    one_build_events,
    partition_event,
)

# br-2 builds data/b with job-2 (batch A, one_build_events, has br-1 building data/a and br-2's request).
BATCH_B = [
    build_request_event("e12", 300, "br-2", BR.BUILD_REQUEST_EXECUTING),
    job_event("e13", 310, "br-2", "job-2", J.JOB_SCHEDULED, ["data/b"]),
    partition_event("e14", 320, "br-2", "data/b", P.PARTITION_BUILDING, "job-2"),
    partition_event("e15", 330, "br-2", "data/b", P.PARTITION_AVAILABLE, "job-2"),
    job_event("e16", 340, "br-2", "job-2", J.JOB_COMPLETED, ["data/b"]),
    build_request_event("e17", 350, "br-2", BR.BUILD_REQUEST_COMPLETED),
]
# The events a job_run_id tombstone for job-2 matches: its job events and the partition events it reported.
ERASED = ["e13", "e14", "e15", "e16"]


def answers(log) -> dict:
    """What a reader sees: events, a partition's status, build requests, the activity summary
    (which reads all three projections)."""
    return {
        "events": log.list_events(limit=100).events,
        "data/a": log.get_latest_partition_status("data/a"),
        "data/b": log.get_latest_partition_status("data/b"),
        "build_requests": log.list_build_requests(),
        "summary": log.get_activity_summary(),
    }


@dataclass(frozen=True)
class History:
    lake: Lake
    log: DeltaEventLog
    empty: int  # the raw log's version when created, before any event
    after_a: int
    after_b: int
    after_compaction: int
    said_after_a: dict
    said_after_erasure: dict  # and after compaction: the purge changes no answer


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory) -> History:
    lake = Lake(str(tmp_path_factory.mktemp("time_travel") / "lake"))
    log = DeltaEventLog(spark, lake)
    path = lake.table_path(RAW_EVENT_LOG)

    log.append_events(one_build_events())
    after_a = current_version(spark, path)
    said_after_a = answers(log)
    log.append_events(BATCH_B)
    after_b = current_version(spark, path)
    request_erasure(spark, lake, "job_run_id", "job-2", actor="alice@example.com", reason="ticket 1234")
    said_after_erasure = answers(log)
    compact(spark, lake)
    after_compaction = current_version(spark, path)
    return History(
        lake, log, log_commits(spark, lake)[0][0], after_a, after_b, after_compaction, said_after_a, said_after_erasure
    )


def test_as_of_a_version_answers_what_the_log_answered_then(history):
    assert history.said_after_a["data/b"] is None and ids(history.said_after_a["events"])[:2] == ["e01", "e02"]

    assert answers(history.log.as_of(version=history.after_a)) == history.said_after_a


def test_as_of_a_version_before_an_erasure_keeps_the_erased_events_hidden(history):
    past = history.log.as_of(version=history.after_b)  # e13..e16 were in the log, not yet erased

    seen = answers(past)

    assert seen == history.said_after_erasure
    assert not set(ERASED) & set(ids(seen["events"]))
    assert ids(seen["events"]) == [*(f"e{n:02d}" for n in range(1, 13)), "e17"]
    assert seen["data/b"] is None  # every partition event of data/b came from job-2


def test_as_of_the_compacted_version_answers_as_the_live_log(history):
    assert answers(history.log.as_of(version=history.after_compaction)) == history.said_after_erasure


def test_as_of_the_empty_log_answers_nothing(history):
    past = history.log.as_of(version=history.empty)

    assert past.list_events().events == [] and past.get_latest_partition_status("data/a") is None
    assert past.get_activity_summary().total_events == 0


def test_projections_as_of_a_version_are_computed_from_the_log_then(history):
    def statuses(log) -> dict[str, str]:
        rows = log.projection("partition_state").select("partition_ref", "status_code").collect()
        return {row["partition_ref"]: P(row["status_code"]).name for row in rows}

    def build_statuses(log) -> dict[str, str]:
        rows = log.projection("build_requests").select("build_request_id", "status_code").collect()
        return {row["build_request_id"]: BR(row["status_code"]).name for row in rows}

    assert statuses(history.log.as_of(version=history.empty)) == {}
    assert statuses(history.log.as_of(version=history.after_a))["data/a"] == "PARTITION_AVAILABLE"
    assert build_statuses(history.log.as_of(version=history.after_a)) == {
        "br-1": "BUILD_REQUEST_COMPLETED",
        "br-2": "BUILD_REQUEST_RECEIVED",
    }
    assert build_statuses(history.log.as_of(version=history.after_b))["br-2"] == "BUILD_REQUEST_COMPLETED"
    job_runs = history.log.as_of(version=history.after_b).projection("job_runs").select("job_run_id").collect()
    assert [row["job_run_id"] for row in job_runs] == ["job-1"]  # job-2's events are erased


def test_a_timestamp_reads_the_last_commit_at_or_before_it(spark, history):
    commit_ms = dict(log_commits(spark, history.lake))
    at_a = datetime.fromtimestamp(commit_ms[history.after_a] / 1000, UTC)
    at_b = datetime.fromtimestamp(commit_ms[history.after_b] / 1000, UTC)

    assert resolve_log_version(spark, history.lake, timestamp=at_a) == history.after_a
    assert resolve_log_version(spark, history.lake, timestamp=at_a + (at_b - at_a) / 2) == history.after_a
    assert resolve_log_version(spark, history.lake, timestamp=at_b.isoformat()) == history.after_b
    assert (
        resolve_log_version(spark, history.lake, timestamp=at_b.replace(tzinfo=None)) == history.after_b
    )  # naive: UTC
    assert history.log.as_of(timestamp=at_a).list_events(limit=100).events == history.said_after_a["events"]


def test_a_version_or_timestamp_outside_the_history_is_refused(spark, history):
    path = history.lake.table_path(RAW_EVENT_LOG)
    first_commit = datetime.fromtimestamp(log_commits(spark, history.lake)[0][1] / 1000, UTC)

    with pytest.raises(
        TimeTravelError, match=rf"{path} has no version 999 to read: versions 0\.\.{history.after_compaction} "
    ):
        history.log.as_of(version=999)
    with pytest.raises(TimeTravelError, match=rf"{path} had no commit yet at "):
        history.log.as_of(timestamp=first_commit - timedelta(days=1))
    with pytest.raises(ValueError, match="give exactly one of version="):
        history.log.as_of(version=1, timestamp=first_commit)


def test_a_past_view_refuses_appends_and_the_log_is_unchanged(spark, history):
    past = history.log.as_of(version=history.after_a)

    with pytest.raises(ReadOnlyEventLogError, match=rf"as_of\(version={history.after_a}\) is the log as it was"):
        past.append_events(BATCH_B)

    assert current_version(spark, history.lake.table_path(RAW_EVENT_LOG)) == history.after_compaction


def test_the_diff_of_an_append_lists_the_events_added_and_only_the_ids_of_those_erased_since(spark, history):
    diff = log_diff(spark, history.lake, history.after_a, history.after_b)

    assert ids(list(diff.added)) == ["e12", "e17"]
    assert list(diff.added) == [e for e in history.said_after_erasure["events"] if e["event_id"] in ("e12", "e17")]
    assert diff.hidden_event_ids == tuple(ERASED)
    assert diff.removed_event_ids == ()


def test_the_diff_across_compaction_lists_the_events_erased(spark, history):
    diff = log_diff(spark, history.lake, history.after_b, history.after_compaction)

    assert (diff.added, diff.hidden_event_ids, diff.removed_event_ids) == ((), (), tuple(ERASED))


def test_the_diff_over_the_whole_history_nets_out_events_added_and_erased_in_between(spark, history):
    diff = log_diff(spark, history.lake, history.after_a, history.after_compaction)

    assert (ids(list(diff.added)), diff.hidden_event_ids, diff.removed_event_ids) == (["e12", "e17"], (), ())
    with pytest.raises(ValueError, match="is after to_version"):
        log_diff(spark, history.lake, history.after_compaction, history.after_a)


def test_a_version_whose_files_vacuum_removed_is_refused_when_asked_for_not_at_the_first_query(
    spark, history, tmp_path
):
    # On a copy of the module's lake: its compaction rewrote batch B's file without the erased
    # events, and vacuum deletes the old one here only.
    lake = Lake(str(tmp_path / "lake"))
    shutil.copytree(history.lake.root, lake.root, symlinks=True)
    log = DeltaEventLog(spark, lake)
    path = lake.table_path(RAW_EVENT_LOG)
    after_b = history.after_b
    vacuum_lake(spark, lake, retention_hours=0, allow_short_retention=True)

    with pytest.raises(TimeTravelError, match=rf"{path} version {after_b} cannot be read: vacuum removed \d+ of its"):
        log.as_of(version=after_b)
    with pytest.raises(TimeTravelError, match="vacuum removed"):
        log_diff(spark, lake, after_b, current_version(spark, path))
    visible = len(one_build_events()) + len(BATCH_B) - len(ERASED)
    assert log.as_of(version=current_version(spark, path)).get_activity_summary().total_events == visible
