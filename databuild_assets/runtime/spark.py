"""The SparkSession the lakehouse runs on: Delta's extensions and jars, UTC, sized for the machine.

`spark_config()` is plain data, so the Dagster resource, the CLI, the tests and the benchmarks
all start Spark the same way; the master URL decides whether that is local or a cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dagster_pyspark.resources import spark_session_from_config
from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from databuild_assets.runtime.delta_jars import LOCAL_LOG_STORE, delta_jar_paths, log_store_class_path, s3_jar_paths
from databuild_assets.runtime.file_modes import lake_umask
from databuild_assets.runtime.jvm_startup import driver_java_options
from databuild_assets.runtime.object_store import is_s3, spark_s3_config
from databuild_assets.runtime.private_folders import private_folder

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"

# The master URLs Spark 4 starts with (SparkContext.createTaskScheduler and its cluster managers).
_MASTER_URL = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]|spark://\S+|yarn|k8s://\S+"
)
_MASTER_FORMS = "local[*], local[N], spark://host:7077, yarn or k8s://https://host:port"


class SparkStartError(RuntimeError):
    """Spark could not start; nothing was read or written."""


class InvalidSparkMasterError(SparkStartError):
    """The master URL is none Spark knows."""


class JavaNotFoundError(SparkStartError):
    """No Java to start Spark's JVM with."""


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
    # A driver that serves many runs (the warm driver) compiles hot code fully; one that ends with
    # its process starts quicker on the quick JIT tier alone (runtime/jvm_startup.py).
    long_lived: bool = False
    # The session reads and writes lakes on S3: hadoop-aws's jars, and S3A's settings from the
    # environment (runtime/object_store.py). Off by default, so a local lake's JVM loads none of it.
    s3: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SparkSettings:
        """Settings from DATABUILD_SPARK_MASTER, DATABUILD_SPARK_SHUFFLE_PARTITIONS,
        DATABUILD_SPARK_DRIVER_MEMORY and DATABUILD_SPARK_CONF ("key=value,key=value"); S3 when
        DATABUILD_LAKE_ROOT is on S3."""
        return cls(
            master=environ.get("DATABUILD_SPARK_MASTER", DEFAULT_MASTER),
            shuffle_partitions=int(environ.get("DATABUILD_SPARK_SHUFFLE_PARTITIONS", cls.shuffle_partitions)),
            driver_memory=environ.get("DATABUILD_SPARK_DRIVER_MEMORY", cls.driver_memory),
            extra_config=parse_conf_pairs(environ.get("DATABUILD_SPARK_CONF", "")),
            s3=is_s3(environ.get("DATABUILD_LAKE_ROOT", "")),
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


def warehouse_dir() -> str:
    """Spark's warehouse folder: `databuild-spark-warehouse-<uid>` in the temp dir, as a file: URI
    (on a cluster, too, it names the driver's disk, not the default Hadoop filesystem)."""
    return (Path(tempfile.gettempdir()) / f"databuild-spark-warehouse-{os.getuid()}").as_uri()


def spark_config(settings: SparkSettings) -> dict[str, str]:
    """The full Spark configuration for `settings`, Delta included."""
    jars = delta_jar_paths()
    config = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.memory": settings.driver_memory,
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Event dates (the log's partitions) are UTC days, whatever the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        # Delta rebuilds a table's state (its live files, from the checkpoint and the commits after
        # it) in this many partitions (default 50), again at every new version a session sees, and
        # every MERGE or filtered read scans that state. Our tables hold few files (compaction
        # bin-packs them), so one partition: a landing file's run makes a dozen such snapshots and
        # scans, each a Spark job of one task instead of eight
        # (docs/decisions/0024-delta-state-in-one-partition.md). A table of many thousands of
        # files wants more: set it in DATABUILD_SPARK_CONF.
        "spark.databricks.delta.snapshotPartitions": "1",
        # Delta lists a table's log at every snapshot; its store for local disks asks Hadoop for
        # the status of every file in the log folder, and the JVM-free appends add one a commit.
        # Ours reads the folder's names and the status of the files after the checkpoint only
        # (delta-jars/logstore, docs/decisions/0053-spark-lists-a-local-log-by-name.md), from the
        # driver's class path: Delta makes a store from its class name at every table it opens.
        "spark.delta.logStore.file.impl": LOCAL_LOG_STORE,
        "spark.driver.extraClassPath": os.pathsep.join(log_store_class_path(jars)),
        # Delta's VACUUM lists a table's files with this many tasks (Spark's default: 10,000).
        # Sized like the shuffle; on a cluster raise both.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(settings.shuffle_partitions),
        # VACUUM records its start and end in the table's history on every store: Delta's default
        # records it on local disks but not on S3 (S3SingleDriverLogStore), and the history is
        # where operators and our checks see that a vacuum ran.
        "spark.databricks.delta.vacuum.logging.enabled": "true",
        "spark.ui.showConsoleProgress": "true",
        # Every table of ours is a Delta table at a path (delta.`...`), none a managed one, yet Spark
        # makes its catalog's default database folder, by default `spark-warehouse/` in whatever
        # folder the process started in. A folder of this user's in the temp dir instead: no
        # leftovers in the caller's folder, and the same for every process (the warm driver's key).
        "spark.sql.warehouse.dir": warehouse_dir(),
        # Hadoop's filesystem gives what Spark writes (Parquet, Delta commits, checkpoints, their
        # folders) this umask, not the JVM's: 077, or 027 with DATABUILD_LAKE_GROUP_READ=1
        # (runtime/file_modes.py). An operator's spark.hadoop.fs.permissions.umask-mode wins.
        "spark.hadoop.fs.permissions.umask-mode": f"{lake_umask():03o}",
    }
    # The class archive set-up made, and the JIT tier for the driver's lifetime (runtime/jvm_startup.py).
    # DATABUILD_SPARK_CONF's spark.driver.extraJavaOptions replaces these: repeat them there to keep them.
    if java_options := driver_java_options(settings.long_lived):
        config["spark.driver.extraJavaOptions"] = java_options
    if settings.s3:
        config["spark.jars"] += "," + ",".join(s3_jar_paths())
        config.update(spark_s3_config())
    if settings.master.startswith("local"):
        # A local driver talks to nobody but this machine: its RPC and block manager ports (by
        # default on the host's address, open to the network) on loopback. A cluster's executors
        # must reach the driver, so there Spark's defaults (or the operator's) stand. The UI's
        # address is SPARK_LOCAL_IP's (`_jvm_environment`).
        config["spark.driver.bindAddress"] = LOOPBACK
        config["spark.driver.host"] = LOOPBACK
    config.update(settings.extra_config)
    return config


def build_spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Start (or reuse) the process's SparkSession with Delta configured.

    Static settings (master, driver memory, jars) only take effect for the first session of a
    process; later calls return that session, as Spark itself does. What would stop Spark from
    starting (a master URL Spark does not know, no Java, Delta's jars not fetched, a JVM that
    exits) raises one SparkStartError (DeltaJarsMissingError for the jars) naming the fix.
    """
    settings = settings or SparkSettings()
    if not _MASTER_URL.fullmatch(settings.master):
        raise InvalidSparkMasterError(
            f"Spark master URL {settings.master!r} is not one Spark knows; use {_MASTER_FORMS} "
            "(DATABUILD_SPARK_MASTER, or the lakehouse resource's master). Spark was not started."
        )
    config = spark_config(settings)  # DeltaJarsMissingError (run `make setup`) before any JVM starts
    if starts_own_jvm():
        _require_java()
    # Python workers must import this package and pyarrow, so they must run an interpreter that
    # has them, not the first `python3` on PATH. When this process starts the JVM, pyspark tells
    # the executors which interpreter from PYSPARK_PYTHON alone (pyspark/core/context.py:
    # pythonExec); Spark's setting spark.pyspark.python is turned into that variable only by
    # spark-submit, so given in our config it would be ignored: apply it here, for every master.
    # Local mode without it: the driver's own interpreter (the venv).
    if config.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = config["spark.pyspark.python"]
    elif settings.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        if not starts_own_jvm():  # nothing is launched: the settings go to the running JVM
            return spark_session_from_config(config)
        with _jvm_environment(config, settings.master):
            # Master and name only: every other setting reaches the JVM from a private file.
            return SparkSession.builder.master(config["spark.master"]).appName(config["spark.app.name"]).getOrCreate()
    except PySparkRuntimeError as error:
        if error.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        raise SparkStartError(
            f"Spark's JVM ({_java_command()}) exited before it started; its own message is printed above. "
            "Spark 4.2 needs Java 17 or 21: install it (Debian: apt-get install openjdk-17-jdk-headless) or "
            "point JAVA_HOME at one, then run `make setup`."
        ) from error


@contextlib.contextmanager
def _jvm_environment(config: Mapping[str, str], master: str) -> Iterator[None]:
    """What the JVM pyspark is about to launch starts with, other than its command line: pyspark
    puts every setting it is given on spark-submit's command line (`--conf k=v`, kept in the
    JVM's), which `ps` shows to every user, and DATABUILD_SPARK_CONF may hold credentials. So the
    settings go in a properties file (0600, in a folder of this user's alone, removed once the
    JVM has read it) that PYSPARK_SUBMIT_ARGS names, with the operator's spark-defaults.conf
    still loaded under it (`--load-spark-defaults`: a properties file alone replaces it). A local
    master's UI on loopback too (Spark's web UI binds to SPARK_LOCAL_IP, else to every interface)
    unless the environment names an address. Environment restored afterwards."""
    folder = private_folder(Path(tempfile.gettempdir()) / f"databuild-spark-launch-{os.getuid()}")
    handle, name = tempfile.mkstemp(prefix="spark-", suffix=".properties", dir=folder)  # 0600
    saved = {key: os.environ.get(key) for key in ("PYSPARK_SUBMIT_ARGS", "SPARK_LOCAL_IP")}
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.writelines(f"{_property(key)}={_property(value)}\n" for key, value in config.items())
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(name)} --load-spark-defaults " + (
            saved["PYSPARK_SUBMIT_ARGS"] or "pyspark-shell"
        )
        if master.startswith("local") and not saved["SPARK_LOCAL_IP"]:
            os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        yield
    finally:
        os.unlink(name)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _property(text: str) -> str:
    """`text` escaped for a Java properties file (java.util.Properties.load)."""
    escaped = "".join(
        {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!"}.get(
            char, char
        )
        for char in text
    )
    return "\\" + escaped if escaped.startswith(" ") else escaped


def starts_own_jvm() -> bool:
    """Whether the next `build_spark_session` of this process starts a JVM (none running, none attached)."""
    return SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def stop_own_jvm(spark: SparkSession, timeout_s: float = 60.0) -> None:
    """Stop `spark` and the JVM this process started for it (by `build_spark_session`), so that
    nothing of Spark outlives the work that needed it: Spark's own `stop()` leaves the JVM running
    until the Python process exits. A later `build_spark_session` starts a new one.

        stop_own_jvm(spark)   # e.g. when a job run in a script's process returns
    """
    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None or "PYSPARK_GATEWAY_PORT" in os.environ or getattr(gateway, "proc", None) is None:
        return  # a JVM this process attached to (the warm driver) is not its to stop
    gateway.shutdown()
    # pyspark's gateway JVM exits when its stdin closes (PythonGatewayServer reads it until EOF).
    gateway.proc.stdin.close()
    try:
        gateway.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        gateway.proc.kill()
        gateway.proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def _java_command() -> str:
    """The java Spark's launcher runs: $JAVA_HOME/bin/java, else `java` on PATH (bin/spark-class)."""
    java_home = os.environ.get("JAVA_HOME")
    return str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")


def _require_java() -> None:
    java = _java_command()
    if not (os.path.isfile(java) and os.access(java, os.X_OK)):
        where = f"JAVA_HOME is {os.environ['JAVA_HOME']!r}" if os.environ.get("JAVA_HOME") else "JAVA_HOME is not set"
        raise JavaNotFoundError(
            f"Spark needs Java and there is none at {java} ({where}, and no usable `java` there). Install Java 17 "
            "(Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to a Java 17 or 21 home, "
            "then run `make setup`. Spark was not started."
        )
