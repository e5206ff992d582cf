"""Compaction: physically purge what tombstones match, and bin-pack small files.

When there is something to purge, the logs are bin-packed first (see below): the purge then reads
a few packed files, not the thousands of small ones a service's appends leave.

Purge, table by table (raw log, filtered log, quarantine), for the tombstones pending when the
run starts, and for applied tombstones that match raw log rows again (events that arrived after
their purge: a writer's retried call, a landing file delivered again; hidden at once like any
match, and purged now, or the raw log would keep them for good):

1. pin the table's version v and compute, by the tombstone rule, which rows must go;
2. dry-run the purge on a shallow clone of the table at v (a new table that shares v's files)
   and verify that the rows it keeps are exactly the rows expected to be kept (count and a
   checksum over every column) and that none of them matches; if not, fail: the real table
   is untouched;
3. run the same purge on the real table: a MERGE on event_id that deletes the matched rows.
   With deletion vectors off (on every table of ours), Delta rewrites the files that held them, so
   the rows leave the live Parquet files. The MERGE retries on Delta's conflicts, so appends
   that land meanwhile are neither lost nor failed. It names no erased value in the commit; it
   records the tombstones version it applied, so the filtered log, which hides those events
   already, reads past the raw log's purge instead of rebuilding (runtime/commits.py).

The projections are then refreshed (in full when their source, the filtered log, removed data
since their last refresh: their live files then no longer hold the values). Bin-packing covers
closed date partitions of the logs (dataChange=false: it does not conflict with appends; before
the purge when there is one), the small tables and the projections (whose refreshes leave a few
small files each): without Spark where maintenance/local_bin_pack.py can, else by OPTIMIZE.
Then every ingested landing file and archived landing file that holds a line any tombstone
matches is rewritten without it (maintenance/landing_files.py). Then exactly the tombstones this
run purged are recorded as applied; one recorded while it ran stays pending for the next run.
Last, old checkpoints of each local table are thinned to one an hour
(maintenance/log_checkpoints.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial, reduce
from typing import NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.landing_files import LandingErasureResult, erase_from_landing_files
from databuild_assets.maintenance.local_bin_pack import PackConflictError, bin_pack_locally
from databuild_assets.maintenance.log_checkpoints import thin_checkpoints
from databuild_assets.maintenance.tombstones import (
    Tombstone,
    lines_mentioning,
    matching_event_ids,
    matching_events,
    read_tombstones,
    record_applied,
    visible_events,
)
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import projection_spec
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.commits import PURGE, find_commit
from databuild_assets.runtime.delta_tables import (
    RETRYABLE_CONFLICTS,
    USER_METADATA,
    TableSize,
    current_version,
    ensure_table,
    refuse_paths_outside,
    retry_on_conflict,
    session_settings,
    table_size,
)
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    INGEST_LEDGER,
    RAW_EVENT_LOG,
    TOMBSTONES,
    Lake,
    TableSpec,
    is_local,
    plain_path,
)
from databuild_assets.runtime.object_store import is_s3

log = logging.getLogger(__name__)

# OPTIMIZE packs the files smaller than this and leaves the others (Delta's default is 1 GB: every
# file of a date under it is rewritten at each bin-pack, so a service's raw log, bin-packed by
# file count every ~10,000 appends, would rewrite the whole day so far each time, under the commit
# lock). A packed file grows to this size over a few bin-packs, then stays.
PACKED_FILE_BYTES = 64 * 2**20
_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"

EVENT_TABLES = (RAW_EVENT_LOG, FILTERED_EVENT_LOG)
PROJECTION_TABLES = tuple(projection_spec(projection) for projection in PROJECTIONS.values())


class PurgeVerificationError(RuntimeError):
    """The dry run of a purge kept other rows than expected; the real table was not touched."""


@dataclass(frozen=True)
class TableCompaction:
    table: str
    before: TableSize
    after: TableSize
    rows_purged: int
    files_compacted: int
    files_rewritten: int = 0  # by the purge: the files that held purged rows, of before.num_files


@dataclass(frozen=True)
class Purge:
    """What `purge_events` did to one table: rows matched per tombstone id, and the files its
    delete rewrote (those that held a purged row)."""

    rows_per_tombstone: dict[str, int] = field(default_factory=dict)
    files_rewritten: int = 0


@dataclass(frozen=True)
class CompactionResult:
    tables: tuple[TableCompaction, ...]
    rows_purged_per_tombstone: dict[str, int] = field(default_factory=dict)
    applied: tuple[str, ...] = ()
    landing: LandingErasureResult = LandingErasureResult()
    # Seconds per phase, in the order they ran: which one a slow run spent its time in.
    phase_seconds: dict[str, float] = field(default_factory=dict)


class RowsChecksum(NamedTuple):
    rows: int
    checksum: int  # order-independent, over every column


def _checksum(frame: DataFrame) -> RowsChecksum:
    """The rows of `frame` and an order-independent checksum of every column."""
    row_hash = F.xxhash64(F.to_json(F.struct(*[F.col(c) for c in frame.columns])))
    stats = frame.agg(F.count("*").alias("rows"), F.sum(row_hash.cast("decimal(38,0)")).alias("hash")).first()
    return RowsChecksum(int(stats["rows"]), int(stats["hash"] or 0))


def _drop_dir(spark: SparkSession, path: str) -> None:
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(hadoop_path, True)


def _delete_by_event_id(
    spark: SparkSession, path: str, event_ids: DataFrame, tombstones_version: int | None, scope: Column
) -> tuple[int, int]:
    """Delete the rows of `event_ids` from the table at `path`, all within the rows `scope` (on
    columns of the alias `t`) selects: (rows deleted, files rewritten). The commit records the
    version of the tombstones whose events these are, if given: the filtered log then knows it
    hides them already, and reads past the commit (`log_changes`)."""
    token = uuid.uuid4().hex
    metadata = (
        {PURGE: token} if tombstones_version is None else {PURGE: token, "tombstones_version": tombstones_version}
    )

    def delete(locked: bool) -> Row:
        with commit_lock(path) if locked else contextlib.nullcontext():
            with session_settings(spark, {USER_METADATA: json.dumps(metadata)}):
                return (
                    DeltaTable.forPath(spark, path)
                    .alias("t")
                    .merge(event_ids.alias("erase"), (F.col("t.event_id") == F.col("erase.event_id")) & scope)
                    .whenMatchedDelete()
                    .execute()
                    .first()
                )

    # First without the commit lock: the MERGE reads and rewrites for as long as the partitions
    # in `scope` take, and the appends would wait all that time. Its commit is atomic (our log
    # store commits by hard link), and Delta checks it against what committed meanwhile: an
    # append into another partition does not touch it. An append into one of its partitions
    # does (Delta's open-source tables are Serializable), and then it runs again under the lock
    # (decision 0055).
    try:
        metrics = delete(locked=False)
    except RETRYABLE_CONFLICTS as conflict:
        log.info("purge of %s: %s; again under the commit lock", path, type(conflict).__name__)
        metrics = retry_on_conflict(lambda: delete(locked=True), what=f"purge erased events from {path}")
    found = find_commit(spark, path, lambda recorded: recorded == metadata)
    rewritten = int(((found[1].get("operationMetrics") or {}) if found else {}).get("numTargetFilesRemoved", 0))
    return int(metrics["num_deleted_rows"]), rewritten


def _partitions_holding(table: DataFrame, spec: TableSpec, event_ids: DataFrame, alias: str = "") -> list[Column]:
    """Predicates on `spec`'s partition columns (of `alias`, when given) that hold for every row
    of `table` whose event_id is in `event_ids`, the first on unqualified columns and the second
    on `alias`'s (the whole table when it has no partition columns): the part of the table a
    delete of those ids can change, so the part a check of that delete must read."""
    if not spec.partition_by:
        return [F.lit(True), F.lit(True)]
    values = table.join(event_ids, "event_id", "left_semi").select(*spec.partition_by).distinct().collect()
    if not values:
        return [F.lit(False), F.lit(False)]
    return [
        reduce(
            lambda a, b: a | b,
            (
                reduce(lambda a, b: a & b, (F.col(prefix + c) == F.lit(row[c]) for c in spec.partition_by))
                for row in values
            ),
        )
        for prefix in ("", f"{alias}.")
    ]


def purge_events(
    spark: SparkSession,
    lake: Lake,
    spec: TableSpec,
    tombstones: list[Tombstone],
    event_ids: DataFrame | None = None,
    tombstones_version: int | None = None,
) -> Purge:
    """Remove every row of the event table `spec` that `tombstones` match; verified on a clone first.
    `tombstones_version`: the tombstones table's version `tombstones` were read at, recorded in
    the purge's commit.

    `event_ids` (what to delete) defaults to what the tombstone rule selects; the check compares
    the dry run's result with the rule, so a wrong id set fails before the real table changes.
    The check reads only the partitions that hold a row to delete or a matching row: the delete
    rewrites only files there, and leaves every other file as it was.
    """
    path = lake.table_path(spec)
    version = current_version(spark, path)
    at_version = spark.read.format("delta").option("versionAsOf", version).load(path)
    matched = matching_event_ids(at_version, tombstones).cache()
    try:
        per_tombstone = {row.tombstone_id: row["count"] for row in matched.groupBy("tombstone_id").count().collect()}
        if not per_tombstone and event_ids is None:
            return Purge()
        ids = (event_ids if event_ids is not None else matched.select("event_id")).distinct().cache()
        scope, target_scope = _partitions_holding(at_version, spec, ids.unionByName(matched.select("event_id")), "t")
        expected = _checksum(visible_events(at_version.where(scope), tombstones))
        # The clone in a folder of its own, dropped whole.
        scratch = lake.path("_scratch", f"purge-{spec.name}-{uuid.uuid4().hex[:12]}")
        clone = f"{scratch}/{spec.name}"
        try:
            spark.sql(f"CREATE TABLE delta.`{clone}` SHALLOW CLONE delta.`{path}` VERSION AS OF {version}")
            _delete_by_event_id(spark, clone, ids, tombstones_version, target_scope)
            dry_run = spark.read.format("delta").load(clone).where(scope)
            kept, still_matching = _checksum(dry_run), matching_events(dry_run, tombstones).count()
            if kept != expected or still_matching:
                raise PurgeVerificationError(
                    f"purge of {path} at version {version} not applied: the dry run kept {kept.rows} rows "
                    f"(checksum {kept.checksum}), {still_matching} of them matching a tombstone; expected "
                    f"{expected.rows} rows (checksum {expected.checksum}) and none matching. The table is unchanged."
                )
            deleted, rewritten = _delete_by_event_id(spark, path, ids, tombstones_version, target_scope)
            files = len(at_version.inputFiles())  # from the snapshot at `version`: no data read
            log.info(
                "%s: purged %d rows for %d tombstones, rewrote %d of %d files (dry run at v%d verified)",
                spec.name,
                deleted,
                len(per_tombstone),
                rewritten,
                files,
                version,
            )
        finally:
            ids.unpersist()
            _drop_dir(spark, scratch)
        return Purge(per_tombstone, rewritten)
    finally:
        matched.unpersist()


def purge_quarantine(spark: SparkSession, lake: Lake, tombstones: list[Tombstone]) -> int:
    """Bad lines are text: remove every line that contains a pending tombstone's value."""
    path = lake.table_path(EVENT_QUARANTINE)
    if not tombstones or not DeltaTable.isDeltaTable(spark, path):
        return 0
    lines = (
        lines_mentioning(spark.read.format("delta").load(path), "line", tombstones)
        .select("source_file", "line_number")
        .distinct()
    )
    metrics = retry_on_conflict(
        lambda: (
            DeltaTable.forPath(spark, path)
            .alias("q")
            .merge(lines.alias("erase"), "q.source_file = erase.source_file AND q.line_number = erase.line_number")
            .whenMatchedDelete()
            .execute()
            .first()
        ),
        what=f"purge erased values from {path}",
    )
    return int(metrics["num_deleted_rows"])


