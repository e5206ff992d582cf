"""Every event_id stored once: which events of a batch are new, and their one commit to the raw log.

Two ways to know which of a batch's event ids the raw log holds already, the same answer either
way (docs/decisions/0038-ingestion-dedup-by-key-lookup.md):

- **Key lookup** (a batch of up to `KEY_LOOKUP_LIMIT` events on a local lake): the lake's serving
  index, caught up to the raw log's latest version (it applies only the commits after its stamp),
  is asked for the batch's ids by primary key; the new events are appended. Under the raw log's
  commit lock from the lookup to the commit, which every committer of the raw log takes
  (`runtime/commit_lock.py`), so no event_id can arrive in between; the batch is read, its ids
  collected and the index opened before the lock, since every appender waits while it is held.
  The cost follows the batch and the commits since the index's stamp, not the history. When the
  log's protocol allows the JVM-free appends' commit (`log/serving/append.py`), the batch's data
  files are written before the lock too and the commit is a file naming them, with the session's
  idempotent-write id and userMetadata: the appenders then wait milliseconds for an ingestion,
  not the seconds of a Spark commit.
- **MERGE on event_id** (no index that can be followed without a rebuild, a larger batch, a lake
  on an object store): Delta reads every event_id of the log and checks the read against
  concurrent commits.

    inserted = insert_new_events(spark, Lake("/data/lake"), first_of_each_event_id(events), len(lines))
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from databuild_assets.log.serving.append import (
    CommitConflictError,
    commit_files,
    fast_layout,
    raw_log_schema,
    remove_data_files,
    write_data_files,
)
from databuild_assets.log.serving.backend import DeltaRsEventLog, IndexNotFollowableError
from databuild_assets.log.serving.checkpoints import Checkpointer, open_listed
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_tables import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    refuse_paths_outside,
    retry_on_conflict,
)
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake, is_local

log = logging.getLogger(__name__)

# A batch of up to this many events asks the serving index for its ids (collected to the driver);
# a larger one MERGEs: reading the log's ids once is then in proportion to the batch.
KEY_LOOKUP_LIMIT = 100_000

# Above this many later copies of event_ids in one batch, the dedup shuffles whole rows instead of
# broadcasting the copies' keys (a broadcast is held in the driver's memory).
BROADCAST_DUPLICATES_LIMIT = 500_000


def first_of_each_event_id(events: DataFrame, broadcast_limit: int = BROADCAST_DUPLICATES_LIMIT) -> DataFrame:
    """One row per event_id: the first by (source_file, source_line); the rest are duplicates.

    Only the keys are shuffled and sorted: the later copies are found among (event_id,
    source_file, source_line), computed once (a local checkpoint), and taken out with a
    broadcast anti-join, so the whole rows never move. Duplicates are usually few; when a batch
    holds more than `broadcast_limit` of them (a landing folder delivered twice), the rows are
    ranked in a window instead. Either way the same rows survive.
    """
    keys = ["event_id", "source_file", "source_line"]
    first = Window.partitionBy("event_id").orderBy("source_file", "source_line")
    later = (
        events.select(*keys).withColumn("_rank", F.row_number().over(first)).where("_rank > 1").drop("_rank")
    ).localCheckpoint()
    if later.count() > broadcast_limit:
        return events.withColumn("_rank", F.row_number().over(first)).where("_rank = 1").drop("_rank")
    return events.join(F.broadcast(later), keys, "left_anti").select(*events.columns)


def merge_new_events(spark: SparkSession, log_path: str, events: DataFrame) -> DataFrame:
    """Insert the events whose event_id is not in the log yet: one commit. Returns the metrics.

    MERGE (not a blind append) so that Delta checks the read against concurrent commits: two
    writers inserting the same event_id at once conflict, and the retry skips it. Under the
    log's commit lock, which JVM-free appenders take too (runtime/commit_lock.py).
    """
    with commit_lock(log_path):
        refuse_paths_outside(log_path)  # the MERGE reads every event_id of the log's files
        target = DeltaTable.forPath(spark, log_path).alias("log")
        return target.merge(events.alias("new"), "log.event_id = new.event_id").whenNotMatchedInsertAll().execute()


def _followable_index(lake: Lake) -> DeltaRsEventLog | None:
    """The lake's serving index, caught up to the log's latest version, to look event ids up in;
    None when the lake has no index that can be followed without a rebuild (none yet, a replaced
    table, commits past the log's retention, a read-only lake), or busy past SQLite's wait
    (another process holding its write lock)."""
    try:
        return DeltaRsEventLog(lake, writer="ingest", build=False)
    except (IndexNotFollowableError, sqlite3.OperationalError) as why:
        log.info("no serving index to look event ids up in (%s): the batch MERGEs on event_id", why)
        return None


def _looked_up(index: DeltaRsEventLog, event_ids: list[str]) -> set[str] | None:
    try:
        return index.known_event_ids(event_ids)
    except (IndexNotFollowableError, sqlite3.OperationalError) as why:
        log.info("the serving index could not look event ids up (%s): the batch MERGEs on event_id", why)
        return None


@dataclass
class _Staged:
    """The rows of a batch written as data files of the raw log (`table`) ahead of their commit:
    their `add` actions, which no commit names yet."""

    path: str
    table: deltalake.DeltaTable
    rows: pa.Table
    actions: list[dict[str, Any]]

    def discard(self) -> None:
        remove_data_files(self.path, self.actions)
        self.actions = []


def _stage(log_path: str, batch: DataFrame) -> _Staged | None:
    """`batch` (its rows collected: at most KEY_LOOKUP_LIMIT) written as data files of the raw log
    before the commit lock is taken, as the JVM-free appends do; None when the log's protocol
    wants Spark's commit (`fast_layout`)."""
    table = open_listed(log_path)
    layout = fast_layout(table)
    if layout is None:
        return None
    try:
        rows = batch.select(*RAW_EVENT_LOG.schema.fieldNames()).toArrow().cast(raw_log_schema())
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as why:  # Spark's write checks and says what
        log.warning("%s: the batch's rows do not cast to the raw log's schema (%s): Spark writes them", log_path, why)
        return None
    return _Staged(log_path, table, rows, write_data_files(log_path, rows, *layout) if rows.num_rows else [])


def _session_commit(spark: SparkSession) -> tuple[dict[str, Any] | None, str | None]:
    """The `txn` action and the userMetadata the session's settings give a Delta commit."""
    app_id, version = spark.conf.get(TXN_APP_ID, None), spark.conf.get(TXN_VERSION, None)
    txn = None
    if app_id and version:
        txn = {"appId": app_id, "version": int(version), "lastUpdated": int(time.time() * 1000)}
    return txn, spark.conf.get(USER_METADATA, None)


def _commit_staged(
    spark: SparkSession, index: DeltaRsEventLog, staged: _Staged, known: set[str]
) -> tuple[int, int | None] | None:
    """Under the commit lock, after the lookup: the staged files (rewritten without the rows of
    `known` ids) committed as the version after the one the index was caught up to, with the
    session's idempotent-write id and userMetadata, as Spark's append would. The rows inserted and
    the version committed ((0, None) when the log recorded that id already: Spark skips such a
    write too), or None when the log is not at the version the lookup saw (the caller writes
    through Spark)."""
    latest, table = index.version, staged.table
    table.update_incremental()
    if latest is None or table.version() != latest:
        return None
    txn, user_metadata = _session_commit(spark)
    recorded = None if txn is None else table.transaction_version(txn["appId"])
    if recorded is not None and recorded >= txn["version"]:
        log.info("%s: %s %d is recorded already: nothing written", staged.path, txn["appId"], txn["version"])
        staged.discard()
        return 0, None
    rows = staged.rows
    if known:  # rare (a file delivered again): the files without those rows, under the lock
        staged.discard()
        rows = rows.filter(pc.invert(pc.is_in(rows.column("event_id"), value_set=pa.array(sorted(known)))))
        staged.actions = write_data_files(staged.path, rows, *fast_layout(table)) if rows.num_rows else []
    commit_info: dict[str, Any] = {
        "operationMetrics": {"numFiles": str(len(staged.actions)), "numOutputRows": str(rows.num_rows)}
    }
    if user_metadata is not None:
        commit_info["userMetadata"] = user_metadata
    actions = ([{"txn": txn}] if txn is not None else []) + staged.actions
    try:
        commit_files(staged.path, latest + 1, actions, list(table.metadata().partition_columns), commit_info)
    except CommitConflictError:
        return None  # a writer that ignores the lock took that version: Spark's commit checks it
    staged.actions = []  # committed: the log names them
    return rows.num_rows, latest + 1


def _append_unknown(
    spark: SparkSession, index: DeltaRsEventLog, batch: DataFrame, ids: list[str], what: str
) -> int | None:
    """Under the raw log's commit lock: the lookup of `ids` (the event ids of `batch`), caught up
    to the log's latest commit, and the append of the rows it does not know (their files written
    before the lock when the log allows, `_stage`); how many, or None when the index could not
    answer (the caller MERGEs)."""
    log_path = index.lake.table_path(RAW_EVENT_LOG)
    staged = _stage(log_path, batch)
    committed = None
    try:
        with commit_lock(log_path):
            known = _looked_up(index, ids)
            if known is None:
                return None
            done = None if staged is None else _commit_staged(spark, index, staged, known)
            if done is not None:
                inserted, committed = done
            else:
                _spark_append(spark, batch, known, log_path)
                inserted = len(ids) - len(known)
    finally:
        if staged is not None:
            staged.discard()  # none left once committed
    if committed is not None and staged is not None:  # Spark checkpoints its own commits; this one is ours
        checkpoints = Checkpointer(log_path)
        checkpoints.after_commit(committed, staged.table.metadata().configuration)
        checkpoints.wait()
    log.info("%s: %d events, %d already in the log (key lookup)", what, len(ids), len(known))
    return inserted


def _spark_append(spark: SparkSession, batch: DataFrame, known: set[str], log_path: str) -> None:
    """Spark's append of the rows of `batch` whose event id is not in `known` (under the lock)."""
    new = batch
    if known:
        known_ids = spark.createDataFrame([(event_id,) for event_id in sorted(known)], "event_id string")
        new = batch.join(F.broadcast(known_ids), "event_id", "left_anti")
    # A commit also when nothing is new: it carries the batch's transaction id, the raw log's
    # record that the batch committed (what `check` and a replay look for).
    new.select(*RAW_EVENT_LOG.schema.fieldNames()).write.format("delta").mode("append").save(log_path)


def insert_new_events(spark: SparkSession, lake: Lake, events: DataFrame, at_most: int, what: str = "") -> int:
    """Add to the raw log, in one commit, the `events` (one row per event_id, at most `at_most`)
    whose event_id it does not hold: by key lookup when it can, else by MERGE (module doc).
    Returns how many were inserted.

    The session's settings apply to the commit (idempotent-write ids, commit metadata): a replay
    whose transaction id the log recorded writes nothing again, on either path.
    """
    log_path = lake.table_path(RAW_EVENT_LOG)
    if 0 < at_most <= KEY_LOOKUP_LIMIT and is_local(log_path):
        # Every appender waits while the lock is held, so what needs no lock is done before it:
        # the batch read once and kept, its ids collected, the index opened.
        batch = events.cache()
        try:
            ids = [row.event_id for row in batch.select("event_id").collect()]
            index = _followable_index(lake)
            if index is not None:
                with index:
                    inserted = _append_unknown(spark, index, batch, ids, what or log_path)
                if inserted is not None:
                    return inserted
        finally:
            batch.unpersist()
    metrics = retry_on_conflict(lambda: merge_new_events(spark, log_path, events).first(), what=what or log_path)
    return int(metrics["num_inserted_rows"]) if metrics else 0  # none: a replay Delta skipped


__all__ = [
    "BROADCAST_DUPLICATES_LIMIT",
    "KEY_LOOKUP_LIMIT",
    "first_of_each_event_id",
    "insert_new_events",
    "merge_new_events",
]
