"""Small operations on our Delta tables: create with the agreed schema and properties, read a
table's version and size, check its schema version, and retry a write on Delta's conflicts, through
Spark (a local table's reads that need no Spark are in `delta_local`)."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import pyarrow.compute as pc
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from databuild_assets.events.schema import SCHEMA_VERSION
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.damage import DamagedTableError, commit_damage
from databuild_assets.runtime.delta_local import add_actions, local_delta_table, schema_version_of, table_properties
from databuild_assets.runtime.delta_log import (
    COMMIT_FILE,
    LogFileRefusedError,
    OutsideTableError,
    check_log_paths,
)
from databuild_assets.runtime.lake import TableSpec, is_local
from databuild_assets.runtime.object_store import is_s3

log = logging.getLogger(__name__)
T = TypeVar("T")

# Conflicts that mean "someone committed first; redo your transaction against the new state".
RETRYABLE_CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    MetadataChangedException,
    ProtocolChangedException,
)

DELETION_VECTORS = "delta.enableDeletionVectors"
# Listed by SHOW TBLPROPERTIES while the table's protocol has the feature (whatever the property says).
DELETION_VECTORS_FEATURE = "delta.feature.deletionVectors"


class NotADeltaTableError(RuntimeError):
    """A table's path holds files that are not a Delta table; nothing was created over them."""


def ensure_table(spark: SparkSession, path: str, spec: TableSpec) -> DeltaTable:
    """The Delta table at `path`, created empty with `spec`'s schema and properties if missing.

    An existing table is checked and upgraded first (`upgrade_table`): one of a newer schema
    version is refused, and one an earlier release gave deletion vectors loses them.
    """
    if DeltaTable.isDeltaTable(spark, path):
        upgrade_table(spark, path, spec)
        return DeltaTable.forPath(spark, path)
    _refuse_foreign_files(spark, path, spec)
    builder = _with_spec(DeltaTable.createIfNotExists(spark).location(path), spec)

    def create() -> DeltaTable:
        with commit_lock(path):
            return builder.execute()

    return retry_on_conflict(create, what=f"create {spec.name} at {path}")


def upgrade_table(spark: SparkSession, path: str, spec: TableSpec) -> tuple[str, ...]:
    """Check the existing table at `path` and bring its protocol to what this release creates;
    what it changed, in words (none: nothing to change). Logged too.

    Refuses a table whose log names a path outside it (`refuse_paths_outside`), and one whose
    schema version is newer than this code's, so old code never writes
    rows a newer reader would misread. Drops the deletion vectors feature from a table an
    earlier release gave it (the projections had it): readers without deletion vectors, such as
    delta-rs and what is built on it (Polars, dagster-deltalake), refuse a table whose protocol
    names it, even with the property off
    (docs/decisions/0015-every-table-readable-by-delta-rs.md).

        upgrade_table(spark, lake.table_path(RAW_EVENT_LOG), RAW_EVENT_LOG)
    """
    refuse_paths_outside(path)  # before Spark reads it: every job opens an existing table through here
    properties = read_table_properties(spark, path)
    schema_version_of(path, properties)
    changes: list[str] = []
    if DELETION_VECTORS_FEATURE in properties:
        drop_deletion_vectors(spark, path, spec.name)
        changes.append(
            "dropped the deletionVectors table feature an earlier release gave the table (its marked rows "
            "rewritten away), so that readers without deletion vectors (delta-rs) can read it"
        )
    for change in changes:
        log.warning("%s at %s: %s", spec.name, path, change)
    return tuple(changes)


def drop_deletion_vectors(spark: SparkSession, path: str, name: str) -> None:
    """Remove the deletion vectors feature from the table's protocol with Delta's DROP FEATURE,
    then set the property off as a new table of ours has it.

    DROP FEATURE (Delta 4) unsets the property, rewrites the files that have deletion vectors
    without the rows they mark (REORG ... APPLY (PURGE)) and downgrades the protocol in a last
    commit that adds the checkpointProtection writer feature. No wait and no history truncation
    (those are DROP FEATURE ... TRUNCATE HISTORY's): a reader without deletion vectors reads the
    table from that commit on, while time travel to an older version still needs them. Retried
    on a conflict; a retry does not redo the steps already committed.
    """

    def drop() -> None:
        with commit_lock(path):
            if DELETION_VECTORS_FEATURE in read_table_properties(spark, path):  # not dropped by an earlier attempt
                spark.sql(f"ALTER TABLE delta.`{path}` DROP FEATURE deletionVectors")
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DELETION_VECTORS}' = 'false')")

    retry_on_conflict(drop, what=f"drop the deletion vectors feature of {name} at {path}")


