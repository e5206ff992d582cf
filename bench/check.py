"""`databuild-assets check` against delta-rs reading every file of the lake once (issue 31's bench).

    python -m bench.check --events 1000000          # a lake `databuild-assets demo` makes, kept in /var/tmp
    python -m bench.check --lake /var/tmp/lake-10m  # an existing lake, only read

On one lake, side by side and alternating (the order turns each round), `--repeats` times each,
with the page cache in the same state for every measurement (`--cache warm`: every file read once
before; `cold`: the lake's files dropped from the cache before each one):
(a) `check_lake(read_data=True)`, what `databuild-assets check` runs: every log file parsed,
    every data file read whole, row group by row group, its rows counted against the log;
(b) delta-rs reading every live file of every table once: `DeltaTable.to_pyarrow_dataset()` of
    each table scanned to record batches, every column: the floor of reading the data at all;
(c) `check_lake(read_data=False)`: the logs, and each data file's presence and size;
then the serving index as check_lake checks it (its stamp and its size against its header), and with `--deep`
SQLite's quick_check over it, once. Prints the medians, CPU seconds (ours, and other processes'
meanwhile), and the ratio (a)/(b), which issue 31 bounds (bench/README.md). The machine's other
Java processes and load average are printed at the start and the end: on a shared machine, take
it again when idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import deltalake

from bench.measuring import Usage, load_average, measure
from databuild_assets.maintenance.check import _read_serving_index, check_lake
from databuild_assets.runtime.lake import Lake

REPO_ROOT = Path(__file__).resolve().parents[1]


def build(workdir: Path, events: int) -> Lake:
    """A lake of `events` generated events, every asset materialized by `databuild-assets demo`,
    made once per workdir (a JVM of its own, gone when the demo ends)."""
    lake, done = Lake(str(workdir / "lake")), workdir / "built.json"
    if done.exists() and json.loads(done.read_text())["events"] == events:
        return lake
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"building a {events:,}-event lake in {lake.root} with `databuild-assets demo` ...", flush=True)
    env = {**os.environ, "DATABUILD_LAKE_ROOT": lake.root, "DATABUILD_SPARK_DRIVER": "own"}
    command = [sys.executable, "-m", "databuild_assets.cli", "demo", "--events", str(events)]
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True)
    done.write_text(json.dumps({"events": events}))
    return lake


def table_paths(lake: Lake) -> list[str]:
    """Every Delta table of the lake, as check_lake finds them."""
    root = lake.path("tables")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n, "_delta_log"))]


def read_with_delta_rs(lake: Lake) -> int:
    """Rows of every live file of every table, each file read once by delta-rs (every column)."""
    rows = 0
    for path in table_paths(lake):
        for batch in deltalake.DeltaTable(path).to_pyarrow_dataset().to_batches():
            rows += batch.num_rows
    return rows


def drop_from_page_cache(lake: Lake) -> None:
    """Evict the lake's table files from the page cache (theirs only: the machine's cache stays)."""
    for folder, _, names in os.walk(lake.path("tables")):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def java_processes() -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                count += comm.read().strip() == "java"
        except OSError:  # the process ended while we looked
            continue
    return count


def machine(when: str) -> None:
    print(f"{when}: {load_average()}; java processes on the machine: {java_processes()}", flush=True)


def median_usage(usages: list[Usage]) -> Usage:
    return Usage(*(statistics.median(getattr(u, f) for u in usages) for f in ("wall", "cpu", "machine_cpu")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the lake built with the demo")
    parser.add_argument("--workdir", default=None, help="where the built lake is kept between runs")
    parser.add_argument("--lake", default=None, help="an existing lake to measure instead (read only)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements of each, alternating")
    parser.add_argument("--cache", choices=("warm", "cold"), default="warm", help="the page cache before each one")
    parser.add_argument("--workers", type=int, default=None, help="check_lake's reader threads (default: cores)")
    parser.add_argument("--deep", action="store_true", help="also time SQLite's quick_check over the serving index")
    args = parser.parse_args(argv)
    machine("start")
    if args.lake:
        lake = Lake(args.lake)
    else:
        lake = build(Path(args.workdir or f"/var/tmp/bench-check-{args.events}"), args.events)

    full = lambda: check_lake(lake, read_data=True, workers=args.workers)  # noqa: E731
    logs = lambda: check_lake(lake, read_data=False, workers=args.workers)  # noqa: E731
    delta_rs = lambda: read_with_delta_rs(lake)  # noqa: E731
    # One untimed pass of each: the files in the page cache (warm), the imports and first calls paid.
    report, rows = full(), delta_rs()
    tables = [t for t in report.tables if t.files and t.name != "serving_index"]
    data_bytes, log_rows = sum(t.bytes for t in tables), sum(t.records for t in tables)
    print(
        f"{lake.root}: {len(tables)} tables, {sum(t.files for t in tables):,} data files, {data_bytes / 1e6:,.1f} MB, "
        f"{log_rows:,} rows by the logs, {rows:,} read by delta-rs; check found {len(report.problems)} problem(s)"
    )
    if rows != log_rows:
        print("  (the logs' statistics and delta-rs count different rows: compare with care)")

    measured: dict[str, list[Usage]] = {"check": [], "delta-rs": [], "check, logs only": []}
    actions: dict[str, Callable[[], object]] = {"check": full, "delta-rs": delta_rs, "check, logs only": logs}
    names = list(actions)
    for round_ in range(args.repeats):
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            if args.cache == "cold":
                drop_from_page_cache(lake)
            measured[name].append(measure(actions[name])[1])

    # The serving index part alone: its stamp and its size against its header (the comparison of
    # the stamp with the logs' versions is a lookup in what check_lake listed).
    index = [measure(lambda: _read_serving_index(lake, deep=False))[1] for _ in range(args.repeats)]

    print(f"\npage cache: {args.cache}; {args.repeats} of each, alternating; median (min to max)")
    print("| | seconds | min to max | MB/s | cpu s | others' cpu s |\n|---|---:|---:|---:|---:|---:|")
    rows_out = [
        ("(a) check_lake, read_data=True (`databuild-assets check`)", measured["check"], data_bytes),
        ("(b) delta-rs, every live file of every table once", measured["delta-rs"], data_bytes),
        ("(c) check_lake, read_data=False", measured["check, logs only"], None),
        ("serving index part (stamp, size against its header)", index, None),
    ]
    for label, usages, volume in rows_out:
        middle, walls = median_usage(usages), [u.wall for u in usages]
        rate = f"{volume / 1e6 / middle.wall:,.0f}" if volume else ""
        print(
            f"| {label} | {middle.wall:.2f} | {min(walls):.2f} to {max(walls):.2f} | {rate} "
            f"| {middle.cpu:.1f} | {middle.others:.1f} |"
        )
    if args.deep:
        _, usage = measure(lambda: _read_serving_index(lake, deep=True))
        print(
            f"| serving index with --deep (SQLite quick_check), once | {usage.wall:.2f} | | | {usage.cpu:.1f} "
            f"| {usage.others:.1f} |"
        )
    ratio = statistics.median(u.wall for u in measured["check"]) / statistics.median(
        u.wall for u in measured["delta-rs"]
    )
    print(f"\n(a)/(b): {ratio:.2f}x (target: at most 1.50x)")
    machine("end")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"{time.perf_counter() - started:.0f} s in all")
    sys.exit(code)
