"""The phase profile of `bench.ingest`: the ingest pipeline cut after each phase on the same files
(each on top of the lines persisted as `write_batch` persists them), and what-if timings of
alternatives to each phase, so that a slow ingest comes with the numbers that say where its time
goes (`bench.ingest`'s docstring, steps 4 and 5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bench.measuring import (
    Row,
    Usage,
    evaluate,
    measure,
    print_rows,
)
from databuild_assets.ingest.dedup import first_of_each_event_id, merge_new_events
from databuild_assets.ingest.landing import events_from_lines, events_from_read_lines
from databuild_assets.ingest.landing_folder import LandingFile
from databuild_assets.ingest.lines import read_landing_lines, read_raw_lines
from databuild_assets.runtime.delta_tables import ensure_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG

_MERGE_REPARTITION = "spark.databricks.delta.merge.repartitionBeforeWrite.enabled"
_DELTA_COLLECT_STATS = "spark.databricks.delta.stats.collect"

T = TypeVar("T")


@dataclass(frozen=True)
class PhaseProfile:
    """What the ingest pipeline costs when cut after each phase, on the same files (cumulative)."""

    read_tasks: int
    read_validate: Usage  # read_landing_lines(...).count(): text source + mapInArrow in Python workers
    read_validate_persist: Usage  # the same, persisted as write_batch does
    scan_cached: Usage  # the good lines, from the cache
    parse: Usage  # + events_from_read_lines (the workers' typed columns, event_date)
    dedup: Usage  # + first_of_each_event_id (shuffle and sort of the keys, anti-join)
    parquet: Usage  # + plain Parquet write, partitioned by event_date
    delta_append: Usage  # + Delta append into an empty raw log instead (stats, commit)
    delta_merge: Usage  # + merge_new_events into an empty raw log, as ingestion does
    alternatives: tuple[Row, ...]


def profile_phases(spark: SparkSession, scratch: Path, landing_files: list[LandingFile], n_events: int) -> PhaseProfile:
    """Run the ingest pipeline on `landing_files` phase by phase, each on top of the cached lines."""
    paths = [landing_file.path for landing_file in landing_files]
    lines = read_landing_lines(spark, paths)
    read_tasks = lines.rdd.getNumPartitions()
    _, read_validate = measure(lines.count)
    # Before the lines are cached: Spark would answer a plan equal to theirs from the cache.
    alternatives = read_alternatives(spark, landing_files, n_events, read_validate)
    lines.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        _, read_validate_persist = measure(lines.count)
        good_lines = lines.where("reason IS NULL")
        _, scan_cached = measure(lambda: evaluate(good_lines))
        events = events_from_read_lines(good_lines)
        _, parse = measure(lambda: evaluate(events))
        unique_events = first_of_each_event_id(events)
        _, dedup = measure(lambda: evaluate(unique_events))
        parquet_path = str(scratch / "plain_parquet")
        _, parquet = measure(lambda: unique_events.write.partitionBy("event_date").parquet(parquet_path))

        def fresh_raw_log(name: str) -> str:
            path = str(scratch / name)
            ensure_table(spark, path, RAW_EVENT_LOG)
            return path

        append_path = fresh_raw_log("delta_append")
        _, delta_append = measure(lambda: unique_events.write.format("delta").mode("append").save(append_path))
        merge_path = fresh_raw_log("delta_merge")
        _, delta_merge = measure(lambda: merge_new_events(spark, merge_path, unique_events))

        alternatives += pipeline_alternatives(
            spark,
            events,
            unique_events,
            n_events,
            fresh_raw_log,
            dedup=dedup,
            delta_append=delta_append,
            delta_merge=delta_merge,
        )
        alternatives += jvm_only_alternatives(
            spark, paths, n_events, fresh_raw_log, python_pipeline=read_validate_persist + delta_merge
        )
    finally:
        lines.unpersist()
    return PhaseProfile(
        read_tasks,
        read_validate,
        read_validate_persist,
        scan_cached,
        parse,
        dedup,
        parquet,
        delta_append,
        delta_merge,
        alternatives,
    )


def split_without_validation(spark: SparkSession, paths: list[str]) -> DataFrame:
    """`read_landing_lines` with every line taken as good: validation's cost by difference."""
    return read_landing_lines(spark, paths, validate=lambda raw: (None, None), first_pass=None)


