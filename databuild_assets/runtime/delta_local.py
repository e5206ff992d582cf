"""A local Delta table read without Spark: delta-rs opens its log, pyarrow reads its files.

The JVM-free query path (`log/serving`), sensors and a run's metadata read through here; this
module imports neither pyspark nor delta-spark, so a process that only reads starts quickly.

    table = local_delta_table(lake.table_path(INGEST_LEDGER))
    ledger = read_local_table(table, ["landing_file", "status"])
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import unquote

from databuild_assets.events.schema import SCHEMA_VERSION
from databuild_assets.runtime.damage import data_file_damage, outside_table_damage
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_log import (
    COMMIT_FILE,
    OutsideTableError,
    checkpoint_path,
    commit_path,
    last_checkpoint,
    log_folder,
    resolve_in_table,
    table_relative,
)
from databuild_assets.runtime.lake import COMMON_TABLE_PROPERTIES, SCHEMA_VERSION_PROPERTY, TableSpec, is_local
from databuild_assets.runtime.object_store import arrow_filesystem, is_s3

deltalake = deferred("deltalake")
pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")
pq = deferred("pyarrow.parquet")

log = logging.getLogger(__name__)


class SchemaVersionError(RuntimeError):
    """A table was written by a newer (or unknown) schema version than this code knows."""


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


def add_actions(table: deltalake.DeltaTable) -> pa.Table:
    """The table's live files (delta-rs's add actions, flattened) as a pyarrow Table.

    Read through the Arrow C stream: `pa.table()` on a foreign object first asks whether it is
    a pandas DataFrame, which imports pandas into a process that never uses it.

        add_actions(local_delta_table(path)).column("path")
    """
    return pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()


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
    files = add_actions(table)
    names = columns or [field.name for field in table.schema().fields]
    if files.num_rows == 0:
        return pa.table({name: pa.nulls(0) for name in names})
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
    wanted = list(dict.fromkeys([*names, *([newest_by] if newest_by else [])]))
    rows = _read_files(table.table_uri, files, wanted, arrow_schema(table))
    if newest_by is not None:
        rows = rows.take(pc.select_k_unstable(rows, k=min(limit, rows.num_rows), sort_keys=[(newest_by, "descending")]))
        rows = rows.sort_by([(newest_by, "descending")])
    return rows.slice(0, limit).select(names)


def read_local_table(table: deltalake.DeltaTable, columns: list[str] | None = None) -> pa.Table:
    """A whole local table (`local_delta_table`) at its latest version as Arrow, read without Spark:
    for small tables a run reads often, such as the ingest ledger."""
    names = columns or [field.name for field in table.schema().fields]
    files = add_actions(table)
    if files.num_rows == 0:
        return pa.table({name: pa.nulls(0) for name in names})
    return _read_files(table.table_uri, files, names, arrow_schema(table))


def iter_local_table(
    table: deltalake.DeltaTable, columns: list[str], rows_per_batch: int = 200_000, order_by: str | None = None
) -> Iterator[tuple[pa.Table, int]]:
    """`columns` of a local table's live files at the version `table` was opened at, in batches of
    about `rows_per_batch` rows (a large file is read a part at a time), with the table's total
    row count: a whole table read in bounded memory. With `order_by` (a column with statistics),
    the files come by their smallest value and each batch is sorted by it: nearly in that order.
    A file gone meanwhile raises FileNotFoundError."""
    files = add_actions(table)
    smallest = f"min.{order_by}"
    if order_by is not None and smallest in files.column_names:
        files = files.take(pc.sort_indices(files, sort_keys=[(smallest, "ascending", "at_start")]))
    total = sum(count or 0 for count in files.column("num_records").to_pylist()) if files.num_rows else 0
    schema = arrow_schema(table)
    parts: list[pa.Table] = []
    held = 0
    for file in files.to_pylist():
        for part in _file_parts(table.table_uri, file, columns, rows_per_batch):
            parts.append(part)
            held += part.num_rows
            if held >= rows_per_batch:
                batch = _joined(parts, columns, schema)
                yield (batch.sort_by(order_by) if order_by is not None else batch), total
                parts, held = [], 0
    if parts:
        batch = _joined(parts, columns, schema)
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


def _joined(parts: list[pa.Table], columns: list[str], schema: pa.Schema) -> pa.Table:
    """Parts of files as one table of `columns` (`with_columns`: a column a file lacks is null
    there, as Delta reads it); timestamps are Delta's, UTC: they come back UTC-aware."""
    rows = with_columns(concatenated(parts), columns, schema)
    utc = [
        pa.field(f.name, pa.timestamp(f.type.unit, tz="UTC")) if pa.types.is_timestamp(f.type) and not f.type.tz else f
        for f in rows.schema
    ]
    return rows.cast(pa.schema(utc))


