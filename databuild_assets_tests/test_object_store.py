"""The lakehouse on object storage: a bucket on an S3-compatible server on loopback (moto's server
mode, databuild_assets_tests/s3_server.py), reached by Spark through S3A and by the JVM-free path
through delta-rs's own object store, with made-up credentials.

The JVM-free path reads and follows a lake on the bucket as it does one on disk, with its serving
index in this machine's cache folder. Three JVM-free appender processes, an ingestion and a
compaction (two Spark drivers) racing on the bucket store every event once: every writer commits
with S3's conditional writes (decision 0040).

The whole flow (landing objects, ingestion with quarantine, the filtered log, the projections and
their fold, an erasure, compaction with the rewrite of landing objects, time travel, landing
retention, vacuum at retention 0, the erasure report) runs on the bucket in a process of its own and on a local lake
in the suite's session: every table must come out the same, row for row, and no object but the
tombstones table's may hold the erased value.

Minutes, and it needs hadoop-aws's jars and moto: run it with `make s3-test` (DATABUILD_S3_TEST=1).
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from databuild_assets.log import AppendResult, SqliteEventLog, open_event_log
from databuild_assets.log.serving import bucket
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.log.serving.follower import follower_for
from databuild_assets.log.serving.publish import publication_of
from databuild_assets.log.serving.store import INDEX_DIR_ENV
from databuild_assets.maintenance.erasure_report import file_streams, lines_holding
from databuild_assets.maintenance.tombstones import request_erasure
from databuild_assets.runtime.delta_local import read_local_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.object_store import delta_rs_options, delta_rs_uri
from databuild_assets.workload import generate_events
from databuild_assets_tests import bel_cases
from databuild_assets_tests.cluster_scenario import printed_summary, run_scenario, scenario_command
from databuild_assets_tests.s3_server import ACCESS_KEY, SECRET_KEY, LoopbackS3, StoreOutage
from databuild_assets_tests.support import REPO_ROOT, AppenderProcess

pytestmark = pytest.mark.s3

S3_TEST_COMMAND = "make s3-test"
N_EVENTS = 3000
SCENARIO_TIMEOUT_S = 900

if os.environ.get("DATABUILD_S3_TEST") != "1":
    pytest.skip(
        "the object-store tests (an S3 server on loopback, Spark through S3A; minutes) run only with "
        f"DATABUILD_S3_TEST=1: run `{S3_TEST_COMMAND}`",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with LoopbackS3(tmp_path_factory.mktemp("s3-server")) as server:
        yield server


def _objects_holding(s3: LoopbackS3, prefix: str, value: str) -> dict[str, int]:
    """Objects under `prefix` whose content holds `value`: Parquet files by their string cells,
    any other object by its bytes. {key: cells or occurrences}."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found = {}
    for key in s3.keys(prefix):
        body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        if key.endswith(".parquet"):
            table = pq.read_table(io.BytesIO(body))
            hits = sum(
                pc.sum(pc.match_substring(column, value)).as_py() or 0
                for column in table.columns
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            )
        else:
            hits = body.count(value.encode())
        if hits:
            found[key] = hits
    return found


