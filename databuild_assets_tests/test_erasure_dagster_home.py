"""Erasure through Dagster's own storage: after compaction no file under DAGSTER_HOME holds an
erased value, but the erase request's own run record; the records stay readable."""

import json
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
from databuild_assets.maintenance.dagster_sqlite import rewrite_stored_text
from databuild_assets.maintenance.erasure_report import DAGSTER_HOME_FINDING, dagster_home_findings
from databuild_assets.maintenance.tombstones import Tombstone, read_tombstones
from databuild_assets_tests.support import (
    REPO_ROOT,
    one_partition_build,
    op_output_metadata,
    project_job,
    write_landing,
)

# A partition named after a person: not ASCII, so serialized JSON holds it escaped (Zo\u00eb,
# and Zo\\u00eb inside a JSON text) while a log line holds it as UTF-8.
REF, OTHER = "data/users/name=Zoë", "data/sales/date=2025-11-18"
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


def stored_run_body(home: Path, run_id: str) -> bytes:
    with closing(sqlite3.connect(home / "history" / "runs.db")) as connection:
        [(body,)] = connection.execute("SELECT run_body FROM runs WHERE run_id = ?", (run_id,)).fetchall()
    return body.encode("utf-8")


def test_after_compaction_no_file_under_dagster_home_holds_an_erased_value_but_the_erase_request_run(
    spark, lake, dagster_home
):
    instance, home = dagster_home, Path(dagster_home.root_directory)
    # A bad line quotes the partition in a field of the wrong type: quarantine's reason names it.
    bad = {
        "event_id": "e-bad",
        "timestamp": 1_763_424_000_000_000_000,
        "build_request_id": "br-zoe",
        "event_type": "build_request_event",
        "build_request_event": {"status_code": 1, "status_name": "BUILD_REQUEST_RECEIVED", "requested_partitions": REF},
    }
    events = one_partition_build("br-zoe", REF, 0) + one_partition_build("br-other", OTHER, 10) + [bad]
    write_landing(lake, "builds.jsonl", [json.dumps(event, ensure_ascii=False) for event in events])

    ingest = project_job(lake, "ingest_and_refresh_job").execute_in_process(instance=instance)
    # Previews show no column a tombstone can name: of this run's materializations, only the
    # quarantine's holds the partition, in a reason.
    previews = {
        event.asset_key.to_user_string(): [
            value
            for record in event.materialization.metadata["preview"].value.records
            for value in record.data.values()
        ]
        for event in ingest.get_asset_materialization_events()
        if "preview" in event.materialization.metadata
    }
    assert {"raw_event_log", "partition_state", "job_runs", "build_requests"} < previews.keys()
    assert {asset for asset, values in previews.items() if any(STEM.decode() in (v or "") for v in values)} == {
        "event_quarantine"
    }
    request = {"key": "partition_ref", "value": REF, "actor": "alice@example.com", "reason": "ticket 31"}
    erase = project_job(lake, "erase_job").execute_in_process(
        run_config={"ops": {"tombstones": {"config": request}}}, instance=instance
    )
    kept = [stored_run_body(home, erase.run_id)]
    assert STEM in kept[0]  # the request keeps its value, as the tombstones table does
    assert occurrences_outside(home, kept) != {}  # the quarantine's preview, in the ingest run

    compaction = project_job(lake, "compaction_job").execute_in_process(instance=instance)

    assert occurrences_outside(home, kept) == {}
    assert stored_run_body(home, erase.run_id) == kept[0]
    scrubbed = op_output_metadata(compaction, "scrub_dagster_home_after_compaction")
    assert scrubbed["records_rewritten"] > 0 and scrubbed["occurrences_left"] == 0
    # The records still read: the quarantine's preview now says what was there.
    [quarantine] = [
        event.dagster_event.step_materialization_data.materialization.metadata["preview"].value
        for event in instance.all_logs(ingest.run_id)
        if event.dagster_event and event.dagster_event.is_step_materialization
        if event.dagster_event.asset_key.to_user_string() == "event_quarantine"
    ]
    assert [record.data["reason"] for record in quarantine.records] == [
        f'build_request_event.requested_partitions must be an array of strings, got string "{ERASED}"'
    ]
    [finding] = dagster_home_findings(instance, read_tombstones(spark, lake))  # the erasure report's row
    assert (finding.table, finding.key, finding.rows_in_data_files) == (DAGSTER_HOME_FINDING, "partition_ref", 0)
    assert finding.data_files_scanned > 10


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


def test_a_dagster_database_is_scrubbed_of_thousands_of_values_at_once(tmp_path):
    # One OR per value in one statement is past SQLite's expression depth (1,000).
    database = tmp_path / "runs.db"
    with closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("CREATE TABLE run_tags (run_id TEXT, key TEXT, value TEXT)")
        connection.executemany(
            "INSERT INTO run_tags VALUES (?, 'ref', ?)", [(f"r{i}", f"data/users/id={i}") for i in range(0, 3000, 7)]
        )
    holding = tuple(f"data/users/id={i}" for i in range(3000))

    changed = rewrite_stored_text(database, holding, lambda table, run_id, text: ERASED)

    assert changed == len(range(0, 3000, 7))
    with closing(sqlite3.connect(database)) as connection:
        assert {value for (value,) in connection.execute("SELECT value FROM run_tags")} == {ERASED}
