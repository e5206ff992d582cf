"""The serving index as the JVM-free backend keeps it on disk: an open reuses it and applies only
the commits after its stamp; a process killed inside an update leaves an index the next open
uses; an index older than the log's retention, or of a replaced table, is rebuilt; a lake this
process cannot write still opens; and an erased value leaves the index's bytes once compaction
has run. (Racing appenders, ingestion and compaction over one index: test_jvm_free_log.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import materialize

from databuild_assets.defs.maintenance.assets import tombstones
from databuild_assets.defs.maintenance.jobs import compaction_job
from databuild_assets.defs.serving.assets import serving_index
from databuild_assets.events.enums import TERMINAL_BUILD_REQUEST_STATUSES
from databuild_assets.events.erasure_rule import matches
from databuild_assets.log import SqliteEventLog, open_event_log
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving import appends, backend
from databuild_assets.log.serving.append import raw_log_rows, raw_log_schema
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.serving.index import ServingIndex
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER, IndexFolder
from databuild_assets.log.serving.wal import WalCopier
from databuild_assets.maintenance.dagster_sqlite import unread_bytes
from databuild_assets.maintenance.erasure_report import erasure_report
from databuild_assets.runtime.commit_lock import lock_path
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.lock_files import lock_if_free
from databuild_assets.runtime.processes import process_alive
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.bel_cases import P, partition_event
from databuild_assets_tests.serving_support import (
    erase_each_key_in_turn,
    files_holding,
    request_erasure_without_spark,
    serving_files,
    without_write_access,
)
from databuild_assets_tests.support import REPO_ROOT, lakehouse_for


def _folder(lake: Lake) -> IndexFolder:
    return IndexFolder(lake.path(SERVING_INDEX_FOLDER))


def _append_behind_the_index(lake: Lake, events: list[dict]) -> None:
    """Commit `events` to the raw log with delta-rs directly: a writer that does not update the
    index (as the pipeline's Spark jobs do not)."""
    rows = raw_log_rows(enumerate(canonical_event(event) for event in events), "behind")
    deltalake.write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")


def _answers_match_the_reference(log, events: list[dict]) -> None:
    with SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(log, *keys) == bel_cases.answers(reference, *keys)
    assert log._store().event_count() == log.get_activity_summary().total_events  # kept, not counted


def test_an_open_reuses_the_index_and_applies_only_the_commits_after_its_stamp(lake: Lake) -> None:
    events = list(generate_events(400, seed=3))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:300])
        first_index = log.index_path
    _append_behind_the_index(lake, events[300:])

    with DeltaRsEventLog(lake) as log:
        assert log.index_path == first_index  # no new generation: the commit after the stamp was applied
        assert log.version == 2
        _answers_match_the_reference(log, events)
    assert [path for path in _folder(lake).files() if path.endswith(".sqlite")] == [first_index]


def test_an_index_far_behind_the_raw_log_is_built_again_and_a_catch_up_adds_a_few_rows_at_a_time(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = list(generate_events(700, seed=4))
    monkeypatch.setattr(backend, "REBUILD_BEHIND_EVENTS", 100)
    monkeypatch.setattr(backend, "_ROWS_PER_BATCH", 7)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:200])
        first_index = log.index_path
    _append_behind_the_index(lake, events[200:300])  # 100 behind: caught up, 7 rows at a time
    with DeltaRsEventLog(lake) as log:
        assert log.index_path == first_index
        _answers_match_the_reference(log, events[:300])
    _append_behind_the_index(lake, events[300:])  # 400 behind: more than 100 and than half of 300
    with DeltaRsEventLog(lake) as log:
        assert log.index_path != first_index and not os.path.exists(first_index)
        _answers_match_the_reference(log, events)
        rebuilt = log.index_path
    # Every row written again (as a purge rewrites the files it touches): caught up, not built.
    path = lake.table_path(RAW_EVENT_LOG)
    deltalake.write_deltalake(path, deltalake.DeltaTable(path).to_pyarrow_table(), mode="overwrite")
    with DeltaRsEventLog(lake) as log:
        assert log.index_path == rebuilt
        _answers_match_the_reference(log, events)


