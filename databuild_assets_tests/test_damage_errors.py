"""A damaged or missing file, met by any reader, is one line naming the table, the file and the
commands to run (`check`, `repair`): the query command prints it and exits 1, never a traceback;
the JVM-free backend raises DamagedTableError; a Spark job run by Dagster fails with it; the
sensors skip with it. A file that a later commit removed and a vacuum deleted is no damage.

One small lake is built for the module (a Spark ingestion of landing files); each case damages a
copy of it (docs/operations.md, Damaged files).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, SkipReason, job, materialize, op
from deltalake import write_deltalake

from databuild_assets.defs.damage import reports_damage
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.event_log.sensors import landing_files_sensor
from databuild_assets.defs.maintenance.jobs import compaction_job
from databuild_assets.defs.projections.sensors import event_log_commits_sensor
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.runtime import delta_log
from databuild_assets.runtime.damage import DamagedTableError
from databuild_assets.runtime.delta_log import read_log
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests.support import REPO_ROOT, evaluate_sensor, lakehouse_for, write_landing

EVENTS = list(generate_events(1_500, seed=5))  # three days: one raw log data file per event_date
NEW_EVENTS_ON_EVERY_DAY = [{**event, "event_id": f"{event['event_id']}-new"} for event in EVENTS[::50]]


@pytest.fixture(scope="module")
def built_lake(spark, tmp_path_factory) -> Lake:
    """A lake whose raw log Spark wrote (with Hadoop's .crc files) from three landing files."""
    lake = Lake(str(tmp_path_factory.mktemp("damage") / "lake")).ensure_root()
    for number in range(3):
        write_landing(lake, f"events-{number}.jsonl", EVENTS[number * 500 : (number + 1) * 500])
    assert materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse_for(lake)}).success
    return lake


@pytest.fixture
def lake(built_lake: Lake, tmp_path: Path) -> Lake:
    """A copy of the module's lake, for one case to damage."""
    shutil.copytree(built_lake.root, tmp_path / "lake")
    return Lake(str(tmp_path / "lake"))


def _raw_log(lake: Lake) -> Path:
    return Path(lake.table_path(RAW_EVENT_LOG))


def _a_data_file(lake: Lake) -> str:
    """One live data file of the raw log, relative to the lake root."""
    return f"tables/{RAW_EVENT_LOG.name}/{sorted(read_log(str(_raw_log(lake))).files)[0]}"


