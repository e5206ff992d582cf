"""Erasure of cold events (docs/decisions/0051): a tombstone brings the cold build requests it
matches back hot and their segment's still-cold rows are pinned in their place, so that every
answer stays the reference's over what is still visible, and an erased value leaves every file
of serving_index/ once the pipeline refreshes."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from databuild_assets.events.enums import TERMINAL_BUILD_REQUEST_STATUSES, PartitionStatus
from databuild_assets.events.erasure_rule import matches
from databuild_assets.log.serving import evict
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.runtime.lake import Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.serving_support import erase_each_key_in_turn, files_holding, reference_answers


def _cold(lake: Lake) -> dict[str, int]:
    with DeltaRsEventLog(lake) as log:
        return log._store().cold_facts()


def _only_matching_events_name(events: list[dict[str, Any]], key: str, value: str) -> bool:
    return all(matches(e, {key: {value}}) for e in events if value in json.dumps(e, default=str))


def _a_pin_with_older_events_in_its_segment(lake: Lake, events: list[dict[str, Any]]) -> str:
    """A cold build request whose partition event a partition pins (its row kept in `events`)
    while another cold build request of the same segment holds an older event of that partition."""
    with DeltaRsEventLog(lake) as log:
        path = log._store().path
    holders: dict[str, set[str]] = {}
    for e in events:
        if e["event_type"] == "partition_event":
            holders.setdefault(e["partition_event"]["partition_ref"], set()).add(e["build_request_id"])
    connection = sqlite3.connect(path)
    try:
        segment_of = dict(connection.execute("SELECT build_request_id, segment FROM cold_build_requests"))
        pins = connection.execute(
            "SELECT e.build_request_id, e.partition_ref FROM events AS e JOIN cold_build_requests AS c"
            " ON c.build_request_id = e.build_request_id WHERE e.event_type = 'partition_event'"
        ).fetchall()
    finally:
        connection.close()
    return next(
        pinning
        for pinning, ref in pins
        if any(other != pinning and segment_of.get(other) == segment_of[pinning] for other in holders[ref])
    )


def test_erasing_the_build_request_a_partition_pins_keeps_the_partitions_older_cold_events(lake: Lake) -> None:
    events = list(generate_events(3000, seed=3))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    pinning = _a_pin_with_older_events_in_its_segment(lake, events)
    # Each check reads through a new reader, then again after the pipeline's refresh.
    erase_each_key_in_turn(
        lake, events, {"build_request_id": [pinning]}, after_each=lambda _: refresh_serving_index(lake, hot_window_s=0)
    )


def test_erasing_a_pinning_build_request_a_late_event_brought_back_keeps_the_partitions_older_cold_events(
    lake: Lake,
) -> None:
    events = list(generate_events(3000, seed=3))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    pinning = _a_pin_with_older_events_in_its_segment(lake, events)
    last = max(e["timestamp"] for e in events if e["build_request_id"] == pinning)
    late = bel_cases.job_graph_event("late-graph", last + 1, pinning, "a late graph")
    with DeltaRsEventLog(lake) as service:  # a service's append: the build request comes back hot,
        service.append_events([late])  # and its segment stays stale on readers, which never evict
    erase_each_key_in_turn(lake, [*events, late], {"build_request_id": [pinning]})


def _cold_events_in_turn(lake: Lake, events: list[dict[str, Any]], refreshes: int, monkeypatch) -> None:
    """`events` appended in `refreshes` slices by time, the pipeline's refresh after each (window
    0): each finished build request goes cold in the segment of its slice (none merged)."""
    monkeypatch.setattr(evict, "MERGE_FANIN", 1000)
    events = sorted(events, key=lambda e: (e["timestamp"], e["event_id"]))
    size = -(-len(events) // refreshes)
    for start in range(0, len(events), size):
        with DeltaRsEventLog(lake) as log:
            log.append_events(events[start : start + size])
        refresh_serving_index(lake, hot_window_s=0)


def _pins_and_segments(lake: Lake) -> tuple[dict[str, tuple[str, str, int]], dict[str, int]]:
    """The pinned rows (event_id: partition_ref, build request, its segment) and each cold build
    request's segment."""
    with DeltaRsEventLog(lake) as log:
        path = log._store().path
    connection = sqlite3.connect(path)
    try:
        segment_of = dict(connection.execute("SELECT build_request_id, segment FROM cold_build_requests"))
        pins = {
            event_id: (ref, request, segment_of[request])
            for event_id, ref, request in connection.execute(
                "SELECT event_id, partition_ref, build_request_id FROM events WHERE partition_ref IS NOT NULL"
            )
            if request in segment_of
        }
    finally:
        connection.close()
    return pins, segment_of


