"""A bin-pack of a local Delta table without Spark: the small Parquet files a service's appends
leave, read with pyarrow and written as a few packed files, committed as an OPTIMIZE.

A service appending 5-event batches leaves one small file per append (~13 a second in issue 43's
soak). Spark's OPTIMIZE reads them through a Parquet reader set up per file and a task per few
dozen files; pyarrow reads them at a fraction of that cost (decisions/0056). The commit is the
JVM-free appends' step (log/serving/append.py: the next version, written only if absent), taken
under the table's commit lock for the commit alone, after a check that no commit since the
version read removed a file being packed (a purge's rewrite): appends only add files, so they
never conflict with it, and they go on while the files are read and written.

The commit is the one Spark's OPTIMIZE writes: `add`s and `remove`s with dataChange=false (the
serving index, the filtered log and the projections read past it), operation OPTIMIZE, its
predicate (`[]` for the whole table, which the file-count trigger looks for:
maintenance/compaction_trigger.py) and the version it read. Only a table whose protocol the fast
append may write (`writable_by_fast_append`) and whose files have plain relative paths is packed
here; `bin_pack_locally` returns None for any other, and the caller runs Spark's OPTIMIZE.

    removed = bin_pack_locally(lake.table_path(RAW_EVENT_LOG), closed_before=None, packed_bytes=64 * 2**20)
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq

from databuild_assets.log.serving.append import (
    CommitConflictError,
    commit_files,
    fast_layout,
    new_data_file,
    partition_text,
    statistics,
)
from databuild_assets.log.serving.checkpoints import checkpoint_if_due, open_listed
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_local import with_columns
from databuild_assets.runtime.delta_log import commit_path
from databuild_assets.runtime.file_modes import create_new_file

# Delta's spark.databricks.delta.optimize.maxFileSize: the input bytes of one packed file.
BIN_BYTES = 2**30
# Rows buffered before a row group is written: small files hold a few rows each, and a row group
# per input file would keep them small.
_ROW_GROUP_ROWS = 131_072
_READERS = min(4, os.cpu_count() or 1)
_READ_AHEAD = 64  # files read ahead of the writer: a bin's decoded rows are not all held at once
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9_.=/-]+$")
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_.-]+$")
_COMMIT_ATTEMPTS = 5


class PackConflictError(RuntimeError):
    """A commit since the version read removed a file this bin-pack packed, or changed the
    table's metadata: the packed files are dropped and the table is as it was."""


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    partition: tuple[tuple[str, str | None], ...]


def _small_files(
    table: deltalake.DeltaTable, partition_by: Sequence[str], closed_before: date | None, packed_bytes: int
) -> list[_File] | None:
    """The table's files under `packed_bytes` (in partitions whose event_date is before
    `closed_before`, when given); None when a path is not a plain relative one or a partition
    value is null or not plain text."""
    adds = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all().to_pylist()
    files = []
    for add in adds:
        path = add["path"]
        if not _PLAIN_PATH.match(path) or path.startswith("/") or ".." in path.split("/"):
            return None  # an encoded or hostile path: Spark's OPTIMIZE reads the log as Delta means it
        if add["size_bytes"] >= packed_bytes:
            continue
        values = {name: add[f"partition.{name}"] for name in partition_by}
        if closed_before is not None and "event_date" in values and values["event_date"] >= closed_before:
            continue
        partition = tuple((name, partition_text(values[name])) for name in partition_by)
        if any(text is None or not _PLAIN_VALUE.match(text) for _, text in partition):
            return None  # a null or escaped partition value: its folder is named as Delta escapes it
        files.append(_File(path, add["size_bytes"], partition))
    return files


def _bins(files: list[_File]) -> Iterator[list[_File]]:
    """Per partition, runs of files of at most BIN_BYTES; a run of one file is left as it is."""
    by_partition: dict[tuple, list[_File]] = {}
    for file in files:
        by_partition.setdefault(file.partition, []).append(file)
    for group in by_partition.values():
        current: list[_File] = []
        size = 0
        for file in group:
            if current and size + file.size > BIN_BYTES:
                if len(current) > 1:
                    yield current
                current, size = [], 0
            current.append(file)
            size += file.size
        if len(current) > 1:
            yield current


def _in_order(pool: ThreadPoolExecutor, read: Callable[[_File], pa.Table], files: list[_File]) -> Iterator[pa.Table]:
    """`read` of each file, in the files' order, at most _READ_AHEAD files ahead of the consumer."""
    for start in range(0, len(files), _READ_AHEAD):
        yield from pool.map(read, files[start : start + _READ_AHEAD])


