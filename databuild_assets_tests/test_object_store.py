"""The lakehouse on object storage: a bucket on an S3-compatible server on loopback (moto's server
mode, databuild_assets_tests/s3_server.py), reached by Spark through S3A and by the JVM-free path
through delta-rs's own object store, with made-up credentials.

The whole flow (landing objects, ingestion with quarantine, the filtered log, the projections and
their fold, an erasure, compaction with the rewrite of landing objects, landing retention, vacuum
at retention 0, the erasure report) runs on the bucket in a process of its own and on a local lake
in the suite's session: every table must come out the same, row for row, and no object but the
tombstones table's may hold the erased value.

Minutes, and it needs hadoop-aws's jars and moto: run it with `make s3-test` (DATABUILD_S3_TEST=1).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from databuild_assets.runtime.lake import Lake
from databuild_assets_tests.cluster_scenario import SUMMARY_PREFIX, run_scenario
from databuild_assets_tests.s3_server import SECRET_KEY, LoopbackS3

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
            [
                sys.executable,
                "-m",
                "databuild_assets_tests.cluster_scenario",
                "--master",
                "local[2]",
                "--lake",
                root,
                "--events",
                str(N_EVENTS),
                "--vacuum",
            ],
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, **s3.env},
            timeout=SCENARIO_TIMEOUT_S,
        )
    bucket_s = time.monotonic() - started
    assert run.returncode == 0, f"the run on the bucket failed ({run.returncode}):\n{err.read_text()[-4000:]}"
    [line] = [line for line in out.read_text().splitlines() if line.startswith(SUMMARY_PREFIX)]
    on_bucket = json.loads(line.removeprefix(SUMMARY_PREFIX))["result"]

    started = time.monotonic()
    local = run_scenario(spark, Lake(str(tmp_path / "local-lake")), N_EVENTS, vacuum=True)["result"]
    print(f"bucket {bucket_s:.0f} s, local {time.monotonic() - started:.0f} s")

    # The work was real: bad and redelivered lines, an erasure purged from every table ...
    assert on_bucket["ingest"]["accepted"] == N_EVENTS and on_bucket["ingest"]["files"] == 3
    assert on_bucket["ingest"]["duplicates"] > 0 and on_bucket["ingest"]["quarantined"] > 0
    assert on_bucket["hidden_by_erasure"] > 0
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
