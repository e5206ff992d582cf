"""A small landing file's ingestion on long histories: the key lookup against the MERGE (issue 30).

    python -m bench.small_batches --lake /var/tmp/bench-check-1000000/lake --lake /var/tmp/lake-10m

For each lake in turn, in one Spark session (full JIT tiers, as the warm driver's): the lake's
serving index brought to the raw log's latest version (timed apart: what the pipeline's
serving_index asset does after each run), one warm-up file by each path, then `--files` rounds,
each a landing file of 40 events (36 new, and 4 event ids the log holds, redelivered a day later)
ingested with `ingest_landing_files` by the key lookup, then another such file by a MERGE on
event_id (the way a batch goes without a followable index), the order turning each round. After
each file the serving index is caught up untimed, as a landing run's serving_index step does.
Prints per lake and path the median, min and max seconds of the whole `ingest_landing_files`
(ledger plan, read, dedup, commit, record), and the ratio of the largest lake's median to the
smallest's. Every file adds 36 events to the lake given; it refuses to report a time for a file
that did not add exactly 36.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import deltalake
import pyarrow.parquet as pq

from bench.measuring import load_average
from databuild_assets.ingest import dedup
from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.runtime.delta_local import with_columns
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload.encoding import encode_json

NEW, REDELIVERED = 36, 4
DAY_NS = 86_400 * 10**9
PATHS = ("key lookup", "merge")


def events_in(lake: Lake) -> int:
    actions = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).get_add_actions(flatten=True)
    return int(sum(actions.column("num_records").to_pylist()))


def some_stored_events(lake: Lake, n: int) -> list[dict]:
    """`n` events of the raw log, as a landing file would carry them."""
    table = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG))
    first_file = sorted(table.file_uris())[0]  # the same file each run
    columns = ["event_id", "timestamp", "build_request_id", "event_type", "partition_event"]
    with pq.ParquetFile(first_file.removeprefix("file://")) as file:  # a small append's file may lack some
        rows = with_columns(file.read(columns=columns), columns).slice(0, 200).to_pylist()
    rows = [row for row in rows if row["event_type"] == "partition_event"][:n]
    return [_without_nulls(row) for row in rows]


def _without_nulls(value):
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return value


def landing_file(folder: Path, stored: list[dict]) -> Path:
    """40 events: 36 new partition events, the `stored` ones a day later."""
    name = uuid.uuid4().hex
    lines = [
        {
            "event_id": f"bench-{name}-{i}",
            "timestamp": time.time_ns(),
            "build_request_id": f"bench-br-{name}",
            "event_type": "partition_event",
            "partition_event": {"partition_ref": f"bench/{name}/{i}", "status_code": 2},
        }
        for i in range(NEW)
    ] + [{**event, "timestamp": event["timestamp"] + DAY_NS} for event in stored]
    path = folder / f"{name}.jsonl"
    path.write_text("".join(encode_json(line) + "\n" for line in lines))
    return path


def ingest_one(spark, lake: Lake, folder: Path, stored: list[dict], path: str) -> float:
    landing_file(folder, stored)
    limit = dedup.KEY_LOOKUP_LIMIT
    dedup.KEY_LOOKUP_LIMIT = limit if path == "key lookup" else 0
    try:
        start = time.perf_counter()
        result = ingest_landing_files(spark, lake, landing=str(folder), settle_seconds=0)
        seconds = time.perf_counter() - start
    finally:
        dedup.KEY_LOOKUP_LIMIT = limit
    if (result.lines_read, result.accepted, result.duplicates) != (NEW + REDELIVERED, NEW, REDELIVERED):
        raise SystemExit(f"{lake.root}: expected {NEW} events added and {REDELIVERED} duplicates: {result}")
    refresh_serving_index(lake)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", action="append", required=True, help="a lake root (repeat: smallest first)")
    parser.add_argument("--files", type=int, default=5, help="measured files per path and lake")
    args = parser.parse_args()

    settings = SparkSettings(
        app_name="bench-small-batches",
        driver_memory="4g",
        extra_config={"spark.ui.showConsoleProgress": "false"},
        long_lived=True,
    )
    spark = build_spark_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    print(load_average())
    medians: dict[tuple[str, str], float] = {}
    for root in args.lake:
        lake = Lake(root)
        start = time.perf_counter()
        status = refresh_serving_index(lake)
        print(
            f"\n{root}: {events_in(lake):,} events; serving index caught up in {time.perf_counter() - start:.1f} s "
            f"({status.bytes / 2**30:.1f} GiB)"
        )
        stored = some_stored_events(lake, REDELIVERED)
        with tempfile.TemporaryDirectory(prefix="bench-small-batches-") as folder:
            for path in PATHS:
                ingest_one(spark, lake, Path(folder), stored, path)  # warm-up
            times: dict[str, list[float]] = {path: [] for path in PATHS}
            for round_ in range(args.files):
                for path in PATHS if round_ % 2 == 0 else PATHS[::-1]:
                    times[path].append(ingest_one(spark, lake, Path(folder), stored, path))
        for path in PATHS:
            medians[root, path] = statistics.median(times[path])
            print(
                f"  {path:<11} median {medians[root, path]:5.2f} s  min {min(times[path]):5.2f}  "
                f"max {max(times[path]):5.2f}  ({', '.join(f'{t:.2f}' for t in times[path])})"
            )
    if len(args.lake) > 1:
        small, large = args.lake[0], args.lake[-1]
        print()
        for path in PATHS:
            print(f"{path}: {large} / {small} = {medians[large, path] / medians[small, path]:.2f}x")
    print(load_average())
    print(json.dumps({f"{root}|{path}": round(value, 3) for (root, path), value in medians.items()}))
    spark.stop()


if __name__ == "__main__":
    main()
