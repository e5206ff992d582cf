"""The service load of `bench.soak`, one process per role, as a DataBuild service would run it:

    python -m bench.soak_load append URI SEED RATE SECONDS OUT   # 5-event appends, RATE a second on average
    python -m bench.soak_load read URI RATE SECONDS OUT          # a partition's status and a build's events

Each writes one JSON line per call to OUT: {"at": unix seconds, "s": the call's seconds, ...}; an
appender adds the event ids and build request ids it sent (the soak's oracle) and the milliseconds
each step of the append took (`phases`: lock waits, catch-up, commit; bench/append_phases.py). A call that fails
is recorded with its error and the process goes on, as a service would retry its next request.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Iterator
from itertools import islice

from bench import append_phases
from databuild_assets.log import open_event_log
from databuild_assets.workload import generate_events

BATCH = 5


def soak_stream(seed: int, n_events: int) -> Iterator[dict]:
    """The events one appender (or the landing files) sends: `n_events` spread over a day of log
    time, so that the build requests it starts also finish within the soak, as a service's do
    (a working day, compressed), and a hot window of log time bounds the serving index. The
    soak's oracle makes it again."""
    return generate_events(n_events, seed=seed, days=1)


def stream_size(rate: float, seconds: float) -> int:
    """The events an appender at `rate` batches a second on average sends in `seconds`, at most
    (but once in millions of runs: random arrivals, `_paced`, five standard deviations over)."""
    calls = rate * seconds
    return (math.ceil(calls + 5 * math.sqrt(calls)) + 1) * BATCH


def _paced(rate: float, seconds: float, seed: int):
    """Yield at `rate` per second on average for `seconds`, as a service's requests arrive: at
    random (exponential gaps, seeded), on a schedule that does not wait for the calls (a slow call
    is caught up). Not at fixed intervals: appenders started together would then call in step,
    and contend for the commit lock at every call or never, by how their start times fell."""
    rng = random.Random(seed)
    started = time.monotonic()
    due = started
    while (now := time.monotonic()) - started < seconds:
        if due > now:
            time.sleep(due - now)
        yield
        due += rng.expovariate(rate)


def append(uri: str, seed: int, rate: float, seconds: float, out: str) -> None:
    stream = soak_stream(seed, stream_size(rate, seconds))
    append_phases.trace()
    with open_event_log(uri, writer=f"soak-{seed}") as log, open(out, "a", encoding="utf-8") as record:
        for _ in _paced(rate, seconds, seed):
            events = list(islice(stream, BATCH))
            if not events:
                break
            started = time.perf_counter()
            line = {"at": time.time()}
            try:
                result = log.append_events(events)
                line.update(accepted=result.accepted, duplicates=result.duplicates)
            except Exception as error:  # recorded and counted by the soak, then the next call
                line["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            line["s"] = time.perf_counter() - started
            line["phases"] = append_phases.take()
            line["ids"] = [event["event_id"] for event in events]
            line["requests"] = sorted({event["build_request_id"] for event in events})
            record.write(json.dumps(line) + "\n")
            record.flush()


def read(uri: str, rate: float, seconds: float, out: str) -> None:
    rng = random.Random(0)
    with open_event_log(uri, writer="soak-reader") as log, open(out, "a", encoding="utf-8") as record:
        for _ in _paced(rate, seconds, seed=0):
            started = time.perf_counter()
            line = {"at": time.time()}
            try:
                recent = log.list_recent_partitions(limit=20)
                if recent:
                    partition = rng.choice(recent)
                    log.get_latest_partition_status(partition.partition_ref)
                    log.get_build_request_events(partition.last_build_request_id)
            except Exception as error:
                line["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            line["s"] = time.perf_counter() - started
            record.write(json.dumps(line) + "\n")
            record.flush()


def main(argv: list[str]) -> None:
    role, uri, *rest = argv
    if role == "append":
        seed, rate, seconds, out = rest
        append(uri, int(seed), float(rate), float(seconds), out)
    elif role == "read":
        rate, seconds, out = rest
        read(uri, float(rate), float(seconds), out)
    else:
        raise SystemExit(f"unknown role {role!r}: append or read")


if __name__ == "__main__":
    main(sys.argv[1:])
