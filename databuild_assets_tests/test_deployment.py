"""Dagster as teams deploy it: the code location served by `dagster code-server start`, and
`dagster-daemon run` and `dagster-webserver` as processes of their own that load it from there
(workspace.yaml's grpc_server), runs launched as processes through the run queue, started with a
service's umask (docs/deployment.md).

The tests follow one day of service in order, on one deployment: the webserver lists the code
location and its assets; a landing file is ingested by a run the daemon launched from the
landing sensor's tick; a commit appended outside Dagster reaches the projections through the
event-log sensor's run; an erasure submitted to the webserver waits in the daemon's queue, then
hides the value; the compaction schedule's tick purges it from every table and landing file.
Last, the lake holds every event once, every run succeeded, all on one warm Spark driver, and no
file the processes wrote is readable by others.

Minutes (several runs, a JVM), so skipped by default: `make deploy-test` (DATABUILD_DEPLOY_TEST=1).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from databuild_assets.definitions import defs
from databuild_assets.maintenance.dagster_postgres import DATA_FOLDER_SETTING
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES, Lake, TableSpec
from databuild_assets.runtime.warm_driver import running_hosts
from databuild_assets_tests.dagster_deployment import LOCATION, DagsterDeployment
from databuild_assets_tests.postgres_server import UNAVAILABLE_REASON, postgres_server
from databuild_assets_tests.support import AppenderProcess, one_partition_build, write_landing

pytestmark = pytest.mark.deploy

DEPLOY_TEST_COMMAND = "make deploy-test"
if os.environ.get("DATABUILD_DEPLOY_TEST") != "1":
    pytest.skip(
        "the deployment test (a code server, the daemon and the webserver as processes; minutes) runs only "
        f"with DATABUILD_DEPLOY_TEST=1: run `{DEPLOY_TEST_COMMAND}`",
        allow_module_level=True,
    )

RUN_TIMEOUT_S = 600  # a run starts a process, the first one a JVM; the machine is shared
ERASED = "data/users/name=Zoë"  # not ASCII: stored escaped in JSON, as UTF-8 elsewhere
KEPT = "data/sales/date=2025-11-18"
APPENDED = "data/orders/id=7"
LANDED_EVENTS = one_partition_build("br-zoe", ERASED, 0) + one_partition_build("br-sales", KEPT, 10)
APPENDED_EVENTS = one_partition_build("br-orders", APPENDED, 20)
TOMBSTONE = {"key": "partition_ref", "value": ERASED, "actor": "alice@example.com", "reason": "ticket 43"}


@pytest.fixture(scope="module")
def postgres():
    if UNAVAILABLE_REASON is not None:
        pytest.skip(f"{UNAVAILABLE_REASON} (`{DEPLOY_TEST_COMMAND}` installs Debian's postgresql)")
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, postgres):
    """The three processes over an instance whose storage is in PostgreSQL, as deployed."""
    workdir = tmp_path_factory.mktemp("deployment")
    started = time.monotonic()
    settings = {
        # The compaction schedule ticks every minute once the test starts it (it is stopped till then).
        "DATABUILD_COMPACTION_CRON": "* * * * *",
        # The erasure report reads the server's data folder (the test runs where the server does).
        DATA_FOLDER_SETTING: str(postgres.data_folder),
    }
    with DagsterDeployment(workdir, storage=postgres.dagster_storage_config(), settings=settings) as running:
        startup = ", ".join(f"{name} {s.ready_after_s:.1f} s" for name, s in running.services.items())
        print(f"\ndeployment ready in {time.monotonic() - started:.1f} s ({startup}); logs in {workdir}")
        # Compaction is driven by its schedule later: stopped until then, as an operator would.
        running.stop_schedule("compaction_schedule")
        yield running
    print(f"\ndeployment test: {time.monotonic() - started:.0f} s from the first process's start to the last's stop")


@pytest.fixture(scope="module")
def lake(deployment) -> Lake:
    return Lake(str(deployment.lake_root))


def rows(lake: Lake, table: TableSpec | str) -> list[dict]:
    """A table's rows at its current version, read by delta-rs (no JVM in the test process)."""
    name = table if isinstance(table, str) else table.name
    return DeltaTable(lake.path("tables", name)).to_pyarrow_table().to_pylist()


def holds(row: dict, value: str) -> bool:
    return value in json.dumps(row, ensure_ascii=False, default=str)


