"""A small append to a local Delta table in one commit, without a query engine: the JVM-free
writer's fast path.

A few events per call is the service's common case, and a general writer (delta-rs's
`write_deltalake`) spends far longer planning and committing than writing a handful of rows. A
blind append is the simplest operation of the Delta protocol: write one Parquet file per
partition, then write the next commit file (a `commitInfo` and one `add` action per file, with
the statistics the table's `delta.dataSkippingStatsColumns` asks for) if it does not exist yet.
The caller holds the table's commit lock and knows the version it read, so `version + 1` is
normally free; a commit file that exists already raises CommitConflictError and the caller
starts over from the log.

It is used only for tables this code can write without a protocol feature: reader version 1,
writer version 2 or lower, no invariants (`writable_by_fast_append`); anything else goes
through delta-rs. The files can be written before the commit lock is taken (`stage_locally`,
`write_data_files`) and named by a commit under it (`commit_files`): an appender then holds the
lock for a few hundred bytes of commit file, not for the Parquet (log/serving/appends.py). No
other writer checkpoints a commit file it did not write, so the caller
checkpoints the table as its commits make one due (log/serving/checkpoints.py). On S3, where no
lock keeps writers apart, `commit_exactly` has delta-rs commit exactly the next version with S3's
conditional write, or raise CommitConflictError; delta-rs's post-commit hook checkpoints there.

    append_files(table_path, version + 1, rows, partition_by=["event_date"], stats_columns=[...])
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

from databuild_assets.events.schema import CORE_FIELDS, EVENT_TYPES, PAYLOADS
from databuild_assets.log.serving.follower import DeltaFollower
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_local import table_properties
from databuild_assets.runtime.file_modes import link_new_file, make_folders, write_new_file
from databuild_assets.runtime.lake import RAW_EVENT_LOG, RAW_LOG_SOURCE_FIELDS
from databuild_assets.runtime.object_store import delta_rs_options, delta_rs_uri, is_s3

deltalake = deferred("deltalake")
pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")
pq = deferred("pyarrow.parquet")

# Spark and delta-rs truncate string statistics to this many characters.
_STRING_STATS_PREFIX = 32
_NS_PER_DAY = 86_400 * 10**9
# A file of a service's append holds a few rows: a dictionary and page statistics per column cost
# more to write than they save (the commit's `stats` are what skips files), and readers take the
# types from Parquet's own schema, so the Arrow schema is not stored either. The file reads back
# the same; compaction rewrites it with Spark's defaults.
_FEW = 1_000
_FEW_ROWS = {"use_dictionary": False, "write_statistics": False, "store_schema": False}


class CommitConflictError(RuntimeError):
    """Another writer committed the version this append meant to write."""


@functools.cache
def raw_log_schema() -> pa.Schema:
    """The raw log's schema in Arrow, as delta-rs reads the table's, from the field lists
    (events/schema.py, runtime/lake.py) rather than the Spark schema: an appender imports no
    pyspark."""
    kinds = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "long": pa.int64()}
    kinds |= {"array<string>": pa.list_(pa.field("element", pa.string())), "date": pa.date32()}
    kinds["timestamp"] = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [pa.field(field.name, kinds[field.kind], nullable=False) for field in CORE_FIELDS]
        + [
            pa.field(name, pa.struct([pa.field(field.name, kinds[field.kind]) for field in PAYLOADS[name]]))
            for name in EVENT_TYPES
        ]
        + [pa.field(name, kinds[kind], nullable=nullable) for name, kind, nullable in RAW_LOG_SOURCE_FIELDS]
    )


@functools.cache
def _raw_log_row_type() -> pa.StructType:
    return pa.struct(list(raw_log_schema()))


def raw_log_rows(indexed_events: Iterable[tuple[int, Mapping[str, Any]]], writer: str) -> pa.Table:
    """Raw log rows of canonical events (with their place in the append), as the Spark writer
    stores them (source "writer:<writer>")."""
    ingested_at = datetime.now(UTC)
    rows = []
    for index, event in indexed_events:
        row = dict(event)
        row.update(
            event_date=datetime.fromtimestamp(event["timestamp"] // _NS_PER_DAY * 86_400, UTC).date(),
            source_file=f"writer:{writer}",
            source_line=index + 1,
            ingested_at=ingested_at,
        )
        rows.append(row)
    # One struct array converted at once: the same table as Table.from_pylist, at half its cost.
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(rows, type=_raw_log_row_type()))])


def commit_exactly(
    table_path: str, table: deltalake.DeltaTable, rows: pa.Table, latest: int, user_metadata: str
) -> bool:
    """Append `rows` to `table` as version `latest + 1` or not at all: on S3 no lock keeps other
    writers out, so a commit that finds that version taken (S3's conditional write, which every
    writer of ours uses: decision 0040) raises CommitConflictError, and the caller dedupes again
    against what that writer stored. delta-rs would otherwise commit past it, blind to its event
    ids. Returns True (the commit is exactly `latest + 1`)."""
    if table.version() != latest:
        table.update_incremental()
    if table.version() != latest:
        raise CommitConflictError(f"{table_path} moved past v{latest} before this append")
    try:
        deltalake.write_deltalake(
            table,
            rows,
            mode="append",
            commit_properties=deltalake.CommitProperties(
                custom_metadata={"userMetadata": user_metadata}, max_commit_retries=0
            ),
            # Not a listing of the whole log after every append: the Spark jobs' checkpoints
            # clean expired commits up, as they do after the local appends.
            post_commithook_properties=deltalake.PostCommitHookProperties(cleanup_expired_logs=False),
        )
    except deltalake.exceptions.CommitFailedError as error:
        table.update_incremental()
        raise CommitConflictError(f"{table_path} v{latest + 1} was committed by another writer") from error
    return True


def writable_by_fast_append(protocol: Any, schema_json: str) -> bool:
    """Whether a blind append by `append_files` honours the table's protocol: no reader or writer
    features, writer version at most 2 (appendOnly and invariants), and no invariant to check."""
    return (
        protocol.min_reader_version == 1
        and protocol.min_writer_version <= 2
        and not protocol.reader_features
        and not protocol.writer_features
        and "delta.invariants" not in schema_json
    )


def _stat(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        return value[:_STRING_STATS_PREFIX]
    return value


def _extremes(column: pa.ChunkedArray) -> tuple[Any, Any]:
    """The least and greatest value of `column`, which holds at least one non-null value."""
    if len(column) < _FEW:  # an append's few rows: Python's min and max cost less than a kernel's call
        values = [value for value in column.to_pylist() if value is not None]
        return min(values), max(values)
    extremes = pc.min_max(column)
    return extremes["min"].as_py(), extremes["max"].as_py()


def statistics(rows: pa.Table, stats_columns: Sequence[str]) -> str:
    """The `stats` of an `add` action for `rows`: row count, and the minimum, maximum and null
    count of each of `stats_columns` the rows have (strings cut as Spark and delta-rs cut them)."""
    minimum, maximum, nulls = {}, {}, {}
    for name in stats_columns:
        if name not in rows.column_names:
            continue
        column = rows.column(name)
        nulls[name] = column.null_count
        if column.null_count < len(column):
            least, greatest = _extremes(column)
            minimum[name], maximum[name] = _stat(least), _stat(greatest)
    return json.dumps(
        {"numRecords": rows.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls},
        separators=(",", ":"),
    )


def partition_text(value: Any) -> str | None:
    """A partition value as the log writes it (None for null)."""
    return None if value is None else value.isoformat() if isinstance(value, date) else str(value)


def new_data_file(table_path: str, partition: Sequence[tuple[str, str | None]]) -> tuple[str, str]:
    """A new data file's name in the table (relative, as a commit names it) and its path on disk,
    in the folder of `partition` ((column, value as text) pairs), that folder made if missing.
    The caller creates the file with the project's mode (`file_modes.create_new_file`)."""
    folder = "/".join(f"{name}={value}" for name, value in partition)
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    relative = f"{folder}/{name}" if folder else name
    full = os.path.join(table_path, relative)
    if not os.path.isdir(os.path.dirname(full)):
        make_folders(os.path.dirname(full))  # the owner's alone, whatever the umask
    return relative, full


