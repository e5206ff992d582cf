"""The backend-independent specification of `BuildEventLog`: every backend must pass every case.

A case is a function of an empty, open log: it appends hand-written events and asserts the
answers, written out in full. `test_event_log_queries.py` runs `CASES` against each backend.
Timestamps are small integers (nanoseconds) so that the order of events is visible at a glance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.validation import InvalidEventError
from databuild_assets.log.interface import (
    ActivitySummary,
    AppendResult,
    BuildEventLog,
    BuildRequestSummary,
    EventFilter,
    PartitionStatusInfo,
    PartitionSummary,
    canonical_event,
    status_counts,
)

BR = BuildRequestStatus
P = PartitionStatus
J = JobStatus
END_OF_TIME = 2**63 - 1

# ---------------------------------------------------------------------------------------------
# Builders: one line per event
# ---------------------------------------------------------------------------------------------


def _event(event_id: str, timestamp: int, build_request_id: str, event_type: str, payload: dict) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "timestamp": timestamp,
        "build_request_id": build_request_id,
        "event_type": event_type,
        event_type: payload,
    }


def build_request_event(
    event_id: str, timestamp: int, build_request_id: str, status: BR, requested_partitions: list[str] | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"status_code": int(status), "status_name": status.name}
    if requested_partitions is not None:
        payload["requested_partitions"] = requested_partitions
    return _event(event_id, timestamp, build_request_id, "build_request_event", payload)


def partition_event(
    event_id: str, timestamp: int, build_request_id: str, partition_ref: str, status: P, job_run_id: str | None = None
) -> dict[str, Any]:
    payload = {"partition_ref": partition_ref, "status_code": int(status), "status_name": status.name}
    if job_run_id is not None:
        payload["job_run_id"] = job_run_id
    return _event(event_id, timestamp, build_request_id, "partition_event", payload)


def job_event(
    event_id: str,
    timestamp: int,
    build_request_id: str,
    job_run_id: str,
    status: J,
    target_partitions: list[str] | None = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {"job_run_id": job_run_id, "status_code": int(status), "status_name": status.name}
    if target_partitions is not None:
        payload["target_partitions"] = target_partitions
        payload["job_label"] = "//jobs:build"
    return _event(event_id, timestamp, build_request_id, "job_event", payload)


def delegation_event(
    event_id: str, timestamp: int, build_request_id: str, partition_ref: str, delegated_to: str
) -> dict[str, Any]:
    payload = {"partition_ref": partition_ref, "delegated_to_build_request_id": delegated_to}
    return _event(event_id, timestamp, build_request_id, "delegation_event", payload)


def invalidation_event(
    event_id: str, timestamp: int, build_request_id: str, partition_ref: str, reason: str
) -> dict[str, Any]:
    payload = {"partition_ref": partition_ref, "reason": reason}
    return _event(event_id, timestamp, build_request_id, "partition_invalidation_event", payload)


def task_cancel_event(event_id: str, timestamp: int, build_request_id: str, job_run_id: str, reason: str) -> dict:
    payload = {"job_run_id": job_run_id, "reason": reason}
    return _event(event_id, timestamp, build_request_id, "task_cancel_event", payload)


def build_cancel_event(event_id: str, timestamp: int, build_request_id: str, reason: str) -> dict[str, Any]:
    return _event(event_id, timestamp, build_request_id, "build_cancel_event", {"reason": reason})


def job_graph_event(event_id: str, timestamp: int, build_request_id: str, job_graph: str) -> dict[str, Any]:
    return _event(event_id, timestamp, build_request_id, "job_graph_event", {"job_graph": job_graph})


# ---------------------------------------------------------------------------------------------
# Expected values
# ---------------------------------------------------------------------------------------------


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [event["event_id"] for event in events]


def partition_counts(**nonzero: int) -> dict[str, int]:
    """All PartitionStatus names with 0, except those given: partition_counts(PARTITION_AVAILABLE=1)."""
    return status_counts(P, {P[name].value: count for name, count in nonzero.items()})


def job_run_counts(**nonzero: int) -> dict[str, int]:
    return status_counts(J, {J[name].value: count for name, count in nonzero.items()})


def build_request_counts(**nonzero: int) -> dict[str, int]:
    return status_counts(BR, {BR[name].value: count for name, count in nonzero.items()})


def all_events(log: BuildEventLog) -> list[dict[str, Any]]:
    return log.get_events_in_range(0, END_OF_TIME)


CASES: list[Callable[[BuildEventLog], None]] = []


def case(function: Callable[[BuildEventLog], None]) -> Callable[[BuildEventLog], None]:
    CASES.append(function)
    return function


# ---------------------------------------------------------------------------------------------
# Appending
# ---------------------------------------------------------------------------------------------


@case
def appended_events_come_back_equal_with_every_payload_and_field_present(log: BuildEventLog) -> None:
    events = [
        build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        job_graph_event("e2", 110, "br-1", '{"nodes": []}'),
        partition_event("e3", 120, "br-1", "data/a", P.PARTITION_REQUESTED),
        job_event("e4", 130, "br-1", "job-1", J.JOB_SCHEDULED, ["data/a"]),
        delegation_event("e5", 140, "br-1", "data/b", "br-0"),
        invalidation_event("e6", 150, "br-1", "data/c", "upstream fixed"),
        task_cancel_event("e7", 160, "br-1", "job-1", "operator"),
        build_cancel_event("e8", 170, "br-1", "operator"),
        # status_name may be omitted on input; it stays omitted (None) on output.
        _event("e9", 180, "br-1", "partition_event", {"partition_ref": "data/a", "status_code": 5}),
    ]

    assert log.append_events(events) == AppendResult(accepted=9, duplicates=0)

    assert all_events(log) == [canonical_event(event) for event in events]
    assert all_events(log)[2] == {
        "event_id": "e3",
        "timestamp": 120,
        "build_request_id": "br-1",
        "event_type": "partition_event",
        "build_request_event": None,
        "partition_event": {
            "partition_ref": "data/a",
            "status_code": 1,
            "status_name": "PARTITION_REQUESTED",
            "message": None,
            "job_run_id": None,
        },
        "job_event": None,
        "delegation_event": None,
        "job_graph_event": None,
        "partition_invalidation_event": None,
        "task_cancel_event": None,
        "build_cancel_event": None,
    }
    assert all_events(log)[8]["partition_event"]["status_name"] is None


@case
def an_event_id_already_in_the_log_is_skipped_and_counted_as_a_duplicate(log: BuildEventLog) -> None:
    first = partition_event("e1", 100, "br-1", "data/a", P.PARTITION_REQUESTED)
    second = partition_event("e2", 200, "br-1", "data/a", P.PARTITION_BUILDING)
    third = partition_event("e3", 300, "br-1", "data/a", P.PARTITION_AVAILABLE)
    # Same event_id as `second`, different content: the event_id is the idempotency key.
    second_again = partition_event("e2", 250, "br-1", "data/a", P.PARTITION_FAILED)

    assert log.append_events([first, second]) == AppendResult(accepted=2, duplicates=0)
    assert log.append_events([second_again, third, third]) == AppendResult(accepted=1, duplicates=2)
    assert log.append_event(first) == AppendResult(accepted=0, duplicates=1)

    assert ids(all_events(log)) == ["e1", "e2", "e3"]
    assert all_events(log)[1]["partition_event"]["status_name"] == "PARTITION_BUILDING"
    assert log.get_activity_summary().total_events == 3


@case
def one_invalid_event_rejects_the_whole_append_and_names_its_index(log: BuildEventLog) -> None:
    good = partition_event("e1", 100, "br-1", "data/a", P.PARTITION_REQUESTED)
    bad = partition_event("e2", 200, "br-1", "data/a", P.PARTITION_BUILDING)
    bad["partition_event"]["status_code"] = 42

    with pytest.raises(InvalidEventError, match=r"events\[1\]: partition_event.status_code 42"):
        log.append_events([good, bad])

    assert all_events(log) == []
    assert log.get_latest_partition_status("data/a") is None
    assert log.get_activity_summary().total_events == 0


@case
def an_empty_append_accepts_nothing(log: BuildEventLog) -> None:
    assert log.append_events([]) == AppendResult(accepted=0, duplicates=0)
    assert all_events(log) == []


# ---------------------------------------------------------------------------------------------
# Ordering
# ---------------------------------------------------------------------------------------------


@case
def events_with_equal_timestamps_are_ordered_by_event_id(log: BuildEventLog) -> None:
    log.append_events(
        [
            partition_event("b", 100, "br-1", "data/a", P.PARTITION_REQUESTED),
            partition_event("c", 100, "br-1", "data/a", P.PARTITION_SCHEDULED),
            partition_event("a", 100, "br-1", "data/a", P.PARTITION_BUILDING),
            partition_event("z", 50, "br-1", "data/a", P.PARTITION_UNKNOWN),
        ]
    )

    assert ids(all_events(log)) == ["z", "a", "b", "c"]
    assert ids(log.get_partition_events("data/a")) == ["z", "a", "b", "c"]
    assert ids(log.list_events(limit=10).events) == ["z", "a", "b", "c"]


@case
def the_latest_of_two_events_with_equal_timestamps_is_the_one_with_the_greater_event_id(log: BuildEventLog) -> None:
    log.append_events(
        [
            partition_event("e-2", 100, "br-1", "data/a", P.PARTITION_FAILED, "job-1"),
            partition_event("e-1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
            partition_event("e-9", 100, "br-2", "data/b", P.PARTITION_AVAILABLE, "job-2"),
            invalidation_event("e-8", 100, "br-2", "data/b", "tie: event_id e-8 < e-9, so it is earlier"),
        ]
    )

    assert log.get_latest_partition_status("data/a") == PartitionStatusInfo(
        partition_ref="data/a",
        status_code=5,
        status_name="PARTITION_FAILED",
        timestamp=100,
        event_id="e-2",
        build_request_id="br-1",
        job_run_id="job-1",
        invalidated=False,
        is_available=False,
    )
    assert log.get_build_request_for_available_partition("data/a") is None
    # The invalidation sorts before the AVAILABLE event, so it does not void it.
    assert log.get_latest_partition_status("data/b").invalidated is False
    assert log.get_build_request_for_available_partition("data/b") == "br-2"


@case
def late_events_take_their_place_by_timestamp_not_by_arrival(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e10", 10, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            partition_event("e20", 20, "br-1", "data/a", P.PARTITION_REQUESTED),
            partition_event("e40", 40, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
        ]
    )
    cursor_after_everything = log.list_events(limit=10).next_cursor

    # Arrive later, but happened before the AVAILABLE event (and one before the request).
    assert log.append_events(
        [
            partition_event("e30", 30, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
            invalidation_event("e35", 35, "br-9", "data/a", "stale upstream"),
            job_graph_event("e05", 5, "br-1", "{}"),
        ]
    ) == AppendResult(accepted=3, duplicates=0)

    assert ids(log.get_partition_events("data/a")) == ["e10", "e20", "e30", "e35", "e40"]
    assert ids(log.get_build_request_events("br-1")) == ["e05", "e10", "e20", "e30", "e40"]
    status = log.get_latest_partition_status("data/a")
    assert (status.status_name, status.event_id, status.invalidated, status.is_available) == (
        "PARTITION_AVAILABLE",
        "e40",
        False,
        True,
    )
    assert log.get_build_request_for_available_partition("data/a") == "br-1"
    # br-1's received_at moved back to its earliest event; br-9 only wrote the invalidation.
    assert [(r.build_request_id, r.received_at, r.updated_at, r.event_count) for r in log.list_build_requests()] == [
        ("br-9", 35, 35, 1),
        ("br-1", 5, 40, 5),
    ]
    [partition] = log.list_recent_partitions()
    assert (partition.updated_at, partition.last_event_id, partition.event_count) == (40, "e40", 4)
    # A cursor is a position in (timestamp, event_id): events that land before it are not re-read.
    page = log.list_events(since=cursor_after_everything)
    assert (page.events, page.next_cursor, page.has_more) == ([], cursor_after_everything, False)


@case
def a_late_invalidation_later_than_the_available_event_voids_it(log: BuildEventLog) -> None:
    log.append_events([partition_event("e40", 40, "br-1", "data/a", P.PARTITION_AVAILABLE)])
    assert log.get_build_request_for_available_partition("data/a") == "br-1"

    log.append_events([invalidation_event("e45", 45, "br-2", "data/a", "bad input")])

    assert log.get_build_request_for_available_partition("data/a") is None
    assert log.get_latest_partition_status("data/a").invalidated is True


# ---------------------------------------------------------------------------------------------
# Reading events
# ---------------------------------------------------------------------------------------------


def one_build_events() -> list[dict[str, Any]]:
    """br-1 builds data/a with job-1, while br-2 asks for data/b."""
    return [
        build_request_event("e01", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        build_request_event("e02", 110, "br-2", BR.BUILD_REQUEST_RECEIVED, ["data/b"]),
        partition_event("e03", 120, "br-1", "data/a", P.PARTITION_REQUESTED),
        build_request_event("e04", 130, "br-1", BR.BUILD_REQUEST_EXECUTING),
        job_event("e05", 140, "br-1", "job-1", J.JOB_SCHEDULED, ["data/a"]),
        partition_event("e06", 150, "br-1", "data/a", P.PARTITION_SCHEDULED, "job-1"),
        job_event("e07", 160, "br-1", "job-1", J.JOB_RUNNING, ["data/a"]),
        partition_event("e08", 170, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
        partition_event("e09", 180, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
        job_event("e10", 190, "br-1", "job-1", J.JOB_COMPLETED, ["data/a"]),
        build_request_event("e11", 200, "br-1", BR.BUILD_REQUEST_COMPLETED),
    ]


def _one_build(log: BuildEventLog) -> None:
    log.append_events(one_build_events())


@case
def build_request_events_are_its_own_events_strictly_after_since(log: BuildEventLog) -> None:
    _one_build(log)

    assert ids(log.get_build_request_events("br-1")) == [
        "e01", "e03", "e04", "e05", "e06", "e07", "e08", "e09", "e10", "e11",
    ]  # fmt: skip
    assert ids(log.get_build_request_events("br-1", since_ns=180)) == ["e10", "e11"]
    assert ids(log.get_build_request_events("br-2")) == ["e02"]
    assert log.get_build_request_events("br-unknown") == []


@case
def partition_events_include_requests_and_jobs_that_list_the_partition(log: BuildEventLog) -> None:
    _one_build(log)

    assert ids(log.get_partition_events("data/a")) == ["e01", "e03", "e05", "e06", "e07", "e08", "e09", "e10"]
    assert ids(log.get_partition_events("data/a", since_ns=160)) == ["e08", "e09", "e10"]
    assert ids(log.get_partition_events("data/b")) == ["e02"]
    assert log.get_partition_events("data/unknown") == []


@case
def job_run_events_are_its_job_events_cancels_and_the_partition_events_it_reported(log: BuildEventLog) -> None:
    _one_build(log)
    log.append_event(task_cancel_event("e12", 210, "br-1", "job-1", "too late, it already finished"))

    assert ids(log.get_job_run_events("job-1")) == ["e05", "e06", "e07", "e08", "e09", "e10", "e12"]
    assert log.get_job_run_events("job-unknown") == []


@case
def events_in_range_include_the_start_and_exclude_the_end(log: BuildEventLog) -> None:
    _one_build(log)

    assert ids(log.get_events_in_range(120, 160)) == ["e03", "e04", "e05", "e06"]
    assert ids(log.get_events_in_range(125, 125)) == []
    with pytest.raises(ValueError, match="end_ns 100 is before start_ns 200"):
        log.get_events_in_range(200, 100)


# ---------------------------------------------------------------------------------------------
# Paging
# ---------------------------------------------------------------------------------------------


@case
def list_events_pages_through_the_log_with_a_cursor_and_can_poll_for_new_events(log: BuildEventLog) -> None:
    _one_build(log)

    first = log.list_events(limit=4)
    second = log.list_events(since=first.next_cursor, limit=4)
    third = log.list_events(since=second.next_cursor, limit=4)
    assert (ids(first.events), first.has_more) == (["e01", "e02", "e03", "e04"], True)
    assert (ids(second.events), second.has_more) == (["e05", "e06", "e07", "e08"], True)
    assert (ids(third.events), third.has_more) == (["e09", "e10", "e11"], False)

    empty = log.list_events(since=third.next_cursor, limit=4)
    assert (empty.events, empty.next_cursor, empty.has_more) == ([], third.next_cursor, False)

    log.append_event(build_cancel_event("e12", 300, "br-2", "no longer needed"))
    assert ids(log.list_events(since=empty.next_cursor, limit=4).events) == ["e12"]


@case
def a_page_that_ends_exactly_at_the_last_event_says_there_is_no_more(log: BuildEventLog) -> None:
    _one_build(log)

    page = log.list_events(limit=11)

    assert (len(page.events), page.has_more) == (11, False)


@case
def list_events_filters_combine_with_and_and_their_values_with_or(log: BuildEventLog) -> None:
    _one_build(log)

    def listed(**filter_fields: Any) -> list[str]:
        return ids(log.list_events(filter=EventFilter(**filter_fields), limit=100).events)

    assert listed(event_types=["job_event", "build_request_event"]) == ["e01", "e02", "e04", "e05", "e07", "e10", "e11"]
    assert listed(build_request_ids=["br-2"]) == ["e02"]
    assert listed(partition_refs=["data/b", "data/a"]) == [
        "e01", "e02", "e03", "e05", "e06", "e07", "e08", "e09", "e10",
    ]  # fmt: skip
    assert listed(job_run_ids=["job-1"]) == ["e05", "e06", "e07", "e08", "e09", "e10"]
    assert listed(partition_refs=["data/a"], event_types=["partition_event"]) == ["e03", "e06", "e08", "e09"]
    assert listed(job_run_ids=["job-1"], build_request_ids=["br-2"]) == []
    assert listed(event_types=[]) == []

    filtered = EventFilter(partition_refs=["data/a"])
    first = log.list_events(filter=filtered, limit=5)
    rest = log.list_events(since=first.next_cursor, filter=filtered, limit=5)
    assert (ids(first.events), first.has_more) == (["e01", "e03", "e05", "e06", "e07"], True)
    assert (ids(rest.events), rest.has_more) == (["e08", "e09", "e10"], False)


@case
def a_cursor_the_log_did_not_issue_is_refused(log: BuildEventLog) -> None:
    _one_build(log)

    for bad in ["", "page-2", "bel1.not-base64!", "bel1.WzFd"]:
        with pytest.raises(ValueError, match="is not one this log issued"):
            log.list_events(since=bad)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        log.list_events(limit=0)


# ---------------------------------------------------------------------------------------------
# Projections
# ---------------------------------------------------------------------------------------------


@case
def a_partition_being_built_is_active_for_its_build_request_until_it_is_available(log: BuildEventLog) -> None:
    _one_build(log)
    # Replay the same story step by step on a second partition to see it while it is building.
    log.append_events(
        [
            build_request_event("f01", 1000, "br-3", BR.BUILD_REQUEST_RECEIVED, ["data/c"]),
            partition_event("f02", 1010, "br-3", "data/c", P.PARTITION_REQUESTED),
        ]
    )
    assert log.get_active_builds_for_partition("data/c") == ["br-3"]
    assert log.get_build_request_for_available_partition("data/c") is None

    log.append_event(partition_event("f03", 1020, "br-3", "data/c", P.PARTITION_BUILDING, "job-3"))
    assert log.get_active_builds_for_partition("data/c") == ["br-3"]

    log.append_event(partition_event("f04", 1030, "br-3", "data/c", P.PARTITION_AVAILABLE, "job-3"))
    assert log.get_active_builds_for_partition("data/c") == []
    assert log.get_build_request_for_available_partition("data/c") == "br-3"

    assert log.get_active_builds_for_partition("data/a") == []
    assert log.get_build_request_for_available_partition("data/a") == "br-1"
    assert log.get_latest_partition_status("data/a") == PartitionStatusInfo(
        partition_ref="data/a",
        status_code=4,
        status_name="PARTITION_AVAILABLE",
        timestamp=180,
        event_id="e09",
        build_request_id="br-1",
        job_run_id="job-1",
        invalidated=False,
        is_available=True,
    )
    assert log.get_latest_partition_status("data/unknown") is None


@case
def a_completed_build_request_summarises_its_partitions_and_job_runs(log: BuildEventLog) -> None:
    _one_build(log)

    assert log.list_build_requests() == [
        BuildRequestSummary(
            build_request_id="br-2",
            status_code=1,
            status_name="BUILD_REQUEST_RECEIVED",
            cancel_reason=None,
            requested_partitions=("data/b",),
            received_at=110,
            started_at=None,
            ended_at=None,
            duration_ns=None,
            updated_at=110,
            event_count=1,
            partition_counts=partition_counts(),
            job_run_counts=job_run_counts(),
        ),
        BuildRequestSummary(
            build_request_id="br-1",
            status_code=4,
            status_name="BUILD_REQUEST_COMPLETED",
            cancel_reason=None,
            # From the latest build_request_event that lists partitions (e01; e04 and e11 list none).
            requested_partitions=("data/a",),
            received_at=100,
            started_at=130,
            ended_at=200,
            duration_ns=100,
            updated_at=200,
            event_count=10,
            partition_counts=partition_counts(PARTITION_AVAILABLE=1),
            job_run_counts=job_run_counts(JOB_COMPLETED=1),
        ),
    ]
    assert [r.build_request_id for r in log.list_build_requests(status=BR.BUILD_REQUEST_COMPLETED)] == ["br-1"]
    assert [r.build_request_id for r in log.list_build_requests(status=1)] == ["br-2"]
    assert log.list_build_requests(status=BR.BUILD_REQUEST_FAILED) == []
    assert [r.build_request_id for r in log.list_build_requests(limit=1, offset=1)] == ["br-1"]
    with pytest.raises(ValueError):
        log.list_build_requests(status=99)


@case
def delegation_points_to_the_build_request_that_builds_the_partition(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            partition_event("e2", 110, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
            # br-2 asks for the same partition and delegates to br-1 instead of building it.
            build_request_event("e3", 120, "br-2", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            partition_event("e4", 130, "br-2", "data/a", P.PARTITION_REQUESTED),
            delegation_event("e5", 140, "br-2", "data/a", "br-1"),
            partition_event("e6", 150, "br-2", "data/a", P.PARTITION_DELEGATED),
        ]
    )

    # br-2's own latest event for data/a is DELEGATED: only br-1 is building it.
    assert log.get_active_builds_for_partition("data/a") == ["br-1"]
    assert log.get_latest_partition_status("data/a").status_name == "PARTITION_DELEGATED"
    assert log.get_build_request_for_available_partition("data/a") is None

    log.append_events(
        [
            partition_event("e7", 160, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
            build_request_event("e8", 170, "br-1", BR.BUILD_REQUEST_COMPLETED),
            build_request_event("e9", 180, "br-2", BR.BUILD_REQUEST_COMPLETED),
        ]
    )

    assert log.get_active_builds_for_partition("data/a") == []
    assert log.get_build_request_for_available_partition("data/a") == "br-1"
    assert log.list_recent_partitions() == [
        PartitionSummary(
            partition_ref="data/a",
            status_code=4,
            status_name="PARTITION_AVAILABLE",
            is_available=True,
            invalidated=False,
            updated_at=160,
            last_event_id="e7",
            last_build_request_id="br-1",
            last_job_run_id="job-1",
            last_available_at=160,
            last_available_build_request_id="br-1",
            delegated_to_build_request_id="br-1",
            invalidation_reason=None,
            event_count=5,
        )
    ]
    # The delegation belongs to br-2, the request that delegated.
    assert ids(log.get_build_request_events("br-1")) == ["e1", "e2", "e7", "e8"]
    assert ids(log.get_build_request_events("br-2")) == ["e3", "e4", "e5", "e6", "e9"]
    assert ids(log.get_partition_events("data/a")) == ["e1", "e2", "e3", "e4", "e5", "e6", "e7"]
    [br2] = log.list_build_requests(status=BR.BUILD_REQUEST_COMPLETED, limit=1)
    assert (br2.build_request_id, br2.partition_counts) == ("br-2", partition_counts(PARTITION_DELEGATED=1))


@case
def a_partition_known_only_from_a_delegation_has_unknown_status_and_no_latest_status(log: BuildEventLog) -> None:
    log.append_event(delegation_event("e1", 100, "br-2", "data/a", "br-1"))

    assert log.get_latest_partition_status("data/a") is None
    [partition] = log.list_recent_partitions()
    assert partition.status_name == "PARTITION_UNKNOWN"
    assert (partition.is_available, partition.invalidated) == (False, False)
    assert partition.delegated_to_build_request_id == "br-1"


@case
def invalidation_after_availability_makes_the_partition_unavailable_until_rebuilt(log: BuildEventLog) -> None:
    log.append_events(
        [
            partition_event("e1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
            invalidation_event("e2", 200, "br-2", "data/a", "upstream data was wrong"),
        ]
    )

    assert log.get_latest_partition_status("data/a") == PartitionStatusInfo(
        partition_ref="data/a",
        status_code=4,
        status_name="PARTITION_AVAILABLE",
        timestamp=100,
        event_id="e1",
        build_request_id="br-1",
        job_run_id="job-1",
        invalidated=True,
        is_available=False,
    )
    assert log.get_build_request_for_available_partition("data/a") is None
    assert log.list_recent_partitions() == [
        PartitionSummary(
            partition_ref="data/a",
            status_code=4,
            status_name="PARTITION_AVAILABLE",
            is_available=False,
            invalidated=True,
            updated_at=200,
            last_event_id="e2",
            last_build_request_id="br-2",
            last_job_run_id="job-1",
            last_available_at=100,
            last_available_build_request_id="br-1",
            delegated_to_build_request_id=None,
            invalidation_reason="upstream data was wrong",
            event_count=2,
        )
    ]
    summary = log.get_activity_summary()
    assert (summary.available_partitions, summary.invalidated_partitions) == (0, 1)

    log.append_events(
        [
            partition_event("e3", 300, "br-3", "data/a", P.PARTITION_BUILDING, "job-3"),
            partition_event("e4", 400, "br-3", "data/a", P.PARTITION_AVAILABLE, "job-3"),
        ]
    )

    assert log.get_build_request_for_available_partition("data/a") == "br-3"
    [partition] = log.list_recent_partitions()
    assert (partition.is_available, partition.invalidated, partition.invalidation_reason) == (True, False, None)
    assert (partition.last_available_at, partition.last_available_build_request_id) == (400, "br-3")


@case
def cancelling_a_running_task_cancels_its_job_run_and_cancelling_the_build_ends_it(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            build_request_event("e2", 110, "br-1", BR.BUILD_REQUEST_EXECUTING),
            job_event("e3", 120, "br-1", "job-1", J.JOB_RUNNING, ["data/a"]),
            partition_event("e4", 130, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
            task_cancel_event("e5", 140, "br-1", "job-1", "operator stopped the task"),
        ]
    )

    [request] = log.list_build_requests()
    assert request.job_run_counts == job_run_counts(JOB_CANCELLED=1)
    # Only partition and build request events decide whether a build is active.
    assert log.get_active_builds_for_partition("data/a") == ["br-1"]

    log.append_event(build_cancel_event("e6", 150, "br-1", "operator cancelled the build"))

    assert log.get_active_builds_for_partition("data/a") == []
    assert log.list_build_requests() == [
        BuildRequestSummary(
            build_request_id="br-1",
            status_code=6,
            status_name="BUILD_REQUEST_CANCELLED",
            cancel_reason="operator cancelled the build",
            requested_partitions=("data/a",),
            received_at=100,
            started_at=110,
            ended_at=150,
            duration_ns=50,
            updated_at=150,
            event_count=6,
            partition_counts=partition_counts(PARTITION_BUILDING=1),
            job_run_counts=job_run_counts(JOB_CANCELLED=1),
        )
    ]


@case
def a_job_event_later_than_the_task_cancel_decides_the_job_run_status(log: BuildEventLog) -> None:
    log.append_events(
        [
            job_event("e1", 100, "br-1", "job-1", J.JOB_RUNNING),
            task_cancel_event("e2", 110, "br-1", "job-1", "operator"),
            job_event("e3", 120, "br-1", "job-1", J.JOB_COMPLETED),
            task_cancel_event("e4", 130, "br-1", "job-2", "cancelled before it was scheduled"),
        ]
    )

    [request] = log.list_build_requests()
    assert request.job_run_counts == job_run_counts(JOB_COMPLETED=1, JOB_CANCELLED=1)


@case
def a_build_request_with_any_build_cancel_event_is_not_active(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            build_cancel_event("e2", 110, "br-1", "cancelled"),
            # Written after the cancel: the request's status is EXECUTING again, but it is not active.
            build_request_event("e3", 120, "br-1", BR.BUILD_REQUEST_EXECUTING),
            partition_event("e4", 130, "br-1", "data/a", P.PARTITION_BUILDING),
            # A request with no build_request_event at all can be active.
            partition_event("e5", 140, "br-2", "data/a", P.PARTITION_SCHEDULED),
            # A terminal request is not, even if its partition event was never closed.
            build_request_event("e6", 150, "br-3", BR.BUILD_REQUEST_FAILED),
            partition_event("e7", 160, "br-3", "data/a", P.PARTITION_BUILDING),
        ]
    )

    assert log.get_active_builds_for_partition("data/a") == ["br-2"]
    statuses = {r.build_request_id: (r.status_name, r.cancel_reason) for r in log.list_build_requests()}
    assert statuses == {
        "br-1": ("BUILD_REQUEST_EXECUTING", None),
        "br-2": ("BUILD_REQUEST_UNKNOWN", None),
        "br-3": ("BUILD_REQUEST_FAILED", None),
    }


@case
def a_failed_partition_retried_by_a_new_build_request_ends_available(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e01", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            job_event("e02", 110, "br-1", "job-1", J.JOB_RUNNING, ["data/a"]),
            partition_event("e03", 120, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
            job_event("e04", 130, "br-1", "job-1", J.JOB_FAILED, ["data/a"]),
            partition_event("e05", 140, "br-1", "data/a", P.PARTITION_FAILED, "job-1"),
            build_request_event("e06", 150, "br-1", BR.BUILD_REQUEST_FAILED),
        ]
    )
    failed = log.get_latest_partition_status("data/a")
    assert (failed.status_name, failed.build_request_id, failed.is_available) == ("PARTITION_FAILED", "br-1", False)
    assert log.get_active_builds_for_partition("data/a") == []

    log.append_events(
        [
            build_request_event("e07", 200, "br-2", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            partition_event("e08", 210, "br-2", "data/a", P.PARTITION_REQUESTED),
            job_event("e09", 220, "br-2", "job-2", J.JOB_RUNNING, ["data/a"]),
            partition_event("e10", 230, "br-2", "data/a", P.PARTITION_BUILDING, "job-2"),
        ]
    )
    assert log.get_active_builds_for_partition("data/a") == ["br-2"]

    log.append_events(
        [
            partition_event("e11", 240, "br-2", "data/a", P.PARTITION_AVAILABLE, "job-2"),
            job_event("e12", 250, "br-2", "job-2", J.JOB_COMPLETED, ["data/a"]),
            build_request_event("e13", 260, "br-2", BR.BUILD_REQUEST_COMPLETED),
        ]
    )

    assert log.get_build_request_for_available_partition("data/a") == "br-2"
    [partition] = log.list_recent_partitions()
    assert (partition.status_name, partition.last_job_run_id, partition.event_count) == (
        "PARTITION_AVAILABLE",
        "job-2",
        5,
    )
    requests = log.list_build_requests()
    assert [(r.build_request_id, r.status_name, r.partition_counts, r.job_run_counts) for r in requests] == [
        ("br-2", "BUILD_REQUEST_COMPLETED", partition_counts(PARTITION_AVAILABLE=1), job_run_counts(JOB_COMPLETED=1)),
        ("br-1", "BUILD_REQUEST_FAILED", partition_counts(PARTITION_FAILED=1), job_run_counts(JOB_FAILED=1)),
    ]
    assert ids(log.get_job_run_events("job-1")) == ["e02", "e03", "e04", "e05"]


@case
def recent_partitions_are_ordered_by_last_update_then_partition_ref_and_paged(log: BuildEventLog) -> None:
    log.append_events(
        [
            partition_event("e1", 100, "br-1", "data/c", P.PARTITION_AVAILABLE),
            partition_event("e2", 300, "br-1", "data/b", P.PARTITION_BUILDING),
            partition_event("e3", 300, "br-1", "data/a", P.PARTITION_FAILED),
            partition_event("e4", 200, "br-1", "data/d", P.PARTITION_REQUESTED),
        ]
    )

    assert [p.partition_ref for p in log.list_recent_partitions()] == ["data/a", "data/b", "data/d", "data/c"]
    assert [p.partition_ref for p in log.list_recent_partitions(limit=2, offset=1)] == ["data/b", "data/d"]
    assert log.list_recent_partitions(limit=10, offset=4) == []
    with pytest.raises(ValueError, match="offset must be a non-negative integer"):
        log.list_recent_partitions(offset=-1)


@case
def build_requests_with_equal_received_at_are_ordered_by_id(log: BuildEventLog) -> None:
    log.append_events(
        [
            build_request_event("e1", 100, "br-b", BR.BUILD_REQUEST_RECEIVED),
            build_request_event("e2", 100, "br-a", BR.BUILD_REQUEST_RECEIVED),
            build_request_event("e3", 200, "br-c", BR.BUILD_REQUEST_RECEIVED),
        ]
    )

    assert [r.build_request_id for r in log.list_build_requests()] == ["br-c", "br-a", "br-b"]


@case
def the_activity_summary_counts_the_whole_log(log: BuildEventLog) -> None:
    _one_build(log)
    log.append_events(
        [
            build_request_event("f1", 300, "br-3", BR.BUILD_REQUEST_RECEIVED, ["data/c"]),
            job_event("f2", 310, "br-3", "job-3", J.JOB_RUNNING, ["data/c"]),
            partition_event("f3", 320, "br-3", "data/c", P.PARTITION_BUILDING, "job-3"),
            delegation_event("f4", 330, "br-2", "data/c", "br-3"),
            invalidation_event("f5", 340, "br-4", "data/d", "never built, invalidated anyway"),
            build_cancel_event("f6", 350, "br-5", "cancelled before anything happened"),
        ]
    )

    assert log.get_activity_summary() == ActivitySummary(
        total_events=17,
        total_build_requests=5,
        total_partitions=3,
        total_job_runs=2,
        active_builds=3,  # br-2 RECEIVED, br-3 RECEIVED, br-4 UNKNOWN
        available_partitions=1,
        invalidated_partitions=1,
        build_requests_by_status=build_request_counts(
            BUILD_REQUEST_UNKNOWN=1, BUILD_REQUEST_RECEIVED=2, BUILD_REQUEST_COMPLETED=1, BUILD_REQUEST_CANCELLED=1
        ),
        partitions_by_status=partition_counts(PARTITION_UNKNOWN=1, PARTITION_BUILDING=1, PARTITION_AVAILABLE=1),
        job_runs_by_status=job_run_counts(JOB_RUNNING=1, JOB_COMPLETED=1),
    )


@case
def an_empty_log_answers_with_empty_results(log: BuildEventLog) -> None:
    assert log.list_events().events == []
    assert log.list_events().next_cursor is None
    assert log.list_build_requests() == []
    assert log.list_recent_partitions() == []
    assert log.get_active_builds_for_partition("data/a") == []
    assert log.get_build_request_for_available_partition("data/a") is None
    assert log.get_activity_summary() == ActivitySummary(
        total_events=0,
        total_build_requests=0,
        total_partitions=0,
        total_job_runs=0,
        active_builds=0,
        available_partitions=0,
        invalidated_partitions=0,
        build_requests_by_status=build_request_counts(),
        partitions_by_status=partition_counts(),
        job_runs_by_status=job_run_counts(),
    )


# ---------------------------------------------------------------------------------------------
# A scenario with every kind of event, for comparing answers across append orders and backends
# ---------------------------------------------------------------------------------------------


def mixed_scenario() -> list[dict[str, Any]]:
    """One log with every kind of event: a build, a delegation, an invalidation, a task and a
    build cancel, a failure, and timestamp ties."""
    return one_build_events() + [
        build_request_event("m01", 500, "br-7", BR.BUILD_REQUEST_RECEIVED, ["data/x", "data/y"]),
        partition_event("m02", 510, "br-7", "data/x", P.PARTITION_BUILDING, "job-7"),
        partition_event("m03", 510, "br-8", "data/x", P.PARTITION_REQUESTED),
        delegation_event("m04", 520, "br-8", "data/x", "br-7"),
        partition_event("m05", 520, "br-8", "data/x", P.PARTITION_DELEGATED),
        job_event("m06", 530, "br-7", "job-7", J.JOB_RUNNING, ["data/x", "data/y"]),
        partition_event("m07", 540, "br-7", "data/y", P.PARTITION_FAILED, "job-7"),
        task_cancel_event("m08", 545, "br-7", "job-7", "stop"),
        partition_event("m09", 550, "br-7", "data/x", P.PARTITION_AVAILABLE, "job-7"),
        invalidation_event("m10", 560, "br-9", "data/x", "recompute"),
        build_request_event("m11", 570, "br-7", BR.BUILD_REQUEST_FAILED),
        build_cancel_event("m12", 580, "br-8", "superseded"),
        partition_event("m13", 590, "br-9", "data/y", P.PARTITION_AVAILABLE, "job-9"),
        partition_event("m14", 590, "br-9", "data/z", P.PARTITION_BUILDING, "job-9"),
    ]


def answers(
    log: BuildEventLog, partition_refs: list[str], build_request_ids: list[str], job_run_ids: list[str]
) -> dict[str, Any]:
    """Everything the interface can say about these keys, as one comparable value."""
    pages = []
    cursor = None
    while True:
        page = log.list_events(since=cursor, limit=3)
        pages.append(ids(page.events))
        cursor = page.next_cursor
        if not page.has_more:
            break
    return {
        "events": all_events(log),
        "pages": pages,
        "partitions": {
            ref: (
                log.get_partition_events(ref),
                log.get_latest_partition_status(ref),
                log.get_active_builds_for_partition(ref),
                log.get_build_request_for_available_partition(ref),
            )
            for ref in partition_refs
        },
        "build_requests": {ref: log.get_build_request_events(ref) for ref in build_request_ids},
        "job_runs": {ref: log.get_job_run_events(ref) for ref in job_run_ids},
        "build_request_list": log.list_build_requests(limit=1000),
        "partition_list": log.list_recent_partitions(limit=1000),
        "activity": log.get_activity_summary(),
    }


def keys_of(events: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """The partition_refs, build_request_ids and job_run_ids that `events` mention, sorted."""
    refs, requests, runs = set(), set(), set()
    for event in events:
        requests.add(event["build_request_id"])
        payload = event[event["event_type"]]
        if payload.get("partition_ref"):
            refs.add(payload["partition_ref"])
        refs.update(payload.get("requested_partitions") or ())
        refs.update(payload.get("target_partitions") or ())
        if payload.get("job_run_id"):
            runs.add(payload["job_run_id"])
    return sorted(refs), sorted(requests), sorted(runs)
