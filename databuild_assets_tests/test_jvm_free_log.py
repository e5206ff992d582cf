"""The JVM-free Delta backend as a live service uses it: read-your-writes within and across
processes, tombstones honoured from the very next read, appends that dedupe against the whole
log, real appender processes racing ingest_job and compaction_job on one lake, and the query
command line. (The shared query specification runs on it in test_event_log_queries.py, and the
parity property test in test_backend_parity.py.)"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import materialize

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.maintenance.jobs import compaction_job
from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log import AppendResult, SqliteEventLog, open_event_log
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import raw_log_rows, raw_log_schema
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.follower import DeltaFollower
from databuild_assets.log.serving.rows import event_rows
from databuild_assets.maintenance.compaction import bin_pack, compact, purge_events
from databuild_assets.maintenance.tombstones import read_tombstones, request_erasure
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_local import read_local_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets.workload.event_stream import DEFAULT_START_NS
from databuild_assets_tests import bel_cases
from databuild_assets_tests.bel_cases import BR, P, build_request_event, partition_event
from databuild_assets_tests.serving_support import data_files_named, data_files_on_disk, soon
from databuild_assets_tests.support import REPO_ROOT, AppenderProcess, lakehouse_for, log_uri


def _in_another_process(lake: Lake, code: str) -> str:
    script = f"from databuild_assets.log import open_event_log\nlog = open_event_log('delta://{lake.root}')\n{code}"
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_an_append_is_read_at_once_by_the_same_log_and_by_a_log_in_another_process(lake: Lake) -> None:
    with DeltaRsEventLog(lake) as log:
        log.append_event(partition_event("e1", 100, "br-1", "data/a", P.PARTITION_BUILDING))
        assert log.get_latest_partition_status("data/a").status == P.PARTITION_BUILDING

        printed = _in_another_process(
            lake,
            "print(log.get_latest_partition_status('data/a').status_name)\n"
            "log.append_event({'event_id': 'e2', 'timestamp': 200, 'build_request_id': 'br-1', "
            "'event_type': 'partition_event', 'partition_event': {'partition_ref': 'data/a', "
            "'status_code': 4, 'status_name': 'PARTITION_AVAILABLE'}})\n",
        )
        assert printed.split() == ["PARTITION_BUILDING"]
        # The other process's commit is seen by the very next read here.
        assert log.get_build_request_for_available_partition("data/a") == "br-1"
        assert bel_cases.ids(log.get_partition_events("data/a")) == ["e1", "e2"]


def _commit_from_elsewhere(lake: Lake, event: dict) -> None:
    """Commit `event` to the raw log as a writer on another machine does: without this
    machine's serving index knowing."""
    rows = raw_log_rows([(0, canonical_event(event))], "elsewhere")
    deltalake.write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")


def test_a_read_with_a_staleness_bound_may_lag_other_writers_but_never_its_own_appends(lake: Lake) -> None:
    # The bound a service on S3 reads with (decision 0041), here an hour on a local lake.
    with DeltaRsEventLog(lake) as first:
        first.append_event(partition_event("e0", 50, "br-1", "data/b", P.PARTITION_BUILDING))
    with DeltaRsEventLog(lake, max_staleness=3600) as log:
        _commit_from_elsewhere(lake, partition_event("e1", 100, "br-1", "data/a", P.PARTITION_BUILDING))
        assert log.get_latest_partition_status("data/a") is None  # checked at its open; an hour is not up
        assert log.known_event_ids(["e1"]) == {"e1"}  # what dedupes appends is never stale
        _commit_from_elsewhere(lake, partition_event("e2", 200, "br-1", "data/a", P.PARTITION_AVAILABLE))
        log.append_event(partition_event("e3", 300, "br-1", "data/b", P.PARTITION_AVAILABLE))
        # Its own append is read at once, with every commit before it.
        assert log.get_latest_partition_status("data/b").status == P.PARTITION_AVAILABLE
        assert log.get_latest_partition_status("data/a").status == P.PARTITION_AVAILABLE
        _commit_from_elsewhere(lake, partition_event("e4", 400, "br-1", "data/a", P.PARTITION_FAILED))
        assert log.get_latest_partition_status("data/a").status == P.PARTITION_AVAILABLE
        log.max_staleness = 0
        assert log.get_latest_partition_status("data/a").status == P.PARTITION_FAILED
    with pytest.raises(ValueError, match="max_staleness must be a number of seconds"):
        DeltaRsEventLog(lake, max_staleness=-1)