@pytest.mark.parametrize("behind", [30, 400], ids=["an_ingestion_to_index", "a_build"])
def test_an_appender_does_a_long_catch_up_after_the_commit_lock_not_while_the_others_wait_for_it(
    lake: Lake, monkeypatch: pytest.MonkeyPatch, behind: int
) -> None:
    events = list(generate_events(800, seed=6))
    monkeypatch.setattr(backend, "REBUILD_BEHIND_EVENTS", 100)
    monkeypatch.setattr(appends, "LOCKED_CATCH_UP_EVENTS", 20)
    lock = lock_path(lake.table_path(RAW_EVENT_LOG))
    lock_free: list[bool] = []  # whether the commit lock was free each time the catch-up worked

    def noting_the_lock(work):
        def noted(*args, **kwargs):
            with lock_if_free(lock) as free:
                lock_free.append(free)
            return work(*args, **kwargs)

        return noted

    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:300])
        first_index = log.index_path
        monkeypatch.setattr(ServingIndex, "add", noting_the_lock(ServingIndex.add))
        monkeypatch.setattr(backend, "build_index", noting_the_lock(backend.build_index))
        _append_behind_the_index(lake, events[300 : 300 + behind])  # a writer that does not index (Spark)
        assert log.append_events(events[300 + behind : 305 + behind]).accepted == 5
        assert lock_free and all(lock_free)  # indexed (or built) while other appenders could commit
        assert (log.index_path != first_index) == (behind == 400)
        _answers_match_the_reference(log, events[: 305 + behind])


def test_an_appender_waits_for_another_appenders_long_catch_up_after_the_commit_lock_not_under_it(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Appender A catches up on many events after the lock, inside the index's write transaction;
    # appender B, which needs that transaction too, must not hold the commit lock while it waits.
    events = list(generate_events(400, seed=10))
    monkeypatch.setattr(appends, "LOCKED_CATCH_UP_EVENTS", 20)
    lock = lock_path(lake.table_path(RAW_EVENT_LOG))
    inside, lock_free = threading.Event(), []
    add = ServingIndex.add

    def slow_add_in_a(index, *args, **kwargs):
        if threading.current_thread().name == "appender A":
            inside.set()
            time.sleep(2.0)  # B meets the index's write transaction held meanwhile
            with lock_if_free(lock) as free:
                lock_free.append(free)
        return add(index, *args, **kwargs)

    with DeltaRsEventLog(lake) as first:
        first.append_events(events[:300])
    monkeypatch.setattr(ServingIndex, "add", slow_add_in_a)
    opened, go = threading.Event(), threading.Event()

    def appender_a() -> None:
        with DeltaRsEventLog(lake) as log_a:  # one instance per thread
            opened.set()
            go.wait(30)
            log_a.append_events(events[350:355])

    with DeltaRsEventLog(lake) as log_b:
        a = threading.Thread(target=appender_a, name="appender A")
        a.start()
        assert opened.wait(30)
        _append_behind_the_index(lake, events[300:350])  # a writer that does not index (Spark)
        go.set()
        assert inside.wait(30)
        assert log_b.append_events(events[355:360]).accepted == 5
        a.join(30)
        assert lock_free == [True]  # B waited for the index after the lock, as the pipeline's writers can
        _answers_match_the_reference(log_b, events[:360])


def test_an_appender_copies_the_index_write_ahead_log_into_the_file_on_a_thread_of_its_own(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite would copy it inside the COMMIT of the index update that crosses its threshold (an
    # append that waits for thousands of pages and an fsync); here the file is written beside
    # the appends, long before that threshold.
    monkeypatch.setattr(WalCopier, "EVERY_COMMITS", 5)
    events = list(generate_events(80, seed=9))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:40])
        copier = getattr(log, "_wal", None)
        if copier is not None:
            copier.close()
        written = hashlib.sha256(Path(log.index_path).read_bytes()).digest()
        for start in range(40, 70, 5):  # six index updates
            log.append_events(events[start : start + 5])
        if copier is not None:
            copier.close()
        assert hashlib.sha256(Path(log.index_path).read_bytes()).digest() != written  # the log copied in
        assert os.path.getsize(log.index_path + "-wal") > 0  # by a checkpoint of ours, not at a close
        _answers_match_the_reference(log, events[:70])


def test_a_catch_up_reads_the_new_files_a_few_at_a_time_bounded_by_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "_ROWS_PER_BATCH", 10)
    monkeypatch.setattr(backend, "_FILES_PER_BATCH", 3)
    files = [f"f{number}" for number in range(7)]
    batches = list(backend._batches(files, [4, 4, 4, 20, None, 1, 1]))
    assert batches == [["f0", "f1"], ["f2"], ["f3"], ["f4", "f5", "f6"]]


