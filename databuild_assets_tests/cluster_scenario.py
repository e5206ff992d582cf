"""One end-to-end lakehouse run, summarized as JSON: what test_spark_cluster.py compares between a
Spark standalone cluster and local mode, and test_object_store.py between a lake on S3 and one on disk.

It generates a small workload (with bad and redelivered lines) as three landing files, lands
and ingests two of them, builds the filtered log and the three projections, lands and ingests
the third and folds it into them (an incremental refresh, also on a log under the small-log
rule's 1 MiB), records one erasure, refreshes again, compacts, and asks the log as it was before
the erasure (time travel, which still hides the erased events). The
summary holds, per table, the row count and an order-independent checksum of every row (minus
the columns that hold the wall clock or the lake's own path), the sorted event_ids' hash, the
Delta versions, and what the engine was (master URL, executors), so two runs on different
engines can be compared with ==.

Run it in a process of its own (one SparkContext per process); the Spark resource is the
project's own LakehouseResource, pointed at the master given:

    python -m databuild_assets_tests.cluster_scenario --master spark://127.0.0.1:7077 --lake /tmp/lake
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing import IngestResult, ingest_landing_files
from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.erasure_report import erasure_report
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.landing_files import retain_landing_files
from databuild_assets.maintenance.tombstones import read_tombstones, request_erasure
from databuild_assets.maintenance.vacuum import vacuum_lake
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import RebuildRule, projection_spec
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.files import ObjectFiles
from databuild_assets.runtime.lake import EVENT_QUARANTINE, FILTERED_EVENT_LOG, RAW_EVENT_LOG, Lake, is_local
from databuild_assets.workload import write_landing_files

SUMMARY_PREFIX = "CLUSTER-SCENARIO-SUMMARY "


def scenario_command(master: str, lake: str, events: int, *options: str) -> list[str]:
    """The command that runs the scenario in a process of its own (`main`), with more options."""
    return [sys.executable, "-m", __name__, "--master", master, "--lake", lake, "--events", str(events), *options]


def printed_summary(output: str) -> dict:
    """The summary a scenario process printed, from its whole standard output."""
    [line] = [line for line in output.splitlines() if line.startswith(SUMMARY_PREFIX)]
    return json.loads(line.removeprefix(SUMMARY_PREFIX))


# The wall clock (when a row was written) differs between any two runs; nothing else may.
_CLOCK_COLUMNS = {"ingested_at", "quarantined_at"}


def table_digest(frame: DataFrame) -> dict:
    """Rows, and a checksum of every row that ignores row order and file layout."""
    columns = [c for c in frame.columns if c not in _CLOCK_COLUMNS]
    # source_file is an absolute path under the lake root: keep only the file's name.
    values = [F.element_at(F.split(F.col(c), "/"), -1).alias(c) if c == "source_file" else F.col(c) for c in columns]
    row_hash = F.xxhash64(F.to_json(F.struct(*values)))
    rows, checksum = frame.select(
        F.count(F.lit(1)), F.coalesce(F.sum(row_hash.cast("decimal(38,0)")), F.lit(0).cast("decimal(38,0)"))
    ).first()
    digest = {"rows": rows, "checksum": str(checksum)}
    if "event_id" in frame.columns:
        ids = sorted(row.event_id for row in frame.select("event_id").collect())
        digest["event_ids_sha256"] = hashlib.sha256("\n".join(ids).encode()).hexdigest()
    return digest


def lake_digest(spark: SparkSession, lake: Lake) -> dict:
    tables = {spec.name: lake.table_path(spec) for spec in (RAW_EVENT_LOG, FILTERED_EVENT_LOG, EVENT_QUARANTINE)}
    tables.update({name: lake.table_path(projection_spec(p)) for name, p in PROJECTIONS.items()})
    return {
        name: {**table_digest(spark.read.format("delta").load(path)), "version": current_version(spark, path)}
        for name, path in tables.items()
    }


def erasure_target(spark: SparkSession, lake: Lake) -> str:
    """A partition_ref to erase, chosen from the data alone: the first one the log names."""
    partitions = spark.read.format("delta").load(lake.table_path(projection_spec(PROJECTIONS["partition_state"])))
    return partitions.agg(F.min("partition_ref")).first()[0]


def engine(spark: SparkSession) -> dict:
    """What actually ran the work: the master, and the executors the driver knows of."""
    sc = spark.sparkContext
    executors = [info.host() + ":" + str(info.port()) for info in sc._jsc.sc().statusTracker().getExecutorInfos()]
    return {
        "master": sc.master,
        "app_id": sc.applicationId,
        "app_name": sc.appName,
        # getExecutorInfos lists the driver too: more than one entry means separate executor JVMs.
        "executor_infos": len(executors),
        # The jars the driver serves to executors (spark.jars): Delta's must be among them.
        "delta_jars_shipped": sorted(
            jar.rsplit("/", 1)[-1] for jar in sc._jsc.sc().listJars().mkString("\n").split("\n") if "delta" in jar
        ),
        "python_workers": sorted(
            set(sc.parallelize(range(4), 2).map(lambda _: __import__("sys").executable).collect())
        ),
    }


def land(lake: Lake, file: Path) -> None:
    """Drop a written landing file into the lake's landing folder, as a writer would: a rename
    on a local disk, an upload (the object appears whole) in a bucket."""
    if is_local(lake.root):
        landing = Path(lake.landing)
        landing.mkdir(parents=True, exist_ok=True)
        file.rename(landing / file.name)
        return
    with ObjectFiles().open_new(f"{lake.landing}/{file.name}") as out:
        out.write(file.read_bytes())
    file.unlink()


def run_scenario(spark: SparkSession, lake: Lake, n_events: int, seed: int = 7, vacuum: bool = False) -> dict:
    """The whole run on `spark` and `lake`; returns the summary (see the module docstring). With
    `vacuum`, it ends with landing retention and vacuum at retention 0 and the erasure report."""
    staging = Path(tempfile.mkdtemp(prefix="scenario-staging-"))  # the writer's side, outside the lake
    workload = write_landing_files(
        staging,
        n_events,
        seed=seed,
        events_per_file=math.ceil(n_events / 3),
        bad_line_rate=0.01,
        duplicate_rate=0.02,
    )
    *first_files, last_file = sorted(staging.glob("events-*.jsonl"))
    for file in first_files:
        land(lake, file)
    first = ingest_landing_files(spark, lake, settle_seconds=0)
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)

    land(lake, last_file)
    second = ingest_landing_files(spark, lake, settle_seconds=0)
    refresh_filtered_log(spark, lake)
    # The small-log rule would rebuild a log this small; the fold is what must work on a cluster.
    folded = refresh_all_projections(spark, lake, rule=RebuildRule(small_log_bytes=0))
    ingested = IngestResult(batches=first.batches + second.batches)
    before_erasure = lake_digest(spark, lake)

    erased = erasure_target(spark, lake)
    request_erasure(spark, lake, "partition_ref", erased, actor="cluster-test", reason="parity check")
    hidden = refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)
    compaction = compact(spark, lake)
    # Time travel to before the erasure, after its purge: the past view still hides the erased events.
    past = DeltaEventLog(spark, lake).as_of(version=before_erasure[RAW_EVENT_LOG.name]["version"])
    time_travel = dataclasses.asdict(past.get_activity_summary())
    tombstones = read_tombstones(spark, lake)
    finish = {}
    if vacuum:
        retained = retain_landing_files(spark, lake, 0, "archive")
        vacuumed = vacuum_lake(spark, lake, retention_hours=0, allow_short_retention=True)
        findings = erasure_report(spark, lake, tombstones)
        finish = {
            "landing_archived": len(retained.archived),
            "vacuumed_tables": sorted(t.table for t in vacuumed if t.files_deleted),
            "erasure_report": {
                "scanned": sorted({f.table for f in findings}),
                "rows_left": sum(f.rows_in_data_files for f in findings),
                "log_mentions": sum(f.delta_log_mentions for f in findings),
            },
        }

    return {
        "engine": engine(spark),
        "result": {
            "workload": {
                "events": workload.events_written,
                "bad_lines": workload.bad_lines_written,
                "duplicate_lines": workload.duplicate_lines_written,
                "lines": workload.lines_written,
            },
            "ingest": {
                "files": len(ingested.files),
                "lines_read": ingested.lines_read,
                "accepted": ingested.accepted,
                "duplicates": ingested.duplicates,
                "quarantined": ingested.quarantined,
            },
            "second_batch_refresh": {name: result.mode for name, result in sorted(folded.items())},
            "before_erasure": before_erasure,
            "erased_partition_ref": erased,
            "hidden_by_erasure": hidden.deleted,
            "compaction": {
                "rows_purged": {t.table: t.rows_purged for t in compaction.tables},
                "rows_purged_per_tombstone": sorted(compaction.rows_purged_per_tombstone.values()),
                "applied": len(compaction.applied),
            },
            "time_travel_before_erasure": time_travel,
            "tombstones": [[t.key, t.value, t.pending] for t in tombstones],  # lists: what JSON gives back
            "after_compaction": lake_digest(spark, lake),
            **finish,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", required=True, help="Spark master URL, e.g. spark://127.0.0.1:7077 or local[2]")
    parser.add_argument("--lake", required=True, help="lake root (an empty or missing folder, or s3a://bucket/prefix)")
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--app-name", default="databuild-cluster-scenario")
    parser.add_argument("--vacuum", action="store_true", help="end with retention and vacuum at 0, and the report")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value (repeatable)")
    args = parser.parse_args(argv)

    extra = dict(item.split("=", 1) for item in args.conf)
    resource = LakehouseResource(
        master=args.master,
        lake_root=args.lake,
        shuffle_partitions=2,
        driver_memory="1g",
        extra_spark_config={
            "spark.app.name": args.app_name,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **extra,
        },
    )
    spark = resource.spark_session
    spark.sparkContext.setLogLevel("ERROR")
    try:
        summary = run_scenario(spark, resource.lake, args.events, vacuum=args.vacuum)
    finally:
        spark.stop()
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True), flush=True)


if __name__ == "__main__":
    sys.exit(main())
