"""The workload as a stream: the simulation's build requests, each generated whole at its arrival,
their events released in time order once no later arrival can precede them.

    events = list(generate_events(5_000, seed=1))
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import NamedTuple

from databuild_assets.workload.encoding import uuid4
from databuild_assets.workload.job_runs import BuildEvent
from databuild_assets.workload.simulation import Simulation, check_workload

# The workload ends here (2026-11-18T00:00:00Z) unless told otherwise, so that output is reproducible.
DEFAULT_START_NS = 1_794_960_000 * 1_000_000_000


def generate_events(n_events: int, seed: int = 0, days: int = 3, start_ns: int = DEFAULT_START_NS) -> Iterator[dict]:
    """Yield exactly `n_events` valid DataBuild events (dicts shaped like the landing format), in
    time order, the same for the same arguments. Use it to feed a log or a benchmark directly.

    Build requests arrive over the `days` days that end at `start_ns` (Unix epoch ns), overlap in
    time and are generated whole until the count is reached; the last one is cut short. The stream
    is lazy and its memory bounded, so ten million events are fine:
    `sum(1 for _ in generate_events(10_000_000))`.
    """
    check_workload(n_events, days, start_ns)
    return map(event_dict, stream_events(n_events, seed, days, start_ns))


class StreamEvent(NamedTuple):
    """One event as the stream carries it: (timestamp, sequence) orders it; the dict or the JSON
    line is made at the end."""

    timestamp: int
    sequence: int
    event_type: str
    payload: dict
    event_id: str
    build_request_id: str


def stream_events(n_events: int, seed: int, days: int, start_ns: int) -> Iterator[StreamEvent]:
    simulation = Simulation(n_events, seed, days, start_ns)
    rng = simulation.rng
    # Events of build requests still under way: a build request is generated whole at its arrival,
    # and its events are released once no later arrival can precede them.
    pending: list[StreamEvent] = []
    sequence = 0
    generated = 0
    while generated < n_events:
        arrival_ns = simulation.next_arrival(generated)
        while pending and pending[0].timestamp <= arrival_ns:
            yield heapq.heappop(pending)
        build_request_id = uuid4(rng)
        build = simulation.build(build_request_id, arrival_ns)
        build.sort(key=_timestamp)  # stable: events with the same timestamp keep their causal order
        if build[-1].timestamp > simulation.end_ns:
            raise AssertionError(
                f"build request {build_request_id} ends after the window; _MAX_BUILD_SPAN_NS is too small"
            )
        del build[n_events - generated :]
        for timestamp, event_type, payload in build:
            heapq.heappush(pending, StreamEvent(timestamp, sequence, event_type, payload, uuid4(rng), build_request_id))
            sequence += 1
        generated += len(build)
    while pending:
        yield heapq.heappop(pending)


def event_dict(item: StreamEvent) -> dict:
    timestamp, _sequence, event_type, payload, event_id, build_request_id = item
    return {
        "event_id": event_id,
        "timestamp": timestamp,
        "build_request_id": build_request_id,
        "event_type": event_type,
        event_type: payload,
    }


def _timestamp(event: BuildEvent) -> int:
    return event.timestamp