def test_the_whole_flow_on_a_bucket_gives_the_tables_of_a_local_lake_and_leaves_no_erased_value(spark, s3, tmp_path):
    root = s3.root("parity")
    out, err = tmp_path / "s3-run.out", tmp_path / "s3-run.err"
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.run(
            scenario_command("local[2]", root, N_EVENTS, "--vacuum"),
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, **s3.env},
            timeout=SCENARIO_TIMEOUT_S,
        )
    bucket_s = time.monotonic() - started
    assert run.returncode == 0, f"the run on the bucket failed ({run.returncode}):\n{err.read_text()[-4000:]}"
    on_bucket = printed_summary(out.read_text())["result"]

    started = time.monotonic()
    local = run_scenario(spark, Lake(str(tmp_path / "local-lake")), N_EVENTS, vacuum=True)["result"]
    print(f"bucket {bucket_s:.0f} s, local {time.monotonic() - started:.0f} s")

    # The work was real: bad and redelivered lines, an erasure purged from every table ...
    assert on_bucket["ingest"]["accepted"] == N_EVENTS and on_bucket["ingest"]["files"] == 3
    assert on_bucket["ingest"]["duplicates"] > 0 and on_bucket["ingest"]["quarantined"] > 0
    assert on_bucket["hidden_by_erasure"] > 0
    # Time travel on the bucket: the log before the erasure, its erased events still hidden.
    assert on_bucket["time_travel_before_erasure"]["total_events"] == N_EVENTS - on_bucket["hidden_by_erasure"]
    assert on_bucket["landing_archived"] > 0  # the landing objects erasure did not rewrite
    assert "raw_event_log" in on_bucket["erasure_report"]["scanned"]
    assert on_bucket["erasure_report"]["rows_left"] == on_bucket["erasure_report"]["log_mentions"] == 0
    # ... and every table, row for row, is what the local lake holds.
    for stage in ("before_erasure", "after_compaction"):
        for table, digest in local[stage].items():
            assert on_bucket[stage][table] == digest, (stage, table)
    # The local lake's commit locks (tables/.<table>.commit-lock) are files outside the tables' folders,
    # which the report scans as the folder "tables"; a bucket has no such lock (decision 0009).
    assert "tables" in local["erasure_report"]["scanned"]
    local["erasure_report"]["scanned"].remove("tables")
    assert on_bucket == local

    # Read independently of our code: no object of the lake but the tombstones table's holds the
    # erased value (Parquet cells, Delta log lines, landing objects and their archive).
    erased = on_bucket["erased_partition_ref"]
    holding = _objects_holding(s3, "parity/", erased)
    assert holding and all(key.startswith("parity/tables/tombstones/") for key in holding), holding
    # The made-up secret is in no object either (it reached Spark and delta-rs through the environment).
    assert not _objects_holding(s3, "parity/", SECRET_KEY)
    # Every landing object left the landing prefix: rewritten by erasure or moved by retention.
    landing = [key for key in s3.keys("parity/landing/") if not key.endswith("/")]
    archive = [key for key in s3.keys("parity/landing_archive/") if not key.endswith("/")]
    assert not landing and len(archive) == 3, (landing, archive)


def _upload_new(s3: LoopbackS3, lake_root: Path, prefix: str) -> int:
    """Copy the files of the local lake's tables that the bucket lacks to `prefix`, data files
    before commit files (as a writer makes them): the lake as it would be had it been written there."""
    present = set(s3.keys(f"{prefix}/tables/"))
    files = sorted(
        (path for path in (lake_root / "tables").rglob("*") if path.is_file() and not path.name.startswith(".")),
        key=lambda path: ("_delta_log" in path.parts, str(path)),
    )
    uploaded = 0
    for path in files:
        key = f"{prefix}/{path.relative_to(lake_root).as_posix()}"
        if key not in present:
            s3.client.upload_file(str(path), s3.bucket, key)
            uploaded += 1
    return uploaded


def _built_at(log) -> str:
    """When the serving index a JVM-free log reads was built (its stamp; a rewrite keeps it)."""
    return log._store()._connection.execute("SELECT built_at FROM serving_stamp").fetchone()[0]