def bin_pack(
    spark: SparkSession,
    lake: Lake,
    spec: TableSpec,
    closed_before: date | None,
    packed_bytes: int | None = None,
) -> int:
    """Bin-pack the table's closed date partitions (the whole table when unpartitioned, or when
    `closed_before` is None), packing the files under `packed_bytes` (default: the Spark
    configuration's spark.databricks.delta.optimize.minFileSize when the operator set one, else
    PACKED_FILE_BYTES); the number of files packed. A local table the JVM-free appends could
    write is packed by `bin_pack_locally`; any other, or one a purge changed meanwhile, by
    Spark's OPTIMIZE, redone on a conflict (a projection's refresh may replace rows of the
    files it packs)."""
    path = lake.table_path(spec)
    if packed_bytes is None:
        packed_bytes = int(spark.sparkContext.getConf().get(_MIN_FILE_SIZE, str(PACKED_FILE_BYTES)))
    if is_local(path):
        # Without Spark when the table is one the JVM-free appends could write (decisions/0056).
        try:
            removed = bin_pack_locally(plain_path(path), closed_before, packed_bytes)
        except PackConflictError as conflict:
            log.info("bin-pack of %s: %s; by Spark's OPTIMIZE instead", path, conflict)
            removed = None
        if removed is not None:
            return removed
    session = spark.newSession()  # the setting stays off other threads' work

    # Without the commit lock: the appends go on while it packs. A bin-pack changes no data, so
    # Delta checks it only against removals of the files it packs (decision 0055).
    def optimize() -> int:
        with session_settings(session, {_MIN_FILE_SIZE: str(packed_bytes)}):
            builder = DeltaTable.forPath(session, path).optimize()
            if "event_date" in spec.partition_by and closed_before is not None:
                builder = builder.where(f"event_date < '{closed_before.isoformat()}'")
            metrics = builder.executeCompaction().select("metrics.numFilesRemoved").first()
        return int(metrics["numFilesRemoved"] or 0)

    return retry_on_conflict(optimize, what=f"bin-pack {spec.name} at {path}")