def _pack(table_path: str, files: list[_File], schema: pa.Schema, stats_columns: Sequence[str]) -> dict[str, Any]:
    """Write the rows of `files` (in their order) as one Parquet file of their partition; its
    `add` action (dataChange=false)."""
    relative, full = new_data_file(table_path, files[0].partition)
    stats_chunks: list[pa.Table] = []

    def row_group(parts: list[pa.Table]) -> pa.Table:
        # Concatenated, cast to the table's schema and made contiguous once per row group: a
        # cast or a write per small file costs more than reading it.
        rows = pa.concat_tables(parts).cast(schema).combine_chunks()
        stats_chunks.append(rows.select([c for c in stats_columns if c in schema.names]))
        return rows

    def read(file: _File) -> pa.Table:
        # Without pyarrow's own thread pool, whose set-up per file costs more than a small file's
        # read; the files are read on threads of ours instead (pyarrow releases the GIL).
        part = pq.ParquetFile(os.path.join(table_path, file.path)).read(use_threads=False)
        part = with_columns(part, schema.names, schema)  # a small append's file holds only the columns it sets
        # Spark's files differ from the table's schema as pyarrow reads it: nullability, and
        # timestamps stored as INT96 (read as naive nanoseconds; UTC instants, as Spark wrote them).
        return part if part.schema.equals(schema) else part.cast(schema)

    try:
        with (
            os.fdopen(create_new_file(full), "wb") as sink,
            pq.ParquetWriter(sink, schema, compression="snappy") as writer,
            ThreadPoolExecutor(_READERS) as pool,
        ):
            pending: list[pa.Table] = []
            pending_rows = 0
            for part in _in_order(pool, read, files):
                pending.append(part)
                pending_rows += part.num_rows
                if pending_rows >= _ROW_GROUP_ROWS:
                    writer.write_table(row_group(pending))
                    pending, pending_rows = [], 0
            if pending:
                writer.write_table(row_group(pending))
        return {
            "add": {
                "path": relative,
                "partitionValues": dict(files[0].partition),
                "size": os.path.getsize(full),
                "modificationTime": int(time.time() * 1000),
                "dataChange": False,
                "stats": statistics(pa.concat_tables(stats_chunks), stats_columns),
            }
        }
    except BaseException:
        if os.path.exists(full):  # written in part, or with no action to name it
            os.unlink(full)
        raise


def _named_by(table_path: str, version: int, path: str) -> bool:
    """Whether commit `version` of the table exists and adds `path`."""
    try:
        with commit_path(table_path, version).open(encoding="utf-8") as commit:
            return any(json.loads(line).get("add", {}).get("path") == path for line in commit if line.strip())
    except FileNotFoundError:
        return False


def _remove(file: _File, now_ms: int) -> dict[str, Any]:
    return {
        "remove": {
            "path": file.path,
            "deletionTimestamp": now_ms,
            "dataChange": False,
            "extendedFileMetadata": True,
            "partitionValues": dict(file.partition),
            "size": file.size,
        }
    }


def _check_since(table_path: str, read_version: int, packed: set[str]) -> int:
    """The newest version after `read_version` (probed by name: commits are written oldest first),
    having checked that none of those commits removed a packed file or changed the metadata or
    protocol (PackConflictError)."""
    version = read_version
    while True:
        try:
            text = commit_path(table_path, version + 1).read_text(encoding="utf-8")
        except FileNotFoundError:
            return version
        version += 1
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "metaData" in action or "protocol" in action:
                raise PackConflictError(f"{table_path} v{version} changed the table's metadata or protocol")
            if "remove" in action and action["remove"].get("path") in packed:
                raise PackConflictError(
                    f"{table_path} v{version} removed {action['remove']['path']}, a file being packed"
                )


def bin_pack_locally(table_path: str, closed_before: date | None, packed_bytes: int) -> int | None:
    """Pack the local table's files under `packed_bytes` (see the module docstring), by partition,
    into files of at most BIN_BYTES of input; the number of files removed, or None when this table
    is not one it packs (nothing written). PackConflictError when a commit since the version read
    removed one of those files."""
    table = open_listed(table_path)
    layout = fast_layout(table)
    if layout is None:
        return None
    partition_by, stats_columns = layout
    files = _small_files(table, partition_by, closed_before, packed_bytes)
    if files is None:
        return None
    bins = list(_bins(files))
    if not bins:
        return 0
    read_version = table.version()
    arrow_schema = pa.schema(table.schema().to_arrow())
    schema = pa.schema([field for field in arrow_schema if field.name not in partition_by])
    packed = [file for group in bins for file in group]
    predicate = [] if closed_before is None or "event_date" not in partition_by else [f"event_date < '{closed_before}'"]
    adds: list[dict[str, Any]] = []
    version = read_version + 1
    try:
        for group in bins:  # a failure in any bin removes the files of those before it (below)
            adds.append(_pack(table_path, group, schema, stats_columns))
        now_ms = int(time.time() * 1000)
        info = {
            "operation": "OPTIMIZE",
            "operationParameters": {"predicate": json.dumps(predicate), "zOrderBy": "[]", "auto": False},
            "readVersion": read_version,
            "isolationLevel": "SnapshotIsolation",
            "isBlindAppend": False,
            "operationMetrics": {"numRemovedFiles": str(len(packed)), "numAddedFiles": str(len(adds))},
        }
        actions = [*adds, *(_remove(file, now_ms) for file in packed)]
        for attempt in range(_COMMIT_ATTEMPTS):
            with commit_lock(table_path):
                version = _check_since(table_path, read_version, {file.path for file in packed}) + 1
                try:
                    commit_files(table_path, version, actions, partition_by, info)
                    break
                except CommitConflictError:  # a writer that takes no lock (Spark's OPTIMIZE, a purge)
                    if attempt == _COMMIT_ATTEMPTS - 1:
                        raise
    except BaseException:
        if adds and not _named_by(table_path, version, adds[0]["add"]["path"]):  # not committed after all
            for add in adds:
                os.unlink(os.path.join(table_path, add["add"]["path"]))
        raise
    checkpoint_if_due(table_path, version)
    return len(packed)


__all__ = ["BIN_BYTES", "PackConflictError", "bin_pack_locally"]
