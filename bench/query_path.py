"""The JVM-free Delta query path against SQLite, side by side in one run (issue 17's benchmark).

    python -m bench.query_path [--events 1000000] [--calls 200] [--lake /path/to/lake]

On one generated log (or the raw log of `--lake`, copied first; its events are also loaded into
SQLite), prints:
- cold start (open to first answer: for Delta, the first open of a copied raw log, which builds
  the serving index; bench.serving_index measures opens of a kept index), resident memory added
  and bytes on disk, per backend;
- the service loop (append the 5 events of a new build, then read the partition's status and
  the build's events; and a status read with nothing new), p50/p95 per step;
- every query method on random keys, p50/p95 and the p95 ratio (target: within 2x of SQLite);
- two other designs on the same lake for the point read of one build request's events:
  delta-rs/DataFusion SQL over the table, and an in-memory DuckDB table with an index.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import deltalake
import duckdb

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log import EventFilter, EventPage, SqliteEventLog, load_events
from databuild_assets.log.interface import encode_cursor
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events

APPEND_BATCH = 50_000


def rss_bytes() -> int:
    """This process's resident memory now (not its peak)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timings(action: Callable[[], Any], calls: int, budget_s: float = 15.0) -> list[float]:
    """Seconds of each of `calls` calls, or of as many as fit in `budget_s` (at least 5)."""
    spent: list[float] = []
    while len(spent) < calls and (len(spent) < 5 or sum(spent) < budget_s):
        started = time.perf_counter()
        action()
        spent.append(time.perf_counter() - started)
    return spent


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f}"


def build_lake(root: Path, events: int) -> None:
    """A lake whose raw log holds `generate_events(events, seed=7)`, written in batches through
    the JVM-free writer (what a service's appends make), for runs without --lake."""
    with DeltaRsEventLog(Lake(str(root)), writer="bench") as log:
        batch: list[dict] = []
        for event in generate_events(events, seed=7):
            batch.append(event)
            if len(batch) == APPEND_BATCH:
                log.append_events(batch)
                batch = []
        if batch:
            log.append_events(batch)


def lake_events(root: Path) -> list[dict[str, Any]]:
    """Every event of the lake's raw log, as dicts of the event schema."""
    table = deltalake.DeltaTable(str(root / "tables" / RAW_EVENT_LOG.name))
    return table.to_pyarrow_table(columns=list(EVENT_COLUMNS)).to_pylist()


def in_range(log: Any, start_ns: int) -> list[dict[str, Any]]:
    return log.get_events_in_range(start_ns, start_ns + 10**9)


def page_at(log: Any, start_ns: int) -> EventPage:
    """The page of 100 from `start_ns` on, as a reader paging from a cursor gets it: the first
    page is the oldest events, cold on a lake the pipeline keeps, whatever the keys drawn."""
    return log.list_events(since=encode_cursor(start_ns - 1, ""), limit=100)


def query_methods(
    rng: random.Random, builds: list[str], refs: list[str], jobs: list[str], timestamps: list[int]
) -> list[tuple[str, Callable[[Any], Any]]]:
    """Every query method of the interface, as (name, call on a log), on keys `rng` draws."""
    return [
        ("get_build_request_events", lambda log: log.get_build_request_events(rng.choice(builds))),
        ("get_partition_events", lambda log: log.get_partition_events(rng.choice(refs))),
        ("get_job_run_events", lambda log: log.get_job_run_events(rng.choice(jobs))),
        ("get_events_in_range (1 s)", lambda log: in_range(log, rng.choice(timestamps))),
        ("list_events (the first page of 100)", lambda log: log.list_events(limit=100)),
        ("list_events (a page of 100 at a key's time)", lambda log: page_at(log, rng.choice(timestamps))),
        (
            "list_events (filtered)",
            lambda log: log.list_events(
                filter=EventFilter(event_types=["partition_event"], partition_refs=[rng.choice(refs)]), limit=100
            ),
        ),
        ("get_latest_partition_status", lambda log: log.get_latest_partition_status(rng.choice(refs))),
        ("get_active_builds_for_partition", lambda log: log.get_active_builds_for_partition(rng.choice(refs))),
        (
            "get_build_request_for_available_partition",
            lambda log: log.get_build_request_for_available_partition(rng.choice(refs)),
        ),
        ("list_build_requests (page of 20)", lambda log: log.list_build_requests(limit=20)),
        ("list_recent_partitions (page of 20)", lambda log: log.list_recent_partitions(limit=20)),
        ("get_activity_summary", lambda log: log.get_activity_summary()),
    ]


