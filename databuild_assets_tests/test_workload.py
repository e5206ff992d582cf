"""The workload generator: deterministic, valid, realistic event streams and landing files."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.schema import EVENT_TYPES
from databuild_assets.events.validation import event_error, parse_line
from databuild_assets.workload import DEFAULT_START_NS, WorkloadSummary, generate_events, write_landing_files
from databuild_assets.workload.__main__ import main

DAY_NS = 86_400 * 1_000_000_000
STATUS_ENUMS = {"build_request_event": BuildRequestStatus, "partition_event": PartitionStatus, "job_event": JobStatus}


@pytest.fixture(scope="module")
def events() -> list[dict]:
    return list(generate_events(5_000, seed=11))


def read_lines(files: tuple[Path, ...]) -> list[str]:
    return [line for path in files for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


def test_same_seed_writes_byte_identical_files(tmp_path):
    options = dict(n_events=3_000, seed=5, events_per_file=700, bad_line_rate=0.02, duplicate_rate=0.02)
    first = write_landing_files(tmp_path / "a", **options)
    second = write_landing_files(tmp_path / "b", **options)

    assert [path.name for path in first.files] == [path.name for path in second.files]
    assert [path.read_bytes() for path in first.files] == [path.read_bytes() for path in second.files]


def test_different_seeds_give_different_events():
    assert list(generate_events(500, seed=1)) != list(generate_events(500, seed=2))
    assert list(generate_events(500, seed=1)) == list(generate_events(500, seed=1))


@pytest.mark.parametrize("n_events", [0, 1, 17, 5_000])
def test_generates_exactly_n_events_with_unique_uuid4_event_ids(n_events):
    events = list(generate_events(n_events, seed=3))

    assert len(events) == n_events
    ids = [event["event_id"] for event in events]
    assert len(set(ids)) == n_events
    assert all(str(uuid.UUID(event_id)) == event_id and uuid.UUID(event_id).version == 4 for event_id in ids)


def test_every_event_is_valid_and_names_its_status(events):
    for event in events:
        assert event_error(event) is None, event
        payload = event[event["event_type"]]
        if event["event_type"] in STATUS_ENUMS:
            assert payload["status_name"] == STATUS_ENUMS[event["event_type"]](payload["status_code"]).name


def test_a_5000_event_workload_has_all_eight_event_types(events):
    assert set(Counter(event["event_type"] for event in events)) == set(EVENT_TYPES)


def test_a_5000_event_workload_has_every_lifecycle_status(events):
    seen = {
        (event["event_type"], event[event["event_type"]]["status_code"])
        for event in events
        if event["event_type"] in STATUS_ENUMS
    }
    for event_type, enum in STATUS_ENUMS.items():
        expected = {
            (event_type, member.value)
            for member in enum
            if member.name not in ("BUILD_REQUEST_UNKNOWN", "PARTITION_UNKNOWN", "JOB_UNKNOWN")
        }
        assert expected <= seen


def test_timestamps_are_nanoseconds_within_the_requested_days_and_in_time_order():
    start_ns = 1_700_000_000 * 1_000_000_000
    events = list(generate_events(3_000, seed=4, days=2, start_ns=start_ns))

    timestamps = [event["timestamp"] for event in events]
    assert all(isinstance(ts, int) and start_ns - 2 * DAY_NS <= ts <= start_ns for ts in timestamps)
    assert timestamps == sorted(timestamps)
    # Spread over the window, not bunched at one end.
    assert max(timestamps) - min(timestamps) > DAY_NS


def test_build_requests_overlap_in_time(events):
    spans: dict[str, list[int]] = {}
    for event in events:
        span = spans.setdefault(event["build_request_id"], [event["timestamp"], event["timestamp"]])
        span[1] = event["timestamp"]
    ordered = sorted(spans.values())
    overlapping = sum(1 for before, after in itertools.pairwise(ordered) if after[0] < before[1])
    assert overlapping > len(ordered) // 10


def test_events_of_a_build_request_and_of_a_job_run_are_in_causal_order(events):
    build_statuses: dict[str, list[tuple[int, str]]] = defaultdict(list)
    job_statuses: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for event in events:
        if event["event_type"] == "build_request_event":
            build_statuses[event["build_request_id"]].append(
                (event["timestamp"], event["build_request_event"]["status_name"])
            )
        elif event["event_type"] == "job_event":
            job_statuses[event["job_event"]["job_run_id"]].append(
                (event["timestamp"], event["job_event"]["status_name"])
            )

    terminal = {"BUILD_REQUEST_COMPLETED", "BUILD_REQUEST_FAILED", "BUILD_REQUEST_CANCELLED"}
    for statuses in build_statuses.values():
        times = {name: ts for ts, name in statuses}
        assert len(times) == len(statuses)  # one event per status
        assert times["BUILD_REQUEST_RECEIVED"] < times["BUILD_REQUEST_PLANNING"]
        for name in terminal & times.keys():
            assert times["BUILD_REQUEST_PLANNING"] < times["BUILD_REQUEST_EXECUTING"] < times[name]
    for statuses in job_statuses.values():
        times = {name: ts for ts, name in statuses}
        if "JOB_RUNNING" in times:
            assert times["JOB_SCHEDULED"] < times["JOB_RUNNING"]
        for name in {"JOB_COMPLETED", "JOB_FAILED", "JOB_CANCELLED"} & times.keys():
            assert times["JOB_SCHEDULED"] < times[name]
            assert times.get("JOB_RUNNING", 0) < times[name]


def test_delegations_point_to_a_build_request_building_that_partition_at_the_time(events):
    partition_events = defaultdict(list)
    for event in events:
        if event["event_type"] == "partition_event":
            payload = event["partition_event"]
            partition_events[payload["partition_ref"], event["build_request_id"]].append(
                (event["timestamp"], payload["status_name"])
            )
    delegations = [event for event in events if event["event_type"] == "delegation_event"]

    assert delegations
    for event in delegations:
        payload = event["delegation_event"]
        owner = partition_events[payload["partition_ref"], payload["delegated_to_build_request_id"]]
        assert owner, f"the delegate built no {payload['partition_ref']}"
        finished = [ts for ts, status in owner if status in ("PARTITION_AVAILABLE", "PARTITION_FAILED")]
        assert owner[0][0] <= event["timestamp"] and all(event["timestamp"] < ts for ts in finished)


def test_failed_partitions_are_retried_by_later_build_requests(events):
    failed_at: dict[str, tuple[int, str]] = {}
    retried = 0
    for event in events:
        if event["event_type"] != "partition_event":
            continue
        payload = event["partition_event"]
        ref = payload["partition_ref"]
        if payload["status_name"] == "PARTITION_FAILED":
            failed_at[ref] = (event["timestamp"], event["build_request_id"])
        elif payload["status_name"] == "PARTITION_AVAILABLE" and ref in failed_at:
            if failed_at.pop(ref)[1] != event["build_request_id"]:
                retried += 1
    assert retried > 0


def test_partition_refs_and_job_configs_look_like_databuild_ones(events):
    refs = {event["partition_event"]["partition_ref"] for event in events if event["event_type"] == "partition_event"}
    assert any(ref.startswith("data/sales/daily/date=2026-11-") and "/region=" in ref for ref in refs)

    job = next(
        event["job_event"]
        for event in events
        if event["event_type"] == "job_event" and event["job_event"]["status_name"] == "JOB_COMPLETED"
    )
    assert job["job_label"].startswith("//jobs:")
    config = json.loads(job["config"])
    assert [output["str"] for output in config["outputs"]] == job["target_partitions"]
    assert set(config) == {"outputs", "inputs", "args", "env"}
    for dep in config["inputs"]:
        assert set(dep) == {"dep_type_code", "dep_type_name", "partition_ref"} and "str" in dep["partition_ref"]
    [manifest] = json.loads(job["manifests"])
    assert manifest["outputs"] == config["outputs"] and manifest["start_time"] <= manifest["end_time"]
    assert set(manifest) == {"outputs", "inputs", "start_time", "end_time", "task", "metadata"}
    graph = json.loads(
        next(event["job_graph_event"]["job_graph"] for event in events if event["event_type"] == "job_graph_event")
    )
    assert graph["nodes"] and all(node["job"]["label"].startswith("//jobs:") for node in graph["nodes"])


def test_landing_lines_are_compact_json_of_the_generated_events(tmp_path):
    summary = write_landing_files(tmp_path, 4_000, seed=8, events_per_file=1_000, late_arrival_rate=0.0)

    lines = read_lines(summary.files)
    expected = [json.dumps(event, separators=(",", ":")) for event in generate_events(4_000, seed=8)]
    assert lines == expected


def test_bad_lines_are_rejected_good_lines_accepted_and_counts_reconcile(tmp_path):
    summary = write_landing_files(
        tmp_path, 6_000, seed=2, events_per_file=1_500, bad_line_rate=0.05, duplicate_rate=0.03
    )

    lines = read_lines(summary.files)
    parsed = [parse_line(line) for line in lines]
    good = [event for event, _reason in parsed if event is not None]
    reasons = [reason for event, reason in parsed if event is None]
    assert (
        summary.lines_written
        == len(lines)
        == summary.events_written + summary.bad_lines_written + summary.duplicate_lines_written
    )
    assert summary.events_written == 6_000
    assert len(reasons) == summary.bad_lines_written > 200
    assert len(good) == summary.events_written + summary.duplicate_lines_written
    assert len({event["event_id"] for event in good}) == summary.events_written
    # Every kind of bad line is there.
    kinds = {
        "not valid JSON",
        "names no payload",
        "is not a",
        "does not match",
        "missing required field 'event_id'",
        "empty line",
    }
    assert all(any(kind in reason for reason in reasons) for kind in kinds), Counter(reasons).most_common(20)


def test_duplicates_are_byte_identical_redeliveries_written_later(tmp_path):
    summary = write_landing_files(tmp_path, 5_000, seed=6, events_per_file=1_000, duplicate_rate=0.05)

    first_position: dict[str, int] = {}
    redelivered_to_later_file = 0
    for file_number, path in enumerate(summary.files):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line in first_position:
                redelivered_to_later_file += first_position[line] < file_number
            else:
                first_position[line] = file_number
    assert len(first_position) == 5_000
    assert summary.duplicate_lines_written == summary.lines_written - 5_000 > 150
    assert redelivered_to_later_file > 0


def test_some_events_arrive_late_in_a_later_file(tmp_path):
    summary = write_landing_files(tmp_path, 5_000, seed=9, events_per_file=1_000, late_arrival_rate=0.01)

    newest_so_far = 0
    late = 0
    for path in summary.files:
        timestamps = [json.loads(line)["timestamp"] for line in path.read_text(encoding="utf-8").splitlines()]
        late += sum(1 for ts in timestamps if ts < newest_so_far)
        newest_so_far = max([newest_so_far, *timestamps])
    assert summary.late_arrivals > 0 and late > 0


def test_files_are_numbered_in_write_order_with_no_temp_files_left(tmp_path):
    summary = write_landing_files(tmp_path, 2_500, seed=1, events_per_file=1_000, bad_line_rate=0.01)

    assert [path.name for path in summary.files] == ["events-00000.jsonl", "events-00001.jsonl", "events-00002.jsonl"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [path.name for path in summary.files]
    for path in summary.files:
        assert path.read_bytes().endswith(b"\n")


def test_refuses_a_directory_that_already_holds_landing_files(tmp_path):
    write_landing_files(tmp_path, 10)

    with pytest.raises(FileExistsError, match="already holds landing files"):
        write_landing_files(tmp_path, 10)


def test_no_events_write_no_files(tmp_path):
    assert write_landing_files(tmp_path, 0) == WorkloadSummary((), 0, 0, 0, 0, 0)


@pytest.mark.parametrize("arguments", [dict(n_events=-1), dict(n_events=10, days=0)])
def test_rejects_impossible_workloads(arguments):
    with pytest.raises(ValueError):
        generate_events(**arguments)


def test_generation_streams_instead_of_building_the_whole_list():
    # Ten million events: the first thousand come at once, so nothing is built ahead.
    first = list(itertools.islice(generate_events(10_000_000, seed=1), 1_000))

    assert len(first) == 1_000
    assert all(DEFAULT_START_NS - 3 * DAY_NS <= event["timestamp"] <= DEFAULT_START_NS for event in first)


def test_command_line_writes_files_and_prints_a_summary(tmp_path, capsys):
    main(
        [
            "--out",
            str(tmp_path),
            "--events",
            "1200",
            "--seed",
            "3",
            "--events-per-file",
            "500",
            "--bad-line-rate",
            "0.01",
            "--duplicate-rate",
            "0.01",
        ]
    )

    output = capsys.readouterr().out
    assert output.startswith("wrote 1,200 events") and output.count("\n") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "events-00000.jsonl",
        "events-00001.jsonl",
        "events-00002.jsonl",
    ]
