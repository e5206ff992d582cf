"""The Dagster layer: definitions load (as dagster dev and `dg` load them), every asset is a
full catalog entry (kinds, owners, column schema, table name, URI) that matches the Delta table
it describes, and a real in-process materialization reports counts that reconcile with what was
landed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, Definitions, materialize

from databuild_assets.defs.catalog import (
    LANDING_FILES,
    SERVING_INDEX,
    TABLE_ASSETS,
    CatalogSettings,
    CatalogSettingsError,
    in_catalog,
)
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.maintenance.assets import filtered_event_log, tombstones
from databuild_assets.defs.maintenance.checks import CHECKED_TABLES
from databuild_assets.defs.projections.assets import projection_assets
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.projection import STATE
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG, Lake
from databuild_assets.workload import write_landing_files
from databuild_assets_tests.support import REPO_ROOT, lakehouse_for

ALL_ASSETS = [landing_files, ingested_event_log, tombstones, filtered_event_log, *projection_assets]


def test_definitions_load_and_validate():
    from databuild_assets.definitions import defs

    Definitions.validate_loadable(defs)
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "landing_files",
        RAW_EVENT_LOG.name,
        EVENT_QUARANTINE.name,
        "tombstones",
        "filtered_event_log",
        "partition_state",
        "job_runs",
        "build_requests",
        SERVING_INDEX,
    }
    assert defs.resolve_job_def("all_assets_job").executor_def.name == "in_process"


def test_the_landing_run_runs_no_check_and_the_freshness_schedule_runs_every_projection_check():
    from databuild_assets.definitions import defs

    def names(graph) -> set[str]:
        return {f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys}

    def checks_of(job_name: str) -> set[str]:
        return names(defs.resolve_job_def(job_name).asset_layer.asset_graph)

    every_check = names(defs.resolve_asset_graph())
    lake_checks = {key.to_user_string() for key in CHECKED_TABLES}  # test_lake_checks.py
    projection_checks = {name for name in every_check - lake_checks if name.split(":")[0] in PROJECTIONS}
    assert len(projection_checks) == 15  # five on each projection, besides its lake check
    assert checks_of("ingest_and_refresh_job") == set()
    assert checks_of(defs.resolve_schedule_def("projection_freshness_schedule").job_name) == projection_checks


def test_every_asset_has_kinds_owners_tags_and_a_uri_and_every_table_its_columns_and_name():
    from databuild_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    lake = Lake.from_env()  # what definitions.py builds the lakehouse resource with
    for key in graph.get_all_asset_keys():
        node, name = graph.get(key), key.to_user_string()
        assert node.owners == ["team:databuild"], name
        assert "databuild/layer" in node.tags, name
        if name == LANDING_FILES:
            assert node.kinds == {"json"}
            assert node.metadata["dagster/uri"].value == Path(lake.landing).as_uri()
            continue
        if name == SERVING_INDEX:
            assert node.kinds == {"sqlite"}
            assert node.tags["databuild/erasure"] == "purged"
            assert node.metadata["dagster/uri"].value == Path(lake.path(SERVING_INDEX_FOLDER)).as_uri()
            continue
        spec, _ = TABLE_ASSETS[name]  # every other asset is a table
        assert node.kinds == {"spark", "deltalake"}, name
        assert node.tags["databuild/erasure"] == ("kept" if name == "tombstones" else "purged"), name
        assert node.metadata["dagster/table_name"].value == name
        assert node.metadata["dagster/uri"].value == Path(lake.table_path(spec)).as_uri()
        columns = node.metadata["dagster/column_schema"].value.columns
        assert [c.name for c in columns][: len(spec.schema)] == spec.schema.fieldNames(), name
        described = [c.name for c in columns if not (c.description or "").strip()]
        assert described == [], f"{name}: columns without a description"
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == {LANDING_FILES, SERVING_INDEX, *TABLE_ASSETS}


def cataloged(lake: Lake, settings: CatalogSettings = CatalogSettings()):
    """The asset graph of every asset with its catalog entry for `lake` (no definitions module)."""
    assets = in_catalog(ALL_ASSETS, lake, settings)
    return Definitions(assets=assets, resources={"lakehouse": lakehouse_for(lake)}).resolve_asset_graph()


def catalog_columns(metadata) -> list[tuple[str, str, bool]]:
    return [(c.name, c.type, c.constraints.nullable) for c in metadata["dagster/column_schema"].value.columns]


def delta_columns(schema) -> list[tuple[str, str, bool]]:
    """A Delta table's columns as the catalog spells them: Spark SQL types; the projections'
    internal fold state, whose layout the catalog leaves out, as plain `struct`."""
    return [
        (f.name, f.dataType.typeName() if f.name == STATE else f.dataType.simpleString(), f.nullable)
        for f in schema.fields
    ]


def test_each_table_assets_column_schema_and_uri_are_those_of_its_materialized_delta_table(spark, lake):
    write_landing_files(lake.landing, 400, seed=8, bad_line_rate=0.02)
    result = materialize(ALL_ASSETS, resources={"lakehouse": lakehouse_for(lake)})
    assert result.success

    graph = cataloged(lake)
    for name in TABLE_ASSETS:
        metadata = graph.get(AssetKey(name)).metadata
        table = spark.read.format("delta").load(metadata["dagster/uri"].value)  # the URI is the table
        assert catalog_columns(metadata) == delta_columns(table.schema), name
        descriptions = {c.name: c.description for c in metadata["dagster/column_schema"].value.columns}
        for field in table.schema.fields:  # the projections' columns carry their comment into Delta
            if "comment" in field.metadata:
                assert descriptions[field.name] == field.metadata["comment"], f"{name}.{field.name}"
    # The check above compares something: the tables are there and not empty.
    assert spark.read.format("delta").load(Path(lake.table_path(RAW_EVENT_LOG)).as_uri()).count() == 400


def test_owners_per_group_and_the_freshness_bound_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DATABUILD_ASSET_OWNERS", "event_log=team:ingest, alice@example.com; *=team:platform")
    monkeypatch.setenv("DATABUILD_PROJECTION_MAX_LAG_MINUTES", "90")
    settings = CatalogSettings.from_env()
    assert settings.owners("event_log") == ["team:ingest", "alice@example.com"]
    assert settings.owners("projections") == ["team:platform"]
    assert settings.max_projection_lag == timedelta(minutes=90)

    graph = cataloged(Lake("/data/lake"), settings)
    assert graph.get(AssetKey("raw_event_log")).owners == ["team:ingest", "alice@example.com"]
    assert graph.get(AssetKey("job_runs")).owners == ["team:platform"]

    monkeypatch.setenv("DATABUILD_ASSET_OWNERS", "event_log=bob")
    with pytest.raises(CatalogSettingsError, match="not an email or team:name: bob"):
        CatalogSettings.from_env()
    monkeypatch.setenv("DATABUILD_ASSET_OWNERS", "")
    monkeypatch.setenv("DATABUILD_PROJECTION_MAX_LAG_MINUTES", "an hour")
    with pytest.raises(CatalogSettingsError, match="DATABUILD_PROJECTION_MAX_LAG_MINUTES='an hour'"):
        CatalogSettings.from_env()


def test_a_remote_lake_roots_tables_have_its_uris():
    metadata = cataloged(Lake("s3a://bucket/databuild")).get(AssetKey("job_runs")).metadata
    assert metadata["dagster/uri"].value == "s3a://bucket/databuild/tables/job_runs"


def test_dg_lists_the_definitions_that_dagster_loads():
    from databuild_assets.definitions import defs

    dg = Path(sys.executable).with_name("dg")
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1])}
    listed = subprocess.run(
        [str(dg), "list", "defs", "--json"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    found = json.loads(listed.stdout)
    assets = {a["asset_key"]: a for a in found["assets"]}
    assert set(assets) == {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert set(assets["raw_event_log"]["kinds"]) == {"spark", "deltalake"}
    assert {s["name"] for s in found["schedules"]} == {s.name for s in defs.schedules}
    assert {c["key"] for c in found["asset_checks"]} >= {
        f"{p}:fresh_with_raw_log" for p in ("partition_state", "job_runs", "build_requests")
    }


def test_materializing_the_event_log_reports_counts_that_reconcile_with_the_landed_lines(spark, lake):
    landed = write_landing_files(
        lake.landing, 2_000, seed=3, events_per_file=700, bad_line_rate=0.01, duplicate_rate=0.02
    )

    result = materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse_for(lake)})

    assert result.success
    metadata = {
        event.asset_key.to_user_string(): {k: v.value for k, v in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }
    raw = metadata[RAW_EVENT_LOG.name]
    assert (raw["lines_read"], raw["accepted"], raw["duplicates_skipped"], raw["quarantined"]) == (
        landed.lines_written,
        landed.events_written,
        landed.duplicate_lines_written,
        landed.bad_lines_written,
    )
    assert raw["files_ingested"] == len(landed.files) == 3
    assert raw["dagster/row_count"] == spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).count() == 2_000
    assert metadata[EVENT_QUARANTINE.name]["dagster/row_count"] == landed.bad_lines_written
    assert len(raw["preview"].records) == 5


def test_materializing_again_with_no_new_files_ingests_nothing(spark, lake):
    write_landing_files(lake.landing, 300, seed=4)
    resources = {"lakehouse": lakehouse_for(lake)}
    first = materialize([landing_files, ingested_event_log], resources=resources)
    version = first.asset_materializations_for_node("ingested_event_log")[0].metadata["delta_version"].value

    again = materialize([landing_files, ingested_event_log], resources=resources)

    raw = again.asset_materializations_for_node("ingested_event_log")[0].metadata
    assert (raw["lines_read"].value, raw["accepted"].value, raw["delta_version"].value) == (0, 0, version)


def test_a_deployments_runs_share_the_warm_driver_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("DATABUILD_SPARK_DRIVER", raising=False)
    # Each launched run is a process: one JVM for them all; a job run in a script's process, its own.
    assert LakehouseResource.from_env().driver == "auto"
    monkeypatch.setenv("DATABUILD_SPARK_DRIVER", "warm")
    assert LakehouseResource.from_env().driver == "warm"
    monkeypatch.setenv("DATABUILD_SPARK_DRIVER", "own")
    assert LakehouseResource.from_env().driver == "own"
    monkeypatch.setenv("DATABUILD_SPARK_DRIVER", "shared")
    with pytest.raises(ValueError, match="DATABUILD_SPARK_DRIVER='shared'"):
        LakehouseResource.from_env()
    assert LakehouseResource(lake_root="/tmp/lake").driver == "own"  # built in code (the tests): its own JVM
