"""Reading a Delta table's commits: what a range of versions added or removed, and the
metadata our own commits record about themselves (which log version a refresh processed).

Incremental refreshes (filtered log, projections) use these to read only the rows that the
commits since their last run appended, and to rebuild in full when a commit removed data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


@dataclass(frozen=True)
class LogChanges:
    """What the log's commits in (from_version, to_version] did to its data."""

    added_files: tuple[str, ...]  # file names (unique: Delta names data files by UUID)
    partition_values: tuple[dict, ...]
    removed_data: bool  # a commit removed rows (delete, erasure, overwrite), not just appended


class LogVersionsUnavailable(RuntimeError):
    """A commit an incremental refresh needs is gone (log retention); rebuild in full."""


def log_changes(spark: SparkSession, log_path: str, from_version: int, to_version: int) -> LogChanges:
    """Read the add/remove actions of the log's commits after `from_version` up to `to_version`."""
    if to_version <= from_version:
        return LogChanges((), (), False)
    commits = [f"{log_path}/_delta_log/{version:020d}.json" for version in range(from_version + 1, to_version + 1)]
    try:
        lines = [row.value for row in spark.read.text(commits).collect()]
    except Exception as error:  # Spark's "path does not exist" is an AnalysisException
        if "PATH_NOT_FOUND" in str(error) or "does not exist" in str(error):
            raise LogVersionsUnavailable(
                f"{log_path}: commits {from_version + 1}..{to_version} are not all readable ({error})"
            ) from error
        raise
    added, partition_values, removed_data = [], [], False
    for line in lines:
        action = json.loads(line)
        if "add" in action and action["add"].get("dataChange", True):
            added.append(unquote(action["add"]["path"]).rsplit("/", 1)[-1])
            partition_values.append(action["add"].get("partitionValues") or {})
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed_data = True
    return LogChanges(tuple(added), tuple(partition_values), removed_data)


def rows_added(log_at_version: DataFrame, changes: LogChanges) -> DataFrame:
    """The log rows that live in the files `changes` added (partition-pruned, then by file)."""
    frame = log_at_version
    partition_columns = sorted({column for values in changes.partition_values for column in values})
    for column in partition_columns:
        frame = frame.where(F.col(column).cast("string").isin(sorted({v.get(column) for v in changes.partition_values})))
    return frame.where(F.col("_metadata.file_name").isin(list(changes.added_files)))


def latest_commit_metadata(spark: SparkSession, path: str, wanted: Callable[[dict], bool]) -> dict | None:
    """The userMetadata (a JSON object) of the newest commit of `path` for which `wanted` is
    true, or None (no table, or no such commit)."""
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    table = DeltaTable.forPath(spark, path)
    for history in (table.history(20), table.history()):  # our commits are usually the latest
        for row in history.orderBy(F.col("version").desc()).select("userMetadata").collect():
            metadata = _parse_metadata(row["userMetadata"])
            if metadata and wanted(metadata):
                return metadata
    return None


def _parse_metadata(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
