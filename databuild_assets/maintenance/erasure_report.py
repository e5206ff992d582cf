"""Proof of erasure: scan the disk, do not trust the bookkeeping.

For each tombstone, the report reads every Parquet data file under each table folder of the
lake (live or not: what vacuum has not yet deleted counts) and counts the rows that hold the
value as a whole JSON string value anywhere in the row (any column, any array element, inside
JSON text). It also searches the Delta logs (commits and checkpoints) for the value. Every other
file under the lake root (the landing and landing archive folders, hidden in-flight files
included, the serving index, and anything else there) is read line by line for the same JSON
strings (the serving index for the bare value too), one finding per folder. Given the Dagster
instance, every byte of every file under its DAGSTER_HOME is searched too (`scan_dagster_home`),
one finding. The tombstones table itself is skipped: it must keep the values to keep hiding them;
so are the erase requests' own run records in DAGSTER_HOME, for the same reason.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.parquet as pq
from dagster import DagsterInstance
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.erasure_rule import token_pattern
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER
from databuild_assets.maintenance.dagster_home import scan_dagster_home
from databuild_assets.maintenance.tombstones import Tombstone, json_string_forms, read_tombstones, text_forms
from databuild_assets.maintenance.vacuum import lake_tables
from databuild_assets.runtime.lake import TOMBSTONES, Lake, is_local
from databuild_assets.runtime.object_store import arrow_filesystem

# Folders under the lake root that always get a finding, files or not, so a report shows they were looked at.
ALWAYS_REPORTED_FOLDERS = ("landing", "landing_archive", SERVING_INDEX_FOLDER)
_CHUNK_BYTES = 1 << 20
# A published snapshot's frames, an object each (log/serving/publish.py): read as one stream.
_SNAPSHOT_FRAME = re.compile(r"^(.*/snapshots/index-[0-9a-f]{32})/(\d+)\.sqlite\.zst$")

# The finding for the files of Dagster's instance, whose `rows` count byte occurrences.
DAGSTER_HOME_FINDING = "DAGSTER_HOME"

# Where an erased value can live outside data files, and the setting that keeps it out.
OUTSIDE_DATA_FILES = (
    (
        "Delta log statistics (min/max per file, in commits and checkpoints)",
        "delta.dataSkippingStatsColumns limits statistics to timestamp, event_type and ingested_at; "
        "unlisted tables keep none (delta.dataSkippingNumIndexedCols=0)",
    ),
    (
        "commit information (operation parameters, userMetadata)",
        "purges and refreshes MERGE on event_id from a computed key set, so no predicate names a value; "
        "userMetadata carries versions and counts only",
    ),
    (
        "commit history until log retention",
        "delta.logRetentionDuration = 7 days; older commits and checkpoints are cleaned up at checkpoints",
    ),
    ("change data files (_change_data)", "delta.enableChangeDataFeed = false on every table"),
    (
        "deletion vectors (rows only marked deleted)",
        "delta.enableDeletionVectors = false on every table: deletes and updates rewrite files; a refresh "
        "drops the feature from a projection an earlier release gave it, purging its marked rows",
    ),
    ("the tombstones table", "holds each value on purpose: it is what keeps the value hidden"),
    (
        "landing files not ingested yet (new, or in a batch not committed)",
        "scanned (rows = lines); compaction rewrites a landing file only after ingestion has read it",
    ),
    (
        "the serving index (serving_index/: the visible log in SQLite)",
        "scanned for the value itself; deleted rows are overwritten (secure_delete) and compaction_job empties "
        "its write-ahead log; a new generation removes the old files",
    ),
    (
        "Dagster's storage under DAGSTER_HOME (run configs, events with previews and log messages, ticks, "
        "compute logs)",
        "previews show no column a tombstone can name; compaction_job rewrites each value to [erased] there "
        "(freed bytes overwritten, write-ahead logs emptied), but in the erase request's own run record; "
        f"scanned as {DAGSTER_HOME_FINDING} (rows = occurrences); a value accepted with allow_ambiguous is read "
        "there as values (SQL cells, decompressed snapshots) and counted as whole tokens, and in bytes no query "
        "reads (freed space, replaced log frames) wherever it occurs",
    ),
)


@dataclass(frozen=True)
class ErasureFinding:
    tombstone_id: str
    key: str
    table: str  # a table's name, or for files outside the tables, their folder under the lake root
    data_files_scanned: int
    rows_in_data_files: int  # rows, or for files outside the tables, lines
    delta_log_mentions: int
    # DAGSTER_HOME, a value accepted with allow_ambiguous: occurrences inside longer words (which
    # the scrub leaves, by design), apart from the whole tokens counted in rows.
    inside_longer_words: int = 0


def _files(spark: SparkSession, root: str, suffixes: tuple[str, ...], in_log: bool) -> list[str]:
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(root)
    filesystem = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    found, iterator = [], filesystem.listFiles(path, True)
    while iterator.hasNext():
        name = iterator.next().getPath().toString()
        if name.endswith(suffixes) and ("/_delta_log/" in name) == in_log:
            found.append(name)
    return found


def erasure_report(
    spark: SparkSession,
    lake: Lake,
    tombstones: list[Tombstone] | None = None,
    instance: DagsterInstance | None = None,
) -> list[ErasureFinding]:
    """One finding per tombstone and table, per tombstone and folder of other files under the
    lake root, and per tombstone for DAGSTER_HOME when `instance` is a persistent one: rows
    (lines; in DAGSTER_HOME, occurrences) on disk still holding the value (must be 0)."""
    tombstones = read_tombstones(spark, lake) if tombstones is None else tombstones
    findings, tables = [], lake_tables(spark, lake)
    for table, path in tables:
        if table == TOMBSTONES.name:
            continue
        data_files = _files(spark, path, (".parquet",), in_log=False)
        rows = (
            spark.read.option("mergeSchema", "true").parquet(*data_files).select(F.to_json(F.struct("*")).alias("row"))
            if data_files
            else None
        )
        log_files = _files(spark, path, (".json", ".parquet", ".crc"), in_log=True)
        log_text = spark.read.text(log_files).select(F.col("value").alias("text")) if log_files else None
        for tombstone in tombstones:
            # The value as a whole JSON string, as a column holds it, and escaped once more, as it
            # appears inside a JSON text column (a job config naming a partition).
            needle, nested = json_string_forms(tombstone.value)
            in_rows = (
                rows.where(F.col("row").contains(needle) | F.col("row").contains(nested)).count()
                if rows is not None
                else 0
            )
            # Checkpoints are Parquet: their text is searched raw, for the value itself (a value
            # accepted with allow_ambiguous, as a whole token: `e` is in every commit's text).
            mentions = (
                F.col("text").rlike(token_pattern([tombstone.value]))
                if tombstone.allow_ambiguous
                else F.col("text").contains(tombstone.value)
            )
            in_log = log_text.where(mentions).count() if log_text is not None else 0
            findings.append(
                ErasureFinding(tombstone.tombstone_id, tombstone.key, table, len(data_files), in_rows, in_log)
            )
    findings.extend(_file_findings(spark, lake, tombstones, [path for _, path in tables]))
    if instance is not None:
        findings.extend(dagster_home_findings(instance, tombstones))
    return findings


def dagster_home_findings(instance: DagsterInstance, tombstones: list[Tombstone]) -> list[ErasureFinding]:
    """One finding per tombstone for the files under the instance's DAGSTER_HOME: every file, and
    the occurrences of the value in their bytes outside the erase requests' own run records (none
    for an ephemeral instance: it stores nothing)."""
    scan = scan_dagster_home(instance, tombstones)
    if scan is None:
        return []
    files, found, embedded = scan.files_scanned, scan.occurrences, scan.embedded
    return [
        ErasureFinding(
            t.tombstone_id, t.key, DAGSTER_HOME_FINDING, files, found[t.tombstone_id], 0, embedded[t.tombstone_id]
        )
        for t in tombstones
    ]


def _files_outside_tables(spark: SparkSession, lake: Lake, table_paths: list[str]) -> dict[str, list[str]]:
    """Every file under the lake root that no Delta table folder holds, by its top folder."""
    jvm = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(lake.root)
    filesystem = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    folders: dict[str, list[str]] = {folder: [] for folder in ALWAYS_REPORTED_FOLDERS}
    if not filesystem.exists(root):
        return folders
    prefix = filesystem.makeQualified(root).toString().rstrip("/") + "/"
    tables = tuple(path.rstrip("/") + "/" for path in table_paths)
    iterator = filesystem.listFiles(root, True)
    while iterator.hasNext():
        path = iterator.next().getPath().toString()
        if path.startswith(tables):
            continue
        relative = path.removeprefix(prefix)
        folders.setdefault(relative.split("/", 1)[0] if "/" in relative else "(lake root)", []).append(path)
    return folders


def _chunks(spark: SparkSession, path: str) -> Iterator[bytes]:
    """The bytes of `path`, in chunks. Not through Spark's file sources: they skip hidden names."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    if is_local(path):
        with open(hadoop_path.toUri().getPath(), "rb") as stream:
            while chunk := stream.read(_CHUNK_BYTES):
                yield chunk
        return
    stream = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(hadoop_path)
    try:
        while chunk := bytes(stream.readNBytes(_CHUNK_BYTES)):
            yield chunk
    finally:
        stream.close()


