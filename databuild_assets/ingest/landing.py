"""Ingestion of JSON Lines landing files into the raw event log, exactly once.

A batch goes through three recorded steps, so a crash at any point is repaired by running again:

1. plan: the ledger records batch N and the files it will read (before any data is written);
2. write: bad lines are appended to the quarantine and the good events whose event_id the raw
   log does not hold are added to it (ingest/dedup.py), each commit tagged with Delta's
   idempotent-write ids (app id, txnVersion=N), so a replay of batch N that finds its commit
   already there writes nothing again;
3. record: the ledger marks batch N committed, with its counts.

A run first replays any batch that was planned but not recorded, with exactly the files it
planned, then plans a new batch from the files no batch has read. Events are keyed by
event_id: one already in the log (or earlier in the same batch) is skipped and counted.

A file that may still be being written is not planned yet (docs/decisions/0002-landing-files-ingested-once.md): one
that is empty or does not end with a newline, unless it has not changed for `settle_seconds`.
A batch reads each file only up to the size it planned, so bytes appended after planning are
never ingested half (a replay reads the same bytes).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from delta.tables import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.schema import EVENT_COLUMNS, EVENT_SCHEMA
from databuild_assets.ingest.dedup import first_of_each_event_id, insert_new_events
from databuild_assets.ingest.landing_folder import (
    LandingFile,
    planned_file_refusal,
    quarantine_unreadable_names,
    refused_files_rows,
    scan_landing_folder,
)
from databuild_assets.ingest.lines import read_landing_lines
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.commits import find_commit
from databuild_assets.runtime.delta_local import local_delta_table, read_local_table
from databuild_assets.runtime.delta_tables import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    current_version,
    ensure_table,
    retry_on_conflict,
    session_settings,
)
from databuild_assets.runtime.lake import EVENT_QUARANTINE, INGEST_LEDGER, RAW_EVENT_LOG, Lake

log = logging.getLogger(__name__)

# Delta idempotent-write application ids, one per table a batch writes.
EVENTS_APP_ID = "databuild-ingest-events"
QUARANTINE_APP_ID = "databuild-ingest-quarantine"
PLAN_APP_ID = "databuild-ingest-plan"  # the ledger's plans (txnVersion = the batch id)
PLAN_ATTEMPTS = 8


class _Skipped:
    """What a plan attempt returns when Delta skipped its write (another run planned that batch)."""


SKIPPED = _Skipped()
# A file that is empty or whose last line has no newline yet is taken for one still being
# written, and waits; once unchanged this long it is taken as complete (its writer is gone).
DEFAULT_SETTLE_SECONDS = 600.0


@dataclass(frozen=True)
class IngestedFile:
    """A landing file as a committed batch read it: the ledger's word that it is ingested."""

    path: str  # as the ledger records it (list_landing_files' spelling)
    size: int  # the bytes the batch read
    batch_id: int
    planned_at_ms: int  # when the batch was planned (the file was complete by then), ms since the epoch
    committed_at_ms: int  # when the batch was recorded as committed


@dataclass(frozen=True)
class BatchResult:
    batch_id: int
    files: tuple[str, ...]
    lines_read: int
    accepted: int
    duplicates: int
    quarantined: int
    log_version: int
    replayed: bool = False


@dataclass(frozen=True)
class IngestResult:
    """What one ingestion run did; `lines_read == accepted + duplicates + quarantined`."""

    batches: tuple[BatchResult, ...] = field(default_factory=tuple)
    log_version: int | None = None
    # Files not ingested yet because they may still be being written (empty, or no newline at
    # the end, and changed less than settle_seconds ago); a later run ingests them.
    incomplete: tuple[str, ...] = ()
    # Landing folder entries not read, each "skipped <path>: <reason>" or "quarantined <path>:
    # <reason>"; they stay where they are, and are listed again at every run.
    refused: tuple[str, ...] = ()

    def _total(self, name: str) -> int:
        return sum(getattr(batch, name) for batch in self.batches)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(path for batch in self.batches for path in batch.files)

    lines_read = property(lambda self: self._total("lines_read"))
    accepted = property(lambda self: self._total("accepted"))
    duplicates = property(lambda self: self._total("duplicates"))
    quarantined = property(lambda self: self._total("quarantined"))


