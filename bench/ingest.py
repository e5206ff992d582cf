"""Ingestion benchmark: generated events from JSON Lines landing files into the raw event log
(Spark + Delta), and the same events into the SQLite reference backend in one transaction.

It prints events/s for both, their ratio, a phase profile of the Delta path and timings of
alternatives, so that a slow ingest comes with the numbers that say why (bench/README.md).

    python -m bench.ingest --events 1000000

What it measures, in order:
1. Landing files: `write_landing_files(N, seed, events_per_file)`, timed apart.
2. Spark start, timed apart, then a warm-up ingest of 1,000 other events (the JVM's first Delta
   jobs load classes and compile).
3. The ingest of the N events into a fresh lake; the same call again (no-op); later the same
   files into another fresh lake (warm JVM). For both, the Spark UI's REST API says where the
   time went: the lines job, the raw log's MERGE (Delta's `executionTimeMs`), the rest, the
   longest jobs and the stages with the most task time.
4. Phase profile (not with `--no-profile`; `bench.ingest_profile`): the pipeline cut after each
   phase, with the real functions of `ingest/landing.py`, each cut computed in full (a `noop`
   sink); a phase's cost is the difference between two cuts.
5. Alternatives (what-if, from bench code): reading the bytes only, lines to Python and back,
   numbering without validation, one file per read task, the MERGE without Delta's
   `repartitionBeforeWrite` or with the other shuffle partition count, an append without file
   statistics, and a pipeline without Python (the floor of the data path).
6. Fixed costs of a batch: 1,000 new events into a 1,000-event log and into the N-event log, and
   the small Delta operations each batch makes.
7. SQLite: `load_events` of the same events, read from the same files and parsed with
   `json.loads`, in one transaction, after Spark has stopped; then the price per line of what the
   Python workers do.
8. Anchors (`bench.ingest_anchors`): plain Spark on the same files in the same warm JVM, and,
   after Spark has stopped, `dagster job execute -j ingest_job` in a new process with a JVM of its
   own (`DATABUILD_SPARK_DRIVER=own`), then again on a warm driver.
9. Verdict: events/s, the ratio Delta/SQLite, and the two anchor ratios.

Every step reports, next to its wall seconds, `cpu s` (this process tree: driver, JVM, Python
workers, summed by a sampling thread) and `others` (everyone else's CPU meanwhile, from
`/proc/stat`). On 2 cores, `cpu s + others` near `2 x seconds` means the machine was full. The
phase profile's increments are differences of two runs: on a loaded machine one can come out
negative. It asserts nothing about speed, and refuses to report a speed for an ingest or a load
that did not end with exactly N events accepted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.ingest_anchors import ingest_job_process, plain_spark_json_to_parquet
from bench.ingest_profile import profile_phases, report_profile
from bench.measuring import (
    LONGEST_JOBS,
    Row,
    SparkJobs,
    Usage,
    job_label,
    load_average,
    measure,
    print_rows,
    print_stages,
    ui_time,
)
from databuild_assets.events.validation import event_error, parse_line
from databuild_assets.ingest.landing import (
    BatchResult,
    _batch_commit,
    _Ledger,
    ensure_ingest_tables,
    ingest_landing_files,
)
from databuild_assets.ingest.landing_folder import LandingFile, list_landing_files
from databuild_assets.log.sqlite.backend import load_events
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload import write_landing_files

TARGET_EVENTS_PER_SECOND = 100_000
# Small batches of other events: one ingested before the measured one (the JVM's first Delta jobs
# load classes and JIT-compile), others to price a batch whatever its size.
SMALL_BATCH_EVENTS = 1_000
# Lines timed in this process (one core) to put a price per line on what the Python workers do.
LINES_TIMED_IN_PROCESS = 100_000


class JobSpan(NamedTuple):
    """One finished Spark job: when it was submitted and completed (epoch s), and the UI's record."""

    start: float
    end: float
    job: dict


