"""Typed Dagster metadata for our Delta tables: version, files, size, path, a small preview."""

from __future__ import annotations

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.runtime.delta_local import head_rows, local_delta_table
from databuild_assets.runtime.delta_tables import table_size
from databuild_assets.runtime.lake import is_local


def delta_table_metadata(spark: SparkSession, path: str) -> dict:
    """Version, files, bytes and rows (`dagster/row_count`) of the table at `path`, from its snapshot;
    the rows are counted by Spark only where the files' statistics cannot tell."""
    size = table_size(spark, path)
    rows = size.num_rows if size.num_rows is not None else spark.read.format("delta").load(path).count()
    return {
        "dagster/row_count": MetadataValue.int(rows),
        "delta_version": MetadataValue.int(size.version),
        "num_files": MetadataValue.int(size.num_files),
        "size_bytes": MetadataValue.int(size.size_bytes),
        "path": MetadataValue.path(path) if is_local(path) else MetadataValue.url(path),
    }


def preview(
    spark: SparkSession, path: str, columns: list[str], newest_by: str | None = None, limit: int = 5
) -> MetadataValue:
    """A few rows of the table at `path` as a Dagster table (values shown as text): the newest by
    `newest_by` when given, else the first the table's files hold. A local table is read by delta-rs
    in this process (only the files those rows can be in); a remote one by Spark.

    `columns` are named, never all: Dagster keeps every preview in its run storage, so a preview
    shows only columns no tombstone can name (no event, build request, job run or partition id,
    no free text that may quote one); erasure does not have to reach them there
    (docs/decisions/0035-erasure-reaches-dagster-storage.md)."""
    if (table := local_delta_table(path)) is not None:
        head = head_rows(table, limit, columns, newest_by)
        rows, names = head.to_pylist(), head.column_names
    else:
        frame = spark.read.format("delta").load(path)
        if newest_by is not None:
            frame = frame.orderBy(F.col(newest_by).desc())
        frame = frame.select(*columns)
        rows, names = [row.asDict() for row in frame.limit(limit).collect()], frame.columns
    schema = TableSchema(columns=[TableColumn(name, "string") for name in names])
    records = [TableRecord({name: None if row[name] is None else str(row[name]) for name in names}) for row in rows]
    return MetadataValue.table(records=records, schema=schema)