def ends_with_newline(spark: SparkSession, path: str, size: int) -> bool:
    """Whether the file's byte at `size - 1` is a newline (False for an empty file)."""
    if size <= 0:
        return False
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    stream = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(hadoop_path)
    try:
        stream.seek(size - 1)
        return stream.read() == ord("\n")
    finally:
        stream.close()


def still_being_written(age_s: float, settle_seconds: float, ends_with_newline: Callable[[], bool]) -> bool:
    """The rule for a landing file whose writer may not be done: it changed less than
    `settle_seconds` ago and is empty or its last line has no newline yet. `ends_with_newline`
    (False for an empty file) is called only for a file that has not settled: it reads a byte.
    Ingestion leaves such a file for a later run; the landing sensor applies the same rule."""
    return age_s < settle_seconds and not ends_with_newline()


def split_incomplete(
    spark: SparkSession, files: list[LandingFile], settle_seconds: float, now_s: float | None = None
) -> tuple[list[LandingFile], list[LandingFile]]:
    """(complete, incomplete) by `still_being_written`."""
    now_s = time.time() if now_s is None else now_s
    complete, incomplete = [], []
    for landing_file in files:
        age_s = now_s - landing_file.modified_ms / 1000
        if still_being_written(
            age_s, settle_seconds, partial(ends_with_newline, spark, landing_file.path, landing_file.size)
        ):
            incomplete.append(landing_file)
        else:
            complete.append(landing_file)
    return complete, incomplete


def events_from_lines(good_lines: DataFrame, source_line: str = "line_number") -> DataFrame:
    """Validated JSON text lines (`line`) -> raw log rows (typed event columns, UTC event_date,
    lineage). The writer API's path; landing files come typed from `read_landing_lines`."""
    return raw_log_rows(
        good_lines.select(
            F.from_json("line", EVENT_SCHEMA).alias("event"), "source_file", F.col(source_line).alias("source_line")
        ).select("event.*", "source_file", "source_line")
    )


def events_from_read_lines(good_lines: DataFrame) -> DataFrame:
    """The good lines of `read_landing_lines` -> raw log rows."""
    return raw_log_rows(good_lines.select(*EVENT_COLUMNS, "source_file", F.col("line_number").alias("source_line")))


def raw_log_rows(events: DataFrame) -> DataFrame:
    """Typed events with their lineage (`source_file`, `source_line`) -> raw log rows: the UTC
    event_date they are partitioned by, and when they were ingested."""
    return events.withColumn("event_date", F.expr("to_date(timestamp_micros(`timestamp` div 1000))")).withColumn(
        "ingested_at", F.current_timestamp()
    )


