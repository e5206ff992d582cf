"""A new reader's first answers on a lake in a bucket of an S3 server on loopback (issue 41).

    python -m bench.new_reader --lake /var/tmp/lake-10m/lake

The raw log (and tombstones) of `--lake` are copied into the bucket; the pipeline's refresh on a
machine of its own builds the serving index from the bucket, evicts what is older than the hot
window into segments and publishes both (decision 0054). A new machine (an empty index cache)
then opens the lake and answers, each step timed and followed by the size of its cache folder:
the open to its first answer (the activity summary), the first service loop (append a build's 5
events, read its partition's status and its events), and the events of the oldest build request
and of a partition with cold events (their segments read from the bucket on first read). Then
`--calls` cold partitions and cold build requests drawn at random (seed 3), each answered once
by that machine: p50 / p95 ms, with the segments each spans (issue 41: 250 ms on the bucket).
The figures to compare are bench.serving_index's SQLite opens (about a millisecond at any size).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import shutil
import sqlite3
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.object_store import folder_mb, upload_tables
from bench.query_path import percentile, service_build
from databuild_assets.log import open_event_log
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.log.serving.store import INDEX_DIR_ENV
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake
from databuild_assets_tests.s3_server import LoopbackS3


def _cold_keys(machine: Path, calls: int) -> tuple[str, str, list[tuple[str, str, list[tuple[str, int]]]]]:
    """From the pipeline's index: the oldest cold build request, a partition with cold events, and
    `calls` cold partitions and cold build requests drawn with repeats (seed 3), as (label, the
    reader's method, [(key, the segments holding its events)])."""
    path = max(glob.glob(str(machine / "**" / "index-*.sqlite"), recursive=True), key=os.path.getmtime)
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        request = connection.execute(
            "SELECT c.build_request_id FROM cold_build_requests AS c JOIN build_requests AS b"
            " ON b.build_request_id = c.build_request_id ORDER BY b.updated_at LIMIT 1"
        ).fetchone()
        ref = connection.execute(
            "SELECT partition_ref FROM cold_partition_events WHERE count > 0 ORDER BY segment LIMIT 1"
        ).fetchone()
        partitions = connection.execute(
            "SELECT partition_ref, COUNT(*) FROM cold_partition_events GROUP BY 1 ORDER BY 1"
        ).fetchall()
        requests = connection.execute("SELECT build_request_id, 1 FROM cold_build_requests ORDER BY 1").fetchall()
    finally:
        connection.close()
    if request is None or ref is None:
        raise SystemExit(f"{path}: nothing is cold (a hot window longer than the log?): no cold read to time")
    rng = random.Random(3)
    samples = [
        ("a cold partition's events", "get_partition_events", [rng.choice(partitions) for _ in range(calls)]),
        ("a cold build request's events", "get_build_request_events", [rng.choice(requests) for _ in range(calls)]),
    ]
    return request[0], ref[0], samples


def _timed(rows: list[str], machine: Path, step: str, action) -> object:
    started = time.perf_counter()
    answer = action()
    seconds = time.perf_counter() - started
    rows.append(f"| {step} | {seconds:.3f} | {folder_mb(machine):,.1f} |")
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="a lake whose raw log (and tombstones) to copy")
    parser.add_argument("--hot-window-s", type=float, default=None, help="the pipeline's (default: an hour)")
    parser.add_argument("--calls", type=int, default=50, help="cold keys of each kind answered by the new machine")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-new-reader-", dir="/var/tmp"))
    pipeline_machine, new_machine = workdir / "pipeline-machine", workdir / "new-machine"
    try:
        with LoopbackS3(workdir) as s3:
            os.environ.update(s3.env)
            local = workdir / "lake"
            for table in (RAW_EVENT_LOG.name, TOMBSTONES.name):
                if (Path(args.lake) / "tables" / table).is_dir():
                    shutil.copytree(Path(args.lake) / "tables" / table, local / "tables" / table)
            started = time.perf_counter()
            size = upload_tables(s3, local, "lake")
            shutil.rmtree(local)
            print(f"copied {size / 1e6:,.0f} MB into the bucket in {time.perf_counter() - started:.1f} s", flush=True)
            uri = s3.root("lake")

            os.environ[INDEX_DIR_ENV] = str(pipeline_machine)
            started = time.perf_counter()
            status = refresh_serving_index(
                Lake(uri), hot_window_s=args.hot_window_s, progress=lambda m: print(m, flush=True)
            )
            published = sum(
                item["Size"]
                for page in s3.client.get_paginator("list_objects_v2").paginate(
                    Bucket=s3.bucket, Prefix="lake/serving_index/"
                )
                for item in page.get("Contents", [])
            )
            print(
                f"the pipeline's refresh: {time.perf_counter() - started:.1f} s; {status.cold_build_requests:,} build"
                f" requests cold in {status.segments} segments; published {published / 1e6:,.1f} MB",
                flush=True,
            )
            request, ref, samples = _cold_keys(pipeline_machine, args.calls)

            os.environ[INDEX_DIR_ENV] = str(new_machine)
            rows = ["| a new machine, in turn | seconds | its cache, MB |", "|---|---:|---:|"]
            step = partial(_timed, rows, new_machine)

            def opened():
                log = open_event_log(f"delta+{uri}")
                log.get_activity_summary()
                return log

            log = step("open to the first answer", opened)
            batch, build, new_ref = service_build(0)
            step("the first loop: append 5 events", lambda: log.append_events(batch))
            step("its partition's status", lambda: log.get_latest_partition_status(new_ref))
            step("its build's events", lambda: log.get_build_request_events(build))
            step("the oldest build request's events", lambda: log.get_build_request_events(request))
            step("a cold partition's events", lambda: log.get_partition_events(ref))
            step("that partition's events again", lambda: log.get_partition_events(ref))
            sampled = ["| on that machine, each key once | p50 / p95 ms | segments p50 / p95 |", "|---|---:|---:|"]
            for kind, method, keys in samples:
                spent = []
                for key, _ in keys:
                    started = time.perf_counter()
                    getattr(log, method)(key)
                    spent.append(time.perf_counter() - started)
                held = [float(n) for _, n in keys]
                (p50, p95), (s50, s95) = ((percentile(v, 0.5), percentile(v, 0.95)) for v in (spent, held))
                sampled.append(
                    f"| {kind} ({len(keys)}) | {p50 * 1000:,.1f} / {p95 * 1000:,.1f} | {s50:.0f} / {s95:.0f} |"
                )
            log.close()
            print()
            print("\n".join(rows))
            print(f"its cache after the sampled keys: {folder_mb(new_machine):,.1f} MB")
            print()
            print("\n".join(sampled))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["main"]