def service_build(index: int) -> tuple[list[dict[str, Any]], str, str]:
    """The 5 events a service appends for one new build: requested, scheduled, a job running,
    the partition building, the build executing."""
    build, job, ref = f"bench-br-{index}-{uuid.uuid4()}", f"bench-job-{index}", f"data/bench/part={index}"
    now = time.time_ns()

    def event(offset: int, event_type: str, payload: dict) -> dict[str, Any]:
        return {
            "event_id": str(uuid.uuid4()),
            "timestamp": now + offset,
            "build_request_id": build,
            "event_type": event_type,
            event_type: payload,
        }

    BR, P, J = BuildRequestStatus, PartitionStatus, JobStatus
    return (
        [
            event(
                0, "build_request_event", {"status_code": 1, "status_name": BR(1).name, "requested_partitions": [ref]}
            ),
            event(1, "partition_event", {"partition_ref": ref, "status_code": 2, "status_name": P(2).name}),
            event(
                2,
                "job_event",
                {"job_run_id": job, "status_code": 2, "status_name": J(2).name, "target_partitions": [ref]},
            ),
            event(
                3,
                "partition_event",
                {"partition_ref": ref, "status_code": 3, "status_name": P(3).name, "job_run_id": job},
            ),
            event(4, "build_request_event", {"status_code": 3, "status_name": BR(3).name}),
        ],
        build,
        ref,
    )