def rearrived(spark: SparkSession, lake: Lake, applied: list[Tombstone]) -> list[Tombstone]:
    """The applied tombstones that match rows of the raw log again: events that arrived after
    their purge. One scan of the log with all of them in one predicate; per tombstone only over
    the (normally no) rows found."""
    path = lake.table_path(RAW_EVENT_LOG)
    if not applied or not DeltaTable.isDeltaTable(spark, path):
        return []
    rows = matching_events(spark.read.format("delta").load(path), applied).cache()
    try:
        if rows.isEmpty():
            return []
        found = {
            row.tombstone_id for row in matching_event_ids(rows, applied).select("tombstone_id").distinct().collect()
        }
        back = [t for t in applied if t.tombstone_id in found]
        log.warning("%d applied tombstones match events that arrived after their purge; purging those again", len(back))
        return back
    finally:
        rows.unpersist()


@contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Records the seconds the block takes as `phases[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = round(time.perf_counter() - started, 3)


def compact(spark: SparkSession, lake: Lake, open_days: int = 2) -> CompactionResult:
    """Bin-pack the logs, purge pending tombstones everywhere, refresh the projections after the
    purge, then bin-pack the other tables. See the module docstring.

    `open_days`: the most recent event dates that writers may still append to are left out of
    bin-packing; 0 packs every table whole (the file-count sensor's runs: a service's small files
    are in today's date), which a file-count trigger recognises by its OPTIMIZE's empty predicate.
    """
    phases: dict[str, float] = {}
    phase = partial(_timed, phases)
    with phase("tombstones"):
        # A lake whose tombstones asset never ran has no table yet: none pending, and now an empty one.
        ensure_table(spark, lake.table_path(TOMBSTONES), TOMBSTONES)
        tombstones_version = current_version(spark, lake.table_path(TOMBSTONES))
        tombstones = read_tombstones(spark, lake, tombstones_version)
        for spec in (*EVENT_TABLES, EVENT_QUARANTINE, INGEST_LEDGER, *PROJECTION_TABLES):  # before Spark reads them
            refuse_paths_outside(lake.table_path(spec))
        pending = [t for t in tombstones if t.pending]
        to_purge = pending + rearrived(spark, lake, [t for t in tombstones if not t.pending])
        tables = [
            spec
            for spec in (*EVENT_TABLES, EVENT_QUARANTINE, INGEST_LEDGER, TOMBSTONES, *PROJECTION_TABLES)
            if DeltaTable.isDeltaTable(spark, lake.table_path(spec))
        ]
        before = {spec.name: table_size(spark, lake.table_path(spec)) for spec in tables}
    purged: dict[str, Purge] = {}
    compacted: dict[str, int] = {}
    closed_before = datetime.now(UTC).date() - timedelta(days=open_days - 1) if open_days > 0 else None

    if to_purge:
        # The logs are bin-packed before the purge reads them: a service leaves one small file per
        # append, and the purge's dry run, checks and MERGE would read every one of them several
        # times (and the MERGE again under the commit lock when an append into its dates
        # conflicts), where after the bin-pack they read a few packed files.
        with phase("bin-pack logs"):
            compacted = {
                spec.name: bin_pack(spark, lake, spec, closed_before) for spec in EVENT_TABLES if spec in tables
            }
        with phase("purge"):
            refresh_filtered_log(spark, lake)  # it holds nothing matching a tombstone it has seen
            for spec in EVENT_TABLES:
                if spec in tables:
                    purged[spec.name] = purge_events(spark, lake, spec, to_purge, tombstones_version=tombstones_version)
            purged[EVENT_QUARANTINE.name] = Purge({"lines": purge_quarantine(spark, lake, to_purge)})
        with phase("projections"):
            refresh_all_projections(spark, lake)

    with phase("bin-pack"):
        compacted.update(
            {spec.name: bin_pack(spark, lake, spec, closed_before) for spec in tables if spec.name not in compacted}
        )
    files = sum(compacted.values())
    dates = "every date" if closed_before is None else f"the dates before {closed_before}"
    log.info("bin-packed %s: %d files rewritten in %d tables", dates, files, len(tables))
    # Every tombstone, not only the pending ones: a landing file ingested after a tombstone was
    # applied may hold its values too. Before record_applied: if it fails, they stay pending.
    with phase("landing files"):
        landing = erase_from_landing_files(spark, lake, tombstones)
    with phase("record applied"):
        record_applied(spark, lake, pending, current_version(spark, lake.table_path(RAW_EVENT_LOG)))
    if not is_s3(lake.root):
        with phase("checkpoints"):
            for spec in tables:
                thin_checkpoints(lake.table_path(spec))
    log.info("compaction's phases (seconds): %s", ", ".join(f"{name} {s:.1f}" for name, s in phases.items()))

    raw_log_rows = purged.get(RAW_EVENT_LOG.name, Purge()).rows_per_tombstone
    per_tombstone = {t.tombstone_id: raw_log_rows.get(t.tombstone_id, 0) for t in to_purge}
    results = tuple(
        TableCompaction(
            spec.name,
            before[spec.name],
            table_size(spark, lake.table_path(spec)),
            sum(purged.get(spec.name, Purge()).rows_per_tombstone.values()),
            compacted[spec.name],
            purged.get(spec.name, Purge()).files_rewritten,
        )
        for spec in tables
    )
    return CompactionResult(results, per_tombstone, tuple(t.tombstone_id for t in pending), landing, phases)
