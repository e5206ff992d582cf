"""Reading a Delta table's commits: what a range of versions added or removed, and the
metadata our own commits record about themselves (which log version a refresh processed).

Incremental refreshes (filtered log, projections) use these to read only the rows that the
commits since their last run appended, and to rebuild in full when a commit removed data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Container
from dataclasses import dataclass
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from databuild_assets.runtime.damage import commit_damage, outside_table_damage
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_log import (
    OutsideTableError,
    check_action_paths,
    commit_path,
    resolve_in_table,
    table_relative,
)
from databuild_assets.runtime.delta_tables import missing_files, read_table_properties
from databuild_assets.runtime.lake import is_local


@dataclass(frozen=True)
class LogChanges:
    """What the log's commits in (from_version, to_version] did to its data: the files they
    added that are still there at `to_version`, and the files there before that they removed."""

    added_files: tuple[str, ...]  # file names (unique: Delta names data files by UUID)
    partition_values: tuple[dict, ...]
    removed_data: bool  # a commit removed rows (delete, erasure, overwrite), not just appended
    added_paths: tuple[str, ...] = ()  # the same files, relative to the table's root
    deletion_vectors: bool = False  # an added file has a deletion vector (some rows deleted)
    metadata_changed: bool = False  # a commit changed the table's metadata (schema, properties)
    added_bytes: int = 0  # the added files' size
    purges: int = 0  # purge commits left out: they removed only rows the reader hides (`log_changes`)
    # The files the range removed that were there before it, relative to the table's root; their
    # partition values (None when a remove action did not record them) and size.
    removed_paths: tuple[str, ...] = ()
    removed_partition_values: tuple[dict | None, ...] = ()
    removed_bytes: int = 0


class LogVersionsUnavailable(RuntimeError):
    """A commit an incremental refresh needs is gone (log retention); rebuild in full."""


def log_changes(
    spark: SparkSession,
    log_path: str,
    from_version: int,
    to_version: int,
    hidden_tombstones_version: int | None = None,
) -> LogChanges:
    """Read the add/remove actions of the log's commits after `from_version` up to `to_version`.

    `hidden_tombstones_version`: the reader hides every event the tombstones at that version
    match (the filtered log reading the raw log). Then a purge commit of compaction (its
    userMetadata records `PURGE` and the tombstones version it applied, at most that one) is no
    change to it: it removed only rows the reader hides, and its adds are the rest of the files it
    rewrote, rows the reader has already. Its actions are left out, and counted in `purges`.
    A commit naming a path outside the table (`delta_log.table_relative`) is refused: as
    DamagedTableError naming it on a local disk, OutsideTableError elsewhere.
    """
    if to_version <= from_version:
        return LogChanges((), (), False)
    commits = [f"{log_path}/_delta_log/{version:020d}.json" for version in range(from_version + 1, to_version + 1)]
    try:
        per_commit = _commit_actions(spark, log_path, commits)
    except Exception as error:  # Spark's "path does not exist" is an AnalysisException
        if "PATH_NOT_FOUND" in str(error) or "does not exist" in str(error):
            raise LogVersionsUnavailable(
                f"{log_path}: commits {from_version + 1}..{to_version} are not all readable ({error})"
            ) from error
        raise
    for version, actions in enumerate(per_commit, start=from_version + 1):
        _check_paths(log_path, version, actions)
    adds: dict[str, dict] = {}  # by path, relative to the table's root, in commit order
    removes: dict[str, dict] = {}
    removed_data = deletion_vectors = metadata_changed = False
    purges = 0
    for actions in per_commit:
        if hidden_tombstones_version is not None and _purge_of_hidden_rows(actions, hidden_tombstones_version, adds):
            purges += 1
            continue
        for action in actions:
            if "add" in action and action["add"].get("dataChange", True):
                adds[table_relative(action["add"]["path"])] = action["add"]
                deletion_vectors |= bool(action["add"].get("deletionVector"))
            elif "remove" in action and action["remove"].get("dataChange", True):
                removes[table_relative(action["remove"]["path"])] = action["remove"]
                removed_data = True
                deletion_vectors |= bool(action["remove"].get("deletionVector"))
            metadata_changed |= "metaData" in action
    # Net of the range: a file added and removed again within it is in neither.
    added = {path: add for path, add in adds.items() if path not in removes}
    removed = {path: remove for path, remove in removes.items() if path not in adds}
    return LogChanges(
        tuple(path.rsplit("/", 1)[-1] for path in added),
        tuple(add.get("partitionValues") or {} for add in added.values()),
        removed_data,
        tuple(added),
        deletion_vectors,
        metadata_changed,
        sum(int(add.get("size") or 0) for add in added.values()),
        purges,
        tuple(removed),
        tuple(remove.get("partitionValues") for remove in removed.values()),
        sum(int(remove.get("size") or 0) for remove in removed.values()),
    )


def _check_paths(log_path: str, version: int, actions: list[dict]) -> None:
    """Refuse commit `version` when an action names a path outside the table
    (`delta_log.check_action_paths`, as the path guard checks it)."""
    for action in actions:
        try:
            check_action_paths(action)
        except OutsideTableError as error:
            if is_local(log_path):
                raise commit_damage(log_path, version, error) from None
            raise OutsideTableError(f"{log_path}: commit {version}: {error}") from None


# The userMetadata key of compaction's purge commits (maintenance/compaction.py), beside
# "tombstones_version": the version of the tombstones whose events it removed.
PURGE = "purge"


def _purge_of_hidden_rows(actions: list[dict], hidden_tombstones_version: int, added_since: Container[str]) -> bool:
    """Whether a commit (its actions) is a purge of the events of tombstones at a version at most
    `hidden_tombstones_version` that changes no metadata and rewrites only files older than the
    range read (none of `added_since`): the rows it keeps are then rows the reader has already."""
    info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
    metadata = _parse_metadata(info.get("userMetadata"))
    applied = metadata.get("tombstones_version")
    if PURGE not in metadata or not isinstance(applied, int) or applied > hidden_tombstones_version:
        return False
    return not any(
        "metaData" in action
        or "protocol" in action
        or ("remove" in action and table_relative(action["remove"]["path"]) in added_since)
        for action in actions
    )


def _commit_actions(spark: SparkSession, log_path: str, commits: list[str]) -> list[list[dict]]:
    """The actions of each of the commit files `commits`, in order: read here on a local disk,
    by Spark elsewhere."""
    if not is_local(log_path):
        rows = spark.read.text(commits).select("value", F.col("_metadata.file_path").alias("file")).collect()
        by_file: dict[str, list[dict]] = {}
        for row in rows:
            if row.value.strip():
                by_file.setdefault(row.file.rsplit("/", 1)[-1], []).append(json.loads(row.value))
        return [by_file.get(commit.rsplit("/", 1)[-1], []) for commit in commits]
    per_commit = []
    for commit in commits:
        local = commit.removeprefix("file://").removeprefix("file:")
        if not os.path.exists(local):
            raise FileNotFoundError(f"[PATH_NOT_FOUND] {commit} does not exist")
        with open(local, encoding="utf-8") as handle:
            per_commit.append([json.loads(line) for line in handle.read().splitlines() if line.strip()])
    return per_commit


def rows_added(log_at_version: DataFrame, changes: LogChanges) -> DataFrame:
    """The log rows that live in the files `changes` added (partition-pruned, then by file)."""
    frame = log_at_version
    partition_columns = sorted({column for values in changes.partition_values for column in values})
    for column in partition_columns:
        frame = frame.where(
            F.col(column).cast("string").isin(sorted({v.get(column) for v in changes.partition_values}))
        )
    return frame.where(F.col("_metadata.file_name").isin(list(changes.added_files)))


def read_rows_added(spark: SparkSession, log_path: str, log_at_version: DataFrame, changes: LogChanges) -> DataFrame:
    """`rows_added`, read straight from the added Parquet files: a scan of those files only,
    where `rows_added` lists every file of the snapshot's partitions and filters their rows.

    Exact when Delta's reader would add nothing to a plain Parquet read of those files: no
    deletion vector on them and no column mapping (physical column names); our tables use
    neither (runtime/lake.py). Otherwise it is `rows_added`. Partition columns, which Delta
    keeps in the add actions and not in the files, are added from them."""
    if (
        not changes.added_paths
        or changes.deletion_vectors
        or changes.metadata_changed
        or _column_mapping(spark, log_path)
    ):
        return rows_added(log_at_version, changes)
    return _read_files(spark, log_path, log_at_version.schema, changes.added_paths, changes.partition_values)


def read_rows_removed(spark: SparkSession, log_path: str, schema: StructType, changes: LogChanges) -> DataFrame | None:
    """The rows of the files `changes` removed (`removed_paths`), read straight from them while
    vacuum has not deleted them: what a delete or an erasure took out of the log, with the rows
    it kept (which are also in files `changes` added). None when they cannot be read exactly:
    a file gone, a remove action without its partition values, deletion vectors, column mapping,
    a metadata change."""
    if (
        changes.deletion_vectors
        or changes.metadata_changed
        or any(values is None for values in changes.removed_partition_values)
        or _column_mapping(spark, log_path)
        or missing_files(spark, (f"{log_path.rstrip('/')}/{path}" for path in changes.removed_paths))
    ):
        return None
    if not changes.removed_paths:
        return spark.createDataFrame([], schema)
    return _read_files(spark, log_path, schema, changes.removed_paths, changes.removed_partition_values)


def _read_files(
    spark: SparkSession, log_path: str, schema: StructType, paths: tuple[str, ...], partition_values: tuple
) -> DataFrame:
    """The rows of the table's data files `paths` (relative to its root) in the table's `schema`,
    their partition columns (kept in the Delta log, not in the files) from `partition_values`."""
    partition_columns = sorted({column for values in partition_values for column in values})
    data_schema = StructType([field for field in schema if field.name not in partition_columns])
    files_by_partition: dict[tuple, list[str]] = {}
    for path, values in zip(paths, partition_values, strict=True):
        if is_local(log_path):  # a symlink inside the table must not lead Spark's read out of it
            try:
                resolve_in_table(log_path, path)
            except OutsideTableError as error:
                raise outside_table_damage(log_path, error) from None
        files_by_partition.setdefault(tuple(values.get(column) for column in partition_columns), []).append(
            f"{log_path.rstrip('/')}/{path}"
        )
    frames = []
    for values, files in sorted(files_by_partition.items(), key=lambda item: str(item[0])):
        frame = spark.read.schema(data_schema).parquet(*files)
        for column, value in zip(partition_columns, values, strict=True):
            frame = frame.withColumn(column, F.lit(value).cast(schema[column].dataType))
        frames.append(frame.select(*schema.names))
    return reduce(DataFrame.unionByName, frames)


def _column_mapping(spark: SparkSession, path: str) -> bool:
    """Whether the table stores columns under physical names (Delta column mapping)."""
    return read_table_properties(spark, path).get("delta.columnMapping.mode", "none") != "none"


def latest_commit_metadata(spark: SparkSession, path: str, wanted: Callable[[dict], bool]) -> dict | None:
    """The userMetadata (a JSON object) of the newest commit of `path` for which `wanted` is
    true, or None (no table, or no such commit)."""
    return latest_commit_metadata_at(spark, path, wanted)[1]


def latest_commit_metadata_at(
    spark: SparkSession, path: str, wanted: Callable[[dict], bool]
) -> tuple[int | None, dict | None]:
    """The table's latest version and, as of it, `latest_commit_metadata`: read together from
    one listing of the history, so that the table read at that version is the one the metadata
    describes (later commits had not happened). (None, None) when there is no table. On a local
    disk the commit files are read here, newest first, without a Spark job."""
    if is_local(path):
        latest = latest_version_on_disk(path)
        return (None, None) if latest is None else latest_commit_metadata_on_disk(path, wanted, newest=latest + 1)
    if not DeltaTable.isDeltaTable(spark, path):
        return None, None
    table = DeltaTable.forPath(spark, path)
    latest_version = None
    for history in (table.history(20), table.history()):  # our commits are usually the latest
        rows = history.orderBy(F.col("version").desc()).select("version", "userMetadata").collect()
        if latest_version is None and rows:
            latest_version = rows[0]["version"]
        for row in rows:
            if row["version"] > latest_version:  # committed after the first listing
                continue
            metadata = _parse_metadata(row["userMetadata"])
            if metadata and wanted(metadata):
                return latest_version, metadata
    return latest_version, None


def latest_commit_metadata_on_disk(
    path: str, wanted: Callable[[dict], bool], newest: int = 20
) -> tuple[int | None, dict | None]:
    """`latest_commit_metadata_at` for a table on a local disk, read from its newest `newest`
    commit files without a JVM (for sensors): the table's latest version and the userMetadata of
    the newest of those commits for which `wanted` is true. (None, None) when there is no table;
    (version, None) when none of those commits is wanted, or their files are gone (log cleanup
    keeps only commits a checkpoint does not cover, and checkpoints hold no commit information)."""
    latest = latest_version_on_disk(path)
    if latest is None:
        return None, None
    for version in range(latest, max(latest - newest, -1), -1):
        try:
            info = _commit_info_on_disk(path, version)
        except FileNotFoundError:
            continue
        metadata = _parse_metadata(info.get("userMetadata"))
        if metadata and wanted(metadata):
            return latest, metadata
    return latest, None


def find_commit(
    spark: SparkSession, path: str, wanted: Callable[[dict], bool], after: int = -1, upto: int | None = None
) -> tuple[int, dict] | None:
    """The newest commit after version `after` (and at most `upto`) of the table at `path` whose
    userMetadata (a JSON object) `wanted` accepts: its version and commitInfo, or None. On a local
    disk its commit files are read here, newest first, without a Spark job; elsewhere the history.

        version, info = find_commit(spark, path, lambda m: m.get("ingest_batch") == 7)
    """
    if is_local(path):
        latest = latest_version_on_disk(path)
        newest = -1 if latest is None else latest if upto is None else min(latest, upto)
        for version in range(newest, after, -1):
            try:
                info = _commit_info_on_disk(path, version)
            except FileNotFoundError:  # cleaned up: older commits are covered by a checkpoint
                break
            metadata = _parse_metadata(info.get("userMetadata"))
            if metadata and wanted(metadata):
                return version, info
        return None
    table = DeltaTable.forPath(spark, path)
    histories = (
        (table.history().where(F.col("version") > after),)
        if after >= 0 or upto is not None
        else (table.history(50), table.history())
    )
    for history in histories:  # a writer usually looks itself up at once: the newest 50 first
        if upto is not None:
            history = history.where(F.col("version") <= upto)
        for row in history.orderBy(F.col("version").desc()).collect():
            metadata = _parse_metadata(row["userMetadata"])
            if metadata and wanted(metadata):
                return row["version"], row.asDict(recursive=True)
    return None


def commit_info(spark: SparkSession, path: str, version: int) -> dict:
    """The commitInfo of commit `version` of the table at `path` (operation, operationMetrics,
    userMetadata, ...): read from its commit file on a local disk, from the history elsewhere."""
    if is_local(path):
        return _commit_info_on_disk(path, version)
    row = DeltaTable.forPath(spark, path).history().where(F.col("version") == version).first()
    return {} if row is None else row.asDict(recursive=True)


def _commit_info_on_disk(path: str, version: int) -> dict:
    """The commitInfo in commit file `version` of the local table at `path` ({} when it has none
    that parses); FileNotFoundError when the file is gone, DamagedTableError when it is not text."""
    commit = commit_path(path, version)
    try:
        with open(commit, encoding="utf-8") as handle:
            for line in handle:
                if '"commitInfo"' in line:
                    try:
                        return json.loads(line)["commitInfo"]
                    except (json.JSONDecodeError, KeyError):
                        return {}
    except UnicodeDecodeError as error:
        raise commit_damage(path, version, error) from None
    return {}


def _parse_metadata(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
