"""Delta Lake's JVM jars: fetched once from Maven Central at set-up, then used offline.

Delta's jars are in no Python package. Spark's own route (`spark.jars.packages`, resolved by
Ivy at every session start) needs the network: Ivy resolves versions differently from Maven
(latest wins, not nearest), so even a warm ~/.m2 does not satisfy it offline, and it puts
older copies of Hadoop, Parquet, Jackson and log4j beside Spark's own. So set-up resolves
`delta-jars/pom.xml` with Maven, keeps only the jars Spark does not already ship, builds our own
log stores beside them (delta-jars/logstore), and the session lists them in `spark.jars` (which
Spark also ships to a cluster's executors).

    python -m databuild_assets.runtime.delta_jars fetch
    python -m databuild_assets.runtime.delta_jars build-logstore
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "delta-jars" / "pom.xml"
DEFAULT_JARS_DIR = REPO_ROOT / "delta-jars" / "lib"
# The Maven coordinate the pom pins, for messages and docs; the pom is what Maven reads.
DELTA_MAVEN_COORDINATE = "io.delta:delta-spark_4.2_2.13:4.4.0"
S3_POM = REPO_ROOT / "delta-jars" / "s3" / "pom.xml"
# Our log stores (Java classes built with Maven at set-up): delta-jars/logstore.
LOGSTORE_POM = REPO_ROOT / "delta-jars" / "logstore" / "pom.xml"
LOGSTORE_JAR = "databuild-logstore-1.jar"
LOCAL_LOG_STORE = "io.databuild.delta.LocalLogStore"
S3_JARS_DIR = REPO_ROOT / "delta-jars" / "s3" / "lib"
HADOOP_AWS_MAVEN_COORDINATE = "org.apache.hadoop:hadoop-aws:3.5.0"

_VERSION_SUFFIX = re.compile(r"-\d[\w.\-]*\.jar$")


class DeltaJarsMissingError(RuntimeError):
    """Delta's jars (or, for a lake on S3, hadoop-aws's) are not where the Spark session looks for them."""


def _artifact_id(jar_name: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`."""
    return _VERSION_SUFFIX.sub("", jar_name)


def spark_bundled_artifacts() -> set[str]:
    """Artifact ids of the jars pyspark ships; its copies win over Delta's transitive ones."""
    spark_jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact_id(jar.name) for jar in spark_jars.glob("*.jar")}


def jars_dir() -> Path:
    return Path(os.environ.get("DATABUILD_DELTA_JARS_DIR", DEFAULT_JARS_DIR))


def delta_jar_paths(directory: Path | None = None) -> list[str]:
    """The jars to put on `spark.jars`; raises a clear error when set-up has not fetched them."""
    directory = directory or jars_dir()
    jars = sorted(str(jar) for jar in directory.glob("*.jar"))
    if not any(Path(jar).name.startswith("delta-spark_") for jar in jars):
        raise DeltaJarsMissingError(
            f"Delta Lake's jars are not in {directory}. Run `make setup` (or "
            f"`python -m databuild_assets.runtime.delta_jars fetch`) once with access to Maven Central; "
            f"it fetches {DELTA_MAVEN_COORDINATE} and its dependencies."
        )
    if not (directory / LOGSTORE_JAR).is_file():
        raise DeltaJarsMissingError(
            f"our log stores ({LOGSTORE_JAR}) are not in {directory}. Run `make setup` (or "
            "`python -m databuild_assets.runtime.delta_jars build-logstore`); it builds delta-jars/logstore with Maven."
        )
    return jars


def log_store_class_path(jars: list[str]) -> list[str]:
    """Of `jars` (`delta_jar_paths`), our log stores' and delta-storage's (their base classes), for
    the driver's class path.

    Delta makes a log store from its class name for every table it opens: from a jar on
    `spark.jars` each time is a search of the JVM's whole class path before Spark's jar loader,
    which made the test suite 2.6x slower; from the class path it is found at once."""
    return [jar for jar in jars if Path(jar).name.startswith("delta-storage-")] + [
        jar for jar in jars if Path(jar).name == LOGSTORE_JAR
    ]


def _require_maven() -> None:
    if shutil.which("mvn") is None:
        raise DeltaJarsMissingError("Maven (`mvn`) is not on PATH; install it (Debian: apt-get install maven).")


def s3_jar_paths(directory: Path = S3_JARS_DIR) -> list[str]:
    """The jars a session needs for a lake on S3; a clear error when set-up has not fetched them."""
    jars = sorted(str(jar) for jar in directory.glob("*.jar"))
    if not any(Path(jar).name.startswith("hadoop-aws-") for jar in jars):
        raise DeltaJarsMissingError(
            f"the jars for lakes on S3 are not in {directory}. Run `make s3-setup` (or "
            f"`python -m databuild_assets.runtime.delta_jars fetch-s3`) once with access to Maven Central; "
            f"it fetches {HADOOP_AWS_MAVEN_COORDINATE} and the AWS SDK modules it uses."
        )
    return jars


def fetch(directory: Path | None = None, pom: Path = POM) -> list[str]:
    """Resolve `pom` with Maven and copy the jars Spark lacks into `directory`. Idempotent."""
    directory = directory or jars_dir()
    _require_maven()
    bundled = spark_bundled_artifacts()
    with tempfile.TemporaryDirectory() as staging:
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ],
            check=True,
        )
        needed = [jar for jar in Path(staging).glob("*.jar") if _artifact_id(jar.name) not in bundled]
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("*.jar"):
            old.unlink()
        for jar in needed:
            shutil.copy2(jar, directory / jar.name)
    return sorted(str(jar) for jar in directory.glob("*.jar"))


def build_logstore(directory: Path | None = None) -> Path:
    """Build our log stores (`mvn package`) and put their jar into `directory` (delta-jars/lib)."""
    directory = directory or jars_dir()
    _require_maven()
    subprocess.run(["mvn", "-q", "-B", "-f", str(LOGSTORE_POM), "package", "-DskipTests"], check=True)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LOGSTORE_JAR
    shutil.copy2(LOGSTORE_POM.parent / "target" / LOGSTORE_JAR, target)
    return target


def main(argv: list[str]) -> int:
    if argv == ["fetch-s3"]:
        jars = fetch(S3_JARS_DIR, S3_POM)
        print(f"fetched {len(jars)} jars for lakes on S3 into {S3_JARS_DIR}")
        return 0
    if argv == ["build-logstore"]:
        print(f"built {build_logstore()}")
        return 0
    if argv != ["fetch"]:
        print("usage: python -m databuild_assets.runtime.delta_jars fetch|build-logstore|fetch-s3", file=sys.stderr)
        return 2
    _, artifact, version = DELTA_MAVEN_COORDINATE.split(":")
    if (jars_dir() / f"{artifact}-{version}.jar").exists():
        print(f"Delta jars already in {jars_dir()}")
        return 0
    jars = fetch()
    print(f"fetched {len(jars)} Delta jars into {jars_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