def write_data_files(
    table_path: str, rows: pa.Table, partition_by: Sequence[str], stats_columns: Sequence[str]
) -> list[dict[str, Any]]:
    """Write `rows` (the table's schema, partition columns included) as one Parquet file per
    partition, not yet part of the table, and return their `add` actions: what `commit_files`
    commits. Needs no lock: a file no commit names is invisible to every reader (VACUUM removes it
    once it is older than the retention, if its writer died before committing it)."""
    now_ms = int(time.time() * 1000)
    actions = []
    keys = rows.select(list(partition_by)).to_pylist() if partition_by else [{}] * rows.num_rows
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(tuple(partition_text(key[name]) for name in partition_by), []).append(index)
    for values, indexes in groups.items():
        part = (rows if len(groups) == 1 else rows.take(indexes)).drop_columns(list(partition_by))
        relative, full = new_data_file(table_path, tuple(zip(partition_by, values, strict=True)))
        data = parquet_bytes(_set_columns(part) if part.num_rows < _FEW else part)
        write_new_file(full, data)
        actions.append(
            {
                "add": {
                    "path": relative,
                    "partitionValues": dict(zip(partition_by, values, strict=True)),
                    "size": len(data),
                    "modificationTime": now_ms,
                    "dataChange": True,
                    "stats": statistics(part, stats_columns),
                }
            }
        )
    return actions


