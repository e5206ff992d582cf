"""A service's small files bin-packed three ways, on copies of one lake (decisions/0056).

    python -m bench.bin_pack [--appends 10000] [--workdir DIR]

Writes `--appends` 5-event appends through the JVM-free backend (one small Parquet file and one
commit each, as issue 43's service leaves them), then packs a copy of the raw log by each of:
Spark's OPTIMIZE (Delta 4.4, files under 64 MB, the driver already warm), `bin_pack_locally`
(pyarrow, our commit), and delta-rs's `optimize.compact` (its own commit). Prints each one's
seconds, files before and after, and whether every row is still there once. Then, on another
copy with one erasure pending, the whole `compact(open_days=0)` and its phases: the file-count
sensor's run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from itertools import islice
from pathlib import Path

import deltalake

from bench.soak_load import soak_stream
from databuild_assets.log import open_event_log
from databuild_assets.maintenance.compaction import PACKED_FILE_BYTES, compact
from databuild_assets.maintenance.local_bin_pack import bin_pack_locally
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session


def _copy(source: Path, target: Path) -> Lake:
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)
    return Lake(str(target))


def _ids(path: str) -> list[str]:
    return sorted(deltalake.DeltaTable(path).to_pyarrow_table(columns=["event_id"]).column(0).to_pylist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=10_000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-bin-pack-"))
    print(f"load average at start: {os.getloadavg()}; workdir {workdir}")
    source = Lake(str(workdir / "lake"))
    stream = soak_stream(7, args.appends * 5)
    started = time.perf_counter()
    with open_event_log(f"delta://{source.root}", writer="bench") as log:
        for _ in range(args.appends):
            log.append_events(list(islice(stream, 5)))
    print(f"{args.appends:,} appends of 5 events in {time.perf_counter() - started:.0f}s")
    expected = _ids(source.table_path(RAW_EVENT_LOG))

    spark = build_spark_session(SparkSettings(shuffle_partitions=2, extra_config={"spark.ui.enabled": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(1).count()  # the driver warm, as a run attached to the warm driver finds it

    def spark_optimize(path: str) -> None:
        from delta.tables import DeltaTable

        spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(PACKED_FILE_BYTES))
        DeltaTable.forPath(spark, path).optimize().executeCompaction()

    ways = {
        "Spark OPTIMIZE": spark_optimize,
        "bin_pack_locally (pyarrow)": lambda path: bin_pack_locally(path, None, PACKED_FILE_BYTES),
        "delta-rs optimize.compact": lambda path: deltalake.DeltaTable(path).optimize.compact(
            target_size=PACKED_FILE_BYTES
        ),
    }
    print(f"\n  {'bin-pack of raw_event_log':28} {'seconds':>8} {'files before':>13} {'after':>6}  rows kept once")
    for number, (name, pack) in enumerate(ways.items()):
        path = _copy(Path(source.root), workdir / f"copy-{number}").table_path(RAW_EVENT_LOG)
        before = len(deltalake.DeltaTable(path).file_uris())
        started = time.perf_counter()
        pack(path)
        seconds = time.perf_counter() - started
        after = len(deltalake.DeltaTable(path).file_uris())
        print(f"  {name:28} {seconds:8.1f} {before:13,} {after:6,}  {_ids(path) == expected}")

    lake = _copy(Path(source.root), workdir / "copy-compact")
    victim = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).to_pyarrow_table(columns=["build_request_id"])[0][0]
    request_erasure(spark, lake, "build_request_id", victim.as_py(), actor="bench", reason="benchmark purge")
    started = time.perf_counter()
    result = compact(spark, lake, open_days=0)
    seconds = time.perf_counter() - started
    print(f"\ncompact(open_days=0), one erasure pending: {seconds:.1f}s; phases {result.phase_seconds}")
    print(f"load average at end: {os.getloadavg()}")
    spark.stop()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