def test_an_append_in_a_fresh_process_imports_no_pyspark_and_stores_the_raw_logs_schema(lake: Lake) -> None:
    # The Arrow schema an appender writes is made from the field lists, not from the Spark schema
    # (importing pyspark was most of a service's first append): the same schema as delta-rs's.
    events = list(generate_events(60, seed=8))
    script = (
        "import json, sys\n"
        "from databuild_assets.log import open_event_log\n"
        f"with open_event_log({f'delta://{lake.root}'!r}) as log:\n"
        "    print(log.append_events(json.loads(sys.stdin.read())).accepted)\n"
        "print('pyspark' in sys.modules)\n"
    )

    for batch in (events[:50], events[50:]):  # the lake's first append (its raw log created), then another
        run = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO_ROOT, input=json.dumps(batch), capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.splitlines() == [str(len(batch)), "False"]
    spark_schema = pa.schema(deltalake.Schema.from_json(RAW_EVENT_LOG.schema.json()).to_arrow())
    assert raw_log_schema().equals(spark_schema, check_metadata=True)
    assert deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG)).schema().to_arrow() == spark_schema
    with DeltaRsEventLog(lake) as log:
        _answers_match_the_reference(log, events)


@pytest.mark.parametrize("tombstones", [[], ["data/never/written"]], ids=["empty_tombstones", "a_tombstone"])
def test_a_fresh_process_opens_catches_up_and_answers_without_importing_pandas_or_duckdb(
    lake: Lake, tombstones: list[str]
) -> None:
    # A reader's start-up is mostly imports: pandas (which pyarrow imports to convert any Python
    # value, and to take a foreign Arrow object) and DuckDB (a bulk conversion's) cost it more
    # than its work.
    events = list(generate_events(200, seed=5))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:150])
    _append_behind_the_index(lake, events[150:])
    request_erasure_without_spark(lake, "partition_ref", tombstones)  # the catch-up reads the tombstones
    script = (
        "import sys\n"
        "from databuild_assets.log import open_event_log\n"
        f"with open_event_log({f'delta://{lake.root}'!r}) as log:\n"
        "    print(log.get_activity_summary().total_events)\n"
        "print(sorted(m for m in ('pandas', 'duckdb') if m in sys.modules))\n"
    )

    run = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [str(len(events)), "[]"]


def test_a_process_killed_inside_an_index_update_leaves_an_index_the_next_open_uses(lake: Lake) -> None:
    events = list(generate_events(200, seed=5))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:150])
        index_path = log.index_path
    _append_behind_the_index(lake, events[150:])
    # A process opens the log and catches up inside its update transaction: the events applied
    # and the stamp moved, then it is killed before the transaction commits.
    script = (
        "import time\n"
        "from databuild_assets.log.serving import index\n"
        "stamp = index.ServingIndex.set_stamp\n"
        "def stamp_then_pause(self, new):\n"
        "    stamp(self, new)\n"
        "    print('inside', flush=True)\n"
        "    time.sleep(120)\n"
        "index.ServingIndex.set_stamp = stamp_then_pause\n"
        "from databuild_assets.log.serving.backend import DeltaRsEventLog\n"
        "from databuild_assets.runtime.lake import Lake\n"
        f"DeltaRsEventLog(Lake({lake.root!r}))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "inside", process.stderr.read()
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)

    with DeltaRsEventLog(lake) as log:
        assert log.index_path == index_path
        _answers_match_the_reference(log, events)


def test_an_index_older_than_the_logs_retention_is_rebuilt_and_answers_right(lake: Lake) -> None:
    events = list(generate_events(300, seed=9))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:100])
        old_index = log.index_path
    for start in (100, 200):
        _append_behind_the_index(lake, events[start : start + 100])
    # A checkpoint at the newest version, then the commits before it cleaned up, as log
    # retention does: the commit after the index's stamp is gone.
    table = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG))
    table.create_checkpoint()
    log_dir = Path(lake.table_path(RAW_EVENT_LOG)) / "_delta_log"
    for version in range(table.version()):
        (log_dir / f"{version:020d}.json").unlink()

    with DeltaRsEventLog(lake) as log:
        assert log.index_path != old_index and not os.path.exists(old_index)
        _answers_match_the_reference(log, events)