def _latest_of_each_kind(events: list[dict[str, Any]]) -> set[str]:
    """The event ids partition_state's refresh picks per partition among `events`: the latest, the
    latest partition event, with a job run, available, the latest delegation and invalidation."""
    kinds = {
        "partition_event": lambda p: [
            "status",
            *(["job run"] * (p.get("job_run_id") is not None)),
            *(["available"] * (p["status_code"] == PartitionStatus.PARTITION_AVAILABLE)),
        ],
        "delegation_event": lambda p: ["delegation"],
        "partition_invalidation_event": lambda p: ["invalidation"],
    }
    latest: dict[tuple[str, str], tuple[int, str]] = {}
    for e in events:
        if e["event_type"] in kinds:
            payload = e[e["event_type"]]
            for kind in ["latest", *kinds[e["event_type"]](payload)]:
                key = (payload["partition_ref"], kind)
                latest[key] = max(latest.get(key, (-1, "")), (e["timestamp"], e["event_id"]))
    return {event_id for _, event_id in latest.values()}


def test_a_partition_pins_the_latest_of_each_kind_once_over_every_segment(lake: Lake, monkeypatch) -> None:
    events = list(generate_events(3000, seed=3))
    _cold_events_in_turn(lake, events, refreshes=4, monkeypatch=monkeypatch)
    pins, segment_of = _pins_and_segments(lake)
    assert len(set(segment_of.values())) >= 3
    assert set(pins) == _latest_of_each_kind([e for e in events if e["build_request_id"] in segment_of])
    with DeltaRsEventLog(lake) as log:
        assert bel_cases.answers(log, *bel_cases.keys_of(events)) == reference_answers(events)


def test_erasing_a_partitions_pin_finds_its_older_cold_events_in_another_segment(lake: Lake, monkeypatch) -> None:
    events = list(generate_events(3000, seed=3))
    _cold_events_in_turn(lake, events, refreshes=4, monkeypatch=monkeypatch)
    pins, segment_of = _pins_and_segments(lake)
    carried: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e["event_type"] == "partition_event" and e["build_request_id"] in segment_of:
            carried.setdefault(e["partition_event"]["partition_ref"], []).append(e)

    def next_latest_beyond_the_first_segment(ref: str, request: str) -> bool:
        """The partition's cold events outside `request` are in two segments or more, none in
        `request`'s, and the latest of them is not in the first of those segments."""
        others = [e for e in carried[ref] if e["build_request_id"] != request]
        segments = {segment_of[e["build_request_id"]] for e in others}
        if len(segments) < 2 or segment_of[request] in segments:
            return False
        latest = max(others, key=lambda e: (e["timestamp"], e["event_id"]))
        return segment_of[latest["build_request_id"]] != min(segments)

    pinning = next(request for ref, request, _ in pins.values() if next_latest_beyond_the_first_segment(ref, request))

    def pins_are_the_latest_then_refresh(_: list[str]) -> None:
        # The readers' catch-up thawed it: the pins it held were replaced from the other segments.
        pins, cold = _pins_and_segments(lake)
        assert pinning not in cold
        assert set(pins) == _latest_of_each_kind([e for e in events if e["build_request_id"] in cold])
        refresh_serving_index(lake, hot_window_s=0)

    erase_each_key_in_turn(lake, events, {"build_request_id": [pinning]}, after_each=pins_are_the_latest_then_refresh)


