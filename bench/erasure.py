"""One erasure on a long history: what hiding and purging one build request costs (issue 30).

    python -m bench.erasure --lake /var/tmp/lake-10m

Erases, for good, one build request of the lake given (the first build request of its first data
file, or `--build-request`), in one Spark session with the full JIT tiers, and times the steps
`erase_job` runs (the tombstone, the filtered log's refresh, the projections' refresh, the serving
index) and then `compact` (what `compaction_job` runs before its Dagster storage scrub), then the
next landing file's refreshes (40 new events: the filtered log, the projections and the serving
index after the purge). The package's own progress lines are printed with their times, so
compact's phases can be read off them. Prints per event table the rows purged and the files its
purge rewrote of the files it had.
"""

from __future__ import annotations

import argparse
import logging
import time

import deltalake
import pyarrow.parquet as pq

from bench.measuring import load_average
from bench.refresh_at_scale import events_after
from databuild_assets.ingest.writer import append_events
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings, build_spark_session


def first_build_request(lake: Lake) -> str:
    first_file = sorted(deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).file_uris())[0]
    return pq.read_table(first_file, columns=["build_request_id"]).column(0)[0].as_py()


ERASE_JOB_STEPS = ("tombstone", "filtered log refresh", "projections refresh", "serving index")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", required=True, help="a lake root: one build request of it is erased for good")
    parser.add_argument("--build-request", help="the build request to erase (default: see above)")
    args = parser.parse_args()
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("databuild_assets").setLevel(logging.INFO)

    lake = Lake(args.lake)
    spark = build_spark_session(
        SparkSettings(
            app_name="bench-erasure",
            driver_memory="4g",
            long_lived=True,
            extra_config={"spark.ui.showConsoleProgress": "false"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    build_request = args.build_request or first_build_request(lake)
    raw = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    print(load_average())
    print(
        f"{lake.root}: {raw.count():,} events; erasing build request {build_request} "
        f"({raw.where(raw.build_request_id == build_request).count()} events)"
    )

    steps = {}

    def timed(name: str, action) -> object:
        start = time.perf_counter()
        result = action()
        steps[name] = time.perf_counter() - start
        print(f"  {name}: {steps[name]:.1f} s")
        return result

    timed("tombstone", lambda: request_erasure(spark, lake, "build_request_id", build_request, "bench", "bench"))
    timed("filtered log refresh", lambda: refresh_filtered_log(spark, lake))
    timed("projections refresh", lambda: refresh_all_projections(spark, lake))
    timed("serving index", lambda: refresh_serving_index(lake))
    result = timed("compact", lambda: compact(spark, lake))
    for table in result.tables:
        if table.rows_purged or table.files_rewritten:
            print(
                f"  {table.table}: {table.rows_purged} rows purged, {table.files_rewritten} of "
                f"{table.before.num_files} files rewritten, {table.files_compacted} files compacted"
            )
    erase_job = sum(seconds for name in ERASE_JOB_STEPS if (seconds := steps.get(name)) is not None)
    print(f"erase_job's steps {erase_job:.1f} s; compact {steps['compact']:.1f} s")
    # The next landing file's run after the purge: 40 new events, as ingestion appends them.
    append_events(spark, lake, events_after(lake, 40, seed=int(time.time()), days_later=2), writer="bench")
    timed("next landing: filtered log", lambda: refresh_filtered_log(spark, lake))
    timed("next landing: projections", lambda: refresh_all_projections(spark, lake))
    timed("next landing: serving index", lambda: refresh_serving_index(lake))  # the purge's commits too
    print(load_average())
    spark.stop()


if __name__ == "__main__":
    main()