def job_timeline(jobs: list[dict], stages: list[dict], wall: float, merge_ms: str | None) -> list[Row]:
    """The ingest by its parts (the lines job, the raw log's MERGE, the rest), its longest jobs,
    the time inside any job, and the time the driver ran alone between jobs."""
    spans = sorted(
        (
            JobSpan(ui_time(job["submissionTime"]), ui_time(job["completionTime"]), job)
            for job in jobs
            if "completionTime" in job
        ),
        key=lambda span: (span.start, span.end, span.job["jobId"]),
    )
    inside, reach = 0.0, float("-inf")
    for start, end, _job in spans:
        if end > reach:
            inside += end - max(start, reach)
            reach = end
    longest = sorted(spans, key=lambda span: span.end - span.start, reverse=True)
    rows = []
    # write_batch's count of good and bad lines reads, validates and persists every line: the job
    # that reads the most input (the landing files; the others read tables or cached lines).
    input_of = defaultdict(int)
    for stage in stages:
        input_of[stage["jobId"]] += stage["inputBytes"]
    lines_job = max(spans, key=lambda span: input_of[span.job["jobId"]], default=None)
    if lines_job is not None and merge_ms is not None:
        lines_seconds, merge_seconds = lines_job.end - lines_job.start, int(merge_ms) / 1000
        rows += [
            Row(f"lines: read + split + validate + persist (job {lines_job.job['jobId']})", lines_seconds),
            Row("raw log MERGE (Delta's executionTimeMs)", merge_seconds),
            Row("the rest: table checks, ledger, quarantine, history", wall - lines_seconds - merge_seconds),
        ]
    rows += [Row(f"job {job['jobId']}: {job_label(job)}", end - start) for start, end, job in longest[:LONGEST_JOBS]]
    return rows + [
        Row(f"inside any of the {len(spans)} Spark jobs", inside),
        Row("between jobs: driver only (planning, Delta log, commits)", wall - inside),
    ]


# --- The Delta path ------------------------------------------------------------------------------


def start_spark(cores: int, shuffle_partitions: int, driver_memory: str) -> SparkSession:
    settings = SparkSettings(
        master=f"local[{cores}]",
        app_name="bench-ingest",
        shuffle_partitions=shuffle_partitions,
        driver_memory=driver_memory,
        extra_config={"spark.ui.showConsoleProgress": "false"},
        # Full JIT tiers, as on the warm driver a deployment's runs share: the warm ingest and the
        # plain-Spark anchor are steady-state figures. ingest_job's own JVM gets the defaults.
        long_lived=True,
    )
    spark = build_spark_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def ingest_checked(spark: SparkSession, lake: Lake, landing: str, expected_events: int) -> None:
    """`ingest_landing_files`, refusing to report a speed for an ingest that lost or added events."""
    result = ingest_landing_files(spark, lake, landing=landing)
    counts = (result.lines_read, result.accepted, result.duplicates, result.quarantined)
    if counts != (expected_events, expected_events, 0, 0):
        raise RuntimeError(
            f"ingest of {landing} into {lake.root}: expected {expected_events:,} lines all accepted, got "
            f"lines_read={result.lines_read:,} accepted={result.accepted:,} duplicates={result.duplicates:,} "
            f"quarantined={result.quarantined:,}; the figures would be meaningless"
        )


def merge_metrics(spark: SparkSession, log_path: str) -> dict[str, str]:
    """The operationMetrics Delta recorded for the latest MERGE into `log_path`."""
    row = (
        DeltaTable.forPath(spark, log_path)
        .history()
        .where("operation = 'MERGE'")
        .orderBy(F.col("version").desc())
        .select("operationMetrics")
        .first()
    )
    return dict(row["operationMetrics"]) if row else {}


def price_small_delta_operations(spark: SparkSession, scratch: Path) -> list[Row]:
    """What the small Delta operations that each batch makes, whatever its size, cost on a warm
    JVM, made by the ingest's own ledger on a lake of their own: 1 check of the 3 tables, 1 read
    of the ledger (delta-rs on a local disk), 1 plan (an idempotent append, then its commit found
    in the commit files), 1 record (an append), and the lookup of the raw log commit in the commit
    files. A batch with bad lines also appends to the quarantine (as the record does)."""
    lake = Lake(str(scratch))
    ensure_ingest_tables(spark, lake)  # creates them: a batch finds them there
    _, check = measure(lambda: ensure_ingest_tables(spark, lake))
    ledger = _Ledger(spark, lake)
    rows, read = measure(ledger.rows)
    files = [LandingFile(f"{lake.landing}/events-00000.jsonl", 1)]
    planned, plan = measure(lambda: ledger.plan(files, rows))
    batch_id, planned_files = planned
    result = BatchResult(batch_id, tuple(planned_files), 0, 0, 0, 0, 0)
    _, record = measure(lambda: ledger.record_committed(result))
    _, lookup = measure(lambda: _batch_commit(spark, lake.table_path(RAW_EVENT_LOG), batch_id))
    return [
        Row.of("check the 3 tables exist (ensure_ingest_tables)", check),
        Row.of("read the ledger", read),
        Row.of("plan: append 1 row to the ledger, find its commit", plan),
        Row.of("record: append 1 row to the ledger", record, note="quarantine too, if lines are bad"),
        Row.of("find the batch's raw log commit", lookup),
        Row.of("estimated bookkeeping of one batch", check + read + plan + record + lookup),
    ]


