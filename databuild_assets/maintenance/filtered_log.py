"""filtered_event_log: the raw log minus every event a tombstone matches.

Projections read this table, so an erased event leaves them at their next refresh, before
compaction purges it from the raw log. A refresh pins the raw log and tombstones versions and, in
one commit, inserts the raw rows appended since its last run that no tombstone matches and deletes
the rows that tombstones new since then match: a MERGE keyed by event_id, or, when no tombstone is
new (a landing file's run), an idempotent append. The versions it reflects are recorded in that
commit's userMetadata. Compaction's purges of the raw log are read past: they removed only events
of tombstones this table applies (their commits say which version), and re-added the rest of the
files they rewrote, rows this table holds. It rebuilds in full when other raw log commits removed
data (a repair, a replaced table), when they are no longer on disk, or when asked.

The MERGE keys on event_id, so neither an erased value nor a predicate naming it appears in
the Delta log's commit information."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databuild_assets.maintenance.tombstones import matching_events, read_tombstones, visible_events
from databuild_assets.runtime.commits import (
    LogVersionsUnavailable,
    commit_info,
    latest_commit_metadata,
    log_changes,
    read_rows_added,
)
from databuild_assets.runtime.delta_tables import (
    USER_METADATA,
    current_version,
    ensure_table,
    refuse_paths_outside,
    retry_on_conflict,
    session_settings,
)
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES, Lake

log = logging.getLogger(__name__)

# Delta idempotent-write application id of the filtered log's appends (txnVersion: the raw log version).
FILTERED_APP_ID = "databuild-filtered-log"


@dataclass(frozen=True)
class FilteredLogResult:
    mode: str  # "full", "incremental" or "up-to-date"
    reason: str
    raw_log_version: int
    tombstones_version: int
    inserted: int
    deleted: int
    version: int


def _recorded(spark: SparkSession, path: str) -> dict | None:
    return latest_commit_metadata(spark, path, lambda m: "raw_log_version" in m and "tombstones_version" in m)


def append_new_events(
    session: SparkSession, path: str, events: DataFrame, raw_version: int, metadata: str
) -> int | None:
    """Append the raw log's new visible events, recording the versions they reflect; the rows
    written, or None when Delta skipped the write. A blind append, not a MERGE: these events are new
    to the raw log, so not in this table (the versions recorded in the same commit keep a later
    refresh from reading them again), and Delta's idempotent-write id (app id, txnVersion = the raw
    log version) makes a second refresh racing to the same version write nothing."""
    (
        events.select(*FILTERED_EVENT_LOG.schema.fieldNames())
        .write.format("delta")
        .mode("append")
        .option("txnAppId", FILTERED_APP_ID)
        .option("txnVersion", raw_version)
        .option("userMetadata", metadata)
        .save(path)
    )
    info = commit_info(session, path, current_version(session, path))
    if info.get("userMetadata") != metadata:  # no commit of ours: Delta skipped the write
        return None
    return int((info.get("operationMetrics") or {}).get("numOutputRows", 0))


def refresh_filtered_log(spark: SparkSession, lake: Lake, full: bool = False) -> FilteredLogResult:
    """Bring filtered_event_log up to the current raw log and tombstones.

    result = refresh_filtered_log(spark, Lake("/data/lake"))
    """
    session = spark.newSession()  # userMetadata is a session setting: keep it off other threads
    raw_path, path = lake.table_path(RAW_EVENT_LOG), lake.table_path(FILTERED_EVENT_LOG)
    tombstones_path = lake.table_path(TOMBSTONES)
    refuse_paths_outside(path)  # its MERGE rewrites the files it reads (the raw log's are checked by ensure_table)
    ensure_table(session, tombstones_path, TOMBSTONES)
    ensure_table(session, raw_path, RAW_EVENT_LOG)
    raw_version, tombstones_version = current_version(session, raw_path), current_version(session, tombstones_path)
    tombstones = read_tombstones(session, lake, tombstones_version)
    raw_at = session.read.format("delta").option("versionAsOf", raw_version).load(raw_path)
    recorded = _recorded(session, path)
    metadata = json.dumps({"raw_log_version": raw_version, "tombstones_version": tombstones_version})

    def done(mode: str, reason: str, inserted: int = 0, deleted: int = 0) -> FilteredLogResult:
        result = FilteredLogResult(
            mode, reason, raw_version, tombstones_version, inserted, deleted, current_version(session, path)
        )
        log.info(
            "filtered_event_log: %s (%s): +%d -%d rows, raw log v%d, tombstones v%d",
            mode,
            reason,
            inserted,
            deleted,
            raw_version,
            tombstones_version,
        )
        return result

    reason = "full rebuild requested" if full else None
    if reason is None and recorded is None:
        reason = "no recorded versions"
    if reason is None:
        raw_before, tombstones_before = int(recorded["raw_log_version"]), int(recorded["tombstones_version"])
        if (raw_before, tombstones_before) == (raw_version, tombstones_version):
            return done("up-to-date", "no new raw log or tombstone commits")
        if raw_before > raw_version or tombstones_before > tombstones_version:
            reason = (
                f"recorded versions (raw log {raw_before}, tombstones {tombstones_before}) are newer than the "
                f"tables' ({raw_version}, {tombstones_version}): a table was replaced?"
            )
    if reason is None:
        try:
            changes = log_changes(
                session, raw_path, raw_before, raw_version, hidden_tombstones_version=tombstones_version
            )
        except LogVersionsUnavailable as error:
            reason = str(error)
        else:
            if changes.removed_data:
                reason = f"raw log commits {raw_before + 1}..{raw_version} removed data"
            else:
                added = f"{len(changes.added_files)} raw files added" + (
                    f" ({changes.purges} purges of hidden events read past)" if changes.purges else ""
                )
                new_tombstones = []
                if tombstones_before != tombstones_version:  # else none is new: no second read
                    known = {t.tombstone_id for t in read_tombstones(session, lake, tombstones_before)}
                    new_tombstones = [t for t in tombstones if t.tombstone_id not in known]
                inserts = (
                    visible_events(read_rows_added(session, raw_path, raw_at, changes), tombstones)
                    if changes.added_files
                    else raw_at.limit(0)
                ).withColumn("_action", F.lit("insert"))
                if not new_tombstones:  # the landing path: new events only, nothing to delete
                    appended = append_new_events(session, path, inserts.drop("_action"), raw_version, metadata)
                    if appended is not None:
                        return done("incremental", f"{added}, 0 new tombstones", appended)
                    # Delta skipped it, its id saying this raw version was appended already (a refresh
                    # racing this one, or a raw log replaced since): the MERGE checks each event id.
                current = session.read.format("delta").load(path)
                deletes = (
                    matching_events(current, new_tombstones).select("event_id")
                    if new_tombstones
                    else current.limit(0).select("event_id")
                ).withColumn("_action", F.lit("delete"))
                source = inserts.unionByName(deletes, allowMissingColumns=True)
                columns = FILTERED_EVENT_LOG.schema.fieldNames()
                with session_settings(session, {USER_METADATA: metadata}):
                    metrics = retry_on_conflict(
                        lambda: (
                            DeltaTable.forPath(session, path)
                            .alias("log")
                            .merge(source.alias("change"), "log.event_id = change.event_id")
                            .whenMatchedDelete(condition="change._action = 'delete'")
                            .whenNotMatchedInsert(
                                condition="change._action = 'insert'", values={c: f"change.`{c}`" for c in columns}
                            )
                            .execute()
                            .first()
                        ),
                        what=f"refresh filtered_event_log at {path}",
                    )
                return done(
                    "incremental",
                    f"{added}, {len(new_tombstones)} new tombstones",
                    int(metrics["num_inserted_rows"]),
                    int(metrics["num_deleted_rows"]),
                )
    ensure_table(session, path, FILTERED_EVENT_LOG)
    rows = visible_events(raw_at, tombstones)
    rows.write.format("delta").mode("overwrite").option("userMetadata", metadata).save(path)
    return done("full", reason, session.read.format("delta").load(path).count())