def tag(run: dict, key: str) -> str | None:
    return next((t["value"] for t in run["tags"] if t["key"] == key), None)


def finished(deployment: DagsterDeployment, run: dict) -> dict:
    """`run` once it ended; it must have succeeded (else its event log is the message)."""
    done = deployment.wait_for_run(run["runId"], timeout=RUN_TIMEOUT_S)
    assert done["status"] == "SUCCESS", f"{done['jobName']} {done['status']}:\n{deployment.run_log(done['runId'])}"
    return done


def idle(deployment: DagsterDeployment, timeout: float = RUN_TIMEOUT_S) -> list[dict]:
    """Every run, once none is queued or in progress (a sensor's request may still follow a run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = deployment.runs()
        if all(run["status"] in ("SUCCESS", "FAILURE", "CANCELED") for run in runs):
            return runs
        time.sleep(2)
    raise AssertionError(f"runs still in progress after {timeout:.0f} s: {deployment.runs()}\n{deployment.logs()}")


def test_the_webserver_lists_the_code_location_served_by_the_code_server_and_its_assets(deployment):
    [entry] = deployment.location_entries()
    assert (entry["name"], entry["loadStatus"]) == (LOCATION, "LOADED")
    listed = deployment.graphql("{ assetNodes { assetKey { path } } }")["assetNodes"]
    expected = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"/".join(node["assetKey"]["path"]) for node in listed} == expected
    instance = deployment.graphql(
        "{ instance { info runLauncher { name } runQueuingSupported runQueueConfig { maxConcurrentRuns } } }"
    )["instance"]
    info = instance.pop("info")
    assert "PostgresRunStorage" in info and "PostgresEventLogStorage" in info and "PostgresScheduleStorage" in info
    # Runs are processes the code server starts, one at a time, from the daemon's queue.
    assert instance == {
        "runLauncher": {"name": "DefaultRunLauncher"},
        "runQueuingSupported": True,
        "runQueueConfig": {"maxConcurrentRuns": 1},
    }


def test_a_landing_file_is_ingested_by_a_run_the_daemon_launched_from_the_landing_sensor(deployment, lake):
    write_landing(lake, "builds.jsonl", [json.dumps(e, ensure_ascii=False) for e in LANDED_EVENTS])
    assert deployment.start_sensor("landing_files_sensor") == "RUNNING"
    assert deployment.start_sensor("event_log_commits_sensor") == "RUNNING"

    [run] = deployment.wait_for_runs("ingest_and_refresh_job", 1)
    run = finished(deployment, run)

    assert tag(run, "dagster/sensor_name") == "landing_files_sensor"
    assert sorted(r["event_id"] for r in rows(lake, RAW_EVENT_LOG)) == sorted(e["event_id"] for e in LANDED_EVENTS)
    assert {r["partition_ref"] for r in rows(lake, "partition_state")} >= {ERASED, KEPT}
    # The tick's cursor was stored: later ticks see the same folder and request nothing more.
    assert deployment.sensor_cursor("landing_files_sensor")
    idle(deployment)
    assert len(deployment.runs("ingest_and_refresh_job")) == 1


def test_a_commit_appended_outside_dagster_reaches_the_projections_through_the_event_log_sensor(
    deployment, lake, tmp_path
):
    report = AppenderProcess.start(lake, [APPENDED_EVENTS], tmp_path, "appender").report()
    assert report["accepted"] == len(APPENDED_EVENTS)

    [run] = deployment.wait_for_runs("refresh_projections_job", 1)
    run = finished(deployment, run)

    assert tag(run, "dagster/sensor_name") == "event_log_commits_sensor"
    assert APPENDED in {r["partition_ref"] for r in rows(lake, "partition_state")}
    assert any(holds(r, APPENDED) for r in rows(lake, FILTERED_EVENT_LOG))
    assert deployment.sensor_cursor("event_log_commits_sensor")


def test_an_erasure_submitted_to_the_webserver_waits_in_the_daemons_queue_then_hides_the_value(deployment, lake):
    idle(deployment)
    run_id = deployment.launch_run("erase_job", {"ops": {"tombstones": {"config": TOMBSTONE}}})
    run = finished(deployment, {"runId": run_id})

    events = deployment.graphql(
        """query ($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events { __typename
             ... on MessageEvent { timestamp } } } } }""",
        {"id": run_id},
    )["logsForRun"]["events"]
    kinds = [e["__typename"] for e in events]
    # Queued by the run coordinator (the webserver launched nothing), then taken off the queue by
    # the daemon, which reports the run starting and hands it to the code server's process.
    assert kinds.index("RunEnqueuedEvent") < kinds.index("RunStartingEvent") < kinds.index("RunStartEvent")
    dequeued = next(float(e["timestamp"]) / 1000 for e in events if e["__typename"] == "RunStartingEvent")
    print(
        f"\nerase_job through the queue: dequeued {dequeued - run['creationTime']:.1f} s after its creation, "
        f"its process started {run['startTime'] - run['creationTime']:.1f} s, "
        f"ended {run['endTime'] - run['creationTime']:.1f} s"
    )
    assert [r["value"] for r in rows(lake, TOMBSTONES)] == [ERASED]
    assert not any(holds(r, ERASED) for r in rows(lake, FILTERED_EVENT_LOG))
    assert ERASED not in {r["partition_ref"] for r in rows(lake, "partition_state")}


def test_the_compaction_schedules_tick_purges_the_erased_value_from_every_table_and_landing_file(deployment, lake):
    idle(deployment)
    assert any(holds(r, ERASED) for r in rows(lake, RAW_EVENT_LOG))  # until compaction purges it
    deployment.start_schedule("compaction_schedule")  # DATABUILD_COMPACTION_CRON: every minute
    try:
        [run] = deployment.wait_for_runs("compaction_job", 1, timeout=180)
    finally:
        deployment.stop_schedule("compaction_schedule")
    run = finished(deployment, run)

    assert tag(run, "dagster/schedule_name") == "compaction_schedule"
    assert [t["status"] for t in deployment.schedule_state("compaction_schedule")["ticks"]] == ["SUCCESS"]
    for table in (RAW_EVENT_LOG, FILTERED_EVENT_LOG, "partition_state", "job_runs", "build_requests"):
        assert not any(holds(r, ERASED) for r in rows(lake, table)), f"{table} still holds {ERASED}"
    landing = [p for p in Path(lake.root).glob("landing*/**/*") if p.is_file()]
    assert landing and not [p for p in landing if ERASED.encode() in p.read_bytes()]


def test_vacuum_and_the_erasure_report_launched_through_the_queue_find_the_value_nowhere(deployment, lake):
    idle(deployment)
    short = {"retention_hours": 0, "allow_short_retention": True}  # the purged files' old copies go now
    vacuum = deployment.launch_run("vacuum_job", {"ops": {"vacuum_tables": {"config": short}}})
    finished(deployment, {"runId": vacuum})
    # It scans every data file of the lake, and Dagster's storage: its tables and the server's data folder.
    report = deployment.launch_run("erasure_report_job")
    finished(deployment, {"runId": report})
    metadata = deployment.output_metadata(report, "report_erasure")
    print(f"\n{metadata['report']}")
    assert metadata["rows_still_holding_values"] == 0


def test_every_event_is_stored_once_every_run_succeeded_on_one_warm_driver_and_no_file_is_readable_by_others(
    deployment, lake
):
    runs = idle(deployment)

    stored = [r["event_id"] for r in rows(lake, RAW_EVENT_LOG)]
    kept = [e["event_id"] for e in LANDED_EVENTS + APPENDED_EVENTS if not holds(e, ERASED)]
    assert sorted(stored) == sorted(kept)
    assert {(r["jobName"], r["status"]) for r in runs} >= {
        ("ingest_and_refresh_job", "SUCCESS"),
        ("refresh_projections_job", "SUCCESS"),
        ("erase_job", "SUCCESS"),
        ("compaction_job", "SUCCESS"),
        ("vacuum_job", "SUCCESS"),
        ("erasure_report_job", "SUCCESS"),
    }
    assert [r for r in runs if r["status"] != "SUCCESS"] == []
    # The runs the code server launched attached to one driver, which outlives them.
    assert len(running_hosts(deployment.drivers_dir)) == 1
    readable = [
        str(path)
        for root in (deployment.dagster_home, Path(lake.root))
        for path in [root, *root.rglob("*")]
        if not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) & 0o077
    ]
    assert readable == []
    for run in sorted(runs, key=lambda r: r["creationTime"]):
        print(
            f"{run['jobName']}: started {run['startTime'] - run['creationTime']:.1f} s after its creation, "
            f"took {run['endTime'] - run['startTime']:.1f} s"
        )
