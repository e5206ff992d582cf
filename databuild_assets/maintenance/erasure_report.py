"""Proof of erasure: scan the disk, do not trust the bookkeeping.

For each tombstone, the report reads every Parquet data file under each table folder of the
lake (live or not: what vacuum has not yet deleted counts) and counts the rows that hold the
value as a whole JSON string value anywhere in the row (any column, any array element, inside
JSON text). It also searches the Delta logs (commits and checkpoints) for the value. The
tombstones table itself is skipped: it must keep the values to keep hiding them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.maintenance.tombstones import Tombstone, read_tombstones
from databuild_assets.maintenance.vacuum import lake_tables
from databuild_assets.runtime.lake import TOMBSTONES, Lake

# Where an erased value can live outside data files, and the setting that keeps it out.
OUTSIDE_DATA_FILES = (
    ("Delta log statistics (min/max per file, in commits and checkpoints)",
     "delta.dataSkippingStatsColumns limits statistics to timestamp, event_type and ingested_at; "
     "unlisted tables keep none (delta.dataSkippingNumIndexedCols=0)"),
    ("commit information (operation parameters, userMetadata)",
     "purges and refreshes MERGE on event_id from a computed key set, so no predicate names a value; "
     "userMetadata carries versions and counts only"),
    ("commit history until log retention",
     "delta.logRetentionDuration = 7 days; older commits and checkpoints are cleaned up at checkpoints"),
    ("change data files (_change_data)", "delta.enableChangeDataFeed = false on every table"),
    ("deletion vectors (rows only marked deleted)",
     "delta.enableDeletionVectors = false on the logs, quarantine and ledger: deletes rewrite files; the "
     "projections have them, and erasure rebuilds a projection whole (an overwrite drops every old file)"),
    ("the tombstones table", "holds each value on purpose: it is what keeps the value hidden"),
    ("Dagster's run storage (materialization previews)",
     "previews show the newest rows; delete old runs in the UI or wipe DAGSTER_HOME's storage"),
)


@dataclass(frozen=True)
class ErasureFinding:
    tombstone_id: str
    key: str
    table: str
    data_files_scanned: int
    rows_in_data_files: int
    delta_log_mentions: int


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


def erasure_report(spark: SparkSession, lake: Lake, tombstones: list[Tombstone] | None = None) -> list[ErasureFinding]:
    """One finding per tombstone and table: rows on disk still holding the value (must be 0)."""
    tombstones = read_tombstones(spark, lake) if tombstones is None else tombstones
    findings = []
    for table, path in lake_tables(spark, lake):
        if table == TOMBSTONES.name:
            continue
        data_files = _files(spark, path, (".parquet",), in_log=False)
        rows = (spark.read.option("mergeSchema", "true").parquet(*data_files)
                .select(F.to_json(F.struct("*")).alias("row")) if data_files else None)
        log_files = _files(spark, path, (".json", ".parquet", ".crc"), in_log=True)
        log_text = spark.read.text(log_files).select(F.col("value").alias("text")) if log_files else None
        for tombstone in tombstones:
            # The value as a whole JSON string, as a column holds it, and escaped once more, as it
            # appears inside a JSON text column (a job config naming a partition).
            needle = json.dumps(tombstone.value, ensure_ascii=False)
            nested = json.dumps(needle, ensure_ascii=False)[1:-1]
            in_rows = (rows.where(F.col("row").contains(needle) | F.col("row").contains(nested)).count()
                       if rows is not None else 0)
            # Checkpoints are Parquet: their text is searched raw, for the value itself.
            in_log = log_text.where(F.col("text").contains(tombstone.value)).count() if log_text is not None else 0
            findings.append(ErasureFinding(tombstone.tombstone_id, tombstone.key, table, len(data_files), in_rows, in_log))
    return findings


def format_report(findings: list[ErasureFinding]) -> str:
    lines = [f"{'tombstone':38} {'key':16} {'table':20} {'files':>6} {'rows':>6} {'log':>5}"]
    for f in findings:
        lines.append(f"{f.tombstone_id:38} {f.key:16} {f.table:20} {f.data_files_scanned:6} {f.rows_in_data_files:6} {f.delta_log_mentions:5}")
    lines.append("")
    lines.append("Where a value can remain outside data files, and what keeps it out:")
    lines.extend(f"- {where}: {setting}" for where, setting in OUTSIDE_DATA_FILES)
    return "\n".join(lines)
