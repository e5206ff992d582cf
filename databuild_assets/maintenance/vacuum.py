"""Vacuum: delete the files no table version within the retention window still needs.

After compaction has rewritten the files that held erased rows, the old files stay on disk for
time travel until vacuum removes them; only then is an erased value gone from the disk.
A retention below the configured minimum is refused unless explicitly overridden: readers and
writers that started before the window may still need those files (Delta's own check is 168 h).

A table that holds a symlink is not vacuumed, nor any other: Delta's VACUUM lists a linked
folder as the table's own and deletes the old files it finds there, wherever they are (found
with Delta 3 on a local disk). None of our writers makes a link; `check` names it and `repair`
moves the link itself aside.

    vacuum_lake(spark, Lake("/data/lake"), retention_hours=168)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_log import symlinks_in
from databuild_assets.runtime.lake import Lake, is_local

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 168
DELTA_SAFE_RETENTION_HOURS = 168  # below this Delta itself refuses (retentionDurationCheck)


class RetentionTooShortError(ValueError):
    """The requested retention is below the minimum and no override was given; nothing deleted."""


class SymlinkInTableError(RuntimeError):
    """A table of the lake holds a symlink, which VACUUM would follow; nothing deleted."""


@dataclass(frozen=True)
class TableVacuum:
    table: str
    files_deleted: int
    bytes_deleted: int


def lake_tables(spark: SparkSession, lake: Lake) -> list[tuple[str, str]]:
    """(name, path) of every Delta table under the lake's tables/ folder."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(lake.path("tables"))
    filesystem = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not filesystem.exists(root):
        return []
    tables = []
    for status in filesystem.listStatus(root):
        path = status.getPath().toString()
        if status.isDirectory() and DeltaTable.isDeltaTable(spark, path):
            tables.append((status.getPath().getName(), path))
    return sorted(tables)


def _size(spark: SparkSession, path: str) -> int:
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return filesystem.getFileStatus(hadoop_path).getLen() if filesystem.exists(hadoop_path) else 0


def vacuum_lake(
    spark: SparkSession,
    lake: Lake,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    minimum_retention_hours: float = DEFAULT_RETENTION_HOURS,
    allow_short_retention: bool = False,
) -> list[TableVacuum]:
    """Vacuum every table of the lake; returns the files and bytes deleted per table."""
    if retention_hours < minimum_retention_hours and not allow_short_retention:
        raise RetentionTooShortError(
            f"retention of {retention_hours} hours is below the minimum of {minimum_retention_hours} hours; "
            "nothing was deleted. Files younger than the retention may still be read by running queries "
            "and writers. Set allow_short_retention to override (it is logged)."
        )
    session = spark.newSession()  # the retention check override must not leak into other work
    if retention_hours < DELTA_SAFE_RETENTION_HOURS:
        log.warning(
            "vacuum with retention %s hours, below Delta's safe %s hours: override given (allow_short_retention)",
            retention_hours,
            DELTA_SAFE_RETENTION_HOURS,
        )
        session.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    tables = lake_tables(session, lake)
    _refuse_links([link for _, path in tables if is_local(path) for link in symlinks_in(path)], lake)
    results = []
    for name, path in tables:
        dry_run = session.sql(f"VACUUM delta.`{path}` RETAIN {retention_hours} HOURS DRY RUN").collect()
        files = [row["path"] for row in dry_run]
        size = sum(_size(session, file) for file in files)
        with commit_lock(path):  # VACUUM records its start and end as commits
            if is_local(path):  # again, just before: a link planted while other tables were vacuumed
                _refuse_links(symlinks_in(path), lake, [result.table for result in results])
            DeltaTable.forPath(session, path).vacuum(retention_hours)
        log.info("vacuum %s: %d files, %d bytes deleted", name, len(files), size)
        results.append(TableVacuum(name, len(files), size))
    return results


def _refuse_links(links: list, lake: Lake, vacuumed: list[str] | None = None) -> None:
    """Raise SymlinkInTableError naming the first of `links` (symlinks inside a table), if any;
    `vacuumed`: the tables this vacuum finished before it found them."""
    if links:
        deleted = (
            f"Vacuumed before it: {', '.join(vacuumed)}; nothing else was deleted"
            if vacuumed
            else "Nothing was deleted"
        )
        raise SymlinkInTableError(
            f"vacuum refused: {links[0]} is a symlink inside a table (-> {os.readlink(links[0])})"
            + (f", and {len(links) - 1} more" if len(links) > 1 else "")
            + f"; Delta's VACUUM would delete old files wherever it leads. {deleted}. Remove the link, "
            f"or run databuild-assets repair delta://{lake.root}, which moves it aside"
        )
