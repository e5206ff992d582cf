"""The lake check as Dagster asset checks (defs/maintenance/checks.py): after a real run every
table of the lake passes its check; a raw_event_log data file zeroed in its middle passes the
cheap check that runs with materializations (same size) and fails check_lake_job, which reads
every data file, naming the file; a deleted one fails even the cheap check. No JVM for the checks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetSelection, Definitions, define_asset_job

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.maintenance.assets import filtered_event_log, tombstones
from databuild_assets.defs.maintenance.checks import CHECKED_TABLES, check_lake_job, lake_checks
from databuild_assets.defs.projections.assets import projection_assets
from databuild_assets.defs.serving.assets import serving_index
from databuild_assets.runtime.delta_log import read_log
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import write_landing_files
from databuild_assets_tests.support import lakehouse_for

EVERY_CHECK = {key.to_user_string() for key in CHECKED_TABLES}
# The checks alone with their default config: what runs after each materialization.
cheap_checks_job = define_asset_job("cheap_checks_job", selection=AssetSelection.checks(lake_checks))
every_asset_job = define_asset_job(
    "every_asset_job", selection=AssetSelection.all() - AssetSelection.assets(landing_files.key)
)


def definitions(lake: Lake) -> Definitions:
    return Definitions(
        assets=[landing_files, ingested_event_log, tombstones, filtered_event_log, *projection_assets, serving_index],
        asset_checks=[lake_checks],
        jobs=[every_asset_job, check_lake_job, cheap_checks_job],
        resources={"lakehouse": lakehouse_for(lake)},
    )


def evaluations(lake: Lake, job_name: str) -> dict[str, object]:
    """check key -> its evaluation, from a run of `job_name` on `lake`."""
    result = definitions(lake).resolve_job_def(job_name).execute_in_process()
    assert result.success
    return {f"{e.asset_key.to_user_string()}:{e.check_name}": e for e in result.get_asset_check_evaluations()}


def failed(found: dict[str, object]) -> set[str]:
    return {key for key, evaluation in found.items() if not evaluation.passed}


@pytest.fixture(scope="module")
def built_lake(spark, tmp_path_factory) -> tuple[Lake, dict[str, object]]:
    """A lake every asset was materialized into by one real run, and that run's check evaluations."""
    lake = Lake(str(tmp_path_factory.mktemp("lake-checks") / "lake"))
    write_landing_files(lake.landing, 600, seed=5, events_per_file=200, bad_line_rate=0.01)
    return lake, evaluations(lake, every_asset_job.name)


def damaged_copy(built_lake, tmp_path: Path) -> tuple[Lake, str]:
    """A copy of the built lake and the path (relative to its root) of raw_event_log's largest data file."""
    lake = Lake(str(tmp_path / "lake"))
    shutil.copytree(built_lake[0].root, lake.root)
    state = read_log(lake.table_path(RAW_EVENT_LOG))
    largest = max(state.files.values(), key=lambda f: f.size)
    return lake, f"tables/{RAW_EVENT_LOG.name}/{largest.path}"


def test_after_a_real_run_every_table_of_the_lake_passes_its_check_in_the_run_and_in_check_lake_job(built_lake):
    lake, in_the_run = built_lake
    assert set(in_the_run) >= EVERY_CHECK and failed(in_the_run) == set()
    assert {in_the_run[key].metadata["data_files_read"].value for key in EVERY_CHECK} == {False}

    found = evaluations(lake, check_lake_job.name)

    assert set(found) == EVERY_CHECK and failed(found) == set()
    raw = {name: value.value for name, value in found["raw_event_log:intact"].metadata.items()}
    assert raw["data_files_read"] is True and raw["problems"] == "none"
    assert raw["rows"] == 600 and raw["files"] >= 1 and raw["bytes"] > 0 and raw["version"] >= 0
    assert found["raw_event_log:ingest_ledger_intact"].metadata["files"].value >= 1
    assert found["serving_index:intact"].metadata["version"].value == raw["version"]  # the raw log version it reflects
    assert found["partition_state:intact"].metadata["rows"].value > 0


def test_a_raw_log_data_file_zeroed_in_its_middle_fails_check_lake_job_naming_the_file(built_lake, tmp_path):
    lake, damaged = damaged_copy(built_lake, tmp_path)
    path = os.path.join(lake.root, damaged)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:  # the footer at its end stays whole: the file opens, its pages do not decode
        handle.seek(size // 4)
        handle.write(b"\0" * (size // 2))

    assert failed(evaluations(lake, cheap_checks_job.name)) == set()  # same size: only reading it tells
    found = evaluations(lake, check_lake_job.name)

    assert failed(found) == {"raw_event_log:intact"}
    evaluation = found["raw_event_log:intact"]
    problems = evaluation.metadata["problems"].value
    assert evaluation.severity == AssetCheckSeverity.ERROR
    assert f"raw_event_log: {damaged}: data file does not read" in problems
    assert f"Repair: databuild-assets repair delta://{lake.root}" in problems
    assert evaluation.metadata["repair"].value == f"databuild-assets repair delta://{lake.root}"


def test_a_deleted_raw_log_data_file_fails_the_check_that_runs_with_materializations(built_lake, tmp_path):
    lake, damaged = damaged_copy(built_lake, tmp_path)
    os.remove(os.path.join(lake.root, damaged))

    found = evaluations(lake, cheap_checks_job.name)

    assert failed(found) == {"raw_event_log:intact"}
    problems = found["raw_event_log:intact"].metadata["problems"].value
    assert f"raw_event_log: {damaged}: data file is missing. Costs: " in problems
    assert found["raw_event_log:intact"].metadata["problem_count"].value == 1


def test_the_landing_run_runs_no_lake_check_and_check_lake_schedule_runs_them_all_reading_every_file():
    from databuild_assets.definitions import defs

    def lake_checks_of(job_name: str) -> set[str]:
        keys = defs.resolve_job_def(job_name).asset_layer.asset_graph.asset_check_keys
        return {key.to_user_string() for key in keys} & EVERY_CHECK

    assert lake_checks_of("ingest_and_refresh_job") == set()
    scheduled = defs.resolve_schedule_def("check_lake_schedule").job_name
    assert lake_checks_of(scheduled) == EVERY_CHECK
    assert defs.resolve_job_def(scheduled).run_config["ops"]["lake_checks"]["config"]["read_data"] is True
