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
through delta-rs.

    append_files(table_path, version + 1, rows, partition_by=["event_date"], stats_columns=[...])
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Spark and delta-rs truncate string statistics to this many characters.
_STRING_STATS_PREFIX = 32


class CommitConflictError(RuntimeError):
    """Another writer committed the version this append meant to write."""


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


def _statistics(rows: pa.Table, stats_columns: Sequence[str]) -> str:
    minimum, maximum, nulls = {}, {}, {}
    for name in stats_columns:
        if name not in rows.column_names:
            continue
        column = rows.column(name)
        nulls[name] = column.null_count
        if column.null_count < len(column):
            extremes = pc.min_max(column)
            minimum[name], maximum[name] = _stat(extremes["min"].as_py()), _stat(extremes["max"].as_py())
    return json.dumps(
        {"numRecords": rows.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls},
        separators=(",", ":"),
    )


def _partition_text(value: Any) -> str | None:
    return None if value is None else value.isoformat() if isinstance(value, date) else str(value)


def append_files(
    table_path: str,
    version: int,
    rows: pa.Table,
    partition_by: Sequence[str],
    stats_columns: Sequence[str],
    commit_info: Mapping[str, Any] | None = None,
) -> None:
    """Write `rows` (the table's schema, partition columns included) as one Parquet file per
    partition, and commit them as `version`. Raises CommitConflictError when that version exists."""
    now_ms = int(time.time() * 1000)
    actions = []
    keys = rows.select(list(partition_by)).to_pylist() if partition_by else [{}] * rows.num_rows
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(tuple(_partition_text(key[name]) for name in partition_by), []).append(index)
    for values, indexes in groups.items():
        part = (rows if len(groups) == 1 else rows.take(indexes)).drop_columns(list(partition_by))
        folder = "/".join(f"{name}={value}" for name, value in zip(partition_by, values, strict=True))
        relative = (
            f"{folder}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            if folder
            else f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        )
        full = os.path.join(table_path, relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(part, full, compression="snappy")
        actions.append(
            {
                "add": {
                    "path": relative,
                    "partitionValues": dict(zip(partition_by, values, strict=True)),
                    "size": os.path.getsize(full),
                    "modificationTime": now_ms,
                    "dataChange": True,
                    "stats": _statistics(part, stats_columns),
                }
            }
        )
    info = {
        "timestamp": now_ms,
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


def _put_if_absent(path: str, text: str) -> None:
    """Write `path` whole or not at all, and only if it does not exist (a hard link of a
    finished temporary file: atomic on a local filesystem)."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise CommitConflictError(f"{path} was written by another writer first") from None
    finally:
        os.unlink(temporary)


__all__ = ["CommitConflictError", "append_files", "writable_by_fast_append"]