def query_keys(events: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str], list[int]]:
    """The keys `query_methods` draws from: build requests, partitions, job runs, and a sample of
    up to 10,000 timestamps."""
    builds = sorted({e["build_request_id"] for e in events})
    refs = sorted({e["partition_event"]["partition_ref"] for e in events if e["event_type"] == "partition_event"})
    jobs = sorted({e["job_event"]["job_run_id"] for e in events if e["event_type"] == "job_event"})
    timestamps = sorted(e["timestamp"] for e in events[:: max(1, len(events) // 10_000)])
    return builds, refs, jobs, timestamps


def service_loop(log: Any, loops: int) -> dict[str, list[float]]:
    """Seconds per step of `loops` service loops on `log`: append a new build's 5 events, read its
    partition's status and its events right after, and the status again with nothing new."""
    steps: dict[str, list[float]] = {}
    for index in range(loops):
        batch, build, ref = service_build(index)
        for step, action in (
            ("append 5 events", partial(log.append_events, batch)),
            ("get_latest_partition_status right after an append", partial(log.get_latest_partition_status, ref)),
            ("get_build_request_events right after an append", partial(log.get_build_request_events, build)),
            ("get_latest_partition_status, nothing new", partial(log.get_latest_partition_status, ref)),
        ):
            steps.setdefault(step, []).extend(timings(action, 1))
    return steps


def comparison_row(name: str, a: list[float], b: list[float]) -> str:
    """A table row: p50 / p95 of `a` (the reference, SQLite) and of `b`, and the p95 ratio b / a."""
    return (
        f"| {name} | {ms(percentile(a, 0.5))} / {ms(percentile(a, 0.95))} | "
        f"{ms(percentile(b, 0.5))} / {ms(percentile(b, 0.95))} | {percentile(b, 0.95) / percentile(a, 0.95):.2f}x |"
    )


def compare_methods(
    methods: list[tuple[str, Callable[[Any], Any]]], rng: random.Random, reference: Any, other: Any, calls: int
) -> list[str]:
    """One `comparison_row` per query method: `calls` calls on `reference` (fewer when they take
    over its time budget), then the same calls, on the same keys, on `other`."""
    rows = []
    for method, call in methods:
        state = rng.getstate()
        a = timings(partial(call, reference), calls)
        rng.setstate(state)  # the same keys for both
        b = timings(partial(call, other), len(a), budget_s=float("inf"))
        b = b[: len(a)]  # the same calls, when the budget cut the reference's short
        rows.append(comparison_row(f"{method} ({len(a)} calls)", a, b))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200, help="calls per query method")
    parser.add_argument("--loops", type=int, default=100, help="service loop iterations")
    parser.add_argument("--lake", help="an existing lake whose raw log to use (copied first)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-query-path-"))
    root = workdir / "lake"
    try:
        started = time.perf_counter()
        if args.lake:
            shutil.copytree(Path(args.lake) / "tables" / RAW_EVENT_LOG.name, root / "tables" / RAW_EVENT_LOG.name)
        else:
            build_lake(root, args.events)
        events = lake_events(root)
        print(f"lake: {len(events):,} events ({time.perf_counter() - started:.1f}s to prepare)")
        started = time.perf_counter()
        load_events(workdir / "bel.db", events)
        print(f"SQLite: loaded in {time.perf_counter() - started:.1f}s")
        rng = random.Random(1)
        builds, refs, jobs, timestamps = query_keys(events)
        log_bytes = sum(f.stat().st_size for f in (root / "tables").rglob("*") if f.is_file())
        del events
        gc.collect()

        # Cold start, memory and disk.
        rss = rss_bytes()
        started = time.perf_counter()
        sqlite_log = SqliteEventLog(workdir / "bel.db")
        sqlite_log.get_activity_summary()
        sqlite_cold, sqlite_rss = time.perf_counter() - started, rss_bytes() - rss
        rss = rss_bytes()
        started = time.perf_counter()
        delta_log = DeltaRsEventLog(Lake(str(root)))
        delta_log.get_activity_summary()
        delta_cold, delta_rss = time.perf_counter() - started, rss_bytes() - rss
        print()
        print("| | cold start | memory added | on disk |")
        print("|---|---:|---:|---:|")
        print(
            f"| SQLite | {sqlite_cold:.2f} s | {sqlite_rss / 1e6:,.0f} MB | "
            f"{os.path.getsize(workdir / 'bel.db') / 1e6:,.0f} MB (the database) |"
        )
        print(
            f"| Delta, JVM-free | {delta_cold:.2f} s | {delta_rss / 1e6:,.0f} MB "
            f"| {log_bytes / 1e6:,.0f} MB (the lake's raw log) + {delta_log.index_bytes() / 1e6:,.0f} MB "
            "(the serving index, built by this open) |"
        )

        # The service loop.
        sqlite_steps, delta_steps = service_loop(sqlite_log, args.loops), service_loop(delta_log, args.loops)
        print()
        print("| service loop | SQLite p50 / p95 ms | Delta p50 / p95 ms | p95 ratio |")
        print("|---|---:|---:|---:|")
        for step in sqlite_steps:
            print(comparison_row(step, sqlite_steps[step], delta_steps[step]))

        # Every query method.
        methods = query_methods(rng, builds, refs, jobs, timestamps)
        print()
        print("| method | SQLite p50 / p95 ms | Delta p50 / p95 ms | p95 ratio |")
        print("|---|---:|---:|---:|")
        print("\n".join(compare_methods(methods, rng, sqlite_log, delta_log, args.calls)))

        # Two other designs, for the point read of one build request's events.
        table = deltalake.DeltaTable(str(root / "tables" / RAW_EVENT_LOG.name))
        query = deltalake.QueryBuilder().register("raw_event_log", table)
        datafusion = timings(
            lambda: query.execute(
                f"SELECT * FROM raw_event_log WHERE build_request_id = '{rng.choice(builds)}'"
                " ORDER BY timestamp, event_id"
            ).read_all(),
            min(args.calls, 50),
        )
        started = time.perf_counter()
        arrow = table.to_pyarrow_table(columns=list(EVENT_COLUMNS))
        duck = duckdb.connect()
        duck.register("arrow_events", arrow)
        duck.execute("CREATE TABLE events AS SELECT * FROM arrow_events")
        duck.execute("CREATE INDEX events_by_build_request ON events (build_request_id)")
        duck_load = time.perf_counter() - started
        in_duckdb = timings(
            lambda: duck.execute(
                "SELECT * FROM events WHERE build_request_id = ? ORDER BY timestamp, event_id", [rng.choice(builds)]
            ).fetchall(),
            args.calls,
        )
        replica = timings(lambda: delta_log.get_build_request_events(rng.choice(builds)), args.calls)
        print()
        print("| design, point read of a build request's events | p50 / p95 ms | load |")
        print("|---|---:|---:|")
        print(
            f"| delta-rs DataFusion SQL over the table | {ms(percentile(datafusion, 0.5))} / "
            f"{ms(percentile(datafusion, 0.95))} | none |"
        )
        print(
            f"| DuckDB in-memory table with an index | {ms(percentile(in_duckdb, 0.5))} / "
            f"{ms(percentile(in_duckdb, 0.95))} | {duck_load:.1f} s |"
        )
        print(
            f"| SQLite serving index (this backend) | {ms(percentile(replica, 0.5))} / "
            f"{ms(percentile(replica, 0.95))} | {delta_cold:.1f} s |"
        )
        sqlite_log.close()
        delta_log.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