class _Ledger:
    def __init__(self, spark: SparkSession, lake: Lake):
        self.spark = spark
        self.path = lake.table_path(INGEST_LEDGER)

    def rows(self) -> list:
        return self.rows_and_last_plan()[0]

    def rows_and_last_plan(self) -> tuple[list, int]:
        """The ledger's rows, and the last batch id a plan recorded under PLAN_APP_ID, read from
        one snapshot (0: none; or, on a remote lake, not read: the rows alone say it)."""
        if (table := local_delta_table(self.path)) is not None:  # read at every run: no Spark job for it
            rows = [Row(**row) for row in read_local_table(table).to_pylist()]
            return rows, table.transaction_version(PLAN_APP_ID) or 0
        return self.spark.read.format("delta").load(self.path).collect(), 0

    def pending_batches(self, rows: list) -> dict[int, list[str]]:
        """Batches planned but not recorded as committed: the ones a crash interrupted."""
        committed = {row.batch_id for row in rows if row.stage == "committed"}
        pending: dict[int, list[str]] = {}
        for row in rows:
            if row.stage == "planned" and row.batch_id not in committed:
                pending.setdefault(row.batch_id, []).append(row.file_path)
        return {batch_id: sorted(files) for batch_id, files in sorted(pending.items())}

    def planned_sizes(self, batch_id: int, rows: list | None = None) -> dict[str, int]:
        """The size each file of batch `batch_id` had when it was planned: what the batch reads.
        From `rows` (the ledger as read) when given, else from the ledger."""
        if rows is None:
            rows = (
                self.spark.read.format("delta")
                .load(self.path)
                .where((F.col("batch_id") == batch_id) & (F.col("stage") == "planned"))
                .collect()
            )
        return {
            row.file_path: row.file_size
            for row in rows
            if row.batch_id == batch_id and row.stage == "planned" and row.file_size is not None
        }

    def plan(self, new_files: list[LandingFile], rows: list, again: bool = False) -> tuple[int, list[str]] | None:
        """Record a new batch of the files no batch has read; None when there are none.

        An append under Delta's idempotent-write id (PLAN_APP_ID, txnVersion = batch id), not a
        MERGE: Delta fails a commit whose app id another commit recorded since the transaction
        read it, so two runs planning at once conflict and the loser plans again, without the
        files the winner took. It also skips the write when the plan app id's recorded version is
        that batch id or later (a run planned since the ledger was read): the commit is then not
        found under this plan's own token, and this run plans again too. The next batch id is
        above both the ledger's rows and that recorded version, which never goes back (a RESTORE
        or DELETE of the ledger's newest rows would otherwise make every plan a skip). `again`:
        plan the files even when a batch read them before (repair's reading them again). Under the
        ledger's commit lock: a process with a JVM of its own (the CLI) and the warm driver
        commit through different JVMs.
        """

        # The caller's read first (with no plan version: a stale read is then skipped by Delta);
        # a retry reads the rows and the plan version again, from one snapshot.
        known = [(rows, 0)]

        def attempt() -> tuple[int, list[str]] | None | _Skipped:
            rows, last_plan = known.pop() if known else self.rows_and_last_plan()
            taken = {row.file_path for row in rows if row.stage == "planned"}
            files = [landing_file for landing_file in new_files if again or landing_file.path not in taken]
            if not files:
                return None
            batch_id = max(max((row.batch_id for row in rows), default=0), last_plan) + 1
            token = uuid.uuid4().hex
            with commit_lock(self.path):
                before = current_version(self.spark, self.path)
                self._append_plan(batch_id, files, token)
                found = find_commit(self.spark, self.path, lambda m: m.get("token") == token, after=before)
            if found is None:
                return SKIPPED  # batch `batch_id` was planned by another run meanwhile
            return batch_id, [f.path for f in files]

        for _ in range(PLAN_ATTEMPTS):
            planned = retry_on_conflict(attempt, what=f"plan an ingestion batch in {self.path}")
            if planned is not SKIPPED:
                return planned
        raise RuntimeError(
            f"ingest ledger {self.path}: other runs planned a batch before this one {PLAN_ATTEMPTS} times in a row"
        )

    def _append_plan(self, batch_id: int, files: list[LandingFile], token: str) -> None:
        (
            self.spark.createDataFrame(
                [(batch_id, "planned", f.path, f.size) for f in files],
                "batch_id long, stage string, file_path string, file_size long",
            )
            .withColumn("recorded_at", F.current_timestamp())
            .write.format("delta")
            .mode("append")
            .option("txnAppId", PLAN_APP_ID)
            .option("txnVersion", batch_id)
            .option("userMetadata", json.dumps({"ingest_plan": batch_id, "token": token}))
            .save(self.path)
        )

    def record_committed(self, result: BatchResult) -> None:
        row = self.spark.createDataFrame(
            [
                (
                    result.batch_id,
                    "committed",
                    result.lines_read,
                    result.accepted,
                    result.duplicates,
                    result.quarantined,
                    result.log_version,
                )
            ],
            "batch_id long, stage string, lines_read long, accepted long, duplicates long, "
            "quarantined long, log_version long",
        ).withColumn("recorded_at", F.current_timestamp())
        with commit_lock(self.path):
            row.write.format("delta").mode("append").save(self.path)


def _batch_commit(spark: SparkSession, log_path: str, batch_id: int) -> tuple[int, int] | None:
    """(version, rows inserted) of the raw log commit batch `batch_id` made, if it made one."""
    found = find_commit(spark, log_path, lambda metadata: metadata == {"ingest_batch": batch_id})
    if found is None:
        return None
    version, info = found
    metrics = info.get("operationMetrics") or {}  # a MERGE's, or an append's (the key lookup's path)
    return version, int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0)))


