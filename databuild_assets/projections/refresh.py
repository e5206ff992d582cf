"""Keeping a projection up to date with the event log: incrementally when it can, in full when it must.

A refresh reads the log at one pinned version. Incrementally, it takes only the rows that the
log's commits since the last processed version added (their add actions), finds the keys
those rows touch, recomputes those keys' rows from *all* their events and MERGEs them in. So
a late event (an older timestamp in a newer commit) gives the same rows as a full rebuild,
and applying the same range twice changes nothing. The processed log version is written in
the projection commit's own userMetadata: atomic with the rows it describes. A refresh that
changes no rows gets no data commit (Delta skips empty ones), so it records the version in a
metadata-only commit instead (a table property); otherwise every later refresh would redo it.

A full rebuild happens when asked, when the projection is missing or records no version, when
the commits since then are no longer readable (log cleanup), or when they removed data
(erasure or a rewrite): those are not appends, and a rebuild is the simple correct answer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from databuild_assets.projections.projection import Projection
from databuild_assets.runtime.commits import LogVersionsUnavailable, latest_commit_metadata, log_changes, rows_added
from databuild_assets.runtime.delta_tables import (
    USER_METADATA,
    current_version,
    ensure_table,
    retry_on_conflict,
    session_settings,
)
from databuild_assets.runtime.lake import Lake, TableSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefreshResult:
    projection: str
    mode: str  # "full", "incremental" or "up-to-date"
    reason: str
    from_version: int | None  # log version processed before (None: never)
    to_version: int  # log version processed now
    keys_refreshed: int | None  # incremental: keys recomputed; full: rows written
    projection_version: int


def projection_spec(projection: Projection) -> TableSpec:
    return TableSpec(projection.name, projection.schema, (), f"Projection {projection.name}, one row per {projection.key}.")


def processed_log_version(spark: SparkSession, path: str, projection: str) -> int | None:
    """The log version the projection's latest refresh commit recorded, or None."""
    metadata = latest_commit_metadata(spark, path, lambda m: m.get("projection") == projection)
    return None if metadata is None else int(metadata["log_version"])


def _commit_metadata(projection: Projection, log_version: int, mode: str) -> str:
    return json.dumps({"projection": projection.name, "log_version": log_version, "mode": mode})


def record_processed_version(session: SparkSession, path: str, projection: Projection, log_version: int, mode: str) -> None:
    """Record `log_version` as processed in a commit that changes no rows (for refreshes that had
    none to change): a table property set under the same userMetadata that data commits carry."""
    with session_settings(session, {USER_METADATA: _commit_metadata(projection, log_version, mode)}):
        retry_on_conflict(
            lambda: session.sql(
                f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('databuild.processed_log_version' = '{log_version}')"
            ),
            what=f"record log version {log_version} for {projection.name} at {path}",
        )


def rebuild(spark: SparkSession, path: str, projection: Projection, log_at_version: DataFrame, log_version: int) -> None:
    """Replace the projection (an existing table) with `build` of the whole log, in one commit."""
    rows = projection.build(log_at_version).select(*projection.schema.fieldNames())
    (rows.write.format("delta").mode("overwrite")
        .option("userMetadata", _commit_metadata(projection, log_version, "full"))
        .save(path))


def merge_keys(
    session: SparkSession, path: str, projection: Projection, log_at_version: DataFrame, new_rows: DataFrame, log_version: int
) -> int:
    """Recompute the keys `new_rows` touch from all their events and MERGE them in; returns the key count."""
    keys = projection.keys_of(new_rows).cache()
    # Kept once computed: MERGE reads its source twice (the files to rewrite, then the rewrite),
    # and Delta does not materialize a deterministic source of Delta scans itself; unkept, the
    # whole log would be scanned and aggregated twice.
    rows = projection.build(projection.events_for_keys(log_at_version, keys)).select(*projection.schema.fieldNames())
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        key_count = keys.count()
        key = projection.key
        with session_settings(session, {USER_METADATA: _commit_metadata(projection, log_version, "incremental")}):
            retry_on_conflict(
                lambda: DeltaTable.forPath(session, path).alias("current")
                .merge(rows.alias("fresh"), f"current.`{key}` = fresh.`{key}`")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute(),
                what=f"refresh {projection.name} at {path}",
            )
        return key_count
    finally:
        rows.unpersist()
        keys.unpersist()


def refresh_projection(
    spark: SparkSession, lake: Lake, projection: Projection, source: TableSpec, full: bool = False
) -> RefreshResult:
    """Bring `projection` up to the current version of the `source` log table.

        result = refresh_projection(spark, lake, PROJECTIONS["partition_state"], RAW_EVENT_LOG)
    """
    # userMetadata is a session setting: a session of our own keeps it off other threads' commits.
    session = spark.newSession()
    source_path, path = lake.table_path(source), lake.table_path(projection_spec(projection))
    log_version = current_version(session, source_path)
    log_at_version = session.read.format("delta").option("versionAsOf", log_version).load(source_path)
    processed = processed_log_version(session, path, projection.name)
    ensure_table(session, path, projection_spec(projection))
    version_before = current_version(session, path)

    def done(mode: str, reason: str, keys: int | None) -> RefreshResult:
        if processed != log_version and current_version(session, path) == version_before:
            record_processed_version(session, path, projection, log_version, mode)  # no rows changed
        result = RefreshResult(projection.name, mode, reason, processed, log_version, keys, current_version(session, path))
        log.info("%s: %s refresh (%s), log version %s -> %d, %s keys", projection.name, mode, reason, processed, log_version, keys)
        return result

    if full:
        reason = "full rebuild requested"
    elif processed is None:
        reason = "projection has no recorded log version"
    elif processed > log_version:
        reason = f"recorded log version {processed} is newer than the log's {log_version} (log replaced?)"
    elif processed == log_version:
        return done("up-to-date", "no new log commits", 0)
    else:
        try:
            changes = log_changes(session, source_path, processed, log_version)
        except LogVersionsUnavailable as error:
            reason = str(error)
        else:
            if changes.removed_data:
                reason = f"log commits {processed + 1}..{log_version} removed data"
            elif not changes.added_files:  # e.g. only compaction commits (dataChange=false)
                return done("up-to-date", f"log commits {processed + 1}..{log_version} added no data", 0)
            else:
                keys = merge_keys(session, path, projection, log_at_version, rows_added(log_at_version, changes), log_version)
                return done("incremental", f"{len(changes.added_files)} files added", keys)
    rebuild(session, path, projection, log_at_version, log_version)
    return done("full", reason, session.read.format("delta").load(path).count())
