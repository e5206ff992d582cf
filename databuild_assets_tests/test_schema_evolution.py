"""Schema evolution: a v2 event schema (a new nullable field in the partition_event payload) reads
v1 data; the upgrade adds the field in place, keeps every row and records version 2; code of
version 1 then refuses the table. The v2 schema is built here: the production schema stays v1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from databuild_assets.ingest.writer import append_events
from databuild_assets.runtime.delta_local import SchemaVersionError
from databuild_assets.runtime.delta_tables import check_schema_version, current_version, ensure_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.schema_upgrade import (
    SchemaDowngradeError,
    SchemaUpgradeError,
    conform_to_schema,
    upgrade_table_schema,
)
from databuild_assets_tests.bel_cases import one_build_events
from databuild_assets_tests.support import tree

NEW_FIELD = StructField("attempt", IntegerType(), True)  # which retry of the job built the partition


def with_payload_field(schema: StructType, payload: str, field: StructField, after: str) -> StructType:
    """`schema` with `field` added to the struct column `payload`, right after its field `after`."""
    columns = []
    for column in schema.fields:
        if column.name == payload:
            fields = []
            for inner in column.dataType.fields:
                fields.append(inner)
                if inner.name == after:
                    fields.append(field)
            column = StructField(column.name, StructType(fields), column.nullable, column.metadata)
        columns.append(column)
    return StructType(columns)


RAW_EVENT_LOG_V2 = with_payload_field(RAW_EVENT_LOG.schema, "partition_event", NEW_FIELD, after="status_name")


def rows_by_event_id(frame) -> list[dict]:
    return [row.asDict(recursive=True) for row in frame.orderBy("event_id").collect()]


def without_new_field(rows: list[dict]) -> list[dict]:
    """The rows as v1 knew them: the new field taken out of each partition_event payload."""
    return [
        {
            **row,
            "partition_event": None
            if row["partition_event"] is None
            else {k: v for k, v in row["partition_event"].items() if k != NEW_FIELD.name},
        }
        for row in rows
    ]


@pytest.fixture(scope="module")
def v1_lake(spark, tmp_path_factory) -> Lake:
    """A raw log of schema version 1 holding one build's 11 events, written by the writer API."""
    lake = Lake(str(tmp_path_factory.mktemp("v1") / "lake"))
    append_events(spark, lake, one_build_events(), writer="schema-v1")
    return lake


def copy_of(lake: Lake, to: Path) -> Lake:
    shutil.copytree(lake.root, to / "lake")
    return Lake(str(to / "lake"))


@pytest.fixture(scope="module")
def upgraded(spark, v1_lake, tmp_path_factory):
    """(lake, upgrade result, the v1 rows) after upgrading a copy of the v1 log to version 2."""
    lake = copy_of(v1_lake, tmp_path_factory.mktemp("upgraded"))
    path = lake.table_path(RAW_EVENT_LOG)
    v1_rows = rows_by_event_id(spark.read.format("delta").load(path))
    return lake, upgrade_table_schema(spark, path, RAW_EVENT_LOG_V2, 2), v1_rows


def test_v1_rows_read_under_the_v2_schema_with_the_new_field_null(spark, v1_lake):
    v1 = spark.read.format("delta").load(v1_lake.table_path(RAW_EVENT_LOG))

    as_v2 = conform_to_schema(v1, RAW_EVENT_LOG_V2)

    assert as_v2.schema.simpleString() == RAW_EVENT_LOG_V2.simpleString()
    rows = rows_by_event_id(as_v2)
    assert without_new_field(rows) == rows_by_event_id(v1)
    payloads = [row["partition_event"] for row in rows if row["event_type"] == "partition_event"]
    assert len(payloads) == 4 and all(p[NEW_FIELD.name] is None for p in payloads)
    # An unset payload stays unset rather than becoming a struct of nulls.
    assert all(row["partition_event"] is None for row in rows if row["event_type"] != "partition_event")


def test_the_upgrade_adds_the_field_in_place_keeps_every_row_and_records_version_2(spark, upgraded):
    lake, result, v1_rows = upgraded
    path = lake.table_path(RAW_EVENT_LOG)

    assert (result.from_version, result.to_version, result.added_fields, result.rows) == (
        1,
        2,
        ("partition_event.attempt",),
        11,
    )
    table = spark.read.format("delta").load(path)
    assert table.schema.simpleString() == RAW_EVENT_LOG_V2.simpleString()  # the field where v2 declares it
    rows = rows_by_event_id(table)
    assert without_new_field(rows) == v1_rows
    assert all(row["partition_event"][NEW_FIELD.name] is None for row in rows if row["partition_event"])
    assert check_schema_version(spark, path, known_version=2) == 2
    # Two metadata commits, no data file rewritten.
    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    assert [(row["version"], row["operation"]) for row in history[-2:]] == [
        (result.commits[0], "ADD COLUMNS"),
        (result.commits[1], "SET TBLPROPERTIES"),
    ]
    assert all(row["operationMetrics"].get("numFiles") in (None, "0") for row in history[-2:])


