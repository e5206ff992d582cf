"""A run reads a local table's metadata, small tables and previews from the Delta log without a Spark
job (runtime/delta_tables.py); what it reads must be what Spark reads from the same table."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from databuild_assets.ingest.landing import _Ledger, ingest_landing_files
from databuild_assets.runtime.delta_local import head_rows, local_delta_table, read_local_table
from databuild_assets.runtime.delta_tables import TableSize, read_table_properties, table_size
from databuild_assets.runtime.lake import EVENT_QUARANTINE, INGEST_LEDGER, RAW_EVENT_LOG
from databuild_assets_tests.support import one_partition_build, write_landing


def test_the_log_read_without_spark_answers_as_spark_does(spark, lake):
    write_landing(lake, "a.jsonl", [*one_partition_build("br-1", "data/a", 0), "not json"])
    ingest_landing_files(spark, lake)
    write_landing(lake, "b.jsonl", one_partition_build("br-2", "data/b", 10**12))  # a later day
    ingest_landing_files(spark, lake)

    for spec in (RAW_EVENT_LOG, EVENT_QUARANTINE, INGEST_LEDGER):
        path = lake.table_path(spec)
        shown = {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
        detail = DeltaTable.forPath(spark, path).detail().first()
        version = DeltaTable.forPath(spark, path).history(1).first()["version"]
        table = spark.read.format("delta").load(path)

        assert read_table_properties(spark, path) == shown, spec.name
        assert table_size(spark, path) == TableSize(version, detail["numFiles"], detail["sizeInBytes"], table.count())
        assert read_local_table(local_delta_table(path)).num_rows == table.count()

    log_path = lake.table_path(RAW_EVENT_LOG)
    newest = head_rows(local_delta_table(log_path), 4, ["event_id", "event_date"], newest_by="timestamp").to_pylist()
    expected = spark.read.format("delta").load(log_path).orderBy(F.col("timestamp").desc()).limit(4).collect()
    assert newest == [{"event_id": row["event_id"], "event_date": row["event_date"]} for row in expected]

    ledger = _Ledger(spark, lake)
    by_spark = spark.read.format("delta").load(ledger.path).collect()
    key = lambda row: (row.batch_id, row.stage, row.file_path or "")  # noqa: E731
    assert [
        (r.batch_id, r.stage, r.file_path, r.file_size, r.accepted, r.recorded_at.timestamp())
        for r in sorted(ledger.rows(), key=key)
    ] == [
        (r.batch_id, r.stage, r.file_path, r.file_size, r.accepted, r.recorded_at.timestamp())
        for r in sorted(by_spark, key=key)
    ]