def test_a_torn_or_foreign_index_file_is_rebuilt_never_read(lake: Lake) -> None:
    events = list(generate_events(120, seed=4))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
        torn = log.index_path
    with open(torn, "r+b") as file:  # the header and first pages overwritten: not a database any more
        file.write(b"\0" * 8192)

    with DeltaRsEventLog(lake) as log:
        assert log.index_path != torn
        _answers_match_the_reference(log, events)


def test_an_index_of_an_older_format_is_rebuilt_never_read(lake: Lake) -> None:
    events = list(generate_events(80, seed=6))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
        older = log.index_path
    with sqlite3.connect(older) as connection:
        connection.execute("UPDATE serving_stamp SET index_format = index_format - 1")

    with DeltaRsEventLog(lake) as log:
        assert log.index_path != older
        _answers_match_the_reference(log, events)


def test_a_raw_log_replaced_at_the_same_path_is_never_answered_from_the_old_index(lake: Lake) -> None:
    old = [partition_event(f"old-{i}", 100 + i, "br-old", "data/old", P.PARTITION_AVAILABLE) for i in range(2)]
    new = [partition_event(f"new-{i}", 200 + i, "br-new", "data/new", P.PARTITION_BUILDING) for i in range(4)]
    elsewhere = Lake(lake.root + "-elsewhere")
    with DeltaRsEventLog(elsewhere) as other:
        for event in new:  # more versions than the old table has: the live reader sees it move
            other.append_events([event])
    with DeltaRsEventLog(lake) as live:
        for event in old:
            live.append_events([event])
        shutil.rmtree(lake.table_path(RAW_EVENT_LOG))
        shutil.copytree(elsewhere.table_path(RAW_EVENT_LOG), lake.table_path(RAW_EVENT_LOG))

        assert live.get_partition_events("data/old") == []  # a process that was reading all along
        _answers_match_the_reference(live, new)
    with DeltaRsEventLog(lake) as log:  # and a new one
        _answers_match_the_reference(log, new)


def _run_without_write_access(lake: Lake, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(without_write_access(lake, code), cwd=REPO_ROOT, capture_output=True, text=True)


def test_a_lake_this_process_cannot_write_still_opens_and_answers_with_every_commit(lake: Lake) -> None:
    events = list(generate_events(200, seed=13))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:120])
    _append_behind_the_index(lake, events[120:])  # the index is behind, and this reader cannot update it
    before = {path: os.stat(path).st_mtime_ns for path in _folder(lake).files()}
    private_before = _private_folders()

    # The process exits without closing the log: its private copy goes with it all the same.
    run = _run_without_write_access(lake, "print(log.get_activity_summary().total_events)")

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [str(len(events))]
    assert {path: os.stat(path).st_mtime_ns for path in _folder(lake).files()} == before
    # The process is gone: no private folder of a dead process is left. (Folders of live processes,
    # e.g. the other test worker's, may come and go meanwhile.)
    assert [name for name in _private_folders() - private_before if not process_alive(_owner(name))] == []


def _private_folders() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("databuild-serving-index-")}


def _owner(private_folder: str) -> int:
    """The pid a private folder's name carries (databuild-serving-index-<pid>-<random>)."""
    return int(private_folder.removeprefix("databuild-serving-index-").split("-")[0])


def test_an_erased_value_leaves_the_index_bytes_once_compaction_has_run(lake: Lake, spark) -> None:
    secret = "data/customers/id=8675309-secret"
    events = [
        partition_event("e1", 100, "br-1", secret, P.PARTITION_AVAILABLE),
        partition_event("e2", 110, "br-1", "data/kept", P.PARTITION_AVAILABLE),
    ]
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)

    def index_bytes_holding(value: str) -> int:
        return sum(Path(path).read_bytes().count(value.encode()) for path in _folder(lake).files())

    assert index_bytes_holding(secret) > 0  # the scan can see it
    resources = {"lakehouse": lakehouse_for(lake)}
    request = {
        "ops": {"tombstones": {"config": {"key": "partition_ref", "value": secret, "actor": "t", "reason": "r"}}}
    }
    assert materialize([tombstones], resources=resources, run_config=request).success
    assert materialize([serving_index], resources=resources).success
    assert compaction_job.execute_in_process(resources=resources).success

    assert index_bytes_holding(secret) == 0
    in_index = [f for f in erasure_report(spark, lake) if f.table == SERVING_INDEX_FOLDER]
    assert [(f.data_files_scanned > 0, f.rows_in_data_files) for f in in_index] == [(True, 0)]
    with open_event_log(f"delta://{lake.root}") as log:
        assert log.get_partition_events(secret) == []
        assert [e["event_id"] for e in log.get_partition_events("data/kept")] == ["e2"]