def write_batch(
    spark: SparkSession,
    lake: Lake,
    batch_id: int,
    files: list[str],
    replayed: bool = False,
    sizes: Mapping[str, int] | None = None,
    quarantine: bool = True,
) -> BatchResult:
    """Step 2 for one planned batch: quarantine its bad lines and merge its good events.
    `sizes`: the file sizes the plan recorded (read from the ledger when not given).
    `quarantine=False` counts the bad lines without writing them (files read again, whose bad
    lines the quarantine already holds).

    Safe to run again for the same batch: both commits carry (app id, batch_id), which Delta
    records atomically with the data and checks before writing.
    """
    # Transaction ids are session settings; a session of our own keeps them away from any
    # other thread writing through the parent session at the same time.
    session = spark.newSession()
    log_path = lake.table_path(RAW_EVENT_LOG)
    # Only the bytes the plan saw: a file that grew since is not read half-way into a new line,
    # and a replay reads exactly what the interrupted run read.
    if sizes is None:
        sizes = _Ledger(spark, lake).planned_sizes(batch_id)
    # A file the plan named that cannot be read now (a plan of an earlier release may name a file
    # Spark cannot open, or the file became a link since) is quarantined by name, not read.
    refusals = {path: planned_file_refusal(path) for path in files}
    refused = [refusal for refusal in refusals.values() if refusal is not None]
    for refusal in refused:
        log.warning("batch %d: %s", batch_id, refusal)
    readable = [path for path, refusal in refusals.items() if refusal is None]
    lines = read_landing_lines(session, readable, sizes).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = (
            {
                row["bad"]: row["count"]
                for row in lines.groupBy(F.col("reason").isNotNull().alias("bad")).count().collect()
            }
            if readable
            else {}
        )
        good_lines, quarantined = counts.get(False, 0), counts.get(True, 0) + len(refused)
        log.info("batch %d: %d files, %d lines, %d bad", batch_id, len(files), good_lines + quarantined, quarantined)

        bad = lines.where("reason IS NOT NULL").select(
            "source_file",
            "line_number",
            "reason",
            "line",
            "raw_line",
            F.lit(batch_id).cast("long").alias("ingest_batch"),
            F.current_timestamp().alias("quarantined_at"),
        )
        if refused:
            bad = bad.unionByName(refused_files_rows(session, refused, batch_id))
        if quarantined and quarantine:  # no commit for no rows: a replay reads the same bytes, so finds none again
            (
                bad.write.format("delta")
                .mode("append")
                .option("txnAppId", QUARANTINE_APP_ID)
                .option("txnVersion", batch_id)
                .save(lake.table_path(EVENT_QUARANTINE))
            )

        events = events_from_read_lines(lines.where("reason IS NULL"))
        unique_events = first_of_each_event_id(events)
        batch_settings = {
            TXN_APP_ID: EVENTS_APP_ID,
            TXN_VERSION: str(batch_id),
            USER_METADATA: json.dumps({"ingest_batch": batch_id}),
        }
        with session_settings(session, batch_settings):
            what = f"ingestion batch {batch_id} into {log_path}"
            insert_new_events(session, lake, unique_events, good_lines, what=what)
        commit = _batch_commit(session, log_path, batch_id)
        version, accepted = commit if commit else (current_version(session, log_path), 0)
        result = BatchResult(
            batch_id=batch_id,
            files=tuple(files),
            lines_read=good_lines + quarantined,
            accepted=accepted,
            duplicates=good_lines - accepted,
            quarantined=quarantined,
            log_version=version,
            replayed=replayed,
        )
        log.info(
            "batch %d: %d accepted, %d duplicates skipped, %d quarantined; raw log at version %d",
            batch_id,
            result.accepted,
            result.duplicates,
            result.quarantined,
            version,
        )
        return result
    finally:
        lines.unpersist()


def ingested_files(spark: SparkSession, lake: Lake) -> dict[str, IngestedFile]:
    """Every file a committed batch read, by path: what ingestion will never read again.

    A file planned in a batch that has not committed is not in it (a replay reads it again).
    A path is planned by one batch only, so the ledger never reads it again: moving or deleting
    the file, or rewriting it elsewhere, cannot make it ingested twice.
    """
    path = lake.table_path(INGEST_LEDGER)
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    rows = _Ledger(spark, lake).rows()
    committed = {row.batch_id: row.recorded_at for row in rows if row.stage == "committed"}
    return {
        row.file_path: IngestedFile(
            row.file_path, row.file_size, row.batch_id, _epoch_ms(row.recorded_at), _epoch_ms(committed[row.batch_id])
        )
        for row in rows
        if row.stage == "planned" and row.batch_id in committed
    }


