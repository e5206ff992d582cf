"""Projection refresh and query latency on a generated log (issue 3's benchmark).

    python -m bench.projections [--events 1000000] [--queries 30]

Prints: the full rebuild time of each projection; the incremental refresh after appending 1%
and 0.1% more events (timed warm, after an untimed fold of 0.01%), with its ratio to the full
rebuild (target: at most 10% for 1%); each of those also for the three at once, as the refresh
job and the query API run them (`refresh_projections`, on a copy of the lake that got the same
appends); a refresh with nothing new (the fixed cost every refresh pays); and p50/p95 latency
of each query method on a warm session, Delta against SQLite, with the ratio (the original
plan's bar: Delta within 2x of SQLite at p95).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from functools import partial
from itertools import islice
from pathlib import Path

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.ingest.writer import append_events
from databuild_assets.log.sqlite.backend import SqliteEventLog, load_events
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import refresh_projection, refresh_projections
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload import generate_events


def write_events_file(path: Path, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        out.writelines(json.dumps(event, separators=(",", ":")) + "\n" for event in events)


def timed(action):
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def refresh_all(spark, lake: Lake, full: bool) -> dict[str, tuple[float, str]]:
    return {
        name: (lambda t: (t[0], t[1].mode))(
            timed(partial(refresh_projection, spark, lake, projection, RAW_EVENT_LOG, full=full))
        )
        for name, projection in PROJECTIONS.items()
    }


def refresh_together(spark, lake: Lake, full: bool) -> tuple[float, set[str]]:
    """The three at once: the wall time, and the modes they refreshed in."""
    seconds, results = timed(lambda: refresh_projections(spark, lake, PROJECTIONS.values(), RAW_EVENT_LOG, full=full))
    return seconds, {result.mode for result in results.values()}


def query_plan(events: list[dict], rng: random.Random) -> list[tuple[str, tuple]]:
    """The calls to time: each query method with keys drawn from the log."""
    build_requests = sorted({e["build_request_id"] for e in events})
    partitions = sorted({e["partition_event"]["partition_ref"] for e in events if e.get("partition_event")})
    job_runs = sorted({e["job_event"]["job_run_id"] for e in events if e.get("job_event")})
    start = events[len(events) // 2]["timestamp"]
    return [
        ("get_build_request_events", (rng.choice(build_requests),)),
        ("get_partition_events", (rng.choice(partitions),)),
        ("get_job_run_events", (rng.choice(job_runs),)),
        ("get_events_in_range", (start, start + 60 * 10**9)),
        ("list_events", (None, None, 100)),
        ("get_latest_partition_status", (rng.choice(partitions),)),
        ("get_active_builds_for_partition", (rng.choice(partitions),)),
        ("get_build_request_for_available_partition", (rng.choice(partitions),)),
        ("list_build_requests", (20,)),
        ("list_recent_partitions", (20,)),
        ("get_activity_summary", ()),
    ]


def time_queries(backend, events: list[dict], repeats: int, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    timings: dict[str, list[float]] = {}
    for _ in range(repeats):
        for method, args in query_plan(events, rng):
            seconds, _ = timed(partial(getattr(backend, method), *args))
            timings.setdefault(method, []).append(seconds)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queries", type=int, default=30, help="timed calls per query method and backend (0: skip)")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-projections-"))
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores; workdir {workdir}")
    one_percent, tenth_percent, warm_up = args.events // 100, args.events // 1000, max(1, args.events // 10_000)
    total = args.events + warm_up + one_percent + tenth_percent
    events = list(islice(generate_events(total, seed=args.seed), total))
    batches, start = [], 0
    for size in (args.events, warm_up, one_percent, tenth_percent):
        batches.append(events[start : start + size])
        start += size
    base, warm, plus_one, plus_tenth = batches

    spark = build_spark_session(
        SparkSettings(shuffle_partitions=4, long_lived=True, extra_config={"spark.ui.enabled": "false"})
    )
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(str(workdir / "lake"))
    # Files of 100,000 events (~60 MB each), as a producer would land them in batches. (Until
    # 2026-11-22 ingestion held a whole file as one value, and one file of 1M events, 617 MB,
    # ran the 4g driver out of heap once; it now reads large files in byte ranges.)
    for number, start in enumerate(range(0, len(base), 100_000)):
        write_events_file(Path(lake.landing) / f"base-{number:03d}.jsonl", base[start : start + 100_000])
    seconds, result = timed(lambda: ingest_landing_files(spark, lake))
    print(f"ingested {result.accepted:,} events in {seconds:.1f}s")

    print("\nfull rebuild (after a first build, so the JVM is warm)")
    refresh_all(spark, lake, full=True)
    full = refresh_all(spark, lake, full=True)
    for name, (seconds, _mode) in full.items():
        print(f"  {name:16} {seconds:7.2f}s")
    full_total = sum(s for s, _ in full.values())
    print(f"  {'all three':16} {full_total:7.2f}s")
    full_together, _ = refresh_together(spark, lake, full=True)
    print(f"  {'three at once':16} {full_together:7.2f}s")

    # Like the full rebuilds, incremental refreshes are timed warm: after one untimed fold of a few
    # events (the first MERGE of a process compiles its plans).
    append_events(spark, lake, warm, writer="bench")
    refresh_all(spark, lake, full=False)
    # The three at once fold the same batches into a copy of the lake, warmed the same way.
    together_lake = Lake(str(workdir / "lake-together"))
    shutil.copytree(lake.root, together_lake.root)
    refresh_together(spark, together_lake, full=False)
    for label, extra in (("+1%", plus_one), ("+0.1%", plus_tenth)):
        append_events(spark, lake, extra, writer="bench")
        append_events(spark, together_lake, extra, writer="bench")
        incremental = refresh_all(spark, lake, full=False)
        together, modes = refresh_together(spark, together_lake, full=False)
        total_seconds = sum(s for s, _ in incremental.values())
        print(f"\nincremental refresh after appending {len(extra):,} events ({label})")
        for name, (seconds, mode) in incremental.items():
            print(f"  {name:16} {seconds:7.2f}s  {mode:12} {seconds / full[name][0]:6.1%} of its full rebuild")
        print(
            f"  {'all three':16} {total_seconds:7.2f}s  {'':12} {total_seconds / full_total:6.1%} of the full rebuild"
            + ("  (target for +1%: at most 10%)" if label == "+1%" else "")
        )
        print(
            f"  {'three at once':16} {together:7.2f}s  {'/'.join(sorted(modes)):12} "
            f"{together / full_together:6.1%} of the full rebuild at once"
        )

    idle = refresh_all(spark, lake, full=False)
    print("\nrefresh with no new commits (the fixed cost: versions, history, table checks)")
    for name, (seconds, mode) in idle.items():
        print(f"  {name:16} {seconds:7.2f}s  {mode}")

    if args.queries > 0:
        time_all_queries(spark, lake, events, workdir, args)
    else:
        print("\nquery latency: skipped (--queries 0)")
    print(f"load average at end: {os.getloadavg()}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


def time_all_queries(spark, lake: Lake, events: list[dict], workdir: Path, args) -> None:
    from databuild_assets.log.spark.backend import DeltaEventLog

    total = len(events)
    sqlite_path = workdir / "bel.db"
    load_events(sqlite_path, events)
    sqlite_log = SqliteEventLog(str(sqlite_path))
    delta_log = DeltaEventLog(spark, lake)
    time_queries(delta_log, events, 1, args.seed)  # warm-up: first calls compile plans
    delta_times = time_queries(delta_log, events, args.queries, args.seed)
    sqlite_times = time_queries(sqlite_log, events, args.queries, args.seed)
    print(f"\nquery latency over {args.queries} calls each (ms), warm session, {total:,} events")
    print(
        f"  {'method':42} {'delta p50':>10} {'delta p95':>10} {'sqlite p50':>10} {'sqlite p95':>10} {'p95 ratio':>10}"
    )
    for method in delta_times:
        d50, d95 = percentile(delta_times[method], 0.5) * 1e3, percentile(delta_times[method], 0.95) * 1e3
        s50, s95 = percentile(sqlite_times[method], 0.5) * 1e3, percentile(sqlite_times[method], 0.95) * 1e3
        print(f"  {method:42} {d50:10.1f} {d95:10.1f} {s50:10.2f} {s95:10.2f} {d95 / max(s95, 1e-3):9.0f}x")


if __name__ == "__main__":
    main()
