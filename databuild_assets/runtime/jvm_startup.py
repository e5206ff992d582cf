"""How the Spark driver's JVM starts: from a class archive made at set-up, and, for a driver that
lives for one process only, with the quick JIT tier alone.

A new JVM first loads and verifies Spark's and Delta's classes, then compiles them on a machine
whose cores the work needs too. Two standard JVM
settings cut that (docs/decisions/0023-driver-jvm-start.md):

- an application class-data archive (AppCDS, `-XX:SharedArchiveFile`): the classes a small run of
  the whole pipeline loaded, dumped once by `make setup` (`python -m
  databuild_assets.runtime.jvm_startup create`) beside Delta's jars. A JVM whose class path or
  Java build differs from the archive's starts as without it;
- `-XX:TieredStopAtLevel=1` (C1 only) for a driver that ends with its process (a run with a JVM
  of its own, the CLI, the tests): no C2 compiler threads taking a core from the work, with the
  code cache the full tiers would reserve (C1 alone reserves 48 MB, which a run at scale fills).
  The warm driver, which serves runs for hours, keeps the full tiers.

    spark_config(SparkSettings())["spark.driver.extraJavaOptions"]
    # '-XX:SharedArchiveFile=.../spark-classes.jsa ... -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m'
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from databuild_assets.runtime.delta_jars import jars_dir

ARCHIVE_NAME = "spark-classes.jsa"
# C1 alone, with the code cache the full tiers get by default: with C1 alone the JVM reserves 48 MB,
# which a whole run at 1M events fills ("CodeCache is full. Compiler has been disabled.": the rest of
# the run is interpreted). Reserved, not committed: only the code compiled takes memory.
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
# The JVM's own warnings (one is an archive it cannot use) to stderr: by default they go to stdout,
# which the Python process shares (`databuild-assets query` prints JSON there).
WARNINGS_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr"


def class_archive(directory: Path | None = None) -> Path:
    """Where set-up puts the class archive: beside Delta's jars."""
    return (directory or jars_dir()) / ARCHIVE_NAME


def driver_java_options(long_lived: bool, directory: Path | None = None) -> str:
    """The driver JVM's options: the class archive when set-up made one, and C1 only unless the
    driver is `long_lived`."""
    archive = class_archive(directory)
    options = []
    if archive.is_file() and _one_argument(str(archive)):
        options += [f"-XX:SharedArchiveFile={archive}", WARNINGS_TO_STDERR]
    if not long_lived:
        options.append(QUICK_JIT)
    return " ".join(options)


def _one_argument(path: str) -> bool:
    """Whether `path` passes through Spark's launcher, which splits extraJavaOptions at white space,
    and DATABUILD_SPARK_CONF, split at commas, as one argument."""
    return not any(character.isspace() or character == "," for character in path)


def create(directory: Path | None = None, events: int = 2_000) -> Path:
    """Make the class archive: `databuild-assets demo` on `events` generated events in a throwaway
    lake, in a process whose JVM dumps the classes it loaded when it exits; then the dump is
    moved into place, so a JVM never opens one half written. Raises when the demo fails."""
    archive = class_archive(directory)
    if not _one_argument(str(archive)):
        raise RuntimeError(
            f"no class archive: its path {archive} has white space or a comma, which Spark's launcher splits"
        )
    # Beside the archive, so the dump moves into place on one filesystem (/tmp may be another).
    with tempfile.TemporaryDirectory(prefix=".class-archive-", dir=archive.parent) as work:
        dump = Path(work) / ARCHIVE_NAME
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DAGSTER_HOME", "DATABUILD_SPARK_CONF", "DATABUILD_SPARK_MASTER")
        }
        env.update(
            DATABUILD_LAKE_ROOT=str(Path(work) / "lake"),
            DATABUILD_SPARK_DRIVER="own",
            DATABUILD_SPARK_CONF=f"spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={dump}",
        )
        command = [sys.executable, "-m", "databuild_assets.cli", "demo", "--events", str(events)]
        completed = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, check=False)
        if completed.returncode != 0 or not dump.is_file():
            raise RuntimeError(
                f"the class archive was not made: `{' '.join(command)}` exited {completed.returncode}"
                f"{'' if dump.is_file() else ' and dumped no archive'}:\n{completed.stderr[-3000:]}"
            )
        os.replace(dump, archive)
    return archive


def main(argv: list[str]) -> int:
    if argv != ["create"]:
        print("usage: python -m databuild_assets.runtime.jvm_startup create", file=sys.stderr)
        return 2
    started = time.monotonic()
    print("making the Spark driver's class archive: a small demo in a JVM that dumps its classes (about a minute)")
    try:
        archive = create()
    except RuntimeError as error:  # an optimisation: set-up goes on, and Spark starts without it
        print(
            f"warning: {error}\nSpark's driver starts without a class archive (slower, never wrong).", file=sys.stderr
        )
        return 0
    size = archive.stat().st_size / 1e6
    print(f"class archive {archive} ({size:,.0f} MB) made in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