def test_the_jvm_free_log_reads_and_follows_a_lake_on_the_bucket_as_it_reads_the_same_lake_on_disk(
    spark, s3, tmp_path, monkeypatch
):
    for key, value in {**s3.env, INDEX_DIR_ENV: str(tmp_path / "index-cache")}.items():
        monkeypatch.setenv(key, value)
    local = Lake(str(tmp_path / "lake"))
    events = list(generate_events(2_000, seed=3))
    with DeltaRsEventLog(local) as writer:
        writer.append_events(events[:1_500])
    assert _upload_new(s3, tmp_path / "lake", "served") > 0
    uri = f"delta+s3://{s3.bucket}/served"

    # The command line, in a process of its own with no JVM: the answer the local lake gives.
    query = [sys.executable, "-m", "databuild_assets.cli", "query"]
    on_bucket = subprocess.run([*query, uri, "get_activity_summary"], capture_output=True, text=True, timeout=120)
    assert on_bucket.returncode == 0, on_bucket.stderr
    on_disk = subprocess.run([*query, f"delta://{local.root}", "get_activity_summary"], capture_output=True, text=True)
    assert json.loads(on_bucket.stdout) == json.loads(on_disk.stdout)
    assert json.loads(on_bucket.stdout)["total_events"] == 1_500

    # Asking the bucket before every read (not once a second, the default on S3: decision 0041).
    with open_event_log(uri, max_staleness=0) as remote, DeltaRsEventLog(local) as writer:
        # Its serving index is on this machine's disk, in the cache folder, not in the bucket.
        assert remote.index_path.startswith(str(tmp_path / "index-cache" / s3.bucket / "served"))
        assert not [key for key in s3.keys("served/") if "serving_index" in key]
        request = events[0]["build_request_id"]
        assert remote.get_build_request_events(request) == writer.get_build_request_events(request)
        assert remote.list_recent_partitions(limit=50) == writer.list_recent_partitions(limit=50)

        # New commits on the bucket are followed, not rebuilt: the next read sees them.
        index_before, built_at = remote.index_path, _built_at(remote)
        writer.append_events(events[1_500:-1])
        writer.append_events(events[-1:])  # a file of one event: only the columns it sets
        request_erasure(spark, local, "build_request_id", request, actor="alice", reason="s3 test")
        _upload_new(s3, tmp_path / "lake", "served")
        assert remote.get_activity_summary() == writer.get_activity_summary()
        assert remote.get_activity_summary().total_events < 2_000  # the tombstone hides its events
        assert remote.get_build_request_events(request) == []
        # Not built again (the stamp's build time is the first build's); the catch-up that hid the
        # erased events wrote the cache whole, as a new generation, so no copy of their rows is
        # left in its pages (decision 0034).
        assert _built_at(remote) == built_at and remote.index_path != index_before
        assert not os.path.exists(index_before)

        # An append through it is committed on the bucket and read back at once.
        extra = dict(events[-1], event_id="appended-on-the-bucket")
        assert remote.append_events([extra]).accepted == 1
        assert remote.get_activity_summary().total_events == writer.get_activity_summary().total_events + 1


