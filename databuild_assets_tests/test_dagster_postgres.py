"""Dagster's instance storage in a real PostgreSQL server (dagster-postgres): the project's jobs run
on it, and erasure reaches it: after compaction no erased value is readable through SQL or left in
the server's data folder (old row versions and WAL segments included), and the erasure report
passes; the obvious `postgresql://` URL is refused with what to write."""

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, job, op

from databuild_assets.maintenance.dagster_home import ERASED, scrub_dagster_home
from databuild_assets.maintenance.tombstones import Tombstone
from databuild_assets_tests.postgres_server import needs_postgres, postgres_server
from databuild_assets_tests.support import (
    REPO_ROOT,
    one_partition_build,
    op_output_metadata,
    project_job,
    write_landing,
)

pytestmark = needs_postgres

# Not ASCII, so serialized JSON holds it escaped (Zo\u00eb) while a log line holds it as UTF-8.
REF, OTHER = "data/users/name=Zoë", "data/sales/date=2025-11-18"
STEM = b"data/users/name=Zo"  # every stored form of REF starts with this
CONTEXT = 16


@pytest.fixture
def postgres():
    with postgres_server() as server:
        yield server


@pytest.fixture
def instance(tmp_path, postgres, monkeypatch):
    """A DAGSTER_HOME whose dagster.yaml is this repo's with storage in the test's server."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    settings = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    settings["storage"] = postgres.dagster_storage_config()
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        yield instance


def values_holding(postgres, stem: str, but_run: str | None = None) -> dict[str, int]:
    """Per table of Dagster's schema: rows whose text (every column, as Postgres prints the row)
    holds `stem`, but the runs row of `but_run`."""
    found = {}
    for (table,) in postgres.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"):
        [(count,)] = postgres.sql(
            f'SELECT count(*) FROM "{table}" t WHERE strpos(t::text, %s) > 0'
            + (" AND t::text NOT LIKE %s" if table == "runs" and but_run else ""),
            (stem, f"%{but_run}%") if table == "runs" and but_run else (stem,),
        )
        if count:
            found[table] = count
    return found


def bytes_holding(folder: Path, kept: list[bytes]) -> dict[str, int]:
    """Per file under the server's data folder: occurrences of STEM not inside a `kept` record."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data, at, count = path.read_bytes(), 0, 0
        while (at := data.find(STEM, at)) != -1:
            window = data[max(0, at - CONTEXT) : at + len(STEM) + CONTEXT]
            count += not any(window in record for record in kept)
            at += 1
        if count:
            found[str(path.relative_to(folder))] = count
    return found


