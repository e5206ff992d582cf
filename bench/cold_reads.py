"""Cold history: how fast an old key's events read from Parquet in the lake, by layout, and what a
reader would keep per event to find them (issue 41).

    python -m bench.cold_reads --events 1000000 [--workdir /var/tmp/bench-cold] [--keys 300]

Writes the events of `generate_events(N, seed=7)` in three layouts, under --workdir:
- `arrival`: the raw log's order (time), one file per 250,000 events, pyarrow's default row groups;
  a key is found by scanning its column (no statistics on ids: decision 0034);
- `by_build_request/<rows>`: one file per event_date, sorted by (build_request_id, timestamp,
  event_id), row groups of <rows> rows; a key is found from the row groups' min/max in the
  footers (read once per process and kept), then only those row groups are read;
- `by_partition/<rows>`: the events that carry or list a partition_ref, one row per (ref, event),
  sorted by ref, the same way.
Prints, for random keys: p50/p95 of a point read (the key's events as rows), a fresh process's
footer load, the files' bytes per event; and the bytes per event of what a reader would keep to
find cold events and to dedupe appends: the SQLite BEL's tables and indexes (dbstat), a directory
from key to (file, row group), and event-id digests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench.query_path import percentile
from databuild_assets.log import load_events
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.rows import event_rows
from databuild_assets.log.serving.segment_files import segment_schema
from databuild_assets.workload import generate_events

ROW_GROUPS = (4_096, 16_384, 65_536)
_BATCH = 250_000


def _write(workdir: Path, events: int) -> pa.Table:
    rows = raw_log_rows(enumerate(canonical_event(e) for e in generate_events(events, seed=7)), "bench")
    arrival = workdir / "arrival"
    arrival.mkdir(parents=True, exist_ok=True)
    for start in range(0, rows.num_rows, _BATCH):
        pq.write_table(rows.slice(start, _BATCH), arrival / f"part-{start // _BATCH:04d}.parquet")
    for size in ROW_GROUPS:
        folder = workdir / "by_build_request" / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        for day in pc.unique(rows["event_date"]).to_pylist():
            one_day = rows.filter(pc.equal(rows["event_date"], day))
            one_day = one_day.sort_by([("build_request_id", "ascending"), ("timestamp", "ascending")])
            pq.write_table(one_day, folder / f"{day}.parquet", row_group_size=size)
    flat = _flat_rows(rows)
    for size in ROW_GROUPS:
        folder = workdir / "flat_by_build_request" / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        for day in pc.unique(rows["event_date"]).to_pylist():
            one_day = flat.filter(pc.equal(rows["event_date"], day))
            one_day = one_day.sort_by([("build_request_id", "ascending"), ("timestamp", "ascending")])
            pq.write_table(one_day, folder / f"{day}.parquet", row_group_size=size, compression="zstd")
    by_partition = _partition_rows(rows)
    for size in ROW_GROUPS:
        folder = workdir / "by_partition" / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            by_partition.sort_by([("partition_ref", "ascending"), ("timestamp", "ascending")]),
            folder / "all.parquet",
            row_group_size=size,
        )
    return rows


def _flat_rows(rows: pa.Table) -> pa.Table:
    """The serving index's `events` rows (the payload as JSON text): what a reader answers from."""
    flat = event_rows(rows)
    return pa.Table.from_pylist(
        [dict(zip(segment_schema().names, row, strict=True)) for row in flat], schema=segment_schema()
    )


def _partition_rows(rows: pa.Table) -> pa.Table:
    """One row per (partition_ref, event) of the events that carry or list one."""
    refs, take = [], []
    for position, event in enumerate(rows.select(["event_type", *_PARTITION_SOURCES]).to_pylist()):
        for ref in _refs_of(event):
            refs.append(ref)
            take.append(position)
    return rows.take(pa.array(take)).append_column("partition_ref", pa.array(refs, pa.string()))


_PARTITION_SOURCES = (
    "partition_event",
    "delegation_event",
    "partition_invalidation_event",
    "build_request_event",
    "job_event",
)


def _refs_of(event: dict) -> list[str]:
    kind = event["event_type"]
    payload = event.get(kind) or {}
    if kind in ("partition_event", "delegation_event", "partition_invalidation_event"):
        return [payload["partition_ref"]]
    if kind == "build_request_event":
        return list(payload.get("requested_partitions") or [])
    if kind == "job_event":
        return list(payload.get("target_partitions") or [])
    return []


class SortedFiles:
    """Files sorted by `column`, their footers read once: a key's row groups by min/max."""

    def __init__(self, folder: Path, column: str) -> None:
        self.column = column
        self.groups: list[tuple[str, str, pq.ParquetFile, int]] = []
        for path in sorted(folder.glob("*.parquet")):
            file = pq.ParquetFile(path)
            schema = file.metadata.schema
            index = next(i for i in range(len(schema)) if schema.column(i).path == column)
            for group in range(file.metadata.num_row_groups):
                stats = file.metadata.row_group(group).column(index).statistics
                self.groups.append((stats.min, stats.max, file, group))

    def read(self, key: str) -> pa.Table:
        parts = [
            file.read_row_group(group).filter(pc.equal(pc.field(self.column), key))
            for low, high, file, group in self.groups
            if low <= key <= high
        ]
        return pa.concat_tables(parts) if parts else pa.table({})


