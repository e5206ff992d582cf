"""Incremental refresh of the projections on copies of existing lakes (issue 30's scale targets).

    python -m bench.refresh_at_scale --lake /var/tmp/bench-check-1000000/lake --lake /var/tmp/lake-10m

For each lake in turn: copies its tables to a scratch folder (data files hard-linked, the Delta
logs copied, so the lake itself is not touched), then in one Spark session with the full JIT
tiers appends 1,000 generated events and refreshes the filtered log and the three projections
(untimed: it warms the JVM and brings the copy up to date, a full rebuild when the lake's last
commits removed data), then times the same refreshes after appending 10,000 events, 100,000
events and 10,000 events again (new build requests, a few days after the lake's events), and last
a full rebuild of the three. Prints each refresh's seconds, its modes and keys, and its ratio to
the full rebuild (issue 30: a +1% refresh at most 10% of a rebuild; the same 10,000 events at 10M
at most 1.2x their time at 1M). `--keep` leaves the copies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path

import deltalake
import pyarrow as pa

from bench.lakes import link_tables
from bench.measuring import load_average
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
from databuild_assets.workload import generate_events

DAY_NS = 86_400 * 10**9
BATCHES = (("warm-up", 1_000), ("+10,000", 10_000), ("+100,000", 100_000), ("+10,000 again", 10_000))


def copy_lake(source: str, target: str) -> Lake:
    """The lake's tables under `target`, data files hard-linked (`bench.lakes.link_tables`)."""
    shutil.rmtree(target, ignore_errors=True)
    link_tables(Path(source), Path(target))
    return Lake(target)


def events_after(lake: Lake, n: int, seed: int, days_later: int) -> list[dict]:
    """`n` new events over one day, `days_later` days after the lake's newest event."""
    actions = pa.table(deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).get_add_actions(flatten=True))
    newest = max(actions.column("max.timestamp").to_pylist())
    return list(islice(generate_events(n, seed=seed, days=1, start_ns=newest + days_later * DAY_NS), n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", action="append", required=True, help="a lake root (repeat: smallest first)")
    parser.add_argument("--workdir", default=None, help="where the copies go (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-refresh-at-scale-", dir="/var/tmp")
    spark = build_spark_session(
        SparkSettings(
            app_name="bench-refresh-at-scale",
            long_lived=True,
            extra_config={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(load_average())
    for number, source in enumerate(args.lake):
        lake = copy_lake(source, os.path.join(workdir, f"lake-{number}"))
        events = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).get_add_actions(flatten=True)
        print(f"\n{source}: {sum(pa.table(events).column('num_records').to_pylist()):,} events")
        timings = {}
        for step, (label, n) in enumerate(BATCHES):
            append_events(spark, lake, events_after(lake, n, seed=100 + step, days_later=2 + 2 * step), writer="bench")
            start = time.perf_counter()
            filtered = refresh_filtered_log(spark, lake)
            middle = time.perf_counter()
            results = refresh_all_projections(spark, lake)
            timings[label] = time.perf_counter() - middle
            modes = ", ".join(f"{r.projection} {r.mode} {r.keys_refreshed:,}" for r in results.values())
            print(f"  {label:14} filtered log {middle - start:5.1f} s ({filtered.mode}); projections "
                  f"{timings[label]:5.1f} s ({modes})")  # fmt: skip
        start = time.perf_counter()
        refresh_all_projections(spark, lake, full=True)
        full = time.perf_counter() - start
        print(f"  {'full rebuild':14} projections {full:5.1f} s")
        for label, _ in BATCHES[1:]:
            print(f"  {label:14} {timings[label] / full:6.1%} of the full rebuild")
        print(load_average())
    spark.stop()
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