def lines_through_python(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The landing files' lines (split by Spark's text source) to the Python workers and a length
    back: the floor of the read phase."""

    def lengths(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"length": [len(raw) for raw in batch.column("raw").to_pylist()]})

    return read_raw_lines(spark, paths).select("raw").mapInArrow(lengths, "length long")


def with_conf(spark: SparkSession, key: str, value: str, action: Callable[[], T]) -> T:
    spark.conf.set(key, value)
    try:
        return action()
    finally:
        spark.conf.unset(key)


def read_alternatives(
    spark: SparkSession, landing_files: list[LandingFile], n_events: int, read_validate: Usage
) -> tuple[Row, ...]:
    """What the read phase costs without validation, without splitting, and with another task size."""
    paths = [landing_file.path for landing_file in landing_files]
    _, bytes_only = measure(lambda: read_raw_lines(spark, paths).selectExpr("sum(length(raw))").first())
    _, through_python = measure(lines_through_python(spark, paths).count)
    _, split_only = measure(split_without_validation(spark, paths).count)
    # Spark packs files into one read task up to maxPartitionBytes (128 MB); at the largest
    # file's size, each task reads one file.
    largest_file = max(landing_file.size for landing_file in landing_files)
    _, one_file_per_task = measure(
        lambda: with_conf(
            spark,
            "spark.sql.files.maxPartitionBytes",
            str(largest_file),
            lambda: read_landing_lines(spark, paths).count(),
        )
    )
    return (
        Row.of("read and split the lines in the JVM only (text source)", bytes_only, n_events),
        Row.of("+ lines to Python workers and back", through_python, n_events),
        Row.of(
            "+ number the lines, no validation",
            split_only,
            n_events,
            f"validation = {read_validate.wall - split_only.wall:.2f} s, "
            f"{(read_validate.cpu - split_only.cpu) / n_events * 1e6:.1f} CPU µs/line",
        ),
        Row.of(
            "read + split + validate, one file per task",
            one_file_per_task,
            n_events,
            f"maxPartitionBytes={largest_file:,}; vs {read_validate.wall:.2f} s as configured",
        ),
    )


def first_of_each_event_id_whole_rows(events: DataFrame) -> DataFrame:
    """`first_of_each_event_id` as it was before the keys-only dedup: a window over whole rows,
    so every row is shuffled and sorted. The same rows survive."""
    first = Window.partitionBy("event_id").orderBy("source_file", "source_line")
    return events.withColumn("_rank", F.row_number().over(first)).where("_rank = 1").drop("_rank")


def pipeline_alternatives(
    spark: SparkSession,
    events: DataFrame,
    unique_events: DataFrame,
    n_events: int,
    fresh_raw_log: Callable[[str], str],
    *,
    dedup: Usage,
    delta_append: Usage,
    delta_merge: Usage,
) -> tuple[Row, ...]:
    """What-if timings after the read phase, each on the same cached lines as the phase it would replace."""
    _, whole_rows_dedup = measure(lambda: evaluate(first_of_each_event_id_whole_rows(events)))
    no_repartition_path = fresh_raw_log("delta_merge_no_repartition")
    _, merge_no_repartition = measure(
        lambda: with_conf(
            spark, _MERGE_REPARTITION, "false", lambda: merge_new_events(spark, no_repartition_path, unique_events)
        )
    )
    configured = int(spark.conf.get("spark.sql.shuffle.partitions"))
    cores = spark.sparkContext.defaultParallelism
    other = cores if configured != cores else 2 * cores
    other_partitions_path = fresh_raw_log("delta_merge_other_partitions")
    _, merge_other_partitions = measure(
        lambda: with_conf(
            spark,
            "spark.sql.shuffle.partitions",
            str(other),
            lambda: merge_new_events(spark, other_partitions_path, unique_events),
        )
    )
    no_stats_path = fresh_raw_log("delta_append_no_stats")
    _, append_no_stats = measure(
        lambda: with_conf(
            spark,
            _DELTA_COLLECT_STATS,
            "false",
            lambda: unique_events.write.format("delta").mode("append").save(no_stats_path),
        )
    )
    return (
        Row.of(
            "scan + parse + dedup by a window over whole rows",
            whole_rows_dedup,
            n_events,
            f"vs {dedup.wall:.2f} s shuffling the keys only, as ingestion does",
        ),
        Row.of(
            "MERGE, repartitionBeforeWrite off",
            merge_no_repartition,
            n_events,
            f"vs {delta_merge.wall:.2f} s MERGE as configured",
        ),
        Row.of(
            f"MERGE with {other} shuffle partitions",
            merge_other_partitions,
            n_events,
            f"vs {delta_merge.wall:.2f} s with {configured} ({cores} cores)",
        ),
        Row.of(
            "Delta append, no file statistics",
            append_no_stats,
            n_events,
            f"vs {delta_append.wall:.2f} s append with statistics",
        ),
    )


def lines_without_python(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The landing files' lines read by the JVM alone (Spark's text source): no validation, and an
    increasing id instead of the line number. The floor of a pipeline that leaves Python out."""
    return spark.read.text(paths).select(
        F.input_file_name().alias("source_file"),
        F.monotonically_increasing_id().alias("line_number"),
        F.col("value").alias("line"),
    )


