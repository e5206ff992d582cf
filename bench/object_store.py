"""The JVM-free Delta backend on a lake in an S3 bucket on loopback (moto's server), against SQLite
on local disk and against the same lake on local disk, side by side in one run (issue 29).

    python -m bench.object_store --lake /path/to/lake [--loops 100] [--calls 200]

The raw log (and tombstones) of `--lake` are copied into a bucket of an S3 server this bench starts
on loopback, and onto local disk; their events are loaded into SQLite. Prints:
- open to the first answer: SQLite; the JVM-free backend building its serving index from the
  bucket and from the local copy; opening again with the index kept; and a new machine starting
  from the index the pipeline's refresh published in the bucket (decision 0054), with the size of
  each machine's cache folder;
- the service loop (append the 5 events of a new build, then read the partition's status and the
  build's events; a status read with nothing new), p50/p95 per step, on the bucket against SQLite:
  with reads that ask the store before each answer (max_staleness=0) and with the default bound
  (reads ask at most once a second, decision 0041);
- every query method on random keys, p50/p95 and the p95 ratio against SQLite, both ways.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from bench.query_path import compare_methods, comparison_row, lake_events, query_keys, query_methods, service_loop
from databuild_assets.log import SqliteEventLog, load_events, open_event_log
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.log.serving.store import INDEX_DIR_ENV
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake
from databuild_assets_tests.s3_server import LoopbackS3


def upload_tables(s3: LoopbackS3, root: Path, prefix: str) -> int:
    """Every file of the raw log and the tombstones under `root` into the bucket at `prefix`."""
    uploaded = 0
    for table in (RAW_EVENT_LOG.name, TOMBSTONES.name):
        for path in sorted((root / "tables" / table).rglob("*")):
            if path.is_file():
                s3.client.upload_file(str(path), s3.bucket, f"{prefix}/{path.relative_to(root).as_posix()}")
                uploaded += path.stat().st_size
    return uploaded


def _open_to_first_answer(uri: str, **options: object) -> tuple[float, object]:
    started = time.perf_counter()
    log = open_event_log(uri, **options)
    log.get_activity_summary()
    return time.perf_counter() - started, log


def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


def _published_start(s3: LoopbackS3, workdir: Path, hot_window_s: float | None) -> list[str]:
    """The pipeline's refresh on its machine (builds, evicts, publishes), then a new machine's
    first open and answer from the publication: rows of the open table."""
    uri, cache = s3.root("lake"), os.environ[INDEX_DIR_ENV]
    try:
        os.environ[INDEX_DIR_ENV] = str(workdir / "pipeline-machine")
        started = time.perf_counter()
        status = refresh_serving_index(Lake(uri), hot_window_s=hot_window_s)
        refreshed = time.perf_counter() - started
        published = sum(
            item["Size"]
            for page in s3.client.get_paginator("list_objects_v2").paginate(
                Bucket=s3.bucket, Prefix="lake/serving_index/"
            )
            for item in page.get("Contents", [])
        )
        os.environ[INDEX_DIR_ENV] = str(workdir / "new-machine")
        seconds, log = _open_to_first_answer(f"delta+{uri}")
        log.close()
    finally:
        os.environ[INDEX_DIR_ENV] = cache
    return [
        f"| the pipeline's refresh on a new machine: builds, evicts {status.cold_build_requests:,} build requests"
        f" to {status.segments} segments, publishes {published / 1e6:,.1f} MB | {refreshed:.2f} |"
        f" {folder_mb(workdir / 'pipeline-machine'):,.1f} |",
        f"| JVM-free, bucket: a new machine starts from the publication | {seconds:.2f} |"
        f" {folder_mb(workdir / 'new-machine'):,.1f} |",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="a lake whose raw log (and tombstones) to copy")
    parser.add_argument("--calls", type=int, default=200, help="calls per query method")
    parser.add_argument("--loops", type=int, default=100, help="service loop iterations")
    parser.add_argument("--hot-window-s", type=float, default=None, help="the publishing refresh's (default: an hour)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-object-store-"))
    local = workdir / "lake"
    os.environ[INDEX_DIR_ENV] = str(workdir / "index-cache")
    try:
        with LoopbackS3(workdir) as s3:
            os.environ.update(s3.env)
            for table in (RAW_EVENT_LOG.name, TOMBSTONES.name):
                if (Path(args.lake) / "tables" / table).is_dir():
                    shutil.copytree(Path(args.lake) / "tables" / table, local / "tables" / table)
            started = time.perf_counter()
            size = upload_tables(s3, local, "lake")
            print(f"copied {size / 1e6:,.0f} MB into the bucket in {time.perf_counter() - started:.1f}s")
            events = lake_events(local)
            load_events(workdir / "bel.db", events)
            builds, refs, jobs, timestamps = query_keys(events)
            print(f"lake: {len(events):,} events")
            del events

            started = time.perf_counter()
            sqlite_log = SqliteEventLog(workdir / "bel.db")
            sqlite_log.get_activity_summary()
            sqlite_open = time.perf_counter() - started
            bucket_build, bucket_log = _open_to_first_answer(f"delta+{s3.root('lake')}")
            bucket_cache = folder_mb(workdir / "index-cache")
            local_build, local_log = _open_to_first_answer(f"delta://{local}")
            local_log.close()
            bucket_log.close()
            bucket_open, bucket_log = _open_to_first_answer(f"delta+{s3.root('lake')}")
            local_open, local_log = _open_to_first_answer(f"delta://{local}")
            local_log.close()
            published = _published_start(s3, workdir, args.hot_window_s)
            print()
            print("| open to the first answer | seconds | this machine's cache, MB |")
            print("|---|---:|---:|")
            print(f"| SQLite, local disk | {sqlite_open:.2f} | |")
            built = f"{bucket_build:.2f} | {bucket_cache:,.1f}"
            print(f"| JVM-free, bucket: first open (builds the serving index) | {built} |")
            print(f"| JVM-free, local disk: first open (builds the serving index) | {local_build:.2f} | |")
            print(f"| JVM-free, bucket: index kept | {bucket_open:.2f} | |")
            print(f"| JVM-free, local disk: index kept | {local_open:.2f} | |")
            print("\n".join(published))

            strict_log = open_event_log(f"delta+{s3.root('lake')}", max_staleness=0)
            sqlite_steps = service_loop(sqlite_log, args.loops)
            strict_steps, bucket_steps = service_loop(strict_log, args.loops), service_loop(bucket_log, args.loops)
            for name, steps in (("reads ask the store each time", strict_steps), ("default bound", bucket_steps)):
                print()
                print(f"| service loop | SQLite (disk) p50 / p95 ms | JVM-free (bucket, {name}) p50 / p95 ms | p95 |")
                print("|---|---:|---:|---:|")
                for step in sqlite_steps:
                    print(comparison_row(step, sqlite_steps[step], steps[step]))
            for name, other in (("reads ask the store each time", strict_log), ("default bound", bucket_log)):
                rng = random.Random(1)  # the same keys both ways
                methods = query_methods(rng, builds, refs, jobs, timestamps)
                print()
                print(f"| method | SQLite (disk) p50 / p95 ms | JVM-free (bucket, {name}) p50 / p95 ms | p95 |")
                print("|---|---:|---:|---:|")
                print("\n".join(compare_methods(methods, rng, sqlite_log, other, args.calls)))
            strict_log.close()
            bucket_log.close()
            sqlite_log.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["folder_mb", "main", "upload_tables"]