def _cache_files_holding(folder: Path, value: str) -> list[str]:
    """Files under a reader's cache folder holding `value`: a segment by its cells, else by bytes."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found = []
    for path in (p for p in folder.rglob("*") if p.is_file()):
        if path.name.endswith(".parquet"):
            table = pq.read_table(path)
            hits = any(
                pc.any(pc.match_substring(column, value)).as_py()
                for column in table.columns
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            )
        else:
            hits = value.encode() in path.read_bytes()
        if hits:
            found.append(str(path))
    return found


def _report_lines(spark, s3: LoopbackS3, prefix: str, value: str) -> int:
    """The lines of the published segments and snapshot under `prefix` holding `value`, as the
    erasure report reads them: a segment by its values, the snapshot unpacked (zstd hides both
    from a byte search)."""
    paths = [f"s3a://{s3.bucket}/{key}" for key in s3.keys(prefix) if key.endswith((".parquet", ".zst"))]
    return sum(lines_holding(chunks, {"erased": (value.encode(),)})["erased"] for chunks in file_streams(spark, paths))


def test_a_new_reader_starts_from_the_published_index_reads_segments_by_ranges_and_drops_erased_ones(
    spark, s3, tmp_path, monkeypatch
):
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    local = Lake(str(tmp_path / "lake"))
    events = list(generate_events(3_000, seed=5))
    with DeltaRsEventLog(local) as writer:
        writer.append_events(events)
    _upload_new(s3, tmp_path / "lake", "published")
    lake = Lake(f"s3a://{s3.bucket}/published")
    pipeline_cache, reader_cache = tmp_path / "pipeline-machine", tmp_path / "reader-machine"

    # The pipeline's refresh, on its machine, moves every finished build request to segments and
    # publishes the index and the segments in the bucket.
    monkeypatch.setenv(INDEX_DIR_ENV, str(pipeline_cache))
    status = refresh_serving_index(lake, hot_window_s=0)
    assert status.segments >= 1 and status.cold_build_requests > 0
    published = s3.keys("published/serving_index/")
    assert "published/serving_index/published.json" in published
    snapshots = [key for key in published if key.startswith("published/serving_index/snapshots/")]
    assert snapshots and all(re.fullmatch(r".*/snapshots/index-[0-9a-f]{32}/\d{5}\.sqlite\.zst", s) for s in snapshots)
    assert len([key for key in published if key.endswith(".by-partition.parquet")]) == status.segments

    # A new machine: its first open downloads that index (not built: the stamp's build time is
    # the pipeline's) and fetches a segment only when a read needs it.
    monkeypatch.setenv(INDEX_DIR_ENV, str(reader_cache))
    with (
        open_event_log(f"delta+s3://{s3.bucket}/published", max_staleness=0) as reader,
        SqliteEventLog(":memory:") as reference,
    ):
        assert publication_of(reader._store()._connection) is not None  # downloaded, not built
        assert not list(reader_cache.rglob("segment-*.parquet"))
        cold = [
            row[0] for row in reader._store()._connection.execute("SELECT build_request_id FROM cold_build_requests")
        ]
        assert cold
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(reader, *keys) == bel_cases.answers(reference, *keys)
        # The cold answers read the segments by ranges from the bucket: none of them is on disk.
        assert not list(reader_cache.rglob("segment-*.parquet"))

        # An erasure of a cold build request. The reader hides it at once, and its disk holds
        # no segment that has it, while the bucket's publication does.
        erased = cold[0]
        beside = (
            reader._store()
            ._connection.execute(
                "SELECT build_request_id FROM cold_build_requests WHERE build_request_id != ? AND segment ="
                " (SELECT segment FROM cold_build_requests WHERE build_request_id = ?) LIMIT 1",
                (erased, erased),
            )
            .fetchone()[0]
        )
        assert reader.get_build_request_events(beside) == reference.get_build_request_events(beside)
        request_erasure(spark, local, "build_request_id", erased, actor="alice", reason="publication test")
        _upload_new(s3, tmp_path / "lake", "published")
        assert reader.get_build_request_events(erased) == []
        assert not [path for path in _cache_files_holding(reader_cache, erased) if path.endswith(".parquet")]
        # The erasure report reads the published segments' values and the snapshot unpacked
        # (zstd hides them from a byte search): it finds the value until the pipeline republishes.
        assert _report_lines(spark, s3, "published/serving_index/", erased) > 0
        monkeypatch.setenv(INDEX_DIR_ENV, str(pipeline_cache))
        refresh_serving_index(lake, hot_window_s=0)
        assert _objects_holding(s3, "published/serving_index/", erased) == {}
        assert _report_lines(spark, s3, "published/serving_index/", erased) == 0
        # Before the reader's next check of the bucket: a request of the rewritten segment, whose
        # object (its handle kept with its footer) left the bucket, is read from the new one.
        assert reader.get_build_request_events(beside) == reference.get_build_request_events(beside)
        # The lake is quiet now; the reader's next read after its check interval drops the
        # fetched segments the bucket no longer names.
        monkeypatch.setattr(bucket, "PUBLICATION_CHECK_S", 0.0)
        reader.get_activity_summary()
        assert _cache_files_holding(reader_cache, erased) == []
        # Every other cold request is still answered: a segment gone from the bucket makes the
        # reader start again from the current publication.
        for request in cold[1:]:
            assert reader.get_build_request_events(request) == reference.get_build_request_events(request)
        assert _cache_files_holding(reader_cache, erased) == []


def test_an_append_whose_commit_the_store_throttles_is_retried_and_stores_every_event_once(s3, tmp_path, monkeypatch):
    with StoreOutage(s3) as store:
        for key, value in {**store.env, INDEX_DIR_ENV: str(tmp_path / "index-cache")}.items():
            monkeypatch.setenv(key, value)
        events = list(generate_events(300, seed=11))
        with DeltaRsEventLog(Lake(f"s3a://{s3.bucket}/throttled")) as log:
            assert log.append_events(events[:200]).accepted == 200
            # The store answers the next writes of a commit object with 503 Slow Down, as S3 does
            # when throttling a prefix: delta-rs retries the conditional write.
            store.slow_down_at(f"PUT /{s3.bucket}/throttled/tables/raw_event_log/_delta_log/".encode(), 2)
            assert log.append_events(events[100:]) == AppendResult(accepted=100, duplicates=100)
            assert store.slowed == 2
    # The table's creation, then one commit per append: the retried write made no other.
    assert [key.rsplit("/", 1)[1] for key in s3.keys("throttled/tables/raw_event_log/_delta_log/")] == [
        f"{version:020d}.json" for version in range(3)
    ]
    for key, value in {**s3.env, INDEX_DIR_ENV: str(tmp_path / "another-machine")}.items():
        monkeypatch.setenv(key, value)
    with (
        open_event_log(f"delta+s3://{s3.bucket}/throttled") as fresh,  # an index built from the bucket
        SqliteEventLog(":memory:") as reference,
    ):
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(fresh, *keys) == bel_cases.answers(reference, *keys)
        assert fresh.get_activity_summary().total_events == 300


# A pipeline run on the bucket in a process of its own (its own Spark driver), as a deployment runs them.
_PIPELINE_RUN = """
import sys
from dagster import materialize
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.maintenance.jobs import compaction_job
from databuild_assets.defs.resources import LakehouseResource
lakehouse = LakehouseResource(
    master="local[2]", lake_root=sys.argv[2], shuffle_partitions=2, driver_memory="1g", driver="own",
    extra_spark_config={"spark.ui.enabled": "false"},
)
if sys.argv[1] == "ingest":
    assert materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse}).success