# --- The SQLite path -----------------------------------------------------------------------------


def landing_events(files: Iterable[Path]) -> Iterator[dict]:
    """The events of the landing files, parsed: what SQLite is fed, so that it too pays for JSON."""
    for path in files:
        with path.open("rb") as lines:
            for line in lines:
                yield json.loads(line)


def price_per_line(landing_file: Path, limit: int) -> list[Row]:
    """What the Python workers do per line, timed in this process on one core. Results are dropped
    as they come, as the workers drop the parsed events: kept, 100,000 dicts would make Python's
    garbage collector walk them again and again, and the price would be the collector's."""
    pieces = [piece for piece in landing_file.read_bytes().split(b"\n", limit)[:limit] if piece]
    parsed = [json.loads(piece) for piece in pieces]
    count = len(pieces)

    def each(function: Callable, items: list) -> Callable[[], None]:
        return lambda: deque(map(function, items), maxlen=0)

    _, decode = measure(each(bytes.decode, pieces))
    _, loads = measure(each(json.loads, pieces))
    _, check = measure(each(event_error, parsed))
    _, validate = measure(each(parse_line, pieces))
    return [
        Row.of(
            name, usage, count, f"{usage.cpu / count * 1e6:.1f} CPU µs/line ({usage.wall / count * 1e6:.1f} µs wall)"
        )
        for name, usage in (
            ("decode UTF-8", decode),
            ("json.loads only", loads),
            ("event_error only (the checks, on parsed events)", check),
            ("parse_line (json.loads + checks)", validate),
        )
    ]


# --- The run -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events to generate and ingest (default 1,000,000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--events-per-file", type=int, default=100_000, help="events per landing file (default 100,000)"
    )
    parser.add_argument("--workdir", help="where to make the fresh working folder (default: the system's temp folder)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the working folder (landing files, lakes, SQLite file)"
    )
    parser.add_argument("--cores", type=int, default=cores, help=f"Spark local cores (default: all, {cores})")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="spark.sql.shuffle.partitions (default: cores; the run also times 2 x cores)",
    )
    parser.add_argument("--driver-memory", default="4g", help="Spark driver memory (default 4g)")
    parser.add_argument("--no-profile", action="store_true", help="skip the phase profile and the alternatives")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_events = args.events
    shuffle_partitions = args.shuffle_partitions or args.cores
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-", dir=args.workdir))
    print(
        f"bench.ingest {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: "
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    )
    print(
        f"  {n_events:,} events, seed {args.seed}, {args.events_per_file:,} events per file; "
        f"Spark local[{args.cores}], {shuffle_partitions} shuffle partitions, driver {args.driver_memory}; "
        f"work in {work}"
    )
    print(f"  at start: {load_average()}", flush=True)
    try:
        run(args, work, n_events, shuffle_partitions)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class MeasuredIngest:
    """One `ingest_landing_files` run: what it took, its Spark jobs and stages, its MERGE's metrics."""

    usage: Usage
    jobs: list[dict]
    stages: list[dict]
    merge_metrics: dict[str, str]


def measure_ingest(spark: SparkSession, jobs: SparkJobs, lake: Lake, landing: Path, n_events: int) -> MeasuredIngest:
    jobs_before = jobs.ids()
    _, usage = measure(lambda: ingest_checked(spark, lake, str(landing), n_events))
    ingest_jobs = [job for job in jobs.all() if job["jobId"] not in jobs_before]
    job_of_stage = {stage_id: job["jobId"] for job in ingest_jobs for stage_id in job["stageIds"]}
    stages = [
        dict(stage, jobId=job_of_stage[stage["stageId"]])
        for stage in jobs.stages()
        if stage["stageId"] in job_of_stage and stage["status"] == "COMPLETE"
    ]
    return MeasuredIngest(usage, ingest_jobs, stages, merge_metrics(spark, lake.table_path(RAW_EVENT_LOG)))