def _parquet_values(spark: SparkSession, path: str) -> Iterator[bytes] | None:
    """A Parquet file outside the tables (the serving index's cold segments, on disk or published
    in a bucket) as text, one row a line, its values as stored: its compressed pages hide their
    values from a byte search. None for any other file."""
    if not path.endswith(".parquet"):
        return None
    if is_local(path):
        source = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path).toUri().getPath()
    else:
        filesystem, key = arrow_filesystem(path)
        source = filesystem.open_input_file(key)

    def lines() -> Iterator[bytes]:
        try:
            for batch in pq.ParquetFile(source).iter_batches():
                for row in batch.to_pylist():
                    yield ("\t".join("" if value is None else str(value) for value in row.values()) + "\n").encode()
        finally:
            if not isinstance(source, str):
                source.close()  # the object's stream on the bucket

    return lines()


def _zstd_bytes(spark: SparkSession, path: str) -> Iterator[bytes] | None:
    """A zstd file outside the tables (the serving index's published snapshot, log/serving/
    publish.py) unpacked, in chunks: compressed, its values are hidden from a byte search. None
    for any other file."""
    if not path.endswith(".zst"):
        return None
    import pyarrow as pa

    if is_local(path):
        raw = pa.OSFile(spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path).toUri().getPath())
    else:
        filesystem, key = arrow_filesystem(path)
        raw = filesystem.open_input_stream(key, compression=None)  # unpacked below

    def chunks() -> Iterator[bytes]:
        with pa.CompressedInputStream(raw, "zstd") as stream:
            while chunk := stream.read(_CHUNK_BYTES):
                yield chunk

    return chunks()


