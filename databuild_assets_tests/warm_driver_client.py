"""A process of its own on the warm Spark driver (test_warm_driver starts it): it attaches, ingests
the lake's landing files, and prints what it did and which JVM did it as one JSON line.

    python -m databuild_assets_tests.warm_driver_client /tmp/lake [--hold]

With --hold it prints its line and then stays attached until it is killed (the crash case). With
--keep it also keeps a DataFrame of the lake's events in a module global until it exits, and
prints the id its gateway gave it; `--probe ID` attaches and prints whether ID is still bound.
"""

from __future__ import annotations

import json
import sys
import time

from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JError

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets.runtime.warm_driver import detach, warm_session

# Small, and the same in every client: one settings key, so one host for all of them.
SETTINGS = SparkSettings(
    master="local[2]", shuffle_partitions=2, driver_memory="1g", extra_config={"spark.ui.enabled": "false"}
)


KEPT = []  # what a run's module globals hold when its process exits


def main(lake_root: str, hold: bool, keep: bool) -> None:
    spark = warm_session(SETTINGS)
    lake = Lake(lake_root)
    result = ingest_landing_files(spark, lake)
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    line = {"jvm_pid": jvm_pid, "accepted": result.accepted, "files": len(result.files)}
    if keep:
        KEPT.append(spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)))
        line["kept"] = KEPT[0]._jdf._get_object_id()
    print(json.dumps(line), flush=True)
    if hold:
        time.sleep(600)
    detach()


def probe(object_id: str) -> None:
    spark = warm_session(SETTINGS)
    try:
        JavaObject(object_id, spark.sparkContext._gateway._gateway_client).hashCode()
        bound = True
    except Py4JError:
        bound = False
    print(json.dumps({"bound": bound}), flush=True)
    detach()


if __name__ == "__main__":
    if sys.argv[1] == "--probe":
        probe(sys.argv[2])
    else:
        main(sys.argv[1], "--hold" in sys.argv[2:], "--keep" in sys.argv[2:])