def _epoch_ms(timestamp) -> int:
    # Spark hands a TIMESTAMP to Python as a naive local datetime (timestamp() reads it back as local),
    # delta-rs as an aware UTC one: either way the same instant.
    return int(timestamp.timestamp() * 1000)


def ensure_ingest_tables(spark: SparkSession, lake: Lake) -> None:
    for spec in (RAW_EVENT_LOG, EVENT_QUARANTINE, INGEST_LEDGER):
        ensure_table(spark, lake.table_path(spec), spec)


def ingest_landing_files(
    spark: SparkSession, lake: Lake, landing: str | None = None, settle_seconds: float = DEFAULT_SETTLE_SECONDS
) -> IngestResult:
    """Ingest every landing file no earlier run ingested; replay a batch a crash interrupted.

    Running it again with no new files does nothing and returns an empty result. A file that
    may still be being written (empty, or no newline at its end, and changed less than
    `settle_seconds` ago) is left for a later run and listed in `incomplete`.

        result = ingest_landing_files(spark, Lake("/data/lake"))
        assert result.lines_read == result.accepted + result.duplicates + result.quarantined
    """
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    results = []
    ledger_rows = ledger.rows()
    for batch_id, files in ledger.pending_batches(ledger_rows).items():
        log.warning("replaying ingestion batch %d (%d files): it was planned but not recorded", batch_id, len(files))
        sizes = ledger.planned_sizes(batch_id, ledger_rows)
        results.append(write_batch(spark, lake, batch_id, files, replayed=True, sizes=sizes))
        ledger.record_committed(results[-1])
    if results:
        ledger_rows = ledger.rows()
    taken = {row.file_path for row in ledger_rows if row.stage == "planned"}
    listed, refused = scan_landing_folder(spark, landing or lake.landing)
    # A name a batch planned (an earlier release's plan) was quarantined by that batch, not again here.
    quarantine_unreadable_names(spark, lake, [r for r in refused if r.literal_path not in taken])
    new_files = [f for f in listed if f.path not in taken]
    complete, incomplete = split_incomplete(spark, new_files, settle_seconds)
    for landing_file in incomplete:
        log.warning(
            "landing file %s is not ingested yet: %s; it may still be being written. It is ingested once it "
            "ends with a newline, or once unchanged for %.0f s. Writers should write under a name starting "
            "with '.' or '_' and rename when done.",
            landing_file.path,
            "it is empty" if landing_file.size == 0 else "its last line has no newline",
            settle_seconds,
        )
    planned = ledger.plan(complete, ledger_rows)
    if planned is not None:
        batch_id, files = planned
        planned_files = set(files)
        sizes = {f.path: f.size for f in complete if f.path in planned_files}  # as the plan recorded them
        results.append(write_batch(spark, lake, batch_id, files, sizes=sizes))
        ledger.record_committed(results[-1])
    return IngestResult(
        tuple(results),
        current_version(spark, lake.table_path(RAW_EVENT_LOG)),
        tuple(f.path for f in incomplete),
        tuple(map(str, refused)),
    )


def ingest_again(spark: SparkSession, lake: Lake, files: list[LandingFile]) -> BatchResult | None:
    """Read landing files again that earlier batches read: repair's way to put back the events a
    restored raw log or a removed data file lost. A new batch the ledger records like any other;
    its MERGE keeps only the event ids the log does not hold, so the events still there are not
    stored twice, and its bad lines are counted but not quarantined twice. None: no files.

        ingest_again(spark, lake, [LandingFile("/data/lake/landing_archive/a.jsonl", 4096)])
    """
    if not files:
        return None
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    planned = ledger.plan(files, ledger.rows(), again=True)
    if planned is None:
        return None
    batch_id, paths = planned
    sizes = {f.path: f.size for f in files}
    result = write_batch(spark, lake, batch_id, paths, sizes=sizes, quarantine=False)
    ledger.record_committed(result)
    return result
