"""Bench lakes: generated events written into a new lake's raw log, and working copies of a
lake, so that a bench can change a lake and the lake stays as it was.

    link_tables(Path("/var/tmp/lake-10m"), Path("/var/tmp/work/lake"))
    copy_serving_index(Path("/var/tmp/lake-10m"), Path("/var/tmp/work/lake"))

Delta never changes a data file once written, so the tables' data files are hard-linked (no
bytes copied: a 10M-event lake's tables and their history are copied in seconds), while what
is written in place is copied: each table's `_delta_log` (`_last_checkpoint`) and the serving
index (a SQLite database). Deleting a file in the copy (vacuum) leaves the lake's own link.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import deltalake

from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake


def write_events(lake: Lake, events: Iterable[dict], batch: int) -> Iterator[dict]:
    """Write `events` into a new lake's raw log (created by the JVM-free backend with its
    properties, then delta-rs appends of `batch` events), yielding each event once it is written,
    with progress: a bench loads the same events into its SQLite BEL as they go by."""
    stream = iter(events)
    first = list(islice(stream, 1_000))
    with DeltaRsEventLog(lake, writer="bench") as log:
        log.append_events(first)
    yield from first
    written = len(first)
    while chunk := list(islice(stream, batch)):
        rows = raw_log_rows(enumerate(map(canonical_event, chunk)), "bench")
        deltalake.write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")
        written += len(chunk)
        print(f"  {written:,} events written", flush=True)
        yield from chunk


def link_tables(source: Path, target: Path) -> None:
    """`source`'s `tables/` under `target` (made; an existing `target/tables` is replaced)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target / "tables", ignore_errors=True)
    subprocess.run(["cp", "-al", str(source / "tables"), str(target / "tables")], check=True)
    for log_dir in (target / "tables").glob("*/_delta_log"):
        shutil.rmtree(log_dir)
        shutil.copytree(source / log_dir.relative_to(target), log_dir)


def copy_serving_index(source: Path, target: Path) -> bool:
    """`source`'s serving index under `target`, a real copy (SQLite writes its pages in place),
    without its lock and shared-memory files; False when `source` has none."""
    if not (source / SERVING_INDEX_FOLDER).is_dir():
        return False
    ignore = shutil.ignore_patterns("*-shm", "build.lock", ".*")
    shutil.copytree(source / SERVING_INDEX_FOLDER, target / SERVING_INDEX_FOLDER, ignore=ignore)
    return True