def report_ingest(title: str, ingest: MeasuredIngest) -> None:
    wall = ingest.usage.wall
    print_rows(
        f"{title}: where its {wall:.1f} s went (Spark jobs, from the Spark UI)",
        job_timeline(ingest.jobs, ingest.stages, wall, ingest.merge_metrics.get("executionTimeMs")),
        total_seconds=wall,
    )
    print(
        "  its MERGE, as Delta recorded it: "
        + ", ".join(
            f"{key}={ingest.merge_metrics.get(key, '?')}"
            for key in ("executionTimeMs", "rewriteTimeMs", "materializeSourceTimeMs", "numTargetFilesAdded")
        )
    )
    gc_seconds = sum(stage["jvmGcTime"] for stage in ingest.stages) / 1000
    print(f"  JVM garbage collection in its tasks: {gc_seconds:.1f} s (summed over tasks)")
    print_stages(ingest.stages)


def run(args: argparse.Namespace, work: Path, n_events: int, shuffle_partitions: int) -> None:
    rows: list[Row] = []
    landing = work / "landing"
    workload, usage = measure(
        lambda: write_landing_files(landing, n_events, seed=args.seed, events_per_file=args.events_per_file)
    )
    megabytes = sum(path.stat().st_size for path in workload.files) / 1e6
    rows.append(
        Row.of(
            f"generate landing files ({len(workload.files)} files; not in ingest)",
            usage,
            n_events,
            f"{megabytes:,.0f} MB",
        )
    )
    # Other events (other seeds): one small batch warms the JVM up, the other prices a batch.
    warm_up_landing, small_landing = work / "warm_up_landing", work / "small_landing"
    write_landing_files(warm_up_landing, SMALL_BATCH_EVENTS, seed=args.seed + 1)
    write_landing_files(small_landing, SMALL_BATCH_EVENTS, seed=args.seed + 2)

    spark, usage = measure(lambda: start_spark(args.cores, shuffle_partitions, args.driver_memory))
    rows.append(Row.of("start Spark (JVM; fixed cost)", usage))
    jobs = SparkJobs(spark)
    small_lake = Lake(str(work / "small_lake"))
    _, usage = measure(lambda: ingest_checked(spark, small_lake, str(warm_up_landing), SMALL_BATCH_EVENTS))
    rows.append(Row.of(f"warm-up: ingest {SMALL_BATCH_EVENTS:,} events (first Delta jobs)", usage, SMALL_BATCH_EVENTS))
    print(f"  Spark up; {load_average()}; ingesting {n_events:,} events...", flush=True)

    lake = Lake(str(work / "lake"))
    first = measure_ingest(spark, jobs, lake, landing, n_events)
    rows.append(Row.of(f"ingest {n_events:,} events -> raw log (Delta)", first.usage, n_events))
    _, usage = measure(lambda: ingest_landing_files(spark, lake, landing=str(landing)))
    rows.append(Row.of("ingest again: no new files (no-op)", usage))
    print(f"  ingest done in {first.usage.wall:.1f} s; {load_average()}", flush=True)

    profile = None
    if not args.no_profile:
        profile = profile_phases(spark, work / "profile", list_landing_files(spark, str(landing)), n_events)
        print(f"  profile done; {load_average()}", flush=True)
    # The same files into a fresh lake, once the JVM has compiled the hot paths of a big batch:
    # what a long-running process (a Dagster code server's session) would see.
    warm = measure_ingest(spark, jobs, Lake(str(work / "lake_warm")), landing, n_events)
    rows.append(Row.of(f"the same {n_events:,} events into a fresh lake, warm JVM", warm.usage, n_events))
    plain_paths = [str(path) for path in workload.files]
    _, plain = measure(lambda: plain_spark_json_to_parquet(spark, plain_paths, str(work / "plain_parquet")))
    rows.append(
        Row.of("anchor: plain Spark JSON -> Parquet by event_date, warm JVM", plain, n_events, "no checks, no Delta")
    )
    _, usage = measure(lambda: ingest_checked(spark, small_lake, str(small_landing), SMALL_BATCH_EVENTS))
    rows.append(
        Row.of(
            f"fixed cost: {SMALL_BATCH_EVENTS:,} new events into a {SMALL_BATCH_EVENTS:,}-event log",
            usage,
            SMALL_BATCH_EVENTS,
        )
    )
    _, usage = measure(lambda: ingest_checked(spark, lake, str(small_landing), SMALL_BATCH_EVENTS))
    rows.append(
        Row.of(
            f"the same {SMALL_BATCH_EVENTS:,} new events into the {n_events:,}-event log",
            usage,
            SMALL_BATCH_EVENTS,
            "MERGE reads the log's event_ids",
        )
    )
    fixed_costs = price_small_delta_operations(spark, work / "scratch")
    spark.stop()

    job = ingest_job_process(work / "job_lake", list(workload.files), driver="own")
    rows.append(Row.of(f"ingest_job: a new process (Dagster, JVM start, {n_events:,} events)", job, n_events))
    job_warm = ingest_job_process(work / "job_lake_warm", list(workload.files), driver="warm")
    rows.append(
        Row.of(
            f"ingest_job: a new process on a warm driver ({n_events:,} events)",
            job_warm,
            n_events,
            "cpu s: the run process only",
        )
    )

    # SQLite runs after Spark has stopped: it uses one core, Spark had them all.
    _, parse = measure(lambda: sum(1 for _ in landing_events(workload.files)))
    result, sqlite = measure(lambda: load_events(work / "bel.db", landing_events(workload.files)))
    if (result.accepted, result.duplicates) != (n_events, 0):
        raise RuntimeError(f"SQLite load of {n_events:,} events: {result}; the figures would be meaningless")
    rows.append(
        Row.of(
            "SQLite load_events, one transaction (from the files)",
            sqlite,
            n_events,
            "1 core; json.loads of every line included",
        )
    )
    rows.append(Row.of("  of which reading the files + json.loads", parse, n_events))

    print_rows("Results (cpu s: this process tree; others: everyone else's meanwhile)", rows)
    report_ingest(f"The first ingest of {n_events:,} events", first)
    report_ingest(f"The warm ingest of {n_events:,} events", warm)
    print_rows("Per-batch fixed costs (warm JVM, small tables)", fixed_costs)
    if profile is not None:
        report_profile(profile, warm.usage, n_events)
    per_line = price_per_line(workload.files[0], LINES_TIMED_IN_PROCESS)
    print_rows(
        f"Price per line in one Python process, one core ({per_line[0].events:,} lines of {workload.files[0].name})",
        per_line,
    )
    report_verdict(first.usage, warm.usage, sqlite, n_events, args.cores)
    print(
        f"anchors: the warm ingest at {plain.wall / warm.usage.wall:.2f}x plain Spark JSON -> Parquet's speed "
        f"({n_events / plain.wall:,.0f} events/s; target: 1.00x or more); a whole ingest_job process at "
        f"{sqlite.wall / job.wall:.2f}x SQLite's load ({n_events / job.wall:,.0f} events/s; target: 1.00x or more); "
        f"on a warm driver, as a deployment's runs are, {sqlite.wall / job_warm.wall:.2f}x"
    )


