"""Small operations on our Delta tables: create with the agreed schema and properties, read a
table's version and size, check its schema version, and retry a write on Delta's conflicts."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import unquote

import deltalake
import deltalake.exceptions
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
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
from databuild_assets.runtime.damage import DamagedTableError, commit_damage, data_file_damage, outside_table_damage
from databuild_assets.runtime.delta_log import (
    COMMIT_FILE,
    LogFileRefusedError,
    OutsideTableError,
    check_log_paths,
    log_folder,
    resolve_in_table,
    table_relative,
)
from databuild_assets.runtime.lake import COMMON_TABLE_PROPERTIES, SCHEMA_VERSION_PROPERTY, TableSpec, is_local
from databuild_assets.runtime.object_store import arrow_filesystem, is_s3

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


class SchemaVersionError(RuntimeError):
    """A table was written by a newer (or unknown) schema version than this code knows."""


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


def table_properties(spec: TableSpec) -> dict[str, str]:
    """The Delta properties a table of ours is created with (see COMMON_TABLE_PROPERTIES)."""
    properties = dict(COMMON_TABLE_PROPERTIES)
    if spec.stats_columns:
        properties["delta.dataSkippingStatsColumns"] = ",".join(spec.stats_columns)
    else:
        properties["delta.dataSkippingNumIndexedCols"] = "0"
    if spec.append_only:
        properties["delta.appendOnly"] = "true"
    return properties


def local_delta_table(path: str) -> deltalake.DeltaTable | None:
    """The table at `path` opened by delta-rs, to read its log in this process without a Spark job;
    None for a remote lake, or a table delta-rs cannot open (the caller asks Spark instead)."""
    if not is_local(path):
        return None
    try:
        return deltalake.DeltaTable(path.removeprefix("file://").removeprefix("file:"))
    except deltalake.exceptions.DeltaError as error:
        log.info("%s: delta-rs cannot open it (%s); reading it through Spark", path, error)
        return None


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


def schema_version_of(path: str, properties: Mapping[str, str], known_version: int = SCHEMA_VERSION) -> int:
    """`check_schema_version` of the table at `path` whose properties are `properties`."""
    found = properties.get(SCHEMA_VERSION_PROPERTY)
    if found is None or not found.isdigit():
        raise SchemaVersionError(
            f"{path} has no valid {SCHEMA_VERSION_PROPERTY} property (found {found!r}); "
            "it was not created by databuild-assets. Point the lake root elsewhere or remove the table."
        )
    if int(found) > known_version:
        raise SchemaVersionError(
            f"{path} has schema version {found}, newer than this code's {known_version}: a newer "
            f"databuild-assets upgraded it, and this code would misread or mis-write its rows, so it "
            f"neither reads nor writes it. Run a databuild-assets release that knows schema version "
            f"{found} (upgrade this deployment), or point DATABUILD_LAKE_ROOT at a lake of version {known_version}."
        )
    return int(found)


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
        files = pa.table(table.get_add_actions(flatten=True).select(["size_bytes", "num_records"]))
        rows = files["num_records"]
        return TableSize(
            table.version(),
            files.num_rows,
            pc.sum(files["size_bytes"]).as_py() or 0,
            (pc.sum(rows).as_py() or 0) if rows.null_count == 0 else None,
        )
    detail = DeltaTable.forPath(spark, path).detail().select("numFiles", "sizeInBytes").first()
    return TableSize(current_version(spark, path), detail["numFiles"], detail["sizeInBytes"])


def head_rows(
    table: deltalake.DeltaTable, limit: int, columns: list[str] | None = None, newest_by: str | None = None
) -> pa.Table:
    """Up to `limit` rows of a local table (`local_delta_table`), read without Spark: the rows with the largest
    `newest_by` (descending), or the first its files hold.

    Only the files that can hold those rows are read: with statistics on `newest_by`, the newest
    files by their maximum until they hold `limit` rows, and every file whose maximum reaches the
    smallest minimum among those (the raw log's newest events after a landing file: its new file).
    The files are read with pyarrow from delta-rs's list of them.

        head_rows(local_delta_table(path), 5, ["event_id", "timestamp"], newest_by="timestamp")
    """
    files = pa.table(table.get_add_actions(flatten=True))
    names = columns or [field.name for field in table.schema().fields]
    if files.num_rows == 0:
        return pa.table({name: pa.array([], pa.null()) for name in names})
    top, smallest = f"max.{newest_by}", f"min.{newest_by}"
    if newest_by is not None and top in files.column_names and files[smallest].null_count == 0:
        files = files.take(pc.sort_indices(files, sort_keys=[(top, "descending")]))
    held = pc.cumulative_sum(pc.fill_null(files["num_records"], 0)).to_pylist()
    enough = next((i + 1 for i, rows in enumerate(held) if rows >= limit), files.num_rows)
    if newest_by is None:
        files = files.slice(0, enough)
    elif top in files.column_names and files[smallest].null_count == 0 and files["num_records"].null_count == 0:
        bound = pc.min(files[smallest].slice(0, enough))
        files = files.filter(pc.greater_equal(files[top], bound))
    rows = _read_files(table.table_uri, files, list(dict.fromkeys([*names, *([newest_by] if newest_by else [])])))
    if newest_by is not None:
        rows = rows.take(pc.select_k_unstable(rows, k=min(limit, rows.num_rows), sort_keys=[(newest_by, "descending")]))
        rows = rows.sort_by([(newest_by, "descending")])
    return rows.slice(0, limit).select(names)


def read_local_table(table: deltalake.DeltaTable, columns: list[str] | None = None) -> pa.Table:
    """A whole local table (`local_delta_table`) at its latest version as Arrow, read without Spark:
    for small tables a run reads often, such as the ingest ledger."""
    names = columns or [field.name for field in table.schema().fields]
    files = pa.table(table.get_add_actions(flatten=True))
    if files.num_rows == 0:
        return pa.table({name: pa.array([], pa.null()) for name in names})
    return _read_files(table.table_uri, files, names)


def iter_local_table(
    table: deltalake.DeltaTable, columns: list[str], rows_per_batch: int = 200_000, order_by: str | None = None
) -> Iterator[tuple[pa.Table, int]]:
    """`columns` of a local table's live files at the version `table` was opened at, in batches of
    about `rows_per_batch` rows (a large file is read a part at a time), with the table's total
    row count: a whole table read in bounded memory. With `order_by` (a column with statistics),
    the files come by their smallest value and each batch is sorted by it: nearly in that order.
    A file gone meanwhile raises FileNotFoundError."""
    files = pa.table(table.get_add_actions(flatten=True))
    smallest = f"min.{order_by}"
    if order_by is not None and smallest in files.column_names:
        files = files.take(pc.sort_indices(files, sort_keys=[(smallest, "ascending", "at_start")]))
    total = sum(count or 0 for count in files.column("num_records").to_pylist()) if files.num_rows else 0
    parts: list[pa.Table] = []
    held = 0
    for file in files.to_pylist():
        for part in _file_parts(table.table_uri, file, columns, rows_per_batch):
            parts.append(part)
            held += part.num_rows
            if held >= rows_per_batch:
                batch = _joined(parts, columns)
                yield (batch.sort_by(order_by) if order_by is not None else batch), total
                parts, held = [], 0
    if parts:
        batch = _joined(parts, columns)
        yield (batch.sort_by(order_by) if order_by is not None else batch), total


def _file_parts(table_uri: str, file: dict, columns: list[str], rows_per_part: int | None = None) -> Iterator[pa.Table]:
    """`columns` of one data file (a delta-rs add action), whole or `rows_per_part` rows at a
    time, with its partition values as columns. A file that does not read while the log still
    references it raises DamagedTableError naming it; one gone because a newer version removed
    it (a vacuum) raises FileNotFoundError, for the caller to read the newer snapshot. A path
    that leaves the table (`delta_log.table_relative`, `resolve_in_table`) is never opened: a
    local table raises DamagedTableError naming the commit or the symlink, one on S3
    OutsideTableError."""
    partition = {k.removeprefix("partition."): v for k, v in file.items() if k.startswith("partition.")}
    root = unquote(table_uri.removeprefix("file://").removeprefix("file:"))
    try:
        relative = table_relative(file["path"])
        local = None if is_s3(root) else resolve_in_table(root, relative)
    except OutsideTableError as error:
        if is_s3(root):
            raise OutsideTableError(f"{root}: {error}") from None
        raise outside_table_damage(root, error) from None
    try:
        if local is None:
            filesystem, prefix = arrow_filesystem(root)
            parquet = pq.ParquetFile(filesystem.open_input_file(f"{prefix}/{relative}"))
        else:
            parquet = pq.ParquetFile(local)
        present = [c for c in columns if c in set(parquet.schema_arrow.names)]
        if rows_per_part is None:
            datas: Iterator[pa.Table] = iter([parquet.read(columns=present)])
        else:
            datas = (
                pa.Table.from_batches([b]) for b in parquet.iter_batches(batch_size=rows_per_part, columns=present)
            )
        for data in datas:
            for name in columns:
                if name in partition and name not in data.column_names:  # a writer may store it in the file too
                    data = data.append_column(name, pa.array([partition[name]] * data.num_rows))
            yield data.select([name for name in columns if name in data.column_names])
    except (OSError, pa.ArrowException) as error:
        # The damage diagnosis reads a local log; on S3 the error names the object already.
        if not is_s3(root) and (damage := data_file_damage(root, relative, error)) is not None:
            raise damage from None
        raise


def _joined(parts: list[pa.Table], columns: list[str]) -> pa.Table:
    """Parts of files as one table of `columns`: a column a file lacks is null there, as Delta
    reads it; timestamps are Delta's, UTC: they come back UTC-aware."""
    rows = pa.concat_tables(parts, promote_options="permissive")
    for name in columns:
        if name not in rows.column_names:
            rows = rows.append_column(name, pa.nulls(rows.num_rows))
    rows = rows.select(columns)
    utc = [
        pa.field(f.name, pa.timestamp(f.type.unit, tz="UTC")) if pa.types.is_timestamp(f.type) and not f.type.tz else f
        for f in rows.schema
    ]
    return rows.cast(pa.schema(utc))


def _read_files(table_uri: str, files: pa.Table, columns: list[str]) -> pa.Table:
    """`columns` of the data files in `files` (delta-rs's add actions), partition values included."""
    return _joined([part for file in files.to_pylist() for part in _file_parts(table_uri, file, columns)], columns)


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


def latest_version_on_disk(path: str) -> int | None:
    """The newest commit of a Delta table on a local disk, by listing `_delta_log` (no JVM).

    For sensors, which run in Dagster's daemon and should not start Spark to see whether a
    table moved. None when there is no table. Remote roots need Spark (`current_version`).
    """
    log_dir = log_folder(path)
    if not log_dir.is_dir():
        return None
    versions = [int(match.group(1)) for name in os.listdir(log_dir) if (match := COMMIT_FILE.match(name))]
    return max(versions, default=None)
