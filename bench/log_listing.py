"""What a Spark snapshot of the raw log costs as its log folder fills, with Delta's store for local
disks and with ours (delta-jars/logstore, docs/decisions/0053-spark-lists-a-local-log-by-name.md).

    python -m bench.log_listing [--commits 1000 50000 200000]

For each size: a raw log of a few real appends, then that many commit files (commit info only, as
a folder the JVM-free appends fill one commit an append: 13 appends a second is ~47,000 an hour),
checkpointed every 10,000 and 20 commits before the end, as the appends keep it. Then the median of
three fresh snapshots (`DeltaLog.update` after clearing Delta's cache, the work every Spark run
does at its first read of the table) with each store, and delta-rs's open beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import deltalake

from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.runtime.delta_jars import LOCAL_LOG_STORE
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import build_spark_session
from databuild_assets.workload import generate_events

DELTA_S_STORE = "io.delta.storage.HDFSLogStore"
CHECKPOINT_EVERY = 10_000


def make_log(root: Path, commits: int) -> str:
    """A raw log of 20 appends padded to `commits` commit files, checkpointed as the appends do."""
    lake = Lake(str(root))
    events = list(generate_events(100, seed=41))
    with DeltaRsEventLog(lake) as log:
        for start in range(0, len(events), 5):
            log.append_events(events[start : start + 5])
    path = lake.table_path(RAW_EVENT_LOG)
    folder = Path(path) / "_delta_log"
    first = deltalake.DeltaTable(path).version() + 1
    for version in range(first, commits):
        info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE", "engineInfo": "bench"}}
        (folder / f"{version:020d}.json").write_text(json.dumps(info) + "\n")
        if version % CHECKPOINT_EVERY == 0 or version == commits - 20:
            deltalake.DeltaTable(path, version=version).create_checkpoint()
    return path


def spark_snapshot_s(spark, path: str, store: str) -> float:
    jvm = spark._jvm
    # Delta makes a DeltaLog's store from the SparkContext's conf, not the session's.
    spark.sparkContext._jsc.sc().conf().set("spark.delta.logStore.file.impl", store)
    times = []
    for _ in range(3):
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        started = time.perf_counter()
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).version()
        times.append(time.perf_counter() - started)
    used = delta_log.store().getDelegate(jvm.org.apache.hadoop.fs.Path(f"file:{path}/_delta_log"))
    assert used.logStoreImpl().getClass().getName() == store, used.logStoreImpl().getClass().getName()
    return statistics.median(times)


def delta_rs_open_s(path: str) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        deltalake.DeltaTable(path).version()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[1_000, 50_000, 200_000])
    args = parser.parse_args(argv)
    spark = build_spark_session()
    print(f"{'commit files':>12} | {'Spark, Delta store':>18} | {'Spark, ours':>11} | {'ratio':>5} | {'delta-rs':>8}")
    with tempfile.TemporaryDirectory(prefix="log-listing-") as work:
        for commits in args.commits:
            path = make_log(Path(work) / str(commits), commits)
            spark_snapshot_s(spark, path, LOCAL_LOG_STORE)  # warm: classes, the checkpoint's pages
            delta_s = spark_snapshot_s(spark, path, DELTA_S_STORE)
            ours = spark_snapshot_s(spark, path, LOCAL_LOG_STORE)
            files = len(list((Path(path) / "_delta_log").iterdir()))
            print(
                f"{files:>12,} | {delta_s:>16.2f} s | {ours:>9.2f} s | {delta_s / ours:>4.1f}x | "
                f"{delta_rs_open_s(path):>6.2f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