def report_verdict(ingest: Usage, warm: Usage, sqlite: Usage, n_events: int, cores: int) -> None:
    """Events/s of both backends, their ratio and the target, by wall time and per CPU second (what
    the figures would be on a machine nobody else uses, near enough)."""
    print()
    for name, usage in (("Delta ingest", ingest), ("Delta, warm JVM", warm), ("SQLite load", sqlite)):
        print(
            f"{name:<16} {n_events / usage.wall:>9,.0f} events/s  ({n_events:,} events in {usage.wall:.1f} s; "
            f"{n_events / usage.cpu:,.0f} events per CPU s: {usage.cpu:.1f} CPU s ours, {usage.others:.1f} others')"
        )
    print(
        f"ratio Delta/SQLite  {sqlite.wall / ingest.wall:.2f} (wall), {sqlite.cpu / ingest.cpu:.2f} (per CPU s); "
        f"warm JVM: {sqlite.wall / warm.wall:.2f} (wall), {sqlite.cpu / warm.cpu:.2f} (per CPU s)"
    )
    best = min(ingest.wall, warm.wall)
    met = "MET" if n_events / best >= TARGET_EVENTS_PER_SECOND else "NOT MET"
    budget = cores * n_events / TARGET_EVENTS_PER_SECOND
    print(
        f"target {TARGET_EVENTS_PER_SECOND:,} events/s ({n_events / TARGET_EVENTS_PER_SECOND:.1f} s for {n_events:,} "
        f"events): {met}; the better ingest reached {n_events / best / TARGET_EVENTS_PER_SECOND:.0%} of it. It needs "
        f"{min(ingest.cpu, warm.cpu):.0f} CPU s; {cores} cores give {budget:.0f} CPU s in the target's time"
    )
    print(f"at end: {load_average()}")


if __name__ == "__main__":
    main(sys.argv[1:])