def test_a_tombstone_hides_its_events_from_the_next_read_and_a_purge_keeps_them_hidden(spark, lake: Lake) -> None:
    events = [
        build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a", "data/b"]),
        partition_event("e2", 110, "br-1", "data/a", P.PARTITION_AVAILABLE),
        partition_event("e3", 120, "br-1", "data/b", P.PARTITION_AVAILABLE),
    ]
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
        request_erasure(spark, lake, "partition_ref", "data/a", actor="alice", reason="ticket 9")

        # e1 lists data/a, e2 carries it: both hidden at once, and the projections forget data/a.
        assert bel_cases.ids(log.get_build_request_events("br-1")) == ["e3"]
        assert log.get_latest_partition_status("data/a") is None
        assert [p.partition_ref for p in log.list_recent_partitions()] == ["data/b"]
        # A hidden event is still in the log: appending it again is a duplicate, as on Spark.
        assert log.append_events(events[:2]) == AppendResult(accepted=0, duplicates=2)

        compact(spark, lake)  # purges e1 and e2 from the raw log
        assert bel_cases.ids(log.get_build_request_events("br-1")) == ["e3"]
        # Purged, the ids are no longer in the log: a retried append writes them, and the
        # tombstone hides them again (compaction purges them on its next run).
        assert log.append_events(events[:2]) == AppendResult(accepted=2, duplicates=0)
        assert bel_cases.ids(log.get_build_request_events("br-1")) == ["e3"]
    with DeltaRsEventLog(lake) as reopened:
        assert bel_cases.ids(reopened.get_build_request_events("br-1")) == ["e3"]
        assert reopened.get_activity_summary().total_events == 1


def test_appender_processes_racing_ingest_and_compaction_jobs_store_every_event_exactly_once(
    spark, lake: Lake, tmp_path: Path
) -> None:
    events = list(generate_events(1_200, seed=11))
    landed, appended = events[:600], events[600:]
    lake.ensure_root()
    landing = Path(lake.landing)
    landing.mkdir(parents=True)
    for number in range(3):  # three landing files; the last also redelivers appended events
        part = landed[number * 200 : (number + 1) * 200] + (appended[:20] if number == 2 else [])
        (landing / f"events-{number}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in part))
    # Three appender processes, batches of 5; each also resends some of another's events.
    shares = [appended[i::3] for i in range(3)]
    batches = [
        [share[start : start + 5] for start in range(0, len(share), 5)] + [shares[(i + 1) % 3][:10]]
        for i, share in enumerate(shares)
    ]
    appenders = [AppenderProcess.start(lake, batches[i], tmp_path, f"appender-{i}") for i in range(3)]
    # And the pipeline's refresh of the serving index they all read and update, in a loop.
    refresher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from databuild_assets.log.serving.backend import refresh_serving_index\n"
            "from databuild_assets.runtime.lake import Lake\n"
            f"for _ in range(15): refresh_serving_index(Lake({lake.root!r}))\n",
        ],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )

    resources = {"lakehouse": lakehouse_for(lake)}
    ingested = materialize([landing_files, ingested_event_log], resources=resources)
    compacted = compaction_job.execute_in_process(resources=resources)
    reports = [appender.report() for appender in appenders]
    _, refresher_errors = refresher.communicate(timeout=600)

    assert refresher.returncode == 0, refresher_errors[-3000:]
    assert ingested.success and compacted.success
    raw = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    stored = [row["event_id"] for row in raw.select("event_id").collect()]
    assert len(stored) == len(set(stored)) == len(events)  # none lost, none twice
    assert set(stored) == {event["event_id"] for event in events}
    ingest_accepted = ingested.asset_materializations_for_node("ingested_event_log")[0].metadata["accepted"].value
    assert sum(report["accepted"] for report in reports) + ingest_accepted == len(events)
    offered = sum(len(batch) for appender_batches in batches for batch in appender_batches)
    assert sum(report["accepted"] + report["duplicates"] for report in reports) == offered
    # The rows the JVM-free writers stored read back as the events they were given, from the
    # index every process updated.
    with DeltaRsEventLog(lake) as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(log, *keys) == bel_cases.answers(reference, *keys)
    assert set(raw.columns) >= set(EVENT_COLUMNS)