def _zero(path: Path, offset: int, length: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\0" * length)


def zero_4kb_of_a_data_files_event_ids(lake: Lake) -> str:
    """4 KB zeroed where the file's event_id pages start: every reader reads them (Spark's MERGE
    reads no other column of the files it does not change)."""
    file = _a_data_file(lake)
    path = Path(lake.root, file)
    metadata = pq.ParquetFile(path).metadata
    column = metadata.schema.names.index("event_id")
    _zero(path, metadata.row_group(0).column(column).data_page_offset, 4096)
    return file


def delete_a_data_file(lake: Lake) -> str:
    file = _a_data_file(lake)
    os.remove(Path(lake.root, file))
    return file


def cut_the_newest_commit_in_half(lake: Lake) -> str:
    commit = max(_raw_log(lake).glob("_delta_log/*.json"))
    os.truncate(commit, commit.stat().st_size // 2)
    return str(commit.relative_to(lake.root))


def garble_a_checkpoint(lake: Lake) -> str:
    deltalake.DeltaTable(str(_raw_log(lake))).create_checkpoint()
    [checkpoint] = _raw_log(lake).glob("_delta_log/*.checkpoint.parquet")
    size = checkpoint.stat().st_size
    _zero(checkpoint, size // 4, size // 2)
    return str(checkpoint.relative_to(lake.root))


DAMAGE: dict[str, Callable[[Lake], str]] = {
    "zeroed data file": zero_4kb_of_a_data_files_event_ids,
    "deleted data file": delete_a_data_file,
    "newest commit cut in half": cut_the_newest_commit_in_half,
    "garbled checkpoint": garble_a_checkpoint,
}


def assert_names_the_damage(line: str, lake: Lake, file: str) -> None:
    assert line.startswith(f"{RAW_EVENT_LOG.name}: {file}: "), line
    assert f"databuild-assets check delta://{lake.root}" in line
    assert f"databuild-assets repair delta://{lake.root}" in line


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_query_command_prints_one_line_naming_the_table_and_the_file_and_exits_1(lake: Lake, damage: str) -> None:
    file = DAMAGE[damage](lake)

    run = subprocess.run(
        [sys.executable, "-m", "databuild_assets.cli", "query", f"delta://{lake.root}", "get_activity_summary"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 1, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("databuild-assets query: ")
    assert_names_the_damage(line.removeprefix("databuild-assets query: "), lake, file)


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_jvm_free_backend_raises_damaged_table_error_naming_the_file(lake: Lake, damage: str) -> None:
    file = DAMAGE[damage](lake)

    with pytest.raises(DamagedTableError) as raised:
        DeltaRsEventLog(lake)

    assert (raised.value.table, raised.value.file, raised.value.root) == (RAW_EVENT_LOG.name, file, lake.root)
    assert_names_the_damage(str(raised.value), lake, file)
    assert "\n" not in str(raised.value)


def _append_behind_the_index(lake: Lake) -> Path:
    """The serving index at the raw log's version, then one more commit (its index does not
    follow): a new data file. Returns that file."""
    refresh_serving_index(lake)
    before = set(read_log(str(_raw_log(lake))).files)
    write_deltalake(str(_raw_log(lake)), raw_log_rows(enumerate(generate_events(20, seed=6)), "test"), mode="append")
    [new] = set(read_log(str(_raw_log(lake))).files) - before
    return _raw_log(lake) / new


def test_a_reader_catching_up_on_a_commit_that_does_not_parse_names_that_commit(lake: Lake) -> None:
    _append_behind_the_index(lake)
    file = cut_the_newest_commit_in_half(lake)

    with pytest.raises(DamagedTableError) as raised:
        DeltaRsEventLog(lake)

    assert raised.value.file == file and "commit file does not parse" in raised.value.what


def test_a_reader_catching_up_on_a_missing_data_file_the_log_references_names_that_file(lake: Lake) -> None:
    new = _append_behind_the_index(lake)
    os.remove(new)

    with pytest.raises(DamagedTableError) as raised:
        DeltaRsEventLog(lake)

    assert raised.value.file == str(new.relative_to(lake.root)) and "missing" in raised.value.what


def test_a_data_file_a_later_commit_removed_and_a_vacuum_deleted_is_not_damage(lake: Lake) -> None:
    refresh_serving_index(lake)  # the index reflects the files before the delete
    table = deltalake.DeltaTable(str(_raw_log(lake)))
    day = min(str(event_date) for event_date in table.to_pyarrow_dataset().to_table(["event_date"])["event_date"])
    table.delete(f"event_date = '{day}'")
    assert table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    with DeltaRsEventLog(lake) as log:  # its catch-up meets the deleted file: it reads the snapshot instead
        total = log.get_activity_summary().total_events

    assert total == sum(1 for event in EVENTS if _day(event["timestamp"]) != day)


def test_a_checkpoint_written_while_the_log_is_read_is_not_damage(tmp_path: Path, monkeypatch) -> None:
    """An appender's thread writes a checkpoint and points `_last_checkpoint` to it beside any
    reader: one that listed the folder before sees a pointer to a file it did not list (bench.soak:
    an ingestion run failed on it)."""
    path = str(tmp_path / "table")
    for value in range(3):
        write_deltalake(path, pa.table({"x": [value]}), mode="append")
    parse_commit, written = delta_log.parse_commit, []

    def parse_while_a_checkpoint_is_written(commit: Path):
        if not written:
            deltalake.DeltaTable(path).create_checkpoint()
            written.append(True)
        return parse_commit(commit)

    monkeypatch.setattr(delta_log, "parse_commit", parse_while_a_checkpoint_is_written)

    state = read_log(path)

    assert written and (tmp_path / "table" / "_delta_log" / "00000000000000000002.checkpoint.parquet").exists()
    assert state.damage == []


def test_a_last_checkpoint_naming_a_checkpoint_not_on_disk_is_damage(tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    for value in range(3):
        write_deltalake(path, pa.table({"x": [value]}), mode="append")
    deltalake.DeltaTable(path).create_checkpoint()
    (tmp_path / "table" / "_delta_log" / "00000000000000000002.checkpoint.parquet").unlink()

    assert [(d.version, d.kind) for d in read_log(path).damage] == [(2, "pointer")]


def _day(timestamp_ns: int) -> str:
    return datetime.fromtimestamp(timestamp_ns // 10**9, UTC).date().isoformat()


@pytest.mark.parametrize("damage", ["zeroed data file", "deleted data file", "newest commit cut in half"])
def test_an_ingestion_on_a_damaged_raw_log_fails_with_the_one_line(lake: Lake, damage: str) -> None:
    file = DAMAGE[damage](lake)
    write_landing(lake, "more.jsonl", NEW_EVENTS_ON_EVERY_DAY)  # the MERGE reads every day's file

    result = materialize(
        [landing_files, ingested_event_log], resources={"lakehouse": lakehouse_for(lake)}, raise_on_error=False
    )

    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error.cause
    assert error.cls_name == "DamagedTableError"
    [line] = error.message.strip().splitlines()
    assert_names_the_damage(line.removeprefix("databuild_assets.runtime.damage.DamagedTableError: "), lake, file)


def test_a_compaction_on_a_damaged_raw_log_fails_with_the_one_line(lake: Lake) -> None:
    file = DAMAGE["newest commit cut in half"](lake)

    result = compaction_job.execute_in_process(resources={"lakehouse": lakehouse_for(lake)}, raise_on_error=False)

    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error.cause
    assert (failure.step_key, error.cls_name) == ("compact_lake", "DamagedTableError")
    [line] = error.message.strip().splitlines()
    assert_names_the_damage(line.removeprefix("databuild_assets.runtime.damage.DamagedTableError: "), lake, file)


def test_the_sensors_skip_naming_a_raw_log_commit_that_does_not_parse(lake: Lake) -> None:
    file = cut_the_newest_commit_in_half(lake)
    write_landing(lake, "more.jsonl", NEW_EVENTS_ON_EVERY_DAY)
    resources = {"lakehouse": lakehouse_for(lake)}

    landing = evaluate_sensor(landing_files_sensor, resources=resources)
    commits = evaluate_sensor(event_log_commits_sensor, instance=DagsterInstance.ephemeral(), resources=resources)

    for skipped in (landing, commits):
        assert isinstance(skipped, SkipReason), skipped
        assert_names_the_damage(skipped.skip_message, lake, file)


def test_a_gap_delta_saw_only_while_commits_were_written_retries_the_step(lake: Lake) -> None:
    # A folder read while appends write commits can return commit N+1 and miss N (ext4 lists a
    # large folder in hash order): Delta then fails DELTA_VERSIONS_NOT_CONTIGUOUS on a log that
    # has no gap. The step is retried; a log that still has the gap is damage (the cases above).
    more = list(generate_events(100, seed=51))
    with DeltaRsEventLog(lake) as log:  # commits past a checkpoint of the appends' (as in a service)
        for start in range(0, 100, 5):
            log.append_events(more[start : start + 5])
    path = _raw_log(lake)
    newest = deltalake.DeltaTable(str(path)).version()
    assert read_log(str(path)).checkpoint < newest - 1
    commit = path / "_delta_log" / f"{newest - 1:020d}.json"
    attempts: list[int] = []

    @op
    @reports_damage
    def count_events(context, lakehouse: LakehouseResource) -> int:
        attempts.append(context.retry_number)
        if context.retry_number == 0:  # the listing misses a commit that is there before and after
            commit.rename(commit.with_suffix(".aside"))
            try:
                return lakehouse.spark_session.read.format("delta").load(str(path)).count()
            finally:
                commit.with_suffix(".aside").rename(commit)
        return lakehouse.spark_session.read.format("delta").load(str(path)).count()

    @job
    def count_job():
        count_events()

    result = count_job.execute_in_process(resources={"lakehouse": lakehouse_for(lake)}, raise_on_error=False)

    assert result.success, result.all_events
    assert attempts == [0, 1]
    assert result.output_for_node("count_events") == len(EVENTS) + len(more)