def test_a_delegation_and_an_invalidation_pinned_again_from_an_older_segment_keep_their_payloads(lake: Lake) -> None:
    # The refresh SQL reads a delegation's target and an invalidation's reason: a re-pin from
    # another segment, which reads rows without payloads, must bring those two back whole.
    ref, BR, P = "data/x", bel_cases.BR, bel_cases.P

    def build(request: str, at: int, target: str, reason: str) -> list[dict[str, Any]]:
        return [
            bel_cases.build_request_event(f"{request}-1", at, request, BR.BUILD_REQUEST_RECEIVED, [ref]),
            bel_cases.partition_event(f"{request}-2", at + 1, request, ref, P.PARTITION_AVAILABLE),
            bel_cases.delegation_event(f"{request}-3", at + 2, request, ref, target),
            bel_cases.invalidation_event(f"{request}-4", at + 3, request, ref, reason),
            bel_cases.build_request_event(f"{request}-5", at + 4, request, BR.BUILD_REQUEST_COMPLETED),
        ]

    older, newer = build("br-old", 1_000, "br-old-target", "old reason"), build("br-new", 2_000, "br-new-target", "new")
    for events in (older, newer):  # a segment each
        with DeltaRsEventLog(lake) as log:
            log.append_events(events)
        refresh_serving_index(lake, hot_window_s=0)
    pins, segment_of = _pins_and_segments(lake)
    assert {request for _, request, _ in pins.values()} == {"br-new"} and len(set(segment_of.values())) == 2
    hidden = erase_each_key_in_turn(lake, older + newer, {"build_request_id": ["br-new"]})
    assert hidden == newer
    with DeltaRsEventLog(lake) as log:
        (summary,) = log.list_recent_partitions()
    assert (summary.delegated_to_build_request_id, summary.invalidation_reason) == ("br-old-target", "old reason")


# Through the Dagster jobs; `make test` proves the serving index's bytes clean after compaction in
# test_serving_index.py (an erased value leaves the index's bytes). Extended tier.
@pytest.mark.extended
def test_a_tombstone_of_each_key_reaches_cold_build_requests_and_leaves_no_byte_in_serving_files(
    lake: Lake,
) -> None:
    events = list(generate_events(3000, seed=5))
    # Values no event names outside the rule's fields (a partition event's message may say
    # "Delegated to build request <id>": the rule keeps that event visible, as Spark does).
    terminal = {int(code) for code in TERMINAL_BUILD_REQUEST_STATUSES}
    requests = [
        e["build_request_id"]
        for e in events
        if e["event_type"] == "build_request_event" and e["build_request_event"]["status_code"] in terminal
    ]
    runs = [e["job_event"]["job_run_id"] for e in events if e["event_type"] == "job_event"]
    refs = [e["partition_event"]["partition_ref"] for e in events if e["event_type"] == "partition_event"]
    values: dict[str, list[str]] = {}
    for key, candidates in (("build_request_id", requests), ("job_run_id", runs), ("partition_ref", refs)):
        values[key] = [  # one that hides events no earlier value hid
            next(
                value
                for value in candidates
                if _only_matching_events_name(events, key, value)
                and not any(matches(e, {key: {value}}) and matches(e, values) for e in events)
            )
        ]
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)
    assert _cold(lake)["cold_build_requests"] > 50
    assert "segment-1.parquet" in files_holding(lake, values["build_request_id"][0])  # cold

    def refreshed_without_a_byte_of(erased: list[str]) -> None:
        refresh_serving_index(lake, hot_window_s=0)
        assert [(value, files_holding(lake, value)) for value in erased] == [(value, []) for value in erased]

    erase_each_key_in_turn(lake, events, values, after_each=refreshed_without_a_byte_of)
