"""Every Delta table the assets write is readable by delta-rs (the `deltalake` package, which
Polars and dagster-deltalake read through), with the rows Spark reads; a projection table an
earlier release gave deletion vectors is upgraded by its next refresh and then readable too."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import deltalake
import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import MapType

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.ingest.writer import append_events
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import projection_spec, refresh_projection
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.delta_tables import DELETION_VECTORS, DELETION_VECTORS_FEATURE, read_table_properties
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    INGEST_LEDGER,
    RAW_EVENT_LOG,
    TOMBSTONES,
    Lake,
)
from databuild_assets.workload import generate_events
from databuild_assets_tests.support import FOLD

LOG_TABLES = (RAW_EVENT_LOG, FILTERED_EVENT_LOG, EVENT_QUARANTINE, TOMBSTONES, INGEST_LEDGER)


def read_model_by_delta_rs(path: str, projection) -> list[dict]:
    """The projection's read-model rows as delta-rs reads them, in Spark's shapes (a map as a dict)."""
    columns = projection.schema.fieldNames()
    maps = {field.name for field in projection.schema.fields if isinstance(field.dataType, MapType)}
    rows = deltalake.DeltaTable(path).to_pyarrow_table(columns=columns).to_pylist()
    rows = [{name: dict(value) if name in maps else value for name, value in row.items()} for row in rows]
    return sorted(rows, key=lambda row: row[projection.key])


def read_model_by_spark(spark, path: str, projection) -> list[dict]:
    rows = spark.read.format("delta").load(path).select(*projection.schema.fieldNames()).collect()
    return sorted((row.asDict(recursive=True) for row in rows), key=lambda row: row[projection.key])


def assert_delta_rs_reads_what_spark_reads(spark, lake: Lake) -> None:
    for spec in LOG_TABLES:
        path = lake.table_path(spec)
        assert (
            deltalake.DeltaTable(path).to_pyarrow_table().num_rows == spark.read.format("delta").load(path).count()
        ), path
    for projection in PROJECTIONS.values():
        path = lake.table_path(projection_spec(projection))
        spark_rows = read_model_by_spark(spark, path, projection)
        assert spark_rows, path
        assert read_model_by_delta_rs(path, projection) == spark_rows, path


def test_every_table_is_read_by_delta_rs_as_spark_reads_it_after_full_and_incremental_refreshes(spark, lake):
    events = list(islice(generate_events(600, seed=17), 600))
    lines = [json.dumps(event) for event in events[:500]] + ["not json"]  # the last line is quarantined
    Path(lake.landing).mkdir(parents=True)
    (Path(lake.landing) / "events-00000.jsonl").write_text("\n".join(lines) + "\n")
    ingest_landing_files(spark, lake, settle_seconds=0)
    request_erasure(spark, lake, "build_request_id", events[0]["build_request_id"], actor="alice", reason="ticket 7")
    refresh_filtered_log(spark, lake)

    first = refresh_all_projections(spark, lake, rule=FOLD)
    assert {result.mode for result in first.values()} == {"full"}
    assert_delta_rs_reads_what_spark_reads(spark, lake)

    append_events(spark, lake, events[500:])
    refresh_filtered_log(spark, lake)
    second = refresh_all_projections(spark, lake, rule=FOLD)
    assert {result.mode for result in second.values()} == {"incremental"}
    assert_delta_rs_reads_what_spark_reads(spark, lake)
    assert spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).count() == 1


def test_a_projection_table_with_deletion_vectors_of_an_earlier_release_is_upgraded_by_its_next_refresh(spark, lake):
    partition_state = PROJECTIONS["partition_state"]
    path = lake.table_path(projection_spec(partition_state))
    events = list(islice(generate_events(300, seed=18), 300))
    append_events(spark, lake, events[:250])
    refresh_projection(spark, lake, partition_state, RAW_EVENT_LOG)
    # What an earlier release did: turn deletion vectors on (its ensure_table), then fold by a
    # MERGE that marks the rows it replaces.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DELETION_VECTORS}' = 'true')")
    some_ref = spark.read.format("delta").load(path).select("partition_ref").first()["partition_ref"]
    same_row = spark.read.format("delta").load(path).where(F.col("partition_ref") == some_ref)
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(same_row.alias("s"), "t.partition_ref = s.partition_ref")
        .whenMatchedUpdateAll()
        .execute()
    )
    assert (
        DeltaTable.forPath(spark, path).history(1).first()["operationMetrics"]["numTargetDeletionVectorsAdded"] == "1"
    )
    with pytest.raises(Exception, match="deletionVectors"):
        deltalake.DeltaTable(path).to_pyarrow_table()
    append_events(spark, lake, events[250:])

    result = refresh_projection(spark, lake, partition_state, RAW_EVENT_LOG, rule=FOLD)

    assert result.mode == "incremental"
    assert len(result.upgrades) == 1 and "deletionVectors" in result.upgrades[0], result.upgrades
    properties = read_table_properties(spark, path)
    assert DELETION_VECTORS_FEATURE not in properties and properties[DELETION_VECTORS] == "false"
    spark_rows = read_model_by_spark(spark, path, partition_state)
    assert read_model_by_delta_rs(path, partition_state) == spark_rows
    rebuilt = partition_state.build(spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)))
    rebuilt_rows = sorted(
        (row.asDict(recursive=True) for row in rebuilt.select(*partition_state.schema.fieldNames()).collect()),
        key=lambda row: row["partition_ref"],
    )
    assert spark_rows == rebuilt_rows
    assert refresh_projection(spark, lake, partition_state, RAW_EVENT_LOG, rule=FOLD).upgrades == ()