def arrow_schema(table: deltalake.DeltaTable) -> pa.Schema:
    """The schema of `table` (delta-rs) in Arrow: the types of the columns its files may lack."""
    return pa.schema(table.schema().to_arrow())


def concatenated(parts: Sequence[pa.Table]) -> pa.Table:
    """`parts` as one table, a column some of them lack null there. Parts that hold no column (a
    read of only columns their files lack) keep their rows, which pa.concat_tables drops when no
    part has a column."""
    rows = pa.concat_tables(parts, promote_options="permissive")
    if rows.num_columns == 0 and rows.num_rows == 0:
        rows = pa.table({"": pa.nulls(sum(part.num_rows for part in parts))}).drop_columns([""])
    return rows


def with_columns(rows: pa.Table, columns: Sequence[str], schema: pa.Schema | None = None) -> pa.Table:
    """`columns` of `rows`, in that order, a column `rows` lacks added as nulls of the type
    `schema` gives it (else Arrow's null type). Delta lets a data file leave out a column of
    the table's schema, which then reads as null: a file written before the column was added,
    or a small append's file, which holds only the columns its rows set (log/serving/append.py).

        with_columns(pq.ParquetFile(path).read(), ["event_id", "job_event"], arrow_schema(table))
    """
    for name in columns:
        if name not in rows.column_names:
            kind = schema.field(name).type if schema is not None and name in schema.names else pa.null()
            rows = rows.append_column(pa.field(name, kind), pa.nulls(rows.num_rows, kind))
    return rows.select(list(columns))


def _read_files(table_uri: str, files: pa.Table, columns: list[str], schema: pa.Schema) -> pa.Table:
    """`columns` of the data files in `files` (delta-rs's add actions), partition values included."""
    parts = [part for file in files.to_pylist() for part in _file_parts(table_uri, file, columns)]
    return _joined(parts, columns, schema)


def latest_version_on_disk(path: str) -> int | None:
    """The newest commit of a Delta table on a local disk, without a JVM: from the checkpoint
    `_last_checkpoint` names, the commit files after it found by `stat` (Delta versions after a
    checkpoint are contiguous), else by listing `_delta_log`.

    For sensors, which run in Dagster's daemon and should not start Spark to see whether a
    table moved, and the appends' own checks. Not a listing: the log keeps every commit of its
    retention (7 days; a service appending a few times a second leaves millions of files), and a
    listing reads every name. None when there is no table. Remote roots need Spark
    (`current_version`).
    """
    named = last_checkpoint(path)
    if named is None or not checkpoint_path(path, named[0]).is_file():
        return _latest_listed(path)  # none yet, or one of several parts
    low, step = named[0], 1  # a version the log holds (its checkpoint's)
    while commit_path(path, low + step).is_file():
        low, step = low + step, step * 2
    high = low + step  # not there: the newest is in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if commit_path(path, middle).is_file() else (low, middle)
    if not checkpoint_path(path, named[0]).is_file():
        return _latest_listed(path)  # cleaned up meanwhile (an old one `_last_checkpoint` still named)
    return low


def _latest_listed(path: str) -> int | None:
    """The newest commit file in a local table's `_delta_log`, by listing it; None when there is
    no table."""
    log_dir = log_folder(path)
    if not log_dir.is_dir():
        return None
    versions = [int(match.group(1)) for name in os.listdir(log_dir) if (match := COMMIT_FILE.match(name))]
    return max(versions, default=None)


__all__ = [
    "SchemaVersionError",
    "add_actions",
    "arrow_schema",
    "concatenated",
    "head_rows",
    "iter_local_table",
    "latest_version_on_disk",
    "local_delta_table",
    "read_local_table",
    "schema_version_of",
    "table_properties",
    "with_columns",
]
