"""An erasure erases only what it names (issue 42): erase_job, which anyone who reaches the UI can
launch, refuses a value that would match more than the field it names (short, another field's
value, inside stored values) with one line, unless allow_ambiguous is set; the tombstone records
the override, and text is then matched by whole tokens only, so Dagster's records and quarantined
lines holding the value inside a longer word stay as they are."""

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance, job, op

import databuild_assets.maintenance.tombstones as tombstones_module
from databuild_assets.maintenance.dagster_home import ERASED, scan_dagster_home, scrub_dagster_home
from databuild_assets.maintenance.erasure_report import file_streams, lines_holding
from databuild_assets.maintenance.tombstones import TombstoneError, read_tombstones, validate_request
from databuild_assets_tests.support import (
    REPO_ROOT,
    one_partition_build,
    op_output_metadata,
    project_job,
    write_landing,
)

REF = "data/users/id=42"


@pytest.fixture
def dagster_home(tmp_path, monkeypatch) -> DagsterInstance:
    """A real DAGSTER_HOME with this repo's dagster.yaml, as the Makefile sets one up."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        yield instance


def erase(lake, instance, value: str, key: str = "partition_ref", **more):
    request = {"key": key, "value": value, "actor": "mallory", "reason": "ticket 42", **more}
    return project_job(lake, "erase_job").execute_in_process(
        run_config={"ops": {"tombstones": {"config": request}}}, instance=instance, raise_on_error=False
    )


def refusal(run) -> str:
    """The message of the tombstones step's failure: what the launchpad shows."""
    assert not run.success
    [failure] = [event for event in run.get_step_failure_events() if event.step_key == "tombstones"]
    error = failure.step_failure_data.error
    while error.cause is not None:  # Dagster wraps the op's own error
        error = error.cause
    return error.message.strip()


def ingest(lake, instance, events, job="ingest_and_refresh_job", tags=None):
    write_landing(lake, "builds.jsonl", [json.dumps(event) for event in events])
    run = project_job(lake, job).execute_in_process(instance=instance, tags=tags or {})
    assert run.success
    return run


def test_erase_job_refuses_a_short_value_with_one_line_and_writes_no_tombstone(spark, lake, dagster_home):
    message = refusal(erase(lake, dagster_home, "zoe-42"))

    assert "\n" not in message
    assert "partition_ref 'zoe-42' is shorter than 8 characters" in message
    assert "set allow_ambiguous: true" in message
    assert read_tombstones(spark, lake) == []


@pytest.mark.parametrize("allow_ambiguous", [False, True])
def test_erase_job_refuses_a_value_under_four_characters_even_with_allow_ambiguous(
    spark, lake, dagster_home, allow_ambiguous
):
    # Its copies in Dagster's binary files cannot be told from chance bytes: its erasure could
    # never be proven, so no override takes it.
    message = refusal(erase(lake, dagster_home, "e", allow_ambiguous=allow_ambiguous))

    assert "\n" not in message
    assert "partition_ref 'e' is shorter than 4 characters, which allow_ambiguous cannot override" in message
    assert "chance bytes" in message
    assert read_tombstones(spark, lake) == []


@pytest.mark.parametrize(
    "key, value, why",
    [
        ("partition_ref", "ingest_job", "is a Dagster job's name"),
        ("partition_ref", "JOB_COMPLETED", "is a JobStatus name"),
        ("job_run_id", "partition_invalidation_event", "is an event_type"),
        ("build_request_id", "raw_event_log", "is a Dagster asset's name"),
    ],
)
def test_erase_job_refuses_a_value_that_is_a_name_or_status_of_another_field(
    spark, lake, dagster_home, key, value, why
):
    ingest(lake, dagster_home, [], job="ingest_job")  # Dagster's storage holds a run of ingest_job
    message = refusal(erase(lake, dagster_home, value, key=key))

    assert "\n" not in message
    assert f"{key} {value!r} {why}" in message and "allow_ambiguous" in message
    assert read_tombstones(spark, lake) == []


def test_erase_job_refuses_a_value_that_is_another_fields_stored_value_or_inside_a_stored_value(
    spark, lake, dagster_home
):
    ingest(lake, dagster_home, one_partition_build("br-users-42", REF, 0))  # job run br-users-42-job

    as_ref = refusal(erase(lake, dagster_home, "br-users-42-job"))
    prefix = refusal(erase(lake, dagster_home, "data/users/id=4"))
    labelled = refusal(erase(lake, dagster_home, "br-users-42", key="job_run_id"))

    assert "partition_ref 'br-users-42-job' is a stored job_run_id" in as_ref
    assert "partition_ref 'data/users/id=4' occurs inside 1 stored partition_ref values" in prefix
    assert "job_run_id 'br-users-42' is a stored build_request_id" in labelled
    assert "occurs inside" in labelled  # br-users-42-job, the job run's own id
    assert read_tombstones(spark, lake) == []
    assert erase(lake, dagster_home, REF).success  # the value itself is what the tombstone is for


def stored_run(home: Path, run_id: str) -> tuple[str, str]:
    with closing(sqlite3.connect(home / "history" / "runs.db")) as connection:
        [row] = connection.execute("SELECT pipeline_name, run_body FROM runs WHERE run_id = ?", (run_id,)).fetchall()
    return row