def test_the_query_command_prints_the_answer_as_json_on_either_backend(tmp_path: Path) -> None:
    events = [
        build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        partition_event("e2", 110, "br-1", "data/a", P.PARTITION_AVAILABLE),
    ]
    lake = Lake(str(tmp_path / "lake"))
    with open_event_log(f"delta://{lake.root}") as log, SqliteEventLog(tmp_path / "bel.db") as sqlite_log:
        log.append_events(events)
        sqlite_log.append_events(events)
    command = [sys.executable, "-m", "databuild_assets.cli", "query"]

    answers = []
    for uri in (f"delta://{lake.root}", f"sqlite://{tmp_path}/bel.db"):
        run = subprocess.run(
            [*command, uri, "get_latest_partition_status", "data/a"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        answers.append(json.loads(run.stdout))
    assert answers[0] == answers[1]
    assert answers[0]["status_name"] == "PARTITION_AVAILABLE" and answers[0]["build_request_id"] == "br-1"

    listed = subprocess.run(
        [*command, f"delta://{lake.root}", "list_events", 'filter={"event_types": ["partition_event"]}', "limit=5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [event["event_id"] for event in json.loads(listed.stdout)["events"]] == ["e2"]

    wrong = subprocess.run(
        [*command, f"delta://{lake.root}", "list_build_requests", "status=NOT_A_STATUS"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2 and "status='NOT_A_STATUS' is not a build request status" in wrong.stderr


def test_a_process_that_loads_the_log_and_exits_at_once_exits_cleanly(lake: Lake) -> None:
    """A snapshot load is the first thing every JVM-free reader does, and a one-shot `query`
    exits soon after. delta-rs's own `to_pyarrow_table` made such a process abort at exit (status
    134) in most tries; the load reads the files it lists with pyarrow instead. Several processes,
    since the abort was a race."""
    with DeltaRsEventLog(lake) as log:
        for batch in range(3):  # a few data files
            log.append_events(
                [partition_event(f"e{batch}-{i}", i, "br-1", f"data/{i}", P.PARTITION_BUILDING) for i in range(200)]
            )
    script = (
        "from databuild_assets.events.schema import EVENT_COLUMNS\n"
        "from databuild_assets.log.serving.follower import DeltaFollower\n"
        f"print(DeltaFollower({lake.table_path(RAW_EVENT_LOG)!r}).load(list(EVENT_COLUMNS)).num_rows)\n"
    )
    for _ in range(6):
        run = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True)
        assert (run.returncode, run.stdout.split()) == (0, ["600"]), run.stderr[-2000:]


def _appending_in_a_thread(lake: Lake, events: list[dict[str, Any]]) -> tuple[threading.Thread, dict]:
    result: dict[str, Any] = {}

    def append() -> None:
        with DeltaRsEventLog(lake) as log:
            result["appended"] = log.append_events(events)

    thread = threading.Thread(target=append)
    thread.start()
    return thread, result


def test_an_appends_file_holds_only_the_columns_its_events_set_and_every_reader_reads_them_whole(
    spark, lake: Lake
) -> None:
    # The payload columns of event types an append does not hold are left out of its file (the
    # Parquet writer's work is per column); Delta reads a column a file lacks as null, and so must our readers.
    events = [
        build_request_event("e1", 100, "br-1", BR.BUILD_REQUEST_RECEIVED, ["data/a"]),
        partition_event("e2", 200, "br-1", "data/a", P.PARTITION_BUILDING),
    ]
    path = lake.table_path(RAW_EVENT_LOG)
    follower = DeltaFollower(path)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:1])
        follower.load(["event_id"])  # a reader that then follows the log commit by commit
        log.append_events(events[1:])
    (added,) = follower.changes().added
    stored = set(pq.read_schema(f"{path}/{added}").names)
    assert {"event_id", "partition_event"} <= stored
    assert not {"build_request_event", "job_event", "delegation_event"} & stored

    wanted = sorted(map(canonical_event, events), key=lambda event: event["event_id"])
    by_follower = follower.read([added], list(EVENT_COLUMNS))
    assert by_follower.schema.field("job_event").type == raw_log_schema().field("job_event").type
    assert [canonical_event(row) for row in by_follower.to_pylist()] == wanted[1:]
    event_schema = pa.schema([raw_log_schema().field(name) for name in EVENT_COLUMNS])
    assert event_rows(by_follower) == event_rows(pa.Table.from_pylist(wanted[1:], event_schema))
    # A read of none of the columns a file holds keeps its rows.
    assert follower.read([added], ["job_event"]).to_pylist() == [{"job_event": None}]
    assert read_local_table(deltalake.DeltaTable(path), ["job_event"]).num_rows == 2
    by_spark = spark.read.format("delta").load(path).select(*EVENT_COLUMNS).orderBy("event_id").collect()
    assert [canonical_event(row.asDict(recursive=True)) for row in by_spark] == wanted
    by_delta_rs = deltalake.DeltaTable(path).to_pyarrow_table(columns=list(EVENT_COLUMNS)).sort_by("event_id")
    assert [canonical_event(row) for row in by_delta_rs.to_pylist()] == wanted
    shutil.rmtree(lake.path("serving_index"))
    with DeltaRsEventLog(lake) as log:  # an index built again from the log's files
        assert bel_cases.ids(log.get_partition_events("data/a")) == ["e1", "e2"]


def test_an_append_writes_its_data_files_before_it_waits_for_the_commit_lock(lake: Lake) -> None:
    # Every appender waits for the lock's holder, so the Parquet is written before the lock is
    # taken; under it the append only dedupes, names the files in a commit, and indexes them.
    events = list(generate_events(10, seed=31))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    committed = data_files_named(path)
    with commit_lock(path):  # held by this thread: the append's thread waits for it
        thread, result = _appending_in_a_thread(lake, events[5:])
        staged = soon(lambda: data_files_on_disk(path) - committed)
        assert staged, "the append wrote no data file before taking the commit lock"
        assert thread.is_alive() and not result
    thread.join(60)
    assert result["appended"] == AppendResult(5, 0)
    assert data_files_on_disk(path) == data_files_named(path) == committed | staged


def test_events_committed_while_an_append_waits_for_the_lock_are_stored_once_and_its_staged_files_deleted(
    lake: Lake,
) -> None:
    events = list(generate_events(10, seed=32))
    path = lake.table_path(RAW_EVENT_LOG)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:5])
    committed = data_files_named(path)
    with commit_lock(path):
        thread, result = _appending_in_a_thread(lake, events[5:])
        staged = soon(lambda: data_files_on_disk(path) - committed)
        assert staged
        with DeltaRsEventLog(lake) as other:  # another appender sends three of them first
            assert other.append_events(events[5:8]) == AppendResult(3, 0)
    thread.join(60)
    assert result["appended"] == AppendResult(2, 3)
    assert not staged & data_files_on_disk(path), "the staged files no commit names were left on disk"
    assert data_files_on_disk(path) == data_files_named(path)
    stored = deltalake.DeltaTable(path).to_pyarrow_table(columns=["event_id"]).column("event_id").to_pylist()
    assert sorted(stored) == sorted(e["event_id"] for e in events)


def test_a_purge_lets_appender_processes_commit_while_it_runs_and_a_bin_pack_beside_them_keeps_every_event(
    spark, lake: Lake, tmp_path: Path
) -> None:
    # Neither holds the raw log's commit lock through its work (decisions 0055, 0056): an appender
    # commits between the version the purge's Spark job read and the one it committed, and every
    # event lands once. The bin-pack of a local table runs without Spark in well under the
    # appender's pace, so an append between its read and its commit is not asserted: that it
    # commits beside the appender and keeps every event is. The appender's events are a week
    # later than those the purge rewrites: an append into a partition the purge rewrites makes it
    # run again under the lock.
    early = list(itertools.islice(generate_events(1_000_000, seed=55), 300))
    later_start = DEFAULT_START_NS + 7 * 86_400 * 10**9
    stream = f"generate_events(1_000_000, seed=56, start_ns={later_start})"  # appended until told to stop
    with DeltaRsEventLog(lake) as log:
        for start in range(0, len(early), 30):  # ten small files in each day's partition to pack
            log.append_events(early[start : start + 30])
    erased = early[0]["build_request_id"]
    request_erasure(spark, lake, "build_request_id", erased, actor="alice", reason="ticket 55")
    stop = tmp_path / "stop"
    appender = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import itertools, os, time\n"
            "from databuild_assets.log import open_event_log\n"
            "from databuild_assets.workload import generate_events\n"
            f"events, sent = {stream}, 0\n"
            f"with open_event_log({log_uri(lake)!r}, writer='beside-compaction') as log:\n"
            f"    while not os.path.exists({str(stop)!r}):\n"
            "        sent += log.append_events(list(itertools.islice(events, 3))).accepted\n"
            "        time.sleep(0.2)\n"
            "print(sent)\n",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The two Spark jobs alone, as compact() runs them: its refreshes in between would only
        # catch up with the appender's commits.
        purge_events(spark, lake, RAW_EVENT_LOG, read_tombstones(spark, lake))
        bin_pack(spark, lake, RAW_EVENT_LOG, closed_before=None)
    finally:
        stop.touch()
        out, err = appender.communicate(timeout=300)
    assert appender.returncode == 0, err[-3000:]
    later = list(itertools.islice(generate_events(1_000_000, seed=56, start_ns=later_start), int(out.split()[-1])))

    history = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).history()
    appends = {commit["version"] for commit in history if "beside-compaction" in str(commit.get("userMetadata", ""))}
    purge = next(c for c in history if c["operation"] == "MERGE" and '"purge"' in str(c.get("userMetadata")))
    pack = next(c for c in history if c["operation"] == "OPTIMIZE")
    beside = [v for v in appends if purge["readVersion"] < v < purge["version"]]
    assert beside, f"purge: read v{purge['readVersion']}, committed v{purge['version']}"
    assert pack["version"] > purge["version"] and pack["operationParameters"]["predicate"] == "[]"
    stored = [row["event_id"] for row in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect()]
    assert len(stored) == len(set(stored))  # none twice
    sent_ids = {e["event_id"] for e in later}
    # The erased build request's events that were there to purge are gone, every other one is kept;
    # of those appended beside, all are kept but the erased request's (purged if committed in time).
    assert set(stored) - sent_ids == {e["event_id"] for e in early if e["build_request_id"] != erased}
    assert {e["event_id"] for e in later if e["build_request_id"] != erased} <= set(stored)
