"""The Dagster layer: definitions load, and a real in-process materialization reports counts
that reconcile with what was landed."""

from __future__ import annotations

from dagster import Definitions, materialize

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG
from databuild_assets.workload import write_landing_files
from databuild_assets_tests.conftest import TEST_SPARK_SETTINGS


def lakehouse_for(lake) -> LakehouseResource:
    """The suite's Spark settings, so materializing does not reconfigure the shared session."""
    return LakehouseResource(
        lake_root=lake.root,
        shuffle_partitions=TEST_SPARK_SETTINGS.shuffle_partitions,
        driver_memory=TEST_SPARK_SETTINGS.driver_memory,
        extra_spark_config=dict(TEST_SPARK_SETTINGS.extra_config),
    )


def test_definitions_load_and_validate():
    from databuild_assets.definitions import defs

    Definitions.validate_loadable(defs)
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {
        "landing_files", RAW_EVENT_LOG.name, EVENT_QUARANTINE.name, "tombstones", "filtered_event_log",
        "partition_state", "job_runs", "build_requests",
    }
    assert defs.resolve_job_def("all_assets_job").executor_def.name == "in_process"


def test_materializing_the_event_log_reports_counts_that_reconcile_with_the_landed_lines(spark, lake):
    landed = write_landing_files(lake.landing, 2_000, seed=3, events_per_file=700, bad_line_rate=0.01, duplicate_rate=0.02)

    result = materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse_for(lake)})

    assert result.success
    metadata = {
        event.asset_key.to_user_string(): {k: v.value for k, v in event.materialization.metadata.items()}
        for event in result.get_asset_materialization_events()
    }
    raw = metadata[RAW_EVENT_LOG.name]
    assert (raw["lines_read"], raw["accepted"], raw["duplicates_skipped"], raw["quarantined"]) == (
        landed.lines_written, landed.events_written, landed.duplicate_lines_written, landed.bad_lines_written,
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
