"""Erasure through Dagster's own storage: the scrub leaves no file under DAGSTER_HOME holding an
erased value; the records stay readable."""

import shutil
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import (
    AssetMaterialization,
    Config,
    DagsterInstance,
    MetadataValue,
    Output,
    TableColumn,
    TableRecord,
    TableSchema,
    job,
    op,
)

from databuild_assets.maintenance.dagster_home import ERASED, scrub_dagster_home
from databuild_assets.maintenance.tombstones import Tombstone
from databuild_assets_tests.support import REPO_ROOT

# A partition named after a person: not ASCII, so serialized JSON holds it escaped (Zo\u00eb,
# and Zo\\u00eb inside a JSON text) while a log line holds it as UTF-8.
REF = "data/users/name=Zoë"
# Every form of REF (itself, JSON-escaped once or twice) starts with this: what the scan looks for.
STEM = b"data/users/name=Zo"
CONTEXT = 16  # bytes each side of an occurrence that must match the kept record to be part of it


@pytest.fixture
def dagster_home(tmp_path, monkeypatch) -> DagsterInstance:
    """A real DAGSTER_HOME with this repo's dagster.yaml, as the Makefile sets one up."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        yield instance


def occurrences_outside(home: Path, kept: list[bytes]) -> dict[str, int]:
    """Per file under `home` (relative path): occurrences of STEM that are not inside one of the
    `kept` records (the same bytes around them), reading every byte of every file."""
    found = {}
    for path in sorted(p for p in home.rglob("*") if p.is_file()):
        data, at, count = path.read_bytes(), 0, 0
        while (at := data.find(STEM, at)) != -1:
            window = data[max(0, at - CONTEXT) : at + len(STEM) + CONTEXT]
            count += not any(window in record for record in kept)
            at += 1
        if count:
            found[str(path.relative_to(home))] = count
    return found


def delete_events_leaving_their_bytes(home: Path, run_id: str) -> None:
    """What `DagsterInstance.delete_run` does to the event index, on a SQLite built without
    SECURE_DELETE, as most are (Debian's zeroes deleted bytes): the rows go, their bytes stay."""
    with closing(sqlite3.connect(home / "history" / "runs" / "index.db")) as connection:
        connection.execute("PRAGMA secure_delete = OFF")
        connection.execute("DELETE FROM event_logs WHERE run_id = ?", (run_id,))
        connection.commit()


class BuildConfig(Config):
    rows: int = 1  # rows in the preview


@op
def build_partition(context, config: BuildConfig):
    print(f"building {REF}")  # stdout: the run's compute log
    context.log.info(f"built {REF}")  # the event log, and stderr
    schema = TableSchema(columns=[TableColumn("partition_ref", "string")])
    # A preview as an earlier release wrote it: the key column included.
    records = [TableRecord({"partition_ref": REF}) for _ in range(config.rows)]
    preview = MetadataValue.table(records=records, schema=schema)
    yield AssetMaterialization("partitions", metadata={"preview": preview})
    yield Output(None)


@job
def build_job():
    build_partition()


def test_the_scrub_rewrites_previews_log_lines_tags_and_compute_logs_and_leaves_no_freed_copy(dagster_home):
    instance, home = dagster_home, Path(dagster_home.root_directory)
    # A reader holding the event index open (the webserver does) keeps its write-ahead log on disk.
    reader = sqlite3.connect(home / "history" / "runs" / "index.db")
    reader.execute("SELECT count(*) FROM sqlite_master").fetchall()
    try:
        runs = [
            build_job.execute_in_process(
                run_config={"ops": {"build_partition": {"config": {"rows": rows}}}},
                instance=instance,
                tags={"subject": REF},
            )
            for rows in (1, 2, 3)
        ]
        # Deleted as the UI deletes a run: its rows go, their bytes stay in the files' free space
        # (and its compute logs on disk), where no query reaches them.
        delete_events_leaving_their_bytes(home, runs[0].run_id)
        instance.delete_run(runs[0].run_id)
        before = occurrences_outside(home, [])
        assert {"history/runs/index.db-wal", "history/runs.db"} <= before.keys()
        tombstone = Tombstone("t-1", "partition_ref", REF, "alice", "ticket 31", datetime.now(UTC))

        result = scrub_dagster_home(instance, [tombstone])

        assert occurrences_outside(home, []) == {}
        assert result.remaining is not None and result.remaining.total == 0
        assert len(result.compute_logs_rewritten) == 6  # stdout and stderr of each run, the deleted one's too
        assert [Path(path).name for path in result.databases_rebuilt] == ["index.db"]
    finally:
        reader.close()
    for run in runs[1:]:  # each record still reads, with the marker where the value was
        assert instance.get_run_by_id(run.run_id).tags["subject"] == ERASED
        events = instance.all_logs(run.run_id)
        assert f"built {ERASED}" in [event.user_message for event in events]
        [preview] = [
            event.dagster_event.step_materialization_data.materialization.metadata["preview"].value
            for event in events
            if event.dagster_event and event.dagster_event.is_step_materialization
        ]
        assert {record.data["partition_ref"] for record in preview.records} == {ERASED}
    logs = {Path(path).suffix: Path(path).read_text() for path in result.compute_logs_rewritten}
    assert f"building {ERASED}" in logs[".out"] and f"built {ERASED}" in logs[".err"]
