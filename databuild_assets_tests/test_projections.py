"""The projections as Spark functions (databuild_assets/projections): hand-written event stories
with their expected rows written out, parity with the SQLite reference's projections on generated
workloads, and the invariant incremental refreshes rely on (rebuilding the touched keys from their
events gives the rows of a full rebuild, and untouched keys do not change).

Timestamps in the hand-written stories are small integers so the order of events is visible.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.schema import EVENT_SCHEMA, normalize_event
from databuild_assets.log.sqlite.backend import SqliteEventLog, load_events
from databuild_assets.projections import PROJECTIONS, Projection
from databuild_assets.projections.projection import STATE
from databuild_assets.runtime.lake import RAW_EVENT_LOG
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.bel_cases import (
    BR,
    J,
    P,
    _event,
    build_cancel_event,
    build_request_event,
    delegation_event,
    invalidation_event,
    job_event,
    job_graph_event,
    job_run_counts,
    partition_counts,
    partition_event,
    task_cancel_event,
)

PARTITION_STATE = PROJECTIONS["partition_state"]
JOB_RUNS = PROJECTIONS["job_runs"]
BUILD_REQUESTS = PROJECTIONS["build_requests"]
LABEL = "//jobs:build"  # the job_label bel_cases' job_event sets along with target_partitions

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def events_frame(spark: SparkSession, events: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([normalize_event(event) for event in events], EVENT_SCHEMA)


def raw_log_frame(spark: SparkSession, events: list[dict[str, Any]]) -> DataFrame:
    """The events as raw_event_log rows: EVENT_SCHEMA plus event_date, source_file, source_line
    and ingested_at, which the projections must ignore."""
    ingested_at = datetime(2026, 11, 18, tzinfo=UTC)
    rows = []
    for line, event in enumerate(events, start=1):
        row = normalize_event(event)
        row["event_date"] = datetime.fromtimestamp(event["timestamp"] // 10**9, UTC).date()
        row["source_file"] = "landing/workload.jsonl"
        row["source_line"] = line
        row["ingested_at"] = ingested_at
        rows.append(row)
    return spark.createDataFrame(rows, RAW_EVENT_LOG.schema)


def table(projection: Projection, events: DataFrame, columns: tuple[str, ...] | None = None) -> list[tuple]:
    """The rows `projection.build` makes of `events` (only `columns` if given), sorted by key."""
    built = projection.build(events)
    if columns is not None:
        built = built.select(projection.key, *columns)
    return [tuple(row) for row in sorted(built.collect(), key=lambda row: row[projection.key])]


def rows_by_key(projection: Projection, events: DataFrame) -> dict[str, dict[str, Any]]:
    return {row[projection.key]: row.asDict(recursive=True) for row in projection.build(events).collect()}


def assert_same_rows(actual: dict[str, dict], expected: dict[str, dict], what: str) -> None:
    """Equal row for row and field for field; on failure, say which keys and fields differ."""
    missing, extra = sorted(expected.keys() - actual.keys()), sorted(actual.keys() - expected.keys())
    differing = [
        (key, field, actual[key].get(field), value)
        for key in sorted(expected.keys() & actual.keys())
        for field, value in expected[key].items()
        if actual[key].get(field) != value
    ]
    assert not (missing or extra or differing), (
        f"{what}: {len(missing)} keys missing {missing[:5]}, {len(extra)} extra {extra[:5]}, "
        f"{len(differing)} fields differ (key, field, actual, expected): {differing[:5]}"
    )


# ---------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------


def test_projections_are_keyed_as_the_sqlite_tables_and_build_columns_in_schema_order(spark: SparkSession) -> None:
    assert {name: projection.key for name, projection in PROJECTIONS.items()} == {
        "partition_state": "partition_ref",
        "job_runs": "job_run_id",
        "build_requests": "build_request_id",
    }
    events = events_frame(spark, bel_cases.mixed_scenario())
    for projection in PROJECTIONS.values():
        # Nullability aside: Spark reports aggregates as nullable; `schema` says which never are.
        built = [(field.name, field.dataType) for field in projection.build(events).schema]
        assert built == [(field.name, field.dataType) for field in projection.schema], projection.name
        assert all(field.metadata.get("comment") for field in projection.schema), projection.name
        assert projection.keys_of(events).columns == [projection.key]
        assert projection.aggregate(events).columns == [projection.key, STATE]


# ---------------------------------------------------------------------------------------------
# Hand-written stories, with their rows written out
# ---------------------------------------------------------------------------------------------


def test_a_scenario_with_delegation_invalidation_cancels_failure_and_ties(spark: SparkSession) -> None:
    # bel_cases.mixed_scenario: br-1 builds data/a; br-7 builds data/x and data/y with job-7, whose
    # task is cancelled; br-8 delegates data/x to br-7 and is cancelled; br-9 invalidates data/x
    # and reports data/y and data/z. m02/m03, m04/m05 and m13/m14 share timestamps.
    events = events_frame(spark, bel_cases.mixed_scenario())

    # partition_ref, status_code, status_name, is_available, invalidated, updated_at, last_event_id,
    # last_build_request_id, last_job_run_id, last_available_at, last_available_build_request_id,
    # delegated_to_build_request_id, invalidation_reason, event_count,
    # status_timestamp, status_event_id, status_build_request_id, status_job_run_id
    assert table(PARTITION_STATE, events) == [
        ("data/a", 4, "PARTITION_AVAILABLE", True, False, 180, "e09", "br-1", "job-1", 180, "br-1", None, None, 4,
         180, "e09", "br-1", "job-1"),
        # AVAILABLE at 550, then invalidated at 560; delegated by br-8 to br-7.
        ("data/x", 4, "PARTITION_AVAILABLE", False, True, 560, "m10", "br-9", "job-7", 550, "br-7", "br-7", "recompute",
         6, 550, "m09", "br-7", "job-7"),
        ("data/y", 4, "PARTITION_AVAILABLE", True, False, 590, "m13", "br-9", "job-9", 590, "br-9", None, None, 2,
         590, "m13", "br-9", "job-9"),
        ("data/z", 3, "PARTITION_BUILDING", False, False, 590, "m14", "br-9", "job-9", None, None, None, None, 1,
         590, "m14", "br-9", "job-9"),
    ]  # fmt: skip

    # job_run_id, build_request_id, status_code, status_name, cancel_reason, job_label,
    # target_partitions, config, manifests, scheduled_at, started_at, ended_at, duration_ns,
    # updated_at, event_count. job-9 has only partition events: no run.
    assert table(JOB_RUNS, events) == [
        ("job-1", "br-1", 3, "JOB_COMPLETED", None, LABEL, ["data/a"], None, None, 140, 160, 190, 30, 190, 3),
        ("job-7", "br-7", 5, "JOB_CANCELLED", "stop", LABEL, ["data/x", "data/y"], None, None, None, 530, 545, 15, 545,
         2),
    ]  # fmt: skip

    # build_request_id, status_code, status_name, cancel_reason, requested_partitions, received_at,
    # started_at, ended_at, duration_ns, updated_at, event_count, partition_counts, job_run_counts
    assert table(BUILD_REQUESTS, events) == [
        ("br-1", 4, "BUILD_REQUEST_COMPLETED", None, ["data/a"], 100, 130, 200, 100, 200, 10,
         partition_counts(PARTITION_AVAILABLE=1), job_run_counts(JOB_COMPLETED=1)),
        ("br-2", 1, "BUILD_REQUEST_RECEIVED", None, ["data/b"], 110, None, None, None, 110, 1,
         partition_counts(), job_run_counts()),
        # data/x by its latest br-7 event (AVAILABLE), data/y FAILED; job-7 cancelled.
        ("br-7", 5, "BUILD_REQUEST_FAILED", None, ["data/x", "data/y"], 500, None, 570, 70, 570, 7,
         partition_counts(PARTITION_AVAILABLE=1, PARTITION_FAILED=1), job_run_counts(JOB_CANCELLED=1)),
        # No build_request_event: the build cancel decides. m05 (DELEGATED) is later than m03 by event_id.
        ("br-8", 6, "BUILD_REQUEST_CANCELLED", "superseded", [], 510, None, 580, 70, 580, 4,
         partition_counts(PARTITION_DELEGATED=1), job_run_counts()),
        ("br-9", 0, "BUILD_REQUEST_UNKNOWN", None, [], 560, None, None, None, 590, 3,
         partition_counts(PARTITION_AVAILABLE=1, PARTITION_BUILDING=1), job_run_counts()),
    ]  # fmt: skip


def test_an_invalidation_after_availability_voids_it_until_the_partition_is_rebuilt(spark: SparkSession) -> None:
    available_then_invalidated = [
        partition_event("e1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
        invalidation_event("e2", 200, "br-2", "data/a", "upstream data was wrong"),
        # Refs seen only in an invalidation or a delegation have status UNKNOWN.
        invalidation_event("e5", 250, "br-4", "data/d", "never built, invalidated anyway"),
        delegation_event("e6", 260, "br-5", "data/e", "br-3"),
    ]
    rebuilt = [
        partition_event("e3", 300, "br-3", "data/a", P.PARTITION_BUILDING, "job-3"),
        partition_event("e4", 400, "br-3", "data/a", P.PARTITION_AVAILABLE, "job-3"),
    ]

    assert table(PARTITION_STATE, events_frame(spark, available_then_invalidated)) == [
        ("data/a", 4, "PARTITION_AVAILABLE", False, True, 200, "e2", "br-2", "job-1", 100, "br-1", None,
         "upstream data was wrong", 2, 100, "e1", "br-1", "job-1"),
        ("data/d", 0, "PARTITION_UNKNOWN", False, True, 250, "e5", "br-4", None, None, None, None,
         "never built, invalidated anyway", 1, None, None, None, None),
        ("data/e", 0, "PARTITION_UNKNOWN", False, False, 260, "e6", "br-5", None, None, None, "br-3", None, 1,
         None, None, None, None),
    ]  # fmt: skip
    assert table(PARTITION_STATE, events_frame(spark, available_then_invalidated + rebuilt))[0] == (
        "data/a", 4, "PARTITION_AVAILABLE", True, False, 400, "e4", "br-3", "job-3", 400, "br-3", None, None, 4,
        400, "e4", "br-3", "job-3",
    )  # fmt: skip


def test_cancelling_a_running_task_cancels_its_run_and_a_build_cancel_ends_the_request(spark: SparkSession) -> None:
    events = events_frame(
        spark,
        [
            build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
            build_request_event("e2", 110, "br-1", BR.BUILD_REQUEST_EXECUTING),
            job_event("e3", 120, "br-1", "job-1", J.JOB_RUNNING, ["data/a"]),
            partition_event("e4", 130, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
            task_cancel_event("e5", 140, "br-1", "job-1", "operator stopped the task"),
            build_cancel_event("e6", 150, "br-1", "operator cancelled the build"),
        ],
    )

    # The task cancel ends the run: ended_at 140, 20 ns after it started running.
    assert table(JOB_RUNS, events) == [
        ("job-1", "br-1", 5, "JOB_CANCELLED", "operator stopped the task", LABEL, ["data/a"], None, None,
         None, 120, 140, 20, 140, 2),
    ]  # fmt: skip
    assert table(BUILD_REQUESTS, events) == [
        ("br-1", 6, "BUILD_REQUEST_CANCELLED", "operator cancelled the build", ["data/a"], 100, 110, 150, 50, 150, 6,
         partition_counts(PARTITION_BUILDING=1), job_run_counts(JOB_CANCELLED=1)),
    ]  # fmt: skip


def test_a_job_event_later_than_the_task_cancel_decides_and_a_run_seen_only_in_a_cancel_is_cancelled(
    spark: SparkSession,
) -> None:
    config = '{"outputs":[{"str":"data/a"}],"inputs":[],"args":[],"env":{}}'
    completed = job_event("e3", 120, "br-1", "job-1", J.JOB_COMPLETED)
    completed["job_event"].update(config=config, manifests="[]")
    events = events_frame(
        spark,
        [
            job_event("e0", 90, "br-1", "job-1", J.JOB_SCHEDULED, ["data/a"]),
            job_event("e1", 100, "br-1", "job-1", J.JOB_RUNNING),
            task_cancel_event("e2", 110, "br-1", "job-1", "operator"),
            completed,
            task_cancel_event("e4", 130, "br-1", "job-2", "cancelled before it was scheduled"),
        ],
    )

    # job-1: label and target_partitions from e0 (the latest that has them), config and manifests
    # from e3. The cancel at 110 was its first terminal event, so it "ended" then.
    assert table(JOB_RUNS, events) == [
        ("job-1", "br-1", 3, "JOB_COMPLETED", None, LABEL, ["data/a"], config, "[]", 90, 100, 110, 10, 120, 4),
        ("job-2", "br-1", 5, "JOB_CANCELLED", "cancelled before it was scheduled", None, None, None, None,
         None, None, 130, None, 130, 1),
    ]  # fmt: skip


def test_a_failed_partition_retried_by_a_new_build_request_ends_available(spark: SparkSession) -> None:
    failed = [
        build_request_event("e01", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        job_event("e02", 110, "br-1", "job-1", J.JOB_RUNNING, ["data/a"]),
        partition_event("e03", 120, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
        job_event("e04", 130, "br-1", "job-1", J.JOB_FAILED, ["data/a"]),
        partition_event("e05", 140, "br-1", "data/a", P.PARTITION_FAILED, "job-1"),
        build_request_event("e06", 150, "br-1", BR.BUILD_REQUEST_FAILED),
    ]
    retried = [
        build_request_event("e07", 200, "br-2", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        partition_event("e08", 210, "br-2", "data/a", P.PARTITION_REQUESTED),
        job_event("e09", 220, "br-2", "job-2", J.JOB_RUNNING, ["data/a"]),
        partition_event("e10", 230, "br-2", "data/a", P.PARTITION_BUILDING, "job-2"),
        partition_event("e11", 240, "br-2", "data/a", P.PARTITION_AVAILABLE, "job-2"),
        job_event("e12", 250, "br-2", "job-2", J.JOB_COMPLETED, ["data/a"]),
        build_request_event("e13", 260, "br-2", BR.BUILD_REQUEST_COMPLETED),
    ]

    assert table(PARTITION_STATE, events_frame(spark, failed)) == [
        ("data/a", 5, "PARTITION_FAILED", False, False, 140, "e05", "br-1", "job-1", None, None, None, None, 2,
         140, "e05", "br-1", "job-1"),
    ]  # fmt: skip
    events = events_frame(spark, failed + retried)
    assert table(PARTITION_STATE, events) == [
        ("data/a", 4, "PARTITION_AVAILABLE", True, False, 240, "e11", "br-2", "job-2", 240, "br-2", None, None, 5,
         240, "e11", "br-2", "job-2"),
    ]  # fmt: skip
    assert table(JOB_RUNS, events) == [
        ("job-1", "br-1", 4, "JOB_FAILED", None, LABEL, ["data/a"], None, None, None, 110, 130, 20, 130, 2),
        ("job-2", "br-2", 3, "JOB_COMPLETED", None, LABEL, ["data/a"], None, None, None, 220, 250, 30, 250, 2),
    ]  # fmt: skip
    assert table(BUILD_REQUESTS, events) == [
        ("br-1", 5, "BUILD_REQUEST_FAILED", None, ["data/a"], 100, None, 150, 50, 150, 6,
         partition_counts(PARTITION_FAILED=1), job_run_counts(JOB_FAILED=1)),
        ("br-2", 4, "BUILD_REQUEST_COMPLETED", None, ["data/a"], 200, None, 260, 60, 260, 7,
         partition_counts(PARTITION_AVAILABLE=1), job_run_counts(JOB_COMPLETED=1)),
    ]  # fmt: skip


def test_events_with_equal_timestamps_are_ordered_by_event_id(spark: SparkSession) -> None:
    events = events_frame(
        spark,
        [
            partition_event("e-2", 100, "br-1", "data/a", P.PARTITION_FAILED, "job-1"),
            partition_event("e-1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
            partition_event("e-9", 100, "br-2", "data/b", P.PARTITION_AVAILABLE, "job-2"),
            invalidation_event("e-8", 100, "br-2", "data/b", "tie: e-8 < e-9, so it is earlier"),
            # Byte order of UTF-8: "Z" < "z" < "é".
            partition_event("z", 100, "br-3", "data/c", P.PARTITION_BUILDING),
            partition_event("é", 100, "br-3", "data/c", P.PARTITION_FAILED),
            partition_event("Z", 100, "br-3", "data/c", P.PARTITION_AVAILABLE),
            job_event("j-b", 200, "br-1", "job-1", J.JOB_RUNNING),
            task_cancel_event("j-a", 200, "br-1", "job-1", "tie: j-a < j-b, so the job event is later"),
            job_event("k-a", 200, "br-2", "job-2", J.JOB_RUNNING),
            task_cancel_event("k-b", 200, "br-2", "job-2", "tie: k-b > k-a"),
            build_request_event("b-1", 300, "br-1", BR.BUILD_REQUEST_COMPLETED),
            build_cancel_event("b-2", 300, "br-1", "tie: b-2 > b-1"),
        ],
    )

    columns = ("status_name", "is_available", "invalidated", "last_event_id", "last_available_build_request_id")
    assert table(PARTITION_STATE, events, columns) == [
        ("data/a", "PARTITION_FAILED", False, False, "e-2", "br-1"),
        ("data/b", "PARTITION_AVAILABLE", True, False, "e-9", "br-2"),
        ("data/c", "PARTITION_FAILED", False, False, "é", "br-3"),
    ]
    assert table(JOB_RUNS, events, ("status_name", "cancel_reason")) == [
        ("job-1", "JOB_RUNNING", None),
        ("job-2", "JOB_CANCELLED", "tie: k-b > k-a"),
    ]
    assert table(BUILD_REQUESTS, events, ("status_name", "cancel_reason", "ended_at")) == [
        ("br-1", "BUILD_REQUEST_CANCELLED", "tie: b-2 > b-1", 300),
        ("br-2", "BUILD_REQUEST_UNKNOWN", None, None),
        ("br-3", "BUILD_REQUEST_UNKNOWN", None, None),
    ]


def test_late_events_folded_into_the_stored_states_take_their_place_by_timestamp(spark: SparkSession) -> None:
    on_time = [
        build_request_event("e10", 10, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        partition_event("e20", 20, "br-1", "data/a", P.PARTITION_REQUESTED),
        partition_event("e40", 40, "br-1", "data/a", P.PARTITION_AVAILABLE, "job-1"),
    ]
    # Arrive later, but happened before the AVAILABLE event (and one before the request).
    late = [
        partition_event("e30", 30, "br-1", "data/a", P.PARTITION_BUILDING, "job-1"),
        invalidation_event("e35", 35, "br-9", "data/a", "stale upstream"),
        job_graph_event("e05", 5, "br-1", "{}"),
    ]
    on_time_events, late_events = events_frame(spark, on_time), events_frame(spark, late)

    def refreshed(projection: Projection) -> list[tuple]:
        folded = projection.rows(projection.fold(projection.aggregate(on_time_events), late_events))
        return [tuple(row) for row in sorted(folded.collect(), key=lambda row: row[projection.key])]

    # The invalidation (35) is earlier than the AVAILABLE event (40): it does not void it.
    assert refreshed(PARTITION_STATE) == [
        ("data/a", 4, "PARTITION_AVAILABLE", True, False, 40, "e40", "br-1", "job-1", 40, "br-1", None, None, 4,
         40, "e40", "br-1", "job-1"),
    ]  # fmt: skip
    # br-1's received_at moves back to its earliest event; br-9 only wrote the invalidation.
    assert refreshed(BUILD_REQUESTS) == [
        ("br-1", 1, "BUILD_REQUEST_RECEIVED", None, ["data/a"], 5, None, None, None, 40, 5,
         partition_counts(PARTITION_AVAILABLE=1), job_run_counts()),
        ("br-9", 0, "BUILD_REQUEST_UNKNOWN", None, [], 35, None, None, None, 35, 1,
         partition_counts(), job_run_counts()),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Parity with the SQLite reference
# ---------------------------------------------------------------------------------------------


def test_a_late_event_that_moves_a_job_run_to_another_request_moves_its_count(spark: SparkSession) -> None:
    # job-x's COMPLETED event, in br-b, arrives first: br-b owns the run. Its earlier RUNNING event,
    # in br-a, arrives late: the run's first event is now br-a's, so br-a owns it (as the SQLite
    # reference says) and br-b, which the late event does not mention, loses it.
    on_time = [job_event("x02", 1010, "br-b", "job-x", J.JOB_COMPLETED, ["data/q"])]
    late = [job_event("x01", 1000, "br-a", "job-x", J.JOB_RUNNING, ["data/q"])]
    on_time_events, late_events = events_frame(spark, on_time), events_frame(spark, late)
    stored = BUILD_REQUESTS.aggregate(on_time_events)
    assert table(BUILD_REQUESTS, on_time_events, ("job_run_counts",)) == [("br-b", job_run_counts(JOB_COMPLETED=1))]

    folded = BUILD_REQUESTS.rows(BUILD_REQUESTS.fold(stored, late_events)).select(BUILD_REQUESTS.key, "job_run_counts")
    assert sorted(tuple(row) for row in folded.collect()) == [
        ("br-a", job_run_counts(JOB_COMPLETED=1)),
        ("br-b", job_run_counts()),
    ]
    assert sorted(tuple(row) for row in folded.collect()) == table(
        BUILD_REQUESTS, events_frame(spark, on_time + late), ("job_run_counts",)
    )


def sqlite_projections(path: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The SQLite reference's projection rows, by table and key, as the backend answers them:
    partition_state and job_runs straight from their tables, build_requests (whose counts are
    computed on read) from `list_build_requests`."""
    connection = sqlite3.connect(path)
    connection.row_factory = sqlite3.Row
    try:
        partition_state = {}
        for row in connection.execute("SELECT * FROM partition_state"):
            fields = dict(row)
            fields.update(is_available=bool(fields["is_available"]), invalidated=bool(fields["invalidated"]))
            partition_state[fields["partition_ref"]] = fields
        job_runs = {row["job_run_id"]: dict(row) for row in connection.execute("SELECT * FROM job_runs")}
    finally:
        connection.close()
    with SqliteEventLog(path) as log:
        summaries = log.list_build_requests(limit=1_000_000)
    build_requests = {summary.build_request_id: dataclasses.asdict(summary) for summary in summaries}
    return {"partition_state": partition_state, "job_runs": job_runs, "build_requests": build_requests}


