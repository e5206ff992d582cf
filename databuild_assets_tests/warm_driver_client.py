"""A process of its own on the warm Spark driver (test_warm_driver starts it): it attaches, ingests
the lake's landing files, and prints what it did and which JVM did it as one JSON line.

    python -m databuild_assets_tests.warm_driver_client /tmp/lake [--hold]

With --hold it prints its line and then stays attached until it is killed (the crash case).
"""

from __future__ import annotations

import json
import sys
import time

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.runtime.lake import Lake
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets.runtime.warm_driver import detach, warm_session

# Small, and the same in every client: one settings key, so one host for all of them.
SETTINGS = SparkSettings(
    master="local[2]", shuffle_partitions=2, driver_memory="1g", extra_config={"spark.ui.enabled": "false"}
)


def main(lake_root: str, hold: bool) -> None:
    spark = warm_session(SETTINGS)
    result = ingest_landing_files(spark, Lake(lake_root))
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    print(json.dumps({"jvm_pid": jvm_pid, "accepted": result.accepted, "files": len(result.files)}), flush=True)
    if hold:
        time.sleep(600)
    detach()


if __name__ == "__main__":
    main(sys.argv[1], "--hold" in sys.argv[2:])