def _timed(read, keys: list[str]) -> tuple[float, float, float]:
    seconds, found = [], 0
    for key in keys:
        started = time.perf_counter()
        found += read(key).num_rows
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000, percentile(seconds, 95) * 1000, found / len(keys)


def _bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*.parquet"))


_FOOTERS = """
import sys, time
from pathlib import Path
from bench.cold_reads import SortedFiles
started = time.perf_counter()
SortedFiles(Path(sys.argv[1]), sys.argv[2])
print(time.perf_counter() - started)
"""


def _sqlite_bytes_per_event(workdir: Path, events: int) -> dict[str, float]:
    """What each table and index of the SQLite BEL (the serving index's layout) takes, per event."""
    path = workdir / "bel.db"
    if not path.exists():
        load_events(path, generate_events(events, seed=7))
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
    return {name: size / events for name, size in rows}


def _directory_bytes(workdir: Path, rows: pa.Table, size: int) -> dict[str, float]:
    """A SQLite directory from key to (file, row group) in the sorted layouts, and event-id
    digests, each in a WITHOUT ROWID table: bytes per event."""
    entries: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    for kind, column, folder in (
        ("build_request -> (file, row group)", "build_request_id", workdir / "by_build_request" / str(size)),
        ("partition -> (file, row group), partition layout", "partition_ref", workdir / "by_partition" / str(size)),
    ):
        for number, path in enumerate(sorted(folder.glob("*.parquet"))):
            file = pq.ParquetFile(path)
            for group in range(file.metadata.num_row_groups):
                for key in pc.unique(file.read_row_group(group, columns=[column])[column]).to_pylist():
                    entries[kind].add((key, number, group))
    path = workdir / "directory.db"
    path.unlink(missing_ok=True)
    result = {}
    with sqlite3.connect(path) as connection:
        for number, (kind, keys) in enumerate(entries.items()):
            table = f"d{number}"
            connection.execute(
                f"CREATE TABLE {table} (key TEXT, file INTEGER, grp INTEGER, PRIMARY KEY (key, file, grp))"
                " WITHOUT ROWID"
            )
            connection.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", sorted(keys))
            result[f"{kind} ({len(keys):,} entries)"] = table
        for digest in (8, 16):
            table = f"ids{digest}"
            connection.execute(f"CREATE TABLE {table} (id BLOB PRIMARY KEY) WITHOUT ROWID")
            connection.executemany(
                f"INSERT OR IGNORE INTO {table} VALUES (?)",
                sorted(
                    (hashlib.blake2b(i.encode(), digest_size=digest).digest(),) for i in rows["event_id"].to_pylist()
                ),
            )
            result[f"event-id digests, {digest} bytes"] = table
        connection.commit()
        sizes = dict(connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    return {kind: sizes[table] / rows.num_rows for kind, table in result.items()}


def _row(layout: str, p50: float, p95: float, found: float, per_event: float, footers: float | None = None) -> None:
    footers_text = "" if footers is None else f" {footers:10.3f}"
    print(f"{layout:44} {p50:8.1f} {p95:8.1f} {found:9.1f} {per_event:8.1f}{footers_text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workdir", default="/var/tmp/bench-cold-reads")
    parser.add_argument("--keys", type=int, default=300)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir) / str(args.events)
    done = workdir / "written.json"
    if done.exists():
        rows = pa.concat_tables(pq.read_table(path) for path in sorted((workdir / "arrival").glob("*.parquet")))
    else:
        rows = _write(workdir, args.events)
        done.write_text(json.dumps({"events": args.events}))
    rng = random.Random(1)
    requests = rng.sample(pc.unique(rows["build_request_id"]).to_pylist(), args.keys)
    partitions = rng.sample(pc.unique(_partition_rows(rows.slice(0, 200_000))["partition_ref"]).to_pylist(), args.keys)
    n = rows.num_rows
    print(f"{n:,} events, {len(pc.unique(rows['build_request_id'])):,} build requests; {args.keys} random keys each")
    print(f"{'layout':44} {'p50 ms':>8} {'p95 ms':>8} {'rows/key':>9} {'B/event':>8} {'footers s':>10}")
    arrival = ds.dataset(workdir / "arrival")
    p50, p95, found = _timed(
        lambda key: arrival.to_table(filter=pc.field("build_request_id") == key), requests[: max(args.keys // 10, 5)]
    )
    _row("arrival order, scan (build request)", p50, p95, found, _bytes(workdir / "arrival") / n)
    for kind, column, keys in (
        ("by_build_request", "build_request_id", requests),
        ("flat_by_build_request", "build_request_id", requests),
        ("by_partition", "partition_ref", partitions),
    ):
        for size in ROW_GROUPS:
            folder = workdir / kind / str(size)
            files = SortedFiles(folder, column)
            p50, p95, found = _timed(files.read, keys)
            footers = float(
                subprocess.run(
                    [sys.executable, "-c", _FOOTERS, str(folder), column], check=True, capture_output=True, text=True
                ).stdout
            )
            _row(f"{kind}, row groups of {size}", p50, p95, found, _bytes(folder) / n, footers)
    print("\nWhat a reader keeps, bytes per event of history:")
    for name, size in _sqlite_bytes_per_event(workdir, args.events).items():
        print(f"  SQLite BEL {name:40} {size:8.1f}")
    for name, size in _directory_bytes(workdir, rows, ROW_GROUPS[1]).items():
        print(f"  {name:51} {size:8.1f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