else:
    assert compaction_job.execute_in_process(resources={"lakehouse": lakehouse}).success
"""


def _pipeline_run(what: str, root: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _PIPELINE_RUN, what, root], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _finished(run: subprocess.Popen, log: Path) -> None:
    assert run.wait(timeout=SCENARIO_TIMEOUT_S) == 0, log.read_text()[-4000:]


def test_appender_processes_an_ingestion_and_a_compaction_racing_on_the_bucket_store_every_event_once(
    s3, tmp_path, monkeypatch
):
    env = {**os.environ, **s3.env, INDEX_DIR_ENV: str(tmp_path / "index-cache")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    lake = Lake(s3.root("race"))
    events = list(generate_events(1_200, seed=11))
    landed, appended = events[:600], events[600:]

    def land(number: int, part: list[dict]) -> None:
        body = "".join(json.dumps(event) + "\n" for event in part).encode()
        s3.client.put_object(Bucket=s3.bucket, Key=f"race/landing/events-{number}.jsonl", Body=body)

    # The lake exists before the race: a first landing object ingested alone.
    land(0, landed[:200])
    first = _pipeline_run("ingest", lake.root, env, tmp_path / "ingest-0.log")
    _finished(first, tmp_path / "ingest-0.log")

    # Then, at once: two more landing objects (the last redelivers appended events) ingested by one
    # driver, a compaction by another, and three JVM-free appenders in batches of 5, each also
    # resending some of another's events.
    land(1, landed[200:400])
    land(2, landed[400:] + appended[:20])
    shares = [appended[i::3] for i in range(3)]
    batches = [
        [share[start : start + 5] for start in range(0, len(share), 5)] + [shares[(i + 1) % 3][:10]]
        for i, share in enumerate(shares)
    ]
    appenders = [AppenderProcess.start(lake, batches[i], tmp_path, f"appender-{i}") for i in range(3)]
    ingest = _pipeline_run("ingest", lake.root, env, tmp_path / "ingest-1.log")
    compaction = _pipeline_run("compact", lake.root, env, tmp_path / "compaction.log")
    reports = [appender.report(timeout_s=SCENARIO_TIMEOUT_S) for appender in appenders]
    _finished(ingest, tmp_path / "ingest-1.log")
    _finished(compaction, tmp_path / "compaction.log")

    stored = follower_for(lake.table_path(RAW_EVENT_LOG)).load(["event_id"]).column("event_id").to_pylist()
    assert len(stored) == len(set(stored)) == len(events)  # none lost, none twice
    assert set(stored) == {event["event_id"] for event in events}
    assert sum(report["accepted"] for report in reports) > 0  # the appenders did commit, beside the runs
    with open_event_log(f"delta+{lake.root}") as log, SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        keys = bel_cases.keys_of(events)
        assert bel_cases.answers(log, *keys) == bel_cases.answers(reference, *keys)


# Blind appends of one row each, as fast as a driver commits them, to one table on the bucket.
_APPENDS = """
import sys
from databuild_assets.runtime.spark import SparkSettings, build_spark_session
spark = build_spark_session(SparkSettings(master="local[1]", driver_memory="1g", s3=True,
                                          extra_config={"spark.ui.enabled": "false"}))
name, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for number in range(count):
    spark.createDataFrame([(name, number)], "writer string, n int").write.format("delta").mode("append").save(path)
"""


def test_two_spark_drivers_appending_to_one_table_on_the_bucket_lose_no_commit(s3, tmp_path, monkeypatch):
    # Delta's default LogStore for S3 checks that commit N is absent, then overwrites it: two
    # drivers committing at once both "succeed" and one commit is lost. Ours writes it with
    # If-None-Match (decision 0040). Without it this test loses rows (run by hand, see 0040).
    env = {**os.environ, **s3.env}
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    path, count = s3.root("stress"), 25
    # The table exists first (two drivers creating it at once is a conflict Delta reports).
    empty = pa.table({"writer": pa.array([], pa.string()), "n": pa.array([], pa.int32())})
    deltalake.write_deltalake(delta_rs_uri(path), empty, storage_options=delta_rs_options())
    runs = []
    for name in ("a", "b"):
        log = open(tmp_path / f"{name}.log", "wb")
        runs.append(
            (
                subprocess.Popen(
                    [sys.executable, "-c", _APPENDS, name, path, str(count)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                ),
                tmp_path / f"{name}.log",
            )
        )
        log.close()
    for run, log in runs:
        _finished(run, log)
    table = read_local_table(deltalake.DeltaTable(delta_rs_uri(path), storage_options=delta_rs_options()))
    rows = sorted(zip(table.column("writer").to_pylist(), table.column("n").to_pylist(), strict=True))
    assert rows == sorted((name, n) for name in ("a", "b") for n in range(count))
    commits = [key for key in s3.keys("stress/_delta_log/") if key.endswith(".json")]
    assert len(commits) == 1 + 2 * count


# An ingestion on the bucket as a deployment runs it: a Dagster instance on disk, Spark's UI on.
_RUN_WITH_UI = """
import json, sys, urllib.request
from dagster import DagsterInstance, materialize
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.resources import LakehouseResource
lakehouse = LakehouseResource(
    master="local[1]", lake_root=sys.argv[1], shuffle_partitions=2, driver_memory="1g", driver="own",
    extra_spark_config={"spark.ui.enabled": "true", "spark.ui.port": sys.argv[2]},
)
result = materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse},
                     instance=DagsterInstance.get())
assert result.success
spark = lakehouse.spark_session
url = f"http://127.0.0.1:{sys.argv[2]}/api/v1/applications/{spark.sparkContext.applicationId}/environment"
with urllib.request.urlopen(url, timeout=30) as response:
    print("SPARK-ENVIRONMENT " + json.dumps(json.load(response)))