def test_with_allow_ambiguous_a_short_value_inside_job_names_is_erased_as_a_whole_value_and_compaction_proves_it(
    spark, lake, dagster_home
):
    instance, home = dagster_home, Path(dagster_home.root_directory)
    # A run of ingest_job tagged with the value itself: the tag's whole value is the value, and
    # `ingest` is inside every ingest_job and ingest_and_refresh_job of Dagster's records.
    run = ingest(
        lake, instance, one_partition_build("br-users-42", REF, 0), job="ingest_job", tags={"subject": "ingest"}
    )

    accepted = erase(lake, instance, "ingest", allow_ambiguous=True)

    assert accepted.success
    [tombstone] = read_tombstones(spark, lake)
    assert tombstone.value == "ingest" and tombstone.allow_ambiguous
    assert tombstone.reason.startswith("ticket 42 [allow_ambiguous: is shorter than 8 characters; occurs inside")

    compaction = project_job(lake, "compaction_job").execute_in_process(instance=instance)
    report = project_job(lake, "erasure_report_job").execute_in_process(instance=instance)

    assert compaction.success and report.success
    scrubbed = op_output_metadata(compaction, "scrub_dagster_home_after_compaction")
    assert scrubbed["occurrences_left"] == 0 and scrubbed["records_rewritten"] > 0
    # `ingest` inside words, left as it is.
    assert scrubbed["occurrences_inside_longer_words"] > 100
    assert op_output_metadata(report, "report_erasure")["rows_still_holding_values"] == 0
    stored = instance.get_run_by_id(run.run_id)
    assert stored.job_name == "ingest_job" and stored.tags["subject"] == ERASED
    name, body = stored_run(home, run.run_id)
    assert name == "ingest_job" and '"pipeline_name": "ingest_job"' in body and ERASED + "_job" not in body
    with closing(sqlite3.connect(home / "history" / "runs.db")) as connection:
        assert connection.execute("SELECT count(*) FROM run_tags WHERE value = 'ingest'").fetchone() == (0,)


@op
def tagged():
    pass


@job
def tagged_job():
    tagged()


def test_a_whole_tag_value_left_in_freed_space_is_found_and_the_scrub_rebuilds_the_file(dagster_home):
    instance, home = dagster_home, Path(dagster_home.root_directory)
    tagged_job.execute_in_process(instance=instance)
    # A tag written and removed by a writer whose SQLite keeps deleted bytes (most builds do):
    # the cell `ingest` stays in the freed space of run_tags' pages, beside `subject`.
    with closing(sqlite3.connect(home / "history" / "runs.db")) as connection, connection:
        connection.execute("PRAGMA secure_delete = OFF")
        connection.execute("INSERT INTO run_tags (run_id, key, value) VALUES ('r-1', 'subject', 'ingest')")
    with closing(sqlite3.connect(home / "history" / "runs.db")) as connection, connection:
        connection.execute("PRAGMA secure_delete = OFF")
        connection.execute("DELETE FROM run_tags WHERE run_id = 'r-1'")
    assert b"subjectingest" in (home / "history" / "runs.db").read_bytes() + _log_of(home)
    tombstone = tombstones_module.Tombstone(
        "t-1", "partition_ref", "ingest", "alice", "ticket 42 [allow_ambiguous: is shorter than 8 characters]", None
    )

    before = scan_dagster_home(instance, [tombstone])
    result = scrub_dagster_home(instance, [tombstone])

    assert before is not None and before.occurrences["t-1"] >= 1  # not taken for a part of `subjectingest`
    assert any(path.endswith("runs.db") for path in result.databases_rebuilt)
    assert result.remaining is not None and result.remaining.total == 0
    assert b"ingest" not in (home / "history" / "runs.db").read_bytes() + _log_of(home)


def _log_of(home: Path) -> bytes:
    wal = home / "history" / "runs.db-wal"
    return wal.read_bytes() if wal.exists() else b""


def test_a_value_accepted_with_allow_ambiguous_matches_quarantined_and_landing_lines_only_as_a_whole_token(spark):
    tombstone = tombstones_module.Tombstone(
        "t-1", "partition_ref", "e", "alice", "ticket 42 [allow_ambiguous: is shorter than 8 characters]", None
    )
    lines = [
        "ingest_job failed: not JSON",  # e inside words only
        '{"event_id": "e", "event_type": 3}',  # the value as a whole JSON string
        "partition e failed",  # a word of the text
    ]
    frame = spark.createDataFrame([(line,) for line in lines], "line string")

    matched = [row.line for row in tombstones_module.lines_mentioning(frame, "line", [tombstone]).collect()]
    mentions = tombstones_module.line_matcher([tombstone])  # the landing erasure's rule, without Spark

    assert sorted(matched) == sorted(lines[1:])
    assert [mentions(line) for line in lines] == [False, True, True]


def test_a_reason_that_spells_the_override_marker_is_refused():
    # Tombstone.allow_ambiguous reads the marker from the reason: typed there by hand it would turn
    # whole-token matching on (substring copies left in text) without the request's flag.
    with pytest.raises(TombstoneError, match=r"reason holds '\[allow_ambiguous', which only allow_ambiguous may"):
        validate_request("partition_ref", "data/users/id=42", "alice", "GDPR #1 [allow_ambiguous: none]")
    validate_request("partition_ref", "data/users/id=42", "alice", "GDPR #1")


def test_the_report_reads_a_published_snapshots_frames_as_one_stream_where_a_value_may_span_two(spark, tmp_path):
    folder = tmp_path / "serving_index" / "snapshots" / ("index-" + "a" * 32)
    folder.mkdir(parents=True)
    value = b"br-erased-0123456789"
    for number, part in enumerate((b"x" * 100 + value[:7], value[7:] + b"\n")):  # split across frames
        (folder / f"{number:05d}.sqlite.zst").write_bytes(pa.Codec("zstd").compress(part, asbytes=True))
    streams = list(file_streams(spark, [f"file:{path}" for path in sorted(folder.iterdir())]))
    assert len(streams) == 1
    assert lines_holding(streams[0], {"erased": (value,)}) == {"erased": 1}