# The erasure end to end through Dagster's jobs: `make test` proves it on SQLite storage
# (test_erasure_dagster_home.py) and the Postgres scrub on its own (below); `make deploy-test` runs it
# on Postgres through the daemon's queue. Here in the extended tier.
@pytest.mark.extended
def test_after_compaction_no_erased_value_is_readable_through_sql_or_left_in_the_data_folder_and_the_report_passes(
    spark, lake, postgres, instance
):
    bad = {  # quarantine's reason quotes the partition: a preview in the event log holds it
        "event_id": "e-bad",
        "timestamp": 1_763_424_000_000_000_000,
        "build_request_id": "br-zoe",
        "event_type": "build_request_event",
        "build_request_event": {"status_code": 1, "status_name": "BUILD_REQUEST_RECEIVED", "requested_partitions": REF},
    }
    events = one_partition_build("br-zoe", REF, 0) + one_partition_build("br-other", OTHER, 10) + [bad]
    write_landing(lake, "builds.jsonl", [json.dumps(event, ensure_ascii=False) for event in events])
    assert project_job(lake, "ingest_and_refresh_job").execute_in_process(instance=instance).success
    request = {"key": "partition_ref", "value": REF, "actor": "alice@example.com", "reason": "ticket 31"}
    erase = project_job(lake, "erase_job").execute_in_process(
        run_config={"ops": {"tombstones": {"config": request}}}, instance=instance
    )
    [(kept,)] = postgres.sql("SELECT run_body FROM runs WHERE run_id = %s", (erase.run_id,))
    # The quarantine's preview. Its event record is long, so PostgreSQL stores it compressed: no
    # byte search of the data folder sees it (the next test's short records, it does).
    assert values_holding(postgres, "data/users/name=Zo", but_run=erase.run_id) != {}

    compaction = project_job(lake, "compaction_job").execute_in_process(instance=instance)

    scrubbed = op_output_metadata(compaction, "scrub_dagster_home_after_compaction")
    assert scrubbed["storage_not_scrubbed"] == "(none)" and scrubbed["postgres_not_reclaimed"] == "(none)"
    assert scrubbed["records_rewritten"] > 0 and scrubbed["occurrences_left"] == 0
    assert values_holding(postgres, "data/users/name=Zo", but_run=erase.run_id) == {}
    assert postgres.sql("SELECT run_body FROM runs WHERE run_id = %s", (erase.run_id,)) == [(kept,)]
    postgres.checkpoint()
    assert bytes_holding(postgres.data_folder, [kept.encode()]) == {}
    # The lake's old files go too (vacuum, retention shortened as an operator may), then the proof.
    short = {"ops": {"vacuum_tables": {"config": {"retention_hours": 0, "allow_short_retention": True}}}}
    assert project_job(lake, "vacuum_job").execute_in_process(run_config=short, instance=instance).success
    report = project_job(lake, "erasure_report_job").execute_in_process(instance=instance, raise_on_error=False)
    assert report.success
    text = op_output_metadata(report, "report_erasure")["report"]
    assert "WAL archives, base backups" in text  # what no scan on the server reaches, said plainly


@op
def build_partition(context):
    context.log.info(f"built {REF}")


@job
def build_job():
    build_partition()


def test_the_scrub_rewrites_tags_and_log_lines_in_postgres_and_leaves_no_old_row_version_or_wal_segment(
    postgres, instance
):
    runs = [build_job.execute_in_process(instance=instance, tags={"subject": REF}) for _ in range(3)]
    # A run deleted as the UI deletes one: its rows go, their versions stay on disk until a VACUUM FULL.
    instance.delete_run(runs[0].run_id)
    postgres.sql("ANALYZE")  # pg_statistic samples the tags' values
    postgres.checkpoint()
    assert {"run_tags", "event_logs"} <= values_holding(postgres, "data/users/name=Zo").keys()
    tombstone = Tombstone("t-1", "partition_ref", REF, "alice", "ticket 31", datetime.now(UTC))

    result = scrub_dagster_home(instance, [tombstone])

    assert result.not_scrubbed == () and result.not_reclaimed == ()
    assert result.remaining is not None and result.remaining.total == 0
    assert values_holding(postgres, "data/users/name=Zo") == {}
    postgres.checkpoint()
    assert bytes_holding(postgres.data_folder, []) == {}
    for run in runs[1:]:  # each record still reads, with the marker where the value was
        assert instance.get_run_by_id(run.run_id).tags["subject"] == ERASED
        assert f"built {ERASED}" in [event.user_message for event in instance.all_logs(run.run_id)]


def test_a_postgres_url_that_sqlalchemy_gives_to_psycopg_3_is_refused_with_what_to_write(tmp_path, postgres):
    home = tmp_path / "dagster_home"
    home.mkdir()
    url = postgres.url.replace("postgresql+psycopg2://", "postgresql://")
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"postgres": {"postgres_url": url}}}))
    loaded = subprocess.run(
        [sys.executable, "-c", "import databuild_assets.definitions"],
        env={"DAGSTER_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert loaded.returncode != 0
    [line] = [line for line in loaded.stderr.splitlines() if "postgresql+psycopg2://" in line]
    assert str(home / "dagster.yaml") in line and postgres.password not in loaded.stderr