"""


def test_the_credentials_reach_no_run_config_storage_metadata_log_or_spark_environment_page(s3, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    env = {**os.environ, **s3.env, "DAGSTER_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
    root = s3.root("secrets")
    events = list(generate_events(300, seed=5))
    body = "".join(json.dumps(event) + "\n" for event in events).encode()
    s3.client.put_object(Bucket=s3.bucket, Key="secrets/landing/events-0.jsonl", Body=body)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    run = subprocess.run(
        [sys.executable, "-c", _RUN_WITH_UI, root, port], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    [page] = [line for line in run.stdout.splitlines() if line.startswith("SPARK-ENVIRONMENT ")]
    environment = json.loads(page.removeprefix("SPARK-ENVIRONMENT "))
    # The page is real: it lists the S3 settings we did put there, from the environment ...
    assert ["spark.hadoop.fs.s3a.endpoint", s3.url] in environment["sparkProperties"]
    # ... and neither key: S3A and delta-rs read them from the process environment.
    for secret in (SECRET_KEY, ACCESS_KEY):
        assert secret not in page
        assert secret not in run.stdout + run.stderr  # the run's logs
        holding = [path for path in home.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]
        assert not holding, holding  # run storage, event logs, run configs, metadata
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    assert follower_for(f"{root}/tables/raw_event_log").load(["event_id"]).num_rows == len(events)


_INGEST_ONCE = """
import sys
from dagster import materialize
from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.defs.resources import LakehouseResource
lakehouse = LakehouseResource(
    master="local[1]", lake_root=sys.argv[1], shuffle_partitions=2, driver_memory="1g", driver="own",
    extra_spark_config={"spark.ui.enabled": "false"},
)
result = materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse}, raise_on_error=False)
for event in result.all_events:
    if event.is_step_failure:
        print("STEP-FAILURE " + event.event_specific_data.error.cause.message.replace(chr(10), " "))
print("SUCCESS", result.success)
"""


def test_a_store_that_stops_mid_ingestion_fails_the_run_naming_store_and_object_and_a_rerun_loses_nothing(
    s3, tmp_path, monkeypatch
):
    events = list(generate_events(4_500, seed=9))
    for number in range(3):
        body = "".join(json.dumps(event) + "\n" for event in events[number * 1_500 : (number + 1) * 1_500])
        s3.client.put_object(Bucket=s3.bucket, Key=f"outage/landing/events-{number}.jsonl", Body=body.encode())
    root = s3.root("outage")
    with StoreOutage(s3) as outage:
        env = {**os.environ, **outage.env}
        # Down at the run's first write of an event to the raw log, whatever the run's speed.
        outage.down_at(f"/{s3.bucket}/outage/tables/raw_event_log/event_date".encode())  # "=" travels as %3D
        run = subprocess.Popen(
            [sys.executable, "-c", _INGEST_ONCE, root],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        out, _ = run.communicate(timeout=SCENARIO_TIMEOUT_S)
        assert outage.cut > 0, "the run never wrote an event to the raw log"
        assert "SUCCESS False" in out, out[-3000:]
        [failure] = [line for line in out.splitlines() if line.startswith("STEP-FAILURE ")]
        assert f"the object store at {outage.url} failed:" in failure and f" on {root}/" in failure, failure
        assert "run the step again" in failure

        outage.up()
        rerun = subprocess.run(
            [sys.executable, "-c", _INGEST_ONCE, root],
            capture_output=True,
            text=True,
            env=env,
            timeout=SCENARIO_TIMEOUT_S,
        )
        assert "SUCCESS True" in rerun.stdout, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    stored = follower_for(f"{root}/tables/raw_event_log").load(["event_id"]).column("event_id").to_pylist()
    assert len(stored) == len(set(stored)) == len(events)  # none lost, none twice


def test_the_demo_on_a_bucket_generates_landing_objects_and_materializes_every_asset(s3, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, **s3.env, "DATABUILD_LAKE_ROOT": s3.root("demo"), "DAGSTER_HOME": str(home)}
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text())
    run = subprocess.run(
        [sys.executable, "-m", "databuild_assets.cli", "demo", "--events", "2000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=SCENARIO_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "generated 2,000 events in 8 landing files" in run.stdout, run.stdout
    assert "events accepted     2,000" in run.stdout, run.stdout
    landing = [key for key in s3.keys("demo/landing/") if key.endswith(".jsonl")]
    tables = {key.split("/")[2] for key in s3.keys("demo/tables/")}
    assert len(landing) == 8 and {"raw_event_log", "partition_state", "job_runs", "build_requests"} <= tables
    # Again: the landing objects are there, and nothing new is ingested.
    again = subprocess.run(
        [sys.executable, "-m", "databuild_assets.cli", "demo"], capture_output=True, text=True, env=env, timeout=600
    )
    assert again.returncode == 0 and "already has landing files" in again.stdout, again.stdout[-3000:]
    assert "events accepted     0" in again.stdout, again.stdout
