"""The anchors the ingestion target is measured against, on the same landing files in the same run:
plain Spark turning the JSON Lines into date-partitioned Parquet (no checks, no dedup, no Delta),
and a whole `ingest_job` run as a user starts it (a new process: Python, Dagster, the JVM).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.measuring import Usage, measure
from databuild_assets.events.schema import EVENT_SCHEMA
from databuild_assets.runtime import warm_driver

REPO = Path(__file__).resolve().parent.parent


def plain_spark_json_to_parquet(spark: SparkSession, paths: list[str], target: str) -> None:
    """Spark's JSON source with the event schema given, straight into Parquet partitioned by
    event_date: the data path of ingestion with nothing it guarantees (validation with reasons,
    quarantine, dedup by event_id, an exactly-once Delta commit)."""
    (
        spark.read.schema(EVENT_SCHEMA)
        .json(paths)
        .withColumn("event_date", F.expr("to_date(timestamp_micros(`timestamp` div 1000))"))
        .write.partitionBy("event_date")
        .parquet(target)
    )


def ingest_job_process(lake_root: Path, files: list[Path], driver: str = "own") -> Usage:
    """`dagster job execute -j ingest_job` in a new process on a fresh lake whose landing folder
    holds `files` (hard links): what one scheduled or sensor-requested ingestion costs, Python and
    Dagster included. Raises when the run fails.

    `driver="own"`: the run starts a JVM of its own (its start and first Delta jobs included).
    `driver="warm"`: the run attaches to a warm driver (runtime/warm_driver.py), as a deployment's
    runs do; the driver is started first by a run with nothing to ingest (not timed), lives in a
    folder of this call's own and is stopped at the end. Its CPU is not in the Usage (the driver
    is not the run's child), only the run process's."""
    landing = lake_root / "landing"
    landing.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="bench-dagster-home-") as dagster_home:
        (Path(dagster_home) / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        env = dict(
            os.environ,
            DATABUILD_LAKE_ROOT=str(lake_root),
            DAGSTER_HOME=dagster_home,
            DATABUILD_SPARK_DRIVER=driver,
            **{warm_driver.DRIVERS_DIR_ENV: str(Path(dagster_home) / "drivers")},
        )
        command = [sys.executable, "-m", "dagster", "job", "execute"]
        command += ["-m", "databuild_assets.definitions", "-j", "ingest_job"]

        def run(**overrides: str) -> subprocess.CompletedProcess:
            completed = subprocess.run(
                command, env={**env, **overrides}, cwd=REPO, capture_output=True, text=True, check=False
            )
            if completed.returncode != 0:
                raise RuntimeError(f"ingest_job failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
            return completed

        try:
            if driver == "warm":  # starts the driver, on a lake of its own: the timed run creates its tables
                run(DATABUILD_LAKE_ROOT=str(lake_root.parent / f"{lake_root.name}-driver-start"))
            for path in files:
                os.link(path, landing / path.name)
            _, usage = measure(run)
        finally:
            warm_driver.stop_hosts(Path(dagster_home) / "drivers", wait_s=60)  # before its folder goes
    return usage