def test_an_erased_value_leaves_the_free_space_of_the_index_pages_once_the_pipeline_refreshes_it(lake: Lake) -> None:
    """Hiding events deletes their rows with secure_delete on, which zeroes a deleted cell; but a
    b-tree rebalance rebuilds pages and leaves copies of older cells in their unused area. On
    these events (issue 41's size: 58,767 events of ~3,000 build requests) the hidden build
    request's id is left in one such area; the pipeline's refresh writes the index whole."""
    events = list(generate_events(58_767, seed=1))
    erased_request, erased_partition = (
        "49ed6298-1ded-4411-8208-c304b76fb49d",
        "reports/stockouts/date=2026-11-15/region=latam",
    )
    assert any(event["build_request_id"] == erased_request for event in events)
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    request_erasure_without_spark(lake, "partition_ref", erased_partition)
    request_erasure_without_spark(lake, "build_request_id", erased_request)
    with DeltaRsEventLog(lake) as log:  # its open catches up: the events leave the index's rows
        assert log.get_build_request_events(erased_request) == []
        index_file = Path(log.index_path)
    unread = b"".join(unread_bytes(index_file))
    assert erased_request.encode() in unread, "these events no longer leave a fragment: find another reproduction"

    refresh_serving_index(lake)

    assert files_holding(lake, erased_request) == []  # the index, and the segments the default window wrote
    assert not index_file.exists()  # the generation that held the fragment is gone
    with open_event_log(f"delta://{lake.root}") as log:
        assert log.get_build_request_events(erased_request) == []
        hidden = {"build_request_id": {erased_request}, "partition_ref": {erased_partition}}
        assert log.get_activity_summary().total_events == sum(not matches(event, hidden) for event in events)


def test_the_erasure_report_reads_the_values_of_cold_segments_which_their_compressed_pages_hide(
    lake: Lake, spark
) -> None:
    events = list(generate_events(1200, seed=4))
    terminal = {int(code) for code in TERMINAL_BUILD_REQUEST_STATUSES}
    request = next(
        e["build_request_id"]
        for e in events
        if e["event_type"] == "build_request_event" and e["build_request_event"]["status_code"] in terminal
    )
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    refresh_serving_index(lake, hot_window_s=0)  # the finished build requests move to segments
    segments = [path for path in serving_files(lake) if path.suffix == ".parquet"]
    in_segments = sum(
        1
        for path in segments
        for row in pq.read_table(path).to_pylist()
        if request in "\t".join(map(str, row.values()))
    )
    assert in_segments > 3 and not [path for path in segments if request.encode() in path.read_bytes()]
    request_erasure_without_spark(lake, "build_request_id", request)  # requested: the index has not caught up

    [finding] = [f for f in erasure_report(spark, lake) if f.table == SERVING_INDEX_FOLDER]

    assert finding.rows_in_data_files >= in_segments


def test_thousands_of_tombstones_are_honoured_by_a_build_a_catch_up_and_an_append(lake: Lake) -> None:
    events = list(generate_events(600, seed=9))
    refs = sorted({e["partition_event"]["partition_ref"] for e in events if e["event_type"] == "partition_event"})
    erased = [*refs[:3], *(f"data/nothing/id={i}" for i in range(3000))]  # past SQLite's expression depth
    hidden = [e for e in events if matches(e, {"partition_ref": set(erased)})]
    assert hidden and any(e["event_type"] == "job_event" for e in hidden)  # fields, lists and job configs
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:300])
        request_erasure_without_spark(lake, "partition_ref", erased)
        log.append_events(events[300:])  # read with the tombstones: hidden as they are added
        assert log.get_activity_summary().total_events == len(events) - len(hidden)
    shutil.rmtree(lake.path(SERVING_INDEX_FOLDER))
    with DeltaRsEventLog(lake) as log:  # a build with them
        _answers_match_the_reference(log, [e for e in events if e not in hidden])


