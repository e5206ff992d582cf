"""Typed Dagster metadata for our Delta tables: version, files, size, path, a small preview."""

from __future__ import annotations

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema
from pyspark.sql import DataFrame, SparkSession

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


def preview(frame: DataFrame, limit: int = 5) -> MetadataValue:
    """The first `limit` rows as a Dagster table (values shown as text)."""
    rows = frame.limit(limit).collect()
    schema = TableSchema(columns=[TableColumn(name, "string") for name in frame.columns])
    records = [
        TableRecord({name: None if row[name] is None else str(row[name]) for name in frame.columns}) for row in rows
    ]
    return MetadataValue.table(records=records, schema=schema)