def reset_table(spark: SparkSession, path: str, spec: TableSpec) -> DeltaTable:
    """Replace the Delta table at `path` with an empty one of `spec` (schema, properties,
    description), in one commit that keeps its history: for a table whose schema changed in a
    way Delta cannot alter in place (a struct column's fields removed or retyped)."""
    builder = _with_spec(DeltaTable.replace(spark).location(path), spec)
    return retry_on_conflict(builder.execute, what=f"reset {spec.name} at {path}")


def _with_spec(builder, spec: TableSpec):
    builder = builder.addColumns(spec.schema)
    if spec.partition_by:
        builder = builder.partitionedBy(*spec.partition_by)
    for key, value in table_properties(spec).items():
        builder = builder.property(key, value)
    if spec.description:
        builder = builder.comment(spec.description)
    return builder


def missing_files(spark: SparkSession, uris: Iterable[str]) -> list[str]:
    """Those of the files `uris` that are not there (vacuum deleted them), in the order given:
    one `exists` of the table's filesystem each."""
    jvm = spark.sparkContext._jvm
    configuration = spark.sparkContext._jsc.hadoopConfiguration()
    gone = []
    for uri in uris:
        hadoop_path = jvm.org.apache.hadoop.fs.Path(uri)
        if not hadoop_path.getFileSystem(configuration).exists(hadoop_path):
            gone.append(uri)
    return gone


def _refuse_foreign_files(spark: SparkSession, path: str, spec: TableSpec) -> None:
    """Raise NotADeltaTableError when `path` (not a Delta table) is a file or a folder holding
    anything but `_delta_log`: creating the table there would mix our files with someone
    else's, and a later purge or vacuum of the table would delete theirs."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not filesystem.exists(hadoop_path):
        return
    if filesystem.getFileStatus(hadoop_path).isFile():
        foreign = [hadoop_path.getName()]
    else:
        # `_delta_log` alone: a table being created by another writer, or a create that crashed.
        foreign = sorted(s.getPath().getName() for s in filesystem.listStatus(hadoop_path))
        foreign = [name for name in foreign if name != "_delta_log"]
    if foreign and not DeltaTable.isDeltaTable(spark, path):  # not created meanwhile by another writer
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise NotADeltaTableError(
            f"{path} should hold the Delta table {spec.name} but holds other files ({shown}) and no Delta log; "
            "nothing was written. Move those files away (or point DATABUILD_LAKE_ROOT at another lake); "
            "the table is created there on the next run."
        )


def read_table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The Delta table's properties. SHOW TBLPROPERTIES reads its metadata only (DESCRIBE DETAIL
    would also add up file sizes)."""
    if (table := local_delta_table(path)) is not None:  # the same keys, without a Spark job
        protocol = table.protocol()
        features = {*(protocol.reader_features or ()), *(protocol.writer_features or ())}
        return {
            **table.metadata().configuration,
            "delta.minReaderVersion": str(protocol.min_reader_version),
            "delta.minWriterVersion": str(protocol.min_writer_version),
            **{f"delta.feature.{feature}": "supported" for feature in sorted(features)},
        }
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}


def check_schema_version(spark: SparkSession, path: str, known_version: int = SCHEMA_VERSION) -> int:
    """The table's schema version (its databuild.schemaVersion property); raises
    SchemaVersionError when it is missing or newer than `known_version` (this code's)."""
    return schema_version_of(path, read_table_properties(spark, path), known_version)


USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"  # carried by every commit made under it
# A commit's idempotent-write id (Delta's `txn` action): a write under an app id whose recorded
# version is this one or later is skipped.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def session_settings(session: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Set Spark SQL `settings` on `session` for the block's commits, and unset them after it.

    Delta reads its per-commit settings (userMetadata, txnAppId/txnVersion) from the session, so
    callers use a session of their own (`spark.newSession()`) to keep them off other threads.
    """
    for key, value in settings.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            session.conf.unset(key)


def refuse_paths_outside(path: str) -> int | None:
    """Check the table at `path` before Spark opens it: the paths of the log files Spark would
    read that this process has not checked yet (`delta_log.check_log_paths`); its newest commit's
    version (None: no commit, or a store other than a local disk or S3).

    A log file naming a path outside the table (absolute, a URI, `../`) or that does not parse
    raises the one line the JVM-free readers raise: DamagedTableError naming the commit (or
    checkpoint) and the path for a local table, OutsideTableError on S3.

        refuse_paths_outside(lake.table_path(RAW_EVENT_LOG))
    """
    if not is_local(path) and not is_s3(path):
        return None
    try:
        return check_log_paths(path)
    except LogFileRefusedError as refused:
        if not is_local(path):
            if isinstance(refused.error, OutsideTableError):
                raise OutsideTableError(f"{path}: {refused.kind} {refused.version}: {refused.error}") from None
            raise ValueError(f"{path.rstrip('/')}/{refused}") from None
        damage = commit_damage(path, refused.version, refused.error)
        if COMMIT_FILE.match(refused.file):
            raise damage from None
        kind = "checkpoint" if refused.kind == "checkpoint" else "log compaction file"
        error = " ".join(str(refused.error).split())
        what = f"{kind} {refused.version} refused: {error}"
        if not isinstance(refused.error, OutsideTableError):
            what = f"{kind} does not read ({error})"
        file = f"{os.path.dirname(damage.file)}/{refused.file}"
        raise DamagedTableError(damage.table, file, what, damage.root) from None


def current_version(spark: SparkSession, path: str) -> int:
    """The table's latest committed version (on a local disk, from a listing of its `_delta_log`),
    its log's paths checked first (`refuse_paths_outside`): a job pins it to read the table."""
    version = refuse_paths_outside(path)
    if is_local(path) and version is not None:
        return version
    return DeltaTable.forPath(spark, path).history(1).select("version").first()["version"]


@dataclass(frozen=True)
class TableSize:
    version: int
    num_files: int
    size_bytes: int
    num_rows: int | None = None  # from the files' statistics; None where a file has none


def table_size(spark: SparkSession, path: str) -> TableSize:
    """The table's version, live files, bytes and rows, from its snapshot (no scan of the data).

    A table on a local disk is read by delta-rs from its log, in this process: a run's metadata
    then costs no Spark job. Elsewhere Delta's DESCRIBE DETAIL answers (no row count).
    """
    if (table := local_delta_table(path)) is not None:
        files = add_actions(table).select(["size_bytes", "num_records"])
        rows = files["num_records"]
        return TableSize(
            table.version(),
            files.num_rows,
            pc.sum(files["size_bytes"]).as_py() or 0,
            (pc.sum(rows).as_py() or 0) if rows.null_count == 0 else None,
        )
    detail = DeltaTable.forPath(spark, path).detail().select("numFiles", "sizeInBytes").first()
    return TableSize(current_version(spark, path), detail["numFiles"], detail["sizeInBytes"])


def table_bytes(spark: SparkSession, path: str) -> int:
    """The bytes of the table's live files at its latest version (from its snapshot: no scan)."""
    return table_size(spark, path).size_bytes


def retry_on_conflict(write: Callable[[], T], *, what: str, attempts: int = 8, base_delay_s: float = 0.2) -> T:
    """Run `write`, and again (with jittered backoff) when Delta reports a concurrent commit.

    The write must be safe to redo: each attempt is a whole transaction against the latest
    table state. After `attempts` conflicts the last one is raised, never swallowed.
    """
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except RETRYABLE_CONFLICTS as conflict:
            if attempt == attempts:
                raise
            delay = base_delay_s * (2 ** (attempt - 1)) * (0.5 + random.random())
            log.warning(
                "%s: %s on attempt %d/%d; retrying in %.2fs",
                what,
                type(conflict).__name__,
                attempt,
                attempts,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")