def file_streams(spark: SparkSession, paths: list[str]) -> Iterator[Iterator[bytes]]:
    """The bytes to search of each file in `paths` (`_parquet_values`, `_zstd_bytes` or raw),
    a published snapshot's frames unpacked in order as one stream: a value may span two."""
    snapshots: dict[str, list[tuple[int, str]]] = {}
    for path in paths:
        if match := _SNAPSHOT_FRAME.match(path):
            snapshots.setdefault(match.group(1), []).append((int(match.group(2)), path))
        else:
            yield _parquet_values(spark, path) or _zstd_bytes(spark, path) or _chunks(spark, path)
    for frames in snapshots.values():
        yield itertools.chain.from_iterable(_zstd_bytes(spark, path) or () for _, path in sorted(frames))


def lines_holding(chunks: Iterator[bytes], forms: dict[str, tuple[bytes, ...]]) -> dict[str, int]:
    """For each key of `forms`: the lines ("\n"-separated) of the bytes in `chunks` that hold
    any of its byte strings (none of which holds a newline)."""
    counts, rest = dict.fromkeys(forms, 0), b""

    def count(block: bytes) -> None:
        for key, needles in forms.items():
            line_starts = set()
            for needle in needles:
                at = block.find(needle)
                while at != -1:
                    line_starts.add(block.rfind(b"\n", 0, at))
                    at = block.find(needle, at + 1)
            counts[key] += len(line_starts)

    for chunk in chunks:
        block = rest + chunk
        end = block.rfind(b"\n") + 1  # whole lines only; the rest waits for the next chunk
        count(block[:end])
        rest = block[end:]
    count(rest)
    return counts


def _file_findings(
    spark: SparkSession, lake: Lake, tombstones: list[Tombstone], table_paths: list[str]
) -> list[ErasureFinding]:
    # Whole JSON strings, and the value's escaped forms (a writer may escape non-ASCII as \\u):
    # what a landing line holding it contains.
    forms = {
        t.tombstone_id: tuple(
            dict.fromkeys(
                form.encode("utf-8")
                for form in (*json_string_forms(t.value), *(f for f in text_forms(t.value) if f != t.value))
            )
        )
        for t in tombstones
    }
    # The serving index stores key columns (event_id, partition_ref...) as bare SQLite text, not
    # as JSON strings: its files are searched for the value itself too.
    bare = {t.tombstone_id: (*forms[t.tombstone_id], t.value.encode("utf-8")) for t in tombstones}
    findings = []
    for folder, paths in sorted(_files_outside_tables(spark, lake, table_paths).items()):
        lines = dict.fromkeys(forms, 0)
        folder_forms = bare if folder == SERVING_INDEX_FOLDER else forms
        for chunks in file_streams(spark, paths):
            for tombstone_id, count in lines_holding(chunks, folder_forms).items():
                lines[tombstone_id] += count
        findings.extend(
            ErasureFinding(t.tombstone_id, t.key, folder, len(paths), lines[t.tombstone_id], 0) for t in tombstones
        )
    return findings


def format_report(findings: list[ErasureFinding]) -> str:
    lines = [f"{'tombstone':38} {'key':16} {'table or folder':20} {'files':>6} {'rows':>6} {'log':>5}"]
    for f in findings:
        lines.append(
            f"{f.tombstone_id:38} {f.key:16} {f.table:20} {f.data_files_scanned:6}"
            f" {f.rows_in_data_files:6} {f.delta_log_mentions:5}"
            + (f"  (+{f.inside_longer_words} inside longer words, kept)" if f.inside_longer_words else "")
        )
    lines.append("")
    lines.append("Where a value can remain outside data files, and what keeps it out:")
    lines.extend(f"- {where}: {setting}" for where, setting in OUTSIDE_DATA_FILES)
    return "\n".join(lines)