def test_a_tombstone_of_each_key_hides_on_catch_up_exactly_the_events_the_rule_matches(lake: Lake) -> None:
    # A new tombstone hides, at a catch-up, events reached by every kind of field the rule reads:
    # core and payload fields, listed partitions, and JSON text (a job's config names its inputs).
    events = list(generate_events(3000, seed=5))
    delegation = next(e for e in events if e["event_type"] == "delegation_event")
    job = next(
        e for e in events if e["event_type"] == "job_event" and '"inputs":[{' in (e["job_event"]["config"] or "")
    )
    request = next(e for e in events if e["event_type"] == "build_request_event")
    an_input = json.loads(job["job_event"]["config"])["inputs"][0]["partition_ref"]["str"]  # named in JSON text only
    values = {
        "event_id": [events[7]["event_id"]],
        "build_request_id": [delegation["delegation_event"]["delegated_to_build_request_id"]],
        "job_run_id": [job["job_event"]["job_run_id"]],
        "partition_ref": [an_input, request["build_request_event"]["requested_partitions"][-1]],
    }
    with DeltaRsEventLog(lake) as log:
        log.append_events(events)
    hidden = erase_each_key_in_turn(lake, events, values)
    assert delegation in hidden and delegation["build_request_id"] not in values["build_request_id"]
    assert any(e["event_type"] == "job_event" and an_input not in e["job_event"]["target_partitions"] for e in hidden)


def test_events_arriving_after_a_tombstone_are_hidden_by_a_process_that_never_read_it(lake: Lake) -> None:
    secret = "data/customers/id=42"
    with DeltaRsEventLog(lake) as log:
        log.append_events([partition_event("e1", 100, "br-1", secret, P.PARTITION_AVAILABLE)])
        request_erasure_without_spark(lake, "partition_ref", secret)
        assert log.get_partition_events(secret) == []  # the index now reflects the tombstone
        assert log._store().stamp().tombstones.version == 1  # create, then the request

    # One event written behind the index, one appended, each read by a new log instance.
    _append_behind_the_index(lake, [partition_event("e2", 110, "br-2", secret, P.PARTITION_BUILDING)])
    with DeltaRsEventLog(lake) as log:
        assert log.get_partition_events(secret) == []
    with DeltaRsEventLog(lake) as log:
        assert log.append_events([partition_event("e3", 120, "br-2", secret, P.PARTITION_AVAILABLE)]).accepted == 1
        assert log.get_partition_events(secret) == [] and log.get_latest_partition_status(secret) is None
        assert log.append_events([partition_event("e3", 120, "br-2", secret, P.PARTITION_AVAILABLE)]).duplicates == 1
        assert log._store().event_count() == log.get_activity_summary().total_events == 0


def test_the_serving_index_asset_reports_the_versions_it_reflects(lake: Lake) -> None:
    with DeltaRsEventLog(lake) as log:
        log.append_events(list(generate_events(50, seed=1)))
    leftover = Path(lake.path(SERVING_INDEX_FOLDER)) / ".index-99.sqlite.building"
    leftover.write_bytes(b"a builder that died")  # removed by the refresh

    result = materialize([serving_index], resources={"lakehouse": lakehouse_for(lake)})

    metadata = result.asset_materializations_for_node("serving_index")[0].metadata
    assert (metadata["raw_log_version"].value, metadata["events"].value) == (1, 50)
    assert metadata["tombstones_version"].value == -1
    assert not leftover.exists()


def test_the_appends_leave_sqlites_log_copy_to_every_ten_thousand_pages(lake: Lake) -> None:
    # At SQLite's default (a copy of the write-ahead log into the file every 1,000 pages, inside
    # the commit that crossed it) the copy was in the appends' p95 over a large index; the log now
    # grows to WAL_CHECKPOINT_PAGES before it is copied (log/serving/index.py).
    events = list(generate_events(2_000, seed=41))
    with DeltaRsEventLog(lake) as log:
        for start in range(0, len(events), 5):
            log.append_events(events[start : start + 5])
        index = Path(log.index_path)
        page_size = sqlite3.connect(index).execute("PRAGMA page_size").fetchone()[0]
        wal = index.with_name(index.name + "-wal")
        assert wal.stat().st_size > 1_200 * page_size  # past where the default would have wrapped it