def test_rows_of_version_2_carry_the_new_field_after_the_upgrade(spark, upgraded, tmp_path):
    lake = copy_of(upgraded[0], tmp_path)
    path = lake.table_path(RAW_EVENT_LOG)
    [template] = [row for row in rows_by_event_id(spark.read.format("delta").load(path)) if row["event_id"] == "e09"]
    v2_row = {**template, "event_id": "e09-retry", "partition_event": {**template["partition_event"], "attempt": 2}}

    spark.createDataFrame([v2_row], RAW_EVENT_LOG_V2).write.format("delta").mode("append").save(path)

    stored = spark.read.format("delta").load(path).where("event_id = 'e09-retry'").first()
    assert stored["partition_event"]["attempt"] == 2
    assert spark.read.format("delta").load(path).count() == 12


def test_code_of_version_1_refuses_the_upgraded_table_and_leaves_it_unchanged(spark, upgraded):
    lake, _, _ = upgraded
    path = lake.table_path(RAW_EVENT_LOG)
    before = tree(Path(lake.root))
    expected = f"{path} has schema version 2, newer than this code's 1: a newer databuild-assets upgraded it"

    with pytest.raises(SchemaVersionError, match=expected):
        check_schema_version(spark, path)  # this code's SCHEMA_VERSION, 1
    with pytest.raises(SchemaVersionError, match=expected):
        ensure_table(spark, path, RAW_EVENT_LOG)
    with pytest.raises(SchemaVersionError, match=expected):
        append_events(spark, lake, one_build_events(), writer="schema-v1")

    assert tree(Path(lake.root)) == before


def test_a_downgrade_is_refused_and_changes_nothing(spark, upgraded):
    lake, _, _ = upgraded
    path = lake.table_path(RAW_EVENT_LOG)
    version = current_version(spark, path)

    with pytest.raises(SchemaDowngradeError) as refused:
        upgrade_table_schema(spark, path, RAW_EVENT_LOG.schema, 1)

    assert str(refused.value).startswith(f"{path} is at schema version 2; refusing to downgrade it to 1:")
    assert current_version(spark, path) == version


def test_upgrading_again_changes_nothing(spark, upgraded):
    lake, _, _ = upgraded
    path = lake.table_path(RAW_EVENT_LOG)
    version = current_version(spark, path)

    again = upgrade_table_schema(spark, path, RAW_EVENT_LOG_V2, 2)

    assert (again.from_version, again.added_fields, again.commits, again.rows) == (2, (), (), 11)
    assert current_version(spark, path) == version


def test_a_change_that_is_not_additive_is_refused_and_changes_nothing(spark, v1_lake, tmp_path):
    lake = copy_of(v1_lake, tmp_path)
    path = lake.table_path(RAW_EVENT_LOG)
    retyped = StructType(
        [
            StructField("status_code", StringType()) if f.name == "status_code" else f
            for f in RAW_EVENT_LOG_V2["job_event"].dataType.fields
        ]
    )
    target = StructType(
        [
            StructField("job_event", retyped, True) if f.name == "job_event" else f
            for f in RAW_EVENT_LOG_V2.fields
            if f.name != "source_line"
        ]
    )
    before = tree(Path(lake.root))

    with pytest.raises(SchemaUpgradeError) as refused:
        upgrade_table_schema(spark, path, target, 2)

    assert str(refused.value) == (
        f"{path}: schema version 2 is not an additive change of the table's schema (source_line is dropped; "
        "job_event.status_code changes type from int to string); nothing was changed. Only new nullable columns "
        "and struct fields are upgraded in place."
    )
    assert tree(Path(lake.root)) == before


def test_a_new_field_without_a_new_version_is_refused(spark, v1_lake, tmp_path):
    lake = copy_of(v1_lake, tmp_path)
    path = lake.table_path(RAW_EVENT_LOG)

    with pytest.raises(SchemaUpgradeError, match="adds partition_event.attempt but keeps schema version 1"):
        upgrade_table_schema(spark, path, RAW_EVENT_LOG_V2, 1)

    assert check_schema_version(spark, path) == 1
