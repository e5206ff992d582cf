"""The lakehouse resource: one SparkSession configured for Delta, and the lake root."""

from __future__ import annotations

import os
from typing import Any, Literal

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from databuild_assets.runtime import warm_driver
from databuild_assets.runtime.lake import DEFAULT_LAKE_ROOT, Lake
from databuild_assets.runtime.object_store import is_s3
from databuild_assets.runtime.spark import (
    DEFAULT_MASTER,
    SparkSettings,
    build_spark_session,
    starts_own_jvm,
    stop_own_jvm,
)

DRIVER_ENV = "DATABUILD_SPARK_DRIVER"
IDLE_ENV = "DATABUILD_SPARK_DRIVER_IDLE_MINUTES"


class LakehouseResource(LazyPySparkResource):
    """Spark with Delta, started on first use (a sensor that finds nothing new starts no JVM): a
    JVM of this process's own, or a session on the warm driver that a deployment's runs share
    (`driver="warm"`, runtime/warm_driver.py), which a run detaches from when it ends.

    Built on dagster-pyspark's LazyPySparkResource: `spark_config` is computed from the typed
    fields below, so the master URL and the lake root are all a deployment changes to move
    from this machine to a cluster and object storage.
    """

    master: str = Field(
        default=DEFAULT_MASTER, description="Spark master URL: local[*], spark://host:7077, yarn, k8s://..."
    )
    lake_root: str = Field(
        default=DEFAULT_LAKE_ROOT, description="Root of the lake: a local folder or s3a://bucket/prefix."
    )
    shuffle_partitions: int = Field(default=8, description="spark.sql.shuffle.partitions; raise it on a cluster.")
    driver_memory: str = Field(default="4g", description="spark.driver.memory (local mode: all of Spark's memory).")
    extra_spark_config: dict[str, str] = Field(default_factory=dict, description="Any other Spark settings; they win.")
    driver: Literal["own", "warm", "auto"] = Field(
        default="own",
        description="own: this process starts its own JVM. warm: it attaches to a long-lived driver "
        "shared by every process with the same settings and code (runtime/warm_driver.py). auto: warm "
        "for the runs Dagster's run launcher starts (daemon, UI: a process each) and for sensors, own "
        "for a job executed in the caller's process (execute_in_process, `dagster job execute`).",
    )
    driver_idle_minutes: float = Field(
        default=warm_driver.DEFAULT_IDLE_MINUTES,
        description="A warm driver stops after this long with nobody attached.",
    )
    spark_config: dict[str, Any] = Field(
        default_factory=dict, description="Computed from the fields above; leave empty."
    )
    # Chosen from `driver` when Dagster sets the resource up for a run or a sensor; outside Dagster
    # (no run known) auto means warm, as for a sensor.
    _warm: bool | None = PrivateAttr(default=None)
    _in_process: bool = PrivateAttr(default=False)  # a run executed in the caller's process
    _started_jvm: bool = PrivateAttr(default=False)  # this resource started the process's JVM

    @classmethod
    def from_env(cls) -> LakehouseResource:
        """Defaults, overridden by DATABUILD_SPARK_MASTER, DATABUILD_LAKE_ROOT,
        DATABUILD_SPARK_SHUFFLE_PARTITIONS, DATABUILD_SPARK_DRIVER_MEMORY and DATABUILD_SPARK_CONF.
        DATABUILD_SPARK_DRIVER (default auto): a deployment's runs (one process each) use the warm
        driver, a job executed in a script's process a JVM of its own, gone with that process
        (`own` or `warm` choose one for all); DATABUILD_SPARK_DRIVER_IDLE_MINUTES sets how long the
        warm driver outlives its last run."""
        settings = SparkSettings.from_env()
        driver = os.environ.get(DRIVER_ENV, "auto")
        if driver not in ("own", "warm", "auto"):
            raise ValueError(
                f"{DRIVER_ENV}={driver!r}: use auto (the warm driver for launched runs only), own (a JVM per "
                "process) or warm (one shared driver)"
            )
        return cls(
            master=settings.master,
            lake_root=Lake.from_env().root,
            shuffle_partitions=settings.shuffle_partitions,
            driver_memory=settings.driver_memory,
            extra_spark_config=dict(settings.extra_config),
            driver=driver,
            driver_idle_minutes=float(os.environ.get(IDLE_ENV, warm_driver.DEFAULT_IDLE_MINUTES)),
        )

    @property
    def settings(self) -> SparkSettings:
        return SparkSettings(
            master=self.master,
            shuffle_partitions=self.shuffle_partitions,
            driver_memory=self.driver_memory,
            extra_config={**self.spark_config, **self.extra_spark_config},
            s3=is_s3(self.lake_root),
        )

    @property
    def lake(self) -> Lake:
        """The lake, its root checked first (LakeRootError names a bad DATABUILD_LAKE_ROOT)."""
        return Lake(self.lake_root).ensure_root()

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # A run the instance launched carries the origin its launcher loaded the code from; a job
        # executed where it was created (execute_in_process, `dagster job execute`) does not, and
        # must leave no Spark behind for its caller: no warm driver, and its own JVM stopped.
        run = context.run
        self._in_process = run is not None and run.remote_job_origin is None
        self._warm = self.driver == "warm" or (self.driver == "auto" and not self._in_process)

    def _uses_warm_driver(self) -> bool:
        return self._warm if self._warm is not None else self.driver != "own"

    def _init_session(self) -> None:
        if self._spark_session is None:
            if self._uses_warm_driver():
                self._spark_session = warm_driver.warm_session(self.settings, self.driver_idle_minutes)
            else:
                self._started_jvm = starts_own_jvm()
                self._spark_session = build_spark_session(self.settings)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._spark_session is None:
            return
        if self._uses_warm_driver():
            warm_driver.detach()
        elif self._started_jvm and self._in_process:
            # The caller's process goes on after the run returns: the JVM the run started stops
            # with it (a launched run's process exits instead; a JVM the caller had is left alone).
            stop_own_jvm(self._spark_session)
            self._spark_session = None

    @property
    def spark_session(self) -> SparkSession:
        self._init_session()
        return self._spark_session
