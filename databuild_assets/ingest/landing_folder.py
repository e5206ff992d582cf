"""What a landing folder holds for ingestion: the files to read, each by its size and time, and
the entries refused (skipped unread, or quarantined by name) by the rules of ingest/landing_names.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databuild_assets.ingest.landing_names import (
    is_landing_name,
    refused_entry,
    shown_name,
    unreadable_name,
    writer_uids,
)
from databuild_assets.runtime.lake import EVENT_QUARANTINE, Lake, is_local, plain_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LandingFile:
    path: str
    size: int
    modified_ms: int = 0  # the filesystem's modification time, ms since the epoch


@dataclass(frozen=True)
class RefusedFile:
    """An entry of a landing folder that is not read (ingest/landing_names.py): skipped (a link, a
    FIFO, a device, another user's file), or quarantined by name (a name Spark cannot read)."""

    folder: str  # Hadoop's spelling of its folder (file:/..., s3a://...)
    name: bytes  # the name's exact bytes
    reason: str
    quarantined: bool  # True: a quarantine row names it; False: skipped, listed at every run

    @property
    def path(self) -> str:
        """The folder and the name as one printable line (`shown_name`): how it is shown and quarantined."""
        return f"{self.folder}/{shown_name(self.name)}"

    @property
    def literal_path(self) -> str:
        """The folder and the name as a plan of an earlier release may have recorded it."""
        return f"{self.folder}/{os.fsdecode(self.name)}"

    def __str__(self) -> str:
        return f"{'quarantined' if self.quarantined else 'skipped'} {self.path}: {self.reason}"


def list_landing_files(spark: SparkSession, directory: str) -> list[LandingFile]:
    """The landing files of `directory` that ingestion reads (`scan_landing_folder`), by name."""
    return scan_landing_folder(spark, directory)[0]


def scan_landing_folder(spark: SparkSession, directory: str) -> tuple[list[LandingFile], list[RefusedFile]]:
    """(files to read, entries refused) of `directory` (any Hadoop filesystem), each by name.

    Only JSON Lines names not starting with "." or "_" are looked at: writers write under such a
    name and rename when the file is complete, so a file still being written is never read half.
    A local folder is listed here, each entry by `os.lstat` (never following a link): links,
    FIFOs, devices, sockets and other users' files are refused unread, as are names Spark cannot
    read by (ingest/landing_names.py). Each file's path is Hadoop's spelling (file:/..., s3a://...).
    """
    jvm = spark.sparkContext._jvm
    directory_path = jvm.org.apache.hadoop.fs.Path(directory)
    filesystem = directory_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not filesystem.exists(directory_path):
        log.info("landing folder %s does not exist yet: nothing to ingest", directory)
        return [], []
    files, refused = [], []
    if is_local(directory):
        folder = filesystem.makeQualified(directory_path).toString().rstrip("/")
        uids = writer_uids(os.fsencode(plain_path(directory)))
        for entry in os.scandir(os.fsencode(plain_path(directory))):
            if not is_landing_name(entry.name):
                continue
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # archived or renamed since it was listed
                continue
            why = refused_entry(status, uids)
            if why == "":  # a folder
                continue
            why_name = None if why else unreadable_name(entry.name)
            if why or why_name:
                refused.append(RefusedFile(folder, entry.name, why or why_name, not why))
                continue
            path = f"{folder}/{os.fsdecode(entry.name)}"
            files.append(LandingFile(path, status.st_size, status.st_mtime_ns // 1_000_000))
    else:
        for status in filesystem.listStatus(directory_path):
            name = status.getPath().getName()
            if not status.isFile() or not is_landing_name(name):
                continue
            path = status.getPath().toString()
            if why := unreadable_name(name):
                refused.append(RefusedFile(path[: len(path) - len(name) - 1], name.encode(), why, True))
                continue
            files.append(LandingFile(path, status.getLen(), status.getModificationTime()))
    for refusal in refused:
        log.warning("%s", refusal)
    return sorted(files, key=lambda landing_file: landing_file.path), sorted(refused, key=lambda r: r.name)


def planned_file_refusal(path: str) -> RefusedFile | None:
    """Why a file a batch planned must not be read now (None: it may): a name Spark cannot read
    by, or, on a local disk, no longer a regular file of an allowed owner. A plan an earlier
    release recorded may name such a file; its batch quarantines it by name instead of failing."""
    name = path.rsplit("/", 1)[-1]
    why = unreadable_name(name)
    if why is None and is_local(path):
        try:
            local = plain_path(path)
            why = refused_entry(os.lstat(local), writer_uids(os.path.dirname(local)))
        except FileNotFoundError:
            return None  # the read names it: a planned file must not be removed before its batch commits
        why = "a folder, not a regular file: not read" if why == "" else why
    if not why:
        return None
    return RefusedFile(path[: len(path) - len(name) - 1], os.fsencode(name), why, True)


def refused_files_rows(spark: SparkSession, refused: list[RefusedFile], batch_id: int) -> DataFrame:
    """Quarantine rows for files refused as a whole: line 0 (no line was read), the name's
    bytes as `raw_line` (nothing of the file's content), the reason."""
    return spark.createDataFrame(
        [(r.path, 0, r.reason, r.name.decode("utf-8", errors="replace"), r.name, batch_id) for r in refused],
        "source_file string, line_number long, reason string, line string, raw_line binary, ingest_batch long",
    ).withColumn("quarantined_at", F.current_timestamp())


def quarantine_unreadable_names(spark: SparkSession, lake: Lake, refused: list[RefusedFile]) -> int:
    """Quarantine, once each, the landing files whose name Spark cannot read by (in no batch:
    `ingest_batch` 0); the files stay in place. The number of rows added."""
    named = [r for r in refused if r.quarantined]
    if not named:
        return 0
    path = lake.table_path(EVENT_QUARANTINE)
    known = {
        (row.source_file, bytes(row.raw_line))
        for row in spark.read.format("delta")
        .load(path)
        .where("line_number = 0 AND ingest_batch = 0")
        .select("source_file", "raw_line")
        .collect()
    }
    new = [r for r in named if (r.path, r.name) not in known]
    if new:
        refused_files_rows(spark, new, 0).write.format("delta").mode("append").save(path)
    return len(new)