def _set_columns(rows: pa.Table) -> pa.Table:
    """`rows` without the columns that are null in every row: a file of a few events leaves
    out the payloads of the event types it does not hold (Delta reads a column a file lacks as
    null, as for a file written before the column was added): pyarrow sets up a column writer and
    a footer entry for every leaf it writes (docs/decisions/0010). Readers of ours fill them back
    (`runtime.delta_local.with_columns`)."""
    unset = [name for name in rows.column_names if rows.column(name).null_count == rows.num_rows]
    return rows.drop_columns(unset) if unset else rows


def parquet_bytes(rows: pa.Table) -> pa.Buffer:
    """`rows` as the bytes of one Parquet file (snappy; a few rows without dictionaries, page
    statistics or Arrow schema), written in memory so that the file is created once, whole, with
    the project's mode (`write_new_file`)."""
    sink = pa.BufferOutputStream()
    options = _FEW_ROWS if rows.num_rows < _FEW else {}
    with pq.ParquetWriter(sink, rows.schema, compression="snappy", **options) as writer:
        writer.write_table(rows)
    return sink.getvalue()


def remove_data_files(table_path: str, actions: Sequence[Mapping[str, Any]]) -> None:
    """Delete the files of `actions` (from `write_data_files`) that no commit will name."""
    for action in actions:
        try:
            os.unlink(os.path.join(table_path, action["add"]["path"]))
        except FileNotFoundError:
            pass


def commit_files(
    table_path: str,
    version: int,
    actions: Sequence[Mapping[str, Any]],
    partition_by: Sequence[str],
    commit_info: Mapping[str, Any] | None = None,
) -> None:
    """Commit the files of `actions` (from `write_data_files`) as `version`: one commit file,
    written if absent. Raises CommitConflictError when that version exists."""
    info = {
        "timestamp": int(time.time() * 1000),
        "operation": "WRITE",
        "operationParameters": {"mode": "Append", "partitionBy": json.dumps(list(partition_by))},
        "isBlindAppend": False,  # the caller read the log to leave out duplicates
        "engineInfo": "databuild-assets",
        **(commit_info or {}),
    }
    _put_if_absent(
        os.path.join(table_path, "_delta_log", f"{version:020d}.json"),
        "\n".join(json.dumps(action, separators=(",", ":")) for action in [{"commitInfo": info}, *actions]) + "\n",
    )


def append_files(
    table_path: str,
    version: int,
    rows: pa.Table,
    partition_by: Sequence[str],
    stats_columns: Sequence[str],
    commit_info: Mapping[str, Any] | None = None,
) -> None:
    """Write `rows` (the table's schema, partition columns included) as one Parquet file per
    partition, and commit them as `version`. Raises CommitConflictError when that version exists
    (the files written are removed)."""
    actions = write_data_files(table_path, rows, partition_by, stats_columns)
    try:
        commit_files(table_path, version, actions, partition_by, commit_info)
    except CommitConflictError:
        remove_data_files(table_path, actions)
        raise


def fast_layout(table: deltalake.DeltaTable) -> tuple[list[str], list[str]] | None:
    """The partition and statistics columns `write_data_files` writes the table's files with,
    when its protocol allows a blind append and it names its statistics columns; else None.
    Kept per table object and version (a service's appender asks at every append, and the
    answer crosses into delta-rs four times)."""
    kept = _layouts.get(id(table))
    version = table.version()
    if kept is not None and kept[0]() is table and kept[1] == version:
        layout = kept[2]
    else:
        layout = _fast_layout(table)
        for key in [key for key, (ref, _, _) in list(_layouts.items()) if ref() is None]:
            _layouts.pop(key, None)  # tables no longer in use (threads may stage at once)
        _layouts[id(table)] = (weakref.ref(table), version, layout)
    return None if layout is None else (list(layout[0]), list(layout[1]))


# id of a table -> (the table, its version, its fast_layout); DeltaTable is not hashable.
_layouts: dict[int, tuple[weakref.ref, int, tuple[list[str], list[str]] | None]] = {}


def _fast_layout(table: deltalake.DeltaTable) -> tuple[list[str], list[str]] | None:
    configuration = table.metadata().configuration
    stats_columns = configuration.get("delta.dataSkippingStatsColumns")
    if not (stats_columns and writable_by_fast_append(table.protocol(), table.schema().to_json())):
        return None
    return list(table.metadata().partition_columns), stats_columns.split(",")