def as_sqlite_answers(name: str, rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Spark rows in the shape of `sqlite_projections`: status names checked against the enum
    and dropped where SQLite has none, and build_requests as a BuildRequestSummary would hold them."""
    enum = {"partition_state": PartitionStatus, "job_runs": JobStatus, "build_requests": BuildRequestStatus}[name]
    answers = {}
    for key, row in rows.items():
        assert row["status_name"] == enum(row["status_code"]).name, (name, key)
        for field in PROJECTIONS[name].schema:
            assert field.nullable or row[field.name] is not None, f"{name} {key}: {field.name} is null"
        if name == "build_requests":
            row = {**row, "requested_partitions": tuple(row["requested_partitions"])}
        else:
            row = {field: value for field, value in row.items() if field != "status_name"}
        answers[key] = row
    return answers


def built_rows(events: DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Every projection's rows of `events`, by projection and key."""
    return {name: rows_by_key(projection, events) for name, projection in PROJECTIONS.items()}


def assert_parity_with_sqlite(spark_rows: dict, sqlite_rows: dict, what: str) -> None:
    """Every projection row equals the SQLite reference's, field for field (for job_runs, the
    fields SQLite keeps)."""
    for name in PROJECTIONS:
        answers = as_sqlite_answers(name, spark_rows[name])
        expected = sqlite_rows[name]
        sqlite_fields = set(next(iter(expected.values())))
        if name == "job_runs":
            answers = {key: {field: row[field] for field in sqlite_fields} for key, row in answers.items()}
        else:
            assert {field for row in answers.values() for field in row} == sqlite_fields, name
        assert_same_rows(answers, expected, f"{what}: {name}")


def edge_case_events() -> list[dict[str, Any]]:
    """mixed_scenario plus events that stress the rules where they are easiest to get wrong."""
    unnamed_status = _event("n02", 1020, "br-n", "partition_event", {"partition_ref": "data/n", "status_code": 4})
    return bel_cases.mixed_scenario() + [
        # A job run whose events belong to two build requests: the first event's request owns it.
        job_event("x01", 1000, "br-a", "job-x", J.JOB_RUNNING, ["data/q"]),
        job_event("x02", 1010, "br-b", "job-x", J.JOB_COMPLETED, ["data/q"]),
        # status_name omitted; a later partition event without a job_run_id.
        partition_event("n01", 1015, "br-n", "data/n", P.PARTITION_BUILDING, "job-n"),
        unnamed_status,
        # An empty requested_partitions list counts as carrying them; None does not.
        build_request_event("r01", 1100, "br-r", BR.BUILD_REQUEST_RECEIVED, ["data/r"]),
        build_request_event("r02", 1110, "br-r", BR.BUILD_REQUEST_PLANNING, []),
        build_request_event("r03", 1120, "br-r", BR.BUILD_REQUEST_EXECUTING),
        # A plan-only build: ANALYSIS_COMPLETED does not end it.
        build_request_event("d01", 1200, "br-d", BR.BUILD_REQUEST_RECEIVED, ["data/d"]),
        build_request_event("d02", 1210, "br-d", BR.BUILD_REQUEST_ANALYSIS_COMPLETED),
        # Cancelled, then executing again: not cancelled, but ended at the cancel.
        build_request_event("c01", 1300, "br-c", BR.BUILD_REQUEST_RECEIVED, ["data/c"]),
        build_cancel_event("c02", 1310, "br-c", "cancelled"),
        build_request_event("c03", 1320, "br-c", BR.BUILD_REQUEST_EXECUTING),
        # Two delegations and two invalidations: the latest wins; ties broken by byte order.
        delegation_event("g01", 1400, "br-g", "data/g", "br-1"),
        delegation_event("g02", 1410, "br-g", "data/g", "br-2"),
        partition_event("Z", 1420, "br-g", "data/g", P.PARTITION_AVAILABLE),
        invalidation_event("z", 1420, "br-h", "data/g", "first"),
        invalidation_event("é", 1420, "br-h", "data/g", "second"),
        # Seen only in an invalidation (invalidated, status UNKNOWN) and only in a task cancel (cancelled).
        invalidation_event("i01", 1500, "br-i", "data/i", "never built"),
        task_cancel_event("t01", 1510, "br-t", "job-t", "cancelled before it was scheduled"),
    ]


def test_projections_equal_the_sqlite_reference_on_edge_cases(spark: SparkSession, tmp_path) -> None:
    events = edge_case_events()
    load_events(tmp_path / "bel.db", events)

    spark_rows = built_rows(events_frame(spark, events))

    assert_parity_with_sqlite(spark_rows, sqlite_projections(str(tmp_path / "bel.db")), "edge cases")
    assert spark_rows["job_runs"]["job-x"]["build_request_id"] == "br-a"
    assert spark_rows["build_requests"]["br-a"]["job_run_counts"] == job_run_counts(JOB_COMPLETED=1)
    assert spark_rows["build_requests"]["br-b"]["job_run_counts"] == job_run_counts()


@dataclasses.dataclass(frozen=True)
class Workload:
    events: list[dict[str, Any]]
    frame: DataFrame  # the events as raw_event_log rows
    spark_rows: dict[str, dict[str, dict[str, Any]]]
    sqlite_rows: dict[str, dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def workload(spark: SparkSession, tmp_path_factory):
    """workload(seed): ~3,000 generated events, loaded into SQLite and projected by both, once per seed."""
    made: dict[int, Workload] = {}

    def make(seed: int) -> Workload:
        if seed not in made:
            events = list(generate_events(3000, seed=seed))
            path = tmp_path_factory.mktemp(f"workload-{seed}") / "bel.db"
            load_events(path, events)
            frame = raw_log_frame(spark, events)
            made[seed] = Workload(events, frame, built_rows(frame), sqlite_projections(str(path)))
        return made[seed]

    return make


@pytest.mark.parametrize("seed", [1, 2])
def test_projections_equal_the_sqlite_reference_on_workloads(workload, seed: int) -> None:
    generated = workload(seed)
    kinds = {event["event_type"] for event in generated.events}
    assert {"delegation_event", "partition_invalidation_event", "task_cancel_event", "build_cancel_event"} <= kinds

    assert_parity_with_sqlite(generated.spark_rows, generated.sqlite_rows, f"seed {seed}")


# ---------------------------------------------------------------------------------------------
# The incremental invariant
# ---------------------------------------------------------------------------------------------


PARTITION_EVENT_TYPES = ("partition_event", "delegation_event", "partition_invalidation_event")


def touched_keys(name: str, events: list[dict[str, Any]]) -> set[str]:
    """The keys of `name` that `events` touch, by the rule of EVENTS.md (what keys_of must give)."""
    keys = set()
    for event in events:
        event_type, payload = event["event_type"], event[event["event_type"]]
        if name == "build_requests":
            keys.add(event["build_request_id"])
        elif name == "partition_state" and event_type in PARTITION_EVENT_TYPES:
            keys.add(payload["partition_ref"])
        elif name == "job_runs" and event_type in ("job_event", "task_cancel_event"):
            keys.add(payload["job_run_id"])
    return keys


def splits(events: list[dict[str, Any]]) -> dict[str, tuple[list[dict], list[dict]]]:
    """(old, new) splits: a random share (late events everywhere), and the latest quarter plus a
    few late arrivals from before it (what an append usually brings)."""
    rng = random.Random(7)
    chosen = [rng.random() < 0.3 for _ in events]
    in_order = sorted(range(len(events)), key=lambda i: (events[i]["timestamp"], events[i]["event_id"]))
    recent = set(in_order[len(in_order) * 3 // 4 :]) | {i for i in in_order if rng.random() < 0.02}
    return {
        "random 30%": (
            [e for e, c in zip(events, chosen, strict=True) if not c],
            [e for e, c in zip(events, chosen, strict=True) if c],
        ),
        "latest quarter and late arrivals": (
            [e for i, e in enumerate(events) if i not in recent],
            [e for i, e in enumerate(events) if i in recent],
        ),
    }


@pytest.mark.parametrize("split", ["random 30%", "latest quarter and late arrivals"])
def test_folding_new_events_into_the_old_states_gives_the_full_rebuild_and_leaves_other_keys_alone(
    spark: SparkSession, workload, split: str
) -> None:
    generated = workload(1)
    events, full_rows = generated.events, generated.spark_rows
    old, new = splits(events)[split]
    old_events, new_events = raw_log_frame(spark, old), raw_log_frame(spark, new)

    for name, projection in PROJECTIONS.items():
        keys = touched_keys(name, new)
        full = full_rows[name]

        folded = projection.rows(projection.fold(projection.aggregate(old_events), new_events))
        refreshed = {row[projection.key]: row.asDict(recursive=True) for row in folded.collect()}
        assert_same_rows(refreshed, {key: full[key] for key in keys}, f"{split}: {name}, folded keys")

        before = rows_by_key(projection, old_events)
        untouched = {key: row for key, row in before.items() if key not in keys}
        expected_untouched = {key: row for key, row in full.items() if key not in keys}
        assert_same_rows(untouched, expected_untouched, f"{split}: {name}, other keys")
