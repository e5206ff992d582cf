"""The SparkSession the lakehouse runs on: Delta's extensions and jars, UTC, sized for the machine.

`spark_config()` is plain data, so the Dagster resource, the CLI, the tests and the benchmarks
all start Spark the same way; the master URL decides whether that is local or a cluster.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from dagster_pyspark.resources import spark_session_from_config
from pyspark.sql import SparkSession

from databuild_assets.runtime.delta_jars import delta_jar_paths

DEFAULT_MASTER = "local[*]"


@dataclass(frozen=True)
class SparkSettings:
    """What varies between a laptop, CI and a cluster. `extra_config` wins over everything."""

    master: str = DEFAULT_MASTER
    app_name: str = "databuild-assets"
    # Spark's default of 200 shuffle partitions is for clusters; on 2-8 local cores it mostly
    # schedules empty tasks. Raise it on a cluster (or let AQE coalesce).
    shuffle_partitions: int = 8
    driver_memory: str = "4g"
    extra_config: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "SparkSettings":
        """Settings from DATABUILD_SPARK_MASTER, DATABUILD_SPARK_SHUFFLE_PARTITIONS,
        DATABUILD_SPARK_DRIVER_MEMORY and DATABUILD_SPARK_CONF ("key=value,key=value")."""
        return cls(
            master=environ.get("DATABUILD_SPARK_MASTER", DEFAULT_MASTER),
            shuffle_partitions=int(environ.get("DATABUILD_SPARK_SHUFFLE_PARTITIONS", cls.shuffle_partitions)),
            driver_memory=environ.get("DATABUILD_SPARK_DRIVER_MEMORY", cls.driver_memory),
            extra_config=parse_conf_pairs(environ.get("DATABUILD_SPARK_CONF", "")),
        )


def parse_conf_pairs(text: str) -> dict[str, str]:
    """`"a=1,b=2"` -> {"a": "1", "b": "2"}; a pair without "=" is an error that names it."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"DATABUILD_SPARK_CONF: {item!r} is not key=value (pairs are separated by commas)")
        pairs[key.strip()] = value.strip()
    return pairs


def spark_config(settings: SparkSettings) -> dict[str, str]:
    """The full Spark configuration for `settings`, Delta included."""
    config = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.memory": settings.driver_memory,
        "spark.jars": ",".join(delta_jar_paths()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Event dates (the log's partitions) are UTC days, whatever the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        # Delta reads its log with this many partitions (default 50): small tables, small number.
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
        # Delta's VACUUM lists a table's files with this many tasks (Spark's default: 10,000).
        # Sized like the shuffle; on a cluster raise both.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(settings.shuffle_partitions),
        "spark.ui.showConsoleProgress": "true",
    }
    config.update(settings.extra_config)
    return config


def build_spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Start (or reuse) the process's SparkSession with Delta configured.

    Static settings (master, driver memory, jars) only take effect for the first session of a
    process; later calls return that session, as Spark itself does.
    """
    settings = settings or SparkSettings()
    if settings.master.startswith("local"):
        # Python workers must import this package and pyarrow, so they must run the driver's
        # interpreter (the venv), not the first `python3` on PATH. Local-mode pyspark reads
        # only this variable (pyspark/core/context.py); a cluster configures its own.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return spark_session_from_config(spark_config(settings))