def append_locally(
    table_path: str, table: deltalake.DeltaTable, version: int, rows: pa.Table, commit_info: Mapping[str, Any]
) -> bool:
    """Commit `rows` as `version` of the local table at `table_path` by `append_files`, when the
    table's protocol allows a blind append and it names its statistics columns. False, with
    nothing written, when it does not: the caller commits through delta-rs."""
    layout = fast_layout(table)
    if layout is None:
        return False
    append_files(table_path, version, rows, *layout, commit_info)
    return True


def stage_locally(table_path: str, table: deltalake.DeltaTable, rows: pa.Table) -> list[dict[str, Any]] | None:
    """Write `rows` as data files of the local table at `table_path` ahead of their commit
    (`write_data_files`), for `commit_append(..., staged=...)` to name: the work of an append that
    needs no commit lock, done before taking it. None, with nothing written, when the table's
    protocol does not allow `append_files`."""
    layout = fast_layout(table)
    return None if layout is None else write_data_files(table_path, rows, *layout)


def _put_if_absent(path: str, text: str) -> None:
    """Write `path` whole or not at all, and only if it does not exist (`link_new_file`); else
    CommitConflictError."""
    if not link_new_file(path, text.encode()):
        raise CommitConflictError(f"{path} was written by another writer first")


def commit_append(
    log: DeltaFollower,
    table: deltalake.DeltaTable | None,
    rows: pa.Table,
    latest: int,
    writer: str,
    staged: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[deltalake.DeltaTable, int | None]:
    """One append commit of `rows` as the raw log's next version (the raw log created first when
    the lake has none): by `append_locally` when the table's protocol allows, else delta-rs.
    Returns the table as delta-rs sees it (the caller keeps it for the next append) and the
    version committed when it is exactly the one after `latest` (the create's, for a new log), or
    None (delta-rs may retry past a commit of a writer that ignores the lock). On S3,
    CommitConflictError when another writer created the log or took that version first.
    `staged`: the add actions of `rows` already written by `stage_locally` to `table` (local,
    existing): only their commit file is written.

        table, version = commit_append(follower, None, raw_log_rows(events, "svc"), latest, "svc")
    """
    s3 = is_s3(log.path)
    if latest < 0 and s3 and log.exists():
        # Created by another writer since this append looked: dedupe against what it stored.
        raise CommitConflictError(f"{log.path} was created by another writer")
    if latest < 0 and not log.exists():
        try:
            table = deltalake.DeltaTable.create(
                delta_rs_uri(log.path),
                schema=deltalake.Schema.from_arrow(raw_log_schema()),  # the Spark schema's, without pyspark
                partition_by=list(RAW_EVENT_LOG.partition_by),
                description=RAW_EVENT_LOG.description,
                configuration=table_properties(RAW_EVENT_LOG),
                raise_if_key_not_exists=False,  # our own databuild.schemaVersion property
                storage_options=delta_rs_options() if s3 else None,
            )
        except deltalake.exceptions.DeltaError as error:
            if s3 and log.exists():  # another writer created it first (a conditional write)
                raise CommitConflictError(f"{log.path} was created by another writer") from error
            raise
    elif table is None:
        table = log.open_table()
    user_metadata = json.dumps({"writer": writer})
    latest = latest if latest >= 0 else table.version()
    if s3:
        return table, latest + 1 if commit_exactly(log.path, table, rows, latest, user_metadata) else None
    if staged is not None:
        partition_by = list(table.metadata().partition_columns)
        commit_files(log.path, latest + 1, staged, partition_by, {"userMetadata": user_metadata})
        return table, latest + 1
    if append_locally(log.path, table, latest + 1, rows, {"userMetadata": user_metadata}):
        return table, latest + 1  # by `append_files`
    if table.version() != latest:
        table.update_incremental()  # to the latest commit: the one this append follows
    deltalake.write_deltalake(
        table,
        rows,
        mode="append",
        commit_properties=deltalake.CommitProperties(custom_metadata={"userMetadata": user_metadata}),
    )
    return table, None


__all__ = [
    "CommitConflictError",
    "append_files",
    "append_locally",
    "commit_append",
    "commit_exactly",
    "commit_files",
    "fast_layout",
    "new_data_file",
    "parquet_bytes",
    "partition_text",
    "raw_log_rows",
    "raw_log_schema",
    "remove_data_files",
    "stage_locally",
    "statistics",
    "writable_by_fast_append",
    "write_data_files",
]
