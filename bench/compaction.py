"""Compaction of a log that many small commits left (issue 4's benchmark).

    python -m bench.compaction [--commits 1000] [--events-per-commit 100] [--scans 3]

Writes `--commits` commits of `--events-per-commit` generated events each, through the writer
API (`--via api`: `append_events`, a MERGE on event_id, as a DataBuild service would) or as
plain Delta appends of the same rows (`--via append`: faster to set up; the files and
commits it leaves are the same kind), records one tombstone, then runs the
compaction job's function (purge + OPTIMIZE of closed date partitions). Prints, for the raw
log, the file count and the full-scan time (every column of every row read, median of
`--scans`) before and after, their ratio (target: the scan at least 5x faster after), and the
compaction's own time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path

from pyspark.sql import SparkSession

from databuild_assets.ingest.landing import ensure_ingest_tables, events_from_lines
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.runtime.delta_tables import table_size
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload import generate_events


def full_scan_seconds(spark: SparkSession, path: str, scans: int) -> float:
    """Median time to read every column of every row of the table at `path`."""
    times = []
    for _ in range(scans):
        started = time.perf_counter()
        spark.read.format("delta").load(path).write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def plain_append(spark: SparkSession, lake: Lake, events: list[dict], commit: int) -> None:
    """Append `events` to the raw log in one commit, as the rows the writer API would store."""
    lines = spark.createDataFrame(
        [(f"writer:bench-{commit}", index + 1, json.dumps(event)) for index, event in enumerate(events)],
        "source_file string, line_number long, line string",
    )
    events_from_lines(lines).write.format("delta").mode("append").save(lake.table_path(RAW_EVENT_LOG))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--events-per-commit", type=int, default=100)
    parser.add_argument("--via", choices=("api", "append"), default="api", help="how the small commits are written")
    parser.add_argument("--scans", type=int, default=3, help="full scans timed before and after (median)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-compaction-"))
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores; workdir {workdir}")
    spark = build_spark_session(SparkSettings(shuffle_partitions=2, extra_config={"spark.ui.enabled": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    lake = Lake(str(workdir / "lake"))
    path = lake.table_path(RAW_EVENT_LOG)

    total = args.commits * args.events_per_commit
    events = list(islice(generate_events(total, seed=args.seed), total))
    ensure_ingest_tables(spark, lake)
    started = time.perf_counter()
    for number in range(args.commits):
        batch = events[number * args.events_per_commit : (number + 1) * args.events_per_commit]
        if args.via == "api":
            append_events(spark, lake, batch, writer="bench")
        else:
            plain_append(spark, lake, batch, number)
        if (number + 1) % 100 == 0:
            elapsed = time.perf_counter() - started
            print(
                f"  {number + 1:,} commits written in {elapsed:.0f}s ({(number + 1) / elapsed:.1f} commits/s)",
                flush=True,
            )
    write_seconds = time.perf_counter() - started
    victim = events[len(events) // 2]["build_request_id"]
    request_erasure(spark, lake, "build_request_id", victim, actor="bench", reason="benchmark purge")

    before = table_size(spark, path)
    scan_before = full_scan_seconds(spark, path, args.scans)
    started = time.perf_counter()
    result = compact(spark, lake)
    compaction_seconds = time.perf_counter() - started
    after = table_size(spark, path)
    scan_after = full_scan_seconds(spark, path, args.scans)

    raw = next(t for t in result.tables if t.table == RAW_EVENT_LOG.name)
    how = "append_events (MERGE)" if args.via == "api" else "plain Delta appends"
    print(
        f"\n{args.commits:,} commits of {args.events_per_commit} events ({total:,} events) written as "
        f"{how} in {write_seconds:.0f}s ({args.commits / write_seconds:.1f} commits/s)"
    )
    print(f"  {'raw_event_log':24} {'files':>8} {'MiB':>8} {'full scan':>10}")
    print(f"  {'before compaction':24} {before.num_files:8,} {before.size_bytes / 2**20:8.1f} {scan_before:9.2f}s")
    print(f"  {'after compaction':24} {after.num_files:8,} {after.size_bytes / 2**20:8.1f} {scan_after:9.2f}s")
    print(
        f"  scan speed-up: {scan_before / scan_after:.1f}x (target: at least 5x); "
        f"files {before.num_files / max(after.num_files, 1):.0f}x fewer"
    )
    print(
        f"compaction: {compaction_seconds:.1f}s; purged {raw.rows_purged:,} rows of one build request "
        f"from the raw log; files compacted per table: "
        + ", ".join(f"{t.table} {t.files_compacted:,}" for t in result.tables)
    )
    print(f"load average at end: {os.getloadavg()}")
    spark.stop()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