def jvm_only_alternatives(
    spark: SparkSession, paths: list[str], n_events: int, fresh_raw_log: Callable[[str], str], *, python_pipeline: Usage
) -> tuple[Row, ...]:
    """How fast the data path is without the Python workers: the JVM reads the lines, from_json
    parses them, and Delta appends them, with and without the dedup window."""
    events = events_from_lines(lines_without_python(spark, paths))
    deduplicated_path, appended_path = fresh_raw_log("jvm_only_dedup"), fresh_raw_log("jvm_only_append")
    _, deduplicated = measure(
        lambda: first_of_each_event_id(events).write.format("delta").mode("append").save(deduplicated_path)
    )
    _, appended = measure(lambda: events.write.format("delta").mode("append").save(appended_path))
    reference = f"vs {python_pipeline.wall:.2f} s, {python_pipeline.cpu:.1f} CPU s for a + a' + the MERGE pipeline"
    return (
        Row.of("JVM only: text + from_json + dedup + Delta append", deduplicated, n_events, reference),
        Row.of("JVM only: text + from_json + Delta append", appended, n_events, "no dedup, no validation"),
    )


def report_profile(profile: PhaseProfile, ingest: Usage, n_events: int) -> None:
    p = profile
    rows = [
        Row.of(
            "a. read files + split + validate lines (Python workers)",
            p.read_validate,
            n_events,
            f"{p.read_tasks} read tasks; read_landing_lines(...).count()",
        ),
        Row.of(
            "a'. persist the lines (MEMORY_AND_DISK)",
            p.read_validate_persist - p.read_validate,
            n_events,
            "write_batch persists them: the merge reads them again",
        ),
        Row.of("   scan the cached good lines", p.scan_cached, n_events),
        Row.of("b. typed event columns + event_date", p.parse - p.scan_cached, n_events, "events_from_read_lines"),
        Row.of("c. dedup (keys shuffled, anti-join)", p.dedup - p.parse, n_events, "first_of_each_event_id"),
        Row.of(
            "d. Parquet write (partitioned by event_date)", p.parquet - p.dedup, n_events, "plain Parquet, scratch path"
        ),
        Row.of(
            "e1. Delta append over Parquet (stats + commit)",
            p.delta_append - p.parquet,
            n_events,
            "append into an empty raw log",
        ),
        Row.of(
            "e2. MERGE over append", p.delta_merge - p.delta_append, n_events, "merge_new_events into an empty raw log"
        ),
        Row.of(
            "f. the rest: batch bookkeeping, and noise",
            ingest - p.read_validate_persist - p.delta_merge,
            None,
            "warm ingest - (a + a' + the MERGE pipeline)",
        ),
    ]
    print_rows(
        f"Phase profile (the same files into fresh lakes; increments; share of the warm ingest's {ingest.wall:.1f} s)",
        rows,
        total_seconds=ingest.wall,
    )
    print(f"  the MERGE pipeline alone (scan cached lines .. commit): {p.delta_merge.wall:.2f} s")
    print_rows("Alternatives (what-if)", p.alternatives)
